//! The job and step state machines as one pure function.
//!
//! [`apply`] takes a job as stored, a command and the current time, and returns the job's next
//! state together with the history to append, the effects to carry out (wake agents, wake
//! waiters, raise alerts, call back) and the answer for whoever sent the command. It never reads
//! a clock or a random number: the caller passes `now` and any jitter. An illegal command is a
//! typed [`Rejection`].
//!
//! When a step fails for good, the job's `on_failure` decides: `fail` ends the job at once;
//! `hold` blocks it for an operator; `compensate` undoes every succeeded step that declares a
//! `compensate` action, in reverse dependency order, each undo being its own leased, fenced and
//! retried unit of work. A cancel compensates the same way once no step is running.
//!
//! Time bounds: a step's `timeout` bounds the silence between heartbeats; its `deadline` bounds
//! one attempt however it heartbeats. A claim fixes the attempt's hard end (`attempt_ends_at`,
//! claim time + deadline) and no heartbeat renews the lease past it, so the ordinary expiry sweep
//! ends an overrunning attempt as a failed one (`step_deadline_exceeded`), retried by the step's
//! policy. A job's `deadline` bounds the whole job: past it no work is claimed and the supervisor
//! fails the job (`Deadline`), undoing its succeeded steps when its `on_failure` compensates.
//!
//! Whole-job retry (`on_failure: compensate_and_retry`): when a step fails for good the job
//! unwinds as with `compensate`; once every undo is done, if rounds are left (`job_attempts`)
//! and the job's deadline has not passed, every step goes back to `waiting`, `round` grows by
//! one and the roots are ready after the job's backoff (`job_round_started`). Attempt numbers
//! keep growing across rounds, so a report from an earlier round is always refused. After the
//! last round the job ends `failed` (undone), or, with `job_exhausted: hold`, a step that fails
//! for good in the last round blocks the job as `hold` does, nothing undone: an operator's
//! retry or skip goes on in that round, a cancel undoes it.
//!
//! Progress: a heartbeat may carry `progress` (any JSON). It is kept on the step with the time it
//! came (`progress`, `progress_at`), fenced like the heartbeat itself, and recorded in the
//! history (`step_progress`, or `compensation_progress` for an undo) only when the step asks for
//! it (`progress_events`) and the value changed, so a chatty agent cannot flood the history. A
//! new lease of the step clears it: progress belongs to the attempt that reported it.
//!
//! A failed or cancelled job may be run again as a new job (see [`crate::rerun`]): its
//! admission, [`admit_rerun`], first marks the steps the rerun keeps `succeeded` with their old
//! results (`step_kept`), so they are never run again and their dependants find them done.
//!
//! An operator may move a job (`Reschedule`): its `run_at` while it is pending, its priority
//! until it finishes. Neither is a state change of its own; a move of `run_at` to now starts an
//! unkeyed job at once (the job moves from pending to running).
//!
//! ```mermaid
//! stateDiagram-v2
//!     state "Job" as job {
//!         [*] --> pending: submit (run_at ahead)
//!         [*] --> running: submit
//!         pending --> running: run_at reached (or rescheduled to now)
//!         pending --> cancelled: cancel
//!         pending --> failed: job deadline passed
//!         running --> succeeded: every step succeeded or skipped
//!         running --> failed: a step failed for good (fail, or compensate with nothing to undo), or the job deadline passed
//!         running --> blocked: a step failed for good (hold, or in the last round of a whole-job retry with job_exhausted hold)
//!         running --> compensating: a step failed for good (compensate), cancelled, or the job deadline passed
//!         running --> cancelled: cancel, once no step runs, nothing to undo
//!         blocked --> running: operator retry, skip or resume
//!         blocked --> succeeded: operator skip of the last step not done
//!         blocked --> compensating: cancel once no step runs; operator retry or skip of a failed undo; job deadline
//!         blocked --> cancelled: cancel, nothing to undo; operator skip of the last failed undo
//!         compensating --> blocked: an undo failed for good
//!         compensating --> failed: every undo done, after a failure
//!         compensating --> cancelled: every undo done, after a cancel
//!         compensating --> running: every undo done, a whole-job retry starts its next round
//!         blocked --> failed: operator skip of the last failed undo, or the job deadline passed
//!     }
//!     state "Step" as step {
//!         [*] --> waiting
//!         waiting --> ready: dependencies done
//!         waiting --> succeeded: kept by a rerun from failure (the old result)
//!         ready --> running: claim (attempt + 1)
//!         running --> running: heartbeat
//!         running --> succeeded: complete
//!         running --> ready: fail (retryable) / lease expired or deadline exceeded, attempts left
//!         running --> waiting: the same while the job is blocked
//!         ready --> waiting: the job is blocked
//!         running --> failed: fail (fatal) / attempts exhausted
//!         running --> cancelled: report or expiry after the job stopped wanting it
//!         waiting --> cancelled: job cancelled, failed or compensating
//!         ready --> cancelled: job cancelled, failed or compensating
//!         failed --> ready: operator retry
//!         failed --> waiting: operator retry while the job stays blocked
//!         failed --> skipped: operator skip
//!         succeeded --> compensating: the job unwinds and the step declares compensate
//!         compensating --> compensating: undo leased, retried, or failed for good
//!         compensating --> compensated: undo completed
//!         compensated --> waiting: the next round of a whole-job retry
//!         succeeded --> waiting: the next round (a step with nothing to undo)
//!         cancelled --> waiting: the next round
//!         skipped --> waiting: the next round (an undo an operator skipped)
//!         compensating --> skipped: operator skip of a failed undo
//!     }
//! ```
//!
//! A `compensating` step carries a [`CompPhase`]: `waiting` until every succeeded step that
//! depended on it was undone, `ready` to lease, `running` under a lease, `failed` when its undo
//! ran out of attempts (the job is then `blocked`). While the job is blocked nothing can be
//! claimed: ready work and ready undos are parked back to `waiting` until it is unblocked.

