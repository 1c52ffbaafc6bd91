//! The HTTP API. Handlers only translate: they decode and check requests, turn them into core
//! commands applied through the store, carry out the resulting effects, and encode answers.
//!
//! This module builds the router and the OpenAPI document, and holds what every resource
//! shares: the body extractors, id parsing, query helpers and the caller's visibility. The
//! handlers live in a module per resource.

use axum::extract::{Extension, FromRequest, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use overseer_core::spec::{decode_bytes, JobSpec};
use overseer_core::wire::{BatchSummary, Problem, SubmittedJob};
use overseer_core::{Job, JobId, JobState, LeaseId, Span};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::error::{ApiError, Result};
use crate::App;

mod agents;
mod jobs;
mod leases;
mod operations;
mod schedules;

pub(crate) use leases::{lease_of, report_refused, reported};

/// The API's description, filled in from the handlers' annotations as they are routed.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Overseer",
        description = "A durable job scheduler: jobs are DAGs of steps run by agents under fenced leases."
    ),
    components(schemas(Problem, JobState, BatchSummary, SubmittedJob)),
    modifiers(&BearerAuth),
    tags(
        (name = "jobs", description = "Submit, read, wait for and act on jobs"),
        (name = "agents", description = "Take leases; per-agent limits and pauses"),
        (name = "leases", description = "Heartbeat and report on leases held"),
        (name = "schedules", description = "Cron schedules"),
        (name = "tokens", description = "API tokens (admin)"),
        (name = "settings", description = "Server settings (admin)"),
        (name = "operations", description = "Probes and metrics"),
    )
)]
struct ApiDoc;

/// Declares the bearer scheme every route but the probes and `/openapi.json` may require.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        doc.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

/// Every route with its documentation: `routes!` registers a handler and its `utoipa::path`
/// together, so the served router and `/openapi.json` cannot disagree.
fn documented() -> (axum::Router<App>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::router::OpenApiRouter;
    use utoipa_axum::routes;
    let documented = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(jobs::submit, jobs::list_jobs))
        .routes(routes!(jobs::submit_batch))
        .routes(routes!(
            jobs::get_job,
            jobs::reschedule_job,
            jobs::delete_job
        ))
        .routes(routes!(jobs::job_events))
        .routes(routes!(jobs::wait_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(jobs::resume_job))
        .routes(routes!(jobs::rerun_job))
        .routes(routes!(jobs::retry_step))
        .routes(routes!(jobs::skip_step))
        .routes(routes!(operations::metrics))
        .routes(routes!(agents::list_agents))
        .routes(routes!(leases::take_leases))
        .routes(routes!(agents::put_limits, agents::get_limits))
        .routes(routes!(agents::pause_agent))
        .routes(routes!(agents::resume_agent))
        .routes(routes!(leases::heartbeat))
        .routes(routes!(leases::complete))
        .routes(routes!(leases::fail))
        .routes(routes!(leases::report_batch))
        .routes(routes!(
            schedules::list_schedules,
            schedules::create_schedule
        ))
        .routes(routes!(
            schedules::get_schedule,
            schedules::update_schedule,
            schedules::delete_schedule
        ))
        .routes(routes!(schedules::pause_schedule))
        .routes(routes!(schedules::resume_schedule))
        .routes(routes!(agents::ordering_key))
        .routes(routes!(operations::stats))
        .routes(routes!(operations::alerts))
        .routes(routes!(crate::tokens::list, crate::tokens::create))
        .routes(routes!(crate::tokens::revoke))
        .routes(routes!(crate::webhook::get_secret))
        .routes(routes!(crate::console::validate))
        .routes(routes!(crate::stream::events_stream))
        .split_for_parts();
    let (router, mut doc) = documented;
    add_links(&mut doc);
    (router, doc)
}

/// The document as served. utoipa 5.5 writes a link's fields in snake case (`operation_id`),
/// where OpenAPI says `operationId`, `operationRef` and `requestBody`: renamed here.
pub fn document_json(doc: &utoipa::openapi::OpenApi) -> Value {
    let mut value = serde_json::to_value(doc).unwrap_or_default();
    let responses = value["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .flat_map(|item| {
            item.as_object_mut()
                .into_iter()
                .flat_map(|i| i.values_mut())
        })
        .flat_map(|op| op.get_mut("responses").and_then(Value::as_object_mut))
        .flat_map(|r| r.values_mut());
    for response in responses {
        let links = response.get_mut("links").and_then(Value::as_object_mut);
        for link in links.into_iter().flat_map(|l| l.values_mut()) {
            let Some(link) = link.as_object_mut() else {
                continue;
            };
            for (from, to) in [
                ("operation_id", "operationId"),
                ("operation_ref", "operationRef"),
                ("request_body", "requestBody"),
            ] {
                if let Some(v) = link.remove(from) {
                    link.insert(to.to_string(), v);
                }
            }
        }
    }
    value
}

