//! The Parquet writer.
//!
//! A [`ParquetWriter`] blob writes records to a new Parquet file: each field
//! a column (`a:b` is a column `b` in a group `a`, `x:lengths` + `x:values`
//! a LIST column `x`), required (no nulls), strings as UTF-8 STRING (or
//! BINARY). Records are buffered into row groups; the file is written to a
//! temporary beside its path and renamed into place on close, so a file
//! that exists is complete. Writes are atomic (a mutex), so pipeline
//! threads can share a writer.

use super::io_err;
use super::object_input;
use super::parquet::{describe, Values};
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::operator::{OpDefCtx, OpSchema, Operator, MANY};
use crate::ops::kit::kernel;
use crate::storage;
use crate::tensor::{DataType, Tensor};
use parking_lot::Mutex;
use parquet::basic::{Compression, LogicalType, Repetition, Type as PhysicalType};
use parquet::data_type::{BoolType, ByteArrayType, DoubleType, FloatType, Int32Type, Int64Type};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type as SchemaType;
use std::fmt;
use std::fs::{self, File};
use std::path::Path;
use std::sync::Arc;

/// The writer's ops.
pub fn schemas() -> Vec<OpSchema> {
    vec![
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
    ]
}

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

// ------------------------------------------------------------------- ops --

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
