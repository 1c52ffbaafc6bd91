//! Jobs through the core: submit, apply, the queries that find them, and ordering keys.

use std::collections::HashMap;

use super::tx::Transaction;
use overseer_core::{
    Command, Effect, Event, Job, JobId, JobState, Rejection, Timestamp, Transition,
};
use uuid::Uuid;

use super::leader::check_fence;
use super::rows::{self, corrupt, get, limit_param, query, query_opt, Lock};
use super::{
    inserts, job_ids, listen, param_refs, removal, rerun, stats, writes, DynParams, Failure,
    PgStore, Res, TERMINAL,
};
use crate::decide;
use crate::{
    ActivePage, Apply, Due, Error, EventPage, FinishedCount, JobQuery, Jobs, NewJob,
    OrderingKeyStatus, Removal, Replacement, Reran, RerunJob, StateCount, Submitted, Window,
};

/// Stores what the core decided at `now` (see `writes::persist_all`).
pub(super) async fn persist(
    tx: &Transaction<'_>,
    t: &Transition,
    now: Timestamp,
    history_per_job: usize,
) -> Res<()> {
    writes::persist_all(tx, &[t], now, history_per_job).await
}

/// The notifications a committed transition should send to other nodes.
pub(super) fn signals_of(t: &Transition) -> Vec<String> {
    let mut out = Vec::new();
    for effect in &t.effects {
        match effect {
            Effect::Ready { agent } => out.push(format!("ready:{agent}")),
            Effect::ReadyAt { at, .. } | Effect::Due { at } => {
                out.push(format!("due:{}", at.as_millis()))
            }
            // The next job of its key, if any, was started by the same transaction.
            Effect::Finished { .. } => out.push(format!("finished:{}", t.job.id)),
            Effect::Alert { .. } | Effect::Callback { .. } => {}
        }
    }
    out
}

/// Announces `payloads` to every node once the transaction commits, and only if it does: after
/// the commit, by the store's sender, inside a write (see `announce`); else with the
/// transaction itself.
pub(super) async fn notify(tx: &Transaction<'_>, payloads: &[String]) -> Res<()> {
    let payloads: Vec<&str> = payloads
        .iter()
        .map(String::as_str)
        .filter(|p| {
            let fits = p.len() <= listen::PAYLOAD_MAX;
            if !fits {
                // Too long to send (a huge agent name): nodes find the work by polling instead.
                tracing::warn!(
                    bytes = p.len(),
                    "a notification is too long to send; skipped"
                );
            }
            fits
        })
        .collect();
    if payloads.is_empty() || super::announce::defer(&payloads) {
        return Ok(());
    }
    query(
        tx,
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        &[&listen::CHANNEL, &payloads],
    )
    .await?;
    Ok(())
}

/// Takes the locks of the jobs with the given ids ([`job_lock_key`], waiting, in id order) and
/// loads each job once, in id order: the statements are sent together and run in order, so the
/// rows are read after every lock is granted.
pub(super) async fn lock_and_load(tx: &Transaction<'_>, ids: &[JobId]) -> Res<Vec<Job>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let uuids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
    let lock = rows::query_ids(tx, &uuids, LOCK_ONE_JOB_SQL, LOCK_JOBS_SQL);
    let (_, jobs) = futures::try_join!(lock, load_locked(tx, &ids))?;
    Ok(jobs)
}

/// The key of a job's lock: a transaction-level advisory lock on a 64-bit hash of its id, held until the
/// transaction ends. Every write of a job's rows (or of its steps') holds it: claims take it
/// without waiting ([`super::leases`] passes over jobs another transaction holds), reports and
/// every other write of an existing job wait for it (`rows::load_job` with `Lock::Update` also
/// locks the row, for the writes that delete it or link it). Unlike a row lock it writes
/// nothing: a row lock marks the tuple and logs it, which at a claim and at a report cost two
/// log records and a dirtied `jobs` page per job (BENCHMARKS.md, fortieth session). Ordering
/// keys' locks (`lock_ordering_keys`) hash text, so the two never meet but by a 64-bit
/// collision, which would only make one wait for the other.
macro_rules! job_lock_key {
    ($id:literal) => {
        concat!("uuid_hash_extended(", $id, ", 0)")
    };
}
pub(super) use job_lock_key;

