//! One attempt of a step: confirm a lease that arrived late, run the handler under heartbeats
//! until it ends, is cancelled or its local deadline passes, and report how it ended. The
//! deadline rule is in the [module documentation](super).

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use overseer_core::wire::{HeartbeatResponse, Lease};
use serde_json::Value;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Handler, Shared, StepContext, StepError};
use crate::client;
use crate::reports::{send_report, Report};

/// The shortest pause between two heartbeats of one lease, so a tiny lease cannot spin.
const HEARTBEAT_MIN: Duration = Duration::from_millis(10);
/// A failed heartbeat is retried this soon at the latest (sooner if the interval is shorter).
const HEARTBEAT_RETRY_MAX: Duration = Duration::from_secs(1);

/// The local deadline of a lease granted or renewed by a request sent at `sent_at`.
pub fn local_deadline(sent_at: Instant, lease_ms: u64) -> Instant {
    let margin_ms = (lease_ms / 20).max(50);
    sent_at + Duration::from_millis(lease_ms.saturating_sub(margin_ms))
}

/// A third of the step's timeout, the documented heartbeat interval (of the lease if the timeout is unknown).
fn heartbeat_interval(lease: &Lease) -> Duration {
    let base = if lease.timeout_ms > 0 {
        lease.timeout_ms
    } else {
        lease.lease_ms
    };
    Duration::from_millis(base / 3).max(HEARTBEAT_MIN)
}

/// When to send the next heartbeat: one interval from now, but no later than half-way to the
/// deadline, so a lease that arrived late (its long-poll ate into it) or that the server
/// renewed for less than a timeout is still renewed in time.
fn next_beat(now: Instant, deadline: Instant, interval: Duration) -> Instant {
    let half_left = deadline.saturating_duration_since(now) / 2;
    now + interval.min(half_left).max(HEARTBEAT_MIN)
}

/// How a handler ended: its own answer, or the message of its panic.
type Outcome = std::result::Result<std::result::Result<Value, StepError>, String>;

enum Ending {
    Finished(Outcome),
    /// The server asked to cancel; the handler's answer if it gave one within the grace.
    Cancelled(Option<Outcome>),
}

/// One attempt: the handler, its heartbeats, its deadline and its report.
pub(super) struct Attempt {
    pub(super) shared: Arc<Shared>,
    pub(super) handler: Arc<dyn Handler>,
    pub(super) lease: Arc<Lease>,
    pub(super) sent_at: Instant,
    pub(super) abandon: CancellationToken,
    /// Reports of this pool waiting for their answer, at most
    /// [`REPORTS_PER_SLOT`](super::REPORTS_PER_SLOT) per slot (see [`Attempt::run`]).
    pub(super) reporting: Arc<Semaphore>,
}

impl Attempt {
    pub(super) async fn run(self, slot: OwnedSemaphorePermit) {
        let deadline = local_deadline(self.sent_at, self.lease.lease_ms);
        let Some(deadline) = self.confirm_if_late(deadline).await else {
            return;
        };
        let Some((ending, deadline)) = self.supervise(deadline).await else {
            return;
        };
        let report = report_of(ending);
        // The slot is for running: it goes back once the handler has ended, so the pool asks
        // for its next lease while this report waits for an answer. (Held until the answer, it
        // made every attempt wait out a commit and a round trip it had no part in: a drain ran
        // 18,900 steps/s that way and 23,200 this way.) Reports waiting are bounded as well
        // ([`REPORTS_PER_SLOT`]): when they are all taken, the slot is held until one is
        // answered, so a server slow to settle reports slows the claims down with it.
        let waiting = tokio::select! {
            biased;
            _ = self.abandon.cancelled() => return,
            permit = self.reporting.clone().acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
        };
        drop(slot);
        self.shared
            .reporter
            .send(self.lease.lease_id, report, deadline, &self.abandon)
            .await;
        drop(waiting);
    }

