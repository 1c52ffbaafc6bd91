//! Jobs through the core: submit, apply, claim, and the queries that find work.

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use overseer_core::{Command, Effect, Job, JobId, JobState, Rejection, Timestamp, Transition};
use uuid::Uuid;

use super::rows::{self, corrupt, get, limit_param, query, query_opt, Lock};
use super::{control, job_ids, listen, param_refs, DynParams, Failure, Res, TERMINAL};
use crate::{
    Claim, ClaimResult, Claimed, Error, JobQuery, LeaseRef, LeaseReport, NewJob, OrderingKeyStatus,
    Reported, Submitted,
};

/// Stores what the core decided at `now`: the job row, the changed steps, the new history, the
/// deliveries its durable effects call for, and the notifications other nodes should hear, all in
/// the caller's transaction.
pub(super) async fn persist(
    tx: &Transaction<'_>,
    t: &Transition,
    now: Timestamp,
    history_per_job: usize,
) -> Res<()> {
    // Independent statements, sent together (pipelined) and answered together.
    let signals = signals_of(t);
    futures::try_join!(
        async {
            match t.job_changed {
                true => rows::update_job(tx, &t.job).await,
                false => Ok(()),
            }
        },
        rows::write_steps(tx, &t.job, t.changed_steps.iter().copied()),
        rows::append_events(tx, t.job.id, &t.events, history_per_job),
        rows::insert_deliveries(tx, t, now),
        notify(tx, &signals),
    )?;
    Ok(())
}

/// The notifications a committed transition should send to other nodes.
fn signals_of(t: &Transition) -> Vec<String> {
    let mut out = Vec::new();
    for effect in &t.effects {
        match effect {
            Effect::Ready { agent } => out.push(format!("ready:{agent}")),
            Effect::ReadyAt { at, .. } => out.push(format!("due:{}", at.as_millis())),
            // The next job of its key, if any, was started by the same transaction.
            Effect::Finished { .. } => out.push(format!("finished:{}", t.job.id)),
            Effect::Alert { .. } | Effect::Callback { .. } => {}
        }
    }
    out
}

