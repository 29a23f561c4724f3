//! More of Caffe2's parameter updates (float32, as its CPU kernels): Wngrad
//! and SparseWngrad (a single accumulator per parameter), Storm and
//! SparseStorm (momentum with a cube-root adaptive rate) and DecayAdagrad
//! (Adagrad with a bias-corrected first moment and weight decay), Ftrl,
//! SparseFtrl and GFtrl (FTRL-proximal; GFtrl with a group lasso over each
//! input feature's column), and FP32MomentumSGDUpdate and
//! FP16MomentumSGDUpdate (MomentumSGDUpdate with weight decay, on float32
//! or float16 data; Caffe2 had them for CUDA only), and RowWiseCounter
//! (row-wise Adagrad's decayed count of each row's updates), and YellowFin
//! (momentum SGD tuning its own rate and momentum).
//! The sparse ones update the rows at the indices in order (a repeated
//! index updates its row twice).

#![allow(clippy::result_large_err)]

use super::kernel;
use super::optim::{
    adagrad_in_place, arr, check_like, f32_in, momentum_in_place, scalar_f32, sparse_rows, vec_of,
};
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::Tensor;

fn yf_in_place(i: usize, o: usize) -> bool {
    i == o && i < 8
}

fn first_three(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (2, 2))
}

