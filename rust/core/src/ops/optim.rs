//! Training support (issue 14): the weight fillers XavierFill and MSRAFill,
//! LearningRate, and the updates MomentumSGDUpdate, Adam, Adagrad and the
//! sparse ones (SparseMomentumSGDUpdate, SparseAdam, SparseAdagrad,
//! RowWiseSparseAdagrad: rows at indices, in order), RmsProp, Adadelta,
//! SparseAdadelta and Lars (a layer's learning-rate factor) (float32, as Caffe2's
//! CPU kernels; WeightedSum, the plain SGD update, is in elementwise.rs,
//! and ScatterWeightedSum, its sparse form, in sparse.rs).

#![allow(clippy::result_large_err)]

use super::fill::{make_rng, FillShape, EXTRA_SHAPE, FILLER_IGNORED, INPUT_AS_SHAPE, SHAPE};
use super::kernel;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::tensor::{collect_array, DataType, Tensor};
use ndarray::ArrayD;
use rand::distr::{Distribution, Uniform};
use rand_distr::Normal;

fn fill_in_place(i: usize, o: usize) -> bool {
    i == 0 && o == 0
}

/// MomentumSGDUpdate: (grad, moment, lr, param) -> (grad, moment, param).
pub(super) fn momentum_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (3, 2))
}

/// SparseMomentumSGDUpdate updates moment and param in place; its
/// gradient output may be another blob (as Caffe2's).
fn sparse_momentum_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (1, 1) | (3, 2))
}

/// Outputs 0, 1 and 2 over inputs 0, 1 and 2: Adam's (param, moment_1,
/// moment_2, ...), RmsProp's (grad, mean_squares, mom, lr) and Adadelta's
/// (param, moment, moment_delta, ...) state.
fn adam_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (2, 2))
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

pub fn schemas() -> Vec<OpSchema> {
    const FILL_ARGS: &[crate::operator::ArgDoc] = &[SHAPE, EXTRA_SHAPE, INPUT_AS_SHAPE];
    let filler = |name: &'static str, build: crate::operator::BuildFn, doc: &'static str| {
        OpSchema::new(name, build)
            .inputs(0, 1)
            .outputs(1, 1)
            .inplace(InPlace::Allow(fill_in_place))
            .args(FILL_ARGS)
            .ignores(FILLER_IGNORED)
            .doc(doc)
    };
    let mut v = vec![
        filler(
            "XavierFill",
            build_xavier,
            "Fills a float32 output with samples uniform on [-s, s], s = sqrt(3 / fan_in), fan_in = size / dim 0.",
        ),
        filler(
            "MSRAFill",
            build_msra,
            "Fills a float32 output with normal samples of mean 0 and std sqrt(2 / fan_out), fan_out = size / dim 1.",
        ),
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
        OpSchema::new("MomentumSGDUpdate", build_momentum)
            .inputs(4, 4)
            .outputs(3, 3)
            .inplace(InPlace::Allow(momentum_in_place))
            .args(&[
                arg!("momentum", "float", "0", "the moment's decay"),
                arg!("nesterov", "int", "0", "use Nesterov's momentum"),
            ])
            .doc("Inputs (grad, moment, lr, param), outputs (grad, moment, param), in place or not: m = momentum * m + lr * grad, param -= m (Nesterov: param -= (1 + momentum) * m_new - momentum * m_old); grad becomes the step taken."),
        OpSchema::new("MomentumSGD", build_momentum_sgd)
            .inputs(3, 3)
            .outputs(2, 2)
            .inplace(InPlace::Allow(adam_in_place))
            .args(&[
                arg!("momentum", "float", "0", "the moment's decay"),
                arg!("nesterov", "int", "0", "use Nesterov's momentum"),
            ])
            .doc("Inputs (grad, moment, lr), outputs (grad, moment), in place or not: m = momentum * m + lr * grad; grad becomes the step (m, or with Nesterov (1 + momentum) * m_new - momentum * m_old). MomentumSGDUpdate without the parameter."),
        OpSchema::new("Adam", build_adam)
            .inputs(6, 6)
            .outputs(3, 4)
            .inplace(InPlace::Allow(adam_in_place))
            .args(ADAM_ARGS)
            .doc("Inputs (param, moment_1, moment_2, grad, lr, iter), outputs (param, moment_1, moment_2[, the effective gradient]), in place or not: t = iter + 1, m1 = b1 m1 + (1 - b1) g, m2 = b2 m2 + (1 - b2) g^2, param += lr * sqrt(1 - b2^t) / (1 - b1^t) * m1 / (sqrt(m2) + epsilon). With enableRAdam, the step is rectified: times r_t while rho_t >= 5, else m1 / (1 - b1^t)."),
    ];
    v.extend(adagrad_schemas());
    v.extend(adaptive_schemas());
    v
}

