//! Blob dbs on disk: what Save, Load and DBExists read and write.
//!
//! Two formats, chosen by `db_type`:
//!
//! * `"ferro"` (the default): a self-checking single file. Layout (every
//!   integer little-endian):
//!
//!   ```text
//!   [0, 64)        header: magic "FERROCKP" | u32 version (2; 1 is read
//!                  too) | u32 flags (0) | 44 zero bytes | u32 CRC-32 of
//!                  bytes [0, 60)
//!   [64, I)        payloads, one per blob, each starting at the first
//!                  multiple of 64 after the previous one; in version 2 a
//!                  numeric tensor of 1 MiB or more starts at the first
//!                  multiple of 4096 instead (so that it can be read with
//!                  direct I/O); zero padding in between (checked on load)
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
//! Caffe2 type tag with [`register_blob_codec`] (`crate::builtins` registers
//! the op families' codecs; nothing registers as a side effect).
//!
//! Modules: a format per file ([`Ferro`] in `ferro.rs`, [`MiniDb`] in
//! `minidb.rs`, behind the [`DbFormat`] trait, listed once in [`FORMATS`]);
//! `files.rs` (crash-safe writes, regular-file opens), `codecs.rs` (object
//! codecs), `tensor_proto.rs` (tensors as `TensorProto`s), `mapped.rs`
//! (a ferro db checked in memory).

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

mod codecs;
mod direct;
mod ferro;
pub use direct::direct_bytes_read;
mod files;
mod leveldb;
mod mapped;
mod minidb;
mod tensor_proto;

use codecs::*;
pub use codecs::{register_blob_codec, registered_codecs, BlobDecoder};
pub use ferro::Ferro;
use ferro::*;
use files::*;
pub use files::{
    check_replaceable, open_regular, sweep_stale_temporaries, temp_path_for, write_file,
};
pub use leveldb::{write_leveldb_records, LevelDb, LevelDbRecords};
pub use mapped::{map_ferro, MappedBlob, MappedData};
use minidb::*;
pub use minidb::{tensor_from_proto, MiniDb, MiniDbRecords};
use tensor_proto::*;

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

// ------------------------------------------------------------ db formats --

