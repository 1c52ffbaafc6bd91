//! The HTTP API. Handlers only translate: they decode and check requests, turn them into core
//! commands applied through the store, carry out the resulting effects, and encode answers.

use axum::extract::{Extension, FromRequest, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use overseer_core::machine::{admit, Reply};
use overseer_core::schedule::{self, CronSchedule, ScheduleSpec};
use overseer_core::spec::{decode_bytes, JobSpec};
use overseer_core::wire::{
    AgentList, AgentView, AlertDelivery, AlertList, AlertView, BatchRequest, BatchResponse,
    BatchSummary, CompleteRequest, EventList, FailRequest, HeartbeatRequest, HeartbeatResponse,
    JobList, JobView, Lease, LeaseKind, LeaseOutcome, LeaseRequest, LeaseResponse, OperatorRequest,
    Problem, ReportBatch, ReportBatchResponse, ReportResult, RerunRequest, RescheduleRequest,
    StatsView, SubmittedJob, WorkerView,
};
use overseer_core::{
    Command, EventKind, Job, JobId, JobState, LeaseId, Span, Timestamp, Transition,
};
use overseer_store::{
    AgentSettings, Apply, DeliveryCounts, EventPage, JobQuery, LeaseReport, NewJob, Report,
    ReportApplied, RerunJob, Schedule, ScheduleCreated, SchedulePause, ScheduleUpdate,
    SettingsUpdate, Submitted,
};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::error::{ApiError, Result};
use crate::prefer;
use crate::App;

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
        .routes(routes!(submit, list_jobs))
        .routes(routes!(submit_batch))
        .routes(routes!(get_job, reschedule_job, delete_job))
        .routes(routes!(job_events))
        .routes(routes!(wait_job))
        .routes(routes!(cancel_job))
        .routes(routes!(resume_job))
        .routes(routes!(rerun_job))
        .routes(routes!(retry_step))
        .routes(routes!(skip_step))
        .routes(routes!(metrics))
        .routes(routes!(list_agents))
        .routes(routes!(take_leases))
        .routes(routes!(put_limits, get_limits))
        .routes(routes!(pause_agent))
        .routes(routes!(resume_agent))
        .routes(routes!(heartbeat))
        .routes(routes!(complete))
        .routes(routes!(fail))
        .routes(routes!(report_batch))
        .routes(routes!(list_schedules, create_schedule))
        .routes(routes!(get_schedule, update_schedule, delete_schedule))
        .routes(routes!(pause_schedule))
        .routes(routes!(resume_schedule))
        .routes(routes!(ordering_key))
        .routes(routes!(stats))
        .routes(routes!(alerts))
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

/// Builds the job a spec describes, in its admitted state, recording who submitted it.
fn admit_spec(app: &App, spec: &JobSpec, caller: &CallerExt) -> NewJob {
    let now = app.now();
    let mut job = Job::from_spec(app.new_job_id(), spec, now);
    job.submitted_by = caller.as_ref().and_then(|c| c.0.submitter());
    NewJob {
        transition: admit(job, now),
    }
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

/// The job, when the caller may see it; one it may not is answered exactly as a missing one.
async fn visible_job(app: &App, id: JobId, own: &OwnExt) -> Result<Job> {
    let job = app.job(id).await?;
    match hidden(&job, own) {
        true => Err(ApiError::not_found(format!("job {id} not found"))),
        false => Ok(job),
    }
}

/// A resubmission that matched someone else's job: the key is taken, and that is all the
/// caller learns (not the job).
fn key_taken(field: String) -> ApiError {
    ApiError {
        field: Some(field),
        ..ApiError::conflict(
            "idempotency-conflict",
            "this idempotency key is already used by another job",
        )
    }
}

/// A job as `Prefer: return=minimal` answers it.
fn submitted_job(job: &Job, created: bool) -> SubmittedJob {
    SubmittedJob {
        id: job.id,
        state: job.state,
        created,
    }
}

/// 202 when a submit stored something, 200 when its idempotency keys found everything.
fn submit_status(created: bool) -> StatusCode {
    if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    }
}

/// A submit's answer: the job (or, under `Prefer: return=minimal`, its id and state) and
/// `Location`, with [`submit_status`].
fn job_created(app: &App, job: &Job, created: bool, minimal: bool) -> Response {
    let status = submit_status(created);
    let mut res = if minimal {
        prefer::applied((status, Json(submitted_job(job, created))).into_response())
    } else {
        (status, Json(app.view(job))).into_response()
    };
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    res
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

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = JobSpec, params(("Prefer" = Option<String>, Header, description = "`return=minimal`: answer the job's id, state and whether this request created it (`SubmittedJob`, with `Preference-Applied: return=minimal`) instead of the whole job")), responses((status = 202, description = "Accepted and committed; `Location` names the job; a `SubmittedJob` under `Prefer: return=minimal`", body = JobView), (status = 200, description = "A job with this idempotency key and body already exists", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn submit(
    State(app): State<App>,
    caller: CallerExt,
    own: OwnExt,
    headers: HeaderMap,
    Body(spec): Body<JobSpec>,
) -> Result<Response> {
    spec.validate_submitted(app.limits())?;
    check_outbound(&app, &spec, "")?;
    let new = admit_spec(&app, &spec, &caller);
    let minimal = prefer::return_minimal(&headers);
    match app.submit_one(new).await? {
        Submitted::Created(t) => {
            tracing::info!(job = %t.job.id, steps = t.job.steps.len(), "job accepted");
            app.metrics().jobs_submitted.inc();
            app.committed(&t);
            Ok(job_created(&app, &t.job, true, minimal))
        }
        Submitted::Existing(job) if hidden(&job, &own) => Err(key_taken("idempotency_key".into())),
        Submitted::Existing(job) => Ok(job_created(&app, &job, false, minimal)),
    }
}

#[utoipa::path(post, path = "/v1/jobs:batch", tag = "jobs", request_body = BatchRequest, params(("Prefer" = Option<String>, Header, description = "`return=minimal`: answer each job's id, state and whether this request created it (`BatchSummary`, with `Preference-Applied: return=minimal`) instead of the whole jobs")), responses((status = 202, description = "All committed, in request order; a `BatchSummary` under `Prefer: return=minimal`", body = BatchResponse), (status = 200, description = "Every job already existed", body = BatchResponse), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn submit_batch(
    State(app): State<App>,
    caller: CallerExt,
    own: OwnExt,
    headers: HeaderMap,
    Body(batch): Body<BatchRequest>,
) -> Result<Response> {
    let max = app.limits().jobs_per_batch;
    if batch.jobs.is_empty() {
        return Err(ApiError::bad_request(
            "jobs",
            "a batch needs at least one job",
        ));
    }
    if batch.jobs.len() > max {
        return Err(ApiError::too_large(
            "jobs",
            format!("at most {max} jobs per batch"),
        ));
    }
    for (i, spec) in batch.jobs.iter().enumerate() {
        spec.validate_submitted(app.limits())
            .map_err(|e| e.within(&format!("jobs[{i}].")))?;
        check_outbound(&app, spec, &format!("jobs[{i}]."))?;
    }
    let new: Vec<NewJob> = batch
        .jobs
        .iter()
        .map(|s| admit_spec(&app, s, &caller))
        .collect();
    let submitted = app.store().jobs_submit(new).await.map_err(|e| match e {
        overseer_store::Error::IdempotencyConflict { index, .. } => ApiError {
            field: Some(format!("jobs[{index}].idempotency_key")),
            ..ApiError::from(e)
        },
        other => other.into(),
    })?;
    // The others of the batch are committed; the answer says which key is taken, nothing more.
    if let Some(i) = submitted
        .iter()
        .position(|s| matches!(s, Submitted::Existing(job) if hidden(job, &own)))
    {
        return Err(key_taken(format!("jobs[{i}].idempotency_key")));
    }
    for s in &submitted {
        if let Submitted::Created(t) = s {
            app.metrics().jobs_submitted.inc();
            app.committed(t);
        }
    }
    let status = submit_status(submitted.iter().any(Submitted::created));
    if prefer::return_minimal(&headers) {
        let jobs = submitted
            .iter()
            .map(|s| submitted_job(s.job(), s.created()))
            .collect();
        let answer = (status, Json(BatchSummary { jobs })).into_response();
        return Ok(prefer::applied(answer));
    }
    let jobs = submitted.iter().map(|s| app.view(s.job())).collect();
    Ok((status, Json(BatchResponse { jobs })).into_response())
}

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), responses((status = 200, description = "The job, with a `waiting_reason` on the job and each step that waits", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn get_job(
    State(app): State<App>,
    own: OwnExt,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let job = visible_job(&app, parse_job_id(&id)?, &own).await?;
    Ok(Json(crate::explain::job_with_reasons(&app, &job).await?))
}

/// Removes a finished job now, with its steps and history, as its retention would later.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), responses((status = 204, description = "The job is gone; its idempotency key may be used again"), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 the job is not finished, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn delete_job(State(app): State<App>, Path(id): Path<String>) -> Result<StatusCode> {
    let id = parse_job_id(&id)?;
    let removal = overseer_store::Removal {
        ids: vec![id],
        states: overseer_core::retention::TERMINAL.to_vec(),
    };
    if app.store().jobs_delete(removal).await?.contains(&id) {
        tracing::info!(job = %id, "job deleted");
        return Ok(StatusCode::NO_CONTENT);
    }
    let job = app.job(id).await?;
    Err(ApiError::conflict(
        "job-active",
        format!(
            "job {id} is {}: only a finished job can be deleted (cancel it first)",
            job.state
        ),
    ))
}

/// Moves a job: `run_at` of a pending job, `priority` of a pending or running one.
#[utoipa::path(patch, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), request_body = RescheduleRequest, responses((status = 200, description = "The job after the move; a `run_at` that has come starts an unkeyed job at once", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 the job is finished or (for `run_at`) no longer pending, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn reschedule_job(
    State(app): State<App>,
    Path(id): Path<String>,
    Body(req): Body<RescheduleRequest>,
) -> Result<Json<JobView>> {
    let id = parse_job_id(&id)?;
    req.validate()?;
    let command = Command::Reschedule {
        run_at: req.run_at,
        priority: req.priority,
        by: req.by,
        reason: req.reason,
    };
    let t = app
        .store()
        .job_apply(Apply::new(id, command, app.now()))
        .await?;
    if !t.is_noop() {
        tracing::info!(job = %id, run_at = ?t.job.run_at, priority = t.job.priority, "job rescheduled");
    }
    app.committed(&t);
    Ok(Json(app.view(&t.job)))
}

/// Counts for dashboards, read from indexes: cheap however many jobs are stored.
#[utoipa::path(get, path = "/v1/stats", tag = "operations", responses((status = 200, description = "Jobs per state, and jobs finished per minute (succeeded, failed, cancelled) over the last hour", body = StatsView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn stats(State(app): State<App>) -> Result<Json<StatsView>> {
    let now = app.now();
    let (since, until) = StatsView::window(now);
    let store = app.store();
    let (by_state, finished) = tokio::try_join!(
        store.jobs_count_by_state(),
        store.jobs_finished_per_minute(overseer_store::Window { since, until })
    )?;
    let by_state: Vec<_> = by_state.iter().map(|c| (c.state, c.count)).collect();
    let finished: Vec<_> = finished
        .iter()
        .map(|c| (c.minute, c.state, c.count))
        .collect();
    Ok(Json(StatsView::build(now, &by_state, &finished)))
}

const ALERTS_LIMIT_DEFAULT: usize = 50;
const ALERTS_LIMIT_MAX: usize = 200;

/// Alerts raised recently, from the outbox: delivered ones are kept a week.
#[utoipa::path(get, path = "/v1/alerts", tag = "operations", params(("limit" = Option<u32>, Query, description = "1 to 200, default 50", minimum = 1, maximum = 200)), responses((status = 200, description = "The newest alerts first, each with how its delivery stands", body = AlertList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn alerts(State(app): State<App>, RawQuery(raw): RawQuery) -> Result<Json<AlertList>> {
    let mut limit = ALERTS_LIMIT_DEFAULT;
    for (key, value) in query_pairs(raw)? {
        match key.as_str() {
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=ALERTS_LIMIT_MAX).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "limit",
                            format!("limit must be between 1 and {ALERTS_LIMIT_MAX}"),
                        )
                    })?
            }
            other => {
                return Err(ApiError::bad_request(
                    other,
                    format!("unknown query parameter `{other}`"),
                ))
            }
        }
    }
    let records = app.store().alerts_recent(limit).await?;
    let alerts = records.iter().map(alert_view).collect();
    Ok(Json(AlertList {
        alerts,
        webhook: app.has_alert_webhook(),
    }))
}

