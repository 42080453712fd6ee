//! Rules made over the admin API (issue 36, item 7), end to end on the real
//! binary: PUT, GET, DELETE and the paged list; tokens, the audit trail,
//! ETags; kept in `admin.state_file` on one instance, and in a real Redis
//! shared by two, where a change on one applies on the other within 1 s and
//! outlives both restarting.

use std::time::{Duration, Instant};

use reqwest::Method as M;
use serde_json::{Value, json};
use spillway_testkit::RedisServer;

use crate::util::{Server, TempDir, check, client, eventually};

const OPS: &str = "rules-ops-token-0123456789abcdef";
const READ: &str = "rules-read-token-0123456789abcdef";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("SPILLWAY_RULES_OPS", OPS), ("SPILLWAY_RULES_READ", READ)]
}

/// A rules file: `store` first, `admin_extra` inside `admin:`.
fn file(store: &str, admin_extra: &str) -> String {
    format!(
        "{store}admin:
  tokens:
    - {{ name: ops, scope: write, env: SPILLWAY_RULES_OPS }}
    - {{ name: grafana, scope: read, env: SPILLWAY_RULES_READ }}
{admin_extra}rules:
  - name: from-file
    api: /file
    by: user
    limits:
      - fixed_window: {{ limit: 100, window: 1h }}
"
    )
}

fn start(dir: &TempDir, text: &str) -> Server {
    let path = dir.write("rules.yaml", text);
    Server::start_env(&["--config", path.to_str().unwrap()], &env())
}

/// Sends a call; its status, headers and body (JSON, or the text as a
/// JSON string).
async fn call(
    c: &reqwest::Client,
    method: M,
    url: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = c.request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let h = r.headers().clone();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, h, v)
}

fn limit_rule(limit: u64) -> String {
    json!({"api": "/made", "by": "user", "limits": [{"fixed_window": {"limit": limit, "window": "1h"}}]})
        .to_string()
}

fn etag(h: &reqwest::header::HeaderMap) -> String {
    h.get("etag")
        .expect("an ETag")
        .to_str()
        .unwrap()
        .to_string()
}

