//! `on_store_error: share`: what one instance admits alone while the
//! shared store is unreachable.
//!
//! Each instance enforces `limit / N` ([`Rule::shared`]), N being the live
//! instances it last saw through the store's heartbeats (remembered while
//! the store is gone; 1 if it never saw any), in a memory store of its
//! own. What it admits meanwhile is recorded per key, to be charged to the
//! shared counts once when the store returns (through a [`Link`], so a
//! retried reconciliation never counts twice).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use spillway_core::{Decision, Outcome, Rule};
use spillway_store::{Charge, MemoryConfig, MemoryStore};

use crate::clock::StoreClock;
use crate::link::Link;

/// Scaled copies of rules, by fingerprint and share.
type Scaled = HashMap<(u64, u64), Arc<Rule>>;

/// Doubts held at most; past it the oldest are owed (counted when in
/// doubt).
const MAX_DOUBTS: usize = 65_536;

/// What the store said of itself when a call to it timed out: whether
/// it later answered on the same connection, with the same data, tells
/// whether it ran the call (see [`Share::settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doubt {
    /// The store's count of lost connections when the call timed out.
    pub losses: u64,
    /// The name of the data the store held, as last read (empty if never).
    pub incarnation: Arc<[u8]>,
}

/// An admission the store may have counted too.
#[derive(Debug)]
struct Doubtful {
    doubt: Doubt,
    /// [`Share::mark`]'s count when it was recorded.
    at: u64,
    tag: u64,
    rule: Arc<Rule>,
    cost: u64,
}

/// One instance's share of every limit, and what it admitted alone.
#[derive(Debug)]
pub struct Share {
    local: MemoryStore<StoreClock>,
    scaled: RwLock<Scaled>,
    /// Live instances last seen (at least 1).
    live: AtomicU64,
    /// Whether decisions are being made here now.
    active: AtomicBool,
    /// Decisions made here since the store became unreachable.
    decided: AtomicU64,
    /// What was admitted here, for the shared counts.
    pub(crate) owed: Mutex<Link<Arc<Rule>>>,
    /// What was admitted here after a store call that may have counted
    /// it too, until the store says whether it did ([`Share::settle`]).
    doubts: Mutex<Vec<Doubtful>>,
    /// Orders doubts against the store's later answers ([`Share::mark`]).
    marks: AtomicU64,
    /// Rules by fingerprint, so an admission records the unscaled rule.
    rules: RwLock<HashMap<u64, Arc<Rule>>>,
}

impl Share {
    /// A share store on `clock`, holding at most `max_keys` keys.
    pub fn new(clock: StoreClock, max_keys: usize) -> Share {
        Share {
            local: MemoryStore::new(
                clock,
                MemoryConfig {
                    max_keys: max_keys.max(1),
                    ..MemoryConfig::default()
                },
            ),
            scaled: RwLock::new(HashMap::new()),
            live: AtomicU64::new(1),
            active: AtomicBool::new(false),
            decided: AtomicU64::new(0),
            owed: Mutex::new(Link::default()),
            doubts: Mutex::new(Vec::new()),
            marks: AtomicU64::new(0),
            rules: RwLock::new(HashMap::new()),
        }
    }

    /// Sets the live instances seen (a heartbeat's answer).
    pub fn set_live(&self, n: u64) {
        self.live.store(n.max(1), Ordering::Relaxed);
    }

    /// Live instances last seen.
    pub fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Whether this instance is deciding on its share now.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Decisions made on the share since the store was last lost.
    pub fn decided(&self) -> u64 {
        self.decided.load(Ordering::Relaxed)
    }

    /// Marks the store as back: later decisions go to it again. Returns
    /// whether sharing was on.
    pub fn end(&self) -> bool {
        let was = self.active.swap(false, Ordering::Relaxed);
        if was {
            tracing::info!(
                decided = self.decided(),
                "store reachable again: sharing ends; what this instance admitted alone is charged to the shared counts"
            );
        }
        was
    }

    /// The rule cut to this instance's share.
    pub(crate) fn scaled(&self, rule: &Rule, n: u64) -> Arc<Rule> {
        let key = (rule.fingerprint(), n);
        if let Some(r) = self.scaled.read().get(&key) {
            return r.clone();
        }
        let r = Arc::new(rule.shared(n));
        let mut map = self.scaled.write();
        // A handful of rules times the instance counts seen: bounded by
        // dropping the lot when it grows past what any rule set needs.
        if map.len() > 4096 {
            map.clear();
        }
        map.entry(key).or_insert(r).clone()
    }