fn alert_view(r: &overseer_store::DeliveryRecord) -> AlertView {
    let d = &r.delivery;
    let text = |field: &str| d.body[field].as_str().map(str::to_string);
    AlertView {
        kind: text("kind").unwrap_or_default(),
        job_id: d.job_id,
        step: text("step"),
        message: text("message").unwrap_or_default(),
        created_at: d.created_at,
        delivery: match (r.delivered_at, r.dead) {
            (Some(_), _) => AlertDelivery::Delivered,
            (None, true) => AlertDelivery::GivenUp,
            (None, false) => AlertDelivery::Waiting,
        },
        attempts: d.attempts,
        delivered_at: r.delivered_at,
        last_error: d.last_error.clone(),
    }
}

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), responses((status = 200, description = "Its history, oldest first", body = EventList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn job_events(
    State(app): State<App>,
    own: OwnExt,
    Path(id): Path<String>,
) -> Result<Json<EventList>> {
    let id = parse_job_id(&id)?;
    visible_job(&app, id, &own).await?;
    let events = app
        .store()
        .job_events(EventPage {
            job: id,
            after_seq: 0,
            limit: app.limits().history_per_job,
        })
        .await?;
    Ok(Json(EventList { events }))
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

const LIST_LIMIT_DEFAULT: usize = 50;
const LIST_LIMIT_MAX: usize = 500;

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(("state" = Option<JobState>, Query, description = "Only jobs in this state"), ("label" = Option<String>, Query, description = "key:value; repeat to require several", pattern = "^[^:]*:"), ("agent" = Option<String>, Query, description = "Only jobs with a step of this agent name"), ("since" = Option<overseer_core::Timestamp>, Query, description = "Created at or after (RFC 3339)"), ("until" = Option<overseer_core::Timestamp>, Query, description = "Created before (RFC 3339)"), ("id_prefix" = Option<String>, Query, description = "Ids starting with this (4+ hex digits, dashes where a job id has them)", pattern = "^([0-9a-fA-F]{4,8}|[0-9a-fA-F]{8}-[0-9a-fA-F]{0,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{0,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{0,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{0,12})$"), ("limit" = Option<u32>, Query, description = "1 to 500, default 50", minimum = 1, maximum = 500), ("cursor" = Option<JobId>, Query, description = "A next_cursor from an earlier page")), responses((status = 200, description = "Newest first", body = JobList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn list_jobs(
    State(app): State<App>,
    own: OwnExt,
    RawQuery(raw): RawQuery,
) -> Result<Json<JobList>> {
    let mut query = JobQuery {
        limit: LIST_LIMIT_DEFAULT,
        submitted_by: own.map(|o| o.0 .0),
        ..JobQuery::default()
    };
    for (key, value) in query_pairs(raw)? {
        match key.as_str() {
            "state" => {
                query.state = Some(JobState::parse(&value).ok_or_else(|| {
                    ApiError::bad_request("state", format!("`{value}` is not a job state"))
                })?)
            }
            "label" => {
                let (k, v) = value.split_once(':').ok_or_else(|| {
                    ApiError::bad_request("label", "label filters are written key:value")
                })?;
                if query.labels.len() >= app.limits().labels_per_job {
                    return Err(ApiError::bad_request("label", "too many label filters"));
                }
                query.labels.push((k.to_string(), v.to_string()));
            }
            "limit" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| ApiError::bad_request("limit", "limit must be a whole number"))?;
                if n == 0 || n > LIST_LIMIT_MAX {
                    return Err(ApiError::bad_request(
                        "limit",
                        format!("limit must be between 1 and {LIST_LIMIT_MAX}"),
                    ));
                }
                query.limit = n;
            }
            "id_prefix" => {
                query.ids = Some(JobId::prefix_range(&value).ok_or_else(|| {
                    ApiError::bad_request(
                        "id_prefix",
                        "an id prefix is at least 4 hex digits of a job id, dashes included",
                    )
                })?)
            }
            "agent" => query.agent = Some(value),
            "since" => query.created_from = Some(query_time("since", &value)?),
            "until" => query.created_before = Some(query_time("until", &value)?),
            "cursor" => {
                query.before = Some(value.parse().map_err(|_| {
                    ApiError::bad_request(
                        "cursor",
                        "cursor must be a next_cursor from an earlier page",
                    )
                })?)
            }
            other => {
                return Err(ApiError::bad_request(
                    other,
                    format!("unknown query parameter `{other}`"),
                ));
            }
        }
    }
    let limit = query.limit;
    let jobs = app.store().jobs_list(query).await?;
    let next_cursor = (jobs.len() == limit)
        .then(|| jobs.last().map(|j| j.id.to_string()))
        .flatten();
    Ok(Json(JobList {
        jobs: jobs.iter().map(|j| app.view(j)).collect(),
        next_cursor,
    }))
}

/// A time given as a query parameter (RFC 3339), or a 400 naming the parameter.
fn query_time(name: &str, value: &str) -> Result<overseer_core::Timestamp> {
    overseer_core::Timestamp::parse_rfc3339(value)
        .map_err(|e| ApiError::bad_request(name, format!("{name}: {e}")))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/wait", tag = "jobs", params(("id" = JobId, Path, description = "A job id"), ("timeout" = Option<Span>, Query, description = "How long to wait, e.g. 30s (at most limits.wait_max, 60s)")), responses((status = 200, description = "The job, terminal or as it is when the timeout passed", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn wait_job(
    State(app): State<App>,
    caller: Option<Extension<crate::auth::Caller>>,
    own: OwnExt,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<JobView>> {
    let id = parse_job_id(&id)?;
    // 30 s unless the node allows less (a default must obey the node's own bound).
    let mut timeout = Span::from_secs(30).min(app.limits().wait_max);
    for (key, value) in query_pairs(raw)? {
        match key.as_str() {
            "timeout" => timeout = parse_span("timeout", &value, app.limits().wait_max)?,
            other => {
                return Err(ApiError::bad_request(
                    other,
                    format!("unknown query parameter `{other}`"),
                ))
            }
        }
    }
    let _slot = app.long_poll_slot(caller.as_ref().map(|c| c.0 .0.as_str()))?;
    let deadline = tokio::time::Instant::now() + timeout.as_std();
    // Subscribe before reading, so a finish between the read and the wait is not missed.
    let mut finished = app.notifier().subscribe_finished();
    loop {
        let job = visible_job(&app, id, &own).await?;
        if job.state.is_terminal() {
            return Ok(Json(app.view(&job)));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return Ok(Json(app.view(&job))),
            _ = app.shutdown().cancelled() => return Ok(Json(app.view(&job))),
            msg = finished.recv() => match msg {
                Ok(done) if done != id => continue,
                // Ours, or we fell behind and must look again.
                _ => {}
            },
        }
    }
}

#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn cancel_job(State(app): State<App>, Path(id): Path<String>) -> Result<Json<JobView>> {
    let id = parse_job_id(&id)?;
    let t = app
        .store()
        .job_apply(Apply::new(id, Command::Cancel, app.now()))
        .await?;
    if !t.is_noop() {
        tracing::info!(job = %id, state = %t.job.state, "cancel requested");
    }
    app.committed(&t);
    Ok(Json(app.view(&t.job)))
}

#[utoipa::path(get, path = "/v1/agents", tag = "agents", responses((status = 200, description = "Each agent name with ready and running counts and workers", body = AgentList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn list_agents(State(app): State<App>) -> Result<Json<AgentList>> {
    let counts = app.store().agents_counts().await?;
    let mut names: Vec<String> = counts.iter().map(|c| c.agent.clone()).collect();
    names.extend(app.agent_names_seen());
    names.sort();
    names.dedup();
    let agents = names
        .into_iter()
        .map(|agent| {
            let c = counts.iter().find(|c| c.agent == agent);
            let workers: Vec<WorkerView> = app
                .workers_of(&agent)
                .into_iter()
                .map(|(worker, last_seen_at)| WorkerView {
                    worker,
                    last_seen_at,
                })
                .collect();
            let last_seen_at = workers.iter().map(|w| w.last_seen_at).max();
            AgentView {
                ready: c.map_or(0, |c| c.ready),
                running: c.map_or(0, |c| c.running),
                agent,
                workers,
                last_seen_at,
            }
        })
        .collect();
    Ok(Json(AgentList { agents }))
}

pub(crate) fn lease_of(
    claimed: &Transition,
    step: usize,
    now: overseer_core::Timestamp,
) -> Option<Lease> {
    let job = &claimed.job;
    let s = job.steps.get(step)?;
    let complete_by = s.lease_expires_at?;
    let undo = s.is_compensating();
    Some(Lease {
        lease_id: s.lease_id?,
        kind: if undo {
            LeaseKind::Compensate
        } else {
            LeaseKind::Work
        },
        undo_attempt: undo.then_some(s.comp_attempts),
        job_id: job.id,
        step: s.name.clone(),
        agent: s.claim_agent_of_lease().to_string(),
        attempt: s.attempt,
        payload: s.lease_payload().clone(),
        inputs: job.inputs_of(step),
        idempotency_key: job.step_idempotency_key(step),
        complete_by,
        lease_ms: now.until(complete_by).as_millis(),
        timeout_ms: s.lease_timeout().as_millis(),
    })
}

#[utoipa::path(post, path = "/v1/agents/{agent}/leases", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), request_body = LeaseRequest, responses((status = 200, description = "Leases, possibly none when nothing came in time", body = LeaseResponse), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn take_leases(
    State(app): State<App>,
    caller: Option<Extension<crate::auth::Caller>>,
    Path(agent): Path<String>,
    Body(req): Body<LeaseRequest>,
) -> Result<Json<LeaseResponse>> {
    let (max, wait) = lease_request_bounds(&app, &agent, &req)?;
    let _slot = match wait > Span::ZERO {
        true => Some(app.long_poll_slot(caller.as_ref().map(|c| c.0 .0.as_str()))?),
        false => None,
    };
    let deadline = tokio::time::Instant::now() + wait.as_std();
    let wake = app.notifier().agent(&agent);
    let empty = || Ok(Json(LeaseResponse { leases: vec![] }));
    loop {
        // Register for wake-ups before looking, so work that turns ready between the look and
        // the wait still wakes us.
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let throttled_until = match look_for_leases(&app, &agent, &req.worker, max).await? {
            Looked::Leased(leases) => return Ok(Json(LeaseResponse { leases })),
            Looked::Nothing { throttled_until } => throttled_until,
        };
        // `wait: 0s` asks for one look. (A wake-up kept for the next long-poll to wait, when
        // none was waiting, would otherwise race the deadline for a second look.)
        if tokio::time::Instant::now() >= deadline {
            return empty();
        }
        // Rate-limited: look again when the next lease may start, even if nothing wakes us.
        let retry = throttled_until
            .map(|t| tokio::time::Instant::now() + app.now().until(t).as_std())
            .unwrap_or(deadline)
            .min(deadline);
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(retry), if retry < deadline => {}
            _ = tokio::time::sleep_until(deadline) => return empty(),
            _ = app.shutdown().cancelled() => return empty(),
        }
    }
}