pub fn schemas() -> Vec<OpSchema> {
    const WNGRAD_ARGS: &[crate::operator::ArgDoc] = &[arg!(
        "epsilon",
        "float",
        "1e-5",
        "added to the accumulator before dividing by it"
    )];
    const STORM_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "momentum",
            "float",
            "10",
            "the momentum scale (c in the paper)"
        ),
        arg!(
            "beta",
            "float",
            "0.1",
            "added to the gradient square sum in the rate's denominator"
        ),
    ];
    const FTRL_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "alpha",
            "float",
            "0.005",
            "the rate (> 0); or the optional last input, not both"
        ),
        arg!("beta", "float", "1", "added to sqrt(n) in the denominator"),
        arg!("lambda1", "float", "0.001", "the L1 strength"),
        arg!("lambda2", "float", "0.001", "the L2 strength"),
    ];
    const MOMENTUM_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("momentum", "float", "0", "the moment's decay"),
        arg!("nesterov", "int", "0", "use Nesterov's momentum"),
        arg!(
            "weight_decay",
            "float",
            "0",
            "grad += weight_decay * param before the step"
        ),
        arg!(
            "fp32_update",
            "int",
            "0",
            "accepted; the arithmetic is float32 either way"
        ),
    ];
    vec![
        OpSchema::new("YellowFin", build_yellowfin)
            .inputs(10, 10)
            .outputs(8, 8)
            .inplace(InPlace::Allow(yf_in_place))
            .args(&[
                arg!("beta", "float", "0.999", "the moving averages' decay"),
                arg!("curv_win_width", "int", "20", "how many recent log squared gradient norms give the curvature range (>= 1)"),
                arg!("epsilon", "float", "1e-6", "the floor of norms, curvatures and the variance"),
                arg!("nesterov", "int", "0", "use Nesterov's momentum for the step"),
                arg!("zero_debias", "bool", "true", "divide the averages by 1 - beta^iter"),
            ])
            .doc("Inputs (param, moment, lr, mu, curv_win, g_avg, g2_avg, scalars_memory, grad, iter), outputs the first eight, in place or not (float32; lr and mu [1], curv_win [curv_win_width], scalars_memory [5], iter int64 >= 1): a momentum SGD step with the current lr and mu, then the moving averages of grad, grad^2, the squared norm, the norm, the curvature range and the distance are updated and, from iteration 2 on, lr and mu move toward YellowFin's tuned values (arXiv 1706.03471)."),
        OpSchema::new("RowWiseCounter", build_row_counter)
            .inputs(4, 4)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(&[arg!("counter_halflife", "int", "-1", "iterations for a count to halve; <= 0 turns the op off")])
            .doc("Inputs (prev_iter int64, update_counter float64, indices, iter int64 [1]), outputs (prev_iter, update_counter) in place: for each index in order, counter = 1 + 2^(-max(0, iter - prev_iter) / counter_halflife) * counter and prev_iter = max(iter, prev_iter)."),
        OpSchema::new("FP32MomentumSGDUpdate", build_wd_momentum)
            .inputs(4, 4)
            .outputs(3, 3)
            .inplace(InPlace::Allow(momentum_in_place))
            .args(MOMENTUM_ARGS)
            .doc("Inputs (grad, moment, lr, param), outputs (grad, moment, param), in place or not (float32): g = grad + weight_decay * param, then MomentumSGDUpdate's rule with g (m = momentum * m + lr * g, param -= the step, grad becomes the step)."),
        OpSchema::new("FP16MomentumSGDUpdate", build_wd_momentum)
            .inputs(4, 4)
            .outputs(3, 3)
            .inplace(InPlace::Allow(momentum_in_place))
            .args(MOMENTUM_ARGS)
            .doc("FP32MomentumSGDUpdate on float16 grad, moment and param (lr float32): computed in float32, each output rounded once to float16."),
        OpSchema::new("Ftrl", build_ftrl)
            .inputs(3, 4)
            .outputs(2, 2)
            .inplace(InPlace::Allow(adagrad_in_place))
            .args(FTRL_ARGS)
            .doc("Inputs (var, n_z, grad[, alpha]), outputs (var, n_z), in place or not (float32; n_z holds (n, z) pairs, twice var's size): n' = n + g^2, sigma = (sqrt(n') - sqrt(n)) / alpha, z += g - sigma * var, var = |z| > lambda1 ? (lambda1 sign(z) - z) / ((beta + sqrt(n')) / alpha + lambda2) : 0."),
        OpSchema::new("SparseFtrl", build_ftrl)
            .inputs(4, 5)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(FTRL_ARGS)
            .doc("Inputs (var, n_z, indices, grad[, alpha]), outputs (var, n_z) in place (float32): Ftrl on the rows of var at the indices (grad has one row per index, applied in order)."),
        OpSchema::new("GFtrl", build_ftrl)
            .inputs(3, 4)
            .outputs(2, 2)
            .inplace(InPlace::Allow(adagrad_in_place))
            .args(FTRL_ARGS)
            .doc("Group-lasso FTRL: inputs (var, n_z, grad[, alpha]), outputs (var, n_z), in place or not (float32; var seen as [grad dim 0, rest]): n and z as Ftrl's; per column j with |z_j| the L2 norm of its new z and d the row count, var = |z_j| > lambda1 sqrt(d) ? z (lambda1 sqrt(d) / |z_j| - 1) / ((beta + sqrt(n')) / alpha + lambda2) : 0."),
        OpSchema::new("Wngrad", build_wngrad)
            .inputs(4, 4)
            .outputs(2, 4)
            .inplace(InPlace::Allow(adagrad_in_place))
            .args(WNGRAD_ARGS)
            .doc("Inputs (param, seq_b, grad, lr), outputs (param, seq_b[, effective_lr[, update]]), in place or not (float32; seq_b and lr of one element): effective_lr = lr / (seq_b + epsilon), update = effective_lr * grad, param += update, seq_b += sum(grad^2) / (seq_b + epsilon)."),
        OpSchema::new("SparseWngrad", build_wngrad)
            .inputs(5, 5)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(WNGRAD_ARGS)
            .doc("Inputs (param, seq_b, indices, grad, lr), outputs (param, seq_b) in place (float32): Wngrad on the rows at the indices (grad has one row per index), seq_b growing by the sum of every grad value squared over (seq_b + epsilon)."),
        OpSchema::new("Storm", build_storm)
            .inputs(5, 5)
            .outputs(3, 3)
            .inplace(InPlace::Allow(first_three))
            .args(STORM_ARGS)
            .doc("Inputs (param, moment, grad_sq_sum, grad, lr), outputs (param, moment, grad_sq_sum), in place or not (float32; grad_sq_sum and lr of one element): grad_sq_sum += sum(grad^2), nlr = lr * (beta + grad_sq_sum)^(-1/3), a = momentum * nlr^2, moment = grad + (1 - a) * (moment - grad), param += nlr * moment."),
        OpSchema::new("SparseStorm", build_storm)
            .inputs(6, 6)
            .outputs(3, 3)
            .inplace(InPlace::Enforce(first_three))
            .args(STORM_ARGS)
            .doc("Inputs (param, moment, grad_sq_sum, grad, indices, lr), outputs (param, moment, grad_sq_sum) in place (float32): Storm on the rows at the indices (grad has one row per index, in order); grad_sq_sum grows by every grad value squared."),
        OpSchema::new("DecayAdagrad", build_decay_adagrad)
            .inputs(6, 6)
            .outputs(3, 3)
            .inplace(InPlace::Allow(first_three))
            .args(&[
                arg!("beta1", "float", "0.9", "the first moment's decay"),
                arg!("beta2", "float", "0.999", "accepted and unused, as in Caffe2 (the second moment is a plain sum)"),
                arg!("epsilon", "float", "1e-5", "added to the second moment's square root"),
                arg!("weight_decay", "float", "0", "param += lr * weight_decay * param with the step"),
                arg!("bias_correction_first", "bool", "true", "divide the first moment by 1 - beta1^t"),
            ])
            .doc("Inputs (param, moment_1, moment_2, grad, lr, iter), outputs (param, moment_1, moment_2), in place or not (float32; iter int64): t = iter + 1, m1 = beta1 m1 + (1 - beta1) g, m2 += g^2, c = 1 - beta1^t (1 without bias_correction_first), param += lr * (m1 / c / (sqrt(m2) + epsilon) + weight_decay * param)."),
    ]
}

