//! Quantised uint8 inference (issue 29): Caffe2's `Int8*` ops, which the
//! model zoo's int8 Mask R-CNN 2Go net is made of.
//!
//! A quantised tensor is an [`Int8Tensor`] object in a blob: a uint8 tensor
//! (an int32 one for biases) with the float `scale` and int32 `zero_point`
//! that map its integers q to the reals `scale x (q - zero_point)` (Caffe2's
//! `Int8TensorCPU`). The ops take and give such blobs; `Int8Quantize` and
//! `Int8Dequantize` cross to and from float32 tensors, the two fills make
//! weights and biases. Images are NHWC. Every result is integer arithmetic
//! that Caffe2's `int8_utils.h` describes: a real multiplier in [0, 1) is
//! turned once into a Q31 fixed-point multiplier and a right shift, and
//! applied with a rounding doubling high multiply and a rounding right
//! shift, so results are bit-exact and the same on every machine.

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

use super::conv::window::{image_shape, Geo, Window};
use super::kit::{dense, kernel, parse_order, Order};
use crate::arg;
use crate::args::Args;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{BlobProto, QTensorProto};
use crate::operator::{ArgDoc, Locked, OpDefCtx, OpSchema, Operator, ShapeInfo};
use crate::shapes::rules;
use crate::tensor::{checked_numel, filled_vec, try_collect, zeroed_vec, DataType, Tensor};
use std::sync::Arc;

/// The blob type tag of a saved quantised tensor (Caffe2's).
pub const INT8_TAG: &str = "Int8TensorCPU";

/// A quantised tensor: `data` (uint8, or int32 for a bias) stands for the
/// reals `scale x (data - zero_point)`.
#[derive(Clone, Debug)]
pub struct Int8Tensor {
    pub data: Tensor,
    pub scale: f32,
    pub zero_point: i32,
}

impl BlobObject for Int8Tensor {
    fn kind_name(&self) -> &'static str {
        INT8_TAG
    }

    /// Caffe2's form: a `QTensorProto` with the values in `data` (int32),
    /// `data_type` UINT8 or INT32, the zero point in `bias`, precision 8,
    /// unsigned.
    fn serialize(&self) -> Option<BlobProto> {
        let (data_type, data) = match &self.data {
            Tensor::U8(a) => (
                DataType::Uint8,
                try_collect(a.iter().map(|&v| i32::from(v)), "a saved Int8 tensor").ok()?,
            ),
            Tensor::I32(a) => (
                DataType::Int32,
                try_collect(a.iter().copied(), "a saved Int8 tensor").ok()?,
            ),
            _ => return None,
        };
        Some(BlobProto {
            r#type: Some(INT8_TAG.to_string()),
            qtensor: Some(QTensorProto {
                dims: self.data.shape().iter().map(|&d| d as i64).collect(),
                precision: 8,
                scale: f64::from(self.scale),
                bias: f64::from(self.zero_point),
                is_signed: false,
                data,
                data_type: Some(data_type as i32),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

fn corrupt(msg: String) -> Error {
    Error::new(ErrorKind::CorruptCheckpoint, msg)
}

/// Loads a saved quantised tensor (the decoder of [`INT8_TAG`]).
fn decode_int8(p: &BlobProto) -> Result<BlobValue> {
    let q = p
        .qtensor
        .as_ref()
        .ok_or_else(|| corrupt("a saved Int8TensorCPU has no qtensor field".to_string()))?;
    let dims = q
        .dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| {
            corrupt(format!(
                "a saved Int8TensorCPU has a negative dim: {:?}",
                q.dims
            ))
        })?;
    let n = checked_numel::<u8>(&dims, "a loaded Int8 tensor")?;
    if q.data.len() != n {
        return Err(corrupt(format!(
            "a saved Int8TensorCPU of shape {dims:?} holds {} values, not {n}",
            q.data.len()
        )));
    }
    let scale = q.scale as f32;
    if !(scale.is_finite() && scale > 0.0) {
        return Err(corrupt(format!(
            "a saved Int8TensorCPU has scale {}; it must be a positive number",
            q.scale
        )));
    }
    if q.bias.fract() != 0.0 || q.bias < f64::from(i32::MIN) || q.bias > f64::from(i32::MAX) {
        return Err(corrupt(format!(
            "a saved Int8TensorCPU has zero point {}; it must be an int32",
            q.bias
        )));
    }
    let data = match q.data_type.unwrap_or(DataType::Int32 as i32) {
        t if t == DataType::Uint8 as i32 => {
            if !q.data.iter().all(|v| (0..=255).contains(v)) {
                return Err(corrupt(
                    "a saved uint8 Int8TensorCPU holds a value outside 0..=255".to_string(),
                ));
            }
            let v = try_collect(q.data.iter().map(|&v| v as u8), "a loaded Int8 tensor")?;
            Tensor::from_vec(&dims, v)?
        }
        t if t == DataType::Int32 as i32 => Tensor::from_vec(
            &dims,
            try_collect(q.data.iter().copied(), "a loaded Int8 tensor")?,
        )?,
        other => {
            return Err(corrupt(format!(
            "a saved Int8TensorCPU has data_type {other}; only UINT8 (6) and INT32 (2) are known"
        )))
        }
    };
    Ok(BlobValue::Object(Arc::new(Int8Tensor {
        data,
        scale,
        zero_point: q.bias as i32,
    })))
}

pub fn codecs() -> Vec<(&'static str, crate::storage::BlobDecoder)> {
    vec![(INT8_TAG, decode_int8)]
}

// ------------------------------------------------- fixed-point arithmetic --

/// (x * m) / 2^31 rounded to nearest, halves up (toward +inf), saturating the
/// one overflowing case (both operands i32::MIN): gemmlowp's
/// SaturatingRoundingDoublingHighMul, which Caffe2's int8 kernels use.
pub fn doubling_high_mul(x: i32, m: i32) -> i32 {
    if x == i32::MIN && m == i32::MIN {
        return i32::MAX;
    }
    let p = i64::from(x) * i64::from(m);
    let nudge = if p >= 0 { 1i64 << 30 } else { 1 - (1i64 << 30) };
    // Division truncates toward zero, as C++'s.
    ((p + nudge) / (1i64 << 31)) as i32
}

/// x / 2^shift rounded to nearest, halves away from zero (gemmlowp's
/// RoundingDivideByPOT; shifts past 62 act as 62).
pub fn rounding_shift(x: i32, shift: u32) -> i32 {
    let s = shift.min(62);
    let x = i64::from(x);
    let mask = (1i64 << s) - 1;
    let rem = x & mask;
    let threshold = (mask >> 1) + i64::from(x < 0);
    ((x >> s) + i64::from(rem > threshold)) as i32
}

/// A real multiplier in [0, 1) as a Q31 multiplier and a right shift
/// (Caffe2's QuantizeMultiplierSmallerThanOne): m = q x 2^-shift with q in
/// [0.5, 1) rounded (halves to even) to 31 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Multiplier {
    pub q31: i32,
    pub shift: u32,
}

impl Multiplier {
    pub fn new(real: f64) -> Option<Multiplier> {
        if !(real.is_finite() && (0.0..1.0).contains(&real)) {
            return None;
        }
        if real == 0.0 {
            return Some(Multiplier { q31: 0, shift: 0 });
        }
        let (frac, exp) = frexp(real);
        // real < 1, so exp <= 0.
        let mut shift = (-exp) as u32;
        let mut fixed = (frac * (1u64 << 31) as f64).round_ties_even() as i64;
        if fixed == 1i64 << 31 {
            fixed /= 2;
            shift = shift.saturating_sub(1);
        }
        Some(Multiplier {
            q31: fixed as i32,
            shift,
        })
    }

    /// x times the multiplier, rounded.
    #[inline]
    pub fn apply(self, x: i32) -> i32 {
        rounding_shift(doubling_high_mul(x, self.q31), self.shift)
    }
}

/// (f, e) with v = f x 2^e and f in [0.5, 1), for a positive finite v.
fn frexp(v: f64) -> (f64, i32) {
    let bits = v.to_bits();
    let raw = ((bits >> 52) & 0x7ff) as i32;
    if raw == 0 {
        // Subnormal: scale into the normal range first.
        let (f, e) = frexp(v * 2f64.powi(64));
        return (f, e - 64);
    }
    let f = f64::from_bits((bits & !(0x7ffu64 << 52)) | (1022u64 << 52));
    (f, raw - 1022)
}

/// Caffe2's QuantizeUint8: zero_point + round(v / scale) (float32, halves
/// to even), clamped to 0..=255 (NaN gives the zero point).
pub fn quantize_u8(v: f32, scale: f32, zero_point: i32) -> u8 {
    let r = (v / scale).round_ties_even();
    // Saturating: a huge quotient clamps to 0 or 255, never wraps.
    let q = i64::from(zero_point).saturating_add(r as i64);
    q.clamp(0, 255) as u8
}

// ------------------------------------------------------------ arguments --

/// The output's quantisation (`Y_scale`, `Y_zero_point`), checked.
#[derive(Clone, Copy, Debug)]
struct OutQ {
    scale: f32,
    zero_point: i32,
}

fn out_q(ctx: &OpDefCtx<'_>) -> Result<OutQ> {
    let scale = ctx.args.f32("Y_scale", 1.0)?;
    if !(scale.is_finite() && scale > 0.0) {
        return Err(ctx.bad_arg(format!("Y_scale must be a positive number, got {scale}")));
    }
    let zp = ctx.args.i64("Y_zero_point", 0)?;
    if !(0..=255).contains(&zp) {
        return Err(ctx.bad_arg(format!(
            "Y_zero_point must be in 0..=255 (a uint8 value), got {zp}"
        )));
    }
    Ok(OutQ {
        scale,
        zero_point: zp as i32,
    })
}

/// Int8 images are NHWC only (Caffe2's int8 kernels).
fn nhwc_only(ctx: &OpDefCtx<'_>) -> Result<()> {
    match parse_order(ctx)? {
        Order::Nhwc => Ok(()),
        Order::Nchw => Err(ctx.bad_arg(
            "int8 ops take NHWC images only; set order to \"NHWC\" (NCHW2NHWC converts a float image)",
        )),
    }
}

// --------------------------------------------------------------- inputs --

/// Input `i` as a quantised tensor, or a type error naming the op and blob.
fn q_in<'l>(l: &'l Locked<'_>, op: &str, i: usize, what: &str) -> Result<&'l Int8Tensor> {
    let v = l.input(i);
    v.object_ref::<Int8Tensor>(INT8_TAG).map_err(|_| {
        let name = l.input_name(i);
        let hint = if matches!(v, BlobValue::Tensor(_)) {
            " (a float tensor is quantised by Int8Quantize)"
        } else {
            ""
        };
        Error::type_error(format!(
            "{op}: {what} ('{name}') must be an {INT8_TAG} (a quantised tensor), got {}{hint}",
            v.kind_name()
        ))
        .with_blob(name)
    })
}

/// Input `i` as a uint8 quantised tensor (its data, scale and zero point).
fn u8_in<'l>(
    l: &'l Locked<'_>,
    op: &str,
    i: usize,
    what: &str,
) -> Result<(&'l ndarray::ArrayD<u8>, &'l Int8Tensor)> {
    let q = q_in(l, op, i, what)?;
    match &q.data {
        Tensor::U8(a) => {
            let a: &ndarray::ArrayD<u8> = a;
            Ok((a, q))
        }
        other => {
            let name = l.input_name(i);
            Err(Error::type_error(format!(
                "{op}: {what} ('{name}') must hold uint8 data, got {}",
                other.dtype()
            ))
            .with_blob(name))
        }
    }
}

/// X (input 0) as a uint8 NHWC image: its data, its quantisation and its
/// dims [N, H, W, C], or a typed error naming the op and blob.
fn image_in<'l>(
    l: &'l Locked<'_>,
    op: &str,
) -> Result<(&'l ndarray::ArrayD<u8>, &'l Int8Tensor, [usize; 4])> {
    let (x, xq) = u8_in(l, op, 0, "X")?;
    let xs = x.shape();
    let [n, h, w, c] = *xs else {
        let xn = l.input_name(0);
        return Err(Error::shape(format!(
            "{op}: X ('{xn}', shape {xs:?}) must be a 4-D NHWC image"
        ))
        .with_blob(xn));
    };
    Ok((x, xq, [n, h, w, c]))
}

fn set_q(l: &mut Locked<'_>, j: usize, data: Tensor, scale: f32, zero_point: i32) {
    *l.output(j) = BlobValue::Object(Arc::new(Int8Tensor {
        data,
        scale,
        zero_point,
    }));
}

/// The requantisation of an accumulator scaled by `real` (<1), or an
/// invalid-argument error naming the op and blob.
fn multiplier(op: &str, real: f64, what: &str, blob: &str) -> Result<Multiplier> {
    Multiplier::new(real).ok_or_else(|| {
        Error::invalid_arg(format!(
            "{op}: the requantisation multiplier {what} = {real} must be in [0, 1); choose a larger Y_scale"
        ))
        .with_blob(blob)
    })
}

// ------------------------------------------------- quantize, dequantize --

fn build_quantize(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let t = l.tensor(0)?;
        let Tensor::F32(x) = t else {
            let name = l.input_name(0);
            return Err(Error::type_error(format!(
                "{op}: X ('{name}') must be a float32 tensor, got {}",
                t.dtype()
            ))
            .with_blob(name));
        };
        let shape = x.shape().to_vec();
        let y = try_collect(
            x.iter().map(|&v| quantize_u8(v, q.scale, q.zero_point)),
            format_args!("{op}'s output"),
        )?;
        let y = Tensor::from_vec(&shape, y)?;
        set_q(&mut l, 0, y, q.scale, q.zero_point);
        Ok(true)
    }))
}

