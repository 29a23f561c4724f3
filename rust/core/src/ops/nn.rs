//! Layers, activations, losses and their gradient ops (issue 14): FC,
//! FCTransposed, MatMul, Relu, Sigmoid, Tanh, Softmax, SoftmaxWithLoss,
//! LabelCrossEntropy, AveragedLoss, SquaredL2Distance, Accuracy,
//! StopGradient, LeakyRelu, Exp, Log, Sqrt, Abs, Negative, and the
//! gradients of Add, Sub, Mul and Div; then (`more_schemas`) BatchMatMul,
//! CrossEntropy, (Weighted)SigmoidCrossEntropyWithLogits, L1Distance, Dropout, Pow,
//! Clip and WeightedSumGradient.
//!
//! Which gradient ops an op's gradient takes (Caffe2's gradient makers) is
//! decided in Python (`ferrocaffe/gradients.py`), as Caffe2's Python layer
//! did for its own ops; the kernels here only compute.
//!
//! Every kernel takes float32 or float64 (float64 is what the gradient
//! checks use) and computes into new buffers before it writes any output,
//! so an output that aliases an input (in place) reads the old values and a
//! failed check leaves every output unchanged. Matrix products go through
//! `ops::gemm` (`matrixmultiply`, or a small-product float32 kernel; a
//! large product is split between its caller and the kernel pool, whose
//! size bounds the threads however many plan instances run ops at once,
//! so a GEMM never oversubscribes the cores).

#![allow(clippy::result_large_err)]

use super::kernel;
use super::kit::{
    array, by_float, canonical_axis, dense, float_dtype, float_kernel, float_types, in_place_0_0,
    in_place_0_or_1, in_place_1_0, input, same_shape, split_at,
};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::{Float, Number};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};

/// Strides of a dense row-major `rows x cols` matrix, read transposed or not.
fn strides(rows: usize, cols: usize, transposed: bool) -> (usize, usize) {
    let _ = rows;
    if transposed {
        (1, cols)
    } else {
        (cols, 1)
    }
}

/// C (m x n) = op(A) * op(B), where A is stored `m x k` (or `k x m` when
/// `ta`) and B `k x n` (or `n x k` when `tb`).
fn matmul<T: Float>(
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
) -> Result<Vec<T>> {
    let mut c = crate::tensor::zeroed_vec::<T>(&[m, n], format_args!("a {m} x {n} product"))?;
    matmul_into(ta, tb, m, k, n, a, b, &mut c);
    Ok(c)
}

/// [`matmul`] into `c` (m x n, zeroed).
#[allow(clippy::too_many_arguments)]
fn matmul_into<T: Float>(
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
    a: &[T],
    b: &[T],
    c: &mut [T],
) {
    if m * n == 0 || k == 0 {
        return;
    }
    let sa = if ta {
        strides(k, m, true)
    } else {
        strides(m, k, false)
    };
    let sb = if tb {
        strides(n, k, true)
    } else {
        strides(k, n, false)
    };
    super::gemm::product(true, m, k, n, a, sa, b, sb, T::of(0.0), c, (n, 1));
}

// ------------------------------------------------------------- helpers --

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

/// dA may be written over dC (AddGradient and the like).
fn allow_0_any(i: usize, _o: usize) -> bool {
    i == 0
}

pub fn schemas() -> Vec<OpSchema> {
    const FC_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axis",
            "int",
            "1",
            "X is flattened to a matrix at this dim: (prod of dims before, prod of the rest)"
        ),
        arg!(
            "axis_w",
            "int",
            "1",
            "W is flattened to a matrix at this dim"
        ),
    ];
    const FC_IGNORED: &[crate::operator::ArgDoc] = &[arg!(
        "float16_compute",
        "bool",
        "false",
        "half-precision compute hint (GPU); accepted and ignored"
    )];
    const MATMUL_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axis_a",
            "int",
            "1",
            "A is flattened to a matrix at this dim"
        ),
        arg!(
            "axis_b",
            "int",
            "1",
            "B is flattened to a matrix at this dim"
        ),
        arg!("trans_a", "int", "0", "use A transposed"),
        arg!("trans_b", "int", "0", "use B transposed"),
    ];
    const SOFTMAX_ARGS: &[crate::operator::ArgDoc] = &[arg!(
        "axis",
        "int",
        "1",
        "the input is flattened to a matrix at this dim; softmax runs over each row"
    )];
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
    const LEAKY_ARGS: &[crate::operator::ArgDoc] =
        &[arg!("alpha", "float", "0.01", "the slope for X <= 0")];
    const BCAST: &[crate::operator::ArgDoc] = &[
        arg!("broadcast", "int", "0", "as the forward op's broadcast"),
        arg!(
            "axis",
            "int",
            "A.ndim - B.ndim",
            "as the forward op's axis (legacy broadcasting)"
        ),
        arg!(
            "axis_str",
            "string",
            "\"\"",
            "as the forward op's axis_str (legacy broadcasting)"
        ),
        arg!(
            "order",
            "string",
            "\"NCHW\"",
            "as the forward op's order (legacy broadcasting)"
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
    let binary_grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_binary_grad)
            .inputs(3, 3)
            .outputs(2, 2)
            .inplace(InPlace::Allow(allow_0_any))
            .args(BCAST)
            .doc(doc)
    };
    vec![
        OpSchema::new("FC", build_fc)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("Y = X * W^T + b: X flattened to M x K at `axis`, W (N x K at `axis_w`), b (N); Y has X's dims before `axis`, then N."),
        OpSchema::new("FCTransposed", build_fc)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("FC with W stored transposed (K x N): Y = X * W + b."),
        OpSchema::new("FCGradient", build_fc_grad)
            .inputs(3, 3)
            .outputs(2, 3)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("Gradient of FC: inputs (X, W, dY), outputs (dW, db[, dX])."),
        OpSchema::new("FCTransposedGradient", build_fc_grad)
            .inputs(3, 3)
            .outputs(2, 3)
            .args(FC_ARGS)
            .ignores(FC_IGNORED)
            .doc("Gradient of FCTransposed: inputs (X, W, dY), outputs (dW, db[, dX])."),
        OpSchema::new("MatMul", build_matmul)
            .inputs(2, 3)
            .outputs(1, 1)
            .args(MATMUL_ARGS)
            .doc("Y = op(A) * op(B), A and B flattened to matrices at axis_a and axis_b, op transposing when trans_a / trans_b."),
        unary("Relu", build_relu, "Y = max(X, 0) elementwise."),
        unary_grad("ReluGradient", build_relu_grad, "Gradient of Relu: inputs (Y, dY), dX = dY where Y > 0, else 0."),
        unary("Sigmoid", build_sigmoid, "Y = 1 / (1 + exp(-X)) elementwise."),
        unary_grad("SigmoidGradient", build_sigmoid_grad, "Gradient of Sigmoid: inputs (Y, dY), dX = dY * Y * (1 - Y)."),
        unary("Tanh", build_tanh, "Y = tanh(X) elementwise."),
        unary_grad("TanhGradient", build_tanh_grad, "Gradient of Tanh: inputs (Y, dY), dX = dY * (1 - Y^2)."),
        unary("Softmax", build_softmax, "Softmax over each row of X flattened to a matrix at `axis`.").args(SOFTMAX_ARGS),
        unary_grad("SoftmaxGradient", build_softmax_grad, "Gradient of Softmax: inputs (Y, dY), dX = Y * (dY - rowsum(dY * Y)).").args(SOFTMAX_ARGS),
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
        unary("StopGradient", build_stop_gradient, "Y = X; the backward pass stops here."),
        unary("Exp", build_exp, "Y = exp(X) elementwise."),
        unary("Log", build_log, "Y = ln(X) elementwise (IEEE: ln 0 = -inf, ln of a negative is NaN)."),
        unary("Sqrt", build_sqrt, "Y = sqrt(X) elementwise (IEEE: NaN for negatives)."),
        unary("Negative", build_negative, "Y = -X elementwise."),
        unary("Abs", build_abs, "Y = |X| elementwise."),
        OpSchema::new("AbsGradient", build_abs_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_1_0))
            .doc("Gradient of Abs: inputs (X, dY), dX = sign(X) * dY."),
        unary("LeakyRelu", build_leaky_relu, "Y = X where X > 0, else alpha * X.")
            .args(LEAKY_ARGS),
        unary_grad("LeakyReluGradient", build_leaky_relu, "Gradient of LeakyRelu: inputs (Y, dY), dX = dY where Y > 0, else alpha * dY.")
            .args(LEAKY_ARGS),
        binary_grad("AddGradient", "Gradient of Add: inputs (dC, A, B), outputs (dA, dB), each summed over the dims it was broadcast along."),
        binary_grad("SubGradient", "Gradient of Sub: inputs (dC, A, B), outputs (dA, dB = -dC summed)."),
        binary_grad("MulGradient", "Gradient of Mul: inputs (dC, A, B), outputs (dA = dC * B, dB = dC * A), summed over broadcast dims."),
        binary_grad("DivGradient", "Gradient of Div: inputs (dC, A, B, C) (C = A / B, the forward output), outputs (dA = dC / B, dB = -dC * C / B), summed over broadcast dims; also Caffe2's legacy three inputs (B, C, dC).")
            .inputs(3, 4),
    ]
}

