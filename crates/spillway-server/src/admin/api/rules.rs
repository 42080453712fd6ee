//! Rules made over the admin API: `PUT`, `GET` and `DELETE`
//! `/admin/v1/rules/{name}`, and the paged list `GET /admin/v1/rules`
//! (see [`crate::admin::rules_api`] for where they live).

#[allow(clippy::wildcard_imports)]
use super::*;
use crate::admin::rules_api::{self, Entry, Refused, etag};
use spillway_redis::Precondition;

/// The most rules one page lists.
pub const MAX_PAGE: usize = 1000;

/// `prefix`, `after` and `limit` of a list.
#[derive(Deserialize)]
pub(crate) struct PageQuery {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<String>,
}

/// A page asked for: names starting with `prefix`, after `after`, at
/// most `limit`.
#[derive(Debug, Clone)]
pub(crate) struct Page {
    pub(crate) prefix: String,
    pub(crate) after: String,
    pub(crate) limit: usize,
}

impl PageQuery {
    /// The page asked for, `limit` `default` when not given.
    pub(crate) fn page(
        q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
        default: usize,
    ) -> Result<Page, Response> {
        let Ok(Query(mut q)) = q else {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                "query: prefix=TEXT&after=NAME&limit=N",
            ));
        };
        unset_blanks([&mut q.prefix, &mut q.after, &mut q.limit]);
        let limit = match q.limit.as_deref().map(count) {
            None => default,
            Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => n,
            Some(_) => {
                return Err(problem(
                    StatusCode::BAD_REQUEST,
                    format!("limit: from 1 to {MAX_PAGE}"),
                ));
            }
        };
        Ok(Page {
            prefix: q.prefix.unwrap_or_default(),
            after: q.after.unwrap_or_default(),
            limit,
        })
    }
}

/// The indexes of `set`'s rules on `page`, in name order, and whether
/// more follow. One pass over the rules, whatever their number.
fn page_of(set: &RuleSet, page: &Page) -> (Vec<usize>, bool) {
    let mut idx: Vec<usize> = set
        .rules()
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            let n = r.name();
            n.starts_with(page.prefix.as_str()) && n > page.after.as_str()
        })
        .map(|(i, _)| i)
        .collect();
    let by_name = |a: &usize, b: &usize| set.rules()[*a].name().cmp(set.rules()[*b].name());
    let more = idx.len() > page.limit;
    if more {
        idx.select_nth_unstable_by(page.limit, by_name);
        idx.truncate(page.limit);
    }
    idx.sort_unstable_by(by_name);
    (idx, more)
}

/// The name a path under `/admin/v1/rules/` names, percent-decoded.
fn rule_name(uri: &Uri) -> Result<String, Response> {
    let rest = uri.path().strip_prefix("/admin/v1/rules/").unwrap_or("");
    let name = decode(rest).ok_or_else(|| {
        problem(
            StatusCode::BAD_REQUEST,
            "the rule's name: bad percent-encoding or not UTF-8",
        )
    })?;
    if name.is_empty() {
        return Err(problem(StatusCode::BAD_REQUEST, "name a rule"));
    }
    Ok(name)
}

/// An API rule as the calls show it.
fn api_view(_: &AdminState, name: &str, e: &Entry) -> Value {
    let mut v = match &e.built {
        Ok(r) => crate::admin::rule_json(r),
        Err(_) => json!({ "name": name }),
    };
    v["source"] = json!("api");
    v["version"] = json!(e.version);
    v["etag"] = json!(e.etag());
    v["valid"] = json!(e.built.is_ok());
    v["error"] = json!(e.built.as_ref().err());
    v["rule"] = e.json.clone();
    v
}

/// A rule of the file as the calls show it.
fn file_view(r: &Rule) -> Value {
    let mut v = crate::admin::rule_json(r);
    v["source"] = json!("file");
    v
}

