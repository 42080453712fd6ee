use super::*;

fn run(opts: &SynthOptions) -> Vec<u8> {
    let mut out = Vec::new();
    let n = synthesize(opts, &mut out).unwrap();
    assert_eq!(n, opts.requests);
    out
}

fn small(shape: Shape) -> SynthOptions {
    SynthOptions {
        shape,
        clients: 300,
        requests: 20_000,
        duration_ns: 600_000_000_000,
        ..SynthOptions::default()
    }
}

/// The `ts` of each line, µs since the epoch.
fn times(out: &[u8]) -> Vec<u64> {
    std::str::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let ts = v["ts"].as_f64().unwrap();
            // Parsing the text keeps every microsecond.
            let text = l
                .split("\"ts\":")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            let (s, f) = text.split_once('.').unwrap();
            let us = s.parse::<u64>().unwrap() * 1_000_000 + f.parse::<u64>().unwrap();
            assert!((us as f64 / 1e6 - ts).abs() < 1e-3);
            us
        })
        .collect()
}

#[test]
fn same_options_same_bytes_and_seeds_differ() {
    for shape in Shape::ALL {
        let opts = small(shape);
        let a = run(&opts);
        assert_eq!(a, run(&opts), "{shape}");
        let other = run(&SynthOptions { seed: 2, ..opts });
        assert_ne!(a, other, "{shape}");
    }
}

#[test]
fn exact_count_sorted_and_within_the_span() {
    for shape in Shape::ALL {
        for (clients, requests) in [(1, 1), (1, 500), (5_000, 3), (300, 20_000), (7, 0)] {
            let opts = SynthOptions {
                clients,
                requests,
                ..small(shape)
            };
            let out = run(&opts);
            let ts = times(&out);
            assert_eq!(ts.len() as u64, requests, "{shape} {clients}");
            assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{shape} {clients}");
            let start = opts.start_ns / 1000;
            let end = (opts.start_ns + opts.duration_ns) / 1000;
            assert!(ts.iter().all(|&t| start <= t && t <= end), "{shape}");
        }
    }
}

#[test]
fn lines_are_json_with_every_field() {
    let out = run(&small(Shape::HeavyTail));
    let mut users = std::collections::HashMap::new();
    for l in std::str::from_utf8(&out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let user = v["user"].as_str().unwrap().to_string();
        let ip = v["ip"].as_str().unwrap().to_string();
        assert!(ip.starts_with("10.") && ip.split('.').count() == 4, "{ip}");
        assert!(["GET", "POST"].contains(&v["method"].as_str().unwrap()));
        assert!(v["path"].as_str().unwrap().starts_with("/v1/"));
        assert!(v["status"].as_u64().unwrap() >= 200);
        // A client keeps its address.
        assert_eq!(users.entry(user).or_insert_with(|| ip.clone()), &ip);
    }
    // Unique addresses: as many as users.
    let ips: std::collections::HashSet<_> = users.values().collect();
    assert_eq!(ips.len(), users.len());
}

