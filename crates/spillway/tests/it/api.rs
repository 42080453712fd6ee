//! End-to-end: the real `spillway` binary, over HTTP, with a real client.

use std::time::Duration;

use crate::util::{self as util};
use crate::util::{Server, TempDir, check, client, header};
use serde_json::json;

#[tokio::test]
async fn sixth_login_in_a_minute_gets_429_with_retry_after() {
    let s = Server::start(&[]);
    let c = client();
    let body = json!({"api": "POST /v1/login", "ip": "203.0.113.7"});
    for i in 0..5 {
        let (status, h, j) = check(&c, &s, body.clone()).await;
        assert_eq!(status, 200, "attempt {i}: {j}");
        assert_eq!(j["rule"], "login");
        assert_eq!(j["remaining"], 4 - i);
        assert_eq!(header(&h, "x-ratelimit-remaining"), (4 - i).to_string());
    }
    let (status, h, j) = check(&c, &s, body.clone()).await;
    assert_eq!(status, 429, "{j}");
    assert_eq!(j["allowed"], false);
    assert_eq!(j["rule"], "login");
    let retry: u64 = header(&h, "retry-after").parse().unwrap();
    assert!((59..=60).contains(&retry), "Retry-After {retry}");
    assert_eq!(header(&h, "x-ratelimit-retry-after"), retry.to_string());
    let retry_ms = j["retry_after_ms"].as_u64().unwrap();
    assert!((58_000..=60_000).contains(&retry_ms), "{retry_ms}");
    assert_eq!(header(&h, "ratelimit-policy"), "\"login\";q=5;w=60");
    assert!(header(&h, "ratelimit").starts_with("\"login\";r=0;t="));
    // Another IP is not affected.
    let (status, _, _) = check(
        &c,
        &s,
        json!({"api": "POST /v1/login", "ip": "203.0.113.8"}),
    )
    .await;
    assert_eq!(status, 200);
    // One IPv6 address spelled five ways is one client.
    for (i, ip) in [
        "2001:db8::7",
        "2001:DB8::7",
        "2001:db8:0:0::7",
        "2001:0db8::0007",
        "2001:db8::7",
    ]
    .iter()
    .enumerate()
    {
        let (_, _, j) = check(&c, &s, json!({"api": "POST /v1/login", "ip": ip})).await;
        assert_eq!(j["remaining"], 4 - i, "{ip}: {j}");
    }
    let (status, _, j) = check(
        &c,
        &s,
        json!({"api": "POST /v1/login", "ip": "2001:db8::0:7"}),
    )
    .await;
    assert_eq!(status, 429, "{j}");
}

#[tokio::test]
async fn users_are_limited_independently_and_both_limits_apply() {
    let s = Server::start(&[]);
    let c = client();
    // default: 10 per minute (sliding counter) and 500 per hour.
    for i in 0..10 {
        let (status, _, j) = check(&c, &s, json!({"user": "alice"})).await;
        assert_eq!(status, 200, "request {i}: {j}");
    }
    let (status, _, j) = check(&c, &s, json!({"user": "alice"})).await;
    assert_eq!(status, 429, "{j}");
    assert_eq!(j["rule"], "default");
    assert_eq!(j["rules"][0]["algorithm"], "sliding_window_counter");
    let (status, _, j) = check(&c, &s, json!({"user": "bob"})).await;
    assert_eq!(status, 200, "{j}");
    // Both limits are reported; the hour limit was charged 10 times, not 11.
    let (_, _, j) = check(&c, &s, json!({"user": "carol", "cost": 3})).await;
    assert_eq!(j["remaining"], 7, "{j}");
    // A cost the limit can never admit: denied, charged nothing, "never"
    // in the body and a day in the headers.
    let (status, h, j) = check(&c, &s, json!({"user": "dave", "cost": 11})).await;
    assert_eq!(status, 429, "{j}");
    assert_eq!(j["retry_after_ms"], 18_446_744_073_709_u64, "{j}");
    assert_eq!(header(&h, "retry-after"), "86400");
    let (status, _, j) = check(&c, &s, json!({"user": "dave", "cost": 10})).await;
    assert_eq!((status, &j["remaining"]), (200, &json!(0)), "{j}");
}