// ------------------------------------------------------------------ FC --

struct FcDims {
    m: usize,
    k: usize,
    n: usize,
    y_shape: Vec<usize>,
}

fn fc_dims(l: &Locked<'_>, op: &str, axis: i64, axis_w: i64, transposed: bool) -> Result<FcDims> {
    let (x, w) = (l.tensor(0)?.shape(), l.tensor(1)?.shape());
    let ax = canonical_axis(op, "axis", axis, x.len(), l.input_name(0))?;
    let aw = canonical_axis(op, "axis_w", axis_w, w.len(), l.input_name(1))?;
    let (m, k) = split_at(x, ax);
    let (w0, w1) = split_at(w, aw);
    let (kw, n) = if transposed { (w0, w1) } else { (w1, w0) };
    if k != kw {
        return Err(Error::shape(format!(
            "{op}: dimension mismatch: X ('{}') {x:?} flattened at axis {ax} is {m} x {k}, W ('{}') {w:?} flattened at axis_w {aw} has K = {kw}",
            l.input_name(0),
            l.input_name(1)
        ))
        .with_blob(l.input_name(1)));
    }
    let mut y_shape = x[..ax].to_vec();
    y_shape.push(n);
    Ok(FcDims { m, k, n, y_shape })
}

fn fc_t<T: Float>(l: &mut Locked<'_>, op: &str, axis: i64, axis_w: i64, tr: bool) -> Result<()> {
    let d = fc_dims(l, op, axis, axis_w, tr)?;
    let (x, w, b) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    if b.len() != d.n {
        return Err(Error::shape(format!(
            "{op}: the bias ('{}', shape {:?}) must have N = {} elements",
            l.input_name(2),
            b.shape(),
            d.n
        ))
        .with_blob(l.input_name(2)));
    }
    let mut y = matmul(false, !tr, d.m, d.k, d.n, &dense(x), &dense(w))?;
    let b = dense(b);
    for row in y.chunks_mut(d.n.max(1)) {
        for (v, &bi) in row.iter_mut().zip(b.iter()) {
            *v += bi;
        }
    }
    let y = array(&d.y_shape, y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

fn build_fc(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let axis_w = ctx.args.i64("axis_w", 1)?;
    let tr = ctx.op_type() == "FCTransposed";
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| fc_t(&mut l, &op, axis, axis_w, tr))
}

fn fc_grad_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    axis: i64,
    axis_w: i64,
    tr: bool,
    want_dx: bool,
) -> Result<()> {
    let d = fc_dims(l, op, axis, axis_w, tr)?;
    let (x, w, dy) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    if Some(dy.len()) != d.m.checked_mul(d.n) {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have M x N = {} x {} elements",
            l.input_name(2),
            dy.shape(),
            d.m,
            d.n
        ))
        .with_blob(l.input_name(2)));
    }
    let (xs, ws, dys) = (dense(x), dense(w), dense(dy));
    // FC: dW (N x K) = dY^T X; FCTransposed: dW (K x N) = X^T dY.
    let dw = if tr {
        matmul(true, false, d.k, d.m, d.n, &xs, &dys)?
    } else {
        matmul(true, false, d.n, d.m, d.k, &dys, &xs)?
    };
    let mut db = crate::tensor::default_buffer::<T>(d.n, "FC's bias gradient")?;
    for row in dys.chunks(d.n.max(1)) {
        for (s, &v) in db.iter_mut().zip(row) {
            *s = *s + v;
        }
    }
    // FC: dX (M x K) = dY W; FCTransposed: dX = dY W^T.
    let dx = want_dx
        .then(|| matmul(false, tr, d.m, d.n, d.k, &dys, &ws))
        .transpose()?;
    let dw = array(w.shape(), dw)?;
    let db = array(&[d.n], db)?;
    let dx = dx.map(|v| array(x.shape(), v)).transpose()?;
    l.set_output(0, T::wrap(dw));
    l.set_output(1, T::wrap(db));
    if let Some(dx) = dx {
        l.set_output(2, T::wrap(dx));
    }
    Ok(())
}

fn build_fc_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let axis_w = ctx.args.i64("axis_w", 1)?;
    let tr = ctx.op_type() == "FCTransposedGradient";
    let want_dx = ctx.num_outputs() == 3;
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| fc_grad_t(
        &mut l, &op, axis, axis_w, tr, want_dx
    ))
}

// -------------------------------------------------------------- MatMul --

