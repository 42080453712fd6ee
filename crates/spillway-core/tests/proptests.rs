//! Property tests: each algorithm's defining invariant, on a virtual clock;
//! and route matching that no respelling of a path steps around.

use proptest::prelude::*;
use spillway_core::{
    FixedWindow, Gcra, KeySpec, LeakyBucket, Limit, Log, Mode, Nanos, PathMatching, Rate,
    RequestPath, Route, Rule, Shaper, SlidingCounter, SlidingLog, TokenBucket, Verdict, Wide,
    canonical_path,
};

/// A limit with its state, so every algorithm can be driven the same way.
#[derive(Debug, Clone)]
struct Driven {
    limit: Limit,
    narrow: u64,
    wide: Wide,
    log: Log,
}

impl Driven {
    fn new(limit: Limit) -> Driven {
        Driven {
            limit,
            narrow: 0,
            wide: Wide::default(),
            log: Log::new(),
        }
    }

    /// Decides without changing anything.
    fn peek(&self, now: u64, cost: u64) -> Verdict {
        let now = Nanos(now);
        if let Some((v, _)) = self.limit.decide_narrow(self.narrow, now, cost) {
            return v;
        }
        if let Some((v, _)) = self.limit.decide_wide(self.wide, now, cost) {
            return v;
        }
        match &self.limit {
            Limit::SlidingLog(l) => l.decide(&self.log, now, cost),
            _ => unreachable!("every limit has a state kind"),
        }
    }

    /// Decides and charges if admitted.
    fn hit(&mut self, now: u64, cost: u64) -> Verdict {
        let t = Nanos(now);
        if let Some((v, next)) = self.limit.decide_narrow(self.narrow, t, cost) {
            if v.allowed {
                self.narrow = next;
            } else {
                assert_eq!(next, self.narrow, "a denial changed the state");
            }
            return v;
        }
        if let Some((v, next)) = self.limit.decide_wide(self.wide, t, cost) {
            if v.allowed {
                self.wide = next;
            } else {
                assert_eq!(next, self.wide, "a denial changed the state");
            }
            return v;
        }
        let Limit::SlidingLog(l) = &self.limit else {
            unreachable!()
        };
        let v = l.decide(&self.log, t, cost);
        if v.allowed {
            l.commit(&mut self.log, t, cost);
        }
        v
    }
}

const SEC: u64 = 1_000_000_000;
/// A start far from zero, like a real epoch time.
const T0: u64 = 1_700_000_000 * SEC;

fn rate() -> impl Strategy<Value = Rate> {
    (
        1u64..50,
        prop_oneof![Just(SEC), Just(60 * SEC), 1u64..5 * SEC],
    )
        .prop_map(|(n, per)| Rate::new(n, Nanos(per.max(n))).unwrap())
}

fn window() -> impl Strategy<Value = u64> {
    prop_oneof![Just(SEC), Just(60 * SEC), 1_000u64..10 * SEC]
}

fn any_limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..20, rate()).prop_map(|(c, r)| Limit::TokenBucket(TokenBucket::new(c, r).unwrap())),
        (1u64..20, rate()).prop_map(|(c, r)| Limit::LeakyBucket(LeakyBucket::new(c, r).unwrap())),
        (1u64..20, rate(), 0u64..10 * SEC)
            .prop_map(|(c, r, w)| Limit::Shaper(Shaper::new(c, r, Nanos(w)).unwrap())),
        (1u64..20, window())
            .prop_map(|(n, w)| Limit::FixedWindow(FixedWindow::new(n, Nanos(w)).unwrap())),
        (1u64..20, window())
            .prop_map(|(n, w)| Limit::SlidingLog(SlidingLog::new(n, Nanos(w)).unwrap())),
        (1u64..20, window())
            .prop_map(|(n, w)| Limit::SlidingCounter(SlidingCounter::new(n, Nanos(w)).unwrap())),
        (1u64..20, rate()).prop_map(|(b, r)| Limit::Gcra(Gcra::new(r, b).unwrap())),
    ]
}

/// Gaps between requests: many at the same instant, some small, some long.
fn gaps(max: u64) -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(
        prop_oneof![3 => Just(0u64), 5 => 0u64..max / 10 + 1, 1 => 0u64..max * 3],
        1..200,
    )
}

