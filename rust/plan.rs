//! The execution-step scheduler: runs a `PlanDef` with Caffe2's step rules.
//!
//! How work is spread out:
//! - a step's nets and sequential substeps run on the calling thread;
//! - concurrent substeps and concurrent instances each get their own scoped OS
//!   thread for the iteration (they may block on queues or on each other, so
//!   they must never wait for a slot in a bounded pool);
//! - report steps get one thread each, woken by a condition variable;
//! - rayon's pool is left to data-parallel work inside kernels, which never
//!   blocks.
//!
//! Failure handling (better than Caffe2's abort-by-default): the first error of
//! any concurrent worker or reporter is recorded, the others are cancelled
//! through a [`CancelToken`], every thread is joined, and the error is returned
//! with the step that raised it. A soft failure (an op returning false) also
//! cancels siblings, so a stuck sibling can never hang the plan.

use crate::blob::{Blob, BlobValue};
use crate::cancel::CancelToken;
use crate::error::{from_panic, Error, ErrorKind, Result};
use crate::ir::{ExecutionStep, NetDef, PlanDef};
use crate::net::SharedNet;
use crate::tensor::Tensor;
use crate::workspace::Workspace;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Plan-wide state: the net definitions and the GLOBAL_WORKSPACE_ID counter.
struct PlanCtx<'p> {
    defs: HashMap<&'p str, (&'p NetDef, AtomicBool)>,
    create_lock: Mutex<()>,
    gws_seq: AtomicI32,
}

impl<'p> PlanCtx<'p> {
    fn new(ws: &Workspace, plan: &'p PlanDef) -> Result<Self> {
        let mut defs = HashMap::new();
        for net in &plan.network {
            let name = net.net_name();
            // A net that already exists in the workspace is re-created once
            // by this plan (Caffe2's needsOverride).
            if defs.insert(name, (net, AtomicBool::new(ws.has_net(name)))).is_some() {
                return Err(Error::invalid_plan(format!("the plan defines two nets named '{name}'")).with_net(name));
            }
        }
        Ok(PlanCtx { defs, create_lock: Mutex::new(()), gws_seq: AtomicI32::new(0) })
    }

    /// The net of that name in `ws`, created from the plan's definition the
    /// first time (nets are per workspace, never inherited).
    fn net(&self, ws: &Arc<Workspace>, step: &ExecutionStep, name: &str) -> Result<SharedNet> {
        let (def, needs_override) = self.defs.get(name).ok_or_else(|| {
            Error::invalid_plan(format!("ExecutionStep '{}' uses undefined net '{name}'", step.step_name())).with_net(name)
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

    fn child_workspace(&self, parent: &Arc<Workspace>) -> Result<Arc<Workspace>> {
        let child = Workspace::new_child(parent);
        if let Some(node) = parent.get_blob("NODE_ID") {
            let node_id = match &*node.read() {
                BlobValue::Tensor(t @ Tensor::I32(_)) => Some(t.scalar_value::<i32>()?),
                _ => None,
            };
            if let Some(node_id) = node_id {
                let seq = self.gws_seq.fetch_add(1, Ordering::SeqCst);
                if seq >= 1 << 16 {
                    return Err(Error::invalid_plan("more than 65535 child workspaces in one plan run with NODE_ID set"));
                }
                let id = seq + (node_id << 16);
                child.create_local_blob("GLOBAL_WORKSPACE_ID").set(BlobValue::Tensor(Tensor::scalar(id)));
            }
        }
        Ok(child)
    }
}

#[derive(Clone, Copy)]
enum Limit {
    Count(i64),
    OnlyOnce,
    Unbounded,
}

impl Limit {
    fn allows(self, i: i64) -> bool {
        match self {
            Limit::Count(n) => i < n,
            Limit::OnlyOnce => i == 0,
            Limit::Unbounded => true,
        }
    }
}

/// A step bound to a workspace: its nets created, its stop blob resolved.
struct Compiled<'p> {
    step: &'p ExecutionStep,
    ws: Arc<Workspace>,
    recurring: Vec<Wrapper<'p>>,
    reports: Vec<Wrapper<'p>>,
    nets: Vec<SharedNet>,
    stop_blob: Option<Blob>,
    report_net: Option<(SharedNet, Duration)>,
    limit: Limit,
}

/// A step as seen by its parent: compiled once, or (with `create_workspace`)
/// compiled afresh in a new child workspace on every execution.
struct Wrapper<'p> {
    step: &'p ExecutionStep,
    parent_ws: Arc<Workspace>,
    eager: Option<Compiled<'p>>,
}

fn validate(step: &ExecutionStep) -> Result<Limit> {
    if !step.substep.is_empty() && !step.network.is_empty() {
        return Err(Error::invalid_plan("a step cannot have both substeps and networks"));
    }
    if let Some(n) = step.num_concurrent_instances {
        if n < 0 {
            return Err(Error::invalid_plan(format!("num_concurrent_instances must be >= 0, got {n}")));
        }
    }
    if let Some(ms) = step.run_every_ms {
        if ms < 0 {
            return Err(Error::invalid_plan(format!("run_every_ms must be >= 0, got {ms}")));
        }
    }
    if step.report_net.is_some() {
        match step.report_interval {
            None => return Err(Error::invalid_plan("report_net is set but report_interval is not")),
            Some(s) if s < 0 => return Err(Error::invalid_plan(format!("report_interval must be >= 0, got {s}"))),
            _ => {}
        }
    }
    match (&step.should_stop_blob, step.num_iter, step.only_once) {
        (None, _, Some(_)) => Err(Error::invalid_plan("only_once is only supported together with should_stop_blob")),
        (None, n, None) => Ok(Limit::Count(n.unwrap_or(1))),
        (Some(_), Some(_), _) => Err(Error::invalid_plan("num_iter and should_stop_blob cannot both be set on one step")),
        (Some(_), None, Some(true)) => Ok(Limit::OnlyOnce),
        (Some(_), None, _) => Ok(Limit::Unbounded),
    }
}

fn compile<'p>(ctx: &PlanCtx<'p>, step: &'p ExecutionStep, parent_ws: &Arc<Workspace>) -> Result<Compiled<'p>> {
    let name = step.step_name();
    let limit = validate(step).map_err(|e| e.with_step(name))?;
    let ws = if step.create_workspace.unwrap_or(false) { ctx.child_workspace(parent_ws)? } else { parent_ws.clone() };
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
            Error::new(ErrorKind::BlobNotFound, format!("should_stop_blob '{b}' does not exist")).with_blob(b).with_step(name)
        })?),
    };
    let report_net = match &step.report_net {
        None => None,
        Some(n) => {
            let secs = step.report_interval.unwrap_or(0) as u64;
            Some((ctx.net(&ws, step, n).map_err(|e| e.with_step(name))?, Duration::from_secs(secs)))
        }
    };
    Ok(Compiled { step, ws, recurring, reports, nets, stop_blob, report_net, limit })
}

