//! The codecs of runtime objects (counters, mutexes, cursors, readers, ...),
//! keyed by Caffe2 type tag. Encoding is `BlobObject::serialize`; the
//! decoders of the op families' objects come from the composition root
//! (`crate::builtins::codecs`) when the table is first used.

use super::*;

/// Decodes a `BlobProto` of one Caffe2 type tag into a blob value.
pub type BlobDecoder = fn(&BlobProto) -> Result<BlobValue>;

pub(super) static CODECS: LazyLock<RwLock<HashMap<&'static str, BlobDecoder>>> =
    LazyLock::new(|| {
        let mut m: HashMap<&'static str, BlobDecoder> = HashMap::new();
        m.insert(COUNTER_TAG, decode_counter);
        m.insert(MUTEX_TAG, decode_mutex);
        m.insert(STRING_TAG, decode_string);
        m.extend(crate::builtins::codecs());
        RwLock::new(m)
    });

/// Registers (or replaces) the decoder of a Caffe2 type tag. Encoding goes
/// through [`BlobObject::serialize`](crate::blob::BlobObject::serialize),
/// whose `type` must be the same tag. Tensors (`"Tensor"`) are built in and
/// never looked up here.
///
/// The op families' codecs (each family's `codecs()`) are in the table
/// from its first use; this adds others.
pub fn register_blob_codec(type_tag: &'static str, decode: BlobDecoder) {
    CODECS.write().insert(type_tag, decode);
}

/// The type tags that have a decoder, sorted.
pub fn registered_codecs() -> Vec<&'static str> {
    let mut v: Vec<_> = CODECS.read().keys().copied().collect();
    v.sort_unstable();
    v
}

pub(super) fn decoder_for(tag: &str) -> Option<BlobDecoder> {
    CODECS.read().get(tag).copied()
}

pub(super) fn bad_object(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

pub(super) fn decode_counter(p: &BlobProto) -> Result<BlobValue> {
    let t = p
        .tensor
        .as_ref()
        .ok_or_else(|| bad_object("a saved counter has no tensor"))?;
    if t.dims != [1] {
        return Err(bad_object(format!(
            "a saved counter must have dims [1], got {:?}",
            t.dims
        )));
    }
    if t.data_type.unwrap_or(1) != crate::tensor::DataType::Int64 as i32 {
        return Err(bad_object("only int64 counters are supported"));
    }
    if t.int64_data.len() != 1 {
        return Err(bad_object(format!(
            "a saved counter must hold 1 value, got {}",
            t.int64_data.len()
        )));
    }
    Ok(BlobValue::Object(Arc::new(Counter::new(t.int64_data[0]))))
}

pub(super) fn decode_mutex(_: &BlobProto) -> Result<BlobValue> {
    Ok(BlobValue::Object(Arc::new(BlobMutex::default())))
}

pub(super) fn decode_string(p: &BlobProto) -> Result<BlobValue> {
    Ok(BlobValue::Bytes(p.content.clone().unwrap_or_default()))
}

/// Decodes a non-tensor `BlobProto` through the registry.
pub(super) fn decode_object(p: &BlobProto) -> Result<BlobValue> {
    let tag = p.r#type.as_deref().unwrap_or("");
    if let Some(n) = p.content_num_chunks {
        return Err(Error::type_error(format!(
            "blobs of type '{tag}' stored in {n} content chunks cannot be loaded by ferrocaffe"
        )));
    }
    let decode = decoder_for(tag).ok_or_else(|| {
        Error::type_error(format!(
            "no decoder is registered for the blob type '{tag}', so it cannot be loaded"
        ))
    })?;
    decode(p)
}
