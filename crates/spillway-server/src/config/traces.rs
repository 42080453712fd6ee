//! The rules file's `traces:` section and the OpenTelemetry SDK's
//! environment variables (`OTEL_*`), made into the tracer's
//! [`TraceSettings`]: a variable that is set wins over the file, as with
//! `envoy:`. Also envoyproxy/ratelimit's `TRACING_*` variables, as the
//! `OTEL_*` ones they stand for ([`ratelimit_tracing_env`]).
//!
//! Traces are off unless asked for: `OTEL_TRACES_EXPORTER=otlp`, a
//! `traces:` section, or an OTLP endpoint variable turns them on;
//! `OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` keeps them off.
//! A value spillway cannot honour (an unknown sampler, exporter or
//! protocol, an endpoint that is not an `http://` or `https://` URL, TLS
//! files that cannot be read or used) stops the start.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::ConfigError;
use crate::trace::{Protocol, Sampler, TraceSettings, TraceTls};

/// The rules file's `traces:` section as serde reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTraces {
    #[serde(default)]
    endpoint: Option<Spanned<String>>,
    #[serde(default)]
    protocol: Option<Spanned<String>>,
    #[serde(default)]
    sample_ratio: Option<Spanned<f64>>,
    #[serde(default)]
    service_name: Option<Spanned<String>>,
    #[serde(default)]
    headers: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    #[serde(default)]
    tls: Option<Spanned<RawTraceTls>>,
}

/// `traces.tls`: the files for an `https://` collector.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTraceTls {
    #[serde(default)]
    ca: Option<Spanned<String>>,
    #[serde(default)]
    cert: Option<Spanned<String>>,
    #[serde(default)]
    key: Option<Spanned<String>>,
}

const DEFAULT_TIMEOUT_MS: u64 = 10_000;
const DEFAULT_DELAY_MS: u64 = 5_000;
const DEFAULT_QUEUE: usize = 2_048;
const DEFAULT_BATCH: usize = 512;
const MOST_QUEUE: usize = 1 << 20;

/// Collects errors, environment ones first named by their variable.
struct Errors<'a> {
    file: &'a str,
    list: Vec<ConfigError>,
    /// The environment's: reported only when traces are on.
    env_list: Vec<ConfigError>,
}

impl Errors<'_> {
    fn env(&mut self, var: &str, shown: Option<&str>, why: impl std::fmt::Display) {
        let what = match shown {
            Some(v) => format!("{var}={v:?} (environment): {why}"),
            None => format!("{var} (environment): {why}"),
        };
        self.env_list
            .push(ConfigError::new("<environment>", 0, 0, what));
    }

    /// An environment error reported whether traces are on or not (the
    /// variables that say whether they are).
    fn env_now(&mut self, var: &str, shown: &str, why: &str) {
        self.env(var, Some(shown), why);
        self.list.extend(self.env_list.pop());
    }

    fn file<T>(&mut self, at: &Spanned<T>, field: &str, why: impl std::fmt::Display) {
        self.list.push(ConfigError::new(
            self.file.to_string(),
            at.referenced.line(),
            at.referenced.column(),
            format!("traces.{field}: {why}"),
        ));
    }
}

