//! Writing what the core decided, a whole batch of transitions at a time: one statement per
//! table, whatever the number of jobs and steps (see `crate::write_set` for how transitions are
//! merged per job). The statements are independent and sent together (pipelined), so a batch
//! costs one round trip and a handful of statement executions, not several per transition.
//! A batch of one job (or one step) is written with a statement that takes its values out of the
//! same arrays (`$1[1]`): the same rows, planned as a primary-key update even while the tables
//! are empty, where the set-based statements' cached plans scan them whole.
//!
//! What a transition can change is fixed: a job's state, desired state, priority, `run_at`,
//! timestamps and blocked reason; a step's run-time columns. What was fixed at admission (a
//! step's name, agent, payload, dependencies, timeout, retry policy and undo; a job's key,
//! labels, callback) is written once, by the insert, and never again (the core asserts it never
//! changes them).

use super::tx::Transaction;
use std::borrow::Borrow;
use std::sync::OnceLock;

use overseer_core::{CompPhase, Job, LeaseId, NewEvent, Timestamp, Transition};
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::rows::{self, corrupt, get, idx_param, json_text, ms, query_one, text};
use super::{jobs, unlogged, Res};
use crate::history;
use crate::write_set::{self, JobWrite};
use crate::LeaseRef;

/// Stores a batch of transitions at `now` (jobs, steps, events with the history trim, deliveries,
/// notifications) in the caller's transaction. Transitions of one job come in the order they
/// were applied.
pub(super) async fn persist_all(
    tx: &Transaction<'_>,
    transitions: &[&Transition],
    now: Timestamp,
    history_per_job: usize,
) -> Res<()> {
    if transitions.is_empty() {
        return Ok(());
    }
    let waiting = unlogged::take(tx, transitions)?;
    let mut writes = write_set::by_job(transitions.iter().copied());
    let kept = unlogged::plan(tx, &mut writes, &waiting, history_per_job)?;
    let mut signals: Vec<String> = transitions
        .iter()
        .flat_map(|t| jobs::signals_of(t))
        .collect();
    signals.sort_unstable();
    signals.dedup();
    futures::try_join!(
        write_jobs(tx, &writes, &kept, history_per_job),
        write_steps(tx, &writes, &kept),
        futures::future::try_join_all(
            transitions
                .iter()
                .map(|t| rows::insert_deliveries(tx, t, now))
        ),
        jobs::notify(tx, &signals),
        insert_retired_leases(tx, transitions),
    )?;
    Ok(())
}

