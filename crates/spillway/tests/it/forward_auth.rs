//! `forward_auth:` called as each gateway calls it, with real clients:
//! the request decided is the gateway's client request, read only from
//! trusted peers; answers gateways use as they are; tokens; h2c; hostile
//! sizes and shapes; and `/v1/limit`'s `ip`.

use std::io::{Read, Write};
use std::time::Duration;

use crate::util::{Server, TempDir, client};

const RULES: &str = r#"
rules:
  - name: login
    api: POST /login
    by: ip
    limits:
      - fixed_window: { limit: 3, window: 1h }
  - name: per-key
    by: user
    limits:
      - fixed_window: { limit: 5, window: 1h }
"#;

fn start(dir: &TempDir, forward_auth: &str, extra: &str) -> Server {
    let file = dir.write("rules.yaml", &format!("{forward_auth}\n{extra}\n{RULES}"));
    Server::start(&["--config", file.to_str().unwrap()])
}

/// Statuses of `n` calls built by `call`.
async fn statuses(n: usize, call: impl Fn() -> reqwest::RequestBuilder) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(call().send().await.unwrap().status().as_u16());
    }
    out
}

/// Envoy's ext_authz: the request's method and path follow from the call
/// itself (`path_prefix` + the original path and query; a body length of
/// 0); HEAD and GET work; the answers are a gateway's.
#[tokio::test]
async fn ext_authz_calls_decide_the_request_they_carry() {
    let dir = TempDir::new("fa-envoy");
    let s = start(&dir, "forward_auth: { user: 'header:x-api-key' }", "");
    let c = client();
    let login = || {
        c.post(s.url("/v1/forward-auth/login?next=%2F"))
            .header("content-length", "0")
    };
    assert_eq!(statuses(4, login).await, [200, 200, 200, 429]);
    let r = login().send().await.unwrap();
    assert_eq!(r.status(), 429);
    let h = r.headers();
    assert!(h["retry-after"].to_str().unwrap().parse::<u64>().unwrap() > 0);
    assert!(
        h["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"login\";r=0")
    );
    assert_eq!(h["content-type"], "application/problem+json");
    // Another path is another request: admitted, with an empty body and
    // the headers of the limit closest to denying.
    let r = c
        .get(s.url("/v1/forward-auth/things"))
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .contains("\"per-key\";r=4")
    );
    assert_eq!(r.text().await.unwrap(), "");
    let r = c
        .head(s.url("/v1/forward-auth/things"))
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["ratelimit"].to_str().unwrap().contains("r=3"));
}

/// A gateway's headers are read only from `trusted_proxies`: from any
/// other peer the call is its own request, and the log says why once.
#[tokio::test]
async fn forwarded_headers_count_only_from_trusted_peers() {
    let dir = TempDir::new("fa-trust");
    let s = start(
        &dir,
        "forward_auth: { trusted_proxies: [127.0.0.9/32], user: 'header:x-api-key' }",
        "",
    );
    let c = client();
    // From 127.0.0.1 (not trusted): POST /login in the headers is not the
    // request; the call's own GET / is, so `login` never applies.
    let spoof = || {
        c.get(s.url("/v1/forward-auth"))
            .header("x-forwarded-method", "POST")
            .header("x-forwarded-uri", "/login")
            .header("x-forwarded-for", "203.0.113.1")
    };
    assert_eq!(statuses(5, spoof).await, [200; 5]);
    let line = s.wait_line("not in forward_auth.trusted_proxies");
    assert!(line.contains("127.0.0.1"), "{line}");

    // From 127.0.0.9 (trusted), the same headers are the request, and
    // the client is the address they name, whatever a client wrote left
    // of it.
    let gw = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 9]))
        .build()
        .unwrap();
    let via_gateway = |xff: &'static str| {
        gw.get(s.url("/v1/forward-auth"))
            .header("x-forwarded-method", "POST")
            .header("x-forwarded-uri", "/login")
            .header("x-forwarded-for", xff)
    };
    let mut seen = Vec::new();
    for xff in [
        "6.6.6.1, 203.0.113.1",
        "6.6.6.2, 203.0.113.1",
        "203.0.113.1",
        "203.0.113.1",
    ] {
        seen.push(via_gateway(xff).send().await.unwrap().status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 429]);
    assert_eq!(
        via_gateway("203.0.113.2").send().await.unwrap().status(),
        200
    );
}

