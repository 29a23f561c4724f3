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

const LR_ARGS: &[crate::operator::ArgDoc] = &[
    arg!("base_lr", "float", "required", "the rate at iteration 0 (negative to descend with WeightedSum)"),
    arg!("policy", "string", "required", "fixed, step, exp, inv, multistep, poly, alter, hill, slope, gate, linearWarmup, constantWarmup, pieceWarmup, cyclical, cosine, constantThenLinearWarmup, compositeCyclical, compositeCosine or composite"),
    arg!("lr_scale", "float", "1", "multiplies base_lr (not for composite, whose sub-policies have their own)"),
    arg!("gamma", "float", "0", "step, exp, inv, multistep, hill: the decay factor"),
    arg!("stepsize", "int", "0", "step: iterations per decay; cyclical: half the period"),
    arg!("stepsizes", "list of int", "[]", "multistep: the iterations at which the rate decays"),
    arg!("power", "float", "0", "inv, poly and hill: the exponent"),
    arg!("max_iter", "int", "-1", "poly: the iteration at which the rate reaches 0"),
    arg!("active_first", "bool", "true", "alter: start with an active period"),
    arg!("active_period", "int", "-1", "alter: iterations at the full rate per cycle"),
    arg!("inactive_period", "int", "-1", "alter: iterations at rate 0 per cycle"),
    arg!("num_iter", "int", "0", "hill, linearWarmup, constantWarmup: warm-up iterations; gate: the switch"),
    arg!("start_multiplier", "float", "0", "hill, linearWarmup: the multiplier at iteration 0"),
    arg!("end_multiplier", "float", "0", "hill: the least multiplier after the warm-up"),
    arg!("multiplier", "float", "0.5", "constantWarmup: the multiplier before num_iter"),
    arg!("num_iter_1", "int", "0", "slope: the multiplier is multiplier_1 before it"),
    arg!("num_iter_2", "int", "0", "slope: the multiplier reaches multiplier_2 there (> num_iter_1)"),
    arg!("multiplier_1", "float", "1", "gate, slope: the first multiplier"),
    arg!("multiplier_2", "float", "1", "gate, slope: the second multiplier"),
    arg!("m1", "float", "0.5", "pieceWarmup: the multiplier before n1"),
    arg!("n1", "int", "0", "pieceWarmup: the first threshold"),
    arg!("m2", "float", "0.5", "pieceWarmup: the multiplier from n1 to n2"),
    arg!("n2", "int", "0", "pieceWarmup: the second threshold"),
    arg!("m3", "float", "0.5", "pieceWarmup: the multiplier from n2 on"),
    arg!("max_lr", "float", "0.005 (cyclical), 0.5 (cosine)", "cyclical, cosine: the highest rate"),
    arg!("min_lr", "float", "0.1", "cosine: the lowest rate"),
    arg!("decay", "float", "1", "cyclical: the amplitude's decay per cycle"),
    arg!("period", "int", "50", "cosine: the first period"),
    arg!("t_mult", "float", "1", "cosine: each period's length times the previous one's"),
    arg!("lr_shrink", "float", "0.99", "cosine: min_lr and max_lr shrink by it each period"),
    arg!("start_warmup_multiplier", "float", "0.1", "constantThenLinearWarmup, compositeCyclical, compositeCosine: the constant warm-up's multiplier"),
    arg!("constant_warmup_num_iter", "int", "10000000", "the constant warm-up's iterations"),
    arg!("linear_warmup_num_iter", "int", "10000000", "the linear warm-up's iterations"),
    arg!("cyclical_max_lr", "float", "0.05", "compositeCyclical: cyclical's max_lr"),
    arg!("cyclical_step_size", "int", "1000000", "compositeCyclical: cyclical's stepsize"),
    arg!("cyclical_decay", "float", "1", "compositeCyclical: cyclical's decay"),
    arg!("cosine_min_lr", "float", "0.01", "compositeCosine: cosine's min_lr"),
    arg!("cosine_max_lr", "float", "0.05", "compositeCosine: cosine's max_lr"),
    arg!("cosine_period", "int", "50", "compositeCosine: cosine's period"),
    arg!("cosine_t_mult", "float", "1", "compositeCosine: cosine's t_mult"),
    arg!("cosine_lr_shrink", "float", "0.99", "compositeCosine: cosine's lr_shrink"),
    arg!("sub_policy_num_iters", "list of int", "required for composite", "composite: each sub-policy's iterations (> 0), in order from iteration 1; sub-policy i reads its policy, lr_scale and own arguments as sub_policy_<i>_<name>"),
];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("LearningRate", build_lr)
            .inputs(1, 1)
            .outputs(1, 1)
            .args(LR_ARGS)
            .prefixed_args(&["sub_policy_"])
            .doc("lr = base_lr * lr_scale * policy(iter), a float32 tensor of shape [1], from the int64 iteration counter (Iter's output). composite: the sub-policy whose range holds iter (the first for iter < 1) gives sub_policy_<i>_lr_scale * its policy(iter), at the global iteration."),
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

