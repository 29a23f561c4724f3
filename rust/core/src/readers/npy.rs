//! `.npy` arrays as a [`BatchSource`].
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

use super::{
    batch_size_arg, io_err, open_regular, paths_arg, BatchSource, Dec, Enc, OutputDesc, SourceOps,
    Spare, DEFAULT_BATCH_SIZE,
};
use crate::arg;
use crate::blob::BlobObject;
use crate::error::{Error, Result};
use crate::ir::BlobProto;
use crate::operator::OpDefCtx;
use crate::tensor::{collect_array, try_vec, DataType, Tensor};
use parking_lot::Mutex;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The type tag of a saved [`NpyReader`].
pub const NPY_READER_TAG: &str = "ferrocaffe::NpyReader";

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
    fn dtype(self) -> DataType {
        match self {
            NpyKind::Bool => DataType::Bool,
            NpyKind::I8 => DataType::Int8,
            NpyKind::U8 => DataType::Uint8,
            NpyKind::I16 => DataType::Int16,
            NpyKind::U16 => DataType::Uint16,
            NpyKind::I32 => DataType::Int32,
            NpyKind::I64 => DataType::Int64,
            NpyKind::F32 => DataType::Float,
            NpyKind::F64 => DataType::Double,
            NpyKind::Bytes(_) | NpyKind::Unicode(_) => DataType::String,
        }
    }
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
        Self::KIND
    }
    fn serialize(&self) -> Option<BlobProto> {
        Some(self.saved())
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
}

impl BatchSource for NpyReader {
    const KIND: &'static str = "NpyReader";
    const WHAT: &'static str = ".npy reader";
    const TAG: &'static str = NPY_READER_TAG;
    const OPS: SourceOps = SourceOps {
        create: "CreateNpyReader",
        create_args: &[
            arg!("path", "string", "\"\"", "a first .npy file (the first column), before those of `paths`"),
            arg!("paths", "strings", "[]", "the .npy files, one per column; row i of each is record i"),
            arg!("batch_size", "int", "1024", "records per batch, >= 1"),
        ],
        create_doc: "Reads the .npy headers, checks the files agree on the number of records and writes a reader.",
        read: "ReadNpyBatch",
        read_doc: "Input a .npy reader, outputs one tensor per file: the next batch_size rows (shape [rows, ...]), \
                   empty at the end. Thread safe: each record is handed out exactly once.",
        reset: "ResetNpyReader",
        reset_doc: "Moves a .npy reader back to the first record.",
    };

    /// The files and the batch size.
    type Config = (Vec<String>, usize);

    fn config(ctx: &OpDefCtx<'_>) -> Result<Self::Config> {
        let paths = paths_arg(ctx)?;
        if paths.is_empty() {
            return Err(
                ctx.bad_arg("a .npy reader needs at least one file (argument 'paths' or 'path')")
            );
        }
        let batch = batch_size_arg(ctx, DEFAULT_BATCH_SIZE, 1)?;
        Ok((paths, batch))
    }

    fn open(config: &Self::Config) -> Result<Self> {
        NpyReader::open(&config.0, config.1)
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn num_outputs(&self) -> usize {
        self.files.len()
    }

    /// One per file, named by its path.
    fn outputs(&self) -> Vec<OutputDesc> {
        self.files
            .iter()
            .map(|f| OutputDesc {
                name: f.path.clone(),
                dtype: f.kind.dtype(),
            })
            .collect()
    }

    fn total_records(&self) -> u64 {
        self.rows
    }

    fn position(&self) -> u64 {
        *self.pos.lock()
    }

    fn reset(&self) {
        *self.pos.lock() = 0;
    }

    /// Reads fresh buffers (rows are read straight from the file).
    fn read_into(&self, n: usize, _spare: &mut Spare) -> Result<Vec<Tensor>> {
        self.read_batch(n)
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

    fn from_bytes(bytes: &[u8]) -> Result<NpyReader> {
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