fn matmul_t<T: Float>(
    l: &mut Locked<'_>,
    ax: (i64, i64),
    ta: bool,
    tb: bool,
    ni: usize,
) -> Result<()> {
    let op = "MatMul";
    let (a, b) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let aa = canonical_axis(op, "axis_a", ax.0, a.ndim(), l.input_name(0))?;
    let ab = canonical_axis(op, "axis_b", ax.1, b.ndim(), l.input_name(1))?;
    let (a0, a1) = split_at(a.shape(), aa);
    let (b0, b1) = split_at(b.shape(), ab);
    let (m, k) = if ta { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if tb { (b1, b0) } else { (b0, b1) };
    if k != kb {
        return Err(Error::shape(format!(
            "MatMul: dimension mismatch: trans_a: {}, trans_b: {}, A ('{}') {:?} is used as {m} x {k}, B ('{}') {:?} as {kb} x {n}",
            ta as i32,
            tb as i32,
            l.input_name(0),
            a.shape(),
            l.input_name(1),
            b.shape()
        ))
        .with_blob(l.input_name(1)));
    }
    let y = matmul(ta, tb, m, k, n, &dense(a), &dense(b))?;
    // A third input (the gradient ops' use) gives the output its shape.
    let shape = match ni {
        3 => {
            let like = l.tensor(2)?.shape().to_vec();
            if like.iter().product::<usize>() != y.len() {
                return Err(Error::shape(format!(
                    "MatMul: the product is {m} x {n}, which cannot take the shape {like:?} of '{}'",
                    l.input_name(2)
                ))
                .with_blob(l.input_name(2)));
            }
            like
        }
        _ => vec![m, n],
    };
    let y = array(&shape, y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

fn build_matmul(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ax = (ctx.args.i64("axis_a", 1)?, ctx.args.i64("axis_b", 1)?);
    let ta = ctx.args.i64("trans_a", 0)? != 0;
    let tb = ctx.args.i64("trans_b", 0)? != 0;
    let ni = ctx.num_inputs();
    float_kernel!("MatMul", 0, |l| matmul_t(&mut l, ax, ta, tb, ni))
}

// --------------------------------------------------------- activations --

/// Y = f(X) elementwise.
fn map_t<T: Float>(l: &mut Locked<'_>, f: impl Fn(T) -> T) -> Result<()> {
    let y = l.tensor(0)?;
    let x = T::view(y).ok_or_else(|| Error::internal("dtype checked"))?;
    let y = crate::tensor::map_array(x.view(), |&v| f(v))?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

/// dX = g(Y, dY) elementwise, inputs (Y, dY).
fn grad_map_t<T: Float>(l: &mut Locked<'_>, op: &str, g: impl Fn(T, T) -> T) -> Result<()> {
    same_shape(op, l, 0, 1)?;
    let (y, dy) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let dx = crate::tensor::zip_map_array(y.view(), dy.view(), |&y, &d| g(y, d))?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

/// `fn $build`: a kernel computing Y = f(X) elementwise.
macro_rules! unary {
    ($build:ident, $name:expr, |$x:ident| $f:expr) => {
        fn $build(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
            fn f32_(v: f32) -> f32 {
                let $x = v;
                $f
            }
            fn f64_(v: f64) -> f64 {
                let $x = v;
                $f
            }
            Ok(kernel(|cx| {
                let mut l = cx.lock();
                match float_dtype(&l, $name, 0)? {
                    DataType::Float => map_t::<f32>(&mut l, f32_),
                    _ => map_t::<f64>(&mut l, f64_),
                }?;
                Ok(true)
            }))
        }
    };
}

/// `fn $build_grad`: a kernel computing dX = g(V, dY) elementwise from
/// inputs (V, dY), V being the forward op's output or input.
macro_rules! unary_grad {
    ($build_grad:ident, $name:expr, |$y:ident, $d:ident| $g:expr) => {
        fn $build_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
            fn g32(a: f32, b: f32) -> f32 {
                let ($y, $d) = (a, b);
                $g
            }
            fn g64(a: f64, b: f64) -> f64 {
                let ($y, $d) = (a, b);
                $g
            }
            const OP: &str = concat!($name, "Gradient");
            Ok(kernel(|cx| {
                let mut l = cx.lock();
                match float_dtype(&l, OP, 0)? {
                    DataType::Float => grad_map_t::<f32>(&mut l, OP, g32),
                    _ => grad_map_t::<f64>(&mut l, OP, g64),
                }?;
                Ok(true)
            }))
        }
    };
}

macro_rules! activation {
    ($build:ident, $build_grad:ident, $name:expr, |$x:ident| $f:expr, |$y:ident, $d:ident| $g:expr) => {
        unary!($build, $name, |$x| $f);
        unary_grad!($build_grad, $name, |$y, $d| $g);
    };
}

activation!(
    build_relu,
    build_relu_grad,
    "Relu",
    |x| if x > 0.0 { x } else { 0.0 },
    |y, d| if y > 0.0 { d } else { 0.0 }
);
activation!(
    build_sigmoid,
    build_sigmoid_grad,
    "Sigmoid",
    |x| 1.0 / (1.0 + (-x).exp()),
    |y, d| d * y * (1.0 - y)
);
activation!(build_tanh, build_tanh_grad, "Tanh", |x| x.tanh(), |y, d| d
    * (1.0 - y * y));

// Math ops. Exp's, Log's, Sqrt's and Negative's gradients are made of
// other ops (gradients.py), as Caffe2's were; Abs reads its input.
unary!(build_exp, "Exp", |x| x.exp());
unary!(build_log, "Log", |x| x.ln());
unary!(build_sqrt, "Sqrt", |x| x.sqrt());
unary!(build_negative, "Negative", |x| -x);
activation!(
    build_abs,
    build_abs_grad,
    "Abs",
    |x| x.abs(),
    |x, d| if x > 0.0 {
        d
    } else if x < 0.0 {
        -d
    } else {
        0.0
    }
);

fn build_leaky_relu(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let alpha = ctx.args.f32("alpha", 0.01)?;
    let grad = ctx.op_type() == "LeakyReluGradient";
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        crate::with_match_dtype!(floats float_dtype(&l, &op, 0)?, |T| {
            let (a, zero) = (T::of(f64::from(alpha)), T::of(0.0));
            if grad {
                grad_map_t::<T>(&mut l, &op, |y, d| if y > zero { d } else { a * d })
            } else {
                map_t::<T>(&mut l, |x| if x > zero { x } else { a * x })
            }
        }, else other => Err(crate::tensor::unsupported_dtype(other)))?;
        Ok(true)
    }))
}

fn build_stop_gradient(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        if !l.aliases(0, 0) {
            let t = l.tensor(0)?.try_clone()?;
            l.set_output(0, t);
        }
        Ok(true)
    }))
}

// ------------------------------------------------------------- Softmax --

/// Softmax of each `d`-long row, stable (the row max is subtracted).
fn softmax_rows<T: Float>(x: &[T], d: usize) -> Result<Vec<T>> {
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

fn l2_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "SquaredL2Distance";
    same_shape(op, l, 0, 1)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let n = rows_of(x.shape());
    let d = if n == 0 { 0 } else { x.len() / n };
    let (xs, ys) = (dense(x), dense(y));
    let out: Vec<T> = crate::tensor::try_collect(
        (0..n).map(|r| {
            let s: T = (0..d)
                .map(|c| {
                    let v = xs[r * d + c] - ys[r * d + c];
                    v * v
                })
                .sum();
            s * T::of(0.5)
        }),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], out)?));
    Ok(())
}

fn build_l2(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("SquaredL2Distance", 0, |l| l2_t(&mut l))
}

fn l2_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "SquaredL2DistanceGradient";
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
    let d = if n == 0 { 0 } else { x.len() / n };
    let (xs, ys, dds) = (dense(x), dense(y), dense(dd));
    let dx: Vec<T> = crate::tensor::try_collect(
        (0..n * d).map(|i| (xs[i] - ys[i]) * dds[i / d.max(1)]),
        "a kernel buffer",
    )?;
    let dy: Vec<T> = crate::tensor::try_collect(dx.iter().map(|&v| -v), "a kernel buffer")?;
    let shape = x.shape().to_vec();
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(1, T::wrap(array(&shape, dy)?));
    Ok(())
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

// --------------------------------------------- elementwise gradients --

/// `shape` padded with 1s to `ndim` dims, its dims starting at `offset`.
fn padded(shape: &[usize], ndim: usize, offset: usize) -> Vec<usize> {
    let mut p = vec![1; ndim];
    p[offset..offset + shape.len()].copy_from_slice(shape);
    p
}

