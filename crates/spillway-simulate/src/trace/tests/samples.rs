//! Real-looking sample lines of each format, every parsed field asserted.

use super::*;
use spillway_core::Attributes;

/// 2026-11-25T09:00:00Z.
const NOV25_09: u64 = 1_795_597_200;

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn nginx_default_combined() {
    let out = read_str(
        "93.184.216.34 - - [25/Nov/2026:10:00:00 +0100] \"GET /v1/items?page=2 HTTP/1.1\" 200 5120 \
         \"https://example.com/list\" \"Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0\"\n",
    );
    assert_eq!(out.format, Format::Combined);
    assert_eq!(out.malformed, 0);
    let r = &out.recs[0];
    assert_eq!(r.line, 1);
    assert_eq!(r.ts_ns, s(NOV25_09));
    assert_eq!(r.ip, "93.184.216.34");
    assert_eq!(r.user, "");
    assert_eq!(r.method, "GET");
    assert_eq!(r.path, "/v1/items?page=2");
    assert_eq!(r.status, 200);
    assert_eq!(r.cost, 1);
    assert_eq!(
        headers(r),
        pairs(&[
            ("referer", "https://example.com/list"),
            (
                "user-agent",
                "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"
            ),
        ])
    );
    assert!(fields(r).is_empty());
    assert_eq!(Attributes::user(r), None);
    assert_eq!(Attributes::ip(r), Some("93.184.216.34"));
    assert_eq!(
        Attributes::header(r, "User-Agent").map(|u| &u[..7]),
        Some("Mozilla")
    );
}

#[test]
fn nginx_combined_with_user_millis_and_timings() {
    let out = read_str(
        "10.1.2.3 - alice [25/Nov/2026:04:00:00.250 -0500] \"POST /v1/login HTTP/2.0\" 401 0 \"-\" \
         \"curl/8.5.0\" rt=0.004 uct=\"0.000\" urt=\"0.003\"\r\n",
    );
    let r = &out.recs[0];
    assert_eq!(r.ts_ns, s(NOV25_09) + 250_000_000);
    assert_eq!(r.ip, "10.1.2.3");
    assert_eq!(r.user, "alice");
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/login"));
    assert_eq!(r.status, 401);
    assert_eq!(headers(r), pairs(&[("user-agent", "curl/8.5.0")]));
    assert_eq!(
        fields(r),
        pairs(&[("rt", "0.004"), ("uct", "0.000"), ("urt", "0.003")])
    );
    assert_eq!(Attributes::descriptor(r, "rt"), Some("0.004"));
}

#[test]
fn apache_combined_with_duration_and_common_log() {
    // The Apache documentation's example, with `%D` (microseconds) after it.
    let out = read_str(
        "192.0.2.10 - bob [10/Oct/2000:13:55:36 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 2326 \
         \"http://www.example.com/start.html\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\" 1534\n\
         127.0.0.1 - frank [10/Oct/2000:13:55:36.999999999 -0700] \"GET /apache_pb.gif HTTP/1.0\" 200 -\n",
    );
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    let [a, b] = &out.recs[..] else {
        panic!("{out:?}")
    };
    assert_eq!(a.ts_ns, s(971_211_336));
    assert_eq!(a.ip, "192.0.2.10");
    assert_eq!(a.user, "bob");
    assert_eq!(
        (a.method.as_str(), a.path.as_str()),
        ("GET", "/apache_pb.gif")
    );
    assert_eq!(a.status, 200);
    assert_eq!(
        headers(a),
        pairs(&[
            ("referer", "http://www.example.com/start.html"),
            ("user-agent", "Mozilla/4.08 [en] (Win98; I ;Nav)"),
        ])
    );
    assert!(fields(a).is_empty());
    assert_eq!(b.line, 2);
    assert_eq!(b.ts_ns, s(971_211_336) + 999_999_999);
    assert_eq!(b.user, "frank");
    assert!(headers(b).is_empty());
}

