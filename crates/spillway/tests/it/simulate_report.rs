//! The `spillway simulate` report in a real browser: a synthetic trace,
//! two rules files replayed with `--report` and `--compare`, the page
//! opened from disk in headless Chromium (no server: it must stand on its
//! own), its plots measured as drawn, and a screenshot kept in
//! `target/test-artefacts/simulate-report.png`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/setup.sh).

use std::path::{Path, PathBuf};

use serde_json::Value;
use spillway_testkit::browser::Browser;

use crate::util::{TempDir, spillway};

/// One rule per kind of key and algorithm family. Each user has its own
/// address, and a request denied by one rule is charged to none: the
/// heaviest users meet the per-user window, the per-ip bucket catches the
/// bursts that window lets through, and the search route goes over its
/// window at the busy time of the trace's day.
const RULES: &str = "\
rules:
  - name: per-user
    by: user
    limits:
      - sliding_window_counter: { limit: 120, window: 1m }
  - name: per-ip
    by: ip
    limits:
      - token_bucket: { capacity: 30, refill: 240/1m }
  - name: search
    api: GET /v1/search
    by: route
    limits:
      - fixed_window: { limit: 600, window: 1m }
";

/// The same rules, looser and with other algorithms: what `--compare`
/// sets beside them.
const LOOSER: &str = "\
rules:
  - name: per-user
    by: user
    limits:
      - sliding_window_log: { limit: 300, window: 1m }
  - name: per-ip
    by: ip
    limits:
      - gcra: { rate: 120/1m, burst: 60 }
  - name: search
    api: GET /v1/search
    by: route
    limits:
      - fixed_window: { limit: 900, window: 1m }
";

