//! Reading and writing jobs, steps, events and leases as rows.
//!
//! Everything read back is checked: a value that does not decode is [`Error::Corrupt`], never a
//! panic, so one bad row cannot take a node down.

use std::collections::BTreeMap;
use std::rc::Rc;

use overseer_core::backoff::{Backoff, Formula};
use overseer_core::job::JobRetry;
use overseer_core::outbox::DeliveryKind;
use overseer_core::push::HttpTarget;
use overseer_core::spec::{CompensateSpec, OnFailure};
use overseer_core::{
    CompPhase, DesiredState, Job, JobId, JobState, LeaseId, Span, Step, StepState, Timestamp,
    Transition,
};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::Value;

use super::history::{NEWEST_AT_SQL, NEWEST_LEASE_SEQ_SQL, NEWEST_SEQ_SQL};
use crate::{Delivery, DeliveryCounts, DeliveryOutcome, DeliveryRecord, Error, LeaseRef, Result};

/// Turns a rusqlite error into a store error: decoding trouble is corruption, the rest is the
/// database being unable to serve right now.
pub(super) fn db_error(e: rusqlite::Error) -> Error {
    use rusqlite::ffi::ErrorCode;
    match &e {
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::Utf8Error(..)
        | rusqlite::Error::InvalidColumnType(..) => Error::Corrupt(e.to_string()),
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
        {
            Error::Corrupt(e.to_string())
        }
        _ => Error::Unavailable(e.to_string()),
    }
}

pub(super) trait DbResult<T> {
    fn db(self) -> Result<T>;
}

impl<T> DbResult<T> for rusqlite::Result<T> {
    fn db(self) -> Result<T> {
        self.map_err(db_error)
    }
}

pub(super) fn corrupt(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{what}: {detail}"))
}

fn ts(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp::from_millis)
}

/// A span kept in milliseconds (a negative one cannot have been written).
fn span(v: Option<i64>) -> Option<Span> {
    v.and_then(|ms| u64::try_from(ms).ok())
        .map(Span::from_millis)
}

pub(super) fn ms(t: Option<Timestamp>) -> Option<i64> {
    t.map(Timestamp::as_millis)
}

pub(super) fn to_u32(what: &str, v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| corrupt(what, format!("{v} is out of range")))
}

fn to_u64(what: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(what, format!("{v} is out of range")))
}

pub(super) fn json_text(v: &Value) -> String {
    // Encoding a `Value` cannot fail: its map keys are strings and it holds no non-finite floats.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_string())
}

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

fn parse_id<T: std::str::FromStr>(what: &str, text: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    text.parse()
        .map_err(|e| corrupt(what, format!("`{text}`: {e}")))
}

pub(super) fn job_id_text(id: JobId) -> String {
    id.0.to_string()
}

/// A job id read back from a `jobs.id` text.
pub(super) fn job_id(text: &str) -> Result<JobId> {
    parse_id("jobs.id", text)
}

