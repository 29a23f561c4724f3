//! Builders for the plan IR, shared by the unit tests of every module.

use crate::ir::{Argument, NetDef, OperatorDef};

pub fn op(ty: &str, ins: &[&str], outs: &[&str], args: Vec<Argument>) -> OperatorDef {
    OperatorDef {
        r#type: Some(ty.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        arg: args,
        ..Default::default()
    }
}

pub fn int_arg(name: &str, v: i64) -> Argument {
    Argument {
        name: Some(name.into()),
        i: Some(v),
        ..Default::default()
    }
}

pub fn float_arg(name: &str, v: f32) -> Argument {
    Argument {
        name: Some(name.into()),
        f: Some(v),
        ..Default::default()
    }
}

pub fn strings_arg(name: &str, v: &[&str]) -> Argument {
    Argument {
        name: Some(name.into()),
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

pub fn net(name: &str, ops: Vec<OperatorDef>) -> NetDef {
    NetDef {
        name: Some(name.into()),
        op: ops,
        ..Default::default()
    }
}