/// A constant warm-up, then a linear one, then 1 (Caffe2's
/// constantThenLinearWarmup, also the start of compositeCyclical and
/// compositeCosine).
#[derive(Clone, Debug)]
struct Warmup {
    start: f64,
    constant: i64,
    linear: i64,
}

impl Warmup {
    fn len(&self) -> i64 {
        self.constant.saturating_add(self.linear)
    }
    fn multiplier(&self, iter: i64) -> f64 {
        if iter < self.constant {
            self.start
        } else if iter < self.len() {
            linear_warmup(self.start, self.linear, iter - self.constant)
        } else {
            1.0
        }
    }
}

fn linear_warmup(start: f64, num_iter: i64, iter: i64) -> f64 {
    if iter >= num_iter {
        1.0
    } else {
        start + (1.0 - start) * iter as f64 / num_iter as f64
    }
}

#[derive(Clone, Debug)]
struct Cyclical {
    /// |max_lr| / |base_lr|
    ratio: f64,
    stepsize: i64,
    decay: f64,
}

impl Cyclical {
    fn multiplier(&self, iter: i64) -> f64 {
        let cycles = iter / (2 * self.stepsize);
        let x = (iter as f64 / self.stepsize as f64 - 2.0 * (cycles + 1) as f64 + 1.0).abs();
        1.0 + (self.ratio - 1.0) * (1.0 - x).max(0.0) * self.decay.powi(cycles as i32)
    }
}

#[derive(Clone, Debug)]
struct Cosine {
    min_lr: f64,
    max_lr: f64,
    period: i64,
    t_mult: f64,
    shrink: f64,
}

impl Cosine {
    fn multiplier(&self, iter: i64) -> f64 {
        let (it, period) = (iter as f64, self.period as f64);
        let (i, t_i, t_cur) = if self.t_mult != 1.0 {
            // Periods grow geometrically: period * t_mult^k for the k-th.
            let i = ((1.0 - it / period * (1.0 - self.t_mult)).ln() / self.t_mult.ln()).floor();
            let t_i = self.t_mult.powf(i) * period;
            let t_cur = it - (1.0 - self.t_mult.powf(i)) / (1.0 - self.t_mult) * period;
            (i, t_i, t_cur)
        } else {
            let i = (it / period).floor();
            (i, period, it - period * i)
        };
        let shrink = self.shrink.powf(i);
        let (lo, hi) = (self.min_lr * shrink, self.max_lr * shrink);
        lo + 0.5 * (hi - lo) * (1.0 + (std::f64::consts::PI * t_cur / t_i).cos())
    }
}

