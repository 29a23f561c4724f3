//! Segments packed into a padded batch and back: PackSegments and
//! UnpackSegments (Caffe2's pack_segments).
//!
//! A LENGTHS vector (int32 or int64, 1-D, each >= 0) cuts the rows of a
//! tensor into consecutive segments. PackSegments puts segment `i` in row `i`
//! of a `[len(LENGTHS), T, ...]` tensor, padded after its end (T: the longest
//! segment, or `max_length`, which also truncates longer segments);
//! UnpackSegments takes the rows back out.

use super::kit::by_dtype;
use super::kit::kernel;
use crate::arg;
use crate::args::Args;
use crate::error::{Error, Result};
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator, ShapeInfo};
use crate::tensor::{f16, try_vec, DataType, Element, Tensor};
use ndarray::{ArrayD, IxDyn};

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("PackSegments", pack_segments)
            .inputs(2, 2)
            .outputs(1, 2)
            .args(&[
                arg!("max_length", "int", "-1 (the longest segment)", "the padded length T; longer segments are truncated"),
                arg!("pad_minf", "bool", "false", "pad with -inf instead of 0 (float dtypes only)"),
                arg!("return_presence_mask", "bool", "false", "also output a bool [N, T] mask of the positions that hold data (needs a second output)"),
            ])
            .infer(pack_infer)
            .doc(
                "Inputs (LENGTHS, DATA): segment i (the next LENGTHS[i] rows of DATA) becomes row i of a \
                 [len(LENGTHS), T] + DATA.shape[1:] tensor, padded after its end with 0 (an empty string for \
                 strings, -inf with pad_minf). The lengths must add up to DATA's first dim.",
            ),
        OpSchema::new("UnpackSegments", unpack_segments)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(&[arg!("max_length", "int", "-1 (no limit)", "take at most this many rows of each segment")])
            .ignores(&[
                arg!("pad_minf", "bool", "false", "PackSegments' argument, which its gradient (this op) carries; ignored"),
                arg!("return_presence_mask", "bool", "false", "PackSegments' argument, which its gradient (this op) carries; ignored"),
            ])
            .doc(
                "Inputs (LENGTHS, PACKED [N, T, ...]): the first min(LENGTHS[i], max_length) positions of each row \
                 i of PACKED, one after another (PackSegments undone). LENGTHS[i] may exceed T only when \
                 max_length <= T.",
            ),
    ]
}

/// LENGTHS (input 0) as `usize`s: int32 or int64, 1-D, none negative.
fn lengths(l: &Locked<'_>) -> Result<Vec<usize>> {
    let name = l.input_name(0);
    let t = l.tensor(0)?;
    if t.ndim() != 1 {
        return Err(Error::shape(format!(
            "the lengths must be 1-D, got shape {:?}",
            t.shape()
        ))
        .with_blob(name));
    }
    let raw: Vec<i64> = match t {
        Tensor::I32(a) => {
            crate::tensor::try_collect(a.iter().map(|&v| i64::from(v)), "a kernel buffer")?
        }
        Tensor::I64(a) => crate::tensor::try_collect(a.iter().copied(), "a kernel buffer")?,
        other => {
            return Err(Error::type_error(format!(
                "the lengths must be int32 or int64, got {}",
                other.dtype()
            ))
            .with_blob(name))
        }
    };
    raw.iter()
        .enumerate()
        .map(|(i, &v)| {
            usize::try_from(v).map_err(|_| {
                Error::invalid_arg(format!("length #{i} is negative: {v}")).with_blob(name)
            })
        })
        .collect()
}

/// `max_length`: `None` when not given (or negative, Caffe2's -1).
fn max_length(args: &Args<'_>) -> Result<Option<usize>> {
    Ok(usize::try_from(args.i64("max_length", -1)?).ok())
}

// ----------------------------------------------------------- PackSegments --

