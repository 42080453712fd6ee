use super::*;
use crate::summary::{
    AlgorithmError, BadLine, DifferingRequest, Distribution, HistogramBucket, KeyCount, Speed,
    Suggestion, Timeline,
};

const HOSTILE: &str = "<script>alert('k')</script>\"><img src=x onerror=alert(1)>";

/// A rule with data in every part.
fn busy_rule(name: &str, buckets: usize) -> RuleSummary {
    let offered: Vec<u64> = (0..buckets).map(|i| 100 + (i as u64 * 37) % 250).collect();
    let admitted = offered.iter().map(|o| o * 4 / 5).collect();
    let algorithms = [
        ("sliding_window_log", 0, 0),
        ("fixed_window", 120, 3),
        ("sliding_window_counter", 2, 1),
        ("token_bucket", 40, 60),
    ]
    .into_iter()
    .map(|(a, wa, wd)| AlgorithmError {
        algorithm: a.into(),
        configured: format!("{a} {{ limit: 100, window: 1m }}"),
        wrongly_allowed: wa,
        wrongly_denied: wd,
        wrongly_allowed_pct: wa as f64 / 400.0,
        wrongly_denied_pct: wd as f64 / 400.0,
        wrong_pct: (wa + wd) as f64 / 400.0,
    })
    .collect();
    RuleSummary {
        rule: name.into(),
        mode: "hard".into(),
        limits: vec!["sliding_window_counter 100/1m".into()],
        applied: 40_000,
        admitted: 32_000,
        denied: 8_000,
        clients: 900,
        clients_limited: 12,
        clients_limited_share: 12.0 / 900.0,
        top_keys: vec![
            KeyCount {
                key: "u0".into(),
                requests: 9_000,
                denied: 6_000,
            },
            KeyCount {
                key: HOSTILE.into(),
                requests: 800,
                denied: 2,
            },
        ],
        timeline: Timeline {
            bucket_secs: 15.0,
            start_ns: 1_767_225_600_000_000_000,
            offered,
            admitted,
        },
        distribution: Distribution {
            window_secs: 60.0,
            limit: 100,
            buckets: [(1, 400), (2, 200), (5, 150), (10, 90), (20, 30), (50, 15)]
                .into_iter()
                .chain([(100, 5), (200, 4), (500, 2), (1000, 1)])
                .map(|(upto, keys)| HistogramBucket { upto, keys })
                .collect(),
        },
        accuracy: vec![Accuracy {
            limit_index: 0,
            limit: 100,
            window_secs: 60.0,
            reference: "sliding_window_log".into(),
            decisions: 40_000,
            algorithms,
        }],
        suggestions: vec![Suggestion {
            limit_index: 0,
            algorithm: "sliding_window_counter".into(),
            parameter: "limit".into(),
            current: 100,
            current_limited_share: 12.0 / 900.0,
            suggested: 180,
            suggested_limited_share: 0.009,
            target: 0.01,
            reaches_target: true,
        }],
        ..RuleSummary::default()
    }
}

/// A rule that applied to nothing.
fn idle_rule(name: &str) -> RuleSummary {
    RuleSummary {
        rule: name.into(),
        mode: "shadow".into(),
        limits: vec!["fixed_window 10/1s".into()],
        accuracy: vec![Accuracy {
            limit_index: 0,
            limit: 10,
            window_secs: 1.0,
            reference: "sliding_window_log".into(),
            ..Accuracy::default()
        }],
        ..RuleSummary::default()
    }
}

fn sample() -> Summary {
    Summary {
        requests: 40_000,
        malformed: 3,
        malformed_lines: vec![BadLine {
            file: "access.log".into(),
            line: 7,
            reason: HOSTILE.into(),
        }],
        out_of_order: 1,
        first_ns: 1_767_225_600_000_000_000,
        last_ns: 1_767_229_200_000_000_000,
        trace: "/tmp/trace.jsonl".into(),
        config: "/tmp/rules.yaml".into(),
        admitted: 32_000,
        denied: 8_000,
        rules: vec![busy_rule("per-user", 240), idle_rule(HOSTILE)],
        speed: Speed {
            seconds: 0.04,
            requests_per_second: 1e6,
        },
        ..Summary::default()
    }
}

