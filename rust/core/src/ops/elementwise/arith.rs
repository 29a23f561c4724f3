//! Arithmetic: Add, Sub, Mul and Div (with broadcasting), Sum, Max and
//! Min (and their gradients), WeightedSum, Scale and ScaleBlobs.

#![allow(clippy::result_large_err)]

use super::loops::*;
use crate::arg;
use crate::error::{Error, ErrorKind, Result};
use crate::num::Float;
use crate::num::Number;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator, MANY};
use crate::ops::kit::kernel;
use crate::ops::kit::{array, dense, float_kernel, in_place_0_0, in_place_0_or_1, input, padded};
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

// ------------------------------------------- from nn.rs (issue 14) --

/// The gradients of Add, Sub, Mul and Div, Pow (and its gradient) and
/// WeightedSumGradient: float32 or float64, computed into new buffers.
pub fn grad_schemas() -> Vec<OpSchema> {
    const BCAST: &[crate::operator::ArgDoc] = &[
        arg!("broadcast", "int", "0", "as the forward op's broadcast"),
        arg!(
            "axis",
            "int",
            "A.ndim - B.ndim",
            "as the forward op's axis (legacy broadcasting)"
        ),
        arg!(
            "axis_str",
            "string",
            "\"\"",
            "as the forward op's axis_str (legacy broadcasting)"
        ),
        arg!(
            "order",
            "string",
            "\"NCHW\"",
            "as the forward op's order (legacy broadcasting)"
        ),
    ];
    const POW_ARGS: &[crate::operator::ArgDoc] = &[
        arg!(
            "exponent",
            "float",
            "(none)",
            "the exponent, when there is no second input"
        ),
        arg!(
            "broadcast",
            "int",
            "0",
            "non-zero: Caffe2's legacy broadcast: the exponent input's shape is a run of X's dims (from axis), each equal or 1"
        ),
        arg!(
            "axis",
            "int",
            "-1",
            "with broadcast: the X dim the exponent's first dim lines up with (-1: its last dims line up with X's)"
        ),
    ];
    let binary_grad = |name: &'static str, doc: &'static str| {
        OpSchema::new(name, build_binary_grad)
            .inputs(3, 3)
            .outputs(2, 2)
            .inplace(InPlace::Allow(allow_0_any))
            .args(BCAST)
            .doc(doc)
    };
    vec![
        binary_grad("AddGradient", "Gradient of Add: inputs (dC, A, B), outputs (dA, dB), each summed over the dims it was broadcast along."),
        binary_grad("SubGradient", "Gradient of Sub: inputs (dC, A, B), outputs (dA, dB = -dC summed)."),
        binary_grad("MulGradient", "Gradient of Mul: inputs (dC, A, B), outputs (dA = dC * B, dB = dC * A), summed over broadcast dims."),
        binary_grad("DivGradient", "Gradient of Div: inputs (dC, A, B, C) (C = A / B, the forward output), outputs (dA = dC / B, dB = -dC * C / B), summed over broadcast dims; also Caffe2's legacy three inputs (B, C, dC).")
            .inputs(3, 4),
        OpSchema::new("Pow", build_pow)
            .inputs(1, 2)
            .outputs(1, 1)
            .inplace(InPlace::Allow(in_place_0_or_1))
            .args(POW_ARGS)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = X ^ exponent elementwise: the exponent argument, or a second input (one element, X's shape, or with broadcast=1 a run of X's dims from axis)."),
        OpSchema::new("PowGradient", build_pow_grad)
            .inputs(2, 4)
            .outputs(1, 2)
            .inplace(InPlace::Allow(in_place_0_0))
            .args(POW_ARGS)
            .doc("Gradient of Pow: with the exponent argument, inputs (dY, X, Y) (or (dY, Y) after an in-place Pow), output dX = exponent * X^(exponent - 1) * dY; with an exponent input, inputs (dY, X, E, Y), outputs (dX, dE = dY * Y * ln X, summed over the dims E was broadcast along)."),
        OpSchema::new("WeightedSumGradient", build_weighted_sum_grad)
            .inputs(3, crate::operator::MANY)
            .outputs(1, crate::operator::MANY)
            .args(&[arg!("grad_on_w", "bool", "false", "also output the weights' gradients")])
            .doc("Gradient of WeightedSum: inputs (dY, X0, w0, X1, w1, ...), outputs (dX0, dX1, ...[, dw0, dw1, ...]): dXi = wi * dY (Xi's shape), dwi = sum(dY * Xi) (float32)."),
    ]
}

