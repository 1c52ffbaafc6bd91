//! Authentication and authorization of API calls. Each route needs one permission
//! ([`need_of`]); a bearer token is looked up by its hash (with a short cache, so a revoke on any
//! node is honoured everywhere within [`CACHE_TTL`]) and its grant decides (`core::auth`).
//! With auth off (the default on loopback) every call is allowed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use overseer_core::auth::{constant_time_eq, hash_secret, Grant, Need, Scope, TokenRecord};

use crate::error::ApiError;
use crate::App;

/// How long a token lookup (found or not) is trusted before the store is asked again: the
/// longest a revoked token keeps working on a node.
pub const CACHE_TTL: Duration = Duration::from_millis(500);
/// Failed authentications allowed per second on a node before further ones get 429.
const FAILURES_PER_SECOND: u32 = 20;
/// Cached lookups kept at most; beyond, the cache starts over.
const CACHE_MAX: usize = 10_000;

/// The caller's name for the admin credential given as a setting.
const ADMIN_SETTING: &str = "(admin_token setting)";

/// Who made a call, when auth is on: the token's name. Handlers that hold resources per caller
/// (long-polls) read it from the request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// The name a job this caller submits records: the token's, none for the admin setting
    /// (it is no token).
    pub fn submitter(&self) -> Option<String> {
        (self.0 != ADMIN_SETTING).then(|| self.0.clone())
    }
}

/// Set beside [`Caller`] when the caller reads only the jobs it submitted (a `submit` token
/// without `read`, `operate` or `admin`): the token's name. Handlers answer any other job as
/// missing (404, never 403, so nothing says it exists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnJobsOnly(pub String);

/// Whether calls must carry a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Required off loopback, off on loopback.
    #[default]
    Auto,
    Off,
    Required,
}

/// One node's authenticator.
pub struct Auth {
    required: bool,
    /// Hash of the `admin_token` setting, an admin credential that is never stored.
    admin_hash: Option<String>,
    cache: Mutex<HashMap<String, (Option<TokenRecord>, Instant)>>,
    failures: Mutex<(Instant, u32)>,
}

impl Auth {
    pub fn new(required: bool, admin_token: Option<&str>) -> Auth {
        Auth {
            required,
            admin_hash: admin_token.filter(|t| !t.is_empty()).map(hash_secret),
            cache: Mutex::new(HashMap::new()),
            failures: Mutex::new((Instant::now(), 0)),
        }
    }

    pub fn required(&self) -> bool {
        self.required
    }

    /// Whether a setting grants admin without any stored token.
    pub fn has_admin_setting(&self) -> bool {
        self.admin_hash.is_some()
    }

    /// The name and grant of `secret`, if it names a live token.
    async fn grant(&self, app: &App, secret: &str) -> Result<Option<(String, Grant)>, ApiError> {
        let hash = hash_secret(secret);
        if let Some(admin) = &self.admin_hash {
            if constant_time_eq(admin.as_bytes(), hash.as_bytes()) {
                let grant = Grant {
                    scopes: vec![Scope::Admin],
                    agents: Vec::new(),
                };
                return Ok(Some((ADMIN_SETTING.to_string(), grant)));
            }
        }
        let cached = self.cached(&hash);
        let record = match cached {
            Some(record) => record,
            None => {
                let record = app.store().token_by_hash(&hash).await?;
                self.remember(hash, record.clone());
                record
            }
        };
        Ok(record
            .filter(|t| t.is_live(app.now()))
            .map(|t| (t.name, t.grant)))
    }

    fn cached(&self, hash: &str) -> Option<Option<TokenRecord>> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .get(hash)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(record, _)| record.clone())
    }

    fn remember(&self, hash: String, record: Option<TokenRecord>) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_MAX {
            cache.clear();
        }
        cache.insert(hash, (record, Instant::now()));
    }

    /// Drops every cached lookup (this node just changed a token).
    pub fn forget(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Counts a failed authentication; false once this second's budget is spent.
    fn failure_allowed(&self) -> bool {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.0.elapsed() >= Duration::from_secs(1) {
            *f = (Instant::now(), 0);
        }
        f.1 += 1;
        f.1 <= FAILURES_PER_SECOND
    }
}

