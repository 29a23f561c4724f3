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

use super::conv::window::{image_shape, split_image, Geo, Window};
use super::kit::{dense, kernel, parse_order, Order};
use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{BlobProto, QTensorProto};
use crate::operator::{ArgDoc, Locked, OpDefCtx, OpSchema, Operator};
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
    let (x, xq) = u8_in(l, op, 0, "X")?;
    let (w, wq) = u8_in(l, op, 1, "the filter")?;
    let (xn, wn) = (l.input_name(0), l.input_name(1));
    let xs = x.shape();
    if xs.len() != 4 {
        return Err(Error::shape(format!(
            "{op}: X ('{xn}', shape {xs:?}) must be a 4-D NHWC image"
        ))
        .with_blob(xn));
    }
    let (n, c, sp) = split_image(op, "X", xn, xs, Order::Nhwc)?;
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
            "{op}: '{}' (shape {:?}) and '{}' (shape {:?}) must have the same shape",
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
    let (x, xq) = u8_in(l, op, 0, "X")?;
    same_q(l, op, xq, a.q)?;
    let xn = l.input_name(0);
    let xs = x.shape();
    if xs.len() != 4 {
        return Err(Error::shape(format!(
            "{op}: X ('{xn}', shape {xs:?}) must be a 4-D NHWC image"
        ))
        .with_blob(xn));
    }
    let (n, c, sp) = split_image(op, "X", xn, xs, Order::Nhwc)?;
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
    let (x, xq) = u8_in(l, op, 0, "X")?;
    same_q(l, op, xq, q)?;
    let xn = l.input_name(0);
    let xs = x.shape();
    let [n, h, w, c] = *xs else {
        return Err(Error::shape(format!(
            "{op}: X ('{xn}', shape {xs:?}) must be a 4-D NHWC image"
        ))
        .with_blob(xn));
    };
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

pub fn schemas() -> Vec<OpSchema> {
    const CONV_DOC: &str = "Quantised 2-D convolution, NHWC: X (N, H, W, C) uint8, the filter (M, KH, KW, C / group) uint8, the bias (M) int32 (scale X_scale x W_scale, zero point 0), all Int8TensorCPU; the int32 sum of (x - X_zero_point) x (w - W_zero_point) plus the bias is requantised by X_scale x W_scale / Y_scale (< 1; Q31 fixed point, rounded as Caffe2's int8_utils) and offset by Y_zero_point. Window arguments as Conv's; padded taps add nothing.";
    const CONV_RELU_DOC: &str = "Int8Conv followed by Relu: outputs are clamped from below at Y_zero_point (the quantised 0.0).";
    let mut v = vec![
        OpSchema::new("Int8Quantize", build_quantize)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(Y_ARGS)
            .doc("Quantises a float32 tensor X to a uint8 Int8TensorCPU: q = clamp(Y_zero_point + round(x / Y_scale), 0, 255), the division in float32 and halves rounded to even."),
        OpSchema::new("Int8Dequantize", build_dequantize)
            .inputs(1, 1)
            .outputs(1, 1)
            .doc("The float32 tensor (q - zero_point) x scale of a uint8 Int8TensorCPU."),
        OpSchema::new("Int8GivenTensorFill", build_fill)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(FILL_ARGS)
            .doc("A uint8 Int8TensorCPU of `shape` whose values are the bytes of the string `values`, with scale Y_scale and zero point Y_zero_point (quantised weights)."),
        OpSchema::new("Int8GivenIntTensorFill", build_fill)
            .inputs(0, 0)
            .outputs(1, 1)
            .args(FILL_ARGS)
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
            .doc("Quantised fully connected layer: X (M, ...) uint8 flattened to (M, K), W (N, K) uint8, the bias (N) int32 (scale X_scale x W_scale, zero point 0); Y (M, N) is the int32 sum of (x - X_zero_point) x (w - W_zero_point) plus the bias, requantised by X_scale x W_scale / Y_scale as Int8Conv's."),
        OpSchema::new("Int8Softmax", build_softmax)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(Y_ARGS)
            .doc("Quantised softmax over each row of X (its first dim is the batch; a row is the rest). The output is quantised with scale 1/256 and zero point 0 (the Y arguments must say so): per row, e(v) = round(s x exp((v - max) x X_scale)) with s = min((2^32 - 1) / row length, 2^23 - 1), y = min(255, (256 e(v) + sum / 2) / sum) for sum the row's sum of e(v)."),
        OpSchema::new("Int8ResizeNearest", build_resize)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(RESIZE_ARGS)
            .doc("Nearest-neighbour resize of a uint8 NHWC Int8TensorCPU as ResizeNearest's rule (output side floor(side x scale), source pixel min(floor(y / scale), side - 1)); the quantisation is kept (the Y arguments must equal X's)."),
    ];
    for (name, doc) in [
        ("Int8Sum", "Quantised sum of two uint8 Int8TensorCPUs of one shape, requantised to Y_scale and Y_zero_point: each addend is scaled by its scale / (2 x the larger scale) after a left shift by 20 bits, the sum by 2 x the larger scale / (2^20 x Y_scale) (Q31 multipliers, rounded as Caffe2's int8_utils)."),
        ("Int8SumRelu", "Int8Sum followed by Relu: outputs are clamped from below at Y_zero_point."),
    ] {
        v.push(
            OpSchema::new(name, build_sum)
                .inputs(2, 2)
                .outputs(1, 1)
                .args(Y_ARGS)
                .doc(doc),
        );
    }
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