/// Updates the job rows and appends their events with the next sequence numbers, one history
/// row per job (see `crate::history`), dropping the rows wholly older than the newest `keep`
/// entries of each job's history: one statement. (A row holding entries on both sides of the
/// cut stays; reads leave out its older entries, see `rows::load_events`.) (A job whose priority changed has
/// every step among its changed steps, so the steps' copies follow in `write_steps`.)
///
/// The history trim looks each job up as one index range, whatever the planner's statistics
/// say: a join of the batch against `events` is planned as a scan of the whole table.
async fn write_jobs(
    tx: &Transaction<'_>,
    writes: &[JobWrite<'_>],
    kept: &unlogged::Kept,
    keep: usize,
) -> Res<()> {
    let writes: Vec<&JobWrite> = writes.iter().filter(|w| w.touches_job_row()).collect();
    if writes.is_empty() {
        return Ok(());
    }
    let mut jobs = JobColumns::default();
    let mut events = EventColumns::default();
    for w in &writes {
        jobs.push(w, kept);
        events.push(w, keep)?;
    }
    // The newest entry always stays (`history::stored`).
    let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
    // One job (a claim or a report of one step, the common case when work trickles in) takes
    // the statement planned as a key lookup; see `write_one_job_sql`.
    let sql = match jobs.id.len() {
        1 => write_one_job_sql(),
        _ => write_jobs_sql(),
    };
    let row = query_one(
        tx,
        sql,
        &[
            &jobs.id,
            &jobs.priority,
            &jobs.run_at,
            &jobs.state,
            &jobs.desired_state,
            &jobs.updated_at,
            &jobs.finished_at,
            &jobs.blocked_reason,
            &jobs.events,
            &events.job_id,
            &events.pos,
            &events.at,
            &events.kind,
            &events.step,
            &events.attempt,
            &events.detail,
            &keep,
            &jobs.deadline_due,
            &jobs.round,
            &events.more,
            &jobs.unlogged,
            &jobs.in_row,
        ],
    )
    .await?;
    let updated: i64 = get(&row, 0, "jobs written")?;
    all_written("jobs", u64::try_from(updated).unwrap_or(0), jobs.id.len())?;
    Ok(())
}

/// Checks an update reached every row it was given: the writer holds each job's lock, so a
/// missing row means the store is not what it should be.
fn all_written(table: &str, written: u64, wanted: usize) -> Res<()> {
    let wanted = wanted as u64;
    match written == wanted {
        true => Ok(()),
        false => Err(corrupt(
            table,
            format!(
                "{} of {wanted} rows were missing during a write",
                wanted.saturating_sub(written)
            ),
        )),
    }
}

/// The parameters of a write's new history rows (for the jobs in `$1`), one array per column.
const EVENT_VALUES: [(usize, &str, &str); 8] = [
    (10, "uuid", "job_id"),
    (11, "bigint", "pos"),
    (12, "bigint", "at"),
    (13, "text", "kind"),
    (14, "text", "step"),
    (15, "bigint", "attempt"),
    (16, "text", "detail"),
    (20, "text", "more"),
];

/// The batch's job rows, their new events and the history trim, in one statement. Each target
/// table is also filtered by `= ANY($1)` over the ids: the join with the `unnest` alone is
/// planned, once a pooled connection caches a generic plan, as a hash join over a sequential
/// scan of the whole table (an `unnest` is guessed at 10 rows and a table not yet analyzed at
/// a few pages), a plan kept as the table grows: measured, every claim and report of a
/// 2,000-job run scanned `jobs`, and PostgreSQL's idle start latency grew by 1.5 ms. The id
/// list gives the planner the primary key to walk whatever the statistics say.
fn write_jobs_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let job_values = rows::zipped(&[
            (1, "uuid", "id"),
            (2, "integer", "priority"),
            (3, "bigint", "run_at"),
            (4, "text", "state"),
            (5, "text", "desired_state"),
            (6, "bigint", "updated_at"),
            (7, "bigint", "finished_at"),
            (8, "text", "blocked_reason"),
            (9, "bigint", "n_events"),
            (18, "bigint", "deadline_due"),
            (19, "bigint", "round"),
            (21, "text", "unlogged_entries"),
            (22, "bigint", "in_row"),
        ]);
        let event_values = rows::zipped(&EVENT_VALUES);
        format!(
            "\
WITH v AS ({job_values}), \
j AS ( \
  UPDATE jobs SET priority = v.priority, run_at = v.run_at, state = v.state, \
    desired_state = v.desired_state, updated_at = v.updated_at, finished_at = v.finished_at, \
    blocked_reason = v.blocked_reason, last_event_seq = jobs.last_event_seq + v.n_events, \
    deadline_due = v.deadline_due, round = v.round, unlogged_entries = v.unlogged_entries \
  FROM v WHERE jobs.id = v.id AND jobs.id = ANY($1::uuid[]) \
  RETURNING jobs.id, jobs.last_event_seq AS last, v.n_events, \
    jobs.last_event_seq + v.in_row AS newest, v.n_events + v.in_row AS n_new), \
e AS ( \
  INSERT INTO events (job_id, seq, at, kind, step, attempt, detail, more) \
  SELECT e.job_id, j.last - j.n_events + e.pos, e.at, e.kind, e.step, e.attempt, e.detail, \
    e.more \
  FROM ({event_values}) e \
  JOIN j ON j.id = e.job_id), \
t AS ( \
  DELETE FROM events WHERE events.job_id = ANY($1::uuid[]) AND ctid = ANY(ARRAY( \
    SELECT o.ctid FROM j CROSS JOIN LATERAL ( \
      SELECT ctid FROM events WHERE events.job_id = j.id AND events.seq <= j.newest - $17::bigint \
        AND events.seq + COALESCE(json_array_length(events.more::json), 0) \
          <= j.newest - $17::bigint \
      OFFSET 0) o \
    WHERE j.n_new > 0 AND j.newest > $17::bigint))) \
SELECT count(*) FROM j"
        )
    })
}