/// A db format: how blobs are written to, read from, listed in and checked
/// in one file (or one directory). The registry is [`FORMATS`]; Caffe2's
/// equivalent was `REGISTER_CAFFE2_DB`. A single-file format implements
/// [`write`](DbFormat::write) and writes go through a crash-safe temporary
/// (see the module docs), which the format only fills; a format stored
/// otherwise (LevelDB, a directory) implements [`save`](DbFormat::save) and
/// [`exists`](DbFormat::exists) itself.
pub trait DbFormat: Sync {
    /// The `db_type` that selects it.
    fn name(&self) -> &'static str;
    /// Other `db_type` names that select it (Caffe2 registered some formats
    /// twice, e.g. "LevelDB" and "leveldb").
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }
    /// A few words for error messages listing the formats.
    fn about(&self) -> &'static str;
    /// Whether blob names may contain [`CHUNK_SEPARATOR`] (a format that
    /// keys chunks by `name#%i` must refuse them).
    fn allows_chunk_separator(&self) -> bool {
        true
    }
    /// Writes checked entries to `w` (a temporary beside `path`), with the
    /// options (chunking, float format) that apply to the format.
    fn write(
        &self,
        _w: &mut BufWriter<File>,
        _path: &str,
        _entries: &[(&str, Prepared<'_>)],
        _opts: &SaveOptions,
    ) -> Result<()> {
        Err(Error::internal(format!(
            "the '{}' db format is not a single file",
            self.name()
        )))
    }
    /// Writes the db at `path`, replacing any db there (by default through
    /// a crash-safe temporary file filled by [`write`](DbFormat::write)).
    fn save(&self, path: &str, entries: &[(&str, Prepared<'_>)], opts: &SaveOptions) -> Result<()> {
        write_atomically(path, |w| self.write(w, path, entries, opts))
    }
    /// Whether a db of this format can be opened at `path` (by default: a
    /// regular file is there).
    fn exists(&self, path: &str) -> bool {
        open_regular(path).is_ok()
    }
    /// Whether what is at `path` looks like a db of this format from its
    /// layout or first bytes (`FORMATS` are asked in order; the last, a
    /// format without a signature, takes any regular file).
    fn recognises(&self, path: &str) -> bool {
        self.exists(path)
    }
    /// The bytes the db at `path` takes (by default the file's size).
    fn size(&self, path: &str) -> Result<u64> {
        let (_, meta) = open_regular(path).map_err(io_error(path))?;
        Ok(meta.len())
    }
    /// A CRC-32 of the whole db for formats that have no checksums of their
    /// own (their damage would otherwise go unseen); None for formats that
    /// check themselves ([`verify`](DbFormat::verify)).
    fn checksum(&self, _path: &str) -> Result<Option<u32>> {
        Ok(None)
    }
    /// Deletes the db at `path` (a missing one is no error).
    fn remove(&self, path: &str) -> Result<()> {
        match fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(&e, path)),
            _ => Ok(()),
        }
    }
    /// The db as Caffe2's key-value records, for a DB reader (`CreateDB`);
    /// formats that are not key-value dbs refuse.
    fn records(&self, path: &str) -> Result<Box<dyn KvRecords>> {
        Err(Error::invalid_arg(format!(
            "cannot open a db of type '{}' as a key-value db (a DB reader reads {})",
            self.name(),
            kv_formats()
        ))
        .with_file(path))
    }
    /// The blobs whose stored name `select` accepts, in file order.
    fn load(&self, path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<(String, BlobValue)>>;
    /// What the db holds, without (if the format allows) loading its data.
    fn list(&self, path: &str) -> Result<Vec<EntryInfo>>;
    /// Checks the db as far as the format can, keeping no data.
    fn verify(&self, path: &str) -> Result<()>;
    /// The db's key-value records as they are stored (Caffe2's
    /// `DB::NewCursor`: what `workspace.C.create_db(..., Mode.read)`
    /// walks), in the db's order. A blob format that is not a record store
    /// (ferro) gives each blob as the record a minidb of it would hold: its
    /// name and its serialized `BlobProto`, a tensor in one record.
    fn read_kv(&self, path: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Writes `records` as the db at `path` (Caffe2's `Transaction::Put`
    /// then `Commit`), crash-safely, replacing a db of this format there. A
    /// blob format (ferro) takes records as a minidb holds them: each key a
    /// blob name (`name#%<chunk>` for a tensor's chunks), each value a
    /// serialized `BlobProto`; other records are refused with an error.
    fn write_kv(&self, path: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()>;
    /// The records of [`DbFormat::read_kv`] as a cursor that reads each
    /// value when asked: a format that can index its file without reading
    /// the values (minidb) overrides this, so walking a db larger than
    /// memory costs one value at a time; by default the records are read
    /// whole.
    fn kv_cursor(&self, path: &str) -> Result<Box<dyn KvCursor>> {
        Ok(Box::new(self.read_kv(path)?))
    }
}

/// A db's raw key-value records, in the db's order (Python's
/// `db.Cursor`): every key known, each value read when asked.
pub trait KvCursor: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The key of record `i` (`i < len()`): any bytes.
    fn key(&self, i: usize) -> &[u8];
    /// The value of record `i` (`i < len()`).
    fn value(&self, i: usize) -> Result<Vec<u8>>;
}

/// Records read whole.
impl KvCursor for Vec<(Vec<u8>, Vec<u8>)> {
    fn len(&self) -> usize {
        <[_]>::len(self)
    }
    fn key(&self, i: usize) -> &[u8] {
        &self[i].0
    }
    fn value(&self, i: usize) -> Result<Vec<u8>> {
        Ok(self[i].1.clone())
    }
}

/// The records of the blobs in `blobs`, as Caffe2's minidb or LevelDB would
/// hold them (each tensor in one record): [`DbFormat::read_kv`] of a blob
/// format.
fn blobs_as_kv(path: &str, blobs: &[(String, BlobValue)]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let refs: Vec<(&str, &BlobValue)> = blobs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let prepared = prepare(&refs, &MiniDb).map_err(|e| e.with_file(path))?;
    let opts = SaveOptions {
        chunk_size: 0,
        per_blob: Vec::new(),
    };
    let mut out = Vec::with_capacity(prepared.len());
    write_records(&prepared, &opts, &mut |key, value| {
        out.push((key.as_bytes().to_vec(), value.to_vec()));
        Ok(())
    })
    .map_err(|e| e.with_file(path))?;
    Ok(out)
}

/// Saves key-value records that are serialized `BlobProto`s (keyed as in a
/// minidb) as the blobs they hold, in the blob format `fmt`:
/// [`DbFormat::write_kv`] of a blob format.
fn save_kv_as_blobs(path: &str, fmt: &dyn DbFormat, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    let records = records
        .iter()
        .map(|(k, v)| {
            let key = String::from_utf8(k.clone()).map_err(|_| {
                Error::invalid_arg(format!(
                    "a '{}' db holds blobs: the key {:?} is not UTF-8, so not a blob name",
                    fmt.name(),
                    String::from_utf8_lossy(k)
                ))
                .with_file(path)
            })?;
            Ok(MiniRecord::whole(key, v.clone(), &|_| true))
        })
        .collect::<Result<Vec<_>>>()?;
    let blobs = load_records(path, records).map_err(|mut e| {
        // Records the caller gives, not a damaged file: a bad argument.
        e.kind = ErrorKind::InvalidArgument;
        e.message = format!(
            "a '{}' db holds blobs, so each value must be a serialized BlobProto: {}",
            fmt.name(),
            e.message
        );
        e
    })?;
    let refs: Vec<(&str, &BlobValue)> = blobs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    save_blob_refs(path, fmt, &refs, &SaveOptions::default())
}

/// The raw key-value records of the db at `path` (see [`DbFormat::read_kv`]).
pub fn read_kv(path: &str, db_type: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    db_format(db_type)
        .map_err(|e| e.with_file(path))?
        .read_kv(path)
}

/// A cursor over the raw key-value records of the db at `path` (see
/// [`DbFormat::kv_cursor`]).
pub fn kv_cursor(path: &str, db_type: &str) -> Result<Box<dyn KvCursor>> {
    db_format(db_type)
        .map_err(|e| e.with_file(path))?
        .kv_cursor(path)
}

/// Writes raw key-value records as the db at `path` (see
/// [`DbFormat::write_kv`]).
pub fn write_kv(path: &str, db_type: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    db_format(db_type)
        .map_err(|e| e.with_file(path))?
        .write_kv(path, records)
}

/// Every db format, the default first: the one place to add a format.
pub static FORMATS: &[&dyn DbFormat] = &[&Ferro, &MiniDb, &LevelDb];

/// Every `db_type` name [`FORMATS`] accepts (names and aliases), in order:
/// Caffe2's `registered_dbs()`.
pub fn registered_dbs() -> Vec<&'static str> {
    FORMATS
        .iter()
        .flat_map(|f| std::iter::once(f.name()).chain(f.aliases().iter().copied()))
        .collect()
}

/// The formats a DB reader can walk, for messages.
fn kv_formats() -> String {
    FORMATS
        .iter()
        .filter(|f| f.name() != Ferro.name())
        .map(|f| format!("'{}'", f.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A db read as Caffe2's key-value records, in the db's order (a minidb's
/// file order, a LevelDB's key order); what a DB reader walks.
pub trait KvRecords: Send + Sync {
    fn path(&self) -> &str;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The key of record `i` (`i < len()`).
    fn key(&self, i: usize) -> &str;
    /// The value of record `i` (`i < len()`).
    fn value(&self, i: usize) -> Result<Vec<u8>>;
}

/// Caffe2 formats that ferrocaffe does not implement (named in errors).
const CAFFE2_ONLY_FORMATS: &[&str] = &["lmdb", "rocksdb", "zmqdb", "protodb"];

/// The format of a `db_type` argument. Unknown names and Caffe2 formats that
/// are not implemented (leveldb, lmdb, ...) are `InvalidArgument` errors.
pub fn db_format(name: &str) -> Result<&'static dyn DbFormat> {
    if let Some(f) = FORMATS
        .iter()
        .find(|f| f.name() == name || f.aliases().contains(&name))
    {
        return Ok(*f);
    }
    let names = || {
        FORMATS
            .iter()
            .map(|f| format!("'{}'", f.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(match name {
        "" => Error::invalid_arg(format!("a db_type is required (supported: {})", names())),
        s if CAFFE2_ONLY_FORMATS.contains(&s) => {
            let described: Vec<String> = FORMATS
                .iter()
                .map(|f| format!("'{}', {}", f.name(), f.about()))
                .collect();
            let list = match described.split_last() {
                Some((last, rest)) if !rest.is_empty() => {
                    format!("{}, and {last}", rest.join(", "))
                }
                _ => described.join(""),
            };
            Error::invalid_arg(format!(
                "db_type '{s}' is not supported by ferrocaffe (supported: {list})"
            ))
        }
        s => Error::invalid_arg(format!("unknown db_type '{s}' (supported: {})", names())),
    })
}

// ---------------------------------------------------------------- errors --

fn corrupt(path: &str, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg).with_file(path)
}

fn io_error(path: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(&e, path)
}

/// The format of the db at `path` judged from what is there (a LevelDB
/// directory, a file starting with ferro's magic, else a minidb file); None
/// when there is no db.
pub fn detect_db_type(path: &str) -> Option<&'static str> {
    FORMATS
        .iter()
        .find(|f| f.recognises(path))
        .map(|f| f.name())
}

/// What the checkpoint manifest records of a db: its format, its size and,
/// for a format without checksums of its own, a CRC-32 of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbInfo {
    pub db_type: &'static str,
    pub bytes: u64,
    pub checksum: Option<u32>,
}

/// [`DbInfo`] of the db at `path`, of type `db_type` (or the detected one,
/// else the default format, whose error then says what is there instead);
/// the checksum is read only when `checksum` is asked for (it reads the
/// whole db). A missing db is an IO error naming the path.
pub fn db_info(path: &str, db_type: Option<&str>, checksum: bool) -> Result<DbInfo> {
    let name = db_type.or_else(|| detect_db_type(path)).unwrap_or("ferro");
    let fmt = db_format(name).map_err(|e| e.with_file(path))?;
    Ok(DbInfo {
        db_type: fmt.name(),
        bytes: fmt.size(path)?,
        checksum: if checksum { fmt.checksum(path)? } else { None },
    })
}

/// Deletes the db of type `db_type` at `path` (a file, or a LevelDB's
/// directory); a missing db is no error.
pub fn remove_db(path: &str, db_type: &str) -> Result<()> {
    db_format(db_type)?.remove(path)
}

/// A CRC-32 of the whole file at `path`, read in large pieces.
fn file_crc32(path: &str) -> Result<u32> {
    let (mut f, _) = open_regular(path).map_err(io_error(path))?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 22];
    loop {
        let n = f.read(&mut buf).map_err(io_error(path))?;
        if n == 0 {
            return Ok(h.finalize());
        }
        h.update(&buf[..n]);
    }
}

/// Whether a db of this type exists at `path` (Caffe2's DBExists: it can be
/// opened for reading). Its content is not checked; Load does that.
pub fn db_exists(path: &str, db_type: &str) -> Result<bool> {
    Ok(db_format(db_type)?.exists(path))
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
#[derive(Clone, Debug)]
pub struct SaveOptions {
    /// Tensor elements per minidb record for the blobs no `per_blob` rule
    /// matches (Caffe2's `chunk_size` argument): -1 means the default
    /// (1,000,000), 0 one record per tensor. The ferro format stores every
    /// tensor in one piece and ignores it.
    pub chunk_size: i64,
    /// Caffe2's `SerializationOptions`: the first rule whose pattern matches
    /// a blob's stored name applies to it.
    pub per_blob: Vec<BlobOptions>,
}

/// One of Caffe2's `BlobSerializationOptions`, checked.
#[derive(Clone, Debug)]
pub struct BlobOptions {
    /// Matched against the whole stored name; `None` matches every blob.
    pub pattern: Option<regex::Regex>,
    /// Tensor elements per minidb record, in the option's convention: 0 the
    /// default (1,000,000), -1 one record per tensor.
    pub chunk_size: i64,
    /// Store float32 tensors as bfloat16 (Caffe2's `FLOAT_BFLOAT16`; minidb
    /// only, the ferro format keeps every bit).
    pub bfloat16: bool,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            chunk_size: -1,
            per_blob: Vec::new(),
        }
    }
}

impl SaveOptions {
    /// Elements per chunk (0 for no chunking) and whether floats go as
    /// bfloat16, for the blob stored as `name`.
    fn for_blob(&self, name: &str) -> Result<(usize, bool)> {
        let rule = self.per_blob.iter().find(|r| match &r.pattern {
            None => true,
            Some(re) => re.is_match(name),
        });
        let chunk = match rule {
            Some(r) => match r.chunk_size {
                0 => DEFAULT_CHUNK_SIZE as i64,
                -1 => 0,
                n => n,
            },
            None if self.chunk_size == -1 => DEFAULT_CHUNK_SIZE as i64,
            None => self.chunk_size,
        };
        let chunk = usize::try_from(chunk).map_err(|_| {
            Error::invalid_arg(format!(
                "chunk_size must be -1 (the default), 0 (no chunking) or positive, got {chunk}"
            ))
        })?;
        Ok((chunk, rule.is_some_and(|r| r.bfloat16)))
    }
}

/// A blob checked and ready to be written.
pub enum Prepared<'a> {
    Tensor(&'a Tensor),
    Bytes(&'a [u8]),
    Object { tag: String, proto: Box<BlobProto> },
}

/// Checks names and kinds and serializes objects, before any file is opened.
fn prepare<'a>(
    entries: &[(&'a str, &'a BlobValue)],
    db: &dyn DbFormat,
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
        if !db.allows_chunk_separator() && name.contains(CHUNK_SEPARATOR) {
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
    let ty = db_format(db_type).map_err(|e| e.with_file(path))?;
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
    let ty = db_format(db_type).map_err(|e| e.with_file(path))?;
    save_blob_refs(path, ty, entries, opts)
}

fn save_blob_refs(
    path: &str,
    ty: &dyn DbFormat,
    entries: &[(&str, &BlobValue)],
    opts: &SaveOptions,
) -> Result<()> {
    for (name, _) in entries {
        opts.for_blob(name)
            .map_err(|e| e.with_file(path).with_blob(name))?;
    }
    let prepared = prepare(entries, ty).map_err(|e| e.with_file(path))?;
    ty.save(path, &prepared, opts)
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
    db_format(db_type)
        .map_err(|e| e.with_file(path))?
        .load(path, select)
}

/// What a db holds, without loading its data (a minidb is parsed in full).
pub fn list_db(path: &str, db_type: &str) -> Result<Vec<EntryInfo>> {
    db_format(db_type)
        .map_err(|e| e.with_file(path))?
        .list(path)
}

/// Checks a db without keeping its data: every CRC, the layout and the
/// padding of a ferro checkpoint; a minidb is fully decoded (it has no
/// checksums, so damaged numbers inside it go unnoticed).
pub fn verify_db(path: &str, db_type: &str) -> Result<()> {
    db_format(db_type)
        .map_err(|e| e.with_file(path))?
        .verify(path)
}

/// Caffe2's `SerializeBlob`: one `BlobProto` (a tensor in a single chunk),
/// as protobuf bytes.
pub fn serialize_blob(name: &str, value: &BlobValue) -> Result<Vec<u8>> {
    let entries = [(name.to_string(), value.clone())];
    let refs: Vec<(&str, &BlobValue)> = entries.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let prepared = prepare(&refs, &Ferro)?;
    let mut out = Vec::new();
    match &prepared[0].1 {
        Prepared::Tensor(t) => tensor_chunks(name, t, 0, false, &mut |_, tp| {
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

    #[test]
    fn kv_cursors_give_the_records_read_kv_gives() {
        let dir = Scratch::new("cursor");
        let records: Vec<(Vec<u8>, Vec<u8>)> = vec![
            (b"b".to_vec(), b"two".to_vec()),
            (vec![0xff, 0x00, 0x61], vec![]),
            (b"a".to_vec(), vec![7u8; 100_000]),
        ];
        for t in ["minidb", "leveldb"] {
            let path = dir.file(t);
            write_kv(&path, t, &records).unwrap();
            let whole = read_kv(&path, t).unwrap();
            let c = kv_cursor(&path, t).unwrap();
            assert_eq!(c.len(), whole.len(), "{t}");
            for (i, (k, v)) in whole.iter().enumerate() {
                assert_eq!(c.key(i), k.as_slice(), "{t} key {i}");
                assert_eq!(&c.value(i).unwrap(), v, "{t} value {i}");
            }
        }
        // A minidb's values are read when asked: a file cut short after
        // the cursor opened it is an error naming the record, not a panic.
        let path = dir.file("minidb");
        let c = kv_cursor(&path, "minidb").unwrap();
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(20).unwrap();
        let e = c.value(2).unwrap_err();
        assert!(
            e.full_message().contains("record #2"),
            "{}",
            e.full_message()
        );
        let e = kv_cursor(&path, "minidb")
            .err()
            .expect("a cut minidb is refused");
        assert!(
            e.full_message().contains("truncated"),
            "{}",
            e.full_message()
        );
    }

    #[test]
    fn db_info_detects_each_format_and_checksums_minidb_only() {
        let dir = Scratch::new("info");
        let blob = |v: f32| {
            vec![(
                "w".to_string(),
                BlobValue::Tensor(Tensor::F32(ArrayD::from_elem(IxDyn(&[3]), v).into())),
            )]
        };
        for t in ["ferro", "minidb", "leveldb"] {
            let path = dir.file(t);
            save_blobs(&path, t, &blob(1.0)).unwrap();
            assert_eq!(detect_db_type(&path), Some(t), "{t}");
            let info = db_info(&path, None, true).unwrap();
            assert_eq!(info.db_type, t);
            let on_disk: u64 = if t == "leveldb" {
                fs::read_dir(&path)
                    .unwrap()
                    .map(|e| e.unwrap().metadata().unwrap().len())
                    .sum()
            } else {
                fs::metadata(&path).unwrap().len()
            };
            assert_eq!(info.bytes, on_disk, "{t}");
            if t == "minidb" {
                let want = crc32fast::hash(&fs::read(&path).unwrap());
                assert_eq!(info.checksum, Some(want));
                // another value, another checksum
                save_blobs(&path, t, &blob(2.0)).unwrap();
                assert_ne!(db_info(&path, Some(t), true).unwrap().checksum, Some(want));
            } else {
                assert_eq!(info.checksum, None, "{t} checks itself");
            }
            assert_eq!(db_info(&path, Some(t), false).unwrap().checksum, None);
            remove_db(&path, t).unwrap();
            assert_eq!(detect_db_type(&path), None);
            remove_db(&path, t).unwrap(); // a missing db is no error
        }
        let err = db_info(&dir.file("none"), None, false).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Io);
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
        assert_eq!(le_u32(&bytes, 8), 2);
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
    fn large_numeric_payloads_start_on_a_page_in_version_2() {
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        // 1 MiB of f32 (the threshold) after 3 bytes, then a 1 MiB string
        // tensor's worth of bytes (not numeric: 64-byte aligned), then 1 MiB
        // less 4 bytes of i32 (below the threshold: 64-byte aligned).
        let big: Vec<f32> = (0..1 << 18).map(|i| i as f32).collect();
        let under: Vec<i32> = (0..(1 << 18) - 1).collect();
        save_blobs(
            &path,
            "ferro",
            &[
                ("a".into(), t(&[3], vec![1u8, 2, 3])),
                ("big".into(), t(&[1 << 18], big.clone())),
                ("bytes".into(), BlobValue::Bytes(vec![7u8; 1 << 20])),
                ("under".into(), t(&[(1 << 18) - 1], under.clone())),
            ],
        )
        .unwrap();
        let bytes = fs::read(&path).unwrap();
        // "a" at 64 (3 bytes); "big" at the first page after 67: 4096.
        assert!(bytes[67..4096].iter().all(|&b| b == 0));
        assert_eq!(&bytes[4096..4100], &0f32.to_le_bytes());
        let big_end = 4096 + (4 << 18);
        assert_eq!(
            &bytes[big_end - 4..big_end],
            &(((1 << 18) - 1) as f32).to_le_bytes()
        );
        // "bytes" at the next multiple of 64 (big_end is one), "under" after it.
        assert_eq!(bytes[big_end], 7);
        let under_at = big_end + (1 << 20);
        assert_eq!(&bytes[under_at..under_at + 4], &0i32.to_le_bytes());
        let got = load_db(&path, "ferro").unwrap();
        assert_same(&got[1..2], &[("big".into(), t(&[1 << 18], big))]);
        assert_same(&got[3..], &[("under".into(), t(&[(1 << 18) - 1], under))]);
        verify_db(&path, "ferro").unwrap();
        // A nonzero byte in the page padding before "big" is damage.
        let mut b = bytes.clone();
        b[4000] = 1;
        fs::write(&path, &b).unwrap();
        assert!(load_db(&path, "ferro")
            .unwrap_err()
            .full_message()
            .contains("padding"));
        assert!(verify_db(&path, "ferro")
            .unwrap_err()
            .full_message()
            .contains("padding"));
    }

    /// Writes `path`'s dirty pages and drops it from the page cache.
    #[cfg(target_os = "linux")]
    fn evict(path: &str) {
        use std::os::unix::io::AsRawFd;
        let f = fs::File::open(path).unwrap();
        f.sync_all().unwrap();
        // SAFETY: a valid open descriptor; the call only drops clean pages.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn uncached_payloads_are_read_directly_and_still_checked() {
        // Direct reads change nothing a Load returns or detects: the same
        // values, a damaged byte anywhere is still a CRC error naming the
        // blob, a warm file is read from the cache, and direct reads can be
        // turned off.
        let n = (20 << 20) / 4 + 3; // three pieces, the last not page-sized
        let big: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 100_003) as f32 - 5.0)
            .collect();
        let entries = vec![
            ("head".to_string(), t(&[3], vec![1.5f64, -2.0, 3.25])),
            ("big".to_string(), t(&[n], big)),
            ("tail".to_string(), BlobValue::Bytes(b"end".to_vec())),
        ];
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        save_blobs(&path, "ferro", &entries).unwrap();
        direct::FORCE_FOR_TESTS.store(true, std::sync::atomic::Ordering::Relaxed);
        let direct_here = {
            let f = fs::File::open(&path).unwrap();
            direct::Direct::open(&f, f.metadata().unwrap().len()).is_some()
        };
        evict(&path);
        let before = direct_bytes_read();
        assert_same(&load_db(&path, "ferro").unwrap(), &entries);
        let cold = direct_bytes_read() - before;
        if direct_here {
            // Every whole page of "big" (the other payloads are too small).
            assert_eq!(cold, (n as u64 * 4) / 4096 * 4096);
        }
        // Warm (read through the cache): no direct reads.
        let _ = fs::read(&path).unwrap();
        let before = direct_bytes_read();
        assert_same(&load_db(&path, "ferro").unwrap(), &entries);
        assert_eq!(direct_bytes_read(), before);
        // A flipped bit in each piece of an evicted file.
        let raw = fs::read(&path).unwrap();
        for at in [4096 + 5, 4096 + (9 << 20), 4096 + n * 4 - 1] {
            let mut b = raw.clone();
            b[at] ^= 0x20;
            fs::write(&path, &b).unwrap();
            evict(&path);
            let e = load_db(&path, "ferro").unwrap_err();
            assert_corrupt(&e, &path);
            assert_eq!(e.context.blob.as_deref(), Some("big"), "{e}");
        }
    }

    #[test]
    fn version_1_files_still_load() {
        // Version 1 placed every payload at a multiple of 64, large ones too.
        let dir = Scratch::new("storage");
        let path = dir.file("db");
        let n = (3 << 20) / 4 + 5;
        let big: Vec<f32> = (0..n).map(|i| (i % 977) as f32 * 0.5).collect();
        let entries = [
            ("a".to_string(), t(&[3], vec![1u8, 2, 3])),
            ("big".to_string(), t(&[n], big.clone())),
        ];
        let refs: Vec<(&str, &BlobValue)> = entries.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let prepared = prepare(&refs, &ferro::Ferro).unwrap();
        let mut file = fs::File::create(&path).unwrap();
        ferro::write_ferro_version(&mut file, &path, &prepared, 1).unwrap();
        drop(file);
        let bytes = fs::read(&path).unwrap();
        assert_eq!(le_u32(&bytes, 8), 1);
        assert_eq!(&bytes[128..132], &0f32.to_le_bytes()); // "big" at 128
        assert_same(&load_db(&path, "ferro").unwrap(), &entries);
        verify_db(&path, "ferro").unwrap();
        assert_eq!(list_db(&path, "ferro").unwrap()[1].bytes, (n * 4) as u64);
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
            ("t".to_string(), BlobValue::Tensor(Tensor::from(a.clone()))),
            ("b".into(), BlobValue::Tensor(Tensor::from(b.clone()))),
        ];
        for db in ["ferro", "minidb"] {
            let path = dir.file(db);
            save_blobs(&path, db, &entries).unwrap();
            let back = load_db(&path, db).unwrap();
            assert_eq!(back[0].1.tensor().unwrap(), &Tensor::from(a.clone()));
            assert_eq!(back[1].1.tensor().unwrap(), &Tensor::from(b.clone()));
        }
        // A staging buffer larger than one stage, converted piecewise.
        let big =
            ndarray::ArrayD::from_shape_fn(IxDyn(&[300, 300]), |i| (i[0] * 300 + i[1]) as f32)
                .reversed_axes();
        let path = dir.file("big");
        save_blobs(
            &path,
            "ferro",
            &[("big".into(), BlobValue::Tensor(Tensor::from(big.clone())))],
        )
        .unwrap();
        assert_eq!(
            load_db(&path, "ferro").unwrap()[0].1.tensor().unwrap(),
            &Tensor::from(big)
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
        save_blobs_with(
            &path,
            "minidb",
            &entries,
            &SaveOptions {
                chunk_size: 4,
                ..Default::default()
            },
        )
        .unwrap();
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
        save_blobs_with(
            &path,
            "minidb",
            &entries,
            &SaveOptions {
                chunk_size: 0,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(parse_records(&fs::read(&path).unwrap())[0].0, "x#%0");
        assert_eq!(parse_records(&fs::read(&path).unwrap())[1].0, "flags#%0");
        assert!(save_blobs_with(
            &path,
            "minidb",
            &entries,
            &SaveOptions {
                chunk_size: -2,
                ..Default::default()
            }
        )
        .is_err());
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
        // A flipped bit in each piece of "big" (its payload starts on the
        // first page).
        for at in [4096 + 5, 4096 + (9 << 20), 4096 + (20 << 20) - 1] {
            let mut b = raw.clone();
            b[at] ^= 0x04;
            fs::write(&path, &b).unwrap();
            let e = load_db(&path, "ferro").unwrap_err();
            assert_corrupt(&e, &path);
            assert_eq!(e.context.blob.as_deref(), Some("big"), "{e}");
            // Padding is checked too.
            let mut b = raw.clone();
            b[4096 + (20 << 20) + 3] = 1; // between "big" and "tail"
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
        save_blobs_with(
            &good,
            "minidb",
            &entries,
            &SaveOptions {
                chunk_size: 2,
                ..Default::default()
            },
        )
        .unwrap();
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
        for db in ["lmdb", "rocksdb"] {
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
        let t = crate::with_match_dtype!(numeric *dtype, |T| le!(T), else other => match other {
            DataType::Bool => Tensor::from_vec(shape, b.iter().map(|&x| x == 1).collect()),
            other => panic!("{other} cannot be in place"),
        });
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
