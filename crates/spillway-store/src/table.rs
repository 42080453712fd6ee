//! A compact open-addressing hash table keyed by 64-bit tags.
//!
//! Entries are `(tag, state)` pairs stored inline: 16 bytes for a timestamp
//! state, 24 for a two-word state. There is no key: the tag is a 64-bit keyed
//! hash of the client's identity, and two identities share a slot only if
//! their tags collide. The tag's two lowest bits hold the entry's
//! [eviction marks](META) instead, so 62 bits tell keys apart (about 1 in
//! 2^62 per pair; at a million keys, odds of any collision are about 1 in
//! 10 million). Indexing multiplies the mixed
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
    /// True if the state is the same as a fresh one at `now` (a bucket full
    /// again, a window over): dropping it changes no future decision.
    #[inline]
    fn at_rest(&self, now: u64) -> bool {
        self.expires_at() <= now
    }
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

/// A tag and its state, side by side. The tag word also holds the
/// entry's marks (see [`META`]).
pub(crate) trait Slot<S>: Default {
    fn new(tag: u64, state: S) -> Self;
    /// The tag word: the tag and the marks.
    fn word(&self) -> u64;
    fn parts_mut(&mut self) -> (&mut u64, &mut S);
    fn state(&self) -> &S;
    /// The tag without the marks.
    #[inline]
    fn tag(&self) -> u64 {
        self.word() & !META
    }
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
            fn word(&self) -> u64 {
                self.tag
            }
            #[inline]
            fn parts_mut(&mut self) -> (&mut u64, &mut S) {
                (&mut self.tag, &mut self.state)
            }
            #[inline]
            fn state(&self) -> &S {
                &self.state
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
/// Entries examined when choosing one to evict.
const EVICT_SAMPLE: usize = 16;

/// The marks kept in a tag word's two lowest bits: what eviction needs to
/// know about an entry without knowing its limit, at no cost in size.
pub(crate) const META: u64 = REFERENCED | LIMITING;
/// The entry was used since an eviction last looked at it (the bit of the
/// CLOCK approximation of LRU): set on every decision, cleared as an
/// eviction passes over the entry. New entries start without it, so a
/// flood of keys used once goes before keys in use.
const REFERENCED: u64 = 1;
/// The entry's last decision denied, or left less than its cost: the
/// client is being limited, and dropping its state would hand it a fresh
/// allowance. Such an entry is never evicted before it is at rest.
const LIMITING: u64 = 2;

/// The tag as the table stores it: marks cleared, never [`EMPTY`].
#[inline]
fn norm(tag: u64) -> u64 {
    let t = tag & !META;
    if t == EMPTY { META + 1 } else { t }
}

/// An entry found or inserted: its state, and its marks to update.
pub(crate) struct EntryMut<'a, S> {
    word: &'a mut u64,
    /// The entry's state.
    pub(crate) state: &'a mut S,
}

impl<S> EntryMut<'_, S> {
    /// Records a decision on this entry: it was used, and whether its
    /// client is now limited (see [`LIMITING`]). Writes only on a change.
    #[inline]
    pub(crate) fn mark(&mut self, limiting: bool) {
        let m = REFERENCED | if limiting { LIMITING } else { 0 };
        let w = (*self.word & !META) | m;
        if w != *self.word {
            *self.word = w;
        }
    }

