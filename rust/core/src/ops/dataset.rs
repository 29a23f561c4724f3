//! In-memory datasets: CreateTreeCursor, ReadNextBatch, ResetCursor,
//! GetCursorOffset, ComputeOffset, SortAndShuffle, ReadRandomBatch,
//! CheckDatasetConsistency, Append and AtomicAppend.
//!
//! A dataset is a list of columns (tensors), one per field, named in Caffe2's
//! schema convention: a field `"<prefix>:lengths"` defines a *domain*
//! `<prefix>` with, for each entry of its parent domain, that many entries;
//! every later field `"<prefix>:<rest>"` lives in that domain (the longest
//! matching prefix wins). Fields not under any lengths field are in the
//! top-level domain, whose entries are the records. Example:
//! `["label", "items:lengths", "items:values"]` holds records of a label and
//! a list of items; `items:values` has `sum(items:lengths)` rows.
//!
//! A [`TreeCursor`] keeps one offset per domain. Reading a batch advances the
//! offsets under the cursor's mutex, so several readers sharing a cursor each
//! get distinct batches and every record is handed out exactly once.
//!
//! Differences from Caffe2 (its behaviour is otherwise followed):
//! - bad input is an error, never an out-of-bounds read: lengths must be
//!   int32 and non-negative, offset matrices and index lists are
//!   bounds-checked, and 0-dim columns are rejected;
//! - SortAndShuffle sorts stably (ties keep their order; `std::sort` did
//!   not guarantee one). Its shuffles reproduce libstdc++'s `std::shuffle`
//!   with a default-seeded `std::default_random_engine`, as Caffe2 built with
//!   GCC did, so the same indices come out;
//! - SortAndShuffle no longer shrinks its `shuffle_size` for good when one
//!   run sees a small dataset (Caffe2 overwrote the op's member);
//! - AtomicAppend enforces in-place outputs (Caffe2 only checked them when
//!   the destination was non-empty), accepts a never-written destination as
//!   empty, and checks every field before appending any;
//! - ComputeOffset takes the cursor's mutex and leaves the cursor untouched if
//!   it fails.

use super::kit::kernel;
use crate::arg;
use crate::blob::{BlobMutex, BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{BlobProto, TensorProto};
use crate::operator::{InPlace, Locked, OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::tensor::{
    concatenate, prefault_for_write, try_vec, DataType, Spare, Tensor, LARGE_APPEND_CAPACITY,
};
use crate::with_array;
use ndarray::{Axis, Slice};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// The codecs of this family's saved objects.
pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    vec![(CAFFE2_CURSOR_TYPE, decode_cursor)]
}

pub fn schemas() -> Vec<OpSchema> {
    const FIELDS: crate::operator::ArgDoc = arg!(
        "fields",
        "strings",
        "[]",
        "the dataset's field names, e.g. [\"label\", \"items:lengths\", \"items:values\"]"
    );
    vec![
        OpSchema::new("CreateTreeCursor", create_tree_cursor)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(&[FIELDS])
            .doc(
                "Writes a new cursor over a dataset with the given fields into the output. A ':lengths' field must come \
                 before every field of the domain it defines.",
            ),
        OpSchema::new("ResetCursor", reset_cursor)
            .inputs(1, 1)
            .outputs(0, 0)
            .doc("Moves the cursor back to the start of the dataset. Thread safe."),
        OpSchema::new("GetCursorOffset", get_cursor_offset)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Outputs the cursor's offsets, one per domain (int32, 1-D; empty before the first read)."),
        OpSchema::new("ReadNextBatch", read_next_batch)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .args(&[
                arg!("batch_size", "int", "1", "records per batch, >= 0"),
                arg!(
                    "enforce_batch_size",
                    "bool",
                    "false",
                    "a last batch with fewer than batch_size records comes out empty"
                ),
            ])
            .doc(
                "Inputs (cursor, field_1..field_n), outputs batch_1..batch_n: the next batch_size records, each field \
                 sliced to the rows of those records (nested lists follow their ':lengths'). At the end, every output is \
                 empty (0 rows). Thread safe: readers sharing a cursor get distinct batches.",
            ),
        OpSchema::new("ComputeOffset", compute_offset)
            .inputs(1, MANY)
            .outputs(1, 1)
            .doc(
                "Inputs (cursor, field_1..field_n), output an int64 matrix of shape [records + 1, domains]: row k holds \
                 the offsets of record k in every domain (from the cursor's position, normally the start). Resets the \
                 cursor. Thread safe.",
            ),
        OpSchema::new("SortAndShuffle", sort_and_shuffle)
            .inputs(1, MANY)
            .outputs(1, 1)
            .args(&[
                arg!("sort_by_field_idx", "int", "1", "the top-level int32 field to sort records by; -1: no sort"),
                arg!("batch_size", "int", "1", "records per batch, >= 1"),
                arg!("shuffle_size", "int", "1", "batches per shuffled chunk, >= 1"),
            ])
            .doc(
                "Inputs (cursor, field_1..field_n), output int64 record indices: sorted by the field (stable), shuffled \
                 within chunks of batch_size * shuffle_size, then whole batches shuffled (Caffe2's deterministic \
                 libstdc++ order).",
            ),
        OpSchema::new("ReadRandomBatch", read_random_batch)
            .inputs(3, MANY)
            .outputs(1, MANY)
            .args(&[
                arg!("batch_size", "int", "1", "records per batch, >= 0"),
                arg!("enforce_batch_size", "bool", "false", "a last batch with fewer than batch_size records comes out empty"),
                arg!("loop_over", "bool", "false", "start over at the end instead of returning empty batches"),
            ])
            .doc(
                "Inputs (cursor, indices, offsets, field_1..field_n), outputs batch_1..batch_n: the records named by the \
                 next batch_size entries of `indices` (int64), located with the ComputeOffset matrix `offsets`. At the \
                 end the outputs are empty. Thread safe.",
            ),
        OpSchema::new("TrimDataset", trim_dataset)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Enforce(|i, o| i == o))
            .args(&[
                FIELDS,
                arg!("multiple_of", "int", "(required)", "keep the largest number of top-level records that is a multiple of this, >= 1"),
            ])
            .doc(
                "Shrinks the dataset's fields in place (outputs = inputs) to the first k top-level records, k the largest \
                 multiple of `multiple_of` not above the record count; nested fields keep the rows of those records.",
            ),
        OpSchema::new("CheckDatasetConsistency", check_dataset_consistency)
            .inputs(1, MANY)
            .outputs(0, 0)
            .args(&[
                FIELDS,
                arg!(
                    "dtypes",
                    "ints",
                    "[] (any)",
                    "the declared Caffe2 dtype of each field (0, UNDEFINED: any); another dtype is an error"
                ),
            ])
            .doc(
                "Fails unless the inputs form a consistent dataset under `fields`: each field has its declared dtype \
                 (if given), fields of one domain have the same number of rows, and each domain has exactly as many \
                 rows as its lengths add up to.",
            ),
        OpSchema::new("Append", append)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(|i, o| i == 0 && o == 0))
            .doc("Inputs (A, B), output A (in place): B's rows appended to A along dim 0. An empty A becomes a copy of B."),
        OpSchema::new("AtomicAppend", atomic_append)
            .inputs(3, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Enforce(|i, o| i == o + 1))
            .doc(
                "Inputs (mutex, dst_1..dst_n, src_1..src_n), outputs dst_1..dst_n (in place): under the mutex, each \
                 src appended to its dst along dim 0 (an empty dst becomes a copy of src). Every field is checked \
                 before any is appended.",
            ),
    ]
}

// ---------------------------------------------------------------- schema --

/// The domain structure of a list of field names (Caffe2's `TreeIterator`).
#[derive(Clone, Debug)]
struct TreeIterator {
    names: Vec<String>,
    /// Field ids of the `...:lengths` fields, in order: lengths field `j`
    /// defines domain `j + 1` (domain 0 is the top level).
    length_fields: Vec<usize>,
    /// For each field, its domain.
    domain: Vec<usize>,
}

impl TreeIterator {
    fn new(names: &[String]) -> Result<TreeIterator> {
        let parts: Vec<Vec<&str>> = names.iter().map(|n| n.split(':').collect()).collect();
        let length_fields: Vec<usize> = (0..names.len())
            .filter(|&i| parts[i].last() == Some(&"lengths"))
            .collect();
        let mut domain = vec![0; names.len()];
        for (id, field) in parts.iter().enumerate() {
            // The lengths field with the longest prefix of this field's name;
            // a one-part "lengths" field matches nothing.
            let mut best = 1;
            for (j, &lf) in length_fields.iter().enumerate() {
                let prefix = &parts[lf][..parts[lf].len() - 1];
                if lf != id && field.starts_with(prefix) && parts[lf].len() > best {
                    best = parts[lf].len();
                    domain[id] = j + 1;
                }
            }
        }
        for (id, &d) in domain.iter().enumerate() {
            if d > 0 && length_fields[d - 1] > id {
                let lf = length_fields[d - 1];
                return Err(Error::invalid_arg(format!(
                    "field {id} ('{}') depends on a field defined after it: field {lf} ('{}')",
                    names[id], names[lf]
                )));
            }
        }
        Ok(TreeIterator {
            names: names.to_vec(),
            length_fields,
            domain,
        })
    }

    fn num_fields(&self) -> usize {
        self.names.len()
    }

    fn num_domains(&self) -> usize {
        self.length_fields.len() + 1
    }

    /// Moves `offsets` forward by `num` top-level entries (fewer at the end),
    /// setting `sizes` to the rows taken in each domain. On error `offsets`
    /// is unchanged.
    fn advance(
        &self,
        cols: &Columns<'_>,
        offsets: &mut [i64],
        sizes: &mut [i64],
        num: i64,
    ) -> Result<()> {
        let n = self.num_domains();
        if offsets.len() != n {
            return Err(Error::invalid_arg(format!(
                "the cursor holds {} offsets but the dataset has {n} domains (was it used by ReadRandomBatch?)",
                offsets.len()
            )));
        }
        let limits = &cols.limits;
        let mut next: SmallVec<[i64; 4]> = SmallVec::from_slice(offsets);
        if offsets[0] > limits[0] {
            return Err(Error::new(
                ErrorKind::IndexOutOfRange,
                format!(
                    "tried to advance past the end of the cursor: offset {} of {} records",
                    offsets[0], limits[0]
                ),
            ));
        }
        sizes[0] = (limits[0] - offsets[0]).min(num);
        next[0] = offsets[0] + sizes[0];
        for d in 1..n {
            let lengths_field = self.length_fields[d - 1];
            let parent = self.domain[lengths_field];
            let (start, count) = (offsets[parent] as usize, sizes[parent] as usize);
            let lengths = cols.lengths[d - 1].get(start..start + count).ok_or_else(|| {
                Error::shape(format!(
                    "field '{}' has {} lengths, fewer than the {} entries of its domain read so far",
                    self.names[lengths_field],
                    cols.lengths[d - 1].len(),
                    start + count
                ))
            })?;
            let mut total = 0i64;
            for &len in lengths {
                if len < 0 {
                    return Err(Error::invalid_arg(format!(
                        "field '{}' holds a negative length ({len})",
                        self.names[lengths_field]
                    )));
                }
                total += i64::from(len);
            }
            if offsets[d] + total > limits[d] {
                return Err(Error::shape(format!(
                    "inconsistent field lengths: '{}' asks for rows up to {} but its domain has only {}",
                    self.names[lengths_field],
                    offsets[d] + total,
                    limits[d]
                )));
            }
            sizes[d] = total;
            next[d] = offsets[d] + total;
        }
        offsets.copy_from_slice(&next);
        Ok(())
    }
}

