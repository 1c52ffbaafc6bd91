//! Stopping and undoing: cancels, compensation in reverse dependency order, and the rounds
//! of a whole-job retry.

use serde_json::{json, Value};

use super::{Delay, Effect, Work};
use crate::job::{CompPhase, DesiredState, EventKind, JobRetry, JobState, StepState};
use crate::spec::JobExhausted;
use crate::time::Span;

impl Work {
    pub(super) fn cancel_step(&mut self, step: usize, why: &str) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        let attempt = (s.attempt > 0).then_some(s.attempt);
        s.state = StepState::Cancelled;
        s.finished_at = Some(now);
        s.lease_expires_at = None;
        s.next_attempt_at = None;
        self.event(
            EventKind::StepCancelled,
            Some(step),
            attempt,
            Some(json!({ "reason": why })),
        );
    }

    /// Cancels every step that has not started; running ones learn it from their heartbeat.
    pub(super) fn cancel_unstarted(&mut self, why: &str) {
        for i in 0..self.job.steps.len() {
            if matches!(
                self.job.steps[i].state,
                StepState::Waiting | StepState::Ready
            ) {
                self.cancel_step(i, why);
            }
        }
    }

    /// Starts undoing: every succeeded step that declares `compensate` will be undone.
    pub(super) fn begin_unwind(&mut self) {
        self.job.state = JobState::Compensating;
        self.job.blocked_reason = None;
        for i in 0..self.job.steps.len() {
            let s = &mut self.job.steps[i];
            if s.state == StepState::Succeeded && s.compensate.is_some() {
                s.state = StepState::Compensating;
                s.comp_phase = Some(CompPhase::Waiting);
                s.lease_id = None;
                s.worker = None;
            }
        }
        self.advance_unwind();
    }

    /// Readies every undo whose dependants are all undone (or never need undoing), once no
    /// step's work is still running; finishes the job when nothing is left to undo.
    pub(super) fn advance_unwind(&mut self) {
        if self.job.state != JobState::Compensating {
            return;
        }
        let steps = &self.job.steps;
        if steps.iter().any(|s| s.state == StepState::Running) {
            return;
        }
        let n = steps.len();
        // dependants[i]: every step that depends on step i, directly or not.
        let mut eligible = Vec::new();
        for i in 0..n {
            if steps[i].state != StepState::Compensating
                || steps[i].comp_phase != Some(CompPhase::Waiting)
            {
                continue;
            }
            let mut stack = vec![i];
            let mut seen = vec![false; n];
            let mut blocked = false;
            while let Some(x) = stack.pop() {
                for (j, sj) in steps.iter().enumerate() {
                    if !seen[j] && sj.depends_on.iter().any(|d| d == &steps[x].name) {
                        seen[j] = true;
                        if matches!(sj.state, StepState::Running | StepState::Compensating) {
                            blocked = true;
                        }
                        stack.push(j);
                    }
                }
            }
            if !blocked {
                eligible.push(i);
            }
        }
        for i in eligible {
            let now = self.now;
            let s = &mut self.job.steps[i];
            s.comp_phase = Some(CompPhase::Ready);
            s.next_attempt_at = Some(now);
            s.ready_at = Some(now);
            let agent = s.compensate.as_ref().map(|c| c.agent.clone());
            self.event(EventKind::CompensationReady, Some(i), None, None);
            if let Some(agent) = agent {
                self.wake(agent);
            }
        }
        let done = self
            .job
            .steps
            .iter()
            .all(|s| !matches!(s.state, StepState::Compensating | StepState::Running));
        if done {
            let undone = self.job.compensated_steps();
            if self.job.desired_state == DesiredState::Cancelled {
                self.finish_job(JobState::Cancelled, Some(json!({ "compensated": undone })));
            } else if let Some(retry) = self.next_round() {
                self.new_round(retry, undone);
            } else {
                self.finish_job(JobState::Failed, Some(json!({ "compensated": undone })));
            }
        }
    }

    /// Whether a step that fails for good now blocks the job rather than unwinding it: the job
    /// is in the last round of a whole-job retry whose `then` is `hold`.
    pub(super) fn holds_last_round(&self) -> bool {
        self.job
            .retry
            .is_some_and(|r| r.then == JobExhausted::Hold && self.job.round >= r.attempts)
    }

    /// The policy of a whole-job retry that may run another round now: rounds left, and the
    /// job's deadline (if any) not passed.
    pub(super) fn next_round(&self) -> Option<JobRetry> {
        let retry = self.job.retry?;
        let left = self.job.round < retry.attempts;
        (left && !self.job.past_deadline(self.now)).then_some(retry)
    }

    /// Starts the whole job again once a round was undone: every step back to its initial
    /// state, the roots ready after the job's backoff. Attempts keep counting (they are the
    /// fencing token), so a late report of an earlier round can never be taken in this one;
    /// each round gets fresh attempt budgets (`failures` keeps counting, so backoff keeps growing).
    pub(super) fn new_round(&mut self, retry: JobRetry, undone: Vec<String>) {
        let delay = retry.backoff.delay(self.job.round, 0.0);
        self.job.round += 1;
        let round = self.job.round;
        for s in &mut self.job.steps {
            s.state = StepState::Waiting;
            s.budget_from = s.attempt;
            s.comp_phase = None;
            s.comp_budget_from = s.comp_attempts;
            s.lease_id = None;
            s.worker = None;
            s.ready_at = None;
            s.started_at = None;
            s.finished_at = None;
            s.lease_expires_at = None;
            s.next_attempt_at = None;
            s.result = None;
            s.progress = None;
            s.progress_at = None;
        }
        self.job.state = JobState::Running;
        let at = self.now.plus(delay);
        self.event(
            EventKind::JobRoundStarted,
            None,
            None,
            Some(json!({ "round": round, "undone": undone, "delay": delay, "at": at })),
        );
        for i in 0..self.job.steps.len() {
            self.event(
                EventKind::StepReset,
                Some(i),
                None,
                Some(json!({ "round": round })),
            );
        }
        let before = self.effects.len();
        self.promote();
        // The roots wait out the job's backoff: each is claimable only from `at`.
        let woken: Vec<Effect> = self.effects.split_off(before);
        for s in &mut self.job.steps {
            if s.state == StepState::Ready {
                s.next_attempt_at = Some(at);
            }
        }
        for e in woken {
            match e {
                Effect::Ready { agent } if delay > Span::ZERO => {
                    self.effects.push(Effect::ReadyAt { agent, at })
                }
                other => self.effects.push(other),
            }
        }
    }

    pub(super) fn undo_done(&mut self, step: usize, attempt: u32, result: Value) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.state = StepState::Compensated;
        s.comp_phase = None;
        s.finished_at = Some(now);
        s.lease_expires_at = None;
        self.event(
            EventKind::StepCompensated,
            Some(step),
            Some(attempt),
            Some(json!({ "result": result })),
        );
    }

    pub(super) fn undo_failed(
        &mut self,
        step: usize,
        attempt: u32,
        error: &str,
        retryable: bool,
        delay: Delay,
    ) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.comp_failures += 1;
        s.lease_expires_at = None;
        let max = s.comp_max_attempts();
        let used = s.comp_attempts - s.comp_budget_from.min(s.comp_attempts);
        if retryable && (max == 0 || used < max) {
            let delay = delay.of(s, s.comp_failures);
            let at = now.plus(delay);
            s.comp_phase = Some(CompPhase::Ready);
            s.next_attempt_at = Some(at);
            let agent = s
                .compensate
                .as_ref()
                .map(|c| c.agent.clone())
                .unwrap_or_default();
            self.event(
                EventKind::CompensationRetryScheduled,
                Some(step),
                Some(attempt),
                Some(json!({ "error": error, "delay": delay, "next_attempt_at": at })),
            );
            self.wake_at(agent, delay, at);
        } else {
            s.comp_phase = Some(CompPhase::Failed);
            let name = s.name.clone();
            let reason = if retryable {
                "attempts exhausted"
            } else {
                "fatal error"
            };
            self.event(
                EventKind::CompensationFailed,
                Some(step),
                Some(attempt),
                Some(json!({ "error": error, "reason": reason })),
            );
            self.block(format!("compensation of step `{name}` failed: {error}"));
        }
    }
}