/// A link: from the response `status` of `POST path` to the operation `target`, with its
/// parameters taken from that response.
type Linked<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, &'a str)]);

/// OpenAPI links from the operations that make something to those that take its id, so tools
/// (client generators, the schemathesis run's stateful phase) can follow a job, a lease, a
/// schedule or a token from where it was made.
fn add_links(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::link::LinkBuilder;
    let job = ("id", "$response.body#/id");
    let step = ("name", "$response.body#/steps/0/name");
    let lease = ("lease_id", "$response.body#/leases/0/lease_id");
    let named = ("name", "$response.body#/name");
    let links: [Linked; 17] = [
        ("/v1/jobs", "202", "get_job", &[job]),
        ("/v1/jobs", "202", "job_events", &[job]),
        ("/v1/jobs", "202", "wait_job", &[job]),
        ("/v1/jobs", "202", "cancel_job", &[job]),
        ("/v1/jobs", "202", "resume_job", &[job]),
        ("/v1/jobs", "202", "rerun_job", &[job]),
        ("/v1/jobs", "202", "retry_step", &[job, step]),
        ("/v1/jobs", "202", "skip_step", &[job, step]),
        ("/v1/agents/{agent}/leases", "200", "heartbeat", &[lease]),
        ("/v1/agents/{agent}/leases", "200", "complete", &[lease]),
        ("/v1/agents/{agent}/leases", "200", "fail", &[lease]),
        ("/v1/schedules", "201", "get_schedule", &[named]),
        ("/v1/schedules", "201", "update_schedule", &[named]),
        ("/v1/schedules", "201", "pause_schedule", &[named]),
        ("/v1/schedules", "201", "resume_schedule", &[named]),
        ("/v1/schedules", "201", "delete_schedule", &[named]),
        ("/v1/tokens", "201", "revoke", &[named]),
    ];
    for (path, status, target, params) in links {
        let Some(op) = doc.paths.paths.get_mut(path).and_then(|p| p.post.as_mut()) else {
            continue;
        };
        let Some(utoipa::openapi::RefOr::T(response)) = op.responses.responses.get_mut(status)
        else {
            continue;
        };
        let link = params
            .iter()
            .fold(LinkBuilder::new().operation_id(target), |l, (k, v)| {
                l.parameter(*k, *v)
            })
            .build();
        response.links.insert(target.to_string(), link.into());
    }
}

/// The OpenAPI 3.1 document of every route, as `GET /openapi.json` serves it.
pub fn openapi() -> utoipa::openapi::OpenApi {
    documented().1
}

pub fn router(app: App) -> Router {
    let body_limit = app.limits().body_bytes;
    let (routes, doc) = documented();
    let doc = std::sync::Arc::new(document_json(&doc));
    routes
        // Every route (and only routes: an unknown path is a plain 404) is checked here.
        .route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            crate::auth::check,
        ))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { Json(doc.as_ref().clone()) }
            }),
        )
        // The console's page and assets are public: they hold no data, and the page asks for a
        // token itself when the API answers 401.
        .route("/", get(crate::console::index))
        .route("/console/{name}", get(crate::console::asset))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read by `Body<T>` under this limit; the extra slack lets us answer 413
        // ourselves, naming the limit, instead of a bare connection error.
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        // Answers (the console's assets, job lists) are gzipped for clients that ask; the
        // default predicate leaves small bodies, images and event streams alone, so server-sent
        // events are never held back in a compressor's buffer.
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(app)
}

/// A JSON body decoded with the field at fault named on error, and 413 beyond the size limit.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<App> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &App) -> Result<Self> {
        let limit = app.limits().body_bytes;
        if let Some(len) = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok())
        {
            if len > limit {
                return Err(too_large_body(limit));
            }
        }
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|_| too_large_body(limit))?;
        if bytes.is_empty() {
            return Err(ApiError::bad_request("", "the request needs a JSON body"));
        }
        Ok(Body(decode_object(&bytes)?))
    }
}

/// A body that may be absent (lease reports with nothing to say).
pub struct OptionalBody<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<App> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &App) -> Result<Self> {
        let limit = app.limits().body_bytes;
        let bytes = axum::body::to_bytes(req.into_body(), limit)
            .await
            .map_err(|_| too_large_body(limit))?;
        // No body, or JSON `null`, says nothing: the defaults.
        if bytes.trim_ascii().is_empty() || bytes.trim_ascii() == b"null" {
            return Ok(OptionalBody(T::default()));
        }
        Ok(OptionalBody(decode_object(&bytes)?))
    }
}