/// The int64 iteration counter of one element at input `i`.
pub(super) fn iteration(l: &Locked<'_>, op: &str, i: usize) -> Result<i64> {
    let name = l.input_name(i).to_string();
    match l.tensor(i)? {
        Tensor::I64(a) if a.len() == 1 => Ok(a.iter().copied().next().unwrap_or(0)),
        t => Err(Error::type_error(format!(
            "{op}: the iteration ('{name}') must be an int64 tensor of one element, got {} of shape {:?}",
            t.dtype(),
            t.shape()
        ))
        .with_blob(&name)),
    }
}

/// The dense gradient at input `gi`: float32 with as many elements as the
/// parameter (input 0).
fn dense_grad(l: &Locked<'_>, op: &str, gi: usize) -> Result<Vec<f32>> {
    let g = f32_in(l, op, gi, "the gradient")?;
    let n = f32_in(l, op, 0, "the parameter")?.len();
    if g.len() != n {
        return Err(Error::shape(format!(
            "{op}: the gradient ('{}', shape {:?}) must have as many elements as the parameter ('{}', {n})",
            l.input_name(gi),
            g.shape(),
            l.input_name(0)
        ))
        .with_blob(l.input_name(gi)));
    }
    Ok(crate::tensor::try_collect(
        g.iter().copied(),
        "a kernel buffer",
    )?)
}

/// Sum of squares, accumulated in float64.
fn sum_sq(g: &[f32]) -> f64 {
    g.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
}

fn build_wngrad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let eps = ctx.epsilon(1e-5)?;
    let sparse = ctx.op_type() == "SparseWngrad";
    let op = ctx.op_type().to_string();
    let n_out = ctx.num_outputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let (mut w, ws) = vec_of(&l, op, 0)?;
        let b = scalar_f32(&l, op, 1, "seq_b")?;
        let bs = f32_in(&l, op, 1, "seq_b")?.shape().to_vec();
        let (gi, li) = if sparse { (3, 4) } else { (2, 3) };
        let lr = scalar_f32(&l, op, li, "the learning rate")?;
        let denom = b + eps;
        let rate = lr / denom;
        let (g, gs) = if sparse {
            let (rows, block) = sparse_rows(&l, op, 0, 2, gi)?;
            let (g, gs) = vec_of(&l, op, gi)?;
            for (i, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    w[r * block + j] += rate * g[i * block + j];
                }
            }
            (g, gs)
        } else {
            let g = dense_grad(&l, op, gi)?;
            let gs = l.tensor(gi)?.shape().to_vec();
            for (wk, gk) in w.iter_mut().zip(&g) {
                *wk += rate * gk;
            }
            (g, gs)
        };
        let nb = b + (sum_sq(&g) / f64::from(denom)) as f32;
        l.set_output(0, arr(&ws, w)?);
        l.set_output(1, arr(&bs, vec![nb])?);
        if n_out > 2 {
            l.set_output(2, arr(&bs, vec![rate])?);
        }
        if n_out > 3 {
            l.set_output(
                3,
                arr(
                    &gs,
                    crate::tensor::try_collect(g.iter().map(|v| rate * v), "a kernel buffer")?,
                )?,
            );
        }
        Ok(true)
    }))
}