/// dA may be written over dC (AddGradient and the like).
fn allow_0_any(i: usize, _o: usize) -> bool {
    i == 0
}

// --------------------------------------------- elementwise gradients --

/// `g` (of the output's shape) summed over the dims `pad` (an input's
/// shape, padded) was broadcast along, reshaped to `shape`.
fn reduce_to<T: Float>(g: ArrayD<T>, pad: &[usize], shape: &[usize]) -> Result<ArrayD<T>> {
    let mut g = g;
    for ax in (0..pad.len()).rev() {
        if pad[ax] == 1 && g.shape()[ax] != 1 {
            g = crate::tensor::fold_axis_array(g.view(), ax, T::of(0.0), |&s, &v| s + v)?;
        }
    }
    let v: Vec<T> = crate::tensor::try_collect(g.iter().copied(), "a kernel buffer")?;
    array(shape, v)
}

fn binary_grad_t<T: Float>(
    l: &mut Locked<'_>,
    op: &str,
    legacy: bool,
    axis: Option<usize>,
    num_inputs: usize,
) -> Result<()> {
    // DivGradient's dB is -dC * C / B from the forward output C = A / B
    // (Caffe2's), which stays right after an in-place Div overwrote A: its
    // inputs are (dC, A, B, C), or Caffe2's legacy three (B, C, dC), where
    // C (A's shape) stands in for A.
    let legacy_div = op == "DivGradient" && num_inputs == 3;
    let (ic, ia, ib) = if legacy_div { (2, 1, 0) } else { (0, 1, 2) };
    let (dc, a, b) = (
        input::<T>(l, op, ic)?,
        input::<T>(l, op, ia)?,
        input::<T>(l, op, ib)?,
    );
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    let (a_role, c_name) = if legacy_div { ("C", ia) } else { ("A", ia) };
    let mismatch = || {
        Error::shape(format!(
            "{op}: {a_role} ('{}', shape {sa:?}), B ('{}', shape {sb:?}) and dC ('{}', shape {:?}) do not broadcast as the forward op did",
            l.input_name(c_name),
            l.input_name(ib),
            l.input_name(ic),
            dc.shape()
        ))
        .with_blob(l.input_name(ic))
    };
    // The padded shapes of A and B, and the output's shape.
    let (pa, pb) = if legacy && sb.iter().product::<usize>() == 1 {
        // One element broadcasts whatever its dims (as the forward op).
        (sa.clone(), vec![1; sa.len()])
    } else if legacy {
        let off = axis.or_else(|| sa.len().checked_sub(sb.len()));
        let off = off
            .filter(|&o| o + sb.len() <= sa.len())
            .ok_or_else(mismatch)?;
        (sa.clone(), padded(&sb, sa.len(), off))
    } else {
        let nd = sa.len().max(sb.len());
        (
            padded(&sa, nd, nd - sa.len()),
            padded(&sb, nd, nd - sb.len()),
        )
    };
    let mut sc = Vec::with_capacity(pa.len());
    for (&x, &y) in pa.iter().zip(&pb) {
        sc.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(mismatch()),
        });
    }
    if dc.shape() != sc.as_slice() {
        return Err(mismatch());
    }
    let c = if op != "DivGradient" {
        None
    } else if legacy_div {
        Some(a)
    } else {
        let c = input::<T>(l, op, 3)?;
        if c.shape() != sc.as_slice() {
            return Err(Error::shape(format!(
                "{op}: C ('{}', shape {:?}) must have the forward output's shape {sc:?}",
                l.input_name(3),
                c.shape()
            ))
            .with_blob(l.input_name(3)));
        }
        Some(c)
    };
    let kind = match op {
        "AddGradient" => GradKind::Add,
        "SubGradient" => GradKind::Sub,
        "DivGradient" => GradKind::Div,
        _ => GradKind::Mul,
    };
    let (da, db) = broadcast_grads(
        kind,
        &dense(dc),
        (&dense(a), &pa),
        (&dense(b), &pb),
        c.map(dense).as_deref(),
        &sc,
    )?;
    l.set_output(0, T::wrap(array(&sa, da)?));
    l.set_output(1, T::wrap(array(&sb, db)?));
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum GradKind {
    Add,
    Sub,
    Mul,
    Div,
}

