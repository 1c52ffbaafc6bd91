//! Reading and writing jobs, steps, events, leases and deliveries as rows.
//!
//! Everything read back is checked: a value that does not decode is [`Error::Corrupt`], never a
//! panic, so one bad row cannot take a node down. Every statement is prepared once per pooled
//! connection (deadpool's statement cache).

use std::collections::BTreeMap;

use super::tx::Transaction;
use overseer_core::backoff::{Backoff, Formula};
use overseer_core::job::JobRetry;
use overseer_core::outbox::DeliveryKind;
use overseer_core::spec::{CompensateSpec, OnFailure};
use overseer_core::{
    CompPhase, DesiredState, Event, Job, JobId, JobState, LeaseId, Span, Step, StepState,
    Timestamp, Transition,
};
use serde_json::Value;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{Failure, Res};
use crate::{Delivery, DeliveryOutcome, DeliveryRecord, Error, LeaseRef};

pub(super) type Params<'a> = [&'a (dyn ToSql + Sync)];

// Every statement goes through `Transaction::in_turn`, so statements sent together run in the
// order they were issued.

pub(super) async fn query(tx: &Transaction<'_>, sql: &str, params: &Params<'_>) -> Res<Vec<Row>> {
    let send = |stmt| async move { tx.query(&stmt, params).await };
    Ok(tx.in_turn(sql, send).await?)
}

/// `INSERT INTO table (c1, c2, …) SELECT unnest($1::t1[]), unnest($2::t2[]), …` for each
/// `(column, type)`: a batch's rows sent as one array per column, in that order (see
/// [`zipped`]), inserted in array order.
pub(super) fn zipped_insert(table: &str, columns: &[(&str, &str)]) -> String {
    let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
    let values: Vec<(usize, &str, &str)> = columns
        .iter()
        .enumerate()
        .map(|(i, (_, ty))| (i + 1, *ty, ""))
        .collect();
    format!(
        "INSERT INTO {table} ({}) {}",
        names.join(", "),
        zipped(&values)
    )
}

/// `SELECT unnest($n::type[]) AS name, …` for each `(n, type, name)` (no alias where the name
/// is empty): rows sent as one array per column, zipped.
///
/// Unnested in the select list, the rows stream to whatever takes them, in array order. The
/// same arrays unnested in `FROM` are a function scan, which first copies every row into a
/// tuple store (and an insert's `WITH ORDINALITY … ORDER BY` then sorted them again): those
/// copies were about a fifth of PostgreSQL's time in a batch submit's profile (BENCHMARKS.md,
/// forty-third session). The select list's functions run in lockstep; every array of one
/// statement has one element per row.
pub(super) fn zipped(columns: &[(usize, &str, &str)]) -> String {
    let columns: Vec<String> = columns
        .iter()
        .map(|(n, ty, name)| match name.is_empty() {
            true => format!("unnest(${n}::{ty}[])"),
            false => format!("unnest(${n}::{ty}[]) AS {name}"),
        })
        .collect();
    format!("SELECT {}", columns.join(", "))
}

/// Looks up `ids` with `one` (a plain `$1`) when there is a single id, else with `many` (the ids
/// as one array). A connection keeps the generic plan of the one-id statement; the array form
/// is planned on every call (see `load_jobs`).
pub(super) async fn query_ids(
    tx: &Transaction<'_>,
    ids: &[Uuid],
    one: &str,
    many: &str,
) -> Res<Vec<Row>> {
    match ids {
        [only] => query(tx, one, &[only]).await,
        _ => query(tx, many, &[&ids]).await,
    }
}

pub(super) async fn query_opt(
    tx: &Transaction<'_>,
    sql: &str,
    params: &Params<'_>,
) -> Res<Option<Row>> {
    let send = |stmt| async move { tx.query_opt(&stmt, params).await };
    Ok(tx.in_turn(sql, send).await?)
}

pub(super) async fn query_one(tx: &Transaction<'_>, sql: &str, params: &Params<'_>) -> Res<Row> {
    let send = |stmt| async move { tx.query_one(&stmt, params).await };
    Ok(tx.in_turn(sql, send).await?)
}

