//! A `RateLimitConfig` resource in envoyproxy/ratelimit's file form: the
//! same conversion ratelimit makes (`ConfigXdsProtoToYaml`) before it
//! loads a resource as it loads a file, written as JSON (which YAML
//! reads), so a resource is checked by the very reader of the files.

use serde_json::{Map, Value as Json, json};

use super::proto::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, Struct, Value, unit_name,
};
use crate::grpc::proto::value::Kind;

/// The resource as the text of an envoyproxy/ratelimit file.
pub(crate) fn to_file(config: &RateLimitConfig) -> String {
    let root = json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    });
    root.to_string()
}

fn descriptor(d: &RateLimitDescriptor) -> Json {
    let mut m = Map::new();
    m.insert("key".into(), json!(d.key));
    m.insert("value".into(), json!(d.value));
    if let Some(p) = &d.rate_limit {
        m.insert("rate_limit".into(), policy(p));
    }
    if !d.descriptors.is_empty() {
        m.insert(
            "descriptors".into(),
            Json::Array(d.descriptors.iter().map(descriptor).collect()),
        );
    }
    // ratelimit's YAML form carries the flags as they are; false is what
    // an absent key means to the reader.
    for (k, v) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if v {
            m.insert(k.into(), json!(true));
        }
    }
    if let Some(s) = d.metadata.as_ref().filter(|s| !s.fields.is_empty()) {
        m.insert("metadata".into(), struct_json(s));
    }
    Json::Object(m)
}

fn policy(p: &RateLimitPolicy) -> Json {
    let mut m = Map::new();
    m.insert("unit".into(), json!(unit_name(p.unit)));
    m.insert("requests_per_unit".into(), json!(p.requests_per_unit));
    if p.unlimited {
        m.insert("unlimited".into(), json!(true));
    }
    if !p.name.is_empty() {
        m.insert("name".into(), json!(p.name));
    }
    if !p.replaces.is_empty() {
        m.insert(
            "replaces".into(),
            Json::Array(
                p.replaces
                    .iter()
                    .map(|r| json!({ "name": r.name }))
                    .collect(),
            ),
        );
    }
    Json::Object(m)
}

fn struct_json(s: &Struct) -> Json {
    Json::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &Value) -> Json {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        // A number protobuf's JSON cannot write (NaN, infinity) is null.
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number)
        }
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_json).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::RateLimitReplace;
    use super::*;

    fn leaf(key: &str, value: &str, unit: i32, n: u32) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: n,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_resource_reads_as_the_file_that_says_the_same() {
        let mut user = leaf("user", "", 2, 3);
        user.rate_limit.as_mut().unwrap().name = "per-user".into();
        let mut vip = leaf("user", "vip", 1, 100);
        vip.rate_limit.as_mut().unwrap().replaces = vec![RateLimitReplace {
            name: "per-user".into(),
        }];
        vip.shadow_mode = true;
        let cfg = RateLimitConfig {
            name: "edge-config".into(),
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "route".into(),
                    value: "api".into(),
                    descriptors: vec![user, vip],
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "free".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
        };
        let from_xds = crate::config::parse_envoy("xds:edge-config", &to_file(&cfg)).unwrap();
        let from_file = crate::config::parse_envoy(
            "f.yaml",
            "domain: edge\ndescriptors:\n  - key: route\n    value: api\n    descriptors:\n      \
             - key: user\n        rate_limit: { unit: minute, requests_per_unit: 3, name: per-user }\n      \
             - key: user\n        value: vip\n        shadow_mode: true\n        rate_limit: { unit: second, requests_per_unit: 100, replaces: [ { name: per-user } ] }\n  \
             - key: free\n    rate_limit: { unlimited: true }\n",
        )
        .unwrap();
        assert_eq!(format!("{from_xds:?}"), format!("{from_file:?}"));
    }

    #[test]
    fn what_ratelimit_refuses_is_refused_with_the_resource_named() {
        // UNKNOWN (0) is no unit; an empty key; a limit replacing itself.
        let mut selfish = leaf("b", "", 1, 1);
        selfish.rate_limit.as_mut().unwrap().name = "me".into();
        selfish.rate_limit.as_mut().unwrap().replaces =
            vec![RateLimitReplace { name: "me".into() }];
        let cfg = RateLimitConfig {
            name: "bad".into(),
            domain: "d".into(),
            descriptors: vec![leaf("a", "", 0, 5), leaf("", "", 1, 1), selfish],
        };
        let e = crate::config::parse_envoy("xds:bad", &to_file(&cfg))
            .unwrap_err()
            .to_string();
        assert!(e.contains("xds:bad"), "{e}");
        assert!(e.contains("UNKNOWN"), "{e}");
        assert!(e.contains("key must not be empty"), "{e}");
        assert!(e.contains("replace itself"), "{e}");
    }
}
