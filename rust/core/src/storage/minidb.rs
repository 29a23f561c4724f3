//! `"minidb"`: Caffe2's record format (see the module docs of `storage`).

use super::*;

pub(super) fn minidb_put(w: &mut impl Write, path: &str, key: &str, value: &[u8]) -> Result<()> {
    minidb_put_raw(w, path, key.as_bytes(), value)
}

/// One record, its key any bytes (Caffe2's `Transaction::Put`).
fn minidb_put_raw(w: &mut impl Write, path: &str, key: &[u8], value: &[u8]) -> Result<()> {
    let (Ok(kl), Ok(vl)) = (i32::try_from(key.len()), i32::try_from(value.len())) else {
        return Err(Error::invalid_arg(format!(
            "a minidb record is limited to 2 GiB, the record '{}' has {} bytes (use a smaller chunk_size, or db_type 'ferro')",
            String::from_utf8_lossy(key),
            key.len() + value.len()
        )));
    };
    let io = io_error(path);
    w.write_all(&kl.to_ne_bytes()).map_err(&io)?;
    w.write_all(&vl.to_ne_bytes()).map_err(&io)?;
    w.write_all(key).map_err(&io)?;
    w.write_all(value).map_err(&io)
}

pub(super) fn write_minidb(
    w: &mut impl Write,
    path: &str,
    entries: &[(&str, Prepared<'_>)],
    opts: &SaveOptions,
) -> Result<()> {
    write_records(entries, opts, &mut |key, value| {
        minidb_put(w, path, key, value)
    })
}

/// Caffe2's key-value layout of blobs, shared by the record formats (minidb,
/// LevelDB): each value a serialized `BlobProto`; a tensor split into
/// records keyed `name#%<chunk>` (one segment each) unless chunking is off
/// for it, any other blob one record keyed by its name. `put` stores a record.
pub(super) fn write_records(
    entries: &[(&str, Prepared<'_>)],
    opts: &SaveOptions,
    put: &mut dyn FnMut(&str, &[u8]) -> Result<()>,
) -> Result<()> {
    for (name, p) in entries {
        let name = *name;
        let r = match p {
            Prepared::Tensor(t) => {
                let (chunk, bfloat16) = opts.for_blob(name)?;
                tensor_chunks(name, t, chunk, bfloat16, &mut |key, tp| {
                    let bp = BlobProto {
                        name: Some(name.to_string()),
                        r#type: Some(TENSOR_TAG.to_string()),
                        tensor: Some(tp),
                        ..Default::default()
                    };
                    put(&key, &bp.encode_to_vec())
                })
            }
            Prepared::Bytes(b) => {
                let bp = BlobProto {
                    name: Some(name.to_string()),
                    r#type: Some(STRING_TAG.to_string()),
                    content: Some(b.to_vec()),
                    ..Default::default()
                };
                put(name, &bp.encode_to_vec())
            }
            Prepared::Object { proto, .. } => {
                let mut bp = (**proto).clone();
                bp.name = Some(name.to_string());
                if let Some(t) = bp.tensor.as_mut() {
                    t.name = Some(name.to_string());
                }
                put(name, &bp.encode_to_vec())
            }
        };
        r.map_err(|e| e.with_blob(name))?;
    }
    Ok(())
}

/// One minidb record: its key, the blob name (the key up to `#%`) and the
/// value (`None` when not selected, then it was skipped, not read).
pub(super) struct MiniRecord {
    pub(super) key: String,
    pub(super) name: String,
    pub(super) value: Option<Vec<u8>>,
    pub(super) value_len: u64,
    /// Where the value starts in the file (0 for formats without one).
    pub(super) value_at: u64,
}

impl MiniRecord {
    /// A record read whole (a LevelDB entry): `value` kept if `keep`.
    pub(super) fn whole(key: String, value: Vec<u8>, keep: &dyn Fn(&str) -> bool) -> MiniRecord {
        let name = key[..key.find(CHUNK_SEPARATOR).unwrap_or(key.len())].to_string();
        let value_len = value.len() as u64;
        let value = keep(&name).then_some(value);
        MiniRecord {
            key,
            name,
            value,
            value_len,
            value_at: 0,
        }
    }
}

pub(super) fn read_exact_or_corrupt(
    r: &mut impl Read,
    buf: &mut [u8],
    path: &str,
    what: &dyn Fn() -> String,
) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(path, format!("the db is truncated: {}", what()))
        } else {
            Error::io(&e, path)
        }
    })
}

