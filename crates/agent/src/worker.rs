//! The agent runtime: take leases, run handlers, keep leases alive, report, and stop in time.
//!
//! The rule everything here serves (guarantee 4 in docs/guarantees.md): a lease is ours only until its
//! deadline, and the deadline is kept on *our* monotonic clock, counted from the instant we
//! *sent* the request whose answer granted or renewed the lease. The server counted `lease_ms`
//! from a later instant (when it answered), so our deadline can only be early, never late, and
//! no clock skew between the machines matters. When our deadline passes, the handler's future
//! is dropped (which stops its work) and nothing is reported: by then another agent may hold
//! the step.
//!
//! The local deadline is `sent_at + lease_ms - margin`, where the margin is 5% of `lease_ms`
//! or 50ms, whichever is larger. The margin covers what the monotonic clock cannot: the gap
//! between our deadline check and the request really leaving, timer granularity, and the two
//! clocks running at slightly different rates over a long lease. 5% keeps long leases
//! comfortable (1.5s of a 30s lease); the 50ms floor keeps a 100ms lease from being cut to a
//! few milliseconds of slack.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use overseer_core::wire::{HeartbeatResponse, Lease, LeaseRequest};
use overseer_core::{JobId, LeaseId, Span};
use rand::Rng;
use serde_json::Value;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tracing::{debug, error, info, warn, Instrument};

use crate::client::{self, Client};
use crate::reports::{send_report, Report, Reporter};

/// Why a worker cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("a worker needs at least one handler")]
    NoHandlers,
    #[error("two handlers for agent `{0}`")]
    DuplicateHandler(String),
    #[error("an agent name must not be empty")]
    EmptyAgentName,
    #[error("a worker id must be 1 to 200 bytes without control characters, got {0:?}")]
    BadWorkerId(String),
    #[error("concurrency must be at least 1")]
    ZeroConcurrency,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a handler says an attempt failed: whether trying again may help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepError {
    pub message: String,
    /// `false` fails the step permanently, whatever attempts it has left.
    pub retryable: bool,
}

impl StepError {
    /// A failure worth another attempt (after the step's backoff): a timeout, a 503, a lock.
    pub fn retryable(message: impl Into<String>) -> Self {
        StepError {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure no retry will fix: bad input, a refused request, a missing resource.
    pub fn fatal(message: impl Into<String>) -> Self {
        StepError {
            message: message.into(),
            retryable: false,
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.retryable { "retryable" } else { "fatal" };
        write!(f, "{} ({kind})", self.message)
    }
}

impl std::error::Error for StepError {}

/// What a handler gets for one attempt of one step.
#[derive(Clone, Debug)]
pub struct StepContext {
    lease: Arc<Lease>,
    worker: Arc<str>,
    cancel: CancellationToken,
    deadline: watch::Receiver<Instant>,
    progress: Arc<Mutex<Option<Value>>>,
}

impl StepContext {
    /// The whole lease as the server granted it.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn lease_id(&self) -> LeaseId {
        self.lease.lease_id
    }

    pub fn job_id(&self) -> JobId {
        self.lease.job_id
    }

    pub fn step(&self) -> &str {
        &self.lease.step
    }

    /// The attempt number, from 1; it increases at every lease of the step.
    pub fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    pub fn payload(&self) -> &Value {
        &self.lease.payload
    }

    /// Each dependency's result, by dependency name.
    pub fn inputs(&self) -> &serde_json::Map<String, Value> {
        &self.lease.inputs
    }

    /// `{job_id}/{step}`: the same on every attempt, for remote services to deduplicate by.
    pub fn idempotency_key(&self) -> &str {
        &self.lease.idempotency_key
    }

    /// This worker's id as the server records it.
    pub fn worker_id(&self) -> &str {
        &self.worker
    }

    /// Resolves when the server asks this attempt to stop because its job is being cancelled.
    /// A handler that watches it may wind down within the worker's cancel grace; one that does
    /// not is dropped when the grace ends.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The cancellation signal as a token, to hand to code that takes one.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The local deadline as it stands now; heartbeats move it later. When it passes, the
    /// handler is dropped. Useful to bound calls to remote services.
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Sets the progress the next heartbeat carries to the server (any JSON, at most the
    /// server's `limits.progress_bytes`, 4 KiB by default, encoded). It is sent once, with the
    /// next regular heartbeat (again with the one after if that one fails); a newer value set
    /// before then replaces it. The server keeps the last one on the step (`progress` in
    /// `GET /v1/jobs/{id}`), and records it in the job's history only for a step submitted with
    /// `progress_events: true`.
    pub fn set_progress(&self, progress: Value) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(progress);
    }
}

/// Runs one attempt of a step. Implemented for every
/// `Fn(StepContext) -> impl Future<Output = Result<Value, StepError>>`.
pub trait Handler: Send + Sync + 'static {
    fn call(&self, ctx: StepContext) -> BoxFuture<'static, Result<Value, StepError>>;
}

impl<F, Fut> Handler for F
where
    F: Fn(StepContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, StepError>> + Send + 'static,
{
    fn call(&self, ctx: StepContext) -> BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(self(ctx))
    }
}

/// The most leases one request may ask for (the server's default `leases_per_call`).
pub const LEASES_PER_CALL_MAX: usize = 100;

/// Reports that may wait for their answer per slot of `concurrency`. A report's answer takes a
/// commit and a round trip, usually longer than a short handler runs, so with one report per
/// slot the reports, not the handlers, set the pace: a PostgreSQL drain (4 workers × 32) ran
/// 6,430 steps/s with one per slot, 7,710 with two and 8,200 with four; a SQLite drain 18,100
/// and 20,500 (one and four). Still bounded, so a server slow to answer slows the claims.
pub const REPORTS_PER_SLOT: usize = 4;
/// The long-poll wait used unless the builder says otherwise.
pub const DEFAULT_WAIT: Span = Span::from_secs(20);
/// Poll back-off after errors: first pause, and the cap it doubles up to.
const POLL_BACKOFF_FIRST: Duration = Duration::from_millis(250);
const POLL_BACKOFF_MAX: Duration = Duration::from_secs(15);
/// An empty lease answer faster than this means the server did not long-poll; pausing keeps
/// such a server from being hammered in a tight loop.
const EMPTY_POLL_MIN: Duration = Duration::from_millis(100);
/// The shortest pause between two heartbeats of one lease, so a tiny lease cannot spin.
const HEARTBEAT_MIN: Duration = Duration::from_millis(10);
/// A failed heartbeat is retried this soon at the latest (sooner if the interval is shorter).
const HEARTBEAT_RETRY_MAX: Duration = Duration::from_secs(1);

/// Builds a [`Worker`].
pub struct Builder {
    client: Client,
    worker_id: Option<String>,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    concurrency: usize,
    wait: Span,
    cancel_grace: Duration,
    error: Option<Error>,
}

impl Builder {
    /// This worker's id as the server records it. Default: host name, process id and a short
    /// random suffix (so two workers in one process are told apart).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// Runs `handler` for every lease of agent name `agent`. Each agent name gets its own
    /// long-poll loop and its own `concurrency` slots.
    pub fn handler(mut self, agent: impl Into<String>, handler: impl Handler) -> Self {
        let agent = agent.into();
        if agent.is_empty() {
            self.error.get_or_insert(Error::EmptyAgentName);
        } else if self
            .handlers
            .insert(agent.clone(), Arc::new(handler))
            .is_some()
        {
            self.error.get_or_insert(Error::DuplicateHandler(agent));
        }
        self
    }

