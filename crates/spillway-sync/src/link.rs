//! The deltas on their way to one store, and the rule that makes a push
//! count once.
//!
//! An instance sends a store what it admitted since its last push, as
//! charges per key, numbered: the store keeps the last number it applied
//! for each instance and runs a push whose number is not above it as a
//! check (see `SyncReply::applied` in spillway-redis). A push that got no
//! answer may or may not have been applied, so it is sent again *as it
//! was*, under the same number, until the store answers; deltas admitted
//! meanwhile wait for the next number. That is the whole protocol:
//!
//! - a push applied, retried, replayed by the network or delivered late
//!   counts once (a late copy carries a number the store has passed);
//! - nothing waiting is lost while the instance lives, whatever fails;
//! - each store (one per region) gets its own [`Link`], so every region's
//!   store counts every instance's deltas once, and a key's count there is
//!   the sum of what each region's instances admitted.
//!
//! Pure: no I/O, no clock. The property tests at the bottom drive it
//! through any order of losses, replays and answers.

use std::collections::HashMap;

/// Most keys in one push.
pub const MAX_PUSH_KEYS: usize = 2048;

/// One push: a number and the deltas it carries, `(tag, rule, cost)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push<R> {
    /// Above every number this instance sent this store before.
    pub seq: u64,
    /// What it charges, one entry per key.
    pub items: Vec<(u64, R, u64)>,
}

/// Deltas waiting for one store.
#[derive(Debug)]
pub struct Link<R> {
    /// The last number used.
    seq: u64,
    /// Deltas not yet in a push, merged per key.
    pending: HashMap<u64, (R, u64)>,
    /// The push sent and not yet answered: sent again, unchanged, until
    /// the store answers.
    inflight: Option<Push<R>>,
}

impl<R> Default for Link<R> {
    fn default() -> Link<R> {
        Link {
            seq: 0,
            pending: HashMap::new(),
            inflight: None,
        }
    }
}

impl<R: Clone> Link<R> {
    /// A link whose numbers start above `seq` (an instance that restarts
    /// with the same id must start above what it sent before; a fresh id
    /// starts at 0).
    pub fn starting_after(seq: u64) -> Link<R> {
        Link {
            seq,
            ..Link::default()
        }
    }

    /// Records `cost` more admitted for `tag` under `rule`.
    pub fn add(&mut self, tag: u64, rule: &R, cost: u64) {
        if cost == 0 {
            return;
        }
        self.pending
            .entry(tag)
            .and_modify(|(_, c)| *c = c.saturating_add(cost))
            .or_insert_with(|| (rule.clone(), cost));
    }

    /// The push to send now: the unanswered one again, else up to
    /// [`MAX_PUSH_KEYS`] of the keys pending under a new number (a store
    /// runs a call to its end before anything else, and a call too big to
    /// answer in time would be sent again for ever); `None` when nothing
    /// waits.
    pub fn to_send(&mut self) -> Option<&Push<R>> {
        if self.inflight.is_none() && !self.pending.is_empty() {
            self.seq += 1;
            let tags: Vec<u64> = self.pending.keys().take(MAX_PUSH_KEYS).copied().collect();
            let items = tags
                .into_iter()
                .filter_map(|tag| {
                    self.pending
                        .remove(&tag)
                        .map(|(rule, cost)| (tag, rule, cost))
                })
                .collect();
            self.inflight = Some(Push {
                seq: self.seq,
                items,
            });
        }
        self.inflight.as_ref()
    }

    /// The store answered the push under way (applied, or a replay of one
    /// it had applied): its deltas are counted there.
    pub fn answered(&mut self, seq: u64) {
        if self.inflight.as_ref().is_some_and(|p| p.seq == seq) {
            self.inflight = None;
        }
    }

    /// Units not yet known to be counted by the store (pending and under way).
    pub fn waiting(&self) -> u64 {
        let pending: u64 = self.pending.values().map(|(_, c)| *c).sum();
        let inflight: u64 = self
            .inflight
            .iter()
            .flat_map(|p| p.items.iter().map(|i| i.2))
            .sum();
        pending.saturating_add(inflight)
    }

    /// Units of `tag` waiting that are not in the push under way: admitted
    /// after it was made (what a store's answer to that push cannot know).
    pub fn pending_for(&self, tag: u64) -> u64 {
        self.pending.get(&tag).map_or(0, |(_, c)| *c)
    }

    /// Units of `tag` the store has not acknowledged: pending, and in the
    /// push under way (what an answer to a call without that push cannot
    /// know of).
    pub fn unacked_for(&self, tag: u64) -> u64 {
        let inflight: u64 = self
            .inflight
            .iter()
            .flat_map(|p| p.items.iter())
            .filter(|i| i.0 == tag)
            .map(|i| i.2)
            .sum();
        self.pending_for(tag).saturating_add(inflight)
    }

    /// Keys with deltas waiting.
    pub fn keys_waiting(&self) -> usize {
        self.pending.len() + self.inflight.as_ref().map_or(0, |p| p.items.len())
    }
}

/// The store's side of the rule, as the script keeps it: the last number
/// applied per instance. For the property tests and as the reference the
/// script is written against.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    last: HashMap<u64, u64>,
    /// Per key, units applied.
    pub totals: HashMap<u64, u64>,
}

