//! Shutdown as an orchestrator sees it: from the signal on, health probes
//! answer unready while the listeners serve on for the shutdown delay,
//! then drain (`run` wraps its shutdown future in [`stopping`] and layers
//! [`unready_when_stopping`] over its routers).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The flag set once `shutdown` completes, and `shutdown` setting it,
/// then waiting `delay`: from the signal on, the listeners answer health
/// probes as unready while they go on serving (requests arriving or half
/// received meanwhile are answered); after `delay` they stop accepting
/// and drain.
pub(crate) fn stopping(
    shutdown: impl Future<Output = ()> + Send + 'static,
    delay: Duration,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    impl Future<Output = ()> + Send + 'static,
) {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let set = flag.clone();
    let shutdown = async move {
        shutdown.await;
        set.store(true, std::sync::atomic::Ordering::SeqCst);
        if !delay.is_zero() {
            tracing::info!("unready; serving {delay:?} more (--shutdown-delay), then draining");
            tokio::time::sleep(delay).await;
        }
    };
    (flag, shutdown)
}

/// Once shutdown has begun, `/readyz` answers 503 and envoyproxy/ratelimit's
/// `/healthcheck` 500 at once, so an orchestrator takes the instance out of
/// its endpoints while in-flight requests finish. `/healthz` (liveness)
/// stays 200: a draining instance is not a dead one.
pub(crate) async fn unready_when_stopping(
    axum::extract::State(stopping): axum::extract::State<Arc<std::sync::atomic::AtomicBool>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    if !stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return next.run(req).await;
    }
    match req.uri().path() {
        "/readyz" => (
            http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({"status": "stopping"})),
        )
            .into_response(),
        "/healthcheck" => http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        _ => next.run(req).await,
    }
}
