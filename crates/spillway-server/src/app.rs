//! What the running service is made of and how it starts: the shared
//! handle every way in gets, the state built from the validated settings,
//! and the listeners `run` and `run_proxy` serve until shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use parking_lot::Mutex;
use spillway_redis::RedisStore;
use spillway_store::{Limiter, MemoryConfig, MemoryStore, RuleSet, SystemClock};
use spillway_sync::{Fallback, SyncStore};
use spillway_wire::Handler;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::admin::{AdminState, ReloadStatus};
use crate::config::{self, Config, Source, StoreConfig};
use crate::grpc::GrpcState;
use crate::metrics::Metrics;
use crate::os::unix_ms;
use crate::stopping::{stopping, unready_when_stopping};
use crate::store::ServerStore;
use crate::{admin, api, credentials, grpc, proxy, reload, tls};

/// What every way in shares: the rules and store, and the sink its events
/// (decisions, rejected input, upstream failures) go to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Rules and store.
    pub limiter: Arc<Limiter<ServerStore>>,
    /// Where ways in report what happened (the metrics).
    pub events: Arc<Metrics>,
    /// The Envoy rate limit service's settings (the gRPC API and `/json`).
    pub envoy: Arc<grpc::service::settings::EnvoySettings>,
    /// The service's health as elastic rules read it (set by the admin
    /// plane's tick from reports and the proxy's measurements).
    pub health: Arc<spillway_core::HealthGauge>,
    /// What the proxy measures of its upstream (unknown elsewhere).
    pub measured: Arc<spillway_core::HealthGauge>,
    /// `api.tokens`: with any, the decision listener's decision routes
    /// need one.
    pub api_tokens: credentials::ApiTokens,
    /// OpenTelemetry traces of decisions; `None` (the default) when off,
    /// which a way in checks once per decision.
    pub tracer: Option<Arc<crate::trace::Tracer>>,
}

/// An axum router as the hyper service of one connection (the peer in a
/// `ConnectInfo` extension): the fallback of every listener's direct path.
#[derive(Debug, Clone)]
pub struct Routed {
    router: axum::Router,
    peer: SocketAddr,
}

impl Routed {
    /// `router` for a connection from `peer`.
    pub fn new(router: axum::Router, peer: SocketAddr) -> Routed {
        Routed { router, peer }
    }
}

impl hyper::service::Service<http::Request<spillway_wire::RequestBody>> for Routed {
    type Response = http::Response<axum::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, mut req: http::Request<spillway_wire::RequestBody>) -> Self::Future {
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let router = self.router.clone();
        Box::pin(async move { router.oneshot(req.map(axum::body::Body::new)).await })
    }
}

/// A listener with no direct path: every request goes to `router` (the
/// admin address, the gRPC listener), with the same timeouts, connection
/// budget and stream caps.
#[derive(Debug)]
pub(crate) struct RouterOnly(pub(crate) axum::Router);

impl Handler for RouterOnly {
    type Route = Infallible;
    type Body = axum::body::Body;
    type Fallback = Routed;

    fn max_body(&self) -> usize {
        0
    }

    fn route(&self, _: &spillway_wire::head::RequestHead<'_, '_>) -> Option<Infallible> {
        None
    }

    async fn serve<'a>(
        &'a self,
        route: Infallible,
        _: spillway_wire::Message<'a>,
        _: &'a mut spillway_wire::ClientConn<'_>,
        _: &'a mut Vec<u8>,
    ) -> bool {
        match route {}
    }

    fn refuse(&self, status: http::StatusCode, detail: &str, out: &mut Vec<u8>) {
        crate::json::refuse_problem(status, detail, out);
    }

    fn fallback(&self, peer: SocketAddr) -> Routed {
        Routed::new(self.0.clone(), peer)
    }
}

/// Everything `run` needs besides the listener.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where rules come from.
    pub source: Source,
    /// The validated configuration loaded from `source`, flags applied.
    pub config: Config,
    /// How often to look at the rules file for changes.
    pub poll_interval: Duration,
    /// envoyproxy/ratelimit configuration files and directories.
    pub envoy_files: Vec<std::path::PathBuf>,
    /// The configuration as the files gave it, before flags, without its
    /// rules: what a reload compares start-only settings with. `None`:
    /// the reloader reads the files again for it (a second parse of a
    /// million rules beside the first, at start).
    pub as_read: Option<Arc<Config>>,
    /// A configuration in parts as `config` was read from it (see
    /// [`config::load_all_parts`]): the watcher keeps it, reads only the
    /// files that change, and sees every change made since they were
    /// read. `None`: a single file (or the watcher reads the parts again).
    pub parts: Option<Arc<Mutex<config::RuleFiles>>>,
    /// How long the listeners go on serving once `shutdown` completes,
    /// readiness already failing, before they stop accepting and drain:
    /// the time an orchestrator takes to stop sending new connections
    /// (Kubernetes' endpoint updates). Zero: stop accepting at once.
    pub shutdown_delay: Duration,
}

