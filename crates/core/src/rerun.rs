//! Running a failed or cancelled job again as a new job (`POST /v1/jobs/{id}/rerun`).
//!
//! A rerun is a new job with the old one's definition: its labels, priority, ordering key,
//! callback, failure policy, retention, whole-job retry policy and every step's definition
//! (agent or HTTP target, payload, dependencies, timeouts, deadlines, retry policy, undo). What
//! it does not take:
//!
//! - the idempotency key: the old job keeps it (a resubmit with that key still answers the old
//!   job), and the rerun has none;
//! - `run_at`: the rerun is due at once (a keyed one still waits for its turn in its key);
//! - a job `deadline` as an instant: the rerun gets the same length of time, counted from its
//!   own creation, so a deadline that has passed does not fail the rerun at once.
//!
//! The two jobs are linked both ways: the new job's `rerun_of` names the old one, the old job's
//! `rerun_by` the new one. A job is rerun at most once (a second rerun of it is refused, see
//! [`check`]); a rerun that fails may be rerun in turn.
//!
//! With `from_failed`, [`plan`] keeps every step that succeeded in the old job and whose
//! dependencies are all kept: it starts `succeeded` with its old result and is never run again
//! (its dependants receive that result as their input). Every other step runs again: failed,
//! cancelled, skipped and compensated (undone) steps, those that never ran, and every step
//! depending on one of them. A kept step that declares an undo is undone like any succeeded
//! step if the rerun unwinds; a whole-job retry's next round then starts every step over,
//! kept or not, since its effect was undone.

use serde_json::json;

use crate::job::{Job, JobState, Step, StepState};
use crate::machine::{self, Rejection, Transition};
use crate::{JobId, Timestamp};

/// What a rerun asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Keep the steps that succeeded (see [`plan`]); otherwise every step runs again.
    pub from_failed: bool,
    /// Who asks, recorded in both jobs' histories.
    pub by: Option<String>,
    /// Why, recorded in both jobs' histories.
    pub reason: Option<String>,
}

/// Which steps of a job its rerun keeps, by step index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    kept: Vec<bool>,
}

impl Plan {
    /// Whether the rerun keeps step `step` (an index out of range is not kept).
    pub fn is_kept(&self, step: usize) -> bool {
        self.kept.get(step).copied().unwrap_or(false)
    }

    /// The indexes of the kept steps, in order.
    pub fn kept(&self) -> impl Iterator<Item = usize> + '_ {
        self.kept
            .iter()
            .enumerate()
            .filter(|(_, k)| **k)
            .map(|(i, _)| i)
    }
}

/// The steps a rerun of `old` keeps: none unless `from_failed`; then each step that succeeded in
/// `old` and whose dependencies are all kept (a step whose dependency runs again runs again
/// too, as its input may change).
pub fn plan(old: &Job, from_failed: bool) -> Plan {
    let mut kept: Vec<bool> = old
        .steps
        .iter()
        .map(|s| from_failed && s.state == StepState::Succeeded)
        .collect();
    // Unkeep until nothing changes: each pass unkeeps at least one step or ends, so at most
    // `steps + 1` passes (a job has at most `limits.steps_per_job` steps).
    loop {
        let mut changed = false;
        for (i, s) in old.steps.iter().enumerate() {
            let dep_rerun = s
                .depends_on
                .iter()
                .any(|d| old.step_index(d).is_none_or(|j| !kept[j]));
            if kept[i] && dep_rerun {
                kept[i] = false;
                changed = true;
            }
        }
        if !changed {
            return Plan { kept };
        }
    }
}

/// Whether `old` may be rerun now: it failed or was cancelled, it was not rerun already, and no
/// step of it still runs under a lease (a step whose job ended while it ran settles when its
/// report or its lease's end comes; a rerun before that could run the same work twice at once).
pub fn check(old: &Job) -> Result<(), Rejection> {
    if !matches!(old.state, JobState::Failed | JobState::Cancelled) {
        return Err(Rejection::NotAllowed {
            reason: format!(
                "the job is {}; only a failed or cancelled job can be rerun",
                old.state
            ),
        });
    }
    if let Some(by) = old.rerun_by {
        return Err(Rejection::AlreadyRerun { by });
    }
    if let Some(s) = old.steps.iter().find(|s| s.is_leased()) {
        return Err(Rejection::NotAllowed {
            reason: format!(
                "step `{}` still runs under a lease that ends by {}; rerun once it has settled",
                s.name,
                s.lease_expires_at
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            ),
        });
    }
    Ok(())
}

