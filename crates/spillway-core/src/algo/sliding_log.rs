use super::ring::Ring;
use super::{Verdict, window_params};
use crate::error::Error;
use crate::time::Nanos;

/// Sliding window log: at most `limit` requests in any window of length `window`, exactly.
///
/// The log keeps the time of every admitted request still inside the window;
/// a request passes if the log holds at most `limit - cost` of them. Denied
/// requests are not logged, so a client hammering a closed limit costs no memory.
///
/// **Choose it** when the limit is small and must hold exactly in every
/// window (login attempts, password resets, OTP sends).
///
/// **Parameters**: `limit` (at most [`MAX_LOG_LIMIT`], 100,000, to keep
/// logs bounded) and `window`.
///
/// **State**: a 56-byte header holding up to 7 logged units inline; beyond
/// that, 8 bytes per distinct admission time still in the window (a run:
/// an offset and a count, see [`Log`]). Memory grows with how many
/// requests were admitted, never with what they cost: a request of cost
/// 100,000 is one run. At most `limit` runs per key (800 KB at the
/// largest limit, reached only by `limit` separate admissions): 500 per
/// hour costs at most 4 KB per active client.
///
/// **Weaknesses**: memory and work grow with the number of admissions in
/// a window; use a counter algorithm for large limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    window: Nanos,
    /// Timestamps are stored in units of `2^shift` ns, chosen so a whole
    /// window fits in 31 bits of offset. Stored times are rounded up to the
    /// unit: entries then expire a little later, never earlier, so the
    /// "at most `limit` in any window" guarantee holds exactly.
    shift: u32,
}

/// The largest limit a sliding log accepts: its log holds up to one 8-byte
/// run per admission still in the window, at most `limit` of them, so
/// this bounds a key's log at 800 KB (one request adds at most one run,
/// whatever its cost). For larger limits use a
/// [`SlidingCounter`](crate::SlidingCounter).
pub const MAX_LOG_LIMIT: u64 = 100_000;

impl SlidingLog {
    /// `limit` in any `window`.
    ///
    /// # Errors
    /// Zero limit or window, or a limit above [`MAX_LOG_LIMIT`] (100,000):
    /// the error names the maximum.
    pub fn new(limit: u64, window: Nanos) -> Result<SlidingLog, Error> {
        window_params(limit, window, "sliding_window_log limit", MAX_LOG_LIMIT)?;
        let mut shift = 0;
        while (window.0 >> shift) >= (1 << 31) {
            shift += 1;
        }
        Ok(SlidingLog {
            limit,
            window,
            shift,
        })
    }

    /// Requests per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Window length.
    pub fn window(&self) -> Nanos {
        self.window
    }

    pub(crate) fn with_limit(&self, limit: u64) -> SlidingLog {
        SlidingLog {
            limit: limit.min(MAX_LOG_LIMIT),
            ..*self
        }
    }

    /// Decides `cost` at `now` against `log`, without changing it. Call
    /// [`SlidingLog::commit`] to charge an admitted request.
    pub fn decide(&self, log: &Log, now: Nanos, cost: u64) -> Verdict {
        let w = self.window.0;
        let live = log.live_from(now.0, w, self.shift);
        let count = (log.ring.len() - live) as u64;
        let newest_end = if log.ring.is_empty() {
            0
        } else {
            log.time(log.last, self.shift).saturating_add(w)
        };
        let total = count.saturating_add(cost);
        if total <= self.limit {
            let entry_end = log.quantize(now.0, self.shift).saturating_add(w);
            let reset = Nanos(entry_end.max(newest_end) - now.0);
            Verdict::admit(self.limit, self.limit - total, reset)
        } else {
            let reset = Nanos(newest_end.saturating_sub(now.0));
            let retry = if cost > self.limit {
                Nanos::MAX
            } else {
                // The oldest `total - limit` live entries must leave first.
                let idx = live + (total - self.limit - 1) as usize;
                let end = log.time(log.ring.get(idx), self.shift).saturating_add(w);
                Nanos(end.saturating_sub(now.0))
            };
            Verdict::deny(self.limit, self.limit.saturating_sub(count), reset, retry)
        }
    }

    /// Charges `cost` requests at `now` to `log`, dropping entries that have left the window.
    ///
    /// Meant for a request [`SlidingLog::decide`] admitted; whatever it is
    /// given, the log never holds more than `limit` entries (a cost beyond
    /// the room left is logged up to the room).
    pub fn commit(&self, log: &mut Log, now: Nanos, cost: u64) {
        self.log(log, now, cost, self.limit);
    }