/// What walking a dataset needs from its columns: each lengths field's
/// values, and each domain's size (the fewest rows among its fields; a
/// domain without fields is unbounded).
struct Columns<'a> {
    lengths: SmallVec<[Cow<'a, [i32]>; 2]>,
    limits: SmallVec<[i64; 4]>,
}

/// Reads the columns; `fields[i]` is the tensor of field `i`, named `names[i]`.
/// With `strict`, fields of one domain must have the same number of rows.
fn columns<'a>(
    it: &TreeIterator,
    fields: &[&'a Tensor],
    names: &[&str],
    strict: bool,
) -> Result<Columns<'a>> {
    let mut limits: SmallVec<[i64; 4]> = SmallVec::from_elem(i64::MAX, it.num_domains());
    for (i, t) in fields.iter().enumerate() {
        if t.ndim() == 0 {
            return Err(Error::shape(format!(
                "dataset field '{}' must be at least 1-D, got a 0-dim tensor",
                it.names[i]
            ))
            .with_blob(names[i]));
        }
        let rows = t.shape()[0] as i64;
        let d = it.domain[i];
        if strict && limits[d] != i64::MAX && limits[d] != rows {
            return Err(Error::shape(format!(
                "inconsistent sizes for fields of the same domain: field {i} ('{}') has {rows} rows, an earlier one {}",
                it.names[i], limits[d]
            ))
            .with_blob(names[i]));
        }
        limits[d] = limits[d].min(rows);
    }
    let lengths = it
        .length_fields
        .iter()
        .map(|&f| {
            let a = fields[f]
                .array::<i32>()
                .map_err(|e| e.with_blob(names[f]))?;
            Ok(match a.as_slice() {
                Some(s) => Cow::Borrowed(s),
                None => Cow::Owned(a.iter().copied().collect()),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Columns { lengths, limits })
}

/// Rows `lo..hi` of each range, concatenated along dim 0 (same dtype and
/// inner dims; no ranges gives 0 rows).
fn gather_rows(t: &Tensor, ranges: &[(usize, usize)]) -> Result<Tensor> {
    with_array!(t, a => {
        let mut views: Vec<_> = ranges.iter().map(|&(lo, hi)| a.slice_axis(Axis(0), Slice::from(lo..hi))).collect();
        if views.is_empty() {
            views.push(a.slice_axis(Axis(0), Slice::from(0..0)));
        }
        Ok(Tensor::from(concatenate(0, &views)?))
    })
}

/// Cuts a dataset into its records (for PackRecords): record `k` holds, for
/// each field, the rows of that field that belong to top-level entry `k`
/// (nested lists follow their `:lengths`). `tensors[i]` is field `i`,
/// named `names[i]`.
pub(super) fn split_records(
    fields: &[String],
    tensors: &[&Tensor],
    names: &[&str],
) -> Result<Vec<Vec<Tensor>>> {
    let it = TreeIterator::new(fields)?;
    let cols = columns(&it, tensors, names, false)?;
    let nd = it.num_domains();
    let (mut offsets, mut sizes) = (vec![0i64; nd], vec![0i64; nd]);
    let n = cols.limits[0];
    let mut records = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for _ in 0..n {
        let start = offsets.clone();
        it.advance(&cols, &mut offsets, &mut sizes, 1)?;
        let record = (0..it.num_fields())
            .map(|j| {
                let d = it.domain[j];
                let (lo, hi) = (start[d] as usize, (start[d] + sizes[d]) as usize);
                gather_rows(tensors[j], &[(lo, hi)])
            })
            .collect::<Result<Vec<_>>>()?;
        records.push(record);
    }
    Ok(records)
}

// ---------------------------------------------------------------- cursor --

/// A cursor over a dataset: one offset per domain, advanced under a mutex.
/// Empty offsets mean "at the start".
pub struct TreeCursor {
    /// The dataset's field names (the `fields` argument of CreateTreeCursor).
    pub field_names: Vec<String>,
    it: TreeIterator,
    offsets: Mutex<Vec<i64>>,
}

impl fmt::Debug for TreeCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TreeCursor({:?}, offsets {:?})",
            self.field_names,
            self.offsets.lock()
        )
    }
}

impl BlobObject for TreeCursor {
    fn kind_name(&self) -> &'static str {
        "TreeCursor"
    }
    /// Cursors are saved in Caffe2's layout, so checkpoints capture where a
    /// reader stands and move both ways with Caffe2.
    fn serialize(&self) -> Option<BlobProto> {
        Some(self.to_blob_proto(""))
    }
}

fn decode_cursor(p: &BlobProto) -> Result<BlobValue> {
    Ok(BlobValue::Object(std::sync::Arc::new(
        TreeCursor::from_blob_proto(p)?,
    )))
}

/// The type string Caffe2 wrote in a cursor's BlobProto.
pub const CAFFE2_CURSOR_TYPE: &str = "std::unique_ptr<TreeCursor>";

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

impl TreeCursor {
    /// A cursor at the start of a dataset with these fields.
    pub fn new(field_names: Vec<String>) -> Result<TreeCursor> {
        Self::from_parts(field_names, Vec::new())
    }

    /// A cursor at given offsets: empty (the start) or one per domain.
    pub fn from_parts(field_names: Vec<String>, offsets: Vec<i64>) -> Result<TreeCursor> {
        let it = TreeIterator::new(&field_names)?;
        if !offsets.is_empty() && offsets.len() != it.num_domains() {
            return Err(Error::invalid_arg(format!(
                "a cursor over these fields needs {} offsets, got {}",
                it.num_domains(),
                offsets.len()
            )));
        }
        if let Some(o) = offsets.iter().find(|&&o| o < 0) {
            return Err(Error::invalid_arg(format!(
                "cursor offsets must be >= 0, got {o}"
            )));
        }
        Ok(TreeCursor {
            field_names,
            it,
            offsets: Mutex::new(offsets),
        })
    }

    /// The current offsets (empty before the first read or after a reset).
    pub fn offsets(&self) -> Vec<i64> {
        self.offsets.lock().clone()
    }

    /// The number of domains: the `...:lengths` fields, plus the top level.
    pub fn num_domains(&self) -> usize {
        self.it.num_domains()
    }

    pub fn reset(&self) {
        self.offsets.lock().clear();
    }

    /// Caffe2's BlobProto layout: type `std::unique_ptr<TreeCursor>`, the
    /// offsets as an int64 tensor (absent when empty), the field names in
    /// `content`, each followed by a space.
    pub fn to_blob_proto(&self, name: &str) -> BlobProto {
        let offsets = self.offsets();
        let tensor = (!offsets.is_empty()).then(|| TensorProto {
            dims: vec![offsets.len() as i64],
            data_type: Some(DataType::Int64 as i32),
            int64_data: offsets,
            ..Default::default()
        });
        let content: String = self.field_names.iter().map(|n| format!("{n} ")).collect();
        BlobProto {
            name: Some(name.to_string()),
            r#type: Some(CAFFE2_CURSOR_TYPE.to_string()),
            tensor,
            content: Some(content.into_bytes()),
            ..Default::default()
        }
    }

    /// Reads Caffe2's BlobProto layout (see [`Self::to_blob_proto`]).
    pub fn from_blob_proto(p: &BlobProto) -> Result<TreeCursor> {
        let content = p.content.as_deref().unwrap_or_default();
        let content = std::str::from_utf8(content)
            .map_err(|_| corrupt("TreeCursor field names are not UTF-8"))?;
        let names = content.split_whitespace().map(str::to_string).collect();
        let offsets = match &p.tensor {
            None => Vec::new(),
            Some(t) if t.data_type.unwrap_or(1) == DataType::Int64 as i32 => t.int64_data.clone(),
            Some(t) => {
                return Err(corrupt(format!(
                    "TreeCursor offsets must be an INT64 tensor, got data type {}",
                    t.data_type.unwrap_or(1)
                )))
            }
        };
        Self::from_parts(names, offsets)
            .map_err(|e| corrupt(format!("invalid TreeCursor blob: {}", e.message)))
    }
}

// ------------------------------------------------------------- op helpers --

fn cursor_in(v: &BlobValue, name: &str) -> Result<Arc<TreeCursor>> {
    v.object::<TreeCursor>("TreeCursor")
        .map_err(|e| e.with_blob(name))
}

fn cursor_of(cx: &OpCx<'_>) -> Result<Arc<TreeCursor>> {
    cursor_in(&cx.input_blob(0).read(), &cx.io.input_names[0])
}

/// Inputs `first..first + n` as tensors, with their names.
fn field_inputs<'l>(
    l: &'l Locked<'_>,
    first: usize,
    n: usize,
) -> Result<(Vec<&'l Tensor>, Vec<&'l str>)> {
    let tensors = (first..first + n)
        .map(|i| l.tensor(i))
        .collect::<Result<Vec<_>>>()?;
    let names = (first..first + n).map(|i| l.input_name(i)).collect();
    Ok((tensors, names))
}

fn check_field_counts(
    cx: &OpCx<'_>,
    cursor: &TreeCursor,
    extra_inputs: usize,
    outputs: bool,
) -> Result<()> {
    let nf = cursor.it.num_fields();
    if cx.num_inputs() != nf + extra_inputs {
        return Err(Error::invalid_arg(format!(
            "the cursor has {nf} fields, so the op needs {} inputs, got {}",
            nf + extra_inputs,
            cx.num_inputs()
        ))
        .with_blob(&cx.io.input_names[0]));
    }
    if outputs && cx.num_outputs() != nf {
        return Err(Error::invalid_arg(format!(
            "the cursor has {nf} fields, so the op needs {nf} outputs, got {}",
            cx.num_outputs()
        ))
        .with_blob(&cx.io.input_names[0]));
    }
    Ok(())
}

fn batch_size_arg(ctx: &OpDefCtx<'_>) -> Result<i64> {
    let b = ctx.args.i64("batch_size", 1)?;
    if b < 0 {
        return Err(ctx.bad_arg(format!("batch_size must be >= 0, got {b}")));
    }
    Ok(b)
}

