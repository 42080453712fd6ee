//! The sliding log's storage: a few offsets inline in the log itself, more
//! in a heap ring of runs. Short logs (the common case: a handful of login
//! attempts) then live in the store's slot next to their key, and a
//! decision touches one cache line instead of two.
//!
//! The heap form stores equal offsets once, with a count (run-length):
//! a request of cost `k` is one run, not `k` entries, so a log's memory
//! grows with the distinct times it admitted, never with what they cost.
//! (One entry per unit let `cost: 100000` on a log of limit 100,000 take
//! 400 KB per key in one request: 1,000 such requests took 450 MiB.)
//! Every operation still speaks in units, as the flat form did: `len`,
//! `get(i)`, `partition_point` and `drop_front` count each unit of a run.

use std::collections::VecDeque;

/// Offsets (one per unit) kept inline before moving to the heap.
pub(crate) const INLINE: usize = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ring {
    /// Oldest first, `len` used, one offset per unit.
    Inline { len: u8, buf: [u32; INLINE] },
    /// Boxed so the inline form sets the size: a log then fits with its key
    /// in one 64-byte slot (an unboxed `VecDeque` is 32 bytes by itself).
    Heap(Box<Runs>),
}

/// Runs of equal offsets, oldest first: `offs[j]` the offset, `ends[j]`
/// the count of units through run `j` since some origin, so a unit's
/// index is found by binary search, and dropping part of the first run
/// only moves `start`. Two arrays, not one of pairs, so the search by time
/// (every decision that expires something) reads 4-byte offsets, as the
/// flat ring did. Counts wrap (a key may charge 2^32 units in its life):
/// only differences from `start` are read, and a log holds at most
/// [`MAX_LOG_LIMIT`](super::MAX_LOG_LIMIT)` + 1` units, far below 2^32.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Runs {
    offs: VecDeque<u32>,
    ends: VecDeque<u32>,
    /// The count before the first unit kept.
    start: u32,
    /// Units held (what `len` answers on every decision: one load, as
    /// the flat ring's length was).
    units: u32,
}

impl Runs {
    /// Units through a run whose end is `end` (relative to the first
    /// unit kept).
    #[inline]
    fn through(&self, end: u32) -> usize {
        end.wrapping_sub(self.start) as usize
    }

    fn len(&self) -> usize {
        self.units as usize
    }

    /// The run holding unit `i`.
    fn run_of(&self, i: usize) -> usize {
        self.ends.partition_point(|&e| self.through(e) <= i)
    }

    /// Appends `n` units at `x`: onto the last run if it has that offset.
    fn push(&mut self, x: u32, n: u32, max: usize) {
        self.units = self.units.wrapping_add(n);
        let end = self.ends.back().copied().unwrap_or(self.start);
        if self.offs.back() == Some(&x) {
            if let Some(e) = self.ends.back_mut() {
                *e = end.wrapping_add(n);
            }
            return;
        }
        let len = self.offs.len();
        if self.offs.capacity() == len {
            // Doubling, never beyond `max` runs (a run holds at least one
            // unit, a full log `max` units).
            let cap = (len * 2).max(INLINE).min(max).max(len + 1);
            self.offs.reserve_exact(cap - len);
            self.ends.reserve_exact(cap - len);
        }
        self.offs.push_back(x);
        self.ends.push_back(end.wrapping_add(n));
    }
}

impl Default for Ring {
    fn default() -> Ring {
        Ring::Inline {
            len: 0,
            buf: [0; INLINE],
        }
    }
}

impl Ring {
    /// Units stored.
    pub(crate) fn len(&self) -> usize {
        match self {
            Ring::Inline { len, .. } => usize::from(*len),
            Ring::Heap(r) => r.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The offset of unit `i` (oldest first).
    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Ring::Inline { buf, .. } => buf[i],
            // A denial asks for the oldest live unit (usually in the
            // first run): one look before the binary search.
            Ring::Heap(r) => match r.ends.front() {
                Some(&e) if i < r.through(e) => r.offs[0],
                _ => r.offs[r.run_of(i)],
            },
        }
    }

