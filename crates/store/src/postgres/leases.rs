//! Steps and leases: claims (candidates locked `FOR UPDATE SKIP LOCKED`, decided by the core in
//! memory, written together), resolving lease ids, expired leases, and report batches.

use std::collections::HashMap;

use super::tx::Transaction;
use overseer_core::{Command, Job, JobId, LeaseId, Transition};
use uuid::Uuid;

use super::agents::{claim_limits, claim_spend};
use super::jobs::{load_locked, lock_and_load, notify, start_next_head};
use super::rows::{self, get, limit_param, query};
use super::{writes, PgStore, Res};
use crate::{
    Claim, ClaimResult, Claimed, Due, Error, LeaseRef, Leases, Report, ReportApplied, Reported,
    Reports, Result, Signal,
};

/// Candidates skipped by one claim before it gives up looking further: bounds the work a claim
/// does if many ready rows turn out not to be claimable.
const CLAIM_SKIPS_MAX: usize = 1_000;

/// Agents whose last claim on this node leased as many steps as it asked for: they have a
/// backlog, so their next claim skips the look before the transaction (the look is a walk of
/// the claim index's head, as dear as the claim's own walk: 0.48 ms and 280 buffers a call in a
/// drain). A claim that leases fewer than it asked for (an idle agent's worker polling again
/// after getting its one lease) takes the agent out, so its next claim looks first again. Only a
/// hint: a claim without the look is the same claim, and one that finds nothing costs an empty
/// transaction.
#[derive(Default)]
pub(super) struct Busy(std::sync::Mutex<std::collections::HashSet<String>>);

/// How many agents [`Busy`] remembers; past it, new ones are not added (they look first).
const BUSY_AGENTS_MAX: usize = 1_024;

impl Busy {
    fn is_busy(&self, agent: &str) -> bool {
        self.0.lock().expect("busy agents").contains(agent)
    }

    fn set(&self, agent: &str, busy: bool) {
        let mut agents = self.0.lock().expect("busy agents");
        if !busy {
            agents.remove(agent);
        } else if agents.len() < BUSY_AGENTS_MAX && !agents.contains(agent) {
            agents.insert(agent.to_string());
        }
    }
}

/// The leases this node granted lately, each with its job, step and attempt, so that a report
/// batch of remembered leases needs no lookup of them: it locks and loads their jobs straight
/// away. A lease belongs to one attempt of one step for good, so a remembered one says what the
/// lookup would (the step's row or, once it is re-leased, the retired leases); only its job may
/// have gone since, and then the lease went with it (see [`resolve_leases`]). A lease not
/// remembered (granted by another node, or long ago) is looked up as before. Two generations of
/// [`GRANTED_PER_GENERATION`] leases each bound the memory: when the newer fills up, the older is
/// dropped and the newer takes its place.
#[derive(Default)]
pub(super) struct Granted(std::sync::Mutex<[HashMap<LeaseId, LeaseRef>; 2]>);

/// Leases per generation of [`Granted`].
const GRANTED_PER_GENERATION: usize = 50_000;

impl Granted {
    fn remember(&self, leases: impl Iterator<Item = LeaseRef>) {
        let mut generations = self.0.lock().expect("granted leases");
        for lease in leases {
            if generations[0].len() >= GRANTED_PER_GENERATION {
                generations[1] = std::mem::take(&mut generations[0]);
            }
            generations[0].insert(lease.lease_id, lease);
        }
    }

    /// `leases` as granted, if every one is remembered.
    fn leases_of(&self, leases: &[LeaseId]) -> Option<Vec<LeaseRef>> {
        let generations = self.0.lock().expect("granted leases");
        leases
            .iter()
            .map(|l| generations.iter().find_map(|g| g.get(l)).copied())
            .collect()
    }
}

