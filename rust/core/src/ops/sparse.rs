//! Sparse lookups and their gradients (issue 14): Gather, BatchGather,
//! SparseToDense, SparseLengthsSum/Mean/WeightedSum,
//! LengthsSum/Mean/WeightedSum, their gradient ops, ScatterWeightedSum, and
//! Caffe2's fused 8-bit rowwise tables (FloatToFused8BitRowwiseQuantized,
//! Fused8BitRowwiseQuantizedToFloat, GatherFused8BitRowwise).
//!
//! Gather's and SparseLengthsSum's gradients are sparse, as in Caffe2: a
//! `GradientSlice` of (indices, values) made in `ferrocaffe/gradients.py`;
//! SparseToDense turns one into a dense tensor, ScatterWeightedSum and the
//! sparse optimizers (optim.rs) apply one to a parameter.

#![allow(clippy::result_large_err)]

use super::kit::kernel;
use super::kit::{array, checked_rows, dense, f32_in, float_kernel, indices, input};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo, MANY};
use crate::tensor::{checked_numel, try_vec, zeroed_vec, DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};

fn in_place_0_0(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("FloatToFused8BitRowwiseQuantized", build_to_fused8)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, ins, _| Ok(vec![fused_shape(ins, DataType::Float, 8, DataType::Uint8)]))
            .doc(
                "Input float32 (at least 1-D; each row along the last dim is quantized on its own) -> uint8 of the same \
                 dims with 8 more columns: per row, round((x - min) * 255 / (max - min + 1e-8)), then the scale \
                 (max - min) / 255 and the bias min as little-endian float32s.",
            ),
        OpSchema::new("Fused8BitRowwiseQuantizedToFloat", build_from_fused8)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, ins, _| Ok(vec![fused_shape(ins, DataType::Uint8, -8, DataType::Float)]))
            .doc("Input uint8 from FloatToFused8BitRowwiseQuantized -> float32 with 8 fewer columns: value * scale + bias per row."),
        OpSchema::new("GatherFused8BitRowwise", build_gather_fused8)
            .inputs(2, 2)
            .outputs(1, 1)
            .infer(|_, ins, _| {
                use crate::shapes::rules::known;
                let (Some(d), Some(i)) = (known(ins, 0), known(ins, 1)) else {
                    return Ok(vec![None]);
                };
                if d.dtype != DataType::Uint8 || d.dims.len() != 2 || d.dims[1] <= 8 || i.dims.len() != 1 {
                    return Err(Error::shape("GatherFused8BitRowwise needs a uint8 matrix of more than 8 columns and a vector of indices"));
                }
                Ok(vec![Some(ShapeInfo::new(vec![i.dims[0], d.dims[1] - 8], DataType::Float))])
            })
            .doc(
                "Inputs (DATA, a uint8 matrix from FloatToFused8BitRowwiseQuantized with more than 8 columns; INDICES, an \
                 int32/int64 vector) -> float32 [len(INDICES), columns - 8]: the de-quantized rows at the indices.",
            ),
        OpSchema::new("Gather", build_gather)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(&[
                arg!("axis", "int", "0", "the dim of DATA the indices select along"),
                arg!("wrap_indices", "bool", "false", "negative indices count from the end"),
                arg!("match_outer", "bool", "false", "INDICES starts with DATA's dims before axis, and each of those outer positions takes its own indices"),
                arg!("dense_gradient", "bool", "false", "the gradient is dense (SparseToDense) instead of a GradientSlice"),
            ])
            .doc("Inputs (DATA, INDICES int32/int64); output DATA's dims before axis, INDICES' dims, DATA's dims after axis: the slices of DATA at the indices (any dtype)."),
        OpSchema::new("BatchGather", build_gather)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(&[
                arg!("axis", "int", "1", "the dim of DATA the indices select along"),
                arg!("match_outer", "bool", "false", "INDICES starts with DATA's dims before axis, and each of those outer positions takes its own indices"),
            ])
            .doc("Gather along `axis` (default 1): inputs (DATA, INDICES), output DATA's dims before axis, INDICES' dims, DATA's dims after axis \
                  (with match_outer: INDICES' dims from axis on)."),
        OpSchema::new("BatchGatherGradient", build_gather_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(&[
                arg!("axis", "int", "1", "the dim of DATA the indices selected along"),
                arg!("match_outer", "bool", "false", "the gather's match_outer"),
                arg!("wrap_indices", "bool", "false", "the gather's wrap_indices: negative indices count from the end"),
            ])
            .doc("Dense gradient of a gather along `axis`: inputs (DATA, INDICES, dY), dDATA (DATA's shape) with the rows of dY added at the indices (float32 or float64)."),
        OpSchema::new("SparseToDense", build_sparse_to_dense)
            .inputs(2, 3)
            .outputs(1, 1)
            .doc("Inputs (INDICES, VALUES[, DATA_TO_INFER_DIM]): output row INDICES[i] is the sum of the VALUES rows at i (VALUES has INDICES' dims then the row's); the first dim is DATA_TO_INFER_DIM's first, else max(INDICES) + 1. Float32 or float64."),
        OpSchema::new("SparseLengthsSum", build_sls)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("Inputs (DATA, INDICES int32/int64, LENGTHS int32): output row i is the sum of the DATA rows at the next LENGTHS[i] indices (float32 or float64)."),
        OpSchema::new("SparseLengthsSumGradient", build_sls_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of SparseLengthsSum: inputs (dY, LENGTHS), output the gradient's values: row j is dY's row of the segment j falls in (a GradientSlice with the indices)."),
        OpSchema::new("SparseLengthsMean", build_sls)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("Inputs (DATA, INDICES int32/int64, LENGTHS int32): output row i is the mean of the DATA rows at the next LENGTHS[i] indices (0 for an empty segment)."),
        OpSchema::new("SparseLengthsMeanGradient", build_sls_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of SparseLengthsMean: inputs (dY, LENGTHS), output the gradient's values: row j is dY's row of its segment divided by the segment's length."),
        OpSchema::new("LengthsSum", build_sls)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Inputs (DATA, LENGTHS int32 summing to DATA's first dim): output row i is the sum of the next LENGTHS[i] rows of DATA."),
        OpSchema::new("LengthsSumGradient", build_sls_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of LengthsSum: inputs (dY, LENGTHS), dDATA: each row gets dY's row of its segment."),
        OpSchema::new("LengthsMean", build_sls)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Inputs (DATA, LENGTHS int32 summing to DATA's first dim): output row i is the mean of the next LENGTHS[i] rows of DATA (0 for an empty segment)."),
        OpSchema::new("LengthsMeanGradient", build_sls_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Gradient of LengthsMean: inputs (dY, LENGTHS), dDATA: each row gets dY's row of its segment divided by the segment's length."),
        OpSchema::new("SparseLengthsWeightedSum", build_wsls)
            .inputs(4, 4)
            .outputs(1, 1)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("Inputs (DATA, SCALARS, INDICES int32/int64, LENGTHS int32): output row i is the sum of SCALARS[j] * DATA[INDICES[j]] over the next LENGTHS[i] positions j (SCALARS 1-D, one per index, DATA's float type)."),
        OpSchema::new("SparseLengthsWeightedSumGradient", build_wsls_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("Gradient of SparseLengthsWeightedSum: inputs (SCALARS, dY, LENGTHS), output the gradient's values: row j is SCALARS[j] times dY's row of the segment j falls in (a GradientSlice with the indices)."),
        OpSchema::new("SparseLengthsWeightedSumWithMainInputGradient", build_wsls_grad)
            .inputs(5, 5)
            .outputs(2, 2)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("Gradient of SparseLengthsWeightedSum with grad_on_weights: inputs (SCALARS, dY, LENGTHS, DATA, INDICES), outputs the DATA gradient's values (as without grad_on_weights) and dSCALARS: element j is the dot product of dY's row of j's segment and DATA[INDICES[j]]."),
        // Newer Caffe2's names for the sparse gradients (its makers passed
        // INDICES too, which the CPU kernels do not read): nets it wrote run.
        OpSchema::new("SparseLengthsIndicesInGradientSumGradient", build_sls_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("SparseLengthsSumGradient with INDICES as a third input (not read): inputs (dY, LENGTHS, INDICES)."),
        OpSchema::new("SparseLengthsIndicesInGradientMeanGradient", build_sls_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .doc("SparseLengthsMeanGradient with INDICES as a third input (not read): inputs (dY, LENGTHS, INDICES)."),
        OpSchema::new("SparseLengthsIndicesInGradientWeightedSumGradient", build_wsls_grad)
            .inputs(4, 4)
            .outputs(1, 1)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("SparseLengthsWeightedSumGradient with INDICES as a fourth input (not read): inputs (SCALARS, dY, LENGTHS, INDICES)."),
        OpSchema::new("SparseLengthsIndicesInGradientWeightedSumWithMainInputGradient", build_wsls_grad)
            .inputs(5, 5)
            .outputs(2, 2)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("SparseLengthsWeightedSumWithMainInputGradient under newer Caffe2's name: inputs (SCALARS, dY, LENGTHS, DATA, INDICES), outputs (the DATA gradient's values, dSCALARS)."),
        OpSchema::new("LengthsWeightedSum", build_wsls)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("Inputs (DATA, SCALARS, LENGTHS int32 summing to DATA's first dim): output row i is the sum of SCALARS[j] * DATA[j] over the next LENGTHS[i] rows j (SCALARS 1-D, one per row)."),
        OpSchema::new("LengthsWeightedSumGradient", build_wsls_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("Gradient of LengthsWeightedSum: inputs (SCALARS, dY, LENGTHS), dDATA: row j is SCALARS[j] times dY's row of its segment."),
        OpSchema::new("LengthsWeightedSumWithMainInputGradient", build_wsls_grad)
            .inputs(4, 4)
            .outputs(2, 2)
            .args(&[GRAD_ON_WEIGHTS])
            .doc("Gradient of LengthsWeightedSum with grad_on_weights: inputs (SCALARS, dY, LENGTHS, DATA), outputs dDATA and dSCALARS (element j: the dot product of dY's row of j's segment and DATA[j])."),
        OpSchema::new("ScatterWeightedSum", build_scatter_weighted_sum)
            .inputs(5, MANY)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(in_place_0_0))
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Inputs (X0, W0, INDICES, X1, W1, ...), output X0 in place: each row X0[INDICES[i]] is scaled by W0 \
                  (a repeated index scales its row again), then for each pair k and each i in order \
                  X0[INDICES[i]] += Wk * Xk[i] (float32; weights of one element)."),
    ]
}

// -------------------------------------------------------------- Gather --

/// The rows of `axis` that outer position `o` takes: all of `rows`, or with
/// `match_outer` its own block of `rows.len() / outer`.
fn rows_of(rows: &[usize], o: usize, outer: usize, match_outer: bool) -> &[usize] {
    if match_outer {
        let k = rows.len() / outer.max(1);
        &rows[o * k..(o + 1) * k]
    } else {
        rows
    }
}

/// The gathered shape: DATA's dims before `axis`, the indices' dims (from
/// `axis` on with `match_outer`), DATA's dims after `axis`.
fn gathered_shape(
    shape: &[usize],
    axis: usize,
    idx_shape: &[usize],
    match_outer: bool,
) -> Vec<usize> {
    let mut out = shape[..axis].to_vec();
    out.extend_from_slice(if match_outer {
        &idx_shape[axis..]
    } else {
        idx_shape
    });
    out.extend_from_slice(&shape[axis + 1..]);
    out
}

/// With `match_outer`, the indices must start with DATA's dims before `axis`.
fn check_match_outer(
    op: &str,
    shape: &[usize],
    axis: usize,
    idx_shape: &[usize],
    blob: &str,
) -> Result<()> {
    if idx_shape.len() < axis || idx_shape[..axis] != shape[..axis] {
        return Err(Error::shape(format!(
            "{op}: with match_outer the indices (shape {idx_shape:?}) must start with DATA's dims before axis {axis}: {:?}",
            &shape[..axis]
        ))
        .with_blob(blob));
    }
    Ok(())
}

fn gather_of<T: Element>(
    t: &Tensor,
    axis: usize,
    rows: &[usize],
    idx_shape: &[usize],
    match_outer: bool,
) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let shape = a.shape();
    let outer: usize = shape[..axis].iter().product();
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let src: Vec<T> = crate::tensor::try_collect(a.iter().cloned(), "a kernel buffer")?;
    let per = if match_outer {
        rows.len() / outer.max(1)
    } else {
        rows.len()
    };
    let total = outer
        .checked_mul(per)
        .and_then(|v| v.checked_mul(inner))
        .ok_or_else(|| Error::invalid_arg("Gather: the output would have too many elements"))?;
    let mut out = crate::tensor::try_vec::<T>(total, "Gather's output")?;
    for o in 0..outer {
        for &r in rows_of(rows, o, outer, match_outer) {
            let s = (o * n + r) * inner;
            out.extend_from_slice(&src[s..s + inner]);
        }
    }
    let out_shape = gathered_shape(shape, axis, idx_shape, match_outer);
    let r = ArrayD::from_shape_vec(IxDyn(&out_shape), out)
        .map_err(|e| Error::internal(e.to_string()))?;
    Ok(T::wrap(r))
}

fn build_gather(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = ctx.op_type() == "BatchGather";
    let axis = ctx.args.i64("axis", i64::from(batch))?;
    let wrap = !batch && ctx.args.bool("wrap_indices", false)?;
    let match_outer = ctx.args.bool("match_outer", false)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = if batch { "BatchGather" } else { "Gather" };
        let data = l.tensor(0)?;
        let nd = data.ndim();
        let dname = l.input_name(0);
        if nd == 0 {
            return Err(
                Error::shape(format!("{op}: DATA ('{dname}') must have at least one dim"))
                    .with_blob(dname),
            );
        }
        let ax = super::kit::canonical_axis(op, "axis", axis, nd, dname)?;
        if ax >= nd {
            return Err(Error::invalid_arg(format!(
                "{op}: axis {axis} is out of range for {nd} dims"
            ))
            .with_blob(dname));
        }
        let (idx, idx_shape) = indices(&l, op, 1)?;
        if data.shape()[ax] == 0 {
            // Nothing to gather from: Caffe2 gives an empty output shaped
            // like DATA with its first dim 0, whatever the indices.
            let mut shape = data.shape().to_vec();
            shape[0] = 0;
            let out = Tensor::zeros(data.dtype(), &shape)?;
            l.set_output(0, out);
            return Ok(true);
        }
        if match_outer {
            check_match_outer(op, data.shape(), ax, &idx_shape, l.input_name(1))?;
        }
        let rows = checked_rows(op, &idx, data.shape()[ax], wrap, l.input_name(1))?;
        let out = crate::with_match_dtype!(data.dtype(), |T| gather_of::<T>(data, ax, &rows, &idx_shape, match_outer),
            else other => Err(crate::tensor::unsupported_dtype(other)))?;
        l.set_output(0, out);
        Ok(true)
    }))
}

fn gather_grad_t<T: Float>(
    l: &mut Locked<'_>,
    axis: i64,
    match_outer: bool,
    wrap: bool,
) -> Result<()> {
    let op = "BatchGatherGradient";
    let shape = l.tensor(0)?.shape().to_vec();
    let dname = l.input_name(0);
    let ax = super::kit::canonical_axis(op, "axis", axis, shape.len(), dname)?;
    if ax >= shape.len() {
        return Err(Error::invalid_arg(format!(
            "{op}: axis {axis} is out of range for {} dims",
            shape.len()
        ))
        .with_blob(dname));
    }
    let (idx, idx_shape) = indices(l, op, 1)?;
    if match_outer {
        check_match_outer(op, &shape, ax, &idx_shape, l.input_name(1))?;
    }
    let rows = checked_rows(op, &idx, shape[ax], wrap, l.input_name(1))?;
    let want = gathered_shape(&shape, ax, &idx_shape, match_outer);
    let g = input::<T>(l, op, 2)?;
    if g.shape() != want.as_slice() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have the gathered shape {want:?}",
            l.input_name(2),
            g.shape()
        ))
        .with_blob(l.input_name(2)));
    }
    let outer: usize = shape[..ax].iter().product();
    let n = shape[ax];
    let inner: usize = shape[ax + 1..].iter().product();
    let mut out = zeroed_vec::<T>(&shape, format_args!("{op}'s output"))?;
    let gs = dense(g);
    for o in 0..outer {
        let mine = rows_of(&rows, o, outer, match_outer);
        for (j, &r) in mine.iter().enumerate() {
            let (src, dst) = ((o * mine.len() + j) * inner, (o * n + r) * inner);
            for c in 0..inner {
                out[dst + c] += gs[src + c];
            }
        }
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_gather_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let match_outer = ctx.args.bool("match_outer", false)?;
    let wrap = ctx.args.bool("wrap_indices", false)?;
    float_kernel!("BatchGatherGradient", 2, |l| gather_grad_t(
        &mut l,
        axis,
        match_outer,
        wrap
    ))
}

// ------------------------------------------------------- SparseToDense --

fn sparse_to_dense_t<T: Float>(l: &mut Locked<'_>, ni: usize) -> Result<()> {
    let op = "SparseToDense";
    let (idx, idx_shape) = indices(l, op, 0)?;
    let v = input::<T>(l, op, 1)?;
    let k = idx_shape.len();
    if v.ndim() < k || v.shape()[..k] != idx_shape[..] {
        return Err(Error::shape(format!(
            "{op}: VALUES ('{}', shape {:?}) must start with the dims of INDICES {idx_shape:?}",
            l.input_name(1),
            v.shape()
        ))
        .with_blob(l.input_name(1)));
    }
    let row_shape = v.shape()[k..].to_vec();
    let inner: usize = row_shape.iter().product();
    let first = if ni == 3 {
        let s = l.tensor(2)?.shape();
        s.first().copied().ok_or_else(|| {
            Error::shape(format!(
                "{op}: DATA_TO_INFER_DIM ('{}') must have a first dim",
                l.input_name(2)
            ))
            .with_blob(l.input_name(2))
        })?
    } else {
        idx.iter()
            .copied()
            .max()
            .map_or(0, |m| (m.max(-1) + 1) as usize)
    };
    let rows = checked_rows(op, &idx, first, false, l.input_name(0))?;
    let vs = dense(v);
    let n = first.checked_mul(inner).ok_or_else(|| {
        Error::invalid_arg(format!(
            "{op}: an output of {first} rows of {inner} is too large"
        ))
        .with_blob(l.input_name(0))
    })?;
    let mut out = crate::tensor::try_vec::<T>(n, format_args!("{op}'s output of {first} rows"))?;
    out.resize(n, T::of(0.0));
    for (i, &r) in rows.iter().enumerate() {
        for c in 0..inner {
            out[r * inner + c] += vs[i * inner + c];
        }
    }
    let mut shape = vec![first];
    shape.extend(row_shape);
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_sparse_to_dense(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let ni = ctx.num_inputs();
    float_kernel!("SparseToDense", 1, |l| sparse_to_dense_t(&mut l, ni))
}

// ---------------------------------------------------- SparseLengthsSum --

/// Lengths input `i` (int32, 1-D, non-negative), checked to sum to `total`.
fn lengths(l: &Locked<'_>, op: &str, i: usize, total: Option<usize>) -> Result<Vec<usize>> {
    let t = l.tensor(i)?;
    let name = l.input_name(i);
    let v = super::kit::int_vector(t)?.ok_or_else(|| {
        Error::type_error(format!(
            "{op}: LENGTHS ('{name}') must be a 1-D int32 tensor, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        ))
        .with_blob(name)
    })?;
    let out: Vec<usize> = v
        .iter()
        .map(|&x| {
            usize::try_from(x).map_err(|_| {
                Error::invalid_arg(format!("{op}: LENGTHS has a negative length {x}"))
                    .with_blob(name)
            })
        })
        .collect::<Result<_>>()?;
    let sum = lengths_total(op, name, &out)?;
    if let Some(total) = total {
        if sum != total {
            return Err(Error::invalid_arg(format!(
                "{op}: the lengths sum to {sum}, but there are {total} indices"
            ))
            .with_blob(name));
        }
    }
    Ok(out)
}

/// The sum of LENGTHS ('name'), checked.
fn lengths_total(op: &str, name: &str, lens: &[usize]) -> Result<usize> {
    lens.iter()
        .try_fold(0usize, |t, &n| t.checked_add(n))
        .ok_or_else(|| {
            crate::tensor::size_overflow(format!("{op}: the sum of LENGTHS ('{name}')"))
                .with_blob(name)
        })
}

/// The rows of a lengths op's output or gradient: `rows` rows shaped as
/// `like`'s rows (its dims after the first), checked.
fn rows_shape(rows: usize, like: &[usize]) -> Vec<usize> {
    let mut shape = vec![rows];
    shape.extend_from_slice(like.get(1..).unwrap_or(&[]));
    shape
}

/// (whether the op reads INDICES, whether it averages) of a lengths reducer.
fn lengths_kind(op: &str) -> (bool, bool) {
    (op.starts_with("Sparse"), op.contains("Mean"))
}

fn sls_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let (sparse, mean) = lengths_kind(op);
    let data = input::<T>(l, op, 0)?;
    if data.ndim() == 0 {
        return Err(Error::shape(format!(
            "{op}: DATA ('{}') must have at least one dim",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0)));
    }
    let rows = if sparse {
        index_rows(l, op, data.shape()[0], 1)?
    } else {
        crate::tensor::try_collect(0..data.shape()[0], "a kernel buffer")?
    };
    let lens = lengths(l, op, if sparse { 2 } else { 1 }, Some(rows.len()))?;
    let inner: usize = data.shape()[1..].iter().product();
    let shape = rows_shape(lens.len(), data.shape());
    let mut out = zeroed_vec::<T>(&shape, format_args!("{op}'s output"))?;
    let ds = dense(data);
    let mut k = 0;
    for (s, &n) in lens.iter().enumerate() {
        for &r in &rows[k..k + n] {
            for c in 0..inner {
                out[s * inner + c] += ds[r * inner + c];
            }
        }
        if mean && n > 0 {
            let d = T::of(n as f64);
            for v in &mut out[s * inner..(s + 1) * inner] {
                *v = *v / d;
            }
        }
        k += n;
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_sls(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| sls_t(&mut l, &op))
}

fn sls_grad_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let (_, mean) = lengths_kind(op);
    let dy = input::<T>(l, op, 0)?;
    let lens = lengths(l, op, 1, None)?;
    if dy.ndim() == 0 || dy.shape()[0] != lens.len() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have one row per length ({})",
            l.input_name(0),
            dy.shape(),
            lens.len()
        ))
        .with_blob(l.input_name(0)));
    }
    let inner: usize = dy.shape()[1..].iter().product();
    let total = lengths_total(op, l.input_name(1), &lens)?;
    let shape = rows_shape(total, dy.shape());
    let mut out = try_vec(
        checked_numel::<T>(&shape, format_args!("{op}'s output"))?,
        format_args!("{op}'s output ({} tensor of shape {shape:?})", T::DTYPE),
    )?;
    let g = dense(dy);
    for (s, &n) in lens.iter().enumerate() {
        let row = &g[s * inner..(s + 1) * inner];
        let d = T::of(n.max(1) as f64);
        for _ in 0..n {
            if mean {
                out.extend(row.iter().map(|&v| v / d));
            } else {
                out.extend_from_slice(row);
            }
        }
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_sls_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| sls_grad_t(&mut l, &op))
}