// ------------------------------------------------------------- fillers --

/// Product of the dims after `skip` (the fan) for a filler of `shape`.
fn fan(op: &str, shape: &[usize], dim: usize, blob: &str) -> Result<usize> {
    if shape.len() <= dim || shape[dim] == 0 {
        return Err(Error::shape(format!(
            "{op}: the output shape {shape:?} needs a non-zero dim {dim} to compute its fan"
        ))
        .with_blob(blob));
    }
    Ok(shape.iter().product::<usize>() / shape[dim])
}

fn build_xavier(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = shape.resolve(&l)?;
        let out = l.output_name(0).to_string();
        let fan_in = fan("XavierFill", &shape, 0, &out)?;
        let s = (3.0f32 / fan_in as f32).sqrt();
        let d = Uniform::new_inclusive(-s, s).map_err(|e| Error::internal(e.to_string()))?;
        let a = collect_array(&shape, std::iter::repeat_with(|| d.sample(&mut rng)))
            .map_err(|e| e.with_blob(&out))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
}

fn build_msra(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let shape = FillShape::parse(ctx)?;
    let mut rng = make_rng(ctx);
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let shape = shape.resolve(&l)?;
        let out = l.output_name(0).to_string();
        let fan_out = fan("MSRAFill", &shape, 1, &out)?;
        let std = (2.0f32 / fan_out as f32).sqrt();
        let d = Normal::new(0.0f32, std).map_err(|e| Error::internal(e.to_string()))?;
        let a = collect_array(&shape, std::iter::repeat_with(|| d.sample(&mut rng)))
            .map_err(|e| e.with_blob(&out))?;
        l.set_output(0, Tensor::from(a));
        Ok(true)
    }))
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

// ------------------------------------------------------------- updates --

/// Input `i` as float32, or a type error naming the op and blob.
pub(super) fn f32_in<'l>(
    l: &'l Locked<'_>,
    op: &str,
    i: usize,
    what: &str,
) -> Result<&'l ArrayD<f32>> {
    let t = l.tensor(i)?;
    match t {
        Tensor::F32(a) => Ok(a),
        _ => {
            let name = l.input_name(i);
            Err(Error::type_error(format!(
                "{op}: {what} ('{name}') must be a float32 tensor, got {}. To fix: {}",
                t.dtype(),
                DataType::Float.conversion_hint(name)
            ))
            .with_blob(name))
        }
    }
}

pub(super) fn check_like(l: &Locked<'_>, op: &str, i: usize, like: usize) -> Result<()> {
    let (a, b) = (l.tensor(i)?.shape(), l.tensor(like)?.shape());
    if a != b {
        let name = l.input_name(i);
        return Err(Error::shape(format!(
            "{op}: '{name}' (shape {a:?}) must have the shape of '{}' ({b:?})",
            l.input_name(like)
        ))
        .with_blob(name));
    }
    Ok(())
}

pub(super) fn scalar_f32(l: &Locked<'_>, op: &str, i: usize, what: &str) -> Result<f32> {
    let a = f32_in(l, op, i, what)?;
    if a.len() != 1 {
        let name = l.input_name(i);
        return Err(Error::shape(format!(
            "{op}: {what} ('{name}') must have one element, got shape {:?}",
            a.shape()
        ))
        .with_blob(name));
    }
    Ok(a.iter().copied().next().unwrap_or(0.0))
}

fn build_momentum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    momentum_kernel(ctx, "MomentumSGDUpdate", true)
}

fn build_momentum_sgd(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    momentum_kernel(ctx, "MomentumSGD", false)
}

