//! The rules file as serde reads it: every value with its line and column.

#![allow(missing_docs)]

use std::fmt;

use serde::Deserialize;
use serde_saphyr::Spanned;
pub(crate) use spillway_rules::raw::{RawLimit, RawPathMatching, RawPlans, RawRule};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) store: Option<Spanned<RawStore>>,
    #[serde(default)]
    pub(crate) on_store_error: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) proxy: Option<Spanned<RawProxy>>,
    /// The gateways' way in (`forward_auth:`).
    #[serde(default)]
    pub(crate) forward_auth: Option<Spanned<RawForwardAuth>>,
    #[serde(default)]
    pub(crate) grpc_listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) grpc_response_headers: Option<bool>,
    /// The Envoy rate limit service's settings envoyproxy/ratelimit takes
    /// from its environment.
    #[serde(default)]
    pub(crate) envoy: Option<Spanned<super::envoy_settings::RawEnvoy>>,
    #[serde(default)]
    pub(crate) admin_listen: Option<Spanned<String>>,
    /// The operator's plane: its listener, tokens and top keys.
    #[serde(default)]
    pub(crate) admin: Option<Spanned<RawAdmin>>,
    /// The decision API's own tokens.
    #[serde(default)]
    pub(crate) api: Option<Spanned<RawApi>>,
    /// Per-tenant limits, by plan name.
    #[serde(default)]
    pub(crate) plans: Option<RawPlans>,
    #[serde(default)]
    pub(crate) server: Option<Spanned<RawServer>>,
    /// HTTPS on every listener: certificate and key files.
    #[serde(default)]
    pub(crate) tls: Option<Spanned<RawTls>>,
    /// The gRPC listener's own TLS, when it differs from `tls:`.
    #[serde(default)]
    pub(crate) grpc_tls: Option<Spanned<RawTls>>,
    #[serde(default)]
    pub(crate) domains: Vec<Spanned<RawDomain>>,
    /// Descriptor names a rule's `by:` may use bare (`by: tenant`).
    #[serde(default)]
    pub(crate) descriptors: Option<Spanned<Vec<Spanned<String>>>>,
    /// Which respellings of a path count as the path, for every rule.
    #[serde(default)]
    pub(crate) path_matching: Option<Spanned<RawPathMatching>>,
    /// How the binary logs (`log: { format: json }`).
    #[serde(default)]
    pub(crate) log: Option<Spanned<RawLog>>,
    #[serde(default)]
    pub(crate) reload: Option<Spanned<RawReload>>,
    /// What "the service has room" means (elastic rules).
    #[serde(default)]
    pub(crate) health: Option<Spanned<RawHealth>>,
    /// `None` when the file has no `rules:` key (a reload refuses it).
    #[serde(default)]
    pub(crate) rules: Option<Vec<Spanned<RawRule>>>,
    /// The rules, when a large file's are read a chunk at a time (see
    /// `spillway_rules::chunks`).
    #[serde(skip)]
    pub(crate) rule_chunks: Option<spillway_rules::chunks::Chunks>,
    /// A directory of files of more rules (`config::parts`).
    #[serde(default)]
    pub(crate) rules_dir: Option<Spanned<String>>,
    /// OpenTelemetry traces: where spans go and which are kept.
    #[serde(default)]
    pub(crate) traces: Option<Spanned<super::traces::RawTraces>>,
}

/// For a file read section by section (see `spillway_rules::recover`).
impl spillway_rules::recover::Sections for RawConfig {
    fn set_rule_chunks(&mut self, chunks: spillway_rules::chunks::Chunks) {
        self.rule_chunks = Some(chunks);
    }