#[test]
fn combined_tls_handshake_and_dash_request_are_requests_without_a_path() {
    let out = read_str(
        "198.51.100.4 - - [25/Nov/2026:09:00:01 +0000] \"\\x16\\x03\\x01\\x02\\x00\\x01\\x00\\x01\\xFC\\x03\\x03\" 400 157 \"-\" \"-\"\n\
         [2001:db8::1]:51234 - - [25/Nov/2026:09:00:02 +0000] \"-\" 400 0 \"-\" \"-\"\n\
         2001:db8::2 - - [25/Nov/2026:09:00:03 +0000] \"GET /a b HTTP/1.1\" 400 0 \"-\" \"-\"\n",
    );
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    for (i, r) in out.recs.iter().enumerate() {
        assert_eq!(r.ts_ns, s(NOV25_09 + 1 + i as u64));
        assert_eq!((r.method.as_str(), r.path.as_str()), ("", ""));
        assert_eq!(r.status, 400);
        assert!(headers(r).is_empty());
    }
    assert_eq!(out.recs[0].ip, "198.51.100.4");
    assert_eq!(out.recs[1].ip, "2001:db8::1");
    assert_eq!(out.recs[2].ip, "2001:db8::2");
}

#[test]
fn combined_escapes_are_decoded() {
    let out = read_str(
        "203.0.113.5 - - [25/Nov/2026:09:00:00 +0000] \"GET /caf\\xC3\\xA9?q=\\x22x\\x22 HTTP/1.1\" 200 1 \
         \"-\" \"Mozilla \\\"quoted\\\" back\\\\slash \\xFF\"\n",
    );
    let r = &out.recs[0];
    assert_eq!(r.path, "/café?q=\"x\"");
    // `\xFF` alone is not UTF-8: the value stays as logged.
    assert_eq!(
        r.header("user-agent"),
        Some("Mozilla \\\"quoted\\\" back\\\\slash \\xFF")
    );
}

#[test]
fn nginx_json_log_format() {
    // log_format json escape=json '{"msec":$msec,"time":"$time_iso8601",...}'
    let line = r#"{"msec":1795597200.123,"time":"2026-11-25T10:00:00+01:00","remote_addr":"198.51.100.23","remote_user":"","request":"GET /v1/items/42?x=1 HTTP/1.1","status":"404","body_bytes_sent":"153","request_time":"0.002","http_referer":"","http_user_agent":"Go-http-client/1.1","http_x_api_key":"key-7"}"#;
    let o = opts(
        None,
        &[
            "ts=msec",
            "ip=remote_addr",
            "user=remote_user",
            "header:user-agent=http_user_agent",
            "header:x-api-key=http_x_api_key",
        ],
    );
    let out = read_all(format!("{line}\n").as_bytes(), &o).unwrap();
    assert_eq!(out.format, Format::Json);
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    let r = &out.recs[0];
    assert_eq!(r.ts_ns, s(NOV25_09) + 123_000_000);
    assert_eq!(r.ip, "198.51.100.23");
    assert_eq!(r.user, "");
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("GET", "/v1/items/42?x=1")
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.cost, 1);
    assert_eq!(
        headers(r),
        pairs(&[("user-agent", "Go-http-client/1.1"), ("x-api-key", "key-7")])
    );
    assert_eq!(
        fields(r),
        pairs(&[
            ("time", "2026-11-25T10:00:00+01:00"),
            ("body_bytes_sent", "153"),
            ("request_time", "0.002"),
            ("http_referer", ""),
        ])
    );
    assert_eq!(Attributes::descriptor(r, "http_referer"), None);
}

#[test]
fn decision_api_shaped_json() {
    let out = read_str(concat!(
        r#"{"ts":"2026-11-25T09:00:00.123456789Z","ip":"203.0.113.9:443","user":"u42","api":"POST /v1/check","status":429,"cost":3,"#,
        r#""headers":{"X-Api-Key":"k1","X-Retry":2,"x-skip":null,"x-nested":{"a":[1]}},"tenant":"acme","premium":true,"latency_ms":12.5,"extra":null,"tags":["a"]}"#,
        "\n",
        r#"{"ts":1795597200123456,"api":"/v1/ping","method":"HEAD","user":7}"#,
        "\n"
    ));
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    let r = &out.recs[0];
    assert_eq!(r.ts_ns, s(NOV25_09) + 123_456_789);
    assert_eq!(r.ip, "203.0.113.9");
    assert_eq!(r.user, "u42");
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1/check"));
    assert_eq!(r.status, 429);
    assert_eq!(r.cost, 3);
    assert_eq!(headers(r), pairs(&[("x-api-key", "k1"), ("x-retry", "2")]));
    assert_eq!(
        fields(r),
        pairs(&[
            ("tenant", "acme"),
            ("premium", "true"),
            ("latency_ms", "12.5")
        ])
    );
    let r = &out.recs[1];
    assert_eq!(r.ts_ns, s(NOV25_09) + 123_456_000);
    assert_eq!((r.method.as_str(), r.path.as_str()), ("HEAD", "/v1/ping"));
    assert_eq!(r.user, "7");
    assert_eq!(r.line, 2);
}

