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
//!
//! [`apply`] hands each command to its method in `commands`; the steps those take live beside
//! it, one module per concern: `work` (history, effects, the checks a command must pass),
//! `running` (claims, progress, promotion), `failure` (retries, blocking), `unwind` (cancels,
//! compensation, whole-job rounds) and `settle` (the job's final state and the finished
//! transition).

use serde_json::{json, Value};

use crate::id::LeaseId;
use crate::job::{AlertKind, EventKind, Job, JobState, NewEvent, StepState};
use crate::time::{Span, Timestamp};
use commands::operator_detail;

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
    /// Whether the transition only leased work: its entries are all `step_leased`, it changed
    /// no job field but `updated_at`, made no effect and retired no lease. Everything such a
    /// transition changed is in the rows of the steps it leased, so a store may keep its entries
    /// with those rows and log them with the job's next write.
    pub leases_only: bool,
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

    /// See the field: decided from what the transition changed, `job_fields_changed` meaning
    /// any job field but `updated_at`.
    fn only_leases(
        events: &[NewEvent],
        effects: &[Effect],
        retired: &[RetiredLease],
        job_fields_changed: bool,
    ) -> bool {
        !events.is_empty()
            && events.iter().all(|e| e.kind == EventKind::StepLeased)
            && effects.is_empty()
            && retired.is_empty()
            && !job_fields_changed
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
            leases_only: self.leases_only && next.leases_only,
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
        Command::Activate => w.activate()?,
        Command::Claim {
            step,
            lease_id,
            worker,
        } => w.claim(step, lease_id, worker).map(|()| Reply::Done)?,
        Command::Heartbeat {
            step,
            attempt,
            progress,
        } => w.heartbeat(step, attempt, progress)?,
        Command::Complete {
            step,
            attempt,
            result,
        } => w.complete(step, attempt, result)?,
        Command::Fail {
            step,
            attempt,
            error,
            retryable,
            jitter,
        } => w.fail(step, attempt, &error, retryable, Delay::Backoff(jitter))?,
        Command::FailRetryAfter {
            step,
            attempt,
            error,
            retry_after,
        } => w.fail(step, attempt, &error, true, Delay::After(retry_after))?,
        Command::Expire {
            step,
            attempt,
            jitter,
        } => w.expire(step, attempt, jitter)?,
        Command::Deadline => w.deadline()?,
        Command::Cancel => w.cancel()?,
        Command::Retry { step, by, reason } => w.retry(step, operator_detail(by, reason))?,
        Command::Skip { step, by, reason } => w.skip(step, operator_detail(by, reason))?,
        Command::Resume { by, reason } => w.resume(operator_detail(by, reason))?,
        Command::Reschedule {
            run_at,
            priority,
            by,
            reason,
        } => {
            let detail = operator_detail(by, reason);
            w.reschedule(run_at, priority, detail)
                .map(|()| Reply::Done)?
        }
        Command::Repair => w.repair()?,
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

mod commands;
mod failure;
mod running;
mod settle;
mod unwind;
mod work;

#[cfg(test)]
mod tests;
