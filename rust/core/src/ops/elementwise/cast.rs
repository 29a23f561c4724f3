//! dtype conversions: Cast, FloatToHalf and HalfToFloat.

#![allow(clippy::result_large_err)]

use super::loops::*;
use crate::arg;
use crate::blob::BlobValue;
use crate::error::{Error, Result};
use crate::num::Number;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::kernel;
use crate::tensor::{f16, DataType, Tensor};
use ndarray::ArrayViewD;

pub fn schemas() -> Vec<OpSchema> {
    let a = InPlace::Allow(in_place_a);
    vec![
        OpSchema::new("Cast", build_cast)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(a)
            .args(&[
                arg!(
                    "to",
                    "int or string",
                    "(required)",
                    "the target dtype: a TensorProto.DataType number or its name, such as \"INT64\""
                ),
                arg!(
                    "from_type",
                    "int or string",
                    "none",
                    "the input's dtype; only the gradient reads it (a Cast back to it)"
                ),
            ])
            .doc(
                "Y = X converted to dtype `to` (numeric dtypes, float16 and bool; float to int truncates toward zero and \
                 saturates). To STRING, each element is written as C++'s std::to_string did (integers and bool in \
                 decimal, floats with six decimals); from STRING is not supported.",
            ),
        OpSchema::new("FloatToHalf", build_float_to_half)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[arg!(
                "clip",
                "bool",
                "false",
                "clip to float16's finite range [-65504, 65504] first (else out-of-range values become infinities)"
            )])
            .doc("Y = X (float32) rounded to float16."),
        OpSchema::new("HalfToFloat", build_half_to_float)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("Y = X (float16) as float32 (exact)."),
    ]
}

// --------------------------------------------------------------------- Cast --

fn parse_to(ctx: &OpDefCtx<'_>) -> Result<DataType> {
    let to = if ctx.args.field_of("to") == Some("s") {
        let s = ctx.args.string("to", "")?;
        DataType::from_name(&s)
            .ok_or_else(|| ctx.bad_arg(format!("Cast: unknown 'to' argument: '{s}'")))?
    } else {
        match ctx.args.i64_opt("to")? {
            None => {
                return Err(ctx.bad_arg("Cast requires the argument 'to' (the target DataType)"))
            }
            Some(v) => i32::try_from(v)
                .ok()
                .and_then(DataType::from_i32)
                .ok_or_else(|| ctx.bad_arg(format!("Cast: unexpected 'to' argument value: {v}")))?,
        }
    };
    match to {
        DataType::Undefined => {
            Err(ctx.bad_arg("Cast: 'to' must be a DataType other than UNDEFINED"))
        }
        DataType::Byte => Err(Error::type_error(
            "Cast: casting to BYTE is not supported (it is deprecated; use UINT8)",
        )),
        other => Ok(other),
    }
}

fn cast_from<S: Number>(o: &mut BlobValue, a: ArrayViewD<'_, S>, to: DataType) -> Result<()> {
    match to {
        DataType::Float => write_unary(o, a, S::to_f32),
        DataType::Double => write_unary(o, a, S::to_f64),
        DataType::Int32 => write_unary(o, a, S::to_i32),
        DataType::Int64 => write_unary(o, a, S::to_i64),
        DataType::Bool => write_unary(o, a, S::to_bool),
        DataType::Uint8 => write_unary(o, a, S::to_u8),
        DataType::Int8 => write_unary(o, a, S::to_i8),
        DataType::Int16 => write_unary(o, a, S::to_i16),
        DataType::Uint16 => write_unary(o, a, S::to_u16),
        DataType::Float16 => write_unary(o, a, S::to_f16),
        other => Err(Error::type_error(format!(
            "Cast: casting to {other} is not supported"
        ))),
    }
}

/// A float as C++'s `std::to_string` wrote it (printf's `%f`: six decimals,
/// `inf`, `nan`).
fn float_text(x: f64) -> Vec<u8> {
    if x.is_nan() {
        return if x.is_sign_negative() {
            b"-nan".to_vec()
        } else {
            b"nan".to_vec()
        };
    }
    format!("{x:.6}").into_bytes()
}

