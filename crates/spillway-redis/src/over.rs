//! The over-limit cache: keys Redis said are over their limit, answered
//! here until they may pass again, without a round trip (as
//! envoyproxy/ratelimit's `LOCAL_CACHE_SIZE_IN_BYTES` does).
//!
//! Under attack or a retry storm most calls hit keys already over their
//! limit, and each costs a Redis round trip that can only say no (and
//! charges nothing: a denied request is not charged, so answering it here
//! keeps the decision all-or-none). The cache remembers, per rule, limit
//! and key, the local instant before which Redis would refuse it, and
//! refuses such requests itself until then.
//!
//! - **Never longer than Redis would.** The instant is the time the call
//!   was *sent* (before it waited in the batcher's queue) plus the
//!   `retry_after` Redis answered. Redis decided after the call was sent,
//!   so its own instant is later, never earlier: the cache may let a
//!   request reach Redis early by up to the round trip (Redis refuses it
//!   again), and never refuses one Redis would admit. Only this
//!   process's monotonic clock enters, so the skew of the instances' (or
//!   Redis's) clocks does not. This rests on two facts: `retry_after` is
//!   a time before which the same request is refused anyway, and nothing
//!   but time makes a key less over (other requests and charges only add
//!   to it; a sync refund gives units back, and drops what the cache
//!   knows of its keys once Redis has applied it: a refusal learned from
//!   a call that crossed the refund may still outlive it). A state Redis
//!   lost (a flush, a failover to a replica behind) may pass earlier
//!   than the cache says, for at most that `retry_after`.
//! - **What a denial says.** A denial of a request of cost 1 says that
//!   any request of cost 1 or more is refused until then, and nothing of
//!   a check of cost 0 (an exhausted key that owes nothing passes a check).
//!   A denial of a check of cost 0, or the check that answers a charge
//!   after the fact, says the key owes (it is in debt): every request,
//!   checks included, is refused until then. A denial of a larger cost
//!   says nothing of a smaller one and is not learned.
//! - **What it answers.** Requests (cost 1 or more, or checks of keys in
//!   debt) whose hard or soft rules include a cached key. Charges after
//!   the fact always go to Redis (they are never refused), and shadow
//!   rules are neither learned nor answered. A decision answered here
//!   lists the one refusing rule (a shadow rule's would-be outcome and the
//!   other rules' verdicts are unknown), as the limiter does for a cost
//!   no limit could admit.
//! - **Bounded.** A fixed table of `entries` slots (rounded up to a power
//!   of two, at least two), each a tag and two instants under its own
//!   small lock. A tag may take either slot of one pair: a new key takes
//!   the one whose entry ends first (an ended one, if any), so two keys
//!   that hash alike do not evict each other (no allocation, no sweep;
//!   an entry past its instant is simply ignored, then replaced).
//!
//! The tag covers the rule's fingerprint (its name, key and limits), the
//! limit and its enforced size: a rule changed on reload, or made soft
//! with another tolerance, does not use the old entries. One made shadow
//! is no longer answered.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_core::{Decision, Mode, Nanos, Outcome, RuleDecision, RuleDecisions, Verdict};
use spillway_store::Charge;

