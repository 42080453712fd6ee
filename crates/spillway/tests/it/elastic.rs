//! Elastic rules and overload protection end to end, on the real binary:
//! `mode: elastic N%` driven by `PUT /v1/health` (serve) and by the
//! proxy's own measurements of a real queueing upstream; the proxy's
//! adaptive in-flight limit against a sweep of fixed ones; priorities
//! under overload.
//!
//! The upstream is spillway-testkit's [`QueueingUpstream`]: a fixed
//! number of workers, each request waiting its turn, so its latency grows
//! with the concurrency it is given, as a saturated service's does. The
//! bounds asserted are wide (factors, not milliseconds): they hold on a
//! busy two-core machine.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spillway_testkit::load::{LoadPlan, Outgoing, Sample, drive};
use spillway_testkit::queueing::QueueingUpstream;

use crate::util::{Server, TempDir, check, client, eventually};

const OPS: &str = "ops-token-0123456789abcdef";

/// `spillway proxy` with `text` as its file (which must give
/// `admin: { listen: 127.0.0.1:0 }`), ready: its admin address too.
fn proxy(dir: &TempDir, text: &str) -> (Server, String) {
    let path = dir.write("rules.yaml", text);
    let server = Server::start_cmd("proxy", &["--config", path.to_str().unwrap()]);
    let admin = format!("http://{}", server.listener("admin API"));
    (server, admin)
}

/// A gauge's or counter's value in a Prometheus exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `/metrics` (with the write token, which planes without tokens ignore).
async fn metrics(c: &reqwest::Client, admin: &str) -> String {
    c.get(format!("{admin}/metrics"))
        .bearer_auth(OPS)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------
// Serve mode: health reported through the admin plane

/// Checks for `user` until one is refused (at most 100): how many were
/// admitted, and how many of those elastically.
async fn admitted_of(c: &reqwest::Client, s: &Server, user: &str) -> (u32, u32) {
    let (mut admitted, mut elastic) = (0, 0);
    for _ in 0..100 {
        let (status, headers, body) = check(c, s, json!({"user": user})).await;
        if status != 200 {
            break;
        }
        admitted += 1;
        let zone = headers.get("spillway-zone").map(|v| v.to_str().unwrap());
        let listed = body["elastic_admitted"] == json!(["search"]);
        assert_eq!(zone == Some("elastic"), listed, "{body}");
        if listed {
            assert_eq!(body["outcome"], "elastic_admitted", "{body}");
            elastic += 1;
        }
    }
    (admitted, elastic)
}

async fn report(c: &reqwest::Client, admin: &str, body: Value) {
    let r = c
        .put(format!("{admin}/v1/health"))
        .bearer_auth(OPS)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// `mode: elastic 300%` in serve mode: the plain limit before any report;
/// up to three times it while the service reports room (the extra
/// admissions said so in the answer, its header and the metrics); the
/// plain limit again once it reports being at capacity, and when its
/// reports stop (stale).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_mode_elastic_rules_follow_reported_health_and_fall_back_when_stale() {
    let dir = TempDir::new("elastic-serve");
    let text = "admin:
  listen: 127.0.0.1:0
  tokens:
    - { name: ops, scope: write, env: SPILLWAY_TEST_OPS }
health:
  stale_after: 2s
rules:
  - name: search
    by: user
    mode: elastic 300%
    limits:
      - fixed_window: { limit: 10, window: 1h }
";
    let path = dir.write("rules.yaml", text);
    let s = Server::start_env(
        &["--config", path.to_str().unwrap()],
        &[("SPILLWAY_TEST_OPS", OPS)],
    );
    let admin = format!("http://{}", s.listener("admin API"));
    let c = client();
    // Unknown health: the plain limit.
    assert_eq!(admitted_of(&c, &s, "before").await, (10, 0));

    // Room: each fresh user gets the whole reach once the report is in
    // force (the health is brought up to date every 200 ms).
    report(&c, &admin, json!({"load": 0.1})).await;
    let mut n = 0;
    eventually("a report of room is in force", || {
        n += 1;
        let (c, s) = (&c, &s);
        async move { admitted_of(c, s, &format!("probe-up-{n}")).await.0 > 10 }
    })
    .await;
    assert_eq!(admitted_of(&c, &s, "healthy").await, (30, 20));
    let m = metrics(&c, &admin).await;
    assert!(
        metric(&m, "spillway_elastic_admitted_total{rule=\"search\"}").unwrap() >= 20.0,
        "{m}"
    );
    assert!(
        metric(
            &m,
            "spillway_decisions_total{rule=\"search\",outcome=\"elastic_admitted\"}"
        )
        .unwrap()
            >= 20.0
    );

    // At capacity: back to the plain limit, smoothly reached (a load of
    // 0.75 is half the reach).
    report(&c, &admin, json!({"load": 0.75})).await;
    let mut n = 0;
    eventually("half the reach", || {
        n += 1;
        let (c, s) = (&c, &s);
        async move { admitted_of(c, s, &format!("probe-half-{n}")).await.0 == 20 }
    })
    .await;
    report(&c, &admin, json!({"load": 1.2})).await;
    let mut n = 0;
    eventually("the plain limit at capacity", || {
        n += 1;
        let (c, s) = (&c, &s);
        async move { admitted_of(c, s, &format!("probe-full-{n}")).await.0 == 10 }
    })
    .await;
    assert_eq!(admitted_of(&c, &s, "busy").await, (10, 0));
    // The healthy user used 30: nothing more now.
    assert_eq!(admitted_of(&c, &s, "healthy").await, (0, 0));

    // Room again, then no more reports.
    report(&c, &admin, json!({"load": 0.1})).await;
    let mut n = 0;
    eventually("room again", || {
        n += 1;
        let (c, s) = (&c, &s);
        async move { admitted_of(c, s, &format!("probe-again-{n}")).await.0 == 30 }
    })
    .await;
    // Reports stop: after `stale_after` the plain limit again.
    let mut n = 0;
    eventually("stale reports fall back to the plain limit", || {
        n += 1;
        let (c, s) = (&c, &s);
        async move { admitted_of(c, s, &format!("probe-stale-{n}")).await.0 == 10 }
    })
    .await;
    let h: Value = c
        .get(format!("{admin}/v1/health"))
        .bearer_auth(OPS)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h["as_seen"]["known"], false, "{h}");
}