/// MomentumSGDUpdate (grad, moment, lr, param) -> (grad, moment, param) and
/// MomentumSGD (grad, moment, lr) -> (grad, moment): the same step, the
/// first also subtracting it from the parameter.
fn momentum_kernel(
    ctx: &OpDefCtx<'_>,
    op: &'static str,
    with_param: bool,
) -> Result<Box<dyn Operator>> {
    let mu = ctx.args.f32("momentum", 0.0)?;
    let nesterov = ctx.args.i64("nesterov", 0)? != 0;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        f32_in(&l, op, 0, "the gradient")?;
        f32_in(&l, op, 1, "the moment")?;
        check_like(&l, op, 1, 0)?;
        if with_param {
            f32_in(&l, op, 3, "the parameter")?;
            check_like(&l, op, 3, 0)?;
        }
        let lr = scalar_f32(&l, op, 2, "the learning rate")?;
        let (mut ng, mut nm) = (
            f32_in(&l, op, 0, "")?.clone(),
            f32_in(&l, op, 1, "")?.clone(),
        );
        ndarray::Zip::from(&mut ng).and(&mut nm).for_each(|g, m| {
            let m_old = *m;
            let m_new = mu * m_old + lr * *g;
            *m = m_new;
            *g = if nesterov {
                (1.0 + mu) * m_new - mu * m_old
            } else {
                m_new
            };
        });
        if with_param {
            let mut np = f32_in(&l, op, 3, "")?.clone();
            ndarray::Zip::from(&mut np)
                .and(&ng)
                .for_each(|p, step| *p -= *step);
            l.set_output(2, Tensor::from(np));
        }
        l.set_output(0, Tensor::from(ng));
        l.set_output(1, Tensor::from(nm));
        Ok(true)
    }))
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
        let iter = super::optim_extra::iteration(&l, OP, 5)?;
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

// ------------------------------------------------------- Adagrad family --

/// Adagrad and the sparse ones: param and moment are updated in place.
pub(super) fn adagrad_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1))
}

fn adagrad_schemas() -> Vec<OpSchema> {
    const ADAGRAD_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "epsilon",
            "float",
            "1e-5",
            "added to the moment's square root"
        ),
        arg!(
            "decay",
            "float",
            "1",
            "the moment's decay before g^2 is added (Adagrad only)"
        ),
        arg!(
            "weight_decay",
            "float",
            "0",
            "g += weight_decay * param before the update"
        ),
    ];
    const SPARSE_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "epsilon",
            "float",
            "1e-5",
            "added to the moment's square root"
        ),
        arg!(
            "weight_decay",
            "float",
            "0",
            "g += weight_decay * param (of the row) before the update"
        ),
    ];
    vec![
        OpSchema::new("Adagrad", build_adagrad)
            .inputs(4, 4)
            .outputs(2, 4)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(ADAGRAD_ARGS)
            .doc("Inputs (param, moment, grad, lr), outputs (param, moment[, effective_lr[, update]]) in place (float32): g = grad + weight_decay * param, moment = decay * moment + g^2, effective_lr = lr / (sqrt(moment) + epsilon), update = effective_lr * g, param += update."),
        OpSchema::new("SparseAdagrad", build_sparse_adagrad)
            .inputs(5, 5)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(SPARSE_ARGS)
            .doc("Inputs (param, moment, indices, grad, lr), outputs (param, moment) in place (float32): Adagrad on the rows of param at the indices, grad holding one row per index (applied in order; duplicates update twice)."),
        OpSchema::new("SparseMomentumSGDUpdate", build_sparse_momentum)
            .inputs(5, 5)
            .outputs(3, 3)
            .inplace(InPlace::EnforceAllow {
                enforce: sparse_momentum_in_place,
                allow: momentum_in_place,
            })
            .args(&[
                arg!("momentum", "float", "0", "the moment's decay"),
                arg!("nesterov", "int", "0", "use Nesterov's momentum"),
            ])
            .doc("Inputs (grad, moment, lr, param, indices), outputs (grad, moment, param) in place (float32): MomentumSGDUpdate on the rows of moment and param at the indices (grad has one row per index, in order), grad becoming the steps taken."),
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
        OpSchema::new("RowWiseSparseAdagrad", build_sparse_adagrad)
            .inputs(5, 5)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(SPARSE_ARGS)
            .doc("Inputs (param, moment (1-D, one per row of param), indices, grad, lr), outputs (param, moment) in place (float32): moment[r] += mean(g^2) over the row, param[r] += lr * g / (sqrt(moment[r]) + epsilon)."),
    ]
}