/// A lease request's `max` and `wait`, checked against the node's limits.
fn lease_request_bounds(app: &App, agent: &str, req: &LeaseRequest) -> Result<(usize, Span)> {
    check_agent(app, agent)?;
    let limits = app.limits();
    if req.worker.is_empty() || req.worker.len() > limits.name_bytes {
        return Err(ApiError::bad_request(
            "worker",
            format!("worker must be 1 to {} bytes", limits.name_bytes),
        ));
    }
    if agent.starts_with(overseer_core::push::AGENT_PREFIX) {
        return Err(ApiError::bad_request(
            "agent",
            "agent names starting with `http:` are HTTP targets the server calls itself",
        ));
    }
    let max = req.max.unwrap_or(1);
    if max == 0 || max > limits.leases_per_call {
        return Err(ApiError::bad_request(
            "max",
            format!("max must be between 1 and {}", limits.leases_per_call),
        ));
    }
    let wait = req.wait.unwrap_or(app.inner.lease_wait_default);
    if wait > limits.wait_max {
        return Err(ApiError::bad_request(
            "wait",
            format!("wait must be at most {}", limits.wait_max),
        ));
    }
    Ok((max, wait))
}

/// What one look of a long-poll found.
enum Looked {
    Leased(Vec<Lease>),
    /// Nothing leased; when rate-limited, the instant the next lease may start.
    Nothing {
        throttled_until: Option<Timestamp>,
    },
}