/// Leases up to `claim.max()` claimable steps (see [`crate::Leases::steps_claim`]):
/// finds and locks candidates, lets the core decide each claim in memory, then writes every
/// claim of the batch together.
///
/// The first candidate query goes out with the agent's limits, in the same round trip, so it asks
/// for as many as the claim asked for: when the limits allow fewer, the rest are locked and
/// loaded, then left (see [`ClaimRound::passed`]). The limits' row lock comes first on the wire,
/// so an agent's claims are serialised before either looks at a candidate, as before.
async fn claim(
    tx: &Transaction<'_>,
    claim: &Claim,
    history_per_job: usize,
) -> Res<(ClaimResult, Vec<String>)> {
    let asked = claim.max();
    let mut round = ClaimRound::default();
    let (limits, (), first) = futures::try_join!(
        claim_limits(tx, &claim.agent, asked, claim.now),
        walk_in_claim_order(tx),
        lock_candidates(tx, claim, asked, &round.excluded),
    )?;
    let want = limits.want.min(asked);
    let mut more = round.take(tx, claim, first, asked, want).await?;
    while more && round.claimed.len() < want && round.skips < CLAIM_SKIPS_MAX {
        let limit = want - round.claimed.len();
        let found = lock_candidates(tx, claim, limit, &round.excluded).await?;
        more = round.take(tx, claim, found, limit, want).await?;
    }
    let siblings = round.sibling_agents(claim);
    let ClaimRound {
        claimed, excluded, ..
    } = round;
    let transitions: Vec<&Transition> = claimed.iter().map(|c| &c.transition).collect();
    let signals: Vec<String> = siblings.iter().map(|a| format!("ready:{a}")).collect();
    futures::try_join!(
        writes::persist_all(tx, &transitions, claim.now, history_per_job),
        notify(tx, &signals),
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
    let throttled_until = claim_spend(tx, &claim.agent, &limits, claimed.len(), has_more).await?;
    let result = ClaimResult {
        claimed,
        throttled_until,
    };
    Ok((result, siblings))
}

/// Locks up to `limit` of the agent's due claimable steps, best claim rank first, leaving out
/// `excluded` and passing over jobs another transaction holds ([`LOCK_CANDIDATES_SQL`]).
async fn lock_candidates(
    tx: &Transaction<'_>,
    claim: &Claim,
    limit: usize,
    excluded: &Excluded,
) -> Res<Vec<(Uuid, i32)>> {
    let rows = query(
        tx,
        LOCK_CANDIDATES_SQL,
        &[
            &claim.agent,
            &claim.now.as_millis(),
            &limit_param(limit),
            &excluded.jobs,
            &excluded.steps,
        ],
    )
    .await?;
    rows.iter()
        .map(|row| Ok((get(row, 0, "steps.job_id")?, get(row, 1, "steps.idx")?)))
        .collect()
}

/// Makes this transaction's candidate queries walk `steps_claim` in its order, whatever the
/// planner's statistics say. A table analyzed while it held a few ready steps (a fresh database,
/// or any table before autovacuum sees a burst of submits) has the planner expect a dozen rows
/// for an agent, so it fetched them all with a bitmap scan and sorted them instead: measured at
/// the start of a 40,000-job drain, 37 claims read all 40,000 ready steps (sorted on disk,
/// 120,000 buffers, 140 ms each), 70 % of all the time claims took. Walking the index in order
/// reads only the head, which is all a claim with a `LIMIT` needs. (Sent with the claim's first
/// statement, so it costs no round trip of its own.)
async fn walk_in_claim_order(tx: &Transaction<'_>) -> Res<()> {
    tx.batch_execute(CLAIM_ORDER_SQL).await.map_err(Into::into)
}

/// See [`walk_in_claim_order`]: for the rest of the transaction only.
const CLAIM_ORDER_SQL: &str = "SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off";

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
    claimed: Vec<Claimed>,
    excluded: Excluded,
    /// Candidates the core refused or that did not decode.
    skips: usize,
    loaded: HashMap<Uuid, Job>,
    /// Jobs locked as candidates and left because the agent's limits allowed no more leases:
    /// until this claim commits, other agents' claimers pass over them too.
    passed: Vec<Uuid>,
}

