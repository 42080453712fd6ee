//! Local-first sync: an instance decides in memory and, every interval,
//! exchanges with Redis what it counted ([`RedisStore::exchange`]), and
//! says it is alive ([`RedisStore::heartbeat`]).
//!
//! An exchange is one call of the decision script (`lua/decide.lua`,
//! whose header is the contract) carrying every item as a decision of its
//! own: a charge after the fact, a refund of units a lease took and did
//! not use, or a lease of units to spend locally. Rules shared by items
//! are sent once. With a push (an instance's name and a sequence number)
//! the call is idempotent: a push sent again after a lost reply is
//! answered, but changes nothing.

use std::sync::atomic::Ordering;
use std::time::Duration;

use spillway_core::{Decision, Verdict};
use spillway_store::{Charge, StoreError};

use crate::keys::{self, Write};
use crate::{Conn, RedisStore, err, eval, eval_script, reply, timed_out};

/// What one item of an exchange does to its rule's limits for its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOp {
    /// Charge `n` after the fact (the script's flag 2: always counted, debt allowed);
    /// 0 is a check (dry run, writes nothing).
    Charge(u64),
    /// Give back `units` taken by a lease at `since_us` (Redis microseconds, as returned
    /// by an earlier exchange's `now_us`).
    Refund {
        /// Units given back (0: a check).
        units: u64,
        /// When the lease took them: Redis's TIME in microseconds.
        since_us: u64,
    },
    /// Take up to `want` units now: the largest c <= want that every limit admits
    /// (all-or-none), charged as an admitted request of cost c; 0 if none.
    Lease {
        /// The most to take.
        want: u64,
    },
}

impl SyncOp {
    /// The script's cost, time (0: Redis's TIME) and flag for this op.
    fn script_op(self) -> (u64, u64, Write) {
        match self {
            SyncOp::Charge(0) | SyncOp::Refund { units: 0, .. } => (0, 0, Write::Dry),
            SyncOp::Charge(n) => (n, 0, Write::Always),
            SyncOp::Refund { units, since_us } => (units, since_us, Write::Refund),
            SyncOp::Lease { want } => (want, 0, Write::Lease),
        }
    }
}

/// One item of an exchange: an op on one rule's limits for one key.
#[derive(Debug, Clone, Copy)]
pub struct SyncItem<'a> {
    /// The rule.
    pub rule: &'a spillway_core::Rule,
    /// The client's key under it, as [`tag`](crate::tag) names it: an
    /// instance that shares counts keeps tags, not clients' values.
    pub tag: u64,
    /// What to do to them.
    pub op: SyncOp,
}

impl SyncItem<'_> {
    /// A charge standing for the item's rule, for the reply's replay
    /// (which reads only the rule).
    fn charge<'k>(&self, key: &'k spillway_store::Key<'k>) -> Charge<'k>
    where
        Self: 'k,
    {
        Charge {
            rule: self.rule,
            key,
        }
    }
}

/// What Redis answered for one item.
#[derive(Debug, Clone)]
pub struct SyncItemReply {
    /// For Charge and Refund: a check of cost 0 after the op (as the charge mode answers today).
    /// For Lease: the decision of the take of `granted` units (or of a check when 0 granted).
    pub decision: Decision,
    /// Units granted by a Lease (0 for the other ops).
    pub granted: u64,
    /// Each limit's verdict, the rule's limits in order, under their
    /// enforced sizes (a soft rule's raised ones): the numbers `decision`
    /// was made from, which names only the limit closest to refusing.
    pub limits: Vec<Verdict>,
}

/// What Redis answered for an exchange.
#[derive(Debug, Clone)]
pub struct SyncReply {
    /// False when the push was a replay (its seq was not above the last one stored
    /// for that instance): then NO item changed any state (every op ran as a check),
    /// but every item still has its reply.
    pub applied: bool,
    /// Redis's TIME in microseconds when the script ran.
    pub now_us: u64,
    /// One per item, in order.
    pub items: Vec<SyncItemReply>,
}

