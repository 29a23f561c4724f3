//! Blob dbs on disk: what Save, Load and DBExists read and write.
//!
//! Two formats, chosen by `db_type`:
//!
//! * `"ferro"` (the default): a self-checking single file. Layout (every
//!   integer little-endian):
//!
//!   ```text
//!   [0, 64)        header: magic "FERROCKP" | u32 version (1) | u32 flags (0)
//!                  | 44 zero bytes | u32 CRC-32 of bytes [0, 60)
//!   [64, I)        payloads, one per blob, each starting at a multiple of 64,
//!                  zero padding in between (checked on load)
//!   [I, I+L)       index (I a multiple of 64), one entry per blob, in file order:
//!                  u32 name length | name (UTF-8) | u8 kind (1 tensor, 2 bytes,
//!                  3 object) | u8 dtype (Caffe2 DataType number, tensors only)
//!                  | u16 0 | u32 ndim | ndim x u64 dims | u64 offset
//!                  | u64 length | u32 CRC-32 of the payload | u32 tag length
//!                  | tag (the Caffe2 type tag, objects only)
//!   [I+L, I+L+48)  trailer: u64 I | u64 L | u64 entry count | u64 file length
//!                  | u32 CRC-32 of the index | u32 CRC-32 of trailer bytes
//!                  [0, 36) | magic "FERROEND"
//!   ```
//!
//!   Payloads: numeric tensors are their elements in row-major order,
//!   little-endian (bool: one byte, 0 or 1), so a payload can be memory-mapped
//!   or read straight into a tensor; string tensors are `u64 length | bytes`
//!   per element; byte-string blobs are their bytes; objects are the
//!   protobuf `BlobProto` from [`BlobObject::serialize`](crate::blob::BlobObject::serialize).
//!   Every byte of the file is covered by a CRC or must be zero padding, so a
//!   truncated, extended or bit-flipped file is rejected, never half-read.
//!   [`map_ferro`] checks a ferro file held in memory (a memory map) and
//!   says where each tensor lies, so that it can be used in place; it reads
//!   the payloads (and checks their CRCs) only when asked to verify.
//!
//! * `"minidb"`: Caffe2's format, byte for byte, so files move both ways: a
//!   sequence of records `native-endian i32 key length | i32 value length |
//!   key | value`, the value a serialized `BlobProto`. Tensors are split into
//!   records keyed `name#%<chunk>`, each with a segment; other blobs are keyed
//!   by their name. It has no checksum: truncation inside a record and
//!   malformed records are detected, bit flips inside data are not.
//!
//! Every write is crash-safe: the db is written to
//! `.<name>.tmp-ferrocaffe-<host>-<pid>-<n>` in the same directory, fsynced,
//! renamed into place and the directory fsynced, so a db that exists is
//! complete. Only a regular file is ever replaced (never a FIFO, a device, a
//! symlink or a directory). When a save of a db starts, the temporaries that
//! dead processes left for that same db are removed; no other file is.
//!
//! Objects (counters, mutexes, cursors, ...) are encoded by their
//! `BlobObject::serialize` and decoded by the function registered for their
//! Caffe2 type tag with [`register_blob_codec`].

use crate::blob::{BlobMutex, BlobValue, Counter};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{BlobProto, Segment, TensorProto};
use crate::tensor::{DataType, Tensor};
use ndarray::ArrayD;
use parking_lot::RwLock;
use prost::Message;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

/// The db type used when none is given by the Python layer.
pub const DEFAULT_DB_TYPE: &str = "ferro";

/// Caffe2's type tag of tensor blobs.
pub const TENSOR_TAG: &str = "Tensor";
/// Caffe2's type tag of `Counter<int64_t>` blobs.
pub const COUNTER_TAG: &str = "std::unique_ptr<Counter<int64_t>>";
/// Caffe2's type tag of mutex blobs.
pub const MUTEX_TAG: &str = "std::unique_ptr<std::mutex>";
/// Caffe2's type tag of byte-string blobs.
pub const STRING_TAG: &str = "std::string";

/// Tensors are split into minidb records of this many elements by default
/// (Caffe2's `caffe2_tensor_chunk_size`).
pub const DEFAULT_CHUNK_SIZE: usize = 1_000_000;

/// Caffe2's separator between a blob name and its chunk number in db keys.
pub const CHUNK_SEPARATOR: &str = "#%";

// ------------------------------------------------------------- db types --

/// A supported db format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DbType {
    /// ferrocaffe's checked, mmap-friendly format (the default).
    Ferro,
    /// Caffe2's minidb format.
    MiniDb,
}

impl DbType {
    /// Parses a `db_type` argument. Unknown names and Caffe2 formats that are
    /// not implemented (leveldb, lmdb, ...) are `InvalidArgument` errors.
    pub fn parse(s: &str) -> Result<DbType> {
        match s {
            "ferro" => Ok(DbType::Ferro),
            "minidb" => Ok(DbType::MiniDb),
            "" => Err(Error::invalid_arg("a db_type is required (supported: 'ferro', 'minidb')")),
            "leveldb" | "lmdb" | "rocksdb" | "zmqdb" | "protodb" => Err(Error::invalid_arg(format!(
                "db_type '{s}' is not supported by ferrocaffe (supported: 'ferro', the default, and 'minidb', Caffe2's file format)"
            ))),
            _ => Err(Error::invalid_arg(format!("unknown db_type '{s}' (supported: 'ferro', 'minidb')"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DbType::Ferro => "ferro",
            DbType::MiniDb => "minidb",
        }
    }
}

// ---------------------------------------------------------------- errors --

fn corrupt(path: &str, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg).with_file(path)
}

fn io_error(path: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(&e, path)
}

// ------------------------------------------------------------- codecs --

/// Decodes a `BlobProto` of one Caffe2 type tag into a blob value.
pub type BlobDecoder = fn(&BlobProto) -> Result<BlobValue>;

static CODECS: LazyLock<RwLock<HashMap<&'static str, BlobDecoder>>> = LazyLock::new(|| {
    let mut m: HashMap<&'static str, BlobDecoder> = HashMap::new();
    m.insert(COUNTER_TAG, decode_counter);
    m.insert(MUTEX_TAG, decode_mutex);
    m.insert(STRING_TAG, decode_string);
    RwLock::new(m)
});

/// Registers (or replaces) the decoder of a Caffe2 type tag. Encoding goes
/// through [`BlobObject::serialize`](crate::blob::BlobObject::serialize),
/// whose `type` must be the same tag. Tensors (`"Tensor"`) are built in and
/// never looked up here.
///
/// An op family registers its decoders from its `schemas()`: that runs once,
/// when the operator registry is first built, and a lookup that misses forces
/// the operator registry before giving up.
pub fn register_blob_codec(type_tag: &'static str, decode: BlobDecoder) {
    CODECS.write().insert(type_tag, decode);
}

fn decoder_for(tag: &str) -> Option<BlobDecoder> {
    let found = CODECS.read().get(tag).copied();
    if found.is_some() {
        return found;
    }
    // Builds the operator registry (no codec lock is held here), which lets
    // op families register their codecs.
    let _ = crate::operator::registered_ops();
    CODECS.read().get(tag).copied()
}

fn bad_object(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

fn decode_counter(p: &BlobProto) -> Result<BlobValue> {
    let t = p
        .tensor
        .as_ref()
        .ok_or_else(|| bad_object("a saved counter has no tensor"))?;
    if t.dims != [1] {
        return Err(bad_object(format!(
            "a saved counter must have dims [1], got {:?}",
            t.dims
        )));
    }
    if t.data_type.unwrap_or(1) != crate::tensor::DataType::Int64 as i32 {
        return Err(bad_object("only int64 counters are supported"));
    }
    if t.int64_data.len() != 1 {
        return Err(bad_object(format!(
            "a saved counter must hold 1 value, got {}",
            t.int64_data.len()
        )));
    }
    Ok(BlobValue::Object(Arc::new(Counter::new(t.int64_data[0]))))
}

fn decode_mutex(_: &BlobProto) -> Result<BlobValue> {
    Ok(BlobValue::Object(Arc::new(BlobMutex::default())))
}

fn decode_string(p: &BlobProto) -> Result<BlobValue> {
    Ok(BlobValue::Bytes(p.content.clone().unwrap_or_default()))
}

/// Decodes a non-tensor `BlobProto` through the registry.
fn decode_object(p: &BlobProto) -> Result<BlobValue> {
    let tag = p.r#type.as_deref().unwrap_or("");
    if let Some(n) = p.content_num_chunks {
        return Err(Error::type_error(format!(
            "blobs of type '{tag}' stored in {n} content chunks cannot be loaded by ferrocaffe"
        )));
    }
    let decode = decoder_for(tag).ok_or_else(|| {
        Error::type_error(format!(
            "no decoder is registered for the blob type '{tag}', so it cannot be loaded"
        ))
    })?;
    decode(p)
}

// ------------------------------------------------- crash-safe file writes --

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Temporaries older than this are removed whatever their owner.
const STALE_AGE: Duration = Duration::from_secs(3600);

/// What marks a temporary as ferrocaffe's: `.<name>` + this + `<host>-<pid>-<n>`.
/// No other program makes such names, and the sweeper touches no others.
const TEMP_MARK: &str = ".tmp-ferrocaffe-";

fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Eight hex digits naming this host in temporaries, so that on a shared file
/// system a pid is only judged on the host that owns it (0 when the host name
/// cannot be read).
fn host_tag() -> u32 {
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
fn temp_owner(file_name: &str, target: &str) -> Option<(u32, u32)> {
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
fn pid_alive(pid: u32) -> Option<bool> {
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

fn file_kind(t: &fs::FileType) -> &'static str {
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
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Writes `path` crash-safely: `write` fills a temporary in the same
/// directory, which is fsynced and renamed over `path`, then the directory is
/// fsynced. On any error the temporary is removed and `path` is untouched.
/// Only a regular file (or nothing) at `path` is replaced.
fn write_atomically(
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

/// Whether a db of this type exists at `path` (Caffe2's DBExists: it can be
/// opened for reading). Its content is not checked; Load does that.
pub fn db_exists(path: &str, db_type: &str) -> Result<bool> {
    DbType::parse(db_type)?;
    Ok(open_regular(path).is_ok())
}

// ------------------------------------------------------------ entries --

/// What a db entry holds, as listed by [`list_db`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Tensor,
    /// A byte-string blob (Caffe2's `std::string`).
    Bytes,
    /// A runtime object (counter, mutex, cursor, ...).
    Object,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Tensor => "tensor",
            EntryKind::Bytes => "bytes",
            EntryKind::Object => "object",
        }
    }
}

/// One blob stored in a db.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryInfo {
    pub name: String,
    pub kind: EntryKind,
    /// Caffe2's type tag: "Tensor", "std::string" or the object's tag.
    pub type_tag: String,
    /// Tensors only.
    pub dtype: Option<DataType>,
    /// Tensors only (empty for 0-dim tensors and other kinds).
    pub shape: Vec<usize>,
    /// Bytes the blob takes in the file: its payload (ferro) or the values of
    /// its records (minidb).
    pub bytes: u64,
}

/// Options of [`save_blobs_with`].
#[derive(Clone, Copy, Debug)]
pub struct SaveOptions {
    /// Tensor elements per minidb record (Caffe2's `chunk_size`): -1 means
    /// the default (1,000,000), 0 one record per tensor. The ferro format
    /// stores every tensor in one piece and ignores it.
    pub chunk_size: i64,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions { chunk_size: -1 }
    }
}

impl SaveOptions {
    /// Elements per chunk, 0 for no chunking.
    fn chunk(&self) -> Result<usize> {
        match self.chunk_size {
            -1 => Ok(DEFAULT_CHUNK_SIZE),
            n if n >= 0 => usize::try_from(n)
                .map_err(|_| Error::invalid_arg(format!("chunk_size {n} is too large"))),
            n => Err(Error::invalid_arg(format!(
                "chunk_size must be -1 (the default), 0 (no chunking) or positive, got {n}"
            ))),
        }
    }
}

/// A blob checked and ready to be written.
enum Prepared<'a> {
    Tensor(&'a Tensor),
    Bytes(&'a [u8]),
    Object { tag: String, proto: Box<BlobProto> },
}

/// Checks names and kinds and serializes objects, before any file is opened.
fn prepare<'a>(
    entries: &[(&'a str, &'a BlobValue)],
    db: DbType,
) -> Result<Vec<(&'a str, Prepared<'a>)>> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(entries.len());
    for &(name, value) in entries {
        if !seen.insert(name) {
            return Err(Error::invalid_arg(format!(
                "the blob name '{name}' is given twice; every saved blob needs its own name"
            ))
            .with_blob(name));
        }
        if db == DbType::MiniDb && name.contains(CHUNK_SEPARATOR) {
            return Err(Error::invalid_arg(format!(
                "the blob name '{name}' contains '{CHUNK_SEPARATOR}', Caffe2's chunk separator, so it cannot be stored in a minidb"
            ))
            .with_blob(name));
        }
        let p = match value {
            BlobValue::Empty => {
                return Err(Error::type_error(format!(
                    "blob '{name}' is empty (it was never written), so there is nothing to save"
                ))
                .with_blob(name))
            }
            BlobValue::Tensor(t) => Prepared::Tensor(t),
            BlobValue::Bytes(b) => Prepared::Bytes(b),
            BlobValue::Object(o) => {
                let proto = o.serialize().ok_or_else(|| {
                    Error::type_error(format!(
                        "blob '{name}' holds a {}, which cannot be saved (no known serializer)",
                        o.kind_name()
                    ))
                    .with_blob(name)
                })?;
                let tag = proto.r#type.clone().unwrap_or_default();
                if tag.is_empty() || tag == TENSOR_TAG {
                    return Err(Error::internal(format!(
                        "the serializer of {} gave the type tag '{tag}'; an object needs its own tag",
                        o.kind_name()
                    ))
                    .with_blob(name));
                }
                Prepared::Object {
                    tag,
                    proto: Box::new(proto),
                }
            }
        };
        out.push((name, p));
    }
    Ok(out)
}

// --------------------------------------------------------- tensor protos --