fn build_adagrad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "Adagrad";
    let eps = ctx.epsilon(1e-5)?;
    let decay = ctx.args.f32("decay", 1.0)?;
    let wd = ctx.args.f32("weight_decay", 0.0)?;
    let no = ctx.num_outputs();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        f32_in(&l, OP, 0, "the parameter")?;
        f32_in(&l, OP, 1, "the moment")?;
        f32_in(&l, OP, 2, "the gradient")?;
        check_like(&l, OP, 1, 0)?;
        check_like(&l, OP, 2, 0)?;
        let lr = scalar_f32(&l, OP, 3, "the learning rate")?;
        let mut p = f32_in(&l, OP, 0, "")?.clone();
        let mut m = f32_in(&l, OP, 1, "")?.clone();
        let g = f32_in(&l, OP, 2, "")?;
        let mut eff = g.clone();
        let mut upd = g.clone();
        ndarray::Zip::from(&mut p)
            .and(&mut m)
            .and(&mut eff)
            .and(&mut upd)
            .for_each(|p, m, e, u| {
                let gi = *u + wd * *p;
                *m = decay * *m + gi * gi;
                *e = lr / (m.sqrt() + eps);
                *u = *e * gi;
                *p += *u;
            });
        l.set_output(0, Tensor::from(p));
        l.set_output(1, Tensor::from(m));
        if no > 2 {
            l.set_output(2, Tensor::from(eff));
        }
        if no > 3 {
            l.set_output(3, Tensor::from(upd));
        }
        Ok(true)
    }))
}

fn build_sparse_adagrad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let eps = ctx.epsilon(1e-5)?;
    let wd = ctx.args.f32("weight_decay", 0.0)?;
    let row_wise = ctx.op_type() == "RowWiseSparseAdagrad";
    let op = ctx.op_type().to_string();
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let op = op.as_str();
        let p = f32_in(&l, op, 0, "the parameter")?;
        if p.ndim() == 0 {
            return Err(Error::shape(format!(
                "{op}: the parameter ('{}') must have at least one dim",
                l.input_name(0)
            ))
            .with_blob(l.input_name(0)));
        }
        let nrows = p.shape()[0];
        let block: usize = p.shape()[1..].iter().product();
        let m = f32_in(&l, op, 1, "the moment")?;
        if row_wise {
            if m.len() != nrows {
                return Err(Error::shape(format!(
                    "{op}: the moment ('{}', shape {:?}) must have one value per row of the parameter ({nrows})",
                    l.input_name(1),
                    m.shape()
                ))
                .with_blob(l.input_name(1)));
            }
        } else {
            check_like(&l, op, 1, 0)?;
        }
        let (idx, _) = super::sparse::indices(&l, op, 2)?;
        let rows = super::sparse::checked_rows(op, &idx, nrows, false, l.input_name(2))?;
        let g = f32_in(&l, op, 3, "the gradient")?;
        if g.len() != rows.len() * block {
            return Err(Error::shape(format!(
                "{op}: the gradient ('{}', shape {:?}) must have one row of {block} values per index ({} indices)",
                l.input_name(3),
                g.shape(),
                rows.len()
            ))
            .with_blob(l.input_name(3)));
        }
        let lr = scalar_f32(&l, op, 4, "the learning rate")?;
        let shape_p = p.shape().to_vec();
        let shape_m = m.shape().to_vec();
        let mut pv: Vec<f32> = crate::tensor::try_collect(p.iter().copied(), "a kernel buffer")?;
        let mut mv: Vec<f32> = crate::tensor::try_collect(m.iter().copied(), "a kernel buffer")?;
        let gv: Vec<f32> = crate::tensor::try_collect(g.iter().copied(), "a kernel buffer")?;
        for (i, &r) in rows.iter().enumerate() {
            let gs: Vec<f32> = crate::tensor::try_collect(
                (0..block).map(|j| gv[i * block + j] + wd * pv[r * block + j]),
                "a kernel buffer",
            )?;
            if row_wise {
                let mean = if block == 0 {
                    0.0
                } else {
                    gs.iter().map(|v| v * v).sum::<f32>() / block as f32
                };
                mv[r] += mean;
                let step = lr / (mv[r].sqrt() + eps);
                for (j, gj) in gs.iter().enumerate() {
                    pv[r * block + j] += step * gj;
                }
            } else {
                for (j, gj) in gs.iter().enumerate() {
                    let k = r * block + j;
                    mv[k] += gj * gj;
                    pv[k] += lr * gj / (mv[k].sqrt() + eps);
                }
            }
        }
        let pa = ArrayD::from_shape_vec(ndarray::IxDyn(&shape_p), pv)
            .map_err(|e| Error::internal(e.to_string()))?;
        let ma = ArrayD::from_shape_vec(ndarray::IxDyn(&shape_m), mv)
            .map_err(|e| Error::internal(e.to_string()))?;
        l.set_output(0, Tensor::from(pa));
        l.set_output(1, Tensor::from(ma));
        Ok(true)
    }))
}

