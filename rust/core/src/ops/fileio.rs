//! Readers of data files on disk: Parquet files (or folders of them) and
//! `.npy` arrays, streamed in batches of records. They stand where Caffe2's
//! examples used a Hive reader.
//!
//! Ops: CreateParquetReader, ReadParquetBatch, ResetParquetReader,
//! ParquetSchema, CreateParquetWriter, SetParquetWriterSchema,
//! WriteParquetBatch, CloseParquetWriter, CreateNpyReader, ReadNpyBatch,
//! ResetNpyReader.
//!
//! # Parquet
//!
//! A [`ParquetReader`] blob reads a list of files (a folder is every file
//! under it, recursively, in name order, skipping names that start with `.`
//! or `_` as Hive, Spark and pyarrow do) through the `parquet` crate's
//! low-level typed column readers: each batch decodes its records' pages
//! straight into the `Vec<T>` that becomes the tensor, the columns of a batch
//! in parallel. Only the pages being decoded are in memory, never a whole
//! file.
//!
//! Every requested column is one *field*: a primitive column is one tensor
//! of shape `[records]`; a list of primitives (Parquet's LIST, 3-level or
//! legacy 2-level) is two tensors, `lengths` (int32, one per record) and
//! `values` (all items of the batch), the layout of a `schema.List`. Column
//! names are dotted paths (`a.b`, or `a:b` in schema style); a list column is
//! named by its LIST group (`items`, not `items.list.element`).
//!
//! Types: BOOLEAN -> bool, INT32 -> int32 (int8/int16/uint8/uint16 by their
//! annotation, uint32 widened to int64), INT64 -> int64, FLOAT -> float32,
//! DOUBLE -> float64, BYTE_ARRAY and FIXED_LEN_BYTE_ARRAY -> string (bytes).
//! INT96, DECIMAL, FLOAT16, UINT64 and nested lists are refused with an error
//! naming the file and column, and so is a null value (a tensor has none),
//! except that a null list reads as an empty list.
//!
//! Reading is atomic: the reader's position sits behind a mutex, so several
//! pipeline threads can share one reader and each record is handed out
//! exactly once. The position (records handed out) is saved with the reader
//! (`BlobObject::serialize`, type tag [`PARQUET_READER_TAG`]); loading
//! reopens the files, checks they still hold the same rows and columns, and
//! resumes there.
//!
//! A [`ParquetWriter`] blob writes records to a new Parquet file: each field
//! a column (`a:b` is a column `b` in a group `a`, `x:lengths` + `x:values`
//! a LIST column `x`), required (no nulls), strings as UTF-8 STRING (or
//! BINARY). Records are buffered into row groups; the file is written to a
//! temporary beside its path and renamed into place on close, so a file
//! that exists is complete. Writes are atomic (a mutex), so pipeline
//! threads can share a writer.
//!
//! # .npy
//!
//! A [`NpyReader`] reads one or several `.npy` files as the columns of one
//! dataset: row `i` of every file is record `i`, so every file must have the
//! same first dimension; the other dimensions are each record's shape. Rows
//! are read with positioned reads straight from the file (no memory map: a
//! file truncated under a mapping would crash the process, a read just
//! fails). A batch is read under the reader's mutex and the position moves
//! only after it was read, so threads sharing a reader get distinct rows
//! and a failed read loses none. dtypes: bool, int8/16/32/64,
//! uint8/16, float32/64, either byte order, `S<n>` and `U<n>` (to UTF-8
//! byte strings, trailing NULs dropped as numpy does).
//!
//! Errors: a missing or unreadable file is an `Io` error and so is a corrupt
//! one (not a Parquet or .npy file, truncated, a page that fails to decode
//! or whose CRC-32, when the writer stored one, does not match its bytes);
//! a column of the wrong type is a `Type` error. All name the file (and the
//! column); a reader that failed keeps its position, and the next read tries
//! again from there.

use super::kernel;
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{from_panic, Error, ErrorKind, Result};
use crate::ir::BlobProto;
use crate::operator::{OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::storage;
use crate::tensor::{collect_array, try_vec, DataType, Tensor};
use bytes::Bytes;
use parking_lot::Mutex;
use parquet::basic::{Compression, ConvertedType, LogicalType, Repetition, Type as PhysicalType};
use parquet::column::reader::{ColumnReader, ColumnReaderImpl};
use parquet::data_type::{
    BoolType, ByteArrayType, DataType as PqType, DoubleType, FixedLenByteArrayType, FloatType,
    Int32Type, Int64Type,
};
use parquet::file::reader::{ChunkReader, FileReader, Length};
use parquet::file::serialized_reader::SerializedFileReader;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::{SchemaDescriptor, Type as SchemaType};
use rayon::prelude::*;
use std::fmt;
use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

/// The type tag of a saved [`ParquetReader`].
pub const PARQUET_READER_TAG: &str = "ferrocaffe::ParquetReader";
/// The type tag of a saved [`NpyReader`].
pub const NPY_READER_TAG: &str = "ferrocaffe::NpyReader";

/// Records per batch when no `batch_size` is given.
pub const DEFAULT_BATCH_SIZE: i64 = 1024;

/// The codecs of this family's saved objects.
pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    vec![
        (PARQUET_READER_TAG, decode_parquet_reader),
        (NPY_READER_TAG, decode_npy_reader),
    ]
}

pub fn schemas() -> Vec<OpSchema> {
    const PATH: crate::operator::ArgDoc = arg!(
        "path",
        "string",
        "\"\"",
        "a Parquet file, or a folder read as every data file under it"
    );
    const PATHS: crate::operator::ArgDoc = arg!(
        "paths",
        "strings",
        "[]",
        "more files or folders, read after `path` in this order"
    );
    const COLUMNS: crate::operator::ArgDoc = arg!(
        "columns",
        "strings",
        "[] (every column)",
        "the columns to read, as dotted paths ('a.b' or 'a:b'); a list column by its name ('items')"
    );
    const DTYPES: crate::operator::ArgDoc = arg!(
        "dtypes",
        "ints",
        "[] (any)",
        "the expected Caffe2 dtype of each column (of the items, for a list); another type is an error"
    );
    const IS_LIST: crate::operator::ArgDoc = arg!(
        "is_list",
        "ints",
        "[] (any)",
        "whether each column is expected to be a list (1) or not (0)"
    );
    vec![
        OpSchema::new("CreateParquetReader", create_parquet_reader)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                PATH,
                PATHS,
                COLUMNS,
                arg!("batch_size", "int", "1024", "records per batch, >= 1"),
                DTYPES,
                IS_LIST,
            ])
            .doc(
                "Opens the Parquet files (reading only their footers), checks that every file has the columns with \
                 the same types, and writes a reader positioned at the first record into the output.",
            ),
        OpSchema::new("ReadParquetBatch", read_parquet_batch)
            .inputs(1, 1)
            .outputs(1, MANY)
            .args(&[arg!("batch_size", "int", "0", "records to read; 0: the reader's batch_size")])
            .doc(
                "Input a Parquet reader, outputs one tensor per column (two for a list column: lengths, then \
                 values): the next batch_size records, or all that are left; every output is empty at the end. \
                 Thread safe: readers sharing a reader get distinct records, each exactly once.",
            ),
        OpSchema::new("ResetParquetReader", reset_parquet_reader)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Moves a Parquet reader back to the first record."),
        OpSchema::new("ParquetSchema", parquet_schema)
            .inputs(0, 0)
            .outputs(3, 3)
            .args(&[PATH, PATHS, COLUMNS, DTYPES, IS_LIST])
            .doc(
                "Outputs the columns a reader with these arguments would read: their names (string), Caffe2 dtypes \
                 (int32) and whether each is a list (bool). Fails as CreateParquetReader would.",
            ),
        OpSchema::new("CreateParquetWriter", create_parquet_writer)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("path", "string", "required", "the Parquet file to write (its folder must exist)"),
                arg!("compression", "string", "\"snappy\"", "none, snappy, gzip, zstd or lz4"),
                arg!("row_group_size", "int", "131072", "records buffered per row group, >= 1"),
                arg!("binary", "bool", "false", "write string tensors as BINARY (any bytes) instead of UTF-8 STRING"),
                arg!("fields", "strings", "[]", "the record's field names, if known now (else the first write's)"),
                arg!("dtypes", "ints", "[]", "the Caffe2 dtype of each field (with fields)"),
            ])
            .doc(
                "Writes a writer of a new Parquet file into the output. The file appears, complete, when the writer \
                 is closed (CloseParquetWriter); until then it is written to a temporary next to it.",
            ),
        OpSchema::new("SetParquetWriterSchema", set_parquet_writer_schema)
            .inputs(1, 1)
            .outputs(0, 0)
            .args(&[
                arg!("fields", "strings", "required", "the record's field names ('x:lengths', 'x:values' for a list)"),
                arg!("dtypes", "ints", "required", "the Caffe2 dtype of each field"),
            ])
            .doc("Fixes the writer's columns (a no-op when they are already these; an error when they differ)."),
        OpSchema::new("WriteParquetBatch", write_parquet_batch)
            .inputs(2, MANY)
            .outputs(0, 0)
            .args(&[arg!("fields", "strings", "required", "the field name of each input after the writer")])
            .doc(
                "Inputs (writer, field_1..field_n): appends one batch of records (1-D tensors, one row per record; \
                 a list as its int32 lengths then its values). The first write fixes the columns unless they were \
                 given; later batches must match. Thread safe.",
            ),
        OpSchema::new("CloseParquetWriter", close_parquet_writer)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Writes the buffered records and the footer and moves the file into place. Closing twice is a no-op."),
        OpSchema::new("CreateNpyReader", create_npy_reader)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("path", "string", "\"\"", "a first .npy file (the first column), before those of `paths`"),
                arg!("paths", "strings", "[]", "the .npy files, one per column; row i of each is record i"),
                arg!("batch_size", "int", "1024", "records per batch, >= 1"),
            ])
            .doc("Reads the .npy headers, checks the files agree on the number of records and writes a reader."),
        OpSchema::new("ReadNpyBatch", read_npy_batch)
            .inputs(1, 1)
            .outputs(1, MANY)
            .args(&[arg!("batch_size", "int", "0", "records to read; 0: the reader's batch_size")])
            .doc(
                "Input a .npy reader, outputs one tensor per file: the next batch_size rows (shape [rows, ...]), \
                 empty at the end. Thread safe: each record is handed out exactly once.",
            ),
        OpSchema::new("ResetNpyReader", reset_npy_reader)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Moves a .npy reader back to the first record."),
    ]
}

// ---------------------------------------------------------------- errors --

fn io_err(path: &str, msg: impl fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("{msg}")).with_file(path)
}

fn open_err(path: &str, what: &str, e: &std::io::Error) -> Error {
    io_err(path, format!("cannot open {what} '{path}': {e}"))
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    from_panic(p).into_message()
}

// ----------------------------------------------- saved-position encoding --

pub(crate) struct Enc(pub(crate) Vec<u8>);

impl Enc {
    pub(crate) fn new(magic: &[u8; 4]) -> Enc {
        let mut v = magic.to_vec();
        v.push(1); // format version
        Enc(v)
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
    }
}

pub(crate) struct Dec<'a> {
    what: &'static str,
    rest: &'a [u8],
}

impl<'a> Dec<'a> {
    pub(crate) fn new(what: &'static str, magic: &[u8; 4], bytes: &'a [u8]) -> Result<Dec<'a>> {
        let mut d = Dec { what, rest: bytes };
        if d.take(4)? != magic {
            return Err(d.bad("bad magic"));
        }
        let version = d.take(1)?[0];
        if version != 1 {
            return Err(d.bad(&format!("unsupported format version {version}")));
        }
        Ok(d)
    }
    pub(crate) fn bad(&self, msg: &str) -> Error {
        Error::new(
            ErrorKind::CorruptCheckpoint,
            format!("a saved {} is malformed: {msg}", self.what),
        )
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(self.bad("truncated"));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(crate) fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.rest.len())
            .ok_or_else(|| self.bad("a length is out of range"))
    }
    pub(crate) fn str(&mut self) -> Result<String> {
        let n = self.len()?;
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.bad("a string is not UTF-8"))
    }
    pub(crate) fn finish(&self) -> Result<()> {
        if !self.rest.is_empty() {
            return Err(self.bad(&format!("{} unexpected trailing bytes", self.rest.len())));
        }
        Ok(())
    }
}

pub(crate) fn object_proto(tag: &str, content: Vec<u8>) -> BlobProto {
    BlobProto {
        r#type: Some(tag.to_string()),
        content: Some(content),
        ..Default::default()
    }
}

// ------------------------------------------------------- positioned file --

/// A file read with positioned reads (`pread`), so concurrent column readers
/// over one file never race on a shared file offset (the `parquet` crate's
/// `File` reader seeks a shared descriptor).
struct PosFile {
    file: Arc<File>,
    len: u64,
}

struct PosRead {
    file: Arc<File>,
    pos: u64,
}

impl Read for PosRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Length for PosFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for PosFile {
    type T = BufReader<PosRead>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(BufReader::with_capacity(
            16 * 1024,
            PosRead {
                file: self.file.clone(),
                pos: start,
            },
        ))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if start
            .checked_add(length as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "a read of {length} bytes at offset {start} goes past the end of the file ({} bytes)",
                self.len
            )));
        }
        let mut v = vec![0u8; length];
        self.file.read_exact_at(&mut v, start)?;
        Ok(v.into())
    }
}

/// Opens a regular file (a FIFO or device would block or never end; see
/// `storage::open_regular`).
fn open_regular(path: &str, what: &str) -> Result<(File, u64)> {
    let (f, meta) = crate::storage::open_regular(path).map_err(|e| open_err(path, what, &e))?;
    Ok((f, meta.len()))
}

/// The data files a path names: itself, or for a folder every regular file
/// under it (recursively, sorted by name, skipping `.`/`_` names).
fn data_files(path: &str, out: &mut Vec<String>) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| open_err(path, "Parquet file", &e))?;
    if !meta.is_dir() {
        out.push(path.to_string());
        return Ok(());
    }
    fn walk(dir: &Path, out: &mut Vec<String>) -> Result<()> {
        let shown = dir.display().to_string();
        let mut entries = fs::read_dir(dir)
            .map_err(|e| open_err(&shown, "folder", &e))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| open_err(&shown, "folder", &e))?;
        entries.sort();
        for p in entries {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let shown = p.display().to_string();
            let meta = fs::metadata(&p).map_err(|e| open_err(&shown, "Parquet file", &e))?;
            if meta.is_dir() {
                walk(&p, out)?;
            } else if meta.is_file() {
                out.push(shown);
            }
        }
        Ok(())
    }
    let before = out.len();
    walk(Path::new(path), out)?;
    if out.len() == before {
        return Err(io_err(
            path,
            format!("the folder '{path}' holds no data files"),
        ));
    }
    Ok(())
}

// ------------------------------------------------------- parquet columns --

/// How a Parquet leaf column becomes a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Conv {
    Bool,
    I32,
    I64,
    F32,
    F64,
    Bytes,
    FixedBytes,
    I32ToI8,
    I32ToI16,
    I32ToU8,
    I32ToU16,
    U32ToI64,
}

impl Conv {
    fn dtype(self) -> DataType {
        match self {
            Conv::Bool => DataType::Bool,
            Conv::I32 => DataType::Int32,
            Conv::I64 | Conv::U32ToI64 => DataType::Int64,
            Conv::F32 => DataType::Float,
            Conv::F64 => DataType::Double,
            Conv::Bytes | Conv::FixedBytes => DataType::String,
            Conv::I32ToI8 => DataType::Int8,
            Conv::I32ToI16 => DataType::Int16,
            Conv::I32ToU8 => DataType::Uint8,
            Conv::I32ToU16 => DataType::Uint16,
        }
    }
}

/// The tensor type of a leaf, or why it has none.
fn leaf_conv(
    phys: PhysicalType,
    lt: Option<LogicalType>,
    ct: ConvertedType,
) -> std::result::Result<Conv, String> {
    let decimal = matches!(lt, Some(LogicalType::Decimal { .. })) || ct == ConvertedType::DECIMAL;
    if decimal {
        return Err("DECIMAL columns are not supported".into());
    }
    let int = match lt {
        Some(LogicalType::Integer {
            bit_width,
            is_signed,
        }) => Some((bit_width, is_signed)),
        _ => match ct {
            ConvertedType::INT_8 => Some((8, true)),
            ConvertedType::INT_16 => Some((16, true)),
            ConvertedType::INT_32 => Some((32, true)),
            ConvertedType::INT_64 => Some((64, true)),
            ConvertedType::UINT_8 => Some((8, false)),
            ConvertedType::UINT_16 => Some((16, false)),
            ConvertedType::UINT_32 => Some((32, false)),
            ConvertedType::UINT_64 => Some((64, false)),
            _ => None,
        },
    };
    Ok(match phys {
        PhysicalType::BOOLEAN => Conv::Bool,
        PhysicalType::INT32 => match int {
            Some((8, true)) => Conv::I32ToI8,
            Some((16, true)) => Conv::I32ToI16,
            Some((8, false)) => Conv::I32ToU8,
            Some((16, false)) => Conv::I32ToU16,
            Some((32, false)) => Conv::U32ToI64,
            _ => Conv::I32,
        },
        PhysicalType::INT64 => match int {
            Some((64, false)) => {
                return Err(
                    "UINT64 columns are not supported (int64 cannot hold every value)".into(),
                )
            }
            _ => Conv::I64,
        },
        PhysicalType::INT96 => {
            return Err("INT96 (legacy timestamp) columns are not supported".into())
        }
        PhysicalType::FLOAT => Conv::F32,
        PhysicalType::DOUBLE => Conv::F64,
        PhysicalType::BYTE_ARRAY => Conv::Bytes,
        PhysicalType::FIXED_LEN_BYTE_ARRAY => {
            if matches!(lt, Some(LogicalType::Float16)) {
                return Err("FLOAT16 columns are not supported".into());
            }
            Conv::FixedBytes
        }
    })
}

