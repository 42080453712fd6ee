//! The sliding log as it was before its heap ring held runs (one offset
//! per unit of cost), kept for tests only: the property test
//! `runs_decide_as_the_flat_log_did` drives it and the current log with
//! the same sequences and compares every verdict (issue 35).
#![allow(dead_code, unreachable_pub, clippy::all)]

use super::SlidingLog;
use crate::algo::Verdict;
use crate::time::Nanos;

impl SlidingLog {
    /// Decides `cost` at `now` against `log`, without changing it. Call
    /// [`SlidingLog::commit`] to charge an admitted request.
    pub(super) fn old_decide(&self, log: &OldLog, now: Nanos, cost: u64) -> Verdict {
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
    pub(super) fn old_commit(&self, log: &mut OldLog, now: Nanos, cost: u64) {
        self.old_log(log, now, cost, self.limit);
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
    pub(super) fn old_charge(&self, log: &mut OldLog, now: Nanos, cost: u64) -> Verdict {
        let keep = self.limit + 1;
        self.old_expire(log, now);
        let n = cost.min(keep);
        let over = (log.ring.len() as u64 + n).saturating_sub(keep);
        log.ring
            .drop_front(usize::try_from(over).unwrap_or(usize::MAX));
        log.first = log.ring.front().unwrap_or(0);
        self.old_log(log, now, n, keep);
        self.old_decide(log, now, 0)
    }

    /// Drops the entries that have left the window ending at `now`.
    fn old_expire(&self, log: &mut OldLog, now: Nanos) {
        let live = log.live_from(now.0, self.window.0, self.shift);
        log.ring.drop_front(live);
        log.first = log.ring.front().unwrap_or(0);
    }

    /// Logs up to `cost` entries at `now`, as many as keep the log within
    /// `max` entries.
    fn old_log(&self, log: &mut OldLog, now: Nanos, cost: u64, max: u64) {
        let w = self.window.0;
        self.old_expire(log, now);
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
/// base, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct OldLog {
    /// Time of offset 0, in ns.
    base: u64,
    /// When every entry has left the window (the log is then as good as empty).
    expires: u64,
    /// Copies of the oldest and newest offsets (valid when the ring is not
    /// empty), so a decision that expires nothing reads only this header,
    /// not the ring's heap buffer: one cache miss less at large key counts.
    first: u32,
    last: u32,
    ring: OldRing,
}

impl OldLog {
    /// An empty log.
    pub(super) fn new() -> OldLog {
        OldLog::default()
    }

    /// The time after which the log holds nothing that counts.
    pub(super) fn expires_at(&self) -> Nanos {
        Nanos(self.expires)
    }

    /// Entries currently stored (some may have left the window).
    pub(super) fn len(&self) -> usize {
        self.ring.len()
    }

    /// True if nothing is stored.
    pub(super) fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Bytes allocated for entries.
    pub(super) fn heap_bytes(&self) -> usize {
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

// The sliding log's storage: a few offsets inline in the log itself, more

use std::collections::VecDeque;

/// Offsets kept inline before moving to the heap.
const INLINE: usize = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
enum OldRing {
    /// Oldest first, `len` used.
    Inline { len: u8, buf: [u32; INLINE] },
    /// Boxed so the inline form sets the size: a log then fits with its key
    /// in one 64-byte slot (an unboxed `VecDeque` is 32 bytes by itself).
    #[allow(clippy::box_collection)]
    Heap(Box<VecDeque<u32>>),
}

impl Default for OldRing {
    fn default() -> OldRing {
        OldRing::Inline {
            len: 0,
            buf: [0; INLINE],
        }
    }
}

impl OldRing {
    fn len(&self) -> usize {
        match self {
            OldRing::Inline { len, .. } => usize::from(*len),
            OldRing::Heap(v) => v.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn get(&self, i: usize) -> u32 {
        match self {
            OldRing::Inline { buf, .. } => buf[i],
            OldRing::Heap(v) => v[i],
        }
    }

    fn front(&self) -> Option<u32> {
        (!self.is_empty()).then(|| self.get(0))
    }

    /// Index of the first entry for which `pred` is false (entries for which
    /// it is true come first).
    fn partition_point(&self, pred: impl Fn(u32) -> bool) -> usize {
        match self {
            OldRing::Inline { len, buf } => buf[..usize::from(*len)].partition_point(|&o| pred(o)),
            OldRing::Heap(v) => v.partition_point(|&o| pred(o)),
        }
    }

    /// Drops the `k` oldest entries (all of them without reading any).
    fn drop_front(&mut self, k: usize) {
        match self {
            OldRing::Inline { len, buf } => {
                let n = usize::from(*len);
                let k = k.min(n);
                buf.copy_within(k..n, 0);
                *len = (n - k) as u8;
            }
            OldRing::Heap(v) if k >= v.len() => v.clear(),
            OldRing::Heap(v) => {
                v.drain(..k);
            }
        }
    }

    /// Appends `n` copies of `x`, growing a heap ring by doubling but never
    /// beyond `max` entries of capacity (a full log holds exactly `max`).
    fn push_n(&mut self, x: u32, n: usize, max: usize) {
        let want = self.len() + n;
        if let OldRing::Inline { len, buf } = self {
            let have = usize::from(*len);
            if want <= INLINE {
                buf[have..want].fill(x);
                *len = want as u8;
                return;
            }
            let cap = want.max(INLINE * 2).min(max).max(want);
            let mut v = VecDeque::with_capacity(cap);
            v.extend(&buf[..have]);
            *self = OldRing::Heap(Box::new(v));
        }
        if let OldRing::Heap(v) = self {
            if v.capacity() < want {
                let cap = want.max(v.capacity() * 2).min(max).max(want);
                v.reserve_exact(cap - v.len());
            }
            v.extend(std::iter::repeat_n(x, n));
        }
    }

    /// Applies `f` to every entry.
    fn for_each_mut(&mut self, mut f: impl FnMut(&mut u32)) {
        match self {
            OldRing::Inline { len, buf } => buf[..usize::from(*len)].iter_mut().for_each(&mut f),
            OldRing::Heap(v) => v.iter_mut().for_each(f),
        }
    }

    /// Moves a heap ring that has shrunk a lot to a tighter allocation, or
    /// back inline once it is down to half the inline size (not at the
    /// inline size itself, so a log hovering there does not move back and
    /// forth on every request).
    fn shrink(&mut self) {
        if let OldRing::Heap(v) = self {
            if v.len() <= INLINE / 2 {
                let mut buf = [0; INLINE];
                for (i, o) in v.iter().enumerate() {
                    buf[i] = *o;
                }
                *self = OldRing::Inline {
                    len: v.len() as u8,
                    buf,
                };
            } else if v.capacity() > 2 * v.len() + 8 {
                v.shrink_to_fit();
            }
        }
    }

    /// Bytes allocated on the heap.
    fn heap_bytes(&self) -> usize {
        match self {
            OldRing::Inline { .. } => 0,
            OldRing::Heap(v) => v.capacity() * 4,
        }
    }
}
