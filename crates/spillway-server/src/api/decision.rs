//! The decision as JSON (`Decision` in docs/openapi.yaml), written by hand.

use http::StatusCode;
use spillway_core::{Limit, Outcome, Rule};
use spillway_store::Checked;

use super::Ask;

/// The decision's status (200, or 429 when denied) and JSON body
/// (`Decision` in docs/openapi.yaml), written out by hand: through serde
/// it was 7 % of the server's time per request. The answer to a charge
/// ([`Ask::Charge`]) is always a 200 and adds `"over"`: whether the key is
/// now past its limit (its `allowed` is then false).
pub fn decision_json(checked: &Checked, ask: Ask) -> (StatusCode, Vec<u8>) {
    let d = &checked.decision;
    let name_of = |rd: &spillway_core::RuleDecision| checked.rule(rd).map_or("", Rule::name);
    let mut out = String::with_capacity(256 + 160 * d.rules.len());
    let mut num = itoa::Buffer::new();
    let field = |out: &mut String, key: &str| {
        out.push_str(if out.is_empty() { "{\"" } else { ",\"" });
        out.push_str(key);
        out.push_str("\":");
    };
    let string = |out: &mut String, s: &str| {
        out.push('"');
        spillway_tower::render::push_json_escaped(out, s);
        out.push('"');
    };
    let names = |out: &mut String, names: &mut dyn Iterator<Item = &str>| {
        out.push('[');
        for (i, n) in names.enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(out, n);
        }
        out.push(']');
    };
    let deciding = d.deciding.as_ref();
    field(&mut out, "allowed");
    out.push_str(if d.allowed { "true" } else { "false" });
    if ask == Ask::Charge {
        field(&mut out, "over");
        out.push_str(if d.allowed { "false" } else { "true" });
    }
    field(&mut out, "outcome");
    string(&mut out, d.outcome().as_str());
    field(&mut out, "rule");
    match deciding {
        Some(rd) => string(&mut out, name_of(rd)),
        None => out.push_str("null"),
    }
    for (key, value) in [
        ("limit", deciding.map(|r| r.verdict.limit)),
        ("remaining", deciding.map(|r| r.verdict.remaining)),
        (
            "reset_ms",
            Some(deciding.map_or(0, |r| r.verdict.reset.as_millis_ceil())),
        ),
        (
            "retry_after_ms",
            Some(
                deciding
                    .filter(|_| !d.allowed)
                    .map_or(0, spillway_core::RuleDecision::retry_ms),
            ),
        ),
        ("wait_ms", Some(d.wait.as_millis_ceil())),
    ] {
        field(&mut out, key);
        match value {
            Some(v) => out.push_str(num.format(v)),
            None => out.push_str("null"),
        }
    }
    for (key, o) in [
        ("shadow_denied", Outcome::ShadowDenied),
        ("soft_exceeded", Outcome::SoftExceeded),
        ("elastic_admitted", Outcome::ElasticAdmitted),
    ] {
        field(&mut out, key);
        names(
            &mut out,
            &mut d.rules.iter().filter(|r| r.outcome == o).map(name_of),
        );
    }
    field(&mut out, "skipped");
    names(
        &mut out,
        &mut checked
            .skipped
            .iter()
            .filter_map(|&i| checked.rules.get(i).map(Rule::name)),
    );
    field(&mut out, "store_error");
    out.push_str(if checked.store_error.is_some() {
        "true"
    } else {
        "false"
    });
    field(&mut out, "rules");
    out.push('[');
    for (i, rd) in d.rules.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"rule\":");
        string(&mut out, name_of(rd));
        out.push_str(",\"outcome\":\"");
        out.push_str(rd.outcome.as_str());
        out.push_str("\",\"algorithm\":\"");
        let algorithm = checked
            .rule(rd)
            .and_then(|r| r.limits().get(rd.limit))
            .map_or("", Limit::algorithm_name);
        out.push_str(algorithm);
        out.push('"');
        for (key, v) in [
            ("limit", rd.verdict.limit),
            ("remaining", rd.verdict.remaining),
            ("reset_ms", rd.verdict.reset.as_millis_ceil()),
            ("retry_after_ms", rd.retry_ms()),
        ] {
            out.push_str(",\"");
            out.push_str(key);
            out.push_str("\":");
            out.push_str(num.format(v));
        }
        out.push('}');
    }
    out.push_str("]}");
    let status = if d.allowed || ask == Ask::Charge {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    (status, out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::{FixedWindow, KeySpec, ManualClock, Mode, Nanos};
    use spillway_store::{Limiter, MemoryStore, RuleSet};
    use spillway_store::{Request, SimpleAttributes};

    #[tokio::test]
    async fn hand_written_decisions_match_the_documented_shape() {
        let fw = |n| {
            vec![Limit::FixedWindow(
                FixedWindow::new(n, Nanos::from_secs(60)).unwrap(),
            )]
        };
        let rule = |name: &str, by: &str, n, mode| {
            Rule::new(name, None, KeySpec::parse(by).unwrap(), fw(n), mode).unwrap()
        };
        let rules = vec![
            rule("plain", "user", 5, Mode::Hard),
            rule("q\"uote\\back\nline\u{1}é", "user", 4, Mode::Hard),
            rule("shadow", "user", 1, Mode::Shadow),
            rule("soft", "user", 2, Mode::Soft { percent: 50 }),
            rule("by-header", "header:x-missing", 5, Mode::Hard),
        ];
        let store = MemoryStore::new(
            ManualClock::new(Nanos::from_secs(1_000)),
            Default::default(),
        );
        let limiter = Limiter::new(store, RuleSet::new(rules.clone()));
        let attrs = SimpleAttributes {
            user: Some("alice"),
            ..Default::default()
        };
        let request = Request {
            method: None,
            path: None,
            attrs: &attrs,
            cost: 1,
        };
        // Allowed, shadow-denied, soft-exceeded, then denied; a skipped
        // rule throughout; then no rule at all.
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(limiter.check(&request).await);
        }
        let none = Limiter::new(
            MemoryStore::new(ManualClock::new(Nanos::from_secs(1)), Default::default()),
            RuleSet::new(Vec::new()),
        );
        seen.push(none.check(&request).await);
        for checked in &seen {
            let (status, hand) = decision_json(checked, Ask::Check);
            let (oracle_status, oracle) = serde_decision_json(checked);
            assert_eq!(status, oracle_status);
            let hand: serde_json::Value = serde_json::from_slice(&hand).expect("valid JSON");
            let oracle: serde_json::Value = serde_json::from_slice(&oracle).unwrap();
            assert_eq!(hand, oracle);
        }
        let outcomes: Vec<&str> = seen.iter().map(|c| c.decision.outcome().as_str()).collect();
        assert!(outcomes.contains(&"denied"), "{outcomes:?}");
        assert!(outcomes.contains(&"shadow_denied"), "{outcomes:?}");
        assert!(
            seen.iter().any(|c| c
                .decision
                .rules
                .iter()
                .any(|r| r.outcome == Outcome::SoftExceeded)),
            "no soft excess in {outcomes:?}"
        );
        assert!(!seen[0].skipped.is_empty());
    }

    /// The JSON body of a decision (`Decision` in docs/openapi.yaml).
    #[derive(Debug, serde::Serialize)]
    struct DecisionJson<'a> {
        allowed: bool,
        outcome: &'static str,
        rule: Option<&'a str>,
        limit: Option<u64>,
        remaining: Option<u64>,
        reset_ms: u64,
        retry_after_ms: u64,
        wait_ms: u64,
        shadow_denied: Vec<&'a str>,
        soft_exceeded: Vec<&'a str>,
        elastic_admitted: Vec<&'a str>,
        skipped: Vec<&'a str>,
        store_error: bool,
        rules: Vec<RuleJson<'a>>,
    }

    /// One rule's part of the answer.
    #[derive(Debug, serde::Serialize)]
    struct RuleJson<'a> {
        rule: &'a str,
        outcome: &'static str,
        algorithm: &'static str,
        limit: u64,
        remaining: u64,
        reset_ms: u64,
        retry_after_ms: u64,
    }

    /// The answer as serde writes it from the documented shape: the oracle.
    fn serde_decision_json(checked: &Checked) -> (StatusCode, Vec<u8>) {
        let d = &checked.decision;
        let name_of = |rd: &spillway_core::RuleDecision| checked.rule(rd).map_or("", Rule::name);
        let algorithm = |rd: &spillway_core::RuleDecision| {
            checked
                .rule(rd)
                .and_then(|r| r.limits().get(rd.limit))
                .map_or("", Limit::algorithm_name)
        };
        let with_outcome = |o: Outcome| -> Vec<&str> {
            d.rules
                .iter()
                .filter(|r| r.outcome == o)
                .map(name_of)
                .collect()
        };
        let deciding = d.deciding.as_ref();
        let body = DecisionJson {
            allowed: d.allowed,
            outcome: d.outcome().as_str(),
            rule: deciding.map(name_of),
            limit: deciding.map(|r| r.verdict.limit),
            remaining: deciding.map(|r| r.verdict.remaining),
            reset_ms: deciding.map_or(0, |r| r.verdict.reset.as_millis_ceil()),
            retry_after_ms: deciding
                .filter(|_| !d.allowed)
                .map_or(0, spillway_core::RuleDecision::retry_ms),
            wait_ms: d.wait.as_millis_ceil(),
            shadow_denied: with_outcome(Outcome::ShadowDenied),
            soft_exceeded: with_outcome(Outcome::SoftExceeded),
            elastic_admitted: with_outcome(Outcome::ElasticAdmitted),
            skipped: checked
                .skipped
                .iter()
                .filter_map(|&i| checked.rules.get(i).map(Rule::name))
                .collect(),
            store_error: checked.store_error.is_some(),
            rules: d
                .rules
                .iter()
                .map(|rd| RuleJson {
                    rule: name_of(rd),
                    outcome: rd.outcome.as_str(),
                    algorithm: algorithm(rd),
                    limit: rd.verdict.limit,
                    remaining: rd.verdict.remaining,
                    reset_ms: rd.verdict.reset.as_millis_ceil(),
                    retry_after_ms: rd.retry_ms(),
                })
                .collect(),
        };
        let status = if d.allowed {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        // Sized for a typical answer: growing the buffer showed in profiles.
        let mut bytes = Vec::with_capacity(256 + 160 * body.rules.len());
        if serde_json::to_writer(&mut bytes, &body).is_err() {
            bytes.clear();
        }
        (status, bytes)
    }

    proptest::proptest! {
        /// Any rule name (quotes, backslashes, control characters, any
        /// script): the hand-written answer is valid JSON equal to serde's.
        #[test]
        fn any_rule_name_gives_the_documented_json(
            name in "\\PC{1,20}|[\"\\\\\u{0}-\u{1f}a]{1,8}",
            limit in 1u64..5,
            hits in 1usize..7,
        ) {
            let rule = Rule::new(
                &name,
                None,
                KeySpec::parse("user").unwrap(),
                vec![Limit::FixedWindow(FixedWindow::new(limit, Nanos::from_secs(60)).unwrap())],
                Mode::Hard,
            );
            let Ok(rule) = rule else { return Ok(()) };
            let limiter = Limiter::new(
                MemoryStore::new(ManualClock::new(Nanos::from_secs(1_000)), Default::default()),
                RuleSet::new(vec![rule]),
            );
            let attrs = SimpleAttributes { user: Some("u"), ..Default::default() };
            let request = Request { method: None, path: None, attrs: &attrs, cost: 1 };
            for _ in 0..hits {
                let checked = spillway_store::block_on(limiter.check(&request));
                let (status, hand) = decision_json(&checked, Ask::Check);
                let (oracle_status, oracle) = serde_decision_json(&checked);
                proptest::prop_assert_eq!(status, oracle_status);
                let hand: serde_json::Value = serde_json::from_slice(&hand).expect("valid JSON");
                let oracle: serde_json::Value = serde_json::from_slice(&oracle).unwrap();
                proptest::prop_assert_eq!(hand, oracle);
            }
        }
    }
}
