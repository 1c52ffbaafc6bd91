//! Removing jobs, and replacing one job by another (`Jobs::jobs_delete`, `Jobs::job_replace`).
//!
//! A job goes only when it is in one of the states the caller expects and none of its steps
//! holds a live lease, checked on the job as loaded under its row lock (`FOR UPDATE`): a job that
//! moved on since the caller looked (was claimed, finished, …) is left alone, and no claim or
//! report can slip in between the check and the delete. The rows of its steps, labels, history
//! and leases go with it, in the same statement (there are no foreign keys to cascade); recorded
//! deliveries stay, as they outlive their job by design.

use super::tx::Transaction;
use overseer_core::{JobId, JobState, Timestamp, Transition};

use super::rows::{self, execute, get, query, to_u64, Lock};
use super::{jobs, Failure, Res, TERMINAL};
use crate::{AgentReady, Error, NewJob, Submitted};

/// Deletes `id` if it exists, is in one of `states` and holds no live lease.
async fn delete_one(tx: &Transaction<'_>, id: JobId, states: &[JobState]) -> Res<bool> {
    let Some(job) = rows::load_job(tx, id, Lock::Update).await? else {
        return Ok(false);
    };
    if !states.contains(&job.state) || job.steps.iter().any(|s| s.is_leased()) {
        return Ok(false);
    }
    let n = execute(
        tx,
        "WITH l AS (DELETE FROM job_labels WHERE job_id = $1), \
              s AS (DELETE FROM steps WHERE job_id = $1), \
              e AS (DELETE FROM events WHERE job_id = $1), \
              x AS (DELETE FROM leases WHERE job_id = $1) \
         DELETE FROM jobs WHERE id = $1",
        &[&id.0],
    )
    .await?;
    tx.unlogged().forget(id);
    Ok(n == 1)
}

pub(super) async fn delete(
    tx: &Transaction<'_>,
    ids: &[JobId],
    states: &[JobState],
) -> Res<Vec<JobId>> {
    let mut deleted = Vec::new();
    for &id in ids {
        if delete_one(tx, id, states).await? {
            deleted.push(id);
        }
    }
    Ok(deleted)
}

pub(super) async fn replace(
    tx: &Transaction<'_>,
    old: JobId,
    states: &[JobState],
    new: &NewJob,
    history_per_job: usize,
) -> Res<Option<Transition>> {
    if let Some(key) = new.transition.job.ordering_key.as_deref() {
        jobs::lock_ordering_keys(tx, vec![key]).await?;
    }
    if !delete_one(tx, old, states).await? {
        return Ok(None);
    }
    // Any error below leaves the transaction uncommitted: the delete is undone too.
    match jobs::submit_one(tx, 0, new, history_per_job).await? {
        Submitted::Created(t) => Ok(Some(t)),
        Submitted::Existing(other) => Err(Failure::Store(Error::IdempotencyConflict {
            index: 0,
            key: other.idempotency_key.clone().unwrap_or_default(),
            existing: other.id,
        })),
    }
}

/// `Agents::agents_ready_now`: claimable steps of unfinished jobs that are due, per agent.
pub(super) async fn ready_now(tx: &Transaction<'_>, now: Timestamp) -> Res<Vec<AgentReady>> {
    let rows = query(
        tx,
        &format!(
            "SELECT s.claim_agent, COUNT(*)::bigint \
             FROM steps s JOIN jobs j ON j.id = s.job_id \
             WHERE s.claim_agent IS NOT NULL AND COALESCE(s.next_attempt_at, 0) <= $1 \
               AND j.state NOT IN {TERMINAL} \
             GROUP BY s.claim_agent ORDER BY s.claim_agent"
        ),
        &[&now.as_millis()],
    )
    .await?;
    rows.iter()
        .map(|row| {
            Ok(AgentReady {
                agent: get(row, 0, "agent")?,
                ready: to_u64("ready", get(row, 1, "ready")?)?,
            })
        })
        .collect()
}
