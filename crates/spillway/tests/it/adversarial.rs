//! The adversarial matrix: every listener of the real binary, attacked in
//! every phase a client can stall a connection in (and with the HTTP/2
//! floods), from one address and from many, over IPv4 and IPv6, while a
//! legitimate client asks it what it serves on a fresh connection and on
//! one kept alive from before the attack.
//!
//! The matrix is data: [`ROWS`] (a listener and the protocol spoken to
//! it), [`Phase::ALL`] (from `spillway_testkit::attack`), [`Addrs::ALL`];
//! [`excluded`] is the one rule that leaves cells out, with its reason.
//! Every cell is run by [`cell`], and asserts:
//! - each legitimate client (fresh, kept alive) got a real answer (a
//!   decision, a proxied 200, metrics, `grpc-status: 0`; never a 503, a
//!   reset, a shed kept-alive connection or silence) to at least 95 % of
//!   its requests, each within [`LEGIT_DEADLINE`];
//! - the server's descriptors stayed within its connection budget plus
//!   [`OTHER_DESCRIPTORS`], its memory under [`MAX_RSS`], and its log
//!   without a storm of protocol warnings.
//!
//! A new listener is a new row. One test per row (`adversarial::matrix::decision_h1`,
//! ...), the rows one at a time ([`SERIAL`]: a row already loads both
//! cores); a row's four address sets run side by side, each on its own
//! server, so a cell's attack never shares a budget with another's. A
//! row's failures are collected, every cell run, then reported together
//! with their coordinates: `listener × phase × addresses × legit`.
//!
//! `SPILLWAY_MATRIX_PHASES=head,body_chunked` runs only those phases.
//!
//! Many IPv6 addresses need addresses on `lo` besides `::1`: the test adds
//! them (`ip -6 addr add fd00:5b:1::N/128 dev lo nodad`, root or
//! CAP_NET_ADMIN) and fails, saying how to fix it, when it cannot.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_testkit::attack::{self, Phase, Proto, Req, Target};
use spillway_testkit::legit::{Answer, Legit, Tally};
use spillway_testkit::upstream::HttpUpstream;

use crate::util::{Server, TempDir};

/// A stall's time to fill the budget before the legitimate client asks,
/// and how long the client then asks under attack.
const STALL: (Duration, Duration) = (Duration::from_millis(400), Duration::from_millis(1200));
/// The same for a flood: it costs the server from its first frames, with
/// a few connections that need no time to open.
const FLOOD: (Duration, Duration) = (Duration::from_millis(200), Duration::from_millis(1000));
/// A legitimate request's deadline, connect to last byte: generous for a
/// loaded 2-core machine; what fails is a request not answered at all.
const LEGIT_DEADLINE: Duration = Duration::from_secs(3);
/// The share of a legitimate client's requests that must be answered:
/// one of twenty may miss its deadline (beside two CPU hogs, a fresh
/// client's TLS handshake on the debug build now and then takes past it),
/// while every attack this suite has caught left the client a few
/// percent at most (0 of 200, 1 of 200, 0 of 1).
const ANSWERED: f64 = 0.95;
/// Each legitimate client is this many clients asking side by side, from
/// the same address: twenty requests in the time of five.
const ASKERS: usize = 4;
/// Requests each of them asks at least: fewer than `ASKERS × MIN_ASKED`
/// in a window says nothing.
const MIN_ASKED: u32 = 5;

/// The connection budget the servers run with, under a descriptor limit
/// above it by less than the listeners and runtime need besides: a server
/// that does not keep to its budget runs out of descriptors.
const MAX_CONNECTIONS: usize = 200;
const NOFILE: usize = 300;
/// Descriptors a process may hold beyond its connection budget
/// (listeners, the runtime, standard streams, files it reads).
const OTHER_DESCRIPTORS: usize = 64;
/// The most memory a server may hold under any attack.
const MAX_RSS: u64 = 256 << 20;

const SERVER: &str = "server: { max_connections: 200, head_timeout: 5s, idle_timeout: 10s, max_streams: 100, max_streams_total: 200 }";

