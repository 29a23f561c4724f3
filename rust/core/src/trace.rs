//! The timeline of runs: spans (ops, nets, step iterations, concurrent
//! instances, report runs, queue waits, and spans Python records) written
//! as Chrome trace-event JSON, which Perfetto and `chrome://tracing` open.
//!
//! Off (the default), a net run and a step unit look at one relaxed atomic
//! ([`on`]) and record nothing. On, each thread appends fixed-size records
//! to buffers of its own, taking no lock and allocating nothing per event:
//!
//! - the clock ([`now`]) is the CPU's time-stamp counter on x86_64 when it
//!   is invariant (one `rdtsc`, no system call), calibrated against
//!   `Instant` only when the trace is written; elsewhere `Instant`;
//! - a net run reserves its record when it starts (a header, the net, and
//!   a slot per op): each op stores one timestamp, its start, which is the
//!   end of the op before it; the run's end closes the record;
//! - a span is a record of five words (kind, name, start, end, detail);
//! - a loop whose iteration is one run of one net shares records between
//!   its iterations ([`LoopRecord`]): an iteration adds only its run's
//!   stamps, as 4-byte differences, and the writer expands them into the
//!   iteration, net and op events the records above would give;
//! - names are numbers into the thread's own table (a net's names are
//!   shared once per thread and net, a span's name once per thread and
//!   distinct text), resolved only when the trace is written.
//!
//! A thread's records live in chunks (the first small, the rest 4 MiB
//! mapped on 2 MiB boundaries, and kept as spares for the next recording
//! when dropped) that only that thread writes and frees;
//! a chunk's `used` count is published (one release store) after each record is reserved,
//! and a record still open (a net run under way) is skipped by readers
//! until its header is finished. [`json_since`] reads every thread's
//! chunks under their lock, which the owner takes only to add a chunk.
//!
//! Lanes: a span goes to its thread's lane. A thread started for a
//! concurrent substep instance or a reporter is given a label
//! ([`label_thread`]) made of its parent's label and its own name; threads
//! with the same label share a lane, so every iteration of a concurrent
//! step puts instance k on the same lane, and one lane shows one instance.
//!
//! Recording is counted ([`start`] / [`stop`]): nested recordings (a
//! per-call option inside a session-wide one) each read the spans of their
//! own window. When the last one stops, a thread's records are dropped by
//! that thread (the stopping thread at once, others when they next record
//! or end), so no thread frees memory another is writing.

use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
/// Whether net runs time each op (set while any recording asks for ops).
static OPS: AtomicBool = AtomicBool::new(false);
/// Bumped when a recording starts from nothing: older events are dropped.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Recordings under way, and how many of them want each op timed.
static DEPTH: Mutex<(usize, usize)> = Mutex::new((0, 0));
static NEXT_LANE: AtomicUsize = AtomicUsize::new(1);

/// Whether a timeline is being recorded (one relaxed load).
#[inline(always)]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether net runs time each op (read only when [`on`]).
#[inline]
pub fn ops_on() -> bool {
    OPS.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------- the clock

struct Clock {
    /// Whether [`now`] reads the time-stamp counter (else ns since `instant`).
    tsc: bool,
    /// The anchor: `instant` and the counter read at the same moment.
    instant: Instant,
    tsc0: u64,
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| {
        let tsc = tsc_usable();
        let (instant, tsc0) = if tsc { anchor() } else { (Instant::now(), 0) };
        Clock { tsc, instant, tsc0 }
    })
}

/// Whether the time-stamp counter ticks at a constant rate in every power
/// state (CPUID's "invariant TSC"), so it measures time on any core.
/// `FERROCAFFE_TRACE_CLOCK=instant` forces the portable clock.
#[cfg(target_arch = "x86_64")]
fn tsc_usable() -> bool {
    use std::arch::x86_64::__cpuid;
    if std::env::var_os("FERROCAFFE_TRACE_CLOCK").is_some_and(|v| v == "instant") {
        return false;
    }
    #[allow(unused_unsafe)]
    // SAFETY: every x86_64 CPU has CPUID; leaf 0x8000_0007 is read only
    // when the highest extended leaf says it exists.
    unsafe {
        __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc_usable() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    #[allow(unused_unsafe)]
    // SAFETY: RDTSC exists on every x86_64 CPU; it only reads the counter.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn rdtsc() -> u64 {
    0
}

/// An `Instant` and the counter read at (nearly) the same moment: the
/// counter read before and after it, closest pair of a few tries.
fn anchor() -> (Instant, u64) {
    let mut best = (Instant::now(), 0, u64::MAX);
    for _ in 0..5 {
        let a = rdtsc();
        let i = Instant::now();
        let b = rdtsc();
        if b.wrapping_sub(a) < best.2 {
            best = (i, a / 2 + b / 2, b.wrapping_sub(a));
        }
    }
    (best.0, best.1)
}

/// Now, on the trace clock: counter ticks (x86_64) or ns. Only
/// differences and [`to_ns`] / [`ticks_to_ns`] mean anything.
#[inline(always)]
pub fn now() -> u64 {
    let c = clock();
    if c.tsc {
        return rdtsc();
    }
    c.instant.elapsed().as_nanos() as u64
}

/// How trace clock values become ns since the anchor, measured now (the
/// counter's rate against `Instant` over at least 20 ms since the anchor;
/// waits out the rest of those 20 ms right after the process started).
#[derive(Clone, Copy)]
struct Scale {
    tsc0: u64,
    ns_per_tick: f64,
}

fn scale() -> Scale {
    let c = clock();
    if !c.tsc {
        return Scale {
            tsc0: 0,
            ns_per_tick: 1.0,
        };
    }
    let min = Duration::from_millis(20);
    if let Some(rest) = min.checked_sub(c.instant.elapsed()) {
        std::thread::sleep(rest);
    }
    let (i, t) = anchor();
    let ns = i.duration_since(c.instant).as_nanos() as f64;
    let ticks = t.saturating_sub(c.tsc0).max(1) as f64;
    Scale {
        tsc0: c.tsc0,
        ns_per_tick: ns / ticks,
    }
}

impl Scale {
    fn ns(&self, t: u64) -> u64 {
        (t.saturating_sub(self.tsc0) as f64 * self.ns_per_tick) as u64
    }
}

/// A duration on the trace clock (a difference of [`now`]s) in ns.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    let s = scale();
    (ticks as f64 * s.ns_per_tick) as u64
}

// ---------------------------------------------------------------- records

/// The timestamps of one net run when timed outside a recording
/// (`Workspace::benchmark_net`).
pub type Stamps = smallvec::SmallVec<[u64; 4]>;

/// Takes the start of each op of a net run ([`Stamps`] or a [`NetRecord`]).
pub trait OpClock {
    fn op_start(&mut self);
}

impl OpClock for Stamps {
    #[inline(always)]
    fn op_start(&mut self) {
        self.push(now());
    }
}

/// Names of a net and its ops, shared by every run's record.
#[derive(Debug)]
pub struct NetNames {
    pub net: Box<str>,
    pub ops: Vec<Box<str>>,
}

/// Extra fields of a span (its `args` in the JSON).
#[derive(Debug, Clone)]
pub enum Detail {
    None,
    Iteration(i64),
    Instance { k: usize, of: usize },
    Text(String),
}

// A record is words of a chunk. Word 0, the header: bits 0-7 the kind,
// 8-15 flags, 32-63 the record's length in words.
const OPEN: u64 = 0; // a net run under way: skipped by readers
const RUN: u64 = 1; // [hdr, net id | stamps << 32, stamp...]
const SPAN: u64 = 2; // [hdr, name id | cat id << 32, start, end, detail]
const OK: u64 = 1 << 8; // RUN: the run succeeded
const TIMED: u64 = 1 << 9; // RUN: the stamps time each op
const DETAIL_SHIFT: u64 = 8; // SPAN: the detail's kind in bits 8-9
const SPAN_WORDS: usize = 5;
// The iterations of a loop over one net, each with its net run (and ops),
// in one record ([`LoopRecord`]): [hdr, net id | step name id << 32, first
// iteration, start of the first, slots published, end of the last,
// slots...]. The slots are u32s, two a word (low half first): each stamp
// (the runs' stamps, as in a RUN record) is its difference from the stamp
// before it (the first from the start), or [`ESC`] and the difference's
// low and high halves when it does not fit. An iteration starts where the
// run before it ended and ends where its own run ended, the last one at
// word 5 when `ENDED`. The header's kind is LOOP (not OPEN) while the loop
// runs: readers read the slots published so far.
const LOOP: u64 = 3;
const FAILED: u64 = 1 << 10; // LOOP: the last run failed
const ENDED: u64 = 1 << 11; // LOOP: the last iteration ended at word 5 (TIMED as in RUN)
const LOOP_HEAD: usize = 6;
/// Slot words of a loop's first record; each next record of the same loop
/// has twice as many, up to [`LOOP_MAX`] (a loop of few iterations takes
/// little memory, a long one few records).
const LOOP_FIRST: usize = 8;
const LOOP_MAX: usize = 2048;
const ESC: u32 = u32::MAX;