impl<'p> Wrapper<'p> {
    fn new(ctx: &PlanCtx<'p>, step: &'p ExecutionStep, parent_ws: &Arc<Workspace>) -> Result<Self> {
        let eager = if step.create_workspace.unwrap_or(false) {
            // Still validate now, so a malformed step fails before anything runs.
            validate(step).map_err(|e| e.with_step(step.step_name()))?;
            None
        } else {
            Some(compile(ctx, step, parent_ws)?)
        };
        Ok(Wrapper { step, parent_ws: parent_ws.clone(), eager })
    }

    fn exec(&self, ctx: &PlanCtx<'p>, tok: &CancelToken) -> Result<bool> {
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

/// Reads a stop blob: empty means "don't stop"; otherwise it must be a
/// one-element bool tensor.
fn should_stop(c: &Compiled<'_>) -> Result<bool> {
    let Some(b) = &c.stop_blob else { return Ok(false) };
    let v = b.read();
    let name = c.step.should_stop_blob.as_deref().unwrap_or("");
    match &*v {
        BlobValue::Empty => Ok(false),
        BlobValue::Tensor(Tensor::Bool(a)) if a.len() == 1 => Ok(*a.iter().next().expect("one element")),
        other => Err(Error::type_error(format!(
            "should_stop_blob '{name}' expects a scalar boolean, got {}{}",
            other.kind_name(),
            match other {
                BlobValue::Tensor(t) => format!(" of shape {:?}", t.shape()),
                _ => String::new(),
            }
        ))
        .with_blob(name)
        .with_step(c.step.step_name())),
    }
}

/// The first error of a group of concurrent workers.
#[derive(Default)]
struct FirstError {
    err: Mutex<Option<Error>>,
    failed: AtomicBool,
}

impl FirstError {
    fn record(&self, e: Error) {
        let mut g = self.err.lock();
        if g.is_none() {
            *g = Some(e);
        }
        self.failed.store(true, Ordering::SeqCst);
    }
    fn soft_fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }
    fn take(&self) -> Option<Error> {
        self.err.lock().take()
    }
}

fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(from_panic(p)))
}

/// Shared by a step's reporter threads: `done` is set (under the mutex, so no
/// wake-up is lost) when the step's main work is over.
struct ReportSignal {
    done: Mutex<bool>,
    cv: Condvar,
}

fn exec_compiled<'p>(ctx: &PlanCtx<'p>, c: &Compiled<'p>, tok: &CancelToken) -> Result<bool> {
    let name = c.step.step_name();
    if c.reports.is_empty() && c.report_net.is_none() {
        return run_main(ctx, c, tok).map_err(|e| e.with_step(name));
    }
    let step_tok = tok.child();
    let errors = FirstError::default();
    let signal = ReportSignal { done: Mutex::new(false), cv: Condvar::new() };
    let main = std::thread::scope(|s| {
        for w in &c.reports {
            let interval = Duration::from_millis(w.step.run_every_ms.unwrap_or(0) as u64);
            let (signal, errors, step_tok) = (&signal, &errors, &step_tok);
            s.spawn(move || {
                reporter_loop(signal, interval, errors, step_tok, || guarded(|| w.exec(ctx, step_tok)).map(|_| ()))
            });
        }
        if let Some((net, interval)) = &c.report_net {
            let (signal, errors, step_tok) = (&signal, &errors, &step_tok);
            s.spawn(move || {
                reporter_loop(signal, *interval, errors, step_tok, || {
                    guarded(|| net.lock().run(&c.ws, step_tok)).map(|_| ())
                })
            });
        }
        let main = guarded(|| run_main(ctx, c, &step_tok));
        *signal.done.lock() = true;
        signal.cv.notify_all();
        main
    });
    let main = main.map_err(|e| e.with_step(name))?;
    match errors.take() {
        Some(e) => Err(e.with_step(name)),
        None => Ok(main),
    }
}