const RULES: &str = r#"
rules:
  - name: api
    by: user
    limits:
      - fixed_window: { limit: 1000000, window: 1m }
domains:
  - domain: edge
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 1000000 }
"#;

/// The process a row's listener belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Process {
    /// `spillway serve` with gRPC and admin listeners.
    Service,
    /// The same over TLS.
    ServiceTls,
    /// `spillway proxy` with an admin listener.
    Proxy,
    /// The same over TLS.
    ProxyTls,
}

impl Process {
    fn tls(self) -> bool {
        matches!(self, Process::ServiceTls | Process::ProxyTls)
    }

    fn proxy(self) -> bool {
        matches!(self, Process::Proxy | Process::ProxyTls)
    }
}

/// A listener (or an endpoint with a way in of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listener {
    /// The decision API.
    Decision,
    /// Forward-auth, on the decision listener (`/v1/forward-auth/...`).
    ForwardAuth,
    /// Envoy's rate limit service.
    Grpc,
    /// The admin plane.
    Admin,
    /// The proxy.
    Proxy,
}

/// A row: a listener of a process, and what is spoken to it (by the
/// attack and by the legitimate client alike).
#[derive(Debug)]
struct Row {
    name: &'static str,
    process: Process,
    listener: Listener,
    proto: Proto,
}

/// The rows, and one test for each (`adversarial::matrix::decision_h1`),
/// from one list.
macro_rules! matrix {
    ($($name:ident: $process:ident, $listener:ident, $proto:ident;)*) => {
        /// Every listener.
        const ROWS: &[Row] = &[$(Row {
            name: stringify!($name),
            process: Process::$process,
            listener: Listener::$listener,
            proto: Proto::$proto,
        },)*];

        /// One test per row of the matrix.
        mod matrix {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::matrix_row(stringify!($name)).await;
            }
        )*}
    };
}

// TLS: the decision port (HTTP/1.1 by ALPN), gRPC (h2), admin and the
// proxy (docs/CONFIG.md#tls: `tls:` covers every listener).
matrix! {
    decision_h1: Service, Decision, H1;
    decision_h2c: Service, Decision, H2;
    forward_auth_h1: Service, ForwardAuth, H1;
    forward_auth_h2c: Service, ForwardAuth, H2;
    grpc: Service, Grpc, H2;
    admin_h1: Service, Admin, H1;
    admin_h2c: Service, Admin, H2;
    proxy_h1: Proxy, Proxy, H1;
    proxy_h2c: Proxy, Proxy, H2;
    proxy_admin_h1: Proxy, Admin, H1;
    decision_tls: ServiceTls, Decision, H1;
    grpc_tls: ServiceTls, Grpc, H2;
    admin_tls: ServiceTls, Admin, H1;
    proxy_tls: ProxyTls, Proxy, H1;
}

/// Where the attack comes from (and the legitimate client, never from an
/// attacker's network).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Addrs {
    /// 127.0.0.1.
    V4One,
    /// 256 addresses in two /24s: 127.1.0.1-128 and 127.1.1.1-128.
    V4Many,
    /// ::1.
    V6One,
    /// 256 addresses in two /64s: fd00:5b:1::1-80 and fd00:5b:2::1-80.
    V6Many,
}

impl Addrs {
    const ALL: [Addrs; 4] = [Addrs::V4One, Addrs::V4Many, Addrs::V6One, Addrs::V6Many];

