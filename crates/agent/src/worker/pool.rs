//! One agent name's long-poll loop: asks for as many leases as it has free slots, starts an
//! attempt for each, backs off after errors, and gives back leases it did not ask for.

use std::sync::Arc;
use std::time::Duration;

use overseer_core::wire::{Lease, LeaseRequest};
use overseer_core::Span;
use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn, Instrument};

use super::attempt::{local_deadline, Attempt};
use super::{Handler, Shared, LEASES_PER_CALL_MAX, REPORTS_PER_SLOT};
use crate::client::Client;
use crate::reports::{send_report, Report};

/// Poll back-off after errors: first pause, and the cap it doubles up to.
const POLL_BACKOFF_FIRST: Duration = Duration::from_millis(250);
const POLL_BACKOFF_MAX: Duration = Duration::from_secs(15);
/// An empty lease answer faster than this means the server did not long-poll; pausing keeps
/// such a server from being hammered in a tight loop.
const EMPTY_POLL_MIN: Duration = Duration::from_millis(100);
/// Turns of the scheduler in a row that free no slot, after which a gathering request goes
/// ([`gather_slots`]). A PostgreSQL drain (4 workers × 32, no-op handlers) had claims of 30
/// leases with 2, as with 8 or with a wait of 1 ms, against 16 without gathering.
const GATHER_TURNS: usize = 2;

/// One agent name's long-poll loop and the attempts it started.
pub(super) struct Pool {
    pub(super) shared: Arc<Shared>,
    pub(super) agent: String,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) concurrency: usize,
    pub(super) wait: Span,
    /// See [`Builder::gather`](super::Builder::gather).
    pub(super) gather: bool,
}

/// What a round of the lease loop leaves to do: another round, or stop.
enum Round {
    Again,
    Stop,
}

/// The loop's own state: the handler slots, the report slots, the attempts it started and the
/// back-off after errors.
struct Running {
    slots: Arc<Semaphore>,
    reporting: Arc<Semaphore>,
    tasks: JoinSet<()>,
    backoff: PollBackoff,
    /// The last answer held as many leases as were asked for: more are probably waiting.
    backlog: bool,
}

/// Either token ends the loop: `shutdown` lets running attempts finish, `abandon` also ends them.
struct Stops<'a> {
    shutdown: &'a CancellationToken,
    abandon: &'a CancellationToken,
}

impl Stops<'_> {
    async fn stopping(&self) {
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            _ = self.abandon.cancelled() => {}
        }
    }

    /// Sleeps for `pause`; false when the loop was told to stop meanwhile.
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = self.stopping() => false,
            _ = sleep(pause) => true,
        }
    }
}

impl Pool {
    pub(super) async fn run(self, shutdown: CancellationToken, abandon: CancellationToken) {
        let mut running = Running {
            slots: Arc::new(Semaphore::new(self.concurrency)),
            reporting: Arc::new(Semaphore::new(self.concurrency * REPORTS_PER_SLOT)),
            tasks: JoinSet::new(),
            backoff: PollBackoff::default(),
            backlog: false,
        };
        let stops = Stops {
            shutdown: &shutdown,
            abandon: &abandon,
        };
        while let Round::Again = self.round(&mut running, &stops).await {}
        debug!(agent = %self.agent, running = running.tasks.len(), "no longer taking leases; waiting for running attempts");
        while let Some(done) = running.tasks.join_next().await {
            log_task_end(done);
        }
    }