/// Runs a cached query whose one column is a job id; answers the ids in row order.
pub(super) fn query_job_ids(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<JobId>> {
    let ids: Vec<String> = conn
        .prepare_cached(sql)
        .db()?
        .query_map(params, |r| r.get(0))
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()?;
    ids.iter().map(|id| job_id(id)).collect()
}

pub(super) const JOB_COLUMNS: &str =
    "id, idempotency_key, fingerprint, labels, priority, run_at, ordering_key, \
     callback_url, on_failure, state, desired_state, created_at, updated_at, finished_at, \
     blocked_reason, retention_ms, submitted_by, deadline, round, job_retry, rerun_of, rerun_by";

const STEP_COLUMNS: &str = "idx, name, agent, payload, depends_on, timeout_ms, max_attempts, \
     backoff_initial_ms, backoff_factor, backoff_max_ms, compensate, state, attempt, failures, \
     lease_id, worker, created_at, ready_at, started_at, finished_at, lease_expires_at, \
     next_attempt_at, result, last_error, budget_from, comp_phase, comp_attempts, comp_failures, \
     comp_budget_from, backoff_formula, http, deadline_ms, attempt_ends_at, progress, progress_at, \
     progress_events";

/// How many columns [`STEP_COLUMNS`] names: a read that asks for more finds them after these.
const STEP_COLUMN_COUNT: usize = column_count(STEP_COLUMNS);

/// The number of columns in a comma-separated list.
const fn column_count(list: &str) -> usize {
    let bytes = list.as_bytes();
    let (mut i, mut n) = (0, 1);
    while i < bytes.len() {
        if bytes[i] == b',' {
            n += 1;
        }
        i += 1;
    }
    n
}

fn formula_from_column(text: Option<String>) -> Result<Formula> {
    match text {
        None => Ok(Formula::Exponential),
        Some(t) => Formula::parse(&t).ok_or_else(|| corrupt("steps.backoff_formula", &t)),
    }
}

/// `jobs.job_retry`: the whole-job retry policy as JSON, NULL for other jobs.
pub(super) fn retry_text(job: &Job) -> Result<Option<String>> {
    job.retry
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| corrupt("jobs.job_retry", e))
}

fn job_from_row(row: &Row<'_>) -> Result<Job> {
    let id: String = row.get(0).db()?;
    let labels: String = row.get(3).db()?;
    let on_failure: String = row.get(8).db()?;
    let state: String = row.get(9).db()?;
    let desired: String = row.get(10).db()?;
    Ok(Job {
        id: parse_id("jobs.id", &id)?,
        idempotency_key: row.get(1).db()?,
        fingerprint: row.get(2).db()?,
        labels: parse_json::<BTreeMap<String, String>>("jobs.labels", &labels)?,
        priority: row.get(4).db()?,
        run_at: ts(row.get(5).db()?),
        ordering_key: row.get(6).db()?,
        callback_url: row.get(7).db()?,
        on_failure: OnFailure::parse(&on_failure)
            .ok_or_else(|| corrupt("jobs.on_failure", &on_failure))?,
        state: JobState::parse(&state).ok_or_else(|| corrupt("jobs.state", &state))?,
        desired_state: DesiredState::parse(&desired)
            .ok_or_else(|| corrupt("jobs.desired_state", &desired))?,
        created_at: Timestamp::from_millis(row.get(11).db()?),
        updated_at: Timestamp::from_millis(row.get(12).db()?),
        finished_at: ts(row.get(13).db()?),
        blocked_reason: row.get(14).db()?,
        retention: span(row.get(15).db()?),
        submitted_by: row.get(16).db()?,
        deadline: ts(row.get(17).db()?),
        round: to_u32("jobs.round", row.get(18).db()?)?,
        retry: row
            .get::<_, Option<String>>(19)
            .db()?
            .map(|r| parse_json::<JobRetry>("jobs.job_retry", &r))
            .transpose()?,
        rerun_of: row
            .get::<_, Option<String>>(20)
            .db()?
            .map(|id| parse_id("jobs.rerun_of", &id))
            .transpose()?,
        rerun_by: row
            .get::<_, Option<String>>(21)
            .db()?
            .map(|id| parse_id("jobs.rerun_by", &id))
            .transpose()?,
        steps: Vec::new(),
    })
}

