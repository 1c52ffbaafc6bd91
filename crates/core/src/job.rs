//! A job and its steps as the system records them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backoff::{Backoff, Formula};
use crate::id::{JobId, LeaseId};
use crate::push::HttpTarget;
use crate::spec::{
    CompensateSpec, JobExhausted, JobSpec, OnFailure, DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT,
};
use crate::time::{Span, Timestamp};

macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // `pad`, not `write_str`: a width or alignment (`{:<22}`) applies to the name.
                f.pad(self.as_str())
            }
        }
    };
}

string_enum! {
    /// Where a job is in its life.
    JobState {
        Pending => "pending",
        Running => "running",
        Compensating => "compensating",
        Blocked => "blocked",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
    }
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// The states of a job that has not finished, in declaration order.
    pub fn unfinished() -> impl Iterator<Item = JobState> {
        JobState::ALL.iter().copied().filter(|s| !s.is_terminal())
    }
}

string_enum! {
    /// Where a `compensating` step's undo action is.
    CompPhase {
        Waiting => "waiting",
        Ready => "ready",
        Running => "running",
        Failed => "failed",
    }
}

string_enum! {
    /// Where the client wants the job to end.
    DesiredState {
        Succeeded => "succeeded",
        Cancelled => "cancelled",
    }
}

string_enum! {
    /// Where a step is in its life.
    StepState {
        Waiting => "waiting",
        Ready => "ready",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Skipped => "skipped",
        Cancelled => "cancelled",
        Compensating => "compensating",
        Compensated => "compensated",
    }
}

impl StepState {
    /// Whether the step will never run (again) on its own.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            StepState::Succeeded
                | StepState::Failed
                | StepState::Skipped
                | StepState::Cancelled
                | StepState::Compensated
        )
    }

    /// Whether dependants may start: the step's work is done or deliberately passed over.
    pub fn satisfies_dependants(self) -> bool {
        matches!(self, StepState::Succeeded | StepState::Skipped)
    }
}

/// A job with all its steps: the unit the state machine works on.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub idempotency_key: Option<String>,
    /// Fingerprint of the submitted spec, to compare resubmissions with the same key; empty for
    /// a job without a key, which nothing is ever compared with (hashing the encoded spec cost
    /// about 11,000 instructions a job, and the hex digest made every job row 64 bytes longer).
    pub fingerprint: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub run_at: Option<Timestamp>,
    pub ordering_key: Option<String>,
    pub callback_url: Option<String>,
    pub on_failure: OnFailure,
    /// How long the job is kept once finished (see `retention`); `None`: the server's default.
    pub retention: Option<Span>,
    pub state: JobState,
    pub desired_state: DesiredState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// Why the job is `blocked`, for the operator.
    pub blocked_reason: Option<String>,
    /// The name of the token that submitted it; `None` when auth is off, for the admin setting,
    /// and for jobs the server makes itself (schedules, Faktory). A `submit`-only token sees
    /// only the jobs it submitted.
    pub submitted_by: Option<String>,
    /// The instant past which nothing new starts and the job fails (fixed at submission).
    pub deadline: Option<Timestamp>,
    /// The round a whole-job retry is in, from 1 (always 1 for other jobs).
    pub round: u32,
    /// How a `compensate_and_retry` job retries as a whole (fixed at submission).
    pub retry: Option<JobRetry>,
    /// The job this one is a rerun of (fixed at admission; see `rerun`).
    pub rerun_of: Option<JobId>,
    /// The rerun of this job, once one was made: a job is rerun at most once.
    pub rerun_by: Option<JobId>,
    pub steps: Vec<Step>,
}

/// A whole-job retry's policy: at most `attempts` rounds, `backoff` before each new one; when
/// the last fails, `then` says whether the job fails (after undoing it) or is held.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRetry {
    pub attempts: u32,
    pub backoff: Backoff,
    /// Left out of the stored JSON when `fail`, so policies stored before it existed read back
    /// the same.
    #[serde(default, skip_serializing_if = "is_fail")]
    pub then: JobExhausted,
}

