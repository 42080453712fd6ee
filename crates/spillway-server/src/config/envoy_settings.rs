//! The rules file's `envoy:` section and the environment variables
//! envoyproxy/ratelimit reads, made into the gRPC way in's
//! [`EnvoySettings`]: a variable that is set wins over the file, as a flag
//! does.

use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::ConfigError;
use crate::grpc::service::settings::{
    DEFAULT_DETAILED_METRIC_MAX_VALUES, DEFAULT_NEAR_LIMIT_RATIO, EnvoySettings, LimitHeaders,
};

/// The rules file's `envoy:` section as serde reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnvoy {
    #[serde(default)]
    limit_response_headers_enabled: Option<Spanned<bool>>,
    #[serde(default)]
    limit_limit_header: Option<Spanned<String>>,
    #[serde(default)]
    limit_remaining_header: Option<Spanned<String>>,
    #[serde(default)]
    limit_reset_header: Option<Spanned<String>>,
    #[serde(default)]
    near_limit_ratio: Option<Spanned<f64>>,
    #[serde(default)]
    response_dynamic_metadata: Option<Spanned<bool>>,
    #[serde(default)]
    shadow_mode: Option<Spanned<bool>>,
    #[serde(default)]
    quota_mode: Option<Spanned<bool>>,
    #[serde(default)]
    detailed_metric_max_values: Option<Spanned<u64>>,
    #[serde(default)]
    max_connection_age: Option<Spanned<String>>,
    #[serde(default)]
    max_connection_age_grace: Option<Spanned<String>>,
}

