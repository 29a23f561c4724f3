//! Parquet files (or folders of them) as a [`BatchSource`].
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

use super::{
    batch_size_arg, io_err, open_err, open_regular, panic_text, paths_arg, BatchSource, Dec, Enc,
    OutputDesc, SourceOps, Spare, DEFAULT_BATCH_SIZE,
};
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::BlobProto;
use crate::operator::{ArgDoc, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::kernel;
use crate::tensor::{try_vec, DataType, Tensor};
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
pub(super) struct PqFile {
    path: String,
    reader: SerializedFileReader<PosFile>,
    pub(super) rg_rows: Vec<u64>,
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

pub(super) fn describe(dtype: DataType, list: bool) -> String {
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

/// A column's values: one variant per number type and bool, named like
/// `Tensor`'s (so `with_match_dtype!(enum Values, ...)` dispatches over
/// it), and the byte strings of every other column.
pub(super) enum Values {
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
    pub(super) fn empty(dtype: DataType) -> Values {
        crate::with_match_dtype!(wrap Values, numeric_and_bool dtype, |T| Vec::<T>::new(),
            else _ => Values::Bytes(Vec::new()))
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
        crate::with_match_dtype!(enum Values, numeric_and_bool &mut values,
        |v: T| *v = try_vec(cap, what())?,
        else Values::Bytes(v) => match old {
            Some(o) => *v = o,
            None => *v = try_vec(cap, what())?,
        });
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
        out.push(
            crate::with_match_dtype!(enum Values, numeric_and_bool self.values,
            |v: T| Tensor::from_vec(&[v.len()], v)?,
            else Values::Bytes(mut v) => {
                v.truncate(self.strings);
                Tensor::from_vec(&[v.len()], v)?
            }),
        );
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
pub(super) fn copy_strings<B: AsRef<[u8]> + Sync>(
    src: &[B],
    dst: &mut Vec<Vec<u8>>,
    filled: &mut usize,
) {
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
    pub(super) files: Vec<PqFile>,
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
        Self::KIND
    }
    fn serialize(&self) -> Option<BlobProto> {
        Some(self.saved())
    }
}

const PQ_MAGIC: &[u8; 4] = b"FCPQ";

impl ParquetReader {
    /// Opens the files (every file under a folder) and resolves the columns.
    pub fn open(paths: &[String], columns: &[String], batch_size: usize) -> Result<ParquetReader> {
        Self::open_expecting(paths, columns, &[], batch_size)
    }

    pub(super) fn open_expecting(
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
}

impl BatchSource for ParquetReader {
    const KIND: &'static str = "ParquetReader";
    const WHAT: &'static str = "Parquet reader";
    const TAG: &'static str = PARQUET_READER_TAG;
    const OPS: SourceOps = SourceOps {
        create: "CreateParquetReader",
        create_args: &[
            PATH,
            PATHS,
            COLUMNS,
            arg!("batch_size", "int", "1024", "records per batch, >= 1"),
            DTYPES,
            IS_LIST,
        ],
        create_doc: "Opens the Parquet files (reading only their footers), checks that every file has the columns \
                     with the same types, and writes a reader positioned at the first record into the output.",
        read: "ReadParquetBatch",
        read_doc: "Input a Parquet reader, outputs one tensor per column (two for a list column: lengths, then \
                   values): the next batch_size records, or all that are left; every output is empty at the end. \
                   Thread safe: readers sharing a reader get distinct records, each exactly once.",
        reset: "ResetParquetReader",
        reset_doc: "Moves a Parquet reader back to the first record.",
    };
    const REUSES_SPARE: bool = true;

    /// Paths, columns, batch size, and what each column must be.
    type Config = (Vec<String>, Vec<String>, usize, Vec<Expect>);

    fn config(ctx: &OpDefCtx<'_>) -> Result<Self::Config> {
        let (paths, columns) = parquet_args(ctx)?;
        let batch = batch_size_arg(ctx, DEFAULT_BATCH_SIZE, 1)?;
        let expect = expect_args(ctx, &columns)?;
        Ok((paths, columns, batch, expect))
    }

    fn open(config: &Self::Config) -> Result<Self> {
        let (paths, columns, batch, expect) = config;
        ParquetReader::open_expecting(paths, columns, expect, *batch)
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// One per column, two per list.
    fn num_outputs(&self) -> usize {
        self.columns
            .iter()
            .map(|c| if c.list { 2 } else { 1 })
            .sum()
    }

    /// A column `c`, or a list column as `c:lengths` (int32) and `c:values`.
    fn outputs(&self) -> Vec<OutputDesc> {
        let mut v = Vec::with_capacity(self.num_outputs());
        for c in &self.columns {
            if c.list {
                v.push(OutputDesc {
                    name: format!("{}:lengths", c.name),
                    dtype: DataType::Int32,
                });
                v.push(OutputDesc {
                    name: format!("{}:values", c.name),
                    dtype: c.dtype,
                });
            } else {
                v.push(OutputDesc {
                    name: c.name.clone(),
                    dtype: c.dtype,
                });
            }
        }
        v
    }

    /// Records in all files.
    fn total_records(&self) -> u64 {
        self.total
    }

    fn position(&self) -> u64 {
        self.cursor.lock().pos
    }

    fn reset(&self) {
        let mut c = self.cursor.lock();
        c.pos = 0;
        c.open = None;
    }

    /// Each string column is written over the strings its values output
    /// held (`spare`, by output).
    fn read_into(&self, n: usize, spare: &mut Spare) -> Result<Vec<Tensor>> {
        let mut j = 0;
        let mut by_column = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            j += c.list as usize;
            by_column.push(spare.get_mut(j).and_then(Option::take));
            j += 1;
        }
        self.read_batch_reusing(n, by_column)
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

    fn from_bytes(bytes: &[u8]) -> Result<ParquetReader> {
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

// ------------------------------------------------------------------- ops --

const PATH: ArgDoc = arg!(
    "path",
    "string",
    "\"\"",
    "a Parquet file, or a folder read as every data file under it"
);
const PATHS: ArgDoc = arg!(
    "paths",
    "strings",
    "[]",
    "more files or folders, read after `path` in this order"
);
const COLUMNS: ArgDoc = arg!(
    "columns",
    "strings",
    "[] (every column)",
    "the columns to read, as dotted paths ('a.b' or 'a:b'); a list column by its name ('items')"
);
const DTYPES: ArgDoc = arg!(
    "dtypes",
    "ints",
    "[] (any)",
    "the expected Caffe2 dtype of each column (of the items, for a list); another type is an error"
);
const IS_LIST: ArgDoc = arg!(
    "is_list",
    "ints",
    "[] (any)",
    "whether each column is expected to be a list (1) or not (0)"
);

/// The ops of Parquet files besides the reader's own: `ParquetSchema`.
pub fn schemas() -> Vec<OpSchema> {
    vec![OpSchema::new("ParquetSchema", parquet_schema)
        .inputs(0, 0)
        .outputs(3, 3)
        .args(&[PATH, PATHS, COLUMNS, DTYPES, IS_LIST])
        .doc(
            "Outputs the columns a reader with these arguments would read: their names (string), Caffe2 dtypes \
             (int32) and whether each is a list (bool). Fails as CreateParquetReader would.",
        )]
}

/// What a column must be: its dtype and list-ness (`None`: anything).
pub type Expect = (Option<DataType>, Option<bool>);

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

/// `dtypes` and `is_list`: per column, what is expected.
fn expect_args(ctx: &OpDefCtx<'_>, columns: &[String]) -> Result<Vec<Expect>> {
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