fn is_fail(then: &JobExhausted) -> bool {
    *then == JobExhausted::Fail
}

/// One step of a job, with its current attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    pub agent: String,
    pub payload: Value,
    pub depends_on: Vec<String>,
    pub timeout: Span,
    /// The longest one attempt of the work may run, heartbeats or not.
    pub deadline: Option<Span>,
    /// 0 means no limit.
    pub max_attempts: u32,
    pub backoff: Backoff,
    /// Which curve retry delays follow (`backoff` is its parameters when exponential).
    pub backoff_formula: Formula,
    pub compensate: Option<CompensateSpec>,
    /// The HTTP target the server calls for this step's work (`agent` is then its reserved
    /// `http:` name).
    pub http: Option<HttpTarget>,
    pub state: StepState,
    /// Leases handed out so far, for the step's work and its compensation alike: the current
    /// lease's fencing token.
    pub attempt: u32,
    pub failures: u32,
    /// Attempts before this one do not count against `max_attempts` (an operator's retry gives
    /// a fresh budget).
    pub budget_from: u32,
    /// Where the undo action is while the step is `compensating`.
    pub comp_phase: Option<CompPhase>,
    pub comp_attempts: u32,
    pub comp_failures: u32,
    pub comp_budget_from: u32,
    pub lease_id: Option<LeaseId>,
    pub worker: Option<String>,
    pub created_at: Timestamp,
    /// When the step last became claimable (work or undo). Set with `next_attempt_at` whenever a
    /// step becomes claimable, so the two are equal unless the step waits out a backoff.
    pub ready_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub lease_expires_at: Option<Timestamp>,
    /// The hard end of the current (or last) attempt, from its lease's deadline: no heartbeat
    /// moves `lease_expires_at` past it.
    pub attempt_ends_at: Option<Timestamp>,
    /// When a claimable step may be claimed: its `ready_at`, or later while a backoff runs (see
    /// [`Step::waits_past_ready`]).
    pub next_attempt_at: Option<Timestamp>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
    /// Whether a new `progress` is also recorded in the history (fixed at admission).
    pub progress_events: bool,
    /// What the holder of the current (or last) lease last reported with a heartbeat.
    pub progress: Option<Value>,
    /// When `progress` was reported.
    pub progress_at: Option<Timestamp>,
}

/// The agent name a step or undo is claimed under: its own, or its HTTP target's reserved one.
/// A spec that passed validation always has one of them.
fn runner_name(agent: &str, http: Option<&HttpTarget>) -> String {
    match http.map(HttpTarget::agent_name) {
        Some(Ok(name)) => name,
        _ => agent.to_string(),
    }
}

