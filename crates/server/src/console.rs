//! The operator console: static assets compiled into the binary and served at `/` and
//! `/console/*`. The console talks only to the public HTTP API, so any node of a cluster serves
//! it. Assets are revalidated by ETag (a hash of their bytes), so a new binary is picked up at
//! once and an unchanged asset costs a 304.

use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use overseer_core::JobSpec;
use serde_json::{json, Value};

use crate::api::Body;
use crate::error::{ApiError, Result};
use crate::App;

/// (name under `/console/`, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../console/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../console/app.js"),
    ),
    (
        "views.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../console/views.js"),
    ),
    (
        "dag.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../console/dag.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("../console/style.css"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("../console/favicon.svg"),
    ),
];

/// Each asset's ETag, computed once.
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|(_, _, bytes)| {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                format!("\"{:016x}\"", h.finish())
            })
            .collect()
    })
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|(n, _, _)| *n == name) else {
        return ApiError::not_found(format!("no console asset `{name}`")).into_response();
    };
    let (_, kind, bytes) = ASSETS[i];
    let tag = &etags()[i];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let mut res = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, kind)], bytes).into_response()
    };
    let h = res.headers_mut();
    // `no-cache` = keep it, but ask (cheaply, by ETag) before reusing it.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    res
}

pub async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

pub async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    serve(&name, &headers)
}

/// `POST /v1/jobs:validate`: the checks of a submit without storing anything; 200, or the same
/// problem+json 400 the submit would answer.
#[utoipa::path(post, path = "/v1/jobs:validate", tag = "jobs", request_body = JobSpec, responses((status = 200, description = "The spec would be accepted", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = overseer_core::wire::Problem, content_type = "application/problem+json")))]
pub async fn validate(State(app): State<App>, Body(spec): Body<JobSpec>) -> Result<Json<Value>> {
    spec.validate(app.limits())?;
    Ok(Json(json!({ "valid": true, "steps": spec.steps.len() })))
}