/// One claim of up to `max` steps for `agent`, merged with the agent's other requests on this
/// node. The wake-up this long-poll may have taken is passed on when the claim was full (more may
/// be ready) or failed.
async fn look_for_leases(app: &App, agent: &str, worker: &str, max: usize) -> Result<Looked> {
    app.worker_seen(agent, worker, app.now());
    let ask = crate::coalesce::LeaseAsk {
        worker: worker.to_string(),
        lease_ids: (0..max).map(|_| app.new_lease_id()).collect(),
    };
    let granted = match app.claim_leases(agent, ask).await {
        Ok(granted) => granted,
        Err(e) => {
            app.notifier().wake_agent(agent);
            return Err(e.into());
        }
    };
    let (result, now) = (granted.result, granted.now);
    if granted.claim_was_full {
        app.notifier().wake_agent(agent);
    }
    let claimed = result.claimed;
    let label = crate::metrics::AgentLabel {
        agent: agent.to_string(),
    };
    if claimed.is_empty() {
        app.metrics().claims_empty.get_or_create(&label).inc();
        return Ok(Looked::Nothing {
            throttled_until: result.throttled_until,
        });
    }
    let leases: Vec<Lease> = claimed
        .iter()
        .filter_map(|c| lease_of(&c.transition, c.step, now))
        .collect();
    for c in &claimed {
        app.committed(&c.transition);
    }
    let granted = app.metrics().leases_granted.get_or_create(&label);
    granted.inc_by(leases.len() as u64);
    Ok(Looked::Leased(leases))
}

