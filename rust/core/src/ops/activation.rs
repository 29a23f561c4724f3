//! The activations that are not elementwise functions of one input:
//! Softmax (over the rows of its input flattened at an axis), PRelu (a
//! learned slope per channel) and Dropout (a random mask), with their
//! gradient ops. The elementwise activations (Relu, Sigmoid, Elu, ...) are
//! rows of the table in `unary.rs`.

#![allow(clippy::result_large_err)]

use super::kit::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{ArgDoc, InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::Tensor;
use ndarray::{ArrayD, IxDyn};

pub fn schemas() -> Vec<OpSchema> {
    const SOFTMAX_ARGS: &[crate::operator::ArgDoc] = &[arg!(
        "axis",
        "int",
        "1",
        "the input is flattened to a matrix at this dim; softmax runs over each row"
    )];
    const DROPOUT_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "ratio",
            "float",
            "0.5",
            "the probability of zeroing an element, in [0, 1]"
        ),
        arg!(
            "is_test",
            "int",
            "0",
            "non-zero: Y = X and the mask is not written"
        ),
    ];
    // Elementwise: the output is its input's shape and type (Caffe2's
    // IdenticalTypeAndShape), the gradient dY's.
    let unary = |name: &'static str, build: crate::operator::BuildFn, doc: &'static str| {
        OpSchema::new(name, build)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc(doc)
    };
    let unary_grad = |name: &'static str, build: crate::operator::BuildFn, doc: &'static str| {
        OpSchema::new(name, build)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_1_0))
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 1, n)))
            .doc(doc)
    };
    let mut v = vec![
        unary("Softmax", build_softmax, "Softmax over each row of X flattened to a matrix at `axis`.").args(SOFTMAX_ARGS),
        unary_grad("SoftmaxGradient", build_softmax_grad, "Gradient of Softmax: inputs (Y, dY), dX = Y * (dY - rowsum(dY * Y)).").args(SOFTMAX_ARGS),
        OpSchema::new("Dropout", build_dropout)
            .inputs(1, 1)
            .outputs(1, 2)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(DROPOUT_ARGS)
            .doc("Training: keeps each element with probability 1 - ratio, Y = X * mask / (1 - ratio), mask (bool) the kept ones; is_test: Y = X. Seeded by the device option's random_seed."),
        OpSchema::new("DropoutGrad", build_dropout_grad)
            .inputs(1, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(DROPOUT_ARGS)
            .doc("Gradient of Dropout: inputs (dY[, mask]), dX = dY * mask / (1 - ratio) (dX = dY with is_test)."),
    ];
    v.push(
        OpSchema::new("PRelu", build_prelu)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(PRELU_ARGS)
            .ignores(PRELU_IGNORED)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = X where X > 0, else slope * X; inputs (X, slope), the slope one value shared by all channels or one per channel (dim 1 for NCHW, the last dim for NHWC)."),
    );
    v.push(
        OpSchema::new("PReluGradient", build_prelu)
            .inputs(4, 4)
            .outputs(2, 2)
            .args(PRELU_ARGS)
            .ignores(PRELU_IGNORED)
            .infer(|_, ins, _| {
                Ok(vec![
                    crate::shapes::rules::known(ins, 2).cloned(),
                    crate::shapes::rules::known(ins, 3).cloned(),
                ])
            })
            .doc("Gradient of PRelu: inputs (Y, dY, X, slope), outputs (dX, dslope); X must not be Y (no gradient through an in-place PRelu)."),
    );
    v
}

// ------------------------------------------------------------- Softmax --

/// Softmax of each `d`-long row, stable (the row max is subtracted).
pub(crate) fn softmax_rows<T: Float>(x: &[T], d: usize) -> Result<Vec<T>> {
    let mut p = crate::tensor::try_to_vec(x, "a softmax")?;
    for row in p.chunks_mut(d.max(1)) {
        let mx = row
            .iter()
            .copied()
            .fold(row[0], |a, b| if b > a { b } else { a });
        let mut s = T::of(0.0);
        for v in row.iter_mut() {
            *v = (*v - mx).exp();
            s += *v;
        }
        for v in row.iter_mut() {
            *v = *v / s;
        }
    }
    Ok(p)
}

