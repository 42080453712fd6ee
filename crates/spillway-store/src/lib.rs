//! # spillway-store
//!
//! Where rate limit state lives, and the [`Limiter`] that matches a request
//! to rules and asks a store to decide.
//!
//! - [`MemoryStore`]: embedded, sharded, bounded; the default.
//! - [`Store`]: the one async interface every store implements.
//!
//! ## No way past a limit
//!
//! - **A cost no limit can admit** (above a matched rule's capacity, burst
//!   or window limit) is denied by the [`Limiter`] before any store is
//!   asked, so every store answers it alike: never a store error that a
//!   fail-open policy would admit. Shadow rules report it and deny nothing.
//! - **A full memory store never forgets a client it is limiting.** At
//!   [`MemoryConfig::max_keys`] a new key replaces a key at rest (as good as
//!   fresh), else the least recently used key that is not limiting its
//!   client. If every candidate is limiting, the new key is not stored: it
//!   is decided against a shared overflow state per rule and limit, so a
//!   flood of fresh keys is limited together as one client, and
//!   [`MemoryStore::overflowed`] counts each such request.
//!
//! ```
//! use std::sync::Arc;
//! use spillway_core::{KeySpec, Limit, Gcra, Rate, ManualClock, Mode, Nanos, Rule};
//! use spillway_store::{Limiter, MemoryStore, Request, RuleSet, SimpleAttributes};
//!
//! let rule = Rule::new("api", None, KeySpec::parse("user")?,
//!     vec![Limit::Gcra(Gcra::new(Rate::new(10, Nanos::from_secs(1))?, 1)?)], Mode::Hard)?;
//! let clock = ManualClock::new(Nanos::from_secs(100));
//! let limiter = Limiter::new(MemoryStore::new(clock, Default::default()), RuleSet::new(vec![rule]));
//! let attrs = SimpleAttributes { user: Some("alice"), ..Default::default() };
//! let req = Request { method: None, path: None, attrs: &attrs, cost: 1 };
//! let first = futures_lite_block_on(limiter.check(&req));
//! assert!(first.decision.allowed);
//! let second = futures_lite_block_on(limiter.check(&req));
//! assert!(!second.decision.allowed);
//! # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     spillway_store::block_on(f)
//! # }
//! # Ok::<(), spillway_core::Error>(())
//! ```

#![warn(missing_docs, unreachable_pub)]

mod apply;
mod clock;
pub mod due;
mod keyrules;
mod limiter;
mod memory;
mod spin;
mod table;

use std::fmt;
use std::future::Future;

pub use clock::SystemClock;
pub use keyrules::{AsIs, KeyRules, SharedWatch, Watch};
pub use limiter::{Checked, Limiter, Request, RuleSet, SimpleAttributes};
pub use memory::{MemoryConfig, MemoryStore, MemoryUsage};
use spillway_core::{Clock, Decision, Rule, Verdict};

/// The most parts a key may have (`user+ip+header:x+tenant`).
pub const MAX_KEY_PARTS: usize = 4;

/// A client's identity under one rule: the values of the rule's key parts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Key<'a> {
    parts: [&'a str; MAX_KEY_PARTS],
    len: usize,
}

impl<'a> Key<'a> {
    /// A key from up to [`MAX_KEY_PARTS`] values (extra ones are ignored).
    pub fn from_parts<I: IntoIterator<Item = &'a str>>(parts: I) -> Key<'a> {
        let mut k = Key::default();
        for p in parts.into_iter().take(MAX_KEY_PARTS) {
            k.parts[k.len] = p;
            k.len += 1;
        }
        k
    }

    /// A key from the values of a rule's parts, or `None` if one is missing
    /// (the request lacks a part of the rule's key). Each value is looked up once.
    pub fn try_from_parts<I: IntoIterator<Item = Option<&'a str>>>(parts: I) -> Option<Key<'a>> {
        let mut k = Key::default();
        for p in parts {
            let p = p?;
            if k.len < MAX_KEY_PARTS {
                k.parts[k.len] = p;
                k.len += 1;
            }
        }
        Some(k)
    }

    /// The values.
    pub fn parts(&self) -> &[&'a str] {
        &self.parts[..self.len]
    }

    /// A keyed 64-bit hash of the rule's fingerprint and the values, each
    /// length-prefixed so `("ab","c")` and `("a","bc")` differ. Never 0.
    pub fn hash(&self, fingerprint: u64, seed: u64) -> u64 {
        let mut buf = [0u8; 256];
        let mut n = 0;
        let mut fits = true;
        let mut push = |b: &[u8], n: &mut usize| {
            if *n + b.len() <= buf.len() {
                buf[*n..*n + b.len()].copy_from_slice(b);
                *n += b.len();
            } else {
                fits = false;
            }
        };
        push(&fingerprint.to_le_bytes(), &mut n);
        for p in self.parts() {
            push(&(p.len() as u32).to_le_bytes(), &mut n);
            push(p.as_bytes(), &mut n);
        }
        let h = if fits {
            xxhash_rust::xxh3::xxh3_64_with_seed(&buf[..n], seed)
        } else {
            let mut s = xxhash_rust::xxh3::Xxh3::with_seed(seed);
            s.update(&fingerprint.to_le_bytes());
            for p in self.parts() {
                s.update(&(p.len() as u32).to_le_bytes());
                s.update(p.as_bytes());
            }
            s.digest()
        };
        if h == 0 { 1 } else { h }
    }
}

