//! The other adaptive rates: RmsProp, Adadelta and SparseAdadelta, Wngrad
//! and SparseWngrad (a single accumulator per parameter), Storm and
//! SparseStorm (momentum with a cube-root adaptive rate).

#![allow(clippy::result_large_err)]

use super::common::*;
use crate::arg;
use crate::error::Result;
use crate::operator::{InPlace, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::f32_in;
use crate::ops::kit::kernel;
use crate::tensor::Tensor;

pub fn schemas() -> Vec<OpSchema> {
    const ADADELTA_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("epsilon", "float", "1e-5", "added inside both square roots"),
        arg!("decay", "float", "0.95", "the moments' decay, in (0, 1)"),
    ];
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
        OpSchema::new("RmsProp", build_rmsprop)
            .inputs(4, 4)
            .outputs(3, 3)
            .inplace(InPlace::Allow(adam_in_place))
            .args(&[
                arg!("decay", "float", "0.9", "the mean square's decay"),
                arg!("momentum", "float", "0", "the moment's decay"),
                arg!("epsilon", "float", "1e-5", "added to the mean square before its square root"),
            ])
            .doc("Inputs (grad, mean_squares, mom, lr), outputs (grad_o, mean_squares_o, mom_o), in place or not (float32): ms = ms + (1 - decay) * (grad^2 - ms), mom = momentum * mom + lr * grad / sqrt(epsilon + ms), grad_o = mom. No gradient."),
        OpSchema::new("Adadelta", build_adadelta)
            .inputs(5, 5)
            .outputs(3, 3)
            .inplace(InPlace::Allow(adam_in_place))
            .args(ADADELTA_ARGS)
            .doc("Inputs (param, moment, moment_delta, grad, lr), outputs (param, moment, moment_delta), in place or not (float32): moment = decay * moment + (1 - decay) * g^2, step = sqrt(moment_delta + epsilon) / sqrt(moment + epsilon) * g, param += lr * step, moment_delta = decay * moment_delta + (1 - decay) * step^2."),
        OpSchema::new("SparseAdadelta", build_adadelta)
            .inputs(6, 6)
            .outputs(3, 3)
            .inplace(InPlace::Enforce(adam_in_place))
            .args(ADADELTA_ARGS)
            .doc("Inputs (param, moment, moment_delta, indices, grad, lr), outputs (param, moment, moment_delta) in place (float32): Adadelta on the rows at the indices (grad has one row per index, applied in order)."),
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
    ]
}

fn build_rmsprop(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "RmsProp";
    let decay = ctx.args.f32("decay", 0.9)?;
    let momentum = ctx.args.f32("momentum", 0.0)?;
    let eps = ctx.epsilon(1e-5)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        f32_in(&l, OP, 0, "the gradient")?;
        f32_in(&l, OP, 1, "the mean squares")?;
        f32_in(&l, OP, 2, "the moment")?;
        check_like(&l, OP, 1, 0)?;
        check_like(&l, OP, 2, 0)?;
        let lr = scalar_f32(&l, OP, 3, "the learning rate")?;
        let g = f32_in(&l, OP, 0, "")?;
        let mut ms = f32_in(&l, OP, 1, "")?.clone();
        let mut mom = f32_in(&l, OP, 2, "")?.clone();
        ndarray::Zip::from(&mut ms)
            .and(&mut mom)
            .and(g)
            .for_each(|ms, mom, &gi| {
                *ms += (1.0 - decay) * (gi * gi - *ms);
                *mom = momentum * *mom + lr * gi / (eps + *ms).sqrt();
            });
        l.set_output(0, Tensor::from(mom.clone()));
        l.set_output(1, Tensor::from(ms));
        l.set_output(2, Tensor::from(mom));
        Ok(true)
    }))
}

/// One Adadelta step of element `(w, h, d)` with gradient `g`.
#[inline]
fn adadelta_step(w: &mut f32, h: &mut f32, d: &mut f32, g: f32, lr: f32, eps: f32, decay: f32) {
    *h = decay * *h + (1.0 - decay) * g * g;
    let step = ((*d + eps).sqrt() / (*h + eps).sqrt()) * g;
    *w += lr * step;
    *d = decay * *d + (1.0 - decay) * step * step;
}

fn build_adadelta(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let eps = ctx.epsilon(1e-5)?;
    let decay = ctx.args.f32("decay", 0.95)?;
    if !(decay > 0.0 && decay < 1.0) {
        return Err(ctx.bad_arg(format!("decay must be in (0, 1), got {decay}")));
    }
    let sparse = ctx.op_type() == "SparseAdadelta";
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        f32_in(&l, op, 0, "the parameter")?;
        f32_in(&l, op, 1, "the moment")?;
        f32_in(&l, op, 2, "the moment delta")?;
        check_like(&l, op, 1, 0)?;
        check_like(&l, op, 2, 0)?;
        let (gi, li) = if sparse { (4, 5) } else { (3, 4) };
        let lr = scalar_f32(&l, op, li, "the learning rate")?;
        let (mut w, shape) = vec_of(&l, op, 0)?;
        let (mut h, _) = vec_of(&l, op, 1)?;
        let (mut d, _) = vec_of(&l, op, 2)?;
        if sparse {
            let (rows, block) = sparse_rows(&l, op, 0, 3, gi)?;
            let (g, _) = vec_of(&l, op, gi)?;
            for (i, &r) in rows.iter().enumerate() {
                for j in 0..block {
                    let k = r * block + j;
                    adadelta_step(
                        &mut w[k],
                        &mut h[k],
                        &mut d[k],
                        g[i * block + j],
                        lr,
                        eps,
                        decay,
                    );
                }
            }
        } else {
            f32_in(&l, op, gi, "the gradient")?;
            check_like(&l, op, gi, 0)?;
            let (g, _) = vec_of(&l, op, gi)?;
            for k in 0..w.len() {
                adadelta_step(&mut w[k], &mut h[k], &mut d[k], g[k], lr, eps, decay);
            }
        }
        l.set_output(0, arr(&shape, w)?);
        l.set_output(1, arr(&shape, h)?);
        l.set_output(2, arr(&shape, d)?);
        Ok(true)
    }))
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