impl ServeOptions {
    /// Loads the rules file (or the built-in example) and every Envoy
    /// file or directory, as `serve` does (see [`config::load_all`];
    /// a domain given twice is an error unless `merge_domains`).
    ///
    /// # Errors
    /// Every problem in every file.
    pub fn load(
        source: &Source,
        envoy: &[std::path::PathBuf],
        merge_domains: bool,
    ) -> Result<Config, config::ConfigErrors> {
        config::load_all(source, envoy, merge_domains)
    }
}

/// The state of a running server, by who reads it.
#[derive(Debug)]
struct Parts {
    shared: Shared,
    admin: Arc<AdminState>,
    grpc: Arc<GrpcState>,
    /// The certificates the listeners serve, if any.
    tls: tls::Tls,
}

/// Builds the state for `opts` (inside a Tokio runtime: the Redis store
/// starts connecting in the background).
fn build(opts: &ServeOptions) -> Result<Parts, Box<dyn std::error::Error + Send + Sync>> {
    let store = match &opts.config.store {
        StoreConfig::Memory { max_keys } => ServerStore::Memory(MemoryStore::new(
            SystemClock::new(),
            MemoryConfig {
                max_keys: *max_keys,
                ..MemoryConfig::default()
            },
        )),
        StoreConfig::Redis(cfg) if opts.config.shares() => ServerStore::Shared(Fallback::new(
            RedisStore::new(cfg.clone())?,
            spillway_sync::SyncConfig::default().max_keys,
        )),
        StoreConfig::Redis(cfg) => ServerStore::Redis(RedisStore::new(cfg.clone())?),
        StoreConfig::Sync(s) => {
            let home = RedisStore::new(s.redis.clone())?;
            let mut remotes = Vec::with_capacity(s.regions.len());
            for (name, cfg) in &s.regions {
                remotes.push((name.clone(), RedisStore::new(cfg.clone())?));
            }
            ServerStore::Sync(SyncStore::new(s.sync.clone(), home, remotes))
        }
    };
    let health = Arc::new(spillway_core::HealthGauge::new());
    let set = rule_set(&opts.config, 1, &health);
    let tracer = opts.config.traces.as_ref().map(|t| {
        tracing::info!(endpoint = %t.endpoint, protocol = t.protocol.as_str(), "exporting traces");
        Arc::new(crate::trace::Tracer::start(t, store.kind()))
    });
    let shared = Shared {
        events: Arc::new(Metrics::new(&set)),
        limiter: Arc::new(Limiter::new(store, set)),
        envoy: Arc::new(opts.config.envoy.clone()),
        health,
        measured: Arc::new(spillway_core::HealthGauge::new()),
        api_tokens: credentials::ApiTokens::default(),
        tracer,
    };
    if let Some(t) = shared.tracer.clone() {
        let render = move |out: &mut String| t.render(out);
        shared.events.add_gauges(Box::new(render));
    }
    shared.api_tokens.set(opts.config.api.tokens.clone());
    let source_name = match &opts.source {
        Source::File(p) | Source::Dir(p) => p.display().to_string(),
        Source::Example => "<built-in examples/rules.yaml>".to_string(),
    };
    let settings = &opts.config.admin;
    shared.events.set_near_limit(settings.near_limit);
    // With Redis, overrides and plans live there; the file is the memory
    // store's.
    let file = match &shared.limiter.store() {
        ServerStore::Memory(_) => settings.state_file.as_deref(),
        _ => None,
    };
    if file.is_none() && settings.state_file.is_some() {
        tracing::warn!(
            "admin.state_file is not used with a redis store: overrides and plans are kept in redis"
        );
    }
    let assign = admin::assign::Assignments::open(file)
        .map_err(|e| spillway_store::StoreError::new(false, e))?;
    let api_context = crate::reload::api_rules_context(&opts.config);
    let rules_api =
        admin::rules_api::ApiRules::open(&assign, api_context.clone(), shared.health.clone())
            .map_err(|e| spillway_store::StoreError::new(false, e))?;
    let top = Arc::new(admin::top::TopKeys::new(
        settings.top_slots,
        settings.show_keys,
        &shared.limiter.rules(),
    ));
    top.set_enabled(settings.top_keys);
    shared.limiter.set_watch(top.clone());
    let tls = tls::Tls::load(&opts.config.tls)?;
    let admin = Arc::new(AdminState {
        shared: shared.clone(),
        tls_status: admin::StatusFn(Box::new({
            let tls = tls.clone();
            move || tls.status_json()
        })),
        reload: Arc::new(Mutex::new(ReloadStatus {
            last_error: None,
            last_reload_unix_ms: unix_ms(),
            restart_pending: Vec::new(),
            secrets: opts.config.secrets.clone(),
            rules_files: None,
        })),
        source_name,
        settings: arc_swap::ArcSwap::from_pointee(settings.clone()),
        plans: arc_swap::ArcSwap::from_pointee(opts.config.plans.clone()),
        assign,
        rules_api,
        top,
        series: admin::series::Series::new(),
        audit: admin::audit::Audit::new(settings.audit_entries),
        health: Mutex::new(None),
        health_settings: arc_swap::ArcSwap::from_pointee(opts.config.health),
        parse_limits: config::limits_from_json,
        compiling: Mutex::new(None),
    });
    // The API rules kept in the state file, in force from the start.
    admin::rules_api::swap_in(
        &admin,
        rule_set(&opts.config, 1, &shared.health),
        api_context,
    );
    admin.top.rules_changed(&shared.limiter.rules());
    admin.recompile();
    let grpc = Arc::new(GrpcState {
        shared: shared.clone(),
        domains: Arc::new(arc_swap::ArcSwap::from_pointee(grpc::Domains::new(
            opts.config.domains.clone(),
        ))),
        response_headers: opts.config.grpc_response_headers,
        healthy_needs_domains: opts.config.healthy_needs_domains,
    });
    Ok(Parts {
        shared,
        admin,
        grpc,
        tls,
    })
}

