//! Normalisation and channel ops of convolutional nets (issue 15):
//! `SpatialBN` (batch normalisation per channel, training and test),
//! `LRN` (local response normalisation across channels), `ChannelShuffle`,
//! and their gradients. Channels are dim 1 (`order` NCHW) or the last dim
//! (NHWC); float32 or float64.

#![allow(clippy::result_large_err)]

use super::conv::{by_float, parse_order, Float, Order};
use super::kernel;
use super::nn::{array, dense, input, real_dtype};
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{ArgDoc, InPlace, Locked, OpDefCtx, OpSchema, Operator};

/// (N, C, pixels per image) of a tensor with channels at `order`'s place.
fn channels(op: &str, l: &Locked<'_>, order: Order) -> Result<(usize, usize, usize)> {
    let s = l.tensor(0)?.shape();
    if s.len() < 2 {
        return Err(Error::shape(format!(
            "{op}: X ('{}', shape {s:?}) must have at least 2 dims (N, C, ...)",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0)));
    }
    let c = match order {
        Order::Nchw => s[1],
        Order::Nhwc => s[s.len() - 1],
    };
    let n = s[0];
    let hw = s.iter().product::<usize>().checked_div(n * c).unwrap_or(0);
    Ok((n, c, hw))
}

/// Calls `f(c, index)` for every element, `c` its channel.
fn for_each_channel(n: usize, c: usize, hw: usize, order: Order, mut f: impl FnMut(usize, usize)) {
    match order {
        Order::Nchw => {
            for b in 0..n {
                for ch in 0..c {
                    let base = (b * c + ch) * hw;
                    for i in base..base + hw {
                        f(ch, i);
                    }
                }
            }
        }
        Order::Nhwc => {
            for p in 0..n * hw {
                for ch in 0..c {
                    f(ch, p * c + ch);
                }
            }
        }
    }
}

