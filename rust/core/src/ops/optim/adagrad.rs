//! Adagrad and its relatives: Adagrad, SparseAdagrad, RowWiseSparseAdagrad,
//! DecayAdagrad (with a bias-corrected first moment and weight decay) and
//! RowWiseCounter (row-wise Adagrad's decayed count of each row's
//! updates).

#![allow(clippy::result_large_err)]

use super::common::*;
use crate::arg;
use crate::error::{Error, Result};
use crate::operator::{InPlace, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::kernel;
use crate::ops::kit::{checked_rows, f32_in, indices};
use crate::tensor::Tensor;
use ndarray::ArrayD;

pub fn schemas() -> Vec<OpSchema> {
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
            "g += weight_decay * freq * param (of the row) before the update"
        ),
        arg!(
            "counter_halflife",
            "int",
            "-1",
            "> 0: freq = counter_halflife / count[row] for a row whose count (the optional input 5, RowWiseCounter's update_counter) is > 0, else 1"
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
            .inputs(5, 6)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(SPARSE_ARGS)
            .doc("Inputs (param, moment, indices, grad, lr[, count]), outputs (param, moment) in place (float32; count float64 or float32, one per row of param): Adagrad on the rows of param at the indices, grad holding one row per index (applied in order; duplicates update twice), g = grad + weight_decay * freq * param (freq from counter_halflife and count, else 1)."),
        OpSchema::new("RowWiseSparseAdagrad", build_sparse_adagrad)
            .inputs(5, 6)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(SPARSE_ARGS)
            .doc("Inputs (param, moment (1-D, one per row of param), indices, grad, lr[, count]), outputs (param, moment) in place (float32): g = grad + weight_decay * freq * param[r] (freq as SparseAdagrad's), moment[r] += mean(g^2) over the row, param[r] += lr * g / (sqrt(moment[r]) + epsilon)."),
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
        OpSchema::new("RowWiseCounter", build_row_counter)
            .inputs(4, 4)
            .outputs(2, 2)
            .inplace(InPlace::Enforce(adagrad_in_place))
            .args(&[arg!("counter_halflife", "int", "-1", "iterations for a count to halve; <= 0 turns the op off")])
            .doc("Inputs (prev_iter int64, update_counter float64, indices, iter int64 [1]), outputs (prev_iter, update_counter) in place: for each index in order, counter = 1 + 2^(-max(0, iter - prev_iter) / counter_halflife) * counter and prev_iter = max(iter, prev_iter)."),
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
    let halflife = ctx.args.i64("counter_halflife", -1)?;
    if halflife > 0 && ctx.num_inputs() < 6 {
        return Err(ctx.bad_arg(format!(
            "counter_halflife {halflife} > 0 needs the count input (input 5, RowWiseCounter's update_counter)"
        )));
    }
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
        let (idx, _) = indices(&l, op, 2)?;
        let rows = checked_rows(op, &idx, nrows, false, l.input_name(2))?;
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
        let count: Option<Vec<f64>> = if halflife > 0 {
            let c: Vec<f64> = match l.tensor(5)? {
                Tensor::F64(a) => crate::tensor::try_collect(a.iter().copied(), "a kernel buffer")?,
                Tensor::F32(a) => {
                    crate::tensor::try_collect(a.iter().map(|&v| f64::from(v)), "a kernel buffer")?
                }
                t => {
                    return Err(Error::type_error(format!(
                        "{op}: the count ('{}') must be a float64 or float32 tensor, got {}",
                        l.input_name(5),
                        t.dtype()
                    ))
                    .with_blob(l.input_name(5)))
                }
            };
            if c.len() != nrows {
                return Err(Error::shape(format!(
                    "{op}: the count ('{}', {} elements) must have one value per row of the parameter ({nrows})",
                    l.input_name(5),
                    c.len()
                ))
                .with_blob(l.input_name(5)));
            }
            Some(c)
        } else {
            None
        };
        let shape_p = p.shape().to_vec();
        let shape_m = m.shape().to_vec();
        let mut pv: Vec<f32> = crate::tensor::try_collect(p.iter().copied(), "a kernel buffer")?;
        let mut mv: Vec<f32> = crate::tensor::try_collect(m.iter().copied(), "a kernel buffer")?;
        let gv: Vec<f32> = crate::tensor::try_collect(g.iter().copied(), "a kernel buffer")?;
        for (i, &r) in rows.iter().enumerate() {
            // A row seen less often than once per half-life decays more.
            let freq = match &count {
                Some(c) if c[r] > 0.0 => (halflife as f64 / c[r]) as f32,
                _ => 1.0,
            };
            let wdr = wd * freq;
            let gs: Vec<f32> = crate::tensor::try_collect(
                (0..block).map(|j| gv[i * block + j] + wdr * pv[r * block + j]),
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
        let (idx, _) = indices(&l, OP, 2)?;
        let rows = checked_rows(OP, &idx, counter.len(), false, l.input_name(2))?;
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