/// The stamps of a loop record's `slots`, the first stamp measured from
/// `base` (see [`LOOP`]).
fn decode_stamps(base: u64, slots: impl IntoIterator<Item = u32>) -> Vec<u64> {
    let mut out = Vec::new();
    let mut t = base;
    let mut it = slots.into_iter();
    while let Some(v) = it.next() {
        let d = if v == ESC {
            let lo = it.next().unwrap_or(0) as u64;
            let hi = it.next().unwrap_or(0) as u64;
            lo | hi << 32
        } else {
            v as u64
        };
        t = t.wrapping_add(d);
        out.push(t);
    }
    out
}

fn header(kind: u64, flags: u64, len: usize) -> u64 {
    kind | flags | ((len as u64) << 32)
}

const FIRST_CHUNK: usize = 1 << 14; // words: 128 KiB
const CHUNK: usize = 1 << 19; // words: 4 MiB, two huge pages
/// Full chunks kept for the next recording when a thread drops its
/// records (32 MiB at most): their pages are already mapped, so a
/// recording after the first writes without page faults.
const SPARE_MAX: usize = 8;
// Boxed: a thread keeps a pointer to the chunk it fills (`Local::chunk`),
// which must not move when the vector grows.
#[allow(clippy::vec_box)]
static SPARE: Mutex<Vec<Box<Chunk>>> = Mutex::new(Vec::new());

struct Chunk {
    words: std::ptr::NonNull<AtomicU64>,
    len: usize,
    /// Whether `words` was mapped by `map_huge` (else the global allocator).
    mapped: bool,
    /// Words reserved so far (published after each reservation).
    used: AtomicUsize,
}

// SAFETY: a chunk owns its words, which are atomics.
unsafe impl Send for Chunk {}
// SAFETY: as above: shared access only goes through the atomics.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// A chunk of `n` words (pages untouched until written), or `None` when
    /// memory is short (the events are then not recorded). A full-size one
    /// is a spare chunk when there is one, else fresh memory aligned to
    /// 2 MiB (huge pages if asked for: [`huge_pages`]).
    fn new(n: usize) -> Option<Box<Chunk>> {
        if n == CHUNK {
            if let Some(c) = SPARE.lock().pop() {
                return Some(c);
            }
        }
        let bytes = n.checked_mul(8)?;
        if let Some(p) = map_huge(bytes) {
            return Some(Box::new(Chunk {
                words: p.cast(),
                len: n,
                mapped: true,
                used: AtomicUsize::new(0),
            }));
        }
        let layout = std::alloc::Layout::array::<AtomicU64>(n).ok()?;
        // SAFETY: the layout has a non-zero size (n > 0); zeroed memory is
        // a valid `[AtomicU64]`; `Drop` frees it with the same layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut AtomicU64;
        Some(Box::new(Chunk {
            words: std::ptr::NonNull::new(p)?,
            len: n,
            mapped: false,
            used: AtomicUsize::new(0),
        }))
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `words` holds `len` initialised atomics owned by the chunk.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr(), self.len) }
    }

    /// Keeps chunks as spares (up to [`SPARE_MAX`]), frees the rest. Their
    /// old words are not cleared: readers look only below `used`.
    #[allow(clippy::vec_box)] // see `SPARE`
    fn recycle(chunks: Vec<Box<Chunk>>) {
        let mut spare = SPARE.lock();
        for c in chunks {
            if c.len == CHUNK && spare.len() < SPARE_MAX {
                c.used.store(0, Ordering::Relaxed);
                spare.push(c);
            }
        }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let p = self.words.as_ptr();
        if self.mapped {
            unmap(p as *mut u8, self.len * 8);
        } else if let Ok(layout) = std::alloc::Layout::array::<AtomicU64>(self.len) {
            // SAFETY: allocated in `Chunk::new` with this layout.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) }
        }
    }
}

const HUGE: usize = 2 << 20;

/// `bytes` (a multiple of 2 MiB) of zeroed memory starting on a 2 MiB
/// boundary (advised to be backed by huge pages if [`huge_pages`]), or
/// `None` (other sizes, other systems, or no memory).
#[cfg(target_os = "linux")]
fn map_huge(bytes: usize) -> Option<std::ptr::NonNull<u8>> {
    if bytes == 0 || bytes % HUGE != 0 {
        return None;
    }
    let over = bytes.checked_add(HUGE)?;
    // SAFETY: an anonymous private mapping of fresh memory; the parts
    // outside the aligned range are unmapped at once and never used.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = p as usize;
        let aligned = start.next_multiple_of(HUGE);
        if aligned > start {
            libc::munmap(p, aligned - start);
        }
        let tail = start + over - (aligned + bytes);
        if tail > 0 {
            libc::munmap((aligned + bytes) as *mut libc::c_void, tail);
        }
        if huge_pages() {
            libc::madvise(aligned as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
        }
        std::ptr::NonNull::new(aligned as *mut u8)
    }
}

/// Whether record chunks ask for huge pages (`FERROCAFFE_TRACE_HUGE_PAGES=1`;
/// by default not: on this project's VM fresh huge pages cost a recorded
/// loop more than 4 KiB pages in most processes, BENCHMARKS.md, "Timeline
/// overhead").
#[cfg(target_os = "linux")]
fn huge_pages() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FERROCAFFE_TRACE_HUGE_PAGES").is_some_and(|v| v == "1"))
}

#[cfg(not(target_os = "linux"))]
fn map_huge(_bytes: usize) -> Option<std::ptr::NonNull<u8>> {
    None
}

fn unmap(p: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: `p` and `bytes` are a range `map_huge` mapped, unmapped once.
    unsafe {
        libc::munmap(p as *mut libc::c_void, bytes);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, bytes);
}

#[derive(Default)]
struct Names {
    nets: Vec<Arc<NetNames>>,
    strs: Vec<Arc<str>>,
}

/// What readers see of a thread.
struct Shared {
    #[allow(clippy::vec_box)] // see `SPARE`
    chunks: Mutex<Vec<Box<Chunk>>>,
    names: Mutex<Names>,
    lane: AtomicUsize,
    label: Mutex<Option<String>>,
    /// The recording generation its records belong to.
    generation: AtomicU64,
}

/// Every thread's buffer, registered on first use while recording.
static BUFFERS: Mutex<Vec<Arc<Shared>>> = Mutex::new(Vec::new());
/// Lane of each thread label.
static LANES: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// What only the thread itself touches.
struct Local {
    shared: Arc<Shared>,
    generation: u64,
    /// The chunk being filled (owned by `shared.chunks`), the next free
    /// word in it and its length.
    chunk: *const Chunk,
    pos: usize,
    cap: usize,
    /// Net records and span guards of this thread not yet finished: while
    /// any is, its chunk and names stay.
    open: usize,
    /// The end of the last net run this thread recorded.
    last_end: u64,
    last_net: (usize, u32),
    net_ids: HashMap<usize, u32>,
    recent: [(Option<Arc<str>>, u32); 4],
    next_recent: usize,
    str_ids: HashMap<Arc<str>, u32>,
    cat_ids: Vec<(usize, u32)>,
}

thread_local! {
    /// This thread's buffer: made on first use, never replaced or removed
    /// until the thread ends, so its address is fixed. Every access is a
    /// short `&mut` that calls nothing which accesses it again (no
    /// callback, no recording), on this thread only: [`with_local`],
    /// [`local`], and the pointers kept by [`NetRecord`], [`SpanGuard`]
    /// and [`Iterations`] (none `Send`), dereferenced only in their own
    /// methods.
    static LOCAL: UnsafeCell<Option<Local>> = const { UnsafeCell::new(None) };
}

