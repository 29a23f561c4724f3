//! Object detection (Detectron's ops, issue 29): `RoIAlign` and
//! `RoIAlignGradient` (NCHW and NHWC, `sampling_ratio`, `aligned`),
//! `BBoxTransform` (box regression deltas applied to RoIs, upright and
//! rotated boxes), `BoxWithNMSLimit` (per-class score threshold, NMS or
//! soft-NMS, a limit per image) and `GenerateProposals` (RPN anchors ->
//! proposals). Names, arguments, inputs and outputs are Caffe2's.
//!
//! Box geometry is computed in float64 from the float32 inputs (Caffe2
//! worked in float32); the outputs are float32, as Caffe2's. RoIAlign works
//! on float32 and float64 feature maps (its geometry in float64 too), so its
//! gradient can be checked in float64. Differences from Caffe2 are listed
//! in docs/porting.md ("Detection ops").

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

use super::kit::{by_float, kernel, parse_order, Order};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{ArgDoc, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{checked_numel, try_vec, zeroed_vec, Tensor};

/// Caffe2's clip of the log-space width and height deltas: ln(1000 / 16).
fn xform_clip() -> f64 {
    (1000.0f64 / 16.0).ln()
}

// ------------------------------------------------------------ helpers --

/// Input `i` as float32 values with its shape, or a type error naming the
/// op and the blob.
fn f32_values(l: &Locked<'_>, op: &str, i: usize, what: &str) -> Result<(Vec<f64>, Vec<usize>)> {
    let t = l.tensor(i)?;
    match t {
        Tensor::F32(a) => Ok((
            crate::tensor::try_collect(a.iter().map(|&v| f64::from(v)), "a box buffer")?,
            a.shape().to_vec(),
        )),
        _ => Err(Error::type_error(format!(
            "{op}: {what} ('{}') must be a float32 tensor, got {}",
            l.input_name(i),
            t.dtype()
        ))
        .with_blob(l.input_name(i))),
    }
}

fn shape_err(op: &str, l: &Locked<'_>, i: usize, msg: String) -> Error {
    Error::shape(format!("{op}: {msg}")).with_blob(l.input_name(i))
}

/// A float32 output of `shape` holding `v` (f64 values rounded).
fn f32_out(shape: &[usize], v: &[f64]) -> Result<Tensor> {
    let out = crate::tensor::try_collect(v.iter().map(|&x| x as f32), "a box output")?;
    Tensor::from_vec(shape, out)
}

/// The bool argument `name` (Caffe2 read these as ints).
fn flag(ctx: &OpDefCtx<'_>, name: &str, default: bool) -> Result<bool> {
    Ok(ctx.args.i64(name, i64::from(default))? != 0)
}

/// The angle bounds of rotated boxes: `(on, lo, hi)`; the period
/// `hi - lo` must be a positive multiple of 180 when on.
fn angle_bounds(ctx: &OpDefCtx<'_>) -> Result<(bool, f64, f64)> {
    let on = flag(ctx, "angle_bound_on", true)?;
    let lo = ctx.args.i64("angle_bound_lo", -90)?;
    let hi = ctx.args.i64("angle_bound_hi", 90)?;
    let period = hi.checked_sub(lo);
    if on && !matches!(period, Some(p) if p > 0 && p % 180 == 0) {
        return Err(ctx.bad_arg(format!(
            "angle_bound_hi - angle_bound_lo must be a positive multiple of 180, got {hi} - {lo}"
        )));
    }
    Ok((on, lo as f64, hi as f64))
}

/// How deltas turn boxes into boxes (Detectron's `bbox_transform`).
#[derive(Clone, Copy)]
struct Xform {
    weights: [f64; 4],
    /// 1 with `legacy_plus_one` (a box from x1 to x2 is x2 - x1 + 1 wide).
    plus: f64,
    /// 1 with `correct_transform_coords` (x2 = centre + w / 2 - 1).
    correct: f64,
    angle_on: bool,
    angle_lo: f64,
    angle_hi: f64,
}

impl Xform {
    /// Applies deltas `d` to upright box `b` (x1, y1, x2, y2).
    fn upright(&self, b: &[f64], d: &[f64], out: &mut [f64]) {
        let w = b[2] - b[0] + self.plus;
        let h = b[3] - b[1] + self.plus;
        let (cx, cy) = (b[0] + 0.5 * w, b[1] + 0.5 * h);
        let [wx, wy, ww, wh] = self.weights;
        let dw = (d[2] / ww).min(xform_clip());
        let dh = (d[3] / wh).min(xform_clip());
        let (pcx, pcy) = (d[0] / wx * w + cx, d[1] / wy * h + cy);
        let (pw, ph) = (dw.exp() * w, dh.exp() * h);
        out[0] = pcx - 0.5 * pw;
        out[1] = pcy - 0.5 * ph;
        out[2] = pcx + 0.5 * pw - self.correct;
        out[3] = pcy + 0.5 * ph - self.correct;
    }

    /// Applies deltas `d` (the angle's in radians) to rotated box `b`
    /// (centre x, centre y, w, h, angle in degrees).
    fn rotated(&self, b: &[f64], d: &[f64], out: &mut [f64]) {
        let [wx, wy, ww, wh] = self.weights;
        let dw = (d[2] / ww).min(xform_clip());
        let dh = (d[3] / wh).min(xform_clip());
        out[0] = d[0] / wx * b[2] + b[0];
        out[1] = d[1] / wy * b[3] + b[1];
        out[2] = dw.exp() * b[2];
        out[3] = dh.exp() * b[3];
        let mut a = b[4] + d[4] * 180.0 / std::f64::consts::PI;
        if self.angle_on {
            let period = self.angle_hi - self.angle_lo;
            if a < self.angle_lo {
                a += period;
            } else if a > self.angle_hi {
                a -= period;
            }
        }
        out[4] = a;
    }

    fn apply(&self, b: &[f64], d: &[f64], out: &mut [f64]) {
        if b.len() == 4 {
            self.upright(b, d, out)
        } else {
            self.rotated(b, d, out)
        }
    }
}

/// Clips box `b` in place to an image of `h` x `w` pixels; a rotated box
/// only when it is within `angle_thresh` degrees of upright.
fn clip_box(b: &mut [f64], h: f64, w: f64, plus: f64, angle_thresh: f64) {
    let clip = |v: f64, hi: f64| v.min(hi - plus).max(0.0);
    if b.len() == 4 {
        b[0] = clip(b[0], w);
        b[1] = clip(b[1], h);
        b[2] = clip(b[2], w);
        b[3] = clip(b[3], h);
    } else if b[4].abs() <= angle_thresh {
        let (hw, hh) = ((b[2] - plus) / 2.0, (b[3] - plus) / 2.0);
        let x1 = clip(b[0] - hw, w);
        let y1 = clip(b[1] - hh, h);
        let x2 = clip(b[0] + hw, w);
        let y2 = clip(b[1] + hh, h);
        b[0] = (x1 + x2) / 2.0;
        b[1] = (y1 + y2) / 2.0;
        b[2] = x2 - x1 + plus;
        b[3] = y2 - y1 + plus;
    }
}

/// Intersection over union of upright boxes `a` and `b`.
fn iou(a: &[f64], b: &[f64], plus: f64) -> f64 {
    let area = |x: &[f64]| (x[2] - x[0] + plus) * (x[3] - x[1] + plus);
    let iw = (a[2].min(b[2]) - a[0].max(b[0]) + plus).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1]) + plus).max(0.0);
    let inter = iw * ih;
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// The corners of rotated box `b` (centre x, centre y, w, h, angle in
/// degrees, counter-clockwise as seen in an image whose y axis points
/// down), in positive order.
fn corners(b: &[f64]) -> [(f64, f64); 4] {
    let t = b[4].to_radians();
    let (c, s) = (t.cos(), t.sin());
    let (ux, uy) = (c * b[2] / 2.0, -s * b[2] / 2.0);
    let (vx, vy) = (s * b[3] / 2.0, c * b[3] / 2.0);
    [
        (b[0] - ux - vx, b[1] - uy - vy),
        (b[0] + ux - vx, b[1] + uy - vy),
        (b[0] + ux + vx, b[1] + uy + vy),
        (b[0] - ux + vx, b[1] - uy + vy),
    ]
}

