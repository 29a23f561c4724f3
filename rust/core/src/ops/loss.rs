//! Losses and metrics (issue 14), with their gradient ops:
//! SoftmaxWithLoss, SpatialSoftmaxWithLoss, LabelCrossEntropy,
//! CrossEntropy, (Weighted)SigmoidCrossEntropyWithLogits, AveragedLoss,
//! SumSqrElements, SquaredL2Distance, L1Distance and Accuracy.
//!
//! Which gradient ops an op's gradient takes (Caffe2's gradient makers) is
//! decided in Python (`ferrocaffe/gradients.py`); the kernels here only
//! compute, in float32 or float64, into new buffers before any output is
//! written.

#![allow(clippy::result_large_err)]

use super::activation::softmax_rows;
use super::kit::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{Element, Tensor};
use ndarray::ArrayD;

pub fn schemas() -> Vec<OpSchema> {
    const SWL_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "scale",
            "float",
            "1",
            "multiplies the loss (and its gradient)"
        ),
        arg!(
            "label_prob",
            "int",
            "0",
            "labels are probability rows (float, like X) rather than class indices (int32)"
        ),
        arg!("axis", "int", "1", "X is flattened to a matrix at this dim"),
        arg!(
            "only_loss",
            "bool",
            "false",
            "accepted and ignored: Caffe2's gradient then wrote dX into P's buffer (a memory trick); the values are the same"
        ),
    ];
    const SXENT_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "log_D_trick",
            "bool",
            "false",
            "GAN trick: the loss of a target t is (2t - 1) * log(sigmoid(x)) (with the sign flipped)"
        ),
        arg!(
            "unjoined_lr_loss",
            "bool",
            "false",
            "the unjoined logistic-regression loss (not with log_D_trick)"
        ),
    ];
    vec![
        OpSchema::new("SoftmaxWithLoss", build_swl)
            .inputs(2, 3)
            .outputs(2, 2)
            .args(SWL_ARGS)
            .doc("Inputs (logits X (N x D), labels (N int32, or N x D probabilities with label_prob), optional weights (N)); outputs (softmax P, the scalar loss: weighted mean of -log P[label], times scale)."),
        OpSchema::new("SoftmaxWithLossGradient", build_swl_grad)
            .inputs(4, 5)
            .outputs(1, 1)
            .args(SWL_ARGS)
            .doc("Gradient of SoftmaxWithLoss: inputs (X, labels[, weights], P, dLoss), output dX."),
        OpSchema::new("SpatialSoftmaxWithLoss", build_spatial_swl)
            .inputs(2, 3)
            .outputs(2, 2)
            .args(&[arg!("scale", "float", "1", "multiplies the loss and so its gradient (Caffe2 scaled the gradient only)")])
            .doc("Inputs (logits X (N x D x H x W), labels (N x H x W int32; -1: a pixel that does not count), optional weights (N x H x W)); outputs (P: the softmax over D at each pixel, the scalar loss: scale times the weighted mean of -log P[label] over the counted pixels, 0 when none count)."),
        OpSchema::new("SpatialSoftmaxWithLossGradient", build_spatial_swl_grad)
            .inputs(4, 5)
            .outputs(1, 1)
            .args(&[arg!("scale", "float", "1", "multiplies the gradient")])
            .doc("Gradient of SpatialSoftmaxWithLoss: inputs (X, labels[, weights], P, dLoss), output dX = (P - onehot(label)) * weight * scale / total weight * dLoss, 0 at pixels labelled -1."),
        OpSchema::new("MakeTwoClass", build_make_two_class)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Y = X's shape + [2] with Y[..., 0] = 1 - X and Y[..., 1] = X, for probabilities X (float32 or float64) of the positive class; each must be in [0, 1]."),
        OpSchema::new("MakeTwoClassGradient", build_make_two_class_grad)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Gradient of MakeTwoClass: input dY (last dim 2), output dX (dY's shape without its last dim) = dY[..., 1] - dY[..., 0]."),
        OpSchema::new("LabelCrossEntropy", build_lce)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Y[i] = -log(X[i, label[i]]) for probabilities X (N x D) and int32 labels (N); X is floored at 1e-20."),
        OpSchema::new("LabelCrossEntropyGradient", build_lce_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("Gradient of LabelCrossEntropy: inputs (X, label, dY), output dX."),
        OpSchema::new("AveragedLoss", build_avg_loss)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("The mean of all elements of X, a 0-dim tensor."),
        OpSchema::new("SumSqrElements", build_sum_sqr)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!("average", "bool", "false", "divide the sum by the number of elements")])
            .infer(|_, ins, _| {
                Ok(vec![crate::shapes::rules::known(ins, 0)
                    .map(|x| crate::operator::ShapeInfo::new(vec![], x.dtype))])
            })
            .doc("The sum of the squares of X's elements (float32 or float64), a 0-dim tensor; with average, their mean (0 for an empty X)."),
        OpSchema::new("AveragedLossGradient", build_avg_loss_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of AveragedLoss: inputs (X, dLoss), dX = dLoss / X.size everywhere."),
        OpSchema::new("SquaredL2Distance", build_l2)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Y[i] = 0.5 * sum((X[i] - Y[i])^2) over each row of X and Y (same shape; rows along dim 0)."),
        OpSchema::new("SquaredL2DistanceGradient", build_l2_grad)
            .inputs(3, 3)
            .outputs(2, 2)
            .doc("Gradient of SquaredL2Distance: inputs (X, Y, dDistance), outputs (dX, dY)."),
        OpSchema::new("Accuracy", build_accuracy)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(&[arg!("top_k", "int", "1", "a row counts as correct when its label is among its top_k scores")])
            .doc("The fraction of rows of the prediction (N x D) whose label (int32, N) is among the top_k scores (ties go to the lower index), a 0-dim float32."),
        OpSchema::new("CrossEntropy", build_xent)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Y[i] = -sum_j label[i, j] * log(max(X[i, j], 1e-20)) for probabilities X (N x D, or D) and soft labels of X's shape in [0, 1]."),
        OpSchema::new("CrossEntropyGradient", build_xent_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("Gradient of CrossEntropy: inputs (X, label, dY), dX = -label * dY / max(X, 1e-20)."),
        OpSchema::new("SigmoidCrossEntropyWithLogits", build_sxent)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(SXENT_ARGS)
            .doc("Y = the mean over the last dim of the binary cross entropy of sigmoid(logits) against targets (same shape); Y drops the last dim."),
        OpSchema::new("SigmoidCrossEntropyWithLogitsGradient", build_sxent)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(SXENT_ARGS)
            .doc("Gradient of SigmoidCrossEntropyWithLogits: inputs (dY, logits, targets), output dlogits."),
        OpSchema::new("WeightedSigmoidCrossEntropyWithLogits", build_sxent)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("SigmoidCrossEntropyWithLogits with a weight per element: inputs (logits, targets, weights), all of one shape; Y = -mean over the last dim of weights * (t log s(x) + (1 - t) log(1 - s(x)))."),
        OpSchema::new("WeightedSigmoidCrossEntropyWithLogitsGradient", build_sxent)
            .inputs(4, 4)
            .outputs(1, 1)
            .doc("Gradient of WeightedSigmoidCrossEntropyWithLogits: inputs (dY, logits, targets, weights), output dlogits."),
        OpSchema::new("L1Distance", build_l1)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Y[i] = sum |X[i] - Y[i]| over each row of X and Y (same shape; rows along dim 0)."),
        OpSchema::new("L1DistanceGradient", build_l1_grad)
            .inputs(3, 3)
            .outputs(2, 2)
            .doc("Gradient of L1Distance: inputs (X, Y, dDistance), outputs (dX = sign(X - Y) * dDistance, dY = -dX); 0 where |X - Y| <= 1e-12."),
    ]
}

/// Input `i` as int32 labels (Caffe2's label type), or a type error.
fn labels<'l>(l: &'l Locked<'_>, op: &str, i: usize) -> Result<&'l ArrayD<i32>> {
    let t = l.tensor(i)?;
    <i32 as Element>::view(t).ok_or_else(|| {
        let name = l.input_name(i);
        Error::type_error(format!(
            "{op}: the label input ('{name}') must be an int32 tensor, got {}",
            t.dtype()
        ))
        .with_blob(name)
    })
}

/// A one-element loss gradient at input `i`, float32 or float64 whatever the
/// other inputs' type: the backward pass seeds it with a float32
/// ConstantFill of ones, also for float64 nets.
fn loss_grad(l: &Locked<'_>, op: &str, i: usize) -> Result<f64> {
    let t = l.tensor(i)?;
    let name = l.input_name(i);
    let v = crate::with_match_dtype!(tensor floats t, |a: T| {
        if a.len() != 1 {
            return Err(Error::shape(format!(
                "{op}: the loss gradient ('{name}', shape {:?}) must have one element",
                t.shape()
            ))
            .with_blob(name));
        }
        a.iter().next().map(|&v| f64::from(v))
    }, else _ => {
        return Err(Error::type_error(format!(
            "{op}: the loss gradient ('{name}') must be a {} tensor, got {}",
            float_types(),
            t.dtype()
        ))
        .with_blob(name))
    });
    Ok(v.unwrap_or(0.0))
}

// ------------------------------------------------------------- losses --

/// Caffe2 floors probabilities at this before taking their log.
const LOG_THRESHOLD: f64 = 1e-20;

/// Checks int32 labels (`n` of them, each in [0, d)) at input `i`: shaped
/// [N] or [N, 1], or, for an op that flattens X at `axis` (SoftmaxWithLoss),
/// as Caffe2 allowed there: `axis` dims holding N values, or X's leading
/// dims (N values in all) followed by dims of size 1.
fn class_labels(
    l: &Locked<'_>,
    op: &str,
    i: usize,
    n: usize,
    d: usize,
    axis: Option<usize>,
) -> Result<Vec<usize>> {
    let lab = labels(l, op, i)?;
    let name = l.input_name(i);
    let shape = lab.shape();
    let ok_shape = match axis {
        None => lab.len() == n && (lab.ndim() == 1 || (lab.ndim() == 2 && shape[1] == 1)),
        Some(ax) if lab.ndim() == ax => lab.len() == n,
        Some(ax) => {
            lab.ndim() > ax
                && shape[..ax].iter().product::<usize>() == n
                && shape[ax..].iter().all(|&s| s == 1)
        }
    };
    if !ok_shape {
        let want = match axis {
            Some(ax) if ax != 1 => {
                format!("{ax} dims holding N values, or those followed by dims of size 1")
            }
            _ => "shape [N] or [N, 1]".to_string(),
        };
        return Err(Error::shape(format!(
            "{op}: the labels ('{name}', shape {shape:?}) must be N = {n} values ({want})"
        ))
        .with_blob(name));
    }
    lab.iter()
        .map(|&v| {
            usize::try_from(v).ok().filter(|&u| u < d).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "{op}: label seems incorrect: label value {v} is outside [0, {d}) (the number of classes)"
                ))
                .with_blob(name)
            })
        })
        .collect()
}