/// The rule set for `config`, numbered `version`, its elastic rules
/// reading the service's health from `health`.
pub fn rule_set(
    config: &Config,
    version: u64,
    health: &Arc<spillway_core::HealthGauge>,
) -> RuleSet {
    let rules = config
        .rules
        .iter()
        .map(|r| r.clone().with_health(health.clone()))
        .collect();
    let mut set = RuleSet::with_path_matching(rules, config.path_matching);
    set.on_store_error = config.on_store_error;
    set.version = version;
    set
}

/// Serves the decision API on `listener` until `shutdown` completes,
/// reloading rules when the source file changes or on SIGHUP. The admin
/// endpoints are served beside it, unless `admin_listen` gives them an
/// address of their own.
///
/// # Errors
/// A listener fails, or the store cannot be set up.
pub async fn run(
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::store::preflight(&opts.config.store).await?;
    let parts = build(&opts).map_err(std::io::Error::other)?;
    let (stopping, shutdown) = stopping(shutdown, opts.shutdown_delay);
    let admin_at = opts.config.admin_listen;
    // `api.tokens` close the decision routes (health stays open); the
    // direct path asks the same tokens itself.
    let mut router = api::router(parts.shared.clone())
        .merge(grpc::service::json::router(parts.grpc.clone()))
        .route_layer(axum::middleware::from_fn_with_state(
            parts.shared.api_tokens.clone(),
            credentials::api_gate,
        ));
    if admin_at.is_none() {
        router = router.merge(admin::router(parts.admin.clone()));
    } else {
        router = router.merge(admin::health_router(parts.admin.clone()));
    }
    let forward_auth = Arc::new(api::forward_auth::ForwardAuth::new(
        parts.shared.clone(),
        opts.config.forward_auth.clone(),
    ));
    // Ahead of every route (a path of its own, checked at load): the
    // HTTP/2 and TLS side of the endpoint the direct path serves.
    let router = router
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn_with_state(
            forward_auth.clone(),
            api::forward_auth::ahead,
        ))
        .layer(axum::middleware::from_fn_with_state(
            stopping.clone(),
            unready_when_stopping,
        ));
    let admin = match admin_at {
        None => None,
        Some(at) => {
            let l = bind(at, "the admin API").await?;
            let r = admin::router(parts.admin.clone())
                .fallback(api::not_found)
                .layer(axum::middleware::from_fn_with_state(
                    stopping,
                    unready_when_stopping,
                ));
            Some((l, r))
        }
    };
    let handler = Arc::new(api::direct::DirectApi::new(
        parts.shared.clone(),
        router,
        forward_auth,
    ));
    serve_with(
        opts, listener, parts, admin, shutdown, "spillway", handler, 0,
    )
    .await
}

