//! Overseer speaks the Faktory work protocol (version 2), so existing Faktory client libraries act
//! as producers and workers of the same system the HTTP API drives.
//!
//! Started by `overseer server --faktory-listen ADDR`. Everything goes through the node's
//! [`overseer_server::App`] and the [`overseer_store::Store`] trait: a pushed job is an
//! ordinary one-step job (see [`job`] for the mapping), `FETCH` is `Leases::steps_claim`, and
//! `ACK`/`FAIL` are `Command::Complete`/`Command::Fail` applied through the core, so leases,
//! fencing, retries, expiry and the supervisor are the same as for HTTP agents.
//!
//! # Who may report a job (fencing)
//!
//! Every lease handed out by `FETCH` has a *holder*: the `wid` the connection gave in `HELLO`,
//! or, for a connection without a `wid`, a random identity of that one connection. `ACK` and
//! `FAIL` apply only when the connection's holder is the holder of the step's live lease, and
//! then only to that lease's attempt, which the core checks again in the write transaction
//! (attempt, state `running`, not expired). So:
//! - a late `ACK` from a worker whose reservation expired (and perhaps was re-leased) changes
//!   nothing and answers `+OK`, as Faktory answers an `ACK` of a job it no longer holds;
//!   a late `FAIL` answers `-ERR Job not found <jid>` (Faktory's message);
//! - a producer connection (no `wid`) can only report what it fetched itself on that same
//!   connection; it cannot `ACK`/`FAIL` a job some worker holds (Faktory lets any connection do
//!   that). Its leases are released (a retryable failure) when the connection closes, since
//!   nothing can report them afterwards.
//!
//! # Workers and BEAT
//!
//! Workers (connections with a `wid`) are tracked in memory, on this node only. A `BEAT` answers
//! `+OK`, or `{"state":"quiet"}` / `{"state":"terminate"}` once [`Faktory::signal`] asked for
//! it (states only move forward, as in Faktory). A quiet or terminating worker's `FETCH` waits
//! and answers nothing. A worker silent (no `HELLO`, `BEAT` or command) for longer than
//! [`Config::beat_grace`] (default 60 s, Faktory's own worker expiry) is forgotten and the
//! leases it holds from this node are released at once. The core has no "release" command, so
//! release is `Command::Fail { retryable: true }`: it counts a failed attempt and the retry
//! waits for the job's backoff, exactly like an expired reservation.

pub mod conn;
pub mod job;
pub mod resp;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use overseer_core::backoff::Backoff;
use overseer_core::{Command, JobId, LeaseId, Span, Timestamp};
use overseer_server::App;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use job::FailInfo;

/// Settings of the Faktory listener.
#[derive(Clone, Debug)]
pub struct Config {
    /// When set, clients must prove they know it (`HELLO` `pwdhash`).
    pub password: Option<String>,
    /// Whether `FLUSH` is allowed (development and tests only).
    pub allow_flush: bool,
    /// How long a worker may stay silent before its leases are released.
    pub beat_grace: Duration,
    /// How often silent workers are looked for.
    pub sweep_interval: Duration,
    /// How long `FETCH` waits for work (Faktory: 2 s).
    pub fetch_wait: Duration,
    /// The shortest reservation (Faktory: 60 s); lower only in tests.
    pub reserve_min: Span,
    /// Retry delays of pushed jobs: `None` (the default) is Faktory's own formula,
    /// `count⁴ + 15 + rand(30) × (count + 1)` seconds; `Some` an exponential backoff instead
    /// (tests use short ones).
    pub backoff: Option<Backoff>,
    /// Connections open at once at most; more are closed as they arrive, so idle connections
    /// cannot exhaust the node.
    pub max_connections: usize,
    /// With an acceptor, clients speak TLS (`tcp+tls://` in Faktory client libraries).
    pub tls: Option<Tls>,
}

/// The listener's TLS acceptor (its certificate and key are never printed).
#[derive(Clone)]
pub struct Tls(pub overseer_server::listen::TlsAcceptor);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(<certificate>)")
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_connections: 10_000,
            tls: None,
            password: None,
            allow_flush: false,
            beat_grace: Duration::from_secs(60),
            sweep_interval: Duration::from_secs(1),
            fetch_wait: Duration::from_secs(2),
            reserve_min: Span::from_secs(60),
            backoff: None,
        }
    }
}

