//! Arithmetic: Add, Sub, Mul and Div (with broadcasting), Sum, Max and
//! Min (and their gradients), WeightedSum, Scale and ScaleBlobs.

#![allow(clippy::result_large_err)]

use super::loops::*;
use crate::arg;
use crate::error::{Error, ErrorKind, Result};
use crate::num::Number;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator, MANY};
use crate::ops::kernel;
use crate::tensor::{copy_array, DataType, Element, Tensor};
use ndarray::{ArrayD, CowArray, IxDyn};
use smallvec::SmallVec;

pub fn schemas() -> Vec<OpSchema> {
    let ab = InPlace::Allow(in_place_a_or_b);
    let a = InPlace::Allow(in_place_a);
    vec![
        arith_schema("Add", ab, "C = A + B elementwise (int32, int64, float32, float64; integers wrap), with broadcasting."),
        arith_schema("Sub", ab, "C = A - B elementwise (int32, int64, float32, float64; integers wrap), with broadcasting."),
        arith_schema("Mul", ab, "C = A * B elementwise (int32, int64, float32, float64; integers wrap), with broadcasting."),
        arith_schema(
            "Div",
            a,
            "C = A / B elementwise (int32, int64, float32, float64); integers truncate toward zero and a zero divisor is an error.",
        ),
        OpSchema::new("Sum", build_sum)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(a)
            .doc("Y = X0 + X1 + ... of tensors with one dtype (float32, float64, int32, int64) and identical shapes (no broadcasting); one input is a copy."),
        OpSchema::new("Max", build_min_max::<true>)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(a)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = the elementwise largest of X0, X1, ... (float32, float64, int32, int64; one dtype, identical shapes, no broadcasting). A NaN in X0 stays; a later one does not replace a number."),
        OpSchema::new("Min", build_min_max::<false>)
            .inputs(1, MANY)
            .outputs(1, 1)
            .inplace(a)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = the elementwise smallest of X0, X1, ... (as Max)."),
        OpSchema::new("MaxGradient", build_min_max_grad)
            .inputs(3, MANY)
            .outputs(1, MANY)
            .doc("Inputs (Y, dY, X0, X1, ...) of Max, outputs (dX0, dX1, ...): dXi = dY where Xi equals Y, else 0 (every input equal to the max gets the whole gradient, as Caffe2)."),
        OpSchema::new("MinGradient", build_min_max_grad)
            .inputs(3, MANY)
            .outputs(1, MANY)
            .doc("Inputs (Y, dY, X0, X1, ...) of Min, outputs (dX0, dX1, ...): dXi = dY where Xi equals Y, else 0."),
        OpSchema::new("WeightedSum", build_weighted_sum)
            .inputs(2, MANY)
            .outputs(1, 1)
            .inplace(a)
            .ignores(&[arg!(
                "grad_on_w",
                "bool",
                "false",
                "whether the gradient op computes the weights' gradients; accepted and ignored (no gradients here)"
            )])
            .doc("Y = w0*X0 + w1*X1 + ... for inputs (X0, w0, X1, w1, ...): float32 tensors with X0's element count and 1-element float32 weights; Y has X0's shape."),
        OpSchema::new("Scale", build_scale)
            .inputs(1, 1)
            .outputs(1, 1)
            .inplace(a)
            .args(&[arg!("scale", "float", "1.0", "the factor to multiply by")])
            .doc("Y = scale * X elementwise for a float32 or float64 tensor."),
        OpSchema::new("ScaleBlobs", build_scale_blobs)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Allow(same_position))
            .args(&[arg!("scale", "float", "1.0", "the factor to multiply by")])
            .doc("Y_i = scale * X_i for each of n inputs and n outputs (float32 or float64 tensors); Y_i may be X_i."),
    ]
}

/// An arithmetic binary op: its output has A's type.
fn arith_schema(name: &'static str, inplace: InPlace, doc: &'static str) -> OpSchema {
    binary_schema_typed(name, build_arith, inplace, doc, binary_infer::<false>)
}

// ----------------------------------------------------------- arithmetic ops --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// Rejects a zero integer divisor (every element of B is used when the
/// result is not empty).
fn check_divisor<T: Number>(l: &Locked<'_>, p: &Prep) -> Result<()> {
    if !T::INT || p.numel == 0 {
        return Ok(());
    }
    if arr::<T>(l, 1)?.iter().any(|&x| x.is_zero()) {
        return Err(Error::new(
            ErrorKind::DivisionByZero,
            format!(
                "Div: integer division by zero: the divisor B ('{}') contains 0",
                l.input_name(1)
            ),
        )
        .with_blob(l.input_name(1)));
    }
    Ok(())
}