    fn name(self) -> &'static str {
        match self {
            Addrs::V4One => "ipv4_one",
            Addrs::V4Many => "ipv4_many",
            Addrs::V6One => "ipv6_one",
            Addrs::V6Many => "ipv6_many",
        }
    }

    fn v6(self) -> bool {
        matches!(self, Addrs::V6One | Addrs::V6Many)
    }

    fn many(self) -> bool {
        matches!(self, Addrs::V4Many | Addrs::V6Many)
    }

    /// Where the servers listen.
    fn listen(self) -> &'static str {
        if self.v6() { "[::1]:0" } else { "127.0.0.1:0" }
    }

    fn attackers(self) -> Vec<IpAddr> {
        match self {
            Addrs::V4One => vec![Ipv4Addr::LOCALHOST.into()],
            Addrs::V4Many => (0..2u8)
                .flat_map(|net| (1..=128u8).map(move |h| Ipv4Addr::new(127, 1, net, h).into()))
                .collect(),
            Addrs::V6One => vec![Ipv6Addr::LOCALHOST.into()],
            Addrs::V6Many => many_v6(),
        }
    }

    /// The legitimate client's addresses: fresh, kept alive.
    fn legit(self) -> [IpAddr; 2] {
        if self.v6() {
            LEGIT_V6.map(IpAddr::V6)
        } else {
            [Ipv4Addr::new(127, 2, 0, 1), Ipv4Addr::new(127, 2, 0, 2)].map(IpAddr::V4)
        }
    }
}

const LEGIT_V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0x5b, 0xff, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xfd00, 0x5b, 0xff, 0, 0, 0, 0, 2),
];

fn many_v6() -> Vec<IpAddr> {
    (1..=2u16)
        .flat_map(|net| (1..=128u16).map(move |h| Ipv6Addr::new(0xfd00, 0x5b, net, 0, 0, 0, 0, h)))
        .map(IpAddr::V6)
        .collect()
}

/// The cells left out, and why; `None`: the cell runs. The only place
/// that decides it.
fn excluded(row: &Row, phase: Phase, addrs: Addrs) -> Option<&'static str> {
    if phase.needs_tls() && !row.process.tls() {
        return Some("no TLS handshake on a plaintext listener");
    }
    match phase.only_in() {
        Some(Proto::H1) if row.proto == Proto::H2 => {
            return Some("chunked framing is HTTP/1.1's");
        }
        Some(Proto::H2) if row.proto == Proto::H1 => {
            return Some("HTTP/2 frames on an HTTP/1.1 row");
        }
        _ => {}
    }
    if phase.is_flood() && addrs.many() {
        return Some(
            "a flood costs per frame on its few connections: spread over addresses it is the same four connections",
        );
    }
    None
}

/// Connections an attack holds at once.
fn connections(phase: Phase) -> usize {
    if phase.is_flood() {
        4
    } else {
        // Half again the budget: it is full, and must make room.
        MAX_CONNECTIONS * 3 / 2
    }
}

/// One server of a row, for one set of addresses.
struct Lane {
    addrs: Addrs,
    server: Server,
    /// The row's listener.
    at: SocketAddr,
    _dir: TempDir,
}

/// What every server of a row is started with.
struct Setup {
    /// The self-signed certificate (DER) and its files' `tls:` line.
    tls: Option<(Vec<u8>, String)>,
    upstream: Option<HttpUpstream>,
    dir: TempDir,
}

impl Setup {
    async fn new(row: &Row) -> Setup {
        let dir = TempDir::new(&format!("matrix-{}", row.name));
        let tls = row.process.tls().then(|| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
            let c = dir.write("cert.pem", &cert.pem());
            let k = dir.write("key.pem", &key.serialize_pem());
            let line = format!("tls: {{ cert: {}, key: {} }}", c.display(), k.display());
            (cert.der().to_vec(), line)
        });
        let upstream = if row.process.proxy() {
            Some(HttpUpstream::start().await)
        } else {
            None
        };
        Setup { tls, upstream, dir }
    }

    /// The rules file of a process.
    fn config(&self, process: Process) -> String {
        let mut yaml = format!("{SERVER}\n");
        if let Some((_, line)) = &self.tls {
            yaml.push_str(line);
            yaml.push('\n');
        }
        if let Some(up) = &self.upstream {
            yaml.push_str(&format!(
                "proxy: {{ upstream: {}, timeout: 5s }}\n",
                up.url()
            ));
        }
        if !process.proxy() {
            yaml.push_str(
                "forward_auth: { trusted_proxies: [127.0.0.0/8, \"::1/128\", \"fd00::/8\"], user: header:x-api-key }\n",
            );
        }
        yaml.push_str(RULES);
        yaml
    }
}

