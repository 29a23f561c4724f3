//! Reshapes and reductions (issue 14): Reshape, Flatten, FlattenToVec,
//! ExpandDims, Squeeze, ResizeLike, LengthsToShape, ReduceSum, ReduceMean,
//! ReduceMax, ReduceMin, ReduceL1, ReduceL2, ReduceFrontSum/Mean/Max,
//! ReduceBackSum/Mean/Max and their gradient ops; SumReduceLike; the
//! row-wise DotProduct, CosineSimilarity and DotProductWithPadding and
//! their gradients; SumElements, Mean (of several inputs) and Moments
//! (mean and variance over axes) and their gradients.
//!
//! The reshapes take any dtype and copy (Caffe2 shared the buffer); the
//! reductions take float32 or float64 (ReduceSum, ReduceMax and ReduceMin
//! int32 and int64 too). Which gradient ops an op's gradient takes is
//! decided in `ferrocaffe/gradients.py`.

#![allow(clippy::result_large_err)]

use super::kernel;
use super::kit::{abs, array, by_float, canonical_axis, dense, float_kernel, input, sign};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::{Float, Number};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{map_array, DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn, Zip};

fn in_place_0_0(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

pub fn schemas() -> Vec<OpSchema> {
    const REDUCE_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axes",
            "ints",
            "all dims",
            "the dims to reduce (negative counts from the end)"
        ),
        arg!("keepdims", "int", "1", "keep the reduced dims with size 1"),
    ];
    const SUM_REDUCE_LIKE_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "axis",
            "int",
            "-1",
            "the dim of A where B's dims start (-1: B aligned to A's end)"
        ),
        arg!(
            "axis_str",
            "string",
            "\"\"",
            "the axis as one letter of `order` (not with axis)"
        ),
        arg!(
            "order",
            "string",
            "\"NCHW\"",
            "the dim letters that axis_str is looked up in"
        ),
    ];
    const PADDING_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "pad_value",
            "float",
            "0.0",
            "the value the shorter row is padded with"
        ),
        arg!(
            "replicate",
            "bool",
            "false",
            "repeat the shorter row instead of padding it"
        ),
    ];
    const FRONT_BACK_ARGS: &[crate::operator::ArgDoc] = &[arg!(
        "num_reduce_dim",
        "int",
        "1",
        "how many leading (Front) or trailing (Back) dims to reduce"
    )];
    let reduce = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_reduce)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(REDUCE_ARGS)
            .infer(reduce_infer)
            .doc(doc)
    };
    let reduce_grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_reduce_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(REDUCE_ARGS)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 1, n)))
            .doc(doc)
    };
    let fb = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_front_back)
            .inputs(1, 2)
            .outputs(1, 1)
            .args(FRONT_BACK_ARGS)
            .doc(doc)
    };
    let fb_grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_front_back_grad)
            .inputs(2, 3)
            .outputs(1, 1)
            .args(FRONT_BACK_ARGS)
            .doc(doc)
    };
    vec![
        OpSchema::new("Reshape", build_reshape)
            .inputs(1, 2)
            .outputs(1, 2)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("shape", "ints", "(none)", "the new shape: 0 copies the input's dim, one -1 is inferred; or give it as the second input")])
            .doc("Outputs (the data with a new shape, old_shape: the input's dims as int64). The shape comes from the `shape` argument or the second input (int32 or int64), not both."),
        OpSchema::new("Flatten", build_flatten)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("axis", "int", "1", "the 2-D output is (prod of dims before axis, prod of the rest)")])
            .doc("Reshapes the input to 2-D at `axis`."),
        OpSchema::new("FlattenToVec", build_flatten_to_vec)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc("Reshapes the input to 1-D."),
        OpSchema::new("ExpandDims", build_expand_squeeze)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("dims", "ints", "(required)", "the output dims (sorted, deduplicated, >= 0) that are new dims of size 1")])
            .doc("Inserts dims of size 1 at `dims`."),
        OpSchema::new("Squeeze", build_expand_squeeze)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(&[arg!("dims", "ints", "[]", "the input dims (each of size 1, >= 0) to remove")])
            .doc("Removes the dims `dims`, each of which must have size 1."),
        OpSchema::new("LengthsToShape", build_lengths_to_shape)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, _, _| Ok(vec![Some(crate::operator::ShapeInfo::new(vec![2], DataType::Int32))]))
            .doc("The shape [len(lengths), lengths[0]] (int32) of 1-D int32 lengths that are all equal (a shape for Reshape); [0, 0] for no lengths."),
        OpSchema::new("ResizeLike", build_resize_like)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .infer(|_, ins, _| {
                Ok(vec![match (&ins[0], &ins[1]) {
                    (Some(x), Some(like)) => Some(crate::operator::ShapeInfo::new(like.dims.clone(), x.dtype)),
                    _ => None,
                }])
            })
            .doc("Y = X reshaped to the shape of the second input (same number of elements)."),
        reduce("ReduceSum", "Sums the input over `axes` (float32, float64, int32 or int64; integers wrap)."),
        reduce("ReduceMean", "Averages the input over `axes` (float32 or float64)."),
        reduce_grad("ReduceSumGradient", "Gradient of ReduceSum: inputs (dY, X, Y), dX = dY broadcast over the reduced dims."),
        reduce_grad("ReduceMeanGradient", "Gradient of ReduceMean: inputs (dY, X, Y), dX = dY / count broadcast over the reduced dims."),
        reduce("ReduceMax", "The maximum of the input over `axes` (int32, int64, float32 or float64; -inf, or the type's lowest integer, over no elements; a NaN wins)."),
        reduce("ReduceMin", "The minimum of the input over `axes` (int32, int64, float32 or float64; inf, or the type's highest integer, over no elements; a NaN wins)."),
        reduce("ReduceL1", "The L1 norm (sum of absolute values) of the input over `axes` (float32 or float64)."),
        reduce("ReduceL2", "The L2 norm (square root of the sum of squares) of the input over `axes` (float32 or float64)."),
        reduce_grad("ReduceMaxGradient", "Gradient of ReduceMax: inputs (dY, X, Y); every element equal to its maximum gets dY (ties each get it), the others 0."),
        reduce_grad("ReduceMinGradient", "Gradient of ReduceMin: inputs (dY, X, Y); every element equal to its minimum gets dY (ties each get it), the others 0."),
        reduce_grad("ReduceL1Gradient", "Gradient of ReduceL1: inputs (dY, X, Y), dX = dY * sign(X) (0 at 0)."),
        reduce_grad("ReduceL2Gradient", "Gradient of ReduceL2: inputs (dY, X, Y), dX = dY * X / Y (0 where the norm Y is 0)."),
        fb("ReduceFrontSum", "Sums over the first num_reduce_dim dims; an optional int32 lengths input (one per output element) sums only the first lengths[j] of them."),
        fb("ReduceBackSum", "Sums over the last num_reduce_dim dims; an optional int32 lengths input (one per output element) sums only the first lengths[i] of them."),
        fb("ReduceFrontMean", "Averages over the first num_reduce_dim dims (or the first lengths[j] of them, with a lengths input; 0 for a length of 0)."),
        fb("ReduceBackMean", "Averages over the last num_reduce_dim dims (or the first lengths[i] of them, with a lengths input; 0 for a length of 0)."),
        OpSchema::new("ReduceFrontMax", build_front_back_max)
            .inputs(1, 2)
            .outputs(1, 1)
            .args(FRONT_BACK_ARGS)
            .doc("The maximum over the first num_reduce_dim dims (or the first lengths[j] of them, with a lengths input; -inf for a length of 0)."),
        OpSchema::new("ReduceBackMax", build_front_back_max)
            .inputs(1, 2)
            .outputs(1, 1)
            .args(FRONT_BACK_ARGS)
            .doc("The maximum over the last num_reduce_dim dims (or the first lengths[i] of them, with a lengths input; -inf for a length of 0)."),
        OpSchema::new("ReduceFrontMaxGradient", build_front_back_max)
            .inputs(3, 4)
            .outputs(1, 1)
            .args(FRONT_BACK_ARGS)
            .doc("Gradient of ReduceFrontMax: inputs (dY, X, Y[, lengths]); each counted element equal to its maximum gets dY."),
        OpSchema::new("ReduceBackMaxGradient", build_front_back_max)
            .inputs(3, 4)
            .outputs(1, 1)
            .args(FRONT_BACK_ARGS)
            .doc("Gradient of ReduceBackMax: inputs (dY, X, Y[, lengths]); each counted element equal to its maximum gets dY."),
        fb_grad("ReduceFrontSumGradient", "Gradient of ReduceFrontSum: inputs (dY, X[, lengths]), dX = dY repeated over the reduced elements counted."),
        fb_grad("ReduceBackSumGradient", "Gradient of ReduceBackSum: inputs (dY, X[, lengths]), dX = dY repeated over the reduced elements counted."),
        fb_grad("ReduceFrontMeanGradient", "Gradient of ReduceFrontMean: inputs (dY, X[, lengths]), dX = dY / count over the reduced elements counted."),
        fb_grad("ReduceBackMeanGradient", "Gradient of ReduceBackMean: inputs (dY, X[, lengths]), dX = dY / count over the reduced elements counted."),
        OpSchema::new("SumReduceLike", build_sum_reduce_like)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(SUM_REDUCE_LIKE_ARGS)
            .ignores(&[arg!("broadcast", "int", "0", "Caffe2's tests pass broadcast=1; the op always broadcasts; accepted and ignored")])
            .infer(|_, ins, _| {
                use crate::shapes::rules::known;
                Ok(vec![match (known(ins, 0), known(ins, 1)) {
                    (Some(a), Some(b)) => Some(crate::operator::ShapeInfo::new(b.dims.clone(), a.dtype)),
                    _ => None,
                }])
            })
            .doc("C = A (float32 or float64) summed down to the shape of B: B's dims sit in A from `axis` (default: at A's end), B's leading and trailing 1s are free; a B of one element gets the sum of all of A. Caffe2 uses it for the gradients of legacy broadcasting; it has no gradient."),
        OpSchema::new("DotProduct", build_dot_product)
            .inputs(2, 2)
            .outputs(1, 1)
            .infer(rows_infer)
            .doc("Z[i] = the dot product of row i of X and of Y (same shape, float32 or float64): the rows are the first dim, each the rest of the tensor (so 1-D inputs give X * Y elementwise)."),
        OpSchema::new("DotProductGradient", build_dot_product)
            .inputs(3, 3)
            .outputs(2, 2)
            .infer(pair_grad_infer)
            .doc("Gradient of DotProduct: inputs (X, Y, dZ), outputs (dX = dZ[i] * Y[i], dY = dZ[i] * X[i]) row by row."),
        OpSchema::new("CosineSimilarity", build_cosine)
            .inputs(2, 2)
            .outputs(1, 1)
            .infer(rows_infer)
            .doc("Z[i] = the cosine similarity of row i of X and of Y (same shape, float32 or float64; rows as DotProduct's): x.y / sqrt(max(|x|^2, 1e-12) max(|y|^2, 1e-12))."),
        OpSchema::new("CosineSimilarityGradient", build_cosine)
            .inputs(3, 3)
            .outputs(2, 2)
            .infer(pair_grad_infer)
            .doc("Gradient of CosineSimilarity: inputs (X, Y, dZ), outputs (dX, dY)."),
        OpSchema::new("DotProductWithPadding", build_dot_padded)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(PADDING_ARGS)
            .infer(rows_infer)
            .doc("Z[i] = the dot product of row i of X and of Y (the same number of dims and rows, float32 or float64), the shorter row padded with pad_value, or with replicate repeated, to the longer's length."),
        OpSchema::new("DotProductWithPaddingGradient", build_dot_padded)
            .inputs(3, 3)
            .outputs(2, 2)
            .args(PADDING_ARGS)
            .infer(pair_grad_infer)
            .doc("Gradient of DotProductWithPadding: inputs (X, Y, dZ), outputs (dX, dY)."),
        OpSchema::new("SumElements", build_sum_elements)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!("average", "bool", "0", "divide the sum by the number of elements")])
            .doc("The sum (or with average the mean) of every element of X, a 0-dim tensor (float32 or float64)."),
        OpSchema::new("SumElementsGradient", build_sum_elements_grad)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(&[arg!("average", "bool", "0", "SumElements' average")])
            .doc("Gradient of SumElements: inputs (X, dY) with dY one element, output dX of X's shape filled with dY (divided by X's size with average)."),
        OpSchema::new("Mean", build_mean)
            .inputs(1, usize::MAX)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_0))
            .doc("The elementwise mean of its inputs, all of one shape and one float dtype."),
        OpSchema::new("MeanGradient", build_mean_grad)
            .inputs(1, 1)
            .outputs(1, usize::MAX)
            .doc("Gradient of Mean: input dY, outputs each input's gradient, dY / the number of inputs."),
        OpSchema::new("Moments", build_moments)
            .inputs(1, 1)
            .outputs(2, 2)
            .args(REDUCE_ARGS)
            .doc("The mean and (biased) variance of X over `axes` (all dims when absent): outputs (mean, variance), float32 or float64."),
        OpSchema::new("MomentsGradient", build_moments_grad)
            .inputs(4, 4)
            .outputs(1, 1)
            .args(REDUCE_ARGS)
            .doc("Gradient of Moments: inputs (dmean, dvariance, X, mean), output dX = (dmean + 2 dvariance (X - mean)) / count."),
    ]
}

