//! Segment reductions (Caffe2's segment_reduction ops): rows of DATA (or,
//! for the `Sparse*` forms, the rows INDICES pick) reduced per segment,
//! the segments given by SEGMENT_IDS.
//!
//! - `SortedSegment{Sum,Mean}` and `UnsortedSegment{Sum,Mean}` (and their
//!   `Sparse*` forms): output row `s` reduces the rows whose id is `s`;
//!   there are `max id + 1` rows (or `num_segments` for the unsorted ones,
//!   whose empty segments give zeros; sorted ids start at 0 and have no
//!   gaps). Their gradients are
//!   `{Sorted,Unsorted}Segment{Sum,Mean}Gradient` (dY, SEGMENT_IDS) -> one
//!   row per id: the dense op's data gradient, or the values of the sparse
//!   op's `GradientSlice` over INDICES (the maker in `gradients.py`).
//! - `SortedSegmentRange{Sum,Mean,Max,LogSumExp,LogMeanExp}`: the same over
//!   DATA's first dim, with gradients
//!   `SortedSegmentRange*Gradient` (DATA, Y, dY, SEGMENT_IDS).
//! - `LengthsMax` (segments given by LENGTHS) and its gradient
//!   `LengthsMaxWithMainInputAndForwardOutputGradient` (Y, dY, LENGTHS,
//!   DATA): every element equal to its segment's max gets dY.
//!
//! float32 or float64 data; int32 or int64 ids and indices.

#![allow(clippy::result_large_err)]

use super::kit::{array, dense, float_kernel, input};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{checked_numel, filled_vec, try_collect, try_vec, zeroed_vec};

const NUM_SEGMENTS: crate::operator::ArgDoc = arg!(
    "num_segments",
    "int",
    "max id + 1",
    "the number of output rows (unsorted ops)"
);

/// (forward dense, forward sparse, gradient) names of the segment ops.
const SEGMENT_OPS: [(&str, &str, &str); 4] = [
    (
        "SortedSegmentSum",
        "SparseSortedSegmentSum",
        "SortedSegmentSumGradient",
    ),
    (
        "SortedSegmentMean",
        "SparseSortedSegmentMean",
        "SortedSegmentMeanGradient",
    ),
    (
        "UnsortedSegmentSum",
        "SparseUnsortedSegmentSum",
        "UnsortedSegmentSumGradient",
    ),
    (
        "UnsortedSegmentMean",
        "SparseUnsortedSegmentMean",
        "UnsortedSegmentMeanGradient",
    ),
];

/// (forward, gradient) names of the range ops.
const RANGE_OPS: [(&str, &str); 5] = [
    ("SortedSegmentRangeSum", "SortedSegmentRangeSumGradient"),
    ("SortedSegmentRangeMean", "SortedSegmentRangeMeanGradient"),
    ("SortedSegmentRangeMax", "SortedSegmentRangeMaxGradient"),
    (
        "SortedSegmentRangeLogSumExp",
        "SortedSegmentRangeLogSumExpGradient",
    ),
    (
        "SortedSegmentRangeLogMeanExp",
        "SortedSegmentRangeLogMeanExpGradient",
    ),
];

