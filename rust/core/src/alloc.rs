//! The global allocator: the system allocator, plus a bounded cache of
//! freed large blocks that the next allocation of the same size reuses.
//!
//! Why: on a virtual machine, the first touch of a fresh page costs a fault,
//! a zeroing and often the host backing it again, and in the Load of a
//! checkpoint those first touches cost several times the copy from the page
//! cache (BENCHMARKS.md, "Checkpoints"). A buffer freed by one Load (a
//! dropped workspace, a replaced blob) and taken again by the next is
//! already resident, so the read is a plain copy.
//!
//! The rules, which keep the cache from changing what a program can see:
//! - Only blocks of at least [`MIN_CACHED`] bytes are kept, at most
//!   `SLOTS` of them and at most the limit in bytes (1 GiB by default;
//!   `FERROCAFFE_BUFFER_CACHE_MIB` in the environment when the first large
//!   block is freed, or [`set_limit`]; 0 turns the cache off and empties it).
//! - A block is reused only for exactly its size and alignment (the layout
//!   it was allocated with, so it goes back to the system allocator exactly
//!   as it came); `alloc_zeroed` zeroes a reused block.
//! - A miss gives back at least as many cached bytes as it allocates, once
//!   the cache holds more than [`SLACK`] bytes, so the cache raises the
//!   process's memory above its previous peak by at most that much; a
//!   block unused for `DECAY` is given back at the next cached allocation
//!   or free (expired blocks are looked for at most once per `SWEEP`).
//! - The lock is only ever tried: a thread that finds it taken goes
//!   straight to the system allocator, so nothing waits on the cache (and a
//!   child forked while another thread held it simply does not use it).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::{Duration, Instant};

/// Blocks smaller than this go straight to the system allocator. Why this
/// low: from 64 KiB up, glibc serves a block by `mmap` or from the top of
/// its heap, which it gives back to the system once enough is free there;
/// an op that frees and takes its 0.5-3 MiB buffers at every run then
/// faults every page of them in again at every run (a 3x3 convolution of
/// 64 channels at 56x56: 1.85 ms in place of 1.33; BENCHMARKS.md, "The
/// allocator's cache from 64 KiB").
pub const MIN_CACHED: usize = 64 << 10;
/// Fresh blocks of at least this many bytes start on a page (Unix).
pub const PAGE_MIN: usize = 1 << 20;
/// The default limit in bytes.
pub const DEFAULT_LIMIT: usize = 1 << 30;
/// Bytes the cache keeps through a miss (see the module docs). Why: a
/// program whose runs allocate buffers of a rotating set of sizes misses
/// for one size while holding blocks of others; giving those back at every
/// miss evicted the very blocks the run wanted next (an LSTM's training
/// step faulted in its 6.5 MB input projection at every run, 2.4 -> 4.4
/// ms; BENCHMARKS.md "The allocator's cache from 64 KiB").
pub const SLACK: usize = 64 << 20;
/// Most blocks kept.
const SLOTS: usize = 256;
/// A block kept longer than this without reuse is given back.
const DECAY: Duration = Duration::from_secs(10);
/// How often expired blocks are looked for (a block is given back between
/// `DECAY` and `DECAY + SWEEP` after its free).
const SWEEP: Duration = Duration::from_secs(1);
/// The limit before it is first read from the environment.
const UNSET: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Slot {
    /// The block's address; 0 for an empty slot.
    addr: usize,
    size: usize,
    align: usize,
    freed: Option<Instant>,
}

const EMPTY: Slot = Slot {
    addr: 0,
    size: 0,
    align: 0,
    freed: None,
};

struct State {
    slots: [Slot; SLOTS],
    bytes: usize,
    /// When the slots were last searched for expired blocks (at most once
    /// per `SWEEP`, so that a take or put is one scan for its size).
    swept: Option<Instant>,
}

/// Blocks taken out of the cache under its lock, given back to the system
/// allocator after the lock is released (a `munmap` can take a while).
struct Evicted {
    blocks: [(usize, usize, usize); SLOTS],
    n: usize,
}

