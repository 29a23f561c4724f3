//! Blobs: named, typed boxes that hold a tensor or a runtime object.
//!
//! A blob is shared (`Arc`) between the workspace that owns its name and every
//! op bound to it. Its content sits behind a `RwLock`, so concurrent instances
//! and report steps can touch the same blob without a data race (Caffe2 had no
//! lock here at all). Ops lock all their blobs in one global order (by id), so
//! in-place ops and overlapping ops never deadlock.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use parking_lot::RwLock;
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A runtime object stored in a blob (counter, mutex, queue, cursor, ...).
pub trait BlobObject: Any + Send + Sync + fmt::Debug {
    /// The kind's name, shown in errors ("Counter", "Mutex", ...).
    fn kind_name(&self) -> &'static str;

    /// The object as a Caffe2 `BlobProto` for Save, or `None` if this kind
    /// cannot be saved (Caffe2's "no known serializer"). Set `type` to the
    /// Caffe2 type tag and fill `tensor` and/or `content`; `name` (and the
    /// tensor's name) is filled in by the writer. Loading goes through the
    /// decoder registered for the tag with `storage::register_blob_codec`.
    fn serialize(&self) -> Option<crate::ir::BlobProto> {
        None
    }
}

/// What a blob holds.
#[derive(Clone, Debug, Default)]
pub enum BlobValue {
    /// Created but never written (Caffe2's blob with no type).
    #[default]
    Empty,
    Tensor(Tensor),
    /// A byte string blob (Caffe2's `std::string` blob), not a tensor.
    Bytes(Vec<u8>),
    Object(Arc<dyn BlobObject>),
}

impl BlobValue {
    /// The kind's name as used in messages.
    pub fn kind_name(&self) -> String {
        match self {
            BlobValue::Empty => "nothing (an empty blob)".to_string(),
            BlobValue::Tensor(t) => format!("Tensor<{}>", t.dtype()),
            BlobValue::Bytes(_) => "bytes".to_string(),
            BlobValue::Object(o) => o.kind_name().to_string(),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, BlobValue::Empty)
    }

    // Inlined (with the error out of line): kernels call these every run.
    #[inline]
    pub fn tensor(&self) -> Result<&Tensor> {
        match self {
            BlobValue::Tensor(t) => Ok(t),
            other => Err(other.not_a_tensor()),
        }
    }

    #[inline]
    pub fn tensor_mut(&mut self) -> Result<&mut Tensor> {
        match self {
            BlobValue::Tensor(t) => Ok(t),
            other => Err(other.not_a_tensor()),
        }
    }

    #[cold]
    pub(crate) fn not_a_tensor(&self) -> Error {
        Error::type_error(format!(
            "wrong kind of blob: it holds {} but a Tensor was expected",
            self.kind_name()
        ))
    }

    /// The object, borrowed, if it is of type `T`, else a `Type` error
    /// naming both kinds (like [`BlobValue::object`], without touching the
    /// object's reference count).
    pub fn object_ref<T: BlobObject>(&self, expected: &str) -> Result<&T> {
        if let BlobValue::Object(o) = self {
            let any: &dyn Any = &**o;
            if let Some(t) = any.downcast_ref::<T>() {
                return Ok(t);
            }
        }
        Err(Error::type_error(format!(
            "wrong kind of blob: it holds {} but a {} was expected",
            self.kind_name(),
            expected
        )))
    }

    /// The object if it is of type `T`, else a `Type` error naming both kinds.
    pub fn object<T: BlobObject>(&self, expected: &str) -> Result<Arc<T>> {
        if let BlobValue::Object(o) = self {
            let any: Arc<dyn Any + Send + Sync> = o.clone();
            if let Ok(t) = any.downcast::<T>() {
                return Ok(t);
            }
        }
        Err(Error::type_error(format!(
            "wrong kind of blob: it holds {} but a {} was expected",
            self.kind_name(),
            expected
        )))
    }
}

static NEXT_BLOB_ID: AtomicU64 = AtomicU64::new(1);