use serde_json::{json, Value};

use crate::id::LeaseId;
use crate::job::JobRetry;
use crate::job::{
    AlertKind, CompPhase, DesiredState, EventKind, Job, JobState, NewEvent, StepState,
};
use crate::spec::{JobExhausted, OnFailure};
use crate::time::{Span, Timestamp};

/// A step that has failed this many times raises a "poisoned" alert, even if it may retry more.
pub const POISON_FAILURES: u32 = 3;

/// How long a failed attempt waits before its retry.
#[derive(Clone, Copy, Debug)]
enum Delay {
    /// The step's backoff curve, spread by the caller's jitter in `[0, 1)`.
    Backoff(f64),
    /// What the one who failed asked for, kept within the step's backoff bounds.
    After(Span),
}

impl Delay {
    fn of(self, step: &crate::job::Step, failures: u32) -> Span {
        match self {
            Delay::Backoff(jitter) => step.retry_delay(failures, jitter),
            Delay::After(asked) => crate::push::bounded_retry_after(&step.backoff, asked),
        }
    }
}

/// Something that happens to a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// The job's `run_at` has come.
    Activate,
    /// An agent takes a lease on a claimable step (its work, or its compensation).
    Claim {
        step: usize,
        lease_id: LeaseId,
        worker: String,
    },
    /// The holder of a lease asks for more time, maybe reporting its progress (any JSON; the
    /// caller bounds its size).
    Heartbeat {
        step: usize,
        attempt: u32,
        progress: Option<Value>,
    },
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
    /// The holder of a lease reports a retryable failure and when to try again: an HTTP
    /// target's `Retry-After`, kept within the step's backoff bounds
    /// ([`crate::push::bounded_retry_after`]) instead of the backoff curve.
    FailRetryAfter {
        step: usize,
        attempt: u32,
        error: String,
        retry_after: Span,
    },
    /// The supervisor found the lease past its expiry with no report.
    Expire {
        step: usize,
        attempt: u32,
        jitter: f64,
    },
    /// The supervisor found the job past its deadline while it still wanted its work: nothing
    /// new starts, and the job fails (undoing what it declares, when its `on_failure` undoes).
    Deadline,
    /// A client wants the job stopped.
    Cancel,
    /// An operator gives a failed step (or a failed undo) of a blocked job a fresh budget.
    Retry {
        step: usize,
        by: Option<String>,
        reason: Option<String>,
    },
    /// An operator marks a failed step (or a failed undo) of a blocked job as skipped.
    Skip {
        step: usize,
        by: Option<String>,
        reason: Option<String>,
    },
    /// An operator resumes a blocked job: every failed step and undo gets a fresh budget.
    Resume {
        by: Option<String>,
        reason: Option<String>,
    },
    /// The supervisor re-derives what the job's steps call for (ready dependants, the job's own
    /// state), healing a job left inconsistent by a fault. A no-op on a consistent job.
    Repair,
    /// An operator moves a job: a new `run_at` (only while it is pending) and/or a new priority
    /// (while it is not finished). A pending job without an ordering key whose new `run_at` has
    /// come starts at once; a keyed one still waits for its turn in its key.
    Reschedule {
        run_at: Option<Timestamp>,
        priority: Option<i32>,
        by: Option<String>,
        reason: Option<String>,
    },
}