/// This thread's buffer (made if need be), following the recording under
/// way, or `None` while the thread is ending.
#[inline]
fn local() -> Option<std::ptr::NonNull<Local>> {
    LOCAL
        .try_with(|l| {
            // SAFETY: see `LOCAL`: no other reference to it is alive.
            let l = unsafe { &mut *l.get() }.get_or_insert_with(Local::new);
            // Before any name is looked up: a new recording drops the names.
            l.renew();
            std::ptr::NonNull::from(l)
        })
        .ok()
}

fn with_local<R>(f: impl FnOnce(&mut Local) -> R) -> Option<R> {
    // SAFETY: see `LOCAL`; `f` is trace code that does not reach it again.
    local().map(|mut l| f(unsafe { l.as_mut() }))
}

impl Local {
    fn new() -> Local {
        let shared = Arc::new(Shared {
            chunks: Mutex::new(Vec::new()),
            names: Mutex::new(Names::default()),
            lane: AtomicUsize::new(NEXT_LANE.fetch_add(1, Ordering::Relaxed)),
            label: Mutex::new(None),
            generation: AtomicU64::new(u64::MAX),
        });
        BUFFERS.lock().push(shared.clone());
        Local {
            shared,
            generation: u64::MAX,
            chunk: std::ptr::null(),
            pos: 0,
            cap: 0,
            open: 0,
            last_end: 0,
            last_net: (0, 0),
            net_ids: HashMap::new(),
            recent: Default::default(),
            next_recent: 0,
            str_ids: HashMap::new(),
            cat_ids: Vec::new(),
        }
    }

    /// Drops the records and names (keeping the first chunk when `keep`),
    /// unless some are still open.
    fn clear(&mut self, keep: bool) {
        if self.open > 0 {
            return;
        }
        {
            let mut chunks = self.shared.chunks.lock();
            let keep = (keep as usize).min(chunks.len());
            let rest = chunks.split_off(keep);
            Chunk::recycle(rest);
            match chunks.first() {
                Some(c) => {
                    c.used.store(0, Ordering::Release);
                    self.chunk = &**c;
                    self.cap = c.len;
                }
                None => {
                    self.chunk = std::ptr::null();
                    self.cap = 0;
                }
            }
            self.pos = 0;
        }
        *self.shared.names.lock() = Names::default();
        self.last_net = (0, 0);
        self.net_ids.clear();
        self.recent = Default::default();
        self.str_ids.clear();
        self.cat_ids.clear();
    }

    /// Follows a new recording: older records are dropped (when none is open).
    #[inline]
    fn renew(&mut self) {
        let g = GENERATION.load(Ordering::Acquire);
        if g != self.generation {
            self.clear(true);
            self.generation = g;
            self.shared.generation.store(g, Ordering::Release);
        }
    }

    /// `n` words for a record whose header is `hdr` (written and published
    /// here), or `None` when no memory is left for it. Called through
    /// [`with_local`], which has renewed the buffer.
    #[inline]
    fn reserve(&mut self, n: usize, hdr: u64) -> Option<*const AtomicU64> {
        if self.pos + n > self.cap {
            let size = if self.chunk.is_null() {
                FIRST_CHUNK
            } else {
                CHUNK
            };
            let chunk = Chunk::new(size.max(n))?;
            self.chunk = &*chunk;
            self.cap = chunk.len;
            self.pos = 0;
            self.shared.chunks.lock().push(chunk);
        }
        // SAFETY: `chunk` is owned by `shared.chunks`, which only this
        // thread shrinks (in `clear`, when nothing is open), so it is alive.
        let chunk = unsafe { &*self.chunk };
        let at = &chunk.words()[self.pos..self.pos + n];
        at[0].store(hdr, Ordering::Relaxed);
        self.pos += n;
        chunk.used.store(self.pos, Ordering::Release);
        Some(at.as_ptr())
    }

    fn net_id(&mut self, names: &Arc<NetNames>) -> u32 {
        let key = Arc::as_ptr(names) as usize;
        if self.last_net.0 == key {
            return self.last_net.1;
        }
        let id = match self.net_ids.get(&key) {
            Some(&id) => id,
            None => {
                let mut table = self.shared.names.lock();
                table.nets.push(names.clone());
                let id = (table.nets.len() - 1) as u32;
                self.net_ids.insert(key, id);
                id
            }
        };
        self.last_net = (key, id);
        id
    }

    fn str_id(&mut self, s: &str) -> u32 {
        for (name, id) in &self.recent {
            if name.as_deref() == Some(s) {
                return *id;
            }
        }
        let (name, id) = match self.str_ids.get_key_value(s) {
            Some((name, &id)) => (name.clone(), id),
            None => {
                let name: Arc<str> = s.into();
                let mut table = self.shared.names.lock();
                table.strs.push(name.clone());
                let id = (table.strs.len() - 1) as u32;
                self.str_ids.insert(name.clone(), id);
                (name, id)
            }
        };
        self.recent[self.next_recent] = (Some(name), id);
        self.next_recent = (self.next_recent + 1) % self.recent.len();
        id
    }

    fn cat_id(&mut self, cat: &'static str) -> u32 {
        let key = cat.as_ptr() as usize ^ (cat.len() << 48);
        if let Some(&(_, id)) = self.cat_ids.iter().find(|(k, _)| *k == key) {
            return id;
        }
        let id = self.str_id(cat);
        self.cat_ids.push((key, id));
        id
    }

    fn push_span(&mut self, name: u32, cat: u32, start: u64, end: u64, detail: (u64, u64)) {
        let hdr = header(SPAN, detail.0 << DETAIL_SHIFT, SPAN_WORDS);
        if let Some(p) = self.reserve(SPAN_WORDS, header(OPEN, 0, SPAN_WORDS)) {
            // SAFETY: `reserve` gave SPAN_WORDS words of a live chunk.
            let w = unsafe { std::slice::from_raw_parts(p, SPAN_WORDS) };
            w[1].store(name as u64 | (cat as u64) << 32, Ordering::Relaxed);
            w[2].store(start, Ordering::Relaxed);
            w[3].store(end, Ordering::Relaxed);
            w[4].store(detail.1, Ordering::Relaxed);
            w[0].store(hdr, Ordering::Release);
        }
    }

    fn detail(&mut self, d: &Detail) -> (u64, u64) {
        match d {
            Detail::None => (0, 0),
            Detail::Iteration(i) => (1, *i as u64),
            Detail::Instance { k, of } => (2, (*k as u64) << 32 | (*of as u64 & 0xffff_ffff)),
            Detail::Text(t) => (3, self.str_id(t) as u64),
        }
    }
}

/// Starts recording (or joins the recording under way); returns the start
/// time, the beginning of this recording's window. With `ops`, net runs
/// time each op; without, a net run is one span.
pub fn start(ops: bool) -> u64 {
    let mut depth = DEPTH.lock();
    if depth.0 == 0 {
        GENERATION.fetch_add(1, Ordering::AcqRel);
        prune();
        ON.store(true, Ordering::Release);
    }
    depth.0 += 1;
    if ops {
        depth.1 += 1;
        OPS.store(true, Ordering::Release);
    }
    now()
}

/// Ends one recording (`ops` as it was started); the last one stops
/// recording and drops this thread's records (other threads drop theirs
/// when they next record or end). Without a recording under way, does
/// nothing.
pub fn stop(ops: bool) {
    let mut depth = DEPTH.lock();
    if depth.0 == 0 {
        return;
    }
    depth.0 -= 1;
    if ops && depth.1 > 0 {
        depth.1 -= 1;
        if depth.1 == 0 {
            OPS.store(false, Ordering::Release);
        }
    }
    if depth.0 == 0 {
        OPS.store(false, Ordering::Release);
        depth.1 = 0;
        ON.store(false, Ordering::Release);
        // Only a thread that has a buffer has records to drop.
        let _ = LOCAL.try_with(|l| {
            // SAFETY: see `LOCAL`.
            if let Some(l) = unsafe { &mut *l.get() } {
                l.clear(false);
            }
        });
        prune();
        *LANES.lock() = None;
    }
}

/// Forgets the buffers of threads that have ended.
fn prune() {
    BUFFERS.lock().retain(|b| Arc::strong_count(b) > 1);
}