/// Resolves a lease id to its step and applies a report through the core.
async fn report(
    app: &App,
    raw_lease: &str,
    make: impl FnOnce(usize, u32) -> Command,
) -> Result<Transition> {
    let lease_id = parse_lease_id(raw_lease)?;
    let lease = app
        .store()
        .lease_find(lease_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("lease {lease_id} not found")))?;
    let command = make(lease.step, lease.attempt);
    let name = command.name();
    match app
        .store()
        .job_apply(Apply::new(lease.job_id, command, app.now()))
        .await
    {
        Ok(t) => {
            reported(app, name, lease.step, &t);
            Ok(t)
        }
        Err(e) => {
            report_refused(app, name, &e);
            Err(e.into())
        }
    }
}

/// Applies one completion or failure as a batch of one, which resolves the lease and applies it
/// in one store transaction (a heartbeat, which answers more than a status, goes through
/// [`report`]).
async fn report_one(app: &App, raw_lease: &str, report: LeaseReport) -> Result<Transition> {
    let lease_id = parse_lease_id(raw_lease)?;
    let name = match report {
        LeaseReport::Complete { .. } => "complete",
        LeaseReport::Fail { .. } => "fail",
    };
    let mut outcomes = app.report_leases(vec![Report { lease_id, report }]).await?;
    let outcome = outcomes.pop().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the store answered no outcome for a report",
        )
    })?;
    match outcome {
        Ok(ReportApplied {
            lease,
            transition: t,
        }) => {
            reported(app, name, lease.step, &t);
            Ok(t)
        }
        Err(e @ overseer_store::Error::LeaseNotFound(_)) => Err(e.into()),
        Err(e) => {
            report_refused(app, name, &e);
            Err(e.into())
        }
    }
}

/// What follows a committed report: its metric, its effects, and a wake-up for the agent
/// whose slot under `max_concurrency` the ended lease may have freed.
pub(crate) fn reported(app: &App, name: &'static str, step: usize, t: &Transition) {
    let outcome = if matches!(t.reply, Reply::Refused(_)) {
        "lease_lost"
    } else {
        "ok"
    };
    app.metrics().report(name, outcome);
    app.committed(t);
    if name != "heartbeat" {
        if let Some(s) = t.job.steps.get(step) {
            app.notifier().wake_agent(s.claim_agent_of_lease());
        }
    }
}

pub(crate) fn report_refused(app: &App, name: &'static str, e: &overseer_store::Error) {
    let outcome = match e {
        overseer_store::Error::Rejected(_) => "lease_lost",
        _ => "error",
    };
    app.metrics().report(name, outcome);
}

#[utoipa::path(post, path = "/v1/leases/{lease_id}/heartbeat", tag = "leases", params(("lease_id" = LeaseId, Path, description = "A lease id")), request_body = Option<HeartbeatRequest>, responses((status = 200, description = "The lease extended; `cancel` says to stop", body = HeartbeatResponse), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn heartbeat(
    State(app): State<App>,
    Path(lease_id): Path<String>,
    OptionalBody(req): OptionalBody<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>> {
    let progress = req.progress;
    if let Some(p) = &progress {
        let size = serde_json::to_vec(p).map(|v| v.len()).unwrap_or(0);
        let max = app.limits().progress_bytes;
        if size > max {
            return Err(ApiError::too_large(
                "progress",
                format!("progress is {size} bytes, more than the limit of {max}"),
            ));
        }
    }
    let t = report(&app, &lease_id, |step, attempt| Command::Heartbeat {
        step,
        attempt,
        progress,
    })
    .await?;
    match t.reply {
        Reply::Heartbeat {
            lease_expires_at,
            cancel,
        } => Ok(Json(HeartbeatResponse {
            complete_by: lease_expires_at,
            lease_ms: app.now().until(lease_expires_at).as_millis(),
            cancel,
        })),
        Reply::Refused(r) => Err(r.into()),
        Reply::Done => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "unexpected reply to a heartbeat",
        )),
    }
}

fn report_answer(t: &Transition, lease_id: &str) -> Result<Json<Value>> {
    match &t.reply {
        Reply::Refused(r) => Err(r.clone().into()),
        _ => Ok(Json(
            json!({ "lease_id": lease_id, "job_id": t.job.id, "job_state": t.job.state }),
        )),
    }
}

#[utoipa::path(post, path = "/v1/leases/{lease_id}/complete", tag = "leases", params(("lease_id" = LeaseId, Path, description = "A lease id")), request_body = Option<CompleteRequest>, responses((status = 200, description = "`{lease_id, job_id, job_state}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn complete(
    State(app): State<App>,
    Path(lease_id): Path<String>,
    OptionalBody(req): OptionalBody<CompleteRequest>,
) -> Result<Json<Value>> {
    let result = req.result.unwrap_or(Value::Null);
    check_result_size(&app, &result, "result")?;
    let t = report_one(&app, &lease_id, LeaseReport::Complete { result }).await?;
    report_answer(&t, &lease_id)
}

/// Cuts an error message to the configured size (on a character boundary), marking the cut.
fn cut_error(app: &App, mut error: String) -> String {
    let max = app.limits().error_bytes;
    if error.len() > max {
        let mut cut = max;
        while !error.is_char_boundary(cut) {
            cut -= 1;
        }
        error.truncate(cut);
        error.push('…');
    }
    error
}

