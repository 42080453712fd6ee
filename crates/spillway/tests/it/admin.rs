//! The operator's plane end to end, on the real binary: token scopes,
//! looking a key up without charging it, resets, overrides (a raise, a
//! block, their end), plans, the audit trail and top keys; on the memory
//! store and on Redis shared by two instances.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use spillway_testkit::RedisServer;

use crate::util::{Server, TempDir, check, client, eventually};

const OPS: &str = "ops-token-0123456789abcdef";
const READ: &str = "read-token-0123456789abcdef";

fn tokens_env() -> Vec<(&'static str, &'static str)> {
    vec![("SPILLWAY_TEST_OPS", OPS), ("SPILLWAY_TEST_READ", READ)]
}

/// A rules file with an admin plane on its own port and `extra` before
/// the rules.
fn rules(store: &str, extra: &str, rules: &str) -> String {
    format!(
        "{store}admin:
  listen: 127.0.0.1:0
  show_keys: true
  tokens:
    - {{ name: ops, scope: write, env: SPILLWAY_TEST_OPS }}
    - {{ name: grafana, scope: read, env: SPILLWAY_TEST_READ }}
{extra}plans:
  free: {{ limits: [ {{ fixed_window: {{ limit: 2, window: 1h }} }} ] }}
  pro:  {{ limits: [ {{ fixed_window: {{ limit: 5, window: 1h }} }} ] }}
rules:
{rules}"
    )
}

const RULES: &str = "  - name: api
    by: header:X-Api-Key
    plan: { default: free }
  - name: users
    by: user
    limits:
      - fixed_window: { limit: 3, window: 1h }
";

struct Admin {
    server: Server,
    base: String,
}

