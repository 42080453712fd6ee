//! spillway-client's outbound limiter shared by several instances: four
//! clients, each with its own limiter, calling one counting server. The
//! limit never refills during the test (20 an hour, an exact sliding log),
//! so the count the server sees is exact whatever the machine's speed.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use spillway_client::outbound::{Decider, OutboundConfig, OutboundError, OutboundLayer};
use spillway_core::{KeySpec, Limit, Mode, Nanos, Rule, SlidingLog};
use spillway_redis::{RedisConfig, RedisStore};
use spillway_store::{Limiter, RuleSet};
use spillway_testkit::RedisServer;
use spillway_testkit::upstream::HttpUpstream;
use tower::{Service, ServiceExt};

use crate::util::{Server, TempDir};

/// The third party's published limit: 20 calls an hour per server.
const LIMIT: u64 = 20;
const INSTANCES: usize = 4;
const EACH: usize = 15;

fn rule() -> Rule {
    Rule::new(
        "third-party",
        None,
        KeySpec::parse("host").unwrap(),
        vec![Limit::SlidingLog(
            SlidingLog::new(LIMIT, Nanos::from_secs(3600)).unwrap(),
        )],
        Mode::Hard,
    )
    .unwrap()
}

/// Runs `INSTANCES` clients, each through its own decider, `EACH` calls
/// each, all at once; returns (sent, refused locally).
async fn run(upstream: &HttpUpstream, deciders: Vec<Arc<dyn Decider>>) -> (usize, usize) {
    let mut tasks = Vec::new();
    for decider in deciders {
        let url = format!("{}/v1/x", upstream.url());
        tasks.push(tokio::spawn(async move {
            let client: Client<_, String> = Client::builder(TokioExecutor::new()).build_http();
            let layer = OutboundLayer::new(
                decider,
                OutboundConfig {
                    max_wait: Duration::ZERO,
                    on_error_send: false,
                },
            );
            let mut svc = tower::Layer::layer(&layer, client);
            let (mut sent, mut refused) = (0, 0);
            for _ in 0..EACH {
                let req = http::Request::get(url.as_str())
                    .body(String::new())
                    .unwrap();
                match svc.ready().await.unwrap().call(req).await {
                    Ok(resp) => {
                        assert_eq!(resp.status(), 200);
                        sent += 1;
                    }
                    Err(OutboundError::Limited { .. }) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
            (sent, refused)
        }));
    }
    let mut total = (0, 0);
    for t in tasks {
        let (s, r) = t.await.unwrap();
        total.0 += s;
        total.1 += r;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_sharing_a_limit_through_redis_never_exceed_it() {
    let redis = RedisServer::start();
    let upstream = HttpUpstream::start().await;
    let mut deciders: Vec<Arc<dyn Decider>> = Vec::new();
    for _ in 0..INSTANCES {
        let store = RedisStore::new(RedisConfig {
            url: redis.url(),
            ..RedisConfig::default()
        })
        .unwrap();
        assert!(
            store.wait_connected(Duration::from_secs(10)).await,
            "could not connect to {}",
            redis.url()
        );
        deciders.push(Arc::new(Limiter::new(store, RuleSet::new(vec![rule()]))));
    }
    let (sent, refused) = run(&upstream, deciders).await;
    assert_eq!(upstream.count("/v1/x"), LIMIT as usize);
    assert_eq!(
        (sent, refused),
        (LIMIT as usize, INSTANCES * EACH - LIMIT as usize)
    );
}

/// The same four clients each with a limiter of its own in memory: each
/// enforces the whole limit alone, so together they send four times it.
/// (Why sharing needs Redis or a server, and a check that the counting
/// server counts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_with_their_own_memory_each_spend_the_whole_limit() {
    let upstream = HttpUpstream::start().await;
    let deciders: Vec<Arc<dyn Decider>> = (0..INSTANCES)
        .map(|_| {
            Arc::new(Limiter::new(
                spillway_store::MemoryStore::new(
                    spillway_store::SystemClock::new(),
                    Default::default(),
                ),
                RuleSet::new(vec![rule()]),
            )) as Arc<dyn Decider>
        })
        .collect();
    let (sent, _) = run(&upstream, deciders).await;
    assert_eq!(sent, INSTANCES * EACH.min(LIMIT as usize));
    assert_eq!(upstream.count("/v1/x"), sent);
}

/// Through a spillway server: its rules file says the limit (keyed by
/// the descriptor `host`), and four clients each ask it with a decision
/// client of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_sharing_a_limit_through_a_spillway_server_never_exceed_it() {
    let dir = TempDir::new("client-outbound");
    let rules = dir.write(
        "rules.yaml",
        &format!(
            "descriptors: [host]\nrules:\n  - name: third-party\n    by: host\n    limits:\n      - sliding_window_log: {{ limit: {LIMIT}, window: 1h }}\n"
        ),
    );
    let server = Server::start(&["--config", rules.to_str().unwrap()]);
    let upstream = HttpUpstream::start().await;
    let deciders: Vec<Arc<dyn Decider>> = (0..INSTANCES)
        .map(|_| {
            Arc::new(
                spillway_client::api::DecisionClient::new(&server.url(""))
                    .unwrap()
                    .with_timeout(Duration::from_secs(30)),
            ) as Arc<dyn Decider>
        })
        .collect();
    let (sent, refused) = run(&upstream, deciders).await;
    assert_eq!(upstream.count("/v1/x"), LIMIT as usize);
    assert_eq!(
        (sent, refused),
        (LIMIT as usize, INSTANCES * EACH - LIMIT as usize)
    );
}
