//! The admin API: `/metrics`, `/healthz`, `/readyz`, `/v1/status` and
//! `/v1/rules`. On the decision port unless `admin_listen` moves them to
//! an address of their own.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::json;
use spillway_core::{Limit, Rule};

use crate::Shared;

/// What the admin endpoints read.
#[derive(Debug)]
pub struct AdminState {
    /// Rules, store and metrics.
    pub shared: Shared,
    /// Outcome of the last reload.
    pub reload: Arc<Mutex<ReloadStatus>>,
    /// Where rules come from, as shown on `/v1/status`.
    pub source_name: String,
}

/// The last reload's result.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// The last rejected file's errors, cleared by a good reload.
    pub last_error: Option<String>,
    /// When rules were last (re)loaded.
    pub last_reload_unix_ms: u64,
}

/// Health alone (`/healthz`, `/readyz`), for the decision port when the
/// rest of the admin API has an address of its own: load balancers probe
/// the port they send traffic to.
pub fn health_router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The admin endpoints.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/v1/rules", get(rules))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn rules(State(state): State<Arc<AdminState>>) -> Response {
    let set = state.shared.limiter.rules();
    let list: Vec<serde_json::Value> = set.rules().iter().map(rule_json).collect();
    axum::Json(json!({ "version": set.version, "rules": list })).into_response()
}

/// A rule as the API and `check-config` show it.
pub fn rule_json(r: &Rule) -> serde_json::Value {
    json!({
        "name": r.name(),
        "api": r.route().map(|x| x.as_str()),
        "by": r.by().to_string(),
        "mode": r.mode().to_string(),
        "limits": r.limits().iter().map(describe_limit).collect::<Vec<_>>(),
    })
}

/// One limit in words, e.g. `sliding_window_log: 5 per 60s`.
pub fn describe_limit(l: &Limit) -> String {
    let secs = |n: spillway_core::Nanos| {
        let ms = n.as_millis_ceil();
        if ms.is_multiple_of(1000) {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        }
    };
    match l {
        Limit::TokenBucket(a) => format!(
            "token_bucket: capacity {}, refill {} per {}",
            a.capacity(),
            a.refill().count(),
            secs(a.refill().per())
        ),
        Limit::LeakyBucket(a) => format!(
            "leaky_bucket: capacity {}, leak {} per {}",
            a.capacity(),
            a.leak().count(),
            secs(a.leak().per())
        ),
        Limit::Shaper(a) => format!(
            "leaky_bucket (queue): capacity {}, leak {} per {}, max wait {}",
            a.capacity(),
            a.leak().count(),
            secs(a.leak().per()),
            secs(a.max_wait())
        ),
        Limit::FixedWindow(a) => {
            format!("fixed_window: {} per {}", a.limit(), secs(a.window()))
        }
        Limit::SlidingLog(a) => {
            format!("sliding_window_log: {} per {}", a.limit(), secs(a.window()))
        }
        Limit::SlidingCounter(a) => format!(
            "sliding_window_counter: {} per {}",
            a.limit(),
            secs(a.window())
        ),
        Limit::Gcra(a) => format!(
            "gcra: {} per {}, burst {}",
            a.rate().count(),
            secs(a.rate().per()),
            a.burst()
        ),
    }
}

async fn status(State(state): State<Arc<AdminState>>) -> Response {
    let set = state.shared.limiter.rules();
    let reload = state.reload.lock().clone();
    axum::Json(json!({
        "version": set.version,
        "rules": set.rules().len(),
        "source": state.source_name,
        "last_reload_error": reload.last_error,
        "last_reload_unix_ms": reload.last_reload_unix_ms,
        "keys": spillway_store::Store::keys(state.shared.limiter.store()),
        "sync": state.shared.limiter.store().sync_status().map(|st| sync_json(&st)),
    }))
    .into_response()
}

/// The sync's state as the status endpoint shows it.
fn sync_json(st: &spillway_sync::SyncStatus) -> serde_json::Value {
    json!({
        "mode": st.mode,
        "instance": st.instance,
        "region": st.region,
        "live_instances": st.live,
        "sharing": st.sharing,
        "share_decisions": st.share_decisions,
        "keys": st.keys,
        "untracked_keys": st.untracked,
        "clock_step_us": st.clock_step_us,
        "stores": st.links.iter().map(|l| json!({
            "region": l.region,
            "home": l.home,
            "last_success_unix_ms": l.last_ok_unix_ms,
            "lag_ms": l.lag_ms,
            "round_trip_us": l.rtt_us,
            "failures_in_a_row": l.failures,
            "deltas_waiting": l.deltas_waiting,
            "keys_synced": l.keys_synced,
        })).collect::<Vec<_>>(),
    })
}

async fn metrics(State(state): State<Arc<AdminState>>) -> Response {
    let keys = spillway_store::Store::keys(state.shared.limiter.store());
    let mut text = state.shared.events.render(keys);
    text.push_str(&state.shared.limiter.store().metrics());
    let mut resp = text.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

/// Ready while rules are loaded. A store that is down does not make the
/// service unready: it keeps answering by each rule's failure policy, and
/// says "degraded" (taking every instance out of a load balancer at once
/// would turn a Redis outage into an API outage).
async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    let set = state.shared.limiter.rules();
    match state.shared.limiter.store().degraded() {
        None => axum::Json(json!({"status": "ready", "rules_version": set.version})),
        Some(why) => {
            axum::Json(json!({"status": "degraded", "reason": why, "rules_version": set.version}))
        }
    }
    .into_response()
}