    fn interned(&self, rule: &Rule) -> Arc<Rule> {
        if let Some(r) = self.rules.read().get(&rule.fingerprint()) {
            return r.clone();
        }
        let mut map = self.rules.write();
        if map.len() > 4096 {
            map.clear();
        }
        map.entry(rule.fingerprint())
            .or_insert_with(|| Arc::new(rule.clone()))
            .clone()
    }

    /// Records `cost` admitted for `tag` under `rule` elsewhere, to be
    /// charged to the store with what the share admitted.
    pub(crate) fn owe(&self, tag: u64, rule: &Rule, cost: u64) {
        let rule = self.interned(rule);
        self.owed.lock().add(tag, &rule, cost);
    }

    /// Records `cost` admitted for `tag` under `rule` here after a store
    /// call that timed out (`doubt`): the store may have run it, or not.
    fn doubt(&self, doubt: &Doubt, tag: u64, rule: &Rule, cost: u64) {
        let rule = self.interned(rule);
        let at = self.marks.fetch_add(1, Ordering::AcqRel);
        let mut doubts = self.doubts.lock();
        if doubts.len() >= MAX_DOUBTS {
            let mut owed = self.owed.lock();
            for d in doubts.drain(..MAX_DOUBTS / 2) {
                owed.add(d.tag, &d.rule, d.cost);
            }
        }
        doubts.push(Doubtful {
            doubt: doubt.clone(),
            at,
            tag,
            rule,
            cost,
        });
    }

    /// A mark to take before a call to the store whose answer settles the
    /// doubts recorded until now ([`Share::settle`]).
    pub fn mark(&self) -> u64 {
        self.marks.fetch_add(1, Ordering::AcqRel)
    }

    /// Units admitted here whose charge waits on the store's word.
    pub fn doubted(&self) -> u64 {
        self.doubts.lock().iter().map(|d| d.cost).sum()
    }

    /// The store answered a call sent after `mark` was taken, having lost
    /// `losses` connections so far and holding the data named
    /// `incarnation`. A doubt recorded before the mark, on the same
    /// connection (no loss since) and the same data, was run by the store
    /// before that answer: it is dropped. Any other is owed: its call may
    /// never have been run, or what it did was lost with the data
    /// (counted when in doubt: at worst a unit counted twice, never one
    /// admitted uncounted).
    pub fn settle(&self, mark: u64, losses: u64, incarnation: &[u8]) {
        let mut doubts = self.doubts.lock();
        if doubts.is_empty() {
            return;
        }
        let mut owed = self.owed.lock();
        let (mut ran, mut lost, mut renamed) = (0u64, 0u64, 0u64);
        doubts.retain(|d| {
            if d.at >= mark {
                return true;
            }
            if d.doubt.losses != losses {
                lost += d.cost;
            } else if d.doubt.incarnation.is_empty() || *d.doubt.incarnation != *incarnation {
                renamed += d.cost;
            } else {
                ran += d.cost;
                return false;
            }
            owed.add(d.tag, &d.rule, d.cost);
            false
        });
        if lost + renamed > 0 {
            tracing::info!(
                ran,
                lost,
                renamed,
                "units admitted after a store call timed out: the store ran `ran`; the rest are charged to it (its connection was lost since: `lost`; its data is not what it was: `renamed`)"
            );
        }
    }

