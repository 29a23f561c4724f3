//! Blob queues: CreateBlobsQueue, EnqueueBlobs, DequeueBlobs, CloseBlobsQueue,
//! SafeEnqueueBlobs and SafeDequeueBlobs.
//!
//! A [`BlobsQueue`] is a bounded FIFO of `capacity` records, each record being
//! `num_blobs` blob values. The rules follow Caffe2's `BlobsQueue`:
//! - a write waits while the queue is full and open; it still succeeds after
//!   close if a slot is free, and fails (softly) only when closed *and* full;
//! - a read waits while the queue is empty and open (or until its timeout);
//!   records already queued are delivered after close (drain), and a read
//!   fails (softly) only when closed *and* empty, or on timeout;
//! - closing is idempotent and wakes every waiter.
//!
//! Differences from Caffe2, on purpose:
//! - **Every wait is cancellable.** Waiters sleep on a condition variable in
//!   slices of at most [`POLL`] and return `Err(Cancelled)` once their token is
//!   cancelled, so a failure elsewhere in the plan (or Ctrl-C) unblocks them.
//!   A cancelled wait does not close the queue (Caffe2's `Cancel()` of the
//!   Safe* ops did).
//! - **Records are moved, not kept in slot blobs.** Caffe2 created blobs
//!   `<queue>_<slot>_<col>` in the workspace and *swapped* contents with them.
//!   Here a record is held inside the queue object. The observable effect of
//!   the swap is kept: after an enqueue the enqueued blobs are left **empty**
//!   (Caffe2 left them empty or holding stale slot data), and a dequeue
//!   replaces the whole content of its outputs. No `<queue>_<slot>_<col>` blobs
//!   appear in the workspace, and re-running CreateBlobsQueue makes a queue
//!   with fresh storage (in Caffe2 the old and new queue aliased the same slot
//!   blobs).
//!
//! Locking: a queue op never holds blob locks while it waits. It takes the
//! queue handle out of its blob with a short read, then waits on the queue's
//! mutex and condition variables (after a brief bounded spin, which lets a
//! producer and a consumer of similar speed hand records over without a
//! sleep and wake-up each). Once a slot is free, an enqueue write-locks its
//! data blobs (in blob id order) and moves their values into the queue while
//! still holding the queue mutex: queue mutex, then blob locks, and nothing
//! takes them in the other order. A dequeue releases the queue mutex before
//! it locks its outputs and publishes the record (and status) in one go.

use super::kit::kernel;
use crate::arg;
use crate::blob::{Blob, BlobObject, BlobValue};
use crate::cancel::{CancelToken, POLL};
use crate::error::{Error, Result};
use crate::operator::{InPlace, OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::tensor::Tensor;
use parking_lot::{Condvar, Mutex, MutexGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateBlobsQueue", create_blobs_queue)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("capacity", "int", "1", "the most records the queue holds, >= 1"),
                arg!("num_blobs", "int", "1", "blobs per record, >= 1"),
                arg!(
                    "enforce_unique_name",
                    "bool",
                    "false",
                    "fail if a blob '<queue>_<slot>_<col>' exists (Caffe2's slot blob names) or the output already holds a queue"
                ),
                arg!("field_names", "strings", "[]", "one name per blob of a record (empty or num_blobs names)"),
            ])
            .doc("Writes a new, open, empty blob queue into the output (replacing its content). The queue's name is the output's name."),
        OpSchema::new("EnqueueBlobs", enqueue_blobs)
            .inputs(2, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Enforce(shifted_in_place))
            .doc(
                "Inputs (queue, b1..bn), outputs b1..bn (in place), n = num_blobs. Waits while the queue is full and open; \
                 moves the blobs' values into the queue, leaving the blobs empty. Fails softly (returns false) when the \
                 queue is closed and full; a write after close succeeds while a slot is free.",
            ),
        OpSchema::new("DequeueBlobs", dequeue_blobs)
            .inputs(1, 1)
            .outputs(1, MANY)
            .args(&[arg!("timeout_secs", "float", "0", "give up after this many seconds; <= 0 waits for ever")])
            .doc(
                "Input queue, outputs b1..bn (n = num_blobs). Waits while the queue is empty and open, then moves the \
                 oldest record into the outputs (replacing their content). Records queued before close are still \
                 delivered. Fails softly (returns false) when the queue is closed and empty, or on timeout.",
            ),
        OpSchema::new("CloseBlobsQueue", close_blobs_queue)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Closes the queue and wakes every waiter. Idempotent."),
        OpSchema::new("SafeEnqueueBlobs", safe_enqueue_blobs)
            .inputs(2, MANY)
            .outputs(2, MANY)
            .inplace(InPlace::Enforce(shifted_in_place))
            .doc(
                "Inputs (queue, b1..bn), outputs (b1..bn in place, status). EnqueueBlobs that never fails softly: \
                 status (bool scalar) is true when the queue was closed and full (the blobs are then left untouched).",
            ),
        OpSchema::new("SafeDequeueBlobs", safe_dequeue_blobs)
            .inputs(1, 1)
            .outputs(2, MANY)
            .args(&[arg!(
                "num_records",
                "int",
                "1",
                "records to read, >= 1; with more than one, each column's tensors (>= 1-D, same inner dims) are appended along dim 0"
            )])
            .doc(
                "Input queue, outputs (b1..bn, status). DequeueBlobs that never fails softly: status (bool scalar) is \
                 true when nothing could be read (closed and empty), and the outputs are then left untouched. With \
                 num_records > 1, reading stops early at close; status is false if at least one record was read.",
            ),
    ]
}

/// Output `o` is input `o + 1` (the queue is input 0).
fn shifted_in_place(i: usize, o: usize) -> bool {
    i == o + 1
}

// ------------------------------------------------------------------ queue --

/// How a read ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// A record was moved into the output slice.
    Read,
    /// The queue is closed and empty.
    Closed,
    /// The timeout passed with the queue still open and empty.
    TimedOut,
}

struct State {
    /// Records back to back: `num_blobs` values each, oldest first.
    values: VecDeque<BlobValue>,
    closing: bool,
}

/// A bounded queue of records of `num_blobs` blob values (Caffe2's
/// `BlobsQueue`). Shared through an `Arc` held in a blob.
pub struct BlobsQueue {
    name: String,
    capacity: usize,
    num_blobs: usize,
    field_names: Vec<String>,
    /// The records, behind the one mutex every operation takes. It sits on
    /// its own cache line, away from the fields read without it.
    state: CacheLine<Mutex<State>>,
    signals: CacheLine<Signals>,
}

struct Signals {
    not_empty: Condvar,
    not_full: Condvar,
    /// Mirrors of `state.values.len()` and `state.closing`, written under the
    /// mutex, read without it by waiters spinning before they park.
    filled: AtomicUsize,
    closed: AtomicBool,
}

/// Keeps a value on cache lines of its own (128 bytes: a pair of lines, as
/// x86 prefetches in pairs), so threads writing it do not slow readers of
/// neighbouring fields.
#[repr(align(128))]
struct CacheLine<T>(T);

impl<T> std::ops::Deref for CacheLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl fmt::Debug for BlobsQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BlobsQueue({:?}, capacity {}, {} blobs per record)",
            self.name, self.capacity, self.num_blobs
        )
    }
}

