//! `"ferro"`: the checked, aligned, mmap-ready format (see the module docs of
//! `storage`), and its parallel loader.

use super::direct::{self, Direct, DIRECT_ALIGN};
use super::mapped::check_zero_padding;
use super::*;
use std::mem::MaybeUninit;

pub(super) const FERRO_MAGIC: &[u8; 8] = b"FERROCKP";
pub(super) const FERRO_END_MAGIC: &[u8; 8] = b"FERROEND";
/// The version written. Version 1 (read too) placed every payload at a
/// multiple of [`ALIGN`]; version 2 places large numeric payloads on a page
/// ([`page_payload`]), so that they can be read with direct I/O.
pub(super) const FERRO_VERSION: u32 = 2;
/// The oldest version read.
pub(super) const FERRO_MIN_VERSION: u32 = 1;
pub(super) const HEADER_LEN: u64 = 64;
pub(super) const TRAILER_LEN: u64 = 48;
pub(super) const ALIGN: u64 = 64;
pub(super) const KIND_TENSOR: u8 = 1;
pub(super) const KIND_BYTES: u8 = 2;
pub(super) const KIND_OBJECT: u8 = 3;
/// The smallest index entry (empty name and tag, no dims).
pub(super) const MIN_ENTRY_LEN: u64 = 4 + 4 + 4 + 8 + 8 + 4 + 4;

pub(super) fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Where a version-2 file starts a large numeric payload: on a multiple of
/// this, the largest logical block size of common disks, so that the
/// payload can be read with `O_DIRECT` straight into page-aligned memory.
pub(super) const PAGE_ALIGN: u64 = 4096;
/// Numeric payloads of at least this many bytes start on a page in version
/// 2 (the global allocator puts blocks of this size on a page too:
/// `alloc::PAGE_MIN`); smaller ones at a multiple of [`ALIGN`].
pub(super) const PAGE_PAYLOAD_MIN: u64 = 1 << 20;

/// Whether a payload of `kind`, `dtype` and `length` starts on a page in a
/// file of `version`.
pub(super) fn page_payload(version: u32, kind: u8, dtype: u8, length: u64) -> bool {
    version >= 2
        && kind == KIND_TENSOR
        && ferro_dtype(dtype).and_then(item_size).is_some()
        && length >= PAGE_PAYLOAD_MIN
}

/// The offset at which a payload that follows byte `end` starts.
pub(super) fn payload_offset(version: u32, end: u64, kind: u8, dtype: u8, length: u64) -> u64 {
    if page_payload(version, kind, dtype, length) {
        end.div_ceil(PAGE_ALIGN) * PAGE_ALIGN
    } else {
        align_up(end)
    }
}

/// Plain numeric element types, written and read as raw bytes.
///
/// # Safety
/// Implemented only for primitive integers and floats: they have no padding
/// bytes and every bit pattern is a valid value, so a slice of them may be
/// viewed as bytes and filled from bytes (see `pod_bytes`, `spare_bytes`).
pub(super) unsafe trait Pod: Copy + Default + Send + Sync + 'static {
    /// Little-endian to native or back (the identity on little-endian hosts).
    fn swap_le(self) -> Self;
}

macro_rules! pod_int {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive integer (see `Pod`).
        unsafe impl Pod for $t {
            fn swap_le(self) -> Self {
                <$t>::from_le(self)
            }
        }
    )*};
}
crate::with_match_dtype!(impl integers, pod_int);

// SAFETY: a primitive float (see `Pod`).
unsafe impl Pod for f32 {
    fn swap_le(self) -> Self {
        f32::from_bits(u32::from_le(self.to_bits()))
    }
}

// SAFETY: a 16-bit float, a `u16` bit pattern inside (see `Pod`).
unsafe impl Pod for crate::tensor::f16 {
    fn swap_le(self) -> Self {
        crate::tensor::f16::from_bits(u16::from_le(self.to_bits()))
    }
}

// SAFETY: a primitive float (see `Pod`).
unsafe impl Pod for f64 {
    fn swap_le(self) -> Self {
        f64::from_bits(u64::from_le(self.to_bits()))
    }
}

/// The memory of a slice of numbers, as bytes (the write fast path).
pub(super) fn pod_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so all `size_of_val(s)` bytes are
    // initialized; `u8` has alignment 1; the view borrows `s`.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// Element size of a numeric dtype in the ferro format (`None` for strings).
pub(super) fn item_size(dt: DataType) -> Option<u64> {
    if dt == DataType::Bool {
        return Some(1); // one byte, 0 or 1
    }
    // float16: an IEEE 754 half, little-endian.
    crate::with_match_dtype!(pod dt, |T| Some(std::mem::size_of::<T>() as u64),
        else _other => None)
}

/// A tensor dtype the ferro format stores.
pub(super) fn ferro_dtype(code: u8) -> Option<DataType> {
    let dt = DataType::from_i32(i32::from(code))?;
    (item_size(dt).is_some() || dt == DataType::String).then_some(dt)
}

pub(super) struct IndexEntry {
    pub(super) name: String,
    pub(super) kind: u8,
    pub(super) dtype: u8,
    pub(super) dims: Vec<u64>,
    pub(super) offset: u64,
    pub(super) length: u64,
    pub(super) crc: u32,
    pub(super) tag: String,
}