/// Optional per-row weights at input `i` (float32 or float64 like X).
fn row_weights<T: Float>(l: &Locked<'_>, op: &str, i: Option<usize>, n: usize) -> Result<Vec<T>> {
    let Some(i) = i else {
        return crate::tensor::filled_vec(n, T::of(1.0), "a kernel buffer");
    };
    let w = input::<T>(l, op, i)?;
    if w.len() != n {
        return Err(Error::shape(format!(
            "{op}: the weights ('{}', shape {:?}) must be N = {n} values",
            l.input_name(i),
            w.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(crate::tensor::try_to_vec(&dense(w), "a kernel buffer")?)
}

struct SwlSetup<T> {
    n: usize,
    d: usize,
    /// Per row: the target distribution (one-hot for class labels).
    target: Vec<T>,
    weights: Vec<T>,
}

fn swl_setup<T: Float>(
    l: &Locked<'_>,
    op: &str,
    axis: i64,
    label_prob: bool,
    weight_at: Option<usize>,
) -> Result<SwlSetup<T>> {
    let x = input::<T>(l, op, 0)?;
    let ax = canonical_axis(op, "axis", axis, x.ndim(), l.input_name(0))?;
    let (n, d) = split_at(x.shape(), ax);
    let target = if label_prob {
        let p = input::<T>(l, op, 1)?;
        if p.len() != n * d {
            return Err(Error::shape(format!(
                "{op}: with label_prob the labels ('{}', shape {:?}) must be N x D = {n} x {d} probabilities",
                l.input_name(1),
                p.shape()
            ))
            .with_blob(l.input_name(1)));
        }
        crate::tensor::try_to_vec(&dense(p), "a kernel buffer")?
    } else {
        let lab = class_labels(l, op, 1, n, d, Some(ax))?;
        let mut t = crate::tensor::default_buffer::<T>(n * d, "a kernel buffer")?;
        for (r, &c) in lab.iter().enumerate() {
            t[r * d + c] = T::of(1.0);
        }
        t
    };
    let weights = row_weights::<T>(l, op, weight_at, n)?;
    Ok(SwlSetup {
        n,
        d,
        target,
        weights,
    })
}

fn swl_t<T: Float>(
    l: &mut Locked<'_>,
    ni: usize,
    axis: i64,
    label_prob: bool,
    scale: f32,
) -> Result<()> {
    let op = "SoftmaxWithLoss";
    let w_at = (ni == 3).then_some(2);
    let s = swl_setup::<T>(l, op, axis, label_prob, w_at)?;
    let x = input::<T>(l, op, 0)?;
    let shape = x.shape().to_vec();
    let p = softmax_rows(&dense(x), s.d)?;
    let (mut loss, mut total) = (T::of(0.0), T::of(0.0));
    for r in 0..s.n {
        let mut row = T::of(0.0);
        for c in 0..s.d {
            let t = s.target[r * s.d + c];
            if t != T::of(0.0) {
                let pc = p[r * s.d + c];
                let pc = if pc < T::of(LOG_THRESHOLD) {
                    T::of(LOG_THRESHOLD)
                } else {
                    pc
                };
                row += -(t * pc.ln());
            }
        }
        loss += s.weights[r] * row;
        total += s.weights[r];
    }
    let avg = if total > T::of(0.0) {
        loss / total * T::of(f64::from(scale))
    } else {
        T::of(0.0)
    };
    let p = array(&shape, p)?;
    l.set_output(0, T::wrap(p));
    l.set_output(1, T::wrap(array(&[], vec![avg])?));
    Ok(())
}

fn build_swl(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let label_prob = ctx.args.i64("label_prob", 0)? != 0;
    let scale = ctx.args.f32("scale", 1.0)?;
    let ni = ctx.num_inputs();
    float_kernel!("SoftmaxWithLoss", 0, |l| swl_t(
        &mut l, ni, axis, label_prob, scale
    ))
}

fn swl_grad_t<T: Float>(
    l: &mut Locked<'_>,
    ni: usize,
    axis: i64,
    label_prob: bool,
    scale: f32,
) -> Result<()> {
    let op = "SoftmaxWithLossGradient";
    let w_at = (ni == 5).then_some(2);
    let s = swl_setup::<T>(l, op, axis, label_prob, w_at)?;
    same_shape(op, l, 0, ni - 2)?;
    let p = crate::tensor::try_to_vec(&dense(input::<T>(l, op, ni - 2)?), "a kernel buffer")?;
    let dl = T::of(loss_grad(l, op, ni - 1)?);
    let total: T = s.weights.iter().copied().sum();
    let k = if total > T::of(0.0) {
        dl * T::of(f64::from(scale)) / total
    } else {
        T::of(0.0)
    };
    let mut dx = p;
    for r in 0..s.n {
        for c in 0..s.d {
            let i = r * s.d + c;
            // d/dx of -sum(t log softmax(x)) is p * sum(t) - t.
            let tsum: T = s.target[r * s.d..(r + 1) * s.d].iter().copied().sum();
            dx[i] = (dx[i] * tsum - s.target[i]) * s.weights[r] * k;
        }
    }
    let shape = l.tensor(0)?.shape().to_vec();
    l.set_output(0, T::wrap(array(&shape, dx)?));
    Ok(())
}

fn build_swl_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let label_prob = ctx.args.i64("label_prob", 0)? != 0;
    let scale = ctx.args.f32("scale", 1.0)?;
    let ni = ctx.num_inputs();
    float_kernel!("SoftmaxWithLossGradient", 0, |l| swl_grad_t(
        &mut l, ni, axis, label_prob, scale
    ))
}

/// (N, D) of a probability matrix input (2-D, or 1-D as one row).
fn prob_dims(l: &Locked<'_>, op: &str) -> Result<(usize, usize)> {
    let x = l.tensor(0)?.shape();
    match x.len() {
        1 => Ok((1, x[0])),
        2 => Ok((x[0], x[1])),
        _ => Err(Error::shape(format!(
            "{op}: X ('{}', shape {x:?}) must be 1-D or 2-D",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0))),
    }
}

fn floor_p<T: Float>(p: T) -> T {
    if p < T::of(LOG_THRESHOLD) {
        T::of(LOG_THRESHOLD)
    } else {
        p
    }
}

fn lce_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "LabelCrossEntropy";
    let (n, d) = prob_dims(l, op)?;
    let lab = class_labels(l, op, 1, n, d, None)?;
    let x = crate::tensor::try_to_vec(&dense(input::<T>(l, op, 0)?), "a kernel buffer")?;
    let y: Vec<T> = crate::tensor::try_collect(
        lab.iter()
            .enumerate()
            .map(|(r, &c)| -floor_p(x[r * d + c]).ln()),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], y)?));
    Ok(())
}

