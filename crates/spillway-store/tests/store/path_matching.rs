//! The limiter's path matching (the issue "No way past a limit"): a
//! request that respells a limited one (`HEAD` for `GET`, a trailing `/`,
//! `;` path parameters, `%2F`) counts against its rule unless the rule set,
//! or the rule itself, turns that switch off. With and without the route
//! index (from 16 rules on).

use spillway_core::{
    FixedWindow, KeySpec, Limit, ManualClock, Mode, Nanos, PathMatching, Route, Rule,
};
use spillway_store::{Limiter, MemoryStore, Request, RuleSet, SimpleAttributes, block_on};

/// Rules added after the one under test so that the route index is used.
const INDEX_FILLER: usize = 20;

fn rule(name: &str, api: &str, by: &str) -> Rule {
    let limit = Limit::FixedWindow(FixedWindow::new(1, Nanos::from_secs(3600)).unwrap());
    Rule::new(
        name,
        Some(Route::parse(api).unwrap()),
        KeySpec::parse(by).unwrap(),
        vec![limit],
        Mode::Hard,
    )
    .unwrap()
}

/// A limiter whose first rule is `first`, under `global`; with `filler`
/// more rules for other paths.
fn limiter(first: Rule, global: PathMatching, filler: usize) -> Limiter<MemoryStore<ManualClock>> {
    let mut rules = vec![first];
    rules.extend((0..filler).map(|i| rule(&format!("other{i}"), &format!("/other{i}"), "user")));
    let store = MemoryStore::new(ManualClock::new(Nanos::from_secs(1)), Default::default());
    Limiter::new(store, RuleSet::with_path_matching(rules, global))
}

/// Whether a request of user `u` is admitted.
fn admitted(l: &Limiter<MemoryStore<ManualClock>>, method: &str, path: &str) -> bool {
    let attrs = SimpleAttributes {
        user: Some("u"),
        ..Default::default()
    };
    let req = Request {
        method: Some(method),
        path: Some(path),
        attrs: &attrs,
        cost: 1,
    };
    block_on(l.check(&req)).decision.allowed
}

/// Each switch with the respelling it governs.
fn respellings() -> Vec<(&'static str, PathMatching, &'static str, &'static str)> {
    let on = PathMatching::LENIENT;
    vec![
        (
            "head_as_get",
            PathMatching {
                head_as_get: false,
                ..on
            },
            "HEAD",
            "/a",
        ),
        (
            "trailing_slash",
            PathMatching {
                trailing_slash: false,
                ..on
            },
            "GET",
            "/a/",
        ),
        (
            "path_params",
            PathMatching {
                path_params: false,
                ..on
            },
            "GET",
            "/a;jsessionid=1",
        ),
        (
            "encoded_slash",
            PathMatching {
                encoded_slash: false,
                ..on
            },
            "GET",
            "/b%2F..%2Fa",
        ),
    ]
}

#[test]
fn by_default_a_respelled_request_counts_against_the_rule_for_get_a() {
    for filler in [0, INDEX_FILLER] {
        for (switch, _, method, path) in respellings() {
            let l = limiter(
                rule("get-a", "GET /a", "user"),
                PathMatching::default(),
                filler,
            );
            assert!(admitted(&l, "GET", "/a"));
            assert!(
                !admitted(&l, method, path),
                "{switch}: {method} {path} stepped past the used-up GET /a ({filler} more rules)"
            );
        }
    }
}

#[test]
fn a_switch_turned_off_globally_lets_its_respelling_pass() {
    for filler in [0, INDEX_FILLER] {
        for (switch, off, method, path) in respellings() {
            let l = limiter(rule("get-a", "GET /a", "user"), off, filler);
            assert!(admitted(&l, "GET", "/a"));
            assert!(
                admitted(&l, method, path),
                "{switch} off: {method} {path} still met the rule ({filler} more rules)"
            );
            assert!(!admitted(&l, "GET", "/a"), "{switch} off: GET /a itself");
        }
    }
}