fn arith_t<T: Number>(l: &mut Locked<'_>, p: &Prep, op: Arith) -> Result<()> {
    match op {
        Arith::Add => exec_same::<T, _>(l, p, |a, b| a.wrapping_plus(b)),
        Arith::Sub => exec_same::<T, _>(l, p, |a, b| a.wrapping_minus(b)),
        Arith::Mul => exec_same::<T, _>(l, p, |a, b| a.wrapping_times(b)),
        Arith::Div => {
            check_divisor::<T>(l, p)?;
            exec_same::<T, _>(l, p, |a, b| a.wrapping_over(b))
        }
    }
}

/// A binary op's kernel: lock its blobs, check dtypes and broadcast shapes
/// (`prepare`), then `exec` for the inputs' dtype.
fn build_arith(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "Add" => (Arith::Add, "Add"),
        "Sub" => (Arith::Sub, "Sub"),
        "Mul" => (Arith::Mul, "Mul"),
        "Div" => (Arith::Div, "Div"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not an arithmetic op"))),
    };
    binary_kernel(ctx, name, ARITH_TYPES, move |l, p| {
        crate::with_match_dtype!(arith p.dtype, |T| arith_t::<T>(l, p, op),
            else other => Err(unsupported(name, other, ARITH_TYPES)))
    })
}

// ---------------------------------------------------------------------- Sum --

fn sum_t<T: Number>(l: &mut Locked<'_>, n: usize) -> Result<()> {
    let add = |a: T, b: T| a.wrapping_plus(b);
    let in_place = l.aliases(0, 0);
    with_taken_output(l, |l, o| {
        let mut next = 1;
        if !in_place {
            let x0 = arr::<T>(l, 0)?;
            if n == 1 {
                return write_unary(o, x0.view(), |x| x);
            }
            let x1 = arr::<T>(l, 1)?;
            write_binary(o, Operand::own(x0), Operand::own(x1), x0.shape(), add)?;
            next = 2;
        }
        let y = out_array::<T>(o).map_err(|e| e.with_blob(l.output_name(0)))?;
        for i in next..n {
            update(y, Operand::own(arr::<T>(l, i)?), add)?;
        }
        Ok(())
    })
}

fn sum(l: &mut Locked<'_>, n: usize) -> Result<()> {
    let x0 = l.tensor(0)?;
    let dtype = x0.dtype();
    let n0 = l.input_name(0);
    if !SUM_TYPES.contains(&dtype) {
        return Err(unsupported("Sum", dtype, SUM_TYPES).with_blob(n0));
    }
    for i in 1..n {
        let xi = l.tensor(i)?;
        let ni = l.input_name(i);
        if xi.dtype() != dtype {
            return Err(Error::type_error(format!(
                "Sum: all inputs must have the same dtype, but input 0 ('{n0}') is {dtype} and input {i} ('{ni}') is {}. {}",
                xi.dtype(),
                dtype_fix((n0, dtype), (ni, xi.dtype()))
            ))
            .with_blob(ni));
        }
        if xi.shape() != x0.shape() {
            return Err(Error::shape(format!(
                "Sum: all inputs must have identical shapes (no broadcasting), but input 0 ('{n0}') has shape {:?} \
                 and input {i} ('{ni}') has shape {:?}",
                x0.shape(),
                xi.shape()
            ))
            .with_blob(ni));
        }
    }
    crate::with_match_dtype!(arith dtype, |T| sum_t::<T>(l, n),
        else other => Err(unsupported("Sum", other, SUM_TYPES)))
}

fn build_sum(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        sum(&mut l, n)?;
        Ok(true)
    }))
}

// ------------------------------------------------------------- Max / Min --

const MIN_MAX_TYPES: &[DataType] = SUM_TYPES;

/// Checks that inputs `from..n` are tensors of input `from`'s dtype (one of
/// `types`) and shape, naming `op`.
fn check_alike(l: &Locked<'_>, op: &str, from: usize, n: usize, types: &[DataType]) -> Result<()> {
    let x0 = l.tensor(from)?;
    let n0 = l.input_name(from);
    if !types.contains(&x0.dtype()) {
        return Err(unsupported(op, x0.dtype(), types).with_blob(n0));
    }
    for i in from + 1..n {
        let xi = l.tensor(i)?;
        let ni = l.input_name(i);
        if xi.dtype() != x0.dtype() {
            return Err(Error::type_error(format!(
                "{op}: all inputs must have the same dtype, but input {from} ('{n0}') is {} and input {i} ('{ni}') is {}. {}",
                x0.dtype(),
                xi.dtype(),
                dtype_fix((n0, x0.dtype()), (ni, xi.dtype()))
            ))
            .with_blob(ni));
        }
        if xi.shape() != x0.shape() {
            return Err(Error::shape(format!(
                "{op}: all inputs must have identical shapes (no broadcasting), but input {from} ('{n0}') has shape {:?} \
                 and input {i} ('{ni}') has shape {:?}",
                x0.shape(),
                xi.shape()
            ))
            .with_blob(ni));
        }
    }
    Ok(())
}

