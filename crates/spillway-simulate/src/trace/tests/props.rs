//! Property tests: no input panics or fails a reader; well-formed lines of
//! every format read back as what was written; timestamps round-trip.

use proptest::prelude::*;

use super::time::{civil_from_days, parse_clf_date, parse_epoch, parse_rfc3339};
use super::*;

/// Bytes that mean something to one of the parsers, mixed with any byte.
fn noisy_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        any::<u8>().prop_map(|b| vec![b]),
        prop::sample::select(vec![
            &b"{"[..],
            b"}",
            b"[",
            b"]",
            b"\"",
            b",",
            b":",
            b"\\",
            b"\\u",
            b"\\x",
            b"\n",
            b"\r\n",
            b" ",
            b"-",
            b"0",
            b"9",
            b"e",
            b".",
            b"\"ts\":",
            b"\"headers\":{",
            b"1795597200",
            b"[25/Nov/2026:10:00:00 +0100]",
            b"\"GET / HTTP/1.1\"",
            b"2026-11-25T10:00:00Z",
            b"\xef\xbb\xbf",
            b"\xc3",
            b"\0",
        ])
        .prop_map(<[u8]>::to_vec),
    ];
    prop::collection::vec(token, 0..200).prop_map(|v| v.concat())
}

/// Reads `bytes` whole; a reader may only fail on a CSV header.
fn read_any(bytes: &[u8], format: Option<Format>) -> Result<(), TestCaseError> {
    match read_all(bytes, &opts(format, &[])) {
        Ok(out) => {
            let lines = bytes.iter().filter(|&&c| c == b'\n').count() as u64 + 1;
            prop_assert!(out.recs.len() as u64 + out.malformed <= lines);
            prop_assert!(out.bad.len() as u64 <= out.malformed);
            for r in &out.recs {
                prop_assert!(r.line >= 1 && r.line <= lines);
            }
        }
        Err(e) if e.kind() == TraceErrorKind::Header => {}
        Err(e) => prop_assert!(false, "{e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_never_panic_nor_fail(bytes in noisy_bytes()) {
        // Not gzip: a stream that starts with gzip's magic may fail.
        prop_assume!(!bytes.starts_with(&[0x1f, 0x8b]));
        for format in [None, Some(Format::Combined), Some(Format::Json), Some(Format::Csv)] {
            read_any(&bytes, format)?;
        }
        // The same under a CSV header, so the rows are parsed.
        let mut csv = b"ts,a,b\n".to_vec();
        csv.extend_from_slice(&bytes);
        read_any(&csv, Some(Format::Csv))?;
    }

    #[test]
    fn gzip_of_anything_never_panics(bytes in noisy_bytes(), cut in any::<prop::sample::Index>()) {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&bytes).unwrap();
        let gz = enc.finish().unwrap();
        let plain = read_all(&bytes, &TraceOptions::default());
        let unzipped = read_all(&gz, &TraceOptions::default());
        match (plain, unzipped) {
            (Ok(a), Ok(b)) => prop_assert_eq!((a.recs, a.malformed), (b.recs, b.malformed)),
            (Err(a), Err(b)) => prop_assert_eq!(a.kind(), b.kind()),
            (a, b) => prop_assert!(false, "{a:?} vs {b:?}"),
        }
        let at = cut.index(gz.len());
        let _ = read_all(&gz[..at], &TraceOptions::default());
    }

    #[test]
    fn any_line_never_panics(line in "\\PC{0,120}") {
        let mut rec = Record::default();
        let _ = combined::Combined::default().parse(&line, &mut rec);
        let _ = json::Json::new(&FieldNames::default(), None).parse(&line, &mut rec);
        let mut csv = csv::Csv::new("ts,ip,headers,x", &FieldNames::default(), None).unwrap();
        let _ = csv.parse(&line, &mut rec);
        let _ = time::parse_ts_text(&line, None);
        let _ = parse_clf_date(&line);
    }
}

/// A request as a generator writes it.
#[derive(Debug, Clone)]
struct Spec {
    ts_ns: u64,
    ip: String,
    user: String,
    method: String,
    path: String,
    status: u16,
    cost: u64,
    headers: Vec<(String, String)>,
    fields: Vec<(String, String)>,
}