fn build_dequantize(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let (x, q) = u8_in(&l, &op, 0, "X")?;
        let (s, z) = (q.scale, q.zero_point);
        let shape = x.shape().to_vec();
        let y = try_collect(
            x.iter().map(|&v| (i32::from(v) - z) as f32 * s),
            format_args!("{op}'s output"),
        )?;
        l.set_output(0, Tensor::from_vec(&shape, y)?);
        Ok(true)
    }))
}

// --------------------------------------------------------------- fills --

fn build_fill(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type();
    let ints = op == "Int8GivenIntTensorFill";
    let scale = ctx.args.f32("Y_scale", 1.0)?;
    if !(scale.is_finite() && scale > 0.0) {
        return Err(ctx.bad_arg(format!("Y_scale must be a positive number, got {scale}")));
    }
    let zp = ctx.args.i64("Y_zero_point", 0)?;
    let zp = i32::try_from(zp)
        .ok()
        .filter(|z| ints || (0..=255).contains(z))
        .ok_or_else(|| ctx.bad_arg(format!("Y_zero_point {zp} is out of range")))?;
    let shape = ctx.args.ints("shape")?.unwrap_or_default();
    let shape = shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| ctx.bad_arg(format!("shape must hold dims >= 0, got {shape:?}")))?;
    // Counted without allocating: a huge shape with few values is an error.
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ctx.bad_arg(format!("shape {shape:?} has too many elements")))?;
    let data = if ints {
        let v = ctx.args.ints("values")?.unwrap_or_default();
        if v.len() != n {
            return Err(ctx.bad_arg(format!(
                "values holds {} ints but shape {shape:?} has {n} elements",
                v.len()
            )));
        }
        let v = v
            .iter()
            .map(|&x| i32::try_from(x))
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map_err(|_| ctx.bad_arg("values must be int32s"))?;
        Tensor::from_vec(&shape, v)?
    } else {
        let v = ctx.args.bytes_opt("values")?.unwrap_or_default();
        if v.len() != n {
            return Err(ctx.bad_arg(format!(
                "values holds {} bytes but shape {shape:?} has {n} elements",
                v.len()
            )));
        }
        Tensor::from_vec(&shape, v)?
    };
    let value = Int8Tensor {
        data,
        scale,
        zero_point: zp,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        *l.output(0) = BlobValue::Object(Arc::new(value.clone()));
        Ok(true)
    }))
}

// ---------------------------------------------------------- convolution --

#[derive(Clone, Copy, PartialEq)]
enum Act {
    None,
    Relu,
}

fn act_of(op: &str) -> Act {
    if op.ends_with("Relu") {
        Act::Relu
    } else {
        Act::None
    }
}

/// The clamp of an output: 0..=255, from the zero point up with Relu (the
/// quantised 0.0).
fn limits(act: Act, q: OutQ) -> (i32, i32) {
    match act {
        Act::None => (0, 255),
        Act::Relu => (q.zero_point.clamp(0, 255), 255),
    }
}

/// An int32 accumulator requantised to a uint8 output.
#[inline]
fn requantize(acc: i64, m: Multiplier, q: OutQ, lo: i32, hi: i32) -> u8 {
    let acc = acc.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
    (m.apply(acc) + q.zero_point).clamp(lo, hi) as u8
}

/// The bias input: an int32 quantised vector of `m` values.
fn bias_in(l: &Locked<'_>, op: &str, i: usize, m: usize) -> Result<Vec<i32>> {
    let b = q_in(l, op, i, "the bias")?;
    let name = l.input_name(i);
    let Tensor::I32(a) = &b.data else {
        return Err(Error::type_error(format!(
            "{op}: the bias ('{name}') must hold int32 data (Int8GivenIntTensorFill), got {}",
            b.data.dtype()
        ))
        .with_blob(name));
    };
    if a.len() != m {
        return Err(Error::shape(format!(
            "{op}: the bias ('{name}', shape {:?}) must hold one value per output channel ({m})",
            a.shape()
        ))
        .with_blob(name));
    }
    Ok(dense(a).into_owned())
}

struct ConvArgs {
    op: String,
    win: Window,
    group: usize,
    q: OutQ,
    act: Act,
}

fn build_conv(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    nhwc_only(ctx)?;
    let group = ctx.args.i64("group", 1)?;
    if group < 1 {
        return Err(ctx.bad_arg(format!("group must be >= 1, got {group}")));
    }
    let a = ConvArgs {
        op: ctx.op_type().to_string(),
        win: Window::parse(ctx, true)?,
        group: group as usize,
        q: out_q(ctx)?,
        act: act_of(ctx.op_type()),
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        conv(&mut l, &a)?;
        Ok(true)
    }))
}

fn conv(l: &mut Locked<'_>, a: &ConvArgs) -> Result<()> {
    let op = a.op.as_str();
    let (x, xq, [n, h, iw, c]) = image_in(l, op)?;
    let (w, wq) = u8_in(l, op, 1, "the filter")?;
    let (xn, wn) = (l.input_name(0), l.input_name(1));
    let sp = [h, iw];
    let ws = w.shape();
    let g = a.group;
    if ws.len() != 4 || c % g != 0 || ws[0] % g != 0 || ws[3] * g != c {
        return Err(Error::shape(format!(
            "{op}: the filter ('{wn}', shape {ws:?}) must be (M, KH, KW, C / group) with M and C = {c} divisible by group = {g}"
        ))
        .with_blob(wn));
    }
    let m = ws[0];
    let geo: Geo = a
        .win
        .geometry(&sp, Some(&ws[1..3]), None)
        .map_err(|e| Error::new(e.kind, format!("{op}: {}", e.message)).with_blob(xn))?;
    if geo.k[1..] != ws[1..3] {
        return Err(Error::shape(format!(
            "{op}: the kernel {:?} differs from the filter's ('{wn}', shape {ws:?})",
            &geo.k[1..]
        ))
        .with_blob(wn));
    }
    let bias = bias_in(l, op, 2, m)?;
    let real = f64::from(xq.scale) * f64::from(wq.scale) / f64::from(a.q.scale);
    let mult = multiplier(op, real, "X_scale x W_scale / Y_scale", l.output_name(0))?;
    let (lo, hi) = limits(a.act, a.q);
    let (oh, ow) = (geo.outs[1], geo.outs[2]);
    let (ih, iw) = (geo.ins[1], geo.ins[2]);
    let ys = image_shape(n, m, &[oh, ow], Order::Nhwc);
    let mut y = zeroed_vec::<u8>(&ys, format_args!("{op}'s output"))?;
    let xd = dense(x);
    let wd = dense(w);
    let (kh, kw) = (geo.k[1], geo.k[2]);
    let (cg, mg) = (c / g, m / g);
    let (xz, wz) = (i64::from(xq.zero_point), i64::from(wq.zero_point));
    // Each filter's sum of (w - wz) is not needed: taps are skipped, not
    // padded, and a padded tap adds (xz - xz) x (w - wz) = 0.
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                let yo = ((b * oh + oy) * ow + ox) * m;
                for oc in 0..m {
                    let gi = oc / mg;
                    let mut acc = i64::from(bias[oc]);
                    for ky in 0..kh {
                        let Some(iy) = geo.tap(1, oy, ky) else {
                            continue;
                        };
                        for kx in 0..kw {
                            let Some(ix) = geo.tap(2, ox, kx) else {
                                continue;
                            };
                            let xo = ((b * ih + iy) * iw + ix) * c + gi * cg;
                            let wo = ((oc * kh + ky) * kw + kx) * cg;
                            for k in 0..cg {
                                acc += (i64::from(xd[xo + k]) - xz) * (i64::from(wd[wo + k]) - wz);
                            }
                        }
                    }
                    y[yo + oc] = requantize(acc, mult, a.q, lo, hi);
                }
            }
        }
    }
    let y = Tensor::from_vec(&ys, y)?;
    set_q(l, 0, y, a.q.scale, a.q.zero_point);
    Ok(())
}

