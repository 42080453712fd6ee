//! `ratelimit`: the binary started under that name (the image's
//! `/bin/ratelimit`, a link to `spillway`) takes envoyproxy/ratelimit's
//! environment instead of a command line, so a manifest written for that
//! image runs spillway unchanged: the same ports, the same configuration
//! directory. Only what decides where it listens and what it reads is
//! read here; the response-shaping variables (`LIMIT_RESPONSE_HEADERS_ENABLED`
//! and the others) and `MERGE_DOMAIN_CONFIG` are read where `serve` reads
//! them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The rules file `ratelimit` serves beside the Envoy domains when
/// `SPILLWAY_CONFIG` names none: the image ships it with no rules of its
/// own (the built-in demo rules are not what a ratelimit deployment means).
pub(crate) const RULES: &str = "/etc/spillway/ratelimit.yaml";

/// `Some` with the `spillway serve` command line that stands for
/// envoyproxy/ratelimit's settings when the program was started as
/// `ratelimit`, or, when its environment sets what this entry does not
/// honour, why not (the start stops: a Redis or xDS setting passed over
/// would limit per instance, or by no rules at all, while the operator
/// believes otherwise); `None` otherwise.
pub(crate) fn args() -> Option<Result<Vec<OsString>, String>> {
    let argv0 = std::env::args_os().next()?;
    if Path::new(&argv0).file_name()? != "ratelimit" {
        return None;
    }
    let env = |name: &str| std::env::var_os(name);
    let vars: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    Some(match not_honoured(&vars, &env) {
        Some(why) => Err(why),
        None => Ok(serve_args(&env)),
    })
}

/// envoyproxy/ratelimit's variables this entry does not honour, as set
/// in the environment (`names`, read through `env`): the first lines of
/// an error saying each and what to do; `None` when there are none. A
/// variable set to its off value (`USE_STATSD=false`) or ratelimit's
/// default is no request, and passes.
fn not_honoured(names: &[String], env: &dyn Fn(&str) -> Option<OsString>) -> Option<String> {
    let value = |n: &str| env(n).map(|v| v.to_string_lossy().trim().to_ascii_lowercase());
    let on = |n: &str| value(n).is_some_and(|v| v == "true" || v == "1");
    let mut refused: Vec<String> = Vec::new();
    let mut sorted: Vec<&String> = names.iter().collect();
    sorted.sort();
    for name in sorted {
        let set = value(name).is_some_and(|v| !v.is_empty());
        let why = if name.starts_with("REDIS_") && set {
            Some(
                "Redis settings: run `spillway serve` with a rules file whose `store: { redis: ... }` says them (SPILLWAY_CONFIG)",
            )
        } else if name.starts_with("CONFIG_GRPC_XDS_") && set {
            Some(
                "configuration over xDS is not supported yet: mount the domains' files at RUNTIME_ROOT",
            )
        } else if name.starts_with("MEMCACHE_") && set {
            Some("memcache is not a store spillway has")
        } else {
            match name.as_str() {
                "CONFIG_TYPE" if value(name).is_some_and(|v| !v.is_empty() && v != "file") => {
                    Some("only CONFIG_TYPE=FILE (the runtime directory) is read")
                }
                "BACKEND_TYPE" if value(name).is_some_and(|v| !v.is_empty() && v != "redis") => {
                    Some("only the embedded store (or Redis through SPILLWAY_CONFIG)")
                }
                "USE_STATSD"
                | "TRACING_ENABLED"
                | "GRPC_SERVER_USE_TLS"
                | "USE_PROMETHEUS"
                | "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"
                | "FORCE_START_WITHOUT_INITIAL_CONFIG"
                    if on(name) =>
                {
                    Some(match name.as_str() {
                        "USE_PROMETHEUS" => {
                            "Prometheus metrics are at the debug port's /metrics (DEBUG_PORT), not PROMETHEUS_ADDR"
                        }
                        "USE_STATSD" => "statsd is not spoken: scrape /metrics on the debug port",
                        "TRACING_ENABLED" => "tracing is not exported yet",
                        "GRPC_SERVER_USE_TLS" => {
                            "TLS on gRPC is set in a rules file's `tls:` (SPILLWAY_CONFIG)"
                        }
                        _ => "not supported",
                    })
                }
                _ => None,
            }
        };
        if let Some(why) = why {
            refused.push(format!("  {name}: {why}"));
        }
    }
    (!refused.is_empty()).then(|| {
        format!(
            "ratelimit: envoyproxy/ratelimit settings this entry does not honour (unset them, or \
             run `spillway serve` with a rules file):\n{}",
            refused.join("\n")
        )
    })
}

