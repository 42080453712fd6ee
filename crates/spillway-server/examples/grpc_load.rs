//! A gRPC load client for the Envoy rate limit API: `CONCURRENCY` tasks over
//! `CHANNELS` HTTP/2 connections call `ShouldRateLimit` with one descriptor
//! `remote_address=<random of 100,000>` in domain `bench` for `SECONDS`.
//! Prints calls/s and p50/p99 latency.
//!
//! Usage: `grpc_load ADDR [SECONDS] [CONCURRENCY] [CHANNELS]`

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
        .expect("usage: grpc_load ADDR [SECONDS] [CONCURRENCY] [CHANNELS]");
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let conc: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let chans: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
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
                let req = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "remote_address".into(),
                            value: format!(
                                "10.{}.{}.{}",
                                (x % 100_000) / 65536,
                                (x >> 8) % 256,
                                x % 256
                            ),
                        }],
                        limit: None,
                        hits_addend: None,
                    }],
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
    println!(
        "grpc calls_per_s={:.0} p50={:?} p99={:?} concurrency={conc} channels={chans}",
        all.len() as f64 / elapsed,
        pct(0.5),
        pct(0.99)
    );
}