#[test]
fn cloudfront_ish_csv() {
    let text = "timestamp,c-ip,cs-method,cs-uri-stem,cs-uri-query,sc-status,cs(User-Agent),x-edge-location\r\n\
                1795597200.5,192.0.2.100,GET,/index.html,-,200,\"Mozilla/5.0 (Windows NT 10.0; Win64; x64)\",IAD89-C1\r\n\
                \r\n\
                1795597201.25,2001:db8::7,GET,/img/a.png,w=100,304,\"curl/8.5.0, \"\"patched\"\"\",FRA56-P3\r\n";
    let o = opts(
        None,
        &[
            "ts=timestamp",
            "ip=c-ip",
            "method=cs-method",
            "path=cs-uri-stem",
            "status=sc-status",
            "header:user-agent=cs(User-Agent)",
        ],
    );
    let out = read_all(text.as_bytes(), &o).unwrap();
    assert_eq!(out.format, Format::Csv);
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    let [a, b] = &out.recs[..] else {
        panic!("{out:?}")
    };
    assert_eq!((a.line, a.ts_ns), (2, s(NOV25_09) + 500_000_000));
    assert_eq!(a.ip, "192.0.2.100");
    assert_eq!((a.method.as_str(), a.path.as_str()), ("GET", "/index.html"));
    assert_eq!(a.status, 200);
    assert_eq!(
        headers(a),
        pairs(&[("user-agent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64)")])
    );
    assert_eq!(
        fields(a),
        pairs(&[("cs-uri-query", "-"), ("x-edge-location", "IAD89-C1")])
    );
    assert_eq!((b.line, b.ts_ns), (4, s(NOV25_09 + 1) + 250_000_000));
    assert_eq!(b.ip, "2001:db8::7");
    assert_eq!(b.status, 304);
    assert_eq!(b.header("user-agent"), Some("curl/8.5.0, \"patched\""));
}

#[test]
fn alb_style_csv_with_absolute_targets() {
    let text = "type,time,elb,client:port,target:port,elb_status_code,request,user_agent,headers\n\
                https,2018-07-02T22:23:00.186641Z,app/my-lb/50dc6c495c0c9188,192.168.131.39:2817,10.0.0.1:80,200,\
                \"GET https://api.example.com:443/v1/items?id=7 HTTP/1.1\",\"curl/7.46.0\",\"{\"\"X-Tenant\"\": \"\"acme\"\"}\"\n\
                h2,2018-07-02T22:23:00.5Z,app/my-lb/50dc6c495c0c9188,10.0.1.2:5000,-,502,\"- http://b.example:80- -\",\"-\",\n";
    let o = opts(
        None,
        &[
            "ts=time",
            "ip=client:port",
            "status=elb_status_code",
            "header:user-agent=user_agent",
        ],
    );
    let out = read_all(text.as_bytes(), &o).unwrap();
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    let [a, b] = &out.recs[..] else {
        panic!("{out:?}")
    };
    assert_eq!(a.ts_ns, s(1_530_570_180) + 186_641_000);
    assert_eq!(a.ip, "192.168.131.39");
    assert_eq!(
        (a.method.as_str(), a.path.as_str()),
        ("GET", "/v1/items?id=7")
    );
    assert_eq!(a.status, 200);
    assert_eq!(
        headers(a),
        pairs(&[
            ("user-agent", "curl/7.46.0"),
            ("x-tenant", "acme"),
            ("host", "api.example.com:443"),
        ])
    );
    assert_eq!(
        fields(a),
        pairs(&[
            ("type", "https"),
            ("elb", "app/my-lb/50dc6c495c0c9188"),
            ("target:port", "10.0.0.1:80"),
        ])
    );
    assert_eq!(b.ts_ns, s(1_530_570_180) + 500_000_000);
    assert_eq!(b.ip, "10.0.1.2");
    assert_eq!(b.status, 502);
    // ALB's request for a connection that sent none: not a request line.
    assert_eq!((b.method.as_str(), b.path.as_str()), ("", ""));
    assert!(headers(b).is_empty());
}