fn pack_typed<T: Element>(data: &Tensor, lens: &[usize], t: usize, pad: T) -> Result<Tensor> {
    let a = data.array::<T>()?;
    let block: usize = a.shape()[1..].iter().product();
    let mut shape = vec![lens.len(), t];
    shape.extend_from_slice(&a.shape()[1..]);
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let n =
        n.ok_or_else(|| Error::invalid_arg(format!("the packed shape {shape:?} is too large")))?;
    let flat = a.as_slice_memory_order().filter(|_| a.is_standard_layout());
    let owned;
    let flat = match flat {
        Some(f) => f,
        None => {
            owned = a.iter().cloned().collect::<Vec<T>>();
            &owned
        }
    };
    let mut out: Vec<T> = try_vec(n, format_args!("a packed tensor of shape {shape:?}"))?;
    let mut start = 0;
    for &len in lens {
        let keep = len.min(t);
        out.extend_from_slice(&flat[start * block..(start + keep) * block]);
        out.extend(std::iter::repeat_n(pad.clone(), (t - keep) * block));
        start += len;
    }
    let arr =
        ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| Error::internal(e.to_string()))?;
    Ok(T::wrap(arr))
}

fn pack_segments(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let max_len = max_length(&ctx.args)?;
    let pad_minf = ctx.args.bool("pad_minf", false)?;
    let mask = ctx.args.bool("return_presence_mask", false)?;
    if mask != (ctx.num_outputs() == 2) {
        return Err(ctx.bad_arg(if mask {
            "return_presence_mask needs a second output (the presence mask)"
        } else {
            "a second output (the presence mask) needs return_presence_mask"
        }));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let lens = lengths(&l)?;
        let (packed, present) = {
            let dname = l.input_name(1);
            let data = l.tensor(1)?;
            if data.ndim() == 0 {
                return Err(
                    Error::shape("the data must be at least 1-D, got a 0-dim tensor")
                        .with_blob(dname),
                );
            }
            let total = lens.iter().try_fold(0usize, |a, &b| a.checked_add(b));
            if total != Some(data.shape()[0]) {
                return Err(Error::invalid_arg(format!(
                    "the lengths add up to {} but the data has {} rows",
                    total.map_or_else(|| "more than fits".to_string(), |t| t.to_string()),
                    data.shape()[0]
                ))
                .with_blob(l.input_name(0)));
            }
            let t = max_len.unwrap_or_else(|| lens.iter().copied().max().unwrap_or(0));
            let packed = if pad_minf {
                match data.dtype() {
                    DataType::Float => pack_typed(data, &lens, t, f32::NEG_INFINITY),
                    DataType::Double => pack_typed(data, &lens, t, f64::NEG_INFINITY),
                    DataType::Float16 => pack_typed(data, &lens, t, f16::NEG_INFINITY),
                    other => Err(Error::type_error(format!(
                        "pad_minf pads with -inf, which {other} cannot hold (float32, float64 or float16 only)"
                    ))
                    .with_blob(dname)),
                }
            } else {
                by_dtype!(data.dtype(), pack_typed(data, &lens, t, Default::default()))
                    .map_err(|e| e.with_blob(dname))
            }?;
            let present = if mask {
                let mut m: Vec<bool> = try_vec(lens.len() * t, "a presence mask")?;
                for &len in &lens {
                    let keep = len.min(t);
                    m.extend(std::iter::repeat_n(true, keep));
                    m.extend(std::iter::repeat_n(false, t - keep));
                }
                Some(Tensor::from_vec(&[lens.len(), t], m)?)
            } else {
                None
            };
            (packed, present)
        };
        l.set_output(0, packed);
        if let Some(p) = present {
            l.set_output(1, p);
        }
        Ok(true)
    }))
}

/// Known only with `max_length` (else T depends on the lengths' values).
fn pack_infer(
    args: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    n_out: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let (Some(t), Some(lens), Some(data)) = (max_length(args)?, &ins[0], &ins[1]) else {
        return Ok(vec![None; n_out]);
    };
    if lens.dims.len() != 1 || data.dims.is_empty() {
        return Err(Error::shape("1-D lengths and at least 1-D data"));
    }
    let mut dims = vec![lens.dims[0], t as i64];
    dims.extend_from_slice(&data.dims[1..]);
    let mut out = vec![Some(ShapeInfo::new(dims, data.dtype))];
    if n_out == 2 {
        out.push(Some(ShapeInfo::new(
            vec![lens.dims[0], t as i64],
            DataType::Bool,
        )));
    }
    Ok(out)
}