pub fn schemas() -> Vec<OpSchema> {
    let mut v = Vec::new();
    for (dense_name, sparse_name, grad_name) in SEGMENT_OPS {
        let unsorted = dense_name.starts_with("Unsorted");
        let with_num = |s: OpSchema| if unsorted { s.args(&[NUM_SEGMENTS]) } else { s };
        v.push(with_num(
            OpSchema::new(dense_name, build_segment)
                .inputs(2, 2)
                .outputs(1, 1)
                .doc("Inputs (DATA, SEGMENT_IDS): output row s reduces (sum or mean) the rows of DATA whose id is s; max id + 1 rows (num_segments for the unsorted ops, whose empty segments are zero). The sorted ops need ids that start at 0 and step by 0 or 1."),
        ));
        v.push(with_num(
            OpSchema::new(sparse_name, build_segment)
                .inputs(3, 3)
                .outputs(1, 1)
                .doc("Inputs (DATA, INDICES, SEGMENT_IDS): as the dense op over the rows of DATA that INDICES pick."),
        ));
        v.push(with_num(
            OpSchema::new(grad_name, build_segment_grad)
                .inputs(2, 2)
                .outputs(1, 1)
                .doc("Gradient of the segment reduction: inputs (dY, SEGMENT_IDS), output one row per id: dY's row of its segment (divided by the segment's size for Mean)."),
        ));
    }
    for (name, grad_name) in RANGE_OPS {
        v.push(
            OpSchema::new(name, build_span_reduce)
                .inputs(2, 2)
                .outputs(1, 1)
                .doc("Inputs (DATA, SEGMENT_IDS: one non-decreasing id per row of DATA): output row s reduces DATA's rows of segment s (sum, mean, max, log-sum-exp or log-mean-exp, elementwise)."),
        );
        v.push(
            OpSchema::new(grad_name, build_span_grad)
                .inputs(4, 4)
                .outputs(1, 1)
                .doc("Gradient of SortedSegmentRange: inputs (DATA, Y, dY, SEGMENT_IDS), output dDATA (Max: every element equal to its segment's max gets dY)."),
        );
    }
    v.push(
        OpSchema::new("LengthsMax", build_span_reduce)
            .inputs(2, 2)
            .outputs(1, 1)
            .doc("Inputs (DATA, LENGTHS): output row s is the elementwise max of the next LENGTHS[s] rows of DATA (zeros for an empty segment)."),
    );
    v.push(
        OpSchema::new("LengthsMaxWithMainInputAndForwardOutputGradient", build_span_grad)
            .inputs(4, 4)
            .outputs(1, 1)
            .doc("Gradient of LengthsMax: inputs (Y, dY, LENGTHS, DATA), output dDATA: dY where an element equals its segment's max, else 0."),
    );
    v
}

/// Input `i` as non-negative int64 values (int32 or int64, 1-D).
fn ids(l: &Locked<'_>, op: &str, i: usize, what: &str) -> Result<Vec<usize>> {
    let t = l.tensor(i)?;
    let name = l.input_name(i);
    let raw: Vec<i64> = match (t.ndim(), t.dtype()) {
        (1, crate::tensor::DataType::Int32) => crate::tensor::try_collect(
            t.array::<i32>()?.iter().map(|&v| v as i64),
            "a kernel buffer",
        )?,
        (1, crate::tensor::DataType::Int64) => {
            crate::tensor::try_collect(t.array::<i64>()?.iter().copied(), "a kernel buffer")?
        }
        _ => {
            return Err(Error::type_error(format!(
                "{op}: {what} ('{name}') must be a 1-D int32 or int64 tensor, got {} of shape {:?}",
                t.dtype(),
                t.shape()
            ))
            .with_blob(name))
        }
    };
    raw.iter()
        .map(|&v| {
            usize::try_from(v).map_err(|_| {
                Error::invalid_arg(format!("{op}: {what} ('{name}') has a negative value {v}"))
                    .with_blob(name)
            })
        })
        .collect()
}

/// Sorted ids start at 0 and step by 0 or 1 (Caffe2's "sorted and no
/// gaps").
fn sorted_check(op: &str, seg: &[usize], name: &str) -> Result<()> {
    if seg.first().is_some_and(|&s| s != 0)
        || seg.windows(2).any(|w| w[1] < w[0] || w[1] > w[0] + 1)
    {
        return Err(Error::invalid_arg(format!(
            "{op}: the segment ids ('{name}') must be sorted, start at 0 and have no gaps"
        ))
        .with_blob(name));
    }
    Ok(())
}

/// The number of output rows: `num_segments`, or max id + 1.
fn segments(op: &str, seg: &[usize], num: Option<i64>, name: &str) -> Result<usize> {
    let k = seg.iter().max().map_or(0, |&m| m + 1);
    match num {
        None => Ok(k),
        Some(n) if n >= 0 && n as usize >= k => Ok(n as usize),
        Some(n) => Err(Error::invalid_arg(format!(
            "{op}: num_segments = {n} but the segment ids ('{name}') go up to {}",
            k.saturating_sub(1)
        ))
        .with_blob(name)),
    }
}

