//! Single submits that arrive together on one node are committed together.
//!
//! Each `POST /v1/jobs` would otherwise be a transaction of its own: on PostgreSQL three round
//! trips and a WAL flush per job, however many clients wait. Here a request queues its job and
//! then either commits whatever is queued (when one of a few commit slots is free) or waits for
//! the commit that took its job. With no other request around, a job goes alone and at once: the
//! batching costs no latency at idle, and grows with the load.
//!
//! A batch is all-or-nothing in the store, so a job whose idempotency key conflicts is answered
//! its conflict and the rest of the batch is committed again without it. A commit runs in a task
//! of its own: a client that goes away cannot cancel the commit of other clients' jobs.

use std::sync::{Arc, Mutex};

use overseer_store::prelude::*;
use overseer_store::{Error, NewJob, Submitted};
use tokio::sync::{oneshot, Semaphore};

/// Commits running at once on a node; more requests wait and go in the next batches.
const COMMIT_SLOTS: usize = 4;

type Answer = oneshot::Sender<Result<Submitted, Error>>;

/// The queue of one node's single submits.
pub struct Submits {
    queue: Mutex<Vec<(NewJob, Answer)>>,
    slots: Semaphore,
    /// Jobs per commit at most (the batch limit of `POST /v1/jobs:batch`).
    max: usize,
}

impl Submits {
    pub fn new(max: usize) -> Submits {
        Submits {
            queue: Mutex::new(Vec::new()),
            slots: Semaphore::new(COMMIT_SLOTS),
            max: max.max(1),
        }
    }

    /// Stores one job, possibly in one transaction with others queued beside it; answers exactly
    /// what `Jobs::jobs_submit` would for it alone.
    pub async fn submit(&self, store: &Arc<dyn Store>, job: NewJob) -> Result<Submitted, Error> {
        let (tx, mut rx) = oneshot::channel();
        self.lock().push((job, tx));
        loop {
            tokio::select! {
                biased;
                answer = &mut rx => return answer.unwrap_or_else(|_| Err(lost())),
                permit = self.slots.acquire() => {
                    let Ok(_permit) = permit else { return Err(lost()) };
                    let batch = self.take();
                    if batch.is_empty() {
                        // Another commit took this job: its answer comes from there.
                        return rx.await.unwrap_or_else(|_| Err(lost()));
                    }
                    let store = store.clone();
                    // Awaited here, but not cancelled if this request goes away.
                    let _ = tokio::spawn(commit(store, batch)).await;
                }
            }
        }
    }

    fn take(&self) -> Vec<(NewJob, Answer)> {
        let mut queue = self.lock();
        let n = queue.len().min(self.max);
        queue.drain(..n).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(NewJob, Answer)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn lost() -> Error {
    Error::Unavailable("the submit was interrupted; whether it was stored is unknown".into())
}

/// Commits a batch and answers each job; a conflicting job is answered alone and the others are
/// committed again without it.
async fn commit(store: Arc<dyn Store>, mut batch: Vec<(NewJob, Answer)>) {
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

/// The error of a failed batch, for each of its jobs.
fn same(e: &Error) -> Error {
    match e {
        Error::Unavailable(why) => Error::Unavailable(why.clone()),
        Error::Corrupt(why) => Error::Corrupt(why.clone()),
        other => Error::Unavailable(other.to_string()),
    }
}
