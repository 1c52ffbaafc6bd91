//! A job and its steps as the system records them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backoff::Backoff;
use crate::id::{JobId, LeaseId};
use crate::spec::{CompensateSpec, JobSpec, OnFailure, DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT};
use crate::time::{Span, Timestamp};

macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

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
                f.write_str(self.as_str())
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
    /// Fingerprint of the submitted spec, to compare resubmissions with the same key.
    pub fingerprint: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub run_at: Option<Timestamp>,
    pub ordering_key: Option<String>,
    pub callback_url: Option<String>,
    pub on_failure: OnFailure,
    pub state: JobState,
    pub desired_state: DesiredState,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    pub steps: Vec<Step>,
}

/// One step of a job, with its current attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    pub agent: String,
    pub payload: Value,
    pub depends_on: Vec<String>,
    pub timeout: Span,
    /// 0 means no limit.
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub compensate: Option<CompensateSpec>,
    pub state: StepState,
    /// Leases handed out so far; the current lease's fencing token.
    pub attempt: u32,
    pub failures: u32,
    pub lease_id: Option<LeaseId>,
    pub worker: Option<String>,
    pub created_at: Timestamp,
    pub ready_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub lease_expires_at: Option<Timestamp>,
    pub next_attempt_at: Option<Timestamp>,
    pub result: Option<Value>,
    pub last_error: Option<String>,
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
                agent: s.agent.clone(),
                payload: s.payload.clone(),
                depends_on: s.depends_on.clone(),
                timeout: s.timeout.unwrap_or(DEFAULT_TIMEOUT),
                max_attempts: s.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS),
                backoff: s.backoff.unwrap_or_default(),
                compensate: s.compensate.clone(),
                state: StepState::Waiting,
                attempt: 0,
                failures: 0,
                lease_id: None,
                worker: None,
                created_at: now,
                ready_at: None,
                started_at: None,
                finished_at: None,
                lease_expires_at: None,
                next_attempt_at: None,
                result: None,
                last_error: None,
            })
            .collect();
        Job {
            id,
            idempotency_key: spec.idempotency_key.clone(),
            fingerprint: spec.fingerprint(),
            labels: spec.labels.clone(),
            priority: spec.priority,
            run_at: spec.run_at,
            ordering_key: spec.ordering_key.clone(),
            callback_url: spec.callback_url.clone(),
            on_failure: spec.on_failure.unwrap_or(OnFailure::Fail),
            state: JobState::Pending,
            desired_state: DesiredState::Succeeded,
            created_at: now,
            updated_at: now,
            finished_at: None,
            steps,
        }
    }

    pub fn step_index(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }

    /// The results of a step's dependencies, by dependency name.
    pub fn inputs_of(&self, step: usize) -> serde_json::Map<String, Value> {
        let mut inputs = serde_json::Map::new();
        for dep in &self.steps[step].depends_on {
            if let Some(d) = self.steps.iter().find(|s| &s.name == dep) {
                inputs.insert(dep.clone(), d.result.clone().unwrap_or(Value::Null));
            }
        }
        inputs
    }

    /// The stable key a step's remote effects can be deduplicated by, the same for every attempt.
    pub fn step_idempotency_key(&self, step: usize) -> String {
        format!("{}/{}", self.id, self.steps[step].name)
    }
}

/// One entry of a job's history, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Position in the job's history, from 1.
    pub seq: i64,
    pub at: Timestamp,
    pub kind: String,
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
    pub kind: &'static str,
    pub step: Option<String>,
    pub attempt: Option<u32>,
    pub detail: Option<Value>,
}
