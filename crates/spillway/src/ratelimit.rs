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
/// `ratelimit`; `None` otherwise.
pub(crate) fn args() -> Option<Vec<OsString>> {
    let argv0 = std::env::args_os().next()?;
    if Path::new(&argv0).file_name()? != "ratelimit" {
        return None;
    }
    Some(serve_args(&|name| std::env::var_os(name)))
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
