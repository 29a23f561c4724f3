//! The machinery of the elementwise ops (`arith.rs`, `logic.rs`,
//! `cast.rs`): numpy's and Caffe2's legacy broadcasting, checked once per
//! shape (`Prep`), and the loops that write a result into the output's own
//! buffer, in place when the output is an input, split across the kernel
//! pool when large and streamed out past the cache when very large (see
//! the family's doc in `mod.rs`).

#![allow(clippy::result_large_err)]

use crate::arg;
use crate::blob::BlobValue;
use crate::error::{Error, Result};
use crate::operator::{ArgDoc, InPlace, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo};
use crate::ops::kit::kernel;
use crate::tensor::{DataType, Element, Tensor};
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, CowArray, IxDyn, Zip};
use rayon::prelude::*;
use smallvec::SmallVec;

pub(crate) type Shape = SmallVec<[usize; 6]>;

/// Contiguous work of at least this many elements is split across threads
/// (when the kernel pool could be started, `threads::pool_available`).
/// Handing an op to the pool costs a wake-up of its sleeping threads, tens
/// of microseconds in a VM: measured there, an Add of 2^16 float32 took 22 us
/// on the pool and 7 us inline, 2^17 took 29 vs 16 us, and the two broke even
/// near 2^18.
pub(super) const PAR_MIN_LEN: usize = 1 << 18;
/// Elements per chunk of a parallel loop.
pub(super) const PAR_CHUNK: usize = 1 << 14;
/// Most chunks that one rayon task takes. Left alone, rayon cuts a loop into
/// a few large pieces per thread; when the OS deschedules one pool thread (on
/// a shared machine another process gets its core), that thread holds a
/// quarter of the op or so and the others idle until it comes back. Tasks of
/// a few chunks let the running threads take over the rest.
pub(super) const TASK_CHUNKS: usize = 4;
/// Separate outputs of at least this many bytes are written with streaming
/// stores (see the module doc): well past the per-core share of a last-level
/// cache, so nothing is lost by not leaving them in cache.
pub(super) const STREAM_MIN_BYTES: usize = 16 << 20;
/// Elements computed into the scratch buffer before they are streamed out
/// (4 KiB of float32: stays in L1).
pub(super) const STREAM_BLOCK: usize = 1024;
/// Largest element count of a result (keeps byte sizes far below isize::MAX).
pub(super) const MAX_NUMEL: usize = (isize::MAX as usize) / 16;

pub(super) const ARITH_TYPES: &[DataType] = DataType::ARITH;
pub(super) const CMP_TYPES: &[DataType] = DataType::ARITH_AND_BOOL;
pub(super) const BOOL_TYPES: &[DataType] = &[DataType::Bool];
pub(super) const SUM_TYPES: &[DataType] = DataType::ARITH;
pub(super) const SCALE_TYPES: &[DataType] = DataType::FLOATS;

pub(super) const BCAST_ARGS: &[ArgDoc] = &[
    arg!(
        "broadcast",
        "int",
        "0",
        "0: numpy-style broadcasting of A and B, aligned from the right; 1: legacy broadcasting of B onto A's shape"
    ),
    arg!(
        "axis",
        "int",
        "A.ndim - B.ndim",
        "legacy broadcasting only: the dim of A where B's dims start (-1 means the default)"
    ),
    arg!("axis_str", "string", "\"\"", "legacy broadcasting only: the axis as one letter of `order` (not with axis)"),
    arg!("order", "string", "\"NCHW\"", "legacy broadcasting only: the dim letters that axis_str is looked up in"),
];