/// Starts the row's process listening on `addrs`' family, under the
/// lowered descriptor limit; the row's listener's address.
fn start(row: &Row, setup: &Setup, addrs: Addrs) -> (Server, SocketAddr, TempDir) {
    let dir = TempDir::new(&format!("matrix-{}-{}", row.name, addrs.name()));
    let file = dir.write("rules.yaml", &setup.config(row.process));
    let file = file.to_str().unwrap().to_string();
    let at = addrs.listen();
    let mut args = vec!["--config", &file, "--listen", at, "--admin-listen", at];
    if !row.process.proxy() {
        args.extend(["--grpc-listen", at]);
    }
    let sub = if row.process.proxy() {
        "proxy"
    } else {
        "serve"
    };
    let s = Server::start_as_configured(sub, &args);
    let limited = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &s.pid().to_string(),
            &format!("--nofile={NOFILE}:{NOFILE}"),
        ])
        .status()
        .expect("run prlimit (util-linux)");
    assert!(
        limited.success(),
        "prlimit could not lower the server's descriptor limit"
    );
    let listener = match row.listener {
        Listener::Decision | Listener::ForwardAuth | Listener::Proxy => s.addr.clone(),
        Listener::Grpc => s.listener("gRPC"),
        Listener::Admin => s.listener("admin API"),
    };
    let listener = listener.parse().expect("a listening address");
    (s, listener, dir)
}

/// A `ShouldRateLimit` call for `user` in domain `edge`, framed for gRPC.
fn grpc_call(user: &str) -> Req {
    use prost::Message;
    let msg = crate::util::edge_request(user).encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    body.extend(msg);
    Req::send(
        "POST",
        spillway_server::grpc::proto::SHOULD_RATE_LIMIT,
        body,
    )
    .with("content-type", "application/grpc")
    .with("te", "trailers")
}

/// What the row's legitimate client asks and takes for an answer; what
/// the attack asks (answered); what it sends a body to.
fn requests(listener: Listener) -> (Req, Answer, Req, Req) {
    let decided = Answer::Status(vec![200, 429]);
    let json = |method: &str, path: &str| {
        Req::send(method, path, Vec::new()).with("content-type", "application/json")
    };
    match listener {
        Listener::Decision => (
            Req::get("/v1/limit?key=legit"),
            decided,
            Req::get("/v1/limit?key=attack"),
            json("POST", "/v1/check"),
        ),
        Listener::ForwardAuth => (
            Req::get("/v1/forward-auth/legit").with("x-api-key", "legit"),
            decided,
            Req::get("/v1/forward-auth/attack").with("x-api-key", "attack"),
            Req::send("POST", "/v1/forward-auth/upload", Vec::new()).with("x-api-key", "attack"),
        ),
        Listener::Grpc => {
            let upload = grpc_call("attack");
            (
                grpc_call("legit"),
                Answer::Grpc,
                upload.clone(),
                Req {
                    body: Vec::new(),
                    ..upload
                },
            )
        }
        Listener::Admin => (
            Req::get("/metrics"),
            Answer::Status(vec![200]),
            Req::get("/metrics"),
            json("PUT", "/v1/health"),
        ),
        Listener::Proxy => (
            Req::get("/legit"),
            Answer::Status(vec![200]),
            Req::get("/attacker"),
            Req::send("POST", "/upload", Vec::new()),
        ),
    }
}

/// A cell's coordinates and what went wrong in it.
#[derive(Debug)]
struct Failure {
    cell: String,
    what: String,
}

/// A cell's outcome for the table.
struct Outcome {
    line: String,
    failures: Vec<Failure>,
}