// ------------------------------------------------------- fully connected --

fn build_fc(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let q = out_q(ctx)?;
    let act = act_of(&op);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        fc(&mut l, &op, q, act)?;
        Ok(true)
    }))
}

fn fc(l: &mut Locked<'_>, op: &str, q: OutQ, act: Act) -> Result<()> {
    let (x, xq) = u8_in(l, op, 0, "X")?;
    let (w, wq) = u8_in(l, op, 1, "W")?;
    let (xn, wn) = (l.input_name(0), l.input_name(1));
    let xs = x.shape();
    if xs.is_empty() {
        return Err(Error::shape(format!(
            "{op}: X ('{xn}') must have at least 1 dim (the batch), got a scalar"
        ))
        .with_blob(xn));
    }
    let rows = xs[0];
    let k: usize = xs[1..].iter().product();
    let ws = w.shape();
    if ws.len() < 2 || ws[1..].iter().product::<usize>() != k {
        return Err(Error::shape(format!(
            "{op}: W ('{wn}', shape {ws:?}) must be (N, K) with K = {k}, the size of X ('{xn}', shape {xs:?}) past its first dim"
        ))
        .with_blob(wn));
    }
    let nout = ws[0];
    let bias = bias_in(l, op, 2, nout)?;
    let real = f64::from(xq.scale) * f64::from(wq.scale) / f64::from(q.scale);
    let mult = multiplier(op, real, "X_scale x W_scale / Y_scale", l.output_name(0))?;
    let (lo, hi) = limits(act, q);
    let ys = [rows, nout];
    let mut y = zeroed_vec::<u8>(&ys, format_args!("{op}'s output"))?;
    let (xd, wd) = (dense(x), dense(w));
    let (xz, wz) = (i64::from(xq.zero_point), i64::from(wq.zero_point));
    for r in 0..rows {
        let xr = &xd[r * k..(r + 1) * k];
        for o in 0..nout {
            let wr = &wd[o * k..(o + 1) * k];
            let mut acc = i64::from(bias[o]);
            for (&xv, &wv) in xr.iter().zip(wr) {
                acc += (i64::from(xv) - xz) * (i64::from(wv) - wz);
            }
            y[r * nout + o] = requantize(acc, mult, q, lo, hi);
        }
    }
    let y = Tensor::from_vec(&ys, y)?;
    set_q(l, 0, y, q.scale, q.zero_point);
    Ok(())
}

// ------------------------------------------------------------------ sum --

/// Both addends are scaled to 2^20 x (value / (2 x the larger input
/// scale)) before adding, so the sum keeps 20 fractional bits.
const ADD_LEFT_SHIFT: u32 = 20;

fn build_sum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let q = out_q(ctx)?;
    if op.starts_with("Int8Add") {
        // Accepted as Add's; the addends must still have one shape, as
        // Caffe2's Int8Add required (it never broadcast).
        let b = ctx.args.i64("broadcast", 0)?;
        if !(0..=1).contains(&b) {
            return Err(ctx.bad_arg(format!("broadcast must be 0 or 1, got {b}")));
        }
    }
    let act = act_of(&op);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        sum(&mut l, &op, q, act)?;
        Ok(true)
    }))
}

fn sum(l: &mut Locked<'_>, op: &str, q: OutQ, act: Act) -> Result<()> {
    let (a, aq) = u8_in(l, op, 0, "input 0")?;
    let (b, bq) = u8_in(l, op, 1, "input 1")?;
    if a.shape() != b.shape() {
        return Err(Error::shape(format!(
            "{op}: '{}' (shape {:?}) and '{}' (shape {:?}) must have the same shape (Caffe2's int8 addition does not broadcast)",
            l.input_name(0),
            a.shape(),
            l.input_name(1),
            b.shape()
        ))
        .with_blob(l.input_name(1)));
    }
    let out = l.output_name(0);
    let twice_max = 2.0 * f64::from(aq.scale.max(bq.scale));
    let ma = multiplier(
        op,
        f64::from(aq.scale) / twice_max,
        "X0_scale / (2 max scale)",
        out,
    )?;
    let mb = multiplier(
        op,
        f64::from(bq.scale) / twice_max,
        "X1_scale / (2 max scale)",
        out,
    )?;
    let my = multiplier(
        op,
        twice_max / (f64::from(1u32 << ADD_LEFT_SHIFT) * f64::from(q.scale)),
        "2 max scale / (2^20 Y_scale)",
        out,
    )?;
    let (lo, hi) = limits(act, q);
    let (az, bz) = (aq.zero_point, bq.zero_point);
    let shape = a.shape().to_vec();
    let y = try_collect(
        a.iter().zip(b.iter()).map(|(&u, &v)| {
            let su = ma.apply((i32::from(u) - az).wrapping_shl(ADD_LEFT_SHIFT));
            let sv = mb.apply((i32::from(v) - bz).wrapping_shl(ADD_LEFT_SHIFT));
            (my.apply(su.wrapping_add(sv)) + q.zero_point).clamp(lo, hi) as u8
        }),
        format_args!("{op}'s output"),
    )?;
    let y = Tensor::from_vec(&shape, y)?;
    set_q(l, 0, y, q.scale, q.zero_point);
    Ok(())
}

// --------------------------------------------------------------- pooling --

struct PoolArgs {
    op: String,
    win: Window,
    q: OutQ,
    max: bool,
    act: Act,
}

fn build_pool(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    nhwc_only(ctx)?;
    let op = ctx.op_type().to_string();
    let a = PoolArgs {
        max: op.starts_with("Int8MaxPool"),
        act: act_of(&op),
        win: Window::parse(ctx, false)?,
        q: out_q(ctx)?,
        op,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        pool(&mut l, &a)?;
        Ok(true)
    }))
}

/// Ops that keep their input's quantisation: the Y arguments must match it.
fn same_q(l: &Locked<'_>, op: &str, xq: &Int8Tensor, q: OutQ) -> Result<()> {
    if xq.scale != q.scale || xq.zero_point != q.zero_point {
        let name = l.input_name(0);
        return Err(Error::invalid_arg(format!(
            "{op}: Y_scale and Y_zero_point ({}, {}) must equal X's ('{name}': {}, {}); this op does not requantise",
            q.scale, q.zero_point, xq.scale, xq.zero_point
        ))
        .with_blob(name));
    }
    Ok(())
}

fn pool(l: &mut Locked<'_>, a: &PoolArgs) -> Result<()> {
    let op = a.op.as_str();
    let (x, xq, [n, h, w, c]) = image_in(l, op)?;
    same_q(l, op, xq, a.q)?;
    let xn = l.input_name(0);
    let sp = [h, w];
    let geo = a
        .win
        .geometry(&sp, None, None)
        .map_err(|e| Error::new(e.kind, format!("{op}: {}", e.message)).with_blob(xn))?;
    let (oh, ow, ih, iw) = (geo.outs[1], geo.outs[2], geo.ins[1], geo.ins[2]);
    let ys = image_shape(n, c, &[oh, ow], Order::Nhwc);
    let mut y = zeroed_vec::<u8>(&ys, format_args!("{op}'s output"))?;
    let mut acc = filled_vec::<u32>(c, 0, format_args!("{op}'s accumulator"))?;
    let (lo, hi) = limits(a.act, a.q);
    let xd = dense(x);
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                acc.iter_mut().for_each(|v| *v = 0);
                let mut count = 0u32;
                for ky in 0..geo.k[1] {
                    let Some(iy) = geo.tap(1, oy, ky) else {
                        continue;
                    };
                    for kx in 0..geo.k[2] {
                        let Some(ix) = geo.tap(2, ox, kx) else {
                            continue;
                        };
                        count += 1;
                        let xo = ((b * ih + iy) * iw + ix) * c;
                        for (k, v) in acc.iter_mut().enumerate() {
                            let xv = u32::from(xd[xo + k]);
                            *v = if a.max { (*v).max(xv) } else { *v + xv };
                        }
                    }
                }
                let yo = ((b * oh + oy) * ow + ox) * c;
                for (k, &v) in acc.iter().enumerate() {
                    let r = if a.max {
                        v as i32
                    } else if count == 0 {
                        xq.zero_point
                    } else {
                        ((v + count / 2) / count) as i32
                    };
                    y[yo + k] = r.clamp(lo, hi) as u8;
                }
            }
        }
    }
    let y = Tensor::from_vec(&ys, y)?;
    set_q(l, 0, y, a.q.scale, a.q.zero_point);
    Ok(())
}

// --------------------------------------------------------------- softmax --

/// Int8Softmax's output quantisation, fixed: scale 1/256, zero point 0.
const SOFTMAX_SCALE: f32 = 1.0 / 256.0;

fn build_softmax(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let q = out_q(ctx)?;
    if q.scale != SOFTMAX_SCALE || q.zero_point != 0 {
        return Err(ctx.bad_arg(format!(
            "the output of Int8Softmax is quantised with Y_scale 1/256 (0.00390625) and Y_zero_point 0; got {} and {}",
            q.scale, q.zero_point
        )));
    }
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        softmax(&mut l, &op)?;
        Ok(true)
    }))
}

/// Per row of X (its first dim; a row is the rest): with m the row's
/// largest value, e(v) = round(s x exp((v - m) x X_scale)) for
/// s = min((2^32 - 1) / row length, 2^23 - 1), and
/// y = min(255, (256 e(v) + sum / 2) / sum), sum the row's sum of e(v)
/// (QNNPACK's table method, which Caffe2's Int8Softmax ran).
fn softmax(l: &mut Locked<'_>, op: &str) -> Result<()> {
    let (x, xq) = u8_in(l, op, 0, "X")?;
    let xn = l.input_name(0);
    let xs = x.shape().to_vec();
    if xs.is_empty() {
        return Err(Error::shape(format!(
            "{op}: X ('{xn}') must have at least 1 dim (the batch), got a scalar"
        ))
        .with_blob(xn));
    }
    let rows = xs[0];
    let len: usize = xs[1..].iter().product();
    let mut y = zeroed_vec::<u8>(&xs, format_args!("{op}'s output"))?;
    if len > 0 && rows > 0 {
        let scale = (f64::from(u32::MAX) / len as f64).min(8_388_607.0);
        let table: Vec<u32> = (0..256)
            .map(|i| {
                let e = scale * ((f64::from(i) - 255.0) * f64::from(xq.scale)).exp();
                e.round_ties_even() as u32
            })
            .collect();
        let xd = dense(x);
        for r in 0..rows {
            let row = &xd[r * len..(r + 1) * len];
            let m = row.iter().copied().max().unwrap_or(255);
            let at = |v: u8| table[usize::from(v) + 255 - usize::from(m)];
            let total: u32 = row.iter().map(|&v| at(v)).fold(0u32, u32::wrapping_add);
            let total = total.max(1);
            for (k, &v) in row.iter().enumerate() {
                let q = ((at(v) << 8) + total / 2) / total;
                y[r * len + k] = q.min(255) as u8;
            }
        }
    }
    let y = Tensor::from_vec(&xs, y)?;
    set_q(l, 0, y, SOFTMAX_SCALE, 0);
    Ok(())
}