pub(super) fn in_place_a(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

pub(super) fn in_place_a_or_b(i: usize, o: usize) -> bool {
    o == 0 && i <= 1
}

pub(super) fn binary_schema_typed(
    name: &'static str,
    build: crate::operator::BuildFn,
    inplace: InPlace,
    doc: &'static str,
    infer: crate::operator::InferFn,
) -> OpSchema {
    OpSchema::new(name, build)
        .inputs(2, 2)
        .outputs(1, 1)
        .inplace(inplace)
        .args(BCAST_ARGS)
        .infer(infer)
        .doc(doc)
}

/// The output of a binary op from its inputs' (Caffe2's
/// `ElementwiseOpShapeInference`): A's shape with legacy `broadcast`, else
/// numpy's broadcast of A and B (unknown if they do not broadcast: running
/// the op says why); A's type, or bool for comparisons and logic.
pub(super) fn binary_infer<const BOOL_OUT: bool>(
    args: &crate::args::Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    use crate::shapes::rules::known;
    let (Some(a), Some(b)) = (known(ins, 0), known(ins, 1)) else {
        return Ok(vec![None]);
    };
    let dtype = if BOOL_OUT { DataType::Bool } else { a.dtype };
    if args.i64("broadcast", 0)? != 0 {
        return Ok(vec![Some(ShapeInfo::new(a.dims.clone(), dtype))]);
    }
    let nd = a.dims.len().max(b.dims.len());
    let mut dims = vec![0i64; nd];
    for k in 0..nd {
        let at = |d: &[i64]| if k < d.len() { d[d.len() - 1 - k] } else { 1 };
        let (da, db) = (at(&a.dims), at(&b.dims));
        dims[nd - 1 - k] = match (da, db) {
            _ if da == db => da,
            (1, _) => db,
            (_, 1) => da,
            _ => return Ok(vec![None]),
        };
    }
    Ok(vec![Some(ShapeInfo::new(dims, dtype))])
}

// ------------------------------------------------------------- broadcasting --

/// The broadcasting arguments of a binary op, read once at construction.
#[derive(Clone, Copy, Debug)]
pub(super) struct Bcast {
    legacy: bool,
    /// Legacy mode: where B's dims start in A; `None` aligns B to A's end.
    axis: Option<usize>,
}

impl Bcast {
    fn from_args(ctx: &OpDefCtx<'_>) -> Result<Bcast> {
        // All four are read (with the field rules) even when broadcast is 0,
        // as Caffe2 did; they are only interpreted in legacy mode.
        let legacy = ctx.args.bool("broadcast", false)?;
        if !legacy {
            ctx.args.i64("axis", -1)?;
            ctx.args.string("axis_str", "")?;
            ctx.args.string("order", "NCHW")?;
            return Ok(Bcast { legacy, axis: None });
        }
        Ok(Bcast {
            legacy,
            axis: legacy_axis(ctx)?,
        })
    }
}

/// Caffe2's legacy-broadcasting axis from the arguments `axis`, `axis_str`
/// and `order` (the binary ops, their gradients and SumReduceLike): where
/// B's dims start in A, `None` for the default (aligned to A's end).
pub(crate) fn legacy_axis(ctx: &OpDefCtx<'_>) -> Result<Option<usize>> {
    let axis = ctx.args.i64("axis", -1)?;
    let axis_str = ctx.args.string("axis_str", "")?;
    let order = ctx.args.string("order", "NCHW")?;
    if axis != -1 {
        if !axis_str.is_empty() {
            return Err(ctx.bad_arg("args axis and axis_str cannot be used simultaneously"));
        }
        return match usize::try_from(axis) {
            Ok(a) => Ok(Some(a)),
            Err(_) => Err(ctx.bad_arg(format!(
                "broadcast axis must be >= 0 (or -1 for the default), got {axis}"
            ))),
        };
    }
    if axis_str.is_empty() {
        return Ok(None);
    }
    if axis_str.chars().count() != 1 {
        return Err(ctx.bad_arg(format!(
            "unsupported axis string '{axis_str}': it must be a single letter"
        )));
    }
    match order.find(axis_str.as_str()) {
        Some(pos) => Ok(Some(pos)),
        None => Err(ctx.bad_arg(format!(
            "unrecognizable axis string '{axis_str}' from order string '{order}'"
        ))),
    }
}

/// A binary op's validated inputs: the dtype and the result's shape. Each
/// kernel keeps one and refills it on every run (no allocation).
pub(super) struct Prep {
    pub(super) dtype: DataType,
    pub(super) out: Shape,
    /// Legacy mode: B takes part in broadcasting with this shape (A's ndim,
    /// ones outside B's span) instead of its own.
    pub(super) b_shape: Shape,
    pub(super) b_reshaped: bool,
    pub(super) numel: usize,
    /// The input shapes this was worked out for (with `dtype`), when it
    /// succeeded: the next run with the same ones reuses it, since nothing
    /// else it depends on (broadcast arguments, aliasing) changes.
    pub(super) checked: Option<(Shape, Shape)>,
}

impl Prep {
    fn new() -> Prep {
        Prep {
            dtype: DataType::Undefined,
            out: Shape::new(),
            b_shape: Shape::new(),
            b_reshaped: false,
            numel: 0,
            checked: None,
        }
    }
}

pub(super) fn unsupported(op: &str, dtype: DataType, allowed: &[DataType]) -> Error {
    let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    Error::type_error(format!(
        "Unsupported type of tensor: {dtype} ({op} supports {})",
        names.join(", ")
    ))
}

pub(super) fn checked_numel(op: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= MAX_NUMEL)
        .ok_or_else(|| {
            Error::shape(format!(
                "{op}: the result shape {shape:?} has too many elements"
            ))
        })
}

/// numpy's multidirectional broadcasting, aligned from the right.
pub(crate) fn numpy_shape(
    op: &str,
    a: &[usize],
    b: &[usize],
    an: &str,
    bn: &str,
    out: &mut Shape,
) -> Result<()> {
    let nd = a.len().max(b.len());
    out.clear();
    out.resize(nd, 0);
    for k in 0..nd {
        let da = if k < a.len() { a[a.len() - 1 - k] } else { 1 };
        let db = if k < b.len() { b[b.len() - 1 - k] } else { 1 };
        if da != db && da != 1 && db != 1 {
            return Err(Error::shape(format!(
                "{op}: cannot broadcast A ('{an}', shape {a:?}) with B ('{bn}', shape {b:?}): dims {da} and {db} \
                 at position {k} from the right must be equal or one of them 1"
            ))
            .with_blob(bn));
        }
        out[nd - 1 - k] = if da == 0 || db == 0 { 0 } else { da.max(db) };
    }
    Ok(())
}