#[derive(Clone, Debug)]
enum Policy {
    Fixed,
    Step {
        gamma: f64,
        stepsize: i64,
    },
    Exp {
        gamma: f64,
    },
    Inv {
        gamma: f64,
        power: f64,
    },
    MultiStep {
        gamma: f64,
        steps: Vec<i64>,
    },
    Poly {
        power: f64,
        max_iter: i64,
    },
    Alter {
        active_first: bool,
        active: i64,
        inactive: i64,
    },
    Hill {
        num_iter: i64,
        start: f64,
        gamma: f64,
        power: f64,
        end: f64,
    },
    Slope {
        n1: i64,
        m1: f64,
        n2: i64,
        m2: f64,
    },
    Gate {
        m1: f64,
        m2: f64,
        num_iter: i64,
    },
    LinearWarmup {
        start: f64,
        num_iter: i64,
    },
    ConstantWarmup {
        multiplier: f64,
        num_iter: i64,
    },
    PieceWarmup {
        m1: f64,
        n1: i64,
        m2: f64,
        n2: i64,
        m3: f64,
    },
    Cyclical(Cyclical),
    Cosine(Cosine),
    Warmup(Warmup),
    CompositeCyclical(Warmup, Cyclical),
    CompositeCosine(Warmup, Cosine),
    /// (first iteration, lr_scale, policy), by first iteration.
    Composite(Vec<(i64, f64, Policy)>),
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
            Policy::Alter {
                active_first,
                active,
                inactive,
            } => {
                let first = if *active_first { *active } else { *inactive };
                let in_first = iter.rem_euclid(active + inactive) < first;
                if in_first == *active_first {
                    1.0
                } else {
                    0.0
                }
            }
            Policy::Hill {
                num_iter,
                start,
                gamma,
                power,
                end,
            } => {
                if iter < *num_iter {
                    linear_warmup(*start, *num_iter, iter)
                } else {
                    (1.0 + gamma * (iter - num_iter) as f64)
                        .powf(-power)
                        .max(*end)
                }
            }
            Policy::Slope { n1, m1, n2, m2 } => {
                if iter < *n1 {
                    *m1
                } else {
                    let slope = (m2 - m1) / (n2 - n1) as f64;
                    (m1 + (iter - n1) as f64 * slope).max(*m2)
                }
            }
            Policy::Gate { m1, m2, num_iter } => {
                if iter >= *num_iter {
                    *m2
                } else {
                    *m1
                }
            }
            Policy::LinearWarmup { start, num_iter } => linear_warmup(*start, *num_iter, iter),
            Policy::ConstantWarmup {
                multiplier,
                num_iter,
            } => {
                if iter >= *num_iter {
                    1.0
                } else {
                    *multiplier
                }
            }
            Policy::PieceWarmup { m1, n1, m2, n2, m3 } => {
                if iter < *n1 {
                    *m1
                } else if iter < *n2 {
                    *m2
                } else {
                    *m3
                }
            }
            Policy::Cyclical(c) => c.multiplier(iter),
            Policy::Cosine(c) => c.multiplier(iter),
            Policy::Warmup(w) => w.multiplier(iter),
            Policy::CompositeCyclical(w, c) => {
                if iter < w.len() {
                    w.multiplier(iter)
                } else {
                    c.multiplier(iter - w.len())
                }
            }
            Policy::CompositeCosine(w, c) => {
                if iter < w.len() {
                    w.multiplier(iter)
                } else {
                    c.multiplier(iter - w.len())
                }
            }
            Policy::Composite(subs) => {
                // The last sub-policy starting at or before iter (the first
                // one before iteration 1), fed the global iteration.
                let k = subs.partition_point(|(start, _, _)| *start <= iter);
                let (_, scale, p) = &subs[k.saturating_sub(1)];
                scale * p.multiplier(iter)
            }
        }
    }
}

/// A policy's arguments: `prefix` + name (`sub_policy_<i>_` in a composite).
struct PolicyArgs<'a> {
    args: &'a crate::args::Args<'a>,
    prefix: String,
    ctx: &'a OpDefCtx<'a>,
}

impl PolicyArgs<'_> {
    fn f(&self, name: &str, default: f32) -> Result<f64> {
        Ok(f64::from(
            self.args.f32(&format!("{}{name}", self.prefix), default)?,
        ))
    }
    fn i(&self, name: &str, default: i64) -> Result<i64> {
        self.args.i64(&format!("{}{name}", self.prefix), default)
    }
    fn bad(&self, msg: String) -> Error {
        let p = if self.prefix.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.prefix.trim_end_matches('_'))
        };
        self.ctx.bad_arg(format!("LearningRate{p}: {msg}"))
    }
    fn positive(&self, name: &str, v: i64, policy: &str) -> Result<i64> {
        if v <= 0 {
            return Err(self.bad(format!(
                "the {policy} policy needs a positive {}{name}, got {v}",
                self.prefix
            )));
        }
        Ok(v)
    }
}

const POLICIES: &str = "fixed, step, exp, inv, multistep, poly, alter, hill, slope, gate, linearWarmup, constantWarmup, pieceWarmup, cyclical, cosine, constantThenLinearWarmup, compositeCyclical, compositeCosine, composite";

