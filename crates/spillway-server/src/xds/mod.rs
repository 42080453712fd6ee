//! Rules over xDS: a state-of-the-world client of the aggregated
//! discovery service (`StreamAggregatedResources`) for envoyproxy/
//! ratelimit's `RateLimitConfig` resources, as ratelimit's
//! `CONFIG_TYPE=GRPC_XDS_SOTW` is (Envoy Gateway pushes its limiter's
//! rules so).
//!
//! The client sends its node (id and metadata) and the resource type;
//! each response holds every resource. The resources are read as
//! envoyproxy/ratelimit files are (its `convert` module, then the file reader and
//! its checks) and composed with the rules file's domains as
//! `--envoy-config` files are. A set that passes is swapped in whole, as a
//! reload swaps rules, and ACKed (its version and nonce); one that fails
//! is NACKed (the last good version, the nonce, and why in
//! `error_detail`) and the last good domains stay in force. A stream that
//! ends or a server that cannot be reached is tried again after a delay
//! that grows (with jitter) up to a bound; the domains in force stay
//! meanwhile, and a new stream asks for the resources again.

mod conn;
mod convert;
pub mod proto;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use prost::Message as _;
use tokio::sync::watch;

pub use conn::{SYSTEM_CA_BUNDLE, split_host};

use crate::grpc::{Domain, Domains};
use proto::{DiscoveryRequest, DiscoveryResponse, Node, RATE_LIMIT_CONFIG_TYPE, Status};

/// How to reach the xDS management server and who to say we are.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `HOST:PORT` (`CONFIG_GRPC_XDS_SERVER_URL`, `serve --xds-server`).
    pub server: String,
    /// The node id the server knows this instance by
    /// (`CONFIG_GRPC_XDS_NODE_ID`).
    pub node_id: String,
    /// The node's metadata, string values (`CONFIG_GRPC_XDS_NODE_METADATA`).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent on the stream
    /// (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// The wait before dialling again when the server cannot be reached
    /// (`CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, 3 s).
    pub connect_retry: Duration,
    /// The first wait after a stream ends; doubled each time, up to
    /// `backoff_max`, and reset once a response applies
    /// (`XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, 10 s; `_MAX_INTERVAL`, 60 s).
    pub backoff_initial: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
    /// Whether each wait is drawn between half and one and a half of it
    /// (`XDS_CLIENT_BACKOFF_JITTER`, on).
    pub jitter: bool,
    /// The largest response accepted, in bytes
    /// (`XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; gRPC's 4 MiB by default).
    pub max_message_bytes: usize,
    /// TLS to the server (`CONFIG_GRPC_XDS_SERVER_USE_TLS`).
    pub tls: Option<ClientTls>,
    /// Whether the service waits for the first configuration before it
    /// serves (ratelimit's default; `FORCE_START_WITHOUT_INITIAL_CONFIG`
    /// turns it off).
    pub wait_initial: bool,
}

impl Settings {
    /// ratelimit's defaults for `server` and `node_id`.
    pub fn new(server: String, node_id: String) -> Settings {
        Settings {
            server,
            node_id,
            node_metadata: Vec::new(),
            headers: Vec::new(),
            connect_retry: Duration::from_secs(3),
            backoff_initial: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
            jitter: true,
            max_message_bytes: 4 << 20,
            tls: None,
            wait_initial: true,
        }
    }
}

