//! Control flow: If, While, Do and CreateScope (what net_builder's IfNet,
//! WhileNet and their branches compile to).
//!
//! `Do` runs a net in a workspace that sees only explicitly forwarded blobs.
//! Unlike Caffe2, it does not push a new workspace onto a stack that grows on
//! every loop iteration: the inner workspace lives for one run (or, with
//! `reuse_workspace`, one workspace is kept in the scope blob and reused) --
//! unless a gradient needs it. A gradient `Do` (`is_gradient_op`, made by
//! `control_ops_grad`) runs the backward pass of the forward `Do`'s net in
//! the workspace that `Do` ran in, so a scope blob whose `CreateScope` has
//! `keep_workspaces` keeps each forward run's workspace on a stack (Caffe2's
//! workspace stack) until a gradient `Do` takes it. `keep_workspaces` is set
//! on every `CreateScope` of a net (nested nets included) that also holds a
//! gradient `Do` on that scope blob (`net::keep_scopes`), so nets without
//! gradients keep nothing.

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
            .args(&[arg!(
                "keep_workspaces",
                "bool",
                "false",
                "keep the workspace of each run of a Do on this scope for a gradient Do (set by the net when it holds one)"
            )])
            .doc("Creates a scope blob that Do ops use to keep (with reuse_workspace) their inner workspace, or (with keep_workspaces) each run's for the gradient."),
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
                arg!("copy_external_blobs", "bool", "false", "accepted for Caffe2 compatibility (a workspace kept for the gradient always holds the forwarded blobs' values)"),
                arg!("saved_fwd_blobs", "strings", "none", "(gradient Do) the forward net's own blobs its net reads from the kept workspace"),
            ])
            .doc("Runs `net` in a workspace that sees only the forwarded blobs; the last input and output are the scope blob. A gradient Do (is_gradient_op) runs in the workspace the last forward run kept in the scope (its last input; its outputs are all gradients)."),
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

/// What a scope blob holds: the kept inner workspace of a reusing Do, and
/// (with `keep`) the workspaces of the forward runs a gradient Do has not
/// taken yet, the last on top.
#[derive(Debug, Default)]
pub struct WorkspaceScope {
    kept: Mutex<Option<(Arc<Workspace>, Arc<Mutex<Net>>)>>,
    keep: bool,
    stack: Mutex<Vec<Arc<Workspace>>>,
}

impl BlobObject for WorkspaceScope {
    fn kind_name(&self) -> &'static str {
        "WorkspaceStack"
    }
}

fn create_scope(ctx: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    let keep = ctx.args.bool("keep_workspaces", false)?;
    Ok(super::kit::kernel(move |cx| {
        cx.output_blob(0)
            .set(BlobValue::Object(Arc::new(WorkspaceScope {
                keep,
                ..WorkspaceScope::default()
            })));
        Ok(true)
    }))
}

fn has_scope(_: &OpDefCtx<'_>) -> Result<Box<dyn Operator>> {
    Ok(super::kit::kernel(|cx| {
        let scope = cx
            .input_blob(0)
            .read()
            .object::<WorkspaceScope>("WorkspaceStack")
            .map_err(|e| e.with_blob(&cx.io.input_names[0]))?;
        let has = scope.kept.lock().is_some() || !scope.stack.lock().is_empty();
        cx.output_blob(0)
            .set(BlobValue::Tensor(Tensor::scalar(has)));
        Ok(true)
    }))
}

/// Where a kept workspace holds a forwarded input's value as the run
/// started (control_ops_grad reads it under this name).
const FORWARD_INPUT: &str = "/_DO_OPERATOR_FORWARD_INPUT_";