/// (rows of `param` at input `pi`, the row length) for a sparse update
/// whose indices are input `ii` and gradient rows input `gi`.
pub(super) fn sparse_rows(
    l: &Locked<'_>,
    op: &str,
    pi: usize,
    ii: usize,
    gi: usize,
) -> Result<(Vec<usize>, usize)> {
    let p = f32_in(l, op, pi, "the parameter")?;
    if p.ndim() == 0 {
        return Err(Error::shape(format!(
            "{op}: the parameter ('{}') must have at least one dim",
            l.input_name(pi)
        ))
        .with_blob(l.input_name(pi)));
    }
    let block: usize = p.shape()[1..].iter().product();
    let (idx, _) = super::sparse::indices(l, op, ii)?;
    let rows = super::sparse::checked_rows(op, &idx, p.shape()[0], false, l.input_name(ii))?;
    let g = f32_in(l, op, gi, "the gradient")?;
    if g.len() != rows.len() * block {
        return Err(Error::shape(format!(
            "{op}: the gradient ('{}', shape {:?}) must have one row of {block} values per index ({} indices)",
            l.input_name(gi),
            g.shape(),
            rows.len()
        ))
        .with_blob(l.input_name(gi)));
    }
    Ok((rows, block))
}

pub(super) fn vec_of(l: &Locked<'_>, op: &str, i: usize) -> Result<(Vec<f32>, Vec<usize>)> {
    let a = f32_in(l, op, i, "")?;
    Ok((
        crate::tensor::try_collect(a.iter().copied(), "a kernel buffer")?,
        a.shape().to_vec(),
    ))
}

pub(super) fn arr(shape: &[usize], v: Vec<f32>) -> Result<Tensor> {
    ArrayD::from_shape_vec(ndarray::IxDyn(shape), v)
        .map(Tensor::from)
        .map_err(|e| Error::internal(e.to_string()))
}

// ------------------------------------------------ RmsProp and Adadelta --

fn adaptive_schemas() -> Vec<OpSchema> {
    const ADADELTA_ARGS: &[crate::operator::ArgDoc] = &[
        arg!("epsilon", "float", "1e-5", "added inside both square roots"),
        arg!("decay", "float", "0.95", "the moments' decay, in (0, 1)"),
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

fn build_sparse_momentum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let mu = ctx.args.f32("momentum", 0.0)?;
    let nesterov = ctx.args.i64("nesterov", 0)? != 0;
    const OP: &str = "SparseMomentumSGDUpdate";
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        let (rows, block) = sparse_rows(&l, OP, 3, 4, 0)?;
        f32_in(&l, OP, 1, "the moment")?;
        check_like(&l, OP, 1, 3)?;
        let lr = scalar_f32(&l, OP, 2, "the learning rate")?;
        let (mut g, gs) = vec_of(&l, OP, 0)?;
        let (mut m, ms) = vec_of(&l, OP, 1)?;
        let (mut p, ps) = vec_of(&l, OP, 3)?;
        for (i, &r) in rows.iter().enumerate() {
            for j in 0..block {
                let (gi, k) = (i * block + j, r * block + j);
                let m_old = m[k];
                let m_new = mu * m_old + lr * g[gi];
                let step = if nesterov {
                    (1.0 + mu) * m_new - mu * m_old
                } else {
                    m_new
                };
                m[k] = m_new;
                g[gi] = step;
                p[k] -= step;
            }
        }
        l.set_output(0, arr(&gs, g)?);
        l.set_output(1, arr(&ms, m)?);
        l.set_output(2, arr(&ps, p)?);
        Ok(true)
    }))
}

/// SparseAdam (optionally RAdam) and RowWiseSparseAdam (one second
/// moment per row, fed the row's mean squared gradient).
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
        let iter = super::optim_extra::iteration(&l, op, 6)?;
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
