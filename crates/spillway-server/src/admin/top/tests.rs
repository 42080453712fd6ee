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

/// The buckets are linked in strictly increasing count, each slot is
/// in the list of its bucket, and the counts add up to the total.
fn check(sk: &SpaceSaving) {
    let mut b = sk.first;
    let mut prev = NIL;
    let mut last = 0;
    let mut seen = 0;
    let mut sum = 0;
    while b != NIL {
        let bucket = &sk.buckets[b as usize];
        assert_eq!(bucket.prev, prev);
        assert!(bucket.count > last, "counts not increasing");
        assert_ne!(bucket.head, NIL, "an empty bucket is linked");
        let mut s = bucket.head;
        let mut sp = NIL;
        while s != NIL {
            let slot = &sk.slots[s as usize];
            assert_eq!((slot.bucket, slot.prev), (b, sp));
            seen += 1;
            sum += bucket.count;
            sp = s;
            s = slot.next;
        }
        last = bucket.count;
        prev = b;
        b = bucket.next;
    }
    assert_eq!(seen, sk.slots.len());
    assert_eq!(sk.index.len(), sk.slots.len());
    // Each replacement adds the old count to the new key's error: the
    // counts add up to the total exactly.
    assert_eq!(sum, sk.total);
}

proptest! {
    #[test]
    fn the_buckets_stay_consistent(
        stream in proptest::collection::vec(0u64..30, 0..400),
        k in 1usize..12,
    ) {
        let mut sk = SpaceSaving::new(k);
        for &x in &stream {
            sk.add(x, || None);
            check(&sk);
        }
    }
}

#[test]
fn long_keys_are_cut_for_show_and_kept_whole_to_act_on() {
    // 600 bytes: shown cut, kept whole.
    let long = "é".repeat(300);
    let k = Key::from_parts([long.as_str(), "x"]);
    let h = Held::of(&k);
    let s = h.shown();
    assert!(s.len() <= MAX_SHOWN + '…'.len_utf8());
    assert!(s.ends_with('…'));
    assert_eq!(h.parts(), Some(vec![long.clone(), "x".to_string()]));
    assert_eq!(Held::of(&Key::from_parts(["a", "b"])).shown(), "a+b");
    // Past MAX_KEPT: shown cut, never acted on.
    let huge = "a".repeat(MAX_KEPT + 1);
    let h = Held::of(&Key::from_parts([huge.as_str()]));
    assert_eq!(h.parts(), None);
    assert!(h.shown().ends_with('…'));
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