/// One setting's value and where it came from, for errors.
enum From<T> {
    Default(T),
    File(T, u64, u64),
    Env(T, &'static str),
}

/// The settings from the rules file's `envoy:` section (`raw`, in
/// `file`) and the environment (`env` looks a variable up), with every
/// problem found.
pub(crate) fn load(
    raw: Option<&Spanned<RawEnvoy>>,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> (EnvoySettings, Vec<ConfigError>) {
    let empty = RawEnvoy::default();
    let r = raw.map_or(&empty, |r| &r.value);
    let mut errors = Vec::new();
    let mut err = |line: u64, column: u64, file: &str, message: String| {
        errors.push(ConfigError::new(file.to_string(), line, column, message));
    };
    // The environment's value if set (parsed), else the file's, else `default`.
    let pick = |var: &'static str,
                file_value: Option<(String, u64, u64)>,
                default: String|
     -> From<String> {
        match env(var) {
            Some(v) => From::Env(v, var),
            None => match file_value {
                Some((v, l, c)) => From::File(v, l, c),
                None => From::Default(default),
            },
        }
    };
    let at = |s: &Spanned<String>| (s.value.clone(), s.referenced.line(), s.referenced.column());
    let at_bool = |s: &Spanned<bool>| {
        (
            s.value.to_string(),
            s.referenced.line(),
            s.referenced.column(),
        )
    };
    let enabled = pick(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        r.limit_response_headers_enabled.as_ref().map(at_bool),
        "false".into(),
    );
    let names = [
        (
            "LIMIT_LIMIT_HEADER",
            r.limit_limit_header.as_ref().map(at),
            "RateLimit-Limit",
        ),
        (
            "LIMIT_REMAINING_HEADER",
            r.limit_remaining_header.as_ref().map(at),
            "RateLimit-Remaining",
        ),
        (
            "LIMIT_RESET_HEADER",
            r.limit_reset_header.as_ref().map(at),
            "RateLimit-Reset",
        ),
    ]
    .map(|(var, v, d)| pick(var, v, d.into()));
    let ratio = pick(
        "NEAR_LIMIT_RATIO",
        r.near_limit_ratio.as_ref().map(|s| {
            (
                s.value.to_string(),
                s.referenced.line(),
                s.referenced.column(),
            )
        }),
        DEFAULT_NEAR_LIMIT_RATIO.to_string(),
    );
    let metadata = pick(
        "RESPONSE_DYNAMIC_METADATA",
        r.response_dynamic_metadata.as_ref().map(at_bool),
        "false".into(),
    );
    let shadow = pick(
        "SHADOW_MODE",
        r.shadow_mode.as_ref().map(at_bool),
        "false".into(),
    );
    let quota = pick(
        "QUOTA_MODE",
        r.quota_mode.as_ref().map(at_bool),
        "false".into(),
    );
    // Unset (empty): no age, or ratelimit's under its entry (the binary's).
    let age = pick(
        "GRPC_MAX_CONNECTION_AGE",
        r.max_connection_age.as_ref().map(at),
        String::new(),
    );
    let grace = pick(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        r.max_connection_age_grace.as_ref().map(at),
        "1h".into(),
    );
    let mut check =
        |f: From<String>, what: &str, parse: &dyn Fn(&str) -> Result<(), String>| -> String {
            let (v, line, column, shown) = match f {
                From::Default(v) => return v,
                From::File(v, l, c) => (v, l, c, format!("envoy.{what}")),
                From::Env(v, var) => {
                    let shown = format!("{var}={v:?} (environment)");
                    (v, 0, 0, shown)
                }
            };
            if let Err(why) = parse(&v) {
                let where_ = if line == 0 { "<environment>" } else { file };
                err(line, column, where_, format!("{shown}: {why}"));
            }
            v
        };
    let bool_ok = |v: &str| {
        parse_bool(v)
            .map(|_| ())
            .ok_or_else(|| "expected true or false".to_string())
    };
    let enabled = check(enabled, "limit_response_headers_enabled", &bool_ok);
    let [limit, remaining, reset] = names;
    let name_ok = |v: &str| {
        if !v.is_empty() && v.bytes().all(is_token) {
            Ok(())
        } else {
            Err("expected a header name (letters, digits and !#$%&'*+-.^_`|~)".to_string())
        }
    };
    let limit = check(limit, "limit_limit_header", &name_ok);
    let remaining = check(remaining, "limit_remaining_header", &name_ok);
    let reset = check(reset, "limit_reset_header", &name_ok);
    let ratio = check(
        ratio,
        "near_limit_ratio",
        &|v| match v.trim().parse::<f32>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            _ => Err("expected a number from 0 to 1".to_string()),
        },
    );
    let metadata = check(metadata, "response_dynamic_metadata", &bool_ok);
    let shadow = check(shadow, "shadow_mode", &bool_ok);
    let quota = check(quota, "quota_mode", &bool_ok);
    let duration_ok = |v: &str| go_duration(v).map(|_| ());
    let age = check(age, "max_connection_age", &duration_ok);
    let grace = check(grace, "max_connection_age_grace", &duration_ok);
    let settings = EnvoySettings {
        limit_headers: parse_bool(&enabled)
            .unwrap_or(false)
            .then_some(LimitHeaders {
                limit,
                remaining,
                reset,
            }),
        near_limit_ratio: ratio.trim().parse().unwrap_or(DEFAULT_NEAR_LIMIT_RATIO),
        response_dynamic_metadata: parse_bool(&metadata).unwrap_or(false),
        shadow_mode: parse_bool(&shadow).unwrap_or(false),
        quota_mode: parse_bool(&quota).unwrap_or(false),
        detailed_metric_max_values: r
            .detailed_metric_max_values
            .as_ref()
            .map_or(DEFAULT_DETAILED_METRIC_MAX_VALUES, |n| {
                usize::try_from(n.value).unwrap_or(usize::MAX)
            }),
        max_connection_age: go_duration(&age).ok(),
        // 0 is no bound, as grpc-go takes it.
        max_connection_age_grace: go_duration(&grace)
            .ok()
            .filter(|g| !g.is_zero())
            .unwrap_or(Duration::MAX),
        // As ratelimit reads it: empty is unset.
        grpc_uds: env("GRPC_UDS")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from),
    };
    (settings, errors)
}

/// A duration as Go's `time.ParseDuration` reads it (envoyproxy/ratelimit's
/// `GRPC_MAX_CONNECTION_AGE` and `_GRACE`): `0`, or pieces of a decimal
/// number and a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), like `24h`,
/// `1h30m`, `1.5h`, `500ms`. A negative one is refused (grpc-go would take
/// it as "now").
pub(crate) fn go_duration(v: &str) -> Result<Duration, String> {
    let v = v.strip_prefix('+').unwrap_or(v);
    if v == "0" {
        return Ok(Duration::ZERO);
    }
    if v.starts_with('-') {
        return Err("expected a duration that is not negative".into());
    }
    let expected = || "expected a duration like 24h, 1h30m or 500ms".to_string();
    if v.is_empty() {
        return Err(expected());
    }
    let mut total = Duration::ZERO;
    let mut rest = v;
    while !rest.is_empty() {
        let num = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(expected)?;
        let unit_len = rest[num..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len() - num);
        let (n, unit) = (&rest[..num], &rest[num..num + unit_len]);
        let unit = match unit {
            "ns" | "us" | "ms" | "s" | "m" | "h" => unit,
            "µs" | "μs" => "us",
            _ => return Err(expected()),
        };
        if n.is_empty() || n == "." {
            return Err(expected());
        }
        let piece = spillway_core::parse_duration(&format!("{n}{unit}")).map_err(|_| expected())?;
        total = total
            .checked_add(piece.into())
            .ok_or_else(|| "the duration is too long".to_string())?;
        rest = &rest[num + unit_len..];
    }
    Ok(total)
}