/// Refuses a result over the size limit; `field` names it in the problem.
fn check_result_size(app: &App, result: &Value, field: &str) -> Result<()> {
    let size = serde_json::to_vec(result).map(|v| v.len()).unwrap_or(0);
    let max = app.limits().result_bytes;
    if size > max {
        return Err(ApiError::too_large(
            field,
            format!("result is {size} bytes, more than the limit of {max}"),
        ));
    }
    Ok(())
}

/// `POST /v1/leases:report`: many leases' outcomes in one call and one commit. Each report is
/// checked, fenced and applied as its own `complete`/`fail` call would be, and answered in
/// `results` with the status that call would have had; the call itself fails only when the
/// request is malformed or the store cannot commit (then none of them was applied).
#[utoipa::path(post, path = "/v1/leases:report", tag = "leases", request_body = ReportBatch, responses((status = 200, description = "One answer per report, in order", body = ReportBatchResponse), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn report_batch(
    State(app): State<App>,
    Body(req): Body<ReportBatch>,
) -> Result<Json<ReportBatchResponse>> {
    let max = app.limits().leases_per_call;
    if req.reports.is_empty() || req.reports.len() > max {
        return Err(ApiError::bad_request(
            "reports",
            format!("reports must hold between 1 and {max} lease outcomes"),
        ));
    }
    app.metrics().report_batches.inc();
    app.metrics()
        .reports_batched
        .inc_by(req.reports.len() as u64);
    let mut results: Vec<Option<ReportResult>> = vec![None; req.reports.len()];
    let mut batch = Vec::with_capacity(req.reports.len());
    let mut positions = Vec::with_capacity(req.reports.len());
    for (i, report) in req.reports.into_iter().enumerate() {
        let lease_id = report.lease_id();
        let report = match report {
            LeaseOutcome::Complete { result, .. } => {
                let result = result.unwrap_or(Value::Null);
                if let Err(e) = check_result_size(&app, &result, &format!("reports[{i}].result")) {
                    results[i] = Some(report_problem(lease_id, e));
                    continue;
                }
                LeaseReport::Complete { result }
            }
            LeaseOutcome::Fail {
                error, retryable, ..
            } => LeaseReport::Fail {
                error: cut_error(&app, error),
                retryable,
                jitter: app.jitter(),
            },
        };
        positions.push((i, command_name(&report), lease_id));
        batch.push(Report { lease_id, report });
    }
    let outcomes = if batch.is_empty() {
        Vec::new()
    } else {
        app.report_leases(batch).await?
    };
    for ((i, name, lease_id), outcome) in positions.into_iter().zip(outcomes) {
        results[i] = Some(match outcome {
            Ok(ReportApplied {
                lease,
                transition: t,
            }) => {
                reported(&app, name, lease.step, &t);
                match &t.reply {
                    Reply::Refused(r) => report_problem(lease_id, r.clone().into()),
                    _ => ReportResult {
                        lease_id,
                        status: StatusCode::OK.as_u16(),
                        job_id: Some(t.job.id),
                        job_state: Some(t.job.state),
                        problem: None,
                    },
                }
            }
            Err(e) => {
                report_refused(&app, name, &e);
                report_problem(lease_id, e.into())
            }
        });
    }
    let results = results
        .into_iter()
        .map(|r| r.expect("every report is answered"))
        .collect();
    Ok(Json(ReportBatchResponse { results }))
}

fn command_name(report: &LeaseReport) -> &'static str {
    match report {
        LeaseReport::Complete { .. } => "complete",
        LeaseReport::Fail { .. } => "fail",
    }
}

fn report_problem(lease_id: LeaseId, e: ApiError) -> ReportResult {
    let problem = e.problem();
    ReportResult {
        lease_id,
        status: problem.status,
        job_id: None,
        job_state: None,
        problem: Some(problem),
    }
}

#[utoipa::path(post, path = "/v1/leases/{lease_id}/fail", tag = "leases", params(("lease_id" = LeaseId, Path, description = "A lease id")), request_body = FailRequest, responses((status = 200, description = "`{lease_id, job_id, job_state}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn fail(
    State(app): State<App>,
    Path(lease_id): Path<String>,
    Body(req): Body<FailRequest>,
) -> Result<Json<Value>> {
    let error = cut_error(&app, req.error);
    let jitter = app.jitter();
    let retryable = req.retryable;
    let report = LeaseReport::Fail {
        error,
        retryable,
        jitter,
    };
    let t = report_one(&app, &lease_id, report).await?;
    report_answer(&t, &lease_id)
}

async fn operator(app: &App, raw_id: &str, command: Command) -> Result<Json<JobView>> {
    let id = parse_job_id(raw_id)?;
    let what = command.name();
    let t = app
        .store()
        .job_apply(Apply::new(id, command, app.now()))
        .await?;
    tracing::info!(job = %id, action = what, state = %t.job.state, "operator action");
    app.committed(&t);
    Ok(Json(app.view(&t.job)))
}

fn step_index(job: &Job, name: &str) -> Result<usize> {
    job.step_index(name)
        .ok_or_else(|| ApiError::not_found(format!("job {} has no step `{name}`", job.id)))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/steps/{name}/retry", tag = "jobs", params(("id" = JobId, Path, description = "A job id"), ("name" = String, Path, description = "A step name", min_length = 1, max_length = 200)), request_body = Option<OperatorRequest>, responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn retry_step(
    State(app): State<App>,
    Path((id, name)): Path<(String, String)>,
    OptionalBody(req): OptionalBody<OperatorRequest>,
) -> Result<Json<JobView>> {
    let job = app.job(parse_job_id(&id)?).await?;
    let step = step_index(&job, &name)?;
    operator(
        &app,
        &id,
        Command::Retry {
            step,
            by: req.by,
            reason: req.reason,
        },
    )
    .await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/steps/{name}/skip", tag = "jobs", params(("id" = JobId, Path, description = "A job id"), ("name" = String, Path, description = "A step name", min_length = 1, max_length = 200)), request_body = Option<OperatorRequest>, responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn skip_step(
    State(app): State<App>,
    Path((id, name)): Path<(String, String)>,
    OptionalBody(req): OptionalBody<OperatorRequest>,
) -> Result<Json<JobView>> {
    let job = app.job(parse_job_id(&id)?).await?;
    let step = step_index(&job, &name)?;
    operator(
        &app,
        &id,
        Command::Skip {
            step,
            by: req.by,
            reason: req.reason,
        },
    )
    .await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/resume", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), request_body = Option<OperatorRequest>, responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn resume_job(
    State(app): State<App>,
    Path(id): Path<String>,
    OptionalBody(req): OptionalBody<OperatorRequest>,
) -> Result<Json<JobView>> {
    operator(
        &app,
        &id,
        Command::Resume {
            by: req.by,
            reason: req.reason,
        },
    )
    .await
}