impl Ledger {
    /// Applies `push` from `instance` unless its number is not above the
    /// last applied; returns whether it was applied.
    pub fn apply<R>(&mut self, instance: u64, push: &Push<R>) -> bool {
        let last = self.last.entry(instance).or_insert(0);
        if push.seq <= *last {
            return false;
        }
        *last = push.seq;
        for (tag, _, cost) in &push.items {
            *self.totals.entry(*tag).or_insert(0) += cost;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the network does to one exchange.
    #[derive(Debug, Clone, Copy)]
    enum Fate {
        /// Delivered and answered.
        Answered,
        /// Lost before the store.
        Lost,
        /// Applied, but the answer was lost.
        AnswerLost,
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Instance `i` admits `cost` for key `k`.
        Admit(usize, u64, u64),
        /// Instance `i` exchanges with store `s`.
        Exchange(usize, usize, Fate),
        /// An old push of instance `i` to store `s` (the `n`-th it sent)
        /// arrives again.
        Replay(usize, usize, usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        let fate = prop_oneof![
            Just(Fate::Answered),
            Just(Fate::Lost),
            Just(Fate::AnswerLost)
        ];
        prop_oneof![
            (0..3usize, 0..4u64, 1..5u64).prop_map(|(i, k, c)| Step::Admit(i, k, c)),
            (0..3usize, 0..2usize, fate).prop_map(|(i, s, f)| Step::Exchange(i, s, f)),
            (0..3usize, 0..2usize, 0..8usize).prop_map(|(i, s, n)| Step::Replay(i, s, n)),
        ]
    }

    proptest! {
        /// Three instances, two stores (regions), any order of admissions,
        /// losses, lost answers and replays: no store ever counts more than
        /// was admitted, and once every link has been answered, every store
        /// counts exactly what was admitted, key by key.
        #[test]
        fn every_store_counts_each_delta_once(steps in proptest::collection::vec(step(), 0..120)) {
            let mut links: Vec<Vec<Link<()>>> = (0..3).map(|_| vec![Link::default(), Link::default()]).collect();
            let mut sent: Vec<Vec<Vec<Push<()>>>> = vec![vec![Vec::new(), Vec::new()]; 3];
            let mut stores = vec![Ledger::default(), Ledger::default()];
            let mut admitted: HashMap<u64, u64> = HashMap::new();
            for s in steps {
                match s {
                    Step::Admit(i, k, c) => {
                        *admitted.entry(k).or_insert(0) += c;
                        for link in &mut links[i] {
                            link.add(k, &(), c);
                        }
                    }
                    Step::Exchange(i, s, fate) => {
                        let Some(push) = links[i][s].to_send().cloned() else { continue };
                        sent[i][s].push(push.clone());
                        match fate {
                            Fate::Lost => {}
                            Fate::AnswerLost => { stores[s].apply(i as u64, &push); }
                            Fate::Answered => {
                                stores[s].apply(i as u64, &push);
                                links[i][s].answered(push.seq);
                            }
                        }
                    }
                    Step::Replay(i, s, n) => {
                        if let Some(p) = sent[i][s].get(n).cloned() {
                            stores[s].apply(i as u64, &p);
                        }
                    }
                }
                for store in &stores {
                    for (k, t) in &store.totals {
                        prop_assert!(*t <= admitted[k], "key {k}: counted {t} of {}", admitted[k]);
                    }
                }
            }
            // Heal: every link exchanges until answered.
            for (i, per) in links.iter_mut().enumerate() {
                for (s, link) in per.iter_mut().enumerate() {
                    while let Some(p) = link.to_send().cloned() {
                        stores[s].apply(i as u64, &p);
                        link.answered(p.seq);
                    }
                    prop_assert_eq!(link.waiting(), 0);
                }
            }
            for store in &stores {
                for (k, a) in &admitted {
                    prop_assert_eq!(store.totals.get(k).copied().unwrap_or(0), *a, "key {}", k);
                }
            }
        }
    }

    /// A push carries at most `MAX_PUSH_KEYS` keys; the rest follow under
    /// the next numbers, nothing lost.
    #[test]
    fn big_backlogs_go_in_pushes_of_bounded_size() {
        let mut link: Link<()> = Link::default();
        let n = MAX_PUSH_KEYS as u64 * 2 + 5;
        for tag in 0..n {
            link.add(tag, &(), 1);
        }
        let mut sizes = Vec::new();
        while let Some(p) = link.to_send().cloned() {
            sizes.push(p.items.len());
            link.answered(p.seq);
        }
        assert_eq!(sizes, vec![MAX_PUSH_KEYS, MAX_PUSH_KEYS, 5]);
        assert_eq!(link.waiting(), 0);
    }

    /// Deltas admitted while a push is under way wait for the next number,
    /// and are what `pending_for` reports.
    #[test]
    fn deltas_after_a_push_wait_for_the_next() {
        let mut link: Link<()> = Link::default();
        link.add(1, &(), 3);
        let first = link.to_send().cloned().unwrap();
        link.add(1, &(), 2);
        assert_eq!(link.pending_for(1), 2);
        assert_eq!(
            link.to_send().cloned().unwrap(),
            first,
            "sent again unchanged"
        );
        link.answered(first.seq);
        let second = link.to_send().cloned().unwrap();
        assert_eq!(
            (second.seq, second.items),
            (first.seq + 1, vec![(1, (), 2)])
        );
        assert_eq!(link.waiting(), 2);
        link.answered(second.seq);
        assert!(link.to_send().is_none());
        assert_eq!(link.waiting(), 0);
    }
}
