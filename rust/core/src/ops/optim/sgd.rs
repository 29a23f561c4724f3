//! Momentum SGD: MomentumSGDUpdate, MomentumSGD, SparseMomentumSGDUpdate,
//! FP32MomentumSGDUpdate and FP16MomentumSGDUpdate (with weight decay, on
//! float32 or float16 data) and YellowFin (tuning its own rate and
//! momentum). Plain SGD is WeightedSum (`elementwise/arith.rs`), its sparse
//! form ScatterWeightedSum (`sparse.rs`).

#![allow(clippy::result_large_err)]

use super::common::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::f32_in;
use crate::ops::kit::kernel;
use crate::tensor::Tensor;

pub fn schemas() -> Vec<OpSchema> {
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
    ]
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