fn times(start: u64, gaps: &[u64]) -> Vec<u64> {
    let mut t = start;
    gaps.iter()
        .map(|g| {
            t = t.saturating_add(*g);
            t
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn sliding_log_never_admits_more_than_n_in_any_window(
        n in 1u64..20, w in window(), g in gaps(2 * SEC), costs in prop::collection::vec(1u64..4, 200)
    ) {
        let sl = SlidingLog::new(n, Nanos(w)).unwrap();
        let mut d = Driven::new(Limit::SlidingLog(sl));
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (i, t) in times(T0, &g).into_iter().enumerate() {
            let c = costs[i % costs.len()];
            if d.hit(t, c).allowed {
                admitted.push((t, c));
            }
        }
        // Any window [s, s + w) starting at an admitted request.
        for (i, &(s, _)) in admitted.iter().enumerate() {
            let inside: u64 = admitted[i..].iter().take_while(|(t, _)| *t < s + w).map(|(_, c)| c).sum();
            prop_assert!(inside <= n, "{inside} > {n} in window from {s}");
        }
    }

    #[test]
    fn token_bucket_admits_at_most_capacity_plus_refill(
        c in 1u64..20, r in rate(), g in gaps(SEC), costs in prop::collection::vec(1u64..4, 200)
    ) {
        let tb = TokenBucket::new(c, r).unwrap();
        let mut d = Driven::new(Limit::TokenBucket(tb));
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (i, t) in times(T0, &g).into_iter().enumerate() {
            let k = costs[i % costs.len()];
            if d.hit(t, k).allowed {
                admitted.push((t, k));
            }
        }
        for i in 0..admitted.len() {
            let mut sum = 0u128;
            for &(t, k) in &admitted[i..] {
                sum += u128::from(k);
                let elapsed = u128::from(t - admitted[i].0);
                // sum <= c + elapsed / interval, in integers.
                prop_assert!(sum * u128::from(r.interval()) <= u128::from(c) * u128::from(r.interval()) + elapsed);
            }
        }
    }

    #[test]
    fn gcra_agrees_with_leaky_bucket_meter(
        b in 1u64..20, r in rate(), g in gaps(SEC), costs in prop::collection::vec(1u64..4, 200)
    ) {
        let mut gcra = Driven::new(Limit::Gcra(Gcra::new(r, b).unwrap()));
        let mut meter = Driven::new(Limit::LeakyBucket(LeakyBucket::new(b, r).unwrap()));
        for (i, t) in times(T0, &g).into_iter().enumerate() {
            let k = costs[i % costs.len()];
            let a = gcra.hit(t, k);
            let m = meter.hit(t, k);
            prop_assert_eq!(a.allowed, m.allowed, "at request {}", i);
            prop_assert_eq!(a.remaining, m.remaining);
            prop_assert_eq!(a.retry_after, m.retry_after);
            prop_assert_eq!(a.reset, m.reset);
        }
    }

    #[test]
    fn fixed_window_admits_at_most_n_per_aligned_window(
        n in 1u64..20, w in window(), g in gaps(2 * SEC), costs in prop::collection::vec(1u64..4, 200)
    ) {
        let mut d = Driven::new(Limit::FixedWindow(FixedWindow::new(n, Nanos(w)).unwrap()));
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (i, t) in times(T0, &g).into_iter().enumerate() {
            let k = costs[i % costs.len()];
            if d.hit(t, k).allowed {
                *per_window.entry(t / w).or_default() += k;
            }
        }
        for (win, count) in per_window {
            prop_assert!(count <= n, "window {win}: {count} > {n}");
        }
    }

    #[test]
    fn sliding_counter_stays_within_twice_the_limit_and_n_per_window(
        n in 1u64..20, w in window(), g in gaps(2 * SEC)
    ) {
        let mut d = Driven::new(Limit::SlidingCounter(SlidingCounter::new(n, Nanos(w)).unwrap()));
        let mut admitted = Vec::new();
        for t in times(T0, &g) {
            if d.hit(t, 1).allowed {
                admitted.push(t);
            }
        }
        for (i, &s) in admitted.iter().enumerate() {
            let inside = admitted[i..].iter().take_while(|t| **t < s + w).count() as u64;
            prop_assert!(inside <= 2 * n);
            let aligned = admitted.iter().filter(|t| **t / w == s / w).count() as u64;
            prop_assert!(aligned <= n);
        }
    }

    #[test]
    fn retry_after_is_exact(limit in any_limit(), g in gaps(SEC), cost in 1u64..4) {
        let mut d = Driven::new(limit);
        for t in times(T0, &g) {
            let v = d.hit(t, cost);
            if v.allowed || v.retry_after.is_never() {
                prop_assert!(v.allowed || cost > d.limit.size());
                continue;
            }
            let r = v.retry_after.as_u64();
            prop_assert!(r > 0, "denied but retry_after is zero: {:?}", v);
            prop_assert!(!d.peek(t + r - 1, cost).allowed, "admitted before retry_after {:?}", v);
            prop_assert!(d.peek(t + r, cost).allowed, "denied at retry_after {:?}", v);
        }
    }

    #[test]
    fn a_clock_stepping_back_never_creates_capacity(
        limit in any_limit(), g in gaps(SEC), back in prop::collection::vec(0u64..5 * SEC, 200)
    ) {
        let mut d = Driven::new(limit);
        let mut latest = T0;
        for (i, t) in times(T0, &g).into_iter().enumerate() {
            // Every other request comes from a clock that is behind.
            let now = if i % 2 == 1 { t.saturating_sub(back[i % back.len()]) } else { t };
            let before = d.clone();
            let v = d.hit(now, 1);
            latest = latest.max(t);
            if v.allowed {
                // Whatever a lagging clock admits, the latest time would have admitted too.
                prop_assert!(before.peek(latest.max(now), 1).allowed || now >= latest,
                    "admitted at {now} but not at {latest}");
            }
        }
    }

    #[test]
    fn no_input_panics(
        limit in any_limit(),
        steps in prop::collection::vec((any::<u64>(), any::<u64>()), 1..50)
    ) {
        let mut d = Driven::new(limit);
        for (now, cost) in steps {
            let _ = d.hit(now, cost);
            let _ = d.peek(u64::MAX, cost);
            let _ = d.peek(0, u64::MAX);
        }
    }

    #[test]
    fn extreme_parameters_do_not_panic(
        n in any::<u64>(), per in any::<u64>(), w in any::<u64>(), now in any::<u64>(), cost in any::<u64>()
    ) {
        let mut limits = Vec::new();
        if let Ok(r) = Rate::new(n, Nanos(per)) {
            let c = n.max(1);
            limits.extend(TokenBucket::new(c, r).map(Limit::TokenBucket));
            limits.extend(Gcra::new(r, c).map(Limit::Gcra));
            limits.extend(LeakyBucket::new(c, r).map(Limit::LeakyBucket));
            limits.extend(Shaper::new(c, r, Nanos(w)).map(Limit::Shaper));
        }
        if let Ok(f) = FixedWindow::new(n, Nanos(w)) { limits.push(Limit::FixedWindow(f)); }
        if let Ok(f) = SlidingCounter::new(n, Nanos(w)) { limits.push(Limit::SlidingCounter(f)); }
        if let Ok(f) = SlidingLog::new(n.min(1000), Nanos(w)) { limits.push(Limit::SlidingLog(f)); }
        for l in limits {
            let mut d = Driven::new(l.clone());
            let _ = d.hit(now, cost);
            let _ = d.hit(now.saturating_add(1), 1);
            let _ = d.hit(u64::MAX, 1);
            let _ = l.scaled(u32::MAX);
        }
    }

    #[test]
    fn shaper_waits_grow_by_the_interval_and_never_exceed_max_wait(
        c in 1u64..20, r in rate(), max_wait in 0u64..10 * SEC, g in gaps(SEC)
    ) {
        let mut d = Driven::new(Limit::Shaper(Shaper::new(c, r, Nanos(max_wait)).unwrap()));
        let mut last_departure = 0u64;
        for t in times(T0, &g) {
            let v = d.hit(t, 1);
            if v.allowed {
                prop_assert!(v.wait.as_u64() <= max_wait);
                let departs = t + v.wait.as_u64();
                // Departures keep the outflow rate.
                if last_departure != 0 {
                    prop_assert!(departs >= last_departure + r.interval());
                }
                last_departure = departs;
            }
        }
    }
}

#[test]
fn fixed_window_is_aligned_to_the_epoch() {
    let fw = FixedWindow::new(1, Nanos::from_secs(60)).unwrap();
    let (v, s) = fw.decide(Wide::default(), Nanos::from_secs(6_000 + 59), 1);
    assert!(v.allowed);
    assert_eq!(v.reset, Nanos::from_secs(1));
    let (v, _) = fw.decide(s, Nanos::from_secs(6_000 + 59), 1);
    assert!(!v.allowed);
    assert_eq!(v.retry_after, Nanos::from_secs(1));
}

#[test]
fn a_cost_above_the_limit_is_never_admitted() {
    let fw = FixedWindow::new(5, Nanos::from_secs(1)).unwrap();
    let (v, _) = fw.decide(Wide::default(), Nanos::from_secs(10), 6);
    assert!(!v.allowed);
    assert!(v.retry_after.is_never());
}

// Any parameters a constructor accepts are enforced.

/// A `u64` from anywhere in its range, often at the edges.
fn wide_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        1u64..1_000,
        (0u32..64).prop_map(|k| 1u64 << k),
        (1u32..64).prop_map(|k| (1u64 << k) - 1),
        (0u64..1_000).prop_map(|k| u64::MAX - k),
    ]
}