// ---------------------------------------------------------------------------
// Proxy mode: health measured on the upstream

/// Sends `rps` requests a second as `user` for `secs`, one at a time per
/// tick (the rates here are low): when each admitted one was sent, and
/// whether any said `spillway-zone: elastic`.
async fn paced(
    c: &reqwest::Client,
    url: &str,
    user: &str,
    rps: u32,
    secs: f64,
) -> (Vec<Duration>, bool) {
    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rps)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tasks = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        tick.tick().await;
        let (c, url, user) = (c.clone(), url.to_string(), user.to_string());
        let at = start.elapsed();
        tasks.push(tokio::spawn(async move {
            let r = c.get(url).header("x-user", user).send().await.ok()?;
            let elastic = r
                .headers()
                .get("spillway-zone")
                .is_some_and(|v| v == "elastic");
            (r.status() == 200).then_some((at, elastic))
        }));
    }
    let mut admitted = Vec::new();
    let mut elastic = false;
    for t in tasks {
        if let Some((at, e)) = t.await.unwrap() {
            admitted.push(at);
            elastic |= e;
        }
    }
    (admitted, elastic)
}

/// Admissions in `times` at or after `from`.
fn admitted_after(times: &[Duration], from: Duration) -> usize {
    times.iter().filter(|&&t| t >= from).count()
}

/// The most admissions in any whole second of `times` after `from`.
fn busiest_second(times: &[Duration], from: Duration) -> usize {
    let mut most = 0;
    for (i, &t) in times.iter().enumerate() {
        if t < from {
            continue;
        }
        let n = times[i..]
            .iter()
            .take_while(|&&u| u < t + Duration::from_secs(1))
            .count();
        most = most.max(n);
    }
    most
}