/// Decodes a step row; returns its index too, so the caller can check the steps are contiguous.
fn step_from_row(row: &Row<'_>) -> Result<(i64, Step)> {
    let idx: i64 = row.get(0).db()?;
    let payload: String = row.get(3).db()?;
    let depends_on: String = row.get(4).db()?;
    let compensate: Option<String> = row.get(10).db()?;
    let state: String = row.get(11).db()?;
    let lease_id: Option<String> = row.get(14).db()?;
    let result: Option<String> = row.get(22).db()?;
    let comp_phase: Option<String> = row.get(25).db()?;
    let formula: Option<String> = row.get(29).db()?;
    let http: Option<String> = row.get(30).db()?;
    let progress: Option<String> = row.get(33).db()?;
    let step = Step {
        name: row.get(1).db()?,
        agent: row.get(2).db()?,
        payload: parse_json("steps.payload", &payload)?,
        depends_on: parse_json("steps.depends_on", &depends_on)?,
        timeout: Span::from_millis(to_u64("steps.timeout_ms", row.get(5).db()?)?),
        deadline: row
            .get::<_, Option<i64>>(31)
            .db()?
            .map(|d| to_u64("steps.deadline_ms", d).map(Span::from_millis))
            .transpose()?,
        max_attempts: to_u32("steps.max_attempts", row.get(6).db()?)?,
        backoff: Backoff {
            initial: Span::from_millis(to_u64("steps.backoff_initial_ms", row.get(7).db()?)?),
            factor: row.get(8).db()?,
            max: Span::from_millis(to_u64("steps.backoff_max_ms", row.get(9).db()?)?),
        },
        backoff_formula: formula_from_column(formula)?,
        compensate: compensate
            .map(|c| parse_json::<CompensateSpec>("steps.compensate", &c))
            .transpose()?,
        http: http
            .map(|h| parse_json::<HttpTarget>("steps.http", &h))
            .transpose()?,
        state: StepState::parse(&state).ok_or_else(|| corrupt("steps.state", &state))?,
        attempt: to_u32("steps.attempt", row.get(12).db()?)?,
        failures: to_u32("steps.failures", row.get(13).db()?)?,
        lease_id: lease_id
            .map(|l| parse_id::<LeaseId>("steps.lease_id", &l))
            .transpose()?,
        worker: row.get(15).db()?,
        created_at: Timestamp::from_millis(row.get(16).db()?),
        ready_at: ts(row.get(17).db()?),
        started_at: ts(row.get(18).db()?),
        finished_at: ts(row.get(19).db()?),
        lease_expires_at: ts(row.get(20).db()?),
        attempt_ends_at: ts(row.get(32).db()?),
        next_attempt_at: ts(row.get(21).db()?),
        result: result
            .map(|r| parse_json::<Value>("steps.result", &r))
            .transpose()?,
        last_error: row.get(23).db()?,
        budget_from: to_u32("steps.budget_from", row.get(24).db()?)?,
        comp_phase: comp_phase
            .map(|p| CompPhase::parse(&p).ok_or_else(|| corrupt("steps.comp_phase", &p)))
            .transpose()?,
        comp_attempts: to_u32("steps.comp_attempts", row.get(26).db()?)?,
        comp_failures: to_u32("steps.comp_failures", row.get(27).db()?)?,
        comp_budget_from: to_u32("steps.comp_budget_from", row.get(28).db()?)?,
        progress: progress
            .map(|p| parse_json::<Value>("steps.progress", &p))
            .transpose()?,
        progress_at: ts(row.get(34).db()?),
        progress_events: row.get::<_, i64>(35).db()? != 0,
    };
    Ok((idx, step))
}

/// Loads a job with its steps, in index order.
pub(super) fn load_job(conn: &Connection, id: JobId) -> Result<Option<Job>> {
    Ok(load_shared(conn, id)?.map(Rc::unwrap_or_clone))
}

/// [`load_job`] for a caller that only reads the job: on the writer it is the cached job itself,
/// not a copy.
pub(super) fn load_shared(conn: &Connection, id: JobId) -> Result<Option<Rc<Job>>> {
    if let Some(job) = super::written::get(id) {
        debug_assert_eq!(
            read_job(conn, id)?.map(|(job, _)| job).as_ref(),
            Some(&*job),
            "the writer's cached job differs from the database"
        );
        return Ok(Some(job));
    }
    let Some((job, last_event_seq)) = read_job(conn, id)? else {
        return Ok(None);
    };
    let job = Rc::new(job);
    super::written::remember_loaded(&job, last_event_seq);
    Ok(Some(job))
}

