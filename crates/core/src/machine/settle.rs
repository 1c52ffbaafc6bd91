//! Settling a transition: the job's final state, work parked while it is blocked, and the
//! finished [`Transition`](super::Transition).

use serde_json::{json, Value};

use super::{retired_leases, Effect, Reply, Transition, Work};
use crate::job::{AlertKind, CompPhase, DesiredState, EventKind, Job, JobState, StepState};

impl Work {
    pub(super) fn finish_job(&mut self, state: JobState, detail: Option<Value>) {
        self.job.state = state;
        self.job.finished_at = Some(self.now);
        self.job.blocked_reason = None;
        let kind = match state {
            JobState::Succeeded => EventKind::JobSucceeded,
            JobState::Failed => EventKind::JobFailed,
            _ => EventKind::JobCancelled,
        };
        self.event(kind, None, None, detail);
        self.effects.push(Effect::Finished { state });
        if state == JobState::Failed {
            let id = self.job.id;
            self.alert(AlertKind::JobFailed, None, format!("job {id} failed"));
        }
        if self.job.callback_url.is_some() {
            self.effects.push(Effect::Callback { state });
        }
    }

    /// Moves the job on as its steps call for: into unwinding once a cancel has nothing running,
    /// along its unwinding, or to `succeeded`.
    pub(super) fn settle(&mut self) {
        match self.job.state {
            JobState::Running | JobState::Blocked => {
                // Blocked on a failed undo: only an operator moves the job on.
                if self
                    .job
                    .steps
                    .iter()
                    .any(|s| s.state == StepState::Compensating)
                {
                    return;
                }
                if self.job.desired_state == DesiredState::Cancelled {
                    if self.job.steps.iter().all(|s| s.state != StepState::Running) {
                        self.cancel_unstarted("the job was cancelled");
                        let to_undo = self
                            .job
                            .steps
                            .iter()
                            .any(|s| s.state == StepState::Succeeded && s.compensate.is_some());
                        if to_undo {
                            self.event(
                                EventKind::JobCompensating,
                                None,
                                None,
                                Some(json!({ "cause": "cancel" })),
                            );
                            self.begin_unwind();
                        } else {
                            self.finish_job(JobState::Cancelled, None);
                        }
                    }
                } else if self.job.state == JobState::Running
                    && self
                        .job
                        .steps
                        .iter()
                        .all(|s| s.state.satisfies_dependants())
                {
                    self.finish_job(JobState::Succeeded, None);
                }
            }
            JobState::Compensating => self.advance_unwind(),
            _ => {}
        }
    }

    /// Nothing new starts while blocked: ready work and ready undos wait again (and are made
    /// ready anew when the job is unblocked), so they are neither claimable nor woken. Done for
    /// every transition that leaves the job blocked, as work also becomes ready while blocked
    /// (a running sibling's retry, an operator's retry while another failure remains).
    pub(super) fn park(&mut self) {
        for s in &mut self.job.steps {
            if s.state == StepState::Ready {
                s.state = StepState::Waiting;
                s.next_attempt_at = None;
            } else if s.comp_phase == Some(CompPhase::Ready) {
                s.comp_phase = Some(CompPhase::Waiting);
                s.next_attempt_at = None;
            }
        }
        self.effects
            .retain(|e| !matches!(e, Effect::Ready { .. } | Effect::ReadyAt { .. }));
    }

    pub(super) fn finish(mut self, before: &Job, reply: Reply) -> Transition {
        if self.job.state == JobState::Blocked {
            self.park();
        }
        // A step row also holds what it derives from the job's priority (its claim rank), so a
        // new priority changes every step.
        let priority_changed = self.job.priority != before.priority;
        let changed_steps: Vec<usize> = (0..self.job.steps.len())
            .filter(|&i| priority_changed || before.steps.get(i) != Some(&self.job.steps[i]))
            .collect();
        let job_fields_changed = priority_changed
            || self.job.run_at != before.run_at
            || self.job.state != before.state
            || self.job.desired_state != before.desired_state
            || self.job.finished_at != before.finished_at
            || self.job.blocked_reason != before.blocked_reason
            || self.job.round != before.round
            || self.job.rerun_by != before.rerun_by;
        if job_fields_changed || !self.events.is_empty() {
            self.job.updated_at = self.now;
        }
        let job_changed = self.job.updated_at != before.updated_at || job_fields_changed;
        debug_assert!(
            self.job.same_admission(before),
            "a transition changed what was fixed at admission"
        );
        debug_assert!(
            self.job.steps.iter().all(|s| s.claim_agent().is_none()
                || matches!((s.ready_at, s.next_attempt_at), (Some(r), Some(n)) if n >= r)),
            "a claimable step lacks its ready time or is due before it became ready"
        );
        let retired_leases = retired_leases(before, &self.job);
        debug_assert!(
            retired_leases
                .iter()
                .all(|r| changed_steps.contains(&r.step)),
            "a lease was retired from a step the transition does not write"
        );
        let leases_only = Transition::only_leases(
            &self.events,
            &self.effects,
            &retired_leases,
            job_fields_changed,
        );
        Transition {
            leases_only,
            job: self.job,
            job_changed,
            changed_steps,
            events: self.events,
            effects: self.effects,
            reply,
            retired_leases,
        }
    }
}
