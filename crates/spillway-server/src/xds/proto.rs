//! The xDS state-of-the-world messages spillway's client speaks
//! (envoy.service.discovery.v3, envoy.config.core.v3, google.rpc.Status,
//! google.protobuf.Any) and envoyproxy/ratelimit's `RateLimitConfig`
//! resource (ratelimit.config.ratelimit.v3, `rls_conf.proto`), written
//! from the published field numbers with prost's derive: no protoc at
//! build time. Only the fields spillway reads or fills are declared;
//! protobuf skips the rest.

#![allow(missing_docs)]

pub use crate::grpc::proto::{ListValue, Struct, Value};

/// The one method of the aggregated discovery service spillway calls.
pub const STREAM_AGGREGATED_RESOURCES: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// The resource type asked for, as ratelimit and Envoy Gateway name it.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// `envoy.config.core.v3.Node`: who asks.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(string, tag = "2")]
    pub cluster: String,
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<Struct>,
    #[prost(string, tag = "6")]
    pub user_agent_name: String,
}

/// `google.rpc.Status`: why a response was refused (a NACK's `error_detail`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `envoy.service.discovery.v3.DiscoveryRequest`: the subscription, then
/// an ACK (the response's version and nonce) or a NACK (the last good
/// version, the response's nonce, and `error_detail`) per response.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryRequest {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    #[prost(string, repeated, tag = "3")]
    pub resource_names: Vec<String>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<Status>,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`: every resource of the
/// type, in one version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DiscoveryResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<Any>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `ratelimit.config.ratelimit.v3.RateLimitConfig`: one domain.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub domain: String,
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
    #[prost(message, optional, tag = "8")]
    pub metadata: Option<Struct>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitPolicy`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// `RateLimitUnit`: 0 UNKNOWN, 1 SECOND, 2 MINUTE, 3 HOUR, 4 DAY,
    /// 5 MONTH, 6 YEAR, 7 WEEK.
    #[prost(int32, tag = "1")]
    pub unit: i32,
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// `ratelimit.config.ratelimit.v3.RateLimitReplace`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `RateLimitUnit`'s name for its number, as ratelimit's conversion to
/// its YAML form writes it (`UNKNOWN` for 0 and any number it does not
/// know, which its loader refuses as it refuses a file's bad unit).
pub fn unit_name(n: i32) -> &'static str {
    match n {
        1 => "SECOND",
        2 => "MINUTE",
        3 => "HOUR",
        4 => "DAY",
        5 => "MONTH",
        6 => "YEAR",
        7 => "WEEK",
        _ => "UNKNOWN",
    }
}