/// Serves the reverse proxy on `listener` until `shutdown` completes.
///
/// # Errors
/// As [`run`]; also when the settings name no upstream.
pub async fn run_proxy(
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut settings = opts.config.proxy.clone().unwrap_or_default();
    // `admin.listen` (or `admin_listen`) names the proxy's admin
    // listener too when `proxy.admin_listen` does not.
    settings.admin_listen = settings.admin_listen.or(opts.config.admin_listen);
    // Upstream connections: a share of the process's connection budget.
    let server_max = opts.config.server.max_connections;
    let upstream_connections =
        *(settings.max_connections).get_or_insert(proxy::default_upstream_connections(server_max));
    let upstream = settings.upstream.clone().ok_or_else(|| {
        std::io::Error::other("needs --upstream URL (or proxy.upstream in the rules file)")
    })?;
    // The address may come from `${NAME}`: the log shows the reference.
    let shown = opts
        .config
        .secrets
        .redact(&upstream.to_string())
        .into_owned();
    tracing::info!(upstream = %shown, "proxying to {shown}");
    crate::store::preflight(&opts.config.store).await?;
    let parts = build(&opts).map_err(std::io::Error::other)?;
    // Bound before anything says it listens: a taken port fails the start.
    let admin = match settings.admin_listen {
        None => None,
        Some(at) => {
            let l = bind(at, "the admin API").await?;
            // The proxy's own address forwards every path: its admin
            // address serves the whole HTTP API. It is an admin address:
            // with `admin.tokens`, its decision routes need one too (a
            // write token for `/v1/charge`), as everything but health does.
            let decisions = api::router(parts.shared.clone()).route_layer(
                axum::middleware::from_fn_with_state(parts.admin.clone(), admin::decision_gate),
            );
            let r = decisions
                .merge(admin::router(parts.admin.clone()))
                .fallback(api::not_found);
            Some((l, r))
        }
    };
    let proxy = Arc::new(proxy::Proxy::new(
        parts.shared.clone(),
        &settings,
        upstream,
        opts.config.health,
        &opts.config.server,
    ));
    proxy.start_measuring();
    let router = proxy::hyper::HyperProxy::new(proxy.clone()).router();
    let handler = Arc::new(proxy::direct::DirectProxy::new(proxy, router));
    serve_with(
        opts,
        listener,
        parts,
        admin,
        shutdown,
        "spillway proxy",
        handler,
        upstream_connections,
    )
    .await
}

/// Descriptors set aside for each Redis store (home and other regions):
/// one connection per cluster node for up to this many nodes, or a
/// single server's connection with room for reconnecting.
const REDIS_CONNECTIONS: usize = 16;

/// The connections `store` may open, set aside from the budget.
fn store_connections(store: &StoreConfig) -> usize {
    match store {
        StoreConfig::Memory { .. } => 0,
        StoreConfig::Redis(_) => REDIS_CONNECTIONS,
        StoreConfig::Sync(s) => REDIS_CONNECTIONS * (1 + s.regions.len()),
    }
}

