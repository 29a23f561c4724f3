//! Compiling a step: validating it, deciding its [`StepKind`] and limit,
//! binding it to a workspace (nets created, stop blob resolved). Where a new
//! step kind goes: [`StepKind`], decided in [`compile`], run in
//! `execute::run_main`.

use super::execute::exec_compiled;
use crate::blob::{Blob, BlobValue};
use crate::cancel::CancelToken;
use crate::error::{Error, ErrorKind, Result};
use crate::ir::{ExecutionStep, NetDef, PlanDef};
use crate::net::SharedNet;
use crate::tensor::Tensor;
use crate::workspace::Workspace;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Plan-wide state: the net definitions and the GLOBAL_WORKSPACE_ID counter.
pub(super) struct PlanCtx<'p> {
    pub(super) defs: HashMap<&'p str, (&'p NetDef, AtomicBool)>,
    pub(super) create_lock: Mutex<()>,
    pub(super) gws_seq: AtomicI32,
}

impl<'p> PlanCtx<'p> {
    pub(super) fn new(ws: &Workspace, plan: &'p PlanDef) -> Result<Self> {
        let mut defs = HashMap::new();
        for net in &plan.network {
            let name = net.net_name();
            // A net that already exists in the workspace is re-created once
            // by this plan (Caffe2's needsOverride).
            if defs
                .insert(name, (net, AtomicBool::new(ws.has_net(name))))
                .is_some()
            {
                return Err(Error::invalid_plan(format!(
                    "the plan defines two nets named '{name}'"
                ))
                .with_net(name));
            }
        }
        Ok(PlanCtx {
            defs,
            create_lock: Mutex::new(()),
            gws_seq: AtomicI32::new(0),
        })
    }

    /// The net of that name in `ws`, created from the plan's definition the
    /// first time (nets are per workspace, never inherited).
    pub(super) fn net(
        &self,
        ws: &Arc<Workspace>,
        step: &ExecutionStep,
        name: &str,
    ) -> Result<SharedNet> {
        let (def, needs_override) = self.defs.get(name).ok_or_else(|| {
            Error::invalid_plan(format!(
                "ExecutionStep '{}' uses undefined net '{name}'",
                step.step_name()
            ))
            .with_net(name)
        })?;
        let _g = self.create_lock.lock();
        if needs_override.swap(false, Ordering::SeqCst) {
            return ws.create_net(def, true);
        }
        match ws.get_net(name) {
            Some(n) => Ok(n),
            None => ws.create_net(def, true),
        }
    }

    pub(super) fn child_workspace(&self, parent: &Arc<Workspace>) -> Result<Arc<Workspace>> {
        let child = Workspace::new_child(parent);
        if let Some(node) = parent.get_blob("NODE_ID") {
            let node_id = match &*node.read() {
                BlobValue::Tensor(t @ Tensor::I32(_)) => Some(t.scalar_value::<i32>()?),
                _ => None,
            };
            if let Some(node_id) = node_id {
                let seq = self.gws_seq.fetch_add(1, Ordering::SeqCst);
                if seq >= 1 << 16 {
                    return Err(Error::invalid_plan(
                        "more than 65535 child workspaces in one plan run with NODE_ID set",
                    ));
                }
                let id = seq + (node_id << 16);
                child
                    .create_local_blob("GLOBAL_WORKSPACE_ID")
                    .set(BlobValue::Tensor(Tensor::scalar(id)));
            }
        }
        Ok(child)
    }
}

#[derive(Clone, Copy)]
pub(super) enum Limit {
    Count(i64),
    OnlyOnce,
    Unbounded,
}

impl Limit {
    pub(super) fn allows(self, i: i64) -> bool {
        match self {
            Limit::Count(n) => i < n,
            Limit::OnlyOnce => i == 0,
            Limit::Unbounded => true,
        }
    }
}

/// How a step's main work runs, decided once when the step is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StepKind {
    /// Its nets in order (an empty step still iterates).
    Nets,
    /// Its substeps in order, on the calling thread.
    Sequential,
    /// `workers` threads per iteration: each substep `instances` times.
    Concurrent { workers: usize },
}

/// A step bound to a workspace: its nets created, its stop blob resolved,
/// its [`StepKind`] decided. Immutable while it runs; what changes during a
/// run (errors, threads, tokens) lives in `execute.rs`.
pub(super) struct Compiled<'p> {
    pub(super) step: &'p ExecutionStep,
    pub(super) ws: Arc<Workspace>,
    pub(super) recurring: Vec<Wrapper<'p>>,
    pub(super) reports: Vec<Wrapper<'p>>,
    pub(super) nets: Vec<SharedNet>,
    pub(super) stop_blob: Option<Blob>,
    pub(super) report_net: Option<(SharedNet, Duration)>,
    pub(super) limit: Limit,
    pub(super) kind: StepKind,
}

/// A step as seen by its parent: compiled once, or (with `create_workspace`)
/// compiled afresh in a new child workspace on every execution.
pub(super) struct Wrapper<'p> {
    pub(super) step: &'p ExecutionStep,
    pub(super) parent_ws: Arc<Workspace>,
    pub(super) eager: Option<Compiled<'p>>,
}

