//! Executing a compiled plan: the per-run state. A [`PlanState`] binds the
//! immutable [`CompiledPlan`] to a workspace for one run (which nets it
//! re-creates, the GLOBAL_WORKSPACE_ID counter); a [`StepState`] is a
//! compiled step bound to a workspace (its nets created, its stop blob
//! resolved, its substeps bound). Running one: loops, stop blobs,
//! concurrent substeps and instances on scoped threads, report steps and
//! nets on reporter threads; the first error, the running threads, the
//! report signal and the cancel tokens are made for each execution.

use super::compile::{CompiledPlan, CompiledStep, Limit, StepKind};
use crate::blob::{Blob, BlobValue};
use crate::cancel::CancelToken;
use crate::error::{from_panic, Error, ErrorKind, Result};
use crate::net::SharedNet;
use crate::tensor::Tensor;
use crate::trace::{self, Detail};
use crate::workspace::Workspace;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One run of a compiled plan in a workspace.
pub(super) struct PlanState<'c> {
    pub(super) plan: &'c CompiledPlan<'c>,
    /// The plan's nets that already existed in the workspace when the run
    /// began: re-created once by this run (Caffe2's needsOverride).
    needs_override: HashMap<&'c str, AtomicBool>,
    create_lock: Mutex<()>,
    gws_seq: AtomicI32,
}

impl<'c> PlanState<'c> {
    pub(super) fn new(ws: &Workspace, plan: &'c CompiledPlan<'c>) -> Self {
        PlanState {
            plan,
            needs_override: plan
                .nets
                .keys()
                .map(|&name| (name, AtomicBool::new(ws.has_net(name))))
                .collect(),
            create_lock: Mutex::new(()),
            gws_seq: AtomicI32::new(0),
        }
    }

    /// The net of that name in `ws`, created from the plan's definition the
    /// first time (nets are per workspace, never inherited).
    fn net(&self, ws: &Arc<Workspace>, name: &str) -> Result<SharedNet> {
        let (Some(def), Some(needs_override)) =
            (self.plan.nets.get(name), self.needs_override.get(name))
        else {
            return Err(Error::internal(format!(
                "a compiled step names the net '{name}', which its plan does not define"
            )));
        };
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

/// A compiled step bound to a workspace: its nets created, its stop blob
/// resolved, its substeps bound. Only read while it runs.
pub(super) struct StepState<'c> {
    pub(super) c: &'c CompiledStep<'c>,
    pub(super) ws: Arc<Workspace>,
    recurring: Vec<SubstepState<'c>>,
    reports: Vec<SubstepState<'c>>,
    nets: Vec<SharedNet>,
    stop_blob: Option<Blob>,
    report_net: Option<SharedNet>,
}

impl<'c> StepState<'c> {
    /// Binds `c` to `parent_ws` (or to a new child of it, with
    /// `create_workspace`): substeps first, then nets, the stop blob and
    /// the report net, as Caffe2's compiled step did.
    pub(super) fn bind(
        run: &PlanState<'c>,
        c: &'c CompiledStep<'c>,
        parent_ws: &Arc<Workspace>,
    ) -> Result<Self> {
        let name = c.name;
        let ws = if c.create_workspace {
            run.child_workspace(parent_ws)?
        } else {
            parent_ws.clone()
        };
        let bind_all = |steps: &'c [CompiledStep<'c>]| {
            steps
                .iter()
                .map(|s| SubstepState::new(run, s, &ws))
                .collect::<Result<Vec<_>>>()
        };
        let recurring = bind_all(&c.recurring)?;
        let reports = bind_all(&c.reports)?;
        let nets = c
            .nets
            .iter()
            .map(|n| run.net(&ws, n).map_err(|e| e.with_step(name)))
            .collect::<Result<Vec<_>>>()?;
        let stop_blob = match c.stop_blob {
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
        let report_net = match c.report_net {
            None => None,
            Some((n, _)) => Some(run.net(&ws, n).map_err(|e| e.with_step(name))?),
        };
        Ok(StepState {
            c,
            ws,
            recurring,
            reports,
            nets,
            stop_blob,
            report_net,
        })
    }
}

/// A substep as its parent holds it: bound once, or (with
/// `create_workspace`) bound afresh in a new child workspace on every
/// execution.
pub(super) struct SubstepState<'c> {
    c: &'c CompiledStep<'c>,
    parent_ws: Arc<Workspace>,
    bound: Option<StepState<'c>>,
}

impl<'c> SubstepState<'c> {
    pub(super) fn new(
        run: &PlanState<'c>,
        c: &'c CompiledStep<'c>,
        parent_ws: &Arc<Workspace>,
    ) -> Result<Self> {
        let bound = if c.create_workspace {
            None
        } else {
            Some(StepState::bind(run, c, parent_ws)?)
        };
        Ok(SubstepState {
            c,
            parent_ws: parent_ws.clone(),
            bound,
        })
    }

