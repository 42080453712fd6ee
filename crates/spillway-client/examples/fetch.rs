//! `cargo run -p spillway-client --example fetch -- URL N [--header 'Name: value']...`
//!
//! Sends N GET requests to URL one after another through the
//! [`HonourLayer`](spillway_client::honour::HonourLayer), printing
//! `STATUS ELAPSED_MS` per request and, last, `sent S, 429 T`: S requests
//! that reached the network, T answers that were 429. A server that limits
//! the caller and says so in its headers sees at most one 429: after it,
//! the layer waits as the headers advise.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use spillway_client::honour::{Config, HonourLayer};
use tower::{Service, ServiceBuilder, ServiceExt};

const USAGE: &str = "usage: fetch URL N [--header 'Name: value']...";

/// What the command line asks: the URL, how many requests, extra headers.
type Args = (http::Uri, u64, Vec<(HeaderName, HeaderValue)>);

fn parse(args: &[String]) -> Result<Args, String> {
    let mut it = args.iter();
    let url: http::Uri = it
        .next()
        .ok_or(USAGE)?
        .parse()
        .map_err(|e| format!("URL: {e}"))?;
    if url.scheme_str() != Some("http") {
        return Err("URL: only http:// URLs".into());
    }
    let n: u64 = it
        .next()
        .ok_or(USAGE)?
        .parse()
        .map_err(|_| format!("N: a whole number\n{USAGE}"))?;
    let mut headers = Vec::new();
    while let Some(a) = it.next() {
        if a != "--header" {
            return Err(format!("unexpected {a:?}\n{USAGE}"));
        }
        let h = it.next().ok_or("--header needs 'Name: value'")?;
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| format!("--header {h:?}: expected 'Name: value'"))?;
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|e| format!("--header {h:?}: {e}"))?;
        let value =
            HeaderValue::from_str(value.trim()).map_err(|e| format!("--header {h:?}: {e}"))?;
        headers.push((name, value));
    }
    Ok((url, n, headers))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, n, headers) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let sent = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    // Count what reaches the network, under the layer.
    let counted = {
        let sent = sent.clone();
        let refused = refused.clone();
        tower::service_fn(move |req: Request<Empty<Bytes>>| {
            let client = client.clone();
            let sent = sent.clone();
            let refused = refused.clone();
            async move {
                sent.fetch_add(1, Ordering::Relaxed);
                let resp: Response<_> = client.request(req).await?;
                if resp.status() == StatusCode::TOO_MANY_REQUESTS {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, hyper_util::client::legacy::Error>(resp)
            }
        })
    };
    let mut svc = ServiceBuilder::new()
        // Wait as long as the headers advise (they are capped at a day),
        // and retry a refused request until it goes through.
        .layer(HonourLayer::new(Config {
            budget: spillway_client::headers::MAX_DELAY + std::time::Duration::from_secs(60),
            max_retries: 10,
            ..Config::default()
        }))
        .service(counted);
    for _ in 0..n {
        let mut req = Request::get(url.clone())
            .body(Empty::<Bytes>::new())
            .unwrap_or_default();
        for (k, v) in &headers {
            req.headers_mut().append(k.clone(), v.clone());
        }
        let started = Instant::now();
        let result = match svc.ready().await {
            Ok(s) => s.call(req).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(resp) => {
                let status = resp.status().as_u16();
                // Read the body so the connection is reused.
                let _ = resp.into_body().collect().await;
                println!("{status} {}", started.elapsed().as_millis());
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "sent {}, 429 {}",
        sent.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed)
    );
    ExitCode::SUCCESS
}