fn softmax_t<T: Float>(l: &mut Locked<'_>, axis: i64) -> Result<()> {
    let x = input::<T>(l, "Softmax", 0)?;
    let ax = canonical_axis("Softmax", "axis", axis, x.ndim(), l.input_name(0))?;
    let (_, d) = split_at(x.shape(), ax);
    let p = array(x.shape(), softmax_rows(&dense(x), d)?)?;
    l.set_output(0, T::wrap(p));
    Ok(())
}

fn build_softmax(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    float_kernel!("Softmax", 0, |l| softmax_t(&mut l, axis))
}

fn softmax_grad_t<T: Float>(l: &mut Locked<'_>, axis: i64) -> Result<()> {
    let op = "SoftmaxGradient";
    same_shape(op, l, 0, 1)?;
    let (y, dy) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let ax = canonical_axis(op, "axis", axis, y.ndim(), l.input_name(0))?;
    let (_, d) = split_at(y.shape(), ax);
    let (ys, dys) = (dense(y), dense(dy));
    let mut dx = crate::tensor::try_vec(ys.len(), "SoftmaxGradient's output")?;
    for (yr, dr) in ys.chunks(d.max(1)).zip(dys.chunks(d.max(1))) {
        let dot: T = yr.iter().zip(dr).map(|(&a, &b)| a * b).sum();
        dx.extend(yr.iter().zip(dr).map(|(&a, &b)| a * (b - dot)));
    }
    let dx = array(y.shape(), dx)?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_softmax_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    float_kernel!("SoftmaxGradient", 0, |l| softmax_grad_t(&mut l, axis))
}

// ------------------------------------------------------------- Dropout --

fn dropout_ratio(ctx: &OpDefCtx<'_>) -> Result<(f32, bool)> {
    let ratio = ctx.args.f32("ratio", 0.5)?;
    if !(0.0..=1.0).contains(&ratio) {
        return Err(ctx.bad_arg(format!("ratio must be in [0, 1], got {ratio}")));
    }
    Ok((ratio, ctx.args.i64("is_test", 0)? != 0))
}

/// 1 / (1 - ratio), or 0 when everything is dropped.
fn keep_scale(ratio: f32) -> f64 {
    if ratio >= 1.0 {
        0.0
    } else {
        1.0 / (1.0 - f64::from(ratio))
    }
}

fn dropout_t<T: Float>(l: &mut Locked<'_>, mask: &[bool], scale: f64) -> Result<()> {
    let x = input::<T>(l, "Dropout", 0)?;
    let s = T::of(scale);
    let y: Vec<T> = crate::tensor::try_collect(
        x.iter()
            .zip(mask)
            .map(|(&v, &k)| if k { v * s } else { T::of(0.0) }),
        "a kernel buffer",
    )?;
    let shape = x.shape().to_vec();
    l.set_output(0, T::wrap(array(&shape, y)?));
    Ok(())
}

fn build_dropout(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (ratio, is_test) = dropout_ratio(ctx)?;
    let mut rng = super::fill::make_rng(ctx);
    let want_mask = ctx.num_outputs() == 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        float_dtype(&l, "Dropout", 0)?;
        if is_test {
            if !l.aliases(0, 0) {
                let t = l.tensor(0)?.try_clone()?;
                l.set_output(0, t);
            }
            return Ok(true);
        }
        let shape = l.tensor(0)?.shape().to_vec();
        let n: usize = shape.iter().product();
        let u =
            rand::distr::Uniform::new(0.0f32, 1.0).map_err(|e| Error::internal(e.to_string()))?;
        let mask: Vec<bool> = crate::tensor::try_collect(
            (0..n).map(|_| rand::distr::Distribution::sample(&u, &mut rng) >= ratio),
            "a kernel buffer",
        )?;
        let scale = keep_scale(ratio);
        by_float!(&l, "Dropout", 0, dropout_t(&mut l, &mask, scale))?;
        if want_mask {
            let m = ArrayD::from_shape_vec(IxDyn(&shape), mask)
                .map_err(|e| Error::internal(e.to_string()))?;
            l.set_output(1, Tensor::from(m));
        }
        Ok(true)
    }))
}

