//! Readers of data files on disk, streamed in batches of records, and the
//! Parquet writer. They stand where Caffe2's examples used a Hive reader.
//!
//! A reader is a [`BatchSource`]: a blob object that hands out the next
//! batch of records (atomically: threads sharing a reader get distinct
//! records, each exactly once), moves back to the first record, and saves
//! and restores its position with checkpoints. Its three ops (create, read,
//! reset) are built once here, generic over the trait ([`source_schemas`]);
//! each source says only how it opens, reads and saves. Sources:
//!
//! - [`parquet`]: Parquet files or folders of them (`CreateParquetReader`,
//!   `ReadParquetBatch`, `ResetParquetReader`, and `ParquetSchema`);
//! - [`npy`]: `.npy` arrays, one per column (`CreateNpyReader`,
//!   `ReadNpyBatch`, `ResetNpyReader`).
//!
//! [`writer`] holds the Parquet writer (`CreateParquetWriter`,
//! `SetParquetWriterSchema`, `WriteParquetBatch`, `CloseParquetWriter`).
//!
//! A new reader is a [`BatchSource`] in a file of its own here, listed once
//! in [`schemas`] and [`codecs`].
//!
//! Errors: a missing or unreadable file is an `Io` error and so is a corrupt
//! one (not a Parquet or .npy file, truncated, a page that fails to decode
//! or whose CRC-32, when the writer stored one, does not match its bytes);
//! a column of the wrong type is a `Type` error. All name the file (and the
//! column); a reader that failed keeps its position, and the next read tries
//! again from there.

use crate::blob::{BlobObject, BlobValue};
use crate::error::{from_panic, Error, ErrorKind, Result};
use crate::ir::BlobProto;
use crate::operator::{ArgDoc, OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::ops::kit::kernel;
use crate::tensor::{DataType, Tensor};
use std::fmt;
use std::fs::File;
use std::sync::Arc;

pub mod npy;
pub mod parquet;
pub mod writer;

#[cfg(test)]
mod tests;

pub use npy::{NpyReader, NPY_READER_TAG};
pub use parquet::{ParquetReader, PARQUET_READER_TAG};
pub use writer::ParquetWriter;

/// Records per batch when no `batch_size` is given.
pub const DEFAULT_BATCH_SIZE: i64 = 1024;

/// The ops of the readers and the writer (the operator registry gets them
/// through `crate::builtins`).
pub fn schemas() -> Vec<OpSchema> {
    let mut v = source_schemas::<ParquetReader>();
    v.extend(parquet::schemas());
    v.extend(writer::schemas());
    v.extend(source_schemas::<NpyReader>());
    v
}

/// The codecs of saved readers (their position goes with checkpoints).
pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    vec![
        (ParquetReader::TAG, decode::<ParquetReader>),
        (NpyReader::TAG, decode::<NpyReader>),
    ]
}

// ------------------------------------------------------------ the trait --

/// By output index, the string buffers of a batch the read op replaced
/// (`None` where the output held no strings), for a source to write the next
/// batch over instead of allocating (see [`BatchSource::read_into`]).
pub type Spare = Vec<Option<Vec<Vec<u8>>>>;

/// One output of a batch: its name and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputDesc {
    pub name: String,
    pub dtype: DataType,
}

/// The names and docs of a source's create, read and reset ops.
pub struct SourceOps {
    pub create: &'static str,
    pub create_args: &'static [ArgDoc],
    pub create_doc: &'static str,
    pub read: &'static str,
    pub read_doc: &'static str,
    pub reset: &'static str,
    pub reset_doc: &'static str,
}

/// A reader of records in batches (see the module doc). Implementations
/// keep their position behind a lock: every method takes `&self`, and
/// [`read_into`](Self::read_into) is atomic.
pub trait BatchSource: BlobObject + Sized {
    /// Its blob kind, as a wrong-kind error names it ("ParquetReader").
    const KIND: &'static str;
    /// What errors call it ("Parquet reader").
    const WHAT: &'static str;
    /// The type tag of a saved source.
    const TAG: &'static str;
    /// Its ops.
    const OPS: SourceOps;
    /// Whether [`read_into`](Self::read_into) reuses spare string buffers
    /// (the read op keeps none for a source that does not).
    const REUSES_SPARE: bool = false;