pub(super) async fn execute(tx: &Transaction<'_>, sql: &str, params: &Params<'_>) -> Res<u64> {
    let send = |stmt| async move { tx.execute(&stmt, params).await };
    Ok(tx.in_turn(sql, send).await?)
}

pub(super) fn corrupt(what: &str, detail: impl std::fmt::Display) -> Failure {
    Failure::Store(Error::Corrupt(format!("{what}: {detail}")))
}

/// Column `idx` of `row`, named `what` in the error when it does not decode.
pub(super) fn get<'a, T: FromSql<'a>>(row: &'a Row, idx: usize, what: &str) -> Res<T> {
    row.try_get(idx).map_err(|e| corrupt(what, e))
}

fn ts(v: Option<i64>) -> Option<Timestamp> {
    v.map(Timestamp::from_millis)
}

pub(super) fn ms(t: Option<Timestamp>) -> Option<i64> {
    t.map(Timestamp::as_millis)
}

pub(super) fn to_u32(what: &str, v: i64) -> Res<u32> {
    u32::try_from(v).map_err(|_| corrupt(what, format!("{v} is out of range")))
}

pub(super) fn to_u64(what: &str, v: i64) -> Res<u64> {
    u64::try_from(v).map_err(|_| corrupt(what, format!("{v} is out of range")))
}

pub(super) fn to_usize(what: &str, v: i32) -> Res<usize> {
    usize::try_from(v).map_err(|_| corrupt(what, format!("{v} is out of range")))
}

pub(super) fn json_text(v: &Value) -> String {
    // Encoding a `Value` cannot fail: its map keys are strings and it holds no non-finite floats.
    serde_json::to_string(v).unwrap_or_else(|_| "null".to_string())
}

fn parse_json<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Res<T> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

/// Free text as a `text` column can hold it. PostgreSQL refuses the NUL character in text, which
/// the core lets through in a few places (label values, an agent's error message, a worker's
/// name); it is stored as U+FFFD instead, so such a write is kept rather than refused forever.
/// JSON columns need nothing: serde_json writes NUL as `\u0000`.
pub(super) fn text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// A step index as the `integer` column holds it.
pub(super) fn idx_param(idx: usize) -> Res<i32> {
    i32::try_from(idx).map_err(|_| corrupt("steps.idx", format!("{idx} is out of range")))
}

/// `LIMIT` takes a `bigint`; anything past `i64::MAX` means no limit anyway.
pub(super) fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// The job columns every read decodes, as a macro so statements can be built with `concat!`.
macro_rules! job_columns {
    () => {
        "id, idempotency_key, fingerprint, labels, priority, run_at, ordering_key, \
         callback_url, on_failure, state, desired_state, created_at, updated_at, finished_at, \
         blocked_reason, retention_ms, submitted_by, deadline, round, job_retry, rerun_of, \
         rerun_by, unlogged_entries"
    };
}

/// Where [`job_columns`] puts `unlogged_entries`, read beside the job (see `super::unlogged`).
const JOB_UNLOGGED: usize = 22;

/// The step columns every read decodes (see [`job_columns`]).
macro_rules! step_columns {
    () => {
        "idx, name, agent, payload, depends_on, timeout_ms, max_attempts, \
         backoff_initial_ms, backoff_factor, backoff_max_ms, compensate, state, attempt, failures, \
         lease_id, worker, created_at, ready_at, started_at, finished_at, lease_expires_at, \
         next_attempt_at, result, last_error, budget_from, comp_phase, comp_attempts, \
         comp_failures, comp_budget_from, backoff_formula, http, deadline_ms, attempt_ends_at, \
         progress, progress_at, progress_events, unlogged_entry"
    };
}