#[tokio::test]
async fn user_plus_ip_keys_and_soft_mode() {
    let s = Server::start(&[]);
    let c = client();
    // uploads: token bucket 20 and leaky bucket 10 (2/s), soft 10%: 11 pass
    // at once for one user+ip, the 11th as soft-exceeded.
    let up = |user: &str, ip: &str| json!({"api": "POST /v1/upload", "user": user, "ip": ip});
    let mut outcomes = Vec::new();
    for _ in 0..12 {
        let (status, _, j) = check(&c, &s, up("dave", "10.0.0.1")).await;
        outcomes.push((status, j["outcome"].as_str().unwrap().to_string()));
    }
    // The default rule (by user) also applies: 10 per minute for dave.
    assert!(
        outcomes[..10]
            .iter()
            .all(|(s, o)| *s == 200 && o == "allowed"),
        "{outcomes:?}"
    );
    assert_eq!(outcomes[10].0, 429, "{outcomes:?}");
    // A different user on the same IP has a separate uploads key.
    let (status, _, j) = check(&c, &s, up("erin", "10.0.0.1")).await;
    assert_eq!(status, 200, "{j}");
    // Missing ip: the user+ip rule is skipped and says so.
    let (_, _, j) = check(&c, &s, json!({"api": "POST /v1/upload", "user": "frank"})).await;
    assert!(
        j["skipped"].as_array().unwrap().contains(&json!("uploads")),
        "{j}"
    );
}

const EVERY_ALGORITHM: &str = r#"
descriptors: [tenant]
rules:
  - name: tb
    api: /tb
    by: user
    limits: [ { token_bucket: { capacity: 3, refill: 1/h } } ]
  - name: lb
    api: /lb
    by: user
    limits: [ { leaky_bucket: { capacity: 3, leak: 1/h } } ]
  - name: fw
    api: /fw
    by: user
    limits: [ { fixed_window: { limit: 3, window: 1h } } ]
  - name: swl
    api: /swl
    by: user
    limits: [ { sliding_window_log: { limit: 3, window: 1h } } ]
  - name: swc
    api: /swc
    by: user
    limits: [ { sliding_window_counter: { limit: 3, window: 1h } } ]
  - name: gcra
    api: /gcra
    by: user
    limits: [ { gcra: { rate: 1/1h, burst: 3 } } ]
  - name: shaped
    api: /queue
    by: user
    queue: { max_wait: 10s }
    limits: [ { leaky_bucket: { capacity: 3, leak: 1/s } } ]
  - name: shadowed
    api: /shadow
    by: header:X-Api-Key
    mode: shadow
    limits: [ { fixed_window: { limit: 1, window: 1h } } ]
  - name: tenant
    api: /tenant
    by: tenant
    limits: [ { fixed_window: { limit: 1, window: 1h } } ]
"#;