/// An elastic rule behind the proxy: a client at 2.5 times its plain
/// rate is admitted while the upstream answers fast; held to the plain
/// rate within a few seconds once the upstream slows past the latency
/// target, admitted again once it recovers, and held again while it
/// answers errors past the maximum share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_elastic_rules_follow_the_upstreams_latency_and_errors() {
    let up = QueueingUpstream::start(64, Duration::from_millis(2)).await;
    let dir = TempDir::new("elastic-proxy");
    let text = format!(
        "admin:
  listen: 127.0.0.1:0
health:
  latency: {{ target: 100ms, percentile: 99 }}
  errors: {{ max: 5% }}
  window: 2s
proxy:
  upstream: {}
  user: header:x-user
rules:
  - name: search
    by: user
    mode: elastic 300%
    limits:
      - fixed_window: {{ limit: 10, window: 1s }}
",
        up.url()
    );
    let (s, admin) = proxy(&dir, &text);
    let c = client();
    let url = s.url("/search");
    // Fast: 25 a second, up to 30 admitted a second.
    let (fast, elastic) = paced(&c, &url, "ann", 25, 4.0).await;
    assert!(elastic, "no answer said spillway-zone: elastic");
    let most = busiest_second(&fast, Duration::from_secs(1));
    assert!(
        most >= 20,
        "fast upstream: at most {most} a second: {fast:?}"
    );
    let m = metrics(&c, &admin).await;
    assert!(
        metric(&m, "spillway_upstream_latency_seconds{quantile=\"0.99\"}").is_some(),
        "{m}"
    );

    // Slow (300 ms, three times the target): the plain 10 a second
    // within a few seconds.
    up.set_service(Duration::from_millis(300));
    let (slow, _) = paced(&c, &url, "ann", 25, 7.0).await;
    // Over the last 4 s, 100 offered: about 40 at the plain rate (10 a
    // window), 100 with the elastic room. Counted over the span, not in
    // its busiest second: times are taken when a request is sent, and on
    // a busy machine a request sent late in one window may be decided in
    // the next, which moves an admission across a second's edge but never
    // adds one to a span's total beyond a window's worth at each end.
    let late = admitted_after(&slow, Duration::from_secs(3));
    assert!(
        late <= 4 * 10 + 10,
        "slow upstream: {late} admitted in the 4 s after 3 s: {slow:?}"
    );
    let m = metrics(&c, &admin).await;
    assert!(metric(&m, "spillway_health_load").unwrap() > 1.0, "{m}");

    // Recovered (the slow answers leave the 2 s window): elastic again.
    up.set_service(Duration::from_millis(2));
    let (back, _) = paced(&c, &url, "ann", 25, 6.0).await;
    let most = busiest_second(&back, Duration::from_secs(3));
    assert!(most >= 20, "recovered: at most {most} a second: {back:?}");

    // Errors past the maximum share: the plain limit again.
    up.set_error_share(0.5);
    let (errors, _) = paced(&c, &url, "ann", 25, 6.0).await;
    let admitted_ok = admitted_after(&errors, Duration::from_secs(3));
    // Half the admitted answers are the upstream's 500s (not counted by
    // `paced`): over the last 3 s about half of the plain 30, where the
    // elastic room would give about half of 75.
    assert!(
        admitted_ok <= 3 * 10 / 2 + 10,
        "erroring upstream: {admitted_ok} good answers in the 3 s after 3 s: {errors:?}"
    );
    let m = metrics(&c, &admin).await;
    assert!(
        metric(&m, "spillway_upstream_error_ratio").unwrap() > 0.2,
        "{m}"
    );
}

// ---------------------------------------------------------------------------
// Adaptive concurrency

/// The upstream of the concurrency tests: 4 workers of 25 ms, so 160
/// requests a second at most, latency 25 ms up to 4 in flight and
/// growing by 6.25 ms with each one more.
const WORKERS: usize = 4;
const SERVICE: Duration = Duration::from_millis(25);
/// The latency target the adaptive limit aims at (p99).
const TARGET: Duration = Duration::from_millis(100);
/// Twice what the upstream can serve.
const OFFERED: f64 = 320.0;
const RUN: Duration = Duration::from_secs(5);
/// The first part of a run, while limits settle, is not measured.
const SETTLE: Duration = Duration::from_secs(2);

struct Run {
    /// Answers 2xx a second after SETTLE.
    throughput: f64,
    /// The upstream's own latency (its queue and service) after SETTLE.
    p50: Duration,
    p99: Duration,
    /// The most in flight the upstream saw.
    max_in_flight: usize,
}