/// What `If-Match` or `If-None-Match` asks.
fn precondition(h: &HeaderMap, put: bool) -> Result<Precondition, Response> {
    let one = |name: header::HeaderName| -> Result<Option<String>, Response> {
        let mut all = h.get_all(&name).iter();
        let Some(v) = all.next() else {
            return Ok(None);
        };
        let text = v.to_str().ok().map(str::trim).filter(|t| !t.contains(','));
        match (text, all.next()) {
            (Some(t), None) => Ok(Some(t.to_string())),
            _ => Err(problem(
                StatusCode::BAD_REQUEST,
                format!("{name}: give one ETag, as a GET answered it, or *"),
            )),
        }
    };
    let m = one(header::IF_MATCH)?;
    let n = one(header::IF_NONE_MATCH)?;
    match (m, n) {
        (Some(_), Some(_)) => Err(problem(
            StatusCode::BAD_REQUEST,
            "give If-Match or If-None-Match, not both",
        )),
        (None, None) => Ok(Precondition::None),
        (Some(m), None) if m == "*" => Ok(Precondition::Exists),
        (Some(m), None) => {
            // Only ETags this API gives ("17") can match: a weak one or
            // another spelling never would, and is refused as unreadable.
            let inner = m.strip_prefix('"').and_then(|x| x.strip_suffix('"'));
            match inner {
                Some(i) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(Precondition::Version(i.parse().unwrap_or(u64::MAX)))
                }
                _ => Err(problem(
                    StatusCode::BAD_REQUEST,
                    "If-Match: the ETag a GET answered, in quotes (\"17\"), or *",
                )),
            }
        }
        (None, Some(n)) if n == "*" && put => Ok(Precondition::Absent),
        (None, Some(_)) => Err(problem(
            StatusCode::BAD_REQUEST,
            if put {
                "If-None-Match: only * (make the rule only if it does not exist)"
            } else {
                "If-None-Match: not taken by DELETE (use If-Match)"
            },
        )),
    }
}

fn refused(name: &str, r: Refused) -> Response {
    let with_etag = |mut resp: Response, v: u64| {
        if v > 0
            && let Ok(h) = axum::http::HeaderValue::from_str(&etag(v))
        {
            resp.headers_mut().insert(header::ETAG, h);
        }
        resp
    };
    match r {
        Refused::Invalid(m) => problem(StatusCode::BAD_REQUEST, format!("rule {name:?}: {m}")),
        Refused::FileRule => problem(
            StatusCode::CONFLICT,
            format!(
                "rule {name:?} is the rules file's: change it there (a rule made over the API takes a name the file does not use)"
            ),
        ),
        Refused::Mismatch(0) => problem(
            StatusCode::PRECONDITION_FAILED,
            format!("If-Match: there is no API rule {name:?} now"),
        ),
        Refused::Mismatch(v) => with_etag(
            problem(
                StatusCode::PRECONDITION_FAILED,
                format!(
                    "If-Match: rule {name:?} changed since: its ETag is {} now (GET it again)",
                    etag(v)
                ),
            ),
            v,
        ),
        Refused::Exists(v) => with_etag(
            problem(
                StatusCode::PRECONDITION_FAILED,
                format!("If-None-Match: *: rule {name:?} exists already"),
            ),
            v,
        ),
        Refused::NotFound => problem(StatusCode::NOT_FOUND, format!("no API rule named {name:?}")),
        Refused::Full => problem(
            StatusCode::CONFLICT,
            format!(
                "{} API rules are held already: delete some first",
                rules_api::MAX_RULES
            ),
        ),
        Refused::Store(e) => store_failed(e),
    }
}

impl AdminState {
    /// Records a write call about the rule `name` in the audit trail.
    fn record_rule(
        &self,
        who: &str,
        (method, uri): (&Method, &Uri),
        action: &str,
        name: &str,
        refusal: Option<&Response>,
        status: u16,
    ) {
        let refused = refusal.map(|r| {
            r.extensions().get::<Detail>().map_or_else(
                || format!("answered {status}"),
                |d| super::super::audit::refusal_reason(&d.0),
            )
        });
        self.audit_write(
            who,
            (method, uri),
            action,
            (Some(name.to_string()), None),
            None,
            status,
            refused,
        );
    }
}

fn with_etag(mut resp: Response, e: &Entry) -> Response {
    if let Ok(h) = axum::http::HeaderValue::from_str(&e.etag()) {
        resp.headers_mut().insert(header::ETAG, h);
    }
    resp
}

pub(super) async fn rule_get(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    uri: Uri,
) -> Response {
    let name = match rule_name(&uri) {
        Ok(n) => n,
        Err(r) => return r,
    };
    if let Some(r) = state
        .rules_api
        .file_rule(&state.shared.limiter.rules(), &name)
    {
        return axum::Json(file_view(r)).into_response();
    }
    match state.rules_api.get(&name) {
        Some(e) => with_etag(axum::Json(api_view(&state, &name, &e)).into_response(), &e),
        None => problem(StatusCode::NOT_FOUND, format!("no rule named {name:?}")),
    }
}

