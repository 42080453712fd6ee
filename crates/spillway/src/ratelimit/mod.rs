//! `ratelimit`: the binary started under that name (the image's
//! `/bin/ratelimit`, a link to `spillway`) takes envoyproxy/ratelimit's
//! environment instead of a command line, so a manifest written for that
//! image (Envoy Gateway's limiter among them) runs spillway unchanged: the
//! same ports, the same configuration directory or xDS server, the same
//! Redis. Where it listens and what it reads become `serve`'s flags;
//! Redis, xDS and health become an [`Overlay`] laid over the rules file's
//! settings (checked as the file's would be, errors naming the variable);
//! the response-shaping variables (`LIMIT_RESPONSE_HEADERS_ENABLED` and
//! the others) and `MERGE_DOMAIN_CONFIG` are read where `serve` reads
//! them. A variable this entry cannot honour stops the start (exit 2),
//! each named with why.

mod env;
#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use spillway_server::config::Overlay;

use env::Env;

/// The rules file `ratelimit` serves beside the Envoy domains when
/// `SPILLWAY_CONFIG` names none: the image ships it with no rules of its
/// own (the built-in demo rules are not what a ratelimit deployment means).
pub(crate) const RULES: &str = "/etc/spillway/ratelimit.yaml";

/// What the environment says: `serve`'s command line, what is laid over
/// the rules file, and the log filter (`LOG_LEVEL`).
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) args: Vec<OsString>,
    pub(crate) overlay: Overlay,
    pub(crate) log_level: Option<&'static str>,
    /// The `OTEL_*` variables ratelimit's `TRACING_*` stand for, to set
    /// before anything reads them (`set_tracing_env`).
    pub(crate) tracing_env: Vec<(&'static str, String)>,
}

impl Entry {
    /// Sets [`Entry::tracing_env`] in this process's environment, where
    /// the traces' settings read the `OTEL_*` variables.
    ///
    /// # Safety
    /// No other thread may be reading or writing the environment: call it
    /// first thing in `main`, before any runtime or thread starts.
    pub(crate) unsafe fn set_tracing_env(&self) {
        for (k, v) in &self.tracing_env {
            // SAFETY: the caller guarantees this process has one thread.
            unsafe { std::env::set_var(k, v) };
        }
    }
}

/// `Some` with what envoyproxy/ratelimit's settings say when the program
/// was started as `ratelimit`, or, when its environment sets what this
/// entry does not honour, why not (the start stops: a Redis or xDS
/// setting passed over would limit per instance, or by no rules at all,
/// while the operator believes otherwise); `None` otherwise.
pub(crate) fn args() -> Option<Result<Entry, String>> {
    let argv0 = std::env::args_os().next()?;
    if Path::new(&argv0).file_name()? != "ratelimit" {
        return None;
    }
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .collect();
    Some(entry(&vars))
}

/// What `vars` say, or every variable refused.
pub(crate) fn entry(vars: &[(String, String)]) -> Result<Entry, String> {
    let env = Env { vars };
    let mut refused = not_honoured(&env);
    let overlay = env::overlay(&env, &mut refused);
    let log_level = env::log_level(&env, &mut refused);
    let args = serve_args(&env, overlay.xds.is_some(), &mut refused);
    let tracing_env =
        spillway_server::config::ratelimit_tracing_env(&|n| env.get(n).map(str::to_string))
            .unwrap_or_else(|why| {
                refused.push(why);
                Vec::new()
            });
    if refused.is_empty() {
        return Ok(Entry {
            args,
            overlay,
            log_level,
            tracing_env,
        });
    }
    refused.sort();
    refused.dedup();
    Err(format!(
        "ratelimit: envoyproxy/ratelimit settings this entry does not honour (unset them, or \
         run `spillway serve` with a rules file):\n{}",
        refused
            .iter()
            .map(|r| format!("  {r}"))
            .collect::<Vec<_>>()
            .join("\n")
    ))
}

