//! End-to-end: the Envoy rate limit gRPC API of the real binary, with a real
//! gRPC client over the network.

use crate::util::{self as util};
use crate::util::{Server, TempDir};
use spillway_server::grpc::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest, RateLimitResponse,
    SHOULD_RATE_LIMIT, UInt64Value, Unit,
};
use tonic::transport::Channel;

/// spillway's own format: `domains:` in the rules file, Envoy's `rate_limit`
/// and spillway's `limit` side by side.
const RULES: &str = r#"
grpc_response_headers: true
rules: []
domains:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: { unit: minute, requests_per_unit: 3 }
      - key: remote_address
        value: 50.0.0.5
        rate_limit: { unit: second, requests_per_unit: 0 }
      - key: path
        value: /login
        rate_limit: { unit: minute, requests_per_unit: 1 }
      - key: path
        rate_limit: { unit: minute, requests_per_unit: 5 }
      - key: tenant
        descriptors:
          - key: user
            limit: { sliding_window_log: { limit: 2, window: 1m } }
      - key: generic_key
        value: free
        rate_limit: { unlimited: true }
      - key: generic_key
        value: trial
        shadow_mode: true
        rate_limit: { unit: hour, requests_per_unit: 1 }
      - key: api
        value: v*
        rate_limit: { unit: minute, requests_per_unit: 1 }
"#;

async fn start(args: &[&str], rules: &str) -> (Server, Channel, TempDir) {
    let dir = TempDir::new("grpc");
    let file = dir.write("rules.yaml", rules);
    let mut all = vec![
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    let s = Server::start(&all);
    let addr = s.listener("gRPC");
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (s, ch, dir)
}

async fn call(ch: &Channel, req: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT);
    grpc.unary(
        tonic::Request::new(req),
        path,
        tonic_prost::ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        limit: None,
        hits_addend: None,
    }
}

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

