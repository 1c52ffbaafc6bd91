//! Writing job and step rows: a new step whole, and what a transition changed in a job or a
//! step. An update names only the columns that changed (SQLite rewrites an index entry for
//! every indexed column a `SET` names), builds the costly texts only for fields that differ,
//! and keeps its `UPDATE` text per set of changed columns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::OnceLock;

use overseer_core::backoff::Formula;
use overseer_core::job::PRIORITY_AGING;
use overseer_core::{CompPhase, Job, NewEvent};
use rusqlite::types::{ToSqlOutput, Value as SqlValue};
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{corrupt, job_id_text, ms, DbResult};
use crate::{Error, Result};

/// Everything a step write sets: the job's key and copied priority, the step's own columns, and
/// the columns derived from the step for the queries that find work (see schemas V2 and V3).
pub(super) const STEP_WRITE_COLUMNS: [&str; 41] = [
    "job_id",
    "priority",
    "idx",
    "name",
    "agent",
    "payload",
    "depends_on",
    "timeout_ms",
    "max_attempts",
    "backoff_initial_ms",
    "backoff_factor",
    "backoff_max_ms",
    "compensate",
    "state",
    "attempt",
    "failures",
    "lease_id",
    "worker",
    "created_at",
    "ready_at",
    "started_at",
    "finished_at",
    "lease_expires_at",
    "next_attempt_at",
    "result",
    "last_error",
    "budget_from",
    "comp_phase",
    "comp_attempts",
    "comp_failures",
    "comp_budget_from",
    "claim_agent",
    "lease_agent",
    "claim_rank",
    "backoff_formula",
    "http",
    "deadline_ms",
    "attempt_ends_at",
    "progress",
    "progress_at",
    "progress_events",
];

/// A plain `INSERT` over [`STEP_WRITE_COLUMNS`], built once so the placeholder numbering can
/// never drift from the column list.
pub(super) fn insert_step_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        format!(
            "INSERT INTO steps ({}) VALUES ({})",
            STEP_WRITE_COLUMNS.join(", "),
            placeholders(STEP_WRITE_COLUMNS.len())
        )
    })
}

/// [`insert_step_sql`] that overwrites the row when the step exists already.
fn step_upsert_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let updates: Vec<String> = STEP_WRITE_COLUMNS
            .iter()
            .filter(|c| !matches!(**c, "job_id" | "idx"))
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        format!(
            "{} ON CONFLICT (job_id, idx) DO UPDATE SET {}",
            insert_step_sql(),
            updates.join(", ")
        )
    })
}

/// `?1, ?2, … ?n`.
pub(super) fn placeholders(n: usize) -> String {
    let all: Vec<String> = (1..=n).map(|i| format!("?{i}")).collect();
    all.join(", ")
}

/// `steps.backoff_formula`: NULL for the exponential default (so rows written before schema V4,
/// and most rows since, say nothing), else the formula's name.
fn formula_column(f: Formula) -> Option<&'static str> {
    (f != Formula::Exponential).then(|| f.as_str())
}

/// Runs an `UPDATE` of one row, then reads one integer of that row back: `None` when no row
/// matched. Not `UPDATE … RETURNING`: SQLite runs that through a temporary table (opened,
/// filled and dropped on every execution) and a statement journal, which for these one-row
/// updates cost more than the update itself (in a drain's profile, about a third of a finishing
/// report's job update). The second statement finds the row in the page cache the update left it in.
pub(super) fn update_then_read(
    conn: &Connection,
    update: &str,
    update_params: impl rusqlite::Params,
    read: &str,
    read_params: impl rusqlite::Params,
) -> Result<Option<i64>> {
    if conn
        .prepare_cached(update)
        .db()?
        .execute(update_params)
        .db()?
        == 0
    {
        return Ok(None);
    }
    conn.prepare_cached(read)
        .db()?
        .query_row(read_params, |r| r.get(0))
        .optional()
        .db()
}

