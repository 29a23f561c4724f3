//! Selection ops: ArgMax and ArgMin, TopK (and its gradient), OneHot,
//! BooleanMask (and its gradient) and SequenceMask: which elements, rather
//! than what arithmetic on them.

#![allow(clippy::result_large_err)]

use super::kit::kernel;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};

pub fn schemas() -> Vec<OpSchema> {
    const ARG_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axis",
            "int",
            "-1",
            "the dim searched (negative: from the end)"
        ),
        arg!("keepdims", "bool", "1", "keep the searched dim, of size 1"),
    ];
    const TOPK_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("k", "int", "-1", "how many (-1: the whole dim)"),
        arg!(
            "axis",
            "int",
            "-1",
            "the dim searched (negative: from the end)"
        ),
    ];
    vec![
        OpSchema::new("ArgMax", build_arg)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(ARG_ARGS)
            .doc("The int64 index of the largest element along `axis` (the first of equal ones); float32, float64, int32 or int64 input."),
        OpSchema::new("ArgMin", build_arg)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(ARG_ARGS)
            .doc("The int64 index of the smallest element along `axis` (the first of equal ones); float32, float64, int32 or int64 input."),
        OpSchema::new("TopK", build_top_k)
            .inputs(1, 1)
            .outputs(2, 3)
            .args(TOPK_ARGS)
            .doc("The k largest elements along `axis`, largest first (equal ones by index): outputs (values, int64 indices along the axis[, int64 indices into the flattened input])."),
        OpSchema::new("TopKGradient", build_top_k_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(&[
                arg!("axis", "int", "-1", "TopK's axis"),
                arg!("k", "int", "-1", "TopK's k (read from dValues; copied by the maker)"),
            ])
            .doc("Gradient of TopK: inputs (dValues, indices, X), output dX: zeros of X's shape with dValues at the indices along the axis (float32 or float64)."),
        OpSchema::new("OneHot", build_one_hot)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Inputs (indices: 1-D int32/int64, N of them; index_size: one int32/int64 element, D), output float32 N x D with a 1 at (i, indices[i]); each index must be in [0, D). No gradient."),
        OpSchema::new("BooleanMask", build_boolean_mask)
            .inputs(2, 2)
            .outputs(1, 2)
            .doc("Inputs (data, mask: 1-D bool of data's first dim), outputs (the rows of data where mask is true, in order[, their int64 indices])."),
        OpSchema::new("SequenceMask", build_sequence_mask)
            .inputs(1, 2)
            .outputs(1, 1)
            .args(&[
                arg!("mode", "string", "(required)", "sequence, window, upper, lower, upperdiag or lowerdiag"),
                arg!("axis", "int", "1", "dims before it index the mask's rows, dims from it its columns"),
                arg!("fill_val", "float", "-inf", "the value of masked elements"),
                arg!("grad", "bool", "false", "gradient mode: masked elements get 0 (the gradient maker sets it)"),
                arg!("radius", "int", "10", "window mode: columns within radius of the row's center are kept"),
                arg!("batch", "int", "(none)", "when given, dims up to it are batches, each masked as its own matrix (rows between batch and axis)"),
                arg!("repeat_from_axis", "int", "(none)", "sequence mode without batch: the mask's columns are the dims from axis up to this one, repeated over the dims from it"),
            ])
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Masks a float tensor seen as a matrix (rows: the dims before axis; columns: the dims from it), as for attention: mode sequence (input 1: int lengths, one per row) masks column j of row i where j >= lengths[i]; window (input 1: int centers) where |j - centers[i]| > radius; upper where j > i, lower where j < i, upperdiag where j >= i, lowerdiag where j <= i. Masked elements become fill_val (0 with grad, which makes the op its own gradient). Output: the input's shape."),
        OpSchema::new("BooleanMaskGradient", build_boolean_mask_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of BooleanMask: inputs (mask, dY), output dX: dY's rows at the true positions of mask, zeros elsewhere (float32 or float64)."),
    ]
}

/// (outer, dim, inner) of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn array<T: Element>(shape: &[usize], v: Vec<T>) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::internal(e.to_string()))
}