fn ok(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_match_the_envoy_way_and_statuses_are_filled_in() {
    let (_s, ch, _d) = start(&[], RULES).await;
    let ip = |v: &str| req("edge", vec![desc(&[("remote_address", v)])]);
    for i in 0..3 {
        let r = call(&ch, ip("1.2.3.4")).await.unwrap();
        assert!(ok(&r), "{i}: {r:?}");
        let st = &r.statuses[0];
        let lim = st.current_limit.as_ref().unwrap();
        assert_eq!((lim.requests_per_unit, lim.unit), (3, Unit::Minute as i32));
        assert_eq!(st.limit_remaining, 2 - i);
        let reset = st.duration_until_reset.as_ref().unwrap();
        assert!(reset.seconds <= 60 && (reset.seconds > 0 || reset.nanos > 0));
    }
    let r = call(&ch, ip("1.2.3.4")).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    // Each value of a key-only descriptor has its own counter.
    assert!(ok(&call(&ch, ip("1.2.3.5")).await.unwrap()));
    // A specific value beats the wildcard: 0 per second bans it.
    let r = call(&ch, ip("50.0.0.5")).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    // /login is 1 per minute, other paths 5.
    let path = |p: &str| req("edge", vec![desc(&[("path", p)])]);
    assert!(ok(&call(&ch, path("/login")).await.unwrap()));
    assert!(!ok(&call(&ch, path("/login")).await.unwrap()));
    for _ in 0..5 {
        assert!(ok(&call(&ch, path("/home")).await.unwrap()));
    }
    // Nested keys, with a spillway algorithm behind them.
    let nested = |u: &str| req("edge", vec![desc(&[("tenant", "acme"), ("user", u)])]);
    assert!(ok(&call(&ch, nested("ann")).await.unwrap()));
    assert!(ok(&call(&ch, nested("ann")).await.unwrap()));
    assert!(!ok(&call(&ch, nested("ann")).await.unwrap()));
    assert!(ok(&call(&ch, nested("ben")).await.unwrap()));
    // Only the first level: no match, no limit.
    let r = call(&ch, req("edge", vec![desc(&[("tenant", "acme")])]))
        .await
        .unwrap();
    assert!(ok(&r) && r.statuses[0].current_limit.is_none());
    // Prefix wildcard values.
    assert!(ok(&call(&ch, req("edge", vec![desc(&[("api", "v1")])]))
        .await
        .unwrap()));
    assert!(!ok(&call(&ch, req("edge", vec![desc(&[("api", "v1")])]))
        .await
        .unwrap()));
    // Unlimited, shadow.
    for _ in 0..5 {
        let r = call(&ch, req("edge", vec![desc(&[("generic_key", "free")])]))
            .await
            .unwrap();
        assert!(ok(&r));
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert!(ok(&call(
            &ch,
            req("edge", vec![desc(&[("generic_key", "trial")])])
        )
        .await
        .unwrap()));
    }
    // One status per descriptor, in order; over limit if any is.
    let r = call(
        &ch,
        req(
            "edge",
            vec![
                desc(&[("path", "/x")]),
                desc(&[("path", "/login")]),
                desc(&[("nope", "1")]),
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.statuses.len(), 3);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[2].code, Code::Ok as i32);
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // Headers for Envoy to add.
    let keys: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    for k in [
        "RateLimit-Policy",
        "RateLimit",
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "Retry-After",
    ] {
        assert!(keys.contains(&k), "{keys:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_and_limit_overrides_are_honoured() {
    let (_s, ch, _d) = start(&[], RULES).await;
    let mut r = req("edge", vec![desc(&[("path", "/bulk")])]);
    r.hits_addend = 4;
    let a = call(&ch, r.clone()).await.unwrap();
    assert!(ok(&a));
    assert_eq!(a.statuses[0].limit_remaining, 1);
    assert!(!ok(&call(&ch, r).await.unwrap()), "4 + 4 > 5");
    // A descriptor's own hits_addend wins over the request's.
    let mut d = desc(&[("path", "/one")]);
    d.hits_addend = Some(UInt64Value { value: 5 });
    let mut r = req("edge", vec![d]);
    r.hits_addend = 1;
    let a = call(&ch, r).await.unwrap();
    assert_eq!(a.statuses[0].limit_remaining, 0);
    // A limit override replaces the configured limit for that descriptor.
    let mut d = desc(&[("path", "/override")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: Unit::Hour as i32,
    });
    let r = req("edge", vec![d]);
    let a = call(&ch, r.clone()).await.unwrap();
    let lim = a.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((lim.requests_per_unit, lim.unit), (2, Unit::Hour as i32));
    assert!(ok(&call(&ch, r.clone()).await.unwrap()));
    assert!(!ok(&call(&ch, r).await.unwrap()));
}

/// A descriptor's hits_addend past every limit is OVER_LIMIT on both
/// stores, never a store error that fail-open would admit (on Redis a
/// cost past 2^32 was one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_hits_addend_is_over_limit_on_both_stores() {
    let redis = spillway_testkit::RedisServer::start();
    for store in [
        String::new(),
        format!(
            "store: {{ redis: {{ url: {}, timeout: 5s }} }}\n",
            redis.url()
        ),
    ] {
        let (_s, ch, _d) = start(&[], &format!("{store}on_store_error: allow\n{RULES}")).await;
        for cost in [u64::from(u32::MAX), 1 << 32 | 1, u64::MAX] {
            let mut d = desc(&[("path", "/bulk")]);
            d.hits_addend = Some(UInt64Value { value: cost });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let a = loop {
                let a = call(&ch, req("edge", vec![d.clone()])).await.unwrap();
                // Redis connects in the background: wait until it decides.
                if a.statuses[0].code != Code::Ok as i32 || store.is_empty() {
                    break a;
                }
                assert!(std::time::Instant::now() < deadline, "{store}: always OK");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            };
            assert_eq!(
                a.overall_code,
                Code::OverLimit as i32,
                "{store} cost {cost}: {a:?}"
            );
        }
        let mut r = req("edge", vec![desc(&[("path", "/bulk")])]);
        r.hits_addend = u32::MAX;
        let a = call(&ch, r).await.unwrap();
        assert_eq!(a.overall_code, Code::OverLimit as i32, "{store}: {a:?}");
    }
}

/// Issue 28: a descriptor's huge `hits_addend` (a charge when the stream
/// ends) put the key into debt for decades. Now it owes at most its
/// limit's `max_debt` (30 s here): a check after it is OVER_LIMIT with
/// the key back to full within the burst's 10 s and the debt's 30 s, on
/// both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_hits_addend_owes_at_most_max_debt_on_both_stores() {
    let redis = spillway_testkit::RedisServer::start();
    let rules = "rules: []
domains:
  - domain: llm
    descriptors:
      - key: user
        limit: { gcra: { rate: 1/s, burst: 10, max_debt: 30s } }
";
    for store in [
        String::new(),
        format!(
            "store: {{ redis: {{ url: {}, timeout: 5s }} }}\n",
            redis.url()
        ),
    ] {
        let (_s, ch, _d) = start(&[], &format!("{store}on_store_error: deny\n{rules}")).await;
        let victim = with_hits(desc(&[("user", "victim")]), u64::MAX);
        // Redis connects in the background: wait until the charge lands
        // (the store's error would be OVER_LIMIT too, so ask a check).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let _ = call(&ch, req("llm", vec![victim.clone()])).await.unwrap();
            let probe = with_hits(desc(&[("user", "probe")]), 1);
            if ok(&call(&ch, req("llm", vec![probe])).await.unwrap()) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{store}: no store");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = call(&ch, req("llm", vec![victim.clone()])).await.unwrap();
        let check = with_hits(desc(&[("user", "victim")]), 0);
        let a = call(&ch, req("llm", vec![check])).await.unwrap();
        assert_eq!(a.overall_code, Code::OverLimit as i32, "{store}: {a:?}");
        let reset = a.statuses[0].duration_until_reset.as_ref().unwrap();
        assert!(
            (20..=40).contains(&reset.seconds),
            "{store}: back to full in {reset:?}"
        );
    }
}

/// Only a call without a domain or without descriptors is an error (as in
/// envoyproxy/ratelimit; Envoy sends neither). Anything else is decided:
/// an empty key or an entry-less descriptor is OK for that descriptor
/// alone, a long value or many descriptors are decided as usual, and a call
/// past the size caps is OVER_LIMIT, never an error Envoy's default
/// `failure_mode_deny: false` would admit past every limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hostile_descriptor_never_fails_the_call_nor_lifts_the_other_limits() {
    let (_s, ch, _d) = start(&[], RULES).await;
    for c in [req("", vec![desc(&[("a", "b")])]), req("edge", vec![])] {
        let e = call(&ch, c).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
    }
    let long = "x".repeat(2048);
    let hostile = || {
        vec![
            desc(&[]),
            desc(&[("", "b")]),
            desc(&[("path", long.as_str())]),
            desc(&[("remote_address", "9.9.9.9"), ("path", long.as_str())]),
        ]
    };
    // The per-IP limit (3 a minute) still applies beside them.
    for i in 0..4 {
        let mut ds = vec![desc(&[("remote_address", "7.7.7.7")])];
        ds.extend(hostile());
        let r = call(&ch, req("edge", ds)).await.unwrap();
        assert_eq!(r.statuses.len(), 5);
        // Entry-less, empty key, too deep: OK, no limit.
        for j in [1, 2, 4] {
            assert_eq!(r.statuses[j].code, Code::Ok as i32, "{i} {j}: {r:?}");
            assert!(r.statuses[j].current_limit.is_none());
        }
        // A 2 KiB path is a path like another: 5 a minute, counted.
        assert!(r.statuses[3].current_limit.is_some(), "{r:?}");
        if i < 3 {
            assert!(ok(&r), "{i}: {r:?}");
        } else {
            assert_eq!(r.statuses[0].code, Code::OverLimit as i32, "{r:?}");
            assert_eq!(r.overall_code, Code::OverLimit as i32);
        }
    }
    // 100 descriptors: decided, one status each.
    let many: Vec<_> = (0..100)
        .map(|i| desc(&[("path", format!("/many/{i}").as_str())]))
        .collect();
    let r = call(&ch, req("edge", many)).await.unwrap();
    assert!(ok(&r), "{r:?}");
    assert_eq!(r.statuses.len(), 100);
    assert!(r.statuses.iter().all(|s| s.current_limit.is_some()));
    // Past the caps (1,024 descriptors; 1 MiB of keys and values): the
    // whole call is over the limit.
    let too_many: Vec<_> = (0..2000).map(|_| desc(&[("nope", "1")])).collect();
    let r = call(&ch, req("edge", too_many)).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses.len(), 2000);
    let huge = "y".repeat(600 * 1024);
    let r = call(
        &ch,
        req(
            "edge",
            vec![
                desc(&[("nope", huge.as_str())]),
                desc(&[("nope", huge.as_str())]),
            ],
        ),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // Unknown domain: nothing is limited, whatever the size.
    let r = call(&ch, req("nope", vec![desc(&[("a", "b")])]))
        .await
        .unwrap();
    assert!(ok(&r));
    // Health.
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let h = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        h.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

/// envoyproxy/ratelimit's documented examples, written out again here, load
/// through `--envoy-config` and behave as its README says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyproxy_ratelimit_example_configs_load_and_behave_as_documented() {
    let dir = TempDir::new("envoyfiles");
    let messaging = dir.write(
        "messaging.yaml",
        "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n",
    );
    let replaces = dir.write(
        "replaces.yaml",
        "domain: replaces\ndescriptors:\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          name: specific_limit\n          requests_per_unit: 5\n          unit: second\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces:\n            - name: specific_limit\n          requests_per_unit: 10\n          unit: second\n",
    );
    let internal = dir.write(
        "internal.yaml",
        "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        rate_limit:\n          requests_per_unit: 1\n          unit: second\n        shadow_mode: true\n        detailed_metric: true\n",
    );
    let (_s, ch, _d) = start(
        &[
            "--envoy-config",
            messaging.to_str().unwrap(),
            "--envoy-config",
            replaces.to_str().unwrap(),
            "--envoy-config",
            internal.to_str().unwrap(),
        ],
        "rules: []\n",
    )
    .await;
    // Example 2: 5 marketing messages a day per number, 100 messages per number.
    let marketing = || {
        req(
            "messaging",
            vec![
                desc(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                desc(&[("to_number", "2061111111")]),
            ],
        )
    };
    for i in 0..5 {
        let r = call(&ch, marketing()).await.unwrap();
        assert!(ok(&r), "{i}");
        assert_eq!(
            r.statuses[1]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            100
        );
    }
    let r = call(&ch, marketing()).await.unwrap();
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    // Example 7: with both descriptors, only the replacing 10/s limit applies.
    let both = req(
        "replaces",
        vec![
            desc(&[("key_1", "value_1"), ("user", "bkthomps")]),
            desc(&[("key_2", "value_2"), ("user", "bkthomps")]),
        ],
    );
    for i in 0..10 {
        let r = call(&ch, both.clone()).await.unwrap();
        assert!(ok(&r), "{i}: {r:?}");
        assert!(
            r.statuses[0].current_limit.is_none(),
            "the replaced limit is not applied"
        );
    }
    // ...and the 5/s limit was not charged by them.
    let alone = req(
        "replaces",
        vec![desc(&[("key_1", "value_1"), ("user", "bkthomps")])],
    );
    let r = call(&ch, alone).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 4);
    // Example 5: unlimited; Example 6: shadow mode never over limit.
    for _ in 0..3 {
        assert!(ok(&call(
            &ch,
            req("internal", vec![desc(&[("ldap", "x")])])
        )
        .await
        .unwrap()));
        assert!(ok(&call(
            &ch,
            req(
                "internal",
                vec![desc(&[("service", "auth"), ("user", "user-a")])]
            )
        )
        .await
        .unwrap()));
    }
}

#[test]
fn check_config_reads_envoy_files_and_reports_errors_with_locations() {
    let dir = TempDir::new("checkenvoy");
    let good = dir.write("good.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n");
    let out = util::spillway(&["check-config", good.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("domain d"));
    let bad = dir.write("bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 5 }\n");
    let out = util::spillway(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:4:") && err.contains("fortnight"),
        "{err}"
    );
}

/// Where counters live in a test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Memory,
    Redis,
}

/// A server on `on` (a fresh redis-server for Redis) with the rules file
/// `rules`, ready to decide; `wrapper` runs it (e.g. `env VAR=value`).
struct Rig {
    s: Server,
    ch: Channel,
    _dir: TempDir,
    _redis: Option<spillway_testkit::RedisServer>,
    /// Files the server reads besides its rules (an `--envoy-config`),
    /// kept while it runs: a file removed is a domain dropped at the next
    /// reload, which a slow run would see mid-test.
    _files: Option<TempDir>,
}

async fn start_rig(on: On, rules: &str, wrapper: &[&str], args: &[&str]) -> Rig {
    let redis = (on == On::Redis).then(spillway_testkit::RedisServer::start);
    let store = match &redis {
        None => String::new(),
        Some(r) => format!(
            "store: {{ redis: {{ url: {}, timeout: 5s }} }}\non_store_error: deny\n",
            r.url()
        ),
    };
    let dir = TempDir::new("grpcrig");
    let file = dir.write("rules.yaml", &format!("{store}{rules}"));
    let mut all = vec![
        "--config",
        file.to_str().unwrap(),
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    let s = Server::start_wrapped(wrapper, "serve", &all);
    let addr = s.listener("gRPC");
    // Redis connects in the background: wait until the store is usable.
    let c = util::client();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let j = util::json(c.get(s.url("/readyz"))).await;
        if j["status"] == "ready" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not ready: {j}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Rig {
        s,
        ch,
        _dir: dir,
        _redis: redis,
        _files: None,
    }
}

/// If less than `margin` seconds are left in the current `unit`-second
/// window of the epoch, waits for the next one: a scenario counting in one
/// fixed window must not straddle two.
async fn whole_window(unit: u64, margin: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let left = unit - now.as_secs() % unit;
    if left < margin {
        tokio::time::sleep(std::time::Duration::from_millis(left * 1000 + 100)).await;
    }
}

fn with_hits(mut d: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: hits });
    d
}

