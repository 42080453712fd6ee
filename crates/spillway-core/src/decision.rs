//! Turning per-limit verdicts into one decision, with modes and all-or-none charging.

use crate::algo::{Limit, Verdict};
use crate::rule::{Mode, Rule};
use crate::time::Nanos;

/// What happened to a request, as reported and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Every limit admitted it.
    Allowed,
    /// A hard or soft limit denied it.
    Denied,
    /// A shadow rule would have denied it; it was admitted.
    ShadowDenied,
    /// A soft rule admitted it above the limit, within the tolerance.
    SoftExceeded,
    /// An elastic rule admitted it above the plain limit, within the
    /// allowance the service's health gives.
    ElasticAdmitted,
}

impl Outcome {
    /// The label used in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::SoftExceeded => "soft_exceeded",
            Outcome::ElasticAdmitted => "elastic_admitted",
        }
    }
}

/// The result of one rule for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleDecision {
    /// Index of the rule in the list passed to [`decide`].
    pub rule: usize,
    /// Index of the limit reported (the one closest to denying, or the denying one).
    pub limit: usize,
    /// That limit's verdict, as the base (not soft-raised) limit sees it,
    /// except for a soft denial, which reports the raised limit.
    pub verdict: Verdict,
    /// What the rule did.
    pub outcome: Outcome,
}

impl RuleDecision {
    /// How long the client should wait before asking again, in whole
    /// milliseconds rounded up, as every way in writes it (JSON
    /// `retry_after_ms`, simulate's decisions): 0 when allowed, and
    /// `u64::MAX / 1_000_000` for a cost no limit can ever admit.
    pub fn retry_ms(&self) -> u64 {
        if self.verdict.allowed {
            0
        } else if self.verdict.retry_after.is_never() {
            u64::MAX / 1_000_000
        } else {
            self.verdict.retry_after.as_millis_ceil()
        }
    }
}

/// The per-rule results of a [`Decision`].
pub type RuleDecisions = smallvec::SmallVec<[RuleDecision; 1]>;

/// The decision for a request over all the rules that apply to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may go through.
    pub allowed: bool,
    /// How long it must wait first (a shaper's queue); zero otherwise.
    pub wait: Nanos,
    /// The deciding rule: the first denying one, else the one closest to denying.
    /// `None` when no rule applied.
    pub deciding: Option<RuleDecision>,
    /// Every applied rule's result, in the order given (held inline for
    /// one rule, the common case: no allocation per decision).
    pub rules: RuleDecisions,
}

impl Decision {
    /// The decision when no rule applies: allowed, no limit.
    pub fn unlimited() -> Decision {
        Decision {
            allowed: true,
            wait: Nanos::ZERO,
            deciding: None,
            rules: RuleDecisions::new(),
        }
    }

    /// The overall outcome: denied if denied; else shadow-denied,
    /// soft-exceeded or elastic-admitted if any rule says so (in that
    /// order); else allowed.
    pub fn outcome(&self) -> Outcome {
        if !self.allowed {
            return Outcome::Denied;
        }
        for o in [
            Outcome::ShadowDenied,
            Outcome::SoftExceeded,
            Outcome::ElasticAdmitted,
        ] {
            if self.rules.iter().any(|r| r.outcome == o) {
                return o;
            }
        }
        Outcome::Allowed
    }
}

