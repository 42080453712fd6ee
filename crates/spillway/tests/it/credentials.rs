//! Credentials on every decision route (issue 28): `api.tokens` close the
//! decision listener's decision routes, on the direct HTTP/1.1 path and on
//! hyper's, health staying open; and on the proxy's admin address, with
//! `admin.tokens`, everything but health needs a token, `/v1/charge` and
//! `/v1/check` included.

use reqwest::Method;
use serde_json::json;

use crate::util::{Server, TempDir, client, should_rate_limit_as};

const SVC: &str = "svc-token-0123456789abcdef";
const BILLING: &str = "billing-token-0123456789abcdef";
const OPS: &str = "ops-token-0123456789abcdef";
const READ: &str = "read-token-0123456789abcdef";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("T_SVC", SVC),
        ("T_BILLING", BILLING),
        ("T_OPS", OPS),
        ("T_READ", READ),
    ]
}

const RULES: &str = "rules:
  - name: users
    by: user
    limits: [ { fixed_window: { limit: 100, window: 1h } } ]
domains:
  - domain: edge
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 100 }
";

/// Each decision route: method, path, body.
fn routes() -> Vec<(Method, &'static str, Option<serde_json::Value>)> {
    vec![
        (Method::POST, "/v1/check", Some(json!({"user": "u"}))),
        (
            Method::POST,
            "/v1/charge",
            Some(json!({"user": "u", "cost": 1})),
        ),
        (Method::GET, "/v1/limit?user=u", None),
        (
            Method::POST,
            "/json",
            Some(
                json!({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}),
            ),
        ),
    ]
}