/// [`write_jobs_sql`] for a batch of one job, with the same parameters: the row's values are
/// taken out of their arrays (`$1[1]`), so the update and the history trim are planned as
/// primary-key lookups even on an empty table, where the set-based statement's cached plan
/// scans `jobs` and `events` whole.
fn write_one_job_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let event_values = rows::zipped(&EVENT_VALUES);
        format!(
            "\
WITH j AS ( \
  UPDATE jobs SET priority = ($2::integer[])[1], run_at = ($3::bigint[])[1], \
    state = ($4::text[])[1], desired_state = ($5::text[])[1], \
    updated_at = ($6::bigint[])[1], finished_at = ($7::bigint[])[1], \
    blocked_reason = ($8::text[])[1], last_event_seq = last_event_seq + ($9::bigint[])[1], \
    deadline_due = ($18::bigint[])[1], round = ($19::bigint[])[1], \
    unlogged_entries = ($21::text[])[1] \
  WHERE id = ($1::uuid[])[1] \
  RETURNING id, last_event_seq AS last, ($9::bigint[])[1] AS n_events), \
e AS ( \
  INSERT INTO events (job_id, seq, at, kind, step, attempt, detail, more) \
  SELECT j.id, j.last - j.n_events + e.pos, e.at, e.kind, e.step, e.attempt, e.detail, e.more \
  FROM ({event_values}) e \
  CROSS JOIN j), \
t AS ( \
  DELETE FROM events WHERE job_id = ($1::uuid[])[1] \
    AND ($9::bigint[])[1] + ($22::bigint[])[1] > 0 \
    AND seq <= (SELECT last FROM j) + ($22::bigint[])[1] - $17::bigint \
    AND seq + COALESCE(json_array_length(more::json), 0) \
      <= (SELECT last FROM j) + ($22::bigint[])[1] - $17::bigint) \
SELECT count(*) FROM j"
        )
    })
}

/// The job rows of a batch, column by column.
#[derive(Default)]
struct JobColumns<'a> {
    id: Vec<Uuid>,
    priority: Vec<i32>,
    run_at: Vec<Option<i64>>,
    state: Vec<&'static str>,
    desired_state: Vec<&'static str>,
    updated_at: Vec<i64>,
    finished_at: Vec<Option<i64>>,
    blocked_reason: Vec<Option<std::borrow::Cow<'a, str>>>,
    /// Events appended to the job by the batch.
    events: Vec<i64>,
    deadline_due: Vec<Option<i64>>,
    round: Vec<i64>,
    /// The entries the row keeps waiting (see `super::unlogged`).
    unlogged: Vec<Option<&'a str>>,
    /// How many entries a row finished in it holds, 0 for the others: the newest entry's
    /// number is the row's `last_event_seq` plus these, and the history trim cuts from it.
    in_row: Vec<i64>,
}