/// The default number of slots (32 bytes each: 512 KiB).
pub const DEFAULT_ENTRIES: usize = 16_384;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The rule, limit and key (0: empty).
    tag: u64,
    /// Nanoseconds after `OverLimit::base` before which a request of cost
    /// 1 or more is refused.
    requests: u64,
    /// Before which everything is refused, checks included (the key owes).
    checks: u64,
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
        let n = entries
            .max(2)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1));
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

    /// The tag of limit `limit` of a charge's rule for its key.
    fn tag(&self, c: &Charge<'_>, limit: usize) -> u64 {
        let size = c.rule.enforced_limits().get(limit).map_or(0, |l| l.size());
        let h = c
            .key
            .hash(c.rule.fingerprint() ^ size.rotate_left(17), self.seed);
        let t = h ^ (limit as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        if t == 0 { 1 } else { t }
    }

    /// The two slots a tag may take: a pair, so two keys that hash
    /// alike (about one in twenty of 900 keys in 16,384 single slots) do
    /// not keep evicting each other.
    fn pair(&self, tag: u64) -> [usize; 2] {
        let i = (tag as usize) & (self.slots.len() - 1) & !1;
        [i, (i + 1) & (self.slots.len() - 1)]
    }

    fn slot(&self, i: usize) -> std::sync::MutexGuard<'_, Slot> {
        self.slots[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A denial for a request of `cost` (0: a check) over `charges`, if
    /// one of their keys is known to refuse it now: the key refusing
    /// longest decides.
    pub(crate) fn answer(&self, charges: &[Charge<'_>], cost: u64) -> Option<Decision> {
        let now = self.nanos(Instant::now());
        let mut found: Option<(usize, usize, u64)> = None;
        for (j, c) in charges.iter().enumerate() {
            if c.rule.mode() == Mode::Shadow {
                continue;
            }
            for li in 0..c.rule.enforced_limits().len() {
                let tag = self.tag(c, li);
                for i in self.pair(tag) {
                    let s = *self.slot(i);
                    if s.tag != tag {
                        continue;
                    }
                    let until = if cost == 0 {
                        s.checks
                    } else {
                        s.requests.max(s.checks)
                    };
                    if until > now && found.is_none_or(|(_, _, u)| until > u) {
                        found = Some((j, li, until));
                    }
                }
            }
        }
        let (j, li, until) = found?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        let wait = Nanos(until - now);
        let rd = RuleDecision {
            rule: j,
            limit: li,
            verdict: Verdict {
                allowed: false,
                limit: charges[j].rule.enforced_limits()[li].size(),
                remaining: 0,
                reset: wait,
                retry_after: wait,
                wait: Nanos::ZERO,
            },
            outcome: Outcome::Denied,
        };
        let mut rules = RuleDecisions::new();
        rules.push(rd);
        Some(Decision {
            allowed: false,
            wait: Nanos::ZERO,
            deciding: Some(rd),
            rules,
        })
    }

    /// Remembers the keys `d` says are over their limit: `d` is Redis's
    /// answer to a request of `cost` over `charges` (or, if `after`, to a
    /// charge after the fact: its verdicts are checks of cost 0), sent at
    /// `sent`.
    pub(crate) fn learn(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        after: bool,
        d: &Decision,
        sent: Instant,
    ) {
        let check = after || cost == 0;
        if d.allowed || !(check || cost == 1) {
            return;
        }
        for rd in d.rules.iter().filter(|r| r.outcome == Outcome::Denied) {
            let (Some(c), v) = (charges.get(rd.rule), rd.verdict) else {
                continue;
            };
            if c.rule.mode() == Mode::Shadow
                || v.retry_after.is_never()
                || v.retry_after == Nanos::ZERO
            {
                continue;
            }
            let Some(until) = sent.checked_add(Duration::from_nanos(v.retry_after.as_u64())) else {
                continue;
            };
            let until = self.nanos(until);
            let tag = self.tag(c, rd.limit);
            // The slot of the pair that holds the tag, else the one whose
            // entry ends first (an ended or empty one ended at 0). Two
            // learners racing may both take a slot: each holds an instant
            // no later than Redis's, and the lookup takes the later.
            let [a, b] = self.pair(tag);
            let (sa, sb) = (*self.slot(a), *self.slot(b));
            let ends = |s: &Slot| s.requests.max(s.checks);
            let i = if sa.tag == tag {
                a
            } else if sb.tag == tag || ends(&sb) < ends(&sa) {
                b
            } else {
                a
            };
            let mut s = self.slot(i);
            if s.tag != tag {
                *s = Slot {
                    tag,
                    ..Slot::default()
                };
            }
            // Both instants only ever come from refusals, each no later
            // than Redis's own: the later one is still no later.
            s.requests = s.requests.max(until);
            if check {
                s.checks = s.checks.max(until);
            }
        }
    }

    /// Forgets what is known of every limit of `charges`' keys: they were
    /// reset (made fresh in Redis), so a refusal learned before is wrong.
    /// The next decision on them goes to Redis. (Other instances' caches
    /// still hold their own refusals, each for at most the `retry_after`
    /// Redis gave them.)
    pub(crate) fn forget(&self, charges: &[Charge<'_>]) {
        for c in charges {
            for li in 0..c.rule.enforced_limits().len() {
                let tag = self.tag(c, li);
                for i in self.pair(tag) {
                    let mut s = self.slot(i);
                    if s.tag == tag {
                        *s = Slot::default();
                    }
                }
            }
        }
    }

    /// Forgets everything: units were given back to some key (a sync
    /// refund), the one thing besides time that makes a key less over, so
    /// a refusal learned before may now be too long.
    pub(crate) fn clear(&self) {
        for i in 0..self.slots.len() {
            *self.slot(i) = Slot::default();
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
        let sent = Instant::now();
        cache.learn(&ca, 1, false, &denied(Nanos::from_secs(30)), sent);
        let d = cache.answer(&ca, 1).expect("cached");
        assert!(!d.allowed);
        assert_eq!(d.rules.len(), 1);
        assert_eq!(d.rules[0].outcome, Outcome::Denied);
        assert_eq!(d.rules[0].verdict.limit, 5);
        // Counted from when the call was sent: no longer than Redis said.
        let left = d.rules[0].verdict.retry_after;
        assert!(left <= Nanos::from_secs(30), "{left:?}");
        assert!(
            cache.answer(&ca, 3).is_some(),
            "a larger cost is refused too"
        );
        assert!(
            cache.answer(&ca, 0).is_none(),
            "a check of an exhausted key goes to redis"
        );
        assert!(cache.answer(&cb, 1).is_none(), "another key is not");
        assert_eq!(cache.hits(), 2);
        // Sent 31 s ago with 30 s to wait: no longer over.
        let past = Instant::now() - Duration::from_secs(31);
        let other = [Charge { rule: &r, key: &b }];
        cache.learn(&other, 1, false, &denied(Nanos::from_secs(30)), past);
        assert!(cache.answer(&other, 1).is_none());
        // Sent 29 s ago with 30 s to wait: refused for at most a second more.
        let k = Key::from_parts(["c"]);
        let c = [Charge { rule: &r, key: &k }];
        let sent = Instant::now() - Duration::from_secs(29);
        cache.learn(&c, 1, false, &denied(Nanos::from_secs(30)), sent);
        let left = cache.answer(&c, 1).expect("still over").rules[0]
            .verdict
            .retry_after;
        assert!(left <= Nanos::from_secs(1), "{left:?}");
    }

    #[test]
    fn a_reset_key_is_forgotten_and_only_it() {
        let cache = OverLimit::new(64).unwrap();
        let r = rule(Mode::Hard);
        let (a, b) = (Key::from_parts(["a"]), Key::from_parts(["b"]));
        let ca = [Charge { rule: &r, key: &a }];
        let cb = [Charge { rule: &r, key: &b }];
        for c in [&ca, &cb] {
            cache.learn(c, 0, false, &denied(Nanos::from_secs(30)), Instant::now());
        }
        cache.forget(&ca);
        assert!(cache.answer(&ca, 1).is_none(), "forgotten");
        assert!(cache.answer(&ca, 0).is_none(), "checks too");
        assert!(cache.answer(&cb, 1).is_some(), "another key is kept");
        cache.forget(&ca);
    }

    #[test]
    fn a_key_in_debt_refuses_checks_too() {
        let cache = OverLimit::new(16).unwrap();
        let r = rule(Mode::Hard);
        let (a, b) = (Key::from_parts(["a"]), Key::from_parts(["b"]));
        let ca = [Charge { rule: &r, key: &a }];
        let cb = [Charge { rule: &r, key: &b }];
        // A check refused, and a charge whose check after it is refused.
        cache.learn(&ca, 0, false, &denied(Nanos::from_secs(30)), Instant::now());
        cache.learn(
            &cb,
            600,
            true,
            &denied(Nanos::from_secs(30)),
            Instant::now(),
        );
        for c in [&ca, &cb] {
            assert!(cache.answer(c, 0).is_some(), "a check");
            assert!(cache.answer(c, 1).is_some(), "a request");
        }
        // A later refusal of a request keeps the debt known.
        cache.learn(&ca, 1, false, &denied(Nanos::from_secs(40)), Instant::now());
        assert!(cache.answer(&ca, 0).is_some());
        let one = cache.answer(&ca, 1).unwrap().rules[0].verdict.retry_after;
        assert!(one > Nanos::from_secs(30), "{one:?}");
    }

    #[test]
    fn what_says_nothing_of_a_cost_of_one_is_not_learned() {
        let cache = OverLimit::new(16).unwrap();
        let r = rule(Mode::Hard);
        let k = Key::from_parts(["a"]);
        let c = [Charge { rule: &r, key: &k }];
        cache.learn(&c, 4, false, &denied(Nanos::from_secs(30)), Instant::now());
        assert!(cache.answer(&c, 1).is_none(), "a denial of cost 4");
        cache.learn(&c, 1, false, &denied(Nanos::MAX), Instant::now());
        assert!(cache.answer(&c, 1).is_none(), "a denial that never clears");
        let shadow = rule(Mode::Shadow);
        let s = [Charge {
            rule: &shadow,
            key: &k,
        }];
        let mut d = denied(Nanos::from_secs(30));
        d.rules[0].outcome = Outcome::ShadowDenied;
        cache.learn(&s, 1, false, &d, Instant::now());
        assert!(cache.answer(&s, 1).is_none(), "a shadow rule");
        // A rule made shadow on reload is no longer answered.
        cache.learn(&c, 1, false, &denied(Nanos::from_secs(30)), Instant::now());
        assert!(cache.answer(&c, 1).is_some());
        assert!(cache.answer(&s, 1).is_none(), "the same rule, shadow");
        // A soft tolerance changes the enforced size: another tag.
        let soft = rule(Mode::Soft { percent: 100 });
        let sc = [Charge {
            rule: &soft,
            key: &k,
        }];
        assert!(cache.answer(&sc, 1).is_none(), "the same rule, soft");
        assert!(OverLimit::new(0).is_none());
    }

    #[test]
    fn two_keys_that_hash_alike_share_a_pair() {
        // Two slots: every tag falls in the one pair.
        let cache = OverLimit::new(1).unwrap();
        assert_eq!(cache.len(), 2);
        let r = rule(Mode::Hard);
        let keys: Vec<Key<'_>> = ["a", "b", "c"]
            .into_iter()
            .map(|k| Key::from_parts([k]))
            .collect();
        let c = |i: usize| {
            [Charge {
                rule: &r,
                key: &keys[i],
            }]
        };
        let now = Instant::now();
        cache.learn(&c(0), 1, false, &denied(Nanos::from_secs(30)), now);
        cache.learn(&c(1), 1, false, &denied(Nanos::from_secs(20)), now);
        assert!(cache.answer(&c(0), 1).is_some());
        assert!(cache.answer(&c(1), 1).is_some());
        // A third takes the slot that ends first.
        cache.learn(&c(2), 1, false, &denied(Nanos::from_secs(10)), now);
        assert!(cache.answer(&c(0), 1).is_some());
        assert!(cache.answer(&c(1), 1).is_none());
        assert!(cache.answer(&c(2), 1).is_some());
        // Learning again about a held key updates its own slot.
        cache.learn(&c(2), 0, false, &denied(Nanos::from_secs(15)), now);
        assert!(cache.answer(&c(0), 1).is_some());
        assert!(cache.answer(&c(2), 0).is_some());
    }

    #[test]
    fn a_flood_of_keys_stays_within_the_table() {
        assert_eq!(std::mem::size_of::<Mutex<Slot>>(), 32, "as documented");
        let cache = OverLimit::new(64).unwrap();
        let r = rule(Mode::Hard);
        for i in 0..10_000u32 {
            let name = i.to_string();
            let k = Key::from_parts([name.as_str()]);
            let c = [Charge { rule: &r, key: &k }];
            cache.learn(&c, 1, false, &denied(Nanos::from_secs(30)), Instant::now());
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
        assert!(live > 0);
    }
}