pub(super) fn fields_arg(ctx: &OpDefCtx<'_>) -> Result<Vec<String>> {
    ctx.args
        .string_list("fields")
        .map(Option::unwrap_or_default)
}

// ------------------------------------------------------------------- ops --

fn create_tree_cursor(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let fields = fields_arg(ctx)?;
    TreeIterator::new(&fields).map_err(|e| e.with_op(ctx.op_type(), None))?;
    Ok(kernel(move |cx| {
        let cursor = TreeCursor::new(fields.clone())?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(cursor)));
        Ok(true)
    }))
}

fn reset_cursor(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        cursor_of(cx)?.reset();
        Ok(true)
    }))
}

fn get_cursor_offset(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let offsets = cursor_of(cx)?.offsets();
        let v = offsets
            .iter()
            .map(|&o| {
                i32::try_from(o).map_err(|_| {
                    Error::invalid_arg(format!("cursor offset {o} does not fit in int32"))
                })
            })
            .collect::<Result<Vec<i32>>>()?;
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::from_vec(&[v.len()], v)?));
        Ok(true)
    }))
}

fn read_next_batch(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch_size = batch_size_arg(ctx)?;
    let enforce = ctx.args.bool("enforce_batch_size", false)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        // Where each field's rows start, and how many rows of each domain.
        let (nf, domains, start, sizes) = {
            let cursor = l
                .input(0)
                .object_ref::<TreeCursor>("TreeCursor")
                .map_err(|e| e.with_blob(l.input_name(0)))?;
            check_field_counts(cx, cursor, 1, true)?;
            let nf = cursor.it.num_fields();
            let (fields, names) = field_inputs(&l, 1, nf)?;
            let cols = columns(&cursor.it, &fields, &names, false)?;
            let mut sizes: SmallVec<[i64; 4]> = SmallVec::from_elem(0, cursor.it.num_domains());
            let start: SmallVec<[i64; 4]> = {
                let mut offsets = lock_spinning(&cursor.offsets);
                if offsets.is_empty() {
                    offsets.resize(cursor.it.num_domains(), 0);
                }
                let start = SmallVec::from_slice(&offsets);
                cursor
                    .it
                    .advance(&cols, &mut offsets, &mut sizes, batch_size)?;
                start
            };
            if enforce && sizes[0] < batch_size {
                // Not a full batch left: an empty one says "end of data".
                sizes.fill(0);
            }
            let domains: SmallVec<[usize; 4]> = cursor.it.domain.iter().copied().collect();
            (nf, domains, start, sizes)
        };
        for (j, &d) in domains.iter().enumerate().take(nf) {
            let lo = start[d] as usize;
            let hi = lo + sizes[d] as usize;
            let (out, field) = l.output_and_input(j, 1 + j).ok_or_else(|| {
                Error::invalid_arg("an output of ReadNextBatch is also one of its inputs")
            })?;
            let field = field
                .tensor()
                .map_err(|e| e.with_blob(&cx.io.input_names[1 + j]))?;
            set_rows(out, field, lo, hi)?;
        }
        Ok(true)
    }))
}

/// Sets `out` to rows `lo..hi` of `src`. When `out` already holds a tensor
/// of that dtype and shape (the previous batch, usually), its buffer is
/// reused: no allocation.
fn set_rows(out: &mut BlobValue, src: &Tensor, lo: usize, hi: usize) -> Result<()> {
    if let BlobValue::Tensor(t) = out {
        let same = t.dtype() == src.dtype()
            && t.ndim() == src.ndim()
            && t.shape()[0] == hi - lo
            && t.shape()[1..] == src.shape()[1..];
        if same {
            macro_rules! copy_rows {
                ($a:ident, $T:ty) => {{
                    let rows = src.array::<$T>()?.slice_axis(Axis(0), Slice::from(lo..hi));
                    match ($a.as_slice_mut(), rows.as_slice()) {
                        (Some(dst), Some(src)) => dst.clone_from_slice(src),
                        _ => $a.assign(&rows),
                    }
                }};
            }
            let dtype = t.dtype();
            crate::with_match_dtype!(dtype, |T| {
                let a = t.array_mut::<T>()?;
                copy_rows!(a, T)
            }, else other => return Err(crate::tensor::unsupported_dtype(other)));
            return Ok(());
        }
    }
    *out = BlobValue::Tensor(gather_rows(src, &[(lo, hi)])?);
    Ok(())
}

fn compute_offset(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let cursor = cursor_of(cx)?;
        check_field_counts(cx, &cursor, 1, false)?;
        let nd = cursor.it.num_domains();
        let mut l = cx.lock();
        let matrix = {
            let (fields, names) = field_inputs(&l, 1, cursor.it.num_fields())?;
            let cols = columns(&cursor.it, &fields, &names, false)?;
            if cols.limits[0] == i64::MAX {
                return Err(Error::invalid_arg(
                    "ComputeOffset needs at least one dataset field",
                ));
            }
            let rows = cols.limits[0] as usize + 1;
            let mut data = try_vec(
                rows.saturating_mul(nd),
                format_args!("a {rows} x {nd} offsets matrix"),
            )?;
            let mut offsets = cursor.offsets.lock();
            let mut at = if offsets.is_empty() {
                vec![0; nd]
            } else {
                offsets.clone()
            };
            let mut sizes = vec![0i64; nd];
            for _ in 0..rows {
                data.extend_from_slice(&at);
                cursor.it.advance(&cols, &mut at, &mut sizes, 1)?;
            }
            *offsets = vec![0; nd];
            Tensor::from_vec(&[rows, nd], data)?
        };
        l.set_output(0, matrix);
        Ok(true)
    }))
}

// ----------------------------------------------------------- shuffling --

/// libstdc++'s `std::default_random_engine`: `minstd_rand0`, default seed 1.
struct MinStdRand0(u64);

impl MinStdRand0 {
    const MIN: u64 = 1;
    const MAX: u64 = 2_147_483_646;
    fn new() -> Self {
        MinStdRand0(1)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0 * 16_807 % 2_147_483_647;
        self.0
    }

    /// libstdc++'s `uniform_int_distribution<unsigned long>` on `[a, b]` with
    /// this engine (its rejection-based down- and up-scaling).
    fn uniform(&mut self, a: u64, b: u64) -> u64 {
        let urng_range = Self::MAX - Self::MIN;
        let range = b - a;
        let r = if urng_range > range {
            let erange = range + 1;
            let scaling = urng_range / erange;
            let past = erange * scaling;
            loop {
                let r = self.next() - Self::MIN;
                if r < past {
                    break r / scaling;
                }
            }
        } else if urng_range < range {
            loop {
                let erng_range = urng_range + 1;
                let high = erng_range * self.uniform(0, range / erng_range);
                let r = high + (self.next() - Self::MIN);
                if r <= range && r >= high {
                    break r;
                }
            }
        } else {
            self.next() - Self::MIN
        };
        r + a
    }
}

/// libstdc++'s `std::shuffle(v, std::default_random_engine())`: a fresh,
/// default-seeded engine on every call, as Caffe2 wrote it. Small ranges draw
/// two swap positions per number.
fn caffe2_shuffle<T>(v: &mut [T]) {
    let n = v.len() as u64;
    if n == 0 {
        return;
    }
    let mut g = MinStdRand0::new();
    let urng_range = MinStdRand0::MAX - MinStdRand0::MIN;
    if urng_range / n >= n {
        let mut i = 1u64;
        if n % 2 == 0 {
            v.swap(1, g.uniform(0, 1) as usize);
            i = 2;
        }
        while i != n {
            let (b0, b1) = (i + 1, i + 2);
            let x = g.uniform(0, b0 * b1 - 1);
            v.swap(i as usize, (x / b1) as usize);
            v.swap(i as usize + 1, (x % b1) as usize);
            i += 2;
        }
    } else {
        for i in 1..n {
            v.swap(i as usize, g.uniform(0, i) as usize);
        }
    }
}

struct SortAndShuffleOp {
    sort_by: Option<usize>,
    batch_size: usize,
    shuffle_size: usize,
}

fn sort_and_shuffle(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let sort_by = ctx.args.i64("sort_by_field_idx", 1)?;
    let batch_size = ctx.args.i64("batch_size", 1)?;
    let shuffle_size = ctx.args.i64("shuffle_size", 1)?;
    if sort_by < -1 {
        return Err(ctx.bad_arg(format!("sort_by_field_idx must be >= -1, got {sort_by}")));
    }
    if batch_size < 1
        || shuffle_size < 1
        || batch_size
            .checked_mul(shuffle_size)
            .is_none_or(|c| c > i64::from(i32::MAX))
    {
        return Err(ctx.bad_arg(format!(
            "batch_size and shuffle_size must be >= 1 (and their product fit in int32), got {batch_size} and {shuffle_size}"
        )));
    }
    Ok(Box::new(SortAndShuffleOp {
        sort_by: usize::try_from(sort_by).ok(),
        batch_size: batch_size as usize,
        shuffle_size: shuffle_size as usize,
    }))
}

impl Operator for SortAndShuffleOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let cursor = cursor_of(cx)?;
        check_field_counts(cx, &cursor, 1, false)?;
        let nf = cursor.it.num_fields();
        let mut l = cx.lock();
        let indices = {
            if let Some(f) = self.sort_by.filter(|&f| f >= nf) {
                return Err(Error::invalid_arg(format!(
                    "sort_by_field_idx {f} is out of range for {nf} fields"
                )));
            }
            if nf == 0 {
                return Err(Error::invalid_arg(
                    "SortAndShuffle needs at least one dataset field",
                ));
            }
            let size_field = self.sort_by.unwrap_or(0);
            let t = l.tensor(size_field + 1)?;
            if t.ndim() == 0 {
                return Err(Error::shape("dataset fields must be at least 1-D")
                    .with_blob(l.input_name(size_field + 1)));
            }
            let size = t.shape()[0];
            let bs = self.batch_size;
            let shuffle_size = if bs * self.shuffle_size > size {
                size / bs
            } else {
                self.shuffle_size
            };
            let mut idx: Vec<i64> = try_vec(size, format_args!("{size} int64 indices"))?;
            idx.extend(0..size as i64);
            if let Some(f) = self.sort_by {
                if cursor.it.domain[f] != 0 {
                    return Err(Error::invalid_arg(format!(
                        "can only sort by a top-level field, and '{}' is not one",
                        cursor.it.names[f]
                    )));
                }
                let keys = t
                    .array::<i32>()
                    .map_err(|e| e.with_blob(l.input_name(f + 1)))?;
                let keys: Vec<i32> =
                    crate::tensor::try_collect(keys.iter().copied(), "a kernel buffer")?;
                idx.sort_by_key(|&i| keys[i as usize]);
            }
            let chunk = bs * shuffle_size;
            if chunk > 1 {
                let mut off = 0;
                while off + chunk < size {
                    caffe2_shuffle(&mut idx[off..off + chunk]);
                    off += chunk;
                }
            }
            let num_batches = size / bs;
            let mut order: Vec<usize> =
                crate::tensor::try_collect(0..num_batches, "a kernel buffer")?;
            caffe2_shuffle(&mut order);
            let mut out = try_vec(size, format_args!("{size} int64 indices"))?;
            for b in order {
                out.extend_from_slice(&idx[b * bs..(b + 1) * bs]);
            }
            out.extend_from_slice(&idx[num_batches * bs..]);
            Tensor::from_vec(&[size], out)?
        };
        l.set_output(0, indices);
        Ok(true)
    }
}