fn cross(o: (f64, f64), a: (f64, f64), b: (f64, f64)) -> f64 {
    (a.0 - o.0) * (b.1 - o.1) - (a.1 - o.1) * (b.0 - o.0)
}

/// The area where rotated boxes `a` and `b` overlap: `a`'s polygon clipped
/// by each edge of `b`'s (both convex), then the shoelace formula.
fn rotated_intersection(a: &[f64], b: &[f64]) -> f64 {
    let mut poly: Vec<(f64, f64)> = corners(a).to_vec();
    let clip = corners(b);
    for e in 0..4 {
        let (p, q) = (clip[e], clip[(e + 1) % 4]);
        let input = std::mem::take(&mut poly);
        for (k, &cur) in input.iter().enumerate() {
            let prev = input[(k + input.len() - 1) % input.len()];
            let (ci, pi) = (cross(p, q, cur), cross(p, q, prev));
            if ci >= 0.0 {
                if pi < 0.0 {
                    let t = pi / (pi - ci);
                    poly.push((prev.0 + (cur.0 - prev.0) * t, prev.1 + (cur.1 - prev.1) * t));
                }
                poly.push(cur);
            } else if pi >= 0.0 {
                let t = pi / (pi - ci);
                poly.push((prev.0 + (cur.0 - prev.0) * t, prev.1 + (cur.1 - prev.1) * t));
            }
        }
        if poly.is_empty() {
            return 0.0;
        }
    }
    let mut twice = 0.0;
    for k in 0..poly.len() {
        let (x0, y0) = poly[k];
        let (x1, y1) = poly[(k + 1) % poly.len()];
        twice += x0 * y1 - x1 * y0;
    }
    (twice / 2.0).abs()
}

/// Intersection over union of rotated boxes (areas w x h, no plus one, as
/// Caffe2's rotated NMS).
fn rotated_iou(a: &[f64], b: &[f64]) -> f64 {
    let (aa, ab) = (a[2] * a[3], b[2] * b[3]);
    if !(aa > 0.0 && ab > 0.0) {
        return 0.0;
    }
    let inter = rotated_intersection(a, b);
    let union = aa + ab - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// The overlap NMS compares: IoU of upright (4 values) or rotated boxes.
fn overlap(a: &[f64], b: &[f64], plus: f64) -> f64 {
    if a.len() == 5 {
        rotated_iou(a, b)
    } else {
        iou(a, b, plus)
    }
}

/// Greedy NMS over `order` (indices, highest score first): keeps a box
/// unless it overlaps a kept one by more than `thresh`; at most `limit`
/// boxes (`None`: all). `boxes(i)` is box i.
fn nms<'b>(
    order: &[usize],
    boxes: impl Fn(usize) -> &'b [f64],
    thresh: f64,
    limit: Option<usize>,
    plus: f64,
) -> Vec<usize> {
    let mut keep: Vec<usize> = Vec::new();
    let mut alive = vec![true; order.len()];
    for (p, &i) in order.iter().enumerate() {
        if !alive[p] {
            continue;
        }
        if limit.is_some_and(|n| keep.len() >= n) {
            break;
        }
        keep.push(i);
        for q in p + 1..order.len() {
            if alive[q] && overlap(boxes(i), boxes(order[q]), plus) > thresh {
                alive[q] = false;
            }
        }
    }
    keep
}

#[derive(Clone, Copy, PartialEq)]
enum SoftMethod {
    Linear,
    Gaussian,
}

/// Soft-NMS over `cands`: repeatedly keeps the highest (updated) score and
/// lowers the others' by their overlap with it (linear: times 1 - IoU above
/// `thresh`; gaussian: times exp(-IoU^2 / sigma)), dropping those at or
/// below `min_score`. Updates `scores` (indexed by box) in place.
fn soft_nms<'b>(
    cands: &[usize],
    boxes: impl Fn(usize) -> &'b [f64],
    scores: &mut [f64],
    method: SoftMethod,
    sigma: f64,
    thresh: f64,
    min_score: f64,
    plus: f64,
) -> Vec<usize> {
    let mut pending = cands.to_vec();
    let mut keep = Vec::new();
    while !pending.is_empty() {
        let mut best = 0;
        for (p, &i) in pending.iter().enumerate() {
            if scores[i] > scores[pending[best]] {
                best = p;
            }
        }
        let i = pending.remove(best);
        keep.push(i);
        pending.retain(|&j| {
            let o = overlap(boxes(i), boxes(j), plus);
            let w = match method {
                SoftMethod::Linear if o > thresh => 1.0 - o,
                SoftMethod::Linear => 1.0,
                SoftMethod::Gaussian => (-o * o / sigma).exp(),
            };
            scores[j] *= w;
            scores[j] > min_score
        });
    }
    keep
}

/// `idx` sorted by `score` descending (a stable sort: ties keep index order).
fn by_score_desc(idx: &mut [usize], score: impl Fn(usize) -> f64) {
    idx.sort_by(|&a, &b| score(b).total_cmp(&score(a)));
}

// ----------------------------------------------------------- RoIAlign --

#[derive(Clone)]
struct RoiAlign {
    op: String,
    scale: f64,
    ph: usize,
    pw: usize,
    sampling: i64,
    aligned: bool,
    order: Order,
}

