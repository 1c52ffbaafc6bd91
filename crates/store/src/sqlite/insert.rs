//! Inserting new jobs.
//!
//! A submit of N jobs takes its N submission numbers with one counter update, and a new job's
//! row is inserted already counting the history entries it starts with, so a new job costs its
//! rows and nothing more (before: two counter updates a job, a third of a batch's writer time).
//!
//! Multi-row `INSERT`s were measured here and not kept while the child tables had foreign keys
//! (until migration 0019): SQLite gives a statement that writes several rows into a table with an
//! immediate foreign key a statement journal, a copy of every page it changes, which cost more
//! than the statements saved.

use std::sync::OnceLock;

use overseer_core::{Job, NewEvent};
use rusqlite::{params, CachedStatement, Connection};

use super::row_writes::{insert_step, insert_step_sql, placeholders, update_then_read};
use super::rows::{corrupt, job_id_text, ms, retry_text, DbResult, JOB_COLUMNS};
use crate::{history, Result};

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
        let columns = JOB_COLUMNS.split(',').count() + 5;
        format!(
            "INSERT INTO jobs ({JOB_COLUMNS}, seq, deadline_due, last_event_seq, admission_seq, \
             admission) VALUES ({})",
            placeholders(columns)
        )
    })
}

/// A new job's admission entries as its row keeps them: the number of the first (`seq`) and the
/// entries as a `more` text (see `crate::history`).
struct Admission {
    seq: i64,
    text: Option<String>,
}

/// The statements new jobs are inserted with, taken from the statement cache once per submit
/// rather than once per row: a lookup hashes the statement's text, and a batch of 1,000
/// one-step jobs made 5,000 of them (6 % of the writer's time in a batch submit's profile).
pub(super) struct NewRows<'c> {
    job: CachedStatement<'c>,
    label: CachedStatement<'c>,
    step: CachedStatement<'c>,
}

impl<'c> NewRows<'c> {
    pub(super) fn prepare(conn: &'c Connection) -> Result<NewRows<'c>> {
        Ok(NewRows {
            job: conn.prepare_cached(insert_job_sql()).db()?,
            label: conn
                .prepare_cached("INSERT INTO job_labels (job_id, key, value) VALUES (?1, ?2, ?3)")
                .db()?,
            step: conn.prepare_cached(insert_step_sql()).db()?,
        })
    }

    /// Inserts a new job with submission number `seq` (from [`reserve_seqs`]), its labels, its
    /// steps and its first history entries, keeping at most `keep` of them: the row already
    /// counts them, so appending them updates no counter.
    pub(super) fn insert(
        &mut self,
        job: &Job,
        seq: i64,
        events: &[NewEvent],
        keep: usize,
    ) -> Result<()> {
        let id = job_id_text(job.id);
        let counted = i64::try_from(events.len()).map_err(|e| corrupt("jobs.last_event_seq", e))?;
        // The admission's entries stay in the job row: a submit writes no history row.
        let (admission, first) = history::stored(events, keep);
        let admission = Admission {
            seq: first,
            text: history::more_text(admission)?,
        };
        self.insert_job(&id, job, seq, counted, &admission)?;
        for (k, v) in &job.labels {
            self.label.execute(params![id, k, v]).db()?;
        }
        for idx in 0..job.steps.len() {
            insert_step(&mut self.step, job, idx)?;
        }
        // Most jobs are claimed soon after they are submitted: the claim finds this one here
        // instead of reading and decoding its rows.
        super::written::remember(job, counted);
        Ok(())
    }

    /// Inserts the job's own row, counting `events` history entries, with its `admission`.
    fn insert_job(
        &mut self,
        id: &str,
        job: &Job,
        seq: i64,
        events: i64,
        admission: &Admission,
    ) -> Result<()> {
        let labels = serde_json::to_string(&job.labels).map_err(|e| corrupt("jobs.labels", e))?;
        self.job
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
                admission.text.as_ref().map(|_| admission.seq),
                admission.text,
            ])
            .db()?;
        Ok(())
    }
}
