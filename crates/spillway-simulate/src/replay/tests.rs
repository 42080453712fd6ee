use super::*;
use proptest::prelude::*;

fn window_limits(limit: u64, window: Nanos) -> Vec<Limit> {
    let rate = Rate::new(limit, window).unwrap();
    vec![
        Limit::FixedWindow(FixedWindow::new(limit, window).unwrap()),
        Limit::SlidingLog(SlidingLog::new(limit, window).unwrap()),
        Limit::SlidingCounter(SlidingCounter::new(limit, window).unwrap()),
        Limit::TokenBucket(TokenBucket::new(limit, rate).unwrap()),
        Limit::Gcra(Gcra::new(rate, limit).unwrap()),
        Limit::LeakyBucket(LeakyBucket::new(limit, rate).unwrap()),
    ]
}

fn denies_any(limit: &Limit, requests: &[(u64, u64)]) -> bool {
    let mut s = State::fresh(limit);
    !requests
        .iter()
        .all(|&(t, c)| step(limit, &mut s, Nanos(t), c))
}

proptest! {
    /// The size a key needs is exact for every algorithm: at that size
    /// the algorithm admits all of the key's requests, one less and it
    /// refuses one.
    #[test]
    fn needed_size_is_the_smallest_that_admits_all(
        gaps in prop::collection::vec((0u64..3_000_000_000, 1u64..4), 1..60),
        limit in 1u64..20,
        window_s in 1u64..30,
    ) {
        let mut t = 1_700_000_000_000_000_000u64;
        let requests: Vec<(u64, u64)> = gaps.iter().map(|&(g, c)| { t += g; (t, c) }).collect();
        for l in window_limits(limit, Nanos::from_secs(window_s)) {
            let need = needed_size(&l, &requests);
            prop_assert!(need != u64::MAX);
            prop_assert!(!denies_any(&l.with_size(need), &requests), "{l:?} at {need}");
            if need > 1 {
                prop_assert!(denies_any(&l.with_size(need - 1), &requests), "{l:?} at {}", need - 1);
            }
        }
    }
}

#[test]
fn histogram_counts_every_key_once_on_a_1_2_5_scale() {
    let h = histogram([0, 1, 2, 3, 7, 10, 11, 120].into_iter());
    let bounds: Vec<u64> = h.iter().map(|b| b.upto).collect();
    assert_eq!(bounds, vec![1, 2, 5, 10, 20, 50, 100, 200]);
    let keys: Vec<u64> = h.iter().map(|b| b.keys).collect();
    assert_eq!(keys, vec![2, 1, 1, 2, 1, 0, 0, 1]);
}

#[test]
fn halving_keeps_the_total() {
    let mut v = vec![1, 2, 3, 4, 5];
    halve(&mut v);
    assert_eq!(v, vec![3, 7, 5]);
}
