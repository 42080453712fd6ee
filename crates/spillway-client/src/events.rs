//! Metrics hooks: every layer reports what it did to an [`Events`]
//! implementation (retries, waits, local refusals), to count in whatever
//! metrics system the caller uses. [`Counters`] counts them in atomics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What the client's layers report. Every method has a default that does
/// nothing; implement the ones you count. Called on the request's task:
/// keep them quick.
pub trait Events: Send + Sync + 'static {
    /// A request is sent again after a 429 or 503 (`attempt` from 1).
    fn retried(&self, attempt: u32) {
        let _ = attempt;
    }
    /// A request is held this long before it is sent (a spent quota, an
    /// advised retry time, an outbound limit or a shaper).
    fn waited(&self, wait: Duration) {
        let _ = wait;
    }
    /// A request was refused on this side, never sent: `why` is
    /// `"quota spent"`, `"outbound limit"`, `"outbound limiter
    /// unavailable"` or `"adaptive throttling"`.
    fn rejected_locally(&self, why: &'static str) {
        let _ = why;
    }
}

/// Reports nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoEvents;

impl Events for NoEvents {}

/// Counts every event in atomics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests sent again.
    pub retries: AtomicU64,
    /// Requests held before sending.
    pub waits: AtomicU64,
    /// Their total time held, ns.
    pub waited_ns: AtomicU64,
    /// Requests refused locally.
    pub rejected: AtomicU64,
}

impl Events for Counters {
    fn retried(&self, _attempt: u32) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }
    fn waited(&self, wait: Duration) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.waited_ns.fetch_add(ns, Ordering::Relaxed);
    }
    fn rejected_locally(&self, _why: &'static str) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }
}