impl<'a> JobColumns<'a> {
    fn push(&mut self, w: &JobWrite<'a>, kept: &'a unlogged::Kept) {
        let job = w.job;
        self.id.push(job.id.0);
        self.priority.push(job.priority);
        self.run_at.push(ms(job.run_at));
        self.state.push(job.state.as_str());
        self.desired_state.push(job.desired_state.as_str());
        self.updated_at.push(job.updated_at.as_millis());
        self.finished_at.push(ms(job.finished_at));
        self.blocked_reason
            .push(job.blocked_reason.as_deref().map(text));
        self.events.push(w.events.len() as i64);
        self.deadline_due.push(ms(job.deadline_due()));
        self.round.push(i64::from(job.round));
        self.unlogged
            .push(kept.jobs.get(&job.id).map(String::as_str));
        self.in_row
            .push(kept.in_row.get(&job.id).copied().unwrap_or(0));
    }
}

/// The history rows of a batch, column by column: one row per job with events (see
/// `crate::history`), holding the entries it keeps of them; `pos` numbers the row's first entry
/// among the job's new events from 1.
#[derive(Default)]
struct EventColumns<'a> {
    job_id: Vec<Uuid>,
    pos: Vec<i64>,
    at: Vec<i64>,
    kind: Vec<&'static str>,
    step: Vec<Option<&'a str>>,
    attempt: Vec<Option<i64>>,
    detail: Vec<Option<String>>,
    more: Vec<Option<String>>,
}

impl<'a> EventColumns<'a> {
    fn push(&mut self, w: &'a JobWrite<'_>, keep: usize) -> Res<()> {
        self.push_row(w.job.id.0, &w.events, keep)
    }

    /// Adds the row of job `job_id` for its new `events`, when it keeps the newest `keep`.
    fn push_row<E: Borrow<NewEvent>>(
        &mut self,
        job_id: Uuid,
        events: &'a [E],
        keep: usize,
    ) -> Res<()> {
        let (kept, first) = history::stored(events, keep);
        let Some((head, rest)) = kept.split_first() else {
            return Ok(());
        };
        let head: &'a NewEvent = head.borrow();
        self.job_id.push(job_id);
        self.pos.push(first);
        self.at.push(head.at.as_millis());
        self.kind.push(head.kind.as_str());
        self.step.push(head.step.as_deref());
        self.attempt.push(head.attempt.map(i64::from));
        self.detail.push(head.detail.as_ref().map(json_text));
        self.more.push(history::more_text(rest)?);
        Ok(())
    }
}

/// Overwrites the run-time columns of every changed step, with the columns derived from them
/// for the queries that find work, and the entry each keeps waiting to be logged (`kept`; see
/// `super::unlogged`): one statement.
async fn write_steps(
    tx: &Transaction<'_>,
    writes: &[JobWrite<'_>],
    kept: &unlogged::Kept,
) -> Res<()> {
    let mut c = StepColumns::default();
    let mut waiting: Vec<Option<&str>> = Vec::new();
    for w in writes {
        for &idx in &w.steps {
            c.push(w, idx)?;
            waiting.push(kept.steps.get(&(w.job.id, idx)).map(String::as_str));
        }
    }
    if c.job_id.is_empty() {
        return Ok(());
    }
    let sql = match c.job_id.len() {
        1 => WRITE_ONE_STEP_SQL,
        _ => write_steps_sql(),
    };
    let mut params = c.params();
    params.push(&waiting);
    let n = rows::execute(tx, sql, &params).await?;
    all_written("steps", n, c.job_id.len())?;
    Ok(())
}

impl StepColumns<'_> {
    /// The columns as statement parameters, `$1` to `$26`.
    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        let c = self;
        vec![
            &c.job_id,
            &c.idx,
            &c.priority,
            &c.state,
            &c.attempt,
            &c.failures,
            &c.lease_id,
            &c.worker,
            &c.ready_at,
            &c.started_at,
            &c.finished_at,
            &c.lease_expires_at,
            &c.next_attempt_at,
            &c.result,
            &c.last_error,
            &c.budget_from,
            &c.comp_phase,
            &c.comp_attempts,
            &c.comp_failures,
            &c.comp_budget_from,
            &c.claim_agent,
            &c.lease_agent,
            &c.claim_rank,
            &c.attempt_ends_at,
            &c.progress,
            &c.progress_at,
        ]
    }
}