/// Where a leaf sits in the schema tree.
#[derive(Clone, Debug)]
struct Leaf {
    /// The field name: the dotted path, a list named by its LIST group.
    name: String,
    /// The full dotted path of the leaf.
    path: String,
    conv: std::result::Result<Conv, String>,
    max_def: i16,
    /// For a list: the definition level at which an item exists.
    item_def: Option<i16>,
    nested_lists: bool,
}

fn is_list_group(t: &SchemaType) -> bool {
    let info = t.get_basic_info();
    matches!(info.logical_type(), Some(LogicalType::List))
        || info.converted_type() == ConvertedType::LIST
}

fn leaves(schema: &SchemaDescriptor) -> Vec<Leaf> {
    (0..schema.num_columns())
        .map(|i| {
            let col = schema.column(i);
            let parts = col.path().parts();
            let mut node: &SchemaType = schema.root_schema();
            let mut chain: Vec<&SchemaType> = Vec::with_capacity(parts.len());
            let (mut def, mut reps, mut rep_at, mut item_def) = (0i16, 0, None, None);
            for part in parts {
                let next = node.get_fields().iter().find(|f| f.name() == part.as_str());
                let Some(next) = next else { break };
                node = next.as_ref();
                chain.push(node);
                let info = node.get_basic_info();
                if info.has_repetition() {
                    match info.repetition() {
                        Repetition::OPTIONAL => def += 1,
                        Repetition::REPEATED => {
                            def += 1;
                            reps += 1;
                            rep_at = Some(chain.len() - 1);
                            item_def = Some(def);
                        }
                        Repetition::REQUIRED => {}
                    }
                }
            }
            let path = parts.join(".");
            let name = match rep_at {
                Some(r) if r > 0 && is_list_group(chain[r - 1]) && r + 2 >= parts.len() => {
                    parts[..r].join(".")
                }
                _ => path.clone(),
            };
            Leaf {
                name,
                path,
                conv: leaf_conv(
                    col.physical_type(),
                    col.logical_type(),
                    col.converted_type(),
                ),
                max_def: col.max_def_level(),
                item_def,
                nested_lists: reps > 1,
            }
        })
        .collect()
}

/// One column as the reader outputs it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ColumnSpec {
    name: String,
    dtype: DataType,
    list: bool,
}

/// A requested column in one file.
#[derive(Clone, Copy, Debug)]
struct LeafRef {
    leaf: usize,
    conv: Conv,
    max_def: i16,
    item_def: Option<i16>,
}