// ------------------------------------------------------------- reshapes --

fn reshaped_of<T: Element>(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let v: Vec<T> = crate::tensor::try_collect(a.iter().cloned(), "a kernel buffer")?;
    let r = ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::internal(e.to_string()))?;
    Ok(T::wrap(r))
}

/// `t` with the new shape `shape` (same element count, checked by callers).
fn reshaped(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    crate::with_match_dtype!(t.dtype(), |T| reshaped_of::<T>(t, shape),
        else other => Err(crate::tensor::unsupported_dtype(other)))
}

/// Sets output 0 to input 0 with `shape`.
fn set_reshaped(l: &mut Locked<'_>, shape: &[usize]) -> Result<()> {
    let out = reshaped(l.tensor(0)?, shape)?;
    l.set_output(0, out);
    Ok(())
}

/// Caffe2's shape rules: 0 copies the input's dim (a 0 past the input's
/// dims stays 0, and so does every 0 when the input is empty), one -1 is
/// inferred (0 for an empty input when the other dims multiply to 0).
fn resolve_shape(op: &str, want: &[i64], old: &[usize], blob: &str) -> Result<Vec<usize>> {
    let total: usize = old.iter().product();
    // Caffe2's documented rule: "When the tensor is empty, dimension of 0
    // will remain to be 0" ([4, 0] reshaped to [0, -1] is [0, 0]).
    let copy_zeros = total != 0;
    let mut out = Vec::with_capacity(want.len());
    let mut infer = None;
    for (i, &d) in want.iter().enumerate() {
        match d {
            -1 => {
                if infer.replace(i).is_some() {
                    return Err(Error::invalid_arg(format!(
                        "{op}: argument `shape` has more than one missing dimension: {want:?}"
                    ))
                    .with_blob(blob));
                }
                out.push(1);
            }
            // 0 copies the input's dim; past the input's dims it is a 0 (Caffe2).
            0 if copy_zeros => out.push(old.get(i).copied().unwrap_or(0)),
            0 => out.push(0),
            d if d > 0 => out.push(d as usize),
            d => {
                return Err(Error::invalid_arg(format!(
                    "{op}: the new shape {want:?} has a negative dim {d} other than -1"
                ))
                .with_blob(blob))
            }
        }
    }
    // The new shape is the user's (an argument or an input): one whose
    // size overflows is refused as such, not multiplied (Caffe2's int64
    // product wrapped).
    let known = crate::tensor::checked_numel::<u8>(&out, "").map_err(|_| {
        Error::invalid_arg(format!(
            "{op}: the new shape {want:?} has too many elements (more than any tensor can hold)"
        ))
        .with_blob(blob)
    })?;
    if let Some(i) = infer {
        if known == 0 && total == 0 {
            // An empty input: the missing dim is 0 too (Caffe2).
            out[i] = 0;
            return Ok(out);
        }
        if known == 0 || total % known != 0 {
            return Err(Error::shape(format!(
                "{op}: cannot infer the -1 of {want:?} for an input of shape {old:?} ({total} elements)"
            ))
            .with_blob(blob));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(Error::shape(format!(
            "{op}: the new shape {want:?} has {known} elements, the input {old:?} has {total}"
        ))
        .with_blob(blob));
    }
    Ok(out)
}

fn shape_input(l: &Locked<'_>, op: &str, i: usize) -> Result<Vec<i64>> {
    let t = l.tensor(i)?;
    super::kit::int_vector(t)?.ok_or_else(|| {
        let name = l.input_name(i);
        Error::type_error(format!(
            "{op}: the new shape ('{name}') must be a 1-D int32 or int64 tensor, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        ))
        .with_blob(name)
    })
}

fn build_reshape(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let arg = ctx.args.ints("shape")?;
    let two_in = ctx.num_inputs() == 2;
    match (&arg, two_in) {
        (Some(_), true) => {
            return Err(ctx.bad_arg(
                "new shape is specified by the input blob, do not pass in the argument `shape`",
            ))
        }
        (None, false) => {
            return Err(
                ctx.bad_arg("argument `shape` is missing (or give the shape as a second input)")
            )
        }
        _ => {}
    }
    let old_out = ctx.num_outputs() == 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let want = match &arg {
            Some(a) => a.clone(),
            None => shape_input(&l, "Reshape", 1)?,
        };
        let old = l.tensor(0)?.shape().to_vec();
        let name = l.input_name(0).to_string();
        let new = resolve_shape("Reshape", &want, &old, &name)?;
        set_reshaped(&mut l, &new)?;
        if old_out {
            let dims: Vec<i64> =
                crate::tensor::try_collect(old.iter().map(|&d| d as i64), "a kernel buffer")?;
            let n = dims.len();
            let t = ArrayD::from_shape_vec(IxDyn(&[n]), dims)
                .map_err(|e| Error::internal(e.to_string()))?;
            l.set_output(1, Tensor::from(t));
        }
        Ok(true)
    }))
}

fn build_flatten(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = l.tensor(0)?.shape().to_vec();
        let ax = canonical_axis("Flatten", "axis", axis, shape.len(), l.input_name(0))?;
        let new = [shape[..ax].iter().product(), shape[ax..].iter().product()];
        set_reshaped(&mut l, &new)?;
        Ok(true)
    }))
}

fn build_flatten_to_vec(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let n = l.tensor(0)?.numel();
        set_reshaped(&mut l, &[n])?;
        Ok(true)
    }))
}

fn build_expand_squeeze(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let expand = ctx.op_type() == "ExpandDims";
    let mut dims = ctx.args.ints("dims")?.unwrap_or_default();
    dims.sort_unstable();
    dims.dedup();
    if expand && dims.is_empty() {
        return Err(ctx.bad_arg("argument `dims` is required"));
    }
    if let Some(&d) = dims.first() {
        if d < 0 {
            return Err(ctx.bad_arg(format!("dimension must be non-negative, got dims {dims:?}")));
        }
    }
    let dims: Vec<usize> =
        crate::tensor::try_collect(dims.into_iter().map(|d| d as usize), "a kernel buffer")?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let old = l.tensor(0)?.shape().to_vec();
        let name = l.input_name(0).to_string();
        let new = if expand {
            let mut s = old.clone();
            for &d in &dims {
                if d > s.len() {
                    return Err(Error::invalid_arg(format!(
                        "{op}: dim {d} is out of range for an output of {} dims (input shape {old:?}, dims {dims:?})",
                        s.len() + 1
                    ))
                    .with_blob(&name));
                }
                s.insert(d, 1);
            }
            s
        } else {
            for &d in &dims {
                if d >= old.len() || old[d] != 1 {
                    return Err(Error::invalid_arg(format!(
                        "{op}: dimension {d} of the input {old:?} is not 1 (dims {dims:?})"
                    ))
                    .with_blob(&name));
                }
            }
            old.iter()
                .enumerate()
                .filter(|(i, _)| !dims.contains(i))
                .map(|(_, &v)| v)
                .collect()
        };
        set_reshaped(&mut l, &new)?;
        Ok(true)
    }))
}

