//! Pooling (issue 15): `MaxPool`, `AveragePool` and `LpPool` (1- to 3-D,
//! NCHW and NHWC, `global_pooling`, Caffe2's legacy pads,
//! `count_include_pad`) and their gradients. The window arguments and their
//! geometry are `conv.rs`'s.
//!
//! A window's taps that fall in the padding are skipped: a max is over the
//! taps inside the image, an average divides by their number (or, with
//! `count_include_pad`, by the taps inside the padded image, as Caffe2), an
//! Lp norm is over the taps inside (the zero padding adds nothing).
//! `MaxPoolGradient` gives each window's gradient to its first largest
//! input (Caffe2 gave it to every input equal to the max; see porting.md).

#![allow(clippy::result_large_err)]

use super::conv::window::{image_shape, split_image, Geo, Window, CONV_IGNORED, WINDOW_ARGS};
use super::kit::{abs, array, dense, float_kernel, input, sign, Order};
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{checked_numel, try_collect, try_vec, zeroed_vec};

/// What a window's output is.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Average,
    /// The Lp norm, (sum of |x|^p)^(1/p), with p > 0.
    Lp(f64),
}

struct PoolArgs {
    win: Window,
    kind: Kind,
    count_include_pad: bool,
    op: String,
}

impl PoolArgs {
    fn parse(ctx: &OpDefCtx<'_>) -> Result<PoolArgs> {
        let ty = ctx.op_type();
        let kind = if ty.starts_with("MaxPool") {
            Kind::Max
        } else if ty.starts_with("LpPool") {
            let p = ctx.args.f32("p", 2.0)?;
            if !(p.is_finite() && p > 0.0) {
                return Err(ctx.bad_arg(format!("argument `p` must be a positive number, got {p}")));
            }
            Kind::Lp(f64::from(p))
        } else {
            Kind::Average
        };
        Ok(PoolArgs {
            win: Window::parse(ctx, true)?,
            kind,
            count_include_pad: ctx.args.bool("count_include_pad", false)?,
            op: ty.to_string(),
        })
    }
}

/// The taps of every output along one dim: the input indices inside the
/// image, and how many taps fall inside the padded image.
struct Taps {
    inside: Vec<Vec<usize>>,
    padded: Vec<usize>,
}