impl IndexEntry {
    pub(super) fn shape(&self) -> Vec<usize> {
        // Checked when the index was read (the product fits the file).
        self.dims.iter().map(|&d| d as usize).collect()
    }
    /// `None` on overflow (a damaged index).
    pub(super) fn checked_numel(&self) -> Option<u64> {
        if self.dims.contains(&0) {
            return Some(0);
        }
        self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
    /// Checked by `check_layout`.
    pub(super) fn numel(&self) -> u64 {
        self.checked_numel().unwrap_or(0)
    }
}

pub(super) fn encode_index(entries: &[IndexEntry]) -> Vec<u8> {
    let mut b = Vec::new();
    for e in entries {
        b.extend_from_slice(&(e.name.len() as u32).to_le_bytes());
        b.extend_from_slice(e.name.as_bytes());
        b.push(e.kind);
        b.push(e.dtype);
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&(e.dims.len() as u32).to_le_bytes());
        for d in &e.dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&e.offset.to_le_bytes());
        b.extend_from_slice(&e.length.to_le_bytes());
        b.extend_from_slice(&e.crc.to_le_bytes());
        b.extend_from_slice(&(e.tag.len() as u32).to_le_bytes());
        b.extend_from_slice(e.tag.as_bytes());
    }
    b
}

pub(super) fn ferro_header(version: u32) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(FERRO_MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    // [12, 16) flags and [16, 60) reserved stay zero.
    let crc = crc32fast::hash(&h[..60]);
    h[60..64].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Counts what it writes; payload writes also feed a CRC.
pub(super) struct Sink<'w, W: Write> {
    pub(super) w: &'w mut W,
    pub(super) pos: u64,
    pub(super) path: &'w str,
}

impl<W: Write> Sink<'_, W> {
    pub(super) fn put(&mut self, b: &[u8]) -> Result<()> {
        self.w.write_all(b).map_err(io_error(self.path))?;
        self.pos += b.len() as u64;
        Ok(())
    }
    pub(super) fn put_crc(&mut self, crc: &mut crc32fast::Hasher, b: &[u8]) -> Result<()> {
        crc.update(b);
        self.put(b)
    }
    pub(super) fn pad(&mut self) -> Result<()> {
        self.pad_to(align_up(self.pos))
    }
    pub(super) fn pad_to(&mut self, offset: u64) -> Result<()> {
        let n = (offset - self.pos) as usize;
        self.put(&[0u8; PAGE_ALIGN as usize][..n])
    }
}

/// Bytes read (then checksummed) at a time when loading a payload: small
/// enough to stay in the L2 cache for the CRC, and as large as the reader's
/// buffer, so that reads go straight into the tensor.
pub(super) const READ_SLICE: usize = 1 << 20;

/// Elements converted per staging buffer on the portable paths.
pub(super) const STAGE: usize = 1 << 16;

pub(super) fn write_pod<T: Pod, W: Write>(
    s: &mut Sink<'_, W>,
    crc: &mut crc32fast::Hasher,
    a: &ArrayD<T>,
) -> Result<()> {
    if cfg!(target_endian = "little") {
        if let Some(sl) = a.as_slice() {
            // Fast path: straight from the tensor's memory.
            return s.put_crc(crc, pod_bytes(sl));
        }
    }
    let mut buf: Vec<T> = Vec::with_capacity(STAGE.min(a.len()));
    for &x in a.iter() {
        buf.push(x.swap_le());
        if buf.len() == STAGE {
            s.put_crc(crc, pod_bytes(&buf))?;
            buf.clear();
        }
    }
    s.put_crc(crc, pod_bytes(&buf))
}

pub(super) fn write_tensor_payload<W: Write>(
    s: &mut Sink<'_, W>,
    crc: &mut crc32fast::Hasher,
    t: &Tensor,
) -> Result<()> {
    crate::with_match_dtype!(tensor pod t, |a: T| write_pod(s, crc, a), else
    Tensor::Bool(a) => {
        let mut buf: Vec<u8> = Vec::with_capacity(STAGE.min(a.len()));
        for &x in a.iter() {
            buf.push(u8::from(x));
            if buf.len() == STAGE {
                s.put_crc(crc, &buf)?;
                buf.clear();
            }
        }
        s.put_crc(crc, &buf)
    },
    Tensor::Str(a) => {
        for x in a.iter() {
            s.put_crc(crc, &(x.len() as u64).to_le_bytes())?;
            s.put_crc(crc, x)?;
        }
        Ok(())
    })
}

