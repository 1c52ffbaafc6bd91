//! Inserting a batch of submitted jobs with one statement per table: the job rows first (so the
//! idempotency index decides which of them are new, and each keeps its admission entries waiting
//! to be logged), then the steps and labels of the new ones together. A batch of a thousand one-step jobs costs two round trips, not a thousand.

use std::collections::HashMap;
use std::sync::OnceLock;

use super::tx::Transaction;
use overseer_core::backoff::Formula;
use overseer_core::{Job, JobId, NewEvent};
use uuid::Uuid;

use super::rows::{self, corrupt, get, json_text, ms, query, text, zipped_insert};
use super::writes::StepColumns;
use super::{jobs, unlogged, Res};
use crate::{history, NewJob};

/// A job row's columns and their arrays' types, in the order of the arrays (`$1` to `$25`).
const JOB_ROW_COLUMNS: [(&str, &str); 25] = [
    ("id", "uuid"),
    ("idempotency_key", "text"),
    ("fingerprint", "text"),
    ("labels", "text"),
    ("priority", "integer"),
    ("run_at", "bigint"),
    ("ordering_key", "text"),
    ("callback_url", "text"),
    ("on_failure", "text"),
    ("state", "text"),
    ("desired_state", "text"),
    ("created_at", "bigint"),
    ("updated_at", "bigint"),
    ("finished_at", "bigint"),
    ("blocked_reason", "text"),
    ("last_event_seq", "bigint"),
    ("retention_ms", "bigint"),
    ("submitted_by", "text"),
    ("deadline", "bigint"),
    ("deadline_due", "bigint"),
    ("round", "bigint"),
    ("job_retry", "text"),
    ("rerun_of", "uuid"),
    ("rerun_by", "uuid"),
    ("unlogged_entries", "text"),
];

/// The job rows of a batch, inserted in batch order (so submission sequence numbers follow it),
/// with `conflict` (what a taken key does), answering each row's id and `seq`.
fn insert_jobs_sql(conflict: &str) -> String {
    format!(
        "{} {conflict} RETURNING id, seq",
        zipped_insert("jobs", &JOB_ROW_COLUMNS)
    )
}

/// Inserts the job rows of a batch, in batch order, leaving out those whose idempotency key is
/// taken (by a stored job, or by an earlier job of the batch). Answers the submission sequence
/// number of each job inserted, by id. A key being inserted by another transaction is waited for.
///
/// Each row keeps its admission entries waiting to be logged (the newest `keep`; see
/// `super::unlogged`): a submit writes no history row.
///
/// Only a batch holding a key inserts with `ON CONFLICT`: that makes every row a speculative
/// insertion, confirmed by a second log record and buffer lock of its own, which a row without
/// a key (a fresh UUID) cannot need.
pub(super) async fn insert_job_rows(
    tx: &Transaction<'_>,
    jobs: &[&NewJob],
    keep: usize,
) -> Res<HashMap<Uuid, i64>> {
    let mut c = JobRows::default();
    for new in jobs {
        c.push(&new.transition.job, &new.transition.events, keep)?;
    }
    static PLAIN: OnceLock<String> = OnceLock::new();
    static KEYED: OnceLock<String> = OnceLock::new();
    let sql = match c.idempotency_key.iter().any(Option::is_some) {
        true => KEYED.get_or_init(|| {
            insert_jobs_sql(
                "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING",
            )
        }),
        false => PLAIN.get_or_init(|| insert_jobs_sql("")),
    };
    let rows = query(
        tx,
        sql,
        &[
            &c.id,
            &c.idempotency_key,
            &c.fingerprint,
            &c.labels,
            &c.priority,
            &c.run_at,
            &c.ordering_key,
            &c.callback_url,
            &c.on_failure,
            &c.state,
            &c.desired_state,
            &c.created_at,
            &c.updated_at,
            &c.finished_at,
            &c.blocked_reason,
            &c.last_event_seq,
            &c.retention_ms,
            &c.submitted_by,
            &c.deadline,
            &c.deadline_due,
            &c.round,
            &c.job_retry,
            &c.rerun_of,
            &c.rerun_by,
            &c.unlogged,
        ],
    )
    .await?;
    let mut inserted = HashMap::with_capacity(rows.len());
    for row in &rows {
        inserted.insert(get(row, 0, "jobs.id")?, get(row, 1, "jobs.seq")?);
    }
    for (new, waiting) in jobs.iter().zip(c.unlogged) {
        let id = new.transition.job.id;
        if inserted.contains_key(&id.0) {
            unlogged::inserted(tx, id, waiting);
        }
    }
    Ok(inserted)
}

