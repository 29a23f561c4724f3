//! Threads: starting them with a typed error, and the size of the
//! data-parallel (rayon) pool that kernels use.
//!
//! Rayon's global pool is built once per process, on first use. A process
//! that shares its machine with others (a Ray actor given two CPUs, say)
//! fixes the size before any kernel runs.

use crate::error::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// Starts a named thread; the OS may refuse (a process or user thread
/// limit, no memory for its stack), and then the spare address space is
/// given back for the error's path (see [`SPARE`]).
pub fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .inspect_err(|_| release_spare())
}

/// Address space held back for the moment a thread cannot be started.
///
/// A thread the OS refuses because the process is out of address space
/// (RLIMIT_AS: the stacks of the threads started before it took the rest)
/// leaves nothing for what follows: the error's message, the running
/// threads' own errors as they are cancelled. An allocation that fails
/// there aborts the process. So a step that starts threads first holds this
/// much unused address space ([`keep_spare`]: a mapping with no access and
/// no memory behind it), and gives it back the moment a start fails
/// ([`release_spare`]), before cancelling anything.
const SPARE: usize = 8 << 20;

/// The spare's mapping (its address), if held.
static SPARE_AT: parking_lot::Mutex<Option<usize>> = parking_lot::Mutex::new(None);

/// Holds [`SPARE`] bytes of address space unless already held (called
/// before starting threads; nothing happens when it cannot be had).
pub(crate) fn keep_spare() {
    #[cfg(unix)]
    {
        let mut at = SPARE_AT.lock();
        if at.is_none() {
            // SAFETY: a fresh private mapping that nothing reads or writes;
            // only `release_spare` unmaps it.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    SPARE,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                *at = Some(p as usize);
            }
        }
    }
}

/// Gives the spare's address space back (a thread could not be started:
/// what runs next may need it); it is taken again by the next
/// [`keep_spare`] that finds room.
pub(crate) fn release_spare() {
    #[cfg(unix)]
    if let Some(p) = SPARE_AT.lock().take() {
        // SAFETY: `p` is the spare's own mapping of SPARE bytes, unmapped
        // once (taken out of the slot).
        unsafe { libc::munmap(p as *mut libc::c_void, SPARE) };
    }
}

/// Whether a thread waiting for another may spin briefly before it sleeps:
/// only when this process can run on more than one CPU (its affinity mask
/// and CPU quota, as `available_parallelism` reads them, once). On one CPU
/// the thread it waits for cannot run while it spins, so a spin only delays
/// both.
pub fn spinning_pays() -> bool {
    static PAYS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAYS.get_or_init(|| std::thread::available_parallelism().is_ok_and(|n| n.get() > 1))
}

/// The error for a thread the OS would not start, saying what it was for.
pub fn cannot_start(what: &str, err: &std::io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("cannot start a thread for {what}: {err}"),
    )
}

/// What became of the global kernel pool: not built yet, built, or its
/// threads could not be started. rayon tries to build its global pool once
/// per process: after a failure it never exists, so kernels run on the
/// calling thread from then on.
static POOL: AtomicU8 = AtomicU8::new(POOL_UNKNOWN);
const POOL_UNKNOWN: u8 = 0;
const POOL_READY: u8 = 1;
const POOL_FAILED: u8 = 2;

/// Builds the global kernel pool with `n` threads (0: rayon's default, from
/// RAYON_NUM_THREADS or the CPUs available). `Ok(true)`: built now;
/// `Ok(false)`: it existed already; `Err`: its threads could not be started
/// (now or before).
fn build_pool(n: usize) -> Result<bool> {
    let failed = || {
        Error::new(
            ErrorKind::Io,
            "the kernel pool could not start its threads earlier in this process (rayon builds it once); kernels run on the calling thread",
        )
    };
    if POOL.load(Ordering::Acquire) == POOL_FAILED {
        return Err(failed());
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("ferrocaffe-kernel-{i}"))
        .build_global()
    {
        Ok(()) => {
            POOL.store(POOL_READY, Ordering::Release);
            Ok(true)
        }
        // rayon tells the two failures apart only in the message. Every
        // build goes through here, so an existing pool is a built one.
        Err(e) if e.to_string().contains("already been initialized") => {
            if POOL.load(Ordering::Acquire) == POOL_FAILED {
                return Err(failed());
            }
            POOL.store(POOL_READY, Ordering::Release);
            Ok(false)
        }
        Err(e) => {
            POOL.store(POOL_FAILED, Ordering::Release);
            Err(Error::new(
                ErrorKind::Io,
                format!("cannot start the threads of the kernel pool: {e}"),
            ))
        }
    }
}

