//! The admin plane: `/metrics`, `/healthz`, `/readyz`, `/v1/status`,
//! `/v1/rules`, the operator's calls under `/admin/v1/` ([`api`]) and the
//! dashboard at `/admin/`. On the decision port unless `admin.listen`
//! (also spelled `admin_listen`) moves them to an address of their own.
//!
//! Once `admin.tokens` lists any token, everything but `/healthz`,
//! `/readyz` and the dashboard's page needs one; the `/admin/v1/` calls
//! and `PUT /v1/health` always do.

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

pub mod api;
pub mod assign;
pub mod audit;
pub mod rules_api;
pub mod series;
pub mod settings;
pub mod top;

/// The most rules `/v1/status` lists under `near_limit` (those that
/// admitted most).
pub const NEAR_LIMIT_RULES: usize = 100;

/// How often the health elastic rules read is brought up to date.
pub const HEALTH_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// What the admin endpoints read.
#[derive(Debug)]
pub struct AdminState {
    /// Rules, store and metrics.
    pub shared: Shared,
    /// Outcome of the last reload.
    pub reload: Arc<Mutex<ReloadStatus>>,
    /// Where rules come from, as shown on `/v1/status`.
    pub source_name: String,
    /// The listeners' certificates, as shown on `/v1/status` (the TLS
    /// layer's report, handed in: the admin plane knows no certificate).
    pub tls_status: StatusFn,
    /// `admin:` as last loaded (tokens are read again on reload).
    pub settings: arc_swap::ArcSwap<settings::AdminSettings>,
    /// `plans:` and the rules' plan settings, as last loaded.
    pub plans: arc_swap::ArcSwap<settings::PlanBook>,
    /// Overrides and plan assignments.
    pub assign: assign::Assignments,
    /// Rules made over the admin API.
    pub rules_api: rules_api::ApiRules,
    /// Each rule's heaviest keys.
    pub top: Arc<top::TopKeys>,
    /// Decisions over the last 15 minutes.
    pub series: series::Series,
    /// Every write call.
    pub audit: audit::Audit,
    /// What the service last said of its health (`PUT /v1/health`).
    pub health: Mutex<Option<api::Reported>>,
    /// `health:` as last loaded.
    pub health_settings: arc_swap::ArcSwap<crate::health::HealthSettings>,
    /// Reads an override's limits (the config layer's reader).
    pub parse_limits: assign::ParseLimits,
    /// Held while the per-key rules are compiled: the last table
    /// compiled, and the rule set version and plan book it was compiled
    /// under (a one-key change updates it while they stay).
    pub compiling: Mutex<Option<Compiled>>,
}

/// A section of `/v1/status` another part of the service reports.
pub struct StatusFn(pub Box<dyn Fn() -> serde_json::Value + Send + Sync>);

impl std::fmt::Debug for StatusFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatusFn")
    }
}

/// The per-key rules last compiled, kept to change one key of.
#[derive(Debug)]
pub struct Compiled {
    /// The rule set's version.
    version: u64,
    /// The plan book, by identity.
    book: Arc<settings::PlanBook>,
    /// The table, as published.
    rules: spillway_store::KeyRules,
}

impl AdminState {
    /// The Redis store overrides and plans are kept in, if any.
    pub fn redis(&self) -> Option<&spillway_redis::RedisStore> {
        self.shared.limiter.store().redis()
    }

    /// Compiles overrides and plans into the limiter's per-key rules.
    /// One at a time, each from the rules in force when it starts: the
    /// last to finish saw the newest state.
    pub fn recompile(&self) {
        let mut last = self.compiling.lock();
        let set = self.shared.limiter.rules();
        let book = self.plans.load_full();
        let kr = self
            .assign
            .compile(&set, &book, crate::unix_ms(), self.parse_limits);
        self.shared.limiter.set_key_rules(kr.clone());
        *last = Some(Compiled {
            version: set.version,
            book,
            rules: kr,
        });
    }

    /// After one key's override or plan changed: that key alone is
    /// compiled into the last table, which is published again (a clone
    /// that shares every other entry). Everything again when the rules
    /// or plans changed since.
    pub fn recompile_key(&self, rule: &str, key: &[String]) {
        let mut last = self.compiling.lock();
        let set = self.shared.limiter.rules();
        let book = self.plans.load_full();
        match last.as_mut() {
            Some(c) if c.version == set.version && Arc::ptr_eq(&c.book, &book) => {
                self.assign.compile_key(
                    &mut c.rules,
                    &set,
                    &book,
                    crate::unix_ms(),
                    self.parse_limits,
                    (rule, key),
                );
                self.shared.limiter.set_key_rules(c.rules.clone());
            }
            _ => {
                drop(last);
                self.recompile();
            }
        }
    }

