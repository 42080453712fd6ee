//! A rule given as JSON, read as the rules file reads its rules.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use spillway_core::Rule;

use super::Context;

/// A rule given as JSON read as the rules file's rule is, by the same
/// reader (JSON is YAML), against `ctx`. A rule of the API takes its
/// limits from `limits:` (plans are the rules file's).
///
/// # Errors
/// Every problem, in words, `; `-separated.
pub fn build(ctx: &Context, json: &Value) -> Result<Rule, String> {
    use serde_saphyr::Spanned;
    use spillway_rules::build::{Collector, RuleContext};
    if !json.is_object() {
        return Err("a rule is a JSON object, like {\"api\": \"POST /v1/login\", \"by\": \"ip\", \"limits\": [{\"gcra\": {\"rate\": \"10/1m\"}}]}".into());
    }
    if json.get("plan").is_some() {
        return Err("plan: not offered to rules made over the API: give limits".into());
    }
    // JSON's types first, as docs/openapi.yaml gives them: YAML would
    // read `"api": 5` as the text "5", and `null` as absent.
    if let Err(e) = serde_json::from_value::<Shape>(json.clone()) {
        let e = e.to_string();
        return Err(e.split(" at line ").next().unwrap_or(&e).to_string());
    }
    let text = whole_numbers(json.clone()).to_string();
    let raw: Spanned<spillway_rules::raw::RawRule> = serde_saphyr::from_str(&text)
        .map_err(|e| spillway_rules::build::first_line(&e.to_string()))?;
    let plans = BTreeMap::new();
    let rctx = RuleContext {
        descriptors: &ctx.descriptors,
        any_descriptor: false,
        path_matching: ctx.path_matching,
        plans: &plans,
    };
    let mut errs = Collector::new("rule");
    let rule = spillway_rules::build::rule(&mut errs, &raw, &rctx);
    match (rule, errs.list.is_empty()) {
        (Some(r), true) => Ok(r),
        _ => Err(errs
            .list
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// A rule's fields and their JSON types (the reader of the rules file
/// checks the rest).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Shape {
    name: String,
    #[serde(default, deserialize_with = "crate::json::present")]
    api: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    by: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    limits: Option<Vec<serde_json::Map<String, Value>>>,
    #[serde(default, deserialize_with = "crate::json::present")]
    mode: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    priority: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    on_store_error: Option<String>,
    #[serde(default, deserialize_with = "crate::json::present")]
    queue: Option<serde_json::Map<String, Value>>,
    #[serde(default, deserialize_with = "crate::json::present")]
    path_matching: Option<serde_json::Map<String, Value>>,
    #[serde(default, deserialize_with = "crate::json::present")]
    cost: Option<serde_json::Map<String, Value>>,
    #[serde(default, deserialize_with = "crate::json::present")]
    description: Option<String>,
}

/// JSON Schema's integers are numbers without a fraction however written
/// (`10.0` is 10); YAML's reader wants them written whole.
fn whole_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                Value::from(f as i64)
            }
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(whole_numbers).collect()),
        Value::Object(o) => {
            Value::Object(o.into_iter().map(|(k, v)| (k, whole_numbers(v))).collect())
        }
        other => other,
    }
}
