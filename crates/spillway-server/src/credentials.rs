//! Bearer tokens, checked the same way on every listener that asks for
//! them: the admin plane (`admin.tokens`), and the decision API
//! (`api.tokens`) on its listener and its direct path. One check, so a
//! way in added later inherits it instead of writing its own.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Look: GET calls, metrics, status, rules.
    Read,
    /// Look and change: every call.
    Write,
}

impl Scope {
    /// `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

/// One bearer token of `admin.tokens`, read from its file or environment
/// variable when the configuration loads (a reload reads it again).
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The name audit entries and logs give its holder.
    pub name: String,
    /// What it allows.
    pub scope: Scope,
    /// Where it came from, for `check-config` (`file /x` or `env X`).
    pub source: String,
    secret: Vec<u8>,
}

impl Token {
    /// A token named `name` whose value is `secret`.
    pub fn new(name: String, scope: Scope, source: String, secret: &str) -> Token {
        Token {
            name,
            scope,
            source,
            secret: secret.as_bytes().to_vec(),
        }
    }

    /// Whether two tokens have the same value.
    pub fn same_secret(&self, other: &Token) -> bool {
        self.matches(&other.secret)
    }

    /// Whether `given` is this token, compared in time independent of
    /// where the two first differ and of the guess's length.
    pub fn matches(&self, given: &[u8]) -> bool {
        // As long as the token whatever was given: the time says nothing
        // of the guess, not even whether its length is right.
        let mut diff = u8::from(given.len() != self.secret.len());
        for (i, b) in self.secret.iter().enumerate() {
            diff |= given.get(i).copied().unwrap_or(0) ^ b;
        }
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// The token `given` is among `tokens`, if any. Every token is compared,
/// so the time says nothing of which matched.
pub fn find<'t>(tokens: &'t [Token], given: &[u8]) -> Option<&'t Token> {
    let mut found = None;
    for t in tokens {
        if t.matches(given) && found.is_none() {
            found = Some(t);
        }
    }
    found
}

/// The token of an `Authorization: Bearer TOKEN` header value (the scheme
/// in any case, spaces around the token trimmed).
pub fn bearer(authorization: Option<&[u8]>) -> Option<&[u8]> {
    authorization
        .and_then(|v| {
            let (scheme, rest) = v.split_at(v.len().min(7));
            scheme.eq_ignore_ascii_case(b"bearer ").then_some(rest)
        })
        .map(<[u8]>::trim_ascii)
}

/// Why a request is refused: 401 (no token, or an unknown one: with
/// `WWW-Authenticate`) or 403 (a token whose scope is too narrow).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 401 or 403.
    pub status: http::StatusCode,
    /// What to do about it; never a token's value.
    pub detail: String,
    /// The `WWW-Authenticate` value of a 401.
    pub challenge: Option<&'static str>,
}

/// The token `authorization` carries, if it is one of `tokens` and its
/// scope reaches `need`; `realm` names the challenge of a 401 and `what`
/// the call in a 403.
///
/// # Errors
/// A [`Refusal`]: no token (401), an unknown one (401), a read token
/// where `need` is write (403).
pub fn check<'t>(
    tokens: &'t [Token],
    authorization: Option<&[u8]>,
    need: Scope,
    realm: &'static str,
) -> Result<&'t Token, Refusal> {
    let unauthorized = |detail: &str| Refusal {
        status: http::StatusCode::UNAUTHORIZED,
        detail: detail.to_string(),
        challenge: Some(realm),
    };
    let Some(given) = bearer(authorization) else {
        return Err(unauthorized("send Authorization: Bearer TOKEN"));
    };
    let Some(token) = find(tokens, given) else {
        return Err(unauthorized("unknown token"));
    };
    if token.scope < need {
        return Err(Refusal {
            status: http::StatusCode::FORBIDDEN,
            detail: format!(
                "token {:?} may only read; this call needs a write token",
                token.name
            ),
            challenge: None,
        });
    }
    Ok(token)
}