/// `g` (of the output's shape) summed over the dims `pad` (an input's
/// shape, padded) was broadcast along, reshaped to `shape`.
fn reduce_to<T: Float>(g: ArrayD<T>, pad: &[usize], shape: &[usize]) -> Result<ArrayD<T>> {
    let mut g = g;
    for ax in (0..pad.len()).rev() {
        if pad[ax] == 1 && g.shape()[ax] != 1 {
            g = crate::tensor::fold_axis_array(g.view(), ax, T::of(0.0), |&s, &v| s + v)?;
        }
    }
    let v: Vec<T> = crate::tensor::try_collect(g.iter().copied(), "a kernel buffer")?;
    array(shape, v)
}

fn binary_grad_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    legacy: bool,
    axis: Option<usize>,
    num_inputs: usize,
) -> Result<()> {
    // DivGradient's dB is -dC * C / B from the forward output C = A / B
    // (Caffe2's), which stays right after an in-place Div overwrote A: its
    // inputs are (dC, A, B, C), or Caffe2's legacy three (B, C, dC), where
    // C (A's shape) stands in for A.
    let legacy_div = op == "DivGradient" && num_inputs == 3;
    let (ic, ia, ib) = if legacy_div { (2, 1, 0) } else { (0, 1, 2) };
    let (dc, a, b) = (
        input::<T>(l, op, ic)?,
        input::<T>(l, op, ia)?,
        input::<T>(l, op, ib)?,
    );
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    let (a_role, c_name) = if legacy_div { ("C", ia) } else { ("A", ia) };
    let mismatch = || {
        Error::shape(format!(
            "{op}: {a_role} ('{}', shape {sa:?}), B ('{}', shape {sb:?}) and dC ('{}', shape {:?}) do not broadcast as the forward op did",
            l.input_name(c_name),
            l.input_name(ib),
            l.input_name(ic),
            dc.shape()
        ))
        .with_blob(l.input_name(ic))
    };
    // The padded shapes of A and B, and the output's shape.
    let (pa, pb) = if legacy && sb.iter().product::<usize>() == 1 {
        // One element broadcasts whatever its dims (as the forward op).
        (sa.clone(), vec![1; sa.len()])
    } else if legacy {
        let off = axis.or_else(|| sa.len().checked_sub(sb.len()));
        let off = off
            .filter(|&o| o + sb.len() <= sa.len())
            .ok_or_else(mismatch)?;
        (sa.clone(), padded(&sb, sa.len(), off))
    } else {
        let nd = sa.len().max(sb.len());
        (
            padded(&sa, nd, nd - sa.len()),
            padded(&sb, nd, nd - sb.len()),
        )
    };
    let mut sc = Vec::with_capacity(pa.len());
    for (&x, &y) in pa.iter().zip(&pb) {
        sc.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(mismatch()),
        });
    }
    if dc.shape() != sc.as_slice() {
        return Err(mismatch());
    }
    let c = if op != "DivGradient" {
        None
    } else if legacy_div {
        Some(a)
    } else {
        let c = input::<T>(l, op, 3)?;
        if c.shape() != sc.as_slice() {
            return Err(Error::shape(format!(
                "{op}: C ('{}', shape {:?}) must have the forward output's shape {sc:?}",
                l.input_name(3),
                c.shape()
            ))
            .with_blob(l.input_name(3)));
        }
        Some(c)
    };
    let kind = match op {
        "AddGradient" => GradKind::Add,
        "SubGradient" => GradKind::Sub,
        "DivGradient" => GradKind::Div,
        _ => GradKind::Mul,
    };
    let (da, db) = broadcast_grads(
        kind,
        &dense(dc),
        (&dense(a), &pa),
        (&dense(b), &pb),
        c.map(dense).as_deref(),
        &sc,
    )?;
    l.set_output(0, T::wrap(array(&sa, da)?));
    l.set_output(1, T::wrap(array(&sb, db)?));
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum GradKind {
    Add,
    Sub,
    Mul,
    Div,
}

/// The gradients (dA, dB) of C = A op B (A and B broadcast to C's shape
/// `sc` from their padded shapes), each summed over the dims its input was
/// broadcast along, in one row-major pass over dC into two buffers of the
/// inputs' sizes (no output-sized intermediate). `c` is the forward
/// output, for Div.
fn broadcast_grads<T: Float>(
    kind: GradKind,
    dc: &[T],
    (a, pa): (&[T], &[usize]),
    (b, pb): (&[T], &[usize]),
    c: Option<&[T]>,
    sc: &[usize],
) -> Result<(Vec<T>, Vec<T>)> {
    let mut da = crate::tensor::default_buffer::<T>(a.len(), "the gradient dA")?;
    let mut db = crate::tensor::default_buffer::<T>(b.len(), "the gradient dB")?;
    // Row-major strides of A and B over C's dims, 0 where broadcast.
    let strides = |p: &[usize]| {
        let mut st = vec![0; p.len()];
        let mut acc = 1;
        for k in (0..p.len()).rev() {
            st[k] = if p[k] == 1 { 0 } else { acc };
            acc *= p[k];
        }
        st
    };
    let (sta, stb) = (strides(pa), strides(pb));
    let nd = sc.len();
    let mut idx = vec![0usize; nd];
    let (mut oa, mut ob) = (0usize, 0usize);
    for (i, &g) in dc.iter().enumerate() {
        match kind {
            GradKind::Add => {
                da[oa] += g;
                db[ob] += g;
            }
            GradKind::Sub => {
                da[oa] += g;
                db[ob] += -g;
            }
            GradKind::Mul => {
                da[oa] += g * b[ob];
                db[ob] += g * a[oa];
            }
            GradKind::Div => {
                let y = b[ob];
                let cv = c.map_or(T::of(0.0), |c| c[i]);
                da[oa] += g / y;
                db[ob] += -(g * cv) / y;
            }
        }
        // Next index, row-major.
        for k in (0..nd).rev() {
            idx[k] += 1;
            oa += sta[k];
            ob += stb[k];
            if idx[k] < sc[k] {
                break;
            }
            oa -= sta[k] * idx[k];
            ob -= stb[k] * idx[k];
            idx[k] = 0;
        }
    }
    Ok((da, db))
}

fn build_binary_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let legacy = ctx.args.i64("broadcast", 0)? != 0;
    // The forward op's axis, axis_str and order, read as it read them.
    let axis = if legacy {
        super::elementwise::legacy_axis(ctx)?
    } else {
        None
    };
    let op = ctx.op_type().to_string();
    let ni = ctx.num_inputs();
    float_kernel!(&op, 0, |l| binary_grad_t(&mut l, &op, legacy, axis, ni))
}

// ====================================================================
// The second slice of issue 14: BatchMatMul, CrossEntropy,
// SigmoidCrossEntropyWithLogits, L1Distance, Dropout, Pow, Clip and
// WeightedSumGradient (registered by `more_schemas`).