// -------------------------------------------- SparseLengthsWeightedSum --

const GRAD_ON_WEIGHTS: crate::operator::ArgDoc = arg!(
    "grad_on_weights",
    "bool",
    "false",
    "the gradient also gives SCALARS' gradient (the ...WithMainInputGradient op)"
);

/// SCALARS (input `i`): 1-D, one weight per position (`n`).
fn scalars<'l, T: Float>(l: &'l Locked<'_>, op: &str, i: usize, n: usize) -> Result<&'l ArrayD<T>> {
    let w = input::<T>(l, op, i)?;
    if w.ndim() != 1 || w.len() != n {
        let name = l.input_name(i);
        return Err(Error::shape(format!(
            "{op}: SCALARS ('{name}', shape {:?}) must be 1-D with one weight per index ({n})",
            w.shape()
        ))
        .with_blob(name));
    }
    Ok(w)
}

/// The rows of DATA (input 0) the positions read: INDICES (input 2) for
/// the sparse op, every row for the dense one.
fn weighted_rows(l: &Locked<'_>, op: &str, sparse: bool, idx_input: usize) -> Result<Vec<usize>> {
    let n = l.tensor(0)?.shape().first().copied().ok_or_else(|| {
        Error::shape(format!(
            "{op}: DATA ('{}') must have at least one dim",
            l.input_name(0)
        ))
        .with_blob(l.input_name(0))
    })?;
    if !sparse {
        return Ok(crate::tensor::try_collect(0..n, "a kernel buffer")?);
    }
    index_rows(l, op, n, idx_input)
}