fn vec_input<T: Float>(l: &Locked<'_>, op: &str, i: usize, what: &str, c: usize) -> Result<Vec<T>> {
    let v = input::<T>(l, op, i)?;
    if v.len() != c {
        return Err(Error::shape(format!(
            "{op}: {what} ('{}', shape {:?}) must have C = {c} elements",
            l.input_name(i),
            v.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(dense(v).into_owned())
}

// ------------------------------------------------------------- SpatialBN --

struct BnArgs {
    is_test: bool,
    epsilon: f64,
    momentum: f64,
    order: Order,
    op: String,
}

impl BnArgs {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<BnArgs> {
        let is_test = ctx.args.i64("is_test", 0)? != 0;
        let epsilon = f64::from(ctx.args.f32("epsilon", 1e-5)?);
        let momentum = f64::from(ctx.args.f32("momentum", 0.9)?);
        if epsilon <= 0.0 {
            return Err(ctx.bad_arg(format!("epsilon must be > 0, got {epsilon}")));
        }
        if !(0.0..=1.0).contains(&momentum) {
            return Err(ctx.bad_arg(format!("momentum must be in [0, 1], got {momentum}")));
        }
        if ctx.args.i64("num_batches", 1)? != 1 {
            return Err(ctx.bad_arg(
                "num_batches other than 1 (statistics summed over several batches) is not supported",
            ));
        }
        Ok(BnArgs {
            is_test,
            epsilon,
            momentum,
            order: parse_order(ctx)?,
            op: ctx.op_type().to_string(),
        })
    }
}

fn bn_t<T: Float>(l: &mut Locked<'_>, a: &BnArgs) -> Result<()> {
    let op = a.op.as_str();
    let (n, c, hw) = channels(op, l, a.order)?;
    let scale = vec_input::<T>(l, op, 1, "the scale", c)?;
    let bias = vec_input::<T>(l, op, 2, "the bias", c)?;
    let rmean = vec_input::<T>(l, op, 3, "the mean", c)?;
    let rvar = vec_input::<T>(l, op, 4, "the variance", c)?;
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let eps = T::of(a.epsilon);
    let (mean, var) = if a.is_test {
        (rmean.clone(), rvar.clone())
    } else {
        let m = T::of((n * hw).max(1) as f64);
        let mut sum = vec![T::of(0.0); c];
        for_each_channel(n, c, hw, a.order, |ch, i| sum[ch] += x[i]);
        let mean: Vec<T> = sum.iter().map(|&s| s / m).collect();
        let mut sq = vec![T::of(0.0); c];
        for_each_channel(n, c, hw, a.order, |ch, i| {
            let d = x[i] - mean[ch];
            sq[ch] += d * d;
        });
        (mean, sq.iter().map(|&s| s / m).collect())
    };
    let rstd: Vec<T> = var.iter().map(|&v| T::of(1.0) / (v + eps).sqrt()).collect();
    let alpha: Vec<T> = (0..c).map(|i| scale[i] * rstd[i]).collect();
    let beta: Vec<T> = (0..c).map(|i| bias[i] - alpha[i] * mean[i]).collect();
    let mut y = vec![T::of(0.0); x.len()];
    for_each_channel(n, c, hw, a.order, |ch, i| {
        y[i] = x[i] * alpha[ch] + beta[ch]
    });
    l.set_output(0, T::wrap(array(&shape, y)?));
    if !a.is_test {
        let (mo, keep) = (T::of(a.momentum), T::of(1.0 - a.momentum));
        let rm: Vec<T> = (0..c).map(|i| rmean[i] * mo + mean[i] * keep).collect();
        let rv: Vec<T> = (0..c).map(|i| rvar[i] * mo + var[i] * keep).collect();
        l.set_output(1, T::wrap(array(&[c], rm)?));
        l.set_output(2, T::wrap(array(&[c], rv)?));
        l.set_output(3, T::wrap(array(&[c], mean)?));
        l.set_output(4, T::wrap(array(&[c], rstd)?));
    }
    Ok(())
}

fn build_bn(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = BnArgs::parse(ctx)?;
    let no = ctx.num_outputs();
    if (a.is_test && no != 1) || (!a.is_test && no != 5) {
        return Err(ctx.bad_arg(format!(
            "SpatialBN has 1 output with is_test and 5 without (Y, running mean, running variance, saved mean, saved inverse std); got {no} with is_test = {}",
            a.is_test as i32
        )));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &a.op, 0, bn_t(&mut l, &a))?;
        Ok(true)
    }))
}

fn bn_grad_t<T: Float>(l: &mut Locked<'_>, a: &BnArgs) -> Result<()> {
    let op = a.op.as_str();
    let (n, c, hw) = channels(op, l, a.order)?;
    let scale = vec_input::<T>(l, op, 1, "the scale", c)?;
    let mean = vec_input::<T>(l, op, 3, "the saved mean", c)?;
    let s4 = vec_input::<T>(l, op, 4, "the saved inverse std", c)?;
    // With is_test the inputs are the estimated mean and variance.
    let rstd: Vec<T> = if a.is_test {
        s4.iter()
            .map(|&v| T::of(1.0) / (v + T::of(a.epsilon)).sqrt())
            .collect()
    } else {
        s4
    };
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    let dya = input::<T>(l, op, 2)?;
    if dya.shape() != shape.as_slice() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have X's shape {shape:?}",
            l.input_name(2),
            dya.shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let (x, dy) = (dense(xa), dense(dya));
    let mut dbias = vec![T::of(0.0); c];
    let mut dscale = vec![T::of(0.0); c];
    for_each_channel(n, c, hw, a.order, |ch, i| {
        dbias[ch] += dy[i];
        dscale[ch] += dy[i] * (x[i] - mean[ch]) * rstd[ch];
    });
    let mut dx = vec![T::of(0.0); x.len()];
    if a.is_test {
        for_each_channel(n, c, hw, a.order, |ch, i| {
            dx[i] = dy[i] * scale[ch] * rstd[ch]
        });
    } else {
        let m = T::of((n * hw).max(1) as f64);
        for_each_channel(n, c, hw, a.order, |ch, i| {
            let xhat = (x[i] - mean[ch]) * rstd[ch];
            dx[i] = scale[ch] * rstd[ch] * (dy[i] - (dbias[ch] + xhat * dscale[ch]) / m);
        });
    }
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(1, T::wrap(array(&[c], dscale)?));
    l.set_output(2, T::wrap(array(&[c], dbias)?));
    Ok(())
}

fn build_bn_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = BnArgs::parse(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &a.op, 0, bn_grad_t(&mut l, &a))?;
        Ok(true)
    }))
}

