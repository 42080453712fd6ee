//! Rules at scale (issue 36): a generated file of mixed rules (algorithms,
//! keys, modes, one or two limits, each on a route of its own, as
//! scripts/gen-rules.sh writes them) loads in bounded time and memory,
//! decides exactly by a rule in the middle, decides about as fast as one
//! rule, and reloads whole while a client decides without a pause.
//!
//! Tests run the debug binary on 2 busy cores (the YAML reader and
//! spillway-rules are optimised in it: Cargo.toml's dev profile):
//! 100,000 rules here, as issue 36 asks of CI; a million are measured on
//! the release binary by scripts/bench-rules.sh (docs/BENCHMARKS.md). The
//! bounds are generous for the machine but each fails by a wide margin on
//! the behaviour of before (a file stopped at ~14,000 rules; 7-9 KB a
//! rule; a reload paused a client for 1.1 s at 10,000).

use std::time::{Duration, Instant};

use crate::util::{Server, TempDir, check, client};

/// Rules `from..to`, the shapes of scripts/gen-rules.sh.
fn rules_text(from: usize, to: usize) -> String {
    let by = ["ip", "user", "user+ip", "header:X-Api-Key", "route"];
    let mut s = String::from("rules:\n");
    for i in from..to {
        let m = i % 1000;
        let method = if i.is_multiple_of(3) { "POST" } else { "GET" };
        s.push_str(&format!(
            "  - name: svc{m}-rule-{i}\n    api: {method} /svc{m}/v1/res{i}\n    by: {}\n",
            by[i % 5]
        ));
        match i % 10 {
            3 => s.push_str("    mode: shadow\n"),
            8 => s.push_str("    mode: soft 10%\n"),
            _ => {}
        }
        s.push_str("    limits:\n");
        let l = 10 * (1 + i % 10);
        s.push_str(&match i % 6 {
            0 => format!("      - gcra: {{ rate: {l}/s, burst: 5 }}\n"),
            1 => format!("      - token_bucket: {{ capacity: {l}, refill: 5/s }}\n"),
            2 => format!("      - sliding_window_counter: {{ limit: {l}, window: 1m }}\n"),
            3 => format!("      - fixed_window: {{ limit: {l}, window: 1h }}\n"),
            4 => format!("      - leaky_bucket: {{ capacity: {l}, leak: 2/s }}\n"),
            _ => format!(
                "      - sliding_window_log: {{ limit: {}, window: 1m }}\n",
                l % 50 + 1
            ),
        });
        if i % 2 == 1 {
            s.push_str(&format!(
                "      - fixed_window: {{ limit: {}, window: 1d }}\n",
                1000 * (1 + i % 4)
            ));
        }
    }
    s
}

