//! Pooling (issue 15): `MaxPool` and `AveragePool` (1- to 3-D, NCHW and
//! NHWC, `global_pooling`, Caffe2's legacy pads, `count_include_pad`) and
//! their gradients. The window arguments and their geometry are
//! `conv.rs`'s.
//!
//! A window's taps that fall in the padding are skipped: a max is over the
//! taps inside the image, an average divides by their number (or, with
//! `count_include_pad`, by the taps inside the padded image, as Caffe2).
//! `MaxPoolGradient` gives each window's gradient to its first largest
//! input (Caffe2 gave it to every input equal to the max; see porting.md).

#![allow(clippy::result_large_err)]

use super::conv::{
    by_float, image_shape, split_image, Float, Geo, Order, Window, CONV_IGNORED, WINDOW_ARGS,
};
use super::kernel;
use super::nn::{array, dense, input, real_dtype};
use crate::error::{Error, Result};
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};

struct PoolArgs {
    win: Window,
    max: bool,
    count_include_pad: bool,
    op: String,
}

impl PoolArgs {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<PoolArgs> {
        Ok(PoolArgs {
            win: Window::parse(ctx, true)?,
            max: ctx.op_type().starts_with("MaxPool"),
            count_include_pad: ctx.args.bool("count_include_pad", false)?,
            op: ctx.op_type().to_string(),
        })
    }
}

/// The taps of every output along one dim: the input indices inside the
/// image, and how many taps fall inside the padded image.
struct Taps {
    inside: Vec<Vec<usize>>,
    padded: Vec<usize>,
}

fn taps(g: &Geo, dim: usize) -> Taps {
    let limit = g.ins[dim] + g.ph[dim] + g.pt[dim];
    let mut inside = Vec::with_capacity(g.outs[dim]);
    let mut padded = Vec::with_capacity(g.outs[dim]);
    for o in 0..g.outs[dim] {
        inside.push((0..g.k[dim]).filter_map(|a| g.tap(dim, o, a)).collect());
        padded.push(
            (0..g.k[dim])
                .filter(|&a| o * g.s[dim] + a * g.d[dim] < limit)
                .count(),
        );
    }
    Taps { inside, padded }
}

struct Setup {
    g: Geo,
    n: usize,
    c: usize,
    x_shape: Vec<usize>,
    y_shape: Vec<usize>,
    order: Order,
}

fn setup(l: &Locked<'_>, a: &PoolArgs) -> Result<Setup> {
    let xs = l.tensor(0)?.shape().to_vec();
    let name = l.input_name(0);
    let (n, c, sp) = split_image(&a.op, "X", name, &xs, a.win.order)?;
    let g = a
        .win
        .geometry(&sp, None, None)
        .map_err(|e| Error::new(e.kind, format!("{}: {}", a.op, e.message)).with_blob(name))?;
    let y_shape = image_shape(n, c, &g.outs[3 - g.nd..], a.win.order);
    Ok(Setup {
        g,
        n,
        c,
        x_shape: xs,
        y_shape,
        order: a.win.order,
    })
}

/// Calls `f(x offsets of the window's taps inside the image, taps inside
/// the padded image, y offset)` for every output of every plane.
fn each_window(s: &Setup, mut f: impl FnMut(&[usize], usize, usize)) {
    let g = &s.g;
    let t: Vec<Taps> = (0..3).map(|d| taps(g, d)).collect();
    let (pin, pout) = (g.in_len(), g.out_len());
    let [_, i1, i2] = g.ins;
    let mut idx = Vec::with_capacity(g.ksize());
    for b in 0..s.n {
        for ch in 0..s.c {
            let (ib, ob, st) = match s.order {
                Order::Nchw => ((b * s.c + ch) * pin, (b * s.c + ch) * pout, 1),
                Order::Nhwc => (b * pin * s.c + ch, b * pout * s.c + ch, s.c),
            };
            let mut o = 0;
            for z in 0..g.outs[0] {
                for y in 0..g.outs[1] {
                    for w in 0..g.outs[2] {
                        idx.clear();
                        for &zi in &t[0].inside[z] {
                            for &yi in &t[1].inside[y] {
                                for &xi in &t[2].inside[w] {
                                    idx.push(ib + ((zi * i1 + yi) * i2 + xi) * st);
                                }
                            }
                        }
                        let padded = t[0].padded[z] * t[1].padded[y] * t[2].padded[w];
                        f(&idx, padded, ob + o * st);
                        o += 1;
                    }
                }
            }
        }
    }
}

/// The position (in `idx`) of the first largest value, if any.
fn argmax<T: Float>(x: &[T], idx: &[usize]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for &i in idx {
        match best {
            Some(b) if x[i].partial_cmp(&x[b]) != Some(std::cmp::Ordering::Greater) => {}
            _ => best = Some(i),
        }
    }
    best
}

