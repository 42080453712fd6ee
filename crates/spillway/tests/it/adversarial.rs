//! The attack battery ([`spillway_testkit::attack`]) against every
//! listener of the real binary: the decision port (HTTP/1.1 and h2c), the
//! Envoy gRPC port, the admin address, the proxy (HTTP/1.1 and h2c) and
//! its admin address, and TLS on each of the service's. Every attack runs
//! against all of a process's listeners at once, under a lowered
//! descriptor limit, while a legitimate client asks every listener for
//! what it serves: each of its requests must be answered (a decision, a
//! proxied 200, metrics: never a 502, a 503 or silence), and the process's
//! descriptors and memory must stay within the configured budget.
//!
//! Timings are generous for a loaded 2-core machine: a legitimate request
//! may take up to 10 s; what fails is a request not answered at all.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use spillway_testkit::attack::{self, Kind};
use spillway_testkit::upstream::HttpUpstream;

use crate::util::{Server, TempDir, should_rate_limit, tls_endpoint};

/// How long each attack runs.
const ATTACK: Duration = Duration::from_secs(3);

/// The connection budget the servers run with, under a descriptor limit
/// barely above it.
const MAX_CONNECTIONS: usize = 300;
const NOFILE: &str = "--nofile=400:400";

/// Descriptors a process may hold beyond its connection budget
/// (listeners, the runtime, standard streams, files it reads).
const OTHER_DESCRIPTORS: usize = 64;

/// The most memory a server may hold under any attack.
const MAX_RSS: u64 = 256 << 20;

const SERVER: &str = "server: { max_connections: 300, head_timeout: 5s, idle_timeout: 10s, max_streams: 100, max_streams_total: 1000 }";

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

/// A listener under attack.
struct Target {
    addr: SocketAddr,
    /// A path it serves, for the requests the attacks send.
    path: &'static str,
    /// Whether it speaks HTTP/2 without TLS (h2c): the HTTP/2 attacks.
    h2c: bool,
}

impl Target {
    /// A listener that speaks HTTP/2 without TLS besides HTTP/1.1 (or
    /// only, gRPC).
    fn h2c(addr: &str, path: &'static str) -> Target {
        Target {
            addr: addr.parse().unwrap(),
            path,
            h2c: true,
        }
    }
}

/// What a legitimate client asks, and of which listener.
#[derive(Debug, Clone)]
enum Probe {
    /// A decision over HTTP/1.1, a new connection each time.
    Decision(String),
    /// A decision over h2c (prior knowledge).
    DecisionH2(String),
    /// A gateway's call to forward-auth, over HTTP/1.1 and h2c.
    ForwardAuth(String),
    /// A `ShouldRateLimit` call.
    Grpc(String),
    /// `/metrics` on an admin address.
    Admin(String),
    /// A request through the proxy, over HTTP/1.1 and over h2c.
    Proxied(String),
    /// A decision, metrics and a gRPC call over TLS (addresses of the
    /// decision, admin and gRPC listeners).
    Tls {
        decision: String,
        admin: String,
        grpc: String,
        ca: String,
    },
}

/// The legitimate client's address: not the attacker's (127.0.0.1), as
/// in life; streams are shared fairly between addresses.
fn legit_ip() -> std::net::IpAddr {
    std::net::IpAddr::from([127, 0, 0, 2])
}

fn h1() -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(legit_ip())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn h2c() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .local_address(legit_ip())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn status(req: reqwest::RequestBuilder, ok: &[u16]) -> Result<(), String> {
    match req.send().await {
        Ok(r) if ok.contains(&r.status().as_u16()) => Ok(()),
        Ok(r) => Err(format!("answered {}", r.status())),
        Err(e) => Err(format!("not answered: {e:?}")),
    }
}