/// The job's own columns an update may change, in the order [`job_values`] gives them.
const JOB_UPDATE_COLUMNS: [&str; 14] = [
    "fingerprint",
    "priority",
    "run_at",
    "ordering_key",
    "callback_url",
    "on_failure",
    "state",
    "desired_state",
    "created_at",
    "updated_at",
    "finished_at",
    "blocked_reason",
    "deadline_due",
    "round",
];

/// The values of [`JOB_UPDATE_COLUMNS`] for `job`.
fn job_values(job: &Job) -> Result<Vec<SqlValue>> {
    Ok(vec![
        sql_value(&job.fingerprint)?,
        sql_value(job.priority)?,
        sql_value(ms(job.run_at))?,
        sql_value(&job.ordering_key)?,
        sql_value(&job.callback_url)?,
        sql_value(job.on_failure.as_str())?,
        sql_value(job.state.as_str())?,
        sql_value(job.desired_state.as_str())?,
        sql_value(job.created_at.as_millis())?,
        sql_value(job.updated_at.as_millis())?,
        sql_value(ms(job.finished_at))?,
        sql_value(&job.blocked_reason)?,
        sql_value(ms(job.deadline_due()))?,
        sql_value(job.round)?,
    ])
}

/// A value as SQLite stores it, for comparing a row before and after a transition.
fn sql_value(v: impl rusqlite::ToSql) -> Result<SqlValue> {
    use rusqlite::types::ToSqlOutput;
    match v.to_sql().db()? {
        ToSqlOutput::Borrowed(r) => Ok(r.into()),
        ToSqlOutput::Owned(v) => Ok(v),
        other => Err(corrupt(
            "a row value",
            format!("{other:?} is not a plain value"),
        )),
    }
}

/// The table an [`update_sql`] text writes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum UpdateOf {
    Job,
    Step,
}

/// Most distinct `UPDATE` texts kept; past it the cache starts over (a handful are ever used).
const UPDATE_SQL_KEPT: usize = 1_024;

thread_local! {
    /// `UPDATE` texts by table and set of changed columns (a bit per column position).
    static UPDATE_SQL: RefCell<HashMap<(UpdateOf, u64), Rc<str>>> = RefCell::default();
}

/// The `UPDATE` text for `changed` column positions of `of`, built by `build` the first time
/// this thread (the writer) needs it: a claim or a report changes one of a few sets of columns,
/// and formatting the text for every row written was a tenth of a step rewrite's time.
fn update_sql(of: UpdateOf, changed: &[usize], build: impl FnOnce() -> String) -> Rc<str> {
    debug_assert!(
        changed.iter().all(|&c| c < 64),
        "a column position fits the mask"
    );
    let mask = changed.iter().fold(0u64, |m, &c| m | 1 << c);
    UPDATE_SQL.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(sql) = cache.get(&(of, mask)) {
            return sql.clone();
        }
        if cache.len() >= UPDATE_SQL_KEPT {
            cache.clear();
        }
        let sql: Rc<str> = build().into();
        cache.insert((of, mask), sql.clone());
        sql
    })
}

/// `SET` items for the columns at `changed` (positions in `columns`), numbered from `?{first}`
/// on: SQLite rewrites an index entry for every indexed column a `SET` names, changed or not,
/// so a write names only what changed (a job row has ten indexes, a step row four).
fn set_items(columns: &[&str], changed: &[usize], first: usize) -> Vec<String> {
    changed
        .iter()
        .enumerate()
        .map(|(n, &c)| format!("{} = ?{}", columns[c], first + n))
        .collect()
}

/// Positions where `new` differs from `old`.
fn changed_positions<T: PartialEq>(old: &[T], new: &[T]) -> Vec<usize> {
    debug_assert_eq!(old.len(), new.len());
    (0..new.len()).filter(|&i| old[i] != new[i]).collect()
}

