//! Key names and the script's arguments.

use std::fmt::Write as _;

use redis::{Cmd, Script};
use smallvec::SmallVec;

use crate::msgpack;
use spillway_core::{Limit, Mode};
use spillway_store::Charge;

/// The tag of a charge: 64 bits of xxh3 (seed 0, so every instance computes
/// the same) over the rule's fingerprint and the client's values. 64 bits, as
/// in the memory store: two clients share a counter with odds of about 1 in
/// 2^64 per pair, and whatever a client sends, its keys have a fixed size.
/// The Redis store names a charge's state by it (its bucket, its field), so
/// two charges with one tag share their state: a caller may key its own
/// records of Redis's states by it.
pub fn tag(charge: &Charge<'_>) -> u64 {
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

/// The sliding log's algorithm code.
const SLIDING_LOG: u64 = 5;

/// `(code, base size, enforced size, a, b, d)` of a limit, in
/// microseconds; `d` bounds what a charge after the fact leaves owing, as
/// the enforced limit's own `charge` does in the memory store: its
/// max_debt for a schedule, a leaky bucket or a sliding counter (whose
/// largest count the script derives from it and the time left in the
/// window, as `SlidingCounter::max_count_at` does), else 0.
fn params_of(base: &Limit, enforced: &Limit) -> [u64; 6] {
    let (code, a, b) = match base {
        Limit::TokenBucket(l) => (1, us_up(l.refill().interval()), 0),
        Limit::LeakyBucket(l) => (2, us_up(l.leak().interval()), 0),
        Limit::Shaper(l) => (3, us_up(l.leak().interval()), l.max_wait().as_u64() / 1000),
        Limit::FixedWindow(l) => (4, us_up(l.window().as_u64()), 0),
        Limit::SlidingLog(l) => (SLIDING_LOG, us_up(l.window().as_u64()), 0),
        Limit::SlidingCounter(l) => (6, us_up(l.window().as_u64()), 0),
        Limit::Gcra(l) => (7, us_up(l.rate().interval()), 0),
    };
    let d = match enforced {
        Limit::TokenBucket(_)
        | Limit::LeakyBucket(_)
        | Limit::Shaper(_)
        | Limit::Gcra(_)
        | Limit::SlidingCounter(_) => us_up(enforced.max_debt().as_u64()),
        Limit::FixedWindow(_) | Limit::SlidingLog(_) => 0,
    };
    [code, base.size(), enforced.size(), a, b, d]
}

/// One rule's share of a decision: its parameters and its client's tag.
#[derive(Debug)]
struct RulePart {
    /// Mode (0 hard, 1 soft, 2 shadow), number of limits, then per limit:
    /// code, base size, enforced size, a, b, d (see [`params_of`]).
    params: SmallVec<[u64; 8]>,
    tag: u64,
}

impl RulePart {
    fn limits(&self) -> impl Iterator<Item = &[u64]> {
        self.params[2..].chunks_exact(6)
    }
}

/// One decision's share of a script call (see the contract at the top of
/// `lua/decide.lua`), as plain values: the batcher writes the command.
#[derive(Debug)]
pub(crate) struct Part {
    now_us: u64,
    cost: u64,
    write: Write,
    rules: SmallVec<[RulePart; 1]>,
    /// How many numbers the script answers for this decision.
    pub(crate) reply_len: usize,
}

/// What a decision writes (the script's third number per decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// Charge the request if admitted: 0.
    IfAdmitted = 0,
    /// Decide only (a dry run, or a check of cost 0): 1.
    Dry = 1,
    /// Charge after the fact, whatever the state: 2.
    Always = 2,
    /// Give back units taken at the decision's time (sent in its `now`):
    /// 3. Its verdicts are checks of cost 0 after it.
    Refund = 3,
    /// Take up to the cost, as much as every limit admits: 4. Its reply
    /// is one more number, the units taken, before its verdicts.
    Lease = 4,
}