impl Job {
    /// Builds a freshly accepted job in its first state. Nothing is started yet: pass it through
    /// [`crate::machine::admit`] to get its initial transition (ready steps, events).
    pub fn from_spec(id: JobId, spec: &JobSpec, now: Timestamp) -> Job {
        let steps = spec
            .steps
            .iter()
            .map(|s| Step {
                name: s.name.clone(),
                agent: runner_name(&s.agent, s.http.as_ref()),
                payload: s.payload.clone(),
                depends_on: s.depends_on.clone(),
                timeout: s
                    .timeout
                    .or(s.http.as_ref().and_then(|h| h.timeout))
                    .unwrap_or(DEFAULT_TIMEOUT),
                deadline: s.deadline,
                max_attempts: s.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
                backoff: s.backoff.unwrap_or_default(),
                backoff_formula: s.backoff_formula.unwrap_or_default(),
                compensate: s.compensate.as_ref().map(|c| CompensateSpec {
                    agent: runner_name(&c.agent, c.http.as_ref()),
                    timeout: c.timeout.or(c.http.as_ref().and_then(|h| h.timeout)),
                    ..c.clone()
                }),
                http: s.http.clone(),
                state: StepState::Waiting,
                attempt: 0,
                failures: 0,
                budget_from: 0,
                comp_phase: None,
                comp_attempts: 0,
                comp_failures: 0,
                comp_budget_from: 0,
                lease_id: None,
                worker: None,
                created_at: now,
                ready_at: None,
                started_at: None,
                finished_at: None,
                lease_expires_at: None,
                attempt_ends_at: None,
                next_attempt_at: None,
                result: None,
                last_error: None,
                progress_events: s.progress_events.unwrap_or(false),
                progress: None,
                progress_at: None,
            })
            .collect();
        Job {
            id,
            idempotency_key: spec.idempotency_key.clone(),
            fingerprint: match spec.idempotency_key {
                Some(_) => spec.fingerprint(),
                None => String::new(),
            },
            labels: spec.labels.clone(),
            priority: spec.priority,
            run_at: spec.run_at,
            ordering_key: spec.ordering_key.clone(),
            callback_url: spec.callback_url.clone(),
            retention: spec.retention,
            on_failure: spec.on_failure.unwrap_or(
                if spec.steps.iter().any(|s| s.compensate.is_some()) {
                    OnFailure::Compensate
                } else {
                    OnFailure::Fail
                },
            ),
            state: JobState::Pending,
            desired_state: DesiredState::Succeeded,
            created_at: now,
            updated_at: now,
            finished_at: None,
            blocked_reason: None,
            submitted_by: None,
            deadline: spec.deadline.map(|d| d.resolve(now)),
            round: 1,
            retry: (spec.on_failure == Some(OnFailure::CompensateAndRetry)).then(|| JobRetry {
                attempts: spec
                    .job_attempts
                    .unwrap_or(crate::spec::DEFAULT_JOB_ATTEMPTS),
                backoff: spec.job_backoff.unwrap_or_default(),
                then: spec.job_exhausted.unwrap_or_default(),
            }),
            rerun_of: None,
            rerun_by: None,
            steps,
        }
    }

    /// When the supervisor must enforce the job's deadline: while the job still wants its work
    /// (not finished, not being cancelled, not unwinding). The stores index it.
    pub fn deadline_due(&self) -> Option<Timestamp> {
        let wants_work = matches!(
            self.state,
            JobState::Pending | JobState::Running | JobState::Blocked
        ) && self.desired_state == DesiredState::Succeeded
            && !self
                .steps
                .iter()
                .any(|s| s.state == StepState::Compensating);
        self.deadline.filter(|_| wants_work)
    }