pub fn more_schemas() -> Vec<OpSchema> {
    const BMM_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("trans_a", "int", "0", "transpose the last two dims of A"),
        arg!("trans_b", "int", "0", "transpose the last two dims of B"),
        arg!(
            "broadcast",
            "int",
            "0",
            "numpy.matmul broadcasting of the batch dims (and 1-D inputs)"
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
    const POW_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "exponent",
            "float",
            "(none)",
            "the exponent, when there is no second input"
        ),
        arg!(
            "broadcast",
            "int",
            "0",
            "non-zero: Caffe2's legacy broadcast: the exponent input's shape is a run of X's dims (from axis), each equal or 1"
        ),
        arg!(
            "axis",
            "int",
            "-1",
            "with broadcast: the X dim the exponent's first dim lines up with (-1: its last dims line up with X's)"
        ),
    ];
    const CLIP_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("min", "float", "lowest float", "the lower bound"),
        arg!("max", "float", "largest float", "the upper bound"),
    ];
    vec![
        OpSchema::new("BatchMatMul", build_batch_matmul)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(BMM_ARGS)
            .doc("Y[i] = op(A[i]) * op(B[i]) over the batch dims (all but the last two; equal in A and B unless broadcast, which follows numpy.matmul)."),
        OpSchema::new("BatchMatMulGradient", build_batch_matmul_grad)
            .inputs(3, 3)
            .outputs(2, 2)
            .args(BMM_ARGS)
            .doc("Gradient of BatchMatMul with broadcast (not in Caffe2, whose maker refused broadcast=1): inputs (A, B, dY), outputs (dA, dB): each batch's products, summed over the batch dims A (B) was broadcast along; a 1-D operand as BatchMatMul takes it."),
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
        OpSchema::new("Pow", build_pow)
            .inputs(1, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_or_1))
            .args(POW_ARGS)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = X ^ exponent elementwise: the exponent argument, or a second input (one element, X's shape, or with broadcast=1 a run of X's dims from axis)."),
        OpSchema::new("PowGradient", build_pow_grad)
            .inputs(2, 4)
            .outputs(1, 2)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(POW_ARGS)
            .doc("Gradient of Pow: with the exponent argument, inputs (dY, X, Y) (or (dY, Y) after an in-place Pow), output dX = exponent * X^(exponent - 1) * dY; with an exponent input, inputs (dY, X, E, Y), outputs (dX, dE = dY * Y * ln X, summed over the dims E was broadcast along)."),
        OpSchema::new("Clip", build_clip)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(CLIP_ARGS)
            .doc("Y = min(max(X, min), max) elementwise."),
        OpSchema::new("ClipGradient", build_clip_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_1_0))
            .args(CLIP_ARGS)
            .doc("Gradient of Clip: inputs (Y, dY), dX = dY where min < Y < max, else 0."),
        OpSchema::new("WeightedSumGradient", build_weighted_sum_grad)
            .inputs(3, crate::operator::MANY)
            .outputs(1, crate::operator::MANY)
            .args(&[arg!("grad_on_w", "bool", "false", "also output the weights' gradients")])
            .doc("Gradient of WeightedSum: inputs (dY, X0, w0, X1, w1, ...), outputs (dX0, dX1, ...[, dw0, dw1, ...]): dXi = wi * dY (Xi's shape), dwi = sum(dY * Xi) (float32)."),
    ]
}

// --------------------------------------------------------- BatchMatMul --