/// The status of `method path` with `token` (none: no Authorization),
/// and the answer's WWW-Authenticate and Content-Type.
async fn call(
    c: &reqwest::Client,
    base: &str,
    method: &Method,
    path: &str,
    body: Option<&serde_json::Value>,
    token: Option<&str>,
) -> (u16, String, String) {
    let mut req = c.request(method.clone(), format!("{base}{path}"));
    if let Some(b) = body {
        req = req.json(b);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let h = |n: &str| {
        r.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    (
        r.status().as_u16(),
        h("www-authenticate"),
        h("content-type"),
    )
}

/// Missing, unknown, too narrow and right tokens on every decision route,
/// on the direct path and (with `direct_path: false`) on hyper's.
#[tokio::test]
async fn api_tokens_close_every_decision_route_on_both_paths() {
    for direct in [true, false] {
        let dir = TempDir::new("api-tokens");
        let text = format!(
            "server: {{ direct_path: {direct} }}
admin:
  listen: 127.0.0.1:0
  tokens: [ {{ name: ops, scope: write, env: T_OPS }} ]
api:
  tokens:
    - {{ name: svc, scope: read, env: T_SVC }}
    - {{ name: billing, scope: write, env: T_BILLING }}
{RULES}"
        );
        let path = dir.write("rules.yaml", &text);
        let s = Server::start_env(&["--config", path.to_str().unwrap()], &env());
        let base = format!("http://{}", s.addr);
        let c = client();
        for (m, p, body) in routes() {
            let what = format!("{m} {p} (direct_path {direct})");
            let b = body.as_ref();
            let (st, challenge, ct) = call(&c, &base, &m, p, b, None).await;
            assert_eq!(st, 401, "{what}: no token");
            assert_eq!(challenge, "Bearer realm=\"spillway api\"", "{what}");
            assert_eq!(ct, "application/problem+json", "{what}");
            let (st, challenge, _) = call(&c, &base, &m, p, b, Some("nope-0123456789abcdef")).await;
            assert_eq!(st, 401, "{what}: unknown token");
            assert!(!challenge.is_empty(), "{what}");
            // An admin token is not a decision token.
            let (st, ..) = call(&c, &base, &m, p, b, Some(OPS)).await;
            assert_eq!(st, 401, "{what}: admin token");
            let (st, ..) = call(&c, &base, &m, p, b, Some(SVC)).await;
            if p == "/v1/charge" {
                assert_eq!(st, 403, "{what}: a read token charges nothing");
            } else {
                assert!(st != 401 && st != 403, "{what}: read token got {st}");
            }
            let (st, ..) = call(&c, &base, &m, p, b, Some(BILLING)).await;
            assert!(st != 401 && st != 403, "{what}: write token got {st}");
            if p.starts_with("/v1/") {
                assert_eq!(st, 200, "{what}");
            }
        }
        // Health stays open.
        for p in ["/healthz", "/readyz", "/healthcheck"] {
            let (st, ..) = call(&c, &base, &Method::GET, p, None, None).await;
            assert_eq!(st, 200, "{p} (direct_path {direct})");
        }
    }
}

/// Without `api.tokens` the decision API stays open, as it always was,
/// even with `admin.tokens` on the same port.
#[tokio::test]
async fn without_api_tokens_the_decision_routes_stay_open() {
    let dir = TempDir::new("api-open");
    let text = format!("admin:\n  tokens: [ {{ name: ops, scope: write, env: T_OPS }} ]\n{RULES}");
    let path = dir.write("rules.yaml", &text);
    let s = Server::start_env(&["--config", path.to_str().unwrap()], &env());
    let base = format!("http://{}", s.addr);
    let c = client();
    for (m, p, body) in routes().into_iter().filter(|r| r.1.starts_with("/v1/")) {
        let (st, ..) = call(&c, &base, &m, p, body.as_ref(), None).await;
        assert_eq!(st, 200, "{m} {p}");
    }
}

/// The proxy's admin address serves the decision API: with
/// `admin.tokens`, every route there but health needs one; `/v1/charge`
/// a write token.
#[tokio::test]
async fn the_proxy_admin_address_needs_a_token_for_decisions() {
    let up = spillway_testkit::upstream::HttpUpstream::start().await;
    let dir = TempDir::new("proxy-admin-tokens");
    let text = format!(
        "proxy:\n  upstream: {}\n  user: header:X-User\nadmin:
  listen: 127.0.0.1:0
  tokens:
    - {{ name: ops, scope: write, env: T_OPS }}
    - {{ name: grafana, scope: read, env: T_READ }}
{RULES}",
        up.url()
    );
    let path = dir.write("rules.yaml", &text);
    let s = Server::start_env_cmd("proxy", &["--config", path.to_str().unwrap()], &env());
    let base = format!("http://{}", s.listener("admin API"));
    let c = client();
    for (m, p, body) in routes().into_iter().filter(|r| r.1.starts_with("/v1/")) {
        let what = format!("{m} {p} on the proxy's admin address");
        let b = body.as_ref();
        let (st, challenge, ct) = call(&c, &base, &m, p, b, None).await;
        assert_eq!(st, 401, "{what}: no token");
        assert_eq!(challenge, "Bearer realm=\"spillway admin\"", "{what}");
        assert_eq!(ct, "application/problem+json", "{what}");
        let (st, ..) = call(&c, &base, &m, p, b, Some("nope-0123456789abcdef")).await;
        assert_eq!(st, 401, "{what}: unknown token");
        let (st, ..) = call(&c, &base, &m, p, b, Some(READ)).await;
        assert_eq!(
            st,
            if p == "/v1/charge" { 403 } else { 200 },
            "{what}: read token"
        );
        let (st, ..) = call(&c, &base, &m, p, b, Some(OPS)).await;
        assert_eq!(st, 200, "{what}: write token");
    }
    for p in ["/healthz", "/readyz"] {
        let (st, ..) = call(&c, &base, &Method::GET, p, None, None).await;
        assert_eq!(st, 200, "{p}");
    }
    let (st, ..) = call(&c, &base, &Method::GET, "/v1/status", None, None).await;
    assert_eq!(st, 401);
}

/// `api.tokens` are read again on reload: added, the decision routes
/// close; taken away, they open again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_tokens_follow_a_reload() {
    let dir = TempDir::new("api-reload");
    let path = dir.write("rules.yaml", RULES);
    let s = Server::start_env(&["--config", path.to_str().unwrap()], &env());
    let base = format!("http://{}", s.addr);
    let c = client();
    let body = json!({"user": "u"});
    let status = |token: Option<&'static str>| {
        let (c, base, body) = (c.clone(), base.clone(), body.clone());
        async move {
            call(&c, &base, &Method::POST, "/v1/check", Some(&body), token)
                .await
                .0
        }
    };
    assert_eq!(status(None).await, 200);
    let closed = format!("api:\n  tokens: [ {{ name: svc, scope: read, env: T_SVC }} ]\n{RULES}");
    for (text, want) in [(closed.as_str(), 401), (RULES, 200)] {
        dir.write("rules.yaml", text);
        s.signal("HUP");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while status(None).await != want {
            assert!(std::time::Instant::now() < deadline, "still not {want}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(status(Some(SVC)).await, 200);
    }
}

/// `api.tokens` close the gRPC listener too: a call charges counters, so
/// an open port let any caller spend another key's budget. No token or an
/// unknown one is UNAUTHENTICATED; a read or write token is served.
#[tokio::test]
async fn api_tokens_close_the_grpc_listener() {
    let dir = TempDir::new("api-tokens-grpc");
    let text = format!(
        "api:\n  tokens: [ {{ name: svc, scope: read, env: T_SVC }}, {{ name: billing, scope: write, env: T_BILLING }} ]\n{RULES}"
    );
    let path = dir.write("rules.yaml", &text);
    let s = Server::start_env(
        &[
            "--config",
            path.to_str().unwrap(),
            "--grpc-listen",
            "127.0.0.1:0",
        ],
        &env(),
    );
    let at = format!("http://{}", s.listener("gRPC"));
    let endpoint = || tonic::transport::Endpoint::from_shared(at.clone()).unwrap();
    for token in [None, Some("nope-0123456789abcdef"), Some(OPS)] {
        let err = should_rate_limit_as(endpoint(), "alice", token)
            .await
            .expect_err("refused");
        let status = err
            .downcast_ref::<tonic::Status>()
            .unwrap_or_else(|| panic!("{token:?}: not a gRPC status: {err}"));
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}");
    }
    for token in [SVC, BILLING] {
        let r = should_rate_limit_as(endpoint(), "alice", Some(token))
            .await
            .unwrap_or_else(|e| panic!("{token}: {e}"));
        assert_eq!(r.overall_code, 1, "OK");
    }
}