    /// Charges `cost` after the fact: always counted, even past the limit,
    /// which puts the key in debt: checks are denied until enough of the
    /// charged entries have left the window. The verdict is a check of
    /// cost 0 after the charge.
    ///
    /// The log keeps its newest `limit + 1` entries, dropping older ones:
    /// every check asks for at most `limit` live entries, and entries
    /// leave oldest first, so a log of the newest `limit + 1` answers
    /// every later check exactly as the whole log would, in bounded memory.
    pub fn charge(&self, log: &mut Log, now: Nanos, cost: u64) -> Verdict {
        let keep = self.limit + 1;
        self.expire(log, now);
        let n = cost.min(keep);
        let over = (log.ring.len() as u64 + n).saturating_sub(keep);
        log.ring
            .drop_front(usize::try_from(over).unwrap_or(usize::MAX));
        log.first = log.ring.front().unwrap_or(0);
        self.log(log, now, n, keep);
        self.decide(log, now, 0)
    }

    /// Drops the entries that have left the window ending at `now`.
    fn expire(&self, log: &mut Log, now: Nanos) {
        let live = log.live_from(now.0, self.window.0, self.shift);
        log.ring.drop_front(live);
        log.first = log.ring.front().unwrap_or(0);
    }

    /// Logs up to `cost` entries at `now`, as many as keep the log within
    /// `max` entries.
    fn log(&self, log: &mut Log, now: Nanos, cost: u64, max: u64) {
        let w = self.window.0;
        self.expire(log, now);
        let room = max.saturating_sub(log.ring.len() as u64);
        if room == 0 || cost == 0 {
            return;
        }
        let t = log.quantize(now.0, self.shift);
        // Keep the log sorted even if the clock stepped back: such an entry
        // is filed as late as the newest, which only delays its expiry.
        let offset =
            log.offset_for(t, self.shift)
                .max(if log.ring.is_empty() { 0 } else { log.last });
        let n = usize::try_from(cost.min(room)).unwrap_or(usize::MAX);
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        log.ring.push_n(offset, n, max);
        log.first = log.ring.front().unwrap_or(0);
        log.last = offset;
        log.expires = log.expires.max(t.saturating_add(w));
        log.ring.shrink();
    }
}

/// A sliding window log: admitted requests' times as 32-bit offsets from a
/// base, oldest first; equal times are stored once with a count (the
/// heap form), so a request of any cost adds at most one 8-byte run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// Time of offset 0, in ns.
    base: u64,
    /// When every entry has left the window (the log is then as good as empty).
    expires: u64,
    /// Copies of the oldest and newest offsets (valid when the ring is not
    /// empty), so a decision that expires nothing reads only this header,
    /// not the ring's heap buffer: one cache miss less at large key counts.
    first: u32,
    last: u32,
    ring: Ring,
}

impl Log {
    /// An empty log.
    pub fn new() -> Log {
        Log::default()
    }

    /// The time after which the log holds nothing that counts.
    pub fn expires_at(&self) -> Nanos {
        Nanos(self.expires)
    }

    /// Units currently logged (some may have left the window): a request
    /// of cost `k` logs `k`, stored as one run.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// True if nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Bytes allocated for entries.
    pub fn heap_bytes(&self) -> usize {
        self.ring.heap_bytes()
    }

    fn time(&self, offset: u32, shift: u32) -> u64 {
        self.base.saturating_add(u64::from(offset) << shift)
    }

    /// `t` rounded up to the log's unit.
    fn quantize(&self, t: u64, shift: u32) -> u64 {
        if t <= self.base {
            return self.base.max(t);
        }
        let units = (t - self.base).div_ceil(1 << shift);
        self.base.saturating_add(units << shift)
    }

    /// Index of the first entry still inside the window ending at `now`
    /// (entries whose time + W <= now have left).
    fn live_from(&self, now: u64, w: u64, shift: u32) -> usize {
        // Usually nothing has left since the last request: one look at the
        // oldest entry instead of a binary search over the whole log.
        if self.ring.is_empty() || self.time(self.first, shift).saturating_add(w) > now {
            return 0;
        }
        // Everything has left (the newest too): no need to search the ring.
        if self.time(self.last, shift).saturating_add(w) <= now {
            return self.ring.len();
        }
        self.ring
            .partition_point(|o| self.time(o, shift).saturating_add(w) <= now)
    }

