//! Cron schedules: create, read, change, pause, resume, delete.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use overseer_core::schedule::{self, CronSchedule, ScheduleSpec};
use overseer_core::wire::Problem;
use overseer_store::{Schedule, ScheduleCreated, SchedulePause, ScheduleUpdate};
use serde_json::{json, Value};

use super::{check_outbound, Body};
use crate::error::{ApiError, Result};
use crate::App;

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
pub(super) async fn create_schedule(
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
pub(super) async fn list_schedules(State(app): State<App>) -> Result<Json<Value>> {
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
pub(super) async fn get_schedule(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    Ok(Json(schedule_view(&find_schedule(&app, &name).await?)))
}

#[utoipa::path(put, path = "/v1/schedules/{name}", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), request_body = ScheduleSpec, responses((status = 200, description = "The schedule as replaced: cron, timezone, job, overlap and misfire changed together; the next due time counted from now under the new pattern (kept when the pattern and zone did not change), never a due time that already fired; a paused schedule stays paused", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it; `name` must be the schedule's own), 401/403 auth, 404 not found, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn update_schedule(
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
pub(super) async fn delete_schedule(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<StatusCode> {
    if app.store().schedule_delete(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("schedule `{name}` not found")))
    }
}

#[utoipa::path(post, path = "/v1/schedules/{name}/pause", tag = "schedules", params(("name" = String, Path, description = "A schedule name", min_length = 1, max_length = 200)), responses((status = 200, description = "The schedule", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn pause_schedule(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
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
pub(super) async fn resume_schedule(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
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
