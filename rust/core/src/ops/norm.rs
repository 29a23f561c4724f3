//! Normalisation and channel ops of convolutional nets (issue 15):
//! `SpatialBN` (batch normalisation per channel, training and test),
//! with `num_batches` the statistics of several batches (`ChannelStats`,
//! `ChannelBackpropStats` compute each batch's), `LRN` (local response
//! normalisation across channels), `ChannelShuffle`, `LayerNorm`
//! (normalisation over the dims from an axis on), `Normalize` and
//! `NormalizeL1` (unit norm along an axis), and their gradients.
//! Channels are dim 1 (`order` NCHW) or the last dim (NHWC); float32 or
//! float64.

#![allow(clippy::result_large_err)]

use super::kit::{array, dense, float_kernel, input, lane_sum, parse_order, Order};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
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
    Ok(crate::tensor::try_to_vec(&dense(v), "a kernel buffer")?)
}

// ------------------------------------------------------------- SpatialBN --

struct BnArgs {
    is_test: bool,
    epsilon: f64,
    momentum: f64,
    order: Order,
    /// Batches whose statistics are given (training with 7 inputs: the
    /// sums, or the summed scale and bias gradients); 1: this batch's.
    num_batches: usize,
    op: String,
}

impl BnArgs {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<BnArgs> {
        let is_test = ctx.args.i64("is_test", 0)? != 0;
        let epsilon = f64::from(ctx.epsilon(1e-5)?);
        let momentum = f64::from(ctx.args.f32("momentum", 0.9)?);
        if !(0.0..=1.0).contains(&momentum) {
            return Err(ctx.bad_arg(format!("momentum must be in [0, 1], got {momentum}")));
        }
        let num_batches = ctx.args.i64("num_batches", 1)?;
        let num_batches = usize::try_from(num_batches)
            .ok()
            .filter(|&b| b >= 1)
            .ok_or_else(|| ctx.bad_arg(format!("num_batches must be >= 1, got {num_batches}")))?;
        let a = BnArgs {
            is_test,
            epsilon,
            momentum,
            order: parse_order(ctx)?,
            num_batches,
            op: ctx.op_type().to_string(),
        };
        let ni = ctx.num_inputs();
        if a.multi_batch() && ni != 7 {
            let what = if a.op == "SpatialBN" {
                "the per-channel sums and sums of squares of all the batches"
            } else {
                "the scale and bias gradients summed over all the batches"
            };
            return Err(ctx.bad_arg(format!(
                "num_batches = {num_batches} in training takes 7 inputs, inputs 5 and 6 {what}; got {ni} inputs"
            )));
        }
        Ok(a)
    }
}

impl BnArgs {
    /// Training from statistics of several batches (inputs 5 and 6).
    fn multi_batch(&self) -> bool {
        !self.is_test && self.num_batches > 1
    }
}

/// Tensors of at least this many elements are split across the kernel
/// pool (the break-even of `elementwise::loops::PAR_MIN_LEN`).
const PAR_MIN_LEN: usize = 1 << 18;
/// About this many elements per rayon task (a few of the elementwise
/// loops' chunks, so that the running pool threads take over the work of
/// one the OS descheduled).
const TASK_LEN: usize = 1 << 16;

/// Whether `len` elements are worth the kernel pool, for an op whose
/// break-even is `min` elements ([`PAR_MIN_LEN`] for the memory-bound
/// ones, [`LRN_PAR_MIN`] for LRN).
fn parallel(len: usize, min: usize) -> bool {
    len >= min && crate::threads::pool_available()
}

/// `y = x * alpha[c] + beta[c]`, `c` each element's channel: plane by
/// plane (NCHW) or pixel by pixel (NHWC), on the widest vectors
/// (`vmath::wide`: a multiply and an add per lane, the same values on
/// every path) and on the kernel pool for large tensors.
fn channel_affine<T: Float>(
    x: &[T],
    y: &mut [std::mem::MaybeUninit<T>],
    c: usize,
    hw: usize,
    order: Order,
    alpha: &[T],
    beta: &[T],
) {
    if x.is_empty() {
        return;
    }
    use rayon::prelude::*;
    match order {
        Order::Nchw => {
            // Planes i0.. of y and x, on the widest vectors.
            let planes = |i0: usize, y: &mut [std::mem::MaybeUninit<T>], x: &[T]| {
                crate::vmath::wide(
                    #[inline(always)]
                    || {
                        let pairs = y.chunks_exact_mut(hw).zip(x.chunks_exact(hw));
                        for (i, (y, x)) in pairs.enumerate() {
                            let (a, b) = (alpha[(i0 + i) % c], beta[(i0 + i) % c]);
                            for (o, &v) in y.iter_mut().zip(x) {
                                o.write(v * a + b);
                            }
                        }
                    },
                )
            };
            if parallel(x.len(), PAR_MIN_LEN) {
                let per = (TASK_LEN / hw).max(1);
                y.par_chunks_mut(per * hw)
                    .zip(x.par_chunks(per * hw))
                    .enumerate()
                    .for_each(|(k, (y, x))| planes(k * per, y, x));
            } else {
                planes(0, y, x);
            }
        }
        Order::Nhwc => {
            let pixels = |(y, x): (&mut [std::mem::MaybeUninit<T>], &[T])| {
                crate::vmath::wide(
                    #[inline(always)]
                    || {
                        for (y, x) in y.chunks_exact_mut(c).zip(x.chunks_exact(c)) {
                            for ((o, &v), (&a, &b)) in
                                y.iter_mut().zip(x).zip(alpha.iter().zip(beta))
                            {
                                o.write(v * a + b);
                            }
                        }
                    },
                )
            };
            // Whole pixels per task.
            let per = (TASK_LEN / c).max(1) * c;
            if parallel(x.len(), PAR_MIN_LEN) {
                y.par_chunks_mut(per)
                    .zip(x.par_chunks(per))
                    .for_each(pixels);
            } else {
                pixels((y, x));
            }
        }
    }
}

