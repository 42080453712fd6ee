//! Logging to stderr as text or JSON lines, with protocol warnings
//! throttled, and the last words of a server that cannot start.

use spillway_server::config::LogFormat;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::{json_log, log_limit};

/// The filter when `RUST_LOG` is unset: the `ratelimit` entry's
/// `LOG_LEVEL`, else `info`.
static DEFAULT_FILTER: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Sets the filter used when `RUST_LOG` is unset (before [`init`]).
pub(crate) fn set_default_filter(filter: &'static str) {
    let _ = DEFAULT_FILTER.set(filter);
}

/// Starts logging to stderr (`RUST_LOG` filters, default `info`).
pub(crate) fn init(format: LogFormat) {
    let default = *DEFAULT_FILTER.get().unwrap_or(&"info");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default.into()),
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
pub(crate) fn fatal(format: LogFormat, text: &str) {
    match format {
        LogFormat::Text => eprintln!("{text}"),
        LogFormat::Json => {
            for line in text.lines() {
                tracing::error!("{line}");
            }
        }
    }
}