/// Whether the kernel pool exists, building it (at rayon's default size) if
/// not. False when its threads could not be started (a thread or memory
/// limit): kernels then run on the calling thread instead of failing.
pub fn pool_available() -> bool {
    match POOL.load(Ordering::Acquire) {
        POOL_READY => true,
        POOL_FAILED => false,
        _ => build_pool(0).is_ok(),
    }
}

/// Builds the global kernel pool with `n` threads. Returns `Ok(false)` when
/// the pool already exists with another size (it cannot be resized), and
/// `Ok(true)` when it now has `n` threads.
pub fn set_num_threads(n: usize) -> Result<bool> {
    if n == 0 {
        return Err(Error::invalid_arg(
            "the kernel pool needs at least one thread (got 0)",
        ));
    }
    match build_pool(n)? {
        true => Ok(true),
        false => Ok(rayon::current_num_threads() == n),
    }
}

/// Threads in the kernel pool (building it with rayon's default size if no
/// kernel has run yet); 1 when it cannot be started (kernels then run on
/// the calling thread).
pub fn num_threads() -> usize {
    if pool_available() {
        rayon::current_num_threads()
    } else {
        1
    }
}

// --------------------------------------------------------- shared work --

/// Work cut into pieces that the calling thread and pool threads claim one
/// at a time (a split matrix product, a [`fork`]).
pub(crate) trait Pieces: Send + Sync {
    /// Claims and runs pieces until none is left; whether it ran any.
    fn run(&self) -> bool;
    /// Whether every piece is done.
    fn finished(&self) -> bool;
}

/// The newest work offered to lingering pool threads, and a counter of
/// offers they watch without taking the lock.
static PENDING: parking_lot::Mutex<Option<Arc<dyn Pieces>>> = parking_lot::Mutex::new(None);
static PUBLISHED: AtomicUsize = AtomicUsize::new(0);
/// Pool threads lingering now.
static LINGERING: AtomicUsize = AtomicUsize::new(0);
/// How long a pool thread that has run a piece waits, spinning, for the
/// next work offered (or other work queued on the pool) before it goes
/// back to the pool (and may sleep): a training step's products follow each
/// other within microseconds, a net's convolutions within the time of the
/// memory-bound ops between them (0.1-1 ms at batch 1), and waking a
/// sleeping thread costs tens to hundreds of microseconds on a VM. 60 us
/// here left ResNet-50 at batch 1 on two threads with a sum of per-op
/// medians of 51-57 ms, 1 ms gave 41-43 (BENCHMARKS.md "Keeping the pool
/// warm"); OpenMP runtimes spin far longer by default.
const LINGER: std::time::Duration = std::time::Duration::from_micros(1000);

/// Spins for up to [`LINGER`] after a piece, running the pieces of any
/// work offered meanwhile, and other jobs queued on the pool (lingering
/// again after them).
fn linger() {
    if !spinning_pays() {
        return;
    }
    LINGERING.fetch_add(1, Ordering::AcqRel);
    let mut seen = PUBLISHED.load(Ordering::Acquire);
    let start = std::time::Instant::now();
    let mut until = start + LINGER;
    // Never more than this in all: then the thread goes back to the
    // pool's own scheduling (and sleeps when the pool is idle).
    let cap = start + 20 * LINGER;
    let mut polls = 0u32;
    loop {
        let now = PUBLISHED.load(Ordering::Acquire);
        if now != seen {
            seen = now;
            let offered = PENDING.lock().clone();
            if let Some(p) = offered {
                if p.run() {
                    until = (std::time::Instant::now() + LINGER).min(cap);
                }
            }
        } else if QUEUED.load(Ordering::Acquire) > 0 && run_deferred() {
            // Offers made meanwhile are seen at the next turn.
            until = (std::time::Instant::now() + LINGER).min(cap);
        }
        std::hint::spin_loop();
        polls += 1;
        if polls.is_multiple_of(64) {
            // Other kernels' work queued on the pool meanwhile (a
            // memory-bound op's chunks, a convolution's blocks) is run here
            // rather than left for a thread to wake.
            if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                until = (std::time::Instant::now() + LINGER).min(cap);
            }
            if std::time::Instant::now() >= until {
                break;
            }
        }
    }
    LINGERING.fetch_sub(1, Ordering::AcqRel);
}

