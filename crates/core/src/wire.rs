//! The JSON shapes of the HTTP API, shared by the server, the agent SDK and the CLI.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::id::{JobId, LeaseId};
use crate::job::{CompPhase, DesiredState, Event, Job, JobState, StepState};
use crate::spec::{CompensateSpec, JobSpec};
use crate::time::{Span, Timestamp};

/// `POST /v1/jobs:batch` body.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    pub jobs: Vec<JobSpec>,
}

/// `POST /v1/jobs:batch` answer, jobs in request order.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchResponse {
    pub jobs: Vec<JobView>,
}

/// What a submit answers under `Prefer: return=minimal`: the job's id and state, and whether
/// this request created it (`false`: its idempotency key named a job that already existed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubmittedJob {
    pub id: JobId,
    pub state: JobState,
    pub created: bool,
}

/// `POST /v1/jobs:batch` answer under `Prefer: return=minimal`, jobs in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchSummary {
    pub jobs: Vec<SubmittedJob>,
}

/// A job as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobView {
    pub id: JobId,
    pub state: JobState,
    pub desired_state: DesiredState,
    pub idempotency_key: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub run_at: Option<Timestamp>,
    pub ordering_key: Option<String>,
    pub on_failure: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// Why the job is `blocked`, when it is.
    #[serde(default)]
    pub blocked_reason: Option<String>,
    /// Steps whose compensation ran to completion.
    #[serde(default)]
    pub compensated: Vec<String>,
    #[serde(default)]
    pub callback_url: Option<String>,
    /// How long the job is kept once finished, when it asked for its own retention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<crate::Span>,
    /// When the job will be removed (its end plus its retention); absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removable_at: Option<Timestamp>,
    /// The name of the token that submitted the job (none without auth, for the admin
    /// setting, and for jobs of schedules and Faktory).
    #[serde(default)]
    pub submitted_by: Option<String>,
    /// The instant past which nothing new starts and the job fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Timestamp>,
    /// The round a whole-job retry (`compensate_and_retry`) is in, from 1; 1 for other jobs.
    #[serde(default = "first_round")]
    pub round: u32,
    /// Rounds a whole-job retry runs at most; absent for other jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_attempts: Option<u32>,
    /// What a whole-job retry does when its last round fails (`fail` or `hold`); absent for
    /// other jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_exhausted: Option<crate::spec::JobExhausted>,
    /// The job this one reruns (`POST /v1/jobs/{id}/rerun`), when it is a rerun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<JobId>,
    /// The rerun of this job, once one was made (a job is rerun at most once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_by: Option<JobId>,
    /// Why a pending job has not started (`GET /v1/jobs/{id}` only; absent once it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<crate::waiting::WaitingReason>,
    pub steps: Vec<StepView>,
}

/// A step as the API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepView {
    pub name: String,
    pub agent: String,
    pub state: StepState,
    pub depends_on: Vec<String>,
    pub attempt: u32,
    pub failures: u32,
    pub max_attempts: u32,
    pub timeout: Span,
    /// The longest one attempt may run, heartbeats or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Span>,
    pub payload: Value,
    pub worker: Option<String>,
    pub created_at: Timestamp,
    pub ready_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub lease_expires_at: Option<Timestamp>,
    pub next_attempt_at: Option<Timestamp>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
    #[serde(default)]
    pub compensate: Option<CompensateSpec>,
    /// Where the undo is while the step is `compensating`.
    #[serde(default)]
    pub comp_phase: Option<CompPhase>,
    #[serde(default)]
    pub comp_attempts: u32,
    #[serde(default)]
    pub comp_failures: u32,
    /// The HTTP target the server calls for this step (header values redacted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<crate::push::HttpTarget>,
    /// What the current (or last) attempt last reported with a heartbeat; cleared when the
    /// step is leased again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
    /// When `progress` was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_at: Option<Timestamp>,
    /// Whether each new progress is also recorded in the job's history (`step_progress`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub progress_events: bool,
    /// Why the step is neither running nor finished, in one sentence (`GET /v1/jobs/{id}` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<crate::waiting::WaitingReason>,
}