fn build_storm(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let momentum = ctx.args.f32("momentum", 10.0)?;
    let beta = ctx.args.f32("beta", 0.1)?;
    let sparse = ctx.op_type() == "SparseStorm";
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let (mut w, ws) = vec_of(&l, op, 0)?;
        f32_in(&l, op, 1, "the moment")?;
        check_like(&l, op, 1, 0)?;
        let (mut m, _) = vec_of(&l, op, 1)?;
        let s = scalar_f32(&l, op, 2, "grad_sq_sum")?;
        let ss = f32_in(&l, op, 2, "grad_sq_sum")?.shape().to_vec();
        let li = if sparse { 5 } else { 4 };
        let lr = scalar_f32(&l, op, li, "the learning rate")?;
        let (rows, block, g) = if sparse {
            let (rows, block) = sparse_rows(&l, op, 0, 4, 3)?;
            (rows, block, vec_of(&l, op, 3)?.0)
        } else {
            let g = dense_grad(&l, op, 3)?;
            (
                crate::tensor::try_collect(0..w.len(), "a kernel buffer")?,
                1,
                g,
            )
        };
        let ns = s + sum_sq(&g) as f32;
        let nlr = (f64::from(lr) * (f64::from(beta) + f64::from(ns)).powf(-1.0 / 3.0)) as f32;
        let a = momentum * nlr * nlr;
        for (i, &r) in rows.iter().enumerate() {
            for j in 0..block {
                let (k, gv) = (r * block + j, g[i * block + j]);
                m[k] = gv + (1.0 - a) * (m[k] - gv);
                w[k] += nlr * m[k];
            }
        }
        l.set_output(0, arr(&ws, w)?);
        l.set_output(1, arr(&ws, m)?);
        l.set_output(2, arr(&ss, vec![ns])?);
        Ok(true)
    }))
}

fn build_decay_adagrad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "DecayAdagrad";
    let b1 = ctx.args.f32("beta1", 0.9)?;
    ctx.args.f32("beta2", 0.999)?;
    let eps = ctx.epsilon(1e-5)?;
    let wd = ctx.args.f32("weight_decay", 0.0)?;
    let corr_first = ctx.args.bool("bias_correction_first", true)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let (mut w, ws) = vec_of(&l, OP, 0)?;
        f32_in(&l, OP, 1, "moment_1")?;
        f32_in(&l, OP, 2, "moment_2")?;
        check_like(&l, OP, 1, 0)?;
        check_like(&l, OP, 2, 0)?;
        let g = dense_grad(&l, OP, 3)?;
        let lr = scalar_f32(&l, OP, 4, "the learning rate")?;
        let t = iteration(&l, OP, 5)? + 1;
        let c = if corr_first {
            (1.0 - f64::from(b1).powf(t as f64)) as f32
        } else {
            1.0
        };
        let (mut m1, _) = vec_of(&l, OP, 1)?;
        let (mut m2, _) = vec_of(&l, OP, 2)?;
        for k in 0..w.len() {
            m1[k] = b1 * m1[k] + (1.0 - b1) * g[k];
            m2[k] += g[k] * g[k];
            w[k] += lr * (m1[k] / c / (m2[k].sqrt() + eps) + wd * w[k]);
        }
        l.set_output(0, arr(&ws, w)?);
        l.set_output(1, arr(&ws, m1)?);
        l.set_output(2, arr(&ws, m2)?);
        Ok(true)
    }))
}