/// The version `INFO` reports: the Faktory release whose protocol this follows.
pub const FAKTORY_VERSION: &str = "1.9.3";

/// A worker's lifecycle state, as Faktory has it: running → quiet → terminate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WorkerState {
    Running,
    Quiet,
    Terminate,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Quiet => "quiet",
            WorkerState::Terminate => "terminate",
        }
    }
}

/// A worker process as this node sees it.
#[derive(Clone, Debug)]
pub struct WorkerInfo {
    pub wid: String,
    pub hostname: Option<String>,
    pub pid: Option<i64>,
    pub labels: Vec<String>,
    pub state: WorkerState,
    pub rss_kb: Option<i64>,
    pub connections: usize,
    pub last_beat: Instant,
    /// BEATs received.
    pub beats: u64,
}

/// A lease this node handed out over FETCH.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub job_id: JobId,
    pub step: usize,
    pub attempt: u32,
    pub lease_id: LeaseId,
    pub holder: String,
    pub expires_at: Timestamp,
}

/// The Faktory side of one node. Cheap to clone.
#[derive(Clone)]
pub struct Faktory {
    inner: Arc<Inner>,
}

struct Inner {
    app: App,
    config: Config,
    workers: Mutex<HashMap<String, WorkerInfo>>,
    /// jid → the lease this node handed out for it.
    leases: Mutex<HashMap<String, Held>>,
    /// jid → the last FAIL report, for the `failure` block (bounded). The step's `last_error`
    /// keeps the same report durably; this only spares a parse.
    failures: Mutex<HashMap<String, FailInfo>>,
    /// Queues pushed to through this node and not removed since: `INFO` lists them even when
    /// empty, as Faktory lists the queues it knows (bounded).
    queues: Mutex<BTreeSet<String>>,
    started: Instant,
    connections: AtomicU64,
    commands: AtomicU64,
    processed: AtomicU64,
    failed: AtomicU64,
    reaped_workers: AtomicU64,
    released_leases: AtomicU64,
}

const FAILURES_KEPT: usize = 10_000;
const QUEUES_KEPT: usize = 10_000;

impl Faktory {
    pub fn new(app: App, config: Config) -> Faktory {
        Faktory {
            inner: Arc::new(Inner {
                app,
                config,
                workers: Mutex::new(HashMap::new()),
                leases: Mutex::new(HashMap::new()),
                failures: Mutex::new(HashMap::new()),
                queues: Mutex::new(BTreeSet::new()),
                started: Instant::now(),
                connections: AtomicU64::new(0),
                commands: AtomicU64::new(0),
                processed: AtomicU64::new(0),
                failed: AtomicU64::new(0),
                reaped_workers: AtomicU64::new(0),
                released_leases: AtomicU64::new(0),
            }),
        }
    }

