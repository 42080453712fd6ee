//! OpenTelemetry traces, end to end: the real binary exporting to OTLP
//! receivers written here (an HTTP server decoding `POST /v1/traces`, a
//! tonic gRPC `TraceService/Export`), a decision on every way in (the
//! decision API, forward-auth, the proxy, Envoy's gRPC API) a span child
//! of the caller's `traceparent`; sampling off exports none; a collector
//! that is down or silent delays no decision; an `https://` collector
//! with mutual TLS, and exports tried again after a 503; bad settings
//! stop the start.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use spillway_server::trace::proto::{
    ExportTraceServiceRequest, ExportTraceServiceResponse, KeyValue, Span, Value,
};
use spillway_testkit::upstream::HttpUpstream;

use crate::util::{Server, TempDir, client};

/// Spans a receiver got, with the headers of each export.
#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<Span>>>,
    headers: Arc<Mutex<Vec<http::HeaderMap>>>,
}

impl Received {
    fn take(&self, req: ExportTraceServiceRequest, headers: &http::HeaderMap) {
        self.headers.lock().unwrap().push(headers.clone());
        let mut spans = self.spans.lock().unwrap();
        for rs in req.resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (30 s at most) for a span named `name` in trace `trace_id`.
    async fn span(&self, name: &str, trace_id: &[u8]) -> Span {
        let start = Instant::now();
        loop {
            if let Some(s) = self
                .spans()
                .into_iter()
                .find(|s| s.name == name && s.trace_id == trace_id)
            {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no span {name} in trace {}; got {:#?}",
                hex(trace_id),
                self.spans()
                    .iter()
                    .map(|s| (&s.name, hex(&s.trace_id)))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// OTLP/HTTP: `POST /v1/traces` with a protobuf body.
async fn http_collector() -> (SocketAddr, Received) {
    let got = Received::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: http::HeaderMap, body: bytes::Bytes| {
            let seen = seen.clone();
            async move {
                assert_eq!(headers["content-type"], "application/x-protobuf");
                let req = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                seen.take(req, &headers);
                let ok = ExportTraceServiceResponse::default().encode_to_vec();
                ([("content-type", "application/x-protobuf")], ok)
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    (addr, got)
}

/// OTLP/gRPC: tonic's server side of `TraceService/Export`.
#[derive(Clone)]
struct TraceService(Received);

impl tonic::server::NamedService for TraceService {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

struct Export(Received);

impl tonic::server::UnaryService<ExportTraceServiceRequest> for Export {
    type Response = ExportTraceServiceResponse;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status>,
                > + Send,
        >,
    >;

    fn call(&mut self, req: tonic::Request<ExportTraceServiceRequest>) -> Self::Future {
        let headers = req.metadata().clone().into_headers();
        self.0.take(req.into_inner(), &headers);
        Box::pin(async { Ok(tonic::Response::new(ExportTraceServiceResponse::default())) })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for TraceService {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        assert_eq!(
            req.uri().path(),
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
        );
        let export = Export(self.0.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(export, req).await)
        })
    }
}

async fn grpc_collector() -> (SocketAddr, Received) {
    let got = Received::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let svc = TraceService(got.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let svc = tower::ServiceExt::map_request(
                    svc,
                    |r: http::Request<hyper::body::Incoming>| r.map(tonic::body::Body::new),
                );
                let svc = hyper_util::service::TowerToHyperService::new(svc);
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
            });
        }
    });
    (addr, got)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A caller's `traceparent`, with its trace and span ids, all distinct
/// per `n`.
fn caller(n: u8) -> (String, Vec<u8>, Vec<u8>) {
    let trace: Vec<u8> = (0..16)
        .map(|i| n.wrapping_mul(17).wrapping_add(i))
        .collect();
    let span: Vec<u8> = (0..8).map(|i| n.wrapping_add(100 + i)).collect();
    (format!("00-{}-{}-01", hex(&trace), hex(&span)), trace, span)
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn string_attr(s: &Span, key: &str) -> String {
    match attr(s, key) {
        Some(Value::StringValue(v)) => v.clone(),
        other => panic!("{key}: {other:?} in {:#?}", s.attributes),
    }
}

fn strings_attr(s: &Span, key: &str) -> Vec<String> {
    match attr(s, key) {
        Some(Value::ArrayValue(a)) => a
            .values
            .iter()
            .filter_map(|v| match &v.value {
                Some(Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        other => panic!("{key}: {other:?}"),
    }
}

/// Asserts `s` is a child of the caller's span `(trace, parent)`.
fn child_of(s: &Span, trace: &[u8], parent: &[u8]) {
    assert_eq!(s.trace_id, trace, "{}", s.name);
    assert_eq!(s.parent_span_id, parent, "{}", s.name);
    assert_eq!(s.span_id.len(), 8);
    assert_ne!(s.span_id, parent);
    assert!(s.end_time_unix_nano >= s.start_time_unix_nano && s.start_time_unix_nano > 0);
    assert_eq!(s.kind, 2, "a server span");
}

const RULES: &str = r#"
forward_auth: {}
rules:
  - name: per-user
    api: /hello
    by: user
    limits:
      - fixed_window: { limit: 1, window: 1h }
  - name: per-key
    by: user
    limits:
      - fixed_window: { limit: 100, window: 1h }
domains:
  - domain: edge
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 5 }
"#;

const PROXY_RULES: &str = r#"
rules:
  - name: per-key
    by: user
    limits:
      - fixed_window: { limit: 100, window: 1h }
"#;

/// Environment for a server exporting to `collector` over `protocol`,
/// in batches at most 100 ms old.
fn otel_env(collector: SocketAddr, protocol: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}")),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ("OTEL_SERVICE_NAME", "spillway-under-test".into()),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-collector-token=abc%20def".into(),
        ),
    ]
}

fn serve(dir: &TempDir, rules: &str, env: &[(&'static str, String)]) -> Server {
    let file = dir.write("rules.yaml", rules);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start_env(
        &[
            "--config",
            file.to_str().unwrap(),
            "--grpc-listen",
            "127.0.0.1:0",
        ],
        &env,
    )
}

/// One `ShouldRateLimit` for `user` on `addr`, with `traceparent` metadata.
async fn should_rate_limit(addr: &str, user: &str, traceparent: &str) {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(crate::util::edge_request(user));
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let path =
        http::uri::PathAndQuery::from_static(spillway_server::grpc::proto::SHOULD_RATE_LIMIT);
    let r: tonic::Response<spillway_server::grpc::proto::RateLimitResponse> = grpc
        .unary(req, path, tonic_prost::ProstCodec::default())
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, 1);
}

/// The decision API, forward-auth and gRPC on `serve`, and the proxy:
/// each decision a span in the caller's trace, under the caller's span.
async fn every_way_in(protocol: &str) {
    let (collector, got) = if protocol == "grpc" {
        grpc_collector().await
    } else {
        http_collector().await
    };
    let dir = TempDir::new("otel");
    let s = serve(&dir, RULES, &otel_env(collector, protocol));
    let c = client();

    // POST /v1/check, allowed then denied.
    let (tp, trace, parent) = caller(1);
    let body = r#"{"api": "GET /hello", "user": "alice"}"#;
    let r = c
        .post(s.url("/v1/check"))
        .header("traceparent", &tp)
        .body(body);
    assert_eq!(r.send().await.unwrap().status(), 200);
    let span = got.span("spillway.check", &trace).await;
    child_of(&span, &trace, &parent);
    assert_eq!(string_attr(&span, "spillway.decision"), "allowed");
    assert_eq!(string_attr(&span, "spillway.store"), "memory");
    assert_eq!(
        strings_attr(&span, "spillway.rules"),
        ["per-user", "per-key"]
    );
    let (tp, trace, parent) = caller(2);
    let r = c
        .post(s.url("/v1/check"))
        .header("traceparent", &tp)
        .body(body);
    assert_eq!(r.send().await.unwrap().status(), 429);
    let span = got.span("spillway.check", &trace).await;
    child_of(&span, &trace, &parent);
    assert_eq!(string_attr(&span, "spillway.decision"), "denied");
    assert_eq!(string_attr(&span, "spillway.rule"), "per-user");
    // The key's value is in no span.
    let all = format!("{:?}", got.spans());
    assert!(!all.contains("alice"), "a key's value was exported");

    // Forward-auth.
    let (tp, trace, parent) = caller(3);
    let r = c
        .get(s.url("/v1/forward-auth/things"))
        .header("traceparent", &tp)
        .header("tracestate", "vendor=opaque");
    assert_eq!(r.send().await.unwrap().status(), 200);
    let span = got.span("spillway.forward_auth", &trace).await;
    child_of(&span, &trace, &parent);
    assert_eq!(span.trace_state, "vendor=opaque");

    // Envoy's gRPC API, the traceparent in the call's metadata.
    let (tp, trace, parent) = caller(4);
    should_rate_limit(&s.listener("gRPC"), "bob", &tp).await;
    let span = got.span("envoy.ShouldRateLimit", &trace).await;
    child_of(&span, &trace, &parent);
    assert_eq!(string_attr(&span, "envoy.domain"), "edge");
    assert_eq!(string_attr(&span, "spillway.decision"), "allowed");
    assert!(!format!("{span:?}").contains("bob"));

    // A malformed traceparent starts a new trace: the request is decided.
    let r = c
        .post(s.url("/v1/check"))
        .header("traceparent", "00-zzz-not-one-01")
        .body(r#"{"api": "GET /other", "user": "carol"}"#);
    assert_eq!(r.send().await.unwrap().status(), 200);
    crate::util::eventually("a span of a new trace", || {
        let got = got.clone();
        async move {
            got.spans()
                .iter()
                .any(|s| s.name == "spillway.check" && s.parent_span_id.is_empty())
        }
    })
    .await;

    // The resource and the exporter's headers.
    let h = got.headers.lock().unwrap()[0].clone();
    assert_eq!(h["x-collector-token"], "abc def");

    // The proxy, on both of its transports.
    let up = HttpUpstream::start().await;
    let proxy_rules = format!(
        "proxy:\n  upstream: {}\n  user: header:x-api-key\n{PROXY_RULES}",
        up.url()
    );
    let pdir = TempDir::new("otel-proxy");
    let file = pdir.write("rules.yaml", &proxy_rules);
    let env = otel_env(collector, protocol);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let p = Server::start_env_cmd("proxy", &["--config", file.to_str().unwrap()], &env);
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for (n, client, path) in [(5, &c, "/direct"), (6, &h2, "/hyper")] {
        let (tp, trace, parent) = caller(n);
        let r = client
            .get(p.url(path))
            .header("x-api-key", "k1")
            .header("traceparent", &tp)
            .header("tracestate", "a=b");
        assert_eq!(r.send().await.unwrap().status(), 200, "{path}");
        let span = got.span("spillway.proxy", &trace).await;
        child_of(&span, &trace, &parent);
        // The upstream's parent is spillway's span; the state goes on.
        let seen = up.requests_to(path);
        let header = |name: &str| {
            seen[0]
                .headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .collect::<Vec<_>>()
        };
        let sent = format!("00-{}-{}-01", hex(&trace), hex(&span.span_id));
        assert_eq!(header("traceparent"), [sent], "{path}");
        assert_eq!(header("tracestate"), ["a=b"], "{path}");
    }
}

#[tokio::test]
async fn every_way_in_exports_over_otlp_http() {
    every_way_in("http/protobuf").await;
}

#[tokio::test]
async fn every_way_in_exports_over_otlp_grpc() {
    every_way_in("grpc").await;
}

/// `always_off` exports nothing, and a caller's unsampled trace is not
/// recorded by the default parent-based sampler; the proxy then passes
/// the caller's `traceparent` on unchanged.
#[tokio::test]
async fn unsampled_traces_export_nothing() {
    let (collector, got) = http_collector().await;
    let dir = TempDir::new("otel-off");
    let mut env = otel_env(collector, "http/protobuf");
    env.push(("OTEL_TRACES_SAMPLER", "always_off".into()));
    let s = serve(&dir, RULES, &env);
    let c = client();
    let (tp, _, _) = caller(7);
    for _ in 0..5 {
        let r = c
            .post(s.url("/v1/check"))
            .header("traceparent", &tp)
            .body("{}");
        assert_eq!(r.send().await.unwrap().status(), 200);
    }
    drop(s);

    let up = HttpUpstream::start().await;
    let pdir = TempDir::new("otel-unsampled");
    let file = pdir.write(
        "rules.yaml",
        &format!("proxy:\n  upstream: {}\n{PROXY_RULES}", up.url()),
    );
    let env = otel_env(collector, "http/protobuf");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let p = Server::start_env_cmd("proxy", &["--config", file.to_str().unwrap()], &env);
    let unsampled = format!("{}-00", &tp[..52]);
    let r = c.get(p.url("/x")).header("traceparent", &unsampled);
    assert_eq!(r.send().await.unwrap().status(), 200);
    let seen = up.requests_to("/x");
    let sent: Vec<&String> = seen[0]
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(sent, [&unsampled]);
    // A sampled one after it is exported: the unsampled ones had their
    // chance (the exporter sends every 100 ms).
    let (tp, trace, _) = caller(8);
    let r = c.get(p.url("/y")).header("traceparent", &tp);
    assert_eq!(r.send().await.unwrap().status(), 200);
    got.span("spillway.proxy", &trace).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(got.spans().len(), 1, "{:#?}", got.spans());
}

/// A collector that is gone, or accepts and never answers: decisions are
/// answered as fast as ever (the export's 20 s timeout is never waited
/// for), and the spans that could not wait are counted as dropped.
#[tokio::test]
async fn a_down_or_silent_collector_delays_no_decision() {
    // Silent: accepts connections and never reads or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    // Gone: a port nothing listens on.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for (collector, protocol) in [(silent_addr, "grpc"), (gone, "http/protobuf")] {
        let dir = TempDir::new("otel-down");
        let mut env = otel_env(collector, protocol);
        env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "20000".into()));
        env.push(("OTEL_BSP_MAX_QUEUE_SIZE", "16".into()));
        env.push(("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4".into()));
        let s = serve(&dir, RULES, &env);
        let c = client();
        let started = Instant::now();
        for i in 0..300 {
            let r = c
                .post(s.url("/v1/check"))
                .body(format!(r#"{{"user": "u{i}"}}"#));
            assert_eq!(r.send().await.unwrap().status(), 200);
        }
        // 300 decisions, well under one export timeout (20 s) in all.
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "{protocol}: {took:?}");
        let metrics = c
            .get(s.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let dropped = metrics
            .lines()
            .find_map(|l| l.strip_prefix("spillway_trace_spans_dropped_total "))
            .unwrap_or_else(|| panic!("no dropped count in {metrics}"));
        assert!(dropped.parse::<u64>().unwrap() > 0, "{protocol}: {dropped}");
        // It stops promptly too: the last export is bounded.
        s.signal("TERM");
        let mut s = s;
        assert_eq!(s.wait_exit(Duration::from_secs(40)), Some(0), "{protocol}");
    }
    drop(silent);
}

/// A collector over mutual TLS: its certificate (for `localhost`) from
/// `ca`, and a client certificate from `ca` required. Its first
/// `unavailable` exports are answered 503 (a collector restarting);
/// the count of exports it got comes back too.
async fn tls_collector(
    protocol: &str,
    ca: &crate::certs::Ca,
    unavailable: usize,
) -> (SocketAddr, Received, Arc<std::sync::atomic::AtomicUsize>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (cert, key) = crate::certs::leaf(ca, &["localhost"], crate::certs::Usage::Server);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            chain,
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let got = Received::default();
    let exports = Arc::new(AtomicUsize::new(0));
    let app = if protocol == "grpc" {
        let svc = tower::ServiceExt::map_request(
            TraceService(got.clone()),
            |r: http::Request<axum::body::Body>| r.map(tonic::body::Body::new),
        );
        axum::Router::new().route_service(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            svc,
        )
    } else {
        let seen = got.clone();
        axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: http::HeaderMap, body: bytes::Bytes| {
                let seen = seen.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                    seen.take(req, &headers);
                    let ok = ExportTraceServiceResponse::default().encode_to_vec();
                    ([("content-type", "application/x-protobuf")], ok)
                }
            }),
        )
    };
    let counted = exports.clone();
    let app = app.layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            let counted = counted.clone();
            async move {
                if counted.fetch_add(1, Ordering::SeqCst) < unavailable {
                    return axum::response::IntoResponse::into_response(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                    );
                }
                next.run(req).await
            }
        },
    ));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client without a certificate fails here.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                .await;
            });
        }
    });
    (addr, got, exports)
}