/// Caffe2's legacy broadcasting of B onto A: the result has A's shape and B
/// is seen with shape `bs` (0-dim when it has one element).
pub(crate) fn legacy_shapes(
    op: &str,
    a: &[usize],
    b: &[usize],
    axis: Option<usize>,
    (an, bn): (&str, &str),
    bs: &mut Shape,
) -> Result<()> {
    bs.clear();
    if b.iter().product::<usize>() == 1 {
        return Ok(());
    }
    if b.len() > a.len() {
        return Err(Error::shape(format!(
            "{op}: with broadcast=1, B ('{bn}', shape {b:?}) must not have more dims than A ('{an}', shape {a:?})"
        ))
        .with_blob(bn));
    }
    let room = a.len() - b.len();
    let axis = axis.unwrap_or(room);
    if axis > room {
        return Err(Error::shape(format!(
            "{op}: broadcast axis must be in [0, A.ndim - B.ndim] = [0, {room}] for A ('{an}', shape {a:?}) \
             and B ('{bn}', shape {b:?}), but axis = {axis}"
        ))
        .with_blob(bn));
    }
    let start = b.iter().take_while(|&&d| d == 1).count();
    let end = b.len() - b[start..].iter().rev().take_while(|&&d| d == 1).count();
    bs.resize(a.len(), 1);
    for i in start..end {
        if a[axis + i] != b[i] {
            return Err(Error::shape(format!(
                "{op}: Broadcast dimension mismatch: dim {i} of B ('{bn}', shape {b:?}) is {} but dim {} of A \
                 ('{an}', shape {a:?}) is {} (axis = {axis})",
                b[i],
                axis + i,
                a[axis + i]
            ))
            .with_blob(bn));
        }
        bs[axis + i] = b[i];
    }
    Ok(())
}

/// Checks a binary op's inputs (dtypes, broadcasting, in-place shape rules)
/// before anything is written.
pub(super) fn prepare(
    l: &Locked<'_>,
    op: &str,
    bc: &Bcast,
    allowed: &[DataType],
    p: &mut Prep,
) -> Result<()> {
    let (a, b) = (l.tensor(0)?, l.tensor(1)?);
    if let Some((sa, sb)) = &p.checked {
        if a.dtype() == p.dtype
            && b.dtype() == p.dtype
            && same_dims(a.shape(), sa)
            && same_dims(b.shape(), sb)
        {
            return Ok(());
        }
    }
    p.checked = None;
    prepare_anew(a, b, l, op, bc, allowed, p)?;
    p.checked = Some((a.shape().into(), b.shape().into()));
    Ok(())
}

/// Slice equality without the `memcmp` call that `==` makes: shapes are a
/// handful of dims, and this runs once per binary op per run.
#[inline(always)]
pub(super) fn same_dims(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

pub(super) fn prepare_anew(
    a: &Tensor,
    b: &Tensor,
    l: &Locked<'_>,
    op: &str,
    bc: &Bcast,
    allowed: &[DataType],
    p: &mut Prep,
) -> Result<()> {
    let (an, bn) = (l.input_name(0), l.input_name(1));
    let dtype = a.dtype();
    if !allowed.contains(&dtype) {
        return Err(unsupported(op, dtype, allowed).with_blob(an));
    }
    if b.dtype() != dtype {
        return Err(Error::type_error(format!(
            "{op}: both inputs must have the same dtype, but A ('{an}') is {dtype} and B ('{bn}') is {}. {}",
            b.dtype(),
            dtype_fix((an, dtype), (bn, b.dtype()))
        ))
        .with_blob(bn));
    }
    p.dtype = dtype;
    if bc.legacy {
        if l.aliases(1, 0) {
            return Err(Error::invalid_arg(format!(
                "{op}: in-place is allowed only with the first input when broadcast=1, but B ('{bn}') is also the output"
            ))
            .with_blob(bn));
        }
        legacy_shapes(op, a.shape(), b.shape(), bc.axis, (an, bn), &mut p.b_shape)?;
        p.out.clear();
        p.out.extend_from_slice(a.shape());
        p.b_reshaped = true;
    } else {
        numpy_shape(op, a.shape(), b.shape(), an, bn, &mut p.out)?;
        p.b_reshaped = false;
        let aliased = if l.aliases(0, 0) {
            Some((an, a.shape()))
        } else if l.aliases(1, 0) {
            Some((bn, b.shape()))
        } else {
            None
        };
        if let Some((name, shape)) = aliased {
            if p.out.as_slice() != shape {
                return Err(Error::shape(format!(
                    "{op}: in-place on '{name}' requires the result shape {:?} to equal its shape {shape:?}",
                    p.out.as_slice()
                ))
                .with_blob(name));
            }
        }
    }
    p.numel = checked_numel(op, &p.out)?;
    Ok(())
}

// ------------------------------------------------------------------ helpers --

/// The end of a dtype mismatch error between two inputs: how to make them
/// agree. The input converted is the one holding numpy's default for Python
/// numbers (float64 or int64) when only one does, as in `FeedBlob("lr", 0.1)`
/// next to float32 data; otherwise the second input takes the first's dtype.
pub(super) fn dtype_fix(first: (&str, DataType), second: (&str, DataType)) -> String {
    let python_default = |d: DataType| matches!(d, DataType::Double | DataType::Int64);
    let ((name, _), (_, target)) = if python_default(first.1) && !python_default(second.1) {
        (first, second)
    } else {
        (second, first)
    };
    format!("To fix: {}", target.conversion_hint(name))
}

pub(super) fn bug(what: &str) -> Error {
    Error::internal(format!("elementwise kernel: {what}"))
}

/// Input `i` as an array of `T`; a wrong dtype names the blob.
pub(super) fn arr<'l, T: Element>(l: &'l Locked<'_>, i: usize) -> Result<&'l ArrayD<T>> {
    l.tensor(i)?
        .array::<T>()
        .map_err(|e| e.with_blob(l.input_name(i)))
}

/// The output value's array of `T`.
pub(super) fn out_array<T: Element>(o: &mut BlobValue) -> Result<&mut ArrayD<T>> {
    o.tensor_mut()?.array_mut::<T>()
}

/// An input of a broadcasting kernel: its array and the shape it broadcasts
/// with (its own, or B's legacy-broadcasting shape). Both have the same
/// elements in the same row-major order.
pub(super) struct Operand<'a, T> {
    a: &'a ArrayD<T>,
    shape: &'a [usize],
}