/// Numpy-style broadcast of two batch shapes, or None.
fn broadcast_batch(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let nd = a.len().max(b.len());
    let pa = padded(a, nd, nd - a.len());
    let pb = padded(b, nd, nd - b.len());
    pa.iter()
        .zip(&pb)
        .map(|(&x, &y)| match (x, y) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The flat offset, in a batch of shape `shape` (padded to `out`'s rank),
/// of the batch index `idx` of the broadcast batch `out`.
fn batch_offset(idx: usize, out: &[usize], shape: &[usize]) -> usize {
    let pad = padded(shape, out.len(), out.len() - shape.len());
    let (mut rem, mut off, mut stride) = (idx, 0, 1);
    for d in (0..out.len()).rev() {
        let i = rem % out[d].max(1);
        rem /= out[d].max(1);
        if pad[d] != 1 {
            off += i * stride;
        }
        stride *= pad[d];
    }
    off
}

/// BatchMatMul's operands seen as batches of matrices: a 1-D operand (with
/// broadcast) is a matrix of one row (A) or one column (B), never
/// transposed (numpy's rule); `batch` is the broadcast batch.
struct BmmDims {
    a_vec: bool,
    b_vec: bool,
    ta: bool,
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
    ba: Vec<usize>,
    bb: Vec<usize>,
    batch: Vec<usize>,
}

impl BmmDims {
    fn of(
        l: &Locked<'_>,
        op: &str,
        (a, b): (&[usize], &[usize]),
        ta: bool,
        tb: bool,
        bcast: bool,
    ) -> Result<Self> {
        let (mut sa, mut sb) = (a.to_vec(), b.to_vec());
        let mismatch = |why: &str| {
            Error::shape(format!(
                "{op}: {why}: A ('{}') {a:?}, B ('{}') {b:?}, trans_a {}, trans_b {}",
                l.input_name(0),
                l.input_name(1),
                ta as i32,
                tb as i32
            ))
            .with_blob(l.input_name(1))
        };
        let (a_vec, b_vec) = (bcast && sa.len() == 1, bcast && sb.len() == 1);
        if a_vec {
            sa.insert(0, 1);
        }
        if b_vec {
            sb.push(1);
        }
        if sa.len() < 2 || sb.len() < 2 {
            return Err(mismatch("A and B need at least 2 dims (1 with broadcast)"));
        }
        if !bcast && (sa.len() != sb.len() || sa[..sa.len() - 2] != sb[..sb.len() - 2]) {
            return Err(mismatch(
                "the batch dims differ (broadcast=1 broadcasts them)",
            ));
        }
        let (ra, ca) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (rb, cb) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        // With a 1-D input the vector is never transposed (numpy's rule).
        let (ta, tb) = (ta && !a_vec, tb && !b_vec);
        let (m, k) = if ta { (ca, ra) } else { (ra, ca) };
        let (kb, n) = if tb { (cb, rb) } else { (rb, cb) };
        if k != kb {
            return Err(mismatch("dimension mismatch"));
        }
        let (ba, bb) = (sa[..sa.len() - 2].to_vec(), sb[..sb.len() - 2].to_vec());
        let batch =
            broadcast_batch(&ba, &bb).ok_or_else(|| mismatch("the batch dims do not broadcast"))?;
        let nb: usize = batch.iter().product();
        nb.checked_mul(m)
            .and_then(|v| v.checked_mul(n))
            .and_then(|v| v.checked_mul(k.max(1)))
            .ok_or_else(|| mismatch("the products would have too many elements"))?;
        Ok(BmmDims {
            a_vec,
            b_vec,
            ta,
            tb,
            m,
            k,
            n,
            ba,
            bb,
            batch,
        })
    }

    /// The output's shape: the batch, then m and n (each left out for a
    /// 1-D operand).
    fn out_shape(&self) -> Vec<usize> {
        let mut shape = self.batch.clone();
        if !self.a_vec {
            shape.push(self.m);
        }
        if !self.b_vec {
            shape.push(self.n);
        }
        shape
    }
}

fn batch_matmul_t<T: Float>(l: &mut Locked<'_>, ta: bool, tb: bool, bcast: bool) -> Result<()> {
    let op = "BatchMatMul";
    let (a, b) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let d = BmmDims::of(l, op, (a.shape(), b.shape()), ta, tb, bcast)?;
    let (m, k, n) = (d.m, d.k, d.n);
    let total = crate::tensor::checked_numel::<T>(&d.out_shape(), format_args!("{op}'s output"))?;
    let nb: usize = d.batch.iter().product();
    let (ad, bd) = (dense(a), dense(b));
    let mut y = crate::tensor::default_buffer::<T>(total, format!("{op}'s output"))?;
    if m * n > 0 {
        for (i, c) in y.chunks_mut(m * n).enumerate().take(nb) {
            let oa = batch_offset(i, &d.batch, &d.ba) * m * k;
            let ob = batch_offset(i, &d.batch, &d.bb) * k * n;
            matmul_into(
                d.ta,
                d.tb,
                m,
                k,
                n,
                &ad[oa..oa + m * k],
                &bd[ob..ob + k * n],
                c,
            );
        }
    }
    l.set_output(0, T::wrap(array(&d.out_shape(), y)?));
    Ok(())
}

/// BatchMatMulGradient (inputs A, B, dY; outputs dA, dB): each batch's
/// products, summed into the batch of A (of B) it was broadcast from.
fn batch_matmul_grad_t<T: Float>(
    l: &mut Locked<'_>,
    ta: bool,
    tb: bool,
    bcast: bool,
) -> Result<()> {
    let op = "BatchMatMulGradient";
    let (a, b, dy) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    let d = BmmDims::of(l, op, (a.shape(), b.shape()), ta, tb, bcast)?;
    let (m, k, n) = (d.m, d.k, d.n);
    if dy.shape() != d.out_shape().as_slice() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}') has shape {:?}, but BatchMatMul's output has shape {:?}",
            l.input_name(2),
            dy.shape(),
            d.out_shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let nb: usize = d.batch.iter().product();
    let (ad, bd, gd) = (dense(a), dense(b), dense(dy));
    let mut da = crate::tensor::default_buffer::<T>(a.len(), format!("{op}'s dA"))?;
    let mut db = crate::tensor::default_buffer::<T>(b.len(), format!("{op}'s dB"))?;
    for i in 0..nb {
        let oa = batch_offset(i, &d.batch, &d.ba) * m * k;
        let ob = batch_offset(i, &d.batch, &d.bb) * k * n;
        let (ai, bi, gi) = (
            &ad[oa..oa + m * k],
            &bd[ob..ob + k * n],
            &gd[i * m * n..(i + 1) * m * n],
        );
        // Y = op(A) op(B): d op(A) = dY op(B)^T, d op(B) = op(A)^T dY,
        // each stored the way its operand is.
        let ga = match (d.ta, d.tb) {
            (false, false) => matmul(false, true, m, n, k, gi, bi),
            (false, true) => matmul(false, false, m, n, k, gi, bi),
            (true, false) => matmul(false, true, k, n, m, bi, gi),
            (true, true) => matmul(true, true, k, n, m, bi, gi),
        }?;
        let gb = match (d.ta, d.tb) {
            (false, false) => matmul(true, false, k, m, n, ai, gi),
            (true, false) => matmul(false, false, k, m, n, ai, gi),
            (false, true) => matmul(true, false, n, m, k, gi, ai),
            (true, true) => matmul(true, true, n, m, k, gi, ai),
        }?;
        for (s, v) in da[oa..oa + m * k].iter_mut().zip(ga) {
            *s = *s + v;
        }
        for (s, v) in db[ob..ob + k * n].iter_mut().zip(gb) {
            *s = *s + v;
        }
    }
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    l.set_output(0, T::wrap(array(&sa, da)?));
    l.set_output(1, T::wrap(array(&sb, db)?));
    Ok(())
}

fn build_batch_matmul_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ta = ctx.args.i64("trans_a", 0)? != 0;
    let tb = ctx.args.i64("trans_b", 0)? != 0;
    let bcast = ctx.args.i64("broadcast", 0)? != 0;
    float_kernel!("BatchMatMulGradient", 0, |l| batch_matmul_grad_t(
        &mut l, ta, tb, bcast
    ))
}

fn build_batch_matmul(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ta = ctx.args.i64("trans_a", 0)? != 0;
    let tb = ctx.args.i64("trans_b", 0)? != 0;
    let bcast = ctx.args.i64("broadcast", 0)? != 0;
    float_kernel!("BatchMatMul", 0, |l| batch_matmul_t(&mut l, ta, tb, bcast))
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
    let op = "L1Distance";
    same_shape(op, l, 0, 1)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let n = rows_of(x.shape());
    let d = x.len().checked_div(n).unwrap_or(0);
    let (xs, ys) = (dense(x), dense(y));
    let out: Vec<T> = crate::tensor::try_collect(
        (0..n).map(|r| {
            (0..d)
                .map(|c| {
                    let v = xs[r * d + c] - ys[r * d + c];
                    if v < T::of(0.0) {
                        -v
                    } else {
                        v
                    }
                })
                .sum()
        }),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], out)?));
    Ok(())
}

fn build_l1(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("L1Distance", 0, |l| l1_t(&mut l))
}

fn l1_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    let op = "L1DistanceGradient";
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
    let eps = T::of(1e-12);
    let dx: Vec<T> = crate::tensor::try_collect(
        (0..n * d).map(|i| {
            let v = xs[i] - ys[i];
            let g = dds[i / d.max(1)];
            if v > eps {
                g
            } else if v < -eps {
                -g
            } else {
                T::of(0.0)
            }
        }),
        "a kernel buffer",
    )?;
    let dy: Vec<T> = crate::tensor::try_collect(dx.iter().map(|&v| -v), "a kernel buffer")?;
    let shape = x.shape().to_vec();
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(1, T::wrap(array(&shape, dy)?));
    Ok(())
}

fn build_l1_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    float_kernel!("L1DistanceGradient", 0, |l| l1_grad_t(&mut l))
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

// ----------------------------------------------------------------- Pow --

/// Where the exponent input lies among X's dims: with Caffe2's legacy
/// `broadcast`, its dims padded with 1s to X's rank, starting at `axis` (-1:
/// at the end); else `None`.
#[derive(Clone, Copy)]
struct PowBroadcast(Option<i64>);

impl PowBroadcast {
    fn of(ctx: &OpDefCtx<'_>) -> Result<PowBroadcast> {
        let on = ctx.args.i64("broadcast", 0)? != 0;
        let axis = ctx.args.i64("axis", -1)?;
        Ok(PowBroadcast(on.then_some(axis)))
    }

    /// The exponent's shape padded to X's rank, if it broadcasts to X.
    fn padded(self, e_shape: &[usize], x_shape: &[usize]) -> Option<Vec<usize>> {
        let axis = self.0?;
        let off = if axis < 0 {
            x_shape.len().checked_sub(e_shape.len())?
        } else {
            usize::try_from(axis).ok()?
        };
        if off + e_shape.len() > x_shape.len() {
            return None;
        }
        let p = padded(e_shape, x_shape.len(), off);
        p.iter()
            .zip(x_shape)
            .all(|(&e, &x)| e == x || e == 1)
            .then_some(p)
    }
}