impl Command {
    pub fn name(&self) -> &'static str {
        match self {
            Command::Activate => "activate",
            Command::Claim { .. } => "claim",
            Command::Heartbeat { .. } => "heartbeat",
            Command::Complete { .. } => "complete",
            Command::Fail { .. } | Command::FailRetryAfter { .. } => "fail",
            Command::Expire { .. } => "expire",
            Command::Deadline => "deadline",
            Command::Cancel => "cancel",
            Command::Retry { .. } => "retry",
            Command::Skip { .. } => "skip",
            Command::Resume { .. } => "resume",
            Command::Repair => "repair",
            Command::Reschedule { .. } => "reschedule",
        }
    }
}

/// Why a command was refused. Nothing changes when a command is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The report's attempt is not the step's live lease (expired, superseded, or settled).
    #[error("lease is no longer live: {reason}")]
    LeaseLost { reason: String },
    /// The job is already finished; there is nothing to cancel or move.
    #[error("job is already {state}")]
    JobTerminal { state: JobState },
    /// An operator action that does not fit the job or step as they are.
    #[error("{reason}")]
    NotAllowed { reason: String },
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
    /// The job was rerun already (a job is rerun at most once): `by` is its rerun.
    #[error("the job was already rerun as job {by}")]
    AlreadyRerun { by: crate::JobId },
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
    /// A pending job becomes due at `at` (it was rescheduled): the supervisor must look no later.
    Due { at: Timestamp },
    /// Something needs a human's attention. Backends record it durably for delivery.
    Alert {
        kind: AlertKind,
        step: Option<String>,
        message: String,
    },
    /// The job reached a terminal state and has a `callback_url`. Recorded durably for delivery.
    Callback { state: JobState },
}

impl Effect {
    /// Whether the effect must survive a crash (it is stored with the transition).
    pub fn is_durable(&self) -> bool {
        matches!(self, Effect::Alert { .. } | Effect::Callback { .. })
    }
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
    /// Leases this transition took off their steps (a new attempt's claim, an unwind, a new
    /// round): a step row names only its latest lease, so a store keeps these elsewhere for a
    /// late report on them to be fenced as stale rather than answered as unknown.
    pub retired_leases: Vec<RetiredLease>,
}

/// A lease that no longer stands for its step's latest attempt (see
/// [`Transition::retired_leases`]): which attempt of which step it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetiredLease {
    pub step: usize,
    pub lease_id: LeaseId,
    pub attempt: u32,
}