/// Gives this thread's spans the lane of `label` (threads with the same
/// label share a lane). Only while recording.
pub fn label_thread(label: String) {
    if !on() {
        return;
    }
    let lane = {
        let mut lanes = LANES.lock();
        let lanes = lanes.get_or_insert_with(HashMap::new);
        *lanes
            .entry(label.clone())
            .or_insert_with(|| NEXT_LANE.fetch_add(1, Ordering::Relaxed))
    };
    with_local(|l| {
        l.shared.lane.store(lane, Ordering::Relaxed);
        *l.shared.label.lock() = Some(label);
    });
}

/// This thread's label, if it has one (for the labels of threads it starts).
pub fn thread_label() -> Option<String> {
    if !on() {
        return None;
    }
    LOCAL
        .try_with(|l| {
            // SAFETY: see `LOCAL`.
            let l = unsafe { &*l.get() }.as_ref()?;
            let label = l.shared.label.lock().clone();
            label
        })
        .ok()
        .flatten()
}

/// A span being timed; recorded when dropped (on the thread that made it).
pub struct SpanGuard {
    /// This thread's buffer (see `LOCAL`; the pointer makes the guard
    /// neither `Send` nor `Sync`).
    local: std::ptr::NonNull<Local>,
    name: u32,
    cat: u32,
    start: u64,
    detail: Detail,
    done: bool,
}

impl SpanGuard {
    /// Replaces the span's detail (known only at its end, say).
    pub fn set_detail(&mut self, detail: Detail) {
        self.detail = detail;
    }

    /// Ends the span where the last net run this thread recorded inside it
    /// ended (now, if none did), and returns that end: in a loop of nets,
    /// the next iteration starts there ([`span_str_from`]), so the loop's
    /// spans cost no clock reads of their own.
    pub fn end_after_nets(mut self) -> u64 {
        self.finish(true)
    }

    fn finish(&mut self, after_nets: bool) -> u64 {
        if self.done {
            return self.start;
        }
        self.done = true;
        let detail = std::mem::replace(&mut self.detail, Detail::None);
        let (name, cat, start) = (self.name, self.cat, self.start);
        // SAFETY: see `LOCAL`: the buffer of this thread (the guard is not
        // `Send`), which outlives the guard; no other reference is alive.
        let l = unsafe { self.local.as_mut() };
        l.open -= 1;
        let end = if after_nets && l.last_end > start {
            l.last_end
        } else {
            now()
        };
        let d = l.detail(&detail);
        l.push_span(name, cat, start, end, d);
        end
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        self.finish(false);
    }
}

fn guard(cat: &'static str, name: &str, start: Option<u64>) -> Option<SpanGuard> {
    let mut local = local()?;
    // SAFETY: see `LOCAL`.
    let l = unsafe { local.as_mut() };
    l.open += 1;
    let (name, cat) = (l.str_id(name), l.cat_id(cat));
    Some(SpanGuard {
        local,
        name,
        cat,
        start: start.unwrap_or_else(now),
        detail: Detail::None,
        done: false,
    })
}

/// The spans of a loop's iterations (category `iteration`, detail the
/// iteration's number), their name looked up once per recording rather
/// than once per iteration.
pub struct Iterations<'a> {
    name: &'a str,
    /// This thread's buffer once looked up (see `LOCAL`; the pointer makes
    /// this neither `Send` nor `Sync`: the ids below are this thread's).
    local: Option<std::ptr::NonNull<Local>>,
    /// The recording (generation) the ids belong to, the name's and the
    /// category's ids in this thread's table.
    ids: Option<(u64, u32, u32)>,
}

impl<'a> Iterations<'a> {
    pub fn new(name: &'a str) -> Iterations<'a> {
        Iterations {
            name,
            local: None,
            ids: None,
        }
    }

    /// The span of iteration `i`, from `from` ([`SpanGuard::end_after_nets`]
    /// of the iteration before) or now; `None` when not recording.
    #[inline]
    pub fn begin(&mut self, i: i64, from: Option<u64>) -> Option<SpanGuard> {
        if !on() {
            return None;
        }
        let mut local = match self.local {
            Some(mut l) => {
                // SAFETY: see `LOCAL`: this thread's buffer (`self` is not
                // `Send`), alive until the thread ends.
                unsafe { l.as_mut() }.renew();
                l
            }
            None => *self.local.insert(local()?),
        };
        // SAFETY: see `LOCAL`.
        let l = unsafe { local.as_mut() };
        let (name, cat) = match self.ids {
            // Names are dropped only by a new recording (a new generation)
            // or by `stop` when nothing is open.
            Some((g, name, cat)) if g == l.generation => (name, cat),
            _ => {
                let (name, cat) = (l.str_id(self.name), l.cat_id("iteration"));
                self.ids = Some((l.generation, name, cat));
                (name, cat)
            }
        };
        l.open += 1;
        Some(SpanGuard {
            local,
            name,
            cat,
            start: from.unwrap_or_else(now),
            detail: Detail::Iteration(i),
            done: false,
        })
    }
}

/// A span from now until the guard is dropped, or `None` (nothing made, not
/// even the name) when not recording.
#[inline]
pub fn span(cat: &'static str, name: impl FnOnce() -> String) -> Option<SpanGuard> {
    if !on() {
        return None;
    }
    guard(cat, &name(), None)
}

/// [`span`] named `name` (a loop's iterations allocate nothing for it).
#[inline]
pub fn span_str(cat: &'static str, name: &str) -> Option<SpanGuard> {
    span_str_from(cat, name, None)
}

/// [`span_str`] starting at `start` (the end of the span before it on this
/// thread, from [`SpanGuard::end_after_nets`]) rather than now.
#[inline]
pub fn span_str_from(cat: &'static str, name: &str, start: Option<u64>) -> Option<SpanGuard> {
    if !on() {
        return None;
    }
    guard(cat, name, start)
}

/// Records a span that started at `start` (from [`now`]) and ends now, on
/// this thread's lane (spans recorded by Python).
pub fn record(cat: &'static str, name: String, start: u64, detail: Detail) {
    if !on() {
        return;
    }
    let end = now();
    with_local(|l| {
        let (name, cat) = (l.str_id(&name), l.cat_id(cat));
        let d = l.detail(&detail);
        l.push_span(name, cat, start, end, d);
    });
}

/// One net run being recorded: reserved when the run starts, with a slot
/// for the start of each op and one for the end ([`NetRecord::close`];
/// a record dropped unclosed is closed as failed).
pub struct NetRecord {
    /// This thread's buffer (see `LOCAL`; the pointer makes the record
    /// neither `Send` nor `Sync`).
    local: std::ptr::NonNull<Local>,
    words: *const AtomicU64,
    /// Slots for stamps, and stamps taken.
    cap: usize,
    n: usize,
    timed: bool,
    closed: bool,
    _here: PhantomData<*const ()>,
}

impl NetRecord {
    /// Opens the record of a run of the net named by `names`; with `timed`,
    /// room to time each of its ops. `None` when this thread cannot record.
    pub fn open(names: &Arc<NetNames>, timed: bool) -> Option<NetRecord> {
        let cap = if timed { names.ops.len() + 1 } else { 2 };
        let len = 2 + cap;
        let mut local = local()?;
        // SAFETY: see `LOCAL`.
        let l = unsafe { local.as_mut() };
        let id = l.net_id(names);
        let words = l.reserve(len, header(OPEN, 0, len))?;
        l.open += 1;
        // SAFETY: `reserve` gave `len` words of a live chunk.
        unsafe { &*words.add(1) }.store(id as u64, Ordering::Relaxed);
        Some(NetRecord {
            local,
            words,
            cap,
            n: 0,
            timed,
            closed: false,
            _here: PhantomData,
        })
    }

    /// Takes a stamp (the start of the next op, or of the run).
    #[inline(always)]
    pub fn stamp(&mut self) {
        if self.n < self.cap {
            // SAFETY: slot 2 + n < 2 + cap lies in the reserved record,
            // which stays alive while the record is open.
            unsafe { &*self.words.add(2 + self.n) }.store(now(), Ordering::Relaxed);
            self.n += 1;
        }
    }

    /// Ends the run (the last stamp) and publishes its record.
    pub fn close(mut self, ok: bool) {
        self.finish(ok);
    }

