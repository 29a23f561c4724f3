//! More of Caffe2's parameter updates (float32, as its CPU kernels): Wngrad
//! and SparseWngrad (a single accumulator per parameter), Storm and
//! SparseStorm (momentum with a cube-root adaptive rate) and DecayAdagrad
//! (Adagrad with a bias-corrected first moment and weight decay).
//! The sparse ones update the rows at the indices in order (a repeated
//! index updates its row twice).

#![allow(clippy::result_large_err)]

use super::kernel;
use super::optim::{arr, check_like, f32_in, scalar_f32, sparse_rows, vec_of};
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::Tensor;

fn first_two(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1))
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
    vec![
        OpSchema::new("Wngrad", build_wngrad)
            .inputs(4, 4)
            .outputs(2, 4)
            .inplace(InPlace::Allow(first_two))
            .args(WNGRAD_ARGS)
            .doc("Inputs (param, seq_b, grad, lr), outputs (param, seq_b[, effective_lr[, update]]), in place or not (float32; seq_b and lr of one element): effective_lr = lr / (seq_b + epsilon), update = effective_lr * grad, param += update, seq_b += sum(grad^2) / (seq_b + epsilon)."),
        OpSchema::new("SparseWngrad", build_wngrad)
            .inputs(5, 5)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(first_two))
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
    Ok(g.iter().copied().collect())
}

/// Sum of squares, accumulated in float64.
fn sum_sq(g: &[f32]) -> f64 {
    g.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
}

fn build_wngrad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let eps = ctx.args.f32("epsilon", 1e-5)?;
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
            l.set_output(3, arr(&gs, g.iter().map(|v| rate * v).collect())?);
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
            ((0..w.len()).collect(), 1, g)
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
    let eps = ctx.args.f32("epsilon", 1e-5)?;
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
