//! Collecting samples across runs: tensor vectors (CreateTensorVector,
//! TensorVectorSize, ConcatTensorVector, CollectTensor's reservoir sampling)
//! and LastNWindowCollector's ring buffer of the last N rows.
//!
//! Differences from Caffe2 (its behaviour is otherwise followed):
//! - a blob that does not hold a tensor vector, a tensor of the wrong dtype
//!   or shape, an inconsistent `next` cursor or `num_visited` counter raise a
//!   typed error naming the blob before anything is written (Caffe2
//!   dereferenced a null vector, reinterpreted a buffer of another dtype, and
//!   could write past the ring buffer's end when `next` was ahead of it);
//! - LastNWindowCollector treats its buffer as filled as soon as it holds a
//!   row (Caffe2 also required the buffer's first 8 bytes to be non-zero, so a
//!   buffer whose first row was zeros started over);
//! - a tensor vector cannot be saved, as in Caffe2 (no serializer).

use super::kit::by_dtype;
use super::kit::kernel;
use crate::arg;
use crate::args::Args;
use crate::blob::{BlobMutex, BlobObject, BlobValue};
use crate::error::{Error, Result};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo, MANY};
use crate::tensor::{DataType, Element, Tensor};
use ndarray::{Axis, Slice};
use parking_lot::Mutex;
use rand::Rng;
use std::sync::Arc;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateTensorVector", create_tensor_vector)
            .inputs(0, 0)
            .outputs(1, 1)
            .doc("Writes a new, empty tensor vector into the output (Caffe2's std::unique_ptr<std::vector<Tensor>>)."),
        OpSchema::new("TensorVectorSize", tensor_vector_size)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs the number of tensors in the tensor vector, as an int32 scalar (0-dim)."),
        OpSchema::new("ConcatTensorVector", concat_tensor_vector)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc(
                "Outputs the tensors of the (non-empty) tensor vector joined along their first dimension; they must \
                 have one dtype and the same inner dimensions.",
            ),
        OpSchema::new("CollectTensor", collect_tensor)
            .inputs(2, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Enforce(same_index))
            .args(&[arg!("num_to_collect", "int", "required", "the most tensors each vector keeps, > 0")])
            .doc(
                "Inputs (vector_1..vector_n, tensor_1..tensor_n), outputs vector_1..vector_n (in place): reservoir \
                 sampling of the tensors seen by this op. The first num_to_collect runs append; later runs replace a \
                 uniformly drawn slot or discard, the same choice for every vector (all or none), so the vectors stay \
                 aligned. The count of runs belongs to the op (as in Caffe2): a new net starts over.",
            ),
        OpSchema::new("LastNWindowCollector", last_n_window_collector)
            .inputs(3, 5)
            .outputs(2, 3)
            .inplace(InPlace::Enforce(last_n_in_place))
            .args(&[arg!("num_to_collect", "int", "required", "the number of rows to keep, > 0")])
            .infer(last_n_infer)
            .doc(
                "Inputs (last_n, next, data[, mutex[, num_visited]]), outputs (last_n, next[, num_visited]), in place: \
                 keeps the last num_to_collect rows (dim 0) of the data seen, in a ring buffer whose next slot is the \
                 int32 scalar `next`. Start with an empty (or never written) buffer and next = 0. The optional int64 \
                 num_visited (one element) counts every row seen. With a mutex, runs sharing it are serialised.",
            ),
    ]
}

fn same_index(i: usize, o: usize) -> bool {
    i == o
}

fn last_n_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (4, 2))
}

// --------------------------------------------------------- tensor vectors --

/// A growable list of tensors in a blob (Caffe2's `TensorVectorPtr`). The
/// ops that change it hold the blob's write lock, so the inner mutex is
/// never contended; it is what lets a shared object be changed at all.
#[derive(Debug, Default)]
pub struct TensorVector(pub Mutex<Vec<Tensor>>);

impl BlobObject for TensorVector {
    fn kind_name(&self) -> &'static str {
        "TensorVector"
    }
}

fn vector_in<'v>(v: &'v BlobValue, name: &str) -> Result<&'v TensorVector> {
    v.object_ref::<TensorVector>("TensorVector (made by CreateTensorVector)")
        .map_err(|e| e.with_blob(name))
}

fn create_tensor_vector(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        cx.output_blob(0)
            .set(BlobValue::Object(Arc::new(TensorVector::default())));
        Ok(true)
    }))
}

