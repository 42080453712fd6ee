//! `spillway serve` and `spillway proxy`: the flags laid over the rules
//! file's validated settings, the runtime, and the listeners.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use spillway_server::config::{Config, LogFormat, Source};
use spillway_server::proxy::{UpstreamUrl, UserSource};
use spillway_server::{ServeOptions, run, run_proxy, shutdown_signal};

use crate::cli::TlsFlags;
use crate::logging::{fatal, init as init_logging};

/// What the flags of `serve` and `proxy` say.
pub(crate) struct Flags {
    /// `--tls-cert` and `--tls-key`.
    pub(crate) tls: TlsFlags,
    pub(crate) config: Option<PathBuf>,
    pub(crate) listen: Option<SocketAddr>,
    pub(crate) grpc_listen: Option<spillway_server::grpc::GrpcListen>,
    /// Started as `ratelimit` (the image's `/bin/ratelimit`): ratelimit's
    /// defaults apply where the environment and file say nothing
    /// (`GRPC_MAX_CONNECTION_AGE` 24h), and `GRPC_UDS` replaces the
    /// `--grpc-listen` made from `GRPC_HOST:GRPC_PORT`, as in ratelimit.
    pub(crate) as_ratelimit: bool,
    pub(crate) envoy_files: Vec<PathBuf>,
    pub(crate) merge_domains: bool,
    pub(crate) threads: Option<u16>,
    pub(crate) admin_listen: Option<SocketAddr>,
    /// `Some` for `proxy`: its upstream and user flags.
    pub(crate) proxy: Option<(Option<String>, Option<String>)>,
    /// `--log-format`, which wins over the file's.
    pub(crate) log_format: Option<LogFormat>,
    /// `--shutdown-delay` (`serve`; zero for `proxy`).
    pub(crate) shutdown_delay: Duration,
    /// What the `ratelimit` entry's environment lays over the file.
    pub(crate) overlay: Option<spillway_server::config::Overlay>,
}

/// envoyproxy/ratelimit's `GRPC_MAX_CONNECTION_AGE` default, which the
/// `ratelimit` entry keeps (`spillway serve` sets no age unless told).
const RATELIMIT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(24 * 3600);

/// `MERGE_DOMAIN_CONFIG`, read as envoyproxy/ratelimit reads it (Go's
/// `strconv.ParseBool`: 1, t, T, TRUE, true, True are true).
pub(crate) fn merge_domain_config_env() -> bool {
    std::env::var("MERGE_DOMAIN_CONFIG")
        .is_ok_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True"))
}

/// Lays the flags over the file's validated settings.
fn apply_flags(cfg: &mut Config, flags: &Flags) -> Result<(), String> {
    if let (Some(cert), Some(key)) = (&flags.tls.tls_cert, &flags.tls.tls_key) {
        // The flags name the pair; client certificates stay as the file
        // asks (`tls.client_ca`, `tls.client_san`).
        let (client_ca, client_san) = cfg
            .tls
            .listeners
            .take()
            .map(|f| (f.client_ca, f.client_san))
            .unwrap_or_default();
        cfg.tls.listeners = Some(spillway_server::config::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            named_by: "--tls-cert/--tls-key".into(),
            client_ca,
            client_san,
        });
    }
    if let Some(a) = &flags.grpc_listen
        && !(flags.as_ratelimit && cfg.envoy.grpc_uds.is_some())
    {
        cfg.grpc_listen = Some(a.clone());
    }
    if flags.as_ratelimit && cfg.envoy.max_connection_age.is_none() {
        cfg.envoy.max_connection_age = Some(RATELIMIT_MAX_CONNECTION_AGE);
    }
    match &flags.proxy {
        None => {
            if let Some(a) = flags.admin_listen {
                cfg.admin_listen = Some(a);
            }
            if let Some(a) = flags.listen {
                cfg.listen = Some(a);
            }
        }
        Some((upstream, user)) => {
            // A proxy serves no gRPC; its `listen` comes first from its
            // own section, so one file can serve the API on `listen` and
            // proxy on `proxy.listen`.
            cfg.grpc_listen = None;
            let p = cfg.proxy.get_or_insert_with(Default::default);
            if let Some(u) = upstream {
                p.upstream = Some(UpstreamUrl::parse(u)?);
            }
            if let Some(u) = user {
                p.user = Some(UserSource::parse(u)?);
            }
            if let Some(a) = flags.admin_listen {
                p.admin_listen = Some(a);
            }
            if p.upstream.is_none() {
                return Err("needs --upstream URL (or proxy.upstream in the rules file)".into());
            }
            cfg.listen = flags.listen.or(p.listen).or(cfg.listen);
        }
    }
    Ok(())
}