/// The gradients (dA, dB) of C = A op B (A and B broadcast to C's shape
/// `sc` from their padded shapes), each summed over the dims its input was
/// broadcast along, in one row-major pass over dC into two buffers of the
/// inputs' sizes (no output-sized intermediate). `c` is the forward
/// output, for Div.
fn broadcast_grads<T: Float>(
    kind: GradKind,
    dc: &[T],
    (a, pa): (&[T], &[usize]),
    (b, pb): (&[T], &[usize]),
    c: Option<&[T]>,
    sc: &[usize],
) -> Result<(Vec<T>, Vec<T>)> {
    let mut da = crate::tensor::default_buffer::<T>(a.len(), "the gradient dA")?;
    let mut db = crate::tensor::default_buffer::<T>(b.len(), "the gradient dB")?;
    // Row-major strides of A and B over C's dims, 0 where broadcast.
    let strides = |p: &[usize]| {
        let mut st = vec![0; p.len()];
        let mut acc = 1;
        for k in (0..p.len()).rev() {
            st[k] = if p[k] == 1 { 0 } else { acc };
            acc *= p[k];
        }
        st
    };
    let (sta, stb) = (strides(pa), strides(pb));
    let nd = sc.len();
    let mut idx = vec![0usize; nd];
    let (mut oa, mut ob) = (0usize, 0usize);
    for (i, &g) in dc.iter().enumerate() {
        match kind {
            GradKind::Add => {
                da[oa] += g;
                db[ob] += g;
            }
            GradKind::Sub => {
                da[oa] += g;
                db[ob] += -g;
            }
            GradKind::Mul => {
                da[oa] += g * b[ob];
                db[ob] += g * a[oa];
            }
            GradKind::Div => {
                let y = b[ob];
                let cv = c.map_or(T::of(0.0), |c| c[i]);
                da[oa] += g / y;
                db[ob] += -(g * cv) / y;
            }
        }
        // Next index, row-major.
        for k in (0..nd).rev() {
            idx[k] += 1;
            oa += sta[k];
            ob += stb[k];
            if idx[k] < sc[k] {
                break;
            }
            oa -= sta[k] * idx[k];
            ob -= stb[k] * idx[k];
            idx[k] = 0;
        }
    }
    Ok((da, db))
}

fn build_binary_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let legacy = ctx.args.i64("broadcast", 0)? != 0;
    // The forward op's axis, axis_str and order, read as it read them.
    let axis = if legacy { legacy_axis(ctx)? } else { None };
    let op = ctx.op_type().to_string();
    let ni = ctx.num_inputs();
    float_kernel!(&op, 0, |l| binary_grad_t(&mut l, &op, legacy, axis, ni))
}

// ----------------------------------------------------------------- Pow --