fn segment_t<T: Float>(l: &mut Locked<'_>, op: &str, num: Option<i64>) -> Result<()> {
    let sparse = op.starts_with("Sparse");
    let mean = op.ends_with("Mean");
    let si = if sparse { 2 } else { 1 };
    let sname = l.input_name(si);
    let seg = ids(l, op, si, "SEGMENT_IDS")?;
    if op.contains("Sorted") && !op.contains("Unsorted") {
        sorted_check(op, &seg, sname)?;
    }
    let d = input::<T>(l, op, 0)?;
    let dname = l.input_name(0);
    if d.ndim() == 0 {
        return Err(
            Error::shape(format!("{op}: DATA ('{dname}') must have at least one dim"))
                .with_blob(dname),
        );
    }
    let rows: Vec<usize> = if sparse {
        let idx = ids(l, op, 1, "INDICES")?;
        if let Some(&bad) = idx.iter().find(|&&r| r >= d.shape()[0]) {
            return Err(Error::invalid_arg(format!(
                "{op}: index {bad} is out of range for DATA's {} rows",
                d.shape()[0]
            ))
            .with_blob(l.input_name(1)));
        }
        idx
    } else {
        crate::tensor::try_collect(0..d.shape()[0], "a kernel buffer")?
    };
    if rows.len() != seg.len() {
        return Err(Error::shape(format!(
            "{op}: SEGMENT_IDS ('{sname}') has {} ids for {} rows",
            seg.len(),
            rows.len()
        ))
        .with_blob(sname));
    }
    let k = segments(op, &seg, num, sname)?;
    let inner: usize = d.shape()[1..].iter().product();
    let mut shape = vec![k];
    shape.extend_from_slice(&d.shape()[1..]);
    let what = || {
        format!(
            "{op}'s output of {k} rows ({})",
            if num.is_some() {
                "argument `num_segments`".to_string()
            } else {
                format!("the largest id in SEGMENT_IDS ('{sname}'), plus 1")
            }
        )
    };
    let mut out = zeroed_vec::<T>(&shape, what())?;
    let mut count = filled_vec(k, 0usize, what())?;
    let x = dense(d);
    for (&r, &s) in rows.iter().zip(&seg) {
        count[s] += 1;
        for j in 0..inner {
            out[s * inner + j] += x[r * inner + j];
        }
    }
    if mean {
        for s in 0..k {
            if count[s] > 0 {
                let c = T::of(count[s] as f64);
                out[s * inner..(s + 1) * inner]
                    .iter_mut()
                    .for_each(|v| *v = *v / c);
            }
        }
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn num_segments(ctx: &OpDefCtx<'_>) -> Result<Option<i64>> {
    if ctx.op_type().contains("Unsorted") {
        ctx.args.i64_opt("num_segments")
    } else {
        Ok(None)
    }
}

fn build_segment(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let num = num_segments(ctx)?;
    float_kernel!(&op, 0, |l| segment_t(&mut l, &op, num))
}

fn segment_grad_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let mean = op.ends_with("MeanGradient");
    let seg = ids(l, op, 1, "SEGMENT_IDS")?;
    let g = input::<T>(l, op, 0)?;
    let k = g.shape().first().copied().unwrap_or(0);
    if g.ndim() == 0 || seg.iter().any(|&s| s >= k) {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {:?}) must have a row for every segment id (up to {})",
            l.input_name(0),
            g.shape(),
            seg.iter().max().copied().unwrap_or(0)
        ))
        .with_blob(l.input_name(0)));
    }
    let inner: usize = g.shape()[1..].iter().product();
    let mut shape = vec![seg.len()];
    shape.extend_from_slice(&g.shape()[1..]);
    let n = checked_numel::<T>(&shape, format_args!("{op}'s output"))?;
    let gv = dense(g);
    let mut count = filled_vec(k, 0usize, "segment sizes")?;
    seg.iter().for_each(|&s| count[s] += 1);
    let mut out = try_vec(
        n,
        format_args!("{op}'s output ({} tensor of shape {shape:?})", T::DTYPE),
    )?;
    for &s in &seg {
        let row = &gv[s * inner..(s + 1) * inner];
        if mean {
            let c = T::of(count[s] as f64);
            out.extend(row.iter().map(|&v| v / c));
        } else {
            out.extend_from_slice(row);
        }
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_segment_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| segment_grad_t(&mut l, &op))
}

// --------------------------------------------- SortedSegmentRange, LengthsMax --

