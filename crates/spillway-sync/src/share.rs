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
        if (d.allowed || after) && cost > 0 && owe {
            for rd in &d.rules {
                if after || rd.outcome != Outcome::ShadowDenied {
                    let c = &charges[rd.rule];
                    self.owe(tag(c), c.rule, cost);
                }
            }
        }
        d
    }
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
}
