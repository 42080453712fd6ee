/// spillway-rules skips the sections of a server's file and refuses
/// any other key: its list must be exactly the sections read here.
#[test]
fn spillway_rules_knows_every_section_of_the_file() {
    let e = parse("r.yaml", "zzz: 1\nrules: []\n")
        .unwrap_err()
        .to_string();
    let listed = e
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("no field list in {e:?}"));
    let mut ours: Vec<&str> = listed.trim().split(", ").collect();
    let mut theirs = spillway_rules::SECTIONS.to_vec();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs);
}

use super::*;
use spillway_core::Nanos;

/// `proxy.upstream` as a URL (as before) or a map with `url` and
/// `max_connections`; a bad bound or a map without a URL is a located
/// error.
#[test]
fn the_upstream_is_a_url_or_a_map_with_its_connection_bound() {
    let proxy = |upstream: &str| {
        parse(
            "r.yaml",
            &format!("proxy:\n  upstream: {upstream}\nrules: []\n"),
        )
        .map(|c| c.proxy.expect("a proxy section"))
    };
    let p = proxy("http://127.0.0.1:9").unwrap();
    assert_eq!(p.upstream.unwrap().authority(), "127.0.0.1:9");
    assert_eq!(p.max_connections, None);
    let p = proxy("{ url: http://127.0.0.1:9/api, max_connections: 50 }").unwrap();
    assert_eq!(p.upstream.unwrap().base(), "/api");
    assert_eq!(p.max_connections, Some(50));
    let p = proxy("\n    url: http://x:1\n").unwrap();
    assert_eq!(
        (p.upstream.unwrap().authority(), p.max_connections),
        ("x:1", None)
    );
    for (bad, says) in [
        ("{ url: http://x, max_connections: 0 }", "r.yaml:2:"),
        ("{ url: ftp://x }", "r.yaml:2:"),
        ("{ max_connections: 3 }", "needs `url:`"),
        ("{ url: http://x, max_conections: 3 }", "unknown field"),
        ("[http://x]", "r.yaml:2:"),
    ] {
        let e = proxy(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
    assert_eq!(crate::proxy::default_upstream_connections(1000), 250);
}

/// `proxy.buffer_body`: bytes, or a number with a unit; 0 turns it
/// off; past 16 MiB, a negative number or an unknown unit is a
/// located error.
#[test]
fn the_buffered_body_size_is_read_with_its_unit() {
    let buffered = |v: &str| {
        parse(
            "r.yaml",
            &format!("proxy:\n  buffer_body: {v}\nrules: []\n"),
        )
        .map(|c| c.proxy.expect("a proxy section").buffer_body)
    };
    assert_eq!(crate::proxy::Settings::default().buffer_body, 64 * 1024);
    for (v, want) in [
        ("0", 0),
        ("1000", 1000),
        ("64KiB", 65536),
        ("\"1 MiB\"", 1 << 20),
        ("2kB", 2000),
        ("16MiB", 16 << 20),
    ] {
        assert_eq!(buffered(v).unwrap(), want, "{v}");
    }
    for bad in ["-1", "17MiB", "64 KB x", "lots", "1.5MiB", "[1]"] {
        let e = buffered(bad).unwrap_err().to_string();
        assert!(e.contains("r.yaml:2:"), "{bad}: {e}");
    }
    assert_eq!(crate::proxy::default_upstream_connections(10), 8);
}

proptest::proptest! {
    /// The example rules with a few edits anywhere (numbers, units,
    /// brackets, anchors, odd characters): accepted or refused with
    /// located errors, never a panic.
    #[test]
    fn edited_rules_files_are_accepted_or_refused_with_locations(
        edits in proptest::collection::vec(
            (
                0usize..4096,
                0usize..4,
                proptest::sample::select(vec![
                    "", "0", "-1", "18446744073709551616", "99999999999d", "1e9", "/0s",
                    "ms", "%", "soft 1001%", "{", "}", "[", "]", ":", "- ", "\n", "\t",
                    "&a", "*a", "!!binary", "~", "\"", "'", "é", "\u{0}", "#",
                    "user+ip+user", "header:", "queue: { max_wait: 0s }",
                ]),
            ),
            1..4,
        ),
    ) {
        let mut text = EXAMPLE_RULES.to_string();
        for (at, cut, insert) in edits {
            let mut at = at % (text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let mut end = (at + cut).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(at..end, insert);
        }
        if let Err(e) = parse("r.yaml", &text) {
            let shown = e.to_string();
            proptest::prop_assert!(!e.0.is_empty());
            for line in shown.lines().filter(|l| !l.starts_with(' ')) {
                proptest::prop_assert!(line.starts_with("r.yaml:"), "{line}");
            }
        }
    }
}

#[test]
fn parser_messages_lose_their_own_location_and_name_what_was_expected() {
    for (value, want) in [
        (
            "1.5",
            "r.yaml:4:32: expected a whole number (at most 9223372036854775807)",
        ),
        (
            "99999999999999999999",
            "r.yaml:4:32: expected a whole number",
        ),
    ] {
        let text = format!(
            "rules:\n  - name: a\n    limits:\n      - fixed_window: {{ limit: {value}, window: 1m }}\n"
        );
        let e = parse("r.yaml", &text).unwrap_err().to_string();
        assert!(e.starts_with(want), "{value}: {e}");
    }
    let e = parse("r.yaml", "store: { memory: { max_keys: -1 } }\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("expected a whole number from 0 to 18446744073709551615"),
        "{e}"
    );
    let e = parse("r.yaml", "colour: red\n").unwrap_err().to_string();
    assert!(e.starts_with("r.yaml:1:1: unknown field `colour`"), "{e}");
    // Structure the parser expected, in the user's words, and no parser
    // options.
    for (text, want) in [
        ("rules: 5\n", "r.yaml:1:8: expected a list"),
        ("rules: [1]\n", "r.yaml:1:9: expected a map"),
        (
            "rules:\n  - name: [a]\n    limits: [ { gcra: { rate: 1/s } } ]\n",
            "r.yaml:2:11: expected a string",
        ),
        (
            "rules:\n  - name: a\n    name: b\n    limits: [ { gcra: { rate: 1/s } } ]\n",
            "r.yaml:3:5: duplicate key `name`",
        ),
    ] {
        let e = parse("r.yaml", text).unwrap_err().to_string();
        assert!(e.starts_with(want), "{text:?}: {e}");
        assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    }
}

#[test]
fn a_reload_names_the_settings_that_wait_for_a_restart() {
    let rules = "rules:\n  - name: a\n    limits:\n      - gcra: { rate: 1/s, burst: 1 }\n";
    let start = parse("a.yaml", rules).unwrap();
    let same = parse("a.yaml", &rules.replace("1/s", "5/s")).unwrap();
    assert!(start.start_only_changes(&same).is_empty());
    let moved = format!(
        "store: {{ redis: {{ url: redis://127.0.0.1:1 }} }}\nlisten: 127.0.0.1:9\nproxy: {{ upstream: http://127.0.0.1:2 }}\n{rules}"
    );
    let moved = parse("a.yaml", &moved).unwrap();
    assert_eq!(
        start.start_only_changes(&moved),
        ["store", "listen", "proxy"]
    );
    // The gateways' way in is built at start (issue 35): a reload that
    // changes it says so.
    let gateway = parse(
        "a.yaml",
        &format!("forward_auth: {{ path: /gate }}\n{rules}"),
    )
    .unwrap();
    assert_eq!(start.start_only_changes(&gateway), ["forward_auth"]);
    assert!(gateway.start_only_changes(&gateway.clone()).is_empty());
}

/// Each section the parser knows says once whether a reload applies it:
/// a section added to the file without saying so fails here.
#[test]
fn every_section_says_when_a_change_to_it_applies() {
    let mut ours: Vec<&str> = SECTIONS.iter().map(|s| s.key).collect();
    let mut theirs = spillway_rules::SECTIONS.to_vec();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs);
    let mut unique = ours.clone();
    unique.dedup();
    assert_eq!(unique, ours, "a section listed twice");
    let base = parse("a.yaml", "rules: []\n").unwrap();
    for s in SECTIONS {
        assert!(!(s.changed)(&base, &base.clone()), "{}", s.key);
    }
}

#[test]
fn durations_and_rates() {
    assert_eq!(parse_duration("500ms").unwrap(), Nanos::from_millis(500));
    assert_eq!(parse_duration("1d").unwrap(), Nanos::from_secs(86_400));
    assert_eq!(parse_duration("1.5s").unwrap(), Nanos::from_millis(1500));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("1y").is_err());
    assert!(parse_duration("99999999999999999999d").is_err());
    let r = parse_rate("100/1m").unwrap();
    assert_eq!((r.count(), r.per()), (100, Nanos::from_secs(60)));
    let r = parse_rate("5/s").unwrap();
    assert_eq!((r.count(), r.per()), (5, Nanos::from_secs(1)));
    assert!(parse_rate("0/s").is_err());
    assert!(parse_rate("5").is_err());
    assert!(parse_rate("x/s").is_err());
}

#[test]
fn the_example_file_is_valid() {
    let c = parse("example", EXAMPLE_RULES).unwrap();
    assert!(c.rules.len() >= 4);
}

#[test]
fn errors_name_line_and_column() {
    let text = "rules:\n  - name: a\n    limits:\n      - fixed_window: { limit: 0, window: 1m }\n";
    let e = parse("f.yaml", text).unwrap_err();
    assert_eq!(e.0.len(), 1);
    assert_eq!((e.0[0].line, e.0[0].column), (4, 32), "{e}");
    let text = "rules:\n  - name: a\n    bogus: 1\n    limits: []\n";
    let e = parse("f.yaml", text).unwrap_err();
    assert_eq!(e.0[0].line, 3, "{e}");
}

/// `store.redis.sync` as the issue writes it, and `share`.
#[test]
fn sync_as_written() {
    let text = "store:\n  redis:\n    url: redis://10.0.0.5:6379/0\n    sync:\n      mode: eventual\n      interval: 100ms\n      region: eu-west\n      regions:\n        us-east: redis://10.1.0.5:6379/0\non_store_error: share\nrules: []\n";
    let c = parse("s.yaml", text).unwrap();
    assert_eq!(c.on_store_error, FailPolicy::Share);
    let StoreConfig::Sync(s) = &c.store else {
        panic!("{:?}", c.store)
    };
    assert_eq!(s.redis.url, "redis://10.0.0.5:6379/0");
    assert_eq!(s.sync.mode, spillway_sync::SyncMode::Eventual);
    assert_eq!(s.sync.interval, Duration::from_millis(100));
    assert_eq!(s.sync.region.as_deref(), Some("eu-west"));
    assert_eq!(s.regions.len(), 1);
    assert_eq!(s.regions[0].0, "us-east");
    assert_eq!(s.regions[0].1.url, "redis://10.1.0.5:6379/0");
    let lease = parse("s.yaml", &text.replace("eventual", "lease")).unwrap();
    assert!(
        matches!(lease.store, StoreConfig::Sync(s) if s.sync.mode == spillway_sync::SyncMode::Lease)
    );
    let rule_share = "rules:\n  - name: a\n    on_store_error: share\n    limits:\n      - gcra: { rate: 1/s, burst: 1 }\n";
    let c = parse("r.yaml", rule_share).unwrap();
    assert_eq!(c.rules[0].fail_policy(), Some(FailPolicy::Share));
}

/// Every mistake in a sync section is an error with its place.
#[test]
fn sync_errors() {
    let base = |sync: &str| {
        format!("store:\n  redis:\n    url: redis://h:1\n    sync: {sync}\nrules: []\n")
    };
    for (sync, want) in [
        (
            "{ mode: fast }",
            "redis.sync.mode \"fast\": expected eventual or lease",
        ),
        (
            "{ interval: 0s }",
            "redis.sync.interval must be longer than zero",
        ),
        ("{ interval: 2m }", "redis.sync.interval: at most 60s"),
        ("{ interval: soon }", "redis.sync.interval"),
        ("{ regions: { b: redis://h:2 } }", "needs redis.sync.region"),
        (
            "{ region: a, regions: { a: redis://h:2 } }",
            "is this instance's own region",
        ),
        (
            "{ region: a, regions: { b: http://h:2 } }",
            "is not a redis:// or rediss:// url",
        ),
        ("{ region: 'a b' }", "redis.sync.region: 1 to 64"),
        ("{ max_keys: 0 }", "redis.sync.max_keys must be at least 1"),
        ("{ speed: 1 }", "unknown field"),
    ] {
        let e = parse("s.yaml", &base(sync)).unwrap_err().to_string();
        assert!(e.contains(want), "{sync}: {e}");
        assert!(e.contains("s.yaml:4:"), "{sync}: {e}");
    }
    let cluster =
        "store:\n  redis:\n    cluster: [redis://h:1]\n    sync: { mode: eventual }\nrules: []\n";
    let e = parse("c.yaml", cluster).unwrap_err().to_string();
    assert!(
        e.contains("a Redis Cluster is decided per request only"),
        "{e}"
    );
    let e = parse("p.yaml", "on_store_error: half\nrules: []\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected allow, deny or share"), "{e}");
    let shaper = "store:\n  redis:\n    url: redis://h:1\n    sync: { mode: lease }\nrules:\n  - name: q\n    limits:\n      - leaky_bucket: { capacity: 5, leak: 1/s }\n    queue: { max_wait: 1s }\n";
    let e = parse("q.yaml", shaper).unwrap_err().to_string();
    assert!(e.contains("cannot be leased"), "{e}");
    assert!(parse("q.yaml", &shaper.replace("lease", "eventual")).is_ok());
}

