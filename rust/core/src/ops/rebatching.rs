//! Rebatching queues: CreateRebatchingQueue, EnqueueRebatchingQueue,
//! DequeueRebatchingQueue and CloseRebatchingQueue (Caffe2's
//! `caffe2/queue/rebatching_queue*`).
//!
//! A [`RebatchingQueue`] holds up to `capacity` *elements*; an element is
//! one tensor per component (`num_blobs` of them). An enqueue adds one
//! element (its inputs as they are) or, with `enqueue_batch`, one element
//! per row of its inputs (which share their first dim). A dequeue takes
//! `num_elements` elements and stacks each component along a new first dim,
//! so producers and consumers may use different batch sizes. Caffe2's rules:
//! - an enqueue waits while the queue is full and open; it fails (the op
//!   returns false) once the queue is closed, even after some of its rows
//!   went in;
//! - a dequeue waits while the queue is empty and open; after close it
//!   drains what is left (a last, shorter batch), and fails only when the
//!   queue is closed and empty;
//! - closing wakes every waiter.
//!
//! Differences, on purpose: every wait is cancellable (slices of
//! [`POLL`]); the elements of one dequeue must agree on dtype and shape per
//! component, else a typed error naming the queue (Caffe2 asserted); the
//! component count of an enqueue or dequeue is checked against the queue
//! with a typed error.

use super::kit::by_dtype;
use super::kit::kernel;
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::cancel::{CancelToken, POLL};
use crate::error::{Error, Result};
use crate::operator::{OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::tensor::{concatenate, Element, Tensor};
use ndarray::Axis;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::Arc;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateRebatchingQueue", create)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("capacity", "int", "1", "the most elements the queue holds, >= 1"),
                arg!("num_blobs", "int", "1", "tensors per element, >= 1"),
            ])
            .doc("Writes a new, open, empty rebatching queue into the output."),
        OpSchema::new("EnqueueRebatchingQueue", enqueue)
            .inputs(2, MANY)
            .outputs(0, 0)
            .args(&[arg!(
                "enqueue_batch",
                "bool",
                "false",
                "split the inputs along their first dim (which they share) into one element per row"
            )])
            .doc(
                "Inputs (queue, t1..tn), n = num_blobs: adds one element (the tensors, copied) or, with enqueue_batch, \
                 one per row. Waits while the queue is full and open; fails (returns false) once it is closed.",
            ),
        OpSchema::new("DequeueRebatchingQueue", dequeue)
            .inputs(1, 1)
            .outputs(1, MANY)
            .args(&[arg!(
                "num_elements",
                "int",
                "1",
                "elements to take; each output stacks its component of them along a new first dim"
            )])
            .doc(
                "Outputs one tensor per component, of shape [k, ...] for the k elements taken (num_elements, fewer only \
                 when the queue was closed meanwhile). Waits while the queue is empty and open; fails (returns false) \
                 when it is closed and empty.",
            ),
        OpSchema::new("CloseRebatchingQueue", close)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Closes the queue and wakes every waiting enqueue and dequeue."),
    ]
}

/// One element: a tensor per component.
type Item = Vec<Tensor>;

struct State {
    elements: VecDeque<Item>,
    closed: bool,
}

/// A bounded queue of elements (Caffe2's `RebatchingQueue`), shared through
/// an `Arc` in a blob.
pub struct RebatchingQueue {
    capacity: usize,
    num_blobs: usize,
    state: Mutex<State>,
    not_empty: Condvar,
    not_full: Condvar,
}

impl std::fmt::Debug for RebatchingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RebatchingQueue(capacity {}, {} blobs per element)",
            self.capacity, self.num_blobs
        )
    }
}

impl BlobObject for RebatchingQueue {
    fn kind_name(&self) -> &'static str {
        "RebatchingQueue"
    }
}

/// Waits on `cv` one slice; `Err(Cancelled)` once the token is cancelled
/// (the interrupt check runs without the mutex).
fn wait_slice(cv: &Condvar, st: &mut MutexGuard<'_, State>, cancel: &CancelToken) -> Result<()> {
    if cancel.is_cancelled() {
        return Err(Error::cancelled());
    }
    if cv.wait_for(st, POLL).timed_out() && MutexGuard::unlocked(st, || cancel.poll_now()) {
        return Err(Error::cancelled());
    }
    Ok(())
}

