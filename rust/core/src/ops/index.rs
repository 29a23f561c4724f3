//! Indices: dictionaries from keys (int32, int64 or byte strings) to
//! consecutive ids 1, 2, ..., with 0 reserved for keys the index does not
//! know (Caffe2's `IntIndexCreate`, `LongIndexCreate`, `StringIndexCreate`,
//! `IndexGet`, `IndexLoad`, `IndexStore`, `IndexFreeze`, `IndexSize`).
//!
//! An index saves as Caffe2 saved it: a `BlobProto` of type
//! `std::unique_ptr<caffe2::IndexBase>` whose tensor holds the keys in id
//! order and whose content is `"<max_elements> <frozen 0|1>"`.

use super::kit::kernel;
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{BlobProto, TensorProto};
use crate::operator::{ArgDoc, InPlace, OpCx, OpDefCtx, OpSchema, Operator, ShapeInfo};
use crate::tensor::{DataType, Tensor};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Caffe2's type tag of a saved index.
pub const CAFFE2_INDEX_TYPE: &str = "std::unique_ptr<caffe2::IndexBase>";

/// The key dtypes an index can hold.
const KEY_TYPES: &[DataType] = &[DataType::Int32, DataType::Int64, DataType::String];

pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    vec![(CAFFE2_INDEX_TYPE, decode_index)]
}

pub fn schemas() -> Vec<OpSchema> {
    const MAX_ELEMENTS: &[ArgDoc] = &[arg!(
        "max_elements",
        "int",
        "2147483647",
        "the most ids the index hands out, counting the reserved id 0 (so at most max_elements - 1 keys)"
    )];
    const SKIP_FIRST: &[ArgDoc] = &[arg!(
        "skip_first_entry",
        "int",
        "0",
        "if set, the first key is skipped (a tensor aligned with an embedding whose row 0 is the unknown key)"
    )];
    vec![
        OpSchema::new("IntIndexCreate", create_index)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(MAX_ELEMENTS)
            .doc("Writes a new, empty index of int32 keys into the output (handle). Ids run from 1; 0 is reserved for unknown keys."),
        OpSchema::new("LongIndexCreate", create_index)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(MAX_ELEMENTS)
            .doc("Writes a new, empty index of int64 keys into the output (handle). Ids run from 1; 0 is reserved for unknown keys."),
        OpSchema::new("StringIndexCreate", create_index)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(MAX_ELEMENTS)
            .doc("Writes a new, empty index of string keys into the output (handle). Ids run from 1; 0 is reserved for unknown keys."),
        OpSchema::new("IndexGet", index_get)
            .inputs(2, 2)
            .outputs(1, 1)
            .infer(|_, ins, _| {
                let keys = crate::shapes::rules::known(ins, 1);
                Ok(vec![keys.map(|k| ShapeInfo::new(k.dims.clone(), DataType::Int64))])
            })
            .doc(
                "Inputs (handle, keys) -> indices: an int64 tensor of the keys' shape holding each key's id. A frozen \
                 index gives 0 for unknown keys; otherwise unknown keys get the next ids, in order of first appearance. \
                 If the new keys would pass max_elements, the op fails and the index is unchanged.",
            ),
        OpSchema::new("IndexLoad", index_load)
            .inputs(2, 2)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(|i, o| i == 0 && o == 0))
            .args(SKIP_FIRST)
            .doc(
                "Inputs (handle, items) -> handle (in place): replaces the index's keys by items, which get ids 1, 2, \
                 ... in order. Fails, leaving the index unchanged, if items repeat a key or hold more than \
                 max_elements keys. A frozen index stays frozen.",
            ),
        OpSchema::new("IndexStore", index_store)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Input handle -> items: a 1-D tensor of the index's keys in id order (items[0] has id 1)."),
        OpSchema::new("IndexFreeze", index_freeze)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(InPlace::Enforce(|i, o| i == 0 && o == 0))
            .doc("Freezes the index (in place): IndexGet then gives 0 for unknown keys instead of adding them."),
        OpSchema::new("IndexSize", index_size)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, _, _| Ok(vec![Some(ShapeInfo::new(vec![], DataType::Int64))]))
            .doc("Input handle -> an int64 scalar: the number of ids in use, counting the reserved id 0 (keys + 1)."),
    ]
}