/// The job columns of a batch of new rows.
#[derive(Default)]
struct JobRows<'a> {
    id: Vec<Uuid>,
    idempotency_key: Vec<Option<&'a str>>,
    fingerprint: Vec<&'a str>,
    labels: Vec<String>,
    priority: Vec<i32>,
    run_at: Vec<Option<i64>>,
    ordering_key: Vec<Option<&'a str>>,
    callback_url: Vec<Option<std::borrow::Cow<'a, str>>>,
    on_failure: Vec<&'static str>,
    state: Vec<&'static str>,
    desired_state: Vec<&'static str>,
    created_at: Vec<i64>,
    updated_at: Vec<i64>,
    finished_at: Vec<Option<i64>>,
    blocked_reason: Vec<Option<std::borrow::Cow<'a, str>>>,
    last_event_seq: Vec<i64>,
    retention_ms: Vec<Option<i64>>,
    submitted_by: Vec<Option<&'a str>>,
    deadline: Vec<Option<i64>>,
    deadline_due: Vec<Option<i64>>,
    round: Vec<i64>,
    job_retry: Vec<Option<String>>,
    rerun_of: Vec<Option<Uuid>>,
    rerun_by: Vec<Option<Uuid>>,
    unlogged: Vec<Option<String>>,
}

impl<'a> JobRows<'a> {
    fn push(&mut self, job: &'a Job, events: &[NewEvent], keep: usize) -> Res<()> {
        let (waiting, first) = history::stored(events, keep);
        self.id.push(job.id.0);
        self.idempotency_key.push(job.idempotency_key.as_deref());
        self.fingerprint.push(&job.fingerprint);
        self.labels
            .push(serde_json::to_string(&job.labels).map_err(|e| corrupt("jobs.labels", e))?);
        self.priority.push(job.priority);
        self.run_at.push(ms(job.run_at));
        self.ordering_key.push(job.ordering_key.as_deref());
        self.callback_url
            .push(job.callback_url.as_deref().map(text));
        self.on_failure.push(job.on_failure.as_str());
        self.state.push(job.state.as_str());
        self.desired_state.push(job.desired_state.as_str());
        self.created_at.push(job.created_at.as_millis());
        self.updated_at.push(job.updated_at.as_millis());
        self.finished_at.push(ms(job.finished_at));
        self.blocked_reason
            .push(job.blocked_reason.as_deref().map(text));
        // The entries not kept are numbered as if logged; the kept ones wait after them.
        self.last_event_seq.push(first - 1);
        self.unlogged.push(history::more_text(waiting)?);
        self.retention_ms
            .push(job.retention.map(|r| r.as_millis_i64()));
        self.submitted_by.push(job.submitted_by.as_deref());
        self.deadline.push(ms(job.deadline));
        self.deadline_due.push(ms(job.deadline_due()));
        self.round.push(i64::from(job.round));
        self.job_retry.push(
            job.retry
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| corrupt("jobs.job_retry", e))?,
        );
        self.rerun_of.push(job.rerun_of.map(|id| id.0));
        self.rerun_by.push(job.rerun_by.map(|id| id.0));
        Ok(())
    }
}

/// Inserts what belongs to new jobs besides their rows: steps and labels, one statement each,
/// sent together. (Their admission histories wait in the job rows: see `insert_job_rows`.)
pub(super) async fn insert_job_parts(tx: &Transaction<'_>, jobs: &[&NewJob]) -> Res<()> {
    futures::try_join!(insert_steps(tx, jobs), insert_labels(tx, jobs))?;
    Ok(())
}

async fn insert_steps(tx: &Transaction<'_>, jobs: &[&NewJob]) -> Res<()> {
    let mut run = StepColumns::default();
    let mut def = StepDefinitions::default();
    for new in jobs {
        let job = &new.transition.job;
        for idx in 0..job.steps.len() {
            run.push_step(job, idx)?;
            def.push(job, idx)?;
        }
    }
    if def.name.is_empty() {
        return Ok(());
    }
    let mut params = run.params();
    params.extend(def.params());
    rows::execute(tx, insert_steps_sql(), &params).await?;
    Ok(())
}

/// The run-time columns in `StepColumns::params` order, then the definition columns.
fn insert_steps_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        zipped_insert(
            "steps",
            &[
                ("job_id", "uuid"),
                ("idx", "integer"),
                ("priority", "integer"),
                ("state", "text"),
                ("attempt", "bigint"),
                ("failures", "bigint"),
                ("lease_id", "uuid"),
                ("worker", "text"),
                ("ready_at", "bigint"),
                ("started_at", "bigint"),
                ("finished_at", "bigint"),
                ("lease_expires_at", "bigint"),
                ("next_attempt_at", "bigint"),
                ("result", "text"),
                ("last_error", "text"),
                ("budget_from", "bigint"),
                ("comp_phase", "text"),
                ("comp_attempts", "bigint"),
                ("comp_failures", "bigint"),
                ("comp_budget_from", "bigint"),
                ("claim_agent", "text"),
                ("lease_agent", "text"),
                ("claim_rank", "bigint"),
                ("attempt_ends_at", "bigint"),
                ("progress", "text"),
                ("progress_at", "bigint"),
                ("name", "text"),
                ("agent", "text"),
                ("payload", "text"),
                ("depends_on", "text"),
                ("timeout_ms", "bigint"),
                ("max_attempts", "bigint"),
                ("backoff_initial_ms", "bigint"),
                ("backoff_factor", "double precision"),
                ("backoff_max_ms", "bigint"),
                ("compensate", "text"),
                ("created_at", "bigint"),
                ("backoff_formula", "text"),
                ("http", "text"),
                ("deadline_ms", "bigint"),
                ("progress_events", "boolean"),
            ],
        )
    })
}