fn parse_policy(a: &PolicyArgs<'_>, policy: &str, base_lr: f32) -> Result<Policy> {
    let warmup = || -> Result<Warmup> {
        Ok(Warmup {
            start: a.f("start_warmup_multiplier", 0.1)?,
            constant: a.i("constant_warmup_num_iter", 10_000_000)?.max(0),
            linear: a.i("linear_warmup_num_iter", 10_000_000)?.max(0),
        })
    };
    let cyclical = |max_lr: f64, stepsize: i64, decay: f64| -> Result<Cyclical> {
        if base_lr == 0.0 {
            return Err(a.bad("the cyclical policies need a non-zero base_lr".into()));
        }
        Ok(Cyclical {
            ratio: max_lr.abs() / f64::from(base_lr).abs(),
            stepsize,
            decay,
        })
    };
    let cosine =
        |min_lr: f64, max_lr: f64, period: i64, t_mult: f64, shrink: f64| -> Result<Cosine> {
            if t_mult <= 0.0 {
                return Err(a.bad(format!("the cosine policies need t_mult > 0, got {t_mult}")));
            }
            Ok(Cosine {
                min_lr,
                max_lr,
                period,
                t_mult,
                shrink,
            })
        };
    Ok(match policy {
        "fixed" => Policy::Fixed,
        "step" => Policy::Step {
            gamma: a.f("gamma", 0.0)?,
            stepsize: a.positive("stepsize", a.i("stepsize", 0)?, "step")?,
        },
        "exp" => Policy::Exp {
            gamma: a.f("gamma", 0.0)?,
        },
        "inv" => Policy::Inv {
            gamma: a.f("gamma", 0.0)?,
            power: a.f("power", 0.0)?,
        },
        "multistep" => Policy::MultiStep {
            gamma: a.f("gamma", 0.0)?,
            steps: a
                .args
                .ints(&format!("{}stepsizes", a.prefix))?
                .unwrap_or_default(),
        },
        "poly" => Policy::Poly {
            power: a.f("power", 0.0)?,
            max_iter: a.positive("max_iter", a.i("max_iter", -1)?, "poly")?,
        },
        "alter" => {
            let (active, inactive) = (a.i("active_period", -1)?, a.i("inactive_period", -1)?);
            if active < 0 || inactive < 0 || active.saturating_add(inactive) <= 0 {
                return Err(a.bad(format!(
                    "the alter policy needs active_period >= 0 and inactive_period >= 0, not both 0, got {active} and {inactive}"
                )));
            }
            Policy::Alter {
                active_first: a.args.bool(&format!("{}active_first", a.prefix), true)?,
                active,
                inactive,
            }
        }
        "hill" => {
            let (start, end) = (a.f("start_multiplier", 0.0)?, a.f("end_multiplier", 0.0)?);
            if !(0.0..=1.0).contains(&start) || !(0.0..=1.0).contains(&end) {
                return Err(a.bad(format!(
                    "the hill policy needs start_multiplier and end_multiplier in [0, 1], got {start} and {end}"
                )));
            }
            Policy::Hill {
                num_iter: a.positive("num_iter", a.i("num_iter", 0)?, "hill")?,
                start,
                gamma: a.f("gamma", 0.0)?,
                power: a.f("power", 0.0)?,
                end,
            }
        }
        "slope" => {
            let (n1, n2) = (a.i("num_iter_1", 0)?, a.i("num_iter_2", 0)?);
            if n2 <= n1 {
                return Err(a.bad(format!(
                    "the slope policy needs num_iter_2 > num_iter_1, got {n2} and {n1}"
                )));
            }
            Policy::Slope {
                n1,
                m1: a.f("multiplier_1", 1.0)?,
                n2,
                m2: a.f("multiplier_2", 1.0)?,
            }
        }
        "gate" => Policy::Gate {
            m1: a.f("multiplier_1", 1.0)?,
            m2: a.f("multiplier_2", 1.0)?,
            num_iter: a.i("num_iter", 0)?,
        },
        "linearWarmup" => Policy::LinearWarmup {
            start: a.f("start_multiplier", 0.0)?,
            num_iter: a.i("num_iter", 0)?,
        },
        "constantWarmup" => Policy::ConstantWarmup {
            multiplier: a.f("multiplier", 0.5)?,
            num_iter: a.i("num_iter", 0)?,
        },
        "pieceWarmup" => Policy::PieceWarmup {
            m1: a.f("m1", 0.5)?,
            n1: a.i("n1", 0)?,
            m2: a.f("m2", 0.5)?,
            n2: a.i("n2", 0)?,
            m3: a.f("m3", 0.5)?,
        },
        "cyclical" => Policy::Cyclical(cyclical(
            a.f("max_lr", 0.005)?,
            a.positive("stepsize", a.i("stepsize", 0)?, "cyclical")?,
            a.f("decay", 1.0)?,
        )?),
        "cosine" => Policy::Cosine(cosine(
            a.f("min_lr", 0.1)?,
            a.f("max_lr", 0.5)?,
            a.positive("period", a.i("period", 50)?, "cosine")?,
            a.f("t_mult", 1.0)?,
            a.f("lr_shrink", 0.99)?,
        )?),
        "constantThenLinearWarmup" => Policy::Warmup(warmup()?),
        "compositeCyclical" => Policy::CompositeCyclical(
            warmup()?,
            cyclical(
                a.f("cyclical_max_lr", 0.05)?,
                a.positive(
                    "cyclical_step_size",
                    a.i("cyclical_step_size", 1_000_000)?,
                    "compositeCyclical",
                )?,
                a.f("cyclical_decay", 1.0)?,
            )?,
        ),
        "compositeCosine" => Policy::CompositeCosine(
            warmup()?,
            cosine(
                a.f("cosine_min_lr", 0.01)?,
                a.f("cosine_max_lr", 0.05)?,
                a.positive(
                    "cosine_period",
                    a.i("cosine_period", 50)?,
                    "compositeCosine",
                )?,
                a.f("cosine_t_mult", 1.0)?,
                a.f("cosine_lr_shrink", 0.99)?,
            )?,
        ),
        "composite" => {
            if !a.prefix.is_empty() {
                return Err(a.bad(
                    "a composite policy cannot be a sub-policy of a composite policy".into(),
                ));
            }
            let iters = a.args.ints("sub_policy_num_iters")?.unwrap_or_default();
            if iters.is_empty() {
                return Err(a.bad(
                    "the composite policy needs at least one sub-policy (sub_policy_num_iters)"
                        .into(),
                ));
            }
            let mut subs = Vec::with_capacity(iters.len());
            let mut start = 1i64;
            for (i, &n) in iters.iter().enumerate() {
                if n <= 0 {
                    return Err(a.bad(format!(
                        "sub_policy_num_iters must be positive, got {n} for sub-policy {i}"
                    )));
                }
                let sub = PolicyArgs {
                    args: a.args,
                    prefix: format!("sub_policy_{i}_"),
                    ctx: a.ctx,
                };
                let name = a.args.string(&format!("{}policy", sub.prefix), "")?;
                let scale = sub.f("lr_scale", 1.0)?;
                subs.push((start, scale, parse_policy(&sub, &name, base_lr)?));
                start = start.saturating_add(n);
            }
            Policy::Composite(subs)
        }
        "" => return Err(a.bad("must specify a learning rate policy".into())),
        other => {
            return Err(a.bad(format!(
                "unknown learning rate policy: {other} ({POLICIES})"
            )))
        }
    })
}