impl Admin {
    fn start(text: &str, dir: &TempDir) -> Admin {
        let path = dir.write("rules.yaml", text);
        let env = tokens_env();
        let server = Server::start_env(&["--config", path.to_str().unwrap()], &env);
        let base = format!("http://{}", server.listener("admin API"));
        // A Redis store connects in the background: until it answers,
        // decisions follow the failure policy (and count nowhere).
        let ready = format!("{base}/readyz");
        let start = Instant::now();
        loop {
            let body = get_blocking(&ready);
            if body.contains("\"ready\"") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "not ready within 30 s: {body}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Admin { server, base }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

/// A plain blocking GET (for fixtures outside a runtime): the body.
fn get_blocking(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut c) = std::net::TcpStream::connect(host) else {
        return String::new();
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(
        c,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

async fn call(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = c.request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn user(c: &reqwest::Client, s: &Server, name: &str) -> u16 {
    check(c, s, json!({"user": name})).await.0
}

async fn api_key(c: &reqwest::Client, s: &Server, key: &str) -> u16 {
    check(c, s, json!({"headers": {"X-Api-Key": key}})).await.0
}

#[tokio::test]
async fn tokens_decide_who_may_look_and_who_may_change() {
    let dir = TempDir::new("admin-auth");
    let a = Admin::start(&rules("", "", RULES), &dir);
    let c = client();
    use reqwest::Method as M;
    let key = a.url("/admin/v1/keys/users/alice");
    // No token, a wrong one, a token in the wrong scheme: 401.
    for token in [None, Some("not-a-token-at-all-xxxxxx")] {
        let (st, body) = call(&c, M::GET, &key, token, None).await;
        assert_eq!(st, 401, "{body}");
        assert_eq!(body["status"], 401);
    }
    let r = c
        .get(&key)
        .header("Authorization", format!("Basic {OPS}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("www-authenticate").is_some());
    assert_eq!(
        r.headers()["content-type"],
        "application/problem+json",
        "RFC 9457 errors"
    );
    // A read token looks; it may not change.
    assert_eq!(call(&c, M::GET, &key, Some(READ), None).await.0, 200);
    let (st, body) = call(&c, M::DELETE, &key, Some(READ), None).await;
    assert_eq!(st, 403, "{body}");
    let (st, _) = call(
        &c,
        M::PUT,
        &a.url("/admin/v1/plans/api/k1"),
        Some(READ),
        Some(json!({"plan": "pro"})),
    )
    .await;
    assert_eq!(st, 403);
    let (st, _) = call(
        &c,
        M::PUT,
        &a.url("/v1/health"),
        Some(READ),
        Some(json!({"load": 0.3})),
    )
    .await;
    assert_eq!(st, 403);
    // A write token does both.
    assert_eq!(call(&c, M::DELETE, &key, Some(OPS), None).await.0, 200);
    let (st, h) = call(
        &c,
        M::PUT,
        &a.url("/v1/health"),
        Some(OPS),
        Some(json!({"load": 0.3})),
    )
    .await;
    assert_eq!(st, 200, "{h}");
    assert_eq!(h["load"], 0.3);
    // Metrics, status and rules need a token once tokens exist; health
    // probes and the dashboard's page do not.
    for p in ["/metrics", "/v1/status", "/v1/rules"] {
        assert_eq!(call(&c, M::GET, &a.url(p), None, None).await.0, 401, "{p}");
        assert_eq!(
            call(&c, M::GET, &a.url(p), Some(READ), None).await.0,
            200,
            "{p}"
        );
    }
    for p in ["/healthz", "/readyz", "/admin/"] {
        assert_eq!(call(&c, M::GET, &a.url(p), None, None).await.0, 200, "{p}");
    }
    // The decision port does not serve the admin plane.
    let (st, _) = call(
        &c,
        M::GET,
        &a.server.url("/admin/v1/keys/users/alice"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(st, 404);
    // A method a path does not have: a problem document too.
    let r = c
        .post(a.url("/admin/v1/overrides"))
        .bearer_auth(OPS)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let r = c
        .put(a.url("/admin/v1/overrides/users/alice"))
        .bearer_auth(OPS)
        .body(vec![b' '; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // Bad input: a clear 4xx, never a 5xx.
    for (m, p, body) in [
        (M::GET, "/admin/v1/keys/nope/alice", None),
        (M::GET, "/admin/v1/keys/users", None),
        (M::GET, "/admin/v1/keys/users/a/b", None),
        (M::GET, "/admin/v1/keys/users/%zz", None),
        (
            M::PUT,
            "/admin/v1/overrides/users/alice",
            Some(json!({"ttl": "1h"})),
        ),
        (
            M::PUT,
            "/admin/v1/overrides/users/alice",
            Some(json!({"block": true})),
        ),
        (
            M::PUT,
            "/admin/v1/overrides/users/alice",
            Some(json!({"limits": [{"gcra": {"rate": "x"}}], "ttl": "1h"})),
        ),
        (
            M::PUT,
            "/admin/v1/overrides/users/alice",
            Some(json!({"limits": "many", "ttl": "1h"})),
        ),
        (
            M::PUT,
            "/admin/v1/overrides/users/alice",
            Some(json!({"block": true, "ttl": "forever"})),
        ),
        (
            M::PUT,
            "/admin/v1/plans/api/k1",
            Some(json!({"plan": "gold"})),
        ),
        (M::PUT, "/admin/v1/plans/api/k1", Some(json!({"plan": 3}))),
        (M::PUT, "/v1/health", Some(json!({"load": -1}))),
        (M::GET, "/admin/v1/top?by=most", None),
        (M::GET, "/admin/v1/top?window=1d", None),
        (M::GET, "/admin/v1/audit?since=yesterday", None),
    ] {
        let (st, body) = call(&c, m.clone(), &a.url(p), Some(OPS), body).await;
        assert!((400..500).contains(&st), "{m} {p}: {st} {body}");
        assert!(body["detail"].is_string(), "{m} {p}: {body}");
    }
}

#[tokio::test]
async fn the_admin_plane_without_tokens_is_closed() {
    let dir = TempDir::new("admin-none");
    let path = dir.write(
        "rules.yaml",
        "admin_listen: 127.0.0.1:0\nrules:\n  - name: users\n    by: user\n    limits: [ { fixed_window: { limit: 3, window: 1h } } ]\n",
    );
    let s = Server::start(&["--config", path.to_str().unwrap()]);
    let base = format!("http://{}", s.listener("admin API"));
    let c = client();
    let (st, body) = call(
        &c,
        reqwest::Method::DELETE,
        &format!("{base}/admin/v1/keys/users/a"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(st, 401, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("admin.tokens"));
    // Without tokens, metrics and status stay open, as before.
    assert_eq!(
        call(
            &c,
            reqwest::Method::GET,
            &format!("{base}/metrics"),
            None,
            None
        )
        .await
        .0,
        200
    );
}

/// Looking, resetting, overriding, plans and the audit trail, with the
/// store given.
async fn operate(store: &str) {
    let dir = TempDir::new("admin-ops");
    let a = Admin::start(&rules(store, "", RULES), &dir);
    let s = &a.server;
    let c = client();
    use reqwest::Method as M;
    // Three requests of a limit of 3; looking does not charge.
    for _ in 0..2 {
        assert_eq!(user(&c, s, "alice").await, 200);
    }
    for _ in 0..3 {
        let (st, k) = call(
            &c,
            M::GET,
            &a.url("/admin/v1/keys/users/alice"),
            Some(READ),
            None,
        )
        .await;
        assert_eq!(st, 200, "{k}");
        assert_eq!(k["source"], "rule");
        let l = &k["limits"][0];
        assert_eq!(l["algorithm"], "fixed_window");
        assert_eq!(l["size"], 3);
        assert_eq!(l["remaining"], 1, "{k}");
        assert_eq!(l["allowed"], true);
        assert!(l["state"].as_str().unwrap().contains("2 of 3 used"), "{l}");
    }
    assert_eq!(user(&c, s, "alice").await, 200);
    assert_eq!(user(&c, s, "alice").await, 429);
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/users/alice"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(k["limits"][0]["allowed"], false, "{k}");
    assert!(k["limits"][0]["retry_after_ms"].as_u64().unwrap() > 0);
    // A reset: fresh again.
    let (st, body) = call(
        &c,
        M::DELETE,
        &a.url("/admin/v1/keys/users/alice"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(st, 200, "{body}");
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/users/alice"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(k["limits"][0]["remaining"], 3, "{k}");
    for _ in 0..3 {
        assert_eq!(user(&c, s, "alice").await, 200);
    }
    assert_eq!(user(&c, s, "alice").await, 429);

    // A raise: bob may send 10.
    let (st, o) = call(
        &c,
        M::PUT,
        &a.url("/admin/v1/overrides/users/bob"),
        Some(OPS),
        Some(json!({"limits": [{"fixed_window": {"limit": 10, "window": "1h"}}], "ttl": "1h", "reason": "ticket 42"})),
    )
    .await;
    assert_eq!(st, 200, "{o}");
    assert_eq!(o["by"], "ops");
    assert_eq!(o["limits"][0], "fixed_window: 10 per 3600s");
    for i in 0..10 {
        assert_eq!(user(&c, s, "bob").await, 200, "request {i} under the raise");
    }
    assert_eq!(user(&c, s, "bob").await, 429);
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/users/bob"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(k["source"], "override");
    assert_eq!(k["override"]["reason"], "ticket 42");
    let (st, got) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/overrides/users/bob"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!((st, &got["reason"]), (200, &json!("ticket 42")));
    // Others keep the rule's limit.
    for _ in 0..3 {
        assert_eq!(user(&c, s, "carol").await, 200);
    }
    assert_eq!(user(&c, s, "carol").await, 429);
    // The override goes: bob is back under the rule (and over it).
    let (st, _) = call(
        &c,
        M::DELETE,
        &a.url("/admin/v1/overrides/users/bob"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(
        call(
            &c,
            M::GET,
            &a.url("/admin/v1/overrides/users/bob"),
            Some(READ),
            None
        )
        .await
        .0,
        404
    );
    assert_eq!(
        call(
            &c,
            M::DELETE,
            &a.url("/admin/v1/overrides/users/bob"),
            Some(OPS),
            None
        )
        .await
        .0,
        404
    );

    // A block that ends by itself.
    assert_eq!(user(&c, s, "dave").await, 200);
    let (st, _) = call(
        &c,
        M::PUT,
        &a.url("/admin/v1/overrides/users/dave"),
        Some(OPS),
        Some(json!({"block": true, "ttl": "3s", "reason": "abuse"})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(user(&c, s, "dave").await, 429);
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/users/dave"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(k["blocked"], true, "{k}");
    assert_eq!(k["limits"][0]["allowed"], false, "{k}");
    assert!(k["limits"][0]["retry_after_ms"].is_null(), "{k}");
    eventually("the block ends", || async {
        user(&c, s, "dave").await == 200
    })
    .await;
    assert_eq!(
        call(
            &c,
            M::GET,
            &a.url("/admin/v1/overrides/users/dave"),
            Some(READ),
            None
        )
        .await
        .0,
        404
    );

    // Plans: the default plan's 2, then pro's 5.
    for _ in 0..2 {
        assert_eq!(api_key(&c, s, "tenant-a").await, 200);
    }
    assert_eq!(api_key(&c, s, "tenant-a").await, 429);
    let (_, p) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/plans/api/tenant-b"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(
        (&p["plan"], &p["assigned"]),
        (&json!("free"), &json!(false))
    );
    let (st, p) = call(
        &c,
        M::PUT,
        &a.url("/admin/v1/plans/api/tenant-b"),
        Some(OPS),
        Some(json!({"plan": "pro"})),
    )
    .await;
    assert_eq!(st, 200, "{p}");
    assert_eq!((&p["plan"], &p["assigned"]), (&json!("pro"), &json!(true)));
    for i in 0..5 {
        assert_eq!(api_key(&c, s, "tenant-b").await, 200, "pro request {i}");
    }
    assert_eq!(api_key(&c, s, "tenant-b").await, 429);
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/api/tenant-b"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!((&k["plan"], &k["source"]), (&json!("pro"), &json!("plan")));
    assert_eq!(k["limits"][0]["size"], 5);
    let (st, _) = call(
        &c,
        M::DELETE,
        &a.url("/admin/v1/plans/api/tenant-b"),
        Some(OPS),
        None,
    )
    .await;
    assert_eq!(st, 200);
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/api/tenant-b"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(k["limits"][0]["size"], 2, "{k}");

    // Every write is in the trail, with who and why.
    let (st, trail) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/audit?since=0"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(st, 200);
    let actions: Vec<&str> = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for want in [
        "key.reset",
        "override.put",
        "override.delete",
        "plan.put",
        "plan.delete",
    ] {
        assert!(actions.contains(&want), "{want} not in {actions:?}");
    }
    let put = trail["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "override.put")
        .unwrap();
    assert_eq!(
        (&put["token"], &put["reason"], &put["rule"]),
        (&json!("ops"), &json!("ticket 42"), &json!("users"))
    );
    assert_eq!(put["key"], json!(["bob"]));
    // ... and in the log, one line each.
    let logs = a.server.drain_logs();
    assert!(
        logs.iter()
            .any(|l| l.contains("audit") && l.contains("override.put")),
        "no audit log line in {logs:#?}"
    );
    let (_, later) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/audit?since=2999-01-01T00:00:00Z"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(later["entries"], json!([]));
}

#[tokio::test]
async fn operates_on_the_memory_store() {
    operate("").await;
}

#[tokio::test]
async fn operates_on_redis() {
    let redis = RedisServer::start();
    operate(&format!("store:\n  redis:\n    url: {}\n", redis.url())).await;
}

/// Overrides and plans given through one instance hold on another that
/// shares the Redis, and a reset on one is seen by both.
#[tokio::test]
async fn two_instances_share_overrides_plans_and_resets_through_redis() {
    let redis = RedisServer::start();
    let store = format!("store:\n  redis:\n    url: {}\n", redis.url());
    let (d1, d2) = (TempDir::new("admin-r1"), TempDir::new("admin-r2"));
    let a = Admin::start(&rules(&store, "", RULES), &d1);
    let b = Admin::start(&rules(&store, "", RULES), &d2);
    let c = client();
    use reqwest::Method as M;
    let (st, _) = call(
        &c,
        M::PUT,
        &a.url("/admin/v1/overrides/users/erin"),
        Some(OPS),
        Some(json!({"limits": [{"fixed_window": {"limit": 8, "window": "1h"}}], "ttl": "1h"})),
    )
    .await;
    assert_eq!(st, 200);
    let (st, _) = call(
        &c,
        M::PUT,
        &a.url("/admin/v1/plans/api/t1"),
        Some(OPS),
        Some(json!({"plan": "pro"})),
    )
    .await;
    assert_eq!(st, 200);
    eventually("instance b sees the override and the plan", || async {
        let (_, o) = call(
            &c,
            M::GET,
            &b.url("/admin/v1/keys/users/erin"),
            Some(READ),
            None,
        )
        .await;
        let (_, p) = call(
            &c,
            M::GET,
            &b.url("/admin/v1/keys/api/t1"),
            Some(READ),
            None,
        )
        .await;
        o["limits"][0]["size"] == 8 && p["limits"][0]["size"] == 5
    })
    .await;
    // Counted together: 4 through each instance, then refused on both.
    for _ in 0..4 {
        assert_eq!(user(&c, &a.server, "erin").await, 200);
        assert_eq!(user(&c, &b.server, "erin").await, 200);
    }
    assert_eq!(user(&c, &a.server, "erin").await, 429);
    assert_eq!(user(&c, &b.server, "erin").await, 429);
    for _ in 0..5 {
        assert_eq!(api_key(&c, &b.server, "t1").await, 200);
    }
    assert_eq!(api_key(&c, &a.server, "t1").await, 429);
    // A reset through b frees erin on a.
    assert_eq!(
        call(
            &c,
            M::DELETE,
            &b.url("/admin/v1/keys/users/erin"),
            Some(OPS),
            None
        )
        .await
        .0,
        200
    );
    // (a forgets the refusal its over-limit cache learned within a second)
    eventually("instance a sees the reset", || async {
        user(&c, &a.server, "erin").await == 200
    })
    .await;
    // Taken away on a, gone on b.
    assert_eq!(
        call(
            &c,
            M::DELETE,
            &a.url("/admin/v1/overrides/users/erin"),
            Some(OPS),
            None
        )
        .await
        .0,
        200
    );
    eventually("instance b drops the override", || async {
        call(
            &c,
            M::GET,
            &b.url("/admin/v1/overrides/users/erin"),
            Some(READ),
            None,
        )
        .await
        .0 == 404
    })
    .await;
}

/// Overrides outlive a reload, and with `admin.state_file` a restart.
#[tokio::test]
async fn overrides_survive_a_reload_and_a_restart() {
    let dir = TempDir::new("admin-keep");
    let state = dir.0.join("admin-state.json");
    let extra = format!("  state_file: {}\n", state.display());
    // `extra` goes inside `admin:` (after its tokens).
    let text = rules("", &extra, RULES);
    let c = client();
    use reqwest::Method as M;
    {
        let a = Admin::start(&text, &dir);
        let (st, _) = call(
            &c,
            M::PUT,
            &a.url("/admin/v1/overrides/users/frank"),
            Some(OPS),
            Some(json!({"limits": [{"fixed_window": {"limit": 6, "window": "1h"}}], "ttl": "1h"})),
        )
        .await;
        assert_eq!(st, 200);
        assert_eq!(
            call(
                &c,
                M::PUT,
                &a.url("/admin/v1/plans/api/t9"),
                Some(OPS),
                Some(json!({"plan": "pro"}))
            )
            .await
            .0,
            200
        );
        // A reload (another limit for everyone) keeps frank's.
        dir.write(
            "rules.yaml",
            &text.replace("limit: 3, window: 1h", "limit: 4, window: 1h"),
        );
        a.server.signal("HUP");
        a.server.wait_line("rules reloaded");
        let (_, k) = call(
            &c,
            M::GET,
            &a.url("/admin/v1/keys/users/frank"),
            Some(READ),
            None,
        )
        .await;
        assert_eq!(k["limits"][0]["size"], 6, "{k}");
        let (_, k) = call(
            &c,
            M::GET,
            &a.url("/admin/v1/keys/users/zed"),
            Some(READ),
            None,
        )
        .await;
        assert_eq!(k["limits"][0]["size"], 4, "{k}");
    }
    let a = Admin::start(&text, &dir);
    let (_, k) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/keys/users/frank"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(k["limits"][0]["size"], 6, "after a restart: {k}");
    let (_, p) = call(
        &c,
        M::GET,
        &a.url("/admin/v1/plans/api/t9"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(p["plan"], "pro");
}

/// On a Zipf-distributed load, the reported top 20 hold the true top 10
/// (counted exactly by the test), with the default sketches (256 slots)
/// and far more keys than slots.
#[tokio::test]
async fn top_keys_find_the_heaviest_clients() {
    let dir = TempDir::new("admin-top");
    let a = Admin::start(
        &rules(
            "",
            "",
            "  - name: users\n    by: user\n    limits: [ { fixed_window: { limit: 1000000, window: 1h } } ]\n",
        ),
        &dir,
    );
    let c = client();
    // Zipf(1.1) over 2,000 keys, from a fixed seed.
    let n_keys = 2000usize;
    let weights: Vec<f64> = (1..=n_keys).map(|r| 1.0 / (r as f64).powf(1.1)).collect();
    let sum: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(n_keys);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / sum;
        cdf.push(acc);
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let sent: Vec<String> = (0..6000)
        .map(|_| {
            let u = next();
            let i = cdf.partition_point(|&c| c < u).min(n_keys - 1);
            format!("k{i}")
        })
        .collect();
    let mut exact: HashMap<&str, u64> = HashMap::new();
    for k in &sent {
        *exact.entry(k).or_default() += 1;
    }
    let server = &a.server;
    let mut jobs = futures_util::stream::iter(sent.iter().map(|k| {
        let c = c.clone();
        async move { check(&c, server, json!({"user": k})).await.0 }
    }))
    .buffer_unordered(16);
    while let Some(st) = jobs.next().await {
        assert_eq!(st, 200);
    }
    let (st, top) = call(
        &c,
        reqwest::Method::GET,
        &a.url("/admin/v1/top?rule=users&by=decided&window=15m&limit=20"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(st, 200, "{top}");
    assert_eq!(top["slots"], 256);
    assert!(top["error"].as_str().unwrap().contains("upper bound"));
    let listed: Vec<&str> = top["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 20);
    let mut truth: Vec<(&str, u64)> = exact.into_iter().collect();
    truth.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (k, n) in &truth[..10] {
        assert!(
            listed.contains(k),
            "true top key {k} ({n}) not in {listed:?}"
        );
    }
    // Each count bounds the truth from above, within its error.
    for k in top["keys"].as_array().unwrap() {
        let name = k["key"].as_str().unwrap();
        let n = truth
            .iter()
            .find(|(t, _)| *t == name)
            .map_or(0, |(_, n)| *n);
        let (count, error) = (k["count"].as_u64().unwrap(), k["error"].as_u64().unwrap());
        assert!(
            count >= n && count - error <= n,
            "{name}: {count}±{error} vs {n}"
        );
    }
    // No denials yet.
    let (_, denied) = call(
        &c,
        reqwest::Method::GET,
        &a.url("/admin/v1/top?rule=users&by=denied"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(denied["total"], 0);
}

#[test]
fn the_files_errors_name_the_conflicts() {
    let dir = TempDir::new("admin-conf");
    for (text, want) in [
        (
            "admin_listen: 127.0.0.1:9091\nadmin: { listen: 127.0.0.1:9092 }\nrules: []\n",
            "name the same listener",
        ),
        (
            "proxy: { upstream: http://127.0.0.1:1, admin_listen: 127.0.0.1:9091 }\nadmin: { listen: 127.0.0.1:9092 }\nrules: []\n",
            "proxy.admin_listen",
        ),
        (
            "admin_listen: 127.0.0.1:9091\nproxy: { upstream: http://127.0.0.1:1, admin_listen: 127.0.0.1:9093 }\nrules: []\n",
            "proxy.admin_listen 127.0.0.1:9093 and admin_listen 127.0.0.1:9091",
        ),
        (
            "health: { errors: { max: 0 } }\nrules: []\n",
            "health.errors.max",
        ),
        (
            "health: { latency: { target: 0s } }\nrules: []\n",
            "health.latency.target must be longer than zero",
        ),
        (
            "rules:\n  - name: a\n    by: user\n    plan: { default: gold }\n",
            "plan \"gold\" is not in plans:",
        ),
        (
            "plans: { free: { limits: [ { gcra: { rate: 1/s } } ] } }\nrules:\n  - name: a\n    by: user\n    plan: { default: free }\n    limits: [ { gcra: { rate: 1/s } } ]\n",
            "not both",
        ),
        (
            "admin: { tokens: [ { name: ops, scope: write, env: SPILLWAY_TEST_SURELY_UNSET } ] }\nrules: []\n",
            "SPILLWAY_TEST_SURELY_UNSET is not set",
        ),
        (
            "admin: { tokens: [ { name: ops, scope: admin, env: HOME } ] }\nrules: []\n",
            "expected read or write",
        ),
    ] {
        let p = dir.write("bad.yaml", text);
        let out = crate::util::spillway(&["check-config", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{text} was accepted");
        assert!(err.contains(want), "{text}: wanted {want:?} in {err}");
    }
}

/// The proxy serves the admin plane on `admin.listen`, and an override
/// given there holds for proxied requests.
#[tokio::test]
async fn the_proxy_takes_overrides_from_its_admin_plane() {
    let up = spillway_testkit::upstream::HttpUpstream::start().await;
    let dir = TempDir::new("admin-proxy");
    let text = rules(
        &format!("proxy:\n  upstream: {}\n  user: header:X-User\n", up.url()),
        "",
        "  - name: users\n    by: user\n    limits: [ { fixed_window: { limit: 2, window: 1h } } ]\n",
    );
    let path = dir.write("rules.yaml", &text);
    let env = tokens_env();
    let server = Server::start_env_cmd("proxy", &["--config", path.to_str().unwrap()], &env);
    let admin = format!("http://{}", server.listener("admin API"));
    let c = client();
    let get = |who: &'static str| {
        let c = c.clone();
        let url = server.url("/anything");
        async move {
            c.get(url)
                .header("X-User", who)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(get("gina").await, 200);
    assert_eq!(get("gina").await, 200);
    assert_eq!(get("gina").await, 429);
    let (st, body) = call(
        &c,
        reqwest::Method::PUT,
        &format!("{admin}/admin/v1/overrides/users/gina"),
        Some(OPS),
        Some(json!({"limits": [{"fixed_window": {"limit": 5, "window": "1h"}}], "ttl": "1h"})),
    )
    .await;
    assert_eq!(st, 200, "{body}");
    // Her own counters: five more.
    for i in 0..5 {
        assert_eq!(get("gina").await, 200, "request {i} under the raise");
    }
    assert_eq!(get("gina").await, 429);
    // The proxy's own port forwards the admin path upstream: it is not
    // the admin plane.
    let r = c
        .get(server.url("/admin/v1/overrides"))
        .header("X-User", "hal")
        .bearer_auth(OPS)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(up.requests_to("/admin/v1/overrides").len() == 1);
}

/// With `admin.top_keys: false` nothing is counted, and the call says so.
#[tokio::test]
async fn top_keys_can_be_turned_off() {
    let dir = TempDir::new("admin-top-off");
    let a = Admin::start(&rules("", "  top_keys: false\n", RULES), &dir);
    let c = client();
    assert_eq!(user(&c, &a.server, "ivy").await, 200);
    let (st, body) = call(
        &c,
        reqwest::Method::GET,
        &a.url("/admin/v1/top?rule=users"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(st, 409, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("top_keys"));
}

/// A health report is read against `health:`'s targets (the worst signal
/// counts), shown on status and metrics, and is unknown once stale.
#[tokio::test]
async fn health_reports_are_read_against_targets_and_go_stale() {
    let dir = TempDir::new("admin-health");
    let top = "health:\n  latency: { target: 200ms, percentile: 99 }\n  errors: { max: 2% }\n  stale_after: 1s\n";
    let a = Admin::start(&rules(top, "", RULES), &dir);
    let c = client();
    use reqwest::Method as M;
    let (_, h) = call(&c, M::GET, &a.url("/v1/health"), Some(READ), None).await;
    assert_eq!(
        (&h["reported"], &h["as_seen"]["known"]),
        (&json!(false), &json!(false))
    );
    let (st, h) = call(
        &c,
        M::PUT,
        &a.url("/v1/health"),
        Some(OPS),
        Some(json!({"load": 0.2, "latency_ms": 300, "error_rate": 0.01})),
    )
    .await;
    assert_eq!(st, 200, "{h}");
    // 300 ms of a 200 ms target is the worst: 1.5.
    assert_eq!(h["as_seen"]["known"], true, "{h}");
    assert_eq!(h["as_seen"]["load"], 1.5, "{h}");
    let (_, s) = call(&c, M::GET, &a.url("/v1/status"), Some(READ), None).await;
    assert_eq!(s["health"]["load"], 1.5, "{s}");
    let m = c
        .get(a.url("/metrics"))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("spillway_health_known 1"), "{m}");
    assert!(m.contains("spillway_health_load 1.5"), "{m}");
    eventually("the report goes stale", || async {
        let (_, h) = call(&c, M::GET, &a.url("/v1/health"), Some(READ), None).await;
        h["as_seen"]["known"] == false && h["reported"] == true
    })
    .await;
    let (st, _) = call(&c, M::GET, &a.url("/v1/status"), Some(READ), None).await;
    assert_eq!(st, 200);
}

/// Every refused write is in the audit trail with its reason (issue 28):
/// no token, an unknown one, a read token, a bad body, no such rule, on
/// each kind of write call.
#[tokio::test]
async fn refused_writes_are_audited_with_their_reason() {
    use reqwest::Method;
    let dir = TempDir::new("admin-refused");
    let a = Admin::start(&rules("", "", RULES), &dir);
    let c = client();
    let raise = json!({"limits": [{"fixed_window": {"limit": 9, "window": "1h"}}], "ttl": "1h"});
    /// Method, path, token, body; the status, action and token name the
    /// audit entry says.
    type Call<'a> = (
        Method,
        &'a str,
        Option<&'a str>,
        Option<Value>,
        u16,
        &'a str,
        &'a str,
    );
    let calls: Vec<Call<'_>> = vec![
        (
            Method::PUT,
            "/admin/v1/overrides/users/ann",
            None,
            Some(raise.clone()),
            401,
            "override.put",
            "-",
        ),
        (
            Method::PUT,
            "/admin/v1/overrides/users/ann",
            Some("not-a-token-0123456789"),
            Some(raise.clone()),
            401,
            "override.put",
            "-",
        ),
        (
            Method::PUT,
            "/admin/v1/overrides/users/ann",
            Some(READ),
            Some(raise.clone()),
            403,
            "override.put",
            "grafana",
        ),
        (
            Method::PUT,
            "/admin/v1/overrides/users/ann",
            Some(OPS),
            Some(json!({"ttl": 5})),
            400,
            "override.put",
            "ops",
        ),
        (
            Method::PUT,
            "/admin/v1/overrides/nosuchrule/ann",
            Some(OPS),
            Some(raise.clone()),
            404,
            "override.put",
            "ops",
        ),
        (
            Method::DELETE,
            "/admin/v1/keys/users/ann",
            None,
            None,
            401,
            "key.reset",
            "-",
        ),
        (
            Method::DELETE,
            "/admin/v1/overrides/users/ann",
            Some(READ),
            None,
            403,
            "override.delete",
            "grafana",
        ),
        (
            Method::PUT,
            "/admin/v1/plans/api/acme",
            Some(OPS),
            Some(json!({"plan": "gold"})),
            400,
            "plan.put",
            "ops",
        ),
        (
            Method::DELETE,
            "/admin/v1/plans/nosuchrule/acme",
            Some(OPS),
            None,
            404,
            "plan.delete",
            "ops",
        ),
        (
            Method::PUT,
            "/v1/health",
            Some(READ),
            Some(json!({"load": 0.5})),
            403,
            "health.put",
            "grafana",
        ),
    ];
    for (m, p, tok, body, want, ..) in &calls {
        let (st, b) = call(&c, m.clone(), &a.url(p), *tok, body.clone()).await;
        assert_eq!(st, *want, "{m} {p}: {b}");
    }
    let (st, got) = call(&c, Method::GET, &a.url("/admin/v1/audit"), Some(READ), None).await;
    assert_eq!(st, 200, "{got}");
    let entries = got["entries"].as_array().unwrap();
    assert_eq!(entries.len(), calls.len(), "{got}");
    for (e, (m, p, _, _, want, action, who)) in entries.iter().zip(&calls) {
        assert_eq!(e["method"], m.as_str(), "{e}");
        assert_eq!(e["path"], *p, "{e}");
        assert_eq!(e["status"], *want, "{e}");
        assert_eq!(e["action"], *action, "{e}");
        assert_eq!(e["token"], *who, "{e}");
        let why = e["refused"].as_str().unwrap_or_default();
        assert!(!why.is_empty(), "no reason: {e}");
        // Never a token's value.
        assert!(!why.contains("0123456789"), "{e}");
    }
    assert!(
        entries[0]["refused"].as_str().unwrap().contains("Bearer"),
        "{}",
        entries[0]
    );
    assert!(
        entries[2]["refused"]
            .as_str()
            .unwrap()
            .contains("may only read"),
        "{}",
        entries[2]
    );
    assert!(
        entries[4]["refused"]
            .as_str()
            .unwrap()
            .contains("nosuchrule"),
        "{}",
        entries[4]
    );
    // And one log line each (the log reaches the test a little later).
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log
        .lines()
        .filter(|l| l.contains("spillway::audit"))
        .count()
        < calls.len()
        && Instant::now() < deadline
    {
        log.push_str(&a.server.drain_logs().join("\n"));
        log.push('\n');
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("spillway::audit"))
            .count(),
        calls.len(),
        "{log}"
    );
}

/// A top key longer than the list's cut (issue 28): the list shows it cut,
/// and blocking that form leaves the client admitted (it is another key);
/// blocking the `parts` the list gives (what the dashboard sends) denies
/// the client itself.
#[tokio::test]
async fn a_long_top_key_is_blocked_whole_not_in_its_cut_form() {
    use reqwest::Method;
    let dir = TempDir::new("admin-long-key");
    let a = Admin::start(&rules("", "", RULES), &dir);
    let c = client();
    let long = format!("tenant-{}", "x".repeat(300));
    assert_eq!(user(&c, &a.server, &long).await, 200);
    let (st, top) = call(
        &c,
        Method::GET,
        &a.url("/admin/v1/top?rule=users&by=decided&window=1m"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(st, 200, "{top}");
    let k = &top["keys"][0];
    let shown = k["key"].as_str().unwrap();
    assert!(shown.ends_with('…') && shown.len() < long.len(), "{k}");
    assert_eq!(k["cut"], true, "{k}");
    assert_eq!(k["parts"], json!([long]), "{k}");
    let block = json!({"block": true, "ttl": "1h", "reason": "abuse"});
    // The cut form, as the dashboard used to send it: another key.
    let cut_path = format!(
        "/admin/v1/overrides/users/{}",
        shown.replace('…', "%E2%80%A6")
    );
    let (st, b) = call(
        &c,
        Method::PUT,
        &a.url(&cut_path),
        Some(OPS),
        Some(block.clone()),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(
        user(&c, &a.server, &long).await,
        200,
        "the cut form blocked nobody"
    );
    // The whole key, from `parts`.
    let parts: Vec<String> = serde_json::from_value(k["parts"].clone()).unwrap();
    let path = format!("/admin/v1/overrides/users/{}", parts.join("/"));
    let (st, b) = call(&c, Method::PUT, &a.url(&path), Some(OPS), Some(block)).await;
    assert_eq!(st, 200, "{b}");
    assert_eq!(
        user(&c, &a.server, &long).await,
        429,
        "the client is blocked"
    );
}
