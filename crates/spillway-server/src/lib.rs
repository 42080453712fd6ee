//! # spillway-server
//!
//! The `spillway` binary's library: configuration, the HTTP API, metrics and
//! hot reload. [`run`] takes its listener and a shutdown future, so tests
//! start it on port 0 in-process; `main` only parses flags and calls it.

pub mod config;
pub mod envoy;
mod fast;
pub mod http;
pub mod metrics;
pub mod proxy;
mod reload;
mod upstream;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use spillway_redis::RedisStore;
use spillway_store::{Checked, Limiter, MemoryConfig, MemoryStore, RuleSet, Store, SystemClock};
use tokio::net::TcpListener;

use crate::config::{Config, Source, StoreConfig};
use crate::metrics::Metrics;

/// The store the server runs on: the closed set of stores, dispatched by match.
#[derive(Debug)]
pub enum ServerStore {
    /// The embedded in-memory store.
    Memory(MemoryStore<SystemClock>),
    /// Redis or Redis Cluster.
    Redis(RedisStore),
}

impl Store for ServerStore {
    async fn decide(
        &self,
        charges: &[spillway_store::Charge<'_>],
        cost: u64,
    ) -> Result<spillway_core::Decision, spillway_store::StoreError> {
        match self {
            ServerStore::Memory(s) => s.decide(charges, cost).await,
            ServerStore::Redis(s) => s.decide(charges, cost).await,
        }
    }

    fn keys(&self) -> Option<usize> {
        match self {
            ServerStore::Memory(s) => s.keys(),
            ServerStore::Redis(_) => None,
        }
    }

    fn maintain(&self) {
        if let ServerStore::Memory(s) = self {
            s.maintain();
        }
    }
}

impl ServerStore {
    /// `None` when healthy, else why not (for readiness).
    pub fn degraded(&self) -> Option<String> {
        match self {
            ServerStore::Memory(_) => None,
            ServerStore::Redis(r) if !r.is_connected() => Some("redis: not connected".into()),
            ServerStore::Redis(r) if !r.is_healthy() => {
                Some(format!("redis: circuit breaker {:?}", r.breaker()))
            }
            ServerStore::Redis(_) => None,
        }
    }

    /// A name for logs.
    pub fn describe(&self) -> String {
        match self {
            ServerStore::Memory(_) => "memory".to_string(),
            ServerStore::Redis(r) => format!("{r:?}"),
        }
    }
}

/// What every request handler shares.
#[derive(Debug)]
pub struct AppState {
    /// Rules and store.
    pub limiter: Arc<Limiter<ServerStore>>,
    /// Counters (shared with the proxy's forwarders).
    pub metrics: Arc<Metrics>,
    /// Outcome of the last reload.
    pub reload: Mutex<ReloadStatus>,
    /// Where rules come from, as shown on `/v1/status`.
    pub source_name: String,
    /// Descriptor trees of the Envoy gRPC API, replaced on reload.
    pub envoy: arc_swap::ArcSwap<envoy::Domains>,
    /// Whether gRPC answers carry RateLimit headers for Envoy to add.
    pub grpc_headers: bool,
}

/// The last reload's result.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// The last rejected file's errors, cleared by a good reload.
    pub last_error: Option<String>,
    /// When rules were last (re)loaded.
    pub last_reload_unix_ms: u64,
}

impl AppState {
    /// Counts a decision, which took `took`, in the metrics.
    pub fn record(&self, checked: &Checked, took: Duration) {
        let version = checked.rules.version;
        if checked.decision.rules.is_empty() {
            self.metrics.count_unlimited();
        }
        for rd in &checked.decision.rules {
            let name = checked.rule(rd).map_or("", |r| r.name());
            self.metrics.count(version, rd.rule, name, rd.outcome);
        }
        if checked.store_error.is_some() {
            self.metrics.store_failed();
        }
        if checked.decision.allowed && checked.decision.wait.as_u64() > 0 {
            self.metrics.delayed(checked.decision.wait.into());
        }
        self.metrics.observe_latency(took);
    }
}

