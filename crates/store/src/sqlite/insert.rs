//! Inserting new jobs.
//!
//! A submit of N jobs takes its N submission numbers with one counter update, and a new job's
//! row is inserted already counting the history entries it starts with, so a new job costs its
//! rows and nothing more (before: two counter updates a job, a third of a batch's writer time).
//!
//! Multi-row `INSERT`s were measured here and not kept: SQLite gives a statement that writes
//! several rows into a table with an immediate foreign key (steps, labels, events → jobs) a
//! statement journal, a copy of every page it changes, which cost more than the statements saved.

use std::sync::OnceLock;

use overseer_core::{Job, NewEvent};
use rusqlite::{params, Connection};

use super::rows::{
    append_events, corrupt, job_id_text, ms, retry_text, update_then_read, write_step, DbResult,
    JOB_COLUMNS,
};
use crate::Result;

/// Takes `n` submission sequence numbers at once and answers the first: each is greater than
/// every number taken before it (see schema V3). Numbers left unused (a job found by its
/// idempotency key) are simply skipped: they need only grow.
pub(super) fn reserve_seqs(conn: &Connection, n: usize) -> Result<i64> {
    let n = i64::try_from(n).map_err(|e| corrupt("job_seq", e))?;
    let last = update_then_read(
        conn,
        "UPDATE job_seq SET last = last + ?1 WHERE id = 1",
        [n],
        "SELECT last FROM job_seq WHERE id = 1",
        [],
    )?
    .ok_or_else(|| corrupt("job_seq", "the submission counter row is missing"))?;
    Ok(last - n + 1)
}

fn insert_job_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let columns = JOB_COLUMNS.split(',').count() + 3;
        let placeholders: Vec<String> = (1..=columns).map(|i| format!("?{i}")).collect();
        format!(
            "INSERT INTO jobs ({JOB_COLUMNS}, seq, deadline_due, last_event_seq) VALUES ({})",
            placeholders.join(", ")
        )
    })
}

/// Inserts a new job with submission number `seq` (from [`reserve_seqs`]) and its first
/// history entries, keeping at most `keep` of them: the row already counts them, so appending
/// them updates no counter.
pub(super) fn insert_new(
    conn: &Connection,
    job: &Job,
    seq: i64,
    events: &[NewEvent],
    keep: usize,
) -> Result<()> {
    insert_job(conn, job, seq, events.len())?;
    let counted = i64::try_from(events.len()).map_err(|e| corrupt("jobs.last_event_seq", e))?;
    append_events(conn, job.id, events, keep, Some(counted))
}

/// Inserts a new job's row (counting `events` history entries), its labels and its steps.
fn insert_job(conn: &Connection, job: &Job, seq: i64, events: usize) -> Result<()> {
    let id = job_id_text(job.id);
    let labels = serde_json::to_string(&job.labels).map_err(|e| corrupt("jobs.labels", e))?;
    let events = i64::try_from(events).map_err(|e| corrupt("jobs.last_event_seq", e))?;
    conn.prepare_cached(insert_job_sql())
        .db()?
        .execute(params![
            id,
            job.idempotency_key,
            job.fingerprint,
            labels,
            job.priority,
            ms(job.run_at),
            job.ordering_key,
            job.callback_url,
            job.on_failure.as_str(),
            job.state.as_str(),
            job.desired_state.as_str(),
            job.created_at.as_millis(),
            job.updated_at.as_millis(),
            ms(job.finished_at),
            job.blocked_reason,
            job.retention.map(|r| r.as_millis_i64()),
            job.submitted_by,
            ms(job.deadline),
            job.round,
            retry_text(job)?,
            job.rerun_of.map(job_id_text),
            job.rerun_by.map(job_id_text),
            seq,
            ms(job.deadline_due()),
            events,
        ])
        .db()?;
    let mut label = conn
        .prepare_cached("INSERT INTO job_labels (job_id, key, value) VALUES (?1, ?2, ?3)")
        .db()?;
    for (k, v) in &job.labels {
        label.execute(params![id, k, v]).db()?;
    }
    for idx in 0..job.steps.len() {
        write_step(conn, job, idx)?;
    }
    Ok(())
}