/// A cost is never taken from the client's request, and its query,
/// however spelled, cannot name another key than its header's.
#[tokio::test]
async fn the_query_is_the_clients_and_changes_nothing() {
    let dir = TempDir::new("fa-query");
    let s = start(
        &dir,
        "forward_auth: { trusted_proxies: [127.0.0.0/8], user: 'header:x-api-key' }",
        "",
    );
    let c = client();
    let tricks = [
        "/a?cost=0",
        "/a?x=1&cost=0",
        "/a?x=1%26cost=0",
        "/a?key=other",
        "/a?cost=-5&cost=0",
        "/a?api=GET%20/free",
        "/a",
    ];
    let mut seen = Vec::new();
    for t in tricks {
        let r = c
            .get(s.url("/v1/forward-auth"))
            .header("x-forwarded-uri", t)
            .header("x-api-key", "same")
            .send()
            .await
            .unwrap();
        seen.push(r.status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 200, 200, 429, 429], "{tricks:?}");
    // Two key headers: which one counts is not for the limit to guess.
    let r = c
        .get(s.url("/v1/forward-auth"))
        .header("x-api-key", "fresh")
        .header("x-api-key", "same")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("x-api-key"));
}

/// `deny_status: 403` (nginx): denials and refusals are 403, the only
/// refusal auth_request passes on besides 401.
#[tokio::test]
async fn deny_status_is_the_status_of_every_refusal() {
    let dir = TempDir::new("fa-403");
    let s = start(
        &dir,
        "forward_auth: { trusted_proxies: [127.0.0.0/8], user: 'header:x-api-key', deny_status: 403 }",
        "",
    );
    let c = client();
    let call = || c.get(s.url("/v1/forward-auth")).header("x-api-key", "k");
    assert_eq!(statuses(6, call).await, [200, 200, 200, 200, 200, 403]);
    let r = c
        .get(s.url("/v1/forward-auth"))
        .header("x-api-key", "a")
        .header("x-api-key", "b")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}