/// Every algorithm built from `n` (its size), `per`/`w` (a period and a
/// window) and `max_wait`, as far as its constructor accepts them.
fn accepted(n: u64, count: u64, per: u64, w: u64, max_wait: u64) -> Vec<Limit> {
    let mut limits = Vec::new();
    if let Ok(r) = Rate::new(count, Nanos(per)) {
        limits.extend(TokenBucket::new(n, r).map(Limit::TokenBucket));
        limits.extend(Gcra::new(r, n).map(Limit::Gcra));
        limits.extend(LeakyBucket::new(n, r).map(Limit::LeakyBucket));
        limits.extend(Shaper::new(n, r, Nanos(max_wait)).map(Limit::Shaper));
    }
    limits.extend(FixedWindow::new(n, Nanos(w)).map(Limit::FixedWindow));
    limits.extend(SlidingCounter::new(n, Nanos(w)).map(Limit::SlidingCounter));
    limits.extend(SlidingLog::new(n, Nanos(w)).map(Limit::SlidingLog));
    limits
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// For any parameters a constructor accepts and any time before 2^63
    /// ns: on a fresh state a first request of cost up to the limit is
    /// admitted, and `limit + 1` units in one window are not, whether the
    /// last one comes at once or later in the window. (A sliding counter
    /// with a window over ~193,000 days saturated its state and enforced
    /// nothing; a bucket whose capacity took over 2^64 ns to refill, or a
    /// fixed window of limit u64::MAX, admitted any cost.)
    #[test]
    fn accepted_parameters_are_enforced(
        n in wide_u64(),
        count in wide_u64(),
        per in wide_u64(),
        w in wide_u64(),
        max_wait in wide_u64(),
        now in 0u64..1 << 63,
        first in any::<prop::sample::Index>(),
        later in any::<u64>(),
    ) {
        for limit in accepted(n, count, per, w, max_wait) {
            let size = limit.size();
            let c = first.index(usize::try_from(size).unwrap_or(usize::MAX)) as u64 + 1;
            let mut d = Driven::new(limit.clone());
            prop_assert!(d.hit(now, c).allowed, "{:?}: first {} at {}", limit, c, now);
            prop_assert!(!d.peek(now, size - c + 1).allowed, "{:?}: {} more", limit, size - c + 1);
            if matches!(limit, Limit::Shaper(_)) {
                // The rest may wait longer than max_wait; the queue bound holds.
                continue;
            }
            if c < size {
                prop_assert!(d.hit(now, size - c).allowed, "{:?}: the rest, {}", limit, size - c);
            }
            prop_assert!(!d.hit(now, 1).allowed, "{:?}: one more at once", limit);
            // Later in the same window, for the window algorithms.
            let end = match &limit {
                Limit::FixedWindow(_) | Limit::SlidingCounter(_) => {
                    (now - now % w).saturating_add(w)
                }
                Limit::SlidingLog(_) => now.saturating_add(w),
                _ => continue,
            };
            let at = now + later % (end.min(1 << 63) - now);
            prop_assert!(!d.hit(at, 1).allowed, "{:?}: one more at {}", limit, at);
        }
    }

    /// A sliding log's memory is bounded by its limit whatever costs
    /// clients send: a cost above the limit is denied and allocates
    /// nothing, and even a commit of a huge cost logs at most the limit.
    #[test]
    fn a_sliding_log_stays_within_its_limit_whatever_the_cost(
        n in 1u64..=spillway_core::algo::MAX_LOG_LIMIT,
        w in window(),
        costs in prop::collection::vec(wide_u64(), 1..6),
    ) {
        let l = SlidingLog::new(n, Nanos(w)).unwrap();
        let mut log = Log::new();
        for cost in costs {
            let before = log.clone();
            let v = l.decide(&log, Nanos(T0), cost);
            if cost > n {
                prop_assert!(!v.allowed);
            }
            if v.allowed {
                l.commit(&mut log, Nanos(T0), cost);
            } else {
                prop_assert_eq!(&log, &before);
            }
            prop_assert!(log.len() as u64 <= n);
            prop_assert!(log.heap_bytes() as u64 <= 4 * n.max(16));
        }
        l.commit(&mut log, Nanos(T0 + 1), u64::MAX);
        prop_assert!(log.len() as u64 <= n);
        prop_assert!(log.heap_bytes() as u64 <= 4 * n.max(16));
    }
}