    fn merge(&mut self, part: RawConfig) {
        // Destructured, so a new field cannot be forgotten here.
        let RawConfig {
            store,
            on_store_error,
            listen,
            proxy,
            forward_auth,
            grpc_listen,
            grpc_response_headers,
            envoy,
            admin_listen,
            admin,
            api,
            plans,
            server,
            tls,
            grpc_tls,
            domains,
            descriptors,
            path_matching,
            log,
            reload,
            health,
            rules,
            rule_chunks: _,
            rules_dir,
            traces,
        } = part;
        fn take<T>(slot: &mut Option<T>, v: Option<T>) {
            if slot.is_none() {
                *slot = v;
            }
        }
        take(&mut self.store, store);
        take(&mut self.on_store_error, on_store_error);
        take(&mut self.listen, listen);
        take(&mut self.proxy, proxy);
        take(&mut self.forward_auth, forward_auth);
        take(&mut self.grpc_listen, grpc_listen);
        take(&mut self.grpc_response_headers, grpc_response_headers);
        take(&mut self.envoy, envoy);
        take(&mut self.admin_listen, admin_listen);
        take(&mut self.admin, admin);
        take(&mut self.api, api);
        take(&mut self.plans, plans);
        take(&mut self.server, server);
        take(&mut self.tls, tls);
        take(&mut self.grpc_tls, grpc_tls);
        self.domains.extend(domains);
        take(&mut self.descriptors, descriptors);
        take(&mut self.traces, traces);
        take(&mut self.path_matching, path_matching);
        take(&mut self.log, log);
        take(&mut self.reload, reload);
        take(&mut self.health, health);
        take(&mut self.rules_dir, rules_dir);
        if let Some(rules) = rules {
            self.rules.get_or_insert_with(Vec::new).extend(rules);
        }
    }
}

/// `reload:`: how a changed file is taken up.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReload {
    /// How long a changed file must stay unchanged before it applies.
    #[serde(default)]
    pub(crate) quiet: Option<Spanned<String>>,
}

/// `log:`: how the binary logs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    /// `text` or `json`.
    #[serde(default)]
    pub(crate) format: Option<Spanned<String>>,
}

/// A domain: envoyproxy/ratelimit's file format, also spillway's `domains:`
/// items. Where ratelimit reads a missing or null field as empty, so do
/// these (`Option`s, checked in `envoy.rs`, so a missing `domain:` or
/// `key:` gets ratelimit's message rather than serde's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDomain {
    #[serde(default)]
    pub(crate) domain: Option<Spanned<String>>,
    /// `descriptors:` with nothing after it is an empty list.
    #[serde(default)]
    pub(crate) descriptors: Option<Vec<Spanned<RawDescriptor>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    #[serde(default)]
    pub(crate) key: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) value: Option<Spanned<String>>,
    /// Envoy's own limit: a fixed window of `requests_per_unit` per `unit`.
    #[serde(default)]
    pub(crate) rate_limit: Option<Spanned<RawEnvoyRate>>,
    /// spillway's: any algorithm.
    #[serde(default)]
    pub(crate) limit: Option<Spanned<RawLimit>>,
    /// spillway's: several limits, all-or-none.
    #[serde(default)]
    pub(crate) limits: Option<Spanned<Vec<Spanned<RawLimit>>>>,
    #[serde(default)]
    pub(crate) descriptors: Option<Vec<Spanned<RawDescriptor>>>,
    #[serde(default)]
    pub(crate) shadow_mode: Option<bool>,
    #[serde(default)]
    pub(crate) quota_mode: Option<bool>,
    #[serde(default)]
    pub(crate) share_threshold: Option<Spanned<bool>>,
    /// spillway's: `replaces` beside `limit:` / `limits:`.
    #[serde(default)]
    pub(crate) replaces: Option<Vec<Spanned<RawReplace>>>,
    /// spillway's: `name` beside `limit:` / `limits:`.
    #[serde(default)]
    pub(crate) name: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) detailed_metric: Option<bool>,
    /// Accepted for compatibility: a statistics key choice of ratelimit's.
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) value_to_metric: Option<bool>,
    /// Any map: kept for the answer's dynamic metadata.
    #[serde(default)]
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnvoyRate {
    #[serde(default)]
    pub(crate) unit: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) requests_per_unit: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) unlimited: Option<bool>,
    #[serde(default)]
    pub(crate) name: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) replaces: Option<Vec<Spanned<RawReplace>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplace {
    #[serde(default)]
    pub(crate) name: Option<Spanned<String>>,
}

