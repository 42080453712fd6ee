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

use spillway_store::AsIs;
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

/// One Space-Saving sketch, kept as a "stream summary": slots with equal
/// counts share a bucket, and buckets are linked in increasing count, so
/// adding to a key moves its slot to the next bucket and the smallest
/// count is the first bucket's: constant time per update whatever the
/// ties (a min-heap sank a replaced slot through every slot tied at the
/// smallest count, which is most of them under many distinct keys).
///
/// Built for the hot path (every decision of every rule adds to one or
/// two of them): the index files the key's hash as it is (a keyed hash
/// already), and everything is indexes into two arrays.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    k: usize,
    slots: Vec<Slot>,
    buckets: Vec<Bucket>,
    /// Buckets not in use, for reuse.
    spare: Vec<u32>,
    /// The bucket of the smallest count.
    first: u32,
    /// Slot of each held key hash.
    index: HashMap<u64, u32, BuildHasherDefault<AsIs>>,
    total: u64,
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Slot {
    hash: u64,
    error: u64,
    key: Option<Held>,
    bucket: u32,
    /// Neighbours in the bucket's list.
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone)]
struct Bucket {
    count: u64,
    /// The first slot of its list.
    head: u32,
    /// Neighbours in increasing count.
    prev: u32,
    next: u32,
}

/// A key as a sketch keeps it (with `admin.show_keys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Every part, whole: at most [`MAX_KEPT`] bytes in all, so the
    /// dashboard's block, override and reset act on the key itself.
    Whole(Box<[Box<str>]>),
    /// A longer key, joined and cut to [`MAX_SHOWN`] bytes: shown, but
    /// never acted on (the cut form is another key).
    Cut(Box<str>),
}

impl Held {
    /// `key` as kept: whole when it fits [`MAX_KEPT`].
    pub fn of(key: &Key<'_>) -> Held {
        let len: usize = key.parts().iter().map(|p| p.len()).sum();
        if len <= MAX_KEPT {
            Held::Whole(key.parts().iter().map(|p| Box::from(*p)).collect())
        } else {
            Held::Cut(cut(key.parts().join("+")))
        }
    }

    /// As the list shows it: the parts joined by `+`, cut to
    /// [`MAX_SHOWN`] bytes (marked with `…`).
    pub fn shown(&self) -> String {
        match self {
            Held::Whole(parts) => cut(parts.join("+")).into_string(),
            Held::Cut(s) => s.to_string(),
        }
    }

    /// The whole key's parts, if kept.
    pub fn parts(&self) -> Option<Vec<String>> {
        match self {
            Held::Whole(parts) => Some(parts.iter().map(ToString::to_string).collect()),
            Held::Cut(_) => None,
        }
    }
}

impl From<String> for Held {
    /// A one-part key.
    fn from(s: String) -> Held {
        Held::Whole(vec![s.into_boxed_str()].into_boxed_slice())
    }
}

/// One key as a sketch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heavy {
    /// The key's hash.
    pub hash: u64,
    /// The key as the list shows it (cut to [`MAX_SHOWN`] bytes), if kept.
    pub key: Option<String>,
    /// The whole key, one entry per part, if kept and at most
    /// [`MAX_KEPT`] bytes: what an action on the key names.
    pub parts: Option<Vec<String>>,
    /// An upper bound of its count.
    pub count: u64,
    /// How far above the true count `count` may be.
    pub error: u64,
}

impl SpaceSaving {
    /// A sketch of `k` slots (at least 1).
    pub fn new(k: usize) -> SpaceSaving {
        SpaceSaving {
            k: k.clamp(1, (u32::MAX - 1) as usize),
            slots: Vec::new(),
            buckets: Vec::new(),
            spare: Vec::new(),
            first: NIL,
            index: HashMap::default(),
            total: 0,
        }
    }

    /// Counts one occurrence of `hash`; `key` names it (called only when
    /// the key takes a slot, so a held key costs no allocation).
    pub fn add(&mut self, hash: u64, key: impl FnOnce() -> Option<Held>) {
        self.total += 1;
        if let Some(&s) = self.index.get(&hash) {
            self.bump(s);
            return;
        }
        if self.slots.len() < self.k {
            let s = self.slots.len() as u32;
            self.slots.push(Slot {
                hash,
                error: 0,
                key: key(),
                bucket: NIL,
                prev: NIL,
                next: NIL,
            });
            self.index.insert(hash, s);
            let b = if self.first != NIL && self.buckets[self.first as usize].count == 1 {
                self.first
            } else {
                let b = self.new_bucket(1);
                self.link_bucket_after(b, NIL);
                b
            };
            self.attach(s, b);
            return;
        }
        // Replace a slot of the smallest count: the newcomer takes over
        // its count (its error) and adds one.
        let s = self.buckets[self.first as usize].head;
        let min = self.buckets[self.first as usize].count;
        let slot = &mut self.slots[s as usize];
        let old = slot.hash;
        slot.hash = hash;
        slot.error = min;
        slot.key = key();
        self.index.remove(&old);
        self.index.insert(hash, s);
        self.bump(s);
    }

