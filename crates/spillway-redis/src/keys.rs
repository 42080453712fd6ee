//! Key names and the script's arguments.

use std::fmt::Write;

use redis::{Cmd, Script};
use spillway_core::{Limit, Mode};
use spillway_store::Charge;

/// The tag of a charge: 64 bits of xxh3 (seed 0, so every instance computes
/// the same) over the rule's fingerprint and the client's values. 64 bits, as
/// in the memory store: two clients share a counter with odds of about 1 in
/// 2^64 per pair, and whatever a client sends, its keys have a fixed size.
pub(crate) fn tag(charge: &Charge<'_>) -> u64 {
    charge.key.hash(charge.rule.fingerprint(), 0)
}

/// The bucket of a tag: its top bits scaled to `buckets`.
fn bucket(tag: u64, buckets: u32) -> u64 {
    ((u128::from(tag) * u128::from(buckets)) >> 64) as u64
}

/// `<prefix>{<bucket>}`: the hash holding the counter states of the tags in
/// the bucket. The braces are the cluster hash tag: a rule's limits share
/// one slot.
pub(crate) fn bucket_key(prefix: &str, tag: u64, buckets: u32) -> String {
    let mut k = String::with_capacity(prefix.len() + 8);
    let _ = write!(k, "{prefix}{{{:x}}}", bucket(tag, buckets));
    k
}

/// `<prefix>{<bucket>}<tag>.<limit>`: a sliding log's list, in its bucket's
/// slot.
pub(crate) fn log_key(prefix: &str, tag: u64, buckets: u32, index: usize) -> String {
    let mut k = String::with_capacity(prefix.len() + 32);
    let _ = write!(
        k,
        "{prefix}{{{:x}}}{tag:016x}.{index}",
        bucket(tag, buckets)
    );
    k
}

/// The field of limit `index` in its bucket: the tag's 8 bytes, then the
/// index in decimal (binary keeps the field, and so every state, 8 bytes
/// shorter than hex).
pub(crate) fn field(tag: u64, index: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(10);
    f.extend_from_slice(&tag.to_be_bytes());
    f.extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
    f
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

/// One decision's share of a script call: its keys, then its arguments
/// (see the contract at the top of `lua/decide.lua`).
#[derive(Debug)]
pub(crate) struct Part {
    /// The keys, then the arguments, as a command's argument list (one
    /// buffer, not one allocation per argument).
    args: Cmd,
    /// How many of `args` are keys: one per limit.
    nkeys: usize,
    /// How many numbers the script answers for this decision.
    pub(crate) reply_len: usize,
}

/// The part of a script call deciding `charges`.
pub(crate) fn part(
    prefix: &str,
    buckets: u32,
    charges: &[Charge<'_>],
    cost: u64,
    now_us: u64,
    dry: bool,
) -> Part {
    let tags: Vec<u64> = charges.iter().map(tag).collect();
    let nkeys: usize = charges.iter().map(|c| c.rule.limits().len()).sum();
    let mut cmd = Cmd::with_capacity(4 + 8 * nkeys, 64 + 96 * nkeys);
    for (c, &t) in charges.iter().zip(&tags) {
        let bucket = bucket_key(prefix, t, buckets);
        for (i, b) in c.rule.limits().iter().enumerate() {
            if matches!(b, Limit::SlidingLog(_)) {
                cmd.arg(log_key(prefix, t, buckets, i));
            } else {
                cmd.arg(&bucket);
            }
        }
    }
    cmd.arg(now_us)
        .arg(cost)
        .arg(u8::from(dry))
        .arg(charges.len());
    for (c, &t) in charges.iter().zip(&tags) {
        let mode = match c.rule.mode() {
            Mode::Hard => 0,
            Mode::Soft { .. } => 1,
            Mode::Shadow => 2,
        };
        let base = c.rule.limits();
        let enforced = c.rule.enforced_limits();
        cmd.arg(mode).arg(base.len());
        for (i, (b, e)) in base.iter().zip(enforced).enumerate() {
            for p in params(b, e) {
                cmd.arg(p);
            }
            if matches!(b, Limit::SlidingLog(_)) {
                cmd.arg("");
            } else {
                cmd.arg(field(t, i));
            }
        }
    }
    Part {
        args: cmd,
        nkeys,
        reply_len: crate::reply::reply_len(charges),
    }
}

/// The script call deciding `parts` one after the other: `EVALSHA sha
/// numkeys KEYS... ARGV...`, built into one command buffer (a
/// `ScriptInvocation` keeps every argument in its own allocation and copies
/// them all again on sending).
pub(crate) fn command<'a>(script: &Script, parts: impl Iterator<Item = &'a Part> + Clone) -> Cmd {
    let (mut nargs, mut nkeys, mut ndecisions) = (0, 0, 0);
    for p in parts.clone() {
        nargs += p.args.args_iter().len();
        nkeys += p.nkeys;
        ndecisions += 1;
    }
    let mut cmd = Cmd::with_capacity(4 + nargs, 64 + 96 * nargs);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(nkeys);
    for p in parts.clone() {
        for a in p.args.args_iter().take(p.nkeys) {
            push(&mut cmd, a);
        }
    }
    cmd.arg(ndecisions);
    for p in parts {
        for a in p.args.args_iter().skip(p.nkeys) {
            push(&mut cmd, a);
        }
    }
    cmd
}

fn push(cmd: &mut Cmd, a: redis::Arg<&[u8]>) {
    if let redis::Arg::Simple(bytes) = a {
        cmd.arg(bytes);
    }
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

/// The cluster slot of a charge's keys (they all share its bucket's hash tag).
fn slot(charge: &Charge<'_>, buckets: u32) -> u16 {
    let hash_tag = format!("{:x}", bucket(tag(charge), buckets));
    crc16(hash_tag.as_bytes()) % 16384
}

/// Charges grouped by slot, groups in order of first appearance.
pub(crate) fn slot_groups(buckets: u32, charges: &[Charge<'_>]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, c) in charges.iter().enumerate() {
        let s = slot(c, buckets);
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