/// A tensor's elements in row-major order, borrowed when contiguous.
fn flat<T: Clone>(a: &ArrayD<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

type Emit<'e> = dyn FnMut(String, TensorProto) -> Result<()> + 'e;

fn chunks_of<T: Clone>(
    a: &ArrayD<T>,
    base: &TensorProto,
    name: &str,
    chunk: usize,
    fill: impl Fn(&mut TensorProto, &[T]),
    emit: &mut Emit<'_>,
) -> Result<()> {
    let all = flat(a);
    let n = all.len();
    let chunk = if chunk == 0 { n + 1 } else { chunk };
    // Like Caffe2, an empty tensor still gets chunk 0 (its dims must be kept).
    let mut begin = 0;
    while begin < n.max(1) {
        let end = (begin + chunk).min(n);
        let mut p = base.clone();
        p.segment = Some(Segment {
            begin: begin as i64,
            end: end as i64,
        });
        fill(&mut p, &all[begin..end]);
        emit(format!("{name}{CHUNK_SEPARATOR}{}", begin / chunk), p)?;
        begin += chunk;
    }
    Ok(())
}

/// Caffe2's TensorSerializer: one TensorProto per chunk of `chunk` elements
/// (0: a single chunk), each with the full dims and its segment, the data in
/// Caffe2's per-dtype field. `emit` gets the key `name#%<chunk>`.
fn tensor_chunks(name: &str, t: &Tensor, chunk: usize, emit: &mut Emit<'_>) -> Result<()> {
    let base = TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(t.dtype() as i32),
        name: Some(name.to_string()),
        ..Default::default()
    };
    fn widen<T: Copy + Into<i32>>(p: &mut TensorProto, s: &[T]) {
        p.int32_data = s.iter().map(|&x| x.into()).collect();
    }
    match t {
        Tensor::F32(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.float_data = s.to_vec(),
            emit,
        ),
        Tensor::F64(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.double_data = s.to_vec(),
            emit,
        ),
        Tensor::I32(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.int32_data = s.to_vec(),
            emit,
        ),
        Tensor::I64(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.int64_data = s.to_vec(),
            emit,
        ),
        Tensor::Bool(a) => chunks_of(a, &base, name, chunk, widen::<bool>, emit),
        Tensor::U8(a) => chunks_of(a, &base, name, chunk, widen::<u8>, emit),
        Tensor::I8(a) => chunks_of(a, &base, name, chunk, widen::<i8>, emit),
        Tensor::I16(a) => chunks_of(a, &base, name, chunk, widen::<i16>, emit),
        Tensor::U16(a) => chunks_of(a, &base, name, chunk, widen::<u16>, emit),
        Tensor::Str(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.string_data = s.to_vec(),
            emit,
        ),
    }
}

fn bad_data(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

/// A chunk of a tensor: its element range and its proto.
type Seg<'p> = (usize, usize, &'p TensorProto);

/// Copies a repeated field of every chunk (in element order) into one vector,
/// checking every length before allocating and every value's range.
fn gather<S: Clone, T>(
    segs: &[Seg<'_>],
    field: impl Fn(&TensorProto) -> &[S],
    conv: impl Fn(S) -> Option<T>,
    dtype: DataType,
) -> Result<Vec<T>> {
    let mut total = 0;
    for &(b, e, p) in segs {
        let got = field(p).len();
        if got != e - b {
            return Err(bad_data(format!(
                "incorrect data size: the chunk [{b}, {e}) of a {dtype} tensor holds {got} values"
            )));
        }
        total += got;
    }
    let mut out = Vec::with_capacity(total);
    for &(_, _, p) in segs {
        for x in field(p) {
            let v = conv(x.clone())
                .ok_or_else(|| bad_data(format!("a value is out of range for a {dtype} tensor")))?;
            out.push(v);
        }
    }
    Ok(out)
}

/// Types Caffe2 stores in `int32_data` (or, with a global flag, as raw
/// little-endian bytes in `byte_data`).
fn gather_small<T>(
    segs: &[Seg<'_>],
    dtype: DataType,
    from_i32: impl Fn(i32) -> Option<T>,
    from_le: impl Fn(&[u8]) -> Option<T>,
    size: usize,
) -> Result<Vec<T>> {
    let mut total = 0;
    for &(b, e, p) in segs {
        let (got, want) = match &p.byte_data {
            Some(bytes) => (bytes.len(), (e - b) * size),
            None => (p.int32_data.len(), e - b),
        };
        if got != want {
            return Err(bad_data(format!(
                "incorrect data size: the chunk [{b}, {e}) of a {dtype} tensor holds {got} values or bytes, {want} expected"
            )));
        }
        total += e - b;
    }
    let range = || bad_data(format!("a value is out of range for a {dtype} tensor"));
    let mut out = Vec::with_capacity(total);
    for &(_, _, p) in segs {
        match &p.byte_data {
            Some(bytes) => {
                for c in bytes.chunks_exact(size) {
                    out.push(from_le(c).ok_or_else(range)?);
                }
            }
            None => {
                for &x in &p.int32_data {
                    out.push(from_i32(x).ok_or_else(range)?);
                }
            }
        }
    }
    Ok(out)
}

/// Builds a tensor from its TensorProto chunks with Caffe2's accounting:
/// every chunk has the same dims and dtype, and the segments cover every
/// element exactly once. Errors carry no file or blob (the caller adds them).
fn assemble_tensor(chunks: &[TensorProto]) -> Result<Tensor> {
    let first = chunks
        .first()
        .ok_or_else(|| bad_data("a tensor has no records"))?;
    let mut shape = Vec::with_capacity(first.dims.len());
    let mut total: usize = 1;
    for &d in &first.dims {
        let du = usize::try_from(d).map_err(|_| {
            bad_data(format!(
                "the tensor has a negative dimension in dims {:?}",
                first.dims
            ))
        })?;
        total = total
            .checked_mul(du)
            .ok_or_else(|| bad_data(format!("the tensor's dims {:?} overflow", first.dims)))?;
        shape.push(du);
    }
    let code = first.data_type.unwrap_or(1);
    if chunks
        .iter()
        .any(|c| c.dims != first.dims || c.data_type.unwrap_or(1) != code)
    {
        return Err(bad_data(
            "the records of a tensor disagree on its dims or data type",
        ));
    }
    let mut segs: Vec<Seg<'_>> = Vec::with_capacity(chunks.len());
    for c in chunks {
        let (b, e) = match &c.segment {
            None => (0, total),
            Some(s) => {
                let ok = 0 <= s.begin && s.begin <= s.end && (s.end as u64) <= total as u64;
                if !ok {
                    return Err(bad_data(format!(
                        "invalid chunk [{}, {}) of a tensor of {total} elements",
                        s.begin, s.end
                    )));
                }
                (s.begin as usize, s.end as usize)
            }
        };
        segs.push((b, e, c));
    }
    segs.sort_by_key(|s| (s.0, s.1));
    let read: u64 = segs.iter().map(|s| (s.1 - s.0) as u64).sum();
    let mut covered = 0;
    for s in &segs {
        if s.0 < covered {
            return Err(bad_data(format!(
                "the records of a tensor overlap at element {}",
                s.0
            )));
        }
        covered = s.1.max(covered);
    }
    if read != total as u64 || covered != total {
        return Err(bad_data(format!(
            "Data size mismatch: expected {total} elements, read {read}"
        )));
    }
    // Caffe2's legacy "empty tensor without dtype" is a float tensor of shape [0].
    if code == DataType::Undefined as i32 && total == 0 {
        return Tensor::from_vec::<f32>(&[0], vec![]);
    }
    let dt = DataType::from_i32(code)
        .ok_or_else(|| bad_data(format!("unknown tensor data type {code}")))?;
    let t = match dt {
        DataType::Float => Tensor::from_vec(&shape, gather(&segs, |p| &p.float_data, Some, dt)?),
        DataType::Double => Tensor::from_vec(&shape, gather(&segs, |p| &p.double_data, Some, dt)?),
        DataType::Int32 => Tensor::from_vec(&shape, gather(&segs, |p| &p.int32_data, Some, dt)?),
        DataType::Int64 => Tensor::from_vec(&shape, gather(&segs, |p| &p.int64_data, Some, dt)?),
        DataType::String => Tensor::from_vec(&shape, gather(&segs, |p| &p.string_data, Some, dt)?),
        DataType::Bool => {
            let v = gather_small(
                &segs,
                dt,
                |x| match x {
                    0 => Some(false),
                    1 => Some(true),
                    _ => None,
                },
                |b| match b[0] {
                    0 => Some(false),
                    1 => Some(true),
                    _ => None,
                },
                1,
            )?;
            Tensor::from_vec(&shape, v)
        }
        DataType::Uint8 => Tensor::from_vec(
            &shape,
            gather_small(&segs, dt, |x| u8::try_from(x).ok(), |b| Some(b[0]), 1)?,
        ),
        DataType::Byte => {
            // Legacy BYTE tensors hold their bytes in byte_data.
            let v = gather(&segs, |p| p.byte_data.as_deref().unwrap_or(&[]), Some, dt)?;
            Tensor::from_vec(&shape, v)
        }
        DataType::Int8 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| i8::try_from(x).ok(),
                |b| Some(i8::from_le_bytes([b[0]])),
                1,
            )?,
        ),
        DataType::Int16 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| i16::try_from(x).ok(),
                |b| Some(i16::from_le_bytes([b[0], b[1]])),
                2,
            )?,
        ),
        DataType::Uint16 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| u16::try_from(x).ok(),
                |b| Some(u16::from_le_bytes([b[0], b[1]])),
                2,
            )?,
        ),
        DataType::Float16 => {
            return Err(Error::type_error(
                "float16 tensors are not supported by ferrocaffe",
            ))
        }
        DataType::Undefined => return Err(Error::type_error(
            "tensors of serialized objects (data type UNDEFINED) are not supported by ferrocaffe",
        )),
    };
    t.map_err(|e| bad_data(e.into_message()))
}

// ---------------------------------------------------------------- minidb --

fn minidb_put(w: &mut impl Write, path: &str, key: &str, value: &[u8]) -> Result<()> {
    let (Ok(kl), Ok(vl)) = (i32::try_from(key.len()), i32::try_from(value.len())) else {
        return Err(Error::invalid_arg(format!(
            "a minidb record is limited to 2 GiB, the record '{key}' has {} bytes (use a smaller chunk_size, or db_type 'ferro')",
            key.len() + value.len()
        )));
    };
    let io = io_error(path);
    w.write_all(&kl.to_ne_bytes()).map_err(&io)?;
    w.write_all(&vl.to_ne_bytes()).map_err(&io)?;
    w.write_all(key.as_bytes()).map_err(&io)?;
    w.write_all(value).map_err(&io)
}

fn write_minidb(
    w: &mut impl Write,
    path: &str,
    entries: &[(&str, Prepared<'_>)],
    chunk: usize,
) -> Result<()> {
    for (name, p) in entries {
        let name = *name;
        let r = match p {
            Prepared::Tensor(t) => tensor_chunks(name, t, chunk, &mut |key, tp| {
                let bp = BlobProto {
                    name: Some(name.to_string()),
                    r#type: Some(TENSOR_TAG.to_string()),
                    tensor: Some(tp),
                    ..Default::default()
                };
                minidb_put(w, path, &key, &bp.encode_to_vec())
            }),
            Prepared::Bytes(b) => {
                let bp = BlobProto {
                    name: Some(name.to_string()),
                    r#type: Some(STRING_TAG.to_string()),
                    content: Some(b.to_vec()),
                    ..Default::default()
                };
                minidb_put(w, path, name, &bp.encode_to_vec())
            }
            Prepared::Object { proto, .. } => {
                let mut bp = (**proto).clone();
                bp.name = Some(name.to_string());
                if let Some(t) = bp.tensor.as_mut() {
                    t.name = Some(name.to_string());
                }
                minidb_put(w, path, name, &bp.encode_to_vec())
            }
        };
        r.map_err(|e| e.with_blob(name))?;
    }
    Ok(())
}

/// One minidb record: its key, the blob name (the key up to `#%`) and the
/// value (`None` when not selected, then it was skipped, not read).
struct MiniRecord {
    key: String,
    name: String,
    value: Option<Vec<u8>>,
    value_len: u64,
}

fn read_exact_or_corrupt(
    r: &mut impl Read,
    buf: &mut [u8],
    path: &str,
    what: &dyn Fn() -> String,
) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(path, format!("the db is truncated: {}", what()))
        } else {
            Error::io(&e, path)
        }
    })
}

/// Reads the records of a minidb, the values of selected blobs only.
fn read_minidb(path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<MiniRecord>> {
    let (file, meta) = open_regular(path).map_err(io_error(path))?;
    let len = meta.len();
    if len == 0 {
        return Err(corrupt(
            path,
            "the db file is empty (a minidb written by Save holds at least one record)",
        ));
    }
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < len {
        let index = out.len();
        if len - pos < 8 {
            return Err(corrupt(
                path,
                format!("the db is truncated: record #{index} at byte {pos} is cut off (the file has {len} bytes)"),
            ));
        }
        let mut head = [0u8; 8];
        read_exact_or_corrupt(&mut r, &mut head, path, &|| {
            format!("record #{index} at byte {pos} is cut off")
        })?;
        if pos == 0 && head == *FERRO_MAGIC {
            return Err(corrupt(
                path,
                "this is a ferrocaffe checkpoint, not a minidb: load it with db_type 'ferro'",
            ));
        }
        let kl = i32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
        let vl = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
        if kl < 0 || vl < 0 {
            return Err(corrupt(
                path,
                format!("record #{index} at byte {pos} has a negative length: the file is damaged or not a minidb"),
            ));
        }
        let need = 8 + kl as u64 + vl as u64;
        if need > len - pos {
            return Err(corrupt(
                path,
                format!(
                    "the db is truncated: record #{index} at byte {pos} needs {need} bytes but the file ends {} bytes later",
                    len - pos
                ),
            ));
        }
        let mut key = vec![0u8; kl as usize];
        read_exact_or_corrupt(&mut r, &mut key, path, &|| {
            format!("record #{index} at byte {pos} is cut off")
        })?;
        let key = String::from_utf8(key).map_err(|_| {
            corrupt(
                path,
                format!("record #{index} at byte {pos} has a key that is not UTF-8"),
            )
        })?;
        let name = key[..key.find(CHUNK_SEPARATOR).unwrap_or(key.len())].to_string();
        let value = if select(&name) {
            let mut v = vec![0u8; vl as usize];
            read_exact_or_corrupt(&mut r, &mut v, path, &|| {
                format!("record #{index} ('{key}') is cut off")
            })?;
            Some(v)
        } else {
            r.seek_relative(i64::from(vl)).map_err(io_error(path))?;
            None
        };
        out.push(MiniRecord {
            key,
            name,
            value,
            value_len: vl as u64,
        });
        pos += need;
    }
    Ok(out)
}

/// The records of one blob.
enum MiniGroup {
    Tensor(Vec<TensorProto>, u64),
    Other(Box<BlobProto>, u64),
}

/// Parses and groups the selected records by blob name, in file order.
fn group_minidb(path: &str, records: Vec<MiniRecord>) -> Result<Vec<(String, MiniGroup)>> {
    let mut groups: Vec<(String, MiniGroup)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for rec in records {
        let Some(value) = rec.value else { continue };
        let ctx = |e: Error| e.with_blob(&rec.name).with_file(path);
        let bp = BlobProto::decode(value.as_slice()).map_err(|e| {
            ctx(bad_data(format!(
                "cannot parse the record '{}' as a BlobProto: {e}",
                rec.key
            )))
        })?;
        let is_tensor = bp.r#type.as_deref() == Some(TENSOR_TAG);
        match at.get(&rec.name) {
            None => {
                let g = if is_tensor {
                    let t = bp.tensor.ok_or_else(|| {
                        ctx(bad_data(format!(
                            "the tensor record '{}' holds no tensor",
                            rec.key
                        )))
                    })?;
                    MiniGroup::Tensor(vec![t], rec.value_len)
                } else {
                    MiniGroup::Other(Box::new(bp), rec.value_len)
                };
                at.insert(rec.name.clone(), groups.len());
                groups.push((rec.name, g));
            }
            Some(&i) => match (&mut groups[i].1, is_tensor, bp.tensor) {
                (MiniGroup::Tensor(v, bytes), true, Some(t)) => {
                    v.push(t);
                    *bytes += rec.value_len;
                }
                _ => {
                    return Err(ctx(bad_data(format!(
                        "Blob duplicated: the db holds more than one record for '{}'",
                        rec.name
                    ))))
                }
            },
        }
    }
    Ok(groups)
}

fn load_minidb(path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<(String, BlobValue)>> {
    let groups = group_minidb(path, read_minidb(path, select)?)?;
    let mut out = Vec::with_capacity(groups.len());
    for (name, g) in groups {
        let v = match g {
            MiniGroup::Tensor(chunks, _) => assemble_tensor(&chunks).map(BlobValue::Tensor),
            MiniGroup::Other(bp, _) => decode_object(&bp),
        };
        let v = v.map_err(|e| e.with_blob(&name).with_file(path))?;
        out.push((name, v));
    }
    Ok(out)
}

fn list_minidb(path: &str) -> Result<Vec<EntryInfo>> {
    let groups = group_minidb(path, read_minidb(path, &|_| true)?)?;
    let mut out = Vec::with_capacity(groups.len());
    for (name, g) in groups {
        let info = match g {
            MiniGroup::Tensor(chunks, bytes) => {
                let t = &chunks[0];
                let shape = t
                    .dims
                    .iter()
                    .map(|&d| usize::try_from(d))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|_| {
                        corrupt(path, format!("the tensor has negative dims {:?}", t.dims))
                            .with_blob(&name)
                    })?;
                EntryInfo {
                    name,
                    kind: EntryKind::Tensor,
                    type_tag: TENSOR_TAG.to_string(),
                    dtype: DataType::from_i32(t.data_type.unwrap_or(1)),
                    shape,
                    bytes,
                }
            }
            MiniGroup::Other(bp, bytes) => {
                let tag = bp.r#type.unwrap_or_default();
                let kind = if tag == STRING_TAG {
                    EntryKind::Bytes
                } else {
                    EntryKind::Object
                };
                EntryInfo {
                    name,
                    kind,
                    type_tag: tag,
                    dtype: None,
                    shape: vec![],
                    bytes,
                }
            }
        };
        out.push(info);
    }
    Ok(out)
}

// ----------------------------------------------------------------- ferro --

const FERRO_MAGIC: &[u8; 8] = b"FERROCKP";
const FERRO_END_MAGIC: &[u8; 8] = b"FERROEND";
const FERRO_VERSION: u32 = 1;
const HEADER_LEN: u64 = 64;
const TRAILER_LEN: u64 = 48;
const ALIGN: u64 = 64;
const KIND_TENSOR: u8 = 1;
const KIND_BYTES: u8 = 2;
const KIND_OBJECT: u8 = 3;
/// The smallest index entry (empty name and tag, no dims).
const MIN_ENTRY_LEN: u64 = 4 + 4 + 4 + 8 + 8 + 4 + 4;

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Plain numeric element types, written and read as raw bytes.
///
/// # Safety
/// Implemented only for primitive integers and floats: they have no padding
/// bytes and every bit pattern is a valid value, so a slice of them may be
/// viewed as bytes and filled from bytes (see `pod_bytes`, `pod_bytes_mut`).
unsafe trait Pod: Copy + Default + Send + Sync + 'static {
    /// Little-endian to native or back (the identity on little-endian hosts).
    fn swap_le(self) -> Self;
}