/// The exponent input `i` as one value per element of X (`n` of them).
fn exponents<T: Float>(
    l: &Locked<'_>,
    op: &str,
    i: usize,
    x_shape: &[usize],
    bc: PowBroadcast,
) -> Result<Vec<T>> {
    let e = input::<T>(l, op, i)?;
    let n: usize = x_shape.iter().product();
    if e.len() == 1 {
        crate::tensor::filled_vec(
            n,
            e.iter().copied().next().unwrap_or(T::of(0.0)),
            "a kernel buffer",
        )
    } else if e.shape() == x_shape {
        Ok(crate::tensor::try_to_vec(&dense(e), "a kernel buffer")?)
    } else if let Some(p) = bc.padded(e.shape(), x_shape) {
        let v = array(&p, crate::tensor::try_to_vec(&dense(e), "a kernel buffer")?)?;
        let b = v.broadcast(IxDyn(x_shape)).ok_or_else(|| {
            Error::internal(format!("{op}: cannot broadcast {p:?} to {x_shape:?}"))
        })?;
        crate::tensor::try_collect(b.iter().copied(), "a broadcast exponent")
    } else {
        let how = if bc.0.is_some() {
            ", X's shape, or a run of X's dims (each equal or 1) starting at axis"
        } else {
            " or X's shape (or set broadcast=1)"
        };
        Err(Error::shape(format!(
            "{op}: the exponent ('{}', shape {:?}) must have one element{how}; X has shape {x_shape:?}",
            l.input_name(i),
            e.shape()
        ))
        .with_blob(l.input_name(i)))
    }
}

fn pow_t<T: Float>(l: &mut Locked<'_>, exponent: Option<f32>, bc: PowBroadcast) -> Result<()> {
    let op = "Pow";
    let x = input::<T>(l, op, 0)?;
    let shape = x.shape().to_vec();
    let es = match exponent {
        Some(e) => crate::tensor::filled_vec(x.len(), T::of(f64::from(e)), "a kernel buffer")?,
        None => exponents::<T>(l, op, 1, &shape, bc)?,
    };
    let y: Vec<T> = crate::tensor::try_collect(
        x.iter().zip(&es).map(|(&v, &e)| v.powf(e)),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&shape, y)?));
    Ok(())
}

fn build_pow(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let exponent = ctx.args.f32_opt("exponent")?;
    match (exponent.is_some(), ctx.num_inputs()) {
        (true, 2) => {
            return Err(
                ctx.bad_arg("Pow: give the exponent as an argument or as a second input, not both")
            )
        }
        (false, 1) => {
            return Err(ctx.bad_arg("Pow: the exponent argument is required with one input"))
        }
        _ => {}
    }
    let bc = PowBroadcast::of(ctx)?;
    float_kernel!("Pow", 0, |l| pow_t(&mut l, exponent, bc))
}

fn pow_grad_t<T: Float>(
    l: &mut Locked<'_>,
    exponent: Option<f32>,
    ni: usize,
    no: usize,
    bc: PowBroadcast,
) -> Result<()> {
    let op = "PowGradient";
    let dy = crate::tensor::try_to_vec(&dense(input::<T>(l, op, 0)?), "a kernel buffer")?;
    let one = T::of(1.0);
    match exponent {
        Some(e) => {
            let e = T::of(f64::from(e));
            // (dY, X, Y) or, after an in-place Pow, (dY, Y) with X = Y^(1/e).
            let base = input::<T>(l, op, 1)?;
            let shape = base.shape().to_vec();
            if dy.len() != base.len() {
                return Err(Error::shape(format!(
                    "{op}: dY and X must have the same shape, got {} and {shape:?} elements",
                    dy.len()
                ))
                .with_blob(l.input_name(0)));
            }
            let dx: Vec<T> = crate::tensor::try_collect(
                base.iter().zip(&dy).map(|(&b, &g)| {
                    let x = if ni == 2 { b.powf(one / e) } else { b };
                    e * x.powf(e - one) * g
                }),
                "a kernel buffer",
            )?;
            l.set_output(0, T::wrap(array(&shape, dx)?));
        }
        None => {
            let x = input::<T>(l, op, 1)?;
            let shape = x.shape().to_vec();
            let es = exponents::<T>(l, op, 2, &shape, bc)?;
            let y = crate::tensor::try_to_vec(&dense(input::<T>(l, op, 3)?), "a kernel buffer")?;
            if dy.len() != x.len() || y.len() != x.len() {
                return Err(
                    Error::shape(format!("{op}: dY, X and Y must have the same shape"))
                        .with_blob(l.input_name(0)),
                );
            }
            let xs = dense(x);
            let dx: Vec<T> = crate::tensor::try_collect(
                (0..xs.len()).map(|i| es[i] * xs[i].powf(es[i] - one) * dy[i]),
                "a kernel buffer",
            )?;
            let de_full: Vec<T> = crate::tensor::try_collect(
                (0..xs.len()).map(|i| dy[i] * y[i] * xs[i].ln()),
                "a kernel buffer",
            )?;
            let e_in = input::<T>(l, op, 2)?;
            let e_shape = e_in.shape().to_vec();
            let de = if e_in.len() == 1 && xs.len() != 1 {
                vec![de_full.iter().copied().sum()]
            } else if e_shape == shape {
                de_full
            } else {
                // Broadcast (legacy): summed over the dims E was repeated along.
                let p = bc.padded(&e_shape, &shape).ok_or_else(|| {
                    Error::internal(format!("{op}: the exponent's shape {e_shape:?} was accepted but does not broadcast"))
                })?;
                let full = array(&shape, de_full)?;
                crate::tensor::try_to_vec(
                    &dense(&reduce_to(full, &p, &e_shape)?),
                    "a kernel buffer",
                )?
            };
            l.set_output(0, T::wrap(array(&shape, dx)?));
            if no > 1 {
                l.set_output(1, T::wrap(array(&e_shape, de)?));
            }
        }
    }
    Ok(())
}

fn build_pow_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let exponent = ctx.args.f32_opt("exponent")?;
    let (ni, no) = (ctx.num_inputs(), ctx.num_outputs());
    let ok = match exponent {
        Some(_) => ni <= 3 && no == 1,
        None => ni == 4,
    };
    if !ok {
        return Err(ctx.bad_arg(
            "PowGradient takes (dY, X, Y) or (dY, Y) with the exponent argument, or (dY, X, exponent, Y) without it",
        ));
    }
    let bc = PowBroadcast::of(ctx)?;
    float_kernel!("PowGradient", 0, |l| pow_grad_t(
        &mut l, exponent, ni, no, bc
    ))
}

// ---------------------------------------------------------------- Clip --

fn clip_bounds(ctx: &OpDefCtx<'_>) -> Result<(f64, f64)> {
    let lo = ctx.args.f32("min", f32::MIN)?;
    let hi = ctx.args.f32("max", f32::MAX)?;
    if lo > hi {
        return Err(ctx.bad_arg(format!("min ({lo}) must not exceed max ({hi})")));
    }
    Ok((f64::from(lo), f64::from(hi)))
}

fn build_clip(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (lo, hi) = clip_bounds(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        crate::with_match_dtype!(floats float_dtype(&l, "Clip", 0)?, |T| {
            let (a, b) = (T::of(lo), T::of(hi));
            map_t::<T>(&mut l, |x| {
                if x < a {
                    a
                } else if x > b {
                    b
                } else {
                    x
                }
            })
        }, else other => Err(crate::tensor::unsupported_dtype(other)))?;
        Ok(true)
    }))
}

fn build_clip_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (lo, hi) = clip_bounds(ctx)?;
    const OP: &str = "ClipGradient";
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        crate::with_match_dtype!(floats float_dtype(&l, OP, 0)?, |T| {
            let (a, b, zero) = (T::of(lo), T::of(hi), T::of(0.0));
            grad_map_t::<T>(&mut l, OP, |y, d| if y > a && y < b { d } else { zero })
        }, else other => Err(crate::tensor::unsupported_dtype(other)))?;
        Ok(true)
    }))
}