struct DoOp {
    net: NetDef,
    mapping: Vec<(String, String)>,
    /// The inner names bound to inputs.
    inputs: Vec<String>,
    reuse: bool,
    gradient: bool,
    saved: Vec<String>,
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
    let gradient = ctx.def.is_gradient_op.unwrap_or(false);
    // A gradient Do writes gradients only: the scope blob is its last input
    // (and its last output too in Caffe2's layout, which is accepted).
    let scope_out = no > 0 && ctx.input_name(ni - 1) == ctx.output_name(no - 1);
    if !scope_out && !gradient {
        return Err(
            ctx.bad_arg("the last input and the last output of Do must be the same scope blob")
        );
    }
    let outputs = if scope_out {
        &ctx.def.output[..no - 1]
    } else {
        &ctx.def.output[..]
    };
    let outer: Vec<&str> = ctx.def.input[..ni - 1]
        .iter()
        .chain(outputs.iter())
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
    if gradient && reuse {
        return Err(ctx.bad_arg(
            "a gradient Do cannot reuse_workspace: it runs in the workspace the forward Do kept",
        ));
    }
    ctx.args.bool("copy_external_blobs", false)?;
    let saved = ctx.args.string_list("saved_fwd_blobs")?.unwrap_or_default();
    let input_names = &ctx.def.input[..ni - 1];
    let inputs = mapping
        .iter()
        .filter(|(_, outer)| input_names.contains(outer))
        .map(|(inner, _)| inner.clone())
        .collect();
    Ok(Box::new(DoOp {
        net,
        mapping,
        inputs,
        reuse,
        gradient,
        saved,
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
        if self.gradient {
            return self.run_gradient(cx, &scope, &scope_name);
        }
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
        // A fresh inner workspace for this run only: nothing accumulates,
        // unless the scope keeps it for a gradient Do. A kept workspace also
        // holds the forwarded inputs as the run found them and every
        // forwarded blob as the run left them (values, not bindings: a loop
        // changes them; tensors are shared until one side writes), which is
        // what Caffe2's copy_external_blobs kept.
        let ws = Workspace::new_forwarding(cx.ws, &self.mapping)?;
        if scope.keep {
            for inner in &self.inputs {
                if let Some(b) = ws.get_blob(inner) {
                    let v = b.get();
                    ws.create_local_blob(&format!("{inner}{FORWARD_INPUT}"))
                        .set(v);
                }
            }
        }
        let mut net = Net::create_with(&self.net, &ws, self.allow_unknown_args)?;
        let ok = net.run(&ws, cx.cancel)?;
        if ok && scope.keep {
            drop(net);
            for (inner, _) in &self.mapping {
                if let Some(b) = ws.get_blob(inner) {
                    let v = b.get();
                    ws.create_local_blob(inner).set(v);
                }
            }
            scope.stack.lock().push(ws);
        }
        Ok(ok)
    }
}

impl DoOp {
    /// Runs the gradient net in the workspace of the last forward run kept
    /// in the scope, taking it off the stack. Its bindings map the
    /// gradients in and out; a blob the kept workspace has a copy of is
    /// read there (Caffe2's skip of defined blobs).
    fn run_gradient(
        &self,
        cx: &mut OpCx<'_>,
        scope: &WorkspaceScope,
        scope_name: &str,
    ) -> Result<bool> {
        let popped = scope.stack.lock().pop();
        let fwd = popped.ok_or_else(|| {
            Error::invalid_arg(format!(
                "gradient Do: scope blob '{scope_name}' holds no workspace of a forward run: the \
                 forward Do did not run (as many times), or did not keep its workspace (it keeps \
                 it when the net that runs it also holds this gradient Do, or when the scope's \
                 CreateScope has keep_workspaces=1)"
            ))
            .with_blob(scope_name)
        })?;
        if let Some(missing) = self.saved.iter().find(|n| !fwd.has_blob(n)) {
            return Err(Error::invalid_arg(format!(
                "gradient Do: the forward run's workspace has no blob '{missing}', which the gradient reads"
            ))
            .with_blob(missing));
        }
        let ws = Workspace::new_child(&fwd);
        for (inner, outer) in &self.mapping {
            if !fwd.has_local_blob(inner) {
                ws.add_blob_mapping(inner, cx.ws, outer)?;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Argument, OperatorDef};
    use crate::test_util::{net, op};

    fn with_net(mut o: OperatorDef, name: &str, n: NetDef) -> OperatorDef {
        o.arg.push(Argument {
            name: Some(name.into()),
            n: Some(n),
            ..Argument::default()
        });
        o
    }

    fn keeps(def: &NetDef) -> Vec<bool> {
        fn walk(def: &NetDef, out: &mut Vec<bool>) {
            for o in &def.op {
                if o.op_type() == "CreateScope" {
                    out.push(
                        o.arg
                            .iter()
                            .any(|a| a.name.as_deref() == Some("keep_workspaces")),
                    );
                }
                for a in &o.arg {
                    for n in a.n.iter().chain(a.nets.iter()) {
                        walk(n, out);
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(def, &mut out);
        out
    }

    #[test]
    fn keep_scopes_marks_the_scopes_a_gradient_do_reads() {
        // The body's scope is created inside the loop body (a nested net),
        // its gradient Do sits in the gradient While's loop_net.
        let body = net("body", vec![op("CreateScope", &[], &["inner"], vec![])]);
        let fwd_do = with_net(op("Do", &["x", "s"], &["x", "s"], vec![]), "net", body);
        let fwd_while = with_net(
            op("While", &["c", "x", "s"], &["x", "s"], vec![]),
            "loop_net",
            net("l", vec![fwd_do]),
        );
        let mut grad_do = op("Do", &["g", "inner"], &["h"], vec![]);
        grad_do.is_gradient_op = Some(true);
        let mut grad_outer = with_net(
            op("Do", &["g", "s"], &["h"], vec![]),
            "net",
            net("gb", vec![grad_do]),
        );
        grad_outer.is_gradient_op = Some(true);
        let grad_while = with_net(
            op("While", &["hc", "g", "s"], &["g"], vec![]),
            "loop_net",
            net("gl", vec![grad_outer]),
        );
        let forward_only = net(
            "f",
            vec![
                op("CreateScope", &[], &["s"], vec![]),
                op("CreateScope", &[], &["other"], vec![]),
                fwd_while,
            ],
        );
        assert!(crate::net::keep_scopes(&forward_only).is_none());
        let mut both = forward_only.clone();
        both.op.push(grad_while);
        let marked = crate::net::keep_scopes(&both).expect("a gradient Do");
        // s and inner (in the body) are read by gradient Dos; other is not.
        assert_eq!(keeps(&marked), vec![true, false, true]);
        assert_eq!(keeps(&both), vec![false, false, false]);
    }
}