/// Runs one cell: `phase` against the lane's listener from its
/// addresses, while the two legitimate clients ask.
async fn cell(row: &Row, setup: &Setup, lane: &Lane, phase: Phase) -> Outcome {
    let coords = format!("{} × {} × {}", row.name, phase.name(), lane.addrs.name());
    let (ask, answer, attack_ask, upload) = requests(row.listener);
    let (authority, root) = match &setup.tls {
        Some((der, _)) => ("localhost".to_string(), Some(der.as_slice())),
        None => (lane.at.to_string(), None),
    };
    let [fresh_ip, kept_ip] = lane.addrs.legit();
    let legit = |source| Legit {
        addr: lane.at,
        source,
        authority: authority.clone(),
        tls: root.map(|der| attack::tls_client(row.proto, Some(der))),
        proto: row.proto,
        req: ask.clone(),
        answer: answer.clone(),
    };
    let (fresh, kept) = (legit(fresh_ip), legit(kept_ip));
    let target = Arc::new(Target {
        addr: lane.at,
        authority: authority.clone(),
        tls: root.map(|_| attack::tls_client(row.proto, None)),
        proto: row.proto,
        ask: attack_ask,
        upload,
    });
    let mut failures = Vec::new();
    let mut fail = |legit: &str, what: String| {
        failures.push(Failure {
            cell: format!("{coords} × {legit}"),
            what,
        });
    };
    let pid = lane.server.pid();
    // The kept-alive client's connections are served once before the
    // attack starts.
    let warm = |_| async {
        let once = async {
            let mut c = kept.connect().await?;
            kept.ask_on(&mut c).await.map(|()| c)
        };
        match tokio::time::timeout(LEGIT_DEADLINE, once).await {
            Ok(r) => r,
            Err(_) => Err("no answer".to_string()),
        }
    };
    let warm = futures_util::future::join_all((0..ASKERS).map(warm)).await;
    let warm: Option<Vec<_>> = match warm.into_iter().collect::<Result<Vec<_>, _>>() {
        Ok(conns) => Some(conns),
        Err(e) => {
            fail("kept_alive", format!("not served before the attack: {e}"));
            None
        }
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    // The attack on a thread and runtime of its own, as an attacker is
    // on machines of its own: its busy tasks never queue the legitimate
    // client's behind them in this runtime.
    let (target, sources, conns) = (target, Arc::new(lane.addrs.attackers()), connections(phase));
    let flood = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the attack's runtime")
            .block_on(attack::run(phase, target, sources, conns, stopped))
    });
    let (ramp, window) = if phase.is_flood() { FLOOD } else { STALL };
    let span = (started + ramp, started + ramp + window);
    let pause = Duration::from_millis(50);
    let together = |tallies: Vec<Tally>| {
        tallies.iter().fold(Tally::default(), |mut all, t| {
            all.merge(t);
            all
        })
    };
    let asking = async {
        let f = futures_util::future::join_all(
            (0..ASKERS).map(|_| fresh.keep_asking(None, span, MIN_ASKED, LEGIT_DEADLINE, pause)),
        );
        let k = async {
            match warm {
                Some(conns) => Some(together(
                    futures_util::future::join_all(conns.into_iter().map(|c| {
                        kept.keep_asking(Some(c), span, MIN_ASKED, LEGIT_DEADLINE, pause)
                    }))
                    .await,
                )),
                None => None,
            }
        };
        let (f, k) = tokio::join!(f, k);
        (together(f), k)
    };
    let mut asking = std::pin::pin!(asking);
    let (mut max_fds, mut max_rss) = (0usize, 0u64);
    let (fresh_tally, kept_tally) = loop {
        max_fds = max_fds.max(attack::open_descriptors(pid).unwrap_or(0));
        max_rss = max_rss.max(attack::resident_bytes(pid).unwrap_or(0));
        tokio::select! {
            t = &mut asking => break t,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    };
    let _ = stop.send(true);
    let report = tokio::task::block_in_place(|| flood.join()).expect("the attack's thread");
    let opened = report
        .connections
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut judge = |name: &str, t: &Tally| {
        if t.share() < ANSWERED {
            fail(
                name,
                format!(
                    "{}/{} answered ({:.0} %): {}",
                    t.answered,
                    t.asked,
                    t.share() * 100.0,
                    t.summary()
                ),
            );
        } else if t.asked < MIN_ASKED * ASKERS as u32 {
            fail(name, format!("asked only {} times", t.asked));
        }
    };
    judge("fresh", &fresh_tally);
    if let Some(k) = &kept_tally {
        judge("kept_alive", k);
    }
    if opened == 0 {
        fail("-", "the attack opened no connection".into());
    }
    if max_fds > MAX_CONNECTIONS + OTHER_DESCRIPTORS {
        fail(
            "-",
            format!(
                "{max_fds} descriptors, over the budget of {MAX_CONNECTIONS} connections + {OTHER_DESCRIPTORS}"
            ),
        );
    }
    if max_rss > MAX_RSS {
        fail(
            "-",
            format!("{} MiB resident, over {} MiB", max_rss >> 20, MAX_RSS >> 20),
        );
    }
    // Protocol warnings are rate-limited: one line per kind per 10 s
    // (under rapid reset, h2 wrote about 1,200 a second).
    let protocol = lane
        .server
        .drain_logs()
        .into_iter()
        .filter(|l| l.contains(" h2::") || l.contains(" hyper::") || l.contains(" hyper_util::"))
        .count();
    if protocol > 10 {
        fail("-", format!("{protocol} protocol warnings in the log"));
    }
    if !alive(pid) {
        fail("-", "the server exited".into());
    }
    let shown = |t: &Option<Tally>| {
        t.as_ref().map_or("-".into(), |t| {
            format!("{}/{} (≤{}ms)", t.answered, t.asked, t.slowest.as_millis())
        })
    };
    let line = format!(
        "{coords}: fresh {} kept {} | {opened} attack conns ({} refused, {} sent), ≤{max_fds} fds, {} MiB, {:.1?}{}",
        shown(&Some(fresh_tally)),
        shown(&kept_tally),
        report.refused.load(std::sync::atomic::Ordering::Relaxed),
        report.sent.load(std::sync::atomic::Ordering::Relaxed),
        max_rss >> 20,
        started.elapsed(),
        if failures.is_empty() { "" } else { "  FAIL" },
    );
    Outcome { line, failures }
}

