//! Single submits, lease reports, and lease requests of one agent name that arrive together on
//! one node are committed together.
//!
//! Each `POST /v1/jobs` would otherwise be a transaction of its own: on PostgreSQL three round
//! trips and a WAL flush per job, however many clients wait. Reports are the same: every
//! completion, and every batch a worker sends, was a transaction, and a drain on PostgreSQL
//! spent its time in commits waiting for their flush. Here a request queues its work and then
//! either commits whatever is queued (when one of a few commit slots is free) or waits for the
//! commit that took its work. With no other request around, the work goes alone and at once: the
//! batching costs no latency at idle, and grows with the load.
//!
//! A submit batch is all-or-nothing in the store, so a job whose idempotency key conflicts is
//! answered its conflict and the rest of the batch is committed again without it. Reports are
//! applied one by one inside their batch, each with its own outcome, exactly as alone. A commit
//! runs in a task of its own: a client that goes away cannot cancel the commit of other clients'
//! work.
//!
//! Lease requests are merged per agent name into claims of a few dozen leases, at most eight
//! claims of a name at once on a node, where the store says claims contend (PostgreSQL; SQLite's
//! single writer runs claims one after another in shared commits already, and merging them there
//! measured no faster). Claimers of one name all read the head of the same claim index: many
//! small claims side by side lock rows the others then skip, and each pays a transaction for a
//! few steps. Measured on PostgreSQL (BENCHMARKS.md, twentieth session), 16 workers asking for 8
//! leases each drained about 2,700 steps/s on 31 CPU-s unmerged and about 3,700 on 22 merged,
//! where 4 workers asking for 32 drain about 5,000 either way. Merged, the n-th step leased goes
//! to the n-th lease offered, so requests are served in arrival order, and a request whose client
//! went away before its claim was sent is left out of it.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use overseer_core::{LeaseId, Timestamp};
use overseer_store::prelude::*;
use overseer_store::{
    Claim, ClaimResult, Error, NewJob, Offer, Report, Reported, Reports, Submitted,
};
use tokio::sync::{oneshot, Semaphore};

/// Commits running at once on a node; more requests wait and go in the next batches.
const COMMIT_SLOTS: usize = 4;

/// Claims of one agent name running at once on a node. With four, a marker's start latency p99
/// under load grew by about a quarter, waiting for a slot; with eight it did not (measured).
const CLAIM_SLOTS: usize = 8;

type Answer<O> = oneshot::Sender<Result<O, Error>>;

/// A queue of one kind of work, committed in batches weighing at most `max` (an item alone may
/// weigh more).
struct Batcher<I, O> {
    queue: Mutex<Vec<(I, Answer<O>)>>,
    slots: Semaphore,
    max: usize,
    weigh: fn(&I) -> usize,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Batches of at most `max` items.
    fn new(max: usize, slots: usize) -> Self {
        Self::weighing(max, slots, |_| 1)
    }

    fn weighing(max: usize, slots: usize, weigh: fn(&I) -> usize) -> Self {
        Batcher {
            queue: Mutex::new(Vec::new()),
            slots: Semaphore::new(slots),
            max: max.max(1),
            weigh,
        }
    }