pub(super) async fn rule_put(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
    bytes: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let name = match rule_name(&uri) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let pre = match precondition(&headers, true) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let bytes = match read_body(bytes) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut json: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            );
        }
    };
    let Some(obj) = json.as_object_mut() else {
        return problem(
            StatusCode::BAD_REQUEST,
            "the body is a rule, a JSON object with a rules file's rule's fields: api, by, limits, mode, ...",
        );
    };
    match obj.get("name") {
        None => {
            obj.insert("name".into(), json!(name));
        }
        Some(Value::String(n)) if *n == name => {}
        Some(other) => {
            return problem(
                StatusCode::BAD_REQUEST,
                format!(
                    "name: the body names {other}, the path {name:?}: leave it out or give the same"
                ),
            );
        }
    }
    let redis = state.redis();
    let result = state
        .rules_api
        .put(
            redis,
            &state.assign,
            &state.shared.limiter.rules(),
            &name,
            json,
            pre,
        )
        .await;
    let result = result.map_err(|r| refused(&name, r));
    let status = match &result {
        Ok((_, true)) => StatusCode::CREATED,
        Ok((_, false)) => StatusCode::OK,
        Err(r) => r.status(),
    };
    state.record_rule(
        &who,
        (&method, &uri),
        "rule.put",
        &name,
        result.as_ref().err(),
        status.as_u16(),
    );
    match result {
        Ok((e, created)) => {
            // Composing copies every rule: off the async workers.
            let s = state.clone();
            let _ = tokio::task::spawn_blocking(move || rules_api::applied(&s)).await;
            let mut resp = (status, axum::Json(api_view(&state, &name, &e))).into_response();
            if created && let Ok(h) = axum::http::HeaderValue::from_str(uri.path()) {
                resp.headers_mut().insert(header::LOCATION, h);
            }
            with_etag(resp, &e)
        }
        Err(r) => r,
    }
}

pub(super) async fn rule_delete(
    State(state): State<Arc<AdminState>>,
    Authorized { who, .. }: Authorized<Write>,
    headers: HeaderMap,
    method: Method,
    uri: Uri,
) -> Response {
    let name = match rule_name(&uri) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let pre = match precondition(&headers, false) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let redis = state.redis();
    let result = state
        .rules_api
        .delete(
            redis,
            &state.assign,
            &state.shared.limiter.rules(),
            &name,
            pre,
        )
        .await;
    let result = result.map_err(|r| refused(&name, r));
    let status = match &result {
        Ok(_) => StatusCode::OK,
        Err(r) => r.status(),
    };
    state.record_rule(
        &who,
        (&method, &uri),
        "rule.delete",
        &name,
        result.as_ref().err(),
        status.as_u16(),
    );
    match result {
        Ok(version) => {
            // Composing copies every rule: off the async workers.
            let s = state.clone();
            let _ = tokio::task::spawn_blocking(move || rules_api::applied(&s)).await;
            axum::Json(json!({ "name": name, "deleted": true, "version": version })).into_response()
        }
        Err(r) => r,
    }
}

pub(super) async fn rules_list(
    State(state): State<Arc<AdminState>>,
    _: Authorized<Read>,
    q: Result<Query<PageQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let page = match PageQuery::page(q, 100) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let set = state.shared.limiter.rules();
    let file_count = state.rules_api.file_count();
    let (idx, _) = page_of(
        &set,
        &Page {
            limit: page.limit + 1,
            ..page.clone()
        },
    );
    let api = state
        .rules_api
        .page(&page.prefix, &page.after, page.limit + 1);
    // Both in name order: merged, a name in force shown once (a rule in
    // force past the file's is an API rule: they are composed after).
    let mut out: Vec<(String, Value)> = Vec::with_capacity(page.limit + 1);
    let (mut i, mut j) = (0, 0);
    while out.len() <= page.limit && (i < idx.len() || j < api.len()) {
        let a = idx.get(i).map(|k| &set.rules()[*k]);
        let b = api.get(j);
        let take_a = match (a, b) {
            (Some(a), Some((n, _))) => a.name() <= n.as_str(),
            (Some(_), None) => true,
            _ => false,
        };
        if take_a {
            let r = a.unwrap_or_else(|| unreachable!());
            let from_file = idx[i] < file_count;
            let view = match (from_file, state.rules_api.get(r.name())) {
                (false, Some(e)) => api_view(&state, r.name(), &e),
                _ => file_view(r),
            };
            if b.is_some_and(|(n, _)| n == r.name()) {
                j += 1;
            }
            out.push((r.name().to_string(), view));
            i += 1;
        } else {
            let (n, e) = b.unwrap_or_else(|| unreachable!());
            out.push((n.clone(), api_view(&state, n, e)));
            j += 1;
        }
    }
    let next = (out.len() > page.limit).then(|| {
        out.truncate(page.limit);
        out.last().map(|(n, _)| n.clone())
    });
    axum::Json(json!({
        "version": set.version,
        "api_version": state.rules_api.version(),
        "rules": out.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
        "next_after": next.flatten(),
    }))
    .into_response()
}
