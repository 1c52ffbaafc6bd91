//! Removing jobs, and replacing one job by another (`Jobs::jobs_delete`, `Jobs::job_replace`).
//!
//! A job goes only when it is in one of the states the caller expects and none of its steps
//! holds a live lease, checked on the job as loaded in the write transaction: a job that moved on
//! since the caller looked (was claimed, finished, …) is left alone. The rows of its steps,
//! labels, history and leases go with it in the same write ([`delete_rows_of`]: there are no
//! foreign keys to cascade); recorded deliveries stay, as they outlive their job by design.

use overseer_core::{Job, JobId, JobState, Transition};
use rusqlite::Connection;

use super::jobs::submit_jobs;
use super::rows::{self, job_id_text, DbResult};
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
    super::written::forget(id);
    let id = job_id_text(id);
    let n = conn
        .prepare_cached("DELETE FROM jobs WHERE id = ?1")
        .db()?
        .execute([&id])
        .db()?;
    delete_rows_of(conn, &[&id], false)?;
    Ok(n == 1)
}

/// Jobs whose dependent rows one statement deletes: the width of the `IN` lists below, padded
/// with `NULL`s (which match nothing) when fewer are given.
pub(super) const ROWS_OF_AT_ONCE: usize = 4;

/// Deletes the steps, labels, history and retired leases of the jobs `ids` (their rows go
/// separately), [`ROWS_OF_AT_ONCE`] jobs per statement; with `settled`, their settled deliveries
/// too. Every path that removes a job calls this in the same write, so no row outlives its job.
pub(super) fn delete_rows_of(conn: &Connection, ids: &[&str], settled: bool) -> Result<()> {
    const DEPENDENTS: [&str; 5] = [
        "DELETE FROM steps WHERE job_id IN (?1, ?2, ?3, ?4)",
        "DELETE FROM job_labels WHERE job_id IN (?1, ?2, ?3, ?4)",
        "DELETE FROM events WHERE job_id IN (?1, ?2, ?3, ?4)",
        "DELETE FROM leases WHERE job_id IN (?1, ?2, ?3, ?4)",
        "DELETE FROM deliveries WHERE job_id IN (?1, ?2, ?3, ?4) \
           AND (dead <> 0 OR delivered_at IS NOT NULL)",
    ];
    let tables = if settled {
        &DEPENDENTS[..]
    } else {
        &DEPENDENTS[..4]
    };
    for chunk in ids.chunks(ROWS_OF_AT_ONCE) {
        let mut padded: [Option<&str>; ROWS_OF_AT_ONCE] = [None; ROWS_OF_AT_ONCE];
        for (slot, id) in padded.iter_mut().zip(chunk) {
            *slot = Some(id);
        }
        for sql in tables {
            let mut stmt = conn.prepare_cached(sql).db()?;
            stmt.execute(rusqlite::params_from_iter(padded)).db()?;
        }
    }
    Ok(())
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