/// Runs a failed or cancelled job again as a new job (see `core::rerun`).
#[utoipa::path(post, path = "/v1/jobs/{id}/rerun", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), request_body = Option<RerunRequest>, responses((status = 202, description = "The new job, committed; its `rerun_of` names this job, and `Location` names it", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 the job is not failed or cancelled, was rerun already (`already-rerun`), or still has a step running, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn rerun_job(
    State(app): State<App>,
    caller: CallerExt,
    Path(id): Path<String>,
    OptionalBody(req): OptionalBody<RerunRequest>,
) -> Result<Response> {
    let id = parse_job_id(&id)?;
    req.validate()?;
    let rerun = RerunJob {
        old: id,
        new: app.new_job_id(),
        options: req.options(),
        submitted_by: caller.as_ref().and_then(|c| c.0.submitter()),
        now: app.now(),
    };
    let reran = app.store().job_rerun(rerun).await?;
    let new = &reran.created.job;
    let kept = reran
        .created
        .events
        .iter()
        .filter(|e| e.kind == EventKind::StepKept);
    tracing::info!(job = %id, rerun = %new.id, kept = kept.count(), "job rerun");
    app.metrics().jobs_submitted.inc();
    app.committed(&reran.link);
    app.committed(&reran.created);
    Ok(job_created(&app, new, true, false))
}

/// Prometheus text; store-wide gauges are read at scrape time.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text", body = String, content_type = "application/openmetrics-text"), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn metrics(State(app): State<App>) -> Result<Response> {
    let m = app.metrics();
    let counts = app.store().agents_counts().await?;
    m.steps_ready.clear();
    m.steps_running.clear();
    for c in counts {
        let label = crate::metrics::AgentLabel { agent: c.agent };
        m.steps_ready.get_or_create(&label).set(c.ready as i64);
        m.steps_running.get_or_create(&label).set(c.running as i64);
    }
    let DeliveryCounts { waiting, dead } = app.store().deliveries_counts().await?;
    m.deliveries_waiting.set(waiting as i64);
    m.deliveries_dead.set(dead as i64);
    let text = m.encode().map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "cannot encode metrics",
        )
    })?;
    let mut res = text.into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(res)
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

/// `PUT /v1/agents/{agent}/limits` body.
#[derive(serde::Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct LimitsRequest {
    /// Leases in flight at most, from 1 (pause the agent to stop it).
    #[serde(default, deserialize_with = "whole_number")]
    #[schema(minimum = 1, maximum = 4294967295_u64, format = Int64)]
    max_concurrency: Option<u32>,
    /// Leases started per second at most: more than 0, at most 1000000.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 1000000)]
    rate: Option<f64>,
}

/// A count given as a JSON number: `377` or, as JSON Schema also counts it an integer, `377.0`.
fn whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u32>, D::Error> {
    use serde::de::Error;
    let Some(n) = <Option<f64> as serde::Deserialize>::deserialize(d)? else {
        return Ok(None);
    };
    if n.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&n) {
        return Err(D::Error::custom(format!(
            "`{n}` is not a whole number from 0 to {}",
            u32::MAX
        )));
    }
    Ok(Some(n as u32))
}

fn settings_view(agent: &str, s: &AgentSettings) -> Value {
    json!({ "agent": agent, "max_concurrency": s.max_concurrency, "rate": s.rate, "paused": s.paused })
}

#[utoipa::path(get, path = "/v1/agents/{agent}/limits", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), responses((status = 200, description = "`{agent, max_concurrency, rate, paused}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn get_limits(State(app): State<App>, Path(agent): Path<String>) -> Result<Json<Value>> {
    check_agent(&app, &agent)?;
    let s = app.store().agent_settings_get(&agent).await?;
    Ok(Json(settings_view(&agent, &s)))
}

#[utoipa::path(put, path = "/v1/agents/{agent}/limits", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), request_body = LimitsRequest, responses((status = 200, description = "`{agent, max_concurrency, rate, paused}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn put_limits(
    State(app): State<App>,
    Path(agent): Path<String>,
    Body(req): Body<LimitsRequest>,
) -> Result<Json<Value>> {
    check_agent(&app, &agent)?;
    if req.max_concurrency == Some(0) {
        return Err(ApiError::bad_request(
            "max_concurrency",
            "must be at least 1 (pause the agent to stop it)",
        ));
    }
    if let Some(rate) = req.rate {
        if !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0) {
            return Err(ApiError::bad_request(
                "rate",
                "leases per second: more than 0, at most 1000000",
            ));
        }
    }
    let mut settings = app.store().agent_settings_get(&agent).await?;
    settings.max_concurrency = req.max_concurrency;
    settings.rate = req.rate;
    let s = app
        .store()
        .agent_settings_put(SettingsUpdate {
            agent: agent.to_string(),
            settings,
            now: app.now(),
        })
        .await?;
    app.notifier().wake_agent(&agent);
    Ok(Json(settings_view(&agent, &s)))
}

async fn set_paused(app: &App, agent: &str, paused: bool) -> Result<Json<Value>> {
    check_agent(app, agent)?;
    let mut settings = app.store().agent_settings_get(agent).await?;
    settings.paused = paused;
    let s = app
        .store()
        .agent_settings_put(SettingsUpdate {
            agent: agent.to_string(),
            settings,
            now: app.now(),
        })
        .await?;
    tracing::info!(agent, paused, "agent pause changed");
    app.notifier().wake_agent(agent);
    Ok(Json(settings_view(agent, &s)))
}

#[utoipa::path(post, path = "/v1/agents/{agent}/pause", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), responses((status = 200, description = "The settings", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn pause_agent(State(app): State<App>, Path(agent): Path<String>) -> Result<Json<Value>> {
    set_paused(&app, &agent, true).await
}

#[utoipa::path(post, path = "/v1/agents/{agent}/resume", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), responses((status = 200, description = "The settings", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn resume_agent(State(app): State<App>, Path(agent): Path<String>) -> Result<Json<Value>> {
    set_paused(&app, &agent, false).await
}

