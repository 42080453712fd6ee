//! `spillway`: the rate limiting service. Flags are parsed here and laid
//! over the rules file's validated settings; everything else is the
//! library's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use spillway_server::config::{Config, LogFormat, Source};
use spillway_server::proxy::{UpstreamUrl, UserSource};
use spillway_server::{ServeOptions, run, run_proxy, shutdown_signal};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// mimalloc: the server allocates a few small buffers per request, and
/// glibc's malloc showed as the top cost under load (see docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod json_log;
mod log_limit;

/// A rate limiting service: asks "may this request go through?" and answers
/// with the rules of a YAML file.
#[derive(Debug, Parser)]
#[command(name = "spillway", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log as `text` or `json` (one object per line) [default: the rules
    /// file's `log.format`, else text].
    #[arg(long, global = true, value_name = "FORMAT", value_parser = parse_log_format)]
    log_format: Option<LogFormat>,
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    s.parse()
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
        /// An envoyproxy/ratelimit configuration file (one domain), or a
        /// directory whose *.yaml and *.yml files are read (files added or
        /// removed are picked up on reload); may be given several times.
        #[arg(long, value_name = "FILE|DIR")]
        envoy_config: Vec<PathBuf>,
        /// Let several files give one domain and merge their descriptors
        /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG, also read from the
        /// environment) instead of refusing the second.
        #[arg(long)]
        merge_domains: bool,
        /// Worker threads [default: one per core, or TOKIO_WORKER_THREADS].
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
        threads: Option<u16>,
        /// Serve the admin API (/metrics, /v1/status, /v1/rules, and health)
        /// on this address instead of the decision port [default: the
        /// file's `admin_listen`; none: they share the decision port].
        #[arg(long, value_name = "ADDR")]
        admin_listen: Option<SocketAddr>,
        #[command(flatten)]
        tls: TlsFlags,
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
        #[command(flatten)]
        tls: TlsFlags,
    },
    /// Validate a rules file, envoyproxy/ratelimit files or directories of
    /// them, as `serve` would load them together, and print what they mean.
    CheckConfig {
        /// A rules file, and envoyproxy/ratelimit files (a top-level
        /// `domain:`) or directories of them.
        #[arg(required = true, value_name = "FILE|DIR")]
        files: Vec<PathBuf>,
        /// As `serve --merge-domains`.
        #[arg(long)]
        merge_domains: bool,
    },
    /// Replay a trace (an access log) through a rules file at virtual
    /// time and report who would be limited, or write a synthetic trace.
    Simulate(Box<SimulateArgs>),
}