/// `spillway_trace_spans_dropped_total` of `s`.
async fn dropped(s: &Server) -> u64 {
    let metrics = client()
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("spillway_trace_spans_dropped_total "))
        .unwrap_or_else(|| panic!("no dropped count in {metrics}"))
        .parse()
        .unwrap()
}

/// An `https://` collector asking for a client certificate, over both
/// protocols: the CA and the client certificate from the `OTEL_*`
/// variables; two exports answered 503 are tried again, and nothing is
/// dropped. Without the client certificate the handshake fails, and the
/// spans are counted dropped while decisions go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_collectors_with_mutual_tls_and_retries() {
    let root = crate::certs::ca("collector CA");
    let (cert, key) = crate::certs::leaf(&root, &["spillway"], crate::certs::Usage::Client);
    let dir = TempDir::new("otel-tls");
    let ca_file = dir.write("ca.pem", &root.pem);
    let cert_file = dir.write("client.pem", &cert);
    let key_file = dir.write("client.key", &key);
    for (n, protocol) in ["http/protobuf", "grpc"].into_iter().enumerate() {
        let (collector, got, exports) = tls_collector(protocol, &root, 2).await;
        let mut env = otel_env(collector, protocol);
        env[0].1 = format!("https://localhost:{}", collector.port());
        env.extend([
            (
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                ca_file.display().to_string(),
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                cert_file.display().to_string(),
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                key_file.display().to_string(),
            ),
        ]);
        let s = serve(&dir, RULES, &env);
        let (tp, trace, parent) = caller(20 + u8::try_from(n).unwrap());
        let r = client()
            .post(s.url("/v1/check"))
            .header("traceparent", &tp)
            .body(r#"{"api": "GET /hello", "user": "alice"}"#);
        assert_eq!(r.send().await.unwrap().status(), 200);
        let span = got.span("spillway.check", &trace).await;
        child_of(&span, &trace, &parent);
        assert!(
            exports.load(std::sync::atomic::Ordering::SeqCst) >= 3,
            "{protocol}: the two 503s were not tried again"
        );
        assert_eq!(dropped(&s).await, 0, "{protocol}");
        drop(s);

        // No client certificate: refused at the handshake.
        let (collector, got, _) = tls_collector(protocol, &root, 0).await;
        let mut env = otel_env(collector, protocol);
        env[0].1 = format!("https://localhost:{}", collector.port());
        env.push((
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            ca_file.display().to_string(),
        ));
        env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "1000".into()));
        let s = serve(&dir, RULES, &env);
        let started = Instant::now();
        for i in 0..20 {
            let r = client()
                .post(s.url("/v1/check"))
                .body(format!(r#"{{"user": "u{i}"}}"#));
            assert_eq!(r.send().await.unwrap().status(), 200);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{protocol}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while dropped(&s).await == 0 {
            assert!(Instant::now() < deadline, "{protocol}: nothing dropped");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(got.spans().is_empty(), "{protocol}");
    }
}

/// What spillway cannot honour stops the start, naming the variable or
/// the file's line.
#[test]
fn bad_settings_stop_the_start() {
    let dir = TempDir::new("otel-bad");
    let ok = dir.write("ok.yaml", "rules: []\n");
    let bad = dir.write("bad.yaml", "rules: []\ntraces:\n  protocol: thrift\n");
    for (file, env, says) in [
        (
            &ok,
            vec![
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_TRACES_SAMPLER", "sometimes"),
            ],
            "OTEL_TRACES_SAMPLER=\"sometimes\"",
        ),
        (
            &ok,
            vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")],
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ),
        (
            &ok,
            vec![("OTEL_TRACES_EXPORTER", "jaeger")],
            "OTEL_TRACES_EXPORTER=\"jaeger\"",
        ),
        (
            &ok,
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such/ca.pem"),
            ],
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ),
        (&bad, vec![], "bad.yaml:3:"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(file)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?}: started; {err}");
        assert!(err.contains(says), "{env:?}: {err}");
    }
}