impl Spec {
    /// The record a reader must make of it.
    fn record(&self, line: u64) -> Record {
        let mut r = Record {
            line,
            ts_ns: self.ts_ns,
            method: self.method.clone(),
            path: self.path.clone(),
            ip: self.ip.clone(),
            user: self.user.clone(),
            status: self.status,
            cost: self.cost,
            ..Record::default()
        };
        for (k, v) in &self.headers {
            r.add_header(k, v);
        }
        for (k, v) in &self.fields {
            r.add_field(k, v);
        }
        r
    }
}

fn ip() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        any::<[u8; 4]>().prop_map(|b| format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3])),
        any::<[u16; 3]>().prop_map(|h| format!("2001:db8:{:x}::{:x}:{:x}", h[0], h[1], h[2])),
    ]
}

/// Text without surrounding whitespace and not `-` (which a reader reads as
/// none): what a user can be.
fn name_text() -> impl Strategy<Value = String> {
    "\\PC{0,12}".prop_filter("trimmed, not -", |s| {
        s.trim_matches(|c: char| c.is_ascii_whitespace()) == s && s != "-"
    })
}

/// Distinct names not taken by a field of the record.
fn names(prefix: &'static str, n: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::btree_set("[a-z][a-z0-9_-]{0,8}", 0..n).prop_map(move |s| {
        s.into_iter()
            .map(|n| format!("{prefix}{n}"))
            .collect::<Vec<_>>()
    })
}

