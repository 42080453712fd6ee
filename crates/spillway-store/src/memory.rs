//! The embedded in-memory store: sharded, bounded, expiring.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use spillway_core::{
    Clock, Decision, Limit, Log, Nanos, Rule, StateKind, StateView, Verdict, Wide, charge, decide,
};

use crate::Charge;
use crate::apply::{Overflow, Shared, Spill, Step, Write, apply_compact, apply_log};
use crate::spin::{SpinGuard, SpinLock};
use crate::table::Table;

/// Settings of a [`MemoryStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Most keys held at once, across all shards (per kind of state).
    ///
    /// When reached, a new key takes the place of a key near its slot
    /// (among 16 sampled): first one at rest (as good as fresh: its loss
    /// changes no decision), else the least recently used one (a CLOCK
    /// approximation) that is not limiting its client, that is, whose last
    /// decision neither denied nor left less than its cost. A client being
    /// denied is never evicted, so a flood of new keys cannot hand it a
    /// fresh allowance.
    ///
    /// If every sampled key is limiting, the new key is not stored: it is
    /// decided against its rule and limit's shared *overflow* state, which
    /// is never evicted, and the decision counts in
    /// [`MemoryStore::overflowed`]. Every key that finds no room shares it,
    /// so a flood of fresh keys is limited as if it were one client, while
    /// clients already held keep their own limits intact. (Denying such
    /// keys outright would refuse legitimate newcomers for as long as the
    /// table is full; admitting them against a fresh state is the bypass.)
    /// Size `max_keys` above the clients expected at once: overflow is a
    /// defence, not a mode of operation.
    pub max_keys: usize,
    /// Number of shards, rounded up to a power of two (and halved while it
    /// exceeds `max_keys`: the cap is split between the shards exactly).
    /// More shards, less contention between threads; each shard has its
    /// own lock.
    pub shards: usize,
}

impl Default for MemoryConfig {
    fn default() -> MemoryConfig {
        MemoryConfig {
            max_keys: 10_000_000,
            shards: 256,
        }
    }
}

#[derive(Default)]
struct Shard {
    narrow: Table<u64>,
    wide: Table<Wide>,
    logs: Table<Log>,
    /// Where the incremental sweep of each table continues. 32-bit, as
    /// is `cap`, so the shard with its lock stays within two cache lines
    /// (a shard's table beyond 2^32 slots would be 64 GB).
    cursor: [u32; 3],
    /// Most keys per table here: the shards' caps add up to `max_keys`.
    cap: u32,
}

/// Pads a shard to its own cache lines so two threads on different shards
/// do not fight over one line.
#[repr(align(128))]
struct Padded(SpinLock<Shard>);

/// The in-memory store.
///
/// Keys are hashed (keyed xxh3, random seed per store) to a 64-bit tag; the
/// high bits choose a shard, so one rule's limits for one client always live
/// in one shard and are charged under one lock. A decision over several
/// rules locks their shards in ascending order, so it never deadlocks.
///
/// # Examples
/// ```
/// use spillway_core::{FixedWindow, KeySpec, Limit, ManualClock, Mode, Nanos, Rule};
/// use spillway_store::{Charge, Key, MemoryStore};
/// let clock = ManualClock::new(Nanos::from_secs(1_000));
/// let store = MemoryStore::new(clock.clone(), Default::default());
/// let rule = Rule::new("r", None, KeySpec::parse("user")?,
///     vec![Limit::FixedWindow(FixedWindow::new(2, Nanos::from_secs(60))?)], Mode::Hard)?;
/// let key = Key::from_parts(["alice"]);
/// let charges = [Charge { rule: &rule, key: &key }];
/// assert!(store.decide_now(&charges, 1).allowed);
/// assert!(store.decide_now(&charges, 1).allowed);
/// assert!(!store.decide_now(&charges, 1).allowed);
/// # Ok::<(), spillway_core::Error>(())
/// ```
pub struct MemoryStore<C> {
    shards: Box<[Padded]>,
    shard_shift: u32,
    seed: u64,
    clock: C,
    overflow: SpinLock<Overflow>,
    /// Decisions made against an overflow state (see [`Self::overflowed`]).
    overflowed: AtomicU64,
}

impl<C> fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

/// Memory held by a store, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Keys held (one per limit of each client of each rule).
    pub keys: usize,
    /// Bytes of tables and logs.
    pub bytes: usize,
    /// Requests decided against a shared overflow state because their key
    /// found no room (see [`MemoryConfig::max_keys`]), since the store began.
    pub overflowed: u64,
}

