//! Sending what became of each attempt, batched when many attempts end at once.
//!
//! Each report is still bound by its lease's local deadline (see `worker`): past it, nothing is
//! sent, because the step may be someone else's by then. When attempts end one at a time, each
//! report goes out at once on its own (`complete` or `fail`), so batching adds no latency. When
//! reports arrive faster than the server answers, the ones that queue up behind the calls in
//! flight leave together in one `POST /v1/leases:report`: one request, one commit, and the
//! server applies and fences each exactly as its own call. Whatever the batch could not settle
//! (no answer, a 5xx, a refused result) falls back to the one-at-a-time path and its retries.

use std::time::Duration;

use overseer_core::wire::{LeaseOutcome, ReportResult};
use overseer_core::LeaseId;
use rand::Rng;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::client::{self, Client};
use crate::worker::LEASES_PER_CALL_MAX;

/// How many times a report is sent when no answer comes back.
const REPORT_TRIES: u32 = 3;
/// Batch calls one worker has in flight at once; more reports wait and join the next batch.
const BATCHES_IN_FLIGHT: usize = 2;

/// What an attempt came to.
#[derive(Clone, Debug)]
pub(crate) enum Report {
    Complete(Value),
    Fail { error: String, retryable: bool },
}

impl Report {
    fn outcome(&self, lease_id: LeaseId) -> LeaseOutcome {
        match self {
            Report::Complete(result) => LeaseOutcome::Complete {
                lease_id,
                result: Some(result.clone()),
            },
            Report::Fail { error, retryable } => LeaseOutcome::Fail {
                lease_id,
                error: error.clone(),
                retryable: *retryable,
            },
        }
    }
}

/// A report waiting for the batcher, with where to say how it went.
struct Pending {
    lease_id: LeaseId,
    report: Report,
    deadline: Instant,
    abandon: CancellationToken,
    /// `None`: settled (sent, refused for good, or dropped past its deadline). `Some`: the
    /// batch could not settle it; the attempt sends it on its own.
    settled: oneshot::Sender<Option<Report>>,
}

/// One worker's report sender: a handle on its batching task. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Reporter {
    client: Client,
    queue: mpsc::UnboundedSender<Pending>,
}

impl Reporter {
    /// Starts the batching task; it ends when the last handle is dropped.
    pub(crate) fn start(client: Client) -> Reporter {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(batch_loop(client.clone(), receiver));
        Reporter { client, queue }
    }

    /// Reports an attempt's end and returns once the report is settled (or abandoned).
    pub(crate) async fn send(
        &self,
        lease_id: LeaseId,
        report: Report,
        deadline: Instant,
        abandon: &CancellationToken,
    ) {
        let (settled, answer) = oneshot::channel();
        let pending = Pending {
            lease_id,
            report,
            deadline,
            abandon: abandon.clone(),
            settled,
        };
        let back = match self.queue.send(pending) {
            Ok(()) => tokio::select! {
                biased;
                _ = abandon.cancelled() => return,
                answer = answer => match answer {
                    Ok(back) => back,
                    // The batcher went away without a word: nothing is known to be sent, and
                    // the report itself went with it, so the lease is left to expire.
                    Err(_) => {
                        warn!("the report batcher stopped; the lease will expire");
                        None
                    }
                },
            },
            Err(mpsc::error::SendError(pending)) => Some(pending.report),
        };
        if let Some(report) = back {
            send_report(&self.client, lease_id, report, deadline, abandon).await;
        }
    }
}