/// Runs `serve`, or `proxy` when the flags carry its settings.
pub(crate) fn serve(flags: Flags) -> ExitCode {
    // Before the file is read: the default connection cap follows it.
    spillway_server::raise_descriptor_limit();
    let source = flags
        .config
        .clone()
        .map_or(Source::Example, Source::of_path);
    let loaded = spillway_server::config::load_all_parts(
        &source,
        &flags.envoy_files,
        flags.merge_domains,
        &spillway_server::config::Preread::default(),
    );
    // Logging starts once the file has said how; nothing logs before.
    let format = flags
        .log_format
        .or_else(|| loaded.as_ref().ok().and_then(|(c, _)| c.log_format))
        .unwrap_or_default();
    init_logging(format);
    let (mut cfg, parts) = match loaded {
        Ok(c) => c,
        Err(e) => {
            fatal(format, &e.to_string());
            return ExitCode::from(2);
        }
    };
    // The file as read, for the reloader's start-only comparison (flags
    // are not file changes); the rules are not needed there.
    let as_read = {
        let rules = std::mem::take(&mut cfg.rules);
        let read = std::sync::Arc::new(cfg.clone());
        cfg.rules = rules;
        read
    };
    if let Some(overlay) = flags.overlay.clone()
        && let Err(e) = overlay.apply(&mut cfg)
    {
        fatal(format, &cfg.secrets.redact(&format!("ratelimit: {e}")));
        return ExitCode::from(2);
    }
    if let Err(e) = apply_flags(&mut cfg, &flags) {
        let what = if flags.proxy.is_some() {
            "spillway proxy"
        } else {
            "spillway serve"
        };
        fatal(format, &cfg.secrets.redact(&format!("{what}: {e}")));
        return ExitCode::from(2);
    }
    // Certificate and key files: a bad one is a configuration error (its
    // path may come from `${NAME}`).
    if let Err(e) = cfg.tls.check() {
        fatal(format, &cfg.secrets.redact(&e.to_string()));
        return ExitCode::from(2);
    }
    let addr = cfg
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    // One thread: a current-thread runtime, which skips the work-stealing
    // scheduler's bookkeeping (one event loop, like an nginx worker).
    let mut builder = if flags.threads == Some(1) {
        let mut b = tokio::runtime::Builder::new_current_thread();
        b.on_thread_park(spillway_server::before_park);
        b
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = flags.threads {
            b.worker_threads(usize::from(n));
        }
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            fatal(format, &format!("cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let secrets = cfg.secrets.clone();
    let opts = ServeOptions {
        source,
        config: cfg,
        poll_interval: Duration::from_millis(500),
        envoy_files: flags.envoy_files,
        as_read: Some(as_read),
        parts: parts.map(|p| std::sync::Arc::new(parking_lot::Mutex::new(p))),
        shutdown_delay: flags.shutdown_delay,
    };
    let proxy = flags.proxy.is_some();
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        if proxy {
            run_proxy(opts, listener, shutdown_signal()).await?;
        } else {
            run(opts, listener, shutdown_signal()).await?;
        }
        Ok::<(), anyhow::Error>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(format, &secrets.redact(&format!("spillway: {e:#}")));
            ExitCode::from(1)
        }
    }
}