fn job_from_row(row: &Row) -> Res<Job> {
    let labels: String = get(row, 3, "jobs.labels")?;
    let on_failure: String = get(row, 8, "jobs.on_failure")?;
    let state: String = get(row, 9, "jobs.state")?;
    let desired: String = get(row, 10, "jobs.desired_state")?;
    Ok(Job {
        id: JobId(get(row, 0, "jobs.id")?),
        idempotency_key: get(row, 1, "jobs.idempotency_key")?,
        fingerprint: get(row, 2, "jobs.fingerprint")?,
        labels: parse_json::<BTreeMap<String, String>>("jobs.labels", &labels)?,
        priority: get(row, 4, "jobs.priority")?,
        run_at: ts(get(row, 5, "jobs.run_at")?),
        ordering_key: get(row, 6, "jobs.ordering_key")?,
        callback_url: get(row, 7, "jobs.callback_url")?,
        on_failure: OnFailure::parse(&on_failure)
            .ok_or_else(|| corrupt("jobs.on_failure", &on_failure))?,
        state: JobState::parse(&state).ok_or_else(|| corrupt("jobs.state", &state))?,
        desired_state: DesiredState::parse(&desired)
            .ok_or_else(|| corrupt("jobs.desired_state", &desired))?,
        created_at: Timestamp::from_millis(get(row, 11, "jobs.created_at")?),
        updated_at: Timestamp::from_millis(get(row, 12, "jobs.updated_at")?),
        finished_at: ts(get(row, 13, "jobs.finished_at")?),
        blocked_reason: get(row, 14, "jobs.blocked_reason")?,
        retention: get::<Option<i64>>(row, 15, "jobs.retention_ms")?
            .and_then(|ms| u64::try_from(ms).ok())
            .map(overseer_core::Span::from_millis),
        submitted_by: get(row, 16, "jobs.submitted_by")?,
        deadline: ts(get(row, 17, "jobs.deadline")?),
        round: to_u32("jobs.round", get(row, 18, "jobs.round")?)?,
        retry: get::<Option<String>>(row, 19, "jobs.job_retry")?
            .map(|r| parse_json::<JobRetry>("jobs.job_retry", &r))
            .transpose()?,
        rerun_of: get::<Option<Uuid>>(row, 20, "jobs.rerun_of")?.map(JobId),
        rerun_by: get::<Option<Uuid>>(row, 21, "jobs.rerun_by")?.map(JobId),
        steps: Vec::new(),
    })
}

/// A step row as read: its index (the caller checks the steps are contiguous), the step, and its
/// entry waiting to be logged, if any (see `super::unlogged`).
struct StepRow {
    idx: i32,
    step: Step,
    unlogged: Option<String>,
}