    /// Whether the job's deadline has come at `now`.
    pub fn past_deadline(&self, now: Timestamp) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }

    pub fn step_index(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }

    /// The order in which claimable steps are handed out, smallest first: the instant the step
    /// became claimable, moved earlier by [`PRIORITY_AGING`] per point of priority. So priority
    /// 10 work goes before priority 0 work that became ready less than 10 s before it, and work
    /// that has waited long enough goes first whatever its priority: nothing starves.
    pub fn claim_rank(&self, step: usize) -> Option<i64> {
        let s = &self.steps[step];
        s.claim_agent()?;
        let at = s.next_attempt_at?;
        Some(at.as_millis() - i64::from(self.priority) * PRIORITY_AGING.as_millis_i64())
    }

    /// The agent names that could lease a step of this job at `now` (ready work or a ready undo
    /// whose `next_attempt_at` has come), each once. A store that lets concurrent claimers pass
    /// over a job it holds announces these again after it commits, so they are not left waiting
    /// for a sweep.
    pub fn claimable_agents(&self, now: Timestamp) -> Vec<&str> {
        let mut agents: Vec<&str> = Vec::new();
        for s in &self.steps {
            let due = s.next_attempt_at.is_some_and(|t| t <= now);
            if let (Some(agent), true) = (s.claim_agent(), due) {
                if !agents.contains(&agent) {
                    agents.push(agent);
                }
            }
        }
        agents
    }

    /// Whether `other` has the same fields fixed at admission as this job: its key, labels,
    /// callback and failure policy, what it is a rerun of, and each step's definition. No transition changes them, and
    /// backends rely on that (they write those columns once, at insert).
    pub fn same_admission(&self, other: &Job) -> bool {
        self.id == other.id
            && self.idempotency_key == other.idempotency_key
            && self.fingerprint == other.fingerprint
            && self.labels == other.labels
            && self.ordering_key == other.ordering_key
            && self.callback_url == other.callback_url
            && self.on_failure == other.on_failure
            && self.retention == other.retention
            && self.deadline == other.deadline
            && self.retry == other.retry
            && self.rerun_of == other.rerun_of
            && self.created_at == other.created_at
            && self.steps.len() == other.steps.len()
            && self
                .steps
                .iter()
                .zip(&other.steps)
                .all(|(a, b)| a.same_definition(b))
    }

    /// The results of a step's dependencies, by dependency name. A compensation gets the result
    /// of the step it undoes, under that step's name.
    pub fn inputs_of(&self, step: usize) -> serde_json::Map<String, Value> {
        let mut inputs = serde_json::Map::new();
        let s = &self.steps[step];
        if s.is_compensating() {
            inputs.insert(s.name.clone(), s.result.clone().unwrap_or(Value::Null));
            return inputs;
        }
        for dep in &self.steps[step].depends_on {
            if let Some(d) = self.steps.iter().find(|s| &s.name == dep) {
                inputs.insert(dep.clone(), d.result.clone().unwrap_or(Value::Null));
            }
        }
        inputs
    }

    /// The stable key a step's remote effects can be deduplicated by, the same for every attempt;
    /// its compensation has its own (`…/compensate`).
    pub fn step_idempotency_key(&self, step: usize) -> String {
        let s = &self.steps[step];
        if s.state == StepState::Compensating {
            format!("{}/{}/compensate", self.id, s.name)
        } else {
            format!("{}/{}", self.id, s.name)
        }
    }

    /// Why a blocked job waits, from its steps as they are now: each failed step and each failed
    /// undo with its last error. `None` when nothing is failed.
    pub fn block_cause(&self) -> Option<String> {
        let causes: Vec<String> = self
            .steps
            .iter()
            .filter_map(|s| {
                let error = s.last_error.as_deref().unwrap_or("no error recorded");
                if s.comp_phase == Some(CompPhase::Failed) {
                    Some(format!("compensation of step `{}` failed: {error}", s.name))
                } else if s.state == StepState::Failed {
                    Some(format!("step `{}` failed: {error}", s.name))
                } else {
                    None
                }
            })
            .collect();
        (!causes.is_empty()).then(|| causes.join("; "))
    }

    /// Names of the steps whose compensation ran to completion, in the order they were undone
    /// (an undo's completion sets the step's `finished_at`); undos finished at one instant are
    /// listed later steps first, as the unwind goes.
    pub fn compensated_steps(&self) -> Vec<String> {
        let mut undone: Vec<(Option<Timestamp>, std::cmp::Reverse<usize>, &str)> = self
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == StepState::Compensated)
            .map(|(i, s)| (s.finished_at, std::cmp::Reverse(i), s.name.as_str()))
            .collect();
        undone.sort();
        undone
            .into_iter()
            .map(|(_, _, name)| name.to_string())
            .collect()
    }
}

impl Step {
    /// The delay before retry number `failures` (1 for the first) of this step's work or of its
    /// undo, by the step's formula. `jitter` in `[0, 1)` is the caller's.
    pub fn retry_delay(&self, failures: u32, jitter: f64) -> Span {
        self.backoff_formula.delay(&self.backoff, failures, jitter)
    }

    /// Whether `other` is the same step definition (everything fixed at admission).
    pub fn same_definition(&self, other: &Step) -> bool {
        self.name == other.name
            && self.agent == other.agent
            && self.payload == other.payload
            && self.depends_on == other.depends_on
            && self.timeout == other.timeout
            && self.deadline == other.deadline
            && self.max_attempts == other.max_attempts
            && self.backoff == other.backoff
            && self.backoff_formula == other.backoff_formula
            && self.compensate == other.compensate
            && self.http == other.http
            && self.progress_events == other.progress_events
            && self.created_at == other.created_at
    }

