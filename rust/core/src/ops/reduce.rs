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

use super::kit::kernel;
use super::kit::{abs, array, by_float, dense, float_kernel, input, lane_sum, sign};
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
        crate::tensor::try_vec::<T>(rows * cols, format_args!("the gradient of shape {shape:?}"))?;
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
    let v = dense(x);
    let s: T = crate::vmath::wide(
        #[inline(always)]
        || lane_sum(&v, |x| x),
    );
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

    use crate::tensor::Tensor;
    use crate::test_util::{f32s, get, int_arg, ints_arg, op, run, vals, ws_with};

    #[test]
    fn reductions_by_hand() {
        let ws = ws_with(&[("x", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]))]);
        run(
            &ws,
            op(
                "ReduceSum",
                &["x"],
                &["s"],
                vec![ints_arg("axes", &[1]), int_arg("keepdims", 0)],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "s")), vec![6., 15.]);
        run(
            &ws,
            op("ReduceMean", &["x"], &["m"], vec![ints_arg("axes", &[0])]),
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
            op("ReduceSum", &["x"], &["s"], vec![ints_arg("axes", &[2])]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn max_min_l1_l2_by_hand() {
        // x = [[1, -5, 3], [4, 2, -6]]
        let ws = ws_with(&[("x", f32s(&[2, 3], &[1., -5., 3., 4., 2., -6.]))]);
        let axis1 = || vec![ints_arg("axes", &[1]), int_arg("keepdims", 0)];
        run(&ws, op("ReduceMax", &["x"], &["mx"], axis1())).unwrap();
        assert_eq!(vals(&get(&ws, "mx")), vec![3., 4.]);
        run(
            &ws,
            op("ReduceMin", &["x"], &["mn"], vec![ints_arg("axes", &[-2])]),
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
            op("ReduceL2", &["x"], &["l2"], vec![ints_arg("axes", &[])]),
        )
        .unwrap();
        assert_eq!(get(&ws, "l2").shape(), &[1, 1]);
        assert!((vals(&get(&ws, "l2"))[0] - 91f32.sqrt()).abs() < 1e-5);
        // Integers: the max of int32 values, and no float-only op takes them.
        let xi = Tensor::from_vec(&[2, 2], vec![3i32, -7, 9, 2]).unwrap();
        let wi = ws_with(&[("xi", xi)]);
        run(
            &wi,
            op("ReduceMax", &["xi"], &["m"], vec![ints_arg("axes", &[0])]),
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
        let args = || vec![ints_arg("axes", &[1])];
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
}