/// Everything `run` needs besides the listener.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where rules come from.
    pub source: Source,
    /// The validated configuration loaded from `source`.
    pub config: Config,
    /// How often to look at the rules file for changes.
    pub poll_interval: Duration,
    /// envoyproxy/ratelimit configuration files (one domain each).
    pub envoy_files: Vec<std::path::PathBuf>,
    /// Where to serve the Envoy gRPC API (the flag, else the file's `grpc_listen`).
    pub grpc_listen: Option<std::net::SocketAddr>,
}

impl ServeOptions {
    /// Loads the rules file (or the built-in example) and every Envoy file.
    ///
    /// # Errors
    /// Every problem in every file.
    pub fn load(
        source: &Source,
        envoy_files: &[std::path::PathBuf],
    ) -> Result<Config, config::ConfigErrors> {
        let mut config = source.load()?;
        let mut errors = Vec::new();
        for f in envoy_files {
            match config::load_envoy(f) {
                Ok(d) => config.domains.push(d),
                Err(e) => errors.extend(e.0),
            }
        }
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(config::ConfigErrors(errors))
        }
    }
}

/// Builds the shared state for `config` (inside a Tokio runtime: the Redis
/// store starts connecting in the background).
///
/// # Errors
/// The store cannot be set up (a Redis URL the client rejects).
pub fn build_state(opts: &ServeOptions) -> Result<Arc<AppState>, spillway_store::StoreError> {
    let store = match &opts.config.store {
        StoreConfig::Memory { max_keys } => ServerStore::Memory(MemoryStore::new(
            SystemClock::new(),
            MemoryConfig {
                max_keys: *max_keys,
                ..MemoryConfig::default()
            },
        )),
        StoreConfig::Redis(cfg) => ServerStore::Redis(RedisStore::new(cfg.clone())?),
    };
    let set = rule_set(&opts.config, 1);
    let metrics = Arc::new(Metrics::new(&set));
    let source_name = match &opts.source {
        Source::File(p) => p.display().to_string(),
        Source::Example => "<built-in examples/rules.yaml>".to_string(),
    };
    Ok(Arc::new(AppState {
        limiter: Arc::new(Limiter::new(store, set)),
        metrics,
        reload: Mutex::new(ReloadStatus {
            last_error: None,
            last_reload_unix_ms: unix_ms(),
        }),
        source_name,
        envoy: arc_swap::ArcSwap::from_pointee(envoy::Domains::new(opts.config.domains.clone())),
        grpc_headers: opts.config.grpc_response_headers,
    }))
}

/// The rule set for `config`, numbered `version`.
pub fn rule_set(config: &Config, version: u64) -> RuleSet {
    let mut set = RuleSet::new(config.rules.clone());
    set.on_store_error = config.on_store_error;
    set.version = version;
    set
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Serves the HTTP API on `listener` until `shutdown` completes, reloading
/// rules when the source file changes or on SIGHUP.
///
/// # Errors
/// The listener fails, or the store cannot be set up.
pub async fn run(
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(opts, listener, None, shutdown, "spillway", |state| {
        (http::router(state.clone()), fast::Direct::Decisions)
    })
    .await
}

/// Serves the reverse proxy on `listener` until `shutdown` completes.
///
/// # Errors
/// As [`run`].
pub async fn run_proxy(
    opts: ServeOptions,
    proxy: proxy::ProxyOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tracing::info!(upstream = %proxy.upstream, "proxying to {}", proxy.upstream);
    // Bound before anything says it listens: a taken port fails the start.
    let admin = match proxy.admin {
        None => None,
        Some(at) => Some(bind(at, "the admin API").await?),
    };
    serve_with(
        opts,
        listener,
        admin,
        shutdown,
        "spillway proxy",
        move |state| {
            // One identity, forwarder and upstream pool for both paths.
            let direct = proxy::DirectProxy::new(state, &proxy);
            (direct.router(), fast::Direct::Proxy(Arc::new(direct)))
        },
    )
    .await
}

async fn serve_with(
    opts: ServeOptions,
    listener: TcpListener,
    admin: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    what: &str,
    app: impl FnOnce(&Arc<AppState>) -> (axum::Router, fast::Direct),
) -> std::io::Result<()> {
    let state = build_state(&opts).map_err(std::io::Error::other)?;
    let addr = listener.local_addr()?;
    // Bound before anything says it listens: a taken port fails the start.
    let grpc_listener = match opts.grpc_listen.or(opts.config.grpc_listen) {
        None => None,
        Some(at) => Some(bind(at, "gRPC").await?),
    };
    let names: Vec<&str> = opts.config.rules.iter().map(|r| r.name()).collect();
    tracing::info!(
        %addr,
        source = %state.source_name,
        store = %state.limiter.store().describe(),
        rules = ?names,
        "{what} listening on http://{addr} with {} rules",
        names.len()
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let reloader = tokio::spawn(reload::watch(state.clone(), opts.clone(), stop_rx.clone()));
    let maintainer = tokio::spawn(maintain(state.clone(), stop_rx));
    let grpc = match grpc_listener {
        None => None,
        Some(listener) => {
            let addr = listener.local_addr()?;
            tracing::info!(%addr, "gRPC (Envoy rate limit service) listening on http://{addr}");
            Some(tokio::spawn(serve_grpc(
                state.clone(),
                listener,
                stopped(&stop_tx),
            )))
        }
    };
    // The HTTP API beside the proxy, for metrics, health and status.
    let admin = match admin {
        None => None,
        Some(listener) => {
            let addr = listener.local_addr()?;
            tracing::info!(%addr, "admin API (metrics, health, status) listening on http://{addr}");
            let app = http::router(state.clone())
                .into_make_service_with_connect_info::<std::net::SocketAddr>();
            let stop = stopped(&stop_tx);
            Some(tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await
                {
                    tracing::error!("admin API stopped: {e}");
                }
            }))
        }
    };
    let (app, direct) = app(&state);
    // Plain HTTP/1.1 directly, the rest by hyper (see `fast`).
    let result = fast::serve(listener, state.clone(), app, direct, shutdown).await;
    let _ = stop_tx.send(true);
    let _ = reloader.await;
    let _ = maintainer.await;
    for task in [grpc, admin].into_iter().flatten() {
        let _ = task.await;
    }
    tracing::info!("spillway stopped");
    result
}