// ------------------------------------------------- WeightedSumGradient --

fn build_weighted_sum_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "WeightedSumGradient";
    let grad_on_w = ctx.args.bool("grad_on_w", false)?;
    let ni = ctx.num_inputs();
    if ni % 2 != 1 {
        return Err(ctx.bad_arg(format!(
            "{OP} takes dY and then (X, weight) pairs, an odd number of inputs; got {ni}"
        )));
    }
    let pairs = ni / 2;
    let want = if grad_on_w { 2 * pairs } else { pairs };
    if ctx.num_outputs() != want {
        return Err(ctx.bad_arg(format!(
            "{OP} with {pairs} (X, weight) pairs and grad_on_w={} has {want} outputs, got {}",
            grad_on_w as i32,
            ctx.num_outputs()
        )));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        fn f32_at<'l>(l: &'l Locked<'_>, i: usize) -> Result<&'l ArrayD<f32>> {
            let t = l.tensor(i)?;
            match t {
                Tensor::F32(a) => Ok(&**a),
                _ => Err(Error::type_error(format!(
                    "{OP}: input {i} ('{}') must be a float32 tensor, got {}",
                    l.input_name(i),
                    t.dtype()
                ))
                .with_blob(l.input_name(i))),
            }
        }
        let dy = f32_at(&l, 0)?;
        let mut dxs = Vec::with_capacity(pairs);
        let mut dws = Vec::with_capacity(pairs);
        for p in 0..pairs {
            let x = f32_at(&l, 1 + 2 * p)?;
            let w = f32_at(&l, 2 + 2 * p)?;
            if w.len() != 1 || x.len() != dy.len() {
                return Err(Error::shape(format!(
                    "{OP}: X{p} ('{}', shape {:?}) must have dY's {} elements and its weight ('{}', shape {:?}) one",
                    l.input_name(1 + 2 * p),
                    x.shape(),
                    dy.len(),
                    l.input_name(2 + 2 * p),
                    w.shape()
                ))
                .with_blob(l.input_name(1 + 2 * p)));
            }
            let wv = w.iter().copied().next().unwrap_or(0.0);
            let dx: Vec<f32> =
                crate::tensor::try_collect(dy.iter().map(|&g| g * wv), "a kernel buffer")?;
            dxs.push(array(x.shape(), dx)?);
            let dw: f32 = dy.iter().zip(x.iter()).map(|(&g, &v)| g * v).sum();
            dws.push(array(w.shape(), vec![dw])?);
        }
        for (p, dx) in dxs.into_iter().enumerate() {
            l.set_output(p, Tensor::from(dx));
        }
        if grad_on_w {
            for (p, dw) in dws.into_iter().enumerate() {
                l.set_output(pairs + p, Tensor::from(dw));
            }
        }
        Ok(true)
    }))
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
    use crate::test_util::{f32s, get, i32s, int_arg, op, run, vals, ws_with};

    #[test]
    fn fc_and_its_gradient_by_hand() {
        // X = [[1, 2], [3, 4]], W = [[1, 0], [1, 1], [0, 2]], b = [0, 1, 2].
        let ws = ws_with(&[
            ("x", f32s(&[2, 2], &[1., 2., 3., 4.])),
            ("w", f32s(&[3, 2], &[1., 0., 1., 1., 0., 2.])),
            ("b", f32s(&[3], &[0., 1., 2.])),
        ]);
        run(&ws, op("FC", &["x", "w", "b"], &["y"], vec![])).unwrap();
        let y = get(&ws, "y");
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(vals(&y), vec![1., 4., 6., 3., 8., 10.]);
        // dY = ones: dW = column sums of X per row, db = 2, dX = row sums of W.
        crate::test_util::feed(&ws, "dy", f32s(&[2, 3], &[1.; 6]));
        run(
            &ws,
            op("FCGradient", &["x", "w", "dy"], &["dw", "db", "dx"], vec![]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dw")), vec![4., 6., 4., 6., 4., 6.]);
        assert_eq!(vals(&get(&ws, "db")), vec![2., 2., 2.]);
        assert_eq!(vals(&get(&ws, "dx")), vec![2., 3., 2., 3.]);
    }

    #[test]
    fn matmul_transposes() {
        let ws = ws_with(&[
            ("a", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("b", f32s(&[2, 3], &[1., 0., 1., 0., 1., 0.])),
        ]);
        run(
            &ws,
            op("MatMul", &["a", "b"], &["y"], vec![int_arg("trans_b", 1)]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "y")), vec![4., 2., 10., 5.]);
        let e = run(&ws, op("MatMul", &["a", "b"], &["z"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn add_gradient_sums_over_broadcast_dims() {
        let ws = ws_with(&[
            ("dc", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("a", f32s(&[2, 3], &[0.; 6])),
            ("b", f32s(&[3], &[0.; 3])),
        ]);
        run(
            &ws,
            op("AddGradient", &["dc", "a", "b"], &["da", "db"], vec![]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "da")), vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(get(&ws, "db").shape(), &[3]);
        assert_eq!(vals(&get(&ws, "db")), vec![5., 7., 9.]);
    }

    #[test]
    fn batch_matmul_gradient_sums_over_broadcast_batches() {
        // A (2 x 1 x 2) broadcast against B (2 x 1): Y[b] = A[b] B, so
        // dA[b] = dY[b] B^T and dB = sum_b A[b]^T dY[b].
        let ws = ws_with(&[
            ("a", f32s(&[2, 1, 2], &[1., 2., 3., 4.])),
            ("b", f32s(&[2, 1], &[5., 6.])),
            ("dy", f32s(&[2, 1, 1], &[1., 10.])),
        ]);
        run(
            &ws,
            op(
                "BatchMatMulGradient",
                &["a", "b", "dy"],
                &["da", "db"],
                vec![int_arg("broadcast", 1)],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "da").shape(), &[2, 1, 2]);
        assert_eq!(vals(&get(&ws, "da")), vec![5., 6., 50., 60.]);
        assert_eq!(get(&ws, "db").shape(), &[2, 1]);
        assert_eq!(vals(&get(&ws, "db")), vec![1. + 30., 2. + 40.]);
        // A 1-D A is one row, never transposed: Y = a B (B 2 x 1 -> Y 1-D).
        let ws = ws_with(&[
            ("a", f32s(&[2], &[1., 2.])),
            ("b", f32s(&[2, 1], &[5., 6.])),
            ("dy", f32s(&[1], &[3.])),
        ]);
        let args = vec![int_arg("broadcast", 1), int_arg("trans_a", 1)];
        run(
            &ws,
            op(
                "BatchMatMulGradient",
                &["a", "b", "dy"],
                &["da", "db"],
                args.clone(),
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "da").shape(), &[2]);
        assert_eq!(vals(&get(&ws, "da")), vec![15., 18.]);
        assert_eq!(vals(&get(&ws, "db")), vec![3., 6.]);
        // dY of another shape than the product's is an error naming it.
        let bad = ws_with(&[
            ("a", f32s(&[2], &[1., 2.])),
            ("b", f32s(&[2, 1], &[5., 6.])),
            ("dy", f32s(&[2], &[3., 4.])),
        ]);
        let e = run(
            &bad,
            op(
                "BatchMatMulGradient",
                &["a", "b", "dy"],
                &["da", "db"],
                args,
            ),
        )
        .unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("dy")),
            "{e}"
        );
    }

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
