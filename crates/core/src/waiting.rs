//! Why a step (or a pending job) is not running: one sentence for the operator plus a stable
//! machine code. Pure: the caller gathers the agent's settings, the ordering key's head and the
//! last worker poll, and passes `now`.

use serde::{Deserialize, Serialize};

use crate::id::JobId;
use crate::job::{CompPhase, Job, JobState, Step, StepState};
use crate::time::Timestamp;

/// A worker that has not polled for this long is treated as gone.
pub const NO_WORKER_AFTER_MS: i64 = 60_000;

/// The answer: `code` is stable for tools, `text` is for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WaitingReason {
    pub code: String,
    pub text: String,
}

impl WaitingReason {
    fn new(code: &str, text: impl Into<String>) -> Self {
        WaitingReason {
            code: code.to_string(),
            text: text.into(),
        }
    }
}

/// What the node knows about the agent name that runs a step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentContext {
    pub paused: bool,
    pub max_concurrency: Option<u32>,
    /// Leases of this agent name in flight now.
    pub running: u64,
    pub rate: Option<f64>,
    /// The latest lease request seen from any worker of this agent name (this node's view).
    pub last_poll: Option<Timestamp>,
    /// For an HTTP target (`http:` agent name): this node's circuit breaker for the host is
    /// open; `Some(until)` while cooling down, `Some(now or earlier)` while a probe is due.
    pub circuit_open_until: Option<Timestamp>,
}

/// The head of the job's ordering key, when the job has one.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyHead {
    pub key: String,
    pub job: JobId,
    pub state: JobState,
}

/// Why `job` as a whole is not running yet; `None` unless it is `pending`.
pub fn job_waiting(job: &Job, head: Option<&KeyHead>, now: Timestamp) -> Option<WaitingReason> {
    if job.state != JobState::Pending {
        return None;
    }
    if let Some(head) = head.filter(|h| h.job != job.id) {
        return Some(WaitingReason::new(
            "ordering_key",
            format!(
                "ordered key `{}` held by job {} ({})",
                head.key, head.job, head.state
            ),
        ));
    }
    match job.run_at {
        Some(at) if at > now => Some(WaitingReason::new(
            "run_at",
            format!(
                "run_at in {} ({at})",
                human_span(at.as_millis() - now.as_millis())
            ),
        )),
        _ => Some(WaitingReason::new(
            "starting",
            "due now: the supervisor starts it on its next sweep",
        )),
    }
}

/// Why `step` is not running; `None` when it is running or finished for good.
pub fn step_waiting(
    job: &Job,
    step: &Step,
    agent: &AgentContext,
    head: Option<&KeyHead>,
    now: Timestamp,
) -> Option<WaitingReason> {
    if job.state.is_terminal() {
        return None;
    }
    if job.state == JobState::Blocked && !step.state.is_settled() {
        let why = job
            .blocked_reason
            .as_deref()
            .unwrap_or("no reason recorded");
        return Some(WaitingReason::new(
            "job_blocked",
            format!("job blocked: {why}"),
        ));
    }
    if job.state == JobState::Pending {
        return job_waiting(job, head, now);
    }
    match step.state {
        StepState::Waiting => Some(waiting_for_deps(job, step)),
        StepState::Ready => Some(ready_reason(step, agent, now)),
        StepState::Compensating => compensating_reason(step, agent, now),
        _ => None,
    }
}

fn waiting_for_deps(job: &Job, step: &Step) -> WaitingReason {
    let open: Vec<String> = step
        .depends_on
        .iter()
        .filter(|d| {
            job.steps
                .iter()
                .find(|s| &s.name == *d)
                .is_none_or(|s| !s.state.satisfies_dependants())
        })
        .map(|d| format!("`{d}`"))
        .collect();
    if open.is_empty() {
        return WaitingReason::new("dependencies", "its dependencies just finished");
    }
    WaitingReason::new("dependencies", format!("waiting for {}", open.join(", ")))
}

fn compensating_reason(step: &Step, agent: &AgentContext, now: Timestamp) -> Option<WaitingReason> {
    match step.comp_phase {
        Some(CompPhase::Waiting) => Some(WaitingReason::new(
            "undo_order",
            "its undo waits until every step that depended on it is undone",
        )),
        Some(CompPhase::Ready) => Some(ready_reason(step, agent, now)),
        _ => None,
    }
}

/// A ready step waits only for something about its agent name (or its own backoff).
fn ready_reason(step: &Step, agent: &AgentContext, now: Timestamp) -> WaitingReason {
    let name = &step.agent;
    if let Some(at) = step.next_attempt_at.filter(|at| *at > now) {
        return WaitingReason::new(
            "backoff",
            format!(
                "backoff until {} (attempt {} failed)",
                clock_time(at),
                step.attempt
            ),
        );
    }
    if agent.paused {
        return WaitingReason::new("agent_paused", format!("agent `{name}` paused"));
    }
    if let Some(max) = agent
        .max_concurrency
        .filter(|m| agent.running >= u64::from(*m))
    {
        return WaitingReason::new(
            "concurrency_limit",
            format!("`{name}` at its concurrency limit {}/{max}", agent.running),
        );
    }
    if name.starts_with(crate::push::AGENT_PREFIX) {
        return http_ready_reason(name, agent, now);
    }
    match agent.last_poll {
        None => {
            return WaitingReason::new(
                "no_worker",
                format!("no worker has polled `{name}` on this node"),
            )
        }
        Some(at) if now.as_millis() - at.as_millis() > NO_WORKER_AFTER_MS => {
            let ago = human_span(now.as_millis() - at.as_millis());
            return WaitingReason::new(
                "no_worker",
                format!("no worker has polled `{name}` for {ago}"),
            );
        }
        _ => {}
    }
    if let Some(rate) = agent.rate {
        return WaitingReason::new(
            "rate_limit",
            format!("`{name}` is rate limited to {rate}/s: it starts when a token frees up"),
        );
    }
    WaitingReason::new(
        "ready",
        format!("ready: the next lease request from a `{name}` worker takes it"),
    )
}

/// A ready HTTP step waits for nothing but the host's circuit breaker: the server runs it.
fn http_ready_reason(name: &str, agent: &AgentContext, now: Timestamp) -> WaitingReason {
    match agent.circuit_open_until {
        Some(until) if until > now => WaitingReason::new(
            "circuit_open",
            format!(
                "`{name}` circuit breaker open after repeated failures: one probe at {}",
                clock_time(until)
            ),
        ),
        Some(_) => WaitingReason::new(
            "circuit_open",
            format!("`{name}` circuit breaker half-open: waiting on its probe request"),
        ),
        None => WaitingReason::new(
            "ready",
            format!("ready: the server calls the `{name}` target next"),
        ),
    }
}

/// `12:03:04` (UTC) for today's instants is what an operator reads at a glance.
fn clock_time(at: Timestamp) -> String {
    let full = at.to_rfc3339();
    full.get(11..19)
        .map_or(full.clone(), |t| format!("{t} UTC"))
}

/// A rough, readable duration: `45 s`, `5 min`, `3 h`, `2 d`.
pub fn human_span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=89 => format!("{s} s"),
        90..=5399 => format!("{} min", (s + 30) / 60),
        5400..=129_599 => format!("{} h", (s + 1800) / 3600),
        _ => format!("{} d", (s + 43_200) / 86_400),
    }
}

#[cfg(test)]
mod tests;
