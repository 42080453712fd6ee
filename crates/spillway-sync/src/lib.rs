//! # spillway-sync
//!
//! Local-first decisions for many instances in one or several regions:
//! decisions are made in memory, and counts are shared through Redis in
//! the background, so a decision never waits for the network
//! ([`SyncMode::Eventual`]), or waits only when a key's leased budget runs
//! out ([`SyncMode::Lease`]). And, for every Redis mode including the
//! per-decision one, `on_store_error: share`: while the store is
//! unreachable each instance enforces its share of every limit (see
//! [`Share`]).
//!
//! ## Eventual mode
//! Each instance decides in its own memory store (every algorithm, on the
//! store's clock: see [`StoreClock`]), records what it admitted per key,
//! and every `interval` exchanges with its region's store (one script call
//! per 2,048 keys): it pushes its deltas (charged after the fact to the
//! same states a per-decision instance would use, numbered so a retried or
//! replayed push counts once: see [`link`]) and reads back every key it is
//! using. Where its own memory is behind the store's (less what it
//! admitted since the push) it charges the difference locally: buckets and
//! GCRA by what they owe (so the store's debt from every instance's pushes
//! is kept), windows by what they have left. Its memory then holds every
//! instance's admissions up to the exchange. A key new to the instance is
//! pulled at once. Between exchanges an instance does not see the others'
//! admissions, which is what it can over-admit:
//!
//! > over-admission of a key ≤ what the *other* instances admit for it
//! > within one lag `L = 2 × interval + round trip` (a delta waits at most
//! > one interval to be pushed, and the push at most one more to be read
//! > by each other instance), and never more than `(N − 1) × limit`.
//!
//! Late arrivals are charged when they arrive, never earlier, so a remote
//! admission near a window's end may count in the next window (the error
//! is toward admitting less).
//!
//! Where every instance starts from nothing at once (a key new here, or
//! the start of its rule's shortest fixed window), that bound is the whole
//! limit per instance; so there an instance admits at most its share
//! (`limit / N`, at least 1) until its second exchange after the key's
//! first request *and* a read holding every live instance's admissions
//! up to its first exchange after that request (the heartbeats' horizon
//! says when: see `lua/heartbeat.lua` in spillway-redis): at most
//! `limit + (N − 1) × (limit mod N)` per fresh key or window where the
//! instances start together, whatever order and delay their exchanges
//! come in (docs/SYNC.md).
//!
//! ## Lease mode
//! An instance leases a slice of a key's remaining budget: the store
//! admits `c` units at once (the largest every limit admits, up to what
//! the instance asks: twice its demand over the last interval, capped at
//! its demand or its share of what is left, `remaining / N`, whichever is
//! more), and the instance admits locally while the slice lasts. Slices
//! are topped up at each exchange before they run low, expire two
//! intervals after they were taken (or at their fixed window's end), and
//! what was not used goes back to the store; a key with no slice asks the
//! store (concurrent requests for it wait for that one call). The store
//! counts every unit when it is leased, so admissions never exceed the
//! limit over the store's windows; units are spent after the store counted
//! them (a renewal extends what a busy key holds, at most twice what it asks
//! for an interval), so a rate's burst or a sliding window's edge can be
//! exceeded by one slice; fixed windows are exact. Unused slices at a
//! window's end are the under-admission. While another region cannot be reached, slices are leased under this
//! region's share of each limit.
//!
//! ## Several regions
//! Each instance pushes its deltas to every region's store (a [`Link`] per
//! store, each with its own numbers), and reads only its own region's. A
//! store that cannot be reached keeps its deltas waiting (merged per key)
//! until it can, then receives them once.

#![warn(missing_docs, unreachable_pub)]

pub mod clock;
mod fallback;
mod keys;
mod lease;
pub mod link;
pub mod share;
mod status;
mod store;

pub use clock::StoreClock;
pub use fallback::Fallback;
pub use link::{Ledger, Link, Push};
pub use share::Share;
pub use status::{LinkStatus, SyncStatus};
pub use store::SyncStore;

use std::time::Duration;

/// How instances share counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Decide in memory; exchange deltas and totals every interval.
    Eventual,
    /// Decide in memory from leased slices of each key's budget.
    Lease,
}

/// Settings of a [`SyncStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncConfig {
    /// Eventual or lease.
    pub mode: SyncMode,
    /// How often each instance exchanges with the stores.
    pub interval: Duration,
    /// This instance's region, for status and logs.
    pub region: Option<String>,
    /// Most keys tracked at once (and held in the local memory store).
    pub max_keys: usize,
    /// Failed exchanges in a row after which the store counts as
    /// unreachable (decisions then follow `on_store_error`).
    pub failures: u32,
}

impl Default for SyncConfig {
    fn default() -> SyncConfig {
        SyncConfig {
            mode: SyncMode::Eventual,
            interval: Duration::from_millis(100),
            region: None,
            max_keys: 1_000_000,
            failures: 3,
        }
    }
}

impl SyncConfig {
    /// How long a request waits for a slice another request is asking
    /// for: an interval, at least 50 ms.
    pub(crate) fn timeout_hint(&self) -> Duration {
        self.interval.max(Duration::from_millis(50))
    }
}

/// How long an instance counts as alive after its last heartbeat: a few
/// heartbeats, so one slow exchange does not halve every share.
pub fn live_ttl(interval: Duration) -> Duration {
    interval.saturating_mul(5).max(Duration::from_secs(2))
}