/// envoyproxy/ratelimit's example domain `rl` (the parts its integration
/// scripts use), written out again.
const RL: &str = r#"
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
"#;

/// A rig serving [`RL`] through `--envoy-config`, with `rules` besides.
async fn rl_rig(on: On, rules: &str) -> Rig {
    let dir = TempDir::new("rl");
    let file = dir.write("rl.yaml", RL);
    let mut r = start_rig(
        on,
        &format!("rules: []\n{rules}"),
        &[],
        &["--envoy-config", file.to_str().unwrap()],
    )
    .await;
    r._files = Some(dir);
    r
}

/// ratelimit's `token-quota.sh`: the request path checks (descriptor
/// `hits_addend: 0`), the response path charges 1 (`apply_on_stream_done`);
/// at 2 a minute requests 1 to 3 pass and the 4th is refused, the charge
/// being counted past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_quota_checks_on_the_request_path_and_charges_when_the_stream_ends() {
    let minute = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            / 60
    };
    for on in [On::Memory, On::Redis] {
        let rig = rl_rig(on, "").await;
        // A loaded machine may stall the calls past the window's end (10 s
        // were left): the count restarts there, so that round proves
        // nothing and the sequence runs again in the next window.
        let mut judged = false;
        for _ in 0..3 {
            whole_window(60, 10).await;
            let started = minute();
            let service2 = || desc(&[("service", "service_2")]);
            let mut served = Vec::new();
            for n in 1..=4 {
                let check = call(&rig.ch, req("rl", vec![with_hits(service2(), 0)]))
                    .await
                    .unwrap();
                let pass = ok(&check);
                served.push(pass);
                if !pass {
                    assert_eq!(check.statuses[0].limit_remaining, 0, "{on:?}: {check:?}");
                    continue;
                }
                // The stream-done call: its answer is not acted on.
                let charged = call(&rig.ch, req("rl", vec![with_hits(service2(), 1)]))
                    .await
                    .unwrap();
                assert_eq!(charged.statuses.len(), 1, "{on:?} request {n}");
            }
            if minute() != started {
                eprintln!("{on:?}: the window ended mid-sequence; again in a fresh one");
                // The window now running holds part of the sequence: the
                // next one starts clean.
                whole_window(60, 61).await;
                continue;
            }
            assert_eq!(served, [true, true, true, false], "{on:?}");
            judged = true;
            break;
        }
        assert!(judged, "{on:?}: three windows ended mid-sequence");
    }
}