    fn finish(&mut self, ok: bool) {
        if self.closed {
            return;
        }
        self.closed = true;
        if self.n == self.cap {
            self.n -= 1; // keep room for the end (cannot happen: an op per slot)
        }
        let end = now();
        // SAFETY: slot 2 + n < 2 + cap lies in the reserved record.
        unsafe { &*self.words.add(2 + self.n) }.store(end, Ordering::Relaxed);
        self.n += 1;
        // SAFETY: words 0 and 1 are the record's own (see `open`).
        let (hdr, w1) = unsafe { (&*self.words, &*self.words.add(1)) };
        let id = w1.load(Ordering::Relaxed) & 0xffff_ffff;
        w1.store(id | (self.n as u64) << 32, Ordering::Relaxed);
        let flags = if ok { OK } else { 0 } | if self.timed { TIMED } else { 0 };
        hdr.store(header(RUN, flags, 2 + self.cap), Ordering::Release);
        // SAFETY: see `LOCAL`: this thread's buffer (the record is not
        // `Send`), which outlives the record; no other reference is alive.
        let l = unsafe { self.local.as_mut() };
        l.open -= 1;
        l.last_end = end;
    }
}

impl OpClock for NetRecord {
    #[inline(always)]
    fn op_start(&mut self) {
        self.stamp();
    }
}

impl Drop for NetRecord {
    fn drop(&mut self) {
        self.finish(false);
    }
}

/// Slot words a run of `per` stamps may take (each escaped, 3 slots), the
/// word a slot left by the run before may share included.
fn run_words(per: usize) -> usize {
    (3 * per).div_ceil(2) + 1
}

// Iteration states of a [`LoopRecord`].
const IDLE: u8 = 0; // not recorded (not recording, or no room)
const BEGUN: u8 = 1; // started, its net run not recorded yet
const RAN: u8 = 2; // its net run recorded
const DONE: u8 = 3; // ended where its run ended

/// The iterations of a loop whose iteration is one run of one net (a net
/// step with one net), each with its net run and the run's ops, recorded
/// in shared records ([`LOOP`]): an iteration costs its run's stamps (one
/// per op and the end, or the start and the end) as 4-byte differences, and
/// no record, name or thread-local lookup of its own. The trace written
/// has the same events as for [`Iterations`] and [`NetRecord`]s. Use:
/// [`LoopRecord::begin`] where an iteration starts, the net runs with
/// [`LoopRecord::begin_run`], the record as its [`OpClock`] and
/// [`LoopRecord::end_run`] (`Net::run_in_loop`), [`LoopRecord::end`] where
/// the iteration ends as usual; dropped, the record ends an iteration
/// still under way there (an early return).
pub struct LoopRecord<'a> {
    name: &'a str,
    /// This thread's buffer once looked up (see `LOCAL`; the pointer makes
    /// this neither `Send` nor `Sync`).
    local: Option<std::ptr::NonNull<Local>>,
    /// The recording (generation) `name_id` belongs to.
    ids: Option<(u64, u32)>,
    state: u8,
    i: i64,
    /// Where the iteration under way started (while `state` is BEGUN).
    start: u64,
    /// The last stamp (the end of the last run recorded).
    last: u64,
    // The open record: null `words` when none.
    words: *const AtomicU64,
    /// Slot words, the word being filled, whether its low half is, and
    /// its value so far.
    cap: usize,
    pos: usize,
    half: bool,
    cur: u64,
    slots: u64,
    /// Stamps per run, and what the open record is for.
    per: usize,
    timed: bool,
    failed: bool,
    generation: u64,
    net: usize,
    next_i: i64,
    next_cap: usize,
}

impl<'a> LoopRecord<'a> {
    /// The record of a loop step named `name` (nothing is looked up or
    /// reserved until an iteration is recorded).
    pub fn new(name: &'a str) -> LoopRecord<'a> {
        LoopRecord {
            name,
            local: None,
            ids: None,
            state: IDLE,
            i: 0,
            start: 0,
            last: 0,
            words: std::ptr::null(),
            cap: 0,
            pos: 0,
            half: false,
            cur: 0,
            slots: 0,
            per: 0,
            timed: false,
            failed: false,
            generation: 0,
            net: 0,
            next_i: 0,
            next_cap: LOOP_FIRST,
        }
    }

    /// Iteration `i` starts: where the one before it ended, or now.
    #[inline]
    pub fn begin(&mut self, i: i64) {
        if !on() {
            if !self.words.is_null() {
                self.close(None);
            }
            self.state = IDLE;
            return;
        }
        if self.state == DONE {
            self.start = self.last;
        } else {
            if !self.words.is_null() {
                self.close(None);
            }
            self.start = now();
        }
        self.state = BEGUN;
        self.i = i;
    }

    /// The run of the net named by `names` in the iteration begun starts:
    /// `Some(timed)` (whether to time each op: then a stamp per op, else
    /// one now) when it is recorded here, `None` when it is not.
    #[inline]
    pub fn begin_run(&mut self, names: &Arc<NetNames>) -> Option<bool> {
        if self.state != BEGUN {
            return None;
        }
        let timed = ops_on() && !names.ops.is_empty();
        let per = if timed { names.ops.len() + 1 } else { 2 };
        if (self.words.is_null()
            || self.timed != timed
            || self.net != Arc::as_ptr(names) as usize
            || self.next_i != self.i
            || self.failed
            || self.pos + run_words(per) > self.cap
            || GENERATION.load(Ordering::Relaxed) != self.generation)
            && self.reopen(names, timed, per).is_none()
        {
            self.state = IDLE;
            return None;
        }
        self.state = RAN;
        Some(timed)
    }

    /// Closes the open record, if any, and opens one for runs of `names`
    /// from iteration `self.i`, which started at `self.start`.
    #[cold]
    fn reopen(&mut self, names: &Arc<NetNames>, timed: bool, per: usize) -> Option<()> {
        if !self.words.is_null() {
            self.close(None);
        }
        let mut local = match self.local {
            Some(mut l) => {
                // SAFETY: see `LOCAL`: this thread's buffer (`self` is not
                // `Send`), alive until the thread ends.
                unsafe { l.as_mut() }.renew();
                l
            }
            None => *self.local.insert(local()?),
        };
        // SAFETY: see `LOCAL`.
        let l = unsafe { local.as_mut() };
        let name = match self.ids {
            Some((g, name)) if g == l.generation => name,
            _ => {
                let name = l.str_id(self.name);
                self.ids = Some((l.generation, name));
                name
            }
        };
        let net = l.net_id(names);
        let cap = self.next_cap.max(run_words(per));
        let len = LOOP_HEAD + cap;
        let words = l.reserve(len, header(OPEN, 0, len))?;
        l.open += 1;
        self.next_cap = (self.next_cap * 2).min(LOOP_MAX);
        // SAFETY: `reserve` gave `len` words of a live chunk.
        let w = unsafe { std::slice::from_raw_parts(words, LOOP_HEAD) };
        w[1].store(net as u64 | (name as u64) << 32, Ordering::Relaxed);
        w[2].store(self.i as u64, Ordering::Relaxed);
        w[3].store(self.start, Ordering::Relaxed);
        w[4].store(0, Ordering::Relaxed);
        let flags = if timed { TIMED } else { 0 };
        w[0].store(header(LOOP, flags, len), Ordering::Release);
        self.words = words;
        self.cap = cap;
        self.pos = 0;
        self.half = false;
        self.cur = 0;
        self.slots = 0;
        self.last = self.start;
        self.per = per;
        self.timed = timed;
        self.failed = false;
        self.generation = l.generation;
        self.net = Arc::as_ptr(names) as usize;
        self.next_i = self.i;
        Some(())
    }

    #[inline(always)]
    fn word(&self, k: usize) -> &AtomicU64 {
        // SAFETY: `words` is an open record of LOOP_HEAD + cap words, kept
        // alive while open (`Local::open`); callers pass k < LOOP_HEAD + cap.
        unsafe { &*self.words.add(k) }
    }

    /// One slot (room was made for every slot of a run in `begin_run`;
    /// the check keeps a run with more stamps than that inside the record).
    #[inline(always)]
    fn put(&mut self, v: u32) {
        if self.pos >= self.cap {
            return;
        }
        self.slots += 1;
        if self.half {
            self.cur |= (v as u64) << 32;
            self.word(LOOP_HEAD + self.pos)
                .store(self.cur, Ordering::Relaxed);
            self.pos += 1;
            self.half = false;
        } else {
            self.cur = v as u64;
            self.half = true;
        }
    }

    #[cold]
    fn put_long(&mut self, d: u64) {
        self.put(ESC);
        self.put(d as u32);
        self.put((d >> 32) as u32);
    }

    /// A stamp at `t` (a run's start or end, or an op's start).
    #[inline(always)]
    fn stamp_at(&mut self, t: u64) {
        let d = t.wrapping_sub(self.last);
        self.last = t;
        if d < ESC as u64 {
            self.put(d as u32);
        } else {
            self.put_long(d);
        }
    }

    /// A stamp now.
    #[inline(always)]
    pub fn stamp(&mut self) {
        self.stamp_at(now());
    }

    /// The run started by [`LoopRecord::begin_run`] ends now (`ok`: it
    /// succeeded); its stamps are published.
    #[inline]
    pub fn end_run(&mut self, ok: bool) {
        self.end_run_at(now(), ok);
    }

    #[inline(always)]
    fn end_run_at(&mut self, t: u64, ok: bool) {
        if self.state != RAN {
            return;
        }
        self.stamp_at(t);
        if self.half {
            self.word(LOOP_HEAD + self.pos)
                .store(self.cur, Ordering::Relaxed);
        }
        if !ok {
            // Before the run is published: a reader that sees it sees this.
            self.failed = true;
            let hdr = self.word(0).load(Ordering::Relaxed);
            self.word(0).store(hdr | FAILED, Ordering::Release);
        }
        self.next_i = self.i + 1;
        self.word(4).store(self.slots, Ordering::Release);
    }

    /// The iteration ends as usual: where its net run ended (the next one
    /// starts there).
    #[inline]
    pub fn end(&mut self) {
        if self.state == RAN {
            self.state = DONE;
        }
    }

    /// Publishes the open record for good (the last iteration ending at
    /// `end` rather than where its run ended, when given).
    fn close(&mut self, end: Option<u64>) {
        if self.words.is_null() {
            return;
        }
        let mut hdr = self.word(0).load(Ordering::Relaxed);
        if let Some(e) = end {
            self.word(5).store(e, Ordering::Relaxed);
            hdr |= ENDED;
        }
        self.word(0).store(hdr, Ordering::Release);
        self.words = std::ptr::null();
        if let Some(mut l) = self.local {
            // SAFETY: see `LOCAL`.
            let l = unsafe { l.as_mut() };
            l.open -= 1;
            l.last_end = self.last;
        }
    }
}

impl OpClock for LoopRecord<'_> {
    #[inline(always)]
    fn op_start(&mut self) {
        self.stamp();
    }
}