    /// The offset for quantized time `t`, moving the base forward first if
    /// `t` would not fit in 32 bits.
    fn offset_for(&mut self, t: u64, shift: u32) -> u32 {
        if self.ring.is_empty() {
            self.base = t;
            return 0;
        }
        let units = t.saturating_sub(self.base) >> shift;
        if let Ok(o) = u32::try_from(units) {
            return o;
        }
        // Rebase to the oldest live entry: all live entries lie within one
        // window (< 2^31 units) of `t`, so everything fits again.
        let first = u64::from(self.ring.get(0));
        self.base = self.base.saturating_add(first << shift);
        self.ring.for_each_mut(|o| *o -= first as u32);
        self.first -= first as u32;
        self.last -= first as u32;
        u32::try_from(t.saturating_sub(self.base) >> shift).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
#[path = "sliding_log_old.rs"]
mod old;

#[cfg(test)]
mod tests {
    use super::old::OldLog;
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, Copy)]
    enum Op {
        /// A request: decided, committed if admitted.
        Hit(u64),
        /// A charge after the fact.
        Charge(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => prop_oneof![3 => 0u64..4, 1 => 0u64..40].prop_map(Op::Hit),
            2 => prop_oneof![3 => 0u64..8, 1 => 0u64..200, 1 => Just(u64::MAX)].prop_map(Op::Charge),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Old against new (issue 35): the log whose heap ring holds runs
        /// decides every request and charge exactly as the flat log of
        /// one offset per unit did, on random sequences at virtual time:
        /// bursts at one instant (runs), gaps that expire entries, gaps
        /// past 2^32 units (a rebase), clock steps back, costs past the
        /// limit, charges up to `u64::MAX`, windows that need a shift.
        #[test]
        fn runs_decide_as_the_flat_log_did(
            limit in prop_oneof![1u64..12, 12u64..60],
            window in prop_oneof![1u64..5_000, 1_000_000u64..3_000_000_000, Just(86_400_000_000_000)],
            ops in proptest::collection::vec(
                (prop_oneof![4 => Just(0i64), 4 => 0i64..2_000, 2 => 0i64..4_000_000_000, 1 => -3_000i64..0, 1 => Just(1i64 << 40)], op()),
                1..120,
            ),
        ) {
            let sl = SlidingLog::new(limit, Nanos(window)).unwrap();
            let (mut new, mut old) = (Log::new(), OldLog::default());
            let mut now: u64 = 1_700_000_000_000_000_000;
            for (i, (gap, op)) in ops.into_iter().enumerate() {
                now = now.saturating_add_signed(gap);
                let t = Nanos(now);
                let (a, b) = match op {
                    Op::Hit(c) => {
                        let (a, b) = (sl.decide(&new, t, c), sl.old_decide(&old, t, c));
                        if a.allowed {
                            sl.commit(&mut new, t, c);
                        }
                        if b.allowed {
                            sl.old_commit(&mut old, t, c);
                        }
                        (a, b)
                    }
                    Op::Charge(c) => (sl.charge(&mut new, t, c), sl.old_charge(&mut old, t, c)),
                };
                prop_assert_eq!(a, b, "op {} {:?} at {}", i, op, now);
                prop_assert_eq!(new.len(), old.len(), "op {}", i);
                prop_assert_eq!(new.expires_at(), old.expires_at(), "op {}", i);
            }
        }
    }

    /// Issue 35: `limit: 100000` and one request of cost 100,000 took a
    /// 400 KB log; 1,000 such keys took 450 MiB. Now a request of any
    /// cost adds one run, and a log's memory follows its admissions.
    #[test]
    fn a_huge_cost_leaves_a_log_small() {
        let sl = SlidingLog::new(MAX_LOG_LIMIT, Nanos::from_secs(60)).unwrap();
        let mut log = Log::new();
        let t = Nanos::from_secs(1_000);
        assert!(sl.decide(&log, t, MAX_LOG_LIMIT).allowed);
        sl.commit(&mut log, t, MAX_LOG_LIMIT);
        assert_eq!(log.len(), 100_000);
        assert!(log.heap_bytes() <= 128, "{} bytes", log.heap_bytes());
        // Charges after the fact, of any cost, at a few times.
        for i in 0..10 {
            sl.charge(&mut log, Nanos(t.0 + i), u64::MAX);
        }
        assert_eq!(log.len(), 100_001);
        assert!(log.heap_bytes() <= 256, "{} bytes", log.heap_bytes());
        assert!(!sl.decide(&log, t, 1).allowed);
    }
}
