//! `spillway`: the rate limiting service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use spillway_server::config::{self, Source};
use spillway_server::proxy::ProxyOptions;
use spillway_server::{ServeOptions, http, run, run_proxy, shutdown_signal};

/// mimalloc: the server allocates a few small buffers per request, and
/// glibc's malloc showed as the top cost under load (see docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `println!` for `check-config`'s report, which people pipe into `head` or
/// `grep -q`: a closed pipe ends the report quietly instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// A rate limiting service: asks "may this request go through?" and answers
/// with the rules of a YAML file.
#[derive(Debug, Parser)]
#[command(name = "spillway", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP decision API (and, with --grpc-listen, the Envoy rate limit gRPC API).
    Serve {
        /// Rules file (YAML). Without it, the built-in examples/rules.yaml is used.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Address to listen on [default: the file's `listen`, else 127.0.0.1:8080].
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Serve the Envoy rate limit service (gRPC) on this address [default: the file's `grpc_listen`].
        #[arg(long, value_name = "ADDR")]
        grpc_listen: Option<SocketAddr>,
        /// An envoyproxy/ratelimit configuration file (one domain); may be given several times.
        #[arg(long, value_name = "FILE")]
        envoy_config: Vec<PathBuf>,
        /// Worker threads [default: one per core, or TOKIO_WORKER_THREADS].
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
    },
    /// Run as a reverse proxy: decide for every request, forward the admitted
    /// ones to the upstream, answer the others with 429.
    Proxy {
        /// The upstream API, e.g. http://127.0.0.1:9000 [default: the file's proxy.upstream].
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// Rules file (YAML). Without it, the built-in examples/rules.yaml is used.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Address to listen on [default: the file's `proxy.listen`, else its
        /// `listen`, else 127.0.0.1:8080].
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Where the user identity comes from: header:<Name> or query:<name>
        /// [default: the file's proxy.user].
        #[arg(long, value_name = "SOURCE")]
        user: Option<String>,
        /// Worker threads [default: one per core, or TOKIO_WORKER_THREADS].
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
        /// Also serve the HTTP API (/metrics, /healthz, /readyz, /v1/status,
        /// /v1/rules, /v1/check) on this address, which the proxy's own
        /// forwards upstream [default: the file's proxy.admin_listen; none].
        #[arg(long, value_name = "ADDR")]
        admin_listen: Option<SocketAddr>,
    },
    /// Validate a rules file and print what it means.
    CheckConfig {
        /// The rules file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Serve {
            config,
            listen,
            grpc_listen,
            envoy_config,
            threads,
        } => serve(config, listen, None, grpc_listen, envoy_config, threads),
        Command::Proxy {
            upstream,
            config,
            listen,
            user,
            threads,
            admin_listen,
        } => serve(
            config,
            listen,
            Some(ProxyFlags {
                upstream,
                user,
                admin_listen,
            }),
            None,
            Vec::new(),
            threads,
        ),
        Command::CheckConfig { file } => check_config(&file),
    }
}

/// The flags of `spillway proxy` that the rules file may also set.
struct ProxyFlags {
    upstream: Option<String>,
    user: Option<String>,
    admin_listen: Option<SocketAddr>,
}

