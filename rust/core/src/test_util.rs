//! Builders for the plan IR and small tensor helpers, shared by the unit
//! tests of every module.

use crate::blob::BlobValue;
use crate::ir::{Argument, NetDef, OperatorDef};
use crate::tensor::Tensor;
use crate::workspace::Workspace;

pub fn op(ty: &str, ins: &[&str], outs: &[&str], args: Vec<Argument>) -> OperatorDef {
    OperatorDef {
        r#type: Some(ty.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        arg: args,
        ..Default::default()
    }
}

/// An argument with only its name set (the builders below fill one field).
pub fn named(name: &str) -> Argument {
    Argument {
        name: Some(name.into()),
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

pub fn string_arg(name: &str, v: &str) -> Argument {
    Argument {
        s: Some(v.as_bytes().to_vec()),
        ..named(name)
    }
}

pub fn ints_arg(name: &str, v: &[i64]) -> Argument {
    Argument {
        ints: v.to_vec(),
        ..named(name)
    }
}

pub fn floats_arg(name: &str, v: &[f32]) -> Argument {
    Argument {
        floats: v.to_vec(),
        ..named(name)
    }
}

pub fn strings_arg(name: &str, v: &[&str]) -> Argument {
    Argument {
        name: Some(name.into()),
        strings: v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        ..Default::default()
    }
}

/// `def` with its device option's random seed set.
pub fn seeded(mut def: OperatorDef, seed: u32) -> OperatorDef {
    def.device_option = Some(crate::ir::DeviceOption {
        random_seed: Some(seed),
        ..Default::default()
    });
    def
}

pub fn net(name: &str, ops: Vec<OperatorDef>) -> NetDef {
    NetDef {
        name: Some(name.into()),
        op: ops,
        ..Default::default()
    }
}

/// Runs `body` in a child process (this test binary, re-run on the test
/// `name` alone), for tests whose failure would be a crash: an abort in the
/// child fails the test in the parent instead of taking the whole run down.
/// `name` is the test's path as `cargo test` prints it.
pub fn in_child(name: &str, body: impl FnOnce()) {
    const VAR: &str = "FERROCAFFE_TEST_CHILD";
    if std::env::var(VAR).as_deref() == Ok(name) {
        body();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(VAR, name)
        .output()
        .expect("the child test runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "the child running {name} failed ({}):\n{text}",
        out.status
    );
}

/// Runs one op once (a temporary net), as `RunOperatorOnce` does. Takes the
/// def by value or by reference.
pub fn run(
    ws: &std::sync::Arc<Workspace>,
    def: impl std::borrow::Borrow<OperatorDef>,
) -> crate::error::Result<bool> {
    ws.run_operator_once(def.borrow(), &crate::cancel::CancelToken::new())
}

/// A workspace holding the given tensors.
pub fn ws_with(inputs: &[(&str, Tensor)]) -> std::sync::Arc<Workspace> {
    let ws = Workspace::new();
    for (n, v) in inputs {
        feed(&ws, n, v.clone());
    }
    ws
}

/// Feeds tensor `t` into blob `name`.
pub fn feed(ws: &Workspace, name: &str, t: Tensor) {
    ws.feed(name, BlobValue::Tensor(t));
}

/// A copy of the tensor in blob `name`.
pub fn get(ws: &Workspace, name: &str) -> Tensor {
    ws.fetch(name).unwrap().tensor().unwrap().clone()
}

/// A tensor of `shape` holding `v` (row-major).
pub fn tensor<T: crate::tensor::Element>(shape: &[usize], v: Vec<T>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

/// A float32 tensor of `shape` holding `v`.
pub fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

/// The values of a float32 tensor, in order.
pub fn vals(t: &Tensor) -> Vec<f32> {
    t.array::<f32>().unwrap().iter().copied().collect()
}

/// A 1-D int32 tensor of `v`.
pub fn i32s(v: &[i32]) -> Tensor {
    Tensor::from_vec(&[v.len()], v.to_vec()).unwrap()
}

/// A 1-D int64 tensor of `v`.
pub fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_vec(&[v.len()], v.to_vec()).unwrap()
}

/// A 1-D byte-string tensor of `v`.
pub fn strs(v: &[&str]) -> Tensor {
    Tensor::from_vec(
        &[v.len()],
        v.iter().map(|s| s.as_bytes().to_vec()).collect(),
    )
    .unwrap()
}