    /// The agent name that may lease this step now (its own, or its compensation's), if any.
    /// Backends index claimable steps by this.
    pub fn claim_agent(&self) -> Option<&str> {
        match (self.state, self.comp_phase) {
            (StepState::Ready, _) => Some(&self.agent),
            (StepState::Compensating, Some(CompPhase::Ready)) => {
                self.compensate.as_ref().map(|c| c.agent.as_str())
            }
            _ => None,
        }
    }

    /// Whether the step is claimable only later than it became ready: a retry or an undo waiting
    /// out its backoff, or a new round's roots waiting out the job's. Only such steps need waking
    /// when their time comes (whatever made a step ready at once woke its agent then), so the
    /// stores index just these for `Agents::agents_due` and the supervisor's next wake-up, with
    /// the same test in SQL: `claim_agent IS NOT NULL AND next_attempt_at > ready_at`.
    pub fn waits_past_ready(&self) -> bool {
        self.claim_agent().is_some()
            && matches!((self.ready_at, self.next_attempt_at), (Some(r), Some(n)) if n > r)
    }

    /// The agent holding the step's live lease: its own for work, its compensate agent for an
    /// undo; `None` while no lease is live. Backends index leased steps by this.
    pub fn lease_agent(&self) -> Option<&str> {
        if !self.is_leased() {
            None
        } else if self.is_compensating() {
            self.compensate.as_ref().map(|c| c.agent.as_str())
        } else {
            Some(&self.agent)
        }
    }

    /// Whether a lease on this step (work or compensation) is live or may still be reported.
    pub fn is_leased(&self) -> bool {
        self.state == StepState::Running
            || (self.state == StepState::Compensating
                && self.comp_phase == Some(CompPhase::Running))
    }

    /// Whether the current or next lease is for the compensation.
    pub fn is_compensating(&self) -> bool {
        self.state == StepState::Compensating
    }

    /// The agent name the current or last lease was handed to (the compensate agent for an undo).
    pub fn claim_agent_of_lease(&self) -> &str {
        match (&self.compensate, self.is_compensating()) {
            (Some(c), true) => &c.agent,
            _ => &self.agent,
        }
    }

    /// The payload the current or next lease carries.
    pub fn lease_payload(&self) -> &Value {
        match (&self.compensate, self.is_compensating()) {
            (Some(c), true) => &c.payload,
            _ => &self.payload,
        }
    }

    /// The HTTP target of the current or next lease, when the server runs it itself.
    pub fn lease_http(&self) -> Option<&HttpTarget> {
        match (&self.compensate, self.is_compensating()) {
            (Some(c), true) => c.http.as_ref(),
            _ => self.http.as_ref(),
        }
    }

    /// The timeout of the current or next lease.
    pub fn lease_timeout(&self) -> Span {
        match (&self.compensate, self.is_compensating()) {
            (Some(c), true) => c.timeout.unwrap_or(self.timeout),
            _ => self.timeout,
        }
    }

    /// The deadline of the current or next lease: an undo's own, else the step's.
    pub fn lease_deadline(&self) -> Option<Span> {
        match (&self.compensate, self.is_compensating()) {
            (Some(c), true) => c.deadline.or(self.deadline),
            _ => self.deadline,
        }
    }

    /// When a lease renewed at `now` ends: a timeout from now, but never past the attempt's
    /// hard end.
    pub fn lease_end(&self, now: Timestamp) -> Timestamp {
        let silence = now.plus(self.lease_timeout());
        self.attempt_ends_at.map_or(silence, |end| silence.min(end))
    }

    /// Whether the live lease ends at the attempt's hard end rather than for want of a
    /// heartbeat: its expiry is then a deadline overrun, not silence.
    pub fn lease_ends_at_deadline(&self) -> bool {
        self.attempt_ends_at.is_some() && self.attempt_ends_at == self.lease_expires_at
    }

    pub fn comp_max_attempts(&self) -> u32 {
        self.compensate
            .as_ref()
            .and_then(|c| c.max_attempts)
            .unwrap_or(DEFAULT_MAX_ATTEMPTS)
    }
}

/// How much waiting one point of priority is worth (see [`Job::claim_rank`]).
pub const PRIORITY_AGING: Span = Span::from_secs(1);