/// How many of `n` checks of `/made` for `user` are admitted.
async fn admitted(c: &reqwest::Client, s: &Server, user: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let (st, _, j) = check(c, s, json!({"api": "/made", "user": user})).await;
        assert!(st == 200 || st == 429, "{st} {j}");
        ok += usize::from(st == 200);
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_are_made_changed_and_deleted_over_the_api() {
    let dir = TempDir::new("rules-api");
    let state = dir.0.join("state.json");
    let text = file("", &format!("  state_file: {}\n", state.display()));
    let c = client();
    let url = |s: &Server, p: &str| s.url(p);
    {
        let s = start(&dir, &text);
        let made = url(&s, "/admin/v1/rules/made");
        // Tokens: none is 401, a read one 403, on every write.
        let body = limit_rule(2);
        let (st, h, _) = call(&c, M::PUT, &made, None, &[], Some(&body)).await;
        assert_eq!(st, 401);
        assert!(h.get("www-authenticate").is_some());
        let (st, _, _) = call(&c, M::PUT, &made, Some(READ), &[], Some(&body)).await;
        assert_eq!(st, 403);
        let (st, _, _) = call(&c, M::DELETE, &made, Some(READ), &[], None).await;
        assert_eq!(st, 403);
        let (st, _, _) = call(&c, M::GET, &made, None, &[], None).await;
        assert_eq!(st, 401);
        // Bad bodies: 400 with a problem that says what is wrong.
        for (bad, says) in [
            ("{", "not JSON"),
            ("[1]", "JSON object"),
            (r#"{"limits": [{"gcra": {"rate": "0/s"}}]}"#, "rate"),
            (r#"{"by": "user", "limitz": []}"#, "limitz"),
            (
                r#"{"name": "other", "limits": [{"gcra": {"rate": "1/s"}}]}"#,
                "name",
            ),
            (
                r#"{"limits": [{"gcra": {"rate": "1/s", "burst": 1e300}}]}"#,
                "whole number",
            ),
        ] {
            let (st, h, j) = call(&c, M::PUT, &made, Some(OPS), &[], Some(bad)).await;
            assert_eq!(st, 400, "{bad}: {j}");
            assert_eq!(h["content-type"], "application/problem+json", "{bad}");
            assert!(j["detail"].as_str().unwrap().contains(says), "{bad}: {j}");
        }
        // A file rule's name: 409, PUT and DELETE alike.
        let (st, _, j) = call(
            &c,
            M::PUT,
            &url(&s, "/admin/v1/rules/from-file"),
            Some(OPS),
            &[],
            Some(&limit_rule(1)),
        )
        .await;
        assert_eq!(st, 409, "{j}");
        let (st, _, _) = call(
            &c,
            M::DELETE,
            &url(&s, "/admin/v1/rules/from-file"),
            Some(OPS),
            &[],
            None,
        )
        .await;
        assert_eq!(st, 409);
        // Made: 201, an ETag, in force at once.
        let (st, h, j) = call(
            &c,
            M::PUT,
            &made,
            Some(OPS),
            &[("if-none-match", "*")],
            Some(&body),
        )
        .await;
        assert_eq!(st, 201, "{j}");
        let first = etag(&h);
        assert_eq!(j["source"], "api");
        assert_eq!(j["etag"], first.as_str());
        assert_eq!(j["limits"][0], "fixed_window: 2 per 3600s", "{j}");
        assert_eq!(admitted(&c, &s, "ann", 3).await, 2);
        // Create-only again: 412.
        let (st, _, _) = call(
            &c,
            M::PUT,
            &made,
            Some(OPS),
            &[("if-none-match", "*")],
            Some(&body),
        )
        .await;
        assert_eq!(st, 412);
        // Changed with its ETag; a stale ETag is 412.
        let (st, h, j) = call(
            &c,
            M::PUT,
            &made,
            Some(OPS),
            &[("if-match", &first)],
            Some(&limit_rule(5)),
        )
        .await;
        assert_eq!(st, 200, "{j}");
        let second = etag(&h);
        assert_ne!(first, second);
        let (st, h, j) = call(
            &c,
            M::PUT,
            &made,
            Some(OPS),
            &[("if-match", &first)],
            Some(&limit_rule(9)),
        )
        .await;
        assert_eq!(st, 412, "{j}");
        assert_eq!(etag(&h), second);
        let (st, _, _) = call(
            &c,
            M::DELETE,
            &made,
            Some(OPS),
            &[("if-match", &first)],
            None,
        )
        .await;
        assert_eq!(st, 412);
        assert_eq!(admitted(&c, &s, "bob", 6).await, 5);
        let (st, h, j) = call(&c, M::GET, &made, Some(READ), &[], None).await;
        assert_eq!(st, 200);
        assert_eq!(etag(&h), second);
        assert_eq!(j["rule"]["limits"][0]["fixed_window"]["limit"], 5, "{j}");
        // A file rule reads too, as the file's.
        let (_, _, j) = call(
            &c,
            M::GET,
            &url(&s, "/admin/v1/rules/from-file"),
            Some(READ),
            &[],
            None,
        )
        .await;
        assert_eq!(j["source"], "file", "{j}");
        // Paged: by name, prefix, after, limit, next_after.
        for n in ["page-a", "page-b", "page-c"] {
            let (st, _, j) = call(
                &c,
                M::PUT,
                &url(&s, &format!("/admin/v1/rules/{n}")),
                Some(OPS),
                &[],
                Some(&limit_rule(1).replace("/made", &format!("/{n}"))),
            )
            .await;
            assert_eq!(st, 201, "{j}");
        }
        let names = |j: &Value| -> Vec<String> {
            j["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["name"].as_str().unwrap().to_string())
                .collect()
        };
        let (_, _, j) = call(
            &c,
            M::GET,
            &url(&s, "/admin/v1/rules?limit=2"),
            Some(READ),
            &[],
            None,
        )
        .await;
        assert_eq!(names(&j), ["from-file", "made"], "{j}");
        assert_eq!(j["next_after"], "made");
        let (_, _, j) = call(
            &c,
            M::GET,
            &url(&s, "/admin/v1/rules?limit=2&after=made"),
            Some(READ),
            &[],
            None,
        )
        .await;
        assert_eq!(names(&j), ["page-a", "page-b"], "{j}");
        let (_, _, j) = call(
            &c,
            M::GET,
            &url(&s, "/admin/v1/rules?prefix=page-&after=page-b"),
            Some(READ),
            &[],
            None,
        )
        .await;
        assert_eq!(names(&j), ["page-c"], "{j}");
        assert_eq!(j["next_after"], Value::Null);
        for bad in ["limit=0", "limit=1001", "limit=x"] {
            let (st, _, _) = call(
                &c,
                M::GET,
                &url(&s, &format!("/admin/v1/rules?{bad}")),
                Some(READ),
                &[],
                None,
            )
            .await;
            assert_eq!(st, 400, "{bad}");
        }
        // /v1/rules pages too, its fields as before.
        let (_, _, j) = call(
            &c,
            M::GET,
            &url(&s, "/v1/rules?limit=2"),
            Some(READ),
            &[],
            None,
        )
        .await;
        assert_eq!(names(&j), ["from-file", "made"], "{j}");
        assert_eq!(j["total"], 5);
        assert_eq!(j["next_after"], "made");
        // Deleted.
        let (st, _, _) = call(
            &c,
            M::DELETE,
            &url(&s, "/admin/v1/rules/page-c"),
            Some(OPS),
            &[],
            None,
        )
        .await;
        assert_eq!(st, 200);
        let (st, _, _) = call(
            &c,
            M::DELETE,
            &url(&s, "/admin/v1/rules/page-c"),
            Some(OPS),
            &[],
            None,
        )
        .await;
        assert_eq!(st, 404);
        // Every write audited, refusals too.
        let (_, _, j) = call(
            &c,
            M::GET,
            &url(&s, "/admin/v1/audit"),
            Some(READ),
            &[],
            None,
        )
        .await;
        let entries = j["entries"].as_array().unwrap();
        let of = |action: &str, status: u16| {
            entries
                .iter()
                .filter(|e| e["action"] == action && e["status"] == status)
                .count()
        };
        assert!(of("rule.put", 201) >= 4, "{j}");
        assert!(of("rule.put", 412) >= 2, "{j}");
        assert!(of("rule.put", 409) >= 1, "{j}");
        // A refusal says why, as its answer did.
        assert!(
            entries.iter().any(|e| e["action"] == "rule.put"
                && e["status"] == 409
                && e["refused"]
                    .as_str()
                    .is_some_and(|r| r.contains("rules file"))),
            "{j}"
        );
        assert!(of("rule.put", 400) >= 6, "{j}");
        assert!(of("rule.put", 401) >= 1 && of("rule.put", 403) >= 1, "{j}");
        assert!(
            of("rule.delete", 200) >= 1 && of("rule.delete", 404) >= 1,
            "{j}"
        );
        assert!(
            entries
                .iter()
                .any(|e| e["rule"] == "made" && e["token"] == "ops"),
            "{j}"
        );
        // A reload of the file keeps them.
        dir.write("rules.yaml", &text.replace("limit: 100", "limit: 101"));
        s.signal("HUP");
        s.wait_line("rules reloaded");
        let (st, _, _) = call(&c, M::GET, &made, Some(READ), &[], None).await;
        assert_eq!(st, 200);
        assert_eq!(admitted(&c, &s, "cid", 6).await, 5);
    }
    // A restart reads them from admin.state_file.
    let s = start(&dir, &text);
    let (st, h, j) = call(
        &c,
        M::GET,
        &s.url("/admin/v1/rules/made"),
        Some(READ),
        &[],
        None,
    )
    .await;
    assert_eq!(st, 200, "{j}");
    assert!(!etag(&h).is_empty());
    assert_eq!(admitted(&c, &s, "dan", 6).await, 5);
    let (st, _, _) = call(
        &c,
        M::GET,
        &s.url("/admin/v1/rules/page-c"),
        Some(READ),
        &[],
        None,
    )
    .await;
    assert_eq!(st, 404);
    // check-config reads them back from admin.state_file.
    let path = dir.0.join("rules.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check-config", path.to_str().unwrap(), "--from-store"])
        .envs(env())
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("API rules in the store: 3"), "{said}");
    assert!(said.contains("made (version"), "{said}");
}

/// A state file written before API rules existed still loads.
#[tokio::test]
async fn a_state_file_without_api_rules_still_loads() {
    let dir = TempDir::new("rules-api-old");
    let state = dir.write("state.json", r#"{"overrides": [], "plans": []}"#);
    let text = file("", &format!("  state_file: {}\n", state.display()));
    let s = start(&dir, &text);
    let c = client();
    let (st, _, j) = call(
        &c,
        M::PUT,
        &s.url("/admin/v1/rules/made"),
        Some(OPS),
        &[],
        Some(&limit_rule(1)),
    )
    .await;
    assert_eq!(st, 201, "{j}");
    let kept: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(
        kept["api_rules"]["rules"][0]["rule"]["name"], "made",
        "{kept}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_put_on_one_instance_applies_on_another_within_a_second() {
    let redis = RedisServer::start();
    let dir = TempDir::new("rules-api-redis");
    let store = format!(
        "store:\n  redis:\n    url: {}/0\n    timeout: 10s\n    prefix: \"rules-it:\"\n",
        redis.url()
    );
    let text = file(&store, "");
    let c = client();
    let ready = |s: &Server| {
        let c = c.clone();
        let url = s.url("/readyz");
        async move {
            eventually("ready", || {
                let c = c.clone();
                let url = url.clone();
                async move {
                    let j: Value = crate::util::json(c.get(&url)).await;
                    j["status"] == "ready"
                }
            })
            .await;
        }
    };
    let in_force = |s: &Server, name: &str| {
        let c = c.clone();
        let url = s.url(&format!("/v1/rules?prefix={name}"));
        let name = name.to_string();
        async move {
            let (_, _, j) = call(&c, M::GET, &url, Some(READ), &[], None).await;
            j["rules"]
                .as_array()
                .is_some_and(|l| l.iter().any(|r| r["name"] == name.as_str()))
        }
    };
    // How long until `f` holds, polled for up to 10 s.
    async fn until<F, Fut>(mut f: F) -> Duration
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while !f().await {
            assert!(start.elapsed() < Duration::from_secs(10), "not within 10 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        start.elapsed()
    }
    {
        let a = start(&dir, &text);
        let b = start(&dir, &text);
        ready(&a).await;
        ready(&b).await;
        let (st, _, j) = call(
            &c,
            M::PUT,
            &a.url("/admin/v1/rules/made"),
            Some(OPS),
            &[],
            Some(&limit_rule(3)),
        )
        .await;
        assert_eq!(st, 201, "{j}");
        let took = until(|| in_force(&b, "made")).await;
        assert!(
            took < Duration::from_secs(1),
            "applied on the second instance after {took:?}"
        );
        // Counted together: 3 in all across both.
        let n = admitted(&c, &a, "eve", 2).await + admitted(&c, &b, "eve", 3).await;
        assert_eq!(n, 3);
        // A file rule's name is refused on either.
        let (st, _, _) = call(
            &c,
            M::PUT,
            &b.url("/admin/v1/rules/from-file"),
            Some(OPS),
            &[],
            Some(&limit_rule(3)),
        )
        .await;
        assert_eq!(st, 409);
        // The ETag is one across instances: B changes it with A's.
        let (_, h, _) = call(
            &c,
            M::GET,
            &a.url("/admin/v1/rules/made"),
            Some(READ),
            &[],
            None,
        )
        .await;
        let tag = etag(&h);
        let (st, _, j) = call(
            &c,
            M::PUT,
            &b.url("/admin/v1/rules/made"),
            Some(OPS),
            &[("if-match", &tag)],
            Some(&limit_rule(4)),
        )
        .await;
        assert_eq!(st, 200, "{j}");
        let (st, _, _) = call(
            &c,
            M::PUT,
            &a.url("/admin/v1/rules/made"),
            Some(OPS),
            &[("if-match", &tag)],
            Some(&limit_rule(7)),
        )
        .await;
        assert_eq!(st, 412, "A's stale ETag after B's change");
        // A delete on B leaves A within 1 s.
        let (st, _, _) = call(
            &c,
            M::PUT,
            &a.url("/admin/v1/rules/gone"),
            Some(OPS),
            &[],
            Some(&limit_rule(1).replace("/made", "/gone")),
        )
        .await;
        assert_eq!(st, 201);
        until(|| in_force(&b, "gone")).await;
        let (st, _, _) = call(
            &c,
            M::DELETE,
            &b.url("/admin/v1/rules/gone"),
            Some(OPS),
            &[],
            None,
        )
        .await;
        assert_eq!(st, 200);
        let took = until(|| {
            let f = in_force(&a, "gone");
            async move { !f.await }
        })
        .await;
        assert!(
            took < Duration::from_secs(1),
            "deleted on the first instance after {took:?}"
        );
    }
    // Both restarted: the rule is in force on each from Redis.
    let a = start(&dir, &text);
    let b = start(&dir, &text);
    ready(&a).await;
    ready(&b).await;
    until(|| in_force(&a, "made")).await;
    until(|| in_force(&b, "made")).await;
    let (_, _, j) = call(
        &c,
        M::GET,
        &b.url("/admin/v1/rules/made"),
        Some(READ),
        &[],
        None,
    )
    .await;
    assert_eq!(j["rule"]["limits"][0]["fixed_window"]["limit"], 4, "{j}");
    assert!(!in_force(&a, "gone").await);
    // check-config reads them back from the store.
    let path = dir.0.join("rules.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check-config", path.to_str().unwrap(), "--from-store"])
        .envs(env())
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("made"), "{said}");
    assert!(!said.contains("gone"), "{said}");
}
