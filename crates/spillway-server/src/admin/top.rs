//! Top keys: the heaviest clients of each rule, in bounded memory.
//!
//! Each rule keeps, per minute, two Space-Saving sketches (Metwally,
//! Agrawal and El Abbadi, 2005) of `k` slots: one over every decision,
//! one over denials. A sketch counts a key it holds exactly from the
//! moment it took its slot; a new key takes the slot of the smallest
//! count `m` and starts at `m + 1`, with an error of `m`. So a listed
//! count is an upper bound, at most `error` above the truth, and every
//! key whose true count exceeds `N / k` (N: the minute's total) is
//! listed. A window of several minutes adds the minutes up: a key a
//! minute did not hold may have had up to that minute's smallest count
//! there, which is added to its count and its error.
//!
//! The 15 most recent minutes are kept: `k * 2 * 15` slots per rule.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use spillway_core::{Outcome, Rule};
use spillway_store::{Key, RuleSet, Watch};

/// Minutes of history kept.
pub const MINUTES: usize = 15;

/// One Space-Saving sketch.
///
/// Built for the hot path (every decision of every rule adds to two of
/// them): the index is filed by the key's hash as it is (it is a keyed
/// hash already, so no second hashing), and the min-heap holds each
/// slot's count beside its number, so sifting reads one array.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    k: usize,
    slots: Vec<Slot>,
    /// Slot of each held key hash.
    index: HashMap<u64, u32, BuildHasherDefault<AsIs>>,
    /// A min-heap of (count, slot); `pos[s]` is slot s's place in it.
    heap: Vec<(u64, u32)>,
    pos: Vec<u32>,
    total: u64,
}

/// A hasher for keys that are hashes already.
#[derive(Debug, Default, Clone, Copy)]
pub struct AsIs(u64);

impl std::hash::Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are filed; anything else is folded in plainly.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Debug, Clone)]
struct Slot {
    hash: u64,
    count: u64,
    error: u64,
    key: Option<Box<str>>,
}

/// One key as a sketch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heavy {
    /// The key's hash.
    pub hash: u64,
    /// The key as sent, if kept.
    pub key: Option<String>,
    /// An upper bound of its count.
    pub count: u64,
    /// How far above the true count `count` may be.
    pub error: u64,
}

impl SpaceSaving {
    /// A sketch of `k` slots (at least 1).
    pub fn new(k: usize) -> SpaceSaving {
        let k = k.clamp(1, u32::MAX as usize);
        SpaceSaving {
            k,
            slots: Vec::new(),
            index: HashMap::default(),
            heap: Vec::new(),
            pos: Vec::new(),
            total: 0,
        }
    }

    /// Counts one occurrence of `hash`; `key` names it (called only when
    /// the key takes a slot, so a held key costs no allocation).
    pub fn add(&mut self, hash: u64, key: impl FnOnce() -> Option<Box<str>>) {
        self.total += 1;
        if let Some(&s) = self.index.get(&hash) {
            let s = s as usize;
            self.slots[s].count += 1;
            let at = self.pos[s] as usize;
            self.heap[at].0 += 1;
            self.sift_down(at);
            return;
        }
        if self.slots.len() < self.k {
            let s = self.slots.len();
            self.slots.push(Slot {
                hash,
                count: 1,
                error: 0,
                key: key(),
            });
            self.index.insert(hash, s as u32);
            self.heap.push((1, s as u32));
            self.pos.push((self.heap.len() - 1) as u32);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Replace the smallest.
        let (min, s) = self.heap[0];
        let slot = &mut self.slots[s as usize];
        self.index.remove(&slot.hash);
        *slot = Slot {
            hash,
            count: min + 1,
            error: min,
            key: key(),
        };
        self.index.insert(hash, s);
        self.heap[0].0 = min + 1;
        self.sift_down(0);
    }

    /// Occurrences counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The smallest count held when every slot is taken (what a key not
    /// held may have had), else 0.
    pub fn floor(&self) -> u64 {
        if self.slots.len() < self.k {
            0
        } else {
            self.heap.first().map_or(0, |h| h.0)
        }
    }

    fn get(&self, hash: u64) -> Option<&Slot> {
        self.index.get(&hash).map(|&s| &self.slots[s as usize])
    }

    fn sift_up(&mut self, mut i: usize) {
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[i].0 >= self.heap[parent].0 {
                break;
            }
            self.swap(i, parent);
            i = parent;
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut least = i;
            if l < n && self.heap[l].0 < self.heap[least].0 {
                least = l;
            }
            if r < n && self.heap[r].0 < self.heap[least].0 {
                least = r;
            }
            if least == i {
                return;
            }
            self.swap(i, least);
            i = least;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.pos[self.heap[a].1 as usize] = a as u32;
        self.pos[self.heap[b].1 as usize] = b as u32;
    }
}

/// The heaviest keys of several sketches together (minutes of a window):
/// each key's count summed, plus a sketch's floor where it was not held.
/// `max_error` is the sum of the floors: no key's error exceeds it.
pub fn merge(sketches: &[&SpaceSaving], limit: usize) -> (Vec<Heavy>, u64, u64) {
    let mut seen: HashMap<u64, Option<String>> = HashMap::new();
    for s in sketches {
        for slot in &s.slots {
            seen.entry(slot.hash)
                .or_insert_with(|| slot.key.as_deref().map(str::to_string));
        }
    }
    let mut out: Vec<Heavy> = seen
        .into_iter()
        .map(|(hash, key)| {
            let (mut count, mut error) = (0, 0);
            for s in sketches {
                match s.get(hash) {
                    Some(slot) => {
                        count += slot.count;
                        error += slot.error;
                    }
                    None => {
                        count += s.floor();
                        error += s.floor();
                    }
                }
            }
            Heavy {
                hash,
                key,
                count,
                error,
            }
        })
        .collect();
    // Heaviest first by the guaranteed part, then the bound.
    out.sort_by(|a, b| {
        (b.count - b.error, b.count, a.hash).cmp(&(a.count - a.error, a.count, b.hash))
    });
    out.truncate(limit);
    let max_error = sketches.iter().map(|s| s.floor()).sum();
    let total = sketches.iter().map(|s| s.total()).sum();
    (out, total, max_error)
}

/// What a rule's sketches count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Every decision.
    Decided,
    /// Denials only.
    Denied,
}