/// One run of the proxy with `concurrency` under OFFERED requests a second.
async fn concurrency_run(concurrency: &str) -> Run {
    let up = QueueingUpstream::start(WORKERS, SERVICE).await;
    let dir = TempDir::new("elastic-conc");
    let text = format!(
        "admin:
  listen: 127.0.0.1:0
health:
  latency: {{ target: {}ms, percentile: 99 }}
proxy:
  upstream: {}
  concurrency:
    {concurrency}
    queue: {{ max_wait: 500ms }}
rules: []
",
        TARGET.as_millis(),
        up.url()
    );
    let (s, _admin) = proxy(&dir, &text);
    let plan = LoadPlan::new(&s.url("/work"), RUN)
        .unwrap()
        .constant(OFFERED)
        .timeout(Duration::from_secs(10));
    let start = Instant::now();
    let samples = drive(plan).await;
    let served = up.take_log();
    let settled = start + SETTLE;
    let mut lat: Vec<Duration> = served
        .iter()
        .filter(|s| s.arrived >= settled)
        .map(|s| s.latency)
        .collect();
    let ok = samples
        .iter()
        .filter(|s| s.sent_at >= SETTLE && s.ok())
        .count();
    let measured = (RUN - SETTLE).as_secs_f64();
    let p50 = spillway_testkit::load::percentile(&mut lat, 0.5).unwrap_or_default();
    let p99 = spillway_testkit::load::percentile(&mut lat, 0.99).unwrap_or_default();
    let run = Run {
        throughput: ok as f64 / measured,
        p50,
        p99,
        max_in_flight: up.max_in_flight(),
    };
    println!(
        "{concurrency}: {:.0}/s, upstream p50 {:?} p99 {:?}, most in flight {}",
        run.throughput, run.p50, run.p99, run.max_in_flight
    );
    run
}

/// The adaptive limit against fixed ones under the same overload (twice
/// what the upstream serves): at least 90 % of the throughput of the
/// best fixed limit found by a sweep, with the upstream's latency near
/// the target; a fixed limit set too high drives it far past the target
/// for no more throughput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adaptive_limit_keeps_latency_near_target_at_the_best_fixed_throughput() {
    let mut best: Option<(u32, f64)> = None;
    for limit in [2u32, 4, 8, 16] {
        let r = concurrency_run(&format!("limit: {limit}")).await;
        assert!(r.max_in_flight <= limit as usize, "limit {limit}");
        if best.is_none_or(|(_, t)| r.throughput > t) {
            best = Some((limit, r.throughput));
        }
    }
    let (best_limit, best) = best.unwrap();
    let adaptive = concurrency_run("adaptive: { min: 1, max: 256 }").await;
    assert!(
        adaptive.throughput >= 0.9 * best,
        "adaptive {:.0}/s < 90 % of the best fixed (limit {best_limit}: {best:.0}/s)",
        adaptive.throughput
    );
    assert!(
        adaptive.p50 <= TARGET * 2,
        "adaptive: upstream p50 {:?}, target {TARGET:?}",
        adaptive.p50
    );
    let high = concurrency_run("limit: 256").await;
    assert!(
        high.p50 >= TARGET * 4,
        "a limit of 256: upstream p50 {:?} is not far past the target {TARGET:?}",
        high.p50
    );
    assert!(
        high.p50 >= adaptive.p50 * 3,
        "fixed 256 p50 {:?} vs adaptive {:?}",
        high.p50,
        adaptive.p50
    );
    assert!(high.throughput <= best * 1.1 + 5.0);
}

