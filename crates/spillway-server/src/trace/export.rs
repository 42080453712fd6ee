//! The exporter: one task that takes finished spans from the bounded
//! queue, batches them (at most `max_batch`, at most `schedule_delay`
//! after the first), and sends one batch at a time to the collector,
//! over TLS to an `https://` one, each export bounded by the timeout. An
//! export that fails for a reason that may pass (no connection, 429,
//! 502, 503, 504; gRPC's UNAVAILABLE and RESOURCE_EXHAUSTED) is tried
//! again after a growing pause, within that same timeout. Spans that
//! arrive while the queue is full are dropped by `Tracer::finish` and
//! counted; an export that still fails drops its batch (counted, logged
//! once per change of state). No decision ever waits for it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prost::Message as _;
use tokio::sync::mpsc::Receiver;

use super::Counts;
use super::proto::{self, ExportTraceServiceRequest, ResourceSpans, ScopeSpans};
use super::settings::{Protocol, TraceSettings};

/// The running exporter: stop it to send what is queued.
#[derive(Debug)]
pub(super) struct Handle {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    timeout: Duration,
}

impl Handle {
    /// Sends what is queued and ends the task, waiting at most the
    /// export timeout (and a second) for it.
    pub(super) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(self.timeout + Duration::from_secs(1), self.task).await;
    }
}

/// Starts the exporter for `settings` on the current runtime.
pub(super) fn spawn(
    settings: &TraceSettings,
    rx: Receiver<proto::Span>,
    counts: Arc<Counts>,
) -> Handle {
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let exporter = Exporter::new(settings, counts);
    let task = tokio::spawn(exporter.run(rx, stopped));
    Handle {
        stop,
        task,
        timeout: settings.timeout,
    }
}

struct Exporter {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    protocol: Protocol,
    uri: http::Uri,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    timeout: Duration,
    max_batch: usize,
    delay: Duration,
    resource: proto::Resource,
    counts: Arc<Counts>,
    /// Whether the last export failed: a failure is logged when it
    /// starts, and the recovery when it ends, not per export.
    failing: bool,
}