#[test]
fn limits_too_large_to_enforce_are_refused_naming_the_maximum() {
    let e = SlidingLog::new(100_001, Nanos(SEC)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sliding_window_log limit 100001 is larger than the maximum 100000"
    );
    let day = Rate::new(1, Nanos(86_400 * SEC)).unwrap();
    let e = TokenBucket::new(1 << 40, day).unwrap_err();
    assert_eq!(
        e.to_string(),
        "token_bucket capacity 1099511627776 is larger than the maximum 53375"
    );
    assert!(TokenBucket::new(53_375, day).is_ok());
    assert!(Gcra::new(day, 53_376).is_err());
    assert!(LeakyBucket::new(53_376, day).is_err());
    // A sliding counter takes any window; it was a window over 193,000
    // days that enforced nothing.
    let long = SlidingCounter::new(10, Nanos(200_000 * 86_400 * SEC)).unwrap();
    let mut state = Wide::default();
    for i in 0..11 {
        let (v, next) = long.decide(state, Nanos(T0 + i), 1);
        assert_eq!(v.allowed, i < 10, "request {i}");
        state = next;
    }
}

// Route matching: count when in doubt.

/// A rule for `GET` on `segs`, its path, and the default-canonical form.
fn get_rule(segs: &[String]) -> (Rule, String) {
    let path = format!("/{}", segs.join("/"));
    let limit = Limit::FixedWindow(FixedWindow::new(1, Nanos(SEC)).unwrap());
    let route = Route::parse(&format!("GET {path}")).unwrap();
    let by = KeySpec::parse("ip").unwrap();
    let rule = Rule::new("r", Some(route), by, vec![limit], Mode::Hard).unwrap();
    (rule, path)
}