impl Probe {
    async fn ask(&self) -> Result<(), String> {
        let decided = &[200, 429];
        match self {
            Probe::Decision(a) => {
                status(h1().get(format!("http://{a}/v1/limit?key=legit")), decided).await
            }
            Probe::DecisionH2(a) => {
                status(h2c().get(format!("http://{a}/v1/limit?key=legit")), decided).await
            }
            Probe::ForwardAuth(a) => {
                for c in [h1(), h2c()] {
                    let call = c
                        .get(format!("http://{a}/v1/forward-auth"))
                        .header("x-forwarded-uri", "/legit")
                        .header("x-api-key", "legit");
                    status(call, decided).await?;
                }
                Ok(())
            }
            Probe::Grpc(a) => {
                let ep = tonic::transport::Endpoint::from_shared(format!("http://{a}"))
                    .unwrap()
                    .local_address(Some(legit_ip()))
                    .timeout(Duration::from_secs(10));
                let r = should_rate_limit(ep, "legit").await;
                r.map(|_| ()).map_err(|e| e.to_string())
            }
            Probe::Admin(a) => status(h1().get(format!("http://{a}/metrics")), &[200]).await,
            Probe::Proxied(a) => {
                status(h1().get(format!("http://{a}/legit")), &[200]).await?;
                status(h2c().get(format!("http://{a}/legit")), &[200]).await
            }
            Probe::Tls {
                decision,
                admin,
                grpc: g,
                ca,
            } => {
                let c = reqwest::Client::builder()
                    .use_rustls_tls()
                    .tls_built_in_root_certs(false)
                    .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
                    .local_address(legit_ip())
                    .pool_max_idle_per_host(0)
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
                status(
                    c.get(format!(
                        "https://localhost:{}/v1/limit?key=legit",
                        port(decision)
                    )),
                    decided,
                )
                .await?;
                status(
                    c.get(format!("https://localhost:{}/metrics", port(admin))),
                    &[200],
                )
                .await?;
                let ep = tls_endpoint(g, ca).local_address(Some(legit_ip()));
                let r = should_rate_limit(ep, "legit").await;
                r.map(|_| ()).map_err(|e| e.to_string())
            }
        }
    }
}

