//! Failed attempts: retries with backoff, poisoned steps, blocking for an operator and the
//! operator's retries.

use serde_json::{json, Value};

use super::{Delay, Work, POISON_FAILURES};
use crate::job::{AlertKind, CompPhase, EventKind, JobState, StepState};
use crate::spec::OnFailure;
use crate::time::Span;

impl Work {
    /// A failed attempt, reported or found expired, of the step's work or of its undo.
    pub(super) fn report_failure(
        &mut self,
        step: usize,
        attempt: u32,
        error: &str,
        retryable: bool,
        delay: Delay,
        how: &str,
    ) {
        self.job.steps[step].last_error = Some(error.to_string());
        if self.job.steps[step].is_compensating() {
            self.undo_failed(step, attempt, error, retryable, delay);
        } else if !self.wants_work() {
            let why = if how == "expired" {
                "its lease expired after the job stopped"
            } else {
                "it stopped after the job stopped"
            };
            self.cancel_step(step, why);
        } else {
            self.failed_attempt(step, error, retryable, delay);
        }
        self.settle();
    }

    /// Counts a failed attempt of a step's work and either schedules a retry or fails the step.
    pub(super) fn failed_attempt(
        &mut self,
        step: usize,
        error: &str,
        retryable: bool,
        delay: Delay,
    ) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.failures += 1;
        s.lease_expires_at = None;
        let attempt = s.attempt;
        let used = s.attempt - s.budget_from.min(s.attempt);
        let attempts_left = s.max_attempts == 0 || used < s.max_attempts;
        let failures = s.failures;
        if retryable && attempts_left {
            let delay: Span = delay.of(s, failures);
            let at = now.plus(delay);
            s.state = StepState::Ready;
            s.ready_at = Some(now);
            s.next_attempt_at = Some(at);
            let agent = s.agent.clone();
            self.event(
                EventKind::StepRetryScheduled,
                Some(step),
                Some(attempt),
                Some(json!({ "error": error, "delay": delay, "next_attempt_at": at })),
            );
            self.wake_at(agent, delay, at);
            if failures == POISON_FAILURES {
                let name = self.job.steps[step].name.clone();
                self.alert(
                    AlertKind::StepPoisoned,
                    Some(step),
                    format!("step `{name}` has failed {failures} times; last error: {error}"),
                );
            }
        } else {
            s.state = StepState::Failed;
            s.finished_at = Some(now);
            let reason = if retryable {
                "attempts exhausted"
            } else {
                "fatal error"
            };
            self.event(
                EventKind::StepFailed,
                Some(step),
                Some(attempt),
                Some(json!({ "error": error, "reason": reason })),
            );
            self.step_poisoned(step, error);
        }
    }

    /// A step failed for good: the job's `on_failure` decides what follows.
    pub(super) fn step_poisoned(&mut self, step: usize, error: &str) {
        let name = self.job.steps[step].name.clone();
        if self.job.state != JobState::Running {
            // Already blocked by another step (hold): this one waits for the operator too.
            if self.job.state == JobState::Blocked {
                self.job.blocked_reason = self.job.block_cause();
            }
            return;
        }
        match self.job.on_failure {
            OnFailure::Fail => {
                self.cancel_unstarted("the job failed");
                let detail = json!({ "step": name, "error": error });
                self.finish_job(JobState::Failed, Some(detail));
            }
            OnFailure::Hold => {
                let reason = format!("step `{name}` failed: {error}");
                self.block(reason);
            }
            OnFailure::CompensateAndRetry if self.holds_last_round() => {
                let (round, rounds) = (self.job.round, self.job.retry.map_or(1, |r| r.attempts));
                let reason = format!(
                    "step `{name}` failed: {error} (in the last round, {round} of {rounds})"
                );
                self.block(reason);
            }
            OnFailure::Compensate | OnFailure::CompensateAndRetry => {
                self.cancel_unstarted("the job is compensating");
                let mut detail = json!({ "step": name, "error": error });
                if self.job.retry.is_some() {
                    detail["round"] = json!(self.job.round);
                }
                self.event(EventKind::JobCompensating, None, None, Some(detail));
                self.begin_unwind();
            }
        }
    }

    pub(super) fn block(&mut self, reason: String) {
        self.job.state = JobState::Blocked;
        self.event(
            EventKind::JobBlocked,
            None,
            None,
            Some(json!({ "reason": reason })),
        );
        self.alert(
            AlertKind::JobBlocked,
            None,
            format!("job {} is blocked: {reason}", self.job.id),
        );
        self.job.blocked_reason = Some(reason);
    }

    /// Leaves `blocked` once nothing is left for the operator: no failed undo and, unless the
    /// job unwinds (its failed work is given up and stays failed), no failed step. `unwinding`
    /// is taken before the operator's action: skipping the last failed undo leaves no step
    /// compensating, yet the unwind must still be finished.
    pub(super) fn unblock(&mut self, unwinding: bool) {
        if self.job.state != JobState::Blocked {
            return;
        }
        let still_failed = self.job.steps.iter().any(|s| {
            s.comp_phase == Some(CompPhase::Failed) || (!unwinding && s.state == StepState::Failed)
        });
        if still_failed {
            // Still blocked, but perhaps by less than before: name what is left.
            self.job.blocked_reason = self.job.block_cause();
            return;
        }
        self.job.blocked_reason = None;
        self.job.state = if unwinding {
            JobState::Compensating
        } else {
            JobState::Running
        };
        self.event(
            EventKind::JobUnblocked,
            None,
            None,
            Some(json!({ "state": self.job.state })),
        );
        self.promote();
        self.settle();
    }

    pub(super) fn retry_step(&mut self, step: usize, detail: Value) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.state = StepState::Ready;
        s.budget_from = s.attempt;
        s.ready_at = Some(now);
        s.next_attempt_at = Some(now);
        s.finished_at = None;
        let agent = s.agent.clone();
        self.event(EventKind::StepRetried, Some(step), None, Some(detail));
        // A step whose dependencies are not all done goes back to waiting, not ready.
        let deps_done = {
            let s = &self.job.steps[step];
            s.depends_on.iter().all(|d| {
                self.job
                    .steps
                    .iter()
                    .any(|x| &x.name == d && x.state.satisfies_dependants())
            })
        };
        if !deps_done {
            let s = &mut self.job.steps[step];
            s.state = StepState::Waiting;
            s.next_attempt_at = None;
        } else {
            self.wake(agent);
        }
    }

    pub(super) fn retry_undo(&mut self, step: usize, detail: Value) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.comp_phase = Some(CompPhase::Ready);
        s.comp_budget_from = s.comp_attempts;
        s.next_attempt_at = Some(now);
        let agent = s.compensate.as_ref().map(|c| c.agent.clone());
        self.event(
            EventKind::CompensationRetried,
            Some(step),
            None,
            Some(detail),
        );
        if let Some(agent) = agent {
            self.wake(agent);
        }
    }
}
