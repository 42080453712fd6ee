//! End-to-end with the Redis store: real `spillway serve` processes sharing
//! a real redis-server.

use std::time::{Duration, Instant};

use crate::util::{self as util};
use crate::util::{Server, TempDir, check, client};
use serde_json::json;
use spillway_testkit::RedisServer;

/// The Redis timeout of the tests about Redis faults: short, so a paused
/// Redis is given up on quickly.
const FAULT_TIMEOUT: &str = "50ms";

/// The Redis timeout of the tests that count admissions: every decision
/// must reach Redis (a store error there is a failure, not a fault under
/// test), and on a loaded 2-core machine a call to a healthy Redis can take
/// longer than 50 ms.
const COUNTING_TIMEOUT: &str = "10s";

/// How long a test waits for something that comes within a few hundred
/// milliseconds on an idle machine (readiness, a reconnection, the
/// breaker's probe) before it says it never came.
const PATIENCE: Duration = Duration::from_secs(30);

/// What tells a decision that hung on a paused Redis (it would wait for as
/// long as Redis is paused: forever, as the test keeps it paused until
/// every decision is back) from one that gave up at the 50 ms timeout, on
/// a machine too loaded to answer within any few hundred milliseconds.
/// How fast a decision is under a fault is a benchmark's business, not
/// this suite's.
const HUNG: Duration = Duration::from_secs(8);

