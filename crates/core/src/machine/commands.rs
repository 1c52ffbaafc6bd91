//! One method per [`Command`](super::Command): the checks it must pass and the steps it takes,
//! each answering the [`Reply`] for whoever sent it. [`apply`](super::apply) dispatches here.

use serde_json::{json, Value};

use super::{deadline_error, lease_expired_error, Delay, Rejection, Reply, Work};
use crate::job::{CompPhase, DesiredState, EventKind, JobState, StepState};

impl Work {
    /// A pending job whose `run_at` came starts.
    pub(super) fn activate(&mut self) -> Result<Reply, Rejection> {
        if self.job.state != JobState::Pending || self.job.run_at.is_some_and(|t| t > self.now) {
            return Err(Rejection::NotDue);
        }
        self.start();
        Ok(Reply::Done)
    }

    /// A live lease says it is still working: the lease is renewed (never past the attempt's
    /// deadline), progress kept, and the holder told whether the job still wants the work.
    pub(super) fn heartbeat(
        &mut self,
        step: usize,
        attempt: u32,
        progress: Option<Value>,
    ) -> Result<Reply, Rejection> {
        self.check_live(step, attempt)?;
        // An undo is never told to stop: it is how a stopping job cleans up.
        let cancel = !self.job.steps[step].is_compensating() && !self.wants_work();
        if let Some(progress) = progress {
            self.progress(step, attempt, progress);
        }
        let s = &mut self.job.steps[step];
        let expires = s.lease_end(self.now);
        s.lease_expires_at = Some(expires);
        Ok(Reply::Heartbeat {
            lease_expires_at: expires,
            cancel,
        })
    }

    /// A live lease's work (or undo) completed. A result that arrives after the job stopped
    /// wanting its work is refused, and the step cancelled.
    pub(super) fn complete(
        &mut self,
        step: usize,
        attempt: u32,
        result: Value,
    ) -> Result<Reply, Rejection> {
        self.check_live(step, attempt)?;
        if self.job.steps[step].is_compensating() {
            self.undo_done(step, attempt, result);
            self.settle();
            return Ok(Reply::Done);
        }
        if !self.wants_work() {
            self.cancel_step(step, "its result arrived after the job stopped");
            self.settle();
            let reason = format!(
                "the job is {} and no longer takes results",
                self.stop_reason()
            );
            return Ok(Reply::Refused(Rejection::LeaseLost { reason }));
        }
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.state = StepState::Succeeded;
        s.result = Some(result);
        s.finished_at = Some(now);
        s.lease_expires_at = None;
        self.event(EventKind::StepSucceeded, Some(step), Some(attempt), None);
        self.promote();
        self.settle();
        Ok(Reply::Done)
    }

    /// A live lease's attempt failed; it is retried after `delay` if it may be.
    pub(super) fn fail(
        &mut self,
        step: usize,
        attempt: u32,
        error: &str,
        retryable: bool,
        delay: Delay,
    ) -> Result<Reply, Rejection> {
        self.check_live(step, attempt)?;
        self.report_failure(step, attempt, error, retryable, delay, "");
        Ok(Reply::Done)
    }

    /// A lease ended without a report: its holder went silent, or the attempt ran past its
    /// deadline. Either way a failed attempt, retried by the step's policy.
    pub(super) fn expire(
        &mut self,
        step: usize,
        attempt: u32,
        jitter: f64,
    ) -> Result<Reply, Rejection> {
        let s = self.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
        let expired = s.is_leased()
            && s.attempt == attempt
            && s.lease_expires_at.is_some_and(|t| t <= self.now);
        if !expired {
            return Err(Rejection::NotExpired);
        }
        // The history tells a deadline overrun from silence: one ran too long, the other
        // stopped heartbeating.
        let (kind, error) = match (s.is_compensating(), s.lease_ends_at_deadline()) {
            (true, false) => (EventKind::CompensationLeaseExpired, lease_expired_error()),
            (false, false) => (EventKind::StepLeaseExpired, lease_expired_error()),
            (true, true) => (EventKind::CompensationDeadlineExceeded, deadline_error(s)),
            (false, true) => (EventKind::StepDeadlineExceeded, deadline_error(s)),
        };
        self.event(kind, Some(step), Some(attempt), None);
        let delay = Delay::Backoff(jitter);
        self.report_failure(step, attempt, &error, true, delay, "expired");
        Ok(Reply::Done)
    }

