//! Jobs: submits (idempotent on their key), reads, commands through the core, due and active
//! jobs, removal and replacement (`removal`), and ordering keys (`ordering`).

use std::sync::LazyLock;

use overseer_core::{Event, Job, JobId, JobState, Transition};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use super::rows::{self, job_id_text, limit_param, DbResult};
use super::{apply_command, insert, leader, ordering, removal, rerun, stats, SqliteStore};
use crate::decide;
use crate::{
    ActivePage, Apply, Due, Error, EventPage, FinishedCount, JobQuery, Jobs, NewJob,
    OrderingKeyStatus, Removal, Replacement, Reran, RerunJob, Result, StateCount, Submitted,
    Window,
};

#[async_trait::async_trait]
impl Jobs for SqliteStore {
    async fn jobs_submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let history = self.inner.history_per_job;
        self.write(move |conn| submit_jobs(conn, jobs, history))
            .await
    }

    async fn job_get(&self, id: JobId) -> Result<Option<Job>> {
        self.read(move |conn| rows::load_job(conn, id)).await
    }

    async fn jobs_list(&self, query: JobQuery) -> Result<Vec<Job>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| list_jobs(conn, &query)).await
    }

    async fn job_events(&self, page: EventPage) -> Result<Vec<Event>> {
        self.read(move |conn| {
            let events = super::history::load_events(conn, page.job, page.after_seq, page.limit)?;
            if events.is_empty() {
                let exists = conn
                    .prepare_cached("SELECT 1 FROM jobs WHERE id = ?1")
                    .db()?
                    .exists([job_id_text(page.job)])
                    .db()?;
                if !exists {
                    return Err(Error::JobNotFound(page.job));
                }
            }
            Ok(events)
        })
        .await
    }

    async fn job_apply(&self, apply: Apply) -> Result<Transition> {
        let history = self.inner.history_per_job;
        #[cfg(feature = "fault-injection")]
        let crash = self.inner.crash_after_step_result.clone();
        self.write(move |conn| {
            if let Some(fence) = &apply.fence {
                leader::check_fence(conn, fence, apply.now)?;
            }
            let Apply {
                job, command, now, ..
            } = apply;
            #[cfg(feature = "fault-injection")]
            if let Some(crash) = &crash {
                return super::fault::apply_or_crash(conn, job, command, now, history, crash);
            }
            apply_command(conn, job, command, now, history)
        })
        .await
    }

    async fn jobs_due(&self, due: Due) -> Result<Vec<JobId>> {
        self.read(move |conn| ordering::jobs_due(conn, due.now, due.limit))
            .await
    }

    async fn jobs_active(&self, page: ActivePage) -> Result<Vec<JobId>> {
        if page.limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| active(conn, page)).await
    }

    async fn jobs_delete(&self, removal: Removal) -> Result<Vec<JobId>> {
        if removal.ids.is_empty() {
            return Ok(Vec::new());
        }
        self.write(move |conn| removal::delete(conn, &removal.ids, &removal.states))
            .await
    }

    async fn job_replace(&self, r: Replacement) -> Result<Option<Transition>> {
        let history = self.inner.history_per_job;
        self.write(move |conn| removal::replace(conn, r.old, &r.states, r.new, history))
            .await
    }

    async fn jobs_past_deadline(&self, due: Due) -> Result<Vec<JobId>> {
        self.read(move |conn| past_deadline(conn, due)).await
    }

    async fn job_rerun(&self, r: RerunJob) -> Result<Reran> {
        let history = self.inner.history_per_job;
        self.write(move |conn| rerun::rerun(conn, r, history)).await
    }

    async fn ordering_key_status(&self, key: &str) -> Result<OrderingKeyStatus> {
        let key = key.to_string();
        self.read(move |conn| ordering::status(conn, &key)).await
    }

    async fn jobs_count_by_state(&self) -> Result<Vec<StateCount>> {
        self.read(stats::count_by_state).await
    }

    async fn jobs_finished_per_minute(&self, window: Window) -> Result<Vec<FinishedCount>> {
        self.read(move |conn| stats::finished_per_minute(conn, window))
            .await
    }
}