/// Decodes a step row.
fn step_from_row(row: &Row) -> Res<StepRow> {
    let idx: i32 = get(row, 0, "steps.idx")?;
    let payload: String = get(row, 3, "steps.payload")?;
    let depends_on: String = get(row, 4, "steps.depends_on")?;
    let compensate: Option<String> = get(row, 10, "steps.compensate")?;
    let state: String = get(row, 11, "steps.state")?;
    let lease_id: Option<Uuid> = get(row, 14, "steps.lease_id")?;
    let result: Option<String> = get(row, 22, "steps.result")?;
    let comp_phase: Option<String> = get(row, 25, "steps.comp_phase")?;
    let formula: Option<String> = get(row, 29, "steps.backoff_formula")?;
    let http: Option<String> = get(row, 30, "steps.http")?;
    let progress: Option<String> = get(row, 33, "steps.progress")?;
    let step = Step {
        name: get(row, 1, "steps.name")?,
        agent: get(row, 2, "steps.agent")?,
        payload: parse_json("steps.payload", &payload)?,
        depends_on: parse_json("steps.depends_on", &depends_on)?,
        timeout: Span::from_millis(to_u64(
            "steps.timeout_ms",
            get(row, 5, "steps.timeout_ms")?,
        )?),
        deadline: get::<Option<i64>>(row, 31, "steps.deadline_ms")?
            .map(|d| to_u64("steps.deadline_ms", d).map(Span::from_millis))
            .transpose()?,
        max_attempts: to_u32("steps.max_attempts", get(row, 6, "steps.max_attempts")?)?,
        backoff: Backoff {
            initial: Span::from_millis(to_u64(
                "steps.backoff_initial_ms",
                get(row, 7, "steps.backoff_initial_ms")?,
            )?),
            factor: get(row, 8, "steps.backoff_factor")?,
            max: Span::from_millis(to_u64(
                "steps.backoff_max_ms",
                get(row, 9, "steps.backoff_max_ms")?,
            )?),
        },
        backoff_formula: match formula {
            None => Formula::Exponential,
            Some(f) => Formula::parse(&f).ok_or_else(|| corrupt("steps.backoff_formula", &f))?,
        },
        compensate: compensate
            .map(|c| parse_json::<CompensateSpec>("steps.compensate", &c))
            .transpose()?,
        http: http
            .map(|h| parse_json::<overseer_core::push::HttpTarget>("steps.http", &h))
            .transpose()?,
        state: StepState::parse(&state).ok_or_else(|| corrupt("steps.state", &state))?,
        attempt: to_u32("steps.attempt", get(row, 12, "steps.attempt")?)?,
        failures: to_u32("steps.failures", get(row, 13, "steps.failures")?)?,
        lease_id: lease_id.map(LeaseId),
        worker: get(row, 15, "steps.worker")?,
        created_at: Timestamp::from_millis(get(row, 16, "steps.created_at")?),
        ready_at: ts(get(row, 17, "steps.ready_at")?),
        started_at: ts(get(row, 18, "steps.started_at")?),
        finished_at: ts(get(row, 19, "steps.finished_at")?),
        lease_expires_at: ts(get(row, 20, "steps.lease_expires_at")?),
        attempt_ends_at: ts(get(row, 32, "steps.attempt_ends_at")?),
        next_attempt_at: ts(get(row, 21, "steps.next_attempt_at")?),
        result: result
            .map(|r| parse_json::<Value>("steps.result", &r))
            .transpose()?,
        last_error: get(row, 23, "steps.last_error")?,
        budget_from: to_u32("steps.budget_from", get(row, 24, "steps.budget_from")?)?,
        comp_phase: comp_phase
            .map(|p| CompPhase::parse(&p).ok_or_else(|| corrupt("steps.comp_phase", &p)))
            .transpose()?,
        comp_attempts: to_u32("steps.comp_attempts", get(row, 26, "steps.comp_attempts")?)?,
        comp_failures: to_u32("steps.comp_failures", get(row, 27, "steps.comp_failures")?)?,
        comp_budget_from: to_u32(
            "steps.comp_budget_from",
            get(row, 28, "steps.comp_budget_from")?,
        )?,
        progress: progress
            .map(|p| parse_json::<Value>("steps.progress", &p))
            .transpose()?,
        progress_at: ts(get(row, 34, "steps.progress_at")?),
        progress_events: get(row, 35, "steps.progress_events")?,
    };
    Ok(StepRow {
        idx,
        step,
        unlogged: get(row, 36, "steps.unlogged_entry")?,
    })
}

/// How a job row is read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Lock {
    /// A plain read.
    None,
    /// `FOR UPDATE`: waits for whoever holds the job.
    Update,
}

/// Loads a job with its steps, in index order, locking its row as asked. Under a lock the steps
/// are read after the lock is granted, so (read committed) they are the latest committed ones.
pub(super) async fn load_job(tx: &Transaction<'_>, id: JobId, lock: Lock) -> Res<Option<Job>> {
    let sql = match lock {
        Lock::None => JOB_BY_ID_SQL,
        Lock::Update => concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE id = $1 FOR UPDATE"
        ),
    };
    // The statements are sent at once. The server runs them in order, so the job and its steps
    // are read after the job's lock is granted (read committed: a fresh snapshot per statement).
    let lock = async {
        if lock == Lock::Update {
            query(tx, super::jobs::LOCK_ONE_JOB_SQL, &[&id.0]).await?;
        }
        Ok(())
    };
    let (_, row, rows) =
        futures::try_join!(lock, async { query_opt(tx, sql, &[&id.0]).await }, async {
            query(tx, STEPS_OF_JOB, &[&id.0]).await
        },)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut job = job_from_row(&row)?;
    let job_waiting: Option<&str> = get(&row, JOB_UNLOGGED, "jobs.unlogged_entries")?;
    let mut unlogged = Vec::new();
    for row in &rows {
        let StepRow {
            idx,
            step,
            unlogged: text,
        } = step_from_row(row)?;
        unlogged.extend(text.map(|t| (job.steps.len(), t)));
        crate::decide::push_step(&mut job, i64::from(idx), step)?;
    }
    super::unlogged::loaded(tx, &mut job, job_waiting, unlogged)?;
    Ok(Some(crate::decide::loaded(job)?))
}