/// The canonical axis of input 0, which must have at least one dim.
fn axis_of(l: &Locked<'_>, op: &str, axis: i64) -> Result<usize> {
    let t = l.tensor(0)?;
    let name = l.input_name(0);
    if t.ndim() == 0 {
        return Err(Error::shape(format!(
            "{op}: the input ('{name}') must have at least one dim"
        ))
        .with_blob(name));
    }
    super::kit::canonical_axis(op, "axis", axis, t.ndim(), name)
}

// --------------------------------------------------------- ArgMax/ArgMin --

fn arg_of<T: Element + PartialOrd>(
    t: &Tensor,
    axis: usize,
    keep: bool,
    max: bool,
) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let x: Vec<T> = crate::tensor::try_collect(a.iter().cloned(), "a kernel buffer")?;
    let (outer, d, inner) = around(a.shape(), axis);
    if d == 0 {
        return Err(Error::shape(format!(
            "the searched dim {axis} of shape {:?} is empty",
            a.shape()
        )));
    }
    let mut out = crate::tensor::try_vec(outer * inner, "ArgMax/ArgMin's output")?;
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| &x[(o * d + j) * inner + i];
            let mut best = 0usize;
            for j in 1..d {
                let better = if max {
                    at(j) > at(best)
                } else {
                    at(j) < at(best)
                };
                if better {
                    best = j;
                }
            }
            out.push(best as i64);
        }
    }
    let mut shape = a.shape().to_vec();
    if keep {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(Tensor::from(array(&shape, out)?))
}

fn build_arg(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let axis = ctx.args.i64("axis", -1)?;
    let keep = ctx.args.bool("keepdims", true)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let ax = axis_of(&l, op, axis)?;
        let t = l.tensor(0)?;
        let name = l.input_name(0);
        let max = op == "ArgMax";
        let out = crate::with_match_dtype!(arith t.dtype(), |T| arg_of::<T>(t, ax, keep, max),
        else other => Err(Error::type_error(format!(
            "{op}: the input ('{name}') must be float32, float64, int32 or int64, got {other}"
        ))))
        .map_err(|e| e.with_blob(name))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

// ------------------------------------------------------------------ TopK --

fn top_k_of<T: Element + PartialOrd>(
    t: &Tensor,
    axis: usize,
    k: i64,
    flat: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let a = t.array::<T>()?;
    let x: Vec<T> = crate::tensor::try_collect(a.iter().cloned(), "a kernel buffer")?;
    let (outer, d, inner) = around(a.shape(), axis);
    let k = if k < 0 { d } else { k as usize };
    if k > d {
        return Err(Error::invalid_arg(format!(
            "k = {k} is larger than dim {axis} of the input (shape {:?})",
            a.shape()
        )));
    }
    let n = outer * k * inner;
    let (mut vals, mut idx, mut fidx) = (
        crate::tensor::default_buffer::<T>(n, "a kernel buffer")?,
        crate::tensor::filled_vec(n, 0i64, "a kernel buffer")?,
        crate::tensor::filled_vec(n, 0i64, "a kernel buffer")?,
    );
    let mut order: Vec<usize> = crate::tensor::try_collect(0..d, "a kernel buffer")?;
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| &x[(o * d + j) * inner + i];
            order.iter_mut().enumerate().for_each(|(j, v)| *v = j);
            // Largest first; equal values (and NaNs, which compare with
            // nothing) keep index order: a stable sort.
            order.sort_by(|&p, &q| {
                at(q)
                    .partial_cmp(at(p))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            for (r, &j) in order[..k].iter().enumerate() {
                let w = (o * k + r) * inner + i;
                vals[w] = at(j).clone();
                idx[w] = j as i64;
                fidx[w] = ((o * d + j) * inner + i) as i64;
            }
        }
    }
    let mut shape = a.shape().to_vec();
    shape[axis] = k;
    let flat = if flat {
        Some(Tensor::from(array(&[n], fidx)?))
    } else {
        None
    };
    Ok((
        T::wrap(array(&shape, vals)?),
        Tensor::from(array(&shape, idx)?),
        flat,
    ))
}

fn build_top_k(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", -1)?;
    let k = ctx.args.i64("k", -1)?;
    if k == 0 || k < -1 {
        return Err(ctx.bad_arg(format!("k must be >= 1 (or -1 for the whole dim), got {k}")));
    }
    let flat = ctx.num_outputs() > 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let ax = axis_of(&l, "TopK", axis)?;
        let t = l.tensor(0)?;
        let name = l.input_name(0);
        let (v, i, f) =
            crate::with_match_dtype!(arith t.dtype(), |T| top_k_of::<T>(t, ax, k, flat),
            else other => Err(Error::type_error(format!(
                "TopK: the input ('{name}') must be float32, float64, int32 or int64, got {other}"
            ))))
            .map_err(|e| e.with_blob(name))?;
        l.set_output(0, v);
        l.set_output(1, i);
        if let Some(f) = f {
            l.set_output(2, f);
        }
        Ok(true)
    }))
}