/// The `serve` command line from envoyproxy/ratelimit's variables, as
/// `env` gives them (its defaults where unset).
fn serve_args(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<OsString> {
    let var = |name: &str, default: &str| -> OsString {
        env(name)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| default.into())
    };
    // Go's `net.JoinHostPort`: an IPv6 host in brackets.
    let addr = |host: &str, port: &str, default_port: &str| -> OsString {
        let h = var(host, "0.0.0.0").to_string_lossy().into_owned();
        let p = var(port, default_port).to_string_lossy().into_owned();
        if h.contains(':') {
            format!("[{h}]:{p}").into()
        } else {
            format!("{h}:{p}").into()
        }
    };
    let mut dir = PathBuf::from(var("RUNTIME_ROOT", "/srv/runtime_data/current"));
    if let Some(sub) = env("RUNTIME_SUBDIRECTORY").filter(|s| !s.is_empty()) {
        dir.push(sub);
    }
    dir.push(var("RUNTIME_APPDIRECTORY", "config"));
    let mut args: Vec<OsString> = vec!["ratelimit".into()];
    // ratelimit's LOG_FORMAT: `json` or `text`.
    if env("LOG_FORMAT").is_some_and(|f| f.eq_ignore_ascii_case("json")) {
        args.extend(["--log-format".into(), "json".into()]);
    }
    args.extend([
        "serve".into(),
        "--config".into(),
        var("SPILLWAY_CONFIG", RULES),
        "--listen".into(),
        addr("HOST", "PORT", "8080"),
        "--grpc-listen".into(),
        addr("GRPC_HOST", "GRPC_PORT", "8081"),
        "--admin-listen".into(),
        addr("DEBUG_HOST", "DEBUG_PORT", "6070"),
        "--envoy-config".into(),
        dir.into(),
    ]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(vars: &[(&str, &str)]) -> Vec<String> {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        serve_args(&env)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn refused(vars: &[(&str, &str)]) -> Option<String> {
        let names: Vec<String> = vars.iter().map(|(k, _)| (*k).to_string()).collect();
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        not_honoured(&names, &env)
    }

    /// A setting passed over would limit otherwise than the operator
    /// believes (per instance instead of shared in Redis, by no rules
    /// instead of xDS's): the start stops, naming each.
    #[test]
    fn settings_it_cannot_honour_stop_the_start() {
        for (name, value) in [
            ("REDIS_URL", "redis:6379"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("USE_PROMETHEUS", "true"),
            ("TRACING_ENABLED", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("BACKEND_TYPE", "memcache"),
        ] {
            let why = refused(&[(name, value), ("HOST", "0.0.0.0")])
                .unwrap_or_else(|| panic!("{name}={value} passed"));
            assert!(why.contains(name) && !why.contains("HOST"), "{why}");
        }
        // Off values, ratelimit's defaults and what is read pass.
        for vars in [
            &[("USE_STATSD", "false"), ("USE_PROMETHEUS", "false")][..],
            &[("CONFIG_TYPE", "FILE"), ("BACKEND_TYPE", "redis")],
            &[
                ("RUNTIME_ROOT", "/data"),
                ("LOG_FORMAT", "json"),
                ("REDIS_URL", ""),
            ],
        ] {
            assert_eq!(refused(vars), None, "{vars:?}");
        }
        let both = refused(&[("REDIS_URL", "r:1"), ("TRACING_ENABLED", "true")]).unwrap();
        assert!(
            both.contains("REDIS_URL") && both.contains("TRACING_ENABLED"),
            "{both}"
        );
    }

    #[test]
    fn defaults_are_ratelimits_ports_and_directory() {
        assert_eq!(
            run(&[]).join(" "),
            "ratelimit serve --config /etc/spillway/ratelimit.yaml --listen 0.0.0.0:8080 \
             --grpc-listen 0.0.0.0:8081 --admin-listen 0.0.0.0:6070 \
             --envoy-config /srv/runtime_data/current/config"
        );
    }

    #[test]
    fn the_variables_envoy_gateway_sets_are_read() {
        let args = run(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("GRPC_PORT", "18081"),
            ("HOST", "::"),
            ("LOG_FORMAT", "json"),
            ("SPILLWAY_CONFIG", "/etc/r.yaml"),
        ])
        .join(" ");
        assert_eq!(
            args,
            "ratelimit --log-format json serve --config /etc/r.yaml --listen [::]:8080 \
             --grpc-listen 0.0.0.0:18081 --admin-listen 0.0.0.0:6070 \
             --envoy-config /data/ratelimit/config"
        );
    }
}