impl<'a, T: Element + Copy> Operand<'a, T> {
    pub(super) fn own(a: &'a ArrayD<T>) -> Self {
        Operand {
            a,
            shape: a.shape(),
        }
    }
    /// B of a binary op, as `p` says it broadcasts.
    pub(super) fn b(b: &'a ArrayD<T>, p: &'a Prep) -> Self {
        Operand {
            a: b,
            shape: if p.b_reshaped { &p.b_shape } else { b.shape() },
        }
    }
    /// The single element of a one-element operand.
    pub(super) fn scalar(&self) -> Option<T> {
        if self.a.len() == 1 {
            self.a.first().copied()
        } else {
            None
        }
    }
    /// The elements as a row-major slice when they repeat along the leading
    /// dims of `target` (equal shapes included).
    pub(super) fn repeating_slice(&self, target: &[usize]) -> Option<&'a [T]> {
        if is_suffix(self.shape, target) {
            self.a.as_slice()
        } else {
            None
        }
    }
    /// The elements as a row-major slice and the number of `target`'s
    /// trailing elements each one covers, when the operand's dims (leading
    /// and trailing 1s dropped; left-padded with 1s to `target`'s rank) are
    /// a run of `target`'s dims followed by other dims: Caffe2's legacy
    /// broadcast of a per-channel B over NCHW (`Mul(X, scale, broadcast=1,
    /// axis=1)`), or numpy's of a (C, 1, 1) one.
    pub(super) fn mid_run(&self, target: &[usize]) -> Option<(&'a [T], usize)> {
        let s = self.shape;
        let pad = target.len().checked_sub(s.len())?;
        let lead = pad + s.iter().take_while(|&&d| d == 1).count();
        let trail = s.iter().rev().take_while(|&&d| d == 1).count();
        let end = target.len() - trail;
        if lead >= end || s[lead - pad..end - pad] != target[lead..end] {
            return None;
        }
        let inner: usize = target[end..].iter().product();
        Some((self.a.as_slice()?, inner))
    }
    /// A view with the broadcasting shape (a reshape only for legacy B).
    pub(super) fn view(&self) -> Result<CowArray<'a, T, IxDyn>> {
        if self.shape == self.a.shape() {
            Ok(CowArray::from(self.a.view()))
        } else {
            self.a
                .to_shape(IxDyn(self.shape))
                .map_err(|e| bug(&format!("reshaping B for legacy broadcasting: {e}")))
        }
    }
}

/// Whether `inner` (leading 1s dropped) is a suffix of `outer`, so that a
/// standard-layout `inner` repeats along `outer`'s leading dims.
pub(super) fn is_suffix(inner: &[usize], outer: &[usize]) -> bool {
    let lead = inner.iter().take_while(|&&d| d == 1).count();
    let s = &inner[lead..];
    s.len() <= outer.len() && outer[outer.len() - s.len()..] == *s
}

/// Runs `f` on the output taken out of its blob (so inputs stay readable),
/// then puts it back whatever happened.
pub(super) fn with_taken_output<'a, R>(
    l: &mut Locked<'a>,
    f: impl FnOnce(&Locked<'a>, &mut BlobValue) -> Result<R>,
) -> Result<R> {
    let mut o = std::mem::take(l.output(0));
    let r = f(l, &mut o);
    *l.output(0) = o;
    r
}