fn find_leaf(all: &[Leaf], want: &str) -> std::result::Result<usize, String> {
    let dotted = want.replace(':', ".");
    let hits: Vec<usize> = (0..all.len())
        .filter(|&i| {
            all[i].name == want
                || all[i].path == want
                || all[i].name == dotted
                || all[i].path == dotted
        })
        .collect();
    match hits.len() {
        1 => Ok(hits[0]),
        0 => {
            let under: Vec<&str> = all
                .iter()
                .filter(|l| l.name.starts_with(&format!("{dotted}.")))
                .map(|l| l.name.as_str())
                .collect();
            if !under.is_empty() {
                return Err(format!(
                    "'{want}' is a group of {} columns ({}): name the columns",
                    under.len(),
                    under.join(", ")
                ));
            }
            let names: Vec<&str> = all.iter().take(20).map(|l| l.name.as_str()).collect();
            let more = if all.len() > 20 { ", ..." } else { "" };
            Err(format!(
                "has no column '{want}' (its columns: {}{more})",
                names.join(", ")
            ))
        }
        _ => Err(format!(
            "'{want}' names {} columns ({}): name one by its full path",
            hits.len(),
            hits.iter()
                .map(|&i| all[i].path.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn compression_supported(c: Compression) -> bool {
    matches!(
        c,
        Compression::UNCOMPRESSED
            | Compression::SNAPPY
            | Compression::GZIP(_)
            | Compression::ZSTD(_)
            | Compression::LZ4
            | Compression::LZ4_RAW
    )
}

/// One open Parquet file.
struct PqFile {
    path: String,
    reader: SerializedFileReader<PosFile>,
    rg_rows: Vec<u64>,
    rows: u64,
    cols: Vec<LeafRef>,
}

fn open_parquet(path: &str) -> Result<SerializedFileReader<PosFile>> {
    let (f, len) = open_regular(path, "Parquet file")?;
    if len == 0 {
        return Err(io_err(
            path,
            format!("'{path}' is not a Parquet file: it is empty (0 bytes)"),
        ));
    }
    let pf = PosFile {
        file: Arc::new(f),
        len,
    };
    match catch_unwind(AssertUnwindSafe(|| SerializedFileReader::new(pf))) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(io_err(
            path,
            format!("'{path}' is not a valid Parquet file: {e}"),
        )),
        Err(p) => Err(io_err(
            path,
            format!("'{path}' is not a valid Parquet file: {}", panic_text(p)),
        )),
    }
}

/// Opens the files and resolves the columns. `want` empty: every column of
/// the first file. `expect`: per column, the expected (dtype, is_list),
/// either may be `None` for "any".
fn open_parquet_files(
    paths: &[String],
    want: &[String],
    expect: &[(Option<DataType>, Option<bool>)],
) -> Result<(Vec<PqFile>, Vec<ColumnSpec>)> {
    let mut files: Vec<PqFile> = Vec::with_capacity(paths.len());
    let mut specs: Vec<ColumnSpec> = Vec::new();
    for path in paths {
        let reader = open_parquet(path)?;
        let md = reader.metadata();
        let all = leaves(md.file_metadata().schema_descr());
        let names: Vec<String> = if !want.is_empty() {
            want.to_vec()
        } else if !files.is_empty() {
            specs.iter().map(|s| s.name.clone()).collect()
        } else {
            all.iter().map(|l| l.name.clone()).collect()
        };
        if names.is_empty() {
            return Err(io_err(
                path,
                format!("the Parquet file '{path}' has no columns"),
            ));
        }
        let mut cols = Vec::with_capacity(names.len());
        for (c, want_name) in names.iter().enumerate() {
            let i = find_leaf(&all, want_name).map_err(|m| {
                Error::invalid_arg(format!("the Parquet file '{path}' {m}")).with_file(path)
            })?;
            let leaf = &all[i];
            let col_err = |kind: ErrorKind, m: String| {
                Error::new(
                    kind,
                    format!("column '{want_name}' of the Parquet file '{path}': {m}"),
                )
                .with_file(path)
            };
            if leaf.nested_lists {
                return Err(col_err(
                    ErrorKind::Type,
                    "lists of lists are not supported".into(),
                ));
            }
            let conv = leaf.conv.clone().map_err(|m| col_err(ErrorKind::Type, m))?;
            let spec = ColumnSpec {
                name: leaf.name.clone(),
                dtype: conv.dtype(),
                list: leaf.item_def.is_some(),
            };
            if let Some(prev) = specs.get(c) {
                if prev.dtype != spec.dtype || prev.list != spec.list {
                    return Err(col_err(
                        ErrorKind::Type,
                        format!(
                            "it holds {} but the earlier file '{}' holds {} in that column",
                            describe(spec.dtype, spec.list),
                            files[0].path,
                            describe(prev.dtype, prev.list)
                        ),
                    ));
                }
            } else {
                if let Some((dt, list)) = expect.get(c) {
                    let dt_bad = dt.is_some_and(|d| d != spec.dtype);
                    let list_bad = list.is_some_and(|l| l != spec.list);
                    if dt_bad || list_bad {
                        let want_desc =
                            describe(dt.unwrap_or(spec.dtype), list.unwrap_or(spec.list));
                        return Err(col_err(
                            ErrorKind::Type,
                            format!(
                                "it holds {} but {want_desc} were expected",
                                describe(spec.dtype, spec.list)
                            ),
                        ));
                    }
                }
                specs.push(spec);
            }
            cols.push(LeafRef {
                leaf: i,
                conv,
                max_def: leaf.max_def,
                item_def: leaf.item_def,
            });
        }
        let mut rg_rows = Vec::with_capacity(md.num_row_groups());
        for (g, rg) in md.row_groups().iter().enumerate() {
            let rows = u64::try_from(rg.num_rows()).map_err(|_| {
                io_err(
                    path,
                    format!(
                        "'{path}' is corrupt: row group {g} claims {} rows",
                        rg.num_rows()
                    ),
                )
            })?;
            for (c, col) in cols.iter().enumerate() {
                let codec = rg.column(col.leaf).compression();
                if !compression_supported(codec) {
                    return Err(Error::new(
                        ErrorKind::Io,
                        format!(
                            "column '{}' of the Parquet file '{path}' is compressed with {codec}, which ferrocaffe \
                             does not read (it reads UNCOMPRESSED, SNAPPY, GZIP, ZSTD, LZ4 and LZ4_RAW)",
                            names[c]
                        ),
                    )
                    .with_file(path));
                }
            }
            rg_rows.push(rows);
        }
        let rows = rg_rows.iter().sum();
        files.push(PqFile {
            path: path.clone(),
            reader,
            rg_rows,
            rows,
            cols,
        });
    }
    Ok((files, specs))
}

fn describe(dtype: DataType, list: bool) -> String {
    if list {
        format!("lists of {dtype}")
    } else {
        format!("{dtype} values")
    }
}

// --------------------------------------------------------- decoding --

enum ColReader {
    Bool(ColumnReaderImpl<BoolType>),
    I32(ColumnReaderImpl<Int32Type>),
    I64(ColumnReaderImpl<Int64Type>),
    F32(ColumnReaderImpl<FloatType>),
    F64(ColumnReaderImpl<DoubleType>),
    Bytes(ColumnReaderImpl<ByteArrayType>),
    Fixed(ColumnReaderImpl<FixedLenByteArrayType>),
    Unsupported,
}

impl ColReader {
    fn new(r: ColumnReader) -> ColReader {
        match r {
            ColumnReader::BoolColumnReader(r) => ColReader::Bool(r),
            ColumnReader::Int32ColumnReader(r) => ColReader::I32(r),
            ColumnReader::Int64ColumnReader(r) => ColReader::I64(r),
            ColumnReader::FloatColumnReader(r) => ColReader::F32(r),
            ColumnReader::DoubleColumnReader(r) => ColReader::F64(r),
            ColumnReader::ByteArrayColumnReader(r) => ColReader::Bytes(r),
            ColumnReader::FixedLenByteArrayColumnReader(r) => ColReader::Fixed(r),
            ColumnReader::Int96ColumnReader(_) => ColReader::Unsupported,
        }
    }

    fn skip(&mut self, n: usize) -> parquet::errors::Result<usize> {
        match self {
            ColReader::Bool(r) => r.skip_records(n),
            ColReader::I32(r) => r.skip_records(n),
            ColReader::I64(r) => r.skip_records(n),
            ColReader::F32(r) => r.skip_records(n),
            ColReader::F64(r) => r.skip_records(n),
            ColReader::Bytes(r) => r.skip_records(n),
            ColReader::Fixed(r) => r.skip_records(n),
            ColReader::Unsupported => Ok(0),
        }
    }
}

enum Values {
    Bool(Vec<bool>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bytes(Vec<Vec<u8>>),
}

/// One column's batch being assembled (possibly over several row groups and
/// files): values by the column's dtype, whatever the file's encoding.
struct Acc {
    values: Values,
    /// For a string column, how many of `values`' strings are this batch's:
    /// the rest are an earlier batch's, kept for their allocations.
    strings: usize,
    lengths: Option<Vec<i32>>,
    def: Vec<i16>,
    rep: Vec<i16>,
}

impl Values {
    /// No values of `dtype` (strings for any dtype without a numeric vector).
    fn empty(dtype: DataType) -> Values {
        match dtype {
            DataType::Bool => Values::Bool(Vec::new()),
            DataType::Int8 => Values::I8(Vec::new()),
            DataType::Int16 => Values::I16(Vec::new()),
            DataType::Uint8 => Values::U8(Vec::new()),
            DataType::Uint16 => Values::U16(Vec::new()),
            DataType::Int32 => Values::I32(Vec::new()),
            DataType::Int64 => Values::I64(Vec::new()),
            DataType::Float => Values::F32(Vec::new()),
            DataType::Double => Values::F64(Vec::new()),
            _ => Values::Bytes(Vec::new()),
        }
    }
}

impl Acc {
    /// An accumulator with room for `n` records, allocated fallibly (`n`
    /// comes from the batch_size argument and the record counts a file's
    /// footer declares). `old`: a string column's earlier batch, whose
    /// strings are overwritten in place (their buffers reused) before any
    /// is allocated.
    fn reusing(spec: &ColumnSpec, n: usize, old: Option<Vec<Vec<u8>>>) -> Result<Acc> {
        let cap = if spec.list { 0 } else { n };
        let what = || format!("a batch of {n} records of column '{}'", spec.name);
        let mut values = Values::empty(spec.dtype);
        macro_rules! reserve {
            ($($v:ident),*) => {
                match &mut values {
                    $(Values::$v(v) => *v = try_vec(cap, what())?,)*
                    Values::Bytes(v) => match old {
                        Some(o) => *v = o,
                        None => *v = try_vec(cap, what())?,
                    },
                }
            };
        }
        reserve!(Bool, I8, I16, U8, U16, I32, I64, F32, F64);
        Ok(Acc {
            values,
            strings: 0,
            lengths: if spec.list {
                Some(try_vec(n, what())?)
            } else {
                None
            },
            def: Vec::new(),
            rep: Vec::new(),
        })
    }

    /// The finished tensors: `[lengths,] values`.
    fn finish(self, out: &mut Vec<Tensor>) -> Result<()> {
        if let Some(l) = self.lengths {
            out.push(Tensor::from_vec(&[l.len()], l)?);
        }
        out.push(match self.values {
            Values::Bool(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::I8(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::I16(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::U8(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::U16(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::I32(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::I64(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::F32(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::F64(v) => Tensor::from_vec(&[v.len()], v)?,
            Values::Bytes(mut v) => {
                v.truncate(self.strings);
                Tensor::from_vec(&[v.len()], v)?
            }
        });
        Ok(())
    }
}

/// Converts each value, or names the first that does not fit.
fn narrow_into<T: TryFrom<i32>>(
    src: &[i32],
    dst: &mut Vec<T>,
    what: &str,
) -> std::result::Result<(), String> {
    dst.reserve(src.len());
    for &x in src {
        dst.push(
            T::try_from(x)
                .map_err(|_| format!("the value {x} does not fit its annotated type {what}"))?,
        );
    }
    Ok(())
}

/// Reads `k` records of one column, appending values (and list lengths).
fn read_records<T: PqType>(
    r: &mut ColumnReaderImpl<T>,
    k: usize,
    values: &mut Vec<T::T>,
    acc_levels: (&mut Vec<i16>, &mut Vec<i16>, &mut Option<Vec<i32>>),
    lr: &LeafRef,
) -> std::result::Result<(), String> {
    let (def, rep, lengths) = acc_levels;
    def.clear();
    rep.clear();
    let rep_buf = if lr.item_def.is_some() {
        Some(&mut *rep)
    } else {
        None
    };
    let (recs, nvals, nlevels) = r
        .read_records(k, Some(&mut *def), rep_buf, values)
        .map_err(|e| e.to_string())?;
    if recs != k {
        return Err(format!(
            "the column chunk ends after {recs} of the {k} records its row group promises (truncated or corrupt)"
        ));
    }
    match lr.item_def {
        None => {
            if lr.max_def > 0 && nvals != nlevels {
                return Err(format!(
                    "it holds {} null values; tensors cannot hold nulls",
                    nlevels - nvals
                ));
            }
        }
        Some(item_def) => {
            let lengths = lengths.as_mut().expect("a list column has lengths");
            if def.len() != nlevels || rep.len() != nlevels || (nlevels > 0 && rep[0] != 0) {
                return Err("its repetition levels are inconsistent (corrupt)".into());
            }
            let start = lengths.len();
            lengths.reserve(k);
            // A level with rep 0 starts a record; one with def >= item_def
            // is an item, null unless def == max_def.
            let (mut cur, mut items, mut nulls) = (0i32, 0usize, false);
            for (i, (&d, &rl)) in def.iter().zip(rep.iter()).enumerate() {
                if rl == 0 && i > 0 {
                    lengths.push(cur);
                    cur = 0;
                }
                let present = d >= item_def;
                nulls |= present & (d < lr.max_def);
                cur += present as i32;
                items += present as usize;
            }
            if nlevels > 0 {
                lengths.push(cur);
            }
            if nulls {
                return Err("a list holds a null item; tensors cannot hold nulls".into());
            }
            if lengths.len() - start != k || items != nvals {
                return Err("its repetition levels do not match its record count (corrupt)".into());
            }
        }
    }
    Ok(())
}

/// How costly a column is to decode per record, roughly: byte strings (a
/// copy each) above lists (levels to walk) above fixed-width values.
fn decode_cost_rank(r: &ColReader, lr: &LeafRef) -> u8 {
    match r {
        ColReader::Bytes(_) | ColReader::Fixed(_) => 2,
        _ if lr.item_def.is_some() => 1,
        _ => 0,
    }
}

/// Copies byte strings into `dst` after its first `*filled`. A string
/// tensor holds one allocation per element, the main cost of string
/// columns, so the strings `dst` already holds past `*filled` (an earlier
/// batch's) are overwritten in place, growing only when too short; then
/// new ones are allocated. Large batches spread the work over the pool.
fn copy_strings<B: AsRef<[u8]> + Sync>(src: &[B], dst: &mut Vec<Vec<u8>>, filled: &mut usize) {
    const PAR: usize = 16384;
    let start = *filled;
    debug_assert!(start <= dst.len());
    let reused = dst.len().saturating_sub(start).min(src.len());
    let (over, fresh) = src.split_at(reused);
    let refill = |(d, s): (&mut Vec<u8>, &B)| {
        d.clear();
        d.extend_from_slice(s.as_ref());
    };
    let slots = &mut dst[start..start + reused];
    if reused >= PAR && crate::threads::pool_available() {
        slots.par_iter_mut().zip(over.par_iter()).for_each(refill);
    } else {
        slots.iter_mut().zip(over).for_each(refill);
    }
    if fresh.len() >= PAR && crate::threads::pool_available() {
        dst.par_extend(fresh.par_iter().map(|b| b.as_ref().to_vec()));
    } else {
        dst.extend(fresh.iter().map(|b| b.as_ref().to_vec()));
    }
    *filled = start + src.len();
}

fn decode_column(
    r: &mut ColReader,
    acc: &mut Acc,
    k: usize,
    lr: &LeafRef,
) -> std::result::Result<(), String> {
    let levels = (&mut acc.def, &mut acc.rep, &mut acc.lengths);
    let filled = &mut acc.strings;
    match (r, &mut acc.values) {
        (ColReader::Bool(r), Values::Bool(v)) => read_records(r, k, v, levels, lr),
        (ColReader::I32(r), Values::I32(v)) => read_records(r, k, v, levels, lr),
        (ColReader::I64(r), Values::I64(v)) => read_records(r, k, v, levels, lr),
        (ColReader::F32(r), Values::F32(v)) => read_records(r, k, v, levels, lr),
        (ColReader::F64(r), Values::F64(v)) => read_records(r, k, v, levels, lr),
        (ColReader::I32(r), values) => {
            let mut tmp = Vec::with_capacity(k);
            read_records(r, k, &mut tmp, levels, lr)?;
            match (values, lr.conv) {
                (Values::I64(v), Conv::U32ToI64) => {
                    v.extend(tmp.iter().map(|&x| x as u32 as i64));
                    Ok(())
                }
                (Values::I8(v), Conv::I32ToI8) => narrow_into(&tmp, v, "INT(8)"),
                (Values::I16(v), Conv::I32ToI16) => narrow_into(&tmp, v, "INT(16)"),
                (Values::U8(v), Conv::I32ToU8) => narrow_into(&tmp, v, "UINT(8)"),
                (Values::U16(v), Conv::I32ToU16) => narrow_into(&tmp, v, "UINT(16)"),
                _ => Err("the column's type does not match the reader's (corrupt)".into()),
            }
        }
        (ColReader::Bytes(r), Values::Bytes(v)) => {
            let mut tmp = Vec::with_capacity(k);
            read_records(r, k, &mut tmp, levels, lr)?;
            copy_strings(&tmp, v, filled);
            Ok(())
        }
        (ColReader::Fixed(r), Values::Bytes(v)) => {
            let mut tmp = Vec::with_capacity(k);
            read_records(r, k, &mut tmp, levels, lr)?;
            copy_strings(&tmp, v, filled);
            Ok(())
        }
        _ => Err("the column's type does not match the reader's (corrupt)".into()),
    }
}

// ------------------------------------------------------- parquet reader --

/// Column readers open on one row group.
struct Open {
    /// Records before the readers' position (over all files).
    pos: u64,
    file: usize,
    rg: usize,
    /// Records left in this row group.
    left: u64,
    readers: Vec<ColReader>,
}

struct PqCursor {
    /// Records handed out.
    pos: u64,
    open: Option<Open>,
}

/// A streaming reader over Parquet files (see the module doc).
pub struct ParquetReader {
    files: Vec<PqFile>,
    columns: Vec<ColumnSpec>,
    batch_size: usize,
    total: u64,
    cursor: Mutex<PqCursor>,
}

impl fmt::Debug for ParquetReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ParquetReader({} files, columns {:?}, at record {:?} of {})",
            self.files.len(),
            self.columns
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            self.cursor.try_lock().map(|c| c.pos),
            self.total
        )
    }
}

impl BlobObject for ParquetReader {
    fn kind_name(&self) -> &'static str {
        "ParquetReader"
    }
    fn serialize(&self) -> Option<BlobProto> {
        Some(object_proto(PARQUET_READER_TAG, self.to_bytes()))
    }
}

const PQ_MAGIC: &[u8; 4] = b"FCPQ";

impl ParquetReader {
    /// Opens the files (every file under a folder) and resolves the columns.
    pub fn open(paths: &[String], columns: &[String], batch_size: usize) -> Result<ParquetReader> {
        Self::open_expecting(paths, columns, &[], batch_size)
    }

    fn open_expecting(
        paths: &[String],
        columns: &[String],
        expect: &[(Option<DataType>, Option<bool>)],
        batch_size: usize,
    ) -> Result<ParquetReader> {
        if batch_size == 0 {
            return Err(Error::invalid_arg("batch_size must be >= 1"));
        }
        let mut files = Vec::new();
        for p in paths {
            data_files(p, &mut files)?;
        }
        if files.is_empty() {
            return Err(Error::invalid_arg("a Parquet reader needs a path"));
        }
        let (files, columns) = open_parquet_files(&files, columns, expect)?;
        let total = files.iter().map(|f| f.rows).sum();
        Ok(ParquetReader {
            files,
            columns,
            batch_size,
            total,
            cursor: Mutex::new(PqCursor { pos: 0, open: None }),
        })
    }

    /// The number of tensors a batch has: one per column, two per list.
    pub fn num_outputs(&self) -> usize {
        self.columns
            .iter()
            .map(|c| if c.list { 2 } else { 1 })
            .sum()
    }

    /// The columns: name, dtype (of the items, for a list) and list-ness.
    pub fn columns(&self) -> Vec<(String, DataType, bool)> {
        self.columns
            .iter()
            .map(|c| (c.name.clone(), c.dtype, c.list))
            .collect()
    }

    /// The files read, in order.
    pub fn files(&self) -> Vec<String> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// Records in all files.
    pub fn total_records(&self) -> u64 {
        self.total
    }

    /// Records handed out so far.
    pub fn position(&self) -> u64 {
        self.cursor.lock().pos
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Moves back to the first record.
    pub fn reset(&self) {
        let mut c = self.cursor.lock();
        c.pos = 0;
        c.open = None;
    }

    /// Column readers on row group `rg` of file `file`, or the next non-empty
    /// one after it; `None` past the end.
    fn open_at(
        &self,
        mut file: usize,
        mut rg: usize,
        pos: u64,
    ) -> std::result::Result<Option<Open>, (usize, String)> {
        while file < self.files.len() {
            let f = &self.files[file];
            if rg >= f.rg_rows.len() {
                file += 1;
                rg = 0;
                continue;
            }
            if f.rg_rows[rg] == 0 {
                rg += 1;
                continue;
            }
            let group = f
                .reader
                .get_row_group(rg)
                .map_err(|e| (file, format!("row group {rg}: {e}")))?;
            let readers = f
                .cols
                .iter()
                .enumerate()
                .map(|(c, lr)| {
                    group
                        .get_column_reader(lr.leaf)
                        .map(ColReader::new)
                        .map_err(|e| {
                            (
                                file,
                                format!("column '{}', row group {rg}: {e}", self.columns[c].name),
                            )
                        })
                })
                .collect::<std::result::Result<Vec<_>, _>>()?;
            return Ok(Some(Open {
                pos,
                file,
                rg,
                left: f.rg_rows[rg],
                readers,
            }));
        }
        Ok(None)
    }

    /// Readers positioned at record `pos`.
    fn seek(&self, pos: u64) -> std::result::Result<Option<Open>, (usize, String)> {
        let mut before = 0u64;
        for (fi, f) in self.files.iter().enumerate() {
            if before + f.rows <= pos {
                before += f.rows;
                continue;
            }
            for (g, &rows) in f.rg_rows.iter().enumerate() {
                if before + rows <= pos {
                    before += rows;
                    continue;
                }
                let mut open = self
                    .open_at(fi, g, before)?
                    .expect("a row group holding the position");
                let skip = pos - before;
                if skip > 0 {
                    for (c, r) in open.readers.iter_mut().enumerate() {
                        let n = r
                            .skip(skip as usize)
                            .map_err(|e| (fi, format!("column '{}': {e}", self.columns[c].name)))?;
                        if n as u64 != skip {
                            return Err((
                                fi,
                                format!(
                                    "column '{}' ends after {n} of the {rows} records of row group {g} (truncated or corrupt)",
                                    self.columns[c].name
                                ),
                            ));
                        }
                    }
                    open.left -= skip;
                    open.pos = pos;
                }
                return Ok(Some(open));
            }
        }
        Ok(None)
    }

    /// Decodes up to `n` records from `pos` into per-column accumulators.
    fn read_at(
        &self,
        slot: &mut Option<Open>,
        pos: u64,
        n: usize,
        at_file: &mut usize,
        mut accs: Vec<Acc>,
    ) -> std::result::Result<(Vec<Tensor>, u64), (usize, String)> {
        if slot.as_ref().is_none_or(|o| o.pos != pos) {
            *slot = None;
            *slot = self.seek(pos)?;
        }
        let mut got = 0usize;
        while got < n {
            let Some(o) = slot.as_mut() else { break };
            *at_file = o.file;
            if o.left == 0 {
                let (file, rg, p) = (o.file, o.rg + 1, o.pos);
                *slot = self.open_at(file, rg, p)?;
                continue;
            }
            let k = ((n - got) as u64).min(o.left) as usize;
            let f = &self.files[o.file];
            let mut jobs: Vec<(usize, &mut ColReader, &mut Acc, &LeafRef)> = o
                .readers
                .iter_mut()
                .zip(accs.iter_mut())
                .zip(f.cols.iter())
                .enumerate()
                .map(|(c, ((r, acc), lr))| (c, r, acc, lr))
                .collect();
            let work = |(c, r, acc, lr): (usize, &mut ColReader, &mut Acc, &LeafRef)| {
                (c, decode_column(r, acc, k, lr))
            };
            let mut results: Vec<(usize, std::result::Result<(), String>)> =
                if jobs.len() > 1 && k >= 2048 && crate::threads::pool_available() {
                    // One task per column, the costliest first: a string
                    // column alone can take as long as all the others, and
                    // started last it would finish last.
                    jobs.sort_by_key(|(_, r, _, lr)| std::cmp::Reverse(decode_cost_rank(r, lr)));
                    jobs.into_par_iter().with_max_len(1).map(work).collect()
                } else {
                    jobs.into_iter().map(work).collect()
                };
            results.sort_by_key(|(c, _)| *c);
            for (c, r) in results {
                r.map_err(|m| {
                    (
                        o.file,
                        format!("column '{}', row group {}: {m}", self.columns[c].name, o.rg),
                    )
                })?;
            }
            o.left -= k as u64;
            o.pos += k as u64;
            got += k;
        }
        let mut out = Vec::with_capacity(self.num_outputs());
        for (c, acc) in accs.into_iter().enumerate() {
            acc.finish(&mut out).map_err(|e| {
                (
                    *at_file,
                    format!("column '{}': {}", self.columns[c].name, e.message),
                )
            })?;
        }
        Ok((out, got as u64))
    }

    /// The next batch of up to `n` records (every tensor empty at the end).
    /// Atomic: concurrent callers get distinct records.
    pub fn read_batch(&self, n: usize) -> Result<Vec<Tensor>> {
        self.read_batch_reusing(n, Vec::new())
    }

    /// [`read_batch`](Self::read_batch), writing each string column (by
    /// column index) over the strings of `old[c]`, a previous batch's, whose
    /// buffers are reused instead of freed and allocated again.
    pub fn read_batch_reusing(
        &self,
        n: usize,
        mut old: Vec<Option<Vec<Vec<u8>>>>,
    ) -> Result<Vec<Tensor>> {
        let mut cur = self.cursor.lock();
        let pos = cur.pos;
        let mut at_file = cur.open.as_ref().map_or(0, |o| o.file);
        // Reserve for what is left at most (a huge batch_size allocates
        // nothing); what cannot be allocated fails before anything is read.
        let cap = n.min(usize::try_from(self.total.saturating_sub(pos)).unwrap_or(usize::MAX));
        let accs = self
            .columns
            .iter()
            .enumerate()
            .map(|(c, spec)| Acc::reusing(spec, cap, old.get_mut(c).and_then(Option::take)))
            .collect::<Result<Vec<Acc>>>()?;
        let r = catch_unwind(AssertUnwindSafe(|| {
            self.read_at(&mut cur.open, pos, n, &mut at_file, accs)
        }));
        let fail = |cur: &mut PqCursor, file: usize, msg: String| {
            cur.open = None;
            let path = self.files.get(file).map(|f| f.path.as_str()).unwrap_or("?");
            io_err(
                path,
                format!("cannot read the Parquet file '{path}': {msg}"),
            )
        };
        match r {
            Ok(Ok((tensors, got))) => {
                cur.pos += got;
                Ok(tensors)
            }
            Ok(Err((file, msg))) => Err(fail(&mut cur, file, msg)),
            Err(p) => Err(fail(
                &mut cur,
                at_file,
                format!("the decoder failed: {}", panic_text(p)),
            )),
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut e = Enc::new(PQ_MAGIC);
        e.u64(self.files.len() as u64);
        for f in &self.files {
            e.str(&f.path);
            e.u64(f.rows);
        }
        e.u64(self.columns.len() as u64);
        for c in &self.columns {
            e.str(&c.name);
            e.u64(c.dtype as i32 as u64);
            e.u64(c.list as u64);
        }
        e.u64(self.batch_size as u64);
        e.u64(self.position());
        e.0
    }

    /// Reopens a saved reader: the same files (which must still hold the same
    /// number of records and columns) at the saved position.
    pub fn from_bytes(bytes: &[u8]) -> Result<ParquetReader> {
        let mut d = Dec::new("ParquetReader", PQ_MAGIC, bytes)?;
        let nf = d.len()?;
        let mut files = Vec::with_capacity(nf);
        for _ in 0..nf {
            files.push((d.str()?, d.u64()?));
        }
        let nc = d.len()?;
        let mut cols = Vec::with_capacity(nc);
        for _ in 0..nc {
            let name = d.str()?;
            let dt = d.u64()?;
            let dtype = i32::try_from(dt)
                .ok()
                .and_then(DataType::from_i32)
                .ok_or_else(|| d.bad("bad dtype"))?;
            let list = d.u64()? != 0;
            cols.push((name, dtype, list));
        }
        let batch = usize::try_from(d.u64()?).map_err(|_| d.bad("bad batch size"))?;
        let pos = d.u64()?;
        d.finish()?;
        let paths: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
        let names: Vec<String> = cols.iter().map(|c| c.0.clone()).collect();
        let expect: Vec<_> = cols.iter().map(|c| (Some(c.1), Some(c.2))).collect();
        let (opened, columns) = open_parquet_files(&paths, &names, &expect)?;
        for (f, (path, rows)) in opened.iter().zip(&files) {
            if f.rows != *rows {
                return Err(Error::invalid_arg(format!(
                    "cannot restore a Parquet reader: '{path}' holds {} records now but held {rows} when the reader \
                     was saved",
                    f.rows
                ))
                .with_file(path));
            }
        }
        let total: u64 = opened.iter().map(|f| f.rows).sum();
        if pos > total || batch == 0 {
            return Err(d.bad("its position or batch size is out of range"));
        }
        Ok(ParquetReader {
            files: opened,
            columns,
            batch_size: batch,
            total,
            cursor: Mutex::new(PqCursor { pos, open: None }),
        })
    }
}

fn decode_parquet_reader(p: &BlobProto) -> Result<BlobValue> {
    let r = ParquetReader::from_bytes(p.content.as_deref().unwrap_or_default())?;
    Ok(BlobValue::Object(Arc::new(r)))
}

// ------------------------------------------------------- parquet writer --

/// One column to write: a schema field, or a list's lengths + values.
#[derive(Clone, Debug, PartialEq, Eq)]
struct WriteColumn {
    /// The schema field name ("a:b"; a list by its name, "x").
    name: String,
    dtype: DataType,
    list: bool,
}

/// The columns of a record given by its field names (and their dtypes):
/// `x:lengths` directly followed by `x:values` is a list column `x`.
fn write_columns(
    fields: &[String],
    dtypes: &[DataType],
) -> std::result::Result<Vec<WriteColumn>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < fields.len() {
        let f = &fields[i];
        if let Some(prefix) = f.strip_suffix(":lengths").filter(|_| f != "lengths") {
            let values = format!("{prefix}:values");
            let nested = fields
                .get(i + 2)
                .is_some_and(|g| g.starts_with(&format!("{prefix}:")));
            if fields.get(i + 1) != Some(&values) || nested {
                return Err(format!(
                    "field '{f}': only lists of plain values ('{prefix}:lengths' then '{values}') can be written to \
                     Parquet"
                ));
            }
            if dtypes[i] != DataType::Int32 {
                return Err(format!(
                    "field '{f}' must be int32 lengths, got {}",
                    dtypes[i]
                ));
            }
            out.push(WriteColumn {
                name: prefix.to_string(),
                dtype: dtypes[i + 1],
                list: true,
            });
            i += 2;
        } else {
            out.push(WriteColumn {
                name: f.clone(),
                dtype: dtypes[i],
                list: false,
            });
            i += 1;
        }
    }
    Ok(out)
}

fn parquet_leaf(
    name: &str,
    c: &WriteColumn,
    binary: bool,
) -> std::result::Result<SchemaType, String> {
    let int = |bit_width, is_signed| {
        Some(LogicalType::Integer {
            bit_width,
            is_signed,
        })
    };
    let (phys, lt) = match c.dtype {
        DataType::Bool => (PhysicalType::BOOLEAN, None),
        DataType::Int8 => (PhysicalType::INT32, int(8, true)),
        DataType::Int16 => (PhysicalType::INT32, int(16, true)),
        DataType::Uint8 => (PhysicalType::INT32, int(8, false)),
        DataType::Uint16 => (PhysicalType::INT32, int(16, false)),
        DataType::Int32 => (PhysicalType::INT32, None),
        DataType::Int64 => (PhysicalType::INT64, None),
        DataType::Float => (PhysicalType::FLOAT, None),
        DataType::Double => (PhysicalType::DOUBLE, None),
        DataType::String => (
            PhysicalType::BYTE_ARRAY,
            (!binary).then_some(LogicalType::String),
        ),
        other => return Err(format!("{other} tensors cannot be written to Parquet")),
    };
    let e = |e: parquet::errors::ParquetError| e.to_string();
    let prim = SchemaType::primitive_type_builder(if c.list { "element" } else { name }, phys)
        .with_repetition(Repetition::REQUIRED)
        .with_logical_type(lt)
        .build()
        .map_err(e)?;
    if !c.list {
        return Ok(prim);
    }
    let repeated = SchemaType::group_type_builder("list")
        .with_repetition(Repetition::REPEATED)
        .with_fields(vec![Arc::new(prim)])
        .build()
        .map_err(e)?;
    SchemaType::group_type_builder(name)
        .with_repetition(Repetition::REQUIRED)
        .with_logical_type(Some(LogicalType::List))
        .with_fields(vec![Arc::new(repeated)])
        .build()
        .map_err(e)
}

/// The Parquet schema of the columns ("a:b" nests `b` in a group `a`) and
/// the order in which its leaves hold the columns.
fn parquet_message(
    cols: &[WriteColumn],
    binary: bool,
) -> std::result::Result<(SchemaType, Vec<usize>), String> {
    enum Node {
        Leaf(usize),
        Group(Vec<(String, Node)>),
    }
    fn insert(
        nodes: &mut Vec<(String, Node)>,
        parts: &[&str],
        c: usize,
        full: &str,
    ) -> std::result::Result<(), String> {
        let at = nodes.iter().position(|(n, _)| n == parts[0]);
        if parts.len() == 1 {
            if at.is_some() {
                return Err(format!(
                    "the field '{full}' is given twice (or is also a group)"
                ));
            }
            nodes.push((parts[0].to_string(), Node::Leaf(c)));
            return Ok(());
        }
        let i = match at {
            Some(i) => i,
            None => {
                nodes.push((parts[0].to_string(), Node::Group(Vec::new())));
                nodes.len() - 1
            }
        };
        match &mut nodes[i].1 {
            Node::Group(children) => insert(children, &parts[1..], c, full),
            Node::Leaf(_) => Err(format!(
                "the field '{full}' is inside '{}', which is a column",
                parts[0]
            )),
        }
    }
    fn build(
        nodes: Vec<(String, Node)>,
        cols: &[WriteColumn],
        binary: bool,
        order: &mut Vec<usize>,
    ) -> std::result::Result<Vec<Arc<SchemaType>>, String> {
        nodes
            .into_iter()
            .map(|(name, node)| match node {
                Node::Leaf(c) => {
                    order.push(c);
                    parquet_leaf(&name, &cols[c], binary).map(Arc::new)
                }
                Node::Group(children) => {
                    let fields = build(children, cols, binary, order)?;
                    SchemaType::group_type_builder(&name)
                        .with_repetition(Repetition::REQUIRED)
                        .with_fields(fields)
                        .build()
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                }
            })
            .collect()
    }
    let mut root = Vec::new();
    for (c, col) in cols.iter().enumerate() {
        let parts: Vec<&str> = col.name.split(':').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!("the field name '{}' has an empty part", col.name));
        }
        insert(&mut root, &parts, c, &col.name)?;
    }
    let mut order = Vec::new();
    let fields = build(root, cols, binary, &mut order)?;
    let msg = SchemaType::group_type_builder("schema")
        .with_fields(fields)
        .build()
        .map_err(|e| e.to_string())?;
    Ok((msg, order))
}

/// Rows buffered for one column until a row group is written.
struct WriteBuf {
    values: Values,
    lengths: Vec<i32>,
}

struct WriterState {
    /// The columns, once known (from the writer's arguments or first write).
    columns: Option<Vec<WriteColumn>>,
    /// Leaf order of the file's columns (indices into `columns`).
    order: Vec<usize>,
    file: Option<SerializedFileWriter<File>>,
    bufs: Vec<WriteBuf>,
    rows: usize,
    closed: bool,
}

/// Writes records to a new Parquet file: buffered into row groups of about
/// `row_group_size` records, written to a temporary next to the file and
/// renamed onto it by [`ParquetWriter::close`], so a file that exists is
/// complete. Thread safe: concurrent writes are appended whole, in some order.
pub struct ParquetWriter {
    path: String,
    tmp: String,
    compression: Compression,
    row_group_size: usize,
    binary: bool,
    state: Mutex<WriterState>,
}

impl fmt::Debug for ParquetWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ParquetWriter('{}')", self.path)
    }
}

impl BlobObject for ParquetWriter {
    fn kind_name(&self) -> &'static str {
        "ParquetWriter"
    }
}

impl Drop for ParquetWriter {
    fn drop(&mut self) {
        // A writer never closed leaves no partial file behind.
        let st = self.state.get_mut();
        if !st.closed && st.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

fn parse_compression(s: &str) -> Option<Compression> {
    Some(match s.to_ascii_lowercase().as_str() {
        "none" | "uncompressed" => Compression::UNCOMPRESSED,
        "snappy" => Compression::SNAPPY,
        "gzip" => Compression::GZIP(Default::default()),
        "zstd" => Compression::ZSTD(Default::default()),
        "lz4" | "lz4_raw" => Compression::LZ4_RAW,
        _ => return None,
    })
}

impl ParquetWriter {
    pub fn new(
        path: &str,
        compression: &str,
        row_group_size: usize,
        binary: bool,
    ) -> Result<ParquetWriter> {
        let compression = parse_compression(compression).ok_or_else(|| {
            Error::invalid_arg(format!(
                "unknown Parquet compression '{compression}' (use none, snappy, gzip, zstd or lz4)"
            ))
        })?;
        if row_group_size == 0 {
            return Err(Error::invalid_arg("row_group_size must be >= 1"));
        }
        let p = Path::new(path);
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.is_empty() {
            return Err(Error::invalid_arg(format!("'{path}' is not a file name")).with_file(path));
        }
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => Path::new(".").to_path_buf(),
        };
        if !dir.is_dir() {
            return Err(io_err(
                path,
                format!("cannot write the Parquet file '{path}': its folder does not exist"),
            ));
        }
        // Temporaries are named as the dbs' are, so that the next writer of
        // this file sweeps those a killed process left.
        storage::check_replaceable(path)?;
        let _ = storage::sweep_stale_temporaries(p);
        let tmp = storage::temp_path_for(p).display().to_string();
        Ok(ParquetWriter {
            path: path.to_string(),
            tmp,
            compression,
            row_group_size,
            binary,
            state: Mutex::new(WriterState {
                columns: None,
                order: Vec::new(),
                file: None,
                bufs: Vec::new(),
                rows: 0,
                closed: false,
            }),
        })
    }

    fn err(&self, kind: ErrorKind, msg: String) -> Error {
        Error::new(kind, msg).with_file(&self.path)
    }

    /// Fixes the columns from a record's field names and dtypes (checks them
    /// against the columns when already fixed).
    pub fn set_schema(&self, fields: &[String], dtypes: &[DataType]) -> Result<()> {
        let mut st = self.state.lock();
        self.set_schema_locked(&mut st, fields, dtypes)
    }

    fn set_schema_locked(
        &self,
        st: &mut WriterState,
        fields: &[String],
        dtypes: &[DataType],
    ) -> Result<()> {
        let path = &self.path;
        let cols = write_columns(fields, dtypes).map_err(|m| {
            self.err(
                ErrorKind::InvalidArgument,
                format!("cannot write the Parquet file '{path}': {m}"),
            )
        })?;
        if let Some(have) = &st.columns {
            for (c, h) in cols.iter().zip(have) {
                if c.name != h.name || c.list != h.list {
                    break;
                }
                if c.dtype != h.dtype {
                    return Err(self.err(
                        ErrorKind::Type,
                        format!(
                            "column '{}' of the Parquet file '{path}': got {} but the file's column holds {}",
                            c.name,
                            describe(c.dtype, c.list),
                            describe(h.dtype, h.list)
                        ),
                    ));
                }
            }
            if cols != *have {
                let names = |v: &[WriteColumn]| {
                    v.iter()
                        .map(|c| c.name.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(self.err(
                    ErrorKind::InvalidArgument,
                    format!(
                        "the Parquet file '{path}' has the columns [{}], got a record of [{}]",
                        names(have),
                        names(&cols)
                    ),
                ));
            }
            return Ok(());
        }
        if st.closed {
            return Err(self.err(
                ErrorKind::InvalidArgument,
                format!("the Parquet file '{path}' is already closed"),
            ));
        }
        let (msg, order) = parquet_message(&cols, self.binary).map_err(|m| {
            self.err(
                ErrorKind::Type,
                format!("cannot write the Parquet file '{path}': {m}"),
            )
        })?;
        let props = parquet::file::properties::WriterProperties::builder()
            .set_compression(self.compression)
            .set_created_by("ferrocaffe".to_string())
            .build();
        let f = File::create(&self.tmp)
            .map_err(|e| io_err(path, format!("cannot write the Parquet file '{path}': {e}")))?;
        let w = SerializedFileWriter::new(f, Arc::new(msg), Arc::new(props))
            .map_err(|e| io_err(path, format!("cannot write the Parquet file '{path}': {e}")))?;
        st.bufs = cols
            .iter()
            .map(|c| WriteBuf {
                values: Values::empty(c.dtype),
                lengths: Vec::new(),
            })
            .collect();
        st.columns = Some(cols);
        st.order = order;
        st.file = Some(w);
        Ok(())
    }

    /// Appends one batch: `tensors[i]` is the field `fields[i]`. Everything
    /// is checked before anything is appended.
    pub fn write(&self, fields: &[String], tensors: &[&Tensor]) -> Result<()> {
        let path = &self.path;
        let dtypes: Vec<DataType> = tensors.iter().map(|t| t.dtype()).collect();
        let mut st = self.state.lock();
        if st.closed {
            return Err(self.err(
                ErrorKind::InvalidArgument,
                format!("the Parquet file '{path}' is already closed"),
            ));
        }
        self.set_schema_locked(&mut st, fields, &dtypes)?;
        let cols = st.columns.clone().expect("columns are set");
        // Check: 1-D tensors, one row per record, lengths adding up.
        let mut rows = None;
        let mut k = 0;
        let mut parts: Vec<(&Tensor, Option<&Tensor>)> = Vec::with_capacity(cols.len());
        for c in &cols {
            let (lengths, values) = if c.list {
                (Some(tensors[k]), tensors[k + 1])
            } else {
                (None, tensors[k])
            };
            k += if c.list { 2 } else { 1 };
            let bad = |m: String| {
                self.err(
                    ErrorKind::Shape,
                    format!("column '{}' of the Parquet file '{path}': {m}", c.name),
                )
            };
            for t in lengths.iter().chain(std::iter::once(&values)) {
                if t.ndim() != 1 {
                    return Err(bad(format!(
                        "Parquet columns take 1-D tensors, got shape {:?}",
                        t.shape()
                    )));
                }
            }
            let n = lengths.unwrap_or(values).shape()[0];
            if *rows.get_or_insert(n) != n {
                return Err(bad(format!(
                    "it has {n} records but the batch's first column has {}",
                    rows.unwrap()
                )));
            }
            if let Some(l) = lengths {
                let l = l.array::<i32>()?;
                let mut sum = 0usize;
                for &x in l.iter() {
                    if x < 0 {
                        return Err(bad(format!("a list length is negative ({x})")));
                    }
                    sum += x as usize;
                }
                if sum != values.shape()[0] {
                    return Err(bad(format!(
                        "the lengths add up to {sum} but there are {} values",
                        values.shape()[0]
                    )));
                }
            }
            if c.dtype == DataType::String && !self.binary {
                if let Some(i) = values
                    .array::<Vec<u8>>()?
                    .iter()
                    .position(|s| std::str::from_utf8(s).is_err())
                {
                    return Err(self.err(
                        ErrorKind::InvalidArgument,
                        format!(
                            "column '{}' of the Parquet file '{path}': value {i} of the batch is not UTF-8 (write \
                             byte strings with binary=True)",
                            c.name
                        ),
                    ));
                }
            }
            parts.push((values, lengths));
        }
        // Append.
        for ((values, lengths), buf) in parts.into_iter().zip(st.bufs.iter_mut()) {
            if let Some(l) = lengths {
                buf.lengths.extend(l.array::<i32>()?.iter().copied());
            }
            macro_rules! app {
                ($v:ident, $t:ty) => {
                    $v.extend(values.array::<$t>()?.iter().cloned())
                };
            }
            match &mut buf.values {
                Values::Bool(v) => app!(v, bool),
                Values::I8(v) => app!(v, i8),
                Values::I16(v) => app!(v, i16),
                Values::U8(v) => app!(v, u8),
                Values::U16(v) => app!(v, u16),
                Values::I32(v) => app!(v, i32),
                Values::I64(v) => app!(v, i64),
                Values::F32(v) => app!(v, f32),
                Values::F64(v) => app!(v, f64),
                Values::Bytes(v) => app!(v, Vec<u8>),
            }
        }
        st.rows += rows.unwrap_or(0);
        if st.rows >= self.row_group_size {
            self.flush(&mut st)?;
        }
        Ok(())
    }

    /// Writes the buffered rows as one row group.
    fn flush(&self, st: &mut WriterState) -> Result<()> {
        if st.rows == 0 {
            return Ok(());
        }
        let path = &self.path;
        let fail = |e: parquet::errors::ParquetError| {
            io_err(path, format!("cannot write the Parquet file '{path}': {e}"))
        };
        let order = st.order.clone();
        let mut bufs = std::mem::take(&mut st.bufs);
        let w = st.file.as_mut().expect("an open file");
        let mut rg = w.next_row_group().map_err(fail)?;
        for &c in &order {
            let buf = &mut bufs[c];
            let mut col = rg.next_column().map_err(fail)?.expect("a column per leaf");
            let levels = (!buf.lengths.is_empty() || st.columns.as_ref().expect("columns")[c].list)
                .then(|| {
                    let (mut def, mut rep) = (Vec::new(), Vec::new());
                    for &n in &buf.lengths {
                        if n == 0 {
                            def.push(0);
                            rep.push(0);
                        }
                        for j in 0..n {
                            def.push(1);
                            rep.push(i16::from(j != 0));
                        }
                    }
                    (def, rep)
                });
            let (d, r) = match &levels {
                Some((d, r)) => (Some(d.as_slice()), Some(r.as_slice())),
                None => (None, None),
            };
            match &mut buf.values {
                Values::Bool(v) => col.typed::<BoolType>().write_batch(v, d, r),
                Values::I8(v) => col.typed::<Int32Type>().write_batch(
                    &v.iter().map(|&x| x as i32).collect::<Vec<_>>(),
                    d,
                    r,
                ),
                Values::I16(v) => col.typed::<Int32Type>().write_batch(
                    &v.iter().map(|&x| x as i32).collect::<Vec<_>>(),
                    d,
                    r,
                ),
                Values::U8(v) => col.typed::<Int32Type>().write_batch(
                    &v.iter().map(|&x| x as i32).collect::<Vec<_>>(),
                    d,
                    r,
                ),
                Values::U16(v) => col.typed::<Int32Type>().write_batch(
                    &v.iter().map(|&x| x as i32).collect::<Vec<_>>(),
                    d,
                    r,
                ),
                Values::I32(v) => col.typed::<Int32Type>().write_batch(v, d, r),
                Values::I64(v) => col.typed::<Int64Type>().write_batch(v, d, r),
                Values::F32(v) => col.typed::<FloatType>().write_batch(v, d, r),
                Values::F64(v) => col.typed::<DoubleType>().write_batch(v, d, r),
                Values::Bytes(v) => {
                    let b: Vec<parquet::data_type::ByteArray> = std::mem::take(v)
                        .into_iter()
                        .map(parquet::data_type::ByteArray::from)
                        .collect();
                    col.typed::<ByteArrayType>().write_batch(&b, d, r)
                }
            }
            .map_err(fail)?;
            col.close().map_err(fail)?;
        }
        rg.close().map_err(fail)?;
        let cols = st.columns.as_ref().expect("columns");
        st.bufs = cols
            .iter()
            .map(|c| WriteBuf {
                values: Values::empty(c.dtype),
                lengths: Vec::new(),
            })
            .collect();
        st.rows = 0;
        Ok(())
    }

    /// Writes what is buffered and the footer, then renames the file into
    /// place. Closing twice is a no-op.
    pub fn close(&self) -> Result<()> {
        let path = &self.path;
        let mut st = self.state.lock();
        if st.closed {
            return Ok(());
        }
        if st.columns.is_none() {
            return Err(self.err(
                ErrorKind::InvalidArgument,
                format!(
                    "cannot close the Parquet file '{path}': nothing was written and its columns were never given \
                     (give the writer a schema)"
                ),
            ));
        }
        self.flush(&mut st)?;
        let fail = |e: String| io_err(path, format!("cannot write the Parquet file '{path}': {e}"));
        let w = st.file.take().expect("an open file");
        let f = w.into_inner().map_err(|e| fail(e.to_string()))?;
        f.sync_all().map_err(|e| fail(e.to_string()))?;
        storage::check_replaceable(path)?;
        fs::rename(&self.tmp, &self.path).map_err(|e| fail(e.to_string()))?;
        st.closed = true;
        Ok(())
    }
}

// ------------------------------------------------------------------ npy --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NpyKind {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    I64,
    F32,
    F64,
    /// `S<n>`: n-byte strings.
    Bytes(usize),
    /// `U<n>`: n UTF-32 code points.
    Unicode(usize),
}

impl NpyKind {
    fn itemsize(self) -> usize {
        match self {
            NpyKind::Bool | NpyKind::I8 | NpyKind::U8 => 1,
            NpyKind::I16 | NpyKind::U16 => 2,
            NpyKind::I32 | NpyKind::F32 => 4,
            NpyKind::I64 | NpyKind::F64 => 8,
            NpyKind::Bytes(n) => n,
            NpyKind::Unicode(n) => 4 * n,
        }
    }
}

/// Parses a numpy `descr` ("<f4", "|S5", ...): the kind and big-endianness.
fn parse_descr(descr: &str) -> std::result::Result<(NpyKind, bool), String> {
    let (order, rest) = match descr.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &descr[1..]),
        _ => ('=', descr),
    };
    let big = order == '>' || (order == '=' && cfg!(target_endian = "big"));
    let (kind, digits) = rest.split_at(
        rest.find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len()),
    );
    let size: Option<usize> = digits.parse().ok();
    let k = match (kind, size) {
        ("b", Some(1)) | ("?", None) => NpyKind::Bool,
        ("i", Some(1)) => NpyKind::I8,
        ("u", Some(1)) => NpyKind::U8,
        ("i", Some(2)) => NpyKind::I16,
        ("u", Some(2)) => NpyKind::U16,
        ("i", Some(4)) => NpyKind::I32,
        ("i", Some(8)) => NpyKind::I64,
        ("f", Some(4)) => NpyKind::F32,
        ("f", Some(8)) => NpyKind::F64,
        ("S" | "a", Some(n)) if n > 0 => NpyKind::Bytes(n),
        ("U", Some(n)) if n > 0 => NpyKind::Unicode(n),
        // A size too long to parse as usize: numpy refuses it too.
        ("S" | "a" | "U", None) if !digits.is_empty() => {
            return Err(format!("the dtype '{descr}' is too large"))
        }
        ("O", _) => return Err("object arrays (pickled Python objects) are not supported".into()),
        _ => return Err(format!("the dtype '{descr}' is not supported")),
    };
    // numpy keeps an item's size in a C int and refuses larger dtypes (a
    // `U` item is 4 bytes per code point); checked, so no size wraps.
    let itemsize = match k {
        NpyKind::Bytes(n) => Some(n),
        NpyKind::Unicode(n) => n.checked_mul(4),
        _ => Some(1),
    };
    if itemsize.is_none_or(|b| b > i32::MAX as usize) {
        return Err(format!(
            "the dtype '{descr}' is too large (numpy's items hold at most 2**31 - 1 bytes)"
        ));
    }
    Ok((k, big))
}

struct NpyHeader {
    kind: NpyKind,
    big: bool,
    shape: Vec<usize>,
    data_offset: u64,
}

/// The value after `'key':` in a header dict.
fn header_value<'a>(h: &'a str, key: &str) -> Option<&'a str> {
    let at = h
        .find(&format!("'{key}'"))
        .or_else(|| h.find(&format!("\"{key}\"")))?;
    let rest = h[at + key.len() + 2..].trim_start();
    Some(rest.strip_prefix(':')?.trim_start())
}

fn parse_npy_header(bytes: &[u8]) -> std::result::Result<NpyHeader, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let major = bytes[6];
    let (hlen, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err("the header is truncated".into());
            }
            (
                u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize,
                12,
            )
        }
        v => return Err(format!("unsupported .npy format version {v}")),
    };
    let h = bytes
        .get(start..start + hlen)
        .ok_or("the header is truncated")?;
    let h = std::str::from_utf8(h).map_err(|_| "the header is not text")?;
    let descr = header_value(h, "descr").ok_or("the header has no 'descr'")?;
    let quote = descr
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or_else(|| {
            "structured dtypes (several fields per element) are not supported".to_string()
        })?;
    let descr = &descr[1..];
    let descr = &descr[..descr
        .find(quote)
        .ok_or("the header's 'descr' is malformed")?];
    let (kind, big) = parse_descr(descr)?;
    let fortran = header_value(h, "fortran_order").ok_or("the header has no 'fortran_order'")?;
    let fortran = if fortran.starts_with("True") {
        true
    } else if fortran.starts_with("False") {
        false
    } else {
        return Err("the header's 'fortran_order' is malformed".into());
    };
    let shape = header_value(h, "shape").ok_or("the header has no 'shape'")?;
    let shape = shape
        .strip_prefix('(')
        .ok_or("the header's 'shape' is malformed")?;
    let shape = &shape[..shape.find(')').ok_or("the header's 'shape' is malformed")?];
    let shape = shape
        .split(',')
        .map(|s| s.trim().trim_end_matches('L'))
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("the header's shape has a bad dimension '{s}'"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if shape.is_empty() {
        return Err("a 0-dimensional array has no rows to read".into());
    }
    if fortran && shape.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(
            "Fortran-order arrays are not supported (save with np.ascontiguousarray)".into(),
        );
    }
    Ok(NpyHeader {
        kind,
        big,
        shape,
        data_offset: (start + hlen) as u64,
    })
}