/// How long (spin-loop iterations) a caller that has run out of pieces
/// spins for its helpers' last ones before it sleeps: at most some tens of
/// microseconds (a `pause` takes 10-140 cycles), about one piece's time.
const SPIN: usize = 1 << 10;

/// Runs `work` (of `pieces` pieces) on the caller and up to `helpers` pool
/// threads, returning when every piece is done. Pool threads lingering
/// after earlier work take it at once; the helpers still wanted are woken
/// through the pool (`rayon::spawn`), and the caller claims pieces at once,
/// so a helper that wakes late only takes fewer of them.
///
/// # Safety
/// What the pieces read and write stays alive and in bounds until this
/// returns; a piece may run on any thread.
pub(crate) unsafe fn share(work: Arc<dyn Pieces>, pieces: usize, helpers: usize) {
    let wanted = helpers.min(pieces.saturating_sub(1));
    let lingering = LINGERING.load(Ordering::Acquire).min(wanted);
    if lingering > 0 {
        *PENDING.lock() = Some(work.clone());
        PUBLISHED.fetch_add(1, Ordering::Release);
    }
    for _ in lingering..wanted {
        let w = work.clone();
        rayon::spawn(move || {
            if w.run() {
                drop(w);
                linger();
            }
        });
    }
    work.run();
    let mut spins = if spinning_pays() { SPIN } else { 0 };
    if lingering > 0 {
        let mut slot = PENDING.lock();
        if slot
            .as_ref()
            .is_some_and(|p| std::ptr::addr_eq(Arc::as_ptr(p), Arc::as_ptr(&work)))
        {
            *slot = None;
        }
    }
    while !work.finished() {
        if spins > 0 {
            spins -= 1;
            std::hint::spin_loop();
        } else {
            // The last piece's thread unparks us; the timeout only guards
            // against a wake-up consumed elsewhere.
            std::thread::park_timeout(std::time::Duration::from_millis(1));
        }
    }
}

/// Pool threads lingering now (idle, spinning for work: see [`share`]).
pub(crate) fn lingering() -> usize {
    LINGERING.load(Ordering::Acquire)
}

// ------------------------------------------------------- deferred work --

/// A job handed to the pool's idle (lingering) threads without waiting for
/// it: the caller goes on and [`Deferred::join`]s it later, running it
/// itself if no thread has taken it yet. A recurrent step's rows copied
/// out into their sequences run this way, during the next step.
pub(crate) struct Deferred(Option<Arc<Job>>);

type JobFn = Box<dyn FnOnce() -> Result<()> + Send>;

struct Job {
    /// [`JOB_QUEUED`], [`JOB_RUNNING`] or [`JOB_DONE`].
    state: AtomicU8,
    work: parking_lot::Mutex<Option<JobFn>>,
    /// The job's result, or its panic.
    result: parking_lot::Mutex<Option<std::thread::Result<Result<()>>>>,
    /// The thread that made it, woken when it is done.
    owner: std::thread::Thread,
}

const JOB_QUEUED: u8 = 0;
const JOB_RUNNING: u8 = 1;
const JOB_DONE: u8 = 2;

/// Jobs not yet taken (oldest first), and how many (read without the lock).
static JOBS: parking_lot::Mutex<std::collections::VecDeque<Arc<Job>>> =
    parking_lot::Mutex::new(std::collections::VecDeque::new());
static QUEUED: AtomicUsize = AtomicUsize::new(0);

