//! Turning the script's reply into a core `Decision`.
//!
//! The script computed every verdict and charged what core's rules say to
//! charge; replaying its verdicts through `spillway_core::decide` yields the
//! same decision the in-memory store would build, from one shared piece of
//! mode logic.

use spillway_core::{Decision, Limit, Nanos, StateView, Verdict, decide};
use spillway_store::Charge;

/// Numbers per limit in the reply: a verdict under the enforced size, then
/// one under the base size.
pub(crate) const PER_LIMIT: usize = 12;

fn verdict(v: &[i64]) -> Verdict {
    let us = |x: i64| Nanos(u64::try_from(x).unwrap_or(0).saturating_mul(1000));
    Verdict {
        allowed: v[0] == 1,
        limit: u64::try_from(v[1]).unwrap_or(0),
        remaining: u64::try_from(v[2]).unwrap_or(0),
        reset: us(v[3]),
        retry_after: if v[4] < 0 { Nanos::MAX } else { us(v[4]) },
        wait: us(v[5]),
    }
}

/// Charge `j`'s numbers in a reply for `charges` (skipping the leading `now`).
pub(crate) fn slice_for(charges: &[Charge<'_>], out: &[i64], j: usize) -> Vec<i64> {
    let start = 1 + charges[..j]
        .iter()
        .map(|c| c.rule.limits().len() * PER_LIMIT)
        .sum::<usize>();
    let len = charges[j].rule.limits().len() * PER_LIMIT;
    out.get(start..start + len)
        .map(<[i64]>::to_vec)
        .unwrap_or_default()
}

struct Replay<'a> {
    charges: &'a [Charge<'a>],
    parts: &'a [Vec<i64>],
}

impl StateView for Replay<'_> {
    fn verdict(&mut self, charge: usize, index: usize, limit: &Limit, _: Nanos, _: u64) -> Verdict {
        let base = std::ptr::eq(limit, &self.charges[charge].rule.limits()[index]);
        let at = index * PER_LIMIT + if base { 6 } else { 0 };
        match self.parts[charge].get(at..at + 6) {
            Some(v) => verdict(v),
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
}

/// The decision from one reply covering every charge.
pub(crate) fn decision(charges: &[Charge<'_>], out: &[i64], cost: u64) -> Decision {
    let parts: Vec<Vec<i64>> = (0..charges.len())
        .map(|j| slice_for(charges, out, j))
        .collect();
    decision_from_parts(charges, &parts, cost)
}

/// The decision from each charge's own numbers.
pub(crate) fn decision_from_parts(
    charges: &[Charge<'_>],
    parts: &[Vec<i64>],
    cost: u64,
) -> Decision {
    let rules: Vec<&spillway_core::Rule> = charges.iter().map(|c| c.rule).collect();
    let mut view = Replay { charges, parts };
    decide(&rules, &mut view, Nanos::ZERO, cost)
}