/// A contiguous buffer for a result of dtype `U` and `shape`: the output's own
/// buffer when it already has that dtype, shape and layout, else a new one.
pub(super) fn out_slice<'o, U: Element + Copy>(
    o: &'o mut BlobValue,
    shape: &[usize],
) -> Result<&'o mut [U]> {
    let reusable = match &*o {
        BlobValue::Tensor(t) => {
            // Not a buffer shared with anything else: it would be copied
            // on write, only to be overwritten.
            t.is_unique()
                && U::view(t).is_some_and(|a| a.shape() == shape && a.is_standard_layout())
        }
        _ => false,
    };
    if !reusable {
        *o = BlobValue::Tensor(U::wrap(crate::tensor::default_array::<U>(shape)?));
    }
    match o {
        BlobValue::Tensor(t) => U::view_mut(t).and_then(|a| a.as_slice_mut()),
        _ => None,
    }
    .ok_or_else(|| bug("the output buffer is not contiguous"))
}

/// The array's elements in row-major order as one mutable slice (making the
/// array standard-layout first if it is not).
pub(super) fn std_slice_mut<T: Element>(a: &mut ArrayD<T>) -> Result<&mut [T]> {
    if !a.is_standard_layout() {
        *a = crate::tensor::copy_array(a.view())?;
    }
    a.as_slice_mut()
        .ok_or_else(|| bug("the output buffer is not contiguous"))
}

// ------------------------------------------------------ slice loops (rayon) --

/// Non-temporal stores (x86-64 only; SSE2 is part of its baseline).
#[cfg(target_arch = "x86_64")]
pub(super) mod nt {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// Whether elements of `U` can be streamed: their size divides 16, so an
    /// aligned output reaches a 16-byte boundary on an element boundary.
    pub fn supports<U>() -> bool {
        matches!(std::mem::size_of::<U>(), 1 | 2 | 4 | 8 | 16)
    }

    /// dst = src, the 16-byte-aligned middle of dst with streaming stores
    /// (they bypass the cache; call [`fence`] before the data is shared).
    pub fn copy<U: Copy>(dst: &mut [U], src: &[U]) {
        assert_eq!(dst.len(), src.len());
        let size = std::mem::size_of::<U>();
        assert!(supports::<U>());
        let misalign = dst.as_ptr() as usize % 16;
        let head = (((16 - misalign) % 16) / size).min(dst.len());
        let per = 16 / size;
        let vecs = (dst.len() - head) / per;
        let body_end = head + vecs * per;
        dst[..head].copy_from_slice(&src[..head]);
        let d = dst[head..body_end].as_mut_ptr().cast::<__m128i>();
        let s = src[head..body_end].as_ptr().cast::<__m128i>();
        for i in 0..vecs {
            // SAFETY: d is 16-byte aligned (head skipped to the boundary) and
            // d.add(i) .. +16 bytes lies in dst[head..body_end]; s.add(i) lies
            // in src[head..body_end] (unaligned load). Bytes of Copy values
            // are copied whole, so every element written is a valid U.
            unsafe { _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i))) };
        }
        dst[body_end..].copy_from_slice(&src[body_end..]);
    }

    /// Orders this thread's streaming stores before its later stores (the
    /// rayon join that publishes the result).
    #[allow(unused_unsafe)]
    pub fn fence() {
        // SAFETY: SSE is part of the x86-64 baseline.
        unsafe { _mm_sfence() }
    }
}

/// Whether a separate output of `n` elements of `U` is written with
/// streaming stores.
pub(super) fn streams<U>(n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        nt::supports::<U>() && n.saturating_mul(std::mem::size_of::<U>()) >= STREAM_MIN_BYTES
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = n;
        false
    }
}

/// Writes `out` block by block: `block(scratch, i)` computes the values of
/// `out[i .. i + scratch.len()]` into an L1-resident scratch buffer, which is
/// then streamed into `out` (plain copies where streaming is unavailable).
pub(super) fn stream_blocks<U: Copy + Default>(
    out: &mut [U],
    mut block: impl FnMut(&mut [U], usize),
) {
    let mut buf = [U::default(); STREAM_BLOCK];
    let mut i = 0;
    for o in out.chunks_mut(STREAM_BLOCK) {
        let t = &mut buf[..o.len()];
        block(t, i);
        #[cfg(target_arch = "x86_64")]
        nt::copy(o, t);
        #[cfg(not(target_arch = "x86_64"))]
        o.copy_from_slice(t);
        i += o.len();
    }
    #[cfg(target_arch = "x86_64")]
    nt::fence();
}

pub(super) fn map2_seq<T: Copy, U, F: Fn(T, T) -> U>(out: &mut [U], a: &[T], b: &[T], f: &F) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// map2_seq, streamed out when `stream`.
pub(super) fn map2_task<T: Copy, U: Copy + Default, F: Fn(T, T) -> U>(
    out: &mut [U],
    a: &[T],
    b: &[T],
    f: &F,
    stream: bool,
) {
    if stream {
        stream_blocks(out, |t, i| {
            let j = i + t.len();
            map2_seq(t, &a[i..j], &b[i..j], f)
        });
    } else {
        map2_seq(out, a, b, f);
    }
}