impl ClaimRound {
    /// Loads the locked `candidates` (found by a query asking for `limit`) and claims them
    /// through the core until the claim has `want` leases; false when no candidate is left: the
    /// query found fewer than it asked for and the core took them all (a second query would find
    /// the range as empty, and cost a round trip on most claims of an agent that is not
    /// backlogged).
    async fn take(
        &mut self,
        tx: &Transaction<'_>,
        claim: &Claim,
        candidates: Vec<(Uuid, i32)>,
        limit: usize,
        want: usize,
    ) -> Res<bool> {
        if candidates.is_empty() {
            return Ok(false);
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
        let (found, skips) = (candidates.len(), self.skips);
        for (job, idx) in candidates {
            if self.claimed.len() < want {
                self.take_one(claim, job, idx)?;
            } else {
                self.passed.push(job);
            }
        }
        Ok(found == limit || self.skips > skips)
    }

    /// Asks the core to lease step `idx` of `job` (loaded and locked) with the next lease id.
    fn take_one(&mut self, claim: &Claim, job_uuid: Uuid, idx: i32) -> Res<()> {
        let Some(offer) = claim.offers.get(self.claimed.len()) else {
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
            lease_id: offer.lease_id,
            worker: offer.worker.clone(),
        };
        // The core has the last word on claimability; a refused candidate changes nothing.
        let Ok(transition) = overseer_core::apply(job, command, claim.now) else {
            self.skips += 1;
            return Ok(());
        };
        self.loaded.insert(job_uuid, transition.job.clone());
        self.claimed.push(Claimed { step, transition });
        Ok(())
    }

    /// The agents of steps of the locked jobs that are still claimable: a claimer on another
    /// connection that met these jobs locked passed over them (`SKIP LOCKED`) and may have gone
    /// back to sleep, so siblings made ready together are announced again once this claim
    /// commits, to other nodes and to this one. Jobs passed over for the agent's limits announce
    /// other agents only: this agent's claims are serialised by its limits' row, so none of them
    /// met the lock, and announcing it would wake its workers into the same limits.
    fn sibling_agents(&self, claim: &Claim) -> Vec<String> {
        let mut agents: Vec<&str> = Vec::new();
        for c in &self.claimed {
            agents.extend(c.transition.job.claimable_agents(claim.now));
        }
        for job in self.passed.iter().filter_map(|id| self.loaded.get(id)) {
            let others = job
                .claimable_agents(claim.now)
                .into_iter()
                .filter(|a| *a != claim.agent);
            agents.extend(others);
        }
        agents.sort_unstable();
        agents.dedup();
        agents.into_iter().map(str::to_string).collect()
    }
}

/// The claimable steps of an agent that are due, best claim rank first (one ordered range of
/// the `steps_claim` index), leaving out the steps in `($4, $5)`, taking each one's job lock
/// (`jobs::job_lock_key`, tried, not waited for) as it goes and passing over jobs another
/// transaction holds: claimers never wait for each other, and the server skips held jobs
/// without a round trip per job. The lock is tried in the outer query, so only on steps that
/// passed every other condition, in the walk's order, until the limit: a step left out or not
/// reached locks nothing. The rows this statement reads may be older than the lock it takes;
/// the claim reads the jobs again after it (a statement's snapshot of its own, read committed).
const LOCK_CANDIDATES_SQL: &str = concat!(
    "SELECT c.job_id, c.idx FROM ( \
       SELECT s.job_id, s.idx FROM steps s \
       WHERE s.claim_agent = $1 AND s.next_attempt_at <= $2 \
         AND (s.job_id, s.idx) NOT IN ( \
           SELECT sj, si FROM unnest($4::uuid[], $5::integer[]) AS skipped (sj, si)) \
       ORDER BY s.claim_rank, s.job_id, s.idx OFFSET 0) c \
     WHERE pg_try_advisory_xact_lock(",
    super::jobs::job_lock_key!("c.job_id"),
    ") LIMIT $3"
);

/// Whether any claimable step of the agent is due, locked or not, leaving out `($3, $4)`.
const CANDIDATES_SQL: &str = "SELECT 1 FROM steps \
     WHERE claim_agent = $1 AND next_attempt_at <= $2 \
       AND (job_id, idx) NOT IN ( \
         SELECT sj, si FROM unnest($3::uuid[], $4::integer[]) AS skipped (sj, si)) \
     LIMIT 1";

/// Whether the agent has a claimable step that is due: the head of its range of `steps_claim`.
const ANY_CANDIDATE_SQL: &str = "SELECT 1 FROM steps \
     WHERE claim_agent = $1 AND next_attempt_at <= $2 \
     ORDER BY claim_agent, claim_rank, job_id, idx LIMIT 1";

/// Applies lease holders' reports in one transaction, each as `lease_find` + `apply_command`
/// would, with a constant number of statements: the leases resolve in one (none when this node
/// granted every lease, see [`Granted`]), their jobs are locked (in id order, so two batches
/// sharing jobs wait for each other instead of deadlocking) and loaded in three sent together
/// ([`resolve_leases`]), the core applies every report in memory (two reports of one job one
/// after the other), and the transitions are written together. Answers come back in report
/// order.
async fn report_leases(
    tx: &Transaction<'_>,
    batch: &Reports,
    granted: &Granted,
    history_per_job: usize,
) -> Res<Vec<Reported>> {
    let (reports, now) = (&batch.reports, batch.now);
    let ids: Vec<_> = reports.iter().map(|r| r.lease_id).collect();
    let (leases, mut jobs) = resolve_leases(tx, &ids, granted).await?;
    let mut out: Vec<Option<Reported>> = (0..reports.len()).map(|_| None).collect();
    let mut applied: Vec<(usize, LeaseRef, Transition)> = Vec::new();
    for (i, Report { lease_id, report }) in reports.iter().enumerate() {
        // A lease without its job went with it (`resolve_leases`).
        let found = leases
            .get(lease_id)
            .and_then(|&l| Some((l, jobs.get(&l.job_id)?)));
        let Some((lease, job)) = found else {
            out[i] = Some(Err(Error::LeaseNotFound(*lease_id)));
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
        out[i] = Some(Ok(ReportApplied {
            lease,
            transition: t,
        }));
    }
    Ok(out
        .into_iter()
        .map(|o| o.expect("every report is answered"))
        .collect())
}

/// The batch's leases by id and their jobs, locked (in id order) and loaded. Remembered leases
/// ([`Granted`]) need no lookup: one round trip locks and loads their jobs. Otherwise the leases
/// are looked up first and their jobs locked and loaded after. A lease whose job is not among
/// the jobs is not found: a job's leases go with it, so a lookup would not have found it either.
async fn resolve_leases(
    tx: &Transaction<'_>,
    ids: &[LeaseId],
    granted: &Granted,
) -> Res<(HashMap<LeaseId, LeaseRef>, HashMap<JobId, Job>)> {
    let (leases, job_ids) = match granted.leases_of(ids) {
        Some(remembered) => {
            let job_ids: Vec<JobId> = remembered.iter().map(|l| l.job_id).collect();
            let leases: HashMap<LeaseId, LeaseRef> =
                remembered.into_iter().map(|l| (l.lease_id, l)).collect();
            (leases, job_ids)
        }
        None => {
            let leases = writes::find_leases(tx, ids).await?;
            let job_ids = leases.values().map(|l| l.job_id).collect();
            (leases, job_ids)
        }
    };
    let jobs: HashMap<JobId, Job> = lock_and_load(tx, &job_ids)
        .await?
        .into_iter()
        .map(|j| (j.id, j))
        .collect();
    Ok((leases, jobs))
}

#[async_trait::async_trait]
impl Leases for PgStore {
    fn claims_contend(&self) -> bool {
        true
    }

    async fn steps_claim(&self, c: Claim) -> Result<ClaimResult> {
        if c.offers.is_empty() {
            return Ok(ClaimResult::default());
        }
        // Most claims of an idle agent find nothing (a worker polls again as soon as it has its
        // leases, every node hears every wake-up): they end after one statement, without a
        // transaction, a lock or a commit. Equivalent: a claim without a candidate leases
        // nothing, spends no token and is not throttled. An agent with a backlog skips the look.
        let busy = self.inner.busy.is_busy(&c.agent);
        if !busy {
            let due = self
                .read_one_statement(ANY_CANDIDATE_SQL, &[&c.agent, &c.now.as_millis()])
                .await?;
            if due.is_empty() {
                return Ok(ClaimResult::default());
            }
        }
        let history = self.inner.history_per_job;
        let c = &c;
        let (result, siblings) = self
            .write(move |tx, _| Box::pin(claim(tx, c, history)))
            .await?;
        let full = result.claimed.len() == c.max();
        self.inner.busy.set(&c.agent, full);
        let granted = result
            .claimed
            .iter()
            .filter_map(|c| LeaseRef::held(&c.transition.job, c.step));
        self.inner.granted.remember(granted);
        // This node does not hear its own notifications (`listen`): its claimers learn here.
        for agent in siblings {
            // No receiver is fine: nobody is waiting for anything.
            let _ = self.inner.signals.send(Signal::Ready { agent });
        }
        Ok(result)
    }

    async fn lease_find(&self, lease_id: LeaseId) -> Result<Option<LeaseRef>> {
        let ids = [lease_id];
        let ids = &ids;
        let found = self
            .read(move |tx, _| Box::pin(writes::find_leases(tx, ids)))
            .await?;
        Ok(found.get(&lease_id).copied())
    }

    async fn leases_expired(&self, due: Due) -> Result<Vec<LeaseRef>> {
        self.read(move |tx, _| Box::pin(expired(tx, due))).await
    }

    async fn leases_report(&self, batch: Reports) -> Result<Vec<Reported>> {
        let (history, granted) = (self.inner.history_per_job, &self.inner.granted);
        let batch = &batch;
        self.write(move |tx, _| Box::pin(report_leases(tx, batch, granted, history)))
            .await
    }
}

/// Up to `$2` leases ended by `$1`, oldest expiry first: the oldest of each agent's, then
/// merged.
const EXPIRED_SQL: &str = concat!(
    leasing_agents!(),
    "SELECT e.job_id, e.idx, e.attempt, e.lease_id FROM leasing l CROSS JOIN LATERAL ( \
       SELECT job_id, idx, attempt, lease_id, lease_expires_at FROM steps \
       WHERE lease_agent = l.agent AND lease_expires_at IS NOT NULL AND lease_expires_at <= $1 \
       ORDER BY lease_expires_at, job_id, idx LIMIT $2) e \
     ORDER BY e.lease_expires_at, e.job_id, e.idx LIMIT $2"
);

/// Leased steps whose lease ended by `due.now`, oldest expiry first.
async fn expired(tx: &Transaction<'_>, due: Due) -> Res<Vec<LeaseRef>> {
    let rows = query(
        tx,
        EXPIRED_SQL,
        &[&due.now.as_millis(), &limit_param(due.limit)],
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        // A bad row is logged and passed over so it cannot stop every other expiry.
        match rows::lease_ref_from_row(row) {
            Ok(Some(lease)) => out.push(lease),
            Ok(None) => tracing::error!("a leased step has no lease id; skipping it"),
            Err(e) => tracing::error!(error = %e, "skipping an unreadable leased step"),
        }
    }
    Ok(out)
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::conformance::at;
    use crate::pgtest::PgCluster;
    use crate::postgres::PgOptions;
    use tokio_postgres::NoTls;

    // Proves a claim walks the head of `steps_claim` in order on a table the planner has no
    // statistics for: thousands of ready steps of one agent, never analyzed, are planned by
    // default as a bitmap scan of all of them and a sort (on this PostgreSQL, 140 ms a claim at
    // 40,000 steps); with the claim's settings, as an ordered index scan that stops at the limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_walks_the_claim_index_in_order_without_statistics() {
        let (db, store) = crate::pgtest::store_with_ready_steps(5_000).await;
        let (mut client, connection) = tokio_postgres::connect(db.url(), NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        let tx = client.transaction().await.expect("begin");
        tx.batch_execute(CLAIM_ORDER_SQL).await.expect("settings");
        let explain = format!("EXPLAIN {LOCK_CANDIDATES_SQL}");
        let none: Vec<Uuid> = Vec::new();
        let steps: Vec<i32> = Vec::new();
        let plan: Vec<String> = tx
            .query(
                explain.as_str(),
                &[&"a", &at(1_000).as_millis(), &32i64, &none, &steps],
            )
            .await
            .expect("explain")
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(
            plan.contains("Index Scan using steps_claim on steps")
                && !plan.contains("Bitmap")
                && !plan.contains("Sort"),
            "the claim is not an ordered walk of steps_claim:\n{plan}"
        );
        drop(tx);
        drop(store);
    }

    // Proves the leases a node remembers answer a report batch only when every lease is known,
    // and that memory is bounded: past a generation's size the oldest generation is dropped.
    #[test]
    fn granted_leases_answer_whole_batches_within_two_generations() {
        let granted = Granted::default();
        let lease = |n: u128| LeaseRef {
            lease_id: crate::conformance::lease_id(n),
            job_id: JobId(Uuid::from_u128(1_000_000 + n)),
            step: (n % 3) as usize,
            attempt: 1 + (n % 2) as u32,
        };
        let ids = |ns: &[u128]| -> Vec<LeaseId> {
            ns.iter()
                .map(|&n| crate::conformance::lease_id(n))
                .collect()
        };
        granted.remember((0..3).map(lease));
        assert_eq!(
            granted.leases_of(&ids(&[2, 0])),
            Some(vec![lease(2), lease(0)])
        );
        assert_eq!(granted.leases_of(&ids(&[0, 9])), None, "all or nothing");
        let n = GRANTED_PER_GENERATION as u128;
        granted.remember((3..=2 * n).map(lease));
        assert_eq!(
            granted.leases_of(&ids(&[0])),
            None,
            "the oldest generation is gone"
        );
        assert_eq!(granted.leases_of(&ids(&[n])), Some(vec![lease(n)]));
        assert_eq!(granted.leases_of(&ids(&[2 * n])), Some(vec![lease(2 * n)]));
        let held: usize = granted
            .0
            .lock()
            .expect("granted")
            .iter()
            .map(HashMap::len)
            .sum();
        assert!(held <= 2 * GRANTED_PER_GENERATION);
    }

    // Proves a job a claim locked and then left for its agent's limits is announced to its other
    // agents (their claimers met the lock and passed over it) and never to the claim's own
    // agent, whose claims the limits' row serialises: announcing it would wake its workers into
    // the same limits, over and over while it is paused.
    #[test]
    fn jobs_left_for_the_limits_announce_their_other_agents_only() {
        let spec = crate::conformance::spec(serde_json::json!({"steps": [
            {"name": "a", "agent": "a"}, {"name": "b", "agent": "b"}]}));
        let now = at(1_000);
        let job = crate::conformance::admitted(crate::conformance::job_id(1), &spec, now)
            .transition
            .job;
        let mut round = ClaimRound::default();
        round.loaded.insert(job.id.0, job.clone());
        round.passed.push(job.id.0);
        let claim =
            |agent: &str| Claim::of_worker(agent, "w", vec![crate::conformance::lease_id(1)], now);
        assert_eq!(round.sibling_agents(&claim("a")), vec!["b".to_string()]);
        assert_eq!(round.sibling_agents(&claim("b")), vec!["a".to_string()]);
        assert!(ClaimRound::default().sibling_agents(&claim("a")).is_empty());
    }

    // Proves an agent with a backlog skips the look and loses nothing by it: claims that lease
    // all they ask for mark the agent busy, the next claim (no look) still leases exactly what is
    // left, and the claim that finds nothing leases nothing, is not throttled and makes the next
    // claim look first again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_agent_with_a_backlog_claims_without_the_look() {
        let (db, store) = crate::pgtest::store_with_ready_steps(3).await;
        let claim = |first: u128, n: u128| {
            Claim::of_worker(
                "a",
                "w",
                (first..first + n)
                    .map(crate::conformance::lease_id)
                    .collect(),
                at(1_000),
            )
        };
        let busy = |store: &PgStore| store.inner.busy.is_busy("a");
        assert!(!busy(&store), "a fresh store knows no busy agent");
        let first = store.steps_claim(claim(1, 2)).await.expect("claim");
        assert_eq!(first.claimed.len(), 2);
        assert!(busy(&store), "a full claim marks the agent busy");
        let second = store.steps_claim(claim(3, 2)).await.expect("claim");
        assert_eq!(second.claimed.len(), 1, "the last ready step, once");
        assert!(!busy(&store), "a claim short of its ask clears the mark");
        let mut jobs: Vec<_> = (first.claimed.iter().chain(&second.claimed))
            .map(|c| c.transition.job.id)
            .collect();
        jobs.sort();
        jobs.dedup();
        assert_eq!(jobs.len(), 3, "every step leased once");
        store.inner.busy.set("a", true);
        let none = store.steps_claim(claim(5, 1)).await.expect("claim");
        assert!(none.claimed.is_empty() && none.throttled_until.is_none());
        assert!(!busy(&store), "an empty claim clears the mark");
        drop(db);
    }

    // Proves the look a claim takes before its transaction reads the head of the agent's range
    // of `steps_claim` under the plan a pooled connection caches while the table is empty (a
    // fresh database): a sequential scan there would read every step for every idle poll.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_look_before_a_claim_walks_the_claim_index_on_an_empty_table() {
        let db = PgCluster::shared().database().await;
        let store = PgStore::open(PgOptions::new(db.url())).await.expect("open");
        let client = crate::pgtest::connect(db.url()).await.expect("connect");
        let plan = crate::pgtest::generic_plan(&client, ANY_CANDIDATE_SQL, 2).await;
        assert!(
            plan.contains("Index Scan using steps_claim on steps") && !plan.contains("Sort"),
            "the look is not a walk of steps_claim:\n{plan}"
        );
        drop(store);
    }
}