impl RedisStore {
    /// Runs `items` in one script call, each atomic on its own, in order
    /// (a lease after a refund of the same key sees the units given
    /// back). `push = Some((instance, seq))` makes the call idempotent:
    /// the script stores the last `seq` per instance in the hash
    /// `<prefix>sync:seq` and runs every op as a check when `seq` is not
    /// above the one stored (then [`SyncReply::applied`] is false). With
    /// `None` the ops always apply.
    ///
    /// The call goes straight to the connection (not through the batcher
    /// of decisions), bounded by [`RedisConfig::timeout`](crate::RedisConfig::timeout);
    /// it counts on the circuit breaker as decisions do, and in
    /// [`script_calls`](Self::script_calls). Thousands of items fit one
    /// call; it runs on Redis as long as that many decisions would.
    ///
    /// # Errors
    /// As [`Store::decide`](spillway_store::Store::decide); and, not
    /// transient, for an empty instance name, or a `seq` above 2^53 - 1
    /// (the script's numbers are doubles). On a cluster the items are
    /// sent in one call per slot (one after another, each within
    /// `timeout`),
    /// each slot keeping its own numbers (`<prefix>{<bucket>}sync:seq`):
    /// [`SyncReply::applied`] is then false if any slot's part was a
    /// replay.
    pub async fn exchange(
        &self,
        items: &[SyncItem<'_>],
        push: Option<(&str, u64)>,
    ) -> Result<SyncReply, StoreError> {
        self.exchange_within(items, push, self.inner.config.timeout)
            .await
    }

    /// [`exchange`](Self::exchange), waiting at most `timeout` (an
    /// exchange in the background may wait longer than a decision, e.g.
    /// an interval, and a link to another region needs its round trip).
    ///
    /// # Errors
    /// As [`exchange`](Self::exchange).
    pub async fn exchange_within(
        &self,
        items: &[SyncItem<'_>],
        push: Option<(&str, u64)>,
        timeout: Duration,
    ) -> Result<SyncReply, StoreError> {
        let inner = &self.inner;
        let (instance, seq) = push.unwrap_or(("", 0));
        if push.is_some() && instance.is_empty() {
            return Err(err(false, "a sync push needs an instance name"));
        }
        if seq > keys::MAX_EXACT {
            return Err(err(
                false,
                format!("sync sequence number {seq} is above 2^53 - 1"),
            ));
        }
        let part = |item: &SyncItem<'_>| {
            let (cost, now_us, write) = item.op.script_op();
            keys::part_tagged(item.rule, item.tag, cost, now_us, write)
        };
        let (prefix, buckets) = (&inner.config.prefix, inner.config.buckets);
        self.connection()?;
        let Some(conn) = inner.current() else {
            return Err(err(true, "not connected to redis yet"));
        };
        let result = match &conn {
            Conn::Single(c) => {
                let parts: Vec<keys::Part> = items.iter().map(part).collect();
                let cmd = keys::exchange_command(
                    &inner.script,
                    prefix,
                    buckets,
                    &parts,
                    (instance, seq),
                    &keys::seq_key(prefix),
                );
                let mut c = c.clone();
                let _due = spillway_store::due::Awaiting::new();
                tokio::time::timeout(timeout, eval(&mut c, &cmd, inner))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()))
                    .and_then(|out| sync_reply(items, &parts, &out))
            }
            // One call per slot, each with the numbers of its own slot: a
            // push retried after a partial failure is a replay in the
            // slots that took it and applied in the others.
            Conn::Cluster(c) => {
                let mut c = c.clone();
                let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let slot = keys::tag_slot(item.tag, buckets);
                    match groups.iter_mut().find(|(s, _)| *s == slot) {
                        Some((_, g)) => g.push(i),
                        None => groups.push((slot, vec![i])),
                    }
                }
                let calls = async {
                    let mut merged: Vec<Option<SyncItemReply>> = vec![None; items.len()];
                    let (mut applied, mut now_us) = (true, 0);
                    for (_, group) in &groups {
                        let mine: Vec<SyncItem<'_>> = group.iter().map(|&i| items[i]).collect();
                        let parts: Vec<keys::Part> = mine.iter().map(part).collect();
                        let seq_key = keys::slot_seq_key(prefix, mine[0].tag, buckets);
                        let cmd = keys::exchange_command(
                            &inner.script,
                            prefix,
                            buckets,
                            &parts,
                            (instance, seq),
                            &seq_key,
                        );
                        // Each slot's call within `timeout`: a push over
                        // many slots makes progress slot by slot (those
                        // answered are replays when it is sent again).
                        let out = tokio::time::timeout(timeout, eval(&mut c, &cmd, inner))
                            .await
                            .unwrap_or_else(|_| Err(timed_out()))?;
                        let reply = sync_reply(&mine, &parts, &out)?;
                        applied &= reply.applied;
                        now_us = now_us.max(reply.now_us);
                        for (&i, r) in group.iter().zip(reply.items) {
                            merged[i] = Some(r);
                        }
                    }
                    Ok(SyncReply {
                        applied,
                        now_us,
                        items: merged.into_iter().flatten().collect(),
                    })
                };
                let _due = spillway_store::due::Awaiting::new();
                Box::pin(calls).await
            }
        };
        match result {
            Ok(reply) => {
                inner.breaker.success();
                // A refund makes a key less over its limit than time alone
                // would: what the over-limit cache knew may be wrong now.
                // (An instance that syncs decides locally and never asks
                // this store's cache; this is for a store used both ways.)
                if let Some(over) = inner.over.as_ref().filter(|_| reply.applied)
                    && items
                        .iter()
                        .any(|i| matches!(i.op, SyncOp::Refund { units: 1.., .. }))
                {
                    over.clear();
                }
                Ok(reply)
            }
            Err(e) => Err(self.failed(&e)),
        }
    }

    /// The name of the data this Redis holds: `<prefix>sync:incarnation`,
    /// set to `mine` if it has none (`SET NX GET`, Redis 7), and answered.
    /// A server restarted without its data (killed and started empty, or
    /// flushed) answers a name other than before: what a call that timed
    /// out may have done there is gone with it. Bounded by the store's
    /// timeout and counted on the circuit breaker.
    ///
    /// # Errors
    /// As [`Store::decide`](spillway_store::Store::decide).
    pub async fn incarnation(&self, mine: &str) -> Result<Vec<u8>, StoreError> {
        let inner = &self.inner;
        let mut cmd = redis::cmd("SET");
        cmd.arg(keys::incarnation_key(&inner.config.prefix))
            .arg(mine)
            .arg("NX")
            .arg("GET");
        let conn = self.connection()?.clone();
        let call = async {
            let _due = spillway_store::due::Awaiting::new();
            inner.calls.fetch_add(1, Ordering::Relaxed);
            match conn {
                Conn::Single(mut c) => cmd.query_async::<Option<Vec<u8>>>(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async::<Option<Vec<u8>>>(&mut c).await,
            }
        };
        let result = Box::pin(tokio::time::timeout(inner.config.timeout, call))
            .await
            .unwrap_or_else(|_| Err(timed_out()));
        match result {
            Ok(was) => {
                inner.breaker.success();
                Ok(was.unwrap_or_else(|| mine.as_bytes().to_vec()))
            }
            Err(e) => Err(self.failed(&e)),
        }
    }

    /// Records `instance` as alive at Redis's time in the sorted set
    /// `<prefix>sync:live`, drops the members whose last heartbeat is
    /// older than `ttl` (the set itself lives `ttl` after the last one),
    /// and answers Redis's TIME in microseconds and the members left
    /// (this one included). One small script call on one key, so it works
    /// on a cluster too; bounded by
    /// [`RedisConfig::timeout`](crate::RedisConfig::timeout), counted on
    /// the circuit breaker and in [`script_calls`](Self::script_calls).
    ///
    /// # Errors
    /// As [`Store::decide`](spillway_store::Store::decide).
    pub async fn heartbeat(
        &self,
        instance: &str,
        ttl: Duration,
    ) -> Result<(u64, usize), StoreError> {
        self.beat(instance, ttl, true)
            .await
            .map(|b| (b.now_us, b.live))
    }

    /// [`heartbeat`](Self::heartbeat), saying whether every push this
    /// instance made so far has been applied (`synced`), and answering
    /// the horizon too: the earliest, over the live instances that said
    /// so, of the TIME before which everything they admitted is in the
    /// store (see `lua/heartbeat.lua`).
    ///
    /// # Errors
    /// As [`Store::decide`](spillway_store::Store::decide).
    pub async fn beat(
        &self,
        instance: &str,
        ttl: Duration,
        synced: bool,
    ) -> Result<Beat, StoreError> {
        let inner = &self.inner;
        let ttl_us = u64::try_from(ttl.as_micros())
            .unwrap_or(u64::MAX)
            .min(keys::MAX_EXACT);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(inner.heartbeat.get_hash())
            .arg(1)
            .arg(keys::live_key(&inner.config.prefix))
            .arg(instance)
            .arg(ttl_us)
            .arg(if synced { "1" } else { "0" });
        self.connection()?;
        let Some(conn) = inner.current() else {
            return Err(err(true, "not connected to redis yet"));
        };
        let call = async {
            let _due = spillway_store::due::Awaiting::new();
            match conn {
                Conn::Single(mut c) => eval_script(&mut c, &cmd, &inner.heartbeat, inner).await,
                Conn::Cluster(mut c) => eval_script(&mut c, &cmd, &inner.heartbeat, inner).await,
            }
        };
        let result = Box::pin(tokio::time::timeout(inner.config.timeout, call))
            .await
            .unwrap_or_else(|_| Err(timed_out()))
            .and_then(|out| match out[..] {
                [now, live, horizon] => Ok(Beat {
                    now_us: u64::try_from(now).unwrap_or(0),
                    live: usize::try_from(live).unwrap_or(0),
                    horizon_us: u64::try_from(horizon).unwrap_or(0),
                }),
                _ => Err(wrong_length()),
            });
        match result {
            Ok(answer) => {
                inner.breaker.success();
                Ok(answer)
            }
            Err(e) => Err(self.failed(&e)),
        }
    }
}