/// ratelimit's `quota.sh`: two quota-mode descriptors (1 and 2 a minute),
/// both charged by each request: the second request passes though the
/// first descriptor is over, the third, with both over, is refused. With
/// `RESPONSE_DYNAMIC_METADATA`, the metadata of the limits a call passed
/// goes back to Envoy (ratelimit's `multiservice-tokenquota.sh` routes on
/// it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_passes_until_every_quota_descriptor_is_over() {
    for on in [On::Memory, On::Redis] {
        let rig = rl_rig(on, "envoy: { response_dynamic_metadata: true }\n").await;
        whole_window(60, 10).await;
        let both = || {
            req(
                "rl",
                vec![
                    desc(&[("service", "service_1")]),
                    desc(&[("service", "service_2")]),
                ],
            )
        };
        let first = call(&rig.ch, both()).await.unwrap();
        assert!(ok(&first), "{on:?}: {first:?}");
        let routed = |r: &RateLimitResponse| -> String {
            let md = spillway_server::grpc::service::json::response(r);
            md["dynamicMetadata"]["metadata"]["service_with_quota"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string()
        };
        // Both passed: the first one's metadata wins.
        assert_eq!(routed(&first), "service_1");
        let md = spillway_server::grpc::service::json::response(&first);
        assert_eq!(md["dynamicMetadata"]["domain"], "rl");
        assert_eq!(
            md["dynamicMetadata"]["descriptors"][1]["entries"][0],
            "service=service_2"
        );
        let second = call(&rig.ch, both()).await.unwrap();
        assert!(ok(&second), "{on:?}: {second:?}");
        // The quota descriptor over its limit says so; the call passes.
        assert_eq!(second.statuses[0].code, Code::OverLimit as i32);
        assert_eq!(second.statuses[1].code, Code::Ok as i32);
        assert_eq!(routed(&second), "service_2");
        let third = call(&rig.ch, both()).await.unwrap();
        assert_eq!(
            third.overall_code,
            Code::OverLimit as i32,
            "{on:?}: {third:?}"
        );
        assert_eq!(routed(&third), "");
    }
}