/// The job's `last_event_seq` (the number of its newest event): the writer's cached count, or
/// else the newer of the row's and the history's.
pub(super) fn last_event_seq(conn: &Connection, id: JobId) -> Result<i64> {
    let stored = || -> Result<i64> {
        conn.prepare_cached(&format!(
            "SELECT MAX(last_event_seq, COALESCE(({NEWEST_SEQ_SQL}), 0), \
                 COALESCE(({NEWEST_LEASE_SEQ_SQL}), 0)) FROM jobs WHERE id = ?1"
        ))
        .db()?
        .query_row([job_id_text(id)], |r| r.get(0))
        .optional()
        .db()?
        .ok_or(Error::JobNotFound(id))
    };
    match super::written::last_event_seq(id) {
        Some(cached) => {
            debug_assert_eq!(
                stored()?,
                cached,
                "the writer's cached event count is stale"
            );
            Ok(cached)
        }
        None => stored(),
    }
}

/// Reads and decodes a job and its steps from the database (see [`load_job`]), with the job's
/// `last_event_seq`. The row's `last_event_seq` and `updated_at` are as of the last write of the
/// row: a transition that changed nothing else appended history entries without writing it
/// (see `row_writes::update_job`), and a claim that only leased work kept its entry in the step
/// row. So both are taken from the newest entry, of the history rows or the step rows, when it
/// is newer (trimming always keeps it).
fn read_job(conn: &Connection, id: JobId) -> Result<Option<(Job, i64)>> {
    let id_text = job_id_text(id);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS}, last_event_seq, ({NEWEST_SEQ_SQL}), ({NEWEST_AT_SQL}) \
             FROM jobs WHERE id = ?1"
        ))
        .db()?;
    let mut rows = stmt.query([&id_text]).db()?;
    let Some(row) = rows.next().db()? else {
        return Ok(None);
    };
    let mut job = job_from_row(row)?;
    let n = row.as_ref().column_count();
    let mut last_event_seq: i64 = row.get(n - 3).db()?;
    let mut newest = newest_entry(row, n - 2)?;
    drop(rows);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {STEP_COLUMNS}, lease_entry_seq, lease_entry ->> '$[0].at' \
             FROM steps WHERE job_id = ?1 ORDER BY idx"
        ))
        .db()?;
    let mut rows = stmt.query([&id_text]).db()?;
    let mut steps_newest = None;
    while let Some(row) = rows.next().db()? {
        let (idx, step) = step_from_row(row)?;
        crate::decide::push_step(&mut job, idx, step)?;
        steps_newest = steps_newest.max(newest_entry(row, STEP_COLUMN_COUNT)?);
    }
    newest = newest.max(steps_newest);
    if let Some((seq, at)) = newest {
        job.updated_at = job.updated_at.max(Timestamp::from_millis(at));
        last_event_seq = last_event_seq.max(seq);
    }
    Ok(Some((crate::decide::loaded(job)?, last_event_seq)))
}

/// The number and time of an entry read as two columns from `first` on, `None` when absent.
fn newest_entry(row: &rusqlite::Row<'_>, first: usize) -> Result<Option<(i64, i64)>> {
    match (row.get(first).db()?, row.get(first + 1).db()?) {
        (Some(seq), Some(at)) => Ok(Some((seq, at))),
        _ => Ok(None),
    }
}

/// Keeps a lease taken off its step (see [`crate::decide::retired_leases`]).
pub(super) fn insert_retired_lease(conn: &Connection, lease: &LeaseRef) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO leases (lease_id, job_id, step, attempt) VALUES (?1, ?2, ?3, ?4)",
    )
    .db()?
    .execute(params![
        lease.lease_id.0.to_string(),
        job_id_text(lease.job_id),
        lease.step as i64,
        lease.attempt,
    ])
    .db()?;
    Ok(())
}