impl Job {
    /// Claims the job (queued -> running) for this thread.
    fn claim(&self) -> bool {
        self.state
            .compare_exchange(JOB_QUEUED, JOB_RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Runs a claimed job and records what it gave.
    fn execute(&self) {
        let work = self.work.lock().take();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match work {
            Some(f) => f(),
            None => Err(Error::internal("a deferred job ran twice")),
        }));
        *self.result.lock() = Some(r);
        self.state.store(JOB_DONE, Ordering::Release);
        self.owner.unpark();
    }
}

/// Takes the oldest queued job and runs it here (a lingering pool thread,
/// still counted as lingering: a product offered meanwhile is taken up when
/// the job is done, rather than a sleeping thread woken for it, which on a
/// pool as large as the CPUs would leave the caller a CPU short); whether
/// one ran.
fn run_deferred() -> bool {
    let job = {
        let mut q = JOBS.lock();
        let j = q.pop_front();
        if j.is_some() {
            QUEUED.fetch_sub(1, Ordering::AcqRel);
        }
        j
    };
    match job {
        Some(j) if j.claim() => {
            j.execute();
            true
        }
        _ => false,
    }
}

/// Hands `work` to an idle pool thread when one is lingering now, else
/// runs it here at once; either way its result comes from
/// [`Deferred::join`] (which a drop does too, dropping the result).
/// `work` must not wait for anything its caller holds while it would join.
pub(crate) fn defer(work: impl FnOnce() -> Result<()> + Send + 'static) -> Deferred {
    let job = Arc::new(Job {
        state: AtomicU8::new(JOB_QUEUED),
        work: parking_lot::Mutex::new(Some(Box::new(work))),
        result: parking_lot::Mutex::new(None),
        owner: std::thread::current(),
    });
    if lingering() == 0 {
        job.claim();
        job.execute();
    } else {
        let mut q = JOBS.lock();
        q.push_back(job.clone());
        QUEUED.fetch_add(1, Ordering::AcqRel);
    }
    Deferred(Some(job))
}

impl Deferred {
    /// Waits for the job (running it here if no thread took it yet) and
    /// gives its result; a panic in it is raised here.
    pub(crate) fn join(mut self) -> Result<()> {
        match self.0.take() {
            Some(job) => Self::finish(&job),
            None => Ok(()),
        }
    }

    fn finish(job: &Job) -> Result<()> {
        if job.claim() {
            // Still queued: out of the queue, and run here.
            let mut q = JOBS.lock();
            let before = q.len();
            q.retain(|j| !std::ptr::eq(Arc::as_ptr(j), job));
            QUEUED.fetch_sub(before - q.len(), Ordering::AcqRel);
            drop(q);
            job.execute();
        }
        let mut spins = if spinning_pays() { SPIN } else { 0 };
        while job.state.load(Ordering::Acquire) != JOB_DONE {
            if spins > 0 {
                spins -= 1;
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(std::time::Duration::from_millis(1));
            }
        }
        match job.result.lock().take() {
            Some(Ok(r)) => r,
            Some(Err(p)) => std::panic::resume_unwind(p),
            None => Err(Error::internal("a deferred job gave no result")),
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        let Some(job) = self.0.take() else {
            return;
        };
        // Its result is dropped; a panic in it is caught here too (raised
        // again during an unwind, it would abort).
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Self::finish(&job)));
    }
}