/// The reducers of the range ops and LengthsMax.
#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    LogSumExp,
    LogMeanExp,
}

fn red_of(op: &str) -> Red {
    let base = op
        .trim_end_matches("Gradient")
        .trim_end_matches("WithMainInputAndForwardOutput");
    if base.ends_with("LogSumExp") {
        Red::LogSumExp
    } else if base.ends_with("LogMeanExp") {
        Red::LogMeanExp
    } else if base.ends_with("Mean") {
        Red::Mean
    } else if base.ends_with("Max") {
        Red::Max
    } else {
        Red::Sum
    }
}

/// Reduces `n` rows (each `inner` long, `at(r, j)`) into `out`.
fn reduce_rows<T: Float>(
    red: Red,
    n: usize,
    inner: usize,
    at: impl Fn(usize, usize) -> T,
    out: &mut [T],
) {
    if n == 0 {
        return;
    }
    for j in 0..inner {
        let v = match red {
            Red::Sum | Red::Mean => {
                let s = (0..n).fold(T::of(0.0), |s, r| s + at(r, j));
                if red == Red::Mean {
                    s / T::of(n as f64)
                } else {
                    s
                }
            }
            Red::Max => (1..n).fold(at(0, j), |m, r| if at(r, j) > m { at(r, j) } else { m }),
            Red::LogSumExp | Red::LogMeanExp => {
                // Caffe2's reducer starts the max at the lowest finite
                // value: a segment of -inf then gives log(0) + lowest =
                // -inf, not -inf - -inf = NaN.
                let m = (0..n).fold(T::LOWEST, |m, r| if at(r, j) > m { at(r, j) } else { m });
                let s = (0..n).fold(T::of(0.0), |s, r| s + (at(r, j) - m).exp());
                let s = if red == Red::LogMeanExp {
                    s / T::of(n as f64)
                } else {
                    s
                };
                m + s.ln()
            }
        };
        out[j] = v;
    }
}

/// d(reduced)/d(element) times dY for one element `x` of a segment of `n`
/// whose reduction is `y`.
fn red_grad<T: Float>(red: Red, n: usize, x: T, y: T, dy: T) -> T {
    match red {
        Red::Sum => dy,
        Red::Mean => dy / T::of(n as f64),
        Red::Max => {
            if x == y {
                dy
            } else {
                T::of(0.0)
            }
        }
        // d/dx log(sum exp) = exp(x - y); log-mean-exp is log-sum-exp -
        // log n, so the same slope is exp(x - y) / n from its own y.
        Red::LogSumExp => dy * (x - y).exp(),
        Red::LogMeanExp => dy * (x - y).exp() / T::of(n as f64),
    }
}

/// The (start, length) of each segment of sorted ids over `k` segments.
fn spans(seg: &[usize], k: usize) -> Result<Vec<(usize, usize)>> {
    let mut out = filled_vec(k, (0, 0), "segment spans")?;
    for (r, &s) in seg.iter().enumerate() {
        if out[s].1 == 0 {
            out[s].0 = r;
        }
        out[s].1 += 1;
    }
    Ok(out)
}

/// The segments of DATA (input `di`) and its row length: consecutive
/// spans from sorted SEGMENT_IDS or from LENGTHS (input `si`).
fn data_spans<T: Float>(
    l: &Locked<'_>,
    op: &str,
    di: usize,
    si: usize,
    by_lengths: bool,
) -> Result<(Vec<(usize, usize)>, usize, Vec<usize>)> {
    let what = if by_lengths { "LENGTHS" } else { "SEGMENT_IDS" };
    let v = ids(l, op, si, what)?;
    let d = input::<T>(l, op, di)?;
    let (dname, sname) = (l.input_name(di), l.input_name(si));
    if d.ndim() == 0 {
        return Err(
            Error::shape(format!("{op}: DATA ('{dname}') must have at least one dim"))
                .with_blob(dname),
        );
    }
    let rows = d.shape()[0];
    let sp = if by_lengths {
        let total = v.iter().try_fold(0usize, |t, &n| t.checked_add(n));
        if total != Some(rows) {
            let total = total.map_or_else(
                || "more than any tensor can hold".to_string(),
                |t| t.to_string(),
            );
            return Err(Error::invalid_arg(format!(
                "{op}: LENGTHS ('{sname}') sum to {total}, but DATA has {rows} rows"
            ))
            .with_blob(sname));
        }
        let mut start = 0;
        try_collect(
            v.iter().map(|&n| {
                start += n;
                (start - n, n)
            }),
            "segment spans",
        )?
    } else {
        sorted_check(op, &v, sname)?;
        if rows != v.len() {
            return Err(Error::shape(format!(
                "{op}: DATA ('{dname}', shape {:?}) must have one row per segment id ({})",
                d.shape(),
                v.len()
            ))
            .with_blob(dname));
        }
        spans(&v, v.last().map_or(0, |&m| m + 1))?
    };
    Ok((sp, d.shape()[1..].iter().product(), d.shape().to_vec()))
}

