//! The Envoy rate limit service's settings that envoyproxy/ratelimit takes
//! from its environment: the same variables, and the rules file's `envoy:`
//! section says the same in YAML (each key is the variable's name in lower
//! case). `config/` reads both and builds them; a variable that is set wins
//! over the file, as a flag does.

/// ratelimit's `NEAR_LIMIT_RATIO` default.
pub const DEFAULT_NEAR_LIMIT_RATIO: f32 = 0.8;
/// Distinct descriptors a `detailed_metric` limit reports as series of
/// their own, per domain and limit; the rest are summed in one series
/// (`descriptor="_other"`).
pub const DEFAULT_DETAILED_METRIC_MAX_VALUES: usize = 1000;

/// The settings, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoySettings {
    /// ratelimit's own response headers and their names
    /// (`LIMIT_RESPONSE_HEADERS_ENABLED`), if on.
    pub limit_headers: Option<LimitHeaders>,
    /// The share of a limit past which hits count as near the limit
    /// (`NEAR_LIMIT_RATIO`).
    pub near_limit_ratio: f32,
    /// Answers carry dynamic metadata describing the request and the
    /// `metadata` of the limits it passed (`RESPONSE_DYNAMIC_METADATA`).
    pub response_dynamic_metadata: bool,
    /// Every answer is OK, whatever the limits say (`SHADOW_MODE`).
    pub shadow_mode: bool,
    /// Every limit is in quota mode (`QUOTA_MODE`).
    pub quota_mode: bool,
    /// See [`DEFAULT_DETAILED_METRIC_MAX_VALUES`].
    pub detailed_metric_max_values: usize,
    /// How long a gRPC connection may live before it is told to go (plus
    /// up to a tenth more at random) (`GRPC_MAX_CONNECTION_AGE`,
    /// `envoy.max_connection_age`); zero is no bound; `None` when neither
    /// says (no bound; the `ratelimit` entry then takes ratelimit's 24h).
    pub max_connection_age: Option<std::time::Duration>,
    /// How long calls in flight may take after that
    /// (`GRPC_MAX_CONNECTION_AGE_GRACE`, default ratelimit's 1h; zero, as
    /// for grpc-go, is no bound: `Duration::MAX`).
    pub max_connection_age_grace: std::time::Duration,
    /// `GRPC_UDS`: the gRPC listener's Unix socket, instead of its address.
    pub grpc_uds: Option<std::path::PathBuf>,
}

impl Default for EnvoySettings {
    fn default() -> EnvoySettings {
        EnvoySettings {
            limit_headers: None,
            near_limit_ratio: DEFAULT_NEAR_LIMIT_RATIO,
            response_dynamic_metadata: false,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric_max_values: DEFAULT_DETAILED_METRIC_MAX_VALUES,
            max_connection_age: None,
            max_connection_age_grace: std::time::Duration::from_secs(3_600),
            grpc_uds: None,
        }
    }
}

/// The names of ratelimit's three response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitHeaders {
    /// `LIMIT_LIMIT_HEADER`, default `RateLimit-Limit`.
    pub limit: String,
    /// `LIMIT_REMAINING_HEADER`, default `RateLimit-Remaining`.
    pub remaining: String,
    /// `LIMIT_RESET_HEADER`, default `RateLimit-Reset`.
    pub reset: String,
}