fn tensor_vector_size(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let n = vector_in(l.input(0), l.input_name(0))?.0.lock().len();
        let n = i32::try_from(n).map_err(|_| {
            Error::invalid_arg(format!(
                "the tensor vector holds {n} tensors, more than int32 holds"
            ))
            .with_blob(l.input_name(0))
        })?;
        l.set_output(0, Tensor::scalar(n));
        Ok(true)
    }))
}

fn concat_tensor_vector(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let out = {
            let name = l.input_name(0);
            let v = vector_in(l.input(0), name)?.0.lock();
            let Some(first) = v.first() else {
                return Err(
                    Error::invalid_arg("cannot concatenate an empty tensor vector").with_blob(name),
                );
            };
            if first.ndim() == 0 {
                return Err(Error::shape(
                    "the tensor vector's tensors must be at least 1-D, got a 0-dim tensor",
                )
                .with_blob(name));
            }
            let mut out = first.clone();
            for (k, t) in v.iter().enumerate().skip(1) {
                out.append_rows(t).map_err(|e| {
                    Error::new(e.kind, format!("tensor {k} of the vector: {}", e.message))
                        .with_blob(name)
                })?;
            }
            out
        };
        l.set_output(0, out);
        Ok(true)
    }))
}

fn num_to_collect(ctx: &OpDefCtx<'_>) -> Result<usize> {
    let n = ctx.args.i64("num_to_collect", -1)?;
    if n <= 0 || i32::try_from(n).is_err() {
        return Err(ctx.bad_arg(format!(
            "num_to_collect must be given, > 0 and fit int32, got {n}"
        )));
    }
    Ok(n as usize)
}

/// Caffe2's inference: the buffer as it is once full (num_to_collect rows
/// of the data's row shape and dtype, though a buffer not yet full holds
/// fewer), `next` unchanged, `num_visited` one int64.
fn last_n_infer(
    args: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    n_out: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let n = args.i64("num_to_collect", -1)?;
    if n <= 0 {
        return Err(Error::invalid_arg("num_to_collect must be > 0"));
    }
    let buffer = match ins.get(2).and_then(|s| s.as_ref()) {
        Some(d) if !d.dims.is_empty() => {
            let mut dims = d.dims.clone();
            dims[0] = n;
            Some(ShapeInfo::new(dims, d.dtype))
        }
        Some(_) => return Err(Error::shape("the data must be at least 1-D")),
        None => None,
    };
    let mut out = vec![buffer, ins.get(1).cloned().flatten()];
    if n_out > 2 {
        out.push(Some(ShapeInfo::new(vec![1], DataType::Int64)));
    }
    Ok(out)
}

fn collect_tensor(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_outputs();
    if ctx.num_inputs() != 2 * n {
        return Err(ctx.bad_arg(format!(
            "CollectTensor takes (vector_1..vector_n, tensor_1..tensor_n) -> vector_1..vector_n: {n} outputs need {} \
             inputs, got {}",
            2 * n,
            ctx.num_inputs()
        )));
    }
    let limit = num_to_collect(ctx)?;
    let mut rng = super::fill::make_rng(ctx);
    let mut visited: usize = 0;
    Ok(kernel(move |cx| {
        let l = cx.lock();
        // Check everything before changing anything.
        let mut vectors = Vec::with_capacity(n);
        for i in 0..n {
            let name = l.output_name(i);
            // The blob is write-locked, so only the same vector listed twice
            // (or put in two blobs) can hold its mutex already.
            let v = vector_in(l.input(i), name)?.0.try_lock().ok_or_else(|| {
                Error::invalid_arg("the same tensor vector is collected into twice").with_blob(name)
            })?;
            if visited >= limit && v.len() != limit {
                return Err(Error::invalid_arg(format!(
                    "the tensor vector holds {} tensors but this op has collected {limit} (num_to_collect) already: \
                     was it changed by another op?",
                    v.len()
                ))
                .with_blob(name));
            }
            let t = l.tensor(n + i)?;
            vectors.push((v, t));
        }
        let pos = if visited < limit {
            Some(visited)
        } else {
            // Uniform over [0, visited]: keeps each of the visited + 1
            // tensors seen with probability limit / (visited + 1).
            Some(rng.random_range(0..=visited)).filter(|&p| p < limit)
        };
        if let Some(p) = pos {
            for (v, t) in &mut vectors {
                if p >= v.len() {
                    v.push((*t).clone());
                } else {
                    v[p] = (*t).clone();
                }
            }
        }
        visited += 1;
        Ok(true)
    }))
}

// --------------------------------------------------- LastNWindowCollector --

/// What a LastNWindowCollector run found, checked before anything changes.
struct Window {
    /// Rows in the buffer (0 when it starts over).
    rows: usize,
    /// The ring position of the next row to write.
    next: usize,
    num_visited: Option<i64>,
}