fn build_lengths_to_shape(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let t = l.tensor(0)?;
        let name = l.input_name(0);
        let lengths = match t {
            Tensor::I32(a) if a.ndim() == 1 => a,
            _ => {
                return Err(Error::type_error(format!(
                    "LengthsToShape: the lengths ('{name}') must be a 1-D int32 tensor, got {} of shape {:?}",
                    t.dtype(),
                    t.shape()
                ))
                .with_blob(name))
            }
        };
        let first = lengths.first().copied().unwrap_or(0);
        if let Some(other) = lengths.iter().find(|&&v| v != first) {
            return Err(Error::invalid_arg(format!(
                "LengthsToShape: all lengths must be the same, got {first} and {other}"
            ))
            .with_blob(name));
        }
        let n = i32::try_from(lengths.len()).map_err(|_| {
            Error::invalid_arg(format!(
                "LengthsToShape: {} lengths do not fit an int32 shape",
                lengths.len()
            ))
            .with_blob(name)
        })?;
        let out = ArrayD::from_shape_vec(IxDyn(&[2]), vec![n, first])
            .map_err(|e| Error::internal(e.to_string()))?;
        l.set_output(0, Tensor::from(out));
        Ok(true)
    }))
}

fn build_resize_like(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let like = l.tensor(1)?.shape().to_vec();
        let n = l.tensor(0)?.numel();
        if like.iter().product::<usize>() != n {
            return Err(Error::shape(format!(
                "ResizeLike: '{}' has {n} elements, '{}' has shape {like:?}",
                l.input_name(0),
                l.input_name(1)
            ))
            .with_blob(l.input_name(1)));
        }
        set_reshaped(&mut l, &like)?;
        Ok(true)
    }))
}

// ----------------------------------------------------------- reductions --

/// What a `Reduce*` op (and its gradient op) computes over the reduced
/// elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reducer {
    Sum,
    Mean,
    Max,
    Min,
    L1,
    L2,
}

impl Reducer {
    fn of(op: &str) -> Result<Reducer> {
        Ok(match op.strip_suffix("Gradient").unwrap_or(op) {
            "ReduceSum" => Reducer::Sum,
            "ReduceMean" => Reducer::Mean,
            "ReduceMax" => Reducer::Max,
            "ReduceMin" => Reducer::Min,
            "ReduceL1" => Reducer::L1,
            "ReduceL2" => Reducer::L2,
            _ => return Err(Error::internal(format!("{op} is not a Reduce op"))),
        })
    }

    /// The dtypes the forward op takes: ReduceSum (wrapping), ReduceMax and
    /// ReduceMin also take int32 and int64, as Caffe2's.
    fn dtypes(self) -> &'static [DataType] {
        match self {
            Reducer::Sum | Reducer::Max | Reducer::Min => DataType::ARITH,
            _ => DataType::FLOATS,
        }
    }

    fn extremum(self) -> bool {
        matches!(self, Reducer::Max | Reducer::Min)
    }
}

/// A type error: input `i` of `op` is none of `allowed`.
fn dtype_error(l: &Locked<'_>, op: &str, i: usize, got: DataType, allowed: &[DataType]) -> Error {
    let name = l.input_name(i);
    Error::type_error(format!(
        "{op}: input {i} ('{name}') must be a {} tensor, got {got}",
        crate::tensor::dtype_choice(allowed)
    ))
    .with_blob(name)
}

/// The `axes` argument; `None` (every dim) when absent or empty, as Caffe2.
fn axes_arg(args: &crate::args::Args<'_>) -> Result<Option<Vec<i64>>> {
    Ok(args.ints("axes")?.filter(|a| !a.is_empty()))
}

/// The reduced dims (sorted, deduplicated) of a `ndim`-dim input.
fn reduce_axes(op: &str, axes: &Option<Vec<i64>>, ndim: usize, blob: &str) -> Result<Vec<bool>> {
    let mut red = vec![axes.is_none(); ndim];
    for &a in axes.iter().flatten() {
        let n = ndim as i64;
        let c = if a < 0 { a + n } else { a };
        if c < 0 || c >= n {
            return Err(Error::invalid_arg(format!(
                "{op}: axis {a} is out of range for an input of {ndim} dims"
            ))
            .with_blob(blob));
        }
        red[c as usize] = true;
    }
    Ok(red)
}

/// The output shape with the reduced dims kept as 1.
fn kept_shape(shape: &[usize], red: &[bool]) -> Vec<usize> {
    shape
        .iter()
        .zip(red)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect()
}

/// Input 0 of a Reduce op, its reduced dims and the output shape.
fn reduce_input<'l, T: Element>(
    l: &'l Locked<'_>,
    op: &str,
    axes: &Option<Vec<i64>>,
    keep: bool,
) -> Result<(&'l ArrayD<T>, Vec<bool>, Vec<usize>)> {
    let x = input::<T>(l, op, 0)?;
    let red = reduce_axes(op, axes, x.ndim(), l.input_name(0))?;
    let out = reduced_shape(x.shape(), &red, keep);
    Ok((x, red, out))
}

/// How many elements each output of a reduction of `shape` over `red` sums.
fn reduced_count(shape: &[usize], red: &[bool]) -> usize {
    shape
        .iter()
        .zip(red)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product()
}

/// The output shape: the reduced dims kept as 1 (`keep`) or dropped.
fn reduced_shape(shape: &[usize], red: &[bool], keep: bool) -> Vec<usize> {
    if keep {
        return kept_shape(shape, red);
    }
    shape
        .iter()
        .zip(red)
        .filter(|(_, &r)| !r)
        .map(|(&d, _)| d)
        .collect()
}

/// `x` folded with `f(acc, v)` from `init` over the dims `red` marks, which
/// stay with size 1. `f` must be associative (each dim is folded in turn).
fn fold_reduced<T: Element>(
    x: ndarray::ArrayViewD<'_, T>,
    red: &[bool],
    init: T,
    f: impl Fn(&T, &T) -> T,
) -> Result<ArrayD<T>> {
    let mut y: Option<ArrayD<T>> = None;
    for ax in (0..red.len()).rev() {
        if red[ax] {
            let next = match &y {
                Some(y) => crate::tensor::fold_axis_array(y.view(), ax, init.clone(), &f)?,
                None => crate::tensor::fold_axis_array(x.view(), ax, init.clone(), &f)?,
            };
            y = Some(next);
        }
    }
    match y {
        Some(y) => Ok(y),
        None => crate::tensor::copy_array(x),
    }
}

/// Sets output 0 to the elements of `y` with the shape `shape`.
fn set_reduced<T: Element + Copy>(
    l: &mut Locked<'_>,
    y: &ArrayD<T>,
    shape: &[usize],
) -> Result<()> {
    let v: Vec<T> = crate::tensor::try_collect(y.iter().copied(), "a kernel buffer")?;
    let a = ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::internal(e.to_string()))?;
    l.set_output(0, T::wrap(a));
    Ok(())
}

/// ReduceSum, ReduceMean, ReduceL1 and ReduceL2 of a float tensor.
fn reduce_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    r: Reducer,
    axes: &Option<Vec<i64>>,
    keep: bool,
) -> Result<()> {
    let (x, red, out) = reduce_input::<T>(l, op, axes, keep)?;
    let zero = T::of(0.0);
    let add = |s: &T, v: &T| *s + *v;
    let y = match r {
        Reducer::Sum => fold_reduced(x.view(), &red, zero, add)?,
        Reducer::Mean => {
            let count = reduced_count(x.shape(), &red);
            let c = T::of(count as f64);
            let mut y = fold_reduced(x.view(), &red, zero, add)?;
            y.mapv_inplace(|v| if count == 0 { T::of(f64::NAN) } else { v / c });
            y
        }
        Reducer::L1 => fold_reduced(map_array(x.view(), |&v| abs(v))?.view(), &red, zero, add)?,
        Reducer::L2 => {
            let mut y = fold_reduced(map_array(x.view(), |&v| v * v)?.view(), &red, zero, add)?;
            y.mapv_inplace(Float::sqrt);
            y
        }
        Reducer::Max | Reducer::Min => return Err(Error::internal("ReduceMax/Min are generic")),
    };
    set_reduced(l, &y, &out)
}

/// ReduceMax or ReduceMin (`max` false); a NaN wins, as numpy's.
fn reduce_extreme_t<T: Number>(
    l: &mut Locked<'_>,
    op: &str,
    max: bool,
    axes: &Option<Vec<i64>>,
    keep: bool,
) -> Result<()> {
    let (x, red, out) = reduce_input::<T>(l, op, axes, keep)?;
    let init = if max {
        T::MIN_IDENTITY
    } else {
        T::MAX_IDENTITY
    };
    let y = fold_reduced(x.view(), &red, init, |s, v| {
        let nan = v.partial_cmp(v).is_none();
        if nan || (max && v > s) || (!max && v < s) {
            *v
        } else {
            *s
        }
    })?;
    set_reduced(l, &y, &out)
}