impl Evicted {
    fn new() -> Self {
        Evicted {
            blocks: [(0, 0, 0); SLOTS],
            n: 0,
        }
    }
    fn push(&mut self, s: Slot) {
        self.blocks[self.n] = (s.addr, s.size, s.align);
        self.n += 1;
    }
    fn release(&self, free: unsafe fn(*mut u8, Layout)) {
        for &(addr, size, align) in &self.blocks[..self.n] {
            // The layout is the one the block was allocated with (it was
            // valid then, so it is now).
            if let Ok(layout) = Layout::from_size_align(size, align) {
                // SAFETY: the block was allocated with this layout by the
                // allocator `free` belongs to, and is no longer in the cache
                // nor in use (it was freed by its owner before it was cached).
                unsafe { free(addr as *mut u8, layout) };
            }
        }
    }
}

/// A cache of freed blocks (see the module docs). The global allocator
/// uses one static instance; tests make their own.
pub struct Cache {
    state: Mutex<State>,
    limit: AtomicUsize,
    slack: usize,
}

impl State {
    fn evict(&mut self, i: usize, out: &mut Evicted) {
        let s = std::mem::replace(&mut self.slots[i], EMPTY);
        self.bytes -= s.size;
        out.push(s);
    }
    /// Evicts blocks unused for longer than `DECAY`, if the last look was
    /// at least `SWEEP` ago.
    fn expire(&mut self, now: Instant, out: &mut Evicted) {
        if self
            .swept
            .is_some_and(|t| now.saturating_duration_since(t) < SWEEP)
        {
            return;
        }
        self.swept = Some(now);
        for i in 0..SLOTS {
            let s = self.slots[i];
            if s.addr != 0
                && s.freed
                    .is_some_and(|t| now.saturating_duration_since(t) > DECAY)
            {
                self.evict(i, out);
            }
        }
    }
    /// The index of the oldest block.
    fn oldest(&self) -> Option<usize> {
        (0..SLOTS)
            .filter(|&i| self.slots[i].addr != 0)
            .min_by_key(|&i| self.slots[i].freed)
    }
    /// Evicts the oldest blocks until at most `keep` bytes remain.
    fn shrink_to(&mut self, keep: usize, out: &mut Evicted) {
        while self.bytes > keep {
            match self.oldest() {
                Some(i) => self.evict(i, out),
                None => break,
            }
        }
    }
}

/// Where the allocator gets memory: [`System`](std::alloc::System), except that on Unix
/// fresh blocks of at least [`LINE_MIN`] bytes (alignment at most
/// `malloc`'s) come straight from the C library on a boundary: a page for
/// large uninitialised blocks (at least [`PAGE_MIN`] bytes, `posix_memalign`),
/// so that a checkpoint's payload can be read into them with direct I/O
/// (`storage::ferro`), and a cache line for the rest, so that a tensor's
/// rows start on a line. Why the line: the small GEMM kernel reads 16-float
/// strips of B's rows, and a B that starts 16 bytes past a line splits every
/// other load across two lines: 64x128x64 ran at 96 GF/s against 106 with
/// the line-aligned operand (BENCHMARKS.md, "GEMM: operands on a cache
/// line"), and numpy's arrays start anywhere `malloc` puts them.
/// A block freed or resized by the C library (`free`, `realloc`) may have
/// come from `malloc`, `calloc`, `realloc` or `posix_memalign` alike
/// (POSIX), and `System` itself takes blocks of alignment 16 or less from
/// `malloc` and resizes them with `realloc`, so blocks that cross a size
/// threshold by `realloc` stay valid for both. The alignment is a property
/// of fresh blocks only (a `realloc`, or a large `calloc`, gives `malloc`'s):
/// it is a speed hint, and readers that rely on it check the address.
mod sys {
    use super::{LINE_MIN, PAGE_MIN};
    use std::alloc::{GlobalAlloc, Layout, System};