/// out[i] = f(a[i], b[i]).
pub(super) fn map2<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
    out: &mut [U],
    a: &[T],
    b: &[T],
    f: F,
) {
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        let stream = streams::<U>(out.len());
        out.par_chunks_mut(PAR_CHUNK)
            .zip(a.par_chunks(PAR_CHUNK))
            .zip(b.par_chunks(PAR_CHUNK))
            .with_max_len(TASK_CHUNKS)
            .for_each(|((o, x), y)| map2_task(o, x, y, &f, stream));
    } else {
        map2_seq(out, a, b, &f);
    }
}

/// out[k] = f(a[k], b[(j + k) % b.len()]) for a `j < b.len()`: b's
/// contiguous runs, so every inner loop is a plain (vectorisable) map2.
pub(super) fn map2_rep_seq<T: Copy, U, F: Fn(T, T) -> U>(
    out: &mut [U],
    a: &[T],
    b: &[T],
    mut j: usize,
    f: &F,
) {
    let mut k = 0;
    while k < out.len() {
        let len = (b.len() - j).min(out.len() - k);
        map2_seq(&mut out[k..k + len], &a[k..k + len], &b[j..j + len], f);
        k += len;
        j = 0;
    }
}

/// out[i] = f(a[i], b[i % b.len()]): `b` repeats along the leading dims.
pub(super) fn map2_rep<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
    out: &mut [U],
    a: &[T],
    b: &[T],
    f: F,
) {
    let m = b.len();
    if m == out.len() {
        return map2(out, a, b, f);
    }
    let stream = streams::<U>(out.len());
    // Each task starts at a multiple of m, so b starts over at its index 0.
    let task = |o: &mut [U], x: &[T]| {
        if stream {
            stream_blocks(o, |t, i| map2_rep_seq(t, &x[i..i + t.len()], b, i % m, &f));
        } else {
            map2_rep_seq(o, x, b, 0, &f);
        }
    };
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        let per = (PAR_CHUNK / m).max(1) * m;
        out.par_chunks_mut(per)
            .zip(a.par_chunks(per))
            .with_max_len(TASK_CHUNKS)
            .for_each(|(o, x)| task(o, x));
    } else {
        task(out, a);
    }
}

/// out[i] = f(a[i], b[(i / inner) % b.len()]): each element of `b` covers
/// `inner` consecutive elements (a per-channel operand over NCHW planes).
pub(super) fn map2_mid<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
    out: &mut [U],
    a: &[T],
    b: &[T],
    inner: usize,
    f: F,
) {
    if inner == 0 || b.is_empty() {
        return;
    }
    let m = b.len();
    // Blocks j0.. of `inner` elements.
    let seq = |o: &mut [U], x: &[T], j0: usize| {
        for (j, (o, x)) in o.chunks_mut(inner).zip(x.chunks(inner)).enumerate() {
            let y = b[(j0 + j) % m];
            for (o, &x) in o.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
    };
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        let blocks = (PAR_CHUNK / inner).max(1);
        out.par_chunks_mut(blocks * inner)
            .zip(a.par_chunks(blocks * inner))
            .enumerate()
            .with_max_len(TASK_CHUNKS)
            .for_each(|(i, (o, x))| seq(o, x, i * blocks));
    } else {
        seq(out, a, 0);
    }
}

/// out[i] = g(out[i], b[(i / inner) % b.len()]) (see [`map2_mid`]).
pub(super) fn upd1_mid<T: Copy + Send + Sync, G: Fn(T, T) -> T + Sync>(
    out: &mut [T],
    b: &[T],
    inner: usize,
    g: G,
) {
    if inner == 0 || b.is_empty() {
        return;
    }
    let m = b.len();
    let seq = |o: &mut [T], j0: usize| {
        for (j, o) in o.chunks_mut(inner).enumerate() {
            let y = b[(j0 + j) % m];
            for o in o.iter_mut() {
                *o = g(*o, y);
            }
        }
    };
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        let blocks = (PAR_CHUNK / inner).max(1);
        out.par_chunks_mut(blocks * inner)
            .enumerate()
            .with_max_len(TASK_CHUNKS)
            .for_each(|(i, o)| seq(o, i * blocks));
    } else {
        seq(out, 0);
    }
}

/// out[i] = g(a[i]).
pub(super) fn map1<T: Copy + Sync, U: Copy + Default + Send, G: Fn(T) -> U + Sync>(
    out: &mut [U],
    a: &[T],
    g: G,
) {
    let seq = |o: &mut [U], x: &[T]| {
        for (o, &x) in o.iter_mut().zip(x) {
            *o = g(x);
        }
    };
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        let stream = streams::<U>(out.len());
        out.par_chunks_mut(PAR_CHUNK)
            .zip(a.par_chunks(PAR_CHUNK))
            .with_max_len(TASK_CHUNKS)
            .for_each(|(o, x)| {
                if stream {
                    stream_blocks(o, |t, i| seq(t, &x[i..i + t.len()]));
                } else {
                    seq(o, x);
                }
            });
    } else {
        seq(out, a);
    }
}