/// The leases of `before` that `after` no longer names: every step whose lease id changed or
/// was cleared. A step's attempt changes only with its lease id (a claim), so the attempt it
/// had in `before` is the retired lease's.
fn retired_leases(before: &Job, after: &Job) -> Vec<RetiredLease> {
    before
        .steps
        .iter()
        .zip(&after.steps)
        .enumerate()
        .filter_map(|(step, (was, now))| match was.lease_id {
            Some(lease_id) if now.lease_id != Some(lease_id) => Some(RetiredLease {
                step,
                lease_id,
                attempt: was.attempt,
            }),
            _ => None,
        })
        .collect()
}

impl Transition {
    pub fn is_noop(&self) -> bool {
        !self.job_changed && self.changed_steps.is_empty() && self.events.is_empty()
    }

    /// The ordering key this transition hands on: the job reached a terminal state, so the next
    /// job of its key may start now. Both stores then start the key's new head, if it is due, in
    /// the same transaction, so the next job never waits for a sweep.
    pub fn freed_ordering_key(&self) -> Option<&str> {
        let finished = self
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Finished { .. }));
        match finished {
            true => self.job.ordering_key.as_deref(),
            false => None,
        }
    }

    /// This transition followed by `next`, a transition of the same job committed with it (an
    /// admission and the activation that started the job at once): `next`'s job, both histories
    /// in order, both sets of effects.
    pub fn then(self, next: Transition) -> Transition {
        debug_assert_eq!(self.job.id, next.job.id);
        let mut changed_steps = self.changed_steps;
        changed_steps.extend(next.changed_steps);
        changed_steps.sort_unstable();
        changed_steps.dedup();
        let mut events = self.events;
        events.extend(next.events);
        let mut effects = self.effects;
        effects.extend(next.effects);
        let mut retired_leases = self.retired_leases;
        retired_leases.extend(next.retired_leases);
        Transition {
            job: next.job,
            job_changed: self.job_changed || next.job_changed,
            changed_steps,
            events,
            effects,
            reply: next.reply,
            retired_leases,
        }
    }

    /// Adds the wake-ups of a follow-on transition of another job committed together with this
    /// one (the activation of the next job of a freed ordering key). Only wake-ups ride along:
    /// that job's history and durable effects were stored by its own transition.
    pub fn absorb_wakeups(&mut self, other: &Transition) {
        debug_assert!(other.effects.iter().all(|e| !e.is_durable()));
        self.effects.extend(
            other
                .effects
                .iter()
                .filter(|e| matches!(e, Effect::Ready { .. } | Effect::ReadyAt { .. }))
                .cloned(),
        );
    }
}

/// The first transition of a newly accepted job: it waits for `run_at`, or starts now.
pub fn admit(job: Job, now: Timestamp) -> Transition {
    let detail = match (&job.run_at, &job.ordering_key) {
        (None, None) => None,
        (run_at, key) => Some(json!({ "run_at": run_at, "ordering_key": key })),
    };
    admit_with(job, now, detail, |_| {})
}

/// The first transition of a rerun of `old` (built by [`crate::rerun::rerun`]): the job is
/// admitted as [`admit`] would, after the steps `plan` keeps are marked `succeeded` with their
/// results in `old` (one `step_kept` event each). Nothing is claimable for a kept step, and its
/// dependants find it done when the job starts. `detail` goes on the `job_submitted` event.
pub fn admit_rerun(
    job: Job,
    old: &Job,
    plan: &crate::rerun::Plan,
    detail: Value,
    now: Timestamp,
) -> Transition {
    debug_assert_eq!(job.steps.len(), old.steps.len());
    admit_with(job, now, Some(detail), |w| {
        for i in plan.kept() {
            debug_assert_eq!(old.steps[i].state, StepState::Succeeded);
            let from = &old.steps[i];
            let detail = json!({ "rerun_of": old.id, "attempt": from.attempt });
            let s = &mut w.job.steps[i];
            s.state = StepState::Succeeded;
            s.result = from.result.clone();
            s.finished_at = Some(w.now);
            w.event(EventKind::StepKept, Some(i), None, Some(detail));
        }
    })
}