/// Takes one job's lock ([`job_lock_key`]), waiting for it.
pub(super) const LOCK_ONE_JOB_SQL: &str = concat!(
    "SELECT pg_advisory_xact_lock(",
    job_lock_key!("$1::uuid"),
    ")"
);

/// Takes the locks of the jobs `$1`, in its order (ids sorted, so two batches sharing jobs wait
/// for each other instead of deadlocking).
pub(super) const LOCK_JOBS_SQL: &str = concat!(
    "SELECT pg_advisory_xact_lock(",
    job_lock_key!("w.id"),
    ") FROM unnest($1::uuid[]) AS w (id)"
);

pub(super) async fn apply_command(
    tx: &Transaction<'_>,
    id: JobId,
    command: Command,
    now: Timestamp,
    history_per_job: usize,
) -> Res<Transition> {
    let job = rows::load_job(tx, id, Lock::Update)
        .await?
        .ok_or(Failure::Store(Error::JobNotFound(id)))?;
    // The core knows nothing of the job's key; a keyed job not heading it is not due yet.
    if command == Command::Activate && !may_start(tx, &job).await? {
        return Err(Rejection::NotDue.into());
    }
    let mut t = apply_loaded(tx, &job, command, now, history_per_job).await?;
    if let Some(key) = t.freed_ordering_key() {
        if let Some(next) = start_next_head(tx, key, now, history_per_job).await? {
            t.absorb_wakeups(&next);
        }
    }
    Ok(t)
}

/// The unfinished job of `key` with the smallest submission number.
async fn head_id(tx: &Transaction<'_>, key: &str) -> Res<Option<JobId>> {
    let row = query_opt(
        tx,
        &format!(
            "SELECT id FROM jobs WHERE ordering_key = $1 AND state NOT IN {TERMINAL} \
             ORDER BY seq LIMIT 1"
        ),
        &[&key],
    )
    .await?;
    match row {
        Some(row) => Ok(Some(JobId(get(&row, 0, "jobs.id")?))),
        None => Ok(None),
    }
}