    /// One lease request for as many slots as are free (at least one, waited for), and an
    /// attempt started for each lease in the answer.
    async fn round(&self, running: &mut Running, stops: &Stops<'_>) -> Round {
        while let Some(done) = running.tasks.try_join_next() {
            log_task_end(done);
        }
        // Hold the slots we ask for while we ask, so `max` never exceeds what is free.
        let Some(mut permits) = self.slots_to_ask(running, stops).await else {
            return Round::Stop;
        };
        let asked = permits.len();
        let request = LeaseRequest {
            worker: self.shared.worker_id.to_string(),
            max: Some(asked),
            wait: Some(self.wait),
        };
        // Taken before sending: every lease in the answer is counted from this instant.
        let sent_at = Instant::now();
        let answer = tokio::select! {
            biased;
            _ = stops.stopping() => return Round::Stop,
            answer = self.shared.client.leases(&self.agent, &request) => answer,
        };
        match answer {
            Ok(response) => {
                running.backoff.reset();
                running.backlog = response.leases.len() >= asked;
                if response.leases.is_empty()
                    && sent_at.elapsed() < EMPTY_POLL_MIN
                    && !stops.pause(EMPTY_POLL_MIN).await
                {
                    return Round::Stop;
                }
                for lease in response.leases {
                    self.start(running, lease, permits.pop(), sent_at, stops.abandon);
                }
            }
            Err(e) => {
                running.backlog = false;
                let pause = running.backoff.next();
                if e.is_transient() {
                    warn!(agent = %self.agent, error = %e, ?pause, "cannot take leases; retrying");
                } else {
                    error!(agent = %self.agent, error = %e, ?pause, "the server refused the lease request; retrying");
                }
                if !stops.pause(pause).await {
                    return Round::Stop;
                }
            }
        }
        Round::Again
    }

    /// The slots the next request asks for: the first to come free, and more (see
    /// [`gather_slots`]). None when the loop was told to stop meanwhile.
    async fn slots_to_ask(
        &self,
        running: &Running,
        stops: &Stops<'_>,
    ) -> Option<Vec<OwnedSemaphorePermit>> {
        let first = tokio::select! {
            biased;
            _ = stops.stopping() => return None,
            permit = running.slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let most = self.concurrency.min(LEASES_PER_CALL_MAX);
        // Gathering only yields a few turns, never sleeps: a stop is seen by the request next.
        let gather = self.gather && running.backlog;
        Some(gather_slots(&running.slots, first, most, gather).await)
    }

    /// Starts an attempt for `lease` in the slot `permit` holds, or gives the lease back when
    /// the server sent more than was asked for.
    fn start(
        &self,
        running: &mut Running,
        lease: Lease,
        permit: Option<OwnedSemaphorePermit>,
        sent_at: Instant,
        abandon: &CancellationToken,
    ) {
        let span = tracing::info_span!(
            "lease",
            agent = %self.agent,
            job = %lease.job_id,
            step = %lease.step,
            attempt = lease.attempt,
            lease = %lease.lease_id,
        );
        match permit {
            Some(permit) => {
                let attempt = Attempt {
                    shared: self.shared.clone(),
                    handler: self.handler.clone(),
                    lease: Arc::new(lease),
                    sent_at,
                    abandon: abandon.clone(),
                    reporting: running.reporting.clone(),
                };
                running.tasks.spawn(attempt.run(permit).instrument(span));
            }
            None => {
                let client = self.shared.client.clone();
                let abandon = abandon.clone();
                running
                    .tasks
                    .spawn(refuse(client, lease, sent_at, abandon).instrument(span));
            }
        }
    }
}

/// The slots one lease request asks for, starting from `first`: every one free now, up to
/// `most`; and with `gather`, those that come free while the worker's other tasks get
/// [`GATHER_TURNS`] turns in a row without freeing one.
///
/// A worker whose handlers are short frees its slots one at a time; asking at the first free
/// slot then means many small requests, each a claim transaction on the server, and a
/// PostgreSQL claim costs about as much for one lease as for thirty. So while the server has a
/// backlog (the last answer filled every slot asked for) the pool first lets the handlers that
/// are ending finish. It never waits on a timer: when the other slots are busy with longer work,
/// the request goes out after a few turns of the scheduler, so no slot stands idle waiting for
/// company. Without a backlog `gather` is false and a request goes out with the first free
/// slot: an idle worker's latency is not touched.
async fn gather_slots(
    slots: &Arc<Semaphore>,
    first: OwnedSemaphorePermit,
    most: usize,
    gather: bool,
) -> Vec<OwnedSemaphorePermit> {
    let mut permits = vec![first];
    take_free(slots, &mut permits, most);
    let mut idle_turns = 0;
    while gather && permits.len() < most && idle_turns < GATHER_TURNS {
        tokio::task::yield_now().await;
        let before = permits.len();
        take_free(slots, &mut permits, most);
        idle_turns = if permits.len() > before {
            0
        } else {
            idle_turns + 1
        };
    }
    permits
}

/// Adds every slot free now to `permits`, up to `most` in all.
fn take_free(slots: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>, most: usize) {
    while permits.len() < most {
        match slots.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }
}

fn log_task_end(done: std::result::Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        if e.is_panic() {
            error!(error = %e, "an attempt's task panicked");
        }
    }
}