    /// Moves slot `s` to the bucket of its count plus one.
    fn bump(&mut self, s: u32) {
        let b = self.slots[s as usize].bucket;
        let c = self.buckets[b as usize].count + 1;
        let next = self.buckets[b as usize].next;
        let slot = &self.slots[s as usize];
        if slot.prev == NIL
            && slot.next == NIL
            && (next == NIL || self.buckets[next as usize].count != c)
        {
            // Alone in its bucket, and no bucket of the next count: the
            // bucket itself moves up (a hot key's common case).
            self.buckets[b as usize].count = c;
            return;
        }
        let to = if next != NIL && self.buckets[next as usize].count == c {
            next
        } else {
            let nb = self.new_bucket(c);
            self.link_bucket_after(nb, b);
            nb
        };
        self.detach(s);
        self.attach(s, to);
    }

    fn new_bucket(&mut self, count: u64) -> u32 {
        let fresh = Bucket {
            count,
            head: NIL,
            prev: NIL,
            next: NIL,
        };
        match self.spare.pop() {
            Some(b) => {
                self.buckets[b as usize] = fresh;
                b
            }
            None => {
                self.buckets.push(fresh);
                (self.buckets.len() - 1) as u32
            }
        }
    }

    /// Links bucket `b` after `after` (`NIL`: first).
    fn link_bucket_after(&mut self, b: u32, after: u32) {
        let next = if after == NIL {
            self.first
        } else {
            self.buckets[after as usize].next
        };
        self.buckets[b as usize].prev = after;
        self.buckets[b as usize].next = next;
        if next != NIL {
            self.buckets[next as usize].prev = b;
        }
        if after == NIL {
            self.first = b;
        } else {
            self.buckets[after as usize].next = b;
        }
    }

    /// Puts slot `s` at the head of bucket `b`'s list.
    fn attach(&mut self, s: u32, b: u32) {
        let head = self.buckets[b as usize].head;
        let slot = &mut self.slots[s as usize];
        slot.bucket = b;
        slot.prev = NIL;
        slot.next = head;
        if head != NIL {
            self.slots[head as usize].prev = s;
        }
        self.buckets[b as usize].head = s;
    }

    /// Takes slot `s` out of its bucket; an emptied bucket is unlinked.
    fn detach(&mut self, s: u32) {
        let Slot {
            bucket: b,
            prev,
            next,
            ..
        } = self.slots[s as usize];
        if prev != NIL {
            self.slots[prev as usize].next = next;
        } else {
            self.buckets[b as usize].head = next;
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        }
        if self.buckets[b as usize].head == NIL {
            let Bucket { prev, next, .. } = self.buckets[b as usize];
            if prev != NIL {
                self.buckets[prev as usize].next = next;
            } else {
                self.first = next;
            }
            if next != NIL {
                self.buckets[next as usize].prev = prev;
            }
            self.spare.push(b);
        }
    }

    /// Occurrences counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The smallest count held when every slot is taken (what a key not
    /// held may have had), else 0.
    pub fn floor(&self) -> u64 {
        if self.slots.len() < self.k || self.first == NIL {
            0
        } else {
            self.buckets[self.first as usize].count
        }
    }

    /// The count and error of a held key.
    fn get(&self, hash: u64) -> Option<(u64, u64)> {
        self.index.get(&hash).map(|&s| {
            let slot = &self.slots[s as usize];
            (self.buckets[slot.bucket as usize].count, slot.error)
        })
    }

    /// Every held key: hash, name, count, error.
    fn held(&self) -> impl Iterator<Item = (u64, Option<&Held>, u64, u64)> {
        self.slots.iter().map(|s| {
            (
                s.hash,
                s.key.as_ref(),
                self.buckets[s.bucket as usize].count,
                s.error,
            )
        })
    }
}