    pub fn app(&self) -> &App {
        &self.inner.app
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Serves the protocol on `listener` and runs the silent-worker sweep until the node shuts
    /// down. Hand the result to `overseer_server::serve_with`.
    pub fn start(&self, listener: TcpListener) -> Vec<JoinHandle<()>> {
        let accept = {
            let me = self.clone();
            tokio::spawn(async move { me.accept_loop(listener).await })
        };
        let sweep = {
            let me = self.clone();
            tokio::spawn(async move { me.sweep_loop().await })
        };
        vec![accept, sweep]
    }

    async fn accept_loop(self, listener: TcpListener) {
        let shutdown = self.app().shutdown().clone();
        let slots = Arc::new(tokio::sync::Semaphore::new(
            self.inner.config.max_connections.max(1),
        ));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Ok(slot) = slots.clone().try_acquire_owned() else {
                            tracing::warn!(%peer, "too many Faktory connections: closing a new one");
                            continue;
                        };
                        let me = self.clone();
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(async move {
                            let _slot = slot;
                            me.inner.connections.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = me.serve_stream(stream).await {
                                tracing::debug!(%peer, error = %e, "faktory connection ended");
                            }
                            me.inner.connections.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "faktory accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }

    /// One connection, through a TLS handshake first when the listener has a certificate.
    async fn serve_stream(&self, stream: tokio::net::TcpStream) -> std::io::Result<()> {
        match &self.inner.config.tls {
            None => conn::Connection::run(self.clone(), stream).await,
            Some(Tls(acceptor)) => {
                let handshake = acceptor.accept(stream);
                match tokio::time::timeout(Duration::from_secs(10), handshake).await {
                    Ok(Ok(tls)) => conn::Connection::run(self.clone(), tls).await,
                    Ok(Err(e)) => Err(e),
                    Err(_) => Ok(()),
                }
            }
        }
    }

    async fn sweep_loop(self) {
        let shutdown = self.app().shutdown().clone();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.inner.config.sweep_interval) => self.sweep().await,
            }
        }
    }

    /// One pass: forget workers silent for longer than the grace period and release their
    /// leases; drop lease records long past their expiry.
    pub async fn sweep(&self) {
        let grace = self.inner.config.beat_grace;
        let gone: Vec<String> = {
            let mut workers = lock(&self.inner.workers);
            let gone: Vec<String> = workers
                .values()
                .filter(|w| w.last_beat.elapsed() > grace)
                .map(|w| w.wid.clone())
                .collect();
            for wid in &gone {
                workers.remove(wid);
            }
            gone
        };
        for wid in gone {
            self.inner.reaped_workers.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                wid,
                "faktory worker stopped sending BEAT: releasing its jobs"
            );
            let reason = format!(
                "WorkerLost: worker {wid} sent no BEAT for more than {} s",
                grace.as_secs_f64()
            );
            self.release_holder(&wid, &reason).await;
        }
        let horizon = Timestamp::from_millis(self.app().now().as_millis() - 600_000);
        lock(&self.inner.leases).retain(|_, h| h.expires_at > horizon);
    }

    /// Releases every lease `holder` holds from this node: a retryable failure of its attempt.
    pub(crate) async fn release_holder(&self, holder: &str, reason: &str) {
        let held: Vec<(String, Held)> = lock(&self.inner.leases)
            .iter()
            .filter(|(_, h)| h.holder == holder)
            .map(|(j, h)| (j.clone(), h.clone()))
            .collect();
        for (jid, h) in held {
            self.release(&jid, &h, reason).await;
        }
    }

    pub(crate) async fn release(&self, jid: &str, h: &Held, reason: &str) {
        let app = self.app();
        let command = Command::Fail {
            step: h.step,
            attempt: h.attempt,
            error: reason.to_string(),
            retryable: true,
            jitter: app.jitter(),
        };
        match app
            .store()
            .job_apply(overseer_store::Apply::new(h.job_id, command, app.now()))
            .await
        {
            Ok(t) => {
                app.committed(&t);
                if let Some(s) = t.job.steps.get(h.step) {
                    app.notifier().wake_agent(s.claim_agent_of_lease());
                }
                self.inner.released_leases.fetch_add(1, Ordering::Relaxed);
            }
            Err(overseer_store::Error::Rejected(_)) => {}
            Err(e) => {
                tracing::warn!(jid, lease = %h.lease_id, error = %e, "cannot release a faktory lease")
            }
        }
        self.forget_lease(jid, h.attempt);
    }

    /// Asks a worker to go quiet or terminate: its next BEAT answers the state. States only move
    /// forward. Returns false when no such worker is connected to this node.
    pub fn signal(&self, wid: &str, state: WorkerState) -> bool {
        let mut workers = lock(&self.inner.workers);
        match workers.get_mut(wid) {
            Some(w) => {
                w.state = w.state.max(state);
                true
            }
            None => false,
        }
    }

    /// The workers this node knows, sorted by wid.
    pub fn workers(&self) -> Vec<WorkerInfo> {
        let mut v: Vec<_> = lock(&self.inner.workers).values().cloned().collect();
        v.sort_by(|a, b| a.wid.cmp(&b.wid));
        v
    }

    pub(crate) fn worker_hello(&self, hello: &conn::Hello) {
        let Some(wid) = &hello.wid else { return };
        let mut workers = lock(&self.inner.workers);
        let w = workers.entry(wid.clone()).or_insert_with(|| WorkerInfo {
            wid: wid.clone(),
            hostname: hello.hostname.clone(),
            pid: hello.pid,
            labels: hello.labels.clone(),
            state: WorkerState::Running,
            rss_kb: None,
            connections: 0,
            last_beat: Instant::now(),
            beats: 0,
        });
        w.connections += 1;
        w.last_beat = Instant::now();
    }