/// The `WWW-Authenticate` challenge of the admin plane.
pub const ADMIN_REALM: &str = "Bearer realm=\"spillway admin\"";
/// The `WWW-Authenticate` challenge of the decision API.
pub const API_REALM: &str = "Bearer realm=\"spillway api\"";

/// `api:`: the decision API's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiSettings {
    /// `api.tokens`, in the form of `admin.tokens`; none: the decision
    /// API is open.
    pub tokens: Vec<Token>,
}

/// `api.tokens`, as last loaded (a reload reads them again): with none,
/// the decision API is open, as it always was; with some, every decision
/// route on the decision listener needs one (`/v1/charge` a write token).
#[derive(Debug, Clone, Default)]
pub struct ApiTokens {
    /// Whether any token is set: the hot path's one read while none is.
    any: Arc<std::sync::atomic::AtomicBool>,
    tokens: Arc<ArcSwap<Vec<Token>>>,
}

impl ApiTokens {
    /// The tokens in force from now on.
    pub fn set(&self, tokens: Vec<Token>) {
        let any = !tokens.is_empty();
        self.tokens.store(Arc::new(tokens));
        self.any.store(any, std::sync::atomic::Ordering::Release);
    }

    /// Whether the decision API needs a token (one atomic load).
    pub fn any(&self) -> bool {
        self.any.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a decision call with this `Authorization` value may go on;
    /// `charge`: it charges a cost after the fact (`/v1/charge`), which
    /// needs a write token.
    ///
    /// # Errors
    /// As [`check`].
    pub fn admit(&self, authorization: Option<&[u8]>, charge: bool) -> Result<(), Refusal> {
        if !self.any() {
            return Ok(());
        }
        let tokens = self.tokens.load();
        if tokens.is_empty() {
            return Ok(());
        }
        let need = if charge { Scope::Write } else { Scope::Read };
        check(&tokens, authorization, need, API_REALM).map(|_| ())
    }
}

/// The one writer of a credential refusal: `r` as every way in answers
/// it, whatever its transport. `r.status`, `Content-Type:
/// application/problem+json`, an RFC 9457 problem body whose `detail` is
/// `r.detail`, and on a 401 its `WWW-Authenticate` challenge. The direct
/// HTTP/1.1 paths put this answer on the wire with
/// [`Refusal::write_http1`], the axum routes with `into_response`; a way
/// in that adds words of its own (forward-auth names the header it reads
/// the token from) changes the [`Refusal`] it passes, not the answer.
///
/// # Examples
/// ```
/// use spillway_server::credentials::{self, Refusal, API_REALM};
/// let r = Refusal {
///     status: http::StatusCode::UNAUTHORIZED,
///     detail: "unknown token".into(),
///     challenge: Some(API_REALM),
/// };
/// let a = credentials::refusal_answer(&r);
/// assert_eq!(a.status(), 401);
/// assert_eq!(a.headers()["www-authenticate"], API_REALM);
/// assert!(a.body().contains("unknown token"));
/// ```
pub fn refusal_answer(r: &Refusal) -> http::Response<String> {
    let body = spillway_tower::render::Problem::new(r.status, r.detail.as_str()).to_json();
    let mut answer = http::Response::new(body);
    *answer.status_mut() = r.status;
    let h = answer.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(spillway_tower::render::PROBLEM_JSON),
    );
    if let Some(c) = r.challenge {
        h.insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static(c),
        );
    }
    answer
}

impl Refusal {
    /// [`refusal_answer`] as an HTTP/1.1 answer appended to `out`, for
    /// the direct paths: `close` adds `Connection: close`; a
    /// `head_request` gets the head alone.
    pub fn write_http1(&self, out: &mut Vec<u8>, close: bool, head_request: bool) {
        let answer = refusal_answer(self);
        let content_type = answer
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or(spillway_tower::render::PROBLEM_JSON);
        spillway_wire::write::answer(
            out,
            answer.status(),
            content_type,
            answer.body().as_bytes(),
            close,
            head_request,
            |o| {
                for (name, value) in answer.headers() {
                    if name != http::header::CONTENT_TYPE {
                        spillway_wire::write::header(o, name.as_str(), value.as_bytes());
                    }
                }
            },
        );
    }
}

impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        refusal_answer(&self)
            .map(axum::body::Body::from)
            .into_response()
    }
}

/// Whether `path` is a decision route `api.tokens` closes (health and
/// everything else stay as they are).
pub fn is_decision_route(path: &str) -> bool {
    matches!(path, "/v1/check" | "/v1/charge" | "/v1/limit" | "/json")
}

/// The axum layer of the decision listener: a decision route needs one of
/// `api.tokens` when any are set (the direct path asks [`ApiTokens::admit`]
/// itself).
pub async fn api_gate(
    axum::extract::State(tokens): axum::extract::State<ApiTokens>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let path = req.uri().path();
    if is_decision_route(path) {
        let auth = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes);
        if let Err(r) = tokens.admit(auth, path == "/v1/charge") {
            return r.into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_only_itself() {
        let t = Token::new(
            "ops".into(),
            Scope::Write,
            "env X".into(),
            "0123456789abcdef",
        );
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b"0123456789abcdef0"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b""));
        // A guess that is the token with NULs after it is not the token.
        assert!(!t.matches(b"0123456789abcdef\0"));
    }

    /// The direct paths and axum answer a refusal alike: one writer.
    #[test]
    fn a_refusal_is_written_alike_on_the_wire_and_by_axum() {
        for (status, challenge) in [(401, Some(ADMIN_REALM)), (403, None)] {
            let r = Refusal {
                status: http::StatusCode::from_u16(status).unwrap(),
                detail: "send Authorization: Bearer TOKEN".into(),
                challenge,
            };
            let mut wire = Vec::new();
            r.write_http1(&mut wire, true, false);
            let wire = String::from_utf8(wire).unwrap();
            let (head, body) = wire.split_once("\r\n\r\n").unwrap();
            let head = head.to_ascii_lowercase();
            assert!(head.starts_with(&format!("http/1.1 {status} ")), "{head}");
            assert!(
                head.contains("content-type: application/problem+json"),
                "{head}"
            );
            assert_eq!(
                head.contains(&format!(
                    "www-authenticate: {}",
                    ADMIN_REALM.to_ascii_lowercase()
                )),
                challenge.is_some(),
                "{head}"
            );
            let a = refusal_answer(&r);
            assert_eq!(a.body(), body);
            assert!(body.contains("Bearer TOKEN"), "{body}");
            let resp = axum::response::IntoResponse::into_response(r.clone());
            assert_eq!(resp.status(), status);
            assert_eq!(resp.headers(), a.headers());
            let mut head_only = Vec::new();
            r.write_http1(&mut head_only, false, true);
            assert!(head_only.ends_with(b"\r\n\r\n"));
        }
    }

    #[test]
    fn missing_unknown_and_narrow_tokens_are_refused() {
        let t = |name: &str, scope, v: &str| Token::new(name.into(), scope, "env X".into(), v);
        let api = ApiTokens::default();
        assert_eq!(api.admit(None, true), Ok(()));
        api.set(vec![
            t("svc", Scope::Read, "0123456789abcdef"),
            t("billing", Scope::Write, "fedcba9876543210"),
        ]);
        let no = api.admit(None, false).unwrap_err();
        assert_eq!(no.status, 401);
        assert_eq!(no.challenge, Some(API_REALM));
        let wrong = api
            .admit(Some(b"Bearer 0123456789abcdeX"), false)
            .unwrap_err();
        assert_eq!(wrong.status, 401);
        assert!(!wrong.detail.contains("0123"), "{wrong:?}");
        assert_eq!(api.admit(Some(b"bearer  0123456789abcdef "), false), Ok(()));
        let narrow = api
            .admit(Some(b"Bearer 0123456789abcdef"), true)
            .unwrap_err();
        assert_eq!(narrow.status, 403);
        assert_eq!(api.admit(Some(b"Bearer fedcba9876543210"), true), Ok(()));
        assert!(api.admit(Some(b"Basic fedcba9876543210"), false).is_err());
    }
}