#[utoipa::path(get, path = "/v1/ordering-keys/{key}", tag = "jobs", params(("key" = String, Path, description = "An ordering key", min_length = 1, max_length = 200)), responses((status = 200, description = "`{key, head, waiting}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn ordering_key(
    State(app): State<App>,
    own: OwnExt,
    Path(key): Path<String>,
) -> Result<Json<Value>> {
    if key.is_empty() || key.len() > app.limits().name_bytes {
        return Err(ApiError::bad_request(
            "key",
            format!("ordering keys are 1 to {} bytes", app.limits().name_bytes),
        ));
    }
    let status = app.store().ordering_key_status(&key).await?;
    Ok(Json(json!({
        "key": status.key,
        // Someone else's job is not shown to a caller limited to its own (the count stays).
        "head": status.head.as_ref().filter(|j| !hidden(j, &own)).map(|j| app.view(j)),
        "waiting": status.waiting,
    })))
}

fn schedule_view(s: &Schedule) -> Value {
    json!({
        "name": s.name,
        "cron": s.spec.cron,
        "timezone": s.spec.timezone,
        "overlap": s.spec.overlap,
        "misfire": s.spec.misfire,
        "job": s.spec.job,
        "paused": s.paused,
        "next_fire_at": s.next_fire_at,
        "last_fire_at": s.last_fire_at,
        "last_job_id": s.last_job_id,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
    })
}

#[utoipa::path(post, path = "/v1/schedules", tag = "schedules", request_body = ScheduleSpec, responses((status = 201, description = "Created", body = serde_json::Value), (status = 200, description = "The same definition already exists", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn create_schedule(
    State(app): State<App>,
    Body(spec): Body<ScheduleSpec>,
) -> Result<Response> {
    let cron = spec.validate(app.limits())?;
    check_outbound(&app, &spec.job, "job.")?;
    let now = app.now();
    let schedule = Schedule {
        name: spec.name.clone(),
        next_fire_at: cron.next_after(now),
        spec,
        paused: false,
        last_fire_at: None,
        last_job_id: None,
        created_at: now,
        updated_at: now,
    };
    let ScheduleCreated {
        schedule: stored,
        created,
    } = app
        .store()
        .schedule_create(schedule)
        .await
        .map_err(|e| match e {
            overseer_store::Error::ScheduleConflict(_) => ApiError {
                field: Some("name".into()),
                ..ApiError::conflict("schedule-exists", e.to_string())
            },
            other => other.into(),
        })?;
    if let Some(at) = stored.next_fire_at {
        app.notifier().due_at(at);
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut res = (status, Json(schedule_view(&stored))).into_response();
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/schedules/{}", stored.name)) {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(res)
}

#[utoipa::path(get, path = "/v1/schedules", tag = "schedules", responses((status = 200, description = "`{schedules: [...]}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn list_schedules(State(app): State<App>) -> Result<Json<Value>> {
    let all = app.store().schedules_list().await?;
    Ok(Json(
        json!({ "schedules": all.iter().map(schedule_view).collect::<Vec<_>>() }),
    ))
}

async fn find_schedule(app: &App, name: &str) -> Result<Schedule> {
    app.store()
        .schedule_get(name)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("schedule `{name}` not found")))
}

#[utoipa::path(get, path = "/v1/schedules/{name}", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), responses((status = 200, description = "The schedule", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn get_schedule(State(app): State<App>, Path(name): Path<String>) -> Result<Json<Value>> {
    Ok(Json(schedule_view(&find_schedule(&app, &name).await?)))
}

#[utoipa::path(put, path = "/v1/schedules/{name}", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), request_body = ScheduleSpec, responses((status = 200, description = "The schedule as replaced: cron, timezone, job, overlap and misfire changed together; the next due time counted from now under the new pattern (kept when the pattern and zone did not change), never a due time that already fired; a paused schedule stays paused", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it; `name` must be the schedule's own), 401/403 auth, 404 not found, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn update_schedule(
    State(app): State<App>,
    Path(name): Path<String>,
    Body(spec): Body<ScheduleSpec>,
) -> Result<Json<Value>> {
    if spec.name != name {
        return Err(ApiError::bad_request(
            "name",
            format!(
                "`{}` is not the schedule being replaced (`{name}`); a schedule cannot be renamed",
                spec.name
            ),
        ));
    }
    let cron = spec.validate(app.limits())?;
    check_outbound(&app, &spec.job, "job.")?;
    let now = app.now();
    let s = app
        .store()
        .schedule_update(ScheduleUpdate { spec, cron, now })
        .await?;
    tracing::info!(schedule = %s.name, cron = %s.spec.cron, timezone = %s.spec.timezone,
        next = ?s.next_fire_at, "schedule replaced");
    if let Some(at) = s.next_fire_at {
        app.notifier().due_at(at);
    }
    Ok(Json(schedule_view(&s)))
}

#[utoipa::path(delete, path = "/v1/schedules/{name}", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), responses((status = 204, description = "Deleted"), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn delete_schedule(State(app): State<App>, Path(name): Path<String>) -> Result<StatusCode> {
    if app.store().schedule_delete(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("schedule `{name}` not found")))
    }
}

#[utoipa::path(post, path = "/v1/schedules/{name}/pause", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), responses((status = 200, description = "The schedule", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn pause_schedule(State(app): State<App>, Path(name): Path<String>) -> Result<Json<Value>> {
    find_schedule(&app, &name).await?;
    let s = app
        .store()
        .schedule_set_paused(SchedulePause {
            name: name.to_string(),
            paused: true,
            next_fire_at: None,
            now: app.now(),
        })
        .await?;
    Ok(Json(schedule_view(&s)))
}

#[utoipa::path(post, path = "/v1/schedules/{name}/resume", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), responses((status = 200, description = "The schedule", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
async fn resume_schedule(State(app): State<App>, Path(name): Path<String>) -> Result<Json<Value>> {
    let s = find_schedule(&app, &name).await?;
    let cron = CronSchedule::parse(&s.spec.cron, &s.spec.timezone)?;
    let now = app.now();
    // Resuming starts from now: the paused window is not caught up.
    let s = app
        .store()
        .schedule_set_paused(SchedulePause {
            name: name.to_string(),
            paused: false,
            next_fire_at: schedule::resume_at(&cron, s.last_fire_at, now),
            now,
        })
        .await?;
    if let Some(at) = s.next_fire_at {
        app.notifier().due_at(at);
    }
    Ok(Json(schedule_view(&s)))
}
