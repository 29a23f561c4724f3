//! What the op families share: typed access to an op's inputs (with the
//! errors that name the op and the blob), the float dtype of an input and
//! the dispatch on it, the lock-then-dispatch kernel wrapper, axis and
//! order arguments, integer-vector inputs, and the in-place rules several
//! schemas use. Nothing here is an op; a family file imports what it needs
//! from here and from no other family.

use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx};
use crate::tensor::{DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};

// --------------------------------------------------------------- kernels --

/// A kernel written as a plain function of its context (most ops have no
/// state of their own).
pub struct FnOp<F>(pub F);

impl<F> crate::operator::Operator for FnOp<F>
where
    F: FnMut(&mut crate::operator::OpCx<'_>) -> crate::error::Result<bool> + Send,
{
    fn run(&mut self, cx: &mut crate::operator::OpCx<'_>) -> crate::error::Result<bool> {
        (self.0)(cx)
    }
}

/// Boxes a closure as a kernel.
pub fn kernel<F>(f: F) -> Box<dyn crate::operator::Operator>
where
    F: FnMut(&mut crate::operator::OpCx<'_>) -> crate::error::Result<bool> + Send + 'static,
{
    Box::new(FnOp(f))
}

/// Applies a generic function to the element type of a dtype (through
/// [`crate::with_match_dtype!`]).
macro_rules! by_dtype {
    ($dt:expr, $f:ident ( $($a:expr),* )) => {
        crate::with_match_dtype!($dt, |T| $f::<T>($($a),*),
            else other => Err(crate::tensor::unsupported_dtype(other)))
    };
}
pub(crate) use by_dtype;

// ---------------------------------------------------------------- inputs --

/// "float32 or float64", for type errors (the set `floats`).
pub(crate) fn float_types() -> String {
    crate::tensor::dtype_choice(DataType::FLOATS)
}

/// Input `i` as an array of `T`, or a type error naming the op and blob.
pub(crate) fn input<'l, T: Element>(
    l: &'l Locked<'_>,
    op: &str,
    i: usize,
) -> Result<&'l ArrayD<T>> {
    let t = l.tensor(i)?;
    T::view(t).ok_or_else(|| {
        let name = l.input_name(i);
        Error::type_error(format!(
            "{op}: input {i} ('{name}') must be a {} tensor like input 0, got {}",
            T::DTYPE,
            t.dtype()
        ))
        .with_blob(name)
    })
}

/// The float type of input `i`, or a type error naming the op and blob.
pub(crate) fn float_dtype(l: &Locked<'_>, op: &str, i: usize) -> Result<DataType> {
    let t = l.tensor(i)?;
    match t.dtype() {
        d if DataType::FLOATS.contains(&d) => Ok(d),
        other => {
            let name = l.input_name(i);
            Err(Error::type_error(format!(
                "{op}: input {i} ('{name}') must be a {} tensor, got {other}",
                float_types()
            ))
            .with_blob(name))
        }
    }
}

/// Runs `$f::<T>(args)` for the float type of input `$i` of the locked
/// blobs `$l` (a type error naming op `$op` for any other dtype).
macro_rules! by_float {
    ($l:expr, $op:expr, $i:expr, $f:ident ( $($a:expr),* )) => {
        crate::with_match_dtype!(floats $crate::ops::kit::float_dtype($l, $op, $i)?,
            |T| $f::<T>($($a),*),
            else other => Err(crate::tensor::unsupported_dtype(other)))
    };
}
pub(crate) use by_float;

/// The kernel most float ops are: lock the op's blobs, then run
/// `$f::<T>(&mut l, args)` for the float type of input `$i` (the body
/// names the locked blobs `$l`). Arguments read when the op is built are
/// moved into the kernel.
macro_rules! float_kernel {
    ($op:expr, $i:expr, |$l:ident| $f:ident ( $($a:expr),* )) => {
        Ok($crate::ops::kit::kernel(move |cx| {
            #[allow(unused_mut)]
            let mut $l = cx.lock();
            $crate::ops::kit::by_float!(&$l, $op, $i, $f($($a),*))?;
            Ok(true)
        }))
    };
}
pub(crate) use float_kernel;

/// The sum of `f(v)` over `v`, in 16 interleaved partial sums (which the
/// compiler keeps in vector registers: one AVX-512 register of float32)
/// added up pairwise at the end. Call it inside [`crate::vmath::wide`] for
/// the widest vectors.
#[inline(always)]
pub(crate) fn lane_sum<T: Float>(v: &[T], f: impl Fn(T) -> T) -> T {
    const LANES: usize = 16;
    let zero = T::of(0.0);
    let mut acc = [zero; LANES];
    let mut it = v.chunks_exact(LANES);
    for ch in &mut it {
        for (a, &x) in acc.iter_mut().zip(ch) {
            *a += f(x);
        }
    }
    let mut tail = zero;
    for &x in it.remainder() {
        tail += f(x);
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] = acc[i] + acc[i + width];
        }
    }
    acc[0] + tail
}

/// The elements of `a` as one row-major slice (borrowed when `a` is
/// contiguous in standard order, else copied).
pub(crate) fn dense<T: Element + Copy>(a: &ArrayD<T>) -> std::borrow::Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().copied().collect()),
    }
}

/// An array of `shape` over `v` (which holds exactly as many elements).
pub(crate) fn array<T: Element>(shape: &[usize], v: Vec<T>) -> Result<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| Error::internal(e.to_string()))
}

