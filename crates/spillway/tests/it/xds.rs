//! Envoy Gateway's limiter slot: the binary started as `ratelimit` with
//! the environment Envoy Gateway gives it, its rules pushed by an xDS
//! management server written here from the protocol (the aggregated
//! discovery service's state-of-the-world stream, ratelimit's
//! `RateLimitConfig` resources), and its Redis variables.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::Stream;
use parking_lot::Mutex;
use prost::Message as _;
use spillway_server::grpc::proto::Code;
use spillway_server::xds::proto::{
    Any, DiscoveryRequest, DiscoveryResponse, RATE_LIMIT_CONFIG_TYPE, RateLimitConfig,
    RateLimitDescriptor, RateLimitPolicy,
};
use spillway_testkit::RedisServer;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::util::{Server, TempDir, should_rate_limit};

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

/// What the management server sends and what it was told.
#[derive(Default)]
struct Ads {
    /// The version and resources in force: sent on every new stream and
    /// on [`Ads::push`].
    current: Mutex<Option<(String, Vec<RateLimitConfig>)>>,
    /// The open stream's sender.
    stream: Mutex<Option<mpsc::UnboundedSender<Result<DiscoveryResponse, Status>>>>,
    /// Every request received, with the stream's metadata.
    seen: Mutex<Option<mpsc::UnboundedSender<(DiscoveryRequest, tonic::metadata::MetadataMap)>>>,
    nonce: AtomicU64,
}

impl Ads {
    fn response(&self, version: &str, configs: &[RateLimitConfig]) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.into(),
            resources: configs
                .iter()
                .map(|c| Any {
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    value: c.encode_to_vec(),
                })
                .collect(),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            nonce: format!("n{}", self.nonce.fetch_add(1, Ordering::SeqCst) + 1),
        }
    }

    /// Puts `configs` in force as `version` and sends them on the open
    /// stream; returns the response's nonce.
    fn push(&self, version: &str, configs: Vec<RateLimitConfig>) -> String {
        let resp = self.response(version, &configs);
        let nonce = resp.nonce.clone();
        *self.current.lock() = Some((version.into(), configs));
        if let Some(s) = self.stream.lock().as_ref() {
            let _ = s.send(Ok(resp));
        }
        nonce
    }

    /// A new stream: its requests are recorded, the resources in force
    /// sent.
    fn open(self: &Arc<Self>, req: Request<Streaming<DiscoveryRequest>>) -> Responses {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some((v, c)) = self.current.lock().clone() {
            let _ = tx.send(Ok(self.response(&v, &c)));
        }
        *self.stream.lock() = Some(tx);
        let meta = req.metadata().clone();
        let mut incoming = req.into_inner();
        let me = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = incoming.message().await {
                if let Some(seen) = me.seen.lock().as_ref() {
                    let _ = seen.send((r, meta.clone()));
                }
            }
        });
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|x| (x, rx))
        }))
    }
}

/// The aggregated discovery service as a tonic service.
#[derive(Clone)]
struct AdsService(Arc<Ads>);

impl tonic::server::NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl tower::Service<http::Request<tonic::body::Body>> for AdsService {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let ads = self.0.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<DiscoveryResponse, DiscoveryRequest>::default();
            let handler = tower::service_fn(move |r: Request<Streaming<DiscoveryRequest>>| {
                let stream = ads.open(r);
                async move { Ok::<_, Status>(Response::new(stream)) }
            });
            Ok(tonic::server::Grpc::new(codec)
                .streaming(handler, req)
                .await)
        })
    }
}

/// A running management server on `addr`, stopped on drop.
struct Running {
    ads: Arc<Ads>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting, then ends the open stream (a graceful shutdown
    /// waits for it), and waits for the server to be gone.
    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.ads.stream.lock().take();
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("the xDS server stops within 30 s")
            .unwrap();
    }
}

/// Serves `ads` on `listener`, over TLS with `tls`.
fn serve(
    ads: &Arc<Ads>,
    listener: tokio::net::TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> Running {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let svc = AdsService(ads.clone());
    let mut builder = tonic::transport::Server::builder();
    if let Some(t) = tls {
        builder = builder.tls_config(t).unwrap();
    }
    let router = builder.add_service(svc);
    let task = tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
    });
    Running {
        ads: ads.clone(),
        stop: Some(tx),
        task,
    }
}