/// `forward_auth:`: the endpoint gateways ask before passing a request on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawForwardAuth {
    #[serde(default)]
    pub(crate) path: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) trusted_proxies: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(crate) user: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) deny_status: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProxy {
    #[serde(default)]
    pub(crate) upstream: Option<Spanned<RawUpstream>>,
    #[serde(default)]
    pub(crate) user: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) trusted_proxies: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(crate) timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) admin_listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) upgrades: Option<Spanned<Vec<String>>>,
    /// In-flight requests to the upstream.
    #[serde(default)]
    pub(crate) concurrency: Option<Spanned<RawConcurrency>>,
    /// Request bodies up to this size are read whole before the upstream.
    #[serde(default)]
    pub(crate) buffer_body: Option<Spanned<RawSize>>,
}

/// A size in bytes: a number, or text with a unit (`64KiB`, `1MiB`).
#[derive(Debug)]
pub(crate) enum RawSize {
    Bytes(i64),
    Text(String),
}

// By hand rather than `#[serde(untagged)]`, as `RawStore`.
impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RawSize, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = RawSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size: bytes, or a number with B, KiB or MiB")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `proxy.upstream:`: a URL, or `{ url: URL, max_connections: N }`.
#[derive(Debug)]
pub(crate) enum RawUpstream {
    Url(String),
    Map(RawUpstreamMap),
}

// By hand rather than `#[serde(untagged)]`, as `RawStore`: untagged enums
// lose the line and column of every value inside.
impl<'de> Deserialize<'de> for RawUpstream {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RawUpstream, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawUpstream;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL, or a map with `url:` and `max_connections:`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawUpstream, E> {
                Ok(RawUpstream::Url(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                m: A,
            ) -> Result<RawUpstream, A::Error> {
                RawUpstreamMap::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(RawUpstream::Map)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstreamMap {
    #[serde(default)]
    pub(crate) url: Option<Spanned<String>>,
    /// Connections open to the upstream at most.
    #[serde(default)]
    pub(crate) max_connections: Option<Spanned<i64>>,
}

/// `proxy.concurrency:`: `adaptive: { min, max }` or `limit: N`, and a
/// queue.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConcurrency {
    #[serde(default)]
    pub(crate) adaptive: Option<Spanned<RawAdaptive>>,
    #[serde(default)]
    pub(crate) limit: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) queue: Option<Spanned<RawConcurrencyQueue>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdaptive {
    pub(crate) min: Spanned<i64>,
    pub(crate) max: Spanned<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConcurrencyQueue {
    #[serde(default)]
    pub(crate) max_wait: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) max_queued: Option<Spanned<i64>>,
}

/// `admin:`: the operator's plane.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    #[serde(default)]
    pub(crate) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) tokens: Option<Spanned<Vec<Spanned<RawToken>>>>,
    /// Count top keys at all.
    #[serde(default)]
    pub(crate) top_keys: Option<bool>,
    /// Show top keys as the client sent them (else as their hash).
    #[serde(default)]
    pub(crate) show_keys: Option<bool>,
    /// Admitted with less than this share of the limit left: near the limit.
    #[serde(default)]
    pub(crate) near_limit: Option<Spanned<RawRatio>>,
    /// Slots of each rule's top-keys sketch.
    #[serde(default)]
    pub(crate) top_slots: Option<Spanned<i64>>,
    /// Where the memory store keeps overrides and plan assignments.
    #[serde(default)]
    pub(crate) state_file: Option<Spanned<String>>,
    /// Audit entries kept in memory.
    #[serde(default)]
    pub(crate) audit_entries: Option<Spanned<i64>>,
    /// The admin listener's own certificate, if not the top-level `tls:`.
    #[serde(default)]
    pub(crate) tls: Option<Spanned<RawTls>>,
}

/// `tls:` (and `admin.tls:`): a PEM certificate chain and its key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    #[serde(default)]
    pub(crate) cert: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) key: Option<Spanned<String>>,
    /// Client certificates required, issued by this CA (mutual TLS).
    #[serde(default)]
    pub(crate) client_ca: Option<Spanned<String>>,
    /// Names one of which a client certificate's DNS or URI SAN must be.
    #[serde(default)]
    pub(crate) client_san: Option<Spanned<Vec<String>>>,
}

