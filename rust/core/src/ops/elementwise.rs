//! Elementwise ops: arithmetic (Add, Sub, Mul, Div), comparisons (EQ, NE, LT,
//! LE, GT, GE), logic (And, Or, Xor, Not), and Sum, WeightedSum, Scale, Cast.
//!
//! Semantics follow Caffe2's CPU kernels. Where Caffe2 had undefined
//! behaviour, this port picks one documented behaviour:
//! - Integer Add/Sub/Mul/Div wrap on overflow (two's complement, which is what
//!   Caffe2's C++ did in practice), so `i64::MIN / -1 == i64::MIN`. Integer
//!   division truncates toward zero. A zero integer divisor is a
//!   `DivisionByZero` error (Caffe2: undefined behaviour).
//! - Float arithmetic and comparisons follow IEEE 754 (x/0 is ±inf or NaN,
//!   and NaN compares unequal to everything).
//! - Cast from float to int truncates toward zero, like numpy's `astype`.
//!   Values outside the target's range saturate and NaN becomes 0 (C++:
//!   undefined). Int to int wraps (keeps the low bits). Numeric to bool is
//!   `x != 0` (so NaN gives true). Bool to numeric gives 0 or 1.
//! - Every check runs before any output is written, so an op that fails
//!   leaves its output (and an in-place input) unchanged.
//!
//! Performance: kernels write into the output's existing buffer when it
//! already holds a tensor of the result dtype and shape. When the output is an
//! input, they update it in place, so a scalar `x = x + 1` allocates nothing.
//! Contiguous operands of 256K elements or more are split across the rayon
//! pool, in tasks of a few 16K-element chunks.
//! A new output buffer of 4 MiB or more asks for huge pages, as numpy's arrays
//! do. A separate output of 16 MiB or more (too big to stay in cache for the
//! next op) is computed block by block into an L1-sized scratch buffer and
//! streamed out with non-temporal stores (x86-64): the output's cache lines
//! are then never read from memory before being overwritten (no
//! write-allocate), so the op moves 3 arrays instead of 4.

// The crate's `Error` is large (clippy flags every `Result` in every file);
// boxing it is a crate-wide decision, so this file does not fight the lint.
#![allow(clippy::result_large_err)]

use super::kernel;
use crate::arg;
use crate::blob::BlobValue;
use crate::error::{Error, ErrorKind, Result};
use crate::num::Number;
use crate::operator::{ArgDoc, InPlace, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo, MANY};
use crate::tensor::{copy_array, f16, DataType, Element, Tensor};
use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, CowArray, IxDyn, Zip};
use rayon::prelude::*;
use smallvec::SmallVec;

pub(super) type Shape = SmallVec<[usize; 6]>;

/// Contiguous work of at least this many elements is split across threads
/// (when the kernel pool could be started, `threads::pool_available`).
/// Handing an op to the pool costs a wake-up of its sleeping threads, tens
/// of microseconds in a VM: measured there, an Add of 2^16 float32 took 22 us
/// on the pool and 7 us inline, 2^17 took 29 vs 16 us, and the two broke even
/// near 2^18.
const PAR_MIN_LEN: usize = 1 << 18;
/// Elements per chunk of a parallel loop.
const PAR_CHUNK: usize = 1 << 14;
/// Most chunks that one rayon task takes. Left alone, rayon cuts a loop into
/// a few large pieces per thread; when the OS deschedules one pool thread (on
/// a shared machine another process gets its core), that thread holds a
/// quarter of the op or so and the others idle until it comes back. Tasks of
/// a few chunks let the running threads take over the rest.
const TASK_CHUNKS: usize = 4;
/// Separate outputs of at least this many bytes are written with streaming
/// stores (see the module doc): well past the per-core share of a last-level
/// cache, so nothing is lost by not leaving them in cache.
const STREAM_MIN_BYTES: usize = 16 << 20;
/// Elements computed into the scratch buffer before they are streamed out
/// (4 KiB of float32: stays in L1).
const STREAM_BLOCK: usize = 1024;
/// Largest element count of a result (keeps byte sizes far below isize::MAX).
const MAX_NUMEL: usize = (isize::MAX as usize) / 16;

const ARITH_TYPES: &[DataType] = DataType::ARITH;
const CMP_TYPES: &[DataType] = DataType::ARITH_AND_BOOL;
const BOOL_TYPES: &[DataType] = &[DataType::Bool];
const SUM_TYPES: &[DataType] = DataType::ARITH;
const SCALE_TYPES: &[DataType] = DataType::FLOATS;

