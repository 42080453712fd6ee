//! The over-limit cache: keys Redis said are over their limit, answered
//! here until they may pass again, without a round trip.
//!
//! Under attack or a retry storm most calls hit keys already over their
//! limit, and each costs a Redis round trip that can only say no (and
//! charges nothing: a denied request is not charged). The cache remembers,
//! per rule, limit and key, the local instant before which Redis would
//! refuse any request of cost 1 or more, and refuses such requests itself
//! until then.
//!
//! - **Never longer than Redis would.** The instant is the time the call
//!   was *sent* plus the `retry_after` Redis answered; Redis decided after
//!   the call was sent, so its own instant is later, never earlier: the
//!   cache may let a request reach Redis slightly early (Redis refuses it
//!   again), never refuse one Redis would admit. Clocks of the instances
//!   do not enter: only this process's monotonic clock.
//! - **Only what any request would be refused.** Filled from denials of
//!   a request of cost 0 or 1 by a hard or soft rule (a larger cost's
//!   denial says nothing of a smaller one), and used only for requests of
//!   cost 1 or more: a check of cost 0 passes an exhausted key that does
//!   not owe anything, and goes to Redis. Shadow rules are never cached;
//!   charges after the fact always go to Redis.
//! - **Bounded.** A fixed table of `entries` slots, each a tag and an
//!   instant under its own small lock, indexed by the tag: a new key takes
//!   its slot from whatever was there (direct-mapped, no allocation).
//!
//! A rule set replaced on reload keeps the entries of its unchanged rules
//! (they are keyed by the rule's fingerprint); a rule that turns shadow
//! or looser may refuse from the cache until its entries run out, at most
//! the `retry_after` Redis last gave.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_core::{Decision, Mode, Nanos, Outcome, RuleDecision, RuleDecisions, Verdict};
use spillway_store::Charge;

/// The default number of slots (about 40 bytes each).
pub const DEFAULT_ENTRIES: usize = 16_384;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The rule, limit and key (0: empty).
    tag: u64,
    /// Nanoseconds after `OverLimit::base` before which the key is over.
    until: u64,
    /// The limit's size and its index in the rule, for the answer.
    size: u64,
    limit: u32,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct OverLimit {
    slots: Box<[Mutex<Slot>]>,
    base: Instant,
    seed: u64,
    hits: AtomicU64,
}

impl OverLimit {
    /// A cache of `entries` slots (rounded up to a power of two), or
    /// `None` for 0 (off).
    pub(crate) fn new(entries: usize) -> Option<OverLimit> {
        if entries == 0 {
            return None;
        }
        let n = entries.next_power_of_two();
        Some(OverLimit {
            slots: (0..n).map(|_| Mutex::new(Slot::default())).collect(),
            base: Instant::now(),
            seed: 0x5bd1_e995_7f4a_7c15 ^ u64::from(std::process::id()),
            hits: AtomicU64::new(0),
        })
    }

    /// Decisions answered here.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    fn tag(&self, c: &Charge<'_>, limit: usize) -> u64 {
        let h = c.key.hash(c.rule.fingerprint(), self.seed);
        let t = h ^ (limit as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if t == 0 { 1 } else { t }
    }

