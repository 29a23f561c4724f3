//! `ElementwiseLinear`: Y = X * a + b with one scale and one shift per
//! feature (X flattened to N x D at `axis`; a and b of length D), and its
//! gradient (Caffe2's; the multiplicative-integration LSTM cell uses it).

use crate::arg;
use crate::error::{Error, Result};
use crate::num::Float;
use crate::operator::{Locked, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::{array, canonical_axis, dense, float_kernel, input, split_at};

const ARGS: &[crate::operator::ArgDoc] = &[arg!(
    "axis",
    "int",
    "1",
    "X is flattened to N x D at this dim"
)];

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("ElementwiseLinear", build)
            .inputs(3, 3)
            .outputs(1, 1)
            .args(ARGS)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Inputs (X, a, b): Y[n, d] = X[n, d] * a[d] + b[d], X flattened to N x D at axis."),
        OpSchema::new("ElementwiseLinearGradient", build_grad)
            .inputs(3, 3)
            .outputs(3, 3)
            .args(ARGS)
            .doc("Gradient of ElementwiseLinear. Inputs (dY, X, a); outputs (dX = dY * a, da = sum over n of dY * X, db = sum over n of dY)."),
    ]
}

/// (N, D) of input 1 (X) or 0, checking a's (and b's) length.
fn dims(l: &Locked<'_>, op: &str, x: usize, params: &[usize], axis: i64) -> Result<(usize, usize)> {
    let shape = l.tensor(x)?.shape().to_vec();
    let ax = canonical_axis(op, "axis", axis, shape.len(), l.input_name(x))?;
    let (n, d) = split_at(&shape, ax);
    for &p in params {
        if l.tensor(p)?.numel() != d {
            return Err(Error::shape(format!(
                "{op}: '{}' must have {d} values (X's dims from axis {ax}), got shape {:?}",
                l.input_name(p),
                l.tensor(p)?.shape()
            ))
            .with_blob(l.input_name(p)));
        }
    }
    Ok((n, d))
}

fn forward_t<T: Float>(l: &mut Locked<'_>, axis: i64) -> Result<()> {
    let op = "ElementwiseLinear";
    let (n, d) = dims(l, op, 0, &[1, 2], axis)?;
    let shape = l.tensor(0)?.shape().to_vec();
    let (x, a, b) = (
        dense(input::<T>(l, op, 0)?),
        dense(input::<T>(l, op, 1)?),
        dense(input::<T>(l, op, 2)?),
    );
    let mut y = crate::tensor::zeroed_vec::<T>(&shape, "ElementwiseLinear's output")?;
    for r in 0..n {
        for k in 0..d {
            y[r * d + k] = x[r * d + k] * a[k] + b[k];
        }
    }
    let y = array(&shape, y)?;
    l.set_output(0, T::wrap(y));
    Ok(())
}

fn build(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    float_kernel!("ElementwiseLinear", 0, |l| forward_t(&mut l, axis))
}

fn grad_t<T: Float>(l: &mut Locked<'_>, axis: i64) -> Result<()> {
    let op = "ElementwiseLinearGradient";
    let (n, d) = dims(l, op, 1, &[2], axis)?;
    let shape = l.tensor(1)?.shape().to_vec();
    if l.tensor(0)?.shape() != shape.as_slice() {
        return Err(Error::shape(format!(
            "{op}: dY (shape {:?}) must have X's shape {shape:?}",
            l.tensor(0)?.shape()
        )));
    }
    let (g, x, a) = (
        dense(input::<T>(l, op, 0)?),
        dense(input::<T>(l, op, 1)?),
        dense(input::<T>(l, op, 2)?),
    );
    let mut dx = crate::tensor::zeroed_vec::<T>(&shape, "dX")?;
    let mut da = crate::tensor::zeroed_vec::<T>(&[d], "da")?;
    let mut db = crate::tensor::zeroed_vec::<T>(&[d], "db")?;
    for r in 0..n {
        for k in 0..d {
            let gv = g[r * d + k];
            dx[r * d + k] = gv * a[k];
            da[k] += gv * x[r * d + k];
            db[k] += gv;
        }
    }
    let a_shape = l.tensor(2)?.shape().to_vec();
    let (dx, da, db) = (
        array(&shape, dx)?,
        array(&a_shape, da)?,
        array(&a_shape, db)?,
    );
    l.set_output(0, T::wrap(dx));
    l.set_output(1, T::wrap(da));
    l.set_output(2, T::wrap(db));
    Ok(())
}

fn build_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let axis = ctx.args.i64("axis", 1)?;
    float_kernel!("ElementwiseLinearGradient", 1, |l| grad_t(&mut l, axis))
}
