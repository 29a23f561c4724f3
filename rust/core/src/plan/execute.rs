//! Executing a compiled step: loops, stop blobs, concurrent substeps and
//! instances on scoped threads, report steps and nets on reporter threads.
//! The per-run state (first error, running threads, report signal, cancel
//! tokens) is made here for each execution; the compiled step is only read.

use super::compile::{Compiled, Limit, PlanCtx, StepKind};
use crate::blob::BlobValue;
use crate::cancel::CancelToken;
use crate::error::{from_panic, Error, Result};
use crate::tensor::Tensor;
use crate::trace::{self, Detail};
use parking_lot::{Condvar, Mutex};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Reads a stop blob: empty means "don't stop"; otherwise it must be a
/// one-element bool tensor.
fn should_stop(c: &Compiled<'_>) -> Result<bool> {
    let Some(b) = &c.stop_blob else {
        return Ok(false);
    };
    let v = b.read();
    let name = c.step.should_stop_blob.as_deref().unwrap_or("");
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

pub(super) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(from_panic(p)))
}

/// Shared by a step's reporter threads: `done` is set (under the mutex, so no
/// wake-up is lost) when the step's main work is over.
struct ReportSignal {
    done: Mutex<bool>,
    cv: Condvar,
}

pub(super) fn exec_compiled<'p>(
    ctx: &PlanCtx<'p>,
    c: &Compiled<'p>,
    tok: &CancelToken,
) -> Result<bool> {
    let name = c.step.step_name();
    let _span = trace::span_str("step", name);
    if c.reports.is_empty() && c.report_net.is_none() {
        return run_main(ctx, c, tok).map_err(|e| e.with_step(name));
    }
    let step_tok = tok.child();
    let errors = FirstError::default();
    let signal = ReportSignal {
        done: Mutex::new(false),
        cv: Condvar::new(),
    };
    let running = Running::default();
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
            let interval = Duration::from_millis(w.step.run_every_ms.unwrap_or(0) as u64);
            let what = format!("report step '{}'", w.step.step_name());
            started = reporters.start(s, &what, interval, move || {
                let _span = trace::span("report", || format!("report step {}", w.step.step_name()));
                guarded(|| w.exec(ctx, step_tok)).map(|_| ())
            });
            if !started {
                break;
            }
        }
        if let (true, Some((net, interval))) = (started, &c.report_net) {
            let what = format!("report net '{}'", net.name());
            reporters.start(s, &what, *interval, move || {
                let _span = trace::span("report", || format!("report net {}", net.name()));
                guarded(|| net.lock(step_tok)?.run(&c.ws, step_tok)).map(|_| ())
            });
        }
        let main = guarded(|| run_main(ctx, c, step_tok));
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

/// A span for one iteration of a step's loop (when recording), from
/// `from` (the previous iteration's end) or now.
fn iteration_span(c: &Compiled<'_>, i: i64, from: Option<u64>) -> Option<trace::SpanGuard> {
    let mut span = trace::span_str_from("iteration", c.step.step_name(), from)?;
    span.set_detail(Detail::Iteration(i));
    Some(span)
}

fn run_main<'p>(ctx: &PlanCtx<'p>, c: &Compiled<'p>, tok: &CancelToken) -> Result<bool> {
    if c.kind == StepKind::Nets {
        // A net step (or an empty step, which still iterates).
        let mut i = 0i64;
        // Recorded iterations end where their last net run ended, and the
        // next one starts there: no clock reads beyond the nets' own.
        let mut from = None;
        while !tok.poll() && c.limit.allows(i) {
            let span = iteration_span(c, i, from);
            for net in &c.nets {
                if !net.lock(tok)?.run(&c.ws, tok)? {
                    return Ok(false);
                }
                if should_stop(c)? {
                    return Ok(true);
                }
            }
            if c.nets.is_empty() && matches!(c.limit, Limit::Unbounded) {
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
    while !tok.poll() && c.limit.allows(i) {
        let _span = iteration_span(c, i, None);
        if c.kind == StepKind::Sequential {
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
            let StepKind::Concurrent { workers } = c.kind else {
                unreachable!("a substep step is sequential or concurrent")
            };
            let iter_tok = tok.child();
            let errors = FirstError::default();
            let running = Running::default();
            std::thread::scope(|s| {
                for k in 0..workers {
                    let (w, errors, iter_tok) = (&c.recurring[k % n], &errors, &iter_tok);
                    let leaving = running.enter();
                    let lane =
                        trace::on().then(|| lane_label(&format!("{} #{}", w.step.step_name(), k)));
                    let started = std::thread::Builder::new().spawn_scoped(s, move || {
                        let _leaving = leaving;
                        let _span = lane.map(|lane| {
                            trace::label_thread(lane);
                            trace::span_str("instance", w.step.step_name()).map(|mut span| {
                                span.set_detail(Detail::Instance { k, of: workers });
                                span
                            })
                        });
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
                    if let Err(e) = started {
                        // The threads already running are cancelled and
                        // joined; nothing else of this iteration starts.
                        let what = format!(
                            "substep '{}' (thread {} of {workers})",
                            w.step.step_name(),
                            k + 1
                        );
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