#[test]
fn heavy_tail_concentrates_on_few_clients() {
    let opts = SynthOptions {
        clients: 10_000,
        requests: 200_000,
        zipf_exponent: 1.1,
        ..small(Shape::HeavyTail)
    };
    let out = run(&opts);
    let mut per_user = std::collections::HashMap::<String, u64>::new();
    for l in std::str::from_utf8(&out).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        *per_user
            .entry(v["user"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    let mut counts: Vec<u64> = per_user.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    let top: u64 = counts.iter().take(100).sum();
    let share = top as f64 / 200_000.0;
    assert!(share > 0.2, "top 1% hold {share}");
    // And uniform does not.
    let out = run(&SynthOptions {
        shape: Shape::Uniform,
        ..opts
    });
    let text = std::str::from_utf8(&out).unwrap();
    let u0 = text
        .lines()
        .filter(|l| l.contains("\"user\":\"u0\""))
        .count();
    assert!(u0 < 100, "u0 has {u0} of a uniform trace");
}

#[test]
fn bursty_clients_come_in_bursts() {
    // The median gap between a client's consecutive requests is far
    // below its average gap when it is bursty, near it when it is not.
    let median_ratio = |shape| {
        let opts = SynthOptions {
            clients: 20,
            requests: 20_000,
            ..small(shape)
        };
        let out = run(&opts);
        let mut last = std::collections::HashMap::<String, u64>::new();
        let mut gaps = Vec::new();
        for l in std::str::from_utf8(&out).unwrap().lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let us = (v["ts"].as_f64().unwrap() * 1e6) as u64;
            if let Some(prev) = last.insert(v["user"].as_str().unwrap().into(), us) {
                gaps.push(us - prev);
            }
        }
        gaps.sort_unstable();
        let avg = 600e6 / 1000.0;
        gaps[gaps.len() / 2] as f64 / avg
    };
    let bursty = median_ratio(Shape::Bursty);
    let uniform = median_ratio(Shape::Uniform);
    assert!(bursty < 0.2, "bursty median gap {bursty} of the average");
    assert!(uniform > 0.4, "uniform median gap {uniform} of the average");
}

#[test]
fn diurnal_swings_over_the_day() {
    // A compressed day: the middle tenth is busier than the first.
    let opts = small(Shape::Diurnal);
    let ts = times(&run(&opts));
    let start = opts.start_ns / 1000;
    let tenth = opts.duration_ns / 1000 / 10;
    let count = |k: u64| ts.iter().filter(|&&t| (t - start) / tenth == k).count();
    assert!(count(5) > 2 * count(0), "{} vs {}", count(5), count(0));
    // A real day of wall clock: 15:00 busier than 03:00.
    let opts = SynthOptions {
        duration_ns: DAY_NS,
        ..small(Shape::Diurnal)
    };
    let ts = times(&run(&opts));
    let hour = |h: u64| {
        ts.iter()
            .filter(|&&t| (t - start) / 3_600_000_000 == h)
            .count()
    };
    assert!(hour(15) > 2 * hour(3), "{} vs {}", hour(15), hour(3));
}

#[test]
fn validate_names_the_bad_value() {
    let ok = SynthOptions::default();
    assert_eq!(validate(&ok), Ok(()));
    let bad = [
        (
            SynthOptions {
                clients: 0,
                ..ok.clone()
            },
            "--clients",
        ),
        (
            SynthOptions {
                clients: MAX_CLIENTS + 1,
                ..ok.clone()
            },
            "--clients",
        ),
        (
            SynthOptions {
                requests: MAX_REQUESTS + 1,
                ..ok.clone()
            },
            "--requests",
        ),
        (
            SynthOptions {
                duration_ns: 0,
                ..ok.clone()
            },
            "--duration",
        ),
        (
            SynthOptions {
                start_ns: u64::MAX,
                ..ok.clone()
            },
            "64-bit",
        ),
        (
            SynthOptions {
                zipf_exponent: f64::NAN,
                ..ok.clone()
            },
            "Zipf",
        ),
        (
            SynthOptions {
                zipf_exponent: 0.0,
                ..ok.clone()
            },
            "Zipf",
        ),
    ];
    for (opts, needle) in bad {
        let err = validate(&opts).unwrap_err();
        assert!(err.contains(needle), "{err}");
        let mut out = Vec::new();
        let err = synthesize(&opts, &mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(out.is_empty());
    }
}

#[test]
fn shapes_parse_and_print() {
    for shape in Shape::ALL {
        assert_eq!(shape.to_string().parse::<Shape>(), Ok(shape));
    }
    let err = "zipf".parse::<Shape>().unwrap_err();
    assert!(err.contains("heavy-tail"), "{err}");
}

#[test]
fn a_tiny_duration_still_counts_and_sorts() {
    let opts = SynthOptions {
        duration_ns: 1,
        start_ns: 1_500,
        ..small(Shape::HeavyTail)
    };
    let ts = times(&run(&opts));
    assert_eq!(ts.len(), 20_000);
    assert!(ts.iter().all(|&t| t == 1));
}