/// Per channel of an NCHW `x` (planes of `hw`): the sum of `x - shift[c]`,
/// or with `square` of its square. Each plane is summed by `lane_sum` (on
/// the kernel pool for large tensors), then the planes of a channel in
/// batch order.
fn plane_sums<T: Float>(x: &[T], c: usize, hw: usize, shift: &[T], square: bool) -> Result<Vec<T>> {
    let mut out = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
    if x.is_empty() {
        return Ok(out);
    }
    let planes = x.len() / hw;
    let mut per_plane = crate::tensor::default_buffer::<T>(planes, "a kernel buffer")?;
    let plane = |(i, (s, x)): (usize, (&mut T, &[T]))| {
        let m = shift[i % c];
        *s = if square {
            lane_sum(x, |v| (v - m) * (v - m))
        } else {
            lane_sum(x, |v| v - m)
        };
    };
    if parallel(x.len(), PAR_MIN_LEN) {
        use rayon::prelude::*;
        per_plane
            .par_iter_mut()
            .zip(x.par_chunks_exact(hw))
            .enumerate()
            .with_max_len((TASK_LEN / hw).max(1))
            .for_each(plane);
    } else {
        per_plane
            .iter_mut()
            .zip(x.chunks_exact(hw))
            .enumerate()
            .for_each(plane);
    }
    for (i, &s) in per_plane.iter().enumerate() {
        out[i % c] += s;
    }
    Ok(out)
}