async fn batch_loop(client: Client, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let slots = std::sync::Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    let mut calls = JoinSet::new();
    loop {
        // Take a slot before looking at the queue: while every slot is busy, reports pile up
        // and leave together once one frees.
        let slot = slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let Some(first) = queue.recv().await else {
            break;
        };
        let mut batch = vec![first];
        while batch.len() < LEASES_PER_CALL_MAX {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        calls.spawn(send_batch(client.clone(), batch, slot));
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

async fn send_batch(client: Client, batch: Vec<Pending>, _slot: OwnedSemaphorePermit) {
    let now = Instant::now();
    let mut live = Vec::with_capacity(batch.len());
    for p in batch {
        if p.abandon.is_cancelled() {
            let _ = p.settled.send(None);
        } else if p.deadline <= now {
            warn!(lease = %p.lease_id, "the lease's local deadline passed before the report could be sent; reporting nothing");
            let _ = p.settled.send(None);
        } else {
            live.push(p);
        }
    }
    if live.len() < 2 {
        // Alone: its own call says the same with less. Sent here, holding the slot, so that
        // reports arriving meanwhile queue up for the next batch.
        for p in live {
            send_report(&client, p.lease_id, p.report, p.deadline, &p.abandon).await;
            let _ = p.settled.send(None);
        }
        return;
    }
    let outcomes = live.iter().map(|p| p.report.outcome(p.lease_id)).collect();
    // Sent while every report is in time; an answer later than the last deadline is not waited
    // for, and nothing is sent again (as for a single report).
    let last = live.iter().map(|p| p.deadline).max().unwrap_or(now);
    match timeout_at(last, client.report_batch(outcomes)).await {
        Ok(Ok(results)) if results.len() == live.len() => {
            for (p, r) in live.into_iter().zip(results) {
                settle(p, &r);
            }
        }
        Ok(Ok(results)) => {
            error!(
                sent = live.len(),
                answered = results.len(),
                "a batch report answer does not match the request; sending each on its own"
            );
            for p in live {
                let _ = p.settled.send(Some(p.report));
            }
        }
        Ok(Err(e)) => {
            debug!(error = %e, reports = live.len(), "a batch report failed; sending each on its own");
            for p in live {
                let _ = p.settled.send(Some(p.report));
            }
        }
        Err(_) => {
            warn!(
                reports = live.len(),
                "no answer to a batch report before the last local deadline; not sending it again"
            );
            for p in live {
                let _ = p.settled.send(None);
            }
        }
    }
}

fn settle(p: Pending, r: &ReportResult) {
    let back = match r.status {
        200..=299 => {
            debug!(lease = %p.lease_id, "reported in a batch");
            None
        }
        409 => {
            let detail = r.problem.as_ref().map(|p| p.detail.as_str()).unwrap_or("");
            info!(lease = %p.lease_id, detail, "report refused with 409: the lease is no longer ours");
            None
        }
        // A refused result, a store hiccup: the single call knows what to do with each.
        _ => Some(p.report),
    };
    let _ = p.settled.send(back);
}

/// Sends a report, but only while the local deadline has not passed; retries a couple of
/// times when no answer came back. A 409 means someone else's lease now: logged and dropped.
pub(crate) async fn send_report(
    client: &Client,
    lease_id: LeaseId,
    mut report: Report,
    deadline: Instant,
    abandon: &CancellationToken,
) {
    let mut tries = 0;
    loop {
        tries += 1;
        if Instant::now() >= deadline {
            warn!("the lease's local deadline passed before the report could be sent; reporting nothing");
            return;
        }
        let call = async {
            match &report {
                Report::Complete(result) => client.complete(lease_id, Some(result.clone())).await,
                Report::Fail { error, retryable } => client.fail(lease_id, error, *retryable).await,
            }
        };
        let answer = tokio::select! {
            biased;
            _ = abandon.cancelled() => return,
            // Sent in time; if the answer is late we stop waiting and never send again.
            _ = sleep_until(deadline) => {
                warn!("no answer to the report before the local deadline; not sending it again");
                return;
            }
            answer = call => answer,
        };
        match answer {
            Ok(()) => {
                match &report {
                    Report::Complete(_) => debug!("reported complete"),
                    Report::Fail { error, retryable } => debug!(error, retryable, "reported fail"),
                }
                return;
            }
            Err(client::Error::LeaseLost(p)) => {
                info!(detail = %p.detail, "report refused with 409: the lease is no longer ours");
                return;
            }
            Err(e) if e.is_transient() && tries < REPORT_TRIES => {
                let pause = Duration::from_millis(100 << tries)
                    .mul_f64(rand::thread_rng().gen_range(0.5..=1.0));
                warn!(error = %e, ?pause, "report not answered; sending it again");
                tokio::select! {
                    _ = abandon.cancelled() => return,
                    _ = sleep(pause) => {}
                }
            }
            Err(client::Error::Api { status, problem })
                if matches!(report, Report::Complete(_)) && matches!(status, 400 | 413 | 422) =>
            {
                // The server refused the result itself (too large, say). Every attempt would
                // produce the same, so say so now instead of letting the lease expire.
                error!(status, detail = %problem.detail, "the server refused the result; failing the step");
                report = Report::Fail {
                    error: format!("the server refused the step's result: {}", problem.detail),
                    retryable: false,
                };
                tries = 0;
            }
            Err(e) => {
                error!(error = %e, "report failed; the lease will expire");
                return;
            }
        }
    }
}