/// `health:`: the service's targets.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealth {
    #[serde(default)]
    pub(crate) latency: Option<Spanned<RawLatency>>,
    #[serde(default)]
    pub(crate) errors: Option<Spanned<RawErrors>>,
    /// After how long without a report health is unknown.
    #[serde(default)]
    pub(crate) stale_after: Option<Spanned<String>>,
    /// The proxy's measurement window over its upstream.
    #[serde(default)]
    pub(crate) window: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLatency {
    pub(crate) target: Spanned<String>,
    #[serde(default)]
    pub(crate) percentile: Option<Spanned<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawErrors {
    pub(crate) max: Spanned<RawRatio>,
}

/// A share: `0.2` or `"20%"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawRatio {
    Number(f64),
    Text(String),
}

/// `api:`: the decision API's settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApi {
    /// Bearer tokens, in the form of `admin.tokens`.
    #[serde(default)]
    pub(crate) tokens: Option<Spanned<Vec<Spanned<RawToken>>>>,
}

/// One bearer token of `admin.tokens` (or `api.tokens`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawToken {
    pub(crate) name: Spanned<String>,
    pub(crate) scope: Spanned<String>,
    #[serde(default)]
    pub(crate) file: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) env: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    #[serde(default)]
    pub(crate) head_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) idle_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) body_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) write_timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) max_connections: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) max_streams: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) max_streams_total: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) direct_path: Option<bool>,
    #[serde(default)]
    pub(crate) listen_backlog: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) ipv4_prefix: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) ipv6_prefix: Option<Spanned<i64>>,
}

#[derive(Debug)]
pub(crate) enum RawStore {
    Name(String),
    Map(Box<RawStoreMap>),
}

// By hand rather than `#[serde(untagged)]`: untagged enums buffer their
// input, which loses the line and column of every value inside.
impl<'de> Deserialize<'de> for RawStore {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RawStore, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawStore;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`memory`, or a map with `memory:` or `redis:`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawStore, E> {
                Ok(RawStore::Name(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, m: A) -> Result<RawStore, A::Error> {
                RawStoreMap::deserialize(serde::de::value::MapAccessDeserializer::new(m))
                    .map(|m| RawStore::Map(Box::new(m)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStoreMap {
    #[serde(default)]
    pub(crate) memory: Option<RawMemory>,
    #[serde(default)]
    pub(crate) redis: Option<Spanned<RawRedis>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedis {
    #[serde(default)]
    pub(crate) url: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) cluster: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(crate) sentinel: Option<Spanned<RawSentinel>>,
    #[serde(default)]
    pub(crate) timeout: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) prefix: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) breaker_failures: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) probe_interval: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) buckets: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) over_limit_cache: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) sync: Option<Spanned<RawSync>>,
    #[serde(default)]
    pub(crate) tls: Option<Spanned<RawRedisTls>>,
}

/// `store.redis.tls`: a CA and a client certificate for `rediss://` (and
/// sentinels with `tls: true`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRedisTls {
    #[serde(default)]
    pub(crate) ca: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) cert: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) key: Option<Spanned<String>>,
}

/// `store.redis.sentinel`: the master found by asking Redis Sentinel.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSentinel {
    #[serde(default)]
    pub(crate) master: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) nodes: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub(crate) username: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) password: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) sentinel_username: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) sentinel_password: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) tls: Option<bool>,
    #[serde(default)]
    pub(crate) db: Option<Spanned<i64>>,
}

/// `store.redis.sync`: local-first decisions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSync {
    #[serde(default)]
    pub(crate) mode: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) interval: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) region: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) regions: Option<Spanned<std::collections::BTreeMap<String, String>>>,
    #[serde(default)]
    pub(crate) max_keys: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) failures: Option<Spanned<i64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMemory {
    #[serde(default)]
    pub(crate) max_keys: Option<u64>,
}