/// Access to the states of the limits being decided, held atomically by a store.
///
/// `charge` is an index into the rule list given to [`decide`], `limit` an
/// index into that rule's limits.
pub trait StateView {
    /// The verdict of `limit` for the request, without changing state.
    fn verdict(
        &mut self,
        charge: usize,
        index: usize,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Verdict;
    /// Charges the request to `limit`: applies the transition `verdict`
    /// computed for the same limit, state and time (only called when it admitted).
    fn commit(&mut self, charge: usize, index: usize, limit: &Limit, now: Nanos, cost: u64);
    /// Charges `cost` to `limit` after the fact, whatever its state (see
    /// [`charge`]), and returns a check of cost 0 on the state after it.
    fn charge(
        &mut self,
        charge: usize,
        index: usize,
        limit: &Limit,
        now: Nanos,
        cost: u64,
    ) -> Verdict;
}

/// Decides a request of `cost` at `now` against `rules`, charging all of them
/// or none.
///
/// The request is admitted only if every non-shadow rule admits it; then every
/// hard and soft rule is charged, and every shadow rule that would have
/// admitted it. A denied request is charged to no rule.
///
/// A cost of 0 is a check: every rule says whether the key is over its
/// limit, and nothing is charged.
pub fn decide<V: StateView>(rules: &[&Rule], view: &mut V, now: Nanos, cost: u64) -> Decision {
    decide_then(rules, view, now, cost, cost > 0)
}

/// Charges `cost` after the fact (a cost known only once the request was
/// served, such as the tokens an answer used) to every limit of every rule,
/// shadow rules too, whatever their state: a charge is never refused, and
/// one past a limit puts the key in debt, so later checks are denied until
/// the algorithm has paid it back (see the algorithms' `charge`).
///
/// The decision is then a check (cost 0) of the states after the charge:
/// `allowed` is false if a hard or soft rule's key is now over its limit.
pub fn charge<V: StateView>(rules: &[&Rule], view: &mut V, now: Nanos, cost: u64) -> Decision {
    for (ri, rule) in rules.iter().enumerate() {
        for (li, limit) in rule.enforced_limits().iter().enumerate() {
            let _ = view.charge(ri, li, limit, now, cost);
        }
    }
    decide_then(rules, view, now, 0, false)
}

/// [`decide`], charging the admitted request only if `commit`.
fn decide_then<V: StateView>(
    rules: &[&Rule],
    view: &mut V,
    now: Nanos,
    cost: u64,
    commit: bool,
) -> Decision {
    let mut decisions = RuleDecisions::with_capacity(rules.len());
    // Which rules to charge: a bit each (a Vec only past 64 rules).
    let mut charge_bits = 0u64;
    let mut charge_more = Vec::new();
    let mut allowed = true;
    let mut wait = Nanos::ZERO;
    // The limits each rule was decided under: an elastic rule's move with
    // the service's health, and a commit must charge the ones that admitted.
    let mut enforced: smallvec::SmallVec<[&[Limit]; 2]> = smallvec::SmallVec::new();
    for (ri, rule) in rules.iter().enumerate() {
        let (rd, charged, admits, limits) = decide_rule(ri, rule, view, now, cost);
        enforced.push(limits);
        if ri < 64 {
            charge_bits |= u64::from(charged) << ri;
        } else {
            charge_more.push(charged);
        }
        allowed &= admits;
        wait = wait.max(rd.verdict.wait);
        decisions.push(rd);
    }
    if allowed && commit {
        for (ri, limits) in enforced.iter().enumerate() {
            let charged = if ri < 64 {
                charge_bits >> ri & 1 == 1
            } else {
                charge_more[ri - 64]
            };
            if charged {
                for (li, limit) in limits.iter().enumerate() {
                    view.commit(ri, li, limit, now, cost);
                }
            }
        }
    } else if !allowed {
        wait = Nanos::ZERO;
    }
    let deciding = pick(&decisions, allowed);
    Decision {
        allowed,
        wait,
        deciding,
        rules: decisions,
    }
}

/// One rule's result, whether it would be charged, whether it lets the
/// request through, and the limits it was decided under (read once).
fn decide_rule<'r, V: StateView>(
    ri: usize,
    rule: &'r Rule,
    view: &mut V,
    now: Nanos,
    cost: u64,
) -> (RuleDecision, bool, bool, &'r [Limit]) {
    let mut hard_ok = true;
    let mut worst: Option<(usize, Verdict)> = None;
    let mut wait = Nanos::ZERO;
    let base = rule.limits();
    let enforced = rule.enforced_limits();
    let soft = !std::ptr::eq(base, enforced);
    let mut enforced_ok = true;
    let mut enforced_deny: Option<(usize, Verdict)> = None;
    for (li, limit) in enforced.iter().enumerate() {
        let v = view.verdict(ri, li, limit, now, cost);
        wait = wait.max(v.wait);
        if !v.allowed && enforced_deny.is_none() {
            enforced_deny = Some((li, v));
        }
        enforced_ok &= v.allowed;
        // The base verdict: for a soft rule evaluate the base limit on the
        // same state (the view's state for index li is unchanged so far).
        let bv = if soft {
            view.verdict(ri, li, &base[li], now, cost)
        } else {
            v
        };
        hard_ok &= bv.allowed;
        if closer(&bv, worst.as_ref().map(|w| &w.1)) {
            worst = Some((li, bv));
        }
    }
    let (li, mut verdict) = worst.unwrap_or((0, Verdict::admit(0, 0, Nanos::ZERO)));
    let (outcome, charged, admits) = match rule.mode() {
        Mode::Hard => (
            if hard_ok {
                Outcome::Allowed
            } else {
                Outcome::Denied
            },
            hard_ok,
            hard_ok,
        ),
        Mode::Soft { .. } | Mode::Elastic(_) => {
            if !enforced_ok {
                (Outcome::Denied, false, false)
            } else if !hard_ok {
                let above = if matches!(rule.mode(), Mode::Elastic(_)) {
                    Outcome::ElasticAdmitted
                } else {
                    Outcome::SoftExceeded
                };
                (above, true, true)
            } else {
                (Outcome::Allowed, true, true)
            }
        }
        Mode::Shadow => (
            if hard_ok {
                Outcome::Allowed
            } else {
                Outcome::ShadowDenied
            },
            hard_ok,
            true,
        ),
    };
    let li = match (outcome, enforced_deny) {
        (Outcome::Denied, Some((dli, dv))) if soft => {
            verdict = dv;
            dli
        }
        _ => li,
    };
    verdict.wait = if admits { wait } else { Nanos::ZERO };
    (
        RuleDecision {
            rule: ri,
            limit: li,
            verdict,
            outcome,
        },
        charged,
        admits,
        enforced,
    )
}

/// True if `v` is closer to denying than `than`: denied beats admitted, then
/// fewer remaining, then the longer wait to recover.
fn closer(v: &Verdict, than: Option<&Verdict>) -> bool {
    let Some(t) = than else { return true };
    if v.allowed != t.allowed {
        return !v.allowed;
    }
    if !v.allowed {
        return v.retry_after > t.retry_after;
    }
    (v.remaining, std::cmp::Reverse(v.reset)) < (t.remaining, std::cmp::Reverse(t.reset))
}

fn pick(decisions: &[RuleDecision], allowed: bool) -> Option<RuleDecision> {
    if !allowed {
        // The denying rule that keeps the client out longest decides: a retry
        // before its retry_after would be denied anyway.
        return decisions
            .iter()
            .filter(|d| d.outcome == Outcome::Denied)
            .max_by_key(|d| d.verdict.retry_after)
            .copied();
    }
    // Shadow rules never speak for an admitted request unless they are all
    // there is: their would-be denials are for the operator, not the client.
    let shadow = |d: &RuleDecision| d.outcome == Outcome::ShadowDenied;
    let mut best: Option<&RuleDecision> = None;
    for d in decisions {
        let better = match best {
            None => true,
            Some(b) if shadow(b) != shadow(d) => shadow(b),
            Some(b) => closer(&d.verdict, Some(&b.verdict)),
        };
        if better {
            best = Some(d);
        }
    }
    best.copied()
}