    /// Queues `item` and answers it, from the commit that takes it: this request's own (with
    /// whatever else is queued) when a slot is free first, else another's.
    async fn run<C, F>(&self, item: I, commit: C) -> Result<O, Error>
    where
        C: Fn(Vec<(I, Answer<O>)>) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, mut rx) = oneshot::channel();
        self.lock().push((item, tx));
        loop {
            tokio::select! {
                biased;
                answer = &mut rx => return answer.unwrap_or_else(|_| Err(lost())),
                permit = self.slots.acquire() => {
                    let Ok(_permit) = permit else { return Err(lost()) };
                    let batch = self.take();
                    if batch.is_empty() {
                        // Another commit took this item: its answer comes from there.
                        return rx.await.unwrap_or_else(|_| Err(lost()));
                    }
                    // Awaited here, but not cancelled if this request goes away.
                    let _ = tokio::spawn(commit(batch)).await;
                }
            }
        }
    }

    fn take(&self) -> Vec<(I, Answer<O>)> {
        let mut queue = self.lock();
        let mut n = 0;
        let mut weight = 0;
        for (item, _) in queue.iter() {
            weight += (self.weigh)(item);
            if n > 0 && weight > self.max {
                break;
            }
            n += 1;
        }
        queue.drain(..n).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(I, Answer<O>)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The queue of one node's single submits.
pub struct Submits(Batcher<NewJob, Submitted>);

impl Submits {
    /// Batches of at most `max` jobs (the batch limit of `POST /v1/jobs:batch`).
    pub fn new(max: usize) -> Submits {
        Submits(Batcher::new(max, COMMIT_SLOTS))
    }

    /// Stores one job, possibly in one transaction with others queued beside it; answers exactly
    /// what `Jobs::jobs_submit` would for it alone.
    pub async fn submit(&self, store: &Arc<dyn Store>, job: NewJob) -> Result<Submitted, Error> {
        self.0
            .run(job, |batch| commit_jobs(store.clone(), batch))
            .await
    }
}

/// The queue of one node's lease reports: each request's reports, in its order.
pub struct ReportQueue(Batcher<Vec<Report>, Vec<Reported>>);

impl ReportQueue {
    /// Batches of at most `max` reports (a request alone may hold more). On PostgreSQL a batch
    /// holds one lock per job it reports on until it commits (an advisory lock, in the server's
    /// shared lock table), so the bound keeps that table's use bounded too.
    pub fn new(max: usize) -> ReportQueue {
        ReportQueue(Batcher::weighing(max, COMMIT_SLOTS, Vec::len))
    }

    /// Applies one request's reports, possibly in one transaction with other requests' queued
    /// beside them, at the instant `now` gives when the batch is committed; answers exactly what
    /// `Leases::leases_report` would for them alone.
    pub async fn report<N>(
        &self,
        store: &Arc<dyn Store>,
        reports: Vec<Report>,
        now: N,
    ) -> Result<Vec<Reported>, Error>
    where
        N: Fn() -> Timestamp + Clone + Send + 'static,
    {
        self.0
            .run(reports, |batch| {
                commit_reports(store.clone(), batch, now.clone())
            })
            .await
    }
}

/// One lease request: up to `lease_ids.len()` leases for `worker`.
pub struct LeaseAsk {
    pub worker: String,
    pub lease_ids: Vec<LeaseId>,
}

/// What a lease request got from the claim that took it.
pub struct Granted {
    /// This request's leases, and the agent's throttle if its rate held the claim back.
    pub result: ClaimResult,
    /// The instant the claim was decided at (the leases' deadlines count from it).
    pub now: Timestamp,
    /// Whether the whole claim, of every request merged into it, leased all it offered: then
    /// more work may be ready.
    pub claim_was_full: bool,
}

type ClaimQueue = Batcher<LeaseAsk, Granted>;

/// The lease requests of one node, a queue per agent name while requests of that name wait.
pub struct Claims {
    agents: Mutex<HashMap<String, Arc<ClaimQueue>>>,
    max: usize,
}

impl Claims {
    /// Claims offering at most `max` leases each (a request asking for more is claimed alone).
    pub fn new(max: usize) -> Claims {
        Claims {
            agents: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Claims up to `ask.lease_ids.len()` steps of `agent` for `ask.worker`, possibly in one
    /// claim with other requests of the agent queued beside it, at the instant `now` gives when
    /// the claim is sent.
    pub async fn claim<N>(
        &self,
        store: &Arc<dyn Store>,
        agent: &str,
        ask: LeaseAsk,
        now: N,
    ) -> Result<Granted, Error>
    where
        N: Fn() -> Timestamp + Clone + Send + 'static,
    {
        if !store.claims_contend() {
            return claim_alone(store, agent, ask, now()).await;
        }
        let queue = self.queue_of(agent);
        let answer = queue
            .run(ask, |batch| {
                commit_claims(store.clone(), agent.to_string(), batch, now.clone())
            })
            .await;
        self.forget_if_idle(agent, queue);
        answer
    }

    fn queue_of(&self, agent: &str) -> Arc<ClaimQueue> {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        agents
            .entry(agent.to_string())
            .or_insert_with(|| {
                Arc::new(Batcher::weighing(
                    self.max,
                    CLAIM_SLOTS,
                    |ask: &LeaseAsk| ask.lease_ids.len(),
                ))
            })
            .clone()
    }

    /// Drops an agent's queue when nothing uses it, so the map holds only names being claimed.
    /// (A request that finds no queue makes a new one: at worst two claims of a name overlap
    /// once, as they would without merging.)
    fn forget_if_idle(&self, agent: &str, queue: Arc<ClaimQueue>) {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        // Two references: the map's and `queue`; any other is a request still using it.
        if Arc::strong_count(&queue) == 2 && queue.lock().is_empty() {
            agents.remove(agent);
        }
    }
}

/// Claims for one request alone, in a store whose claims do not contend: the same claim and
/// answer as a merged claim of one request.
async fn claim_alone(
    store: &Arc<dyn Store>,
    agent: &str,
    ask: LeaseAsk,
    now: Timestamp,
) -> Result<Granted, Error> {
    let (answer, granted) = oneshot::channel();
    commit_claims(
        store.clone(),
        agent.to_string(),
        vec![(ask, answer)],
        || now,
    )
    .await;
    granted.await.unwrap_or_else(|_| Err(lost()))
}

/// Sends one claim for every request still waiting and hands each its own leases.
async fn commit_claims<N: FnOnce() -> Timestamp>(
    store: Arc<dyn Store>,
    agent: String,
    batch: Vec<(LeaseAsk, Answer<Granted>)>,
    now: N,
) {
    // Leases for a client that hung up would be held by nobody until they expire.
    let batch: Vec<_> = batch.into_iter().filter(|(_, a)| !a.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    let offers: Vec<Offer> = batch
        .iter()
        .flat_map(|(ask, _)| {
            ask.lease_ids.iter().map(|&lease_id| Offer {
                lease_id,
                worker: ask.worker.clone(),
            })
        })
        .collect();
    let claim = Claim {
        agent,
        offers,
        now: now(),
    };
    let (offered, now) = (claim.max(), claim.now);
    match store.steps_claim(claim).await {
        Ok(result) => {
            let claim_was_full = result.claimed.len() >= offered;
            let mut claimed = result.claimed;
            for (ask, answer) in batch {
                let own: HashSet<LeaseId> = ask.lease_ids.iter().copied().collect();
                let (mine, rest) = claimed.into_iter().partition(|c| {
                    let lease = c.transition.job.steps.get(c.step).and_then(|s| s.lease_id);
                    lease.is_some_and(|l| own.contains(&l))
                });
                claimed = rest;
                let result = ClaimResult {
                    claimed: mine,
                    throttled_until: result.throttled_until,
                };
                let _ = answer.send(Ok(Granted {
                    result,
                    now,
                    claim_was_full,
                }));
            }
            debug_assert!(claimed.is_empty(), "every lease goes to its request");
        }
        Err(e) => {
            for (_, answer) in batch {
                let _ = answer.send(Err(same(&e)));
            }
        }
    }
}

fn lost() -> Error {
    Error::Unavailable("the write was interrupted; whether it was stored is unknown".into())
}

/// Commits a batch and answers each job; a conflicting job is answered alone and the others are
/// committed again without it.
async fn commit_jobs(store: Arc<dyn Store>, mut batch: Vec<(NewJob, Answer<Submitted>)>) {
    while !batch.is_empty() {
        let jobs: Vec<NewJob> = batch.iter().map(|(job, _)| job.clone()).collect();
        match store.jobs_submit(jobs).await {
            Ok(outcomes) => {
                for ((_, answer), outcome) in batch.into_iter().zip(outcomes) {
                    let _ = answer.send(Ok(outcome));
                }
                return;
            }
            Err(Error::IdempotencyConflict {
                index,
                key,
                existing,
            }) if index < batch.len() => {
                let (_, answer) = batch.remove(index);
                let conflict = Error::IdempotencyConflict {
                    index: 0,
                    key,
                    existing,
                };
                let _ = answer.send(Err(conflict));
            }
            Err(e) => {
                for (_, answer) in batch {
                    let _ = answer.send(Err(same(&e)));
                }
                return;
            }
        }
    }
}

/// Applies every request's reports in one store batch and hands each request its own outcomes.
async fn commit_reports<N: FnOnce() -> Timestamp>(
    store: Arc<dyn Store>,
    batch: Vec<(Vec<Report>, Answer<Vec<Reported>>)>,
    now: N,
) {
    let sizes: Vec<usize> = batch.iter().map(|(r, _)| r.len()).collect();
    let (reports, answers): (Vec<Vec<Report>>, Vec<_>) = batch.into_iter().unzip();
    let reports = Reports {
        reports: reports.into_iter().flatten().collect(),
        now: now(),
    };
    match store.leases_report(reports).await {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for (answer, n) in answers.into_iter().zip(sizes) {
                let _ = answer.send(Ok(outcomes.by_ref().take(n).collect()));
            }
        }
        Err(e) => {
            for answer in answers {
                let _ = answer.send(Err(same(&e)));
            }
        }
    }
}

/// The error of a failed batch, for each of its parts.
fn same(e: &Error) -> Error {
    match e {
        Error::Unavailable(why) => Error::Unavailable(why.clone()),
        Error::Corrupt(why) => Error::Corrupt(why.clone()),
        other => Error::Unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_store::conformance::{admitted, at, job_id, lease_id, spec};
    use overseer_store::sqlite::{SqliteOptions, SqliteStore};
    use serde_json::json;

    fn ask(worker: &str, ids: std::ops::Range<u128>) -> LeaseAsk {
        LeaseAsk {
            worker: worker.to_string(),
            lease_ids: ids.map(lease_id).collect(),
        }
    }

    /// The worker and lease id of each step a request was given.
    fn given(granted: &Granted) -> Vec<(String, LeaseId)> {
        granted
            .result
            .claimed
            .iter()
            .map(|c| {
                let s = &c.transition.job.steps[c.step];
                (s.worker.clone().unwrap(), s.lease_id.unwrap())
            })
            .collect()
    }

    // Proves a batch of report requests is bounded by the reports it holds, not by requests: the
    // requests queued first go together while their reports fit, the next waits for the next
    // batch, and a request larger than the bound goes alone. (On PostgreSQL each report's job is
    // locked in the server's shared lock table until the batch commits.)
    #[test]
    fn report_batches_are_bounded_by_their_reports() {
        let batcher: Batcher<Vec<u32>, ()> = Batcher::weighing(512, 1, Vec::len);
        let sizes = |batch: Vec<(Vec<u32>, Answer<()>)>| -> Vec<usize> {
            batch.iter().map(|(item, _)| item.len()).collect()
        };
        for n in [300, 200, 100, 1_000, 1] {
            let (tx, _rx) = oneshot::channel();
            batcher.lock().push((vec![0; n], tx));
        }
        assert_eq!(sizes(batcher.take()), [300, 200]);
        assert_eq!(sizes(batcher.take()), [100]);
        assert_eq!(sizes(batcher.take()), [1_000]);
        assert_eq!(sizes(batcher.take()), [1]);
    }

    // Proves a merged claim hands each request its own leases in arrival order, and leaves out a
    // request whose client went away: its offers are not used, so no step is leased to nobody.
    // Three steps are ready; w1 offers two leases, the abandoned request two, w2 two.
    #[tokio::test]
    async fn a_merged_claim_serves_requests_in_order_and_skips_abandoned_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("t.db"))).unwrap();
        let store: Arc<dyn Store> = Arc::new(store);
        let one_step = spec(json!({"steps": [{"name": "s", "agent": "a"}]}));
        let jobs = (1..=3)
            .map(|n| admitted(job_id(n), &one_step, at(1_000)))
            .collect();
        store.jobs_submit(jobs).await.unwrap();
        let (first, first_rx) = oneshot::channel();
        let (gone, gone_rx) = oneshot::channel();
        let (second, second_rx) = oneshot::channel();
        drop(gone_rx);
        let batch = vec![
            (ask("w1", 1..3), first),
            (ask("gone", 3..5), gone),
            (ask("w2", 5..7), second),
        ];
        commit_claims(store.clone(), "a".to_string(), batch, || at(2_000)).await;
        let first = first_rx.await.unwrap().unwrap();
        let second = second_rx.await.unwrap().unwrap();
        let w = |s: &str| s.to_string();
        assert_eq!(
            given(&first),
            vec![(w("w1"), lease_id(1)), (w("w1"), lease_id(2))]
        );
        assert_eq!(given(&second), vec![(w("w2"), lease_id(5))]);
        // Four leases offered, three steps leased: nothing more is ready.
        assert!(!first.claim_was_full && !second.claim_was_full);
        assert_eq!((first.now, second.now), (at(2_000), at(2_000)));
    }
}
