//! A compact open-addressing hash table keyed by 64-bit tags.
//!
//! Entries are `(tag, state)` pairs stored inline: 16 bytes for a timestamp
//! state, 24 for a two-word state. There is no key: the tag is a 64-bit keyed
//! hash of the client's identity, and two identities share a slot only if
//! their tags collide (about 1 in 2^64 per pair; at a million keys, odds of
//! any collision are about 3 in 100 million). Indexing multiplies the mixed
//! tag by the capacity and keeps the high word, so capacity need not be a power of
//! two and grows by 1.5x, keeping memory per key between 1.25x and 1.9x the
//! slot size. Linear probing with backward-shift deletion keeps a key's
//! probe run in one or two cache lines.

use spillway_core::{Log, Wide};

/// A state that can say when it becomes the same as a fresh one.
pub(crate) trait SlotState: Default {
    /// How a slot holds the tag and the state.
    type Slot: Slot<Self>;
    /// After this time (ns) the state is indistinguishable from a fresh one
    /// and the entry can be dropped.
    fn expires_at(&self) -> u64;
    /// Heap bytes owned beyond the slot.
    fn heap_bytes(&self) -> usize {
        0
    }
}

impl SlotState for u64 {
    type Slot = Packed<u64>;
    fn expires_at(&self) -> u64 {
        *self
    }
}

impl SlotState for Wide {
    type Slot = Packed<Wide>;
    fn expires_at(&self) -> u64 {
        self.a
    }
}

impl SlotState for Log {
    type Slot = Line<Log>;
    fn expires_at(&self) -> u64 {
        Log::expires_at(self).as_u64()
    }
    fn heap_bytes(&self) -> usize {
        Log::heap_bytes(self)
    }
}

/// A tag and its state, side by side.
pub(crate) trait Slot<S>: Default {
    fn new(tag: u64, state: S) -> Self;
    fn tag(&self) -> u64;
    fn state(&self) -> &S;
    fn state_mut(&mut self) -> &mut S;
}

/// A slot as small as its fields: 16 bytes for a timestamp, 24 for two
/// words (four or two and two-thirds to a cache line).
#[derive(Default)]
pub(crate) struct Packed<S> {
    tag: u64,
    state: S,
}

/// A slot that is one whole cache line: a 56-byte sliding log header with
/// its tag would otherwise straddle two lines in seven slots out of eight,
/// and a probe would touch twice the lines.
#[derive(Default)]
#[repr(C, align(64))]
pub(crate) struct Line<S> {
    tag: u64,
    state: S,
}

const _: () = assert!(std::mem::size_of::<Line<Log>>() == 64);

macro_rules! impl_slot {
    ($t:ident) => {
        impl<S: Default> Slot<S> for $t<S> {
            #[inline]
            fn new(tag: u64, state: S) -> Self {
                $t { tag, state }
            }
            #[inline]
            fn tag(&self) -> u64 {
                self.tag
            }
            #[inline]
            fn state(&self) -> &S {
                &self.state
            }
            #[inline]
            fn state_mut(&mut self) -> &mut S {
                &mut self.state
            }
        }
    };
}
impl_slot!(Packed);
impl_slot!(Line);

const EMPTY: u64 = 0;
/// Highest load before growing: 4/5.
const MAX_LOAD_NUM: usize = 4;
const MAX_LOAD_DEN: usize = 5;
/// Slots examined when choosing an entry to evict.
const EVICT_SAMPLE: usize = 16;

pub(crate) struct Table<S: SlotState> {
    slots: Vec<S::Slot>,
    len: usize,
}