fn top_k_grad_of<T: Element>(
    dv: &Tensor,
    idx: &[i64],
    x_shape: &[usize],
    axis: usize,
) -> Result<Tensor> {
    let g = dv.array::<T>()?;
    let (outer, d, inner) = around(x_shape, axis);
    let k = g.shape().get(axis).copied().unwrap_or(0);
    let mut want = x_shape.to_vec();
    want[axis] = k;
    if g.shape() != want.as_slice() || idx.len() != g.len() {
        return Err(Error::shape(format!(
            "TopKGradient: dValues (shape {:?}) and the indices ({} of them) must have X's shape {x_shape:?} with {k} at dim {axis}",
            g.shape(),
            idx.len()
        )));
    }
    let gv: Vec<T> = crate::tensor::try_collect(g.iter().cloned(), "a kernel buffer")?;
    let mut dx = crate::tensor::default_buffer::<T>(outer * d * inner, "a kernel buffer")?;
    for o in 0..outer {
        for r in 0..k {
            for i in 0..inner {
                let w = (o * k + r) * inner + i;
                let j = usize::try_from(idx[w])
                    .ok()
                    .filter(|&j| j < d)
                    .ok_or_else(|| {
                        Error::invalid_arg(format!(
                            "TopKGradient: index {} is outside dim {axis} of X (size {d})",
                            idx[w]
                        ))
                    })?;
                dx[(o * d + j) * inner + i] = gv[w].clone();
            }
        }
    }
    Ok(T::wrap(array(x_shape, dx)?))
}

fn build_top_k_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", -1)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let x_shape = l.tensor(2)?.shape().to_vec();
        let xname = l.input_name(2);
        if x_shape.is_empty() {
            return Err(Error::shape("TopKGradient: X must have at least one dim").with_blob(xname));
        }
        let ax = super::kit::canonical_axis("TopKGradient", "axis", axis, x_shape.len(), xname)?;
        let it = l.tensor(1)?;
        let idx = super::kit::int_values(it)?.ok_or_else(|| {
            Error::type_error(format!(
                "TopKGradient: the indices ('{}') must be int64 or int32, got {}",
                l.input_name(1),
                it.dtype()
            ))
            .with_blob(l.input_name(1))
        })?;
        let dv = l.tensor(0)?;
        let name = l.input_name(0);
        let out = crate::with_match_dtype!(floats dv.dtype(), |T| top_k_grad_of::<T>(dv, &idx, &x_shape, ax),
            else other => Err(Error::type_error(format!(
                "TopKGradient: dValues ('{name}') must be float32 or float64, got {other}"
            ))))
        .map_err(|e| e.with_blob(name))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

// ---------------------------------------------------------------- OneHot --