/// The tracer's settings from the rules file's `traces:` section (`raw`,
/// in `file`) and the environment (`env` looks a variable up): `None`
/// when traces are off; every problem found.
pub(crate) fn load(
    raw: Option<&Spanned<RawTraces>>,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> (Option<TraceSettings>, Vec<ConfigError>) {
    // The specification: an empty variable is an unset one.
    let var = |name: &'static str| {
        env(name)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (name, v))
    };
    let mut errs = Errors {
        file,
        list: Vec::new(),
        env_list: Vec::new(),
    };
    let empty = RawTraces::default();
    let r = raw.map_or(&empty, |r| &r.value);
    let disabled = match var("OTEL_SDK_DISABLED") {
        None => false,
        Some((n, v)) => match v.trim().to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            _ => {
                errs.env_now(n, &v, "expected true or false");
                false
            }
        },
    };
    let endpoint_var = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    let on = match var("OTEL_TRACES_EXPORTER") {
        None => raw.is_some() || endpoint_var,
        Some((n, v)) => match v.trim() {
            "none" => false,
            "otlp" => true,
            _ => {
                errs.env_now(
                    n,
                    &v,
                    "spillway exports traces over OTLP only: expected otlp or none",
                );
                false
            }
        },
    };
    let protocol = pick_protocol(&mut errs, r, &var);
    let endpoint = pick_endpoint(&mut errs, r, &var, protocol);
    let headers = pick_headers(&mut errs, r, &var);
    let tls = endpoint
        .as_ref()
        .and_then(|e| pick_tls(&mut errs, r, &var, e.scheme_str() == Some("https")));
    let ms = |errs: &mut Errors<'_>, names: &[&'static str], default: u64| -> Duration {
        let Some((n, v)) = names.iter().find_map(|n| var(n)) else {
            return Duration::from_millis(default);
        };
        match v.trim().parse::<u64>() {
            Ok(x) if x > 0 => Duration::from_millis(x),
            _ => {
                errs.env(
                    n,
                    Some(&v),
                    "expected a whole number of milliseconds, at least 1",
                );
                Duration::from_millis(default)
            }
        }
    };
    let timeout = ms(
        &mut errs,
        &[
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ],
        DEFAULT_TIMEOUT_MS,
    );
    let schedule_delay = ms(&mut errs, &["OTEL_BSP_SCHEDULE_DELAY"], DEFAULT_DELAY_MS);
    let count = |errs: &mut Errors<'_>, name: &'static str, default: usize| -> usize {
        let Some((n, v)) = var(name) else {
            return default;
        };
        match v.trim().parse::<usize>() {
            Ok(x) if (1..=MOST_QUEUE).contains(&x) => x,
            _ => {
                errs.env(
                    n,
                    Some(&v),
                    format!("expected a whole number from 1 to {MOST_QUEUE}"),
                );
                default
            }
        }
    };
    let max_queue = count(&mut errs, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_QUEUE);
    let max_batch =
        count(&mut errs, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_BATCH).min(max_queue);
    let sampler = pick_sampler(&mut errs, r, &var);
    let resource = pick_resource(&mut errs, r, &var);
    if disabled || !on {
        // Off: only the file's own section is checked (it is spillway's);
        // the `OTEL_*` variables may be meant for other programs.
        return (None, errs.list);
    }
    errs.list.append(&mut errs.env_list);
    let settings = endpoint.map(|endpoint| TraceSettings {
        protocol,
        endpoint,
        tls,
        headers,
        timeout,
        sampler,
        resource,
        max_queue,
        max_batch,
        schedule_delay,
    });
    (settings, errs.list)
}

type Var<'a> = dyn Fn(&'static str) -> Option<(&'static str, String)> + 'a;

fn pick_protocol(errs: &mut Errors<'_>, r: &RawTraces, var: &Var<'_>) -> Protocol {
    let parse = |v: &str| match v.trim() {
        "grpc" => Ok(Protocol::Grpc),
        "http/protobuf" => Ok(Protocol::HttpProtobuf),
        "http/json" => Err("http/json is not supported: grpc or http/protobuf"),
        _ => Err("expected grpc or http/protobuf"),
    };
    let env =
        var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match (env, &r.protocol) {
        (Some((n, v)), _) => parse(&v).unwrap_or_else(|why| {
            errs.env(n, Some(&v), why);
            Protocol::HttpProtobuf
        }),
        (None, Some(p)) => parse(&p.value).unwrap_or_else(|why| {
            errs.file(p, "protocol", format!("{:?}: {why}", p.value));
            Protocol::HttpProtobuf
        }),
        // The specification's default, and envoyproxy/ratelimit's.
        (None, None) => Protocol::HttpProtobuf,
    }
}

/// An `http://` or `https://` URL with a host.
fn url(v: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = v
        .trim()
        .parse()
        .map_err(|e| format!("not a URL ({e}); expected one such as http://collector:4318"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(
                "expected an http:// or https:// URL, such as http://collector:4318".into(),
            );
        }
    }
    match uri.authority() {
        Some(a) if !a.host().is_empty() && !a.as_str().contains('@') => Ok(uri),
        Some(_) => Err("expected a host and port, without user information".into()),
        None => Err("expected a host, such as http://collector:4318".into()),
    }
}

/// `uri` with `/v1/traces` after its path (OTLP/HTTP's signal path).
fn with_signal_path(uri: &http::Uri) -> http::Uri {
    let base = uri.path().trim_end_matches('/');
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = format!("{base}/v1/traces").parse().ok();
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

fn pick_endpoint(
    errs: &mut Errors<'_>,
    r: &RawTraces,
    var: &Var<'_>,
    protocol: Protocol,
) -> Option<http::Uri> {
    let http = protocol == Protocol::HttpProtobuf;
    if let Some((n, v)) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        // The signal's own URL: used as it is.
        return url(&v).map_err(|why| errs.env(n, Some(&v), why)).ok();
    }
    if let Some((n, v)) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        let u = url(&v).map_err(|why| errs.env(n, Some(&v), why)).ok()?;
        return Some(if http { with_signal_path(&u) } else { u });
    }
    if let Some(e) = &r.endpoint {
        let u = url(&e.value)
            .map_err(|why| errs.file(e, "endpoint", format!("{:?}: {why}", e.value)))
            .ok()?;
        let bare = matches!(u.path(), "" | "/");
        return Some(if http && bare {
            with_signal_path(&u)
        } else {
            u
        });
    }
    let default = if http {
        "http://localhost:4318/v1/traces"
    } else {
        "http://localhost:4317"
    };
    default.parse().ok()
}