#[test]
fn a_rule_of_its_own_overrides_the_global_switches() {
    for filler in [0, INDEX_FILLER] {
        for (switch, off, method, path) in respellings() {
            // Global lenient, the rule strict on one switch.
            let strict_rule = rule("get-a", "GET /a", "user").with_path_matching(off);
            let l = limiter(strict_rule, PathMatching::LENIENT, filler);
            assert!(admitted(&l, "GET", "/a"));
            assert!(admitted(&l, method, path), "{switch} off on the rule");
            // Global strict, the rule lenient: the respelling counts.
            let lenient_rule =
                rule("get-a", "GET /a", "user").with_path_matching(PathMatching::LENIENT);
            let l = limiter(lenient_rule, PathMatching::STRICT, filler);
            assert!(admitted(&l, "GET", "/a"));
            assert!(
                !admitted(&l, method, path),
                "{switch} on on the rule, off globally ({filler} more rules)"
            );
        }
    }
}

/// `by: user+route` under a prefix: `HEAD /v1/a` is named `GET /v1/a`, so
/// it shares the counter of the `GET`; with `head_as_get` off it has its own.
#[test]
fn head_shares_the_route_key_of_get_unless_head_as_get_is_off() {
    for (global, shared) in [
        (PathMatching::LENIENT, true),
        (
            PathMatching {
                head_as_get: false,
                ..PathMatching::LENIENT
            },
            false,
        ),
    ] {
        let l = limiter(rule("per-endpoint", "/v1/*", "user+route"), global, 0);
        assert!(admitted(&l, "GET", "/v1/a/"));
        assert_eq!(!admitted(&l, "head", "/v1/a"), shared, "{global:?}");
        // The rule's own switch names the endpoint, whatever the global one.
        let own = rule("per-endpoint", "/v1/*", "user+route").with_path_matching(global);
        let l = limiter(own, PathMatching::STRICT, INDEX_FILLER);
        assert!(admitted(&l, "GET", "/v1/a"));
        assert_eq!(!admitted(&l, "HEAD", "/v1/a"), shared, "own {global:?}");
    }
}

/// `case: insensitive` (the default since issue 35): `/A/B` counts
/// against a rule written `GET /a/B`, globally or on the rule alone, with
/// and without the route index; `case: sensitive`, it is another path.
#[test]
fn case_insensitive_matching_counts_every_case_as_the_path() {
    let insensitive = PathMatching::default();
    assert!(insensitive.case_insensitive, "insensitive by default");
    let sensitive = PathMatching {
        case_insensitive: false,
        ..PathMatching::LENIENT
    };
    for filler in [0, INDEX_FILLER] {
        for spelled in ["/A/b", "/a/B/", "/%41/b", "/A/B"] {
            let l = limiter(rule("ab", "GET /a/B", "user"), insensitive, filler);
            assert!(
                admitted(&l, "GET", "/a/b"),
                "{spelled} ({filler} more rules)"
            );
            assert!(
                !admitted(&l, "GET", spelled),
                "{spelled} stepped past ({filler} more rules)"
            );
            // The rule alone insensitive, under a sensitive rule set.
            let own = rule("ab", "GET /a/B", "user").with_path_matching(insensitive);
            let l = limiter(own, sensitive, filler);
            assert!(admitted(&l, "GET", "/a/B"));
            assert!(
                !admitted(&l, "GET", spelled),
                "{spelled}: the rule's own switch"
            );
        }
        // `case: sensitive`: another path, another counter.
        let l = limiter(rule("ab", "GET /a/B", "user"), sensitive, filler);
        assert!(admitted(&l, "GET", "/a/B"));
        assert!(admitted(&l, "GET", "/A/b"), "case-sensitive when told");
        assert!(!admitted(&l, "GET", "/a/B"));
        // The rule alone sensitive, under the default rule set.
        let own = rule("ab", "GET /a/B", "user").with_path_matching(sensitive);
        let l = limiter(own, insensitive, filler);
        assert!(admitted(&l, "GET", "/a/B"));
        assert!(
            admitted(&l, "GET", "/A/b"),
            "the rule's own sensitive switch"
        );
    }
}