// --------------------------------------------------------------- resize --

fn build_resize(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    // Not a window op: NHWC is its default (Caffe2's read no order).
    let order = ctx.args.string("order", "NHWC")?;
    if order != "NHWC" {
        return Err(ctx.bad_arg(format!(
            "Int8ResizeNearest takes NHWC images only, got order \"{order}\""
        )));
    }
    let op = ctx.op_type().to_string();
    let mut scales = [1f32; 2];
    for (i, name) in ["height_scale", "width_scale"].into_iter().enumerate() {
        let v = ctx.args.f32(name, 1.0)?;
        scales[i] = v;
        if !(v.is_finite() && v > 0.0) {
            return Err(ctx.bad_arg(format!("{name} must be > 0, got {v}")));
        }
    }
    let q = out_q(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        resize(&mut l, &op, scales, q)?;
        Ok(true)
    }))
}

/// Output pixel (y, x) is input pixel (min(floor(y / height_scale), H - 1),
/// min(floor(x / width_scale), W - 1)), float32 arithmetic as ResizeNearest.
fn resize(l: &mut Locked<'_>, op: &str, s: [f32; 2], q: OutQ) -> Result<()> {
    let (x, xq, [n, h, w, c]) = image_in(l, op)?;
    same_q(l, op, xq, q)?;
    let oh = (h as f32 * s[0]) as usize;
    let ow = (w as f32 * s[1]) as usize;
    let ys = [n, oh, ow, c];
    let mut y = zeroed_vec::<u8>(&ys, format_args!("{op}'s output"))?;
    let src = |o: usize, sc: f32, len: usize| ((o as f32 / sc) as usize).min(len.saturating_sub(1));
    let rows = try_collect(
        (0..oh).map(|o| src(o, s[0], h)),
        format_args!("{op}'s rows"),
    )?;
    let cols = try_collect(
        (0..ow).map(|o| src(o, s[1], w)),
        format_args!("{op}'s columns"),
    )?;
    let xd = dense(x);
    for b in 0..n {
        for (oy, &iy) in rows.iter().enumerate() {
            for (ox, &ix) in cols.iter().enumerate() {
                let yo = ((b * oh + oy) * ow + ox) * c;
                let xo = ((b * h + iy) * w + ix) * c;
                y[yo..yo + c].copy_from_slice(&xd[xo..xo + c]);
            }
        }
    }
    let y = Tensor::from_vec(&ys, y)?;
    set_q(l, 0, y, q.scale, q.zero_point);
    Ok(())
}

// ---------------------------------------------------- lookup-table ops --

/// Int8Relu, Int8LeakyRelu and Int8Sigmoid: each output byte is a function
/// of the input byte (and X's quantisation), so a 256-entry table per run.
#[derive(Clone, Copy)]
enum Lut {
    Relu,
    /// x below the zero point becomes zp + alpha x (x - zp), alpha as a
    /// Q31 multiplier.
    Leaky(Multiplier),
    Sigmoid,
}

fn build_lut(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let q = out_q(ctx)?;
    let kind = match op.as_str() {
        "Int8LeakyRelu" => {
            let alpha = ctx.args.f32("alpha", 0.01)?;
            let m = Some(f64::from(alpha))
                .filter(|&a| a > 0.0)
                .and_then(Multiplier::new)
                .ok_or_else(|| ctx.bad_arg(format!("alpha must be in (0, 1), got {alpha}")))?;
            Lut::Leaky(m)
        }
        "Int8Sigmoid" => {
            if q.scale != SOFTMAX_SCALE || q.zero_point != 0 {
                return Err(ctx.bad_arg(format!(
                    "the output of Int8Sigmoid is quantised with Y_scale 1/256 (0.00390625) and Y_zero_point 0; got {} and {}",
                    q.scale, q.zero_point
                )));
            }
            Lut::Sigmoid
        }
        _ => Lut::Relu,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        lut(&mut l, &op, kind, q)?;
        Ok(true)
    }))
}

/// Int8Sigmoid's table entry for byte v (QNNPACK's, in float32):
/// lrint(clamp(256 / (1 + exp(-X_scale x (v - X_zero_point))), 0, 255)).
fn sigmoid_entry(v: i32, scale: f32, zero_point: i32) -> u8 {
    let x = scale * (v - zero_point) as f32;
    let s = 256.0f32 / (1.0 + (-x).exp());
    s.clamp(0.0, 255.0).round_ties_even() as u8
}

fn lut(l: &mut Locked<'_>, op: &str, kind: Lut, q: OutQ) -> Result<()> {
    let (x, xq) = u8_in(l, op, 0, "X")?;
    if !matches!(kind, Lut::Sigmoid) {
        same_q(l, op, xq, q)?;
    }
    let z = xq.zero_point;
    let table: [u8; 256] = std::array::from_fn(|i| {
        let v = i as i32;
        let y = match kind {
            Lut::Relu => v.max(z),
            Lut::Leaky(m) if v < z => m.apply(v - z) + z,
            Lut::Leaky(_) => v,
            Lut::Sigmoid => return sigmoid_entry(v, xq.scale, z),
        };
        y.clamp(0, 255) as u8
    });
    let shape = x.shape().to_vec();
    let y = try_collect(
        x.iter().map(|&v| table[usize::from(v)]),
        format_args!("{op}'s output"),
    )?;
    let y = Tensor::from_vec(&shape, y)?;
    set_q(l, 0, y, q.scale, q.zero_point);
    Ok(())
}

// ------------------------------------------------------ data movement --

/// `e` with its message prefixed by the op's name (its context kept).
fn named(op: &str, mut e: Error) -> Error {
    if !e.message.starts_with(op) {
        e.message = format!("{op}: {}", e.message);
    }
    e
}

/// Ops that move X's values without changing them (Int8Reshape,
/// Int8Flatten, Int8Slice, Int8Transpose, Int8ChannelShuffle): the Y
/// arguments must equal X's quantisation, which the output keeps; `f`
/// makes the output's data from X's.
fn moved(
    l: &mut Locked<'_>,
    op: &str,
    q: OutQ,
    f: impl FnOnce(&Locked<'_>, &Tensor, &str) -> Result<Tensor>,
) -> Result<()> {
    let (_, xq) = u8_in(l, op, 0, "X")?;
    same_q(l, op, xq, q)?;
    let y = f(l, &xq.data, l.input_name(0)).map_err(|e| named(op, e).with_blob(l.input_name(0)))?;
    set_q(l, 0, y, q.scale, q.zero_point);
    Ok(())
}

fn build_reshape(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let arg = super::shape::reshape_arg(ctx)?;
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    let old_out = ctx.num_outputs() == 2;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let want = match &arg {
            Some(a) => a.clone(),
            None => super::shape::shape_input(&l, &op, 1)?,
        };
        let old = u8_in(&l, &op, 0, "X")?.0.shape().to_vec();
        moved(&mut l, &op, q, |_, x, name| {
            let new = super::shape::resolve_shape(&op, &want, x.shape(), name)?;
            super::shape::reshaped(x, &new)
        })?;
        if old_out {
            l.set_output(1, super::shape::dims_tensor(&old)?);
        }
        Ok(true)
    }))
}

fn build_flatten(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        moved(&mut l, &op, q, |_, x, name| {
            let shape = x.shape();
            // axis == ndim is allowed (an inner size of 1), as Flatten's.
            let ax = if axis == shape.len() as i64 {
                shape.len()
            } else {
                super::kit::canonical_axis(&op, "axis", axis, shape.len(), name)?
            };
            let new = [shape[..ax].iter().product(), shape[ax..].iter().product()];
            super::shape::reshaped(x, &new)
        })?;
        Ok(true)
    }))
}

fn build_slice(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let bounds = super::shape::slice_args(ctx, ctx.num_inputs())?;
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        moved(&mut l, &op, q, |l, x, name| {
            let (starts, ends) = super::shape::slice_bounds(l, &bounds)?;
            let ranges = super::shape::slice_ranges(x.shape(), &starts, &ends, name)?;
            super::shape::sliced(x, &ranges)
        })?;
        Ok(true)
    }))
}

fn build_transpose(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axes = ctx.args.ints("axes")?;
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        moved(&mut l, &op, q, |_, x, name| {
            let perm = super::shape::permutation(axes.as_deref(), x.ndim(), name)?;
            super::shape::transposed(x, &perm)
        })?;
        Ok(true)
    }))
}

fn build_channel_shuffle(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    nhwc_only(ctx)?;
    let group = ctx.args.i64("group", 1)?;
    let group = usize::try_from(group)
        .ok()
        .filter(|&g| g >= 1)
        .ok_or_else(|| ctx.bad_arg(format!("group must be >= 1, got {group}")))?;
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        moved(&mut l, &op, q, |_, x, name| {
            let xs = x.shape();
            let (&[_, _, _, c], Tensor::U8(a)) = (xs, x) else {
                return Err(Error::shape(format!(
                    "X ('{name}', shape {xs:?}) must be a 4-D NHWC image"
                )));
            };
            if c % group != 0 {
                return Err(Error::shape(format!(
                    "X ('{name}', shape {xs:?}) has {c} channels, which group = {group} does not divide"
                )));
            }
            // Channel g x K + k of each pixel moves to k x G + g.
            let k = c / group;
            let xd = dense(a);
            let mut y = zeroed_vec::<u8>(xs, "the shuffled channels")?;
            for (yp, xp) in y.chunks_mut(c.max(1)).zip(xd.chunks(c.max(1))) {
                for g in 0..group {
                    for j in 0..k {
                        yp[j * group + g] = xp[g * k + j];
                    }
                }
            }
            Tensor::from_vec(xs, y)
        })?;
        Ok(true)
    }))
}

// --------------------------------------------------------------- concat --

/// Int8Concat's axis: the `axis` argument, else 3 with order NHWC, 1 with
/// order NCHW, 0 with no order (Caffe2's defaults); with an order the
/// inputs are 4-D and the axis in 0..4.
#[derive(Clone, Copy)]
struct ConcatAxis {
    axis: i64,
    four_d: bool,
    add_axis: bool,
}