/// The heaviest keys of several sketches together (minutes of a window):
/// each key's count summed, plus a sketch's floor where it was not held.
/// `max_error` is the sum of the floors: no key's error exceeds it.
pub fn merge(sketches: &[&SpaceSaving], limit: usize) -> (Vec<Heavy>, u64, u64) {
    let mut seen: HashMap<u64, Option<&Held>> = HashMap::new();
    for s in sketches {
        for (hash, key, _, _) in s.held() {
            let e = seen.entry(hash).or_insert(key);
            if e.is_none() {
                *e = key;
            }
        }
    }
    let mut out: Vec<Heavy> = seen
        .into_iter()
        .map(|(hash, key)| {
            let (mut count, mut error) = (0, 0);
            for s in sketches {
                match s.get(hash) {
                    Some((c, e)) => {
                        count += c;
                        error += e;
                    }
                    None => {
                        count += s.floor();
                        error += s.floor();
                    }
                }
            }
            Heavy {
                hash,
                key: key.map(Held::shown),
                parts: key.and_then(Held::parts),
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

/// A rule's minutes, made at its first decision.
type RuleSlot = std::sync::OnceLock<Arc<RuleTop>>;

/// One rule's minutes.
#[derive(Debug)]
struct RuleTop {
    name: String,
    minutes: Mutex<VecDeque<Minute>>,
}

/// Every rule's top keys; the limiter's [`Watch`].
#[derive(Debug)]
pub struct TopKeys {
    /// Counting at all (`admin.top_keys`).
    enabled: AtomicBool,
    slots: usize,
    show_keys: AtomicBool,
    /// The current minute (since the Unix epoch), set by [`tick`](Self::tick).
    minute: AtomicU64,
    /// Per rule, indexed like the rule set of the version: empty until
    /// the rule's first decision (a million rules cost a slot each, not
    /// a sketch each).
    rules: ArcSwap<(u64, Vec<RuleSlot>)>,
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
            enabled: AtomicBool::new(true),
            slots,
            show_keys: AtomicBool::new(show_keys),
            minute: AtomicU64::new(now_minute()),
            rules: ArcSwap::from_pointee((0, Vec::new())),
            seed: seed(),
        };
        t.rules_changed(set);
        t
    }

    /// Counts from now on, or stops (`admin.top_keys`); what was counted
    /// stays until it ages out.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether decisions are counted.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
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
        // By name, once: a rule set of a million rules is matched in one
        // pass, not a million.
        let counted: std::collections::HashMap<&str, &Arc<RuleTop>> = old
            .1
            .iter()
            .filter_map(RuleSlot::get)
            .map(|r| (r.name.as_str(), r))
            .collect();
        let list = set
            .rules()
            .iter()
            .map(|r| {
                let slot = RuleSlot::new();
                if let Some(o) = counted.get(r.name()) {
                    let _ = slot.set(Arc::clone(o));
                }
                slot
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
            rules.1.get(index).map(|s| {
                s.get_or_init(|| {
                    Arc::new(RuleTop {
                        name: name.to_string(),
                        minutes: Mutex::new(VecDeque::new()),
                    })
                })
            })
        } else {
            rules
                .1
                .iter()
                .filter_map(RuleSlot::get)
                .find(|r| r.name == name)
        };
        let Some(rt) = rt else { return };
        let hash = key.hash(0, self.seed);
        let show = self.show_keys();
        let name_key = || show.then(|| Held::of(key));
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
        let rt = rules
            .1
            .iter()
            .filter_map(RuleSlot::get)
            .find(|r| r.name == rule)?;
        let now = self.minute.load(Ordering::Relaxed);
        let from = now.saturating_sub(minutes.saturating_sub(1) as u64);
        // Copied out, and merged without the lock every decision of the
        // rule takes.
        let copies: Vec<SpaceSaving> = rt
            .minutes
            .lock()
            .iter()
            .filter(|m| m.at >= from && m.at <= now)
            .map(|m| match by {
                By::Decided => m.decided.clone(),
                By::Denied => m.denied.clone(),
            })
            .collect();
        let sketches: Vec<&SpaceSaving> = copies.iter().collect();
        let (keys, total, max_error) = merge(&sketches, limit);
        Some(TopList {
            rule: rule.to_string(),
            keys,
            total,
            max_error,
            minutes,
        })
    }

    /// The names of the rules that decided since they came in force, in
    /// rule order.
    pub fn rule_names(&self) -> Vec<String> {
        self.rules
            .load()
            .1
            .iter()
            .filter_map(RuleSlot::get)
            .map(|r| r.name.clone())
            .collect()
    }

    /// A rule's top keys when it has decided nothing yet.
    pub fn empty(rule: &str, minutes: usize) -> TopList {
        TopList {
            rule: rule.to_string(),
            keys: Vec::new(),
            total: 0,
            max_error: 0,
            minutes,
        }
    }
}

impl Watch for TopKeys {
    fn decided(&self, version: u64, index: usize, rule: &Rule, key: &Key<'_>, outcome: Outcome) {
        if self.enabled() {
            self.count(version, index, rule.name(), key, outcome);
        }
    }
}

/// The longest key shown as sent: a client chooses its key, and a list
/// line must not hold kilobytes of it.
pub const MAX_SHOWN: usize = 256;

/// The longest key a slot keeps whole, in bytes of its parts (any one
/// value the decision API takes fits): a longer key is kept cut, shown,
/// and cannot be acted on from the list. A slot must not hold kilobytes
/// of what a client chose: `slots x 2 x 15` slots per rule hold at most
/// this much each.
pub const MAX_KEPT: usize = 1024;

/// `s` cut to [`MAX_SHOWN`] bytes (marked with `…`).
fn cut(mut s: String) -> Box<str> {
    if s.len() > MAX_SHOWN {
        let mut end = MAX_SHOWN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s.into_boxed_str()
}

fn now_minute() -> u64 {
    crate::os::unix_secs() / 60
}

/// A seed that differs per process.
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x0074_6f70_6b65_7973);
    h.finish()
}

#[cfg(test)]
mod tests;
