//! FTRL-proximal: Ftrl, SparseFtrl and GFtrl (with a group lasso over
//! each input feature's column).

#![allow(clippy::result_large_err)]

use super::common::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::kernel;

pub fn schemas() -> Vec<OpSchema> {
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
    vec![
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
    ]
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