/// FTRL's hyper-parameters, alpha already inverted.
#[derive(Clone, Copy)]
struct Ftrl {
    alpha_inv: f32,
    beta: f32,
    lambda1: f32,
    lambda2: f32,
}

impl Ftrl {
    /// The new (n, z) of one coordinate.
    #[inline]
    fn nz(&self, w: f32, n: f32, z: f32, g: f32) -> (f32, f32) {
        let nn = n + g * g;
        let sigma = (nn.sqrt() - n.sqrt()) * self.alpha_inv;
        (nn, z + g - sigma * w)
    }

    #[inline]
    fn denom(&self, nn: f32) -> f32 {
        (self.beta + nn.sqrt()) * self.alpha_inv + self.lambda2
    }

    /// One coordinate's step: new (w, n, z).
    #[inline]
    fn step(&self, w: f32, n: f32, z: f32, g: f32) -> (f32, f32, f32) {
        let (nn, nz) = self.nz(w, n, z, g);
        let nw = if nz.abs() > self.lambda1 {
            (self.lambda1 * nz.signum() - nz) / self.denom(nn)
        } else {
            0.0
        };
        (nw, nn, nz)
    }
}

fn build_ftrl(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    let sparse = op == "SparseFtrl";
    let group = op == "GFtrl";
    let alpha_at = if sparse { 4 } else { 3 };
    let alpha_input = ctx.num_inputs() > alpha_at;
    if alpha_input && ctx.args.has("alpha") {
        return Err(ctx.bad_arg("Cannot specify alpha by both input and argument".to_string()));
    }
    let alpha = ctx.args.f32("alpha", 0.005)?;
    if !(alpha > 0.0) {
        return Err(ctx.bad_arg(format!("alpha must be > 0, got {alpha}")));
    }
    let base = Ftrl {
        alpha_inv: 1.0 / alpha,
        beta: ctx.args.f32("beta", 1.0)?,
        lambda1: ctx.args.f32("lambda1", 0.001)?,
        lambda2: ctx.args.f32("lambda2", 0.001)?,
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let mut p = base;
        if alpha_input {
            let a = scalar_f32(&l, op, alpha_at, "alpha")?;
            if !(a > 0.0) {
                return Err(Error::invalid_arg(format!(
                    "{op}: alpha ('{}') must be > 0, got {a}",
                    l.input_name(alpha_at)
                ))
                .with_blob(l.input_name(alpha_at)));
            }
            p.alpha_inv = 1.0 / a;
        }
        let (mut w, ws) = vec_of(&l, op, 0)?;
        let (mut nz, nzs) = vec_of(&l, op, 1)?;
        if nz.len() != 2 * w.len() {
            return Err(Error::shape(format!(
                "{op}: n_z ('{}', shape {nzs:?}) must hold two values per element of var ('{}', shape {ws:?})",
                l.input_name(1),
                l.input_name(0)
            ))
            .with_blob(l.input_name(1)));
        }
        let gi = if sparse { 3 } else { 2 };
        if sparse {
            let (rows, block) = sparse_rows(&l, op, 0, 2, gi)?;
            let (g, _) = vec_of(&l, op, gi)?;
            for (i, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    let k = r * block + j;
                    let (a, b, c) = p.step(w[k], nz[2 * k], nz[2 * k + 1], g[i * block + j]);
                    (w[k], nz[2 * k], nz[2 * k + 1]) = (a, b, c);
                }
            }
        } else if group {
            let g = dense_grad(&l, op, gi)?;
            let gshape = l.tensor(gi)?.shape().to_vec();
            let rows = gshape.first().copied().unwrap_or(1);
            let cols = if rows == 0 { 0 } else { g.len() / rows };
            let thresh = p.lambda1 * (rows as f32).sqrt();
            for j in 0..cols {
                let ks: Vec<usize> =
                    crate::tensor::try_collect((0..rows).map(|i| i * cols + j), "a kernel buffer")?;
                let news: Vec<(f32, f32)> = ks
                    .iter()
                    .map(|&k| p.nz(w[k], nz[2 * k], nz[2 * k + 1], g[k]))
                    .collect();
                let norm = news
                    .iter()
                    .map(|&(_, z)| f64::from(z) * f64::from(z))
                    .sum::<f64>()
                    .sqrt() as f32;
                for (&k, &(nn, z)) in ks.iter().zip(&news) {
                    w[k] = if norm > thresh {
                        z * (thresh / norm - 1.0) / p.denom(nn)
                    } else {
                        0.0
                    };
                    nz[2 * k] = nn;
                    nz[2 * k + 1] = z;
                }
            }
        } else {
            let g = dense_grad(&l, op, gi)?;
            for k in 0..w.len() {
                let (a, b, c) = p.step(w[k], nz[2 * k], nz[2 * k + 1], g[k]);
                (w[k], nz[2 * k], nz[2 * k + 1]) = (a, b, c);
            }
        }
        l.set_output(0, arr(&ws, w)?);
        l.set_output(1, arr(&nzs, nz)?);
        Ok(true)
    }))
}