/// Resolves a lease id to its attempt: the step that names it as its latest lease, else the
/// leases kept when they were taken off their steps.
pub(super) fn find_lease(conn: &Connection, lease_id: LeaseId) -> Result<Option<LeaseRef>> {
    if let Some(found) = super::written::lease(lease_id) {
        debug_assert_eq!(
            read_lease(conn, lease_id)?,
            Some(found),
            "the writer's cache resolves a lease differently from the database"
        );
        return Ok(Some(found));
    }
    read_lease(conn, lease_id)
}

/// [`find_lease`] from the database: the step that holds the lease, else the lease's record
/// once retired.
fn read_lease(conn: &Connection, lease_id: LeaseId) -> Result<Option<LeaseRef>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT job_id, idx, attempt, lease_id FROM steps WHERE lease_id = ?1 \
             UNION ALL SELECT job_id, step, attempt, lease_id FROM leases WHERE lease_id = ?1 \
             LIMIT 1",
        )
        .db()?;
    let mut rows = stmt.query([lease_id.0.to_string()]).db()?;
    match rows.next().db()? {
        Some(row) => lease_ref_from_row(row),
        None => Ok(None),
    }
}

/// Decodes `(job_id, idx, attempt, lease_id)` as a lease reference; `None` when the step has no
/// lease id recorded (which the writer never leaves, but a bad row must not stop a sweep).
pub(super) fn lease_ref_from_row(row: &Row<'_>) -> Result<Option<LeaseRef>> {
    let job_id: String = row.get(0).db()?;
    let step: i64 = row.get(1).db()?;
    let attempt: i64 = row.get(2).db()?;
    let lease_id: Option<String> = row.get(3).db()?;
    let Some(lease_id) = lease_id else {
        return Ok(None);
    };
    Ok(Some(LeaseRef {
        lease_id: parse_id("steps.lease_id", &lease_id)?,
        job_id: parse_id("steps.job_id", &job_id)?,
        step: usize::try_from(step).map_err(|_| corrupt("steps.idx", step))?,
        attempt: to_u32("steps.attempt", attempt)?,
    }))
}

/// Records the deliveries (alerts, callbacks) a transition calls for, as of `now`. A delivery
/// whose idempotency key is already recorded is left as it is, so persisting the same effect
/// twice never sends it twice.
pub(super) fn insert_deliveries(conn: &Connection, t: &Transition, now: Timestamp) -> Result<()> {
    if !t.effects.iter().any(|e| e.is_durable()) {
        return Ok(());
    }
    let mut insert = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO deliveries \
             (kind, job_id, url, idempotency_key, body, attempts, created_at, next_attempt_at, dead) \
             VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, ?6, 0)",
        )
        .db()?;
    for out in overseer_core::outbox::outgoing(t, now) {
        insert
            .execute(params![
                out.kind.as_str(),
                job_id_text(t.job.id),
                out.url,
                out.idempotency_key,
                json_text(&out.body),
                now.as_millis(),
            ])
            .db()?;
    }
    Ok(())
}

fn delivery_from_row(row: &Row<'_>) -> Result<Delivery> {
    let kind: String = row.get(1).db()?;
    let job_id: String = row.get(2).db()?;
    let body: String = row.get(5).db()?;
    Ok(Delivery {
        id: row.get(0).db()?,
        kind: DeliveryKind::parse(&kind).ok_or_else(|| corrupt("deliveries.kind", &kind))?,
        job_id: parse_id("deliveries.job_id", &job_id)?,
        url: row.get(3).db()?,
        idempotency_key: row.get(4).db()?,
        body: parse_json("deliveries.body", &body)?,
        attempts: to_u32("deliveries.attempts", row.get(6).db()?)?,
        created_at: Timestamp::from_millis(row.get(7).db()?),
        next_attempt_at: Timestamp::from_millis(row.get(8).db()?),
        last_error: row.get(9).db()?,
    })
}