fn bn_t<T: Float>(l: &mut Locked<'_>, a: &BnArgs) -> Result<()> {
    let op = a.op.as_str();
    let (n, c, hw) = channels(op, l, a.order)?;
    let scale = vec_input::<T>(l, op, 1, "the scale", c)?;
    let bias = vec_input::<T>(l, op, 2, "the bias", c)?;
    // In training, running statistics never initialised (empty blobs)
    // start at zero, as Caffe2's deprecated path did.
    let running = |l: &Locked<'_>, i: usize, what: &str| -> Result<Vec<T>> {
        if !a.is_test && l.tensor(i)?.numel() == 0 {
            Ok(crate::tensor::default_buffer::<T>(c, "a kernel buffer")?)
        } else {
            vec_input::<T>(l, op, i, what, c)
        }
    };
    let rmean = running(l, 3, "the mean")?;
    let rvar = running(l, 4, "the variance")?;
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let eps = T::of(a.epsilon);
    if n == 0 {
        // An empty batch: an empty Y; in training the running statistics
        // stay as they were and the saved ones are zeros (Caffe2's rule).
        l.set_output(0, T::wrap(array(&shape, Vec::new())?));
        if !a.is_test {
            l.set_output(1, T::wrap(array(&[c], rmean)?));
            l.set_output(2, T::wrap(array(&[c], rvar)?));
            l.set_output(
                3,
                T::wrap(array(
                    &[c],
                    crate::tensor::default_buffer::<T>(c, "a kernel buffer")?,
                )?),
            );
            l.set_output(
                4,
                T::wrap(array(
                    &[c],
                    crate::tensor::default_buffer::<T>(c, "a kernel buffer")?,
                )?),
            );
        }
        return Ok(());
    }
    let (mean, var) = if a.is_test {
        (rmean.clone(), rvar.clone())
    } else if a.multi_batch() {
        // Statistics of num_batches batches of this one's size, from their
        // summed per-channel sums and sums of squares. A variance that
        // cancellation made negative is taken as 0.
        let sums = vec_input::<T>(l, op, 5, "the sums", c)?;
        let sumsq = vec_input::<T>(l, op, 6, "the sums of squares", c)?;
        let m = T::of((a.num_batches * n * hw).max(1) as f64);
        let mean: Vec<T> =
            crate::tensor::try_collect(sums.iter().map(|&s| s / m), "a kernel buffer")?;
        let var = (0..c)
            .map(|i| {
                let v = (sumsq[i] - sums[i] * mean[i]) / m;
                if v > T::of(0.0) {
                    v
                } else {
                    T::of(0.0)
                }
            })
            .collect();
        (mean, var)
    } else {
        let m = T::of((n * hw).max(1) as f64);
        let zeros = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
        let sum = match a.order {
            Order::Nchw => plane_sums(&x, c, hw, &zeros, false)?,
            Order::Nhwc => {
                let mut sum = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
                for_each_channel(n, c, hw, a.order, |ch, i| sum[ch] += x[i]);
                sum
            }
        };
        let mean: Vec<T> =
            crate::tensor::try_collect(sum.iter().map(|&s| s / m), "a kernel buffer")?;
        let sq = match a.order {
            Order::Nchw => plane_sums(&x, c, hw, &mean, true)?,
            Order::Nhwc => {
                let mut sq = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
                for_each_channel(n, c, hw, a.order, |ch, i| {
                    let d = x[i] - mean[ch];
                    sq[ch] += d * d;
                });
                sq
            }
        };
        (
            mean,
            crate::tensor::try_collect(sq.iter().map(|&s| s / m), "a kernel buffer")?,
        )
    };
    let rstd: Vec<T> = crate::tensor::try_collect(
        var.iter().map(|&v| T::of(1.0) / (v + eps).sqrt()),
        "a kernel buffer",
    )?;
    let alpha: Vec<T> =
        crate::tensor::try_collect((0..c).map(|i| scale[i] * rstd[i]), "a kernel buffer")?;
    let beta: Vec<T> = crate::tensor::try_collect(
        (0..c).map(|i| bias[i] - alpha[i] * mean[i]),
        "a kernel buffer",
    )?;
    if x.len() != n * c * hw {
        return Err(Error::internal("SpatialBN: the planes do not cover X"));
    }
    // SAFETY: `channel_affine` writes every element of Y (X's length, whole
    // planes or pixels: checked above).
    let y = unsafe {
        crate::tensor::written_vec(x.len(), "SpatialBN's output", |y| {
            channel_affine(&x, y, c, hw, a.order, &alpha, &beta)
        })?
    };
    l.set_output(0, T::wrap(array(&shape, y)?));
    if !a.is_test {
        let (mo, keep) = (T::of(a.momentum), T::of(1.0 - a.momentum));
        // The running variance takes the unbiased estimate, size / (size -
        // 1) times the batch's (Caffe2's rule); with a single element per
        // channel there is none, and the biased one (0) is kept where
        // Caffe2 multiplied 0 by infinity.
        let size = a.num_batches * n * hw;
        let unbias = if size > 1 {
            T::of(size as f64 / (size - 1) as f64)
        } else {
            T::of(1.0)
        };
        let rm: Vec<T> = crate::tensor::try_collect(
            (0..c).map(|i| rmean[i] * mo + mean[i] * keep),
            "a kernel buffer",
        )?;
        let rv: Vec<T> = crate::tensor::try_collect(
            (0..c).map(|i| rvar[i] * mo + var[i] * unbias * keep),
            "a kernel buffer",
        )?;
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
    float_kernel!(&a.op, 0, |l| bn_t(&mut l, &a))
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
    // The scale and bias gradients over every batch the statistics cover:
    // this batch's, or (several batches) the sums given as inputs 5 and 6.
    let (dscale, dbias) = if n == 0 {
        // An empty batch contributes nothing, whatever it was given (Caffe2's
        // rule): dX is empty and the scale and bias gradients are zeros.
        (
            crate::tensor::default_buffer::<T>(c, "a kernel buffer")?,
            crate::tensor::default_buffer::<T>(c, "a kernel buffer")?,
        )
    } else if a.multi_batch() {
        (
            vec_input::<T>(l, op, 5, "the summed scale gradient", c)?,
            vec_input::<T>(l, op, 6, "the summed bias gradient", c)?,
        )
    } else {
        let mut dbias = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
        let mut dscale = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
        for_each_channel(n, c, hw, a.order, |ch, i| {
            dbias[ch] += dy[i];
            dscale[ch] += dy[i] * (x[i] - mean[ch]) * rstd[ch];
        });
        (dscale, dbias)
    };
    let mut dx = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
    if a.is_test {
        for_each_channel(n, c, hw, a.order, |ch, i| {
            dx[i] = dy[i] * scale[ch] * rstd[ch]
        });
    } else {
        let m = T::of((a.num_batches * n * hw).max(1) as f64);
        for_each_channel(n, c, hw, a.order, |ch, i| {
            let xhat = (x[i] - mean[ch]) * rstd[ch];
            dx[i] = scale[ch] * rstd[ch] * (dy[i] - (dbias[ch] + xhat * dscale[ch]) / m);
        });
    }
    // Each batch reports its share of the summed gradients (Caffe2's
    // contract: summing the batches' outputs gives the whole gradient).
    let share = T::of(if a.multi_batch() {
        a.num_batches as f64
    } else {
        1.0
    });
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(
        1,
        T::wrap(array(&[c], dscale.iter().map(|&v| v / share).collect())?),
    );
    l.set_output(
        2,
        T::wrap(array(&[c], dbias.iter().map(|&v| v / share).collect())?),
    );
    Ok(())
}

fn build_bn_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = BnArgs::parse(ctx)?;
    float_kernel!(&a.op, 0, |l| bn_grad_t(&mut l, &a))
}

fn bn_inplace(i: usize, o: usize) -> bool {
    (i == 3 && o == 1) || (i == 4 && o == 2)
}