/// Cast to STRING: each element's text, as Caffe2's `caffe2::to_string`.
fn cast_to_strings(o: &mut BlobValue, src: &Tensor) -> Result<()> {
    fn texts<T: Copy>(a: ArrayViewD<'_, T>, f: impl Fn(T) -> Vec<u8>) -> Result<Tensor> {
        let mut v = crate::tensor::try_vec(a.len(), "the strings of a Cast")?;
        v.extend(a.iter().map(|&x| f(x)));
        Tensor::from_vec(a.shape(), v)
    }
    let t = crate::with_match_dtype!(tensor pod src, |a: T| {
        if T::INT {
            texts(a.view(), |x: T| x.to_i64().to_string().into_bytes())?
        } else {
            texts(a.view(), |x: T| float_text(x.to_f64()))?
        }
    }, else Tensor::Bool(a) => texts(a.view(), |x| u8::from(x).to_string().into_bytes())?,
        _strings => return Err(Error::type_error(
            "Cast: casting from strings is not supported",
        )));
    *o = BlobValue::Tensor(t);
    Ok(())
}

fn cast_into(o: &mut BlobValue, src: &Tensor, to: DataType) -> Result<()> {
    if to == DataType::String {
        return cast_to_strings(o, src);
    }
    crate::with_match_dtype!(tensor pod src, |a: T| cast_from(o, a.view(), to),
    // A bool converts as its 0 or 1.
    else Tensor::Bool(a) => cast_from(o, crate::tensor::map_array(a.view(), |&x| u8::from(x))?.view(), to),
    _strings => Err(Error::type_error(
        "Cast: casting from strings is not supported",
    )))
}

fn cast(l: &mut Locked<'_>, to: DataType) -> Result<()> {
    let src = l.tensor(0)?;
    if src.dtype() == DataType::String {
        return Err(
            Error::type_error("Cast: casting from strings is not supported")
                .with_blob(l.input_name(0)),
        );
    }
    if l.aliases(0, 0) {
        if src.dtype() == to {
            return Ok(());
        }
        let mut fresh = BlobValue::Empty;
        cast_into(&mut fresh, src, to).map_err(|e| e.with_blob(l.input_name(0)))?;
        *l.output(0) = fresh;
        return Ok(());
    }
    let (o, i) = l
        .output_and_input(0, 0)
        .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
    cast_into(o, i.tensor()?, to)
}

/// Input 0 of a conversion op, if it holds `want`; else a typed error
/// naming the op, the dtype and the blob.
fn conversion_input<'a>(l: &'a Locked<'_>, op: &str, want: DataType) -> Result<&'a Tensor> {
    let t = l.tensor(0)?;
    if t.dtype() != want {
        return Err(unsupported(op, t.dtype(), &[want]).with_blob(l.input_name(0)));
    }
    Ok(t)
}

fn build_float_to_half(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let clip = ctx.args.bool("clip", false)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        conversion_input(&l, "FloatToHalf", DataType::Float)?;
        let (o, i) = l
            .output_and_input(0, 0)
            .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
        let a = i.tensor()?.array::<f32>()?.view();
        const MAX: f32 = 65504.0;
        if clip {
            write_unary(o, a, |x: f32| f16::from_f32(x.clamp(-MAX, MAX)))
        } else {
            write_unary(o, a, f16::from_f32)
        }?;
        Ok(true)
    }))
}

fn build_half_to_float(_ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        conversion_input(&l, "HalfToFloat", DataType::Float16)?;
        let (o, i) = l
            .output_and_input(0, 0)
            .ok_or_else(|| bug("output unexpectedly aliases the input"))?;
        write_unary(o, i.tensor()?.array::<f16>()?.view(), f16::to_f32)?;
        Ok(true)
    }))
}

fn build_cast(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let to = parse_to(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        cast(&mut l, to)?;
        Ok(true)
    }))
}
