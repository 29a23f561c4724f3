//! Control flow: If, While, Do and CreateScope (what net_builder's IfNet,
//! WhileNet and their branches compile to).
//!
//! `Do` runs a net in a workspace that sees only explicitly forwarded blobs.
//! Unlike Caffe2, it does not push a new workspace onto a stack that grows on
//! every loop iteration: the inner workspace lives for one run (or, with
//! `reuse_workspace`, one workspace is kept in the scope blob and reused).

use crate::arg;
use crate::blob::{BlobObject, BlobValue};
use crate::error::{Error, Result};
use crate::ir::NetDef;
use crate::net::Net;
use crate::operator::{InPlace, OpCx, OpDefCtx, OpSchema, Operator, MANY};
use crate::tensor::Tensor;
use crate::workspace::Workspace;
use parking_lot::Mutex;
use std::sync::Arc;

pub fn schemas() -> Vec<OpSchema> {
    vec![
        OpSchema::new("CreateScope", create_scope)
            .inputs(0, 0)
            .outputs(1, 1)
            .doc("Creates a scope blob that Do ops use to keep (with reuse_workspace) their inner workspace."),
        OpSchema::new("HasScope", has_scope).inputs(1, 1).outputs(1, 1).doc("Outputs whether the scope blob holds a kept workspace."),
        OpSchema::new("Do", build_do)
            .inputs(1, MANY)
            .outputs(1, MANY)
            .inplace(InPlace::Allow(|_, _| true))
            .args(&[
                arg!("net", "NetDef", "required", "the net to run"),
                arg!("inner_blobs", "strings", "required", "names of the forwarded blobs inside the net"),
                arg!("outer_blobs_idx", "ints", "required", "for each inner blob, its index in inputs + outputs"),
                arg!("reuse_workspace", "bool", "false", "keep one inner workspace in the scope blob across runs"),
                arg!("copy_external_blobs", "bool", "false", "accepted for Caffe2 compatibility (no effect: inner workspaces are not kept)"),
            ])
            .doc("Runs `net` in a workspace that sees only the forwarded blobs; the last input and output are the scope blob."),
        OpSchema::new("If", build_if)
            .inputs(1, MANY)
            .outputs(0, MANY)
            .inplace(InPlace::Allow(|_, _| true))
            .args(&[
                arg!("then_net", "NetDef", "required", "run when the condition is true"),
                arg!("else_net", "NetDef", "none", "run when the condition is false"),
            ])
            .doc("Runs then_net or else_net in the op's workspace, by a one-element bool condition (input 0)."),
        OpSchema::new("While", build_while)
            .inputs(1, MANY)
            .outputs(0, MANY)
            .inplace(InPlace::Allow(|_, _| true))
            .args(&[
                arg!("loop_net", "NetDef", "required", "the loop body"),
                arg!("cond_net", "NetDef", "none", "run before each check of the condition"),
            ])
            .doc("Repeats: run cond_net if given, stop when the bool condition (input 0) is false, run loop_net."),
    ]
}

/// What a scope blob holds: the kept inner workspace of a reusing Do.
#[derive(Debug, Default)]
pub struct WorkspaceScope {
    kept: Mutex<Option<(Arc<Workspace>, Arc<Mutex<Net>>)>>,
}

impl BlobObject for WorkspaceScope {
    fn kind_name(&self) -> &'static str {
        "WorkspaceStack"
    }
}

fn create_scope(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(super::kernel(|cx| {
        cx.output_blob(0)
            .set(BlobValue::Object(Arc::new(WorkspaceScope::default())));
        Ok(true)
    }))
}

fn has_scope(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(super::kernel(|cx| {
        let scope = cx
            .input_blob(0)
            .read()
            .object::<WorkspaceScope>("WorkspaceStack")
            .map_err(|e| e.with_blob(&cx.io.input_names[0]))?;
        let has = scope.kept.lock().is_some();
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::scalar(has)));
        Ok(true)
    }))
}

struct DoOp {
    net: NetDef,
    mapping: Vec<(String, String)>,
    reuse: bool,
    allow_unknown_args: bool,
}

