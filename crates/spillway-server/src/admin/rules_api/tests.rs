use super::*;

fn ctx() -> Context {
    Context::default()
}

#[test]
fn a_rule_as_json_reads_as_the_same_rule_in_yaml() {
    let json = serde_json::json!({
        "name": "login",
        "api": "POST /v1/login",
        "by": "ip",
        "limits": [{"sliding_window_log": {"limit": 5, "window": "1m"}}],
    });
    let from_json = build(&ctx(), &json).unwrap();
    let yaml = "rules:\n  - name: login\n    api: POST /v1/login\n    by: ip\n    limits:\n      - sliding_window_log: { limit: 5, window: 1m }\n";
    let from_yaml = spillway_rules::parse("r.yaml", yaml).unwrap();
    assert_eq!(from_json.fingerprint(), from_yaml.rules[0].fingerprint());
    assert_eq!(from_json.name(), "login");
}

#[test]
fn bad_rules_say_what_is_wrong() {
    for (json, want) in [
        (
            serde_json::json!({"name": "a", "limits": [{"gcra": {"rate": "0/s"}}]}),
            "rate",
        ),
        (serde_json::json!({"name": "a", "limitz": []}), "limitz"),
        (
            serde_json::json!({"name": "a", "by": "usr", "limits": [{"gcra": {"rate": "1/s"}}]}),
            "by",
        ),
        (
            serde_json::json!({"name": "a", "plan": {"default": "x"}}),
            "plan",
        ),
        (serde_json::json!([1, 2]), "object"),
        (
            serde_json::json!({"name": "a", "limits": [{"gcra": {"rate": 5}}]}),
            "rate",
        ),
    ] {
        let e = build(&ctx(), &json).unwrap_err();
        assert!(e.contains(want), "{json}: {e}");
    }
}

#[test]
fn preconditions() {
    assert!(check(Precondition::None, false, 0).is_ok());
    assert!(check(Precondition::Exists, true, 3).is_ok());
    assert_eq!(
        check(Precondition::Exists, false, 0),
        Err(Refused::Mismatch(0))
    );
    assert_eq!(
        check(Precondition::Absent, true, 3),
        Err(Refused::Exists(3))
    );
    assert!(check(Precondition::Absent, false, 0).is_ok());
    assert!(check(Precondition::Version(3), true, 3).is_ok());
    assert_eq!(
        check(Precondition::Version(2), true, 3),
        Err(Refused::Mismatch(3))
    );
}

#[tokio::test]
async fn pages_by_prefix_and_after() {
    let assign = Assignments::open(None).unwrap();
    let api = ApiRules::open(&assign, ctx(), Arc::new(spillway_core::HealthGauge::new())).unwrap();
    for n in ["a1", "a2", "a3", "b1"] {
        let json = serde_json::json!({"name": n, "limits": [{"gcra": {"rate": "1/s"}}]});
        api.put(
            None,
            &assign,
            &RuleSet::default(),
            n,
            json,
            Precondition::None,
        )
        .await
        .unwrap();
    }
    let names = |v: Vec<(String, Arc<Entry>)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(api.page("a", "", 2)), ["a1", "a2"]);
    assert_eq!(names(api.page("a", "a2", 2)), ["a3"]);
    assert_eq!(names(api.page("", "a3", 10)), ["b1"]);
    assert_eq!(names(api.page("b", "", 10)), ["b1"]);
    assert_eq!(api.version(), 4);
}

/// Hostile bodies are refused with a message, never a panic.
#[test]
fn hostile_rules_are_refused() {
    let deep = format!("{}1{}", "[".repeat(120), "]".repeat(120));
    let deep: Value = serde_json::from_str(&deep).unwrap();
    let long = "x".repeat(60_000);
    for json in [
        serde_json::json!({"name": "a", "limits": [{"gcra": deep.clone()}]}),
        serde_json::json!({"name": "a", "limits": [{"gcra": {"rate": deep}}]}),
        serde_json::json!({"name": long.clone(), "limits": [{"gcra": {"rate": "1/s"}}]}),
        serde_json::json!({"name": "a\u{0}b", "limits": [{"gcra": {"rate": "1/s"}}]}),
        serde_json::json!({"name": "a", "api": long, "limits": [{"gcra": {"rate": "1/s"}}]}),
        serde_json::json!({"name": "a", "limits": [{"gcra": {"rate": "1/s", "burst": -1}}]}),
        serde_json::json!({"name": "a", "limits": [{"gcra": {"rate": "1/s", "burst": u64::MAX}}]}),
        serde_json::json!({"name": "a", "limits": []}),
        serde_json::json!({"name": "a", "limits": [{}]}),
        serde_json::json!({"name": "a", "api": null, "limits": [{"gcra": {"rate": "1/s"}}]}),
        serde_json::json!({"name": "a", "limits": [{"gcra": {"rate": "1/s"}}], "by": "*&anchor"}),
    ] {
        let e = build(&ctx(), &json).unwrap_err();
        assert!(!e.is_empty(), "{json}");
    }
}