struct NpyFile {
    path: String,
    file: File,
    kind: NpyKind,
    big: bool,
    descr: String,
    row_shape: Vec<usize>,
    rows: u64,
    row_bytes: usize,
    data_offset: u64,
}

fn open_npy(path: &str) -> Result<NpyFile> {
    let (file, len) = open_regular(path, ".npy file")?;
    let mut head = vec![0u8; len.min(1 << 20) as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| io_err(path, format!("cannot read '{path}': {e}")))?;
    let bad = |m: String| io_err(path, format!("'{path}' is not a readable .npy file: {m}"));
    let h = parse_npy_header(&head).map_err(bad)?;
    let row_shape = h.shape[1..].to_vec();
    let row_bytes = row_shape
        .iter()
        .try_fold(h.kind.itemsize(), |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("its shape is too large".into()))?;
    let rows = h.shape[0] as u64;
    let want = (row_bytes as u64)
        .checked_mul(rows)
        .and_then(|b| b.checked_add(h.data_offset));
    if want != Some(len) {
        return Err(bad(format!(
            "its header promises {} bytes of data but the file holds {} (truncated or corrupt)",
            (row_bytes as u64).saturating_mul(rows),
            len.saturating_sub(h.data_offset)
        )));
    }
    let descr = format!("{:?}{}", h.kind, if h.big { " (big-endian)" } else { "" });
    Ok(NpyFile {
        path: path.to_string(),
        file,
        kind: h.kind,
        big: h.big,
        descr,
        row_shape,
        rows,
        row_bytes,
        data_offset: h.data_offset,
    })
}

