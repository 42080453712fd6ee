//! What the exporter and the sampler were told, validated (the
//! environment's `OTEL_*` variables over the rules file's `traces:`;
//! `config/` reads them).

use std::time::Duration;

/// How spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC: `TraceService/Export` over HTTP/2 (with TLS to an
    /// `https://` endpoint).
    Grpc,
    /// OTLP/HTTP with protobuf bodies: `POST /v1/traces`.
    HttpProtobuf,
}

impl Protocol {
    /// As `OTEL_EXPORTER_OTLP_PROTOCOL` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// For a request without a readable caller's span (and, when not
    /// parent-based, for every request): record this share of traces,
    /// 0 to 1, by trace id (`always_on` is 1, `always_off` 0).
    pub ratio: f64,
    /// Follow the caller's `sampled` flag when its `traceparent` is
    /// readable (the `parentbased_*` samplers).
    pub parent_based: bool,
}

impl Default for Sampler {
    /// `parentbased_always_on`, the specification's default.
    fn default() -> Sampler {
        Sampler {
            ratio: 1.0,
            parent_based: true,
        }
    }
}

/// TLS to an `https://` collector: the files named, and the client
/// configuration read from them when the settings were made.
#[derive(Clone)]
pub struct TraceTls {
    /// The CA file the collector's certificate is verified against
    /// (`None`: the system's bundle, [`crate::tls::SYSTEM_CA_BUNDLE`]).
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate and key, for mutual TLS.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// Built from the files (no ALPN: the exporter sets its protocol's).
    pub config: std::sync::Arc<rustls::ClientConfig>,
}

impl PartialEq for TraceTls {
    /// The same files: the same settings (a change of the files' contents
    /// applies at the next start, as every trace setting does).
    fn eq(&self, other: &TraceTls) -> bool {
        self.ca == other.ca && self.client == other.client
    }
}

impl std::fmt::Debug for TraceTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceTls")
            .field("ca", &self.ca)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

/// The validated tracing settings: present only when traces are exported.
/// Its `Debug` hides the headers' values (credentials, often).
#[derive(Clone, PartialEq)]
pub struct TraceSettings {
    /// How spans are sent.
    pub protocol: Protocol,
    /// Where: an `http://` or `https://` URL whose path is the one posted
    /// to (for gRPC, the prefix of the method's path).
    pub endpoint: http::Uri,
    /// TLS, for an `https://` endpoint (and only then).
    pub tls: Option<TraceTls>,
    /// Headers sent with every export (credentials, often: never logged).
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// How long one export may take before it is given up.
    pub timeout: Duration,
    /// Which traces are recorded.
    pub sampler: Sampler,
    /// The resource's attributes, `service.name` first.
    pub resource: Vec<(String, String)>,
    /// Most spans waiting for export; past it spans are dropped (and
    /// counted), never waited for.
    pub max_queue: usize,
    /// Most spans in one export.
    pub max_batch: usize,
    /// How long a span may wait for a batch to fill.
    pub schedule_delay: Duration,
}

impl std::fmt::Debug for TraceSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("TraceSettings")
            .field("protocol", &self.protocol)
            .field("endpoint", &self.endpoint)
            .field("tls", &self.tls)
            .field("headers", &headers)
            .field("timeout", &self.timeout)
            .field("sampler", &self.sampler)
            .field("resource", &self.resource)
            .field("max_queue", &self.max_queue)
            .field("max_batch", &self.max_batch)
            .field("schedule_delay", &self.schedule_delay)
            .finish()
    }
}
