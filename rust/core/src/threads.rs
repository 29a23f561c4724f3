//! Threads: starting them with a typed error, and the size of the
//! data-parallel (rayon) pool that kernels use.
//!
//! Rayon's global pool is built once per process, on first use. A process
//! that shares its machine with others (a Ray actor given two CPUs, say)
//! fixes the size before any kernel runs.

use crate::error::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicU8, Ordering};

/// Starts a named thread; the OS may refuse (a process or user thread
/// limit, no memory for its stack).
pub fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
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

#[cfg(test)]
mod tests {
    use super::*;

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
