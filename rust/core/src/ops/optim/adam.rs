//! Adam and its sparse forms SparseAdam and RowWiseSparseAdam (rows at
//! the indices, in order), with RAdam's rectification.

#![allow(clippy::result_large_err)]

use super::common::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::f32_in;
use crate::ops::kit::kernel;
use crate::tensor::Tensor;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("Adam", build_adam)
            .inputs(6, 6)
            .outputs(3, 4)
            .inplace(InPlace::Allow(adam_in_place))
            .args(ADAM_ARGS)
            .doc("Inputs (param, moment_1, moment_2, grad, lr, iter), outputs (param, moment_1, moment_2[, the effective gradient]), in place or not: t = iter + 1, m1 = b1 m1 + (1 - b1) g, m2 = b2 m2 + (1 - b2) g^2, param += lr * sqrt(1 - b2^t) / (1 - b1^t) * m1 / (sqrt(m2) + epsilon). With enableRAdam, the step is rectified: times r_t while rho_t >= 5, else m1 / (1 - b1^t)."),
        OpSchema::new("SparseAdam", build_sparse_adam)
            .inputs(7, 7)
            .outputs(3, 4)
            .inplace(InPlace::Enforce(adam_in_place))
            .args(ADAM_ARGS)
            .doc("Inputs (param, moment_1, moment_2, indices, grad, lr, iter), outputs (param, moment_1, moment_2[, the effective gradient]) in place (float32): Adam (or RAdam with enableRAdam) on the rows at the indices (grad has one row per index, in order)."),
        OpSchema::new("RowWiseSparseAdam", build_sparse_adam)
            .inputs(7, 7)
            .outputs(3, 4)
            .inplace(InPlace::Enforce(adam_in_place))
            .args(&ADAM_ARGS[..3])
            .doc("Inputs (param, moment_1, moment_2, indices, grad, lr, iter), outputs (param, moment_1, moment_2[, the effective gradient]) in place (float32): SparseAdam with one second moment per row of param (moment_2 of param's dim 0 elements), fed the mean of the row's squared gradient."),
    ]
}

const RADAM_ARG: crate::operator::ArgDoc = arg!(
    "enableRAdam",
    "bool",
    "false",
    "rectified Adam: the step times r_t while rho_t >= 5, else the bias-corrected first moment"
);

/// Adam's, SparseAdam's and (without `enableRAdam`) RowWiseSparseAdam's
/// arguments.
const ADAM_ARGS: &[crate::operator::ArgDoc] = &[
    arg!("beta1", "float", "0.9", "first moment decay"),
    arg!("beta2", "float", "0.999", "second moment decay"),
    arg!(
        "epsilon",
        "float",
        "1e-5",
        "added to the second moment's square root"
    ),
    RADAM_ARG,
];

/// Adam's step for a given iteration: `step(m1, m2)` is what `lr`
/// multiplies, with RAdam's rectification when enabled.
#[derive(Clone, Copy)]
pub(super) struct AdamStep {
    /// Multiplies m1 / (sqrt(m2) + epsilon); None: the step is `first * m1`.
    scale: Option<f32>,
    first: f32,
    eps: f32,
}