fn build_lr(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    // Undeclared: a composite's sub-policies read prefixed names.
    let args = crate::args::Args::new(ctx.op_type(), &ctx.def.arg)?;
    let base_lr = args
        .f32_opt("base_lr")?
        .ok_or_else(|| ctx.bad_arg("LearningRate: base_lr is required"))?;
    let policy = args
        .string_opt("policy")?
        .ok_or_else(|| ctx.bad_arg("LearningRate: must specify a learning rate policy"))?;
    let top = PolicyArgs {
        args: &args,
        prefix: String::new(),
        ctx,
    };
    let p = parse_policy(&top, &policy, base_lr)?;
    let scale = if policy == "composite" {
        1.0
    } else {
        top.f("lr_scale", 1.0)?
    };
    let base = f64::from(base_lr) * scale;
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
        let lr = (base * p.multiplier(iter)) as f32;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_picks_the_sub_policy_by_range_and_feeds_the_global_iteration() {
        let p = Policy::Composite(vec![
            (1, 2.0, Policy::Fixed),
            (4, 0.5, Policy::Exp { gamma: 0.5 }),
        ]);
        // Iteration 0 precedes every range: the first sub-policy.
        assert_eq!(p.multiplier(0), 2.0);
        assert_eq!(p.multiplier(3), 2.0);
        // From 4 on: 0.5 * 0.5^iter (the global iteration, not iter - 4).
        assert_eq!(p.multiplier(4), 0.5 * 0.5f64.powi(4));
        assert_eq!(p.multiplier(100), 0.5 * 0.5f64.powi(100));
    }

    #[test]
    fn alter_slope_and_cyclical_by_hand() {
        let alter = Policy::Alter {
            active_first: true,
            active: 2,
            inactive: 3,
        };
        let got: Vec<f64> = (0..6).map(|i| alter.multiplier(i)).collect();
        assert_eq!(got, vec![1.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
        let slope = Policy::Slope {
            n1: 10,
            m1: 1.0,
            n2: 20,
            m2: 0.5,
        };
        assert_eq!(slope.multiplier(5), 1.0);
        assert_eq!(slope.multiplier(15), 0.75);
        assert_eq!(slope.multiplier(30), 0.5);
        let cyc = Policy::Cyclical(Cyclical {
            ratio: 3.0,
            stepsize: 2,
            decay: 1.0,
        });
        let got: Vec<f64> = (0..5).map(|i| cyc.multiplier(i)).collect();
        assert_eq!(got, vec![1.0, 2.0, 3.0, 2.0, 1.0]);
    }
}