pub(super) const JOB_BY_ID_SQL: &str =
    concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1");

pub(super) const STEPS_OF_JOB: &str = concat!(
    "SELECT ",
    step_columns!(),
    " FROM steps WHERE job_id = $1 ORDER BY idx"
);

pub(super) const JOBS_BY_IDS_SQL: &str = concat!(
    "SELECT j.* FROM unnest($1::uuid[]) AS wanted (id) \
     CROSS JOIN LATERAL (SELECT ",
    job_columns!(),
    " FROM jobs WHERE jobs.id = wanted.id OFFSET 0) j"
);

const STEPS_OF_JOBS_SQL: &str = concat!(
    "SELECT s.* FROM unnest($1::uuid[]) WITH ORDINALITY AS wanted (id, n) \
     CROSS JOIN LATERAL (SELECT ",
    step_columns!(),
    ", job_id FROM steps WHERE steps.job_id = wanted.id ORDER BY idx OFFSET 0) s \
     ORDER BY wanted.n, s.idx"
);

/// Jobs with the given ids, in that order (ids with no job are left out): two statements
/// whatever their number, sent together.
///
/// One job is loaded with the statements of plain parameters (`load_job`): the `unnest` form
/// is planned anew on every call (its generic plan, costed for an array of unknown length,
/// never looks as cheap as the custom plan for one id), and the claims and reports of an idle
/// system load one job at a time — `pg_stat_statements` counted 45 % of all statement time as
/// planning in a `latency` run, most of it these lookups (BENCHMARKS.md, twelfth session).
pub(super) async fn load_jobs(tx: &Transaction<'_>, ids: &[JobId]) -> Res<Vec<Job>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut uuids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
    uuids.sort_unstable();
    uuids.dedup();
    if let [only] = uuids[..] {
        return Ok(load_job(tx, JobId(only), Lock::None)
            .await?
            .into_iter()
            .collect());
    }
    // Sent together, run in order: each statement a fresh snapshot, as if sent one by one.
    let params: &Params<'_> = &[&uuids];
    let (rows, step_rows) = futures::try_join!(
        query(
            tx,
            // One primary-key lookup per job, as for the steps below: with `id = ANY($1)`, the
            // generic plan a connection cached while `jobs` was nearly empty read the whole
            // table for every claim and report until autovacuum first analyzed it.
            JOBS_BY_IDS_SQL,
            params,
        ),
        query(
            tx,
            // One primary-key range per job, whatever the planner's statistics say: with
            // `job_id = ANY($1)` and none yet (a fresh table, before autovacuum analyzed it) it
            // chose a parallel scan of the whole table, 50 ms per claim. `OFFSET 0` keeps the
            // subquery from being flattened into a hash join, so each job is one index range.
            STEPS_OF_JOBS_SQL,
            params,
        ),
    )?;
    type Loading<'r> = (Job, Option<&'r str>, Vec<(usize, String)>);
    let mut jobs: std::collections::HashMap<Uuid, Loading> = std::collections::HashMap::new();
    for row in &rows {
        let job = job_from_row(row)?;
        let job_waiting = get(row, JOB_UNLOGGED, "jobs.unlogged_entries")?;
        jobs.insert(job.id.0, (job, job_waiting, Vec::new()));
    }
    for row in &step_rows {
        // `job_id` comes after the step's own columns.
        let job_id: Uuid = get(row, row.len() - 1, "steps.job_id")?;
        let StepRow {
            idx,
            step,
            unlogged,
        } = step_from_row(row)?;
        let Some((job, _, waiting)) = jobs.get_mut(&job_id) else {
            continue;
        };
        if usize::try_from(idx).ok() != Some(job.steps.len()) {
            return Err(corrupt(
                "steps.idx",
                format!("job {job_id} has step index {idx} out of order"),
            ));
        }
        waiting.extend(unlogged.map(|t| (job.steps.len(), t)));
        job.steps.push(step);
    }
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some((mut job, job_waiting, waiting)) = jobs.remove(&id.0) {
            if job.steps.is_empty() {
                return Err(corrupt("steps", format!("job {id} has no steps")));
            }
            super::unlogged::loaded(tx, &mut job, job_waiting, waiting)?;
            out.push(job);
        }
    }
    Ok(out)
}

