use super::*;
use crate::summary::RuleSummary;

/// A file under the system's temp directory, removed on drop.
struct Temp(PathBuf);

impl Temp {
    fn new(name: &str, text: &str) -> Temp {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!(
            "spillway-simulate-unit-{}-{n}-{name}",
            std::process::id()
        ));
        std::fs::write(&p, text).unwrap();
        Temp(p)
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// 2026-01-01T00:00:00Z: a boundary of every window used here.
const T0: f64 = 1_767_225_600.0;

fn run(rules: &str, trace: &str, compare: Option<&str>, target: Option<f64>) -> Summary {
    let trace = Temp::new("trace.jsonl", trace);
    simulate(&SimulateOptions {
        config: RulesFile::parse("rules.yaml", rules).unwrap(),
        traces: vec![trace.0.clone()],
        compare: compare.map(|c| RulesFile::parse("other.yaml", c).unwrap()),
        report: None,
        json: None,
        decisions: None,
        trace: TraceOptions::default(),
        replay: ReplayOptions {
            top: 5,
            target_limited: target,
            accuracy: true,
        },
        progress: false,
    })
    .unwrap()
}

fn line(t: f64, user: &str) -> String {
    format!("{{\"ts\": {t:.3}, \"user\": \"{user}\", \"method\": \"GET\", \"path\": \"/v1/a\"}}\n")
}

fn rule<'a>(s: &'a [RuleSummary], name: &str) -> &'a RuleSummary {
    s.iter().find(|r| r.rule == name).unwrap()
}

/// A client spends the limit just before each boundary of a fixed
/// window and again just after: the fixed window admits twice the
/// limit, the exact log half of it, and the comparison counts every
/// request of the overshoot; the log never disagrees with itself.
#[test]
fn the_fixed_windows_overshoot_at_a_boundary_is_counted() {
    let rules = "rules:\n  - name: edge\n    by: user\n    limits:\n      - fixed_window: { limit: 5, window: 10s }\n";
    let mut trace = String::new();
    for k in 1..=6 {
        let boundary = T0 + 30.0 * f64::from(k);
        for i in 0..5 {
            trace.push_str(&line(boundary - 0.1 + 0.01 * f64::from(i), "u"));
        }
        for i in 0..5 {
            trace.push_str(&line(boundary + 0.01 * f64::from(i), "u"));
        }
    }
    let s = run(rules, &trace, None, Some(0.0));
    assert_eq!(s.requests, 60);
    let r = rule(&s.rules, "edge");
    assert_eq!((r.applied, r.admitted, r.denied), (60, 60, 0));
    let acc = &r.accuracy[0];
    assert_eq!((acc.limit, acc.window_secs, acc.decisions), (5, 10.0, 60));
    let of = |name: &str| acc.algorithms.iter().find(|a| a.algorithm == name).unwrap();
    let log = of("sliding_window_log");
    assert_eq!((log.wrongly_allowed, log.wrongly_denied), (0, 0));
    let fixed = of("fixed_window");
    assert_eq!((fixed.wrongly_allowed, fixed.wrongly_denied), (30, 0));
    assert!((fixed.wrongly_allowed_pct - 50.0).abs() < 1e-9);
    // The fixed window needed 5 per window; the log would need 10.
    let g = &r.suggestions[0];
    assert_eq!((g.current, g.suggested), (5, 5));
    assert_eq!(g.current_limited_share, 0.0);
}

/// The JSON contract: `admitted + denied == applied` per rule, the
/// limited clients are the keys denied at least once, and with
/// `--compare` one object per file and the differing requests.
#[test]
fn counts_add_up_and_compare_counts_the_differing_requests() {
    let tight = "rules:\n  - name: r\n    by: user\n    limits:\n      - sliding_window_log: { limit: 2, window: 1m }\n";
    let loose = "rules:\n  - name: r\n    by: user\n    limits:\n      - sliding_window_log: { limit: 3, window: 1m }\n";
    let mut trace = String::new();
    // a: 4 requests (tight denies 2, loose 1); b: 1 request; a line
    // without a timestamp is malformed.
    for i in 0..4 {
        trace.push_str(&line(T0 + f64::from(i), "a"));
    }
    trace.push_str(&line(T0 + 5.0, "b"));
    trace.push_str("{\"user\": \"c\"}\n");
    let s = run(tight, &trace, Some(loose), Some(0.5));
    assert_eq!((s.requests, s.malformed), (5, 1));
    assert_eq!(s.malformed_lines[0].line, 6);
    let r = rule(&s.rules, "r");
    assert_eq!((r.applied, r.admitted, r.denied), (5, 3, 2));
    assert_eq!((r.clients, r.clients_limited), (2, 1));
    assert_eq!(r.top_keys[0].key, "a");
    assert_eq!((r.top_keys[0].requests, r.top_keys[0].denied), (4, 2));
    let files = s.compare.as_ref().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!((files[1].admitted, files[1].denied), (4, 1));
    let d = s.differing.as_ref().unwrap();
    assert_eq!((d.admitted_then_denied, d.denied_then_admitted), (0, 1));
    assert_eq!(d.samples[0].line, 3);
    assert_eq!(d.samples[0].denied_by, vec!["r".to_string()]);
    // Half the clients may be limited: a needed 4, b needed 1.
    let g = &r.suggestions[0];
    assert_eq!((g.suggested, g.suggested_limited_share), (1, 0.5));
    let json = serde_json::to_value(&s).unwrap();
    for k in ["requests", "malformed", "rules", "compare"] {
        assert!(json.get(k).is_some(), "{k} missing");
    }
    for k in [
        "rule",
        "applied",
        "admitted",
        "denied",
        "clients",
        "clients_limited",
    ] {
        assert!(json["rules"][0].get(k).is_some(), "{k} missing");
        assert!(
            json["compare"][1]["rules"][0].get(k).is_some(),
            "{k} missing"
        );
    }
}

/// A rule whose cost comes from the answer: the trace's `cost` is
/// charged after an admitted request, so a key that spent its budget
/// owes and is refused until it is paid back.
#[test]
fn answer_costs_are_charged_from_the_trace() {
    let rules = "rules:\n  - name: tokens\n    by: user\n    cost: { response_header: X-Tokens }\n    limits:\n      - fixed_window: { limit: 100, window: 1m }\n";
    let mut trace = String::new();
    for (i, cost) in [60, 60, 1, 1].into_iter().enumerate() {
        trace.push_str(&format!(
            "{{\"ts\": {:.3}, \"user\": \"u\", \"cost\": {cost}}}\n",
            T0 + 1.0 + i as f64
        ));
    }
    let s = run(rules, &trace, None, None);
    let r = rule(&s.rules, "tokens");
    // 60 + 60 = 120 charged by the second answer: the key owes, and the
    // next two checks are refused.
    assert_eq!((r.applied, r.admitted, r.denied), (4, 2, 2));
}

#[test]
fn a_share_is_a_percentage() {
    assert_eq!(parse_share("1%"), Ok(0.01));
    assert_eq!(parse_share("0.5"), Ok(0.005));
    assert!(parse_share("101%").is_err());
    assert!(parse_share("-1%").is_err());
    assert!(parse_share("one").is_err());
}