/// The batch's step rows, by primary key. Unlike [`write_jobs_sql`], the target is not also
/// filtered by `= ANY($1)`: on `steps` the planner puts that filter into the key lookup of each
/// row (`job_id = v.job_id AND job_id = ANY($1)`), and the index scan then steps through the
/// whole array for every row, a cost that grows with the square of the batch (47 rows: 0.77 ms
/// of lookups instead of 0.43; 200 rows: 2.4 ms instead of 1.0, BENCHMARKS.md, forty-fourth
/// session). The write's `enable_seqscan = off` alone keeps the join a walk of the primary key.
fn write_steps_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let step_values = rows::zipped(&[
            (1, "uuid", "job_id"),
            (2, "integer", "idx"),
            (3, "integer", "priority"),
            (4, "text", "state"),
            (5, "bigint", "attempt"),
            (6, "bigint", "failures"),
            (7, "uuid", "lease_id"),
            (8, "text", "worker"),
            (9, "bigint", "ready_at"),
            (10, "bigint", "started_at"),
            (11, "bigint", "finished_at"),
            (12, "bigint", "lease_expires_at"),
            (13, "bigint", "next_attempt_at"),
            (14, "text", "result"),
            (15, "text", "last_error"),
            (16, "bigint", "budget_from"),
            (17, "text", "comp_phase"),
            (18, "bigint", "comp_attempts"),
            (19, "bigint", "comp_failures"),
            (20, "bigint", "comp_budget_from"),
            (21, "text", "claim_agent"),
            (22, "text", "lease_agent"),
            (23, "bigint", "claim_rank"),
            (24, "bigint", "attempt_ends_at"),
            (25, "text", "progress"),
            (26, "bigint", "progress_at"),
            (27, "text", "unlogged_entry"),
        ]);
        format!(
            "\
UPDATE steps SET priority = v.priority, state = v.state, attempt = v.attempt, \
  failures = v.failures, lease_id = v.lease_id, worker = v.worker, ready_at = v.ready_at, \
  started_at = v.started_at, finished_at = v.finished_at, lease_expires_at = v.lease_expires_at, \
  next_attempt_at = v.next_attempt_at, result = v.result, last_error = v.last_error, \
  budget_from = v.budget_from, comp_phase = v.comp_phase, comp_attempts = v.comp_attempts, \
  comp_failures = v.comp_failures, comp_budget_from = v.comp_budget_from, \
  claim_agent = v.claim_agent, lease_agent = v.lease_agent, claim_rank = v.claim_rank, \
  attempt_ends_at = v.attempt_ends_at, progress = v.progress, progress_at = v.progress_at, \
  unlogged_entry = v.unlogged_entry \
FROM ({step_values}) v \
WHERE steps.job_id = v.job_id AND steps.idx = v.idx"
        )
    })
}

/// [`write_steps_sql`] for a batch of one step, with the same parameters taken out of their
/// arrays: planned as a primary-key update whatever the table's statistics say (see
/// [`write_one_job_sql`]).
const WRITE_ONE_STEP_SQL: &str = "\
UPDATE steps SET priority = ($3::integer[])[1], state = ($4::text[])[1], \
  attempt = ($5::bigint[])[1], failures = ($6::bigint[])[1], \
  lease_id = ($7::uuid[])[1], worker = ($8::text[])[1], ready_at = ($9::bigint[])[1], \
  started_at = ($10::bigint[])[1], finished_at = ($11::bigint[])[1], \
  lease_expires_at = ($12::bigint[])[1], next_attempt_at = ($13::bigint[])[1], \
  result = ($14::text[])[1], last_error = ($15::text[])[1], \
  budget_from = ($16::bigint[])[1], comp_phase = ($17::text[])[1], \
  comp_attempts = ($18::bigint[])[1], comp_failures = ($19::bigint[])[1], \
  comp_budget_from = ($20::bigint[])[1], claim_agent = ($21::text[])[1], \
  lease_agent = ($22::text[])[1], claim_rank = ($23::bigint[])[1], \
  attempt_ends_at = ($24::bigint[])[1], progress = ($25::text[])[1], \
  progress_at = ($26::bigint[])[1], unlogged_entry = ($27::text[])[1] \
WHERE job_id = ($1::uuid[])[1] AND idx = ($2::integer[])[1]";