/// Checks that inputs `i` and `j` have one shape, naming both.
pub(crate) fn same_shape(op: &str, l: &Locked<'_>, i: usize, j: usize) -> Result<()> {
    let (a, b) = (l.tensor(i)?.shape(), l.tensor(j)?.shape());
    if a != b {
        return Err(Error::shape(format!(
            "{op}: '{}' (shape {a:?}) and '{}' (shape {b:?}) must have the same shape",
            l.input_name(i),
            l.input_name(j)
        ))
        .with_blob(l.input_name(j)));
    }
    Ok(())
}

/// The values of an int32 or int64 tensor as int64 (fallibly allocated),
/// `None` for any other dtype (the caller's error says what it wanted).
pub(crate) fn int_values(t: &Tensor) -> Result<Option<Vec<i64>>> {
    crate::with_match_dtype!(tensor ints t,
        |a: T| crate::tensor::try_collect(a.iter().map(|&v| i64::from(v)), "a kernel buffer").map(Some),
        else _ => Ok(None))
}

/// [`int_values`] of a 1-D tensor (`None` for another rank or dtype).
pub(crate) fn int_vector(t: &Tensor) -> Result<Option<Vec<i64>>> {
    if t.ndim() != 1 {
        return Ok(None);
    }
    int_values(t)
}

/// `|v|` of a float (the sign of a -0.0 is kept).
pub(crate) fn abs<T: Float>(v: T) -> T {
    if v < T::of(0.0) {
        -v
    } else {
        v
    }
}

/// -1, 0 or 1 (0 for 0 and NaN).
pub(crate) fn sign<T: Float>(v: T) -> T {
    let zero = T::of(0.0);
    if v > zero {
        T::of(1.0)
    } else if v < zero {
        T::of(-1.0)
    } else {
        zero
    }
}

/// `shape` padded with 1s to `ndim` dims, its dims starting at `offset`.
pub(crate) fn padded(shape: &[usize], ndim: usize, offset: usize) -> Vec<usize> {
    let mut p = vec![1; ndim];
    p[offset..offset + shape.len()].copy_from_slice(shape);
    p
}

/// Input `i` as float32, or a type error naming the op and blob.
pub(crate) fn f32_in<'l>(
    l: &'l Locked<'_>,
    op: &str,
    i: usize,
    what: &str,
) -> Result<&'l ArrayD<f32>> {
    let t = l.tensor(i)?;
    match t {
        Tensor::F32(a) => Ok(a),
        _ => {
            let name = l.input_name(i);
            Err(Error::type_error(format!(
                "{op}: {what} ('{name}') must be a float32 tensor, got {}. To fix: {}",
                t.dtype(),
                DataType::Float.conversion_hint(name)
            ))
            .with_blob(name))
        }
    }
}

/// Input `i` as int64 indices (int32 or int64 tensors).
pub(crate) fn indices(l: &Locked<'_>, op: &str, i: usize) -> Result<(Vec<i64>, Vec<usize>)> {
    let t = l.tensor(i)?;
    let v = super::kit::int_values(t)?.ok_or_else(|| {
        let name = l.input_name(i);
        Error::type_error(format!(
            "{op}: the indices ('{name}') must be an int32 or int64 tensor, got {}",
            t.dtype()
        ))
        .with_blob(name)
    })?;
    Ok((v, t.shape().to_vec()))
}

/// Checks each index against `n` rows (negatives from the end if `wrap`).
pub(crate) fn checked_rows(
    op: &str,
    idx: &[i64],
    n: usize,
    wrap: bool,
    blob: &str,
) -> Result<Vec<usize>> {
    idx.iter()
        .map(|&v| {
            let w = if wrap && v < 0 { v + n as i64 } else { v };
            usize::try_from(w).ok().filter(|&u| u < n).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "{op}: index {v} is out of range for a dim of size {n}"
                ))
                .with_blob(blob)
            })
        })
        .collect()
}

// ------------------------------------------------------ axes and orders --

/// Caffe2's canonical axis: `axis` in [-ndim, ndim), negatives from the end.
pub(crate) fn canonical_axis(
    op: &str,
    what: &str,
    axis: i64,
    ndim: usize,
    blob: &str,
) -> Result<usize> {
    let n = ndim as i64;
    let a = if axis < 0 { axis + n } else { axis };
    if a < 0 || a > n || (a == n && n > 0) {
        return Err(Error::invalid_arg(format!(
            "{op}: {what} {axis} is out of range for a tensor of {ndim} dims"
        ))
        .with_blob(blob));
    }
    Ok(a as usize)
}

/// (product of dims before `axis`, product of dims from `axis`).
pub(crate) fn split_at(shape: &[usize], axis: usize) -> (usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis..].iter().product(),
    )
}

/// NCHW (channels after the batch dim) or NHWC (channels last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    Nchw,
    Nhwc,
}

/// The `order` argument ("NCHW" by default).
pub(crate) fn parse_order(ctx: &OpDefCtx<'_>) -> Result<Order> {
    match ctx.args.string("order", "NCHW")?.as_str() {
        "NCHW" => Ok(Order::Nchw),
        "NHWC" => Ok(Order::Nhwc),
        other => Err(ctx.bad_arg(format!(
            "order must be \"NCHW\" or \"NHWC\", got \"{other}\""
        ))),
    }
}

// ------------------------------------------------------- in-place rules --

/// Output 0 may be input 0.
pub(crate) fn in_place_0_0(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

/// Output 0 may be input 1.
pub(crate) fn in_place_1_0(i: usize, o: usize) -> bool {
    i == 1 && o == 0
}

/// Output 0 may be input 2.
pub(crate) fn in_place_2_0(i: usize, o: usize) -> bool {
    i == 2 && o == 0
}

/// Output 0 may be input 0 or input 1.
pub(crate) fn in_place_0_or_1(i: usize, o: usize) -> bool {
    o == 0 && i <= 1
}
