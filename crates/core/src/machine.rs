//! The job and step state machines as one pure function.
//!
//! [`apply`] takes a job as stored, a command and the current time, and returns the job's next
//! state together with the history to append, the effects to carry out (wake agents, wake
//! waiters) and the answer for whoever sent the command. It never reads a clock or a random
//! number: the caller passes `now` and any jitter. An illegal command is a typed [`Rejection`].
//!
//! ```mermaid
//! stateDiagram-v2
//!     state "Job" as job {
//!         [*] --> pending: submit (run_at ahead)
//!         [*] --> running: submit
//!         pending --> running: run_at reached
//!         pending --> cancelled: cancel
//!         running --> succeeded: every step succeeded or skipped
//!         running --> failed: a step failed permanently
//!         running --> cancelled: cancel, once no step is running
//!     }
//!     state "Step" as step {
//!         [*] --> waiting
//!         waiting --> ready: dependencies done
//!         ready --> running: claim (attempt + 1)
//!         running --> running: heartbeat
//!         running --> succeeded: complete
//!         running --> ready: fail (retryable) / lease expired, attempts left
//!         running --> failed: fail (fatal) / attempts exhausted
//!         running --> cancelled: report or expiry after the job stopped wanting it
//!         waiting --> cancelled: job cancelled or failed
//!         ready --> cancelled: job cancelled or failed
//!     }
//! ```

use serde_json::{json, Value};

use crate::id::LeaseId;
use crate::job::{DesiredState, Job, JobState, NewEvent, StepState};
use crate::time::{Span, Timestamp};

/// Something that happens to a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// The job's `run_at` has come.
    Activate,
    /// An agent takes a lease on a ready step.
    Claim {
        step: usize,
        lease_id: LeaseId,
        worker: String,
    },
    /// The holder of a lease asks for more time.
    Heartbeat { step: usize, attempt: u32 },
    /// The holder of a lease reports success.
    Complete {
        step: usize,
        attempt: u32,
        result: Value,
    },
    /// The holder of a lease reports failure. `jitter` in `[0, 1)` spreads the retry.
    Fail {
        step: usize,
        attempt: u32,
        error: String,
        retryable: bool,
        jitter: f64,
    },
    /// The supervisor found the lease past its expiry with no report.
    Expire {
        step: usize,
        attempt: u32,
        jitter: f64,
    },
    /// A client wants the job stopped.
    Cancel,
}

impl Command {
    pub fn name(&self) -> &'static str {
        match self {
            Command::Activate => "activate",
            Command::Claim { .. } => "claim",
            Command::Heartbeat { .. } => "heartbeat",
            Command::Complete { .. } => "complete",
            Command::Fail { .. } => "fail",
            Command::Expire { .. } => "expire",
            Command::Cancel => "cancel",
        }
    }
}

/// Why a command was refused. Nothing changes when a command is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The report's attempt is not the step's live lease (expired, superseded, or settled).
    #[error("lease is no longer live: {reason}")]
    LeaseLost { reason: String },
    /// The job is already finished; there is nothing to cancel.
    #[error("job is already {state}")]
    JobTerminal { state: JobState },
    /// The step cannot be claimed now (someone else took it, or it is not due).
    #[error("step is not claimable")]
    NotClaimable,
    /// The lease has not expired (a heartbeat extended it) or belongs to another attempt.
    #[error("lease has not expired")]
    NotExpired,
    /// The job is not pending or its `run_at` has not come.
    #[error("job is not due")]
    NotDue,
    #[error("no such step")]
    UnknownStep,
}

/// The answer to whoever sent the command.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Done,
    Heartbeat {
        lease_expires_at: Timestamp,
        cancel: bool,
    },
    /// The report was stale and is refused (409), but refusing it settled the step: its job no
    /// longer wanted the work, so the step is now `cancelled`.
    Refused(Rejection),
}

/// What the server should do once the transition is committed.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Steps for this agent became claimable now: wake its long-polls.
    Ready { agent: String },
    /// A step for this agent becomes claimable at `at` (a retry after backoff).
    ReadyAt { agent: String, at: Timestamp },
    /// The job reached a terminal state: wake its waiters.
    Finished { state: JobState },
}

/// The outcome of a command: the job's next state and what follows from it.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub job: Job,
    /// Whether the job's own fields (not its steps) changed.
    pub job_changed: bool,
    /// Indexes of the steps that changed.
    pub changed_steps: Vec<usize>,
    pub events: Vec<NewEvent>,
    pub effects: Vec<Effect>,
    pub reply: Reply,
}

impl Transition {
    pub fn is_noop(&self) -> bool {
        !self.job_changed && self.changed_steps.is_empty() && self.events.is_empty()
    }
}

/// The first transition of a newly accepted job: it waits for `run_at`, or starts now.
pub fn admit(job: Job, now: Timestamp) -> Transition {
    let before = job.clone();
    let mut w = Work::new(job, now);
    let detail = before.run_at.map(|t| json!({ "run_at": t }));
    w.event("job_submitted", None, None, detail);
    if before.run_at.is_none_or(|t| t <= now) {
        w.start();
    }
    w.finish(&before, Reply::Done)
}

