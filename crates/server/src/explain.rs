//! Adds the waiting reason (`overseer_core::waiting`) to a job as the API shows it: gathers what
//! the pure function needs (agent settings, running counts, last worker polls, the ordering
//! key's head) and writes `waiting_reason` into the job and each step still waiting.

use std::collections::HashMap;

use overseer_core::waiting::{job_waiting, step_waiting, AgentContext, KeyHead};
use overseer_core::{Job, JobState};
use serde_json::Value;

use crate::error::Result;
use crate::App;

/// `JobView` of `job` with `waiting_reason: {code, text}` on a pending job and on every step
/// that is neither running nor finished.
pub async fn job_with_reasons(app: &App, job: &Job) -> Result<Value> {
    let mut view = app.view(job);
    if !job.state.is_terminal() {
        let now = app.now();
        let head = key_head(app, job).await?;
        let agents = agent_contexts(app, job).await?;
        view.waiting_reason = job_waiting(job, head.as_ref(), now);
        for (step, out) in job.steps.iter().zip(view.steps.iter_mut()) {
            let ctx = agents
                .get(step.claim_agent_of_lease())
                .cloned()
                .unwrap_or_default();
            out.waiting_reason = step_waiting(job, step, &ctx, head.as_ref(), now);
        }
    }
    Ok(serde_json::to_value(view).unwrap_or(Value::Null))
}

/// The head of the job's ordering key, only looked up while the job is pending behind it.
async fn key_head(app: &App, job: &Job) -> Result<Option<KeyHead>> {
    let Some(key) = job.ordering_key.as_deref() else {
        return Ok(None);
    };
    if job.state != JobState::Pending {
        return Ok(None);
    }
    let status = app.store().ordering_key_status(key).await?;
    Ok(status.head.map(|h| KeyHead {
        key: key.to_string(),
        job: h.id,
        state: h.state,
    }))
}

/// Settings, running count and last poll of each agent name the job's steps use.
async fn agent_contexts(app: &App, job: &Job) -> Result<HashMap<String, AgentContext>> {
    let counts = app.store().agents_counts().await?;
    let mut out = HashMap::new();
    for step in &job.steps {
        // A step being undone waits on its undo's agent name.
        let agent = step.claim_agent_of_lease();
        if out.contains_key(agent) || step.state.is_settled() {
            continue;
        }
        let settings = app.store().agent_settings_get(agent).await?;
        let running = counts
            .iter()
            .find(|c| c.agent == agent)
            .map_or(0, |c| c.running);
        let last_poll = app.workers_of(agent).into_iter().map(|w| w.1).max();
        let circuit_open_until = {
            use overseer_core::push::BreakerState;
            let breakers = app
                .http_breakers()
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match breakers.get(agent).map(|b| b.state) {
                Some(BreakerState::Open { until }) => Some(until),
                Some(BreakerState::HalfOpen { .. }) => {
                    Some(overseer_core::Timestamp::from_millis(0))
                }
                _ => None,
            }
        };
        out.insert(
            agent.to_string(),
            AgentContext {
                paused: settings.paused,
                max_concurrency: settings.max_concurrency,
                running,
                rate: settings.rate,
                last_poll,
                circuit_open_until,
            },
        );
    }
    Ok(out)
}