fn build_concat(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let order = ctx.args.string("order", "")?;
    let (default, four_d) = match order.as_str() {
        "NHWC" => (3, true),
        "NCHW" => (1, true),
        "" => (0, false),
        other => {
            return Err(ctx.bad_arg(format!(
                "order must be \"NHWC\" or \"NCHW\" (or not given), got \"{other}\""
            )))
        }
    };
    let axis = ctx.args.i64("axis", default)?;
    if four_d && !(0..4).contains(&axis) {
        return Err(ctx.bad_arg(format!(
            "with order {order} the axis must be in 0..4, got {axis}"
        )));
    }
    let a = ConcatAxis {
        axis,
        four_d,
        add_axis: ctx.args.i64("add_axis", 0)? != 0,
    };
    let q = out_q(ctx)?;
    let op = ctx.op_type().to_string();
    let split_out = ctx.num_outputs() == 2;
    let ni = ctx.num_inputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let (y, split) = concat(&l, &op, ni, a, q)?;
        set_q(&mut l, 0, y, q.scale, q.zero_point);
        if split_out {
            l.set_output(1, split);
        }
        Ok(true)
    }))
}

fn concat(l: &Locked<'_>, op: &str, ni: usize, a: ConcatAxis, q: OutQ) -> Result<(Tensor, Tensor)> {
    let mut inputs = Vec::with_capacity(ni);
    for i in 0..ni {
        let (x, xq) = u8_in(l, op, i, &format!("input {i}"))?;
        let name = l.input_name(i);
        if i == 0 {
            same_q(l, op, xq, q)?;
        } else if (xq.scale, xq.zero_point) != (q.scale, q.zero_point) {
            return Err(Error::invalid_arg(format!(
                "{op}: input {i} ('{name}') has scale {} and zero point {}; every input must have the output's ({}, {}): Int8Concat does not requantise",
                xq.scale, xq.zero_point, q.scale, q.zero_point
            ))
            .with_blob(name));
        }
        if a.four_d && x.ndim() != 4 {
            return Err(Error::shape(format!(
                "{op}: input {i} ('{name}', shape {:?}) must be 4-D when an order is given",
                x.shape()
            ))
            .with_blob(name));
        }
        inputs.push((name, &xq.data));
    }
    super::utility::join(&inputs, a.axis, a.add_axis, l.output_name(0)).map_err(|e| named(op, e))
}

// ------------------------------------------------- transposed convolution --

struct ConvTArgs {
    op: String,
    win: Window,
    adj: super::conv::window::Dims,
    q: OutQ,
}

fn build_conv_transpose(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    nhwc_only(ctx)?;
    // Caffe2 ran one group (QNNPACK's deconvolution with groups = 1).
    let group = ctx.args.i64("group", 1)?;
    if group != 1 {
        return Err(ctx.bad_arg(format!("Int8ConvTranspose takes group 1 only, got {group}")));
    }
    let a = ConvTArgs {
        op: ctx.op_type().to_string(),
        win: Window::parse(ctx, false)?,
        adj: super::conv::window::dims_arg(ctx, "adjs", "adj", &["adj_h", "adj_w"], Some(0))?,
        q: out_q(ctx)?,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        conv_transpose(&mut l, &a)?;
        Ok(true)
    }))
}

/// Y (N, (H - 1) x stride - pads + KH + adj, ..., M) from X (N, H, W, C) and
/// the filter (C, KH, KW, M): every input pixel adds (x - X_zero_point) x
/// (w - W_zero_point) to the outputs its taps reach; plus the bias,
/// requantised as Int8Conv's.
fn conv_transpose(l: &mut Locked<'_>, a: &ConvTArgs) -> Result<()> {
    let op = a.op.as_str();
    let (x, xq, [n, h, iw, c]) = image_in(l, op)?;
    let (w, wq) = u8_in(l, op, 1, "the filter")?;
    let wn = l.input_name(1);
    let sp = [h, iw];
    let ws = w.shape();
    if ws.len() != 4 || ws[0] != c {
        return Err(Error::shape(format!(
            "{op}: the filter ('{wn}', shape {ws:?}) must be (C, KH, KW, M) with C = {c}, X's channels"
        ))
        .with_blob(wn));
    }
    let m = ws[3];
    let adj = a.adj.resolve("adjs", 2, 1, 0).map_err(|e| named(op, e))?;
    let stride = a
        .win
        .stride
        .resolve("strides", 2, 1, 1)
        .map_err(|e| named(op, e))?;
    if adj.iter().zip(&stride).any(|(a, s)| a >= s) {
        return Err(Error::invalid_arg(format!(
            "{op}: adj {adj:?} must be smaller than the strides {stride:?}"
        )));
    }
    let geo: Geo = a
        .win
        .geometry(&sp, Some(&ws[1..3]), Some(&adj))
        .map_err(|e| named(op, e).with_blob(wn))?;
    let bias = bias_in(l, op, 2, m)?;
    let real = f64::from(xq.scale) * f64::from(wq.scale) / f64::from(a.q.scale);
    let mult = multiplier(op, real, "X_scale x W_scale / Y_scale", l.output_name(0))?;
    // The image side of the geometry is Y; its other side, X.
    let (oh, ow, ih, iw) = (geo.ins[1], geo.ins[2], geo.outs[1], geo.outs[2]);
    let (kh, kw) = (geo.k[1], geo.k[2]);
    let ys = [n, oh, ow, m];
    let mut acc = zeroed_vec::<i64>(&ys, format_args!("{op}'s accumulator"))?;
    for px in acc.chunks_mut(m.max(1)) {
        for (v, &b) in px.iter_mut().zip(&bias) {
            *v = i64::from(b);
        }
    }
    let (xd, wd) = (dense(x), dense(w));
    let (xz, wz) = (i64::from(xq.zero_point), i64::from(wq.zero_point));
    let mut xc = vec![0i64; c];
    for b in 0..n {
        for iy in 0..ih {
            for ix in 0..iw {
                let xo = ((b * ih + iy) * iw + ix) * c;
                for (v, &u) in xc.iter_mut().zip(&xd[xo..xo + c]) {
                    *v = i64::from(u) - xz;
                }
                for ky in 0..kh {
                    let Some(oy) = geo.tap(1, iy, ky) else {
                        continue;
                    };
                    for kx in 0..kw {
                        let Some(ox) = geo.tap(2, ix, kx) else {
                            continue;
                        };
                        let yo = ((b * oh + oy) * ow + ox) * m;
                        let out = &mut acc[yo..yo + m];
                        for (ci, &xv) in xc.iter().enumerate() {
                            let wo = ((ci * kh + ky) * kw + kx) * m;
                            for (o, &wv) in out.iter_mut().zip(&wd[wo..wo + m]) {
                                *o += xv * (i64::from(wv) - wz);
                            }
                        }
                    }
                }
            }
        }
    }
    let y = try_collect(
        acc.iter().map(|&v| requantize(v, mult, a.q, 0, 255)),
        format_args!("{op}'s output"),
    )?;
    let y = Tensor::from_vec(&ys, y)?;
    set_q(l, 0, y, a.q.scale, a.q.zero_point);
    Ok(())
}

// -------------------------------------------------------------- RoIAlign --

#[derive(Clone)]
struct RoiArgs {
    op: String,
    spatial_scale: f32,
    ph: usize,
    pw: usize,
    sampling: i64,
    q: OutQ,
}

fn build_roi_align(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    // Caffe2's reads the order with NHWC as its default, and takes no other.
    let order = ctx.args.string("order", "NHWC")?;
    if order != "NHWC" {
        return Err(ctx.bad_arg(format!(
            "Int8RoIAlign takes NHWC images only, got order \"{order}\""
        )));
    }
    let spatial_scale = ctx.args.f32("spatial_scale", 1.0)?;
    if !(spatial_scale.is_finite() && spatial_scale > 0.0) {
        return Err(ctx.bad_arg(format!("spatial_scale must be > 0, got {spatial_scale}")));
    }
    let pooled = |name: &str| -> Result<usize> {
        let v = ctx.args.i64(name, 1)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v >= 1)
            .ok_or_else(|| ctx.bad_arg(format!("{name} must be >= 1, got {v}")))
    };
    let a = RoiArgs {
        op: ctx.op_type().to_string(),
        spatial_scale,
        ph: pooled("pooled_h")?,
        pw: pooled("pooled_w")?,
        sampling: ctx.args.i64("sampling_ratio", -1)?,
        q: out_q(ctx)?,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        roi_align(&mut l, &a)?;
        Ok(true)
    }))
}

/// The most bilinear samples one RoI may take (bins x samples per bin).
const ROI_MAX_SAMPLES: usize = 1 << 24;

/// One bilinear sample of Int8RoIAlign (float32): four plane offsets and
/// their weights, each round(255 x the float weight) (halves to even);
/// zero weights outside the plane.
fn roi_sample(y: f32, x: f32, h: usize, w: usize) -> ([usize; 4], [u8; 4]) {
    match super::detection::bilinear(y, x, h, w) {
        None => ([0; 4], [0; 4]),
        Some(t) => (t.at, t.w.map(|v| (v * 255.0).round_ties_even() as u8)),
    }
}