impl NpyFile {
    fn read_rows(&self, start: u64, n: usize) -> Result<Tensor> {
        let mut shape = Vec::with_capacity(1 + self.row_shape.len());
        shape.push(n);
        shape.extend_from_slice(&self.row_shape);
        let mut buf = crate::tensor::default_buffer::<u8>(
            n * self.row_bytes,
            format_args!("{n} rows of '{}'", self.path),
        )?;
        let off = self.data_offset + start * self.row_bytes as u64;
        self.file.read_exact_at(&mut buf, off).map_err(|e| {
            io_err(
                &self.path,
                format!("cannot read rows {start}.. of '{}': {e}", self.path),
            )
        })?;
        macro_rules! num {
            ($t:ty) => {{
                const W: usize = std::mem::size_of::<$t>();
                let big = self.big;
                let values = buf.chunks_exact(W).map(|c| {
                    let c = c.try_into().expect("width");
                    if big {
                        <$t>::from_be_bytes(c)
                    } else {
                        <$t>::from_le_bytes(c)
                    }
                });
                collect_array(&shape, values).map(Tensor::from)
            }};
        }
        match self.kind {
            NpyKind::Bool => collect_array(&shape, buf.iter().map(|&b| b != 0)).map(Tensor::from),
            NpyKind::I8 => num!(i8),
            NpyKind::U8 => Tensor::from_vec(&shape, buf),
            NpyKind::I16 => num!(i16),
            NpyKind::U16 => num!(u16),
            NpyKind::I32 => num!(i32),
            NpyKind::I64 => num!(i64),
            NpyKind::F32 => num!(f32),
            NpyKind::F64 => num!(f64),
            NpyKind::Bytes(w) => {
                let values = buf
                    .chunks_exact(w)
                    .map(|c| c[..c.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)].to_vec());
                collect_array(&shape, values).map(Tensor::from)
            }
            NpyKind::Unicode(w) => {
                let mut v = try_vec(buf.len() / (4 * w), "strings")?;
                for (i, c) in buf.chunks_exact(4 * w).enumerate() {
                    let mut s = String::new();
                    let cps: Vec<u32> = c
                        .chunks_exact(4)
                        .map(|b| {
                            let b: [u8; 4] = b.try_into().expect("4 bytes");
                            if self.big {
                                u32::from_be_bytes(b)
                            } else {
                                u32::from_le_bytes(b)
                            }
                        })
                        .collect();
                    let end = cps.iter().rposition(|&u| u != 0).map_or(0, |i| i + 1);
                    for &u in &cps[..end] {
                        s.push(char::from_u32(u).ok_or_else(|| {
                            io_err(
                                &self.path,
                                format!(
                                    "'{}' holds an invalid code point {u:#x} in element {}",
                                    self.path,
                                    start as usize + i
                                ),
                            )
                        })?);
                    }
                    v.push(s.into_bytes());
                }
                Tensor::from_vec(&shape, v)
            }
        }
    }
}

/// A batch reader over `.npy` files, one per column (see the module doc).
pub struct NpyReader {
    files: Vec<NpyFile>,
    rows: u64,
    batch_size: usize,
    pos: Mutex<u64>,
}

impl fmt::Debug for NpyReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NpyReader({:?}, at row {:?} of {})",
            self.files(),
            self.pos.try_lock().map(|p| *p),
            self.rows
        )
    }
}

impl BlobObject for NpyReader {
    fn kind_name(&self) -> &'static str {
        "NpyReader"
    }
    fn serialize(&self) -> Option<BlobProto> {
        Some(object_proto(NPY_READER_TAG, self.to_bytes()))
    }
}

const NPY_MAGIC: &[u8; 4] = b"FCNP";

impl NpyReader {
    pub fn open(paths: &[String], batch_size: usize) -> Result<NpyReader> {
        if batch_size == 0 {
            return Err(Error::invalid_arg("batch_size must be >= 1"));
        }
        if paths.is_empty() {
            return Err(Error::invalid_arg(
                "a .npy reader needs at least one file (argument 'paths')",
            ));
        }
        let files = paths
            .iter()
            .map(|p| open_npy(p))
            .collect::<Result<Vec<_>>>()?;
        let rows = files[0].rows;
        if let Some(f) = files.iter().find(|f| f.rows != rows) {
            return Err(Error::shape(format!(
                "the .npy files of one reader must have the same number of rows: '{}' has {} but '{}' has {rows}",
                f.path, f.rows, files[0].path
            ))
            .with_file(&f.path));
        }
        Ok(NpyReader {
            files,
            rows,
            batch_size,
            pos: Mutex::new(0),
        })
    }

    pub fn files(&self) -> Vec<String> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    pub fn num_outputs(&self) -> usize {
        self.files.len()
    }

    pub fn total_records(&self) -> u64 {
        self.rows
    }

    pub fn position(&self) -> u64 {
        *self.pos.lock()
    }

    pub fn reset(&self) {
        *self.pos.lock() = 0;
    }

    /// Reads the next `n` rows (atomically). The position moves only once
    /// every file's rows were read, as the Parquet reader's does: a read
    /// that fails (a file briefly truncated while it is copied) hands out
    /// nothing, and the next read tries the same rows again.
    pub fn read_batch(&self, n: usize) -> Result<Vec<Tensor>> {
        let mut pos = self.pos.lock();
        let start = *pos;
        let k = (n as u64).min(self.rows - start);
        let batch = self
            .files
            .iter()
            .map(|f| f.read_rows(start, k as usize))
            .collect::<Result<Vec<_>>>()?;
        *pos += k;
        Ok(batch)
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut e = Enc::new(NPY_MAGIC);
        e.u64(self.files.len() as u64);
        for f in &self.files {
            e.str(&f.path);
            e.str(&f.descr);
        }
        e.u64(self.rows);
        e.u64(self.batch_size as u64);
        e.u64(self.position());
        e.0
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<NpyReader> {
        let mut d = Dec::new("NpyReader", NPY_MAGIC, bytes)?;
        let nf = d.len()?;
        let mut files = Vec::with_capacity(nf);
        for _ in 0..nf {
            files.push((d.str()?, d.str()?));
        }
        let rows = d.u64()?;
        let batch = usize::try_from(d.u64()?).map_err(|_| d.bad("bad batch size"))?;
        let pos = d.u64()?;
        d.finish()?;
        if pos > rows || batch == 0 {
            return Err(d.bad("its position or batch size is out of range"));
        }
        let paths: Vec<String> = files.iter().map(|f| f.0.clone()).collect();
        let r = NpyReader::open(&paths, batch)?;
        for (f, (path, descr)) in r.files.iter().zip(&files) {
            if f.rows != rows || &f.descr != descr {
                return Err(Error::invalid_arg(format!(
                    "cannot restore a .npy reader: '{path}' now holds {} rows of {} but held {rows} rows of {descr} \
                     when the reader was saved",
                    f.rows, f.descr
                ))
                .with_file(path));
            }
        }
        *r.pos.lock() = pos;
        Ok(r)
    }
}

fn decode_npy_reader(p: &BlobProto) -> Result<BlobValue> {
    let r = NpyReader::from_bytes(p.content.as_deref().unwrap_or_default())?;
    Ok(BlobValue::Object(Arc::new(r)))
}

// ------------------------------------------------------------------- ops --

fn batch_size_arg(ctx: &OpDefCtx<'_>, default: i64, min: i64) -> Result<usize> {
    let b = ctx.args.i64("batch_size", default)?;
    if b < min {
        return Err(ctx.bad_arg(format!("batch_size must be >= {min}, got {b}")));
    }
    usize::try_from(b).map_err(|_| ctx.bad_arg(format!("batch_size {b} is too large")))
}

/// `path` and `paths`, in that order.
fn paths_arg(ctx: &OpDefCtx<'_>) -> Result<Vec<String>> {
    let mut v = Vec::new();
    if let Some(p) = ctx.args.string_opt("path")? {
        if !p.is_empty() {
            v.push(p);
        }
    }
    v.extend(ctx.args.string_list("paths")?.unwrap_or_default());
    Ok(v)
}

fn parquet_args(ctx: &OpDefCtx<'_>) -> Result<(Vec<String>, Vec<String>)> {
    let paths = paths_arg(ctx)?;
    if paths.is_empty() {
        return Err(
            ctx.bad_arg("a Parquet reader needs a file or folder (argument 'path' or 'paths')")
        );
    }
    let columns = ctx.args.string_list("columns")?.unwrap_or_default();
    Ok((paths, columns))
}

/// `dtypes` and `is_list`: per column, what is expected (`None`: anything).
fn expect_args(
    ctx: &OpDefCtx<'_>,
    columns: &[String],
) -> Result<Vec<(Option<DataType>, Option<bool>)>> {
    let dtypes = ctx.args.dtypes("dtypes", false)?;
    let is_list = ctx.args.ints("is_list")?.unwrap_or_default();
    for (what, len) in [("dtypes", dtypes.len()), ("is_list", is_list.len())] {
        if len != 0 && len != columns.len() {
            return Err(ctx.bad_arg(format!(
                "'{what}' must have one entry per column ({}), got {len}",
                columns.len()
            )));
        }
    }
    Ok((0..columns.len())
        .map(|c| (dtypes.get(c).copied(), is_list.get(c).map(|&l| l != 0)))
        .collect())
}

fn create_parquet_reader(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (paths, columns) = parquet_args(ctx)?;
    let batch = batch_size_arg(ctx, DEFAULT_BATCH_SIZE, 1)?;
    let expect = expect_args(ctx, &columns)?;
    Ok(kernel(move |cx| {
        let r = ParquetReader::open_expecting(&paths, &columns, &expect, batch)?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(r)));
        Ok(true)
    }))
}