    /// The long-poll's wait counts against the lease (it is measured from the send). If that ate
    /// more than half of it, the lease is confirmed with a heartbeat before it starts: the
    /// renewal is counted from now, and a lease already lost is never started. Answers the
    /// lease's local deadline, or `None` when the attempt must not run.
    async fn confirm_if_late(&self, deadline: Instant) -> Option<Instant> {
        let lease_ms = self.lease.lease_ms;
        let left = deadline.saturating_duration_since(Instant::now());
        if left >= Duration::from_millis(lease_ms) / 2 {
            return Some(deadline);
        }
        let client = &self.shared.client;
        let lease_id = self.lease.lease_id;
        let sent = Instant::now();
        let answer = tokio::select! {
            biased;
            _ = self.abandon.cancelled() => return None,
            answer = client.heartbeat(lease_id, None) => answer,
        };
        match answer {
            Ok(hb) if hb.cancel => {
                let deadline = local_deadline(sent, hb.lease_ms);
                let report = Report::Fail {
                    error: "cancelled".into(),
                    retryable: false,
                };
                send_report(client, lease_id, report, deadline, &self.abandon).await;
                None
            }
            Ok(hb) => Some(local_deadline(sent, hb.lease_ms)),
            Err(client::Error::LeaseLost(p)) => {
                info!(detail = %p.detail, "lease lost before it started; not running it");
                None
            }
            Err(e) if deadline <= Instant::now() => {
                warn!(error = %e, "cannot confirm a lease that arrived late; leaving it to expire");
                None
            }
            Err(e) => {
                warn!(error = %e, "cannot confirm a lease that arrived late; running it anyway");
                Some(deadline)
            }
        }
    }

    /// Runs the handler under heartbeats until it ends, the server asks to cancel (the handler
    /// then has the cancel grace to stop), or the lease is lost. Answers how it ended and the
    /// lease's local deadline then; `None` when nothing must be reported: abandoned, the
    /// deadline passed, or the server refused a heartbeat. The handler lives only inside this
    /// function: leaving it by any path drops the handler (and so stops its work) before
    /// anything is reported.
    async fn supervise(&self, mut deadline: Instant) -> Option<(Ending, Instant)> {
        let client = self.shared.client.clone();
        let lease_id = self.lease.lease_id;
        let lease_ms = self.lease.lease_ms;
        let interval = heartbeat_interval(&self.lease);
        let cancel = CancellationToken::new();
        let progress: Arc<Mutex<Option<Value>>> = Arc::default();
        let (deadline_tx, deadline_rx) = watch::channel(deadline);
        let ctx = StepContext {
            lease: self.lease.clone(),
            worker: self.shared.worker_id.clone(),
            cancel: cancel.clone(),
            deadline: deadline_rx,
            progress: progress.clone(),
        };
        debug!(?interval, lease_ms, "attempt started");

        let work = AssertUnwindSafe(self.handler.call(ctx)).catch_unwind();
        tokio::pin!(work);
        let expiry = sleep_until(deadline);
        tokio::pin!(expiry);
        let mut beat_at = next_beat(Instant::now(), deadline, interval);
        // A heartbeat in flight: when it was sent, the progress it carries, its answer.
        type Beat = (Instant, Option<Value>, client::Result<HeartbeatResponse>);
        let mut beat: Option<BoxFuture<'static, Beat>> = None;
        let mut cancel_by: Option<Instant> = None;
        let ending = loop {
            tokio::select! {
                biased;
                _ = self.abandon.cancelled() => {
                    info!("abandoned: dropping the handler; the lease will expire");
                    return None;
                }
                _ = &mut expiry => {
                    warn!("the lease's local deadline passed: dropping the handler and reporting nothing");
                    return None;
                }
                out = &mut work => {
                    let out = out.map_err(panic_message);
                    break if cancel_by.is_some() { Ending::Cancelled(Some(out)) } else { Ending::Finished(out) };
                }
                _ = sleep_until(cancel_by.unwrap_or(deadline)), if cancel_by.is_some() => {
                    info!("the handler did not stop within the cancel grace: dropping it");
                    break Ending::Cancelled(None);
                }
                (sent, carried, answer) = async { beat.as_mut().expect("guarded by is_some").await }, if beat.is_some() => {
                    beat = None;
                    let now = Instant::now();
                    match answer {
                        Ok(hb) => {
                            deadline = local_deadline(sent, hb.lease_ms);
                            expiry.as_mut().reset(deadline);
                            deadline_tx.send_replace(deadline);
                            if hb.cancel {
                                info!("the job is being cancelled: stopping the handler");
                                cancel.cancel();
                                if self.shared.cancel_grace.is_zero() {
                                    break Ending::Cancelled(None);
                                }
                                cancel_by = Some(now + self.shared.cancel_grace);
                            } else {
                                beat_at = next_beat(now, deadline, interval);
                            }
                        }
                        Err(client::Error::LeaseLost(p)) => {
                            info!(detail = %p.detail, "lease lost (409 on heartbeat): dropping the handler and reporting nothing");
                            return None;
                        }
                        Err(e) if matches!(e.status(), Some(404 | 410)) => {
                            info!(error = %e, "the server no longer knows this lease: dropping the handler and reporting nothing");
                            return None;
                        }
                        Err(e) => {
                            warn!(error = %e, "heartbeat failed; retrying before the deadline");
                            // Its progress goes with the next one, unless newer was set.
                            let mut pending = progress.lock().unwrap_or_else(|e| e.into_inner());
                            if pending.is_none() {
                                *pending = carried;
                            }
                            drop(pending);
                            beat_at = next_beat(now, deadline, interval.min(HEARTBEAT_RETRY_MAX));
                        }
                    }
                }
                _ = sleep_until(beat_at), if beat.is_none() && cancel_by.is_none() => {
                    let client = client.clone();
                    // Progress is sent once: the next heartbeat carries only newer progress.
                    let carried = progress.lock().unwrap_or_else(|e| e.into_inner()).take();
                    beat = Some(Box::pin(async move {
                        // Taken before sending: the renewal is counted from this instant.
                        let sent = Instant::now();
                        let answer = client.heartbeat(lease_id, carried.clone()).await;
                        (sent, carried, answer)
                    }));
                }
            }
        };
        Some((ending, deadline))
    }
}