pub(super) fn write_ferro(
    w: &mut impl Write,
    path: &str,
    entries: &[(&str, Prepared<'_>)],
) -> Result<()> {
    write_ferro_version(w, path, entries, FERRO_VERSION)
}

/// Writes a file of `version` (older versions: for the tests that read them).
pub(super) fn write_ferro_version(
    w: &mut impl Write,
    path: &str,
    entries: &[(&str, Prepared<'_>)],
    version: u32,
) -> Result<()> {
    let mut s = Sink { w, pos: 0, path };
    s.put(&ferro_header(version))?;
    let mut index = Vec::with_capacity(entries.len());
    for (name, p) in entries {
        if let Prepared::Tensor(t) = p {
            let size = item_size(t.dtype()).map_or(0, |n| n.saturating_mul(t.numel() as u64));
            s.pad_to(payload_offset(
                version,
                s.pos,
                KIND_TENSOR,
                t.dtype() as i32 as u8,
                size,
            ))?;
        } else {
            s.pad()?;
        }
        let offset = s.pos;
        let mut crc = crc32fast::Hasher::new();
        let (kind, dtype, dims, tag) = match p {
            Prepared::Tensor(t) => {
                write_tensor_payload(&mut s, &mut crc, t).map_err(|e| e.with_blob(name))?;
                (
                    KIND_TENSOR,
                    t.dtype() as i32 as u8,
                    t.shape().iter().map(|&d| d as u64).collect(),
                    String::new(),
                )
            }
            Prepared::Bytes(b) => {
                s.put_crc(&mut crc, b)?;
                (KIND_BYTES, 0, vec![], String::new())
            }
            Prepared::Object { tag, proto } => {
                s.put_crc(&mut crc, &proto.encode_to_vec())?;
                (KIND_OBJECT, 0, vec![], tag.clone())
            }
        };
        let length = s.pos - offset;
        index.push(IndexEntry {
            name: name.to_string(),
            kind,
            dtype,
            dims,
            offset,
            length,
            crc: crc.finalize(),
            tag,
        });
    }
    s.pad()?;
    let index_offset = s.pos;
    let bytes = encode_index(&index);
    s.put(&bytes)?;
    let file_len = s.pos + TRAILER_LEN;
    let mut t = [0u8; TRAILER_LEN as usize];
    t[0..8].copy_from_slice(&index_offset.to_le_bytes());
    t[8..16].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    t[16..24].copy_from_slice(&(index.len() as u64).to_le_bytes());
    t[24..32].copy_from_slice(&file_len.to_le_bytes());
    t[32..36].copy_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    let tcrc = crc32fast::hash(&t[..36]);
    t[36..40].copy_from_slice(&tcrc.to_le_bytes());
    t[40..48].copy_from_slice(FERRO_END_MAGIC);
    s.put(&t)
}

pub(super) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(super) fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A bounds-checked reader over the index bytes.
pub(super) struct Cursor<'b> {
    pub(super) b: &'b [u8],
    pub(super) at: usize,
}

impl<'b> Cursor<'b> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len())?;
        let s = &self.b[self.at..end];
        self.at = end;
        Some(s)
    }
    pub(super) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    pub(super) fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|s| le_u32(s, 0))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|s| le_u64(s, 0))
    }
    pub(super) fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    pub(super) fn entry(&mut self) -> Option<IndexEntry> {
        let name = self.string()?;
        let kind = self.u8()?;
        let dtype = self.u8()?;
        if self.u16()? != 0 {
            return None;
        }
        let ndim = self.u32()? as usize;
        if ndim > (self.b.len() - self.at) / 8 {
            return None;
        }
        let dims = (0..ndim).map(|_| self.u64()).collect::<Option<Vec<_>>>()?;
        let offset = self.u64()?;
        let length = self.u64()?;
        let crc = self.u32()?;
        let tag = self.string()?;
        Some(IndexEntry {
            name,
            kind,
            dtype,
            dims,
            offset,
            length,
            crc,
            tag,
        })
    }
}

/// An open ferro checkpoint whose header, trailer, index and layout checked
/// out; the reader is positioned after the header.
pub(super) struct FerroFile {
    pub(super) r: BufReader<File>,
    pub(super) entries: Vec<IndexEntry>,
    pub(super) index_offset: u64,
}

/// Whether the first bytes look like a minidb record (for a better message).
pub(super) fn looks_like_minidb(head: &[u8], len: u64) -> bool {
    if head.len() < 8 {
        return false;
    }
    let kl = i32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
    let vl = i32::from_ne_bytes([head[4], head[5], head[6], head[7]]);
    kl >= 0 && vl >= 0 && 8 + kl as u64 + vl as u64 <= len
}

/// What a ferro file's trailer says (once checked).
pub(super) struct Trailer {
    pub(super) index_offset: u64,
    pub(super) index_len: u64,
    pub(super) count: u64,
    pub(super) index_crc: u32,
}

/// Checks a ferro file's header: `head` is its first `min(len, 64)` bytes,
/// `len` its length.
/// Returns the file's format version.
pub(super) fn check_header(path: &str, head: &[u8], len: u64) -> Result<u32> {
    if len == 0 {
        return Err(corrupt(path, "the checkpoint file is empty"));
    }
    let n = head.len();
    if n < 8 || head[..8] != FERRO_MAGIC[..] {
        let msg = if looks_like_minidb(head, len) {
            "not a ferrocaffe checkpoint (bad magic); it looks like a Caffe2 minidb: load it with db_type 'minidb'"
        } else {
            "not a ferrocaffe checkpoint (bad magic): the file is damaged or of another format"
        };
        return Err(corrupt(path, msg));
    }
    if len < HEADER_LEN + TRAILER_LEN {
        return Err(corrupt(
            path,
            format!(
                "the checkpoint is truncated: it has {len} bytes, the smallest checkpoint has {}",
                HEADER_LEN + TRAILER_LEN
            ),
        ));
    }
    if crc32fast::hash(&head[..60]) != le_u32(head, 60) {
        return Err(corrupt(
            path,
            "the checkpoint's header is damaged (CRC mismatch)",
        ));
    }
    let version = le_u32(head, 8);
    if !(FERRO_MIN_VERSION..=FERRO_VERSION).contains(&version) {
        return Err(corrupt(
            path,
            format!(
                "the checkpoint has format version {version}; this build of ferrocaffe reads versions {FERRO_MIN_VERSION} to {FERRO_VERSION}"
            ),
        ));
    }
    if head[12..60].iter().any(|&b| b != 0) {
        return Err(corrupt(path, "the checkpoint's header has unknown flags"));
    }
    Ok(version)
}