#[test]
fn redis_buckets() {
    let with =
        |b: &str| format!("store:\n  redis:\n    url: redis://h:1\n    buckets: {b}\nrules: []\n");
    let c = parse("f.yaml", &with("1024")).unwrap();
    assert!(matches!(c.store, StoreConfig::Redis(r) if r.buckets == 1024));
    for bad in ["0", "-3", "99999999999"] {
        let e = parse("f.yaml", &with(bad)).unwrap_err();
        assert_eq!(e.0[0].line, 4, "{bad}: {e}");
        assert!(e.0[0].message.contains("buckets"), "{bad}: {e}");
    }
}

#[test]
fn redis_over_limit_cache() {
    let with = |n: &str| {
        format!("store:\n  redis:\n    url: redis://h:1\n    over_limit_cache: {n}\nrules: []\n")
    };
    for (n, want) in [("0", 0), ("100", 100)] {
        let c = parse("f.yaml", &with(n)).unwrap();
        assert!(matches!(c.store, StoreConfig::Redis(r) if r.over_limit_cache == want));
    }
    let c = parse(
        "f.yaml",
        "store:\n  redis:\n    url: redis://h:1\nrules: []\n",
    )
    .unwrap();
    assert!(matches!(c.store, StoreConfig::Redis(r)
        if r.over_limit_cache == spillway_redis::DEFAULT_OVER_LIMIT_CACHE));
    for bad in ["-1", "99999999999"] {
        let e = parse("f.yaml", &with(bad)).unwrap_err();
        assert_eq!(e.0[0].line, 4, "{bad}: {e}");
        assert!(e.0[0].message.contains("over_limit_cache"), "{bad}: {e}");
    }
}