fn compared() -> Summary {
    let mut s = sample();
    let mut other = busy_rule("per-user", 240);
    other.denied = 100;
    s.compare = Some(vec![
        FileSummary {
            config: s.config.clone(),
            requests: s.requests,
            malformed: s.malformed,
            admitted: s.admitted,
            denied: s.denied,
            rules: s.rules.clone(),
        },
        FileSummary {
            config: "/tmp/other.yaml".into(),
            requests: s.requests,
            malformed: s.malformed,
            admitted: 39_900,
            denied: 100,
            rules: vec![other, busy_rule("only-in-b", 3)],
        },
    ]);
    s.differing = Some(Differing {
        admitted_then_denied: 10,
        denied_then_admitted: 7_910,
        samples: vec![DifferingRequest {
            file: "access.log".into(),
            line: 12,
            ts_ns: 1_767_225_601_000_000_000,
            api: "GET /v1/search".into(),
            user: HOSTILE.into(),
            ip: "10.0.0.1".into(),
            first_admitted: false,
            denied_by: vec!["per-user".into()],
        }],
    });
    s
}

/// Each `<svg class="plot" ...>...</svg>` of the page.
fn plots(html: &str) -> Vec<&str> {
    html.split("<svg class=\"plot\"")
        .skip(1)
        .map(|rest| &rest[..rest.find("</svg>").unwrap()])
        .collect()
}

/// Every number in a coordinate-like attribute.
fn coordinates(html: &str) -> Vec<(String, f64)> {
    let mut found = Vec::new();
    for attr in [
        "x", "y", "x1", "x2", "y1", "y2", "width", "height", "points", "viewBox", "dy",
    ] {
        let needle = format!(" {attr}=\"");
        for (i, _) in html.match_indices(&needle) {
            let rest = &html[i + needle.len()..];
            let value = &rest[..rest.find('"').unwrap()];
            for n in value.split([' ', ',']).filter(|n| !n.is_empty()) {
                let v = n
                    .parse::<f64>()
                    .unwrap_or_else(|_| panic!("{attr}={value:?} is not numeric"));
                found.push((attr.to_string(), v));
            }
        }
    }
    found
}

