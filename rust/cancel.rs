//! Cancellation tokens.
//!
//! A token is cancelled by Ctrl-C (the bindings), by a failing sibling in a
//! concurrent step, or by a user. Child tokens see their parent's state, so
//! cancelling a plan reaches every step, instance, reporter and blocking op
//! below it. Blocking ops wait in short slices and check their token, so a
//! cancellation is noticed within milliseconds.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Inner {
    flag: AtomicBool,
    parent: Option<CancelToken>,
}

#[derive(Clone)]
pub struct CancelToken(Arc<Inner>);

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

/// How often blocking waits wake up to look at their token.
pub const POLL: Duration = Duration::from_millis(5);

impl CancelToken {
    pub fn new() -> Self {
        CancelToken(Arc::new(Inner {
            flag: AtomicBool::new(false),
            parent: None,
        }))
    }
    /// A token cancelled when this one is, or on its own.
    pub fn child(&self) -> Self {
        CancelToken(Arc::new(Inner {
            flag: AtomicBool::new(false),
            parent: Some(self.clone()),
        }))
    }
    pub fn cancel(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        let mut t = self;
        loop {
            if t.0.flag.load(Ordering::Relaxed) {
                return true;
            }
            match &t.0.parent {
                Some(p) => t = p,
                None => return false,
            }
        }
    }
    /// `Err(Cancelled)` once cancelled.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(Error::cancelled())
        } else {
            Ok(())
        }
    }
    /// Sleeps for `d`, returning early with `Err(Cancelled)` if cancelled.
    pub fn sleep(&self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            std::thread::sleep((end - now).min(POLL));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