/// SpatialBN may write Y over X, and the saved statistics over the sums
/// it was given (Caffe2's `AllowInplace`).
fn bn_allow_inplace(i: usize, o: usize) -> bool {
    (i == 0 && o == 0) || (i == 5 && o == 3) || (i == 6 && o == 4)
}

/// SpatialBNGradient's summed scale and bias gradients (inputs 5 and 6)
/// may be its outputs 1 and 2 (Caffe2's maker names them so).
fn bn_grad_inplace(i: usize, o: usize) -> bool {
    (i == 5 && o == 1) || (i == 6 && o == 2)
}

// --------------------------------------------- ChannelStats (multi-batch BN) --

/// ChannelStats: X -> (per-channel sum, sum of squares);
/// ChannelBackpropStats: (X, saved mean, saved inverse std, dY) -> (scale
/// gradient, bias gradient) of this batch. Their sums over batches feed
/// SpatialBN and SpatialBNGradient with num_batches.
fn channel_stats_t<T: Float>(l: &mut Locked<'_>, op: &str, order: Order) -> Result<()> {
    let (n, c, hw) = channels(op, l, order)?;
    let backprop = op == "ChannelBackpropStats";
    let (mean, rstd) = if backprop {
        (
            vec_input::<T>(l, op, 1, "the saved mean", c)?,
            vec_input::<T>(l, op, 2, "the saved inverse std", c)?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let xa = input::<T>(l, op, 0)?;
    let x = dense(xa);
    let mut a = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
    let mut b = crate::tensor::default_buffer::<T>(c, "a kernel buffer")?;
    if backprop {
        let dya = input::<T>(l, op, 3)?;
        if dya.shape() != xa.shape() {
            return Err(Error::shape(format!(
                "{op}: dY ('{}', shape {:?}) must have X's shape {:?}",
                l.input_name(3),
                dya.shape(),
                xa.shape()
            ))
            .with_blob(l.input_name(3)));
        }
        let dy = dense(dya);
        for_each_channel(n, c, hw, order, |ch, i| {
            a[ch] += dy[i] * (x[i] - mean[ch]) * rstd[ch];
            b[ch] += dy[i];
        });
    } else {
        for_each_channel(n, c, hw, order, |ch, i| {
            a[ch] += x[i];
            b[ch] += x[i] * x[i];
        });
    }
    l.set_output(0, T::wrap(array(&[c], a)?));
    l.set_output(1, T::wrap(array(&[c], b)?));
    Ok(())
}

fn build_channel_stats(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let order = parse_order(ctx)?;
    float_kernel!(&op, 0, |l| channel_stats_t(&mut l, &op, order))
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

    /// scale = bias + alpha / size * (sum of x^2 over the channel window),
    /// the window's squares summed in channel order. NCHW: plane by plane
    /// (each sum runs over whole planes, so it vectorises); NHWC: pixel by
    /// pixel; on the kernel pool for large tensors. The same values either
    /// way (the squares are non-negative, so a sum that starts from its
    /// first square is the sum that starts from zero).
    fn scale<T: Float>(&self, x: &[T], c: usize, hw: usize) -> Result<Vec<T>> {
        use rayon::prelude::*;
        let pre = (self.size - 1) / 2;
        let k = T::of(self.alpha / self.size as f64);
        let bias = T::of(self.bias);
        let mut s = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
        let window = |ch: usize| (ch.saturating_sub(pre), (ch + self.size - pre).min(c));
        match self.order {
            Order::Nchw => {
                let plane = |(q, out): (usize, &mut [T])| {
                    let (b, ch) = (q / c, q % c);
                    let (lo, hi) = window(ch);
                    let at = |j: usize| &x[(b * c + j) * hw..(b * c + j + 1) * hw];
                    for (o, &v) in out.iter_mut().zip(at(lo)) {
                        *o = v * v;
                    }
                    for j in lo + 1..hi {
                        for (o, &v) in out.iter_mut().zip(at(j)) {
                            *o += v * v;
                        }
                    }
                    for o in out.iter_mut() {
                        *o = bias + k * *o;
                    }
                };
                // (No planes when hw is 0: chunks of 0 elements panic.)
                if hw > 0 && parallel(x.len(), LRN_PAR_MIN) {
                    s.par_chunks_mut(hw).enumerate().for_each(plane);
                } else if hw > 0 {
                    s.chunks_mut(hw).enumerate().for_each(plane);
                }
            }
            Order::Nhwc => {
                let pixel = |(p, out): (usize, &mut [T])| {
                    let xs = &x[p * c..(p + 1) * c];
                    for (ch, o) in out.iter_mut().enumerate() {
                        let (lo, hi) = window(ch);
                        let sq: T = xs[lo..hi].iter().map(|&v| v * v).sum();
                        *o = bias + k * sq;
                    }
                };
                if c > 0 && parallel(x.len(), LRN_PAR_MIN) {
                    s.par_chunks_mut(c).enumerate().for_each(pixel);
                } else if c > 0 {
                    s.chunks_mut(c).enumerate().for_each(pixel);
                }
            }
        }
        Ok(s)
    }
}

/// LRN's tensors of at least this many elements go to the kernel pool: a
/// `powf` per element (tens of nanoseconds) pays for the hand-off far below
/// the memory-bound ops' threshold.
const LRN_PAR_MIN: usize = 1 << 14;

fn lrn_t<T: Float>(l: &mut Locked<'_>, a: &LrnArgs, want_scale: bool) -> Result<()> {
    use rayon::prelude::*;
    let (_, c, hw) = channels(&a.op, l, a.order)?;
    let xa = input::<T>(l, &a.op, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let s = a.scale(&x, c, hw)?;
    let nb = T::of(-a.beta);
    let mut y = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
    let f = |(o, (xs, ss)): (&mut [T], (&[T], &[T]))| {
        for ((o, &v), &sc) in o.iter_mut().zip(xs).zip(ss) {
            *o = v * sc.powf(nb);
        }
    };
    const CH: usize = 1 << 12;
    if parallel(x.len(), LRN_PAR_MIN) {
        y.par_chunks_mut(CH)
            .zip(x.par_chunks(CH).zip(s.par_chunks(CH)))
            .for_each(f);
    } else {
        y.chunks_mut(CH)
            .zip(x.chunks(CH).zip(s.chunks(CH)))
            .for_each(f);
    }
    l.set_output(0, T::wrap(array(&shape, y)?));
    if want_scale {
        l.set_output(1, T::wrap(array(&shape, s)?));
    }
    Ok(())
}

fn build_lrn(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = LrnArgs::parse(ctx)?;
    let want_scale = ctx.num_outputs() == 2;
    float_kernel!(&a.op, 0, |l| lrn_t(&mut l, &a, want_scale))
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
    let s = a.scale(&x, c, hw)?;
    let nb = T::of(-a.beta);
    // ratio_c = dY_c * Y_c / scale_c; dX_j = dY_j scale_j^-beta
    //   - 2 alpha beta / size * X_j * (sum of ratio_c over the windows c holding j).
    let ratio: Vec<T> =
        crate::tensor::try_collect((0..x.len()).map(|i| dy[i] * y[i] / s[i]), "a kernel buffer")?;
    let k = T::of(2.0 * a.alpha * a.beta / a.size as f64);
    let pre = (a.size - 1) / 2;
    let post = a.size - 1 - pre;
    let mut dx = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
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
    float_kernel!(&a.op, 0, |l| lrn_grad_t(&mut l, &a))
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
    let mut y = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
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
    float_kernel!(&op, 0, |l| shuffle_t(&mut l, &op, order, group, inverse))
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
        "in training, > 1: the statistics (SpatialBN) or the scale and bias gradients (SpatialBNGradient) of that many batches of this one's size are given, summed, as inputs 5 and 6"
    ),
];
const ORDER_ARG: &[ArgDoc] = &[arg!("order", "string", "\"NCHW\"", "NCHW or NHWC")];
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
            .inputs(5, 7)
            .outputs(1, 5)
            .inplace(InPlace::EnforceAllow {
                enforce: bn_inplace,
                allow: bn_allow_inplace,
            })
            .args(BN_ARGS)
            .doc("Batch normalisation per channel: inputs (X, scale, bias, mean, var[, sums, sums of squares]); with is_test, output Y from the given statistics; else outputs (Y, running mean, running var (in place on inputs 3 and 4), saved mean, saved inverse std) from the batch's statistics (biased variance), or with num_batches > 1 from the per-channel sums and sums of squares of num_batches batches (inputs 5 and 6, e.g. ChannelStats summed)."),
        OpSchema::new("SpatialBNGradient", build_bn_grad)
            .inputs(5, 7)
            .outputs(3, 3)
            .inplace(InPlace::Allow(bn_grad_inplace))
            .args(BN_ARGS)
            .doc("Gradient of SpatialBN: inputs (X, scale, dY, saved mean, saved inverse std[, summed dscale, summed dbias]) (with is_test: the estimated mean and variance), outputs (dX, dscale, dbias); with num_batches > 1 the scale and bias gradients of all the batches are given (e.g. ChannelBackpropStats summed) and each output is its share (divided by num_batches)."),
        OpSchema::new("ChannelStats", build_channel_stats)
            .inputs(1, 1)
            .outputs(2, 2)
            .args(ORDER_ARG)
            .doc("Per-channel sum and sum of squares of X (outputs (sum, sumsq), C elements each): the statistics SpatialBN with num_batches takes, summed over the batches."),
        OpSchema::new("ChannelBackpropStats", build_channel_stats)
            .inputs(4, 4)
            .outputs(2, 2)
            .args(ORDER_ARG)
            .doc("Inputs (X, saved mean, saved inverse std, dY): this batch's SpatialBN scale gradient (sum of dY * (X - mean) * inverse std per channel) and bias gradient (sum of dY), which SpatialBNGradient with num_batches takes, summed over the batches."),
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
        OpSchema::new("LayerNorm", build_layer_norm)
            .inputs(1, 3)
            .outputs(3, 3)
            .args(LAYER_NORM_ARGS)
            .doc("Normalises X over its dims from `axis` on: inputs (X[, gamma, beta] with elementwise_affine, each of X's shape from axis), outputs (Y, mean, std), mean and std of shape X.shape[:axis] + [1], std = sqrt(var + epsilon) (biased variance); Y = (X - mean) / std (* gamma + beta)."),
        OpSchema::new("LayerNormGradient", build_layer_norm_grad)
            .inputs(5, 6)
            .outputs(1, 3)
            .args(LAYER_NORM_ARGS)
            .doc("Gradient of LayerNorm: inputs (dY, Y, mean, std, X[, gamma]), outputs (dX[, dgamma, dbeta])."),
        OpSchema::new("Normalize", build_normalize)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(AXIS_LAST)
            .doc("L2 normalisation along `axis`: Y = X / max(|X|, 1e-12), the norm over that dim (float32 or float64)."),
        OpSchema::new("NormalizeGradient", build_normalize)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(AXIS_LAST)
            .doc("Gradient of Normalize: inputs (X, dY), output dX = dY / n - X (X . dY) / n^3, n = max(|X|, 1e-12) along `axis`."),
        OpSchema::new("NormalizeL1", build_normalize)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(AXIS_LAST)
            .doc("L1 normalisation along `axis`: Y = X / sum |X| over that dim (a zero row stays zero). No gradient."),
        OpSchema::new("ChannelShuffleGradient", build_shuffle)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(SHUFFLE_ARGS)
            .doc("Gradient of ChannelShuffle: input dY, output dX (the inverse shuffle)."),
    ]
}

