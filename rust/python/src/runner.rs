//! Where calls run: on the calling thread with the GIL released
//! ([`run_here`]), or on a runner thread ([`run_detached`]); Ctrl-C, and
//! plans run in the background.

use crate::convert::decode;
use crate::errors::{guarded, to_py_err};
use crate::workspace::PyWorkspace;
use ferrocaffe::cancel::CancelToken;
use ferrocaffe::error::Error;
use ferrocaffe::ir;
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- dispatch --
//
// A call runs on the calling thread with the GIL released (`run_here`): no
// hand-off to another thread, so its cost does not depend on whether a
// spare core exists. On Python's main thread the run's token polls for
// Ctrl-C (`cancel.rs`: blocking waits at every slice, busy loops when the
// watchdog asks), and a Python op in the run runs on this same thread,
// where a signal interrupts `time.sleep`, lock waits and loops as in plain
// Python. Only a plan that may run Python ops on threads it starts goes to
// a runner thread (`run_detached`), because such an op cannot be
// interrupted from outside and must be left behind if it does not return.

thread_local! {
    /// The token of the Python op running on this thread, if any: a run it
    /// starts (a re-entrant run) is cancelled with the run that called it.
    static CALLER: std::cell::RefCell<Option<CancelToken>> =
        const { std::cell::RefCell::new(None) };
}

/// Sets [`CALLER`] for the duration of a Python op's call.
pub(crate) struct CallerGuard(Option<CancelToken>);

impl CallerGuard {
    pub(crate) fn set(tok: &CancelToken) -> CallerGuard {
        CallerGuard(CALLER.with(|c| c.replace(Some(tok.clone()))))
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        let previous = self.0.take();
        CALLER.with(|c| *c.borrow_mut() = previous);
    }
}

fn caller_token() -> Option<CancelToken> {
    CALLER.with(|c| c.borrow().clone())
}

pub(crate) fn os_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

/// Whether this is Python's main thread, the one that runs signal handlers.
fn on_main_thread(py: Python<'_>) -> bool {
    static MAIN: PyOnceLock<u64> = PyOnceLock::new();
    let main = MAIN.get_or_init(py, || {
        (|| -> PyResult<u64> {
            py.import("threading")?
                .call_method0("main_thread")?
                .getattr("ident")?
                .extract()
        })()
        .unwrap_or(0)
    });
    *main == os_thread()
}

/// A call's token, and on the main thread where a signal's exception goes.
struct RunToken {
    tok: CancelToken,
    interrupt: Option<Arc<parking_lot::Mutex<Option<PyErr>>>>,
    _watched: Option<ferrocaffe::cancel::Watched>,
}

impl RunToken {
    fn new(py: Python<'_>) -> RunToken {
        if let Some(parent) = caller_token() {
            // Nested in a Python op: the outer run polls (and is cancelled).
            return RunToken {
                tok: parent.child(),
                interrupt: None,
                _watched: None,
            };
        }
        if !on_main_thread(py) {
            return RunToken {
                tok: CancelToken::new(),
                interrupt: None,
                _watched: None,
            };
        }
        let slot = Arc::new(parking_lot::Mutex::new(None));
        let s2 = slot.clone();
        let tok = CancelToken::with_interrupt_check(move || {
            Python::attach(|py| match py.check_signals() {
                Ok(()) => false,
                Err(e) => {
                    *s2.lock() = Some(e);
                    true
                }
            })
        });
        // Without the watchdog (no thread to be had) blocking waits still
        // poll; only busy loops then run to their end before Ctrl-C shows.
        let watched = ferrocaffe::cancel::watch(&tok).ok();
        RunToken {
            tok,
            interrupt: Some(slot),
            _watched: watched,
        }
    }

    fn finish<T>(self, py: Python<'_>, r: ferrocaffe::Result<T>) -> PyResult<T> {
        // A signal handler ran (and consumed the signal) inside the run: its
        // exception is raised even if the run finished first. Otherwise a
        // cancelled run (one nested in a Python op of a cancelled run) is
        // CancelledError, like every other error converted once.
        if let Some(e) = self.interrupt.as_ref().and_then(|s| s.lock().take()) {
            return Err(e);
        }
        r.map_err(|e| to_py_err(py, e))
    }
}

