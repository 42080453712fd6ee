//! Turning the script's reply into a core `Decision`.
//!
//! The script computed every verdict and charged what core's rules say to
//! charge; replaying its verdicts through `spillway_core::decide` yields the
//! same decision the in-memory store would build, from one shared piece of
//! mode logic.

use smallvec::SmallVec;
use spillway_core::{Decision, Limit, Nanos, StateView, Verdict, decide};
use spillway_store::Charge;

/// Numbers per verdict in the reply: allowed, remaining, reset, retry
/// after, wait (the limit's size is the caller's).
const PER_VERDICT: usize = 5;

/// Whether the script answers two verdicts per limit of `rule` (under the
/// raised and the base size: a soft or elastic rule) or one. By the mode
/// alone, as [`keys`](crate::keys) tells the script: an elastic rule's
/// raised limits may be its plain ones (health unknown) or change between
/// the call and its answer, but the reply's shape never does.
fn two_verdicts(rule: &spillway_core::Rule) -> bool {
    matches!(
        rule.mode(),
        spillway_core::Mode::Soft { .. } | spillway_core::Mode::Elastic(_)
    )
}

/// How many numbers the script answers for one charge.
fn charge_len(c: &Charge<'_>) -> usize {
    let per_limit = if two_verdicts(c.rule) { 2 } else { 1 } * PER_VERDICT;
    c.rule.limits().len() * per_limit
}

/// How many numbers the script answers for a decision over `charges`.
pub(crate) fn reply_len(charges: &[Charge<'_>]) -> usize {
    charges.iter().map(charge_len).sum()
}

fn verdict(v: &[i64], size: u64) -> Verdict {
    let us = |x: i64| Nanos(u64::try_from(x).unwrap_or(0).saturating_mul(1000));
    Verdict {
        allowed: v[0] == 1,
        limit: size,
        remaining: u64::try_from(v[1]).unwrap_or(0),
        reset: us(v[2]),
        retry_after: if v[3] < 0 { Nanos::MAX } else { us(v[3]) },
        wait: us(v[4]),
    }
}

/// The verdict of each limit of `charge`'s rule under its enforced size
/// (a soft rule's raised one), in order, from the charge's numbers.
pub(crate) fn enforced_verdicts(charge: &Charge<'_>, numbers: &[i64]) -> Vec<Verdict> {
    let per_limit = if two_verdicts(charge.rule) { 2 } else { 1 } * PER_VERDICT;
    charge
        .rule
        .enforced_limits()
        .iter()
        .zip(numbers.chunks_exact(per_limit))
        .map(|(limit, v)| verdict(v, limit.size()))
        .collect()
}

/// Each charge's numbers in a reply covering `charges` (empty where the
/// reply is short).
pub(crate) fn split<'o>(charges: &[Charge<'_>], out: &'o [i64]) -> SmallVec<[&'o [i64]; 1]> {
    let mut at = 0;
    charges
        .iter()
        .map(|c| {
            let len = charge_len(c);
            let part = out.get(at..at + len).unwrap_or_default();
            at += len;
            part
        })
        .collect()
}

struct Replay<'a> {
    charges: &'a [Charge<'a>],
    parts: &'a [&'a [i64]],
}

impl StateView for Replay<'_> {
    fn verdict(&mut self, charge: usize, index: usize, limit: &Limit, _: Nanos, _: u64) -> Verdict {
        let rule = self.charges[charge].rule;
        let at = if two_verdicts(rule) {
            let base = std::ptr::eq(limit, &rule.limits()[index]);
            index * 2 * PER_VERDICT + if base { PER_VERDICT } else { 0 }
        } else {
            index * PER_VERDICT
        };
        match self.parts[charge].get(at..at + PER_VERDICT) {
            Some(v) => verdict(v, limit.size()),
            // A short reply: deny rather than guess.
            None => Verdict {
                allowed: false,
                limit: limit.size(),
                remaining: 0,
                reset: Nanos::ZERO,
                retry_after: Nanos::from_secs(1),
                wait: Nanos::ZERO,
            },
        }
    }

    fn commit(&mut self, _: usize, _: usize, _: &Limit, _: Nanos, _: u64) {}

    /// The script charged already; its verdicts are the checks after it.
    fn charge(
        &mut self,
        charge: usize,
        index: usize,
        limit: &Limit,
        now: Nanos,
        _: u64,
    ) -> Verdict {
        self.verdict(charge, index, limit, now, 0)
    }
}

/// The decision from one reply covering every charge.
pub(crate) fn decision(charges: &[Charge<'_>], out: &[i64], cost: u64) -> Decision {
    decision_from_parts(charges, &split(charges, out), cost)
}

/// The decision from each charge's own numbers.
pub(crate) fn decision_from_parts(charges: &[Charge<'_>], parts: &[&[i64]], cost: u64) -> Decision {
    let rules: SmallVec<[&spillway_core::Rule; 1]> = charges.iter().map(|c| c.rule).collect();
    let mut view = Replay { charges, parts };
    decide(&rules, &mut view, Nanos::ZERO, cost)
}

/// The decision after a charge (the script's charge mode, whose verdicts
/// are checks of cost 0 after it), from each charge's own numbers.
pub(crate) fn charged_from_parts(charges: &[Charge<'_>], parts: &[&[i64]], cost: u64) -> Decision {
    let rules: SmallVec<[&spillway_core::Rule; 1]> = charges.iter().map(|c| c.rule).collect();
    let mut view = Replay { charges, parts };
    spillway_core::charge(&rules, &mut view, Nanos::ZERO, cost)
}
