//! End-to-end tests of issue 17: local-first decisions shared through
//! Redis (`store.redis.sync`, modes `eventual` and `lease`),
//! `on_store_error: share`, and several regions. Real `redis-server` and
//! `spillway` processes, real HTTP clients, no mocks.
//!
//! Every bound is computed from what the test measured (request rates,
//! the instances' own round-trip gauges) and the documented formula, never
//! from a latency deadline that needs an idle machine; where a test waits
//! for something it polls with a generous deadline. Each test prints its
//! figures (`-- --nocapture` shows them).
//!
//! The tests of this module run one at a time (they take [`SERIAL`]): each
//! starts up to four instances and a load of several hundred requests a
//! second, and two such tests at once on two cores would measure each
//! other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use spillway_testkit::{RedisServer, Relay};
use tokio::task::JoinHandle;

use crate::util::{self as util};
use crate::util::{Server, TempDir, check, client};

/// One test of this module at a time (see the module docs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The sync interval of every test here.
const INTERVAL: Duration = Duration::from_millis(100);

/// The per-call Redis timeout of the tests that measure a bound: long
/// enough that a busy machine does not turn a slow exchange into a store
/// error (which would decide by the failure policy, not the algorithm).
const PATIENT: &str = "500ms";

// ---------------------------------------------------------------------------
// Rules files

/// A `store.redis.sync` block.
fn sync_block(mode: &str, regions: Option<(&str, &[(&str, String)])>) -> String {
    let mut s = format!(
        "    sync:\n      mode: {mode}\n      interval: {}ms\n",
        INTERVAL.as_millis()
    );
    if let Some((region, others)) = regions {
        s.push_str(&format!("      region: {region}\n      regions:\n"));
        for (name, url) in others {
            s.push_str(&format!("        {name}: {url}\n"));
        }
    }
    s
}

/// A rules file: a Redis store at `url` (a `redis://host:port/db`), the
/// `sync` block (empty: per-decision), the failure policy, and one rule per
/// `(path, limit)`, keyed by user, applying to `api: path` only.
fn rules(url: &str, timeout: &str, sync: &str, policy: &str, limits: &[(&str, &str)]) -> String {
    let mut s = format!(
        "store:\n  redis:\n    url: {url}\n    timeout: {timeout}\n{sync}on_store_error: {policy}\nrules:\n"
    );
    for (path, limit) in limits {
        let name = path.trim_start_matches('/');
        s.push_str(&format!(
            "  - name: {name}\n    api: {path}\n    by: user\n    limits:\n      - {limit}\n"
        ));
    }
    s
}

/// Every algorithm as a budget of 200 that does not refill during a test.
const BUDGET: u64 = 200;

fn budget_of(algorithm: &str) -> String {
    match algorithm {
        "token_bucket" => "token_bucket: { capacity: 200, refill: 1/h }",
        "leaky_bucket" => "leaky_bucket: { capacity: 200, leak: 1/h }",
        "fixed_window" => "fixed_window: { limit: 200, window: 1h }",
        "sliding_window_log" => "sliding_window_log: { limit: 200, window: 1h }",
        "sliding_window_counter" => "sliding_window_counter: { limit: 200, window: 1h }",
        "gcra" => "gcra: { rate: 1/1h, burst: 200 }",
        other => panic!("no budget for {other}"),
    }
    .to_string()
}

// ---------------------------------------------------------------------------
// Processes and probes

/// Starts one instance per file and waits until each is ready.
async fn start_all(c: &reqwest::Client, files: &[&std::path::PathBuf]) -> Vec<Server> {
    let servers: Vec<Server> = files
        .iter()
        .map(|f| Server::start(&["--config", f.to_str().unwrap()]))
        .collect();
    for s in &servers {
        wait_status(c, s, "ready", Duration::from_secs(10)).await;
    }
    servers
}

/// Polls until `/readyz` says `status`.
async fn wait_status(c: &reqwest::Client, s: &Server, status: &str, limit: Duration) -> Duration {
    let d = Deadline::new(format!("{} /readyz {status}", s.addr), limit);
    loop {
        let j: Value = util::json(c.get(s.url("/readyz"))).await;
        if j["status"] == status {
            return d.elapsed();
        }
        d.wait(&j).await;
    }
}

async fn readyz(c: &reqwest::Client, s: &Server) -> Value {
    util::json(c.get(s.url("/readyz"))).await
}

async fn metrics(c: &reqwest::Client, s: &Server) -> String {
    util::text(c.get(s.url("/metrics"))).await
}

/// The rows of a gauge in Prometheus text: `(labels, value)`.
fn gauge(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (labels, v) = r.split_once("} ")?;
                    (labels.to_string(), v)
                }
                None => (String::new(), rest.strip_prefix(' ')?),
            };
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// The one value of an unlabelled gauge; panics (with the text) if absent.
fn gauge1(text: &str, name: &str) -> f64 {
    match gauge(text, name).as_slice() {
        [(_, v)] => *v,
        rows => panic!("{name}: expected one row, got {rows:?} in\n{text}"),
    }
}

/// The sum over a labelled gauge's rows (every store of an instance).
fn gauge_sum(text: &str, name: &str) -> f64 {
    let rows = gauge(text, name);
    assert!(!rows.is_empty(), "{name} missing from\n{text}");
    rows.iter().map(|(_, v)| v).sum()
}

/// Waits until every instance has had an answer from every store it
/// exchanges with. An instance exchanges only for keys in use, so this
/// holds only after traffic; before it, [`wait_live`] says the instances
/// reach their store (heartbeats).
async fn wait_exchanged(c: &reqwest::Client, servers: &[Server]) {
    for s in servers {
        let d = Deadline::new(
            format!("{}: an answered exchange with every store", s.addr),
            secs(10),
        );
        loop {
            let m = metrics(c, s).await;
            let rows = gauge(&m, "spillway_sync_last_success_timestamp_seconds");
            if !rows.is_empty() && rows.iter().all(|(_, v)| *v > 0.0) {
                break;
            }
            d.wait(&rows).await;
        }
    }
}

/// Waits until each instance's `spillway_sync_live_instances` reads `n`.
async fn wait_live(c: &reqwest::Client, servers: &[Server], n: f64) -> Duration {
    let t = Instant::now();
    for s in servers {
        let d = Deadline::new(format!("{}: {n} live instances", s.addr), secs(15));
        loop {
            // And a heartbeat answered since the start (the count is 1
            // before any): the instance knows the store as it is now.
            let m = metrics(c, s).await;
            let live = gauge1(&m, "spillway_sync_live_instances");
            let answered = gauge_sum(&m, "spillway_sync_last_success_timestamp_seconds") > 0.0;
            if live == n && answered {
                break;
            }
            d.wait(&(live, answered)).await;
        }
    }
    t.elapsed()
}

/// Waits until no instance shares and none has deltas waiting.
async fn wait_reconciled(c: &reqwest::Client, servers: &[Server], limit: Duration) -> Duration {
    let d = Deadline::new("share over and no deltas waiting on every instance", limit);
    loop {
        let mut seen = Vec::new();
        for s in servers {
            let m = metrics(c, s).await;
            seen.push((
                gauge1(&m, "spillway_sync_share_active"),
                gauge_sum(&m, "spillway_sync_deltas_waiting"),
            ));
        }
        if seen
            .iter()
            .all(|&(share, waiting)| share == 0.0 && waiting == 0.0)
        {
            return d.elapsed();
        }
        d.wait(&format!(
            "(share_active, deltas_waiting) per instance: {seen:?}"
        ))
        .await;
    }
}

/// What a cost-0 check of `body` on `s` says is left (it charges nothing).
async fn remaining(c: &reqwest::Client, s: &Server, body: &Value) -> u64 {
    let mut body = body.clone();
    body["cost"] = json!(0);
    let (_, _, j) = check(c, s, body).await;
    j["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining in {j}"))
}

/// Tallies of a sequence of checks.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    admitted: u64,
    denied: u64,
    /// Answers that say the store could not answer (a share decision,
    /// while sharing).
    store_error: u64,
}