#[derive(Debug)]
struct Minute {
    at: u64,
    decided: SpaceSaving,
    denied: SpaceSaving,
}

/// One rule's minutes.
#[derive(Debug)]
struct RuleTop {
    name: String,
    minutes: Mutex<VecDeque<Minute>>,
}

/// Every rule's top keys; the limiter's [`Watch`].
#[derive(Debug)]
pub struct TopKeys {
    slots: usize,
    show_keys: AtomicBool,
    /// The current minute (since the Unix epoch), set by [`tick`](Self::tick).
    minute: AtomicU64,
    /// Per rule, indexed like the rule set of the version.
    rules: ArcSwap<(u64, Vec<Arc<RuleTop>>)>,
    /// The seed of the key hashes shown: per process, so a hash says
    /// nothing of the key to someone who cannot see it.
    seed: u64,
}

/// One rule's top keys over a window, as the API shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopList {
    /// The rule.
    pub rule: String,
    /// The heaviest keys.
    pub keys: Vec<Heavy>,
    /// Occurrences counted in the window.
    pub total: u64,
    /// No count is more than this above the truth.
    pub max_error: u64,
    /// Minutes the window covered.
    pub minutes: usize,
}

impl TopKeys {
    /// Top keys with `slots` per sketch.
    pub fn new(slots: usize, show_keys: bool, set: &RuleSet) -> TopKeys {
        let t = TopKeys {
            slots,
            show_keys: AtomicBool::new(show_keys),
            minute: AtomicU64::new(now_minute()),
            rules: ArcSwap::from_pointee((0, Vec::new())),
            seed: seed(),
        };
        t.rules_changed(set);
        t
    }

    /// Whether keys are kept as sent.
    pub fn show_keys(&self) -> bool {
        self.show_keys.load(Ordering::Relaxed)
    }

    /// Keys as sent from now on (already counted keys stay as they were).
    pub fn set_show_keys(&self, show: bool) {
        self.show_keys.store(show, Ordering::Relaxed);
    }

    /// Slots per sketch.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Re-indexes for a new rule set, keeping the sketches of rules whose
    /// names stay.
    pub fn rules_changed(&self, set: &RuleSet) {
        let old = self.rules.load();
        let list = set
            .rules()
            .iter()
            .map(|r| {
                old.1
                    .iter()
                    .find(|o| o.name == r.name())
                    .cloned()
                    .unwrap_or_else(|| {
                        Arc::new(RuleTop {
                            name: r.name().to_string(),
                            minutes: Mutex::new(VecDeque::new()),
                        })
                    })
            })
            .collect();
        self.rules.store(Arc::new((set.version, list)));
    }

    /// Moves to the current minute (called about once a second).
    pub fn tick(&self) {
        self.minute.store(now_minute(), Ordering::Relaxed);
    }

