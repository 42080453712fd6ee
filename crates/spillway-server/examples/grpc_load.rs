//! A gRPC load client for the Envoy rate limit API: `CONCURRENCY` tasks over
//! `CHANNELS` HTTP/2 connections call `ShouldRateLimit` in domain `bench`
//! for `SECONDS`, with one descriptor `remote_address=<random of 100,000>`,
//! or with `DESCRIPTORS` 4 also `user=<random of 100,000>`,
//! `tenant=<of 1,000>` and `path=<of 100>`. Prints calls/s (and
//! descriptors decided per second) and p50/p99 latency.
//!
//! Usage: `grpc_load ADDR [SECONDS] [CONCURRENCY] [CHANNELS] [DESCRIPTORS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use spillway_server::grpc::proto::{
    Entry, RateLimitDescriptor, RateLimitRequest, SHOULD_RATE_LIMIT,
};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .expect("usage: grpc_load ADDR [SECONDS] [CONCURRENCY] [CHANNELS] [DESCRIPTORS]");
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let conc: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let chans: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let per_call: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    assert!(per_call == 1 || per_call == 4, "DESCRIPTORS: 1 or 4");
    let mut channels = Vec::new();
    for _ in 0..chans {
        channels.push(
            tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("address")
                .connect()
                .await
                .expect("connect"),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..conc {
        let ch = channels[t % chans].clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut grpc = tonic::client::Grpc::new(ch);
            let mut lat = Vec::with_capacity(100_000);
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let one = |key: &str, value: String| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.into(),
                        value,
                    }],
                    limit: None,
                    hits_addend: None,
                };
                let n = x % 100_000;
                let mut descriptors = vec![one(
                    "remote_address",
                    format!("10.{}.{}.{}", n / 65536, (n >> 8) % 256, n % 256),
                )];
                if per_call == 4 {
                    let m = (x >> 20) % 100_000;
                    descriptors.push(one("user", format!("u{m}")));
                    descriptors.push(one("tenant", format!("t{}", m % 1000)));
                    descriptors.push(one("path", format!("/p{}", n % 100)));
                }
                let req = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors,
                    hits_addend: 1,
                };
                let t0 = Instant::now();
                grpc.ready().await.expect("ready");
                let path = http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT);
                let r: Result<tonic::Response<spillway_server::grpc::proto::RateLimitResponse>, _> =
                    grpc.unary(
                        tonic::Request::new(req),
                        path,
                        tonic_prost::ProstCodec::default(),
                    )
                    .await;
                lat.push(t0.elapsed());
                r.expect("call");
            }
            lat
        }));
    }
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    let rate = all.len() as f64 / elapsed;
    println!(
        "grpc calls_per_s={rate:.0} descriptors_per_s={:.0} p50={:?} p99={:?} concurrency={conc} channels={chans} descriptors={per_call}",
        rate * per_call as f64,
        pct(0.5),
        pct(0.99)
    );
}