/// Sends `n` checks of `body` to `url`, one after another.
async fn attempts(c: reqwest::Client, url: String, body: Value, n: usize) -> Tally {
    let mut t = Tally::default();
    for _ in 0..n {
        let r = c.post(&url).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        let j: Value = r.json().await.unwrap();
        match status {
            200 => t.admitted += 1,
            429 => t.denied += 1,
            _ => panic!("{url}: status {status}: {j}"),
        }
        if j["store_error"] == true {
            t.store_error += 1;
        }
    }
    t
}

/// `attempts` on every instance at once; one tally per instance.
async fn attempts_each(
    c: &reqwest::Client,
    servers: &[Server],
    body: &Value,
    n: usize,
) -> Vec<Tally> {
    let tasks: Vec<_> = servers
        .iter()
        .map(|s| tokio::spawn(attempts(c.clone(), s.url("/v1/check"), body.clone(), n)))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// A poll loop's deadline: generous, for a busy machine; the message says
/// what was last seen.
struct Deadline {
    what: String,
    start: Instant,
    limit: Duration,
}

impl Deadline {
    fn new(what: impl Into<String>, limit: Duration) -> Deadline {
        Deadline {
            what: what.into(),
            start: Instant::now(),
            limit,
        }
    }

    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    async fn wait(&self, last: &dyn std::fmt::Debug) {
        assert!(
            self.start.elapsed() < self.limit,
            "{}: not after {:?}; last seen: {last:?}",
            self.what,
            self.limit
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Sleeps past the next edge of `window` (aligned on the Unix epoch, as the
/// store's clock is) if it comes within `need`: a fixed window that
/// restarts mid-test would admit its budget twice.
async fn clear_of_window_edge(window: Duration, need: Duration) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = window.as_nanos() - now.as_nanos() % window.as_nanos();
    if left < need.as_nanos() {
        let wait = Duration::from_nanos(left as u64) + Duration::from_millis(500);
        println!("waiting {wait:?} to be clear of a window edge");
        tokio::time::sleep(wait).await;
    }
}

fn addr(r: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], r.port))
}

// ---------------------------------------------------------------------------
// Load

/// A paced load: request `n` is due at `n / rate` seconds after the start,
/// taken by whichever of `clients` concurrent clients is free, and sent to
/// `urls[pick(n)]`.
struct Load {
    urls: Vec<String>,
    body: Value,
    /// Requests per second, all instances together.
    rate: f64,
    clients: usize,
    pick: fn(u64) -> usize,
    /// Stop once this long passes with no admission (`None`: only when
    /// told, or at `max`).
    idle: Option<Duration>,
    /// Stop anyway after this long.
    max: Duration,
    /// Whether a request may fail (an instance the test kills).
    tolerate_failures: bool,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start: Instant,
    end: Instant,
    /// Index into the load's `urls`.
    to: usize,
    /// 0: no answer.
    status: u16,
    store_error: bool,
}

impl Sample {
    fn admitted(&self) -> bool {
        self.status == 200
    }
}

struct Running {
    t0: Instant,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<Sample>>>,
    instances: usize,
}

fn start_load(c: &reqwest::Client, load: Load) -> Running {
    let t0 = Instant::now();
    let instances = load.urls.len();
    let load = Arc::new(load);
    let seq = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Nanoseconds after t0 of the latest admission's answer (0: none yet).
    let last = Arc::new(AtomicU64::new(0));
    let tasks = (0..load.clients)
        .map(|_| {
            let (c, load, seq, stop, last) = (
                c.clone(),
                Arc::clone(&load),
                Arc::clone(&seq),
                Arc::clone(&stop),
                Arc::clone(&last),
            );
            tokio::spawn(async move {
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = seq.fetch_add(1, Ordering::Relaxed);
                    let due = t0 + Duration::from_secs_f64(n as f64 / load.rate);
                    tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let to = (load.pick)(n);
                    let start = Instant::now();
                    let (status, store_error) =
                        match c.post(&load.urls[to]).json(&load.body).send().await {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                match r.json::<Value>().await {
                                    Ok(j) => {
                                        assert!(
                                            status == 200 || status == 429,
                                            "status {status}: {j}"
                                        );
                                        (status, j["store_error"] == true)
                                    }
                                    Err(_) if load.tolerate_failures => (0, false),
                                    Err(e) => panic!("{}: {e}", load.urls[to]),
                                }
                            }
                            Err(_) if load.tolerate_failures => (0, false),
                            Err(e) => panic!("{}: {e}", load.urls[to]),
                        };
                    let end = Instant::now();
                    let at = (end - t0).as_nanos() as u64;
                    if status == 200 {
                        last.fetch_max(at, Ordering::Relaxed);
                    }
                    samples.push(Sample {
                        start,
                        end,
                        to,
                        status,
                        store_error,
                    });
                    let quiet = Duration::from_nanos(at - last.load(Ordering::Relaxed).min(at));
                    if load.idle.is_some_and(|idle| quiet >= idle) || end - t0 >= load.max {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                samples
            })
        })
        .collect();
    Running {
        t0,
        stop,
        tasks,
        instances,
    }
}

impl Running {
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    async fn finish(self) -> Run {
        let mut samples = Vec::new();
        for t in self.tasks {
            samples.extend(t.await.unwrap());
        }
        samples.sort_by_key(|s| s.start);
        Run {
            t0: self.t0,
            samples,
            instances: self.instances,
        }
    }
}

async fn drive(c: &reqwest::Client, load: Load) -> Run {
    start_load(c, load).finish().await
}

/// What a load did.
struct Run {
    t0: Instant,
    samples: Vec<Sample>,
    instances: usize,
}

impl Run {
    fn admitted(&self) -> u64 {
        self.samples.iter().filter(|s| s.admitted()).count() as u64
    }

    fn admitted_by(&self, to: usize) -> u64 {
        self.samples
            .iter()
            .filter(|s| s.to == to && s.admitted())
            .count() as u64
    }

    fn sent_to(&self, to: usize) -> u64 {
        self.samples.iter().filter(|s| s.to == to).count() as u64
    }

    fn store_errors(&self) -> u64 {
        self.samples.iter().filter(|s| s.store_error).count() as u64
    }

    fn failures(&self) -> u64 {
        self.samples.iter().filter(|s| s.status == 0).count() as u64
    }

    fn elapsed(&self) -> Duration {
        self.samples
            .iter()
            .map(|s| s.end)
            .max()
            .map_or(Duration::ZERO, |e| e - self.t0)
    }

    fn last_admission(&self) -> Option<Instant> {
        self.samples
            .iter()
            .filter(|s| s.admitted())
            .map(|s| s.end)
            .max()
    }

    /// Requests per second from the start until the last admission.
    fn mean_rate_while_admitting(&self) -> f64 {
        let Some(last) = self.last_admission() else {
            return 0.0;
        };
        let n = self.samples.iter().filter(|s| s.start <= last).count();
        n as f64 / (last - self.t0).as_secs_f64().max(1e-3)
    }

    /// The most requests to instances `to` that can have been decided
    /// within any span of length `l`: those whose send-to-answer interval
    /// meets the span (an admission is decided somewhere in it). Bursts
    /// (a client catching up after a stall) count at their real rate.
    fn peak_in(&self, l: Duration, to: impl Fn(usize) -> bool) -> u64 {
        let s: Vec<&Sample> = self.samples.iter().filter(|s| to(s.to)).collect();
        let mut best = 0;
        for a in &s {
            let (from, until) = (a.start, a.start + l);
            let n = s
                .iter()
                .filter(|b| b.start <= until && b.end >= from)
                .count();
            best = best.max(n);
        }
        best as u64
    }

    fn per_instance(&self) -> String {
        (0..self.instances)
            .map(|i| format!("#{i}: {}/{}", self.admitted_by(i), self.sent_to(i)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn round_robin(n: u64) -> usize {
    (n % 4) as usize
}

/// 90 % of requests to instance 0, the rest spread over 1, 2 and 3.
fn ninety_to_first(n: u64) -> usize {
    if n % 10 == 9 {
        1 + ((n / 10) % 3) as usize
    } else {
        0
    }
}

/// The check URLs of `servers`.
fn check_urls(servers: &[&Server]) -> Vec<String> {
    servers.iter().map(|s| s.url("/v1/check")).collect()
}

// ---------------------------------------------------------------------------
// Watching the instances' gauges during a load

/// The largest round trip and lag the instances reported while watched.
#[derive(Debug, Default, Clone, Copy)]
struct Observed {
    /// Largest `spillway_sync_round_trip_seconds` of any store.
    rtt: Duration,
    /// Largest `spillway_sync_lag_seconds` (time since the last answered
    /// exchange): about the real exchange period plus a round trip.
    lag: Duration,
    polls: u64,
}

struct Watch {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Observed>,
}

/// Polls every instance's `/metrics` every 50 ms until stopped; failed
/// polls (an instance the test killed) are skipped.
fn watch(c: &reqwest::Client, servers: &[&Server]) -> Watch {
    let urls: Vec<String> = servers.iter().map(|s| s.url("/metrics")).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (c, flag) = (c.clone(), Arc::clone(&stop));
    let task = tokio::spawn(async move {
        let mut o = Observed::default();
        while !flag.load(Ordering::Relaxed) {
            for u in &urls {
                let Ok(r) = c.get(u).send().await else {
                    continue;
                };
                let Ok(m) = r.text().await else { continue };
                o.polls += 1;
                for (_, v) in gauge(&m, "spillway_sync_round_trip_seconds") {
                    o.rtt = o.rtt.max(Duration::from_secs_f64(v));
                }
                for (_, v) in gauge(&m, "spillway_sync_lag_seconds") {
                    o.lag = o.lag.max(Duration::from_secs_f64(v));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        o
    });
    Watch { stop, task }
}

impl Watch {
    async fn finish(self) -> Observed {
        self.stop.store(true, Ordering::Relaxed);
        let o = self.task.await.unwrap();
        assert!(o.polls > 0, "no /metrics answered while watched");
        o
    }
}

/// The documented lag `L = 2 × interval + round trip`, with the largest
/// round trip observed, plus a slack of one interval for the timers of a
/// busy machine.
fn lag_bound(o: &Observed) -> Duration {
    2 * INTERVAL + o.rtt + INTERVAL
}

// ---------------------------------------------------------------------------
// 1. Eventual mode: over-admission within the documented bound

/// Four instances on one Redis, one hot key, a budget of 200 that does not
/// refill: a paced load of about 400 requests a second round-robin over the
/// four until a second passes with no admission. The documented bound:
/// over-admission ≤ what the other instances admit within `L`; here
/// asserted as ≤ the most requests any span of `L` saw (all instances:
/// ≥ what the others admit in it), and never below the budget.
async fn eventual_bound(algorithm: &str) {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-eventual");
    let url = format!("{}/0", redis.url());
    let limit = budget_of(algorithm);
    let file = dir.write(
        "rules.yaml",
        &rules(
            &url,
            PATIENT,
            &sync_block("eventual", None),
            "allow",
            &[("/hot", limit.as_str())],
        ),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file, &file]).await;
    wait_live(&c, &servers, 4.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;

    let all: Vec<&Server> = servers.iter().collect();
    let w = watch(&c, &all);
    let run = drive(
        &c,
        Load {
            urls: check_urls(&all),
            body: json!({"api": "/hot", "user": algorithm}),
            rate: 400.0,
            clients: 8,
            pick: round_robin,
            idle: Some(secs(1)),
            max: secs(20),
            tolerate_failures: false,
        },
    )
    .await;
    let o = w.finish().await;

    let l = lag_bound(&o);
    let peak = run.peak_in(l, |_| true);
    let mean = run.mean_rate_while_admitting();
    let admitted = run.admitted();
    let bound = BUDGET + peak;
    println!(
        "eventual {algorithm}: admitted {admitted} of {} in {:?} ({}); budget {BUDGET}; \
         mean rate while admitting {mean:.0}/s; L = 2 x {INTERVAL:?} + rtt {:?} + slack {INTERVAL:?} = {l:?}; \
         peak requests in any L {peak} (mean rate x L = {:.0}); bound {bound}; \
         largest lag gauge {:?}; store errors {}",
        run.samples.len(),
        run.elapsed(),
        run.per_instance(),
        o.rtt,
        mean * l.as_secs_f64(),
        o.lag,
        run.store_errors(),
    );
    assert_eq!(
        run.store_errors(),
        0,
        "decisions fell back to the failure policy"
    );
    assert!(
        admitted >= BUDGET,
        "{algorithm}: admitted {admitted} < budget {BUDGET}: eventual mode under-admitted"
    );
    assert!(
        admitted <= bound,
        "{algorithm}: admitted {admitted} > bound {bound} (budget {BUDGET} + {peak} requests in L = {l:?})"
    );
}

// ---------------------------------------------------------------------------
// 2. Lease mode: never above the limit, at least 90 % of it

/// Four instances, a budget of 200, load spread by `pick` until two
/// seconds pass with no admission (slices expire after two intervals and
/// go back, so leftovers are leased again). Returns what was admitted.
async fn lease_run(algorithm: &str, pick: fn(u64) -> usize, what: &str) -> u64 {
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-lease");
    let url = format!("{}/0", redis.url());
    let limit = budget_of(algorithm);
    // `deny`: were a lease call to fail, the failure policy must not be
    // what pushes admissions past the limit (store errors are asserted 0
    // anyway).
    let file = dir.write(
        "rules.yaml",
        &rules(
            &url,
            PATIENT,
            &sync_block("lease", None),
            "deny",
            &[("/hot", limit.as_str())],
        ),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file, &file]).await;
    wait_live(&c, &servers, 4.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;
    let all: Vec<&Server> = servers.iter().collect();
    let run = drive(
        &c,
        Load {
            urls: check_urls(&all),
            body: json!({"api": "/hot", "user": algorithm}),
            rate: 400.0,
            clients: 8,
            pick,
            idle: Some(secs(2)),
            max: secs(25),
            tolerate_failures: false,
        },
    )
    .await;
    let admitted = run.admitted();
    println!(
        "lease {algorithm} ({what}): admitted {admitted} of {} in {:?} ({}); budget {BUDGET}; \
         mean rate while admitting {:.0}/s; store errors {}",
        run.samples.len(),
        run.elapsed(),
        run.per_instance(),
        run.mean_rate_while_admitting(),
        run.store_errors(),
    );
    assert_eq!(run.store_errors(), 0, "lease calls failed");
    assert!(
        admitted <= BUDGET,
        "{algorithm} ({what}): admitted {admitted} > budget {BUDGET}: a lease over-admitted"
    );
    admitted
}

/// Uniform load: never above the budget; and, as unused slices go back
/// after two intervals while traffic goes on, at least 90 % of it.
async fn lease_uniform(algorithm: &str) {
    let _serial = SERIAL.lock().await;
    let admitted = lease_run(algorithm, round_robin, "uniform").await;
    assert!(
        admitted * 10 >= BUDGET * 9,
        "{algorithm} (uniform): admitted {admitted} < 90 % of {BUDGET}"
    );
}

macro_rules! per_algorithm {
    ($($algorithm:ident),* $(,)?) => {
        /// Eventual mode, one test per algorithm: see [`eventual_bound`].
        mod eventual {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $algorithm() {
                    super::eventual_bound(stringify!($algorithm)).await;
                }
            )*
        }
        /// Lease mode, uniform load, one test per algorithm: see
        /// [`lease_uniform`].
        mod lease {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $algorithm() {
                    super::lease_uniform(stringify!($algorithm)).await;
                }
            )*
        }
    };
}

per_algorithm!(
    token_bucket,
    leaky_bucket,
    fixed_window,
    sliding_window_log,
    sliding_window_counter,
    gcra,
);

/// Eventual mode over time, for the algorithms that refill: four
/// saturated instances admit what the rate allows (burst plus rate x
/// time), plus the lag bound; not four times the rate. (A regression:
/// catching up through `remaining`, never below 0, lost the debt the
/// store's bucket had from every instance's pushes, and each instance
/// refilled at the full rate.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_refilling_limits_hold_their_rate_across_instances() {
    let _serial = SERIAL.lock().await;
    for (algorithm, limit, rate, burst) in [
        ("gcra", "gcra: { rate: 50/1s, burst: 10 }", 50.0, 10.0),
        (
            "token_bucket",
            "token_bucket: { capacity: 10, refill: 50/1s }",
            50.0,
            10.0,
        ),
        (
            "leaky_bucket",
            "leaky_bucket: { capacity: 10, leak: 50/1s }",
            50.0,
            10.0,
        ),
    ] {
        let redis = RedisServer::start();
        let dir = TempDir::new("sync-rates");
        let url = format!("{}/0", redis.url());
        let file = dir.write(
            "rules.yaml",
            &rules(
                &url,
                PATIENT,
                &sync_block("eventual", None),
                "allow",
                &[("/hot", limit)],
            ),
        );
        let c = client();
        let servers = start_all(&c, &[&file, &file, &file, &file]).await;
        wait_live(&c, &servers, 4.0).await;
        let all: Vec<&Server> = servers.iter().collect();
        let w = watch(&c, &all);
        let run = drive(
            &c,
            Load {
                urls: check_urls(&all),
                body: json!({"api": "/hot", "user": algorithm}),
                rate: 400.0,
                clients: 8,
                pick: round_robin,
                idle: None,
                max: secs(3),
                tolerate_failures: false,
            },
        )
        .await;
        let o = w.finish().await;
        let l = lag_bound(&o);
        let peak = run.peak_in(l, |_| true);
        let elapsed = run.elapsed().as_secs_f64();
        let allowed = burst + rate * elapsed;
        let admitted = run.admitted();
        let bound = allowed + peak as f64;
        println!(
            "eventual {algorithm} at {rate}/s, burst {burst}: admitted {admitted} of {} in {elapsed:.2}s ({}); \
             the rate allows {allowed:.0}; peak requests in any L = {l:?}: {peak}; bound {bound:.0}",
            run.samples.len(),
            run.per_instance()
        );
        assert_eq!(
            run.store_errors(),
            0,
            "decisions fell back to the failure policy"
        );
        assert!(
            admitted as f64 <= bound,
            "{algorithm}: admitted {admitted} > bound {bound:.0} (four instances each at the full rate?)"
        );
        assert!(
            admitted as f64 >= allowed * 0.8,
            "{algorithm}: admitted {admitted}, well under the {allowed:.0} the rate allows"
        );
    }
}

/// The documented under-admission bound: with 90 % of a key's traffic on
/// one instance, at least 90 % of the limit is admitted, and never more
/// than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_skewed_90_percent_on_one_instance_admits_at_least_90_percent() {
    let _serial = SERIAL.lock().await;
    for algorithm in ["fixed_window", "token_bucket"] {
        let admitted = lease_run(algorithm, ninety_to_first, "90 % on instance 0").await;
        assert!(
            admitted * 10 >= BUDGET * 9,
            "{algorithm} (skewed): admitted {admitted} < 90 % of {BUDGET}"
        );
    }
}

// ---------------------------------------------------------------------------
// 3. on_store_error: share

/// A limit of 400 an hour, shared by four instances: 100 each while the
/// store is gone.
const SHARED_LIMIT: u64 = 400;

fn share_rules(url: &str, sync: &str) -> String {
    rules(
        url,
        "50ms",
        sync,
        "share",
        &[
            ("/fw", "fixed_window: { limit: 400, window: 1h }"),
            // Background traffic, never limited.
            ("/bg", "fixed_window: { limit: 100000000, window: 1h }"),
        ],
    )
}

/// Until every instance says `degraded` (and, with `breaker`, its Redis
/// circuit breaker has opened, so that decisions stop waiting for Redis's
/// timeout), sends one check of a key of its own to each: traffic is what
/// finds the store gone, and these keys are not the ones measured.
/// Returns, per instance, the probes admitted on the share (they are owed
/// to the store like any other).
async fn probe_until_degraded(
    c: &reqwest::Client,
    servers: &[Server],
    breaker: bool,
) -> (Vec<u64>, Duration) {
    let mut shared = vec![0u64; servers.len()];
    let d = Deadline::new("every instance degraded", secs(20));
    loop {
        let mut states = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            let (status, _, j) =
                check(c, s, json!({"api": "/fw", "user": format!("probe-{i}")})).await;
            if status == 200 && j["store_error"] == true {
                shared[i] += 1;
            }
            let outages = if breaker {
                gauge1(&metrics(c, s).await, "spillway_redis_outages_total")
            } else {
                1.0
            };
            states.push((readyz(c, s).await["status"].clone(), outages));
        }
        if states.iter().all(|(s, o)| s == "degraded" && *o >= 1.0) {
            return (shared, d.elapsed());
        }
        d.wait(&states).await;
    }
}

/// The per-decision store (no `sync:`) with `on_store_error: share`, four
/// instances: 40 admitted before the outage through instance 0; while
/// Redis is gone (stopped, or killed), each instance admits exactly
/// 400 / 4 = 100 of 150 attempts of one key, and all 30 of another; once
/// it is back, what was admitted meanwhile is in the shared count, once.
async fn share_per_decision(kill: bool) {
    let _serial = SERIAL.lock().await;
    let what = if kill {
        "SIGKILL + restart"
    } else {
        "SIGSTOP + SIGCONT"
    };
    let mut redis = RedisServer::start();
    let dir = TempDir::new("sync-share");
    let file = dir.write(
        "rules.yaml",
        &share_rules(&format!("{}/0", redis.url()), ""),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file, &file]).await;
    let took = wait_live(&c, &servers, 4.0).await;
    println!("{what}: 4 live instances seen by all after {took:?}");
    clear_of_window_edge(secs(3600), secs(20)).await;

    let kept = json!({"api": "/fw", "user": "kept"});
    let burst = json!({"api": "/fw", "user": "burst"});
    let before = attempts(c.clone(), servers[0].url("/v1/check"), kept.clone(), 40).await;
    assert_eq!((before.admitted, before.store_error), (40, 0), "{before:?}");
    assert_eq!(remaining(&c, &servers[1], &kept).await, SHARED_LIMIT - 40);

    if kill {
        redis.kill();
    } else {
        redis.signal("STOP");
    }
    let (probes, took) = probe_until_degraded(&c, &servers, true).await;
    println!("{what}: all degraded after {took:?}; probes admitted on the share: {probes:?}");
    for s in &servers {
        let m = metrics(&c, s).await;
        assert_eq!(gauge1(&m, "spillway_sync_share_active"), 1.0, "{}", s.addr);
        assert_eq!(
            gauge1(&m, "spillway_sync_live_instances"),
            4.0,
            "{}",
            s.addr
        );
    }

    let bursts = attempts_each(&c, &servers, &burst, 150).await;
    let keeps = attempts_each(&c, &servers, &kept, 30).await;
    println!("{what}: while sharing, 150 attempts each: {bursts:?}; 30 each: {keeps:?}");
    let mut waiting = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        let r = readyz(&c, s).await;
        assert_eq!(r["status"], "degraded", "#{i}: {r}");
        waiting.push(gauge_sum(
            &metrics(&c, s).await,
            "spillway_sync_deltas_waiting",
        ));
    }
    println!("{what}: deltas waiting per instance while sharing: {waiting:?}");
    for (i, t) in bursts.iter().enumerate() {
        assert_eq!(t.admitted + t.denied, 150, "#{i}: {t:?}");
        assert_eq!(
            t.admitted,
            SHARED_LIMIT / 4,
            "#{i}: admitted {} of 150 on its share (limit {SHARED_LIMIT} / 4 live)",
            t.admitted
        );
    }
    for (i, t) in keeps.iter().enumerate() {
        assert_eq!(t.admitted, 30, "#{i}: {t:?}");
    }
    // What each admitted alone waits for the store: 100 + 30, and those
    // of its probes that were never sent; less any request that was the
    // breaker's probe itself. A request sent to a stopped Redis (a
    // timeout) is run by Redis when it resumes, so it is not owed: the
    // remaining after reconciliation below says nothing is lost or doubled.
    for (i, w) in waiting.iter().enumerate() {
        let most = (SHARED_LIMIT / 4 + 30 + probes[i]) as f64;
        assert!(
            *w > 0.0 && *w <= most,
            "#{i}: deltas waiting {w}, admitted alone at most {most}"
        );
    }

    if kill {
        redis.restart();
    } else {
        redis.signal("CONT");
    }
    let took = wait_reconciled(&c, &servers, secs(20)).await;
    println!("{what}: reconciled after {took:?}");
    // The pre-outage 40 died with a killed Redis's memory.
    let expected = if kill {
        SHARED_LIMIT - 4 * 30
    } else {
        SHARED_LIMIT - 40 - 4 * 30
    };
    for (i, s) in servers.iter().enumerate() {
        let left = remaining(&c, s, &kept).await;
        let gone = remaining(&c, s, &burst).await;
        println!(
            "{what}: #{i}: kept remaining {left} (expected {expected}), burst remaining {gone}"
        );
        assert_eq!(
            left, expected,
            "#{i}: kept: something lost or counted twice"
        );
        assert_eq!(
            gone, 0,
            "#{i}: burst: 4 x 100 admitted alone were not all charged"
        );
    }
    let (status, _, j) = check(&c, &servers[2], burst.clone()).await;
    assert_eq!((status, &j["store_error"]), (429, &json!(false)), "{j}");
    for s in &servers {
        let r = readyz(&c, s).await;
        assert_eq!(r["status"], "ready", "{r}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_per_decision_redis_stopped_each_admits_a_quarter_then_reconciles_once() {
    share_per_decision(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_per_decision_redis_killed_and_restarted_empty_reconciles_what_was_shared() {
    share_per_decision(true).await;
}

/// While Redis is stopped, the per-decision store's circuit breaker still
/// sends one real decision to it now and then (a probe, every
/// `probe_interval`); it times out and is decided on the share, which owes
/// it to the store. Redis runs the queued script when it is continued: the
/// same admission must not be counted there too. One instance (its share
/// is the whole limit), 40 checks of one key before the outage, 200 paced
/// over 1.5 s during it, so several probes fall on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_per_decision_a_probe_that_timed_out_on_a_stopped_redis_counts_once() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-share-probe");
    let file = dir.write(
        "rules.yaml",
        &share_rules(&format!("{}/0", redis.url()), ""),
    );
    let c = client();
    let servers = start_all(&c, &[&file]).await;
    wait_live(&c, &servers, 1.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;
    // The key has a state in Redis before the outage (a late script on a
    // key Redis has never seen did not count twice in our runs).
    let kept = json!({"api": "/fw", "user": "kept"});
    let before = attempts(c.clone(), servers[0].url("/v1/check"), kept.clone(), 40).await;
    assert_eq!((before.admitted, before.store_error), (40, 0), "{before:?}");
    redis.signal("STOP");
    probe_until_degraded(&c, &servers, true).await;
    let all: Vec<&Server> = servers.iter().collect();
    let run = drive(
        &c,
        Load {
            urls: check_urls(&all),
            body: kept.clone(),
            rate: 200.0 / 1.5,
            clients: 1,
            pick: |_| 0,
            idle: None,
            max: Duration::from_millis(1500),
            tolerate_failures: false,
        },
    )
    .await;
    let slow = run
        .samples
        .iter()
        .filter(|s| s.end - s.start >= Duration::from_millis(50))
        .count();
    redis.signal("CONT");
    let took = wait_reconciled(&c, &servers, secs(20)).await;
    let left = remaining(&c, &servers[0], &kept).await;
    let admitted = 40 + run.admitted();
    println!(
        "40 before; while stopped: {} of {} admitted ({} with store_error, {slow} took >= the 50 ms timeout); \
         reconciled after {took:?}; remaining {left}, expected {}",
        run.admitted(),
        run.samples.len(),
        run.store_errors(),
        SHARED_LIMIT - admitted
    );
    // How the doubts of the calls that timed out were settled.
    for line in servers[0].drain_logs() {
        if line.contains("store call timed out") || line.contains("connection lost") {
            println!("{line}");
        }
    }
    assert_eq!(
        run.store_errors(),
        run.samples.len() as u64,
        "every decision on the share"
    );
    assert_eq!(
        left,
        SHARED_LIMIT - admitted,
        "{} admissions counted twice ({slow} decisions waited for the stopped Redis)",
        (SHARED_LIMIT - admitted).saturating_sub(left)
    );
}

/// Eventual mode with `on_store_error: share`: Redis stopped under a
/// background load; each instance then admits limit / 4 of a key on its
/// own, and after Redis returns every instance sees the reconciled count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_eventual_redis_stopped_under_load_each_admits_a_quarter() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-share-eventual");
    let file = dir.write(
        "rules.yaml",
        &share_rules(&format!("{}/0", redis.url()), &sync_block("eventual", None)),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file, &file]).await;
    wait_live(&c, &servers, 4.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;

    let kept = json!({"api": "/fw", "user": "kept"});
    let burst = json!({"api": "/fw", "user": "burst"});
    let before = attempts(c.clone(), servers[0].url("/v1/check"), kept.clone(), 40).await;
    assert_eq!(before.admitted, 40, "{before:?}");
    // Every instance knows of the 40 before the store goes.
    for s in &servers {
        let d = Deadline::new(format!("{}: kept at 360", s.addr), secs(5));
        loop {
            let left = remaining(&c, s, &kept).await;
            if left == SHARED_LIMIT - 40 {
                break;
            }
            d.wait(&left).await;
        }
    }

    let all: Vec<&Server> = servers.iter().collect();
    let bg = start_load(
        &c,
        Load {
            urls: check_urls(&all),
            body: json!({"api": "/bg", "user": "background"}),
            rate: 200.0,
            clients: 4,
            pick: round_robin,
            idle: None,
            max: secs(60),
            tolerate_failures: false,
        },
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    redis.signal("STOP");
    let stopped = Instant::now();
    let mut took = Vec::new();
    for s in &servers {
        took.push(wait_status(&c, s, "degraded", secs(20)).await);
    }
    // The background load's decisions are what turn sharing on.
    let d = Deadline::new("share_active on every instance", secs(10));
    loop {
        let mut active = Vec::new();
        for s in &servers {
            active.push(gauge1(&metrics(&c, s).await, "spillway_sync_share_active"));
        }
        if active.iter().all(|a| *a == 1.0) {
            break;
        }
        d.wait(&active).await;
    }
    println!(
        "degraded after {:?} (per instance {took:?})",
        stopped.elapsed()
    );

    let bursts = attempts_each(&c, &servers, &burst, 150).await;
    let keeps = attempts_each(&c, &servers, &kept, 30).await;
    println!("while sharing under load: 150 attempts each: {bursts:?}; 30 each: {keeps:?}");
    for (i, t) in bursts.iter().enumerate() {
        assert_eq!(t.admitted + t.denied, 150, "#{i}: {t:?}");
        assert_eq!(
            t.admitted,
            SHARED_LIMIT / 4,
            "#{i}: admitted {} of 150 on its share (limit {SHARED_LIMIT} / 4 live)",
            t.admitted
        );
    }
    for (i, t) in keeps.iter().enumerate() {
        assert_eq!(t.admitted, 30, "#{i}: {t:?}");
    }

    redis.signal("CONT");
    bg.stop();
    let bg = bg.finish().await;
    println!(
        "background: {} requests, {} admitted, {} store errors",
        bg.samples.len(),
        bg.admitted(),
        bg.store_errors()
    );
    let took = wait_reconciled(&c, &servers, secs(20)).await;
    println!("reconciled after {took:?}");
    let expected = SHARED_LIMIT - 40 - 4 * 30;
    for (i, s) in servers.iter().enumerate() {
        // Eventual: each instance learns the others' reconciled counts
        // within a lag; a value below the expected one is a double count.
        // `burst` was used here only on the share: the first check starts
        // tracking it and reads local state until the key's first exchange
        // (documented), so it too is polled.
        let d = Deadline::new(format!("#{i}: kept at {expected}, burst at 0"), secs(5));
        let mut first_burst = None;
        loop {
            let left = remaining(&c, s, &kept).await;
            let gone = remaining(&c, s, &burst).await;
            first_burst.get_or_insert(gone);
            assert!(
                left >= expected,
                "#{i}: kept remaining {left} < {expected}: counted twice"
            );
            if (left, gone) == (expected, 0) {
                println!(
                    "#{i}: converged after the outage in {:?}; burst read {} on its first check",
                    d.elapsed(),
                    first_burst.unwrap()
                );
                break;
            }
            d.wait(&(left, gone)).await;
        }
    }
    tokio::time::sleep(5 * INTERVAL).await;
    for (i, s) in servers.iter().enumerate() {
        let left = remaining(&c, s, &kept).await;
        let gone = remaining(&c, s, &burst).await;
        println!("#{i}: kept remaining {left}, burst remaining {gone}");
        assert_eq!(left, expected, "#{i}: kept, 5 intervals later");
        assert_eq!(
            gone, 0,
            "#{i}: burst: 4 x 100 admitted alone were not all charged"
        );
    }
}

/// The documented eventual bound also covers "a key an instance starts
/// using (or uses again after 10 idle intervals)": it is decided on local
/// state until its first exchange, with "the same bound" (over-admission
/// at most what the *other* instances admit within `L`). Here the key is
/// exhausted by instances 0 to 2, all traffic stops for 3 intervals (the
/// others then admit nothing in any later `L`), and then (a) instance 3,
/// new to the key, and (b) instance 0, back after 15 idle intervals, are
/// sent requests: the bound leaves room for no admission at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_an_exhausted_key_stays_exhausted_for_a_new_or_returning_instance() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-late");
    let url = format!("{}/0", redis.url());
    let limit = budget_of("fixed_window");
    let file = dir.write(
        "rules.yaml",
        &rules(
            &url,
            PATIENT,
            &sync_block("eventual", None),
            "allow",
            &[("/hot", limit.as_str())],
        ),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file, &file]).await;
    wait_live(&c, &servers, 4.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;
    let body = json!({"api": "/hot", "user": "late"});
    let first_three: Vec<&Server> = servers[..3].iter().collect();
    let run = drive(
        &c,
        Load {
            urls: check_urls(&first_three),
            body: body.clone(),
            rate: 300.0,
            clients: 6,
            pick: |n| (n % 3) as usize,
            idle: Some(secs(1)),
            max: secs(20),
            tolerate_failures: false,
        },
    )
    .await;
    println!(
        "instances 0-2: admitted {} of {} ({})",
        run.admitted(),
        run.samples.len(),
        run.per_instance()
    );
    assert!(run.admitted() >= BUDGET, "{}", run.admitted());
    tokio::time::sleep(3 * INTERVAL).await;

    // (a) Instance 3 has never seen the key. Its first requests are
    // decided on its own memory; the first one wakes a pull of the key
    // (a tenth of an interval apart at most), so after the first wave and
    // one pull's time, it refuses like the others.
    let settle = INTERVAL / 10 + Duration::from_millis(200);
    let first_wave = attempts_concurrently(&c, &servers[3], &body, 8, 1).await;
    tokio::time::sleep(settle).await;
    let newcomer = attempts_concurrently(&c, &servers[3], &body, 8, 10).await;
    // (b) Instance 0, idle on the key for 15 intervals (it forgets keys
    // after 10): the same.
    tokio::time::sleep(15 * INTERVAL).await;
    let returning_wave = attempts_concurrently(&c, &servers[0], &body, 8, 1).await;
    tokio::time::sleep(settle).await;
    let returning = attempts_concurrently(&c, &servers[0], &body, 8, 10).await;
    println!(
        "on a key exhausted 3 intervals ago by the others: the new instance admitted {} of its \
         first 8 and {} of 80 after {:?}; the instance back after 15 idle intervals {} of 8, then {} of 80",
        first_wave.admitted, newcomer.admitted, settle, returning_wave.admitted, returning.admitted
    );
    assert_eq!(
        (newcomer.admitted, returning.admitted),
        (0, 0),
        "(new instance, returning instance): admissions past an exhausted budget \
         once the key was pulled"
    );
}

/// `per_client` checks from each of `clients` concurrent clients to `s`.
async fn attempts_concurrently(
    c: &reqwest::Client,
    s: &Server,
    body: &Value,
    clients: usize,
    per_client: usize,
) -> Tally {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(attempts(
                c.clone(),
                s.url("/v1/check"),
                body.clone(),
                per_client,
            ))
        })
        .collect();
    let mut total = Tally::default();
    for t in tasks {
        let t = t.await.unwrap();
        total.admitted += t.admitted;
        total.denied += t.denied;
        total.store_error += t.store_error;
    }
    total
}

// ---------------------------------------------------------------------------
// 4. Two regions

/// Regions a (A1, A2, home R1) and b (B1, B2, home R2), each pushing to the
/// other region's store through a relay the test cuts and heals. Budget
/// 400 an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_limit_through_a_cut_and_converge_after_heal() {
    let _serial = SERIAL.lock().await;
    const LIMIT: u64 = 400;
    let (r1, r2) = (RedisServer::start(), RedisServer::start());
    let (to_r1, to_r2) = (Relay::start(addr(&r1)), Relay::start(addr(&r2)));
    let dir = TempDir::new("sync-regions");
    let limit = [("/hot", "fixed_window: { limit: 400, window: 1h }")];
    let a = dir.write(
        "a.yaml",
        &rules(
            &format!("{}/0", r1.url()),
            PATIENT,
            &sync_block("eventual", Some(("a", &[("b", to_r2.redis_url())][..]))),
            "allow",
            &limit,
        ),
    );
    let b = dir.write(
        "b.yaml",
        &rules(
            &format!("{}/0", r2.url()),
            PATIENT,
            &sync_block("eventual", Some(("b", &[("a", to_r1.redis_url())][..]))),
            "allow",
            &limit,
        ),
    );
    let c = client();
    // 0, 1: region a; 2, 3: region b.
    let servers = start_all(&c, &[&a, &a, &b, &b]).await;
    // Heartbeats go to the home store: two live instances in each region.
    wait_live(&c, &servers[..2], 2.0).await;
    wait_live(&c, &servers[2..], 2.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;
    let all: Vec<&Server> = servers.iter().collect();
    let region_a = |i: usize| i < 2;
    let region_b = |i: usize| i >= 2;
    let key = |user: &str| json!({"api": "/hot", "user": user});

    // Linked: the eventual bound holds across regions.
    let w = watch(&c, &all);
    let run = drive(
        &c,
        Load {
            urls: check_urls(&all),
            body: key("one"),
            rate: 400.0,
            clients: 8,
            pick: round_robin,
            idle: Some(secs(1)),
            max: secs(20),
            tolerate_failures: false,
        },
    )
    .await;
    let o = w.finish().await;
    // Observability: every store of every instance answered, labelled with
    // its region and whether it is the instance's home.
    wait_exchanged(&c, &servers).await;
    for (i, s) in servers.iter().enumerate() {
        let m = metrics(&c, s).await;
        let (home, other) = if i < 2 { ("a", "b") } else { ("b", "a") };
        for name in [
            "spillway_sync_lag_seconds",
            "spillway_sync_last_success_timestamp_seconds",
            "spillway_sync_deltas_waiting",
            "spillway_sync_keys_synced",
        ] {
            let mut labels: Vec<String> = gauge(&m, name).into_iter().map(|(l, _)| l).collect();
            let mut want = vec![
                format!("region=\"{home}\",home=\"true\""),
                format!("region=\"{other}\",home=\"false\""),
            ];
            labels.sort();
            want.sort();
            assert_eq!(labels, want, "#{i}: {name}");
        }
        assert_eq!(gauge1(&m, "spillway_sync_share_active"), 0.0, "#{i}");
    }
    let l = lag_bound(&o);
    let peak = run.peak_in(l, |_| true);
    println!(
        "linked: admitted {} of {} ({}); L = {l:?} (rtt {:?}, largest lag gauge {:?}); peak in L {peak}; bound {}",
        run.admitted(),
        run.samples.len(),
        run.per_instance(),
        o.rtt,
        o.lag,
        LIMIT + peak
    );
    assert_eq!(run.store_errors(), 0);
    assert!(
        run.admitted() >= LIMIT,
        "linked: {} < {LIMIT}",
        run.admitted()
    );
    assert!(
        run.admitted() <= LIMIT + peak,
        "linked: admitted {} > {LIMIT} + {peak} requests in L = {l:?}",
        run.admitted()
    );

    // Before the cut: 100 on "two", 40 on "three", known everywhere.
    let t = attempts_each(&c, &servers, &key("two"), 25).await;
    assert!(t.iter().all(|t| t.admitted == 25), "{t:?}");
    let t = attempts_each(&c, &servers, &key("three"), 10).await;
    assert!(t.iter().all(|t| t.admitted == 10), "{t:?}");
    for (i, s) in servers.iter().enumerate() {
        let d = Deadline::new(format!("#{i}: two at 300 and three at 360"), secs(5));
        loop {
            let seen = (
                remaining(&c, s, &key("two")).await,
                remaining(&c, s, &key("three")).await,
            );
            if seen == (300, 360) {
                break;
            }
            d.wait(&seen).await;
        }
    }

    // Cut: each region limits on its own with the last known remote counts.
    to_r1.cut();
    to_r2.cut();
    let w = watch(&c, &all);
    let cut = drive(
        &c,
        Load {
            urls: check_urls(&all),
            body: key("two"),
            rate: 400.0,
            clients: 8,
            pick: round_robin,
            idle: Some(secs(1)),
            max: secs(20),
            tolerate_failures: false,
        },
    )
    .await;
    let o = w.finish().await;
    let l = lag_bound(&o);
    let in_a = cut.admitted_by(0) + cut.admitted_by(1);
    let in_b = cut.admitted_by(2) + cut.admitted_by(3);
    let (peak_a, peak_b) = (cut.peak_in(l, region_a), cut.peak_in(l, region_b));
    println!(
        "cut: region a admitted {in_a}, region b {in_b} ({}), before the cut 100; L = {l:?} (rtt {:?}); \
         peak in L: a {peak_a}, b {peak_b}; total {} <= {LIMIT} + other region + lag",
        cut.per_instance(),
        o.rtt,
        100 + in_a + in_b
    );
    assert_eq!(cut.store_errors(), 0, "the home stores were never cut");
    for (name, mine, peak) in [("a", in_a, peak_a), ("b", in_b, peak_b)] {
        assert!(
            100 + mine >= LIMIT,
            "region {name} admitted {mine} during the cut: below the limit it knew"
        );
        assert!(
            100 + mine <= LIMIT + peak,
            "region {name}: 100 + {mine} > {LIMIT} + {peak} (its own requests in L = {l:?})"
        );
    }
    let t = attempts_each(&c, &servers, &key("three"), 20).await;
    assert!(t.iter().all(|t| t.admitted == 20), "{t:?}");

    // Heal: within two intervals (plus a slack of 1 s for a busy machine
    // and a breaker's probe), A1 and B1 agree on 400 - everything.
    to_r1.heal();
    to_r2.heal();
    let healed = Instant::now();
    let expected = LIMIT - 40 - 80;
    let d = Deadline::new("A1 and B1 agree after the heal", secs(10));
    let took = loop {
        let seen = [
            remaining(&c, &servers[0], &key("three")).await,
            remaining(&c, &servers[2], &key("three")).await,
            remaining(&c, &servers[0], &key("two")).await,
            remaining(&c, &servers[2], &key("two")).await,
        ];
        assert!(
            seen[0] >= expected && seen[1] >= expected,
            "three: A1 {} B1 {} < {expected}: counted twice",
            seen[0],
            seen[1]
        );
        if seen == [expected, expected, 0, 0] {
            break healed.elapsed();
        }
        d.wait(&seen).await;
    };
    let allowed = 2 * INTERVAL + secs(1);
    println!("converged {took:?} after the heal (allowed {allowed:?})");
    assert!(took <= allowed, "converged only {took:?} after the heal");
    tokio::time::sleep(5 * INTERVAL).await;
    for (i, s) in servers.iter().enumerate() {
        let left = remaining(&c, s, &key("three")).await;
        assert_eq!(left, expected, "#{i}: three, 5 intervals after converging");
    }
}

// ---------------------------------------------------------------------------
// 5. SIGKILL loses at most the last interval's deltas

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_at_most_the_last_intervals_deltas() {
    let _serial = SERIAL.lock().await;
    const BIG: u64 = 1_000_000;
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-kill");
    let file = dir.write(
        "rules.yaml",
        &rules(
            &format!("{}/0", redis.url()),
            PATIENT,
            &sync_block("eventual", None),
            "allow",
            &[("/hot", "fixed_window: { limit: 1000000, window: 1h }")],
        ),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file, &file]).await;
    wait_live(&c, &servers, 4.0).await;
    clear_of_window_edge(secs(3600), secs(20)).await;
    let body = json!({"api": "/hot", "user": "k"});
    let (victim, others) = servers.split_last().unwrap();
    let all: Vec<&Server> = servers.iter().collect();
    let w = watch(&c, &all);
    const VICTIM_CLIENTS: usize = 4;
    let v = start_load(
        &c,
        Load {
            urls: vec![victim.url("/v1/check")],
            body: body.clone(),
            rate: 200.0,
            clients: VICTIM_CLIENTS,
            pick: |_| 0,
            idle: None,
            max: secs(30),
            tolerate_failures: true,
        },
    );
    let o_urls: Vec<&Server> = others.iter().collect();
    let rest = start_load(
        &c,
        Load {
            urls: check_urls(&o_urls),
            body: body.clone(),
            rate: 60.0,
            clients: 3,
            pick: |n| (n % 3) as usize,
            idle: None,
            max: secs(30),
            tolerate_failures: false,
        },
    );
    tokio::time::sleep(secs(2)).await;
    victim.signal("KILL");
    let killed = Instant::now();
    v.stop();
    tokio::time::sleep(3 * INTERVAL).await;
    rest.stop();
    let (v, rest) = (v.finish().await, rest.finish().await);
    let o = w.finish().await;
    // The survivors push what they admitted; then three intervals for every
    // one of them to have read it back.
    let d = Deadline::new("no deltas waiting on the survivors", secs(10));
    loop {
        let mut waiting = Vec::new();
        for s in others {
            waiting.push(gauge_sum(
                &metrics(&c, s).await,
                "spillway_sync_deltas_waiting",
            ));
        }
        if waiting.iter().all(|w| *w == 0.0) {
            break;
        }
        d.wait(&waiting).await;
    }
    tokio::time::sleep(3 * INTERVAL).await;
    let mut seen = Vec::new();
    for s in others {
        seen.push(remaining(&c, s, &body).await);
    }
    let left = seen[0];
    let by_victim = v.admitted();
    let by_others = rest.admitted();
    let counted_for_victim = BIG as i64 - left as i64 - by_others as i64;
    let lost = by_victim as i64 - counted_for_victim;
    let span = v
        .samples
        .iter()
        .filter(|s| s.admitted())
        .map(|s| s.end)
        .max()
        .map_or(Duration::from_millis(1), |e| e - v.t0);
    let r = by_victim as f64 / span.as_secs_f64();
    // Slack: 50 ms of the victim's rate for a late timer, and one unit.
    let bound = r * (INTERVAL + o.rtt + Duration::from_millis(50)).as_secs_f64() + 1.0;
    println!(
        "SIGKILL: victim admitted {by_victim} at {r:.0}/s ({} failed after the kill, {:?} after its start); \
         others admitted {by_others}; remaining per survivor {seen:?}; counted for the victim {counted_for_victim}; \
         lost {lost}; bound r x (interval {INTERVAL:?} + rtt {:?} + 50 ms) + 1 = {bound:.1}; \
         largest lag gauge {:?}",
        v.failures(),
        killed - v.t0,
        o.rtt,
        o.lag,
    );
    assert!(
        seen.iter().all(|s| *s == left),
        "the survivors disagree: {seen:?}"
    );
    assert_eq!(rest.store_errors() + v.store_errors(), 0);
    assert!(
        lost as f64 <= bound,
        "lost {lost} admissions with the killed instance; at most {bound:.1} allowed"
    );
    // Requests in flight at the kill may have been admitted and pushed
    // without their answer arriving: at most one per client.
    assert!(
        lost >= -(VICTIM_CLIENTS as i64),
        "{} more counted for the victim than it admitted: counted twice",
        -lost
    );
}

// ---------------------------------------------------------------------------
// 6. A slow link to Redis: per-decision pays it, sync modes do not

/// Sequential checks of one key on `s`; their latencies, sorted.
async fn sequential_latencies(
    c: &reqwest::Client,
    s: &Server,
    n: usize,
    started: Instant,
) -> Vec<Duration> {
    let body = json!({"api": "/hot", "user": "lat"});
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let (status, _, j) = check(c, s, body.clone()).await;
        out.push(t.elapsed());
        assert!(
            status == 200 && j["store_error"] == false,
            "request {i} after {:?}: {status} {j}\nserver log: {:#?}",
            started.elapsed(),
            s.drain_logs()
        );
    }
    out.sort();
    out
}

