//! Compiling a plan: every step validated, its [`StepKind`], limit, nets,
//! stop blob name and report period decided once, into an immutable
//! [`CompiledPlan`] that knows no workspace. Running it (binding it to a
//! workspace: nets created, stop blobs resolved) is `execute.rs`'s
//! per-run state. Where a new step kind goes: [`StepKind`], decided in
//! [`CompiledStep::compile`], run in `execute::run_main`.

use crate::error::{Error, Result};
use crate::ir::{ExecutionStep, NetDef, PlanDef};
use std::collections::HashMap;
use std::time::Duration;

/// How many times a step's main work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// A plan compiled from its definition, once: its nets by name and its
/// top-level steps. Immutable, and bound to no workspace.
pub(super) struct CompiledPlan<'p> {
    pub(super) nets: HashMap<&'p str, &'p NetDef>,
    /// Each top-level step, or the error that compiling it gave: as in
    /// Caffe2, a step's error is reported when the plan reaches it, after
    /// the steps before it ran.
    pub(super) steps: Vec<Result<CompiledStep<'p>>>,
}

/// A step compiled from its definition: validated, its kind and limit
/// decided, its nets checked against the plan's. Immutable; what a run
/// binds or counts lives in `execute.rs`.
#[derive(Debug)]
pub(super) struct CompiledStep<'p> {
    pub(super) name: &'p str,
    pub(super) kind: StepKind,
    pub(super) limit: Limit,
    /// Runs in a child workspace made afresh for each execution.
    pub(super) create_workspace: bool,
    /// The nets of a net step, in order.
    pub(super) nets: Vec<&'p str>,
    /// The substeps that make up the main work, in order.
    pub(super) recurring: Vec<CompiledStep<'p>>,
    /// The report substeps (`run_every_ms`), each run on a thread of its own.
    pub(super) reports: Vec<CompiledStep<'p>>,
    /// As a report substep: its period.
    pub(super) report_every: Option<Duration>,
    /// The report net and its period.
    pub(super) report_net: Option<(&'p str, Duration)>,
    pub(super) stop_blob: Option<&'p str>,
}

impl<'p> CompiledPlan<'p> {
    /// Compiles every step of `plan`. The plan's own errors (two nets of
    /// one name) are returned here; a step's are kept for when it is reached.
    pub(super) fn compile(plan: &'p PlanDef) -> Result<Self> {
        let mut nets = HashMap::new();
        for net in &plan.network {
            let name = net.net_name();
            if nets.insert(name, net).is_some() {
                return Err(Error::invalid_plan(format!(
                    "the plan defines two nets named '{name}'"
                ))
                .with_net(name));
            }
        }
        let mut compiled = CompiledPlan {
            nets,
            steps: Vec::with_capacity(plan.execution_step.len()),
        };
        for step in &plan.execution_step {
            let c = CompiledStep::compile(&compiled.nets, step);
            compiled.steps.push(c);
        }
        Ok(compiled)
    }
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

impl<'p> CompiledStep<'p> {
    /// Compiles `step` and its substeps (recursively: the plan's nesting
    /// was bounded by `check_nesting`), checking the nets it names against
    /// the plan's `nets`.
    pub(super) fn compile(
        nets: &HashMap<&'p str, &'p NetDef>,
        step: &'p ExecutionStep,
    ) -> Result<Self> {
        let name = step.step_name();
        let limit = validate(step).map_err(|e| e.with_step(name))?;
        let known = |net: &'p str| -> Result<&'p str> {
            if nets.contains_key(net) {
                Ok(net)
            } else {
                Err(Error::invalid_plan(format!(
                    "ExecutionStep '{name}' uses undefined net '{net}'"
                ))
                .with_net(net)
                .with_step(name))
            }
        };
        let mut recurring = Vec::new();
        let mut reports = Vec::new();
        for sub in &step.substep {
            let c = CompiledStep::compile(nets, sub)?;
            if c.report_every.is_some() {
                reports.push(c);
            } else {
                recurring.push(c);
            }
        }
        let step_nets = step
            .network
            .iter()
            .map(|n| known(n))
            .collect::<Result<Vec<_>>>()?;
        let report_net = match &step.report_net {
            None => None,
            Some(n) => {
                let secs = step.report_interval.unwrap_or(0) as u64;
                Some((known(n)?, Duration::from_secs(secs)))
            }
        };
        let kind = if !step_nets.is_empty() || step.substep.is_empty() {
            StepKind::Nets
        } else {
            let concurrent = step.concurrent_substeps.unwrap_or(false) && step.substep.len() > 1;
            if !concurrent && step.num_concurrent_instances.is_none_or(|n| n <= 1) {
                StepKind::Sequential
            } else {
                let instances = step.num_concurrent_instances.map_or(1, |n| n as usize);
                StepKind::Concurrent {
                    workers: recurring.len() * instances,
                }
            }
        };
        Ok(CompiledStep {
            name,
            kind,
            limit,
            create_workspace: step.create_workspace.unwrap_or(false),
            nets: step_nets,
            recurring,
            reports,
            report_every: step.run_every_ms.map(|ms| Duration::from_millis(ms as u64)),
            report_net,
            stop_blob: step.should_stop_blob.as_deref(),
        })
    }
}