fn make_two_class_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "MakeTwoClass";
    let x = input::<T>(l, op, 0)?;
    if let Some(bad) = x.iter().find(|&&v| !(v >= T::of(0.0) && v <= T::of(1.0))) {
        return Err(Error::invalid_arg(format!(
            "{op}: the probabilities ('{}') must be in [0, 1], got {bad:?}",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0)));
    }
    let mut shape = x.shape().to_vec();
    shape.push(2);
    crate::tensor::checked_numel::<T>(&shape, "MakeTwoClass's output")?;
    let y: Vec<T> = crate::tensor::try_collect(
        x.iter().flat_map(|&p| [T::of(1.0) - p, p]),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&shape, y)?));
    Ok(())
}

fn build_make_two_class(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("MakeTwoClass", 0, |l| make_two_class_t(&mut l))
}

fn make_two_class_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "MakeTwoClassGradient";
    let dy = input::<T>(l, op, 0)?;
    if dy.shape().last() != Some(&2) {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have a last dim of 2",
            l.input_name(0),
            dy.shape()
        ))
        .with_blob(l.input_name(0)));
    }
    let shape = dy.shape()[..dy.ndim() - 1].to_vec();
    let v = dense(dy);
    let dx: Vec<T> =
        crate::tensor::try_collect(v.chunks_exact(2).map(|c| c[1] - c[0]), "a kernel buffer")?;
    l.set_output(0, T::wrap(array(&shape, dx)?));
    Ok(())
}