/// One domain, `edge`: `user` limited to `per_minute` a minute (unit
/// `unit`: 2 is MINUTE, 0 is no unit at all).
fn edge(per_minute: u32, unit: i32) -> RateLimitConfig {
    RateLimitConfig {
        name: "edge-config".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: per_minute,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// The next request the server receives.
async fn next(
    rx: &mut mpsc::UnboundedReceiver<(DiscoveryRequest, tonic::metadata::MetadataMap)>,
    server: &Server,
) -> (DiscoveryRequest, tonic::metadata::MetadataMap) {
    match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
        Ok(Some(r)) => r,
        _ => panic!(
            "no request from the xDS client within 30 s; it logged {:#?}",
            server.drain_logs()
        ),
    }
}

fn endpoint(addr: &str) -> tonic::transport::Endpoint {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(10))
}

/// `user`'s answers to `n` calls: OK or OVER_LIMIT each.
async fn answers(addr: &str, user: &str, n: usize) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = should_rate_limit(endpoint(addr), user).await.unwrap();
        out.push(r.overall_code == Code::Ok as i32);
    }
    out
}

fn admitted(first: usize, of: usize) -> Vec<bool> {
    (0..of).map(|i| i < first).collect()
}

/// Envoy Gateway's variables for its limiter
/// (internal/infrastructure/kubernetes/ratelimit/resource.go), on
/// loopback ports: but the certificates (the test with TLS adds them)
/// and Redis (below).
/// `rules`: the rules file the image ships (`rules: []`), beside which
/// the domains are served.
fn envoy_gateway_env(xds: &str, rules: &TempDir) -> Vec<(&'static str, String)> {
    let file = rules.write("ratelimit.yaml", "rules: []\n");
    vec![
        ("SPILLWAY_CONFIG", file.display().to_string()),
        ("RUNTIME_ROOT", "/data".into()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds.into()),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", "0".into()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", "0".into()),
        ("USE_PROMETHEUS", "true".into()),
        ("PROMETHEUS_ADDR", "127.0.0.1:0".into()),
        // Retries within the test's time.
        (
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            "200ms".into(),
        ),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "200ms".into()),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1s".into()),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-tenant:blue".into(),
        ),
    ]
}

