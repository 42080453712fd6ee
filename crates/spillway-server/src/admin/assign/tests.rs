use super::*;
use spillway_store::Key;

const TEXT: &str = "plans:
  free: { limits: [ { fixed_window: { limit: 2, window: 1h } } ] }
  pro:  { limits: [ { fixed_window: { limit: 5, window: 1h } } ] }
rules:
  - name: api
    by: header:X-Api-Key
    plan: { default: free }
  - name: users
    by: user
    limits: [ { fixed_window: { limit: 3, window: 1h } } ]
";

fn setup() -> (RuleSet, PlanBook) {
    let cfg = crate::config::parse("r.yaml", TEXT).unwrap();
    let health = std::sync::Arc::new(spillway_core::HealthGauge::new());
    (crate::rule_set(&cfg, 1, &health), cfg.plans)
}

fn raise(rule: &str, key: &str, limit: u64, block: bool) -> Override {
    Override {
        rule: rule.into(),
        key: vec![key.into()],
        limits: (!block)
            .then(|| serde_json::json!([{ "fixed_window": { "limit": limit, "window": "1h" } }])),
        block,
        expires_unix_ms: u64::MAX,
        created_unix_ms: 0,
        reason: String::new(),
        by: "ops".into(),
    }
}

fn plan(key: &str, plan: &str) -> PlanAssignment {
    PlanAssignment {
        rule: "api".into(),
        key: vec![key.into()],
        plan: plan.into(),
        by: "ops".into(),
        since_unix_ms: 0,
    }
}

/// The fingerprint each key decides under, or none.
fn under(kr: &KeyRules, set: &RuleSet, rule: &str, key: &str) -> Option<u64> {
    let r = set.rules().iter().find(|r| r.name() == rule).unwrap();
    kr.find(r, &Key::from_parts([key])).map(Rule::fingerprint)
}

/// One key compiled into the last table gives what compiling
/// everything gives, through puts, replacements, deletes, and an
/// override over a plan taken away (the plan applies again).
#[tokio::test]
async fn one_key_compiled_alone_matches_a_full_compile() {
    let (set, book) = setup();
    let parse = crate::config::limits_from_json;
    let a = Assignments::open(None).unwrap();
    for i in 0..50 {
        a.put_override(None, raise("users", &format!("u{i}"), 10 + i, i % 7 == 0))
            .await
            .unwrap();
    }
    a.put_plan(None, plan("k1", "pro")).await.unwrap();
    let mut kr = a.compile(&set, &book, 1, parse);
    let keys = ["u1", "u7", "u99", "k1", "k2"];
    let check = |kr: &KeyRules, what: &str| {
        let full = a.compile(&set, &book, 1, parse);
        assert_eq!(kr.len(), full.len(), "{what}");
        for (rule, key) in [("users", keys[..3].to_vec()), ("api", keys[3..].to_vec())] {
            for k in key {
                assert_eq!(
                    under(kr, &set, rule, k),
                    under(&full, &set, rule, k),
                    "{what}: {k}"
                );
            }
        }
    };
    type Step = (&'static str, &'static str, &'static str);
    let steps: [Step; 8] = [
        ("put", "users", "u99"),
        ("replace", "users", "u1"),
        ("block", "users", "u1"),
        ("delete", "users", "u7"),
        ("override over plan", "api", "k1"),
        ("delete the override: the plan again", "api", "k1"),
        ("plan", "api", "k2"),
        ("plan back to default", "api", "k2"),
    ];
    for (what, rule, key) in steps {
        match what {
            "put" | "replace" => a
                .put_override(None, raise(rule, key, 42, false))
                .await
                .unwrap(),
            "block" | "override over plan" => {
                a.put_override(None, raise(rule, key, 0, true))
                    .await
                    .unwrap();
            }
            "delete" | "delete the override: the plan again" => {
                assert!(a.delete_override(None, rule, &[key.into()]).await.unwrap());
            }
            "plan" => a.put_plan(None, plan(key, "pro")).await.unwrap(),
            _ => a.put_plan(None, plan(key, "free")).await.unwrap(),
        }
        a.compile_key(&mut kr, &set, &book, 1, parse, (rule, &[key.to_string()]));
        check(&kr, what);
    }
    assert!(
        under(&kr, &set, "api", "k1").is_some(),
        "k1's plan applies again"
    );
    assert!(
        under(&kr, &set, "api", "k2").is_none(),
        "the default plan is the rule's"
    );
}

/// An override PUT costs one key, not every override (issue 28: 47 ms
/// at 3,500 overrides, each compiled again): the change of one key
/// into the last table, and its publication (a clone sharing every
/// entry), against compiling all 3,500 with distinct limits.
#[tokio::test]
async fn a_put_compiles_one_key_not_every_override() {
    let (set, book) = setup();
    let parse = crate::config::limits_from_json;
    let a = Assignments::open(None).unwrap();
    let n: u64 = 3_500;
    for i in 0..n {
        a.put_override(None, raise("users", &format!("u{i}"), 10 + i, false))
            .await
            .unwrap();
    }
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap()
    };
    let mut kr = a.compile(&set, &book, 1, parse);
    let full = best(&mut || drop(a.compile(&set, &book, 1, parse)));
    let mut i = 0;
    let one = best(&mut || {
        i += 1;
        let key = [format!("u{i}")];
        a.compile_key(&mut kr, &set, &book, 1, parse, ("users", &key));
        drop(kr.clone());
    });
    println!("{n} overrides: compile all {full:?}, one key and publish {one:?}");
    assert_eq!(kr.len(), n as usize);
    // Generous for a loaded machine: the full compile is thousands of
    // times the work.
    assert!(one * 20 < full, "one key {one:?} vs all {full:?}");
}