// ------------------------------------------------------------- LayerNorm --

const LAYER_NORM_ARGS: &[ArgDoc] = &[
    arg!(
        "axis",
        "int",
        "1",
        "the first normalised dim (negative: from the end)"
    ),
    arg!("epsilon", "float", "1e-5", "added to the variance"),
    arg!(
        "elementwise_affine",
        "bool",
        "0",
        "inputs gamma and beta scale and shift Y"
    ),
];

struct LnArgs {
    axis: i64,
    epsilon: f64,
    affine: bool,
    op: String,
}

impl LnArgs {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<Self> {
        let affine = ctx.args.bool("elementwise_affine", false)?;
        let a = LnArgs {
            axis: ctx.args.i64("axis", 1)?,
            epsilon: ctx.epsilon(1e-5)? as f64,
            affine,
            op: ctx.op_type().to_string(),
        };
        let ni = ctx.num_inputs();
        let want = match (a.op.as_str(), affine) {
            ("LayerNorm", true) => 3,
            ("LayerNorm", false) => 1,
            (_, true) => 6,
            _ => 5,
        };
        if ni != want {
            return Err(ctx.bad_arg(format!(
                "{} takes {want} inputs with elementwise_affine = {}; got {ni}",
                a.op, affine as i32
            )));
        }
        let no = ctx.num_outputs();
        if a.op == "LayerNormGradient" && no != if affine { 3 } else { 1 } {
            return Err(ctx.bad_arg(format!(
                "LayerNormGradient has {} outputs with elementwise_affine = {}; got {no}",
                if affine { 3 } else { 1 },
                affine as i32
            )));
        }
        Ok(a)
    }