    /// What the create op's arguments say, checked when the op is created.
    type Config: Send + 'static;
    /// Reads the create op's arguments (errors name the op and argument).
    fn config(ctx: &OpDefCtx<'_>) -> Result<Self::Config>;
    /// Opens a source at its first record (when the create op runs).
    fn open(config: &Self::Config) -> Result<Self>;

    /// Records per batch when the read op gives no `batch_size`.
    fn batch_size(&self) -> usize;
    /// Tensors per batch: the read op's outputs.
    fn num_outputs(&self) -> usize;
    /// Each output's name and dtype, in order.
    fn outputs(&self) -> Vec<OutputDesc>;
    /// Records in all.
    fn total_records(&self) -> u64;
    /// Records handed out so far.
    fn position(&self) -> u64;
    /// Moves back to the first record.
    fn reset(&self);
    /// The next batch of up to `n` records (every tensor empty at the end);
    /// atomic, and the position moves only if it succeeded. The source may
    /// take buffers from `spare` (by output) and write the batch over them.
    fn read_into(&self, n: usize, spare: &mut Spare) -> Result<Vec<Tensor>>;

    /// The saved form: what the source reads and its position.
    fn to_bytes(&self) -> Vec<u8>;
    /// Reopens a saved source at its saved position (checking that the
    /// files still hold what they held).
    fn from_bytes(bytes: &[u8]) -> Result<Self>;

    /// The saved blob (for `BlobObject::serialize`).
    fn saved(&self) -> BlobProto {
        BlobProto {
            r#type: Some(Self::TAG.to_string()),
            content: Some(self.to_bytes()),
            ..Default::default()
        }
    }
}

fn decode<S: BatchSource>(p: &BlobProto) -> Result<BlobValue> {
    let r = S::from_bytes(p.content.as_deref().unwrap_or_default())?;
    Ok(BlobValue::Object(Arc::new(r)))
}

// --------------------------------------------------- the ops, written once --

/// The create, read and reset ops of a source.
pub fn source_schemas<S: BatchSource>() -> Vec<OpSchema> {
    let ops = S::OPS;
    vec![
        OpSchema::new(ops.create, create_op::<S>)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(ops.create_args)
            .doc(ops.create_doc),
        OpSchema::new(ops.read, read_op::<S>)
            .inputs(1, 1)
            .outputs(1, MANY)
            .args(&[crate::arg!(
                "batch_size",
                "int",
                "0",
                "records to read; 0: the reader's batch_size"
            )])
            .doc(ops.read_doc),
        OpSchema::new(ops.reset, reset_op::<S>)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc(ops.reset_doc),
    ]
}

fn create_op<S: BatchSource>(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let config = S::config(ctx)?;
    Ok(kernel(move |cx| {
        let r = S::open(&config)?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(r)));
        Ok(true)
    }))
}

fn read_op<S: BatchSource>(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = batch_size_arg(ctx, 0, 0)?;
    // By output: the string buffers of the batch before the last one.
    let mut spare: Spare = Vec::new();
    Ok(kernel(move |cx| {
        let r = object_input::<S>(cx, S::KIND)?;
        check_outputs(cx, r.num_outputs(), S::WHAT)?;
        let n = if batch == 0 { r.batch_size() } else { batch };
        let tensors = r.read_into(n, &mut spare)?;
        // The string tensors the new batch replaces become the spare
        // buffers of the next read, so that steady reading allocates
        // nothing per string; a failed read leaves the outputs as they were.
        spare.clear();
        for (j, t) in tensors.into_iter().enumerate() {
            let old = std::mem::replace(&mut *cx.output_blob(j).write(), BlobValue::Tensor(t));
            if S::REUSES_SPARE {
                spare.push(match old {
                    // Only a buffer nothing else holds can be reused.
                    BlobValue::Tensor(Tensor::Str(a)) => std::sync::Arc::try_unwrap(a)
                        .ok()
                        .map(|a| a.into_raw_vec_and_offset().0),
                    _ => None,
                });
            }
        }
        Ok(true)
    }))
}

fn reset_op<S: BatchSource>(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        object_input::<S>(cx, S::KIND)?.reset();
        Ok(true)
    }))
}

/// The reader or writer object in input 0.
fn object_input<T: BlobObject>(cx: &OpCx<'_>, kind: &str) -> Result<Arc<T>> {
    cx.input_blob(0)
        .read()
        .object::<T>(kind)
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
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

// --------------------------------------------------------------- errors --

fn io_err(path: &str, msg: impl fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("{msg}")).with_file(path)
}

fn open_err(path: &str, what: &str, e: &std::io::Error) -> Error {
    io_err(path, format!("cannot open {what} '{path}': {e}"))
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    from_panic(p).into_message()
}

/// Opens a regular file (a FIFO or device would block or never end; see
/// `storage::open_regular`).
fn open_regular(path: &str, what: &str) -> Result<(File, u64)> {
    let (f, meta) = crate::storage::open_regular(path).map_err(|e| open_err(path, what, &e))?;
    Ok((f, meta.len()))
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
