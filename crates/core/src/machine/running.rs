//! Work going forward: claims, progress, deadlines, starting and rescheduling a job, and
//! promoting steps whose dependencies are done.

use serde_json::{json, Value};

use super::{Effect, Rejection, Work};
use crate::id::LeaseId;
use crate::job::{CompPhase, DesiredState, EventKind, JobState, StepState};
use crate::spec::OnFailure;
use crate::time::{Span, Timestamp};

impl Work {
    pub(super) fn claim(
        &mut self,
        step: usize,
        lease_id: LeaseId,
        worker: String,
    ) -> Result<(), Rejection> {
        let now = self.now;
        let s = self.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
        let due = s.next_attempt_at.is_none_or(|t| t <= now);
        let undo = s.state == StepState::Compensating && s.comp_phase == Some(CompPhase::Ready);
        let work = s.state == StepState::Ready;
        let claimable = due
            && if undo {
                self.job.state == JobState::Compensating
            } else {
                // Past the job's deadline no work starts, even before the sweep fails the job.
                work && self.job.state == JobState::Running
                    && self.job.desired_state == DesiredState::Succeeded
                    && !self.job.past_deadline(now)
            };
        if !claimable {
            return Err(Rejection::NotClaimable);
        }
        let s = &mut self.job.steps[step];
        s.attempt += 1;
        if undo {
            s.comp_phase = Some(CompPhase::Running);
            s.comp_attempts += 1;
        } else {
            s.state = StepState::Running;
            s.started_at = Some(now);
        }
        s.lease_id = Some(lease_id);
        s.worker = Some(worker.clone());
        // Progress belongs to the attempt that reported it: a new lease starts without.
        s.progress = None;
        s.progress_at = None;
        // The attempt's hard end is fixed now; heartbeats renew the lease only up to it.
        s.attempt_ends_at = s.lease_deadline().map(|d| now.plus(d));
        s.lease_expires_at = Some(s.lease_end(now));
        s.next_attempt_at = None;
        let (attempt, expires) = (s.attempt, s.lease_expires_at);
        let kind = if undo {
            EventKind::CompensationLeased
        } else {
            EventKind::StepLeased
        };
        self.event(
            kind,
            Some(step),
            Some(attempt),
            Some(json!({ "worker": worker, "lease_expires_at": expires })),
        );
        Ok(())
    }

    /// The job's deadline has come while it still wants its work (see [`Command::Deadline`]).
    pub(super) fn deadline_passed(&mut self) {
        let deadline = self.job.deadline;
        self.event(
            EventKind::JobDeadlinePassed,
            None,
            None,
            Some(json!({ "deadline": deadline })),
        );
        let undoes = matches!(
            self.job.on_failure,
            OnFailure::Compensate | OnFailure::CompensateAndRetry
        );
        let to_undo = self
            .job
            .steps
            .iter()
            .any(|s| s.state == StepState::Succeeded && s.compensate.is_some());
        self.cancel_unstarted("the job's deadline passed");
        if undoes && to_undo && self.job.state != JobState::Pending {
            self.event(
                EventKind::JobCompensating,
                None,
                None,
                Some(json!({ "cause": "deadline" })),
            );
            self.begin_unwind();
        } else {
            let detail = json!({ "cause": "deadline", "deadline": deadline });
            self.finish_job(JobState::Failed, Some(detail));
        }
    }

    /// Keeps what a live lease reported as its progress, with the time; records it in the
    /// history only when the step asks for that and the value changed.
    pub(super) fn progress(&mut self, step: usize, attempt: u32, progress: Value) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        let changed = s.progress.as_ref() != Some(&progress);
        let kind = match s.is_compensating() {
            true => EventKind::CompensationProgress,
            false => EventKind::StepProgress,
        };
        let record = s.progress_events && changed;
        s.progress = Some(progress);
        s.progress_at = Some(now);
        if record {
            let detail = json!({ "progress": self.job.steps[step].progress });
            self.event(kind, Some(step), Some(attempt), Some(detail));
        }
    }

    pub(super) fn start(&mut self) {
        self.job.state = JobState::Running;
        self.event(EventKind::JobStarted, None, None, None);
        self.promote();
        self.settle();
    }

    /// Moves the job's `run_at` and/or priority (see [`Command::Reschedule`]). Recorded as one
    /// `job_rescheduled` event with what changed, from and to; changing nothing records nothing.
    pub(super) fn reschedule(
        &mut self,
        run_at: Option<Timestamp>,
        priority: Option<i32>,
        mut detail: Value,
    ) -> Result<(), Rejection> {
        let state = self.job.state;
        if state.is_terminal() {
            return Err(Rejection::JobTerminal { state });
        }
        if run_at.is_some() && state != JobState::Pending {
            return Err(Rejection::NotAllowed {
                reason: format!("the job is {state}; only a pending job's run_at can be changed"),
            });
        }
        let new_run_at = run_at.filter(|&t| Some(t) != self.job.run_at);
        let new_priority = priority.filter(|&p| p != self.job.priority);
        if new_run_at.is_none() && new_priority.is_none() {
            return Ok(());
        }
        if let Some(t) = new_run_at {
            detail["run_at"] = json!({ "from": self.job.run_at, "to": t });
            self.job.run_at = Some(t);
        }
        if let Some(p) = new_priority {
            detail["priority"] = json!({ "from": self.job.priority, "to": p });
            self.job.priority = p;
        }
        self.event(EventKind::JobRescheduled, None, None, Some(detail));
        if let Some(t) = new_run_at {
            // A keyed job starts only when it heads its key, which the store decides: the
            // supervisor looks at the new time (at once when it has come).
            if t <= self.now && self.job.ordering_key.is_none() {
                self.start();
            } else {
                self.effects.push(Effect::Due {
                    at: t.max(self.now),
                });
            }
        }
        Ok(())
    }

    /// Makes every waiting step whose dependencies are all done ready, if the job still runs.
    pub(super) fn promote(&mut self) {
        if self.job.state != JobState::Running || !self.wants_work() {
            return;
        }
        let mut ready = Vec::new();
        for (i, s) in self.job.steps.iter().enumerate() {
            if s.state != StepState::Waiting {
                continue;
            }
            let deps_done = s.depends_on.iter().all(|d| {
                self.job
                    .steps
                    .iter()
                    .find(|x| &x.name == d)
                    .is_some_and(|x| x.state.satisfies_dependants())
            });
            if deps_done {
                ready.push(i);
            }
        }
        for i in ready {
            let now = self.now;
            let s = &mut self.job.steps[i];
            s.state = StepState::Ready;
            s.ready_at = Some(now);
            s.next_attempt_at = Some(now);
            let agent = s.agent.clone();
            self.event(EventKind::StepReady, Some(i), None, None);
            self.wake(agent);
        }
    }

    pub(super) fn wake(&mut self, agent: String) {
        let effect = Effect::Ready { agent };
        if !self.effects.contains(&effect) {
            self.effects.push(effect);
        }
    }

    pub(super) fn wake_at(&mut self, agent: String, delay: Span, at: Timestamp) {
        if delay == Span::ZERO {
            self.wake(agent);
        } else {
            self.effects.push(Effect::ReadyAt { agent, at });
        }
    }
}