fn wsls_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let sparse = op.starts_with("Sparse");
    let data = input::<T>(l, op, 0)?;
    let rows = weighted_rows(l, op, sparse, 2)?;
    let lens = lengths(l, op, if sparse { 3 } else { 2 }, Some(rows.len()))?;
    let w = dense(scalars::<T>(l, op, 1, rows.len())?);
    let inner: usize = data.shape()[1..].iter().product();
    let shape = rows_shape(lens.len(), data.shape());
    let mut out = zeroed_vec::<T>(&shape, format_args!("{op}'s output"))?;
    let ds = dense(data);
    let mut j = 0;
    for (s, &n) in lens.iter().enumerate() {
        let dst = &mut out[s * inner..(s + 1) * inner];
        for (&r, &wj) in rows[j..j + n].iter().zip(&w[j..j + n]) {
            for (o, &x) in dst.iter_mut().zip(&ds[r * inner..(r + 1) * inner]) {
                *o += wj * x;
            }
        }
        j += n;
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_wsls(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| wsls_t(&mut l, &op))
}

/// (SCALARS, dY, LENGTHS[, DATA[, INDICES]]) -> (dDATA or its values[,
/// dSCALARS]).
fn wsls_grad_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let with_main = op.contains("WithMainInput");
    let sparse = op.starts_with("Sparse");
    let dy = input::<T>(l, op, 1)?;
    let lens = lengths(l, op, 2, None)?;
    if dy.ndim() == 0 || dy.shape()[0] != lens.len() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have one row per length ({})",
            l.input_name(1),
            dy.shape(),
            lens.len()
        ))
        .with_blob(l.input_name(1)));
    }
    let total = lengths_total(op, l.input_name(2), &lens)?;
    let w = dense(scalars::<T>(l, op, 0, total)?);
    let inner: usize = dy.shape()[1..].iter().product();
    let shape = rows_shape(total, dy.shape());
    let mut d_data = try_vec(
        checked_numel::<T>(&shape, format_args!("{op}'s output"))?,
        format_args!("{op}'s output ({} tensor of shape {shape:?})", T::DTYPE),
    )?;
    let g = dense(dy);
    let mut j = 0;
    for (s, &n) in lens.iter().enumerate() {
        let row = &g[s * inner..(s + 1) * inner];
        for &wj in &w[j..j + n] {
            d_data.extend(row.iter().map(|&v| wj * v));
        }
        j += n;
    }
    let d_scalars = if with_main {
        let data = input::<T>(l, op, 3)?;
        if data.ndim() == 0 || data.shape()[1..] != dy.shape()[1..] {
            return Err(Error::shape(format!(
                "{op}: DATA ('{}', shape {:?}) must have dY's dims after the first ({:?})",
                l.input_name(3),
                data.shape(),
                &dy.shape()[1..]
            ))
            .with_blob(l.input_name(3)));
        }
        let rows = if sparse {
            index_rows(l, op, data.shape()[0], 4)?
        } else {
            crate::tensor::try_collect(0..data.shape()[0], "a kernel buffer")?
        };
        if rows.len() != total {
            return Err(Error::invalid_arg(format!(
                "{op}: the lengths sum to {total}, but there are {} {}",
                rows.len(),
                if sparse { "indices" } else { "rows of DATA" }
            ))
            .with_blob(l.input_name(2)));
        }
        let ds = dense(data);
        let mut out = try_vec(total, "the SCALARS gradient")?;
        let mut j = 0;
        for (s, &n) in lens.iter().enumerate() {
            let row = &g[s * inner..(s + 1) * inner];
            for &r in &rows[j..j + n] {
                let x = &ds[r * inner..(r + 1) * inner];
                out.push(
                    row.iter()
                        .zip(x)
                        .fold(T::of(0.0), |acc, (&a, &b)| acc + a * b),
                );
            }
            j += n;
        }
        Some(out)
    } else {
        None
    };
    l.set_output(0, T::wrap(array(&shape, d_data)?));
    if let Some(v) = d_scalars {
        l.set_output(1, T::wrap(array(&[total], v)?));
    }
    Ok(())
}