/// ReduceSum of an integer tensor: input 0 summed with wrapping over the
/// reduced dims.
fn reduce_sum_int<T: Number>(
    l: &mut Locked<'_>,
    axes: &Option<Vec<i64>>,
    keep: bool,
) -> Result<()> {
    let (x, red, out) = reduce_input::<T>(l, "ReduceSum", axes, keep)?;
    let y = fold_reduced(x.view(), &red, T::default(), |s, v| s.wrapping_plus(*v))?;
    set_reduced(l, &y, &out)
}

fn build_reduce(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = axes_arg(&ctx.args)?;
    let keep = ctx.args.i64("keepdims", 1)? != 0;
    let op = ctx.op_type().to_string();
    let r = Reducer::of(&op)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let dt = l.tensor(0)?.dtype();
        if !r.dtypes().contains(&dt) {
            return Err(dtype_error(&l, &op, 0, dt, r.dtypes()));
        }
        if r.extremum() {
            let max = r == Reducer::Max;
            crate::with_match_dtype!(arith dt, |T| reduce_extreme_t::<T>(&mut l, &op, max, &axes, keep)?,
                else other => return Err(crate::tensor::unsupported_dtype(other)));
        } else if r == Reducer::Sum && DataType::INTS.contains(&dt) {
            crate::with_match_dtype!(ints dt, |T| reduce_sum_int::<T>(&mut l, &axes, keep)?,
                else other => return Err(crate::tensor::unsupported_dtype(other)));
        } else {
            by_float!(&l, &op, 0, reduce_t(&mut l, &op, r, &axes, keep))?;
        }
        Ok(true)
    }))
}

/// Caffe2's shape inference of the Reduce ops (the op's own rule: negative
/// axes count from the end, a full reduction without keepdims is 0-d).
fn reduce_infer(
    args: &crate::args::Args<'_>,
    ins: &[Option<crate::operator::ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<crate::operator::ShapeInfo>>> {
    use crate::shapes::rules::{canonical_axis, known};
    let Some(x) = known(ins, 0) else {
        return Ok(vec![None]);
    };
    let axes = axes_arg(args)?;
    let keep = args.i64("keepdims", 1)? != 0;
    let mut red = vec![axes.is_none(); x.dims.len()];
    for &a in axes.iter().flatten() {
        red[canonical_axis(a, x.dims.len())?] = true;
    }
    let dims = x
        .dims
        .iter()
        .zip(&red)
        .filter_map(|(&d, &r)| match (r, keep) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect();
    Ok(vec![Some(crate::operator::ShapeInfo::new(dims, x.dtype))])
}

/// Checks that input `i` of a gradient op has the `n` elements of the
/// reduced X.
fn check_reduced(
    l: &Locked<'_>,
    op: &str,
    i: usize,
    len: usize,
    kept: &[usize],
    axes: &Option<Vec<i64>>,
) -> Result<()> {
    if len != kept.iter().product::<usize>() {
        return Err(Error::shape(format!(
            "{op}: '{}' ({} elements) does not match X ('{}', shape {:?}) reduced over {axes:?} (shape {kept:?})",
            l.input_name(i),
            len,
            l.input_name(1),
            l.tensor(1)?.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(())
}

/// The elements of `v` (a reduced tensor) with the kept shape `kept`.
fn with_kept<T: Element + Copy>(v: &ArrayD<T>, kept: &[usize]) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(
        IxDyn(kept),
        crate::tensor::try_collect(v.iter().copied(), "a kernel buffer")?,
    )
    .map_err(|e| Error::internal(e.to_string()))
}

fn broadcast_to<'a, T>(a: &'a ArrayD<T>, shape: &[usize]) -> Result<ndarray::ArrayViewD<'a, T>> {
    a.broadcast(IxDyn(shape))
        .ok_or_else(|| Error::internal("reduce gradient broadcast"))
}

/// The gradient of ReduceSum, ReduceMean, ReduceL1 and ReduceL2: inputs
/// (dY, X, Y).
fn reduce_grad_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    r: Reducer,
    axes: &Option<Vec<i64>>,
) -> Result<()> {
    let dy = input::<T>(l, op, 0)?;
    let x_shape = l.tensor(1)?.shape().to_vec();
    let red = reduce_axes(op, axes, x_shape.len(), l.input_name(1))?;
    let kept = kept_shape(&x_shape, &red);
    check_reduced(l, op, 0, dy.len(), &kept, axes)?;
    let zero = T::of(0.0);
    let gk = with_kept(dy, &kept)?;
    let g = broadcast_to(&gk, &x_shape)?;
    let dx = match r {
        Reducer::Sum => g.to_owned(),
        Reducer::Mean => {
            let count = reduced_count(&x_shape, &red);
            let scale = T::of(1.0 / count.max(1) as f64);
            g.mapv(|v| v * scale)
        }
        // d|x| = sign(x), 0 at 0.
        Reducer::L1 => {
            let x = input::<T>(l, op, 1)?;
            Zip::from(x).and(&g).map_collect(|&x, &g| sign(x) * g)
        }
        // d||x|| = x / ||x||; 0 where the norm is 0 (Caffe2 gave dY there).
        Reducer::L2 => {
            let (x, y) = (input::<T>(l, op, 1)?, input::<T>(l, op, 2)?);
            check_reduced(l, op, 2, y.len(), &kept, axes)?;
            let yk = with_kept(y, &kept)?;
            let yb = broadcast_to(&yk, &x_shape)?;
            Zip::from(x)
                .and(&g)
                .and(&yb)
                .map_collect(|&x, &g, &n| if n == zero { zero } else { g * x / n })
        }
        Reducer::Max | Reducer::Min => return Err(Error::internal("ReduceMax/Min are generic")),
    };
    l.set_output(0, T::wrap(dx));
    Ok(())
}

/// The gradient of ReduceMax and ReduceMin: inputs (dY, X, Y); every
/// element equal to its group's extremum gets dY (ties share it, as Caffe2).
fn extreme_grad_t<T: Number>(l: &mut Locked<'_>, op: &str, axes: &Option<Vec<i64>>) -> Result<()> {
    let (dy, x, y) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    let x_shape = x.shape().to_vec();
    let red = reduce_axes(op, axes, x_shape.len(), l.input_name(1))?;
    let kept = kept_shape(&x_shape, &red);
    check_reduced(l, op, 0, dy.len(), &kept, axes)?;
    check_reduced(l, op, 2, y.len(), &kept, axes)?;
    let (gk, yk) = (with_kept(dy, &kept)?, with_kept(y, &kept)?);
    let (g, yb) = (broadcast_to(&gk, &x_shape)?, broadcast_to(&yk, &x_shape)?);
    let dx = Zip::from(x)
        .and(&g)
        .and(&yb)
        .map_collect(|&x, &g, &y| if x == y { g } else { T::default() });
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_reduce_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = axes_arg(&ctx.args)?;
    let op = ctx.op_type().to_string();
    let r = Reducer::of(&op)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        if r.extremum() {
            let dt = l.tensor(0)?.dtype();
            crate::with_match_dtype!(arith dt, |T| extreme_grad_t::<T>(&mut l, &op, &axes)?,
                else other => return Err(dtype_error(&l, &op, 0, other, DataType::ARITH)));
        } else {
            by_float!(&l, &op, 0, reduce_grad_t(&mut l, &op, r, &axes))?;
        }
        Ok(true)
    }))
}

/// (whether the front dims are reduced, whether it averages).
fn front_back(op: &str) -> (bool, bool) {
    (op.starts_with("ReduceFront"), op.contains("Mean"))
}

/// The shape of X for a Front/Back gradient op: input `i` is X, or (as
/// Caffe2 also accepts) X's shape as a 1-D int64 tensor.
fn x_shape(l: &Locked<'_>, op: &str, i: usize) -> Result<Vec<usize>> {
    match l.tensor(i)? {
        Tensor::I64(a) if a.ndim() == 1 => a
            .iter()
            .map(|&d| {
                usize::try_from(d).map_err(|_| {
                    Error::invalid_arg(format!("{op}: the shape input has a negative dim {d}"))
                        .with_blob(l.input_name(i))
                })
            })
            .collect(),
        t => Ok(t.shape().to_vec()),
    }
}

fn check_num_reduce(op: &str, k: usize, ndim: usize, blob: &str) -> Result<()> {
    if k > ndim {
        return Err(Error::invalid_arg(format!(
            "{op}: num_reduce_dim {k} is more than the input's {ndim} dims"
        ))
        .with_blob(blob));
    }
    Ok(())
}

/// The Front/Back geometry: (rows, cols) of X as a matrix split at the
/// reduced dims, and the output shape.
fn fb_dims(
    op: &str,
    shape: &[usize],
    k: usize,
    front: bool,
    blob: &str,
) -> Result<(usize, usize, Vec<usize>)> {
    check_num_reduce(op, k, shape.len(), blob)?;
    let split = if front { k } else { shape.len() - k };
    // A shape given as an int64 input could overflow or ask for too much.
    let too_many = |_| {
        Error::invalid_arg(format!("{op}: the shape {shape:?} has too many elements"))
            .with_blob(blob)
    };
    crate::tensor::checked_numel::<u8>(shape, "").map_err(too_many)?;
    let (rows, cols) = (
        shape[..split].iter().product::<usize>(),
        shape[split..].iter().product::<usize>(),
    );
    let out = if front {
        &shape[split..]
    } else {
        &shape[..split]
    };
    Ok((rows, cols, out.to_vec()))
}