/// Up to `limit` entries of job `id` numbered after `after_seq`, oldest first, of those its
/// history keeps (the newest `keep`; see `crate::history`): from the row that holds the first
/// entry asked for, then the entries waiting to be logged (see `super::unlogged`), numbered after
/// the job's `last_event_seq` in their order. Trimming leaves a row holding entries on both sides
/// of its cut, so entries up to the job's newest number less `keep` are left out here.
pub(super) async fn load_events(
    tx: &Transaction<'_>,
    id: JobId,
    after_seq: i64,
    limit: usize,
    keep: usize,
) -> Res<Vec<Event>> {
    let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
    // Every row holds at least one entry, and only the first row may hold none of those asked.
    let rows = limit_param(limit.saturating_add(1));
    // A read sees one snapshot: the two statements agree.
    let (events, job): (&Params<'_>, &Params<'_>) = (&[&id.0, &after_seq, &rows, &keep], &[&id.0]);
    let (rows, waiting) = futures::try_join!(
        query(tx, LOAD_EVENTS_SQL, events),
        query(tx, WAITING_ENTRIES_SQL, job),
    )?;
    let mut out = Vec::with_capacity(limit.min(rows.len() * 2));
    for row in &rows {
        let after: i64 = get(row, 7, "events.after")?;
        out.extend(entries(row)?.into_iter().filter(|e| e.seq > after));
    }
    let mut last = 0;
    let mut in_steps = Vec::new();
    for row in &waiting {
        last = get(row, 0, "jobs.last_event_seq")?;
        if let Some(text) = get::<Option<&str>>(row, 1, "steps.unlogged_entry")? {
            in_steps.push(crate::history::unlogged_entry(text)?);
        }
    }
    in_steps.sort_by_key(|(n, _)| *n);
    let job_row = match waiting.first() {
        Some(row) => super::unlogged::of_job_row(get(row, 2, "jobs.unlogged_entries")?)?,
        None => Vec::new(),
    };
    let unlogged: Vec<_> = job_row
        .into_iter()
        .chain(in_steps.into_iter().map(|(_, e)| e))
        .collect();
    if out.len() >= limit {
        // The rows asked for were all there were not: what waits comes after more of them.
        out.truncate(limit);
        return Ok(out);
    }
    let newest = last + unlogged.len() as i64;
    let after = after_seq.max(newest - keep);
    out.extend(crate::history::numbered_from(last + 1, unlogged).filter(|e| e.seq > after));
    out.truncate(limit);
    Ok(out)
}

/// The rows of [`load_events`], each with the number its entries must be above: `$2`, or the
/// newest entry not kept when that is later (the newest entry counts those waiting).
const LOAD_EVENTS_SQL: &str = "\
WITH f AS (SELECT GREATEST($2::bigint, \
    (SELECT last_event_seq + COALESCE(json_array_length(unlogged_entries::json), 0) \
     FROM jobs WHERE id = $1) \
    + (SELECT count(*) FROM steps WHERE job_id = $1 AND unlogged_entry IS NOT NULL) \
    - $4::bigint) AS after) \
SELECT e.seq, e.at, e.kind, e.step, e.attempt, e.detail, e.more, f.after \
FROM f CROSS JOIN events e \
WHERE e.job_id = $1 AND e.seq >= COALESCE( \
  (SELECT max(seq) FROM events WHERE job_id = $1 AND seq <= f.after), f.after + 1) \
ORDER BY e.seq LIMIT $3";