fn segments(min: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[a-z0-9][a-z0-9._~-]{0,3}", min..5).prop_filter("no dot segments", |s| {
        s.iter().all(|x| x != "." && x != "..")
    })
}

/// A path separator other than the first: `/`, `%2F` or `%2f`.
fn separator() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["/", "/", "%2F", "%2f"])
}

/// One segment respelled: a `..;` detour before it (through a made-up
/// segment, with its own separators), and path parameters after it.
#[derive(Debug, Clone)]
struct Respelled {
    detour: Option<(String, &'static str, &'static str)>,
    params: Option<String>,
    separator: &'static str,
}

fn respelled() -> impl Strategy<Value = Respelled> {
    (
        prop::option::of(("[a-z]{1,3}", separator(), separator())),
        prop::option::of(";[a-z0-9=,]{0,5}"),
        separator(),
    )
        .prop_map(|(detour, params, separator)| Respelled {
            detour,
            params,
            separator,
        })
}

/// `segs` written with the respellings `how`, and a trailing `/` if asked.
fn respell(segs: &[String], how: &[Respelled], trailing: bool) -> String {
    let mut out = String::new();
    for (i, (seg, r)) in segs.iter().zip(how.iter().cycle()).enumerate() {
        out.push_str(if i == 0 { "/" } else { r.separator });
        if let Some((via, s1, s2)) = &r.detour {
            out.push_str(&format!(
                "{via}{s1}..;{}{s2}",
                r.params.as_deref().unwrap_or("")
            ));
        }
        out.push_str(seg);
        out.push_str(r.params.as_deref().unwrap_or(""));
    }
    if trailing {
        out.push('/');
    }
    out
}