#[tokio::test]
async fn every_algorithm_admits_three_then_denies() {
    let dir = TempDir::new("algos");
    let file = dir.write("rules.yaml", EVERY_ALGORITHM);
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    for (api, algorithm) in [
        ("/tb", "token_bucket"),
        ("/lb", "leaky_bucket"),
        ("/fw", "fixed_window"),
        ("/swl", "sliding_window_log"),
        ("/swc", "sliding_window_counter"),
        ("/gcra", "gcra"),
    ] {
        for i in 0..3 {
            let (status, h, j) = check(&c, &s, json!({"api": api, "user": "u"})).await;
            assert_eq!(status, 200, "{api} #{i}: {j}");
            assert_eq!(j["rules"][0]["algorithm"], algorithm);
            assert_eq!(header(&h, "x-ratelimit-limit"), "3");
            assert_eq!(
                header(&h, "x-ratelimit-remaining"),
                (2 - i).to_string(),
                "{api}"
            );
        }
        let (status, h, j) = check(&c, &s, json!({"api": api, "user": "u"})).await;
        assert_eq!(status, 429, "{api}: {j}");
        let retry: u64 = header(&h, "retry-after").parse().unwrap();
        // A sliding counter may ask for up to 1.33 windows (the previous window fades).
        assert!(retry > 0 && retry <= 2 * 3600, "{api}: {retry}");
    }
    // The shaper queues instead of denying: waits grow by the leak interval.
    let mut waits = Vec::new();
    for _ in 0..4 {
        let (status, _, j) = check(&c, &s, json!({"api": "/queue", "user": "q"})).await;
        waits.push((status, j["wait_ms"].as_u64().unwrap()));
    }
    assert_eq!(waits[0], (200, 0), "{waits:?}");
    assert!(waits[1].1 > 900 && waits[1].1 <= 1000, "{waits:?}");
    assert!(waits[2].1 > 1900 && waits[2].1 <= 2000, "{waits:?}");
    assert_eq!(waits[3].0, 429, "{waits:?}");
    // Shadow mode never denies but says it would have.
    let hdr = json!({"api": "/shadow", "headers": {"X-Api-Key": "k1"}});
    let (status, _, j) = check(&c, &s, hdr.clone()).await;
    assert_eq!((status, j["outcome"].as_str()), (200, Some("allowed")));
    let (status, _, j) = check(&c, &s, hdr).await;
    assert_eq!(status, 200);
    assert_eq!(j["outcome"], "shadow_denied");
    assert_eq!(j["shadow_denied"], json!(["shadowed"]));
    // Any descriptor can be a key.
    let t = json!({"api": "/tenant", "descriptors": {"tenant": "acme"}});
    assert_eq!(check(&c, &s, t.clone()).await.0, 200);
    assert_eq!(check(&c, &s, t).await.0, 429);
    let other = json!({"api": "/tenant", "descriptors": {"tenant": "globex"}});
    assert_eq!(check(&c, &s, other).await.0, 200);
}