/// Decodes a request body, which is always a JSON object: serde would also build a struct from
/// an array of its fields in order (`[1, null]`), which no client means.
fn decode_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        let malformed = serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err();
        let message = match malformed {
            true => "malformed JSON: the body must be a JSON object",
            false => "the body must be a JSON object",
        };
        return Err(ApiError::bad_request("", message));
    }
    Ok(decode_bytes(bytes)?)
}

fn too_large_body(limit: usize) -> ApiError {
    ApiError::too_large(
        "",
        format!("the request body is larger than the limit of {limit} bytes"),
    )
}

#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "The process answers", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

#[utoipa::path(get, path = "/readyz", tag = "operations", responses((status = 200, description = "The store answers: `{status, node, leader}`", body = serde_json::Value), (status = 503, description = "Shutting down or the store is unreachable", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn readyz(State(app): State<App>) -> Response {
    match app.store().ping().await {
        Ok(()) if !app.shutdown().is_cancelled() => {
            Json(json!({ "status": "ready", "node": app.node(), "leader": app.is_leader() }))
                .into_response()
        }
        Ok(()) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "shutting down" })),
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "status": "store unavailable" })),
            )
                .into_response()
        }
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "this endpoint does not take that method",
    )
}

fn parse_job_id(raw: &str) -> Result<JobId> {
    raw.parse()
        .map_err(|_| ApiError::bad_request("id", format!("`{raw}` is not a job id (a UUID)")))
}

fn parse_lease_id(raw: &str) -> Result<LeaseId> {
    raw.parse().map_err(|_| {
        ApiError::bad_request("lease_id", format!("`{raw}` is not a lease id (a UUID)"))
    })
}

/// The caller's name, when auth is on.
type CallerExt = Option<Extension<crate::auth::Caller>>;
/// Present when the caller reads only its own jobs.
type OwnExt = Option<Extension<crate::auth::OwnJobsOnly>>;

/// Whether a caller limited to its own jobs may not see `job`.
fn hidden(job: &Job, own: &OwnExt) -> bool {
    own.as_ref()
        .is_some_and(|o| job.submitted_by.as_deref() != Some(o.0 .0.as_str()))
}

/// A `callback_url` or HTTP target URL the outbound policy refuses already (a bad scheme, an
/// internal IP literal) is a 400 now rather than a request that can never succeed. `prefix`
/// names the job within a batch.
fn check_outbound(app: &App, spec: &JobSpec, prefix: &str) -> Result<()> {
    let policy = app.outbound();
    let check = |field: String, url: &str| {
        policy
            .check_url(url)
            .map_err(|why| ApiError::bad_request(field, why))
    };
    if let Some(url) = &spec.callback_url {
        check(format!("{prefix}callback_url"), url)?;
    }
    for (i, step) in spec.steps.iter().enumerate() {
        if let Some(h) = &step.http {
            check(format!("{prefix}steps[{i}].http.url"), &h.url)?;
        }
        if let Some(h) = step.compensate.as_ref().and_then(|c| c.http.as_ref()) {
            check(format!("{prefix}steps[{i}].compensate.http.url"), &h.url)?;
        }
    }
    Ok(())
}

fn check_agent(app: &App, agent: &str) -> Result<()> {
    if agent.is_empty() || agent.len() > app.limits().name_bytes {
        return Err(ApiError::bad_request(
            "agent",
            "agent names are 1 to 200 bytes",
        ));
    }
    Ok(())
}

fn query_pairs(raw: Option<String>) -> Result<Vec<(String, String)>> {
    let raw = raw.unwrap_or_default();
    serde_urlencoded::from_str::<Vec<(String, String)>>(&raw)
        .map_err(|e| ApiError::bad_request("", format!("malformed query string: {e}")))
}

fn parse_span(field: &str, raw: &str, max: Span) -> Result<Span> {
    let span: Span = raw
        .parse()
        .map_err(|e: String| ApiError::bad_request(field, e))?;
    if span > max {
        return Err(ApiError::bad_request(
            field,
            format!("{field} must be at most {max}"),
        ));
    }
    Ok(span)
}

/// A time given as a query parameter (RFC 3339), or a 400 naming the parameter.
fn query_time(name: &str, value: &str) -> Result<overseer_core::Timestamp> {
    overseer_core::Timestamp::parse_rfc3339(value)
        .map_err(|e| ApiError::bad_request(name, format!("{name}: {e}")))
}