/// Reads the records of a minidb, the values of selected blobs only.
/// One minidb record's header at byte `pos` (record #`index`) of a file of
/// `len` bytes: the key and value lengths, every length checked against the
/// file.
fn minidb_header(
    r: &mut impl Read,
    path: &str,
    index: usize,
    pos: u64,
    len: u64,
) -> Result<(usize, usize)> {
    if len - pos < 8 {
        return Err(corrupt(
            path,
            format!("the db is truncated: record #{index} at byte {pos} is cut off (the file has {len} bytes)"),
        ));
    }
    let mut head = [0u8; 8];
    read_exact_or_corrupt(r, &mut head, path, &|| {
        format!("record #{index} at byte {pos} is cut off")
    })?;
    if pos == 0 && head == *FERRO_MAGIC {
        return Err(corrupt(
            path,
            "this is a ferrocaffe checkpoint, not a minidb: load it with db_type 'ferro'",
        ));
    }
    let kl = i32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
    let vl = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
    if kl < 0 || vl < 0 {
        return Err(corrupt(
            path,
            format!("record #{index} at byte {pos} has a negative length: the file is damaged or not a minidb"),
        ));
    }
    let need = 8 + kl as u64 + vl as u64;
    if need > len - pos {
        return Err(corrupt(
            path,
            format!(
                "the db is truncated: record #{index} at byte {pos} needs {need} bytes but the file ends {} bytes later",
                len - pos
            ),
        ));
    }
    Ok((kl as usize, vl as usize))
}

pub(super) fn read_minidb(path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<MiniRecord>> {
    let (file, meta) = open_regular(path).map_err(io_error(path))?;
    let len = meta.len();
    if len == 0 {
        return Err(corrupt(
            path,
            "the db file is empty (a minidb written by Save holds at least one record)",
        ));
    }
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < len {
        let index = out.len();
        let (kl, vl) = minidb_header(&mut r, path, index, pos, len)?;
        let mut key = vec![0u8; kl];
        read_exact_or_corrupt(&mut r, &mut key, path, &|| {
            format!("record #{index} at byte {pos} is cut off")
        })?;
        let key = String::from_utf8(key).map_err(|_| {
            corrupt(
                path,
                format!("record #{index} at byte {pos} has a key that is not UTF-8"),
            )
        })?;
        let name = key[..key.find(CHUNK_SEPARATOR).unwrap_or(key.len())].to_string();
        let value = if select(&name) {
            let mut v = vec![0u8; vl];
            read_exact_or_corrupt(&mut r, &mut v, path, &|| {
                format!("record #{index} ('{key}') is cut off")
            })?;
            Some(v)
        } else {
            r.seek_relative(vl as i64).map_err(io_error(path))?;
            None
        };
        out.push(MiniRecord {
            key,
            name,
            value,
            value_len: vl as u64,
            value_at: pos + 8 + kl as u64,
        });
        pos += 8 + (kl + vl) as u64;
    }
    Ok(out)
}

/// Every record of the minidb at `path` as it is stored, keys any bytes
/// (Caffe2's minidb cursor); an empty file is a db without records.
fn read_minidb_raw(path: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let (file, meta) = open_regular(path).map_err(io_error(path))?;
    let len = meta.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < len {
        let index = out.len();
        let (kl, vl) = minidb_header(&mut r, path, index, pos, len)?;
        let mut key = vec![0u8; kl];
        let mut value = vec![0u8; vl];
        read_exact_or_corrupt(&mut r, &mut key, path, &|| {
            format!("record #{index} at byte {pos} is cut off")
        })?;
        read_exact_or_corrupt(&mut r, &mut value, path, &|| {
            format!("record #{index} at byte {pos} is cut off")
        })?;
        out.push((key, value));
        pos += 8 + (kl + vl) as u64;
    }
    Ok(out)
}

/// The `len` bytes of a record's value at `at` in `file` (an indexed
/// minidb): a file cut short since it was indexed is a corrupt-db error
/// naming the record (`what`), a buffer that cannot be had `OutOfMemory`.
fn read_value_at(
    file: &File,
    path: &str,
    at: u64,
    len: usize,
    what: std::fmt::Arguments<'_>,
) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut v = crate::tensor::zeroed_vec::<u8>(&[len], "a minidb value")?;
    file.read_exact_at(&mut v, at).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            corrupt(
                path,
                format!("{what} is cut off: the file shrank after it was opened"),
            )
        } else {
            Error::io(&e, path)
        }
    })?;
    Ok(v)
}

/// A minidb's records indexed without their values (keys are any bytes),
/// each value read from the file when asked.
pub struct MiniDbKvCursor {
    path: String,
    file: File,
    /// (key, value offset, value length) of each record.
    index: Vec<(Vec<u8>, u64, usize)>,
}