impl Drop for LoopRecord<'_> {
    fn drop(&mut self) {
        match self.state {
            // Left after its run (a stop blob, a failure): it ends now.
            RAN => self.close(Some(now())),
            // Left before a run was recorded: a span of its own.
            BEGUN => {
                let end = now();
                self.close(None);
                let (name, start, i) = (self.name, self.start, self.i);
                let local = self.local.or_else(local);
                if let Some(mut l) = local {
                    // SAFETY: see `LOCAL`.
                    let l = unsafe { l.as_mut() };
                    l.renew();
                    let (name, cat) = (l.str_id(name), l.cat_id("iteration"));
                    l.push_span(name, cat, start, end, (1, i as u64));
                }
            }
            _ => self.close(None),
        }
    }
}

// ---------------------------------------------------------------- writing

fn escape(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

struct Writer {
    out: String,
    scale: Scale,
}

impl Writer {
    /// The op events of one timed net run: op `k` spans `stamps[k]` to
    /// `stamps[k + 1]` (`arg` is scratch space).
    fn ops(&mut self, net: &NetNames, lane: usize, stamps: &[u64], arg: &mut String) {
        for (k, p) in stamps.windows(2).enumerate() {
            let ty = net.ops.get(k).map(|s| &**s).unwrap_or("?");
            arg.clear();
            arg.push_str("\"net\":");
            escape(arg, &net.net);
            let _ = write!(arg, ",\"index\":{k}");
            self.complete(ty, "op", lane, p[0], p[1], arg);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn complete(&mut self, name: &str, cat: &str, lane: usize, start: u64, end: u64, args: &str) {
        let out = &mut self.out;
        if !out.ends_with('[') {
            out.push_str(",\n");
        }
        out.push_str("{\"name\":");
        escape(out, name);
        let (s, e) = (self.scale.ns(start), self.scale.ns(end));
        let d = e.saturating_sub(s);
        let _ = write!(
            out,
            ",\"cat\":\"{cat}\",\"ph\":\"X\",\"pid\":1,\"tid\":{lane},\"ts\":{}.{:03},\"dur\":{}.{:03}",
            s / 1000,
            s % 1000,
            d / 1000,
            d % 1000
        );
        if !args.is_empty() {
            let _ = write!(out, ",\"args\":{{{args}}}");
        }
        out.push('}');
    }
}

/// The JSON array of trace events (complete events, `"ph": "X"`, in
/// microseconds, plus a `thread_name` metadata event per lane) recorded
/// since `since` (from [`start`]) by every thread.
pub fn json_since(since: u64) -> String {
    let generation = GENERATION.load(Ordering::Acquire);
    let buffers: Vec<_> = BUFFERS.lock().clone();
    let mut w = Writer {
        out: String::from("["),
        scale: scale(),
    };
    let mut lanes: HashMap<usize, String> = HashMap::new();
    let mut arg = String::new();
    for b in &buffers {
        if b.generation.load(Ordering::Acquire) != generation {
            continue;
        }
        let chunks = b.chunks.lock();
        let names = b.names.lock();
        let lane = b.lane.load(Ordering::Relaxed);
        let text = |id: u64| names.strs.get(id as usize).map(|s| &**s).unwrap_or("?");
        let mut used_lane = false;
        for c in chunks.iter() {
            let used = c.used.load(Ordering::Acquire).min(c.len);
            let words = &c.words()[..used];
            let mut i = 0;
            while i < used {
                let hdr = words[i].load(Ordering::Acquire);
                let len = (hdr >> 32) as usize;
                if len == 0 || i + len > used {
                    break;
                }
                let rec = &words[i..i + len];
                i += len;
                let word = |k: usize| rec[k].load(Ordering::Relaxed);
                match hdr & 0xff {
                    SPAN => {
                        let (start, end) = (word(2), word(3));
                        if start < since {
                            continue;
                        }
                        used_lane = true;
                        arg.clear();
                        let d = word(4);
                        match (hdr >> DETAIL_SHIFT) & 3 {
                            1 => {
                                let _ = write!(arg, "\"iteration\":{}", d as i64);
                            }
                            2 => {
                                let _ = write!(
                                    arg,
                                    "\"instance\":{},\"of\":{}",
                                    d >> 32,
                                    d & 0xffff_ffff
                                );
                            }
                            3 => {
                                arg.push_str("\"detail\":");
                                escape(&mut arg, text(d));
                            }
                            _ => {}
                        }
                        let ids = word(1);
                        let (name, cat) = (text(ids & 0xffff_ffff), text(ids >> 32));
                        w.complete(name, cat, lane, start, end, &arg);
                    }
                    RUN => {
                        let ids = word(1);
                        let n = ((ids >> 32) as usize).min(len - 2);
                        if n == 0 || word(2) < since {
                            continue;
                        }
                        let Some(net) = names.nets.get((ids & 0xffff_ffff) as usize) else {
                            continue;
                        };
                        used_lane = true;
                        let st: Vec<u64> = (0..n).map(|k| word(2 + k)).collect();
                        let timed = hdr & TIMED != 0;
                        let ran = if timed { n - 1 } else { net.ops.len() };
                        arg.clear();
                        let _ = write!(arg, "\"ops\":{ran}");
                        if hdr & OK == 0 {
                            arg.push_str(",\"failed\":true");
                        }
                        w.complete(&net.net, "net", lane, st[0], st[n - 1], &arg);
                        if !timed {
                            continue;
                        }
                        w.ops(net, lane, &st, &mut arg);
                    }
                    LOOP => {
                        // The slots published, then the flags that go with them.
                        if len < LOOP_HEAD {
                            continue;
                        }
                        let slots =
                            (rec[4].load(Ordering::Acquire) as usize).min(2 * (len - LOOP_HEAD));
                        let hdr = rec[0].load(Ordering::Acquire);
                        let ids = word(1);
                        let Some(net) = names.nets.get((ids & 0xffff_ffff) as usize) else {
                            continue;
                        };
                        let step = text(ids >> 32);
                        let timed = hdr & TIMED != 0;
                        let per = if timed { net.ops.len() + 1 } else { 2 };
                        let stamps = decode_stamps(
                            word(3),
                            (0..slots).map(|k| (word(LOOP_HEAD + k / 2) >> (32 * (k % 2))) as u32),
                        );
                        let (first, mut start) = (word(2) as i64, word(3));
                        // Every run has `per` stamps but the last, when it failed.
                        let runs = stamps.chunks(per);
                        let n = runs.len();
                        for (j, run) in runs.enumerate() {
                            let last = j + 1 == n;
                            let (s, e) = (run[0], run[run.len() - 1]);
                            if s >= since {
                                used_lane = true;
                                let ran = if timed { run.len() - 1 } else { net.ops.len() };
                                arg.clear();
                                let _ = write!(arg, "\"ops\":{ran}");
                                if last && hdr & FAILED != 0 {
                                    arg.push_str(",\"failed\":true");
                                }
                                w.complete(&net.net, "net", lane, s, e, &arg);
                                if timed {
                                    w.ops(net, lane, &run, &mut arg);
                                }
                            }
                            let end = if last && hdr & ENDED != 0 { word(5) } else { e };
                            if start >= since {
                                used_lane = true;
                                arg.clear();
                                let _ = write!(arg, "\"iteration\":{}", first + j as i64);
                                w.complete(step, "iteration", lane, start, end, &arg);
                            }
                            start = e;
                        }
                    }
                    _ => {} // OPEN: a run still under way
                }
            }
        }
        if used_lane {
            let label = b
                .label
                .lock()
                .clone()
                .unwrap_or_else(|| format!("thread {lane}"));
            lanes.entry(lane).or_insert(label);
        }
    }
    let mut out = w.out;
    let mut lanes: Vec<_> = lanes.into_iter().collect();
    lanes.sort();
    for (lane, label) in lanes {
        if !out.ends_with('[') {
            out.push_str(",\n");
        }
        let _ = write!(
            out,
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{lane},\"args\":{{\"name\":"
        );
        escape(&mut out, &label);
        out.push_str("}}");
    }
    out.push(']');
    out
}

/// Serialises tests that switch the process-wide recording.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing_and_on_records_spans_and_net_runs() {
        let _g = TEST_LOCK.lock();
        assert!(span("x", || unreachable!("no name is made when off")).is_none());
        let t0 = start(true);
        {
            let _s = span("step", || "outer".into());
            let names = Arc::new(NetNames {
                net: "n\"et".into(),
                ops: vec!["Add".into(), "Mul".into()],
            });
            let mut rec = NetRecord::open(&names, true).unwrap();
            rec.op_start();
            rec.op_start();
            rec.close(true);
        }
        let json = json_since(t0);
        stop(true);
        assert!(
            json.contains("\"name\":\"outer\",\"cat\":\"step\""),
            "{json}"
        );
        assert!(
            json.contains("\"name\":\"n\\\"et\",\"cat\":\"net\""),
            "{json}"
        );
        assert!(json.contains("\"name\":\"Mul\",\"cat\":\"op\""), "{json}");
        assert!(json.contains("\"thread_name\""), "{json}");
        assert!(!on());
    }

    #[test]
    fn iterations_of_a_loop_of_nets_share_their_boundaries() {
        let _g = TEST_LOCK.lock();
        let t0 = start(true);
        let names = Arc::new(NetNames {
            net: "body".into(),
            ops: vec!["Add".into()],
        });
        let mut from = None;
        let mut loop_spans = Iterations::new("loop");
        for i in 0..3 {
            let span = loop_spans.begin(i, from).unwrap();
            let mut rec = NetRecord::open(&names, true).unwrap();
            rec.op_start();
            rec.close(true);
            from = Some(span.end_after_nets());
        }
        // No net ran in this one: it ends now, after it started.
        let empty = span_str_from("iteration", "empty", from).unwrap();
        let e = empty.end_after_nets();
        assert!(e > from.unwrap());
        let json = json_since(t0);
        stop(true);
        let field = |ev: &str, key: &str| -> f64 {
            let at = ev.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
            let rest = &ev[at..];
            rest[..rest.find([',', '}']).unwrap()].parse().unwrap()
        };
        let spans = |name: &str, cat: &str| -> Vec<(f64, f64)> {
            json.split('\n')
                .filter(|ev| ev.contains(&format!("\"name\":\"{name}\",\"cat\":\"{cat}\"")))
                .map(|ev| (field(ev, "ts"), field(ev, "ts") + field(ev, "dur")))
                .collect()
        };
        let its = spans("loop", "iteration");
        let nets = spans("body", "net");
        assert_eq!((its.len(), nets.len()), (3, 3), "{json}");
        for i in 0..3 {
            assert!(json.contains(&format!("\"iteration\":{i}}}")), "{json}");
        }
        for k in 0..3 {
            // Each iteration ends where its net run ended, holds it, and
            // the next starts where it ended.
            assert!((its[k].1 - nets[k].1).abs() < 1e-6, "{json}");
            assert!(its[k].0 <= nets[k].0, "{json}");
            if k > 0 {
                assert!((its[k].0 - its[k - 1].1).abs() < 1e-6, "{json}");
            }
        }
    }

    /// The complete events of a trace: (name, cat, ts, end, args), times in
    /// ns as written (µs with three decimals).
    fn events(json: &str) -> Vec<(String, String, u64, u64, String)> {
        let num = |ev: &str, key: &str| -> u64 {
            let at = ev.find(&format!("\"{key}\":")).unwrap() + key.len() + 3;
            let rest = &ev[at..];
            let v = &rest[..rest.find([',', '}']).unwrap()];
            let (a, b) = v.split_once('.').unwrap();
            a.parse::<u64>().unwrap() * 1000 + b.parse::<u64>().unwrap()
        };
        let text = |ev: &str, key: &str| -> String {
            let at = ev.find(&format!("\"{key}\":\"")).unwrap() + key.len() + 4;
            let rest = &ev[at..];
            rest[..rest.find('"').unwrap()].to_string()
        };
        json.split(",\n")
            .filter(|ev| ev.contains("\"ph\":\"X\""))
            .map(|ev| {
                let ts = num(ev, "ts");
                let args = ev
                    .find("\"args\":")
                    .map(|a| ev[a + 7..].to_string())
                    .unwrap_or_default();
                (
                    text(ev, "name"),
                    text(ev, "cat"),
                    ts,
                    ts + num(ev, "dur"),
                    args,
                )
            })
            .collect()
    }

    #[test]
    fn loop_stamps_decode_from_differences_and_escapes() {
        // 1000 + 5; then a difference of 2^40 + 3 (escaped: low, high);
        // then one of -3 (wrapping, escaped); then 7.
        let big = (1u64 << 40) + 3;
        let back = 3u64.wrapping_neg();
        let slots = [
            5,
            ESC,
            big as u32,
            (big >> 32) as u32,
            ESC,
            back as u32,
            (back >> 32) as u32,
            7,
        ];
        let t1 = 1005u64;
        let t2 = t1 + big;
        let t3 = t2 - 3;
        assert_eq!(decode_stamps(1000, slots), vec![t1, t2, t3, t3 + 7]);
        // A difference of exactly ESC is escaped too (ESC alone is never one).
        assert_eq!(decode_stamps(0, [ESC, ESC, 0]), vec![ESC as u64]);
    }

    #[test]
    fn a_loop_record_writes_every_iteration_with_its_net_run_and_ops() {
        let _g = TEST_LOCK.lock();
        let names = Arc::new(NetNames {
            net: "body".into(),
            ops: vec!["A".into(), "B".into()],
        });
        // Recorded without ops, and with ops in a nested recording for the
        // first 150 iterations (then off: the runs are one span each).
        let t0 = start(false);
        start(true);
        let n = 300;
        {
            let mut rec = LoopRecord::new("loop");
            for i in 0..n {
                if i == 150 {
                    stop(true);
                }
                rec.begin(i);
                let timed = rec.begin_run(&names).unwrap();
                assert_eq!(timed, i < 150);
                rec.stamp();
                if timed {
                    rec.stamp();
                }
                rec.end_run(true);
                rec.end();
            }
            // The last one fails and the loop is left after it.
            rec.begin(n);
            assert_eq!(rec.begin_run(&names), Some(false));
            rec.stamp();
            rec.end_run(false);
        }
        // An iteration left before its net ran: a span of its own.
        {
            let mut rec = LoopRecord::new("early");
            rec.begin(0);
        }
        let json = json_since(t0);
        stop(false);
        let ev = events(&json);
        let of = |cat: &str| ev.iter().filter(|e| e.1 == cat).collect::<Vec<_>>();
        let (its, nets, ops) = (of("iteration"), of("net"), of("op"));
        assert_eq!(its.len(), n as usize + 2, "{json}");
        assert_eq!(nets.len(), n as usize + 1);
        assert_eq!(ops.len(), 150 * 2);
        let early = its.iter().find(|e| e.0 == "early").unwrap();
        assert_eq!(early.4, "{\"iteration\":0}}");
        let its: Vec<_> = its.into_iter().filter(|e| e.0 == "loop").collect();
        for (k, (it, net)) in its.iter().zip(&nets).enumerate() {
            assert_eq!(it.4, format!("{{\"iteration\":{k}}}}}"));
            assert_eq!(net.0, "body");
            let last = k == n as usize;
            let args = if last {
                "{\"ops\":2,\"failed\":true}}"
            } else {
                "{\"ops\":2}}"
            };
            assert_eq!(net.4, args, "{k}");
            // The iteration holds its run and (but the last, left after
            // its run) ends where the run ended; the next starts there.
            assert!(it.2 <= net.2 && net.3 <= it.3, "{k}: {it:?} {net:?}");
            if !last {
                assert_eq!(it.3, net.3, "{k}");
                assert_eq!(its[k + 1].2, it.3, "{k}");
            }
            if k < 150 {
                let (a, b) = (ops[2 * k], ops[2 * k + 1]);
                assert_eq!((a.0.as_str(), b.0.as_str()), ("A", "B"));
                assert_eq!(a.4, "{\"net\":\"body\",\"index\":0}}");
                assert_eq!(b.4, "{\"net\":\"body\",\"index\":1}}");
                assert_eq!((a.2, a.3, b.3), (net.2, b.2, net.3), "{k}");
            }
        }
    }

    #[test]
    fn a_loop_record_keeps_long_differences_and_follows_a_new_recording() {
        let _g = TEST_LOCK.lock();
        let names = Arc::new(NetNames {
            net: "slow".into(),
            ops: vec!["Wait".into()],
        });
        let t0 = start(true);
        let mut rec = LoopRecord::new("ticks");
        rec.begin(0);
        let t = rec.start;
        // Op 0 of iteration 0 takes 2^40 ticks (an escaped difference),
        // that of iteration 1 10^6.
        let (long, short) = (1u64 << 40, 1_000_000u64);
        let stamps = [t + 10, t + 10 + long, t + 15 + long, t + 15 + long + short];
        for i in 0..2usize {
            if i > 0 {
                rec.begin(i as i64);
            }
            assert_eq!(rec.begin_run(&names), Some(true));
            rec.stamp_at(stamps[2 * i]);
            rec.end_run_at(stamps[2 * i + 1], true);
            rec.end();
        }
        let ev = events(&json_since(t0));
        let ops: Vec<_> = ev.iter().filter(|e| e.1 == "op").collect();
        let its: Vec<_> = ev.iter().filter(|e| e.1 == "iteration").collect();
        assert_eq!((ops.len(), its.len()), (2, 2));
        let (d0, d1) = ((ops[0].3 - ops[0].2) as f64, (ops[1].3 - ops[1].2) as f64);
        let want = long as f64 / short as f64;
        assert!((d0 / d1 / want - 1.0).abs() < 1e-3, "{d0} {d1}");
        assert_eq!(its[1].2, ops[0].3);
        // A new recording (stop, start) while the loop runs: the loop's
        // later iterations go to it, on this thread's lane, and none of the
        // earlier ones.
        stop(true);
        let t1 = start(true);
        for i in 2..5 {
            rec.begin(i);
            assert_eq!(rec.begin_run(&names), Some(true));
            rec.stamp();
            rec.end_run(true);
            rec.end();
        }
        drop(rec);
        let json = json_since(t1);
        stop(true);
        let ev = events(&json);
        let nets = ev.iter().filter(|e| e.1 == "net").count();
        let its: Vec<_> = ev
            .iter()
            .filter(|e| e.1 == "iteration")
            .map(|e| e.4.clone())
            .collect();
        assert_eq!(nets, 3, "{json}");
        assert!(
            its.iter().all(|a| ["2", "3", "4"]
                .iter()
                .any(|k| *a == format!("{{\"iteration\":{k}}}}}"))),
            "{json}"
        );
        assert!(json.contains("\"thread_name\""), "{json}");
    }

    #[test]
    fn a_second_recording_reuses_the_chunks_of_the_first_and_sees_only_its_own_records() {
        let _g = TEST_LOCK.lock();
        let net = |name: &str, ops: usize| {
            Arc::new(NetNames {
                net: name.into(),
                ops: (0..ops).map(|k| format!("{name}{k}").into()).collect(),
            })
        };
        let run = |names: &Arc<NetNames>| {
            let mut rec = NetRecord::open(names, true).unwrap();
            for _ in 0..names.ops.len() {
                rec.op_start();
            }
            rec.close(true);
        };
        let (a, b) = (net("first", 1000), net("second", 500));
        // 1200 runs of 1003 words: the small chunk and three full ones.
        let t0 = start(true);
        for _ in 0..1200 {
            run(&a);
        }
        let json_a = json_since(t0);
        stop(true);
        let spare = SPARE.lock().len();
        assert!(spare >= 2, "{spare} spare chunks");
        // 700 runs of 503 words: the small chunk and one spare.
        let t1 = start(true);
        for _ in 0..700 {
            run(&b);
        }
        let json_b = json_since(t1);
        assert_eq!(SPARE.lock().len(), spare - 1);
        stop(true);
        assert_eq!(json_a.matches("\"name\":\"first\",").count(), 1200);
        assert_eq!(json_a.matches("\"name\":\"first999\",").count(), 1200);
        assert_eq!(json_a.matches("\"cat\":\"op\"").count(), 1200 * 1000);
        assert_eq!(json_b.matches("\"name\":\"second\",").count(), 700);
        assert_eq!(json_b.matches("\"name\":\"second499\",").count(), 700);
        assert_eq!(json_b.matches("\"cat\":\"op\"").count(), 700 * 500);
        assert!(!json_b.contains("first"), "a record of the first recording");
    }

    #[test]
    fn records_span_chunks_and_open_runs_are_skipped() {
        let _g = TEST_LOCK.lock();
        let t0 = start(true);
        let names = Arc::new(NetNames {
            net: "big".into(),
            ops: (0..3000).map(|k| format!("Op{k}").into()).collect(),
        });
        // Enough runs to fill several chunks; one left open while reading.
        for _ in 0..400 {
            let mut rec = NetRecord::open(&names, true).unwrap();
            for _ in 0..3000 {
                rec.op_start();
            }
            rec.close(true);
        }
        let open = NetRecord::open(&names, true).unwrap();
        let json = json_since(t0);
        drop(open);
        stop(true);
        assert_eq!(json.matches("\"name\":\"big\"").count(), 400);
        assert_eq!(json.matches("\"name\":\"Op2999\"").count(), 400);
        // A thread whose first record is a span of its own (as Python
        // records them) names it, though its buffer is new.
        let t1 = start(false);
        std::thread::spawn(|| record("python", "first".into(), now(), Detail::Text("d".into())))
            .join()
            .unwrap();
        record("python", "second".into(), now(), Detail::Iteration(7));
        let json = json_since(t1);
        stop(false);
        assert!(
            json.contains("\"name\":\"first\",\"cat\":\"python\"")
                && json.contains("\"detail\":\"d\""),
            "{json}"
        );
        assert!(
            json.contains("\"name\":\"second\"") && json.contains("\"iteration\":7"),
            "{json}"
        );
        let d = ticks_to_ns(1_000_000);
        assert!(d > 0);
    }
}