/// Serves `handler` on `listener`, and the gRPC and admin listeners
/// beside it, all on one connection budget; `reserved` descriptors of it
/// are set aside for connections the way in opens itself (the proxy's
/// upstream pool).
#[allow(clippy::too_many_arguments)]
async fn serve_with<H: Handler>(
    opts: ServeOptions,
    listener: TcpListener,
    parts: Parts,
    admin: Option<(TcpListener, axum::Router)>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    what: &str,
    handler: Arc<H>,
    reserved: usize,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let limits = opts.config.server;
    // One budget for every listener, and for the connections the process
    // opens itself: no way in can take the descriptors another needs.
    let budget = spillway_wire::Budget::new(limits.max_connections, limits.max_streams_total);
    budget.reserve(store_connections(&opts.config.store));
    budget.reserve(reserved);
    let acceptor =
        |c: &Option<Arc<tls::Certs>>, alpn| c.as_ref().map(|c| c.acceptor(alpn)).transpose();
    let main_tls = acceptor(&parts.tls.listeners, tls::HTTP_ALPN)?;
    let grpc_tls = acceptor(&parts.tls.grpc, tls::GRPC_ALPN)?;
    let admin_tls = acceptor(&parts.tls.admin, tls::HTTP_ALPN)?;
    let scheme = |on: bool| if on { "https" } else { "http" };
    // Bound before anything says it listens: a taken port fails the start.
    let grpc_listener = match &opts.config.grpc_listen {
        None => None,
        Some(at) => Some(grpc::bind(at, grpc_tls.is_some()).await?),
    };
    // SIGHUP's handler, before the line that tells the world we listen.
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    // A name may come from `${NAME}`: the log shows the reference. The
    // first 100 names: a million would make one 20 MB line.
    let names: Vec<String> = opts
        .config
        .rules
        .iter()
        .take(100)
        .map(|r| opts.config.secrets.redact(r.name()).into_owned())
        .collect();
    tracing::info!(
        %addr,
        source = %parts.admin.source_name,
        store = %parts.shared.limiter.store().describe(),
        rules = ?names,
        "{what} listening on {}://{addr} with {} rules",
        scheme(main_tls.is_some()),
        opts.config.rules.len()
    );
    if opts.config.tls.admin.is_some() && admin.is_none() {
        tracing::warn!(
            "admin.tls is set but there is no admin listener (admin.listen): it is not used"
        );
    }
    if matches!(opts.source, Source::Example) {
        tracing::warn!(
            "no --config given: running the built-in DEMO rules (examples/rules.yaml: 10 requests a minute per user on every API, and more). Give --config FILE for your own."
        );
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let cert_watchers = parts.tls.watch(opts.poll_interval, &stop_rx);
    let xds = crate::xds::start(&opts.config, &parts.grpc.domains, &stop_rx).await;
    let reloader = reload::Reloader {
        shared: parts.shared.clone(),
        domains: parts.grpc.domains.clone(),
        status: parts.admin.reload.clone(),
        admin: parts.admin.clone(),
        xds,
        #[cfg(unix)]
        hup,
    };
    // Before any listener serves (below): an edit after it is a change.
    let considered = reload::at_start(&opts);
    let reloader = tokio::spawn(reload::watch(
        reloader,
        opts.clone(),
        considered,
        stop_rx.clone(),
    ));
    let maintainer = tokio::spawn(crate::housekeeping::maintain(
        parts.shared.clone(),
        stop_rx.clone(),
    ));
    let keeper = tokio::spawn(crate::housekeeping::admin_housekeeping(
        parts.admin.clone(),
        stop_rx,
    ));
    let grpc = match grpc_listener {
        None => None,
        Some(listener) => {
            let addr = listener.describe(grpc_tls.is_some());
            tracing::info!(%addr, "gRPC (Envoy rate limit service) listening on {addr}");
            let envoy = &parts.shared.envoy;
            let limits = spillway_wire::Limits {
                max_connection_age: envoy.max_connection_age.filter(|a| !a.is_zero()),
                max_connection_age_grace: envoy.max_connection_age_grace,
                ..limits
            };
            Some(tokio::spawn(grpc::serve(
                parts.grpc.clone(),
                listener,
                limits,
                budget.clone(),
                stopped(&stop_tx),
                grpc_tls,
            )))
        }
    };
    let admin = match admin {
        None => None,
        Some((listener, router)) => {
            let addr = listener.local_addr()?;
            let s = scheme(admin_tls.is_some());
            tracing::info!(%addr, "admin API (metrics, health, status) listening on {s}://{addr}");
            let stop = stopped(&stop_tx);
            let budget = budget.clone();
            Some(tokio::spawn(async move {
                let handler = Arc::new(RouterOnly(router));
                let served =
                    serve_router(&budget, listener, admin_tls, handler, limits, stop).await;
                if let Err(e) = served {
                    tracing::error!("admin API stopped: {e}");
                }
            }))
        }
    };
    // TLS or not, each its own monomorphised accept loop: plain TCP pays
    // nothing for TLS.
    let result = serve_router(&budget, listener, main_tls, handler, limits, shutdown).await;
    let _ = stop_tx.send(true);
    for w in cert_watchers {
        let _ = w.await;
    }
    let _ = reloader.await;
    let _ = maintainer.await;
    let _ = keeper.await;
    for task in [grpc, admin].into_iter().flatten() {
        let _ = task.await;
    }
    if let Some(t) = &parts.shared.tracer {
        t.shutdown().await;
    }
    tracing::info!("spillway stopped");
    result
}

/// Serves `handler` on `listener` on the process's `budget`, over TLS when
/// `tls` is given (each its own monomorphised accept loop).
pub(crate) async fn serve_router<H: Handler>(
    budget: &Arc<spillway_wire::Budget>,
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handler: Arc<H>,
    limits: spillway_wire::Limits,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    match tls {
        Some(a) => {
            let tls = spillway_wire::Tls(a);
            spillway_wire::serve_in(budget, listener, tls, handler, limits, stop).await
        }
        None => {
            let plain = spillway_wire::PlainTcp;
            spillway_wire::serve_in(budget, listener, plain, handler, limits, stop).await
        }
    }
}

/// Binds `at`, saying what for if it cannot.
async fn bind(at: SocketAddr, what: &str) -> std::io::Result<TcpListener> {
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