/// Input `i` as int64 values (int32 or int64).
fn ints_of(l: &Locked<'_>, op: &str, i: usize, what: &str) -> Result<Vec<i64>> {
    let t = l.tensor(i)?;
    super::kit::int_values(t)?.ok_or_else(|| {
        let name = l.input_name(i);
        Error::type_error(format!(
            "{op}: {what} ('{name}') must be int32 or int64, got {}",
            t.dtype()
        ))
        .with_blob(name)
    })
}

fn build_one_hot(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let iname = l.input_name(0);
        if l.tensor(0)?.ndim() != 1 {
            return Err(Error::shape(format!(
                "OneHot: the indices ('{iname}') must be 1-D, got shape {:?}",
                l.tensor(0)?.shape()
            ))
            .with_blob(iname));
        }
        let idx = ints_of(&l, "OneHot", 0, "the indices")?;
        let size = ints_of(&l, "OneHot", 1, "the index size")?;
        let sname = l.input_name(1);
        let d = match size.as_slice() {
            [d] if *d >= 0 => *d as usize,
            _ => {
                return Err(Error::invalid_arg(format!(
                    "OneHot: the index size ('{sname}') must be one element >= 0, got {size:?}"
                ))
                .with_blob(sname))
            }
        };
        let mut out =
            crate::tensor::try_vec::<f32>(idx.len().saturating_mul(d), "OneHot's output")?;
        out.resize(idx.len() * d, 0.0);
        for (r, &j) in idx.iter().enumerate() {
            let j = usize::try_from(j).ok().filter(|&j| j < d).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "OneHot: index {j} (at {r}) is out of range [0, {d})"
                ))
                .with_blob(iname)
            })?;
            out[r * d + j] = 1.0;
        }
        l.set_output(0, Tensor::from(array(&[idx.len(), d], out)?));
        Ok(true)
    }))
}

// ----------------------------------------------------------- BooleanMask --

/// The mask (input `i`): 1-D bool of `rows` elements.
fn mask_of(l: &Locked<'_>, op: &str, i: usize, rows: Option<usize>) -> Result<Vec<bool>> {
    let t = l.tensor(i)?;
    let name = l.input_name(i);
    if t.dtype() != DataType::Bool || t.ndim() != 1 {
        return Err(Error::type_error(format!(
            "{op}: the mask ('{name}') must be a 1-D bool tensor, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        ))
        .with_blob(name));
    }
    let m: Vec<bool> =
        crate::tensor::try_collect(t.array::<bool>()?.iter().copied(), "a kernel buffer")?;
    if let Some(rows) = rows {
        if m.len() != rows {
            return Err(Error::shape(format!(
                "{op}: the mask ('{name}') has {} elements; data's first dim is {rows}",
                m.len()
            ))
            .with_blob(name));
        }
    }
    Ok(m)
}

fn masked_rows<T: Element>(t: &Tensor, mask: &[bool]) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let x: Vec<T> = crate::tensor::try_collect(a.iter().cloned(), "a kernel buffer")?;
    let row: usize = a.shape()[1..].iter().product();
    let mut y = Vec::new();
    for (r, _) in mask.iter().enumerate().filter(|(_, &m)| m) {
        y.extend_from_slice(&x[r * row..(r + 1) * row]);
    }
    let mut shape = a.shape().to_vec();
    shape[0] = mask.iter().filter(|&&m| m).count();
    Ok(T::wrap(array(&shape, y)?))
}

fn build_boolean_mask(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let with_indices = ctx.num_outputs() > 1;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let t = l.tensor(0)?;
        let name = l.input_name(0);
        if t.ndim() == 0 {
            return Err(Error::shape(format!(
                "BooleanMask: data ('{name}') must have at least one dim"
            ))
            .with_blob(name));
        }
        let mask = mask_of(&l, "BooleanMask", 1, Some(t.shape()[0]))?;
        let out = crate::with_match_dtype!(t.dtype(), |T| masked_rows::<T>(t, &mask),
            else other => Err(crate::tensor::unsupported_dtype(other)))?;
        l.set_output(0, out);
        if with_indices {
            let idx: Vec<i64> = crate::tensor::try_collect(
                mask.iter()
                    .enumerate()
                    .filter(|(_, &m)| m)
                    .map(|(r, _)| r as i64),
                "a kernel buffer",
            )?;
            let n = idx.len();
            l.set_output(1, Tensor::from(array(&[n], idx)?));
        }
        Ok(true)
    }))
}