/// Unfinished jobs in id order, for the supervisor's repair: one range of `jobs_state_id` per
/// unfinished state, merged by id (SQLite merges the ordered arms of a compound select, so no
/// arm is read past the page).
pub(super) static ACTIVE_SQL: LazyLock<String> = LazyLock::new(|| {
    let arms: Vec<String> = JobState::unfinished()
        .map(|s| {
            format!("SELECT id FROM jobs INDEXED BY jobs_state_id WHERE state = '{s}' AND id > ?1")
        })
        .collect();
    format!("{} ORDER BY id LIMIT ?2", arms.join(" UNION ALL "))
});

fn active(conn: &Connection, page: ActivePage) -> Result<Vec<JobId>> {
    rows::query_job_ids(
        conn,
        &ACTIVE_SQL,
        params![
            page.after.map(job_id_text).unwrap_or_default(),
            limit_param(page.limit)
        ],
    )
}

/// Submits `jobs` in one transaction, in order: each is found by its idempotency key, or
/// inserted with its history and deliveries, starting at once when it heads its ordering key.
pub(super) fn submit_jobs(
    conn: &Connection,
    jobs: Vec<NewJob>,
    history_per_job: usize,
) -> Result<Vec<Submitted>> {
    let mut out = Vec::with_capacity(jobs.len());
    let first_seq = insert::reserve_seqs(conn, jobs.len())?;
    let mut find = conn
        .prepare_cached("SELECT id, fingerprint FROM jobs WHERE idempotency_key = ?1")
        .db()?;
    let mut new_rows = insert::NewRows::prepare(conn)?;
    for (index, new) in jobs.into_iter().enumerate() {
        let job = &new.transition.job;
        if let Some(key) = &job.idempotency_key {
            // Earlier jobs of this batch are already inserted in this transaction, so a
            // duplicate key inside the batch is found here just like one from an earlier call.
            let found: Option<(String, String)> = find
                .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .db()?;
            if let Some((existing, fingerprint)) = found {
                let existing = rows::job_id(&existing)?;
                let existing = decide::key_holder(index, job, (existing, &fingerprint))?;
                let stored = rows::load_job(conn, existing)?.ok_or_else(|| {
                    Error::Corrupt(format!("job {existing} vanished during a submit"))
                })?;
                out.push(Submitted::Existing(stored));
                continue;
            }
        }
        let seq = first_seq + index as i64;
        new_rows.insert(job, seq, &new.transition.events, history_per_job)?;
        // An admission has no command time of its own: the job was last updated by it.
        rows::insert_deliveries(conn, &new.transition, job.updated_at)?;
        // A keyed job heading its key starts in this same transaction.
        let t = ordering::admit_keyed(conn, new.transition, seq, history_per_job)?;
        out.push(Submitted::Created(t));
    }
    Ok(out)
}

fn list_jobs(conn: &Connection, query: &JobQuery) -> Result<Vec<Job>> {
    let (sql, filters) = crate::filter::job_list_sql(query);
    let mut args: Vec<SqlValue> = filters
        .into_iter()
        .map(|a| match a {
            crate::filter::Arg::Text(t) => SqlValue::Text(t),
            crate::filter::Arg::Id(id) => SqlValue::Text(job_id_text(id)),
            crate::filter::Arg::Millis(ms) => SqlValue::Integer(ms),
        })
        .collect();
    args.push(SqlValue::Integer(limit_param(query.limit)));
    let ids: Vec<String> = conn
        .prepare_cached(&sql)
        .db()?
        .query_map(params_from_iter(args), |r| r.get(0))
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()?;
    let mut jobs = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(job) = rows::load_job(conn, rows::job_id(&id)?)? {
            jobs.push(job);
        }
    }
    Ok(jobs)
}

/// Jobs whose enforced deadline has come, earliest first (see `Jobs::jobs_past_deadline`).
fn past_deadline(conn: &Connection, due: Due) -> Result<Vec<JobId>> {
    rows::query_job_ids(
        conn,
        "SELECT id FROM jobs INDEXED BY jobs_deadline_due \
         WHERE deadline_due IS NOT NULL AND deadline_due <= ?1 \
         ORDER BY deadline_due, id LIMIT ?2",
        params![due.now.as_millis(), limit_param(due.limit)],
    )
}