fn last_n_window_collector(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let limit = num_to_collect(ctx)?;
    let has_mutex = ctx.num_inputs() > 3;
    Ok(kernel(move |cx| {
        // The mutex first, then the blobs (as AtomicAppend and AtomicIter).
        let mutex = if has_mutex {
            Some(
                cx.input_blob(3)
                    .read()
                    .object::<BlobMutex>("Mutex")
                    .map_err(|e| e.with_blob(&cx.io.input_names[3]))?,
            )
        } else {
            None
        };
        let _guard = mutex.as_ref().map(|m| m.0.lock());
        let mut l = cx.lock();
        let w = check_window(&mut l, limit, cx.num_outputs() > 2)?;
        collect_rows(&mut l, limit, w)?;
        Ok(true)
    }))
}

fn check_window(l: &mut Locked<'_>, limit: usize, has_visited: bool) -> Result<Window> {
    let data_name = l.input_name(2).to_string();
    let data = {
        let t = l.tensor(2)?;
        (t.shape().to_vec(), t.dtype())
    };
    if data.0.is_empty() {
        return Err(
            Error::shape("the data must be at least 1-D, got a 0-dim tensor").with_blob(&data_name),
        );
    }
    let buf_name = l.output_name(0).to_string();
    let rows = match l.output(0) {
        BlobValue::Empty => 0,
        BlobValue::Tensor(t) if t.numel() == 0 => 0,
        BlobValue::Tensor(t) => {
            if t.dtype() != data.1 {
                return Err(Error::type_error(format!(
                    "the buffer holds {} rows but the data is {}",
                    t.dtype(),
                    data.1
                ))
                .with_blob(&buf_name));
            }
            if t.ndim() != data.0.len() || t.shape()[1..] != data.0[1..] {
                return Err(Error::shape(format!(
                    "the buffer's rows have shape {:?} but the data's rows {:?}",
                    &t.shape()[1..],
                    &data.0[1.min(data.0.len())..]
                ))
                .with_blob(&buf_name));
            }
            t.shape()[0]
        }
        other => {
            return Err(Error::type_error(format!(
                "wrong kind of blob: it holds {} but a Tensor (or nothing) was expected",
                other.kind_name()
            ))
            .with_blob(&buf_name))
        }
    };
    let entries = data.0[0];
    let num_visited =
        if has_visited {
            let name = l.output_name(2).to_string();
            let t = l.output(2).tensor().map_err(|e| e.with_blob(&name))?;
            let v = t
                .array::<i64>()
                .ok()
                .filter(|a| a.len() == 1)
                .map(|a| a.iter().copied().next().unwrap_or(0))
                .ok_or_else(|| {
                    Error::type_error(format!(
                        "num_visited must be an int64 tensor of one element, got {} of shape {:?}",
                        t.dtype(),
                        t.shape()
                    ))
                    .with_blob(&name)
                })?;
            let v = if rows == 0 { 0 } else { v };
            if v < 0 {
                return Err(
                    Error::invalid_arg(format!("num_visited is negative ({v})")).with_blob(&name)
                );
            }
            Some(v.checked_add(entries as i64).ok_or_else(|| {
                Error::invalid_arg("num_visited overflowed int64").with_blob(&name)
            })?)
        } else {
            None
        };
    let mut next = 0;
    if entries > 0 && rows > 0 {
        let name = l.output_name(1).to_string();
        let t = l.output(1).tensor().map_err(|e| e.with_blob(&name))?;
        let v = match t.array::<i32>() {
            Ok(a) if a.ndim() == 0 => a.iter().copied().next().unwrap_or(0),
            _ => {
                return Err(Error::type_error(format!(
                    "the next cursor must be an int32 scalar (0-dim), got {} of shape {:?}",
                    t.dtype(),
                    t.shape()
                ))
                .with_blob(&name))
            }
        };
        // The run writes rows next.. (wrapping at num_to_collect): next must
        // point into the buffer, and past its end only when it is full.
        let copied = entries.min(limit);
        let grown = limit.min(rows + copied);
        let ok = usize::try_from(v)
            .ok()
            .filter(|&s| s < grown && (entries > limit || (s + copied).min(limit) <= grown));
        next = ok.ok_or_else(|| {
            Error::invalid_arg(format!(
                "the next cursor ({v}) does not fit the buffer of {rows} rows (num_to_collect {limit})"
            ))
            .with_blob(&name)
        })?;
    }
    Ok(Window {
        rows,
        next,
        num_visited,
    })
}