/// Where the exponent input lies among X's dims: with Caffe2's legacy
/// `broadcast`, its dims padded with 1s to X's rank, starting at `axis` (-1:
/// at the end); else `None`.
#[derive(Clone, Copy)]
struct PowBroadcast(Option<i64>);

impl PowBroadcast {
    fn of(ctx: &OpDefCtx<'_>) -> Result<PowBroadcast> {
        let on = ctx.args.i64("broadcast", 0)? != 0;
        let axis = ctx.args.i64("axis", -1)?;
        Ok(PowBroadcast(on.then_some(axis)))
    }

    /// The exponent's shape padded to X's rank, if it broadcasts to X.
    fn padded(self, e_shape: &[usize], x_shape: &[usize]) -> Option<Vec<usize>> {
        let axis = self.0?;
        let off = if axis < 0 {
            x_shape.len().checked_sub(e_shape.len())?
        } else {
            usize::try_from(axis).ok()?
        };
        if off + e_shape.len() > x_shape.len() {
            return None;
        }
        let p = padded(e_shape, x_shape.len(), off);
        p.iter()
            .zip(x_shape)
            .all(|(&e, &x)| e == x || e == 1)
            .then_some(p)
    }
}

/// The exponent input `i` as one value per element of X (`n` of them).
fn exponents<T: Float>(
    l: &Locked<'_>,
    op: &str,
    i: usize,
    x_shape: &[usize],
    bc: PowBroadcast,
) -> Result<Vec<T>> {
    let e = input::<T>(l, op, i)?;
    let n: usize = x_shape.iter().product();
    if e.len() == 1 {
        crate::tensor::filled_vec(
            n,
            e.iter().copied().next().unwrap_or(T::of(0.0)),
            "a kernel buffer",
        )
    } else if e.shape() == x_shape {
        Ok(crate::tensor::try_to_vec(&dense(e), "a kernel buffer")?)
    } else if let Some(p) = bc.padded(e.shape(), x_shape) {
        let v = array(&p, crate::tensor::try_to_vec(&dense(e), "a kernel buffer")?)?;
        let b = v.broadcast(IxDyn(x_shape)).ok_or_else(|| {
            Error::internal(format!("{op}: cannot broadcast {p:?} to {x_shape:?}"))
        })?;
        crate::tensor::try_collect(b.iter().copied(), "a broadcast exponent")
    } else {
        let how = if bc.0.is_some() {
            ", X's shape, or a run of X's dims (each equal or 1) starting at axis"
        } else {
            " or X's shape (or set broadcast=1)"
        };
        Err(Error::shape(format!(
            "{op}: the exponent ('{}', shape {:?}) must have one element{how}; X has shape {x_shape:?}",
            l.input_name(i),
            e.shape()
        ))
        .with_blob(l.input_name(i)))
    }
}

fn pow_t<T: Float>(l: &mut Locked<'_>, exponent: Option<f32>, bc: PowBroadcast) -> Result<()> {
    let op = "Pow";
    let x = input::<T>(l, op, 0)?;
    let shape = x.shape().to_vec();
    let es = match exponent {
        Some(e) => crate::tensor::filled_vec(x.len(), T::of(f64::from(e)), "a kernel buffer")?,
        None => exponents::<T>(l, op, 1, &shape, bc)?,
    };
    let y: Vec<T> = crate::tensor::try_collect(
        x.iter().zip(&es).map(|(&v, &e)| v.powf(e)),
        "a kernel buffer",
    )?;
    l.set_output(0, T::wrap(array(&shape, y)?));
    Ok(())
}

fn build_pow(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let exponent = ctx.args.f32_opt("exponent")?;
    match (exponent.is_some(), ctx.num_inputs()) {
        (true, 2) => {
            return Err(
                ctx.bad_arg("Pow: give the exponent as an argument or as a second input, not both")
            )
        }
        (false, 1) => {
            return Err(ctx.bad_arg("Pow: the exponent argument is required with one input"))
        }
        _ => {}
    }
    let bc = PowBroadcast::of(ctx)?;
    float_kernel!("Pow", 0, |l| pow_t(&mut l, exponent, bc))
}

