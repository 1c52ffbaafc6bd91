//! Jobs: submit (one or a batch), read, list, wait for, reschedule, delete, cancel, rerun, and
//! the operator's actions on a job's steps.

use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use overseer_core::machine::admit;
use overseer_core::spec::JobSpec;
use overseer_core::wire::{
    BatchRequest, BatchResponse, BatchSummary, EventList, JobList, JobView, OperatorRequest,
    Problem, RerunRequest, RescheduleRequest, SubmittedJob,
};
use overseer_core::{Command, EventKind, Job, JobId, JobState, Span};
use overseer_store::{Apply, EventPage, JobQuery, NewJob, RerunJob, Submitted};
use serde_json::Value;

use super::{
    check_outbound, hidden, parse_job_id, parse_span, query_pairs, query_time, Body, CallerExt,
    OptionalBody, OwnExt,
};
use crate::error::{ApiError, Result};
use crate::prefer;
use crate::App;

/// Builds the job a spec describes, in its admitted state, recording who submitted it.
fn admit_spec(app: &App, spec: &JobSpec, caller: &CallerExt) -> NewJob {
    let now = app.now();
    let mut job = Job::from_spec(app.new_job_id(), spec, now);
    job.submitted_by = caller.as_ref().and_then(|c| c.0.submitter());
    NewJob {
        transition: admit(job, now),
    }
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

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = JobSpec, params(("Prefer" = Option<String>, Header, description = "`return=minimal`: answer the job's id, state and whether this request created it (`SubmittedJob`, with `Preference-Applied: return=minimal`) instead of the whole job")), responses((status = 202, description = "Accepted and committed; `Location` names the job; a `SubmittedJob` under `Prefer: return=minimal`", body = JobView), (status = 200, description = "A job with this idempotency key and body already exists", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn submit(
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
pub(super) async fn submit_batch(
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
pub(super) async fn get_job(
    State(app): State<App>,
    own: OwnExt,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let job = visible_job(&app, parse_job_id(&id)?, &own).await?;
    Ok(Json(crate::explain::job_with_reasons(&app, &job).await?))
}

/// Removes a finished job now, with its steps and history, as its retention would later.
#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), responses((status = 204, description = "The job is gone; its idempotency key may be used again"), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 the job is not finished, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn delete_job(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<StatusCode> {
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
pub(super) async fn reschedule_job(
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

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), responses((status = 200, description = "Its history, oldest first", body = EventList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn job_events(
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

const LIST_LIMIT_DEFAULT: usize = 50;
const LIST_LIMIT_MAX: usize = 500;

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", params(("state" = Option<JobState>, Query, description = "Only jobs in this state"), ("label" = Option<String>, Query, description = "key:value; repeat to require several", pattern = "^[^:]*:"), ("agent" = Option<String>, Query, description = "Only jobs with a step of this agent name"), ("since" = Option<overseer_core::Timestamp>, Query, description = "Created at or after (RFC 3339)"), ("until" = Option<overseer_core::Timestamp>, Query, description = "Created before (RFC 3339)"), ("id_prefix" = Option<String>, Query, description = "Ids starting with this (4+ hex digits, dashes where a job id has them)", pattern = "^([0-9a-fA-F]{4,8}|[0-9a-fA-F]{8}-[0-9a-fA-F]{0,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{0,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{0,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{0,12})$"), ("limit" = Option<u32>, Query, description = "1 to 500, default 50", minimum = 1, maximum = 500), ("cursor" = Option<JobId>, Query, description = "A next_cursor from an earlier page")), responses((status = 200, description = "Newest first", body = JobList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn list_jobs(
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

#[utoipa::path(get, path = "/v1/jobs/{id}/wait", tag = "jobs", params(("id" = JobId, Path, description = "A job id"), ("timeout" = Option<Span>, Query, description = "How long to wait, e.g. 30s (at most limits.wait_max, 60s)")), responses((status = 200, description = "The job, terminal or as it is when the timeout passed", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn wait_job(
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
pub(super) async fn cancel_job(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<JobView>> {
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

/// An operator's action on step `name` of job `raw_id`: `command` is built from the step's
/// position.
async fn step_operator(
    app: &App,
    raw_id: &str,
    name: &str,
    command: impl FnOnce(usize) -> Command,
) -> Result<Json<JobView>> {
    let job = app.job(parse_job_id(raw_id)?).await?;
    let step = step_index(&job, name)?;
    operator(app, raw_id, command(step)).await
}

fn step_index(job: &Job, name: &str) -> Result<usize> {
    job.step_index(name)
        .ok_or_else(|| ApiError::not_found(format!("job {} has no step `{name}`", job.id)))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/steps/{name}/retry", tag = "jobs", params(("id" = JobId, Path, description = "A job id"), ("name" = String, Path, description = "A step name", min_length = 1, max_length = 200)), request_body = Option<OperatorRequest>, responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn retry_step(
    State(app): State<App>,
    Path((id, name)): Path<(String, String)>,
    OptionalBody(req): OptionalBody<OperatorRequest>,
) -> Result<Json<JobView>> {
    step_operator(&app, &id, &name, |step| Command::Retry {
        step,
        by: req.by,
        reason: req.reason,
    })
    .await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/steps/{name}/skip", tag = "jobs", params(("id" = JobId, Path, description = "A job id"), ("name" = String, Path, description = "A step name", min_length = 1, max_length = 200)), request_body = Option<OperatorRequest>, responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn skip_step(
    State(app): State<App>,
    Path((id, name)): Path<(String, String)>,
    OptionalBody(req): OptionalBody<OperatorRequest>,
) -> Result<Json<JobView>> {
    step_operator(&app, &id, &name, |step| Command::Skip {
        step,
        by: req.by,
        reason: req.reason,
    })
    .await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/resume", tag = "jobs", params(("id" = JobId, Path, description = "A job id")), request_body = Option<OperatorRequest>, responses((status = 200, description = "The job after the request", body = JobView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn resume_job(
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
pub(super) async fn rerun_job(
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
