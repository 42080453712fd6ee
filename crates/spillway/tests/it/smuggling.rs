//! Request smuggling, differential: every request shape of the corpus
//! (`tests/corpus/requests/`, format in its README) is sent on a fresh
//! connection through both proxy transports (a proxy with the direct path,
//! and one with `server: { direct_path: false }`) to one strict recording
//! upstream (hyper's HTTP/1.1 server, the reference).
//!
//! The invariant, per shape and transport: every request the upstream
//! parses is a request the proxy decided (same count, same method and
//! path), and a decision that reached no upstream request was answered by
//! the proxy with a 4xx/5xx. Nothing depends on a short deadline: each
//! connection is read until the proxy closes it (the proxies' idle timeout
//! is 1 s) or a generous deadline, the shapes run concurrently, and the
//! decisions are counted per shape afterwards, from the limiter itself.
//!
//! How each shape is told apart: the client connects from its own
//! loopback address, the proxy writes that address in `X-Forwarded-For`
//! (a client's own is dropped), and both rules are keyed by it (`total`
//! by `ip`, `route` by `route+ip`), so `/v1/check` on the admin address
//! gives each shape's decisions afterwards. An upstream request without
//! the proxy's `X-Forwarded-For` (one a client smuggled) is charged to the
//! request before it on the same upstream connection.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::util::{Server, TempDir, client};

/// Each rule's limit: never reached, so every decision admits.
const LIMIT: u64 = 1_000_000;
/// How long a shape's connection is read at most (the proxies close idle
/// connections after 1 s and cut heads and bodies after 3 s; this only
/// bounds a proxy that does neither).
const READ_DEADLINE: Duration = Duration::from_secs(20);
/// Shapes in flight at once.
const CONCURRENCY: usize = 48;

// ---------------------------------------------------------------- corpus

/// One request shape of the corpus.
#[derive(Debug)]
struct Shape {
    /// The file name without `.http`.
    name: String,
    /// Its `# known-failure:` line, if a failure is reported and open.
    known_failure: Option<String>,
    /// The bytes sent, in one write.
    bytes: Vec<u8>,
}

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/requests")
}

fn corpus() -> Vec<Shape> {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .expect("the request corpus")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "http"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let (known_failure, bytes) =
                parse_shape(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            Shape {
                name,
                known_failure,
                bytes,
            }
        })
        .collect()
}

/// Reads the escaped text format (see the corpus README): leading `#`
/// lines are comments, the file's own line breaks are dropped, and
/// `\r \n \t \0 \\ \xHH \*N(text)` are escapes.
fn parse_shape(text: &str) -> Result<(Option<String>, Vec<u8>), String> {
    let mut known = None;
    let mut data = String::new();
    let mut in_comments = true;
    for line in text.lines() {
        if in_comments && let Some(c) = line.strip_prefix('#') {
            if let Some(k) = c.trim().strip_prefix("known-failure:") {
                known = Some(k.trim().to_string());
            }
            continue;
        }
        in_comments = false;
        data.push_str(line);
    }
    if data.is_empty() {
        return Err("no request bytes".into());
    }
    unescape(&data).map(|b| (known, b))
}

fn unescape(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let esc = *b.get(i + 1).ok_or("a lone \\ at the end")?;
        i += 2;
        match esc {
            b'r' => out.push(b'\r'),
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'0' => out.push(0),
            b'\\' => out.push(b'\\'),
            b'x' => {
                let hex = s.get(i..i + 2).ok_or("\\x needs two hex digits")?;
                out.push(u8::from_str_radix(hex, 16).map_err(|e| format!("\\x{hex}: {e}"))?);
                i += 2;
            }
            b'*' => {
                let open = s[i..].find('(').ok_or("\\*N needs (text)")? + i;
                let close = s[open..].find(')').ok_or("\\*N( needs a )")? + open;
                let n: usize = s[i..open]
                    .parse()
                    .map_err(|e| format!("\\*{}: {e}", &s[i..open]))?;
                let piece = unescape(&s[open + 1..close])?;
                for _ in 0..n {
                    out.extend_from_slice(&piece);
                }
                i = close + 1;
            }
            other => return Err(format!("unknown escape \\{}", other as char)),
        }
    }
    Ok(out)
}

