//! Cancellation tokens, interrupt polling, and calls out of the runtime.
//!
//! A token is cancelled by Ctrl-C (the bindings), by a failing sibling in a
//! concurrent step, or by a user. Child tokens see their parent's state, so
//! cancelling a plan reaches every step, instance, reporter and blocking op
//! below it. Blocking ops wait in short slices and check their token, so a
//! cancellation is noticed within milliseconds.
//!
//! A run on the thread that receives Ctrl-C has no other thread watching for
//! it: its root token carries an *interrupt check* (the bindings: "has a
//! signal arrived?") that only that thread may run, and only where it holds
//! no lock (the check takes the GIL). Blocking waits run it at every slice
//! ([`CancelToken::poll_now`]); loops look at their token between units of
//! work ([`CancelToken::poll`]) and run it when a [`watch`]dog thread has set
//! a bit in the token, every [`TICK`], so the hot path stays one atomic
//! load. [`CancelToken::is_cancelled`] never runs it.
//!
//! Calls out of the runtime that it cannot interrupt (Python ops) register
//! themselves ([`ExternalCall`]): the bindings interrupt them their own way,
//! and a net held by a call whose run was given up on says so
//! ([`abandoned_call_on`]) instead of making the next run wait forever.

use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CANCELLED: u8 = 1;
/// The owner thread should run the interrupt check at its next look.
const POLL_REQUESTED: u8 = 2;
/// Cancelled, and its caller has stopped waiting for it (see [`CancelToken::abandon`]).
const ABANDONED: u8 = 4;

/// "Has the user interrupted?"; true cancels the token. Runs on its owner
/// thread only.
struct Interrupt {
    owner: u64,
    check: Box<dyn Fn() -> bool + Send + Sync>,
}

struct Inner {
    state: AtomicU8,
    parent: Option<CancelToken>,
    interrupt: Option<Interrupt>,
}

#[derive(Clone)]
pub struct CancelToken(Arc<Inner>);

/// How far a look at a token goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Look {
    Flags,
    Requested,
    Now,
}

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

/// How often blocking waits wake up to look at their token.
pub const POLL: Duration = Duration::from_millis(5);
/// How often a watched token's owner is asked to run its interrupt check.
pub const TICK: Duration = Duration::from_millis(10);

impl CancelToken {
    pub fn new() -> Self {
        Self::make(None, None)
    }

    /// A root token whose `check` (true: interrupted) runs on this thread
    /// only: at every slice of a blocking wait ([`Self::poll`]) and, while
    /// [`watch`]ed, every [`TICK`] at the next look at the token.
    pub fn with_interrupt_check(check: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self::make(
            None,
            Some(Interrupt {
                owner: thread_tag(),
                check: Box::new(check),
            }),
        )
    }

    fn make(parent: Option<CancelToken>, interrupt: Option<Interrupt>) -> Self {
        CancelToken(Arc::new(Inner {
            state: AtomicU8::new(0),
            parent,
            interrupt,
        }))
    }

    /// A token cancelled when this one is, or on its own.
    pub fn child(&self) -> Self {
        Self::make(Some(self.clone()), None)
    }

    pub fn cancel(&self) {
        self.0.state.fetch_or(CANCELLED, Ordering::SeqCst);
    }

    /// Cancels the token and records that its caller no longer waits for
    /// the run (something in it did not return); see [`abandoned_call_on`].
    pub fn abandon(&self) {
        self.0
            .state
            .fetch_or(CANCELLED | ABANDONED, Ordering::SeqCst);
    }

    /// Whether this token or one above it was cancelled. Never runs the
    /// interrupt check, so it may be called anywhere (an op holding blob
    /// locks, code holding the GIL).
    pub fn is_cancelled(&self) -> bool {
        self.look(Look::Flags)
    }

    /// [`Self::is_cancelled`] for a loop between units of work, holding no
    /// lock: on the owner thread of an interrupt check up the chain, also
    /// runs the check when the watchdog asked for it (every [`TICK`]).
    pub fn poll(&self) -> bool {
        self.look(Look::Requested)
    }

    /// [`Self::poll`] for a waiter that is blocked anyway and holds no lock:
    /// runs the interrupt check now.
    pub fn poll_now(&self) -> bool {
        self.look(Look::Now)
    }

    fn look(&self, how: Look) -> bool {
        let mut t = self;
        loop {
            let s = t.0.state.load(Ordering::Relaxed);
            let interrupt = how != Look::Flags && t.0.interrupt.is_some();
            if (s & CANCELLED != 0) || (interrupt && t.run_check(s, how)) {
                return true;
            }
            match &t.0.parent {
                Some(p) => t = p,
                None => return false,
            }
        }
    }

