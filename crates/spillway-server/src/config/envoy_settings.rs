//! The rules file's `envoy:` section and the environment variables
//! envoyproxy/ratelimit reads, made into the gRPC way in's
//! [`EnvoySettings`]: a variable that is set wins over the file, as a flag
//! does.

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
    };
    (settings, errors)
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