fn build_make_two_class_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("MakeTwoClassGradient", 0, |l| make_two_class_grad_t(&mut l))
}

fn build_lce(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("LabelCrossEntropy", 0, |l| lce_t(&mut l))
}

fn lce_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "LabelCrossEntropyGradient";
    let (n, d) = prob_dims(l, op)?;
    let lab = class_labels(l, op, 1, n, d, None)?;
    let dy = input::<T>(l, op, 2)?;
    if dy.len() != n {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have N = {n} values",
            l.input_name(2),
            dy.shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let dy = crate::tensor::try_to_vec(&dense(dy), "a kernel buffer")?;
    let x = input::<T>(l, op, 0)?;
    let xs = dense(x);
    let mut dx = crate::tensor::default_buffer::<T>(n * d, "a kernel buffer")?;
    for (r, &c) in lab.iter().enumerate() {
        dx[r * d + c] = -dy[r] / floor_p(xs[r * d + c]);
    }
    let dx = array(x.shape(), dx)?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_lce_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("LabelCrossEntropyGradient", 0, |l| lce_grad_t(&mut l))
}

fn avg_loss_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let x = input::<T>(l, "AveragedLoss", 0)?;
    let n = x.len();
    let s: T = x.iter().copied().sum();
    let avg = if n == 0 {
        T::of(0.0)
    } else {
        s / T::of(n as f64)
    };
    l.set_output(0, T::wrap(array(&[], vec![avg])?));
    Ok(())
}