impl BlobObject for BlobsQueue {
    fn kind_name(&self) -> &'static str {
        "BlobsQueue"
    }
}

/// Records preallocated up front; a larger queue grows on demand (amortised,
/// so a warm queue allocates nothing per record).
const PREALLOCATED_VALUES: usize = 1024;

/// A waiter first spins briefly before it parks on the condition variable:
/// a producer and a consumer running at about the same speed on two cores
/// then hand records over without a futex sleep and wake-up per record. The
/// spin is short (about 130 pause instructions, a few microseconds) and never
/// yields: on an oversubscribed machine, yielding gave whole timeslices away
/// and made hand-overs far slower than parking. With one CPU to run on, it
/// is skipped: the other side cannot run while this one spins.
fn spin_then_give_up(ready: impl Fn() -> bool) -> bool {
    if !crate::threads::spinning_pays() {
        return ready();
    }
    const ROUNDS: u32 = 7;
    for i in 0..ROUNDS {
        if ready() {
            return true;
        }
        for _ in 0..(1u32 << i) {
            std::hint::spin_loop();
        }
    }
    ready()
}

impl BlobsQueue {
    pub fn new(
        name: &str,
        capacity: usize,
        num_blobs: usize,
        field_names: Vec<String>,
    ) -> Result<BlobsQueue> {
        if capacity == 0 {
            return Err(Error::invalid_arg(
                "a blob queue needs a capacity of at least 1",
            ));
        }
        if num_blobs == 0 {
            return Err(Error::invalid_arg(
                "a blob queue needs at least 1 blob per record (num_blobs)",
            ));
        }
        if !field_names.is_empty() && field_names.len() != num_blobs {
            return Err(Error::invalid_arg(format!(
                "wrong number of field_names: {} given for num_blobs = {num_blobs}",
                field_names.len()
            )));
        }
        let total = capacity
            .checked_mul(num_blobs)
            .ok_or_else(|| Error::invalid_arg("capacity * num_blobs overflows"))?;
        Ok(BlobsQueue {
            name: name.to_string(),
            capacity,
            num_blobs,
            field_names,
            state: CacheLine(Mutex::new(State {
                values: VecDeque::with_capacity(total.min(PREALLOCATED_VALUES)),
                closing: false,
            })),
            signals: CacheLine(Signals {
                not_empty: Condvar::new(),
                not_full: Condvar::new(),
                filled: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn num_blobs(&self) -> usize {
        self.num_blobs
    }
    pub fn field_names(&self) -> &[String] {
        &self.field_names
    }
    /// Records currently queued.
    pub fn len(&self) -> usize {
        self.state.lock().values.len() / self.num_blobs
    }
    pub fn is_empty(&self) -> bool {
        self.state.lock().values.is_empty()
    }
    pub fn is_closed(&self) -> bool {
        self.state.lock().closing
    }

    /// Closes the queue and wakes every waiter. Idempotent.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closing = true;
        self.signals.closed.store(true, Ordering::Release);
        drop(st);
        self.signals.not_empty.notify_all();
        self.signals.not_full.notify_all();
    }

    fn full(&self, st: &State) -> bool {
        st.values.len() >= self.capacity * self.num_blobs
    }

    /// Waits until a slot is free or the queue is closed. `Some(guard)` when
    /// a slot is free (closed or not), `None` when closed and full.
    fn wait_writable(&self, cancel: &CancelToken) -> Result<Option<MutexGuard<'_, State>>> {
        let mut st = self.state.lock();
        let mut spun = false;
        let mut _wait = None; // the timeline's span of the wait, if recorded
        while self.full(&st) {
            if st.closing {
                return Ok(None);
            }
            if cancel.is_cancelled() {
                return Err(Error::cancelled());
            }
            if !spun {
                _wait = crate::trace::span("queue", || "queue wait (full)".to_string());
                spun = true;
                let limit = self.capacity * self.num_blobs;
                let free = || {
                    self.signals.filled.load(Ordering::Acquire) < limit
                        || self.signals.closed.load(Ordering::Acquire)
                };
                if MutexGuard::unlocked(&mut st, || spin_then_give_up(free)) {
                    continue;
                }
            }
            if self.signals.not_full.wait_for(&mut st, POLL).timed_out()
                && MutexGuard::unlocked(&mut st, || cancel.poll_now())
            {
                // The interrupt check (cancel.rs) runs without the mutex.
                return Err(Error::cancelled());
            }
        }
        Ok(Some(st))
    }

    fn wrote(&self, st: MutexGuard<'_, State>) {
        self.signals
            .filled
            .store(st.values.len(), Ordering::Release);
        drop(st);
        self.signals.not_empty.notify_one();
    }

    /// Appends one record, moving the values out of `values` (they are left
    /// `Empty`). Waits while the queue is full and open. `Ok(false)`, with
    /// `values` untouched, when the queue is closed and full.
    pub fn blocking_write(&self, values: &mut [BlobValue], cancel: &CancelToken) -> Result<bool> {
        self.check_width(values.len())?;
        let Some(mut st) = self.wait_writable(cancel)? else {
            return Ok(false);
        };
        st.values.extend(values.iter_mut().map(std::mem::take));
        self.wrote(st);
        Ok(true)
    }

    /// [`Self::blocking_write`] straight from blobs: each blob's value is moved
    /// into the queue (the blob is left empty) only once a slot is free.
    /// All the blobs are write-locked together (in blob id order, like
    /// `OpCx::lock`), so the record leaves them at once; a blob listed twice
    /// gives its value to its first position and `Empty` to the others.
    pub fn blocking_write_blobs(&self, blobs: &[Blob], cancel: &CancelToken) -> Result<bool> {
        self.check_width(blobs.len())?;
        let Some(mut st) = self.wait_writable(cancel)? else {
            return Ok(false);
        };
        // Queue mutex, then the blobs' locks, briefly (see the module doc).
        let mut order: SmallVec<[usize; 4]> = (0..blobs.len()).collect();
        order.sort_by_key(|&j| blobs[j].id());
        let mut guards: SmallVec<[Option<RwLockWriteGuard<'_, BlobValue>>; 4]> =
            blobs.iter().map(|_| None).collect();
        for (k, &j) in order.iter().enumerate() {
            if k == 0 || !Arc::ptr_eq(&blobs[order[k - 1]], &blobs[j]) {
                guards[j] = Some(blobs[j].write());
            }
        }
        st.values.extend(guards.iter_mut().map(|g| {
            g.as_mut()
                .map_or(BlobValue::Empty, |g| std::mem::take(&mut **g))
        }));
        drop(guards);
        self.wrote(st);
        Ok(true)
    }

    /// Moves the oldest record into `out` (replacing its values). Waits while
    /// the queue is empty and open, at most `timeout` if one is given.
    pub fn blocking_read(
        &self,
        out: &mut [BlobValue],
        timeout: Option<Duration>,
        cancel: &CancelToken,
    ) -> Result<ReadOutcome> {
        self.check_width(out.len())?;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.state.lock();
        let mut spun = false;
        let mut _wait = None; // the timeline's span of the wait, if recorded
        loop {
            if !st.values.is_empty() {
                for slot in out.iter_mut() {
                    *slot = st.values.pop_front().expect("records are whole");
                }
                self.signals
                    .filled
                    .store(st.values.len(), Ordering::Release);
                drop(st);
                self.signals.not_full.notify_one();
                return Ok(ReadOutcome::Read);
            }
            if st.closing {
                return Ok(ReadOutcome::Closed);
            }
            if cancel.is_cancelled() {
                return Err(Error::cancelled());
            }
            if !spun {
                _wait = crate::trace::span("queue", || "queue wait (empty)".to_string());
                spun = true;
                let ready = || {
                    self.signals.filled.load(Ordering::Acquire) > 0
                        || self.signals.closed.load(Ordering::Acquire)
                };
                if MutexGuard::unlocked(&mut st, || spin_then_give_up(ready)) {
                    continue;
                }
            }
            let slice = match deadline {
                None => POLL,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(ReadOutcome::TimedOut);
                    }
                    (d - now).min(POLL)
                }
            };
            if self.signals.not_empty.wait_for(&mut st, slice).timed_out()
                && MutexGuard::unlocked(&mut st, || cancel.poll_now())
            {
                return Err(Error::cancelled());
            }
        }
    }

    fn check_width(&self, n: usize) -> Result<()> {
        if n != self.num_blobs {
            return Err(Error::invalid_arg(format!(
                "queue '{}' holds records of {} blobs, but {n} were given",
                self.name, self.num_blobs
            )));
        }
        Ok(())
    }
}

// -------------------------------------------------------------------- ops --

/// The queue in an op's input 0. It is looked up on every run (CreateBlobsQueue
/// may have put a new queue there), but the handle is cloned only when it
/// changed: a producer and a consumer then share no reference count.
#[derive(Default)]
struct QueueInput(Option<Arc<BlobsQueue>>);

impl QueueInput {
    fn get(&mut self, cx: &OpCx<'_>) -> Result<&BlobsQueue> {
        let v = cx.input_blob(0).read();
        let same = match (&*v, &self.0) {
            (BlobValue::Object(o), Some(q)) => std::ptr::addr_eq(Arc::as_ptr(o), Arc::as_ptr(q)),
            _ => false,
        };
        if !same {
            self.0 = Some(
                v.object::<BlobsQueue>("BlobsQueue")
                    .map_err(|e| e.with_blob(&cx.io.input_names[0]))?,
            );
        }
        drop(v);
        Ok(self.0.as_deref().expect("set just above"))
    }
}

/// The blob count an op gives must match the queue's record width.
fn check_count(q: &BlobsQueue, given: usize, queue_blob: &str) -> Result<()> {
    if given != q.num_blobs {
        return Err(Error::invalid_arg(format!(
            "the queue holds records of {} blobs, but the op has {given} data blobs",
            q.num_blobs
        ))
        .with_blob(queue_blob));
    }
    Ok(())
}

/// Writes a bool scalar, reusing the output's buffer when it already is one
/// (so a status output costs no allocation per run).
fn set_status(out: &mut BlobValue, v: bool) {
    if let BlobValue::Tensor(t @ Tensor::Bool(_)) = out {
        if t.ndim() == 0 {
            // (A buffer shared with a fetched array is copied on write.)
            if let Some(x) = t.array_mut::<bool>().ok().and_then(|a| a.iter_mut().next()) {
                *x = v;
                return;
            }
        }
    }
    *out = BlobValue::Tensor(Tensor::scalar(v));
}

/// Publishes a dequeue's result under the op's blob locks, so it appears at
/// once: `values` (a record, or nothing) go to outputs `0..values.len()`,
/// and `status` to its output. The outputs' old contents are dropped after
/// the locks are released.
fn publish(cx: &OpCx<'_>, values: &mut [BlobValue], status: Option<(usize, bool)>) {
    let mut l = cx.lock();
    for (j, v) in values.iter_mut().enumerate() {
        std::mem::swap(l.output(j), v);
    }
    if let Some((j, v)) = status {
        set_status(l.output(j), v);
    }
    drop(l);
    for v in values {
        *v = BlobValue::Empty;
    }
}

fn create_blobs_queue(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let capacity = ctx.args.i64("capacity", 1)?;
    let num_blobs = ctx.args.i64("num_blobs", 1)?;
    if capacity < 1 {
        return Err(ctx.bad_arg(format!("capacity must be >= 1, got {capacity}")));
    }
    if num_blobs < 1 {
        return Err(ctx.bad_arg(format!("num_blobs must be >= 1, got {num_blobs}")));
    }
    let (capacity, num_blobs) = (
        usize::try_from(capacity).map_err(|_| ctx.bad_arg("capacity is too large"))?,
        usize::try_from(num_blobs).map_err(|_| ctx.bad_arg("num_blobs is too large"))?,
    );
    let unique = ctx.args.bool("enforce_unique_name", false)?;
    let field_names = ctx.args.string_list("field_names")?.unwrap_or_default();
    let name = ctx.output_name(0).to_string();
    // Validate now, so a bad definition fails at net creation.
    BlobsQueue::new(&name, capacity, num_blobs, field_names.clone())
        .map_err(|e| e.with_op(ctx.op_type(), None))?;
    Ok(kernel(move |cx| {
        if unique {
            if cx
                .output_blob(0)
                .read()
                .object::<BlobsQueue>("BlobsQueue")
                .is_ok()
            {
                return Err(Error::invalid_arg(format!(
                    "queue '{name}' already exists (enforce_unique_name)"
                ))
                .with_blob(&name));
            }
            for slot in 0..capacity {
                for col in 0..num_blobs {
                    let slot_blob = format!("{name}_{slot}_{col}");
                    if cx.ws.has_blob(&slot_blob) {
                        return Err(Error::invalid_arg(format!(
                            "queue internal blob already exists: '{slot_blob}' (enforce_unique_name)"
                        ))
                        .with_blob(&slot_blob));
                    }
                }
            }
        }
        let q = BlobsQueue::new(&name, capacity, num_blobs, field_names.clone())?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(q)));
        Ok(true)
    }))
}