/// ratelimit's `replaces.sh`, call by call, on [`RL`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaces_behave_as_replaces_sh() {
    for on in [On::Memory, On::Redis] {
        let rig = rl_rig(on, "").await;
        whole_window(60, 10).await;
        let two = |foo: &str, bar: &str| vec![desc(&[("foo", foo), ("bar", bar)])];
        let four = |foo: &str, bar: &str, dc: &str| {
            let mut v = two(foo, bar);
            v.push(desc(&[
                ("source_cluster", "proxy"),
                ("destination_cluster", dc),
            ]));
            v
        };
        let five = |foo: &str, bar: &str, dc: &str| {
            let mut v = four(foo, bar, dc);
            v.push(desc(&[("category", "account")]));
            v
        };
        let steps: Vec<(Vec<RateLimitDescriptor>, bool)> = vec![
            // replaces raises a limit: the ban is replaced.
            (two("bkthomps", "banned"), false),
            (four("bkthomps", "banned", "mock"), false),
            (four("bkthomps", "banned", "override"), true),
            (four("bkthomps", "banned", "override"), true),
            (four("bkthomps", "banned", "override"), false),
            // ...and leaves the replaced limit alone elsewhere.
            (four("my_foo", "bkthomps", "bkthomps"), true),
            (four("my_foo", "bkthomps", "bkthomps"), true),
            (four("my_foo", "bkthomps", "bkthomps"), false),
            (four("my_foo", "bkthomps", "not_bkthomps"), true),
            (four("my_foo", "bkthomps", "not_bkthomps"), false),
            (four("my_foo", "bkthomps", "bkthomps"), false),
            // One limit replaces two.
            (five("my_foo", "bkthomps", "fake"), true),
            (five("my_foo", "bkthomps", "fake"), true),
            (five("my_foo", "bkthomps", "fake"), true),
            (five("my_foo", "bkthomps", "fake"), true),
            (five("my_foo", "bkthomps", "fake"), false),
            (two("foo_2", "bkthomps"), true),
            (two("foo_2", "bkthomps"), false),
            (four("foo_3", "bar_3", "fake"), true),
            (four("foo_3", "bar_3", "fake"), true),
            (four("foo_3", "bar_3", "fake"), false),
            (five("my_foo", "bkthomps", "fake"), false),
        ];
        for (i, (ds, pass)) in steps.into_iter().enumerate() {
            let r = call(&rig.ch, req("rl", ds)).await.unwrap();
            assert_eq!(ok(&r), pass, "{on:?} step {}: {r:?}", i + 1);
        }
    }
}