fn build_avg_loss(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("AveragedLoss", 0, |l| avg_loss_t(&mut l))
}

fn sum_sqr_t<T: Float>(l: &mut Locked<'_>, average: bool) -> Result<()> {
    let x = input::<T>(l, "SumSqrElements", 0)?;
    let s: T = x.iter().map(|&v| v * v).sum();
    let out = if average && !x.is_empty() {
        s / T::of(x.len() as f64)
    } else {
        s
    };
    l.set_output(0, T::wrap(array(&[], vec![out])?));
    Ok(())
}

fn build_sum_sqr(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let average = ctx.args.i64("average", 0)? != 0;
    float_kernel!("SumSqrElements", 0, |l| sum_sqr_t(&mut l, average))
}

fn avg_loss_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "AveragedLossGradient";
    let x = input::<T>(l, op, 0)?;
    let v = T::of(loss_grad(l, op, 1)?) / T::of(x.len().max(1) as f64);
    let dx = crate::tensor::filled_array(x.shape(), v)?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_avg_loss_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("AveragedLossGradient", 0, |l| avg_loss_grad_t(&mut l))
}

/// Rows of a tensor for the distance ops: dim 0 (one row for a 0-dim one).
fn rows_of(shape: &[usize]) -> usize {
    shape.first().copied().unwrap_or(1)
}

/// A row-wise distance: `out[r] = sum_c term(x[r, c] - y[r, c])`, rows
/// along dim 0 (SquaredL2Distance, L1Distance).
fn distance_t<T: Float>(l: &mut Locked<'_>, op: &str, term: impl Fn(T) -> T) -> Result<()> {
    same_shape(op, l, 0, 1)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let n = rows_of(x.shape());
    let d = x.len().checked_div(n).unwrap_or(0);
    let (xs, ys) = (dense(x), dense(y));
    let out: Vec<T> = crate::tensor::try_collect(
        (0..n).map(|r| (0..d).map(|c| term(xs[r * d + c] - ys[r * d + c])).sum()),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], out)?));
    Ok(())
}

/// The gradient of a row-wise distance: `dX[r, c] = grad(x - y, dD[r])`,
/// `dY = -dX`.
fn distance_grad_t<T: Float>(l: &mut Locked<'_>, op: &str, grad: impl Fn(T, T) -> T) -> Result<()> {
    same_shape(op, l, 0, 1)?;
    let (x, y, dd) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    let n = rows_of(x.shape());
    if dd.len() != n {
        return Err(Error::shape(format!(
            "{op}: the distance gradient ('{}', shape {:?}) must have N = {n} values",
            l.input_name(2),
            dd.shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let d = x.len().checked_div(n).unwrap_or(0);
    let (xs, ys, dds) = (dense(x), dense(y), dense(dd));
    let dx: Vec<T> = crate::tensor::try_collect(
        (0..n * d).map(|i| grad(xs[i] - ys[i], dds[i / d.max(1)])),
        "a kernel buffer",
    )?;
    let dy: Vec<T> = crate::tensor::try_collect(dx.iter().map(|&v| -v), "a kernel buffer")?;
    let shape = x.shape().to_vec();
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(1, T::wrap(array(&shape, dy)?));
    Ok(())
}

fn l2_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    distance_t::<T>(l, "SquaredL2Distance", |v| T::of(0.5) * v * v)
}

fn build_l2(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("SquaredL2Distance", 0, |l| l2_t(&mut l))
}

fn l2_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    distance_grad_t::<T>(l, "SquaredL2DistanceGradient", |v, g| v * g)
}

fn build_l2_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("SquaredL2DistanceGradient", 0, |l| l2_grad_t(&mut l))
}

fn accuracy_t<T: Float>(l: &mut Locked<'_>, top_k: usize) -> Result<()> {
    let op = "Accuracy";
    let x = input::<T>(l, op, 0)?;
    if x.ndim() != 2 {
        return Err(Error::shape(format!(
            "{op}: the prediction ('{}', shape {:?}) must be 2-D (N x D)",
            l.input_name(0),
            x.shape()
        ))
        .with_blob(l.input_name(0)));
    }
    let (n, d) = (x.shape()[0], x.shape()[1]);
    let lab = class_labels(l, op, 1, n, d, None)?;
    let xs = dense(x);
    let correct = lab
        .iter()
        .enumerate()
        .filter(|&(r, &c)| {
            let row = &xs[r * d..(r + 1) * d];
            let v = row[c];
            // Scores above the label's, and equal ones at lower indices.
            let rank = row
                .iter()
                .enumerate()
                .filter(|&(j, &s)| s > v || (s == v && j < c))
                .count();
            rank < top_k
        })
        .count();
    let acc = if n == 0 {
        0.0
    } else {
        correct as f32 / n as f32
    };
    l.set_output(0, Tensor::from(array(&[], vec![acc])?));
    Ok(())
}

fn build_accuracy(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let top_k = ctx.args.i64("top_k", 1)?;
    if top_k < 1 {
        return Err(ctx.bad_arg(format!("top_k must be at least 1, got {top_k}")));
    }
    let top_k = top_k as usize;
    float_kernel!("Accuracy", 0, |l| accuracy_t(&mut l, top_k))
}

// -------------------------------------------------------- CrossEntropy --

fn soft_labels<T: Float>(l: &Locked<'_>, op: &str, n: usize, d: usize) -> Result<Vec<T>> {
    let lab = input::<T>(l, op, 1)?;
    let name = l.input_name(1);
    let ok =
        lab.len() == n * d && (lab.ndim() == 1 && n == 1 || lab.ndim() == 2 && lab.shape()[0] == n);
    if !ok {
        return Err(Error::shape(format!(
            "{op}: the labels ('{name}', shape {:?}) must be N x D = {n} x {d} like X",
            lab.shape()
        ))
        .with_blob(name));
    }
    let v = crate::tensor::try_to_vec(&dense(lab), "a kernel buffer")?;
    if v.iter().any(|&p| !(p >= T::of(0.0) && p <= T::of(1.0))) {
        return Err(Error::invalid_arg(format!(
            "{op}: soft label seems incorrect: label values must be probabilities between 0 and 1 (use LabelCrossEntropy for class indices)"
        ))
        .with_blob(name));
    }
    Ok(v)
}

fn xent_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "CrossEntropy";
    let (n, d) = prob_dims(l, op)?;
    let lab = soft_labels::<T>(l, op, n, d)?;
    let x = crate::tensor::try_to_vec(&dense(input::<T>(l, op, 0)?), "a kernel buffer")?;
    let y: Vec<T> = crate::tensor::try_collect(
        (0..n).map(|r| {
            -(0..d)
                .map(|c| lab[r * d + c] * floor_p(x[r * d + c]).ln())
                .sum::<T>()
        }),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], y)?));
    Ok(())
}