/// One rule to charge, with the client's key under it.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The client's key values under `rule`.
    pub key: &'a Key<'a>,
}

/// Why a store could not decide. Its parts are read through methods so
/// that it can say more later without breaking users.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreError {
    transient: bool,
    message: String,
    maybe_applied: bool,
}

impl StoreError {
    /// An error whose request the store did not apply.
    pub fn new(transient: bool, message: impl Into<String>) -> StoreError {
        StoreError {
            transient,
            message: message.into(),
            maybe_applied: false,
        }
    }

    /// The same error, for a request the store may still apply: it was
    /// sent and no answer came in time (a stopped server runs what was
    /// queued when it resumes).
    #[must_use]
    pub fn maybe_applied_if(mut self, maybe: bool) -> StoreError {
        self.maybe_applied = maybe;
        self
    }

    /// Whether retrying later may succeed (timeouts, lost connections) or
    /// not (a script error, a misconfiguration): the failure policy reads
    /// it.
    pub fn transient(&self) -> bool {
        self.transient
    }

    /// What happened, for logs and answers.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the store may still apply the request (see
    /// [`StoreError::maybe_applied_if`]). A share that admits such a
    /// request does not charge it to the store again (see
    /// [`Store::decide_share`]).
    pub fn maybe_applied(&self) -> bool {
        self.maybe_applied
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.transient {
            "transient"
        } else {
            "permanent"
        };
        write!(f, "store error ({kind}): {}", self.message)
    }
}

impl std::error::Error for StoreError {}

/// Where state lives. One decision is one atomic step: every limit of every
/// charge is checked and, if all admit, charged, or none is.
pub trait Store: Send + Sync + 'static {
    /// Decides a request of `cost` against `charges`.
    fn decide(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Charges `cost` after the fact (a cost known only once the request
    /// was served) to every limit of every charge, atomically and even past
    /// the limits: see [`spillway_core::charge`]. The decision says whether
    /// the keys are now over (a check of cost 0 after the charge).
    fn charge(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// While the store cannot decide (it just failed): decides `charges`
    /// (or, if `after`, charges them after the fact) against this
    /// instance's share of each limit, for rules whose policy is
    /// [`FailPolicy::Share`](spillway_core::FailPolicy::Share). `None`
    /// if the store keeps no share (then such rules admit, as `Allow`).
    ///
    /// `error` is why the store failed: a request it may still apply
    /// ([`StoreError::maybe_applied`]) is decided but not charged to the
    /// store again when it returns.
    fn decide_share(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        error: &StoreError,
    ) -> Option<Decision> {
        let _ = (charges, cost, after, error);
        None
    }

    /// Keys currently held, if the store can tell cheaply.
    fn keys(&self) -> Option<usize> {
        None
    }

    /// Housekeeping the owner should call about once a second.
    fn maintain(&self) {}

    /// Where each charge's key stands, without charging it: per charge,
    /// one verdict per limit of its rule's
    /// [`enforced_limits`](Rule::enforced_limits), in order, for a
    /// request of `cost` made now (`allowed` says whether such a request
    /// would pass that limit, `retry_after` when it would). For a soft
    /// rule the verdict is under the enforced (raised) size, the one that
    /// refuses requests. Nothing is written: no state, no expiry, no
    /// count. For an operator looking a client up; not atomic across
    /// charges.
    ///
    /// # Errors
    /// The store cannot be reached (as [`decide`](Self::decide)), or it
    /// cannot look keys up (the default).
    fn peek(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl Future<Output = Result<Vec<Vec<Verdict>>, StoreError>> + Send {
        let _ = (charges, cost);
        std::future::ready(Err(StoreError::new(
            false,
            "this store cannot look a key up without charging it",
        )))
    }

    /// Forgets every limit's state of each charge's key, so the client
    /// starts afresh, as if never seen. For an operator.
    ///
    /// # Errors
    /// The store cannot be reached, or it cannot reset keys (the default).
    fn reset(&self, charges: &[Charge<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = charges;
        std::future::ready(Err(StoreError::new(false, "this store cannot reset a key")))
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn decide(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(Ok(self.decide_now(charges, cost)))
    }

    fn charge(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(Ok(self.charge_now(charges, cost)))
    }

    fn keys(&self) -> Option<usize> {
        Some(self.usage().keys)
    }

    fn maintain(&self) {
        let _ = self.sweep(4096);
    }

    fn peek(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
    ) -> impl Future<Output = Result<Vec<Vec<Verdict>>, StoreError>> + Send {
        std::future::ready(Ok(self.peek_now(charges, cost)))
    }

    fn reset(&self, charges: &[Charge<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.reset_now(charges);
        std::future::ready(Ok(()))
    }
}

/// Runs a future to completion on the current thread. For the in-memory
/// store, whose futures are always ready, this is how sync code calls it.
pub fn block_on<F: Future>(f: F) -> F::Output {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}