pub(super) fn validate(step: &ExecutionStep) -> Result<Limit> {
    if !step.substep.is_empty() && !step.network.is_empty() {
        return Err(Error::invalid_plan(
            "a step cannot have both substeps and networks",
        ));
    }
    if let Some(n) = step.num_concurrent_instances {
        if n < 0 {
            return Err(Error::invalid_plan(format!(
                "num_concurrent_instances must be >= 0, got {n}"
            )));
        }
    }
    if let Some(ms) = step.run_every_ms {
        if ms < 0 {
            return Err(Error::invalid_plan(format!(
                "run_every_ms must be >= 0, got {ms}"
            )));
        }
    }
    if step.report_net.is_some() {
        match step.report_interval {
            None => {
                return Err(Error::invalid_plan(
                    "report_net is set but report_interval is not",
                ))
            }
            Some(s) if s < 0 => {
                return Err(Error::invalid_plan(format!(
                    "report_interval must be >= 0, got {s}"
                )))
            }
            _ => {}
        }
    }
    match (&step.should_stop_blob, step.num_iter, step.only_once) {
        (None, _, Some(_)) => Err(Error::invalid_plan(
            "only_once is only supported together with should_stop_blob",
        )),
        (None, n, None) => Ok(Limit::Count(n.unwrap_or(1))),
        (Some(_), Some(_), _) => Err(Error::invalid_plan(
            "num_iter and should_stop_blob cannot both be set on one step",
        )),
        (Some(_), None, Some(true)) => Ok(Limit::OnlyOnce),
        (Some(_), None, _) => Ok(Limit::Unbounded),
    }
}

pub(super) fn compile<'p>(
    ctx: &PlanCtx<'p>,
    step: &'p ExecutionStep,
    parent_ws: &Arc<Workspace>,
) -> Result<Compiled<'p>> {
    let name = step.step_name();
    let limit = validate(step).map_err(|e| e.with_step(name))?;
    let ws = if step.create_workspace.unwrap_or(false) {
        ctx.child_workspace(parent_ws)?
    } else {
        parent_ws.clone()
    };
    let mut recurring = Vec::new();
    let mut reports = Vec::new();
    let mut nets = Vec::new();
    if !step.substep.is_empty() {
        for sub in &step.substep {
            let w = Wrapper::new(ctx, sub, &ws)?;
            if sub.run_every_ms.is_some() {
                reports.push(w);
            } else {
                recurring.push(w);
            }
        }
    } else {
        for n in &step.network {
            nets.push(ctx.net(&ws, step, n).map_err(|e| e.with_step(name))?);
        }
    }
    let stop_blob = match &step.should_stop_blob {
        None => None,
        Some(b) => Some(ws.get_blob(b).ok_or_else(|| {
            Error::new(
                ErrorKind::BlobNotFound,
                format!("should_stop_blob '{b}' does not exist"),
            )
            .with_blob(b)
            .with_step(name)
        })?),
    };
    let report_net = match &step.report_net {
        None => None,
        Some(n) => {
            let secs = step.report_interval.unwrap_or(0) as u64;
            Some((
                ctx.net(&ws, step, n).map_err(|e| e.with_step(name))?,
                Duration::from_secs(secs),
            ))
        }
    };
    let kind = if !nets.is_empty() || step.substep.is_empty() {
        StepKind::Nets
    } else {
        let concurrent =
            step.concurrent_substeps.unwrap_or(false) && (recurring.len() + reports.len()) > 1;
        if !concurrent && step.num_concurrent_instances.is_none_or(|n| n <= 1) {
            StepKind::Sequential
        } else {
            let instances = step.num_concurrent_instances.map_or(1, |n| n as usize);
            StepKind::Concurrent {
                workers: recurring.len() * instances,
            }
        }
    };
    Ok(Compiled {
        step,
        ws,
        recurring,
        reports,
        nets,
        stop_blob,
        report_net,
        limit,
        kind,
    })
}

impl<'p> Wrapper<'p> {
    pub(super) fn new(
        ctx: &PlanCtx<'p>,
        step: &'p ExecutionStep,
        parent_ws: &Arc<Workspace>,
    ) -> Result<Self> {
        let eager = if step.create_workspace.unwrap_or(false) {
            // Still validate now, so a malformed step fails before anything runs.
            validate(step).map_err(|e| e.with_step(step.step_name()))?;
            None
        } else {
            Some(compile(ctx, step, parent_ws)?)
        };
        Ok(Wrapper {
            step,
            parent_ws: parent_ws.clone(),
            eager,
        })
    }

    pub(super) fn exec(&self, ctx: &PlanCtx<'p>, tok: &CancelToken) -> Result<bool> {
        match &self.eager {
            Some(c) => exec_compiled(ctx, c, tok),
            None => {
                // The child workspace lives exactly as long as this execution.
                let c = compile(ctx, self.step, &self.parent_ws)?;
                exec_compiled(ctx, &c, tok)
            }
        }
    }
}