    /// Runs this token's interrupt check if asked (`how`, or the POLL bit)
    /// and on its owner thread; true when it reported an interrupt.
    fn run_check(&self, s: u8, how: Look) -> bool {
        if how == Look::Requested && s & POLL_REQUESTED == 0 {
            return false;
        }
        let Some(i) = &self.0.interrupt else {
            return false;
        };
        if i.owner != thread_tag() {
            return false;
        }
        self.0.state.fetch_and(!POLL_REQUESTED, Ordering::Relaxed);
        if (i.check)() {
            self.cancel();
            return true;
        }
        false
    }

    /// Whether this token or one above it was abandoned.
    pub fn is_abandoned(&self) -> bool {
        self.ancestors()
            .any(|t| t.0.state.load(Ordering::Relaxed) & ABANDONED != 0)
    }

    /// Whether `other` is this token or one of its ancestors.
    pub fn descends_from(&self, other: &CancelToken) -> bool {
        self.ancestors().any(|t| Arc::ptr_eq(&t.0, &other.0))
    }

    fn ancestors(&self) -> impl Iterator<Item = &CancelToken> {
        std::iter::successors(Some(self), |t| t.0.parent.as_ref())
    }

    fn request_poll(&self) {
        self.0.state.fetch_or(POLL_REQUESTED, Ordering::Relaxed);
    }

    /// `Err(Cancelled)` once cancelled (see [`Self::is_cancelled`]).
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::cancelled())
        } else {
            Ok(())
        }
    }

    /// `Err(Cancelled)` once cancelled or interrupted (see [`Self::poll`]).
    pub fn poll_check(&self) -> Result<()> {
        if self.poll() {
            Err(Error::cancelled())
        } else {
            Ok(())
        }
    }

    /// Sleeps for `d`, returning early with `Err(Cancelled)` if cancelled.
    pub fn sleep(&self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        loop {
            if self.poll_now() {
                return Err(Error::cancelled());
            }
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(POLL));
        }
    }
}

/// A small number naming the current thread (never 0), cheaper to get than
/// `std::thread::current().id()`.
pub fn thread_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TAG: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TAG.with(|t| *t)
}

// ------------------------------------------------------------- watchdog --

/// Tokens whose owners are asked every [`TICK`] to run their interrupt
/// check. The thread ticks while a token is watched and for a second after
/// the last one was, then parks until the next `watch`: a loop of short runs
/// wakes it once, an idle process not at all.
struct Watchdog {
    pid: u32,
    state: Mutex<WatchState>,
    wake: Condvar,
}

#[derive(Default)]
struct WatchState {
    tokens: Vec<CancelToken>,
    parked: bool,
    /// Bumped by every `watch`, so that short runs between two ticks count
    /// as activity.
    watches: u64,
}

const IDLE_TICKS_BEFORE_PARKING: u32 = 100;

impl Watchdog {
    fn run(&self) {
        let mut st = self.state.lock();
        let mut idle = 0;
        let mut seen = st.watches;
        loop {
            if st.tokens.is_empty() && st.watches == seen {
                idle += 1;
            } else {
                idle = 0;
                seen = st.watches;
            }
            if idle >= IDLE_TICKS_BEFORE_PARKING {
                st.parked = true;
                while st.tokens.is_empty() && st.watches == seen {
                    self.wake.wait(&mut st);
                }
                st.parked = false;
                idle = 0;
                seen = st.watches;
            }
            self.wake.wait_for(&mut st, TICK);
            for t in &st.tokens {
                t.request_poll();
            }
        }
    }
}

/// Removes its token from the watch list when dropped.
pub struct Watched {
    dog: Arc<Watchdog>,
    tok: CancelToken,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut st = self.dog.state.lock();
        if let Some(k) = st
            .tokens
            .iter()
            .position(|t| Arc::ptr_eq(&t.0, &self.tok.0))
        {
            st.tokens.swap_remove(k);
        }
    }
}

/// Has `tok`'s owner asked to run its interrupt check every [`TICK`] until
/// the guard is dropped. Fails only when the watchdog thread cannot be
/// started (it is retried on the next call).
pub fn watch(tok: &CancelToken) -> std::io::Result<Watched> {
    static DOG: Mutex<Option<Arc<Watchdog>>> = Mutex::new(None);
    let dog = {
        let mut slot = DOG.lock();
        let pid = std::process::id();
        match &*slot {
            // A forked child has the parent's record but not its thread.
            Some(d) if d.pid == pid => d.clone(),
            _ => {
                let d = Arc::new(Watchdog {
                    pid,
                    state: Mutex::new(WatchState::default()),
                    wake: Condvar::new(),
                });
                let d2 = d.clone();
                crate::threads::spawn("ferrocaffe-watchdog", move || d2.run())?;
                *slot = Some(d.clone());
                d
            }
        }
    };
    {
        let mut st = dog.state.lock();
        st.tokens.push(tok.clone());
        st.watches += 1;
        if st.parked {
            dog.wake.notify_one();
        }
    }
    Ok(Watched {
        dog,
        tok: tok.clone(),
    })
}

