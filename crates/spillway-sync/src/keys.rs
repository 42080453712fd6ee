//! The keys an instance is using: what it admitted for each since the last
//! exchange, and in lease mode the units it holds.
//!
//! Sharded by the key's tag so that decisions on different keys do not
//! wait for one lock; bounded, with what does not fit counted (see
//! [`Keys::untracked`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};
use spillway_core::{Nanos, Rule, Verdict};

/// One key in use.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Its rule (interned: one allocation per rule, not per key).
    pub rule: Arc<Rule>,
    /// The key's hash in the local memory store.
    pub local: u64,
    /// Cost admitted here since the last exchange drained it.
    pub pending: u64,
    /// Cost charged after the fact since the last exchange (lease mode:
    /// what the leases did not already count).
    pub after: u64,
    /// Cost asked for since the last exchange, admitted or not (lease
    /// mode: how much to lease next).
    pub demand: u64,
    /// Exchanges in a row in which the key was not used.
    pub idle: u32,
    /// Lease mode: units held.
    pub units: u64,
    /// Lease mode: when the newest units were taken (store microseconds).
    pub since_us: u64,
    /// Lease mode: when the oldest units that may still be held were
    /// taken (a slice topped up keeps units of earlier grants).
    pub first_us: u64,
    /// Lease mode: when the last grant came (local clock).
    pub granted_at: Nanos,
    /// Lease mode: units of a slice that expired before its refund, still
    /// counted by the store: given back at the next exchange.
    pub stale: u64,
    /// Lease mode: the refund time of `stale`.
    pub stale_since_us: u64,
    /// Lease mode: until when the units may be used (store time): the
    /// end of a fixed window, an interval for sliding windows.
    pub expires: Nanos,
    /// Lease mode: the store refused a lease; refuse locally until then.
    pub refused_until: Nanos,
    /// Lease mode: the store's last verdict (the most limiting limit),
    /// what a local answer reports as limit, reset and retry.
    pub verdict: Option<Verdict>,
    /// The remaining the store last reported (for the next lease's size).
    pub remaining: u64,
    /// Lease mode: a lease call for this key is under way; others wait for it.
    pub asking: Option<Arc<tokio::sync::Notify>>,
    /// Eventual mode: the exchange round from which the key is no longer
    /// new here (0: it is not). Until then this instance admits at most
    /// its share of it (see `gate` in `store.rs`).
    pub gate: u64,
    /// Eventual mode: cost admitted (or charged) here while the key was
    /// new, in the current epoch.
    pub gated: u64,
    /// Eventual mode, while gated: Redis's TIME (µs) at this instance's
    /// first exchange round after the key's first request here in the
    /// epoch (0: none yet). The gate opens only once every live instance
    /// has pushed all it admitted before then (the heartbeats' horizon
    /// has passed it).
    pub gate_after_us: u64,
    /// Eventual mode: when the current epoch ends: the end of the rule's
    /// shortest fixed window (whose start makes the key new again), never
    /// for a rule without one; zero before the key's first decision.
    pub epoch: Nanos,
}

impl Entry {
    pub(crate) fn new(rule: Arc<Rule>, local: u64) -> Entry {
        Entry {
            rule,
            local,
            pending: 0,
            after: 0,
            demand: 0,
            idle: 0,
            units: 0,
            since_us: 0,
            first_us: 0,
            granted_at: Nanos::ZERO,
            stale: 0,
            stale_since_us: 0,
            expires: Nanos::ZERO,
            refused_until: Nanos::ZERO,
            verdict: None,
            remaining: u64::MAX,
            asking: None,
            gate: 0,
            gated: 0,
            gate_after_us: 0,
            epoch: Nanos::ZERO,
        }
    }
}

const SHARDS: usize = 64;

/// The keys in use, by tag.
#[derive(Debug)]
pub(crate) struct Keys {
    shards: Box<[Mutex<HashMap<u64, Entry>>]>,
    len: AtomicUsize,
    cap: usize,
    untracked: AtomicU64,
    rules: RwLock<HashMap<u64, Arc<Rule>>>,
}

impl Keys {
    pub(crate) fn new(cap: usize) -> Keys {
        Keys {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            len: AtomicUsize::new(0),
            cap: cap.max(SHARDS),
            untracked: AtomicU64::new(0),
            rules: RwLock::new(HashMap::new()),
        }
    }

    fn shard(&self, tag: u64) -> &Mutex<HashMap<u64, Entry>> {
        &self.shards[(tag >> 58) as usize % SHARDS]
    }

    /// The shared copy of `rule`.
    pub(crate) fn intern(&self, rule: &Rule) -> Arc<Rule> {
        if let Some(r) = self.rules.read().get(&rule.fingerprint()) {
            return r.clone();
        }
        self.rules
            .write()
            .entry(rule.fingerprint())
            .or_insert_with(|| Arc::new(rule.clone()))
            .clone()
    }

    /// Runs `f` on the entry of `tag`, made by `make` if absent. `None`
    /// when the key is new and the map is full: counted in
    /// [`untracked`](Self::untracked).
    pub(crate) fn with<T>(
        &self,
        tag: u64,
        make: impl FnOnce() -> Entry,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        let mut shard = self.shard(tag).lock();
        if let Some(e) = shard.get_mut(&tag) {
            return Some(f(e));
        }
        if self.len.load(Ordering::Relaxed) >= self.cap {
            self.untracked.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.len.fetch_add(1, Ordering::Relaxed);
        Some(f(shard.entry(tag).or_insert_with(make)))
    }

    /// Runs `f` on the entry of `tag` if there is one.
    pub(crate) fn get<T>(&self, tag: u64, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        self.shard(tag).lock().get_mut(&tag).map(f)
    }

    /// Visits every entry, shard by shard; `f` says whether to keep it.
    pub(crate) fn retain(&self, mut f: impl FnMut(u64, &mut Entry) -> bool) {
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            let before = s.len();
            s.retain(|&tag, e| f(tag, e));
            let dropped = before - s.len();
            self.len.fetch_sub(dropped, Ordering::Relaxed);
        }
        // Rules no key holds any more (replaced by a reload) go too.
        self.rules.write().retain(|_, r| Arc::strong_count(r) > 1);
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// New keys not tracked because the map was full (their admissions are
    /// still decided locally, but not shared: size `max_keys` above the
    /// keys in use per interval).
    pub(crate) fn untracked(&self) -> u64 {
        self.untracked.load(Ordering::Relaxed)
    }
}
