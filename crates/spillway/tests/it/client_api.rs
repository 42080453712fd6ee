//! spillway-client's typed decision API client (`spillway_client::api`)
//! against the real `spillway serve`.

use std::time::Duration;

use spillway_client::api::{ApiError, Check, DecisionClient, Outcome};

use crate::util::{Server, TempDir};

/// A `spillway serve` with `rules` as its rules file, and a client of it.
fn serve(tag: &str, rules: &str) -> (TempDir, Server, DecisionClient) {
    let dir = TempDir::new(tag);
    let file = dir.write("rules.yaml", rules);
    let s = Server::start(&["--config", file.to_str().unwrap()]);
    // A generous deadline: a hang guard, not a measurement.
    let client = DecisionClient::new(&s.url(""))
        .unwrap()
        .with_timeout(Duration::from_secs(10));
    (dir, s, client)
}

const PER_USER: &str = "rules:
  - name: per-user
    api: /x
    by: user
    limits:
      - sliding_window_log: { limit: 2, window: 1h }
";

#[tokio::test]
async fn check_admits_then_denies_at_the_limit() {
    let (_dir, _s, client) = serve("capi-check", PER_USER);
    let check = Check::new().api("GET /x").user("alice");
    for left in [1, 0] {
        let d = client.check(&check).await.unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.outcome, Outcome::Allowed);
        assert_eq!(d.rule.as_deref(), Some("per-user"));
        assert_eq!((d.limit, d.remaining), (Some(2), Some(left)));
        assert_eq!(d.retry_after, Duration::ZERO);
        assert!(!d.store_error);
    }
    // The 429 is a decision, not an error.
    let d = client.check(&check).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert_eq!(d.outcome, Outcome::Denied);
    assert_eq!(d.remaining, Some(0));
    assert!(d.retry_after > Duration::ZERO, "{d:?}");
    assert!(d.retry_after <= Duration::from_secs(3600), "{d:?}");
    assert_eq!(d.rules.len(), 1);
    assert_eq!(d.rules[0].rule, "per-user");
    assert_eq!(d.rules[0].algorithm, "sliding_window_log");
    assert_eq!(d.rules[0].outcome, Outcome::Denied);
    // Another user, and a request no rule applies to.
    assert!(
        client
            .check(&check.clone().user("bob"))
            .await
            .unwrap()
            .allowed
    );
    let d = client.check(&Check::new().api("/y")).await.unwrap();
    assert!(d.allowed && d.rule.is_none() && d.rules.is_empty(), "{d:?}");
}

#[tokio::test]
async fn limit_decides_for_a_key_spelled_with_any_characters() {
    let (_dir, _s, client) = serve(
        "capi-limit",
        "rules:
  - name: by-key
    by: user
    limits:
      - sliding_window_log: { limit: 2, window: 1h }
",
    );
    // `+`, `&` and `=` arrive as themselves: this is one key, not "a b".
    let key = "a+b&c=d é";
    assert_eq!(client.limit(key).await.unwrap().remaining, Some(1));
    assert_eq!(client.limit(key).await.unwrap().remaining, Some(0));
    let d = client.limit(key).await.unwrap();
    assert!(!d.allowed && d.retry_after > Duration::ZERO, "{d:?}");
    for other in ["a b", "a", "a+b"] {
        let d = client.limit(other).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, Some(1)), "{other}: {d:?}");
    }
    // A cost of 2 at once spends the whole limit of a fresh key.
    let d = client
        .limit_with(Some("fresh"), None, Some(2))
        .await
        .unwrap();
    assert_eq!((d.allowed, d.remaining), (true, Some(0)), "{d:?}");
}

#[tokio::test]
async fn charge_counts_past_the_limit_and_says_over() {
    let (_dir, _s, client) = serve(
        "capi-charge",
        "rules:
  - name: tokens
    by: user
    limits:
      - token_bucket: { capacity: 1000, refill: 1000/1h }
",
    );
    let probe = Check::new().user("u").cost(0);
    let spend = Check::new().user("u").cost(600);
    assert!(client.check(&probe).await.unwrap().allowed);
    let d = client.charge(&spend).await.unwrap();
    assert_eq!((d.allowed, d.over), (true, Some(false)), "{d:?}");
    assert!(client.check(&probe).await.unwrap().allowed);
    let d = client.charge(&spend).await.unwrap();
    assert_eq!((d.allowed, d.over), (false, Some(true)), "{d:?}");
    let d = client.check(&probe).await.unwrap();
    assert!(!d.allowed && d.retry_after > Duration::ZERO, "{d:?}");
    assert_eq!(d.over, None, "only charges say over");
}

#[tokio::test]
async fn bad_input_is_a_bad_request_with_the_problems_detail() {
    let (_dir, s, client) = serve("capi-bad", PER_USER);
    match client.check(&Check::new().api("no-slash")).await {
        Err(ApiError::BadRequest { status, detail }) => {
            assert_eq!(status, 400);
            assert!(detail.contains("no-slash"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    match client.check(&Check::new().user("u".repeat(2000))).await {
        Err(ApiError::BadRequest { status, detail }) => {
            assert_eq!(status, 400);
            assert!(detail.contains("user is 2000 characters long"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // A base URL with a wrong prefix: the server's 404 problem.
    let lost = DecisionClient::new(&s.url("/nope")).unwrap();
    match lost.check(&Check::new()).await {
        Err(e @ ApiError::BadRequest { .. }) => {
            assert!(e.to_string().contains("404"), "{e}");
            assert!(!e.is_transient());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    // Connections complete in the kernel's backlog but nothing reads them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let client = DecisionClient::new(&format!("http://{addr}"))
        .unwrap()
        .with_timeout(Duration::from_millis(300));
    let t = std::time::Instant::now();
    match client.check(&Check::new().user("u")).await {
        Err(e @ ApiError::Timeout(_)) => assert!(e.is_transient()),
        other => panic!("{other:?}"),
    }
    // A hang guard, not a measurement.
    assert!(t.elapsed() < Duration::from_secs(30));
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_connections_across_many_calls() {
    let (_dir, _s, client) = serve(
        "capi-reuse",
        "rules:
  - name: roomy
    by: user
    limits:
      - fixed_window: { limit: 100000, window: 1h }
",
    );
    for i in 0..50 {
        let d = client.limit("seq").await.unwrap();
        assert_eq!(d.remaining, Some(100_000 - 1 - i), "{d:?}");
    }
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..25 {
                    let d = client.check(&Check::new().user(format!("t{t}"))).await;
                    assert!(d.unwrap().allowed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let d = client.limit_with(Some("t3"), None, Some(0)).await.unwrap();
    assert_eq!(d.remaining, Some(100_000 - 25), "{d:?}");
}

#[tokio::test]
async fn a_dead_store_is_surfaced_as_store_error() {
    let port = spillway_testkit::free_port();
    let (_dir, _s, client) = serve(
        "capi-store",
        &format!(
            "store:
  redis:
    url: redis://127.0.0.1:{port}/0
    timeout: 50ms
on_store_error: allow
rules:
  - name: shared
    by: user
    limits:
      - fixed_window: {{ limit: 1, window: 1m }}
"
        ),
    );
    // Admitted by the failure policy, twice over a limit of 1.
    for _ in 0..2 {
        let d = client.check(&Check::new().user("u")).await.unwrap();
        assert!(d.allowed && d.store_error, "{d:?}");
    }
}