/// Runs `f` on this thread with the GIL released; see the section comment.
pub(crate) fn run_here<T: Send>(
    py: Python<'_>,
    f: impl FnOnce(&CancelToken) -> ferrocaffe::Result<T> + Send,
) -> PyResult<T> {
    let run = RunToken::new(py);
    let tok = &run.tok;
    let r = py.detach(|| guarded(|| f(tok)));
    run.finish(py, r)
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Idle runner threads, each waiting on its own channel, and the process
/// they belong to (a forked child has the records but not the threads).
static IDLE_RUNNERS: parking_lot::Mutex<(u32, Vec<mpsc::Sender<Job>>)> =
    parking_lot::Mutex::new((0, Vec::new()));

fn submit(job: Job) -> ferrocaffe::Result<()> {
    let idle = {
        let mut g = IDLE_RUNNERS.lock();
        let pid = std::process::id();
        if g.0 != pid {
            *g = (pid, Vec::new());
        }
        g.1.pop()
    };
    let job = match idle {
        Some(tx) => match tx.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (tx, rx) = mpsc::channel::<Job>();
    ferrocaffe::threads::spawn("ferrocaffe-runner", move || {
        // Give the runner a Python thread state once and release the GIL:
        // Python ops on this thread then re-acquire it cheaply, instead of
        // creating and destroying a thread state on every call. Runs are
        // long here (see `run_detached`), so the runner sleeps between jobs.
        Python::attach(|py| {
            py.detach(move || {
                let mut next = Some(job);
                while let Some(job) = next.take() {
                    job();
                    IDLE_RUNNERS.lock().1.push(tx.clone());
                    next = rx.recv().ok();
                }
            })
        })
    })
    .map(|_| ())
    .map_err(|e| ferrocaffe::threads::cannot_start("a plan run", &e))
}

/// How long an interrupted detached run may take to stop before its caller
/// stops waiting for it.
const GRACE: Duration = Duration::from_millis(250);

/// Runs `f` on a runner thread, the caller polling for Ctrl-C (and for the
/// cancellation of the run that called it) every 10 ms. When interrupted,
/// the run is cancelled and its Python ops are sent KeyboardInterrupt; if it
/// has not finished after [`GRACE`], it is abandoned: the call raises
/// KeyboardInterrupt and the run finishes in the background when its last
/// op returns (a net it holds says so until then, see `net::NetCell`).
pub(crate) fn run_detached<T: Send + 'static>(
    py: Python<'_>,
    f: impl FnOnce(&CancelToken) -> ferrocaffe::Result<T> + Send + 'static,
) -> PyResult<T> {
    let tok = caller_token().map_or_else(CancelToken::new, |p| p.child());
    let (tx, rx) = mpsc::channel::<ferrocaffe::Result<T>>();
    let tok2 = tok.clone();
    submit(Box::new(move || {
        let _ = tx.send(guarded(|| f(&tok2)));
    }))
    .map_err(|e| to_py_err(py, e))?;
    let tok3 = tok.clone();
    let (result, interrupt) = py.detach(move || {
        let mut interrupt: Option<PyErr> = None;
        let mut give_up_at: Option<Instant> = None;
        loop {
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok(r) => return (Some(r), interrupt),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return (
                        Some(Err(Error::internal("the runner thread died"))),
                        interrupt,
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            match give_up_at {
                None => {
                    interrupt = Python::attach(|py| py.check_signals().err());
                    if interrupt.is_some() || tok3.is_cancelled() {
                        tok3.cancel();
                        Python::attach(|py| interrupt_python_ops(py, &tok3));
                        give_up_at = Some(Instant::now() + GRACE);
                    }
                }
                Some(t) if Instant::now() >= t => return (None, interrupt),
                Some(_) => {}
            }
        }
    });
    match (result, interrupt) {
        (_, Some(e)) if !e.is_instance_of::<PyKeyboardInterrupt>(py) => Err(e),
        (Some(_), Some(e)) => Err(e),
        (Some(r), None) => r.map_err(|e| to_py_err(py, e)),
        (None, _) => {
            tok.abandon();
            Err(PyKeyboardInterrupt::new_err(format!(
                "the run was interrupted, but a Python op in it has not returned within {} ms: it was sent KeyboardInterrupt, the run is cancelled and finishes when that op returns; until then the net running it stays busy (running that net again raises an error saying so)",
                GRACE.as_millis()
            )))
        }
    }
}

/// Raises KeyboardInterrupt in the Python ops of the run of `tok` that are
/// running now (on other threads: blocked ones see it when they next run
/// Python code, a busy loop at once).
fn interrupt_python_ops(_py: Python<'_>, tok: &CancelToken) {
    for t in ferrocaffe::cancel::interrupt_external_calls_under(tok) {
        // SAFETY: the GIL is held; `t` is the ident of a thread inside a
        // Python op, which stays registered (and so inside the op) while
        // the GIL is held here (it unregisters holding the GIL).
        unsafe {
            pyo3::ffi::PyThreadState_SetAsyncExc(
                t as std::os::raw::c_long,
                pyo3::ffi::PyExc_KeyboardInterrupt,
            );
        }
    }
}

/// A plan running on a background thread (RunPlanInBackground).
#[pyclass(name = "BackgroundPlan", module = "ferrocaffe._core", frozen)]
pub struct PyBackgroundPlan {
    tok: CancelToken,
    state: Arc<parking_lot::Mutex<Option<ferrocaffe::Result<bool>>>>,
    handle: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[pymethods]
impl PyBackgroundPlan {
    fn is_done(&self) -> bool {
        self.state.lock().is_some()
    }
    /// True when finished and successful; False while running or after failure.
    fn is_succeeded(&self) -> bool {
        matches!(*self.state.lock(), Some(Ok(true)))
    }
    fn cancel(&self) {
        self.tok.cancel();
    }
    /// Waits for the plan; raises its error, returns its result.
    fn wait(&self, py: Python<'_>) -> PyResult<bool> {
        let h = self.handle.lock().take();
        if let Some(h) = h {
            py.detach(|| {
                let _ = h.join();
            });
        }
        match self.state.lock().clone() {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(to_py_err(py, e)),
            None => Ok(false),
        }
    }
}

#[pyfunction]
pub(crate) fn run_plan_in_background(
    py: Python<'_>,
    ws: PyRef<'_, PyWorkspace>,
    plan: &[u8],
) -> PyResult<PyBackgroundPlan> {
    let def: ir::PlanDef = decode(py, plan, "PlanDef")?;
    let ws = ws.ws.clone();
    let tok = CancelToken::new();
    let state = Arc::new(parking_lot::Mutex::new(None));
    let (t2, s2) = (tok.clone(), state.clone());
    let handle = ferrocaffe::threads::spawn("ferrocaffe-background-plan", move || {
        let r = guarded(|| ws.run_plan(&def, &t2));
        *s2.lock() = Some(r);
    })
    .map_err(|e| {
        to_py_err(
            py,
            ferrocaffe::threads::cannot_start("a background plan", &e),
        )
    })?;
    Ok(PyBackgroundPlan {
        tok,
        state,
        handle: parking_lot::Mutex::new(Some(handle)),
    })
}