/// The shared cell behind a blob name.
pub struct BlobCell {
    id: u64,
    value: RwLock<BlobValue>,
}

impl fmt::Debug for BlobCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob#{}", self.id)
    }
}

impl BlobCell {
    pub fn new(value: BlobValue) -> Blob {
        Arc::new(BlobCell {
            id: NEXT_BLOB_ID.fetch_add(1, Ordering::Relaxed),
            value: RwLock::new(value),
        })
    }
    /// A process-unique id; ops lock their blobs in increasing id order.
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn read(&self) -> parking_lot::RwLockReadGuard<'_, BlobValue> {
        self.value.read()
    }
    pub fn write(&self) -> parking_lot::RwLockWriteGuard<'_, BlobValue> {
        self.value.write()
    }
    /// The write lock if nobody holds the blob right now.
    pub fn try_write(&self) -> Option<parking_lot::RwLockWriteGuard<'_, BlobValue>> {
        self.value.try_write()
    }
    /// A snapshot of the content.
    pub fn get(&self) -> BlobValue {
        self.value.read().clone()
    }
    pub fn set(&self, v: BlobValue) {
        *self.value.write() = v;
    }
}

pub type Blob = Arc<BlobCell>;

// ---------------------------------------------------------------- objects --

/// An atomic int64 counter (Caffe2's `Counter<int64_t>`).
#[derive(Debug)]
pub struct Counter(pub AtomicI64);

impl Counter {
    pub fn new(v: i64) -> Self {
        Counter(AtomicI64::new(v))
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl BlobObject for Counter {
    fn kind_name(&self) -> &'static str {
        "Counter"
    }
    /// Caffe2's counter serializer: an INT64 tensor of dims [1].
    fn serialize(&self) -> Option<crate::ir::BlobProto> {
        Some(crate::ir::BlobProto {
            r#type: Some("std::unique_ptr<Counter<int64_t>>".to_string()),
            tensor: Some(crate::ir::TensorProto {
                dims: vec![1],
                data_type: Some(crate::tensor::DataType::Int64 as i32),
                int64_data: vec![self.get()],
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// A mutex blob, used by AtomicIter, AtomicFetchAdd and AtomicAppend.
#[derive(Debug, Default)]
pub struct BlobMutex(pub parking_lot::Mutex<()>);

impl BlobObject for BlobMutex {
    fn kind_name(&self) -> &'static str {
        "Mutex"
    }
    /// Caffe2's mutex serializer: the type tag and empty content (a loaded
    /// mutex is a new, unlocked one).
    fn serialize(&self) -> Option<crate::ir::BlobProto> {
        Some(crate::ir::BlobProto {
            r#type: Some("std::unique_ptr<std::mutex>".to_string()),
            content: Some(Vec::new()),
            ..Default::default()
        })
    }
}

/// A wall-clock timer blob (TimerBegin/TimerEnd/TimerGet).
#[derive(Debug)]
pub struct Timer {
    pub name: String,
    pub start: parking_lot::Mutex<Option<Instant>>,
}

impl BlobObject for Timer {
    fn kind_name(&self) -> &'static str {
        "Timer"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_downcast_checks_kind() {
        let v = BlobValue::Object(Arc::new(Counter::new(3)));
        assert_eq!(v.object::<Counter>("Counter").unwrap().get(), 3);
        let e = v.object::<BlobMutex>("Mutex").unwrap_err();
        assert_eq!(
            e.message,
            "wrong kind of blob: it holds Counter but a Mutex was expected"
        );
        let e = BlobValue::Tensor(Tensor::scalar(1.0f32))
            .tensor()
            .map(|_| ())
            .and(v.tensor().map(|_| ()));
        assert!(e
            .unwrap_err()
            .message
            .contains("holds Counter but a Tensor"));
    }

    #[test]
    fn ids_are_unique() {
        let a = BlobCell::new(BlobValue::Empty);
        let b = BlobCell::new(BlobValue::Empty);
        assert_ne!(a.id(), b.id());
    }
}