/// An override's limits are JSON: `10.0` is the integer 10, as JSON
/// Schema reads it; `10.5` is still refused where a count is asked.
#[test]
fn override_limits_take_whole_numbers_written_with_a_fraction() {
    let whole = serde_json::json!([{ "fixed_window": { "limit": 10.0, "window": "1m" } }]);
    let plain = serde_json::json!([{ "fixed_window": { "limit": 10, "window": "1m" } }]);
    assert_eq!(
        limits_from_json(&whole, None).unwrap(),
        limits_from_json(&plain, None).unwrap()
    );
    let half = serde_json::json!([{ "fixed_window": { "limit": 10.5, "window": "1m" } }]);
    assert!(limits_from_json(&half, None).is_err());
}

/// `store.redis.sentinel` as written, and each mistake with its line.
#[test]
fn redis_sentinel() {
    let with = |s: &str| format!("store:\n  redis:\n    sentinel: {s}\nrules: []\n");
    let c = parse(
        "f.yaml",
        &with("{ master: m, nodes: [ 'a:26379', '[::1]:26380' ], password: p, sentinel_password: q, tls: true, db: 2 }"),
    )
    .unwrap();
    let StoreConfig::Redis(r) = &c.store else {
        panic!("not a redis store")
    };
    let s = r.sentinel.as_ref().unwrap();
    assert_eq!(
        (s.master.as_str(), s.nodes.len(), s.db, s.tls),
        ("m", 2, 2, true)
    );
    assert_eq!(
        (s.password.as_deref(), s.sentinel_password.as_deref()),
        (Some("p"), Some("q"))
    );
    assert!(!format!("{s:?}").contains("p\""), "{s:?}");
    for (bad, want, line) in [
        ("{ nodes: [ 'a:1' ] }", "needs master", 3),
        ("{ master: m }", "needs nodes", 3),
        ("{ master: m, nodes: [] }", "list at least one sentinel", 3),
        ("{ master: m, nodes: [ 'a' ] }", "is not host:port", 3),
        (
            "{ master: m, nodes: [ 'redis://a:1' ] }",
            "is not host:port",
            3,
        ),
        (
            "{ master: m, nodes: [ 'a:0' ] }",
            "the port must be 1 to 65535",
            3,
        ),
        (
            "{ master: 'a b', nodes: [ 'a:1' ] }",
            "redis.sentinel.master",
            3,
        ),
        (
            "{ master: m, nodes: [ 'a:1' ], db: -1 }",
            "redis.sentinel.db",
            3,
        ),
        (
            "{ master: m, nodes: [ 'a:1' ], username: u }",
            "username needs its password",
            3,
        ),
        (
            "{ master: m, nodes: [ 'a:1' ], port: 1 }",
            "unknown field",
            3,
        ),
    ] {
        let e = parse("f.yaml", &with(bad)).unwrap_err();
        assert!(e.to_string().contains(want), "{bad}: {e}");
        assert_eq!(e.0[0].line, line, "{bad}: {e}");
    }
    for other in ["url: redis://h:1", "cluster: [ redis://h:1 ]"] {
        let both = format!(
            "store:\n  redis:\n    {other}\n    sentinel: {{ master: m, nodes: [ 'a:1' ] }}\nrules: []\n"
        );
        let e = parse("f.yaml", &both).unwrap_err();
        assert!(e.to_string().contains("sentinel, not both"), "{other}: {e}");
        assert_eq!(e.0[0].line, 4, "{other}: {e}");
    }
}