// ------------------------------------------------------------- the index --

/// Keys in id order (key `keys[i]` has id `i + 1`) and the reverse map.
#[derive(Debug, Default)]
struct Dict<K> {
    keys: Vec<K>,
    ids: HashMap<K, i64>,
}

impl<K: Clone + Eq + Hash> Dict<K> {
    /// A dict of `keys` (ids 1, 2, ...), or the position of the first
    /// repeated key.
    fn from_keys(keys: &[K]) -> std::result::Result<Dict<K>, usize> {
        let mut ids = HashMap::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            if ids.insert(k.clone(), i as i64 + 1).is_some() {
                return Err(i);
            }
        }
        Ok(Dict {
            keys: keys.to_vec(),
            ids,
        })
    }

    /// The ids of `query`; unknown keys get 0 if `frozen`, else new ids,
    /// all or none: `Err(needed)` if the new keys would pass `max_elements`.
    fn get(
        &mut self,
        query: &[K],
        frozen: bool,
        max_elements: i64,
    ) -> std::result::Result<Vec<i64>, usize> {
        if frozen {
            return Ok(query
                .iter()
                .map(|k| self.ids.get(k).copied().unwrap_or(0))
                .collect());
        }
        let mut fresh: HashMap<&K, i64> = HashMap::new();
        let mut next = self.keys.len() as i64 + 1;
        let mut out = Vec::with_capacity(query.len());
        for k in query {
            let id = match self.ids.get(k) {
                Some(&id) => id,
                None => *fresh.entry(k).or_insert_with(|| {
                    next += 1;
                    next - 1
                }),
            };
            out.push(id);
        }
        if next > max_elements && !fresh.is_empty() {
            return Err(fresh.len());
        }
        let mut added: Vec<(&K, i64)> = fresh.into_iter().collect();
        added.sort_unstable_by_key(|&(_, id)| id);
        for (k, id) in added {
            self.keys.push(k.clone());
            self.ids.insert(k.clone(), id);
        }
        Ok(out)
    }
}

#[derive(Debug)]
enum Keys {
    I32(Dict<i32>),
    I64(Dict<i64>),
    Str(Dict<Vec<u8>>),
}

/// Applies `$body` to the dict of an index with `$d` bound to it and `$T`
/// to its key type.
macro_rules! with_dict {
    ($keys:expr, |$d:ident : $T:ident| $body:expr) => {
        match $keys {
            Keys::I32($d) => {
                #[allow(dead_code)]
                type $T = i32;
                $body
            }
            Keys::I64($d) => {
                #[allow(dead_code)]
                type $T = i64;
                $body
            }
            Keys::Str($d) => {
                #[allow(dead_code)]
                type $T = Vec<u8>;
                $body
            }
        }
    };
}

/// An index blob (Caffe2's `std::unique_ptr<IndexBase>`).
#[derive(Debug)]
pub struct Index {
    key_type: DataType,
    max_elements: i64,
    frozen: AtomicBool,
    keys: Mutex<Keys>,
}

impl Index {
    pub fn new(key_type: DataType, max_elements: i64) -> Result<Index> {
        let keys = match key_type {
            DataType::Int32 => Keys::I32(Dict::default()),
            DataType::Int64 => Keys::I64(Dict::default()),
            DataType::String => Keys::Str(Dict::default()),
            other => {
                return Err(Error::type_error(format!(
                    "an index holds keys of {}, not {}",
                    crate::tensor::dtype_choice(KEY_TYPES),
                    other.name()
                )))
            }
        };
        Ok(Index {
            key_type,
            max_elements,
            frozen: AtomicBool::new(false),
            keys: Mutex::new(keys),
        })
    }

