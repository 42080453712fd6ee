//! `spillway simulate` against `spillway serve`: one trace drives both,
//! and every decision must be the same. `serve` runs under libfaketime
//! with its clock frozen at each request's timestamp (read from a file
//! the test rewrites), so both decide every request at the same instant;
//! the test never depends on how fast the machine is.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::util::{Server, TempDir, spillway};

const RULES: &str = r#"
descriptors: [tenant]
rules:
  - name: login
    api: POST /v1/login
    by: ip
    limits:
      - sliding_window_log: { limit: 3, window: 5s }
  - name: search
    api: GET /v1/search
    by: user
    limits:
      - sliding_window_counter: { limit: 8, window: 4s }
      - fixed_window: { limit: 20, window: 15s }
  - name: uploads
    api: POST /v1/upload
    by: user+ip
    mode: soft 100%
    limits:
      - token_bucket: { capacity: 2, refill: 1/2s }
      - leaky_bucket: { capacity: 3, leak: 1/s }
  - name: keyed
    by: header:X-Api-Key
    mode: shadow
    limits:
      - gcra: { rate: 5/1s, burst: 3 }
  - name: tenants
    by: tenant
    limits:
      - fixed_window: { limit: 30, window: 10s }
  - name: everyone
    by: user
    limits:
      - gcra: { rate: 10/1s, burst: 6 }
"#;

/// 2026-01-01T00:00:00Z.
const EPOCH: u64 = 1_767_225_600;

/// libfaketime's multi-threaded preload library, or a failure saying how
/// to install it.
fn libfaketime() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime is not installed (looked for {candidates:?}): run scripts/setup.sh (Debian package faketime)"
            )
        })
}

/// A small deterministic generator, so the trace is the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One request of the trace.
struct Req {
    /// Eighths of a second after `EPOCH` (binary fractions: libfaketime
    /// reads them exactly).
    eighths: u64,
    method: &'static str,
    path: String,
    user: Option<String>,
    ip: String,
    key: Option<String>,
    tenant: Option<String>,
    cost: u64,
}

fn trace() -> Vec<Req> {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut out = Vec::new();
    let mut eighths = 0;
    let apis: [(&str, &str); 7] = [
        ("POST", "/v1/login"),
        ("GET", "/v1/search"),
        ("GET", "/v1/search/"),
        ("POST", "/v1/upload"),
        ("POST", "/v1/upload/"),
        ("GET", "/v1/items?page=2"),
        ("HEAD", "/v1/search"),
    ];
    for _ in 0..900 {
        // Bursts: mostly the same instant or the next eighth, sometimes a gap.
        eighths += match rng.below(10) {
            0..=4 => 0,
            5..=7 => 1,
            8 => 3,
            _ => 9,
        };
        let (method, path) = apis[rng.below(apis.len() as u64) as usize];
        let u = rng.below(6);
        out.push(Req {
            eighths,
            method,
            path: path.to_string(),
            user: (u < 5).then(|| format!("user{u}")),
            ip: format!("10.0.0.{}", rng.below(4)),
            key: (rng.below(3) > 0).then(|| format!("key{}", rng.below(3))),
            tenant: (rng.below(4) > 0).then(|| format!("t{}", rng.below(2))),
            // Now and then a cost above what `login` (3) and `keyed`
            // (burst 3) can ever admit: refused before any store is asked.
            cost: match rng.below(16) {
                0 | 1 => 2,
                2 => 4,
                _ => 1,
            },
        });
    }
    out
}

fn ts_text(eighths: u64) -> String {
    let secs = EPOCH + eighths / 8;
    let frac = (eighths % 8) * 125;
    format!("{secs}.{frac:03}")
}

/// The fake time as libfaketime's timestamp file wants it (UTC).
fn faketime_text(eighths: u64) -> String {
    let s = eighths / 8;
    format!(
        "2026-01-01 {:02}:{:02}:{:02}.{:03}\n",
        s / 3600,
        s / 60 % 60,
        s % 60,
        (eighths % 8) * 125
    )
}