fn build_xent(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("CrossEntropy", 0, |l| xent_t(&mut l))
}

fn xent_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "CrossEntropyGradient";
    let (n, d) = prob_dims(l, op)?;
    let lab = soft_labels::<T>(l, op, n, d)?;
    let dy = input::<T>(l, op, 2)?;
    if dy.len() != n {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have N = {n} values",
            l.input_name(2),
            dy.shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let dy = crate::tensor::try_to_vec(&dense(dy), "a kernel buffer")?;
    let x = input::<T>(l, op, 0)?;
    let xs = dense(x);
    let dx: Vec<T> = crate::tensor::try_collect(
        (0..n * d).map(|i| -(lab[i] * dy[i / d.max(1)]) / floor_p(xs[i])),
        "a kernel buffer",
    )?;
    let dx = array(x.shape(), dx)?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_xent_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("CrossEntropyGradient", 0, |l| xent_grad_t(&mut l))
}

// ------------------------------------------- SigmoidCrossEntropyWithLogits --

#[derive(Clone, Copy)]
enum SxentKind {
    Plain,
    LogDTrick,
    Unjoined,
}

/// log(1 + exp(x)) without overflow.
fn softplus<T: Float>(x: T) -> T {
    let z = T::of(0.0);
    let pos = if x > z { x } else { z };
    let neg_abs = if x > z { -x } else { x };
    pos + (T::of(1.0) + neg_abs.exp()).ln()
}

/// The per-element term whose negated mean is the loss.
fn sxent_term<T: Float>(k: SxentKind, x: T, t: T) -> T {
    let one = T::of(1.0);
    match k {
        // t log s(x) + (1 - t) log(1 - s(x)) = t x - log(1 + e^x)
        SxentKind::Plain => t * x - softplus(x),
        // (2t - 1) log s(x)
        SxentKind::LogDTrick => (T::of(2.0) * t - one) * (x - softplus(x)),
        // t log s(x) + (1 - t) log(1 - s(x)) with the positive part unjoined
        SxentKind::Unjoined => t * x - (one - t) * softplus(x),
    }
}

/// d term / dx.
fn sxent_dterm<T: Float>(k: SxentKind, x: T, t: T) -> T {
    let one = T::of(1.0);
    let s = one / (one + (-x).exp());
    match k {
        SxentKind::Plain => t - s,
        SxentKind::LogDTrick => (T::of(2.0) * t - one) * (one - s),
        SxentKind::Unjoined => t - (one - t) * s,
    }
}