/// `spillway simulate`: replay a trace, or write a synthetic one.
#[derive(Debug, clap::Args)]
struct SimulateArgs {
    /// Rules file (YAML) to replay the trace through. Without it, the
    /// built-in examples/rules.yaml is used.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Trace to replay: a combined-format access log, JSON lines or CSV,
    /// plain or gzip ("-" reads standard input); may be given several
    /// times (replayed in order).
    #[arg(long, value_name = "FILE", required_unless_present = "synthesize")]
    trace: Vec<PathBuf>,
    /// A second rules file, replayed side by side with the first.
    #[arg(long, value_name = "FILE")]
    compare: Option<PathBuf>,
    /// Write a self-contained HTML report with plots.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Write the summary as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write every decision (of --config) as a JSON line: file, line, ts_ns,
    /// allowed, and each rule's outcome.
    #[arg(long, value_name = "FILE")]
    decisions: Option<PathBuf>,
    /// Suggest, for every limit, the smallest size that limits at most
    /// this share of a rule's clients, e.g. 1%.
    #[arg(long, value_name = "PERCENT", value_parser = spillway_server::simulate::parse_share)]
    target_limited: Option<f64>,
    /// The trace's format [default: detected from its first line].
    #[arg(long, value_name = "combined|json|csv")]
    format: Option<spillway_server::simulate::trace::Format>,
    /// A JSON key or CSV column name for a field: ts=, ip=, user=, method=,
    /// path=, status=, cost=, api=, request= or headers=, e.g. --field
    /// ts=@timestamp (repeatable).
    #[arg(long, value_name = "FIELD=NAME")]
    field: Vec<String>,
    /// Unit of numeric timestamps: s, ms, us or ns [default: by magnitude].
    #[arg(long, value_name = "UNIT")]
    ts_unit: Option<spillway_server::simulate::trace::TsUnit>,
    /// Heaviest keys listed per rule.
    #[arg(long, value_name = "N", default_value_t = 20)]
    top: usize,
    /// Skip the comparison of window-type limits with the exact log.
    #[arg(long)]
    no_accuracy: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Write a synthetic trace instead: heavy-tail, uniform, bursty or diurnal.
    #[arg(long, value_name = "SHAPE", conflicts_with_all = ["trace", "compare", "report", "json", "decisions"])]
    synthesize: Option<spillway_server::simulate::synth::Shape>,
    /// Synthetic clients.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        requires = "synthesize"
    )]
    clients: u64,
    /// Synthetic requests.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 100_000,
        requires = "synthesize"
    )]
    requests: u64,
    /// Span of the synthetic trace, e.g. 1h.
    #[arg(long, value_name = "DURATION", default_value = "1h", requires = "synthesize", value_parser = parse_duration_arg)]
    duration: Duration,
    /// Seed of the synthetic trace (the same seed writes the same trace).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "synthesize")]
    seed: u64,
    /// Where to write the synthetic trace ("-" or absent: standard
    /// output; a name ending in .gz is gzipped).
    #[arg(long, value_name = "FILE", requires = "synthesize")]
    out: Option<PathBuf>,
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    spillway_core::parse_duration(s)
        .map(|n| Duration::from_nanos(n.as_u64()))
        .map_err(|e| e.to_string())
}