macro_rules! pod_int {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive integer (see `Pod`).
        unsafe impl Pod for $t {
            fn swap_le(self) -> Self {
                <$t>::from_le(self)
            }
        }
    )*};
}
pod_int!(u8, i8, i16, u16, i32, i64);

// SAFETY: a primitive float (see `Pod`).
unsafe impl Pod for f32 {
    fn swap_le(self) -> Self {
        f32::from_bits(u32::from_le(self.to_bits()))
    }
}

// SAFETY: a primitive float (see `Pod`).
unsafe impl Pod for f64 {
    fn swap_le(self) -> Self {
        f64::from_bits(u64::from_le(self.to_bits()))
    }
}

/// The memory of a slice of numbers, as bytes (the write fast path).
fn pod_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so all `size_of_val(s)` bytes are
    // initialized; `u8` has alignment 1; the view borrows `s`.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The memory of a slice of numbers, as writable bytes (the read fast path:
/// one read straight into a tensor's buffer).
fn pod_bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `pod_bytes`, and every bit pattern is a valid `T`, so any
    // bytes stored through the view leave valid values; the view borrows `s`
    // mutably, so nothing else can observe it meanwhile.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// Element size of a numeric dtype in the ferro format (`None` for strings).
fn item_size(dt: DataType) -> Option<u64> {
    Some(match dt {
        DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
        DataType::Int16 | DataType::Uint16 => 2,
        DataType::Float | DataType::Int32 => 4,
        DataType::Double | DataType::Int64 => 8,
        _ => return None,
    })
}

/// A tensor dtype the ferro format stores.
fn ferro_dtype(code: u8) -> Option<DataType> {
    let dt = DataType::from_i32(i32::from(code))?;
    (item_size(dt).is_some() || dt == DataType::String).then_some(dt)
}

struct IndexEntry {
    name: String,
    kind: u8,
    dtype: u8,
    dims: Vec<u64>,
    offset: u64,
    length: u64,
    crc: u32,
    tag: String,
}

impl IndexEntry {
    fn shape(&self) -> Vec<usize> {
        // Checked when the index was read (the product fits the file).
        self.dims.iter().map(|&d| d as usize).collect()
    }
    /// `None` on overflow (a damaged index).
    fn checked_numel(&self) -> Option<u64> {
        if self.dims.contains(&0) {
            return Some(0);
        }
        self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
    /// Checked by `check_layout`.
    fn numel(&self) -> u64 {
        self.checked_numel().unwrap_or(0)
    }
}

fn encode_index(entries: &[IndexEntry]) -> Vec<u8> {
    let mut b = Vec::new();
    for e in entries {
        b.extend_from_slice(&(e.name.len() as u32).to_le_bytes());
        b.extend_from_slice(e.name.as_bytes());
        b.push(e.kind);
        b.push(e.dtype);
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&(e.dims.len() as u32).to_le_bytes());
        for d in &e.dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&e.offset.to_le_bytes());
        b.extend_from_slice(&e.length.to_le_bytes());
        b.extend_from_slice(&e.crc.to_le_bytes());
        b.extend_from_slice(&(e.tag.len() as u32).to_le_bytes());
        b.extend_from_slice(e.tag.as_bytes());
    }
    b
}

fn ferro_header() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(FERRO_MAGIC);
    h[8..12].copy_from_slice(&FERRO_VERSION.to_le_bytes());
    // [12, 16) flags and [16, 60) reserved stay zero.
    let crc = crc32fast::hash(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Counts what it writes; payload writes also feed a CRC.
struct Sink<'w, W: Write> {
    w: &'w mut W,
    pos: u64,
    path: &'w str,
}

impl<W: Write> Sink<'_, W> {
    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.w.write_all(b).map_err(io_error(self.path))?;
        self.pos += b.len() as u64;
        Ok(())
    }
    fn put_crc(&mut self, crc: &mut crc32fast::Hasher, b: &[u8]) -> Result<()> {
        crc.update(b);
        self.put(b)
    }
    fn pad(&mut self) -> Result<()> {
        let n = (align_up(self.pos) - self.pos) as usize;
        self.put(&[0u8; ALIGN as usize][..n])
    }
}

/// Bytes read (then checksummed) at a time when loading a payload: small
/// enough to stay in the L2 cache for the CRC, and as large as the reader's
/// buffer, so that reads go straight into the tensor.
const READ_SLICE: usize = 1 << 20;

/// Elements converted per staging buffer on the portable paths.
const STAGE: usize = 1 << 16;

fn write_pod<T: Pod, W: Write>(
    s: &mut Sink<'_, W>,
    crc: &mut crc32fast::Hasher,
    a: &ArrayD<T>,
) -> Result<()> {
    if cfg!(target_endian = "little") {
        if let Some(sl) = a.as_slice() {
            // Fast path: straight from the tensor's memory.
            return s.put_crc(crc, pod_bytes(sl));
        }
    }
    let mut buf: Vec<T> = Vec::with_capacity(STAGE.min(a.len()));
    for &x in a.iter() {
        buf.push(x.swap_le());
        if buf.len() == STAGE {
            s.put_crc(crc, pod_bytes(&buf))?;
            buf.clear();
        }
    }
    s.put_crc(crc, pod_bytes(&buf))
}

fn write_tensor_payload<W: Write>(
    s: &mut Sink<'_, W>,
    crc: &mut crc32fast::Hasher,
    t: &Tensor,
) -> Result<()> {
    match t {
        Tensor::F32(a) => write_pod(s, crc, a),
        Tensor::F64(a) => write_pod(s, crc, a),
        Tensor::I32(a) => write_pod(s, crc, a),
        Tensor::I64(a) => write_pod(s, crc, a),
        Tensor::U8(a) => write_pod(s, crc, a),
        Tensor::I8(a) => write_pod(s, crc, a),
        Tensor::I16(a) => write_pod(s, crc, a),
        Tensor::U16(a) => write_pod(s, crc, a),
        Tensor::Bool(a) => {
            let mut buf: Vec<u8> = Vec::with_capacity(STAGE.min(a.len()));
            for &x in a.iter() {
                buf.push(u8::from(x));
                if buf.len() == STAGE {
                    s.put_crc(crc, &buf)?;
                    buf.clear();
                }
            }
            s.put_crc(crc, &buf)
        }
        Tensor::Str(a) => {
            for x in a.iter() {
                s.put_crc(crc, &(x.len() as u64).to_le_bytes())?;
                s.put_crc(crc, x)?;
            }
            Ok(())
        }
    }
}

fn write_ferro(w: &mut impl Write, path: &str, entries: &[(&str, Prepared<'_>)]) -> Result<()> {
    let mut s = Sink { w, pos: 0, path };
    s.put(&ferro_header())?;
    let mut index = Vec::with_capacity(entries.len());
    for (name, p) in entries {
        s.pad()?;
        let offset = s.pos;
        let mut crc = crc32fast::Hasher::new();
        let (kind, dtype, dims, tag) = match p {
            Prepared::Tensor(t) => {
                write_tensor_payload(&mut s, &mut crc, t).map_err(|e| e.with_blob(name))?;
                (
                    KIND_TENSOR,
                    t.dtype() as i32 as u8,
                    t.shape().iter().map(|&d| d as u64).collect(),
                    String::new(),
                )
            }
            Prepared::Bytes(b) => {
                s.put_crc(&mut crc, b)?;
                (KIND_BYTES, 0, vec![], String::new())
            }
            Prepared::Object { tag, proto } => {
                s.put_crc(&mut crc, &proto.encode_to_vec())?;
                (KIND_OBJECT, 0, vec![], tag.clone())
            }
        };
        let length = s.pos - offset;
        index.push(IndexEntry {
            name: name.to_string(),
            kind,
            dtype,
            dims,
            offset,
            length,
            crc: crc.finalize(),
            tag,
        });
    }
    s.pad()?;
    let index_offset = s.pos;
    let bytes = encode_index(&index);
    s.put(&bytes)?;
    let file_len = s.pos + TRAILER_LEN;
    let mut t = [0u8; TRAILER_LEN as usize];
    t[0..8].copy_from_slice(&index_offset.to_le_bytes());
    t[8..16].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    t[16..24].copy_from_slice(&(index.len() as u64).to_le_bytes());
    t[24..32].copy_from_slice(&file_len.to_le_bytes());
    t[32..36].copy_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    let tcrc = crc32fast::hash(&t[..36]);
    t[36..40].copy_from_slice(&tcrc.to_le_bytes());
    t[40..48].copy_from_slice(FERRO_END_MAGIC);
    s.put(&t)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A bounds-checked reader over the index bytes.
struct Cursor<'b> {
    b: &'b [u8],
    at: usize,
}

impl<'b> Cursor<'b> {
    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len())?;
        let s = &self.b[self.at..end];
        self.at = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| le_u32(s, 0))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|s| le_u64(s, 0))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn entry(&mut self) -> Option<IndexEntry> {
        let name = self.string()?;
        let kind = self.u8()?;
        let dtype = self.u8()?;
        if self.u16()? != 0 {
            return None;
        }
        let ndim = self.u32()? as usize;
        if ndim > (self.b.len() - self.at) / 8 {
            return None;
        }
        let dims = (0..ndim).map(|_| self.u64()).collect::<Option<Vec<_>>>()?;
        let offset = self.u64()?;
        let length = self.u64()?;
        let crc = self.u32()?;
        let tag = self.string()?;
        Some(IndexEntry {
            name,
            kind,
            dtype,
            dims,
            offset,
            length,
            crc,
            tag,
        })
    }
}

/// An open ferro checkpoint whose header, trailer, index and layout checked
/// out; the reader is positioned after the header.
struct FerroFile {
    r: BufReader<File>,
    entries: Vec<IndexEntry>,
    index_offset: u64,
}

/// Whether the first bytes look like a minidb record (for a better message).
fn looks_like_minidb(head: &[u8], len: u64) -> bool {
    if head.len() < 8 {
        return false;
    }
    let kl = i32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
    let vl = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
    kl >= 0 && vl >= 0 && 8 + kl as u64 + vl as u64 <= len
}

/// What a ferro file's trailer says (once checked).
struct Trailer {
    index_offset: u64,
    index_len: u64,
    count: u64,
    index_crc: u32,
}

/// Checks a ferro file's header: `head` is its first `min(len, 64)` bytes,
/// `len` its length.
fn check_header(path: &str, head: &[u8], len: u64) -> Result<()> {
    if len == 0 {
        return Err(corrupt(path, "the checkpoint file is empty"));
    }
    let n = head.len();
    if n < 8 || head[..8] != FERRO_MAGIC[..] {
        let msg = if looks_like_minidb(head, len) {
            "not a ferrocaffe checkpoint (bad magic); it looks like a Caffe2 minidb: load it with db_type 'minidb'"
        } else {
            "not a ferrocaffe checkpoint (bad magic): the file is damaged or of another format"
        };
        return Err(corrupt(path, msg));
    }
    if len < HEADER_LEN + TRAILER_LEN {
        return Err(corrupt(
            path,
            format!(
                "the checkpoint is truncated: it has {len} bytes, the smallest checkpoint has {}",
                HEADER_LEN + TRAILER_LEN
            ),
        ));
    }
    if crc32fast::hash(&head[..60]) != le_u32(head, 60) {
        return Err(corrupt(
            path,
            "the checkpoint's header is damaged (CRC mismatch)",
        ));
    }
    let version = le_u32(head, 8);
    if version != FERRO_VERSION {
        return Err(corrupt(
            path,
            format!(
                "the checkpoint has format version {version}; this build of ferrocaffe reads version {FERRO_VERSION}"
            ),
        ));
    }
    if head[12..60].iter().any(|&b| b != 0) {
        return Err(corrupt(path, "the checkpoint's header has unknown flags"));
    }
    Ok(())
}

