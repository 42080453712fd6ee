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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_argument() {
    let (_s, ch, _d) = start(&[], RULES).await;
    let cases = vec![
        req("", vec![desc(&[("a", "b")])]),
        req("edge", vec![]),
        req("edge", vec![desc(&[])]),
        req("edge", vec![desc(&[("", "b")])]),
        req("edge", (0..100).map(|_| desc(&[("a", "b")])).collect()),
        req("edge", vec![desc(&[("a", &"x".repeat(5000))])]),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let e = call(&ch, c).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "case {i}: {e}");
    }
    // Unknown domain: nothing is limited.
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
