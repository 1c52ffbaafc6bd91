//! Ordering keys: jobs sharing a key run one at a time, in submission order.
//!
//! The core admits a keyed job `pending` and leaves it there; the store, which can see the key's
//! other jobs, decides when it may start. The *head* of a key is its unfinished job with the
//! smallest submission `seq` (see schema V3). A head that is due is started in the transaction
//! that submits it; a job that becomes head when its predecessor finishes is started in the
//! transaction that finishes the predecessor (`start_next_head`), or by the supervisor's
//! `jobs_due` once its `run_at` comes. A failed or blocked head holds only its own key.

use overseer_core::{Command, Job, JobId, Timestamp, Transition};
use rusqlite::{params, Connection, OptionalExtension};

use super::persist;
use super::rows::{self, DbResult};
use crate::{decide, Error, OrderingKeyStatus, Result};

/// Whether no unfinished job of `key` was submitted before `seq`. The WHERE clause repeats the
/// partial index's word for word (see schema V3).
fn is_head(conn: &Connection, key: &str, seq: i64) -> Result<bool> {
    let ahead = conn
        .prepare_cached(concat!(
            "SELECT 1 FROM jobs INDEXED BY jobs_ordering_key \
             WHERE ordering_key = ?1 AND seq < ?2 AND ordering_key IS NOT NULL AND ",
            unfinished!("state"),
            " LIMIT 1"
        ))
        .db()?
        .exists(params![key, seq])
        .db()?;
    Ok(!ahead)
}

/// Whether `job` may start as far as its key goes: it has none, or heads it. Checked before an
/// `Activate`, so even a stray one cannot start a job while another of its key is unfinished.
pub(super) fn may_start(conn: &Connection, job: &Job) -> Result<bool> {
    let Some(key) = job.ordering_key.as_deref() else {
        return Ok(true);
    };
    let seq: Option<i64> = conn
        .prepare_cached("SELECT seq FROM jobs WHERE id = ?1")
        .db()?
        .query_row([rows::job_id_text(job.id)], |r| r.get(0))
        .optional()
        .db()?
        .flatten();
    let seq = seq.ok_or_else(|| Error::Corrupt(format!("job {} has no submission seq", job.id)))?;
    is_head(conn, key, seq)
}

/// After inserting an admitted job with submission number `seq`: if it is keyed, pending, due at
/// its admission (`run_at` none or not after `created_at`) and heads its key, starts it through
/// the core at `created_at` and stores that too. Answers the submit's transition: the admission
/// alone, or the admission followed by the activation (the activated job, both histories in
/// order, both effects).
pub(super) fn admit_keyed(
    conn: &Connection,
    admission: Transition,
    seq: i64,
    history_per_job: usize,
) -> Result<Transition> {
    match decide::waits_on_key(&admission) {
        Some(key) if is_head(conn, key, seq)? => {}
        _ => return Ok(admission),
    }
    let activation = decide::head_starts(&admission)?;
    let job = &admission.job;
    persist(conn, job, &activation, job.created_at, history_per_job)?;
    Ok(admission.then(activation))
}

/// One ordered range of the pending jobs' due index; a keyed candidate costs one probe of the
/// key's index to see whether an unfinished job of its key is ahead of it.
pub(super) const JOBS_DUE_SQL: &str = concat!(
    "SELECT j.id FROM jobs AS j INDEXED BY jobs_pending_due \
     WHERE j.state = 'pending' AND COALESCE(j.run_at, j.created_at) <= ?1 \
       AND (j.ordering_key IS NULL OR NOT EXISTS ( \
         SELECT 1 FROM jobs AS o INDEXED BY jobs_ordering_key \
         WHERE o.ordering_key = j.ordering_key AND o.seq < j.seq \
           AND o.ordering_key IS NOT NULL AND ",
    unfinished!("o.state"),
    ")) ORDER BY COALESCE(j.run_at, j.created_at), j.id LIMIT ?2"
);

/// Pending jobs due at `now` that have no key or head theirs, earliest due instant
/// (`run_at`, else `created_at`) first, then by id.
pub(super) fn jobs_due(conn: &Connection, now: Timestamp, limit: usize) -> Result<Vec<JobId>> {
    rows::query_job_ids(
        conn,
        JOBS_DUE_SQL,
        params![now.as_millis(), rows::limit_param(limit)],
    )
}

/// The unfinished job of `key` with the smallest submission number.
fn head_id(conn: &Connection, key: &str) -> Result<Option<JobId>> {
    let id: Option<String> = conn
        .prepare_cached(concat!(
            "SELECT id FROM jobs INDEXED BY jobs_ordering_key \
             WHERE ordering_key = ?1 AND ordering_key IS NOT NULL AND ",
            unfinished!("state"),
            " ORDER BY seq LIMIT 1"
        ))
        .db()?
        .query_row([key], |r| r.get(0))
        .optional()
        .db()?;
    id.map(|id| rows::job_id(&id)).transpose()
}

/// After a job of `key` finished (see `Transition::freed_ordering_key`): starts the key's new
/// head at `now` if it is pending and due, in the caller's transaction, and answers its
/// activation. A head that is not due yet is left to the supervisor's timer.
pub(super) fn start_next_head(
    conn: &Connection,
    key: &str,
    now: Timestamp,
    history_per_job: usize,
) -> Result<Option<Transition>> {
    let Some(id) = head_id(conn, key)? else {
        return Ok(None);
    };
    let job = rows::load_job(conn, id)?
        .ok_or_else(|| Error::Corrupt(format!("job {id} vanished during a write")))?;
    match overseer_core::apply(&job, Command::Activate, now) {
        Ok(t) => {
            persist(conn, &job, &t, now, history_per_job)?;
            Ok(Some(t))
        }
        Err(overseer_core::Rejection::NotDue) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The head of `key` and how many unfinished jobs of the key wait behind it.
pub(super) fn status(conn: &Connection, key: &str) -> Result<OrderingKeyStatus> {
    let head = match head_id(conn, key)? {
        Some(id) => Some(
            rows::load_job(conn, id)?
                .ok_or_else(|| Error::Corrupt(format!("job {id} vanished during a read")))?,
        ),
        None => None,
    };
    let unfinished: i64 = conn
        .prepare_cached(concat!(
            "SELECT COUNT(*) FROM jobs INDEXED BY jobs_ordering_key \
             WHERE ordering_key = ?1 AND ordering_key IS NOT NULL AND ",
            unfinished!("state")
        ))
        .db()?
        .query_row([key], |r| r.get(0))
        .db()?;
    let unfinished = rows::count_param("ordering key waiting", unfinished)?;
    Ok(decide::ordering_key_status(key, head, unfinished))
}