fn spec(values: impl Strategy<Value = String> + Clone + 'static) -> impl Strategy<Value = Spec> {
    (
        (
            any::<u64>(),
            ip(),
            name_text(),
            "([A-Z]{1,7})?",
            "(/[a-zA-Z0-9/?=&%._~+-]{0,30})?",
        ),
        (0u16..=999, any::<u64>()),
        names("h-", 4).prop_flat_map({
            let values = values.clone();
            move |n| {
                let k = n.len();
                (Just(n), prop::collection::vec(values.clone(), k))
            }
        }),
        names("f_", 4).prop_flat_map(move |n| {
            let k = n.len();
            (Just(n), prop::collection::vec(values.clone(), k))
        }),
    )
        .prop_map(
            |((ts_ns, ip, user, method, path), (status, cost), (hn, hv), (fname, fv))| Spec {
                ts_ns,
                ip,
                user,
                method,
                path,
                status,
                cost,
                headers: hn.into_iter().zip(hv).collect(),
                fields: fname.into_iter().zip(fv).collect(),
            },
        )
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// `secs.nanos`, as JSON number or text.
fn epoch_text(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

fn json_line(s: &Spec, ts_style: u8, pad: &str) -> String {
    let ts = match ts_style % 3 {
        0 => epoch_text(s.ts_ns),
        1 => json_string(&epoch_text(s.ts_ns)),
        _ => json_string(&format_rfc3339(s.ts_ns)),
    };
    let mut out = format!("{{{pad}\"ts\"{pad}:{pad}{ts}");
    for (k, v) in [
        ("ip", &s.ip),
        ("user", &s.user),
        ("method", &s.method),
        ("path", &s.path),
    ] {
        out.push_str(&format!(",{pad}\"{k}\":{pad}{}", json_string(v)));
    }
    out.push_str(&format!(",\"status\":{},\"cost\":{}", s.status, s.cost));
    out.push_str(",\"headers\":{");
    let h: Vec<String> = s
        .headers
        .iter()
        .map(|(k, v)| format!("{}:{pad}{}", json_string(k), json_string(v)))
        .collect();
    out.push_str(&h.join(","));
    out.push('}');
    for (k, v) in &s.fields {
        out.push_str(&format!(",{}:{}", json_string(k), json_string(v)));
    }
    out.push_str(pad);
    out.push('}');
    out
}

/// A CSV field, quoted when it must be (or when asked).
fn csv_field(v: &str, force: bool) -> String {
    if force
        || v.contains([',', '"', '\r', '\n'])
        || v.trim_matches(|c: char| c.is_ascii_whitespace()) != v
    {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_string()
    }
}

/// nginx's escaping of a quoted field.
fn nginx_escape(s: &str) -> String {
    let mut out = String::new();
    for &b in s.as_bytes() {
        if !(0x20..0x7f).contains(&b) || b == b'"' || b == b'\\' {
            out.push_str(&format!("\\x{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

/// A combined log date of `ns` at an offset of `off` minutes.
fn clf_date(ns: u64, off: i32, frac: bool) -> String {
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let local = (ns / 1_000_000_000) as i64 + i64::from(off) * 60;
    let (y, m, d) = civil_from_days(local.div_euclid(86_400));
    let t = local.rem_euclid(86_400);
    let sign = if off < 0 { '-' } else { '+' };
    let fraction = if frac {
        format!(".{:09}", ns % 1_000_000_000)
    } else {
        String::new()
    };
    format!(
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02}{fraction} {sign}{:02}{:02}",
        MON[m as usize - 1],
        t / 3600,
        t / 60 % 60,
        t % 60,
        off.abs() / 60,
        off.abs() % 60
    )
}

/// RFC 3339 of `ns` at an offset of `off` minutes.
fn rfc3339_at(ns: u64, off: i32, sep: char) -> String {
    let local = (ns / 1_000_000_000) as i64 + i64::from(off) * 60;
    let (y, m, d) = civil_from_days(local.div_euclid(86_400));
    let t = local.rem_euclid(86_400);
    let sign = if off < 0 { '-' } else { '+' };
    format!(
        "{y:04}-{m:02}-{d:02}{sep}{:02}:{:02}:{:02}.{:09}{sign}{:02}:{:02}",
        t / 3600,
        t / 60 % 60,
        t % 60,
        ns % 1_000_000_000,
        off.abs() / 60,
        off.abs() % 60
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn json_lines_round_trip(
        specs in prop::collection::vec(spec("\\PC{0,16}|[\\x00-\\x1f\"\\\\]{0,4}"), 1..5),
        ts_style in any::<u8>(),
        spaced in any::<bool>(),
    ) {
        let pad = if spaced { " " } else { "" };
        let text: String = specs.iter().map(|s| json_line(s, ts_style, pad) + "\n").collect();
        let out = read_all(text.as_bytes(), &TraceOptions::default()).unwrap();
        prop_assert_eq!(out.malformed, 0, "{:?}\n{}", out.bad, text);
        let want: Vec<Record> = specs.iter().enumerate().map(|(i, s)| s.record(i as u64 + 1)).collect();
        prop_assert_eq!(out.recs, want);
    }

    #[test]
    fn csv_round_trip(
        specs in prop::collection::vec(
            spec("\\PC{1,16}|[a-z,\"\r\n ]{1,6}".prop_filter("not - nor NUL", |s| s != "-" && !s.contains('\0'))),
            1..5,
        ),
        quote_all in any::<bool>(),
        crlf in any::<bool>(),
    ) {
        // One header for all rows: every row gets the union of the names
        // (a header or field a row lacks is written empty; an empty header
        // column is none, an empty field column is an empty field).
        let mut hnames: Vec<String> = specs.iter().flat_map(|s| s.headers.iter().map(|h| h.0.clone())).collect();
        hnames.sort();
        hnames.dedup();
        let mut fnames: Vec<String> = specs.iter().flat_map(|s| s.fields.iter().map(|f| f.0.clone())).collect();
        fnames.sort();
        fnames.dedup();
        let eol = if crlf { "\r\n" } else { "\n" };
        let mut cols: Vec<String> = ["ts", "ip", "user", "method", "path", "status", "cost"].map(String::from).to_vec();
        cols.extend(hnames.iter().map(|h| format!("col {h}")));
        cols.extend(fnames.iter().cloned());
        let mut text = cols.iter().map(|c| csv_field(c, quote_all)).collect::<Vec<_>>().join(",") + eol;
        let mut o = TraceOptions::default();
        for h in &hnames {
            o.fields.set(&format!("header:{h}=col {h}")).unwrap();
        }
        let mut want = Vec::new();
        let mut line = 2;
        for s in &specs {
            let mut row = vec![
                epoch_text(s.ts_ns), s.ip.clone(), s.user.clone(), s.method.clone(),
                s.path.clone(), s.status.to_string(), s.cost.to_string(),
            ];
            let mut expect = s.clone();
            expect.headers = hnames.iter().filter_map(|h| s.headers.iter().find(|x| &x.0 == h).cloned()).collect();
            for h in &hnames {
                row.push(s.headers.iter().find(|x| &x.0 == h).map(|x| x.1.clone()).unwrap_or_default());
            }
            expect.fields = fnames.iter().map(|f| {
                (f.clone(), s.fields.iter().find(|x| &x.0 == f).map(|x| x.1.clone()).unwrap_or_default())
            }).collect();
            for (_, v) in &expect.fields {
                row.push(v.clone());
            }
            let written = row.iter().map(|c| csv_field(c, quote_all)).collect::<Vec<_>>().join(",");
            want.push(expect.record(line));
            line += 1 + written.matches('\n').count() as u64;
            text.push_str(&written);
            text.push_str(eol);
        }
        let out = read_all(text.as_bytes(), &o).unwrap();
        prop_assert_eq!(out.malformed, 0, "{:?}\n{:?}", out.bad, text);
        prop_assert_eq!(out.recs, want, "{:?}", text);
    }

    #[test]
    fn combined_round_trip(
        ts_ns in any::<u64>(),
        off in -1439i32..=1439,
        frac in any::<bool>(),
        ip in ip().prop_filter("an address", |s| !s.is_empty()),
        user in "([a-zA-Z0-9._@]{1,12})?".prop_filter("not -", |s| s != "-"),
        method in "[A-Z]{1,7}",
        path in "/[!-~]{0,30}",
        status in 0u16..=999,
        referer in "\\PC{0,20}|[\\x00-\\x1f\"\\\\]{0,4}",
        ua in "\\PC{0,20}",
        extras in names("x", 3),
        extra_value in "\\PC{0,10}",
    ) {
        prop_assume!(referer != "-" && ua != "-");
        let user_field = if user.is_empty() { "-".to_string() } else { user.clone() };
        let date = clf_date(ts_ns, off, frac);
        let mut line = format!(
            "{ip} - {user_field} [{date}] \"{method} {} HTTP/1.1\" {status} 123 \"{}\" \"{}\"",
            nginx_escape(&path), nginx_escape(&referer), nginx_escape(&ua)
        );
        for x in &extras {
            line.push_str(&format!(" {x}=\"{}\"", nginx_escape(&extra_value)));
        }
        let out = read_all(format!("{line}\n").as_bytes(), &opts(Some(Format::Combined), &[])).unwrap();
        prop_assert_eq!(out.malformed, 0, "{:?}\n{}", out.bad, line);
        let spec = Spec {
            ts_ns: if frac { ts_ns } else { ts_ns / 1_000_000_000 * 1_000_000_000 },
            ip,
            user,
            method,
            path,
            status,
            cost: 1,
            headers: vec![("referer".into(), referer), ("user-agent".into(), ua)],
            fields: extras.iter().map(|x| (x.clone(), extra_value.clone())).collect(),
        };
        prop_assert_eq!(&out.recs[..], &[spec.record(1)][..], "{}", line);
    }

    #[test]
    fn timestamps_round_trip(ns in any::<u64>(), off in -1439i32..=1439, space in any::<bool>()) {
        prop_assert_eq!(parse_rfc3339(&format_rfc3339(ns)), Ok(ns));
        let sep = if space { ' ' } else { 'T' };
        prop_assert_eq!(parse_rfc3339(&rfc3339_at(ns, off, sep)), Ok(ns));
        prop_assert_eq!(parse_clf_date(&clf_date(ns, off, true)), Ok(ns));
        prop_assert_eq!(parse_epoch(&epoch_text(ns), None), Ok(ns));
        let ms = format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000);
        prop_assert_eq!(parse_epoch(&ms, Some(TsUnit::Millis)), Ok(ns));
        prop_assert_eq!(parse_epoch(&ns.to_string(), Some(TsUnit::Nanos)), Ok(ns));
        // By magnitude, a whole number of each unit.
        let secs = ns / 1_000_000_000;
        if secs < 100_000_000_000 {
            prop_assert_eq!(parse_epoch(&secs.to_string(), None), Ok(secs * 1_000_000_000));
        }
        let us = ns / 1000;
        if (100_000_000_000_000..100_000_000_000_000_000).contains(&us) {
            prop_assert_eq!(parse_epoch(&us.to_string(), None), Ok(us * 1000));
        }
    }
}