fn dropout_grad_t<T: Float>(l: &mut Locked<'_>, scale: Option<f64>) -> Result<()> {
    let op = "DropoutGrad";
    let dy = input::<T>(l, op, 0)?;
    let Some(scale) = scale else {
        // dX = dY: the buffer is shared (copy on write), not copied.
        let dx = l.tensor(0)?.clone();
        l.set_output(0, dx);
        return Ok(());
    };
    let t = l.tensor(1)?;
    let name = l.input_name(1);
    let Tensor::Bool(mask) = t else {
        return Err(Error::type_error(format!(
            "{op}: the mask ('{name}') must be a bool tensor (Dropout's second output), got {}",
            t.dtype()
        ))
        .with_blob(name));
    };
    if mask.shape() != dy.shape() {
        return Err(Error::shape(format!(
            "{op}: the mask ('{name}', shape {:?}) must have dY's shape {:?}",
            mask.shape(),
            dy.shape()
        ))
        .with_blob(name));
    }
    let s = T::of(scale);
    let dx =
        crate::tensor::zip_map_array(
            dy.view(),
            mask.view(),
            |&g, &k| if k { g * s } else { T::of(0.0) },
        )?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_dropout_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (ratio, is_test) = dropout_ratio(ctx)?;
    let scale = (!is_test && ctx.num_inputs() == 2).then(|| keep_scale(ratio));
    float_kernel!("DropoutGrad", 0, |l| dropout_grad_t(&mut l, scale))
}

// ---------------------------------------------------------------- PRelu --

const PRELU_ARGS: &[ArgDoc] = &[arg!(
    "order",
    "string",
    "\"NCHW\"",
    "where X's channels are: dim 1 (NCHW) or the last dim (NHWC)"
)];
const PRELU_IGNORED: &[ArgDoc] = &[arg!(
    "alpha",
    "float",
    "",
    "accepted and ignored, as by Caffe2 (whose tests pass it): the slope is the second input"
)];

/// (channels, elements per channel run): element `i` of X has channel
/// `(i / inner) % c`; a one-element slope is shared (c = 1).
fn prelu_channels(
    l: &Locked<'_>,
    op: &str,
    order: Order,
    slope_len: usize,
) -> Result<(usize, usize)> {
    let x = l.tensor(0)?.shape();
    if slope_len == 1 {
        return Ok((1, 1));
    }
    let (c, inner) = match order {
        Order::Nchw if x.len() >= 2 => (x[1], x[2..].iter().product()),
        Order::Nhwc if !x.is_empty() => (x[x.len() - 1], 1),
        _ => (0, 1),
    };
    if c != slope_len {
        let want = if x.len() < 2 && matches!(order, Order::Nchw) || x.is_empty() {
            "one element (X has no channel dim)".to_string()
        } else {
            format!("one element or one per channel ({c})")
        };
        return Err(Error::shape(format!(
            "{op}: the slope ('{}', {slope_len} elements) must have {want}; X ('{}') has shape {x:?}, order {}",
            l.input_name(1),
            l.input_name(0),
            match order {
                Order::Nchw => "NCHW",
                Order::Nhwc => "NHWC",
            }
        ))
        .with_blob(l.input_name(1)));
    }
    Ok((c, inner))
}