    fn slot(&self, tag: u64) -> &Mutex<Slot> {
        &self.slots[(tag as usize) & (self.slots.len() - 1)]
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A denial for a request of `cost` over `charges`, if one of their
    /// keys is known to be over its limit now.
    pub(crate) fn answer(&self, charges: &[Charge<'_>], cost: u64) -> Option<Decision> {
        if cost == 0 {
            return None;
        }
        let now = self.nanos(Instant::now());
        for (j, c) in charges.iter().enumerate() {
            if c.rule.mode() == Mode::Shadow {
                continue;
            }
            for li in 0..c.rule.enforced_limits().len() {
                let tag = self.tag(c, li);
                let s = *self.slot(tag).lock().unwrap_or_else(|e| e.into_inner());
                if s.tag != tag || s.until <= now {
                    continue;
                }
                self.hits.fetch_add(1, Ordering::Relaxed);
                let wait = Nanos(s.until - now);
                let rd = RuleDecision {
                    rule: j,
                    limit: s.limit as usize,
                    verdict: Verdict {
                        allowed: false,
                        limit: s.size,
                        remaining: 0,
                        reset: wait,
                        retry_after: wait,
                        wait: Nanos::ZERO,
                    },
                    outcome: Outcome::Denied,
                };
                let mut rules = RuleDecisions::new();
                rules.push(rd);
                return Some(Decision {
                    allowed: false,
                    wait: Nanos::ZERO,
                    deciding: Some(rd),
                    rules,
                });
            }
        }
        None
    }

    /// Remembers the keys `d` (the answer to a request of `cost` over
    /// `charges`, sent at `sent`) says are over their limit.
    pub(crate) fn learn(&self, charges: &[Charge<'_>], cost: u64, d: &Decision, sent: Instant) {
        if cost > 1 || d.allowed {
            return;
        }
        for rd in d.rules.iter().filter(|r| r.outcome == Outcome::Denied) {
            let (Some(c), v) = (charges.get(rd.rule), rd.verdict) else {
                continue;
            };
            if v.retry_after.is_never() || v.retry_after == Nanos::ZERO {
                continue;
            }
            let Some(until) = sent.checked_add(Duration::from_nanos(v.retry_after.as_u64())) else {
                continue;
            };
            let tag = self.tag(c, rd.limit);
            *self.slot(tag).lock().unwrap_or_else(|e| e.into_inner()) = Slot {
                tag,
                until: self.nanos(until),
                size: v.limit,
                limit: u32::try_from(rd.limit).unwrap_or(u32::MAX),
            };
        }
    }

    /// Slots in the table.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{FixedWindow, KeySpec, Limit, Rule};
    use spillway_store::Key;

    fn rule(mode: Mode) -> Rule {
        Rule::new(
            "r",
            None,
            KeySpec::parse("user").unwrap(),
            vec![Limit::FixedWindow(
                FixedWindow::new(5, Nanos::from_secs(60)).unwrap(),
            )],
            mode,
        )
        .unwrap()
    }

    fn denied(retry: Nanos) -> Decision {
        let rd = RuleDecision {
            rule: 0,
            limit: 0,
            verdict: Verdict {
                allowed: false,
                limit: 5,
                remaining: 0,
                reset: retry,
                retry_after: retry,
                wait: Nanos::ZERO,
            },
            outcome: Outcome::Denied,
        };
        let mut rules = RuleDecisions::new();
        rules.push(rd);
        Decision {
            allowed: false,
            wait: Nanos::ZERO,
            deciding: Some(rd),
            rules,
        }
    }

    #[test]
    fn a_key_over_its_limit_is_refused_until_retry_after_and_no_longer() {
        let cache = OverLimit::new(100).unwrap();
        assert_eq!(cache.len(), 128);
        let r = rule(Mode::Hard);
        let (a, b) = (Key::from_parts(["a"]), Key::from_parts(["b"]));
        let ca = [Charge { rule: &r, key: &a }];
        let cb = [Charge { rule: &r, key: &b }];
        assert!(cache.answer(&ca, 1).is_none());
        cache.learn(&ca, 1, &denied(Nanos::from_secs(30)), Instant::now());
        let d = cache.answer(&ca, 1).expect("cached");
        assert!(!d.allowed);
        assert!(d.rules[0].verdict.retry_after <= Nanos::from_secs(30));
        assert!(
            cache.answer(&ca, 3).is_some(),
            "a larger cost is refused too"
        );
        assert!(cache.answer(&ca, 0).is_none(), "a check goes to redis");
        assert!(cache.answer(&cb, 1).is_none(), "another key is not");
        assert_eq!(cache.hits(), 2);
        // An instant in the past: no longer over.
        let past = Instant::now() - Duration::from_secs(31);
        cache.learn(&ca, 1, &denied(Nanos::from_secs(30)), past);
        assert!(cache.answer(&ca, 1).is_none());
    }

    #[test]
    fn what_says_nothing_of_a_cost_of_one_is_not_learned() {
        let cache = OverLimit::new(16).unwrap();
        let r = rule(Mode::Hard);
        let k = Key::from_parts(["a"]);
        let c = [Charge { rule: &r, key: &k }];
        cache.learn(&c, 4, &denied(Nanos::from_secs(30)), Instant::now());
        assert!(cache.answer(&c, 1).is_none(), "a denial of cost 4");
        cache.learn(&c, 1, &denied(Nanos::MAX), Instant::now());
        assert!(cache.answer(&c, 1).is_none(), "a denial that never clears");
        let shadow = rule(Mode::Shadow);
        let s = [Charge {
            rule: &shadow,
            key: &k,
        }];
        let mut d = denied(Nanos::from_secs(30));
        d.rules[0].outcome = Outcome::ShadowDenied;
        cache.learn(&s, 1, &d, Instant::now());
        assert!(cache.answer(&s, 1).is_none(), "a shadow rule");
        assert!(OverLimit::new(0).is_none());
    }

    #[test]
    fn a_flood_of_keys_stays_within_the_table() {
        let cache = OverLimit::new(64).unwrap();
        let r = rule(Mode::Hard);
        for i in 0..10_000u32 {
            let name = i.to_string();
            let k = Key::from_parts([name.as_str()]);
            let c = [Charge { rule: &r, key: &k }];
            cache.learn(&c, 1, &denied(Nanos::from_secs(30)), Instant::now());
        }
        assert_eq!(cache.len(), 64);
        let live = (0..10_000u32)
            .filter(|i| {
                let name = i.to_string();
                let k = Key::from_parts([name.as_str()]);
                cache.answer(&[Charge { rule: &r, key: &k }], 1).is_some()
            })
            .count();
        assert!(live <= 64, "{live}");
    }
}