fn collect_rows(l: &mut Locked<'_>, limit: usize, w: Window) -> Result<()> {
    if let Some(v) = w.num_visited {
        // In place: the counter keeps its shape (checked: one int64).
        l.output(2).tensor_mut()?.array_mut::<i64>()?.fill(v);
    }
    let data = l.tensor(2)?.clone();
    let entries = data.shape()[0];
    if entries == 0 {
        if w.rows == 0 {
            // Takes the data's dtype and row shape.
            l.set_output(0, data);
        }
        return Ok(());
    }
    if w.rows == 0 {
        let mut shape = data.shape().to_vec();
        shape[0] = 0;
        l.set_output(0, Tensor::zeros(data.dtype(), &shape)?);
        l.set_output(1, Tensor::scalar(0i32));
    }
    let next = if entries > limit {
        // Only the last num_to_collect rows can stay.
        l.set_output(0, rows_of(&data, entries - limit, entries)?);
        0
    } else {
        let buf = l.output(0).tensor_mut()?;
        let grown = limit.min(w.rows + entries);
        if grown > buf.shape()[0] {
            let mut shape = data.shape().to_vec();
            shape[0] = grown - buf.shape()[0];
            buf.append_rows(&Tensor::zeros(data.dtype(), &shape)?)?;
        }
        let first = (w.next + entries).min(limit) - w.next;
        write_rows(buf, w.next, &data, 0, first)?;
        write_rows(buf, 0, &data, first, entries)?;
        (w.next + entries) % limit
    };
    l.set_output(1, Tensor::scalar(next as i32));
    Ok(())
}

/// Rows `lo..hi` of `t`, copied.
fn rows_of(t: &Tensor, lo: usize, hi: usize) -> Result<Tensor> {
    fn typed<T: Element>(t: &Tensor, lo: usize, hi: usize) -> Result<Tensor> {
        Ok(T::wrap(
            t.array::<T>()?
                .slice_axis(Axis(0), Slice::from(lo..hi))
                .to_owned(),
        ))
    }
    by_dtype!(t.dtype(), typed(t, lo, hi))
}