/// Caffe2's Int8RoIAlign (NHWC): each bin averages its samples'
/// bilinear interpolations in integers. A sample adds
/// sum(w_i x q_i) - 255 x X_zero_point (w_i = round(255 x weight)), and a
/// bin's sum is requantised by X_scale / (255 x Y_scale x samples) and
/// offset by Y_zero_point. RoI geometry in float32 as Caffe2's.
fn roi_align(l: &mut Locked<'_>, a: &RoiArgs) -> Result<()> {
    let op = a.op.as_str();
    let (x, xq, [n, h, w, c]) = image_in(l, op)?;
    let (xn, rn) = (l.input_name(0), l.input_name(1));
    let xs = x.shape();
    let r = super::kit::f32_in(l, op, 1, "the RoIs")?;
    let rs = r.shape();
    let nr = if r.is_empty() { 0 } else { rs[0] };
    if nr > 0 && (rs.len() != 2 || !(rs[1] == 4 || rs[1] == 5)) {
        return Err(Error::shape(format!(
            "{op}: the RoIs ('{rn}', shape {rs:?}) must be (R, 4) or (R, 5) (batch index, x1, y1, x2, y2)"
        ))
        .with_blob(rn));
    }
    if nr > 0 && (h == 0 || w == 0) {
        return Err(Error::shape(format!(
            "{op}: X ('{xn}', shape {xs:?}) has no pixels to sample"
        ))
        .with_blob(xn));
    }
    let ys = [nr, a.ph, a.pw, c];
    let mut y = zeroed_vec::<u8>(&ys, format_args!("{op}'s output"))?;
    let xd = dense(x);
    let rd = dense(r);
    let cols = if nr > 0 { rs[1] } else { 4 };
    let xz = i64::from(xq.zero_point);
    let mut acc = vec![0i64; c];
    for (ri, row) in rd.chunks(cols).take(nr).enumerate() {
        if !row.iter().all(|v| v.is_finite()) {
            return Err(Error::invalid_arg(format!(
                "{op}: RoI {ri} ({row:?}) has a value that is not a finite number"
            ))
            .with_blob(rn));
        }
        let (bi, bx) = if cols == 5 {
            (row[0], &row[1..])
        } else {
            (0.0, row)
        };
        // Caffe2 truncates the batch index to an int.
        let bi = bi.trunc();
        if !(bi >= 0.0 && (bi as usize) < n) {
            return Err(Error::invalid_arg(format!(
                "{op}: RoI {ri} of '{rn}' has batch index {}, not an image of X (N = {n})",
                row[0]
            ))
            .with_blob(rn));
        }
        let img = &xd[bi as usize * h * w * c..(bi as usize + 1) * h * w * c];
        let s = a.spatial_scale;
        let (x0, y0) = (bx[0] * s, bx[1] * s);
        let rw = (bx[2] * s - x0).max(1.0);
        let rh = (bx[3] * s - y0).max(1.0);
        let (bh, bw) = (rh / a.ph as f32, rw / a.pw as f32);
        let grid = |bin: f32| super::detection::roi_grid(a.sampling, f64::from(bin));
        let (gh, gw) = (grid(bh), grid(bw));
        let samples = gh
            .checked_mul(gw)
            .and_then(|g| g.checked_mul(a.ph)?.checked_mul(a.pw))
            .filter(|&t| t <= ROI_MAX_SAMPLES)
            .map(|_| gh * gw)
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "{op}: RoI {ri} needs {gh} x {gw} samples per bin, too many; set sampling_ratio"
                ))
                .with_blob(rn)
            })?;
        let real = f64::from(xq.scale) / (f64::from(a.q.scale) * 255.0 * samples as f64);
        let mult = multiplier(
            op,
            real,
            "X_scale / (255 Y_scale samples)",
            l.output_name(0),
        )?;
        for py in 0..a.ph {
            for px in 0..a.pw {
                acc.iter_mut().for_each(|v| *v = 0);
                for iy in 0..gh {
                    let sy = y0 + py as f32 * bh + (iy as f32 + 0.5) * bh / gh as f32;
                    for ix in 0..gw {
                        let sx = x0 + px as f32 * bw + (ix as f32 + 0.5) * bw / gw as f32;
                        let (at, wt) = roi_sample(sy, sx, h, w);
                        for (k, v) in acc.iter_mut().enumerate() {
                            let mut s = -255 * xz;
                            for (&p, &q) in at.iter().zip(&wt) {
                                s += i64::from(q) * i64::from(img[p * c + k]);
                            }
                            *v += s;
                        }
                    }
                }
                let yo = ((ri * a.ph + py) * a.pw + px) * c;
                for (k, &v) in acc.iter().enumerate() {
                    y[yo + k] = requantize(v, mult, a.q, 0, 255);
                }
            }
        }
    }
    let y = Tensor::from_vec(&ys, y)?;
    set_q(l, 0, y, a.q.scale, a.q.zero_point);
    Ok(())
}

// ------------------------------------------------------- shape inference --

/// What inference knows of a quantised output: its data's dims and dtype
/// (uint8 data; int32 for Int8GivenIntTensorFill).
fn info(dims: Vec<i64>, dtype: DataType) -> Option<ShapeInfo> {
    Some(ShapeInfo::new(dims, dtype))
}

/// Output 0 has input 0's dims, uint8 (the elementwise ops).
fn infer_like_x(
    _: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    Ok(vec![
        rules::known(ins, 0).and_then(|x| info(x.dims.clone(), DataType::Uint8))
    ])
}

fn infer_fill(a: &Args<'_>, dtype: DataType) -> Result<Vec<Option<ShapeInfo>>> {
    Ok(vec![info(a.ints("shape")?.unwrap_or_default(), dtype)])
}

fn infer_fc(_: &Args<'_>, ins: &[Option<ShapeInfo>], _: usize) -> Result<Vec<Option<ShapeInfo>>> {
    let dims = match (rules::known(ins, 0), rules::known(ins, 1)) {
        (Some(x), Some(w)) if !x.dims.is_empty() && !w.dims.is_empty() => {
            Some(vec![x.dims[0], w.dims[0]])
        }
        _ => None,
    };
    Ok(vec![dims.and_then(|d| info(d, DataType::Uint8))])
}

fn infer_flatten(
    a: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let Some(x) = rules::known(ins, 0) else {
        return Ok(vec![None]);
    };
    let axis = a.i64("axis", 1)?;
    let nd = x.dims.len();
    let ax = if axis == nd as i64 {
        nd
    } else {
        rules::canonical_axis(axis, nd)?
    };
    let dims = vec![x.dims[..ax].iter().product(), x.dims[ax..].iter().product()];
    Ok(vec![info(dims, DataType::Uint8)])
}

/// The dims of a known input as usizes (None when one is negative).
fn udims(x: &ShapeInfo) -> Option<Vec<usize>> {
    x.dims.iter().map(|&d| usize::try_from(d).ok()).collect()
}

fn idims(d: &[usize]) -> Vec<i64> {
    d.iter().map(|&v| v as i64).collect()
}

fn infer_reshape(
    a: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    n: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let x = rules::known(ins, 0).and_then(udims);
    let new = match (&x, a.ints("shape")?) {
        (Some(old), Some(want)) if ins.len() == 1 => {
            let new = super::shape::resolve_shape("Int8Reshape", &want, old, "X")?;
            info(idims(&new), DataType::Uint8)
        }
        _ => None,
    };
    let old = x.and_then(|d| info(vec![d.len() as i64], DataType::Int64));
    Ok([new, old][..n.min(2)].to_vec())
}

fn infer_transpose(
    a: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let Some(x) = rules::known(ins, 0) else {
        return Ok(vec![None]);
    };
    let perm = super::shape::permutation(a.ints("axes")?.as_deref(), x.dims.len(), "X")?;
    Ok(vec![info(
        perm.iter().map(|&p| x.dims[p]).collect(),
        DataType::Uint8,
    )])
}

fn infer_slice(
    a: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let (Some(x), Some(starts), Some(ends)) = (
        rules::known(ins, 0).and_then(udims),
        a.ints("starts")?,
        a.ints("ends")?,
    ) else {
        return Ok(vec![None]);
    };
    let ranges = super::shape::slice_ranges(&x, &starts, &ends, "X")?;
    Ok(vec![info(
        ranges.iter().map(|&(s, e)| (e - s) as i64).collect(),
        DataType::Uint8,
    )])
}

fn infer_concat(
    a: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    n: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let Some(ins) = ins.iter().cloned().collect::<Option<Vec<ShapeInfo>>>() else {
        return Ok(vec![None; n]);
    };
    let default = match a.string("order", "")?.as_str() {
        "NHWC" => 3,
        "NCHW" => 1,
        _ => 0,
    };
    let add_axis = a.i64("add_axis", 0)? != 0;
    let first = &ins[0];
    let axis = rules::canonical_axis(
        a.i64("axis", default)?,
        first.dims.len() + usize::from(add_axis),
    )?;
    let mut dims = first.dims.clone();
    for t in &ins[1..] {
        let same = t.dims.len() == first.dims.len()
            && (0..dims.len()).all(|i| (i == axis && !add_axis) || t.dims[i] == first.dims[i]);
        if !same {
            return Err(Error::shape("the inputs cannot be joined"));
        }
        if !add_axis {
            dims[axis] += t.dims[axis];
        }
    }
    if add_axis {
        dims.insert(axis, ins.len() as i64);
    }
    let split = info(vec![ins.len() as i64], DataType::Int32);
    Ok([info(dims, DataType::Uint8), split][..n.min(2)].to_vec())
}

fn infer_roi_align(
    a: &Args<'_>,
    ins: &[Option<ShapeInfo>],
    _: usize,
) -> Result<Vec<Option<ShapeInfo>>> {
    let dims = match (rules::known(ins, 0), rules::known(ins, 1)) {
        (Some(x), Some(r)) if x.dims.len() == 4 && !r.dims.is_empty() => Some(vec![
            r.dims[0],
            a.i64("pooled_h", 1)?,
            a.i64("pooled_w", 1)?,
            x.dims[3],
        ]),
        _ => None,
    };
    Ok(vec![dims.and_then(|d| info(d, DataType::Uint8))])
}

// --------------------------------------------------------------- schemas --

const Y_ARGS: &[ArgDoc] = &[
    arg!(
        "Y_scale",
        "float",
        "1.0",
        "the output's scale: a real is scale x (q - zero point)"
    ),
    arg!(
        "Y_zero_point",
        "int",
        "0",
        "the output's zero point (0..=255)"
    ),
    arg!(
        "order",
        "string",
        "\"NCHW\"",
        "accepted and not read (Caffe2's int8 nets give it)"
    ),
];

const FILL_ARGS: &[ArgDoc] = &[
    arg!("Y_scale", "float", "1.0", "the tensor's scale"),
    arg!("Y_zero_point", "int", "0", "the tensor's zero point"),
    arg!("shape", "list of int", "[]", "the tensor's shape"),
    arg!(
        "values",
        "bytes (Int8GivenTensorFill) or list of int (Int8GivenIntTensorFill)",
        "empty",
        "the values, row-major, one per element"
    ),
];

const RESIZE_ARGS: &[ArgDoc] = &[
    arg!(
        "height_scale",
        "float",
        "1.0",
        "output height = floor(H x height_scale)"
    ),
    arg!(
        "width_scale",
        "float",
        "1.0",
        "output width = floor(W x width_scale)"
    ),
    arg!("Y_scale", "float", "1.0", "must equal X's scale"),
    arg!("Y_zero_point", "int", "0", "must equal X's zero point"),
    arg!(
        "order",
        "string",
        "\"NHWC\"",
        "NHWC only (the default here)"
    ),
];

