//! A transition being built: its history and effects, and the checks a command must pass.

use serde_json::Value;

use super::{Effect, Rejection, Work};
use crate::job::{AlertKind, DesiredState, EventKind, Job, JobState, NewEvent, StepState};
use crate::time::Timestamp;

impl Work {
    pub(super) fn new(job: Job, now: Timestamp) -> Self {
        Work {
            job,
            now,
            events: Vec::new(),
            effects: Vec::new(),
        }
    }

    pub(super) fn event(
        &mut self,
        kind: EventKind,
        step: Option<usize>,
        attempt: Option<u32>,
        detail: Option<Value>,
    ) {
        self.events.push(NewEvent {
            at: self.now,
            kind,
            step: step.map(|i| self.job.steps[i].name.clone()),
            attempt,
            detail,
        });
    }

    pub(super) fn alert(&mut self, kind: AlertKind, step: Option<usize>, message: String) {
        let step = step.map(|i| self.job.steps[i].name.clone());
        self.effects.push(Effect::Alert {
            kind,
            step,
            message,
        });
    }

    /// Whether the job still wants its steps' work: not cancelled, not unwinding, not finished.
    pub(super) fn wants_work(&self) -> bool {
        self.job.desired_state == DesiredState::Succeeded
            && matches!(self.job.state, JobState::Running | JobState::Blocked)
    }

    pub(super) fn stop_reason(&self) -> &'static str {
        match self.job.state {
            JobState::Compensating => "compensating",
            s if s.is_terminal() => s.as_str(),
            _ => "being cancelled",
        }
    }

    /// Whether an unwind is under way: some step is being undone (or waits to be).
    pub(super) fn unwinding(&self) -> bool {
        self.job
            .steps
            .iter()
            .any(|s| s.state == StepState::Compensating)
    }

    /// A failed step's work may be retried or skipped only while the job has not given it up:
    /// not once the job unwinds, and (for a retry) not once it is being cancelled.
    pub(super) fn check_work_wanted(&self, step: usize, retry: bool) -> Result<(), Rejection> {
        let name = &self.job.steps[step].name;
        let reason = if self.unwinding() {
            format!("the job is unwinding: step `{name}` stays failed; retry or skip its failed undos instead")
        } else if retry && !self.wants_work() {
            format!("the job is being cancelled: step `{name}` cannot be retried")
        } else {
            return Ok(());
        };
        Err(Rejection::NotAllowed { reason })
    }

    pub(super) fn require_blocked(&self, what: &str) -> Result<(), Rejection> {
        if self.job.state == JobState::Blocked {
            Ok(())
        } else {
            Err(Rejection::NotAllowed {
                reason: format!(
                    "the job is {}; only a blocked job lets an operator {what}",
                    self.job.state
                ),
            })
        }
    }

    /// The fencing check every agent report goes through.
    pub(super) fn check_live(&self, step: usize, attempt: u32) -> Result<(), Rejection> {
        let s = self.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
        let reason = if s.attempt != attempt {
            format!("attempt {attempt} was superseded by attempt {}", s.attempt)
        } else if !s.is_leased() {
            format!("the step is {}", s.state)
        } else if s.lease_expires_at.is_none_or(|t| t <= self.now) {
            "the lease expired".to_string()
        } else {
            return Ok(());
        };
        Err(Rejection::LeaseLost { reason })
    }
}
