//! Text file readers: CreateTextFileReader and TextFileReaderRead (Caffe2's
//! `text_file_reader.cc`, behind `text_file_reader.TextFileReader`).
//!
//! A file of rows separated by `\n`, fields separated by `\t`; a backslash
//! escapes the next byte (so a field can hold a tab or newline). Each field
//! is parsed as its column's dtype (`field_types`: STRING keeps the bytes,
//! numbers are parsed as decimal text). A read takes up to `batch_size`
//! rows into one 1-D tensor per column; after the last row of the last of
//! `num_passes` passes every read gives empty tensors.
//!
//! Differences from Caffe2: a row with the wrong number of fields, or a
//! field that does not parse as its dtype, is a typed error naming the
//! file, row and column (Caffe2 enforced or read garbage); the file must be
//! a regular file (`storage::open_regular`); the whole file is read when
//! the reader is created.

use super::kit::kernel;
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, Result};
use crate::operator::{OpDefCtx, OpSchema, Operator};
use crate::tensor::{DataType, Tensor};
use parking_lot::Mutex;
use std::io::Read;
use std::sync::Arc;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateTextFileReader", create)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[
                arg!("filename", "string", "(required)", "the file to read"),
                arg!("num_passes", "int", "1", "how many times to read the file, >= 1"),
                arg!(
                    "field_types",
                    "ints",
                    "(required)",
                    "the TensorProto.DataType of each column: STRING, FLOAT, DOUBLE, INT32, INT64"
                ),
            ])
            .doc("Makes a reader of a tab-separated text file (one row per line) in the output."),
        OpSchema::new("TextFileReaderRead", read)
            .inputs(1, 1)
            .outputs(1, crate::operator::MANY)
            .args(&[arg!("batch_size", "int", "1", "the most rows a read takes, >= 1")])
            .doc(
                "Reads up to batch_size rows: one 1-D tensor per column (one output per field type). Empty tensors once \
                 every pass is done.",
            ),
    ]
}

/// Splits `data` into rows of fields, honouring backslash escapes.
fn parse_rows(data: &[u8]) -> Vec<Vec<Vec<u8>>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = Vec::new();
    let mut escaped = false;
    for &b in data {
        if escaped {
            field.push(b);
            escaped = false;
            continue;
        }
        match b {
            b'\\' => escaped = true,
            b'\t' => row.push(std::mem::take(&mut field)),
            b'\n' => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            _ => field.push(b),
        }
    }
    if !field.is_empty() || !row.is_empty() {
        row.push(field);
        rows.push(row);
    }
    rows
}

struct Position {
    pass: usize,
    row: usize,
}

/// A reader: the parsed rows, the column dtypes and where the next read
/// starts.
pub struct TextFileReader {
    path: String,
    rows: Vec<Vec<Vec<u8>>>,
    types: Vec<DataType>,
    num_passes: usize,
    at: Mutex<Position>,
}

impl std::fmt::Debug for TextFileReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TextFileReader({:?})", self.path)
    }
}

impl BlobObject for TextFileReader {
    fn kind_name(&self) -> &'static str {
        "TextFileReaderInstance"
    }
}

const TYPES: &[DataType] = &[
    DataType::String,
    DataType::Float,
    DataType::Double,
    DataType::Int32,
    DataType::Int64,
];