fn read_random_batch(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let batch_size = batch_size_arg(ctx)?;
    let enforce = ctx.args.bool("enforce_batch_size", false)?;
    let loop_over = ctx.args.bool("loop_over", false)?;
    Ok(kernel(move |cx| {
        let cursor = cursor_of(cx)?;
        check_field_counts(cx, &cursor, 3, true)?;
        let nf = cursor.it.num_fields();
        let mut l = cx.lock();
        let batch = {
            let idx_name = l.input_name(1);
            let idx = l
                .tensor(1)?
                .array::<i64>()
                .map_err(|e| e.with_blob(idx_name))?;
            let idx: Cow<'_, [i64]> = match idx.as_slice() {
                Some(s) => Cow::Borrowed(s),
                None => Cow::Owned(idx.iter().copied().collect()),
            };
            let mat_name = l.input_name(2);
            let mat = l
                .tensor(2)?
                .array::<i64>()
                .map_err(|e| e.with_blob(mat_name))?;
            if mat.ndim() != 2 {
                return Err(Error::shape(format!(
                    "the offsets matrix must be 2-D (ComputeOffset's output), got shape {:?}",
                    mat.shape()
                ))
                .with_blob(mat_name));
            }
            let (mat_rows, width) = (mat.shape()[0], mat.shape()[1]);
            let mat: Vec<i64> = crate::tensor::try_collect(mat.iter().copied(), "a kernel buffer")?;
            let n = idx.len() as i64;
            let first = {
                let mut offsets = cursor.offsets.lock();
                offsets.resize(1, 0);
                let mut at = offsets[0];
                if enforce && at.saturating_add(batch_size) > n {
                    at = n;
                }
                if loop_over && at >= n {
                    offsets[0] = 0;
                    at = 0;
                }
                offsets[0] = offsets[0].saturating_add(batch_size);
                at
            };
            let picked = if first >= n {
                &idx[..0]
            } else {
                &idx[first as usize..first.saturating_add(batch_size).min(n) as usize]
            };
            let (fields, names) = field_inputs(&l, 3, nf)?;
            let mut batch = Vec::with_capacity(nf);
            for (i, field) in fields.iter().enumerate() {
                let d = cursor.it.domain[i];
                if d >= width {
                    return Err(Error::shape(format!(
                        "the offsets matrix has {width} columns but the dataset has {} domains",
                        cursor.it.num_domains()
                    ))
                    .with_blob(mat_name));
                }
                let Some(&rows) = field.shape().first() else {
                    return Err(Error::shape(format!(
                        "dataset field '{}' must be at least 1-D, got a 0-dim tensor",
                        cursor.it.names[i]
                    ))
                    .with_blob(names[i]));
                };
                let mut ranges = Vec::with_capacity(picked.len());
                for &r in picked {
                    let r = usize::try_from(r).ok().filter(|&r| r + 1 < mat_rows).ok_or_else(|| {
                        Error::new(
                            ErrorKind::IndexOutOfRange,
                            format!("record index {r} is out of range for an offsets matrix of {mat_rows} rows"),
                        )
                        .with_blob(idx_name)
                    })?;
                    let (lo, hi) = (mat[r * width + d], mat[(r + 1) * width + d]);
                    if lo < 0 || hi < lo || hi as usize > rows {
                        return Err(Error::new(
                            ErrorKind::IndexOutOfRange,
                            format!(
                                "record {r} spans rows {lo}..{hi} of field '{}', which has {rows}",
                                cursor.it.names[i]
                            ),
                        )
                        .with_blob(names[i]));
                    }
                    ranges.push((lo as usize, hi as usize));
                }
                batch.push(gather_rows(field, &ranges)?);
            }
            batch
        };
        for (j, t) in batch.into_iter().enumerate() {
            l.set_output(j, t);
        }
        Ok(true)
    }))
}

fn trim_dataset(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let it = TreeIterator::new(&fields_arg(ctx)?).map_err(|e| e.with_op(ctx.op_type(), None))?;
    if ctx.num_inputs() != it.num_fields() || ctx.num_outputs() != it.num_fields() {
        return Err(ctx.bad_arg(format!(
            "expected {} fields as inputs and outputs, got {} and {}",
            it.num_fields(),
            ctx.num_inputs(),
            ctx.num_outputs()
        )));
    }
    let multiple_of = match ctx.args.i64_opt("multiple_of")? {
        Some(m) if m >= 1 => m,
        Some(m) => return Err(ctx.bad_arg(format!("multiple_of must be >= 1, got {m}"))),
        None => return Err(ctx.bad_arg("TrimDataset requires the argument 'multiple_of'")),
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let trimmed = {
            let (fields, names) = field_inputs(&l, 0, it.num_fields())?;
            let cols = columns(&it, &fields, &names, false)?;
            let records = cols.limits[0];
            let keep = records / multiple_of * multiple_of;
            if keep == records {
                return Ok(true);
            }
            let mut offsets = vec![0i64; it.num_domains()];
            let mut sizes = vec![0i64; it.num_domains()];
            it.advance(&cols, &mut offsets, &mut sizes, keep)?;
            fields
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let rows = offsets[it.domain[i]] as usize;
                    gather_rows(t, &[(0, rows)]).map_err(|e| e.with_blob(names[i]))
                })
                .collect::<Result<Vec<_>>>()?
        };
        for (i, t) in trimmed.into_iter().enumerate() {
            l.set_output(i, t);
        }
        Ok(true)
    }))
}

fn check_dataset_consistency(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let it = TreeIterator::new(&fields_arg(ctx)?).map_err(|e| e.with_op(ctx.op_type(), None))?;
    if ctx.num_inputs() != it.num_fields() {
        return Err(ctx.bad_arg(format!(
            "expected {} fields as inputs, got {}",
            it.num_fields(),
            ctx.num_inputs()
        )));
    }
    let dtypes = ctx.args.dtypes("dtypes", true)?;
    if !dtypes.is_empty() && dtypes.len() != it.num_fields() {
        return Err(ctx.bad_arg(format!(
            "'dtypes' must have one entry per field ({}), got {}",
            it.num_fields(),
            dtypes.len()
        )));
    }
    Ok(kernel(move |cx| {
        let l = cx.lock();
        let (fields, names) = field_inputs(&l, 0, it.num_fields())?;
        for (k, &want) in dtypes.iter().enumerate() {
            let got = fields[k].dtype();
            if want != DataType::Undefined && got != want {
                return Err(Error::type_error(format!(
                    "dataset field '{}' is {got}, but the dataset's schema declares {want}: write {want} \
                     (convert with Cast, or check that the fields are in the schema's order)",
                    it.names[k]
                ))
                .with_blob(names[k]));
            }
        }
        let cols = columns(&it, &fields, &names, true)?;
        let nd = it.num_domains();
        let (mut offsets, mut sizes) = (vec![0i64; nd], vec![0i64; nd]);
        it.advance(&cols, &mut offsets, &mut sizes, cols.limits[0])?;
        // Domain d > 0 is defined by lengths field d - 1.
        for (&lf, (&reached, &limit)) in it
            .length_fields
            .iter()
            .zip(offsets.iter().zip(&cols.limits).skip(1))
        {
            if reached != limit {
                let rows = if limit == i64::MAX {
                    "no fields".to_string()
                } else {
                    format!("{limit} rows")
                };
                return Err(Error::shape(format!(
                    "inconsistent dataset: the lengths in '{}' add up to {reached}, but its domain has {rows}",
                    it.names[lf]
                ))
                .with_blob(names[lf]));
            }
        }
        Ok(true)
    }))
}

// ------------------------------------------------------------- appending --

/// How a source is added to a destination.
#[derive(Clone, Copy)]
enum AppendMode {
    /// The destination is empty (never written, or 0 rows): it becomes a copy.
    Replace,
    Extend,
}

fn check_append(dst: &BlobValue, src: &Tensor) -> Result<AppendMode> {
    if src.ndim() == 0 {
        return Err(Error::shape(
            "cannot append a 0-dim tensor: the appended tensor needs at least 1 dim",
        ));
    }
    let a = match dst {
        BlobValue::Empty => return Ok(AppendMode::Replace),
        BlobValue::Tensor(a) => a,
        other => {
            return Err(Error::type_error(format!(
                "cannot append to {}: a tensor was expected",
                other.kind_name()
            )))
        }
    };
    if a.numel() == 0 && a.ndim() > 0 && a.shape()[0] == 0 {
        return Ok(AppendMode::Replace);
    }
    if a.dtype() != src.dtype() {
        return Err(Error::type_error(format!(
            "cannot append a {} tensor to a {} tensor",
            src.dtype(),
            a.dtype()
        )));
    }
    if a.ndim() != src.ndim() || a.shape()[1..] != src.shape()[1..] {
        return Err(Error::shape(format!(
            "cannot append rows of shape {:?} to a tensor of shape {:?}",
            src.shape(),
            a.shape()
        )));
    }
    Ok(AppendMode::Extend)
}

fn do_append(dst: &mut BlobValue, src: &Tensor, mode: AppendMode) -> Result<Option<Spare>> {
    match mode {
        AppendMode::Replace => {
            *dst = BlobValue::Tensor(src.try_clone()?);
            Ok(None)
        }
        AppendMode::Extend => dst.tensor_mut()?.append_rows_growing(src),
    }
}

/// Locks `m`, spinning for a while before going to sleep: the critical
/// sections of dataset ops are short, while a thread that sleeps takes tens
/// of microseconds to wake up (more on a VM), the holder taking the lock
/// again and again meanwhile; and on some VMs the woken thread is moved to
/// its waker's CPU, where it then shares one CPU with it.
fn lock_spinning<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    lock_spinning_unless(m, || false).expect("never gives up")
}

/// [`lock_spinning`], except that it gives up (`None`) instead of going to
/// sleep when `give_up()` says so at that point.
fn lock_spinning_unless<T>(
    m: &Mutex<T>,
    mut give_up: impl FnMut() -> bool,
) -> Option<parking_lot::MutexGuard<'_, T>> {
    const SPIN: std::time::Duration = std::time::Duration::from_micros(50);
    if let Some(g) = m.try_lock() {
        return Some(g);
    }
    if !crate::threads::spinning_pays() {
        // One CPU: the holder cannot release the lock while this spins.
        return if give_up() { None } else { Some(m.lock()) };
    }
    let start = std::time::Instant::now();
    loop {
        for _ in 0..32 {
            std::hint::spin_loop();
            if !m.is_locked() {
                if let Some(g) = m.try_lock() {
                    return Some(g);
                }
            }
        }
        if start.elapsed() > SPIN {
            return if give_up() { None } else { Some(m.lock()) };
        }
    }
}