/// Capped exponential back-off with jitter, for the lease loop.
struct PollBackoff {
    next: Duration,
}

impl Default for PollBackoff {
    fn default() -> Self {
        PollBackoff {
            next: POLL_BACKOFF_FIRST,
        }
    }
}

impl PollBackoff {
    fn reset(&mut self) {
        self.next = POLL_BACKOFF_FIRST;
    }

    /// The pause to take now: half to all of the current step, so many agents cut off
    /// together do not all come back in the same instant.
    fn next(&mut self) -> Duration {
        let step = self.next;
        self.next = (self.next * 2).min(POLL_BACKOFF_MAX);
        step.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
    }
}

/// Gives back a lease the server sent beyond what we asked for: failed as retryable at once,
/// rather than left to expire, so the step is retried without waiting out its timeout.
async fn refuse(client: Client, lease: Lease, sent_at: Instant, abandon: CancellationToken) {
    warn!("the server sent more leases than asked for; giving this one back");
    let report = Report::Fail {
        error: "the worker received more leases than it asked for".into(),
        retryable: true,
    };
    send_report(
        &client,
        lease.lease_id,
        report,
        local_deadline(sent_at, lease.lease_ms),
        &abandon,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A semaphore of `n` slots with all but one held, the one given as the first permit.
    fn slots_with_one_free(
        n: usize,
    ) -> (
        Arc<Semaphore>,
        OwnedSemaphorePermit,
        Vec<OwnedSemaphorePermit>,
    ) {
        let slots = Arc::new(Semaphore::new(n));
        let held = (1..n)
            .map(|_| slots.clone().try_acquire_owned().unwrap())
            .collect();
        let first = slots.clone().try_acquire_owned().unwrap();
        (slots, first, held)
    }

    // Proves a worker with a backlog asks for the slots of handlers that end while it lets
    // them run, together, and never waits on the clock for them.
    #[tokio::test(start_paused = true)]
    async fn slots_freed_by_ending_handlers_are_asked_for_together() {
        let (slots, first, held) = slots_with_one_free(4);
        for permit in held {
            // A handler that ends after a turn of its own.
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                drop(permit);
            });
        }
        let started = Instant::now();
        let permits = gather_slots(&slots, first, 4, true).await;
        assert_eq!((permits.len(), started.elapsed()), (4, Duration::ZERO));
    }

    // Proves busy slots are not waited for: with the other handlers still working, the
    // request goes out after a few turns, at once by the clock.
    #[tokio::test(start_paused = true)]
    async fn busy_slots_are_not_waited_for() {
        let (slots, first, held) = slots_with_one_free(4);
        let working = tokio::spawn(async move {
            sleep(Duration::from_millis(10)).await;
            drop(held);
        });
        let started = Instant::now();
        let permits = gather_slots(&slots, first, 4, true).await;
        assert_eq!((permits.len(), started.elapsed()), (1, Duration::ZERO));
        working.await.unwrap();
    }

    // Proves that without a backlog (no gathering) a request takes what is free at once, even
    // with a handler about to end, and that `most` bounds what is asked for.
    #[tokio::test(start_paused = true)]
    async fn without_a_backlog_a_request_takes_only_what_is_free() {
        let (slots, first, mut held) = slots_with_one_free(4);
        drop(held.pop());
        let ending = held.pop().unwrap();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            drop(ending);
        });
        let permits = gather_slots(&slots, first, 4, false).await;
        assert_eq!(permits.len(), 2);
        drop(permits);
        drop(held);
        tokio::task::yield_now().await;
        let first = slots.clone().try_acquire_owned().unwrap();
        let permits = gather_slots(&slots, first, 3, true).await;
        assert_eq!(permits.len(), 3);
    }

    // Proves the poll back-off doubles up to its cap and jitters within half of each step.
    #[test]
    fn poll_backoff_is_capped() {
        let mut b = PollBackoff::default();
        let mut last = Duration::ZERO;
        for _ in 0..20 {
            last = b.next();
            assert!(last <= POLL_BACKOFF_MAX);
        }
        assert!(last >= POLL_BACKOFF_MAX / 2);
        b.reset();
        assert!(b.next() <= POLL_BACKOFF_FIRST);
    }
}