/// The run-time columns of step rows, column by column (in `write_steps_sql`'s order).
#[derive(Default)]
pub(super) struct StepColumns<'a> {
    job_id: Vec<Uuid>,
    idx: Vec<i32>,
    priority: Vec<i32>,
    state: Vec<&'static str>,
    attempt: Vec<i64>,
    failures: Vec<i64>,
    lease_id: Vec<Option<Uuid>>,
    worker: Vec<Option<std::borrow::Cow<'a, str>>>,
    ready_at: Vec<Option<i64>>,
    started_at: Vec<Option<i64>>,
    finished_at: Vec<Option<i64>>,
    lease_expires_at: Vec<Option<i64>>,
    next_attempt_at: Vec<Option<i64>>,
    result: Vec<Option<String>>,
    last_error: Vec<Option<std::borrow::Cow<'a, str>>>,
    budget_from: Vec<i64>,
    comp_phase: Vec<Option<&'static str>>,
    comp_attempts: Vec<i64>,
    comp_failures: Vec<i64>,
    comp_budget_from: Vec<i64>,
    claim_agent: Vec<Option<&'a str>>,
    lease_agent: Vec<Option<&'a str>>,
    claim_rank: Vec<Option<i64>>,
    attempt_ends_at: Vec<Option<i64>>,
    progress: Vec<Option<String>>,
    progress_at: Vec<Option<i64>>,
}

impl<'a> StepColumns<'a> {
    fn push(&mut self, w: &JobWrite<'a>, idx: usize) -> Res<()> {
        self.push_step(w.job, idx)
    }

    pub(super) fn push_step(&mut self, job: &'a Job, idx: usize) -> Res<()> {
        let s = job
            .steps
            .get(idx)
            .ok_or_else(|| corrupt("transition", format!("job {} has no step {idx}", job.id)))?;
        self.job_id.push(job.id.0);
        self.idx.push(idx_param(idx)?);
        self.priority.push(job.priority);
        self.state.push(s.state.as_str());
        self.attempt.push(i64::from(s.attempt));
        self.failures.push(i64::from(s.failures));
        self.lease_id.push(s.lease_id.map(|l| l.0));
        self.worker.push(s.worker.as_deref().map(text));
        self.ready_at.push(ms(s.ready_at));
        self.started_at.push(ms(s.started_at));
        self.finished_at.push(ms(s.finished_at));
        self.lease_expires_at.push(ms(s.lease_expires_at));
        self.next_attempt_at.push(ms(s.next_attempt_at));
        self.result.push(s.result.as_ref().map(json_text));
        self.last_error.push(s.last_error.as_deref().map(text));
        self.budget_from.push(i64::from(s.budget_from));
        self.comp_phase.push(s.comp_phase.map(CompPhase::as_str));
        self.comp_attempts.push(i64::from(s.comp_attempts));
        self.comp_failures.push(i64::from(s.comp_failures));
        self.comp_budget_from.push(i64::from(s.comp_budget_from));
        self.claim_agent.push(s.claim_agent());
        self.lease_agent.push(s.lease_agent());
        self.claim_rank.push(job.claim_rank(idx));
        self.attempt_ends_at.push(ms(s.attempt_ends_at));
        self.progress.push(s.progress.as_ref().map(json_text));
        self.progress_at.push(ms(s.progress_at));
        Ok(())
    }
}