    /// The page size assumed for large blocks.
    pub const PAGE: usize = 4096;
    /// `malloc`'s alignment on the 64-bit Unix targets (what `System`
    /// relies on to use `malloc`/`realloc` for a layout).
    #[cfg(unix)]
    const MALLOC_ALIGN: usize = 16;

    /// The cache line blocks of [`LINE_MIN`] bytes or more start on.
    pub const LINE: usize = 64;

    /// Blocks the C library serves directly (on a line or a page): at least
    /// [`LINE_MIN`] bytes, of at most `malloc`'s alignment.
    #[cfg(unix)]
    fn ours(size: usize, align: usize) -> bool {
        size >= LINE_MIN && align <= MALLOC_ALIGN
    }

    /// # Safety
    /// `align` a power of two and a multiple of the size of a pointer;
    /// `size` non-zero.
    #[cfg(unix)]
    unsafe fn memalign(align: usize, size: usize) -> *mut u8 {
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the caller's alignment; `p` is written only on success.
        let rc = unsafe { libc::posix_memalign(&mut p, align, size) };
        if rc == 0 {
            p.cast()
        } else {
            std::ptr::null_mut()
        }
    }

    /// # Safety
    /// As [`GlobalAlloc::alloc`].
    pub unsafe fn alloc(layout: Layout) -> *mut u8 {
        #[cfg(unix)]
        if ours(layout.size(), layout.align()) {
            let align = if layout.size() >= PAGE_MIN {
                PAGE
            } else {
                LINE
            };
            // SAFETY: both are powers of two, multiples of a pointer's size.
            return unsafe { memalign(align, layout.size()) };
        }
        // SAFETY: the caller's layout.
        unsafe { System.alloc(layout) }
    }

    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`].
    pub unsafe fn alloc_zeroed(layout: Layout) -> *mut u8 {
        #[cfg(unix)]
        if ours(layout.size(), layout.align()) {
            if layout.size() >= PAGE_MIN {
                // SAFETY: a non-zero size; calloc maps fresh zero pages for
                // large sizes rather than writing them.
                return unsafe { libc::calloc(1, layout.size()) }.cast();
            }
            // SAFETY: as in `alloc`; the block is zeroed before it is
            // handed out.
            let p = unsafe { memalign(LINE, layout.size()) };
            if !p.is_null() {
                // SAFETY: a fresh block of `layout.size()` bytes.
                unsafe { p.write_bytes(0, layout.size()) };
            }
            return p;
        }
        // SAFETY: the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    /// # Safety
    /// `ptr` must be a live block of `layout` from this module.
    pub unsafe fn dealloc(ptr: *mut u8, layout: Layout) {
        #[cfg(unix)]
        if ours(layout.size(), layout.align()) {
            // SAFETY: a block of the C library's allocator (see the module
            // docs), freed once.
            return unsafe { libc::free(ptr.cast()) };
        }
        // SAFETY: a System block of `layout` (small blocks never leave
        // System, except by a realloc, which System does with `realloc`
        // as well).
        unsafe { System.dealloc(ptr, layout) }
    }

    /// # Safety
    /// As [`GlobalAlloc::realloc`], on a block from this module.
    pub unsafe fn realloc(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        #[cfg(unix)]
        if ours(layout.size().max(new_size), layout.align()) {
            // SAFETY: a block of the C library's allocator of at least
            // malloc's alignment, which realloc keeps; new_size is non-zero.
            return unsafe { libc::realloc(ptr.cast(), new_size) }.cast();
        }
        // SAFETY: a System block of `layout` (as in `dealloc`).
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Gives a block back to the system allocator.
///
/// # Safety
/// `ptr` must be a live block of `layout` from [`sys`] that nothing uses.
unsafe fn free_system(ptr: *mut u8, layout: Layout) {
    // SAFETY: the caller's promise.
    unsafe { sys::dealloc(ptr, layout) }
}

/// Whether large blocks from the allocator start on a page (used by the
/// checkpoint loader to choose direct I/O; it checks each address too).
pub const LARGE_BLOCKS_ON_A_PAGE: bool = cfg!(unix);
/// The page size large blocks are aligned to.
pub const PAGE: usize = sys::PAGE;
/// Fresh blocks of at least this many bytes start on a cache line (Unix).
pub const LINE_MIN: usize = 512;

impl Cache {
    /// An empty cache; its limit is read from the environment on first use.
    pub const fn new() -> Self {
        Cache::with_limits(UNSET, SLACK)
    }

    /// An empty cache with a fixed limit in bytes (and [`SLACK`]).
    pub const fn with_limit(limit: usize) -> Self {
        Cache::with_limits(limit, SLACK)
    }

    /// An empty cache with a fixed limit and slack in bytes.
    pub const fn with_limits(limit: usize, slack: usize) -> Self {
        Cache {
            state: Mutex::new(State {
                slots: [EMPTY; SLOTS],
                bytes: 0,
                swept: None,
            }),
            limit: AtomicUsize::new(limit),
            slack,
        }
    }

    fn limit(&self) -> usize {
        let l = self.limit.load(Ordering::Relaxed);
        if l != UNSET {
            return l;
        }
        let l = limit_from_env().unwrap_or(DEFAULT_LIMIT);
        // A concurrent `set_limit` wins.
        match self
            .limit
            .compare_exchange(UNSET, l, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => l,
            Err(now) => now,
        }
    }

    /// Runs `f` on the state if the lock is free (never waits), then gives
    /// back what `f` evicted, outside the lock.
    fn with_state<R>(
        &self,
        free: unsafe fn(*mut u8, Layout),
        f: impl FnOnce(&mut State, &mut Evicted) -> R,
    ) -> Option<R> {
        let mut out = Evicted::new();
        let r = {
            let mut st = match self.state.try_lock() {
                Ok(st) => st,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return None,
            };
            f(&mut st, &mut out)
        };
        out.release(free);
        Some(r)
    }

    /// A cached block of exactly `layout`, most recently freed first; on a
    /// miss, gives back at least `layout.size()` cached bytes beyond the
    /// slack (the caller allocates that much afresh). `free` gives a block back to the
    /// allocator the cache's blocks came from.
    pub fn take(
        &self,
        layout: Layout,
        now: Instant,
        free: unsafe fn(*mut u8, Layout),
    ) -> Option<*mut u8> {
        if layout.size() < MIN_CACHED {
            return None;
        }
        self.with_state(free, |st, out| {
            st.expire(now, out);
            let hit = (0..SLOTS)
                .filter(|&i| {
                    let s = &st.slots[i];
                    s.addr != 0 && s.size == layout.size() && s.align == layout.align()
                })
                .max_by_key(|&i| st.slots[i].freed);
            match hit {
                Some(i) => {
                    let s = std::mem::replace(&mut st.slots[i], EMPTY);
                    st.bytes -= s.size;
                    Some(s.addr as *mut u8)
                }
                None => {
                    let keep = st.bytes.saturating_sub(layout.size()).max(self.slack);
                    st.shrink_to(keep, out);
                    None
                }
            }
        })
        .flatten()
    }

    /// Keeps a freed block; `false` when it does not fit (the caller frees it).
    pub fn put(
        &self,
        ptr: *mut u8,
        layout: Layout,
        now: Instant,
        free: unsafe fn(*mut u8, Layout),
    ) -> bool {
        let limit = self.limit();
        if layout.size() < MIN_CACHED || layout.size() > limit {
            return false;
        }
        self.with_state(free, |st, out| {
            st.expire(now, out);
            st.shrink_to(limit - layout.size(), out);
            let slot = match (0..SLOTS).find(|&i| st.slots[i].addr == 0) {
                Some(i) => i,
                None => match st.oldest() {
                    Some(i) => {
                        st.evict(i, out);
                        i
                    }
                    None => return false,
                },
            };
            st.slots[slot] = Slot {
                addr: ptr as usize,
                size: layout.size(),
                align: layout.align(),
                freed: Some(now),
            };
            st.bytes += layout.size();
            true
        })
        .unwrap_or(false)
    }

    /// Sets the limit (0 turns the cache off), gives back what exceeds it,
    /// and returns the previous limit.
    pub fn set_limit(&self, limit: usize, free: unsafe fn(*mut u8, Layout)) -> usize {
        let limit = limit.min(UNSET - 1);
        let old = self.limit();
        self.limit.store(limit, Ordering::Relaxed);
        // Another thread in the cache at this instant keeps its block; the
        // next `put` or `take` trims to the new limit.
        let _ = self.with_state(free, |st, out| st.shrink_to(limit, out));
        old
    }

    /// Bytes held in the cache now.
    pub fn cached_bytes(&self) -> usize {
        match self.state.try_lock() {
            Ok(st) => st.bytes,
            Err(TryLockError::Poisoned(p)) => p.into_inner().bytes,
            Err(TryLockError::WouldBlock) => 0,
        }
    }
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new()
    }
}

/// `FERROCAFFE_BUFFER_CACHE_MIB` in MiB. This runs inside the allocator
/// (freeing a large block, before the cache's lock is taken): the small
/// allocations of reading the variable go straight to the system allocator.
fn limit_from_env() -> Option<usize> {
    let v = std::env::var_os("FERROCAFFE_BUFFER_CACHE_MIB")?;
    let mib: usize = v.to_str()?.trim().parse().ok()?;
    Some(mib.saturating_mul(1 << 20).min(UNSET - 1))
}

static CACHE: Cache = Cache::new();

/// The process's allocator (installed in `lib.rs`): [`System`](std::alloc::System) (large blocks
/// from the C library on a page, see [`sys`]) with the large-block cache in
/// front.
pub struct FerroAlloc;

// SAFETY: every block handed out was allocated by `sys` with the same
// layout as requested (the cache reuses only exact layouts, and only blocks
// their owners freed); blocks are given back to `sys` with the layout they
// were allocated with; realloc is `sys`'s on a `sys` block.
unsafe impl GlobalAlloc for FerroAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= MIN_CACHED {
            if let Some(p) = CACHE.take(layout, Instant::now(), free_system) {
                return p;
            }
        }
        // SAFETY: the caller's layout, non-zero size (GlobalAlloc's contract).
        unsafe { sys::alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= MIN_CACHED {
            if let Some(p) = CACHE.take(layout, Instant::now(), free_system) {
                // SAFETY: a block of `layout.size()` bytes, now the caller's.
                unsafe { p.write_bytes(0, layout.size()) };
                return p;
            }
        }
        // SAFETY: as in `alloc`.
        unsafe { sys::alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= MIN_CACHED && CACHE.put(ptr, layout, Instant::now(), free_system) {
            return;
        }
        // SAFETY: a `sys` block of this layout (see the impl's comment).
        unsafe { sys::dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: every live block is a `sys` block of `layout`.
        unsafe { sys::realloc(ptr, layout, new_size) }
    }
}

/// Sets the cache's limit in bytes (0 turns it off and empties it);
/// returns the previous limit.
pub fn set_limit(bytes: usize) -> usize {
    CACHE.set_limit(bytes, free_system)
}

/// Bytes of freed blocks the cache holds now.
pub fn cached_bytes() -> usize {
    CACHE.cached_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    unsafe fn sys_free(ptr: *mut u8, layout: Layout) {
        // SAFETY: the tests only cache System blocks of this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    fn block(size: usize, align: usize) -> (*mut u8, Layout) {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { System.alloc(layout) };
        assert!(!p.is_null());
        (p, layout)
    }

    #[test]
    fn large_blocks_start_on_a_page_and_keep_their_bytes_across_realloc() {
        // Through the global allocator (FerroAlloc in this crate's tests).
        let mut v: Vec<u8> = Vec::with_capacity(3 << 20);
        if LARGE_BLOCKS_ON_A_PAGE {
            assert_eq!(v.as_ptr() as usize % PAGE, 0);
        }
        v.extend((0..3 << 20).map(|i: usize| (i % 251) as u8));
        // Grow past the capacity (realloc of a large block), then shrink
        // below the threshold (realloc down to a small block), then grow a
        // small block past the threshold.
        v.reserve_exact(5 << 20);
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        v.truncate(1000);
        v.shrink_to_fit();
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        v.reserve_exact(2 << 20);
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        drop(v);
        let z: Vec<u64> = vec![0; 1 << 18];
        assert!(z.iter().all(|&x| x == 0));
    }

    #[test]
    fn fresh_blocks_from_the_line_threshold_start_on_a_cache_line() {
        // Through the global allocator; many blocks, since malloc alone
        // puts one on a line by chance one time in four.
        let mut keep = Vec::new();
        for i in 0..64 {
            let n = LINE_MIN / 4 + 3 * i;
            let v: Vec<f32> = Vec::with_capacity(n);
            let z: Vec<f32> = vec![0.0; n];
            if cfg!(unix) {
                assert_eq!(v.as_ptr() as usize % 64, 0, "{n} floats");
                assert_eq!(z.as_ptr() as usize % 64, 0, "{n} zeroed floats");
            }
            assert!(z.iter().all(|&x| x == 0.0));
            keep.push((v, z));
        }
        // Growing a small block across the threshold and back keeps its bytes.
        let mut v: Vec<u16> = (0..100).collect();
        v.extend(100..2000);
        v.truncate(50);
        v.shrink_to_fit();
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u16));
    }

    #[test]
    fn a_freed_block_is_reused_for_exactly_its_layout() {
        let c = Cache::with_limits(64 << 20, 0);
        let now = Instant::now();
        let (p, l) = block(3 << 20, 64);
        assert!(c.put(p, l, now, sys_free));
        assert_eq!(c.cached_bytes(), 3 << 20);
        // Another alignment or size is a miss, which gives back at least
        // as many bytes as it asks for.
        let other = Layout::from_size_align(3 << 20, 4096).unwrap();
        assert_eq!(c.take(other, now, sys_free), None);
        assert_eq!(c.cached_bytes(), 0);
        let (p, l) = block(3 << 20, 64);
        assert!(c.put(p, l, now, sys_free));
        let (q, lq) = block(2 << 20, 64);
        assert!(c.put(q, lq, now + Duration::from_millis(1), sys_free));
        assert_eq!(c.take(l, now, sys_free), Some(p));
        assert_eq!(c.take(l, now, sys_free), None);
        // The 3 MiB miss gave back the 2 MiB block.
        assert_eq!(c.cached_bytes(), 0);
        // SAFETY: `p` came back out of the cache: ours again.
        unsafe { sys_free(p, l) };
    }

    #[test]
    fn a_miss_gives_back_only_what_exceeds_the_slack() {
        let c = Cache::with_limits(64 << 20, 4 << 20);
        let t = Instant::now();
        let (a, l) = block(3 << 20, 8);
        assert!(c.put(a, l, t, sys_free));
        // 3 MiB cached, within the slack: a miss keeps it.
        let other = Layout::from_size_align(2 << 20, 8).unwrap();
        assert_eq!(c.take(other, t, sys_free), None);
        assert_eq!(c.cached_bytes(), 3 << 20);
        let (b, _) = block(3 << 20, 8);
        assert!(c.put(b, l, t + Duration::from_millis(1), sys_free));
        // 6 MiB: a 1 MiB miss gives back down to 5 MiB, so the older block.
        let small = Layout::from_size_align(1 << 20, 8).unwrap();
        assert_eq!(c.take(small, t, sys_free), None);
        assert_eq!(c.cached_bytes(), 3 << 20);
        assert_eq!(c.take(l, t, sys_free), Some(b));
        // SAFETY: `b` came back out of the cache: ours again.
        unsafe { sys_free(b, l) };
    }

    #[test]
    fn the_most_recently_freed_block_comes_back_first() {
        let c = Cache::with_limit(64 << 20);
        let now = Instant::now();
        let (a, l) = block(1 << 20, 8);
        let (b, _) = block(1 << 20, 8);
        assert!(c.put(a, l, now, sys_free));
        assert!(c.put(b, l, now + Duration::from_millis(5), sys_free));
        assert_eq!(c.take(l, now, sys_free), Some(b));
        assert_eq!(c.take(l, now, sys_free), Some(a));
        // SAFETY: both came back out of the cache.
        unsafe {
            sys_free(a, l);
            sys_free(b, l);
        }
    }

    #[test]
    fn small_blocks_and_blocks_over_the_limit_are_not_kept() {
        let c = Cache::with_limit(4 << 20);
        let now = Instant::now();
        let (p, l) = block(MIN_CACHED - 1, 8);
        assert!(!c.put(p, l, now, sys_free));
        let (q, lq) = block(5 << 20, 8);
        assert!(!c.put(q, lq, now, sys_free));
        assert_eq!(c.cached_bytes(), 0);
        // SAFETY: refused, so still ours.
        unsafe {
            sys_free(p, l);
            sys_free(q, lq);
        }
    }

    #[test]
    fn the_limit_evicts_the_oldest_blocks() {
        let c = Cache::with_limit(4 << 20);
        let t = Instant::now();
        let blocks: Vec<_> = (0..3).map(|_| block(2 << 20, 8)).collect();
        for (i, &(p, l)) in blocks.iter().enumerate() {
            assert!(c.put(p, l, t + Duration::from_millis(i as u64), sys_free));
        }
        assert_eq!(c.cached_bytes(), 4 << 20);
        let l = blocks[0].1;
        // The first was given back; the other two remain, newest first.
        assert_eq!(c.take(l, t, sys_free), Some(blocks[2].0));
        assert_eq!(c.take(l, t, sys_free), Some(blocks[1].0));
        // SAFETY: both came back out of the cache.
        unsafe {
            sys_free(blocks[1].0, l);
            sys_free(blocks[2].0, l);
        }
    }

    #[test]
    fn blocks_unused_for_the_decay_time_are_given_back() {
        let c = Cache::with_limit(64 << 20);
        let t = Instant::now();
        let (p, l) = block(1 << 20, 8);
        assert!(c.put(p, l, t, sys_free));
        assert_eq!(
            c.take(l, t + DECAY + Duration::from_secs(1), sys_free),
            None
        );
        assert_eq!(c.cached_bytes(), 0);
    }

    #[test]
    fn a_zero_limit_empties_and_turns_off_the_cache() {
        let c = Cache::with_limit(64 << 20);
        let t = Instant::now();
        let (p, l) = block(1 << 20, 8);
        assert!(c.put(p, l, t, sys_free));
        assert_eq!(c.set_limit(0, sys_free), 64 << 20);
        assert_eq!(c.cached_bytes(), 0);
        let (q, lq) = block(1 << 20, 8);
        assert!(!c.put(q, lq, t, sys_free));
        // SAFETY: refused, so still ours.
        unsafe { sys_free(q, lq) };
    }

    #[test]
    fn the_global_allocator_zeroes_a_reused_block_and_keeps_contents_otherwise() {
        // An unusual size, so that no other test's blocks match.
        let n = (3 << 20) + 4096 * 7 + 24;
        let mut v = vec![0xABu8; n];
        v[n - 1] = 7;
        drop(v);
        let z = vec![0u8; n];
        assert!(z.iter().all(|&b| b == 0));
        drop(z);
        let mut w: Vec<u8> = Vec::with_capacity(n);
        w.extend(std::iter::repeat_n(5u8, n));
        assert!(w.iter().all(|&b| b == 5));
        // Growing a block the cache handed out is a plain realloc.
        w.resize(2 * n, 9);
        assert!(w[..n].iter().all(|&b| b == 5) && w[n..].iter().all(|&b| b == 9));
    }
}