string_enum! {
    /// What an entry of a job's history records, stored and answered as its snake_case name.
    #[derive(PartialOrd, Ord)]
    EventKind {
        /// The job was accepted: the first event of every job.
        JobSubmitted => "job_submitted",
        /// An operator moved the job's `run_at` or changed its priority.
        JobRescheduled => "job_rescheduled",
        /// The job started running: on admission, or once its `run_at` came and it headed its
        /// ordering key.
        JobStarted => "job_started",
        /// A client asked for the job to be cancelled.
        CancelRequested => "cancel_requested",
        /// The job's deadline passed while it still wanted its work.
        JobDeadlinePassed => "job_deadline_passed",
        /// The job began undoing its succeeded steps (a step failed, a cancel, its deadline).
        JobCompensating => "job_compensating",
        /// A whole-job retry began its next round once the last one was undone.
        JobRoundStarted => "job_round_started",
        /// A failed step or a failed undo stopped the job until an operator acts.
        JobBlocked => "job_blocked",
        /// An operator's action left nothing failed: the blocked job runs or unwinds again.
        JobUnblocked => "job_unblocked",
        /// An operator resumed a blocked job: its failed steps and undos are retried.
        JobResumed => "job_resumed",
        /// A repair found the job not moved on as its steps called for, and moved it on.
        JobRepaired => "job_repaired",
        /// The finished job was rerun: recorded on it, naming the new job.
        JobRerun => "job_rerun",
        /// Every step succeeded or was skipped: the job succeeded.
        JobSucceeded => "job_succeeded",
        /// The job failed: a step failed for good, its deadline passed, or its unwind finished.
        JobFailed => "job_failed",
        /// The cancelled job finished stopping (and undoing, if it had anything to undo).
        JobCancelled => "job_cancelled",
        /// A rerun kept the step's result from the job it reruns, instead of running it again.
        StepKept => "step_kept",
        /// The step's dependencies are done: its work may be leased.
        StepReady => "step_ready",
        /// An attempt of the step's work was leased to a worker.
        StepLeased => "step_leased",
        /// A live lease on the step's work reported new progress (when the step records it).
        StepProgress => "step_progress",
        /// The step's work completed.
        StepSucceeded => "step_succeeded",
        /// An attempt of the step's work failed and another is scheduled.
        StepRetryScheduled => "step_retry_scheduled",
        /// The step's work failed for good: attempts exhausted or a fatal error.
        StepFailed => "step_failed",
        /// A lease on the step's work ended without a report or heartbeat.
        StepLeaseExpired => "step_lease_expired",
        /// An attempt of the step's work ran past its deadline.
        StepDeadlineExceeded => "step_deadline_exceeded",
        /// The step was cancelled: it was not running, or its attempt ended after its job stopped.
        StepCancelled => "step_cancelled",
        /// An operator retried the failed step, with a fresh attempt budget.
        StepRetried => "step_retried",
        /// An operator skipped the failed step: its dependants go on without it.
        StepSkipped => "step_skipped",
        /// A new round of a whole-job retry set the step back to waiting.
        StepReset => "step_reset",
        /// The step's undo completed.
        StepCompensated => "step_compensated",
        /// The step's undo may be leased: no step depending on it is running or being undone.
        CompensationReady => "compensation_ready",
        /// An attempt of the step's undo was leased to a worker.
        CompensationLeased => "compensation_leased",
        /// A live lease on the step's undo reported new progress (when the step records it).
        CompensationProgress => "compensation_progress",
        /// An attempt of the step's undo failed and another is scheduled.
        CompensationRetryScheduled => "compensation_retry_scheduled",
        /// The step's undo failed for good: attempts exhausted or a fatal error.
        CompensationFailed => "compensation_failed",
        /// A lease on the step's undo ended without a report or heartbeat.
        CompensationLeaseExpired => "compensation_lease_expired",
        /// An attempt of the step's undo ran past its deadline.
        CompensationDeadlineExceeded => "compensation_deadline_exceeded",
        /// An operator retried the step's failed undo, with a fresh attempt budget.
        CompensationRetried => "compensation_retried",
        /// An operator skipped the step's failed undo: the step counts as skipped.
        CompensationSkipped => "compensation_skipped",
    }
}

