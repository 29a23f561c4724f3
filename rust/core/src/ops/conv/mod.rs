//! Convolutions (issue 15): `Conv` (1-, 2- and 3-D, groups, dilations,
//! NCHW and NHWC, bias optional), `ConvTranspose`, their gradients, and the
//! window geometry (kernel, strides, pads, dilations, Caffe2's legacy pads)
//! that the pooling ops (`ops/pool.rs`) share.
//!
//! A convolution is an im2col (the input's windows laid out as a matrix)
//! and a GEMM per image and group; a 1x1 window with stride 1 and no pad
//! skips the im2col. `ConvTranspose` is the adjoint of `Conv` on the same
//! filter layout, so both ops and both gradients are three routines: the
//! forward product (`fwd`), its adjoint (`adj`, a GEMM then col2im) and
//! the filter gradient (`wgrad`). Images of a batch run on the kernel pool
//! (rayon) when the batch has several and the work is large enough: the
//! pool's size bounds the threads whatever the number of concurrent
//! instances calling it (see BENCHMARKS.md, "Conv (issue 15)"). One large
//! image alone hands blocks to the pool instead: NCHW forward by blocks of
//! output lines, NCHW dX and dW by blocks of input channels, NHWC forward
//! by blocks of output pixels (each block its own part of the output).
//!
//! Like the other float families, every kernel takes float32 or float64 and computes into new
//! buffers before it writes an output.
//!
//! The files: `window.rs` (the geometry, shared with pooling), `im2col.rs`,
//! `plan.rs` (the products on a batch), `winograd.rs` (F(2x2, 3x3)); this
//! one holds the ops: their schemas, argument checks and kernels.

#![allow(clippy::result_large_err, clippy::too_many_arguments)]

mod im2col;
mod plan;
pub(crate) mod window;
pub(crate) mod winograd;

use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::{array, dense, float_kernel, input, Order};
use plan::*;
use window::*;

fn geo_err(op: &str, name: &str, e: Error) -> Error {
    Error::new(e.kind, format!("{op}: {}", e.message)).with_blob(name)
}

/// The filter's (rows, per-group image channels, spatial dims).
fn split_filter(
    op: &str,
    name: &str,
    shape: &[usize],
    nd: usize,
    order: Order,
) -> Result<(usize, usize, Vec<usize>)> {
    if shape.len() != nd + 2 {
        return Err(Error::shape(format!(
            "{op}: the filter ('{name}', shape {shape:?}) must have {} dims for a {nd}-D input",
            nd + 2
        ))
        .with_blob(name));
    }
    Ok(match order {
        Order::Nchw => (shape[0], shape[1], shape[2..].to_vec()),
        Order::Nhwc => (shape[0], shape[nd + 1], shape[1..=nd].to_vec()),
    })
}

/// The plan of a Conv or ConvTranspose op from its input and filter.
struct ConvSetup {
    plan: Plan,
    n: usize,
    /// The output's shape (Y for the forward ops).
    y_shape: Vec<usize>,
    /// Channels the bias adds to.
    bias_ch: usize,
}

