//! Per-thread scratch buffers kept between calls (issue 29): working memory
//! that a kernel writes before it reads (Winograd's transformed tiles and
//! their products), taken from this thread's free list rather than
//! allocated and cleared at every call. A convolution at batch 1 on two
//! threads cleared 1.6 MiB of such scratch per thread per call before its
//! first tile (BENCHMARKS.md "Zeroed buffers, Conv's bias, Concat and
//! Winograd's scratch on the pool").

use crate::error::Result;
use crate::num::Float;
use std::cell::RefCell;

/// Buffers of more than this many bytes are freed after use, not kept.
const KEEP_MAX_BYTES: usize = 4 << 20;
/// Free buffers a thread keeps.
const KEEP_COUNT: usize = 4;

thread_local! {
    /// This thread's free buffers (as 8-byte words: aligned for any
    /// [`Float`]).
    static FREE: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` elements of scratch from this thread's free buffers
/// (the smallest that holds them, else a new or grown one), which go back
/// to the list afterwards. The elements are zeros where the buffer is new
/// or grown and else whatever its last user left, so `f` must write each
/// element before it reads it. Nested calls take other buffers. An
/// `OutOfMemory` error for `what` when a buffer cannot be allocated.
pub(crate) fn with_scratch<T: Float, R>(
    len: usize,
    what: &str,
    f: impl FnOnce(&mut [T]) -> R,
) -> Result<R> {
    const { assert!(std::mem::align_of::<T>() <= std::mem::align_of::<u64>()) };
    let bytes = len
        .checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| crate::tensor::alloc_error(usize::MAX, what))?;
    let words = bytes.div_ceil(8);
    let taken = FREE.with(|free| {
        let mut free = free.borrow_mut();
        let fits = (0..free.len())
            .filter(|&i| free[i].len() >= words)
            .min_by_key(|&i| free[i].len());
        fits.or_else(|| (0..free.len()).max_by_key(|&i| free[i].len()))
            .map(|i| free.swap_remove(i))
    });
    let mut buf = taken.unwrap_or_default();
    if buf.len() < words {
        buf.clear();
        buf.try_reserve_exact(words)
            .map_err(|_| crate::tensor::alloc_error(bytes, what))?;
        buf.resize(words, 0);
    }
    // SAFETY: `buf` holds at least `bytes` bytes, aligned to 8 (at least
    // T's alignment, checked above), initialised; every bit pattern is a
    // valid f32 or f64 (the `Float` types).
    let s = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<T>(), len) };
    let r = f(s);
    if buf.len() * 8 <= KEEP_MAX_BYTES {
        FREE.with(|free| {
            let mut free = free.borrow_mut();
            if free.len() < KEEP_COUNT {
                free.push(buf);
            }
        });
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_reused_and_nested_calls_get_their_own() {
        let first = with_scratch::<f32, _>(1000, "a test", |s| {
            assert!(s.iter().all(|&v| v == 0.0), "a new buffer is zeroed");
            s.fill(7.0);
            s.as_ptr() as usize
        })
        .unwrap();
        let (again, inner) = with_scratch::<f32, _>(1000, "a test", |s| {
            assert!(s.iter().all(|&v| v == 7.0), "the kept buffer comes back");
            let inner = with_scratch::<f64, _>(10, "a test", |t| {
                t.fill(1.0);
                t.as_ptr() as usize
            })
            .unwrap();
            assert!(s.iter().all(|&v| v == 7.0), "a nested call has its own");
            (s.as_ptr() as usize, inner)
        })
        .unwrap();
        assert_eq!(first, again);
        assert_ne!(again, inner);
        // Larger than the kept buffer: grown, zeroed.
        with_scratch::<f32, _>(5000, "a test", |s| {
            assert!(s.iter().all(|&v| v == 0.0));
        })
        .unwrap();
    }

    #[test]
    fn a_size_that_cannot_exist_is_an_out_of_memory_error() {
        let e = with_scratch::<f64, _>(usize::MAX / 4, "a test", |_| ()).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::OutOfMemory);
    }
}