impl From<&Job> for JobView {
    fn from(job: &Job) -> Self {
        JobView {
            id: job.id,
            state: job.state,
            desired_state: job.desired_state,
            idempotency_key: job.idempotency_key.clone(),
            labels: job.labels.clone(),
            priority: job.priority,
            run_at: job.run_at,
            ordering_key: job.ordering_key.clone(),
            on_failure: job.on_failure.as_str().to_string(),
            created_at: job.created_at,
            updated_at: job.updated_at,
            finished_at: job.finished_at,
            blocked_reason: job.blocked_reason.clone(),
            compensated: job.compensated_steps(),
            callback_url: job.callback_url.clone(),
            retention: job.retention,
            removable_at: None,
            submitted_by: job.submitted_by.clone(),
            deadline: job.deadline,
            round: job.round,
            job_attempts: job.retry.map(|r| r.attempts),
            job_exhausted: job.retry.map(|r| r.then),
            rerun_of: job.rerun_of,
            rerun_by: job.rerun_by,
            waiting_reason: None,
            steps: job
                .steps
                .iter()
                .map(|s| StepView {
                    name: s.name.clone(),
                    agent: s.agent.clone(),
                    state: s.state,
                    depends_on: s.depends_on.clone(),
                    attempt: s.attempt,
                    failures: s.failures,
                    max_attempts: s.max_attempts,
                    timeout: s.timeout,
                    deadline: s.deadline,
                    payload: s.payload.clone(),
                    worker: s.worker.clone(),
                    created_at: s.created_at,
                    ready_at: s.ready_at,
                    started_at: s.started_at,
                    finished_at: s.finished_at,
                    lease_expires_at: s.lease_expires_at,
                    next_attempt_at: s.next_attempt_at,
                    result: s.result.clone(),
                    last_error: s.last_error.clone(),
                    compensate: s.compensate.as_ref().map(|c| CompensateSpec {
                        http: c.http.as_ref().map(|h| h.redacted()),
                        ..c.clone()
                    }),
                    http: s.http.as_ref().map(|h| h.redacted()),
                    comp_phase: s.comp_phase,
                    comp_attempts: s.comp_attempts,
                    comp_failures: s.comp_failures,
                    progress: s.progress.clone(),
                    progress_at: s.progress_at,
                    progress_events: s.progress_events,
                    waiting_reason: None,
                })
                .collect(),
        }
    }
}

fn first_round() -> u32 {
    1
}

/// `GET /v1/jobs` answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
    pub next_cursor: Option<String>,
}

/// `GET /v1/jobs/{id}/events` answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventList {
    pub events: Vec<Event>,
}

/// `POST /v1/agents/{agent}/leases` body.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    #[schema(min_length = 1, max_length = 200)]
    pub worker: String,
    /// 1 to `limits.leases_per_call` (100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Span>,
}

/// `POST /v1/agents/{agent}/leases` answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseResponse {
    pub leases: Vec<Lease>,
}

/// One lease: the right to run one attempt of one step until `complete_by`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Lease {
    pub lease_id: LeaseId,
    /// `work` for the step itself, `compensate` for undoing it.
    #[serde(default)]
    pub kind: LeaseKind,
    pub job_id: JobId,
    pub step: String,
    pub agent: String,
    /// The fencing token: it counts every lease of the step, its work and its undo alike, so a
    /// first undo after one successful run is attempt 2. Undos count their own tries in
    /// `undo_attempt`.
    pub attempt: u32,
    /// For a `compensate` lease: which try of the undo this is (1 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undo_attempt: Option<u32>,
    pub payload: Value,
    /// Each dependency's result, by dependency name.
    pub inputs: serde_json::Map<String, Value>,
    /// `{job_id}/{step}`: the same on every attempt, for remote deduplication.
    pub idempotency_key: String,
    /// The server's deadline, for display; agents count `lease_ms` on their own clock.
    pub complete_by: Timestamp,
    /// Milliseconds left on the lease when the server answered.
    pub lease_ms: u64,
    /// The step's timeout: heartbeat every third of it.
    pub timeout_ms: u64,
}

/// What a lease is for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseKind {
    #[default]
    Work,
    Compensate,
}