/// After a job of `key` finished (see `Transition::freed_ordering_key`): starts the key's new
/// head at `now` if it is pending and due, in the caller's transaction, under the key's advisory
/// lock so a submit of the same key on another node waits for this decision. A head that is not
/// due yet is left to the leader's timer.
pub(super) async fn start_next_head(
    tx: &Transaction<'_>,
    key: &str,
    now: Timestamp,
    history_per_job: usize,
) -> Res<Option<Transition>> {
    lock_ordering_keys(tx, vec![key]).await?;
    let Some(id) = head_id(tx, key).await? else {
        return Ok(None);
    };
    let job = rows::load_job(tx, id, Lock::Update)
        .await?
        .ok_or_else(|| corrupt("jobs", format!("job {id} vanished during a write")))?;
    match overseer_core::apply(&job, Command::Activate, now) {
        Ok(t) => {
            persist(tx, &t, now, history_per_job).await?;
            Ok(Some(t))
        }
        Err(Rejection::NotDue) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether no unfinished job of `key` was submitted before `seq`.
async fn is_head(tx: &Transaction<'_>, key: &str, seq: i64) -> Res<bool> {
    let ahead = query_opt(
        tx,
        &format!(
            "SELECT 1 FROM jobs WHERE ordering_key = $1 AND seq < $2 \
             AND ordering_key IS NOT NULL AND state NOT IN {TERMINAL} LIMIT 1"
        ),
        &[&key, &seq],
    )
    .await?;
    Ok(ahead.is_none())
}

/// Whether `job` may start as far as its key goes: it has none, or heads it. Checked before an
/// `Activate`, so even a stray one cannot start a job while another of its key is unfinished.
async fn may_start(tx: &Transaction<'_>, job: &Job) -> Res<bool> {
    let Some(key) = job.ordering_key.as_deref() else {
        return Ok(true);
    };
    let row = query_opt(tx, "SELECT seq FROM jobs WHERE id = $1", &[&job.id.0])
        .await?
        .ok_or(Failure::Store(Error::JobNotFound(job.id)))?;
    is_head(tx, key, get(&row, 0, "jobs.seq")?).await
}

/// Applies a command to a job this transaction has locked and loaded.
async fn apply_loaded(
    tx: &Transaction<'_>,
    job: &Job,
    command: Command,
    now: Timestamp,
    history_per_job: usize,
) -> Res<Transition> {
    let t = overseer_core::apply(job, command, now)?;
    persist(tx, &t, now, history_per_job).await?;
    Ok(t)
}

/// Takes the advisory locks of every ordering key among `jobs`, in one fixed order (by lock id)
/// so two batches sharing keys cannot deadlock. Held until the transaction ends.
pub(super) async fn lock_ordering_keys(tx: &Transaction<'_>, keys: Vec<&str>) -> Res<()> {
    if keys.is_empty() {
        return Ok(());
    }
    query(
        tx,
        "SELECT pg_advisory_xact_lock(h) FROM ( \
           SELECT DISTINCT hashtextextended(k, 0) AS h FROM unnest($1::text[]) AS k ORDER BY h \
         ) AS locks",
        &[&keys],
    )
    .await?;
    Ok(())
}

/// Inserts jobs all-or-nothing (see [`crate::Jobs::jobs_submit`]).
pub(super) async fn submit(
    tx: &Transaction<'_>,
    jobs: &[NewJob],
    history_per_job: usize,
) -> Res<Vec<Submitted>> {
    let keys = jobs
        .iter()
        .filter_map(|n| n.transition.job.ordering_key.as_deref())
        .collect();
    lock_ordering_keys(tx, keys).await?;
    let jobs: Vec<&NewJob> = jobs.iter().collect();
    submit_locked(tx, &jobs, 0, history_per_job).await
}

/// Inserts one job (its ordering key already locked), or finds the job holding its idempotency
/// key; `index` is its place in the caller's batch, for errors.
pub(super) async fn submit_one(
    tx: &Transaction<'_>,
    index: usize,
    new: &NewJob,
    history_per_job: usize,
) -> Res<Submitted> {
    let mut out = submit_locked(tx, &[new], index, history_per_job).await?;
    out.pop()
        .ok_or_else(|| corrupt("jobs", "a submit of one job answered nothing"))
}

/// Inserts jobs whose ordering keys are locked, in a constant number of statements, or finds the
/// jobs holding their idempotency keys (earlier jobs of the same batch included, as they are
/// inserted by the same statement). Keyed jobs heading their key start in this transaction, in
/// batch order. `first_index` numbers the jobs in errors.
async fn submit_locked(
    tx: &Transaction<'_>,
    jobs: &[&NewJob],
    first_index: usize,
    history_per_job: usize,
) -> Res<Vec<Submitted>> {
    let seqs = inserts::insert_job_rows(tx, jobs, history_per_job).await?;
    let is_new = |n: &&NewJob| seqs.contains_key(&n.transition.job.id.0);
    let new: Vec<&NewJob> = jobs.iter().copied().filter(is_new).collect();
    let signals = inserts::signals(&new);
    // An admission has no command time of its own: the job was last updated by it.
    let deliveries = new
        .iter()
        .map(|n| rows::insert_deliveries(tx, &n.transition, n.transition.job.updated_at));
    futures::try_join!(
        inserts::insert_job_parts(tx, &new),
        futures::future::try_join_all(deliveries),
        notify(tx, &signals),
    )?;
    let mut out: Vec<Option<Submitted>> = Vec::with_capacity(jobs.len());
    for n in jobs {
        let created = match seqs.get(&n.transition.job.id.0) {
            // A keyed job heading its key starts in this same transaction.
            Some(&seq) => Some(Submitted::Created(
                admit_keyed(tx, n.transition.clone(), seq, history_per_job).await?,
            )),
            None => None,
        };
        out.push(created);
    }
    if new.len() < jobs.len() {
        find_existing(tx, jobs, first_index, &mut out).await?;
    }
    Ok(out.into_iter().flatten().collect())
}

/// Fills in the jobs of a batch that were not inserted (`None` in `out`) with the stored jobs
/// holding their idempotency keys, or fails the whole batch with the first conflicting one.
async fn find_existing(
    tx: &Transaction<'_>,
    jobs: &[&NewJob],
    first_index: usize,
    out: &mut [Option<Submitted>],
) -> Res<()> {
    let taken: Vec<&NewJob> = (0..jobs.len())
        .filter(|&i| out[i].is_none())
        .map(|i| jobs[i])
        .collect();
    let holders = inserts::key_holders(tx, &taken).await?;
    let mut wanted: Vec<(usize, JobId)> = Vec::with_capacity(taken.len());
    for (i, n) in jobs.iter().enumerate().filter(|(i, _)| out[*i].is_none()) {
        let job = &n.transition.job;
        let key = job.idempotency_key.as_deref().ok_or_else(|| {
            corrupt(
                "jobs",
                format!("job {} conflicts without an idempotency key", job.id),
            )
        })?;
        let (existing, fingerprint) = holders.get(key).ok_or_else(|| {
            Failure::Retry(format!("the job holding idempotency key `{key}` vanished"))
        })?;
        let existing = decide::key_holder(first_index + i, job, (*existing, fingerprint))
            .map_err(Failure::Store)?;
        wanted.push((i, existing));
    }
    let ids: Vec<JobId> = wanted.iter().map(|(_, id)| *id).collect();
    let stored: HashMap<JobId, Job> = rows::load_jobs(tx, &ids)
        .await?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    for (i, id) in wanted {
        let job = stored
            .get(&id)
            .cloned()
            .ok_or_else(|| Failure::Retry(format!("job {id} vanished during a submit")))?;
        out[i] = Some(Submitted::Existing(job));
    }
    Ok(())
}

/// After inserting an admitted job with submission number `seq`: if it is keyed, pending, due at
/// its admission (`run_at` none or not after `created_at`) and heads its key, starts it through
/// the core at `created_at` and stores that too. The key's advisory lock is held, so no other
/// node decides about this key meanwhile. Answers the submit's transition: the admission alone,
/// or the admission followed by the activation (the activated job, both histories in order,
/// both effects).
async fn admit_keyed(
    tx: &Transaction<'_>,
    admission: Transition,
    seq: i64,
    history_per_job: usize,
) -> Res<Transition> {
    match decide::waits_on_key(&admission) {
        Some(key) if is_head(tx, key, seq).await? => {}
        _ => return Ok(admission),
    }
    let activation = decide::head_starts(&admission)?;
    persist(tx, &activation, admission.job.created_at, history_per_job).await?;
    Ok(admission.then(activation))
}

/// Loads jobs this transaction has locked, in one go; if one does not decode, loads them one by
/// one and leaves out (and logs) the ones that do not.
pub(super) async fn load_locked(tx: &Transaction<'_>, ids: &[JobId]) -> Res<Vec<Job>> {
    match rows::load_jobs(tx, ids).await {
        Err(Failure::Store(Error::Corrupt(_))) => {}
        other => return other,
    }
    let mut jobs = Vec::with_capacity(ids.len());
    for &id in ids {
        match rows::load_job(tx, id, Lock::None).await {
            Ok(Some(job)) => jobs.push(job),
            Ok(None) => {}
            Err(Failure::Store(e @ Error::Corrupt(_))) => {
                tracing::error!(job = %id, error = %e, "skipping an unclaimable job");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(jobs)
}

pub(super) async fn list(tx: &Transaction<'_>, q: &JobQuery) -> Res<Vec<Job>> {
    let (sql, filters) = crate::filter::job_list_sql(q);
    let sql = crate::filter::numbered(&sql);
    let mut params: DynParams = filters
        .into_iter()
        .map(|a| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
            match a {
                // As stored (see `rows::text`).
                crate::filter::Arg::Text(t) => Box::new(rows::text(&t).into_owned()),
                crate::filter::Arg::Id(id) => Box::new(id.0),
                crate::filter::Arg::Millis(ms) => Box::new(ms),
            }
        })
        .collect();
    params.push(Box::new(limit_param(q.limit)));
    let rows = query(tx, &sql, &param_refs(&params)).await?;
    let ids = job_ids(&rows, "jobs.id")?;
    rows::load_jobs(tx, &ids).await
}

/// Pending jobs whose `run_at` has come (a keyed job without one is due at once) and that head
/// their ordering key or have none, earliest first.
pub(super) async fn due(tx: &Transaction<'_>, now: Timestamp, limit: usize) -> Res<Vec<JobId>> {
    let rows = query(
        tx,
        &format!(
            "SELECT j.id FROM jobs j \
             WHERE j.state = 'pending' AND COALESCE(j.run_at, j.created_at) <= $1 \
               AND (j.ordering_key IS NULL OR NOT EXISTS ( \
                 SELECT 1 FROM jobs o WHERE o.ordering_key = j.ordering_key \
                   AND o.seq < j.seq AND o.ordering_key IS NOT NULL \
                   AND o.state NOT IN {TERMINAL})) \
             ORDER BY COALESCE(j.run_at, j.created_at), j.id LIMIT $2"
        ),
        &[&now.as_millis(), &limit_param(limit)],
    )
    .await?;
    job_ids(&rows, "jobs.id")
}

/// Jobs whose enforced deadline has come, earliest first (see `Jobs::jobs_past_deadline`).
pub(super) async fn past_deadline(
    tx: &Transaction<'_>,
    now: Timestamp,
    limit: usize,
) -> Res<Vec<JobId>> {
    let rows = query(
        tx,
        "SELECT id FROM jobs WHERE deadline_due IS NOT NULL AND deadline_due <= $1 \
         ORDER BY deadline_due, id LIMIT $2",
        &[&now.as_millis(), &limit_param(limit)],
    )
    .await?;
    job_ids(&rows, "jobs.id")
}

/// The earliest instant something becomes due. Past instants count only where the leader's sweep
/// clears them: a pending job without a key, an expired lease, a schedule's due time. A keyed job
/// waiting behind its head, or a retry already due, counts only while still in the future, or
/// the supervisor would wake again at once for something it cannot act on.
pub(super) async fn next_due_at(tx: &Transaction<'_>, now: Timestamp) -> Res<Option<Timestamp>> {
    let row = rows::query_one(tx, NEXT_DUE_SQL, &[&now.as_millis()]).await?;
    let due: Option<i64> = get(&row, 0, "next due")?;
    Ok(due.map(Timestamp::from_millis))
}

/// The earliest instant the supervisor must act at (see [`next_due_at`]); the next lease to
/// end is the earliest of each leasing agent's first.
const NEXT_DUE_SQL: &str = concat!(
    leasing_agents!(),
    ", lease_ends (at) AS (SELECT min(e.at) FROM leasing l CROSS JOIN LATERAL ( \
       SELECT lease_expires_at AS at FROM steps \
       WHERE lease_agent = l.agent AND lease_expires_at IS NOT NULL \
       ORDER BY lease_expires_at LIMIT 1) e) \
     SELECT LEAST( \
           (SELECT MIN(run_at) FROM jobs WHERE state = 'pending' AND ordering_key IS NULL), \
           (SELECT MIN(COALESCE(run_at, created_at)) FROM jobs \
              WHERE state = 'pending' AND COALESCE(run_at, created_at) > $1), \
           (SELECT MIN(next_attempt_at) FROM steps \
              WHERE claim_agent IS NOT NULL AND next_attempt_at > ready_at \
                AND next_attempt_at > $1), \
           (SELECT at FROM lease_ends), \
           (SELECT MIN(deadline_due) FROM jobs WHERE deadline_due IS NOT NULL), \
           (SELECT MIN(next_fire_at) FROM schedules WHERE NOT paused))"
);

/// The head of `key` (its unfinished job submitted first) and how many unfinished jobs of the key
/// wait behind it.
pub(super) async fn ordering_key_status(tx: &Transaction<'_>, key: &str) -> Res<OrderingKeyStatus> {
    let head = match head_id(tx, key).await? {
        Some(id) => Some(
            rows::load_job(tx, id, Lock::None)
                .await?
                .ok_or_else(|| corrupt("jobs", format!("job {id} vanished during a read")))?,
        ),
        None => None,
    };
    let row = rows::query_one(
        tx,
        &format!("SELECT count(*) FROM jobs WHERE ordering_key = $1 AND state NOT IN {TERMINAL}"),
        &[&key],
    )
    .await?;
    let unfinished: i64 = get(&row, 0, "count")?;
    let unfinished = rows::to_u64("ordering key waiting", unfinished)?;
    Ok(decide::ordering_key_status(key, head, unfinished))
}

/// Unfinished jobs in id order, for the supervisor's repair: one range of `jobs_state_id` per
/// unfinished state, each stopped at the page's size, merged by id.
static ACTIVE_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let arms: Vec<String> = JobState::unfinished()
        .map(|s| {
            format!("(SELECT id FROM jobs WHERE state = '{s}' AND id > $1 ORDER BY id LIMIT $2)")
        })
        .collect();
    format!("{} ORDER BY id LIMIT $2", arms.join(" UNION ALL "))
});

#[async_trait::async_trait]
impl Jobs for PgStore {
    async fn jobs_submit(&self, jobs: Vec<NewJob>) -> crate::Result<Vec<Submitted>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let history = self.inner.history_per_job;
        let jobs = &jobs;
        self.write(move |tx, _| Box::pin(submit(tx, jobs, history)))
            .await
    }

    async fn job_get(&self, id: JobId) -> crate::Result<Option<Job>> {
        self.read(move |tx, _| Box::pin(rows::load_job(tx, id, Lock::None)))
            .await
    }

    async fn jobs_list(&self, query: JobQuery) -> crate::Result<Vec<Job>> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let query = &query;
        self.read(move |tx, _| Box::pin(list(tx, query))).await
    }

    async fn job_events(&self, page: EventPage) -> crate::Result<Vec<Event>> {
        let EventPage {
            job: id,
            after_seq,
            limit,
        } = page;
        let keep = self.inner.history_per_job;
        self.read(move |tx, _| {
            Box::pin(async move {
                let events = rows::load_events(tx, id, after_seq, limit, keep).await?;
                if events.is_empty() {
                    let exists = query_opt(tx, "SELECT 1 FROM jobs WHERE id = $1", &[&id.0])
                        .await?
                        .is_some();
                    if !exists {
                        return Err(Failure::Store(Error::JobNotFound(id)));
                    }
                }
                Ok(events)
            })
        })
        .await
    }

    async fn job_apply(&self, apply: Apply) -> crate::Result<Transition> {
        let history = self.inner.history_per_job;
        let apply = &apply;
        self.write(move |tx, _| {
            Box::pin(async move {
                if let Some(fence) = &apply.fence {
                    check_fence(tx, fence, apply.now).await?;
                }
                let command = apply.command.clone();
                apply_command(tx, apply.job, command, apply.now, history).await
            })
        })
        .await
    }

    async fn jobs_due(&self, d: Due) -> crate::Result<Vec<JobId>> {
        self.read(move |tx, _| Box::pin(due(tx, d.now, d.limit)))
            .await
    }

    async fn jobs_active(&self, page: ActivePage) -> crate::Result<Vec<JobId>> {
        if page.limit == 0 {
            return Ok(Vec::new());
        }
        let after = page.after.map_or(Uuid::nil(), |a| a.0);
        self.read(move |tx, _| {
            Box::pin(async move {
                let rows = query(tx, &ACTIVE_SQL, &[&after, &limit_param(page.limit)]).await?;
                job_ids(&rows, "jobs.id")
            })
        })
        .await
    }

    async fn jobs_delete(&self, r: Removal) -> crate::Result<Vec<JobId>> {
        if r.ids.is_empty() {
            return Ok(Vec::new());
        }
        let r = &r;
        self.write(move |tx, _| Box::pin(removal::delete(tx, &r.ids, &r.states)))
            .await
    }

    async fn job_replace(&self, r: Replacement) -> crate::Result<Option<Transition>> {
        let history = self.inner.history_per_job;
        let r = &r;
        self.write(move |tx, _| Box::pin(removal::replace(tx, r.old, &r.states, &r.new, history)))
            .await
    }

    async fn job_rerun(&self, r: RerunJob) -> crate::Result<Reran> {
        let history = self.inner.history_per_job;
        let r = &r;
        self.write(move |tx, _| Box::pin(rerun::rerun(tx, r, history)))
            .await
    }

    async fn jobs_past_deadline(&self, d: Due) -> crate::Result<Vec<JobId>> {
        self.read(move |tx, _| Box::pin(past_deadline(tx, d.now, d.limit)))
            .await
    }

    async fn ordering_key_status(&self, key: &str) -> crate::Result<OrderingKeyStatus> {
        self.read(move |tx, _| Box::pin(ordering_key_status(tx, key)))
            .await
    }

    async fn jobs_count_by_state(&self) -> crate::Result<Vec<StateCount>> {
        self.read(move |tx, _| Box::pin(stats::count_by_state(tx)))
            .await
    }

    async fn jobs_finished_per_minute(&self, window: Window) -> crate::Result<Vec<FinishedCount>> {
        self.read(move |tx, _| Box::pin(stats::finished_per_minute(tx, window)))
            .await
    }
}