/// Input `i` as float32 values: float32 data, or (for the float16 op)
/// float16 data widened.
fn values(
    l: &Locked<'_>,
    op: &str,
    i: usize,
    half: bool,
    what: &str,
) -> Result<(Vec<f32>, Vec<usize>)> {
    if !half {
        f32_in(l, op, i, what)?;
        return vec_of(l, op, i);
    }
    match l.tensor(i)? {
        Tensor::F16(a) => Ok((
            crate::tensor::try_collect(a.iter().map(|v| v.to_f32()), "a kernel buffer")?,
            a.shape().to_vec(),
        )),
        t => Err(Error::type_error(format!(
            "{op}: {what} ('{}') must be a float16 tensor, got {}",
            l.input_name(i),
            t.dtype()
        ))
        .with_blob(l.input_name(i))),
    }
}

fn out(shape: &[usize], v: Vec<f32>, half: bool) -> Result<Tensor> {
    if !half {
        return arr(shape, v);
    }
    let h: Vec<crate::tensor::f16> = crate::tensor::try_collect(
        v.into_iter().map(crate::tensor::f16::from_f32),
        "a kernel buffer",
    )?;
    ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), h)
        .map(Tensor::from)
        .map_err(|e| Error::internal(e.to_string()))
}

fn build_wd_momentum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let half = ctx.op_type() == "FP16MomentumSGDUpdate";
    let op = ctx.op_type().to_string();
    let mu = ctx.args.f32("momentum", 0.0)?;
    let nesterov = ctx.args.i64("nesterov", 0)? != 0;
    let wd = ctx.args.f32("weight_decay", 0.0)?;
    ctx.args.i64("fp32_update", 0)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        // The element checks name the blobs in input order.
        let (mut g, gs) = values(&l, op, 0, half, "the gradient")?;
        let (mut m, ms) = values(&l, op, 1, half, "the moment")?;
        let (mut p, ps) = values(&l, op, 3, half, "the parameter")?;
        for (i, n) in [(1, m.len()), (3, p.len())] {
            if n != g.len() {
                return Err(Error::shape(format!(
                    "{op}: '{}' ({n} elements) must have as many elements as the gradient '{}' ({})",
                    l.input_name(i),
                    l.input_name(0),
                    g.len()
                ))
                .with_blob(l.input_name(i)));
            }
        }
        let lr = scalar_f32(&l, op, 2, "the learning rate")?;
        for k in 0..g.len() {
            let gk = g[k] + wd * p[k];
            let old = m[k];
            let new = mu * old + lr * gk;
            m[k] = new;
            let step = if nesterov {
                (1.0 + mu) * new - mu * old
            } else {
                new
            };
            g[k] = step;
            p[k] -= step;
        }
        l.set_output(0, out(&gs, g, half)?);
        l.set_output(1, out(&ms, m, half)?);
        l.set_output(2, out(&ps, p, half)?);
        Ok(true)
    }))
}