/// Per output element, how many of its reduced elements count: the
/// optional lengths input `i` (int32, one per output element, each at most
/// `full`), else all `full` of them.
fn fb_lengths(
    l: &Locked<'_>,
    op: &str,
    i: Option<usize>,
    n_out: usize,
    full: usize,
) -> Result<Vec<usize>> {
    let Some(i) = i else {
        return crate::tensor::filled_vec(n_out, full, "a kernel buffer");
    };
    let t = l.tensor(i)?;
    let name = l.input_name(i);
    let v: Vec<i64> = match t {
        t if t.ndim() == 1 && DataType::INTS.contains(&t.dtype()) => {
            crate::with_match_dtype!(tensor ints t, |a: T| a.iter().map(|&v| i64::from(v)).collect(),
                else _ => Vec::new())
        }
        _ => {
            return Err(Error::type_error(format!(
                "{op}: the lengths ('{name}') must be a 1-D int32 tensor, got {} of shape {:?}",
                t.dtype(),
                t.shape()
            ))
            .with_blob(name))
        }
    };
    if v.len() != n_out {
        return Err(Error::shape(format!(
            "{op}: the lengths ('{name}') must have {n_out} values (one per output element), got {}",
            v.len()
        ))
        .with_blob(name));
    }
    v.iter()
        .map(|&x| {
            usize::try_from(x)
                .ok()
                .filter(|&u| u <= full)
                .ok_or_else(|| {
                    Error::invalid_arg(format!("{op}: length {x} is outside [0, {full}]"))
                        .with_blob(name)
                })
        })
        .collect()
}

/// For element `i` of the rows x cols matrix: (its output element, its
/// position along the reduced dims).
fn fb_place(i: usize, cols: usize, front: bool) -> (usize, usize) {
    let (r, c) = (i / cols.max(1), i % cols.max(1));
    if front {
        (c, r)
    } else {
        (r, c)
    }
}

fn front_back_max_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    k: usize,
    lens_at: Option<usize>,
    grad: bool,
) -> Result<()> {
    let front = op.starts_with("ReduceFront");
    let xi = usize::from(grad);
    let x = input::<T>(l, op, xi)?;
    let (rows, cols, out_shape) = fb_dims(op, x.shape(), k, front, l.input_name(xi))?;
    let (n_out, full) = if front { (cols, rows) } else { (rows, cols) };
    let lens = fb_lengths(l, op, lens_at, n_out, full)?;
    let xs = dense(x);
    if grad {
        // Inputs (dY, X, Y[, lengths]): dY goes to every counted element
        // equal to its maximum.
        let (dy, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 2)?);
        if dy.len() != n_out || y.len() != n_out {
            return Err(Error::shape(format!(
                "{op}: dY ('{}') and Y ('{}') must have {n_out} elements",
                l.input_name(0),
                l.input_name(2)
            ))
            .with_blob(l.input_name(0)));
        }
        let (g, ys) = (dense(dy), dense(y));
        let dx: Vec<T> = crate::tensor::try_collect(
            xs.iter().enumerate().map(|(i, &v)| {
                let (o, pos) = fb_place(i, cols, front);
                if pos < lens[o] && v == ys[o] {
                    g[o]
                } else {
                    T::of(0.0)
                }
            }),
            "a kernel buffer",
        )?;
        let shape = x.shape().to_vec();
        l.set_output(0, T::wrap(array(&shape, dx)?));
        return Ok(());
    }
    let mut y = crate::tensor::filled_vec(n_out, T::of(f64::NEG_INFINITY), "a kernel buffer")?;
    for (i, &v) in xs.iter().enumerate() {
        let (o, pos) = fb_place(i, cols, front);
        if pos < lens[o] && v > y[o] {
            y[o] = v;
        }
    }
    l.set_output(0, T::wrap(array(&out_shape, y)?));
    Ok(())
}

fn build_front_back_max(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let k: usize = ctx.args.int("num_reduce_dim", 1usize)?;
    let op = ctx.op_type().to_string();
    let grad = op.ends_with("Gradient");
    let base = if grad { 3 } else { 1 };
    let lens_at = (ctx.num_inputs() == base + 1).then_some(base);
    float_kernel!(&op, 0, |l| front_back_max_t(&mut l, &op, k, lens_at, grad))
}

fn front_back_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    k: usize,
    lens_at: Option<usize>,
) -> Result<()> {
    let (front, mean) = front_back(op);
    let x = input::<T>(l, op, 0)?;
    let (rows, cols, out_shape) = fb_dims(op, x.shape(), k, front, l.input_name(0))?;
    let (n_out, full) = if front { (cols, rows) } else { (rows, cols) };
    let lens = fb_lengths(l, op, lens_at, n_out, full)?;
    let xs = dense(x);
    let mut y = crate::tensor::default_buffer::<T>(n_out, "a kernel buffer")?;
    for (i, &v) in xs.iter().enumerate() {
        let (o, pos) = fb_place(i, cols, front);
        if pos < lens[o] {
            y[o] += v;
        }
    }
    if mean {
        for (v, &n) in y.iter_mut().zip(&lens) {
            if n > 0 {
                *v = *v / T::of(n as f64);
            }
        }
    }
    l.set_output(0, T::wrap(array(&out_shape, y)?));
    Ok(())
}

fn build_front_back(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let k: usize = ctx.args.int("num_reduce_dim", 1usize)?;
    let op = ctx.op_type().to_string();
    let lens_at = (ctx.num_inputs() == 2).then_some(1);
    float_kernel!(&op, 0, |l| front_back_t(&mut l, &op, k, lens_at))
}

fn front_back_grad_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    k: usize,
    lens_at: Option<usize>,
) -> Result<()> {
    let (front, mean) = front_back(op);
    let dy = input::<T>(l, op, 0)?;
    let shape = x_shape(l, op, 1)?;
    let (rows, cols, _) = fb_dims(op, &shape, k, front, l.input_name(1))?;
    let (n_out, full) = if front { (cols, rows) } else { (rows, cols) };
    if dy.len() != n_out {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have {n_out} elements for X of shape {shape:?}",
            l.input_name(0),
            dy.shape()
        ))
        .with_blob(l.input_name(0)));
    }
    let lens = fb_lengths(l, op, lens_at, n_out, full)?;
    let g = dense(dy);
    let mut dx =
        crate::tensor::try_vec::<T>(rows * cols, format!("the gradient of shape {shape:?}"))?;
    dx.extend((0..rows * cols).map(|i| {
        let (o, pos) = fb_place(i, cols, front);
        if pos >= lens[o] {
            T::of(0.0)
        } else if mean {
            g[o] / T::of(lens[o] as f64)
        } else {
            g[o]
        }
    }));
    l.set_output(0, T::wrap(array(&shape, dx)?));
    Ok(())
}

fn build_front_back_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let k: usize = ctx.args.int("num_reduce_dim", 1usize)?;
    let op = ctx.op_type().to_string();
    let lens_at = (ctx.num_inputs() == 3).then_some(2);
    float_kernel!(&op, 0, |l| front_back_grad_t(&mut l, &op, k, lens_at))
}

// -------------------------------------------------------- SumReduceLike --

/// SumReduceLike: A summed down to B's shape, B placed in A by Caffe2's
/// legacy broadcasting rule (`axis`, or `axis_str` in `order`; B's leading
/// and trailing 1s are free). A B of one element takes the sum of all of A.
fn sum_reduce_like_t<T: Float>(l: &mut Locked<'_>, axis: Option<usize>) -> Result<()> {
    const OP: &str = "SumReduceLike";
    let a = input::<T>(l, OP, 0)?;
    let b_shape = l.tensor(1)?.shape().to_vec();
    let red: Vec<bool> = if b_shape.iter().product::<usize>() == 1 {
        vec![true; a.ndim()]
    } else {
        let mut bs = super::elementwise::Shape::new();
        let names = (l.input_name(0), l.input_name(1));
        super::elementwise::legacy_shapes(OP, a.shape(), &b_shape, axis, names, &mut bs)?;
        bs.iter().map(|&d| d == 1).collect()
    };
    let y = fold_reduced(a.view(), &red, T::of(0.0), |s, v| *s + *v)?;
    set_reduced(l, &y, &b_shape)
}

fn build_sum_reduce_like(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = super::elementwise::legacy_axis(ctx)?;
    float_kernel!("SumReduceLike", 0, |l| sum_reduce_like_t(&mut l, axis))
}

// ----------------------------------------------------------- DotProduct --

/// X and Y (same shape) as N rows of D: N is the first dim (1 for a 0-d
/// tensor), D the rest.
fn dot_rows(l: &Locked<'_>, op: &str, xi: usize, yi: usize) -> Result<(usize, usize)> {
    let (xs, ys) = (l.tensor(xi)?.shape(), l.tensor(yi)?.shape());
    if xs != ys {
        return Err(Error::shape(format!(
            "{op}: X ('{}', shape {xs:?}) and Y ('{}', shape {ys:?}) must have the same shape",
            l.input_name(xi),
            l.input_name(yi)
        ))
        .with_blob(l.input_name(yi)));
    }
    let n = xs.first().copied().unwrap_or(1);
    let total: usize = xs.iter().product();
    Ok((n, total.checked_div(n).unwrap_or(0)))
}

fn dot_product_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    const OP: &str = "DotProduct";
    let (n, d) = dot_rows(l, OP, 0, 1)?;
    let (x, y) = (input::<T>(l, OP, 0)?, input::<T>(l, OP, 1)?);
    let (xs, ys) = (dense(x), dense(y));
    let z: Vec<T> = crate::tensor::try_collect(
        (0..n).map(|i| {
            let r = i * d..(i + 1) * d;
            dot(&xs[r.clone()], &ys[r])
        }),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&[n], z)?));
    Ok(())
}

/// DotProductGradient: inputs (X, Y, dZ), outputs (dX = dZ * Y, dY = dZ * X)
/// row by row.
fn dot_product_grad_t<T: Float>(l: &mut Locked<'_>) -> Result<()> {
    const OP: &str = "DotProductGradient";
    let (n, d) = dot_rows(l, OP, 0, 1)?;
    let (x, y, dz) = (
        input::<T>(l, OP, 0)?,
        input::<T>(l, OP, 1)?,
        input::<T>(l, OP, 2)?,
    );
    check_rows_grad(l, OP, dz.shape(), n)?;
    let shape = x.shape().to_vec();
    let (xs, ys, g) = (dense(x), dense(y), dense(dz));
    let scaled = |v: &[T]| -> Result<Vec<T>> {
        crate::tensor::try_collect(
            v.iter().enumerate().map(|(k, &e)| e * g[k / d.max(1)]),
            "a DotProduct gradient",
        )
    };
    let (dx, dy) = (scaled(&ys)?, scaled(&xs)?);
    let (dx, dy) = (array(&shape, dx)?, array(&shape, dy)?);
    l.set_output(0, T::wrap(dx));
    l.set_output(1, T::wrap(dy));
    Ok(())
}