/// out[i] = g(out[i]).
pub(super) fn upd0<T: Copy + Send, G: Fn(T) -> T + Sync>(out: &mut [T], g: G) {
    let seq = |o: &mut [T]| {
        for o in o.iter_mut() {
            *o = g(*o);
        }
    };
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        out.par_chunks_mut(PAR_CHUNK)
            .with_max_len(TASK_CHUNKS)
            .for_each(seq);
    } else {
        seq(out);
    }
}

/// out[i] = g(out[i], b[i % b.len()]).
pub(super) fn upd1_rep<T: Copy + Send + Sync, G: Fn(T, T) -> T + Sync>(
    out: &mut [T],
    b: &[T],
    g: G,
) {
    let m = b.len();
    let seq = |o: &mut [T]| {
        for oc in o.chunks_mut(m) {
            for (o, &y) in oc.iter_mut().zip(b) {
                *o = g(*o, y);
            }
        }
    };
    if out.len() >= PAR_MIN_LEN && crate::threads::pool_available() {
        if m == out.len() {
            out.par_chunks_mut(PAR_CHUNK)
                .zip(b.par_chunks(PAR_CHUNK))
                .with_max_len(TASK_CHUNKS)
                .for_each(|(o, y)| {
                    for (o, &y) in o.iter_mut().zip(y) {
                        *o = g(*o, y);
                    }
                });
        } else {
            let per = (PAR_CHUNK / m).max(1) * m;
            out.par_chunks_mut(per)
                .with_max_len(TASK_CHUNKS)
                .for_each(seq);
        }
    } else {
        seq(out);
    }
}

/// Applies `g` to every element of `out`, in place.
pub(super) fn apply0<T: Element + Copy, G: Fn(T) -> T + Copy + Send + Sync>(
    out: &mut ArrayD<T>,
    g: G,
) {
    if out.len() == 1 {
        if let Some(x) = out.first_mut() {
            *x = g(*x);
        }
    } else if let Some(s) = out.as_slice_memory_order_mut() {
        upd0(s, g);
    } else {
        out.mapv_inplace(g);
    }
}

// ----------------------------------------------------------------- kernels --

/// out = f(a, b) broadcast to `shape`, into a contiguous buffer of that shape.
pub(super) fn fill<T, U, F>(
    out: &mut [U],
    shape: &[usize],
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    f: F,
) -> Result<()>
where
    T: Element + Copy,
    U: Element + Copy,
    F: Fn(T, T) -> U + Copy + Send + Sync,
{
    let n = out.len();
    if n == 0 {
        return Ok(());
    }
    let (a_rep, b_rep) = (a.repeating_slice(shape), b.repeating_slice(shape));
    let (a_full, b_full) = (
        a_rep.filter(|x| x.len() == n),
        b_rep.filter(|x| x.len() == n),
    );
    if let (Some(x), Some(y)) = (a_full, b_full) {
        map2(out, x, y, f);
        return Ok(());
    }
    if let (Some(x), Some(s)) = (a_full, b.scalar()) {
        map1(out, x, move |v| f(v, s));
        return Ok(());
    }
    if let (Some(s), Some(y)) = (a.scalar(), b_full) {
        map1(out, y, move |v| f(s, v));
        return Ok(());
    }
    if let (Some(x), Some(y)) = (a_full, b_rep) {
        map2_rep(out, x, y, f);
        return Ok(());
    }
    if let (Some(x), Some(y)) = (a_rep, b_full) {
        map2_rep(out, y, x, move |v, u| f(u, v));
        return Ok(());
    }
    if let (Some(x), Some((y, inner))) = (a_full, b.mid_run(shape)) {
        map2_mid(out, x, y, inner, f);
        return Ok(());
    }
    let (av, bv) = (a.view()?, b.view()?);
    let av = av
        .broadcast(IxDyn(shape))
        .ok_or_else(|| bug("A does not broadcast to the result"))?;
    let bv = bv
        .broadcast(IxDyn(shape))
        .ok_or_else(|| bug("B does not broadcast to the result"))?;
    let ov = ArrayViewMutD::from_shape(IxDyn(shape), out).map_err(|e| bug(&e.to_string()))?;
    Zip::from(ov)
        .and(av)
        .and(bv)
        .for_each(|o, &x, &y| *o = f(x, y));
    Ok(())
}

/// Writes f(a, b) (of shape `shape`) into `o`, reusing its buffer if it fits.
pub(super) fn write_binary<T, U, F>(
    o: &mut BlobValue,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    shape: &[usize],
    f: F,
) -> Result<()>
where
    T: Element + Copy,
    U: Element + Copy,
    F: Fn(T, T) -> U + Copy + Send + Sync,
{
    let out = out_slice::<U>(o, shape)?;
    fill(out, shape, a, b, f)
}