fn parquet_schema(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (paths, columns) = parquet_args(ctx)?;
    let expect = expect_args(ctx, &columns)?;
    Ok(kernel(move |cx| {
        let r = ParquetReader::open_expecting(&paths, &columns, &expect, 1)?;
        let cols = r.columns();
        let n = cols.len();
        let names = cols.iter().map(|c| c.0.as_bytes().to_vec()).collect();
        let dtypes = cols.iter().map(|c| c.1 as i32).collect();
        let lists = cols.iter().map(|c| c.2).collect();
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::from_vec(&[n], names)?));
        cx.output_blob(1)
            .set(BlobValue::Tensor(Tensor::from_vec::<i32>(&[n], dtypes)?));
        cx.output_blob(2)
            .set(BlobValue::Tensor(Tensor::from_vec::<bool>(&[n], lists)?));
        Ok(true)
    }))
}

fn object_input<T: BlobObject>(cx: &OpCx<'_>, kind: &str) -> Result<Arc<T>> {
    cx.input_blob(0)
        .read()
        .object::<T>(kind)
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
}

fn set_outputs(cx: &OpCx<'_>, tensors: Vec<Tensor>) {
    for (j, t) in tensors.into_iter().enumerate() {
        cx.output_blob(j).set(BlobValue::Tensor(t));
    }
}

fn check_outputs(cx: &OpCx<'_>, want: usize, what: &str) -> Result<()> {
    if cx.num_outputs() != want {
        return Err(Error::invalid_arg(format!(
            "the {what} reads {want} tensors per batch (one per column, two per list column), so the op needs \
             {want} outputs, got {}",
            cx.num_outputs()
        ))
        .with_blob(&cx.io.input_names[0]));
    }
    Ok(())
}

fn read_parquet_batch(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = batch_size_arg(ctx, 0, 0)?;
    // By column: the string buffers of the batch before the last one.
    let mut spare: Vec<Option<Vec<Vec<u8>>>> = Vec::new();
    Ok(kernel(move |cx| {
        let r = object_input::<ParquetReader>(cx, "ParquetReader")?;
        check_outputs(cx, r.num_outputs(), "Parquet reader")?;
        let n = if batch == 0 { r.batch_size() } else { batch };
        let tensors = r.read_batch_reusing(n, std::mem::take(&mut spare))?;
        // The string tensors the new batch replaces become the spare
        // buffers of the next read, so that steady reading allocates
        // nothing per string; a failed read leaves the outputs as they were.
        let mut tensors = tensors.into_iter();
        let mut j = 0;
        for c in &r.columns {
            if c.list {
                set_output(cx, j, tensors.next());
                j += 1;
            }
            let old = set_output(cx, j, tensors.next());
            spare.push(match old {
                BlobValue::Tensor(Tensor::Str(a)) => Some(a.into_raw_vec_and_offset().0),
                _ => None,
            });
            j += 1;
        }
        Ok(true)
    }))
}

/// Stores a batch's tensor in output `j`, returning what it held.
fn set_output(cx: &OpCx<'_>, j: usize, t: Option<Tensor>) -> BlobValue {
    let t = t.expect("a reader returns one tensor per output");
    std::mem::replace(&mut *cx.output_blob(j).write(), BlobValue::Tensor(t))
}

fn reset_parquet_reader(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        object_input::<ParquetReader>(cx, "ParquetReader")?.reset();
        Ok(true)
    }))
}

fn fields_dtypes_args(ctx: &OpDefCtx<'_>) -> Result<(Vec<String>, Vec<DataType>)> {
    let fields = ctx.args.string_list("fields")?.unwrap_or_default();
    let dtypes = ctx.args.dtypes("dtypes", false)?;
    if fields.len() != dtypes.len() {
        return Err(ctx.bad_arg(format!(
            "'fields' and 'dtypes' must have the same length, got {} and {}",
            fields.len(),
            dtypes.len()
        )));
    }
    Ok((fields, dtypes))
}

fn create_parquet_writer(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let path = ctx.args.string("path", "")?;
    if path.is_empty() {
        return Err(ctx.bad_arg("a Parquet writer needs a file (argument 'path')"));
    }
    let compression = ctx.args.string("compression", "snappy")?;
    if parse_compression(&compression).is_none() {
        return Err(ctx.bad_arg(format!(
            "unknown Parquet compression '{compression}' (use none, snappy, gzip, zstd or lz4)"
        )));
    }
    let rg = ctx.args.i64("row_group_size", 131072)?;
    let rg = usize::try_from(rg)
        .ok()
        .filter(|&r| r >= 1)
        .ok_or_else(|| ctx.bad_arg(format!("row_group_size must be >= 1, got {rg}")))?;
    let binary = ctx.args.bool("binary", false)?;
    let (fields, dtypes) = fields_dtypes_args(ctx)?;
    Ok(kernel(move |cx| {
        let w = ParquetWriter::new(&path, &compression, rg, binary)?;
        if !fields.is_empty() {
            w.set_schema(&fields, &dtypes)?;
        }
        cx.output_blob(0).set(BlobValue::Object(Arc::new(w)));
        Ok(true)
    }))
}

fn set_parquet_writer_schema(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (fields, dtypes) = fields_dtypes_args(ctx)?;
    if fields.is_empty() {
        return Err(ctx.bad_arg("'fields' and 'dtypes' are required"));
    }
    Ok(kernel(move |cx| {
        object_input::<ParquetWriter>(cx, "ParquetWriter")?.set_schema(&fields, &dtypes)?;
        Ok(true)
    }))
}

fn write_parquet_batch(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let fields = ctx.args.string_list("fields")?.unwrap_or_default();
    if fields.len() + 1 != ctx.num_inputs() {
        return Err(ctx.bad_arg(format!(
            "'fields' must name each input after the writer: {} inputs, {} names",
            ctx.num_inputs() - 1,
            fields.len()
        )));
    }
    Ok(kernel(move |cx| {
        let w = object_input::<ParquetWriter>(cx, "ParquetWriter")?;
        let l = cx.lock();
        let tensors = (1..cx.num_inputs())
            .map(|i| l.tensor(i))
            .collect::<Result<Vec<_>>>()?;
        w.write(&fields, &tensors)?;
        Ok(true)
    }))
}

fn close_parquet_writer(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        object_input::<ParquetWriter>(cx, "ParquetWriter")?.close()?;
        Ok(true)
    }))
}

fn create_npy_reader(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let paths = paths_arg(ctx)?;
    if paths.is_empty() {
        return Err(
            ctx.bad_arg("a .npy reader needs at least one file (argument 'paths' or 'path')")
        );
    }
    let batch = batch_size_arg(ctx, DEFAULT_BATCH_SIZE, 1)?;
    Ok(kernel(move |cx| {
        let r = NpyReader::open(&paths, batch)?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(r)));
        Ok(true)
    }))
}

fn read_npy_batch(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = batch_size_arg(ctx, 0, 0)?;
    Ok(kernel(move |cx| {
        let r = object_input::<NpyReader>(cx, "NpyReader")?;
        check_outputs(cx, r.num_outputs(), ".npy reader")?;
        let n = if batch == 0 { r.batch_size } else { batch };
        let tensors = r.read_batch(n)?;
        set_outputs(cx, tensors);
        Ok(true)
    }))
}

fn reset_npy_reader(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        object_input::<NpyReader>(cx, "NpyReader")?.reset();
        Ok(true)
    }))
}

