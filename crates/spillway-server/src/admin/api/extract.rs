//! A handler's preconditions as extractors in its signature: the token
//! it needs ([`Authorized`]) and the rule and key its path names
//! ([`KeyTarget`]). axum runs them in the order they are written, so a
//! handler that takes `Authorized<Write>` before `KeyTarget` answers 401
//! or 403 before anything about its path or body, as every write call
//! did when each repeated the prologue by hand.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::Response;

use super::{AdminState, Target, authorize, target};
use crate::credentials::Scope;

/// The scope a handler needs: [`Read`], [`Write`] or [`ReadIfTokens`].
pub trait Need: Send + Sync + 'static {
    /// The scope a token must reach.
    const SCOPE: Scope;
    /// Whether the call stays open while no token is configured (the
    /// endpoints that were open before tokens existed).
    const OPEN_WITHOUT_TOKENS: bool = false;
}

/// A read token (or a write one): GET calls.
#[derive(Debug)]
pub enum Read {}
/// A write token: every call that changes something.
#[derive(Debug)]
pub enum Write {}
/// Metrics, status and rules: open while `admin.tokens` lists none, a
/// read token once it lists any.
#[derive(Debug)]
pub enum ReadIfTokens {}

impl Need for Read {
    const SCOPE: Scope = Scope::Read;
}
impl Need for Write {
    const SCOPE: Scope = Scope::Write;
}
impl Need for ReadIfTokens {
    const SCOPE: Scope = Scope::Read;
    const OPEN_WITHOUT_TOKENS: bool = true;
}

/// A request whose bearer token reaches `N`'s scope. Its rejection is the
/// 401 (no or unknown token, or no tokens configured) or 403 (a read
/// token on a write call), written by
/// [`credentials::refusal_answer`](crate::credentials::refusal_answer).
#[derive(Debug)]
pub struct Authorized<N> {
    /// The token's name, for the audit trail (`-` for an open call).
    pub who: String,
    need: PhantomData<N>,
}

impl<N: Need> FromRequestParts<Arc<AdminState>> for Authorized<N> {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AdminState>,
    ) -> Result<Self, Response> {
        let who = if N::OPEN_WITHOUT_TOKENS && state.settings.load().tokens.is_empty() {
            "-".to_string()
        } else {
            authorize(state, &parts.headers, N::SCOPE)?
        };
        Ok(Authorized {
            who,
            need: PhantomData,
        })
    }
}

/// The rule and key a call under `/admin/v1/{keys,overrides,plans}/`
/// names: the rule's name, then one path segment per part of its key
/// (`by: user+ip` takes two), each percent-decoded. Its rejection is a
/// 400 (a bad segment, the wrong number of them) or 404 (no such rule).
#[derive(Debug)]
pub struct KeyTarget(pub Target);

impl FromRequestParts<Arc<AdminState>> for KeyTarget {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AdminState>,
    ) -> Result<Self, Response> {
        // The collection is the segment after `/admin/v1/`, as routed.
        let path = parts.uri.path();
        let prefix_len = path
            .strip_prefix("/admin/v1/")
            .and_then(|rest| rest.find('/'))
            .map_or(path.len(), |i| "/admin/v1/".len() + i + 1);
        target(state, &parts.uri, &path[..prefix_len]).map(KeyTarget)
    }
}