impl<S: SlotState> Table<S> {
    pub(crate) fn new() -> Table<S> {
        Table {
            slots: Vec::new(),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<S::Slot>()
            + self
                .slots
                .iter()
                .filter(|s| s.tag() != EMPTY)
                .map(|s| s.state().heap_bytes())
                .sum::<usize>()
    }

    #[inline]
    fn home(&self, tag: u64) -> usize {
        // All tags in one shard share their top bits (they chose the shard),
        // so spread the rest over the top first: an odd multiply carries every
        // low bit upwards.
        let spread = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((u128::from(spread) * self.slots.len() as u128) >> 64) as usize
    }

    /// Asks the CPU to start loading the slot where `tag`'s probe begins:
    /// a hint that reads nothing, so the caller can overlap the cache
    /// misses of several keys before deciding each.
    #[inline]
    pub(crate) fn prefetch(&self, tag: u64) {
        if self.slots.is_empty() {
            return;
        }
        let slot: *const S::Slot = &self.slots[self.home(tag)];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `_mm_prefetch` needs SSE, which every x86_64 CPU has; a
        // prefetch never faults (any address is allowed) and writes nothing.
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(slot.cast());
            // A probe often runs on into the next line (a sliding log's
            // slot is a whole line).
            _mm_prefetch::<_MM_HINT_T0>(slot.cast::<i8>().wrapping_add(64));
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = slot;
    }

    #[inline]
    fn find(&self, tag: u64) -> Option<usize> {
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        let mut i = self.home(tag);
        loop {
            let t = self.slots[i].tag();
            if t == tag {
                return Some(i);
            }
            if t == EMPTY {
                return None;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    #[inline]
    pub(crate) fn get(&self, tag: u64) -> Option<&S> {
        self.find(tag).map(|i| self.slots[i].state())
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, tag: u64) -> Option<&mut S> {
        self.find(tag).map(|i| self.slots[i].state_mut())
    }

    /// The state for `tag`, inserted fresh if absent. `cap` bounds the
    /// entries (an entry is evicted first if the table is at `cap`); `now`
    /// tells expired entries apart.
    pub(crate) fn entry(&mut self, tag: u64, cap: usize, now: u64) -> &mut S {
        if let Some(i) = self.find(tag) {
            return self.slots[i].state_mut();
        }
        if self.len >= cap {
            self.evict_near(tag, now);
        }
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            self.purge(now);
            if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
                self.grow(cap);
            }
        }
        let i = self.free_slot(tag);
        self.slots[i] = S::Slot::new(tag, S::default());
        self.len += 1;
        self.slots[i].state_mut()
    }

    /// The first empty slot of `tag`'s probe run (the table must have one).
    fn free_slot(&self, tag: u64) -> usize {
        let n = self.slots.len();
        let mut i = self.home(tag);
        while self.slots[i].tag() != EMPTY {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        i
    }

    /// Removes the entry at `i`, shifting later members of its probe run back.
    fn remove_at(&mut self, mut i: usize) {
        let n = self.slots.len();
        self.slots[i] = S::Slot::default();
        self.len -= 1;
        let mut j = i;
        loop {
            j += 1;
            if j == n {
                j = 0;
            }
            let t = self.slots[j].tag();
            if t == EMPTY {
                return;
            }
            let h = self.home(t);
            // Move j back to i if its home is not in the cyclic range (i, j].
            let in_range = if i <= j {
                i < h && h <= j
            } else {
                i < h || h <= j
            };
            if !in_range {
                self.slots.swap(i, j);
                i = j;
            }
        }
    }

    /// Removes one entry near `tag`'s home: an expired one if the sample has
    /// one, else the one that expires soonest (the client that loses least).
    fn evict_near(&mut self, tag: u64, now: u64) {
        let n = self.slots.len();
        if n == 0 || self.len == 0 {
            return;
        }
        let mut i = self.home(tag);
        let mut best: Option<(usize, u64)> = None;
        let mut seen = 0;
        let mut scanned = 0;
        while seen < EVICT_SAMPLE && scanned < n {
            let slot = &self.slots[i];
            if slot.tag() != EMPTY {
                let e = slot.state().expires_at();
                if e <= now {
                    best = Some((i, e));
                    break;
                }
                if best.is_none_or(|(_, be)| e < be) {
                    best = Some((i, e));
                }
                seen += 1;
            }
            scanned += 1;
            i += 1;
            if i == n {
                i = 0;
            }
        }
        if let Some((i, _)) = best {
            self.remove_at(i);
        }
    }

    /// Drops every entry that has expired by `now`. Returns how many.
    pub(crate) fn purge(&mut self, now: u64) -> usize {
        let before = self.len;
        if before == 0 {
            return 0;
        }
        let live: Vec<S::Slot> = std::mem::take(&mut self.slots)
            .into_iter()
            .filter(|s| s.tag() != EMPTY && s.state().expires_at() > now)
            .collect();
        let target = if live.is_empty() {
            0
        } else {
            (live.len() * MAX_LOAD_DEN / MAX_LOAD_NUM + 1)
                .max(live.len() * 3 / 2)
                .max(8)
        };
        self.rebuild(live, target);
        before - self.len
    }

    /// Drops expired entries among up to `budget` slots from `start`;
    /// returns where to continue (0 after the end).
    pub(crate) fn purge_some(&mut self, start: usize, budget: usize, now: u64) -> usize {
        let n = self.slots.len();
        let mut i = start.min(n);
        let end = (start + budget).min(n);
        while i < end {
            let slot = &self.slots[i];
            if slot.tag() != EMPTY && slot.state().expires_at() <= now {
                // The shift may move a later entry into i: look at i again.
                self.remove_at(i);
                continue;
            }
            i += 1;
        }
        if end >= n { 0 } else { end }
    }

    fn grow(&mut self, cap: usize) {
        let want = (self.slots.len() * 3 / 2).max(8);
        // Never size far beyond what the cap can fill.
        let limit = cap.saturating_mul(MAX_LOAD_DEN) / MAX_LOAD_NUM + 8;
        let new_len = want.min(limit).max(self.len + 2);
        let old = std::mem::take(&mut self.slots);
        let live = old.into_iter().filter(|s| s.tag() != EMPTY).collect();
        self.rebuild(live, new_len);
    }

    fn rebuild(&mut self, live: Vec<S::Slot>, slots: usize) {
        let mut v = Vec::with_capacity(slots);
        v.resize_with(slots, S::Slot::default);
        self.slots = v;
        self.len = 0;
        for slot in live {
            let i = self.free_slot(slot.tag());
            self.slots[i] = slot;
            self.len += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_find_remove_keeps_every_other_key() {
        let mut t: Table<u64> = Table::new();
        let tags: Vec<u64> = (1..2000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
            .collect();
        for (i, &tag) in tags.iter().enumerate() {
            *t.entry(tag, usize::MAX, 0) = i as u64 + 100;
        }
        assert_eq!(t.len(), tags.len());
        for (i, &tag) in tags.iter().enumerate() {
            assert_eq!(t.get(tag), Some(&(i as u64 + 100)));
        }
        // Expire every other entry and purge incrementally.
        for (i, &tag) in tags.iter().enumerate() {
            if i % 2 == 0 {
                *t.entry(tag, usize::MAX, 0) = 1;
            }
        }
        let mut at = 0;
        loop {
            at = t.purge_some(at, 97, 50);
            if at == 0 {
                break;
            }
        }
        for (i, &tag) in tags.iter().enumerate() {
            if i % 2 == 0 {
                assert_eq!(t.get(tag), None);
            } else {
                assert_eq!(t.get(tag), Some(&(i as u64 + 100)), "tag {i}");
            }
        }
    }

    /// Regression: a purge that kept a handful of live entries sized the
    /// table to zero slots and the reinsert indexed an empty table (a panic
    /// under load in the server).
    #[test]
    fn purge_keeping_few_entries_then_growing_does_not_panic() {
        let mut t: Table<u64> = Table::new();
        // Six entries: three expire at 10, three live until 1000.
        for i in 1..=6u64 {
            *t.entry(i.wrapping_mul(0x1234_5678_9abc_def1), usize::MAX, 0) =
                if i % 2 == 0 { 10 } else { 1000 };
        }
        // Force purges with few survivors while inserting more keys at time 20.
        for i in 7..200u64 {
            *t.entry(i.wrapping_mul(0x1234_5678_9abc_def1), usize::MAX, 20) = 1000;
        }
        for i in (1..=6u64).filter(|i| i % 2 == 1) {
            assert_eq!(t.get(i.wrapping_mul(0x1234_5678_9abc_def1)), Some(&1000));
        }
        assert_eq!(t.purge(2000), 196);
        assert_eq!(t.len(), 0);
        *t.entry(42, usize::MAX, 2000) = 1;
        assert_eq!(t.get(42), Some(&1));
    }

    #[test]
    fn cap_is_never_exceeded_and_soonest_expiring_goes_first() {
        let mut t: Table<u64> = Table::new();
        for i in 1..=1000u64 {
            *t.entry(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), 100, 0) = 1_000_000 + i;
            assert!(t.len() <= 100);
        }
        assert_eq!(t.len(), 100);
        // The slots hold no more than the cap allows for.
        assert!(t.slots.len() <= 100 * 5 / 4 + 8);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// The table behaves like a map from tag to state, whatever the mix of
        /// inserts, updates, purges, sweeps and a cap.
        #[test]
        fn table_matches_a_map_model(
            ops in proptest::collection::vec((0u8..5, 1u64..64, 0u64..100), 1..400),
            cap in 1usize..80,
        ) {
            let mut t: Table<u64> = Table::new();
            let mut model = std::collections::HashMap::<u64, u64>::new();
            let mut now = 0u64;
            let mut cursor = 0;
            for (op, k, v) in ops {
                let tag = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                match op {
                    0 | 1 => {
                        if !model.contains_key(&tag) && model.len() >= cap {
                            // The table evicts one entry of its choosing.
                            *t.entry(tag, cap, now) = now + v;
                            model.retain(|k, _| t.get(*k).is_some());
                        } else {
                            *t.entry(tag, cap, now) = now + v;
                        }
                        model.insert(tag, now + v);
                    }
                    2 => now += v,
                    3 => {
                        t.purge(now);
                        model.retain(|_, e| *e > now);
                    }
                    _ => {
                        cursor = t.purge_some(cursor, 7, now);
                        // Entries not visited may stay; visited expired ones go.
                        model.retain(|k, _| t.get(*k).is_some());
                    }
                }
                // The table may drop expired entries whenever it likes
                // (they equal fresh ones), and nothing else.
                for (k, e) in &model {
                    proptest::prop_assert!(t.get(*k).is_some() || *e <= now, "lost a live entry");
                }
                model.retain(|k, _| t.get(*k).is_some());
                proptest::prop_assert!(t.len() <= cap);
                proptest::prop_assert_eq!(t.len(), model.len());
                for (k, e) in &model {
                    proptest::prop_assert_eq!(t.get(*k), Some(e));
                }
            }
        }
    }
}