const BCAST_ARGS: &[ArgDoc] = &[
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

fn in_place_a(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

fn in_place_a_or_b(i: usize, o: usize) -> bool {
    o == 0 && i <= 1
}

/// A binary op whose output is bool (comparisons and logic).
fn binary_schema(
    name: &'static str,
    build: crate::operator::BuildFn,
    inplace: InPlace,
    doc: &'static str,
) -> OpSchema {
    binary_schema_typed(name, build, inplace, doc, binary_infer::<true>)
}

/// An arithmetic binary op: its output has A's type.
fn arith_schema(name: &'static str, inplace: InPlace, doc: &'static str) -> OpSchema {
    binary_schema_typed(name, build_arith, inplace, doc, binary_infer::<false>)
}

fn binary_schema_typed(
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
fn binary_infer<const BOOL_OUT: bool>(
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

pub fn schemas() -> Vec<OpSchema> {
    let ab = InPlace::Allow(in_place_a_or_b);
    let a = InPlace::Allow(in_place_a);
    let never = InPlace::Never;
    vec![
        arith_schema("Add", ab, "C = A + B elementwise (int32, int64, float32, float64; integers wrap), with broadcasting."),
        arith_schema("Sub", ab, "C = A - B elementwise (int32, int64, float32, float64; integers wrap), with broadcasting."),
        arith_schema("Mul", ab, "C = A * B elementwise (int32, int64, float32, float64; integers wrap), with broadcasting."),
        arith_schema(
            "Div",
            a,
            "C = A / B elementwise (int32, int64, float32, float64); integers truncate toward zero and a zero divisor is an error.",
        ),
        binary_schema("EQ", build_cmp, never, "C = (A == B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("NE", build_cmp, never, "C = (A != B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("LT", build_cmp, never, "C = (A < B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("LE", build_cmp, never, "C = (A <= B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("GT", build_cmp, never, "C = (A > B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("GE", build_cmp, never, "C = (A >= B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("And", build_logic, a, "C = A and B elementwise on bool tensors, with broadcasting."),
        binary_schema("Or", build_logic, a, "C = A or B elementwise on bool tensors, with broadcasting."),
        binary_schema("Xor", build_logic, a, "C = A xor B elementwise on bool tensors, with broadcasting."),
        binary_schema_typed("BitwiseAnd", build_bitwise, a, "C = A & B elementwise (bool, int32 or int64, both one type, which C has), with broadcasting.", binary_infer::<false>),
        binary_schema_typed("BitwiseOr", build_bitwise, a, "C = A | B elementwise (bool, int32 or int64, both one type, which C has), with broadcasting.", binary_infer::<false>),
        binary_schema_typed("BitwiseXor", build_bitwise, a, "C = A ^ B elementwise (bool, int32 or int64, both one type, which C has), with broadcasting.", binary_infer::<false>),
        OpSchema::new("Not", build_not)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = not X elementwise on a bool tensor."),
        OpSchema::new("Sum", build_sum)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(a)
            .doc("Y = X0 + X1 + ... of tensors with one dtype (float32, float64, int32, int64) and identical shapes (no broadcasting); one input is a copy."),
        OpSchema::new("Max", build_min_max::<true>)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(a)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = the elementwise largest of X0, X1, ... (float32, float64, int32, int64; one dtype, identical shapes, no broadcasting). A NaN in X0 stays; a later one does not replace a number."),
        OpSchema::new("Min", build_min_max::<false>)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(a)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = the elementwise smallest of X0, X1, ... (as Max)."),
        OpSchema::new("MaxGradient", build_min_max_grad)
            .inputs(3, MANY)
            .outputs(1, MANY)
            .doc("Inputs (Y, dY, X0, X1, ...) of Max, outputs (dX0, dX1, ...): dXi = dY where Xi equals Y, else 0 (every input equal to the max gets the whole gradient, as Caffe2)."),
        OpSchema::new("MinGradient", build_min_max_grad)
            .inputs(3, MANY)
            .outputs(1, MANY)
            .doc("Inputs (Y, dY, X0, X1, ...) of Min, outputs (dX0, dX1, ...): dXi = dY where Xi equals Y, else 0."),
        OpSchema::new("WeightedSum", build_weighted_sum)
            .inputs(2, MANY)
            .outputs(1, 1)
            .inplace(a)
            .ignores(&[arg!(
                "grad_on_w",
                "bool",
                "false",
                "whether the gradient op computes the weights' gradients; accepted and ignored (no gradients here)"
            )])
            .doc("Y = w0*X0 + w1*X1 + ... for inputs (X0, w0, X1, w1, ...): float32 tensors with X0's element count and 1-element float32 weights; Y has X0's shape."),
        OpSchema::new("Scale", build_scale)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(a)
            .args(&[arg!("scale", "float", "1.0", "the factor to multiply by")])
            .doc("Y = scale * X elementwise for a float32 or float64 tensor."),
        OpSchema::new("Cast", build_cast)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(a)
            .args(&[
                arg!(
                    "to",
                    "int or string",
                    "(required)",
                    "the target dtype: a TensorProto.DataType number or its name, such as \"INT64\""
                ),
                arg!(
                    "from_type",
                    "int or string",
                    "none",
                    "the input's dtype; only the gradient reads it (a Cast back to it)"
                ),
            ])
            .doc(
                "Y = X converted to dtype `to` (numeric dtypes, float16 and bool; float to int truncates toward zero and \
                 saturates). To STRING, each element is written as C++'s std::to_string did (integers and bool in \
                 decimal, floats with six decimals); from STRING is not supported.",
            ),
        OpSchema::new("ScaleBlobs", build_scale_blobs)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Allow(same_position))
            .args(&[arg!("scale", "float", "1.0", "the factor to multiply by")])
            .doc("Y_i = scale * X_i for each of n inputs and n outputs (float32 or float64 tensors); Y_i may be X_i."),
        OpSchema::new("FloatToHalf", build_float_to_half)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!(
                "clip",
                "bool",
                "false",
                "clip to float16's finite range [-65504, 65504] first (else out-of-range values become infinities)"
            )])
            .doc("Y = X (float32) rounded to float16."),
        OpSchema::new("HalfToFloat", build_half_to_float)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Y = X (float16) as float32 (exact)."),
    ]
}

// ------------------------------------------------------------- broadcasting --

/// The broadcasting arguments of a binary op, read once at construction.
#[derive(Clone, Copy, Debug)]
struct Bcast {
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
pub(super) fn legacy_axis(ctx: &OpDefCtx<'_>) -> Result<Option<usize>> {
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
struct Prep {
    dtype: DataType,
    out: Shape,
    /// Legacy mode: B takes part in broadcasting with this shape (A's ndim,
    /// ones outside B's span) instead of its own.
    b_shape: Shape,
    b_reshaped: bool,
    numel: usize,
    /// The input shapes this was worked out for (with `dtype`), when it
    /// succeeded: the next run with the same ones reuses it, since nothing
    /// else it depends on (broadcast arguments, aliasing) changes.
    checked: Option<(Shape, Shape)>,
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

fn unsupported(op: &str, dtype: DataType, allowed: &[DataType]) -> Error {
    let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    Error::type_error(format!(
        "Unsupported type of tensor: {dtype} ({op} supports {})",
        names.join(", ")
    ))
}

fn checked_numel(op: &str, shape: &[usize]) -> Result<usize> {
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
pub(super) fn numpy_shape(
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
pub(super) fn legacy_shapes(
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
fn prepare(l: &Locked<'_>, op: &str, bc: &Bcast, allowed: &[DataType], p: &mut Prep) -> Result<()> {
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
fn same_dims(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

fn prepare_anew(
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
fn dtype_fix(first: (&str, DataType), second: (&str, DataType)) -> String {
    let python_default = |d: DataType| matches!(d, DataType::Double | DataType::Int64);
    let ((name, _), (_, target)) = if python_default(first.1) && !python_default(second.1) {
        (first, second)
    } else {
        (second, first)
    };
    format!("To fix: {}", target.conversion_hint(name))
}

fn bug(what: &str) -> Error {
    Error::internal(format!("elementwise kernel: {what}"))
}

/// Input `i` as an array of `T`; a wrong dtype names the blob.
fn arr<'l, T: Element>(l: &'l Locked<'_>, i: usize) -> Result<&'l ArrayD<T>> {
    l.tensor(i)?
        .array::<T>()
        .map_err(|e| e.with_blob(l.input_name(i)))
}

/// The output value's array of `T`.
fn out_array<T: Element>(o: &mut BlobValue) -> Result<&mut ArrayD<T>> {
    o.tensor_mut()?.array_mut::<T>()
}

/// An input of a broadcasting kernel: its array and the shape it broadcasts
/// with (its own, or B's legacy-broadcasting shape). Both have the same
/// elements in the same row-major order.
struct Operand<'a, T> {
    a: &'a ArrayD<T>,
    shape: &'a [usize],
}

impl<'a, T: Element + Copy> Operand<'a, T> {
    fn own(a: &'a ArrayD<T>) -> Self {
        Operand {
            a,
            shape: a.shape(),
        }
    }
    /// B of a binary op, as `p` says it broadcasts.
    fn b(b: &'a ArrayD<T>, p: &'a Prep) -> Self {
        Operand {
            a: b,
            shape: if p.b_reshaped { &p.b_shape } else { b.shape() },
        }
    }
    /// The single element of a one-element operand.
    fn scalar(&self) -> Option<T> {
        if self.a.len() == 1 {
            self.a.first().copied()
        } else {
            None
        }
    }
    /// The elements as a row-major slice when they repeat along the leading
    /// dims of `target` (equal shapes included).
    fn repeating_slice(&self, target: &[usize]) -> Option<&'a [T]> {
        if is_suffix(self.shape, target) {
            self.a.as_slice()
        } else {
            None
        }
    }
    /// A view with the broadcasting shape (a reshape only for legacy B).
    fn view(&self) -> Result<CowArray<'a, T, IxDyn>> {
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
fn is_suffix(inner: &[usize], outer: &[usize]) -> bool {
    let lead = inner.iter().take_while(|&&d| d == 1).count();
    let s = &inner[lead..];
    s.len() <= outer.len() && outer[outer.len() - s.len()..] == *s
}

/// Runs `f` on the output taken out of its blob (so inputs stay readable),
/// then puts it back whatever happened.
fn with_taken_output<'a, R>(
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
fn out_slice<'o, U: Element + Copy>(o: &'o mut BlobValue, shape: &[usize]) -> Result<&'o mut [U]> {
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
fn std_slice_mut<T: Element>(a: &mut ArrayD<T>) -> Result<&mut [T]> {
    if !a.is_standard_layout() {
        *a = crate::tensor::copy_array(a.view())?;
    }
    a.as_slice_mut()
        .ok_or_else(|| bug("the output buffer is not contiguous"))
}

// ------------------------------------------------------ slice loops (rayon) --

/// Non-temporal stores (x86-64 only; SSE2 is part of its baseline).
#[cfg(target_arch = "x86_64")]
mod nt {
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
fn streams<U>(n: usize) -> bool {
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
fn stream_blocks<U: Copy + Default>(out: &mut [U], mut block: impl FnMut(&mut [U], usize)) {
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

fn map2_seq<T: Copy, U, F: Fn(T, T) -> U>(out: &mut [U], a: &[T], b: &[T], f: &F) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// map2_seq, streamed out when `stream`.
fn map2_task<T: Copy, U: Copy + Default, F: Fn(T, T) -> U>(
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
fn map2<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
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
fn map2_rep_seq<T: Copy, U, F: Fn(T, T) -> U>(
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
fn map2_rep<T: Copy + Sync, U: Copy + Default + Send, F: Fn(T, T) -> U + Sync>(
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

/// out[i] = g(a[i]).
fn map1<T: Copy + Sync, U: Copy + Default + Send, G: Fn(T) -> U + Sync>(
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
fn upd0<T: Copy + Send, G: Fn(T) -> T + Sync>(out: &mut [T], g: G) {
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
fn upd1_rep<T: Copy + Send + Sync, G: Fn(T, T) -> T + Sync>(out: &mut [T], b: &[T], g: G) {
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
fn apply0<T: Element + Copy, G: Fn(T) -> T + Copy + Send + Sync>(out: &mut ArrayD<T>, g: G) {
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
fn fill<T, U, F>(
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
fn write_binary<T, U, F>(
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
fn write_unary<T, U, G>(o: &mut BlobValue, a: ArrayViewD<'_, T>, g: G) -> Result<()>
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
fn update<T, G>(out: &mut ArrayD<T>, other: Operand<'_, T>, g: G) -> Result<()>
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
fn exec_same<T, F>(l: &mut Locked<'_>, p: &Prep, f: F) -> Result<()>
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
fn exec_to<T, U, F>(l: &mut Locked<'_>, p: &Prep, f: F) -> Result<()>
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
fn unary_same<T, G>(l: &mut Locked<'_>, g: G) -> Result<()>
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

fn unary_dtype(l: &Locked<'_>, op: &str, allowed: &[DataType]) -> Result<DataType> {
    let dt = l.tensor(0)?.dtype();
    if allowed.contains(&dt) {
        Ok(dt)
    } else {
        Err(unsupported(op, dt, allowed).with_blob(l.input_name(0)))
    }
}

// ----------------------------------------------------------- arithmetic ops --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// Rejects a zero integer divisor (every element of B is used when the
/// result is not empty).
fn check_divisor<T: Number>(l: &Locked<'_>, p: &Prep) -> Result<()> {
    if !T::INT || p.numel == 0 {
        return Ok(());
    }
    if arr::<T>(l, 1)?.iter().any(|&x| x.is_zero()) {
        return Err(Error::new(
            ErrorKind::DivisionByZero,
            format!(
                "Div: integer division by zero: the divisor B ('{}') contains 0",
                l.input_name(1)
            ),
        )
        .with_blob(l.input_name(1)));
    }
    Ok(())
}

fn arith_t<T: Number>(l: &mut Locked<'_>, p: &Prep, op: Arith) -> Result<()> {
    match op {
        Arith::Add => exec_same::<T, _>(l, p, |a, b| a.wrapping_plus(b)),
        Arith::Sub => exec_same::<T, _>(l, p, |a, b| a.wrapping_minus(b)),
        Arith::Mul => exec_same::<T, _>(l, p, |a, b| a.wrapping_times(b)),
        Arith::Div => {
            check_divisor::<T>(l, p)?;
            exec_same::<T, _>(l, p, |a, b| a.wrapping_over(b))
        }
    }
}

/// A binary op's kernel: lock its blobs, check dtypes and broadcast shapes
/// (`prepare`), then `exec` for the inputs' dtype.
fn binary_kernel(
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

fn build_arith(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "Add" => (Arith::Add, "Add"),
        "Sub" => (Arith::Sub, "Sub"),
        "Mul" => (Arith::Mul, "Mul"),
        "Div" => (Arith::Div, "Div"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not an arithmetic op"))),
    };
    binary_kernel(ctx, name, ARITH_TYPES, move |l, p| {
        crate::with_match_dtype!(arith p.dtype, |T| arith_t::<T>(l, p, op),
            else other => Err(unsupported(name, other, ARITH_TYPES)))
    })
}

// ----------------------------------------------------------- comparison ops --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

fn cmp_t<T: Element + Copy + PartialOrd>(l: &mut Locked<'_>, p: &Prep, op: Cmp) -> Result<()> {
    match op {
        Cmp::Eq => exec_to::<T, bool, _>(l, p, |a, b| a == b),
        Cmp::Ne => exec_to::<T, bool, _>(l, p, |a, b| a != b),
        Cmp::Lt => exec_to::<T, bool, _>(l, p, |a, b| a < b),
        Cmp::Le => exec_to::<T, bool, _>(l, p, |a, b| a <= b),
        Cmp::Gt => exec_to::<T, bool, _>(l, p, |a, b| a > b),
        Cmp::Ge => exec_to::<T, bool, _>(l, p, |a, b| a >= b),
    }
}

fn build_cmp(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "EQ" => (Cmp::Eq, "EQ"),
        "NE" => (Cmp::Ne, "NE"),
        "LT" => (Cmp::Lt, "LT"),
        "LE" => (Cmp::Le, "LE"),
        "GT" => (Cmp::Gt, "GT"),
        "GE" => (Cmp::Ge, "GE"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not a comparison op"))),
    };
    binary_kernel(ctx, name, CMP_TYPES, move |l, p| {
        crate::with_match_dtype!(arith_and_bool p.dtype, |T| cmp_t::<T>(l, p, op),
            else other => Err(unsupported(name, other, CMP_TYPES)))
    })
}

// ---------------------------------------------------------------- logic ops --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logic {
    And,
    Or,
    Xor,
}

fn build_logic(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "And" => (Logic::And, "And"),
        "Or" => (Logic::Or, "Or"),
        "Xor" => (Logic::Xor, "Xor"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not a logical op"))),
    };
    binary_kernel(ctx, name, BOOL_TYPES, move |l, p| match op {
        Logic::And => exec_same::<bool, _>(l, p, |a, b| a & b),
        Logic::Or => exec_same::<bool, _>(l, p, |a, b| a | b),
        Logic::Xor => exec_same::<bool, _>(l, p, |a, b| a ^ b),
    })
}

const BITWISE_TYPES: &[DataType] = DataType::INTS_AND_BOOL;

fn bitwise_t<T>(l: &mut Locked<'_>, p: &Prep, op: Logic) -> Result<()>
where
    T: Element
        + Copy
        + std::ops::BitAnd<Output = T>
        + std::ops::BitOr<Output = T>
        + std::ops::BitXor<Output = T>,
{
    match op {
        Logic::And => exec_same::<T, _>(l, p, |a, b| a & b),
        Logic::Or => exec_same::<T, _>(l, p, |a, b| a | b),
        Logic::Xor => exec_same::<T, _>(l, p, |a, b| a ^ b),
    }
}

fn build_bitwise(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "BitwiseAnd" => (Logic::And, "BitwiseAnd"),
        "BitwiseOr" => (Logic::Or, "BitwiseOr"),
        "BitwiseXor" => (Logic::Xor, "BitwiseXor"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not a bitwise op"))),
    };
    binary_kernel(ctx, name, BITWISE_TYPES, move |l, p| {
        crate::with_match_dtype!(ints_and_bool p.dtype, |T| bitwise_t::<T>(l, p, op),
            else other => Err(unsupported(name, other, BITWISE_TYPES)))
    })
}

fn build_not(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        unary_dtype(&l, "Not", BOOL_TYPES)?;
        unary_same::<bool, _>(&mut l, |x| !x)?;
        Ok(true)
    }))
}

// ---------------------------------------------------------------------- Sum --

fn sum_t<T: Number>(l: &mut Locked<'_>, n: usize) -> Result<()> {
    let add = |a: T, b: T| a.wrapping_plus(b);
    let in_place = l.aliases(0, 0);
    with_taken_output(l, |l, o| {
        let mut next = 1;
        if !in_place {
            let x0 = arr::<T>(l, 0)?;
            if n == 1 {
                return write_unary(o, x0.view(), |x| x);
            }
            let x1 = arr::<T>(l, 1)?;
            write_binary(o, Operand::own(x0), Operand::own(x1), x0.shape(), add)?;
            next = 2;
        }
        let y = out_array::<T>(o).map_err(|e| e.with_blob(l.output_name(0)))?;
        for i in next..n {
            update(y, Operand::own(arr::<T>(l, i)?), add)?;
        }
        Ok(())
    })
}

fn sum(l: &mut Locked<'_>, n: usize) -> Result<()> {
    let x0 = l.tensor(0)?;
    let dtype = x0.dtype();
    let n0 = l.input_name(0);
    if !SUM_TYPES.contains(&dtype) {
        return Err(unsupported("Sum", dtype, SUM_TYPES).with_blob(n0));
    }
    for i in 1..n {
        let xi = l.tensor(i)?;
        let ni = l.input_name(i);
        if xi.dtype() != dtype {
            return Err(Error::type_error(format!(
                "Sum: all inputs must have the same dtype, but input 0 ('{n0}') is {dtype} and input {i} ('{ni}') is {}. {}",
                xi.dtype(),
                dtype_fix((n0, dtype), (ni, xi.dtype()))
            ))
            .with_blob(ni));
        }
        if xi.shape() != x0.shape() {
            return Err(Error::shape(format!(
                "Sum: all inputs must have identical shapes (no broadcasting), but input 0 ('{n0}') has shape {:?} \
                 and input {i} ('{ni}') has shape {:?}",
                x0.shape(),
                xi.shape()
            ))
            .with_blob(ni));
        }
    }
    crate::with_match_dtype!(arith dtype, |T| sum_t::<T>(l, n),
        else other => Err(unsupported("Sum", other, SUM_TYPES)))
}

fn build_sum(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        sum(&mut l, n)?;
        Ok(true)
    }))
}

// ------------------------------------------------------------- Max / Min --

const MIN_MAX_TYPES: &[DataType] = SUM_TYPES;

/// Checks that inputs `from..n` are tensors of input `from`'s dtype (one of
/// `types`) and shape, naming `op`.
fn check_alike(l: &Locked<'_>, op: &str, from: usize, n: usize, types: &[DataType]) -> Result<()> {
    let x0 = l.tensor(from)?;
    let n0 = l.input_name(from);
    if !types.contains(&x0.dtype()) {
        return Err(unsupported(op, x0.dtype(), types).with_blob(n0));
    }
    for i in from + 1..n {
        let xi = l.tensor(i)?;
        let ni = l.input_name(i);
        if xi.dtype() != x0.dtype() {
            return Err(Error::type_error(format!(
                "{op}: all inputs must have the same dtype, but input {from} ('{n0}') is {} and input {i} ('{ni}') is {}. {}",
                x0.dtype(),
                xi.dtype(),
                dtype_fix((n0, x0.dtype()), (ni, xi.dtype()))
            ))
            .with_blob(ni));
        }
        if xi.shape() != x0.shape() {
            return Err(Error::shape(format!(
                "{op}: all inputs must have identical shapes (no broadcasting), but input {from} ('{n0}') has shape {:?} \
                 and input {i} ('{ni}') has shape {:?}",
                x0.shape(),
                xi.shape()
            ))
            .with_blob(ni));
        }
    }
    Ok(())
}

fn min_max_t<T: Element + PartialOrd + Copy, const MAX: bool>(
    l: &Locked<'_>,
    n: usize,
) -> Result<Tensor> {
    let mut y = copy_array(l.tensor(0)?.array::<T>()?.view())?;
    for i in 1..n {
        let x = l.tensor(i)?.array::<T>()?;
        y.zip_mut_with(x, |a, &b| {
            if (MAX && b > *a) || (!MAX && b < *a) {
                *a = b;
            }
        });
    }
    Ok(T::wrap(y))
}

fn build_min_max<const MAX: bool>(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = if MAX { "Max" } else { "Min" };
    Ok(kernel(move |cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        check_alike(&l, op, 0, n, MIN_MAX_TYPES)?;
        let y = crate::with_match_dtype!(arith l.tensor(0)?.dtype(), |T| min_max_t::<T, MAX>(&l, n),
            else other => Err(unsupported(op, other, MIN_MAX_TYPES)))?;
        l.set_output(0, y);
        Ok(true)
    }))
}

fn min_max_grad_t<T: Element + PartialEq + Copy + Default>(
    l: &Locked<'_>,
    n: usize,
) -> Result<Vec<Tensor>> {
    let y = l.tensor(0)?.array::<T>()?;
    let dy = l.tensor(1)?.array::<T>()?;
    (2..n)
        .map(|i| {
            let x = l.tensor(i)?.array::<T>()?;
            let mut g = copy_array(dy.view())?;
            ndarray::Zip::from(&mut g)
                .and(x)
                .and(y)
                .for_each(|g, &x, &y| {
                    if x != y {
                        *g = T::default();
                    }
                });
            Ok(T::wrap(g))
        })
        .collect()
}

fn build_min_max_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    if ctx.num_outputs() + 2 != ctx.num_inputs() {
        return Err(ctx.bad_arg(format!(
            "{op} takes (Y, dY, X0, ..., Xn-1) and gives one gradient per X: {} inputs need {} outputs, got {}",
            ctx.num_inputs(),
            ctx.num_inputs().saturating_sub(2),
            ctx.num_outputs()
        )));
    }
    Ok(kernel(move |cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        check_alike(&l, &op, 0, n, MIN_MAX_TYPES)?;
        let grads = crate::with_match_dtype!(arith l.tensor(0)?.dtype(), |T| min_max_grad_t::<T>(&l, n),
            else other => Err(unsupported(&op, other, MIN_MAX_TYPES)))?;
        for (o, g) in grads.into_iter().enumerate() {
            l.set_output(o, g);
        }
        Ok(true)
    }))
}

// -------------------------------------------------------------- WeightedSum --

/// Checks every input and returns the weights, before anything is written.
fn weighted_sum_weights(l: &Locked<'_>, n: usize) -> Result<SmallVec<[f32; 8]>> {
    let x0 = l.tensor(0)?;
    let n0 = l.input_name(0);
    if x0.dtype() != DataType::Float {
        return Err(unsupported("WeightedSum", x0.dtype(), &[DataType::Float]).with_blob(n0));
    }
    let mut w = SmallVec::new();
    for k in 0..n / 2 {
        let (xi, wi) = (2 * k, 2 * k + 1);
        if k > 0 {
            let x = l.tensor(xi)?;
            let name = l.input_name(xi);
            if x.dtype() != DataType::Float {
                return Err(Error::type_error(format!(
                    "WeightedSum: X{k} ('{name}') must be a float32 tensor like X0, got {}. To fix: {}",
                    x.dtype(),
                    DataType::Float.conversion_hint(name)
                ))
                .with_blob(name));
            }
            if x.numel() != x0.numel() {
                return Err(Error::shape(format!(
                    "WeightedSum: X{k} ('{name}', shape {:?}) must have as many elements as X0 ('{n0}', shape {:?})",
                    x.shape(),
                    x0.shape()
                ))
                .with_blob(name));
            }
        }
        let wt = l.tensor(wi)?;
        let name = l.input_name(wi);
        if wt.dtype() != DataType::Float {
            return Err(Error::type_error(format!(
                "WeightedSum: weight w{k} ('{name}') must be a float32 tensor, got {}. To fix: {}",
                wt.dtype(),
                DataType::Float.conversion_hint(name)
            ))
            .with_blob(name));
        }
        if wt.numel() != 1 {
            return Err(Error::shape(format!(
                "WeightedSum: weight w{k} ('{name}') must have exactly one element, got shape {:?}",
                wt.shape()
            ))
            .with_blob(name));
        }
        w.push(wt.scalar_value::<f32>().map_err(|e| e.with_blob(name))?);
    }
    Ok(w)
}

fn flat(a: &ArrayD<f32>) -> CowArray<'_, f32, IxDyn> {
    a.as_standard_layout()
}

fn slice_of<'a>(c: &'a CowArray<'_, f32, IxDyn>) -> Result<&'a [f32]> {
    c.as_slice()
        .ok_or_else(|| bug("a standard-layout copy is not contiguous"))
}

/// Y = w0*X0 + w1*X1 + ..., computed as Caffe2 did: Y = w1*X1 + w0*X0, then
/// Y += wi*Xi for i >= 2 (with 2 inputs, Y = w0*X0).
fn weighted_sum(l: &mut Locked<'_>, n: usize) -> Result<()> {
    let w = weighted_sum_weights(l, n)?;
    let in_place = l.aliases(0, 0);
    with_taken_output(l, |l, o| {
        let w0 = w[0];
        let ys: &mut [f32] = if in_place {
            let y = out_array::<f32>(o).map_err(|e| e.with_blob(l.output_name(0)))?;
            let ys = std_slice_mut(y)?;
            if n == 2 {
                upd0(ys, move |v| w0 * v);
                return Ok(());
            }
            let x1 = flat(arr::<f32>(l, 2)?);
            let w1 = w[1];
            upd1_rep(ys, slice_of(&x1)?, move |y, x| w1 * x + w0 * y);
            ys
        } else {
            let x0 = arr::<f32>(l, 0)?;
            if n == 2 {
                return write_unary(o, x0.view(), move |x| w0 * x);
            }
            let (x0f, x1f) = (flat(x0), flat(arr::<f32>(l, 2)?));
            let ys = out_slice::<f32>(o, x0.shape())?;
            let w1 = w[1];
            map2(ys, slice_of(&x1f)?, slice_of(&x0f)?, move |x, y| {
                w1 * x + w0 * y
            });
            ys
        };
        for k in 2..n / 2 {
            let xk = flat(arr::<f32>(l, 2 * k)?);
            let wk = w[k];
            upd1_rep(ys, slice_of(&xk)?, move |y, x| wk * x + y);
        }
        Ok(())
    })
}

fn build_weighted_sum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_inputs();
    if n == 0 || n % 2 != 0 {
        return Err(ctx.bad_arg(format!(
            "operator def did not pass schema checking: WeightedSum takes an even number of inputs \
             (X0, w0, X1, w1, ...), got {n}"
        )));
    }
    Ok(kernel(|cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        weighted_sum(&mut l, n)?;
        Ok(true)
    }))
}

// -------------------------------------------------------------------- Scale --

fn build_scale(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let s = ctx.args.f32("scale", 1.0)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        crate::with_match_dtype!(floats unary_dtype(&l, "Scale", SCALE_TYPES)?, |T| {
            let s = T::from(s);
            unary_same::<T, _>(&mut l, move |x| x * s)
        }, else other => Err(unsupported("Scale", other, SCALE_TYPES)))?;
        Ok(true)
    }))
}

fn same_position(i: usize, o: usize) -> bool {
    i == o
}

fn build_scale_blobs(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (ni, no) = (ctx.num_inputs(), ctx.num_outputs());
    if ni != no {
        return Err(ctx.bad_arg(format!(
            "operator def did not pass schema checking: ScaleBlobs takes as many outputs as inputs, got {ni} inputs and {no} outputs"
        )));
    }
    let s = ctx.args.f32("scale", 1.0)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        // Every input is read before any output is written, so outputs
        // that name other inputs see the old values.
        let mut outs = Vec::with_capacity(ni);
        for i in 0..ni {
            let t = l.tensor(i)?;
            let name = l.input_name(i);
            // Copies allocated fallibly, then scaled in place.
            let y = crate::with_match_dtype!(tensor floats t, |a: T| {
                let s = T::from(s);
                let mut y = copy_array(a.view()).map_err(|e| e.with_blob(name))?;
                y.mapv_inplace(|x| x * s);
                Tensor::from(y)
            }, else other => {
                return Err(unsupported("ScaleBlobs", other.dtype(), SCALE_TYPES).with_blob(name))
            });
            outs.push(y);
        }
        for (j, y) in outs.into_iter().enumerate() {
            l.set_output(j, y);
        }
        Ok(true)
    }))
}

// --------------------------------------------------------------------- Cast --

fn parse_to(ctx: &OpDefCtx<'_>) -> Result<DataType> {
    let to = if ctx.args.field_of("to") == Some("s") {
        let s = ctx.args.string("to", "")?;
        DataType::from_name(&s)
            .ok_or_else(|| ctx.bad_arg(format!("Cast: unknown 'to' argument: '{s}'")))?
    } else {
        match ctx.args.i64_opt("to")? {
            None => {
                return Err(ctx.bad_arg("Cast requires the argument 'to' (the target DataType)"))
            }
            Some(v) => i32::try_from(v)
                .ok()
                .and_then(DataType::from_i32)
                .ok_or_else(|| ctx.bad_arg(format!("Cast: unexpected 'to' argument value: {v}")))?,
        }
    };
    match to {
        DataType::Undefined => {
            Err(ctx.bad_arg("Cast: 'to' must be a DataType other than UNDEFINED"))
        }
        DataType::Byte => Err(Error::type_error(
            "Cast: casting to BYTE is not supported (it is deprecated; use UINT8)",
        )),
        other => Ok(other),
    }
}

fn cast_from<S: Number>(o: &mut BlobValue, a: ArrayViewD<'_, S>, to: DataType) -> Result<()> {
    match to {
        DataType::Float => write_unary(o, a, S::to_f32),
        DataType::Double => write_unary(o, a, S::to_f64),
        DataType::Int32 => write_unary(o, a, S::to_i32),
        DataType::Int64 => write_unary(o, a, S::to_i64),
        DataType::Bool => write_unary(o, a, S::to_bool),
        DataType::Uint8 => write_unary(o, a, S::to_u8),
        DataType::Int8 => write_unary(o, a, S::to_i8),
        DataType::Int16 => write_unary(o, a, S::to_i16),
        DataType::Uint16 => write_unary(o, a, S::to_u16),
        DataType::Float16 => write_unary(o, a, S::to_f16),
        other => Err(Error::type_error(format!(
            "Cast: casting to {other} is not supported"
        ))),
    }
}

/// A float as C++'s `std::to_string` wrote it (printf's `%f`: six decimals,
/// `inf`, `nan`).
fn float_text(x: f64) -> Vec<u8> {
    if x.is_nan() {
        return if x.is_sign_negative() {
            b"-nan".to_vec()
        } else {
            b"nan".to_vec()
        };
    }
    format!("{x:.6}").into_bytes()
}

/// Cast to STRING: each element's text, as Caffe2's `caffe2::to_string`.
fn cast_to_strings(o: &mut BlobValue, src: &Tensor) -> Result<()> {
    fn texts<T: Copy>(a: ArrayViewD<'_, T>, f: impl Fn(T) -> Vec<u8>) -> Result<Tensor> {
        let mut v = crate::tensor::try_vec(a.len(), "the strings of a Cast")?;
        v.extend(a.iter().map(|&x| f(x)));
        Tensor::from_vec(a.shape(), v)
    }
    let t = crate::with_match_dtype!(tensor pod src, |a: T| {
        if T::INT {
            texts(a.view(), |x: T| x.to_i64().to_string().into_bytes())?
        } else {
            texts(a.view(), |x: T| float_text(x.to_f64()))?
        }
    }, else Tensor::Bool(a) => texts(a.view(), |x| u8::from(x).to_string().into_bytes())?,
        _strings => return Err(Error::type_error(
            "Cast: casting from strings is not supported",
        )));
    *o = BlobValue::Tensor(t);
    Ok(())
}

fn cast_into(o: &mut BlobValue, src: &Tensor, to: DataType) -> Result<()> {
    if to == DataType::String {
        return cast_to_strings(o, src);
    }
    crate::with_match_dtype!(tensor pod src, |a: T| cast_from(o, a.view(), to),
    // A bool converts as its 0 or 1.
    else Tensor::Bool(a) => cast_from(o, crate::tensor::map_array(a.view(), |&x| u8::from(x))?.view(), to),
    _strings => Err(Error::type_error(
        "Cast: casting from strings is not supported",
    )))
}

fn cast(l: &mut Locked<'_>, to: DataType) -> Result<()> {
    let src = l.tensor(0)?;
    if src.dtype() == DataType::String {
        return Err(
            Error::type_error("Cast: casting from strings is not supported")
                .with_blob(l.input_name(0)),
        );
    }
    if l.aliases(0, 0) {
        if src.dtype() == to {
            return Ok(());
        }
        let mut fresh = BlobValue::Empty;
        cast_into(&mut fresh, src, to).map_err(|e| e.with_blob(l.input_name(0)))?;
        *l.output(0) = fresh;
        return Ok(());
    }
    let (o, i) = l
        .output_and_input(0, 0)
        .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
    cast_into(o, i.tensor()?, to)
}

/// Input 0 of a conversion op, if it holds `want`; else a typed error
/// naming the op, the dtype and the blob.
fn conversion_input<'a>(l: &'a Locked<'_>, op: &str, want: DataType) -> Result<&'a Tensor> {
    let t = l.tensor(0)?;
    if t.dtype() != want {
        return Err(unsupported(op, t.dtype(), &[want]).with_blob(l.input_name(0)));
    }
    Ok(t)
}

fn build_float_to_half(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let clip = ctx.args.bool("clip", false)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        conversion_input(&l, "FloatToHalf", DataType::Float)?;
        let (o, i) = l
            .output_and_input(0, 0)
            .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
        let a = i.tensor()?.array::<f32>()?.view();
        const MAX: f32 = 65504.0;
        if clip {
            write_unary(o, a, |x: f32| f16::from_f32(x.clamp(-MAX, MAX)))
        } else {
            write_unary(o, a, f16::from_f32)
        }?;
        Ok(true)
    }))
}

fn build_half_to_float(_ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        conversion_input(&l, "HalfToFloat", DataType::Float16)?;
        let (o, i) = l
            .output_and_input(0, 0)
            .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
        write_unary(o, i.tensor()?.array::<f16>()?.view(), f16::to_f32)?;
        Ok(true)
    }))
}

fn build_cast(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let to = parse_to(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        cast(&mut l, to)?;
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::ir::{Argument, OperatorDef};
    use crate::operator::{create_operator, OpCx};
    use crate::test_util::{get, run};
    use crate::workspace::Workspace;
    use std::sync::Arc;

    fn def(ty: &str, ins: &[&str], outs: &[&str], args: Vec<Argument>) -> OperatorDef {
        OperatorDef {
            r#type: Some(ty.into()),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            arg: args,
            ..Default::default()
        }
    }

    fn ai(name: &str, v: i64) -> Argument {
        Argument {
            name: Some(name.into()),
            i: Some(v),
            ..Default::default()
        }
    }

    fn af(name: &str, v: f32) -> Argument {
        Argument {
            name: Some(name.into()),
            f: Some(v),
            ..Default::default()
        }
    }

    fn as_(name: &str, v: &str) -> Argument {
        Argument {
            name: Some(name.into()),
            s: Some(v.as_bytes().to_vec()),
            ..Default::default()
        }
    }

    fn t<T: Element>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    fn ws(blobs: Vec<(&str, Tensor)>) -> Arc<Workspace> {
        let ws = Workspace::new();
        for (n, v) in blobs {
            ws.feed(n, BlobValue::Tensor(v));
        }
        ws
    }

    fn data_ptr(ws: &Arc<Workspace>, name: &str) -> usize {
        let b = ws.blob(name).unwrap();
        let g = b.read();
        crate::with_array!(g.tensor().unwrap(), a => a.as_ptr() as usize)
    }

    /// Builds the op once and runs it `times` times (kernel state kept).
    fn run_kernel(ws: &Arc<Workspace>, d: &OperatorDef, times: usize) {
        let (mut k, io) = create_operator(d, ws).unwrap();
        let tok = CancelToken::new();
        for _ in 0..times {
            let mut cx = OpCx {
                io: &io,
                ws,
                cancel: &tok,
            };
            assert!(k.run(&mut cx).unwrap());
        }
    }

    // ---------------------------------------------------------- arithmetic --

    #[test]
    fn same_shape_arithmetic_all_dtypes() {
        let w = ws(vec![
            ("a", t(&[2, 2], vec![1.5f32, 2.0, -3.0, 4.0])),
            ("b", t(&[2, 2], vec![0.5f32, 4.0, 2.0, -8.0])),
            ("ad", t(&[3], vec![1.0f64, 2.0, 3.0])),
            ("bd", t(&[3], vec![0.25f64, 0.5, 4.0])),
            ("ai", t(&[3], vec![7i32, -7, 9])),
            ("bi", t(&[3], vec![2i32, 2, -4])),
            ("al", t(&[2], vec![10i64, -10])),
            ("bl", t(&[2], vec![3i64, 3])),
        ]);
        run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![2.0f32, 6.0, -1.0, -4.0]));
        run(&w, def("Sub", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![1.0f32, -2.0, -5.0, 12.0]));
        run(&w, def("Mul", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![0.75f32, 8.0, -6.0, -32.0]));
        run(&w, def("Div", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![3.0f32, 0.5, -1.5, -0.5]));
        run(&w, def("Div", &["ad", "bd"], &["cd"], vec![])).unwrap();
        assert_eq!(get(&w, "cd"), t(&[3], vec![4.0f64, 4.0, 0.75]));
        run(&w, def("Mul", &["ai", "bi"], &["ci"], vec![])).unwrap();
        assert_eq!(get(&w, "ci"), t(&[3], vec![14i32, -14, -36]));
        run(&w, def("Sub", &["al", "bl"], &["cl"], vec![])).unwrap();
        assert_eq!(get(&w, "cl"), t(&[2], vec![7i64, -13]));
    }

    #[test]
    fn integer_division_truncates_toward_zero() {
        let w = ws(vec![
            ("a", t(&[4], vec![7i32, -7, 7, -7])),
            ("b", t(&[4], vec![2i32, 2, -2, -2])),
            ("a64", t(&[3], vec![i64::MIN, 5, -1])),
            ("b64", t(&[3], vec![-1i64, 7, 3])),
        ]);
        run(&w, def("Div", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[4], vec![3i32, -3, -3, 3]));
        // i64::MIN / -1 wraps to i64::MIN instead of trapping.
        run(&w, def("Div", &["a64", "b64"], &["c64"], vec![])).unwrap();
        assert_eq!(get(&w, "c64"), t(&[3], vec![i64::MIN, 0, 0]));
    }

    #[test]
    fn integer_division_by_zero_is_an_error_and_writes_nothing() {
        let w = ws(vec![
            ("a", t(&[3], vec![1i32, 2, 3])),
            ("b", t(&[3], vec![1i32, 0, 1])),
        ]);
        let e = run(&w, def("Div", &["a", "b"], &["a"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::DivisionByZero);
        assert_eq!(e.context.blob.as_deref(), Some("b"));
        assert_eq!(e.context.op_type.as_deref(), Some("Div"));
        assert_eq!(get(&w, "a"), t(&[3], vec![1i32, 2, 3]));
        // A scalar zero divisor, int64.
        let w = ws(vec![
            ("a", t(&[2], vec![1i64, 2])),
            ("z", Tensor::scalar(0i64)),
        ]);
        let e = run(&w, def("Div", &["a", "z"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::DivisionByZero);
        // An empty result divides nothing, so a zero divisor is fine.
        let w = ws(vec![
            ("a", t(&[0, 2], Vec::<i32>::new())),
            ("z", t(&[2], vec![0i32, 0])),
        ]);
        run(&w, def("Div", &["a", "z"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c").shape(), &[0, 2]);
    }

    #[test]
    fn float_division_by_zero_is_ieee() {
        let w = ws(vec![
            ("a", t(&[3], vec![1.0f32, -1.0, 0.0])),
            ("z", Tensor::scalar(0.0f32)),
        ]);
        run(&w, def("Div", &["a", "z"], &["c"], vec![])).unwrap();
        let c = get(&w, "c");
        let c = c.array::<f32>().unwrap();
        assert_eq!(c[[0]], f32::INFINITY);
        assert_eq!(c[[1]], f32::NEG_INFINITY);
        assert!(c[[2]].is_nan());
    }

    #[test]
    fn integer_overflow_wraps() {
        let w = ws(vec![
            ("a", t(&[3], vec![i32::MAX, i32::MIN, i32::MAX])),
            ("b", t(&[3], vec![1i32, 1, 2])),
        ]);
        run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[3], vec![i32::MIN, i32::MIN + 1, i32::MIN + 1])
        );
        run(&w, def("Sub", &["b", "a"], &["c"], vec![])).unwrap();
        // 1 - MAX = MIN + 2; 1 - MIN wraps to MIN + 1; 2 - MAX = MIN + 3.
        assert_eq!(
            get(&w, "c"),
            t(&[3], vec![i32::MIN + 2, i32::MIN + 1, i32::MIN + 3])
        );
        run(&w, def("Mul", &["a", "b"], &["c"], vec![])).unwrap();
        // MAX * 2 = 2^32 - 2 wraps to -2.
        assert_eq!(get(&w, "c"), t(&[3], vec![i32::MAX, i32::MIN, -2]));
    }

    // ------------------------------------------------------- broadcasting --

    #[test]
    fn numpy_broadcasting() {
        let w = ws(vec![
            ("m", t(&[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])),
            ("row", t(&[3], vec![10.0f32, 20.0, 30.0])),
            ("col", t(&[2, 1], vec![100.0f32, 200.0])),
            ("s", Tensor::scalar(0.5f32)),
            ("e", t(&[0, 3], Vec::<f32>::new())),
            ("one", t(&[1, 3], vec![1.0f32, 1.0, 1.0])),
        ]);
        run(&w, def("Add", &["m", "row"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![11.0f32, 22.0, 33.0, 14.0, 25.0, 36.0])
        );
        // B on the left: [3] - [2,3].
        run(&w, def("Sub", &["row", "m"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![9.0f32, 18.0, 27.0, 6.0, 15.0, 24.0])
        );
        // Both sides stretch: [2,1] + [3] -> [2,3].
        run(&w, def("Add", &["col", "row"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![110.0f32, 120.0, 130.0, 210.0, 220.0, 230.0])
        );
        run(&w, def("Mul", &["m", "col"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![100.0f32, 200.0, 300.0, 800.0, 1000.0, 1200.0])
        );
        // 0-dim scalar on either side.
        run(&w, def("Mul", &["s", "m"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![0.5f32, 1.0, 1.5, 2.0, 2.5, 3.0])
        );
        run(&w, def("Div", &["m", "s"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![2.0f32, 4.0, 6.0, 8.0, 10.0, 12.0])
        );
        run(&w, def("Add", &["s", "s"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), Tensor::scalar(1.0f32));
        // A 0 dim against a 1 gives 0: [0,3] + [1,3] -> [0,3].
        run(&w, def("Add", &["e", "one"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c").shape(), &[0, 3]);
        // [2,1] + [0] -> [2,0].
        let w2 = ws(vec![
            ("col", t(&[2, 1], vec![1i64, 2])),
            ("z", t(&[0], Vec::<i64>::new())),
        ]);
        run(&w2, def("Add", &["col", "z"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w2, "c").shape(), &[2, 0]);
    }

    #[test]
    fn a_kernel_rechecks_inputs_whose_shape_or_dtype_changed() {
        // One kernel, run again after its inputs change: the checks of the
        // first run are reused only for the same dtypes and shapes.
        let w = ws(vec![
            ("a", t(&[2], vec![1i32, 2])),
            ("b", t(&[2], vec![10i32, 20])),
        ]);
        let d = def("Add", &["a", "b"], &["a"], vec![]);
        let (mut k, io) = create_operator(&d, &w).unwrap();
        let tok = CancelToken::new();
        let mut again = || {
            k.run(&mut OpCx {
                io: &io,
                ws: &w,
                cancel: &tok,
            })
        };
        assert!(again().unwrap());
        assert_eq!(get(&w, "a"), t(&[2], vec![11i32, 22]));
        w.feed("b", BlobValue::Tensor(t(&[3], vec![1i32, 2, 3])));
        assert_eq!(again().unwrap_err().kind, ErrorKind::Shape);
        w.feed("b", BlobValue::Tensor(t(&[2], vec![1.0f32, 2.0])));
        assert_eq!(again().unwrap_err().kind, ErrorKind::Type);
        // In place, the result must keep A's shape: B [2, 2] would grow it.
        w.feed("b", BlobValue::Tensor(t(&[2, 2], vec![1i32; 4])));
        assert_eq!(again().unwrap_err().kind, ErrorKind::Shape);
        w.feed("b", BlobValue::Tensor(t(&[1], vec![5i32])));
        assert!(again().unwrap());
        assert_eq!(get(&w, "a"), t(&[2], vec![16i32, 27]));
        w.feed("a", BlobValue::Tensor(t(&[3], vec![0i32, 1, 2])));
        assert!(again().unwrap());
        assert_eq!(get(&w, "a"), t(&[3], vec![5i32, 6, 7]));
    }

    #[test]
    fn numpy_broadcasting_mismatch_names_b() {
        let w = ws(vec![
            ("a", t(&[2, 3], vec![0i32; 6])),
            ("b", t(&[2], vec![1i32, 2])),
        ]);
        let e = run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert_eq!(e.context.blob.as_deref(), Some("b"));
        assert!(
            e.message.contains("[2, 3]") && e.message.contains("[2]"),
            "{}",
            e.message
        );
        assert!(!w.has_blob("c") || w.fetch("c").unwrap().is_empty());
    }

    #[test]
    fn legacy_broadcasting() {
        // A [2,3,2], B [3] at axis 1: B[j] is added along dim 1.
        let a: Vec<i32> = (0..12).collect();
        let w = ws(vec![
            ("a", t(&[2, 3, 2], a)),
            ("b", t(&[3], vec![100i32, 200, 300])),
            ("b31", t(&[3, 1], vec![100i32, 200, 300])),
            ("b12", t(&[1, 2], vec![1000i32, 2000])),
            ("s", t(&[1, 1], vec![5i32])),
        ]);
        let want = t(
            &[2, 3, 2],
            vec![
                100i32, 101, 202, 203, 304, 305, 106, 107, 208, 209, 310, 311,
            ],
        );
        run(
            &w,
            def(
                "Add",
                &["a", "b"],
                &["c"],
                vec![ai("broadcast", 1), ai("axis", 1)],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "c"), want);
        // Trailing size-1 dims of B are ignored: [3,1] at axis 1 is the same.
        run(
            &w,
            def(
                "Add",
                &["a", "b31"],
                &["c"],
                vec![ai("broadcast", 1), ai("axis", 1)],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "c"), want);
        // axis_str "C" in "NCHW" is axis 1.
        run(
            &w,
            def(
                "Add",
                &["a", "b"],
                &["c"],
                vec![ai("broadcast", 1), as_("axis_str", "C")],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "c"), want);
        // ...and in "NHWC" it is axis 3, out of range for a 3-dim A with 1-dim B.
        let e = run(
            &w,
            def(
                "Add",
                &["a", "b"],
                &["c"],
                vec![
                    ai("broadcast", 1),
                    as_("axis_str", "C"),
                    as_("order", "NHWC"),
                ],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        // Leading size-1 dims are skipped: [1,2] with the default axis (1) matches A's last dim.
        run(
            &w,
            def("Sub", &["a", "b12"], &["c"], vec![ai("broadcast", 1)]),
        )
        .unwrap();
        assert_eq!(
            get(&w, "c"),
            t(
                &[2, 3, 2],
                vec![
                    -1000i32, -1999, -998, -1997, -996, -1995, -994, -1993, -992, -1991, -990,
                    -1989
                ]
            )
        );
        // A one-element B is a scalar whatever its shape.
        run(
            &w,
            def("Mul", &["a", "s"], &["c"], vec![ai("broadcast", 1)]),
        )
        .unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3, 2], (0..12).map(|x| x * 5).collect())
        );
        // In place on A is fine.
        run(
            &w,
            def(
                "Add",
                &["a", "b"],
                &["a"],
                vec![ai("broadcast", 1), ai("axis", 1)],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "a"), want);
    }

    #[test]
    fn legacy_broadcasting_errors() {
        let w = ws(vec![
            ("a", t(&[2, 3], vec![0.0f32; 6])),
            ("b", t(&[2], vec![1.0f32, 2.0])),
            ("big", t(&[1, 2, 3], vec![0.0f32; 6])),
        ]);
        let bc = || ai("broadcast", 1);
        // Suffix match by default: B [2] against A's last dim 3.
        let e = run(&w, def("Add", &["a", "b"], &["c"], vec![bc()])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert!(
            e.message.contains("Broadcast dimension mismatch"),
            "{}",
            e.message
        );
        assert_eq!(e.context.blob.as_deref(), Some("b"));
        // axis 0 makes it fit.
        run(
            &w,
            def("Add", &["a", "b"], &["c"], vec![bc(), ai("axis", 0)]),
        )
        .unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[2, 3], vec![1.0f32, 1.0, 1.0, 2.0, 2.0, 2.0])
        );
        // Axis out of [0, A.ndim - B.ndim].
        let e = run(
            &w,
            def("Add", &["a", "b"], &["c"], vec![bc(), ai("axis", 2)]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        // B with more dims than A.
        let e = run(&w, def("Add", &["a", "big"], &["c"], vec![bc()])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        // axis and axis_str together, a long axis_str, an unknown letter, a negative axis: construction errors.
        for args in [
            vec![bc(), ai("axis", 0), as_("axis_str", "N")],
            vec![bc(), as_("axis_str", "NC")],
            vec![bc(), as_("axis_str", "X")],
            vec![bc(), ai("axis", -2)],
        ] {
            let e = run(&w, def("Add", &["a", "b"], &["c"], args)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{}", e.message);
        }
        // With broadcast 0 the legacy args are ignored (but still read with the field rules).
        let w2 = ws(vec![
            ("a", t(&[2], vec![1i32, 2])),
            ("b", t(&[2], vec![3i32, 4])),
        ]);
        run(
            &w2,
            def(
                "Add",
                &["a", "b"],
                &["c"],
                vec![ai("axis", 7), as_("axis_str", "NC")],
            ),
        )
        .unwrap();
        let e = run(&w2, def("Add", &["a", "b"], &["c"], vec![af("axis", 1.0)])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        // In place on B is forbidden with broadcast=1 (at run time, as in Caffe2).
        let e = run(&w2, def("Add", &["a", "b"], &["b"], vec![bc()])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert_eq!(e.context.blob.as_deref(), Some("b"));
        assert_eq!(get(&w2, "b"), t(&[2], vec![3i32, 4]));
    }

    // ------------------------------------------------------------- dtypes --

    #[test]
    fn dtype_mismatch_and_unsupported_dtypes() {
        let w = ws(vec![
            ("f", t(&[2], vec![1.0f32, 2.0])),
            ("l", t(&[2], vec![1i64, 2])),
            ("p", t(&[2], vec![true, false])),
            ("u", t(&[2], vec![1u8, 2])),
        ]);
        let e = run(&w, def("Add", &["f", "l"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(e.context.blob.as_deref(), Some("l"));
        assert!(
            e.message.contains("float32") && e.message.contains("int64"),
            "{}",
            e.message
        );
        let e = run(&w, def("Add", &["p", "p"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.message.starts_with("Unsupported type of tensor: bool"),
            "{}",
            e.message
        );
        assert_eq!(e.context.blob.as_deref(), Some("p"));
        let e = run(&w, def("LT", &["u", "u"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        let e = run(&w, def("EQ", &["l", "f"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(e.context.blob.as_deref(), Some("f"));
        // A blob that is not a tensor.
        w.feed("empty", BlobValue::Empty);
        let e = run(&w, def("Mul", &["f", "empty"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(e.context.blob.as_deref(), Some("empty"));
    }

    // ------------------------------------------------------------ in place --

    #[test]
    fn in_place_on_a_and_b() {
        let w = ws(vec![
            ("x", t(&[3], vec![1.0f32, 2.0, 3.0])),
            ("y", t(&[3], vec![10.0f32, 20.0, 30.0])),
            ("s", Tensor::scalar(2.0f32)),
        ]);
        run(&w, def("Sub", &["x", "y"], &["x"], vec![])).unwrap();
        assert_eq!(get(&w, "x"), t(&[3], vec![-9.0f32, -18.0, -27.0]));
        // Output = B keeps the operand order: y = x - y.
        run(&w, def("Sub", &["x", "y"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), t(&[3], vec![-19.0f32, -38.0, -57.0]));
        // Output = A = B.
        run(&w, def("Add", &["x", "x"], &["x"], vec![])).unwrap();
        assert_eq!(get(&w, "x"), t(&[3], vec![-18.0f32, -36.0, -54.0]));
        // A scalar B broadcast into an in-place A.
        run(&w, def("Div", &["x", "s"], &["x"], vec![])).unwrap();
        assert_eq!(get(&w, "x"), t(&[3], vec![-9.0f32, -18.0, -27.0]));
        // A scalar A broadcast into an in-place B: y = s * y.
        run(&w, def("Mul", &["s", "y"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), t(&[3], vec![-38.0f32, -76.0, -114.0]));
    }

    #[test]
    fn in_place_requires_the_result_shape() {
        let w = ws(vec![
            ("s", Tensor::scalar(1i32)),
            ("v", t(&[2], vec![1i32, 2])),
        ]);
        let e = run(&w, def("Add", &["s", "v"], &["s"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert_eq!(e.context.blob.as_deref(), Some("s"));
        assert_eq!(get(&w, "s"), Tensor::scalar(1i32));
        let e = run(&w, def("Add", &["v", "s"], &["s"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert_eq!(get(&w, "s"), Tensor::scalar(1i32));
    }

    #[test]
    fn in_place_rules_in_schemas() {
        let w = ws(vec![
            ("a", t(&[2], vec![1i32, 2])),
            ("b", t(&[2], vec![3i32, 4])),
        ]);
        // Div, comparisons and logic ops may not write over B; comparisons not over A either.
        for (ty, out) in [("Div", "b"), ("EQ", "a"), ("GE", "b"), ("Not", "a")] {
            let ins: &[&str] = if ty == "Not" { &["a"] } else { &["a", "b"] };
            let e = run(&w, def(ty, ins, &[out], vec![])).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{ty}");
        }
        let w = ws(vec![
            ("p", t(&[2], vec![true, false])),
            ("q", t(&[2], vec![true, true])),
        ]);
        let e = run(&w, def("Or", &["p", "q"], &["q"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        run(&w, def("Xor", &["p", "q"], &["p"], vec![])).unwrap();
        assert_eq!(get(&w, "p"), t(&[2], vec![false, true]));
    }

    #[test]
    fn scalar_in_place_add_reuses_the_buffer() {
        let w = ws(vec![
            ("x", Tensor::scalar(0.0f32)),
            ("one", Tensor::scalar(1.0f32)),
        ]);
        let before = data_ptr(&w, "x");
        run_kernel(&w, &def("Add", &["x", "one"], &["x"], vec![]), 1000);
        assert_eq!(get(&w, "x"), Tensor::scalar(1000.0f32));
        assert_eq!(data_ptr(&w, "x"), before);
    }

    #[test]
    fn separate_output_buffer_is_reused_when_it_fits() {
        let w = ws(vec![
            ("a", t(&[2, 2], vec![1i64, 2, 3, 4])),
            ("b", t(&[2], vec![10i64, 20])),
        ]);
        let d = def("Add", &["a", "b"], &["c"], vec![]);
        run_kernel(&w, &d, 1);
        let p = data_ptr(&w, "c");
        w.feed("a", BlobValue::Tensor(t(&[2, 2], vec![5i64, 6, 7, 8])));
        run_kernel(&w, &d, 1);
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![15i64, 26, 17, 28]));
        assert_eq!(data_ptr(&w, "c"), p);
        // An output of another dtype or shape is replaced.
        w.feed("c", BlobValue::Tensor(t(&[3], vec![0.0f32; 3])));
        run_kernel(&w, &d, 1);
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![15i64, 26, 17, 28]));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn streaming_copy_handles_unaligned_heads_and_tails() {
        for off in 0..9 {
            for len in [0usize, 1, 3, 4, 5, 17, 100] {
                let src: Vec<u32> = (0..len as u32).map(|i| i * 7 + 1).collect();
                let mut dst = vec![0u32; len + off + 3];
                nt::copy(&mut dst[off..off + len], &src);
                nt::fence();
                assert_eq!(&dst[off..off + len], &src[..]);
                assert!(dst[..off].iter().chain(&dst[off + len..]).all(|&x| x == 0));
            }
            let src: Vec<u8> = (0..50u8).collect();
            let mut dst = vec![0u8; 64];
            nt::copy(&mut dst[off..off + 50], &src);
            assert_eq!(&dst[off..off + 50], &src[..]);
            let src: Vec<f64> = (0..21).map(|i| i as f64 * 0.5).collect();
            let mut dst = vec![0f64; 30];
            nt::copy(&mut dst[off..off + 21], &src);
            assert_eq!(&dst[off..off + 21], &src[..]);
        }
    }

    #[test]
    fn streamed_outputs_are_exact() {
        // 2^22 float32 = 16 MiB: separate outputs are written with streaming
        // stores; in-place ones and smaller ones are not. Every path must
        // agree with a plain loop.
        let n = 1usize << 22;
        let a: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 977) as f32 - 3.0).collect();
        let row: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let w = ws(vec![
            ("a", t(&[n], a.clone())),
            ("b", t(&[n], b.clone())),
            ("m", t(&[n / 1024, 1024], a.clone())),
            ("r", t(&[1000], row.clone())),
            ("m2", t(&[n / 1000, 1000], a[..n / 1000 * 1000].to_vec())),
            ("s", Tensor::scalar(2.0f32)),
        ]);
        assert!(streams::<f32>(n) && !streams::<f32>(n - 1));
        run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(get(&w, "c"), t(&[n], want.clone()));
        // Again into the existing buffer.
        let p = data_ptr(&w, "c");
        run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(data_ptr(&w, "c"), p);
        assert_eq!(get(&w, "c"), t(&[n], want));
        run(&w, def("Mul", &["a", "s"], &["d"], vec![])).unwrap();
        assert_eq!(get(&w, "d"), t(&[n], a.iter().map(|x| x * 2.0).collect()));
        run(&w, def("LT", &["a", "b"], &["lt"], vec![])).unwrap();
        let lt: Vec<bool> = a.iter().zip(&b).map(|(x, y)| x < y).collect();
        assert_eq!(get(&w, "lt"), t(&[n], lt));
        run(&w, def("Sub", &["m2", "r"], &["e"], vec![])).unwrap();
        let e: Vec<f32> = a[..n / 1000 * 1000]
            .iter()
            .enumerate()
            .map(|(i, x)| x - row[i % 1000])
            .collect();
        assert_eq!(get(&w, "e"), t(&[n / 1000, 1000], e));
        run(&w, def("Sum", &["a"], &["f"], vec![])).unwrap();
        assert_eq!(get(&w, "f"), t(&[n], a.clone()));
        run(&w, def("Cast", &["m"], &["g"], vec![ai("to", 10)])).unwrap();
        assert_eq!(
            get(&w, "g"),
            t(&[n / 1024, 1024], a.iter().map(|&x| x as i64).collect())
        );
    }

    // ------------------------------------------------ comparisons and logic --

    #[test]
    fn comparisons() {
        let w = ws(vec![
            ("a", t(&[2, 3], vec![1i32, 2, 3, 4, 5, 6])),
            ("b", t(&[3], vec![2i32, 2, 5])),
        ]);
        let cases = [
            ("EQ", [false, true, false, false, false, false]),
            ("NE", [true, false, true, true, true, true]),
            ("LT", [true, false, true, false, false, false]),
            ("LE", [true, true, true, false, false, false]),
            ("GT", [false, false, false, true, true, true]),
            ("GE", [false, true, false, true, true, true]),
        ];
        for (ty, want) in cases {
            run(&w, def(ty, &["a", "b"], &["c"], vec![])).unwrap();
            assert_eq!(get(&w, "c"), t(&[2, 3], want.to_vec()), "{ty}");
        }
        // Floats: NaN is unequal to everything, itself included.
        let w = ws(vec![
            ("x", t(&[3], vec![f64::NAN, 1.0, -0.0])),
            ("y", t(&[3], vec![f64::NAN, f64::NAN, 0.0])),
        ]);
        run(&w, def("EQ", &["x", "y"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3], vec![false, false, true]));
        run(&w, def("NE", &["x", "y"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3], vec![true, true, false]));
        run(&w, def("GE", &["x", "y"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3], vec![false, false, true]));
        // Bools order false < true; legacy broadcasting works for comparisons too.
        let w = ws(vec![
            ("p", t(&[2, 2], vec![false, true, false, true])),
            ("q", t(&[2], vec![true, false])),
        ]);
        run(
            &w,
            def(
                "LT",
                &["p", "q"],
                &["c"],
                vec![ai("broadcast", 1), ai("axis", 0)],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "c"), t(&[2, 2], vec![true, false, false, false]));
        // int64 against a scalar.
        let w = ws(vec![
            ("v", t(&[3], vec![-1i64, 0, 1])),
            ("z", Tensor::scalar(0i64)),
        ]);
        run(&w, def("GT", &["v", "z"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3], vec![false, false, true]));
    }

    #[test]
    fn logic_ops() {
        let w = ws(vec![
            ("p", t(&[4], vec![false, false, true, true])),
            ("q", t(&[4], vec![false, true, false, true])),
            ("r", t(&[2, 1], vec![true, false])),
        ]);
        run(&w, def("And", &["p", "q"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[4], vec![false, false, false, true]));
        run(&w, def("Or", &["p", "q"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[4], vec![false, true, true, true]));
        run(&w, def("Xor", &["p", "q"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[4], vec![false, true, true, false]));
        run(&w, def("Not", &["p"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[4], vec![true, true, false, false]));
        // Broadcast [2,1] with [4] -> [2,4].
        run(&w, def("And", &["r", "q"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(
                &[2, 4],
                vec![false, true, false, true, false, false, false, false]
            )
        );
        // In place on A.
        run(&w, def("Or", &["p", "q"], &["p"], vec![])).unwrap();
        assert_eq!(get(&w, "p"), t(&[4], vec![false, true, true, true]));
        // Bool only.
        let w = ws(vec![("i", t(&[2], vec![1i32, 0]))]);
        for (ty, ins) in [("And", &["i", "i"][..]), ("Not", &["i"][..])] {
            let e = run(&w, def(ty, ins, &["c"], vec![])).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Type, "{ty}");
            assert_eq!(e.context.blob.as_deref(), Some("i"));
        }
    }

    // ---------------------------------------------------------------- Sum --

    #[test]
    fn sum_adds_in_order_and_copies_one_input() {
        let w = ws(vec![
            ("a", t(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])),
            ("b", t(&[2, 2], vec![10.0f32, 20.0, 30.0, 40.0])),
            ("c", t(&[2, 2], vec![100.0f32, 200.0, 300.0, 400.0])),
            ("i", t(&[3], vec![i64::MAX, 1, 2])),
            ("j", t(&[3], vec![1i64, 2, 3])),
        ]);
        run(&w, def("Sum", &["a", "b", "c"], &["y"], vec![])).unwrap();
        assert_eq!(
            get(&w, "y"),
            t(&[2, 2], vec![111.0f32, 222.0, 333.0, 444.0])
        );
        run(&w, def("Sum", &["a"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), get(&w, "a"));
        run(&w, def("Sum", &["a", "a"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), t(&[2, 2], vec![2.0f32, 4.0, 6.0, 8.0]));
        run(&w, def("Sum", &["a", "b", "c"], &["a"], vec![])).unwrap();
        assert_eq!(
            get(&w, "a"),
            t(&[2, 2], vec![111.0f32, 222.0, 333.0, 444.0])
        );
        run(&w, def("Sum", &["a"], &["a"], vec![])).unwrap();
        assert_eq!(
            get(&w, "a"),
            t(&[2, 2], vec![111.0f32, 222.0, 333.0, 444.0])
        );
        // Integers wrap.
        run(&w, def("Sum", &["i", "j", "j"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), t(&[3], vec![i64::MIN + 1, 5, 8]));
    }

    #[test]
    fn sum_of_more_distinct_inputs_than_a_u16_counts_reads_each_blob() {
        // Input k holds k: a slot index that wrapped at 65,536 would read
        // input 0 (or another early blob) instead, and the output's slot
        // would land on an input's read guard.
        let n = 70_000usize;
        let names: Vec<String> = (0..n).map(|k| format!("x{k}")).collect();
        let w = Workspace::new();
        for (k, name) in names.iter().enumerate() {
            w.feed(name, BlobValue::Tensor(Tensor::scalar(k as i64)));
        }
        let ins: Vec<&str> = names.iter().map(String::as_str).collect();
        run(&w, def("Sum", &ins, &["total"], vec![])).unwrap();
        let expected = (n as i64) * (n as i64 - 1) / 2;
        assert_eq!(get(&w, "total"), Tensor::scalar(expected));
        // In place on input 0, with the last input named twice.
        let mut ins2 = ins.clone();
        ins2.push(ins[n - 1]);
        run(&w, def("Sum", &ins2, &["x0"], vec![])).unwrap();
        assert_eq!(get(&w, "x0"), Tensor::scalar(expected + n as i64 - 1));
    }

    #[test]
    fn sum_errors() {
        let w = ws(vec![
            ("a", t(&[2], vec![1i32, 2])),
            ("b", t(&[2], vec![1i64, 2])),
            ("c", t(&[1, 2], vec![1i32, 2])),
            ("d", t(&[2], vec![1i32, 2])),
            ("p", t(&[2], vec![true, false])),
        ]);
        let e = run(&w, def("Sum", &["a", "d", "b"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(e.context.blob.as_deref(), Some("b"));
        assert!(
            e.message.contains("int32") && e.message.contains("int64"),
            "{}",
            e.message
        );
        // Same element count, different shape: no broadcasting, no reshaping.
        let e = run(&w, def("Sum", &["a", "c"], &["a"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert_eq!(e.context.blob.as_deref(), Some("c"));
        assert_eq!(get(&w, "a"), t(&[2], vec![1i32, 2]));
        let e = run(&w, def("Sum", &["p", "p"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        // Only input 0 may be the output.
        let e = run(&w, def("Sum", &["a", "d"], &["d"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let e = run(&w, def("Sum", &[], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    // -------------------------------------------------------- WeightedSum --

    #[test]
    fn weighted_sum_values() {
        let w = ws(vec![
            ("x0", t(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])),
            ("w0", t(&[1], vec![2.0f32])),
            ("x1", t(&[4], vec![10.0f32, 20.0, 30.0, 40.0])),
            ("w1", Tensor::scalar(0.5f32)),
            ("x2", t(&[2, 2], vec![1.0f32, 1.0, 1.0, 1.0])),
            ("w2", t(&[1, 1], vec![-3.0f32])),
        ]);
        run(&w, def("WeightedSum", &["x0", "w0"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), t(&[2, 2], vec![2.0f32, 4.0, 6.0, 8.0]));
        // Y takes X0's shape even though X1 is [4].
        run(
            &w,
            def("WeightedSum", &["x0", "w0", "x1", "w1"], &["y"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&w, "y"), t(&[2, 2], vec![7.0f32, 14.0, 21.0, 28.0]));
        run(
            &w,
            def(
                "WeightedSum",
                &["x0", "w0", "x1", "w1", "x2", "w2"],
                &["y"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "y"), t(&[2, 2], vec![4.0f32, 11.0, 18.0, 25.0]));
        // In place on X0.
        run(
            &w,
            def(
                "WeightedSum",
                &["x0", "w0", "x1", "w1", "x2", "w2"],
                &["x0"],
                vec![],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "x0"), t(&[2, 2], vec![4.0f32, 11.0, 18.0, 25.0]));
        run(&w, def("WeightedSum", &["x0", "w1"], &["x0"], vec![])).unwrap();
        assert_eq!(get(&w, "x0"), t(&[2, 2], vec![2.0f32, 5.5, 9.0, 12.5]));
        // An empty X0 gives an empty output.
        let w = ws(vec![
            ("e", t(&[0, 3], Vec::<f32>::new())),
            ("w", Tensor::scalar(1.0f32)),
        ]);
        run(
            &w,
            def("WeightedSum", &["e", "w", "e", "w"], &["y"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&w, "y").shape(), &[0, 3]);
    }

    #[test]
    fn weighted_sum_errors() {
        let w = ws(vec![
            ("x", t(&[2], vec![1.0f32, 2.0])),
            ("w", Tensor::scalar(1.0f32)),
            ("w2", t(&[2], vec![1.0f32, 1.0])),
            ("wd", Tensor::scalar(1.0f64)),
            ("x3", t(&[3], vec![1.0f32, 2.0, 3.0])),
            ("xd", t(&[2], vec![1.0f64, 2.0])),
            ("xi", t(&[2], vec![1i32, 2])),
        ]);
        let cases: &[(&[&str], &str, ErrorKind, &str)] = &[
            (&["x", "w", "x"], "y", ErrorKind::InvalidArgument, ""),
            (&["x", "w2"], "y", ErrorKind::Shape, "w2"),
            (&["x", "wd"], "y", ErrorKind::Type, "wd"),
            (&["x", "w", "x3", "w"], "y", ErrorKind::Shape, "x3"),
            (&["x", "w", "xd", "w"], "y", ErrorKind::Type, "xd"),
            (&["xi", "w"], "y", ErrorKind::Type, "xi"),
            (
                &["x", "w", "x3", "w"],
                "x3",
                ErrorKind::InvalidArgument,
                "x3",
            ),
        ];
        for (ins, out, kind, blob) in cases {
            let e = run(&w, def("WeightedSum", ins, &[out], vec![])).unwrap_err();
            assert_eq!(e.kind, *kind, "{ins:?}: {}", e.message);
            if !blob.is_empty() {
                assert_eq!(e.context.blob.as_deref(), Some(*blob), "{ins:?}");
            }
        }
        // A failing in-place call leaves X0 untouched.
        let e = run(
            &w,
            def("WeightedSum", &["x", "w", "x3", "w"], &["x"], vec![]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        assert_eq!(get(&w, "x"), t(&[2], vec![1.0f32, 2.0]));
    }

    // -------------------------------------------------------------- Scale --

    #[test]
    fn scale() {
        let w = ws(vec![
            ("x", t(&[3], vec![1.0f32, -2.0, 0.5])),
            ("d", t(&[2], vec![1.0f64, 3.0])),
            ("i", t(&[1], vec![1i32])),
        ]);
        run(&w, def("Scale", &["x"], &["y"], vec![af("scale", 2.0)])).unwrap();
        assert_eq!(get(&w, "y"), t(&[3], vec![2.0f32, -4.0, 1.0]));
        run(&w, def("Scale", &["x"], &["y"], vec![])).unwrap();
        assert_eq!(get(&w, "y"), get(&w, "x"));
        run(&w, def("Scale", &["x"], &["x"], vec![af("scale", -0.5)])).unwrap();
        assert_eq!(get(&w, "x"), t(&[3], vec![-0.5f32, 1.0, -0.25]));
        run(&w, def("Scale", &["d"], &["d"], vec![af("scale", 0.25)])).unwrap();
        assert_eq!(get(&w, "d"), t(&[2], vec![0.25f64, 0.75]));
        let e = run(&w, def("Scale", &["i"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(e.context.blob.as_deref(), Some("i"));
        // `scale` is a float argument: an int is a field error.
        let e = run(&w, def("Scale", &["x"], &["y"], vec![ai("scale", 2)])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    // --------------------------------------------------------------- Cast --

    #[test]
    fn cast_conversions() {
        let w = ws(vec![
            ("f", t(&[6], vec![1.7f32, -1.7, f32::NAN, 1e10, -1e10, 0.0])),
            ("l", t(&[3], vec![0i64, -5, 300])),
            ("p", t(&[2], vec![true, false])),
        ]);
        // float -> int: truncation toward zero; NaN -> 0; out of range saturates.
        run(
            &w,
            def(
                "Cast",
                &["f"],
                &["y"],
                vec![ai("to", DataType::Int32 as i64)],
            ),
        )
        .unwrap();
        assert_eq!(
            get(&w, "y"),
            t(&[6], vec![1i32, -1, 0, i32::MAX, i32::MIN, 0])
        );
        // Names are accepted in any case.
        run(&w, def("Cast", &["f"], &["y"], vec![as_("to", "bool")])).unwrap();
        assert_eq!(
            get(&w, "y"),
            t(&[6], vec![true, true, true, true, true, false])
        );
        run(&w, def("Cast", &["l"], &["y"], vec![as_("to", "FLOAT")])).unwrap();
        assert_eq!(get(&w, "y"), t(&[3], vec![0.0f32, -5.0, 300.0]));
        // int -> narrower int wraps: 300 -> 44 (uint8), -5 -> 251.
        run(&w, def("Cast", &["l"], &["y"], vec![as_("to", "UINT8")])).unwrap();
        assert_eq!(get(&w, "y"), t(&[3], vec![0u8, 251, 44]));
        run(
            &w,
            def(
                "Cast",
                &["p"],
                &["y"],
                vec![ai("to", DataType::Double as i64)],
            ),
        )
        .unwrap();
        assert_eq!(get(&w, "y"), t(&[2], vec![1.0f64, 0.0]));
        run(&w, def("Cast", &["p"], &["y"], vec![as_("to", "INT64")])).unwrap();
        assert_eq!(get(&w, "y"), t(&[2], vec![1i64, 0]));
        // Same dtype is a copy.
        run(&w, def("Cast", &["l"], &["y"], vec![as_("to", "INT64")])).unwrap();
        assert_eq!(get(&w, "y"), get(&w, "l"));
        // In place, changing the dtype.
        run(&w, def("Cast", &["l"], &["l"], vec![as_("to", "INT16")])).unwrap();
        assert_eq!(get(&w, "l"), t(&[3], vec![0i16, -5, 300]));
        run(&w, def("Cast", &["l"], &["l"], vec![as_("to", "INT16")])).unwrap();
        assert_eq!(get(&w, "l"), t(&[3], vec![0i16, -5, 300]));
    }

    #[test]
    fn cast_errors() {
        let w = ws(vec![
            ("f", t(&[1], vec![1.0f32])),
            ("s", t(&[1], vec![b"x".to_vec()])),
        ]);
        let cases: Vec<(Vec<Argument>, ErrorKind)> = vec![
            (vec![], ErrorKind::InvalidArgument),
            (vec![as_("to", "NOPE")], ErrorKind::InvalidArgument),
            (vec![ai("to", 11)], ErrorKind::InvalidArgument),
            (vec![ai("to", 0)], ErrorKind::InvalidArgument),
            (vec![af("to", 1.0)], ErrorKind::InvalidArgument),
            (vec![as_("to", "BYTE")], ErrorKind::Type),
        ];
        for (args, kind) in cases {
            let e = run(&w, def("Cast", &["f"], &["y"], args.clone())).unwrap_err();
            assert_eq!(e.kind, kind, "{args:?}: {}", e.message);
        }
        let e = run(&w, def("Cast", &["s"], &["y"], vec![as_("to", "INT32")])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert_eq!(e.context.blob.as_deref(), Some("s"));
        let e = run(&w, def("Cast", &["s"], &["y"], vec![as_("to", "STRING")])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
    }

    #[test]
    fn cast_to_string_writes_std_to_string_text() {
        let w = ws(vec![
            ("i", t(&[2, 2], vec![0i32, -7, 2147483647, 42])),
            ("b", t(&[2], vec![true, false])),
            ("f", t(&[4], vec![1.5f32, -0.25, f32::INFINITY, f32::NAN])),
            ("d", t(&[1], vec![1e20f64])),
        ]);
        let strs = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        run(&w, def("Cast", &["i"], &["y"], vec![ai("to", 4)])).unwrap();
        assert_eq!(
            get(&w, "y"),
            t(&[2, 2], strs(&["0", "-7", "2147483647", "42"]))
        );
        run(&w, def("Cast", &["b"], &["y"], vec![as_("to", "STRING")])).unwrap();
        assert_eq!(get(&w, "y"), t(&[2], strs(&["1", "0"])));
        run(&w, def("Cast", &["f"], &["y"], vec![as_("to", "STRING")])).unwrap();
        assert_eq!(
            get(&w, "y"),
            t(&[4], strs(&["1.500000", "-0.250000", "inf", "nan"]))
        );
        run(&w, def("Cast", &["d"], &["d"], vec![as_("to", "STRING")])).unwrap();
        assert_eq!(
            get(&w, "d"),
            t(&[1], strs(&["100000000000000000000.000000"]))
        );
    }

    // -------------------------------------------------- layouts and sizes --

    #[test]
    fn non_standard_layouts() {
        // a = [[0,1,2],[3,4,5]] transposed: [[0,3],[1,4],[2,5]].
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![0i32, 1, 2, 3, 4, 5])
            .unwrap()
            .reversed_axes();
        assert!(!a.is_standard_layout());
        let w = ws(vec![
            ("a", Tensor::from(a.clone())),
            ("b", t(&[3, 2], vec![10i32, 20, 30, 40, 50, 60])),
            ("r", t(&[2], vec![100i32, 200])),
        ]);
        run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3, 2], vec![10i32, 23, 31, 44, 52, 65]));
        run(&w, def("Sub", &["b", "a"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3, 2], vec![10i32, 17, 29, 36, 48, 55]));
        run(&w, def("Add", &["a", "r"], &["c"], vec![])).unwrap();
        assert_eq!(
            get(&w, "c"),
            t(&[3, 2], vec![100i32, 203, 101, 204, 102, 205])
        );
        run(&w, def("Add", &["a", "r"], &["a"], vec![])).unwrap();
        assert_eq!(
            get(&w, "a"),
            t(&[3, 2], vec![100i32, 203, 101, 204, 102, 205])
        );
        w.feed("a", BlobValue::Tensor(Tensor::from(a.clone())));
        run(&w, def("Sum", &["a", "b"], &["a"], vec![])).unwrap();
        assert_eq!(get(&w, "a"), t(&[3, 2], vec![10i32, 23, 31, 44, 52, 65]));
        w.feed("a", BlobValue::Tensor(Tensor::from(a.clone())));
        run(&w, def("Cast", &["a"], &["c"], vec![as_("to", "INT64")])).unwrap();
        assert_eq!(get(&w, "c"), t(&[3, 2], vec![0i64, 3, 1, 4, 2, 5]));
        // WeightedSum matches elements in row-major order.
        let f = ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.0f32, 2.0, 3.0, 4.0])
            .unwrap()
            .reversed_axes();
        w.feed("f", BlobValue::Tensor(Tensor::from(f)));
        w.feed("g", BlobValue::Tensor(t(&[4], vec![1.0f32, 1.0, 1.0, 1.0])));
        w.feed("one", BlobValue::Tensor(Tensor::scalar(1.0f32)));
        run(
            &w,
            def("WeightedSum", &["g", "one", "f", "one"], &["y"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&w, "y"), t(&[4], vec![2.0f32, 4.0, 3.0, 5.0]));
        run(
            &w,
            def("WeightedSum", &["f", "one", "g", "one"], &["f"], vec![]),
        )
        .unwrap();
        assert_eq!(get(&w, "f"), t(&[2, 2], vec![2.0f32, 4.0, 3.0, 5.0]));
    }

    #[test]
    fn large_tensors_take_the_parallel_paths() {
        let n = 3 * PAR_MIN_LEN + 7;
        let a: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        let w = ws(vec![
            ("a", t(&[n], a.clone())),
            ("b", t(&[n], b.clone())),
            ("s", Tensor::scalar(2.0f32)),
            ("row", t(&[7], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])),
        ]);
        run(&w, def("Add", &["a", "b"], &["c"], vec![])).unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(get(&w, "c"), t(&[n], want.clone()));
        run(&w, def("Mul", &["a", "s"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[n], a.iter().map(|x| x * 2.0).collect()));
        run(&w, def("Add", &["a", "b"], &["a"], vec![])).unwrap();
        assert_eq!(get(&w, "a"), t(&[n], want.clone()));
        run(&w, def("Sub", &["a", "b"], &["a"], vec![])).unwrap();
        assert_eq!(get(&w, "a"), t(&[n], a.clone()));
        // A row repeated along a leading dim, separate and in place.
        let m = n / 7 * 7;
        let rows: Vec<f32> = (0..m).map(|i| i as f32).collect();
        w.feed("m", BlobValue::Tensor(t(&[m / 7, 7], rows.clone())));
        let want: Vec<f32> = rows
            .iter()
            .enumerate()
            .map(|(i, x)| x - (i % 7 + 1) as f32)
            .collect();
        run(&w, def("Sub", &["m", "row"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[m / 7, 7], want.clone()));
        let want_rev: Vec<f32> = rows
            .iter()
            .enumerate()
            .map(|(i, x)| (i % 7 + 1) as f32 - x)
            .collect();
        run(&w, def("Sub", &["row", "m"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[m / 7, 7], want_rev));
        run(&w, def("Sub", &["m", "row"], &["m"], vec![])).unwrap();
        assert_eq!(get(&w, "m"), t(&[m / 7, 7], want));
        // Comparisons and casts of large tensors.
        run(&w, def("GE", &["b", "s"], &["c"], vec![])).unwrap();
        assert_eq!(get(&w, "c"), t(&[n], b.iter().map(|&x| x >= 2.0).collect()));
        run(&w, def("Cast", &["b"], &["c"], vec![as_("to", "INT32")])).unwrap();
        assert_eq!(get(&w, "c"), t(&[n], b.iter().map(|&x| x as i32).collect()));
    }

    #[test]
    fn every_schema_is_documented() {
        let all = schemas();
        assert_eq!(all.len(), 28);
        for s in &all {
            assert!(!s.doc.is_empty(), "{}", s.name);
        }
    }
}
