//! Reshapes and reductions (issue 14): Reshape, Flatten, FlattenToVec,
//! ExpandDims, Squeeze, ResizeLike, ReduceSum, ReduceMean,
//! ReduceFrontSum/Mean/Max, ReduceBackSum/Mean/Max and their gradient ops.
//!
//! The reshapes take any dtype and copy (Caffe2 shared the buffer); the
//! reductions take float32 or float64. Which gradient ops an op's gradient
//! takes is decided in `ferrocaffe/gradients.py`.

#![allow(clippy::result_large_err)]

use super::kernel;
use super::nn::{array, by_real, canonical_axis, dense, input, real_dtype, Real};
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};

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
            .doc(doc)
    };
    let reduce_grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_reduce_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(REDUCE_ARGS)
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
    ]
}

// ------------------------------------------------------------- reshapes --

fn reshaped_of<T: Element>(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let a = t.array::<T>()?;
    let v: Vec<T> = a.iter().cloned().collect();
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
    let known: usize = out.iter().product();
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
    let name = l.input_name(i);
    let v: Vec<i64> = match t {
        t if t.ndim() == 1 && DataType::INTS.contains(&t.dtype()) => {
            crate::with_match_dtype!(tensor ints t, |a: T| a.iter().map(|&v| i64::from(v)).collect(),
                else _ => Vec::new())
        }
        _ => {
            return Err(Error::type_error(format!(
                "{op}: the new shape ('{name}') must be a 1-D int32 or int64 tensor, got {} of shape {:?}",
                t.dtype(),
                t.shape()
            ))
            .with_blob(name))
        }
    };
    Ok(v)
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
            let dims: Vec<i64> = old.iter().map(|&d| d as i64).collect();
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
    let dims: Vec<usize> = dims.into_iter().map(|d| d as usize).collect();
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

fn reduce_t<T: Real>(
    l: &mut Locked<'_>,
    op: &str,
    axes: &Option<Vec<i64>>,
    keep: bool,
) -> Result<()> {
    let x = input::<T>(l, op, 0)?;
    let red = reduce_axes(op, axes, x.ndim(), l.input_name(0))?;
    let shape = x.shape().to_vec();
    let mut y = x.clone();
    let mut count = 1usize;
    for ax in (0..shape.len()).rev() {
        if red[ax] {
            count *= shape[ax];
            y = y
                .fold_axis(ndarray::Axis(ax), T::of(0.0), |&s, &v| s + v)
                .insert_axis(ndarray::Axis(ax));
        }
    }
    if op == "ReduceMean" {
        let c = T::of(count as f64);
        y.mapv_inplace(|v| if count == 0 { T::of(f64::NAN) } else { v / c });
    }
    let out_shape: Vec<usize> = if keep {
        kept_shape(&shape, &red)
    } else {
        shape
            .iter()
            .zip(&red)
            .filter(|(_, &r)| !r)
            .map(|(&d, _)| d)
            .collect()
    };
    let v = dense(&y).into_owned();
    l.set_output(0, T::wrap(array(&out_shape, v)?));
    Ok(())
}

fn build_reduce(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = ctx.args.ints("axes")?;
    let keep = ctx.args.i64("keepdims", 1)? != 0;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        // ReduceSum also sums int32 and int64 tensors (wrapping), as Caffe2's.
        let dt = l.tensor(0)?.dtype();
        if op == "ReduceSum" {
            crate::with_match_dtype!(ints dt, |T| reduce_sum_int::<T>(&mut l, &axes, keep)?,
                else _other => by_real!(&l, &op, 0, reduce_t(&mut l, &op, &axes, keep))?)
        } else {
            by_real!(&l, &op, 0, reduce_t(&mut l, &op, &axes, keep))?
        }
        Ok(true)
    }))
}

/// Integer types ReduceSum sums with wrapping, as Caffe2's C++ did.
trait WrappingSum: Element + Copy {
    fn wrapping_plus(self, o: Self) -> Self;
}