/// Runs the binary and fails with what it printed unless it succeeds.
fn run_ok(args: &[&str]) -> std::process::Output {
    let out = spillway(args);
    assert!(
        out.status.success(),
        "spillway {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn artefact_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("test-artefacts")
}

/// A JSON value cut to a readable length for a failure message.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(400) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

/// The `--json` contract: counts add up, one object per file compared.
fn check_summary(file: &Path) {
    let text = std::fs::read_to_string(file).expect("the --json summary");
    let j: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(j["requests"], 20_000, "{}", short(&j));
    assert_eq!(j["malformed"], 0, "{}", short(&j));
    let files = j["compare"].as_array().expect("a compare array");
    assert_eq!(files.len(), 2);
    for f in files.iter().chain([&j]) {
        let rules = f["rules"].as_array().expect("rules");
        let names: Vec<&str> = rules.iter().filter_map(|r| r["rule"].as_str()).collect();
        assert_eq!(names, ["per-user", "per-ip", "search"]);
        for r in rules {
            let n = |k: &str| {
                r[k].as_u64()
                    .unwrap_or_else(|| panic!("{k} in {}", short(r)))
            };
            assert_eq!(n("admitted") + n("denied"), n("applied"), "{}", short(r));
            assert!(n("applied") > 0, "{}", short(r));
            assert!(n("clients") > 0, "{}", short(r));
        }
    }
    // Every rule of the tight file denies some.
    for r in j["rules"].as_array().into_iter().flatten() {
        assert!(r["denied"].as_u64().unwrap_or(0) > 0, "{}", short(r));
    }
}

#[test]
fn simulate_report_draws_every_plot_in_chromium() {
    let dir = TempDir::new("simulate-report");
    let trace = dir.0.join("trace.jsonl");
    let rules = dir.write("rules.yaml", RULES);
    let looser = dir.write("looser.yaml", LOOSER);
    let report = dir.0.join("report.html");
    let summary = dir.0.join("summary.json");

    run_ok(&[
        "simulate",
        "--synthesize",
        "heavy-tail",
        "--clients",
        "200",
        "--requests",
        "20000",
        "--duration",
        "10m",
        "--seed",
        "7",
        "--out",
        path(&trace),
    ]);
    let lines = std::fs::read_to_string(&trace).expect("the synthetic trace");
    assert_eq!(lines.lines().count(), 20_000);

    run_ok(&[
        "simulate",
        "--config",
        path(&rules),
        "--trace",
        path(&trace),
        "--compare",
        path(&looser),
        "--target-limited",
        "1%",
        "--report",
        path(&report),
        "--json",
        path(&summary),
    ]);
    check_summary(&summary);

    let html = std::fs::read_to_string(&report).expect("the report");
    assert!(html.starts_with("<!DOCTYPE html>"), "{html:.200}");
    assert!(!html.contains("<script"), "the report has a script");
    assert!(html.len() < 2 << 20, "the report is {} bytes", html.len());

    let b = Browser::start();
    b.set_viewport(1400, 1000).expect("a 1400x1000 viewport");
    b.navigate(&format!("file://{}", path(&report)))
        .expect("open the report from disk");

    assert_eq!(
        b.execute("return document.scripts.length", &[]).unwrap(),
        0,
        "scripts in the page"
    );
    let loaded = b
        .execute(
            "return performance.getEntriesByType('resource').map(e => e.name)",
            &[],
        )
        .unwrap();
    assert_eq!(loaded, Value::Array(vec![]), "the page loaded something");
    let text = b.execute("return document.body.innerText", &[]).unwrap();
    let text = text.as_str().unwrap_or_default();
    for needle in ["per-user", "per-ip", "search", "looser.yaml", "20,000"] {
        assert!(text.contains(needle), "{needle:?} not on the page");
    }

    // Every plot: its size on the page, and how many of its elements
    // (the data marks, and everything else) have a non-empty box.
    let plots = b
        .execute(
            "return Array.from(document.querySelectorAll('svg.plot')).map(s => {\
               const box = e => { const b = e.getBBox(); return b.width > 0 || b.height > 0; };\
               const all = Array.from(s.querySelectorAll('*')).filter(e => e.getBBox);\
               const r = s.getBoundingClientRect();\
               return { kind: s.getAttribute('data-plot'), width: r.width, height: r.height,\
                        drawn: all.filter(box).length,\
                        marks: Array.from(s.querySelectorAll('.mark')).filter(box).length,\
                        title: s.querySelector('title') ? s.querySelector('title').textContent : '' };\
             })",
            &[],
        )
        .expect("measure the plots");
    let plots = plots.as_array().expect("a list of plots");
    let count = |kind: &str| plots.iter().filter(|p| p["kind"] == kind).count();
    // Three rules in each of two files, each applied to requests.
    assert_eq!(count("timeline"), 6, "{plots:#?}");
    assert_eq!(count("distribution"), 6, "{plots:#?}");
    assert!(count("accuracy") >= 2, "{plots:#?}");
    for p in plots {
        let num = |k: &str| p[k].as_f64().unwrap_or(0.0);
        assert!(
            num("width") > 200.0 && num("height") > 80.0,
            "too small: {p}"
        );
        assert!(num("drawn") > 0.0, "nothing drawn: {p}");
        assert!(num("marks") > 0.0, "no data drawn: {p}");
        assert!(!p["title"].as_str().unwrap_or_default().is_empty(), "{p}");
    }
    // The tight file denies the heavy users: a denied band on a timeline,
    // and the limit drawn on each distribution.
    let denied = b
        .execute(
            "return document.querySelectorAll('svg[data-plot=timeline] .mark.denied').length",
            &[],
        )
        .unwrap();
    assert!(denied.as_u64().unwrap_or(0) > 0, "no denials drawn");
    let limits = b
        .execute(
            "return document.querySelectorAll('svg[data-plot=distribution] .mark.limit').length",
            &[],
        )
        .unwrap();
    assert_eq!(limits, 6);

    // The whole page in one picture, as tall as its content.
    let height = b
        .execute("return document.documentElement.scrollHeight", &[])
        .unwrap();
    let height = height.as_u64().unwrap_or(1000).clamp(1000, 8000);
    b.set_viewport(1400, u32::try_from(height).unwrap_or(8000))
        .unwrap();
    b.execute("window.scrollTo(0, 0)", &[]).unwrap();
    let png = b.screenshot().expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 20_000, "a {}-byte screenshot", png.len());
    let be32 = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    assert_eq!(&png[12..16], b"IHDR");
    assert_eq!(be32(16), 1400, "the screenshot's width");
    assert!(be32(20) >= 1000, "the screenshot's height");
    std::fs::write(dir.0.join("report.png"), &png).expect("write the screenshot");
    let keep = artefact_dir();
    std::fs::create_dir_all(&keep).expect("create target/test-artefacts");
    let kept = keep.join("simulate-report.png");
    std::fs::write(&kept, &png).expect("write the screenshot");
    println!("screenshot: {}", kept.display());
}