/// `--tls-cert FILE --tls-key FILE`, given together.
#[derive(Debug, clap::Args)]
struct TlsFlags {
    /// Serve HTTPS on every listener with this PEM certificate chain
    /// (reloaded when it changes) [default: the file's `tls.cert`].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert [default: the file's `tls.key`].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

fn simulate(args: SimulateArgs) -> ExitCode {
    use spillway_server::simulate;
    if let Some(shape) = args.synthesize {
        let opts = simulate::synth::SynthOptions {
            shape,
            clients: args.clients,
            requests: args.requests,
            duration_ns: u64::try_from(args.duration.as_nanos()).unwrap_or(u64::MAX),
            seed: args.seed,
            ..simulate::synth::SynthOptions::default()
        };
        return match simulate::write_synthetic(&opts, args.out.as_deref()) {
            Ok(n) => {
                if args.out.is_some() {
                    eprintln!("wrote {n} requests");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut trace = simulate::trace::TraceOptions {
        format: args.format,
        ts_unit: args.ts_unit,
        ..Default::default()
    };
    for f in &args.field {
        if let Err(e) = trace.fields.set(f) {
            eprintln!("error: --field {f}: {e}");
            return ExitCode::from(2);
        }
    }
    let opts = simulate::SimulateOptions {
        config: args.config,
        traces: args.trace,
        compare: args.compare,
        report: args.report,
        json: args.json,
        decisions: args.decisions,
        trace,
        replay: simulate::replay::ReplayOptions {
            top: args.top,
            target_limited: args.target_limited,
            accuracy: !args.no_accuracy,
        },
        progress: !args.quiet,
    };
    match simulate::simulate(&opts) {
        Ok(summary) => {
            print!("{}", simulate::text(&summary));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What the flags of `serve` and `proxy` say.
struct Flags {
    /// `--tls-cert` and `--tls-key`.
    tls: TlsFlags,
    config: Option<PathBuf>,
    listen: Option<SocketAddr>,
    grpc_listen: Option<SocketAddr>,
    envoy_files: Vec<PathBuf>,
    merge_domains: bool,
    threads: Option<u16>,
    admin_listen: Option<SocketAddr>,
    /// `Some` for `proxy`: its upstream and user flags.
    proxy: Option<(Option<String>, Option<String>)>,
    /// `--log-format`, which wins over the file's.
    log_format: Option<LogFormat>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    match cli.command {
        Command::Serve {
            config,
            listen,
            grpc_listen,
            envoy_config,
            merge_domains,
            threads,
            admin_listen,
            tls,
        } => serve(Flags {
            tls,
            config,
            listen,
            grpc_listen,
            envoy_files: envoy_config,
            merge_domains: merge_domains || merge_domain_config_env(),
            threads,
            admin_listen,
            proxy: None,
            log_format,
        }),
        Command::Proxy {
            upstream,
            config,
            listen,
            user,
            threads,
            admin_listen,
            tls,
        } => serve(Flags {
            tls,
            config,
            listen,
            grpc_listen: None,
            envoy_files: Vec::new(),
            merge_domains: false,
            threads,
            admin_listen,
            proxy: Some((upstream, user)),
            log_format,
        }),
        Command::Simulate(args) => {
            init_logging(log_format.unwrap_or_default());
            simulate(*args)
        }
        Command::CheckConfig {
            files,
            merge_domains,
        } => {
            init_logging(log_format.unwrap_or_default());
            spillway_server::check_config::check_config(
                &files,
                merge_domains || merge_domain_config_env(),
            )
        }
    }
}

/// Starts logging to stderr (`RUST_LOG` filters, default `info`).
fn init_logging(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr);
    // Protocol warnings (h2, hyper) past the first of each kind per
    // interval are counted, not written: a flood cannot flood the log.
    let throttle = log_limit::Throttle::default();
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .finish()
            .with(throttle)
            .init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .event_format(json_log::JsonLines)
            .finish()
            .with(throttle)
            .init(),
    }
}

/// Says why the server stops: as text, or in JSON mode as one `error`
/// event per line of it (so that every line on stderr is an object).
fn fatal(format: LogFormat, text: &str) {
    match format {
        LogFormat::Text => eprintln!("{text}"),
        LogFormat::Json => {
            for line in text.lines() {
                tracing::error!("{line}");
            }
        }
    }
}

/// `MERGE_DOMAIN_CONFIG`, read as envoyproxy/ratelimit reads it (Go's
/// `strconv.ParseBool`: 1, t, T, TRUE, true, True are true).
fn merge_domain_config_env() -> bool {
    std::env::var("MERGE_DOMAIN_CONFIG")
        .is_ok_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True"))
}

/// Lays the flags over the file's validated settings.
fn apply_flags(cfg: &mut Config, flags: &Flags) -> Result<(), String> {
    if let (Some(cert), Some(key)) = (&flags.tls.tls_cert, &flags.tls.tls_key) {
        cfg.tls.listeners = Some(spillway_server::config::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            named_by: "--tls-cert/--tls-key".into(),
        });
    }
    if let Some(a) = flags.grpc_listen {
        cfg.grpc_listen = Some(a);
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
fn serve(flags: Flags) -> ExitCode {
    // Before the file is read: the default connection cap follows it.
    spillway_server::raise_descriptor_limit();
    let source = flags.config.clone().map_or(Source::Example, Source::File);
    let loaded =
        spillway_server::config::load_all(&source, &flags.envoy_files, flags.merge_domains);
    // Logging starts once the file has said how; nothing logs before.
    let format = flags
        .log_format
        .or_else(|| loaded.as_ref().ok().and_then(|c| c.log_format))
        .unwrap_or_default();
    init_logging(format);
    let mut cfg = match loaded {
        Ok(c) => c,
        Err(e) => {
            fatal(format, &e.to_string());
            return ExitCode::from(2);
        }
    };
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