/// A boolean as Go's `strconv.ParseBool` reads it (envoyproxy/ratelimit's
/// settings go through it).
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// A byte of an HTTP token (RFC 9110), which header names are.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str, env: &[(&str, &str)]) -> (EnvoySettings, Vec<ConfigError>) {
        let raw: Option<Spanned<RawEnvoy>> = if yaml.is_empty() {
            None
        } else {
            Some(serde_saphyr::from_str(yaml).unwrap())
        };
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        super::load(raw.as_ref(), "rules.yaml", &|k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn defaults_file_and_environment() {
        let (s, e) = load("", &[]);
        assert!(e.is_empty());
        assert_eq!(s, EnvoySettings::default());
        let (s, e) = load(
            "limit_response_headers_enabled: true\nlimit_reset_header: X-Reset\nnear_limit_ratio: 0.5\nquota_mode: true\n",
            &[("LIMIT_LIMIT_HEADER", "X-Limit")],
        );
        assert!(e.is_empty(), "{e:?}");
        let h = s.limit_headers.unwrap();
        assert_eq!(
            (h.limit.as_str(), h.remaining.as_str(), h.reset.as_str()),
            ("X-Limit", "RateLimit-Remaining", "X-Reset")
        );
        assert!((s.near_limit_ratio - 0.5).abs() < f32::EPSILON);
        assert!(s.quota_mode && !s.shadow_mode);
        // The environment wins over the file.
        let (s, _) = load(
            "limit_response_headers_enabled: true\n",
            &[("LIMIT_RESPONSE_HEADERS_ENABLED", "False")],
        );
        assert!(s.limit_headers.is_none());
    }

    #[test]
    fn go_durations_as_ratelimit_reads_them() {
        let d = |s: &str| go_duration(s);
        assert_eq!(d("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(d("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(d("1.5h"), Ok(Duration::from_secs(5_400)));
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(d("2m3s4ms5us6ns"), Ok(Duration::new(123, 4_005_006)));
        assert_eq!(d("0"), Ok(Duration::ZERO));
        assert_eq!(d("3µs"), Ok(Duration::from_micros(3)));
        for bad in [
            "", "1", "1d", "-1h", "h", "1h 30m", " 1h", "1x", ".h", "1hh",
        ] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn connection_age_from_the_file_or_the_environment() {
        let (s, e) = load("", &[]);
        assert!(e.is_empty());
        assert_eq!(s.max_connection_age, None);
        assert_eq!(s.max_connection_age_grace, Duration::from_secs(3_600));
        let (s, e) = load(
            "max_connection_age: 1h30m\nmax_connection_age_grace: 10s\n",
            &[("GRPC_UDS", "/run/rl.sock")],
        );
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(s.max_connection_age, Some(Duration::from_secs(5_400)));
        assert_eq!(s.max_connection_age_grace, Duration::from_secs(10));
        assert_eq!(s.grpc_uds, Some("/run/rl.sock".into()));
        let (s, _) = load(
            "max_connection_age: 1h\n",
            &[
                ("GRPC_MAX_CONNECTION_AGE", "5m"),
                ("GRPC_MAX_CONNECTION_AGE_GRACE", "0"),
            ],
        );
        assert_eq!(s.max_connection_age, Some(Duration::from_secs(300)));
        assert_eq!(s.max_connection_age_grace, Duration::MAX);
        let (_, e) = load(
            "max_connection_age: 1d\n",
            &[("GRPC_MAX_CONNECTION_AGE_GRACE", "soon")],
        );
        let shown: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(
            shown
                .iter()
                .any(|s| s.starts_with("rules.yaml:1:") && s.contains("envoy.max_connection_age"))
        );
        assert!(
            shown
                .iter()
                .any(|s| s.contains("GRPC_MAX_CONNECTION_AGE_GRACE=\"soon\""))
        );
    }

    #[test]
    fn bad_values_are_reported_with_where_they_came_from() {
        let (_, e) = load(
            "near_limit_ratio: 1.5\nlimit_limit_header: \"a b\"\n",
            &[("SHADOW_MODE", "yes")],
        );
        let shown: Vec<String> = e.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 3, "{shown:?}");
        assert!(
            shown
                .iter()
                .any(|s| s.starts_with("rules.yaml:1:") && s.contains("near_limit_ratio"))
        );
        assert!(
            shown
                .iter()
                .any(|s| s.starts_with("rules.yaml:2:") && s.contains("header name"))
        );
        assert!(shown.iter().any(|s| s.contains("SHADOW_MODE=\"yes\"")));
    }
}
