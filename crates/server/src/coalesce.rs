//! Single submits, and lease reports, that arrive together on one node are committed together.
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

use std::future::Future;
use std::sync::{Arc, Mutex};

use overseer_core::Timestamp;
use overseer_store::prelude::*;
use overseer_store::{Error, NewJob, Report, Reported, Reports, Submitted};
use tokio::sync::{oneshot, Semaphore};

/// Commits running at once on a node; more requests wait and go in the next batches.
const COMMIT_SLOTS: usize = 4;

type Answer<O> = oneshot::Sender<Result<O, Error>>;

/// A queue of one kind of work, committed in batches of at most `max` items.
struct Batcher<I, O> {
    queue: Mutex<Vec<(I, Answer<O>)>>,
    slots: Semaphore,
    max: usize,
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    fn new(max: usize) -> Self {
        Batcher {
            queue: Mutex::new(Vec::new()),
            slots: Semaphore::new(COMMIT_SLOTS),
            max: max.max(1),
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
        let n = queue.len().min(self.max);
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
        Submits(Batcher::new(max))
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
    /// Batches of at most `max` requests.
    pub fn new(max: usize) -> ReportQueue {
        ReportQueue(Batcher::new(max))
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