fn pow_grad_t<T: Float>(
    l: &mut Locked<'_>,
    exponent: Option<f32>,
    ni: usize,
    no: usize,
    bc: PowBroadcast,
) -> Result<()> {
    let op = "PowGradient";
    let dy = crate::tensor::try_to_vec(&dense(input::<T>(l, op, 0)?), "a kernel buffer")?;
    let one = T::of(1.0);
    match exponent {
        Some(e) => {
            let e = T::of(f64::from(e));
            // (dY, X, Y) or, after an in-place Pow, (dY, Y) with X = Y^(1/e).
            let base = input::<T>(l, op, 1)?;
            let shape = base.shape().to_vec();
            if dy.len() != base.len() {
                return Err(Error::shape(format!(
                    "{op}: dY and X must have the same shape, got {} and {shape:?} elements",
                    dy.len()
                ))
                .with_blob(l.input_name(0)));
            }
            let dx: Vec<T> = crate::tensor::try_collect(
                base.iter().zip(&dy).map(|(&b, &g)| {
                    let x = if ni == 2 { b.powf(one / e) } else { b };
                    e * x.powf(e - one) * g
                }),
                "a kernel buffer",
            )?;
            l.set_output(0, T::wrap(array(&shape, dx)?));
        }
        None => {
            let x = input::<T>(l, op, 1)?;
            let shape = x.shape().to_vec();
            let es = exponents::<T>(l, op, 2, &shape, bc)?;
            let y = crate::tensor::try_to_vec(&dense(input::<T>(l, op, 3)?), "a kernel buffer")?;
            if dy.len() != x.len() || y.len() != x.len() {
                return Err(
                    Error::shape(format!("{op}: dY, X and Y must have the same shape"))
                        .with_blob(l.input_name(0)),
                );
            }
            let xs = dense(x);
            let dx: Vec<T> = crate::tensor::try_collect(
                (0..xs.len()).map(|i| es[i] * xs[i].powf(es[i] - one) * dy[i]),
                "a kernel buffer",
            )?;
            let de_full: Vec<T> = crate::tensor::try_collect(
                (0..xs.len()).map(|i| dy[i] * y[i] * xs[i].ln()),
                "a kernel buffer",
            )?;
            let e_in = input::<T>(l, op, 2)?;
            let e_shape = e_in.shape().to_vec();
            let de = if e_in.len() == 1 && xs.len() != 1 {
                vec![de_full.iter().copied().sum()]
            } else if e_shape == shape {
                de_full
            } else {
                // Broadcast (legacy): summed over the dims E was repeated along.
                let p = bc.padded(&e_shape, &shape).ok_or_else(|| {
                    Error::internal(format!("{op}: the exponent's shape {e_shape:?} was accepted but does not broadcast"))
                })?;
                let full = array(&shape, de_full)?;
                crate::tensor::try_to_vec(
                    &dense(&reduce_to(full, &p, &e_shape)?),
                    "a kernel buffer",
                )?
            };
            l.set_output(0, T::wrap(array(&shape, dx)?));
            if no > 1 {
                l.set_output(1, T::wrap(array(&e_shape, de)?));
            }
        }
    }
    Ok(())
}

fn build_pow_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let exponent = ctx.args.f32_opt("exponent")?;
    let (ni, no) = (ctx.num_inputs(), ctx.num_outputs());
    let ok = match exponent {
        Some(_) => ni <= 3 && no == 1,
        None => ni == 4,
    };
    if !ok {
        return Err(ctx.bad_arg(
            "PowGradient takes (dY, X, Y) or (dY, Y) with the exponent argument, or (dY, X, exponent, Y) without it",
        ));
    }
    let bc = PowBroadcast::of(ctx)?;
    float_kernel!("PowGradient", 0, |l| pow_grad_t(
        &mut l, exponent, ni, no, bc
    ))
}

