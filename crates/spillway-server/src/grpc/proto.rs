//! The Envoy rate limit service v3 messages, written from the published
//! field numbers (envoy.service.ratelimit.v3, envoy.extensions.common.ratelimit.v3,
//! envoy.config.core.v3), with prost's derive: no protoc at build time.
//! Only the fields spillway reads or fills are declared; protobuf skips the rest.

#![allow(missing_docs)]

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `google.protobuf.UInt64Value`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// `envoy.type.v3.RateLimitUnit`, same numbering as [`Unit`].
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    #[prost(enumeration = "Code", tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// Dynamic metadata Envoy emits under `envoy.filters.http.ratelimit`
    /// for the next filters (field 6; 5 is `raw_body`, 7 `quota`, neither
    /// filled, as envoyproxy/ratelimit fills neither).
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<Struct>,
}

/// `RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Code {
    Unknown = 0,
    Ok = 1,
    OverLimit = 2,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(enumeration = "Unit", tag = "2")]
    pub unit: i32,
}

/// `RateLimitResponse.RateLimit.Unit` (and `envoy.type.v3.RateLimitUnit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Unit {
    Unknown = 0,
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

impl Unit {
    /// The unit's length in seconds (a month is 30 days and a year 365, as
    /// envoyproxy/ratelimit counts them).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Unknown => 0,
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// The unit written in an envoyproxy/ratelimit config (`second`, `MINUTE`, ...).
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    #[prost(enumeration = "Code", tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `google.protobuf.Struct`: a JSON object.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: std::collections::BTreeMap<String, Value>,
}

/// `google.protobuf.Value`: a JSON value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "value::Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<value::Kind>,
}

/// `google.protobuf.Value`'s `kind`.
pub mod value {
    /// One JSON value.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        /// `null` (`google.protobuf.NullValue`, whose only value is 0).
        #[prost(int32, tag = "1")]
        NullValue(i32),
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
        #[prost(message, tag = "5")]
        StructValue(super::Struct),
        #[prost(message, tag = "6")]
        ListValue(super::ListValue),
    }
}

/// `google.protobuf.ListValue`: a JSON array.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    /// A string value.
    pub fn string(s: impl Into<String>) -> Value {
        Value {
            kind: Some(value::Kind::StringValue(s.into())),
        }
    }

    /// A number value.
    pub fn number(n: f64) -> Value {
        Value {
            kind: Some(value::Kind::NumberValue(n)),
        }
    }

    /// A list value.
    pub fn list(values: Vec<Value>) -> Value {
        Value {
            kind: Some(value::Kind::ListValue(ListValue { values })),
        }
    }

    /// A struct value.
    pub fn object(s: Struct) -> Value {
        Value {
            kind: Some(value::Kind::StructValue(s)),
        }
    }
}

/// The fully qualified service name.
pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The one method's path.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