/// The position in an `UPDATE`'s cache key that marks a job update writing [`Ending`].
const ENDING_KEY: usize = 63;

/// The entries a write that finishes its job leaves in the job row instead of a history row
/// (see `history::stays_in_row`): the number of the first and their `more` text.
pub(super) struct Ending {
    seq: i64,
    text: String,
}

impl Ending {
    /// `events`, the write's entries, the newest of them numbered `last`.
    pub(super) fn of(events: &[NewEvent], last: i64) -> Result<Ending> {
        let text = crate::history::more_text(events)?
            .ok_or_else(|| corrupt("jobs.ending", "a finishing write with no entries"))?;
        Ok(Ending {
            seq: last - events.len() as i64 + 1,
            text,
        })
    }
}

/// Writes back the job's own fields that the transition from `before` changed (its labels and
/// idempotency key never change) with its new `last_event_seq` and the entries of a finishing
/// write (`ending`), in one statement. A changed
/// priority also moves the steps' copies of it (and their claim ranks).
///
/// A transition that changed no field but the time (a step finished and its dependants readied,
/// progress recorded as an event) leaves the row alone: the history entries it appends carry
/// both the time and the newest sequence number, and reading a job takes them from there when
/// they are newer than the row's (see `rows::read_job`). For a one-step job that is one row
/// write fewer per step, and most of a DAG's. A claim that only leases work is not even compared
/// here (see `persist`).
pub(super) fn update_job(
    conn: &Connection,
    before: &Job,
    job: &Job,
    last_event_seq: i64,
    ending: Option<&Ending>,
) -> Result<()> {
    let id = job_id_text(job.id);
    let new = job_values(job)?;
    let changed = changed_positions(&job_values(before)?, &new);
    if ending.is_none()
        && changed
            .iter()
            .all(|&c| JOB_UPDATE_COLUMNS[c] == "updated_at")
    {
        return Ok(());
    }
    let mut head = vec![
        SqlValue::Text(id.clone()),
        SqlValue::Integer(last_event_seq),
    ];
    let mut key = changed.clone();
    if let Some(ending) = ending {
        head.push(SqlValue::Integer(ending.seq));
        head.push(SqlValue::Text(ending.text.clone()));
        // A bit of the cache key of its own: no column position reaches it.
        key.push(ENDING_KEY);
    }
    let sql = update_sql(UpdateOf::Job, &key, || {
        let mut set = set_items(&JOB_UPDATE_COLUMNS, &changed, head.len() + 1);
        set.push("last_event_seq = ?2".into());
        if ending.is_some() {
            set.push("ending_seq = ?3, ending = ?4".into());
        }
        format!("UPDATE jobs SET {} WHERE id = ?1", set.join(", "))
    });
    let values = changed.iter().map(|&c| &new[c]);
    let written = conn
        .prepare_cached(&sql)
        .db()?
        .execute(rusqlite::params_from_iter(head.iter().chain(values)))
        .db()?;
    if written == 0 {
        return Err(Error::JobNotFound(job.id));
    }
    if job.priority == before.priority {
        return Ok(());
    }
    // The claim rank is derived from the job's priority, so keep the copies in step with it; the
    // expression is `Job::claim_rank` for every step whether or not the transition changed it.
    conn.prepare_cached(
        "UPDATE steps SET priority = ?2, \
         claim_rank = CASE WHEN claim_agent IS NOT NULL THEN next_attempt_at - ?2 * ?3 END \
         WHERE job_id = ?1 AND priority <> ?2",
    )
    .db()?
    .execute(params![id, job.priority, PRIORITY_AGING.as_millis_i64()])
    .db()?;
    Ok(())
}

/// The entry of a claim that only leases work, kept in the step row it writes instead of a
/// history row (see `super::history`): its number and its `more` text (a list of one).
pub(super) struct LeaseEntry {
    seq: i64,
    text: String,
}