fn conv_setup(
    l: &Locked<'_>,
    op: &str,
    win: &Window,
    group: usize,
    transposed: Option<&[usize]>,
) -> Result<ConvSetup> {
    let (xs, ws) = (l.tensor(0)?.shape(), l.tensor(1)?.shape());
    let (xn, wn) = (l.input_name(0), l.input_name(1));
    let order = win.order;
    let (n, c, sp) = split_image(op, "X", xn, xs, order)?;
    let nd = sp.len();
    let (rows, per_group, ksp) = split_filter(op, wn, ws, nd, order)?;
    let g = win
        .geometry(&sp, Some(&ksp), transposed)
        .map_err(|e| geo_err(op, wn, e))?;
    if transposed.is_none() {
        // Conv: X has C = per_group * group channels; W has M rows.
        if c != per_group * group || rows % group != 0 {
            return Err(Error::shape(format!(
                "{op}: X ('{xn}', shape {xs:?}) has {c} channels and the filter ('{wn}', shape {ws:?}) expects {per_group} per group x group {group}, with M = {rows} divisible by group"
            ))
            .with_blob(wn));
        }
        let y_shape = image_shape(n, rows, &g.outs[3 - nd..], order);
        crate::tensor::checked_numel::<f64>(&y_shape, format_args!("{op}'s output"))?;
        Ok(ConvSetup {
            plan: Plan {
                g,
                group,
                cin: c,
                cout: rows,
                order,
                par: false,
            },
            n,
            y_shape,
            bias_ch: rows,
        })
    } else {
        // ConvTranspose: W is (C, M / group, kernel); X has the C channels.
        if rows != c || c % group != 0 {
            return Err(Error::shape(format!(
                "{op}: X ('{xn}', shape {xs:?}) has {c} channels and the filter ('{wn}', shape {ws:?}) has {rows} (they must match, divisible by group {group})"
            ))
            .with_blob(wn));
        }
        let m = per_group * group;
        let y_shape = image_shape(n, m, &g.ins[3 - nd..], order);
        crate::tensor::checked_numel::<f64>(&y_shape, format_args!("{op}'s output"))?;
        Ok(ConvSetup {
            plan: Plan {
                g,
                group,
                cin: m,
                cout: c,
                order,
                par: false,
            },
            n,
            y_shape,
            bias_ch: m,
        })
    }
}

fn check_len(op: &str, l: &Locked<'_>, i: usize, what: &str, want: usize) -> Result<()> {
    let t = l.tensor(i)?;
    if t.shape().iter().product::<usize>() != want {
        return Err(Error::shape(format!(
            "{op}: {what} ('{}', shape {:?}) must have {want} elements",
            l.input_name(i),
            t.shape()
        ))
        .with_blob(l.input_name(i)));
    }
    Ok(())
}

// --------------------------------------------------------------- kernels --

struct ConvArgs {
    win: Window,
    group: usize,
    /// ConvTranspose's `adj` per dim (None for Conv).
    adj: Option<Dims>,
    op: String,
    num_inputs: usize,
    num_outputs: usize,
}

impl ConvArgs {
    fn parse(ctx: &OpDefCtx<'_>, transposed: bool) -> Result<ConvArgs> {
        let group = ctx.args.i64("group", 1)?;
        if group < 1 {
            return Err(ctx.bad_arg(format!("group must be >= 1, got {group}")));
        }
        let adj = if transposed {
            Some(dims_arg(ctx, "adjs", "adj", &["adj_h", "adj_w"], Some(0))?)
        } else {
            None
        };
        Ok(ConvArgs {
            win: Window::parse(ctx, !transposed)?,
            group: group as usize,
            adj,
            op: ctx.op_type().to_string(),
            num_inputs: ctx.num_inputs(),
            num_outputs: ctx.num_outputs(),
        })
    }
    fn adj(&self, nd: usize) -> Result<Option<Vec<usize>>> {
        self.adj
            .as_ref()
            .map(|a| a.resolve("adjs", nd, 1, 0))
            .transpose()
            .map_err(|e| Error::new(e.kind, format!("{}: {}", self.op, e.message)))
    }
    fn setup(&self, l: &Locked<'_>) -> Result<ConvSetup> {
        let nd = l.tensor(0)?.shape().len().saturating_sub(2);
        let adj = self.adj(nd)?;
        if let Some(a) = &adj {
            let s = self
                .win
                .stride
                .resolve("strides", nd, 1, 1)
                .unwrap_or_default();
            if a.iter().zip(&s).any(|(a, s)| a >= s) {
                return Err(Error::invalid_arg(format!(
                    "{}: adj {a:?} must be smaller than the strides {s:?}",
                    self.op
                )));
            }
        }
        let mut s = conv_setup(l, &self.op, &self.win, self.group, adj.as_deref())?;
        s.plan.par = !parallel(s.n, s.plan.macs()) && crate::threads::pool_available();
        Ok(s)
    }
}