/// Runs `serve`, or `proxy` when `proxy` carries its flags.
fn serve(
    config: Option<PathBuf>,
    listen: Option<SocketAddr>,
    proxy: Option<ProxyFlags>,
    grpc_listen: Option<SocketAddr>,
    envoy_files: Vec<PathBuf>,
    threads: Option<u16>,
) -> ExitCode {
    let source = config.map_or(Source::Example, Source::File);
    let cfg = match ServeOptions::load(&source, &envoy_files) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let proxy_opts = match proxy {
        None => None,
        Some(flags) => match proxy_options(&cfg, flags) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("spillway proxy: {e}");
                return ExitCode::from(2);
            }
        },
    };
    // The proxy's own address in the file comes first, so one file can
    // serve the API on `listen` and proxy on `proxy.listen`.
    let proxy_listen = proxy_opts
        .as_ref()
        .and(cfg.proxy.as_ref())
        .and_then(|p| p.listen);
    let addr = listen
        .or(proxy_listen)
        .or(cfg.listen)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    // One thread: a current-thread runtime, which skips the work-stealing
    // scheduler's bookkeeping (one event loop, like an nginx worker).
    let mut builder = if threads == Some(1) {
        let mut b = tokio::runtime::Builder::new_current_thread();
        b.on_thread_park(spillway_server::before_park);
        b
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = threads {
            b.worker_threads(usize::from(n));
        }
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = ServeOptions {
        source,
        config: cfg,
        poll_interval: Duration::from_millis(500),
        envoy_files,
        grpc_listen,
    };
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        match proxy_opts {
            None => run(opts, listener, shutdown_signal()).await?,
            Some(p) => run_proxy(opts, p, listener, shutdown_signal()).await?,
        }
        Ok::<(), anyhow::Error>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spillway: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The proxy's settings: flags over the file's `proxy:` section.
fn proxy_options(cfg: &config::Config, flags: ProxyFlags) -> Result<ProxyOptions, String> {
    let file = cfg.proxy.clone().unwrap_or_default();
    let upstream = flags
        .upstream
        .or(file.upstream)
        .ok_or("needs --upstream URL (or proxy.upstream in the rules file)")?;
    let upstream = spillway_server::proxy::parse_upstream(&upstream)?;
    let user = match flags.user {
        Some(u) => Some(config::UserSource::parse(&u)?),
        None => file.user,
    };
    Ok(ProxyOptions {
        upstream,
        user,
        trusted: file.trusted_proxies,
        timeout: file.timeout,
        admin: flags.admin_listen.or(file.admin_listen),
    })
}

fn check_config(file: &std::path::Path) -> ExitCode {
    // An envoyproxy/ratelimit file (a top-level `domain:`) is checked as one.
    let text = std::fs::read_to_string(file).unwrap_or_default();
    if text.lines().any(|l| l.starts_with("domain:")) {
        return match config::parse_envoy(&file.display().to_string(), &text) {
            Ok(d) => {
                outln!(
                    "{}: ok, envoyproxy/ratelimit domain {:?}",
                    file.display(),
                    d.name
                );
                print_domains(std::slice::from_ref(&d));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    match config::load(file) {
        Ok(cfg) => {
            outln!("{}: ok, {} rules", file.display(), cfg.rules.len());
            match &cfg.store {
                config::StoreConfig::Memory { max_keys } => {
                    outln!("store: memory (max_keys {max_keys})");
                }
                config::StoreConfig::Redis(r) => {
                    if r.cluster.is_empty() {
                        outln!("store: redis {}", spillway_redis::redact(&r.url));
                    } else {
                        outln!("store: redis cluster, {} seed nodes", r.cluster.len());
                    }
                    outln!("  timeout {:?}, prefix {:?}", r.timeout, r.prefix);
                    if let Err(e) = spillway_redis::probe(r, Duration::from_secs(1)) {
                        outln!(
                            "warning: redis is not reachable now ({e}); spillway serve will start anyway and connect when it is"
                        );
                    }
                }
            }
            outln!(
                "on_store_error: {}",
                match cfg.on_store_error {
                    spillway_core::FailPolicy::Allow => "allow",
                    spillway_core::FailPolicy::Deny => "deny",
                }
            );
            if let Some(a) = cfg.listen {
                outln!("listen: {a}");
            }
            if let Some(a) = cfg.grpc_listen {
                outln!("grpc_listen: {a}");
            }
            if let Some(p) = &cfg.proxy {
                print_proxy(p);
            }
            for r in &cfg.rules {
                outln!(
                    "- {} (api: {}, by: {}, mode: {})",
                    r.name(),
                    r.route().map_or("every API", |x| x.as_str()),
                    if r.by().parts().is_empty() {
                        "everyone (one shared counter)".to_string()
                    } else {
                        r.by().to_string()
                    },
                    r.mode()
                );
                for l in r.limits() {
                    outln!("    {}", http::describe_limit(l));
                }
            }
            print_domains(&cfg.domains);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// Prints the `proxy:` section as understood.
fn print_proxy(p: &config::ProxyConfig) {
    outln!(
        "proxy: upstream {}",
        p.upstream.as_deref().unwrap_or("(none: give --upstream)")
    );
    if let Some(a) = p.listen {
        outln!("  listen {a}");
    }
    if let Some(a) = p.admin_listen {
        outln!("  admin API (metrics, health) on {a}");
    }
    match &p.user {
        Some(config::UserSource::Header(h)) => outln!("  user from header {h}"),
        Some(config::UserSource::Query(q)) => outln!("  user from query parameter {q}"),
        None => outln!("  no user source (rules by user are skipped)"),
    }
    if !p.trusted_proxies.is_empty() {
        let nets: Vec<String> = p.trusted_proxies.iter().map(|n| n.to_string()).collect();
        outln!("  trusted proxies {}", nets.join(", "));
    }
    outln!("  upstream timeout {:?}", p.timeout);
}

/// Prints gRPC descriptor trees, one line per node.
fn print_domains(domains: &[spillway_server::envoy::Domain]) {
    use spillway_server::envoy::{Action, Node};
    fn walk(nodes: &[Node], depth: usize) {
        for n in nodes {
            let what = match &n.action {
                Action::None => String::new(),
                Action::Unlimited => " -> unlimited".to_string(),
                Action::Ban { name, .. } => format!(" -> {name} [0 per unit: always over limit]"),
                Action::Limit(r) => format!(
                    " -> {} [{}]{}",
                    r.name(),
                    r.limits()
                        .iter()
                        .map(http::describe_limit)
                        .collect::<Vec<_>>()
                        .join(", "),
                    if r.mode() == spillway_core::Mode::Shadow {
                        " (shadow)"
                    } else {
                        ""
                    }
                ),
            };
            let replaces = if n.replaces.is_empty() {
                String::new()
            } else {
                format!(" replaces {:?}", n.replaces)
            };
            outln!(
                "{}{}={}{what}{replaces}",
                "  ".repeat(depth + 1),
                n.key,
                n.value.as_deref().unwrap_or("*")
            );
            walk(&n.children, depth + 1);
        }
    }
    for d in domains {
        outln!("domain {} (gRPC):", d.name);
        walk(&d.nodes, 0);
    }
}