/// What a rerun writes, in one transaction: the old job's link to its rerun, and the new job's
/// admission.
#[derive(Clone, Debug, PartialEq)]
pub struct Rerun {
    pub plan: Plan,
    /// The old job with `rerun_by` set and a `job_rerun` event.
    pub link: Transition,
    /// The new job's first transition (see [`machine::admit_rerun`]).
    pub admission: Transition,
}

/// Decides the rerun of `old` as job `id`, asked at `now` by `submitted_by` (the caller's token
/// name, recorded as the new job's `submitted_by`). Refused as [`check`] says.
pub fn rerun(
    old: &Job,
    id: JobId,
    options: &Options,
    submitted_by: Option<String>,
    now: Timestamp,
) -> Result<Rerun, Rejection> {
    check(old)?;
    let plan = plan(old, options.from_failed);
    let kept: Vec<&str> = plan.kept().map(|i| old.steps[i].name.as_str()).collect();
    let why = |link: (&str, JobId)| {
        json!({
            link.0: link.1,
            "from_failed": options.from_failed,
            "kept": kept,
            "by": options.by,
            "reason": options.reason,
        })
    };
    let job = fresh(old, id, submitted_by, now);
    let admission = machine::admit_rerun(job, old, &plan, why(("rerun_of", old.id)), now);
    let link = machine::link_rerun(old, id, why(("rerun_by", id)), now)?;
    Ok(Rerun {
        plan,
        link,
        admission,
    })
}

/// `old`'s definition as a new job `id` created at `now`, in its first state (see the module
/// documentation for what it takes and what not).
pub(crate) fn fresh(old: &Job, id: JobId, submitted_by: Option<String>, now: Timestamp) -> Job {
    Job {
        id,
        idempotency_key: None,
        fingerprint: old.fingerprint.clone(),
        labels: old.labels.clone(),
        priority: old.priority,
        run_at: None,
        ordering_key: old.ordering_key.clone(),
        callback_url: old.callback_url.clone(),
        on_failure: old.on_failure,
        retention: old.retention,
        state: JobState::Pending,
        desired_state: crate::DesiredState::Succeeded,
        created_at: now,
        updated_at: now,
        finished_at: None,
        blocked_reason: None,
        submitted_by,
        deadline: old.deadline.map(|d| now.plus(old.created_at.until(d))),
        round: 1,
        retry: old.retry,
        rerun_of: Some(old.id),
        rerun_by: None,
        steps: old.steps.iter().map(|s| fresh_step(s, now)).collect(),
    }
}

/// A step's definition in its first state.
fn fresh_step(s: &Step, now: Timestamp) -> Step {
    Step {
        name: s.name.clone(),
        agent: s.agent.clone(),
        payload: s.payload.clone(),
        depends_on: s.depends_on.clone(),
        timeout: s.timeout,
        deadline: s.deadline,
        max_attempts: s.max_attempts,
        backoff: s.backoff,
        backoff_formula: s.backoff_formula,
        compensate: s.compensate.clone(),
        http: s.http.clone(),
        state: StepState::Waiting,
        attempt: 0,
        failures: 0,
        budget_from: 0,
        comp_phase: None,
        comp_attempts: 0,
        comp_failures: 0,
        comp_budget_from: 0,
        lease_id: None,
        worker: None,
        created_at: now,
        ready_at: None,
        started_at: None,
        finished_at: None,
        lease_expires_at: None,
        attempt_ends_at: None,
        next_attempt_at: None,
        result: None,
        last_error: None,
        progress_events: s.progress_events,
        progress: None,
        progress_at: None,
    }
}

#[cfg(test)]
mod tests;
