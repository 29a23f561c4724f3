//! The learning rate: LearningRate (a policy of the iteration) and Lars
//! (a layer's rate factor from its weights' and gradient's norms).

#![allow(clippy::result_large_err)]

use super::common::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{OpDefCtx, OpSchema, Operator};
use crate::ops::kit::f32_in;
use crate::ops::kit::kernel;
use crate::tensor::Tensor;
use ndarray::ArrayD;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("LearningRate", build_lr)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(&[
                arg!("base_lr", "float", "required", "the rate at iteration 0 (negative to descend with WeightedSum)"),
                arg!("policy", "string", "required", "fixed, step, exp, inv, multistep or poly"),
                arg!("gamma", "float", "0", "step, exp, inv, multistep: the decay factor"),
                arg!("stepsize", "int", "0", "step: iterations per decay"),
                arg!("stepsizes", "list of int", "[]", "multistep: the iterations at which the rate decays"),
                arg!("power", "float", "0", "inv and poly: the exponent"),
                arg!("max_iter", "int", "-1", "poly: the iteration at which the rate reaches 0"),
            ])
            .doc("lr = base_lr * policy(iter), a float32 tensor of shape [1], from the int64 iteration counter (Iter's output)."),
        OpSchema::new("Lars", build_lars)
            .inputs(5, 5)
            .outputs(1, 1)
            .args(&[
                arg!("offset", "float", "0.5", "added to the ratio of norms, >= 0"),
                arg!("lr_min", "float", "0.02", "the least factor, >= 0"),
            ])
            .doc("Layer-wise adaptive rate scaling: inputs (X, dX, wd, trust, lr_max) (float32; the last three of one element), output the factor [1] = clip(trust / (|dX| / |X| + wd + offset), lr_min, lr_max), 1 clipped when |X| = 0 (L2 norms). No gradient."),
    ]
}

// -------------------------------------------------------- LearningRate --

#[derive(Clone, Debug)]
enum Policy {
    Fixed,
    Step { gamma: f64, stepsize: i64 },
    Exp { gamma: f64 },
    Inv { gamma: f64, power: f64 },
    MultiStep { gamma: f64, steps: Vec<i64> },
    Poly { power: f64, max_iter: i64 },
}

impl Policy {
    fn multiplier(&self, iter: i64) -> f64 {
        match self {
            Policy::Fixed => 1.0,
            Policy::Step { gamma, stepsize } => gamma.powf((iter / stepsize) as f64),
            Policy::Exp { gamma } => gamma.powf(iter as f64),
            Policy::Inv { gamma, power } => (1.0 + gamma * iter as f64).powf(-power),
            Policy::MultiStep { gamma, steps } => {
                gamma.powi(steps.iter().filter(|&&s| iter >= s).count() as i32)
            }
            Policy::Poly { power, max_iter } => {
                (1.0 - iter as f64 / *max_iter as f64).max(0.0).powf(*power)
            }
        }
    }
}

fn build_lr(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let a = &ctx.args;
    let base_lr = a
        .f32_opt("base_lr")?
        .ok_or_else(|| ctx.bad_arg("LearningRate: base_lr is required"))?;
    let policy = a
        .string_opt("policy")?
        .ok_or_else(|| ctx.bad_arg("LearningRate: must specify a learning rate policy"))?;
    let gamma = f64::from(a.f32("gamma", 0.0)?);
    let power = f64::from(a.f32("power", 0.0)?);
    let p = match policy.as_str() {
        "fixed" => Policy::Fixed,
        "step" => {
            let stepsize = a.i64("stepsize", 0)?;
            if stepsize <= 0 {
                return Err(ctx.bad_arg(format!(
                    "LearningRate: the step policy needs a positive stepsize, got {stepsize}"
                )));
            }
            Policy::Step { gamma, stepsize }
        }
        "exp" => Policy::Exp { gamma },
        "inv" => Policy::Inv { gamma, power },
        "multistep" => Policy::MultiStep {
            gamma,
            steps: a.ints("stepsizes")?.unwrap_or_default(),
        },
        "poly" => {
            let max_iter = a.i64("max_iter", -1)?;
            if max_iter <= 0 {
                return Err(ctx.bad_arg(format!(
                    "LearningRate: the poly policy needs a positive max_iter, got {max_iter}"
                )));
            }
            Policy::Poly { power, max_iter }
        }
        other => {
            return Err(ctx.bad_arg(format!(
                "LearningRate: unknown learning rate policy: {other} (fixed, step, exp, inv, multistep, poly)"
            )))
        }
    };
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let name = l.input_name(0).to_string();
        let t = l.tensor(0)?;
        let iter = match t {
            Tensor::I64(a) if a.len() == 1 => a.iter().copied().next().unwrap_or(0),
            _ => {
                return Err(Error::type_error(format!(
                    "LearningRate: the iteration ('{name}') must be an int64 tensor of one element (Iter's output), got {} of shape {:?}",
                    t.dtype(),
                    t.shape()
                ))
                .with_blob(&name))
            }
        };
        let lr = (f64::from(base_lr) * p.multiplier(iter)) as f32;
        l.set_output(0, Tensor::from(ArrayD::from_elem(ndarray::IxDyn(&[1]), lr)));
        Ok(true)
    }))
}

fn build_lars(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "Lars";
    let offset = ctx.args.f32("offset", 0.5)?;
    let lr_min = ctx.args.f32("lr_min", 0.02)?;
    if offset < 0.0 || lr_min < 0.0 {
        return Err(ctx.bad_arg(format!(
            "offset and lr_min must be >= 0, got offset {offset}, lr_min {lr_min}"
        )));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let x = f32_in(&l, OP, 0, "the parameter")?;
        let dx = f32_in(&l, OP, 1, "the gradient")?;
        if x.len() != dx.len() {
            return Err(Error::shape(format!(
                "Lars: the gradient ('{}', shape {:?}) must have as many elements as the parameter ('{}', shape {:?})",
                l.input_name(1),
                dx.shape(),
                l.input_name(0),
                x.shape()
            ))
            .with_blob(l.input_name(1)));
        }
        // Norms accumulated in float64, so a large layer loses nothing.
        let norm = |a: &ArrayD<f32>| {
            a.iter()
                .map(|&v| (v as f64) * (v as f64))
                .sum::<f64>()
                .sqrt()
        };
        let (xn, dxn) = (norm(x), norm(dx));
        let wd = scalar_f32(&l, OP, 2, "the weight decay")? as f64;
        let trust = scalar_f32(&l, OP, 3, "the trust")? as f64;
        let lr_max = scalar_f32(&l, OP, 4, "lr_max")? as f64;
        let val = if xn > 0.0 {
            trust / (dxn / xn + wd + offset as f64)
        } else {
            1.0
        };
        let out = val.min(lr_max).max(lr_min as f64) as f32;
        l.set_output(0, arr(&[1], vec![out])?);
        Ok(true)
    }))
}