fn min_max_t<T: Element + PartialOrd + Copy, const MAX: bool>(
    l: &Locked<'_>,
    n: usize,
) -> Result<Tensor> {
    let mut y = copy_array(l.tensor(0)?.array::<T>()?.view())?;
    for i in 1..n {
        let x = l.tensor(i)?.array::<T>()?;
        y.zip_mut_with(x, |a, &b| {
            if (MAX && b > *a) || (!MAX && b < *a) {
                *a = b;
            }
        });
    }
    Ok(T::wrap(y))
}

fn build_min_max<const MAX: bool>(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = if MAX { "Max" } else { "Min" };
    Ok(kernel(move |cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        check_alike(&l, op, 0, n, MIN_MAX_TYPES)?;
        let y = crate::with_match_dtype!(arith l.tensor(0)?.dtype(), |T| min_max_t::<T, MAX>(&l, n),
            else other => Err(unsupported(op, other, MIN_MAX_TYPES)))?;
        l.set_output(0, y);
        Ok(true)
    }))
}

fn min_max_grad_t<T: Element + PartialEq + Copy + Default>(
    l: &Locked<'_>,
    n: usize,
) -> Result<Vec<Tensor>> {
    let y = l.tensor(0)?.array::<T>()?;
    let dy = l.tensor(1)?.array::<T>()?;
    (2..n)
        .map(|i| {
            let x = l.tensor(i)?.array::<T>()?;
            let mut g = copy_array(dy.view())?;
            ndarray::Zip::from(&mut g)
                .and(x)
                .and(y)
                .for_each(|g, &x, &y| {
                    if x != y {
                        *g = T::default();
                    }
                });
            Ok(T::wrap(g))
        })
        .collect()
}

fn build_min_max_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let op = ctx.op_type().to_string();
    if ctx.num_outputs() + 2 != ctx.num_inputs() {
        return Err(ctx.bad_arg(format!(
            "{op} takes (Y, dY, X0, ..., Xn-1) and gives one gradient per X: {} inputs need {} outputs, got {}",
            ctx.num_inputs(),
            ctx.num_inputs().saturating_sub(2),
            ctx.num_outputs()
        )));
    }
    Ok(kernel(move |cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        check_alike(&l, &op, 0, n, MIN_MAX_TYPES)?;
        let grads = crate::with_match_dtype!(arith l.tensor(0)?.dtype(), |T| min_max_grad_t::<T>(&l, n),
            else other => Err(unsupported(&op, other, MIN_MAX_TYPES)))?;
        for (o, g) in grads.into_iter().enumerate() {
            l.set_output(o, g);
        }
        Ok(true)
    }))
}

// -------------------------------------------------------------- WeightedSum --

/// Checks every input and returns the weights, before anything is written.
fn weighted_sum_weights(l: &Locked<'_>, n: usize) -> Result<SmallVec<[f32; 8]>> {
    let x0 = l.tensor(0)?;
    let n0 = l.input_name(0);
    if x0.dtype() != DataType::Float {
        return Err(unsupported("WeightedSum", x0.dtype(), &[DataType::Float]).with_blob(n0));
    }
    let mut w = SmallVec::new();
    for k in 0..n / 2 {
        let (xi, wi) = (2 * k, 2 * k + 1);
        if k > 0 {
            let x = l.tensor(xi)?;
            let name = l.input_name(xi);
            if x.dtype() != DataType::Float {
                return Err(Error::type_error(format!(
                    "WeightedSum: X{k} ('{name}') must be a float32 tensor like X0, got {}. To fix: {}",
                    x.dtype(),
                    DataType::Float.conversion_hint(name)
                ))
                .with_blob(name));
            }
            if x.numel() != x0.numel() {
                return Err(Error::shape(format!(
                    "WeightedSum: X{k} ('{name}', shape {:?}) must have as many elements as X0 ('{n0}', shape {:?})",
                    x.shape(),
                    x0.shape()
                ))
                .with_blob(name));
            }
        }
        let wt = l.tensor(wi)?;
        let name = l.input_name(wi);
        if wt.dtype() != DataType::Float {
            return Err(Error::type_error(format!(
                "WeightedSum: weight w{k} ('{name}') must be a float32 tensor, got {}. To fix: {}",
                wt.dtype(),
                DataType::Float.conversion_hint(name)
            ))
            .with_blob(name));
        }
        if wt.numel() != 1 {
            return Err(Error::shape(format!(
                "WeightedSum: weight w{k} ('{name}') must have exactly one element, got shape {:?}",
                wt.shape()
            ))
            .with_blob(name));
        }
        w.push(wt.scalar_value::<f32>().map_err(|e| e.with_blob(name))?);
    }
    Ok(w)
}