fn bn_inplace(i: usize, o: usize) -> bool {
    (i == 3 && o == 1) || (i == 4 && o == 2)
}

// ------------------------------------------------------------------- LRN --

struct LrnArgs {
    size: usize,
    alpha: f64,
    beta: f64,
    bias: f64,
    order: Order,
    op: String,
}

impl LrnArgs {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<LrnArgs> {
        let size = ctx.args.i64("size", 0)?;
        if size < 1 || size % 2 == 0 {
            return Err(ctx.bad_arg(format!("size must be a positive odd number, got {size}")));
        }
        Ok(LrnArgs {
            size: size as usize,
            alpha: f64::from(ctx.args.f32("alpha", 0.0)?),
            beta: f64::from(ctx.args.f32("beta", 0.0)?),
            bias: f64::from(ctx.args.f32("bias", 1.0)?),
            order: parse_order(ctx)?,
            op: ctx.op_type().to_string(),
        })
    }

    /// Calls `f(first index, channel stride)` for every channel vector.
    fn rows(&self, n: usize, c: usize, hw: usize, mut f: impl FnMut(usize, usize)) {
        match self.order {
            Order::Nchw => {
                for b in 0..n {
                    for p in 0..hw {
                        f(b * c * hw + p, hw);
                    }
                }
            }
            Order::Nhwc => {
                for p in 0..n * hw {
                    f(p * c, 1);
                }
            }
        }
    }

    /// scale = bias + alpha / size * (sum of x^2 over the channel window).
    fn scale<T: Float>(&self, x: &[T], n: usize, c: usize, hw: usize) -> Vec<T> {
        let pre = (self.size - 1) / 2;
        let k = T::of(self.alpha / self.size as f64);
        let mut s = vec![T::of(0.0); x.len()];
        self.rows(n, c, hw, |base, st| {
            for ch in 0..c {
                let lo = ch.saturating_sub(pre);
                let hi = (ch + self.size - pre).min(c);
                let sq: T = (lo..hi).map(|j| x[base + j * st] * x[base + j * st]).sum();
                s[base + ch * st] = T::of(self.bias) + k * sq;
            }
        });
        s
    }
}

fn lrn_t<T: Float>(l: &mut Locked<'_>, a: &LrnArgs, want_scale: bool) -> Result<()> {
    let (n, c, hw) = channels(&a.op, l, a.order)?;
    let xa = input::<T>(l, &a.op, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let s = a.scale(&x, n, c, hw);
    let nb = T::of(-a.beta);
    let y: Vec<T> = x.iter().zip(&s).map(|(&v, &sc)| v * sc.powf(nb)).collect();
    l.set_output(0, T::wrap(array(&shape, y)?));
    if want_scale {
        l.set_output(1, T::wrap(array(&shape, s)?));
    }
    Ok(())
}

fn build_lrn(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = LrnArgs::parse(ctx)?;
    let want_scale = ctx.num_outputs() == 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &a.op, 0, lrn_t(&mut l, &a, want_scale))?;
        Ok(true)
    }))
}