/// TLS for the collector: the CA and client certificate files from
/// `OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE` (else `..._OTLP_CERTIFICATE`),
/// `..._CLIENT_CERTIFICATE` and `..._CLIENT_KEY`, else `traces.tls`,
/// read now. `Some` for an `https://` endpoint (`secure`). For an
/// `http://` one, files named for traces (the `..._TRACES_...` variables,
/// `traces.tls`) could not be used and stop the start; the general
/// variables apply to every signal of a process and are for `https://`
/// endpoints only (as the OpenTelemetry specification has them).
fn pick_tls(errs: &mut Errors<'_>, r: &RawTraces, var: &Var<'_>, secure: bool) -> Option<TraceTls> {
    /// Where a file's name came from: a variable, or the file's field.
    enum From<'a> {
        Var(&'static str, bool),
        File(&'a Spanned<String>, &'static str),
    }
    let file = r.tls.as_ref().map(|t| &t.value);
    let pick = |signal: &'static str,
                general: &'static str,
                field: &'static str,
                of: fn(&RawTraceTls) -> &Option<Spanned<String>>| {
        if let Some((n, v)) = var(signal) {
            return Some((v, From::Var(n, true)));
        }
        if let Some((n, v)) = var(general) {
            return Some((v, From::Var(n, false)));
        }
        file.and_then(|t| of(t).as_ref())
            .map(|s| (s.value.clone(), From::File(s, field)))
    };
    let named = [
        pick(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "tls.ca",
            |t| &t.ca,
        ),
        pick(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "tls.cert",
            |t| &t.cert,
        ),
        pick(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            "tls.key",
            |t| &t.key,
        ),
    ];
    // A problem is reported where the names came from: each variable by
    // name, a field of the file by its line.
    let report = |errs: &mut Errors<'_>, which: &[usize], why: &str| {
        let mut told = false;
        for i in which {
            match &named[*i] {
                Some((_, From::Var(n, _))) => errs.env(n, None, why),
                Some((_, From::File(at, field))) => errs.file(*at, field, why),
                None => continue,
            }
            told = true;
        }
        if !told {
            // Nothing named: the system's bundle.
            errs.env(
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                None,
                format!("(unset) {why}"),
            );
        }
    };
    if !secure {
        let for_traces: Vec<usize> = (0..3)
            .filter(|i| match &named[*i] {
                Some((_, From::Var(_, specific))) => *specific,
                Some((_, From::File(..))) => true,
                None => false,
            })
            .collect();
        if !for_traces.is_empty() {
            report(
                errs,
                &for_traces,
                "a TLS file is named for traces but the collector's endpoint is http://: use https:// (or name no file)",
            );
        }
        return None;
    }
    let path = |i: usize| named[i].as_ref().map(|(v, _)| std::path::PathBuf::from(v));
    let (ca, cert, key) = (path(0), path(1), path(2));
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => {
            report(
                errs,
                &[1, 2],
                "a client certificate needs its key, and a key its certificate",
            );
            return None;
        }
    };
    let paths = client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    match crate::tls::client_config("trace collector", ca.as_deref(), paths) {
        Ok(config) => Some(TraceTls {
            ca,
            client,
            config: std::sync::Arc::new(config),
        }),
        Err(why) => {
            // Told once, where the file the message names came from (the
            // system's bundle when none is).
            let which: Vec<usize> = (0..3)
                .filter(|i| {
                    named[*i]
                        .as_ref()
                        .is_some_and(|(v, _)| why.contains(v.as_str()))
                })
                .take(1)
                .collect();
            report(errs, &which, &why);
            None
        }
    }
}

