//! Key names and the script's arguments.

use std::fmt::Write;

use redis::{Script, ScriptInvocation};
use spillway_core::{Limit, Mode};
use spillway_store::Charge;

/// The hash tag of a charge: 64 bits of xxh3 (seed 0, so every instance
/// computes the same) over the rule's fingerprint and the client's values,
/// in hex. 64 bits, as in the memory store: two clients share a counter
/// with odds of about 1 in 2^64 per pair, and the key stays short (Redis
/// spends about 33 bytes more per key on a 128-bit tag).
pub(crate) fn tag(charge: &Charge<'_>) -> String {
    format!("{:016x}", charge.key.hash(charge.rule.fingerprint(), 0))
}

/// `<prefix>{<tag>}<index>`.
pub(crate) fn key(prefix: &str, charge: &Charge<'_>, index: usize) -> String {
    let mut k = String::with_capacity(prefix.len() + 24);
    let _ = write!(k, "{prefix}{{{}}}{index}", tag(charge));
    k
}

/// Microseconds, rounded up (never zero for a non-zero span).
fn us_up(ns: u64) -> u64 {
    ns.div_ceil(1000).max(1)
}

/// `(code, base size, enforced size, a, b)` of a limit, in microseconds.
fn params(base: &Limit, enforced: &Limit) -> [u64; 5] {
    let (code, a, b) = match base {
        Limit::TokenBucket(l) => (1, us_up(l.refill().interval()), 0),
        Limit::LeakyBucket(l) => (2, us_up(l.leak().interval()), 0),
        Limit::Shaper(l) => (3, us_up(l.leak().interval()), l.max_wait().as_u64() / 1000),
        Limit::FixedWindow(l) => (4, us_up(l.window().as_u64()), 0),
        Limit::SlidingLog(l) => (5, us_up(l.window().as_u64()), 0),
        Limit::SlidingCounter(l) => (6, us_up(l.window().as_u64()), 0),
        Limit::Gcra(l) => (7, us_up(l.rate().interval()), 0),
    };
    [code, base.size(), enforced.size(), a, b]
}

/// The script call for `charges`.
pub(crate) fn invocation<'s>(
    script: &'s Script,
    prefix: &str,
    charges: &[Charge<'_>],
    cost: u64,
    now_us: u64,
    dry: bool,
) -> ScriptInvocation<'s> {
    let mut inv = script.prepare_invoke();
    inv.arg(now_us)
        .arg(cost)
        .arg(u8::from(dry))
        .arg(charges.len());
    for c in charges {
        let mode = match c.rule.mode() {
            Mode::Hard => 0,
            Mode::Soft { .. } => 1,
            Mode::Shadow => 2,
        };
        let base = c.rule.limits();
        let enforced = c.rule.enforced_limits();
        inv.arg(mode).arg(base.len());
        let t = tag(c);
        for (i, (b, e)) in base.iter().zip(enforced).enumerate() {
            inv.key(format!("{prefix}{{{t}}}{i}"));
            for p in params(b, e) {
                inv.arg(p);
            }
        }
    }
    inv
}

/// CRC16 (XMODEM), as Redis Cluster hashes keys to its 16384 slots.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a charge's keys (they all share its hash tag).
pub(crate) fn slot(charge: &Charge<'_>) -> u16 {
    crc16(tag(charge).as_bytes()) % 16384
}

/// Charges grouped by slot, groups in order of first appearance.
pub(crate) fn slot_groups(_prefix: &str, charges: &[Charge<'_>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, c) in charges.iter().enumerate() {
        let s = slot(c);
        match groups.iter_mut().find(|(gs, _)| *gs == s) {
            Some((_, g)) => g.push(i),
            None => groups.push((s, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec_example() {
        // The Redis Cluster specification's check value for "123456789".
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }
}