/// The issue's token budget: 1,000 tokens a minute; each request checks
/// (hits_addend 0), then is charged its 600 tokens once served. Exactly
/// two are served: the second charge leaves the key in debt. The same
/// with a token bucket of spillway's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_then_charge_token_budget_serves_exactly_two() {
    let rules = r#"
rules: []
domains:
  - domain: llm
    descriptors:
      - key: tenant
        rate_limit: { unit: minute, requests_per_unit: 1000 }
      - key: bucket
        limit: { token_bucket: { capacity: 1000, refill: 1000/1m } }
"#;
    for on in [On::Memory, On::Redis] {
        let rig = start_rig(on, rules, &[], &[]).await;
        whole_window(60, 10).await;
        for key in ["tenant", "bucket"] {
            let d = || desc(&[(key, "acme")]);
            let mut served = 0;
            for _ in 0..10 {
                let check = call(&rig.ch, req("llm", vec![with_hits(d(), 0)]))
                    .await
                    .unwrap();
                if !ok(&check) {
                    assert_eq!(check.statuses[0].limit_remaining, 0);
                    continue;
                }
                served += 1;
                let charged = call(&rig.ch, req("llm", vec![with_hits(d(), 600)]))
                    .await
                    .unwrap();
                // Counted past the limit: the second charge says the key is over.
                let over = charged.overall_code == Code::OverLimit as i32;
                assert_eq!(over, served == 2, "{on:?} {key}: {charged:?}");
            }
            assert_eq!(served, 2, "{on:?} {key}");
        }
    }
}

/// A request's `limit` override as envoyproxy/ratelimit applies it: on any
/// descriptor of a known domain (matched or not, `unlimited` or shadow),
/// never shadow, unnamed; 0 is a ban; the configured limit's counter when
/// it is the same limit. An override in a unit Envoy does not define is
/// ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_overrides_apply_as_envoyproxy_ratelimit_applies_them() {
    let (_s, ch, _d) = start(&[], RULES).await;
    whole_window(60, 10).await;
    let over = |d: &[(&str, &str)], rpu: u32, unit: Unit| {
        let mut d = desc(d);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit: unit as i32,
        });
        req("edge", vec![d])
    };
    // Unmatched, unlimited, shadow: all limited by the override.
    for d in [
        &[("nothing", "here")][..],
        &[("generic_key", "free")],
        &[("generic_key", "trial")],
    ] {
        for i in 0..3 {
            let r = call(&ch, over(d, 2, Unit::Hour)).await.unwrap();
            assert_eq!(ok(&r), i < 2, "{d:?} {i}: {r:?}");
            let lim = r.statuses[0].current_limit.as_ref().unwrap();
            assert_eq!(
                (lim.name.as_str(), lim.requests_per_unit, lim.unit),
                ("", 2, Unit::Hour as i32)
            );
        }
    }
    // 0: always over.
    let r = call(&ch, over(&[("path", "/zero")], 0, Unit::Minute))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // The configured limit (5 a minute) and an override equal to it share
    // one counter.
    for _ in 0..3 {
        assert!(ok(&call(&ch, over(&[("path", "/same")], 5, Unit::Minute))
            .await
            .unwrap()));
    }
    let plain = req("edge", vec![desc(&[("path", "/same")])]);
    assert_eq!(
        call(&ch, plain.clone()).await.unwrap().statuses[0].limit_remaining,
        1
    );
    assert!(ok(&call(&ch, plain.clone()).await.unwrap()));
    assert!(!ok(&call(&ch, plain).await.unwrap()));
    // An unknown unit: the override is ignored.
    let mut d = desc(&[("path", "/unit")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 42,
    });
    let r = call(&ch, req("edge", vec![d])).await.unwrap();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
}

/// `current_limit` names only what the file names; a spillway algorithm is
/// reported in the unit its rate is exact in; `duration_until_reset` is
/// envoyproxy/ratelimit's: whole seconds to the window's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn current_limit_is_exact_named_as_written_and_resets_as_ratelimit_says() {
    let rules = r#"
rules: []
domains:
  - domain: d
    descriptors:
      - key: gcra
        limit: { gcra: { rate: 100/1m, burst: 20 } }
      - key: bucket
        limit: { token_bucket: { capacity: 10, refill: 1/100ms } }
      - key: window
        limit: { fixed_window: { limit: 10, window: 2m } }
      - key: named
        rate_limit: { name: the_name, unit: minute, requests_per_unit: 7 }
      - key: unnamed
        rate_limit: { unit: minute, requests_per_unit: 7 }
