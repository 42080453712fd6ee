//! `spillway`: the rate limiting service. The command line is parsed here
//! and handed on: `serve` and `proxy` to [`spillway_server`], `simulate`
//! to `spillway_simulate`, `check-config` to its report. Started as
//! `ratelimit`, it serves as envoyproxy/ratelimit's environment says.

use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::logging::init as init_logging;
use crate::serve::{Flags, merge_domain_config_env, serve};

/// mimalloc: the server allocates a few small buffers per request, and
/// glibc's malloc showed as the top cost under load (see docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod check_config;
mod cli;
mod from_store;
mod json_log;
mod log_limit;
mod logging;
mod ratelimit;
mod serve;
mod simulate;

fn main() -> ExitCode {
    // Started as `ratelimit` (the image's /bin/ratelimit): envoyproxy/
    // ratelimit's environment stands for the command line.
    let (cli, overlay) = match ratelimit::args() {
        Some(Ok(entry)) => {
            if let Some(level) = entry.log_level {
                logging::set_default_filter(level);
            }
            // SAFETY: first thing in `main`: no runtime, no other thread.
            unsafe { entry.set_tracing_env() };
            (Cli::parse_from(entry.args), Some(entry.overlay))
        }
        Some(Err(why)) => {
            eprintln!("{why}");
            return ExitCode::from(2);
        }
        None => (Cli::parse(), None),
    };
    let as_ratelimit = overlay.is_some();
    let log_format = cli.log_format;
    if let Some(bytes) = cli.max_file_bytes {
        spillway_rules::recover::set_max_file_bytes(bytes);
    }
    match cli.command {
        Command::Serve {
            config,
            listen,
            grpc_listen,
            envoy_config,
            merge_domains,
            threads,
            admin_listen,
            shutdown_delay,
            xds_server,
            xds_node_id,
            tls,
        } => serve(Flags {
            tls,
            config,
            listen,
            shutdown_delay: shutdown_delay.unwrap_or_default(),
            grpc_listen,
            as_ratelimit,
            envoy_files: envoy_config,
            merge_domains: merge_domains || merge_domain_config_env(),
            threads,
            admin_listen,
            proxy: None,
            log_format,
            overlay: xds_flags(overlay, xds_server, xds_node_id),
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
            as_ratelimit: false,
            envoy_files: Vec::new(),
            merge_domains: false,
            threads,
            admin_listen,
            proxy: Some((upstream, user)),
            log_format,
            shutdown_delay: std::time::Duration::ZERO,
            overlay: None,
        }),
        Command::Simulate(args) => {
            init_logging(log_format.unwrap_or_default());
            simulate::run(*args)
        }
        Command::CheckConfig {
            files,
            config,
            merge_domains,
            verbose,
            from_store,
        } => {
            init_logging(log_format.unwrap_or_default());
            let code = check_config::check_config(
                &files,
                config.as_deref(),
                merge_domains || merge_domain_config_env(),
                verbose,
            );
            if from_store && code == ExitCode::SUCCESS {
                from_store::run(&files, config.as_deref())
            } else {
                code
            }
        }
    }
}

/// `--xds-server` as an overlay (the `ratelimit` entry gives its own):
/// ratelimit's xDS client settings, serving the file's rules at once
/// rather than waiting for the first configuration.
fn xds_flags(
    overlay: Option<spillway_server::config::Overlay>,
    server: Option<String>,
    node_id: String,
) -> Option<spillway_server::config::Overlay> {
    let Some(server) = server else {
        return overlay;
    };
    let mut o = overlay.unwrap_or_default();
    let mut x = spillway_server::xds::Settings::new(server, node_id);
    x.wait_initial = false;
    o.xds = Some(x);
    Some(o)
}