/// What to report of how a handler ended.
fn report_of(ending: Ending) -> Report {
    match ending {
        Ending::Finished(Ok(Ok(result))) => Report::Complete(result),
        Ending::Finished(Ok(Err(e))) => Report::Fail {
            error: e.message,
            retryable: e.retryable,
        },
        Ending::Finished(Err(panic)) => Report::Fail {
            error: format!("the handler panicked: {panic}"),
            retryable: true,
        },
        // Work that finished despite the cancel is reported as done: its effects happened,
        // and only a completed step is compensated.
        Ending::Cancelled(Some(Ok(Ok(result)))) => Report::Complete(result),
        Ending::Cancelled(Some(Ok(Err(e)))) => Report::Fail {
            error: format!("cancelled: {}", e.message),
            retryable: false,
        },
        Ending::Cancelled(Some(Err(panic))) => Report::Fail {
            error: format!("cancelled (the handler panicked: {panic})"),
            retryable: false,
        },
        Ending::Cancelled(None) => Report::Fail {
            error: "cancelled".into(),
            retryable: false,
        },
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the deadline margin is 5% of the lease with a 50ms floor, and never underflows.
    #[test]
    fn deadline_margin() {
        let t = Instant::now();
        assert_eq!(local_deadline(t, 30_000), t + Duration::from_millis(28_500));
        assert_eq!(local_deadline(t, 600), t + Duration::from_millis(550));
        assert_eq!(local_deadline(t, 20), t);
    }

    // Proves heartbeats come every third of the timeout, earlier when the deadline is close.
    #[test]
    fn heartbeat_schedule() {
        let t = Instant::now();
        let interval = Duration::from_secs(10);
        assert_eq!(
            next_beat(t, t + Duration::from_secs(28), interval),
            t + interval
        );
        assert_eq!(
            next_beat(t, t + Duration::from_secs(8), interval),
            t + Duration::from_secs(4)
        );
        assert_eq!(next_beat(t, t, interval), t + HEARTBEAT_MIN);
    }
}