/// Whether `v` holds the object `o` (the same one, not an equal one).
fn holds<T: BlobObject>(v: &BlobValue, o: &Arc<T>) -> bool {
    matches!(v, BlobValue::Object(x) if std::ptr::addr_eq(Arc::as_ptr(x), Arc::as_ptr(o)))
}

/// Prefaults, after the locks are released, the part of a large tensor's
/// buffer that the next appends will write: appends run under the writer's
/// mutex, and the page faults of fresh memory (costlier than copying the
/// page, on a VM) would otherwise be taken there, by one thread at a time.
///
/// The buffer is cut into chunks of `PREFAULT_CHUNK` bytes; the append that
/// crosses into a chunk prefaults the chunk `PREFAULT_AHEAD` bytes further
/// on, so each chunk is prefaulted once, by one thread, with no shared
/// state. An append that reallocated the buffer prefaults the first
/// `PREFAULT_AHEAD` bytes past the end. Small buffers (from the heap, and
/// mostly faulted in already) are left alone.
fn prefault_ahead(spare: Spare, appended_bytes: usize) {
    const PREFAULT_CHUNK: usize = 64 << 10;
    const PREFAULT_AHEAD: usize = 4 * PREFAULT_CHUNK;
    if spare.end - spare.buffer < LARGE_APPEND_CAPACITY {
        return;
    }
    let end = spare.start;
    if spare.grew {
        prefault_for_write(end, end.saturating_add(PREFAULT_AHEAD).min(spare.end));
        return;
    }
    let begin = end.saturating_sub(appended_bytes).max(spare.buffer);
    let mut boundary = (begin / PREFAULT_CHUNK + 1) * PREFAULT_CHUNK;
    while boundary <= end {
        let lo = boundary + PREFAULT_AHEAD;
        let hi = lo.saturating_add(PREFAULT_CHUNK).min(spare.end);
        if lo < hi {
            prefault_for_write(lo, hi);
        }
        boundary += PREFAULT_CHUNK;
    }
}

fn append(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        let src_name = l.input_name(1).to_string();
        let dst_name = l.output_name(0).to_string();
        let (dst, src) = l
            .output_and_input(0, 1)
            .expect("in place is enforced on A only");
        let src = src.tensor().map_err(|e| e.with_blob(&src_name))?;
        let mode = check_append(dst, src).map_err(|e| e.with_blob(&dst_name))?;
        do_append(dst, src, mode).map_err(|e| e.with_blob(&dst_name))?;
        Ok(true)
    }))
}

fn atomic_append(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_outputs();
    if ctx.num_inputs() != 2 * n + 1 {
        return Err(ctx.bad_arg(format!(
            "AtomicAppend takes (mutex, dst_1..dst_n, src_1..src_n) -> dst_1..dst_n: {n} outputs need {} inputs, got {}",
            2 * n + 1,
            ctx.num_inputs()
        )));
    }
    // The mutex object, kept between runs: checked against the blob before
    // waiting for it and after taking it, under the blob's lock.
    let mut cached: Option<Arc<BlobMutex>> = None;
    Ok(kernel(move |cx| {
        let mut spares: SmallVec<[Option<(Spare, usize)>; 4]> = SmallVec::new();
        loop {
            if cached.is_none() {
                cached = Some(
                    cx.input_blob(0)
                        .read()
                        .object::<BlobMutex>("Mutex")
                        .map_err(|e| e.with_blob(&cx.io.input_names[0]))?,
                );
            }
            let mutex = cached.as_ref().expect("set above");
            // The mutex first, then the blobs (as AtomicIter and AtomicFetchAdd).
            let stale = || !holds(&cx.input_blob(0).read(), mutex);
            let Some(guard) = lock_spinning_unless(&mutex.0, stale) else {
                cached = None;
                continue;
            };
            let mut l = cx.lock();
            if !holds(l.input(0), mutex) {
                // The blob was given another mutex since: take that one.
                drop(l);
                drop(guard);
                cached = None;
                continue;
            }
            let mut modes: SmallVec<[AppendMode; 4]> = SmallVec::with_capacity(n);
            for i in 0..n {
                let src = l.tensor(1 + n + i)?;
                modes.push(
                    check_append(l.input(1 + i), src).map_err(|e| e.with_blob(l.output_name(i)))?,
                );
            }
            for (i, mode) in modes.into_iter().enumerate() {
                let (dst, src) = l
                    .output_and_input(i, 1 + n + i)
                    .expect("sources are never outputs (in place is enforced)");
                let src = src.tensor()?;
                let spare =
                    do_append(dst, src, mode).map_err(|e| e.with_blob(&cx.io.output_names[i]))?;
                spares.push(spare.map(|s| (s, src.numel() * src.item_size())));
            }
            break;
        }
        for (spare, bytes) in spares.into_iter().flatten() {
            prefault_ahead(spare, bytes);
        }
        Ok(true)
    }))
}