    pub(super) fn exec(&self, run: &PlanState<'c>, tok: &CancelToken) -> Result<bool> {
        match &self.bound {
            Some(b) => exec_step(run, b, tok),
            None => {
                // The child workspace lives exactly as long as this execution.
                let b = StepState::bind(run, self.c, &self.parent_ws)?;
                exec_step(run, &b, tok)
            }
        }
    }
}

/// Reads a stop blob: empty means "don't stop"; otherwise it must be a
/// one-element bool tensor.
fn should_stop(c: &StepState<'_>) -> Result<bool> {
    let Some(b) = &c.stop_blob else {
        return Ok(false);
    };
    let v = b.read();
    let name = c.c.stop_blob.unwrap_or("");
    match &*v {
        BlobValue::Empty => Ok(false),
        BlobValue::Tensor(Tensor::Bool(a)) if a.len() == 1 => {
            Ok(*a.iter().next().expect("one element"))
        }
        other => Err(Error::type_error(format!(
            "should_stop_blob '{name}' expects a scalar boolean, got {}{}",
            other.kind_name(),
            match other {
                BlobValue::Tensor(t) => format!(" of shape {:?}", t.shape()),
                _ => String::new(),
            }
        ))
        .with_blob(name)
        .with_step(c.c.name)),
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

pub(super) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(from_panic(p)))
}

/// Shared by a step's reporter threads: `done` is set (under the mutex, so no
/// wake-up is lost) when the step's main work is over.
struct ReportSignal {
    done: Mutex<bool>,
    cv: Condvar,
}

pub(super) fn exec_step<'c>(
    run: &PlanState<'c>,
    c: &StepState<'c>,
    tok: &CancelToken,
) -> Result<bool> {
    let name = c.c.name;
    let _span = trace::span_str("step", name);
    if c.reports.is_empty() && c.report_net.is_none() {
        return run_main(run, c, tok).map_err(|e| e.with_step(name));
    }
    let step_tok = tok.child();
    let errors = FirstError::default();
    let signal = ReportSignal {
        done: Mutex::new(false),
        cv: Condvar::new(),
    };
    let running = Running::default();
    crate::threads::keep_spare();
    let main = std::thread::scope(|s| {
        let (signal, errors, step_tok, running) = (&signal, &errors, &step_tok, &running);
        let reporters = Reporters {
            signal,
            errors,
            step_tok,
            running,
        };
        let mut started = true;
        for w in &c.reports {
            let interval = w.c.report_every.unwrap_or_default();
            let what = format!("report step '{}'", w.c.name);
            started = reporters.start(s, &what, interval, move || {
                let _span = trace::span("report", || format!("report step {}", w.c.name));
                guarded(|| w.exec(run, step_tok)).map(|_| ())
            });
            if !started {
                break;
            }
        }
        if let (true, Some(net), Some((_, interval))) = (started, &c.report_net, c.c.report_net) {
            let what = format!("report net '{}'", net.name());
            reporters.start(s, &what, interval, move || {
                let _span = trace::span("report", || format!("report net {}", net.name()));
                guarded(|| net.lock(step_tok)?.run(&c.ws, step_tok)).map(|_| ())
            });
        }
        let main = guarded(|| run_main(run, c, step_tok));
        *signal.done.lock() = true;
        signal.cv.notify_all();
        running.wait(tok);
        main
    });
    // A reporter that failed cancelled the main work: its error is the one
    // to report, not the cancellation it caused.
    match (main, errors.take()) {
        (Err(e), Some(first)) if e.is_cancelled() => Err(first.with_step(name)),
        (Err(e), _) => Err(e.with_step(name)),
        (Ok(_), Some(first)) => Err(first.with_step(name)),
        (Ok(main), None) => Ok(main),
    }
}

/// What a step's reporter threads share.
struct Reporters<'a> {
    signal: &'a ReportSignal,
    errors: &'a FirstError,
    step_tok: &'a CancelToken,
    running: &'a Running,
}

impl<'a> Reporters<'a> {
    /// Starts a reporter running `body`; false (the error recorded, the step
    /// cancelled) when the thread cannot be started.
    fn start<'scope>(
        &self,
        s: &'scope std::thread::Scope<'scope, '_>,
        what: &str,
        interval: Duration,
        body: impl Fn() -> Result<()> + Send + 'scope,
    ) -> bool
    where
        'a: 'scope,
    {
        let Reporters {
            signal,
            errors,
            step_tok,
            running,
        } = *self;
        let leaving = running.enter();
        let lane = trace::on().then(|| lane_label(what));
        let started = std::thread::Builder::new().spawn_scoped(s, move || {
            let _leaving = leaving;
            if let Some(lane) = lane {
                trace::label_thread(lane);
            }
            reporter_loop(signal, interval, errors, step_tok, body)
        });
        if let Err(e) = started {
            crate::threads::release_spare();
            errors.record(crate::threads::cannot_start(what, &e));
            step_tok.cancel();
            return false;
        }
        true
    }
}