fn conv_t<T: Float>(l: &mut Locked<'_>, a: &ConvArgs) -> Result<()> {
    let op = a.op.as_str();
    let transposed = a.adj.is_some();
    let s = a.setup(l)?;
    let x = dense(input::<T>(l, op, 0)?);
    let w = dense(input::<T>(l, op, 1)?);
    let bias = if a.num_inputs == 3 {
        check_len(op, l, 2, "the bias", s.bias_ch)?;
        Some(dense(input::<T>(l, op, 2)?).into_owned())
    } else {
        None
    };
    let p = &s.plan;
    let mut y = crate::tensor::zeroed_vec::<T>(&s.y_shape, format_args!("{op}'s output"))?;
    if transposed {
        run_adj(p, s.n, &x, &w, &mut y)?;
    } else {
        run_fwd(p, s.n, &x, &w, &mut y)?;
    }
    if let Some(b) = bias {
        let sp = if transposed {
            p.g.in_len()
        } else {
            p.g.out_len()
        };
        add_bias(&mut y, &b, s.bias_ch, sp, p.order);
    }
    l.set_output(0, T::wrap(array(&s.y_shape, y)?));
    Ok(())
}

fn build_conv(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let transposed = ctx.op_type().starts_with("ConvTranspose");
    let a = ConvArgs::parse(ctx, transposed)?;
    float_kernel!(&a.op, 0, |l| conv_t(&mut l, &a))
}

fn conv_grad_t<T: Float>(l: &mut Locked<'_>, a: &ConvArgs, no_bias: bool) -> Result<()> {
    let op = a.op.as_str();
    let transposed = a.adj.is_some();
    let s = a.setup(l)?;
    let y_len: usize = s.y_shape.iter().product();
    check_len(op, l, 2, "dY", y_len)?;
    let dys = l.tensor(2)?.shape().to_vec();
    if dys != s.y_shape {
        return Err(Error::shape(format!(
            "{op}: dY ('{}', shape {dys:?}) must have the forward output's shape {:?}",
            l.input_name(2),
            s.y_shape
        ))
        .with_blob(l.input_name(2)));
    }
    let (x, w, dy) = (
        input::<T>(l, op, 0)?,
        input::<T>(l, op, 1)?,
        input::<T>(l, op, 2)?,
    );
    let (x_shape, w_shape) = (x.shape().to_vec(), w.shape().to_vec());
    let (x, w, dy) = (dense(x), dense(w), dense(dy));
    let p = &s.plan;
    // Conv: image side X, col side dY; ConvTranspose: image side dY, col side X.
    let dw = if transposed {
        weight_grad(p, s.n, &dy, &x, w.len())?
    } else {
        weight_grad(p, s.n, &x, &dy, w.len())?
    };
    let sp = if transposed {
        p.g.in_len()
    } else {
        p.g.out_len()
    };
    let db = (!no_bias)
        .then(|| channel_sums(&dy, s.bias_ch, sp, p.order))
        .transpose()?;
    let want_dx = a.num_outputs == if no_bias { 2 } else { 3 };
    let dx = if want_dx {
        let mut dx = crate::tensor::zeroed_vec::<T>(&x_shape, format_args!("{op}'s dX"))?;
        if transposed {
            run_fwd(p, s.n, &dy, &w, &mut dx)?;
        } else {
            run_adj(p, s.n, &dy, &w, &mut dx)?;
        }
        Some(array(&x_shape, dx)?)
    } else {
        None
    };
    l.set_output(0, T::wrap(array(&w_shape, dw)?));
    let mut next = 1;
    if let Some(db) = db {
        l.set_output(1, T::wrap(array(&[s.bias_ch], db)?));
        next = 2;
    }
    if let Some(dx) = dx {
        l.set_output(next, T::wrap(dx));
    }
    Ok(())
}

fn build_conv_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let transposed = ctx.op_type().starts_with("ConvTranspose");
    let a = ConvArgs::parse(ctx, transposed)?;
    let no_bias = ctx.args.i64("no_bias", 0)? != 0;
    let no = ctx.num_outputs();
    if no_bias && no > 2 {
        return Err(ctx.bad_arg(format!(
            "with no_bias the outputs are (dW[, dX]); got {no} outputs"
        )));
    }
    float_kernel!(&a.op, 0, |l| conv_grad_t(&mut l, &a, no_bias))
}