fn lrn_grad_t<T: Float>(l: &mut Locked<'_>, a: &LrnArgs) -> Result<()> {
    let op = a.op.as_str();
    let (n, c, hw) = channels(op, l, a.order)?;
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    for i in [1, 2] {
        let s = l.tensor(i)?.shape();
        if s != shape.as_slice() {
            return Err(Error::shape(format!(
                "{op}: '{}' (shape {s:?}) must have X's shape {shape:?}",
                l.input_name(i)
            ))
            .with_blob(l.input_name(i)));
        }
    }
    let x = dense(xa);
    let (y, dy) = (dense(input::<T>(l, op, 1)?), dense(input::<T>(l, op, 2)?));
    let s = a.scale(&x, n, c, hw);
    let nb = T::of(-a.beta);
    // ratio_c = dY_c * Y_c / scale_c; dX_j = dY_j scale_j^-beta
    //   - 2 alpha beta / size * X_j * (sum of ratio_c over the windows c holding j).
    let ratio: Vec<T> = (0..x.len()).map(|i| dy[i] * y[i] / s[i]).collect();
    let k = T::of(2.0 * a.alpha * a.beta / a.size as f64);
    let pre = (a.size - 1) / 2;
    let post = a.size - 1 - pre;
    let mut dx = vec![T::of(0.0); x.len()];
    a.rows(n, c, hw, |base, st| {
        for j in 0..c {
            let lo = j.saturating_sub(post);
            let hi = (j + pre + 1).min(c);
            let acc: T = (lo..hi).map(|ch| ratio[base + ch * st]).sum();
            let i = base + j * st;
            dx[i] = dy[i] * s[i].powf(nb) - k * x[i] * acc;
        }
    });
    l.set_output(0, T::wrap(array(&shape, dx)?));
    Ok(())
}

fn build_lrn_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = LrnArgs::parse(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &a.op, 0, lrn_grad_t(&mut l, &a))?;
        Ok(true)
    }))
}

// -------------------------------------------------------- ChannelShuffle --

fn shuffle_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    order: Order,
    group: usize,
    inverse: bool,
) -> Result<()> {
    let (n, c, hw) = channels(op, l, order)?;
    if c % group != 0 {
        return Err(Error::shape(format!(
            "{op}: X ('{}') has {c} channels, not divisible by group {group}",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0)));
    }
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let k = c / group;
    // Forward: output channel kk * group + g reads input channel g * k + kk.
    let src = |oc: usize| {
        if inverse {
            (oc % k) * group + oc / k
        } else {
            (oc % group) * k + oc / group
        }
    };
    let mut y = vec![T::of(0.0); x.len()];
    match order {
        Order::Nchw => {
            for b in 0..n {
                for oc in 0..c {
                    let (o, i) = ((b * c + oc) * hw, (b * c + src(oc)) * hw);
                    y[o..o + hw].copy_from_slice(&x[i..i + hw]);
                }
            }
        }
        Order::Nhwc => {
            for p in 0..n * hw {
                for oc in 0..c {
                    y[p * c + oc] = x[p * c + src(oc)];
                }
            }
        }
    }
    l.set_output(0, T::wrap(array(&shape, y)?));
    Ok(())
}

fn build_shuffle(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let group = ctx.args.i64("group", 1)?;
    if group < 1 {
        return Err(ctx.bad_arg(format!("group must be >= 1, got {group}")));
    }
    let group = group as usize;
    let order = parse_order(ctx)?;
    let inverse = ctx.op_type().ends_with("Gradient");
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &op, 0, shuffle_t(&mut l, &op, order, group, inverse))?;
        Ok(true)
    }))
}

// --------------------------------------------------------------- schemas --