/// Queues notifications, delivered by PostgreSQL when (and only if) the transaction commits.
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
    if payloads.is_empty() {
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

/// Loads a job under `FOR UPDATE`, applies a command through the core, and stores the
/// transition. A claim also records its lease so the lease id stays resolvable after later
/// attempts.
/// Applies lease holders' reports in one transaction, each as `lease_find` + `apply_command`
/// would. Jobs are locked in id order whatever the order of the reports, so two batches that
/// share jobs wait for each other instead of deadlocking; answers come back in report order.
pub(super) async fn report_leases(
    tx: &Transaction<'_>,
    reports: &[(overseer_core::LeaseId, LeaseReport)],
    now: Timestamp,
    history_per_job: usize,
) -> Res<Vec<Reported>> {
    // Sent together (pipelined on the connection) rather than one round trip each.
    let leases = futures::future::try_join_all(
        reports
            .iter()
            .map(|(lease_id, _)| rows::find_lease(tx, *lease_id)),
    )
    .await?;
    let mut order: Vec<usize> = (0..reports.len()).collect();
    // Stable: two reports of one lease keep their order, so the second is the one refused.
    order.sort_by_key(|&i| leases[i].map(|l| l.job_id));
    let mut out: Vec<Option<Reported>> = (0..reports.len()).map(|_| None).collect();
    for i in order {
        let (lease_id, report) = &reports[i];
        let Some(lease) = leases[i] else {
            out[i] = Some(Err(Error::LeaseNotFound(*lease_id)));
            continue;
        };
        let command = report.clone().command(lease.step, lease.attempt);
        out[i] = Some(
            match apply_command(tx, lease.job_id, command, now, history_per_job).await {
                Ok(t) => Ok((lease, t)),
                // Refused before anything was written: this report only.
                Err(Failure::Store(e @ (Error::Rejected(_) | Error::JobNotFound(_)))) => Err(e),
                Err(f) => return Err(f),
            },
        );
    }
    Ok(out
        .into_iter()
        .map(|o| o.expect("every report is answered"))
        .collect())
}

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
async fn start_next_head(
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
    let claim = match &command {
        Command::Claim {
            step,
            lease_id,
            worker,
        } => Some((*step, *lease_id, worker.clone())),
        _ => None,
    };
    let t = overseer_core::apply(job, command, now)?;
    let lease = match claim {
        Some((step, lease_id, worker)) => {
            let attempt = t.job.steps.get(step).map(|s| s.attempt).ok_or_else(|| {
                corrupt(
                    "transition",
                    format!("claimed step {step} is missing from job {}", job.id),
                )
            })?;
            let lease = LeaseRef {
                lease_id,
                job_id: job.id,
                step,
                attempt,
            };
            Some((lease, worker))
        }
        None => None,
    };
    futures::try_join!(persist(tx, &t, now, history_per_job), async {
        match &lease {
            Some((lease, worker)) => rows::insert_lease(tx, lease, worker, now).await,
            None => Ok(()),
        }
    })?;
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

/// Inserts jobs all-or-nothing (see [`crate::Store::jobs_submit`]).
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
    let mut out = Vec::with_capacity(jobs.len());
    for (index, new) in jobs.iter().enumerate() {
        out.push(submit_one(tx, index, new, history_per_job).await?);
    }
    Ok(out)
}

/// Inserts one job (its ordering key already locked), or finds the job holding its idempotency
/// key: earlier jobs of the same batch included, as they are inserted in this transaction.
pub(super) async fn submit_one(
    tx: &Transaction<'_>,
    index: usize,
    new: &NewJob,
    history_per_job: usize,
) -> Res<Submitted> {
    let job = &new.transition.job;
    let Some(seq) = rows::insert_job_row(tx, job).await? else {
        let key = job.idempotency_key.as_deref().ok_or_else(|| {
            corrupt(
                "jobs",
                format!("job {} conflicts without an idempotency key", job.id),
            )
        })?;
        let row = query_opt(
            tx,
            "SELECT id, fingerprint FROM jobs WHERE idempotency_key = $1",
            &[&key],
        )
        .await?
        .ok_or_else(|| {
            Failure::Retry(format!("the job holding idempotency key `{key}` vanished"))
        })?;
        let existing = JobId(get(&row, 0, "jobs.id")?);
        let fingerprint: String = get(&row, 1, "jobs.fingerprint")?;
        if fingerprint != job.fingerprint {
            return Err(Failure::Store(Error::IdempotencyConflict {
                index,
                key: key.to_string(),
                existing,
            }));
        }
        let stored = rows::load_job(tx, existing, Lock::None)
            .await?
            .ok_or_else(|| Failure::Retry(format!("job {existing} vanished during a submit")))?;
        return Ok(Submitted::Existing(stored));
    };
    // An admission has no command time of its own: the job was last updated by it.
    let now = job.updated_at;
    let signals = signals_of(&new.transition);
    futures::try_join!(
        rows::insert_job_parts(tx, job),
        rows::append_events(tx, job.id, &new.transition.events, history_per_job),
        rows::insert_deliveries(tx, &new.transition, now),
        notify(tx, &signals),
    )?;
    // A keyed job heading its key starts in this same transaction.
    let t = admit_keyed(tx, new.transition.clone(), seq, history_per_job).await?;
    Ok(Submitted::Created(t))
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
    let job = &admission.job;
    let at = job.created_at;
    let Some(key) = job.ordering_key.as_deref() else {
        return Ok(admission);
    };
    let due = job.run_at.is_none_or(|t| t <= at);
    if job.state != JobState::Pending || !due || !is_head(tx, key, seq).await? {
        return Ok(admission);
    }
    let activation = overseer_core::apply(job, Command::Activate, at)?;
    persist(tx, &activation, at, history_per_job).await?;
    Ok(admission.then(activation))
}

/// Candidates skipped by one claim before it gives up looking further: bounds the work a claim
/// does if many ready rows turn out not to be claimable.
const CLAIM_SKIPS_MAX: usize = 1_000;

/// Leases up to `claim.lease_ids.len()` claimable steps (see [`crate::Store::steps_claim`]).
pub(super) async fn claim(
    tx: &Transaction<'_>,
    claim: &Claim,
    history_per_job: usize,
) -> Res<ClaimResult> {
    let limits = control::claim_limits(tx, &claim.agent, claim.lease_ids.len(), claim.now).await?;
    let want = limits.want.min(claim.lease_ids.len());
    let mut claimed: Vec<Claimed> = Vec::with_capacity(want);
    // Steps the core refused (or that do not decode): left out of later rounds.
    let mut skipped_jobs: Vec<Uuid> = Vec::new();
    let mut skipped_steps: Vec<i32> = Vec::new();
    // Jobs this claim has locked, as they now stand: under the lock they cannot change behind
    // its back, so two steps of one job are claimed one after the other from one load.
    let mut loaded: HashMap<Uuid, Job> = HashMap::new();
    while claimed.len() < want && skipped_steps.len() < CLAIM_SKIPS_MAX {
        let limit = (want - claimed.len()) as i64;
        let rows = query(
            tx,
            LOCK_CANDIDATES_SQL,
            &[
                &claim.agent,
                &claim.now.as_millis(),
                &limit,
                &skipped_jobs,
                &skipped_steps,
            ],
        )
        .await?;
        if rows.is_empty() {
            break;
        }
        let mut candidates = Vec::with_capacity(rows.len());
        for row in &rows {
            candidates.push((
                get::<Uuid>(row, 0, "steps.job_id")?,
                get::<i32>(row, 1, "steps.idx")?,
            ));
        }
        let mut unloaded: Vec<JobId> = Vec::new();
        for (job, _) in &candidates {
            if !loaded.contains_key(job) && !unloaded.contains(&JobId(*job)) {
                unloaded.push(JobId(*job));
            }
        }
        for job in load_locked(tx, &unloaded).await? {
            loaded.insert(job.id.0, job);
        }
        for (job_uuid, idx) in candidates {
            let Some(&lease_id) = claim.lease_ids.get(claimed.len()) else {
                break;
            };
            let step = rows::to_usize("steps.idx", idx)?;
            let Some(job) = loaded.get(&job_uuid) else {
                // It does not decode (logged when loading): one bad job must not stall every
                // claim of its agent.
                skipped_jobs.push(job_uuid);
                skipped_steps.push(idx);
                continue;
            };
            let command = Command::Claim {
                step,
                lease_id,
                worker: claim.worker.clone(),
            };
            match apply_loaded(tx, job, command, claim.now, history_per_job).await {
                Ok(transition) => {
                    loaded.insert(job_uuid, transition.job.clone());
                    claimed.push(Claimed { step, transition });
                }
                // The core has the last word on claimability; a refused candidate changed nothing.
                Err(Failure::Store(Error::Rejected(_))) => {
                    skipped_jobs.push(job_uuid);
                    skipped_steps.push(idx);
                }
                Err(e) => return Err(e),
            }
        }
    }
    // The bucket held the claim back if it ran dry before the claim's other bounds and
    // claimable work is left over (work another transaction holds counts: it is claimable).
    let has_more = limits.ran_dry(claimed.len()) && {
        let left = query(
            tx,
            CANDIDATES_SQL,
            &[
                &claim.agent,
                &claim.now.as_millis(),
                &skipped_jobs,
                &skipped_steps,
            ],
        )
        .await?;
        !left.is_empty()
    };
    let throttled_until =
        control::claim_spend(tx, &claim.agent, &limits, claimed.len(), has_more).await?;
    Ok(ClaimResult {
        claimed,
        throttled_until,
    })
}

/// The claimable steps of an agent that are due, best claim rank first (one ordered range of
/// the `steps_claim` index), leaving out the steps in `($4, $5)`, locking each one's job row as
/// it goes and passing over jobs another transaction holds (`SKIP LOCKED`): claimers never wait
/// for each other, and the server skips held jobs without a round trip per job.
const LOCK_CANDIDATES_SQL: &str = "SELECT s.job_id, s.idx FROM steps s \
     JOIN jobs j ON j.id = s.job_id \
     WHERE s.claim_agent = $1 AND s.next_attempt_at <= $2 \
       AND (s.job_id, s.idx) NOT IN ( \
         SELECT sj, si FROM unnest($4::uuid[], $5::integer[]) AS skipped (sj, si)) \
     ORDER BY s.claim_rank, s.job_id, s.idx LIMIT $3 \
     FOR UPDATE OF j SKIP LOCKED";

/// Whether any claimable step of the agent is due, locked or not, leaving out `($3, $4)`.
const CANDIDATES_SQL: &str = "SELECT 1 FROM steps \
     WHERE claim_agent = $1 AND next_attempt_at <= $2 \
       AND (job_id, idx) NOT IN ( \
         SELECT sj, si FROM unnest($3::uuid[], $4::integer[]) AS skipped (sj, si)) \
     LIMIT 1";

/// Loads jobs this transaction has locked, in one go; if one does not decode, loads them one by
/// one and leaves out (and logs) the ones that do not.
async fn load_locked(tx: &Transaction<'_>, ids: &[JobId]) -> Res<Vec<Job>> {
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

/// The earliest instant something becomes due. Past instants count only where the leader's sweep
/// clears them: a pending job without a key, an expired lease, a schedule's due time. A keyed job
/// waiting behind its head, or a retry already due, counts only while still in the future, or
/// the supervisor would wake again at once for something it cannot act on.
pub(super) async fn next_due_at(tx: &Transaction<'_>, now: Timestamp) -> Res<Option<Timestamp>> {
    let row = rows::query_one(
        tx,
        "SELECT LEAST( \
           (SELECT MIN(run_at) FROM jobs WHERE state = 'pending' AND ordering_key IS NULL), \
           (SELECT MIN(COALESCE(run_at, created_at)) FROM jobs \
              WHERE state = 'pending' AND COALESCE(run_at, created_at) > $1), \
           (SELECT MIN(next_attempt_at) FROM steps \
              WHERE claim_agent IS NOT NULL AND next_attempt_at > $1), \
           (SELECT MIN(lease_expires_at) FROM steps WHERE lease_expires_at IS NOT NULL), \
           (SELECT MIN(next_fire_at) FROM schedules WHERE NOT paused))",
        &[&now.as_millis()],
    )
    .await?;
    let due: Option<i64> = get(&row, 0, "next due")?;
    Ok(due.map(Timestamp::from_millis))
}

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
    let waiting = match head {
        Some(_) => rows::to_u64("ordering key waiting", unfinished)?.saturating_sub(1),
        None => 0,
    };
    Ok(OrderingKeyStatus {
        key: key.to_string(),
        head,
        waiting,
    })
}