/// Copies rows `lo..hi` of `src` over the rows of `dst` from `at` on.
fn write_rows(dst: &mut Tensor, at: usize, src: &Tensor, lo: usize, hi: usize) -> Result<()> {
    fn typed<T: Element>(
        dst: &mut Tensor,
        at: usize,
        src: &Tensor,
        lo: usize,
        hi: usize,
    ) -> Result<()> {
        let rows = src.array::<T>()?.slice_axis(Axis(0), Slice::from(lo..hi));
        dst.array_mut::<T>()?
            .slice_axis_mut(Axis(0), Slice::from(at..at + (hi - lo)))
            .assign(&rows);
        Ok(())
    }
    if hi == lo {
        return Ok(());
    }
    by_dtype!(src.dtype(), typed(dst, at, src, lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::error::ErrorKind;
    use crate::ir::OperatorDef;
    use crate::test_util::{feed, get, int_arg, op, seeded};
    use crate::workspace::Workspace;

    fn run(ws: &Arc<Workspace>, def: &OperatorDef) -> Result<bool> {
        ws.run_operator_once(def, &CancelToken::new())
    }
    fn rows(r: usize, cols: usize, v: Vec<f32>) -> Tensor {
        Tensor::from_vec(&[r, cols], v).unwrap()
    }

    // ----------------------------------------------------- tensor vectors --

    #[test]
    fn collect_tensor_keeps_the_first_then_samples_aligned_vectors() {
        let ws = Workspace::new();
        for v in ["va", "vb"] {
            run(&ws, &op("CreateTensorVector", &[], &[v], vec![])).unwrap();
        }
        let limit = 100usize;
        let total = 5000usize;
        let collect = seeded(
            op(
                "CollectTensor",
                &["va", "vb", "a", "b"],
                &["va", "vb"],
                vec![int_arg("num_to_collect", limit as i64)],
            ),
            7,
        );
        feed(&ws, "a", Tensor::scalar(0i64));
        feed(&ws, "b", Tensor::scalar(0i64));
        let mut net =
            crate::net::Net::create(&crate::test_util::net("collect", vec![collect]), &ws).unwrap();
        for k in 1..=total {
            // a = [k, k], b = [-k]: the pair must stay together.
            feed(
                &ws,
                "a",
                Tensor::from_vec(&[1, 2], vec![k as i64, k as i64]).unwrap(),
            );
            feed(&ws, "b", Tensor::from_vec(&[1], vec![-(k as i64)]).unwrap());
            assert!(net.run(&ws, &CancelToken::new()).unwrap());
            if k == 3 {
                // The first num_to_collect runs append in order.
                run(&ws, &op("ConcatTensorVector", &["va"], &["ca"], vec![])).unwrap();
                assert_eq!(
                    get(&ws, "ca"),
                    Tensor::from_vec(&[3, 2], vec![1i64, 1, 2, 2, 3, 3]).unwrap()
                );
            }
        }
        run(&ws, &op("TensorVectorSize", &["va"], &["n"], vec![])).unwrap();
        assert_eq!(get(&ws, "n"), Tensor::scalar(limit as i32));
        run(&ws, &op("ConcatTensorVector", &["va"], &["ca"], vec![])).unwrap();
        run(&ws, &op("ConcatTensorVector", &["vb"], &["cb"], vec![])).unwrap();
        let ca = get(&ws, "ca");
        let cb = get(&ws, "cb");
        assert_eq!(ca.shape(), &[limit, 2]);
        assert_eq!(cb.shape(), &[limit]);
        let a = ca.array::<i64>().unwrap();
        let b = cb.array::<i64>().unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..limit {
            let k = a[[i, 0]];
            assert_eq!(a[[i, 1]], k);
            assert_eq!(b[[i]], -k, "slot {i}: the vectors are not aligned");
            assert!((1..=total as i64).contains(&k));
            assert!(seen.insert(k), "tensor {k} kept twice");
        }
        // Reservoir sampling keeps each tensor with the same probability:
        // every tenth of the stream holds about a tenth of the sample.
        let mut hist = [0usize; 10];
        for &k in seen.iter() {
            hist[((k as usize - 1) * 10) / total] += 1;
        }
        assert!(
            hist.iter().all(|&h| h as f64 > 0.4 * limit as f64 / 10.0),
            "{hist:?}"
        );
    }

    #[test]
    fn tensor_vector_errors_are_typed_and_name_the_blob() {
        let ws = Workspace::new();
        run(&ws, &op("CreateTensorVector", &[], &["v"], vec![])).unwrap();
        feed(&ws, "x", Tensor::scalar(1.0f32));
        // Not a vector.
        for def in [
            op("TensorVectorSize", &["x"], &["n"], vec![]),
            op("ConcatTensorVector", &["x"], &["c"], vec![]),
            op(
                "CollectTensor",
                &["x", "x2"],
                &["x"],
                vec![int_arg("num_to_collect", 2)],
            ),
        ] {
            feed(&ws, "x2", Tensor::scalar(1.0f32));
            let e = run(&ws, &def).unwrap_err();
            assert_eq!(
                (e.kind, e.context.blob.as_deref()),
                (ErrorKind::Type, Some("x")),
                "{e}"
            );
            assert!(e.message.contains("TensorVector"), "{e}");
        }
        // Empty vector, 0-dim tensors, mixed dtypes and shapes.
        let e = run(&ws, &op("ConcatTensorVector", &["v"], &["c"], vec![])).unwrap_err();
        assert!(e.message.contains("empty tensor vector"), "{e}");
        // One net, so the op's count of runs goes on (a new op starts over).
        let fill = |tensors: Vec<Tensor>| {
            run(&ws, &op("CreateTensorVector", &[], &["v"], vec![])).unwrap();
            feed(&ws, "t", tensors[0].clone());
            let def = op(
                "CollectTensor",
                &["v", "t"],
                &["v"],
                vec![int_arg("num_to_collect", 5)],
            );
            let mut net =
                crate::net::Net::create(&crate::test_util::net("c", vec![def]), &ws).unwrap();
            for t in tensors {
                feed(&ws, "t", t);
                net.run(&ws, &CancelToken::new()).unwrap();
            }
        };
        fill(vec![Tensor::scalar(1.0f32)]);
        let e = run(&ws, &op("ConcatTensorVector", &["v"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{e}");
        fill(vec![
            rows(1, 2, vec![1.0, 2.0]),
            Tensor::from_vec(&[1, 2], vec![1i32, 2]).unwrap(),
        ]);
        let e = run(&ws, &op("ConcatTensorVector", &["v"], &["c"], vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("v")),
            "{e}"
        );
        assert!(e.message.contains("tensor 1 of the vector"), "{e}");
        fill(vec![
            rows(1, 2, vec![1.0, 2.0]),
            rows(1, 3, vec![1.0, 2.0, 3.0]),
        ]);
        let e = run(&ws, &op("ConcatTensorVector", &["v"], &["c"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{e}");
        // Construction errors.
        feed(&ws, "t", Tensor::scalar(1.0f32));
        run(&ws, &op("CreateTensorVector", &[], &["w"], vec![])).unwrap();
        for (def, msg) in [
            (
                op("CollectTensor", &["v", "t"], &["v"], vec![]),
                "num_to_collect must be given",
            ),
            (
                op(
                    "CollectTensor",
                    &["v", "t"],
                    &["v"],
                    vec![int_arg("num_to_collect", 0)],
                ),
                "> 0",
            ),
            (
                op(
                    "CollectTensor",
                    &["v", "w", "t"],
                    &["v", "w"],
                    vec![int_arg("num_to_collect", 1)],
                ),
                "takes",
            ),
            (
                op(
                    "CollectTensor",
                    &["v", "t"],
                    &["w"],
                    vec![int_arg("num_to_collect", 1)],
                ),
                "in-place",
            ),
            (
                op(
                    "CollectTensor",
                    &["v", "v", "t", "t"],
                    &["v", "v"],
                    vec![int_arg("num_to_collect", 1)],
                ),
                "in-place",
            ),
            (
                op(
                    "LastNWindowCollector",
                    &["b", "n", "t"],
                    &["b", "n"],
                    vec![],
                ),
                "num_to_collect must be given",
            ),
        ] {
            ws.create_blob("b");
            ws.create_blob("n");
            let e = crate::operator::create_operator(&def, &ws)
                .err()
                .expect("should fail");
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
            assert!(e.message.contains(msg), "{msg}: {e}");
        }
        // A vector cannot be saved (Caffe2 had no serializer for it either).
        let e = crate::storage::serialize_blob("v", &ws.fetch("v").unwrap()).unwrap_err();
        assert!(e.message.contains("cannot be saved"), "{e}");
    }

    #[test]
    fn collect_tensor_notices_a_vector_changed_behind_its_back() {
        let ws = Workspace::new();
        run(&ws, &op("CreateTensorVector", &[], &["v"], vec![])).unwrap();
        feed(&ws, "t", Tensor::scalar(1i32));
        let def = op(
            "CollectTensor",
            &["v", "t"],
            &["v"],
            vec![int_arg("num_to_collect", 2)],
        );
        let mut net = crate::net::Net::create(&crate::test_util::net("c", vec![def]), &ws).unwrap();
        net.run(&ws, &CancelToken::new()).unwrap();
        net.run(&ws, &CancelToken::new()).unwrap();
        run(&ws, &op("CreateTensorVector", &[], &["v"], vec![])).unwrap();
        let e = net.run(&ws, &CancelToken::new()).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::InvalidArgument, Some("v")),
            "{e}"
        );
    }

    // ------------------------------------------------ LastNWindowCollector --

    /// Caffe2's layout, modelled row by row: a batch longer than the window
    /// leaves its last N rows at 0..N; otherwise each row goes to the next
    /// slot, the buffer growing until it holds N rows, then wrapping.
    struct Model {
        n: usize,
        buf: Vec<Vec<f32>>,
        next: usize,
        visited: i64,
    }

    impl Model {
        fn push(&mut self, batch: &[Vec<f32>]) {
            self.visited += batch.len() as i64;
            if batch.len() > self.n {
                self.buf = batch[batch.len() - self.n..].to_vec();
                self.next = 0;
                return;
            }
            for r in batch {
                if self.next == self.buf.len() {
                    self.buf.push(r.clone());
                } else {
                    self.buf[self.next] = r.clone();
                }
                self.next = (self.next + 1) % self.n;
            }
        }
    }

    fn last_n(ws: &Arc<Workspace>, n: i64, mutex: bool, visited: bool) -> crate::net::Net {
        let mut ins = vec!["buf", "next", "data"];
        let mut outs = vec!["buf", "next"];
        if mutex || visited {
            ins.push("mutex");
        }
        if visited {
            ins.push("visited");
            outs.push("visited");
        }
        let def = op(
            "LastNWindowCollector",
            &ins,
            &outs,
            vec![int_arg("num_to_collect", n)],
        );
        for b in ["buf", "next", "data", "mutex", "visited"] {
            ws.create_blob(b);
        }
        crate::net::Net::create(&crate::test_util::net("last_n", vec![def]), ws).unwrap()
    }

    fn fresh(ws: &Arc<Workspace>) {
        ws.feed("buf", BlobValue::Empty);
        feed(ws, "next", Tensor::scalar(0i32));
        feed(ws, "visited", Tensor::from_vec(&[1], vec![0i64]).unwrap());
        run(ws, &op("CreateMutex", &[], &["mutex"], vec![])).unwrap();
    }

    #[test]
    fn last_n_window_follows_caffe2s_example() {
        // Caffe2's documented case: N = 7, a 3 x 2 input collected three times.
        let ws = Workspace::new();
        fresh(&ws);
        let mut net = last_n(&ws, 7, false, false);
        feed(&ws, "data", rows(3, 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        net.run(&ws, &CancelToken::new()).unwrap();
        assert_eq!(
            get(&ws, "buf"),
            rows(3, 2, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        );
        assert_eq!(get(&ws, "next"), Tensor::scalar(3i32));
        net.run(&ws, &CancelToken::new()).unwrap();
        net.run(&ws, &CancelToken::new()).unwrap();
        // Rows 1, 2, 2, 0, 1, 2, 0 of the input.
        let r = [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]];
        let want: Vec<f32> = [1, 2, 2, 0, 1, 2, 0].iter().flat_map(|&i| r[i]).collect();
        assert_eq!(get(&ws, "buf"), rows(7, 2, want));
        assert_eq!(get(&ws, "next"), Tensor::scalar(2i32));
    }

    #[test]
    fn last_n_window_matches_a_row_by_row_model() {
        let ws = Workspace::new();
        fresh(&ws);
        let n = 5;
        let mut net = last_n(&ws, n as i64, true, true);
        let mut model = Model {
            n,
            buf: vec![],
            next: 0,
            visited: 0,
        };
        let mut v = 0.0f32;
        for &size in &[0usize, 2, 1, 0, 3, 4, 7, 1, 5, 2, 6, 0, 3] {
            let batch: Vec<Vec<f32>> = (0..size)
                .map(|_| {
                    v += 1.0;
                    vec![v, -v, v * 10.0]
                })
                .collect();
            feed(&ws, "data", rows(size, 3, batch.concat()));
            net.run(&ws, &CancelToken::new()).unwrap();
            model.push(&batch);
            assert_eq!(
                get(&ws, "buf"),
                rows(model.buf.len(), 3, model.buf.concat()),
                "after a batch of {size}"
            );
            assert_eq!(
                get(&ws, "visited"),
                Tensor::from_vec(&[1], vec![model.visited]).unwrap()
            );
            if !model.buf.is_empty() {
                assert_eq!(get(&ws, "next"), Tensor::scalar(model.next as i32));
            }
        }
    }

    #[test]
    fn last_n_window_starts_from_an_empty_batch_and_any_dtype() {
        let ws = Workspace::new();
        fresh(&ws);
        let mut net = last_n(&ws, 2, false, false);
        let words = |v: &[&str]| {
            Tensor::from_vec(
                &[v.len()],
                v.iter().map(|w| w.as_bytes().to_vec()).collect(),
            )
            .unwrap()
        };
        feed(&ws, "data", words(&[]));
        net.run(&ws, &CancelToken::new()).unwrap();
        assert_eq!(get(&ws, "buf"), words(&[]));
        for w in ["a", "b", "c"] {
            feed(&ws, "data", words(&[w]));
            net.run(&ws, &CancelToken::new()).unwrap();
        }
        assert_eq!(get(&ws, "buf"), words(&["c", "b"]));
    }

    #[test]
    fn last_n_window_rejects_bad_state_and_changes_nothing() {
        let ws = Workspace::new();
        let mut net = last_n(&ws_ready(&ws), 4, true, true);
        let cases: Vec<(&str, BlobValue, &str, ErrorKind)> = vec![
            (
                "buf",
                BlobValue::Tensor(Tensor::from_vec(&[2, 2], vec![1i32, 2, 3, 4]).unwrap()),
                "buf",
                ErrorKind::Type,
            ),
            (
                "buf",
                BlobValue::Tensor(rows(2, 3, vec![0.0; 6])),
                "buf",
                ErrorKind::Shape,
            ),
            (
                "buf",
                BlobValue::Object(Arc::new(TensorVector::default())),
                "buf",
                ErrorKind::Type,
            ),
            (
                "next",
                BlobValue::Tensor(Tensor::scalar(4i32)),
                "next",
                ErrorKind::InvalidArgument,
            ),
            (
                "next",
                BlobValue::Tensor(Tensor::scalar(-1i32)),
                "next",
                ErrorKind::InvalidArgument,
            ),
            (
                "next",
                BlobValue::Tensor(Tensor::from_vec(&[1], vec![0i32]).unwrap()),
                "next",
                ErrorKind::Type,
            ),
            (
                "next",
                BlobValue::Tensor(Tensor::scalar(0i64)),
                "next",
                ErrorKind::Type,
            ),
            (
                "visited",
                BlobValue::Tensor(Tensor::scalar(0i32)),
                "visited",
                ErrorKind::Type,
            ),
            (
                "visited",
                BlobValue::Tensor(Tensor::from_vec(&[1], vec![-2i64]).unwrap()),
                "visited",
                ErrorKind::InvalidArgument,
            ),
            (
                "data",
                BlobValue::Tensor(Tensor::scalar(1.0f32)),
                "data",
                ErrorKind::Shape,
            ),
            (
                "mutex",
                BlobValue::Tensor(Tensor::scalar(1.0f32)),
                "mutex",
                ErrorKind::Type,
            ),
        ];
        for (blob, value, named, kind) in cases {
            ws_ready(&ws);
            // Two rows collected, next = 2.
            net.run(&ws, &CancelToken::new()).unwrap();
            let before: Vec<BlobValue> = ["buf", "next", "visited"]
                .iter()
                .map(|b| ws.fetch(b).unwrap())
                .collect();
            ws.feed(blob, value);
            let e = net.run(&ws, &CancelToken::new()).expect_err(blob);
            assert_eq!(
                (e.kind, e.context.blob.as_deref()),
                (kind, Some(named)),
                "{blob}: {e}"
            );
            for (b, old) in ["buf", "next", "visited"].iter().zip(before) {
                if *b != blob {
                    assert_eq!(
                        format!("{:?}", ws.fetch(b).unwrap()),
                        format!("{old:?}"),
                        "{b} changed by a failing run ({blob})"
                    );
                }
            }
        }
    }

    #[test]
    fn last_n_window_refuses_a_next_cursor_that_would_write_past_the_buffer() {
        // One row held, N = 4, two rows coming: the buffer grows to 3 rows,
        // so starting at slot 2 would write slot 3 (Caffe2 wrote past the end).
        let ws = Workspace::new();
        fresh(&ws);
        let mut net = last_n(&ws, 4, false, true);
        feed(&ws, "data", rows(1, 1, vec![1.0]));
        net.run(&ws, &CancelToken::new()).unwrap();
        feed(&ws, "next", Tensor::scalar(2i32));
        feed(&ws, "data", rows(2, 1, vec![2.0, 3.0]));
        let e = net.run(&ws, &CancelToken::new()).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::InvalidArgument, Some("next")),
            "{e}"
        );
        assert_eq!(get(&ws, "buf"), rows(1, 1, vec![1.0]));
        assert_eq!(
            get(&ws, "visited"),
            Tensor::from_vec(&[1], vec![1i64]).unwrap()
        );
        // num_visited keeps its shape.
        feed(
            &ws,
            "visited",
            Tensor::from_vec(&[1, 1], vec![5i64]).unwrap(),
        );
        feed(&ws, "next", Tensor::scalar(1i32));
        net.run(&ws, &CancelToken::new()).unwrap();
        assert_eq!(
            get(&ws, "visited"),
            Tensor::from_vec(&[1, 1], vec![7i64]).unwrap()
        );
        assert_eq!(get(&ws, "buf"), rows(3, 1, vec![1.0, 2.0, 3.0]));
    }

    fn ws_ready(ws: &Arc<Workspace>) -> Arc<Workspace> {
        fresh(ws);
        feed(ws, "data", rows(2, 2, vec![1.0, 2.0, 3.0, 4.0]));
        ws.clone()
    }

    #[test]
    fn last_n_window_with_a_shared_mutex_loses_no_row() {
        let ws = Workspace::new();
        fresh(&ws);
        let n = 1000;
        let threads = 4;
        let per = 50;
        std::thread::scope(|s| {
            for t in 0..threads {
                let ws = ws.clone();
                s.spawn(move || {
                    let data = format!("data{t}");
                    ws.create_blob(&data);
                    let def = op(
                        "LastNWindowCollector",
                        &["buf", "next", &data, "mutex", "visited"],
                        &["buf", "next", "visited"],
                        vec![int_arg("num_to_collect", n)],
                    );
                    let mut net =
                        crate::net::Net::create(&crate::test_util::net("c", vec![def]), &ws)
                            .unwrap();
                    for k in 0..per {
                        let v = (t * per + k) as f32;
                        feed(&ws, &data, rows(2, 1, vec![v, v + 0.5]));
                        net.run(&ws, &CancelToken::new()).unwrap();
                    }
                });
            }
        });
        let buf = get(&ws, "buf");
        let mut got: Vec<f32> = buf.array::<f32>().unwrap().iter().copied().collect();
        got.sort_by(f32::total_cmp);
        let mut want: Vec<f32> = (0..threads * per)
            .flat_map(|v| [v as f32, v as f32 + 0.5])
            .collect();
        want.sort_by(f32::total_cmp);
        assert_eq!(got, want);
        assert_eq!(
            get(&ws, "visited"),
            Tensor::from_vec(&[1], vec![400i64]).unwrap()
        );
    }
}