impl LeaseEntry {
    /// Entry `entry`, numbered `seq`.
    pub(super) fn of(entry: &NewEvent, seq: i64) -> Result<LeaseEntry> {
        let text = crate::history::more_text(std::slice::from_ref(entry))?
            .ok_or_else(|| corrupt("steps.lease_entry", "a lease with no entry"))?;
        Ok(LeaseEntry { seq, text })
    }

    /// The values its two columns are set to, after the `UPDATE`'s others.
    fn values(&self) -> [ToSqlOutput<'_>; 2] {
        [
            ToSqlOutput::Owned(SqlValue::Integer(self.seq)),
            ToSqlOutput::Borrowed(rusqlite::types::ValueRef::Text(self.text.as_bytes())),
        ]
    }
}

/// Inserts or overwrites one step row from the job as it now stands.
pub(super) fn write_step(conn: &Connection, job: &Job, idx: usize) -> Result<()> {
    let mut upsert = conn.prepare_cached(step_upsert_sql()).db()?;
    insert_step(&mut upsert, job, idx)
}

/// Runs `insert` (a statement of [`STEP_WRITE_COLUMNS`]' placeholders) for step `idx` of `job`.
pub(super) fn insert_step(
    insert: &mut rusqlite::Statement<'_>,
    job: &Job,
    idx: usize,
) -> Result<()> {
    with_step_values(job, idx, &Same::NONE, |values| {
        insert.execute(rusqlite::params_from_iter(values)).db()
    })?;
    Ok(())
}

/// Writes back what the transition from `before` changed in step `idx`, with the entry of a
/// claim that only leases work (`entry`): a plain `UPDATE` of the changed columns only (see
/// [`set_items`]), nothing when none changed. A step `before` did not have, or a row that is
/// missing (never left by the writer), is written whole.
pub(super) fn rewrite_step(
    conn: &Connection,
    before: &Job,
    job: &Job,
    idx: usize,
    entry: Option<&LeaseEntry>,
) -> Result<()> {
    if idx < before.steps.len() {
        let same = Same::of(before, job, idx);
        let updated = with_step_values(before, idx, &same, |old| {
            with_step_values(job, idx, &same, |new| {
                update_step(conn, job, idx, old, new, entry)
            })
        })?;
        if updated {
            return Ok(());
        }
    }
    write_step(conn, job, idx)?;
    match entry {
        Some(entry) => update_step(conn, job, idx, &[], &[], Some(entry)).map(|_| ()),
        None => Ok(()),
    }
}

/// The position in an `UPDATE`'s cache key that marks a step update writing a [`LeaseEntry`].
const LEASE_ENTRY_KEY: usize = 63;