fn check_enqueue_counts(ctx: &OpDefCtx<'_>, data_outputs: usize) -> Result<()> {
    if ctx.num_inputs() != data_outputs + 1 {
        return Err(ctx.bad_arg(format!(
            "{} takes the queue plus one input per data blob, and one output per data blob{}: got {} inputs and {} outputs",
            ctx.op_type(),
            if data_outputs == ctx.num_outputs() { "" } else { " plus status" },
            ctx.num_inputs(),
            ctx.num_outputs()
        )));
    }
    Ok(())
}

fn enqueue_blobs(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_outputs();
    check_enqueue_counts(ctx, n)?;
    let mut queue = QueueInput::default();
    Ok(kernel(move |cx| {
        let q = queue.get(cx)?;
        check_count(q, n, &cx.io.input_names[0])?;
        // The data blobs are the in-place outputs 0..n.
        q.blocking_write_blobs(&cx.io.outputs[..n], cx.cancel)
    }))
}

fn safe_enqueue_blobs(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_outputs() - 1;
    check_enqueue_counts(ctx, n)?;
    let mut queue = QueueInput::default();
    Ok(kernel(move |cx| {
        let q = queue.get(cx)?;
        check_count(q, n, &cx.io.input_names[0])?;
        let ok = q.blocking_write_blobs(&cx.io.outputs[..n], cx.cancel)?;
        set_status(&mut cx.output_blob(n).write(), !ok);
        Ok(true)
    }))
}

