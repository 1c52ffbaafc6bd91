//! Decisions both backends make the same way, written once: a backend calls these and only turns
//! the answer into SQL. (What a command does to a job is decided by `overseer_core::apply`;
//! these are the few choices around it that concern rows.)

use overseer_core::{Command, Job, LeaseId, Step, Transition};

use crate::{Error, LeaseRef, Result};

/// The step, lease id and worker of a claim command, whose lease must be recorded with the
/// transition; `None` for every other command.
pub(crate) fn claim_of(command: &Command) -> Option<(usize, LeaseId, String)> {
    match command {
        Command::Claim {
            step,
            lease_id,
            worker,
        } => Some((*step, *lease_id, worker.clone())),
        _ => None,
    }
}

/// The lease a claim transition of `step` handed out under `lease_id`: which attempt of which
/// step the lease id stands for from now on.
pub(crate) fn lease_of(t: &Transition, step: usize, lease_id: LeaseId) -> Result<LeaseRef> {
    let attempt = t.job.steps.get(step).map(|s| s.attempt).ok_or_else(|| {
        Error::Corrupt(format!(
            "transition: claimed step {step} is missing from job {}",
            t.job.id
        ))
    })?;
    Ok(LeaseRef {
        lease_id,
        job_id: t.job.id,
        step,
        attempt,
    })
}

/// Adds a step read back from its row to `job`, which must take steps in index order: a gap or
/// a repeat means the rows are not what a write left.
pub(crate) fn push_step(job: &mut Job, idx: i64, step: Step) -> Result<()> {
    if usize::try_from(idx).ok() != Some(job.steps.len()) {
        return Err(Error::Corrupt(format!(
            "steps.idx: job {} has step index {idx} out of order",
            job.id
        )));
    }
    job.steps.push(step);
    Ok(())
}

/// Checks a job read back whole: a stored job always has at least one step.
pub(crate) fn loaded(job: Job) -> Result<Job> {
    if job.steps.is_empty() {
        return Err(Error::Corrupt(format!(
            "steps: job {} has no steps",
            job.id
        )));
    }
    Ok(job)
}