impl RoiAlign {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<RoiAlign> {
        let scale = f64::from(ctx.args.f32("spatial_scale", 1.0)?);
        if !(scale.is_finite() && scale > 0.0) {
            return Err(ctx.bad_arg(format!("spatial_scale must be > 0, got {scale}")));
        }
        let pooled = |name: &str| -> Result<usize> {
            let v = ctx.args.i64(name, 1)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v >= 1)
                .ok_or_else(|| ctx.bad_arg(format!("{name} must be >= 1, got {v}")))
        };
        Ok(RoiAlign {
            op: ctx.op_type().to_string(),
            scale,
            ph: pooled("pooled_h")?,
            pw: pooled("pooled_w")?,
            sampling: ctx.args.i64("sampling_ratio", -1)?,
            aligned: flag(ctx, "aligned", false)?,
            order: parse_order(ctx)?,
        })
    }
}

/// One bilinear sample: four taps (offsets in a plane, y * W + x) and
/// their weights.
pub(crate) struct Tap<T = f64> {
    pub(crate) at: [usize; 4],
    pub(crate) w: [T; 4],
}

/// The sample at (y, x) of an h x w plane: none outside [-1, h] x [-1, w];
/// coordinates below 0 read row or column 0, beyond the last its value.
/// In `T`'s arithmetic (Int8RoIAlign's is float32).
pub(crate) fn bilinear<T: Float>(y: T, x: T, h: usize, w: usize) -> Option<Tap<T>> {
    let (hf, wf, lowest) = (T::of(h as f64), T::of(w as f64), T::of(-1.0));
    if h == 0 || w == 0 || !(y >= lowest && y <= hf && x >= lowest && x <= wf) {
        return None;
    }
    let (zero, one) = (T::of(0.0), T::of(1.0));
    let axis = |v: T, n: usize| -> (usize, usize, T) {
        let v = if v > zero { v } else { zero };
        let lo = v.to_f64() as usize;
        if lo >= n - 1 {
            (n - 1, n - 1, zero)
        } else {
            (lo, lo + 1, v - T::of(lo as f64))
        }
    };
    let (y0, y1, ly) = axis(y, h);
    let (x0, x1, lx) = axis(x, w);
    let (hy, hx) = (one - ly, one - lx);
    Some(Tap {
        at: [y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1],
        w: [hy * hx, hy * lx, ly * hx, ly * lx],
    })
}

/// The validated inputs of RoIAlign and its gradient.
struct RoiSetup {
    c: usize,
    h: usize,
    w: usize,
    /// Each RoI: its image and its box (x1, y1, x2, y2) in input pixels.
    rois: Vec<(usize, [f64; 4])>,
    y_shape: Vec<usize>,
}

fn roi_setup(l: &Locked<'_>, a: &RoiAlign) -> Result<RoiSetup> {
    let op = a.op.as_str();
    let xs = l.tensor(0)?.shape().to_vec();
    if xs.len() != 4 {
        return Err(shape_err(
            op,
            l,
            0,
            format!("X must be 4-D ({:?}), got shape {xs:?}", a.order),
        ));
    }
    let (n, c, h, w) = match a.order {
        Order::Nchw => (xs[0], xs[1], xs[2], xs[3]),
        Order::Nhwc => (xs[0], xs[3], xs[1], xs[2]),
    };
    // The RoIs in X's float type, or float32 (Caffe2's) under float64 X.
    let (rv, rs) = match l.tensor(1)? {
        Tensor::F64(r) => (
            crate::tensor::try_collect(r.iter().copied(), "the RoIs")?,
            r.shape().to_vec(),
        ),
        _ => f32_values(l, op, 1, "RoIs")?,
    };
    let mut rois = Vec::new();
    if !rv.is_empty() {
        if rs.len() != 2 || !(rs[1] == 4 || rs[1] == 5) {
            return Err(shape_err(
                op,
                l,
                1,
                format!(
                    "RoIs must be (R, 4) or (R, 5) (batch index, x1, y1, x2, y2), got shape {rs:?}"
                ),
            ));
        }
        rois = try_vec(rs[0], "the RoIs")?;
        for row in rv.chunks(rs[1]) {
            let (b, bx) = if rs[1] == 5 {
                (row[0], &row[1..])
            } else {
                (0.0, row)
            };
            if !(b >= 0.0 && b < n as f64) {
                return Err(Error::invalid_arg(format!(
                    "{op}: a RoI's batch index {b} is not an image of X (N = {n})"
                ))
                .with_blob(l.input_name(1)));
            }
            rois.push((b as usize, [bx[0], bx[1], bx[2], bx[3]]));
        }
    }
    let r = rois.len();
    let y_shape = match a.order {
        Order::Nchw => vec![r, c, a.ph, a.pw],
        Order::Nhwc => vec![r, a.ph, a.pw, c],
    };
    checked_numel::<f64>(&y_shape, format_args!("{op}'s output"))?;
    Ok(RoiSetup {
        c,
        h,
        w,
        rois,
        y_shape,
    })
}

/// RoIAlign's samples per bin side: `sampling` when > 0, else ceil(bin
/// size) (saturating: a huge count fails the callers' size checks).
pub(crate) fn roi_grid(sampling: i64, bin: f64) -> usize {
    if sampling > 0 {
        sampling as usize
    } else {
        bin.ceil() as usize
    }
}

/// The samples of one RoI, each with its output bin, and the weight of a
/// sample in its bin's average (1 / samples per bin).
fn roi_taps(a: &RoiAlign, s: &RoiSetup, b: &[f64; 4]) -> Result<(Vec<(usize, Tap)>, f64)> {
    let off = if a.aligned { 0.5 } else { 0.0 };
    let (x0, y0) = (b[0] * a.scale - off, b[1] * a.scale - off);
    let (mut rw, mut rh) = (b[2] * a.scale - off - x0, b[3] * a.scale - off - y0);
    if a.aligned {
        if !(rw >= 0.0 && rh >= 0.0) {
            return Err(Error::invalid_arg(format!(
                "{}: with aligned, a RoI must have a non-negative size, got {b:?}",
                a.op
            )));
        }
    } else {
        // Malformed RoIs are taken as 1 x 1.
        rw = rw.max(1.0);
        rh = rh.max(1.0);
    }
    let (bh, bw) = (rh / a.ph as f64, rw / a.pw as f64);
    let (gh, gw) = (roi_grid(a.sampling, bh), roi_grid(a.sampling, bw));
    let total = gh
        .checked_mul(gw)
        .and_then(|g| g.checked_mul(a.ph.checked_mul(a.pw)?))
        .filter(|&t| t <= (1 << 32))
        .ok_or_else(|| {
            Error::invalid_arg(format!(
                "{}: the RoI {b:?} needs {gh} x {gw} samples per bin, too many; set sampling_ratio",
                a.op
            ))
        })?;
    let mut taps = try_vec(total, "the RoIAlign samples")?;
    for py in 0..a.ph {
        for iy in 0..gh {
            let y = y0 + py as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
            for px in 0..a.pw {
                for ix in 0..gw {
                    let x = x0 + px as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                    if let Some(t) = bilinear(y, x, s.h, s.w) {
                        taps.push((py * a.pw + px, t));
                    }
                }
            }
        }
    }
    Ok((taps, 1.0 / (gh * gw).max(1) as f64))
}

