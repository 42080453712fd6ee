//! An axum app rate limited by spillway: 5 requests per second per API key,
//! bursts of 10. Run it, then: `curl -i -H 'x-api-key: k1' localhost:3000/`.
use std::sync::Arc;

use axum::{Router, body::Body, routing::get};
use spillway_core::{Gcra, KeySpec, Limit, Mode, Nanos, Rate, Rule};
use spillway_store::{Limiter, MemoryStore, RuleSet, SystemClock};
use spillway_tower::{Identity, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gcra = Gcra::new(Rate::new(5, Nanos::from_secs(1))?, 10)?;
    let rule = Rule::new(
        "api",
        None,
        KeySpec::parse("user")?,
        vec![Limit::Gcra(gcra)],
        Mode::Hard,
    )?;
    let store = MemoryStore::new(SystemClock::new(), Default::default());
    let limiter = Arc::new(Limiter::new(store, RuleSet::new(vec![rule])));
    // Who is asking: the API key header (requests without one are not limited here).
    let layer = RateLimitLayer::new(limiter, |req: &http::Request<Body>| Identity {
        user: req
            .headers()
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        ..Identity::default()
    });
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