#[test]
fn field_names_set() {
    let mut f = FieldNames::default();
    f.set("ip=remote_addr").unwrap();
    f.set(" ts = msec ").unwrap();
    f.set("header:X-Api-Key=http_x_api_key").unwrap();
    assert_eq!((f.ip.as_str(), f.ts.as_str()), ("remote_addr", "msec"));
    assert_eq!(
        f.header_keys,
        vec![("x-api-key".to_string(), "http_x_api_key".to_string())]
    );
    let e = f.set("addr=remote_addr").unwrap_err();
    assert!(e.contains("unknown field \"addr\""), "{e}");
    assert!(
        e.contains("ts, ip, user, method, path, status, cost, api, request, headers"),
        "{e}"
    );
    assert!(f.set("ip").is_err());
    assert!(f.set("ip=").is_err());
    assert!(f.set("header:=x").is_err());
}

#[test]
fn format_and_unit_names() {
    for (s, f) in [
        ("combined", Format::Combined),
        ("json", Format::Json),
        ("jsonl", Format::Json),
        ("csv", Format::Csv),
    ] {
        assert_eq!(s.parse::<Format>().unwrap(), f);
    }
    assert_eq!(Format::Json.to_string(), "json");
    assert!("tsv".parse::<Format>().unwrap_err().contains("combined"));
    for u in ["s", "ms", "us", "ns"] {
        assert_eq!(u.parse::<TsUnit>().unwrap().to_string(), u);
    }
    assert!("sec".parse::<TsUnit>().is_err());
}

#[test]
fn ts_unit_given_overrides_magnitude() {
    let o = TraceOptions {
        ts_unit: Some(TsUnit::Millis),
        ..TraceOptions::default()
    };
    let out = read_all(b"{\"ts\": 1500}\n{\"ts\": \"2.5\"}\n", &o).unwrap();
    assert_eq!(out.recs[0].ts_ns, 1_500_000_000);
    assert_eq!(out.recs[1].ts_ns, 2_500_000);
}

#[test]
fn malformed_lines_say_why_with_their_line_numbers() {
    let out = read_str(concat!(
        "{\"ts\": 1}\n",
        "\n",
        "   \n",
        "{\"ts\": 1, \"ts\": 2}\n",
        "{\"user\": \"a\"}\n",
        "[1]\n",
        "{\"ts\": -5}\n",
        "{\"ts\": \"29/Feb/2023\"}\n",
        "{\"ts\": \"2023-02-29T00:00:00Z\"}\n",
        "{\"ts\": 1, \"status\": 1000}\n",
        "{\"ts\": 1, \"headers\": \"x\"}\n",
        "{\"ts\": 1,}\n",
    ));
    assert_eq!(out.recs.len(), 1);
    let got: Vec<(u64, &str)> = out
        .bad
        .iter()
        .map(|b| (b.line, b.reason.as_str()))
        .collect();
    let want: Vec<(u64, &str)> = vec![
        (4, "the same key twice (at column 11: `\\\"ts\\\": 2}`)"),
        (5, "no timestamp (`ts`)"),
        (6, "not a JSON object (at column 1: `[1]`)"),
        (7, "ts: before 1970"),
        (8, "ts: not a number or a date like 2026-11-25T10:00:00Z"),
        (9, "ts: no such day in that month"),
        (10, "status: not a status code from 0 to 999"),
        (11, "headers: not an object"),
        (12, "expected a key (at column 10: `}`)"),
    ];
    assert_eq!(got, want);
    assert_eq!(out.malformed, 9);
}