fn taps(g: &Geo, dim: usize) -> Result<Taps> {
    // The geometry checked that the padded input fits in an isize.
    let limit = g.ins[dim] + g.ph[dim] + g.pt[dim];
    let what = "the pooling windows' taps";
    let mut inside = try_vec(g.outs[dim], what)?;
    let mut padded = try_vec(g.outs[dim], what)?;
    for o in 0..g.outs[dim] {
        inside.push(try_collect(
            (0..g.k[dim]).filter_map(|a| g.tap(dim, o, a)),
            what,
        )?);
        padded.push(
            (0..g.k[dim])
                .filter(|&a| o * g.s[dim] + a * g.d[dim] < limit)
                .count(),
        );
    }
    Ok(Taps { inside, padded })
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
    checked_numel::<f64>(&y_shape, format_args!("{}'s output", a.op))?;
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
fn each_window(s: &Setup, mut f: impl FnMut(&[usize], usize, usize)) -> Result<()> {
    let g = &s.g;
    let t = [taps(g, 0)?, taps(g, 1)?, taps(g, 2)?];
    let (pin, pout) = (g.in_len(), g.out_len());
    let [_, i1, i2] = g.ins;
    let mut idx = try_vec(g.ksize(), "a pooling window")?;
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
    Ok(())
}

/// Work (elements of X or Y) from which the planes are split across the
/// kernel pool: the break-even of `elementwise::loops::PAR_MIN_LEN`.
const PAR_MIN_LEN: usize = 1 << 18;
/// About this many input elements per rayon task (whole planes): a few of
/// the elementwise loops' chunks, so that when the OS deschedules one pool
/// thread the others take over the rest.
const TASK_LEN: usize = 1 << 16;

/// One output's window along one spatial dim of the plane path: the taps
/// inside the image, `lo..hi` (contiguous: dilation 1), and how many taps
/// fall inside the padded image.
#[derive(Clone, Copy)]
struct Span {
    lo: usize,
    hi: usize,
    padded: usize,
}

fn spans(g: &Geo, dim: usize) -> Result<Vec<Span>> {
    let t = taps(g, dim)?;
    try_collect(
        t.inside.iter().zip(&t.padded).map(|(v, &padded)| Span {
            lo: v.first().copied().unwrap_or(0),
            hi: v.last().map_or(0, |&l| l + 1),
            padded,
        }),
        "the pooling windows' taps",
    )
}

/// The plane path's windows: (rows, columns) of a 1-D or 2-D NCHW
/// max or average pooling without dilation (every CNN's pooling, global
/// pooling included), with non-empty planes. None: the general path.
fn plane_windows(s: &Setup, a: &PoolArgs) -> Result<Option<(Vec<Span>, Vec<Span>)>> {
    let g = &s.g;
    let simple = s.order == Order::Nchw
        && !matches!(a.kind, Kind::Lp(_))
        && g.ins[0] == 1
        && g.outs[0] == 1
        && g.k[0] == 1
        && g.ph[0] == 0
        && g.d[1] == 1
        && g.d[2] == 1
        && g.in_len() > 0
        && g.out_len() > 0;
    if !simple {
        return Ok(None);
    }
    Ok(Some((spans(g, 1)?, spans(g, 2)?)))
}

/// Whether `planes` planes of `len` elements (the larger of X's and Y's)
/// are worth the kernel pool, and how many planes one task takes.
fn plane_split(planes: usize, len: usize) -> Option<usize> {
    (planes > 1 && planes.saturating_mul(len) >= PAR_MIN_LEN && crate::threads::pool_available())
        .then(|| (TASK_LEN / len.max(1)).max(1))
}

/// One plane of MaxPool or AveragePool: `x` (rows of `w`) pooled into `y`
/// (rows of `cols.len()`). The same values as `each_window` with `argmax`
/// or the sum: the taps in row-major order, a max replaced only by a
/// strictly greater value, a sum added up from the empty sum's value.
fn pool_plane<T: Float>(
    x: &[T],
    y: &mut [std::mem::MaybeUninit<T>],
    w: usize,
    rows: &[Span],
    cols: &[Span],
    kind: Kind,
    count_include_pad: bool,
) {
    let zero = T::of(0.0);
    let empty: T = std::iter::empty::<T>().sum();
    for (yrow, r) in y.chunks_exact_mut(cols.len()).zip(rows) {
        for (out, c) in yrow.iter_mut().zip(cols) {
            let inside = (r.hi - r.lo) * (c.hi - c.lo);
            out.write(if kind == Kind::Max {
                if inside == 0 {
                    zero
                } else {
                    let mut m = x[r.lo * w + c.lo];
                    for yi in r.lo..r.hi {
                        for &v in &x[yi * w + c.lo..yi * w + c.hi] {
                            if v > m {
                                m = v;
                            }
                        }
                    }
                    m
                }
            } else {
                let count = if count_include_pad {
                    r.padded * c.padded
                } else {
                    inside
                };
                let mut sum = empty;
                for yi in r.lo..r.hi {
                    for &v in &x[yi * w + c.lo..yi * w + c.hi] {
                        sum = sum + v;
                    }
                }
                if count == 0 {
                    zero
                } else {
                    sum / T::of(count as f64)
                }
            });
        }
    }
}

/// One plane of MaxPoolGradient or AveragePoolGradient: `dy` (rows of
/// `cols.len()`) added into `dx` (rows of `w`, zeros), in the order of
/// `each_window`.
#[allow(clippy::too_many_arguments)]
fn pool_grad_plane<T: Float>(
    x: &[T],
    dy: &[T],
    dx: &mut [T],
    w: usize,
    rows: &[Span],
    cols: &[Span],
    kind: Kind,
    count_include_pad: bool,
) {
    for (dyrow, r) in dy.chunks_exact(cols.len()).zip(rows) {
        for (&d, c) in dyrow.iter().zip(cols) {
            let inside = (r.hi - r.lo) * (c.hi - c.lo);
            if kind == Kind::Max {
                if inside == 0 {
                    continue;
                }
                let mut best = r.lo * w + c.lo;
                let mut m = x[best];
                for yi in r.lo..r.hi {
                    let row = yi * w;
                    for (xi, &v) in x[row + c.lo..row + c.hi].iter().enumerate() {
                        if v > m {
                            m = v;
                            best = row + c.lo + xi;
                        }
                    }
                }
                dx[best] += d;
            } else {
                let count = if count_include_pad {
                    r.padded * c.padded
                } else {
                    inside
                };
                if count > 0 {
                    let v = d / T::of(count as f64);
                    for yi in r.lo..r.hi {
                        for e in &mut dx[yi * w + c.lo..yi * w + c.hi] {
                            *e += v;
                        }
                    }
                }
            }
        }
    }
}

/// MaxPool or AveragePool by planes (see `plane_windows`), on the kernel
/// pool when there is enough work.
fn pool_planes<T: Float>(
    x: &[T],
    y: &mut [std::mem::MaybeUninit<T>],
    s: &Setup,
    a: &PoolArgs,
    (rows, cols): &(Vec<Span>, Vec<Span>),
) {
    let (pin, pout, w) = (s.g.in_len(), s.g.out_len(), s.g.ins[2]);
    let plane = |(x, y): (&[T], &mut [std::mem::MaybeUninit<T>])| {
        pool_plane(x, y, w, rows, cols, a.kind, a.count_include_pad)
    };
    match plane_split(s.n * s.c, pin.max(pout)) {
        Some(per_task) => {
            use rayon::prelude::*;
            x.par_chunks_exact(pin)
                .zip(y.par_chunks_exact_mut(pout))
                .with_max_len(per_task)
                .for_each(plane);
        }
        None => x
            .chunks_exact(pin)
            .zip(y.chunks_exact_mut(pout))
            .for_each(plane),
    }
}

/// The gradient by planes (see `plane_windows`).
fn pool_grad_planes<T: Float>(
    x: &[T],
    dy: &[T],
    dx: &mut [T],
    s: &Setup,
    a: &PoolArgs,
    (rows, cols): &(Vec<Span>, Vec<Span>),
) {
    let (pin, pout, w) = (s.g.in_len(), s.g.out_len(), s.g.ins[2]);
    let plane = |((x, dy), dx): ((&[T], &[T]), &mut [T])| {
        pool_grad_plane(x, dy, dx, w, rows, cols, a.kind, a.count_include_pad)
    };
    match plane_split(s.n * s.c, pin.max(pout)) {
        Some(per_task) => {
            use rayon::prelude::*;
            x.par_chunks_exact(pin)
                .zip(dy.par_chunks_exact(pout))
                .zip(dx.par_chunks_exact_mut(pin))
                .with_max_len(per_task)
                .for_each(plane);
        }
        None => x
            .chunks_exact(pin)
            .zip(dy.chunks_exact(pout))
            .zip(dx.chunks_exact_mut(pin))
            .for_each(plane),
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

/// LpPool's arguments: the window's and `p`.
fn lp_args() -> &'static [crate::operator::ArgDoc] {
    static ARGS: std::sync::OnceLock<Vec<crate::operator::ArgDoc>> = std::sync::OnceLock::new();
    ARGS.get_or_init(|| {
        let mut v = WINDOW_ARGS.to_vec();
        v.push(crate::arg!(
            "p",
            "float",
            "2.0",
            "LpPool: the norm's p (> 0)"
        ));
        v
    })
}

fn pool_t<T: Float>(l: &mut Locked<'_>, a: &PoolArgs) -> Result<()> {
    let s = setup(l, a)?;
    let x = dense(input::<T>(l, &a.op, 0)?);
    if let Some(win) = plane_windows(&s, a)? {
        let len = s.n * s.c * s.g.out_len();
        if x.len() != s.n * s.c * s.g.in_len() {
            return Err(Error::internal(format!(
                "{}: the planes do not cover X",
                a.op
            )));
        }
        // SAFETY: `pool_planes` writes every output of every plane: Y's
        // n * c planes of out_len (the setup checked its size).
        let y = unsafe {
            crate::tensor::written_vec(len, format_args!("{}'s output", a.op), |y| {
                pool_planes(&x, y, &s, a, &win)
            })?
        };
        l.set_output(0, T::wrap(array(&s.y_shape, y)?));
        return Ok(());
    }
    let mut y = zeroed_vec::<T>(&s.y_shape, format_args!("{}'s output", a.op))?;
    let zero = T::of(0.0);
    each_window(&s, |idx, padded, o| {
        y[o] = if a.kind == Kind::Max {
            argmax(&x, idx).map_or(zero, |i| x[i])
        } else if let Kind::Lp(p) = a.kind {
            let p = T::of(p);
            let sum: T = idx.iter().map(|&i| abs(x[i]).powf(p)).sum();
            sum.powf(T::of(1.0) / p)
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
    })?;
    l.set_output(0, T::wrap(array(&s.y_shape, y)?));
    Ok(())
}

/// Input `i` (`what`: Y or dY) of a gradient op has the pooled shape.
fn check_pooled(l: &Locked<'_>, a: &PoolArgs, s: &Setup, i: usize, what: &str) -> Result<()> {
    let shape = l.tensor(i)?.shape();
    if shape != s.y_shape.as_slice() {
        return Err(Error::shape(format!(
            "{}: {what} ('{}', shape {shape:?}) must have the pooled shape {:?}",
            a.op,
            l.input_name(i),
            s.y_shape
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(())
}

fn pool_grad_t<T: Float>(l: &mut Locked<'_>, a: &PoolArgs) -> Result<()> {
    let s = setup(l, a)?;
    check_pooled(l, a, &s, 2, "dY")?;
    let x = dense(input::<T>(l, &a.op, 0)?);
    let dy = dense(input::<T>(l, &a.op, 2)?);
    let mut dx = zeroed_vec::<T>(&s.x_shape, format_args!("{}'s dX", a.op))?;
    let zero = T::of(0.0);
    if let Kind::Lp(p) = a.kind {
        check_pooled(l, a, &s, 1, "Y")?;
        // dy/dx_j = sign(x_j) (|x_j| / y)^(p-1); 0 where x_j or the norm y
        // is 0 (Caffe2's x |x|^(p-2) / y^(p-1) is NaN there).
        let y = dense(input::<T>(l, &a.op, 1)?);
        let e = T::of(p - 1.0);
        each_window(&s, |idx, _, o| {
            if y[o] != zero {
                for &i in idx {
                    if x[i] != zero {
                        dx[i] += dy[o] * sign(x[i]) * (abs(x[i]) / y[o]).powf(e);
                    }
                }
            }
        })?;
        l.set_output(0, T::wrap(array(&s.x_shape, dx)?));
        return Ok(());
    }
    if let Some(win) = plane_windows(&s, a)? {
        pool_grad_planes(&x, &dy, &mut dx, &s, a, &win);
        l.set_output(0, T::wrap(array(&s.x_shape, dx)?));
        return Ok(());
    }
    each_window(&s, |idx, padded, o| {
        if a.kind == Kind::Max {
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
    })?;
    l.set_output(0, T::wrap(array(&s.x_shape, dx)?));
    Ok(())
}

fn build_pool(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = PoolArgs::parse(ctx)?;
    float_kernel!(&a.op, 0, |l| pool_t(&mut l, &a))
}

fn build_pool_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = PoolArgs::parse(ctx)?;
    float_kernel!(&a.op, 0, |l| pool_grad_t(&mut l, &a))
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
    const LP: &str = "Lp pooling: each window's (sum of |x|^p)^(1/p) over its taps inside the image (argument p, float, default 2.0); windows as MaxPool's.";
    const LP_G: &str = "Gradient of LpPool: inputs (X, Y, dY), output dX = dY * sign(X) * (|X| / Y)^(p-1) (0 where X or Y is 0).";
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
        fwd("LpPool", LP).args(lp_args()),
        grad("LpPoolGradient", LP_G).args(lp_args()),
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

    #[test]
    fn lp_pool_by_hand() {
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let ws = ws_with(&[("x", Tensor::from_vec(&[1, 1, 3, 3], x).unwrap())]);
        run(
            &ws,
            op("LpPool", &["x"], &["y"], vec![int_arg("kernel", 2)]),
        )
        .unwrap();
        let want = [46f32, 74., 154., 206.].map(f32::sqrt);
        for (g, w) in vals(&get(&ws, "y")).iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
        let p1 = vec![int_arg("kernel", 2), crate::test_util::float_arg("p", 1.0)];
        run(&ws, op("LpPool", &["x"], &["y1"], p1)).unwrap();
        assert_eq!(vals(&get(&ws, "y1")), vec![12., 16., 24., 28.]);
        // dY/dX = X / Y for p = 2: [3, 4] pooled to 5. NHWC, kernel 1x2.
        let w2 = ws_with(&[
            (
                "x",
                Tensor::from_vec(&[1, 1, 2, 1], vec![3f32, 4.]).unwrap(),
            ),
            ("dy", Tensor::from_vec(&[1, 1, 1, 1], vec![10f32]).unwrap()),
        ]);
        let args = || {
            let mut a = vec![int_arg("kernel_h", 1), int_arg("kernel_w", 2)];
            a.push(crate::ir::Argument {
                name: Some("order".into()),
                s: Some(b"NHWC".to_vec()),
                ..Default::default()
            });
            a
        };
        run(&w2, op("LpPool", &["x"], &["y"], args())).unwrap();
        assert_eq!(vals(&get(&w2, "y")), vec![5.]);
        run(
            &w2,
            op("LpPoolGradient", &["x", "y", "dy"], &["dx"], args()),
        )
        .unwrap();
        let dx = vals(&get(&w2, "dx"));
        assert!(
            (dx[0] - 6.).abs() < 1e-5 && (dx[1] - 8.).abs() < 1e-5,
            "{dx:?}"
        );
        // p must be positive.
        let bad = vec![int_arg("kernel", 2), crate::test_util::float_arg("p", 0.0)];
        let e = run(&ws, op("LpPool", &["x"], &["y"], bad)).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }
}