/// A heartbeat's answer (see [`RedisStore::beat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Redis's TIME, in microseconds.
    pub now_us: u64,
    /// Live instances, this one included.
    pub live: usize,
    /// The earliest TIME (microseconds) before which every live instance
    /// that said so has everything it admitted in the store; 0 if none
    /// has said so yet.
    pub horizon_us: u64,
}

fn wrong_length() -> redis::RedisError {
    (redis::ErrorKind::Parse, "script reply of the wrong length").into()
}

/// The reply of an exchange of `items` (sent as `parts`): applied, TIME,
/// then per item its numbers (a lease's first: the units it took).
fn sync_reply(
    items: &[SyncItem<'_>],
    parts: &[keys::Part],
    out: &[i64],
) -> redis::RedisResult<SyncReply> {
    let expected = 2 + parts.iter().map(|p| p.reply_len).sum::<usize>();
    if out.len() != expected {
        return Err(wrong_length());
    }
    let mut at = 2;
    let items = items
        .iter()
        .zip(parts)
        .map(|(item, part)| {
            let key = spillway_store::Key::default();
            let charge = item.charge(&key);
            let charges = std::slice::from_ref(&charge);
            let mut numbers = &out[at..at + part.reply_len];
            at += part.reply_len;
            let granted = match item.op {
                SyncOp::Lease { .. } => {
                    let g = u64::try_from(numbers[0]).unwrap_or(0);
                    numbers = &numbers[1..];
                    g
                }
                _ => 0,
            };
            // A charge's and a refund's verdicts are checks of cost 0
            // after them; a lease's are the take's (of `granted`; 0: a
            // check).
            SyncItemReply {
                decision: reply::decision(charges, numbers, granted),
                granted,
                limits: reply::enforced_verdicts(&charge, numbers),
            }
        })
        .collect();
    Ok(SyncReply {
        applied: out[0] == 1,
        now_us: u64::try_from(out[1]).unwrap_or(0),
        items,
    })
}