fn create(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let path = ctx.args.string("filename", "")?;
    if path.is_empty() {
        return Err(ctx.bad_arg("CreateTextFileReader requires the argument 'filename'"));
    }
    let num_passes = ctx.args.i64("num_passes", 1)?;
    let num_passes = usize::try_from(num_passes)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| ctx.bad_arg(format!("num_passes must be >= 1, got {num_passes}")))?;
    let codes = ctx.args.ints("field_types")?.unwrap_or_default();
    if codes.is_empty() {
        return Err(ctx
            .bad_arg("CreateTextFileReader requires the argument 'field_types' (one per column)"));
    }
    let types = codes
        .iter()
        .map(|&c| {
            i32::try_from(c)
                .ok()
                .and_then(DataType::from_i32)
                .filter(|d| TYPES.contains(d))
                .ok_or_else(|| {
                    ctx.bad_arg(format!(
                        "field type {c} is not supported by the text file reader (STRING, FLOAT, DOUBLE, INT32, INT64)"
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(kernel(move |cx| {
        let mut data = Vec::new();
        crate::storage::open_regular(&path)
            .and_then(|(mut f, _)| f.read_to_end(&mut data))
            .map_err(|e| Error::io(&e, &path))?;
        let rows = parse_rows(&data);
        for (r, row) in rows.iter().enumerate() {
            if row.len() != types.len() {
                return Err(Error::invalid_arg(format!(
                    "'{path}' row {}: {} fields, but field_types gives {} columns",
                    r + 1,
                    row.len(),
                    types.len()
                ))
                .with_file(&path));
            }
        }
        let reader: Arc<dyn BlobObject> = Arc::new(TextFileReader {
            path: path.clone(),
            rows,
            types: types.clone(),
            num_passes,
            at: Mutex::new(Position { pass: 0, row: 0 }),
        });
        *cx.output_blob(0).write() = BlobValue::Object(reader);
        Ok(true)
    }))
}

fn parse_column(r: &TextFileReader, picked: &[usize], col: usize) -> Result<Tensor> {
    let n = picked.len();
    let bad = |row: usize, what: &str| {
        Error::invalid_arg(format!(
            "'{}' row {}, column {}: cannot parse {:?} as {what}",
            r.path,
            row + 1,
            col + 1,
            String::from_utf8_lossy(&r.rows[row][col])
        ))
        .with_file(&r.path)
    };
    fn num<T: std::str::FromStr>(s: &[u8]) -> Option<T> {
        std::str::from_utf8(s).ok()?.trim().parse().ok()
    }
    Ok(match r.types[col] {
        DataType::String => Tensor::from_vec(
            &[n],
            picked.iter().map(|&i| r.rows[i][col].clone()).collect(),
        )?,
        DataType::Float => Tensor::from_vec(
            &[n],
            picked
                .iter()
                .map(|&i| num::<f32>(&r.rows[i][col]).ok_or_else(|| bad(i, "float32")))
                .collect::<Result<Vec<_>>>()?,
        )?,
        DataType::Double => Tensor::from_vec(
            &[n],
            picked
                .iter()
                .map(|&i| num::<f64>(&r.rows[i][col]).ok_or_else(|| bad(i, "float64")))
                .collect::<Result<Vec<_>>>()?,
        )?,
        DataType::Int32 => Tensor::from_vec(
            &[n],
            picked
                .iter()
                .map(|&i| num::<i32>(&r.rows[i][col]).ok_or_else(|| bad(i, "int32")))
                .collect::<Result<Vec<_>>>()?,
        )?,
        _ => Tensor::from_vec(
            &[n],
            picked
                .iter()
                .map(|&i| num::<i64>(&r.rows[i][col]).ok_or_else(|| bad(i, "int64")))
                .collect::<Result<Vec<_>>>()?,
        )?,
    })
}

fn read(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch = ctx.args.i64("batch_size", 1)?;
    let batch = usize::try_from(batch)
        .ok()
        .filter(|&b| b >= 1)
        .ok_or_else(|| ctx.bad_arg(format!("batch_size must be >= 1, got {batch}")))?;
    Ok(kernel(move |cx| {
        let r = cx
            .input_blob(0)
            .read()
            .object::<TextFileReader>("TextFileReaderInstance")
            .map_err(|e| e.with_blob(&cx.io.input_names[0]))?;
        if cx.io.outputs.len() != r.types.len() {
            return Err(Error::invalid_arg(format!(
                "the reader has {} columns, but the op has {} outputs",
                r.types.len(),
                cx.io.outputs.len()
            ))
            .with_blob(&cx.io.input_names[0]));
        }
        // The rows of this read, across pass boundaries; the position
        // moves only once the columns parsed.
        let mut at = r.at.lock();
        let (mut pass, mut row) = (at.pass, at.row);
        let mut picked = Vec::with_capacity(batch.min(r.rows.len().max(1)));
        while picked.len() < batch && pass < r.num_passes && !r.rows.is_empty() {
            picked.push(row);
            row += 1;
            if row == r.rows.len() {
                row = 0;
                pass += 1;
            }
        }
        let cols = (0..r.types.len())
            .map(|c| parse_column(&r, &picked, c))
            .collect::<Result<Vec<_>>>()?;
        *at = Position { pass, row };
        drop(at);
        let mut l = cx.lock();
        for (k, t) in cols.into_iter().enumerate() {
            l.set_output(k, t);
        }
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_on_tabs_and_newlines_with_escapes() {
        let rows = parse_rows(b"a\tb\\\tc\n1\t2\nlast\tx");
        assert_eq!(
            rows,
            vec![
                vec![b"a".to_vec(), b"b\tc".to_vec()],
                vec![b"1".to_vec(), b"2".to_vec()],
                vec![b"last".to_vec(), b"x".to_vec()],
            ]
        );
        assert!(parse_rows(b"").is_empty());
    }
}