fn channel(i: usize, c: usize, inner: usize) -> usize {
    if c == 1 {
        0
    } else {
        (i / inner) % c
    }
}

fn prelu_t<T: Float>(l: &mut Locked<'_>, order: Order) -> Result<()> {
    let op = "PRelu";
    let (x, w) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let (c, inner) = prelu_channels(l, op, order, w.len())?;
    let (xs, ws) = (dense(x), dense(w));
    let zero = T::of(0.0);
    let y: Vec<T> = crate::tensor::try_collect(
        xs.iter().enumerate().map(|(i, &v)| {
            if v > zero {
                v
            } else {
                ws[channel(i, c, inner)] * v
            }
        }),
        "a kernel buffer",
    )?;
    let y = array(x.shape(), y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

fn prelu_grad_t<T: Float>(l: &mut Locked<'_>, order: Order) -> Result<()> {
    let op = "PReluGradient";
    if l.input_name(0) == l.input_name(2) {
        return Err(Error::invalid_arg(format!(
            "{op}: Y and X are one blob ('{}'): cannot backpropagate through a PRelu run in place",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0)));
    }
    same_shape(op, l, 2, 0)?;
    same_shape(op, l, 2, 1)?;
    let (dy, x, w) = (
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
        input::<T>(l, op, 3)?,
    );
    // Channels are found from X (input 2), as the forward op did.
    let (c, inner) = {
        let xs = l.tensor(2)?.shape().to_vec();
        let (c, inner) = match (w.len(), order) {
            (1, _) => (1, 1),
            (_, Order::Nchw) if xs.len() >= 2 => (xs[1], xs[2..].iter().product()),
            (_, Order::Nhwc) if !xs.is_empty() => (xs[xs.len() - 1], 1),
            _ => (0, 1),
        };
        if c != w.len() && w.len() != 1 {
            return Err(Error::shape(format!(
                "{op}: the slope ('{}', {} elements) must have one element or one per channel of X ('{}', shape {xs:?})",
                l.input_name(3),
                w.len(),
                l.input_name(2)
            ))
            .with_blob(l.input_name(3)));
        }
        (c, inner)
    };
    let (dys, xs, ws) = (dense(dy), dense(x), dense(w));
    let zero = T::of(0.0);
    let mut dw = crate::tensor::default_buffer::<f64>(ws.len(), "a kernel buffer")?;
    let dx: Vec<T> = crate::tensor::try_collect(
        xs.iter().zip(dys.iter()).enumerate().map(|(i, (&xv, &d))| {
            if xv > zero {
                d
            } else {
                let ch = channel(i, c, inner);
                dw[ch] += (d * xv).to_f64();
                ws[ch] * d
            }
        }),
        "a kernel buffer",
    )?;
    let dx = array(x.shape(), dx)?;
    let dw = array(
        w.shape(),
        crate::tensor::try_collect(dw.into_iter().map(T::of), "a kernel buffer")?,
    )?;
    l.set_output(0, T::wrap(dx));
    l.set_output(1, T::wrap(dw));
    Ok(())
}

fn build_prelu(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let order = parse_order(ctx)?;
    let grad = ctx.op_type() == "PReluGradient";
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let at = if grad { 1 } else { 0 };
        crate::with_match_dtype!(floats float_dtype(&l, &op, at)?, |T| {
            if grad {
                prelu_grad_t::<T>(&mut l, order)
            } else {
                prelu_t::<T>(&mut l, order)
            }
        }, else other => Err(crate::tensor::unsupported_dtype(other)))?;
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_op_and_gradient_has_a_schema() {
        let names: Vec<&str> = super::schemas().iter().map(|s| s.name).collect();
        for n in [
            "Softmax",
            "SoftmaxGradient",
            "PRelu",
            "PReluGradient",
            "Dropout",
            "DropoutGrad",
        ] {
            assert!(names.contains(&n), "{n}");
        }
    }
}
