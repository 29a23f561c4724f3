//! Tensors as Caffe2 `TensorProto`s (chunked for minidb), and back.

use super::*;

/// A tensor's elements in row-major order, borrowed when contiguous.
pub(super) fn flat<T: Clone>(a: &ArrayD<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

pub(super) type Emit<'e> = dyn FnMut(String, TensorProto) -> Result<()> + 'e;

pub(super) fn chunks_of<T: Clone>(
    a: &ArrayD<T>,
    base: &TensorProto,
    name: &str,
    chunk: usize,
    fill: impl Fn(&mut TensorProto, &[T]),
    emit: &mut Emit<'_>,
) -> Result<()> {
    let all = flat(a);
    let n = all.len();
    let chunk = if chunk == 0 { n + 1 } else { chunk };
    // Like Caffe2, an empty tensor still gets chunk 0 (its dims must be kept).
    let mut begin = 0;
    while begin < n.max(1) {
        let end = (begin + chunk).min(n);
        let mut p = base.clone();
        p.segment = Some(Segment {
            begin: begin as i64,
            end: end as i64,
        });
        fill(&mut p, &all[begin..end]);
        emit(format!("{name}{CHUNK_SEPARATOR}{}", begin / chunk), p)?;
        begin += chunk;
    }
    Ok(())
}

/// Caffe2's TensorSerializer: one TensorProto per chunk of `chunk` elements
/// (0: a single chunk), each with the full dims and its segment, the data in
/// Caffe2's per-dtype field. `emit` gets the key `name#%<chunk>`. With
/// `bfloat16`, float32 data goes as bfloat16 in `raw_data` (Caffe2's
/// `FMT_BFLOAT16`); other dtypes are unaffected.
pub(super) fn tensor_chunks(
    name: &str,
    t: &Tensor,
    chunk: usize,
    bfloat16: bool,
    emit: &mut Emit<'_>,
) -> Result<()> {
    let base = TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(t.dtype() as i32),
        name: Some(name.to_string()),
        ..Default::default()
    };
    fn widen<T: Copy + Into<i32>>(p: &mut TensorProto, s: &[T]) {
        p.int32_data = s.iter().map(|&x| x.into()).collect();
    }
    match t {
        Tensor::F32(a) if bfloat16 => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| {
                p.data_format = Some(FMT_BFLOAT16);
                p.raw_data = Some(
                    s.iter()
                        .flat_map(|&x| to_bfloat16(x).to_le_bytes())
                        .collect(),
                );
            },
            emit,
        ),
        Tensor::F32(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.float_data = s.to_vec(),
            emit,
        ),
        Tensor::F64(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.double_data = s.to_vec(),
            emit,
        ),
        Tensor::I32(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.int32_data = s.to_vec(),
            emit,
        ),
        Tensor::I64(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.int64_data = s.to_vec(),
            emit,
        ),
        Tensor::Bool(a) => chunks_of(a, &base, name, chunk, widen::<bool>, emit),
        Tensor::U8(a) => chunks_of(a, &base, name, chunk, widen::<u8>, emit),
        Tensor::I8(a) => chunks_of(a, &base, name, chunk, widen::<i8>, emit),
        Tensor::I16(a) => chunks_of(a, &base, name, chunk, widen::<i16>, emit),
        Tensor::U16(a) => chunks_of(a, &base, name, chunk, widen::<u16>, emit),
        // Caffe2 keeps a half's 16 bits, as a uint16, in int32_data.
        Tensor::F16(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.int32_data = s.iter().map(|x| i32::from(x.to_bits())).collect(),
            emit,
        ),
        Tensor::Str(a) => chunks_of(
            a,
            &base,
            name,
            chunk,
            |p, s| p.string_data = s.to_vec(),
            emit,
        ),
    }
}

/// Caffe2's `TensorProto.FMT_BFLOAT16` (`data_format`).
const FMT_BFLOAT16: u32 = 1;

/// The bfloat16 bits of a float: rounded to nearest, ties to even, NaN kept
/// a NaN (Caffe2's reference conversion rounded ties away from zero and
/// could turn a NaN into -0.0 or 0.0).
pub(super) fn to_bfloat16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