fn timeout_of(secs: f32) -> Option<Duration> {
    // Caffe2 waited for `int(secs * 1000)` milliseconds when secs > 0.
    (secs > 0.0).then(|| Duration::from_millis((f64::from(secs) * 1000.0) as u64))
}

struct DequeueOp {
    queue: QueueInput,
    n: usize,
    timeout_secs: f32,
    /// Reused between runs: records pass through without allocating.
    scratch: Vec<BlobValue>,
}

fn dequeue_blobs(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let timeout_secs = ctx.args.f32("timeout_secs", 0.0)?;
    let n = ctx.num_outputs();
    Ok(Box::new(DequeueOp {
        queue: QueueInput::default(),
        n,
        timeout_secs,
        scratch: vec![BlobValue::Empty; n],
    }))
}

impl Operator for DequeueOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let q = self.queue.get(cx)?;
        check_count(q, self.n, &cx.io.input_names[0])?;
        match q.blocking_read(&mut self.scratch, timeout_of(self.timeout_secs), cx.cancel)? {
            ReadOutcome::Read => {
                publish(cx, &mut self.scratch, None);
                Ok(true)
            }
            ReadOutcome::Closed => Ok(false),
            ReadOutcome::TimedOut => {
                eprintln!("DequeueBlobs timed out in {} secs", self.timeout_secs);
                Ok(false)
            }
        }
    }
}

fn close_blobs_queue(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let mut queue = QueueInput::default();
    Ok(kernel(move |cx| {
        queue.get(cx)?.close();
        Ok(true)
    }))
}

struct SafeDequeueOp {
    queue: QueueInput,
    n: usize,
    num_records: usize,
    scratch: Vec<BlobValue>,
}

fn safe_dequeue_blobs(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let num_records = ctx.args.i64("num_records", 1)?;
    if num_records < 1 {
        return Err(ctx.bad_arg(format!("num_records must be > 0, got {num_records}")));
    }
    let num_records =
        usize::try_from(num_records).map_err(|_| ctx.bad_arg("num_records is too large"))?;
    let n = ctx.num_outputs() - 1;
    Ok(Box::new(SafeDequeueOp {
        queue: QueueInput::default(),
        n,
        num_records,
        scratch: vec![BlobValue::Empty; n],
    }))
}

/// Reads up to `num_records` records, appending column by column. Returns
/// the columns, or `None` when not even one record could be read.
fn read_many(
    cx: &OpCx<'_>,
    q: &BlobsQueue,
    num_records: usize,
    scratch: &mut [BlobValue],
) -> Result<Option<Vec<Tensor>>> {
    let n = scratch.len();
    let mut acc: Vec<Tensor> = Vec::with_capacity(n);
    for i in 0..num_records {
        if q.blocking_read(scratch, None, cx.cancel)? != ReadOutcome::Read {
            break;
        }
        for (col, v) in scratch.iter_mut().enumerate() {
            let name = &cx.io.output_names[col];
            let t = match std::mem::take(v) {
                BlobValue::Tensor(t) => t,
                other => {
                    return Err(Error::type_error(format!(
                        "a dequeued record holds {} in column {col}, but appending records needs tensors",
                        other.kind_name()
                    ))
                    .with_blob(name))
                }
            };
            if i == 0 {
                acc.push(t);
                continue;
            }
            if t.ndim() == 0 {
                return Err(Error::shape(format!(
                    "cannot append a 0-dim tensor dequeued at column {col} of {n} columns"
                ))
                .with_blob(name));
            }
            acc[col].append_rows(&t).map_err(|e| e.with_blob(name))?;
        }
    }
    Ok((!acc.is_empty()).then_some(acc))
}

impl Operator for SafeDequeueOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let q = self.queue.get(cx)?;
        check_count(q, self.n, &cx.io.input_names[0])?;
        let status = self.n;
        if self.num_records == 1 {
            if q.blocking_read(&mut self.scratch, None, cx.cancel)? == ReadOutcome::Read {
                publish(cx, &mut self.scratch, Some((status, false)));
            } else {
                publish(cx, &mut [], Some((status, true)));
            }
        } else {
            match read_many(cx, q, self.num_records, &mut self.scratch)? {
                Some(cols) => {
                    let mut vals: SmallVec<[BlobValue; 4]> =
                        cols.into_iter().map(BlobValue::Tensor).collect();
                    publish(cx, &mut vals, Some((status, false)));
                }
                None => publish(cx, &mut [], Some((status, true))),
            }
        }
        Ok(true)
    }
}