    pub fn key_type(&self) -> DataType {
        self.key_type
    }
    pub fn max_elements(&self) -> i64 {
        self.max_elements
    }
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst)
    }
    /// Ids in use, counting the reserved 0 (Caffe2's `IndexBase::Size`).
    pub fn size(&self) -> i64 {
        with_dict!(&*self.keys.lock(), |d: T| d.keys.len() as i64 + 1)
    }

    fn wrong_keys(&self, got: DataType) -> Error {
        Error::type_error(format!(
            "wrong key type: the index holds {} keys but the keys tensor is {}",
            self.key_type.name(),
            got.name()
        ))
    }

    /// The ids of the keys in `t` (see `IndexGet`).
    pub fn get(&self, t: &Tensor) -> Result<Tensor> {
        if t.dtype() != self.key_type {
            return Err(self.wrong_keys(t.dtype()));
        }
        let frozen = self.is_frozen();
        let max = self.max_elements;
        let mut keys = self.keys.lock();
        let ids = with_dict!(&mut *keys, |d: T| {
            let a = t.array::<T>()?;
            let flat = crate::tensor::copy_array(a.view())?;
            let flat = flat
                .as_slice()
                .ok_or_else(|| Error::internal("a copied array is contiguous"))?;
            d.get(flat, frozen, max).map_err(|n| {
                Error::failed(format!(
                    "the index is full: {n} new key(s) would pass max_elements {max} (it holds {} keys, and id 0 is \
                     reserved); the index is unchanged",
                    d.keys.len()
                ))
            })?
        });
        Tensor::from_vec(t.shape(), ids)
    }

    /// Replaces the keys by those of `t`, skipping `skip` leading ones.
    pub fn load(&self, t: &Tensor, skip: usize) -> Result<()> {
        if t.dtype() != self.key_type {
            return Err(self.wrong_keys(t.dtype()));
        }
        if t.numel() < skip {
            return Err(Error::shape(
                "skip_first_entry is set but the items tensor is empty: there is no first entry to skip",
            ));
        }
        let n = t.numel() - skip;
        if n as i64 > self.max_elements {
            return Err(Error::invalid_arg(format!(
                "cannot load the index: {n} items are more than max_elements {}",
                self.max_elements
            )));
        }
        let fresh = with_dict!(&*self.keys.lock(), |_d: T| {
            let a = t.array::<T>()?;
            let flat = crate::tensor::copy_array(a.view())?;
            let flat = flat
                .as_slice()
                .ok_or_else(|| Error::internal("a copied array is contiguous"))?;
            let dict = Dict::<T>::from_keys(&flat[skip..]).map_err(|i| {
                Error::invalid_arg(format!(
                    "repeated elements found: item {} repeats an earlier one, so it cannot be loaded into the index",
                    i + skip
                ))
            })?;
            wrap_dict(dict)
        });
        *self.keys.lock() = fresh;
        Ok(())
    }

    /// The keys in id order, as a 1-D tensor.
    pub fn store(&self) -> Result<Tensor> {
        with_dict!(&*self.keys.lock(), |d: T| Tensor::from_vec(
            &[d.keys.len()],
            d.keys.clone()
        ))
    }
}

trait WrapDict: Sized {
    fn wrap(d: Dict<Self>) -> Keys;
}
impl WrapDict for i32 {
    fn wrap(d: Dict<i32>) -> Keys {
        Keys::I32(d)
    }
}
impl WrapDict for i64 {
    fn wrap(d: Dict<i64>) -> Keys {
        Keys::I64(d)
    }
}
impl WrapDict for Vec<u8> {
    fn wrap(d: Dict<Vec<u8>>) -> Keys {
        Keys::Str(d)
    }
}
fn wrap_dict<K: WrapDict>(d: Dict<K>) -> Keys {
    K::wrap(d)
}