impl RebatchingQueue {
    pub fn new(capacity: usize, num_blobs: usize) -> RebatchingQueue {
        RebatchingQueue {
            capacity,
            num_blobs,
            state: Mutex::new(State {
                elements: VecDeque::new(),
                closed: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    pub fn close(&self) {
        self.state.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    /// Adds the elements in order, waiting for room. `Ok(false)` when the
    /// queue is (or becomes) closed before all went in.
    pub fn enqueue(&self, elements: Vec<Item>, cancel: &CancelToken) -> Result<bool> {
        let mut pending = elements.into_iter().peekable();
        while pending.peek().is_some() {
            let mut st = self.state.lock();
            while st.elements.len() >= self.capacity && !st.closed {
                wait_slice(&self.not_full, &mut st, cancel)?;
            }
            if st.closed {
                return Ok(false);
            }
            while st.elements.len() < self.capacity {
                match pending.next() {
                    Some(e) => st.elements.push_back(e),
                    None => break,
                }
            }
            drop(st);
            self.not_empty.notify_all();
        }
        Ok(true)
    }

    /// Takes up to `n` elements, waiting while the queue is empty and open;
    /// fewer only when it was closed meanwhile; none when closed and empty.
    pub fn dequeue(&self, n: usize, cancel: &CancelToken) -> Result<Vec<Item>> {
        let mut out = Vec::with_capacity(n.min(1 << 16));
        while out.len() < n {
            let mut st = self.state.lock();
            while st.elements.is_empty() && !st.closed {
                wait_slice(&self.not_empty, &mut st, cancel)?;
            }
            if st.elements.is_empty() {
                break; // closed and drained
            }
            while out.len() < n {
                match st.elements.pop_front() {
                    Some(e) => out.push(e),
                    None => break,
                }
            }
            drop(st);
            self.not_full.notify_all();
        }
        Ok(out)
    }
}

fn queue_of(cx: &OpCx<'_>) -> Result<Arc<RebatchingQueue>> {
    cx.input_blob(0)
        .read()
        .object::<RebatchingQueue>("RebatchingQueue")
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
}

fn count_arg(ctx: &OpDefCtx<'_>, name: &str) -> Result<usize> {
    let v = ctx.args.i64(name, 1)?;
    usize::try_from(v)
        .ok()
        .filter(|&v| v >= 1)
        .ok_or_else(|| ctx.bad_arg(format!("{name} must be >= 1, got {v}")))
}

fn create(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let capacity = count_arg(ctx, "capacity")?;
    let num_blobs = count_arg(ctx, "num_blobs")?;
    Ok(kernel(move |cx| {
        let q: Arc<dyn BlobObject> = Arc::new(RebatchingQueue::new(capacity, num_blobs));
        *cx.output_blob(0).write() = BlobValue::Object(q);
        Ok(true)
    }))
}

/// Row `i` of `t` (its first dim dropped), copied.
fn row(t: &Tensor, i: usize) -> Result<Tensor> {
    fn typed<T: Element>(t: &Tensor, i: usize) -> Result<Tensor> {
        let a = t.array::<T>()?;
        let r = a.index_axis(Axis(0), i);
        Ok(T::wrap(crate::tensor::copy_array(r)?))
    }
    by_dtype!(t.dtype(), typed(t, i))
}

fn enqueue(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = ctx.args.bool("enqueue_batch", false)?;
    Ok(kernel(move |cx| {
        let q = queue_of(cx)?;
        let n = cx.io.inputs.len() - 1;
        if n != q.num_blobs {
            return Err(Error::invalid_arg(format!(
                "the queue holds elements of {} tensors, but {n} were given",
                q.num_blobs
            ))
            .with_blob(&cx.io.input_names[0]));
        }
        // Copies of the inputs, taken under their read locks, released
        // before waiting for room.
        let mut inputs = Vec::with_capacity(n);
        for i in 1..=n {
            let v = cx.input_blob(i).read();
            let name = &cx.io.input_names[i];
            inputs.push(
                v.tensor()
                    .and_then(Tensor::try_clone)
                    .map_err(|e| e.with_blob(name))?,
            );
        }
        let elements = if batch {
            let rows = |i: usize| inputs[i].shape().first().copied();
            let Some(first) = rows(0) else {
                return Err(Error::shape(
                    "enqueue_batch needs inputs of at least one dim (the batch)",
                )
                .with_blob(&cx.io.input_names[1]));
            };
            for i in 1..n {
                if rows(i) != Some(first) {
                    return Err(Error::shape(format!(
                        "enqueue_batch needs inputs with the same first dim: {:?} and {:?}",
                        inputs[0].shape(),
                        inputs[i].shape()
                    ))
                    .with_blob(&cx.io.input_names[i + 1]));
                }
            }
            (0..first)
                .map(|r| inputs.iter().map(|t| row(t, r)).collect::<Result<Vec<_>>>())
                .collect::<Result<Vec<_>>>()?
        } else {
            vec![inputs]
        };
        q.enqueue(elements, cx.cancel)
    }))
}

/// Component `k` of `elements`, stacked along a new first dim.
fn stack(elements: &[Item], k: usize) -> Result<Tensor> {
    fn typed<T: Element>(elements: &[Item], k: usize) -> Result<Tensor> {
        let views = elements
            .iter()
            .map(|e| e[k].array::<T>().map(|a| a.view().insert_axis(Axis(0))))
            .collect::<Result<Vec<_>>>()?;
        Ok(T::wrap(concatenate(0, &views)?))
    }
    let first = &elements[0][k];
    for e in &elements[1..] {
        if e[k].dtype() != first.dtype() || e[k].shape() != first.shape() {
            return Err(Error::shape(format!(
                "the elements dequeued together differ in component {k}: {} {:?} and {} {:?}",
                first.dtype(),
                first.shape(),
                e[k].dtype(),
                e[k].shape()
            )));
        }
    }
    by_dtype!(first.dtype(), typed(elements, k))
}

struct DequeueOp {
    num_elements: usize,
}

fn dequeue(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(Box::new(DequeueOp {
        num_elements: count_arg(ctx, "num_elements")?,
    }))
}

impl Operator for DequeueOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let q = queue_of(cx)?;
        let n = cx.io.outputs.len();
        let queue_name = &cx.io.input_names[0];
        if n != q.num_blobs {
            return Err(Error::invalid_arg(format!(
                "the queue holds elements of {} tensors, but the op has {n} outputs",
                q.num_blobs
            ))
            .with_blob(queue_name));
        }
        let elements = q.dequeue(self.num_elements, cx.cancel)?;
        if elements.is_empty() {
            return Ok(false);
        }
        let outs = (0..n)
            .map(|k| stack(&elements, k).map_err(|e| e.with_blob(queue_name)))
            .collect::<Result<Vec<_>>>()?;
        let mut l = cx.lock();
        for (k, t) in outs.into_iter().enumerate() {
            l.set_output(k, t);
        }
        Ok(true)
    }
}

fn close(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        queue_of(cx)?.close();
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(v: i32) -> Item {
        vec![Tensor::from_vec(&[2], vec![v, -v]).unwrap()]
    }

    #[test]
    fn rebatches_drains_after_close_then_fails() {
        let q = RebatchingQueue::new(8, 1);
        let tok = CancelToken::new();
        assert!(q.enqueue((0..5).map(item).collect(), &tok).unwrap());
        let two = q.dequeue(2, &tok).unwrap();
        let stacked = stack(&two, 0).unwrap();
        assert_eq!(
            stacked,
            Tensor::from_vec(&[2, 2], vec![0, 0, 1, -1]).unwrap()
        );
        q.close();
        assert!(!q.enqueue(vec![item(9)], &tok).unwrap());
        let rest = q.dequeue(10, &tok).unwrap();
        assert_eq!(rest.len(), 3, "a closed queue drains in a shorter batch");
        assert!(q.dequeue(1, &tok).unwrap().is_empty());
    }

    #[test]
    fn a_full_queue_blocks_until_a_consumer_takes_and_cancel_unblocks() {
        let q = Arc::new(RebatchingQueue::new(2, 1));
        let tok = CancelToken::new();
        let producer = {
            let (q, tok) = (q.clone(), tok.clone());
            std::thread::spawn(move || q.enqueue((0..6).map(item).collect(), &tok))
        };
        let mut got = Vec::new();
        while got.len() < 6 {
            got.extend(q.dequeue(3, &tok).unwrap());
        }
        assert!(producer.join().unwrap().unwrap());
        let firsts: Vec<i32> = got
            .iter()
            .map(|e| e[0].array::<i32>().unwrap()[[0]])
            .collect();
        assert_eq!(firsts, vec![0, 1, 2, 3, 4, 5]);
        let waiting = {
            let (q, tok) = (q.clone(), tok.clone());
            std::thread::spawn(move || q.dequeue(1, &tok))
        };
        tok.cancel();
        assert!(waiting.join().unwrap().unwrap_err().is_cancelled());
    }

    #[test]
    fn stacking_elements_of_different_shapes_is_an_error() {
        let a = vec![Tensor::from_vec(&[1], vec![1.0f32]).unwrap()];
        let b = vec![Tensor::from_vec(&[2], vec![1.0f32, 2.0]).unwrap()];
        assert!(stack(&[a, b], 0).is_err());
    }
}
