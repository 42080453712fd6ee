//! Deciding one limit for one key in a shard's table, and where a key
//! goes when the table has no room for it: the shared overflow states
//! (see [`MemoryConfig::max_keys`](crate::MemoryConfig::max_keys)).

use spillway_core::{Limit, Log, Nanos, SlidingLog, Verdict, Wide};

use crate::memory::{limit_tag, nonzero};
use crate::spin::SpinLock;
use crate::table::{EntryMut, SlotState, Table};

/// The shared states of keys that found no room (see
/// [`MemoryConfig::max_keys`](crate::MemoryConfig::max_keys)): one per rule and limit, keyed by
/// [`Shared::tag`], never evicted (only dropped once at rest, when they
/// are as good as fresh). Locked after the shards, never before, so taking
/// it under a shard's lock cannot deadlock.
#[derive(Default)]
pub(crate) struct Overflow {
    pub(crate) narrow: Table<u64>,
    pub(crate) wide: Table<Wide>,
    pub(crate) logs: Table<Log>,
}

impl Overflow {
    pub(crate) fn purge(&mut self, now: u64) {
        self.narrow.purge(now);
        self.wide.purge(now);
        self.logs.purge(now);
    }
}

/// Which overflow state a key that finds no room is decided against.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shared {
    /// Limit `index` of the rule with this fingerprint.
    Rule { fingerprint: u64, index: usize },
    /// A bare key's limit ([`MemoryStore::check`](crate::MemoryStore::check)): by its algorithm, size
    /// and window.
    Bare,
}

impl Shared {
    fn tag(self, limit: &Limit) -> u64 {
        match self {
            Shared::Rule { fingerprint, index } => limit_tag(nonzero(fingerprint), index),
            Shared::Bare => {
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                h.update(limit.algorithm_name().as_bytes());
                h.update(&limit.size().to_le_bytes());
                h.update(&limit.window().as_u64().to_le_bytes());
                nonzero(h.digest())
            }
        }
    }
}

/// What `memory::apply` needs beyond the shard: the overflow states, and where
/// to say that it used one.
pub(crate) struct Spill<'a> {
    pub(crate) overflow: &'a SpinLock<Overflow>,
    pub(crate) shared: Shared,
    pub(crate) used: &'a mut bool,
}

impl<S: crate::table::SlotState> Default for Table<S> {
    fn default() -> Table<S> {
        Table::new()
    }
}

/// What a step does with the state.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// Decide only.
    No,
    /// Store the next state if admitted (a request's cost).
    IfAdmitted,
    /// Store the next state whatever the verdict (a cost charged after
    /// the fact: the `decide` given is then the algorithm's `charge`).
    Always,
    /// Decide only, for an operator looking: not even the entry's marks
    /// change (a look is not a use, and must not keep a key from eviction).
    Peek,
}

/// One decision's parameters, as `memory::apply` hands them on.
#[derive(Clone, Copy)]
pub(crate) struct Step {
    pub(crate) tag: u64,
    pub(crate) cap: usize,
    pub(crate) now: Nanos,
    pub(crate) cost: u64,
    pub(crate) write: Write,
}

impl Step {
    /// Whether a step with verdict `v` stores its next state.
    #[inline]
    fn writes(&self, v: &Verdict) -> bool {
        match self.write {
            Write::No | Write::Peek => false,
            Write::IfAdmitted => v.allowed,
            Write::Always => true,
        }
    }

    /// Whether a step on a sliding log may write it (its decision reads
    /// the log in place, so a step that only reads never takes an entry).
    #[inline]
    fn writes_log(&self) -> bool {
        !matches!(self.write, Write::No | Write::Peek)
    }
}

/// Records a decision on a held entry's marks: a denial, or an admission
/// that left less than its cost, means the client is being limited.
#[inline]
fn mark<S>(e: &mut EntryMut<'_, S>, v: &Verdict, at: Step) {
    if at.write == Write::Peek {
        return;
    }
    if !v.allowed {
        e.mark(true);
    } else if at.write != Write::No {
        e.mark(v.remaining < at.cost);
    } else {
        e.touch();
    }
}

/// Decides against a compact (`Copy`) state and stores the next one as
/// `at.write` says; `None` if `decide` does not handle this state kind.
#[inline]
pub(crate) fn apply_compact<S: SlotState + Copy>(
    table: &mut Table<S>,
    at: Step,
    spill: Spill<'_>,
    limit: &Limit,
    overflow: fn(&mut Overflow) -> &mut Table<S>,
    decide: impl Fn(S) -> Option<(Verdict, S)>,
) -> Option<Verdict> {
    // One probe for a known key: decide and update in place.
    if let Some(mut e) = table.get_mut(at.tag) {
        let (v, next) = decide(*e.state)?;
        if at.writes(&v) {
            *e.state = next;
        }
        mark(&mut e, &v, at);
        return Some(v);
    }
    let now = at.now.as_u64();
    if table.has_room(at.tag, at.cap, now) {
        let (v, next) = decide(S::default())?;
        if at.writes(&v)
            && let Some(mut e) = table.entry(at.tag, at.cap, now)
        {
            *e.state = next;
            mark(&mut e, &v, at);
        }
        return Some(v);
    }
    *spill.used = true;
    let shared = spill.shared.tag(limit);
    let mut o = spill.overflow.lock();
    let table = overflow(&mut o);
    let (v, next) = decide(table.get(shared).copied().unwrap_or_default())?;
    if at.writes(&v)
        && let Some(e) = table.entry(shared, usize::MAX, now)
    {
        *e.state = next;
    }
    Some(v)
}

/// [`apply_compact`] for a sliding log, which is decided in place and
/// charged by [`SlidingLog::commit`] (or, after the fact, by
/// [`SlidingLog::charge`]).
#[inline]
pub(crate) fn apply_log(
    table: &mut Table<Log>,
    at: Step,
    spill: Spill<'_>,
    limit: &Limit,
    sl: &SlidingLog,
) -> Verdict {
    let (now, cost) = (at.now, at.cost);
    // Decides, and charges as `at.write` says, one log in place.
    let step = |log: &mut Log| -> Verdict {
        if at.write == Write::Always {
            return sl.charge(log, now, cost);
        }
        let v = sl.decide(log, now, cost);
        if at.writes(&v) {
            sl.commit(log, now, cost);
        }
        v
    };
    if let Some(mut e) = table.get_mut(at.tag) {
        let v = step(e.state);
        mark(&mut e, &v, at);
        return v;
    }
    if table.has_room(at.tag, at.cap, now.as_u64()) {
        if !at.writes_log() {
            return sl.decide(&Log::new(), now, cost);
        }
        let mut fresh = Log::new();
        let v = step(&mut fresh);
        if !fresh.is_empty()
            && let Some(mut e) = table.entry(at.tag, at.cap, now.as_u64())
        {
            *e.state = fresh;
            mark(&mut e, &v, at);
        }
        return v;
    }
    *spill.used = true;
    let shared = spill.shared.tag(limit);
    let mut o = spill.overflow.lock();
    if !at.writes_log() {
        return match o.logs.get(shared) {
            Some(log) => sl.decide(log, now, cost),
            None => sl.decide(&Log::new(), now, cost),
        };
    }
    match o.logs.entry(shared, usize::MAX, now.as_u64()) {
        Some(e) => step(e.state),
        None => sl.decide(&Log::new(), now, cost),
    }
}