impl AdamStep {
    pub(super) fn new(b1: f32, b2: f32, eps: f32, iter: i64, radam: bool) -> AdamStep {
        let t = (iter + 1) as f64;
        let (b1, b2) = (f64::from(b1), f64::from(b2));
        let first = 1.0 / (1.0 - b1.powf(t));
        let corr = (1.0 - b2.powf(t)).sqrt() * first;
        let scale = if radam {
            let rho_inf = 2.0 / (1.0 - b2) - 1.0;
            let rho_t = rho_inf - 2.0 * t * b2.powf(t) / (1.0 - b2.powf(t));
            if rho_t >= 5.0 {
                let r_t = ((rho_t - 4.0) * (rho_t - 2.0) / rho_t).sqrt()
                    * (rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0))).sqrt();
                Some((r_t * corr) as f32)
            } else {
                None
            }
        } else {
            Some(corr as f32)
        };
        AdamStep {
            scale,
            first: first as f32,
            eps,
        }
    }

    #[inline]
    pub(super) fn step(&self, m1: f32, m2: f32) -> f32 {
        match self.scale {
            Some(c) => c * m1 / (m2.sqrt() + self.eps),
            None => self.first * m1,
        }
    }
}
fn build_adam(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let b1 = ctx.args.f32("beta1", 0.9)?;
    let b2 = ctx.args.f32("beta2", 0.999)?;
    let eps = ctx.epsilon(1e-5)?;
    let radam = ctx.args.bool("enableRAdam", false)?;
    let out_grad = ctx.num_outputs() == 4;
    const OP: &str = "Adam";
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        f32_in(&l, OP, 0, "the parameter")?;
        f32_in(&l, OP, 1, "moment_1")?;
        f32_in(&l, OP, 2, "moment_2")?;
        f32_in(&l, OP, 3, "the gradient")?;
        for i in 1..4 {
            check_like(&l, OP, i, 0)?;
        }
        let lr = scalar_f32(&l, OP, 4, "the learning rate")?;
        let iter = iteration(&l, OP, 5)?;
        let rule = AdamStep::new(b1, b2, eps, iter, radam);
        let (mut np, mut m1, mut m2) = (
            f32_in(&l, OP, 0, "")?.clone(),
            f32_in(&l, OP, 1, "")?.clone(),
            f32_in(&l, OP, 2, "")?.clone(),
        );
        let g = f32_in(&l, OP, 3, "")?;
        let mut ng = g.clone();
        ndarray::Zip::from(&mut np)
            .and(&mut m1)
            .and(&mut m2)
            .and(&mut ng)
            .for_each(|p, a, b, g| {
                let gv = *g;
                *a = *a * b1 + gv * (1.0 - b1);
                *b = *b * b2 + gv * gv * (1.0 - b2);
                let step = rule.step(*a, *b);
                *p += lr * step;
                *g = step;
            });
        l.set_output(0, Tensor::from(np));
        l.set_output(1, Tensor::from(m1));
        l.set_output(2, Tensor::from(m2));
        if out_grad {
            l.set_output(3, Tensor::from(ng));
        }
        Ok(true)
    }))
}

fn build_sparse_adam(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let b1 = ctx.args.f32("beta1", 0.9)?;
    let b2 = ctx.args.f32("beta2", 0.999)?;
    let eps = ctx.epsilon(1e-5)?;
    let row_wise = ctx.op_type() == "RowWiseSparseAdam";
    let radam = !row_wise && ctx.args.bool("enableRAdam", false)?;
    let out_grad = ctx.num_outputs() == 4;
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let (rows, block) = sparse_rows(&l, op, 0, 3, 4)?;
        f32_in(&l, op, 1, "moment_1")?;
        check_like(&l, op, 1, 0)?;
        let m2_in = f32_in(&l, op, 2, "moment_2")?;
        if row_wise {
            let n = l.tensor(0)?.shape()[0];
            if m2_in.len() != n {
                return Err(Error::shape(format!(
                    "{op}: moment_2 ('{}', shape {:?}) must hold one value per row of the parameter ({n})",
                    l.input_name(2),
                    m2_in.shape()
                ))
                .with_blob(l.input_name(2)));
            }
        } else {
            check_like(&l, op, 2, 0)?;
        }
        let lr = scalar_f32(&l, op, 5, "the learning rate")?;
        let iter = iteration(&l, op, 6)?;
        let rule = AdamStep::new(b1, b2, eps, iter, radam);
        let (mut p, ps) = vec_of(&l, op, 0)?;
        let (mut m1, m1s) = vec_of(&l, op, 1)?;
        let (mut m2, m2s) = vec_of(&l, op, 2)?;
        let (mut g, gs) = vec_of(&l, op, 4)?;
        for (i, &r) in rows.iter().enumerate() {
            if row_wise {
                let row = &g[i * block..(i + 1) * block];
                let mean = if block == 0 {
                    0.0
                } else {
                    row.iter().map(|v| v * v).sum::<f32>() / block as f32
                };
                m2[r] = m2[r] * b2 + mean * (1.0 - b2);
            }
            for j in 0..block {
                let (gi, k) = (i * block + j, r * block + j);
                let gv = g[gi];
                m1[k] = m1[k] * b1 + gv * (1.0 - b1);
                let v = if row_wise {
                    m2[r]
                } else {
                    m2[k] = m2[k] * b2 + gv * gv * (1.0 - b2);
                    m2[k]
                };
                let step = rule.step(m1[k], v);
                p[k] += lr * step;
                g[gi] = step;
            }
        }
        l.set_output(0, arr(&ps, p)?);
        l.set_output(1, arr(&m1s, m1)?);
        l.set_output(2, arr(&m2s, m2)?);
        if out_grad {
            l.set_output(3, arr(&gs, g)?);
        }
        Ok(true)
    }))
}