fn sxent_t<T: Float>(l: &mut Locked<'_>, op: &str, k: SxentKind, grad: bool) -> Result<()> {
    let off = usize::from(grad);
    same_shape(op, l, off, off + 1)?;
    let (x, t) = (input::<T>(l, op, off)?, input::<T>(l, op, off + 1)?);
    let shape = x.shape().to_vec();
    let inner = shape.last().copied().unwrap_or(1);
    let outer = x.len().checked_div(inner).unwrap_or(0);
    let (xs, ts) = (dense(x), dense(t));
    // WeightedSigmoidCrossEntropyWithLogits: a weight per element after
    // the targets.
    let ws: Option<Vec<T>> = if op.starts_with("Weighted") {
        same_shape(op, l, off, off + 2)?;
        Some(crate::tensor::try_to_vec(
            &dense(input::<T>(l, op, off + 2)?),
            "a kernel buffer",
        )?)
    } else {
        None
    };
    let w_at = |i: usize| ws.as_ref().map_or(T::of(1.0), |w| w[i]);
    if grad {
        let g = input::<T>(l, op, 0)?;
        if g.len() != outer {
            return Err(Error::shape(format!(
                "{op}: dY ('{}', shape {:?}) must have {outer} values (the logits' shape without its last dim)",
                l.input_name(0),
                g.shape()
            ))
            .with_blob(l.input_name(0)));
        }
        let gs = dense(g);
        let dx: Vec<T> = crate::tensor::try_collect(
            (0..outer * inner).map(|i| {
                let f = -gs[i / inner] / T::of(inner as f64);
                f * sxent_dterm(k, xs[i], ts[i]) * w_at(i)
            }),
            "a kernel buffer",
        )?;
        l.set_output(0, T::wrap(array(&shape, dx)?));
    } else {
        let y: Vec<T> = crate::tensor::try_collect(
            (0..outer).map(|r| {
                let s: T = (0..inner)
                    .map(|c| {
                        let i = r * inner + c;
                        sxent_term(k, xs[i], ts[i]) * w_at(i)
                    })
                    .sum();
                -s / T::of(inner as f64)
            }),
            "a kernel buffer",
        )?;
        let out_shape = &shape[..shape.len().saturating_sub(1)];
        l.set_output(0, T::wrap(array(out_shape, y)?));
    }
    Ok(())
}

fn build_sxent(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    // The weighted op has Caffe2's plain loss only (no such arguments).
    let weighted = ctx.op_type().starts_with("Weighted");
    let log_d = !weighted && ctx.args.bool("log_D_trick", false)?;
    let unjoined = !weighted && ctx.args.bool("unjoined_lr_loss", false)?;
    if log_d && unjoined {
        return Err(
            ctx.bad_arg("log_D_trick and unjoined_lr_loss cannot be set as True simultaneously")
        );
    }
    let k = if log_d {
        SxentKind::LogDTrick
    } else if unjoined {
        SxentKind::Unjoined
    } else {
        SxentKind::Plain
    };
    let op = ctx.op_type().to_string();
    let grad = op.ends_with("Gradient");
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let i = usize::from(grad);
        by_float!(&l, &op, i, sxent_t(&mut l, &op, k, grad))?;
        Ok(true)
    }))
}

// ---------------------------------------------------------- L1Distance --

fn l1_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    distance_t::<T>(l, "L1Distance", |v| if v < T::of(0.0) { -v } else { v })
}

fn build_l1(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("L1Distance", 0, |l| l1_t(&mut l))
}

fn l1_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    // Zero within 1e-12 of a kink, as Caffe2.
    let eps = T::of(1e-12);
    distance_grad_t::<T>(l, "L1DistanceGradient", move |v, g| {
        if v > eps {
            g
        } else if v < -eps {
            -g
        } else {
            T::of(0.0)
        }
    })
}

fn build_l1_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("L1DistanceGradient", 0, |l| l1_grad_t(&mut l))
}

// ---------------------------------------------- SpatialSoftmaxWithLoss --

/// (N, D, H * W) of the logits, with the labels (and weights) checked
/// against N x H x W.
fn spatial_dims(l: &Locked<'_>, op: &str, weights: Option<usize>) -> Result<(usize, usize, usize)> {
    let xs = l.tensor(0)?.shape().to_vec();
    if xs.len() != 4 {
        return Err(Error::shape(format!(
            "{op}: the logits ('{}', shape {xs:?}) must have 4 dims (N, D, H, W)",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0)));
    }
    let want = [xs[0], xs[2], xs[3]];
    for i in std::iter::once(1).chain(weights) {
        let s = l.tensor(i)?.shape();
        if s != want {
            return Err(Error::shape(format!(
                "{op}: input {i} ('{}', shape {s:?}) must have shape {want:?} (N, H, W)",
                l.input_name(i)
            ))
            .with_blob(l.input_name(i)));
        }
    }
    Ok((xs[0], xs[1], xs[2] * xs[3]))
}

/// Each pixel's (label or None for -1, weight), with labels checked.
fn spatial_labels<T: Float>(
    l: &Locked<'_>,
    op: &str,
    d: usize,
    weights: Option<usize>,
) -> Result<Vec<(Option<usize>, T)>> {
    let lab = labels(l, op, 1)?;
    let w: Option<Vec<T>> = match weights {
        Some(i) => Some(crate::tensor::try_to_vec(
            &dense(input::<T>(l, op, i)?),
            "a kernel buffer",
        )?),
        None => None,
    };
    lab.iter()
        .enumerate()
        .map(|(k, &t)| {
            let wt = w.as_ref().map_or(T::of(1.0), |w| w[k]);
            if t == -1 {
                Ok((None, wt))
            } else if t >= 0 && (t as usize) < d {
                Ok((Some(t as usize), wt))
            } else {
                Err(
                    Error::invalid_arg(format!("{op}: label {t} is outside [0, {d}) (and not -1)"))
                        .with_blob(l.input_name(1)),
                )
            }
        })
        .collect()
}

