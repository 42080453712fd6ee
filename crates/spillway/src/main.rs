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
    let mut as_ratelimit = false;
    let cli = match ratelimit::args() {
        Some(Ok(args)) => {
            as_ratelimit = true;
            Cli::parse_from(args)
        }
        Some(Err(why)) => {
            eprintln!("{why}");
            return ExitCode::from(2);
        }
        None => Cli::parse(),
    };
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