/// Keeps the leases the transitions took off their steps (see
/// [`crate::decide::retired_leases`]): one statement, and none when there are none (nearly
/// always: a first attempt's claim retires nothing).
async fn insert_retired_leases(tx: &Transaction<'_>, transitions: &[&Transition]) -> Res<()> {
    let leases: Vec<LeaseRef> = transitions
        .iter()
        .flat_map(|t| crate::decide::retired_leases(t))
        .collect();
    if leases.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = leases.iter().map(|l| l.lease_id.0).collect();
    let jobs: Vec<Uuid> = leases.iter().map(|l| l.job_id.0).collect();
    let steps = leases
        .iter()
        .map(|l| idx_param(l.step))
        .collect::<Res<Vec<i32>>>()?;
    let attempts: Vec<i64> = leases.iter().map(|l| i64::from(l.attempt)).collect();
    static SQL: OnceLock<String> = OnceLock::new();
    let sql = SQL.get_or_init(|| {
        rows::zipped_insert(
            "leases",
            &[
                ("lease_id", "uuid"),
                ("job_id", "uuid"),
                ("step", "integer"),
                ("attempt", "bigint"),
            ],
        )
    });
    rows::execute(tx, sql, &[&ids, &jobs, &steps, &attempts]).await?;
    Ok(())
}

/// Resolves lease ids to their attempts: one statement, one primary-key lookup per id whatever
/// the planner's statistics say. Ids with no lease are left out.
pub(super) async fn find_leases(
    tx: &Transaction<'_>,
    ids: &[LeaseId],
) -> Res<std::collections::HashMap<LeaseId, LeaseRef>> {
    let uuids: Vec<Uuid> = ids.iter().map(|l| l.0).collect();
    let found = rows::query_ids(tx, &uuids, FIND_ONE_LEASE_SQL, FIND_LEASES_SQL).await?;
    let mut out = std::collections::HashMap::with_capacity(found.len());
    for row in &found {
        if let Some(lease) = rows::lease_ref_from_row(row)? {
            out.insert(lease.lease_id, lease);
        }
    }
    Ok(out)
}

/// A lease id is the latest lease of the step that names it, or one kept in `leases` when it was
/// taken off its step; never both.
/// Columns as `rows::lease_ref_from_row` decodes them.
const FIND_ONE_LEASE_SQL: &str = "\
    SELECT job_id, idx, attempt, lease_id FROM steps WHERE lease_id = $1 \
    UNION ALL SELECT job_id, step, attempt, lease_id FROM leases WHERE lease_id = $1 \
    LIMIT 1";