/// The row-wise ops' output: one value per row of X (its first dim, 1 for
/// a 0-d X).
fn rows_infer(
    _: &crate::args::Args<'_>,
    ins: &[Option<crate::operator::ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<crate::operator::ShapeInfo>>> {
    Ok(vec![crate::shapes::rules::known(ins, 0).map(|x| {
        crate::operator::ShapeInfo::new(vec![x.dims.first().copied().unwrap_or(1)], x.dtype)
    })])
}

/// The row-wise ops' gradients: (dX, dY) have X's and Y's shapes.
fn pair_grad_infer(
    _: &crate::args::Args<'_>,
    ins: &[Option<crate::operator::ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<crate::operator::ShapeInfo>>> {
    use crate::shapes::rules::known;
    Ok(vec![known(ins, 0).cloned(), known(ins, 1).cloned()])
}

fn build_dot_product(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type().ends_with("Gradient");
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        if grad {
            by_float!(&l, "DotProductGradient", 0, dot_product_grad_t(&mut l))?;
        } else {
            by_float!(&l, "DotProduct", 0, dot_product_t(&mut l))?;
        }
        Ok(true)
    }))
}

// ------------------------------- CosineSimilarity, DotProductWithPadding --

/// Caffe2's floor under a squared norm in CosineSimilarity.
const COS_EPS: f64 = 1e-12;

/// The dot product of two slices.
fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// CosineSimilarity (`grad` false): Z[i] = x.y / sqrt(max(|x|^2, eps)
/// max(|y|^2, eps)) row by row; its gradient (inputs (X, Y, dZ), outputs
/// (dX, dY)) differentiates that function (a norm under the floor is a
/// constant).
fn cosine_t<T: Float>(l: &mut Locked<'_>, grad: bool) -> Result<()> {
    let op = if grad {
        "CosineSimilarityGradient"
    } else {
        "CosineSimilarity"
    };
    let (n, d) = dot_rows(l, op, 0, 1)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let shape = x.shape().to_vec();
    let (xs, ys) = (dense(x), dense(y));
    let eps = T::of(COS_EPS);
    let floor = |v: T| if v < eps { eps } else { v };
    let row = |i: usize| (&xs[i * d..(i + 1) * d], &ys[i * d..(i + 1) * d]);
    if !grad {
        let z: Vec<T> = crate::tensor::try_collect(
            (0..n).map(|i| {
                let (xr, yr) = row(i);
                dot(xr, yr) / (floor(dot(xr, xr)) * floor(dot(yr, yr))).sqrt()
            }),
            "a kernel buffer",
        )?;
        l.set_output(0, T::wrap(array(&[n], z)?));
        return Ok(());
    }
    let dz = input::<T>(l, op, 2)?;
    check_rows_grad(l, op, dz.shape(), n)?;
    let g = dense(dz);
    let zero = T::of(0.0);
    let (mut dx, mut dy) = (
        crate::tensor::filled_vec(n * d, zero, "a kernel buffer")?,
        crate::tensor::filled_vec(n * d, zero, "a kernel buffer")?,
    );
    for i in 0..n {
        let (xr, yr) = row(i);
        let (x2, y2, xy) = (dot(xr, xr), dot(yr, yr), dot(xr, yr));
        let (xn2, yn2) = (floor(x2), floor(y2));
        let base = g[i] / (xn2 * yn2).sqrt();
        let kx = if x2 < eps { zero } else { base * xy / xn2 };
        let ky = if y2 < eps { zero } else { base * xy / yn2 };
        for j in 0..d {
            dx[i * d + j] = base * yr[j] - kx * xr[j];
            dy[i * d + j] = base * xr[j] - ky * yr[j];
        }
    }
    l.set_output(0, T::wrap(array(&shape, dx)?));
    l.set_output(1, T::wrap(array(&shape, dy)?));
    Ok(())
}

/// dZ of a row-wise gradient op must be 1-D with one value per row.
fn check_rows_grad(l: &Locked<'_>, op: &str, shape: &[usize], n: usize) -> Result<()> {
    if shape != [n] {
        return Err(Error::shape(format!(
            "{op}: dZ ('{}', shape {shape:?}) must be 1-D with the {n} rows of X",
            l.input_name(2)
        ))
        .with_blob(l.input_name(2)));
    }
    Ok(())
}

/// DotProductWithPadding's arguments.
#[derive(Clone, Copy)]
struct Padding {
    pad_value: f64,
    replicate: bool,
}

/// X and Y for DotProductWithPadding: the same number of dims and rows (the
/// first dim); (N, DX, DY), each row the rest of its tensor. With
/// `replicate` the longer row is a whole number of shorter ones.
fn padded_rows(l: &Locked<'_>, op: &str, replicate: bool) -> Result<(usize, usize, usize)> {
    let (xs, ys) = (l.tensor(0)?.shape(), l.tensor(1)?.shape());
    let bad = |why: String| {
        Error::shape(format!(
            "{op}: X ('{}', shape {xs:?}) and Y ('{}', shape {ys:?}) {why}",
            l.input_name(0),
            l.input_name(1)
        ))
        .with_blob(l.input_name(1))
    };
    if xs.len() != ys.len() || xs.first() != ys.first() {
        return Err(bad(
            "must have the same number of dims and the same first dim".into(),
        ));
    }
    let n = xs.first().copied().unwrap_or(1);
    let dx = xs.iter().product::<usize>().checked_div(n).unwrap_or(0);
    let dy = ys.iter().product::<usize>().checked_div(n).unwrap_or(0);
    let (short, long) = (dx.min(dy), dx.max(dy));
    if replicate && long.checked_rem(short).unwrap_or(long) != 0 {
        return Err(bad(format!(
            "have rows of {dx} and {dy}: with replicate, the longer must be a whole number of the shorter"
        )));
    }
    Ok((n, dx, dy))
}

/// DotProductWithPadding (`grad` false): per row, the shorter of x and y
/// padded with `pad_value` (or, with `replicate`, repeated) to the longer's
/// length, then the dot product; its gradient (inputs (X, Y, dZ), outputs
/// (dX, dY)).
fn dot_padded_t<T: Float>(l: &mut Locked<'_>, p: Padding, grad: bool) -> Result<()> {
    let op = if grad {
        "DotProductWithPaddingGradient"
    } else {
        "DotProductWithPadding"
    };
    let (n, dx, dy) = padded_rows(l, op, p.replicate)?;
    let (x, y) = (input::<T>(l, op, 0)?, input::<T>(l, op, 1)?);
    let (xshape, yshape) = (x.shape().to_vec(), y.shape().to_vec());
    let (xs, ys) = (dense(x), dense(y));
    let pad = T::of(p.pad_value);
    let zero = T::of(0.0);
    let d = dx.min(dy);
    // Per row: (the longer row, the shorter, whether X is the longer).
    let rows = |i: usize| {
        let (xr, yr) = (&xs[i * dx..(i + 1) * dx], &ys[i * dy..(i + 1) * dy]);
        if dx > dy {
            (xr, yr, true)
        } else {
            (yr, xr, false)
        }
    };
    if !grad {
        let z: Vec<T> = crate::tensor::try_collect(
            (0..n).map(|i| {
                let (lr, sr, _) = rows(i);
                if p.replicate {
                    lr.chunks(d.max(1)).map(|c| dot(c, sr)).sum()
                } else {
                    dot(&lr[..d], sr) + pad * lr[d..].iter().copied().sum::<T>()
                }
            }),
            "a kernel buffer",
        )?;
        l.set_output(0, T::wrap(array(&[n], z)?));
        return Ok(());
    }
    let dz = input::<T>(l, op, 2)?;
    check_rows_grad(l, op, dz.shape(), n)?;
    let g = dense(dz);
    let (mut gx, mut gy) = (
        crate::tensor::filled_vec(n * dx, zero, "a kernel buffer")?,
        crate::tensor::filled_vec(n * dy, zero, "a kernel buffer")?,
    );
    let long_len = dx.max(dy);
    for i in 0..n {
        let (lr, sr, x_long) = rows(i);
        let mut gl = crate::tensor::filled_vec(long_len, zero, "a kernel buffer")?;
        let mut gs = crate::tensor::filled_vec(d, zero, "a kernel buffer")?;
        if p.replicate {
            for (c, glc) in lr.chunks(d.max(1)).zip(gl.chunks_mut(d.max(1))) {
                for j in 0..d {
                    glc[j] = g[i] * sr[j];
                    gs[j] += g[i] * c[j];
                }
            }
        } else {
            for j in 0..d {
                gl[j] = g[i] * sr[j];
                gs[j] = g[i] * lr[j];
            }
            for v in &mut gl[d..] {
                *v = g[i] * pad;
            }
        }
        let (gxr, gyr) = if x_long { (gl, gs) } else { (gs, gl) };
        gx[i * dx..(i + 1) * dx].copy_from_slice(&gxr);
        gy[i * dy..(i + 1) * dy].copy_from_slice(&gyr);
    }
    l.set_output(0, T::wrap(array(&xshape, gx)?));
    l.set_output(1, T::wrap(array(&yshape, gy)?));
    Ok(())
}

fn build_cosine(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type().ends_with("Gradient");
    float_kernel!("CosineSimilarity", 0, |l| cosine_t(&mut l, grad))
}

fn build_dot_padded(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let grad = ctx.op_type().ends_with("Gradient");
    let p = Padding {
        pad_value: f64::from(ctx.args.f32("pad_value", 0.0)?),
        replicate: ctx.args.bool("replicate", false)?,
    };
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| dot_padded_t(&mut l, p, grad))
}