impl BlobObject for Index {
    fn kind_name(&self) -> &'static str {
        "Index"
    }
    /// Caffe2's layout: the keys as a tensor, `"<max_elements> <frozen>"` as
    /// content.
    fn serialize(&self) -> Option<BlobProto> {
        let keys = self.keys.lock();
        let n = with_dict!(&*keys, |d: T| d.keys.len() as i64);
        let mut tensor = TensorProto {
            dims: vec![n],
            data_type: Some(self.key_type as i32),
            ..Default::default()
        };
        match &*keys {
            Keys::I32(d) => tensor.int32_data = d.keys.clone(),
            Keys::I64(d) => tensor.int64_data = d.keys.clone(),
            Keys::Str(d) => tensor.string_data = d.keys.clone(),
        }
        let content = format!("{} {}", self.max_elements, u8::from(self.is_frozen()));
        Some(BlobProto {
            r#type: Some(CAFFE2_INDEX_TYPE.to_string()),
            tensor: Some(tensor),
            content: Some(content.into_bytes()),
            ..Default::default()
        })
    }
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

/// Reads Caffe2's layout (see [`Index::serialize`]). A missing content
/// means no limit and not frozen, as Caffe2's reader defaulted.
fn decode_index(p: &BlobProto) -> Result<BlobValue> {
    let tp = p
        .tensor
        .as_ref()
        .ok_or_else(|| corrupt("a saved index has no tensor of keys"))?;
    let keys = crate::storage::tensor_from_proto(tp).map_err(|e| {
        corrupt(format!(
            "a saved index's keys cannot be read: {}",
            e.message
        ))
    })?;
    let content = p.content.as_deref().unwrap_or_default();
    let content =
        std::str::from_utf8(content).map_err(|_| corrupt("a saved index's content is not text"))?;
    let mut words = content.split_whitespace();
    let max_elements = match words.next() {
        None => i64::MAX,
        Some(w) => w.parse::<i64>().map_err(|_| {
            corrupt(format!(
                "a saved index's max_elements '{w}' is not an integer"
            ))
        })?,
    };
    let frozen = match words.next() {
        None | Some("0") => false,
        Some("1") => true,
        Some(w) => {
            return Err(corrupt(format!(
                "a saved index's frozen flag '{w}' is not 0 or 1"
            )))
        }
    };
    let index = Index::new(keys.dtype(), max_elements)
        .map_err(|e| corrupt(format!("a saved index cannot be read: {}", e.message)))?;
    index
        .load(&keys, 0)
        .map_err(|e| corrupt(format!("a saved index cannot be read: {}", e.message)))?;
    if frozen {
        index.freeze();
    }
    Ok(BlobValue::Object(Arc::new(index)))
}

// --------------------------------------------------------------- the ops --

fn index_of(cx: &OpCx<'_>) -> Result<Arc<Index>> {
    cx.input_blob(0)
        .read()
        .object::<Index>("Index")
        .map_err(|e| e.with_blob(&cx.io.input_names[0]))
}

fn create_index(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let key_type = match ctx.op_type() {
        "IntIndexCreate" => DataType::Int32,
        "LongIndexCreate" => DataType::Int64,
        _ => DataType::String,
    };
    let max_elements = ctx.args.int::<i32>("max_elements", i32::MAX)? as i64;
    if max_elements < 1 {
        return Err(ctx.bad_arg(format!(
            "max_elements must be >= 1 (it counts the reserved id 0), got {max_elements}"
        )));
    }
    Ok(kernel(move |cx| {
        let index = Index::new(key_type, max_elements)?;
        cx.output_blob(0).set(BlobValue::Object(Arc::new(index)));
        Ok(true)
    }))
}

fn index_get(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let index = index_of(cx)?;
        let ids = {
            let keys = cx.input_blob(1).read();
            let t = keys
                .tensor()
                .map_err(|e| e.with_blob(&cx.io.input_names[1]))?;
            index
                .get(t)
                .map_err(|e| e.with_blob(&cx.io.input_names[1]))?
        };
        cx.output_blob(0).set(BlobValue::Tensor(ids));
        Ok(true)
    }))
}

fn index_load(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let skip = usize::from(ctx.args.i64("skip_first_entry", 0)? != 0);
    Ok(kernel(move |cx| {
        let index = index_of(cx)?;
        let items = cx.input_blob(1).read();
        let t = items
            .tensor()
            .map_err(|e| e.with_blob(&cx.io.input_names[1]))?;
        index
            .load(t, skip)
            .map_err(|e| e.with_blob(&cx.io.input_names[1]))?;
        Ok(true)
    }))
}