const FIND_LEASES_SQL: &str = "\
    SELECT l.job_id, l.step, l.attempt, l.lease_id FROM unnest($1::uuid[]) AS w (id) \
    CROSS JOIN LATERAL ( \
      SELECT job_id, idx AS step, attempt, lease_id FROM steps WHERE lease_id = w.id \
      UNION ALL SELECT job_id, step, attempt, lease_id FROM leases WHERE lease_id = w.id \
      LIMIT 1) l";

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::pgtest::{generic_plan, store_with_ready_steps, PgCluster};
    use crate::postgres::{PgOptions, PgStore};

    // Proves a batch's job and step writes reach their rows by primary key under a generic plan
    // made on small tables never analyzed, as every write plans them: without the id list the
    // job write was planned as a hash join over a sequential scan of all of `jobs` (and the
    // history trim over all of `events`), and the step write, even with it, as a scan of all of
    // `steps`, plans a connection kept as the tables grew (6 ms a call instead of 0.75 at 20,000
    // rows, BENCHMARKS.md, seventeenth session). The step write looks each row up by its key
    // alone: an id list in that lookup is walked whole for every row of the batch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_walk_primary_keys_under_a_generic_plan() {
        let (db, store) = store_with_ready_steps(2_000).await;
        let client = crate::pgtest::connect(db.url()).await.expect("connect");
        let seqscan = store
            .write(|tx, _| {
                Box::pin(async move {
                    let row = rows::query_one(tx, "SELECT current_setting('enable_seqscan')", &[])
                        .await?;
                    rows::get::<String>(&row, 0, "enable_seqscan")
                })
            })
            .await
            .expect("a write");
        assert_eq!(seqscan, "off", "writes plan with sequential scans");
        client
            .batch_execute(super::super::WRITE_BEGIN_SQL)
            .await
            .expect("begin");
        for (name, sql, params) in [
            ("job", write_jobs_sql(), 22),
            ("step", write_steps_sql(), 27),
        ] {
            let plan = generic_plan(&client, sql, params).await;
            assert!(
                !plan.contains("Seq Scan"),
                "the {name} write scans a whole table:\n{plan}"
            );
        }
        drop(store);
    }

    // Proves the one-job and one-step writes reach their rows by primary key under the plan a
    // connection caches while the tables are still empty (a fresh database, before autovacuum
    // has analyzed anything): the set-based writes, planned then, read the whole of `jobs` and
    // `events` for every claim and report until the first analyze (BENCHMARKS.md, tenth
    // session).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_row_writes_walk_primary_keys_on_an_empty_table() {
        let db = PgCluster::shared().database().await;
        let store = PgStore::open(PgOptions::new(db.url())).await.expect("open");
        let client = crate::pgtest::connect(db.url()).await.expect("connect");
        for (name, sql, params) in [
            ("job", write_one_job_sql(), 22),
            ("step", WRITE_ONE_STEP_SQL, 27),
        ] {
            let plan = generic_plan(&client, sql, params).await;
            assert!(
                !plan.contains("Seq Scan"),
                "the one-{name} write scans a whole table:\n{plan}"
            );
        }
        drop(store);
    }

    /// How often a connection planned `sql` anew (custom plans) and how often it reused the
    /// plan it keeps (generic plans), after running it `runs` times with one random id.
    async fn plans_of(client: &tokio_postgres::Client, sql: &str, runs: usize) -> (i64, i64) {
        let stmt = client.prepare(sql).await.expect("prepare");
        for _ in 0..runs {
            let id = Uuid::new_v4();
            if stmt.params()[0] == tokio_postgres::types::Type::UUID_ARRAY {
                client.query(&stmt, &[&vec![id]]).await.expect("run");
            } else {
                client.query(&stmt, &[&id]).await.expect("run");
            }
        }
        let row = client
            .query_one(
                "SELECT custom_plans, generic_plans FROM pg_prepared_statements \
                 WHERE statement = $1",
                &[&sql],
            )
            .await
            .expect("plan counts");
        (row.get(0), row.get(1))
    }

    // Proves the lookups a claim or report of one job makes keep one plan per connection: the
    // one-id statements are planned a few times and then reuse a generic plan, while the
    // `unnest` form of the same lookup is planned on every call (planning was 45 % of
    // PostgreSQL's statement time in a `latency` run before one job took the one-id forms).
    #[tokio::test]
    async fn one_id_lookups_keep_their_plan() {
        let db = PgCluster::shared().database().await;
        let store = PgStore::open(PgOptions::new(db.url())).await.expect("open");
        let client = crate::pgtest::connect(db.url()).await.expect("connect");
        // The job locks read no table: their array form keeps its plan too.
        let one_id = [
            rows::JOB_BY_ID_SQL,
            rows::STEPS_OF_JOB,
            super::super::jobs::LOCK_ONE_JOB_SQL,
            super::super::jobs::LOCK_JOBS_SQL,
            FIND_ONE_LEASE_SQL,
        ];
        for sql in one_id {
            let (custom, generic) = plans_of(&client, sql, 20).await;
            assert!(
                custom <= 5 && generic >= 15,
                "planned {custom} times, reused {generic} times: {sql}"
            );
        }
        for sql in [rows::JOBS_BY_IDS_SQL, FIND_LEASES_SQL] {
            let (custom, generic) = plans_of(&client, sql, 20).await;
            assert_eq!((custom, generic), (20, 0), "the unnest form: {sql}");
        }
        drop(store);
    }
}