/// Checks a ferro file's trailer (its last 48 bytes; the header checked out,
/// so the file has at least 112 bytes) against the file length.
fn check_trailer(path: &str, t: &[u8], len: u64) -> Result<Trailer> {
    if t[40..48] != FERRO_END_MAGIC[..] {
        return Err(corrupt(
            path,
            format!("the checkpoint is truncated or damaged: its trailer is missing (the file has {len} bytes)"),
        ));
    }
    if crc32fast::hash(&t[..36]) != le_u32(t, 36) {
        return Err(corrupt(
            path,
            "the checkpoint's trailer is damaged (CRC mismatch)",
        ));
    }
    let (index_offset, index_len, count, file_len) =
        (le_u64(t, 0), le_u64(t, 8), le_u64(t, 16), le_u64(t, 24));
    if file_len != len {
        return Err(corrupt(
            path,
            format!("the checkpoint is truncated or extended: it should have {file_len} bytes, the file has {len}"),
        ));
    }
    let consistent = index_offset >= HEADER_LEN
        && index_offset % ALIGN == 0
        && index_offset
            .checked_add(index_len)
            .and_then(|x| x.checked_add(TRAILER_LEN))
            == Some(len)
        && count <= index_len / MIN_ENTRY_LEN;
    if !consistent {
        return Err(corrupt(
            path,
            "the checkpoint's trailer is inconsistent with the file",
        ));
    }
    Ok(Trailer {
        index_offset,
        index_len,
        count,
        index_crc: le_u32(t, 32),
    })
}

/// Checks and parses the index bytes the trailer points at, and the layout
/// they describe.
fn parse_index(path: &str, index: &[u8], tr: &Trailer) -> Result<Vec<IndexEntry>> {
    if crc32fast::hash(index) != tr.index_crc {
        return Err(corrupt(
            path,
            "the checkpoint's index is damaged (CRC mismatch)",
        ));
    }
    let mut c = Cursor { b: index, at: 0 };
    let mut entries = Vec::with_capacity(tr.count as usize);
    for i in 0..tr.count {
        let e = c.entry().ok_or_else(|| {
            corrupt(
                path,
                format!("the checkpoint's index entry #{i} is malformed"),
            )
        })?;
        entries.push(e);
    }
    if c.at != index.len() {
        return Err(corrupt(path, "the checkpoint's index has trailing bytes"));
    }
    check_layout(path, &entries, tr.index_offset)?;
    Ok(entries)
}

fn open_ferro(path: &str) -> Result<FerroFile> {
    let (file, meta) = open_regular(path).map_err(io_error(path))?;
    let len = meta.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut head = [0u8; HEADER_LEN as usize];
    let n = len.min(HEADER_LEN) as usize;
    r.read_exact(&mut head[..n]).map_err(io_error(path))?;
    check_header(path, &head[..n], len)?;
    r.seek(SeekFrom::Start(len - TRAILER_LEN))
        .map_err(io_error(path))?;
    let mut t = [0u8; TRAILER_LEN as usize];
    r.read_exact(&mut t).map_err(io_error(path))?;
    let tr = check_trailer(path, &t, len)?;
    r.seek(SeekFrom::Start(tr.index_offset))
        .map_err(io_error(path))?;
    let mut index = vec![0u8; tr.index_len as usize];
    r.read_exact(&mut index).map_err(io_error(path))?;
    let entries = parse_index(path, &index, &tr)?;
    r.seek(SeekFrom::Start(HEADER_LEN))
        .map_err(io_error(path))?;
    Ok(FerroFile {
        r,
        entries,
        index_offset: tr.index_offset,
    })
}

/// Payloads are packed in index order at 64-byte boundaries before the index,
/// names are unique, and every length fits its kind, dtype and shape.
fn check_layout(path: &str, entries: &[IndexEntry], index_offset: u64) -> Result<()> {
    let mut end = HEADER_LEN;
    let mut names = HashSet::new();
    for e in entries {
        let bad = |msg: String| corrupt(path, msg).with_blob(&e.name);
        if !names.insert(e.name.as_str()) {
            return Err(bad(format!(
                "the blob '{}' appears twice in the checkpoint",
                e.name
            )));
        }
        if e.offset != align_up(end)
            || e.offset
                .checked_add(e.length)
                .is_none_or(|x| x > index_offset)
        {
            return Err(bad(format!(
                "the index places blob '{}' at an impossible offset",
                e.name
            )));
        }
        end = e.offset + e.length;
        let ok = match e.kind {
            KIND_TENSOR => match ferro_dtype(e.dtype) {
                None => false,
                Some(dt) => match (e.checked_numel(), item_size(dt)) {
                    (None, _) => false,
                    (Some(n), Some(size)) => n.checked_mul(size) == Some(e.length),
                    (Some(n), None) => n.checked_mul(8).is_some_and(|min| min <= e.length),
                },
            },
            KIND_BYTES => e.dtype == 0 && e.dims.is_empty(),
            KIND_OBJECT => e.dtype == 0 && e.dims.is_empty() && !e.tag.is_empty(),
            _ => false,
        };
        if !ok {
            return Err(bad(format!(
                "the index entry of blob '{}' is inconsistent",
                e.name
            )));
        }
    }
    if align_up(end) != index_offset {
        return Err(corrupt(
            path,
            "the checkpoint's index does not follow its last blob",
        ));
    }
    Ok(())
}

impl FerroFile {
    /// Reads and checks the zero padding before `offset` (the reader is at `pos`).
    fn padding(&mut self, path: &str, pos: u64, offset: u64) -> Result<()> {
        let mut pad = [0u8; ALIGN as usize];
        let pad = &mut pad[..(offset - pos) as usize];
        read_exact_or_corrupt(&mut self.r, pad, path, &|| {
            format!("the file ends inside padding at byte {pos}")
        })?;
        if pad.iter().any(|&b| b != 0) {
            return Err(corrupt(
                path,
                format!("the checkpoint is damaged: nonzero padding after byte {pos}"),
            ));
        }
        Ok(())
    }

    /// Reads one payload into a fresh buffer and checks its CRC.
    fn payload_bytes(&mut self, path: &str, e: &IndexEntry) -> Result<Vec<u8>> {
        let mut v = crate::tensor::default_buffer::<u8>(e.length as usize, "a blob's payload")
            .map_err(|err| err.with_blob(&e.name))?;
        read_exact_or_corrupt(&mut self.r, &mut v, path, &|| cut_off(e))
            .map_err(|err| err.with_blob(&e.name))?;
        check_crc(path, e, crc32fast::hash(&v))?;
        Ok(v)
    }
}

fn cut_off(e: &IndexEntry) -> String {
    format!("the data of blob '{}' is cut off", e.name)
}

fn check_crc(path: &str, e: &IndexEntry, crc: u32) -> Result<()> {
    if crc != e.crc {
        return Err(corrupt(
            path,
            format!("the data of blob '{}' is damaged (CRC mismatch)", e.name),
        )
        .with_blob(&e.name));
    }
    Ok(())
}

// ------------------------------------------------------ parallel loading --

/// Where a loaded payload goes: a numeric tensor's own buffer (read into
/// in place), or bytes to decode.
enum Dest {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    Raw(Vec<u8>),
}

macro_rules! each_dest {
    ($d:expr, $v:ident => $body:expr, raw $r:ident => $raw:expr) => {
        match $d {
            Dest::F32($v) => $body,
            Dest::F64($v) => $body,
            Dest::I32($v) => $body,
            Dest::I64($v) => $body,
            Dest::U8($v) => $body,
            Dest::I8($v) => $body,
            Dest::I16($v) => $body,
            Dest::U16($v) => $body,
            Dest::Raw($r) => $raw,
        }
    };
}

impl Dest {
    /// A buffer for entry `e`: numeric tensors get fresh pages advised to be
    /// huge (4 KiB page faults cost as much as the copy itself).
    /// Allocation failure is an error naming the blob, never an abort.
    fn for_entry(e: &IndexEntry) -> Result<Dest> {
        use crate::tensor::default_buffer;
        let n = e.numel() as usize;
        let what = || format!("the payload of blob '{}'", e.name);
        macro_rules! buf {
            ($t:ty) => {
                default_buffer::<$t>(n, what()).map_err(|err| err.with_blob(&e.name))?
            };
        }
        Ok(match (e.kind, ferro_dtype(e.dtype)) {
            (KIND_TENSOR, Some(DataType::Float)) => Dest::F32(buf!(f32)),
            (KIND_TENSOR, Some(DataType::Double)) => Dest::F64(buf!(f64)),
            (KIND_TENSOR, Some(DataType::Int32)) => Dest::I32(buf!(i32)),
            (KIND_TENSOR, Some(DataType::Int64)) => Dest::I64(buf!(i64)),
            (KIND_TENSOR, Some(DataType::Uint8)) => Dest::U8(buf!(u8)),
            (KIND_TENSOR, Some(DataType::Int8)) => Dest::I8(buf!(i8)),
            (KIND_TENSOR, Some(DataType::Int16)) => Dest::I16(buf!(i16)),
            (KIND_TENSOR, Some(DataType::Uint16)) => Dest::U16(buf!(u16)),
            _ => Dest::Raw(
                default_buffer::<u8>(e.length as usize, what())
                    .map_err(|err| err.with_blob(&e.name))?,
            ),
        })
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        each_dest!(self, v => pod_bytes_mut(v), raw r => r)
    }

    /// The value, once every byte was read and the CRC checked.
    fn into_value(self, path: &str, e: &IndexEntry) -> Result<BlobValue> {
        fn arr<T: Pod>(e: &IndexEntry, mut v: Vec<T>) -> Result<ArrayD<T>> {
            if cfg!(target_endian = "big") {
                for x in &mut v {
                    *x = x.swap_le();
                }
            }
            ArrayD::from_shape_vec(ndarray::IxDyn(&e.shape()), v)
                .map_err(|err| Error::internal(err.to_string()))
        }
        Ok(BlobValue::Tensor(match self {
            Dest::F32(v) => Tensor::F32(arr(e, v)?),
            Dest::F64(v) => Tensor::F64(arr(e, v)?),
            Dest::I32(v) => Tensor::I32(arr(e, v)?),
            Dest::I64(v) => Tensor::I64(arr(e, v)?),
            Dest::U8(v) => Tensor::U8(arr(e, v)?),
            Dest::I8(v) => Tensor::I8(arr(e, v)?),
            Dest::I16(v) => Tensor::I16(arr(e, v)?),
            Dest::U16(v) => Tensor::U16(arr(e, v)?),
            Dest::Raw(r) => return decode_payload(path, e, Cow::Owned(r)),
        }))
    }
}

/// Payload bytes read by one worker at a time: large payloads are split so
/// that both halves of a big tensor load in parallel.
const LOAD_PIECE: usize = 8 << 20;

/// A piece of a payload to read: its place in the file and in the buffer,
/// and, once read, its CRC (combined in order per blob).
struct Piece<'a> {
    entry: usize,
    at: u64,
    dst: &'a mut [u8],
    crc: crc32fast::Hasher,
    result: Result<()>,
}