fn pool_t<T: Float>(l: &mut Locked<'_>, a: &PoolArgs) -> Result<()> {
    let s = setup(l, a)?;
    let x = dense(input::<T>(l, &a.op, 0)?);
    let mut y = vec![T::of(0.0); s.y_shape.iter().product()];
    let zero = T::of(0.0);
    each_window(&s, |idx, padded, o| {
        y[o] = if a.max {
            argmax(&x, idx).map_or(zero, |i| x[i])
        } else {
            let count = if a.count_include_pad {
                padded
            } else {
                idx.len()
            };
            let sum: T = idx.iter().map(|&i| x[i]).sum();
            if count == 0 {
                zero
            } else {
                sum / T::of(count as f64)
            }
        };
    });
    l.set_output(0, T::wrap(array(&s.y_shape, y)?));
    Ok(())
}

fn pool_grad_t<T: Float>(l: &mut Locked<'_>, a: &PoolArgs) -> Result<()> {
    let s = setup(l, a)?;
    let dys = l.tensor(2)?.shape().to_vec();
    if dys != s.y_shape {
        return Err(Error::shape(format!(
            "{}: dY ('{}', shape {dys:?}) must have the pooled shape {:?}",
            a.op,
            l.input_name(2),
            s.y_shape
        ))
        .with_blob(l.input_name(2)));
    }
    let x = dense(input::<T>(l, &a.op, 0)?);
    let dy = dense(input::<T>(l, &a.op, 2)?);
    let mut dx = vec![T::of(0.0); x.len()];
    each_window(&s, |idx, padded, o| {
        if a.max {
            if let Some(i) = argmax(&x, idx) {
                dx[i] += dy[o];
            }
        } else {
            let count = if a.count_include_pad {
                padded
            } else {
                idx.len()
            };
            if count > 0 {
                let v = dy[o] / T::of(count as f64);
                for &i in idx {
                    dx[i] += v;
                }
            }
        }
    });
    l.set_output(0, T::wrap(array(&s.x_shape, dx)?));
    Ok(())
}

fn build_pool(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = PoolArgs::parse(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &a.op, 0, pool_t(&mut l, &a))?;
        Ok(true)
    }))
}

fn build_pool_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = PoolArgs::parse(ctx)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        by_float!(&l, &a.op, 0, pool_grad_t(&mut l, &a))?;
        Ok(true)
    }))
}

pub fn schemas() -> Vec<OpSchema> {
    let fwd = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_pool)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(WINDOW_ARGS)
            .ignores(CONV_IGNORED)
            .doc(doc)
    };
    let grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_pool_grad)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(WINDOW_ARGS)
            .ignores(CONV_IGNORED)
            .doc(doc)
    };
    const MAX: &str = "Max pooling over windows (kernel, stride, pads, dilation; global_pooling) of X (N, C, spatial) in NCHW or (N, spatial, C) in NHWC, 1 to 3 spatial dims; taps in the padding are skipped.";
    const AVG: &str = "Average pooling over windows of X; the divisor counts the taps inside the image, or inside the padded image with count_include_pad.";
    const MAX_G: &str = "Gradient of MaxPool: inputs (X, Y, dY), output dX: each window's gradient goes to its first largest input.";
    const AVG_G: &str = "Gradient of AveragePool: inputs (X, Y, dY), output dX.";
    vec![
        fwd("MaxPool", MAX),
        fwd("MaxPool1D", MAX),
        fwd("MaxPool2D", MAX),
        fwd("MaxPool3D", MAX),
        fwd("AveragePool", AVG),
        fwd("AveragePool1D", AVG),
        fwd("AveragePool2D", AVG),
        fwd("AveragePool3D", AVG),
        grad("MaxPoolGradient", MAX_G),
        grad("MaxPool1DGradient", MAX_G),
        grad("MaxPool2DGradient", MAX_G),
        grad("MaxPool3DGradient", MAX_G),
        grad("AveragePoolGradient", AVG_G),
        grad("AveragePool1DGradient", AVG_G),
        grad("AveragePool2DGradient", AVG_G),
        grad("AveragePool3DGradient", AVG_G),
    ]
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::tensor::Tensor;
    use crate::test_util::{get, int_arg, op, run, vals, ws_with};

    #[test]
    fn pooling_by_hand() {
        // X 1x1x3x3 = 1..9; kernel 2, stride 1, pad 1 at the tails only.
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let ws = ws_with(&[("x", Tensor::from_vec(&[1, 1, 3, 3], x).unwrap())]);
        run(
            &ws,
            op("MaxPool", &["x"], &["m"], vec![int_arg("kernel", 2)]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "m")), vec![5., 6., 8., 9.]);
        let pads = vec![
            int_arg("kernel", 2),
            int_arg("pad_t", 0),
            int_arg("pad_l", 0),
            int_arg("pad_b", 1),
            int_arg("pad_r", 1),
        ];
        run(&ws, op("AveragePool", &["x"], &["a"], pads.clone())).unwrap();
        // The last row and column average the taps inside the image.
        assert_eq!(
            vals(&get(&ws, "a")),
            vec![3., 4., 4.5, 6., 7., 7.5, 7.5, 8.5, 9.]
        );
        let mut cip = pads;
        cip.push(int_arg("count_include_pad", 1));
        run(&ws, op("AveragePool", &["x"], &["c"], cip)).unwrap();
        assert_eq!(vals(&get(&ws, "c"))[8], 9. / 4.);
        // A window larger than the padded input is a shape error.
        let e = run(
            &ws,
            op("MaxPool", &["x"], &["e"], vec![int_arg("kernel", 4)]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
    }
}