/// The job's newest logged number, with each entry waiting to be logged in a step row (none: one
/// row with a `NULL` entry; no job: no row), and those waiting in the job row (in every row).
const WAITING_ENTRIES_SQL: &str = "\
SELECT j.last_event_seq, s.unlogged_entry, j.unlogged_entries FROM jobs j \
LEFT JOIN steps s ON s.job_id = j.id AND s.unlogged_entry IS NOT NULL \
WHERE j.id = $1";

/// The entries of one history row, numbered.
fn entries(row: &Row) -> Res<Vec<Event>> {
    let kind: &str = get(row, 2, "events.kind")?;
    let attempt: Option<i64> = get(row, 4, "events.attempt")?;
    let detail: Option<String> = get(row, 5, "events.detail")?;
    let more: Option<&str> = get(row, 6, "events.more")?;
    let first = Event {
        seq: get(row, 0, "events.seq")?,
        at: Timestamp::from_millis(get(row, 1, "events.at")?),
        kind: kind.parse().map_err(|e| corrupt("events.kind", e))?,
        step: get(row, 3, "events.step")?,
        attempt: attempt.map(|a| to_u32("events.attempt", a)).transpose()?,
        detail: detail
            .map(|d| parse_json::<Value>("events.detail", &d))
            .transpose()?,
    };
    Ok(crate::history::expand(first, more)?)
}

/// Decodes `(job_id, idx, attempt, lease_id)` as a lease reference; `None` when the step has no
/// lease id recorded (which the writer never leaves, but a bad row must not stop a sweep).
pub(super) fn lease_ref_from_row(row: &Row) -> Res<Option<LeaseRef>> {
    let lease_id: Option<Uuid> = get(row, 3, "steps.lease_id")?;
    let Some(lease_id) = lease_id else {
        return Ok(None);
    };
    Ok(Some(LeaseRef {
        lease_id: LeaseId(lease_id),
        job_id: JobId(get(row, 0, "steps.job_id")?),
        step: to_usize("steps.idx", get(row, 1, "steps.idx")?)?,
        attempt: to_u32("steps.attempt", get(row, 2, "steps.attempt")?)?,
    }))
}

/// Records the deliveries (alerts, callbacks) a transition calls for, as of `now`. A delivery
/// whose idempotency key is already recorded is left as it is, so persisting the same effect
/// twice never sends it twice.
pub(super) async fn insert_deliveries(
    tx: &Transaction<'_>,
    t: &Transition,
    now: Timestamp,
) -> Res<()> {
    if !t.effects.iter().any(|e| e.is_durable()) {
        return Ok(());
    }
    let outgoing = overseer_core::outbox::outgoing(t, now);
    let bodies: Vec<String> = outgoing.iter().map(|o| json_text(&o.body)).collect();
    let urls: Vec<_> = outgoing
        .iter()
        .map(|o| o.url.as_deref().map(text))
        .collect();
    futures::future::try_join_all(outgoing.iter().zip(&bodies).zip(&urls).map(
        |((out, body), url)| async move {
            execute(
                tx,
                "INSERT INTO deliveries \
                 (kind, job_id, url, idempotency_key, body, attempts, created_at, \
                  next_attempt_at, dead) \
                 VALUES ($1, $2, $3, $4, $5, 0, $6, $6, false) \
                 ON CONFLICT (idempotency_key) DO NOTHING",
                &[
                    &out.kind.as_str(),
                    &t.job.id.0,
                    url,
                    &out.idempotency_key,
                    body,
                    &now.as_millis(),
                ],
            )
            .await
        },
    ))
    .await?;
    Ok(())
}

fn delivery_from_row(row: &Row) -> Res<Delivery> {
    let kind: String = get(row, 1, "deliveries.kind")?;
    let body: String = get(row, 5, "deliveries.body")?;
    Ok(Delivery {
        id: get(row, 0, "deliveries.id")?,
        kind: DeliveryKind::parse(&kind).ok_or_else(|| corrupt("deliveries.kind", &kind))?,
        job_id: JobId(get(row, 2, "deliveries.job_id")?),
        url: get(row, 3, "deliveries.url")?,
        idempotency_key: get(row, 4, "deliveries.idempotency_key")?,
        body: parse_json("deliveries.body", &body)?,
        attempts: to_u32("deliveries.attempts", get(row, 6, "deliveries.attempts")?)?,
        created_at: Timestamp::from_millis(get(row, 7, "deliveries.created_at")?),
        next_attempt_at: Timestamp::from_millis(get(row, 8, "deliveries.next_attempt_at")?),
        last_error: get(row, 9, "deliveries.last_error")?,
    })
}

