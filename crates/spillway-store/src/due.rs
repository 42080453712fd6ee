//! Answers this process is waiting for from the network: an upstream's
//! response in the proxy, a Redis script call's reply. A single-threaded
//! event loop reads [`answers_due`] before it goes to sleep and, when one
//! is due, spins a moment first (see `spillway_server::before_park`): the
//! answer usually arrives within microseconds, and a loop that finds it
//! awake spares the interrupt and context switch of being woken.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Exchanges under way whose answer has not arrived.
static DUE: AtomicUsize = AtomicUsize::new(0);

/// Counts one awaited answer while it lives: make one when the request is
/// sent, drop it when the answer is in (or the exchange is given up).
#[derive(Debug)]
#[must_use = "the answer counts as due only while the guard lives"]
pub struct Awaiting(());

impl Awaiting {
    /// Starts counting.
    pub fn new() -> Awaiting {
        DUE.fetch_add(1, Ordering::Relaxed);
        Awaiting(())
    }
}

impl Default for Awaiting {
    fn default() -> Awaiting {
        Awaiting::new()
    }
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        DUE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether some answer is due.
pub fn answers_due() -> bool {
    DUE.load(Ordering::Relaxed) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_due_while_a_guard_lives() {
        // No other unit test of this crate makes a guard.
        assert!(!answers_due());
        let a = Awaiting::new();
        let b = Awaiting::new();
        assert!(answers_due());
        drop(a);
        assert!(answers_due());
        drop(b);
        assert!(!answers_due());
    }
}