#[test]
fn the_corpus_format_reads_escapes_and_comments() {
    let (known, bytes) = parse_shape(
        "# a comment\n# known-failure: issue 1\nGET / HTTP/1.1\\r\\n\nX: \\x41\\t\\0\\\\\\*3(ab)\\r\\n\n",
    )
    .unwrap();
    assert_eq!(known.as_deref(), Some("issue 1"));
    assert_eq!(bytes, b"GET / HTTP/1.1\r\nX: A\t\0\\ababab\r\n");
    assert!(parse_shape("# only comments\n").is_err());
    assert!(unescape("\\q").is_err());
    assert!(unescape("\\x4").is_err());
}

// -------------------------------------------------------------- upstream

/// One request the upstream parsed.
#[derive(Debug, Clone)]
struct Seen {
    /// Upstream connection, and the request's place on it.
    conn: u64,
    seq: u64,
    method: String,
    /// The path, without the query (what the proxy decides on).
    path: String,
    target: String,
    /// The `X-Forwarded-For` values, joined.
    xff: Option<String>,
    /// Body bytes read, or why the body could not be read.
    body: Result<usize, String>,
}

/// An upstream connection that ended in an error.
#[derive(Debug, Clone)]
struct UpstreamError {
    conn: u64,
    /// hyper could not parse what it was sent (not only too large).
    parse: bool,
    text: String,
    /// Every byte the connection received.
    raw: Vec<u8>,
}

#[derive(Debug, Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
    errors: Mutex<Vec<UpstreamError>>,
    /// Requests being handled (head parsed, answer not yet written).
    in_flight: AtomicUsize,
    /// Connections open.
    open: AtomicUsize,
}

/// A TCP stream that keeps a copy of what it reads.
struct Tap {
    inner: TcpStream,
    raw: Arc<Mutex<Vec<u8>>>,
}

impl AsyncRead for Tap {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let new = buf.filled()[before..].to_vec();
            self.raw.lock().unwrap().extend_from_slice(&new);
        }
        r
    }
}

impl AsyncWrite for Tap {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The strict recording upstream: hyper's HTTP/1.1 server with its default
/// (strict) settings, answering every request 200 with `x-upstream: 1`.
async fn recording_upstream() -> (SocketAddr, Arc<Recorder>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rec = Arc::new(Recorder::default());
    let conns = Arc::new(AtomicU64::new(0));
    let r = rec.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let conn = conns.fetch_add(1, Ordering::Relaxed);
            let rec = r.clone();
            rec.open.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let raw = Arc::new(Mutex::new(Vec::new()));
                let io = hyper_util::rt::TokioIo::new(Tap {
                    inner: tcp,
                    raw: raw.clone(),
                });
                let seq = Arc::new(AtomicU64::new(0));
                let svc_rec = rec.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let rec = svc_rec.clone();
                    let seq = seq.fetch_add(1, Ordering::Relaxed);
                    record(rec, conn, seq, req)
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
                if let Err(e) = served {
                    // A connection the proxy dropped midway is not a parse
                    // error; what hyper could not read is.
                    let parse = e.is_parse() && !e.is_parse_too_large();
                    rec.errors.lock().unwrap().push(UpstreamError {
                        conn,
                        parse,
                        text: e.to_string(),
                        raw: raw.lock().unwrap().clone(),
                    });
                }
                rec.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, rec)
}