    pub(crate) fn worker_closed(&self, wid: &str) {
        if let Some(w) = lock(&self.inner.workers).get_mut(wid) {
            w.connections = w.connections.saturating_sub(1);
        }
    }

    /// Any command from a worker is a sign of life.
    pub(crate) fn worker_seen(&self, wid: &str) {
        if let Some(w) = lock(&self.inner.workers).get_mut(wid) {
            w.last_beat = Instant::now();
        }
    }

    /// A BEAT: the worker's state to answer, or None for an unknown worker.
    pub(crate) fn worker_beat(
        &self,
        wid: &str,
        current_state: Option<&str>,
        rss_kb: Option<i64>,
    ) -> Option<WorkerState> {
        let mut workers = lock(&self.inner.workers);
        let w = workers.get_mut(wid)?;
        w.last_beat = Instant::now();
        w.beats += 1;
        if rss_kb.is_some() {
            w.rss_kb = rss_kb;
        }
        let reported = match current_state {
            Some("quiet") => WorkerState::Quiet,
            Some("terminate") => WorkerState::Terminate,
            _ => WorkerState::Running,
        };
        w.state = w.state.max(reported);
        Some(w.state)
    }

    pub(crate) fn worker_state(&self, wid: &str) -> WorkerState {
        lock(&self.inner.workers)
            .get(wid)
            .map_or(WorkerState::Running, |w| w.state)
    }

    pub(crate) fn remember_lease(&self, jid: String, held: Held) {
        lock(&self.inner.leases).insert(jid, held);
    }

    pub(crate) fn lease_of(&self, jid: &str) -> Option<Held> {
        lock(&self.inner.leases).get(jid).cloned()
    }

    /// Forgets the lease record of `jid` if it is still the one for `attempt`.
    pub(crate) fn forget_lease(&self, jid: &str, attempt: u32) {
        let mut leases = lock(&self.inner.leases);
        if leases.get(jid).is_some_and(|h| h.attempt == attempt) {
            leases.remove(jid);
        }
    }

    pub(crate) fn remember_failure(&self, jid: &str, info: FailInfo) {
        let mut failures = lock(&self.inner.failures);
        if failures.len() >= FAILURES_KEPT && !failures.contains_key(jid) {
            // Bounded: forget an arbitrary one; the step's last_error still has the gist.
            if let Some(k) = failures.keys().next().cloned() {
                failures.remove(&k);
            }
        }
        failures.insert(jid.to_string(), info);
    }

    pub(crate) fn failure_of(&self, jid: &str) -> Option<FailInfo> {
        lock(&self.inner.failures).get(jid).cloned()
    }

    pub(crate) fn forget_failure(&self, jid: &str) {
        lock(&self.inner.failures).remove(jid);
    }

    /// Remembers a queue that was pushed to.
    pub(crate) fn queue_known(&self, name: &str) {
        let mut queues = lock(&self.inner.queues);
        if queues.len() < QUEUES_KEPT && !queues.contains(name) {
            queues.insert(name.to_string());
        }
    }

    /// Forgets a removed queue.
    pub(crate) fn queue_forget(&self, name: &str) {
        lock(&self.inner.queues).remove(name);
    }

    pub(crate) fn queues_known(&self) -> BTreeSet<String> {
        lock(&self.inner.queues).clone()
    }

    pub(crate) fn count_command(&self) {
        self.inner.commands.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_processed(&self) {
        self.inner.processed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self) {
        self.inner.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> Stats {
        let i = &self.inner;
        Stats {
            uptime_secs: i.started.elapsed().as_secs(),
            connections: i.connections.load(Ordering::Relaxed),
            commands: i.commands.load(Ordering::Relaxed),
            processed: i.processed.load(Ordering::Relaxed),
            failures: i.failed.load(Ordering::Relaxed),
            reaped_workers: i.reaped_workers.load(Ordering::Relaxed),
            released_leases: i.released_leases.load(Ordering::Relaxed),
            workers: lock(&i.workers).len(),
            leases: lock(&i.leases).len(),
        }
    }
}

pub(crate) struct Stats {
    pub uptime_secs: u64,
    pub connections: u64,
    pub commands: u64,
    pub processed: u64,
    pub failures: u64,
    pub reaped_workers: u64,
    pub released_leases: u64,
    pub workers: usize,
    pub leases: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