fn pct(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_with_a_20ms_relay_per_decision_pays_it_sync_modes_do_not() {
    let _serial = SERIAL.lock().await;
    const N: usize = 300;
    let c = client();
    let mut figures = Vec::new();
    for mode in ["per-decision", "eventual", "lease"] {
        let redis = RedisServer::start();
        let relay = Relay::start(addr(&redis));
        relay.set_delay(Duration::from_millis(20));
        let dir = TempDir::new("sync-latency");
        let sync = if mode == "per-decision" {
            String::new()
        } else {
            sync_block(mode, None)
        };
        // A timeout well above the relay's 40 ms round trip: this measures
        // latency, not the failure policy.
        let file = dir.write(
            "rules.yaml",
            &rules(
                &relay.redis_url(),
                "1s",
                &sync,
                "deny",
                &[("/hot", "fixed_window: { limit: 1000000, window: 1h }")],
            ),
        );
        let started = Instant::now();
        let servers = start_all(&c, &[&file]).await;
        // The store connected (through the slow relay) and the HTTP
        // connection open, on another key than the one measured: a lease
        // instance is "ready" before its store answers (see
        // `lease_is_not_ready_before_its_store_answers`), and this measures
        // latency, not that.
        let d = Deadline::new(format!("{mode}: a decision the store answered"), secs(10));
        loop {
            let (_, _, j) = check(&c, &servers[0], json!({"api": "/hot", "user": "warm-up"})).await;
            if j["store_error"] == false {
                break;
            }
            d.wait(&j).await;
        }
        println!(
            "{mode}: first decision without a store error {:?} after start",
            started.elapsed()
        );
        let l = sequential_latencies(&c, &servers[0], N, started).await;
        let (p50, p99) = (pct(&l, 0.50), pct(&l, 0.99));
        let slow = l
            .iter()
            .filter(|d| **d >= Duration::from_millis(40))
            .count();
        println!(
            "{mode}: {N} sequential checks through a 20 ms-each-way relay: p50 {p50:?} p99 {p99:?} max {:?}; {slow} took >= 40 ms",
            l[N - 1]
        );
        figures.push((mode, p50, p99));
    }
    let per_decision_p50 = figures[0].1;
    assert!(
        per_decision_p50 >= Duration::from_millis(40),
        "per-decision p50 {per_decision_p50:?}: the relay's 40 ms round trip is missing"
    );
    for (mode, _, p99) in &figures[1..] {
        assert!(
            *p99 < per_decision_p50,
            "{mode}: p99 {p99:?} is not below the per-decision p50 {per_decision_p50:?}"
        );
    }
}

/// A lease instance cannot decide until its store answers (a lease is a
/// store call), so it must not say `ready` before: a load balancer would
/// send it traffic that it can only answer by the failure policy. The
/// relay holds the link silent at start, then lets it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_not_ready_before_its_store_answers() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let relay = Relay::start(addr(&redis));
    relay.stall();
    let dir = TempDir::new("sync-lease-ready");
    let file = dir.write(
        "rules.yaml",
        &rules(
            &relay.redis_url(),
            "50ms",
            &sync_block("lease", None),
            "deny",
            &[("/hot", "fixed_window: { limit: 1000, window: 1h }")],
        ),
    );
    let c = client();
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = readyz(&c, &s).await;
    let (status, _, j) = check(&c, &s, json!({"api": "/hot", "user": "u"})).await;
    println!(
        "store silent: /readyz {r}; a check: {status} store_error {}",
        j["store_error"]
    );
    relay.heal();
    let took = wait_status(&c, &s, "ready", secs(10)).await;
    let d = Deadline::new("a decision the store answered", secs(10));
    loop {
        let (status, _, j) = check(&c, &s, json!({"api": "/hot", "user": "u"})).await;
        if status == 200 && j["store_error"] == false {
            break;
        }
        d.wait(&j).await;
    }
    println!("healed: ready after {took:?}");
    assert_eq!(j["store_error"], true, "with no store, no lease: {j}");
    assert_ne!(
        r["status"], "ready",
        "lease mode said ready while its store had never answered, and a check then got {status} {j}"
    );
}