/// TLS to the xDS server.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClientTls {
    /// The CA the server's certificate is verified against
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_CACERT`; else [`SYSTEM_CA_BUNDLE`]).
    pub ca: Option<PathBuf>,
    /// A client certificate chain and key, for mutual TLS
    /// (`CONFIG_GRPC_XDS_CLIENT_TLS_CERT`, `_KEY`).
    pub client: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must carry, instead of the host
    /// (`CONFIG_GRPC_XDS_SERVER_TLS_SAN`).
    pub san: Option<String>,
}

/// The gRPC domains in force: the rules file's (replaced by a reload) and
/// those received over xDS (replaced by a response), published together.
#[derive(Debug)]
pub(crate) struct Sources {
    out: Arc<ArcSwap<Domains>>,
    /// The file's domains and the xDS ones.
    both: Mutex<(Vec<Domain>, Vec<Domain>)>,
    merge_domains: bool,
    /// Set once a response has applied.
    loaded: watch::Sender<bool>,
}

impl Sources {
    pub(crate) fn new(
        out: Arc<ArcSwap<Domains>>,
        file: Vec<Domain>,
        merge_domains: bool,
    ) -> Sources {
        Sources {
            out,
            both: Mutex::new((file, Vec::new())),
            merge_domains,
            loaded: watch::channel(false).0,
        }
    }

    /// A reload's domains, beside the xDS ones.
    pub(crate) fn set_file(&self, file: Vec<Domain>) {
        let mut both = self.both.lock();
        both.0 = file;
        self.publish(&both);
    }

    /// A response's resources, each `(name, file text)`: checked, then
    /// in force; else why not.
    fn set_xds(&self, resources: &[(String, String)]) -> Result<(), String> {
        let mut both = self.both.lock();
        let domains = crate::config::xds_domains(&both.0, resources, self.merge_domains)
            .map_err(|e| e.to_string())?;
        both.1 = domains;
        self.publish(&both);
        drop(both);
        self.loaded.send_replace(true);
        Ok(())
    }

    fn publish(&self, both: &(Vec<Domain>, Vec<Domain>)) {
        let all = both.0.iter().chain(&both.1).cloned().collect();
        self.out.store(Arc::new(Domains::new(all)));
    }

    /// Waits until a response has applied, or `stop`.
    pub(crate) async fn first_config(&self, stop: &mut watch::Receiver<bool>) {
        let mut loaded = self.loaded.subscribe();
        tokio::select! {
            _ = loaded.wait_for(|l| *l) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

/// Starts the client when `config` names an xDS server: its domains
/// are published through `out` beside the files'; with
/// [`Settings::wait_initial`], returns once the first configuration has
/// applied (or `stop`), so nothing is served before it. `None` without
/// a server (a reload then publishes the files' domains alone).
pub(crate) async fn start(
    config: &crate::config::Config,
    out: &Arc<ArcSwap<Domains>>,
    stop: &watch::Receiver<bool>,
) -> Option<Arc<Sources>> {
    let settings = config.xds.clone()?;
    let sources = Arc::new(Sources::new(
        out.clone(),
        config.domains.clone(),
        config.merge_domains,
    ));
    let wait = settings.wait_initial;
    tracing::info!(server = %settings.server, node = %settings.node_id, "rate limit configuration over xDS from {}", settings.server);
    tokio::spawn(run(settings, sources.clone(), stop.clone()));
    if wait {
        tracing::info!(
            "waiting for the first xDS configuration (FORCE_START_WITHOUT_INITIAL_CONFIG=true starts without)"
        );
        sources.first_config(&mut stop.clone()).await;
    }
    Some(sources)
}

/// Checks what can be checked before the start (the TLS files): a bad
/// one stops it.
///
/// # Errors
/// Why the settings cannot be used.
pub fn check(settings: &Settings) -> Result<(), String> {
    split_host(&settings.server).map_err(|e| format!("xDS server: {e}"))?;
    if let Some(t) = &settings.tls {
        conn::tls_config(t)?;
    }
    Ok(())
}

/// Runs the client until `stop`, putting what the server sends in force
/// through `sources`.
pub(crate) async fn run(
    settings: Settings,
    sources: Arc<Sources>,
    mut stop: watch::Receiver<bool>,
) {
    let tls = match settings.tls.as_ref().map(conn::tls_config).transpose() {
        Ok(t) => t,
        Err(e) => {
            // Checked at start ([`check`]): a file changed since.
            tracing::error!("xDS client cannot start: {e}");
            return;
        }
    };
    let mut backoff = settings.backoff_initial;
    // The last version put in force: what a NACK names.
    let mut good = String::new();
    loop {
        let outcome = tokio::select! {
            o = session(&settings, tls.as_ref(), &sources, &mut good) => o,
            _ = stop.wait_for(|s| *s) => return,
        };
        let wait = match outcome {
            Ended::Unreachable(e) => {
                tracing::warn!(server = %settings.server, "xDS server unreachable: {e}");
                settings.connect_retry
            }
            Ended::Stream { applied, why } => {
                tracing::warn!(server = %settings.server, "xDS stream ended: {why}");
                if applied {
                    backoff = settings.backoff_initial;
                }
                let w = backoff;
                backoff = (backoff * 2).min(settings.backoff_max);
                w
            }
        };
        let wait = if settings.jitter {
            jittered(wait)
        } else {
            wait
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Why a session ended.
enum Ended {
    /// No connection was made.
    Unreachable(String),
    /// The stream ended; `applied`: a response applied on it.
    Stream { applied: bool, why: String },
}

/// One connection and stream: subscribe, then apply and answer each
/// response until the stream ends.
async fn session(
    settings: &Settings,
    tls: Option<&Arc<rustls::ClientConfig>>,
    sources: &Sources,
    good: &mut String,
) -> Ended {
    let (channel, origin) = match conn::connect(settings, tls).await {
        Ok(c) => c,
        Err(e) => return Ended::Unreachable(e),
    };
    let mut grpc = tonic::client::Grpc::with_origin(channel, origin)
        .max_decoding_message_size(settings.max_message_bytes);
    if let Err(e) = grpc.ready().await {
        return Ended::Unreachable(e.to_string());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<DiscoveryRequest>(4);
    let node = node(settings);
    // The subscription: every resource of the type; on a new stream, the
    // version in force, so a server may skip sending it again.
    let _ = tx
        .send(DiscoveryRequest {
            version_info: good.clone(),
            node: Some(node.clone()),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            ..Default::default()
        })
        .await;
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    for (k, v) in &settings.headers {
        // Checked when the settings were read.
        if let (Ok(k), Ok(v)) = (
            k.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
            v.parse(),
        ) {
            req.metadata_mut().insert(k, v);
        }
    }
    let path = http::uri::PathAndQuery::from_static(proto::STREAM_AGGREGATED_RESOURCES);
    let codec = tonic_prost::ProstCodec::<DiscoveryRequest, DiscoveryResponse>::default();
    let mut stream = match grpc.streaming(req, path, codec).await {
        Ok(r) => r.into_inner(),
        Err(s) => return Ended::Unreachable(format!("StreamAggregatedResources: {s}")),
    };
    tracing::info!(server = %settings.server, node = %settings.node_id, "xDS stream open");
    let mut applied = false;
    loop {
        let resp = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Ended::Stream {
                    applied,
                    why: "closed by the server".into(),
                };
            }
            Err(s) => {
                return Ended::Stream {
                    applied,
                    why: s.to_string(),
                };
            }
        };
        let answer = match apply(&resp, sources) {
            Ok(()) => {
                applied = true;
                good.clone_from(&resp.version_info);
                tracing::info!(version = %resp.version_info, resources = resp.resources.len(), "xDS rate limit configuration applied");
                DiscoveryRequest {
                    version_info: resp.version_info.clone(),
                    response_nonce: resp.nonce.clone(),
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    node: Some(node.clone()),
                    ..Default::default()
                }
            }
            Err(why) => {
                tracing::error!(version = %resp.version_info, "xDS rate limit configuration refused, keeping the last good one ({good:?}):\n{why}");
                DiscoveryRequest {
                    version_info: good.clone(),
                    response_nonce: resp.nonce.clone(),
                    type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                    node: Some(node.clone()),
                    // google.rpc.Code INVALID_ARGUMENT.
                    error_detail: Some(Status {
                        code: 3,
                        message: why,
                    }),
                    ..Default::default()
                }
            }
        };
        if tx.send(answer).await.is_err() {
            return Ended::Stream {
                applied,
                why: "the request stream closed".into(),
            };
        }
    }
}

/// Reads a response's resources and puts them in force, or says why not.
fn apply(resp: &DiscoveryResponse, sources: &Sources) -> Result<(), String> {
    if resp.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!(
            "response of type {:?}, subscribed to {RATE_LIMIT_CONFIG_TYPE}",
            resp.type_url
        ));
    }
    let mut files = Vec::with_capacity(resp.resources.len());
    for (i, any) in resp.resources.iter().enumerate() {
        if any.type_url != RATE_LIMIT_CONFIG_TYPE {
            return Err(format!("resource {i}: of type {:?}", any.type_url));
        }
        let config = proto::RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource {i}: not a RateLimitConfig: {e}"))?;
        let name = if config.name.is_empty() {
            format!("#{i}")
        } else {
            config.name.clone()
        };
        files.push((name, convert::to_file(&config)));
    }
    sources.set_xds(&files)
}

fn node(settings: &Settings) -> Node {
    use crate::grpc::proto::{Struct, Value, value::Kind};
    let metadata = (!settings.node_metadata.is_empty()).then(|| Struct {
        fields: settings
            .node_metadata
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value {
                        kind: Some(Kind::StringValue(v.clone())),
                    },
                )
            })
            .collect(),
    });
    Node {
        id: settings.node_id.clone(),
        cluster: String::new(),
        metadata,
        user_agent_name: "spillway".into(),
    }
}

/// `d` times a factor drawn from [0.5, 1.5).
fn jittered(d: Duration) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(d.as_nanos() as u64);
    // A fraction in [0, 1) from the random keys of a new hasher.
    let f = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(0.5 + f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jittered_wait_stays_within_half_and_one_and_a_half() {
        let d = Duration::from_secs(10);
        for _ in 0..200 {
            let j = jittered(d);
            assert!(j >= d / 2 && j < d * 3 / 2, "{j:?}");
        }
    }

    #[test]
    fn hosts_are_split_as_go_splits_them() {
        assert_eq!(
            split_host("envoy-gateway:18001").unwrap(),
            ("envoy-gateway", 18001)
        );
        assert_eq!(split_host("[::1]:1").unwrap(), ("::1", 1));
        for bad in ["nohost", ":1", "h:x", "grpc://h:1", "a:1,b:2", "::1:5"] {
            assert!(split_host(bad).is_err(), "{bad}");
        }
    }
}