    /// The job's deadline passed while it still wanted its work.
    pub(super) fn deadline(&mut self) -> Result<Reply, Rejection> {
        if self.job.deadline_due().is_none_or(|t| t > self.now) {
            return Err(Rejection::NotDue);
        }
        self.deadline_passed();
        Ok(Reply::Done)
    }

    /// A client asked for the job to stop: what has not started is cancelled now; running work
    /// learns of it at its next heartbeat, and the job unwinds once none runs. Asking again
    /// changes nothing.
    pub(super) fn cancel(&mut self) -> Result<Reply, Rejection> {
        if self.job.state.is_terminal() {
            return Err(Rejection::JobTerminal {
                state: self.job.state,
            });
        }
        if self.job.desired_state == DesiredState::Cancelled {
            return Ok(Reply::Done);
        }
        self.job.desired_state = DesiredState::Cancelled;
        self.event(EventKind::CancelRequested, None, None, None);
        if self.job.state == JobState::Pending {
            self.cancel_unstarted("the job was cancelled");
            self.finish_job(JobState::Cancelled, None);
        } else if self.job.state != JobState::Compensating {
            self.cancel_unstarted("the job was cancelled");
            self.settle();
        }
        Ok(Reply::Done)
    }

    /// An operator retries a blocked job's failed step (or failed undo) with a fresh budget.
    pub(super) fn retry(&mut self, step: usize, detail: Value) -> Result<Reply, Rejection> {
        self.require_blocked("retry a step")?;
        let s = self.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
        let unwinding = self.unwinding();
        if s.state == StepState::Failed {
            self.check_work_wanted(step, true)?;
            self.retry_step(step, detail);
        } else if s.comp_phase == Some(CompPhase::Failed) {
            self.retry_undo(step, detail);
        } else {
            return Err(Rejection::NotAllowed {
                reason: format!(
                    "step `{}` is {}; only a failed step or a failed undo can be retried",
                    s.name, s.state
                ),
            });
        }
        self.unblock(unwinding);
        Ok(Reply::Done)
    }

    /// An operator skips a blocked job's failed step (its dependants go on without it) or its
    /// failed undo (the step counts as skipped).
    pub(super) fn skip(&mut self, step: usize, detail: Value) -> Result<Reply, Rejection> {
        self.require_blocked("skip a step")?;
        let s = self.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
        let unwinding = self.unwinding();
        let kind = if s.state == StepState::Failed {
            self.check_work_wanted(step, false)?;
            EventKind::StepSkipped
        } else if s.comp_phase == Some(CompPhase::Failed) {
            EventKind::CompensationSkipped
        } else {
            return Err(Rejection::NotAllowed {
                reason: format!(
                    "step `{}` is {}; only a failed step or a failed undo can be skipped",
                    s.name, s.state
                ),
            });
        };
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.state = StepState::Skipped;
        s.comp_phase = None;
        s.finished_at = Some(now);
        self.event(kind, Some(step), None, Some(detail));
        self.unblock(unwinding);
        Ok(Reply::Done)
    }

    /// An operator resumes a blocked job: its failed steps and failed undos are retried.
    pub(super) fn resume(&mut self, detail: Value) -> Result<Reply, Rejection> {
        self.require_blocked("resume")?;
        self.event(EventKind::JobResumed, None, None, Some(detail.clone()));
        let unwinding = self.unwinding();
        // An unwinding or cancelled job has given its failed work up: only its undos resume.
        let retry_work = !unwinding && self.wants_work();
        for i in 0..self.job.steps.len() {
            if self.job.steps[i].state == StepState::Failed && retry_work {
                self.retry_step(i, detail.clone());
            } else if self.job.steps[i].comp_phase == Some(CompPhase::Failed) {
                self.retry_undo(i, detail.clone());
            }
        }
        self.unblock(unwinding);
        Ok(Reply::Done)
    }

    /// Moves the job on as its steps call for, recording what that took (`job_repaired`) when
    /// it took anything.
    pub(super) fn repair(&mut self) -> Result<Reply, Rejection> {
        let before = self.events.len();
        self.promote();
        self.settle();
        if self.events.len() > before {
            let healed: Vec<Value> = self.events[before..]
                .iter()
                .map(|e| json!(e.kind))
                .collect();
            let detail = json!({ "applied": healed });
            self.event(EventKind::JobRepaired, None, None, Some(detail));
        }
        Ok(Reply::Done)
    }
}

/// What an operator's action records about itself.
pub(super) fn operator_detail(by: Option<String>, reason: Option<String>) -> Value {
    json!({ "by": by, "reason": reason })
}