/// What a call to `path` (the route's template) with `method` needs. A route missing here needs
/// admin, so a new route is never open by omission.
pub fn need_of(method: &Method, path: &str, agent: Option<&str>) -> Need {
    let read = *method == Method::GET;
    match path {
        "/healthz" | "/readyz" => Need::Public,
        "/v1/jobs" | "/v1/jobs:batch" | "/v1/jobs:validate" if *method == Method::POST => {
            Need::Submit
        }
        "/v1/agents/{agent}/leases" => Need::Agent(agent.map(str::to_string)),
        p if p.starts_with("/v1/leases") => Need::Agent(None),
        p if p.starts_with("/v1/tokens") || p.starts_with("/v1/settings") => Need::Admin,
        _ if read => Need::Read,
        "/v1/jobs/{id}"
        | "/v1/jobs/{id}/cancel"
        | "/v1/jobs/{id}/resume"
        | "/v1/jobs/{id}/rerun"
        | "/v1/jobs/{id}/steps/{name}/retry"
        | "/v1/jobs/{id}/steps/{name}/skip"
        | "/v1/agents/{agent}/limits"
        | "/v1/agents/{agent}/pause"
        | "/v1/agents/{agent}/resume"
        | "/v1/schedules"
        | "/v1/schedules/{name}"
        | "/v1/schedules/{name}/pause"
        | "/v1/schedules/{name}/resume" => Need::Operate,
        _ => Need::Admin,
    }
}

fn bearer(req: &Request) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The middleware on every route: passes the call on, or answers 401 (no or bad token), 403
/// (a token without the permission) or 429 (too many failed attempts). Neither answer says
/// anything about the resource asked for.
pub async fn check(
    State(app): State<App>,
    matched: MatchedPath,
    params: RawPathParams,
    req: Request,
    next: Next,
) -> Response {
    let auth = app.auth();
    if !auth.required() {
        return next.run(req).await;
    }
    let agent = params
        .iter()
        .find(|(k, _)| *k == "agent")
        .map(|(_, v)| v.to_string());
    let need = need_of(req.method(), matched.as_str(), agent.as_deref());
    if need == Need::Public {
        return next.run(req).await;
    }
    let refused = |status: StatusCode, code: &'static str, detail: &str| {
        ApiError::new(status, code, detail.to_string()).into_response()
    };
    let Some(secret) = bearer(&req).map(str::to_string) else {
        if !auth.failure_allowed() {
            return too_many();
        }
        return refused(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "this call needs `Authorization: Bearer <token>`",
        );
    };
    match auth.grant(&app, &secret).await {
        Ok(Some((name, grant))) if grant.permits(&need) => {
            let mut req = req;
            if !grant.reads_every_job() {
                req.extensions_mut().insert(OwnJobsOnly(name.clone()));
            }
            req.extensions_mut().insert(Caller(name));
            next.run(req).await
        }
        Ok(Some(_)) => refused(
            StatusCode::FORBIDDEN,
            "forbidden",
            "the token's scopes do not allow this call",
        ),
        Ok(None) if !auth.failure_allowed() => too_many(),
        Ok(None) => refused(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "the token is unknown, expired or revoked",
        ),
        Err(e) => e.into_response(),
    }
}

fn too_many() -> Response {
    let mut res = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too-many-failures",
        "too many failed authentications on this node; retry in a second".to_string(),
    )
    .into_response();
    res.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the route table: public probes, submit, agent routes with their agent name, token
    // routes for admins only, reads, operator writes, and admin for anything unlisted.
    #[test]
    fn routes_need_what_they_should() {
        let cases = [
            (Method::GET, "/healthz", None, Need::Public),
            (Method::POST, "/v1/jobs", None, Need::Submit),
            (Method::GET, "/v1/jobs", None, Need::Read),
            (Method::POST, "/v1/jobs:batch", None, Need::Submit),
            (Method::GET, "/v1/jobs/{id}/wait", None, Need::Read),
            (Method::POST, "/v1/jobs/{id}/cancel", None, Need::Operate),
            (Method::POST, "/v1/jobs/{id}/rerun", None, Need::Operate),
            (
                Method::POST,
                "/v1/agents/{agent}/leases",
                Some("dns"),
                Need::Agent(Some("dns".into())),
            ),
            (
                Method::POST,
                "/v1/leases/{lease_id}/complete",
                None,
                Need::Agent(None),
            ),
            (Method::POST, "/v1/leases:report", None, Need::Agent(None)),
            (
                Method::PUT,
                "/v1/agents/{agent}/limits",
                None,
                Need::Operate,
            ),
            (Method::GET, "/v1/agents/{agent}/limits", None, Need::Read),
            (Method::GET, "/v1/tokens", None, Need::Admin),
            (
                Method::GET,
                "/v1/settings/webhook-secret",
                None,
                Need::Admin,
            ),
            (Method::DELETE, "/v1/schedules/{name}", None, Need::Operate),
            (Method::PUT, "/v1/schedules/{name}", None, Need::Operate),
            (Method::POST, "/v1/something-new", None, Need::Admin),
        ];
        for (method, path, agent, need) in cases {
            assert_eq!(need_of(&method, path, agent), need, "{method} {path}");
        }
    }
}