/// Counts the threads a step started and still running, so the thread that
/// started them waits in slices that look at its token (running its
/// interrupt check, see `cancel`) instead of blocking in the scope's join.
#[derive(Default)]
struct Running {
    n: Mutex<usize>,
    all_left: Condvar,
}

/// Held by a started thread (or by the closure of one that could not
/// start): counts it out when dropped, also on a panic.
struct Leaving<'a>(&'a Running);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        let mut n = self.0.n.lock();
        *n -= 1;
        if *n == 0 {
            self.0.all_left.notify_all();
        }
    }
}

impl Running {
    fn enter(&self) -> Leaving<'_> {
        *self.n.lock() += 1;
        Leaving(self)
    }

    /// Waits until every thread has left. Cancellation (or an interrupt
    /// noticed here) reaches them through their tokens, children of `tok`.
    fn wait(&self, tok: &CancelToken) {
        let mut n = self.n.lock();
        while *n > 0 {
            if self
                .all_left
                .wait_for(&mut n, crate::cancel::POLL)
                .timed_out()
            {
                parking_lot::MutexGuard::unlocked(&mut n, || tok.poll_now());
            }
        }
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

/// The timeline lane of a thread started by this one: its label under this
/// thread's (`trace.rs`).
fn lane_label(what: &str) -> String {
    match trace::thread_label() {
        Some(parent) => format!("{parent} / {what}"),
        None => what.to_string(),
    }
}

fn run_main<'c>(run: &PlanState<'c>, c: &StepState<'c>, tok: &CancelToken) -> Result<bool> {
    let (kind, limit) = (c.c.kind, c.c.limit);
    if kind == StepKind::Nets {
        // A net step (or an empty step, which still iterates).
        let mut i = 0i64;
        if let [net] = &c.nets[..] {
            // One net: its runs and the iterations share a loop record
            // (`trace::LoopRecord`), which writes the same events.
            let mut rec = trace::LoopRecord::new(c.c.name);
            while !tok.poll() && limit.allows(i) {
                rec.begin(i);
                if !net.lock(tok)?.run_in_loop(&c.ws, tok, &mut rec)? {
                    return Ok(false);
                }
                if should_stop(c)? {
                    return Ok(true);
                }
                rec.end();
                i += 1;
            }
            return Ok(true);
        }
        // Recorded iterations end where their last net run ended, and the
        // next one starts there: no clock reads beyond the nets' own.
        let mut from = None;
        let mut spans = trace::Iterations::new(c.c.name);
        while !tok.poll() && limit.allows(i) {
            let span = spans.begin(i, from);
            for net in &c.nets {
                if !net.lock(tok)?.run(&c.ws, tok)? {
                    return Ok(false);
                }
                if should_stop(c)? {
                    return Ok(true);
                }
            }
            if c.nets.is_empty() && matches!(limit, Limit::Unbounded) {
                // Nothing can ever set the stop blob: wait for cancellation
                // (or an interrupt) without burning a core.
                let _ = tok.sleep(crate::cancel::POLL);
            }
            from = span.map(trace::SpanGuard::end_after_nets);
            i += 1;
        }
        return Ok(true);
    }
    let mut i = 0i64;
    let mut spans = trace::Iterations::new(c.c.name);
    while !tok.poll() && limit.allows(i) {
        let _span = spans.begin(i, None);
        if kind == StepKind::Sequential {
            for w in &c.recurring {
                if !w.exec(run, tok)? {
                    return Ok(false);
                }
                if should_stop(c)? {
                    return Ok(true);
                }
            }
        } else {
            let n = c.recurring.len();
            let StepKind::Concurrent { workers } = kind else {
                unreachable!("a substep step is sequential or concurrent")
            };
            let iter_tok = tok.child();
            let errors = FirstError::default();
            let running = Running::default();
            crate::threads::keep_spare();
            std::thread::scope(|s| {
                for k in 0..workers {
                    let (w, errors, iter_tok) = (&c.recurring[k % n], &errors, &iter_tok);
                    let leaving = running.enter();
                    let lane = trace::on().then(|| lane_label(&format!("{} #{}", w.c.name, k)));
                    let started = std::thread::Builder::new().spawn_scoped(s, move || {
                        let _leaving = leaving;
                        let _span = lane.map(|lane| {
                            trace::label_thread(lane);
                            trace::span_str("instance", w.c.name).map(|mut span| {
                                span.set_detail(Detail::Instance { k, of: workers });
                                span
                            })
                        });
                        if errors.failed.load(Ordering::SeqCst) {
                            return;
                        }
                        match guarded(|| w.exec(run, iter_tok)) {
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
                    if let Err(e) = started {
                        // The threads already running are cancelled and
                        // joined; nothing else of this iteration starts.
                        crate::threads::release_spare();
                        let what =
                            format!("substep '{}' (thread {} of {workers})", w.c.name, k + 1);
                        errors.record(crate::threads::cannot_start(&what, &e));
                        iter_tok.cancel();
                        break;
                    }
                }
                running.wait(tok);
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