/// Applies one command to a job at time `now`.
pub fn apply(job: &Job, command: Command, now: Timestamp) -> Result<Transition, Rejection> {
    let mut w = Work::new(job.clone(), now);
    let reply = match command {
        Command::Activate => {
            if w.job.state != JobState::Pending || w.job.run_at.is_some_and(|t| t > now) {
                return Err(Rejection::NotDue);
            }
            w.start();
            Reply::Done
        }
        Command::Claim {
            step,
            lease_id,
            worker,
        } => {
            let s = w.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
            let claimable = w.job.state == JobState::Running
                && w.job.desired_state == DesiredState::Succeeded
                && s.state == StepState::Ready
                && s.next_attempt_at.is_none_or(|t| t <= now);
            if !claimable {
                return Err(Rejection::NotClaimable);
            }
            let s = &mut w.job.steps[step];
            s.attempt += 1;
            s.state = StepState::Running;
            s.lease_id = Some(lease_id);
            s.worker = Some(worker.clone());
            s.started_at = Some(now);
            s.lease_expires_at = Some(now.plus(s.timeout));
            s.next_attempt_at = None;
            let (attempt, expires) = (s.attempt, s.lease_expires_at);
            w.event(
                "step_leased",
                Some(step),
                Some(attempt),
                Some(json!({ "worker": worker, "lease_expires_at": expires })),
            );
            Reply::Done
        }
        Command::Heartbeat { step, attempt } => {
            w.check_live(step, attempt)?;
            let cancel = !w.wants_work();
            let s = &mut w.job.steps[step];
            let expires = now.plus(s.timeout);
            s.lease_expires_at = Some(expires);
            Reply::Heartbeat {
                lease_expires_at: expires,
                cancel,
            }
        }
        Command::Complete {
            step,
            attempt,
            result,
        } => {
            w.check_live(step, attempt)?;
            if !w.wants_work() {
                w.cancel_step(step, "its result arrived after the job stopped");
                w.settle();
                Reply::Refused(Rejection::LeaseLost {
                    reason: format!("the job is {} and no longer takes results", w.stop_reason()),
                })
            } else {
                let s = &mut w.job.steps[step];
                s.state = StepState::Succeeded;
                s.result = Some(result);
                s.finished_at = Some(now);
                s.lease_expires_at = None;
                w.event("step_succeeded", Some(step), Some(attempt), None);
                w.promote();
                w.settle();
                Reply::Done
            }
        }
        Command::Fail {
            step,
            attempt,
            error,
            retryable,
            jitter,
        } => {
            w.check_live(step, attempt)?;
            w.job.steps[step].last_error = Some(error.clone());
            if !w.wants_work() {
                w.cancel_step(step, "it stopped after the job stopped");
            } else {
                w.failed_attempt(step, &error, retryable, jitter);
            }
            w.settle();
            Reply::Done
        }
        Command::Expire {
            step,
            attempt,
            jitter,
        } => {
            let s = w.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
            let expired = s.state == StepState::Running
                && s.attempt == attempt
                && s.lease_expires_at.is_some_and(|t| t <= now);
            if !expired {
                return Err(Rejection::NotExpired);
            }
            let error = "lease expired: no report before complete_by".to_string();
            w.event("step_lease_expired", Some(step), Some(attempt), None);
            w.job.steps[step].last_error = Some(error.clone());
            if !w.wants_work() {
                w.cancel_step(step, "its lease expired after the job stopped");
            } else {
                w.failed_attempt(step, &error, true, jitter);
            }
            w.settle();
            Reply::Done
        }
        Command::Cancel => {
            if w.job.state.is_terminal() {
                return Err(Rejection::JobTerminal { state: w.job.state });
            }
            if w.job.desired_state == DesiredState::Cancelled {
                return Ok(w.finish(job, Reply::Done));
            }
            w.job.desired_state = DesiredState::Cancelled;
            w.event("cancel_requested", None, None, None);
            w.cancel_unstarted("the job was cancelled");
            w.settle();
            Reply::Done
        }
    };
    Ok(w.finish(job, reply))
}

/// A transition being built.
struct Work {
    job: Job,
    now: Timestamp,
    events: Vec<NewEvent>,
    effects: Vec<Effect>,
}

impl Work {
    fn new(job: Job, now: Timestamp) -> Self {
        Work {
            job,
            now,
            events: Vec::new(),
            effects: Vec::new(),
        }
    }

    fn event(
        &mut self,
        kind: &'static str,
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

    /// Whether the job still wants its steps' work: not cancelled, not finished.
    fn wants_work(&self) -> bool {
        self.job.desired_state == DesiredState::Succeeded && !self.job.state.is_terminal()
    }

    fn stop_reason(&self) -> &'static str {
        if self.job.state.is_terminal() {
            self.job.state.as_str()
        } else {
            "being cancelled"
        }
    }