/// Writes g(a) (a's shape) into `o`, reusing its buffer if it fits.
pub(super) fn write_unary<T, U, G>(o: &mut BlobValue, a: ArrayViewD<'_, T>, g: G) -> Result<()>
where
    T: Element + Copy,
    U: Element + Copy,
    G: Fn(T) -> U + Copy + Send + Sync,
{
    let src = a.as_standard_layout();
    let xs = src
        .as_slice()
        .ok_or_else(|| bug("a standard-layout copy is not contiguous"))?;
    let out = out_slice::<U>(o, a.shape())?;
    map1(out, xs, g);
    Ok(())
}

/// out = g(out, other) in place, `other` broadcasting to out's shape.
pub(super) fn update<T, G>(out: &mut ArrayD<T>, other: Operand<'_, T>, g: G) -> Result<()>
where
    T: Element + Copy,
    G: Fn(T, T) -> T + Copy + Send + Sync,
{
    if out.is_empty() {
        return Ok(());
    }
    if let Some(s) = other.scalar() {
        apply0(out, move |x| g(x, s));
        return Ok(());
    }
    if let Some(ys) = other.repeating_slice(out.shape()) {
        if let Some(os) = out.as_slice_mut() {
            upd1_rep(os, ys, g);
            return Ok(());
        }
    }
    if let Some((ys, inner)) = other.mid_run(out.shape()) {
        if let Some(os) = out.as_slice_mut() {
            upd1_mid(os, ys, inner, g);
            return Ok(());
        }
    }
    let ov = other.view()?;
    let ob = ov
        .broadcast(out.raw_dim())
        .ok_or_else(|| bug("an input does not broadcast to the output"))?;
    Zip::from(out.view_mut())
        .and(ob)
        .for_each(|x, &y| *x = g(*x, y));
    Ok(())
}

/// A binary op whose result has the input dtype; handles in-place outputs.
pub(super) fn exec_same<T, F>(l: &mut Locked<'_>, p: &Prep, f: F) -> Result<()>
where
    T: Element + Copy,
    F: Fn(T, T) -> T + Copy + Send + Sync,
{
    // `prepare` checked the dtypes and the in-place shape rule.
    match (l.aliases(0, 0), l.aliases(1, 0)) {
        (false, false) => exec_to(l, p, f),
        (true, true) => {
            let r = out_array::<T>(l.output(0)).map(|o| apply0(o, move |x| f(x, x)));
            r.map_err(|e| e.with_blob(l.output_name(0)))
        }
        (true, false) => {
            let (o, b) = l
                .output_and_input(0, 1)
                .ok_or_else(|| bug("aliasing changed"))?;
            let b = b.tensor()?.array::<T>()?;
            update(out_array::<T>(o)?, Operand::b(b, p), f)
        }
        (false, true) => {
            let (o, a) = l
                .output_and_input(0, 0)
                .ok_or_else(|| bug("aliasing changed"))?;
            let a = a.tensor()?.array::<T>()?;
            update(out_array::<T>(o)?, Operand::own(a), move |x, y| f(y, x))
        }
    }
}

/// A binary op writing a (possibly different) dtype into a separate output.
pub(super) fn exec_to<T, U, F>(l: &mut Locked<'_>, p: &Prep, f: F) -> Result<()>
where
    T: Element + Copy,
    U: Element + Copy,
    F: Fn(T, T) -> U + Copy + Send + Sync,
{
    if l.aliases(0, 0) || l.aliases(1, 0) {
        // Only reachable if a schema allowed it: compute aside, then replace.
        let mut fresh = BlobValue::Empty;
        {
            let (a, b) = (arr::<T>(l, 0)?, arr::<T>(l, 1)?);
            write_binary(&mut fresh, Operand::own(a), Operand::b(b, p), &p.out, f)?;
        }
        *l.output(0) = fresh;
        return Ok(());
    }
    with_taken_output(l, |l, o| {
        let (a, b) = (arr::<T>(l, 0)?, arr::<T>(l, 1)?);
        write_binary(o, Operand::own(a), Operand::b(b, p), &p.out, f)
    })
}

/// A unary op with the input dtype; in place when the output is the input.
pub(super) fn unary_same<T, G>(l: &mut Locked<'_>, g: G) -> Result<()>
where
    T: Element + Copy,
    G: Fn(T) -> T + Copy + Send + Sync,
{
    if l.aliases(0, 0) {
        let r = out_array::<T>(l.output(0)).map(|a| apply0(a, g));
        return r.map_err(|e| e.with_blob(l.output_name(0)));
    }
    let (o, i) = l
        .output_and_input(0, 0)
        .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
    let a = i.tensor()?.array::<T>()?;
    write_unary(o, a.view(), g)
}

pub(super) fn unary_dtype(l: &Locked<'_>, op: &str, allowed: &[DataType]) -> Result<DataType> {
    let dt = l.tensor(0)?.dtype();
    if allowed.contains(&dt) {
        Ok(dt)
    } else {
        Err(unsupported(op, dt, allowed).with_blob(l.input_name(0)))
    }
}

pub(super) fn binary_kernel(
    ctx: &OpDefCtx<'_>,
    name: &'static str,
    types: &'static [DataType],
    exec: impl Fn(&mut Locked<'_>, &Prep) -> Result<()> + Send + 'static,
) -> Result<Box<dyn Operator>> {
    let bc = Bcast::from_args(ctx)?;
    let mut p = Prep::new();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        prepare(&l, name, &bc, types, &mut p)?;
        exec(&mut l, &p)?;
        Ok(true)
    }))
}