/// Runs `body` every `interval` until `done`, then once more. Ticks are on a
/// fixed grid from the start; a late tick is not made up for.
fn reporter_loop(
    signal: &ReportSignal,
    interval: Duration,
    errors: &FirstError,
    step_tok: &CancelToken,
    body: impl Fn() -> Result<()>,
) {
    let mut next = Instant::now() + interval;
    loop {
        let done = {
            let mut d = signal.done.lock();
            while !*d {
                if signal.cv.wait_until(&mut d, next).timed_out() {
                    break;
                }
            }
            *d
        };
        if let Err(e) = body() {
            if !e.is_cancelled() || errors.err.lock().is_none() {
                errors.record(e);
            }
            step_tok.cancel();
            return;
        }
        if done {
            return;
        }
        let now = Instant::now();
        next += interval;
        if next < now {
            next = now + interval;
        }
    }
}

fn run_main<'p>(ctx: &PlanCtx<'p>, c: &Compiled<'p>, tok: &CancelToken) -> Result<bool> {
    if !c.nets.is_empty() || c.step.substep.is_empty() {
        // A net step (or an empty step, which still iterates).
        let mut i = 0i64;
        while !tok.is_cancelled() && c.limit.allows(i) {
            for net in &c.nets {
                if !net.lock().run(&c.ws, tok)? {
                    return Ok(false);
                }
                if should_stop(c)? {
                    return Ok(true);
                }
            }
            if c.nets.is_empty() && matches!(c.limit, Limit::Unbounded) {
                // Nothing can ever set the stop blob: wait for cancellation
                // without burning a core.
                std::thread::sleep(crate::cancel::POLL);
            }
            i += 1;
        }
        return Ok(true);
    }
    let instances = match c.step.num_concurrent_instances {
        Some(n) => n as usize,
        None => 1,
    };
    let concurrent = c.step.concurrent_substeps.unwrap_or(false) && (c.recurring.len() + c.reports.len()) > 1;
    let sequential = !concurrent && c.step.num_concurrent_instances.is_none_or(|n| n <= 1);
    let mut i = 0i64;
    while !tok.is_cancelled() && c.limit.allows(i) {
        if sequential {
            for w in &c.recurring {
                if !w.exec(ctx, tok)? {
                    return Ok(false);
                }
                if should_stop(c)? {
                    return Ok(true);
                }
            }
        } else {
            let n = c.recurring.len();
            let workers = n * instances;
            let iter_tok = tok.child();
            let errors = FirstError::default();
            std::thread::scope(|s| {
                for k in 0..workers {
                    let (w, errors, iter_tok) = (&c.recurring[k % n], &errors, &iter_tok);
                    s.spawn(move || {
                        if errors.failed.load(Ordering::SeqCst) {
                            return;
                        }
                        match guarded(|| w.exec(ctx, iter_tok)) {
                            Ok(true) => {}
                            Ok(false) => {
                                errors.soft_fail();
                                iter_tok.cancel();
                            }
                            Err(e) => {
                                errors.record(e);
                                iter_tok.cancel();
                            }
                        }
                    });
                }
            });
            if let Some(e) = errors.take() {
                return Err(e);
            }
            if errors.failed.load(Ordering::SeqCst) {
                return Ok(false);
            }
            if should_stop(c)? {
                return Ok(true);
            }
        }
        i += 1;
    }
    Ok(true)
}

/// Runs a plan: its top-level steps in order, each compiled just before it
/// runs. `Ok(false)` is a soft failure; a cancelled run is `Err(Cancelled)`.
pub fn run_plan(ws: &Arc<Workspace>, plan: &PlanDef, cancel: &CancelToken) -> Result<bool> {
    if plan.execution_step.is_empty() {
        return Ok(true);
    }
    let ctx = PlanCtx::new(ws, plan)?;
    for step in &plan.execution_step {
        let w = Wrapper::new(&ctx, step, ws)?;
        let ok = w.exec(&ctx, cancel)?;
        cancel.check()?;
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Runs a single step as a plan of its own, with the nets given.
pub fn run_step(ws: &Arc<Workspace>, step: &ExecutionStep, nets: &[NetDef], cancel: &CancelToken) -> Result<bool> {
    let plan = PlanDef { name: step.name.clone(), network: nets.to_vec(), execution_step: vec![step.clone()] };
    run_plan(ws, &plan, cancel)
}