async fn record(
    rec: Arc<Recorder>,
    conn: u64,
    seq: u64,
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<axum::body::Body>, Infallible> {
    rec.in_flight.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = req.into_parts();
    let xff: Vec<&str> = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.to_str().unwrap_or("?"))
        .collect();
    // Counted as soon as the head is parsed: an upstream may act on a head
    // before (or without) reading the body.
    let index = {
        let mut seen = rec.seen.lock().unwrap();
        seen.push(Seen {
            conn,
            seq,
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            target: parts.uri.to_string(),
            xff: (!xff.is_empty()).then(|| xff.join(",")),
            body: Err("not read yet".into()),
        });
        seen.len() - 1
    };
    let body = axum::body::to_bytes(axum::body::Body::new(body), 1 << 20).await;
    rec.seen.lock().unwrap()[index].body = body.map(|b| b.len()).map_err(|e| e.to_string());
    let resp = http::Response::builder()
        .header("x-upstream", "1")
        .body(axum::body::Body::from("upstream"))
        .unwrap();
    rec.in_flight.fetch_sub(1, Ordering::SeqCst);
    Ok(resp)
}

// ---------------------------------------------------------------- proxies

/// A `spillway proxy` in front of the upstream, with its admin address.
struct Proxy {
    server: Server,
    admin: String,
    _dir: TempDir,
}

fn start_proxy(upstream: SocketAddr, direct_path: bool) -> Proxy {
    let dir = TempDir::new("smuggling");
    let file = dir.write(
        "rules.yaml",
        &format!(
            "server:
  head_timeout: 3s
  body_timeout: 3s
  idle_timeout: 1s
  direct_path: {direct_path}
proxy:
  upstream: http://{upstream}
  timeout: 5s
rules:
  - name: total
    by: ip
    limits: [ {{ fixed_window: {{ limit: {LIMIT}, window: 1h }} }} ]
  - name: route
    by: route+ip
    limits: [ {{ fixed_window: {{ limit: {LIMIT}, window: 1h }} }} ]
"
        ),
    );
    let server = Server::start_cmd(
        "proxy",
        &[
            "--config",
            file.to_str().unwrap(),
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let admin = server.listener("admin API");
    Proxy {
        server,
        admin,
        _dir: dir,
    }
}

// ----------------------------------------------------------------- client

/// What the client got back on one shape's connection.
#[derive(Debug, Default)]
struct Answers {
    /// Each answer's status and who wrote it (`up`: the upstream's,
    /// relayed; `proxy`: a problem answer of the proxy; `?`: neither).
    statuses: Vec<(u16, &'static str)>,
    /// Bytes after the last answer that are not an answer.
    unparsed: usize,
    /// The proxy did not close within [`READ_DEADLINE`].
    hung: bool,
    /// The connection could not even be made.
    error: Option<String>,
}

async fn send_shape(bytes: Vec<u8>, proxy: SocketAddr, from: Ipv4Addr) -> Answers {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Err(e) = socket.bind(SocketAddr::new(IpAddr::V4(from), 0)) {
        return Answers {
            error: Some(format!("bind {from}: {e}")),
            ..Answers::default()
        };
    }
    let conn = match socket.connect(proxy).await {
        Ok(c) => c,
        Err(e) => {
            return Answers {
                error: Some(format!("connect: {e}")),
                ..Answers::default()
            };
        }
    };
    let _ = conn.set_nodelay(true);
    let (mut rd, mut wr) = conn.into_split();
    // Written from its own task: a proxy that answers early and closes
    // must not block the read side (write errors are expected then).
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        // Keep the write half open (a half-close would read as a client
        // that left): it is dropped when the proxy has closed.
        wr
    });
    let mut got = Vec::new();
    let mut hung = false;
    let deadline = tokio::time::Instant::now() + READ_DEADLINE;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, rd.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
            Err(_) => {
                hung = true;
                break;
            }
        }
    }
    writer.abort();
    let (statuses, unparsed) = parse_answers(&got);
    Answers {
        statuses,
        unparsed,
        hung,
        error: None,
    }
}