#[test]
fn csv_header_errors_are_errors_of_the_file() {
    let e = read_all(b"time,ip\n1,2\n", &TraceOptions::default()).unwrap_err();
    assert_eq!(e.kind(), TraceErrorKind::Header);
    assert_eq!(
        e.to_string(),
        "test: line 1: the CSV header has no column \"ts\" (the timestamp; choose one with \
         --field ts=COLUMN); its columns: time, ip"
    );
    let e = read_all(b"\n\nts,ip,ip\n", &TraceOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "test: line 3: the CSV header names column \"ip\" twice"
    );
}

#[test]
fn empty_inputs_read_nothing() {
    for text in ["", "\n\n", "\u{feff}", "\u{feff}\r\n  \n"] {
        let out = read_str(text);
        assert!(out.recs.is_empty() && out.malformed == 0, "{text:?}");
    }
    let out = read_all(b"ts\n", &TraceOptions::default()).unwrap();
    assert_eq!((out.format, out.recs.len()), (Format::Csv, 0));
}

#[test]
fn bom_and_detection() {
    let out = read_str("\u{feff}ts,user\n5,bob\n");
    assert_eq!(out.format, Format::Csv);
    assert_eq!(
        (out.recs[0].ts_ns, out.recs[0].user.as_str()),
        (s(5), "bob")
    );
    let out = read_str("\u{feff}{\"ts\":5}\n");
    assert_eq!(out.format, Format::Json);
    assert_eq!(out.recs.len(), 1);
}

#[test]
fn record_built_by_hand() {
    let mut r = Record::default();
    assert_eq!(r.cost, 1);
    r.add_header("X-Key", "v");
    r.add_field("tenant", "t");
    assert_eq!(r.header("x-key"), Some("v"));
    assert_eq!(Attributes::descriptor(&r, "tenant"), Some("t"));
    r.clear();
    assert_eq!(
        (r.header("x-key"), r.field("tenant"), r.cost),
        (None, None, 1)
    );
}

#[test]
fn rfc3339_format_reads_back() {
    let ns = s(NOV25_09) + 5;
    let text = format_rfc3339(ns);
    assert_eq!(text, "2026-11-25T09:00:00.000000005Z");
    assert_eq!(time::parse_rfc3339(&text), Ok(ns));
}

#[test]
fn reader_is_send() {
    fn send<T: Send>() {}
    send::<TraceReader>();
    send::<Record>();
}

#[test]
fn csv_header_may_span_lines_but_not_1_mib() {
    let out = read_str("\"t\ns\",ts,x\n\"a\nb\",5,\"c\"\n");
    assert_eq!(out.malformed, 0, "{:?}", out.bad);
    assert_eq!(fields(&out.recs[0]), pairs(&[("t\ns", "a\nb"), ("x", "c")]));
    assert_eq!(out.recs[0].line, 3);
    let long = format!("ts,\"{}\"\n1,2\n", "x".repeat(2 << 20));
    let e = read_all(long.as_bytes(), &TraceOptions::default()).unwrap_err();
    assert_eq!(e.kind(), TraceErrorKind::Header);
    assert_eq!(
        e.to_string(),
        "test: line 1: the CSV header is longer than 1 MiB"
    );
}

#[test]
fn numeric_timestamps_by_magnitude() {
    for (text, ns) in [
        ("9999999999", 9_999_999_999 * 1_000_000_000),
        ("100000000000", 100_000_000_000 * 1_000_000),
        ("1795597200123", s(NOV25_09) + 123_000_000),
        ("1795597200123456", s(NOV25_09) + 123_456_000),
        ("1795597200123456789", s(NOV25_09) + 123_456_789),
        ("1795597200.123456789123", s(NOV25_09) + 123_456_789),
        ("1795597200123.5", s(NOV25_09) + 123_500_000),
        ("1795597200123456.7", s(NOV25_09) + 123_456_700),
        ("0", 0),
    ] {
        assert_eq!(time::parse_epoch(text, None), Ok(ns), "{text}");
    }
    assert!(time::parse_epoch("18446744073709551616", None).is_err());
    assert!(time::parse_epoch("99999999999", None).is_err());
    assert!(time::parse_epoch("18446744074", Some(TsUnit::Seconds)).is_err());
}