/// Records on a finished job that `rerun` is its rerun (see [`crate::rerun`]): `rerun_by` and a
/// `job_rerun` event carrying `detail`. Refused as [`crate::rerun::check`] says.
pub fn link_rerun(
    old: &Job,
    rerun: crate::JobId,
    detail: Value,
    now: Timestamp,
) -> Result<Transition, Rejection> {
    crate::rerun::check(old)?;
    let mut w = Work::new(old.clone(), now);
    w.job.rerun_by = Some(rerun);
    w.event(EventKind::JobRerun, None, None, Some(detail));
    Ok(w.finish(old, Reply::Done))
}

/// Admits `job`: records `job_submitted` with `detail`, lets `prepare` set up its steps, then
/// starts it unless it waits for its `run_at` or its ordering key.
fn admit_with(
    job: Job,
    now: Timestamp,
    detail: Option<Value>,
    prepare: impl FnOnce(&mut Work),
) -> Transition {
    let before = job.clone();
    let mut w = Work::new(job, now);
    w.event(EventKind::JobSubmitted, None, None, detail);
    prepare(&mut w);
    // A job with an ordering key waits in `pending` until it heads its key; the store, which
    // can see the key's other jobs, activates it (in the same transaction when it is the head).
    if before.run_at.is_none_or(|t| t <= now) && before.ordering_key.is_none() {
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
            w.claim(step, lease_id, worker)?;
            Reply::Done
        }
        Command::Heartbeat {
            step,
            attempt,
            progress,
        } => {
            w.check_live(step, attempt)?;
            // An undo is never told to stop: it is how a stopping job cleans up.
            let cancel = !w.job.steps[step].is_compensating() && !w.wants_work();
            if let Some(progress) = progress {
                w.progress(step, attempt, progress);
            }
            let s = &mut w.job.steps[step];
            let expires = s.lease_end(now);
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
            if w.job.steps[step].is_compensating() {
                w.undo_done(step, attempt, result);
                w.settle();
                Reply::Done
            } else if !w.wants_work() {
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
                w.event(EventKind::StepSucceeded, Some(step), Some(attempt), None);
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
            w.report_failure(step, attempt, &error, retryable, Delay::Backoff(jitter), "");
            Reply::Done
        }
        Command::FailRetryAfter {
            step,
            attempt,
            error,
            retry_after,
        } => {
            w.check_live(step, attempt)?;
            w.report_failure(step, attempt, &error, true, Delay::After(retry_after), "");
            Reply::Done
        }
        Command::Expire {
            step,
            attempt,
            jitter,
        } => {
            let s = w.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
            let expired = s.is_leased()
                && s.attempt == attempt
                && s.lease_expires_at.is_some_and(|t| t <= now);
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
            w.event(kind, Some(step), Some(attempt), None);
            w.report_failure(
                step,
                attempt,
                &error,
                true,
                Delay::Backoff(jitter),
                "expired",
            );
            Reply::Done
        }
        Command::Deadline => {
            if w.job.deadline_due().is_none_or(|t| t > now) {
                return Err(Rejection::NotDue);
            }
            w.deadline_passed();
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
            w.event(EventKind::CancelRequested, None, None, None);
            if w.job.state == JobState::Pending {
                w.cancel_unstarted("the job was cancelled");
                w.finish_job(JobState::Cancelled, None);
            } else if w.job.state != JobState::Compensating {
                w.cancel_unstarted("the job was cancelled");
                w.settle();
            }
            Reply::Done
        }
        Command::Retry { step, by, reason } => {
            w.require_blocked("retry a step")?;
            let s = w.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
            let detail = json!({ "by": by, "reason": reason });
            let unwinding = w.unwinding();
            if s.state == StepState::Failed {
                w.check_work_wanted(step, true)?;
                w.retry_step(step, detail);
            } else if s.comp_phase == Some(CompPhase::Failed) {
                w.retry_undo(step, detail);
            } else {
                return Err(Rejection::NotAllowed {
                    reason: format!(
                        "step `{}` is {}; only a failed step or a failed undo can be retried",
                        s.name, s.state
                    ),
                });
            }
            w.unblock(unwinding);
            Reply::Done
        }
        Command::Skip { step, by, reason } => {
            w.require_blocked("skip a step")?;
            let s = w.job.steps.get(step).ok_or(Rejection::UnknownStep)?;
            let detail = json!({ "by": by, "reason": reason });
            let unwinding = w.unwinding();
            let kind = if s.state == StepState::Failed {
                w.check_work_wanted(step, false)?;
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
            let s = &mut w.job.steps[step];
            s.state = StepState::Skipped;
            s.comp_phase = None;
            s.finished_at = Some(now);
            w.event(kind, Some(step), None, Some(detail));
            w.unblock(unwinding);
            Reply::Done
        }
        Command::Resume { by, reason } => {
            w.require_blocked("resume")?;
            let detail = json!({ "by": by, "reason": reason });
            w.event(EventKind::JobResumed, None, None, Some(detail.clone()));
            let unwinding = w.unwinding();
            // An unwinding or cancelled job has given its failed work up: only its undos resume.
            let retry_work = !unwinding && w.wants_work();
            for i in 0..w.job.steps.len() {
                if w.job.steps[i].state == StepState::Failed && retry_work {
                    w.retry_step(i, detail.clone());
                } else if w.job.steps[i].comp_phase == Some(CompPhase::Failed) {
                    w.retry_undo(i, detail.clone());
                }
            }
            w.unblock(unwinding);
            Reply::Done
        }
        Command::Reschedule {
            run_at,
            priority,
            by,
            reason,
        } => {
            w.reschedule(run_at, priority, json!({ "by": by, "reason": reason }))?;
            Reply::Done
        }
        Command::Repair => {
            let before = w.events.len();
            w.promote();
            w.settle();
            if w.events.len() > before {
                let healed: Vec<Value> = w.events[before..].iter().map(|e| json!(e.kind)).collect();
                w.event(
                    EventKind::JobRepaired,
                    None,
                    None,
                    Some(json!({ "applied": healed })),
                );
            }
            Reply::Done
        }
    };
    Ok(w.finish(job, reply))
}

fn lease_expired_error() -> String {
    "lease expired: no report before complete_by".to_string()
}

fn deadline_error(s: &crate::job::Step) -> String {
    let limit = s
        .lease_deadline()
        .map(|d| d.to_string())
        .unwrap_or_default();
    format!("deadline exceeded: the attempt ran longer than its deadline of {limit}")
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

    fn alert(&mut self, kind: AlertKind, step: Option<usize>, message: String) {
        let step = step.map(|i| self.job.steps[i].name.clone());
        self.effects.push(Effect::Alert {
            kind,
            step,
            message,
        });
    }

    /// Whether the job still wants its steps' work: not cancelled, not unwinding, not finished.
    fn wants_work(&self) -> bool {
        self.job.desired_state == DesiredState::Succeeded
            && matches!(self.job.state, JobState::Running | JobState::Blocked)
    }

    fn stop_reason(&self) -> &'static str {
        match self.job.state {
            JobState::Compensating => "compensating",
            s if s.is_terminal() => s.as_str(),
            _ => "being cancelled",
        }
    }

    /// Whether an unwind is under way: some step is being undone (or waits to be).
    fn unwinding(&self) -> bool {
        self.job
            .steps
            .iter()
            .any(|s| s.state == StepState::Compensating)
    }

    /// A failed step's work may be retried or skipped only while the job has not given it up:
    /// not once the job unwinds, and (for a retry) not once it is being cancelled.
    fn check_work_wanted(&self, step: usize, retry: bool) -> Result<(), Rejection> {
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

    fn require_blocked(&self, what: &str) -> Result<(), Rejection> {
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
    fn check_live(&self, step: usize, attempt: u32) -> Result<(), Rejection> {
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

    fn claim(&mut self, step: usize, lease_id: LeaseId, worker: String) -> Result<(), Rejection> {
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
    fn deadline_passed(&mut self) {
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
    fn progress(&mut self, step: usize, attempt: u32, progress: Value) {
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

    fn start(&mut self) {
        self.job.state = JobState::Running;
        self.event(EventKind::JobStarted, None, None, None);
        self.promote();
        self.settle();
    }

    /// Moves the job's `run_at` and/or priority (see [`Command::Reschedule`]). Recorded as one
    /// `job_rescheduled` event with what changed, from and to; changing nothing records nothing.
    fn reschedule(
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
            self.event(EventKind::StepReady, Some(i), None, None);
            self.wake(agent);
        }
    }

    fn wake(&mut self, agent: String) {
        let effect = Effect::Ready { agent };
        if !self.effects.contains(&effect) {
            self.effects.push(effect);
        }
    }

    /// A failed attempt, reported or found expired, of the step's work or of its undo.
    fn report_failure(
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
    fn failed_attempt(&mut self, step: usize, error: &str, retryable: bool, delay: Delay) {
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

    fn wake_at(&mut self, agent: String, delay: Span, at: Timestamp) {
        if delay == Span::ZERO {
            self.wake(agent);
        } else {
            self.effects.push(Effect::ReadyAt { agent, at });
        }
    }

    /// A step failed for good: the job's `on_failure` decides what follows.
    fn step_poisoned(&mut self, step: usize, error: &str) {
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

    fn block(&mut self, reason: String) {
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
    fn unblock(&mut self, unwinding: bool) {
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

    fn retry_step(&mut self, step: usize, detail: Value) {
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

    fn retry_undo(&mut self, step: usize, detail: Value) {
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

    fn cancel_step(&mut self, step: usize, why: &str) {
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

    /// Starts undoing: every succeeded step that declares `compensate` will be undone.
    fn begin_unwind(&mut self) {
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
    fn advance_unwind(&mut self) {
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
    fn holds_last_round(&self) -> bool {
        self.job
            .retry
            .is_some_and(|r| r.then == JobExhausted::Hold && self.job.round >= r.attempts)
    }

    /// The policy of a whole-job retry that may run another round now: rounds left, and the
    /// job's deadline (if any) not passed.
    fn next_round(&self) -> Option<JobRetry> {
        let retry = self.job.retry?;
        let left = self.job.round < retry.attempts;
        (left && !self.job.past_deadline(self.now)).then_some(retry)
    }

    /// Starts the whole job again once a round was undone: every step back to its initial
    /// state, the roots ready after the job's backoff. Attempts keep counting (they are the
    /// fencing token), so a late report of an earlier round can never be taken in this one;
    /// each round gets fresh attempt budgets (`failures` keeps counting, so backoff keeps growing).
    fn new_round(&mut self, retry: JobRetry, undone: Vec<String>) {
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

    fn undo_done(&mut self, step: usize, attempt: u32, result: Value) {
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

    fn undo_failed(
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

    fn finish_job(&mut self, state: JobState, detail: Option<Value>) {
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
    fn settle(&mut self) {
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
    fn park(&mut self) {
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

    fn finish(mut self, before: &Job, reply: Reply) -> Transition {
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
        let retired_leases = retired_leases(before, &self.job);
        debug_assert!(
            retired_leases
                .iter()
                .all(|r| changed_steps.contains(&r.step)),
            "a lease was retired from a step the transition does not write"
        );
        Transition {
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

#[cfg(test)]
mod tests;