    pub(crate) fn front(&self) -> Option<u32> {
        (!self.is_empty()).then(|| self.get(0))
    }

    /// Index of the first unit for which `pred` is false (units for which
    /// it is true come first).
    pub(crate) fn partition_point(&self, pred: impl Fn(u32) -> bool) -> usize {
        match self {
            Ring::Inline { len, buf } => buf[..usize::from(*len)].partition_point(|&o| pred(o)),
            Ring::Heap(r) => match r.offs.partition_point(|&o| pred(o)) {
                0 => 0,
                j => r.through(r.ends[j - 1]),
            },
        }
    }

    /// Drops the `k` oldest units (all of them without reading any).
    pub(crate) fn drop_front(&mut self, k: usize) {
        match self {
            Ring::Inline { len, buf } => {
                let n = usize::from(*len);
                let k = k.min(n);
                buf.copy_within(k..n, 0);
                *len = (n - k) as u8;
            }
            Ring::Heap(r) if k >= r.len() => {
                r.start = r.ends.back().copied().unwrap_or(r.start);
                r.offs.clear();
                r.ends.clear();
                r.units = 0;
            }
            Ring::Heap(r) => {
                // Runs wholly dropped leave from the front, one look each
                // (each run leaves once: a decision that expires one unit
                // costs no search).
                while let Some(&e) = r.ends.front() {
                    if r.through(e) > k {
                        break;
                    }
                    r.ends.pop_front();
                    r.offs.pop_front();
                }
                // `k < len`, so it fits the 32 bits counts wrap in.
                r.start = r.start.wrapping_add(k as u32);
                r.units -= k as u32;
            }
        }
    }

    /// Appends `n` units at `x` (at or after the newest), growing a heap
    /// ring by doubling but never beyond `max` runs of capacity.
    pub(crate) fn push_n(&mut self, x: u32, n: usize, max: usize) {
        if n == 0 {
            return;
        }
        let want = self.len() + n;
        if let Ring::Inline { len, buf } = self {
            let have = usize::from(*len);
            if want <= INLINE {
                buf[have..want].fill(x);
                *len = want as u8;
                return;
            }
            let mut runs = Runs::default();
            for &o in &buf[..have] {
                runs.push(o, 1, max);
            }
            *self = Ring::Heap(Box::new(runs));
        }
        if let Ring::Heap(r) = self {
            // A log holds at most `MAX_LOG_LIMIT + 1` units: `n` fits.
            r.push(x, u32::try_from(n).unwrap_or(u32::MAX), max);
        }
    }

    /// Applies `f` to every offset.
    pub(crate) fn for_each_mut(&mut self, mut f: impl FnMut(&mut u32)) {
        match self {
            Ring::Inline { len, buf } => buf[..usize::from(*len)].iter_mut().for_each(&mut f),
            Ring::Heap(r) => r.offs.iter_mut().for_each(f),
        }
    }

    /// Moves a heap ring that has shrunk a lot to a tighter allocation, or
    /// back inline once it is down to half the inline size in units (not
    /// at the inline size itself, so a log hovering there does not move
    /// back and forth on every request).
    pub(crate) fn shrink(&mut self) {
        if let Ring::Heap(r) = self {
            let units = r.len();
            if units <= INLINE / 2 {
                let mut buf = [0; INLINE];
                for (i, b) in buf.iter_mut().enumerate().take(units) {
                    *b = r.offs[r.run_of(i)];
                }
                *self = Ring::Inline {
                    len: units as u8,
                    buf,
                };
            } else if r.offs.capacity() > 2 * r.offs.len() + 8 {
                r.offs.shrink_to_fit();
                r.ends.shrink_to_fit();
            }
        }
    }