/// INDICES (input `i`, 1-D) checked against DATA's `n` rows.
fn index_rows(l: &Locked<'_>, op: &str, n: usize, i: usize) -> Result<Vec<usize>> {
    let (idx, idx_shape) = indices(l, op, i)?;
    if idx_shape.len() != 1 {
        return Err(Error::shape(format!(
            "{op}: INDICES ('{}', shape {idx_shape:?}) must be 1-D",
            l.input_name(i)
        ))
        .with_blob(l.input_name(i)));
    }
    checked_rows(op, &idx, n, false, l.input_name(i))
}

fn build_wsls_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 1, |l| wsls_grad_t(&mut l, &op))
}

// -------------------------------------------------- ScatterWeightedSum --

fn weight(l: &Locked<'_>, op: &str, i: usize) -> Result<f32> {
    let w = f32_in(l, op, i, "the weight")?;
    if w.len() != 1 {
        return Err(Error::shape(format!(
            "{op}: the weight ('{}', shape {:?}) must have one element",
            l.input_name(i),
            w.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(w.iter().copied().next().unwrap_or(0.0))
}

fn build_scatter_weighted_sum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "ScatterWeightedSum";
    let ni = ctx.num_inputs();
    if ni % 2 != 1 {
        return Err(ctx.bad_arg(format!(
            "{OP} takes (X0, W0, INDICES) and then (X, W) pairs, an odd number of inputs; got {ni}"
        )));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let x0 = f32_in(&l, OP, 0, "X0")?;
        if x0.ndim() == 0 {
            return Err(Error::shape(format!(
                "{OP}: X0 ('{}') must have at least one dim",
                l.input_name(0)
            ))
            .with_blob(l.input_name(0)));
        }
        let w0 = weight(&l, OP, 1)?;
        let (idx, _) = indices(&l, OP, 2)?;
        let rows = checked_rows(OP, &idx, x0.shape()[0], false, l.input_name(2))?;
        let inner: usize = x0.shape()[1..].iter().product();
        let mut out: Vec<f32> = crate::tensor::try_collect(x0.iter().copied(), "a kernel buffer")?;
        let shape = x0.shape().to_vec();
        let mut slices = Vec::new();
        for p in (3..ni).step_by(2) {
            let x = f32_in(&l, OP, p, "a slice")?;
            if x.len() != rows.len() * inner {
                return Err(Error::shape(format!(
                    "{OP}: '{}' (shape {:?}) must have one row of {inner} values per index ({} indices)",
                    l.input_name(p),
                    x.shape(),
                    rows.len()
                ))
                .with_blob(l.input_name(p)));
            }
            slices.push((
                x.iter().copied().collect::<Vec<f32>>(),
                weight(&l, OP, p + 1)?,
            ));
        }
        // Caffe2's order: every indexed row is scaled by W0 first (a
        // repeated index scales its row again), then each (X, W) pair adds
        // W * X[i] to row INDICES[i].
        for &r in &rows {
            for v in &mut out[r * inner..(r + 1) * inner] {
                *v *= w0;
            }
        }
        for (x, w) in &slices {
            for (i, &r) in rows.iter().enumerate() {
                for c in 0..inner {
                    out[r * inner + c] += w * x[i * inner + c];
                }
            }
        }
        let a = ArrayD::from_shape_vec(IxDyn(&shape), out)
            .map_err(|e| Error::internal(e.to_string()))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::tensor::Tensor;
    use crate::test_util::{f32s, get, i32s, i64s, int_arg, op, run, vals, ws_with};

    #[test]
    fn gather_and_sparse_lengths_sum_by_hand() {
        let data = Tensor::from_vec(&[3, 2], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let ws = ws_with(&[("d", data), ("i", i64s(&[2, 0, 2])), ("l", i32s(&[1, 2]))]);
        run(&ws, op("Gather", &["d", "i"], &["g"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "g")), vec![5., 6., 1., 2., 5., 6.]);
        run(
            &ws,
            op("SparseLengthsSum", &["d", "i", "l"], &["s"], vec![]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "s")), vec![5., 6., 6., 8.]);
        run(
            &ws,
            op("SparseLengthsSumGradient", &["s", "l"], &["v"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&ws, "v").shape(), &[3, 2]);
        assert_eq!(vals(&get(&ws, "v")), vec![5., 6., 6., 8., 6., 8.]);
        let bad = ws_with(&[
            ("d", Tensor::from_vec(&[1, 1], vec![0f32]).unwrap()),
            ("i", i64s(&[1])),
        ]);
        let e = run(&bad, op("Gather", &["d", "i"], &["g"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn sparse_lengths_weighted_sum_and_gradients_by_hand() {
        // DATA rows [1, 2], [3, 4], [5, 6]; positions (index, weight):
        // segment 0 = (2, 0.5); segment 1 = (0, 2), (2, -1).
        let ws = ws_with(&[
            ("d", f32s(&[3, 2], &[1., 2., 3., 4., 5., 6.])),
            ("w", f32s(&[3], &[0.5, 2., -1.])),
            ("i", i64s(&[2, 0, 2])),
            ("l", i32s(&[1, 2])),
            ("dy", f32s(&[2, 2], &[1., 10., 100., 1000.])),
        ]);
        let grad_on = || vec![int_arg("grad_on_weights", 1)];
        run(
            &ws,
            op(
                "SparseLengthsWeightedSum",
                &["d", "w", "i", "l"],
                &["y"],
                grad_on(),
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "y")), vec![2.5, 3., -3., -2.]);
        run(
            &ws,
            op(
                "SparseLengthsWeightedSumGradient",
                &["w", "dy", "l"],
                &["v"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "v").shape(), &[3, 2]);
        assert_eq!(
            vals(&get(&ws, "v")),
            vec![0.5, 5., 200., 2000., -100., -1000.]
        );
        run(
            &ws,
            op(
                "SparseLengthsWeightedSumWithMainInputGradient",
                &["w", "dy", "l", "d", "i"],
                &["v2", "dw"],
                grad_on(),
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "v2")), vals(&get(&ws, "v")));
        // dw[j] = dY[segment of j] . DATA[INDICES[j]]
        assert_eq!(vals(&get(&ws, "dw")), vec![65., 2100., 6500.]);
        // Newer Caffe2's names give the same (INDICES passed, not read).
        let newer = "SparseLengthsIndicesInGradientWeightedSum";
        run(
            &ws,
            op(
                &format!("{newer}Gradient"),
                &["w", "dy", "l", "i"],
                &["v3"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "v3")), vals(&get(&ws, "v")));
        let with_main = format!("{newer}WithMainInputGradient");
        run(
            &ws,
            op(
                &with_main,
                &["w", "dy", "l", "d", "i"],
                &["v4", "dw4"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dw4")), vec![65., 2100., 6500.]);
        run(
            &ws,
            op(
                "SparseLengthsIndicesInGradientSumGradient",
                &["dy", "l", "i"],
                &["v5"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(
            vals(&get(&ws, "v5")),
            vec![1., 10., 100., 1000., 100., 1000.]
        );
        // The dense op weighs DATA's own rows.
        run(
            &ws,
            op("LengthsWeightedSum", &["d", "w", "l"], &["z"], vec![]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![0.5, 1., 1., 2.]);
        run(
            &ws,
            op(
                "LengthsWeightedSumWithMainInputGradient",
                &["w", "dy", "l", "d"],
                &["dd", "dw2"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(
            vals(&get(&ws, "dd")),
            vec![0.5, 5., 200., 2000., -100., -1000.]
        );
        assert_eq!(vals(&get(&ws, "dw2")), vec![21., 4300., 6500.]);
        // One weight per index, lengths summing to the indices.
        let short = ws_with(&[
            ("d", f32s(&[3, 2], &[0.; 6])),
            ("w", f32s(&[2], &[1., 1.])),
            ("i", i64s(&[2, 0, 2])),
            ("l", i32s(&[1, 2])),
        ]);
        let e = run(
            &short,
            op(
                "SparseLengthsWeightedSum",
                &["d", "w", "i", "l"],
                &["y"],
                vec![],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert!(e.to_string().contains("SCALARS"), "{e}");
        let e = run(
            &short,
            op(
                "SparseLengthsWeightedSum",
                &["d", "w", "i", "w"],
                &["y"],
                vec![],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
    }
}

// ------------------------------------------- fused 8-bit rowwise tensors --
//
// Caffe2's layout: each row is its values quantized to one byte each, then
// the row's scale and bias as little-endian float32s (8 bytes).

/// Shape inference of the conversions: input 0 of dtype `from`, its last
/// dim changed by `delta` (staying >= 0), dtype `to`.
fn fused_shape(
    ins: &[Option<ShapeInfo>],
    from: DataType,
    delta: i64,
    to: DataType,
) -> Option<ShapeInfo> {
    let x = crate::shapes::rules::known(ins, 0)?;
    let last = *x.dims.last()?;
    if x.dtype != from || last + delta < 0 {
        return None;
    }
    let mut dims = x.dims.clone();
    *dims.last_mut()? = last + delta;
    Some(ShapeInfo::new(dims, to))
}

/// Quantizes one row into `out` (`row.len() + 8` bytes).
fn quantize_row(row: &[f32], out: &mut [u8]) {
    let (min, max) = row
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    let (min, range) = if row.is_empty() {
        (0.0, 0.0)
    } else {
        (min, max - min)
    };
    let inverse = 255.0f32 / (range + 1e-8f32);
    let n = row.len();
    for (o, &x) in out[..n].iter_mut().zip(row) {
        // Round half to even, as C's lrintf; the value lies in [0, 255].
        *o = ((x - min) * inverse).round_ties_even().clamp(0.0, 255.0) as u8;
    }
    out[n..n + 4].copy_from_slice(&(range / 255.0f32).to_le_bytes());
    out[n + 4..n + 8].copy_from_slice(&min.to_le_bytes());
}

/// De-quantizes one fused row (values, scale, bias) into `out`.
fn dequantize_row(row: &[u8], out: &mut [f32]) {
    let n = row.len() - 8;
    let f = |at: usize| f32::from_le_bytes([row[at], row[at + 1], row[at + 2], row[at + 3]]);
    let (scale, bias) = (f(n), f(n + 4));
    for (o, &q) in out.iter_mut().zip(&row[..n]) {
        *o = f32::from(q) * scale + bias;
    }
}

fn build_to_fused8(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let op = "FloatToFused8BitRowwiseQuantized";
        let name = l.input_name(0).to_string();
        let t = l.tensor(0)?;
        if t.dtype() != DataType::Float {
            return Err(crate::tensor::unsupported_dtype(t.dtype())
                .with_op(op, None)
                .with_blob(&name));
        }
        let a = t.array::<f32>()?;
        if a.ndim() == 0 {
            return Err(Error::shape(format!(
                "{op}: the input must have at least one dim, got a scalar"
            ))
            .with_blob(&name));
        }
        if let Some(x) = a.iter().find(|x| !x.is_finite()) {
            return Err(Error::invalid_arg(format!(
                "{op}: cannot quantize the non-finite value {x}"
            ))
            .with_blob(&name));
        }
        let cols = a.shape()[a.ndim() - 1];
        let flat = crate::tensor::copy_array(a.view())?;
        let flat = flat
            .as_slice()
            .ok_or_else(|| Error::internal("a copied array is contiguous"))?;
        let rows: usize = a.shape()[..a.ndim() - 1].iter().product();
        let mut out =
            crate::tensor::default_buffer::<u8>(rows * (cols + 8), "a fused 8-bit tensor")?;
        for r in 0..rows {
            quantize_row(
                &flat[r * cols..(r + 1) * cols],
                &mut out[r * (cols + 8)..(r + 1) * (cols + 8)],
            );
        }
        let mut shape = a.shape().to_vec();
        *shape.last_mut().expect("at least one dim") += 8;
        let y = Tensor::from_vec(&shape, out)?;
        l.set_output(0, y);
        Ok(true)
    }))
}

/// A fused uint8 input with at least one dim of at least 8 columns.
fn fused_input<'a>(l: &'a Locked<'_>, op: &str, i: usize) -> Result<&'a ArrayD<u8>> {
    let name = l.input_name(i);
    let t = l.tensor(i)?;
    if t.dtype() != DataType::Uint8 {
        return Err(Error::type_error(format!(
            "{op}: '{name}' must be a uint8 tensor from FloatToFused8BitRowwiseQuantized, got {}",
            t.dtype()
        ))
        .with_blob(name));
    }
    let a = t.array::<u8>()?;
    if a.ndim() == 0 || a.shape()[a.ndim() - 1] < 8 {
        return Err(Error::shape(format!(
            "{op}: '{name}' (shape {:?}) must have rows of at least 8 bytes (the scale and bias)",
            a.shape()
        ))
        .with_blob(name));
    }
    Ok(a)
}

fn build_from_fused8(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let a = fused_input(&l, "Fused8BitRowwiseQuantizedToFloat", 0)?;
        let cols = a.shape()[a.ndim() - 1];
        let rows: usize = a.shape()[..a.ndim() - 1].iter().product();
        let flat = crate::tensor::copy_array(a.view())?;
        let flat = flat
            .as_slice()
            .ok_or_else(|| Error::internal("a copied array is contiguous"))?;
        let n = cols - 8;
        let mut out = crate::tensor::default_buffer::<f32>(rows * n, "a de-quantized tensor")?;
        for r in 0..rows {
            dequantize_row(
                &flat[r * cols..(r + 1) * cols],
                &mut out[r * n..(r + 1) * n],
            );
        }
        let mut shape = a.shape().to_vec();
        *shape.last_mut().expect("at least one dim") = n;
        let y = Tensor::from_vec(&shape, out)?;
        l.set_output(0, y);
        Ok(true)
    }))
}

fn build_gather_fused8(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let op = "GatherFused8BitRowwise";
        let a = fused_input(&l, op, 0)?;
        if a.ndim() != 2 || a.shape()[1] <= 8 {
            let name = l.input_name(0);
            return Err(Error::shape(format!(
                "{op}: DATA ('{name}', shape {:?}) must be a matrix with more than 8 columns",
                a.shape()
            ))
            .with_blob(name));
        }
        let (n_rows, cols) = (a.shape()[0], a.shape()[1]);
        let rows = index_rows(&l, op, n_rows, 1)?;
        let flat = crate::tensor::copy_array(a.view())?;
        let flat = flat
            .as_slice()
            .ok_or_else(|| Error::internal("a copied array is contiguous"))?;
        let n = cols - 8;
        let mut out = crate::tensor::default_buffer::<f32>(
            rows.len() * n,
            "GatherFused8BitRowwise's output",
        )?;
        for (i, &r) in rows.iter().enumerate() {
            dequantize_row(
                &flat[r * cols..(r + 1) * cols],
                &mut out[i * n..(i + 1) * n],
            );
        }
        let y = Tensor::from_vec(&[rows.len(), n], out)?;
        l.set_output(0, y);
        Ok(true)
    }))
}