#[test]
fn strings_from_the_data_come_out_inert() {
    for html in [render(&sample()), render(&compared())] {
        assert!(!html.contains("<script"), "a script element");
        assert!(!html.contains("<img"), "an image element");
        assert!(!html.contains("onerror=alert(1)>"));
        assert!(html.contains("&lt;script&gt;alert(&#39;k&#39;)&lt;/script&gt;&quot;&gt;"));
        // The page refuses scripts even if something slipped through.
        assert!(html.contains("default-src 'none'"));
    }
    let e = |s: &str| esc(s).to_string();
    assert_eq!(e("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&#39;f");
    assert_eq!(e("x\u{202e}y\u{0}z\u{7f}"), "x\u{fffd}y\u{fffd}z\u{fffd}");
    assert_eq!(e("tab\there"), "tab\there");
    let long = "k".repeat(1000);
    assert_eq!(esc_short(&long).to_string().chars().count(), MAX_TEXT + 1);
}

#[test]
fn every_kind_of_plot_is_drawn_with_marks() {
    let html = render(&sample());
    let plots = plots(&html);
    let kinds: Vec<&str> = plots
        .iter()
        .map(|p| {
            let rest = &p[p.find("data-plot=\"").unwrap() + 11..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect();
    assert_eq!(kinds, ["timeline", "distribution", "accuracy"]);
    for p in &plots {
        assert!(p.contains("<title>"), "{p:.200}");
        assert!(p.contains("class=\"mark"), "no data drawn: {p:.200}");
    }
    let timeline = plots[0];
    assert!(timeline.contains("<polyline class=\"mark offered\""));
    assert!(timeline.contains("<polygon class=\"mark denied\""));
    assert!(timeline.contains("requests / s"));
    let points = timeline.split("mark offered\" points=\"").nth(1).unwrap();
    let points = &points[..points.find('"').unwrap()];
    assert_eq!(points.split(' ').count(), 240);
    let dist = plots[1];
    assert_eq!(dist.matches("<rect class=\"mark bar").count(), 10);
    assert!(dist.contains(">limit 100</text>"));
    assert!(dist.contains("mark bar over"));
    let acc = plots[2];
    assert_eq!(acc.matches("class=\"mark value\"").count(), 4);
    assert!(acc.contains("(ref.)"));
    // Tables: numbers with thousands separators, the reference marked.
    assert!(html.contains("<td class=\"n\">40,000</td>"));
    assert!(html.contains("<tr class=\"ref\"><td>sliding_window_log"));
    assert!(html.contains("<h4>Suggestions</h4>"));
    assert!(html.contains("<b>180</b>"));
}

#[test]
fn a_rule_that_applied_to_nothing_says_so_instead_of_plotting() {
    let html = render(&sample());
    let idle = html.split("id=\"rule-1\"").nth(1).unwrap();
    let idle = &idle[..idle.find("</section>").unwrap()];
    assert!(!idle.contains("<svg"), "{idle}");
    assert_eq!(idle.matches(">no requests</p>").count(), 3, "{idle}");
    // A summary of nothing at all is a page too.
    let html = render(&Summary::default());
    assert!(plots(&html).is_empty());
    assert!(html.contains("no rules"));
    assert!(html.ends_with("</html>\n"));
}

#[test]
fn coordinates_stay_finite_on_degenerate_numbers() {
    let mut s = sample();
    let mut r = busy_rule("odd", 1);
    r.timeline.bucket_secs = f64::NAN;
    r.clients_limited_share = f64::INFINITY;
    r.distribution.window_secs = f64::NEG_INFINITY;
    r.distribution.limit = u64::MAX;
    r.distribution.buckets.reverse();
    r.distribution.buckets[0].upto = u64::MAX;
    for a in &mut r.accuracy[0].algorithms {
        a.wrong_pct = f64::NAN;
        a.wrongly_allowed_pct = f64::INFINITY;
    }
    let mut zero = busy_rule("zero-width", 3);
    zero.timeline.bucket_secs = 0.0;
    zero.timeline.admitted.truncate(1);
    zero.distribution.buckets = vec![HistogramBucket { upto: 0, keys: 5 }];
    zero.distribution.limit = 0;
    for a in &mut zero.accuracy[0].algorithms {
        *a = AlgorithmError {
            algorithm: a.algorithm.clone(),
            ..AlgorithmError::default()
        };
    }
    s.rules = vec![r, zero];
    s.speed.seconds = f64::NAN;
    s.last_ns = 0;
    let html = render(&s);
    assert_eq!(plots(&html).len(), 6);
    let coords = coordinates(&html);
    assert!(coords.len() > 500, "{}", coords.len());
    for (attr, v) in coords {
        assert!(v.is_finite() && v.abs() < 1e6, "{attr}={v}");
    }
    assert!(!html.contains("NaN") && !html.contains("inf"), "{html}");
}

#[test]
fn the_page_loads_nothing_and_runs_nothing() {
    for html in [render(&sample()), render(&compared())] {
        // The hostile strings are there, as text: take them out.
        let html = html.replace(&esc(HOSTILE).to_string(), "");
        let lower = html.to_ascii_lowercase();
        for banned in [
            "<script", "http://", "https://", "<link", "<iframe", "src=", "url(",
        ] {
            assert!(!lower.contains(banned), "{banned}");
        }
        assert!(html.contains("<style>"));
    }
}

#[test]
fn compare_puts_the_files_side_by_side() {
    let html = render(&compared());
    assert!(html.contains("A · rules.yaml") && html.contains("B · other.yaml"));
    assert!(html.contains("<div class=\"cols cols-2\">"));
    // A rule of one file only has its column marked.
    assert!(html.contains(">only-in-b</h2>"));
    assert!(html.contains("not in this file"));
    // The differing requests, counted and sampled.
    assert!(html.contains("<b>7,910</b>"));
    assert!(html.contains("id=\"differing\""));
    assert!(html.contains("GET /v1/search"));
    // Both files' plots: per-user twice, only-in-b once, the idle rule
    // (A only) none.
    assert_eq!(plots(&html).len(), 9);
}

#[test]
fn fifty_rules_of_240_buckets_stay_light() {
    let mut s = compared();
    let rules: Vec<_> = (0..50).map(|i| busy_rule(&format!("r{i}"), 240)).collect();
    if let Some(files) = &mut s.compare {
        for f in files.iter_mut() {
            f.rules = rules.clone();
        }
    }
    let html = render(&s);
    assert_eq!(plots(&html).len(), 300);
    assert!(html.len() < 3 << 20, "{} bytes", html.len());
}

#[test]
fn numbers_read_well() {
    assert_eq!(int(0), "0");
    assert_eq!(int(999), "999");
    assert_eq!(int(1_000), "1,000");
    assert_eq!(int(1_234_567), "1,234,567");
    assert_eq!(pct(0.0), "0%");
    assert_eq!(pct(0.003), "0.0030%");
    assert_eq!(pct(2.5), "2.50%");
    assert_eq!(pct(37.25), "37.2%");
    assert_eq!(pct(f64::NAN), "–");
    assert_eq!(share(0.01), "1.00%");
    assert_eq!(secs(0.25), "250ms");
    assert_eq!(secs(1.0), "1s");
    assert_eq!(secs(60.0), "1m");
    assert_eq!(secs(90.0), "1m30s");
    assert_eq!(secs(5400.0), "1h30m");
    assert_eq!(secs(86_400.0), "1d");
    assert_eq!(secs(f64::NAN), "0");
}