fn flat(a: &ArrayD<f32>) -> CowArray<'_, f32, IxDyn> {
    a.as_standard_layout()
}

fn slice_of<'a>(c: &'a CowArray<'_, f32, IxDyn>) -> Result<&'a [f32]> {
    c.as_slice()
        .ok_or_else(|| bug("a standard-layout copy is not contiguous"))
}

/// Y = w0*X0 + w1*X1 + ..., computed as Caffe2 did: Y = w1*X1 + w0*X0, then
/// Y += wi*Xi for i >= 2 (with 2 inputs, Y = w0*X0).
fn weighted_sum(l: &mut Locked<'_>, n: usize) -> Result<()> {
    let w = weighted_sum_weights(l, n)?;
    let in_place = l.aliases(0, 0);
    with_taken_output(l, |l, o| {
        let w0 = w[0];
        let ys: &mut [f32] = if in_place {
            let y = out_array::<f32>(o).map_err(|e| e.with_blob(l.output_name(0)))?;
            let ys = std_slice_mut(y)?;
            if n == 2 {
                upd0(ys, move |v| w0 * v);
                return Ok(());
            }
            let x1 = flat(arr::<f32>(l, 2)?);
            let w1 = w[1];
            upd1_rep(ys, slice_of(&x1)?, move |y, x| w1 * x + w0 * y);
            ys
        } else {
            let x0 = arr::<f32>(l, 0)?;
            if n == 2 {
                return write_unary(o, x0.view(), move |x| w0 * x);
            }
            let (x0f, x1f) = (flat(x0), flat(arr::<f32>(l, 2)?));
            let ys = out_slice::<f32>(o, x0.shape())?;
            let w1 = w[1];
            map2(ys, slice_of(&x1f)?, slice_of(&x0f)?, move |x, y| {
                w1 * x + w0 * y
            });
            ys
        };
        for k in 2..n / 2 {
            let xk = flat(arr::<f32>(l, 2 * k)?);
            let wk = w[k];
            upd1_rep(ys, slice_of(&xk)?, move |y, x| wk * x + y);
        }
        Ok(())
    })
}

fn build_weighted_sum(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let n = ctx.num_inputs();
    if n == 0 || n % 2 != 0 {
        return Err(ctx.bad_arg(format!(
            "operator def did not pass schema checking: WeightedSum takes an even number of inputs \
             (X0, w0, X1, w1, ...), got {n}"
        )));
    }
    Ok(kernel(|cx| {
        let n = cx.num_inputs();
        let mut l = cx.lock();
        weighted_sum(&mut l, n)?;
        Ok(true)
    }))
}

// -------------------------------------------------------------------- Scale --

fn build_scale(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let s = ctx.args.f32("scale", 1.0)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        crate::with_match_dtype!(floats unary_dtype(&l, "Scale", SCALE_TYPES)?, |T| {
            let s = T::from(s);
            unary_same::<T, _>(&mut l, move |x| x * s)
        }, else other => Err(unsupported("Scale", other, SCALE_TYPES)))?;
        Ok(true)
    }))
}

fn same_position(i: usize, o: usize) -> bool {
    i == o
}

fn build_scale_blobs(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (ni, no) = (ctx.num_inputs(), ctx.num_outputs());
    if ni != no {
        return Err(ctx.bad_arg(format!(
            "operator def did not pass schema checking: ScaleBlobs takes as many outputs as inputs, got {ni} inputs and {no} outputs"
        )));
    }
    let s = ctx.args.f32("scale", 1.0)?;
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        // Every input is read before any output is written, so outputs
        // that name other inputs see the old values.
        let mut outs = Vec::with_capacity(ni);
        for i in 0..ni {
            let t = l.tensor(i)?;
            let name = l.input_name(i);
            // Copies allocated fallibly, then scaled in place.
            let y = crate::with_match_dtype!(tensor floats t, |a: T| {
                let s = T::from(s);
                let mut y = copy_array(a.view()).map_err(|e| e.with_blob(name))?;
                y.mapv_inplace(|x| x * s);
                Tensor::from(y)
            }, else other => {
                return Err(unsupported("ScaleBlobs", other.dtype(), SCALE_TYPES).with_blob(name))
            });
            outs.push(y);
        }
        for (j, y) in outs.into_iter().enumerate() {
            l.set_output(j, y);
        }
        Ok(true)
    }))
}
