//! Crash-safe file writes (temporary, fsync, rename, directory fsync), the
//! sweep of stale temporaries, and non-blocking opens of regular files.

use super::*;

pub(super) static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Temporaries older than this are removed whatever their owner.
pub(super) const STALE_AGE: Duration = Duration::from_secs(3600);

/// What marks a temporary as ferrocaffe's: `.<name>` + this + `<host>-<pid>-<n>`.
/// No other program makes such names, and the sweeper touches no others.
pub(super) const TEMP_MARK: &str = ".tmp-ferrocaffe-";

pub(super) fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Eight hex digits naming this host in temporaries, so that on a shared file
/// system a pid is only judged on the host that owns it (0 when the host name
/// cannot be read).
pub(super) fn host_tag() -> u32 {
    static TAG: LazyLock<u32> = LazyLock::new(|| {
        fs::read("/proc/sys/kernel/hostname")
            .map(|h| crc32fast::hash(h.trim_ascii()))
            .unwrap_or(0)
    });
    *TAG
}

/// A new temporary name beside `path`: `.<name>.tmp-ferrocaffe-<host>-<pid>-<n>`.
/// Whoever writes through it must rename it over `path` or remove it.
pub fn temp_path_for(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir_of(path).join(format!(
        ".{name}{TEMP_MARK}{:08x}-{}-{}",
        host_tag(),
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The host tag and pid of a temporary of the file `target`, if `file_name`
/// is one (`.<target><mark><host>-<pid>-<n>`).
pub(super) fn temp_owner(file_name: &str, target: &str) -> Option<(u32, u32)> {
    let rest = file_name
        .strip_prefix('.')?
        .strip_prefix(target)?
        .strip_prefix(TEMP_MARK)?;
    let mut parts = rest.split('-');
    let (host, pid, n) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if parts.next().is_some()
        || host.len() != 8
        || !host.bytes().all(|b| b.is_ascii_hexdigit())
        || !digits(pid)
        || !digits(n)
    {
        return None;
    }
    Some((u32::from_str_radix(host, 16).ok()?, pid.parse().ok()?))
}

/// Whether a process of this host is alive: `None` when this platform cannot tell.
pub(super) fn pid_alive(pid: u32) -> Option<bool> {
    if pid == std::process::id() {
        return Some(true);
    }
    if cfg!(target_os = "linux") && Path::new("/proc/self").exists() {
        return Some(Path::new(&format!("/proc/{pid}")).exists());
    }
    None
}

/// Removes the temporaries that interrupted writes of the file at `path` left
/// beside it: those of a process of this host that is no longer alive, and
/// any older than an hour (another host's, whose pid means nothing here).
/// Only temporaries of this very file, with ferrocaffe's names, are looked at.
/// Returns how many were removed. Every save calls it before writing.
pub fn sweep_stale_temporaries(path: &Path) -> Result<usize> {
    let Some(target) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(0);
    };
    let dir = dir_of(path);
    let shown = dir.display().to_string();
    let now = SystemTime::now();
    let me = host_tag();
    let mut removed = 0;
    for entry in fs::read_dir(&dir).map_err(io_error(&shown))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some((host, pid)) = name.to_str().and_then(|n| temp_owner(n, target)) else {
            continue;
        };
        // Not followed: a symlink or FIFO of that name is left alone.
        let Ok(meta) = fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or(Duration::ZERO);
        let dead = host == me && pid_alive(pid) == Some(false);
        if (dead || age >= STALE_AGE) && fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Refuses to replace anything at `path` but a regular file: a save renames
/// its temporary over `path`, which would turn a FIFO, a device node, a
/// symlink or a directory into a plain file.
pub fn check_replaceable(path: &str) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => Ok(()),
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory"
            } else if m.file_type().is_symlink() {
                "a symbolic link"
            } else {
                "not a regular file (a FIFO, socket or device)"
            };
            Err(Error::new(
                ErrorKind::Io,
                format!("{path}: is {what}; a save only replaces regular files"),
            )
            .with_file(path))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(&e, path)),
    }
}

/// Opens `path` for reading if it is a regular file, with its metadata. A
/// FIFO, device, socket or directory is refused without blocking: the open
/// itself does not wait (opening a FIFO waits for a writer, in a call that
/// Ctrl-C cannot interrupt), and the type is checked on the open file, so
/// nothing can be swapped in between.
pub fn open_regular(path: impl AsRef<Path>) -> std::io::Result<(File, fs::Metadata)> {
    #[cfg(unix)]
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?
    };
    #[cfg(not(unix))]
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(format!(
            "not a regular file ({})",
            file_kind(&meta.file_type())
        )));
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // Reads block as usual again (O_NONBLOCK has no effect on regular
        // files on Linux; elsewhere it might).
        // SAFETY: fcntl on a descriptor this function owns.
        unsafe {
            let fd = file.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
    }
    Ok((file, meta))
}

pub(super) fn file_kind(t: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

#[cfg(unix)]
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
pub(super) fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Writes `path` crash-safely: `write` fills a temporary in the same
/// directory, which is fsynced and renamed over `path`, then the directory is
/// fsynced. On any error the temporary is removed and `path` is untouched.
/// Only a regular file (or nothing) at `path` is replaced.
pub(super) fn write_atomically(
    path: &str,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let p = Path::new(path);
    if p.file_name().is_none() {
        return Err(Error::invalid_arg(format!("'{path}' does not name a file")).with_file(path));
    }
    check_replaceable(path)?;
    let dir = dir_of(p);
    // Best effort: a directory that cannot be listed fails below with a
    // better message.
    let _ = sweep_stale_temporaries(p);
    // A killed process whose pid was reused may have left a temporary of the
    // same name behind: take the next sequence number instead of failing.
    let (tmp, file) = loop {
        let tmp = temp_path_for(p);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(&e, path)),
        }
    };
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w).map_err(|e| e.with_file(path))?;
        let file = w.into_inner().map_err(|e| Error::io(e.error(), path))?;
        file.sync_all().map_err(io_error(path))?;
        drop(file);
        // Again: the write may have taken long enough for something else
        // to appear at `path`.
        check_replaceable(path)?;
        fs::rename(&tmp, p).map_err(io_error(path))?;
        sync_dir(&dir).map_err(io_error(path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Writes `data` to `path` crash-safely (see [`save_blobs`]): used for files
/// beside the dbs, such as a checkpoint directory's manifest.
pub fn write_file(path: &str, data: &[u8]) -> Result<()> {
    write_atomically(path, |w| w.write_all(data).map_err(io_error(path)))
}