const BN_ARGS: &[ArgDoc] = &[
    arg!(
        "is_test",
        "int",
        "0",
        "use the given mean and variance (inference); 1 output"
    ),
    arg!("epsilon", "float", "1e-5", "added to the variance"),
    arg!(
        "momentum",
        "float",
        "0.9",
        "running = momentum * running + (1 - momentum) * batch statistic"
    ),
    arg!("order", "string", "\"NCHW\"", "NCHW or NHWC"),
    arg!(
        "num_batches",
        "int",
        "1",
        "only 1 (statistics of this batch) is supported"
    ),
];
const LRN_ARGS: &[ArgDoc] = &[
    arg!("size", "int", "none", "channels in the window (odd)"),
    arg!("alpha", "float", "0", "scale of the sum of squares"),
    arg!("beta", "float", "0", "the exponent"),
    arg!("bias", "float", "1", "added to the scaled sum"),
    arg!("order", "string", "\"NCHW\"", "NCHW or NHWC"),
];
const SHUFFLE_ARGS: &[ArgDoc] = &[
    arg!(
        "group",
        "int",
        "1",
        "the channels are group x C/group, transposed to C/group x group"
    ),
    arg!("order", "string", "\"NCHW\"", "NCHW or NHWC"),
];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("SpatialBN", build_bn)
            .inputs(5, 5)
            .outputs(1, 5)
            .inplace(InPlace::Enforce(bn_inplace))
            .args(BN_ARGS)
            .doc("Batch normalisation per channel: inputs (X, scale, bias, mean, var); with is_test, output Y from the given statistics; else outputs (Y, running mean, running var (in place on inputs 3 and 4), saved mean, saved inverse std) from the batch's statistics (biased variance)."),
        OpSchema::new("SpatialBNGradient", build_bn_grad)
            .inputs(5, 5)
            .outputs(3, 3)
            .args(BN_ARGS)
            .doc("Gradient of SpatialBN: inputs (X, scale, dY, saved mean, saved inverse std) (with is_test: the estimated mean and variance), outputs (dX, dscale, dbias)."),
        OpSchema::new("LRN", build_lrn)
            .inputs(1, 1)
            .outputs(1, 2)
            .args(LRN_ARGS)
            .doc("Local response normalisation across channels: Y = X * scale^-beta, scale = bias + alpha / size * (sum of X^2 over the `size` channels centred on each); optional output 1 is the scale."),
        OpSchema::new("LRNGradient", build_lrn_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(LRN_ARGS)
            .doc("Gradient of LRN: inputs (X, Y, dY), output dX."),
        OpSchema::new("ChannelShuffle", build_shuffle)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(SHUFFLE_ARGS)
            .doc("Shuffles channels: viewed as (group, C / group), transposed to (C / group, group)."),
        OpSchema::new("ChannelShuffleGradient", build_shuffle)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(SHUFFLE_ARGS)
            .doc("Gradient of ChannelShuffle: input dY, output dX (the inverse shuffle)."),
    ]
}

#[cfg(test)]
mod tests {
    use crate::tensor::Tensor;
    use crate::test_util::{get, int_arg, op, run, ws_with};

    #[test]
    fn channel_shuffle_by_hand() {
        // 6 channels as 2 groups of 3: (0 1 2)(3 4 5) -> 0 3 1 4 2 5.
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let ws = ws_with(&[("x", Tensor::from_vec(&[1, 6, 1], x).unwrap())]);
        run(
            &ws,
            op("ChannelShuffle", &["x"], &["y"], vec![int_arg("group", 2)]),
        )
        .unwrap();
        let y: Vec<f32> = get(&ws, "y")
            .array::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(y, vec![0., 3., 1., 4., 2., 5.]);
        run(
            &ws,
            op(
                "ChannelShuffleGradient",
                &["y"],
                &["z"],
                vec![int_arg("group", 2)],
            ),
        )
        .unwrap();
        let z: Vec<f32> = get(&ws, "z")
            .array::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(z, (0..6).map(|v| v as f32).collect::<Vec<_>>());
    }
}