/// Offsets of X (image `b`, channel `ch`, plane offset `p`) and of Y (RoI
/// `r`, channel `ch`, bin `q`) in the op's order.
fn roi_index(
    a: &RoiAlign,
    s: &RoiSetup,
) -> (
    impl Fn(usize, usize, usize) -> usize,
    impl Fn(usize, usize, usize) -> usize,
) {
    let (c, hw, bins, order) = (s.c, s.h * s.w, a.ph * a.pw, a.order);
    let x = move |b: usize, ch: usize, p: usize| match order {
        Order::Nchw => (b * c + ch) * hw + p,
        Order::Nhwc => (b * hw + p) * c + ch,
    };
    let y = move |r: usize, ch: usize, q: usize| match order {
        Order::Nchw => (r * c + ch) * bins + q,
        Order::Nhwc => (r * bins + q) * c + ch,
    };
    (x, y)
}

fn roi_align_fwd<T: Float>(l: &mut Locked<'_>, a: &RoiAlign) -> Result<()> {
    let s = roi_setup(l, a)?;
    let x = super::kit::input::<T>(l, &a.op, 0)?;
    let x = super::kit::dense(x);
    let mut y = zeroed_vec::<T>(&s.y_shape, format_args!("{}'s output", a.op))?;
    let (xi, yi) = roi_index(a, &s);
    for (r, (b, bx)) in s.rois.iter().enumerate() {
        let (taps, inv) = roi_taps(a, &s, bx)?;
        for ch in 0..s.c {
            for (q, t) in &taps {
                let mut v = 0.0;
                for k in 0..4 {
                    v += t.w[k] * x[xi(*b, ch, t.at[k])].to_f64();
                }
                let o = yi(r, ch, *q);
                y[o] = y[o] + T::of(v * inv);
            }
        }
    }
    l.set_output(0, Tensor::from_vec(&s.y_shape, y)?);
    Ok(())
}

fn roi_align_grad<T: Float>(l: &mut Locked<'_>, a: &RoiAlign) -> Result<()> {
    let s = roi_setup(l, a)?;
    let x_shape = l.tensor(0)?.shape().to_vec();
    let dy_t = l.tensor(2)?;
    if dy_t.shape() != s.y_shape.as_slice() {
        return Err(shape_err(
            &a.op,
            l,
            2,
            format!(
                "dY must have RoIAlign's output shape {:?}, got {:?}",
                s.y_shape,
                dy_t.shape()
            ),
        ));
    }
    let dy = super::kit::input::<T>(l, &a.op, 2)?;
    let dy = super::kit::dense(dy);
    let mut dx = zeroed_vec::<T>(&x_shape, format_args!("{}'s output", a.op))?;
    let (xi, yi) = roi_index(a, &s);
    for (r, (b, bx)) in s.rois.iter().enumerate() {
        let (taps, inv) = roi_taps(a, &s, bx)?;
        for ch in 0..s.c {
            for (q, t) in &taps {
                let g = dy[yi(r, ch, *q)].to_f64() * inv;
                for k in 0..4 {
                    let o = xi(*b, ch, t.at[k]);
                    dx[o] = dx[o] + T::of(t.w[k] * g);
                }
            }
        }
    }
    l.set_output(0, Tensor::from_vec(&x_shape, dx)?);
    Ok(())
}

fn build_roi_align(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = RoiAlign::parse(ctx)?;
    let grad = ctx.op_type().ends_with("Gradient");
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        if grad {
            by_float!(&l, &a.op, 0, roi_align_grad(&mut l, &a))?;
        } else {
            by_float!(&l, &a.op, 0, roi_align_fwd(&mut l, &a))?;
        }
        Ok(true)
    }))
}

// ------------------------------------------------------ BBoxTransform --

struct BBoxTransform {
    x: Xform,
    apply_scale: bool,
    rotated: bool,
    clip_angle: f64,
}

fn xform_args(ctx: &OpDefCtx<'_>, weights: [f64; 4]) -> Result<Xform> {
    let (angle_on, angle_lo, angle_hi) = angle_bounds(ctx)?;
    Ok(Xform {
        weights,
        plus: if flag(ctx, "legacy_plus_one", true)? {
            1.0
        } else {
            0.0
        },
        correct: if flag(ctx, "correct_transform_coords", false)? {
            1.0
        } else {
            0.0
        },
        angle_on,
        angle_lo,
        angle_hi,
    })
}

fn build_bbox_transform(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let weights = match ctx.args.floats("weights")? {
        None => [1.0; 4],
        Some(w) if w.len() == 4 && w.iter().all(|v| v.is_finite() && *v != 0.0) => {
            [w[0], w[1], w[2], w[3]].map(f64::from)
        }
        Some(w) => {
            return Err(ctx.bad_arg(format!(
                "weights must be 4 non-zero numbers (wx, wy, ww, wh), got {w:?}"
            )))
        }
    };
    let a = BBoxTransform {
        x: xform_args(ctx, weights)?,
        apply_scale: flag(ctx, "apply_scale", true)?,
        rotated: flag(ctx, "rotated", false)?,
        clip_angle: f64::from(ctx.args.f32("clip_angle_thresh", 1.0)?),
    };
    Ok(kernel(move |cx| {
        let outs = cx.num_outputs();
        let mut l = cx.lock();
        bbox_transform(&mut l, &a, outs)?;
        Ok(true)
    }))
}