impl<C: Clock> MemoryStore<C> {
    /// A store reading time from `clock`.
    pub fn new(clock: C, config: MemoryConfig) -> MemoryStore<C> {
        let max_keys = config.max_keys.max(1);
        // No more shards than keys, so that each holds at least one and
        // their caps add up to `max_keys` exactly (a cap rounded up per
        // shard would let 256 shards hold 256 keys under `max_keys: 1`).
        let mut n = config.shards.clamp(1, 1 << 16).next_power_of_two();
        while n > max_keys {
            n /= 2;
        }
        let shard_shift = 64 - n.trailing_zeros();
        let (base, extra) = (max_keys / n, max_keys % n);
        let shards = (0..n)
            .map(|i| {
                let cap = base + usize::from(i < extra);
                let shard = Shard {
                    cap: u32::try_from(cap).unwrap_or(u32::MAX),
                    ..Shard::default()
                };
                Padded(SpinLock::new(shard))
            })
            .collect();
        // A random seed: tags cannot be predicted, so clients cannot craft
        // identities that collide or pile into one shard.
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x5350_494c_4c57_4159);
            h.finish()
        };
        MemoryStore {
            shards,
            shard_shift: if n == 1 { 64 } else { shard_shift },
            seed,
            clock,
            overflow: SpinLock::new(Overflow::default()),
            overflowed: AtomicU64::new(0),
        }
    }

    /// Requests decided against a shared overflow state since the store
    /// began: their key found the table full of limiting keys and was not
    /// stored (see [`MemoryConfig::max_keys`]). A rising count means a
    /// flood of new keys, or `max_keys` too small for the clients at hand.
    pub fn overflowed(&self) -> u64 {
        self.overflowed.load(Ordering::Relaxed)
    }

    /// Counts one request decided against an overflow state.
    fn count_overflow(&self, used: bool) {
        if used {
            self.overflowed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Decides at the clock's current time.
    pub fn decide_now(&self, charges: &[Charge<'_>], cost: u64) -> Decision {
        self.decide_at(charges, cost, self.clock.now())
    }

    /// Decides `charges` (rules with their clients' keys) at `now`, all-or-none
    /// across every rule and limit: see [`spillway_core::decide`].
    pub fn decide_at(&self, charges: &[Charge<'_>], cost: u64, now: Nanos) -> Decision {
        self.run(charges, cost, now, false)
    }

    /// Charges `cost` after the fact at the clock's current time.
    pub fn charge_now(&self, charges: &[Charge<'_>], cost: u64) -> Decision {
        self.charge_at(charges, cost, self.clock.now())
    }

    /// Charges `cost` after the fact to every rule and limit of `charges`
    /// at `now`, even past their limits: see [`spillway_core::charge`].
    pub fn charge_at(&self, charges: &[Charge<'_>], cost: u64, now: Nanos) -> Decision {
        self.run(charges, cost, now, true)
    }

    /// Decides (or, if `after`, charges) under every charge's shard lock.
    fn run(&self, charges: &[Charge<'_>], cost: u64, now: Nanos, after: bool) -> Decision {
        let step = |rules: &[&Rule], view: &mut View<'_, '_>| {
            if after {
                charge(rules, view, now, cost)
            } else {
                decide(rules, view, now, cost)
            }
        };
        match charges {
            [] => Decision::unlimited(),
            [one] => {
                let h = self.hash(one);
                let mut guard = self.shard(h).0.lock();
                let mut view = View {
                    shards: std::slice::from_mut(&mut guard),
                    keys: &[(0, h, one.rule.fingerprint())],
                    overflow: &self.overflow,
                    overflowed: false,
                };
                let d = step(&[one.rule], &mut view);
                self.count_overflow(view.overflowed);
                d
            }
            many => {
                let hashes: Vec<u64> = many.iter().map(|c| self.hash(c)).collect();
                let mut order: Vec<usize> = hashes.iter().map(|&h| self.shard_index(h)).collect();
                order.sort_unstable();
                order.dedup();
                let mut guards: Vec<SpinGuard<'_, Shard>> =
                    order.iter().map(|&i| self.shards[i].0.lock()).collect();
                let keys: Vec<(usize, u64, u64)> = hashes
                    .iter()
                    .zip(many)
                    .map(|(&h, c)| {
                        let si = self.shard_index(h);
                        let at = order.binary_search(&si).unwrap_or(0);
                        (at, h, c.rule.fingerprint())
                    })
                    .collect();
                let rules: Vec<&Rule> = many.iter().map(|c| c.rule).collect();
                let mut view = View {
                    shards: &mut guards,
                    keys: &keys,
                    overflow: &self.overflow,
                    overflowed: false,
                };
                let d = step(&rules, &mut view);
                self.count_overflow(view.overflowed);
                d
            }
        }
    }

    /// The hash this store files `charge`'s states under (keyed by its
    /// seed): what [`limit_at`](Self::limit_at) takes, so a caller that
    /// keeps a key for later (local-first sync) need not keep its values.
    pub fn key_hash(&self, charge: &Charge<'_>) -> u64 {
        self.hash(charge)
    }

    /// One limit (`index` among `rule`'s enforced limits) of the client
    /// whose [`key_hash`](Self::key_hash) is `hash`, at `now`: charged
    /// `cost` after the fact (even past the limit, as
    /// [`charge_at`](Self::charge_at) charges it), and a check of cost 0
    /// after it; `cost` 0 only checks. For local-first sync, which catches
    /// each limit up with the count every instance shares.
    pub fn limit_at(&self, rule: &Rule, hash: u64, index: usize, cost: u64, now: Nanos) -> Verdict {
        let Some(limit) = rule.enforced_limits().get(index) else {
            return Verdict::never(0);
        };
        let mut shard = self.shard(hash).0.lock();
        let mut used = false;
        let spill = Spill {
            overflow: &self.overflow,
            shared: Shared::Rule {
                fingerprint: rule.fingerprint(),
                index,
            },
            used: &mut used,
        };
        let write = if cost == 0 { Write::No } else { Write::Always };
        let v = apply(
            &mut shard,
            spill,
            limit_tag(hash, index),
            limit,
            now,
            cost,
            write,
        );
        drop(shard);
        self.count_overflow(used);
        v
    }

    /// [`peek_at`](Self::peek_at) at the clock's current time.
    pub fn peek_now(&self, charges: &[Charge<'_>], cost: u64) -> Vec<Vec<Verdict>> {
        self.peek_at(charges, cost, self.clock.now())
    }

    /// Where each charge's key stands at `now`, without charging it: per
    /// charge, the verdict of each of its rule's enforced limits, in order,
    /// for a request of `cost` (what [`decide_at`](Self::decide_at) would
    /// find on each limit before charging). Nothing changes: no state, no
    /// eviction mark, no overflow count. A key the store does not hold is
    /// seen as it would be decided: fresh if the table has room for it,
    /// else against its rule's shared overflow state.
    pub fn peek_at(&self, charges: &[Charge<'_>], cost: u64, now: Nanos) -> Vec<Vec<Verdict>> {
        charges
            .iter()
            .map(|c| {
                let h = self.hash(c);
                let fingerprint = c.rule.fingerprint();
                let mut shard = self.shard(h).0.lock();
                // Set if a verdict came from an overflow state; a look is
                // not counted in `overflowed`.
                let mut used = false;
                c.rule
                    .enforced_limits()
                    .iter()
                    .enumerate()
                    .map(|(index, limit)| {
                        let spill = Spill {
                            overflow: &self.overflow,
                            shared: Shared::Rule { fingerprint, index },
                            used: &mut used,
                        };
                        let tag = limit_tag(h, index);
                        apply(&mut shard, spill, tag, limit, now, cost, Write::Peek)
                    })
                    .collect()
            })
            .collect()
    }

    /// Forgets every limit's state of each charge's key, so the client
    /// starts afresh; returns how many states were dropped (0 for a key
    /// not held).
    ///
    /// A key that found no room when it was decided lives in its rule's
    /// shared overflow state (see [`MemoryConfig::max_keys`]), together
    /// with every other key that found none: that state is not the
    /// client's alone, so it is left as it is, and such a client is still
    /// limited with the others there until the overflow state is at rest.
    pub fn reset_now(&self, charges: &[Charge<'_>]) -> usize {
        let mut dropped = 0;
        for c in charges {
            let h = self.hash(c);
            let mut shard = self.shard(h).0.lock();
            for index in 0..c.rule.enforced_limits().len() {
                // Every kind of table: a state is found under its tag
                // whatever the kind, and a rule's limits differ in kind.
                let tag = limit_tag(h, index);
                let s = &mut *shard;
                dropped += usize::from(s.narrow.remove(tag))
                    + usize::from(s.wide.remove(tag))
                    + usize::from(s.logs.remove(tag));
            }
        }
        dropped
    }

    /// Decides one limit for one key, without rules: the fastest path, used by
    /// benchmarks and by callers that manage their own keys. `key` is any
    /// byte string naming the client; `limit` must be the same for a key
    /// across calls.
    pub fn check(&self, key: &[u8], limit: &Limit, cost: u64, now: Nanos) -> Verdict {
        self.check_tag(self.key_tag(key), limit, cost, now)
    }

    /// [`check`](Self::check) for a key already hashed.
    fn check_tag(&self, tag: u64, limit: &Limit, cost: u64, now: Nanos) -> Verdict {
        let mut shard = self.shard(tag).0.lock();
        let mut used = false;
        let v = apply(
            &mut shard,
            self.bare(&mut used),
            tag,
            limit,
            now,
            cost,
            if cost == 0 {
                Write::No
            } else {
                Write::IfAdmitted
            },
        );
        drop(shard);
        self.count_overflow(used);
        v
    }

    /// Decides `items` (key, limit, cost) one after the other at `now`,
    /// exactly as [`check`](Self::check) on each in turn would, appending
    /// the verdicts to `out`; but first asks the CPU to start loading every
    /// key's slot, so that on tables larger than the caches the misses of
    /// the batch overlap instead of following one another. For callers with
    /// several requests at hand (pipelined requests, a batch API).
    pub fn check_many(&self, items: &[(&[u8], &Limit, u64)], now: Nanos, out: &mut Vec<Verdict>) {
        let mut tags = Vec::with_capacity(items.len());
        for &(key, limit, _) in items {
            let tag = self.key_tag(key);
            tags.push(tag);
            // The shard's header is small and hot; the slot is the miss.
            let shard = self.shard(tag).0.lock();
            match limit.state_kind() {
                StateKind::Narrow => shard.narrow.prefetch(tag),
                StateKind::Wide => shard.wide.prefetch(tag),
                StateKind::Log => shard.logs.prefetch(tag),
            }
        }
        out.reserve(items.len());
        for (&(_, limit, cost), tag) in items.iter().zip(tags) {
            out.push(self.check_tag(tag, limit, cost, now));
        }
    }

    /// Drops expired keys from up to `budget` slots per shard per kind,
    /// continuing from where the last call stopped. Returns keys dropped.
    /// Idle keys also vanish lazily as tables grow or evict; call this
    /// periodically to return memory sooner.
    pub fn sweep(&self, budget: usize) -> usize {
        let now = self.clock.now().as_u64();
        let mut dropped = 0;
        for p in self.shards.iter() {
            let mut s = p.0.lock();
            let before = s.narrow.len() + s.wide.len() + s.logs.len();
            // Only `budget` slots per table per call: the lock is held briefly.
            // A position past 2^32 starts the next sweep over (see `cursor`).
            let at = |c: u32| c as usize;
            let next = |c: usize| u32::try_from(c).unwrap_or(0);
            let [a, b, c] = s.cursor;
            s.cursor = [
                next(s.narrow.purge_some(at(a), budget, now)),
                next(s.wide.purge_some(at(b), budget, now)),
                next(s.logs.purge_some(at(c), budget, now)),
            ];
            dropped += before - (s.narrow.len() + s.wide.len() + s.logs.len());
        }
        // A handful of states (one per rule and limit that overflowed).
        self.overflow.lock().purge(now);
        dropped
    }

    /// Drops every expired key now (takes each shard's lock for a full pass).
    pub fn purge(&self) -> usize {
        let now = self.clock.now().as_u64();
        self.overflow.lock().purge(now);
        self.shards
            .iter()
            .map(|p| {
                let mut s = p.0.lock();
                s.narrow.purge(now) + s.wide.purge(now) + s.logs.purge(now)
            })
            .sum()
    }

    /// Keys and bytes held.
    pub fn usage(&self) -> MemoryUsage {
        let mut u = MemoryUsage::default();
        for p in self.shards.iter() {
            let s = p.0.lock();
            u.keys += s.narrow.len() + s.wide.len() + s.logs.len();
            u.bytes += s.narrow.bytes() + s.wide.bytes() + s.logs.bytes();
        }
        let o = self.overflow.lock();
        u.bytes += o.narrow.bytes() + o.wide.bytes() + o.logs.bytes();
        u.overflowed = self.overflowed();
        u
    }

    /// Overflow for a bare key ([`check`](Self::check)).
    #[inline]
    fn bare<'a>(&'a self, used: &'a mut bool) -> Spill<'a> {
        Spill {
            overflow: &self.overflow,
            shared: Shared::Bare,
            used,
        }
    }

    /// The tag of a bare key ([`check`](Self::check) and
    /// [`check_many`](Self::check_many)).
    fn key_tag(&self, key: &[u8]) -> u64 {
        nonzero(xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed))
    }

    fn hash(&self, c: &Charge<'_>) -> u64 {
        c.key.hash(c.rule.fingerprint(), self.seed)
    }

    #[inline]
    fn shard_index(&self, h: u64) -> usize {
        h.checked_shr(self.shard_shift).unwrap_or(0) as usize
    }

    #[inline]
    fn shard(&self, h: u64) -> &Padded {
        &self.shards[self.shard_index(h)]
    }
}

#[inline]
pub(crate) fn nonzero(h: u64) -> u64 {
    if h == 0 { 1 } else { h }
}

/// The tag of limit `index` of a rule whose client hashes to `h`: keeps the
/// shard bits (the top ones) and mixes the index into the rest.
#[inline]
pub(crate) fn limit_tag(h: u64, index: usize) -> u64 {
    let mixed = h ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 16;
    nonzero(mixed)
}

/// Applies one limit to the state under `tag` in `shard`: decides, and if
/// `commit` and admitted, stores the new state. A key not held is decided
/// against a fresh state if the table has room for it, else against its
/// shared overflow state (see [`MemoryConfig::max_keys`]).
#[inline]
fn apply(
    shard: &mut Shard,
    spill: Spill<'_>,
    tag: u64,
    limit: &Limit,
    now: Nanos,
    cost: u64,
    write: Write,
) -> Verdict {
    let cap = shard.cap as usize;
    let at = Step {
        tag,
        cap,
        now,
        cost,
        write,
    };
    let after = write == Write::Always;
    match limit.state_kind() {
        StateKind::Narrow => apply_compact(
            &mut shard.narrow,
            at,
            spill,
            limit,
            |o| &mut o.narrow,
            |s| {
                if after {
                    limit.charge_narrow(s, now, cost)
                } else {
                    limit.decide_narrow(s, now, cost)
                }
            },
        )
        .unwrap_or_else(|| deny_all(limit)),
        StateKind::Wide => apply_compact(
            &mut shard.wide,
            at,
            spill,
            limit,
            |o| &mut o.wide,
            |s| {
                if after {
                    limit.charge_wide(s, now, cost)
                } else {
                    limit.decide_wide(s, now, cost)
                }
            },
        )
        .unwrap_or_else(|| deny_all(limit)),
        StateKind::Log => {
            let Limit::SlidingLog(sl) = limit else {
                return deny_all(limit);
            };
            apply_log(&mut shard.logs, at, spill, limit, sl)
        }
    }
}

/// Unreachable in practice (kinds and decide methods agree); a denial keeps it safe.
fn deny_all(limit: &Limit) -> Verdict {
    Verdict::never(limit.size())
}

struct View<'a, 'g> {
    shards: &'a mut [SpinGuard<'g, Shard>],
    /// Per charge: its shard in `shards`, its key's hash, its rule's fingerprint.
    keys: &'a [(usize, u64, u64)],
    overflow: &'a SpinLock<Overflow>,
    /// Set when a limit was decided against an overflow state.
    overflowed: bool,
}

impl View<'_, '_> {
    fn apply(
        &mut self,
        charge: usize,
        index: usize,
        limit: &Limit,
        now: Nanos,
        cost: u64,
        write: Write,
    ) -> Verdict {
        let (si, h, fingerprint) = self.keys[charge];
        let spill = Spill {
            overflow: self.overflow,
            shared: Shared::Rule { fingerprint, index },
            used: &mut self.overflowed,
        };
        apply(
            &mut self.shards[si],
            spill,
            limit_tag(h, index),
            limit,
            now,
            cost,
            write,
        )
    }
}

impl StateView for View<'_, '_> {
    fn verdict(
        &mut self,
        charge: usize,
        index: usize,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Verdict {
        self.apply(charge, index, limit, now, cost, Write::No)
    }

    fn commit(&mut self, charge: usize, index: usize, limit: &Limit, now: Nanos, cost: u64) {
        let _ = self.apply(charge, index, limit, now, cost, Write::IfAdmitted);
    }

    fn charge(
        &mut self,
        charge: usize,
        index: usize,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Verdict {
        self.apply(charge, index, limit, now, cost, Write::Always)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard and its lock fit the two cache lines `Padded` gives it.
    #[test]
    fn a_shard_stays_within_its_padding() {
        assert_eq!(std::mem::size_of::<Padded>(), 128);
    }

    /// The shards' caps add up to `max_keys` exactly, whatever the shard
    /// count, and no shard is left without room.
    #[test]
    fn shard_caps_add_up_to_max_keys() {
        for (max_keys, shards) in [
            (1, 256),
            (5, 256),
            (1000, 256),
            (1 << 20, 4),
            (10_000, 16),
            (7, 1),
        ] {
            let store = MemoryStore::new(
                spillway_core::ManualClock::new(Nanos(1)),
                MemoryConfig { max_keys, shards },
            );
            let caps: Vec<usize> = store
                .shards
                .iter()
                .map(|p| p.0.lock().cap as usize)
                .collect();
            assert_eq!(
                caps.iter().sum::<usize>(),
                max_keys,
                "{max_keys} over {shards}"
            );
            assert!(caps.iter().all(|&c| c >= 1), "{max_keys} over {shards}");
        }
    }

    /// A flood of new keys never takes the store past `max_keys`, even
    /// when the cap does not divide by the shard count.
    #[test]
    fn a_flood_stays_within_a_cap_that_does_not_divide() {
        let store = MemoryStore::new(
            spillway_core::ManualClock::new(Nanos(1)),
            MemoryConfig {
                max_keys: 1000,
                shards: 256,
            },
        );
        let limit =
            Limit::FixedWindow(spillway_core::FixedWindow::new(5, Nanos::from_secs(60)).unwrap());
        for i in 0..20_000u32 {
            assert!(store.check(&i.to_le_bytes(), &limit, 1, Nanos(1)).allowed);
            if i % 1000 == 999 {
                assert!(store.usage().keys <= 1000, "after {i}");
            }
        }
        let keys = store.usage().keys;
        assert!((900..=1000).contains(&keys), "{keys}");
    }
}

#[cfg(test)]
mod peek_tests {
    use super::*;
    use crate::Key;
    use spillway_core::{
        FixedWindow, Gcra, KeySpec, LeakyBucket, ManualClock, Mode, Rate, Shaper, SlidingCounter,
        SlidingLog, TokenBucket,
    };

    /// A rule per algorithm, one of two limits, a soft and a shadow one.
    fn rules() -> Vec<Rule> {
        let r = Rate::new(4, Nanos::from_secs(1)).unwrap();
        let w = Nanos::from_secs(2);
        let limits = [
            Limit::TokenBucket(TokenBucket::new(5, r).unwrap()),
            Limit::LeakyBucket(LeakyBucket::new(5, r).unwrap()),
            Limit::Shaper(Shaper::new(5, r, Nanos::from_millis(600)).unwrap()),
            Limit::FixedWindow(FixedWindow::new(5, w).unwrap()),
            Limit::SlidingLog(SlidingLog::new(5, w).unwrap()),
            Limit::SlidingCounter(SlidingCounter::new(5, w).unwrap()),
            Limit::Gcra(Gcra::new(r, 3).unwrap()),
        ];
        let rule = |name: &str, limits: Vec<Limit>, mode| {
            Rule::new(name, None, KeySpec::parse("user").unwrap(), limits, mode).unwrap()
        };
        let mut out: Vec<Rule> = limits
            .iter()
            .map(|l| rule(l.algorithm_name(), vec![l.clone()], Mode::Hard))
            .collect();
        out.push(rule(
            "multi",
            vec![limits[4].clone(), limits[6].clone()],
            Mode::Hard,
        ));
        out.push(rule(
            "soft",
            vec![limits[3].clone(), limits[5].clone()],
            Mode::Soft { percent: 40 },
        ));
        out.push(rule("shadow", vec![limits[0].clone()], Mode::Shadow));
        out
    }

    fn store(clock: &ManualClock) -> MemoryStore<ManualClock> {
        MemoryStore::new(clock.clone(), MemoryConfig::default())
    }

    /// Looking changes nothing: a store that is looked at before every
    /// request decides exactly as its twin that never is, and a look of
    /// cost 1 finds on each limit what the request then finds.
    #[test]
    fn a_look_charges_nothing_and_sees_what_a_request_would() {
        let clock = ManualClock::new(Nanos::from_secs(1_000));
        let (looked, twin) = (store(&clock), store(&clock));
        let rules = rules();
        let key = Key::from_parts(["alice"]);
        for step in 0..40u64 {
            // Bursts, then pauses that let buckets refill and windows turn.
            clock.advance(Nanos::from_millis(if step % 8 == 7 { 900 } else { 30 }));
            for rule in &rules {
                let charges = [Charge { rule, key: &key }];
                let first = looked.peek_now(&charges, 1);
                assert_eq!(looked.peek_now(&charges, 1), first, "{}", rule.name());
                assert_eq!(first.len(), 1);
                assert_eq!(first[0].len(), rule.enforced_limits().len());
                let d = looked.decide_now(&charges, 1);
                assert_eq!(
                    d,
                    twin.decide_now(&charges, 1),
                    "{} step {step}",
                    rule.name()
                );
                // A hard or shadow rule of one limit reports that limit's
                // verdict as the look saw it.
                if rule.limits().len() == 1 && !matches!(rule.mode(), Mode::Soft { .. }) {
                    let mut seen = first[0][0];
                    seen.wait = d.rules[0].verdict.wait;
                    assert_eq!(d.rules[0].verdict, seen, "{} step {step}", rule.name());
                }
                // Whether each limit admits is whether the request passed.
                let all = first[0].iter().all(|v| v.allowed);
                if rule.mode() != Mode::Shadow {
                    assert_eq!(all, d.allowed, "{} step {step}", rule.name());
                }
            }
        }
        assert_eq!(looked.usage().keys, twin.usage().keys);
    }

    /// A soft rule is seen under its enforced size, the one that refuses.
    #[test]
    fn a_soft_rule_is_seen_under_its_raised_size() {
        let clock = ManualClock::new(Nanos::from_secs(1_000));
        let s = store(&clock);
        let rules = rules();
        let soft = rules.iter().find(|r| r.name() == "soft").unwrap();
        let key = Key::from_parts(["bob"]);
        let charges = [Charge {
            rule: soft,
            key: &key,
        }];
        // 5 per window, raised by 40 % to 7.
        for _ in 0..6 {
            assert!(s.decide_now(&charges, 1).allowed);
        }
        let seen = s.peek_now(&charges, 1);
        assert_eq!(seen[0][0].limit, 7);
        assert!(seen[0][0].allowed);
        assert_eq!(seen[0][0].remaining, 0);
        assert!(s.decide_now(&charges, 1).allowed);
        assert!(!s.peek_now(&charges, 1)[0][0].allowed);
        assert!(!s.decide_now(&charges, 1).allowed);
    }

    /// A reset makes a key fresh on every algorithm: it decides as a store
    /// that never saw it, and other keys keep their states.
    #[test]
    fn a_reset_makes_the_key_fresh_and_spares_the_others() {
        let clock = ManualClock::new(Nanos::from_secs(1_000));
        let s = store(&clock);
        let rules = rules();
        let (alice, bob) = (Key::from_parts(["alice"]), Key::from_parts(["bob"]));
        for rule in &rules {
            for key in [&alice, &bob] {
                let c = [Charge { rule, key }];
                for _ in 0..12 {
                    s.decide_now(&c, 1);
                }
                s.charge_now(&c, 3);
            }
        }
        let before = s.usage().keys;
        let all: Vec<Charge<'_>> = rules
            .iter()
            .map(|rule| Charge { rule, key: &alice })
            .collect();
        let dropped = s.reset_now(&all);
        assert!(dropped > 0);
        assert_eq!(s.usage().keys, before - dropped);
        assert_eq!(s.reset_now(&all), 0, "nothing left to drop");
        let fresh = store(&clock);
        for rule in &rules {
            let a = [Charge { rule, key: &alice }];
            assert_eq!(s.peek_now(&a, 1), fresh.peek_now(&a, 1), "{}", rule.name());
            assert_eq!(
                s.decide_now(&a, 1),
                fresh.decide_now(&a, 1),
                "{}",
                rule.name()
            );
            // Bob is as far gone as before (every rule denies him or has
            // spent some of his allowance).
            let b = [Charge { rule, key: &bob }];
            let seen = &s.peek_now(&b, 1)[0];
            assert!(
                seen.iter()
                    .zip(rule.enforced_limits())
                    .any(|(v, l)| !v.allowed || v.remaining + 1 < l.size()),
                "{}: {seen:?}",
                rule.name()
            );
        }
    }

    /// A key decided against the shared overflow state is not the
    /// overflow's only client: a reset leaves that state alone, and a
    /// look is not counted as an overflowed decision.
    #[test]
    fn a_reset_leaves_the_shared_overflow_state_alone() {
        let clock = ManualClock::new(Nanos::from_secs(1_000));
        let s = MemoryStore::new(
            clock.clone(),
            MemoryConfig {
                max_keys: 1,
                shards: 1,
            },
        );
        let rule = Rule::new(
            "w",
            None,
            KeySpec::parse("user").unwrap(),
            vec![Limit::FixedWindow(
                FixedWindow::new(2, Nanos::from_secs(60)).unwrap(),
            )],
            Mode::Hard,
        )
        .unwrap();
        let (held, spilled) = (Key::from_parts(["held"]), Key::from_parts(["spilled"]));
        let h = [Charge {
            rule: &rule,
            key: &held,
        }];
        let o = [Charge {
            rule: &rule,
            key: &spilled,
        }];
        // The one slot is taken by a key being limited: the next key spills.
        for _ in 0..3 {
            s.decide_now(&h, 1);
        }
        for _ in 0..3 {
            s.decide_now(&o, 1);
        }
        let overflowed = s.overflowed();
        assert!(overflowed > 0);
        assert!(!s.peek_now(&o, 1)[0][0].allowed);
        assert_eq!(s.overflowed(), overflowed, "a look is not a decision");
        assert_eq!(s.reset_now(&o), 0);
        assert!(!s.decide_now(&o, 1).allowed, "the overflow state is kept");
        // The held key resets, and the spilled one may then take its slot.
        assert_eq!(s.reset_now(&h), 1);
        assert!(s.decide_now(&h, 1).allowed);
    }

    /// Through the `Store` trait, as the admin API calls it.
    #[test]
    fn the_store_trait_looks_and_resets() {
        let clock = ManualClock::new(Nanos::from_secs(1_000));
        let s = store(&clock);
        let rules = rules();
        let key = Key::from_parts(["carol"]);
        let c = [Charge {
            rule: &rules[3],
            key: &key,
        }];
        for _ in 0..5 {
            crate::block_on(crate::Store::decide(&s, &c, 1)).unwrap();
        }
        let seen = crate::block_on(crate::Store::peek(&s, &c, 1)).unwrap();
        assert!(!seen[0][0].allowed);
        crate::block_on(crate::Store::reset(&s, &c)).unwrap();
        let seen = crate::block_on(crate::Store::peek(&s, &c, 1)).unwrap();
        assert_eq!((seen[0][0].allowed, seen[0][0].remaining), (true, 4));
    }
}

#[cfg(test)]
mod cost_tests {
    use super::*;
    use crate::Key;
    use spillway_core::{KeySpec, ManualClock, Mode, SlidingLog};

    /// Issue 35's finding, in the memory store: `sliding_window_log {
    /// limit: 100000 }` and 1,000 keys each checked with `cost: 100000`
    /// (then charged after the fact far past it) took 400 KB per key, 450
    /// MiB in all. Now a request of any cost is one run: the store holds
    /// about what 1,000 requests of cost 1 hold.
    #[test]
    fn keys_charged_huge_costs_hold_what_cost_one_holds() {
        let clock = ManualClock::new(Nanos::from_secs(1_000));
        let rule = Rule::new(
            "log",
            None,
            KeySpec::parse("user").unwrap(),
            vec![Limit::SlidingLog(
                SlidingLog::new(100_000, Nanos::from_secs(60)).unwrap(),
            )],
            Mode::Hard,
        )
        .unwrap();
        // 1,000 keys, each sent `cost` and then charged `charge` after the
        // fact; what the store then holds.
        let fill = |cost: u64, charge: u64| {
            let store = MemoryStore::new(clock.clone(), MemoryConfig::default());
            for i in 0..1_000 {
                let name = format!("k{i}");
                let key = Key::from_parts([name.as_str()]);
                let charges = [Charge {
                    rule: &rule,
                    key: &key,
                }];
                assert!(store.decide_now(&charges, cost).allowed);
                if charge > 0 {
                    store.charge_now(&charges, charge);
                }
            }
            store.usage().bytes
        };
        let (huge, one) = (fill(100_000, u64::MAX), fill(1, 0));
        // A ring of a run or two per key (the old log: 400 KB per key).
        assert!(
            huge <= one + 1_000 * 256,
            "{huge} bytes for 1,000 keys of cost 100,000; {one} for cost 1"
        );
    }
}