/// What admission fixed about each step, column by column.
#[derive(Default)]
struct StepDefinitions<'a> {
    name: Vec<&'a str>,
    agent: Vec<&'a str>,
    payload: Vec<String>,
    depends_on: Vec<String>,
    timeout_ms: Vec<i64>,
    max_attempts: Vec<i64>,
    backoff_initial_ms: Vec<i64>,
    backoff_factor: Vec<f64>,
    backoff_max_ms: Vec<i64>,
    compensate: Vec<Option<String>>,
    created_at: Vec<i64>,
    backoff_formula: Vec<Option<&'static str>>,
    http: Vec<Option<String>>,
    deadline_ms: Vec<Option<i64>>,
    progress_events: Vec<bool>,
}

impl<'a> StepDefinitions<'a> {
    fn push(&mut self, job: &'a Job, idx: usize) -> Res<()> {
        let s = &job.steps[idx];
        self.name.push(&s.name);
        self.agent.push(&s.agent);
        self.payload.push(json_text(&s.payload));
        self.depends_on.push(
            serde_json::to_string(&s.depends_on).map_err(|e| corrupt("steps.depends_on", e))?,
        );
        self.timeout_ms.push(s.timeout.as_millis_i64());
        self.max_attempts.push(i64::from(s.max_attempts));
        self.backoff_initial_ms
            .push(s.backoff.initial.as_millis_i64());
        self.backoff_factor.push(s.backoff.factor);
        self.backoff_max_ms.push(s.backoff.max.as_millis_i64());
        self.compensate.push(
            s.compensate
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| corrupt("steps.compensate", e))?,
        );
        self.created_at.push(s.created_at.as_millis());
        // NULL for the exponential default, as rows from before schema V2 have it.
        self.backoff_formula
            .push((s.backoff_formula != Formula::Exponential).then(|| s.backoff_formula.as_str()));
        self.http.push(
            s.http
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| corrupt("steps.http", e))?,
        );
        self.deadline_ms.push(s.deadline.map(|d| d.as_millis_i64()));
        self.progress_events.push(s.progress_events);
        Ok(())
    }

    fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        vec![
            &self.name,
            &self.agent,
            &self.payload,
            &self.depends_on,
            &self.timeout_ms,
            &self.max_attempts,
            &self.backoff_initial_ms,
            &self.backoff_factor,
            &self.backoff_max_ms,
            &self.compensate,
            &self.created_at,
            &self.backoff_formula,
            &self.http,
            &self.deadline_ms,
            &self.progress_events,
        ]
    }
}

async fn insert_labels(tx: &Transaction<'_>, jobs: &[&NewJob]) -> Res<()> {
    let (mut ids, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for new in jobs {
        let job = &new.transition.job;
        for (k, v) in &job.labels {
            ids.push(job.id.0);
            keys.push(text(k));
            values.push(text(v));
        }
    }
    if ids.is_empty() {
        return Ok(());
    }
    static SQL: OnceLock<String> = OnceLock::new();
    let sql = SQL.get_or_init(|| {
        zipped_insert(
            "job_labels",
            &[("job_id", "uuid"), ("key", "text"), ("value", "text")],
        )
    });
    rows::execute(tx, sql, &[&ids, &keys, &values]).await?;
    Ok(())
}

/// The jobs holding the idempotency keys of `jobs`, by key: `(id, fingerprint)`.
pub(super) async fn key_holders(
    tx: &Transaction<'_>,
    jobs: &[&NewJob],
) -> Res<HashMap<String, (JobId, String)>> {
    let keys: Vec<&str> = jobs
        .iter()
        .filter_map(|n| n.transition.job.idempotency_key.as_deref())
        .collect();
    let rows = query(
        tx,
        "SELECT j.idempotency_key, j.id, j.fingerprint FROM unnest($1::text[]) AS w (k) \
         CROSS JOIN LATERAL (SELECT idempotency_key, id, fingerprint FROM jobs \
           WHERE idempotency_key = w.k OFFSET 0) j",
        &[&keys],
    )
    .await?;
    let mut out = HashMap::with_capacity(rows.len());
    for row in &rows {
        let key: String = get(row, 0, "jobs.idempotency_key")?;
        out.insert(
            key,
            (
                JobId(get(row, 1, "jobs.id")?),
                get(row, 2, "jobs.fingerprint")?,
            ),
        );
    }
    Ok(out)
}

/// Signals for the new jobs, sent at commit.
pub(super) fn signals(jobs: &[&NewJob]) -> Vec<String> {
    let mut out: Vec<String> = jobs
        .iter()
        .flat_map(|n| jobs::signals_of(&n.transition))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}
