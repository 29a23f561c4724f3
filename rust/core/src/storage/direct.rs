//! Direct I/O for the ferro loader: large payloads that are not in the page
//! cache are read with `O_DIRECT`, by the disk straight into the tensor's
//! memory, instead of into the page cache and then copied.
//!
//! Why: a cold Load was bound by the CPU, not the disk. Profiled
//! (BENCHMARKS.md, "Checkpoints"), 69 % of its CPU was the kernel copying
//! freshly read page-cache pages into the tensors, so two readers on two
//! shared vCPUs kept up with about half of what `dd` read. Read directly,
//! the CPU's part of a payload is its CRC.
//!
//! When: a piece of a payload is read directly only when
//! - the file is a version-2 ferro file, whose large numeric payloads start
//!   on a page (`ferro::page_payload`), and the piece's memory starts on a
//!   page too (the allocator puts large blocks there: `alloc::sys`);
//! - fewer than half of the piece's pages are in the page cache (`mincore`
//!   on a mapping of the file: a warm Load still copies from memory, and
//!   pages written but not yet on disk are always taken from the cache);
//! - `FERROCAFFE_DIRECT_IO=1` is set (read when a Load starts).
//!
//! Off by default. Measured on this VM (BENCHMARKS.md, "Checkpoints"),
//! once each load worker read its own contiguous run of pieces through its
//! own descriptor, ordinary cold reads kept up with `dd` as well as direct
//! ones did, and they leave the file in the page cache: a second Load of the
//! same file (another process, an evaluation after training, the peer
//! harness's warm load right after its cold one) is then a copy from
//! memory. Direct reads are for checkpoints that should not take the page
//! cache (larger than it, or read once while other data must stay cached).
//!
//! Anything the direct path cannot do (a file system without `O_DIRECT`, an
//! `EINVAL` for an alignment the device wants bigger, a short read at the
//! end of a truncated file) falls back to ordinary reads for the rest of the
//! piece, which report the same errors as before. The data and its checks
//! are the same either way; what differs is that a payload read directly is
//! not left in the page cache, so loading the same uncached file twice reads
//! the disk twice (as `dd iflag=direct` would).

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes read directly since the process started.
static DIRECT_BYTES: AtomicU64 = AtomicU64::new(0);

/// How many payload bytes Loads have read with direct I/O in this process
/// (to see which path a Load took).
pub fn direct_bytes_read() -> u64 {
    DIRECT_BYTES.load(Ordering::Relaxed)
}

/// The alignment of offsets, lengths and addresses for direct reads.
pub(super) const DIRECT_ALIGN: usize = 4096;

/// Turns direct reads on for this process's Loads (the Rust tests: the
/// environment cannot be changed safely while other tests run).
#[cfg(test)]
pub(super) static FORCE_FOR_TESTS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether direct reads were asked for (`FERROCAFFE_DIRECT_IO=1`; off by
/// default, see the module docs).
pub(super) fn enabled() -> bool {
    #[cfg(test)]
    if FORCE_FOR_TESTS.load(Ordering::Relaxed) {
        return true;
    }
    matches!(
        std::env::var("FERROCAFFE_DIRECT_IO")
            .as_deref()
            .map(str::trim),
        Ok("1") | Ok("true") | Ok("on") | Ok("yes")
    )
}

/// A second, direct descriptor of an open file, and a mapping of the file
/// used only to ask which pages are cached (never read through).
/// (Never made off Linux.)
pub(super) struct Direct {
    #[cfg(target_os = "linux")]
    file: File,
    /// The same file, buffered, without read-ahead (`POSIX_FADV_RANDOM`):
    /// for the small reads of padding between payloads.
    random: File,
    #[cfg(target_os = "linux")]
    map: *mut libc::c_void,
    #[cfg(target_os = "linux")]
    len: usize,
}

// SAFETY: `map` is only ever passed to `mincore` and `munmap`, which touch
// no memory through it; the descriptor is a plain `File`.
unsafe impl Send for Direct {}
unsafe impl Sync for Direct {}

#[cfg(target_os = "linux")]
impl Drop for Direct {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped once.
        unsafe { libc::munmap(self.map, self.len) };
    }
}