fn build_row_counter(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "RowWiseCounter";
    let halflife = ctx.args.i64("counter_halflife", -1)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let prev = match l.tensor(0)? {
            Tensor::I64(a) => a.clone(),
            t => {
                return Err(Error::type_error(format!(
                    "{OP}: prev_iter ('{}') must be an int64 tensor, got {}",
                    l.input_name(0),
                    t.dtype()
                ))
                .with_blob(l.input_name(0)))
            }
        };
        let counter = match l.tensor(1)? {
            Tensor::F64(a) => a.clone(),
            t => {
                return Err(Error::type_error(format!(
                    "{OP}: update_counter ('{}') must be a float64 tensor, got {}",
                    l.input_name(1),
                    t.dtype()
                ))
                .with_blob(l.input_name(1)))
            }
        };
        if prev.len() != counter.len() {
            return Err(Error::shape(format!(
                "{OP}: prev_iter ('{}', {} elements) and update_counter ('{}', {} elements) must have as many elements",
                l.input_name(0),
                prev.len(),
                l.input_name(1),
                counter.len()
            ))
            .with_blob(l.input_name(1)));
        }
        let now = iteration(&l, OP, 3)?;
        let (idx, _) = super::sparse::indices(&l, OP, 2)?;
        let rows = super::sparse::checked_rows(OP, &idx, counter.len(), false, l.input_name(2))?;
        let (ps, cs) = (prev.shape().to_vec(), counter.shape().to_vec());
        let mut pv: Vec<i64> = crate::tensor::try_collect(prev.iter().copied(), "a kernel buffer")?;
        let mut cv: Vec<f64> =
            crate::tensor::try_collect(counter.iter().copied(), "a kernel buffer")?;
        if halflife > 0 {
            let rate = std::f64::consts::LN_2 / halflife as f64;
            for r in rows {
                let delta = now.saturating_sub(pv[r]).max(0);
                cv[r] = 1.0 + (-(delta as f64) * rate).exp() * cv[r];
                pv[r] = pv[r].max(now);
            }
        }
        let pa = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&ps), pv)
            .map_err(|e| Error::internal(e.to_string()))?;
        let ca = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&cs), cv)
            .map_err(|e| Error::internal(e.to_string()))?;
        l.set_output(0, Tensor::from(pa));
        l.set_output(1, Tensor::from(ca));
        Ok(true)
    }))
}