/// Checks a ferro file's trailer (its last 48 bytes; the header checked out,
/// so the file has at least 112 bytes) against the file length.
pub(super) fn check_trailer(path: &str, t: &[u8], len: u64) -> Result<Trailer> {
    if t[40..48] != FERRO_END_MAGIC[..] {
        return Err(corrupt(
            path,
            format!("the checkpoint is truncated or damaged: its trailer is missing (the file has {len} bytes)"),
        ));
    }
    if crc32fast::hash(&t[..36]) != le_u32(t, 36) {
        return Err(corrupt(
            path,
            "the checkpoint's trailer is damaged (CRC mismatch)",
        ));
    }
    let (index_offset, index_len, count, file_len) =
        (le_u64(t, 0), le_u64(t, 8), le_u64(t, 16), le_u64(t, 24));
    if file_len != len {
        return Err(corrupt(
            path,
            format!("the checkpoint is truncated or extended: it should have {file_len} bytes, the file has {len}"),
        ));
    }
    let consistent = index_offset >= HEADER_LEN
        && index_offset % ALIGN == 0
        && index_offset
            .checked_add(index_len)
            .and_then(|x| x.checked_add(TRAILER_LEN))
            == Some(len)
        && count <= index_len / MIN_ENTRY_LEN;
    if !consistent {
        return Err(corrupt(
            path,
            "the checkpoint's trailer is inconsistent with the file",
        ));
    }
    Ok(Trailer {
        index_offset,
        index_len,
        count,
        index_crc: le_u32(t, 32),
    })
}

/// Checks and parses the index bytes the trailer points at, and the layout
/// they describe.
pub(super) fn parse_index(
    path: &str,
    version: u32,
    index: &[u8],
    tr: &Trailer,
) -> Result<Vec<IndexEntry>> {
    if crc32fast::hash(index) != tr.index_crc {
        return Err(corrupt(
            path,
            "the checkpoint's index is damaged (CRC mismatch)",
        ));
    }
    let mut c = Cursor { b: index, at: 0 };
    let mut entries = Vec::with_capacity(tr.count as usize);
    for i in 0..tr.count {
        let e = c.entry().ok_or_else(|| {
            corrupt(
                path,
                format!("the checkpoint's index entry #{i} is malformed"),
            )
        })?;
        entries.push(e);
    }
    if c.at != index.len() {
        return Err(corrupt(path, "the checkpoint's index has trailing bytes"));
    }
    check_layout(path, version, &entries, tr.index_offset)?;
    Ok(entries)
}

pub(super) fn open_ferro(path: &str) -> Result<FerroFile> {
    let (file, meta) = open_regular(path).map_err(io_error(path))?;
    let len = meta.len();
    // Positioned reads of just the header, trailer and index (a buffered
    // reader would read a megabyte of payloads into the page cache, which
    // a direct Load then reads again).
    let mut head = [0u8; HEADER_LEN as usize];
    let n = len.min(HEADER_LEN) as usize;
    read_exact_at(&file, &mut head[..n], 0).map_err(io_error(path))?;
    let version = check_header(path, &head[..n], len)?;
    let mut t = [0u8; TRAILER_LEN as usize];
    read_exact_at(&file, &mut t, len - TRAILER_LEN).map_err(io_error(path))?;
    let tr = check_trailer(path, &t, len)?;
    let mut index = vec![0u8; tr.index_len as usize];
    read_exact_at(&file, &mut index, tr.index_offset).map_err(io_error(path))?;
    let entries = parse_index(path, version, &index, &tr)?;
    let mut r = BufReader::with_capacity(1 << 20, file);
    r.seek(SeekFrom::Start(HEADER_LEN))
        .map_err(io_error(path))?;
    Ok(FerroFile {
        r,
        entries,
        index_offset: tr.index_offset,
    })
}

/// Payloads are packed in index order before the index, each at the first
/// 64-byte boundary after the previous one (the first page boundary for a
/// large numeric payload of a version-2 file), names are unique, and every
/// length fits its kind, dtype and shape.
pub(super) fn check_layout(
    path: &str,
    version: u32,
    entries: &[IndexEntry],
    index_offset: u64,
) -> Result<()> {
    let mut end = HEADER_LEN;
    let mut names = HashSet::new();
    for e in entries {
        let bad = |msg: String| corrupt(path, msg).with_blob(&e.name);
        if !names.insert(e.name.as_str()) {
            return Err(bad(format!(
                "the blob '{}' appears twice in the checkpoint",
                e.name
            )));
        }
        if e.offset != payload_offset(version, end, e.kind, e.dtype, e.length)
            || e.offset
                .checked_add(e.length)
                .is_none_or(|x| x > index_offset)
        {
            return Err(bad(format!(
                "the index places blob '{}' at an impossible offset",
                e.name
            )));
        }
        end = e.offset + e.length;
        let ok = match e.kind {
            KIND_TENSOR => match ferro_dtype(e.dtype) {
                None => false,
                Some(dt) => match (e.checked_numel(), item_size(dt)) {
                    (None, _) => false,
                    (Some(n), Some(size)) => n.checked_mul(size) == Some(e.length),
                    (Some(n), None) => n.checked_mul(8).is_some_and(|min| min <= e.length),
                },
            },
            KIND_BYTES => e.dtype == 0 && e.dims.is_empty(),
            KIND_OBJECT => e.dtype == 0 && e.dims.is_empty() && !e.tag.is_empty(),
            _ => false,
        };
        if !ok {
            return Err(bad(format!(
                "the index entry of blob '{}' is inconsistent",
                e.name
            )));
        }
    }
    if align_up(end) != index_offset {
        return Err(corrupt(
            path,
            "the checkpoint's index does not follow its last blob",
        ));
    }
    Ok(())
}

impl FerroFile {
    /// Reads and checks the zero padding before `offset` (the reader is at `pos`).
    pub(super) fn padding(&mut self, path: &str, pos: u64, offset: u64) -> Result<()> {
        let mut pad = [0u8; PAGE_ALIGN as usize];
        let pad = &mut pad[..(offset - pos) as usize];
        read_exact_or_corrupt(&mut self.r, pad, path, &|| {
            format!("the file ends inside padding at byte {pos}")
        })?;
        if pad.iter().any(|&b| b != 0) {
            return Err(corrupt(
                path,
                format!("the checkpoint is damaged: nonzero padding after byte {pos}"),
            ));
        }
        Ok(())
    }