/// Above this the script's numbers (doubles) stop being exact integers.
pub(crate) const MAX_EXACT: u64 = (1 << 53) - 1;

/// The cost the script is sent for a request of `cost`: at most one more
/// than the largest size of any limit of `charges` (base or enforced), and
/// at most [`MAX_EXACT`]. A cost above a limit's size is denied by it, and
/// every number of that verdict (remaining, reset, retry after "never")
/// is the same for any such cost, so the decision does not change; but
/// the script multiplies the cost by a limit's period, and a cost of 2^64
/// would not even be a whole number there. (The reply is replayed with the
/// request's own cost.)
pub(crate) fn script_cost(charges: &[Charge<'_>], cost: u64) -> u64 {
    let largest = charges
        .iter()
        .flat_map(|c| c.rule.limits().iter().chain(c.rule.enforced_limits()))
        .map(Limit::size)
        .max()
        .unwrap_or(0);
    cost.min(largest.saturating_add(1)).min(MAX_EXACT)
}

/// The cost the script is sent for a charge after the fact of `cost`: the
/// cost itself, up to [`MAX_EXACT`] (2^53 - 1, so the script's doubles hold
/// it exactly). A charge is never refused, so it cannot be clamped to the
/// sizes as a request is ([`script_cost`]): a charge past a size is debt.
/// The script then bounds what it keeps as the memory store does, never
/// failing the call: a time-based debt (token bucket, GCRA, shaper,
/// leaky bucket) at the limit's max_debt past its horizon (and at 2^51
/// µs, about 71 years, whatever that says), a sliding counter's count at
/// its `max_count_at` the charge's time, a fixed window's count at 2^53 - 1 (it clears with
/// the window anyway), and a sliding log keeps its newest limit + 1
/// entries, as in core.
pub(crate) fn charge_cost(cost: u64) -> u64 {
    cost.min(MAX_EXACT)
}

/// The part of a script call deciding one rule for the key whose
/// [`tag`] is `tag` (a sync exchange keeps tags, not clients' values).
pub(crate) fn part_tagged(
    rule: &spillway_core::Rule,
    tag: u64,
    cost: u64,
    now_us: u64,
    write: Write,
) -> Part {
    let key = spillway_store::Key::default();
    let mut p = part(&[Charge { rule, key: &key }], cost, now_us, write);
    for r in p.rules.iter_mut() {
        r.tag = tag;
    }
    p
}

/// The part of a script call deciding `charges`.
pub(crate) fn part(charges: &[Charge<'_>], cost: u64, now_us: u64, write: Write) -> Part {
    // A cost of 0 is a check: it writes nothing.
    let write = if cost == 0 && write == Write::IfAdmitted {
        Write::Dry
    } else {
        write
    };
    let rules = charges
        .iter()
        .map(|c| {
            let mode = match c.rule.mode() {
                Mode::Hard => 0,
                Mode::Soft { .. } | Mode::Elastic(_) => 1,
                Mode::Shadow => 2,
            };
            let base = c.rule.limits();
            let mut params = SmallVec::with_capacity(2 + 6 * base.len());
            params.extend([mode, base.len() as u64]);
            for (b, e) in base.iter().zip(c.rule.enforced_limits()) {
                params.extend(params_of(b, e));
            }
            RulePart {
                params,
                tag: tag(c),
            }
        })
        .collect();
    Part {
        now_us,
        // A refund's or a lease's cost is units, not a request's cost: a
        // lease takes at most what its limits admit, and the script
        // multiplies only that by a period.
        cost: match write {
            Write::Always | Write::Refund | Write::Lease => charge_cost(cost),
            Write::IfAdmitted | Write::Dry => script_cost(charges, cost),
        },
        write,
        rules,
        reply_len: crate::reply::reply_len(charges) + usize::from(write == Write::Lease),
    }
}

/// The script call deciding `parts` one after the other: `EVALSHA sha
/// numkeys KEYS... ARGV...`, built into one command buffer (a
/// `ScriptInvocation` keeps every argument in its own allocation and copies
/// them all again on sending). Rules shared by several decisions are sent
/// once.
pub(crate) fn command<'a>(
    script: &Script,
    prefix: &str,
    buckets: u32,
    parts: impl Iterator<Item = &'a Part> + Clone,
) -> Cmd {
    build(script, prefix, buckets, parts, None)
}

/// `<prefix>sync:seq`: the hash of each sync instance's last sequence
/// number.
pub(crate) fn seq_key(prefix: &str) -> String {
    format!("{prefix}sync:seq")
}

/// `<prefix>sync:live`: the sorted set of live sync instances.
pub(crate) fn live_key(prefix: &str) -> String {
    format!("{prefix}sync:live")
}

/// The key naming the data this server holds (see
/// `RedisStore::incarnation`): never expires, so it is gone only with the
/// data (a restart without persistence, a flush).
pub(crate) fn incarnation_key(prefix: &str) -> String {
    format!("{prefix}sync:incarnation")
}

/// The hash of sequence numbers in the slot of `tag`'s bucket, for a
/// cluster (each slot keeps its own: one call touches one slot).
pub(crate) fn slot_seq_key(prefix: &str, tag: u64, buckets: u32) -> String {
    format!("{}sync:seq", bucket_key(prefix, tag, buckets))
}

/// The call of `lua/reset.lua` that forgets every limit's state of
/// `charge`'s key: a key and a field per limit (the field empty for a
/// sliding log, whose list is the key's alone). Every key is in the
/// bucket's slot, so one call serves a cluster too.
pub(crate) fn reset_command(prefix: &str, buckets: u32, charge: &Charge<'_>) -> Cmd {
    let t = tag(charge);
    let limits = charge.rule.limits();
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(crate::RESET_LUA).arg(limits.len());
    for (i, l) in limits.iter().enumerate() {
        if matches!(l, Limit::SlidingLog(_)) {
            cmd.arg(log_key(prefix, t, buckets, i));
        } else {
            cmd.arg(bucket_key(prefix, t, buckets));
        }
    }
    for (i, l) in limits.iter().enumerate() {
        if matches!(l, Limit::SlidingLog(_)) {
            cmd.arg(b"".as_slice());
        } else {
            cmd.arg(field(t, i));
        }
    }
    cmd
}

/// `<prefix>{admin}:map:<map>`: the hash of one admin map (overrides,
/// plans). Every admin key carries the hash tag `{admin}` right after
/// the prefix, so all of them share one cluster slot whatever the prefix
/// holds (a brace in the prefix moves the tag, but for every admin key
/// alike), and no bucket is ever spelled `admin` (buckets are hex).
pub(crate) fn admin_map_key(prefix: &str, map: &str) -> String {
    format!("{prefix}{{admin}}:map:{map}")
}

/// `<prefix>{admin}:version`: the admin version, bumped by every change
/// to an admin map (see [`admin_map_key`]).
pub(crate) fn admin_version_key(prefix: &str) -> String {
    format!("{prefix}{{admin}}:version")
}

/// The slot of `tag`'s bucket.
pub(crate) fn tag_slot(tag: u64, buckets: u32) -> u16 {
    let hash_tag = format!("{:x}", bucket(tag, buckets));
    crc16(hash_tag.as_bytes()) % 16384
}

/// The script call of a sync exchange: [`command`] with the sync header
/// (see `lua/decide.lua`): `instance` (empty: always applied, nothing
/// stored) and `seq` (at most [`MAX_EXACT`]) as ARGV[2] and ARGV[3], the
/// hash of sequence numbers, `seq_key` ([`seq_key`] on a single server,
/// [`slot_seq_key`] on a cluster), as the last key.
pub(crate) fn exchange_command(
    script: &Script,
    prefix: &str,
    buckets: u32,
    parts: &[Part],
    (instance, seq): (&str, u64),
    seq_key: &str,
) -> Cmd {
    build(
        script,
        prefix,
        buckets,
        parts.iter(),
        Some((instance, seq, seq_key)),
    )
}

/// The call deciding `parts`, with the sync header if `sync`.
fn build<'a>(
    script: &Script,
    prefix: &str,
    buckets: u32,
    parts: impl Iterator<Item = &'a Part> + Clone,
    sync: Option<(&str, u64, &str)>,
) -> Cmd {
    // The distinct rules, and each rule application's number among them.
    let mut distinct: Vec<&[u64]> = Vec::new();
    let mut index: Vec<u64> = Vec::new();
    // Values in the argument array: the two counts, rules, decisions.
    let (mut nkeys, mut nvalues, mut ndecisions) = (0, 2, 0);
    for p in parts.clone() {
        ndecisions += 1;
        nvalues += 4;
        for r in &p.rules {
            let i = match distinct.iter().position(|d| *d == &r.params[..]) {
                Some(i) => i,
                None => {
                    distinct.push(&r.params);
                    nvalues += r.params.len();
                    distinct.len() - 1
                }
            };
            index.push(i as u64 + 1);
            let nl = r.limits().count();
            nkeys += nl;
            nvalues += 1 + nl;
        }
    }
    let mut cmd = Cmd::with_capacity(6 + nkeys, 64 + 40 * nkeys);
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(nkeys + usize::from(sync.is_some()));
    for p in parts.clone() {
        for r in &p.rules {
            let bucket = bucket_key(prefix, r.tag, buckets);
            for (i, l) in r.limits().enumerate() {
                if l[0] == SLIDING_LOG {
                    cmd.arg(log_key(prefix, r.tag, buckets, i));
                } else {
                    cmd.arg(&bucket);
                }
            }
        }
    }
    if let Some((_, _, key)) = sync {
        cmd.arg(key);
    }
    let mut a = Vec::with_capacity(16 * nvalues);
    msgpack::push_array_len(&mut a, nvalues);
    msgpack::push_uint(&mut a, distinct.len() as u64);
    for d in &distinct {
        for &v in *d {
            msgpack::push_uint(&mut a, v);
        }
    }
    msgpack::push_uint(&mut a, ndecisions);
    let mut next = index.into_iter();
    for p in parts {
        for v in [p.now_us, p.cost, p.write as u64, p.rules.len() as u64] {
            msgpack::push_uint(&mut a, v);
        }
        for r in &p.rules {
            msgpack::push_uint(&mut a, next.next().unwrap_or(0));
            for (i, l) in r.limits().enumerate() {
                if l[0] == SLIDING_LOG {
                    msgpack::push_str(&mut a, b"");
                } else {
                    msgpack::push_str(&mut a, &field(r.tag, i));
                }
            }
        }
    }
    cmd.arg(a);
    if let Some((instance, seq, _)) = sync {
        cmd.arg(instance).arg(seq);
    }
    cmd
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
    tag_slot(tag(charge), buckets)
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
    fn rules_shared_by_decisions_are_sent_once() {
        use spillway_core::{FixedWindow, KeySpec, Nanos, Rule, SlidingLog};
        use spillway_store::Key;
        let w = Nanos::from_secs(60);
        let rule = |name, limit, mode| {
            Rule::new(
                name,
                None,
                KeySpec::parse("user").unwrap(),
                vec![limit],
                mode,
            )
            .unwrap()
        };
        let window = rule(
            "w",
            Limit::FixedWindow(FixedWindow::new(10, w).unwrap()),
            Mode::Hard,
        );
        let log = rule(
            "l",
            Limit::SlidingLog(SlidingLog::new(3, w).unwrap()),
            Mode::Shadow,
        );
        let (a, b) = (Key::from_parts(["a"]), Key::from_parts(["b"]));
        let charge = |rule, key| Charge { rule, key };
        let parts = [
            part(&[charge(&window, &a)], 1, 0, Write::IfAdmitted),
            part(
                &[charge(&log, &b), charge(&window, &b)],
                2,
                0,
                Write::IfAdmitted,
            ),
            part(&[charge(&window, &b)], 1, 7, Write::Dry),
        ];
        let cmd = command(&Script::new("return 1"), "p:", 16, parts.iter());
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"?".to_vec(),
            })
            .collect();
        assert_eq!(args[0], b"EVALSHA");
        assert_eq!(args[2], b"4", "one key per limit");
        for k in &args[3..7] {
            assert!(k.starts_with(b"p:{"), "{k:?}");
        }
        let (fa, fb) = (
            field(tag(&charge(&window, &a)), 0),
            field(tag(&charge(&window, &b)), 0),
        );
        enum V {
            N(u64),
            S(Vec<u8>),
        }
        use V::{N, S};
        let us = 60_000_000;
        let mut expected = vec![N(2)];
        // The two rules: hard fixed window of 10; shadow sliding log of 3
        // (neither keeps a debt past its window: d is 0).
        expected.extend([N(0), N(1), N(4), N(10), N(10), N(us), N(0), N(0)]);
        expected.extend([N(2), N(1), N(5), N(3), N(3), N(us), N(0), N(0)]);
        // Three decisions: now, cost, dry, rules, then rule number and fields.
        expected.push(N(3));
        expected.extend([N(0), N(1), N(0), N(1), N(1), S(fa)]);
        expected.extend([N(0), N(2), N(0), N(2), N(2), S(Vec::new()), N(1)]);
        expected.push(S(fb.clone()));
        expected.extend([N(7), N(1), N(1), N(1), N(1), S(fb)]);
        let mut blob = Vec::new();
        msgpack::push_array_len(&mut blob, expected.len());
        for v in &expected {
            match v {
                N(n) => msgpack::push_uint(&mut blob, *n),
                S(s) => msgpack::push_str(&mut blob, s),
            }
        }
        assert_eq!(args.len(), 8, "the keys, then one argument");
        assert_eq!(args[7], blob);
    }

    #[test]
    fn the_sync_header_follows_the_arguments_and_its_hash_the_keys() {
        use spillway_core::{FixedWindow, KeySpec, Nanos, Rule};
        use spillway_store::Key;
        let limit = Limit::FixedWindow(FixedWindow::new(10, Nanos::from_secs(60)).unwrap());
        let rule = Rule::new(
            "w",
            None,
            KeySpec::parse("user").unwrap(),
            vec![limit],
            Mode::Hard,
        )
        .unwrap();
        let key = Key::from_parts(["a"]);
        let charges = [Charge {
            rule: &rule,
            key: &key,
        }];
        let parts = [
            part(&charges, 3, 0, Write::Lease),
            part(&charges, 2, 1234, Write::Refund),
        ];
        assert_eq!(parts[0].reply_len, 6, "the units taken, then a verdict");
        assert_eq!(parts[1].reply_len, 5);
        let script = Script::new("return 1");
        let cmd = exchange_command(&script, "p:", 16, &parts, ("inst", 42), &seq_key("p:"));
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"?".to_vec(),
            })
            .collect();
        assert_eq!(args[2], b"3", "a key per limit, then the hash");
        assert!(args[3].starts_with(b"p:{") && args[4].starts_with(b"p:{"));
        assert_eq!(args[5], b"p:sync:seq");
        assert_eq!(args[7..], [b"inst".to_vec(), b"42".to_vec()]);
        let plain = command(&script, "p:", 16, parts.iter());
        assert_eq!(plain.args_iter().count(), 6, "no header: three keys fewer");
    }

    #[test]
    fn crc16_matches_the_cluster_spec_example() {
        // The Redis Cluster specification's check value for "123456789".
        assert_eq!(crc16(b"123456789"), 0x31C3);
    }
}