fn bbox_transform(l: &mut Locked<'_>, a: &BBoxTransform, outs: usize) -> Result<()> {
    const OP: &str = "BBoxTransform";
    let bd = if a.rotated { 5 } else { 4 };
    let (rois, rs) = f32_values(l, OP, 0, "rois")?;
    let (deltas, ds) = f32_values(l, OP, 1, "deltas")?;
    let (info, is) = f32_values(l, OP, 2, "im_info")?;
    if rs.len() != 2 || !(rs[1] == bd || rs[1] == bd + 1) {
        return Err(shape_err(
            OP,
            l,
            0,
            format!(
                "rois must be (R, {bd}) or (R, {}) (batch index first), got shape {rs:?}",
                bd + 1
            ),
        ));
    }
    let r = rs[0];
    if ds.len() != 2 || ds[0] != r || ds[1] == 0 || ds[1] % bd != 0 {
        return Err(shape_err(
            OP,
            l,
            1,
            format!("deltas must be (R = {r}, {bd} x classes), got shape {ds:?}"),
        ));
    }
    if is.len() != 2 || is[1] != 3 {
        return Err(shape_err(
            OP,
            l,
            2,
            format!("im_info must be (N, 3) (height, width, scale), got shape {is:?}"),
        ));
    }
    let nimg = is[0];
    let cols = rs[1];
    let mut splits = zeroed_vec::<f64>(&[nimg], "BBoxTransform's batch splits")?;
    let mut batch = try_vec(r, "BBoxTransform's batch indices")?;
    for row in rois.chunks(cols.max(1)) {
        let b = if cols == bd + 1 { row[0] } else { 0.0 };
        if !(b >= 0.0 && b < nimg as f64) {
            return Err(Error::invalid_arg(format!(
                "{OP}: a RoI's batch index {b} is not an image of im_info (N = {nimg})"
            ))
            .with_blob(l.input_name(0)));
        }
        splits[b as usize] += 1.0;
        batch.push(b as usize);
    }
    if cols == bd && nimg != 1 && r > 0 {
        return Err(shape_err(
            OP,
            l,
            0,
            format!("rois without a batch index need one image in im_info, got {nimg}"),
        ));
    }
    let k = ds[1] / bd;
    let mut out = zeroed_vec::<f64>(&ds, "BBoxTransform's output")?;
    let mut bx = [0f64; 5];
    for (i, &b) in batch.iter().enumerate() {
        let im = &info[b * 3..b * 3 + 3];
        let before = im[2];
        let after = if a.apply_scale { before } else { 1.0 };
        let roi = &rois[i * cols + cols - bd..(i + 1) * cols];
        bx[..bd].copy_from_slice(roi);
        // The angle of a rotated box is not scaled.
        for v in &mut bx[..4] {
            *v /= before;
        }
        let (ih, iw) = ((im[0] / before).round(), (im[1] / before).round());
        for j in 0..k {
            let o = &mut out[(i * k + j) * bd..(i * k + j + 1) * bd];
            a.x.apply(
                &bx[..bd],
                &deltas[(i * k + j) * bd..(i * k + j + 1) * bd],
                o,
            );
            clip_box(o, ih, iw, a.x.plus, a.clip_angle);
            for v in &mut o[..4] {
                *v *= after;
            }
        }
    }
    l.set_output(0, f32_out(&ds, &out)?);
    if outs > 1 {
        l.set_output(1, f32_out(&[nimg], &splits)?);
    }
    Ok(())
}

// ---------------------------------------------------- BoxWithNMSLimit --

struct NmsLimit {
    score_thresh: f64,
    nms: f64,
    per_im: i64,
    soft: Option<(SoftMethod, f64, f64)>,
    rotated: bool,
    agnostic: bool,
    boxes_bg: bool,
    classes_bg: bool,
    plus: f64,
}

fn build_nms_limit(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let soft = if flag(ctx, "soft_nms_enabled", false)? {
        let method = match ctx.args.string("soft_nms_method", "linear")?.as_str() {
            "linear" => SoftMethod::Linear,
            "gaussian" => SoftMethod::Gaussian,
            other => {
                return Err(ctx.bad_arg(format!(
                    "soft_nms_method must be \"linear\" or \"gaussian\", got \"{other}\""
                )))
            }
        };
        let sigma = f64::from(ctx.args.f32("soft_nms_sigma", 0.5)?);
        if method == SoftMethod::Gaussian && !(sigma > 0.0) {
            return Err(ctx.bad_arg(format!("soft_nms_sigma must be > 0, got {sigma}")));
        }
        Some((
            method,
            sigma,
            f64::from(ctx.args.f32("soft_nms_min_score_thres", 0.001)?),
        ))
    } else {
        match ctx.args.string("soft_nms_method", "linear")?.as_str() {
            "linear" | "gaussian" => None,
            other => {
                return Err(ctx.bad_arg(format!(
                    "soft_nms_method must be \"linear\" or \"gaussian\", got \"{other}\""
                )))
            }
        }
    };
    let rotated = flag(ctx, "rotated", false)?;
    let a = NmsLimit {
        score_thresh: f64::from(ctx.args.f32("score_thresh", 0.05)?),
        nms: f64::from(ctx.args.f32("nms", 0.3)?),
        per_im: ctx.args.i64("detections_per_im", 100)?,
        soft,
        rotated,
        agnostic: flag(ctx, "cls_agnostic_bbox_reg", false)?,
        boxes_bg: flag(ctx, "input_boxes_include_bg_cls", true)?,
        classes_bg: flag(ctx, "output_classes_include_bg_cls", true)?,
        plus: if flag(ctx, "legacy_plus_one", true)? {
            1.0
        } else {
            0.0
        },
    };
    Ok(kernel(move |cx| {
        let (ins, outs) = (cx.num_inputs(), cx.num_outputs());
        let mut l = cx.lock();
        nms_limit(&mut l, &a, ins, outs)?;
        Ok(true)
    }))
}

/// A (N, K) tensor, or (N, K, 1, 1) as Caffe2 also took: (N, K).
fn matrix_dims(s: &[usize]) -> Option<(usize, usize)> {
    match s {
        [n, k] => Some((*n, *k)),
        [n, k, 1, 1] => Some((*n, *k)),
        _ => None,
    }
}