    /// Decides (or, if `after`, charges) `charges` on this instance's share,
    /// recording what is charged for the shared counts if `owe` (not when
    /// the store may count the request itself); `tag` names a charge's key
    /// in the shared store.
    pub fn decide(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        owe: bool,
        tag: impl Fn(&Charge<'_>) -> u64,
    ) -> Decision {
        if !self.active.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                live = self.live(),
                "store unreachable: each instance now enforces its share of every limit (limit / {})",
                self.live()
            );
        }
        self.decided.fetch_add(1, Ordering::Relaxed);
        self.alone(charges, cost, after, owe, tag)
    }

    /// [`decide`](Self::decide) after a store call that may have counted
    /// the request itself (it timed out: `doubt` says on what): what is
    /// admitted waits for [`settle`](Self::settle) to be owed or dropped.
    pub fn decide_in_doubt(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        doubt: &Doubt,
        tag: impl Fn(&Charge<'_>) -> u64,
    ) -> Decision {
        let d = self.decide(charges, cost, after, false, &tag);
        for i in charged(&d, cost, after) {
            let c = &charges[i];
            self.doubt(doubt, tag(c), c.rule, cost);
        }
        d
    }

    /// Decides `charges` on this instance's share while the store is fine
    /// but cannot take the key (a sync store whose map of keys is full):
    /// as [`decide`](Self::decide), without saying the store is gone.
    pub fn alone(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        owe: bool,
        tag: impl Fn(&Charge<'_>) -> u64,
    ) -> Decision {
        let n = self.live();
        let scaled: Vec<Arc<Rule>> = charges.iter().map(|c| self.scaled(c.rule, n)).collect();
        let local: Vec<Charge<'_>> = charges
            .iter()
            .zip(&scaled)
            .map(|(c, r)| Charge {
                rule: r,
                key: c.key,
            })
            .collect();
        let d = if after {
            self.local.charge_now(&local, cost)
        } else {
            self.local.decide_now(&local, cost)
        };
        if owe {
            for i in charged(&d, cost, after) {
                let c = &charges[i];
                self.owe(tag(c), c.rule, cost);
            }
        }
        d
    }
}

/// The charges (by index) that decision `d` of `cost` counted: every
/// one a charge after the answer (`after`) or an admission counts, but a
/// shadow rule's refusal.
fn charged(d: &Decision, cost: u64, after: bool) -> impl Iterator<Item = usize> + '_ {
    let counts = (d.allowed || after) && cost > 0;
    d.rules
        .iter()
        .filter(move |rd| counts && (after || rd.outcome != Outcome::ShadowDenied))
        .map(|rd| rd.rule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos};
    use spillway_store::Key;

    fn rule() -> Rule {
        Rule::new(
            "r",
            None,
            KeySpec::parse("user").unwrap(),
            vec![Limit::FixedWindow(
                FixedWindow::new(100, Nanos::from_secs(3600)).unwrap(),
            )],
            Mode::Hard,
        )
        .unwrap()
    }

    /// With four instances alive, one admits a quarter of the limit, and
    /// records exactly what it admitted.
    #[test]
    fn an_instance_admits_its_share_and_owes_it() {
        let share = Share::new(StoreClock::new(), 1000);
        share.set_live(4);
        let rule = rule();
        let key = Key::from_parts(["alice"]);
        let charges = [Charge {
            rule: &rule,
            key: &key,
        }];
        let admitted = (0..100)
            .filter(|_| share.decide(&charges, 1, false, true, |_| 7).allowed)
            .count();
        assert_eq!(admitted, 25);
        assert!(share.active());
        let mut owed = share.owed.lock();
        assert_eq!(owed.waiting(), 25);
        let push = owed.to_send().cloned().unwrap();
        assert_eq!(push.items.len(), 1);
        assert_eq!((push.items[0].0, push.items[0].2), (7, 25));
        assert_eq!(push.items[0].1.fingerprint(), rule.fingerprint());
    }

    fn doubt(losses: u64, name: &[u8]) -> Doubt {
        Doubt {
            losses,
            incarnation: Arc::from(name),
        }
    }

    /// Admissions after a call that timed out wait for the store's word:
    /// dropped when it answered later on the same connection with the
    /// same data (it ran them), owed when the connection was lost or the
    /// data is another's (it may not have, or lost what it did), and kept
    /// when recorded after the answer's call was sent.
    #[test]
    fn admissions_in_doubt_are_owed_unless_the_store_ran_them() {
        let rule = rule();
        let key = Key::from_parts(["alice"]);
        let charges = [Charge {
            rule: &rule,
            key: &key,
        }];
        let owed = |share: &Share| share.owed.lock().waiting();
        for (losses, name, owes) in [(3, &b"a"[..], 0), (4, b"a", 2), (3, b"b", 2), (3, b"", 2)] {
            let share = Share::new(StoreClock::new(), 1000);
            let sent = doubt(3, if name.is_empty() { b"" } else { b"a" });
            for _ in 0..2 {
                assert!(
                    share
                        .decide_in_doubt(&charges, 1, false, &sent, |_| 7)
                        .allowed
                );
            }
            assert_eq!((owed(&share), share.doubted()), (0, 2));
            let mark = share.mark();
            assert!(
                share
                    .decide_in_doubt(&charges, 1, false, &sent, |_| 7)
                    .allowed
            );
            share.settle(mark, losses, name);
            assert_eq!(
                (owed(&share), share.doubted()),
                (owes, 1),
                "losses {losses}, name {name:?}"
            );
        }
    }

    /// A refusal is not in doubt: only what was admitted is.
    #[test]
    fn a_refusal_in_doubt_owes_nothing() {
        let share = Share::new(StoreClock::new(), 1000);
        share.set_live(100);
        let rule = rule();
        let key = Key::from_parts(["bob"]);
        let charges = [Charge {
            rule: &rule,
            key: &key,
        }];
        let sent = doubt(0, b"a");
        let admitted = (0..5)
            .filter(|_| {
                share
                    .decide_in_doubt(&charges, 1, false, &sent, |_| 7)
                    .allowed
            })
            .count();
        assert_eq!((admitted as u64, share.doubted()), (1, 1));
        let mark = share.mark();
        share.settle(mark, 1, b"a");
        assert_eq!((share.owed.lock().waiting(), share.doubted()), (1, 0));
    }
}