#[tokio::test]
async fn minimal_get_form_and_unknown_api() {
    // One worker thread is enough to serve.
    let s = Server::start(&["--threads", "1"]);
    let c = client();
    for i in 0..10 {
        let r = c.get(s.url("/v1/limit?key=zoe")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{i}");
    }
    let r = c.get(s.url("/v1/limit?key=zoe")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // An empty key is no key: the rule is skipped, not one counter shared
    // by every caller that sends it.
    for _ in 0..12 {
        let r = c.get(s.url("/v1/limit?key=")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let j: serde_json::Value = r.json().await.unwrap();
        assert_eq!(j["skipped"], json!(["default"]), "{j}");
    }
    // No rule applies: allowed, no limit, no headers.
    let (status, h, j) = check(&c, &s, json!({"api": "GET /unknown"})).await;
    assert_eq!(status, 200);
    assert_eq!(j["rule"], serde_json::Value::Null);
    assert_eq!(j["limit"], serde_json::Value::Null);
    assert!(!h.contains_key("x-ratelimit-limit"));
}

#[tokio::test]
async fn malformed_input_gets_a_clear_4xx_json_error() {
    let s = Server::start(&[]);
    let c = client();
    let cases: Vec<(&str, reqwest::RequestBuilder, u16)> = vec![
        ("bad json", c.post(s.url("/v1/check")).body("{bad"), 400),
        (
            "wrong type",
            c.post(s.url("/v1/check")).body(r#"{"cost": "x"}"#),
            400,
        ),
        (
            "negative cost",
            c.post(s.url("/v1/check")).body(r#"{"cost": -1}"#),
            400,
        ),
        (
            "negative cost",
            c.post(s.url("/v1/check")).body(r#"{"cost": -1}"#),
            400,
        ),
        (
            "unknown field",
            c.post(s.url("/v1/check")).body(r#"{"usr": "a"}"#),
            400,
        ),
        (
            "bad api",
            c.post(s.url("/v1/check")).body(r#"{"api": "login"}"#),
            400,
        ),
        (
            "huge value",
            c.post(s.url("/v1/check"))
                .body(json!({"user": "x".repeat(5000)}).to_string()),
            400,
        ),
        (
            "oversized body",
            c.post(s.url("/v1/check")).body(vec![b' '; 70_000]),
            413,
        ),
        ("bad query", c.get(s.url("/v1/limit?key=a&cost=abc")), 400),
        ("no endpoint", c.get(s.url("/v2/nothing")), 404),
    ];
    for (what, req, want) in cases {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), want, "{what}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{what}"
        );
        let j: serde_json::Value = r.json().await.unwrap();
        assert!(
            j["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{what}: {j}"
        );
    }
    // Still serving.
    assert_eq!(check(&c, &s, json!({"user": "ok"})).await.0, 200);
}

#[tokio::test]
async fn reload_takes_a_good_file_and_keeps_the_last_good_rules_on_a_bad_one() {
    let dir = TempDir::new("reload");
    let rules = |limit: u32| {
        format!(
            "reload: {{ quiet: 300ms }}\nrules:\n  - name: r\n    api: /r\n    by: user\n    limits:\n      - fixed_window: {{ limit: {limit}, window: 1h }}\n  - name: kept\n    api: /kept\n    by: user\n    limits:\n      - fixed_window: {{ limit: 2, window: 1h }}\n"
        )
    };
    let file = dir.write("rules.yaml", &rules(1));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    assert_eq!(
        check(&c, &s, json!({"api": "/r", "user": "a"})).await.0,
        200
    );
    assert_eq!(
        check(&c, &s, json!({"api": "/r", "user": "a"})).await.0,
        429
    );
    assert_eq!(
        check(&c, &s, json!({"api": "/kept", "user": "a"})).await.0,
        200
    );
    // A good change is picked up once quiet for 300 ms (generous deadline:
    // a busy machine).
    dir.write("rules.yaml", &rules(5));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, j) = check(&c, &s, json!({"api": "/r", "user": "b"})).await;
        if j["limit"] == 5 {
            assert_eq!(status, 200);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not reloaded in 10s: {j}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The unchanged rule kept its counter (1 of 2 used).
    let (_, _, j) = check(&c, &s, json!({"api": "/kept", "user": "a"})).await;
    assert_eq!(
        j["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == "kept")
            .unwrap()["remaining"],
        0,
        "{j}"
    );
    let status: serde_json::Value = util::json(c.get(s.url("/v1/status"))).await;
    assert_eq!(status["version"], 2);
    // A bad file is rejected whole and reported; the rules stay.
    dir.write(
        "rules.yaml",
        "rules:\n  - name: r\n    limits:\n      - fixed_window: { limit: -1, window: 1h }\n",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let st: serde_json::Value = util::json(c.get(s.url("/v1/status"))).await;
        if let Some(e) = st["last_reload_error"].as_str() {
            assert!(e.contains("rules.yaml:4:"), "{e}");
            assert_eq!(st["version"], 2);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "bad file not reported: {st}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, _, j) = check(&c, &s, json!({"api": "/r", "user": "c"})).await;
    assert_eq!(j["limit"], 5);
    let metrics = util::text(c.get(s.url("/metrics"))).await;
    assert!(
        metrics.contains("spillway_rules_reload_errors_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("spillway_rules_reloads_total 1"),
        "{metrics}"
    );
    // SIGHUP reloads at once (same file: version goes up once it is fixed).
    dir.write("rules.yaml", &rules(7));
    s.signal("HUP");
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let (_, _, j) = check(&c, &s, json!({"api": "/r", "user": "d"})).await;
        if j["limit"] == 7 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn metrics_health_rules_and_clean_shutdown() {
    let mut s = Server::start(&[]);
    let c = client();
    check(&c, &s, json!({"user": "m"})).await;
    check(
        &c,
        &s,
        json!({"api": "GET /v1/search", "headers": {"x-api-key": "k"}}),
    )
    .await;
    let m = c.get(s.url("/metrics")).send().await.unwrap();
    assert!(
        m.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let m = m.text().await.unwrap();
    assert!(
        m.contains("spillway_decisions_total{rule=\"default\",outcome=\"allowed\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("spillway_decisions_total{rule=\"search\",outcome=\"allowed\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("spillway_decision_duration_seconds_count 2"),
        "{m}"
    );
    assert!(m.contains("spillway_keys "), "{m}");
    assert!(!m.contains("\"m\""), "client keys must not be labels");
    for path in ["/healthz", "/readyz"] {
        assert_eq!(c.get(s.url(path)).send().await.unwrap().status(), 200);
    }
    let rules: serde_json::Value = util::json(c.get(s.url("/v1/rules"))).await;
    let names: Vec<&str> = rules["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["login", "default", "uploads", "search"]);
    s.signal("TERM");
    assert_eq!(s.wait_exit(Duration::from_secs(5)), Some(0));
}

/// `by: user+route`: one counter per user and endpoint under a prefix rule.
#[tokio::test]
async fn a_route_key_limits_each_endpoint_apart() {
    let dir = TempDir::new("route-key");
    let file = dir.write(
        "rules.yaml",
        "rules:\n  - name: per-endpoint\n    api: /v1/*\n    by: user+route\n    limits:\n      - fixed_window: { limit: 1, window: 1h }\n",
    );
    let out = util::spillway(&["check-config", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("by: user+route"), "{text}");
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let mut seen = Vec::new();
    for api in [
        "GET /v1/a",
        "GET /v1/b",
        "GET /v1/a",
        "POST /v1/a",
        "GET /v1/./a",
    ] {
        let (status, _, _) = check(&c, &s, json!({"api": api, "user": "u"})).await;
        seen.push(status);
    }
    assert_eq!(seen, [200, 200, 429, 200, 429]);
}

/// A flood of new clients against a small `max_keys`: the keys held (as
/// `/metrics` reports them) never pass the cap, and the service answers
/// throughout.
#[tokio::test]
async fn a_flood_of_clients_stays_within_max_keys() {
    let dir = TempDir::new("flood");
    let file = dir.write(
        "rules.yaml",
        "store: { memory: { max_keys: 300 } }\nrules:\n  - name: per-user\n    by: user\n    limits:\n      - fixed_window: { limit: 5, window: 1h }\n",
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let keys = |m: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix("spillway_keys "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no spillway_keys in {m}"))
    };
    for i in 0..2000 {
        let (status, _, _) = check(&c, &s, json!({"user": format!("u{i}")})).await;
        assert_eq!(status, 200, "client {i}");
        if i % 250 == 249 {
            let held = keys(&util::text(c.get(s.url("/metrics"))).await);
            assert!(held <= 300, "{held} keys after {i} clients");
        }
    }
    let held = keys(&util::text(c.get(s.url("/metrics"))).await);
    assert!((250..=300).contains(&held), "{held}");
}

#[test]
fn check_config_prints_rules_or_every_error_with_its_location() {
    let dir = TempDir::new("check");
    let good = dir.write("good.yaml", EVERY_ALGORITHM);
    let out = util::spillway(&["check-config", good.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("9 rules"), "{text}");
    assert!(text.contains("gcra: 1 per 3600s, burst 3"), "{text}");
    let bad = dir.write(
        "bad.yaml",
        "rules:\n  - name: a\n    by: user\n    limits:\n      - fixed_window: { limit: 0, window: 1m }\n  - name: a\n    mode: loud\n    limits:\n      - token_bucket: { capacity: 5, refill: 5/fortnight }\n",
    );
    let out = util::spillway(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let bad = bad.display().to_string();
    for want in [
        format!("{bad}:5:32: limit must be at least 1"),
        format!("{bad}:6:11: duplicate rule name"),
        format!("{bad}:7:11: mode \"loud\""),
        format!("{bad}:9:46: refill:"),
    ] {
        assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    }
    for (text, want) in [
        (
            "rules:\n  - name: a\n    limits:\n      - nonsense: { limit: 1 }\n",
            ":4:",
        ),
        (
            "rules:\n  - name: a\n    colour: red\n    limits: []\n",
            ":3:",
        ),
        ("rules: [\n", ":"),
    ] {
        let f = dir.write("x.yaml", text);
        let out = util::spillway(&["check-config", f.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("x.yaml{want}")), "{text}: {err}");
    }
}

/// `spillway check-config rules.yaml | head -1`: the report's reader has
/// gone (a pipe with no reader), and the command ends without a panic.
#[test]
fn check_config_into_a_closed_pipe_does_not_panic() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/rules.yaml"),
        ])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn bad_flags_and_missing_files_fail_cleanly() {
    let run = util::spillway;
    let out = run(&["serve", "--listen", "not-an-address"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen"));
    let out = run(&["serve", "--config", "/nonexistent/rules.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    for bad in ["0", "x", "5000"] {
        let out = run(&["serve", "--threads", bad]);
        assert_eq!(out.status.code(), Some(2), "--threads {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--threads"));
    }
    // Ports already taken: a clear error naming the address, exit 1.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap().to_string();
    for (args, want) in [
        (vec!["serve", "--listen", at.as_str()], "cannot listen on"),
        (
            vec![
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--grpc-listen",
                at.as_str(),
            ],
            "cannot listen for gRPC on",
        ),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&format!("{want} {at}")), "{args:?}: {err}");
    }
    for sub in [
        &["--help"][..],
        &["serve", "--help"],
        &["check-config", "--help"],
    ] {
        assert!(run(sub).status.success(), "{sub:?}");
    }
}

/// docs/openapi.yaml lists exactly the endpoints the server has, and the
/// decision, rules, status and problem schemas list exactly the fields sent.
#[tokio::test]
async fn the_openapi_description_matches_the_server() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/openapi.yaml"
    ))
    .unwrap();
    let spec: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    let s = Server::start(&[]);
    let c = client();
    let paths = spec["paths"].as_object().unwrap();
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            let url = s.url(path);
            let r = match method.as_str() {
                "get" => c.get(url).send().await.unwrap(),
                "post" => c.post(url).body("{}").send().await.unwrap(),
                "put" => c.put(url).body("{}").send().await.unwrap(),
                "delete" => c.delete(url).send().await.unwrap(),
                m @ ("head" | "patch" | "options" | "trace") => {
                    let m = reqwest::Method::from_bytes(m.to_ascii_uppercase().as_bytes()).unwrap();
                    c.request(m, url).send().await.unwrap()
                }
                m => panic!("unexpected method {m}"),
            };
            assert_ne!(
                r.status(),
                404,
                "{method} {path} is in the spec but not served"
            );
        }
    }
    for path in [
        "/v1/check",
        "/v1/charge",
        "/v1/limit",
        "/v1/rules",
        "/v1/status",
        "/metrics",
        "/healthz",
        "/readyz",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} is served but not in the spec"
        );
    }
    let schema = |name: &str| spec["components"]["schemas"][name].clone();
    let same_fields = |name: &str, value: &serde_json::Value| {
        let s = schema(name);
        let mut want: Vec<&str> = s["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut got: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        want.sort_unstable();
        got.sort_unstable();
        for field in &got {
            assert!(
                want.contains(field),
                "{name} has {field}, not in the spec: {want:?}"
            );
        }
        for req in s["required"].as_array().unwrap() {
            assert!(
                value.get(req.as_str().unwrap()).is_some(),
                "{name} lacks required {req}"
            );
        }
    };
    let (_, _, d) = check(
        &c,
        &s,
        json!({"api": "POST /v1/login", "ip": "1.2.3.4", "cost": 1}),
    )
    .await;
    same_fields("Decision", &d);
    same_fields("RuleResult", &d["rules"][0]);
    let charged: serde_json::Value = util::json(
        c.post(s.url("/v1/charge"))
            .json(&json!({"api": "POST /v1/login", "ip": "1.2.3.5", "cost": 1})),
    )
    .await;
    same_fields("Decision", &charged);
    assert_eq!(charged["over"], false, "{charged}");
    let rules: serde_json::Value = util::json(c.get(s.url("/v1/rules"))).await;
    same_fields("Rule", &rules["rules"][0]);
    let problem: serde_json::Value = util::json(c.post(s.url("/v1/check")).body("{")).await;
    same_fields("Problem", &problem);
    let request_schema = schema("CheckRequest");
    let req_fields = request_schema["properties"].as_object().unwrap();
    for f in ["api", "user", "ip", "descriptors", "headers", "cost"] {
        assert!(req_fields.contains_key(f), "CheckRequest lacks {f}");
    }
}

/// Issue 16: a token budget over the HTTP API. Each request is checked
/// first (`cost: 0`, which charges nothing) and charged what it cost once
/// served (`POST /v1/charge`, never a 429, counted past the limit): on
/// 1,000 tokens with answers of 600, exactly two are served, and the
/// charge that goes past the budget says the key is now over.
#[tokio::test]
async fn check_then_charge_serves_exactly_what_the_budget_pays_for() {
    let dir = TempDir::new("charge");
    let file = dir.write(
        "rules.yaml",
        "rules:\n  - name: tokens\n    by: user\n    limits:\n      - token_bucket: { capacity: 1000, refill: 1000/1h }\n",
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let mut served = 0;
    let mut overs = Vec::new();
    for _ in 0..10 {
        let (status, _, j) = check(&c, &s, json!({"user": "u", "cost": 0})).await;
        if status != 200 {
            assert_eq!(status, 429, "{j}");
            assert_eq!(j["rule"], "tokens");
            assert!(j["retry_after_ms"].as_u64().unwrap() > 0, "{j}");
            continue;
        }
        served += 1;
        let r = c
            .post(s.url("/v1/charge"))
            .json(&json!({"user": "u", "cost": 600}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let j: serde_json::Value = r.json().await.unwrap();
        assert_eq!(j["allowed"], !j["over"].as_bool().unwrap(), "{j}");
        overs.push(j["over"].as_bool().unwrap());
    }
    assert_eq!(served, 2);
    assert_eq!(overs, [false, true]);
    // Checks charged nothing: another user's budget is whole, and a
    // check of cost 0 on it leaves it so.
    for _ in 0..3 {
        let (status, _, j) = check(&c, &s, json!({"user": "v", "cost": 0})).await;
        assert_eq!(status, 200, "{j}");
        assert_eq!(j["remaining"], 1000, "{j}");
    }
    // The charge endpoint takes the check body, and refuses what /v1/check refuses.
    let r = c
        .post(s.url("/v1/charge"))
        .body("{\"cost\": -1}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// Issue 28: `POST /v1/charge` with `cost: 4294967296` for someone else's
/// key put a GCRA key into debt for 527 years. Now the debt stops at the
/// limit's `max_debt` (30 s here, from the rules file): the victim is
/// refused for at most 30 s, whatever the cost, and a second such charge
/// adds nothing.
#[tokio::test]
async fn a_huge_charge_keeps_a_key_out_at_most_its_max_debt() {
    let dir = TempDir::new("debt");
    let file = dir.write(
        "rules.yaml",
        "rules:\n  - name: tokens\n    by: user\n    limits:\n      - gcra: { rate: 1/s, burst: 10, max_debt: 30s }\n",
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    for _ in 0..2 {
        let r = c
            .post(s.url("/v1/charge"))
            .json(&json!({"user": "victim", "cost": 4_294_967_296u64}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let j: serde_json::Value = r.json().await.unwrap();
        assert_eq!(j["over"], true, "{j}");
    }
    let (status, _, j) = check(&c, &s, json!({"user": "victim", "cost": 0})).await;
    assert_eq!(status, 429, "{j}");
    let retry = j["retry_after_ms"].as_u64().unwrap();
    // 30 s past a spent burst, less what passed since the charge (a
    // loaded machine may take seconds).
    assert!((10_000..=30_000).contains(&retry), "{j}");
    // Someone else is untouched.
    let (status, _, j) = check(&c, &s, json!({"user": "other", "cost": 0})).await;
    assert_eq!(status, 200, "{j}");
}