    /// Health as seen now: the worse of the last report (read against
    /// `health:`, unknown if none came or it is stale) and what the proxy
    /// measures of its upstream (unknown without calls in its window).
    pub fn health_now(&self) -> spillway_core::Health {
        self.reported_health().worst(self.shared.measured.health())
    }

    /// Health as the last report says it (unknown once stale).
    pub fn reported_health(&self) -> spillway_core::Health {
        let Some(r) = *self.health.lock() else {
            return spillway_core::Health::Unknown;
        };
        let age = std::time::Duration::from_millis(crate::unix_ms().saturating_sub(r.at_unix_ms));
        self.health_settings.load().health(
            r.health.load,
            r.health.latency_ms,
            r.health.error_rate,
            age,
        )
    }

    /// Takes up a reloaded configuration (after its rules are in force).
    pub fn reloaded(
        &self,
        admin: &settings::AdminSettings,
        plans: &settings::PlanBook,
        health: &crate::health::HealthSettings,
    ) {
        self.health_settings.store(Arc::new(*health));
        self.settings.store(Arc::new(admin.clone()));
        self.plans.store(Arc::new(plans.clone()));
        self.top.set_show_keys(admin.show_keys);
        self.top.set_enabled(admin.top_keys);
        self.top.rules_changed(&self.shared.limiter.rules());
        self.audit.set_keep(admin.audit_entries);
        self.shared.events.set_near_limit(admin.near_limit);
        self.recompile();
    }

    /// Housekeeping once a second: the top keys' minute, expired
    /// overrides, and with Redis what other instances changed.
    pub async fn tick(&self) {
        self.top.tick();
        let redis = self.redis();
        // What other instances changed first, so what ends here is swept
        // from what Redis holds now.
        let mut changed = false;
        if let Some(r) = redis {
            match self.assign.refresh(r).await {
                Ok(c) => changed = c,
                Err(e) => tracing::debug!("admin state not read from redis: {e}"),
            }
        }
        let now = crate::unix_ms();
        let ended = self.assign.expire(now);
        if changed || !ended.is_empty() {
            self.recompile();
        }
        if let (Some(r), false) = (redis, ended.is_empty()) {
            self.assign.sweep(r, &ended, now).await;
        }
    }
}

/// The last reload's result.
#[derive(Debug, Clone, Default)]
pub struct ReloadStatus {
    /// The last rejected file's errors, cleared by a good reload.
    pub last_error: Option<String>,
    /// When rules were last (re)loaded.
    pub last_reload_unix_ms: u64,
    /// Sections the file in force changes that apply only at start
    /// (`config::SECTIONS`): they wait for a restart.
    pub restart_pending: Vec<&'static str>,
    /// The values the file in force took from the environment
    /// (`${NAME}`): `/v1/status` shows their references instead.
    pub secrets: spillway_rules::env::Secrets,
    /// A configuration in parts (`--config DIR`, `rules_dir:`): its files,
    /// and those whose text is not in force.
    pub rules_files: Option<FilesStatus>,
}

/// The files of a configuration in parts, as `/v1/status` shows them
/// (filled by `config::RuleFiles`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesStatus {
    /// Files read (a main file included).
    pub count: usize,
    /// The files whose text is not in force, in name order.
    pub bad: Vec<BadFile>,
    /// Why the directory was not read at the last reload (every file's
    /// version in force is kept).
    pub dir_problem: Option<String>,
}

/// A file whose text is not in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFile {
    /// Its path.
    pub file: String,
    /// Its errors, `file:line:column: message` each, one a line (the
    /// first ten, then how many more).
    pub error: String,
    /// Its last good version is in force (else it gives nothing).
    pub last_good_in_force: bool,
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

/// The layer of the decision routes an admin address serves (the
/// proxy's): with `admin.tokens`, they need one, as everything but health
/// does there; `/v1/charge`, which charges after the fact, a write one.
pub async fn decision_gate(
    State(state): State<Arc<AdminState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !state.settings.load().tokens.is_empty() {
        let need = if req.uri().path() == "/v1/charge" {
            settings::Scope::Write
        } else {
            settings::Scope::Read
        };
        if let Err(r) = api::authorize(&state, req.headers(), need) {
            return r;
        }
    }
    next.run(req).await
}

