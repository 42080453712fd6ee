//! The sliding log's storage: a few offsets inline in the log itself, more
//! in a heap ring. Short logs (the common case: a handful of login attempts)
//! then live in the store's slot next to their key, and a decision touches
//! one cache line instead of two.

use std::collections::VecDeque;

/// Offsets kept inline before moving to the heap.
pub(crate) const INLINE: usize = 7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ring {
    /// Oldest first, `len` used.
    Inline { len: u8, buf: [u32; INLINE] },
    /// Boxed so the inline form sets the size: a log then fits with its key
    /// in one 64-byte slot (an unboxed `VecDeque` is 32 bytes by itself).
    #[allow(clippy::box_collection)]
    Heap(Box<VecDeque<u32>>),
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
    pub(crate) fn len(&self) -> usize {
        match self {
            Ring::Inline { len, .. } => usize::from(*len),
            Ring::Heap(v) => v.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Ring::Inline { buf, .. } => buf[i],
            Ring::Heap(v) => v[i],
        }
    }

    pub(crate) fn front(&self) -> Option<u32> {
        (!self.is_empty()).then(|| self.get(0))
    }

    /// Index of the first entry for which `pred` is false (entries for which
    /// it is true come first).
    pub(crate) fn partition_point(&self, pred: impl Fn(u32) -> bool) -> usize {
        match self {
            Ring::Inline { len, buf } => buf[..usize::from(*len)].partition_point(|&o| pred(o)),
            Ring::Heap(v) => v.partition_point(|&o| pred(o)),
        }
    }

    /// Drops the `k` oldest entries (all of them without reading any).
    pub(crate) fn drop_front(&mut self, k: usize) {
        match self {
            Ring::Inline { len, buf } => {
                let n = usize::from(*len);
                let k = k.min(n);
                buf.copy_within(k..n, 0);
                *len = (n - k) as u8;
            }
            Ring::Heap(v) if k >= v.len() => v.clear(),
            Ring::Heap(v) => {
                v.drain(..k);
            }
        }
    }

    /// Appends `n` copies of `x`, growing a heap ring by doubling but never
    /// beyond `max` entries of capacity (a full log holds exactly `max`).
    pub(crate) fn push_n(&mut self, x: u32, n: usize, max: usize) {
        let want = self.len() + n;
        if let Ring::Inline { len, buf } = self {
            let have = usize::from(*len);
            if want <= INLINE {
                buf[have..want].fill(x);
                *len = want as u8;
                return;
            }
            let cap = want.max(INLINE * 2).min(max).max(want);
            let mut v = VecDeque::with_capacity(cap);
            v.extend(&buf[..have]);
            *self = Ring::Heap(Box::new(v));
        }
        if let Ring::Heap(v) = self {
            if v.capacity() < want {
                let cap = want.max(v.capacity() * 2).min(max).max(want);
                v.reserve_exact(cap - v.len());
            }
            v.extend(std::iter::repeat_n(x, n));
        }
    }

    /// Applies `f` to every entry.
    pub(crate) fn for_each_mut(&mut self, mut f: impl FnMut(&mut u32)) {
        match self {
            Ring::Inline { len, buf } => buf[..usize::from(*len)].iter_mut().for_each(&mut f),
            Ring::Heap(v) => v.iter_mut().for_each(f),
        }
    }

    /// Moves a heap ring that has shrunk a lot to a tighter allocation, or
    /// back inline once it is down to half the inline size (not at the
    /// inline size itself, so a log hovering there does not move back and
    /// forth on every request).
    pub(crate) fn shrink(&mut self) {
        if let Ring::Heap(v) = self {
            if v.len() <= INLINE / 2 {
                let mut buf = [0; INLINE];
                for (i, o) in v.iter().enumerate() {
                    buf[i] = *o;
                }
                *self = Ring::Inline {
                    len: v.len() as u8,
                    buf,
                };
            } else if v.capacity() > 2 * v.len() + 8 {
                v.shrink_to_fit();
            }
        }
    }

    /// Bytes allocated on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Ring::Inline { .. } => 0,
            Ring::Heap(v) => v.capacity() * 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