/// Connections each attack opens against each target.
fn connections(kind: Kind, targets: usize) -> usize {
    match kind {
        // Half again the budget, spread over the targets: the cap is
        // reached, and so is the descriptor limit.
        Kind::Silent => (MAX_CONNECTIONS * 3 / 2).div_ceil(targets),
        Kind::TrickledHead => 60,
        // Past the cap: connections in a request must make room too.
        Kind::TrickledBody => (MAX_CONNECTIONS * 3 / 2).div_ceil(targets),
        // 12 × 256 streams tried per target, 100 each allowed, against a
        // process-wide bound of 1,000.
        Kind::HeldStreams => 12,
        Kind::RapidReset | Kind::ContinuationFlood | Kind::SettingsFlood | Kind::PingFlood => 4,
    }
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

/// Runs every attack, one after the other, against all `targets` at once
/// while `probes` ask; panics on the first unanswered request and on a
/// budget exceeded.
async fn battery(server: &Server, targets: &[Target], probes: &[Probe], tls_only: bool) {
    raise_own_descriptor_limit();
    let pid = server.pid();
    for kind in Kind::ALL {
        if kind.is_h2() && tls_only {
            continue;
        }
        let aimed: Vec<&Target> = targets.iter().filter(|t| t.h2c || !kind.is_h2()).collect();
        let n = connections(kind, aimed.len());
        let attacks: Vec<_> = aimed
            .iter()
            .map(|t| tokio::spawn(attack::run(kind, t.addr, "localhost", t.path, n, ATTACK)))
            .collect();
        let until = Instant::now() + ATTACK;
        let (mut answered, mut max_fds, mut max_rss) = (0usize, 0usize, 0u64);
        while Instant::now() < until {
            for p in probes {
                let started = Instant::now();
                match tokio::time::timeout(Duration::from_secs(15), p.ask()).await {
                    Ok(Ok(())) => answered += 1,
                    Ok(Err(e)) => panic!("{kind:?}: {p:?}: {e} (after {:?})", started.elapsed()),
                    Err(_) => panic!("{kind:?}: {p:?}: no answer within 15 s"),
                }
            }
            max_fds = max_fds.max(attack::open_descriptors(pid).expect("read /proc/PID/fd"));
            max_rss = max_rss.max(attack::resident_bytes(pid).expect("read /proc/PID/status"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut opened = 0;
        for a in attacks {
            opened += a
                .await
                .unwrap()
                .connections
                .load(std::sync::atomic::Ordering::Relaxed);
        }
        eprintln!(
            "{kind:?}: {opened} attack connections; {answered} legitimate requests answered; at most {max_fds} descriptors, {} MiB",
            max_rss >> 20
        );
        // Protocol warnings are rate-limited: one line per kind per 10 s
        // (under rapid reset, h2 wrote about 1,200 a second).
        let protocol: Vec<String> = server
            .drain_logs()
            .into_iter()
            .filter(|l| {
                l.contains(" h2::") || l.contains(" hyper::") || l.contains(" hyper_util::")
            })
            .collect();
        assert!(
            protocol.len() <= 10,
            "{kind:?}: {} protocol warnings in the log: {:?}",
            protocol.len(),
            &protocol[..protocol.len().min(5)]
        );
        assert!(answered > 0, "{kind:?}: no legitimate request was sent");
        assert!(opened > 0, "{kind:?}: the attack opened no connection");
        assert!(
            max_fds <= MAX_CONNECTIONS + OTHER_DESCRIPTORS,
            "{kind:?}: the server held {max_fds} descriptors, over its budget of {MAX_CONNECTIONS} connections + {OTHER_DESCRIPTORS}"
        );
        assert!(
            max_rss <= MAX_RSS,
            "{kind:?}: the server held {} MiB, over {} MiB",
            max_rss >> 20,
            MAX_RSS >> 20
        );
    }
}

/// `spillway serve` with `yaml` (the [`SERVER`] bounds and [`RULES`]
/// besides), gRPC and admin listeners on free ports, under the lowered
/// descriptor limit; and their addresses.
fn start_service(dir: &TempDir, yaml: &str) -> (Server, String, String) {
    let file = dir.write("rules.yaml", &format!("{SERVER}\n{yaml}\n{RULES}"));
    let s = Server::start_wrapped(
        &["prlimit", NOFILE, "--"],
        "serve",
        &[
            "--config",
            file.to_str().unwrap(),
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let grpc = s.listener("gRPC");
    let admin = s.listener("admin API");
    (s, grpc, admin)
}

fn addr(a: &str) -> SocketAddr {
    a.parse().unwrap()
}

/// The decision port (HTTP/1.1 and h2c), the gRPC port and the admin
/// address of one `spillway serve`, attacked together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_on_the_service_listeners_leaves_legitimate_clients_answered() {
    let dir = TempDir::new("adversarial");
    let (s, grpc_at, admin_at) = start_service(
        &dir,
        "forward_auth: { trusted_proxies: [127.0.0.0/8], user: header:x-api-key }",
    );
    let targets = [
        Target::h2c(&s.addr, "/v1/check"),
        Target::h2c(&s.addr, "/v1/forward-auth/attack"),
        Target::h2c(
            &grpc_at,
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        Target::h2c(&admin_at, "/metrics"),
    ];
    let probes = [
        Probe::Decision(s.addr.clone()),
        Probe::DecisionH2(s.addr.clone()),
        Probe::ForwardAuth(s.addr.clone()),
        Probe::Grpc(grpc_at.clone()),
        Probe::Admin(admin_at.clone()),
    ];
    battery(&s, &targets, &probes, false).await;
}

/// The proxy (HTTP/1.1 and h2c) and its admin address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_on_the_proxy_leaves_legitimate_clients_answered() {
    let up = HttpUpstream::start().await;
    let dir = TempDir::new("adversarial-proxy");
    let file = dir.write(
        "rules.yaml",
        &format!(
            "{SERVER}\nproxy: {{ upstream: {}, timeout: 5s }}\n{RULES}",
            up.url()
        ),
    );
    let s = Server::start_wrapped(
        &["prlimit", NOFILE, "--"],
        "proxy",
        &[
            "--config",
            file.to_str().unwrap(),
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let admin_at = s.listener("admin API");
    let targets = [
        Target::h2c(&s.addr, "/attacker"),
        Target::h2c(&admin_at, "/metrics"),
    ];
    let probes = [
        Probe::Proxied(s.addr.clone()),
        Probe::Admin(admin_at.clone()),
    ];
    battery(&s, &targets, &probes, false).await;
}

/// TLS on the decision, gRPC and admin listeners: connections that never
/// finish their handshake, and heads trickled into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_floods_on_tls_listeners_leave_legitimate_clients_answered() {
    let dir = TempDir::new("adversarial-tls");
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let cert_path = dir.write("cert.pem", &cert.pem());
    let key_path = dir.write("key.pem", &key.serialize_pem());
    let tls = format!(
        "tls: {{ cert: {}, key: {} }}",
        cert_path.display(),
        key_path.display()
    );
    let (s, grpc_at, admin_at) = start_service(&dir, &tls);
    let targets: Vec<Target> = [&s.addr, &grpc_at, &admin_at]
        .into_iter()
        .map(|a| Target {
            addr: addr(a),
            path: "/",
            h2c: false,
        })
        .collect();
    let probes = [Probe::Tls {
        decision: s.addr.clone(),
        admin: admin_at.clone(),
        grpc: grpc_at.clone(),
        ca: cert.pem(),
    }];
    battery(&s, &targets, &probes, true).await;
}