fn unmasked_rows<T: Element>(g: &Tensor, mask: &[bool]) -> Result<Tensor> {
    let a = g.array::<T>()?;
    let kept = mask.iter().filter(|&&m| m).count();
    if a.ndim() == 0 || a.shape()[0] != kept {
        return Err(Error::shape(format!(
            "BooleanMaskGradient: dY (shape {:?}) must have one row per true element of the mask ({kept})",
            a.shape()
        )));
    }
    let gv = crate::tensor::try_collect(a.iter().cloned(), "BooleanMaskGradient's dY")?;
    let row: usize = a.shape()[1..].iter().product();
    let mut shape = a.shape().to_vec();
    shape[0] = mask.len();
    let mut dx = crate::tensor::zeroed_vec::<T>(&shape, "BooleanMaskGradient's output")?;
    for (k, (r, _)) in mask.iter().enumerate().filter(|(_, &m)| m).enumerate() {
        dx[r * row..(r + 1) * row].clone_from_slice(&gv[k * row..(k + 1) * row]);
    }
    Ok(T::wrap(array(&shape, dx)?))
}

fn build_boolean_mask_grad(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let mask = mask_of(&l, "BooleanMaskGradient", 0, None)?;
        let g = l.tensor(1)?;
        let name = l.input_name(1);
        let out = crate::with_match_dtype!(floats g.dtype(), |T| unmasked_rows::<T>(g, &mask),
        else other => Err(Error::type_error(format!(
            "BooleanMaskGradient: dY ('{name}') must be float32 or float64, got {other}"
        ))))
        .map_err(|e| e.with_blob(name))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

// ------------------------------------------------------- SequenceMask --

/// Which elements of a rows x columns matrix SequenceMask masks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MaskMode {
    Sequence,
    Window,
    Upper,
    Lower,
    UpperDiag,
    LowerDiag,
}

impl MaskMode {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "sequence" => MaskMode::Sequence,
            "window" => MaskMode::Window,
            "upper" => MaskMode::Upper,
            "lower" => MaskMode::Lower,
            "upperdiag" => MaskMode::UpperDiag,
            "lowerdiag" => MaskMode::LowerDiag,
            _ => return None,
        })
    }

    /// Whether the mode reads input 1 (lengths or centers).
    fn per_row(self) -> bool {
        matches!(self, MaskMode::Sequence | MaskMode::Window)
    }
}

#[derive(Clone, Copy)]
struct SequenceMask {
    mode: MaskMode,
    axis: i64,
    radius: i64,
    fill: f64,
    batch: Option<i64>,
    repeat_from: Option<i64>,
}

fn build_sequence_mask(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let mode_s = ctx
        .args
        .string_opt("mode")?
        .ok_or_else(|| ctx.bad_arg("SequenceMask needs the argument mode"))?;
    let mode = MaskMode::parse(&mode_s).ok_or_else(|| {
        ctx.bad_arg(format!(
            "SequenceMask: unsupported mode '{mode_s}' (sequence, window, upper, lower, upperdiag or lowerdiag)"
        ))
    })?;
    let want = if mode.per_row() { 2 } else { 1 };
    if ctx.num_inputs() < want {
        return Err(ctx.bad_arg(format!(
            "SequenceMask: mode '{mode_s}' takes {want} inputs, got {}",
            ctx.num_inputs()
        )));
    }
    let grad = ctx.args.bool("grad", false)?;
    let fill = if grad {
        0.0
    } else {
        f64::from(ctx.args.f32("fill_val", f32::NEG_INFINITY)?)
    };
    let m = SequenceMask {
        mode,
        axis: ctx.args.i64("axis", 1)?,
        radius: ctx.args.i64("radius", 10)?,
        fill,
        batch: ctx.args.i64_opt("batch")?,
        repeat_from: ctx.args.i64_opt("repeat_from_axis")?,
    };
    if m.repeat_from.is_some() && (mode != MaskMode::Sequence || m.batch.is_some()) {
        return Err(ctx.bad_arg(
            "SequenceMask: repeat_from_axis works in sequence mode only, and not with batch",
        ));
    }
    crate::ops::kit::float_kernel!("SequenceMask", 0, |l| sequence_mask_t(&mut l, &m))
}