    /// Reads one payload into a fresh buffer and checks its CRC.
    pub(super) fn payload_bytes(&mut self, path: &str, e: &IndexEntry) -> Result<Vec<u8>> {
        let mut v = crate::tensor::default_buffer::<u8>(e.length as usize, "a blob's payload")
            .map_err(|err| err.with_blob(&e.name))?;
        read_exact_or_corrupt(&mut self.r, &mut v, path, &|| cut_off(e))
            .map_err(|err| err.with_blob(&e.name))?;
        check_crc(path, e, crc32fast::hash(&v))?;
        Ok(v)
    }
}

pub(super) fn cut_off(e: &IndexEntry) -> String {
    format!("the data of blob '{}' is cut off", e.name)
}

pub(super) fn check_crc(path: &str, e: &IndexEntry, crc: u32) -> Result<()> {
    if crc != e.crc {
        return Err(corrupt(
            path,
            format!("the data of blob '{}' is damaged (CRC mismatch)", e.name),
        )
        .with_blob(&e.name));
    }
    Ok(())
}

// ------------------------------------------------------ parallel loading --

/// Where a loaded payload goes: a numeric tensor's own buffer (read into
/// in place), or bytes to decode. Each vector is empty, with exactly the
/// payload's capacity, until every byte was read ([`Dest::set_read`]).
pub(super) enum Dest {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    U16(Vec<u16>),
    F16(Vec<crate::tensor::f16>),
    Raw(Vec<u8>),
}

macro_rules! each_dest {
    ($d:expr, $v:ident => $body:expr, raw $r:ident => $raw:expr) => {
        crate::with_match_dtype!(enum Dest, pod $d, |$v: _T| $body, else Dest::Raw($r) => $raw)
    };
}

/// An empty vector with room for exactly `n` elements, advised to use huge
/// pages when large. Not zeroed: the reads write every byte before the
/// elements exist ([`Dest::set_read`]), so memory the allocator reuses is
/// not touched twice, and fresh memory is faulted in by the read itself
/// (zeroing it first, as `calloc` would for a reused heap chunk, doubled
/// the writes of a load).
fn uninit_buffer<T>(n: usize, what: String) -> Result<Vec<T>> {
    let v: Vec<T> = crate::tensor::try_vec(n, what)?;
    crate::tensor::advise_huge_pages(
        v.as_ptr().cast(),
        n.saturating_mul(std::mem::size_of::<T>()),
    );
    Ok(v)
}

/// The spare capacity of `v` as bytes (not yet initialised).
fn spare_bytes<T: Pod>(v: &mut Vec<T>) -> &mut [MaybeUninit<u8>] {
    let spare = v.spare_capacity_mut();
    let len = std::mem::size_of_val(spare);
    // SAFETY: any T's storage can be viewed as bytes that may be
    // uninitialised (MaybeUninit<u8> has no validity requirement and
    // alignment 1); the slice covers exactly the spare capacity, borrowed
    // mutably from `v`.
    unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<MaybeUninit<u8>>(), len) }
}

impl Dest {
    /// A buffer for entry `e`: numeric tensors get memory advised to be
    /// huge (4 KiB page faults cost as much as the copy itself).
    /// Allocation failure is an error naming the blob, never an abort.
    pub(super) fn for_entry(e: &IndexEntry) -> Result<Dest> {
        let n = e.numel() as usize;
        let what = || format!("the payload of blob '{}'", e.name);
        macro_rules! buf {
            ($t:ty) => {
                uninit_buffer::<$t>(n, what()).map_err(|err| err.with_blob(&e.name))?
            };
        }
        let raw = || -> Result<Dest> {
            Ok(Dest::Raw(
                uninit_buffer::<u8>(e.length as usize, what())
                    .map_err(|err| err.with_blob(&e.name))?,
            ))
        };
        Ok(match (e.kind, ferro_dtype(e.dtype)) {
            (KIND_TENSOR, Some(dt)) => {
                crate::with_match_dtype!(wrap Dest, pod dt, |T| buf!(T), else _ => raw()?)
            }
            _ => raw()?,
        })
    }

    /// The bytes to read into: the whole (uninitialised) capacity.
    pub(super) fn bytes_mut(&mut self) -> &mut [MaybeUninit<u8>] {
        each_dest!(self, v => spare_bytes(v), raw r => spare_bytes(r))
    }

    /// Marks every element as read.
    ///
    /// # Safety
    /// Every byte of [`Dest::bytes_mut`] must have been written.
    pub(super) unsafe fn set_read(&mut self) {
        // SAFETY: the capacity is initialised (the caller's promise), and
        // every bit pattern is a valid Pod number.
        each_dest!(self, v => unsafe { v.set_len(v.capacity()) }, raw r => unsafe { r.set_len(r.capacity()) })
    }

    /// The value, once every byte was read and the CRC checked.
    pub(super) fn into_value(self, path: &str, e: &IndexEntry) -> Result<BlobValue> {
        fn arr<T: Pod>(e: &IndexEntry, mut v: Vec<T>) -> Result<ArrayD<T>> {
            if cfg!(target_endian = "big") {
                for x in &mut v {
                    *x = x.swap_le();
                }
            }
            ArrayD::from_shape_vec(ndarray::IxDyn(&e.shape()), v)
                .map_err(|err| Error::internal(err.to_string()))
        }
        Ok(BlobValue::Tensor(
            each_dest!(self, v => Tensor::from(arr(e, v)?),
            raw r => return decode_payload(path, e, Cow::Owned(r))),
        ))
    }
}

