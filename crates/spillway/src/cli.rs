//! The command line: `serve`, `proxy`, `check-config` and `simulate`, with
//! every flag as users type it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use spillway_server::config::LogFormat;

/// A rate limiting service: asks "may this request go through?" and answers
/// with the rules of a YAML file.
#[derive(Debug, Parser)]
#[command(name = "spillway", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// Log as `text` or `json` (one object per line) [default: the rules
    /// file's `log.format`, else text].
    #[arg(long, global = true, value_name = "FORMAT", value_parser = parse_log_format)]
    pub(crate) log_format: Option<LogFormat>,
    /// The largest rules or envoyproxy/ratelimit file read, in bytes
    /// (`KiB`, `MiB`, `GiB` suffixes taken) [default: 1GiB]. A larger
    /// file is refused before it is parsed.
    #[arg(long, global = true, value_name = "BYTES", value_parser = parse_bytes)]
    pub(crate) max_file_bytes: Option<u64>,
}

/// `1073741824`, `512MiB`, `1GiB`, `64KiB` (also `K`, `M`, `G`, `KB`...:
/// powers of 1024 all) as a byte count of at least 1.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}`: a number of bytes, e.g. 1073741824 or 1GiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("`{s}`: unknown unit `{other}` (B, KiB, MiB, GiB)")),
    };
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{s}`: too large"))?;
    if bytes == 0 {
        return Err("at least 1 byte".to_string());
    }
    Ok(bytes)
}

fn parse_xds_server(s: &str) -> Result<String, String> {
    spillway_server::xds::split_host(s).map(|_| s.to_string())
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    s.parse()
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the HTTP decision API (and, with --grpc-listen, the Envoy rate limit gRPC API).
    Serve {
        /// Rules file (YAML), or a directory whose *.yaml and *.yml files
        /// are one configuration (each file reloaded alone when it
        /// changes). Without it, the built-in examples/rules.yaml is used.
        #[arg(long, value_name = "FILE|DIR")]
        config: Option<PathBuf>,
        /// Address to listen on [default: the file's `listen`, else 127.0.0.1:8080].
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Serve the Envoy rate limit service (gRPC) on this address, or on
        /// a Unix socket given as unix:PATH [default: the file's `grpc_listen`].
        #[arg(long, value_name = "ADDR")]
        grpc_listen: Option<spillway_server::grpc::GrpcListen>,
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
        /// On SIGTERM, answer /readyz with 503 at once but go on serving
        /// this long before draining, while an orchestrator stops sending
        /// new connections (e.g. 5s under Kubernetes) [default: 0s].
        #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
        shutdown_delay: Option<Duration>,
        /// Also take gRPC domains over xDS from this management server
        /// (HOST:PORT, plain gRPC), as envoyproxy/ratelimit's
        /// CONFIG_TYPE=GRPC_XDS_SOTW does; the rules file's serve meanwhile.
        #[arg(long, value_name = "HOST:PORT", value_parser = parse_xds_server)]
        xds_server: Option<String>,
        /// The node id sent to --xds-server.
        #[arg(
            long,
            value_name = "ID",
            default_value = "default",
            requires = "xds_server"
        )]
        xds_node_id: String,
        #[command(flatten)]
        tls: TlsFlags,
    },
    /// Run as a reverse proxy: decide for every request, forward the admitted
    /// ones to the upstream, answer the others with 429.
    Proxy {
        /// The upstream API, e.g. http://127.0.0.1:9000 [default: the file's proxy.upstream].
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// Rules file (YAML), or a directory of them (as `serve --config`).
        /// Without it, the built-in examples/rules.yaml is used.
        #[arg(long, value_name = "FILE|DIR")]
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
        #[arg(required_unless_present = "config", value_name = "FILE|DIR")]
        files: Vec<PathBuf>,
        /// The rules file or directory, as `serve --config` reads it
        /// (every file's errors, each with file:line).
        #[arg(long, value_name = "FILE|DIR")]
        config: Option<PathBuf>,
        /// As `serve --merge-domains`.
        #[arg(long)]
        merge_domains: bool,
        /// List every rule (a large file is otherwise summarised: counts
        /// per algorithm, mode and key).
        #[arg(long, short = 'v')]
        verbose: bool,
        /// Also read the rules made over the admin API back from the
        /// store (Redis, as the file's `store:` says; else the memory
        /// store's `admin.state_file`), check them against the file and
        /// print them.
        #[arg(long)]
        from_store: bool,
    },
    /// Replay a trace (an access log) through a rules file at virtual
    /// time and report who would be limited, or write a synthetic trace.
    Simulate(Box<SimulateArgs>),
}

/// `spillway simulate`: replay a trace, or write a synthetic one.
#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Rules file (YAML) to replay the trace through. Without it, the
    /// built-in examples/rules.yaml is used.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Trace to replay: a combined-format access log, JSON lines or CSV,
    /// plain or gzip ("-" reads standard input); may be given several
    /// times (replayed in order).
    #[arg(long, value_name = "FILE", required_unless_present = "synthesize")]
    pub(crate) trace: Vec<PathBuf>,
    /// A second rules file, replayed side by side with the first.
    #[arg(long, value_name = "FILE")]
    pub(crate) compare: Option<PathBuf>,
    /// Write a self-contained HTML report with plots.
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// Write the summary as JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Write every decision (of --config) as a JSON line: file, line, ts_ns,
    /// allowed, and each rule's outcome.
    #[arg(long, value_name = "FILE")]
    pub(crate) decisions: Option<PathBuf>,
    /// Suggest, for every limit, the smallest size that limits at most
    /// this share of a rule's clients, e.g. 1%.
    #[arg(long, value_name = "PERCENT", value_parser = spillway_simulate::parse_share)]
    pub(crate) target_limited: Option<f64>,
    /// The trace's format [default: detected from its first line].
    #[arg(long, value_name = "combined|json|csv")]
    pub(crate) format: Option<spillway_simulate::trace::Format>,
    /// A JSON key or CSV column name for a field: ts=, ip=, user=, method=,
    /// path=, status=, cost=, api=, request= or headers=, e.g. --field
    /// ts=@timestamp (repeatable).
    #[arg(long, value_name = "FIELD=NAME")]
    pub(crate) field: Vec<String>,
    /// Unit of numeric timestamps: s, ms, us or ns [default: by magnitude].
    #[arg(long, value_name = "UNIT")]
    pub(crate) ts_unit: Option<spillway_simulate::trace::TsUnit>,
    /// Heaviest keys listed per rule.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub(crate) top: usize,
    /// Skip the comparison of window-type limits with the exact log.
    #[arg(long)]
    pub(crate) no_accuracy: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Write a synthetic trace instead: heavy-tail, uniform, bursty or diurnal.
    #[arg(long, value_name = "SHAPE", conflicts_with_all = ["trace", "compare", "report", "json", "decisions"])]
    pub(crate) synthesize: Option<spillway_simulate::synth::Shape>,
    /// Synthetic clients.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1000,
        requires = "synthesize"
    )]
    pub(crate) clients: u64,
    /// Synthetic requests.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 100_000,
        requires = "synthesize"
    )]
    pub(crate) requests: u64,
    /// Span of the synthetic trace, e.g. 1h.
    #[arg(long, value_name = "DURATION", default_value = "1h", requires = "synthesize", value_parser = parse_duration_arg)]
    pub(crate) duration: Duration,
    /// Seed of the synthetic trace (the same seed writes the same trace).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "synthesize")]
    pub(crate) seed: u64,
    /// Where to write the synthetic trace ("-" or absent: standard
    /// output; a name ending in .gz is gzipped).
    #[arg(long, value_name = "FILE", requires = "synthesize")]
    pub(crate) out: Option<PathBuf>,
}

fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    spillway_core::parse_duration(s)
        .map(|n| Duration::from_nanos(n.as_u64()))
        .map_err(|e| e.to_string())
}

/// `--tls-cert FILE --tls-key FILE`, given together.
#[derive(Debug, clap::Args)]
pub(crate) struct TlsFlags {
    /// Serve HTTPS on every listener with this PEM certificate chain
    /// (reloaded when it changes) [default: the file's `tls.cert`].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert [default: the file's `tls.key`].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
}
