//! Leases: taking them (with long-polls), heartbeats, and reports one by one or in batches.

use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::Json;
use overseer_core::machine::Reply;
use overseer_core::wire::{
    CompleteRequest, FailRequest, HeartbeatRequest, HeartbeatResponse, Lease, LeaseKind,
    LeaseOutcome, LeaseRequest, LeaseResponse, Problem, ReportBatch, ReportBatchResponse,
    ReportResult,
};
use overseer_core::{Command, LeaseId, Span, Timestamp, Transition};
use overseer_store::{Apply, LeaseReport, Report, ReportApplied};
use serde_json::{json, Value};

use super::{check_agent, parse_lease_id, Body, OptionalBody};
use crate::error::{ApiError, Result};
use crate::App;

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
pub(super) async fn take_leases(
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
pub(super) async fn heartbeat(
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
pub(super) async fn complete(
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
pub(super) async fn report_batch(
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
pub(super) async fn fail(
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