/// Payload bytes read by one worker at a time: large payloads are split so
/// that both halves of a big tensor load in parallel.
pub(super) const LOAD_PIECE: usize = 8 << 20;

/// A piece of a payload to read: its place in the file and in the buffer,
/// and, once read, its CRC (combined in order per blob).
pub(super) struct Piece<'a> {
    pub(super) entry: usize,
    pub(super) at: u64,
    pub(super) dst: &'a mut [MaybeUninit<u8>],
    pub(super) crc: crc32fast::Hasher,
    pub(super) result: Result<()>,
}

/// Reads a piece with positioned reads, in slices checksummed while they
/// are still in the cache; a piece that is mostly not in the page cache is
/// read with direct I/O when it can be (`storage::direct`), then checksummed.
/// On success every byte of `p.dst` was written.
pub(super) fn read_piece(
    file: &File,
    direct: Option<&Direct>,
    path: &str,
    e: &IndexEntry,
    p: &mut Piece<'_>,
) -> Result<()> {
    let mut at = p.at;
    let mut rest = &mut p.dst[..];
    let whole = rest.len() / DIRECT_ALIGN * DIRECT_ALIGN;
    if let Some(d) = direct {
        if whole > 0
            && at % DIRECT_ALIGN as u64 == 0
            && rest.as_ptr() as usize % DIRECT_ALIGN == 0
            && !d.mostly_cached(at, whole)
        {
            let n = d.read(&mut rest[..whole], at);
            let (read, tail) = rest.split_at_mut(n);
            // SAFETY: `Direct::read` wrote the first `n` bytes.
            let read = unsafe { std::slice::from_raw_parts(read.as_ptr().cast::<u8>(), n) };
            p.crc.update(read);
            at += n as u64;
            rest = tail;
        }
    }
    for slice in rest.chunks_mut(READ_SLICE) {
        let read = read_exact_at_uninit(file, slice, at).map_err(|err| {
            if err.kind() == std::io::ErrorKind::UnexpectedEof {
                corrupt(path, format!("the db is truncated: {}", cut_off(e))).with_blob(&e.name)
            } else {
                Error::io(&err, path).with_blob(&e.name)
            }
        })?;
        p.crc.update(read);
        at += read.len() as u64;
    }
    Ok(())
}

/// Fills `buf` (maybe uninitialised) with the bytes at `at`, returning it
/// as initialised bytes.
#[cfg(unix)]
pub(super) fn read_exact_at_uninit<'b>(
    file: &File,
    buf: &'b mut [MaybeUninit<u8>],
    at: u64,
) -> std::io::Result<&'b [u8]> {
    use std::os::unix::io::AsRawFd;
    let mut done = 0usize;
    while done < buf.len() {
        let off = libc::off_t::try_from(at + done as u64)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: the destination is the unwritten tail of `buf`, valid for
        // writes of that many bytes; pread writes at most that many.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf[done..].as_mut_ptr().cast::<libc::c_void>(),
                buf.len() - done,
                off,
            )
        };
        match n {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n > 0 => done += n as usize,
            _ => {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
    // SAFETY: every byte of `buf` was written by pread above.
    Ok(unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) })
}

#[cfg(not(unix))]
pub(super) fn read_exact_at_uninit<'b>(
    file: &File,
    buf: &'b mut [MaybeUninit<u8>],
    at: u64,
) -> std::io::Result<&'b [u8]> {
    buf.fill(MaybeUninit::new(0));
    // SAFETY: every byte was just initialised.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), buf.len()) };
    read_exact_at(file, bytes, at)?;
    Ok(bytes)
}

#[cfg(unix)]
pub(super) fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