// ------------------------------------------------------------------ tests --

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::Counter;
    use crate::error::ErrorKind;
    use crate::ir::{ExecutionStep, PlanDef};
    use crate::net::Net;
    use crate::operator::register;
    use crate::test_util::{feed, float_arg, get, i64s, int_arg, net, op, run, strings_arg};
    use crate::workspace::Workspace;
    use std::sync::Once;
    use std::thread;

    /// Generous bound for "returns promptly" (no timing benchmarks here).
    const PROMPT: Duration = Duration::from_secs(5);

    fn status(ws: &Workspace, name: &str) -> bool {
        let t = get(ws, name);
        assert_eq!(t.ndim(), 0, "status is a scalar");
        t.scalar_value::<bool>().unwrap()
    }
    fn make_queue(ws: &Arc<Workspace>, name: &str, capacity: i64, num_blobs: i64) {
        let args = vec![
            int_arg("capacity", capacity),
            int_arg("num_blobs", num_blobs),
        ];
        assert!(run(ws, op("CreateBlobsQueue", &[], &[name], args)).unwrap());
    }
    fn queue(ws: &Workspace, name: &str) -> Arc<BlobsQueue> {
        ws.blob(name)
            .unwrap()
            .read()
            .object::<BlobsQueue>("BlobsQueue")
            .unwrap()
    }
    fn enqueue(ws: &Arc<Workspace>, q: &str, blob: &str, v: Tensor) -> Result<bool> {
        feed(ws, blob, v);
        run(ws, op("EnqueueBlobs", &[q, blob], &[blob], vec![]))
    }
    fn dequeue(ws: &Arc<Workspace>, q: &str, blob: &str) -> Result<bool> {
        run(ws, op("DequeueBlobs", &[q], &[blob], vec![]))
    }

    /// Runs `f` on a thread and asserts it has not finished after a short
    /// while (it is blocked). Returns the handle to join later.
    fn spawn_blocked<T: Send + 'static>(
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let h = thread::spawn(f);
        thread::sleep(Duration::from_millis(50));
        assert!(!h.is_finished(), "the op should be blocked");
        h
    }

    fn join_within<T>(h: thread::JoinHandle<T>) -> T {
        let t = Instant::now();
        while !h.is_finished() {
            assert!(t.elapsed() < PROMPT, "the blocked op did not return");
            thread::sleep(Duration::from_millis(1));
        }
        h.join().unwrap()
    }

    #[test]
    fn fifo_order_and_moved_inputs() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 3, 1);
        for v in [10, 20, 30] {
            assert!(enqueue(&ws, "q", "x", i64s(&[v])).unwrap());
            // The value was moved into the queue: the input blob is now empty.
            assert!(ws.fetch("x").unwrap().is_empty());
        }
        assert_eq!(queue(&ws, "q").len(), 3);
        for v in [10, 20, 30] {
            assert!(dequeue(&ws, "q", "y").unwrap());
            assert_eq!(get(&ws, "y"), i64s(&[v]));
        }
        assert!(queue(&ws, "q").is_empty());
    }

    #[test]
    fn records_of_several_blobs_stay_together() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 2, 2);
        feed(&ws, "a", i64s(&[1]));
        feed(&ws, "b", Tensor::from_vec(&[2], vec![1.5f32, 2.5]).unwrap());
        assert!(run(
            &ws,
            op("EnqueueBlobs", &["q", "a", "b"], &["a", "b"], vec![])
        )
        .unwrap());
        // A non-tensor value travels too.
        ws.feed("a", BlobValue::Object(Arc::new(Counter::new(7))));
        feed(&ws, "b", Tensor::scalar(3i32));
        assert!(run(
            &ws,
            op("EnqueueBlobs", &["q", "a", "b"], &["a", "b"], vec![])
        )
        .unwrap());
        assert!(run(&ws, op("DequeueBlobs", &["q"], &["c", "d"], vec![])).unwrap());
        assert_eq!(get(&ws, "c"), i64s(&[1]));
        assert_eq!(
            get(&ws, "d"),
            Tensor::from_vec(&[2], vec![1.5f32, 2.5]).unwrap()
        );
        assert!(run(&ws, op("DequeueBlobs", &["q"], &["c", "d"], vec![])).unwrap());
        assert_eq!(
            ws.blob("c")
                .unwrap()
                .read()
                .object::<Counter>("Counter")
                .unwrap()
                .get(),
            7
        );
        assert_eq!(get(&ws, "d"), Tensor::scalar(3i32));
        // The schema forbids listing a blob twice; the Rust API moves it once
        // (no self-deadlock): its first position gets the value.
        assert!(run(
            &ws,
            op("EnqueueBlobs", &["q", "a", "a"], &["a", "a"], vec![])
        )
        .is_err());
        feed(&ws, "a", i64s(&[9]));
        let a = ws.blob("a").unwrap();
        assert!(queue(&ws, "q")
            .blocking_write_blobs(&[a.clone(), a], &CancelToken::new())
            .unwrap());
        assert!(run(&ws, op("DequeueBlobs", &["q"], &["c", "d"], vec![])).unwrap());
        assert_eq!(get(&ws, "c"), i64s(&[9]));
        assert!(ws.fetch("d").unwrap().is_empty());
    }

    #[test]
    fn write_blocks_while_full_until_a_read() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 2, 1);
        assert!(enqueue(&ws, "q", "x", i64s(&[1])).unwrap());
        assert!(enqueue(&ws, "q", "x", i64s(&[2])).unwrap());
        feed(&ws, "x", i64s(&[3]));
        let mut n = Net::create(
            &net("w", vec![op("EnqueueBlobs", &["q", "x"], &["x"], vec![])]),
            &ws,
        )
        .unwrap();
        let ws2 = ws.clone();
        let h = spawn_blocked(move || n.run(&ws2, &CancelToken::new()));
        // Blocked: the value has not been taken yet.
        assert_eq!(get(&ws, "x"), i64s(&[3]));
        assert!(dequeue(&ws, "q", "y").unwrap());
        assert_eq!(get(&ws, "y"), i64s(&[1]));
        assert!(join_within(h).unwrap());
        assert!(ws.fetch("x").unwrap().is_empty());
        for v in [2, 3] {
            assert!(dequeue(&ws, "q", "y").unwrap());
            assert_eq!(get(&ws, "y"), i64s(&[v]));
        }
    }

    #[test]
    fn read_blocks_while_empty_until_a_write() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 1, 1);
        let mut n = Net::create(
            &net("r", vec![op("DequeueBlobs", &["q"], &["y"], vec![])]),
            &ws,
        )
        .unwrap();
        let ws2 = ws.clone();
        let h = spawn_blocked(move || n.run(&ws2, &CancelToken::new()));
        assert!(enqueue(&ws, "q", "x", i64s(&[42])).unwrap());
        assert!(join_within(h).unwrap());
        assert_eq!(get(&ws, "y"), i64s(&[42]));
    }

    #[test]
    fn close_wakes_every_blocked_reader() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 4, 1);
        let mut handles = Vec::new();
        for k in 0..3 {
            let out = format!("y{k}");
            let st = format!("s{k}");
            // Two plain readers and one Safe reader.
            let def = if k < 2 {
                op("DequeueBlobs", &["q"], &[&out], vec![])
            } else {
                op("SafeDequeueBlobs", &["q"], &[&out, &st], vec![])
            };
            let mut n = Net::create(&net(&format!("r{k}"), vec![def]), &ws).unwrap();
            let ws2 = ws.clone();
            handles.push(thread::spawn(move || n.run(&ws2, &CancelToken::new())));
        }
        thread::sleep(Duration::from_millis(50));
        assert!(handles.iter().all(|h| !h.is_finished()));
        assert!(run(&ws, op("CloseBlobsQueue", &["q"], &[], vec![])).unwrap());
        let results: Vec<bool> = handles
            .into_iter()
            .map(|h| join_within(h).unwrap())
            .collect();
        // Plain dequeue fails softly; the Safe one succeeds with status = true.
        assert_eq!(results, vec![false, false, true]);
        assert!(status(&ws, "s2"));
        assert!(ws.fetch("y0").unwrap().is_empty() && ws.fetch("y2").unwrap().is_empty());
        // Closing twice is fine.
        assert!(run(&ws, op("CloseBlobsQueue", &["q"], &[], vec![])).unwrap());
        assert!(queue(&ws, "q").is_closed());
    }

    #[test]
    fn close_wakes_a_blocked_writer_which_then_fails() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 1, 1);
        assert!(enqueue(&ws, "q", "x", i64s(&[1])).unwrap());
        feed(&ws, "x", i64s(&[2]));
        let mut n = Net::create(
            &net("w", vec![op("EnqueueBlobs", &["q", "x"], &["x"], vec![])]),
            &ws,
        )
        .unwrap();
        let ws2 = ws.clone();
        let h = spawn_blocked(move || n.run(&ws2, &CancelToken::new()));
        queue(&ws, "q").close();
        assert!(!join_within(h).unwrap(), "closed and full: a soft failure");
        // The failed write left its blob alone.
        assert_eq!(get(&ws, "x"), i64s(&[2]));
    }

    #[test]
    fn write_after_close_succeeds_while_a_slot_is_free_and_reads_drain() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 2, 1);
        assert!(enqueue(&ws, "q", "x", i64s(&[1])).unwrap());
        assert!(run(&ws, op("CloseBlobsQueue", &["q"], &[], vec![])).unwrap());
        assert!(
            enqueue(&ws, "q", "x", i64s(&[2])).unwrap(),
            "a free slot after close still takes a write"
        );
        assert!(
            !enqueue(&ws, "q", "x", i64s(&[3])).unwrap(),
            "closed and full fails softly"
        );
        assert_eq!(get(&ws, "x"), i64s(&[3]));
        // Drain: both records come out, then the closed, empty queue fails.
        for v in [1, 2] {
            assert!(dequeue(&ws, "q", "y").unwrap());
            assert_eq!(get(&ws, "y"), i64s(&[v]));
        }
        assert!(!dequeue(&ws, "q", "y").unwrap());
        assert_eq!(
            get(&ws, "y"),
            i64s(&[2]),
            "a failed read leaves its output alone"
        );
        // A soft failure stops the net: later ops do not run.
        let n = net(
            "n",
            vec![
                op("DequeueBlobs", &["q"], &["y"], vec![]),
                op("CreateCounter", &[], &["after"], vec![]),
            ],
        );
        assert!(!ws.run_net_once(&n, &CancelToken::new()).unwrap());
        assert!(ws.fetch("after").unwrap().is_empty());
    }

    #[test]
    fn safe_ops_report_status_instead_of_failing() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 1, 1);
        let senq = |v: i64| {
            feed(&ws, "x", i64s(&[v]));
            run(
                &ws,
                op("SafeEnqueueBlobs", &["q", "x"], &["x", "st"], vec![]),
            )
            .unwrap()
        };
        let sdeq = || run(&ws, op("SafeDequeueBlobs", &["q"], &["y", "sd"], vec![])).unwrap();
        assert!(senq(1));
        assert!(!status(&ws, "st"));
        assert!(ws.fetch("x").unwrap().is_empty());
        queue(&ws, "q").close();
        assert!(senq(2), "Safe ops never fail softly");
        assert!(status(&ws, "st"), "closed and full");
        assert_eq!(get(&ws, "x"), i64s(&[2]));
        assert!(sdeq());
        assert!(!status(&ws, "sd"));
        assert_eq!(get(&ws, "y"), i64s(&[1]));
        assert!(sdeq());
        assert!(status(&ws, "sd"), "closed and drained");
        assert_eq!(
            get(&ws, "y"),
            i64s(&[1]),
            "outputs untouched when nothing was read"
        );
        // The status blob's buffer is reused across runs and stays correct.
        let ws = Workspace::new();
        make_queue(&ws, "q", 4, 1);
        for k in 0..3 {
            feed(&ws, "x", i64s(&[k]));
            assert!(run(
                &ws,
                op("SafeEnqueueBlobs", &["q", "x"], &["x", "st"], vec![])
            )
            .unwrap());
            assert!(!status(&ws, "st"));
        }
    }

    #[test]
    fn safe_dequeue_appends_num_records() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 8, 2);
        let rec = |a: Tensor, b: Tensor| {
            feed(&ws, "a", a);
            feed(&ws, "b", b);
            assert!(run(
                &ws,
                op("EnqueueBlobs", &["q", "a", "b"], &["a", "b"], vec![])
            )
            .unwrap());
        };
        let m = |rows: usize, v: Vec<f32>| Tensor::from_vec(&[rows, 2], v).unwrap();
        rec(i64s(&[1, 2]), m(1, vec![0.5, 1.5]));
        rec(i64s(&[3]), m(2, vec![2.5, 3.5, 4.5, 5.5]));
        rec(i64s(&[]), m(0, vec![]));
        rec(i64s(&[4, 5]), m(1, vec![6.5, 7.5]));
        rec(i64s(&[6]), m(1, vec![8.5, 9.5]));
        let deq = || {
            run(
                &ws,
                op(
                    "SafeDequeueBlobs",
                    &["q"],
                    &["x", "y", "s"],
                    vec![int_arg("num_records", 2)],
                ),
            )
            .unwrap()
        };
        assert!(deq());
        assert!(!status(&ws, "s"));
        assert_eq!(get(&ws, "x"), i64s(&[1, 2, 3]));
        assert_eq!(get(&ws, "y"), m(3, vec![0.5, 1.5, 2.5, 3.5, 4.5, 5.5]));
        assert!(deq());
        assert_eq!(
            get(&ws, "x"),
            i64s(&[4, 5]),
            "an empty record appends nothing"
        );
        assert_eq!(get(&ws, "y"), m(1, vec![6.5, 7.5]));
        // Close with one record left: a short batch still counts as success.
        queue(&ws, "q").close();
        assert!(deq());
        assert!(!status(&ws, "s"));
        assert_eq!(get(&ws, "x"), i64s(&[6]));
        assert!(deq());
        assert!(status(&ws, "s"));
        assert_eq!(get(&ws, "x"), i64s(&[6]));

        // Mismatched inner dims and 0-dim records are errors, not garbage.
        let ws = Workspace::new();
        make_queue(&ws, "q", 4, 1);
        assert!(enqueue(
            &ws,
            "q",
            "a",
            Tensor::from_vec(&[1, 2], vec![1i32, 2]).unwrap()
        )
        .unwrap());
        assert!(enqueue(
            &ws,
            "q",
            "a",
            Tensor::from_vec(&[1, 3], vec![1i32, 2, 3]).unwrap()
        )
        .unwrap());
        let e = run(
            &ws,
            op(
                "SafeDequeueBlobs",
                &["q"],
                &["x", "s"],
                vec![int_arg("num_records", 2)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{e}");
        assert!(enqueue(&ws, "q", "a", Tensor::scalar(1i32)).unwrap());
        assert!(enqueue(&ws, "q", "a", Tensor::scalar(2i32)).unwrap());
        let e = run(
            &ws,
            op(
                "SafeDequeueBlobs",
                &["q"],
                &["x", "s"],
                vec![int_arg("num_records", 2)],
            ),
        )
        .unwrap_err();
        assert!(e.message.contains("0-dim"), "{e}");
        // num_records must be positive.
        let e = run(
            &ws,
            op(
                "SafeDequeueBlobs",
                &["q"],
                &["x", "s"],
                vec![int_arg("num_records", 0)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn dequeue_times_out_softly() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 1, 1);
        let t = Instant::now();
        let ok = run(
            &ws,
            op(
                "DequeueBlobs",
                &["q"],
                &["y"],
                vec![float_arg("timeout_secs", 0.05)],
            ),
        )
        .unwrap();
        assert!(!ok);
        assert!(t.elapsed() >= Duration::from_millis(50) && t.elapsed() < PROMPT);
        // A record that is there is read at once, timeout or not.
        assert!(enqueue(&ws, "q", "x", i64s(&[5])).unwrap());
        assert!(run(
            &ws,
            op(
                "DequeueBlobs",
                &["q"],
                &["y"],
                vec![float_arg("timeout_secs", 0.05)]
            )
        )
        .unwrap());
        assert_eq!(get(&ws, "y"), i64s(&[5]));
        // An integer timeout is the wrong argument field, as in Caffe2.
        assert!(run(
            &ws,
            op(
                "DequeueBlobs",
                &["q"],
                &["y"],
                vec![int_arg("timeout_secs", 1)]
            )
        )
        .is_err());
    }

    #[test]
    fn cancellation_unblocks_waiting_readers_and_writers() {
        let ws = Workspace::new();
        make_queue(&ws, "empty", 1, 1);
        make_queue(&ws, "full", 1, 1);
        assert!(enqueue(&ws, "full", "x", i64s(&[1])).unwrap());
        feed(&ws, "x", i64s(&[2]));
        let tok = CancelToken::new();
        let defs = [
            op("DequeueBlobs", &["empty"], &["y"], vec![]),
            op(
                "SafeDequeueBlobs",
                &["empty"],
                &["y2", "s2"],
                vec![int_arg("num_records", 3)],
            ),
            op("EnqueueBlobs", &["full", "x"], &["x"], vec![]),
            op("SafeEnqueueBlobs", &["full", "x"], &["x", "s3"], vec![]),
        ];
        let mut handles = Vec::new();
        for (k, d) in defs.into_iter().enumerate() {
            let mut n = Net::create(&net(&format!("n{k}"), vec![d]), &ws).unwrap();
            let (ws2, tok2) = (ws.clone(), tok.child());
            handles.push(thread::spawn(move || n.run(&ws2, &tok2)));
        }
        thread::sleep(Duration::from_millis(50));
        assert!(handles.iter().all(|h| !h.is_finished()));
        tok.cancel();
        for h in handles {
            let e = join_within(h).unwrap_err();
            assert!(e.is_cancelled(), "{e}");
        }
        // Nothing was lost or taken: the queues are as they were, and open.
        assert_eq!(queue(&ws, "full").len(), 1);
        assert!(!queue(&ws, "full").is_closed());
        assert_eq!(get(&ws, "x"), i64s(&[2]));
    }

    #[test]
    fn schema_and_argument_errors() {
        let ws = Workspace::new();
        let bad = [
            op(
                "CreateBlobsQueue",
                &[],
                &["q"],
                vec![int_arg("capacity", 0)],
            ),
            op(
                "CreateBlobsQueue",
                &[],
                &["q"],
                vec![int_arg("num_blobs", -1)],
            ),
            op(
                "CreateBlobsQueue",
                &[],
                &["q"],
                vec![int_arg("num_blobs", 2), strings_arg("field_names", &["a"])],
            ),
        ];
        for d in bad {
            assert_eq!(run(&ws, d).unwrap_err().kind, ErrorKind::InvalidArgument);
        }
        let args = vec![
            int_arg("num_blobs", 2),
            strings_arg("field_names", &["a", "b"]),
        ];
        assert!(run(&ws, op("CreateBlobsQueue", &[], &["q"], args)).unwrap());
        assert_eq!(
            queue(&ws, "q").field_names(),
            &["a".to_string(), "b".to_string()]
        );
        assert_eq!(queue(&ws, "q").name(), "q");
        feed(&ws, "a", i64s(&[1]));
        feed(&ws, "b", i64s(&[1]));
        // In-place is enforced: output j must be input j + 1.
        let e = run(
            &ws,
            op("EnqueueBlobs", &["q", "a", "b"], &["a", "c"], vec![]),
        )
        .unwrap_err();
        assert!(e.message.contains("in-place"), "{e}");
        let e = run(
            &ws,
            op("SafeEnqueueBlobs", &["q", "a"], &["a", "a"], vec![]),
        )
        .unwrap_err();
        assert!(e.message.contains("in-place"), "{e}");
        // Input and output counts must line up.
        let e = run(&ws, op("EnqueueBlobs", &["q", "a", "b"], &["a"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        // The record width must match the queue's.
        let e = run(&ws, op("EnqueueBlobs", &["q", "a"], &["a"], vec![])).unwrap_err();
        assert!(e.message.contains("records of 2 blobs"), "{e}");
        let e = run(&ws, op("DequeueBlobs", &["q"], &["y"], vec![])).unwrap_err();
        assert!(e.message.contains("records of 2 blobs"), "{e}");
        // Dequeue outputs may not overwrite the queue blob.
        assert!(run(&ws, op("DequeueBlobs", &["q"], &["q", "z"], vec![])).is_err());
        // A non-queue blob is a type error naming it.
        let e = run(&ws, op("CloseBlobsQueue", &["a"], &[], vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("a"))
        );
    }

    #[test]
    fn create_again_gives_a_fresh_queue_and_unique_names_are_enforced() {
        let ws = Workspace::new();
        make_queue(&ws, "q", 2, 1);
        assert!(enqueue(&ws, "q", "x", i64s(&[1])).unwrap());
        let old = queue(&ws, "q");
        make_queue(&ws, "q", 2, 1);
        assert!(queue(&ws, "q").is_empty());
        assert_eq!(old.len(), 1, "holders of the old handle keep the old queue");
        let unique = || {
            op(
                "CreateBlobsQueue",
                &[],
                &["u"],
                vec![int_arg("capacity", 2), int_arg("enforce_unique_name", 1)],
            )
        };
        assert!(run(&ws, unique()).unwrap());
        assert!(run(&ws, unique()).is_err(), "the queue exists already");
        // A blob with one of Caffe2's slot names blocks a unique queue.
        feed(&ws, "v_1_0", i64s(&[0]));
        let e = run(
            &ws,
            op(
                "CreateBlobsQueue",
                &[],
                &["v"],
                vec![int_arg("capacity", 2), int_arg("enforce_unique_name", 1)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.context.blob.as_deref(), Some("v_1_0"));
        // No slot blobs are created in the workspace.
        assert!(!ws.has_blob("q_0_0"));
    }

    #[test]
    fn rust_api_moves_values() {
        let q = BlobsQueue::new("q", 2, 2, vec![]).unwrap();
        let tok = CancelToken::new();
        let mut rec = [BlobValue::Tensor(i64s(&[1])), BlobValue::Tensor(i64s(&[2]))];
        assert!(q.blocking_write(&mut rec, &tok).unwrap());
        assert!(rec.iter().all(|v| v.is_empty()));
        assert!(
            q.blocking_write(&mut [BlobValue::Empty], &tok).is_err(),
            "wrong width"
        );
        let mut out = [BlobValue::Empty, BlobValue::Empty];
        assert_eq!(
            q.blocking_read(&mut out, Some(Duration::ZERO), &tok)
                .unwrap(),
            ReadOutcome::Read
        );
        assert_eq!(out[1].tensor().unwrap(), &i64s(&[2]));
        assert_eq!(
            q.blocking_read(&mut out, Some(Duration::ZERO), &tok)
                .unwrap(),
            ReadOutcome::TimedOut
        );
        q.close();
        assert_eq!(
            q.blocking_read(&mut out, None, &tok).unwrap(),
            ReadOutcome::Closed
        );
        assert!(format!("{q:?}").contains("capacity 2"));
    }

    #[test]
    fn many_producers_and_consumers_pass_every_record_once() {
        let q = Arc::new(BlobsQueue::new("q", 3, 1, vec![]).unwrap());
        let tok = CancelToken::new();
        let (producers, per) = (4i64, 500i64);
        let got = thread::scope(|s| {
            let consumers: Vec<_> = (0..3)
                .map(|_| {
                    let (q, tok) = (&q, &tok);
                    s.spawn(move || {
                        let mut seen = Vec::new();
                        let mut out = [BlobValue::Empty];
                        while q.blocking_read(&mut out, None, tok).unwrap() == ReadOutcome::Read {
                            seen.push(out[0].tensor().unwrap().scalar_value::<i64>().unwrap());
                        }
                        seen
                    })
                })
                .collect();
            let prods: Vec<_> = (0..producers)
                .map(|p| {
                    let (q, tok) = (&q, &tok);
                    s.spawn(move || {
                        for k in 0..per {
                            let mut v = [BlobValue::Tensor(Tensor::scalar(p * per + k))];
                            assert!(q.blocking_write(&mut v, tok).unwrap());
                        }
                    })
                })
                .collect();
            for p in prods {
                p.join().unwrap();
            }
            q.close();
            consumers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect::<Vec<_>>()
        });
        let mut got = got;
        got.sort_unstable();
        assert_eq!(got, (0..producers * per).collect::<Vec<_>>());
    }

    // -------------------------------------------------------- plan tests --

    /// Test-only op: pushes the int64 scalar input 1 onto the `Collected`
    /// object in input 0.
    #[derive(Debug, Default)]
    struct Collected(Mutex<Vec<i64>>);
    impl BlobObject for Collected {
        fn kind_name(&self) -> &'static str {
            "Collected"
        }
    }
    fn register_test_ops() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            register(
                OpSchema::new("QueueTestCollect", |_| {
                    Ok(kernel(|cx| {
                        let c = cx.input_blob(0).read().object::<Collected>("Collected")?;
                        let v = cx.input_blob(1).read().tensor()?.scalar_value::<i64>()?;
                        c.0.lock().push(v);
                        Ok(true)
                    }))
                })
                .inputs(2, 2),
            );
        });
    }
    fn step(name: &str) -> ExecutionStep {
        ExecutionStep {
            name: Some(name.into()),
            ..Default::default()
        }
    }
    fn net_step(name: &str, nets: &[&str]) -> ExecutionStep {
        ExecutionStep {
            network: nets.iter().map(|s| s.to_string()).collect(),
            ..step(name)
        }
    }

    /// Producer: `count` records 0..count, then close. Consumers: `consumers`
    /// instances (each in its own child workspace) looping on SafeDequeue's status.
    fn producer_consumer_plan(
        count: i64,
        capacity: i64,
        consumers: i32,
        num_records: i64,
    ) -> PlanDef {
        let init = net(
            "init",
            vec![
                op(
                    "CreateBlobsQueue",
                    &[],
                    &["q"],
                    vec![int_arg("capacity", capacity)],
                ),
                op("CreateCounter", &[], &["src"], vec![]),
            ],
        );
        let produce = net(
            "produce",
            vec![
                op("CountUp", &["src"], &["v"], vec![]),
                op("EnqueueBlobs", &["q", "v"], &["v"], vec![]),
            ],
        );
        let close = net("close", vec![op("CloseBlobsQueue", &["q"], &[], vec![])]);
        let dequeue = net(
            "dequeue",
            vec![op(
                "SafeDequeueBlobs",
                &["q"],
                &["r", "status"],
                vec![int_arg("num_records", num_records)],
            )],
        );
        let collect = net(
            "collect",
            vec![op("QueueTestCollect", &["sink", "r"], &[], vec![])],
        );
        let producer = ExecutionStep {
            substep: vec![
                ExecutionStep {
                    num_iter: Some(count),
                    ..net_step("produce", &["produce"])
                },
                net_step("close", &["close"]),
            ],
            ..step("producer")
        };
        let consumer = ExecutionStep {
            create_workspace: Some(true),
            should_stop_blob: Some("status".into()),
            ..net_step("consumer", &["dequeue", "collect"])
        };
        let consumers = ExecutionStep {
            substep: vec![consumer],
            num_concurrent_instances: Some(consumers),
            ..step("consumers")
        };
        let top = ExecutionStep {
            substep: vec![producer, consumers],
            concurrent_substeps: Some(true),
            ..step("top")
        };
        PlanDef {
            name: Some("pc".into()),
            network: vec![init, produce, close, dequeue, collect],
            execution_step: vec![net_step("init", &["init"]), top],
        }
    }

    #[test]
    fn producer_consumer_plan_passes_every_record_once() {
        register_test_ops();
        for (count, capacity, consumers) in [(200i64, 1i64, 1i32), (500, 4, 3), (300, 64, 8)] {
            let ws = Workspace::new();
            let sink = Arc::new(Collected::default());
            ws.feed("sink", BlobValue::Object(sink.clone()));
            let plan = producer_consumer_plan(count, capacity, consumers, 1);
            assert!(crate::plan::run_plan(&ws, &plan, &CancelToken::new()).unwrap());
            let mut got = sink.0.lock().clone();
            if consumers == 1 {
                // One consumer sees the producer's order.
                assert_eq!(got, (0..count).collect::<Vec<_>>());
            }
            got.sort_unstable();
            assert_eq!(
                got,
                (0..count).collect::<Vec<_>>(),
                "count {count}, consumers {consumers}"
            );
            assert!(queue(&ws, "q").is_closed() && queue(&ws, "q").is_empty());
        }
    }

    #[test]
    fn a_failure_elsewhere_unblocks_a_consumer_waiting_on_an_open_queue() {
        let ws = Workspace::new();
        feed(&ws, "not_a_counter", i64s(&[1]));
        let init = net("init", vec![op("CreateBlobsQueue", &[], &["q"], vec![])]);
        // Never closed, never written: this consumer would wait for ever.
        let wait = net("wait", vec![op("DequeueBlobs", &["q"], &["r"], vec![])]);
        let fail = net(
            "fail",
            vec![op("RetrieveCount", &["not_a_counter"], &["c"], vec![])],
        );
        let top = ExecutionStep {
            substep: vec![net_step("waiter", &["wait"]), net_step("failer", &["fail"])],
            concurrent_substeps: Some(true),
            ..step("top")
        };
        let plan = PlanDef {
            name: Some("p".into()),
            network: vec![init, wait, fail],
            execution_step: vec![net_step("init", &["init"]), top],
        };
        let t = Instant::now();
        let e = crate::plan::run_plan(&ws, &plan, &CancelToken::new()).unwrap_err();
        assert!(t.elapsed() < PROMPT);
        assert_eq!(e.kind, ErrorKind::Type, "{e}");
        assert_eq!(e.context.step.as_deref(), Some("failer"));
        // The workspace is still usable and the queue still open.
        assert!(!queue(&ws, "q").is_closed());
    }

    #[test]
    fn cancelling_a_plan_unblocks_a_producer_on_a_full_queue() {
        let ws = Workspace::new();
        let init = net(
            "init",
            vec![
                op("CreateBlobsQueue", &[], &["q"], vec![]),
                op("CreateCounter", &[], &["src"], vec![]),
            ],
        );
        let produce = net(
            "produce",
            vec![
                op("CountUp", &["src"], &["v"], vec![]),
                op("SafeEnqueueBlobs", &["q", "v"], &["v", "full"], vec![]),
            ],
        );
        // Loops until the queue is closed and full, which never happens.
        let producer = ExecutionStep {
            should_stop_blob: Some("full".into()),
            ..net_step("producer", &["produce"])
        };
        let plan = PlanDef {
            name: Some("p".into()),
            network: vec![init, produce],
            execution_step: vec![net_step("init", &["init"]), producer],
        };
        let tok = CancelToken::new();
        let t2 = tok.clone();
        let h = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            t2.cancel();
        });
        let t = Instant::now();
        let e = crate::plan::run_plan(&ws, &plan, &tok).unwrap_err();
        h.join().unwrap();
        assert!(e.is_cancelled(), "{e}");
        assert!(t.elapsed() < PROMPT);
        assert_eq!(queue(&ws, "q").len(), 1);
    }
}
