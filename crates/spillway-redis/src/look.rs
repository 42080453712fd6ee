//! An operator's look at a key ([`RedisStore::peek_at`]) and its reset
//! ([`RedisStore::reset_keys`]).

use spillway_core::Verdict;
use spillway_store::{Charge, StoreError};

use crate::keys::{self, Write};
use crate::{Conn, RedisStore, err, reply, timed_out};

impl RedisStore {
    /// Where each charge's key stands, without charging it: per charge,
    /// the verdict of each limit of its rule's enforced limits, in order,
    /// for a request of `cost` (a soft rule's under its raised size, the
    /// one that refuses). A dry run of the decision script: it writes
    /// nothing and changes no TTL. `now_us` is the time in microseconds
    /// since the epoch, or 0 for Redis's own clock (as
    /// [`decide_at`](Self::decide_at)).
    ///
    /// The over-limit cache is neither asked nor taught: the answer is
    /// Redis's. On a single server the look goes out with the decisions
    /// (batched); on a cluster, one call per slot the charges' keys live
    /// in. Counted on the circuit breaker as a decision is, and refused
    /// at once while it is open.
    ///
    /// # Errors
    /// As [`Store::decide`](spillway_store::Store::decide).
    pub async fn peek_at(
        &self,
        charges: &[Charge<'_>],
        cost: u64,
        now_us: u64,
    ) -> Result<Vec<Vec<Verdict>>, StoreError> {
        if charges.is_empty() {
            return Ok(Vec::new());
        }
        let inner = &self.inner;
        let numbers: redis::RedisResult<Vec<Vec<i64>>> = match self.connection()? {
            Conn::Single(_) => {
                match self.send_single(keys::part(charges, cost, now_us, Write::Dry)) {
                    Ok(answer) => answer
                        .await
                        .map_err(|_| crate::unsent("redis batcher stopped"))
                        .and_then(|r| r),
                    Err(e) => Err(e),
                }
                .map(|out| {
                    reply::split(charges, &out)
                        .iter()
                        .map(|n| n.to_vec())
                        .collect()
                })
            }
            Conn::Cluster(c) => {
                let mut c = c.clone();
                let groups = keys::slot_groups(inner.config.buckets, charges);
                let _due = spillway_store::due::Awaiting::new();
                Box::pin(tokio::time::timeout(
                    inner.config.timeout,
                    self.cluster_round(&mut c, &groups, charges, cost, now_us, Write::Dry),
                ))
                .await
                .unwrap_or_else(|_| Err(timed_out()))
            }
        };
        let numbers = match numbers {
            Ok(n) => n,
            Err(e) => return Err(self.failed(&e)),
        };
        inner.breaker.success();
        charges
            .iter()
            .zip(&numbers)
            .map(|(c, n)| {
                let verdicts = reply::enforced_verdicts(c, n);
                if verdicts.len() == c.rule.enforced_limits().len() {
                    Ok(verdicts)
                } else {
                    Err(err(
                        false,
                        format!(
                            "redis: a dry run of rule {} answered {} numbers",
                            c.rule.name(),
                            n.len()
                        ),
                    ))
                }
            })
            .collect()
    }

    /// Forgets every limit's state of each charge's key in Redis, so the
    /// client starts afresh: its field in each limit's bucket hash, and a
    /// sliding log's own list. Returns how many states were there.
    ///
    /// One small script call per charge (a charge's keys share one slot,
    /// so this works on a cluster too), each within the store's timeout;
    /// not counted on the circuit breaker (an operator's call, tried even
    /// while decisions are refused). What this instance's over-limit
    /// cache knew of those keys is forgotten, so its next decision on
    /// them goes to Redis; other instances' caches may still refuse such
    /// a key for at most the `retry_after` Redis last gave them.
    ///
    /// # Errors
    /// The first call that failed: transient if the connection failed or
    /// no answer came in time. Charges before it were reset.
    pub async fn reset_keys(&self, charges: &[Charge<'_>]) -> Result<u64, StoreError> {
        let (prefix, buckets) = (&self.inner.config.prefix, self.inner.config.buckets);
        let mut gone = 0;
        let mut result = Ok(());
        for c in charges {
            let cmd = keys::reset_command(prefix, buckets, c);
            match self.query::<u64>(&cmd).await {
                Ok(n) => gone += n,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        // Forgotten even after a failure: a reset that may have happened
        // must not leave a refusal standing (at worst a round trip more).
        if let Some(over) = &self.inner.over {
            over.forget(charges);
        }
        result.map(|()| gone)
    }
}