/// The request rule `i` decides (every key part it may use given).
fn body_of(i: usize) -> serde_json::Value {
    let method = if i.is_multiple_of(3) { "POST" } else { "GET" };
    serde_json::json!({
        "api": format!("{method} /svc{}/v1/res{i}", i % 1000),
        "user": "u1",
        "ip": "10.0.0.1",
        "headers": { "x-api-key": "k" },
    })
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// The medians of `n` sequential decisions on each of two servers (a
/// URL and a body each), asked in turn: whatever else the machine does
/// meanwhile weighs on both alike, so the two compare.
async fn p50s(
    http: &reqwest::Client,
    a: (&str, &serde_json::Value),
    b: (&str, &serde_json::Value),
    n: usize,
) -> (Duration, Duration) {
    let mut took = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for _ in 0..n {
        for (i, (url, body)) in [a, b].into_iter().enumerate() {
            let t = Instant::now();
            let r = http.post(url).json(body).send().await.unwrap();
            assert!(r.status() == 200 || r.status() == 429, "{}", r.status());
            r.bytes().await.unwrap();
            took[i].push(t.elapsed());
        }
    }
    let [mut x, mut y] = took;
    x.sort();
    y.sort();
    (x[n / 2], y[n / 2])
}

/// The scale tests one at a time: each loads both cores, and measures.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_rules_load_decide_and_reload_without_a_pause() {
    const N: usize = 100_000;
    let _one = SERIAL.lock().await;
    let dir = TempDir::new("scale");
    let one = dir.write("one.yaml", &rules_text(0, 1));
    let many = dir.write("many.yaml", &rules_text(0, N));
    let http = client();

    let small = Server::start(&["--config", one.to_str().unwrap()]);
    let t = Instant::now();
    let big = Server::start(&["--config", many.to_str().unwrap()]);
    let load = t.elapsed();
    // Load: before, ~80 µs a rule in release (8 s here); 2-3 s now.
    assert!(
        load < Duration::from_secs(30),
        "{N} rules ready in {load:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Memory: RSS over the one-rule server (7-9 KB a rule before).
    let per_rule = (rss_kb(big.pid()).saturating_sub(rss_kb(small.pid()))) * 1024 / N as u64;
    eprintln!("{N} rules: ready in {load:?}, {per_rule} B a rule (RSS)");
    assert!(per_rule < 2500, "{per_rule} B a rule");

    // An exact decision by a rule in the middle: rule 50001, a fixed
    // window of 20 an hour (and 3,000 a day).
    let mid = 50_001;
    assert_eq!(mid % 6, 3);
    let limit = 10 * (1 + mid % 10) as u64;
    let url = big.url("/v1/check");
    let body = body_of(mid);
    for k in 0..=limit {
        let r: serde_json::Value = http
            .post(&url)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["rule"], format!("svc{}-rule-{mid}", mid % 1000), "{r}");
        assert_eq!(r["allowed"], k < limit, "request {k}: {r}");
    }

    // Decision time against one rule (sequential, keep-alive, the two
    // servers asked in turn).
    let small_url = small.url("/v1/check");
    let (one_p50, many_p50) = p50s(
        &http,
        (&small_url, &body_of(0)),
        (&url, &body_of(mid + 2)),
        200,
    )
    .await;
    eprintln!("p50: {one_p50:?} with one rule, {many_p50:?} with {N}");
    assert!(
        many_p50 < one_p50 * 2 + Duration::from_micros(500),
        "p50 {many_p50:?} with {N} rules, {one_p50:?} with one"
    );

    // A reload of the whole file while a client decides every 5 ms on
    // its own connection: no error, no pause the length of the reload.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let client_url = url.clone();
    let decider = tokio::spawn(async move {
        let http = client();
        let body = body_of(mid + 4);
        let mut longest = Duration::ZERO;
        let mut n = 0;
        while !*stop_rx.borrow() {
            let t = Instant::now();
            let r = http.post(&client_url).json(&body).send().await.unwrap();
            assert!(r.status() == 200 || r.status() == 429, "{}", r.status());
            r.bytes().await.unwrap();
            longest = longest.max(t.elapsed());
            n += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (longest, n)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = big.drain_logs();
    let t = Instant::now();
    big.signal("HUP");
    let line = tokio::task::spawn_blocking(move || {
        let line = big.wait_line("rules reloaded");
        (line, big)
    })
    .await
    .unwrap();
    let reload = t.elapsed();
    assert!(line.0.contains(&format!("count={N}")), "{}", line.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send(true).unwrap();
    let (longest, n) = decider.await.unwrap();
    eprintln!("reload took {reload:?}; the client's longest wait {longest:?} over {n} decisions");
    // Before: the client waited the whole reload (1.1 s at 10,000 rules,
    // release). A decision now waits for no part of it.
    assert!(n > 20, "{n} decisions during the reload");
    assert!(
        longest < Duration::from_millis(500),
        "a decision waited {longest:?} during a reload of {reload:?}"
    );
}

/// A rule PUT over the admin API on one of two instances sharing a real
/// Redis, each holding 100,000 file rules, applies on the other within a
/// second (each applies a change by building the set beside the one in
/// force), and both still have it after both restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_put_at_scale_applies_on_another_instance_within_a_second() {
    const N: usize = 100_000;
    let _one = SERIAL.lock().await;
    const OPS: &str = "scale-ops-token-0123456789abcdef";
    let redis = spillway_testkit::RedisServer::start();
    let dir = TempDir::new("scale-redis");
    let head = format!(
        "store:\n  redis:\n    url: {}/0\n    timeout: 10s\n    prefix: \"scale:\"\nadmin:\n  tokens: [ {{ name: ops, scope: write, env: SCALE_OPS }} ]\n",
        redis.url()
    );
    let path = dir.write("rules.yaml", &format!("{head}{}", rules_text(0, N)));
    let start = || Server::start_env(&["--config", path.to_str().unwrap()], &[("SCALE_OPS", OPS)]);
    let http = client();
    async fn decided_by_made(http: &reqwest::Client, s: &Server) -> bool {
        let ask = serde_json::json!({"api": "GET /made", "user": "eve"});
        check(http, s, ask).await.2["rule"] == "made"
    }
    let a = start();
    let t = Instant::now();
    let b = start();
    let ready = t.elapsed();
    assert!(!decided_by_made(&http, &b).await);
    let put = http
        .put(a.url("/admin/v1/rules/made"))
        .bearer_auth(OPS)
        .json(&serde_json::json!({"api": "GET /made", "by": "user", "limits": [{"fixed_window": {"limit": 3, "window": "1h"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201, "{:?}", put.text().await);
    let t = Instant::now();
    while !decided_by_made(&http, &b).await {
        assert!(t.elapsed() < Duration::from_secs(10), "never applied");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = t.elapsed();
    eprintln!(
        "a PUT with {N} file rules applied on the other instance in {took:?} (its start took {ready:?})"
    );
    // The target is a second (docs/BENCHMARKS.md measures it on a
    // release build); on a busy machine, a fraction of what reading the
    // rules took in the same run: a change that re-read them all, or
    // waited on a slow poll, takes about as long as that.
    assert!(
        took < Duration::from_secs(1) || took < ready / 2,
        "applied after {took:?}, reading the rules at start took {ready:?}"
    );
    drop((a, b));
    let (a, b) = (start(), start());
    for s in [&a, &b] {
        crate::util::eventually("the rule made over the API, after a restart", || {
            decided_by_made(&http, s)
        })
        .await;
    }
}

/// The same 100,000 rules as a directory of 100 files (`--config DIR`):
/// they load, a rule of the last file decides exactly, and one changed
/// file applies, re-read alone, within 2 s of its write (a quiet period
/// of 500 ms here; the default is 2 s, see docs/CONFIG.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_many_files_loads_and_applies_one_change() {
    const N: usize = 100_000;
    const FILES: usize = 100;
    let _one = SERIAL.lock().await;
    let dir = TempDir::new("scale-dir");
    let rules = dir.0.join("rules");
    std::fs::create_dir(&rules).unwrap();
    let per = N / FILES;
    for f in 0..FILES {
        let text = rules_text(f * per, (f + 1) * per);
        let text = if f == 0 {
            format!("reload: {{ quiet: 500ms }}\n{text}")
        } else {
            text
        };
        std::fs::write(rules.join(format!("team-{f:03}.yaml")), text).unwrap();
    }
    let t = Instant::now();
    let s = Server::start(&["--config", rules.to_str().unwrap()]);
    let ready = t.elapsed();
    eprintln!("{N} rules in {FILES} files ready in {ready:?}");
    let http = client();
    let last = N - 7;
    assert_eq!(
        check(&http, &s, body_of(last)).await.2["rule"],
        format!("svc{}-rule-{last}", last % 1000)
    );
    // One file changed: a rule added to it.
    let changed = rules.join(format!("team-{:03}.yaml", FILES / 2));
    let mut text = std::fs::read_to_string(&changed).unwrap();
    text.push_str("  - name: added\n    api: GET /added\n    by: user\n    limits: [ { fixed_window: { limit: 1, window: 1h } } ]\n");
    let tmp = rules.join(".changed.tmp");
    std::fs::write(&tmp, text).unwrap();
    let t = Instant::now();
    std::fs::rename(&tmp, &changed).unwrap();
    let ask = serde_json::json!({"api": "GET /added", "user": "u"});
    loop {
        if check(&http, &s, ask.clone()).await.2["rule"] == "added" {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t.elapsed();
    eprintln!("one changed file of {FILES} applied in {took:?}");
    // The target is 2 s (docs/BENCHMARKS.md measures it on a release
    // build); on a busy machine, the quiet period and a fraction of what
    // reading every file took in the same run: re-reading them all would
    // take about that.
    let quiet = Duration::from_millis(500);
    assert!(
        took < Duration::from_secs(2) || took < quiet + ready * 6 / 10,
        "applied after {took:?}, reading every file at start took {ready:?}"
    );
}

/// `--max-file-bytes` replaces the fixed 16 MiB: a file past it is
/// refused saying so and how to raise it; raised, the file loads.
#[test]
fn max_file_bytes_bounds_a_file_and_says_how_to_raise_it() {
    let dir = TempDir::new("max-bytes");
    let file = dir.write("r.yaml", &rules_text(0, 100));
    let f = file.to_str().unwrap();
    let out = crate::util::spillway(&["check-config", "--max-file-bytes", "4KiB", f]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("larger than the limit of 4096 bytes") && err.contains("--max-file-bytes"),
        "{err}"
    );
    let out = crate::util::spillway(&["check-config", "--max-file-bytes", "1MiB", f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    // A file of more than 100 rules... this one has 100: listed.
    assert!(shown.contains("- svc99-rule-99 "), "{shown}");
    let big = dir.write("big.yaml", &rules_text(0, 150));
    let out = crate::util::spillway(&["check-config", big.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("summary: 150 rules"), "{shown}");
    assert!(!shown.contains("- svc99-rule-99 "), "summarised: {shown}");
    let out = crate::util::spillway(&["check-config", "--verbose", big.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("- svc149-rule-149 "));
}