/// The window arguments of the int8 convolutions and pools (2-D, NHWC)
/// and the output's quantisation.
const WINDOW_Y_ARGS: &[ArgDoc] = &[
    arg!(
        "kernel",
        "int",
        "none",
        "the window size in both spatial dims"
    ),
    arg!(
        "kernels",
        "list of int",
        "none",
        "the window size per spatial dim"
    ),
    arg!("kernel_h", "int", "none", "window height (with kernel_w)"),
    arg!("kernel_w", "int", "none", "window width (with kernel_h)"),
    arg!("stride", "int", "1", "the stride in both spatial dims"),
    arg!("strides", "list of int", "1s", "the stride per spatial dim"),
    arg!("stride_h", "int", "1", "vertical stride"),
    arg!("stride_w", "int", "1", "horizontal stride"),
    arg!(
        "pad",
        "int",
        "0",
        "padding at both ends of both spatial dims"
    ),
    arg!(
        "pads",
        "list of int",
        "0s",
        "pads: the heads of each spatial dim, then the tails"
    ),
    arg!("pad_t", "int", "0", "top pad"),
    arg!("pad_l", "int", "0", "left pad"),
    arg!("pad_b", "int", "0", "bottom pad"),
    arg!("pad_r", "int", "0", "right pad"),
    arg!(
        "dilation",
        "int",
        "1",
        "the dilation in both spatial dims (convolutions)"
    ),
    arg!(
        "dilations",
        "list of int",
        "1s",
        "the dilation per spatial dim (convolutions)"
    ),
    arg!("dilation_h", "int", "1", "vertical dilation (convolutions)"),
    arg!(
        "dilation_w",
        "int",
        "1",
        "horizontal dilation (convolutions)"
    ),
    arg!(
        "legacy_pad",
        "int",
        "0",
        "Caffe2's legacy padding (as Conv's)"
    ),
    arg!(
        "global_pooling",
        "int",
        "0",
        "the window is the whole image (pools)"
    ),
    arg!(
        "group",
        "int",
        "1",
        "groups of channels convolved separately (convolutions)"
    ),
    arg!(
        "order",
        "string",
        "\"NCHW\"",
        "must be given as \"NHWC\" (Caffe2's default, NCHW, is refused)"
    ),
    arg!(
        "Y_scale",
        "float",
        "1.0",
        "the output's scale (pools: must equal X's)"
    ),
    arg!(
        "Y_zero_point",
        "int",
        "0",
        "the output's zero point (pools: must equal X's)"
    ),
];

/// The arguments of the ops that keep X's quantisation.
macro_rules! keep_q_args {
    ($order:expr, $($extra:expr),* $(,)?) => {
        &[
            arg!("Y_scale", "float", "1.0", "must equal X's scale (the op does not requantise)"),
            arg!("Y_zero_point", "int", "0", "must equal X's zero point"),
            $order,
            $($extra,)*
        ]
    };
}

const ORDER_IGNORED: ArgDoc = arg!(
    "order",
    "string",
    "\"NCHW\"",
    "accepted and not read (Caffe2's int8 nets give it)"
);

const ORDER_NHWC: ArgDoc = arg!(
    "order",
    "string",
    "\"NCHW\"",
    "must be given as \"NHWC\" (Caffe2's default, NCHW, is refused)"
);

const KEEP_ARGS: &[ArgDoc] = keep_q_args!(ORDER_IGNORED,);

const LEAKY_ARGS: &[ArgDoc] = keep_q_args!(
    ORDER_IGNORED,
    arg!("alpha", "float", "0.01", "the slope below zero, in (0, 1)"),
);

const RESHAPE_ARGS: &[ArgDoc] = keep_q_args!(
    ORDER_IGNORED,
    arg!(
        "shape",
        "list of int",
        "(none)",
        "the new shape: 0 copies X's dim, one -1 is inferred; or give it as the second input"
    ),
);

const FLATTEN_ARGS: &[ArgDoc] = keep_q_args!(
    ORDER_IGNORED,
    arg!(
        "axis",
        "int",
        "1",
        "the output is (prod of dims before axis, prod of the rest)"
    ),
);

const SLICE_ARGS: &[ArgDoc] = keep_q_args!(
    ORDER_IGNORED,
    arg!(
        "starts",
        "list of int",
        "none",
        "first index of each leading dim (or input 1)"
    ),
    arg!(
        "ends",
        "list of int",
        "none",
        "end of each leading dim, exclusive; negative e means dim + 1 + e (or input 2)"
    ),
);

const TRANSPOSE_ARGS: &[ArgDoc] = keep_q_args!(
    ORDER_IGNORED,
    arg!(
        "axes",
        "list of int",
        "reversed dims",
        "output dim i is X's dim axes[i]"
    ),
);

const SHUFFLE_ARGS: &[ArgDoc] = keep_q_args!(
    ORDER_NHWC,
    arg!(
        "group",
        "int",
        "1",
        "the channels are G groups of C / G; channel g x (C / G) + k moves to k x G + g"
    ),
);

const CONCAT_ARGS: &[ArgDoc] = keep_q_args!(
    arg!("order", "string", "none", "NHWC: the axis defaults to 3, NCHW: to 1, and the inputs must be 4-D; not given: the axis defaults to 0"),
    arg!("axis", "int", "by order", "the axis joined (negative: from the end, without an order)"),
    arg!("add_axis", "int", "0", "1: join along a new axis at `axis`"),
);

const ADD_ARGS: &[ArgDoc] = &[
    arg!("Y_scale", "float", "1.0", "the output's scale"),
    arg!("Y_zero_point", "int", "0", "the output's zero point (0..=255)"),
    ORDER_IGNORED,
    arg!("broadcast", "int", "0", "accepted (0 or 1); the inputs must have one shape all the same, as Caffe2's Int8Add required"),
];

const ROI_ARGS: &[ArgDoc] = &[
    arg!(
        "spatial_scale",
        "float",
        "1.0",
        "RoI coordinates times this are X's pixels"
    ),
    arg!("pooled_h", "int", "1", "output bins down"),
    arg!("pooled_w", "int", "1", "output bins across"),
    arg!(
        "sampling_ratio",
        "int",
        "-1",
        "samples per bin side; <= 0: ceil(bin size)"
    ),
    arg!("Y_scale", "float", "1.0", "the output's scale"),
    arg!(
        "Y_zero_point",
        "int",
        "0",
        "the output's zero point (0..=255)"
    ),
    arg!(
        "order",
        "string",
        "\"NHWC\"",
        "NHWC only (the default here)"
    ),
];

const CONV_T_ARGS: &[ArgDoc] = &[
    arg!(
        "kernel",
        "int",
        "the filter's",
        "the window size in both spatial dims"
    ),
    arg!(
        "kernels",
        "list of int",
        "the filter's",
        "the window size per spatial dim"
    ),
    arg!("kernel_h", "int", "none", "window height (with kernel_w)"),
    arg!("kernel_w", "int", "none", "window width (with kernel_h)"),
    arg!("stride", "int", "1", "the stride in both spatial dims"),
    arg!("strides", "list of int", "1s", "the stride per spatial dim"),
    arg!("stride_h", "int", "1", "vertical stride"),
    arg!("stride_w", "int", "1", "horizontal stride"),
    arg!(
        "pad",
        "int",
        "0",
        "padding cut from both ends of both spatial dims"
    ),
    arg!(
        "pads",
        "list of int",
        "0s",
        "pads: the heads of each spatial dim, then the tails"
    ),
    arg!("pad_t", "int", "0", "top pad"),
    arg!("pad_l", "int", "0", "left pad"),
    arg!("pad_b", "int", "0", "bottom pad"),
    arg!("pad_r", "int", "0", "right pad"),
    arg!(
        "adj",
        "int",
        "0",
        "extra output rows and columns (< stride)"
    ),
    arg!(
        "adjs",
        "list of int",
        "0s",
        "extra output size per spatial dim"
    ),
    arg!("adj_h", "int", "0", "extra output rows"),
    arg!("adj_w", "int", "0", "extra output columns"),
    arg!("legacy_pad", "int", "0", "must be 0 (explicit pads)"),
    arg!(
        "global_pooling",
        "int",
        "0",
        "not for convolutions; leave 0"
    ),
    arg!(
        "group",
        "int",
        "1",
        "1 only (Caffe2's Int8ConvTranspose ran one group)"
    ),
    ORDER_NHWC,
    arg!("Y_scale", "float", "1.0", "the output's scale"),
    arg!(
        "Y_zero_point",
        "int",
        "0",
        "the output's zero point (0..=255)"
    ),
];

