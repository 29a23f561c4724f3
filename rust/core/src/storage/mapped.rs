//! A ferro db held in memory (a memory map): checked in place.

use super::*;

/// Where a blob of a ferro db held in memory is, or its value (see
/// [`map_ferro`]).
#[derive(Clone, Debug)]
pub enum MappedData {
    /// A numeric or bool tensor, left where it is: its elements are
    /// `data[offset..offset + length]`, row-major and little-endian (bool: one
    /// byte each, 0 or 1). `offset` is a multiple of 64.
    InPlace {
        dtype: DataType,
        shape: Vec<usize>,
        offset: usize,
        length: usize,
    },
    /// A string tensor or a byte string, decoded (a copy; its CRC checked).
    Decoded(BlobValue),
    /// A runtime object (counter, mutex, cursor, ...): not decoded, since it
    /// has no form that can be mapped. `type_tag` is its Caffe2 type tag.
    Object { type_tag: String },
}

/// One blob of a ferro db held in memory, as found by [`map_ferro`].
#[derive(Clone, Debug)]
pub struct MappedBlob {
    pub name: String,
    pub data: MappedData,
}

/// Bytes checksummed between two looks at the cancellation token.
pub(super) const VERIFY_SLICE: usize = 16 << 20;

pub(super) fn check_payload_crc(
    path: &str,
    e: &IndexEntry,
    bytes: &[u8],
    cancel: &crate::cancel::CancelToken,
) -> Result<()> {
    let mut crc = crc32fast::Hasher::new();
    for piece in bytes.chunks(VERIFY_SLICE) {
        cancel.poll_check()?;
        crc.update(piece);
    }
    if crc.finalize() != e.crc {
        return Err(corrupt(
            path,
            format!("the data of blob '{}' is damaged (CRC mismatch)", e.name),
        )
        .with_blob(&e.name));
    }
    Ok(())
}

pub(super) fn check_zero_padding(path: &str, pad: &[u8], pos: u64) -> Result<()> {
    if pad.iter().any(|&b| b != 0) {
        return Err(corrupt(
            path,
            format!("the checkpoint is damaged: nonzero padding after byte {pos}"),
        ));
    }
    Ok(())
}

/// Checks a ferro db held in memory (`data`, typically a read-only memory
/// map of the file at `path`) and says where each blob is, in file order,
/// without copying numeric tensors.
///
/// Always checked, reading only the first and last pages and the index:
/// the header, the trailer and the index (their CRCs), and the layout (every
/// payload lies inside `data`, before the index, in order, with a length that
/// fits its dtype and shape). String tensors and byte strings are decoded, so
/// their CRCs are checked too. The payloads of numeric and bool tensors and of
/// objects are not read unless `verify` is set; then their CRCs, the zero
/// padding between payloads, that bool bytes are 0 or 1 and that objects
/// parse are checked too, reading every byte of `data` (`cancel` is polled
/// every 16 MiB).
///
/// Damage is a `CorruptCheckpoint` error naming `path` and, when it is in a
/// payload, the blob. A Caffe2 minidb is an `InvalidArgument` error: only
/// the ferro format lays tensors out so that they can be mapped.
pub fn map_ferro(
    path: &str,
    data: &[u8],
    verify: bool,
    cancel: &crate::cancel::CancelToken,
) -> Result<Vec<MappedBlob>> {
    let len = data.len() as u64;
    let head = &data[..data.len().min(HEADER_LEN as usize)];
    if head.len() >= 8 && head[..8] != FERRO_MAGIC[..] && looks_like_minidb(head, len) {
        return Err(Error::invalid_arg(
            "this file looks like a Caffe2 minidb; memory-mapped loading needs the 'ferro' format \
             (Save's default db_type): load it with a Load op and db_type 'minidb', or save it again as 'ferro'",
        )
        .with_file(path));
    }
    let version = check_header(path, head, len)?;
    let tr = check_trailer(path, &data[data.len() - TRAILER_LEN as usize..], len)?;
    // The trailer checked out, so the index lies inside `data`.
    let index_at = tr.index_offset as usize;
    let entries = parse_index(
        path,
        version,
        &data[index_at..index_at + tr.index_len as usize],
        &tr,
    )?;
    let mut out = Vec::with_capacity(entries.len());
    let mut pos = HEADER_LEN as usize;
    for e in &entries {
        // `check_layout` placed every payload in order between the header
        // and the index.
        let (offset, length) = (e.offset as usize, e.length as usize);
        let payload = &data[offset..offset + length];
        if verify {
            check_zero_padding(path, &data[pos..offset], pos as u64)?;
        }
        let bad = |msg: &str| corrupt(path, msg).with_blob(&e.name);
        let mapped = match (e.kind, ferro_dtype(e.dtype)) {
            (KIND_TENSOR, Some(dtype)) if item_size(dtype).is_some() => {
                if verify {
                    check_payload_crc(path, e, payload, cancel)?;
                    if dtype == DataType::Bool && payload.iter().any(|&b| b > 1) {
                        return Err(bad("a bool tensor holds a byte other than 0 or 1"));
                    }
                }
                MappedData::InPlace {
                    dtype,
                    shape: e.shape(),
                    offset,
                    length,
                }
            }
            (KIND_OBJECT, _) => {
                if verify {
                    check_payload_crc(path, e, payload, cancel)?;
                    let proto = BlobProto::decode(payload).map_err(|err| {
                        bad(&format!(
                            "cannot parse the saved object as a BlobProto: {err}"
                        ))
                    })?;
                    if proto.r#type.as_deref() != Some(e.tag.as_str()) {
                        return Err(bad("the saved object's type disagrees with the index"));
                    }
                }
                MappedData::Object {
                    type_tag: e.tag.clone(),
                }
            }
            _ => {
                check_payload_crc(path, e, payload, cancel)?;
                MappedData::Decoded(decode_payload(path, e, Cow::Borrowed(payload))?)
            }
        };
        out.push(MappedBlob {
            name: e.name.clone(),
            data: mapped,
        });
        pos = offset + length;
    }
    if verify {
        check_zero_padding(path, &data[pos..index_at], pos as u64)?;
    }
    Ok(out)
}