proptest! {
    /// Any respelling of a path made of a trailing slash, `;` parameters,
    /// `..;` detours and `%2F`/`%2f` for `/`, sent as `GET` or `HEAD`,
    /// meets the rule for `GET` on the path, through the calls the
    /// limiter makes (`canonical_path`, then `Rule::applies_to`), and has
    /// the path's canonical form (so a `route` key counts them together).
    #[test]
    fn any_respelling_meets_the_rule_for_its_path(
        segs in segments(1),
        how in prop::collection::vec(respelled(), 1..5),
        trailing in any::<bool>(),
        head in any::<bool>(),
    ) {
        let (rule, path) = get_rule(&segs);
        let spelled = respell(&segs, &how, trailing);
        let method = if head { "HEAD" } else { "GET" };
        let canonical = canonical_path(&spelled);
        prop_assert_eq!(&canonical, &canonical_path(&path), "{}", spelled);
        prop_assert!(rule.applies_to(Some(method), Some(&canonical)), "{} {}", method, spelled);
        let req = RequestPath::new(&spelled, PathMatching::default());
        prop_assert!(rule.applies_to_path(Some(method), Some(&req)), "{} {}", method, spelled);
        prop_assert_eq!(PathMatching::default().method(method), "GET");
    }

    /// With a switch off, the respelling it governs no longer meets the
    /// rule (set per rule, over a limiter's lenient global options),
    /// while the plain path still does.
    #[test]
    fn a_stricter_switch_stops_its_respelling(
        segs in segments(2),
        params in ";[a-z0-9=,]{0,5}",
        via in "[a-z]{1,3}",
        sep in prop::sample::select(vec!["%2F", "%2f"]),
        at in any::<prop::sample::Index>(),
    ) {
        let (rule, path) = get_rule(&segs);
        let i = at.index(segs.len());
        let with = |f: fn(&mut PathMatching)| {
            let mut m = PathMatching::default();
            f(&mut m);
            rule.clone().with_path_matching(m)
        };
        let mut with_params = segs.clone();
        with_params[i].push_str(&params);
        let mut detoured = segs.clone();
        detoured[i] = format!("{via}/..;/{}", segs[i]);
        let encoded = format!("/{}{sep}{}", segs[0], segs[1..].join("/"));
        let cases = [
            (with(|m| m.head_as_get = false), "HEAD", path.clone()),
            (with(|m| m.trailing_slash = false), "GET", format!("{path}/")),
            (with(|m| m.path_params = false), "GET", format!("/{}", with_params.join("/"))),
            (with(|m| m.path_params = false), "GET", format!("/{}", detoured.join("/"))),
            (with(|m| m.encoded_slash = false), "GET", encoded),
        ];
        for (strict, method, spelled) in &cases {
            let req = RequestPath::new(spelled, PathMatching::default());
            prop_assert!(rule.applies_to_path(Some(method), Some(&req)), "{} {}", method, spelled);
            prop_assert!(!strict.applies_to_path(Some(method), Some(&req)), "{} {}", method, spelled);
            let plain = RequestPath::new(&path, PathMatching::default());
            prop_assert!(strict.applies_to_path(Some("GET"), Some(&plain)), "{}", path);
            // The same through a strict global setting and no rule of its own.
            let m = strict.path_matching().unwrap();
            let global = RequestPath::new(spelled, m);
            prop_assert!(!rule.applies_to_path(Some(method), Some(&global)), "{} {}", method, spelled);
        }
    }
}