macro_rules! wrapping_sum {
    ($($t:ty),*) => {$(
        impl WrappingSum for $t {
            fn wrapping_plus(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
        }
    )*};
}
crate::with_match_dtype!(impl ints, wrapping_sum);

/// ReduceSum of an integer tensor: input 0 summed with wrapping over the
/// reduced dims.
fn reduce_sum_int<T: WrappingSum>(
    l: &mut Locked<'_>,
    axes: &Option<Vec<i64>>,
    keep: bool,
) -> Result<()> {
    let x = T::view(l.tensor(0)?).ok_or_else(|| Error::internal("dtype checked"))?;
    let red = reduce_axes("ReduceSum", axes, x.ndim(), l.input_name(0))?;
    let shape = x.shape().to_vec();
    let mut y = x.clone();
    for ax in (0..shape.len()).rev() {
        if red[ax] {
            y = y
                .fold_axis(ndarray::Axis(ax), T::default(), |&s: &T, &v: &T| {
                    s.wrapping_plus(v)
                })
                .insert_axis(ndarray::Axis(ax));
        }
    }
    let out_shape: Vec<usize> = if keep {
        kept_shape(&shape, &red)
    } else {
        shape
            .iter()
            .zip(&red)
            .filter(|(_, &r)| !r)
            .map(|(&d, _)| d)
            .collect()
    };
    let v: Vec<T> = y.iter().copied().collect();
    let a =
        ArrayD::from_shape_vec(IxDyn(&out_shape), v).map_err(|e| Error::internal(e.to_string()))?;
    l.set_output(0, T::wrap(a));
    Ok(())
}

/// dX (of `x_shape`) = dY (whose elements are those of the kept shape)
/// broadcast over the reduced dims, times `scale`.
fn expand_grad<T: Real>(
    dy: &ArrayD<T>,
    kept: &[usize],
    x_shape: &[usize],
    scale: T,
) -> Result<ArrayD<T>> {
    let g = array(kept, dense(dy).into_owned())?;
    let b = g
        .broadcast(IxDyn(x_shape))
        .ok_or_else(|| Error::internal("reduce gradient broadcast"))?;
    Ok(b.mapv(|v| v * scale))
}

fn reduce_grad_t<T: Real>(l: &mut Locked<'_>, op: &str, axes: &Option<Vec<i64>>) -> Result<()> {
    let dy = input::<T>(l, op, 0)?;
    let x_shape = l.tensor(1)?.shape().to_vec();
    let red = reduce_axes(op, axes, x_shape.len(), l.input_name(1))?;
    let kept = kept_shape(&x_shape, &red);
    if dy.len() != kept.iter().product::<usize>() {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) does not match X ('{}', shape {x_shape:?}) reduced over {axes:?}",
            l.input_name(0),
            dy.shape(),
            l.input_name(1)
        ))
        .with_blob(l.input_name(0)));
    }
    let count: usize = x_shape
        .iter()
        .zip(&red)
        .filter(|(_, &r)| r)
        .map(|(&d, _)| d)
        .product();
    let scale = if op == "ReduceMeanGradient" {
        T::of(1.0 / count.max(1) as f64)
    } else {
        T::of(1.0)
    };
    let dx = expand_grad(dy, &kept, &x_shape, scale)?;
    l.set_output(0, T::wrap(dx));
    Ok(())
}

fn build_reduce_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = ctx.args.ints("axes")?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_real!(&l, &op, 0, reduce_grad_t(&mut l, &op, &axes))?;
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
    let product = |dims: &[usize]| {
        dims.iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                Error::invalid_arg(format!("{op}: the shape {shape:?} has too many elements"))
                    .with_blob(blob)
            })
    };
    let (rows, cols) = (product(&shape[..split])?, product(&shape[split..])?);
    rows.checked_mul(cols).ok_or_else(|| {
        Error::invalid_arg(format!("{op}: the shape {shape:?} has too many elements"))
            .with_blob(blob)
    })?;
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
        return Ok(vec![full; n_out]);
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

fn front_back_max_t<T: Real>(
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
        let dx: Vec<T> = xs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (o, pos) = fb_place(i, cols, front);
                if pos < lens[o] && v == ys[o] {
                    g[o]
                } else {
                    T::of(0.0)
                }
            })
            .collect();
        let shape = x.shape().to_vec();
        l.set_output(0, T::wrap(array(&shape, dx)?));
        return Ok(());
    }
    let mut y = vec![T::of(f64::NEG_INFINITY); n_out];
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
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_real!(&l, &op, 0, front_back_max_t(&mut l, &op, k, lens_at, grad))?;
        Ok(true)
    }))
}

fn front_back_t<T: Real>(
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
    let mut y = vec![T::of(0.0); n_out];
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
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_real!(&l, &op, 0, front_back_t(&mut l, &op, k, lens_at))?;
        Ok(true)
    }))
}

fn front_back_grad_t<T: Real>(
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
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_real!(&l, &op, 0, front_back_grad_t(&mut l, &op, k, lens_at))?;
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::ir::Argument;
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
}