// ------------------------------------------------------------------ tests --

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cancel::CancelToken;
    use crate::ir::{Argument, ExecutionStep, OperatorDef, PlanDef};
    use crate::net::Net;
    use crate::test_util::{feed, get, i32s, i64s, int_arg, net, op, strings_arg, strs};
    use crate::workspace::Workspace;
    use std::thread;

    fn run(ws: &Arc<Workspace>, def: OperatorDef) -> Result<bool> {
        ws.run_operator_once(&def, &CancelToken::new())
    }
    fn mat64(rows: usize, cols: usize, v: &[i64]) -> Tensor {
        Tensor::from_vec(&[rows, cols], v.to_vec()).unwrap()
    }

    /// Caffe2's nested example, three records:
    ///   0: a=1, b=[[10, 11], [12]],  c=[{c1: "x", c2: [100]}]
    ///   1: a=2, b=[],                c=[{c1: "y", c2: []}, {c1: "z", c2: [101, 102]}]
    ///   2: a=3, b=[[13, 14, 15]],    c=[]
    const FIELDS: [&str; 8] = [
        "a",
        "b:lengths",
        "b:values:lengths",
        "b:values:values",
        "c:lengths",
        "c:c1",
        "c:c2:lengths",
        "c:c2:values",
    ];
    fn nested(ws: &Workspace) -> Vec<String> {
        let data = [
            Tensor::from_vec(&[3, 1], vec![1.0f32, 2.0, 3.0]).unwrap(),
            i32s(&[2, 0, 1]),
            i32s(&[2, 1, 3]),
            i64s(&[10, 11, 12, 13, 14, 15]),
            i32s(&[1, 2, 0]),
            strs(&["x", "y", "z"]),
            i32s(&[1, 0, 2]),
            i64s(&[100, 101, 102]),
        ];
        FIELDS
            .iter()
            .zip(data)
            .map(|(f, t)| {
                let name = format!("ds/{f}");
                feed(ws, &name, t);
                name
            })
            .collect()
    }
    fn batch_names() -> Vec<String> {
        FIELDS.iter().map(|f| format!("batch/{f}")).collect()
    }
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(|s| s.as_str()).collect()
    }
    fn create_cursor(ws: &Arc<Workspace>, name: &str, fields: &[&str]) {
        assert!(run(
            ws,
            op(
                "CreateTreeCursor",
                &[],
                &[name],
                vec![strings_arg("fields", fields)]
            )
        )
        .unwrap());
    }
    fn cursor(ws: &Workspace, name: &str) -> Arc<TreeCursor> {
        ws.blob(name)
            .unwrap()
            .read()
            .object::<TreeCursor>("TreeCursor")
            .unwrap()
    }
    fn read_next(ws: &Arc<Workspace>, data: &[String], batch: i64, enforce: bool) -> Vec<Tensor> {
        let mut ins = vec!["cur"];
        ins.extend(refs(data));
        let outs = batch_names();
        let args = vec![
            int_arg("batch_size", batch),
            int_arg("enforce_batch_size", enforce as i64),
        ];
        assert!(run(ws, op("ReadNextBatch", &ins, &refs(&outs), args)).unwrap());
        outs.iter().map(|o| get(ws, o)).collect()
    }
    fn empty_like(t: &Tensor) -> Tensor {
        let mut shape = t.shape().to_vec();
        shape[0] = 0;
        Tensor::zeros(t.dtype(), &shape).unwrap()
    }

    #[test]
    fn domains_follow_the_longest_lengths_prefix() {
        let names: Vec<String> = FIELDS.iter().map(|s| s.to_string()).collect();
        let it = TreeIterator::new(&names).unwrap();
        assert_eq!(it.length_fields, vec![1, 2, 4, 6]);
        // a, b:lengths and c:lengths are top level; b:values:lengths is in b,
        // b:values:values in b:values, c:c1 and c:c2:lengths in c, c:c2:values in c:c2.
        assert_eq!(it.domain, vec![0, 0, 1, 2, 0, 3, 3, 4]);
        // Prefixes match whole name parts only, and "lengths" alone defines nothing.
        let it = TreeIterator::new(&[
            "ab".into(),
            "a:lengths".into(),
            "lengths".into(),
            "a:x".into(),
        ])
        .unwrap();
        assert_eq!(it.domain, vec![0, 0, 0, 1]);
        // A field may not come before the lengths of its domain.
        let e = TreeIterator::new(&["a:values".into(), "a:lengths".into()]).unwrap_err();
        assert!(e.message.contains("defined after it"), "{e}");
        let ws = Workspace::new();
        let e = run(
            &ws,
            op(
                "CreateTreeCursor",
                &[],
                &["c"],
                vec![strings_arg("fields", &["x:v", "x:lengths"])],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn read_next_batch_walks_nested_lists() {
        let ws = Workspace::new();
        let data = nested(&ws);
        create_cursor(&ws, "cur", &FIELDS);
        let b = read_next(&ws, &data, 2, false);
        assert_eq!(b[0], Tensor::from_vec(&[2, 1], vec![1.0f32, 2.0]).unwrap());
        assert_eq!(b[1], i32s(&[2, 0]));
        assert_eq!(b[2], i32s(&[2, 1]));
        assert_eq!(b[3], i64s(&[10, 11, 12]));
        assert_eq!(b[4], i32s(&[1, 2]));
        assert_eq!(b[5], strs(&["x", "y", "z"]));
        assert_eq!(b[6], i32s(&[1, 0, 2]));
        assert_eq!(b[7], i64s(&[100, 101, 102]));
        assert_eq!(cursor(&ws, "cur").offsets(), vec![2, 2, 3, 3, 3]);
        assert!(run(&ws, op("GetCursorOffset", &["cur"], &["off"], vec![])).unwrap());
        assert_eq!(get(&ws, "off"), i32s(&[2, 2, 3, 3, 3]));
        // The last record: a short batch.
        let b = read_next(&ws, &data, 2, false);
        assert_eq!(b[0], Tensor::from_vec(&[1, 1], vec![3.0f32]).unwrap());
        assert_eq!(b[1], i32s(&[1]));
        assert_eq!(b[2], i32s(&[3]));
        assert_eq!(b[3], i64s(&[13, 14, 15]));
        assert_eq!(b[4], i32s(&[0]));
        assert_eq!(b[5], strs(&[]));
        assert_eq!(b[6], i32s(&[]));
        assert_eq!(b[7], i64s(&[]));
        // Past the end: every field empty, with its inner dims and dtype.
        for _ in 0..2 {
            let b = read_next(&ws, &data, 2, false);
            for (t, f) in b.iter().zip(&data) {
                assert_eq!(t, &empty_like(&get(&ws, f)));
            }
        }
        // Reset starts over; batch_size 1 gives record 0.
        assert!(run(&ws, op("ResetCursor", &["cur"], &[], vec![])).unwrap());
        assert!(cursor(&ws, "cur").offsets().is_empty());
        let b = read_next(&ws, &data, 1, false);
        assert_eq!(b[3], i64s(&[10, 11, 12]));
        assert_eq!(b[5], strs(&["x"]));
        assert_eq!(b[7], i64s(&[100]));
        // Record 1 alone: an empty list b and two c entries.
        let b = read_next(&ws, &data, 1, false);
        assert_eq!((&b[1], &b[2], &b[3]), (&i32s(&[0]), &i32s(&[]), &i64s(&[])));
        assert_eq!(
            (&b[5], &b[6], &b[7]),
            (&strs(&["y", "z"]), &i32s(&[0, 2]), &i64s(&[101, 102]))
        );
    }

    #[test]
    fn enforce_batch_size_turns_a_short_last_batch_empty() {
        let ws = Workspace::new();
        let data = nested(&ws);
        create_cursor(&ws, "cur", &FIELDS);
        assert_eq!(read_next(&ws, &data, 2, true)[0].shape(), &[2, 1]);
        let b = read_next(&ws, &data, 2, true);
        for (t, f) in b.iter().zip(&data) {
            assert_eq!(t, &empty_like(&get(&ws, f)));
        }
        // batch_size 0 reads nothing.
        assert!(run(&ws, op("ResetCursor", &["cur"], &[], vec![])).unwrap());
        assert_eq!(read_next(&ws, &data, 0, false)[0].shape(), &[0, 1]);
    }

    #[test]
    fn read_next_batch_rejects_bad_datasets() {
        let ws = Workspace::new();
        create_cursor(&ws, "cur", &["l:lengths", "l:values"]);
        let read = |ws: &Arc<Workspace>| {
            run(
                ws,
                op(
                    "ReadNextBatch",
                    &["cur", "len", "val"],
                    &["x", "y"],
                    vec![int_arg("batch_size", 2)],
                ),
            )
        };
        // Lengths asking for more values than there are.
        feed(&ws, "len", i32s(&[1, 5]));
        feed(&ws, "val", i64s(&[1, 2, 3]));
        let e = read(&ws).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{e}");
        assert!(
            cursor(&ws, "cur").offsets().iter().all(|&o| o == 0),
            "a failed read does not move the cursor"
        );
        // Negative lengths, int64 lengths, 0-dim fields.
        feed(&ws, "len", i32s(&[-1, 2]));
        assert_eq!(read(&ws).unwrap_err().kind, ErrorKind::InvalidArgument);
        feed(&ws, "len", i64s(&[1, 2]));
        let e = read(&ws).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("len"))
        );
        feed(&ws, "len", Tensor::scalar(1i32));
        assert_eq!(read(&ws).unwrap_err().kind, ErrorKind::Shape);
        // Wrong numbers of inputs or outputs for the cursor's fields.
        feed(&ws, "len", i32s(&[1]));
        let e = run(&ws, op("ReadNextBatch", &["cur", "len"], &["x"], vec![])).unwrap_err();
        assert!(e.message.contains("2 fields"), "{e}");
        let e = run(
            &ws,
            op("ReadNextBatch", &["cur", "len", "val"], &["x"], vec![]),
        )
        .unwrap_err();
        assert!(e.message.contains("outputs"), "{e}");
        // A non-cursor is a type error naming the blob.
        let e = run(&ws, op("ResetCursor", &["len"], &[], vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("len"))
        );
        // Outputs may not overwrite inputs.
        assert!(run(
            &ws,
            op(
                "ReadNextBatch",
                &["cur", "len", "val"],
                &["len", "y"],
                vec![]
            )
        )
        .is_err());
        assert!(run(
            &ws,
            op(
                "ReadNextBatch",
                &["cur", "len", "val"],
                &["x", "y"],
                vec![int_arg("batch_size", -1)]
            )
        )
        .is_err());
    }

    #[test]
    fn compute_offset_lists_every_records_offsets_and_resets() {
        let ws = Workspace::new();
        let data = nested(&ws);
        create_cursor(&ws, "cur", &FIELDS);
        read_next(&ws, &data, 1, false);
        let mut ins = vec!["cur"];
        ins.extend(refs(&data));
        // From the cursor's position (record 1), then the cursor is reset.
        assert!(run(&ws, op("ComputeOffset", &ins, &["offsets"], vec![])).unwrap());
        assert_eq!(
            get(&ws, "offsets"),
            mat64(
                4,
                5,
                &[1, 2, 3, 1, 1, 2, 2, 3, 3, 3, 3, 3, 6, 3, 3, 3, 3, 6, 3, 3]
            )
        );
        assert_eq!(cursor(&ws, "cur").offsets(), vec![0; 5]);
        assert!(run(&ws, op("ComputeOffset", &ins, &["offsets"], vec![])).unwrap());
        assert_eq!(
            get(&ws, "offsets"),
            mat64(
                4,
                5,
                &[0, 0, 0, 0, 0, 1, 2, 3, 1, 1, 2, 2, 3, 3, 3, 3, 3, 6, 3, 3]
            )
        );
    }

    #[test]
    fn read_random_batch_follows_the_indices() {
        let ws = Workspace::new();
        let data = nested(&ws);
        create_cursor(&ws, "cur", &FIELDS);
        let mut ins = vec!["cur"];
        ins.extend(refs(&data));
        assert!(run(&ws, op("ComputeOffset", &ins, &["offsets"], vec![])).unwrap());
        feed(&ws, "idx", i64s(&[2, 0, 1]));
        let mut rins = vec!["cur", "idx", "offsets"];
        rins.extend(refs(&data));
        let outs = batch_names();
        let read = |args: Vec<Argument>| {
            assert!(run(&ws, op("ReadRandomBatch", &rins, &refs(&outs), args)).unwrap());
            outs.iter().map(|o| get(&ws, o)).collect::<Vec<_>>()
        };
        // Records 2 then 0.
        let b = read(vec![int_arg("batch_size", 2)]);
        assert_eq!(b[0], Tensor::from_vec(&[2, 1], vec![3.0f32, 1.0]).unwrap());
        assert_eq!(b[1], i32s(&[1, 2]));
        assert_eq!(b[2], i32s(&[3, 2, 1]));
        assert_eq!(b[3], i64s(&[13, 14, 15, 10, 11, 12]));
        assert_eq!(b[4], i32s(&[0, 1]));
        assert_eq!(b[5], strs(&["x"]));
        assert_eq!(b[6], i32s(&[1]));
        assert_eq!(b[7], i64s(&[100]));
        // Record 1, then empty batches.
        let b = read(vec![int_arg("batch_size", 2)]);
        assert_eq!(b[3], i64s(&[]));
        assert_eq!(b[5], strs(&["y", "z"]));
        assert_eq!(b[7], i64s(&[101, 102]));
        let b = read(vec![int_arg("batch_size", 2)]);
        for (t, f) in b.iter().zip(&data) {
            assert_eq!(t, &empty_like(&get(&ws, f)));
        }
        // loop_over starts again at the end.
        let b = read(vec![int_arg("batch_size", 2), int_arg("loop_over", 1)]);
        assert_eq!(b[0], Tensor::from_vec(&[2, 1], vec![3.0f32, 1.0]).unwrap());
        // enforce_batch_size: the short batch (record 1) is dropped.
        let b = read(vec![
            int_arg("batch_size", 2),
            int_arg("enforce_batch_size", 1),
        ]);
        assert_eq!(b[0].shape(), &[0, 1]);
        // A 0-dim field is an error, even when no record is picked.
        let a = get(&ws, "ds/a");
        feed(&ws, "ds/a", Tensor::scalar(1.0f32));
        let e = run(&ws, op("ReadRandomBatch", &rins, &refs(&outs), vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("ds/a"))
        );
        feed(&ws, "ds/a", a);
        // Bad indices are errors, not wild reads.
        feed(&ws, "idx", i64s(&[7]));
        assert!(run(&ws, op("ResetCursor", &["cur"], &[], vec![])).unwrap());
        let e = run(&ws, op("ReadRandomBatch", &rins, &refs(&outs), vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::IndexOutOfRange, Some("idx"))
        );
    }

    #[test]
    fn libstdcxx_shuffle_is_reproduced() {
        // Golden values from g++ 12 (libstdc++): std::shuffle of 0..n with a
        // default-constructed std::default_random_engine.
        let cases: [&[usize]; 8] = [
            &[0],
            &[1, 0],
            &[2, 0, 1],
            &[2, 3, 1, 0],
            &[3, 0, 4, 2, 1],
            &[2, 3, 1, 4, 5, 0],
            &[3, 0, 4, 6, 5, 1, 2],
            &[2, 7, 1, 6, 8, 0, 4, 9, 5, 3],
        ];
        for want in cases {
            let mut v: Vec<usize> = (0..want.len()).collect();
            caffe2_shuffle(&mut v);
            assert_eq!(v, want);
        }
        // A range too large for two positions per draw (50000^2 > 2^31).
        let mut v: Vec<u64> = (0..50_000).collect();
        caffe2_shuffle(&mut v);
        assert_eq!(
            &v[..8],
            &[7657, 15610, 35781, 37701, 46212, 46264, 3290, 40083]
        );
        assert_eq!(
            v.iter()
                .enumerate()
                .map(|(i, &x)| x * (i as u64 + 1))
                .sum::<u64>(),
            31_235_722_062_144
        );
    }

    #[test]
    fn sort_and_shuffle_matches_caffe2() {
        let ws = Workspace::new();
        create_cursor(&ws, "cur", &["id", "key"]);
        feed(&ws, "id", i64s(&(0..11).collect::<Vec<_>>()));
        feed(&ws, "key", i32s(&[5, 3, 9, 1, 7, 3, 8, 2, 6, 0, 4]));
        let args = vec![
            int_arg("sort_by_field_idx", 1),
            int_arg("batch_size", 2),
            int_arg("shuffle_size", 2),
        ];
        assert!(run(
            &ws,
            op("SortAndShuffle", &["cur", "id", "key"], &["indices"], args)
        )
        .unwrap());
        // Sorted by key: 9 3 7 1 5 10 0 8 4 6 2; chunks of 4 shuffled (the
        // last, partial chunk is not); then the 5 whole batches shuffled
        // (golden values from the same steps in C++ with libstdc++).
        assert_eq!(
            get(&ws, "indices"),
            i64s(&[10, 5, 7, 1, 4, 6, 0, 8, 3, 9, 2])
        );
        // No sort, batch 1, shuffle 1: only the batch order is shuffled.
        let args = vec![int_arg("sort_by_field_idx", -1)];
        assert!(run(
            &ws,
            op("SortAndShuffle", &["cur", "id", "key"], &["indices"], args)
        )
        .unwrap());
        // (libstdc++'s shuffle of 0..11: 3 0 4 10 5 9 8 6 2 1 7.)
        assert_eq!(
            get(&ws, "indices"),
            i64s(&[3, 0, 4, 10, 5, 9, 8, 6, 2, 1, 7])
        );
        // A chunk larger than the dataset is clamped to whole batches.
        let args = vec![
            int_arg("sort_by_field_idx", 1),
            int_arg("batch_size", 4),
            int_arg("shuffle_size", 100),
        ];
        assert!(run(
            &ws,
            op("SortAndShuffle", &["cur", "id", "key"], &["indices"], args)
        )
        .unwrap());
        let got = get(&ws, "indices");
        let mut sorted = got
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect::<Vec<_>>();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..11).collect::<Vec<_>>());
        // Sorting needs a top-level int32 field.
        let e = run(
            &ws,
            op(
                "SortAndShuffle",
                &["cur", "id", "key"],
                &["i"],
                vec![int_arg("sort_by_field_idx", 0)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Type);
        let e = run(
            &ws,
            op(
                "SortAndShuffle",
                &["cur", "id", "key"],
                &["i"],
                vec![int_arg("sort_by_field_idx", 2)],
            ),
        )
        .unwrap_err();
        assert!(e.message.contains("out of range"), "{e}");
        assert!(run(
            &ws,
            op(
                "SortAndShuffle",
                &["cur", "id", "key"],
                &["i"],
                vec![int_arg("batch_size", 0)]
            )
        )
        .is_err());
    }

    #[test]
    fn check_dataset_consistency_accepts_and_rejects() {
        let ws = Workspace::new();
        let data = nested(&ws);
        let check = |ws: &Arc<Workspace>, data: &[String]| {
            run(
                ws,
                op(
                    "CheckDatasetConsistency",
                    &refs(data),
                    &[],
                    vec![strings_arg("fields", &FIELDS)],
                ),
            )
        };
        assert!(check(&ws, &data).unwrap());
        // Fewer values than the lengths ask for, then more.
        feed(&ws, "ds/b:values:values", i64s(&[1, 2, 3, 4, 5]));
        let e = check(&ws, &data).unwrap_err();
        assert!(
            e.message
                .contains("asks for rows up to 6 but its domain has only 5"),
            "{e}"
        );
        feed(&ws, "ds/b:values:values", i64s(&[1, 2, 3, 4, 5, 6, 7]));
        let e = check(&ws, &data).unwrap_err();
        assert!(
            e.message.contains("add up to 6, but its domain has 7 rows"),
            "{e}"
        );
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("ds/b:values:lengths"))
        );
        feed(&ws, "ds/b:values:values", i64s(&[1, 2, 3, 4, 5, 6]));
        // Two fields of one domain with different row counts.
        feed(&ws, "ds/c:c1", strs(&["x", "y"]));
        let e = check(&ws, &data).unwrap_err();
        assert!(e.message.contains("same domain"), "{e}");
        assert_eq!(e.context.blob.as_deref(), Some("ds/c:c2:lengths"));
        // The number of inputs must match the fields.
        let e = run(
            &ws,
            op(
                "CheckDatasetConsistency",
                &["ds/a"],
                &[],
                vec![strings_arg("fields", &FIELDS)],
            ),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn append_and_atomic_append() {
        let ws = Workspace::new();
        assert!(run(&ws, op("CreateMutex", &[], &["m"], vec![])).unwrap());
        // Dataset.init_empty makes float [0] tensors: the first append
        // replaces them, whatever their dtype; a never-written blob too.
        feed(&ws, "x", Tensor::zeros(DataType::Float, &[0]).unwrap());
        ws.create_blob("y");
        feed(&ws, "sx", i64s(&[1, 2]));
        feed(
            &ws,
            "sy",
            Tensor::from_vec(&[2, 2], vec![1i32, 2, 3, 4]).unwrap(),
        );
        let app = || {
            op(
                "AtomicAppend",
                &["m", "x", "y", "sx", "sy"],
                &["x", "y"],
                vec![],
            )
        };
        assert!(run(&ws, app()).unwrap());
        assert!(run(&ws, app()).unwrap());
        assert_eq!(get(&ws, "x"), i64s(&[1, 2, 1, 2]));
        assert_eq!(
            get(&ws, "y"),
            Tensor::from_vec(&[4, 2], vec![1i32, 2, 3, 4, 1, 2, 3, 4]).unwrap()
        );
        // A bad second field leaves the first untouched (checks come first).
        feed(
            &ws,
            "sy",
            Tensor::from_vec(&[1, 3], vec![1i32, 2, 3]).unwrap(),
        );
        let e = run(&ws, app()).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Shape, Some("y"))
        );
        assert_eq!(get(&ws, "x"), i64s(&[1, 2, 1, 2]));
        feed(
            &ws,
            "sy",
            Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
        );
        assert_eq!(run(&ws, app()).unwrap_err().kind, ErrorKind::Type);
        feed(&ws, "sy", Tensor::scalar(1i32));
        assert_eq!(run(&ws, app()).unwrap_err().kind, ErrorKind::Shape);
        // In place is enforced, counts must pair up, input 0 must be a mutex.
        let e = run(&ws, op("AtomicAppend", &["m", "x", "sx"], &["z"], vec![])).unwrap_err();
        assert!(e.message.contains("in-place"), "{e}");
        assert!(run(
            &ws,
            op("AtomicAppend", &["m", "x", "sx", "sy"], &["x"], vec![])
        )
        .is_err());
        let e = run(&ws, op("AtomicAppend", &["sx", "x", "sx"], &["x"], vec![])).unwrap_err();
        assert_eq!(
            (e.kind, e.context.blob.as_deref()),
            (ErrorKind::Type, Some("sx"))
        );
        // Plain Append.
        feed(
            &ws,
            "a",
            Tensor::from_vec(&[1, 2], vec![1.0f32, 2.0]).unwrap(),
        );
        feed(
            &ws,
            "b",
            Tensor::from_vec(&[2, 2], vec![3.0f32, 4.0, 5.0, 6.0]).unwrap(),
        );
        assert!(run(&ws, op("Append", &["a", "b"], &["a"], vec![])).unwrap());
        assert_eq!(
            get(&ws, "a"),
            Tensor::from_vec(&[3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap()
        );
        assert!(run(&ws, op("Append", &["a", "b"], &["c"], vec![])).is_err());
    }

    #[test]
    fn atomic_append_loses_nothing_under_concurrency() {
        let ws = Workspace::new();
        assert!(run(&ws, op("CreateMutex", &[], &["m"], vec![])).unwrap());
        feed(&ws, "x", i64s(&[]));
        feed(&ws, "y", i64s(&[]));
        let (threads, per) = (6i64, 200i64);
        thread::scope(|s| {
            for t in 0..threads {
                let ws = ws.clone();
                s.spawn(move || {
                    let (sx, sy) = (format!("sx{t}"), format!("sy{t}"));
                    let d = op(
                        "AtomicAppend",
                        &["m", "x", "y", &sx, &sy],
                        &["x", "y"],
                        vec![],
                    );
                    ws.create_blob(&sx);
                    ws.create_blob(&sy);
                    let mut n = Net::create(&net(&format!("n{t}"), vec![d]), &ws).unwrap();
                    for k in 0..per {
                        let v = t * per + k;
                        feed(&ws, &sx, i64s(&[v]));
                        feed(&ws, &sy, i64s(&[2 * v, 2 * v + 1]));
                        assert!(n.run(&ws, &CancelToken::new()).unwrap());
                    }
                });
            }
        });
        // Each append added one row to x and two to y together, so the
        // columns stay aligned: y[2i], y[2i + 1] = 2 x[i], 2 x[i] + 1.
        let x: Vec<i64> = get(&ws, "x")
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        let y: Vec<i64> = get(&ws, "y")
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(y.len(), 2 * x.len());
        for (i, v) in x.iter().enumerate() {
            assert_eq!((y[2 * i], y[2 * i + 1]), (2 * v, 2 * v + 1));
        }
        let mut sorted = x.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..threads * per).collect::<Vec<_>>());
    }

    #[test]
    fn read_next_batch_reuses_its_outputs_without_mixing_batches() {
        // A flat dataset of 10 records: an int64 column and a 2-wide float
        // column; batches of 4 come out as [0..4), [4..8), [8..10), then
        // empty ones. Each batch is compared with rows cut from the input
        // here, after the next read has run (which reuses the outputs).
        let ws = Workspace::new();
        let ids: Vec<i64> = (0..10).map(|i| 100 + i).collect();
        let xy: Vec<f32> = (0..20).map(|i| i as f32 / 2.0).collect();
        feed(&ws, "ds/id", i64s(&ids));
        feed(
            &ws,
            "ds/xy",
            Tensor::from_vec(&[10, 2], xy.clone()).unwrap(),
        );
        create_cursor(&ws, "cur", &["id", "xy"]);
        let d = op(
            "ReadNextBatch",
            &["cur", "ds/id", "ds/xy"],
            &["b/id", "b/xy"],
            vec![int_arg("batch_size", 4)],
        );
        let mut n = Net::create(&net("read", vec![d]), &ws).unwrap();
        let mut batches = vec![];
        for _ in 0..5 {
            assert!(n.run(&ws, &CancelToken::new()).unwrap());
            batches.push((get(&ws, "b/id"), get(&ws, "b/xy")));
        }
        let bounds = [(0, 4), (4, 8), (8, 10), (10, 10), (10, 10)];
        for ((id, pair), (lo, hi)) in batches.iter().zip(bounds) {
            assert_eq!(id, &i64s(&ids[lo..hi]));
            assert_eq!(
                pair,
                &Tensor::from_vec(&[hi - lo, 2], xy[2 * lo..2 * hi].to_vec()).unwrap()
            );
        }
    }

    #[test]
    fn atomic_append_takes_the_mutex_the_blob_holds_now() {
        let ws = Workspace::new();
        assert!(run(&ws, op("CreateMutex", &[], &["m"], vec![])).unwrap());
        feed(&ws, "x", i64s(&[]));
        let d = op("AtomicAppend", &["m", "x", "s"], &["x"], vec![]);
        ws.create_blob("s");
        let mut n = Net::create(&net("app", vec![d]), &ws).unwrap();
        let held = |ws: &Workspace| {
            ws.blob("m")
                .unwrap()
                .read()
                .object::<BlobMutex>("Mutex")
                .unwrap()
        };
        feed(&ws, "s", i64s(&[1, 2]));
        assert!(n.run(&ws, &CancelToken::new()).unwrap());
        // A new mutex in the blob: the op must lock that one. While another
        // thread holds the old one, the append still goes through.
        let old = held(&ws);
        assert!(run(&ws, op("CreateMutex", &[], &["m"], vec![])).unwrap());
        let _old_guard = old.0.lock();
        feed(&ws, "s", i64s(&[3]));
        assert!(n.run(&ws, &CancelToken::new()).unwrap());
        assert_eq!(get(&ws, "x"), i64s(&[1, 2, 3]));
        // While the new one is held, it waits for it.
        let new = held(&ws);
        let guard = new.0.lock();
        thread::scope(|sc| {
            let h = sc.spawn(|| {
                feed(&ws, "s", i64s(&[4]));
                n.run(&ws, &CancelToken::new()).unwrap()
            });
            thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(get(&ws, "x"), i64s(&[1, 2, 3]));
            drop(guard);
            assert!(h.join().unwrap());
        });
        assert_eq!(get(&ws, "x"), i64s(&[1, 2, 3, 4]));
        // Something else than a mutex in the blob is an error naming it.
        feed(&ws, "m", i64s(&[0]));
        let e = n.run(&ws, &CancelToken::new()).unwrap_err();
        assert!(
            e.message.contains("but a Mutex was expected"),
            "{}",
            e.message
        );
    }

    #[test]
    fn atomic_append_keeps_every_row_of_a_large_dataset() {
        // 4 threads append 300 batches of 1000 float32 rows each: the
        // column grows past 64 KiB into a large buffer, prefaulted ahead by
        // the appending threads. Every batch must arrive whole and once.
        let ws = Workspace::new();
        assert!(run(&ws, op("CreateMutex", &[], &["m"], vec![])).unwrap());
        feed(&ws, "v", Tensor::from_vec::<f32>(&[0], vec![]).unwrap());
        let (threads, per, batch) = (4usize, 300usize, 1000usize);
        thread::scope(|s| {
            for t in 0..threads {
                let ws = ws.clone();
                s.spawn(move || {
                    let src = format!("src{t}");
                    ws.create_blob(&src);
                    let d = op("AtomicAppend", &["m", "v", &src], &["v"], vec![]);
                    let mut n = Net::create(&net(&format!("n{t}"), vec![d]), &ws).unwrap();
                    for k in 0..per {
                        let first = (t * per + k) * batch;
                        let rows: Vec<f32> = (first..first + batch).map(|i| i as f32).collect();
                        feed(&ws, &src, Tensor::from_vec(&[batch], rows).unwrap());
                        assert!(n.run(&ws, &CancelToken::new()).unwrap());
                    }
                });
            }
        });
        let v: Vec<f32> = get(&ws, "v")
            .array::<f32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(v.len(), threads * per * batch);
        for chunk in v.chunks(batch) {
            let first = chunk[0] as usize;
            assert_eq!(first % batch, 0);
            assert!(chunk
                .iter()
                .enumerate()
                .all(|(i, &x)| x as usize == first + i));
        }
        let mut firsts: Vec<usize> = v.chunks(batch).map(|c| c[0] as usize / batch).collect();
        firsts.sort_unstable();
        assert_eq!(firsts, (0..threads * per).collect::<Vec<_>>());
    }

    #[test]
    fn lock_spinning_excludes_other_threads() {
        let m = Mutex::new(0u64);
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let mut g = lock_spinning(&m);
                        // Not an atomic increment: only the lock keeps it right.
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(*m.lock(), 80_000);
    }

    /// A dataset of `n` records: label i and a list of `i % 4` items i*10 + k.
    fn list_dataset(ws: &Workspace, n: i64) {
        let lengths: Vec<i32> = (0..n).map(|i| (i % 4) as i32).collect();
        let values: Vec<i64> = (0..n)
            .flat_map(|i| (0..i % 4).map(move |k| i * 10 + k))
            .collect();
        feed(ws, "label", i64s(&(0..n).collect::<Vec<_>>()));
        feed(ws, "items:lengths", i32s(&lengths));
        feed(ws, "items:values", i64s(&values));
    }

    /// Splits appended batches back into (label, items) records.
    fn records(ws: &Workspace, prefix: &str) -> Vec<(i64, Vec<i64>)> {
        let col = |f: &str| get(ws, &format!("{prefix}{f}"));
        let labels: Vec<i64> = col("label")
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        let lengths: Vec<i32> = col("items:lengths")
            .array::<i32>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        let values: Vec<i64> = col("items:values")
            .array::<i64>()
            .unwrap()
            .iter()
            .copied()
            .collect();
        assert_eq!(labels.len(), lengths.len());
        let mut at = 0;
        let recs = labels
            .iter()
            .zip(&lengths)
            .map(|(&l, &len)| {
                let items = values[at..at + len as usize].to_vec();
                at += len as usize;
                (l, items)
            })
            .collect();
        assert_eq!(at, values.len());
        recs
    }

    #[test]
    fn concurrent_readers_share_a_cursor_and_see_each_record_once() {
        let n = 1000i64;
        let ws = Workspace::new();
        list_dataset(&ws, n);
        let fields = ["label", "items:lengths", "items:values"];
        create_cursor(&ws, "cur", &fields);
        let out: Vec<String> = fields.iter().map(|f| format!("out/{f}")).collect();
        for (o, f) in out.iter().zip(&fields) {
            feed(&ws, o, empty_like(&get(&ws, f)));
        }
        assert!(run(&ws, op("CreateMutex", &[], &["m"], vec![])).unwrap());
        // Each instance (own child workspace): read a batch, stop when empty,
        // else append it to the output dataset.
        let batch: Vec<String> = fields.iter().map(|f| format!("b/{f}")).collect();
        let mut read_ins = vec!["cur"];
        read_ins.extend(fields);
        let read = net(
            "read",
            vec![
                op(
                    "ReadNextBatch",
                    &read_ins,
                    &refs(&batch),
                    vec![int_arg("batch_size", 7)],
                ),
                op("IsEmpty", &["b/label"], &["stop"], vec![]),
            ],
        );
        let mut app_ins = vec!["m"];
        app_ins.extend(refs(&out));
        app_ins.extend(refs(&batch));
        let write = net(
            "write",
            vec![
                op(
                    "CheckDatasetConsistency",
                    &refs(&batch),
                    &[],
                    vec![strings_arg("fields", &fields)],
                ),
                op("AtomicAppend", &app_ins, &refs(&out), vec![]),
            ],
        );
        let reader = ExecutionStep {
            name: Some("reader".into()),
            network: vec!["read".into(), "write".into()],
            should_stop_blob: Some("stop".into()),
            create_workspace: Some(true),
            ..Default::default()
        };
        let readers = ExecutionStep {
            name: Some("readers".into()),
            substep: vec![reader],
            num_concurrent_instances: Some(5),
            ..Default::default()
        };
        let plan = PlanDef {
            name: Some("p".into()),
            network: vec![read, write],
            execution_step: vec![readers],
        };
        assert!(crate::plan::run_plan(&ws, &plan, &CancelToken::new()).unwrap());
        let mut got = records(&ws, "out/");
        got.sort();
        let want: Vec<(i64, Vec<i64>)> = (0..n)
            .map(|i| (i, (0..i % 4).map(|k| i * 10 + k).collect()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn concurrent_readers_on_threads_get_distinct_batches() {
        let n = 500i64;
        let ws = Workspace::new();
        list_dataset(&ws, n);
        let fields = ["label", "items:lengths", "items:values"];
        create_cursor(&ws, "cur", &fields);
        let mut ins = vec!["cur"];
        ins.extend(fields);
        let labels = thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let ws = ws.clone();
                    let ins = ins.clone();
                    s.spawn(move || {
                        let outs: Vec<String> =
                            fields.iter().map(|f| format!("t{t}/{f}")).collect();
                        let d = op(
                            "ReadNextBatch",
                            &ins,
                            &refs(&outs),
                            vec![int_arg("batch_size", 3)],
                        );
                        let mut netw = Net::create(&net(&format!("r{t}"), vec![d]), &ws).unwrap();
                        let mut seen = Vec::new();
                        loop {
                            assert!(netw.run(&ws, &CancelToken::new()).unwrap());
                            let recs = records(&ws, &format!("t{t}/"));
                            if recs.is_empty() {
                                return seen;
                            }
                            for (l, items) in recs {
                                assert_eq!(
                                    items,
                                    (0..l % 4).map(|k| l * 10 + k).collect::<Vec<_>>()
                                );
                                seen.push(l);
                            }
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        let mut labels = labels;
        labels.sort_unstable();
        assert_eq!(labels, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn cursor_serialisation_round_trips() {
        let fields: Vec<String> = FIELDS.iter().map(|s| s.to_string()).collect();
        let c = TreeCursor::from_parts(fields.clone(), vec![2, 2, 3, 3, 3]).unwrap();
        let fresh = TreeCursor::new(fields.clone()).unwrap();
        // Offsets that do not fit the fields are rejected.
        assert!(TreeCursor::from_parts(vec!["a".into()], vec![1, 5]).is_err());
        // Caffe2's BlobProto layout.
        let p = c.to_blob_proto("cur");
        assert_eq!(p.r#type.as_deref(), Some(CAFFE2_CURSOR_TYPE));
        assert_eq!(p.tensor.as_ref().unwrap().int64_data, vec![2, 2, 3, 3, 3]);
        assert!(String::from_utf8(p.content.clone().unwrap())
            .unwrap()
            .starts_with("a b:lengths "));
        let back = TreeCursor::from_blob_proto(&p).unwrap();
        // The same bytes through the storage layer's codec registry.
        let saved = crate::storage::serialize_blob(
            "c",
            &BlobValue::Object(std::sync::Arc::new(
                TreeCursor::from_blob_proto(&p).unwrap(),
            )),
        )
        .unwrap();
        let restored = crate::storage::deserialize_blob(&saved).unwrap();
        let restored = restored.object::<TreeCursor>("TreeCursor").unwrap();
        assert_eq!(restored.offsets(), back.offsets());
        assert_eq!(
            (back.field_names.clone(), back.offsets()),
            (fields, vec![2, 2, 3, 3, 3])
        );
        assert!(fresh.to_blob_proto("c").tensor.is_none());
        assert!(format!("{c:?}").contains("offsets [2, 2, 3, 3, 3]"));
    }
}