    /// Counts a decision for `key` under the rule named `name` at
    /// `index` of the rule set numbered `version`.
    fn count(&self, version: u64, index: usize, name: &str, key: &Key<'_>, outcome: Outcome) {
        let rules = self.rules.load();
        let rt = if rules.0 == version {
            rules.1.get(index)
        } else {
            rules.1.iter().find(|r| r.name == name)
        };
        let Some(rt) = rt else { return };
        let hash = key.hash(0, self.seed);
        let show = self.show_keys();
        let name_key = || show.then(|| key.parts().join("+").into_boxed_str());
        let at = self.minute.load(Ordering::Relaxed);
        let mut minutes = rt.minutes.lock();
        if minutes.back().is_none_or(|m| m.at != at) {
            if minutes.len() >= MINUTES {
                minutes.pop_front();
            }
            minutes.push_back(Minute {
                at,
                decided: SpaceSaving::new(self.slots),
                denied: SpaceSaving::new(self.slots),
            });
        }
        let Some(m) = minutes.back_mut() else { return };
        m.decided.add(hash, name_key);
        if outcome == Outcome::Denied {
            m.denied.add(hash, name_key);
        }
    }

    /// The rule's heaviest keys over the last `minutes` minutes (the
    /// current one included), at most `limit`.
    pub fn top(&self, rule: &str, by: By, minutes: usize, limit: usize) -> Option<TopList> {
        let rules = self.rules.load();
        let rt = rules.1.iter().find(|r| r.name == rule)?;
        let now = self.minute.load(Ordering::Relaxed);
        let held = rt.minutes.lock();
        let from = now.saturating_sub(minutes.saturating_sub(1) as u64);
        let sketches: Vec<&SpaceSaving> = held
            .iter()
            .filter(|m| m.at >= from && m.at <= now)
            .map(|m| match by {
                By::Decided => &m.decided,
                By::Denied => &m.denied,
            })
            .collect();
        let (keys, total, max_error) = merge(&sketches, limit);
        Some(TopList {
            rule: rule.to_string(),
            keys,
            total,
            max_error,
            minutes,
        })
    }

    /// The rules' names, in rule order.
    pub fn rule_names(&self) -> Vec<String> {
        self.rules.load().1.iter().map(|r| r.name.clone()).collect()
    }
}

impl Watch for TopKeys {
    fn decided(&self, version: u64, index: usize, rule: &Rule, key: &Key<'_>, outcome: Outcome) {
        self.count(version, index, rule.name(), key, outcome);
    }
}

fn now_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 60)
}

/// A seed that differs per process.
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x0074_6f70_6b65_7973);
    h.finish()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn exact(stream: &[u64]) -> HashMap<u64, u64> {
        let mut m = HashMap::new();
        for &x in stream {
            *m.entry(x).or_insert(0) += 1;
        }
        m
    }

    proptest! {
        /// Every listed count is an upper bound at most `error` above the
        /// truth, and every key above N/k is listed: Space-Saving's
        /// guarantees, on any stream and across merged sketches.
        #[test]
        fn counts_bound_the_truth(
            streams in proptest::collection::vec(
                proptest::collection::vec(0u64..40, 0..300), 1..4),
            k in 1usize..24,
        ) {
            let sketches: Vec<SpaceSaving> = streams.iter().map(|s| {
                let mut sk = SpaceSaving::new(k);
                for &x in s { sk.add(x, || None); }
                sk
            }).collect();
            let all: Vec<u64> = streams.concat();
            let truth = exact(&all);
            let refs: Vec<&SpaceSaving> = sketches.iter().collect();
            let (list, total, max_error) = merge(&refs, usize::MAX);
            prop_assert_eq!(total, all.len() as u64);
            for h in &list {
                let t = truth.get(&h.hash).copied().unwrap_or(0);
                prop_assert!(h.count >= t, "count {} below truth {}", h.count, t);
                prop_assert!(h.count - h.error <= t, "guaranteed part {} above truth {}", h.count - h.error, t);
                prop_assert!(h.error <= max_error);
            }
            // Each sketch alone: every key above N/k is held.
            for (s, sk) in streams.iter().zip(&sketches) {
                let n = s.len() as u64;
                for (x, c) in exact(s) {
                    if c * k as u64 > n {
                        prop_assert!(sk.get(x).is_some(), "key {x} with {c} of {n} not held (k {k})");
                    }
                }
            }
        }
    }

    #[test]
    fn a_sketch_holds_at_most_k_keys_and_names_them() {
        let mut sk = SpaceSaving::new(3);
        for x in 0..100u64 {
            sk.add(x % 7, || Some(format!("k{}", x % 7).into()));
        }
        assert_eq!(sk.slots.len(), 3);
        assert_eq!(sk.index.len(), 3);
        let (list, total, _) = merge(&[&sk], 10);
        assert_eq!(total, 100);
        assert_eq!(list.len(), 3);
        assert!(
            list.iter()
                .all(|h| h.key.as_deref() == Some(&*format!("k{}", h.hash)))
        );
    }
}