/// `POST /v1/jobs/{id}/steps/{name}/retry|skip` and `/v1/jobs/{id}/resume` body (optional).
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorRequest {
    /// Who acts, recorded in the job's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why, recorded in the job's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `POST /v1/jobs/{id}/rerun` body (optional): run a failed or cancelled job again as a new job.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerunRequest {
    /// Keep the steps that succeeded (and whose dependencies are kept) with their results,
    /// instead of running every step again.
    #[serde(default)]
    pub from_failed: bool,
    /// Who acts, recorded in both jobs' histories (at most 200 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 200)]
    pub by: Option<String>,
    /// Why, recorded in both jobs' histories (at most 2000 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2000)]
    pub reason: Option<String>,
}

impl RerunRequest {
    /// Checks `by` and `reason` with the bounds of every operator request.
    pub fn validate(&self) -> Result<(), crate::SpecError> {
        check_audit(&self.by, &self.reason)
    }

    /// The core's options for this request.
    pub fn options(&self) -> crate::rerun::Options {
        crate::rerun::Options {
            from_failed: self.from_failed,
            by: self.by.clone(),
            reason: self.reason.clone(),
        }
    }
}

/// Where a recorded alert stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlertDelivery {
    /// Still being tried (or not tried yet).
    Waiting,
    /// Acknowledged by the alert webhook, or nothing to send (no webhook configured).
    Delivered,
    /// Its attempt budget is spent.
    GivenUp,
}

/// One alert as `GET /v1/alerts` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AlertView {
    /// What raised it: `job_failed`, `job_blocked`, `step_poisoned`.
    pub kind: String,
    pub job_id: JobId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    pub message: String,
    pub created_at: Timestamp,
    pub delivery: AlertDelivery,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// `GET /v1/alerts` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AlertList {
    /// Newest first.
    pub alerts: Vec<AlertView>,
    /// Whether this node has an alert webhook to deliver to.
    pub webhook: bool,
}

/// How many minutes `GET /v1/stats` counts finished jobs over.
pub const STATS_MINUTES: u32 = 60;

/// `GET /v1/stats`: jobs per state, and jobs finished per minute over the last hour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatsView {
    /// Every job state with its count (zero included), in lifecycle order.
    pub jobs: Vec<StateCount>,
    /// The start of the first minute counted (a whole minute, UTC).
    pub since: Timestamp,
    /// One entry per minute from `since`, oldest first; the last is the minute under way.
    pub per_minute: Vec<MinuteCounts>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StateCount {
    pub state: JobState,
    pub count: u64,
}

/// Jobs that finished in one minute, by how they ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MinuteCounts {
    pub minute: Timestamp,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
}

impl StatsView {
    /// The window counted at `now`: from the start of the minute 59 minutes before the current
    /// one, to the end of the current one.
    pub fn window(now: Timestamp) -> (Timestamp, Timestamp) {
        const MINUTE: i64 = 60_000;
        let current = now.as_millis().div_euclid(MINUTE) * MINUTE;
        let since = current - i64::from(STATS_MINUTES - 1) * MINUTE;
        (
            Timestamp::from_millis(since),
            Timestamp::from_millis(current + MINUTE),
        )
    }

    /// The answer from the store's counts: `by_state` as `Store::jobs_count_by_state` gives it,
    /// `finished` as `Store::jobs_finished_per_minute` gives it for [`StatsView::window`].
    pub fn build(
        now: Timestamp,
        by_state: &[(JobState, u64)],
        finished: &[(u32, JobState, u64)],
    ) -> StatsView {
        let (since, _) = StatsView::window(now);
        let jobs = JobState::ALL
            .iter()
            .map(|&state| StateCount {
                state,
                count: by_state
                    .iter()
                    .filter(|(s, _)| *s == state)
                    .map(|(_, n)| n)
                    .sum(),
            })
            .collect();
        let mut per_minute: Vec<MinuteCounts> = (0..STATS_MINUTES)
            .map(|i| MinuteCounts {
                minute: since.plus(Span::from_secs(u64::from(i) * 60)),
                ..MinuteCounts::default()
            })
            .collect();
        for &(bucket, state, n) in finished {
            let Some(m) = per_minute.get_mut(bucket as usize) else {
                continue;
            };
            match state {
                JobState::Succeeded => m.succeeded += n,
                JobState::Failed => m.failed += n,
                JobState::Cancelled => m.cancelled += n,
                _ => {}
            }
        }
        StatsView {
            jobs,
            since,
            per_minute,
        }
    }
}