fn set_time(file: &Path, eighths: u64) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, faketime_text(eighths)).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// Each rule's outcome, limit, remaining and retry-after, as both sides
/// write them.
fn rules_of(v: &Value) -> Vec<(String, String, u64, u64, u64)> {
    v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["rule"].as_str().unwrap().to_string(),
                r["outcome"].as_str().unwrap().to_string(),
                r["limit"].as_u64().unwrap(),
                r["remaining"].as_u64().unwrap(),
                r["retry_after_ms"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_decides_every_request_as_serve_does() {
    let tmp = TempDir::new("simulate-serve");
    let dir = tmp.0.clone();
    let rules = tmp.write("rules.yaml", RULES);
    let reqs = trace();
    let trace_path = dir.join("trace.jsonl");
    {
        let mut f = std::fs::File::create(&trace_path).unwrap();
        for r in &reqs {
            let mut line = json!({
                "ts": ts_text(r.eighths).parse::<f64>().unwrap(),
                "ip": r.ip,
                "method": r.method,
                "path": r.path,
                "status": 200,
                "cost": r.cost,
            });
            if let Some(u) = &r.user {
                line["user"] = json!(u);
            }
            if let Some(k) = &r.key {
                line["headers"] = json!({ "X-Api-Key": k });
            }
            if let Some(t) = &r.tenant {
                line["tenant"] = json!(t);
            }
            // The timestamp as text, so no float formatting rounds it.
            let text = line.to_string().replacen(
                &format!("\"ts\":{}", line["ts"]),
                &format!("\"ts\":{}", ts_text(r.eighths)),
                1,
            );
            writeln!(f, "{text}").unwrap();
        }
    }

    // The replay.
    let decisions_path = dir.join("decisions.jsonl");
    let out = spillway(&[
        "simulate",
        "--quiet",
        "--config",
        rules.to_str().unwrap(),
        "--trace",
        trace_path.to_str().unwrap(),
        "--decisions",
        decisions_path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "simulate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let simulated: Vec<Value> = std::fs::read_to_string(&decisions_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(simulated.len(), reqs.len(), "one decision per request");

    // The service, its clock frozen at each request's time.
    let time_file = dir.join("faketime");
    set_time(&time_file, 0);
    let preload = libfaketime();
    let env_args = [
        "env".to_string(),
        format!("LD_PRELOAD={}", preload.display()),
        format!("FAKETIME_TIMESTAMP_FILE={}", time_file.display()),
        "FAKETIME_NO_CACHE=1".to_string(),
        // The memory store's clock is monotonic: fake it too.
        "FAKETIME_DONT_FAKE_MONOTONIC=0".to_string(),
        "TZ=UTC".to_string(),
    ];
    let wrapper: Vec<&str> = env_args.iter().map(String::as_str).collect();
    let server = Server::start_wrapped(&wrapper, "serve", &["--config", rules.to_str().unwrap()]);
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let mut at = u64::MAX;
    let mut denied = 0;
    let mut outcomes = std::collections::BTreeSet::new();
    for (i, (r, sim)) in reqs.iter().zip(&simulated).enumerate() {
        if r.eighths != at {
            at = r.eighths;
            set_time(&time_file, at);
        }
        let mut body = json!({
            "api": format!("{} {}", r.method, r.path),
            "ip": r.ip,
            "cost": r.cost,
        });
        if let Some(u) = &r.user {
            body["user"] = json!(u);
        }
        if let Some(k) = &r.key {
            body["headers"] = json!({ "X-Api-Key": k });
        }
        if let Some(t) = &r.tenant {
            body["descriptors"] = json!({ "tenant": t });
        }
        let resp = client
            .post(server.url("/v1/check"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let served: Value = resp.json().await.unwrap();
        assert_eq!(
            served["allowed"],
            sim["allowed"],
            "request {i} ({body}) at {}: serve said {served}, simulate said {sim}",
            ts_text(r.eighths)
        );
        assert_eq!(
            rules_of(&served),
            rules_of(sim),
            "request {i} ({body}) at {}: per-rule decisions differ",
            ts_text(r.eighths)
        );
        if served["allowed"] == json!(false) {
            denied += 1;
        }
        for (_, o, ..) in rules_of(&served) {
            outcomes.insert(o);
        }
    }
    // The trace is only a test if it makes the rules decide every way.
    assert!(denied > 50, "only {denied} of {} denied", reqs.len());
    for o in ["allowed", "denied", "shadow_denied", "soft_exceeded"] {
        assert!(outcomes.contains(o), "no request was {o}: {outcomes:?}");
    }
}