    /// How many attempts may run at once, per agent name. Default 1. An attempt's slot is free
    /// again as soon as its handler returns; its report is sent while the next lease runs, and
    /// [`REPORTS_PER_SLOT`] reports per slot may wait for their answers before a slot is held
    /// for one.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// How long one lease request may wait on the server for work. Default 20s.
    pub fn wait(mut self, wait: Span) -> Self {
        self.wait = wait;
        self
    }

    /// How long a handler may go on after the server asked to cancel its attempt, to wind
    /// down cleanly (it sees [`StepContext::cancelled`] at once). Default zero: dropped at once.
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    pub fn build(self) -> Result<Worker> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.handlers.is_empty() {
            return Err(Error::NoHandlers);
        }
        if self.concurrency == 0 {
            return Err(Error::ZeroConcurrency);
        }
        let worker_id = match self.worker_id {
            Some(id) => {
                if id.is_empty() || id.len() > 200 || id.chars().any(char::is_control) {
                    return Err(Error::BadWorkerId(id));
                }
                id
            }
            None => default_worker_id(),
        };
        Ok(Worker {
            client: self.client,
            worker_id: worker_id.into(),
            handlers: self.handlers,
            concurrency: self.concurrency,
            wait: self.wait,
            cancel_grace: self.cancel_grace,
        })
    }
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "agent".to_string());
    let suffix: u16 = rand::thread_rng().gen();
    format!("{host}-{}-{suffix:04x}", std::process::id())
}

/// Pulls leases for one or more agent names and runs their handlers.
pub struct Worker {
    client: Client,
    worker_id: Arc<str>,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    concurrency: usize,
    wait: Span,
    cancel_grace: Duration,
}

/// What every lease task of a worker shares.
struct Shared {
    client: Client,
    /// Sends the attempts' reports, batching them when many end at once.
    reporter: Reporter,
    worker_id: Arc<str>,
    cancel_grace: Duration,
}

impl Worker {
    pub fn builder(client: Client) -> Builder {
        Builder {
            client,
            worker_id: None,
            handlers: BTreeMap::new(),
            concurrency: 1,
            wait: DEFAULT_WAIT,
            cancel_grace: Duration::ZERO,
            error: None,
        }
    }

    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Runs until `shutdown` fires, then takes no new lease and returns once every running
    /// attempt has finished and reported (each still bound by its deadline).
    pub async fn run(self, shutdown: CancellationToken) {
        self.run_until_abandon(shutdown, CancellationToken::new())
            .await
    }