/// The admin endpoints.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/v1/rules", get(rules))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/admin/", get(dashboard))
        .route("/admin", get(to_dashboard))
        .merge(
            api::routes().route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                api::audit_refusals,
            )),
        )
        .with_state(state)
}

/// The dashboard: one page, everything in it (no asset from elsewhere).
const DASHBOARD: &str = include_str!("dashboard.html");

async fn dashboard() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        DASHBOARD,
    )
        .into_response()
}

async fn to_dashboard() -> Response {
    axum::response::Redirect::permanent("/admin/").into_response()
}

/// The rules in force in the order they are tried (the file's, then
/// those made over the API), paged: `prefix` keeps the names that start
/// with it, `after` starts past the rule of that name, `limit` (1000
/// unless asked) ends the page, and `next_after` names where the next
/// page starts.
async fn rules(
    State(state): State<Arc<AdminState>>,
    _: api::Authorized<api::ReadIfTokens>,
    q: Result<axum::extract::Query<api::PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let page = match api::PageQuery::page(q, 1000) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let set = state.shared.limiter.rules();
    let plans = state.plans.load();
    let start = if page.after.is_empty() {
        0
    } else {
        match set.rules().iter().position(|r| r.name() == page.after) {
            Some(i) => i + 1,
            None => {
                return api::problem(
                    axum::http::StatusCode::NOT_FOUND,
                    format!(
                        "after: no rule named {:?} now (the rules changed): start again without after",
                        page.after
                    ),
                );
            }
        }
    };
    let mut idx: Vec<usize> = (start..set.rules().len())
        .filter(|i| set.rules()[*i].name().starts_with(page.prefix.as_str()))
        .take(page.limit + 1)
        .collect();
    let more = idx.len() > page.limit;
    idx.truncate(page.limit);
    let list: Vec<serde_json::Value> = idx
        .iter()
        .map(|i| &set.rules()[*i])
        .map(|r| {
            let mut v = rule_json(r);
            v["plan"] = match plans.rules.get(r.name()).and_then(|p| p.default.as_ref()) {
                Some(d) => json!({ "default": d }),
                None => serde_json::Value::Null,
            };
            v
        })
        .collect();
    let next_after = more
        .then(|| idx.last().map(|i| set.rules()[*i].name()))
        .flatten();
    axum::Json(json!({
        "version": set.version,
        "rules": list,
        "total": set.rules().len(),
        "next_after": next_after,
    }))
    .into_response()
}

/// A rule as the API and `check-config` show it.
pub fn rule_json(r: &Rule) -> serde_json::Value {
    json!({
        "name": r.name(),
        "api": r.route().map(|x| x.as_str()),
        "by": r.by().to_string(),
        "mode": r.mode().to_string(),
        "limits": r.limits().iter().map(Limit::describe).collect::<Vec<_>>(),
    })
}

async fn status(
    State(state): State<Arc<AdminState>>,
    _: api::Authorized<api::ReadIfTokens>,
) -> Response {
    let set = state.shared.limiter.rules();
    let reload = state.reload.lock().clone();
    let store = state.shared.limiter.store();
    let degraded = store.degraded();
    let in_force: std::collections::HashSet<&str> = set.rules().iter().map(Rule::name).collect();
    // Admitted: allowed, shadow denied (admitted) and soft exceeded. Only
    // rules that admitted any, the NEAR_LIMIT_RULES that admitted most:
    // with many rules, a status of every one would say nothing.
    let mut totals: Vec<(String, [u64; 5])> = state
        .shared
        .events
        .rule_totals()
        .into_iter()
        .filter(|(n, t)| in_force.contains(n.as_str()) && t[0] + t[2] + t[3] > 0)
        .collect();
    let admitted = |t: &[u64; 5]| t[0] + t[2] + t[3];
    let near_total = totals.len();
    if totals.len() > NEAR_LIMIT_RULES {
        totals.select_nth_unstable_by(NEAR_LIMIT_RULES, |a, b| admitted(&b.1).cmp(&admitted(&a.1)));
        totals.truncate(NEAR_LIMIT_RULES);
    }
    let near: serde_json::Map<String, serde_json::Value> = totals
        .into_iter()
        // A rule's name may come from `${NAME}`.
        .map(|(n, t)| {
            (
                reload.secrets.redact(&n).into_owned(),
                json!({ "admitted": t[0] + t[2] + t[3], "near_limit": t[4] }),
            )
        })
        .collect();
    let (held, unreadable, shadowed) = state.rules_api.counts();
    let api_rules = json!({
        "held": held,
        "unreadable": unreadable,
        "shadowed": shadowed,
        "version": state.rules_api.version(),
        "read_from_store": store.redis().is_none() || state.rules_api.pulled(),
    });
    let mut body = json!({
        "store": {
            "kind": store.kind(),
            "describe": store.describe(),
            "healthy": degraded.is_none(),
            "degraded": degraded,
            "breaker": store.redis().map(|r| breaker_name(r.breaker())),
        },
        "near_limit": {
            "ratio": state.shared.events.near_limit_ratio(),
            "rules": near,
            "rules_admitting": near_total,
        },
        "health": api::seen_json(&state),
        "overrides": state.assign.overrides(crate::unix_ms()).len(),
        "plan_assignments": state.assign.plans().len(),
        "api_rules": api_rules,
        "version": set.version,
        "rules": set.rules().len(),
        "source": state.source_name,
        "last_reload_error": reload.last_error,
        "last_reload_unix_ms": reload.last_reload_unix_ms,
        "restart_pending": reload.restart_pending,
        "rules_files": reload.rules_files.as_ref().map(files_json),
        "keys": spillway_store::Store::keys(state.shared.limiter.store()),
        "sync": state.shared.limiter.store().sync_status().map(|st| sync_json(&st)),
        "tls": (state.tls_status.0)(),
    });
    // Open without tokens: no value from `${NAME}` in any string of it
    // (a store's address, a reload error, a certificate's path).
    redact_json(&reload.secrets, &mut body);
    axum::Json(body).into_response()
}