/// SortedSegmentRange* and LengthsMax: inputs (DATA, SEGMENT_IDS or
/// LENGTHS), one output row per segment.
fn span_reduce_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let (sp, inner, dshape) = data_spans::<T>(l, op, 0, 1, op == "LengthsMax")?;
    let mut shape = vec![sp.len()];
    shape.extend_from_slice(&dshape[1..]);
    let mut out = zeroed_vec::<T>(&shape, format_args!("{op}'s output"))?;
    let x = dense(input::<T>(l, op, 0)?);
    for (s, &(start, n)) in sp.iter().enumerate() {
        let at = |r: usize, j: usize| x[(start + r) * inner + j];
        reduce_rows(
            red_of(op),
            n,
            inner,
            at,
            &mut out[s * inner..(s + 1) * inner],
        );
    }
    l.set_output(0, T::wrap(array(&shape, out)?));
    Ok(())
}

fn build_span_reduce(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    float_kernel!(&op, 0, |l| span_reduce_t(&mut l, &op))
}

/// The data gradient of a per-segment reduction: segment `s` covers rows
/// `span[s]` of DATA `x`, whose reduction is row `s` of `y`.
fn spans_grad<T: Float>(
    red: Red,
    spans: &[(usize, usize)],
    inner: usize,
    x: &[T],
    y: &[T],
    dy: &[T],
) -> Result<Vec<T>> {
    let mut dx = crate::tensor::default_buffer::<T>(x.len(), "a segment gradient")?;
    for (s, &(start, n)) in spans.iter().enumerate() {
        for r in start..start + n {
            for j in 0..inner {
                let i = r * inner + j;
                dx[i] = red_grad(red, n, x[i], y[s * inner + j], dy[s * inner + j]);
            }
        }
    }
    Ok(dx)
}

/// Checks dY or Y (input `i`) against the `k` x inner output shape.
fn check_out<T: Float>(l: &Locked<'_>, op: &str, i: usize, k: usize, inner: usize) -> Result<()> {
    let a = input::<T>(l, op, i)?;
    if Some(a.len()) != k.checked_mul(inner) || a.shape().first() != Some(&k) {
        return Err(Error::shape(format!(
            "{op}: input {i} ('{}', shape {:?}) must have {k} rows of {inner}",
            l.input_name(i),
            a.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(())
}

/// The gradients of SortedSegmentRange* (inputs DATA, Y, dY, SEGMENT_IDS)
/// and of LengthsMax (Y, dY, LENGTHS, DATA), Caffe2's input orders.
fn span_grad_t<T: Float>(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let by_lengths = op.starts_with("LengthsMax");
    let (xi, yi, dyi, si) = if by_lengths {
        (3, 0, 1, 2)
    } else {
        (0, 1, 2, 3)
    };
    let (sp, inner, shape) = data_spans::<T>(l, op, xi, si, by_lengths)?;
    check_out::<T>(l, op, yi, sp.len(), inner)?;
    check_out::<T>(l, op, dyi, sp.len(), inner)?;
    let dx = spans_grad(
        red_of(op),
        &sp,
        inner,
        &dense(input::<T>(l, op, xi)?),
        &dense(input::<T>(l, op, yi)?),
        &dense(input::<T>(l, op, dyi)?),
    )?;
    l.set_output(0, T::wrap(array(&shape, dx)?));
    Ok(())
}

fn build_span_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let data = if op.starts_with("LengthsMax") { 3 } else { 0 };
    float_kernel!(&op, data, |l| span_grad_t(&mut l, &op))
}
