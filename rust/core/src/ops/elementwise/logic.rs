//! Comparisons (EQ, NE, LT, LE, GT, GE), logic (And, Or, Xor, Not) and the
//! bitwise ops (BitwiseAnd, BitwiseOr, BitwiseXor), with broadcasting.

#![allow(clippy::result_large_err)]

use super::loops::*;
use crate::error::Result;
use crate::operator::{InPlace, Locked, OpDefCtx, OpSchema, Operator};
use crate::ops::kit::kernel;
use crate::tensor::{DataType, Element};

pub fn schemas() -> Vec<OpSchema> {
    let a = InPlace::Allow(in_place_a);
    let never = InPlace::Never;
    vec![
        binary_schema("EQ", build_cmp, never, "C = (A == B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("NE", build_cmp, never, "C = (A != B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("LT", build_cmp, never, "C = (A < B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("LE", build_cmp, never, "C = (A <= B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("GT", build_cmp, never, "C = (A > B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("GE", build_cmp, never, "C = (A >= B) elementwise as bool (bool, int32, int64, float32, float64), with broadcasting."),
        binary_schema("And", build_logic, a, "C = A and B elementwise on bool tensors, with broadcasting."),
        binary_schema("Or", build_logic, a, "C = A or B elementwise on bool tensors, with broadcasting."),
        binary_schema("Xor", build_logic, a, "C = A xor B elementwise on bool tensors, with broadcasting."),
        binary_schema_typed("BitwiseAnd", build_bitwise, a, "C = A & B elementwise (bool, int32 or int64, both one type, which C has), with broadcasting.", binary_infer::<false>),
        binary_schema_typed("BitwiseOr", build_bitwise, a, "C = A | B elementwise (bool, int32 or int64, both one type, which C has), with broadcasting.", binary_infer::<false>),
        binary_schema_typed("BitwiseXor", build_bitwise, a, "C = A ^ B elementwise (bool, int32 or int64, both one type, which C has), with broadcasting.", binary_infer::<false>),
        OpSchema::new("Not", build_not)
            .inputs(1, 1)
            .outputs(1, 1)
            .infer(|_, ins, n| Ok(crate::shapes::rules::same_as_input(ins, 0, n)))
            .doc("Y = not X elementwise on a bool tensor."),
    ]
}

/// A binary op whose output is bool (comparisons and logic).
fn binary_schema(
    name: &'static str,
    build: crate::operator::BuildFn,
    inplace: InPlace,
    doc: &'static str,
) -> OpSchema {
    binary_schema_typed(name, build, inplace, doc, binary_infer::<true>)
}

// ----------------------------------------------------------- comparison ops --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

fn cmp_t<T: Element + Copy + PartialOrd>(l: &mut Locked<'_>, p: &Prep, op: Cmp) -> Result<()> {
    match op {
        Cmp::Eq => exec_to::<T, bool, _>(l, p, |a, b| a == b),
        Cmp::Ne => exec_to::<T, bool, _>(l, p, |a, b| a != b),
        Cmp::Lt => exec_to::<T, bool, _>(l, p, |a, b| a < b),
        Cmp::Le => exec_to::<T, bool, _>(l, p, |a, b| a <= b),
        Cmp::Gt => exec_to::<T, bool, _>(l, p, |a, b| a > b),
        Cmp::Ge => exec_to::<T, bool, _>(l, p, |a, b| a >= b),
    }
}

fn build_cmp(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "EQ" => (Cmp::Eq, "EQ"),
        "NE" => (Cmp::Ne, "NE"),
        "LT" => (Cmp::Lt, "LT"),
        "LE" => (Cmp::Le, "LE"),
        "GT" => (Cmp::Gt, "GT"),
        "GE" => (Cmp::Ge, "GE"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not a comparison op"))),
    };
    binary_kernel(ctx, name, CMP_TYPES, move |l, p| {
        crate::with_match_dtype!(arith_and_bool p.dtype, |T| cmp_t::<T>(l, p, op),
            else other => Err(unsupported(name, other, CMP_TYPES)))
    })
}

// ---------------------------------------------------------------- logic ops --

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logic {
    And,
    Or,
    Xor,
}

fn build_logic(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "And" => (Logic::And, "And"),
        "Or" => (Logic::Or, "Or"),
        "Xor" => (Logic::Xor, "Xor"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not a logical op"))),
    };
    binary_kernel(ctx, name, BOOL_TYPES, move |l, p| match op {
        Logic::And => exec_same::<bool, _>(l, p, |a, b| a & b),
        Logic::Or => exec_same::<bool, _>(l, p, |a, b| a | b),
        Logic::Xor => exec_same::<bool, _>(l, p, |a, b| a ^ b),
    })
}

const BITWISE_TYPES: &[DataType] = DataType::INTS_AND_BOOL;

fn bitwise_t<T>(l: &mut Locked<'_>, p: &Prep, op: Logic) -> Result<()>
where
    T: Element
        + Copy
        + std::ops::BitAnd<Output = T>
        + std::ops::BitOr<Output = T>
        + std::ops::BitXor<Output = T>,
{
    match op {
        Logic::And => exec_same::<T, _>(l, p, |a, b| a & b),
        Logic::Or => exec_same::<T, _>(l, p, |a, b| a | b),
        Logic::Xor => exec_same::<T, _>(l, p, |a, b| a ^ b),
    }
}

fn build_bitwise(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let (op, name) = match ctx.op_type() {
        "BitwiseAnd" => (Logic::And, "BitwiseAnd"),
        "BitwiseOr" => (Logic::Or, "BitwiseOr"),
        "BitwiseXor" => (Logic::Xor, "BitwiseXor"),
        other => return Err(ctx.bad_arg(format!("'{other}' is not a bitwise op"))),
    };
    binary_kernel(ctx, name, BITWISE_TYPES, move |l, p| {
        crate::with_match_dtype!(ints_and_bool p.dtype, |T| bitwise_t::<T>(l, p, op),
            else other => Err(unsupported(name, other, BITWISE_TYPES)))
    })
}

fn build_not(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(kernel(|cx| {
        let mut l = cx.lock();
        unary_dtype(&l, "Not", BOOL_TYPES)?;
        unary_same::<bool, _>(&mut l, |x| !x)?;
        Ok(true)
    }))
}