    /// Like [`Worker::run`], and when `abandon` fires every running handler is dropped at once
    /// and nothing more is reported: the leases simply expire and the steps are retried
    /// elsewhere. `abandon` also stops taking leases, as `shutdown` does.
    ///
    /// Leases the server granted in an answer still in flight when `shutdown` fires are never
    /// seen; they expire like abandoned ones. Stopping at once matters more on shutdown than
    /// saving those few attempts.
    pub async fn run_until_abandon(self, shutdown: CancellationToken, abandon: CancellationToken) {
        let shared = Arc::new(Shared {
            reporter: Reporter::start(self.client.clone()),
            client: self.client,
            worker_id: self.worker_id,
            cancel_grace: self.cancel_grace,
        });
        info!(
            worker = %shared.worker_id,
            agents = ?self.handlers.keys().collect::<Vec<_>>(),
            concurrency = self.concurrency,
            "worker started"
        );
        let loops = self.handlers.into_iter().map(|(agent, handler)| {
            let pool = Pool {
                shared: shared.clone(),
                agent,
                handler,
                concurrency: self.concurrency,
                wait: self.wait,
            };
            pool.run(shutdown.clone(), abandon.clone())
        });
        futures::future::join_all(loops).await;
        info!(worker = %shared.worker_id, "worker stopped");
    }
}

/// One agent name's long-poll loop and the attempts it started.
struct Pool {
    shared: Arc<Shared>,
    agent: String,
    handler: Arc<dyn Handler>,
    concurrency: usize,
    wait: Span,
}

impl Pool {
    async fn run(self, shutdown: CancellationToken, abandon: CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let reporting = Arc::new(Semaphore::new(self.concurrency * REPORTS_PER_SLOT));
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut backoff = PollBackoff::default();
        let stopping = || async {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = abandon.cancelled() => {}
            }
        };
        loop {
            while let Some(done) = tasks.try_join_next() {
                log_task_end(done);
            }
            // Hold the slots we ask for while we ask, so `max` never exceeds what is free.
            let first = tokio::select! {
                biased;
                _ = stopping() => break,
                permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            };
            let mut permits = vec![first];
            while permits.len() < LEASES_PER_CALL_MAX {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let request = LeaseRequest {
                worker: self.shared.worker_id.to_string(),
                max: Some(permits.len()),
                wait: Some(self.wait),
            };
            // Taken before sending: every lease in the answer is counted from this instant.
            let sent_at = Instant::now();
            let answer = tokio::select! {
                biased;
                _ = stopping() => break,
                answer = self.shared.client.leases(&self.agent, &request) => answer,
            };
            match answer {
                Ok(response) => {
                    backoff.reset();
                    if response.leases.is_empty() && sent_at.elapsed() < EMPTY_POLL_MIN {
                        tokio::select! {
                            _ = stopping() => break,
                            _ = sleep(EMPTY_POLL_MIN) => {}
                        }
                    }
                    for lease in response.leases {
                        let span = tracing::info_span!(
                            "lease",
                            agent = %self.agent,
                            job = %lease.job_id,
                            step = %lease.step,
                            attempt = lease.attempt,
                            lease = %lease.lease_id,
                        );
                        match permits.pop() {
                            Some(permit) => {
                                let attempt = Attempt {
                                    shared: self.shared.clone(),
                                    handler: self.handler.clone(),
                                    lease: Arc::new(lease),
                                    sent_at,
                                    abandon: abandon.clone(),
                                    reporting: reporting.clone(),
                                };
                                tasks.spawn(attempt.run(permit).instrument(span));
                            }
                            None => {
                                let client = self.shared.client.clone();
                                let abandon = abandon.clone();
                                tasks.spawn(
                                    refuse(client, lease, sent_at, abandon).instrument(span),
                                );
                            }
                        }
                    }
                }
                Err(e) => {
                    let pause = backoff.next();
                    if e.is_transient() {
                        warn!(agent = %self.agent, error = %e, ?pause, "cannot take leases; retrying");
                    } else {
                        error!(agent = %self.agent, error = %e, ?pause, "the server refused the lease request; retrying");
                    }
                    tokio::select! {
                        _ = stopping() => break,
                        _ = sleep(pause) => {}
                    }
                }
            }
        }
        debug!(agent = %self.agent, running = tasks.len(), "no longer taking leases; waiting for running attempts");
        while let Some(done) = tasks.join_next().await {
            log_task_end(done);
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
struct Attempt {
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
    lease: Arc<Lease>,
    sent_at: Instant,
    abandon: CancellationToken,
    /// Reports of this pool waiting for their answer, at most [`REPORTS_PER_SLOT`] per slot
    /// (see [`Attempt::run`]).
    reporting: Arc<Semaphore>,
}

impl Attempt {
    async fn run(self, slot: OwnedSemaphorePermit) {
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