// ------------------------------------------------------- external calls --

struct CallEntry {
    id: u64,
    thread: u64,
    os_thread: u64,
    tok: CancelToken,
    interrupted: bool,
}

static CALLS: Mutex<Vec<CallEntry>> = Mutex::new(Vec::new());

/// A call out of the runtime in progress on this thread (a Python op), for
/// the run of `tok`; unregistered when dropped.
pub struct ExternalCall(u64);

impl ExternalCall {
    pub fn enter(tok: &CancelToken) -> ExternalCall {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        CALLS.lock().push(CallEntry {
            id,
            thread: thread_tag(),
            os_thread: os_thread_id(),
            tok: tok.clone(),
            interrupted: false,
        });
        ExternalCall(id)
    }

    /// Unregisters the call; true when it was marked interrupted by
    /// [`interrupt_external_calls_under`] meanwhile.
    pub fn leave(self) -> bool {
        let mut calls = CALLS.lock();
        let interrupted = match calls.iter().position(|c| c.id == self.0) {
            Some(k) => calls.swap_remove(k).interrupted,
            None => false,
        };
        drop(calls);
        std::mem::forget(self);
        interrupted
    }
}

impl Drop for ExternalCall {
    fn drop(&mut self) {
        let mut calls = CALLS.lock();
        if let Some(k) = calls.iter().position(|c| c.id == self.0) {
            calls.swap_remove(k);
        }
    }
}

/// Marks the external calls in progress for runs under `tok` as interrupted
/// and returns their OS thread ids (`pthread_self`, which is also Python's
/// thread ident), for the caller to interrupt them.
pub fn interrupt_external_calls_under(tok: &CancelToken) -> Vec<u64> {
    CALLS
        .lock()
        .iter_mut()
        .filter(|c| c.tok.descends_from(tok))
        .map(|c| {
            c.interrupted = true;
            c.os_thread
        })
        .collect()
}

/// Whether the thread tagged `thread` is in an external call of a run that
/// was abandoned: whatever it holds stays held until that call returns.
pub fn abandoned_call_on(thread: u64) -> bool {
    CALLS
        .lock()
        .iter()
        .any(|c| c.thread == thread && c.tok.is_abandoned())
}

#[cfg(unix)]
fn os_thread_id() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

#[cfg(not(unix))]
fn os_thread_id() -> u64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn children_see_parents() {
        let p = CancelToken::new();
        let c = p.child();
        let g = c.child();
        assert!(!g.is_cancelled());
        c.cancel();
        assert!(g.is_cancelled() && !p.is_cancelled());
        p.cancel();
        assert!(p.check().is_err());
        assert!(g.descends_from(&p) && g.descends_from(&g) && !p.descends_from(&g));
    }

    #[test]
    fn abandoning_cancels_and_is_seen_below() {
        let p = CancelToken::new();
        let c = p.child();
        assert!(!c.is_abandoned());
        p.abandon();
        assert!(c.is_cancelled() && c.is_abandoned());
    }

    #[test]
    fn the_interrupt_check_runs_on_its_owner_thread_only() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        let tok = CancelToken::with_interrupt_check(move || c2.fetch_add(1, Ordering::SeqCst) >= 2);
        let child = tok.child();
        // Another thread polling the child never runs the owner's check.
        std::thread::scope(|s| {
            s.spawn(|| assert!(!child.poll_now()));
        });
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // poll() runs it only once a poll is requested, is_cancelled never.
        assert!(!child.poll());
        tok.request_poll();
        assert!(!child.is_cancelled());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(!child.poll());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The request was consumed.
        assert!(!child.poll());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // poll_now() runs it every time; the third call reports an interrupt.
        assert!(!child.poll_now());
        assert!(child.poll_now());
        assert!(tok.is_cancelled());
    }

    #[test]
    fn the_watchdog_asks_a_busy_owner_to_poll() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        let tok = CancelToken::with_interrupt_check(move || c2.fetch_add(1, Ordering::SeqCst) >= 3);
        let _w = watch(&tok).unwrap();
        // A busy loop that polls its token is interrupted.
        while !tok.poll() {
            std::hint::spin_loop();
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn external_calls_are_found_by_run() {
        let run = CancelToken::new();
        let other = CancelToken::new();
        let step = run.child();
        let call = ExternalCall::enter(&step);
        let other_call = ExternalCall::enter(&other);
        assert!(!abandoned_call_on(thread_tag()));
        assert_eq!(interrupt_external_calls_under(&run), vec![os_thread_id()]);
        run.abandon();
        assert!(abandoned_call_on(thread_tag()));
        assert!(call.leave(), "it was interrupted");
        assert!(!other_call.leave(), "only the run's calls are");
        assert!(interrupt_external_calls_under(&run).is_empty());
        assert!(!abandoned_call_on(thread_tag()));
    }
}