/// Overload with three priorities (by route): `sheddable` traffic is shed
/// before `default`, and `critical` keeps what it asks for (less than the
/// upstream's capacity); the 503s say when to retry and are counted by
/// priority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_overload_sheddable_goes_first_and_critical_keeps_its_share() {
    let up = QueueingUpstream::start(WORKERS, SERVICE).await;
    let dir = TempDir::new("elastic-prio");
    let text = format!(
        "admin:
  listen: 127.0.0.1:0
proxy:
  upstream: {}
  concurrency:
    limit: {WORKERS}
    queue: {{ max_wait: 200ms, max_queued: 64 }}
rules:
  - name: login
    api: /critical
    priority: critical
    limits: [ {{ fixed_window: {{ limit: 1000000, window: 1s }} }} ]
  - name: pages
    api: /default
    limits: [ {{ fixed_window: {{ limit: 1000000, window: 1s }} }} ]
  - name: batch
    api: /batch
    priority: sheddable
    limits: [ {{ fixed_window: {{ limit: 1000000, window: 1s }} }} ]
",
        up.url()
    );
    let (s, admin) = proxy(&dir, &text);
    // 60 critical, 100 default, 100 sheddable a second: 260 for 160.
    let plan = LoadPlan::new(&s.url("/"), RUN)
        .unwrap()
        .constant(260.0)
        .timeout(Duration::from_secs(10))
        .request(|n| {
            let (class, path) = match n % 13 {
                0..=2 => (0, "/critical"),
                3..=7 => (1, "/default"),
                _ => (2, "/batch"),
            };
            Outgoing {
                class,
                path: Some(path.to_string()),
                headers: Vec::new(),
            }
        });
    let samples = drive(plan).await;
    let share = |class: usize, pick: fn(&Sample) -> bool| {
        let of: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.class == class && s.sent_at >= SETTLE)
            .collect();
        of.iter().filter(|s| pick(s)).count() as f64 / of.len().max(1) as f64
    };
    let served = |s: &Sample| s.ok();
    let shed = |s: &Sample| s.status == 503;
    let (crit, def, batch) = (share(0, served), share(1, served), share(2, served));
    let (shed_def, shed_batch) = (share(1, shed), share(2, shed));
    println!(
        "served: critical {crit:.2}, default {def:.2}, sheddable {batch:.2}; shed: default {shed_def:.2}, sheddable {shed_batch:.2}"
    );
    assert!(crit >= 0.95, "critical served {crit:.2}");
    assert!(
        shed_batch >= shed_def + 0.3,
        "sheddable shed {shed_batch:.2}, default {shed_def:.2}"
    );
    assert!(def >= 0.7, "default served {def:.2}");
    // A 503 says when to retry.
    let c = client();
    let m = metrics(&c, &admin).await;
    let by = |p: &str| metric(&m, &format!("spillway_shed_total{{priority=\"{p}\"}}")).unwrap();
    assert!(
        by("sheddable") > by("default") && by("default") >= by("critical"),
        "{m}"
    );
    assert!(metric(&m, "spillway_concurrency_limit").unwrap() == WORKERS as f64);
    // One more overload, by hand: its 503 carries Retry-After.
    let mut saw = false;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (c, url) = (c.clone(), s.url("/batch"));
        tasks.push(tokio::spawn(async move { c.get(url).send().await.ok() }));
    }
    for t in tasks {
        if let Some(r) = t.await.unwrap()
            && r.status() == 503
        {
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            assert_eq!(retry.as_deref(), Some("1"));
            assert_eq!(
                r.headers().get("content-type").unwrap(),
                "application/problem+json"
            );
            saw = true;
        }
    }
    assert!(
        saw,
        "200 sheddable requests at once were all served by 4 workers in 200 ms"
    );
}

/// The in-flight limit holds on both transports: with the direct path off
/// every request goes through hyper's, and still no more than the limit
/// reach the upstream at once, every waiting request is served, and the
/// slots all come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_limit_holds_on_both_transports() {
    for direct in [true, false] {
        let up = QueueingUpstream::start(8, Duration::from_millis(50)).await;
        let dir = TempDir::new("elastic-transports");
        let text = format!(
            "admin:
  listen: 127.0.0.1:0
server:
  direct_path: {direct}
proxy:
  upstream: {}
  concurrency:
    limit: 2
    queue: {{ max_wait: 20s }}
rules: []
",
            up.url()
        );
        let (s, admin) = proxy(&dir, &text);
        let c = client();
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (c, url) = (c.clone(), s.url("/x"));
            tasks.push(tokio::spawn(async move {
                c.get(url).send().await.unwrap().status().as_u16()
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap(), 200, "direct path {direct}");
        }
        assert_eq!(up.max_in_flight(), 2, "direct path {direct}");
        let m = metrics(&c, &admin).await;
        assert_eq!(
            metric(&m, "spillway_concurrency_in_flight"),
            Some(0.0),
            "direct path {direct}: {m}"
        );
        assert_eq!(metric(&m, "spillway_concurrency_queued"), Some(0.0));
    }
}