    /// (rows M, row length N, the moments' shape) of X (input `xi`).
    fn split(&self, l: &Locked<'_>, xi: usize) -> Result<(usize, usize, Vec<usize>)> {
        let shape = l.tensor(xi)?.shape().to_vec();
        let axis =
            super::kit::canonical_axis(&self.op, "axis", self.axis, shape.len(), l.input_name(xi))?;
        let m: usize = shape[..axis].iter().product();
        let n: usize = shape[axis..].iter().product();
        let mut moments = shape[..axis].to_vec();
        moments.push(1);
        Ok((m, n, moments))
    }
}

/// Input `i` with exactly `len` elements (gamma, beta, mean, std).
fn sized<'l, T: Float>(
    l: &'l Locked<'_>,
    op: &str,
    i: usize,
    what: &str,
    len: usize,
) -> Result<std::borrow::Cow<'l, [T]>> {
    let a = input::<T>(l, op, i)?;
    if a.len() != len {
        return Err(Error::shape(format!(
            "{op}: {what} ('{}', shape {:?}) must have {len} elements",
            l.input_name(i),
            a.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(dense(a))
}

fn layer_norm_t<T: Float>(l: &mut Locked<'_>, a: &LnArgs) -> Result<()> {
    let op = a.op.as_str();
    let (m, n, mshape) = a.split(l, 0)?;
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let affine = if a.affine {
        Some((
            sized::<T>(l, op, 1, "gamma", n)?.into_owned(),
            sized::<T>(l, op, 2, "beta", n)?.into_owned(),
        ))
    } else {
        None
    };
    let (mut mean, mut std) = (
        crate::tensor::default_buffer::<T>(m, "a kernel buffer")?,
        crate::tensor::default_buffer::<T>(m, "a kernel buffer")?,
    );
    let mut y = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
    let inv_n = T::of(1.0 / n.max(1) as f64);
    for r in 0..m {
        let row = &x[r * n..(r + 1) * n];
        let mu = row.iter().fold(T::of(0.0), |s, &v| s + v) * inv_n;
        let var = row.iter().fold(T::of(0.0), |s, &v| s + (v - mu) * (v - mu)) * inv_n;
        let sd = (var + T::of(a.epsilon)).sqrt();
        let inv = T::of(1.0) / sd;
        for (j, (&v, o)) in row.iter().zip(&mut y[r * n..(r + 1) * n]).enumerate() {
            let z = (v - mu) * inv;
            *o = match &affine {
                Some((g, b)) => z * g[j] + b[j],
                None => z,
            };
        }
        mean[r] = mu;
        std[r] = sd;
    }
    l.set_output(0, T::wrap(array(&shape, y)?));
    l.set_output(1, T::wrap(array(&mshape, mean)?));
    l.set_output(2, T::wrap(array(&mshape, std)?));
    Ok(())
}

fn build_layer_norm(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = LnArgs::parse(ctx)?;
    float_kernel!(&a.op, 0, |l| layer_norm_t(&mut l, &a))
}

fn layer_norm_grad_t<T: Float>(l: &mut Locked<'_>, a: &LnArgs) -> Result<()> {
    let op = a.op.as_str();
    // Inputs (dY, Y, mean, std, X[, gamma]).
    let (m, n, _) = a.split(l, 4)?;
    let xa = input::<T>(l, op, 4)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let dya = input::<T>(l, op, 0)?;
    if dya.shape() != shape.as_slice() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have X's shape {shape:?}",
            l.input_name(0),
            dya.shape()
        ))
        .with_blob(l.input_name(0)));
    }
    let dy = dense(dya);
    let mean = sized::<T>(l, op, 2, "the mean", m)?;
    let std = sized::<T>(l, op, 3, "the std", m)?;
    let gamma = if a.affine {
        Some(sized::<T>(l, op, 5, "gamma", n)?)
    } else {
        None
    };
    let mut dx = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
    let (mut dgamma, mut dbeta) = (
        crate::tensor::default_buffer::<T>(n, "a kernel buffer")?,
        crate::tensor::default_buffer::<T>(n, "a kernel buffer")?,
    );
    let inv_n = T::of(1.0 / n.max(1) as f64);
    let mut g = crate::tensor::default_buffer::<T>(n, "a kernel buffer")?;
    let mut xhat = crate::tensor::default_buffer::<T>(n, "a kernel buffer")?;
    for r in 0..m {
        let inv = T::of(1.0) / std[r];
        let (mut sg, mut sgx) = (T::of(0.0), T::of(0.0));
        for j in 0..n {
            let k = r * n + j;
            xhat[j] = (x[k] - mean[r]) * inv;
            g[j] = match &gamma {
                Some(gm) => dy[k] * gm[j],
                None => dy[k],
            };
            sg = sg + g[j];
            sgx = sgx + g[j] * xhat[j];
            dgamma[j] = dgamma[j] + dy[k] * xhat[j];
            dbeta[j] = dbeta[j] + dy[k];
        }
        let (mg, mgx) = (sg * inv_n, sgx * inv_n);
        for j in 0..n {
            dx[r * n + j] = (g[j] - mg - xhat[j] * mgx) * inv;
        }
    }
    l.set_output(0, T::wrap(array(&shape, dx)?));
    if a.affine {
        let gshape = l.tensor(5)?.shape().to_vec();
        l.set_output(1, T::wrap(array(&gshape, dgamma)?));
        l.set_output(2, T::wrap(array(&gshape, dbeta)?));
    }
    Ok(())
}