// ------------------------------------------- SumElements, Mean, Moments --

/// The index into the kept (reduced, keepdims) shape of element `idx`.
fn kept_index(idx: &[usize], red: &[bool]) -> Vec<usize> {
    idx.iter()
        .zip(red)
        .map(|(&i, &r)| if r { 0 } else { i })
        .collect()
}

fn sum_elements_t<T: Float>(l: &mut Locked<'_>, average: bool) -> Result<()> {
    let x = input::<T>(l, "SumElements", 0)?;
    let s: T = x.iter().copied().sum();
    let out = if average && !x.is_empty() {
        s / T::of(x.len() as f64)
    } else {
        s
    };
    l.set_output(0, T::wrap(array(&[], vec![out])?));
    Ok(())
}

fn build_sum_elements(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let average = ctx.args.bool("average", false)?;
    float_kernel!("SumElements", 0, |l| sum_elements_t(&mut l, average))
}

fn sum_elements_grad_t<T: Float>(l: &mut Locked<'_>, average: bool) -> Result<()> {
    const OP: &str = "SumElementsGradient";
    let x = input::<T>(l, OP, 0)?;
    let shape = x.shape().to_vec();
    let n = x.len();
    let dy = input::<T>(l, OP, 1)?;
    if dy.len() != 1 {
        return Err(Error::shape(format!(
            "{OP}: dY ('{}', shape {:?}) must have one element",
            l.input_name(1),
            dy.shape()
        ))
        .with_blob(l.input_name(1)));
    }
    let mut g = dy.iter().copied().next().unwrap_or(T::of(0.0));
    if average && n > 0 {
        g = g / T::of(n as f64);
    }
    l.set_output(
        0,
        T::wrap(array(
            &shape,
            crate::tensor::filled_vec(n, g, "a kernel buffer")?,
        )?),
    );
    Ok(())
}

fn build_sum_elements_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let average = ctx.args.bool("average", false)?;
    float_kernel!("SumElementsGradient", 0, |l| sum_elements_grad_t(
        &mut l, average
    ))
}

fn mean_t<T: Float>(l: &mut Locked<'_>, k: usize) -> Result<()> {
    let x0 = input::<T>(l, "Mean", 0)?;
    let shape = x0.shape().to_vec();
    let mut acc: Vec<T> = crate::tensor::try_to_vec(&dense(x0), "a kernel buffer")?;
    for i in 1..k {
        let xi = input::<T>(l, "Mean", i)?;
        if xi.shape() != shape.as_slice() {
            return Err(Error::shape(format!(
                "Mean: input {i} ('{}', shape {:?}) must have input 0's shape {shape:?}",
                l.input_name(i),
                xi.shape()
            ))
            .with_blob(l.input_name(i)));
        }
        for (a, &v) in acc.iter_mut().zip(dense(xi).iter()) {
            *a = *a + v;
        }
    }
    let inv = T::of(1.0 / k as f64);
    acc.iter_mut().for_each(|a| *a = *a * inv);
    l.set_output(0, T::wrap(array(&shape, acc)?));
    Ok(())
}

fn build_mean(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let k = ctx.num_inputs();
    float_kernel!("Mean", 0, |l| mean_t(&mut l, k))
}

fn mean_grad_t<T: Float>(l: &mut Locked<'_>, k: usize) -> Result<()> {
    let dy = input::<T>(l, "MeanGradient", 0)?;
    let inv = T::of(1.0 / k as f64);
    // One buffer, shared by every output (copy on write).
    let g = T::wrap(map_array(dy.view(), |&v| v * inv)?);
    for i in 0..k {
        l.set_output(i, g.clone());
    }
    Ok(())
}

fn build_mean_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let k = ctx.num_outputs();
    float_kernel!("MeanGradient", 0, |l| mean_grad_t(&mut l, k))
}

fn moments_t<T: Float>(l: &mut Locked<'_>, axes: &Option<Vec<i64>>, keep: bool) -> Result<()> {
    let (x, red, out) = reduce_input::<T>(l, "Moments", axes, keep)?;
    let count: usize = x
        .shape()
        .iter()
        .zip(&red)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    let kept = kept_shape(x.shape(), &red);
    let inv = T::of(1.0 / count.max(1) as f64);
    let mut mean = ArrayD::<T>::from_elem(IxDyn(&kept), T::of(0.0));
    let mut var = ArrayD::<T>::from_elem(IxDyn(&kept), T::of(0.0));
    for (idx, &v) in x.indexed_iter() {
        let k = kept_index(ndarray::Dimension::slice(&idx), &red);
        mean[IxDyn(&k)] = mean[IxDyn(&k)] + v;
    }
    mean.mapv_inplace(|s| s * inv);
    for (idx, &v) in x.indexed_iter() {
        let k = kept_index(ndarray::Dimension::slice(&idx), &red);
        let d = v - mean[IxDyn(&k)];
        var[IxDyn(&k)] = var[IxDyn(&k)] + d * d;
    }
    var.mapv_inplace(|s| s * inv);
    let mean_v: Vec<T> = crate::tensor::try_collect(mean.iter().copied(), "a kernel buffer")?;
    let var_v: Vec<T> = crate::tensor::try_collect(var.iter().copied(), "a kernel buffer")?;
    l.set_output(0, T::wrap(array(&out, mean_v)?));
    l.set_output(1, T::wrap(array(&out, var_v)?));
    Ok(())
}

fn build_moments(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = axes_arg(&ctx.args)?;
    let keep = ctx.args.i64("keepdims", 1)? != 0;
    float_kernel!("Moments", 0, |l| moments_t(&mut l, &axes, keep))
}