/// The `UPDATE` of [`rewrite_step`], given both versions' values (borrowed, compared in place:
/// only what changed is bound) and the lease's entry to keep. False when the row is missing.
fn update_step(
    conn: &Connection,
    job: &Job,
    idx: usize,
    old: &[ToSqlOutput<'_>],
    new: &[ToSqlOutput<'_>],
    entry: Option<&LeaseEntry>,
) -> Result<bool> {
    let changed = changed_positions(old, new);
    debug_assert!(
        !changed
            .iter()
            .any(|&c| matches!(STEP_WRITE_COLUMNS[c], "job_id" | "idx")),
        "a step's key never changes"
    );
    if changed.is_empty() && entry.is_none() {
        return Ok(true);
    }
    let mut key = changed.clone();
    if entry.is_some() {
        // A bit of the cache key of its own: no column position reaches it.
        key.push(LEASE_ENTRY_KEY);
    }
    let sql = update_sql(UpdateOf::Step, &key, || {
        let mut set = set_items(&STEP_WRITE_COLUMNS, &changed, 3);
        if entry.is_some() {
            let n = 3 + changed.len();
            set.push(format!("lease_entry_seq = ?{n}, lease_entry = ?{}", n + 1));
        }
        format!(
            "UPDATE steps SET {} WHERE job_id = ?1 AND idx = ?2",
            set.join(", ")
        )
    });
    let key = [
        ToSqlOutput::Owned(SqlValue::Text(job_id_text(job.id))),
        ToSqlOutput::Owned(SqlValue::Integer(idx as i64)),
    ];
    let entry = entry.map(LeaseEntry::values);
    let updated = conn
        .prepare_cached(&sql)
        .db()?
        .execute(rusqlite::params_from_iter(
            key.iter()
                .chain(changed.iter().map(|&c| &new[c]))
                .chain(entry.iter().flatten()),
        ))
        .db()?;
    Ok(updated > 0)
}

/// Which of a step row's costly columns (its key's text and the JSON texts) two versions of a
/// step share, compared as values. A rewrite builds those texts only for the fields the
/// transition changed: building every column twice (before and after) to compare them was a
/// fifth of a step rewrite's time in a drain's profile, most of it JSON never changed.
struct Same {
    key: bool,
    payload: bool,
    depends_on: bool,
    compensate: bool,
    http: bool,
    result: bool,
    progress: bool,
}

impl Same {
    /// Nothing taken as shared: every column is built.
    const NONE: Same = Same {
        key: false,
        payload: false,
        depends_on: false,
        compensate: false,
        http: false,
        result: false,
        progress: false,
    };

    /// What step `idx` of `before` and of `after` share; nothing when either lacks the step
    /// (building the values then answers the error).
    fn of(before: &Job, after: &Job, idx: usize) -> Same {
        let (Some(a), Some(b)) = (before.steps.get(idx), after.steps.get(idx)) else {
            return Same::NONE;
        };
        Same {
            key: before.id == after.id,
            payload: a.payload == b.payload,
            depends_on: a.depends_on == b.depends_on,
            compensate: a.compensate == b.compensate,
            http: a.http == b.http,
            result: a.result == b.result,
            progress: a.progress == b.progress,
        }
    }
}

/// Serializes `value` unless `same` (a NULL then stands in for it, alike in both versions).
fn json_unless<T: serde::Serialize>(
    same: bool,
    value: Option<&T>,
    column: &'static str,
) -> Result<Option<String>> {
    if same {
        return Ok(None);
    }
    value
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| corrupt(column, e))
}

/// Calls `f` with the values of [`STEP_WRITE_COLUMNS`] for step `idx` of `job`, borrowed from
/// the job where they can be (building them owned for every column, twice per rewrite, was the
/// writer's second-largest symbol in a drain profile). NULL stands in for the costly columns
/// `same` marks as shared: for comparing two versions of a step, never for writing a whole row.
fn with_step_values<T>(
    job: &Job,
    idx: usize,
    same: &Same,
    f: impl FnOnce(&[ToSqlOutput<'_>]) -> Result<T>,
) -> Result<T> {
    let Some(s) = job.steps.get(idx) else {
        return Err(corrupt(
            "transition",
            format!("job {} has no step {idx}", job.id),
        ));
    };
    let key = (!same.key).then(|| job_id_text(job.id));
    let payload = json_unless(same.payload, Some(&s.payload), "steps.payload")?;
    let depends_on = json_unless(same.depends_on, Some(&s.depends_on), "steps.depends_on")?;
    let compensate = json_unless(same.compensate, s.compensate.as_ref(), "steps.compensate")?;
    let http = json_unless(same.http, s.http.as_ref(), "steps.http")?;
    let result = json_unless(same.result, s.result.as_ref(), "steps.result")?;
    let progress = json_unless(same.progress, s.progress.as_ref(), "steps.progress")?;
    let values: &[&dyn rusqlite::ToSql] = params![
        key,
        job.priority,
        idx as i64,
        s.name,
        s.agent,
        payload,
        depends_on,
        s.timeout.as_millis_i64(),
        s.max_attempts,
        s.backoff.initial.as_millis_i64(),
        s.backoff.factor,
        s.backoff.max.as_millis_i64(),
        compensate,
        s.state.as_str(),
        s.attempt,
        s.failures,
        s.lease_id.map(|l| l.0.to_string()),
        s.worker,
        s.created_at.as_millis(),
        ms(s.ready_at),
        ms(s.started_at),
        ms(s.finished_at),
        ms(s.lease_expires_at),
        ms(s.next_attempt_at),
        result,
        s.last_error,
        s.budget_from,
        s.comp_phase.map(CompPhase::as_str),
        s.comp_attempts,
        s.comp_failures,
        s.comp_budget_from,
        s.claim_agent(),
        s.lease_agent(),
        job.claim_rank(idx),
        formula_column(s.backoff_formula),
        http,
        s.deadline.map(|d| d.as_millis_i64()),
        ms(s.attempt_ends_at),
        progress,
        ms(s.progress_at),
        s.progress_events,
    ];
    let values = values
        .iter()
        .map(|v| v.to_sql())
        .collect::<rusqlite::Result<Vec<_>>>()
        .db()?;
    f(&values)
}

#[cfg(test)]
mod tests {
    use overseer_core::machine::admit;
    use overseer_core::{Command, JobId, JobSpec, LeaseId, Timestamp};
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::sqlite::rows::load_job;
    use crate::sqlite::{apply_command, insert, migrate};

    fn t(ms: i64) -> Timestamp {
        Timestamp(1_700_000_000_000 + ms)
    }

    // Proves a step rewrite writes every field a transition changed, the JSON ones included,
    // although it builds their texts only when their values differ: after a claim, a heartbeat
    // with progress and a completion with a result, the rows read back are the job the core
    // answered, and the texts of the fields no transition touched are as first written.
    #[test]
    fn rewrites_write_every_changed_field_and_only_those() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        let spec: JobSpec = serde_json::from_value(json!({
            "steps": [
                {"name": "a", "agent": "w", "payload": {"n": 1},
                 "compensate": {"agent": "w", "payload": {"undo": true}}},
                {"name": "b", "agent": "w", "depends_on": ["a"]}
            ]
        }))
        .expect("spec");
        let id = JobId(Uuid::now_v7());
        let admitted = admit(Job::from_spec(id, &spec, t(0)), t(0));
        let seq = insert::reserve_seqs(&conn, 1).expect("seq");
        insert::NewRows::prepare(&conn)
            .and_then(|mut rows| rows.insert(&admitted.job, seq, &admitted.events, 100))
            .expect("insert");
        let texts = |conn: &Connection| -> Vec<(String, String, Option<String>)> {
            let mut stmt = conn
                .prepare("SELECT payload, depends_on, compensate FROM steps ORDER BY idx")
                .expect("prepare");
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .expect("query")
                .collect::<rusqlite::Result<_>>()
                .expect("rows")
        };
        let first = texts(&conn);
        let commands = [
            Command::Claim {
                step: 0,
                lease_id: LeaseId(Uuid::now_v7()),
                worker: "w-1".into(),
            },
            Command::Heartbeat {
                step: 0,
                attempt: 1,
                progress: Some(json!({"done": 40})),
            },
            Command::Complete {
                step: 0,
                attempt: 1,
                result: json!({"out": [1, 2]}),
            },
        ];
        for (n, command) in commands.into_iter().enumerate() {
            let t = apply_command(&conn, id, command, t(10 + n as i64), 100).expect("apply");
            let stored = load_job(&conn, id).expect("load").expect("job");
            assert_eq!(stored, t.job, "after command {n}");
        }
        let stored = load_job(&conn, id).expect("load").expect("job");
        assert_eq!(stored.steps[0].result, Some(json!({"out": [1, 2]})));
        assert_eq!(stored.steps[0].progress, Some(json!({"done": 40})));
        assert_eq!(texts(&conn), first, "untouched texts stay as first written");
    }
}