/// The pieces of a [`fork`]: a borrowed function called with each index.
struct Fork {
    /// The function, its lifetime erased: it is called only for a piece
    /// claimed before every piece is done, so before [`fork`] returns.
    f: *const (dyn Fn(usize) + Sync + 'static),
    pieces: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// The caller, woken when the last piece is done.
    caller: std::thread::Thread,
    /// The first piece's panic, raised again on the caller.
    panic: parking_lot::Mutex<Option<Box<dyn std::any::Any + Send>>>,
}
// SAFETY: `f` is `Sync` and called only while `fork` waits (see `f`); the
// rest is atomics, a thread handle and a mutex.
unsafe impl Send for Fork {}
unsafe impl Sync for Fork {}

impl Pieces for Fork {
    fn run(&self) -> bool {
        let mut ran = false;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.pieces {
                return ran;
            }
            ran = true;
            // SAFETY: piece i was unclaimed, so `fork` is still waiting
            // and its function alive.
            let f = unsafe { &*self.f };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
                self.panic.lock().get_or_insert(p);
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.pieces {
                self.caller.unpark();
            }
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.pieces
    }
}

/// Calls `f(0) .. f(pieces - 1)`, on this thread and on pool threads that
/// are lingering now (spinning after a split product, see [`share`]);
/// none is woken, so a memory-bound op or an LSTM cell of some tens of
/// microseconds shares its work only when that costs a cache line's
/// hand-off, and runs alone (in order) otherwise. A panic in a piece is
/// raised here once every piece has run.
pub(crate) fn fork(pieces: usize, f: &(dyn Fn(usize) + Sync)) {
    let helpers = lingering().min(pieces.saturating_sub(1));
    let f: *const (dyn Fn(usize) + Sync + '_) = f;
    // SAFETY: only the lifetime changes; see `Fork::f`.
    let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let work = Fork {
        f,
        pieces,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        caller: std::thread::current(),
        panic: parking_lot::Mutex::new(None),
    };
    let panic = if helpers == 0 {
        // Alone, in order; a panic is raised after the rest, as shared.
        work.run();
        work.panic.into_inner()
    } else {
        let work = Arc::new(work);
        // SAFETY: `share` returns when every piece is done; `f` borrows
        // what the pieces touch for longer than that.
        unsafe { share(work.clone(), pieces, helpers) };
        let p = work.panic.lock().take();
        p
    };
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

/// Calls `f` on each of `parts` (disjoint pieces of the work: row blocks
/// of outputs, say), sharing them with lingering pool threads (see
/// [`fork`]).
pub(crate) fn fork_each<P: Send>(parts: Vec<P>, f: impl Fn(P) + Sync) {
    if parts.len() < 2 || lingering() == 0 {
        parts.into_iter().for_each(f);
        return;
    }
    let slots: Vec<parking_lot::Mutex<Option<P>>> = parts
        .into_iter()
        .map(|p| parking_lot::Mutex::new(Some(p)))
        .collect();
    fork(slots.len(), &|i| {
        if let Some(p) = slots[i].lock().take() {
            f(p);
        }
    });
}

/// Copies of at least this many bytes are shared with lingering pool
/// threads ([`copy_bytes`]), in pieces of about [`COPY_PIECE`] bytes.
const COPY_MIN: usize = 64 << 10;
const COPY_PIECE: usize = 32 << 10;

/// Copies `len` bytes from `src` to `dst`, in pieces shared with pool
/// threads lingering now (see [`fork`]) when it is long: a recurrent step's
/// rows copied into and out of its sequences (128 KiB at a time in
/// `benches/bench_lstm.py`), large arrays copied on write.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable
/// for `len` bytes, not overlapping.
pub(crate) unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize) {
    if len < COPY_MIN || lingering() == 0 {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let pieces = len.div_ceil(COPY_PIECE).min(8);
    // Pieces start on cache lines.
    let per = len.div_ceil(pieces).next_multiple_of(64);
    struct Ends(*mut u8, *const u8);
    // SAFETY: each piece writes its own bytes of `dst`; `fork` returns
    // when all are done, within the caller's contract.
    unsafe impl Sync for Ends {}
    let ends = Ends(dst, src);
    fork(pieces, &|i| {
        let ends = &ends;
        let (lo, hi) = (i * per, ((i + 1) * per).min(len));
        if lo < hi {
            // SAFETY: lo..hi lies within the caller's `len` bytes.
            unsafe { std::ptr::copy_nonoverlapping(ends.1.add(lo), ends.0.add(lo), hi - lo) };
        }
    });
}

/// One byte copy of [`copy_spans`]: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    pub(crate) dst: *mut u8,
    pub(crate) src: *const u8,
    pub(crate) len: usize,
}
// SAFETY: a span only describes a copy; `copy_spans`'s caller vouches for
// the memory it names for the length of the call.
unsafe impl Send for Span {}
unsafe impl Sync for Span {}

/// Spans of at least this many bytes in all are copied on the kernel pool
/// ([`copy_spans`]), in pieces of at most [`SPAN_PIECE`] bytes.
const SPANS_PAR: usize = 1 << 20;
const SPAN_PIECE: usize = 256 << 10;

/// Copies each of `spans` (the pieces of an output gathered from several
/// inputs: a Concat's rows), on the kernel pool's threads (woken: the
/// copies are long enough to pay for it) when they hold at least
/// [`SPANS_PAR`] bytes in all, else here.
///
/// # Safety
/// Each span's `src` readable and `dst` writable for its `len` bytes; no
/// destination overlaps another span's destination or any source.
pub(crate) unsafe fn copy_spans(spans: &[Span]) {
    let total: usize = spans.iter().map(|s| s.len).sum();
    let copy = |s: &Span| {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(s.src, s.dst, s.len) }
    };
    if total < SPANS_PAR || num_threads() < 2 {
        spans.iter().for_each(copy);
        return;
    }
    use rayon::prelude::*;
    let pieces: Vec<Span> = spans
        .iter()
        .flat_map(|s| {
            (0..s.len).step_by(SPAN_PIECE).map(move |lo| Span {
                // SAFETY: lo < s.len, within the span.
                dst: unsafe { s.dst.add(lo) },
                src: unsafe { s.src.add(lo) },
                len: SPAN_PIECE.min(s.len - lo),
            })
        })
        .collect();
    pieces.par_iter().for_each(copy);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaves pool threads lingering (a split product just ran), so the
    /// forks below are shared when the pool has more than one thread.
    fn warm() {
        let (m, k, n) = (256, 256, 256);
        let a = vec![1.0f32; m * k];
        let b = vec![1.0f32; k * n];
        let mut c = vec![0.0f32; m * n];
        crate::ops::gemm::par_gemm(m, k, n, 1.0, &a, (k, 1), &b, (n, 1), 0.0, &mut c, (n, 1));
    }

    #[test]
    fn fork_runs_every_piece_once() {
        for pieces in [0, 1, 2, 3, 8, 33] {
            warm();
            let hits: Vec<AtomicUsize> = (0..pieces).map(|_| AtomicUsize::new(0)).collect();
            fork(pieces, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{pieces}"
            );
        }
    }

    #[test]
    fn fork_each_hands_every_part_over_once() {
        warm();
        let mut out = vec![0u32; 1000];
        let parts: Vec<(usize, &mut [u32])> = out.chunks_mut(70).enumerate().collect();
        fork_each(parts, |(i, block)| {
            for (j, v) in block.iter_mut().enumerate() {
                *v += (i * 70 + j) as u32 + 1;
            }
        });
        assert!(out.iter().enumerate().all(|(j, &v)| v == j as u32 + 1));
    }

    #[test]
    fn a_deferred_job_runs_once_and_its_result_comes_back() {
        for round in 0..200 {
            if round % 2 == 0 {
                warm();
            }
            let runs = Arc::new(AtomicUsize::new(0));
            let r = runs.clone();
            let job = defer(move || {
                r.fetch_add(1, Ordering::AcqRel);
                if round % 3 == 0 {
                    Err(Error::invalid_arg(format!("round {round}")))
                } else {
                    Ok(())
                }
            });
            let got = job.join();
            assert_eq!(runs.load(Ordering::Acquire), 1, "round {round}");
            match got {
                Err(e) => {
                    assert_eq!(round % 3, 0);
                    assert!(e.to_string().contains(&format!("round {round}")), "{e}");
                }
                Ok(()) => assert_ne!(round % 3, 0),
            }
        }
        assert_eq!(JOBS.lock().len(), QUEUED.load(Ordering::Acquire));
    }

    #[test]
    fn a_deferred_jobs_panic_is_raised_at_the_join() {
        warm();
        let job = defer(|| panic!("job panicked"));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.join()));
        let msg = r.expect_err("the panic is raised");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"job panicked"));
    }

    #[test]
    fn dropping_a_deferred_job_waits_for_it() {
        for _ in 0..20 {
            warm();
            let done = Arc::new(AtomicUsize::new(0));
            let d = done.clone();
            let job = defer(move || {
                std::thread::sleep(std::time::Duration::from_millis(2));
                d.store(1, Ordering::Release);
                Ok(())
            });
            drop(job);
            assert_eq!(done.load(Ordering::Acquire), 1);
        }
    }

    /// Counts one more lingering thread while it lives (so that `defer`
    /// queues its jobs), as a pool thread spinning after a piece would.
    struct Lingerer;
    impl Lingerer {
        fn new() -> Self {
            LINGERING.fetch_add(1, Ordering::AcqRel);
            Lingerer
        }
    }
    impl Drop for Lingerer {
        fn drop(&mut self) {
            LINGERING.fetch_sub(1, Ordering::AcqRel);
        }
    }

    #[test]
    fn a_job_queued_while_a_thread_lingers_runs_off_the_caller() {
        let _lingering = Lingerer::new();
        let ran = Arc::new(parking_lot::Mutex::new(None));
        let r = ran.clone();
        let job = defer(move || {
            *r.lock() = Some(std::thread::current().id());
            Err(Error::invalid_arg("from the other thread"))
        });
        // What a lingering pool thread does when a job is queued (other
        // tests may have queued theirs: it runs jobs until ours has run).
        let seen = ran.clone();
        let worker = std::thread::spawn(move || {
            while seen.lock().is_none() {
                run_deferred();
                std::hint::spin_loop();
            }
            std::thread::current().id()
        });
        worker.join().expect("the worker");
        let e = job.join().expect_err("the job's error comes back");
        assert!(e.to_string().contains("from the other thread"), "{e}");
        assert_ne!(*ran.lock(), Some(std::thread::current().id()));
    }

    #[test]
    fn a_job_still_queued_is_run_by_its_join() {
        // Queued, not run, while a thread lingers (and run by its join if
        // no pool thread took it meanwhile); it runs once and leaves the
        // queue.
        let _lingering = Lingerer::new();
        let me = std::thread::current().id();
        let ran = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let r = ran.clone();
        let job = defer(move || {
            r.lock().push(std::thread::current().id());
            Ok(())
        });
        let p = Arc::as_ptr(job.0.as_ref().expect("a job"));
        let queued = JOBS.lock().iter().any(|q| std::ptr::eq(Arc::as_ptr(q), p));
        job.join().expect("ran");
        let ran = ran.lock().clone();
        assert_eq!(ran.len(), 1);
        assert!(queued || ran[0] != me, "defer ran the job at once");
        assert!(!JOBS.lock().iter().any(|q| std::ptr::eq(Arc::as_ptr(q), p)));
    }

    #[test]
    fn a_panicking_piece_is_raised_on_the_caller_after_the_others() {
        warm();
        let done = AtomicUsize::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fork(6, &|i| {
                if i == 2 {
                    panic!("piece two");
                }
                done.fetch_add(1, Ordering::Relaxed);
            })
        }));
        let msg = r.expect_err("the panic is raised");
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"piece two"));
        assert_eq!(done.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn copy_bytes_copies_across_piece_boundaries() {
        for len in [
            0,
            5,
            COPY_MIN - 1,
            COPY_MIN,
            COPY_MIN + 63,
            300_007,
            (1 << 20) + 7,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut dst = vec![0xAAu8; len + 2];
            warm();
            // SAFETY: both hold `len` bytes from the offsets used.
            unsafe { copy_bytes(dst.as_mut_ptr().add(1), src.as_ptr(), len) };
            assert_eq!(dst[0], 0xAA);
            assert_eq!(dst[len + 1], 0xAA);
            assert!(dst[1..=len] == src[..], "{len}");
        }
    }

    #[test]
    fn zero_threads_is_an_error() {
        assert!(set_num_threads(0).is_err());
    }

    #[test]
    fn building_an_existing_pool_is_told_apart_from_a_failure() {
        assert!(pool_available());
        // The pool exists: building it again says so (rayon's message is
        // the only way to tell this from threads that cannot start).
        assert!(!build_pool(0).unwrap());
    }

    #[test]
    fn a_built_pool_reports_its_size() {
        let n = num_threads();
        assert!(n >= 1);
        // The pool exists now: asking for its own size succeeds, another
        // size is refused without panicking.
        assert!(set_num_threads(n).unwrap());
        assert!(!set_num_threads(n + 1).unwrap());
    }
}
