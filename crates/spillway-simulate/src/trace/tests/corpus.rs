//! The corpus under `tests/corpus/traces/` (see its README), gzip, and a
//! throughput figure.

use std::io::Write;
use std::path::PathBuf;

use super::*;

pub(super) fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/traces")
}

/// The index of the `)` closing a repeat whose text starts at `from`.
fn closing(s: &[u8], from: usize) -> usize {
    let mut depth = 0;
    let mut i = from;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 1,
            b'(' => depth += 1,
            b')' if depth == 0 => return i,
            b')' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    panic!("unclosed \\*N( in {:?}", String::from_utf8_lossy(s));
}

/// Decodes one `.esc` data line's escapes.
fn decode_into(s: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        let e = s[i + 1];
        i += 2;
        match e {
            b'r' => out.push(b'\r'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'0' => out.push(0),
            b'\\' => out.push(b'\\'),
            b'x' => {
                let h = std::str::from_utf8(&s[i..i + 2]).unwrap();
                out.push(u8::from_str_radix(h, 16).unwrap());
                i += 2;
            }
            b'*' => {
                let open = i + s[i..].iter().position(|&c| c == b'(').unwrap();
                let n: usize = std::str::from_utf8(&s[i..open]).unwrap().parse().unwrap();
                let close = closing(s, open + 1);
                let mut once = Vec::new();
                decode_into(&s[open + 1..close], &mut once);
                for _ in 0..n {
                    out.extend_from_slice(&once);
                }
                i = close + 1;
            }
            other => panic!("unknown escape \\{}", other as char),
        }
    }
}

/// The bytes a corpus file stands for.
pub(super) fn load(name: &str) -> Vec<u8> {
    let raw = std::fs::read(corpus_dir().join(name)).unwrap();
    if !name.ends_with(".esc") {
        return raw;
    }
    let mut out = Vec::new();
    for line in raw.split(|&c| c == b'\n') {
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        decode_into(line, &mut out);
        out.push(b'\n');
    }
    out
}

/// One line of `expected.txt`.
#[derive(Debug)]
pub(super) struct Case {
    pub file: String,
    pub format: Option<Format>,
    pub expect: Result<(usize, u64), TraceErrorKind>,
    pub fields: Vec<String>,
}

pub(super) fn manifest() -> Vec<Case> {
    let text = std::fs::read_to_string(corpus_dir().join("expected.txt")).unwrap();
    let mut cases = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let format = (w[1] != "-").then(|| w[1].parse().unwrap());
        let expect = if w[2] == "error" {
            Err(match w[3] {
                "gzip" => TraceErrorKind::Gzip,
                "io" => TraceErrorKind::Io,
                "header" => TraceErrorKind::Header,
                k => panic!("unknown error kind {k}"),
            })
        } else {
            Ok((w[2].parse().unwrap(), w[3].parse().unwrap()))
        };
        cases.push(Case {
            file: w[0].to_string(),
            format,
            expect,
            fields: w[4..].iter().map(|s| s.to_string()).collect(),
        });
    }
    cases
}

#[test]
fn every_corpus_file_is_listed() {
    let listed: Vec<String> = manifest().into_iter().map(|c| c.file).collect();
    for entry in std::fs::read_dir(corpus_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name == "README.md" || name == "expected.txt" {
            continue;
        }
        assert!(listed.contains(&name), "{name} is not in expected.txt");
        let size = std::fs::metadata(corpus_dir().join(&name)).unwrap().len();
        assert!(size < 64 * 1024, "{name} is {size} bytes: write it as .esc");
    }
}