/// `k=v,k2=v2` as the `OTEL_*` lists write them (values percent-encoded).
fn key_values(v: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, entry) in v.split(',').enumerate() {
        if entry.trim().is_empty() {
            continue;
        }
        let Some((k, val)) = entry.split_once('=') else {
            return Err(format!("entry {} is not key=value", i + 1));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("entry {} has no key", i + 1));
        }
        let val = percent_decode(val.trim())
            .ok_or_else(|| format!("entry {} ({k}): a bad %-escape or not UTF-8", i + 1))?;
        out.push((k.to_string(), val));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `v` percent-encoded for an `OTEL_*` list.
fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

type Header = (http::HeaderName, http::HeaderValue);

/// A header from `k` and `v`; the error never shows the value (often a
/// credential).
fn header(k: &str, v: &str) -> Result<Header, String> {
    let name = http::HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes())
        .map_err(|_| format!("{k:?} is not a header name"))?;
    let value = http::HeaderValue::from_str(v)
        .map_err(|_| format!("the value of {k:?} is not a header value"))?;
    Ok((name, value))
}

fn pick_headers(errs: &mut Errors<'_>, r: &RawTraces, var: &Var<'_>) -> Vec<Header> {
    let env =
        var("OTEL_EXPORTER_OTLP_TRACES_HEADERS").or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"));
    if let Some((n, v)) = env {
        let pairs = match key_values(&v) {
            Ok(p) => p,
            Err(why) => {
                errs.env(n, None, why);
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (k, v) in pairs {
            match header(&k, &v) {
                Ok(h) => out.push(h),
                Err(why) => errs.env(n, None, why),
            }
        }
        return out;
    }
    let mut out = Vec::new();
    if let Some(map) = &r.headers {
        for (k, v) in &map.value {
            match header(k, &v.value) {
                Ok(h) => out.push(h),
                Err(why) => errs.file(v, "headers", why),
            }
        }
    }
    out
}

fn pick_sampler(errs: &mut Errors<'_>, r: &RawTraces, var: &Var<'_>) -> Sampler {
    let ratio_ok = |x: f64| (0.0..=1.0).contains(&x);
    let file_ratio = r.sample_ratio.as_ref().and_then(|s| {
        if ratio_ok(s.value) {
            Some(s.value)
        } else {
            errs.file(
                s,
                "sample_ratio",
                format!("{}: expected a number from 0 to 1", s.value),
            );
            None
        }
    });
    let arg = var("OTEL_TRACES_SAMPLER_ARG").and_then(|(n, v)| match v.trim().parse::<f64>() {
        Ok(x) if ratio_ok(x) => Some(x),
        _ => {
            errs.env(
                n,
                Some(&v),
                "expected a number from 0 to 1 (the share of traces kept)",
            );
            None
        }
    });
    let ratio = arg.or(file_ratio).unwrap_or(1.0);
    let Some((n, v)) = var("OTEL_TRACES_SAMPLER") else {
        return Sampler {
            ratio,
            parent_based: true,
        };
    };
    let (ratio, parent_based) = match v.trim() {
        "always_on" => (1.0, false),
        "always_off" => (0.0, false),
        "traceidratio" => (ratio, false),
        "parentbased_always_on" => (1.0, true),
        "parentbased_always_off" => (0.0, true),
        "parentbased_traceidratio" => (ratio, true),
        _ => {
            errs.env(
                n,
                Some(&v),
                "expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio",
            );
            (1.0, true)
        }
    };
    Sampler {
        ratio,
        parent_based,
    }
}

fn pick_resource(errs: &mut Errors<'_>, r: &RawTraces, var: &Var<'_>) -> Vec<(String, String)> {
    let mut attrs: Vec<(String, String)> = Vec::new();
    if let Some((n, v)) = var("OTEL_RESOURCE_ATTRIBUTES") {
        match key_values(&v) {
            Ok(list) => {
                for (k, v) in list {
                    // A key given twice: the last one.
                    attrs.retain(|(x, _)| *x != k);
                    attrs.push((k, v));
                }
            }
            Err(why) => errs.env(n, Some(&v), why),
        }
    }
    let from_attrs = attrs
        .iter()
        .position(|(k, _)| k == "service.name")
        .map(|i| attrs.remove(i).1);
    let name = var("OTEL_SERVICE_NAME")
        .map(|(_, v)| v.trim().to_string())
        .or(from_attrs)
        .or_else(|| r.service_name.as_ref().map(|s| s.value.clone()))
        .unwrap_or_else(|| "spillway".into());
    let mut out = vec![("service.name".to_string(), name)];
    out.extend(attrs);
    out
}

/// The `OTEL_*` variables that stand for envoyproxy/ratelimit's
/// `TRACING_*` ones as `env` gives them, for the `ratelimit` entry to
/// set before the configuration is read (an `OTEL_*` variable already
/// set wins, and is not in the list):
///
/// - `TRACING_ENABLED` (Go's boolean; false by default): `true` sets
///   `OTEL_TRACES_EXPORTER=otlp`, anything false `none` (as ratelimit,
///   which exports nothing unless asked, whatever `OTEL_*` says);
/// - `TRACING_SERVICE_NAME` (default `RateLimit`): `OTEL_SERVICE_NAME`;
/// - `TRACING_SERVICE_NAMESPACE`, `TRACING_SERVICE_INSTANCE_ID` (a random
///   UUID when empty): `service.namespace` and `service.instance.id` in
///   `OTEL_RESOURCE_ATTRIBUTES` (ahead of any given there, which win);
/// - `TRACING_EXPORTER_PROTOCOL` (`http`, the default, or `grpc`):
///   `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`;
/// - `TRACING_SAMPLING_RATE` (default 1; at or over 1 every trace, at or
///   under 0 none): `OTEL_TRACES_SAMPLER=parentbased_traceidratio` and
///   `OTEL_TRACES_SAMPLER_ARG`.
///
/// # Errors
/// A value ratelimit would refuse too (not a boolean, an unknown
/// protocol, a rate that is not a number), naming the variable.
pub fn ratelimit_tracing_env(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(&'static str, String)>, String> {
    let get = |n: &str| env(n).filter(|v| !v.is_empty());
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let mut put = |k: &'static str, v: String| {
        if get(k).is_none() {
            out.push((k, v));
        }
    };
    let enabled = match get("TRACING_ENABLED").as_deref() {
        None => false,
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => true,
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => false,
        Some(v) => return Err(format!("TRACING_ENABLED={v:?}: expected true or false")),
    };
    if !enabled {
        put("OTEL_TRACES_EXPORTER", "none".into());
        return Ok(out);
    }
    put("OTEL_TRACES_EXPORTER", "otlp".into());
    put(
        "OTEL_SERVICE_NAME",
        get("TRACING_SERVICE_NAME").unwrap_or_else(|| "RateLimit".into()),
    );
    let protocol = match get("TRACING_EXPORTER_PROTOCOL").as_deref() {
        None | Some("http") => "http/protobuf",
        Some("grpc") => "grpc",
        Some(v) => {
            return Err(format!(
                "TRACING_EXPORTER_PROTOCOL={v:?}: expected http or grpc"
            ));
        }
    };
    put("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol.into());
    let rate = match get("TRACING_SAMPLING_RATE") {
        None => 1.0,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if !x.is_nan() => x.clamp(0.0, 1.0),
            _ => return Err(format!("TRACING_SAMPLING_RATE={v:?}: expected a number")),
        },
    };
    put("OTEL_TRACES_SAMPLER", "parentbased_traceidratio".into());
    put("OTEL_TRACES_SAMPLER_ARG", rate.to_string());
    let mut attrs = format!(
        "service.instance.id={}",
        percent_encode(
            &get("TRACING_SERVICE_INSTANCE_ID").unwrap_or_else(crate::trace::random_instance_id)
        )
    );
    if let Some(ns) = get("TRACING_SERVICE_NAMESPACE") {
        attrs = format!("service.namespace={},{attrs}", percent_encode(&ns));
    }
    match get("OTEL_RESOURCE_ATTRIBUTES") {
        // Theirs after ours: a key in both is theirs.
        Some(theirs) => out.push(("OTEL_RESOURCE_ATTRIBUTES", format!("{attrs},{theirs}"))),
        None => out.push(("OTEL_RESOURCE_ATTRIBUTES", attrs)),
    }
    Ok(out)
}

#[cfg(test)]
#[path = "traces_tests.rs"]
mod tests;