/// Reads a piece with positioned reads, in slices checksummed while they
/// are still in the cache.
fn read_piece(file: &File, path: &str, e: &IndexEntry, p: &mut Piece<'_>) -> Result<()> {
    let mut at = p.at;
    for slice in p.dst.chunks_mut(READ_SLICE) {
        read_exact_at(file, slice, at).map_err(|err| {
            if err.kind() == std::io::ErrorKind::UnexpectedEof {
                corrupt(path, format!("the db is truncated: {}", cut_off(e))).with_blob(&e.name)
            } else {
                Error::io(&err, path).with_blob(&e.name)
            }
        })?;
        p.crc.update(slice);
        at += slice.len() as u64;
    }
    Ok(())
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, at) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Tells the kernel that `len` bytes from `offset` will be read front to
/// back, soon: a larger read-ahead window, and reading starts at once for
/// the whole range, so the disk streams while the threads copy and check.
/// Only hints.
fn advise_sequential(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::c_int;
        use std::os::unix::io::AsRawFd;
        extern "C" {
            fn posix_fadvise(fd: c_int, offset: i64, len: i64, advice: c_int) -> c_int;
        }
        const POSIX_FADV_SEQUENTIAL: c_int = 2;
        const POSIX_FADV_WILLNEED: c_int = 3;
        let (offset, len) = (offset as i64, len as i64);
        // SAFETY: a valid open descriptor; the calls only give hints.
        unsafe {
            posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
            posix_fadvise(file.as_raw_fd(), offset, len, POSIX_FADV_WILLNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Checks that the bytes between payloads, and between the last one and
/// the index, are zero (small positioned reads).
fn check_gaps(file: &File, path: &str, entries: &[IndexEntry], index_offset: u64) -> Result<()> {
    let mut pos = HEADER_LEN;
    let ends = entries
        .iter()
        .map(|e| (e.offset, e.offset + e.length))
        .chain(std::iter::once((index_offset, index_offset)));
    for (start, end) in ends {
        if start > pos {
            let mut pad = [0u8; ALIGN as usize];
            let pad = &mut pad[..(start - pos) as usize];
            read_exact_at(file, pad, pos).map_err(|err| {
                if err.kind() == std::io::ErrorKind::UnexpectedEof {
                    corrupt(path, format!("the file ends inside padding at byte {pos}"))
                } else {
                    Error::io(&err, path)
                }
            })?;
            check_zero_padding(path, pad, pos)?;
        }
        pos = end;
    }
    Ok(())
}

/// Decodes a payload whose CRC checked out: a bool or string tensor, a byte
/// string or an object.
fn decode_payload(path: &str, e: &IndexEntry, bytes: Cow<'_, [u8]>) -> Result<BlobValue> {
    let bad = |msg: String| corrupt(path, msg).with_blob(&e.name);
    Ok(match e.kind {
        KIND_TENSOR => {
            let dt =
                ferro_dtype(e.dtype).ok_or_else(|| bad(format!("unknown dtype {}", e.dtype)))?;
            BlobValue::Tensor(match dt {
                DataType::Bool => {
                    let v = bytes
                        .iter()
                        .map(|&b| match b {
                            0 => Some(false),
                            1 => Some(true),
                            _ => None,
                        })
                        .collect::<Option<Vec<bool>>>()
                        .ok_or_else(|| {
                            bad("a bool tensor holds a byte other than 0 or 1".to_string())
                        })?;
                    Tensor::from_vec(&e.shape(), v)?
                }
                DataType::String => {
                    let mut c = Cursor { b: &bytes, at: 0 };
                    let mut v = Vec::with_capacity(e.numel() as usize);
                    for _ in 0..e.numel() {
                        let s = c
                            .u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .and_then(|n| c.take(n))
                            .ok_or_else(
                                || bad("a string tensor's data is malformed".to_string()),
                            )?;
                        v.push(s.to_vec());
                    }
                    if c.at != bytes.len() {
                        return Err(bad("a string tensor's data has trailing bytes".to_string()));
                    }
                    Tensor::from_vec(&e.shape(), v)?
                }
                // Numeric tensors are read or mapped in place, never here.
                other => return Err(bad(format!("unsupported dtype {other}"))),
            })
        }
        KIND_BYTES => BlobValue::Bytes(bytes.into_owned()),
        _ => {
            let proto = BlobProto::decode(&*bytes).map_err(|err| {
                bad(format!(
                    "cannot parse the saved object as a BlobProto: {err}"
                ))
            })?;
            if proto.r#type.as_deref() != Some(e.tag.as_str()) {
                return Err(bad(
                    "the saved object's type disagrees with the index".to_string()
                ));
            }
            decode_object(&proto).map_err(|err| err.with_blob(&e.name).with_file(path))?
        }
    })
}

/// Loads the selected blobs of a ferro file. Payloads are read with
/// positioned reads by the kernel pool's threads, which take pieces of at
/// most [`LOAD_PIECE`] bytes in file order (so that the disk still sees one
/// forward stream), each straight into its tensor's buffer, checksummed as
/// it comes. Every byte between payloads is checked to be zero padding.
fn load_ferro(path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<(String, BlobValue)>> {
    let FerroFile {
        r,
        entries,
        index_offset,
    } = open_ferro(path)?;
    let file = r.into_inner();
    check_gaps(&file, path, &entries, index_offset)?;
    let wanted: Vec<&IndexEntry> = entries.iter().filter(|e| select(&e.name)).collect();
    let mut dests = wanted
        .iter()
        .map(|e| Dest::for_entry(e))
        .collect::<Result<Vec<Dest>>>()?;
    let mut pieces = Vec::new();
    for (i, (e, d)) in wanted.iter().zip(dests.iter_mut()).enumerate() {
        let mut at = e.offset;
        for dst in d.bytes_mut().chunks_mut(LOAD_PIECE) {
            let len = dst.len() as u64;
            pieces.push(Piece {
                entry: i,
                at,
                dst,
                crc: crc32fast::Hasher::new(),
                result: Ok(()),
            });
            at += len;
        }
    }
    if let (Some(first), Some(last)) = (wanted.first(), wanted.last()) {
        advise_sequential(
            &file,
            first.offset,
            last.offset + last.length - first.offset,
        );
    }
    // One reader (this thread) when the kernel pool could not start.
    let workers = crate::threads::num_threads().min(pieces.len());
    if workers > 1 {
        let queue = parking_lot::Mutex::new(pieces.iter_mut());
        let failed = std::sync::atomic::AtomicBool::new(false);
        rayon::scope(|s| {
            for _ in 0..workers {
                s.spawn(|_| loop {
                    let Some(p) = queue.lock().next() else { break };
                    if failed.load(Ordering::Relaxed) {
                        continue; // an earlier piece failed: the load fails
                    }
                    p.result = read_piece(&file, path, wanted[p.entry], p);
                    if p.result.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                });
            }
        });
    } else {
        for p in &mut pieces {
            p.result = read_piece(&file, path, wanted[p.entry], p);
            if p.result.is_err() {
                break;
            }
        }
    }
    // The first failure in file order is the one reported.
    let mut crcs: Vec<Option<crc32fast::Hasher>> = vec![None; wanted.len()];
    for p in pieces {
        p.result?;
        match &mut crcs[p.entry] {
            Some(h) => h.combine(&p.crc),
            slot => *slot = Some(p.crc),
        }
    }
    let mut out = Vec::with_capacity(wanted.len());
    for ((e, d), crc) in wanted.into_iter().zip(dests).zip(crcs) {
        let crc = crc.unwrap_or_default().finalize();
        check_crc(path, e, crc)?;
        out.push((e.name.clone(), d.into_value(path, e)?));
    }
    Ok(out)
}

fn verify_ferro(path: &str) -> Result<()> {
    let mut f = open_ferro(path)?;
    let entries = std::mem::take(&mut f.entries);
    let mut pos = HEADER_LEN;
    let mut buf = vec![0u8; 1 << 20];
    for e in &entries {
        f.padding(path, pos, e.offset)?;
        if e.kind == KIND_OBJECT {
            let bytes = f.payload_bytes(path, e)?;
            BlobProto::decode(bytes.as_slice()).map_err(|err| {
                corrupt(
                    path,
                    format!("cannot parse the saved object as a BlobProto: {err}"),
                )
                .with_blob(&e.name)
            })?;
        } else {
            let mut crc = crc32fast::Hasher::new();
            let mut left = e.length;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                read_exact_or_corrupt(&mut f.r, &mut buf[..n], path, &|| {
                    format!("the data of blob '{}' is cut off", e.name)
                })
                .map_err(|err| err.with_blob(&e.name))?;
                crc.update(&buf[..n]);
                left -= n as u64;
            }
            if crc.finalize() != e.crc {
                return Err(corrupt(
                    path,
                    format!("the data of blob '{}' is damaged (CRC mismatch)", e.name),
                )
                .with_blob(&e.name));
            }
        }
        pos = e.offset + e.length;
    }
    f.padding(path, pos, f.index_offset)
}

fn list_ferro(path: &str) -> Result<Vec<EntryInfo>> {
    let f = open_ferro(path)?;
    Ok(f.entries
        .into_iter()
        .map(|e| {
            let (kind, type_tag, dtype) = match e.kind {
                KIND_TENSOR => (
                    EntryKind::Tensor,
                    TENSOR_TAG.to_string(),
                    ferro_dtype(e.dtype),
                ),
                KIND_BYTES => (EntryKind::Bytes, STRING_TAG.to_string(), None),
                _ => (EntryKind::Object, e.tag.clone(), None),
            };
            EntryInfo {
                shape: e.shape(),
                name: e.name,
                kind,
                type_tag,
                dtype,
                bytes: e.length,
            }
        })
        .collect())
}

// -------------------------------------------------------- memory-mapped --

/// Where a blob of a ferro db held in memory is, or its value (see
/// [`map_ferro`]).
#[derive(Clone, Debug)]
pub enum MappedData {
    /// A numeric or bool tensor, left where it is: its elements are
    /// `data[offset..offset + length]`, row-major and little-endian (bool: one
    /// byte each, 0 or 1). `offset` is a multiple of 64.
    InPlace {
        dtype: DataType,
        shape: Vec<usize>,
        offset: usize,
        length: usize,
    },
    /// A string tensor or a byte string, decoded (a copy; its CRC checked).
    Decoded(BlobValue),
    /// A runtime object (counter, mutex, cursor, ...): not decoded, since it
    /// has no form that can be mapped. `type_tag` is its Caffe2 type tag.
    Object { type_tag: String },
}

/// One blob of a ferro db held in memory, as found by [`map_ferro`].
#[derive(Clone, Debug)]
pub struct MappedBlob {
    pub name: String,
    pub data: MappedData,
}

/// Bytes checksummed between two looks at the cancellation token.
const VERIFY_SLICE: usize = 16 << 20;

fn check_payload_crc(
    path: &str,
    e: &IndexEntry,
    bytes: &[u8],
    cancel: &crate::cancel::CancelToken,
) -> Result<()> {
    let mut crc = crc32fast::Hasher::new();
    for piece in bytes.chunks(VERIFY_SLICE) {
        cancel.poll_check()?;
        crc.update(piece);
    }
    if crc.finalize() != e.crc {
        return Err(corrupt(
            path,
            format!("the data of blob '{}' is damaged (CRC mismatch)", e.name),
        )
        .with_blob(&e.name));
    }
    Ok(())
}

fn check_zero_padding(path: &str, pad: &[u8], pos: u64) -> Result<()> {
    if pad.iter().any(|&b| b != 0) {
        return Err(corrupt(
            path,
            format!("the checkpoint is damaged: nonzero padding after byte {pos}"),
        ));
    }
    Ok(())
}

/// Checks a ferro db held in memory (`data`, typically a read-only memory
/// map of the file at `path`) and says where each blob is, in file order,
/// without copying numeric tensors.
///
/// Always checked, reading only the first and last pages and the index:
/// the header, the trailer and the index (their CRCs), and the layout (every
/// payload lies inside `data`, before the index, in order, with a length that
/// fits its dtype and shape). String tensors and byte strings are decoded, so
/// their CRCs are checked too. The payloads of numeric and bool tensors and of
/// objects are not read unless `verify` is set; then their CRCs, the zero
/// padding between payloads, that bool bytes are 0 or 1 and that objects
/// parse are checked too, reading every byte of `data` (`cancel` is polled
/// every 16 MiB).
///
/// Damage is a `CorruptCheckpoint` error naming `path` and, when it is in a
/// payload, the blob. A Caffe2 minidb is an `InvalidArgument` error: only
/// the ferro format lays tensors out so that they can be mapped.
pub fn map_ferro(
    path: &str,
    data: &[u8],
    verify: bool,
    cancel: &crate::cancel::CancelToken,
) -> Result<Vec<MappedBlob>> {
    let len = data.len() as u64;
    let head = &data[..data.len().min(HEADER_LEN as usize)];
    if head.len() >= 8 && head[..8] != FERRO_MAGIC[..] && looks_like_minidb(head, len) {
        return Err(Error::invalid_arg(
            "this file looks like a Caffe2 minidb; memory-mapped loading needs the 'ferro' format \
             (Save's default db_type): load it with a Load op and db_type 'minidb', or save it again as 'ferro'",
        )
        .with_file(path));
    }
    check_header(path, head, len)?;
    let tr = check_trailer(path, &data[data.len() - TRAILER_LEN as usize..], len)?;
    // The trailer checked out, so the index lies inside `data`.
    let index_at = tr.index_offset as usize;
    let entries = parse_index(path, &data[index_at..index_at + tr.index_len as usize], &tr)?;
    let mut out = Vec::with_capacity(entries.len());
    let mut pos = HEADER_LEN as usize;
    for e in &entries {
        // `check_layout` placed every payload in order between the header
        // and the index.
        let (offset, length) = (e.offset as usize, e.length as usize);
        let payload = &data[offset..offset + length];
        if verify {
            check_zero_padding(path, &data[pos..offset], pos as u64)?;
        }
        let bad = |msg: &str| corrupt(path, msg).with_blob(&e.name);
        let mapped = match (e.kind, ferro_dtype(e.dtype)) {
            (KIND_TENSOR, Some(dtype)) if item_size(dtype).is_some() => {
                if verify {
                    check_payload_crc(path, e, payload, cancel)?;
                    if dtype == DataType::Bool && payload.iter().any(|&b| b > 1) {
                        return Err(bad("a bool tensor holds a byte other than 0 or 1"));
                    }
                }
                MappedData::InPlace {
                    dtype,
                    shape: e.shape(),
                    offset,
                    length,
                }
            }
            (KIND_OBJECT, _) => {
                if verify {
                    check_payload_crc(path, e, payload, cancel)?;
                    let proto = BlobProto::decode(payload).map_err(|err| {
                        bad(&format!(
                            "cannot parse the saved object as a BlobProto: {err}"
                        ))
                    })?;
                    if proto.r#type.as_deref() != Some(e.tag.as_str()) {
                        return Err(bad("the saved object's type disagrees with the index"));
                    }
                }
                MappedData::Object {
                    type_tag: e.tag.clone(),
                }
            }
            _ => {
                check_payload_crc(path, e, payload, cancel)?;
                MappedData::Decoded(decode_payload(path, e, Cow::Borrowed(payload))?)
            }
        };
        out.push(MappedBlob {
            name: e.name.clone(),
            data: mapped,
        });
        pos = offset + length;
    }
    if verify {
        check_zero_padding(path, &data[pos..index_at], pos as u64)?;
    }
    Ok(out)
}

// ------------------------------------------------------------ public API --

/// Saves blobs to a db, replacing any db at `path` atomically (see the
/// module docs). Every value must be a tensor, a byte string or an object
/// with a serializer; names must be unique.
pub fn save_blobs(path: &str, db_type: &str, entries: &[(String, BlobValue)]) -> Result<()> {
    save_blobs_with(path, db_type, entries, &SaveOptions::default())
}

/// [`save_blobs`] with options.
pub fn save_blobs_with(
    path: &str,
    db_type: &str,
    entries: &[(String, BlobValue)],
    opts: &SaveOptions,
) -> Result<()> {
    let ty = DbType::parse(db_type).map_err(|e| e.with_file(path))?;
    let refs: Vec<(&str, &BlobValue)> = entries.iter().map(|(n, v)| (n.as_str(), v)).collect();
    save_blob_refs(path, ty, &refs, opts)
}

/// [`save_blobs_with`] for borrowed values (e.g. behind read guards).
pub fn save_blob_refs_with(
    path: &str,
    db_type: &str,
    entries: &[(&str, &BlobValue)],
    opts: &SaveOptions,
) -> Result<()> {
    let ty = DbType::parse(db_type).map_err(|e| e.with_file(path))?;
    save_blob_refs(path, ty, entries, opts)
}

fn save_blob_refs(
    path: &str,
    ty: DbType,
    entries: &[(&str, &BlobValue)],
    opts: &SaveOptions,
) -> Result<()> {
    let chunk = opts.chunk().map_err(|e| e.with_file(path))?;
    let prepared = prepare(entries, ty).map_err(|e| e.with_file(path))?;
    write_atomically(path, |w| match ty {
        DbType::Ferro => write_ferro(w, path, &prepared),
        DbType::MiniDb => write_minidb(w, path, &prepared, chunk),
    })
}

/// Loads every blob of a db, in file order (minidb chunks reassembled).
pub fn load_db(path: &str, db_type: &str) -> Result<Vec<(String, BlobValue)>> {
    load_db_select(path, db_type, &|_| true)
}

/// Loads the blobs whose stored name `select` accepts; the others are
/// skipped without being decoded.
pub fn load_db_select(
    path: &str,
    db_type: &str,
    select: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, BlobValue)>> {
    match DbType::parse(db_type).map_err(|e| e.with_file(path))? {
        DbType::Ferro => load_ferro(path, select),
        DbType::MiniDb => load_minidb(path, select),
    }
}

/// What a db holds, without loading its data (a minidb is parsed in full).
pub fn list_db(path: &str, db_type: &str) -> Result<Vec<EntryInfo>> {
    match DbType::parse(db_type).map_err(|e| e.with_file(path))? {
        DbType::Ferro => list_ferro(path),
        DbType::MiniDb => list_minidb(path),
    }
}

/// Checks a db without keeping its data: every CRC, the layout and the
/// padding of a ferro checkpoint; a minidb is fully decoded (it has no
/// checksums, so damaged numbers inside it go unnoticed).
pub fn verify_db(path: &str, db_type: &str) -> Result<()> {
    match DbType::parse(db_type).map_err(|e| e.with_file(path))? {
        DbType::Ferro => verify_ferro(path),
        DbType::MiniDb => load_minidb(path, &|_| true).map(|_| ()),
    }
}

/// Caffe2's `SerializeBlob`: one `BlobProto` (a tensor in a single chunk),
/// as protobuf bytes.
pub fn serialize_blob(name: &str, value: &BlobValue) -> Result<Vec<u8>> {
    let entries = [(name.to_string(), value.clone())];
    let refs: Vec<(&str, &BlobValue)> = entries.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let prepared = prepare(&refs, DbType::Ferro)?;
    let mut out = Vec::new();
    match &prepared[0].1 {
        Prepared::Tensor(t) => tensor_chunks(name, t, 0, &mut |_, tp| {
            let bp = BlobProto {
                name: Some(name.to_string()),
                r#type: Some(TENSOR_TAG.to_string()),
                tensor: Some(tp),
                ..Default::default()
            };
            out = bp.encode_to_vec();
            Ok(())
        })?,
        Prepared::Bytes(b) => {
            out = BlobProto {
                name: Some(name.to_string()),
                r#type: Some(STRING_TAG.to_string()),
                content: Some(b.to_vec()),
                ..Default::default()
            }
            .encode_to_vec()
        }
        Prepared::Object { proto, .. } => {
            let mut bp = (**proto).clone();
            bp.name = Some(name.to_string());
            out = bp.encode_to_vec();
        }
    }
    Ok(out)
}

/// Caffe2's `DeserializeBlob`: the value of a serialized `BlobProto` (a
/// tensor must be complete, in one chunk).
pub fn deserialize_blob(bytes: &[u8]) -> Result<BlobValue> {
    let bp =
        BlobProto::decode(bytes).map_err(|e| bad_data(format!("cannot parse a BlobProto: {e}")))?;
    let name = bp.name.clone().unwrap_or_default();
    let v = if bp.r#type.as_deref() == Some(TENSOR_TAG) {
        let t = bp
            .tensor
            .ok_or_else(|| bad_data("the tensor blob holds no tensor"))?;
        assemble_tensor(&[t]).map(BlobValue::Tensor)
    } else {
        decode_object(&bp)
    };
    v.map_err(|e| e.with_blob(&name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blob::BlobObject;
    use ndarray::IxDyn;

    /// A unique scratch directory under the system temp dir, removed on drop.
    pub(crate) struct Scratch(pub PathBuf);

    impl Scratch {
        pub(crate) fn new(tag: &str) -> Scratch {
            static N: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "ferrocaffe-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
        pub(crate) fn file(&self, name: &str) -> String {
            self.0.join(name).to_string_lossy().into_owned()
        }
        fn names(&self) -> Vec<String> {
            let mut v: Vec<_> = fs::read_dir(&self.0)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_at_a_db_path_is_refused_without_blocking() {
        let dir = Scratch::new("fifo");
        let path = dir.file("db");
        let c = std::ffi::CString::new(path.clone()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // On another thread, so that a blocking open fails the test instead
        // of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let p2 = path.clone();
        std::thread::spawn(move || {
            let r = (
                db_exists(&p2, "ferro").unwrap(),
                list_db(&p2, "ferro").unwrap_err(),
                load_db(&p2, "minidb").unwrap_err(),
                verify_db(&p2, "ferro").unwrap_err(),
            );
            let _ = tx.send(r);
        });
        let (exists, list, load, verify) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("opening a FIFO blocked");
        assert!(!exists);
        for e in [list, load, verify] {
            assert_eq!(e.kind, ErrorKind::Io);
            assert!(
                e.message.contains("not a regular file (a FIFO)"),
                "{}",
                e.full_message()
            );
            assert_eq!(e.context.file.as_deref(), Some(path.as_str()));
        }
        // A directory is refused the same way; a regular file opens.
        let e = open_regular(&dir.0).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        fs::write(dir.file("f"), b"abc").unwrap();
        let (mut f, meta) = open_regular(dir.file("f")).unwrap();
        let mut got = String::new();
        f.read_to_string(&mut got).unwrap();
        assert_eq!((got.as_str(), meta.len()), ("abc", 3));
    }

    fn t<T: crate::tensor::Element>(shape: &[usize], v: Vec<T>) -> BlobValue {
        BlobValue::Tensor(Tensor::from_vec(shape, v).unwrap())
    }

    /// One blob of every kind and dtype, including 0-dim and empty tensors.
    fn every_kind() -> Vec<(String, BlobValue)> {
        vec![
            (
                "f32".into(),
                t(
                    &[2, 3],
                    vec![1.5f32, -2.0, 0.0, f32::MAX, f32::MIN_POSITIVE, -0.0],
                ),
            ),
            ("f64".into(), t(&[3], vec![1e300f64, -1.0, 0.25])),
            ("i32".into(), t(&[2, 2], vec![i32::MIN, -1, 0, i32::MAX])),
            ("i64".into(), t(&[2], vec![i64::MIN, i64::MAX])),
            ("bool".into(), t(&[3], vec![true, false, true])),
            ("u8".into(), t(&[4], vec![0u8, 1, 128, 255])),
            ("i8".into(), t(&[3], vec![i8::MIN, -1, i8::MAX])),
            ("i16".into(), t(&[3], vec![i16::MIN, -1, i16::MAX])),
            ("u16".into(), t(&[2], vec![0u16, u16::MAX])),
            (
                "str".into(),
                t(
                    &[2, 2],
                    vec![
                        b"a".to_vec(),
                        vec![],
                        vec![0, 255, 10],
                        b"hello world".to_vec(),
                    ],
                ),
            ),
            (
                "scalar_f32".into(),
                BlobValue::Tensor(Tensor::scalar(3.25f32)),
            ),
            (
                "scalar_i64".into(),
                BlobValue::Tensor(Tensor::scalar(-7i64)),
            ),
            (
                "scalar_str".into(),
                BlobValue::Tensor(Tensor::scalar(b"x".to_vec())),
            ),
            (
                "scalar_bool".into(),
                BlobValue::Tensor(Tensor::scalar(true)),
            ),
            ("empty_f32".into(), t::<f32>(&[0], vec![])),
            ("empty_2d_i32".into(), t::<i32>(&[3, 0], vec![])),
            ("empty_str".into(), t::<Vec<u8>>(&[0, 2], vec![])),
            (
                "counter".into(),
                BlobValue::Object(Arc::new(Counter::new(42))),
            ),
            (
                "mutex".into(),
                BlobValue::Object(Arc::new(BlobMutex::default())),
            ),
            ("bytes".into(), BlobValue::Bytes(vec![0, 1, 2, 255])),
            ("empty_bytes".into(), BlobValue::Bytes(vec![])),
        ]
    }

    fn assert_same(a: &[(String, BlobValue)], b: &[(String, BlobValue)]) {
        assert_eq!(a.len(), b.len(), "entry counts differ");
        for ((na, va), (nb, vb)) in a.iter().zip(b) {
            assert_eq!(na, nb);
            match (va, vb) {
                (BlobValue::Tensor(x), BlobValue::Tensor(y)) => {
                    assert_eq!(x.dtype(), y.dtype(), "{na}");
                    assert_eq!(x.shape(), y.shape(), "{na}");
                    // Bit-exact for floats (-0.0 and friends).
                    match (x, y) {
                        (Tensor::F32(p), Tensor::F32(q)) => {
                            assert!(
                                p.iter()
                                    .zip(q.iter())
                                    .all(|(u, v)| u.to_bits() == v.to_bits()),
                                "{na}"
                            )
                        }
                        _ => assert_eq!(x, y, "{na}"),
                    }
                }
                (BlobValue::Bytes(x), BlobValue::Bytes(y)) => assert_eq!(x, y, "{na}"),
                (BlobValue::Object(x), BlobValue::Object(y)) => {
                    assert_eq!(x.kind_name(), y.kind_name(), "{na}");
                    if let (Ok(p), Ok(q)) = (
                        va.object::<Counter>("Counter"),
                        vb.object::<Counter>("Counter"),
                    ) {
                        assert_eq!(p.get(), q.get(), "{na}");
                    }
                }
                _ => panic!(
                    "{na}: kinds differ: {} vs {}",
                    va.kind_name(),
                    vb.kind_name()
                ),
            }
        }
    }

    #[test]
    fn every_kind_round_trips_in_both_formats() {
        let dir = Scratch::new("storage");
        let entries = every_kind();
        for db in ["ferro", "minidb"] {
            let path = dir.file(&format!("all.{db}"));
            save_blobs(&path, db, &entries).unwrap();
            assert_same(&entries, &load_db(&path, db).unwrap());
            verify_db(&path, db).unwrap();
            let listed = list_db(&path, db).unwrap();
            assert_eq!(listed.len(), entries.len());
            let f32_info = &listed[0];
            assert_eq!(
                (f32_info.name.as_str(), f32_info.kind),
                ("f32", EntryKind::Tensor)
            );
            assert_eq!(
                (f32_info.dtype, f32_info.shape.clone()),
                (Some(DataType::Float), vec![2, 3])
            );
            let counter = listed.iter().find(|e| e.name == "counter").unwrap();
            assert_eq!(
                (counter.kind, counter.type_tag.as_str()),
                (EntryKind::Object, COUNTER_TAG)
            );
            let bytes = listed.iter().find(|e| e.name == "bytes").unwrap();
            assert_eq!(bytes.kind, EntryKind::Bytes);
            assert!(db_exists(&path, db).unwrap());
        }
        // Only the two dbs are left: no temporaries.
        assert_eq!(
            dir.names(),
            vec!["all.ferro".to_string(), "all.minidb".to_string()]
        );
    }

    #[test]
    fn ferro_layout_is_as_documented() {
        let dir = Scratch::new("storage");
        let path = dir.file("layout");
        let big: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        save_blobs(
            &path,
            "ferro",
            &[
                ("a".into(), t(&[3], vec![1u8, 2, 3])),
                ("b".into(), t(&[1000], big.clone())),
            ],
        )
        .unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"FERROCKP");
        assert_eq!(le_u32(&bytes, 8), 1);
        assert_eq!(&bytes[bytes.len() - 8..], b"FERROEND");
        let tr = &bytes[bytes.len() - 48..];
        assert_eq!(le_u64(tr, 24), bytes.len() as u64);
        assert_eq!(le_u64(tr, 16), 2);
        // Payloads at 64-byte boundaries: "a" at 64, "b" at 128, as raw LE data.
        assert_eq!(&bytes[64..67], &[1, 2, 3]);
        assert!(bytes[67..128].iter().all(|&b| b == 0));
        assert_eq!(&bytes[128..132], &0f32.to_le_bytes());
        assert_eq!(&bytes[128 + 4 * 999..128 + 4000], &999f32.to_le_bytes());
        assert_eq!(le_u64(tr, 0), align_up(128 + 4000));
    }

    #[test]
    fn non_contiguous_tensors_take_the_portable_path() {
        let dir = Scratch::new("storage");
        let a = ndarray::ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1i64, 2, 3, 4, 5, 6])
            .unwrap()
            .reversed_axes();
        assert!(a.as_slice().is_none());
        let b = ndarray::ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![true, false, false, true])
            .unwrap()
            .reversed_axes();
        let entries = vec![
            ("t".to_string(), BlobValue::Tensor(Tensor::I64(a.clone()))),
            ("b".into(), BlobValue::Tensor(Tensor::Bool(b.clone()))),
        ];
        for db in ["ferro", "minidb"] {
            let path = dir.file(db);
            save_blobs(&path, db, &entries).unwrap();
            let back = load_db(&path, db).unwrap();
            assert_eq!(back[0].1.tensor().unwrap(), &Tensor::I64(a.clone()));
            assert_eq!(back[1].1.tensor().unwrap(), &Tensor::Bool(b.clone()));
        }
        // A staging buffer larger than one stage, converted piecewise.
        let big =
            ndarray::ArrayD::from_shape_fn(IxDyn(&[300, 300]), |i| (i[0] * 300 + i[1]) as f32)
                .reversed_axes();
        let path = dir.file("big");
        save_blobs(
            &path,
            "ferro",
            &[("big".into(), BlobValue::Tensor(Tensor::F32(big.clone())))],
        )
        .unwrap();
        assert_eq!(
            load_db(&path, "ferro").unwrap()[0].1.tensor().unwrap(),
            &Tensor::F32(big)
        );
    }

    // ------------------------------------------------ minidb by hand --

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn field_varint(field: u32, v: u64, out: &mut Vec<u8>) {
        varint(u64::from(field) << 3, out);
        varint(v, out);
    }

    fn field_bytes(field: u32, b: &[u8], out: &mut Vec<u8>) {
        varint((u64::from(field) << 3) | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    fn record(key: &str, value: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(&(key.len() as i32).to_ne_bytes());
        out.extend_from_slice(&(value.len() as i32).to_ne_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(value);
    }

    /// A Caffe2 TensorProto chunk, encoded by hand as Caffe2's C++ writes it
    /// (unpacked dims, packed data, segment).
    fn hand_tensor(
        name: &str,
        dims: &[u64],
        dtype: u64,
        data_field: u32,
        packed: &[u8],
        seg: (u64, u64),
    ) -> Vec<u8> {
        let mut tp = Vec::new();
        for &d in dims {
            field_varint(1, d, &mut tp);
        }
        field_varint(2, dtype, &mut tp);
        if !packed.is_empty() {
            field_bytes(data_field, packed, &mut tp);
        }
        field_bytes(7, name.as_bytes(), &mut tp);
        let mut s = Vec::new();
        field_varint(1, seg.0, &mut s);
        field_varint(2, seg.1, &mut s);
        field_bytes(11, &s, &mut tp);
        let mut bp = Vec::new();
        field_bytes(1, name.as_bytes(), &mut bp);
        field_bytes(2, b"Tensor", &mut bp);
        field_bytes(3, &tp, &mut bp);
        bp
    }

    #[test]
    fn hand_assembled_minidb_reads_correctly() {
        let dir = Scratch::new("storage");
        let mut file = Vec::new();
        // "w": float [2, 2] in two chunks, written out of order (Caffe2's
        // threaded serializer may do that).
        let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        record(
            "w#%1",
            &hand_tensor("w", &[2, 2], 1, 3, &floats(&[3.0, 4.0]), (2, 4)),
            &mut file,
        );
        record(
            "w#%0",
            &hand_tensor("w", &[2, 2], 1, 3, &floats(&[1.0, 2.0]), (0, 2)),
            &mut file,
        );
        // "ids": int64 [3] (field 10, packed varints).
        let mut ids = Vec::new();
        for v in [5i64, -1, 1 << 40] {
            varint(v as u64, &mut ids);
        }
        record(
            "ids#%0",
            &hand_tensor("ids", &[3], 10, 10, &ids, (0, 3)),
            &mut file,
        );
        // "flags": bool [2] in int32_data (field 4).
        record(
            "flags#%0",
            &hand_tensor("flags", &[2], 5, 4, &[1, 0], (0, 2)),
            &mut file,
        );
        // "e": an empty int32 tensor [0, 4] still has chunk 0.
        record(
            "e#%0",
            &hand_tensor("e", &[0, 4], 2, 4, &[], (0, 0)),
            &mut file,
        );
        // "names": string [2] (field 6, one entry per element).
        let mut bp = Vec::new();
        field_bytes(1, b"names", &mut bp);
        field_bytes(2, b"Tensor", &mut bp);
        let mut tp = Vec::new();
        field_varint(1, 2, &mut tp);
        field_varint(2, 4, &mut tp);
        field_bytes(6, b"ab", &mut tp);
        field_bytes(6, b"", &mut tp);
        field_bytes(3, &tp, &mut bp);
        record("names#%0", &bp, &mut file);
        // "it": a Caffe2 counter (an int64 tensor of dims [1], its own type tag).
        let mut bp = Vec::new();
        field_bytes(1, b"it", &mut bp);
        field_bytes(2, COUNTER_TAG.as_bytes(), &mut bp);
        let mut tp = Vec::new();
        field_varint(1, 1, &mut tp);
        field_varint(2, 10, &mut tp);
        let mut v = Vec::new();
        varint(17, &mut v);
        field_bytes(10, &v, &mut tp);
        field_bytes(3, &tp, &mut bp);
        record("it", &bp, &mut file);
        // "m": a mutex; "s": a std::string blob.
        let mut bp = Vec::new();
        field_bytes(1, b"m", &mut bp);
        field_bytes(2, MUTEX_TAG.as_bytes(), &mut bp);
        field_bytes(4, b"", &mut bp);
        record("m", &bp, &mut file);
        let mut bp = Vec::new();
        field_bytes(1, b"s", &mut bp);
        field_bytes(2, b"std::string", &mut bp);
        field_bytes(4, b"payload\x00bytes", &mut bp);
        record("s", &bp, &mut file);

        let path = dir.file("hand.minidb");
        fs::write(&path, &file).unwrap();
        let got = load_db(&path, "minidb").unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["w", "ids", "flags", "e", "names", "it", "m", "s"]);
        assert_eq!(
            got[0].1.tensor().unwrap(),
            &Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap()
        );
        assert_eq!(
            got[1].1.tensor().unwrap(),
            &Tensor::from_vec(&[3], vec![5i64, -1, 1 << 40]).unwrap()
        );
        assert_eq!(
            got[2].1.tensor().unwrap(),
            &Tensor::from_vec(&[2], vec![true, false]).unwrap()
        );
        assert_eq!(
            got[3].1.tensor().unwrap(),
            &Tensor::from_vec::<i32>(&[0, 4], vec![]).unwrap()
        );
        assert_eq!(
            got[4].1.tensor().unwrap(),
            &Tensor::from_vec(&[2], vec![b"ab".to_vec(), vec![]]).unwrap()
        );
        assert_eq!(got[5].1.object::<Counter>("Counter").unwrap().get(), 17);
        got[6].1.object::<BlobMutex>("Mutex").unwrap();
        assert!(matches!(&got[7].1, BlobValue::Bytes(b) if b == b"payload\x00bytes"));

        // Selecting skips the other records without decoding them.
        let some = load_db_select(&path, "minidb", &|n| n == "ids").unwrap();
        assert_eq!(some.len(), 1);

        // A missing chunk is Caffe2's "Data size mismatch", naming blob and file.
        let mut partial = Vec::new();
        record(
            "w#%1",
            &hand_tensor("w", &[2, 2], 1, 3, &floats(&[3.0, 4.0]), (2, 4)),
            &mut partial,
        );
        fs::write(&path, &partial).unwrap();
        let e = load_db(&path, "minidb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint);
        assert!(
            e.message
                .contains("Data size mismatch: expected 4 elements, read 2"),
            "{e}"
        );
        assert_eq!(
            (e.context.blob.as_deref(), e.context.file.as_deref()),
            (Some("w"), Some(path.as_str()))
        );
        // A chunk whose data does not match its segment.
        let mut bad = Vec::new();
        record(
            "w#%0",
            &hand_tensor("w", &[2, 2], 1, 3, &floats(&[1.0]), (0, 4)),
            &mut bad,
        );
        fs::write(&path, &bad).unwrap();
        let e = load_db(&path, "minidb").unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint);
        assert!(e.message.contains("incorrect data size"), "{e}");
        // Two records for one non-tensor blob.
        let mut dup = Vec::new();
        record("s", &bp, &mut dup);
        record("s", &bp, &mut dup);
        fs::write(&path, &dup).unwrap();
        assert!(load_db(&path, "minidb")
            .unwrap_err()
            .message
            .contains("Blob duplicated"));
    }

    /// Parses a minidb by hand: (key, value) records.
    fn parse_records(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let kl = i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let vl = i32::from_ne_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
            let key = String::from_utf8(bytes[at + 8..at + 8 + kl].to_vec()).unwrap();
            out.push((key, bytes[at + 8 + kl..at + 8 + kl + vl].to_vec()));
            at += 8 + kl + vl;
        }
        assert_eq!(at, bytes.len());
        out
    }

    #[test]
    fn saved_minidb_has_caffe2_records() {
        let dir = Scratch::new("storage");
        let path = dir.file("saved.minidb");
        let entries = vec![
            (
                "x".to_string(),
                t(&[2, 5], (0..10).map(|i| i as f32).collect()),
            ),
            ("flags".to_string(), t(&[2], vec![true, false])),
            ("small".to_string(), t(&[2], vec![-3i16, 7])),
            ("e".to_string(), t::<f64>(&[0], vec![])),
            (
                "c".to_string(),
                BlobValue::Object(Arc::new(Counter::new(9))),
            ),
            (
                "m".to_string(),
                BlobValue::Object(Arc::new(BlobMutex::default())),
            ),
            ("s".to_string(), BlobValue::Bytes(b"hi".to_vec())),
        ];
        save_blobs_with(&path, "minidb", &entries, &SaveOptions { chunk_size: 4 }).unwrap();
        let recs = parse_records(&fs::read(&path).unwrap());
        let keys: Vec<&str> = recs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["x#%0", "x#%1", "x#%2", "flags#%0", "small#%0", "e#%0", "c", "m", "s"]
        );
        let bp = |i: usize| BlobProto::decode(recs[i].1.as_slice()).unwrap();
        let x1 = bp(1);
        assert_eq!(
            (x1.name.as_deref(), x1.r#type.as_deref()),
            (Some("x"), Some("Tensor"))
        );
        let tp = x1.tensor.unwrap();
        assert_eq!(
            (tp.dims.clone(), tp.data_type, tp.name.as_deref()),
            (vec![2, 5], Some(1), Some("x"))
        );
        assert_eq!(tp.segment, Some(Segment { begin: 4, end: 8 }));
        assert_eq!(tp.float_data, vec![4.0, 5.0, 6.0, 7.0]);
        assert_eq!(
            bp(2).tensor.unwrap().segment,
            Some(Segment { begin: 8, end: 10 })
        );
        let flags = bp(3).tensor.unwrap();
        assert_eq!((flags.data_type, flags.int32_data), (Some(5), vec![1, 0]));
        assert_eq!(bp(4).tensor.unwrap().int32_data, vec![-3, 7]);
        let e = bp(5).tensor.unwrap();
        assert_eq!(
            (e.dims, e.segment, e.data_type),
            (vec![0], Some(Segment { begin: 0, end: 0 }), Some(13))
        );
        let c = bp(6);
        assert_eq!(c.r#type.as_deref(), Some(COUNTER_TAG));
        let ct = c.tensor.unwrap();
        assert_eq!(
            (ct.dims, ct.data_type, ct.int64_data),
            (vec![1], Some(10), vec![9])
        );
        let m = bp(7);
        assert_eq!(
            (m.r#type.as_deref(), m.content),
            (Some(MUTEX_TAG), Some(vec![]))
        );
        let s = bp(8);
        assert_eq!(
            (s.r#type.as_deref(), s.content),
            (Some(STRING_TAG), Some(b"hi".to_vec()))
        );
        // Chunks reassemble; chunk_size 0 writes one record per tensor.
        assert_same(&entries, &load_db(&path, "minidb").unwrap());
        save_blobs_with(&path, "minidb", &entries, &SaveOptions { chunk_size: 0 }).unwrap();
        assert_eq!(parse_records(&fs::read(&path).unwrap())[0].0, "x#%0");
        assert_eq!(parse_records(&fs::read(&path).unwrap())[1].0, "flags#%0");
        assert!(
            save_blobs_with(&path, "minidb", &entries, &SaveOptions { chunk_size: -2 }).is_err()
        );
    }

    // -------------------------------------------------- damaged files --

    fn small_entries() -> Vec<(String, BlobValue)> {
        vec![
            ("a".into(), t(&[3], vec![1.0f32, 2.0, 3.0])),
            ("b".into(), t(&[2], vec![b"xy".to_vec(), b"z".to_vec()])),
            ("c".into(), BlobValue::Object(Arc::new(Counter::new(5)))),
            ("d".into(), BlobValue::Bytes(b"bytes".to_vec())),
            ("e".into(), t(&[2], vec![true, false])),
        ]
    }

    fn assert_corrupt(e: &Error, path: &str) {
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint, "{e}");
        assert_eq!(e.context.file.as_deref(), Some(path), "{e}");
    }

    #[test]
    fn ferro_truncation_at_every_offset_is_detected() {
        let dir = Scratch::new("storage");
        let good = dir.file("good");
        save_blobs(&good, "ferro", &small_entries()).unwrap();
        let bytes = fs::read(&good).unwrap();
        let path = dir.file("cut");
        for len in 0..bytes.len() {
            fs::write(&path, &bytes[..len]).unwrap();
            let e = load_db(&path, "ferro").unwrap_err();
            assert_corrupt(&e, &path);
            assert_corrupt(&verify_db(&path, "ferro").unwrap_err(), &path);
            assert_corrupt(&list_db(&path, "ferro").unwrap_err(), &path);
        }
        // Appended junk is caught too.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0; 7]);
        fs::write(&path, &longer).unwrap();
        assert_corrupt(&load_db(&path, "ferro").unwrap_err(), &path);
    }

    #[test]
    fn ferro_bit_flips_anywhere_are_detected() {
        let dir = Scratch::new("storage");
        let good = dir.file("good");
        save_blobs(&good, "ferro", &small_entries()).unwrap();
        let bytes = fs::read(&good).unwrap();
        let path = dir.file("flipped");
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                fs::write(&path, &b).unwrap();
                let e = load_db(&path, "ferro").unwrap_err();
                assert_corrupt(&e, &path);
                assert_corrupt(&verify_db(&path, "ferro").unwrap_err(), &path);
            }
        }
    }

    #[test]
    fn damaged_data_names_the_blob() {
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(&path, "ferro", &small_entries()).unwrap();
        let mut b = fs::read(&path).unwrap();
        b[64] ^= 0x10; // inside blob "a"'s payload
        fs::write(&path, &b).unwrap();
        let e = load_db(&path, "ferro").unwrap_err();
        assert_corrupt(&e, &path);
        assert_eq!(e.context.blob.as_deref(), Some("a"));
        assert!(e.full_message().contains("CRC mismatch"), "{e}");
        // Loading only the other blobs skips the damaged one.
        assert_eq!(
            load_db_select(&path, "ferro", &|n| n != "a").unwrap().len(),
            4
        );
    }

    #[test]
    fn large_tensors_load_in_pieces_and_every_piece_is_checked() {
        // 20 MiB: three pieces of LOAD_PIECE, read by different threads and
        // their CRCs combined; small blobs before and after it.
        let n = (20 << 20) / 4;
        let big: Vec<i32> = (0..n as i32)
            .map(|i| i.wrapping_mul(2654435761u32 as i32))
            .collect();
        let entries = vec![
            ("head".to_string(), t(&[3], vec![1.5f64, -2.0, 3.25])),
            ("big".to_string(), t(&[n / 1024, 1024], big.clone())),
            ("tail".to_string(), BlobValue::Bytes(b"end".to_vec())),
        ];
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(&path, "ferro", &entries).unwrap();
        let got = load_db(&path, "ferro").unwrap();
        assert_same(&got, &entries);
        let offset = list_ferro(&path).unwrap();
        assert_eq!(offset[1].bytes, (n * 4) as u64);
        let raw = fs::read(&path).unwrap();
        // A flipped bit in each piece of "big" (its payload starts at 128).
        for at in [128 + 5, 128 + (9 << 20), 128 + (20 << 20) - 1] {
            let mut b = raw.clone();
            b[at] ^= 0x04;
            fs::write(&path, &b).unwrap();
            let e = load_db(&path, "ferro").unwrap_err();
            assert_corrupt(&e, &path);
            assert_eq!(e.context.blob.as_deref(), Some("big"), "{e}");
            // Padding is checked too.
            let mut b = raw.clone();
            b[128 + (20 << 20) + 3] = 1; // between "big" and "tail"
            fs::write(&path, &b).unwrap();
            let e = load_db(&path, "ferro").unwrap_err();
            assert!(e.full_message().contains("padding"), "{e}");
        }
    }

    #[test]
    fn minidb_truncation_is_an_error_or_a_clean_prefix() {
        let dir = Scratch::new("storage");
        let good = dir.file("good");
        let entries = small_entries();
        save_blobs_with(&good, "minidb", &entries, &SaveOptions { chunk_size: 2 }).unwrap();
        let bytes = fs::read(&good).unwrap();
        let mut boundaries = vec![0];
        for (k, v) in parse_records(&bytes) {
            boundaries.push(boundaries.last().unwrap() + 8 + k.len() + v.len());
        }
        let path = dir.file("cut");
        for len in 0..bytes.len() {
            fs::write(&path, &bytes[..len]).unwrap();
            match load_db(&path, "minidb") {
                Err(e) => assert_corrupt(&e, &path),
                Ok(got) => {
                    // minidb has no trailer: a cut between records loses whole
                    // blobs, never data inside one.
                    assert!(boundaries.contains(&len), "a cut at {len} was not detected");
                    assert_same(&entries[..got.len()], &got);
                }
            }
        }
        // Cutting between the two chunks of "a" is a size mismatch, not a short tensor.
        fs::write(&path, &bytes[..boundaries[1]]).unwrap();
        assert!(load_db(&path, "minidb")
            .unwrap_err()
            .message
            .contains("Data size mismatch"));
    }

    #[test]
    fn empty_missing_and_foreign_files() {
        let dir = Scratch::new("storage");
        let empty = dir.file("empty");
        fs::write(&empty, b"").unwrap();
        for db in ["ferro", "minidb"] {
            let e = load_db(&empty, db).unwrap_err();
            assert_corrupt(&e, &empty);
            assert!(e.message.contains("empty"), "{e}");
            let missing = dir.file("missing");
            let e = load_db(&missing, db).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Io);
            assert_eq!(e.context.file.as_deref(), Some(missing.as_str()));
            assert!(!db_exists(&missing, db).unwrap());
        }
        // Each format recognises the other and says so.
        let f = dir.file("f");
        let m = dir.file("m");
        save_blobs(&f, "ferro", &small_entries()).unwrap();
        save_blobs(&m, "minidb", &small_entries()).unwrap();
        assert!(load_db(&f, "minidb")
            .unwrap_err()
            .message
            .contains("db_type 'ferro'"));
        assert!(load_db(&m, "ferro")
            .unwrap_err()
            .message
            .contains("db_type 'minidb'"));
        let text = dir.file("text");
        fs::write(&text, b"hello, this is not a db at all").unwrap();
        assert_corrupt(&load_db(&text, "ferro").unwrap_err(), &text);
        assert_corrupt(&load_db(&text, "minidb").unwrap_err(), &text);
    }

    #[test]
    fn db_types_are_checked() {
        let dir = Scratch::new("storage");
        let path = dir.file("x");
        let e = save_blobs(&path, "hdf5", &small_entries()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("unknown db_type 'hdf5'"), "{e}");
        for db in ["leveldb", "lmdb"] {
            let e = load_db(&path, db).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(
                e.message
                    .contains(&format!("db_type '{db}' is not supported")),
                "{e}"
            );
            assert!(db_exists(&path, db).is_err());
        }
        assert!(fs::read_dir(&dir.0).unwrap().next().is_none());
    }

    #[test]
    fn bad_entries_fail_before_any_file_is_written() {
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(&path, "ferro", &small_entries()).unwrap();
        let before = fs::read(&path).unwrap();
        let timer = crate::blob::Timer {
            name: "t".into(),
            start: parking_lot::Mutex::new(None),
        };
        let cases: Vec<(Vec<(String, BlobValue)>, &str)> = vec![
            (vec![("a".into(), BlobValue::Empty)], "never written"),
            (
                vec![("t".into(), BlobValue::Object(Arc::new(timer)))],
                "no known serializer",
            ),
            (
                vec![
                    ("a".into(), BlobValue::Bytes(vec![])),
                    ("a".into(), BlobValue::Bytes(vec![])),
                ],
                "given twice",
            ),
        ];
        for (entries, msg) in cases {
            for db in ["ferro", "minidb"] {
                let e = save_blobs(&path, db, &entries).unwrap_err();
                assert!(e.message.contains(msg), "{e}");
                assert!(
                    e.context.blob.is_some() && e.context.file.as_deref() == Some(path.as_str()),
                    "{e:?}"
                );
            }
        }
        let e = save_blobs(
            &path,
            "minidb",
            &[("a#%b".into(), BlobValue::Bytes(vec![]))],
        )
        .unwrap_err();
        assert!(e.message.contains("chunk separator"), "{e}");
        assert_eq!(fs::read(&path).unwrap(), before);
        assert_eq!(dir.names(), vec!["db".to_string()]);
        // A directory that does not exist is an Io error naming the file.
        let nowhere = dir.file("no/such/dir/db");
        let e = save_blobs(&nowhere, "ferro", &small_entries()).unwrap_err();
        assert_eq!(
            (e.kind, e.context.file.as_deref()),
            (ErrorKind::Io, Some(nowhere.as_str()))
        );
    }

    #[test]
    fn saves_replace_atomically() {
        let dir = Scratch::new("storage");
        let path = dir.file("ckpt");
        save_blobs(&path, "ferro", &[("v".into(), t(&[1], vec![1i32]))]).unwrap();
        // Concurrent savers of the same path: each file seen is complete.
        std::thread::scope(|s| {
            for k in 0..4 {
                let path = path.clone();
                s.spawn(move || {
                    for i in 0..10 {
                        let v: i32 = k * 100 + i;
                        save_blobs(&path, "ferro", &[("v".into(), t(&[1000], vec![v; 1000]))])
                            .unwrap();
                    }
                });
            }
            let path = path.clone();
            s.spawn(move || {
                for _ in 0..50 {
                    let got = load_db(&path, "ferro").unwrap();
                    let a = got[0].1.tensor().unwrap().array::<i32>().unwrap().clone();
                    assert!(a.iter().all(|&x| x == a[0]));
                }
            });
        });
        assert_eq!(dir.names(), vec!["ckpt".to_string()]);
    }

    #[test]
    fn stale_temporaries_are_swept() {
        let dir = Scratch::new("storage");
        let me = std::process::id();
        let host = host_tag();
        let dead = 4_000_000_000u32; // above any pid_max
        let touch = |name: &str, age_secs: u64| {
            let p = dir.0.join(name);
            let f = File::create(&p).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(age_secs))
                .unwrap();
        };
        let ours = |target: &str, host: u32, pid: u32, n: u32| {
            format!(".{target}.tmp-ferrocaffe-{host:08x}-{pid}-{n}")
        };
        let other_host = host.wrapping_add(1);
        touch(&ours("ckpt", host, dead, 0), 0); // dead owner of this host: swept at once
        touch(&ours("ckpt", host, me, 7), 10); // a live owner: kept
        touch(&ours("ckpt", host, me, 8), 7200); // over an hour old: swept
        touch(&ours("ckpt", other_host, dead, 1), 10); // another host's: kept for now
        touch(&ours("ckpt", other_host, dead, 2), 7200); // ... unless over an hour old
        touch(&ours("other", host, dead, 3), 7200); // another file's: kept
        touch(&ours("ckpt.1", host, dead, 4), 7200); // a file whose name extends ours: kept
        touch(&format!(".ckpt.tmp-{dead}-5"), 7200); // someone else's pattern: kept
        touch(".thesis.docx.tmp-1-2", 7200);
        touch("ckpt", 7200);
        assert_eq!(temp_owner(&ours("a", 0xabc, 12, 3), "a"), Some((0xabc, 12)));
        assert_eq!(temp_owner(&ours("a", 0xabc, 12, 3), "b"), None);
        assert_eq!(temp_owner(".a.tmp-ferrocaffe-xyz-12-3", "a"), None);
        assert_eq!(temp_owner(".a.tmp-12-3", "a"), None);
        let kept_before = dir.names();
        assert_eq!(sweep_stale_temporaries(&dir.0.join("ckpt")).unwrap(), 3);
        let mut want: Vec<String> = kept_before
            .into_iter()
            .filter(|n| {
                *n != ours("ckpt", host, dead, 0)
                    && *n != ours("ckpt", host, me, 8)
                    && *n != ours("ckpt", other_host, dead, 2)
            })
            .collect();
        want.sort();
        assert_eq!(dir.names(), want);
        // A save sweeps the temporaries of the db it writes, and only those.
        touch(&ours("x", host, dead, 9), 0);
        save_blobs(&dir.file("x"), "ferro", &small_entries()).unwrap();
        let names = dir.names();
        assert!(!names.contains(&ours("x", host, dead, 9)));
        assert!(names.contains(&ours("other", host, dead, 3)));
        assert!(names.contains(&".thesis.docx.tmp-1-2".to_string()));
        // A temporary is named the way the sweeper recognises.
        let tmp = temp_path_for(&dir.0.join("y"));
        let name = tmp.file_name().unwrap().to_str().unwrap();
        assert_eq!(temp_owner(name, "y"), Some((host, me)));
    }

    #[cfg(unix)]
    #[test]
    fn saves_replace_only_regular_files() {
        let dir = Scratch::new("storage");
        let target = dir.file("real");
        save_blobs(&target, "ferro", &small_entries()).unwrap();
        let link = dir.file("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let socket = dir.file("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let sub = dir.file("sub");
        fs::create_dir(&sub).unwrap();
        for (path, what) in [
            (&link, "symbolic link"),
            (&socket, "not a regular file"),
            (&sub, "directory"),
        ] {
            for db in ["ferro", "minidb"] {
                let e = save_blobs(path, db, &small_entries()).unwrap_err();
                assert_eq!(e.kind, ErrorKind::Io, "{e}");
                assert!(e.to_string().contains(what), "{e}");
                assert_eq!(e.context.file.as_deref(), Some(path.as_str()));
            }
            let e = write_file(path, b"x").unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        // Nothing was replaced, no temporary is left.
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::metadata(&sub).unwrap().is_dir());
        assert_eq!(dir.names(), vec!["link", "real", "socket", "sub"]);
        // A regular file is replaced.
        write_file(&target, b"plain").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"plain");
    }

    #[derive(Debug)]
    struct Thing(String);

    impl BlobObject for Thing {
        fn kind_name(&self) -> &'static str {
            "Thing"
        }
        fn serialize(&self) -> Option<BlobProto> {
            Some(BlobProto {
                r#type: Some("test::Thing".into()),
                content: Some(self.0.as_bytes().to_vec()),
                ..Default::default()
            })
        }
    }

    fn decode_thing(p: &BlobProto) -> Result<BlobValue> {
        let s = String::from_utf8(p.content.clone().unwrap_or_default())
            .map_err(|_| bad_object("not UTF-8"))?;
        Ok(BlobValue::Object(Arc::new(Thing(s))))
    }

    #[test]
    fn registered_codecs_load_objects() {
        let dir = Scratch::new("storage");
        let entries = vec![(
            "thing".to_string(),
            BlobValue::Object(Arc::new(Thing("state".into()))),
        )];
        for db in ["ferro", "minidb"] {
            let path = dir.file(db);
            save_blobs(&path, db, &entries).unwrap();
            if db == "ferro" {
                // Before registration the tag is unknown: a Type error naming it.
                let e = load_db(&path, db).unwrap_err();
                assert_eq!(e.kind, ErrorKind::Type);
                assert!(e.message.contains("test::Thing"), "{e}");
                register_blob_codec("test::Thing", decode_thing);
            }
            let got = load_db(&path, db).unwrap();
            assert_eq!(got[0].1.object::<Thing>("Thing").unwrap().0, "state");
            assert_eq!(list_db(&path, db).unwrap()[0].type_tag, "test::Thing");
        }
    }

    #[test]
    fn serialize_blob_round_trips() {
        for (name, v) in every_kind() {
            let bytes = serialize_blob(&name, &v).unwrap();
            let back = deserialize_blob(&bytes).unwrap();
            assert_same(&[(name.clone(), v)], &[(name, back)]);
        }
        assert_eq!(
            deserialize_blob(&[0xff, 0xff]).unwrap_err().kind,
            ErrorKind::CorruptCheckpoint
        );
    }
    // --------------------------------------------------- memory-mapped --

    /// The value a mapped blob stands for, rebuilt from the bytes it points
    /// at (`None` for objects).
    fn from_mapped(data: &[u8], m: &MappedData) -> Option<BlobValue> {
        let MappedData::InPlace {
            dtype,
            shape,
            offset,
            length,
        } = m
        else {
            return match m {
                MappedData::Decoded(v) => Some(v.clone()),
                _ => None,
            };
        };
        assert_eq!(offset % 64, 0);
        let b = &data[*offset..offset + length];
        macro_rules! le {
            ($t:ty) => {
                Tensor::from_vec(
                    shape,
                    b.chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()))
                        .collect::<Vec<$t>>(),
                )
            };
        }
        let t = match dtype {
            DataType::Float => le!(f32),
            DataType::Double => le!(f64),
            DataType::Int32 => le!(i32),
            DataType::Int64 => le!(i64),
            DataType::Uint8 => le!(u8),
            DataType::Int8 => le!(i8),
            DataType::Int16 => le!(i16),
            DataType::Uint16 => le!(u16),
            DataType::Bool => Tensor::from_vec(shape, b.iter().map(|&x| x == 1).collect()),
            other => panic!("{other} cannot be in place"),
        };
        Some(BlobValue::Tensor(t.unwrap()))
    }

    #[test]
    fn every_kind_maps_in_place_or_decoded() {
        let dir = Scratch::new("storage");
        let path = dir.file("all");
        let entries = every_kind();
        save_blobs(&path, "ferro", &entries).unwrap();
        let data = fs::read(&path).unwrap();
        let tok = crate::cancel::CancelToken::new();
        for verify in [false, true] {
            let mapped = map_ferro(&path, &data, verify, &tok).unwrap();
            let names: Vec<_> = mapped.iter().map(|m| m.name.clone()).collect();
            let want: Vec<_> = entries.iter().map(|(n, _)| n.clone()).collect();
            assert_eq!(names, want, "file order");
            let mut got = Vec::new();
            let mut expected = Vec::new();
            for (m, (name, v)) in mapped.iter().zip(&entries) {
                let in_place = matches!(m.data, MappedData::InPlace { .. });
                match v {
                    BlobValue::Tensor(t) => assert_eq!(
                        in_place,
                        t.dtype() != DataType::String,
                        "{name}: numeric tensors stay in place, strings are decoded"
                    ),
                    BlobValue::Bytes(_) => {
                        assert!(matches!(m.data, MappedData::Decoded(BlobValue::Bytes(_))))
                    }
                    _ => {}
                }
                match from_mapped(&data, &m.data) {
                    Some(back) => {
                        got.push((name.clone(), back));
                        expected.push((name.clone(), v.clone()));
                    }
                    None => {
                        let MappedData::Object { type_tag } = &m.data else {
                            unreachable!()
                        };
                        let want = if name == "counter" {
                            COUNTER_TAG
                        } else {
                            MUTEX_TAG
                        };
                        assert_eq!(type_tag, want);
                    }
                }
            }
            assert_eq!(got.len(), entries.len() - 2);
            assert_same(&expected, &got);
        }
    }

    #[test]
    fn mapped_truncation_at_every_offset_is_detected() {
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(&path, "ferro", &small_entries()).unwrap();
        let bytes = fs::read(&path).unwrap();
        let tok = crate::cancel::CancelToken::new();
        for verify in [false, true] {
            for len in 0..bytes.len() {
                let e = map_ferro(&path, &bytes[..len], verify, &tok).unwrap_err();
                assert_corrupt(&e, &path);
            }
            let mut longer = bytes.clone();
            longer.extend_from_slice(&[0; 64]);
            assert_corrupt(&map_ferro(&path, &longer, verify, &tok).unwrap_err(), &path);
        }
        let e = map_ferro(&path, &[], false, &tok).unwrap_err();
        assert!(e.message.contains("empty"), "{e}");
    }

    #[test]
    fn mapped_bit_flips_are_detected_where_read() {
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(&path, "ferro", &small_entries()).unwrap();
        let bytes = fs::read(&path).unwrap();
        let tok = crate::cancel::CancelToken::new();
        let f = open_ferro(&path).unwrap();
        // Without verify, only the payloads left in place (numeric and bool
        // tensors), objects' payloads and the padding go unread.
        let owner = |i: usize| {
            f.entries
                .iter()
                .find(|e| (e.offset..e.offset + e.length).contains(&(i as u64)))
        };
        let unread = |i: usize| {
            let in_payloads = (HEADER_LEN..f.index_offset).contains(&(i as u64));
            in_payloads
                && owner(i).is_none_or(|e| {
                    e.kind == KIND_OBJECT
                        || (e.kind == KIND_TENSOR && e.dtype != DataType::String as u8)
                })
        };
        let mut unread_count = 0;
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1 << (i % 8);
            let e = map_ferro(&path, &b, true, &tok).unwrap_err();
            assert_corrupt(&e, &path);
            if let Some(o) = owner(i) {
                assert_eq!(e.context.blob.as_deref(), Some(o.name.as_str()), "{e}");
            }
            let quick = map_ferro(&path, &b, false, &tok);
            if unread(i) {
                unread_count += 1;
                assert!(quick.is_ok(), "byte {i}");
            } else {
                assert_corrupt(&quick.unwrap_err(), &path);
            }
        }
        assert!(unread_count > 64, "{unread_count}");
    }

    #[test]
    fn mapping_a_minidb_or_a_foreign_file_is_refused() {
        let dir = Scratch::new("storage");
        let tok = crate::cancel::CancelToken::new();
        let m = dir.file("m");
        save_blobs(&m, "minidb", &small_entries()).unwrap();
        let e = map_ferro(&m, &fs::read(&m).unwrap(), false, &tok).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert_eq!(e.context.file.as_deref(), Some(m.as_str()));
        assert!(
            e.message.contains("minidb") && e.message.contains("'ferro'"),
            "{e}"
        );
        let e = map_ferro("x", b"hello, this is not a db at all", false, &tok).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint, "{e}");
    }

    #[test]
    fn mapped_verify_is_cancellable() {
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(
            &path,
            "ferro",
            &[("x".into(), t(&[1000], vec![1.0f32; 1000]))],
        )
        .unwrap();
        let data = fs::read(&path).unwrap();
        let tok = crate::cancel::CancelToken::new();
        tok.cancel();
        assert!(map_ferro(&path, &data, false, &tok).is_ok());
        assert!(map_ferro(&path, &data, true, &tok)
            .unwrap_err()
            .is_cancelled());
    }
}