    /// Records a use that changed nothing (a verdict not charged).
    #[inline]
    pub(crate) fn touch(&mut self) {
        if *self.word & REFERENCED == 0 {
            *self.word |= REFERENCED;
        }
    }
}

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
                .filter(|s| s.word() != EMPTY)
                .map(|s| s.state().heap_bytes())
                .sum::<usize>()
    }

    /// `tag` must be [`norm`]ed.
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
        let slot: *const S::Slot = &self.slots[self.home(norm(tag))];
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

    /// `tag` must be [`norm`]ed.
    #[inline]
    fn find(&self, tag: u64) -> Option<usize> {
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        let mut i = self.home(tag);
        loop {
            let w = self.slots[i].word();
            if w & !META == tag {
                return Some(i);
            }
            if w == EMPTY {
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
        self.find(norm(tag)).map(|i| self.slots[i].state())
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, tag: u64) -> Option<EntryMut<'_, S>> {
        let i = self.find(norm(tag))?;
        Some(self.entry_at(i))
    }

    #[inline]
    fn entry_at(&mut self, i: usize) -> EntryMut<'_, S> {
        let (word, state) = self.slots[i].parts_mut();
        EntryMut { word, state }
    }

    /// Whether [`entry`](Self::entry) would find room for `tag`: the table
    /// is below `cap`, or an entry near `tag`'s slot may be evicted.
    #[inline]
    pub(crate) fn has_room(&self, tag: u64, cap: usize, now: u64) -> bool {
        self.len < cap || self.victim(norm(tag), now).is_some()
    }

    /// The entry for `tag`, inserted fresh if absent. `cap` bounds the
    /// entries: at `cap`, an entry near `tag`'s slot is evicted first (see
    /// [`victim`](Self::victim)), and if none may go, `tag` is not stored
    /// and the answer is `None`. `now` tells entries at rest apart.
    pub(crate) fn entry(&mut self, tag: u64, cap: usize, now: u64) -> Option<EntryMut<'_, S>> {
        let tag = norm(tag);
        if let Some(i) = self.find(tag) {
            return Some(self.entry_at(i));
        }
        if self.len >= cap {
            let (i, at_rest) = self.victim(tag, now)?;
            if !at_rest {
                self.age_near(tag);
            }
            self.remove_at(i);
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
        Some(self.entry_at(i))
    }

    /// The first empty slot of `tag`'s probe run (the table must have one).
    fn free_slot(&self, tag: u64) -> usize {
        let n = self.slots.len();
        let mut i = self.home(tag);
        while self.slots[i].word() != EMPTY {
            i += 1;
            if i == n {
                i = 0;
            }
        }
        i
    }

    /// Removes the entry of `tag`, if held; returns whether it was.
    pub(crate) fn remove(&mut self, tag: u64) -> bool {
        match self.find(norm(tag)) {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
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
            if self.slots[j].word() == EMPTY {
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

    /// The entry to evict for `tag`, among the [`EVICT_SAMPLE`] entries
    /// from its home on, and whether it is at rest. In order of preference:
    /// an entry at rest (its loss changes no decision); else an entry not
    /// [`LIMITING`], unreferenced before referenced (the CLOCK's least
    /// recently used), then the one that expires soonest (the client that
    /// loses least). `None` if every entry sampled is limiting: evicting one
    /// would re-admit a client being denied.
    fn victim(&self, tag: u64, now: u64) -> Option<(usize, bool)> {
        let n = self.slots.len();
        if n == 0 || self.len == 0 {
            return None;
        }
        let mut i = self.home(tag);
        let mut best: Option<(usize, (u64, u64))> = None;
        let mut seen = 0;
        let mut scanned = 0;
        while seen < EVICT_SAMPLE && scanned < n {
            let slot = &self.slots[i];
            let w = slot.word();
            if w != EMPTY {
                if slot.state().at_rest(now) {
                    return Some((i, true));
                }
                if w & LIMITING == 0 {
                    let rank = (w & REFERENCED, slot.state().expires_at());
                    if best.is_none_or(|(_, b)| rank < b) {
                        best = Some((i, rank));
                    }
                }
                seen += 1;
            }
            scanned += 1;
            i += 1;
            if i == n {
                i = 0;
            }
        }
        best.map(|(i, _)| (i, false))
    }

    /// Clears [`REFERENCED`] on the entries [`victim`](Self::victim) looked
    /// at for `tag`: the CLOCK hand passing. An entry used again before the
    /// next eviction near it gets its mark back; one that is not goes first.
    fn age_near(&mut self, tag: u64) {
        let n = self.slots.len();
        let mut i = self.home(tag);
        let mut seen = 0;
        let mut scanned = 0;
        while seen < EVICT_SAMPLE && scanned < n {
            let (w, _) = self.slots[i].parts_mut();
            if *w != EMPTY {
                *w &= !REFERENCED;
                seen += 1;
            }
            scanned += 1;
            i += 1;
            if i == n {
                i = 0;
            }
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
            .filter(|s| s.word() != EMPTY && !s.state().at_rest(now))
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
            if slot.word() != EMPTY && slot.state().at_rest(now) {
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
        let live = old.into_iter().filter(|s| s.word() != EMPTY).collect();
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
            *t.entry(tag, usize::MAX, 0).unwrap().state = i as u64 + 100;
        }
        assert_eq!(t.len(), tags.len());
        for (i, &tag) in tags.iter().enumerate() {
            assert_eq!(t.get(tag), Some(&(i as u64 + 100)));
        }
        // Expire every other entry and purge incrementally.
        for (i, &tag) in tags.iter().enumerate() {
            if i % 2 == 0 {
                *t.entry(tag, usize::MAX, 0).unwrap().state = 1;
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

    /// Removing keys one by one (a reset) keeps every other key findable,
    /// whatever probe runs they shared.
    #[test]
    fn removing_a_key_keeps_the_others() {
        let mut t: Table<u64> = Table::new();
        // Tags that crowd a small table, so probe runs are long.
        let tags: Vec<u64> = (1..300u64)
            .map(|i| i.wrapping_mul(0x1234_5678_9abc_def1) << 2)
            .collect();
        for (i, &tag) in tags.iter().enumerate() {
            *t.entry(tag, usize::MAX, 0).unwrap().state = i as u64 + 10;
        }
        assert!(!t.remove(12_345 << 2), "a key never held");
        for (i, &tag) in tags.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
            assert!(t.remove(tag), "key {i}");
            assert!(!t.remove(tag), "key {i} again");
        }
        for (i, &tag) in tags.iter().enumerate() {
            let expected = (i % 3 != 0).then_some(i as u64 + 10);
            assert_eq!(t.get(tag).copied(), expected, "key {i}");
        }
        assert_eq!(t.len(), tags.len() - tags.len().div_ceil(3));
    }

    /// Regression: a purge that kept a handful of live entries sized the
    /// table to zero slots and the reinsert indexed an empty table (a panic
    /// under load in the server).
    #[test]
    fn purge_keeping_few_entries_then_growing_does_not_panic() {
        let mut t: Table<u64> = Table::new();
        // Six entries: three expire at 10, three live until 1000.
        for i in 1..=6u64 {
            *t.entry(i.wrapping_mul(0x1234_5678_9abc_def1), usize::MAX, 0)
                .unwrap()
                .state = if i % 2 == 0 { 10 } else { 1000 };
        }
        // Force purges with few survivors while inserting more keys at time 20.
        for i in 7..200u64 {
            *t.entry(i.wrapping_mul(0x1234_5678_9abc_def1), usize::MAX, 20)
                .unwrap()
                .state = 1000;
        }
        for i in (1..=6u64).filter(|i| i % 2 == 1) {
            assert_eq!(t.get(i.wrapping_mul(0x1234_5678_9abc_def1)), Some(&1000));
        }
        assert_eq!(t.purge(2000), 196);
        assert_eq!(t.len(), 0);
        *t.entry(42, usize::MAX, 2000).unwrap().state = 1;
        assert_eq!(t.get(42), Some(&1));
    }

    /// Fills a table of `cap` with entries expiring at 1000, marking those
    /// for which `limiting` says so; returns their tags.
    fn full(cap: usize, limiting: impl Fn(u64) -> bool) -> (Table<u64>, Vec<u64>) {
        let mut t: Table<u64> = Table::new();
        let tags: Vec<u64> = (1..=cap as u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) << 2)
            .collect();
        for &tag in &tags {
            let mut e = t.entry(tag, cap, 0).unwrap();
            *e.state = 1000;
            e.mark(limiting(tag));
        }
        (t, tags)
    }

    /// Regression for "a key flood re-admits a limited client": eviction
    /// took the entry that expires soonest, which is the client being
    /// denied. Limiting entries now stay until at rest, and a new key finds
    /// no room rather than evicting one.
    #[test]
    fn a_limiting_entry_is_never_evicted_before_it_is_at_rest() {
        let (mut t, tags) = full(20, |_| true);
        for i in 0..1000u64 {
            let tag = (i + 1_000_000).wrapping_mul(0x2545_f491_4f6c_dd1d) << 2;
            assert!(!t.has_room(tag, 20, 999));
            assert!(t.entry(tag, 20, 999).is_none());
        }
        assert!(tags.iter().all(|&tag| t.get(tag) == Some(&1000)));
        // At rest, they go like any other.
        assert!(t.has_room(7 << 2, 20, 1000));
        assert!(t.entry(7 << 2, 20, 1000).is_some());
        assert_eq!(t.len(), 20);
    }

    /// Among entries not limiting, one used since the last eviction looked
    /// stays; the unused ones go first, then the soonest to expire.
    #[test]
    fn unreferenced_entries_go_before_referenced_ones() {
        let (mut t, tags) = full(8, |_| false);
        // Entries start unreferenced until used again; mark all but one.
        // (`full` marked them, so clear the marks the way an eviction does.)
        t.age_near(tags[0]);
        for &tag in &tags {
            assert_eq!(t.slots[t.find(norm(tag)).unwrap()].word() & REFERENCED, 0);
        }
        let kept = &tags[1..];
        for &tag in kept {
            t.get_mut(tag).unwrap().touch();
        }
        assert!(t.entry(99 << 2, 8, 0).is_some());
        assert_eq!(t.get(tags[0]), None, "the one not used went");
        assert!(kept.iter().all(|&tag| t.get(tag).is_some()));
    }

    #[test]
    fn cap_is_never_exceeded_and_soonest_expiring_goes_first() {
        let mut t: Table<u64> = Table::new();
        for i in 1..=1000u64 {
            *t.entry(i.wrapping_mul(0x9e37_79b9_7f4a_7c15), 100, 0)
                .unwrap()
                .state = 1_000_000 + i;
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
                            *t.entry(tag, cap, now).unwrap().state = now + v;
                            model.retain(|k, _| t.get(*k).is_some());
                        } else {
                            *t.entry(tag, cap, now).unwrap().state = now + v;
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
