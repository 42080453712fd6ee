//! The layer in an axum app and in front of a tonic (gRPC) service, over the network.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use spillway_core::{FixedWindow, KeySpec, Limit, Mode, Nanos, Rule};
use spillway_redis::{RedisConfig, RedisStore};
use spillway_store::{Checked, Limiter, MemoryStore, RuleSet, SystemClock};
use spillway_testkit::RedisServer;
use spillway_tower::{Deny, Identity, RateLimitInfo, RateLimitLayer};

/// `limit` requests an hour per user.
fn per_user(limit: u64) -> Rule {
    Rule::new(
        "per-user",
        None,
        KeySpec::parse("user").unwrap(),
        vec![Limit::FixedWindow(
            FixedWindow::new(limit, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap()
}

fn limiter(limit: u64) -> Arc<Limiter<MemoryStore<SystemClock>>> {
    Arc::new(Limiter::new(
        MemoryStore::new(SystemClock::new(), Default::default()),
        RuleSet::new(vec![per_user(limit)]),
    ))
}

fn user_header<B>(req: &http::Request<B>) -> Identity {
    Identity {
        user: req
            .headers()
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        ..Identity::default()
    }
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn axum_app_gets_429s_and_headers_and_clones_share_one_limiter() {
    let layer = RateLimitLayer::new(limiter(2), user_header::<Body>);
    // Two routers built from clones of the same layer still share counters.
    let a = serve(
        Router::new()
            .route("/", get(|| async { "a" }))
            .layer(layer.clone()),
    )
    .await;
    let b = serve(Router::new().route("/", get(|| async { "b" })).layer(layer)).await;
    let c = reqwest::Client::new();
    let r = c.get(&a).header("x-user", "u").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-remaining"], "1");
    let rl = r.headers()["ratelimit"].to_str().unwrap();
    assert!(rl.starts_with("\"per-user\";r=1;t="), "{rl}");
    assert_eq!(
        c.get(&b)
            .header("x-user", "u")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = c.get(&a).header("x-user", "u").send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(
        c.get(&b)
            .header("x-user", "v")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// Two instances of an app, each with its own limiter on its own
/// connection to one real redis-server: one count between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_on_the_redis_store_share_one_count() {
    let redis = RedisServer::start();
    let mut apps = Vec::new();
    for name in ["a", "b"] {
        let store = RedisStore::new(RedisConfig {
            url: redis.url(),
            ..RedisConfig::default()
        })
        .unwrap();
        assert!(
            store.wait_connected(Duration::from_secs(5)).await,
            "could not connect to {}",
            redis.url()
        );
        let limiter = Arc::new(Limiter::new(store, RuleSet::new(vec![per_user(3)])));
        let layer = RateLimitLayer::new(limiter, user_header::<Body>);
        apps.push(
            serve(
                Router::new()
                    .route("/", get(move || async move { name }))
                    .layer(layer),
            )
            .await,
        );
    }
    let c = reqwest::Client::new();
    let mut seen = Vec::new();
    for i in 0..5 {
        let r = c
            .get(&apps[i % 2])
            .header("x-user", "u")
            .send()
            .await
            .unwrap();
        seen.push((
            r.status().as_u16(),
            header_or_none(&r, "x-ratelimit-remaining"),
        ));
        if r.status() == 429 {
            assert!(r.headers().contains_key("retry-after"));
            assert_eq!(r.headers()["content-type"], "application/problem+json");
        }
    }
    let remaining = |n: &str| Some(n.to_string());
    assert_eq!(
        seen,
        [
            (200, remaining("2")),
            (200, remaining("1")),
            (200, remaining("0")),
            (429, remaining("0")),
            (429, remaining("0")),
        ]
    );
    // Another user has a count of its own, on either instance.
    let r = c.get(&apps[1]).header("x-user", "v").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "b");
}

fn header_or_none(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

/// The application may name the API itself (a route template, a name of
/// its own): rules match that, not the request's path.
#[tokio::test]
async fn the_application_names_the_api() {
    let rule = Rule::new(
        "by-route",
        Some(spillway_core::Route::parse("GET /users/{id}").unwrap()),
        KeySpec::parse("user").unwrap(),
        vec![Limit::FixedWindow(
            FixedWindow::new(2, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(SystemClock::new(), Default::default()),
        RuleSet::new(vec![rule]),
    ));
    // Every request under /u/ is "GET /users/{id}" to the rules.
    let layer = RateLimitLayer::new(limiter, |req: &http::Request<Body>| Identity {
        api: req
            .uri()
            .path()
            .strip_prefix("/u/")
            .map(|id| format!("GET /users/{id}")),
        ..user_header(req)
    });
    let app = serve(
        Router::new()
            .route("/u/{id}", get(|| async { "u" }))
            .route("/other", get(|| async { "o" }))
            .layer(layer),
    )
    .await;
    let c = reqwest::Client::new();
    let mut seen = Vec::new();
    for path in ["/u/1", "/u/2", "/u/3", "/other", "/other", "/other"] {
        let r = c
            .get(format!("{app}{path}"))
            .header("x-user", "a")
            .send()
            .await;
        seen.push(r.unwrap().status().as_u16());
    }
    assert_eq!(seen, [200, 200, 429, 200, 200, 200]);
}

/// `observe` sees every decision, admitted or denied, once.
#[tokio::test]
async fn observe_sees_every_decision() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let seen = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let counts = seen.clone();
    let layer = RateLimitLayer::new(limiter(2), user_header::<Body>).observe(move |checked, _| {
        counts[usize::from(!checked.decision.allowed)].fetch_add(1, Ordering::Relaxed);
    });
    let app = serve(Router::new().route("/", get(|| async { "a" })).layer(layer)).await;
    let c = reqwest::Client::new();
    for _ in 0..5 {
        c.get(&app).header("x-user", "u").send().await.unwrap();
    }
    let got = [0, 1].map(|i| seen[i].load(Ordering::Relaxed));
    assert_eq!(got, [2, 3], "admitted, denied");
}

#[tokio::test]
async fn pass_denied_lets_the_app_answer_with_the_decision_in_extensions() {
    let layer = RateLimitLayer::new(limiter(1), user_header::<Body>).pass_denied(true);
    let handler = |req: http::Request<Body>| async move {
        let info = req.extensions().get::<RateLimitInfo>().unwrap();
        if info.0.decision.allowed {
            "welcome".to_string()
        } else {
            "please slow down".to_string()
        }
    };
    let url = serve(Router::new().route("/", get(handler)).layer(layer)).await;
    let c = reqwest::Client::new();
    let first = c.get(&url).header("x-user", "u").send().await.unwrap();
    assert_eq!(first.text().await.unwrap(), "welcome");
    let second = c.get(&url).header("x-user", "u").send().await.unwrap();
    assert_eq!(second.status(), 200);
    assert_eq!(second.text().await.unwrap(), "please slow down");
}

/// gRPC services answer a denial with a status, not an HTTP 429.
struct GrpcDeny;

impl Deny<tonic::body::Body> for GrpcDeny {
    fn deny(&self, checked: &Checked) -> http::Response<tonic::body::Body> {
        let rule = checked
            .decision
            .deciding
            .as_ref()
            .and_then(|d| checked.rule(d))
            .map_or("", |r| r.name())
            .to_string();
        tonic::Status::resource_exhausted(format!("rate limit {rule} exceeded")).into_http()
    }
}

#[tokio::test]
async fn tonic_service_answers_resource_exhausted() {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>>().await;
    let layer = RateLimitLayer::new(limiter(2), user_header::<tonic::body::Body>).on_deny(GrpcDeny);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let call = || {
        let mut req = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        req.metadata_mut()
            .insert("x-user", "grpc-user".parse().unwrap());
        req
    };
    assert!(client.check(call()).await.is_ok());
    assert!(client.check(call()).await.is_ok());
    let err = client.check(call()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().contains("per-user"), "{}", err.message());
}

#[tokio::test]
async fn the_denial_body_is_valid_json_whatever_the_rule_is_called() {
    let rule = Rule::new(
        "we\"ird\\name\t",
        None,
        KeySpec::parse("user").unwrap(),
        vec![Limit::FixedWindow(
            FixedWindow::new(1, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap();
    let limiter = Limiter::new(
        MemoryStore::new(SystemClock::new(), Default::default()),
        RuleSet::new(vec![rule]),
    );
    let attrs = spillway_store::SimpleAttributes {
        user: Some("u"),
        ..Default::default()
    };
    let req = spillway_store::Request {
        method: None,
        path: None,
        attrs: &attrs,
        cost: 1,
    };
    assert!(limiter.check(&req).await.decision.allowed);
    let denied = limiter.check(&req).await;
    assert!(!denied.decision.allowed);
    let body: serde_json::Value =
        serde_json::from_str(&spillway_tower::render::problem_body(&denied)).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "too many requests");
    assert_eq!(body["rule"], "we\"ird\\name\t");
    let retry = body["retry_after"].as_u64().unwrap();
    assert!((1..=3600).contains(&retry), "{body}");
    assert!(body["detail"].as_str().unwrap().contains("exceeded"));
}

/// Issue 16: a rule whose cost the service reports in its answer
/// (`x-tokens-used`): each request is checked before it reaches the
/// service and charged what the answer says, past the budget if need be.
/// 600-token answers on 1,000 tokens an hour: exactly two are served.
#[tokio::test]
async fn a_cost_the_service_reports_is_charged_after_the_answer() {
    let rule = Rule::new(
        "tokens",
        None,
        KeySpec::parse("user").unwrap(),
        vec![Limit::FixedWindow(
            FixedWindow::new(1000, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap()
    .with_response_cost(spillway_core::ResponseCost {
        header: "X-Tokens-Used".into(),
        estimate: 0,
    });
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(SystemClock::new(), Default::default()),
        RuleSet::new(vec![rule]),
    ));
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let count = count.clone();
                async move {
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    ([("x-tokens-used", "600")], "answer")
                }
            }),
        )
        .layer(RateLimitLayer::new(limiter, user_header::<Body>));
    let url = serve(app).await;
    let c = reqwest::Client::new();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = c.get(&url).header("x-user", "u").send().await.unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// An answer whose cost cannot be read (a word, a fraction, a negative,
/// past u64, two copies that disagree, none) is charged the rule's
/// largest limit: it charged nothing, and such answers passed uncounted.
#[tokio::test]
async fn an_unreadable_answered_cost_charges_the_largest_limit() {
    let bad: [&[&str]; 6] = [
        &["many"],
        &["1.5"],
        &["-5"],
        &["99999999999999999999999"],
        &["3", "900"],
        &[""],
    ];
    for values in bad {
        let rule = Rule::new(
            "tokens",
            None,
            KeySpec::parse("user").unwrap(),
            vec![Limit::FixedWindow(
                FixedWindow::new(1000, Nanos::from_secs(3600)).unwrap(),
            )],
            Mode::Hard,
        )
        .unwrap()
        .with_response_cost(spillway_core::ResponseCost {
            header: "x-tokens-used".into(),
            estimate: 0,
        });
        let limiter = Arc::new(Limiter::new(
            MemoryStore::new(SystemClock::new(), Default::default()),
            RuleSet::new(vec![rule]),
        ));
        let owned: Vec<String> = values.iter().map(|v| (*v).to_string()).collect();
        let app = Router::new()
            .route(
                "/",
                get(move || {
                    let owned = owned.clone();
                    async move {
                        let mut r = axum::response::Response::new(Body::from("answer"));
                        for v in owned {
                            r.headers_mut().append("x-tokens-used", v.parse().unwrap());
                        }
                        r
                    }
                }),
            )
            .layer(RateLimitLayer::new(limiter, user_header::<Body>));
        let url = serve(app).await;
        let c = reqwest::Client::new();
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let r = c.get(&url).header("x-user", "u").send().await.unwrap();
            statuses.push(r.status().as_u16());
        }
        // The first answer used the whole budget (the key is at its
        // limit, owing nothing: checked at cost 0, the next passes); the
        // second puts it in debt.
        assert_eq!(statuses, [200, 200, 429], "{values:?}");
    }
}

/// A `by: header:` key past ASCII (`é`) is read as the text it is: it
/// used to read as missing, which skipped the rule.
#[tokio::test]
async fn a_header_key_past_ascii_is_counted() {
    let rule = Rule::new(
        "per-key",
        None,
        KeySpec::parse("header:x-key").unwrap(),
        vec![Limit::FixedWindow(
            FixedWindow::new(1, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(SystemClock::new(), Default::default()),
        RuleSet::new(vec![rule]),
    ));
    let layer = RateLimitLayer::new(limiter, |_: &http::Request<Body>| Identity::default());
    let url = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = reqwest::Client::new();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let v = reqwest::header::HeaderValue::from_bytes("caf\u{e9}".as_bytes()).unwrap();
        let r = c.get(&url).header("x-key", v).send().await.unwrap();
        seen.push(r.status().as_u16());
    }
    assert_eq!(seen, [200, 429]);
}

/// A header a rule is keyed by that cannot be read as one value (not
/// UTF-8; two copies that disagree, the first used to win) is refused
/// (400 with `ProblemJson`), never passed over or half-read; two equal
/// copies are one value, and a request without it is not keyed.
#[tokio::test]
async fn a_key_header_not_one_text_value_is_refused() {
    let rule = Rule::new(
        "per-key",
        None,
        KeySpec::parse("header:x-key").unwrap(),
        vec![Limit::FixedWindow(
            FixedWindow::new(5, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(SystemClock::new(), Default::default()),
        RuleSet::new(vec![rule]),
    ));
    let layer = RateLimitLayer::new(limiter, |_: &http::Request<Body>| Identity::default());
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = served.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "ok" }
            }),
        )
        .layer(layer);
    let url = serve(app).await;
    let c = reqwest::Client::new();
    let send = |values: Vec<&'static [u8]>| {
        let mut req = c.get(&url);
        for v in values {
            req = req.header(
                "x-key",
                reqwest::header::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        async move { req.send().await.unwrap() }
    };
    for values in [vec![&b"caf\xff"[..]], vec![b"victim", b"mine"]] {
        let r = send(values.clone()).await;
        assert_eq!(r.status(), 400, "{values:?}");
        assert_eq!(
            r.headers()["content-type"],
            "application/problem+json",
            "{values:?}"
        );
        assert!(r.text().await.unwrap().contains("x-key"));
    }
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Two equal copies: one value, counted.
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(send(vec![b"same", b"same"]).await.status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 200, 200, 429]);
    // Without it: no key, not limited by this rule.
    assert_eq!(send(Vec::new()).await.status(), 200);
}