/// Binds `at`, saying what for if it cannot.
async fn bind(at: std::net::SocketAddr, what: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(at).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot listen for {what} on {at}: {e}"))
    })
}

fn stopped(tx: &tokio::sync::watch::Sender<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut rx = tx.subscribe();
    async move {
        let _ = rx.changed().await;
    }
}

/// Serves the Envoy rate limit service and gRPC health on `listener`.
async fn serve_grpc(
    state: Arc<AppState>,
    listener: TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(envoy::proto::SERVICE, tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let result = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(envoy::service::RateLimitService::new(state))
        // No Nagle: answers are small and written when the store replies;
        // behind delayed ACKs they could wait 40 ms.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop,
        )
        .await;
    if let Err(e) = result {
        tracing::error!("gRPC server stopped: {e}");
    }
}

/// Sweeps idle keys once a second, on a blocking thread: a sweep touches
/// every shard and would otherwise stall the requests queued on the worker
/// that runs it (it showed as a 4 ms p99 under load).
async fn maintain(state: Arc<AppState>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let state = state.clone();
                let _ = tokio::task::spawn_blocking(move || state.limiter.store().maintain()).await;
            }
            _ = stop.changed() => return,
        }
    }
}

/// How long [`before_park`] spins.
const PARK_SPIN: std::time::Duration = std::time::Duration::from_micros(2);

/// For a single-threaded runtime's `on_thread_park` hook: while answers
/// are due (proxied requests awaiting their upstream, decisions awaiting a
/// Redis script call; see [`spillway_store::due`]), spin a few microseconds
/// before the event loop sleeps, since the answer is likely to arrive
/// within that time (the loop then finds it without sleeping). Waking a
/// sleeping loop costs the waker's CPU an inter-processor interrupt and a
/// context switch; in the proxy benchmark, where the upstream and the load
/// generator share the other core, those wake-ups were what kept the proxy
/// below nginx's throughput (it slept about six times as often per request
/// as nginx). Nothing due, no spin: the deny path, the memory store and
/// idle servers never spin.
pub fn before_park() {
    if spillway_store::due::answers_due() {
        let start = std::time::Instant::now();
        while start.elapsed() < PARK_SPIN {
            std::hint::spin_loop();
        }
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT: shutting down"),
        () = term => tracing::info!("SIGTERM: shutting down"),
    }
}