fn start(env: &[(&'static str, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start_ratelimit(&env)
}

/// The first configuration applies and is ACKed; a bad one is NACKed with
/// its nonce and the last good version while the last good rules stay; a
/// new version applies and is ACKed; the server going away and coming
/// back on its address is reconnected to and resynced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_over_xds_are_acked_nacked_and_resynced() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let xds_addr = listener.local_addr().unwrap();
    let ads = Arc::new(Ads::default());
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    *ads.seen.lock() = Some(seen_tx);
    ads.push("1", vec![edge(3, 2)]);
    let running = serve(&ads, listener, None);
    // FORCE_START_WITHOUT_INITIAL_CONFIG unset: as ratelimit, nothing is
    // decided before the first configuration.
    let dir = TempDir::new("xds-plain");
    let server = start(&envoy_gateway_env(&xds_addr.to_string(), &dir));

    // The subscription: node id, type, the extra header; then the ACK.
    let (sub, meta) = next(&mut seen, &server).await;
    assert_eq!(sub.node.as_ref().unwrap().id, "envoy-ratelimit");
    assert_eq!(sub.type_url, RATE_LIMIT_CONFIG_TYPE);
    assert_eq!(sub.response_nonce, "");
    assert_eq!(meta.get("x-tenant").unwrap(), "blue");
    // The nonce of the response the stream opened with.
    let (ack, _) = next(&mut seen, &server).await;
    assert_eq!(ack.version_info, "1");
    assert!(ack.response_nonce.starts_with('n'), "{ack:?}");
    assert!(ack.error_detail.is_none());
    let grpc = server.listener("gRPC");
    assert_eq!(answers(&grpc, "a", 4).await, admitted(3, 4));

    // A resource with no unit: refused whole, NACKed, the last good
    // version named; version 1's limit still decides.
    let nonce = ads.push("2", vec![edge(1, 0)]);
    let (nack, _) = next(&mut seen, &server).await;
    assert_eq!(nack.response_nonce, nonce);
    assert_eq!(nack.version_info, "1");
    let why = nack.error_detail.expect("a NACK says why").message;
    assert!(
        why.contains("xds:edge-config") && why.contains("UNKNOWN"),
        "{why}"
    );
    assert_eq!(answers(&grpc, "b", 4).await, admitted(3, 4));

    // A good version: in force, ACKed.
    let nonce = ads.push("3", vec![edge(5, 2)]);
    let (ack, _) = next(&mut seen, &server).await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("3", nonce.as_str())
    );
    assert!(ack.error_detail.is_none());
    assert_eq!(answers(&grpc, "c", 6).await, admitted(5, 6));

    // The server goes away: the rules in force stay.
    running.stop().await;
    assert_eq!(answers(&grpc, "d", 6).await, admitted(5, 6));
    // It comes back on its address with a new version: the client
    // reconnects, says the version it has, and takes the new one.
    ads.push("4", vec![edge(2, 2)]);
    let listener = loop {
        match tokio::net::TcpListener::bind(xds_addr).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let running = serve(&ads, listener, None);
    let (resub, _) = next(&mut seen, &server).await;
    assert_eq!(resub.node.as_ref().unwrap().id, "envoy-ratelimit");
    assert_eq!(resub.version_info, "3");
    assert_eq!(resub.response_nonce, "");
    let (ack, _) = next(&mut seen, &server).await;
    assert_eq!(ack.version_info, "4");
    assert!(ack.error_detail.is_none());
    assert_eq!(answers(&grpc, "e", 3).await, admitted(2, 3));
    running.stop().await;
}

/// TLS to the management server, verified against the CA file and the
/// SAN, with a client certificate the server requires (Envoy Gateway's
/// CONFIG_GRPC_XDS_SERVER_USE_TLS and certificates); and
/// FORCE_START_WITHOUT_INITIAL_CONFIG: the limiter serves before any
/// configuration, and /healthcheck with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
/// fails until one applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_the_xds_server_and_start_without_config() {
    let dir = TempDir::new("xds-tls");
    let ca = crate::certs::ca("xDS test CA");
    let leaf = |names: &[&str]| crate::certs::leaf(&ca, names, crate::certs::Usage::Any);
    let (server_cert, server_key) = leaf(&["envoy-gateway"]);
    // As Envoy Gateway mounts it in /certs: one certificate for the
    // limiter, its client to the xDS server and its gRPC server to Envoy.
    let (client_cert, client_key) = leaf(&["envoy-ratelimit", "localhost"]);
    // Envoy's own, from the same CA.
    let envoy = leaf(&["envoy"]);
    let ca_file = dir.write("ca.crt", &ca.pem);
    let cert_file = dir.write("tls.crt", &client_cert);
    let key_file = dir.write("tls.key", &client_key);
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            &server_cert,
            &server_key,
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(&ca.pem));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let xds_addr = listener.local_addr().unwrap();
    let ads = Arc::new(Ads::default());
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    *ads.seen.lock() = Some(seen_tx);
    let running = serve(&ads, listener, Some(tls));
    let mut env = envoy_gateway_env(&xds_addr.to_string(), &dir);
    env.extend([
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".into()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        (
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            ca_file.display().to_string(),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
            cert_file.display().to_string(),
        ),
        (
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            key_file.display().to_string(),
        ),
        // The server's certificate names envoy-gateway, not 127.0.0.1.
        ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway".into()),
        // Envoy's calls: gRPC with mutual TLS, the CA under Envoy
        // Gateway's name for it.
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", cert_file.display().to_string()),
        ("GRPC_SERVER_TLS_KEY", key_file.display().to_string()),
        ("GRPC_SERVER_TLS_CA_CERT", ca_file.display().to_string()),
    ]);
    let server = start(&env);
    let grpc = server.listener("gRPC");
    let health = crate::util::client()
        .get(server.url("/healthcheck"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(health, 500, "no configuration yet");
    let (sub, _) = next(&mut seen, &server).await;
    assert_eq!(sub.node.unwrap().id, "envoy-ratelimit");
    let nonce = ads.push("1", vec![edge(2, 2)]);
    let (ack, _) = next(&mut seen, &server).await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", nonce.as_str())
    );
    // Envoy with its certificate: exact; a caller without one: refused.
    let tls_endpoint = |identity: Option<&(String, String)>| {
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem))
            .domain_name("localhost");
        if let Some((cert, key)) = identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        let port = grpc.rsplit(':').next().unwrap();
        tonic::transport::Endpoint::from_shared(format!("https://localhost:{port}"))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .tls_config(tls)
            .unwrap()
    };
    let mut seen_codes = Vec::new();
    for _ in 0..3 {
        let r = should_rate_limit(tls_endpoint(Some(&envoy)), "a")
            .await
            .unwrap();
        seen_codes.push(r.overall_code == Code::Ok as i32);
    }
    assert_eq!(seen_codes, admitted(2, 3));
    assert!(
        should_rate_limit(tls_endpoint(None), "a").await.is_err(),
        "a call without a client certificate was answered"
    );
    assert!(
        should_rate_limit(endpoint(&grpc), "a").await.is_err(),
        "a call in clear was answered"
    );
    let health = crate::util::client()
        .get(server.url("/healthcheck"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(health, 200);
    running.stop().await;
}

/// Two limiters started with ratelimit's Redis variables (and a domain
/// file in RUNTIME_ROOT) share one limit through one redis-server: the
/// limit is admitted exactly once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_variables_share_limits_between_instances() {
    let redis = RedisServer::start();
    let dir = TempDir::new("rl-redis");
    std::fs::create_dir_all(dir.0.join("config")).unwrap();
    std::fs::write(
        dir.0.join("config/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 4 }\n",
    )
    .unwrap();
    let redis_url = format!("127.0.0.1:{}", redis.port);
    let root = dir.0.display().to_string();
    let rules = dir.write("ratelimit.yaml", "rules: []\n");
    let rules = rules.display().to_string();
    let env = [
        ("SPILLWAY_CONFIG", rules.as_str()),
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", ""),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis_url.as_str()),
        ("REDIS_POOL_SIZE", "10"),
        ("REDIS_TIMEOUT", "2s"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ];
    let one = Server::start_ratelimit(&env);
    let two = Server::start_ratelimit(&env);
    let (a, b) = (one.listener("gRPC"), two.listener("gRPC"));
    let mut got = Vec::new();
    for i in 0..8 {
        let at = if i % 2 == 0 { &a } else { &b };
        got.extend(answers(at, "shared", 1).await);
    }
    assert_eq!(got, admitted(4, 8));
}

/// `/bin/ratelimit` with ratelimit's Sentinel variables (`REDIS_TYPE=
/// sentinel`, `REDIS_URL` as the master's name, then the sentinels, and
/// both passwords): two limiters find the master through real sentinels
/// and share one limit, admitted exactly once between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_variables_share_limits_through_the_sentinels() {
    let set = spillway_testkit::SentinelSet::start_with_password(Some("s3cret"));
    let dir = TempDir::new("rl-sentinel");
    std::fs::create_dir_all(dir.0.join("config")).unwrap();
    std::fs::write(
        dir.0.join("config/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 4 }\n",
    )
    .unwrap();
    let url = format!(
        "{},{}",
        spillway_testkit::sentinel::MASTER_NAME,
        set.nodes().join(",")
    );
    let root = dir.0.display().to_string();
    let rules = dir.write("ratelimit.yaml", "rules: []\n");
    let rules = rules.display().to_string();
    let env = [
        ("SPILLWAY_CONFIG", rules.as_str()),
        ("RUNTIME_ROOT", root.as_str()),
        ("RUNTIME_SUBDIRECTORY", ""),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_AUTH", "s3cret"),
        ("REDIS_SENTINEL_AUTH", "s3cret"),
        ("REDIS_TIMEOUT", "2s"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", "0"),
    ];
    let one = Server::start_ratelimit(&env);
    let two = Server::start_ratelimit(&env);
    let (a, b) = (one.listener("gRPC"), two.listener("gRPC"));
    // Each has found the master before the count starts.
    for s in [&one, &two] {
        crate::util::eventually("the limiter answers from the master", || async {
            crate::util::client()
                .get(s.url("/healthcheck"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        })
        .await;
    }
    let mut got = Vec::new();
    for i in 0..8 {
        let at = if i % 2 == 0 { &a } else { &b };
        got.extend(answers(at, "shared", 1).await);
    }
    assert_eq!(got, admitted(4, 8));
}