/// `PATCH /v1/jobs/{id}` body: move a job. At least one of `run_at` and `priority`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RescheduleRequest {
    /// When a pending job may start (RFC 3339). A time that has come means now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<Timestamp>,
    /// The job's new priority, for a pending or running job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Who acts, recorded in the job's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why, recorded in the job's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The longest `by` and `reason` an operator's request may record.
pub const AUDIT_BY_MAX: usize = 200;
pub const AUDIT_REASON_MAX: usize = 2_000;

impl RescheduleRequest {
    /// Checks the values with the same bounds as a submit; the error names the field.
    pub fn validate(&self) -> Result<(), crate::SpecError> {
        use crate::spec::{PRIORITY_MAX, RUN_AT_MAX, RUN_AT_MIN};
        use crate::SpecError;
        if self.run_at.is_none() && self.priority.is_none() {
            return Err(SpecError::new("", "give run_at, priority or both"));
        }
        if self
            .run_at
            .is_some_and(|t| !(RUN_AT_MIN..=RUN_AT_MAX).contains(&t))
        {
            return Err(SpecError::new(
                "run_at",
                "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
            ));
        }
        if self
            .priority
            .is_some_and(|p| !(-PRIORITY_MAX..=PRIORITY_MAX).contains(&p))
        {
            return Err(SpecError::new(
                "priority",
                format!("priority must be between -{PRIORITY_MAX} and {PRIORITY_MAX}"),
            ));
        }
        check_audit(&self.by, &self.reason)
    }
}

/// An operator's `by` and `reason` within their bounds; the error names the field.
fn check_audit(by: &Option<String>, reason: &Option<String>) -> Result<(), crate::SpecError> {
    use crate::SpecError;
    let too_long = |v: &Option<String>, max: usize| v.as_ref().is_some_and(|v| v.len() > max);
    if too_long(by, AUDIT_BY_MAX) {
        return Err(SpecError::new(
            "by",
            format!("at most {AUDIT_BY_MAX} bytes"),
        ));
    }
    if too_long(reason, AUDIT_REASON_MAX) {
        return Err(SpecError::new(
            "reason",
            format!("at most {AUDIT_REASON_MAX} bytes"),
        ));
    }
    Ok(())
}

/// `POST /v1/leases/{id}/heartbeat` body.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// How the work is going: any JSON, at most `limits.progress_bytes` (4 KiB) encoded. Kept on
    /// the step (`progress`, `progress_at`); recorded in the history only for a step with
    /// `progress_events: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// `POST /v1/leases/{id}/heartbeat` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeartbeatResponse {
    pub complete_by: Timestamp,
    pub lease_ms: u64,
    /// The job no longer wants this work: stop, and report `fail` (or nothing).
    pub cancel: bool,
}

/// `POST /v1/leases/{id}/complete` body.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// `POST /v1/leases/{id}/fail` body.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    pub error: String,
    #[serde(default = "yes")]
    pub retryable: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/leases:report` body: the outcomes of many leases in one call (the SDK sends them
/// this way when several attempts end at once). Each is fenced and applied exactly as its own
/// `complete` or `fail` call would be.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBatch {
    /// 1 to `limits.leases_per_call` (100).
    #[schema(min_items = 1, max_items = 100)]
    pub reports: Vec<LeaseOutcome>,
}

/// One lease's outcome in a [`ReportBatch`]: `{"outcome": "complete", "lease_id", "result"}` or
/// `{"outcome": "fail", "lease_id", "error", "retryable"}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum LeaseOutcome {
    Complete {
        lease_id: LeaseId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
    },
    Fail {
        lease_id: LeaseId,
        error: String,
        #[serde(default = "yes")]
        retryable: bool,
    },
}