/// Splits what came back into answers, as far as they parse.
fn parse_answers(mut buf: &[u8]) -> (Vec<(u16, &'static str)>, usize) {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let Ok(httparse::Status::Complete(n)) = resp.parse(buf) else {
            break;
        };
        let code = resp.code.unwrap_or(0);
        let get = |name: &str| {
            resp.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        let who = if get("x-upstream").is_some() {
            "up"
        } else if get("content-type").is_some_and(|t| t.contains("problem+json")) {
            "proxy"
        } else {
            "?"
        };
        let chunked = get("transfer-encoding").is_some_and(|t| t.contains("chunked"));
        let length = get("content-length").and_then(|l| l.trim().parse::<usize>().ok());
        buf = &buf[n..];
        if (100..200).contains(&code) && code != 101 {
            continue;
        }
        out.push((code, who));
        // A HEAD's answer has a length and no body: the next answer starts
        // right away.
        let body_len = if buf.starts_with(b"HTTP/1.") || code == 204 || code == 304 {
            0
        } else if chunked {
            chunked_len(buf).unwrap_or(buf.len())
        } else {
            length.unwrap_or(buf.len())
        };
        buf = &buf[body_len.min(buf.len())..];
    }
    (out, buf.len())
}

/// Where a (well-formed) chunked body ends.
fn chunked_len(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    loop {
        let line_end = buf[i..].windows(2).position(|w| w == b"\r\n")? + i;
        let size = std::str::from_utf8(&buf[i..line_end]).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        i = line_end + 2;
        if size == 0 {
            let end = buf[i..].windows(4).position(|w| w == b"\r\n\r\n");
            return Some(if buf[i..].starts_with(b"\r\n") {
                i + 2
            } else {
                end? + i + 4
            });
        }
        i += size + 2;
    }
}

// -------------------------------------------------------------- verdicts

/// One shape through one transport.
struct Run {
    shape: usize,
    transport: &'static str,
    ip: Ipv4Addr,
    answers: Answers,
}

/// The proxy's decisions for one client address.
async fn decisions(
    c: &reqwest::Client,
    admin: &str,
    ip: Ipv4Addr,
    api: Option<&str>,
) -> Result<u64, String> {
    let mut body = serde_json::json!({ "ip": ip.to_string() });
    if let Some(api) = api {
        body["api"] = api.into();
    }
    let rule = if api.is_some() { "route" } else { "total" };
    let r = c
        .post(format!("http://{admin}/v1/check"))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
    let remaining = v["rules"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["rule"] == rule))
        .and_then(|r| r["remaining"].as_u64())
        .ok_or_else(|| format!("{status}: {v}"))?;
    // The check itself took one.
    Ok(LIMIT - 1 - remaining)
}

/// At most `max` characters of `s`, for the table.
fn short(s: &str, max: usize) -> String {
    show(s.as_bytes(), max)
}