/// envoyproxy/ratelimit's variables this entry does not honour beyond
/// Redis and xDS (see [`env`]), as set in the environment: one line each
/// saying why. A variable set to its off value (`USE_STATSD=false`) or
/// ratelimit's default is no request, and passes.
fn not_honoured(env: &Env<'_>) -> Vec<String> {
    let mut refused: Vec<String> = Vec::new();
    for (name, _) in env.vars {
        if env.get(name).is_none() {
            continue;
        }
        let why = if name.starts_with("MEMCACHE_") {
            Some("memcache is not a store spillway has")
        } else {
            match name.as_str() {
                "BACKEND_TYPE"
                    if !env
                        .get(name)
                        .is_some_and(|v| v.eq_ignore_ascii_case("redis")) =>
                {
                    Some("only Redis (REDIS_URL), or the embedded store without it")
                }
                "USE_STATSD" | "USE_DOG_STATSD" if env.on(name, &mut refused) => {
                    Some("statsd is not spoken: scrape /metrics (USE_PROMETHEUS)")
                }
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS" if env.on(name, &mut refused) => {
                    Some("spillway's latency histograms are in seconds, as Prometheus names them")
                }
                "PROMETHEUS_PATH" if env.get(name) != Some("/metrics") => {
                    Some("the metrics are at /metrics only")
                }
                // Other helpers build these; the lead maps them (see the
                // report of issue 37's items 4 and 6).
                _ => None,
            }
        };
        if let Some(why) = why {
            refused.push(format!("{name}: {why}"));
        }
    }
    // Both default true in ratelimit; read here for their format only.
    env.bool("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", &mut refused);
    env.bool("DISABLE_STATS", &mut refused);
    if let Some(p) = env.get("PROMETHEUS_MAPPER_YAML")
        && env.on("USE_PROMETHEUS", &mut Vec::new())
        && let Err(e) = std::fs::metadata(p)
    {
        refused.push(format!("PROMETHEUS_MAPPER_YAML: {p}: {e}"));
    }
    refused
}

/// The `serve` command line from envoyproxy/ratelimit's variables, as
/// `env` gives them (its defaults where unset); `xds`: the rules come
/// over xDS, not from the runtime directory.
fn serve_args(env: &Env<'_>, xds: bool, refused: &mut Vec<String>) -> Vec<OsString> {
    let var = |name: &str, default: &str| -> String { env.get(name).unwrap_or(default).into() };
    // Go's `net.JoinHostPort`: an IPv6 host in brackets.
    let join = |h: &str, p: &str| -> OsString {
        if h.contains(':') {
            format!("[{h}]:{p}").into()
        } else {
            format!("{h}:{p}").into()
        }
    };
    let addr = |host: &str, port: &str, default_port: &str| -> OsString {
        join(&var(host, "0.0.0.0"), &var(port, default_port))
    };
    let mut args: Vec<OsString> = vec!["ratelimit".into()];
    // ratelimit's LOG_FORMAT: `json` or `text`.
    if env
        .get("LOG_FORMAT")
        .is_some_and(|f| f.eq_ignore_ascii_case("json"))
    {
        args.extend(["--log-format".into(), "json".into()]);
    }
    // Prometheus: the admin listener (metrics, status, health) moves to
    // PROMETHEUS_ADDR; spillway has one admin listener, so a debug port
    // said apart from it cannot be honoured.
    let admin = if env.on("USE_PROMETHEUS", refused) {
        for name in ["DEBUG_HOST", "DEBUG_PORT"] {
            if env.get(name).is_some() {
                refused.push(format!("{name}: with USE_PROMETHEUS, spillway's one admin listener (metrics and debug) is at PROMETHEUS_ADDR"));
            }
        }
        let at = var("PROMETHEUS_ADDR", ":9090");
        match at.rsplit_once(':') {
            // Go's ":9090": every address.
            Some(("", port)) => join("0.0.0.0", port),
            Some(_) => at.into(),
            None => {
                refused.push(format!("PROMETHEUS_ADDR: {at:?} is not HOST:PORT"));
                at.into()
            }
        }
    } else {
        addr("DEBUG_HOST", "DEBUG_PORT", "6070")
    };
    args.extend([
        "serve".into(),
        "--config".into(),
        var("SPILLWAY_CONFIG", RULES).into(),
        "--listen".into(),
        addr("HOST", "PORT", "8080"),
        "--grpc-listen".into(),
        addr("GRPC_HOST", "GRPC_PORT", "8081"),
        "--admin-listen".into(),
        admin,
    ]);
    // With xDS, ratelimit reads no runtime directory.
    if !xds {
        let mut dir = PathBuf::from(var("RUNTIME_ROOT", "/srv/runtime_data/current"));
        if let Some(sub) = env.get("RUNTIME_SUBDIRECTORY") {
            dir.push(sub);
        }
        dir.push(var("RUNTIME_APPDIRECTORY", "config"));
        args.extend(["--envoy-config".into(), dir.into()]);
    }
    args
}