pub fn schemas() -> Vec<OpSchema> {
    const CONV_DOC: &str = "Quantised 2-D convolution, NHWC: X (N, H, W, C) uint8, the filter (M, KH, KW, C / group) uint8, the bias (M) int32 (scale X_scale x W_scale, zero point 0), all Int8TensorCPU; the int32 sum of (x - X_zero_point) x (w - W_zero_point) plus the bias is requantised by X_scale x W_scale / Y_scale (< 1; Q31 fixed point, rounded as Caffe2's int8_utils) and offset by Y_zero_point. Window arguments as Conv's; padded taps add nothing.";
    const CONV_RELU_DOC: &str = "Int8Conv followed by Relu: outputs are clamped from below at Y_zero_point (the quantised 0.0).";
    let mut v = vec![
        OpSchema::new("Int8Quantize", build_quantize)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(Y_ARGS)
            .infer(infer_like_x)
            .doc("Quantises a float32 tensor X to a uint8 Int8TensorCPU: q = clamp(Y_zero_point + round(x / Y_scale), 0, 255), the division in float32 and halves rounded to even."),
        OpSchema::new("Int8Dequantize", build_dequantize)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, ins, n| {
                Ok(vec![rules::known(ins, 0).and_then(|x| info(x.dims.clone(), DataType::Float)); n])
            })
            .doc("The float32 tensor (q - zero_point) x scale of a uint8 Int8TensorCPU."),
        OpSchema::new("Int8GivenTensorFill", build_fill)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(FILL_ARGS)
            .infer(|a, _, _| infer_fill(a, DataType::Uint8))
            .doc("A uint8 Int8TensorCPU of `shape` whose values are the bytes of the string `values`, with scale Y_scale and zero point Y_zero_point (quantised weights)."),
        OpSchema::new("Int8GivenIntTensorFill", build_fill)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(FILL_ARGS)
            .infer(|a, _, _| infer_fill(a, DataType::Int32))
            .doc("An int32 Int8TensorCPU of `shape` with the ints `values`, scale Y_scale and zero point Y_zero_point (quantised biases: scale X_scale x W_scale, zero point 0)."),
        OpSchema::new("Int8Conv", build_conv)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(WINDOW_Y_ARGS)
            .doc(CONV_DOC),
        OpSchema::new("Int8ConvRelu", build_conv)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(WINDOW_Y_ARGS)
            .doc(CONV_RELU_DOC),
        OpSchema::new("Int8FC", build_fc)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(Y_ARGS)
            .infer(infer_fc)
            .doc("Quantised fully connected layer: X (M, ...) uint8 flattened to (M, K), W (N, K) uint8, the bias (N) int32 (scale X_scale x W_scale, zero point 0); Y (M, N) is the int32 sum of (x - X_zero_point) x (w - W_zero_point) plus the bias, requantised by X_scale x W_scale / Y_scale as Int8Conv's."),
        OpSchema::new("Int8Softmax", build_softmax)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(Y_ARGS)
            .infer(infer_like_x)
            .doc("Quantised softmax over each row of X (its first dim is the batch; a row is the rest). The output is quantised with scale 1/256 and zero point 0 (the Y arguments must say so): per row, e(v) = round(s x exp((v - max) x X_scale)) with s = min((2^32 - 1) / row length, 2^23 - 1), y = min(255, (256 e(v) + sum / 2) / sum) for sum the row's sum of e(v)."),
        OpSchema::new("Int8ResizeNearest", build_resize)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(RESIZE_ARGS)
            .doc("Nearest-neighbour resize of a uint8 NHWC Int8TensorCPU as ResizeNearest's rule (output side floor(side x scale), source pixel min(floor(y / scale), side - 1)); the quantisation is kept (the Y arguments must equal X's)."),
    ];
    for (name, args, doc) in [
        ("Int8Sum", Y_ARGS, "Quantised sum of two uint8 Int8TensorCPUs of one shape, requantised to Y_scale and Y_zero_point: each addend is scaled by its scale / (2 x the larger scale) after a left shift by 20 bits, the sum by 2 x the larger scale / (2^20 x Y_scale) (Q31 multipliers, rounded as Caffe2's int8_utils)."),
        ("Int8SumRelu", Y_ARGS, "Int8Sum followed by Relu: outputs are clamped from below at Y_zero_point."),
        ("Int8Add", ADD_ARGS, "Quantised elementwise A + B, as Int8Sum (Caffe2 registered the two as one kernel): A and B are uint8 Int8TensorCPUs of one shape (no broadcasting, as Caffe2's), the sum requantised to Y_scale and Y_zero_point."),
        ("Int8AddRelu", ADD_ARGS, "Int8Add followed by Relu: outputs are clamped from below at Y_zero_point."),
    ] {
        v.push(
            OpSchema::new(name, build_sum)
                .inputs(2, 2)
                .outputs(1, 1)
                .args(args)
                .infer(infer_like_x)
                .doc(doc),
        );
    }
    v.extend([
        OpSchema::new("Int8Relu", build_lut)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(KEEP_ARGS)
            .infer(infer_like_x)
            .doc("Quantised Relu: y = max(x, X_zero_point) (the quantised 0.0); the quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8LeakyRelu", build_lut)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(LEAKY_ARGS)
            .infer(infer_like_x)
            .doc("Quantised LeakyRelu: x below X_zero_point becomes X_zero_point + alpha x (x - X_zero_point), alpha applied as a Q31 multiplier and a rounding right shift (int8_utils); x from the zero point up is kept. The quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8Sigmoid", build_lut)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(Y_ARGS)
            .infer(infer_like_x)
            .doc("Quantised sigmoid (QNNPACK's table, float32): y = lrint(clamp(256 / (1 + exp(-X_scale x (x - X_zero_point))), 0, 255)), halves to even. The output is quantised with scale 1/256 and zero point 0 (the Y arguments must say so)."),
        OpSchema::new("Int8Reshape", build_reshape)
            .inputs(1, 2)
            .outputs(1, 2)
            .args(RESHAPE_ARGS)
            .infer(infer_reshape)
            .doc("Reshape of a uint8 Int8TensorCPU (Reshape's rules: the `shape` argument or an int32/int64 second input, 0 copies a dim, one -1 is inferred); outputs (the reshaped tensor, old_shape: X's dims as int64). The quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8Flatten", build_flatten)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(FLATTEN_ARGS)
            .infer(infer_flatten)
            .doc("Flatten of a uint8 Int8TensorCPU to 2-D at `axis`; the quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8Concat", build_concat)
            .inputs(1, crate::operator::MANY)
            .outputs(1, 2)
            .args(CONCAT_ARGS)
            .infer(infer_concat)
            .doc("Joins uint8 Int8TensorCPUs along an axis (Concat's rules, with Caffe2's Int8Concat axis defaults); every input must have the output's quantisation (Y_scale, Y_zero_point), which is kept. Optional second output split_info: each input's int32 size along the axis."),
        OpSchema::new("Int8Slice", build_slice)
            .inputs(1, 3)
            .outputs(1, 1)
            .args(SLICE_ARGS)
            .infer(infer_slice)
            .doc("Slice of a uint8 Int8TensorCPU (Slice's rules: starts and ends as arguments or int32/int64 inputs 1 and 2); the quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8Transpose", build_transpose)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(TRANSPOSE_ARGS)
            .infer(infer_transpose)
            .doc("Permutes the dims of a uint8 Int8TensorCPU (Transpose's `axes`); the quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8ChannelShuffle", build_channel_shuffle)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(SHUFFLE_ARGS)
            .infer(infer_like_x)
            .doc("Channel shuffle of a uint8 NHWC Int8TensorCPU: the C channels of each pixel, G groups of K = C / G, are transposed to K groups of G (channel g x K + k moves to k x G + g). The quantisation is kept (the Y arguments must equal X's)."),
        OpSchema::new("Int8ConvTranspose", build_conv_transpose)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(CONV_T_ARGS)
            .doc("Quantised 2-D transposed convolution, NHWC: X (N, H, W, C) uint8, the filter (C, KH, KW, M) uint8, the bias (M) int32 (scale X_scale x W_scale, zero point 0); Y (N, (H - 1) x stride - pads + KH + adj, ..., M): each input pixel adds (x - X_zero_point) x (w - W_zero_point) where its taps land, plus the bias, requantised by X_scale x W_scale / Y_scale as Int8Conv's. Window arguments as ConvTranspose's (no dilation, one group)."),
        OpSchema::new("Int8RoIAlign", build_roi_align)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(ROI_ARGS)
            .infer(infer_roi_align)
            .doc("Quantised RoIAlign of a uint8 NHWC Int8TensorCPU X over float32 RoIs (R, 4) or (R, 5) (batch index, x1, y1, x2, y2), as Caffe2's Int8RoIAlign: Y (R, pooled_h, pooled_w, C). Bin and sample positions are RoIAlign's (not aligned) in float32; each sample's four bilinear weights are rounded to 255ths, its sum of weight x value less 255 x X_zero_point is accumulated over the bin, and the bin is requantised by X_scale / (255 x Y_scale x samples per bin) and offset by Y_zero_point."),
    ]);
    for (name, doc) in [
        ("Int8AveragePool", "Quantised average pooling of a uint8 NHWC Int8TensorCPU (window arguments as AveragePool's, 2-D): each output is (sum of the taps inside the image + count / 2) / count, count the taps inside; the quantisation is kept (the Y arguments must equal X's)."),
        ("Int8AveragePoolRelu", "Int8AveragePool clamped from below at the zero point."),
        ("Int8MaxPool", "Quantised max pooling of a uint8 NHWC Int8TensorCPU (window arguments as MaxPool's, 2-D): the largest tap inside the image; the quantisation is kept (the Y arguments must equal X's)."),
        ("Int8MaxPoolRelu", "Int8MaxPool clamped from below at the zero point."),
    ] {
        v.push(
            OpSchema::new(name, build_pool)
                .inputs(1, 1)
                .outputs(1, 1)
                .args(WINDOW_Y_ARGS)
                .doc(doc),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiplier_of_a_half_and_a_quarter() {
        assert_eq!(
            Multiplier::new(0.5),
            Some(Multiplier {
                q31: 1 << 30,
                shift: 0
            })
        );
        assert_eq!(
            Multiplier::new(0.25),
            Some(Multiplier {
                q31: 1 << 30,
                shift: 1
            })
        );
        assert_eq!(Multiplier::new(1.0), None);
        assert_eq!(Multiplier::new(-0.1), None);
        assert_eq!(Multiplier::new(0.0), Some(Multiplier { q31: 0, shift: 0 }));
        // Rounds up to 2^31: halved, one shift less.
        let m = Multiplier::new(1.0 - 1e-12).unwrap();
        assert_eq!((m.q31, m.shift), (1 << 30, 0));
    }

    #[test]
    fn rounding_halves_away_from_zero() {
        assert_eq!(rounding_shift(5, 1), 3);
        assert_eq!(rounding_shift(-5, 1), -3);
        assert_eq!(rounding_shift(4, 1), 2);
        assert_eq!(rounding_shift(-7, 2), -2);
        assert_eq!(doubling_high_mul(i32::MIN, i32::MIN), i32::MAX);
        assert_eq!(doubling_high_mul(3, 1 << 30), 2); // 1.5 rounds to 2
                                                      // gemmlowp's nudge rounds a half up (toward +inf): -1.5 -> -1.
        assert_eq!(doubling_high_mul(-3, 1 << 30), -1);
        assert_eq!(doubling_high_mul(-5, 1 << 30), -2);
        // 100 x 0.3 = 30
        let m = Multiplier::new(0.3).unwrap();
        assert_eq!(m.apply(100), 30);
        assert_eq!(m.apply(-100), -30);
    }

    #[test]
    fn quantize_rounds_halves_to_even() {
        assert_eq!(quantize_u8(0.5, 1.0, 10), 10);
        assert_eq!(quantize_u8(1.5, 1.0, 10), 12);
        assert_eq!(quantize_u8(-100.0, 1.0, 10), 0);
        assert_eq!(quantize_u8(1e30, 1.0, 10), 255);
        assert_eq!(quantize_u8(f32::NAN, 1.0, 7), 7);
    }

    #[test]
    fn saved_int8_tensors_load_back() {
        for t in [
            Tensor::from_vec(&[2, 2], vec![0u8, 1, 254, 255]).unwrap(),
            Tensor::from_vec(&[3], vec![-7i32, 0, 1 << 20]).unwrap(),
        ] {
            let q = Int8Tensor {
                data: t,
                scale: 0.125,
                zero_point: 3,
            };
            let p = q.serialize().unwrap();
            assert_eq!(p.r#type.as_deref(), Some(INT8_TAG));
            let back = decode_int8(&p).unwrap();
            let got = back.object_ref::<Int8Tensor>(INT8_TAG).unwrap();
            assert_eq!((got.scale, got.zero_point), (0.125, 3));
            assert_eq!(got.data.dtype(), q.data.dtype());
            assert_eq!(got.data.shape(), q.data.shape());
        }
        // A value count that does not match the dims is a corrupt checkpoint.
        let mut p = Int8Tensor {
            data: Tensor::from_vec(&[2], vec![1u8, 2]).unwrap(),
            scale: 1.0,
            zero_point: 0,
        }
        .serialize()
        .unwrap();
        p.qtensor.as_mut().unwrap().data.pop();
        assert_eq!(
            decode_int8(&p).unwrap_err().kind,
            ErrorKind::CorruptCheckpoint
        );
    }

    #[test]
    fn frexp_matches_the_definition() {
        for v in [0.75, 0.1, 1e-300, 5e-324, 0.999] {
            let (f, e) = frexp(v);
            assert!((0.5..1.0).contains(&f), "{v}: {f}");
            // (Scaled up first: 2^e alone underflows for subnormals.)
            assert_eq!(f * 2f64.powi(e + 200), v * 2f64.powi(200));
        }
    }
}