fn build_do(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let net = ctx
        .args
        .net("net")?
        .ok_or_else(|| ctx.bad_arg("Do needs a 'net' argument"))?;
    let inner = ctx.args.string_list("inner_blobs")?.unwrap_or_default();
    let idx = ctx.args.ints("outer_blobs_idx")?.unwrap_or_default();
    if inner.len() != idx.len() {
        return Err(ctx.bad_arg(format!(
            "inner_blobs ({}) and outer_blobs_idx ({}) must have the same length",
            inner.len(),
            idx.len()
        )));
    }
    let (ni, no) = (ctx.num_inputs(), ctx.num_outputs());
    if ctx.input_name(ni - 1) != ctx.output_name(no - 1) {
        return Err(
            ctx.bad_arg("the last input and the last output of Do must be the same scope blob")
        );
    }
    let outer: Vec<&str> = ctx.def.input[..ni - 1]
        .iter()
        .chain(ctx.def.output[..no - 1].iter())
        .map(|s| s.as_str())
        .collect();
    let mut mapping = Vec::new();
    let mut bound = vec![false; outer.len()];
    for (name, &k) in inner.iter().zip(&idx) {
        let k = usize::try_from(k)
            .ok()
            .filter(|&k| k < outer.len())
            .ok_or_else(|| {
                ctx.bad_arg(format!(
                    "outer_blobs_idx {k} is out of range for {} outer blobs",
                    outer.len()
                ))
            })?;
        if mapping.iter().any(|(n, _): &(String, String)| n == name) {
            return Err(ctx.bad_arg(format!("inner blob '{name}' is listed twice")));
        }
        bound[k] = true;
        mapping.push((name.clone(), outer[k].to_string()));
    }
    // Every outer name must be bound (a name that is both an input and an
    // output appears twice in the outer list but needs one binding).
    if let Some(k) = (0..outer.len())
        .find(|&k| !bound[k] && !outer.iter().zip(&bound).any(|(n, b)| *b && *n == outer[k]))
    {
        return Err(ctx.bad_arg(format!(
            "outer blob '{}' is not bound to an inner blob",
            outer[k]
        )));
    }
    let reuse = ctx.args.bool("reuse_workspace", false)?;
    ctx.args.bool("copy_external_blobs", false)?;
    Ok(Box::new(DoOp {
        net,
        mapping,
        reuse,
        allow_unknown_args: ctx.allow_unknown_args,
    }))
}

impl Operator for DoOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        let scope_name = cx
            .io
            .input_names
            .last()
            .expect("Do has a scope input")
            .clone();
        let scope = cx
            .input_blob(cx.num_inputs() - 1)
            .read()
            .object::<WorkspaceScope>("WorkspaceStack")
            .map_err(|e| e.with_blob(&scope_name))?;
        if self.reuse {
            let mut kept = scope.kept.lock();
            if kept.is_none() {
                let ws = Workspace::new_forwarding(cx.ws, &self.mapping)?;
                let net = Net::create_with(&self.net, &ws, self.allow_unknown_args)?;
                let net = Arc::new(Mutex::new(net));
                *kept = Some((ws, net));
            }
            let (ws, net) = kept.clone().expect("just set");
            drop(kept);
            let ok = net.lock().run(&ws, cx.cancel)?;
            return Ok(ok);
        }
        // A fresh inner workspace for this run only: nothing accumulates.
        let ws = Workspace::new_forwarding(cx.ws, &self.mapping)?;
        let mut net = Net::create_with(&self.net, &ws, self.allow_unknown_args)?;
        net.run(&ws, cx.cancel)
    }
}

/// Reads a condition blob without keeping it locked (the nets we run next
/// may write it).
fn read_cond(cx: &OpCx<'_>) -> Result<bool> {
    let name = &cx.io.input_names[0];
    let v = cx.input_blob(0).read();
    let t = v.tensor().map_err(|e| e.with_blob(name))?;
    match t {
        Tensor::Bool(a) if a.len() == 1 => Ok(*a.iter().next().expect("one element")),
        other => Err(Error::type_error(format!(
            "the condition must be a one-element bool tensor, got {} of shape {:?}",
            other.dtype(),
            other.shape()
        ))
        .with_blob(name)),
    }
}

fn sub_net(ctx: &OpDefCtx<'_>, arg_name: &str, required: bool) -> Result<Option<Net>> {
    match ctx.args.net(arg_name)? {
        Some(def) => Ok(Some(Net::create_with(
            &def,
            ctx.ws,
            ctx.allow_unknown_args,
        )?)),
        None if required => {
            Err(ctx.bad_arg(format!("{} needs a '{arg_name}' argument", ctx.op_type())))
        }
        None => Ok(None),
    }
}

struct IfOp {
    then_net: Net,
    else_net: Option<Net>,
}

fn build_if(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let then_net = sub_net(ctx, "then_net", true)?.expect("required");
    let else_net = sub_net(ctx, "else_net", false)?;
    Ok(Box::new(IfOp { then_net, else_net }))
}

impl Operator for IfOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        if read_cond(cx)? {
            self.then_net.run(cx.ws, cx.cancel)
        } else {
            match &mut self.else_net {
                Some(n) => n.run(cx.ws, cx.cancel),
                None => Ok(true),
            }
        }
    }
}

struct WhileOp {
    loop_net: Net,
    cond_net: Option<Net>,
}

fn build_while(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let cond_net = sub_net(ctx, "cond_net", false)?;
    let loop_net = sub_net(ctx, "loop_net", true)?.expect("required");
    Ok(Box::new(WhileOp { loop_net, cond_net }))
}

impl Operator for WhileOp {
    fn run(&mut self, cx: &mut OpCx<'_>) -> Result<bool> {
        loop {
            cx.cancel.poll_check()?; // no blob is locked between iterations
            if let Some(c) = &mut self.cond_net {
                if !c.run(cx.ws, cx.cancel)? {
                    return Ok(false);
                }
            }
            if !read_cond(cx)? {
                return Ok(true);
            }
            if !self.loop_net.run(cx.ws, cx.cancel)? {
                return Ok(false);
            }
        }
    }
}