fn show(bytes: &[u8], max: usize) -> String {
    let mut s = String::new();
    for &b in bytes.iter().take(max) {
        match b {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    if bytes.len() > max {
        s.push_str(&format!("...(+{} bytes)", bytes.len() - max));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_request_reaches_the_upstream_undecided() {
    let shapes = corpus();
    assert!(
        shapes.len() >= 150,
        "the corpus has {} shapes; it should have at least 150",
        shapes.len()
    );
    let (up, rec) = recording_upstream().await;
    let proxies = [
        ("direct", start_proxy(up, true)),
        ("hyper", start_proxy(up, false)),
    ];

    // Every shape through both transports, each from its own address.
    let gate = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::new();
    for (t, (transport, proxy)) in proxies.iter().enumerate() {
        let addr: SocketAddr = proxy.server.addr.parse().unwrap();
        for (i, shape) in shapes.iter().enumerate() {
            let ip = Ipv4Addr::new(127, 70 + t as u8, (i / 250) as u8, (i % 250 + 1) as u8);
            let bytes = shape.bytes.clone();
            let gate = gate.clone();
            let transport: &'static str = transport;
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.unwrap();
                Run {
                    shape: i,
                    transport,
                    ip,
                    answers: send_shape(bytes, addr, ip).await,
                }
            }));
        }
    }
    let mut runs = Vec::new();
    for t in tasks {
        runs.push(t.await.unwrap());
    }

    // Every client connection is over; let the upstream finish what it
    // has (requests being read, connections the proxies are closing).
    let settle = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut last = usize::MAX;
    loop {
        let now = rec.seen.lock().unwrap().len() + rec.errors.lock().unwrap().len();
        if (now == last && rec.in_flight.load(Ordering::SeqCst) == 0)
            || tokio::time::Instant::now() > settle
        {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let seen = rec.seen.lock().unwrap().clone();
    let errors = rec.errors.lock().unwrap().clone();

    // Which run each upstream request belongs to: its X-Forwarded-For,
    // else (a request the proxy did not write) the request before it on
    // the same upstream connection.
    let by_ip: HashMap<String, usize> = runs
        .iter()
        .enumerate()
        .map(|(k, r)| (r.ip.to_string(), k))
        .collect();
    let mut owner: Vec<Option<usize>> = vec![None; seen.len()];
    let mut smuggled = vec![false; seen.len()];
    let mut order: Vec<usize> = (0..seen.len()).collect();
    order.sort_by_key(|&j| (seen[j].conn, seen[j].seq));
    let mut previous: Option<(u64, Option<usize>)> = None;
    for &j in &order {
        let s = &seen[j];
        owner[j] = s.xff.as_ref().and_then(|x| by_ip.get(x).copied());
        if owner[j].is_none() {
            smuggled[j] = true;
            if let Some((conn, o)) = previous
                && conn == s.conn
            {
                owner[j] = o;
            }
        }
        previous = Some((s.conn, owner[j]));
    }
    let mut unowned = Vec::new();
    let mut per_run: Vec<Vec<usize>> = vec![Vec::new(); runs.len()];
    for (j, o) in owner.iter().enumerate() {
        match o {
            Some(k) => per_run[*k].push(j),
            None => unowned.push(j),
        }
    }
    // Upstream parse errors, charged to the last client address on the
    // connection (it is in the proxy's X-Forwarded-For).
    let mut run_errors: Vec<Vec<&UpstreamError>> = vec![Vec::new(); runs.len()];
    let mut unowned_errors = Vec::new();
    for e in errors.iter().filter(|e| e.parse) {
        let text = String::from_utf8_lossy(&e.raw);
        let found = by_ip
            .iter()
            .filter_map(|(ip, k)| {
                text.rfind(&format!("x-forwarded-for: {ip}\r"))
                    .map(|at| (at, *k))
            })
            .max();
        match found {
            Some((_, k)) => run_errors[k].push(e),
            None => unowned_errors.push(e),
        }
    }

    // The verdicts.
    let c = client();
    let mut rows = Vec::new();
    let mut failures = 0;
    for (k, run) in runs.iter().enumerate() {
        let shape = &shapes[run.shape];
        let admin = &proxies
            .iter()
            .find(|p| p.0 == run.transport)
            .unwrap()
            .1
            .admin;
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        let total = decisions(&c, admin, run.ip, None).await;
        let ups: Vec<&Seen> = per_run[k].iter().map(|&j| &seen[j]).collect();
        let mut routes: BTreeMap<(String, String), u64> = BTreeMap::new();
        for s in &ups {
            *routes
                .entry((s.method.clone(), s.path.clone()))
                .or_default() += 1;
        }
        let decided = match total {
            Ok(n) => n,
            Err(e) => {
                problems.push(format!("decisions unknown: {e}"));
                0
            }
        };
        if ups.len() as u64 > decided {
            problems.push(format!(
                "UNDECIDED: the upstream parsed {} request(s), the proxy decided {decided}",
                ups.len()
            ));
        }
        for ((method, path), n) in &routes {
            let api = format!("{method} {path}");
            match decisions(&c, admin, run.ip, Some(&api)).await {
                Ok(d) if d >= *n => {}
                Ok(d) => problems.push(format!(
                    "UNDECIDED ROUTE: {} parsed {n}x upstream, decided {d}x",
                    short(&api, 200)
                )),
                // A route the check API cannot name (too long, say): the
                // total above still counts it.
                Err(e) => notes.push(format!(
                    "{}: route not checkable ({})",
                    short(&api, 60),
                    short(&e, 100)
                )),
            }
        }
        let refused = run
            .answers
            .statuses
            .iter()
            .filter(|(s, _)| *s >= 400)
            .count() as u64;
        let surplus = decided.saturating_sub(ups.len() as u64);
        if surplus > refused {
            problems.push(format!(
                "{surplus} decision(s) neither forwarded nor refused"
            ));
        }
        for j in &per_run[k] {
            if smuggled[*j] {
                problems.push(format!(
                    "SMUGGLED: {} {} reached the upstream without the proxy's X-Forwarded-For",
                    short(&seen[*j].method, 40),
                    short(&seen[*j].target, 200)
                ));
            }
        }
        for e in &run_errors[k] {
            problems.push(format!(
                "the upstream could not parse what the proxy sent on connection {} ({}): {}",
                e.conn,
                e.text,
                show(&e.raw[e.raw.len().saturating_sub(600)..], 600)
            ));
        }
        if let Some(e) = &run.answers.error {
            problems.push(format!("client: {e}"));
        }
        if run.answers.hung {
            notes.push("the proxy did not close the connection".into());
        }
        if run.answers.unparsed > 0 {
            notes.push(format!("{} unparsed answer bytes", run.answers.unparsed));
        }
        let verdict = if !problems.is_empty() {
            failures += 1;
            if shape.known_failure.is_some() {
                "FAIL (known)"
            } else {
                "FAIL"
            }
        } else if ups.is_empty() {
            "refused"
        } else {
            "ok"
        };
        if let Some(k) = &shape.known_failure {
            notes.push(format!("known failure: {k}"));
        }
        let answers: Vec<String> = run
            .answers
            .statuses
            .iter()
            .map(|(s, w)| format!("{s}{w}"))
            .collect();
        let upstream: Vec<String> = ups
            .iter()
            .map(|s| {
                format!(
                    "{} {}{}",
                    short(&s.method, 20),
                    short(&s.path, 40),
                    match &s.body {
                        Ok(0) => String::new(),
                        Ok(n) => format!(" [{n}B]"),
                        Err(e) => format!(" [body: {e}]"),
                    }
                )
            })
            .collect();
        rows.push((
            verdict,
            format!(
                "{:<48} {:<6} {:<12} decided {:<2} answers [{}] upstream [{}]{}{}",
                shape.name,
                run.transport,
                verdict,
                decided,
                answers.join(" "),
                upstream.join(", "),
                problems
                    .iter()
                    .map(|p| format!("\n      !! {p}"))
                    .collect::<String>(),
                notes
                    .iter()
                    .map(|n| format!("\n      -- {n}"))
                    .collect::<String>(),
            ),
        ));
    }
    let table: String = rows.iter().map(|(_, r)| format!("{r}\n")).collect();
    println!("{table}");
    let mut report = String::new();
    for j in unowned {
        let s = &seen[j];
        report.push_str(&format!(
            "!! an upstream request no shape sent: {} {} (x-forwarded-for {:?}, connection {} #{})\n",
            short(&s.method, 40),
            short(&s.target, 200),
            s.xff,
            s.conn,
            s.seq
        ));
    }
    for e in unowned_errors {
        report.push_str(&format!(
            "!! an upstream parse error on a connection no shape owns ({}): {}\n",
            e.text,
            show(&e.raw[e.raw.len().saturating_sub(600)..], 600)
        ));
    }
    let failed: String = rows
        .iter()
        .filter(|(v, _)| v.starts_with("FAIL"))
        .map(|(_, r)| format!("{r}\n"))
        .collect();
    assert!(
        failures == 0 && report.is_empty(),
        "{failures} of {} runs fail the invariant (the upstream parses exactly what the proxy \
         decided, or the proxy refuses):\n{failed}{report}",
        runs.len()
    );
}