/// Issue 35, as measured there: three eventual instances hammering one
/// key admitted 510 in 4 fixed windows of 100 (170 each), where a window
/// start admits about the limit. Real processes, their own exchange
/// loops, two clients per instance sending without pause for four
/// windows of 2 s; each admission is counted in the window its answer
/// names (`reset_ms` from the answer's time). The gate now opens only on
/// a read holding every instance's share (see docs/SYNC.md), so each
/// whole window stays within 1.2 x the limit however late an exchange
/// comes (the driven worst order is
/// `eventual_windows_hold_whatever_order_exchanges_come_in` in
/// spillway-sync's tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventual_three_instances_hammering_hold_each_fixed_window() {
    let redis = RedisServer::start();
    let dir = TempDir::new("sync-hammer");
    let file = dir.write(
        "rules.yaml",
        &rules(
            &format!("{}/0", redis.url()),
            "1s",
            &sync_block("eventual", None),
            "allow",
            &[("/fw", "fixed_window: { limit: 100, window: 2s }")],
        ),
    );
    let c = client();
    let servers = start_all(&c, &[&file, &file, &file]).await;
    wait_live(&c, &servers, 3.0).await;
    let w_ms: u128 = 2000;
    let now_ms = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    // Start just after a window edge; stop after four whole windows.
    let first = now_ms() / w_ms + 1;
    tokio::time::sleep(Duration::from_millis((first * w_ms - now_ms()) as u64)).await;
    let stop = (first + 4) * w_ms;
    let body = json!({"api": "/fw", "user": "hammered"});
    let mut tasks = Vec::new();
    for s in &servers {
        for _ in 0..2 {
            let (c, url, body) = (c.clone(), s.url("/v1/check"), body.clone());
            tasks.push(tokio::spawn(async move {
                let mut windows = std::collections::BTreeMap::<u128, u64>::new();
                let mut unsure = 0u64;
                while now_ms() < stop {
                    let sent = now_ms();
                    let r = c.post(&url).json(&body).send().await.unwrap();
                    let status = r.status().as_u16();
                    let j: Value = r.json().await.unwrap();
                    if status == 200 {
                        // The window ends `reset_ms` after the decision,
                        // made between sending and reading the answer; on
                        // a busy machine that can be over half a window,
                        // and then which window is not known.
                        let reset = u128::from(j["reset_ms"].as_u64().unwrap());
                        let window = |t: u128| (t + reset + w_ms / 2) / w_ms - 1;
                        let (early, late) = (window(sent), window(now_ms()));
                        if early == late {
                            *windows.entry(early).or_default() += 1;
                        } else {
                            unsure += 1;
                        }
                    }
                }
                (windows, unsure)
            }));
        }
    }
    let mut per = std::collections::BTreeMap::<u128, u64>::new();
    let mut unsure = 0;
    for t in tasks {
        let (windows, u) = t.await.unwrap();
        unsure += u;
        for (w, n) in windows {
            *per.entry(w).or_default() += n;
        }
    }
    let whole: Vec<u64> = (first..first + 4)
        .map(|w| per.get(&w).copied().unwrap_or(0))
        .collect();
    println!(
        "admitted per fixed window of 100, 3 instances hammering: {whole:?} (all: {per:?}; \
         {unsure} answered too late to place)"
    );
    for (i, &n) in whole.iter().enumerate() {
        assert!(n <= 120, "window {i}: {n} admitted of 100 ({whole:?})");
        assert!(
            n + unsure >= 90,
            "window {i}: only {n} of 100 served, {unsure} unplaced ({whole:?})"
        );
    }
}