impl MiniDbKvCursor {
    fn open(path: &str) -> Result<MiniDbKvCursor> {
        let (file, meta) = open_regular(path).map_err(io_error(path))?;
        let len = meta.len();
        let mut r = BufReader::with_capacity(1 << 16, file);
        let mut index = Vec::new();
        let mut pos: u64 = 0;
        while pos < len {
            let i = index.len();
            let (kl, vl) = minidb_header(&mut r, path, i, pos, len)?;
            let mut key = vec![0u8; kl];
            read_exact_or_corrupt(&mut r, &mut key, path, &|| {
                format!("record #{i} at byte {pos} is cut off")
            })?;
            let value_at = pos + 8 + kl as u64;
            // minidb_header checked that the record fits in the file.
            r.seek_relative(vl as i64).map_err(io_error(path))?;
            index.push((key, value_at, vl));
            pos = value_at + vl as u64;
        }
        let (file, _) = open_regular(path).map_err(io_error(path))?;
        Ok(MiniDbKvCursor {
            path: path.to_string(),
            file,
            index,
        })
    }
}

impl KvCursor for MiniDbKvCursor {
    fn len(&self) -> usize {
        self.index.len()
    }
    fn key(&self, i: usize) -> &[u8] {
        &self.index[i].0
    }
    fn value(&self, i: usize) -> Result<Vec<u8>> {
        let (_, at, len) = &self.index[i];
        read_value_at(
            &self.file,
            &self.path,
            *at,
            *len,
            format_args!("record #{i}"),
        )
    }
}

/// The records of one blob.
pub(super) enum MiniGroup {
    Tensor(Vec<TensorProto>, u64),
    Other(Box<BlobProto>, u64),
}

/// Parses and groups the selected records by blob name, in file order.
pub(super) fn group_minidb(
    path: &str,
    records: Vec<MiniRecord>,
) -> Result<Vec<(String, MiniGroup)>> {
    let mut groups: Vec<(String, MiniGroup)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for rec in records {
        let Some(value) = rec.value else { continue };
        let ctx = |e: Error| e.with_blob(&rec.name).with_file(path);
        let bp = BlobProto::decode(value.as_slice()).map_err(|e| {
            ctx(bad_data(format!(
                "cannot parse the record '{}' as a BlobProto: {e}",
                rec.key
            )))
        })?;
        let is_tensor = bp.r#type.as_deref() == Some(TENSOR_TAG);
        match at.get(&rec.name) {
            None => {
                let g = if is_tensor {
                    let t = bp.tensor.ok_or_else(|| {
                        ctx(bad_data(format!(
                            "the tensor record '{}' holds no tensor",
                            rec.key
                        )))
                    })?;
                    MiniGroup::Tensor(vec![t], rec.value_len)
                } else {
                    MiniGroup::Other(Box::new(bp), rec.value_len)
                };
                at.insert(rec.name.clone(), groups.len());
                groups.push((rec.name, g));
            }
            Some(&i) => match (&mut groups[i].1, is_tensor, bp.tensor) {
                (MiniGroup::Tensor(v, bytes), true, Some(t)) => {
                    v.push(t);
                    *bytes += rec.value_len;
                }
                _ => {
                    return Err(ctx(bad_data(format!(
                        "Blob duplicated: the db holds more than one record for '{}'",
                        rec.name
                    ))))
                }
            },
        }
    }
    Ok(groups)
}

pub(super) fn load_minidb(
    path: &str,
    select: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, BlobValue)>> {
    load_records(path, read_minidb(path, select)?)
}

/// The blobs of Caffe2 key-value records (minidb, LevelDB), in record order.
pub(super) fn load_records(
    path: &str,
    records: Vec<MiniRecord>,
) -> Result<Vec<(String, BlobValue)>> {
    let groups = group_minidb(path, records)?;
    let mut out = Vec::with_capacity(groups.len());
    for (name, g) in groups {
        let v = match g {
            MiniGroup::Tensor(chunks, _) => assemble_tensor(&chunks).map(BlobValue::Tensor),
            MiniGroup::Other(bp, _) => decode_object(&bp),
        };
        let v = v.map_err(|e| e.with_blob(&name).with_file(path))?;
        out.push((name, v));
    }
    Ok(out)
}

pub(super) fn list_minidb(path: &str) -> Result<Vec<EntryInfo>> {
    list_records(path, read_minidb(path, &|_| true)?)
}