/// Whether `pid` still runs (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Waits (at most 3 s) for the server's descriptors to fall back near
/// where they were before a cell, or to stop falling (the proxy keeps
/// idle upstream connections for 5 s), so the next cell starts clean.
async fn settle(pid: u32, baseline: usize) {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut last = usize::MAX;
    while Instant::now() < deadline {
        let Some(n) = attack::open_descriptors(pid) else {
            return;
        };
        if n <= baseline + 8 || n >= last {
            return;
        }
        last = n;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Rows run one at a time: one row's four servers and attacks already
/// load two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs every cell of the row named `name`; fails listing every failed
/// cell.
async fn matrix_row(name: &str) {
    let row = ROWS.iter().find(|r| r.name == name).expect("a row of ROWS");
    let _serial = SERIAL.lock().await;
    raise_own_descriptor_limit();
    if let Err(e) = ensure_ipv6_addresses() {
        panic!("{e}");
    }
    let began = Instant::now();
    let setup = Setup::new(row).await;
    // The four servers start side by side (each takes a moment to say
    // where it listens).
    let shared = &setup;
    let mut lanes: Vec<Lane> = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let started: Vec<_> = Addrs::ALL
                .map(|addrs| scope.spawn(move || (addrs, start(row, shared, addrs))))
                .into_iter()
                .collect();
            started
                .into_iter()
                .map(|h| {
                    let (addrs, (server, at, dir)) = h.join().expect("a server started");
                    Lane {
                        addrs,
                        server,
                        at,
                        _dir: dir,
                    }
                })
                .collect()
        })
    });
    let baselines: Vec<usize> = lanes
        .iter()
        .map(|l| attack::open_descriptors(l.server.pid()).unwrap_or(0))
        .collect();
    let mut failures = Vec::new();
    let mut table = Vec::new();
    // `SPILLWAY_MATRIX_PHASES=head,answer_not_read`: only those phases,
    // to look at a few cells while mending them.
    let only = std::env::var("SPILLWAY_MATRIX_PHASES").ok();
    let chosen = |p: Phase| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == p.name()))
    };
    for phase in Phase::ALL.into_iter().filter(|p| chosen(*p)) {
        let mut runs = Vec::new();
        for lane in &lanes {
            match excluded(row, phase, lane.addrs) {
                None => runs.push(cell(row, &setup, lane, phase)),
                Some(why) => table.push(format!(
                    "{} × {} × {}: excluded ({why})",
                    row.name,
                    phase.name(),
                    lane.addrs.name()
                )),
            }
        }
        for o in futures_util::future::join_all(runs).await {
            table.push(o.line);
            failures.extend(o.failures);
        }
        for (i, lane) in lanes.iter_mut().enumerate() {
            if !alive(lane.server.pid()) {
                // The next cell needs a server: a new one.
                let (server, at, dir) =
                    tokio::task::block_in_place(|| start(row, &setup, lane.addrs));
                *lane = Lane {
                    addrs: lane.addrs,
                    server,
                    at,
                    _dir: dir,
                };
            }
            settle(lane.server.pid(), baselines[i]).await;
        }
    }
    drop(setup.dir);
    eprintln!(
        "{} in {:.0?}:\n  {}",
        row.name,
        began.elapsed(),
        table.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{} failed cells of {}:\n  {}",
        failures.len(),
        row.name,
        failures
            .iter()
            .map(|f| format!("{}: {}", f.cell, f.what))
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

/// Lets this test process open the attack's sockets.
fn raise_own_descriptor_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(65_536);
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim);
        }
    }
}