// ------------------------------------------------------------------ tests --

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Argument;
    use crate::test_util::{get, int_arg, op, run, strs};
    use crate::workspace::Workspace;
    use parquet::data_type::ByteArray;
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn copy_strings_overwrites_old_strings_then_allocates() {
        let strs = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        // Three old strings; a batch of one longer, one empty, then (after
        // a second call) two more: the third old slot and one new.
        let mut dst = strs(&["old-a", "old-bb", "old-ccc"]);
        let mut filled = 0;
        copy_strings(&strs(&["a much longer string", ""]), &mut dst, &mut filled);
        assert_eq!(filled, 2);
        copy_strings(&strs(&["x", "yz"]), &mut dst, &mut filled);
        assert_eq!(filled, 4);
        assert_eq!(dst, strs(&["a much longer string", "", "x", "yz"]));
        // A shorter batch over a longer one: the leftovers are past `filled`.
        let mut filled = 0;
        copy_strings(&strs(&["q"]), &mut dst, &mut filled);
        assert_eq!((filled, &dst[0]), (1, &b"q".to_vec()));
        // Both halves above the parallel threshold.
        let big: Vec<Vec<u8>> = (0..40000).map(|i| i.to_string().into_bytes()).collect();
        let mut dst: Vec<Vec<u8>> = (0..20000).map(|_| b"stale".to_vec()).collect();
        let mut filled = 0;
        copy_strings(&big, &mut dst, &mut filled);
        assert_eq!((filled, &dst), (40000, &big));
    }

    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Scratch {
            static N: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "ferrocaffe-fileio-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
        fn path(&self, name: &str) -> String {
            let p = self.0.join(name);
            if let Some(d) = p.parent() {
                fs::create_dir_all(d).unwrap();
            }
            p.display().to_string()
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// One column chunk to write: values plus optional levels.
    enum Vals {
        B(Vec<bool>),
        I32(Vec<i32>),
        I64(Vec<i64>),
        F32(Vec<f32>),
        F64(Vec<f64>),
        S(Vec<&'static str>),
    }

    struct Chunk {
        vals: Vals,
        def: Option<Vec<i16>>,
        rep: Option<Vec<i16>>,
    }

    fn plain(vals: Vals) -> Chunk {
        Chunk {
            vals,
            def: None,
            rep: None,
        }
    }

    /// A required list<int64> column chunk ("repeated int64 item" under a LIST
    /// group with required levels): records given as slices.
    fn list_i64(records: &[&[i64]]) -> Chunk {
        let (mut vals, mut def, mut rep) = (Vec::new(), Vec::new(), Vec::new());
        for r in records {
            if r.is_empty() {
                def.push(0);
                rep.push(0);
            }
            for (i, &v) in r.iter().enumerate() {
                vals.push(v);
                def.push(1);
                rep.push(if i == 0 { 0 } else { 1 });
            }
        }
        Chunk {
            vals: Vals::I64(vals),
            def: Some(def),
            rep: Some(rep),
        }
    }

    fn write_parquet(
        path: &str,
        schema: &str,
        groups: Vec<Vec<Chunk>>,
        codec: Compression,
        page_rows: usize,
    ) {
        let schema = Arc::new(parse_message_type(schema).unwrap());
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(codec)
                .set_data_page_row_count_limit(page_rows)
                .set_write_batch_size(page_rows)
                .build(),
        );
        let mut w = SerializedFileWriter::new(File::create(path).unwrap(), schema, props).unwrap();
        for g in groups {
            let mut rg = w.next_row_group().unwrap();
            for c in g {
                let mut col = rg.next_column().unwrap().expect("a column per chunk");
                let (d, r) = (c.def.as_deref(), c.rep.as_deref());
                match c.vals {
                    Vals::B(v) => col.typed::<BoolType>().write_batch(&v, d, r),
                    Vals::I32(v) => col.typed::<Int32Type>().write_batch(&v, d, r),
                    Vals::I64(v) => col.typed::<Int64Type>().write_batch(&v, d, r),
                    Vals::F32(v) => col.typed::<FloatType>().write_batch(&v, d, r),
                    Vals::F64(v) => col.typed::<DoubleType>().write_batch(&v, d, r),
                    Vals::S(v) => {
                        let v: Vec<ByteArray> = v.into_iter().map(ByteArray::from).collect();
                        col.typed::<ByteArrayType>().write_batch(&v, d, r)
                    }
                }
                .unwrap();
                col.close().unwrap();
            }
            assert!(rg.next_column().unwrap().is_none(), "every column written");
            rg.close().unwrap();
        }
        w.close().unwrap();
    }

    const SCHEMA: &str = "message m {
        required int64 id;
        required float x;
        required binary name (UTF8);
        required group items (LIST) { repeated int64 item; }
    }";

    /// Records `lo..hi`: id = i, x = i / 2, name = "n<i>", items = [i; i % 3].
    fn group(lo: i64, hi: i64) -> Vec<Chunk> {
        let names: Vec<&'static str> = (lo..hi)
            .map(|i| &*Box::leak(format!("n{i}").into_boxed_str()))
            .collect();
        let items: Vec<Vec<i64>> = (lo..hi).map(|i| vec![i; (i % 3) as usize]).collect();
        let refs: Vec<&[i64]> = items.iter().map(|v| v.as_slice()).collect();
        vec![
            plain(Vals::I64((lo..hi).collect())),
            plain(Vals::F32((lo..hi).map(|i| i as f32 / 2.0).collect())),
            plain(Vals::S(names)),
            list_i64(&refs),
        ]
    }

    /// A file of records `lo..hi` in row groups of `rg` records.
    fn sample(path: &str, lo: i64, hi: i64, rg: i64, codec: Compression) {
        let mut groups = Vec::new();
        let mut a = lo;
        while a < hi {
            groups.push(group(a, (a + rg).min(hi)));
            a += rg;
        }
        write_parquet(path, SCHEMA, groups, codec, 7);
    }

    fn ids(t: &Tensor) -> Vec<i64> {
        t.array::<i64>().unwrap().iter().copied().collect()
    }

    /// Reads every batch, checking each record's fields against its id;
    /// returns the ids in order.
    fn drain(r: &ParquetReader, n: usize) -> Vec<i64> {
        let mut all = Vec::new();
        loop {
            let b = r.read_batch(n).unwrap();
            assert_eq!(b.len(), 5);
            let id = ids(&b[0]);
            let x: Vec<f32> = b[1].array::<f32>().unwrap().iter().copied().collect();
            let names: Vec<Vec<u8>> = b[2].array::<Vec<u8>>().unwrap().iter().cloned().collect();
            let lengths: Vec<i32> = b[3].array::<i32>().unwrap().iter().copied().collect();
            let values = ids(&b[4]);
            assert!(id.len() <= n);
            assert_eq!(x.len(), id.len());
            assert_eq!(lengths.len(), id.len());
            let mut at = 0;
            for (k, &i) in id.iter().enumerate() {
                assert_eq!(x[k], i as f32 / 2.0);
                assert_eq!(names[k], format!("n{i}").into_bytes());
                assert_eq!(lengths[k] as i64, i % 3);
                assert!(values[at..at + lengths[k] as usize].iter().all(|&v| v == i));
                at += lengths[k] as usize;
            }
            assert_eq!(at, values.len());
            if id.is_empty() {
                assert_eq!(b[4].shape(), &[0]);
                assert_eq!(b[2].dtype(), DataType::String);
                return all;
            }
            all.extend(id);
        }
    }

    #[test]
    fn streams_batches_across_pages_and_row_groups() {
        let s = Scratch::new();
        for codec in [
            Compression::UNCOMPRESSED,
            Compression::SNAPPY,
            Compression::ZSTD(Default::default()),
            Compression::GZIP(Default::default()),
            Compression::LZ4_RAW,
        ] {
            let p = s.path("a.parquet");
            sample(&p, 0, 100, 30, codec);
            let r = ParquetReader::open(&[p], &[], 8).unwrap();
            assert_eq!(r.total_records(), 100);
            assert_eq!(
                r.columns(),
                vec![
                    ("id".to_string(), DataType::Int64, false),
                    ("x".to_string(), DataType::Float, false),
                    ("name".to_string(), DataType::String, false),
                    ("items".to_string(), DataType::Int64, true),
                ]
            );
            for n in [1, 8, 29, 30, 31, 1000] {
                r.reset();
                assert_eq!(
                    drain(&r, n),
                    (0..100).collect::<Vec<_>>(),
                    "batch {n}, {codec}"
                );
                assert_eq!(r.position(), 100);
            }
        }
    }

    #[test]
    fn a_folder_is_its_data_files_in_name_order() {
        let s = Scratch::new();
        sample(&s.path("d/part-1.parquet"), 50, 80, 16, Compression::SNAPPY);
        sample(&s.path("d/part-0.parquet"), 0, 50, 16, Compression::SNAPPY);
        sample(
            &s.path("d/sub/part-2.parquet"),
            80,
            81,
            16,
            Compression::SNAPPY,
        );
        sample(
            &s.path("d/part-05-empty.parquet"),
            0,
            0,
            16,
            Compression::SNAPPY,
        );
        fs::write(s.path("d/_SUCCESS"), b"").unwrap();
        fs::write(s.path("d/.part-0.parquet.crc"), b"junk").unwrap();
        let r = ParquetReader::open(&[s.path("d")], &[], 7).unwrap();
        assert_eq!(r.files().len(), 4);
        assert_eq!(drain(&r, 7), (0..81).collect::<Vec<_>>());
        let e = ParquetReader::open(&[s.path("empty-dir/")], &[], 7);
        fs::create_dir_all(s.path("empty-dir")).unwrap();
        let e2 = ParquetReader::open(&[s.path("empty-dir")], &[], 7).unwrap_err();
        assert!(e.is_err());
        assert!(e2.message.contains("holds no data files"), "{}", e2.message);
    }

    #[test]
    fn an_empty_file_reads_as_no_records() {
        let s = Scratch::new();
        let p = s.path("empty.parquet");
        sample(&p, 0, 0, 10, Compression::SNAPPY);
        let r = ParquetReader::open(&[p], &["id".into(), "items".into()], 4).unwrap();
        let b = r.read_batch(4).unwrap();
        assert_eq!(b.len(), 3);
        assert!(b.iter().all(|t| t.shape() == [0]));
        assert_eq!(b[1].dtype(), DataType::Int32);
    }

    #[test]
    fn selected_columns_in_the_order_asked() {
        let s = Scratch::new();
        let p = s.path("a.parquet");
        sample(&p, 0, 10, 4, Compression::SNAPPY);
        let r = ParquetReader::open(std::slice::from_ref(&p), &["items".into(), "id".into()], 4)
            .unwrap();
        assert_eq!(r.num_outputs(), 3);
        let b = r.read_batch(4).unwrap();
        assert_eq!(b[0], Tensor::from_vec(&[4], vec![0i32, 1, 2, 0]).unwrap());
        assert_eq!(b[1], Tensor::from_vec(&[3], vec![1i64, 2, 2]).unwrap());
        assert_eq!(ids(&b[2]), vec![0, 1, 2, 3]);
        // The full path of the list's leaf names the same column.
        let r = ParquetReader::open(&[p], &["items.item".into()], 4).unwrap();
        assert_eq!(r.columns()[0].0, "items");
    }

    #[test]
    fn missing_corrupt_and_mistyped_files_name_file_and_column() {
        let s = Scratch::new();
        let good = s.path("good.parquet");
        sample(&good, 0, 40, 40, Compression::SNAPPY);

        let missing = s.path("missing.parquet");
        let e = ParquetReader::open(std::slice::from_ref(&missing), &[], 4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(
            e.message.contains(&missing) && e.message.contains("No such file"),
            "{}",
            e.message
        );
        assert_eq!(e.context.file.as_deref(), Some(missing.as_str()));

        let zero = s.path("zero.parquet");
        fs::write(&zero, b"").unwrap();
        let e = ParquetReader::open(std::slice::from_ref(&zero), &[], 4).unwrap_err();
        assert!(
            e.message.contains(&zero) && e.message.contains("empty"),
            "{}",
            e.message
        );

        let junk = s.path("junk.parquet");
        fs::write(&junk, b"this is not a parquet file at all, only some text").unwrap();
        let e = ParquetReader::open(std::slice::from_ref(&junk), &[], 4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(
            e.message.contains(&junk) && e.message.contains("not a valid Parquet file"),
            "{}",
            e.message
        );

        // Damaged pages: the footer is intact, the data is not.
        let bytes = fs::read(&good).unwrap();
        let bad = s.path("bad-pages.parquet");
        let mut b = bytes.clone();
        for v in b.iter_mut().skip(4).take(bytes.len() / 2) {
            *v = 0xAB;
        }
        fs::write(&bad, &b).unwrap();
        let r = ParquetReader::open(std::slice::from_ref(&bad), &[], 16).unwrap();
        let e = r.read_batch(16).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(
            e.message.contains(&bad) && e.message.contains("column '"),
            "{}",
            e.message
        );
        // The failure leaves the position alone and fails again, never hangs.
        assert_eq!(r.position(), 0);
        assert!(r.read_batch(16).is_err());

        // A truncated file loses its footer.
        let cut = s.path("cut.parquet");
        fs::write(&cut, &bytes[..bytes.len() - 20]).unwrap();
        let e = ParquetReader::open(std::slice::from_ref(&cut), &[], 4).unwrap_err();
        assert!(e.message.contains(&cut), "{}", e.message);

        let e = ParquetReader::open(std::slice::from_ref(&good), &["nope".into()], 4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message.contains("no column 'nope'") && e.message.contains(&good),
            "{}",
            e.message
        );

        let e = ParquetReader::open_expecting(
            std::slice::from_ref(&good),
            &["id".into()],
            &[(Some(DataType::Float), None)],
            4,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.message.contains("column 'id'")
                && e.message.contains(&good)
                && e.message.contains("int64 values but float32"),
            "{}",
            e.message
        );
        let e = ParquetReader::open_expecting(
            std::slice::from_ref(&good),
            &["items".into()],
            &[(None, Some(false))],
            4,
        )
        .unwrap_err();
        assert!(e.message.contains("lists of int64"), "{}", e.message);

        // Two files disagreeing on a column's type.
        let other = s.path("other.parquet");
        write_parquet(
            &other,
            "message m { required double id; }",
            vec![vec![plain(Vals::F64(vec![1.0]))]],
            Compression::SNAPPY,
            10,
        );
        let e = ParquetReader::open(&[good.clone(), other.clone()], &["id".into()], 4).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.message.contains(&other) && e.message.contains("column 'id'"),
            "{}",
            e.message
        );
    }

    #[test]
    fn nulls_are_refused_but_a_null_list_is_empty() {
        let s = Scratch::new();
        let p = s.path("nulls.parquet");
        let schema = "message m {
            optional int32 a;
            optional group l (LIST) { repeated group list { optional int64 element; } }
        }";
        // a: 1, null, 3.  l: [5, 6], null, [].
        let a = Chunk {
            vals: Vals::I32(vec![1, 3]),
            def: Some(vec![1, 0, 1]),
            rep: None,
        };
        let l = Chunk {
            vals: Vals::I64(vec![5, 6]),
            def: Some(vec![3, 3, 0, 1]),
            rep: Some(vec![0, 1, 0, 0]),
        };
        write_parquet(&p, schema, vec![vec![a, l]], Compression::SNAPPY, 10);
        let r = ParquetReader::open(std::slice::from_ref(&p), &["l".into()], 10).unwrap();
        let b = r.read_batch(10).unwrap();
        assert_eq!(b[0], Tensor::from_vec(&[3], vec![2i32, 0, 0]).unwrap());
        assert_eq!(b[1], Tensor::from_vec(&[2], vec![5i64, 6]).unwrap());
        let r = ParquetReader::open(std::slice::from_ref(&p), &["a".into()], 10).unwrap();
        let e = r.read_batch(10).unwrap_err();
        assert!(
            e.message.contains("column 'a'")
                && e.message.contains("null")
                && e.message.contains(&p),
            "{}",
            e.message
        );

        let p2 = s.path("null-item.parquet");
        let l = Chunk {
            vals: Vals::I64(vec![5]),
            def: Some(vec![3, 2]),
            rep: Some(vec![0, 1]),
        };
        write_parquet(
            &p2,
            "message m { optional group l (LIST) { repeated group list { optional int64 element; } } }",
            vec![vec![l]],
            Compression::SNAPPY,
            10,
        );
        let r = ParquetReader::open(&[p2], &[], 10).unwrap();
        assert!(r.read_batch(10).unwrap_err().message.contains("null item"));
    }

    #[test]
    fn integer_annotations_pick_the_tensor_type() {
        let s = Scratch::new();
        let p = s.path("ints.parquet");
        let schema = "message m {
            required int32 a (INT_8); required int32 b (UINT_16); required int32 c (UINT_32);
            required boolean d; required double e; required int32 f (DATE);
        }";
        let g = vec![
            plain(Vals::I32(vec![-128, 127])),
            plain(Vals::I32(vec![0, 65535])),
            plain(Vals::I32(vec![-1, 7])),
            plain(Vals::B(vec![true, false])),
            plain(Vals::F64(vec![0.25, -1.5])),
            plain(Vals::I32(vec![19000, 19001])),
        ];
        write_parquet(&p, schema, vec![g], Compression::SNAPPY, 10);
        let r = ParquetReader::open(&[p], &[], 10).unwrap();
        let b = r.read_batch(10).unwrap();
        assert_eq!(b[0], Tensor::from_vec(&[2], vec![-128i8, 127]).unwrap());
        assert_eq!(b[1], Tensor::from_vec(&[2], vec![0u16, 65535]).unwrap());
        assert_eq!(
            b[2],
            Tensor::from_vec(&[2], vec![4294967295i64, 7]).unwrap()
        );
        assert_eq!(b[3], Tensor::from_vec(&[2], vec![true, false]).unwrap());
        assert_eq!(b[4], Tensor::from_vec(&[2], vec![0.25f64, -1.5]).unwrap());
        assert_eq!(b[5], Tensor::from_vec(&[2], vec![19000i32, 19001]).unwrap());

        let p = s.path("i96.parquet");
        write_parquet(
            &p,
            "message m { required int64 u (UINT_64); }",
            vec![vec![plain(Vals::I64(vec![1]))]],
            Compression::SNAPPY,
            10,
        );
        let e = ParquetReader::open(&[p], &[], 10).unwrap_err();
        assert!(
            e.message.contains("column 'u'") && e.message.contains("UINT64"),
            "{}",
            e.message
        );
    }

    #[test]
    fn threads_sharing_a_reader_get_every_record_once() {
        let s = Scratch::new();
        sample(&s.path("d/0.parquet"), 0, 500, 64, Compression::SNAPPY);
        sample(&s.path("d/1.parquet"), 500, 1000, 100, Compression::SNAPPY);
        let r = Arc::new(ParquetReader::open(&[s.path("d")], &[], 13).unwrap());
        let got: Vec<i64> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4).map(|_| sc.spawn(|| drain(&r, 13))).collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = got.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_saved_reader_resumes_where_it_stood() {
        let s = Scratch::new();
        sample(&s.path("d/0.parquet"), 0, 45, 20, Compression::SNAPPY);
        sample(&s.path("d/1.parquet"), 45, 90, 20, Compression::SNAPPY);
        let r = ParquetReader::open(
            &[s.path("d")],
            &["id".into(), "items".into(), "name".into(), "x".into()],
            11,
        )
        .unwrap();
        for _ in 0..5 {
            r.read_batch(11).unwrap();
        }
        assert_eq!(r.position(), 55);
        let bytes = crate::storage::serialize_blob("r", &BlobValue::Object(Arc::new(r))).unwrap();
        let v = crate::storage::deserialize_blob(&bytes).unwrap();
        let back = v.object::<ParquetReader>("ParquetReader").unwrap();
        assert_eq!(back.position(), 55);
        assert_eq!(back.batch_size(), 11);
        let b = back.read_batch(11).unwrap();
        assert_eq!(ids(&b[0]), (55..66).collect::<Vec<_>>());
        assert_eq!(
            b[1].array::<i32>()
                .unwrap()
                .iter()
                .map(|&l| l as i64)
                .collect::<Vec<_>>(),
            (55..66).map(|i| i % 3).collect::<Vec<_>>()
        );

        // A file that changed since is refused, naming it.
        let bytes2 = crate::storage::serialize_blob("r", &BlobValue::Object(back.clone())).unwrap();
        sample(&s.path("d/1.parquet"), 45, 91, 20, Compression::SNAPPY);
        let e = crate::storage::deserialize_blob(&bytes2).unwrap_err();
        assert!(
            e.message.contains("1.parquet") && e.message.contains("46 records now"),
            "{}",
            e.message
        );
        // Malformed saved bytes are a CorruptCheckpoint error.
        let e = ParquetReader::from_bytes(b"FCPQ\x01\x05").unwrap_err();
        assert_eq!(e.kind, ErrorKind::CorruptCheckpoint);
    }

    // ------------------------------------------------------------ ops --

    fn ints_arg(name: &str, v: &[i64]) -> Argument {
        Argument {
            name: Some(name.into()),
            ints: v.to_vec(),
            ..Default::default()
        }
    }
    fn str_arg(name: &str, v: &str) -> Argument {
        Argument {
            name: Some(name.into()),
            s: Some(v.as_bytes().to_vec()),
            ..Default::default()
        }
    }
    fn strs_arg(name: &str, v: &[&str]) -> Argument {
        Argument {
            name: Some(name.into()),
            strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn parquet_ops_read_reset_and_describe() {
        let s = Scratch::new();
        let p = s.path("a.parquet");
        sample(&p, 0, 10, 4, Compression::SNAPPY);
        let ws = Workspace::new();
        let cols = strs_arg("columns", &["id", "items"]);
        run(
            &ws,
            op(
                "ParquetSchema",
                &[],
                &["n", "t", "l"],
                vec![str_arg("path", &p), cols.clone()],
            ),
        )
        .unwrap();
        assert_eq!(
            get(&ws, "n"),
            Tensor::from_vec(&[2], vec![b"id".to_vec(), b"items".to_vec()]).unwrap()
        );
        assert_eq!(
            get(&ws, "t"),
            Tensor::from_vec(&[2], vec![10i32, 10]).unwrap()
        );
        assert_eq!(
            get(&ws, "l"),
            Tensor::from_vec(&[2], vec![false, true]).unwrap()
        );

        let create = |extra: Vec<Argument>| {
            let mut a = vec![str_arg("path", &p), cols.clone(), int_arg("batch_size", 6)];
            a.extend(extra);
            op("CreateParquetReader", &[], &["r"], a)
        };
        run(
            &ws,
            create(vec![
                ints_arg("dtypes", &[10, 10]),
                ints_arg("is_list", &[0, 1]),
            ]),
        )
        .unwrap();
        let read = op("ReadParquetBatch", &["r"], &["id", "len", "val"], vec![]);
        run(&ws, read.clone()).unwrap();
        assert_eq!(ids(&get(&ws, "id")), (0..6).collect::<Vec<_>>());
        run(&ws, read.clone()).unwrap();
        assert_eq!(ids(&get(&ws, "id")), (6..10).collect::<Vec<_>>());
        assert_eq!(get(&ws, "len").shape(), &[4]);
        run(&ws, read.clone()).unwrap();
        assert_eq!(get(&ws, "id").shape(), &[0]);
        run(&ws, op("ResetParquetReader", &["r"], &[], vec![])).unwrap();
        run(
            &ws,
            op(
                "ReadParquetBatch",
                &["r"],
                &["id", "len", "val"],
                vec![int_arg("batch_size", 2)],
            ),
        )
        .unwrap();
        assert_eq!(ids(&get(&ws, "id")), vec![0, 1]);

        let e = run(&ws, op("ReadParquetBatch", &["r"], &["id", "len"], vec![])).unwrap_err();
        assert!(
            e.message.contains("needs 3 outputs, got 2"),
            "{}",
            e.message
        );
        let e = run(&ws, create(vec![ints_arg("dtypes", &[10, 1])])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.full_message().contains("column 'items'"),
            "{}",
            e.full_message()
        );
        let e = run(&ws, create(vec![ints_arg("dtypes", &[10])])).unwrap_err();
        assert!(e.message.contains("one entry per column"), "{}", e.message);
        let e = run(&ws, op("CreateParquetReader", &[], &["r"], vec![])).unwrap_err();
        assert!(
            e.message.contains("needs a file or folder"),
            "{}",
            e.message
        );
        ws.feed("t2", BlobValue::Tensor(Tensor::scalar(1i32)));
        let e = run(&ws, op("ReadParquetBatch", &["t2"], &["x"], vec![])).unwrap_err();
        assert!(
            e.message.contains("ParquetReader was expected"),
            "{}",
            e.message
        );
    }

    // --------------------------------------------------------- writer --

    #[test]
    fn written_files_read_back_the_same() {
        let s = Scratch::new();
        let p = s.path("out.parquet");
        let w = ParquetWriter::new(&p, "zstd", 5, false).unwrap();
        let fields: Vec<String> = [
            "id",
            "a:b",
            "items:lengths",
            "items:values",
            "name",
            "a:c",
            "small",
        ]
        .iter()
        .map(|f| f.to_string())
        .collect();
        let mut want_items = Vec::new();
        for batch in 0..4i64 {
            let ids: Vec<i64> = (batch * 3..batch * 3 + 3).collect();
            let lengths: Vec<i32> = ids.iter().map(|i| (i % 3) as i32).collect();
            let values: Vec<i64> = ids
                .iter()
                .flat_map(|&i| vec![i * 10; (i % 3) as usize])
                .collect();
            want_items.extend(values.iter().copied());
            let t = [
                Tensor::from_vec(&[3], ids.clone()).unwrap(),
                Tensor::from_vec(&[3], ids.iter().map(|&i| i as f64).collect()).unwrap(),
                Tensor::from_vec(&[3], lengths).unwrap(),
                Tensor::from_vec(&[values.len()], values).unwrap(),
                strs(&["x", "yy", "é"]),
                Tensor::from_vec(&[3], vec![true, false, true]).unwrap(),
                Tensor::from_vec(&[3], vec![-1i8, 0, 1]).unwrap(),
            ];
            w.write(&fields, &t.iter().collect::<Vec<_>>()).unwrap();
        }
        assert!(!Path::new(&p).exists(), "the file appears on close");
        w.close().unwrap();
        w.close().unwrap();
        assert!(w
            .write(&fields, &[])
            .unwrap_err()
            .message
            .contains("already closed"));
        let r = ParquetReader::open(std::slice::from_ref(&p), &[], 100).unwrap();
        assert_eq!(
            r.files.iter().map(|f| f.rg_rows.clone()).next().unwrap(),
            vec![6, 6]
        );
        assert_eq!(
            r.columns(),
            vec![
                ("id".into(), DataType::Int64, false),
                ("a.b".into(), DataType::Double, false),
                ("a.c".into(), DataType::Bool, false),
                ("items".into(), DataType::Int64, true),
                ("name".into(), DataType::String, false),
                ("small".into(), DataType::Int8, false),
            ]
        );
        let b = r.read_batch(100).unwrap();
        assert_eq!(ids(&b[0]), (0..12).collect::<Vec<_>>());
        assert_eq!(
            b[1],
            Tensor::from_vec(&[12], (0..12).map(|i| i as f64).collect()).unwrap()
        );
        assert_eq!(
            b[3].array::<i32>()
                .unwrap()
                .iter()
                .map(|&l| l as i64)
                .collect::<Vec<_>>(),
            (0..12).map(|i| i % 3).collect::<Vec<_>>()
        );
        assert_eq!(ids(&b[4]), want_items);
        assert_eq!(b[5].array::<Vec<u8>>().unwrap()[2], "é".as_bytes().to_vec());
        assert_eq!(
            b[6].array::<i8>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>()[..3],
            [-1, 0, 1]
        );
    }

    #[test]
    fn writer_errors_name_the_file_and_column() {
        let s = Scratch::new();
        let e = ParquetWriter::new(
            &s.0.join("no/such/dir/x.parquet").display().to_string(),
            "snappy",
            10,
            false,
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Io);
        assert!(
            e.message.contains("x.parquet") && e.message.contains("folder does not exist"),
            "{}",
            e.message
        );
        assert!(ParquetWriter::new(&s.path("x.parquet"), "brotli", 10, false).is_err());

        let p = s.path("x.parquet");
        let w = ParquetWriter::new(&p, "snappy", 10, false).unwrap();
        let fields = vec!["id".to_string(), "v".to_string()];
        let ok = [
            Tensor::from_vec(&[2], vec![1i64, 2]).unwrap(),
            Tensor::from_vec(&[2], vec![0.5f32, 1.5]).unwrap(),
        ];
        w.write(&fields, &ok.iter().collect::<Vec<_>>()).unwrap();
        let wrong = [
            Tensor::from_vec(&[1], vec![3i64]).unwrap(),
            Tensor::from_vec(&[1], vec![0.5f64]).unwrap(),
        ];
        let e = w
            .write(&fields, &wrong.iter().collect::<Vec<_>>())
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        assert!(
            e.message.contains("column 'v'")
                && e.message.contains(&p)
                && e.message.contains("float64 values but"),
            "{}",
            e.message
        );
        let ragged = [
            Tensor::from_vec(&[1], vec![3i64]).unwrap(),
            Tensor::from_vec(&[2], vec![0.5f32, 1.]).unwrap(),
        ];
        let e = w
            .write(&fields, &ragged.iter().collect::<Vec<_>>())
            .unwrap_err();
        assert!(
            e.message.contains("column 'v'") && e.message.contains("2 records"),
            "{}",
            e.message
        );
        let e = w.write(&["id".to_string()], &[&ok[0]]).unwrap_err();
        assert!(
            e.message.contains("has the columns [id, v]"),
            "{}",
            e.message
        );
        let f2 = vec!["l:lengths".to_string(), "l:values".to_string()];
        let w2 = ParquetWriter::new(&s.path("l.parquet"), "snappy", 10, false).unwrap();
        let bad = [
            Tensor::from_vec(&[2], vec![1i32, 1]).unwrap(),
            Tensor::from_vec(&[3], vec![1i64, 2, 3]).unwrap(),
        ];
        let e = w2.write(&f2, &bad.iter().collect::<Vec<_>>()).unwrap_err();
        assert!(
            e.message.contains("add up to 2 but there are 3 values"),
            "{}",
            e.message
        );
        let e = w2
            .write(
                &["s".to_string()],
                &[&Tensor::from_vec(&[1], vec![vec![0xffu8]]).unwrap()],
            )
            .unwrap_err();
        assert!(e.message.contains("has the columns"), "{}", e.message);
        let w3 = ParquetWriter::new(&s.path("s.parquet"), "snappy", 10, false).unwrap();
        let e = w3
            .write(
                &["s".to_string()],
                &[&Tensor::from_vec(&[1], vec![vec![0xffu8]]).unwrap()],
            )
            .unwrap_err();
        assert!(
            e.message.contains("column 's'") && e.message.contains("not UTF-8"),
            "{}",
            e.message
        );
        // Nothing was buffered by the failed writes.
        w.close().unwrap();
        let r = ParquetReader::open(std::slice::from_ref(&p), &[], 10).unwrap();
        assert_eq!(ids(&r.read_batch(10).unwrap()[0]), vec![1, 2]);
        // A writer that never learnt its columns cannot make a file; one
        // dropped unclosed leaves nothing behind.
        let w4 = ParquetWriter::new(&s.path("none.parquet"), "snappy", 10, false).unwrap();
        assert!(w4
            .close()
            .unwrap_err()
            .message
            .contains("columns were never given"));
        drop(w2);
        drop(w3);
        let left: Vec<_> = fs::read_dir(&s.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(left.iter().all(|n| !n.contains(".tmp-")), "{left:?}");
        assert!(!Path::new(&s.path("l.parquet")).exists());
    }

    #[test]
    fn writer_ops_write_a_schema_even_with_no_records() {
        let s = Scratch::new();
        let p = s.path("empty.parquet");
        let ws = Workspace::new();
        run(
            &ws,
            op(
                "CreateParquetWriter",
                &[],
                &["w"],
                vec![str_arg("path", &p)],
            ),
        )
        .unwrap();
        let schema = vec![
            strs_arg("fields", &["k", "l:lengths", "l:values"]),
            ints_arg("dtypes", &[10, 2, 1]),
        ];
        run(
            &ws,
            op("SetParquetWriterSchema", &["w"], &[], schema.clone()),
        )
        .unwrap();
        run(&ws, op("SetParquetWriterSchema", &["w"], &[], schema)).unwrap();
        let e = run(
            &ws,
            op(
                "SetParquetWriterSchema",
                &["w"],
                &[],
                vec![strs_arg("fields", &["k"]), ints_arg("dtypes", &[2])],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        run(&ws, op("CloseParquetWriter", &["w"], &[], vec![])).unwrap();
        let r = ParquetReader::open(&[p], &[], 10).unwrap();
        assert_eq!(
            r.columns(),
            vec![
                ("k".into(), DataType::Int64, false),
                ("l".into(), DataType::Float, true)
            ]
        );
        assert_eq!(r.total_records(), 0);

        let p = s.path("ops.parquet");
        run(
            &ws,
            op(
                "CreateParquetWriter",
                &[],
                &["w2"],
                vec![str_arg("path", &p), str_arg("compression", "gzip")],
            ),
        )
        .unwrap();
        ws.feed(
            "k",
            BlobValue::Tensor(Tensor::from_vec(&[2], vec![7i64, 8]).unwrap()),
        );
        run(
            &ws,
            op(
                "WriteParquetBatch",
                &["w2", "k"],
                &[],
                vec![strs_arg("fields", &["key"])],
            ),
        )
        .unwrap();
        let e = run(
            &ws,
            op(
                "WriteParquetBatch",
                &["w2", "k"],
                &[],
                vec![strs_arg("fields", &[])],
            ),
        )
        .unwrap_err();
        assert!(e.message.contains("1 inputs, 0 names"), "{}", e.message);
        run(&ws, op("CloseParquetWriter", &["w2"], &[], vec![])).unwrap();
        let r = ParquetReader::open(&[p], &[], 10).unwrap();
        assert_eq!(ids(&r.read_batch(10).unwrap()[0]), vec![7, 8]);
    }

    // ------------------------------------------------------------ npy --

    /// A .npy file (format 1.0) from a descr, shape and raw data.
    fn npy(path: &str, descr: &str, shape: &[usize], data: &[u8]) {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape = if shape.len() == 1 {
            format!("({},)", dims[0])
        } else {
            format!("({})", dims.join(", "))
        };
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(data);
        fs::write(path, b).unwrap();
    }

    fn le<T: Copy, const W: usize>(v: &[T], f: fn(T) -> [u8; W]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }

    #[test]
    fn npy_files_read_as_columns_of_rows() {
        let s = Scratch::new();
        let a = s.path("a.npy");
        let b = s.path("b.npy");
        let c = s.path("c.npy");
        let d = s.path("d.npy");
        let e = s.path("e.npy");
        npy(
            &a,
            "<f4",
            &[5, 2],
            &le(
                &(0..10).map(|i| i as f32).collect::<Vec<_>>(),
                f32::to_le_bytes,
            ),
        );
        npy(
            &b,
            ">i8",
            &[5],
            &le(&[10i64, 11, 12, 13, 14], i64::to_be_bytes),
        );
        npy(&c, "|S3", &[5], b"ab\0xyzq\0\0\0\0\0k\0\0");
        npy(
            &d,
            "<U2",
            &[5],
            &le(
                &[0x48u32, 0xe9, 0x1f600, 0, 0, 0, 0x61, 0, 0x62, 0x63],
                u32::to_le_bytes,
            ),
        );
        npy(&e, "|b1", &[5], &[1, 0, 1, 1, 0]);
        let paths: Vec<String> = [&a, &b, &c, &d, &e].iter().map(|s| s.to_string()).collect();
        let r = NpyReader::open(&paths, 2).unwrap();
        let t = r.read_batch(2).unwrap();
        assert_eq!(
            t[0],
            Tensor::from_vec(&[2, 2], vec![0f32, 1., 2., 3.]).unwrap()
        );
        assert_eq!(t[1], Tensor::from_vec(&[2], vec![10i64, 11]).unwrap());
        assert_eq!(
            t[2],
            Tensor::from_vec(&[2], vec![b"ab".to_vec(), b"xyz".to_vec()]).unwrap()
        );
        assert_eq!(
            t[3],
            Tensor::from_vec(
                &[2],
                vec!["Hé".as_bytes().to_vec(), "😀".as_bytes().to_vec()]
            )
            .unwrap()
        );
        assert_eq!(t[4], Tensor::from_vec(&[2], vec![true, false]).unwrap());
        let t = r.read_batch(2).unwrap();
        assert_eq!(
            t[2],
            Tensor::from_vec(&[2], vec![b"q".to_vec(), b"".to_vec()]).unwrap()
        );
        assert_eq!(
            t[3],
            Tensor::from_vec(&[2], vec![b"".to_vec(), b"a".to_vec()]).unwrap()
        );

        // Save mid-way, restore, continue.
        let bytes = crate::storage::serialize_blob("r", &BlobValue::Object(Arc::new(r))).unwrap();
        let back = crate::storage::deserialize_blob(&bytes)
            .unwrap()
            .object::<NpyReader>("NpyReader")
            .unwrap();
        assert_eq!(back.position(), 4);
        let t = back.read_batch(2).unwrap();
        assert_eq!(t[0], Tensor::from_vec(&[1, 2], vec![8f32, 9.]).unwrap());
        assert_eq!(t[3], Tensor::from_vec(&[1], vec![b"bc".to_vec()]).unwrap());
        let t = back.read_batch(2).unwrap();
        assert_eq!(t[0].shape(), &[0, 2]);
        assert_eq!(t[1].shape(), &[0]);
        back.reset();
        assert_eq!(back.read_batch(10).unwrap()[1].shape(), &[5]);
    }

    #[test]
    fn npy_threads_get_every_row_once() {
        let s = Scratch::new();
        let a = s.path("a.npy");
        npy(
            &a,
            "<i4",
            &[1000],
            &le(&(0..1000).collect::<Vec<i32>>(), i32::to_le_bytes),
        );
        let r = NpyReader::open(&[a], 7).unwrap();
        let mut got: Vec<i32> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let t = r.read_batch(7).unwrap();
                            if t[0].shape()[0] == 0 {
                                return mine;
                            }
                            mine.extend(t[0].array::<i32>().unwrap().iter().copied());
                        }
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        got.sort_unstable();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_failed_npy_read_loses_no_rows() {
        let s = Scratch::new();
        let p = s.path("rows.npy");
        let all: Vec<i32> = (0..6).collect();
        let whole = || npy(&p, "<i4", &[6], &le(&all, i32::to_le_bytes));
        whole();
        let r = NpyReader::open(std::slice::from_ref(&p), 2).unwrap();
        let rows = |t: &[Tensor]| {
            t[0].array::<i32>()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>()
        };
        assert_eq!(rows(&r.read_batch(2).unwrap()), vec![0, 1]);
        // The file is cut short (as by a copy in progress): the read fails.
        let bytes = fs::read(&p).unwrap();
        fs::write(&p, &bytes[..bytes.len() - 12]).unwrap();
        let e = r.read_batch(2).unwrap_err();
        assert!(e.message.contains(&p), "{}", e.message);
        assert_eq!(r.position(), 2);
        // Whole again: the next read hands out rows 2 and 3, not 4 and 5.
        whole();
        assert_eq!(rows(&r.read_batch(2).unwrap()), vec![2, 3]);
        assert_eq!(rows(&r.read_batch(2).unwrap()), vec![4, 5]);
        assert_eq!(r.read_batch(2).unwrap()[0].shape(), &[0]);
    }

    #[test]
    fn bad_npy_files_name_the_file() {
        let s = Scratch::new();
        let good = s.path("good.npy");
        npy(&good, "<i4", &[3], &le(&[1i32, 2, 3], i32::to_le_bytes));
        type Make = Box<dyn Fn(&str)>;
        let cases: Vec<(&str, Make, &str)> = vec![
            ("missing.npy", Box::new(|_: &str| {}), "No such file"),
            (
                "magic.npy",
                Box::new(|p: &str| fs::write(p, b"PK\x03\x04 not numpy").unwrap()),
                "bad magic",
            ),
            (
                "short.npy",
                Box::new(|p: &str| npy(p, "<i4", &[3], &[0u8; 8])),
                "truncated or corrupt",
            ),
            (
                "obj.npy",
                Box::new(|p: &str| npy(p, "|O", &[1], &[0u8; 8])),
                "object arrays",
            ),
            (
                "u4.npy",
                Box::new(|p: &str| npy(p, "<u4", &[1], &[0u8; 4])),
                "'<u4' is not supported",
            ),
            (
                "f2.npy",
                Box::new(|p: &str| npy(p, "<f2", &[1], &[0u8; 2])),
                "'<f2' is not supported",
            ),
            (
                "scalar.npy",
                Box::new(|p: &str| npy(p, "<i4", &[], &[0u8; 4])),
                "0-dimensional",
            ),
            (
                "empty.npy",
                Box::new(|p: &str| fs::write(p, b"").unwrap()),
                "bad magic",
            ),
            // 4 * n wraps to 0 in 64 bits: a zero-size item, and a panic
            // on the first read, before sizes were checked.
            (
                "u_wraps.npy",
                Box::new(|p: &str| npy(p, "<U4611686018427387904", &[1], &[])),
                "too large",
            ),
            // 4 * n = 2**31: over numpy's limit of 2**31 - 1 bytes.
            (
                "u_big.npy",
                Box::new(|p: &str| npy(p, "<U536870912", &[1], &[])),
                "too large",
            ),
            (
                "s_huge.npy",
                Box::new(|p: &str| npy(p, "|S99999999999999999999999", &[1], &[])),
                "too large",
            ),
        ];
        for (name, make, want) in cases {
            let p = s.path(name);
            make(&p);
            let e = NpyReader::open(std::slice::from_ref(&p), 2).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Io, "{name}");
            assert!(
                e.message.contains(&p) && e.message.contains(want),
                "{name}: {}",
                e.message
            );
        }
        let other = s.path("four.npy");
        npy(&other, "<i4", &[4], &[0u8; 16]);
        let e = NpyReader::open(&[good.clone(), other.clone()], 2).unwrap_err();
        assert!(
            e.message.contains("same number of rows") && e.message.contains(&other),
            "{}",
            e.message
        );

        let ws = Workspace::new();
        run(
            &ws,
            op(
                "CreateNpyReader",
                &[],
                &["r"],
                vec![strs_arg("paths", &[&good]), int_arg("batch_size", 2)],
            ),
        )
        .unwrap();
        run(&ws, op("ReadNpyBatch", &["r"], &["x"], vec![])).unwrap();
        assert_eq!(
            get(&ws, "x"),
            Tensor::from_vec(&[2], vec![1i32, 2]).unwrap()
        );
        // The file shrinks under a reader: the read fails, naming it.
        npy(&good, "<i4", &[1], &[0u8; 4]);
        let e = run(&ws, op("ReadNpyBatch", &["r"], &["x"], vec![])).unwrap_err();
        assert!(e.message.contains(&good), "{}", e.message);
        run(&ws, op("ResetNpyReader", &["r"], &[], vec![])).unwrap();
        let e = run(&ws, op("ReadNpyBatch", &["r"], &["x", "y"], vec![])).unwrap_err();
        assert!(
            e.message.contains("needs 1 outputs, got 2"),
            "{}",
            e.message
        );
    }
}