// ------------------------------------------------- WeightedSumGradient --

fn build_weighted_sum_grad(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    const OP: &str = "WeightedSumGradient";
    let grad_on_w = ctx.args.bool("grad_on_w", false)?;
    let ni = ctx.num_inputs();
    if ni % 2 != 1 {
        return Err(ctx.bad_arg(format!(
            "{OP} takes dY and then (X, weight) pairs, an odd number of inputs; got {ni}"
        )));
    }
    let pairs = ni / 2;
    let want = if grad_on_w { 2 * pairs } else { pairs };
    if ctx.num_outputs() != want {
        return Err(ctx.bad_arg(format!(
            "{OP} with {pairs} (X, weight) pairs and grad_on_w={} has {want} outputs, got {}",
            grad_on_w as i32,
            ctx.num_outputs()
        )));
    }
    Ok(kernel(move |cx| {
        let mut l = cx.lock();
        fn f32_at<'l>(l: &'l Locked<'_>, i: usize) -> Result<&'l ArrayD<f32>> {
            let t = l.tensor(i)?;
            match t {
                Tensor::F32(a) => Ok(&**a),
                _ => Err(Error::type_error(format!(
                    "{OP}: input {i} ('{}') must be a float32 tensor, got {}",
                    l.input_name(i),
                    t.dtype()
                ))
                .with_blob(l.input_name(i))),
            }
        }
        let dy = f32_at(&l, 0)?;
        let mut dxs = Vec::with_capacity(pairs);
        let mut dws = Vec::with_capacity(pairs);
        for p in 0..pairs {
            let x = f32_at(&l, 1 + 2 * p)?;
            let w = f32_at(&l, 2 + 2 * p)?;
            if w.len() != 1 || x.len() != dy.len() {
                return Err(Error::shape(format!(
                    "{OP}: X{p} ('{}', shape {:?}) must have dY's {} elements and its weight ('{}', shape {:?}) one",
                    l.input_name(1 + 2 * p),
                    x.shape(),
                    dy.len(),
                    l.input_name(2 + 2 * p),
                    w.shape()
                ))
                .with_blob(l.input_name(1 + 2 * p)));
            }
            let wv = w.iter().copied().next().unwrap_or(0.0);
            let dx: Vec<f32> =
                crate::tensor::try_collect(dy.iter().map(|&g| g * wv), "a kernel buffer")?;
            dxs.push(array(x.shape(), dx)?);
            let dw: f32 = dy.iter().zip(x.iter()).map(|(&g, &v)| g * v).sum();
            dws.push(array(w.shape(), vec![dw])?);
        }
        for (p, dx) in dxs.into_iter().enumerate() {
            l.set_output(p, Tensor::from(dx));
        }
        if grad_on_w {
            for (p, dw) in dws.into_iter().enumerate() {
                l.set_output(pairs + p, Tensor::from(dw));
            }
        }
        Ok(true)
    }))
}

#[cfg(test)]
mod tests {

    use crate::test_util::{f32s, get, op, run, vals, ws_with};

    #[test]
    fn add_gradient_sums_over_broadcast_dims() {
        let ws = ws_with(&[
            ("dc", f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.])),
            ("a", f32s(&[2, 3], &[0.; 6])),
            ("b", f32s(&[3], &[0.; 3])),
        ]);
        run(
            &ws,
            op("AddGradient", &["dc", "a", "b"], &["da", "db"], vec![]),
        )
        .unwrap();
        assert_eq!(vals(&get(&ws, "da")), vec![1., 2., 3., 4., 5., 6.]);
        assert_eq!(get(&ws, "db").shape(), &[3]);
        assert_eq!(vals(&get(&ws, "db")), vec![5., 7., 9.]);
    }
}