// --------------------------------------------------------- UnpackSegments --

fn unpack_typed<T: Element>(packed: &Tensor, lens: &[usize], keep: &[usize]) -> Result<Tensor> {
    let a = packed.array::<T>()?;
    let t = a.shape()[1];
    let block: usize = a.shape()[2..].iter().product();
    let rows: usize = keep.iter().sum();
    let mut shape = vec![rows];
    shape.extend_from_slice(&a.shape()[2..]);
    let flat = a.as_slice_memory_order().filter(|_| a.is_standard_layout());
    let owned;
    let flat = match flat {
        Some(f) => f,
        None => {
            owned = a.iter().cloned().collect::<Vec<T>>();
            &owned
        }
    };
    let mut out: Vec<T> = try_vec(
        rows * block,
        format_args!("an unpacked tensor of shape {shape:?}"),
    )?;
    for (i, &k) in keep.iter().enumerate() {
        debug_assert!(k <= t && k <= lens[i]);
        let at = i * t * block;
        out.extend_from_slice(&flat[at..at + k * block]);
    }
    let arr =
        ArrayD::from_shape_vec(IxDyn(&shape), out).map_err(|e| Error::internal(e.to_string()))?;
    Ok(T::wrap(arr))
}

fn unpack_segments(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let max_len = max_length(&ctx.args)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let lens = lengths(&l)?;
        let out = {
            let pname = l.input_name(1);
            let packed = l.tensor(1)?;
            if packed.ndim() < 2 {
                return Err(Error::shape(format!(
                    "the packed tensor must be at least 2-D, got shape {:?}",
                    packed.shape()
                ))
                .with_blob(pname));
            }
            if packed.shape()[0] != lens.len() {
                return Err(Error::shape(format!(
                    "the packed tensor has {} rows but there are {} lengths",
                    packed.shape()[0],
                    lens.len()
                ))
                .with_blob(pname));
            }
            let t = packed.shape()[1];
            let keep = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let k = max_len.map_or(len, |m| len.min(m));
                    if k > t {
                        return Err(Error::invalid_arg(format!(
                            "segment #{i} takes {k} positions but the packed tensor holds {t}"
                        ))
                        .with_blob(pname));
                    }
                    Ok(k)
                })
                .collect::<Result<Vec<usize>>>()?;
            by_dtype!(packed.dtype(), unpack_typed(packed, &lens, &keep))
                .map_err(|e| e.with_blob(pname))?
        };
        l.set_output(0, out);
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;

    use crate::tensor::Tensor;
    use crate::test_util::{get, i32s, i64s, int_arg, op, run, vals, ws_with};

    #[test]
    fn packs_pads_and_unpacks_by_hand() {
        let data = Tensor::from_vec(&[3, 2], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let ws = ws_with(&[("d", data), ("l", i32s(&[2, 0, 1]))]);
        run(&ws, op("PackSegments", &["l", "d"], &["p"], vec![])).unwrap();
        let p = get(&ws, "p");
        assert_eq!(p.shape(), &[3, 2, 2]);
        assert_eq!(
            vals(&p),
            vec![1., 2., 3., 4., 0., 0., 0., 0., 5., 6., 0., 0.]
        );
        run(&ws, op("UnpackSegments", &["l", "p"], &["u"], vec![])).unwrap();
        assert_eq!(vals(&get(&ws, "u")), vec![1., 2., 3., 4., 5., 6.]);
        // max_length truncates (and pads to itself).
        run(
            &ws,
            op(
                "PackSegments",
                &["l", "d"],
                &["q"],
                vec![int_arg("max_length", 1)],
            ),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "q")), vec![1., 2., 0., 0., 5., 6.]);
    }

    #[test]
    fn lengths_must_cover_the_rows_exactly() {
        let data = Tensor::from_vec(&[3], vec![1f32, 2., 3.]).unwrap();
        let ws = ws_with(&[
            ("d", data),
            ("short", i64s(&[1, 1])),
            ("long", i64s(&[2, 2])),
            ("neg", i64s(&[4, -1])),
        ]);
        for l in ["short", "long", "neg"] {
            let e = run(&ws, op("PackSegments", &[l, "d"], &["p"], vec![])).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{l}");
        }
    }
}