/// With `api.tokens`, a call needs a token in `Spillway-Authorization`;
/// the client's own `Authorization` (copied by gateways) is not read.
#[tokio::test]
async fn tokens_are_read_from_spillway_authorization() {
    let dir = TempDir::new("fa-tokens");
    let s = Server::start_env(
        &["--config", dir.write("rules.yaml", &format!(
            "forward_auth: {{ trusted_proxies: [127.0.0.0/8] }}\napi:\n  tokens:\n    - {{ name: gw, scope: read, env: GW_TOKEN }}\n{RULES}"
        )).to_str().unwrap()],
        &[("GW_TOKEN", "s3cret-token-value")],
    );
    let c = client();
    let r = c.get(s.url("/v1/forward-auth")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let r = c
        .get(s.url("/v1/forward-auth"))
        .header("authorization", "Bearer s3cret-token-value")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        401,
        "the client's Authorization is its upstream's"
    );
    let r = c
        .get(s.url("/v1/forward-auth"))
        .header("spillway-authorization", "Bearer wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .get(s.url("/v1/forward-auth"))
        .header("spillway-authorization", "Bearer s3cret-token-value")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    assert!(!body.contains("s3cret"));
}

/// HTTP/1.1 and h2c calls count on one counter, a call with more headers
/// than the direct path parses (hyper's) too, and hostile sizes and bytes
/// are decided, never passed.
#[tokio::test]
async fn every_transport_and_shape_is_decided_on_one_counter() {
    let dir = TempDir::new("fa-shapes");
    let s = start(
        &dir,
        "forward_auth: { trusted_proxies: [127.0.0.0/8], user: 'header:x-api-key' }",
        "",
    );
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let h1 = client();
    let mut seen = Vec::new();
    for (i, c) in [&h1, &h2, &h1, &h2].into_iter().enumerate() {
        let mut r = c
            .get(s.url("/v1/forward-auth"))
            .header("x-api-key", "shared")
            .header("x-forwarded-uri", format!("/{}", "p".repeat(8_000 + i)));
        if i == 2 {
            for n in 0..40 {
                r = r.header(format!("x-filler-{n}"), "f");
            }
        }
        seen.push(r.send().await.unwrap().status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 200]);
    assert_eq!(
        h1.get(s.url("/v1/forward-auth"))
            .header("x-api-key", "shared")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        h2.get(s.url("/v1/forward-auth"))
            .header("x-api-key", "shared")
            .send()
            .await
            .unwrap()
            .status(),
        429
    );

    // Raw bytes: a key that is not UTF-8 and a method that is not a token
    // refuse the call (unreadable is refused, never reinterpreted: the
    // `by: user` rule would otherwise be skipped); a call too large to
    // read is refused, not admitted; and two calls on one connection are
    // both answered (keep-alive).
    let raw = |req: &[u8]| -> String {
        let mut t = std::net::TcpStream::connect(&s.addr).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        t.write_all(req).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = t.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            if text.matches("HTTP/1.1 ").count() >= 2 || text.contains("connection: close") {
                break;
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    let answer = raw(b"GET /v1/forward-auth HTTP/1.1\r\nhost: s\r\nx-api-key: \xff\xfe\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("x-api-key header is not text"), "{answer}");
    let answer = raw(
        b"GET /v1/forward-auth HTTP/1.1\r\nhost: s\r\nx-api-key: k\r\nx-forwarded-method: G(T\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    // A control byte in a header value is refused by the parser, never
    // decided as some other request.
    let answer = raw(b"GET /v1/forward-auth HTTP/1.1\r\nhost: s\r\nx-api-key: k\r\nx-forwarded-method: G\x01T\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let huge = format!(
        "GET /v1/forward-auth HTTP/1.1\r\nhost: s\r\nx-api-key: k\r\nx-a: {}\r\nx-b: {}\r\n\r\n",
        "a".repeat(9_000),
        "b".repeat(9_000)
    );
    let answer = raw(huge.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    let two = b"GET /v1/forward-auth HTTP/1.1\r\nhost: s\r\nx-api-key: ka\r\n\r\nHEAD /v1/forward-auth HTTP/1.1\r\nhost: s\r\nx-api-key: ka\r\n\r\n";
    let answer = raw(two);
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
    assert!(answer.contains("ratelimit: \"per-key\";r=3"), "{answer}");
}

/// `/v1/limit` takes `ip`, for rules by IP.
#[tokio::test]
async fn v1_limit_takes_ip() {
    let dir = TempDir::new("fa-limit-ip");
    let s = start(&dir, "", "");
    let c = client();
    let call = |ip: &str| c.get(s.url(&format!("/v1/limit?api=POST%20/login&ip={ip}")));
    let mut seen = Vec::new();
    for ip in ["10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"] {
        seen.push(call(ip).send().await.unwrap().status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 429, 200]);
    let r = c
        .get(s.url("/v1/limit?api=POST%20/login&ip=10.0.0.3&ip=10.0.0.4"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "ip given twice");
}

/// Envoy's `ext_authz` call as the shipped `examples/gateways/envoy.yaml`
/// makes it (its `path_prefix`, the request's method, the allowed headers,
/// an empty body), against the shipped `spillway.yaml`: the route's limit
/// holds per client address. (No Envoy binary is installable here: the
/// call is made as Envoy's documentation and source describe it.)
#[tokio::test]
async fn envoy_ext_authz_as_the_shipped_config_calls_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gateways");
    let envoy = std::fs::read_to_string(root.join("envoy.yaml")).unwrap();
    let prefix = envoy
        .lines()
        .find_map(|l| l.trim().strip_prefix("path_prefix:"))
        .expect("envoy.yaml has a path_prefix")
        .trim()
        .to_string();
    let dir = TempDir::new("fa-envoy-shipped");
    let yaml = std::fs::read_to_string(root.join("spillway.yaml"))
        .unwrap()
        .replace("listen: 127.0.0.1:8080", "listen: 127.0.0.1:0");
    let file = dir.write("spillway.yaml", &yaml);
    let s = Server::start_as_configured("serve", &["--config", file.to_str().unwrap()]);
    let c = client();
    let call = |client_ip: &str| {
        c.post(s.url(&format!("{prefix}/login?next=/home")))
            .header("content-length", "0")
            .header("x-forwarded-for", client_ip)
            .header("x-envoy-expected-rq-timeout-ms", "250")
    };
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(call("198.51.100.7").send().await.unwrap().status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 200, 200, 429], "{prefix}");
    assert_eq!(call("198.51.100.8").send().await.unwrap().status(), 200);
}

/// Every rule applies as in the proxy: route respellings count as the
/// route, HEAD as GET, a shadow rule never refuses, a soft rule admits
/// its margin and says so.
#[tokio::test]
async fn rules_apply_as_in_the_proxy() {
    let dir = TempDir::new("fa-modes");
    let file = dir.write(
        "rules.yaml",
        r#"
forward_auth: { trusted_proxies: [127.0.0.0/8], user: 'header:x-api-key' }
rules:
  - name: items
    api: GET /items
    by: user
    limits:
      - fixed_window: { limit: 3, window: 1h }
  - name: reports
    api: GET /reports
    by: user
    mode: shadow
    limits:
      - fixed_window: { limit: 1, window: 1h }
  - name: export
    api: GET /export
    by: user
    mode: soft 100%
    limits:
      - fixed_window: { limit: 2, window: 1h }
"#,
    );
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let c = client();
    let call = |method: &str, uri: &str| {
        c.get(s.url("/v1/forward-auth"))
            .header("x-api-key", "u")
            .header("x-forwarded-method", method)
            .header("x-forwarded-uri", uri)
    };
    let mut seen = Vec::new();
    for (m, u) in [
        ("GET", "/items"),
        ("HEAD", "/items"),
        ("GET", "//items"),
        ("GET", "/items/"),
        ("GET", "/%69tems"),
    ] {
        seen.push(call(m, u).send().await.unwrap().status().as_u16());
    }
    assert_eq!(
        seen,
        [200, 200, 200, 429, 429],
        "respellings and HEAD count"
    );
    for _ in 0..3 {
        assert_eq!(call("GET", "/reports").send().await.unwrap().status(), 200);
    }
    let mut zones = Vec::new();
    for _ in 0..5 {
        let r = call("GET", "/export").send().await.unwrap();
        zones.push((
            r.status().as_u16(),
            r.headers()
                .get("spillway-zone")
                .map(|v| v.to_str().unwrap().to_string()),
        ));
    }
    let soft = Some("soft".to_string());
    assert_eq!(
        zones,
        [
            (200, None),
            (200, None),
            (200, soft.clone()),
            (200, soft),
            (429, None)
        ]
    );
}

/// One call written as raw bytes on its own connection, the answer read
/// to its end.
fn raw_call(addr: &str, req: &[u8]) -> String {
    let mut t = std::net::TcpStream::connect(addr).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    t.write_all(req).unwrap();
    let mut out = Vec::new();
    let _ = t.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A call from a gateway naming `uri` in `X-Forwarded-Uri`, with `more`
/// headers (over 32 moves it from the direct path to hyper's).
fn gateway_call(uri: &[u8], more: usize) -> Vec<u8> {
    let mut req = b"GET /v1/forward-auth HTTP/1.1\r\nhost: s\r\nconnection: close\r\nx-forwarded-method: POST\r\nx-forwarded-uri: ".to_vec();
    req.extend_from_slice(uri);
    req.extend_from_slice(b"\r\n");
    for n in 0..more {
        req.extend_from_slice(format!("x-filler-{n}: f\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req
}

/// Issue 35's finding: `X-Forwarded-Uri: /login?\xff` (nginx, Traefik),
/// `/login?é` (Caddy, which appends the client's query raw), and either
/// with 40 more headers, were decided as `POST /`, so the login limit
/// never applied. Every byte that is not a URI character is now
/// percent-encoded before the target is read: the login rule counts them
/// all, on the direct path and on hyper's.
#[tokio::test]
async fn raw_bytes_in_the_forwarded_uri_never_step_around_a_route() {
    let dir = TempDir::new("fa-bytes");
    let s = start(&dir, "forward_auth: { trusted_proxies: [127.0.0.0/8] }", "");
    let addr = s.addr.clone();
    let mut seen = Vec::new();
    for (uri, more) in [
        (&b"/login?\xff"[..], 0),
        ("/login?\u{e9}".as_bytes(), 0),
        (b"/login?\xff", 40),
        ("/login?\u{e9}".as_bytes(), 40),
        (b"/login?a=\xfe", 0),
    ] {
        let a = addr.clone();
        let uri = uri.to_vec();
        let answer = tokio::task::spawn_blocking(move || raw_call(&a, &gateway_call(&uri, more)))
            .await
            .unwrap();
        seen.push(answer.get(9..12).unwrap_or("").to_string());
        assert!(
            answer.contains("\"login\""),
            "the login rule decided: {answer}"
        );
    }
    assert_eq!(seen, ["200", "200", "200", "429", "429"]);
}

/// Every byte 0x00-0xFF in the forwarded target's query and in a path
/// segment, through the direct path and hyper's: each call is either
/// refused (a byte no HTTP parser takes in a header) or decided by the
/// route's rule; never decided as another route, never with no rule.
#[tokio::test]
async fn every_byte_in_path_and_query_is_decided_by_its_route_or_refused() {
    const RULES: &str = r#"
forward_auth: { trusted_proxies: [127.0.0.0/8] }
rules:
  - name: login
    api: POST /login
    by: ip
    limits:
      - fixed_window: { limit: 1000000, window: 1h }
  - name: users
    api: POST /users/{id}
    by: ip
    limits:
      - fixed_window: { limit: 1000000, window: 1h }
"#;
    let dir = TempDir::new("fa-byte-matrix");
    let file = dir.write("rules.yaml", RULES);
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    let addr = s.addr.clone();
    let failures = tokio::task::spawn_blocking(move || {
        let mut failures = Vec::new();
        for b in 0u8..=255 {
            for (uri, rule) in [
                ([&b"/login?a="[..], &[b]].concat(), "login"),
                ([&b"/users/a"[..], &[b], b"b"].concat(), "users"),
            ] {
                // `/` splits the segment: `/users/a/b` is another route
                // for the app as for the rules.
                if rule == "users" && b == b'/' {
                    continue;
                }
                for more in [0, 40] {
                    let answer = raw_call(&addr, &gateway_call(&uri, more));
                    let status = answer.get(9..12).unwrap_or("");
                    let decided =
                        matches!(status, "200" | "429") && answer.contains(&format!("\"{rule}\""));
                    if !(decided || status == "400") {
                        failures.push(format!(
                            "byte {b:#04x} in {rule} with {more} more headers: {}",
                            answer.lines().next().unwrap_or("(no answer)")
                        ));
                    }
                }
            }
        }
        failures
    })
    .await
    .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A forwarding header sent twice with different values, or two that
/// disagree, refuses the call (400, or `deny_status` when 401/403, all
/// nginx passes on); the same value twice is one value.
#[tokio::test]
async fn forwarding_headers_that_disagree_refuse_the_call() {
    let dir = TempDir::new("fa-dup");
    let s = start(&dir, "forward_auth: { trusted_proxies: [127.0.0.0/8] }", "");
    let c = client();
    let call = |pairs: &[(&'static str, &'static str)]| {
        let mut r = c.get(s.url("/v1/forward-auth"));
        for (k, v) in pairs {
            r = r.header(*k, *v);
        }
        r
    };
    for pairs in [
        &[("x-forwarded-uri", "/login"), ("x-forwarded-uri", "/other")][..],
        &[("x-forwarded-uri", "/login"), ("x-original-uri", "/other")],
        &[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-method", "GET"),
        ],
        &[("x-real-ip", "203.0.113.1"), ("x-real-ip", "203.0.113.2")],
        &[("x-forwarded-for", "unknown")],
    ] {
        let r = call(pairs).send().await.unwrap();
        assert_eq!(r.status(), 400, "{pairs:?}");
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        let pairs = [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/login"),
            ("x-forwarded-uri", "/login"),
        ];
        seen.push(call(&pairs).send().await.unwrap().status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 429]);

    let dir = TempDir::new("fa-dup-403");
    let s = start(
        &dir,
        "forward_auth: { trusted_proxies: [127.0.0.0/8], deny_status: 403 }",
        "",
    );
    let r = client()
        .get(s.url("/v1/forward-auth"))
        .header("x-forwarded-uri", "/login")
        .header("x-forwarded-uri", "/other")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
}