/// The bad files listed in `/v1/status`; `bad_count` counts them all.
pub const STATUS_BAD_FILES: usize = 100;

/// A configuration in parts, as `/v1/status` shows it.
fn files_json(st: &FilesStatus) -> serde_json::Value {
    json!({
        "count": st.count,
        "bad_count": st.bad.len(),
        "bad": st.bad.iter().take(STATUS_BAD_FILES).map(|b| json!({
            "file": b.file,
            "error": b.error,
            "last_good_in_force": b.last_good_in_force,
        })).collect::<Vec<_>>(),
        "directory_error": st.dir_problem,
    })
}

/// `value` with every `${NAME}` value (and every part of one) replaced by
/// its reference, in every string; object keys, the API's own names, are
/// left alone.
pub fn redact_json(secrets: &spillway_rules::env::Secrets, value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(new) = secrets.redact(s) {
                *s = new;
            }
        }
        Value::Array(list) => list.iter_mut().for_each(|v| redact_json(secrets, v)),
        Value::Object(map) => map.values_mut().for_each(|v| redact_json(secrets, v)),
        _ => {}
    }
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

/// Health as seen, as Prometheus text: whether it is known, and the
/// load when it is.
fn health_metrics(h: spillway_core::Health) -> String {
    let mut out = String::from(
        "# HELP spillway_health_known Whether the service's health is known (a fresh report, or the proxy's calls to its upstream in the window).\n# TYPE spillway_health_known gauge\n",
    );
    match h {
        spillway_core::Health::Unknown => out.push_str("spillway_health_known 0\n"),
        spillway_core::Health::Load(l) => {
            out.push_str("spillway_health_known 1\n");
            out.push_str(&format!(
                "# HELP spillway_health_load The service's load as seen (0 idle, 1 at capacity).\n# TYPE spillway_health_load gauge\nspillway_health_load {l}\n"
            ));
        }
    }
    out
}

/// A breaker state as the API spells it.
fn breaker_name(b: spillway_redis::BreakerState) -> &'static str {
    match b {
        spillway_redis::BreakerState::Closed => "closed",
        spillway_redis::BreakerState::Open => "open",
        spillway_redis::BreakerState::HalfOpen => "half_open",
    }
}

async fn metrics(
    State(state): State<Arc<AdminState>>,
    _: api::Authorized<api::ReadIfTokens>,
) -> Response {
    let keys = spillway_store::Store::keys(state.shared.limiter.store());
    let mut text = state.shared.events.render(keys);
    text.push_str(&health_metrics(state.health_now()));
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
    let store = state.shared.limiter.store();
    // With Redis, the rules made over the API are read from it once
    // after start (within POLL_EVERY of its answering): until then only
    // the file's are in force.
    let unread = (store.redis().is_some() && !state.rules_api.pulled())
        .then_some("the rules made over the admin API are not read from redis yet");
    match store.degraded().or(unread.map(String::from)) {
        None => axum::Json(json!({"status": "ready", "rules_version": set.version})),
        Some(why) => {
            axum::Json(json!({"status": "degraded", "reason": why, "rules_version": set.version}))
        }
    }
    .into_response()
}
