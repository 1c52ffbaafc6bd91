//! `POST /v1/tokens`, `GET /v1/tokens`, `DELETE /v1/tokens/{name}`: admin-only management of
//! API tokens. A secret is shown once, when it is made; the store keeps only its hash.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use overseer_core::auth::{hash_secret, secret_from, valid_name, Grant, Scope, TokenRecord};
use overseer_core::{Span, Timestamp};
use serde::{Deserialize, Serialize};

use crate::api::Body;
use crate::error::{ApiError, Result};
use crate::App;
#[allow(unused_imports)] // Named in the OpenAPI annotations.
use overseer_core::wire::Problem;

/// `POST /v1/tokens` body.
#[derive(Clone, Debug, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// 1 to 64 letters, digits, `-`, `_` or `.`.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: String,
    /// At least one of `admin`, `operate`, `submit`, `read`, `agent`.
    #[schema(min_items = 1, inline, value_type = Vec<ScopeName>)]
    pub scopes: Vec<String>,
    /// With the `agent` scope: the agent names the token may lease for (none: any).
    #[serde(default)]
    pub agents: Vec<String>,
    /// How long the token lives, e.g. `90d`; none: until revoked.
    #[serde(default)]
    pub expires: Option<Span>,
}

/// A scope's name, as requests spell it (documentation only: requests carry plain strings so
/// an unknown one is answered with a 400 naming it).
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // Only its schema is used.
enum ScopeName {
    Admin,
    Operate,
    Submit,
    Read,
    Agent,
}

/// A token as listed: never its secret or hash.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenView {
    pub name: String,
    pub scopes: Vec<String>,
    pub agents: Vec<String>,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

impl From<&TokenRecord> for TokenView {
    fn from(t: &TokenRecord) -> Self {
        TokenView {
            name: t.name.clone(),
            scopes: t.grant.scopes.iter().map(|s| s.to_string()).collect(),
            agents: t.grant.agents.clone(),
            created_at: t.created_at,
            expires_at: t.expires_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// Checks a request and builds the record to store, with the secret to show once.
pub fn make_token(
    req: &CreateToken,
    now: Timestamp,
    random: [u8; 32],
) -> Result<(TokenRecord, String)> {
    if !valid_name(&req.name) {
        return Err(ApiError::bad_request(
            "name",
            "1 to 64 letters, digits, '-', '_' or '.'",
        ));
    }
    let mut scopes = Vec::new();
    for (i, s) in req.scopes.iter().enumerate() {
        let scope = Scope::parse(s).ok_or_else(|| {
            ApiError::bad_request(
                format!("scopes[{i}]"),
                format!("`{s}` is not a scope (admin, operate, submit, read, agent)"),
            )
        })?;
        scopes.push(scope);
    }
    if scopes.is_empty() {
        return Err(ApiError::bad_request(
            "scopes",
            "a token needs at least one scope",
        ));
    }
    if !req.agents.is_empty() && !scopes.contains(&Scope::Agent) {
        return Err(ApiError::bad_request(
            "agents",
            "agent names bind only the `agent` scope",
        ));
    }
    if let Some(i) = req
        .agents
        .iter()
        .position(|a| a.is_empty() || a.contains(',') || a.len() > 200)
    {
        return Err(ApiError::bad_request(
            format!("agents[{i}]"),
            "an agent name, 1 to 200 bytes, no ','",
        ));
    }
    let secret = secret_from(random);
    let record = TokenRecord {
        name: req.name.clone(),
        hash: hash_secret(&secret),
        grant: Grant {
            scopes,
            agents: req.agents.clone(),
        },
        created_at: now,
        expires_at: req.expires.map(|e| now.plus(e)),
        revoked_at: None,
    };
    Ok((record, secret))
}

#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateToken, responses((status = 201, description = "The token with its `secret`, shown this once", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub async fn create(State(app): State<App>, Body(req): Body<CreateToken>) -> Result<Response> {
    let (record, secret) = make_token(&req, app.now(), rand::random())?;
    app.store().token_create(record.clone()).await?;
    tracing::info!(token = %record.name, "token created");
    let mut body = serde_json::to_value(TokenView::from(&record)).unwrap_or_default();
    body["secret"] = serde_json::Value::String(secret);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", responses((status = 200, description = "`{tokens: [...]}`, never secrets", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub async fn list(State(app): State<App>) -> Result<Json<serde_json::Value>> {
    let tokens = app.store().tokens_list().await?;
    let views: Vec<TokenView> = tokens.iter().map(TokenView::from).collect();
    Ok(Json(serde_json::json!({ "tokens": views })))
}

#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "tokens", params(("name" = String, Path, description = "A token name")), responses((status = 200, description = "`{name, revoked_at}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub async fn revoke(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>> {
    if !app.store().token_revoke(&name, app.now()).await? {
        return Err(ApiError::not_found(format!(
            "no unrevoked token is named `{name}`"
        )));
    }
    app.auth().forget();
    tracing::info!(token = %name, "token revoked");
    Ok(Json(
        serde_json::json!({ "name": name, "revoked_at": app.now() }),
    ))
}