/// Makes sure every IPv6 address the matrix binds is on `lo`: adds the
/// missing ones (`ip -6 addr add ... dev lo nodad`), or says how to.
fn ensure_ipv6_addresses() -> Result<(), String> {
    let wanted: Vec<Ipv6Addr> = many_v6()
        .into_iter()
        .filter_map(|a| match a {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        })
        .chain(LEGIT_V6)
        .collect();
    let bindable = |a: &Ipv6Addr| std::net::TcpListener::bind((*a, 0)).is_ok();
    if std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_err() {
        return Err(
            "IPv6 is off on this machine (no ::1): the matrix's IPv6 cells need it \
             (sysctl -w net.ipv6.conf.lo.disable_ipv6=0)"
                .into(),
        );
    }
    let missing: Vec<&Ipv6Addr> = wanted.iter().filter(|a| !bindable(a)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let script: String = missing
        .iter()
        .map(|a| format!("address add {a}/128 dev lo nodad\n"))
        .collect();
    let how = "run the tests as root (or with CAP_NET_ADMIN) with iproute2 installed \
               (scripts/setup.sh installs it), or add them once: for n in 1 2; do for h in \
               $(seq 1 128); do ip -6 addr add fd00:5b:$n::$(printf %x $h)/128 dev lo nodad; \
               done; done; ip -6 addr add fd00:5b:ff::1/128 dev lo nodad; \
               ip -6 addr add fd00:5b:ff::2/128 dev lo nodad";
    let ran = std::process::Command::new("ip")
        .args(["-6", "-force", "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(script.as_bytes())?;
            c.wait_with_output()
        });
    let said = match ran {
        Ok(out) => String::from_utf8_lossy(&out.stderr)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("cannot run `ip`: {e}"),
    };
    let still: Vec<&&Ipv6Addr> = missing.iter().filter(|a| !bindable(a)).collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the matrix's IPv6 cells need {} addresses on lo that are not there (e.g. {}); \
             adding them failed ({said}): {how}",
            still.len(),
            still[0]
        ))
    }
}

/// The exclusion rule leaves out only what cannot be spoken, and every
/// row keeps the stalls every listener must survive.
#[test]
fn the_rule_excludes_only_what_cannot_apply() {
    for r in ROWS {
        for a in Addrs::ALL {
            for p in [
                Phase::Connect,
                Phase::Head,
                Phase::BodyLength,
                Phase::AnswerNotRead,
            ] {
                assert_eq!(excluded(r, p, a), None, "{} × {p:?} × {a:?}", r.name);
            }
            assert_eq!(
                excluded(r, Phase::TlsHandshake, a).is_none(),
                r.process.tls()
            );
            assert_eq!(
                excluded(r, Phase::StreamHeld, a).is_none(),
                r.proto == Proto::H2
            );
            assert_eq!(
                excluded(r, Phase::BodyChunked, a).is_none(),
                r.proto == Proto::H1
            );
        }
    }
}
