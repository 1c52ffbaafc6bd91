//! Jobs through the core: submit, apply, claim, and the queries that find work.

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use overseer_core::{Command, Effect, Job, JobId, JobState, Rejection, Timestamp, Transition};
use uuid::Uuid;

use super::rows::{self, corrupt, get, limit_param, query, query_opt, Lock};
use super::{
    control, inserts, job_ids, listen, param_refs, writes, DynParams, Failure, Res, TERMINAL,
};
use crate::{
    Claim, ClaimResult, Claimed, Error, JobQuery, LeaseRef, LeaseReport, NewJob, OrderingKeyStatus,
    Reported, Submitted,
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

/// Applies lease holders' reports in one transaction, each as `lease_find` + `apply_command`
/// would, with a constant number of statements: the leases resolve in one, their jobs are locked
/// (in id order, so two batches sharing jobs wait for each other instead of deadlocking) and
/// loaded in three sent together, the core applies every report in memory (two reports of one
/// job one after the other), and the transitions are written together. Answers come back in
/// report order.
pub(super) async fn report_leases(
    tx: &Transaction<'_>,
    reports: &[(overseer_core::LeaseId, LeaseReport)],
    now: Timestamp,
    history_per_job: usize,
) -> Res<Vec<Reported>> {
    let ids: Vec<_> = reports.iter().map(|(id, _)| *id).collect();
    let leases = writes::find_leases(tx, &ids).await?;
    let job_ids: Vec<JobId> = leases.values().map(|l| l.job_id).collect();
    let mut jobs: HashMap<JobId, Job> = lock_and_load(tx, &job_ids)
        .await?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    let mut out: Vec<Option<Reported>> = (0..reports.len()).map(|_| None).collect();
    let mut applied: Vec<(usize, LeaseRef, Transition)> = Vec::new();
    for (i, (lease_id, report)) in reports.iter().enumerate() {
        let Some(&lease) = leases.get(lease_id) else {
            out[i] = Some(Err(Error::LeaseNotFound(*lease_id)));
            continue;
        };
        let Some(job) = jobs.get(&lease.job_id) else {
            out[i] = Some(Err(Error::JobNotFound(lease.job_id)));
            continue;
        };
        let command = report.clone().command(lease.step, lease.attempt);
        match overseer_core::apply(job, command, now) {
            Ok(t) => {
                jobs.insert(t.job.id, t.job.clone());
                applied.push((i, lease, t));
            }
            // Refused before anything was written: this report only.
            Err(e) => out[i] = Some(Err(Error::Rejected(e))),
        }
    }
    let transitions: Vec<&Transition> = applied.iter().map(|(_, _, t)| t).collect();
    writes::persist_all(tx, &transitions, now, history_per_job).await?;
    for (i, lease, mut t) in applied {
        if let Some(key) = t.freed_ordering_key() {
            if let Some(next) = start_next_head(tx, key, now, history_per_job).await? {
                t.absorb_wakeups(&next);
            }
        }
        out[i] = Some(Ok((lease, t)));
    }
    Ok(out
        .into_iter()
        .map(|o| o.expect("every report is answered"))
        .collect())
}

/// Locks the jobs with the given ids (`FOR UPDATE`, in id order) and loads them: the statements
/// are sent together and run in order, so the rows are read after every lock is granted.
async fn lock_and_load(tx: &Transaction<'_>, ids: &[JobId]) -> Res<Vec<Job>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut uuids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
    uuids.sort_unstable();
    uuids.dedup();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&uuids];
    let lock = query(
        tx,
        "SELECT j.id FROM unnest($1::uuid[]) AS w (id) \
         CROSS JOIN LATERAL (SELECT id FROM jobs WHERE id = w.id FOR UPDATE) j",
        &params,
    );
    let (_, jobs) = futures::try_join!(lock, load_locked(tx, ids))?;
    Ok(jobs)
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
    let leases = match &claim {
        Some((step, lease_id, _)) => vec![lease_of(&t, *step, *lease_id)?],
        None => Vec::new(),
    };
    let worker = claim.as_ref().map_or("", |(_, _, w)| w.as_str());
    futures::try_join!(
        persist(tx, &t, now, history_per_job),
        writes::insert_leases(tx, &leases, worker, now),
    )?;
    Ok(t)
}