fn index_store(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let keys = index_of(cx)?.store()?;
        cx.output_blob(0).set(BlobValue::Tensor(keys));
        Ok(true)
    }))
}

fn index_freeze(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        index_of(cx)?.freeze();
        Ok(true)
    }))
}

fn index_size(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let n = index_of(cx)?.size();
        cx.output_blob(0).set(BlobValue::Tensor(Tensor::scalar(n)));
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(t: &Tensor) -> Vec<i64> {
        t.array::<i64>().unwrap().iter().copied().collect()
    }

    #[test]
    fn get_adds_then_freezes() {
        let ix = Index::new(DataType::Int64, 5).unwrap();
        let q = Tensor::from_vec(&[4], vec![7i64, 9, 7, 3]).unwrap();
        assert_eq!(ids(&ix.get(&q).unwrap()), vec![1, 2, 1, 3]);
        assert_eq!(ix.size(), 4);
        ix.freeze();
        let q = Tensor::from_vec(&[3], vec![3i64, 11, 7]).unwrap();
        assert_eq!(ids(&ix.get(&q).unwrap()), vec![3, 0, 1]);
        assert_eq!(ix.size(), 4);
    }

    #[test]
    fn full_index_fails_unchanged() {
        // max_elements 3: ids 1 and 2 only.
        let ix = Index::new(DataType::Int32, 3).unwrap();
        let q = Tensor::from_vec(&[1], vec![10i32]).unwrap();
        assert_eq!(ids(&ix.get(&q).unwrap()), vec![1]);
        let q = Tensor::from_vec(&[3], vec![20i32, 30, 20]).unwrap();
        let e = ix.get(&q).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OperatorFailed);
        assert_eq!(ix.size(), 2);
        let q = Tensor::from_vec(&[2], vec![20i32, 20]).unwrap();
        assert_eq!(ids(&ix.get(&q).unwrap()), vec![2, 2]);
    }

    #[test]
    fn load_store_and_errors() {
        let ix = Index::new(DataType::String, 10).unwrap();
        let items =
            Tensor::from_vec(&[3], vec![b"pad".to_vec(), b"a".to_vec(), b"b".to_vec()]).unwrap();
        ix.load(&items, 1).unwrap();
        let st = ix.store().unwrap();
        assert_eq!(
            st.array::<Vec<u8>>().unwrap().as_slice().unwrap(),
            &[b"a".to_vec(), b"b".to_vec()]
        );
        let dup = Tensor::from_vec(&[2], vec![b"x".to_vec(), b"x".to_vec()]).unwrap();
        assert_eq!(
            ix.load(&dup, 0).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(ix.size(), 3, "a failed load leaves the index unchanged");
        let wrong = Tensor::from_vec(&[1], vec![1i64]).unwrap();
        assert_eq!(ix.get(&wrong).unwrap_err().kind, ErrorKind::Type);
        let empty = Tensor::from_vec::<Vec<u8>>(&[0], vec![]).unwrap();
        assert_eq!(ix.load(&empty, 1).unwrap_err().kind, ErrorKind::Shape);
    }

    #[test]
    fn round_trips_through_blob_proto() {
        let ix = Index::new(DataType::Int32, 8).unwrap();
        ix.load(&Tensor::from_vec(&[3], vec![5i32, 6, 4]).unwrap(), 0)
            .unwrap();
        ix.freeze();
        let p = ix.serialize().unwrap();
        assert_eq!(p.content.as_deref(), Some(&b"8 1"[..]));
        let back = decode_index(&p).unwrap();
        let back = back.object::<Index>("Index").unwrap();
        assert!(back.is_frozen());
        assert_eq!(back.max_elements(), 8);
        let q = Tensor::from_vec(&[2], vec![4i32, 9]).unwrap();
        assert_eq!(ids(&back.get(&q).unwrap()), vec![3, 0]);
    }
}