impl EventKind {
    /// Whether the event is about the job as a whole: one of the `job_…` kinds
    /// (`cancel_requested` is not one).
    pub fn is_job_event(self) -> bool {
        self.as_str().starts_with("job_")
    }
}

/// A kind of event this build does not know, as a stored row or an answer may carry it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown event kind `{0}`")]
pub struct UnknownEventKind(pub String);

impl std::str::FromStr for EventKind {
    type Err = UnknownEventKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventKind::parse(s).ok_or_else(|| UnknownEventKind(s.to_string()))
    }
}

string_enum! {
    /// What raised an alert for a human. Sent to the alert webhook as its snake_case name.
    AlertKind {
        /// The job failed.
        JobFailed => "job_failed",
        /// The job is blocked: it waits for an operator.
        JobBlocked => "job_blocked",
        /// A step's work has failed [`POISON_FAILURES`](crate::machine::POISON_FAILURES) times,
        /// and another attempt is scheduled.
        StepPoisoned => "step_poisoned",
    }
}

/// One entry of a job's history, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// Position in the job's history, from 1.
    pub seq: i64,
    pub at: Timestamp,
    pub kind: EventKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
}

/// An entry to append to a job's history.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    pub at: Timestamp,
    pub kind: EventKind,
    pub step: Option<String>,
    pub attempt: Option<u32>,
    pub detail: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves only a job with an idempotency key carries its spec's fingerprint: a keyless job is
    // never compared with another, so nothing is hashed for it.
    #[test]
    fn only_keyed_jobs_are_fingerprinted() {
        let spec = |body: Value| -> JobSpec { serde_json::from_value(body).expect("spec") };
        let keyed = spec(serde_json::json!({"idempotency_key": "k",
            "steps": [{"name": "s", "agent": "a"}]}));
        let keyless = spec(serde_json::json!({"steps": [{"name": "s", "agent": "a"}]}));
        let at = Timestamp::from_millis(0);
        let job = Job::from_spec(JobId::generate(), &keyed, at);
        assert_eq!(job.fingerprint, keyed.fingerprint());
        assert_eq!(job.fingerprint.len(), 64);
        assert_eq!(
            Job::from_spec(JobId::generate(), &keyless, at).fingerprint,
            ""
        );
    }

    // Proves every event and alert kind is written, serialized, displayed and parsed as one and
    // the same snake_case name, and that an unknown kind is refused with an error naming it.
    #[test]
    fn kinds_are_their_snake_case_names() {
        for &kind in EventKind::ALL {
            let text = kind.as_str();
            assert_eq!(serde_json::to_value(kind).unwrap(), Value::from(text));
            assert_eq!(
                serde_json::from_value::<EventKind>(text.into()).ok(),
                Some(kind)
            );
            assert_eq!(kind.to_string(), text);
            assert_eq!(text.parse::<EventKind>(), Ok(kind));
            assert_eq!(kind.is_job_event(), text.starts_with("job_"));
        }
        for &kind in AlertKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                Value::from(kind.as_str())
            );
            assert_eq!(kind.to_string(), kind.as_str());
        }
        assert_eq!(EventKind::StepLeaseExpired.as_str(), "step_lease_expired");
        assert_eq!(AlertKind::StepPoisoned.as_str(), "step_poisoned");
        let unknown = "step_started".parse::<EventKind>().unwrap_err();
        assert_eq!(unknown.to_string(), "unknown event kind `step_started`");
        assert!(serde_json::from_value::<EventKind>("step_started".into()).is_err());
    }

    // Proves a kind's name takes a width and alignment as a string does (the CLI's history lines
    // line up on it).
    #[test]
    fn kinds_display_with_a_width() {
        assert_eq!(format!("{:<12}|", EventKind::StepReady), "step_ready  |");
        assert_eq!(format!("{:>12}|", AlertKind::JobFailed), "  job_failed|");
    }
}
