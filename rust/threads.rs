//! Threads: starting them with a typed error, and the size of the
//! data-parallel (rayon) pool that kernels use.
//!
//! Rayon's global pool is built once per process, on first use. A process
//! that shares its machine with others (a Ray actor given two CPUs, say)
//! fixes the size before any kernel runs.

use crate::error::{Error, ErrorKind, Result};

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

/// Builds the global kernel pool with `n` threads. Returns `Ok(false)` when
/// the pool already exists with another size (it cannot be resized), and
/// `Ok(true)` when it now has `n` threads.
pub fn set_num_threads(n: usize) -> Result<bool> {
    if n == 0 {
        return Err(Error::invalid_arg(
            "the kernel pool needs at least one thread (got 0)",
        ));
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("ferrocaffe-kernel-{i}"))
        .build_global()
    {
        Ok(()) => Ok(true),
        Err(_) => Ok(rayon::current_num_threads() == n),
    }
}

/// Threads in the kernel pool (building it with rayon's default size if no
/// kernel has run yet).
pub fn num_threads() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_threads_is_an_error() {
        assert!(set_num_threads(0).is_err());
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