impl LeaseOutcome {
    pub fn lease_id(&self) -> LeaseId {
        match self {
            LeaseOutcome::Complete { lease_id, .. } | LeaseOutcome::Fail { lease_id, .. } => {
                *lease_id
            }
        }
    }
}

/// `POST /v1/leases:report` answer: one result per report, in the order sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportBatchResponse {
    pub results: Vec<ReportResult>,
}

/// What became of one report: `status` is what its own `complete`/`fail` call would have
/// answered (200, or the problem's status: 409 when the lease is no longer live, 404, 413…).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportResult {
    pub lease_id: LeaseId,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<JobId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_state: Option<JobState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

/// `GET /v1/agents` answer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentList {
    pub agents: Vec<AgentView>,
}

/// One agent name and what it is doing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentView {
    pub agent: String,
    pub ready: u64,
    pub running: u64,
    /// Workers seen asking for leases within the last minute.
    pub workers: Vec<WorkerView>,
    pub last_seen_at: Option<Timestamp>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerView {
    pub worker: String,
    pub last_seen_at: Timestamp,
}

/// An error answer, `application/problem+json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// Always `about:blank`: the problem is what the status says, and `code` tells which one.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short, stable name of the problem for programs to match on (e.g. `lease-lost`,
    /// `invalid-request`, `not-found`).
    #[serde(default)]
    pub code: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The request field at fault, when there is one (e.g. `steps[2].depends_on[0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the stats window is the 60 whole minutes ending with the current one, and that the
    // store's counts land in their minutes with every state present (zeros included).
    #[test]
    fn stats_window_and_buckets() {
        let now = Timestamp::parse_rfc3339("2026-11-25T10:30:42.500Z").unwrap();
        let (since, until) = StatsView::window(now);
        assert_eq!(since.to_string(), "2026-11-25T09:31:00.000Z");
        assert_eq!(until.to_string(), "2026-11-25T10:31:00.000Z");
        let view = StatsView::build(
            now,
            &[(JobState::Running, 2), (JobState::Failed, 5)],
            &[
                (0, JobState::Succeeded, 3),
                (59, JobState::Failed, 1),
                (59, JobState::Cancelled, 2),
                (60, JobState::Failed, 9),
            ],
        );
        let counts: Vec<(JobState, u64)> = view.jobs.iter().map(|c| (c.state, c.count)).collect();
        assert_eq!(counts.len(), JobState::ALL.len());
        assert!(
            counts.contains(&(JobState::Running, 2)) && counts.contains(&(JobState::Pending, 0))
        );
        assert_eq!(view.per_minute.len(), 60);
        assert_eq!(view.per_minute[0].minute, since);
        assert_eq!(view.per_minute[0].succeeded, 3);
        let last = &view.per_minute[59];
        assert_eq!(last.minute.to_string(), "2026-11-25T10:30:00.000Z");
        assert_eq!((last.failed, last.cancelled, last.succeeded), (1, 2, 0));
        let total: u64 = view.per_minute.iter().map(|m| m.failed).sum();
        assert_eq!(total, 1, "a bucket outside the window is dropped");
    }

    // Proves a reschedule request is checked field by field with the submit's bounds.
    #[test]
    fn reschedule_request_names_the_bad_field() {
        let req = |v: serde_json::Value| serde_json::from_value::<RescheduleRequest>(v).unwrap();
        let field = |v| req(v).validate().err().map(|e| e.field);
        assert_eq!(field(serde_json::json!({"priority": 3})), None);
        assert_eq!(
            field(serde_json::json!({"run_at": "2026-01-01T00:00:00Z"})),
            None
        );
        assert_eq!(field(serde_json::json!({})), Some(String::new()));
        assert_eq!(
            field(serde_json::json!({"priority": 10_001})),
            Some("priority".into())
        );
        assert_eq!(
            field(serde_json::json!({"run_at": "1969-12-31T23:59:59Z"})),
            Some("run_at".into())
        );
        assert_eq!(
            field(serde_json::json!({"priority": 1, "by": "x".repeat(201)})),
            Some("by".into())
        );
        assert_eq!(
            field(serde_json::json!({"priority": 1, "reason": "x".repeat(2_001)})),
            Some("reason".into())
        );
    }
}