fn moments_grad_t<T: Float>(l: &mut Locked<'_>, axes: &Option<Vec<i64>>) -> Result<()> {
    const OP: &str = "MomentsGradient";
    let x = input::<T>(l, OP, 2)?;
    let red = reduce_axes(OP, axes, x.ndim(), l.input_name(2))?;
    let kept = kept_shape(x.shape(), &red);
    let count: usize = x
        .shape()
        .iter()
        .zip(&red)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    let want: usize = kept.iter().product();
    let get = |i: usize, what: &str| -> Result<ArrayD<T>> {
        let a = input::<T>(l, OP, i)?;
        if a.len() != want {
            return Err(Error::shape(format!(
                "{OP}: {what} ('{}', shape {:?}) must have the reduced shape {kept:?}",
                l.input_name(i),
                a.shape()
            ))
            .with_blob(l.input_name(i)));
        }
        array(
            &kept,
            crate::tensor::try_collect(a.iter().copied(), "a kernel buffer")?,
        )
    };
    let (dm, dv, mean) = (get(0, "dmean")?, get(1, "dvariance")?, get(3, "the mean")?);
    let inv = T::of(1.0 / count.max(1) as f64);
    let mut dx = x.clone();
    for (idx, v) in dx.indexed_iter_mut() {
        let k = kept_index(ndarray::Dimension::slice(&idx), &red);
        let k = IxDyn(&k);
        *v = (dm[&k] + T::of(2.0) * dv[&k] * (*v - mean[&k])) * inv;
    }
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_moments_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = axes_arg(&ctx.args)?;
    float_kernel!("MomentsGradient", 2, |l| moments_grad_t(&mut l, &axes))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::ir::Argument;
    use crate::tensor::Tensor;
    use crate::test_util::{f32s, get, int_arg, op, run, vals, ws_with};

    fn ints(name: &str, v: &[i64]) -> Argument {
        Argument {
            name: Some(name.into()),
            ints: v.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn reshape_copies_dims_infers_one_and_reports_the_old_shape() {
        let ws = ws_with(&[("x", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]))]);
        run(
            &ws,
            op(
                "Reshape",
                &["x"],
                &["y", "old"],
                vec![ints("shape", &[0, -1, 1])],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "y").shape(), &[2, 3, 1]);
        let old: Vec<i64> = get(&ws, "old")
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(old, vec![2, 3]);
        let e = run(
            &ws,
            op("Reshape", &["x"], &["y"], vec![ints("shape", &[4, -1])]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn reductions_by_hand() {
        let ws = ws_with(&[("x", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]))]);
        run(
            &ws,
            op(
                "ReduceSum",
                &["x"],
                &["s"],
                vec![ints("axes", &[1]), int_arg("keepdims", 0)],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "s")), vec![6., 15.]);
        run(
            &ws,
            op("ReduceMean", &["x"], &["m"], vec![ints("axes", &[0])]),
        )
        .unwrap();
        assert_eq!(get(&ws, "m").shape(), &[1, 3]);
        assert_eq!(vals(&get(&ws, "m")), vec![2.5, 3.5, 4.5]);
        run(&ws, op("ReduceFrontSum", &["x"], &["f"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "f")), vec![5., 7., 9.]);
        run(&ws, op("ReduceBackMean", &["x"], &["b"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "b")), vec![2., 5.]);
        run(
            &ws,
            op("ReduceBackMeanGradient", &["b", "x"], &["db"], vec![]),
        )
        .unwrap();
        let want = [2. / 3., 2. / 3., 2. / 3., 5. / 3., 5. / 3., 5. / 3.];
        for (g, w) in vals(&get(&ws, "db")).iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
        let e = run(
            &ws,
            op("ReduceSum", &["x"], &["s"], vec![ints("axes", &[2])]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn max_min_l1_l2_by_hand() {
        // x = [[1, -5, 3], [4, 2, -6]]
        let ws = ws_with(&[("x", f32s(&[2, 3], &[1., -5., 3., 4., 2., -6.]))]);
        let axis1 = || vec![ints("axes", &[1]), int_arg("keepdims", 0)];
        run(&ws, op("ReduceMax", &["x"], &["mx"], axis1())).unwrap();
        assert_eq!(vals(&get(&ws, "mx")), vec![3., 4.]);
        run(
            &ws,
            op("ReduceMin", &["x"], &["mn"], vec![ints("axes", &[-2])]),
        )
        .unwrap();
        assert_eq!(get(&ws, "mn").shape(), &[1, 3]);
        assert_eq!(vals(&get(&ws, "mn")), vec![1., -5., -6.]);
        run(&ws, op("ReduceL1", &["x"], &["l1"], axis1())).unwrap();
        assert_eq!(vals(&get(&ws, "l1")), vec![9., 12.]);
        // All dims when axes is empty (or absent), kept as 1s:
        // sqrt(1+25+9+16+4+36) = sqrt(91).
        run(
            &ws,
            op("ReduceL2", &["x"], &["l2"], vec![ints("axes", &[])]),
        )
        .unwrap();
        assert_eq!(get(&ws, "l2").shape(), &[1, 1]);
        assert!((vals(&get(&ws, "l2"))[0] - 91f32.sqrt()).abs() < 1e-5);
        // Integers: the max of int32 values, and no float-only op takes them.
        let xi = Tensor::from_vec(&[2, 2], vec![3i32, -7, 9, 2]).unwrap();
        let wi = ws_with(&[("xi", xi)]);
        run(
            &wi,
            op("ReduceMax", &["xi"], &["m"], vec![ints("axes", &[0])]),
        )
        .unwrap();
        let m: Vec<i32> = get(&wi, "m")
            .array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(m, vec![9, 2]);
        let e = run(&wi, op("ReduceL2", &["xi"], &["m"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.message.contains("ReduceL2") && e.message.contains("'xi'"),
            "{}",
            e.message
        );
        // An empty reduction: the identity of max is -inf.
        let we = ws_with(&[("e", f32s(&[2, 0], &[]))]);
        run(&we, op("ReduceMax", &["e"], &["m"], axis1())).unwrap();
        assert_eq!(vals(&get(&we, "m")), vec![f32::NEG_INFINITY; 2]);
    }

    #[test]
    fn max_min_l1_l2_gradients_by_hand() {
        // Ties share the gradient; L1's is the sign (0 at 0); L2's is 0 at a
        // zero norm.
        let x = f32s(&[2, 3], &[2., 2., -1., 0., 0., 0.]);
        let ws = ws_with(&[("x", x)]);
        let args = || vec![ints("axes", &[1])];
        for ty in ["ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2"] {
            run(&ws, op(ty, &["x"], &["y"], args())).unwrap();
            ws.feed(
                "dy",
                crate::blob::BlobValue::Tensor(f32s(&[2, 1], &[10., 20.])),
            );
            run(
                &ws,
                op(&format!("{ty}Gradient"), &["dy", "x", "y"], &["dx"], args()),
            )
            .unwrap();
            let want: Vec<f32> = match ty {
                "ReduceMax" => vec![10., 10., 0., 20., 20., 20.],
                "ReduceMin" => vec![0., 0., 10., 20., 20., 20.],
                "ReduceL1" => vec![10., 10., -10., 0., 0., 0.],
                _ => vec![20. / 3., 20. / 3., -10. / 3., 0., 0., 0.],
            };
            let got = vals(&get(&ws, "dx"));
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-5, "{ty}: {got:?} vs {want:?}");
            }
        }
        // dY of the wrong size is a shape error naming it.
        ws.feed(
            "bad",
            crate::blob::BlobValue::Tensor(f32s(&[3], &[1., 2., 3.])),
        );
        let e = run(
            &ws,
            op("ReduceMaxGradient", &["bad", "x", "y"], &["dx"], args()),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn sum_reduce_like_by_hand() {
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let ws = ws_with(&[
            ("a", f32s(&[2, 3, 4], &v)),
            ("b", f32s(&[3], &[0.; 3])),
            ("s", f32s(&[1], &[0.])),
            ("t", f32s(&[1, 4], &[0.; 4])),
        ]);
        // B = (3,) at axis 1: sums over dims 0 and 2.
        run(
            &ws,
            op(
                "SumReduceLike",
                &["a", "b"],
                &["c"],
                vec![int_arg("axis", 1)],
            ),
        )
        .unwrap();
        let want: Vec<f32> = (0..3)
            .map(|j| {
                (0..2)
                    .flat_map(|i| (0..4).map(move |k| (i * 12 + j * 4 + k) as f32))
                    .sum()
            })
            .collect();
        assert_eq!(vals(&get(&ws, "c")), want);
        // axis_str "C" of NCHW is axis 1 too.
        let mut s = crate::ir::Argument {
            name: Some("axis_str".into()),
            ..Default::default()
        };
        s.s = Some(b"C".to_vec());
        run(&ws, op("SumReduceLike", &["a", "b"], &["c2"], vec![s])).unwrap();
        assert_eq!(vals(&get(&ws, "c2")), want);
        // One element: the total; B (1, 4) at A's end: a leading 1 is free.
        run(&ws, op("SumReduceLike", &["a", "s"], &["c3"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "c3")), vec![276.]);
        run(&ws, op("SumReduceLike", &["a", "t"], &["c4"], vec![])).unwrap();
        assert_eq!(get(&ws, "c4").shape(), &[1, 4]);
        assert_eq!(vals(&get(&ws, "c4")), vec![60., 66., 72., 78.]);
        // B's dims must match A's from axis.
        let e = run(
            &ws,
            op(
                "SumReduceLike",
                &["a", "b"],
                &["c"],
                vec![int_arg("axis", 2)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn lengths_to_shape_by_hand() {
        let ws = ws_with(&[
            ("l", crate::test_util::i32s(&[200, 200, 200])),
            ("bad", crate::test_util::i32s(&[2, 3])),
            ("none", crate::test_util::i32s(&[])),
        ]);
        run(&ws, op("LengthsToShape", &["l"], &["s"], vec![])).unwrap();
        let s: Vec<i32> = get(&ws, "s")
            .array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(s, vec![3, 200]);
        run(&ws, op("LengthsToShape", &["none"], &["s"], vec![])).unwrap();
        let s: Vec<i32> = get(&ws, "s")
            .array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(s, vec![0, 0]);
        let e = run(&ws, op("LengthsToShape", &["bad"], &["s"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn dot_product_by_hand() {
        let ws = ws_with(&[
            ("x", f32s(&[2, 2], &[1., 2., 3., 4.])),
            ("y", f32s(&[2, 2], &[5., 6., 7., 8.])),
            ("dz", f32s(&[2], &[1., 10.])),
            ("v", f32s(&[3], &[1., 2., 3.])),
        ]);
        run(&ws, op("DotProduct", &["x", "y"], &["z"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![17., 53.]);
        run(
            &ws,
            op(
                "DotProductGradient",
                &["x", "y", "dz"],
                &["dx", "dy"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dx")), vec![5., 6., 70., 80.]);
        assert_eq!(vals(&get(&ws, "dy")), vec![1., 2., 30., 40.]);
        // 1-D inputs: one row per element.
        run(&ws, op("DotProduct", &["v", "v"], &["w"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "w")), vec![1., 4., 9.]);
        let e = run(&ws, op("DotProduct", &["x", "v"], &["z"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }

    #[test]
    fn cosine_similarity_and_dot_with_padding_by_hand() {
        let h = std::f32::consts::FRAC_1_SQRT_2;
        let ws = ws_with(&[
            ("x", f32s(&[2, 2], &[3., 4., 1., 0.])),
            ("y", f32s(&[2, 2], &[4., 3., 1., 1.])),
            ("dz", f32s(&[2], &[0., 1.])),
            ("p", f32s(&[1, 3], &[1., 2., 3.])),
            ("q", f32s(&[1, 2], &[4., 5.])),
            ("r", f32s(&[1, 4], &[1., 2., 3., 4.])),
            ("s", f32s(&[1, 2], &[1., 10.])),
            ("g", f32s(&[1], &[1.])),
        ]);
        let close = |got: Vec<f32>, want: &[f32]| {
            assert!(
                got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6),
                "{got:?} vs {want:?}"
            );
        };
        run(&ws, op("CosineSimilarity", &["x", "y"], &["c"], vec![])).unwrap();
        close(vals(&get(&ws, "c")), &[0.96, h]);
        // Row 2: d cos/dx = y/(|x||y|) - (x.y) x/(|x|^3 |y|) = [0, 1/sqrt2].
        run(
            &ws,
            op(
                "CosineSimilarityGradient",
                &["x", "y", "dz"],
                &["dx", "dy"],
                vec![],
            ),
        )
        .unwrap();
        close(vals(&get(&ws, "dx")), &[0., 0., 0., h]);
        close(vals(&get(&ws, "dy")), &[0., 0., h / 2., -h / 2.]);
        let pad = |v: f32| vec![crate::test_util::float_arg("pad_value", v)];
        run(
            &ws,
            op("DotProductWithPadding", &["p", "q"], &["z"], pad(0.)),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![14.]);
        run(
            &ws,
            op("DotProductWithPadding", &["q", "p"], &["z"], pad(2.)),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![20.]);
        run(
            &ws,
            op(
                "DotProductWithPaddingGradient",
                &["p", "q", "g"],
                &["dp", "dq"],
                pad(2.),
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dp")), vec![4., 5., 2.]);
        assert_eq!(vals(&get(&ws, "dq")), vec![1., 2.]);
        let rep = || vec![int_arg("replicate", 1)];
        run(&ws, op("DotProductWithPadding", &["r", "s"], &["z"], rep())).unwrap();
        assert_eq!(vals(&get(&ws, "z")), vec![64.]);
        run(
            &ws,
            op(
                "DotProductWithPaddingGradient",
                &["r", "s", "g"],
                &["dr", "ds"],
                rep(),
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "dr")), vec![1., 10., 1., 10.]);
        assert_eq!(vals(&get(&ws, "ds")), vec![4., 6.]);
        // 3 is not a whole number of 2s.
        let e = run(&ws, op("DotProductWithPadding", &["p", "q"], &["z"], rep())).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }
}