/// Live deliveries due at `now`, the longest waiting first. A row that does not decode is logged
/// and passed over, so it cannot hold back every delivery behind it.
pub(super) async fn deliveries_due(
    tx: &Transaction<'_>,
    now: Timestamp,
    limit: usize,
) -> Res<Vec<Delivery>> {
    let rows = query(
        tx,
        "SELECT id, kind, job_id, url, idempotency_key, body, attempts, created_at, \
         next_attempt_at, last_error FROM deliveries \
         WHERE NOT dead AND delivered_at IS NULL AND next_attempt_at <= $1 \
         ORDER BY next_attempt_at, id LIMIT $2",
        &[&now.as_millis(), &limit_param(limit)],
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
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
pub(super) async fn delivery_update(
    tx: &Transaction<'_>,
    id: i64,
    outcome: &DeliveryOutcome,
) -> Res<()> {
    match outcome {
        DeliveryOutcome::Delivered { at } => {
            execute(
                tx,
                "UPDATE deliveries SET attempts = attempts + 1, delivered_at = $2, \
                 last_error = NULL WHERE id = $1 AND delivered_at IS NULL AND NOT dead",
                &[&id, &at.as_millis()],
            )
            .await?;
            let before = at.as_millis() - crate::DELIVERED_KEPT.as_millis_i64();
            execute(
                tx,
                "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries \
                 WHERE delivered_at < $1 LIMIT 16)",
                &[&before],
            )
            .await?
        }
        DeliveryOutcome::Retry {
            next_attempt_at,
            error,
        } => {
            execute(
                tx,
                "UPDATE deliveries SET attempts = attempts + 1, next_attempt_at = $2, \
                 last_error = $3 WHERE id = $1 AND delivered_at IS NULL",
                &[&id, &next_attempt_at.as_millis(), &text(error)],
            )
            .await?
        }
        DeliveryOutcome::GiveUp { error } => {
            execute(
                tx,
                "UPDATE deliveries SET attempts = attempts + 1, dead = true, last_error = $2 \
                 WHERE id = $1 AND delivered_at IS NULL",
                &[&id, &text(error)],
            )
            .await?
        }
    };
    Ok(())
}

/// The newest `limit` alert deliveries, whatever became of them.
pub(super) async fn alerts_recent(tx: &Transaction<'_>, limit: usize) -> Res<Vec<DeliveryRecord>> {
    let rows = query(
        tx,
        "SELECT id, kind, job_id, url, idempotency_key, body, attempts, created_at, \
         next_attempt_at, last_error, delivered_at, dead FROM deliveries \
         WHERE kind = 'alert' ORDER BY id DESC LIMIT $1",
        &[&limit_param(limit)],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let delivered_at: Option<i64> = get(row, 10, "deliveries.delivered_at")?;
            Ok(DeliveryRecord {
                delivery: delivery_from_row(row)?,
                delivered_at: delivered_at.map(Timestamp::from_millis),
                dead: get(row, 11, "deliveries.dead")?,
            })
        })
        .collect()
}

/// Deliveries waiting (live) and given up (dead).
pub(super) async fn deliveries_counts(tx: &Transaction<'_>) -> Res<crate::DeliveryCounts> {
    let row = query_one(
        tx,
        "SELECT count(*) FILTER (WHERE NOT dead), count(*) FILTER (WHERE dead) FROM deliveries \
         WHERE delivered_at IS NULL",
        &[],
    )
    .await?;
    Ok(crate::DeliveryCounts {
        waiting: to_u64("deliveries waiting", get(&row, 0, "deliveries waiting")?)?,
        dead: to_u64("deliveries dead", get(&row, 1, "deliveries dead")?)?,
    })
}