pub fn schemas() -> Vec<OpSchema> {
    let conv = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_conv)
            .inputs(2, 3)
            .outputs(1, 1)
            .args(WINDOW_ARGS)
            .ignores(CONV_IGNORED)
            .doc(doc)
    };
    let grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_conv_grad)
            .inputs(3, 3)
            .outputs(1, 3)
            .args(WINDOW_ARGS)
            .ignores(CONV_IGNORED)
            .doc(doc)
    };
    const CONV_DOC: &str = "Convolution: inputs (X, filter W[, bias b]); NCHW: X (N, C, spatial), W (M, C / group, kernel), Y (N, M, out spatial); NHWC: X (N, spatial, C), W (M, kernel, C / group); 1 to 3 spatial dims. The kernel may be left out (read from W).";
    const CONV_GRAD_DOC: &str =
        "Gradient of Conv: inputs (X, W, dY), outputs (dW, db[, dX]), or (dW[, dX]) with no_bias.";
    const CT_DOC: &str = "Transposed convolution (the adjoint of Conv): inputs (X, W[, bias]); NCHW: X (N, C, spatial), W (C, M / group, kernel), Y (N, M, (in - 1) * stride - pads + kernel + adj); NHWC: W (C, kernel, M / group).";
    const CT_GRAD_DOC: &str = "Gradient of ConvTranspose: inputs (X, W, dY), outputs (dW, db[, dX]), or (dW[, dX]) with no_bias.";
    vec![
        conv("Conv", CONV_DOC),
        conv("Conv1D", "Conv on 1 spatial dim."),
        conv("Conv2D", "Conv on 2 spatial dims."),
        conv("Conv3D", "Conv on 3 spatial dims."),
        grad("ConvGradient", CONV_GRAD_DOC),
        grad("Conv1DGradient", CONV_GRAD_DOC),
        grad("Conv2DGradient", CONV_GRAD_DOC),
        grad("Conv3DGradient", CONV_GRAD_DOC),
        conv("ConvTranspose", CT_DOC),
        grad("ConvTransposeGradient", CT_GRAD_DOC),
    ]
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;
    use crate::test_util::{f32s, get, int_arg, op, run, vals, ws_with};

    /// Window arguments whose sizes overflow are refused, naming the
    /// argument (issue 28: they wrapped, or panicked in debug builds), and
    /// a kernel read from a filter with a 0 spatial dim is a shape error.
    #[test]
    fn overflowing_windows_and_empty_kernels_are_refused() {
        let ws = ws_with(&[
            ("x", f32s(&[1, 1, 5, 5], &[1.; 25])),
            ("w", f32s(&[3, 1, 3, 3], &[1.; 27])),
            ("wt", f32s(&[1, 3, 3, 3], &[1.; 27])),
            ("w0", f32s(&[3, 1, 0, 3], &[])),
            ("w4", f32s(&[1, 1, 4, 4], &[1.; 16])),
        ]);
        let cases = [
            (
                "Conv",
                "w",
                vec![int_arg("kernel", 3), int_arg("pad", 1 << 62)],
                "`pad`/`pads`",
            ),
            (
                "Conv",
                "w",
                vec![int_arg("kernel", 3), int_arg("pad", i64::MAX)],
                "`pad`/`pads`",
            ),
            (
                "ConvTranspose",
                "wt",
                vec![int_arg("kernel", 3), int_arg("stride", 1 << 62)],
                "`stride`/`strides`",
            ),
            (
                "MaxPool",
                "",
                vec![int_arg("kernel", 1), int_arg("pad", i64::MAX)],
                "`pad`/`pads`",
            ),
            (
                "Conv",
                "w4",
                vec![int_arg("kernel", 4), int_arg("dilation", i64::MAX)],
                "`dilation`/`dilations`",
            ),
        ];
        for (ty, w, args, arg) in cases {
            let ins: Vec<&str> = if w.is_empty() {
                vec!["x"]
            } else {
                vec!["x", w]
            };
            let e = run(&ws, op(ty, &ins, &["y"], args)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{ty}: {}", e.message);
            assert!(e.message.contains(arg), "{ty}: {}", e.message);
        }
        let e = run(&ws, op("Conv", &["x", "w0"], &["y"], vec![])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape, "{}", e.message);
        assert!(e.message.contains("must all be > 0"), "{}", e.message);
    }

    #[test]
    fn conv_by_hand() {
        // X 1x1x3x3 = 1..9, W 1x1x2x2 = ones, b = 1: Y = window sums + 1.
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let ws = ws_with(&[
            ("x", f32s(&[1, 1, 3, 3], &x)),
            ("w", f32s(&[1, 1, 2, 2], &[1.; 4])),
            ("b", f32s(&[1], &[1.])),
        ]);
        run(
            &ws,
            op("Conv", &["x", "w", "b"], &["y"], vec![int_arg("kernel", 2)]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "y")), vec![13., 17., 25., 29.]);
        // pad 1, stride 2: corners of a 4x4 padded window grid.
        run(
            &ws,
            op(
                "Conv",
                &["x", "w"],
                &["y2"],
                vec![
                    int_arg("kernel", 2),
                    int_arg("pad", 1),
                    int_arg("stride", 2),
                ],
            ),
        )
        .unwrap();
        assert_eq!(get(&ws, "y2").shape(), &[1, 1, 2, 2]);
        assert_eq!(vals(&get(&ws, "y2")), vec![1., 5., 11., 28.]);
        // A kernel that does not match the filter is a shape error.
        let e = run(
            &ws,
            op("Conv", &["x", "w"], &["y3"], vec![int_arg("kernel", 3)]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Shape);
        let e = run(
            &ws,
            op("Conv", &["x", "w"], &["y3"], vec![int_arg("stride", -1)]),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    /// dX of a 2-D convolution (NCHW) by its definition: every product
    /// w[m, c, a, b] * dy[n, m, y, x] added to the input pixel its tap
    /// reads.
    #[allow(clippy::too_many_arguments)]
    fn dx_by_definition(
        n: usize,
        c: usize,
        m: usize,
        (h, w): (usize, usize),
        k: usize,
        (s, p, d, group): (usize, usize, usize, usize),
        wt: &[f64],
        dy: &[f64],
    ) -> Vec<f64> {
        let oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
        let ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
        let (cg, mg) = (c / group, m / group);
        let mut dx = vec![0.0; n * c * h * w];
        for i in 0..n {
            for mo in 0..m {
                let g = mo / mg;
                for ci in 0..cg {
                    let cc = g * cg + ci;
                    for a in 0..k {
                        for b in 0..k {
                            let wv = wt[((mo * cg + ci) * k + a) * k + b];
                            for y in 0..oh {
                                let yi = (y * s + a * d) as isize - p as isize;
                                if yi < 0 || yi >= h as isize {
                                    continue;
                                }
                                for x in 0..ow {
                                    let xi = (x * s + b * d) as isize - p as isize;
                                    if xi < 0 || xi >= w as isize {
                                        continue;
                                    }
                                    dx[((i * c + cc) * h + yi as usize) * w + xi as usize] +=
                                        wv * dy[((i * m + mo) * oh + y) * ow + x];
                                }
                            }
                        }
                    }
                }
            }
        }
        dx
    }

    /// dW of the same convolution by its definition: every product
    /// x[n, c, tap] * dy[n, m, y, x] added to the filter entry of the tap.
    #[allow(clippy::too_many_arguments)]
    fn dw_by_definition(
        n: usize,
        c: usize,
        m: usize,
        (h, w): (usize, usize),
        k: usize,
        (s, p, d, group): (usize, usize, usize, usize),
        x: &[f64],
        dy: &[f64],
    ) -> Vec<f64> {
        let oh = (h + 2 * p - d * (k - 1) - 1) / s + 1;
        let ow = (w + 2 * p - d * (k - 1) - 1) / s + 1;
        let (cg, mg) = (c / group, m / group);
        let mut dw = vec![0.0; m * cg * k * k];
        for i in 0..n {
            for mo in 0..m {
                let g = mo / mg;
                for ci in 0..cg {
                    for a in 0..k {
                        for b in 0..k {
                            let mut acc = 0.0;
                            for y in 0..oh {
                                let yi = (y * s + a * d) as isize - p as isize;
                                if yi < 0 || yi >= h as isize {
                                    continue;
                                }
                                for xo in 0..ow {
                                    let xi = (xo * s + b * d) as isize - p as isize;
                                    if xi < 0 || xi >= w as isize {
                                        continue;
                                    }
                                    acc += x[((i * c + g * cg + ci) * h + yi as usize) * w
                                        + xi as usize]
                                        * dy[((i * m + mo) * oh + y) * ow + xo];
                                }
                            }
                            dw[((mo * cg + ci) * k + a) * k + b] += acc;
                        }
                    }
                }
            }
        }
        dw
    }

    #[test]
    fn gradients_of_one_large_image_are_the_same_on_one_and_two_threads() {
        // Shapes whose single image takes the split of its channels over
        // the pool (at least 2^20 multiply-adds): several line blocks, odd
        // sizes with stride 2 and channel blocks of unequal size, groups,
        // dilation, few channels; and a batch of two (images on the pool).
        use crate::tensor::Tensor;
        for &(n, c, m, hw, k, s, p, d, group) in &[
            (1, 16, 32, (32, 32), 3, 1, 1, 1, 1),
            (1, 5, 64, (45, 37), 3, 2, 0, 1, 1),
            (1, 12, 12, (40, 40), 5, 1, 2, 1, 3),
            (1, 6, 32, (30, 30), 3, 1, 2, 2, 1),
            (1, 3, 16, (64, 64), 7, 2, 3, 1, 1),
            (2, 16, 32, (32, 32), 3, 1, 1, 1, 1),
        ] {
            let oh = (hw.0 + 2 * p - d * (k - 1) - 1) / s + 1;
            let ow = (hw.1 + 2 * p - d * (k - 1) - 1) / s + 1;
            let val = |i: usize, salt: usize| (((i * 7919 + salt) % 1009) as f64) / 504.5 - 1.0;
            let x: Vec<f64> = (0..n * c * hw.0 * hw.1).map(|i| val(i, 1)).collect();
            let x0 = x.clone();
            let w: Vec<f64> = (0..m * (c / group) * k * k).map(|i| val(i, 2)).collect();
            let dy: Vec<f64> = (0..n * m * oh * ow).map(|i| val(i, 3)).collect();
            let ws = ws_with(&[
                ("x", Tensor::from_vec(&[n, c, hw.0, hw.1], x).unwrap()),
                (
                    "w",
                    Tensor::from_vec(&[m, c / group, k, k], w.clone()).unwrap(),
                ),
                ("dy", Tensor::from_vec(&[n, m, oh, ow], dy.clone()).unwrap()),
            ]);
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (dwo, dbo, out) = (
                    format!("dw{threads}"),
                    format!("db{threads}"),
                    format!("dx{threads}"),
                );
                pool.install(|| {
                    run(
                        &ws,
                        op(
                            "ConvGradient",
                            &["x", "w", "dy"],
                            &[&dwo, &dbo, &out],
                            vec![
                                int_arg("kernel", k as i64),
                                int_arg("stride", s as i64),
                                int_arg("pad", p as i64),
                                int_arg("dilation", d as i64),
                                int_arg("group", group as i64),
                            ],
                        ),
                    )
                })
                .unwrap();
                let f = |b: &str| -> Vec<f64> {
                    get(&ws, b)
                        .array::<f64>()
                        .unwrap()
                        .iter()
                        .copied()
                        .collect()
                };
                (f(&dwo), f(&dbo), f(&out))
            };
            let (one, two) = (on(1), on(2));
            let geo = (s, p, d, group);
            let want_dx = dx_by_definition(n, c, m, hw, k, geo, &w, &dy);
            let want_dw = dw_by_definition(n, c, m, hw, k, geo, &x0, &dy);
            let sp = oh * ow;
            let want_db: Vec<f64> = (0..m)
                .map(|mo| {
                    (0..n)
                        .map(|i| {
                            dy[(i * m + mo) * sp..(i * m + mo + 1) * sp]
                                .iter()
                                .sum::<f64>()
                        })
                        .sum()
                })
                .collect();
            let case = (n, c, m, hw, k, s, p, d, group);
            // The same additions in the same order on either pool (a batch
            // sums its images' dW in the order the pool's threads finish).
            assert!(one.2 == two.2 && one.1 == two.1, "{case:?}: dX or db");
            assert!(n > 1 || one.0 == two.0, "{case:?}: dW");
            for (got, want, what) in [
                (&one.0, &want_dw, "dW"),
                (&one.1, &want_db, "db"),
                (&one.2, &want_dx, "dX"),
            ] {
                assert_eq!(got.len(), want.len(), "{case:?} {what}");
                let err = got
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(err < 1e-9, "{case:?}: {what} off by {err}");
            }
        }
    }

    #[test]
    fn nhwc_forward_of_one_large_image_is_the_same_on_one_and_two_threads() {
        // One NHWC image whose product takes the split into blocks of
        // output pixels (uneven last block, stride 2, groups), against the
        // definition: y[pixel, m] = b[m] + sum of x[tap, c] * w[m, tap, c].
        use crate::tensor::Tensor;
        for &(c, m, (h, w), k, s, p, group) in &[
            (16, 32, (33, 31), 3, 1, 1, 1),
            (5, 64, (45, 37), 3, 2, 0, 1),
            (12, 12, (40, 40), 5, 1, 2, 3),
        ] {
            let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
            let (cg, mg) = (c / group, m / group);
            let val = |i: usize, salt: usize| (((i * 7919 + salt) % 1009) as f64) / 504.5 - 1.0;
            let x: Vec<f64> = (0..h * w * c).map(|i| val(i, 1)).collect();
            let wt: Vec<f64> = (0..m * k * k * cg).map(|i| val(i, 2)).collect();
            let b: Vec<f64> = (0..m).map(|i| val(i, 3)).collect();
            let ws = ws_with(&[
                ("x", Tensor::from_vec(&[1, h, w, c], x.clone()).unwrap()),
                ("w", Tensor::from_vec(&[m, k, k, cg], wt.clone()).unwrap()),
                ("b", Tensor::from_vec(&[m], b.clone()).unwrap()),
            ]);
            let on = |threads: usize| -> Vec<f64> {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let out = format!("y{threads}");
                pool.install(|| {
                    let mut args = vec![
                        int_arg("kernel", k as i64),
                        int_arg("stride", s as i64),
                        int_arg("pad", p as i64),
                        int_arg("group", group as i64),
                    ];
                    args.push(crate::ir::Argument {
                        name: Some("order".into()),
                        s: Some(b"NHWC".to_vec()),
                        ..Default::default()
                    });
                    run(&ws, op("Conv", &["x", "w", "b"], &[&out], args))
                })
                .unwrap();
                get(&ws, &out)
                    .array::<f64>()
                    .unwrap()
                    .iter()
                    .copied()
                    .collect()
            };
            let (one, two) = (on(1), on(2));
            let case = (c, m, (h, w), k, s, p, group);
            assert!(one == two, "{case:?}");
            let mut err: f64 = 0.0;
            for (y, xo) in (0..oh).flat_map(|y| (0..ow).map(move |xo| (y, xo))) {
                for mo in 0..m {
                    let g = mo / mg;
                    let mut acc = b[mo];
                    for a in 0..k {
                        for e in 0..k {
                            let (yi, xi) = (
                                (y * s + a) as isize - p as isize,
                                (xo * s + e) as isize - p as isize,
                            );
                            if yi < 0 || xi < 0 || yi >= h as isize || xi >= w as isize {
                                continue;
                            }
                            for ci in 0..cg {
                                acc += x[(yi as usize * w + xi as usize) * c + g * cg + ci]
                                    * wt[((mo * k + a) * k + e) * cg + ci];
                            }
                        }
                    }
                    err = err.max((one[(y * ow + xo) * m + mo] - acc).abs());
                }
            }
            assert!(err < 1e-10, "{case:?}: off by {err}");
        }
    }
}