#[cfg(windows)]
pub(super) fn read_exact_at(file: &File, mut buf: &mut [u8], mut at: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, at) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Tells the kernel that `len` bytes from `offset` will be read front to
/// back, soon: a doubled read-ahead window for the file, and reading starts
/// at once. Only hints. Linux reads at most one read-ahead window of a
/// `WILLNEED` range (16 MiB here, `read_ahead_kb` doubled) and drops the
/// rest; the readers' own read-ahead streams the remainder. Asking for the
/// rest in steps from another thread was measured slower (2026-11-26): a
/// `WILLNEED` is read in 2 MiB batches, so the disk saw ~1 MiB requests
/// instead of the ~4 MiB ones of the kernel's asynchronous read-ahead.
pub(super) fn advise_sequential(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::c_int;
        use std::os::unix::io::AsRawFd;
        extern "C" {
            fn posix_fadvise(fd: c_int, offset: i64, len: i64, advice: c_int) -> c_int;
        }
        const POSIX_FADV_SEQUENTIAL: c_int = 2;
        const POSIX_FADV_WILLNEED: c_int = 3;
        let (offset, len) = (offset as i64, len as i64);
        // SAFETY: a valid open descriptor; the calls only give hints.
        unsafe {
            posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
            posix_fadvise(file.as_raw_fd(), offset, len, POSIX_FADV_WILLNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Checks that the bytes between payloads, and between the last one and
/// the index, are zero (small positioned reads).
pub(super) fn check_gaps(
    file: &File,
    path: &str,
    entries: &[IndexEntry],
    index_offset: u64,
) -> Result<()> {
    let mut pos = HEADER_LEN;
    let ends = entries
        .iter()
        .map(|e| (e.offset, e.offset + e.length))
        .chain(std::iter::once((index_offset, index_offset)));
    for (start, end) in ends {
        if start > pos {
            let mut pad = [0u8; PAGE_ALIGN as usize];
            let pad = &mut pad[..(start - pos) as usize];
            read_exact_at(file, pad, pos).map_err(|err| {
                if err.kind() == std::io::ErrorKind::UnexpectedEof {
                    corrupt(path, format!("the file ends inside padding at byte {pos}"))
                } else {
                    Error::io(&err, path)
                }
            })?;
            check_zero_padding(path, pad, pos)?;
        }
        pos = end;
    }
    Ok(())
}

/// Decodes a payload whose CRC checked out: a bool or string tensor, a byte
/// string or an object.
pub(super) fn decode_payload(
    path: &str,
    e: &IndexEntry,
    bytes: Cow<'_, [u8]>,
) -> Result<BlobValue> {
    let bad = |msg: String| corrupt(path, msg).with_blob(&e.name);
    Ok(match e.kind {
        KIND_TENSOR => {
            let dt =
                ferro_dtype(e.dtype).ok_or_else(|| bad(format!("unknown dtype {}", e.dtype)))?;
            BlobValue::Tensor(match dt {
                DataType::Bool => {
                    let v = bytes
                        .iter()
                        .map(|&b| match b {
                            0 => Some(false),
                            1 => Some(true),
                            _ => None,
                        })
                        .collect::<Option<Vec<bool>>>()
                        .ok_or_else(|| {
                            bad("a bool tensor holds a byte other than 0 or 1".to_string())
                        })?;
                    Tensor::from_vec(&e.shape(), v)?
                }
                DataType::String => {
                    let mut c = Cursor { b: &bytes, at: 0 };
                    let mut v = Vec::with_capacity(e.numel() as usize);
                    for _ in 0..e.numel() {
                        let s = c
                            .u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .and_then(|n| c.take(n))
                            .ok_or_else(
                                || bad("a string tensor's data is malformed".to_string()),
                            )?;
                        v.push(s.to_vec());
                    }
                    if c.at != bytes.len() {
                        return Err(bad("a string tensor's data has trailing bytes".to_string()));
                    }
                    Tensor::from_vec(&e.shape(), v)?
                }
                // Numeric tensors are read or mapped in place, never here.
                other => return Err(bad(format!("unsupported dtype {other}"))),
            })
        }
        KIND_BYTES => BlobValue::Bytes(bytes.into_owned()),
        _ => {
            let proto = BlobProto::decode(&*bytes).map_err(|err| {
                bad(format!(
                    "cannot parse the saved object as a BlobProto: {err}"
                ))
            })?;
            if proto.r#type.as_deref() != Some(e.tag.as_str()) {
                return Err(bad(
                    "the saved object's type disagrees with the index".to_string()
                ));
            }
            decode_object(&proto).map_err(|err| err.with_blob(&e.name).with_file(path))?
        }
    })
}

/// Loads the selected blobs of a ferro file. Payloads are read with
/// positioned reads by the kernel pool's threads, which take pieces of at
/// most [`LOAD_PIECE`] bytes in file order (so that the disk still sees one
/// forward stream), each straight into its tensor's buffer, checksummed as
/// it comes. Every byte between payloads is checked to be zero padding.
pub(super) fn load_ferro(
    path: &str,
    select: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, BlobValue)>> {
    let FerroFile {
        r,
        entries,
        index_offset,
    } = open_ferro(path)?;
    let file = r.into_inner();
    let wanted: Vec<&IndexEntry> = entries.iter().filter(|e| select(&e.name)).collect();
    let direct = if direct::enabled()
        && wanted
            .iter()
            .any(|e| e.offset % DIRECT_ALIGN as u64 == 0 && e.length >= DIRECT_ALIGN as u64)
    {
        file.metadata()
            .ok()
            .and_then(|m| Direct::open(&file, m.len()))
    } else {
        None
    };
    // Start the disk before anything else (the buffers' allocation, the
    // padding checks), so that it streams while they run; not when payloads
    // may be read directly (the read-ahead would read them twice), and then
    // the padding is read without read-ahead.
    if let (Some(first), Some(last), None) = (wanted.first(), wanted.last(), &direct) {
        advise_sequential(
            &file,
            first.offset,
            last.offset + last.length - first.offset,
        );
    }
    let gaps = direct.as_ref().map_or(&file, |d| d.random());
    check_gaps(gaps, path, &entries, index_offset)?;
    let mut dests = wanted
        .iter()
        .map(|e| Dest::for_entry(e))
        .collect::<Result<Vec<Dest>>>()?;
    let mut pieces = Vec::new();
    for (i, (e, d)) in wanted.iter().zip(dests.iter_mut()).enumerate() {
        let mut at = e.offset;
        for dst in d.bytes_mut().chunks_mut(LOAD_PIECE) {
            let len = dst.len() as u64;
            pieces.push(Piece {
                entry: i,
                at,
                dst,
                crc: crc32fast::Hasher::new(),
                result: Ok(()),
            });
            at += len;
        }
    }
    // One reader (this thread) when the kernel pool could not start.
    let workers = crate::threads::num_threads().min(pieces.len());
    if workers > 1 {
        // Each worker reads a contiguous run of pieces (about the same
        // number of bytes each) in file order, through a descriptor of its
        // own where it can: the kernel then sees `workers` sequential
        // streams, each with its own read-ahead. (Pieces handed out in turn
        // from one queue on one descriptor interleaved two readers 8 MiB
        // apart in one read-ahead state: measured slower cold.)
        let total: u64 = pieces.iter().map(|p| p.dst.len() as u64).sum();
        let mut runs: Vec<&mut [Piece<'_>]> = Vec::with_capacity(workers);
        let mut rest = &mut pieces[..];
        let mut taken = 0u64;
        for w in 1..workers as u64 {
            let goal = total * w / workers as u64;
            let mut n = 0;
            while n < rest.len() && taken < goal {
                taken += rest[n].dst.len() as u64;
                n += 1;
            }
            let (run, tail) = rest.split_at_mut(n);
            runs.push(run);
            rest = tail;
        }
        runs.push(rest);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let (file, direct, failed, wanted) = (&file, direct.as_ref(), &failed, &wanted);
        rayon::scope(|s| {
            for run in runs {
                s.spawn(move |_| {
                    let own = if run.is_empty() {
                        None
                    } else {
                        direct::reopen(file)
                    };
                    let fd = own.as_ref().unwrap_or(file);
                    for p in run {
                        if failed.load(Ordering::Relaxed) {
                            break; // another piece failed: the load fails
                        }
                        p.result = read_piece(fd, direct, path, wanted[p.entry], p);
                        if p.result.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
    } else {
        for p in &mut pieces {
            p.result = read_piece(&file, direct.as_ref(), path, wanted[p.entry], p);
            if p.result.is_err() {
                break;
            }
        }
    }
    // The first failure in file order is the one reported.
    let mut crcs: Vec<Option<crc32fast::Hasher>> = vec![None; wanted.len()];
    for p in pieces {
        p.result?;
        match &mut crcs[p.entry] {
            Some(h) => h.combine(&p.crc),
            slot => *slot = Some(p.crc),
        }
    }
    let mut out = Vec::with_capacity(wanted.len());
    for ((e, mut d), crc) in wanted.into_iter().zip(dests).zip(crcs) {
        let crc = crc.unwrap_or_default().finalize();
        check_crc(path, e, crc)?;
        // SAFETY: every piece of every buffer was read in full (the loop
        // above returned on the first piece that was not).
        unsafe { d.set_read() };
        out.push((e.name.clone(), d.into_value(path, e)?));
    }
    Ok(out)
}

pub(super) fn verify_ferro(path: &str) -> Result<()> {
    let mut f = open_ferro(path)?;
    let entries = std::mem::take(&mut f.entries);
    let mut pos = HEADER_LEN;
    let mut buf = vec![0u8; 1 << 20];
    for e in &entries {
        f.padding(path, pos, e.offset)?;
        if e.kind == KIND_OBJECT {
            let bytes = f.payload_bytes(path, e)?;
            BlobProto::decode(bytes.as_slice()).map_err(|err| {
                corrupt(
                    path,
                    format!("cannot parse the saved object as a BlobProto: {err}"),
                )
                .with_blob(&e.name)
            })?;
        } else {
            let mut crc = crc32fast::Hasher::new();
            let mut left = e.length;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                read_exact_or_corrupt(&mut f.r, &mut buf[..n], path, &|| {
                    format!("the data of blob '{}' is cut off", e.name)
                })
                .map_err(|err| err.with_blob(&e.name))?;
                crc.update(&buf[..n]);
                left -= n as u64;
            }
            if crc.finalize() != e.crc {
                return Err(corrupt(
                    path,
                    format!("the data of blob '{}' is damaged (CRC mismatch)", e.name),
                )
                .with_blob(&e.name));
            }
        }
        pos = e.offset + e.length;
    }
    f.padding(path, pos, f.index_offset)
}

pub(super) fn list_ferro(path: &str) -> Result<Vec<EntryInfo>> {
    let f = open_ferro(path)?;
    Ok(f.entries
        .into_iter()
        .map(|e| {
            let (kind, type_tag, dtype) = match e.kind {
                KIND_TENSOR => (
                    EntryKind::Tensor,
                    TENSOR_TAG.to_string(),
                    ferro_dtype(e.dtype),
                ),
                KIND_BYTES => (EntryKind::Bytes, STRING_TAG.to_string(), None),
                _ => (EntryKind::Object, e.tag.clone(), None),
            };
            EntryInfo {
                shape: e.shape(),
                name: e.name,
                kind,
                type_tag,
                dtype,
                bytes: e.length,
            }
        })
        .collect())
}

/// ferrocaffe's checked, mmap-friendly format (the default).
pub struct Ferro;

impl DbFormat for Ferro {
    fn name(&self) -> &'static str {
        "ferro"
    }
    /// A regular file that starts with ferro's magic.
    fn recognises(&self, path: &str) -> bool {
        let mut magic = [0u8; 8];
        open_regular(path)
            .is_ok_and(|(mut f, _)| f.read_exact(&mut magic).is_ok() && &magic == FERRO_MAGIC)
    }
    fn about(&self) -> &'static str {
        "the default"
    }
    fn write(
        &self,
        w: &mut BufWriter<File>,
        path: &str,
        entries: &[(&str, Prepared<'_>)],
        _opts: &SaveOptions,
    ) -> Result<()> {
        // Every tensor is stored in one piece, every bit kept.
        write_ferro(w, path, entries)
    }
    fn load(&self, path: &str, select: &dyn Fn(&str) -> bool) -> Result<Vec<(String, BlobValue)>> {
        load_ferro(path, select)
    }
    fn list(&self, path: &str) -> Result<Vec<EntryInfo>> {
        list_ferro(path)
    }
    /// Every CRC, the layout and the padding.
    fn verify(&self, path: &str) -> Result<()> {
        verify_ferro(path)
    }
    fn read_kv(&self, path: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        blobs_as_kv(path, &load_ferro(path, &|_| true)?)
    }
    fn write_kv(&self, path: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        save_kv_as_blobs(path, self, records)
    }
}