fn nms_limit(l: &mut Locked<'_>, a: &NmsLimit, ins: usize, outs: usize) -> Result<()> {
    const OP: &str = "BoxWithNMSLimit";
    let bd = if a.rotated { 5 } else { 4 };
    let (scores, ss) = f32_values(l, OP, 0, "scores")?;
    let (boxes, bs) = f32_values(l, OP, 1, "boxes")?;
    let (n, nc) = matrix_dims(&ss).ok_or_else(|| {
        shape_err(
            OP,
            l,
            0,
            format!("scores must be (N, classes), got shape {ss:?}"),
        )
    })?;
    // Class j >= 1 (0 is the background) reads score column j - 1 + s0 and
    // box column group bj(j).
    let s0 = usize::from(a.boxes_bg);
    let box_col = |j: usize| {
        if a.agnostic {
            0
        } else if a.boxes_bg {
            j
        } else {
            j - 1
        }
    };
    // Box column groups: one (class-agnostic), or one per class with or
    // without the background's.
    let box_groups = if a.agnostic {
        1
    } else if a.boxes_bg {
        nc
    } else {
        nc.saturating_sub(1)
    };
    let bw = match matrix_dims(&bs) {
        Some((bn, bw)) if bn == n && nc >= 1 && bw == box_groups * bd => bw,
        _ => {
            return Err(shape_err(
                OP,
                l,
                1,
                format!(
                    "boxes must be (N = {n}, {} x {bd}) for {nc} score columns, got shape {bs:?}",
                    box_groups
                ),
            ))
        }
    };
    let splits: Vec<usize> = if ins > 2 {
        let t = l.tensor(2)?;
        let v: Vec<f64> = match t {
            Tensor::F32(x) if x.ndim() == 1 => x.iter().map(|&v| f64::from(v)).collect(),
            _ => {
                return Err(shape_err(
                    OP,
                    l,
                    2,
                    format!(
                        "batch_splits must be a 1-D float32 tensor, got {} of shape {:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ))
            }
        };
        let u: Option<Vec<usize>> = v
            .iter()
            .map(|&x| (x >= 0.0 && x.fract() == 0.0 && x <= n as f64).then_some(x as usize))
            .collect();
        match u {
            Some(u) if u.iter().sum::<usize>() == n => u,
            _ => {
                return Err(shape_err(
                    OP,
                    l,
                    2,
                    format!("batch_splits must be counts that sum to N = {n}, got {v:?}"),
                ))
            }
        }
    } else {
        vec![n]
    };
    let mut soft_scores = scores.clone();
    let (mut o_scores, mut o_boxes, mut o_classes, mut o_keeps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut keeps_size = Vec::new();
    let mut per_batch = Vec::new();
    let mut offset = 0;
    for &cnt in &splits {
        let mut keeps: Vec<Vec<usize>> = vec![Vec::new(); nc];
        let row = |i: usize| offset + i;
        for j in 1..nc {
            let sc = j - 1 + s0;
            let bc = box_col(j);
            let score = |i: usize| scores[row(i) * nc + sc];
            let bx = |i: usize| &boxes[row(i) * bw + bc * bd..row(i) * bw + (bc + 1) * bd];
            let mut cands: Vec<usize> = (0..cnt).filter(|&i| score(i) > a.score_thresh).collect();
            keeps[j] = match a.soft {
                Some((method, sigma, min_score)) => {
                    let mut col: Vec<f64> = (0..cnt).map(score).collect();
                    let k = soft_nms(
                        &cands, bx, &mut col, method, sigma, a.nms, min_score, a.plus,
                    );
                    for &i in &k {
                        soft_scores[row(i) * nc + sc] = col[i];
                    }
                    k
                }
                None => {
                    by_score_desc(&mut cands, score);
                    let limit = (a.per_im > 0).then_some(a.per_im as usize);
                    nms(&cands, bx, a.nms, limit, a.plus)
                }
            };
        }
        let final_score = |j: usize, i: usize| soft_scores[row(i) * nc + j - 1 + s0];
        let total: usize = keeps.iter().map(Vec::len).sum();
        if a.per_im > 0 && total > a.per_im as usize {
            let mut all: Vec<(usize, usize)> = (1..nc)
                .flat_map(|j| keeps[j].iter().map(move |&i| (j, i)))
                .collect();
            all.sort_by(|p, q| final_score(q.0, q.1).total_cmp(&final_score(p.0, p.1)));
            for k in &mut keeps {
                k.clear();
            }
            for &(j, i) in all.iter().take(a.per_im as usize) {
                keeps[j].push(i);
            }
        }
        let mut kept = 0;
        for j in 1..nc {
            let bc = box_col(j);
            for &i in &keeps[j] {
                o_scores.push(final_score(j, i));
                o_boxes
                    .extend_from_slice(&boxes[row(i) * bw + bc * bd..row(i) * bw + (bc + 1) * bd]);
                o_classes.push((j - usize::from(!a.classes_bg)) as f64);
                kept += 1;
            }
        }
        for k in &keeps {
            o_keeps.extend(k.iter().map(|&i| i as i32));
            keeps_size.push(k.len() as i32);
        }
        per_batch.push(kept as f64);
        offset += cnt;
    }
    let m = o_scores.len();
    l.set_output(0, f32_out(&[m], &o_scores)?);
    l.set_output(1, f32_out(&[m, bd], &o_boxes)?);
    l.set_output(2, f32_out(&[m], &o_classes)?);
    if outs > 3 {
        l.set_output(3, f32_out(&[splits.len()], &per_batch)?);
    }
    if outs > 4 {
        let nk = o_keeps.len();
        l.set_output(4, Tensor::from_vec(&[nk], o_keeps)?);
        l.set_output(5, Tensor::from_vec(&[splits.len(), nc], keeps_size)?);
    }
    Ok(())
}

// -------------------------------------------------- GenerateProposals --

struct Proposals {
    scale: f64,
    pre: i64,
    post: i64,
    thresh: f64,
    min_size: f64,
    x: Xform,
    clip_angle: f64,
}

fn build_proposals(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let scale = f64::from(ctx.args.f32("spatial_scale", 1.0 / 16.0)?);
    if !(scale.is_finite() && scale > 0.0) {
        return Err(ctx.bad_arg(format!("spatial_scale must be > 0, got {scale}")));
    }
    let a = Proposals {
        scale,
        pre: ctx.args.i64("pre_nms_topN", 6000)?,
        post: ctx.args.i64("post_nms_topN", 300)?,
        thresh: f64::from(ctx.args.f32("nms_thresh", 0.7)?),
        min_size: f64::from(ctx.args.f32("min_size", 16.0)?),
        x: xform_args(ctx, [1.0; 4])?,
        clip_angle: f64::from(ctx.args.f32("clip_angle_thresh", 1.0)?),
    };
    Ok(kernel(move |cx| {
        let outs = cx.num_outputs();
        let mut l = cx.lock();
        proposals(&mut l, &a, outs)?;
        Ok(true)
    }))
}

fn proposals(l: &mut Locked<'_>, a: &Proposals, outs: usize) -> Result<()> {
    const OP: &str = "GenerateProposals";
    let (scores, ss) = f32_values(l, OP, 0, "scores")?;
    let (deltas, ds) = f32_values(l, OP, 1, "bbox_deltas")?;
    let (info, is) = f32_values(l, OP, 2, "im_info")?;
    let (anchors, ans) = f32_values(l, OP, 3, "anchors")?;
    if ans.len() != 2 || !(ans[1] == 4 || ans[1] == 5) {
        return Err(shape_err(
            OP,
            l,
            3,
            format!("anchors must be (A, 4) or (A, 5) (rotated), got shape {ans:?}"),
        ));
    }
    let (na, bd) = (ans[0], ans[1]);
    if ss.len() != 4 || ss[1] != na {
        return Err(shape_err(
            OP,
            l,
            0,
            format!("scores must be (N, A = {na}, H, W), got shape {ss:?}"),
        ));
    }
    let (n, h, w) = (ss[0], ss[2], ss[3]);
    if ds != [n, bd * na, h, w] {
        return Err(shape_err(
            OP,
            l,
            1,
            format!(
                "bbox_deltas must be (N, {bd} x A, H, W) = {:?}, got shape {ds:?}",
                [n, bd * na, h, w]
            ),
        ));
    }
    if is != [n, 3] {
        return Err(shape_err(
            OP,
            l,
            2,
            format!("im_info must be (N = {n}, 3), got shape {is:?}"),
        ));
    }
    let stride = 1.0 / a.scale;
    let per = checked_numel::<f64>(&[na, h, w, bd], format_args!("{OP}'s proposals"))? / bd;
    let mut rois = Vec::new();
    let mut probs = Vec::new();
    for b in 0..n {
        // Candidate (h, w, a) in that order, as Caffe2 laid them out.
        let score = |c: usize| {
            let (hw, an) = (c / na, c % na);
            scores[((b * na + an) * h * w) + hw]
        };
        let mut order: Vec<usize> = (0..per).collect();
        by_score_desc(&mut order, score);
        if a.pre > 0 && (a.pre as usize) < order.len() {
            order.truncate(a.pre as usize);
        }
        let im = &info[b * 3..b * 3 + 3];
        let mut boxes = try_vec(order.len() * bd, "the proposals")?;
        let mut d = [0f64; 5];
        let mut bx = [0f64; 5];
        let mut o = [0f64; 5];
        for &c in &order {
            let (hw, an) = (c / na, c % na);
            let (y, x) = ((hw / w) as f64, (hw % w) as f64);
            let anc = &anchors[an * bd..an * bd + bd];
            bx[..bd].copy_from_slice(anc);
            // The anchor shifted to cell (y, x): both corners of an
            // upright box, the centre of a rotated one.
            bx[0] += x * stride;
            bx[1] += y * stride;
            if bd == 4 {
                bx[2] += x * stride;
                bx[3] += y * stride;
            }
            for (k, dv) in d[..bd].iter_mut().enumerate() {
                *dv = deltas[((b * na * bd + an * bd + k) * h * w) + hw];
            }
            a.x.apply(&bx[..bd], &d[..bd], &mut o[..bd]);
            clip_box(
                &mut o[..bd],
                im[0].trunc(),
                im[1].trunc(),
                a.x.plus,
                a.clip_angle,
            );
            boxes.extend_from_slice(&o[..bd]);
        }
        let min = a.min_size * im[2];
        let keep_ok = |p: usize| {
            let o = &boxes[p * bd..p * bd + bd];
            let (cx, cy, bw_, bh_) = if bd == 4 {
                let (bw_, bh_) = (o[2] - o[0] + a.x.plus, o[3] - o[1] + a.x.plus);
                (o[0] + bw_ / 2.0, o[1] + bh_ / 2.0, bw_, bh_)
            } else {
                (o[0], o[1], o[2], o[3])
            };
            bw_ >= min && bh_ >= min && cx < im[1] && cy < im[0]
        };
        let cands: Vec<usize> = (0..order.len()).filter(|&p| keep_ok(p)).collect();
        let limit = (a.post > 0).then_some(a.post as usize);
        let kept = nms(
            &cands,
            |p| &boxes[p * bd..p * bd + bd],
            a.thresh,
            limit,
            a.x.plus,
        );
        for p in kept {
            rois.push(b as f64);
            rois.extend_from_slice(&boxes[p * bd..p * bd + bd]);
            probs.push(score(order[p]));
        }
    }
    let m = probs.len();
    l.set_output(0, f32_out(&[m, bd + 1], &rois)?);
    if outs > 1 {
        l.set_output(1, f32_out(&[m], &probs)?);
    }
    Ok(())
}

// ------------------------------------------------------------ schemas --

const ANGLE_ARGS: [ArgDoc; 4] = [
    arg!(
        "angle_bound_on",
        "bool",
        "1",
        "rotated boxes: keep angles within [angle_bound_lo, angle_bound_hi]"
    ),
    arg!(
        "angle_bound_lo",
        "int",
        "-90",
        "rotated boxes: the lowest angle (degrees)"
    ),
    arg!(
        "angle_bound_hi",
        "int",
        "90",
        "rotated boxes: the highest angle (degrees)"
    ),
    arg!(
        "clip_angle_thresh",
        "float",
        "1.0",
        "rotated boxes within this many degrees of upright are clipped to the image"
    ),
];

const ROI_ALIGN_ARGS: &[ArgDoc] = &[
    arg!(
        "spatial_scale",
        "float",
        "1.0",
        "X's size relative to the image (0.0625 for a stride of 16)"
    ),
    arg!("pooled_h", "int", "1", "the output's height"),
    arg!("pooled_w", "int", "1", "the output's width"),
    arg!(
        "sampling_ratio",
        "int",
        "-1",
        "samples per bin side; <= 0: ceil(RoI side / pooled side)"
    ),
    arg!(
        "aligned",
        "bool",
        "0",
        "shift the RoIs by -0.5 pixel (and do not round their size up to 1)"
    ),
    arg!("order", "string", "NCHW", "NCHW or NHWC"),
];

const BBOX_ARGS: &[ArgDoc] = &[
    arg!(
        "weights",
        "floats",
        "[1, 1, 1, 1]",
        "wx, wy, ww, wh dividing the deltas"
    ),
    arg!(
        "apply_scale",
        "bool",
        "1",
        "scale the boxes back by im_info's scale"
    ),
    arg!(
        "correct_transform_coords",
        "bool",
        "0",
        "x2, y2 = centre + size / 2 - 1 (Detectron's rule)"
    ),
    arg!(
        "rotated",
        "bool",
        "0",
        "boxes are (ctr_x, ctr_y, w, h, angle in degrees)"
    ),
    ANGLE_ARGS[0],
    ANGLE_ARGS[1],
    ANGLE_ARGS[2],
    ANGLE_ARGS[3],
    arg!(
        "legacy_plus_one",
        "bool",
        "1",
        "a box from x1 to x2 is x2 - x1 + 1 wide"
    ),
];

const NMS_ARGS: &[ArgDoc] = &[
    arg!(
        "score_thresh",
        "float",
        "0.05",
        "boxes scoring at most this are dropped"
    ),
    arg!("nms", "float", "0.3", "the IoU above which NMS drops a box"),
    arg!(
        "detections_per_im",
        "int",
        "100",
        "the most boxes kept per image over all classes (<= 0: no limit)"
    ),
    arg!("soft_nms_enabled", "bool", "0", "soft-NMS instead of NMS"),
    arg!("soft_nms_method", "string", "linear", "linear or gaussian"),
    arg!("soft_nms_sigma", "float", "0.5", "the gaussian's sigma"),
    arg!(
        "soft_nms_min_score_thres",
        "float",
        "0.001",
        "soft-NMS drops boxes whose updated score is at most this"
    ),
    arg!("rotated", "bool", "0", "boxes are (ctr_x, ctr_y, w, h, angle in degrees); their IoU is that of the rotated rectangles"),
    arg!(
        "cls_agnostic_bbox_reg",
        "bool",
        "0",
        "one box per row for every class"
    ),
    arg!(
        "input_boxes_include_bg_cls",
        "bool",
        "1",
        "boxes (and the first score column) include the background class"
    ),
    arg!(
        "output_classes_include_bg_cls",
        "bool",
        "1",
        "output classes count the background as class 0"
    ),
    arg!(
        "legacy_plus_one",
        "bool",
        "1",
        "a box from x1 to x2 is x2 - x1 + 1 wide"
    ),
];

const PROPOSAL_ARGS: &[ArgDoc] = &[
    arg!(
        "spatial_scale",
        "float",
        "0.0625",
        "the feature map's size relative to the image (1 / anchor stride)"
    ),
    arg!(
        "pre_nms_topN",
        "int",
        "6000",
        "the best-scoring anchors kept before NMS (<= 0: all)"
    ),
    arg!(
        "post_nms_topN",
        "int",
        "300",
        "the most proposals kept after NMS (<= 0: all)"
    ),
    arg!(
        "nms_thresh",
        "float",
        "0.7",
        "the IoU above which NMS drops a proposal"
    ),
    arg!(
        "min_size",
        "float",
        "16",
        "proposals smaller than this (times im_info's scale) are dropped"
    ),
    arg!(
        "correct_transform_coords",
        "bool",
        "0",
        "x2, y2 = centre + size / 2 - 1 (Detectron's rule)"
    ),
    ANGLE_ARGS[0],
    ANGLE_ARGS[1],
    ANGLE_ARGS[2],
    ANGLE_ARGS[3],
    arg!(
        "legacy_plus_one",
        "bool",
        "1",
        "a box from x1 to x2 is x2 - x1 + 1 wide"
    ),
];

/// Detectron's exported nets spell `nms_thresh` as `nms_thres`, which
/// Caffe2 never read (its default, 0.7, applied); it is accepted and
/// ignored the same way.
const PROPOSAL_IGNORED: &[ArgDoc] = &[arg!(
    "nms_thres",
    "float",
    "",
    "a misspelling in Detectron's exported nets; ignored, as Caffe2 did (nms_thresh applies)"
)];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("RoIAlign", build_roi_align)
            .inputs(2, 2)
            .outputs(1, 1)
            .args(ROI_ALIGN_ARGS)
            .doc("RoI Align (Mask R-CNN): inputs X (N, C, H, W) or NHWC, RoIs (R, 5) (batch index, x1, y1, x2, y2) or (R, 4) (image 0); output Y (R, C, pooled_h, pooled_w) or NHWC: each bin the average of bilinear samples of X."),
        OpSchema::new("RoIAlignGradient", build_roi_align)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(ROI_ALIGN_ARGS)
            .doc("Gradient of RoIAlign: inputs X, RoIs, dY; output dX (X's shape): each sample's share of dY spread over its four taps."),
        OpSchema::new("BBoxTransform", build_bbox_transform)
            .inputs(3, 3)
            .outputs(1, 2)
            .args(BBOX_ARGS)
            .doc("Applies box regression deltas: inputs rois (R, 4 or 5; rotated 5 or 6), deltas (R, 4 x K; rotated 5 x K), im_info (N, 3); outputs box_out (R, 4 x K) clipped to each image, and roi_batch_splits (N), the RoIs per image."),
        OpSchema::new("BoxWithNMSLimit", build_nms_limit)
            .inputs(2, 3)
            .outputs(3, 6)
            .args(NMS_ARGS)
            .doc("Per image and foreground class: boxes scoring above score_thresh, NMS (or soft-NMS), then the best detections_per_im over the classes. Inputs scores (N, K), boxes (N, 4 x K), batch_splits (B); outputs scores (n), boxes (n, 4), classes (n), batch_splits (B), keeps (n, int32), keeps_size (B, K, int32)."),
        OpSchema::new("GenerateProposals", build_proposals)
            .inputs(4, 4)
            .outputs(1, 2)
            .args(PROPOSAL_ARGS)
            .ignores(PROPOSAL_IGNORED)
            .doc("RPN proposals: inputs scores (N, A, H, W), bbox_deltas (N, 4A, H, W), im_info (N, 3), anchors (A, 4), or rotated (A, 5) (ctr_x, ctr_y, w, h, angle) with bbox_deltas (N, 5A, H, W); per image the pre_nms_topN best anchors shifted over the grid, transformed by their deltas, clipped, filtered by min_size, NMS, post_nms_topN kept. Outputs rois (R, 5) (batch index, x1, y1, x2, y2; rotated: (R, 6)) and rois_probs (R)."),
    ]
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::tensor::Tensor;
    use crate::test_util::{get, int_arg, op, run, vals, ws_with};

    #[test]
    fn roi_align_of_a_constant_map_is_the_constant() {
        let x = Tensor::from_vec(&[1, 2, 4, 4], vec![3f32; 32]).unwrap();
        let r = Tensor::from_vec(&[1, 5], vec![0f32, 0.5, 0.5, 2.5, 2.5]).unwrap();
        let ws = ws_with(&[("x", x), ("r", r)]);
        let args = vec![int_arg("pooled_h", 2), int_arg("pooled_w", 2)];
        run(&ws, op("RoIAlign", &["x", "r"], &["y"], args)).unwrap();
        let y = get(&ws, "y");
        assert_eq!(y.shape(), &[1, 2, 2, 2]);
        assert!(vals(&y).iter().all(|v| (v - 3.0).abs() < 1e-6));
        // A batch index beyond N is an argument error, not a panic.
        let bad = Tensor::from_vec(&[1, 5], vec![1f32, 0., 0., 1., 1.]).unwrap();
        crate::test_util::feed(&ws, "r", bad);
        let e = run(&ws, op("RoIAlign", &["x", "r"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn rotated_overlaps_by_hand() {
        // A 2 x 2 square and itself turned 45 degrees: an octagon of area
        // 8 (sqrt 2 - 1).
        let oct = 8.0 * (2f64.sqrt() - 1.0);
        let a = [0.0, 0.0, 2.0, 2.0, 0.0];
        let b = [0.0, 0.0, 2.0, 2.0, 45.0];
        assert!((super::rotated_intersection(&a, &b) - oct).abs() < 1e-9);
        assert!((super::rotated_iou(&a, &b) - oct / (8.0 - oct)).abs() < 1e-9);
        // Disjoint, and half-overlapping upright boxes.
        assert_eq!(super::rotated_iou(&a, &[5.0, 0.0, 2.0, 2.0, 30.0]), 0.0);
        let c = [1.0, 0.0, 2.0, 2.0, 0.0];
        assert!((super::rotated_iou(&a, &c) - 2.0 / 6.0).abs() < 1e-9);
    }

    #[test]
    fn nms_keeps_the_best_of_overlapping_boxes() {
        let boxes = [
            [0.0, 0.0, 9.0, 9.0],
            [1.0, 1.0, 10.0, 10.0],
            [20.0, 20.0, 29.0, 29.0],
        ];
        let keep = super::nms(&[1, 0, 2], |i| &boxes[i][..], 0.5, None, 1.0);
        assert_eq!(keep, vec![1, 2]);
        let keep = super::nms(&[1, 0, 2], |i| &boxes[i][..], 0.5, Some(1), 1.0);
        assert_eq!(keep, vec![1]);
    }
}