"#;
    let rig = start_rig(On::Memory, rules, &[], &[]).await;
    let one = |k: &str| req("d", vec![desc(&[(k, "x")])]);
    for (k, name, rpu, unit) in [
        ("gcra", "", 100, Unit::Minute),
        ("bucket", "", 10, Unit::Second),
        ("window", "", 5, Unit::Minute),
        ("named", "the_name", 7, Unit::Minute),
        ("unnamed", "", 7, Unit::Minute),
    ] {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let r = call(&rig.ch, one(k)).await.unwrap();
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let st = &r.statuses[0];
        let lim = st.current_limit.as_ref().unwrap();
        assert_eq!(
            (lim.name.as_str(), lim.requests_per_unit, lim.unit),
            (name, rpu, unit as i32),
            "{k}"
        );
        let reset = st.duration_until_reset.as_ref().unwrap();
        assert_eq!(reset.nanos, 0, "{k}");
        if k == "named" || k == "unnamed" {
            // ratelimit: the unit's length less the seconds elapsed in it.
            let expect = [60 - before % 60, 60 - after % 60];
            assert!(
                expect.contains(&(reset.seconds as u64)),
                "{k}: {} not in {expect:?}",
                reset.seconds
            );
        }
    }
}

/// envoyproxy/ratelimit's `RateLimit-Limit` / `-Remaining` / `-Reset`
/// headers, switched on and named by its environment variables or the
/// file's `envoy:` section, beside (or instead of) spillway's own set; and
/// its global shadow mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ratelimit_headers_come_from_the_environment_or_the_file() {
    let rules = "rules: []\nenvoy: { limit_remaining_header: X-Left }\ndomains:\n  - domain: h\n    descriptors:\n      - key: a\n        rate_limit: { unit: minute, requests_per_unit: 3 }\n      - key: b\n        rate_limit: { unit: hour, requests_per_unit: 10 }\n";
    let rig = start_rig(
        On::Memory,
        rules,
        &[
            "env",
            "LIMIT_RESPONSE_HEADERS_ENABLED=true",
            "LIMIT_LIMIT_HEADER=X-Cap",
        ],
        &[],
    )
    .await;
    whole_window(60, 10).await;
    let both = || req("h", vec![desc(&[("b", "1")]), desc(&[("a", "1")])]);
    let r = call(&rig.ch, both()).await.unwrap();
    let h: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    // The descriptor with the least remaining: `a`, 2 of 3 left.
    let reset = r.statuses[1].duration_until_reset.as_ref().unwrap().seconds;
    assert_eq!(
        h,
        [
            ("X-Cap", "3"),
            ("X-Left", "2"),
            ("RateLimit-Reset", reset.to_string().as_str())
        ]
    );
    // Without them and without grpc_response_headers: no headers.
    let (_s, ch, _d) = start(&[], "rules: []\ndomains:\n  - domain: h\n    descriptors:\n      - key: a\n        rate_limit: { unit: minute, requests_per_unit: 3 }\n").await;
    let r = call(&ch, req("h", vec![desc(&[("a", "1")])]))
        .await
        .unwrap();
    assert!(r.response_headers_to_add.is_empty());
    // SHADOW_MODE: every call OK, statuses as they are.
    let rig = start_rig(On::Memory, rules, &["env", "SHADOW_MODE=true"], &[]).await;
    for i in 0..4 {
        let r = call(&rig.ch, req("h", vec![desc(&[("a", "2")])]))
            .await
            .unwrap();
        assert!(ok(&r), "{i}");
        assert_eq!(r.statuses[0].code == Code::OverLimit as i32, i == 3);
    }
    // QUOTA_MODE: every limit in quota mode; the call is refused only
    // when every descriptor is over.
    let rig = start_rig(On::Memory, rules, &["env", "QUOTA_MODE=1"], &[]).await;
    let two = || req("h", vec![desc(&[("a", "3")]), desc(&[("b", "3")])]);
    for _ in 0..3 {
        assert!(ok(&call(&rig.ch, two()).await.unwrap()));
    }
    let r = call(&rig.ch, two()).await.unwrap();
    assert!(ok(&r), "b has room: {r:?}");
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    let r = call(&rig.ch, req("h", vec![desc(&[("a", "3")])]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // A bad value stops the start, saying where it came from.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .env("NEAR_LIMIT_RATIO", "2")
        .args([
            "check-config",
            rig._dir.0.join("rules.yaml").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NEAR_LIMIT_RATIO"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn metric(text: &str, name: &str, labels: &str) -> u64 {
    let line = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_else(|| panic!("no {line:?} in\n{text}"))
        .parse()
        .unwrap()
}

/// Hits, as envoyproxy/ratelimit counts them, per domain and limit:
/// total, within, near (past the near-limit ratio), over, and shadow;
/// `detailed_metric` adds per-descriptor series, at most as many as
/// configured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_count_hits_per_limit_as_envoyproxy_ratelimit_does() {
    let rules = r#"
rules: []
envoy: { near_limit_ratio: 0.5, detailed_metric_max_values: 2 }
domains:
  - domain: s
    descriptors:
      - key: a
        rate_limit: { unit: hour, requests_per_unit: 4 }
      - key: shadow
        shadow_mode: true
        rate_limit: { unit: hour, requests_per_unit: 1 }
      - key: user
        detailed_metric: true
        rate_limit: { unit: hour, requests_per_unit: 100 }
"#;
    let rig = start_rig(On::Memory, rules, &[], &[]).await;
    whole_window(3600, 10).await;
    let one = |k: &str, v: &str, hits: u32| {
        let mut r = req("s", vec![desc(&[(k, v)])]);
        r.hits_addend = hits;
        r
    };
    // 4 an hour, near past 2: 1, 2 (the second hit near), 1 (near), then
    // 1 over.
    for hits in [1, 2, 1, 1] {
        call(&rig.ch, one("a", "x", hits)).await.unwrap();
    }
    for _ in 0..3 {
        call(&rig.ch, one("shadow", "x", 1)).await.unwrap();
    }
    for u in ["ann", "bob", "cid", "dan"] {
        call(&rig.ch, one("user", u, 1)).await.unwrap();
    }
    let text = util::text(util::client().get(rig.s.url("/metrics"))).await;
    let at = |name: &str, rule: &str| {
        metric(
            &text,
            &format!("spillway_grpc_{name}_total"),
            &format!("domain=\"s\",rule=\"{rule}\""),
        )
    };
    assert_eq!(at("total_hits", "s.a"), 5);
    assert_eq!(at("within_limit", "s.a"), 4);
    assert_eq!(at("near_limit", "s.a"), 2);
    assert_eq!(at("over_limit", "s.a"), 1);
    assert_eq!(at("shadow_mode", "s.shadow"), 2);
    assert_eq!(at("over_limit", "s.shadow"), 2);
    assert_eq!(at("total_hits", "s.user"), 4);
    let user = |d: &str| {
        metric(
            &text,
            "spillway_grpc_total_hits_total",
            &format!("domain=\"s\",rule=\"s.user\",descriptor=\"{d}\""),
        )
    };
    assert_eq!(
        (user("user_ann"), user("user_bob"), user("_other")),
        (1, 1, 2)
    );
}

/// envoyproxy/ratelimit's HTTP endpoints: `POST /json` (protobuf's JSON
/// mapping both ways; 429 when over the limit; 400 for what is not a
/// request) and `GET /healthcheck` (200 `OK`, 500 when the store is not
/// usable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_healthcheck_are_served_as_envoyproxy_ratelimit_serves_them() {
    let (s, _ch, _d) = start(&[], RULES).await;
    let c = util::client();
    let post = |body: serde_json::Value| c.post(s.url("/json")).json(&body).send();
    let body = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "path", "value": "/json"}]}, {"entries": [{"key": "nope"}]}],
        "hitsAddend": 4
    });
    let r = post(body.clone()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "application/json"
    );
    let j: serde_json::Value = r.json().await.unwrap();
    assert_eq!(j["overallCode"], "OK", "{j}");
    assert_eq!(j["statuses"][0]["currentLimit"]["requestsPerUnit"], 5);
    assert_eq!(j["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(j["statuses"][0]["limitRemaining"], 1);
    assert!(
        j["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .ends_with('s')
    );
    assert_eq!(j["statuses"][1], serde_json::json!({"code": "OK"}));
    let r = post(body).await.unwrap();
    assert_eq!(r.status(), 429);
    let j: serde_json::Value = r.json().await.unwrap();
    assert_eq!(j["overallCode"], "OVER_LIMIT");
    assert!(j["statuses"][0].get("limitRemaining").is_none(), "{j}");
    for bad in [
        serde_json::json!({"domain": "edge", "descriptors": [{"entries": [{"key": "a"}]}], "bogus": 1}),
        serde_json::json!({"domain": "", "descriptors": [{"entries": [{"key": "a"}]}]}),
        serde_json::json!({"domain": "edge"}),
    ] {
        let r = post(bad).await.unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(r.text().await.unwrap(), "Bad Request\n");
    }
    let r = c.get(s.url("/healthcheck")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "OK");
    // A Redis store that is not there: unhealthy.
    let port = spillway_testkit::free_port();
    let (down, _ch, _d) = start(
        &[],
        &format!(
            "store: {{ redis: {{ url: \"redis://127.0.0.1:{port}\", timeout: 50ms }} }}\n{RULES}"
        ),
    )
    .await;
    let r = c.get(down.url("/healthcheck")).send().await.unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(r.text().await.unwrap(), "");
}

/// A call refused by a ban or by a check (hits_addend 0 on a key over its
/// limit) counts its request cost on none of its other descriptors, as a
/// call one descriptor's limit refuses counts on none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_call_counts_its_request_cost_nowhere() {
    let (_s, ch, _d) = start(&[], RULES).await;
    whole_window(60, 10).await;
    let path = |p: &str| desc(&[("path", p)]);
    for _ in 0..3 {
        let r = call(
            &ch,
            req(
                "edge",
                vec![desc(&[("remote_address", "50.0.0.5")]), path("/r1")],
            ),
        )
        .await
        .unwrap();
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
    let r = call(&ch, req("edge", vec![path("/r1")])).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 4, "{r:?}");
    // `api: v*` is 1 a minute: a charge of 2 puts v8 over.
    let api = || desc(&[("api", "v8")]);
    let r = call(&ch, req("edge", vec![with_hits(api(), 2)]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = call(&ch, req("edge", vec![with_hits(api(), 0), path("/r2")]))
        .await
        .unwrap();
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = call(&ch, req("edge", vec![path("/r2")])).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 4, "{r:?}");
}