fn rules(url: &str, timeout: &str) -> String {
    format!(
        r#"
store:
  redis:
    url: {url}/0
    timeout: {timeout}
    prefix: "spillway:"
on_store_error: allow
rules:
  - name: exact
    api: /exact
    by: user
    limits:
      - sliding_window_log: {{ limit: 1000, window: 1h }}
  - name: closed
    api: /closed
    by: user
    on_store_error: deny
    limits:
      - fixed_window: {{ limit: 100, window: 1h }}
  - name: skew
    api: /skew
    by: user
    limits:
      - sliding_window_log: {{ limit: 20, window: 1m }}
  - name: open
    api: /open
    by: user
    limits:
      - gcra: {{ rate: 100/1s, burst: 100 }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let dir = TempDir::new("shared");
    let file = dir.write("rules.yaml", &rules(&redis.url(), COUNTING_TIMEOUT));
    let a = Server::start(&["--config", file.to_str().unwrap()]);
    let b = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    // Both connect before the load starts.
    for s in [&a, &b] {
        wait_ready(&c, s).await;
    }
    let urls = [a.url("/v1/check"), b.url("/v1/check")];
    let mut tasks = Vec::new();
    for i in 0..64 {
        let c = c.clone();
        let url = urls[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0u32;
            for _ in 0..25 {
                let r = c
                    .post(&url)
                    .json(&json!({"api": "/exact", "user": "same"}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let j: serde_json::Value = r.json().await.unwrap();
                assert_eq!(j["store_error"], false, "{j}");
                if status == 200 {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 1000, "64 clients x 25 requests over 2 instances");
}

/// Redis's clock decides: an instance whose own clock is 90 s ahead does not
/// see the other instance's log entries as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_skewed_clocks_do_not_over_admit() {
    let found = std::process::Command::new("faketime")
        .args(["-f", "+0s", "true"])
        .status()
        .is_ok();
    assert!(
        found,
        "faketime is not installed: run scripts/setup.sh (Debian package faketime)"
    );
    let redis = RedisServer::start();
    let dir = TempDir::new("skew");
    let file = dir.write("rules.yaml", &rules(&redis.url(), COUNTING_TIMEOUT));
    let args = ["--config", file.to_str().unwrap()];
    let a = Server::start(&args);
    let b = Server::start_wrapped(&["faketime", "-f", "+90s"], "serve", &args);
    let c = client();
    for s in [&a, &b] {
        wait_ready(&c, s).await;
    }
    // 20 in any minute. Were each instance to use its own clock, the one 90 s
    // ahead would see the other's entries as expired and admit up to 40.
    let mut admitted = 0;
    for i in 0..60 {
        let s = if i % 2 == 0 { &a } else { &b };
        let (status, _, j) = check(&c, s, json!({"api": "/skew", "user": "skew"})).await;
        assert_eq!(j["store_error"], false, "{j}");
        if status == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 20);
}

async fn wait_ready(c: &reqwest::Client, s: &Server) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let j: serde_json::Value = util::json(c.get(s.url("/readyz"))).await;
        if j["status"] == "ready" {
            return;
        }
        assert!(Instant::now() < deadline, "not ready: {j}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_follows_each_rules_policy_and_recovers() {
    let mut redis = RedisServer::start();
    let dir = TempDir::new("faults");
    let file = dir.write("rules.yaml", &rules(&redis.url(), FAULT_TIMEOUT));
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    wait_ready(&c, &s).await;
    // Redis answers before the fault. (With a 50 ms timeout a loaded
    // machine may miss one call: the store's answer is what is awaited.)
    let t = Instant::now();
    loop {
        let (status, _, j) = check(&c, &s, json!({"api": "/closed", "user": "u"})).await;
        if j["store_error"] == false {
            assert_eq!(status, 200, "{j}");
            break;
        }
        assert!(t.elapsed() < PATIENCE, "redis never answered: {j}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    for (what, sig) in [("paused", "STOP"), ("killed", "KILL")] {
        // A load of 16 concurrent clients runs through the fault.
        let load: Vec<_> = (0..16)
            .map(|i| {
                let (c, url) = (c.clone(), s.url("/v1/check"));
                tokio::spawn(async move {
                    let mut slowest = Duration::ZERO;
                    for n in 0..150 {
                        let t = Instant::now();
                        let r = c
                            .post(&url)
                            .json(&json!({"api": "/open", "user": format!("load{i}-{n}")}))
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(r.status(), 200, "fail open under load");
                        slowest = slowest.max(t.elapsed());
                    }
                    slowest
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        redis.signal(sig);
        let mut slowest = Duration::ZERO;
        for _ in 0..10 {
            let t = Instant::now();
            let (status, _, j) = check(&c, &s, json!({"api": "/closed", "user": "u"})).await;
            slowest = slowest.max(t.elapsed());
            assert_eq!(status, 429, "{what}: fail closed: {j}");
            assert_eq!(j["store_error"], true);
            let (status, _, j) = check(&c, &s, json!({"api": "/open", "user": "u"})).await;
            assert_eq!(status, 200, "{what}: fail open: {j}");
            assert_eq!(j["store_error"], true);
        }
        // Every decision came back while Redis was still down (it is
        // resumed or restarted only below): none waited on it.
        assert!(slowest < HUNG, "{what}: a decision hung for {slowest:?}");
        for t in load {
            let worst = t.await.unwrap();
            assert!(
                worst < HUNG,
                "{what}: under load a decision hung for {worst:?}"
            );
        }
        let j: serde_json::Value = util::json(c.get(s.url("/readyz"))).await;
        assert_eq!(j["status"], "degraded", "{what}: {j}");
        let m = util::text(c.get(s.url("/metrics"))).await;
        assert!(!m.contains("spillway_store_errors_total 0\n"), "{m}");
        // Said once in the log, not per decision.
        s.wait_line("circuit breaker open");
        if sig == "STOP" {
            redis.signal("CONT");
        } else {
            redis.restart();
        }
        let t = Instant::now();
        loop {
            let (status, _, j) = check(&c, &s, json!({"api": "/closed", "user": "v"})).await;
            if status == 200 && j["store_error"] == false {
                break;
            }
            assert!(t.elapsed() < PATIENCE, "{what}: no recovery: {j}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.wait_line("circuit breaker closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_before_redis_serves_by_policy_then_connects() {
    let port = spillway_testkit::free_port();
    let dir = TempDir::new("order");
    let file = dir.write(
        "rules.yaml",
        &rules(&format!("redis://127.0.0.1:{port}"), FAULT_TIMEOUT),
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let (status, _, j) = check(&c, &s, json!({"api": "/open", "user": "u"})).await;
    assert_eq!((status, j["store_error"].as_bool()), (200, Some(true)));
    let j: serde_json::Value = util::json(c.get(s.url("/readyz"))).await;
    assert_eq!(j["status"], "degraded");
    s.wait_line("cannot reach redis at redis://127.0.0.1:");
    let _redis = RedisServer::start_on(port);
    let t = Instant::now();
    loop {
        let (_, _, j) = check(&c, &s, json!({"api": "/open", "user": "u"})).await;
        if j["store_error"] == false {
            break;
        }
        assert!(
            t.elapsed() < PATIENCE,
            "not connected after {:?}",
            t.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn check_config_accepts_the_redis_section_and_warns_when_unreachable() {
    let port = spillway_testkit::free_port();
    let dir = TempDir::new("checkredis");
    let file = dir.write(
        "rules.yaml",
        &rules(&format!("redis://127.0.0.1:{port}"), FAULT_TIMEOUT),
    );
    let out = util::spillway(&["check-config", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("store: redis"), "{text}");
    assert!(text.contains("warning: redis is not reachable"), "{text}");
    let bad = dir.write(
        "bad.yaml",
        "store:\n  redis:\n    url: http://x\n    timeout: 0ms\nrules: []\n",
    );
    let out = util::spillway(&["check-config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":3:10:") && err.contains("not a redis://"),
        "{err}"
    );
    assert!(err.contains(":4:14:") && err.contains("timeout"), "{err}");
}
