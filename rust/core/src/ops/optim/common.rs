//! What the optimizers share: their in-place rules, typed access to
//! their float32 state and scalars, the sparse rows an update touches and
//! the iteration counter.

#![allow(clippy::result_large_err)]

use crate::error::{Error, Result};
use crate::operator::Locked;
use crate::ops::kit::{checked_rows, f32_in, indices};
use crate::tensor::Tensor;
use ndarray::ArrayD;

/// MomentumSGDUpdate: (grad, moment, lr, param) -> (grad, moment, param).
pub(super) fn momentum_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (3, 2))
}

/// SparseMomentumSGDUpdate updates moment and param in place; its
/// gradient output may be another blob (as Caffe2's).
pub(super) fn sparse_momentum_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (1, 1) | (3, 2))
}

/// Outputs 0, 1 and 2 over inputs 0, 1 and 2: Adam's (param, moment_1,
/// moment_2, ...), RmsProp's (grad, mean_squares, mom, lr) and Adadelta's
/// (param, moment, moment_delta, ...) state.
pub(super) fn adam_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (2, 2))
}

// ------------------------------------------------------- Adagrad family --

/// Adagrad and the sparse ones: param and moment are updated in place.
pub(super) fn adagrad_in_place(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1))
}

pub(super) fn yf_in_place(i: usize, o: usize) -> bool {
    i == o && i < 8
}

pub(super) fn first_three(i: usize, o: usize) -> bool {
    matches!((i, o), (0, 0) | (1, 1) | (2, 2))
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
    let (idx, _) = indices(l, op, ii)?;
    let rows = checked_rows(op, &idx, p.shape()[0], false, l.input_name(ii))?;
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
pub(super) fn dense_grad(l: &Locked<'_>, op: &str, gi: usize) -> Result<Vec<f32>> {
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
    Ok(crate::tensor::try_collect(
        g.iter().copied(),
        "a kernel buffer",
    )?)
}

/// Sum of squares, accumulated in float64.
pub(super) fn sum_sq(g: &[f32]) -> f64 {
    g.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
}
