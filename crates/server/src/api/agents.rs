//! Agents: who is connected, per-agent limits and pauses, and ordering keys.

use axum::extract::{Path, State};
use axum::Json;
use overseer_core::wire::{AgentList, AgentView, Problem, WorkerView};
use overseer_store::{AgentSettings, SettingsUpdate};
use serde_json::{json, Value};

use super::{check_agent, hidden, Body, OwnExt};
use crate::error::{ApiError, Result};
use crate::App;

#[utoipa::path(get, path = "/v1/agents", tag = "agents", responses((status = 200, description = "Each agent name with ready and running counts and workers", body = AgentList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn list_agents(State(app): State<App>) -> Result<Json<AgentList>> {
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

/// `PUT /v1/agents/{agent}/limits` body.
#[derive(serde::Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsRequest {
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
pub(super) async fn get_limits(
    State(app): State<App>,
    Path(agent): Path<String>,
) -> Result<Json<Value>> {
    check_agent(&app, &agent)?;
    let s = app.store().agent_settings_get(&agent).await?;
    Ok(Json(settings_view(&agent, &s)))
}

#[utoipa::path(put, path = "/v1/agents/{agent}/limits", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), request_body = LimitsRequest, responses((status = 200, description = "`{agent, max_concurrency, rate, paused}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn put_limits(
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
pub(super) async fn pause_agent(
    State(app): State<App>,
    Path(agent): Path<String>,
) -> Result<Json<Value>> {
    set_paused(&app, &agent, true).await
}

#[utoipa::path(post, path = "/v1/agents/{agent}/resume", tag = "agents", params(("agent" = String, Path, description = "An agent name", min_length = 1, max_length = 200)), responses((status = 200, description = "The settings", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn resume_agent(
    State(app): State<App>,
    Path(agent): Path<String>,
) -> Result<Json<Value>> {
    set_paused(&app, &agent, false).await
}

#[utoipa::path(get, path = "/v1/ordering-keys/{key}", tag = "jobs", params(("key" = String, Path, description = "An ordering key", min_length = 1, max_length = 200)), responses((status = 200, description = "`{key, head, waiting}`", body = serde_json::Value), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn ordering_key(
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