fn from_bfloat16(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Float chunks, each in its own format: `float_data`, or bfloat16 in
/// `raw_data`.
fn gather_floats(segs: &[Seg<'_>]) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for &(b, e, p) in segs {
        match p.data_format.unwrap_or(0) {
            0 => {
                if p.float_data.len() != e - b {
                    return Err(bad_data(format!(
                        "incorrect data size: the chunk [{b}, {e}) of a float tensor holds {} values",
                        p.float_data.len()
                    )));
                }
                out.try_reserve(e - b)
                    .map_err(|_| crate::tensor::alloc_error((e - b) * 4, "a float tensor"))?;
                out.extend_from_slice(&p.float_data);
            }
            FMT_BFLOAT16 => {
                let raw = p.raw_data.as_deref().unwrap_or_default();
                if raw.len() != (e - b) * 2 {
                    return Err(bad_data(format!(
                        "incorrect data size in serialized bfloat16 data: the chunk [{b}, {e}) holds {} bytes, {} expected",
                        raw.len(),
                        (e - b) * 2
                    )));
                }
                out.try_reserve(e - b)
                    .map_err(|_| crate::tensor::alloc_error((e - b) * 4, "a float tensor"))?;
                out.extend(
                    raw.chunks_exact(2)
                        .map(|c| from_bfloat16(u16::from_le_bytes([c[0], c[1]]))),
                );
            }
            f => {
                return Err(bad_data(format!(
                    "unsupported serialization format {f} when deserializing float data"
                )))
            }
        }
    }
    Ok(out)
}

pub(super) fn bad_data(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

/// A chunk of a tensor: its element range and its proto.
pub(super) type Seg<'p> = (usize, usize, &'p TensorProto);

/// Copies a repeated field of every chunk (in element order) into one vector,
/// checking every length before allocating and every value's range.
pub(super) fn gather<S: Clone, T>(
    segs: &[Seg<'_>],
    field: impl Fn(&TensorProto) -> &[S],
    conv: impl Fn(S) -> Option<T>,
    dtype: DataType,
) -> Result<Vec<T>> {
    let mut total = 0;
    for &(b, e, p) in segs {
        let got = field(p).len();
        if got != e - b {
            return Err(bad_data(format!(
                "incorrect data size: the chunk [{b}, {e}) of a {dtype} tensor holds {got} values"
            )));
        }
        total += got;
    }
    let mut out = Vec::with_capacity(total);
    for &(_, _, p) in segs {
        for x in field(p) {
            let v = conv(x.clone())
                .ok_or_else(|| bad_data(format!("a value is out of range for a {dtype} tensor")))?;
            out.push(v);
        }
    }
    Ok(out)
}

/// Types Caffe2 stores in `int32_data` (or, with a global flag, as raw
/// little-endian bytes in `byte_data`).
pub(super) fn gather_small<T>(
    segs: &[Seg<'_>],
    dtype: DataType,
    from_i32: impl Fn(i32) -> Option<T>,
    from_le: impl Fn(&[u8]) -> Option<T>,
    size: usize,
) -> Result<Vec<T>> {
    let mut total = 0;
    for &(b, e, p) in segs {
        let (got, want) = match &p.byte_data {
            Some(bytes) => (bytes.len(), (e - b) * size),
            None => (p.int32_data.len(), e - b),
        };
        if got != want {
            return Err(bad_data(format!(
                "incorrect data size: the chunk [{b}, {e}) of a {dtype} tensor holds {got} values or bytes, {want} expected"
            )));
        }
        total += e - b;
    }
    let range = || bad_data(format!("a value is out of range for a {dtype} tensor"));
    let mut out = Vec::with_capacity(total);
    for &(_, _, p) in segs {
        match &p.byte_data {
            Some(bytes) => {
                for c in bytes.chunks_exact(size) {
                    out.push(from_le(c).ok_or_else(range)?);
                }
            }
            None => {
                for &x in &p.int32_data {
                    out.push(from_i32(x).ok_or_else(range)?);
                }
            }
        }
    }
    Ok(out)
}

/// Builds a tensor from its TensorProto chunks with Caffe2's accounting:
/// every chunk has the same dims and dtype, and the segments cover every
/// element exactly once. Errors carry no file or blob (the caller adds them).
pub(super) fn assemble_tensor(chunks: &[TensorProto]) -> Result<Tensor> {
    let first = chunks
        .first()
        .ok_or_else(|| bad_data("a tensor has no records"))?;
    let mut shape = Vec::with_capacity(first.dims.len());
    let mut total: usize = 1;
    for &d in &first.dims {
        let du = usize::try_from(d).map_err(|_| {
            bad_data(format!(
                "the tensor has a negative dimension in dims {:?}",
                first.dims
            ))
        })?;
        total = total
            .checked_mul(du)
            .ok_or_else(|| bad_data(format!("the tensor's dims {:?} overflow", first.dims)))?;
        shape.push(du);
    }
    let code = first.data_type.unwrap_or(1);
    if chunks
        .iter()
        .any(|c| c.dims != first.dims || c.data_type.unwrap_or(1) != code)
    {
        return Err(bad_data(
            "the records of a tensor disagree on its dims or data type",
        ));
    }
    let mut segs: Vec<Seg<'_>> = Vec::with_capacity(chunks.len());
    for c in chunks {
        let (b, e) = match &c.segment {
            None => (0, total),
            Some(s) => {
                let ok = 0 <= s.begin && s.begin <= s.end && (s.end as u64) <= total as u64;
                if !ok {
                    return Err(bad_data(format!(
                        "invalid chunk [{}, {}) of a tensor of {total} elements",
                        s.begin, s.end
                    )));
                }
                (s.begin as usize, s.end as usize)
            }
        };
        segs.push((b, e, c));
    }
    segs.sort_by_key(|s| (s.0, s.1));
    let read: u64 = segs.iter().map(|s| (s.1 - s.0) as u64).sum();
    let mut covered = 0;
    for s in &segs {
        if s.0 < covered {
            return Err(bad_data(format!(
                "the records of a tensor overlap at element {}",
                s.0
            )));
        }
        covered = s.1.max(covered);
    }
    if read != total as u64 || covered != total {
        return Err(bad_data(format!(
            "Data size mismatch: expected {total} elements, read {read}"
        )));
    }
    // Caffe2's legacy "empty tensor without dtype" is a float tensor of shape [0].
    if code == DataType::Undefined as i32 && total == 0 {
        return Tensor::from_vec::<f32>(&[0], vec![]);
    }
    let dt = DataType::from_i32(code)
        .ok_or_else(|| bad_data(format!("unknown tensor data type {code}")))?;
    let t = match dt {
        DataType::Float => Tensor::from_vec(&shape, gather_floats(&segs)?),
        DataType::Double => Tensor::from_vec(&shape, gather(&segs, |p| &p.double_data, Some, dt)?),
        DataType::Int32 => Tensor::from_vec(&shape, gather(&segs, |p| &p.int32_data, Some, dt)?),
        DataType::Int64 => Tensor::from_vec(&shape, gather(&segs, |p| &p.int64_data, Some, dt)?),
        DataType::String => Tensor::from_vec(&shape, gather(&segs, |p| &p.string_data, Some, dt)?),
        DataType::Bool => {
            let v = gather_small(
                &segs,
                dt,
                |x| match x {
                    0 => Some(false),
                    1 => Some(true),
                    _ => None,
                },
                |b| match b[0] {
                    0 => Some(false),
                    1 => Some(true),
                    _ => None,
                },
                1,
            )?;
            Tensor::from_vec(&shape, v)
        }
        DataType::Uint8 => Tensor::from_vec(
            &shape,
            gather_small(&segs, dt, |x| u8::try_from(x).ok(), |b| Some(b[0]), 1)?,
        ),
        DataType::Byte => {
            // Legacy BYTE tensors hold their bytes in byte_data.
            let v = gather(&segs, |p| p.byte_data.as_deref().unwrap_or(&[]), Some, dt)?;
            Tensor::from_vec(&shape, v)
        }
        DataType::Int8 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| i8::try_from(x).ok(),
                |b| Some(i8::from_le_bytes([b[0]])),
                1,
            )?,
        ),
        DataType::Int16 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| i16::try_from(x).ok(),
                |b| Some(i16::from_le_bytes([b[0], b[1]])),
                2,
            )?,
        ),
        DataType::Uint16 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| u16::try_from(x).ok(),
                |b| Some(u16::from_le_bytes([b[0], b[1]])),
                2,
            )?,
        ),
        // The 16 bits of each half, as a uint16 in int32_data (or, with
        // Caffe2's caffe2_serialize_fp16_as_bytes, little-endian byte_data).
        DataType::Float16 => Tensor::from_vec(
            &shape,
            gather_small(
                &segs,
                dt,
                |x| u16::try_from(x).ok().map(crate::tensor::f16::from_bits),
                |b| Some(crate::tensor::f16::from_le_bytes([b[0], b[1]])),
                2,
            )?,
        ),
        DataType::Undefined => return Err(Error::type_error(
            "tensors of serialized objects (data type UNDEFINED) are not supported by ferrocaffe",
        )),
    };
    t.map_err(|e| bad_data(e.into_message()))
}