/// What Caffe2 key-value records (minidb, LevelDB) hold.
pub(super) fn list_records(path: &str, records: Vec<MiniRecord>) -> Result<Vec<EntryInfo>> {
    let groups = group_minidb(path, records)?;
    let mut out = Vec::with_capacity(groups.len());
    for (name, g) in groups {
        let info = match g {
            MiniGroup::Tensor(chunks, bytes) => {
                let t = &chunks[0];
                let shape = t
                    .dims
                    .iter()
                    .map(|&d| usize::try_from(d))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|_| {
                        corrupt(path, format!("the tensor has negative dims {:?}", t.dims))
                            .with_blob(&name)
                    })?;
                EntryInfo {
                    name,
                    kind: EntryKind::Tensor,
                    type_tag: TENSOR_TAG.to_string(),
                    dtype: DataType::from_i32(t.data_type.unwrap_or(1)),
                    shape,
                    bytes,
                }
            }
            MiniGroup::Other(bp, bytes) => {
                let tag = bp.r#type.unwrap_or_default();
                let kind = if tag == STRING_TAG {
                    EntryKind::Bytes
                } else {
                    EntryKind::Object
                };
                EntryInfo {
                    name,
                    kind,
                    type_tag: tag,
                    dtype: None,
                    shape: vec![],
                    bytes,
                }
            }
        };
        out.push(info);
    }
    Ok(out)
}

/// A minidb read as Caffe2's key-value db: its records in file order, each
/// value read when asked for (a positioned read; the file stays open).
/// `TensorProtosDBInput`'s DB reader walks it.
pub struct MiniDbRecords {
    path: String,
    file: File,
    /// (key, value offset, value length) of each record.
    index: Vec<(String, u64, usize)>,
}

impl MiniDbRecords {
    /// Opens `path` and reads its record headers (the values are skipped).
    pub fn open(path: &str) -> Result<MiniDbRecords> {
        let records = read_minidb(path, &|_| false)?;
        let (file, _) = open_regular(path).map_err(io_error(path))?;
        let index = records
            .into_iter()
            .map(|r| (r.key, r.value_at, r.value_len as usize))
            .collect();
        Ok(MiniDbRecords {
            path: path.to_string(),
            file,
            index,
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The key of record `i` (`i < len()`).
    pub fn key(&self, i: usize) -> &str {
        &self.index[i].0
    }

    /// The value of record `i` (`i < len()`), read from the file now.
    pub fn value(&self, i: usize) -> Result<Vec<u8>> {
        let (key, at, len) = &self.index[i];
        read_value_at(
            &self.file,
            &self.path,
            *at,
            *len,
            format_args!("the record '{key}'"),
        )
    }
}

impl KvRecords for MiniDbRecords {
    fn path(&self) -> &str {
        MiniDbRecords::path(self)
    }
    fn len(&self) -> usize {
        MiniDbRecords::len(self)
    }
    fn key(&self, i: usize) -> &str {
        MiniDbRecords::key(self, i)
    }
    fn value(&self, i: usize) -> Result<Vec<u8>> {
        MiniDbRecords::value(self, i)
    }
}

/// One `TensorProto` (a whole tensor, not a chunk) as a tensor.
pub fn tensor_from_proto(tp: &TensorProto) -> Result<Tensor> {
    assemble_tensor(std::slice::from_ref(tp))
}

/// Caffe2's minidb format.
pub struct MiniDb;

impl DbFormat for MiniDb {
    fn name(&self) -> &'static str {
        "minidb"
    }
    fn about(&self) -> &'static str {
        "Caffe2's file format"
    }
    fn allows_chunk_separator(&self) -> bool {
        false
    }
    fn write(
        &self,
        w: &mut BufWriter<File>,
        path: &str,
        entries: &[(&str, Prepared<'_>)],
        opts: &SaveOptions,
    ) -> Result<()> {
        write_minidb(w, path, entries, opts)
    }
    fn load(&self, path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<(String, BlobValue)>> {
        load_minidb(path, select)
    }
    fn list(&self, path: &str) -> Result<Vec<EntryInfo>> {
        list_minidb(path)
    }
    /// A minidb has no checksums: it is fully decoded, so damaged numbers
    /// inside it go unnoticed.
    fn verify(&self, path: &str) -> Result<()> {
        load_minidb(path, &|_| true).map(|_| ())
    }
    fn records(&self, path: &str) -> Result<Box<dyn KvRecords>> {
        Ok(Box::new(MiniDbRecords::open(path)?))
    }
    /// A minidb has no checksums: a CRC-32 of the file stands in for them.
    fn checksum(&self, path: &str) -> Result<Option<u32>> {
        file_crc32(path).map(Some)
    }
    /// Keys are any bytes; an empty file is a db without records.
    fn read_kv(&self, path: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        read_minidb_raw(path)
    }
    fn write_kv(&self, path: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        write_atomically(path, |w| {
            records
                .iter()
                .try_for_each(|(k, v)| minidb_put_raw(w, path, k, v))
        })
    }
    fn kv_cursor(&self, path: &str) -> Result<Box<dyn KvCursor>> {
        Ok(Box::new(MiniDbKvCursor::open(path)?))
    }
}