    /// The fencing check every agent report goes through.
    fn check_live(&self, step: usize, attempt: u32) -> Result<(), Rejection> {
        let s = self.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
        let reason = if s.attempt != attempt {
            format!("attempt {attempt} was superseded by attempt {}", s.attempt)
        } else if s.state != StepState::Running {
            format!("the step is {}", s.state)
        } else if s.lease_expires_at.is_none_or(|t| t <= self.now) {
            "the lease expired".to_string()
        } else {
            return Ok(());
        };
        Err(Rejection::LeaseLost { reason })
    }

    fn start(&mut self) {
        self.job.state = JobState::Running;
        self.event("job_started", None, None, None);
        self.promote();
        // A job whose steps were all skipped is done at once (not possible at submit today,
        // but the rule belongs here).
        self.settle();
    }

    /// Makes every waiting step whose dependencies are all done ready, if the job still runs.
    fn promote(&mut self) {
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
            self.event("step_ready", Some(i), None, None);
            self.wake(agent);
        }
    }

    fn wake(&mut self, agent: String) {
        let effect = Effect::Ready { agent };
        if !self.effects.contains(&effect) {
            self.effects.push(effect);
        }
    }

    /// Counts a failed attempt and either schedules a retry or fails the step for good.
    fn failed_attempt(&mut self, step: usize, error: &str, retryable: bool, jitter: f64) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        s.failures += 1;
        s.lease_expires_at = None;
        let attempt = s.attempt;
        let attempts_left = s.max_attempts == 0 || s.attempt < s.max_attempts;
        if retryable && attempts_left {
            let delay: Span = s.backoff.delay(s.failures, jitter);
            let at = now.plus(delay);
            s.state = StepState::Ready;
            s.ready_at = Some(now);
            s.next_attempt_at = Some(at);
            let agent = s.agent.clone();
            self.event(
                "step_retry_scheduled",
                Some(step),
                Some(attempt),
                Some(json!({ "error": error, "delay": delay, "next_attempt_at": at })),
            );
            if delay == Span::ZERO {
                self.wake(agent);
            } else {
                self.effects.push(Effect::ReadyAt { agent, at });
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
                "step_failed",
                Some(step),
                Some(attempt),
                Some(json!({ "error": error, "reason": reason })),
            );
            self.fail_job(step);
        }
    }

    fn fail_job(&mut self, step: usize) {
        self.job.state = JobState::Failed;
        self.job.finished_at = Some(self.now);
        let name = self.job.steps[step].name.clone();
        self.event("job_failed", None, None, Some(json!({ "step": name })));
        self.cancel_unstarted("the job failed");
        self.effects.push(Effect::Finished {
            state: JobState::Failed,
        });
    }

    fn cancel_step(&mut self, step: usize, why: &str) {
        let now = self.now;
        let s = &mut self.job.steps[step];
        let attempt = (s.attempt > 0).then_some(s.attempt);
        s.state = StepState::Cancelled;
        s.finished_at = Some(now);
        s.lease_expires_at = None;
        s.next_attempt_at = None;
        self.event(
            "step_cancelled",
            Some(step),
            attempt,
            Some(json!({ "reason": why })),
        );
    }

    /// Cancels every step that has not started; running ones learn it from their heartbeat.
    fn cancel_unstarted(&mut self, why: &str) {
        for i in 0..self.job.steps.len() {
            if matches!(
                self.job.steps[i].state,
                StepState::Waiting | StepState::Ready
            ) {
                self.cancel_step(i, why);
            }
        }
    }

    /// Moves the job to the terminal state its steps call for, if any.
    fn settle(&mut self) {
        if self.job.state.is_terminal() {
            return;
        }
        let steps = &self.job.steps;
        let next = if self.job.desired_state == DesiredState::Cancelled {
            steps
                .iter()
                .all(|s| s.state != StepState::Running)
                .then_some(JobState::Cancelled)
        } else if self.job.state == JobState::Running
            && steps.iter().all(|s| s.state.satisfies_dependants())
        {
            Some(JobState::Succeeded)
        } else {
            None
        };
        if let Some(state) = next {
            self.job.state = state;
            self.job.finished_at = Some(self.now);
            let kind = if state == JobState::Succeeded {
                "job_succeeded"
            } else {
                "job_cancelled"
            };
            self.event(kind, None, None, None);
            self.effects.push(Effect::Finished { state });
        }
    }

    fn finish(mut self, before: &Job, reply: Reply) -> Transition {
        let changed_steps: Vec<usize> = (0..self.job.steps.len())
            .filter(|&i| before.steps.get(i) != Some(&self.job.steps[i]))
            .collect();
        let job_fields_changed = self.job.state != before.state
            || self.job.desired_state != before.desired_state
            || self.job.finished_at != before.finished_at;
        if job_fields_changed || !self.events.is_empty() {
            self.job.updated_at = self.now;
        }
        let job_changed = self.job.updated_at != before.updated_at || job_fields_changed;
        Transition {
            job: self.job,
            job_changed,
            changed_steps,
            events: self.events,
            effects: self.effects,
            reply,
        }
    }
}

#[cfg(test)]
mod tests;