fn sequence_mask_t<T: crate::num::Float>(l: &mut Locked<'_>, m: &SequenceMask) -> Result<()> {
    use crate::ops::kit::{canonical_axis, dense, input};
    const OP: &str = "SequenceMask";
    let x = input::<T>(l, OP, 0)?;
    let shape = x.shape().to_vec();
    let xv = dense(x).into_owned();
    let name0 = l.input_name(0).to_string();
    let axis = canonical_axis(OP, "axis", m.axis, shape.len(), &name0)?;
    let prod = |r: std::ops::Range<usize>| -> usize { shape[r].iter().product() };
    // (batches, rows per batch, columns, elements per column).
    let (batches, rows, cols, reps) = match (m.batch, m.repeat_from) {
        (Some(b), _) => {
            let b = canonical_axis(OP, "batch", b, shape.len(), &name0)?;
            if b >= axis {
                return Err(Error::invalid_arg(format!(
                    "SequenceMask: batch ({b}) must come before axis ({axis})"
                ))
                .with_blob(&name0));
            }
            (
                prod(0..b + 1),
                prod(b + 1..axis),
                prod(axis..shape.len()),
                1,
            )
        }
        (None, Some(r)) => {
            let r = canonical_axis(OP, "repeat_from_axis", r, shape.len(), &name0)?;
            if r < axis {
                return Err(Error::invalid_arg(format!(
                    "SequenceMask: repeat_from_axis ({r}) must not come before axis ({axis})"
                ))
                .with_blob(&name0));
            }
            (1, prod(0..axis), prod(axis..r), prod(r..shape.len()))
        }
        (None, None) => (1, prod(0..axis), prod(axis..shape.len()), 1),
    };
    let per_row = if m.mode.per_row() {
        let t = l.tensor(1)?;
        let name = l.input_name(1);
        let v = crate::ops::kit::int_values(t)?.ok_or_else(|| {
            Error::type_error(format!(
                "SequenceMask: '{name}' must hold int32 or int64 {}, got {}",
                if m.mode == MaskMode::Sequence {
                    "lengths"
                } else {
                    "window centers"
                },
                t.dtype()
            ))
            .with_blob(name)
        })?;
        if v.len() < rows {
            return Err(Error::shape(format!(
                "SequenceMask: '{name}' has {} values for {rows} rows of '{name0}' (shape {shape:?}, axis {axis})",
                v.len()
            ))
            .with_blob(name));
        }
        v
    } else {
        Vec::new()
    };
    let masked = |i: usize, j: usize| -> bool {
        match m.mode {
            MaskMode::Sequence => j as i64 >= per_row[i],
            MaskMode::Window => {
                let (c, j) = (per_row[i], j as i64);
                j > c.saturating_add(m.radius) || j < c.saturating_sub(m.radius)
            }
            MaskMode::Upper => j > i,
            MaskMode::Lower => j < i,
            MaskMode::UpperDiag => j >= i,
            MaskMode::LowerDiag => j <= i,
        }
    };
    let fill = T::of(m.fill);
    let mut out = xv;
    let (row_len, batch_len) = (cols * reps, rows * cols * reps);
    for b in 0..batches {
        for i in 0..rows {
            let row = &mut out[b * batch_len + i * row_len..][..row_len];
            for j in 0..cols {
                if masked(i, j) {
                    row[j * reps..(j + 1) * reps].fill(fill);
                }
            }
        }
    }
    let y = T::wrap(crate::ops::kit::array(&shape, out)?);
    l.set_output(0, y);
    Ok(())
}
