//! Image resizing (issue 29): `ResizeNearest` and `ResizeNearestGradient`
//! (Mask R-CNN's upsampling), NCHW and NHWC, scales as arguments or as a
//! second input, as Caffe2 defined them: the output side is
//! `floor(side * scale)` and output pixel (y, x) reads input pixel
//! (min(floor(y / height_scale), H - 1), min(floor(x / width_scale), W - 1)).

#![allow(clippy::result_large_err)]

use super::kit::{by_float, dense, input, kernel, parse_order, Order};
use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{ArgDoc, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{checked_numel, try_collect, zeroed_vec, Tensor};

#[derive(Clone)]
struct Resize {
    op: String,
    scales: (f64, f64),
    order: Order,
    grad: bool,
    /// The scales come from input `scales_at` (height, width).
    scales_at: Option<usize>,
}

fn check_scale(op: &str, what: &str, v: f64) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(Error::invalid_arg(format!(
            "{op}: {what} must be > 0, got {v}"
        )))
    }
}

fn build(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let grad = op.ends_with("Gradient");
    let mut scales = (1.0, 1.0);
    for (name, v) in [
        ("height_scale", &mut scales.0),
        ("width_scale", &mut scales.1),
    ] {
        *v = f64::from(ctx.args.f32(name, 1.0)?);
        if !(v.is_finite() && *v > 0.0) {
            return Err(ctx.bad_arg(format!("{name} must be > 0, got {v}")));
        }
    }
    let first_extra = if grad { 2 } else { 1 };
    let r = Resize {
        scales_at: (ctx.num_inputs() > first_extra).then_some(first_extra),
        op,
        scales,
        order: parse_order(ctx)?,
        grad,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        // The data input's float type: X forward, dY backward.
        by_float!(&l, &r.op, 0, resize(&mut l, &r))?;
        Ok(true)
    }))
}

/// The scales in use: the arguments, or input `i` (height, width).
fn scales(l: &Locked<'_>, r: &Resize) -> Result<(f64, f64)> {
    let Some(i) = r.scales_at else {
        return Ok(r.scales);
    };
    let t = l.tensor(i)?;
    let v: Option<Vec<f64>> = match t {
        Tensor::F32(a) if a.len() == 2 && a.ndim() == 1 => {
            Some(a.iter().map(|&v| f64::from(v)).collect())
        }
        _ => None,
    };
    let v = v.ok_or_else(|| {
        Error::shape(format!(
            "{}: scales ('{}') must be a float32 vector (height_scale, width_scale), got {} of shape {:?}",
            r.op,
            l.input_name(i),
            t.dtype(),
            t.shape()
        ))
        .with_blob(l.input_name(i))
    })?;
    Ok((
        check_scale(&r.op, "height_scale", v[0])?,
        check_scale(&r.op, "width_scale", v[1])?,
    ))
}

/// (N, C, H, W) of a 4-D image in the op's order.
fn dims(op: &str, what: &str, name: &str, s: &[usize], order: Order) -> Result<[usize; 4]> {
    match (s, order) {
        ([n, c, h, w], Order::Nchw) | ([n, h, w, c], Order::Nhwc) => Ok([*n, *c, *h, *w]),
        _ => Err(Error::shape(format!(
            "{op}: {what} ('{name}') must be 4-D ({order:?}), got shape {s:?}"
        ))
        .with_blob(name)),
    }
}

fn image_shape(n: usize, c: usize, h: usize, w: usize, order: Order) -> Vec<usize> {
    match order {
        Order::Nchw => vec![n, c, h, w],
        Order::Nhwc => vec![n, h, w, c],
    }
}

/// The input row (column) output row `o` reads (float32 arithmetic, as
/// Caffe2's).
fn source(o: usize, scale: f64, n: usize) -> usize {
    ((o as f32 / scale as f32) as usize).min(n.saturating_sub(1))
}

fn resize<T: Float>(l: &mut Locked<'_>, r: &Resize) -> Result<()> {
    let (hs, ws) = scales(l, r)?;
    let op = r.op.as_str();
    // Forward: X is input 0. Backward: dY is input 0 and X input 1.
    let xi = usize::from(r.grad);
    let xs = l.tensor(xi)?.shape().to_vec();
    let [n, c, h, w] = dims(op, "X", l.input_name(xi), &xs, r.order)?;
    // Saturating: a huge size fails the size check below.
    let oh = (h as f32 * hs as f32) as usize;
    let ow = (w as f32 * ws as f32) as usize;
    let ys = image_shape(n, c, oh, ow, r.order);
    checked_numel::<T>(&ys, format_args!("{op}'s output"))?;
    let at = |b: usize, ch: usize, y: usize, x: usize, hh: usize, ww: usize| match r.order {
        Order::Nchw => ((b * c + ch) * hh + y) * ww + x,
        Order::Nhwc => ((b * hh + y) * ww + x) * c + ch,
    };
    // An empty output may still have a huge side: fallible.
    let rows = try_collect((0..oh).map(|y| source(y, hs, h)), "ResizeNearest's rows")?;
    let cols = try_collect((0..ow).map(|x| source(x, ws, w)), "ResizeNearest's columns")?;
    if !r.grad {
        let x = dense(input::<T>(l, op, 0)?);
        let mut y = zeroed_vec::<T>(&ys, format_args!("{op}'s output"))?;
        for b in 0..n {
            for ch in 0..c {
                for (oy, &iy) in rows.iter().enumerate() {
                    for (ox, &ix) in cols.iter().enumerate() {
                        y[at(b, ch, oy, ox, oh, ow)] = x[at(b, ch, iy, ix, h, w)];
                    }
                }
            }
        }
        l.set_output(0, Tensor::from_vec(&ys, y)?);
    } else {
        let dys = l.tensor(0)?.shape().to_vec();
        if dys != ys {
            return Err(Error::shape(format!(
                "{op}: dY ('{}') must have the forward output's shape {ys:?}, got {dys:?}",
                l.input_name(0)
            ))
            .with_blob(l.input_name(0)));
        }
        let dy = dense(input::<T>(l, op, 0)?);
        let mut dx = zeroed_vec::<T>(&xs, format_args!("{op}'s output"))?;
        for b in 0..n {
            for ch in 0..c {
                for (oy, &iy) in rows.iter().enumerate() {
                    for (ox, &ix) in cols.iter().enumerate() {
                        let k = at(b, ch, iy, ix, h, w);
                        dx[k] = dx[k] + dy[at(b, ch, oy, ox, oh, ow)];
                    }
                }
            }
        }
        l.set_output(0, Tensor::from_vec(&xs, dx)?);
    }
    Ok(())
}

const ARGS: &[ArgDoc] = &[
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
    arg!("order", "string", "NCHW", "NCHW or NHWC"),
];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("ResizeNearest", build)
            .inputs(1, 2)
            .outputs(1, 1)
            .args(ARGS)
            .doc("Nearest-neighbour resize of X (N, C, H, W) or NHWC by height_scale and width_scale (arguments, or input 1: a float32 vector (height_scale, width_scale)); output pixel (y, x) is input pixel (min(floor(y / height_scale), H - 1), min(floor(x / width_scale), W - 1))."),
        OpSchema::new("ResizeNearestGradient", build)
            .inputs(2, 3)
            .outputs(1, 1)
            .args(ARGS)
            .doc("Gradient of ResizeNearest: inputs dY, X (and the scales); output dX, each input pixel the sum of the gradients of the output pixels that read it."),
    ]
}