fn build_yellowfin(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "YellowFin";
    let beta = f64::from(ctx.args.f32("beta", 0.999)?);
    let width = ctx.args.i64("curv_win_width", 20)?;
    let eps = f64::from(ctx.epsilon(1e-6)?);
    let nesterov = ctx.args.i64("nesterov", 0)? != 0;
    let zero_debias = ctx.args.bool("zero_debias", true)?;
    if width < 1 {
        return Err(ctx.bad_arg(format!("curv_win_width must be >= 1, got {width}")));
    }
    let width = width as usize;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let names = [
            "the parameter",
            "the moment",
            "lr",
            "mu",
            "curv_win",
            "g_avg",
            "g2_avg",
            "scalars_memory",
            "the gradient",
        ];
        for (i, what) in names.iter().enumerate() {
            f32_in(&l, OP, i, what)?;
        }
        for i in [1, 5, 6, 8] {
            check_like(&l, OP, i, 0)?;
        }
        let lr_in = f64::from(scalar_f32(&l, OP, 2, "lr")?);
        let mu_in = f64::from(scalar_f32(&l, OP, 3, "mu")?);
        for (i, n) in [(4, width), (7, 5)] {
            let a = f32_in(&l, OP, i, names[i])?;
            if a.len() != n {
                return Err(Error::shape(format!(
                    "{OP}: {} ('{}', shape {:?}) must have {n} elements",
                    names[i],
                    l.input_name(i),
                    a.shape()
                ))
                .with_blob(l.input_name(i)));
            }
        }
        let iter = iteration(&l, OP, 9)?;
        if iter < 1 {
            return Err(Error::invalid_arg(format!(
                "{OP}: the iteration ('{}') must be >= 1 (the net's Iter runs first), got {iter}",
                l.input_name(9)
            ))
            .with_blob(l.input_name(9)));
        }
        let (mut w, ws) = vec_of(&l, OP, 0)?;
        let (mut m, _) = vec_of(&l, OP, 1)?;
        let (curv_in, cs) = vec_of(&l, OP, 4)?;
        let (mut g_avg, _) = vec_of(&l, OP, 5)?;
        let (mut g2_avg, _) = vec_of(&l, OP, 6)?;
        let (mem_in, mems) = vec_of(&l, OP, 7)?;
        let (g, _) = vec_of(&l, OP, 8)?;
        let lrs = l.tensor(2)?.shape().to_vec();
        let mus = l.tensor(3)?.shape().to_vec();

        // The step, with the rate and momentum tuned so far.
        for k in 0..w.len() {
            let old = f64::from(m[k]);
            let new = mu_in * old + lr_in * f64::from(g[k]);
            m[k] = new as f32;
            let step = if nesterov {
                (1.0 + mu_in) * new - mu_in * old
            } else {
                new
            };
            w[k] = (f64::from(w[k]) - step) as f32;
        }

        // The moving averages (`avg` updated, its debiased value returned).
        let debias = if zero_debias {
            1.0 / (1.0 - beta.powf(iter as f64))
        } else {
            1.0
        };
        let ma = |avg: &mut f64, x: f64| {
            *avg = beta * *avg + (1.0 - beta) * x;
            debias * *avg
        };
        let mut g_deb_sq = 0.0;
        let mut norm2 = 0.0;
        for k in 0..g.len() {
            let gk = f64::from(g[k]);
            let mut a = f64::from(g_avg[k]);
            let d = ma(&mut a, gk);
            g_avg[k] = a as f32;
            g_deb_sq += d * d;
            let mut b = f64::from(g2_avg[k]);
            ma(&mut b, gk * gk);
            g2_avg[k] = b as f32;
            norm2 += gk * gk;
        }
        let norm2 = norm2.max(eps);
        let mut mem: Vec<f64> =
            crate::tensor::try_collect(mem_in.iter().map(|&v| f64::from(v)), "a kernel buffer")?;
        let norm2_deb = ma(&mut mem[1], norm2);
        ma(&mut mem[0], norm2.sqrt());
        let mut curv = curv_in.clone();
        curv[(iter as usize - 1) % width] = norm2.ln() as f32;
        let valid = width.min(iter as usize);
        let lo = curv[..valid].iter().copied().fold(f32::INFINITY, f32::min);
        let hi = curv[..valid]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let min_deb = ma(&mut mem[2], f64::from(lo)).exp().max(eps);
        let max_deb = ma(&mut mem[3], f64::from(hi)).exp().max(eps);
        let variance = (norm2_deb - g_deb_sq).max(eps);
        let distance = mem[0] / mem[1];
        let distance_deb = ma(&mut mem[4], distance);
        let (mut lr_avg, mut mu_avg) = (lr_in, mu_in);
        if iter > 1 {
            // The cubic's real root gives the momentum; the curvature range bounds it.
            let ratio = (max_deb / min_deb).sqrt();
            let mu_limit = (ratio - 1.0) / (ratio + 1.0);
            let pre = distance_deb * min_deb;
            let p = pre * pre / (2.0 * variance);
            let w3 = (-(p * p + 4.0 / 27.0 * p * p * p).sqrt() - p) / 2.0;
            let wr = w3.signum() * w3.abs().cbrt();
            let root = wr - p / 3.0 / wr + 1.0;
            let mu = (root * root).max(mu_limit * mu_limit);
            let lr = (1.0 - mu.sqrt()).powi(2) / min_deb;
            ma(&mut mu_avg, mu);
            ma(&mut lr_avg, lr);
        }
        l.set_output(0, arr(&ws, w)?);
        l.set_output(1, arr(&ws, m)?);
        l.set_output(2, arr(&lrs, vec![lr_avg as f32])?);
        l.set_output(3, arr(&mus, vec![mu_avg as f32])?);
        l.set_output(4, arr(&cs, curv)?);
        l.set_output(5, arr(&ws, g_avg)?);
        l.set_output(6, arr(&ws, g2_avg)?);
        l.set_output(
            7,
            arr(
                &mems,
                crate::tensor::try_collect(mem.into_iter().map(|v| v as f32), "a kernel buffer")?,
            )?,
        );
        Ok(true)
    }))
}