    /// Bytes allocated on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Ring::Inline { .. } => 0,
            Ring::Heap(r) => {
                std::mem::size_of::<Runs>() + (r.offs.capacity() + r.ends.capacity()) * 4
            }
        }
    }

    /// Runs stored (the inline form's units count one each).
    #[cfg(test)]
    pub(crate) fn runs(&self) -> usize {
        match self {
            Ring::Inline { len, .. } => usize::from(*len),
            Ring::Heap(r) => r.offs.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_log_and_its_tag_fit_one_cache_line() {
        assert!(std::mem::size_of::<(u64, crate::algo::Log)>() <= 64);
    }

    #[test]
    fn grows_to_the_heap_and_back_keeping_order() {
        let mut r = Ring::default();
        for i in 0..20u32 {
            r.push_n(i, 1, 100);
            assert_eq!(r.len(), i as usize + 1);
            assert_eq!(r.front(), Some(0));
        }
        assert!(matches!(r, Ring::Heap(_)));
        assert_eq!(r.partition_point(|o| o < 7), 7);
        r.drop_front(17);
        assert_eq!((r.len(), r.front()), (3, Some(17)));
        r.shrink();
        assert!(matches!(r, Ring::Inline { .. }));
        assert_eq!((0..3).map(|i| r.get(i)).collect::<Vec<_>>(), [17, 18, 19]);
        r.push_n(30, 4, 5);
        assert_eq!(r.len(), 7);
        r.drop_front(100);
        assert!(r.is_empty());
    }

    /// Issue 35: a cost of 100,000 is one run of 8 bytes, not 100,000
    /// entries of 4 (400 KB).
    #[test]
    fn a_huge_cost_is_one_run() {
        let mut r = Ring::default();
        r.push_n(5, 100_000, 100_001);
        r.push_n(5, 1, 100_001);
        r.push_n(9, 1, 100_001);
        assert_eq!((r.len(), r.runs()), (100_002, 2));
        assert!(r.heap_bytes() <= 128, "{}", r.heap_bytes());
        assert_eq!((r.get(100_000), r.get(100_001)), (5, 9));
        r.drop_front(99_999);
        assert_eq!((r.len(), r.runs(), r.front()), (3, 2, Some(5)));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32, usize),
        Drop(usize),
        Shrink,
        Shift(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..4, prop_oneof![3 => 1usize..3, 1 => 1usize..40]).prop_map(|(d, n)| Op::Push(d, n)),
            2 => (0usize..30).prop_map(Op::Drop),
            1 => Just(Op::Shrink),
            1 => (0u32..3).prop_map(Op::Shift),
        ]
    }

    proptest! {
        /// Old against new: the run-length ring answers every question the
        /// sliding log asks exactly as the flat ring of one offset per
        /// unit did (modelled by a `VecDeque<u32>`), on any sequence of
        /// appends (of equal or later offsets), drops, shrinks and rebases.
        #[test]
        fn runs_answer_as_one_offset_per_unit(ops in proptest::collection::vec(op(), 1..80)) {
            let (mut r, mut flat) = (Ring::default(), VecDeque::<u32>::new());
            let max = 120;
            for op in ops {
                match op {
                    Op::Push(d, n) => {
                        let n = n.min(max - flat.len().min(max));
                        let x = flat.back().copied().unwrap_or(10) + d;
                        r.push_n(x, n, max);
                        flat.extend(std::iter::repeat_n(x, n));
                    }
                    Op::Drop(k) => {
                        r.drop_front(k);
                        flat.drain(..k.min(flat.len()));
                    }
                    Op::Shrink => r.shrink(),
                    Op::Shift(s) => {
                        let s = s.min(flat.front().copied().unwrap_or(0));
                        r.for_each_mut(|o| *o -= s);
                        flat.iter_mut().for_each(|o| *o -= s);
                    }
                }
                prop_assert_eq!(r.len(), flat.len());
                prop_assert_eq!(r.is_empty(), flat.is_empty());
                prop_assert_eq!(r.front(), flat.front().copied());
                for (i, &o) in flat.iter().enumerate() {
                    prop_assert_eq!(r.get(i), o);
                }
                for cut in 0..flat.back().map_or(1, |b| b + 2) {
                    prop_assert_eq!(r.partition_point(|o| o < cut), flat.partition_point(|&o| o < cut));
                }
                // Runs never outnumber distinct offsets.
                let mut distinct: Vec<u32> = flat.iter().copied().collect();
                distinct.dedup();
                let inline = matches!(r, Ring::Inline { .. });
                prop_assert!(inline || r.runs() == distinct.len());
            }
        }
    }
}