fn build_layer_norm_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = LnArgs::parse(ctx)?;
    float_kernel!(&a.op, 4, |l| layer_norm_grad_t(&mut l, &a))
}

// ------------------------------------------------------------- Normalize --

const AXIS_LAST: &[ArgDoc] = &[arg!(
    "axis",
    "int",
    "-1",
    "the dim normalised (negative: from the end)"
)];

/// Normalize, NormalizeGradient and NormalizeL1 over the rows along `axis`
/// (element `(o, j, i)` of X viewed as [outer, dim, inner]).
fn normalize_t<T: Float>(l: &mut Locked<'_>, op: &str, axis: i64) -> Result<()> {
    let xa = input::<T>(l, op, 0)?;
    let shape = xa.shape().to_vec();
    let name = l.input_name(0);
    if shape.is_empty() {
        return Err(
            Error::shape(format!("{op}: X ('{name}') must have at least one dim")).with_blob(name),
        );
    }
    let ax = super::kit::canonical_axis(op, "axis", axis, shape.len(), name)?;
    let (outer, d, inner) = (
        shape[..ax].iter().product::<usize>(),
        shape[ax],
        shape[ax + 1..].iter().product::<usize>(),
    );
    let x = dense(xa);
    let grad = op == "NormalizeGradient";
    let dy = if grad {
        let g = input::<T>(l, op, 1)?;
        if g.shape() != shape.as_slice() {
            return Err(Error::shape(format!(
                "{op}: dY ('{}', shape {:?}) must have X's shape {shape:?}",
                l.input_name(1),
                g.shape()
            ))
            .with_blob(l.input_name(1)));
        }
        Some(dense(g))
    } else {
        None
    };
    let mut out = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
    let eps = T::of(1e-12);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * d + j) * inner + i;
            if op == "NormalizeL1" {
                let n = (0..d).fold(T::of(0.0), |s, j| {
                    let v = x[at(j)];
                    s + if v < T::of(0.0) { T::of(0.0) - v } else { v }
                });
                for j in 0..d {
                    out[at(j)] = if n != T::of(0.0) {
                        x[at(j)] / n
                    } else {
                        x[at(j)]
                    };
                }
                continue;
            }
            let sq = (0..d).fold(T::of(0.0), |s, j| s + x[at(j)] * x[at(j)]);
            let mut n = sq.sqrt();
            if n < eps {
                n = eps;
            }
            match &dy {
                None => {
                    for j in 0..d {
                        out[at(j)] = x[at(j)] / n;
                    }
                }
                Some(g) => {
                    let dot = (0..d).fold(T::of(0.0), |s, j| s + x[at(j)] * g[at(j)]);
                    let n3 = n * n * n;
                    for j in 0..d {
                        out[at(j)] = g[at(j)] / n - x[at(j)] * dot / n3;
                    }
                }
            }
        }
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_normalize(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", -1)?;
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| normalize_t(&mut l, &op, axis))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::tensor::Tensor;
    use crate::test_util::{f32s, float_arg, get, int_arg, op, run, vals, ws_with};

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

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn spatial_bn_over_two_batches_by_hand() {
        // One channel; this batch X = [1, 3], the other [5, 7]: sums 16,
        // squares 84, so over 4 values mean 4 and variance 5; epsilon 4
        // makes the inverse std 1/3. Scale 3, bias 1: Y = X - 3.
        let ws = ws_with(&[
            ("x", f32s(&[1, 1, 2], &[1., 3.])),
            ("x2", f32s(&[1, 1, 2], &[5., 7.])),
            ("s", f32s(&[1], &[3.])),
            ("b", f32s(&[1], &[1.])),
            ("rm", f32s(&[1], &[0.])),
            ("rv", f32s(&[1], &[0.])),
            ("dy", f32s(&[1, 1, 2], &[1., 2.])),
            ("dy2", f32s(&[1, 1, 2], &[3., 4.])),
        ]);
        run(&ws, op("ChannelStats", &["x"], &["sum1", "sq1"], vec![])).unwrap();
        run(&ws, op("ChannelStats", &["x2"], &["sum2", "sq2"], vec![])).unwrap();
        close(&vals(&get(&ws, "sum1")), &[4.]);
        close(&vals(&get(&ws, "sq1")), &[10.]);
        run(&ws, op("Add", &["sum1", "sum2"], &["sums"], vec![])).unwrap();
        run(&ws, op("Add", &["sq1", "sq2"], &["sumsq"], vec![])).unwrap();
        let args = || {
            vec![
                int_arg("num_batches", 2),
                float_arg("epsilon", 4.0),
                float_arg("momentum", 0.5),
            ]
        };
        run(
            &ws,
            op(
                "SpatialBN",
                &["x", "s", "b", "rm", "rv", "sums", "sumsq"],
                &["y", "rm", "rv", "mean", "rstd"],
                args(),
            ),
        )
        .unwrap();
        close(&vals(&get(&ws, "y")), &[-2., 0.]);
        close(&vals(&get(&ws, "mean")), &[4.]);
        close(&vals(&get(&ws, "rstd")), &[1. / 3.]);
        close(&vals(&get(&ws, "rm")), &[2.]);
        // The running variance takes the unbiased 5 * 4 / 3.
        close(&vals(&get(&ws, "rv")), &[0.5 * 5. * 4. / 3.]);

        // Backward: the batches' scale and bias gradients, summed:
        // dscale = sum dY (X - 4) / 3 = 10/3, dbias = 10.
        let stats = |x: &str, dy: &str, outs: &[&str]| {
            op(
                "ChannelBackpropStats",
                &[x, "mean", "rstd", dy],
                outs,
                vec![],
            )
        };
        run(&ws, stats("x", "dy", &["ds1", "db1"])).unwrap();
        run(&ws, stats("x2", "dy2", &["ds2", "db2"])).unwrap();
        close(&vals(&get(&ws, "ds1")), &[-5. / 3.]);
        close(&vals(&get(&ws, "db1")), &[3.]);
        run(&ws, op("Add", &["ds1", "ds2"], &["s_grad"], vec![])).unwrap();
        run(&ws, op("Add", &["db1", "db2"], &["b_grad"], vec![])).unwrap();
        run(
            &ws,
            op(
                "SpatialBNGradient",
                &["x", "s", "dy", "mean", "rstd", "s_grad", "b_grad"],
                &["x_grad", "s_grad", "b_grad"],
                args(),
            ),
        )
        .unwrap();
        // dX = dY - (10 + xhat * 10/3) / 4 with xhat = (X - 4) / 3.
        close(&vals(&get(&ws, "x_grad")), &[-2. / 3., -2. / 9.]);
        close(&vals(&get(&ws, "s_grad")), &[5. / 3.]);
        close(&vals(&get(&ws, "b_grad")), &[5.]);

        // Several batches need the two inputs.
        let e = run(
            &ws,
            op(
                "SpatialBN",
                &["x", "s", "b", "rm", "rv"],
                &["y", "rm", "rv", "mean", "rstd"],
                args(),
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("7 inputs"), "{e}");
    }
}