/// Live deliveries due at `now`, the longest waiting first. A row that does not decode is logged
/// and passed over, so it cannot hold back every delivery behind it.
pub(super) fn deliveries_due(
    conn: &Connection,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Delivery>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, kind, job_id, url, idempotency_key, body, attempts, created_at, \
             next_attempt_at, last_error FROM deliveries INDEXED BY deliveries_due \
             WHERE dead = 0 AND delivered_at IS NULL AND next_attempt_at <= ?1 \
             ORDER BY next_attempt_at, id LIMIT ?2",
        )
        .db()?;
    let mut rows = stmt
        .query(params![now.as_millis(), limit_param(limit)])
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        match delivery_from_row(row) {
            Ok(delivery) => out.push(delivery),
            Err(e) => tracing::error!(error = %e, "skipping an unreadable delivery"),
        }
    }
    Ok(out)
}

/// Applies a delivery attempt's outcome. An id that is gone or already delivered (another node
/// delivered it first) changes nothing: the outcome no longer matters. A delivery also prunes a
/// few rows delivered longer ago than `DELIVERED_KEPT`, so kept rows do not pile up.
pub(super) fn delivery_update(conn: &Connection, id: i64, outcome: &DeliveryOutcome) -> Result<()> {
    match outcome {
        DeliveryOutcome::Delivered { at } => {
            conn.prepare_cached(
                "UPDATE deliveries SET attempts = attempts + 1, delivered_at = ?2, \
                 last_error = NULL WHERE id = ?1 AND delivered_at IS NULL AND dead = 0",
            )
            .db()?
            .execute(params![id, at.as_millis()])
            .db()?;
            let before = at.as_millis() - crate::DELIVERED_KEPT.as_millis_i64();
            conn.prepare_cached(
                "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries \
                 INDEXED BY deliveries_delivered WHERE delivered_at < ?1 LIMIT 16)",
            )
            .db()?
            .execute([before])
        }
        DeliveryOutcome::Retry {
            next_attempt_at,
            error,
        } => conn
            .prepare_cached(
                "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = ?2, \
                 last_error = ?3 WHERE id = ?1 AND delivered_at IS NULL",
            )
            .db()?
            .execute(params![id, next_attempt_at.as_millis(), error]),
        DeliveryOutcome::GiveUp { error } => conn
            .prepare_cached(
                "UPDATE deliveries SET attempts = attempts + 1, dead = 1, last_error = ?2 \
                 WHERE id = ?1 AND delivered_at IS NULL",
            )
            .db()?
            .execute(params![id, error]),
    }
    .db()?;
    Ok(())
}

/// The newest `limit` alert deliveries, whatever became of them.
pub(super) fn alerts_recent(conn: &Connection, limit: usize) -> Result<Vec<DeliveryRecord>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, kind, job_id, url, idempotency_key, body, attempts, created_at, \
             next_attempt_at, last_error, delivered_at, dead FROM deliveries \
             INDEXED BY deliveries_kind WHERE kind = 'alert' ORDER BY id DESC LIMIT ?1",
        )
        .db()?;
    let mut rows = stmt.query([limit_param(limit)]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let delivered_at: Option<i64> = row.get(10).db()?;
        let dead: i64 = row.get(11).db()?;
        out.push(DeliveryRecord {
            delivery: delivery_from_row(row)?,
            delivered_at: delivered_at.map(Timestamp::from_millis),
            dead: dead != 0,
        });
    }
    Ok(out)
}

/// Deliveries waiting (live) and given up (dead).
pub(super) fn deliveries_counts(conn: &Connection) -> Result<DeliveryCounts> {
    let (waiting, dead): (i64, i64) = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(dead = 0), 0), COALESCE(SUM(dead <> 0), 0) FROM deliveries \
             WHERE delivered_at IS NULL",
        )
        .db()?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .db()?;
    Ok(DeliveryCounts {
        waiting: to_u64("deliveries waiting", waiting)?,
        dead: to_u64("deliveries dead", dead)?,
    })
}

/// SQLite takes `LIMIT` as a signed integer; anything past `i64::MAX` means no limit anyway.
pub(super) fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

pub(super) fn count_param(what: &str, v: i64) -> Result<u64> {
    to_u64(what, v)
}