/// The lease a claim transition of `step` handed out under `lease_id`.
fn lease_of(t: &Transition, step: usize, lease_id: overseer_core::LeaseId) -> Res<LeaseRef> {
    let attempt = t.job.steps.get(step).map(|s| s.attempt).ok_or_else(|| {
        corrupt(
            "transition",
            format!("claimed step {step} is missing from job {}", t.job.id),
        )
    })?;
    Ok(LeaseRef {
        lease_id,
        job_id: t.job.id,
        step,
        attempt,
    })
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
        inserts::insert_job_parts(tx, &new, history_per_job),
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
        if *fingerprint != job.fingerprint {
            return Err(Failure::Store(Error::IdempotencyConflict {
                index: first_index + i,
                key: key.to_string(),
                existing: *existing,
            }));
        }
        wanted.push((i, *existing));
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

/// Leases up to `claim.lease_ids.len()` claimable steps (see [`crate::Store::steps_claim`]):
/// finds and locks candidates, lets the core decide each claim in memory, then writes every
/// claim of the batch together.
pub(super) async fn claim(
    tx: &Transaction<'_>,
    claim: &Claim,
    history_per_job: usize,
) -> Res<ClaimResult> {
    let limits = control::claim_limits(tx, &claim.agent, claim.lease_ids.len(), claim.now).await?;
    let want = limits.want.min(claim.lease_ids.len());
    let mut round = ClaimRound::default();
    while round.claimed.len() < want && round.skips < CLAIM_SKIPS_MAX {
        if !round.next(tx, claim, want).await? {
            break;
        }
    }
    let ClaimRound {
        claimed, excluded, ..
    } = round;
    let leases: Vec<LeaseRef> = claimed.iter().map(|c| c.lease).collect();
    let transitions: Vec<&Transition> = claimed.iter().map(|c| &c.claimed.transition).collect();
    let siblings = sibling_signals(&claimed, claim.now);
    futures::try_join!(
        writes::persist_all(tx, &transitions, claim.now, history_per_job),
        writes::insert_leases(tx, &leases, &claim.worker, claim.now),
        notify(tx, &siblings),
    )?;
    // The bucket held the claim back if it ran dry before the claim's other bounds and
    // claimable work is left over (work another transaction holds counts: it is claimable).
    let has_more = limits.ran_dry(claimed.len()) && {
        let left = query(
            tx,
            CANDIDATES_SQL,
            &[
                &claim.agent,
                &claim.now.as_millis(),
                &excluded.jobs,
                &excluded.steps,
            ],
        )
        .await?;
        !left.is_empty()
    };
    let throttled_until =
        control::claim_spend(tx, &claim.agent, &limits, claimed.len(), has_more).await?;
    Ok(ClaimResult {
        claimed: claimed.into_iter().map(|c| c.claimed).collect(),
        throttled_until,
    })
}

/// A step a claim leased, with the lease it recorded.
struct Leased {
    claimed: Claimed,
    lease: LeaseRef,
}

/// Steps a claim leaves out of its next candidate query: those it refused or leased already
/// (its leases are written only at the end, so the rows still look claimable).
#[derive(Default)]
struct Excluded {
    jobs: Vec<Uuid>,
    steps: Vec<i32>,
}

impl Excluded {
    fn add(&mut self, job: Uuid, idx: i32) {
        self.jobs.push(job);
        self.steps.push(idx);
    }
}

/// A claim in progress: what it leased, what it left out, and the jobs it has locked as they now
/// stand (under the lock they cannot change behind its back, so two steps of one job are claimed
/// one after the other from one load).
#[derive(Default)]
struct ClaimRound {
    claimed: Vec<Leased>,
    excluded: Excluded,
    /// Candidates the core refused or that did not decode.
    skips: usize,
    loaded: HashMap<Uuid, Job>,
}

impl ClaimRound {
    /// Locks the next candidates and claims them through the core; false when none is left.
    async fn next(&mut self, tx: &Transaction<'_>, claim: &Claim, want: usize) -> Res<bool> {
        let limit = (want - self.claimed.len()) as i64;
        let rows = query(
            tx,
            LOCK_CANDIDATES_SQL,
            &[
                &claim.agent,
                &claim.now.as_millis(),
                &limit,
                &self.excluded.jobs,
                &self.excluded.steps,
            ],
        )
        .await?;
        if rows.is_empty() {
            return Ok(false);
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
            if !self.loaded.contains_key(job) && !unloaded.contains(&JobId(*job)) {
                unloaded.push(JobId(*job));
            }
        }
        for job in load_locked(tx, &unloaded).await? {
            self.loaded.insert(job.id.0, job);
        }
        for (job, idx) in candidates {
            self.take(claim, job, idx)?;
        }
        Ok(true)
    }

    /// Asks the core to lease step `idx` of `job` (loaded and locked) with the next lease id.
    fn take(&mut self, claim: &Claim, job_uuid: Uuid, idx: i32) -> Res<()> {
        let Some(&lease_id) = claim.lease_ids.get(self.claimed.len()) else {
            return Ok(());
        };
        self.excluded.add(job_uuid, idx);
        let step = rows::to_usize("steps.idx", idx)?;
        // A job that does not decode was logged when loading: one bad job must not stall every
        // claim of its agent.
        let Some(job) = self.loaded.get(&job_uuid) else {
            self.skips += 1;
            return Ok(());
        };
        let command = Command::Claim {
            step,
            lease_id,
            worker: claim.worker.clone(),
        };
        // The core has the last word on claimability; a refused candidate changes nothing.
        let Ok(transition) = overseer_core::apply(job, command, claim.now) else {
            self.skips += 1;
            return Ok(());
        };
        let lease = lease_of(&transition, step, lease_id)?;
        self.loaded.insert(job_uuid, transition.job.clone());
        self.claimed.push(Leased {
            claimed: Claimed { step, transition },
            lease,
        });
        Ok(())
    }
}

/// Wake-ups for steps of the claimed jobs that are still claimable: a claimer on another
/// connection that met these jobs locked passed over them (`SKIP LOCKED`) and may have gone back
/// to sleep, so siblings made ready together are announced again once this claim commits.
fn sibling_signals(claimed: &[Leased], now: Timestamp) -> Vec<String> {
    let mut agents: Vec<&str> = Vec::new();
    for c in claimed {
        agents.extend(c.claimed.transition.job.claimable_agents(now));
    }
    agents.sort_unstable();
    agents.dedup();
    agents.into_iter().map(|a| format!("ready:{a}")).collect()
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