fn spatial_swl_t<T: Float>(l: &mut Locked<'_>, weights: Option<usize>, scale: f64) -> Result<()> {
    const OP: &str = "SpatialSoftmaxWithLoss";
    let (n, d, hw) = spatial_dims(l, OP, weights)?;
    let lab = spatial_labels::<T>(l, OP, d, weights)?;
    let xa = input::<T>(l, OP, 0)?;
    let shape = xa.shape().to_vec();
    let x = dense(xa);
    let mut p = crate::tensor::default_buffer::<T>(x.len(), "a kernel buffer")?;
    let (mut total, mut wsum) = (T::of(0.0), T::of(0.0));
    let floor = T::of(1e-20);
    for i in 0..n {
        for q in 0..hw {
            let at = |c: usize| (i * d + c) * hw + q;
            let m = (0..d).fold(x[at(0)], |m, c| if x[at(c)] > m { x[at(c)] } else { m });
            let mut z = T::of(0.0);
            for c in 0..d {
                p[at(c)] = (x[at(c)] - m).exp();
                z = z + p[at(c)];
            }
            for c in 0..d {
                p[at(c)] = p[at(c)] / z;
            }
            if let (Some(t), wt) = lab[i * hw + q] {
                let pt = if p[at(t)] > floor { p[at(t)] } else { floor };
                wsum += wt;
                total += -pt.ln() * wt;
            }
        }
    }
    let loss = if wsum != T::of(0.0) {
        total / wsum * T::of(scale)
    } else {
        T::of(0.0)
    };
    l.set_output(0, T::wrap(array(&shape, p)?));
    l.set_output(1, T::wrap(array(&[], vec![loss])?));
    Ok(())
}

fn build_spatial_swl(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let weights = (ctx.num_inputs() > 2).then_some(2);
    let scale = ctx.args.f32("scale", 1.0)? as f64;
    float_kernel!("SpatialSoftmaxWithLoss", 0, |l| spatial_swl_t(
        &mut l, weights, scale
    ))
}

fn spatial_swl_grad_t<T: Float>(l: &mut Locked<'_>, ni: usize, scale: f64) -> Result<()> {
    const OP: &str = "SpatialSoftmaxWithLossGradient";
    // Inputs (X, labels[, weights], P, dLoss).
    let weights = (ni > 4).then_some(2);
    let (n, d, hw) = spatial_dims(l, OP, weights)?;
    let lab = spatial_labels::<T>(l, OP, d, weights)?;
    let pa = input::<T>(l, OP, ni - 2)?;
    let shape = l.tensor(0)?.shape().to_vec();
    if pa.shape() != shape.as_slice() {
        return Err(Error::shape(format!(
            "{OP}: P ('{}', shape {:?}) must have the logits' shape {shape:?}",
            l.input_name(ni - 2),
            pa.shape()
        ))
        .with_blob(l.input_name(ni - 2)));
    }
    let g = T::of(loss_grad(l, OP, ni - 1)?);
    let p = dense(pa);
    let wsum = lab
        .iter()
        .filter(|(t, _)| t.is_some())
        .fold(T::of(0.0), |s, &(_, w)| s + w);
    let norm = if wsum > T::of(0.0) {
        T::of(scale) / wsum
    } else {
        T::of(1.0)
    };
    let mut dx = crate::tensor::default_buffer::<T>(p.len(), "a kernel buffer")?;
    for i in 0..n {
        for q in 0..hw {
            if let (Some(t), wt) = lab[i * hw + q] {
                for c in 0..d {
                    let k = (i * d + c) * hw + q;
                    let v = if c == t { p[k] - T::of(1.0) } else { p[k] };
                    dx[k] = v * wt * norm * g;
                }
            }
        }
    }
    l.set_output(0, T::wrap(array(&shape, dx)?));
    Ok(())
}

fn build_spatial_swl_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ni = ctx.num_inputs();
    let scale = ctx.args.f32("scale", 1.0)? as f64;
    float_kernel!("SpatialSoftmaxWithLossGradient", 0, |l| spatial_swl_grad_t(
        &mut l, ni, scale
    ))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::test_util::{f32s, get, i32s, op, run, ws_with};

    #[test]
    fn softmax_with_loss_of_uniform_logits_is_log_of_classes() {
        let ws = ws_with(&[("x", f32s(&[2, 4], &[0.; 8])), ("l", i32s(&[1, 3]))]);
        run(
            &ws,
            op("SoftmaxWithLoss", &["x", "l"], &["p", "loss"], vec![]),
        )
        .unwrap();
        let loss = get(&ws, "loss").scalar_value::<f32>().unwrap();
        assert!((loss - 4f32.ln()).abs() < 1e-6);
        let bad = ws_with(&[("x", f32s(&[1, 2], &[0.; 2])), ("l", i32s(&[2]))]);
        let e = run(
            &bad,
            op("SoftmaxWithLoss", &["x", "l"], &["p", "loss"], vec![]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }
}