#[test]
fn corpus_files_read_as_expected() {
    let mut failures = Vec::new();
    for case in manifest() {
        let bytes = load(&case.file);
        let fields: Vec<&str> = case.fields.iter().map(String::as_str).collect();
        match case.expect {
            Err(kind) => match read_all(&bytes, &opts(None, &fields)) {
                Err(e) if e.kind() == kind => {}
                other => failures.push(format!("{}: expected {kind:?}, got {other:?}", case.file)),
            },
            Ok((records, malformed)) => {
                for given in [None, case.format] {
                    let out = match read_all(&bytes, &opts(given, &fields)) {
                        Ok(out) => out,
                        Err(e) => {
                            failures.push(format!("{}: {e}", case.file));
                            continue;
                        }
                    };
                    let got = (out.format, out.recs.len(), out.malformed);
                    let want = (case.format.unwrap_or(Format::Json), records, malformed);
                    if got != want {
                        failures.push(format!(
                            "{} (format {given:?}): got {got:?}, want {want:?}; malformed: {:#?}",
                            case.file, out.bad
                        ));
                    }
                    let lines: Vec<u64> = out.bad.iter().map(|b| b.line).collect();
                    assert!(lines.windows(2).all(|w| w[0] < w[1]), "{lines:?}");
                    assert!(out.bad.iter().all(|b| b.line > 0 && !b.reason.is_empty()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gzip_reads_as_the_plain_file() {
    let plain = read_all(&load("001-nginx-combined.log"), &opts(None, &[])).unwrap();
    assert_eq!(plain.recs.len(), 8);
    for gz in ["027-combined.log.gz", "028-multi-member.log.gz"] {
        let out = read_all(&load(gz), &opts(None, &[])).unwrap();
        assert_eq!(out.recs, plain.recs, "{gz}");
    }
    // A JSON trace gzipped here, in two members.
    let text = load("033-json-garbage.esc");
    let mut gz = Vec::new();
    for half in [&text[..text.len() / 2], &text[text.len() / 2..]] {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(half).unwrap();
        gz.extend(enc.finish().unwrap());
    }
    let a = read_all(&text, &opts(None, &[])).unwrap();
    let b = read_all(&gz, &opts(None, &[])).unwrap();
    assert_eq!(
        (a.recs, a.malformed, a.bad.len()),
        (b.recs, b.malformed, b.bad.len())
    );
}

#[test]
fn truncated_gzip_is_an_error_with_the_line_reached() {
    let mut r = TraceReader::from_reader(
        "access.log.gz",
        Box::new(io::Cursor::new(load("026-truncated.log.gz"))),
        &TraceOptions::default(),
    )
    .unwrap();
    let mut rec = Record::default();
    let mut n = 0;
    let e = loop {
        match r.read(&mut rec) {
            Ok(true) => n += 1,
            Ok(false) => panic!("a truncated stream read to its end"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), TraceErrorKind::Gzip);
    assert_eq!(e.line(), n + 1);
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "access.log.gz: line {}: corrupt or truncated gzip: ",
            n + 1
        )),
        "{text}"
    );
    // The reader has ended.
    assert!(!r.read(&mut rec).unwrap());

    // Cut anywhere: never a panic, always an error.
    let full = load("027-combined.log.gz");
    for cut in 2..full.len() {
        let got = read_all(&full[..cut], &TraceOptions::default());
        assert!(got.is_err(), "cut at {cut}: {got:?}");
    }
}

#[test]
fn open_reports_sizes_and_errors() {
    for name in ["001-nginx-combined.log", "027-combined.log.gz"] {
        let path = corpus_dir().join(name);
        let size = std::fs::metadata(&path).unwrap().len();
        let mut r = TraceReader::open(&path, &TraceOptions::default()).unwrap();
        assert_eq!(r.total_bytes(), Some(size));
        let mut rec = Record::default();
        while r.read(&mut rec).unwrap() {}
        assert_eq!(r.bytes_read(), size, "{name}");
        assert_eq!(r.lines_read(), 8);
    }
    let e = TraceReader::open(
        Path::new("/nonexistent/trace.log"),
        &TraceOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), TraceErrorKind::Open);
    assert!(
        e.to_string()
            .starts_with("/nonexistent/trace.log: cannot open: "),
        "{e}"
    );
}

#[test]
fn only_the_first_100_bad_lines_are_kept() {
    let text = "{\"ts\":1}\n".to_string() + &"garbage\n".repeat(250);
    let out = read_str(&text);
    assert_eq!(
        (out.recs.len(), out.malformed, out.bad.len()),
        (1, 250, 100)
    );
    assert_eq!(out.bad[99].line, 101);
}

/// A rough rate, printed (`--nocapture`), never asserted: the replay's
/// budget is 1M requests/s per core, so the reader must do well over it.
#[test]
fn throughput_figure() {
    const N: usize = 200_000;
    let mut json = String::new();
    let mut combined = String::new();
    let mut csv = String::from("ts,ip,user,method,path,status\n");
    for i in 0..N {
        let ts = 1_795_597_200_000u64 + i as u64;
        let ip = format!("10.{}.{}.{}", i % 7, i % 251, i % 13);
        json.push_str(&format!(
            "{{\"ts\":{ts},\"ip\":\"{ip}\",\"user\":\"user{}\",\"method\":\"GET\",\"path\":\"/v1/items/{}?page=2\",\"status\":200,\"tenant\":\"t{}\"}}\n",
            i % 1000,
            i % 97,
            i % 5
        ));
        combined.push_str(&format!(
            "{ip} - user{} [25/Nov/2026:10:{:02}:{:02}.{:03} +0100] \"GET /v1/items/{} HTTP/1.1\" 200 512 \"-\" \"curl/8.5.0\"\n",
            i % 1000,
            i / 60_000 % 60,
            i / 1000 % 60,
            i % 1000,
            i % 97
        ));
        csv.push_str(&format!(
            "{ts},{ip},user{},GET,/v1/items/{},200\n",
            i % 1000,
            i % 97
        ));
    }
    for (name, text) in [("json", &json), ("combined", &combined), ("csv", &csv)] {
        let bytes = text.len() / N;
        let started = std::time::Instant::now();
        let mut r = TraceReader::from_reader(
            name,
            Box::new(io::Cursor::new(text.clone().into_bytes())),
            &TraceOptions::default(),
        )
        .unwrap();
        let mut rec = Record::default();
        let mut n = 0;
        while r.read(&mut rec).unwrap() {
            n += 1;
        }
        let secs = started.elapsed().as_secs_f64();
        assert_eq!((n, r.malformed()), (N, 0));
        println!(
            "trace {name}: {:.2} M lines/s ({bytes}-byte lines, {N} in {secs:.3} s)",
            N as f64 / secs / 1e6
        );
    }
}