impl Exporter {
    fn new(s: &TraceSettings, counts: Arc<Counts>) -> Exporter {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(s.timeout));
        connector.set_nodelay(true);
        // An `https://` URL is not refused by the TCP connector: the TLS
        // one above it takes it.
        connector.enforce_http(false);
        // An `http://` endpoint has no TLS settings and never uses these.
        let tls = s
            .tls
            .as_ref()
            .map_or_else(plain_only, |t| (*t.config).clone());
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http();
        let connector = match s.protocol {
            Protocol::Grpc => https.enable_http2().wrap_connector(connector),
            Protocol::HttpProtobuf => https.enable_http1().wrap_connector(connector),
        };
        let client = Client::builder(TokioExecutor::new())
            .http2_only(s.protocol == Protocol::Grpc)
            .pool_max_idle_per_host(2)
            .build(connector);
        let uri = match s.protocol {
            Protocol::HttpProtobuf => s.endpoint.clone(),
            Protocol::Grpc => {
                let prefix = s.endpoint.path().trim_end_matches('/');
                let mut parts = s.endpoint.clone().into_parts();
                parts.path_and_query = format!("{prefix}{}", proto::EXPORT).parse().ok();
                http::Uri::from_parts(parts).unwrap_or_else(|_| s.endpoint.clone())
            }
        };
        let resource = proto::Resource {
            attributes: s
                .resource
                .iter()
                .map(|(k, v)| proto::KeyValue::string(k, v.as_str()))
                .collect(),
            dropped_attributes_count: 0,
        };
        Exporter {
            client,
            protocol: s.protocol,
            uri,
            headers: s.headers.clone(),
            timeout: s.timeout,
            max_batch: s.max_batch.max(1),
            delay: s.schedule_delay,
            resource,
            counts,
            failing: false,
        }
    }

    async fn run(
        mut self,
        mut rx: Receiver<proto::Span>,
        mut stopped: tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut batch: Vec<proto::Span> = Vec::new();
        let mut tick = tokio::time::interval(self.delay);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                span = rx.recv() => match span {
                    Some(s) => {
                        batch.push(s);
                        if batch.len() >= self.max_batch {
                            self.export(std::mem::take(&mut batch)).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if !batch.is_empty() {
                        self.export(std::mem::take(&mut batch)).await;
                    }
                }
                _ = &mut stopped => break,
            }
        }
        // Stopping: what is queued goes in one last round of batches,
        // unless the collector is failing (the stop would wait for
        // nothing).
        if self.failing {
            let mut n = batch.len() as u64;
            while rx.try_recv().is_ok() {
                n += 1;
            }
            self.counts.dropped.fetch_add(n, Ordering::Relaxed);
            return;
        }
        while let Ok(s) = rx.try_recv() {
            batch.push(s);
            if batch.len() >= self.max_batch {
                self.export(std::mem::take(&mut batch)).await;
            }
        }
        if !batch.is_empty() {
            self.export(batch).await;
        }
    }

    /// Sends `spans` in one request; counts them exported or dropped.
    async fn export(&mut self, spans: Vec<proto::Span>) {
        let n = spans.len() as u64;
        let body = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(proto::InstrumentationScope {
                        name: "spillway".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
        .encode_to_vec();
        let body = Bytes::from(body);
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = FIRST_RETRY;
        let mut last = None;
        let failure = loop {
            match tokio::time::timeout_at(deadline, self.send(body.clone())).await {
                Ok(Ok(())) => break None,
                Ok(Err(Failed { why, retry: false })) => break Some(why),
                Ok(Err(Failed { why, retry: true })) => {
                    // Tried again while the timeout leaves room for it.
                    let again = tokio::time::Instant::now() + jittered(pause);
                    if again >= deadline {
                        break Some(why);
                    }
                    last = Some(why);
                    tokio::time::sleep_until(again).await;
                    pause = (pause * 2).min(LAST_RETRY);
                }
                Err(_) => {
                    let why = format!("no answer within {:?}", self.timeout);
                    break Some(match last {
                        Some(l) => format!("{why} (before that: {l})"),
                        None => why,
                    });
                }
            }
        };
        match failure {
            None => {
                self.counts.exported.fetch_add(n, Ordering::Relaxed);
                if self.failing {
                    self.failing = false;
                    tracing::info!("trace export to {} works again", self.shown());
                }
            }
            Some(e) => {
                self.counts.dropped.fetch_add(n, Ordering::Relaxed);
                self.counts.failed_exports.fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(
                        "trace export to {} failed: {e}; spans are dropped (spillway_trace_spans_dropped_total) until it works",
                        self.shown()
                    );
                }
            }
        }
    }

    /// The endpoint as the log shows it (no user information).
    fn shown(&self) -> String {
        let scheme = self.uri.scheme_str().unwrap_or("http");
        let host = self.uri.authority().map_or("", |a| a.as_str());
        let host = host.rsplit('@').next().unwrap_or(host);
        format!("{scheme}://{host}{}", self.uri.path())
    }

    /// One try at sending `message`.
    async fn send(&self, message: Bytes) -> Result<(), Failed> {
        let mut req = http::Request::post(self.uri.clone());
        let body = match self.protocol {
            Protocol::HttpProtobuf => {
                req = req.header(http::header::CONTENT_TYPE, "application/x-protobuf");
                message
            }
            Protocol::Grpc => {
                req = req
                    .header(http::header::CONTENT_TYPE, "application/grpc")
                    .header(http::header::TE, "trailers");
                // The gRPC message frame: not compressed, length, message.
                let len =
                    u32::try_from(message.len()).map_err(|_| Failed::fatal("batch too large"))?;
                let mut framed = Vec::with_capacity(5 + message.len());
                framed.push(0);
                framed.extend_from_slice(&len.to_be_bytes());
                framed.extend_from_slice(&message);
                Bytes::from(framed)
            }
        };
        for (k, v) in &self.headers {
            req = req.header(k, v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| Failed::fatal(e.to_string()))?;
        // No answer at all (refused, reset): worth another try, as a
        // collector restarting is the common cause. A TLS failure (a
        // certificate refused either way) is not: it would fail the same.
        let resp = self.client.request(req).await.map_err(|e| Failed {
            why: format!("{e} ({})", source_chain(&e)),
            retry: !is_tls_failure(&e),
        })?;
        let status = resp.status();
        let header_status = grpc_status(resp.headers());
        let collected = resp.into_body().collect().await.map_err(|e| Failed {
            why: e.to_string(),
            retry: true,
        })?;
        // OTLP's transient answers: throttled, or the collector (or a
        // proxy before it) unavailable for now.
        let passing = |s: http::StatusCode| matches!(s.as_u16(), 429 | 502 | 503 | 504);
        match self.protocol {
            Protocol::HttpProtobuf if status.is_success() => Ok(()),
            Protocol::HttpProtobuf => Err(Failed {
                why: format!("the collector answered {status}"),
                retry: passing(status),
            }),
            Protocol::Grpc => {
                if !status.is_success() {
                    return Err(Failed {
                        why: format!("the collector answered HTTP {status}"),
                        retry: passing(status),
                    });
                }
                let code = header_status
                    .or_else(|| collected.trailers().and_then(grpc_status))
                    .ok_or_else(|| Failed::fatal("the collector's answer has no grpc-status"))?;
                match code {
                    0 => Ok(()),
                    // RESOURCE_EXHAUSTED, ABORTED, OUT_OF_RANGE,
                    // UNAVAILABLE, DATA_LOSS: OTLP/gRPC's retryable codes
                    // (CANCELLED and DEADLINE_EXCEEDED too).
                    1 | 4 | 8 | 10 | 11 | 14 | 15 => Err(Failed {
                        why: format!("the collector answered grpc-status {code}"),
                        retry: true,
                    }),
                    _ => Err(Failed::fatal(format!(
                        "the collector answered grpc-status {code}"
                    ))),
                }
            }
        }
    }
}

/// The pause before the first retry of an export, and the longest.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// `pause` less up to a half of it, at random: exporters of many
/// instances that failed together do not retry together.
fn jittered(pause: Duration) -> Duration {
    let half = u64::try_from(pause.as_millis() / 2).unwrap_or(0);
    let off = if half == 0 {
        0
    } else {
        super::next_u64() % half
    };
    pause.saturating_sub(Duration::from_millis(off))
}

/// Why an export's try failed, and whether another may do better.
#[derive(Debug)]
struct Failed {
    why: String,
    retry: bool,
}

impl Failed {
    fn fatal(why: impl Into<String>) -> Failed {
        Failed {
            why: why.into(),
            retry: false,
        }
    }
}

/// A client configuration for a collector reached over plain HTTP: the
/// connector needs one, and never uses it.
fn plain_only() -> rustls::ClientConfig {
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap_or_else(|_| rustls::ClientConfig::builder())
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth()
}

fn grpc_status(h: &http::HeaderMap) -> Option<u32> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// Whether `e` comes from TLS itself (rustls refused the peer, or the
/// peer refused us with an alert), somewhere in its chain of sources.
fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut s = Some(e);
    while let Some(x) = s {
        // An `io::Error` carrying one gives the one it carries by
        // `get_ref`: its `source` is that one's source.
        let carried = x
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if x.downcast_ref::<rustls::Error>().is_some()
            || carried.is_some_and(|c| c.downcast_ref::<rustls::Error>().is_some())
        {
            return true;
        }
        s = x.source();
    }
    false
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut s = e.source();
    while let Some(x) = s {
        parts.push(x.to_string());
        s = x.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a source, as hyper's wrap the connector's.
    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error (Connect)")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn tls_failures_are_told_from_a_collector_not_there() {
        let tls = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert!(is_tls_failure(&Wrapped(tls)));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!is_tls_failure(&Wrapped(refused)));
    }
}