impl Direct {
    /// Opens the file behind `file` again with `O_DIRECT` (through
    /// `/proc/self/fd`, so that it is the same file even if the path was
    /// replaced since), and maps it; `None` when any of it is not possible.
    #[cfg(target_os = "linux")]
    pub(super) fn open(file: &File, len: u64) -> Option<Direct> {
        use std::os::unix::io::AsRawFd;
        let len = usize::try_from(len).ok().filter(|&n| n > 0)?;
        let direct = reopen_as(file, libc::O_DIRECT, None)?;
        let random = reopen_as(file, 0, Some(libc::POSIX_FADV_RANDOM))?;
        // SAFETY: a fresh read-only shared mapping of an open file; nothing
        // reads through it (a file truncated later cannot fault us).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        Some(Direct {
            file: direct,
            random,
            map,
            len,
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn open(_file: &File, _len: u64) -> Option<Direct> {
        None
    }

    /// The file, buffered, without read-ahead.
    pub(super) fn random(&self) -> &File {
        &self.random
    }

    /// Whether at least half of the pages of `[at, at + len)` are in the
    /// page cache (`true` when the kernel cannot say: read through it).
    #[cfg(not(target_os = "linux"))]
    pub(super) fn mostly_cached(&self, _at: u64, _len: usize) -> bool {
        true
    }

    /// Whether at least half of the pages of `[at, at + len)` are in the
    /// page cache (`true` when the kernel cannot say: read through it).
    #[cfg(target_os = "linux")]
    pub(super) fn mostly_cached(&self, at: u64, len: usize) -> bool {
        let page = page_size();
        let Ok(at) = usize::try_from(at) else {
            return true;
        };
        if len == 0 || at >= self.len {
            return true;
        }
        let first = at / page * page;
        let end = (at + len).min(self.len);
        let pages = (end - first).div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: `[first, end)` lies inside the mapping (both within
        // `self.len`, `first` a multiple of the page size), and `vec` has one
        // byte per page of it.
        let rc = unsafe {
            libc::mincore(
                self.map.cast::<u8>().add(first).cast(),
                end - first,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return true;
        }
        let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
        resident * 2 >= pages
    }

    /// Reads `buf.len()` bytes at `at` directly, as far as it can: returns
    /// how many bytes were read (all of them, or fewer after a short read
    /// or an error of the direct path, which the caller reads the ordinary
    /// way). `buf`'s address, its length and `at` are multiples of
    /// [`DIRECT_ALIGN`].
    #[cfg(target_os = "linux")]
    pub(super) fn read(&self, buf: &mut [std::mem::MaybeUninit<u8>], at: u64) -> usize {
        use std::os::unix::io::AsRawFd;
        debug_assert!(buf.as_ptr() as usize % DIRECT_ALIGN == 0);
        debug_assert!(buf.len() % DIRECT_ALIGN == 0 && at % DIRECT_ALIGN as u64 == 0);
        let mut done = 0usize;
        while done < buf.len() {
            let Ok(off) = libc::off_t::try_from(at + done as u64) else {
                return done;
            };
            // SAFETY: the destination is the unwritten tail of `buf`, valid
            // for writes of that many bytes; pread writes at most that many.
            let n = unsafe {
                libc::pread(
                    self.file.as_raw_fd(),
                    buf[done..].as_mut_ptr().cast::<libc::c_void>(),
                    buf.len() - done,
                    off,
                )
            };
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                return done; // EOF or an error: the ordinary path says which
            }
            done += n as usize;
            DIRECT_BYTES.fetch_add(n as u64, Ordering::Relaxed);
            if done % DIRECT_ALIGN != 0 {
                // A short read that ends off the alignment (the end of the
                // file): the next direct read could not start there.
                return done / DIRECT_ALIGN * DIRECT_ALIGN;
            }
        }
        done
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn read(&self, _buf: &mut [std::mem::MaybeUninit<u8>], _at: u64) -> usize {
        0
    }
}

/// The file behind `file`, opened again (the same file even if its path
/// was replaced since) for a reader of its own: its own offset and
/// read-ahead state, sequential hint given. `None` where that is not
/// possible (the caller shares `file`).
#[cfg(target_os = "linux")]
pub(super) fn reopen(file: &File) -> Option<File> {
    reopen_as(file, 0, Some(libc::POSIX_FADV_SEQUENTIAL))
}

/// The file behind `file` opened again for reading through
/// `/proc/self/fd` (the same file even if its path was replaced since;
/// checked by device and inode), with extra open `flags` and an optional
/// `posix_fadvise` hint for the whole file; `None` where that fails.
#[cfg(target_os = "linux")]
fn reopen_as(file: &File, flags: libc::c_int, advice: Option<libc::c_int>) -> Option<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::os::unix::io::AsRawFd;
    let own = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()?;
    let (a, b) = (file.metadata().ok()?, own.metadata().ok()?);
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return None;
    }
    if let Some(advice) = advice {
        // SAFETY: a valid open descriptor; only a hint.
        unsafe { libc::posix_fadvise(own.as_raw_fd(), 0, 0, advice) };
    }
    Some(own)
}

#[cfg(not(target_os = "linux"))]
pub(super) fn reopen(_file: &File) -> Option<File> {
    None
}

#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}
