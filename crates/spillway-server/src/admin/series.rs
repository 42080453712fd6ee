//! Decisions over the last 15 minutes, per rule and outcome, for the
//! dashboard's chart: the metrics' counters read every [`STEP`] and kept
//! as differences. Nothing on the hot path.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;

/// Time between two points.
pub const STEP: Duration = Duration::from_secs(5);

/// Points kept: 15 minutes.
pub const POINTS: usize = 180;

/// Counts per step: allowed, denied, shadow denied, soft exceeded, near limit.
pub type Counts = [u64; 5];

/// The names of [`Counts`]' entries, as the API shows them.
pub const FIELDS: [&str; 5] = [
    "allowed",
    "denied",
    "shadow_denied",
    "soft_exceeded",
    "near_limit",
];

#[derive(Debug, Default)]
struct Inner {
    /// Totals at the last reading.
    last: HashMap<String, Counts>,
    /// Oldest first: when each step ended, and each rule's counts in it.
    points: VecDeque<(u64, HashMap<String, Counts>)>,
}

/// The chart's data.
#[derive(Debug, Default)]
pub struct Series {
    inner: Mutex<Inner>,
}

impl Series {
    /// An empty series.
    pub fn new() -> Series {
        Series::default()
    }

    /// Takes a reading of every rule's totals at `at_unix_ms`: the step
    /// since the last reading is what each total grew by (from zero for a
    /// rule seen for the first time).
    pub fn record(&self, at_unix_ms: u64, totals: Vec<(String, Counts)>) {
        let mut inner = self.inner.lock();
        let mut step = HashMap::with_capacity(totals.len());
        let mut last = HashMap::with_capacity(totals.len());
        for (name, t) in totals {
            // A rule not seen before counted from zero: the metrics list a
            // rule from its first request on (and counters start with the
            // process), so all it has counted falls in this step.
            let before = inner.last.get(&name).copied().unwrap_or_default();
            let mut d = [0; 5];
            for i in 0..5 {
                d[i] = t[i].saturating_sub(before[i]);
            }
            // Only rules that decided in the step take room: with many
            // rules, most see no traffic at all.
            if d != [0; 5] {
                step.insert(name.clone(), d);
            }
            last.insert(name, t);
        }
        inner.last = last;
        if inner.points.len() >= POINTS {
            inner.points.pop_front();
        }
        inner.points.push_back((at_unix_ms, step));
    }

    /// When the last step ended (0: none yet), and for each of `rules`
    /// its [`POINTS`] steps, oldest first (zeros before the first reading).
    pub fn snapshot(&self, rules: &[String]) -> (u64, Vec<(String, Vec<Counts>)>) {
        let inner = self.inner.lock();
        let end = inner.points.back().map_or(0, |p| p.0);
        let pad = POINTS - inner.points.len();
        let out = rules
            .iter()
            .map(|r| {
                let mut v = vec![[0; 5]; pad];
                v.extend(
                    inner
                        .points
                        .iter()
                        .map(|(_, m)| m.get(r).copied().unwrap_or_default()),
                );
                (r.clone(), v)
            })
            .collect();
        (end, out)
    }
}

impl Series {
    /// The `limit` rules of `all` that decided most in the points kept,
    /// busiest first (ties by name), with how many decisions each; then,
    /// while there is room, rules that decided nothing, by name. One pass
    /// over the rules, whatever their number.
    pub fn busiest(&self, all: &[&str], limit: usize) -> Vec<(String, u64)> {
        let known: std::collections::HashSet<&str> = all.iter().copied().collect();
        let mut sums: HashMap<String, u64> = HashMap::new();
        {
            let inner = self.inner.lock();
            for (_, m) in &inner.points {
                for (name, c) in m {
                    if known.contains(name.as_str()) {
                        *sums.entry(name.clone()).or_default() += c.iter().sum::<u64>();
                    }
                }
            }
        }
        let mut busy: Vec<(String, u64)> = sums.into_iter().filter(|(_, n)| *n > 0).collect();
        busy.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        busy.truncate(limit);
        if busy.len() < limit {
            let shown: std::collections::HashSet<&str> =
                busy.iter().map(|(n, _)| n.as_str()).collect();
            let mut idle: Vec<&str> = all.iter().copied().filter(|n| !shown.contains(n)).collect();
            let room = limit - busy.len();
            if idle.len() > room {
                idle.select_nth_unstable(room);
                idle.truncate(room);
            }
            idle.sort_unstable();
            let idle: Vec<(String, u64)> = idle.into_iter().map(|n| (n.to_string(), 0)).collect();
            busy.extend(idle);
        }
        busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_differences_and_keep_fifteen_minutes() {
        let s = Series::new();
        s.record(0, vec![("a".into(), [10, 0, 0, 0, 0])]);
        s.record(5000, vec![("a".into(), [15, 2, 0, 0, 1])]);
        let (end, list) = s.snapshot(&["a".into(), "b".into()]);
        assert_eq!(end, 5000);
        assert_eq!(list[0].1.len(), POINTS);
        assert_eq!(list[0].1[POINTS - 1], [5, 2, 0, 0, 1]);
        assert_eq!(list[0].1[POINTS - 2], [10, 0, 0, 0, 0]);
        assert_eq!(list[1].1[POINTS - 1], [0; 5]);
        for i in 0..(POINTS as u64 + 10) {
            s.record(10_000 + i, vec![("a".into(), [20 + i, 2, 0, 0, 1])]);
        }
        let (_, list) = s.snapshot(&["a".into()]);
        assert_eq!(list[0].1.len(), POINTS);
        assert!(list[0].1.iter().all(|c| c[0] == 1));
    }

    #[test]
    fn the_busiest_first_then_idle_rules_by_name() {
        let s = Series::new();
        let zero = [0; 5];
        s.record(
            0,
            vec![("a".into(), zero), ("b".into(), zero), ("c".into(), zero)],
        );
        s.record(
            5000,
            vec![
                ("a".into(), [1, 0, 0, 0, 0]),
                ("b".into(), [5, 2, 0, 0, 0]),
                ("c".into(), zero),
            ],
        );
        let all = ["a", "b", "c", "d"];
        assert_eq!(s.busiest(&all, 1), [("b".to_string(), 7)]);
        assert_eq!(
            s.busiest(&all, 3),
            [
                ("b".to_string(), 7),
                ("a".to_string(), 1),
                ("c".to_string(), 0)
            ]
        );
        // A rule no longer in force is not shown.
        assert_eq!(s.busiest(&["a"], 5), [("a".to_string(), 1)]);
    }
}
