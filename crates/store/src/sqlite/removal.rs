//! Removing jobs, and replacing one job by another (`Store::jobs_delete`, `Store::job_replace`).
//!
//! A job goes only when it is in one of the states the caller expects and none of its steps
//! holds a live lease, checked on the job as loaded in the write transaction: a job that moved on
//! since the caller looked (was claimed, finished, …) is left alone. The rows of its steps,
//! labels, history and leases go with it (`ON DELETE CASCADE`); recorded deliveries stay, as
//! they outlive their job by design.

use overseer_core::{Job, JobId, JobState, Timestamp, Transition};
use rusqlite::Connection;

use super::rows::{self, job_id_text, DbResult};
use super::submit_jobs;
use crate::{Error, NewJob, Result, Submitted};

/// Whether `job` may be removed: in one of `states` and holding no live lease.
fn removable(job: &Job, states: &[JobState]) -> bool {
    states.contains(&job.state) && !job.steps.iter().any(|s| s.is_leased())
}

/// Deletes `id` if it exists and is removable; returns whether it was deleted.
fn delete_one(conn: &Connection, id: JobId, states: &[JobState]) -> Result<bool> {
    let Some(job) = rows::load_job(conn, id)? else {
        return Ok(false);
    };
    if !removable(&job, states) {
        return Ok(false);
    }
    let n = conn
        .prepare_cached("DELETE FROM jobs WHERE id = ?1")
        .db()?
        .execute([job_id_text(id)])
        .db()?;
    Ok(n == 1)
}

pub(super) fn delete(conn: &Connection, ids: &[JobId], states: &[JobState]) -> Result<Vec<JobId>> {
    let mut deleted = Vec::new();
    for &id in ids {
        if delete_one(conn, id, states)? {
            deleted.push(id);
        }
    }
    Ok(deleted)
}

pub(super) fn replace(
    conn: &Connection,
    old: JobId,
    states: &[JobState],
    new: NewJob,
    history_per_job: usize,
) -> Result<Option<Transition>> {
    if !delete_one(conn, old, states)? {
        return Ok(None);
    }
    // The writer runs this in a savepoint of its own: an error below undoes the delete too.
    match submit_jobs(conn, vec![new], history_per_job)?.pop() {
        Some(Submitted::Created(t)) => Ok(Some(t)),
        Some(Submitted::Existing(other)) => Err(Error::IdempotencyConflict {
            index: 0,
            key: other.idempotency_key.clone().unwrap_or_default(),
            existing: other.id,
        }),
        None => Err(Error::Corrupt("a replacement stored nothing".into())),
    }
}

/// `Store::agents_ready_now`: claimable steps of unfinished jobs that are due, per agent.
pub(super) fn ready_now(conn: &Connection, now: Timestamp) -> Result<Vec<(String, u64)>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT s.claim_agent, COUNT(*) \
             FROM steps s INDEXED BY steps_claim JOIN jobs j ON j.id = s.job_id \
             WHERE s.claim_agent IS NOT NULL \
               AND COALESCE(s.next_attempt_at, 0) <= ?1 \
               AND j.state NOT IN ('succeeded', 'failed', 'cancelled') \
             GROUP BY s.claim_agent ORDER BY s.claim_agent",
        )
        .db()?;
    let mut rows = stmt.query([now.as_millis()]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push((
            row.get(0).db()?,
            rows::count_param("ready", row.get(1).db()?)?,
        ));
    }
    Ok(out)
}
