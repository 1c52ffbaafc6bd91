//! Overseer's server: the HTTP API, long-poll wake-ups and the supervisor sweep.
//!
//! [`App`] is the shared state of one node: the store, the clock, the wake-up channels and the
//! limits. [`api::router`] serves it over HTTP; [`supervisor::Supervisor`] heals it.

pub mod api;
pub mod auth;
pub mod clock;
pub mod coalesce;
pub mod config;
pub mod console;
pub mod deliver;
pub mod error;
pub mod explain;
pub mod listen;
pub mod metrics;
pub mod notify;
pub mod outbound;
pub mod prefer;
pub mod push;
pub mod stream;
pub mod supervisor;
pub mod tokens;
pub mod webhook;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use overseer_core::{Effect, Job, Limits, Span, Timestamp, Transition};
use overseer_store::prelude::*;
use overseer_store::SqliteStore;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::Config;
pub use notify::Notifier;

/// Reports (of single reports or workers' batches) committed together at most: a drain's
/// commits hold about a hundred, and on PostgreSQL each report's job is locked until the commit
/// in the server's shared lock table (README, "PostgreSQL").
const REPORTS_PER_COMMIT: usize = 512;

/// Leases offered by one claim of merged lease requests at most. Measured on a PostgreSQL drain
/// (BENCHMARKS.md, twentieth session): claims of 32 side by side drained about 20 % faster than
/// merged claims of up to 128 one or two at a time.
const LEASES_PER_MERGED_CLAIM: usize = 32;

/// A long-poll's place on the node and, when a token made it, among that token's; both are
/// given back when it is dropped.
pub struct LongPoll {
    _node: tokio::sync::OwnedSemaphorePermit,
    caller: Option<(String, Arc<Inner>)>,
}

impl Drop for LongPoll {
    fn drop(&mut self) {
        if let Some((caller, inner)) = &self.caller {
            let mut held = inner
                .long_polls_by
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = held.get_mut(caller) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.remove(caller);
                }
            }
        }
    }
}

/// The shared state of one server node. Cheap to clone.
#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    notifier: Notifier,
    metrics: metrics::Metrics,
    limits: Limits,
    retention: overseer_core::retention::Retention,
    lease_wait_default: Span,
    rng: Mutex<StdRng>,
    /// Workers seen asking for leases, by agent name: this node's view only.
    workers: Mutex<HashMap<String, HashMap<String, Timestamp>>>,
    shutdown: CancellationToken,
    node: String,
    leader: std::sync::atomic::AtomicBool,
    last_job_id: Mutex<u128>,
    auth: auth::Auth,
    /// Long-polls waiting at once on this node, at most `limits.long_polls`.
    long_polls: Arc<tokio::sync::Semaphore>,
    /// Long-polls waiting per token, at most `limits.long_polls_per_token` each.
    long_polls_by: Mutex<HashMap<String, usize>>,
    /// Where callbacks and webhooks may go.
    outbound: Arc<outbound::Policy>,
    /// Single submits waiting to be committed together.
    submits: coalesce::Submits,
    reports: coalesce::ReportQueue,
    claims: coalesce::Claims,
    /// Whether deliveries are signed with configured keys (else with the generated one).
    webhook_secret_configured: bool,
    /// This node's circuit breakers of HTTP targets, by `http:` agent name.
    http_breakers: Mutex<HashMap<String, overseer_core::push::Breaker>>,
    /// Whether alerts go to a webhook (`GET /v1/alerts` says so).
    alert_webhook: bool,
}

impl App {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: &Config,
        shutdown: CancellationToken,
    ) -> App {
        // The full 256-bit seed from the operating system: lease ids are bearer secrets, and a
        // generator seeded from 64 bits would give their 74 random bits no more than 64.
        App::with_rng(store, clock, config, shutdown, StdRng::from_entropy())
    }

    /// Like [`App::new`], with every random choice (job and lease ids, retry jitter) drawn from
    /// a generator seeded with `seed`: with a manual clock and one request at a time, a run is
    /// reproducible (the simulator relies on it).
    pub fn seeded(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: &Config,
        shutdown: CancellationToken,
        seed: u64,
    ) -> App {
        App::with_rng(store, clock, config, shutdown, StdRng::seed_from_u64(seed))
    }

    fn with_rng(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: &Config,
        shutdown: CancellationToken,
        rng: StdRng,
    ) -> App {
        App {
            inner: Arc::new(Inner {
                store,
                clock,
                notifier: Notifier::default(),
                metrics: metrics::Metrics::default(),
                limits: config.limits.clone(),
                retention: config.retention,
                lease_wait_default: config.lease_wait_default,
                rng: Mutex::new(rng),
                workers: Mutex::new(HashMap::new()),
                shutdown,
                node: config.node_id.clone().unwrap_or_else(default_node_id),
                leader: std::sync::atomic::AtomicBool::new(false),
                last_job_id: Mutex::new(0),
                auth: auth::Auth::new(config.auth_required(), config.admin_token.as_deref()),
                long_polls: Arc::new(tokio::sync::Semaphore::new(config.limits.long_polls.max(1))),
                long_polls_by: Mutex::new(HashMap::new()),
                // Checked by `Config::validate`; an embedder that skipped it gets the default.
                outbound: Arc::new(
                    outbound::Policy::new(&config.outbound_allow).unwrap_or_default(),
                ),
                submits: coalesce::Submits::new(config.limits.jobs_per_batch),
                reports: coalesce::ReportQueue::new(REPORTS_PER_COMMIT),
                claims: coalesce::Claims::new(LEASES_PER_MERGED_CLAIM),
                webhook_secret_configured: !config.configured_webhook_secrets().is_empty(),
                http_breakers: Mutex::new(HashMap::new()),
                alert_webhook: config.alert_webhook.is_some(),
            }),
        }
    }

    /// This node's circuit breakers of HTTP targets, by `http:` agent name.
    pub fn http_breakers(&self) -> &Mutex<HashMap<String, overseer_core::push::Breaker>> {
        &self.inner.http_breakers
    }

    /// This node's name in the leader lease.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    pub fn is_leader(&self) -> bool {
        self.inner.leader.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn set_leader(&self, leader: bool) {
        self.inner
            .leader
            .store(leader, std::sync::atomic::Ordering::Relaxed);
        self.metrics().is_leader.set(i64::from(leader));
    }

    pub fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// Stores one submitted job, committed together with other single submits arriving at the
    /// same time on this node (see [`coalesce`]).
    pub async fn submit_one(
        &self,
        job: overseer_store::NewJob,
    ) -> Result<overseer_store::Submitted, overseer_store::Error> {
        self.inner.submits.submit(&self.inner.store, job).await
    }

    /// Applies lease reports, committed together with other reports arriving at the same time
    /// on this node (see [`coalesce`]); answers what `Leases::leases_report` would for them alone.
    pub async fn report_leases(
        &self,
        reports: Vec<overseer_store::Report>,
    ) -> Result<Vec<overseer_store::Reported>, overseer_store::Error> {
        let clock = self.inner.clock.clone();
        self.inner
            .reports
            .report(&self.inner.store, reports, move || clock.now())
            .await
    }

    /// Claims steps of `agent` for one lease request, in one claim with the agent's other
    /// requests arriving at the same time on this node (see [`coalesce`]).
    pub async fn claim_leases(
        &self,
        agent: &str,
        ask: coalesce::LeaseAsk,
    ) -> Result<coalesce::Granted, overseer_store::Error> {
        let clock = self.inner.clock.clone();
        self.inner
            .claims
            .claim(&self.inner.store, agent, ask, move || clock.now())
            .await
    }

    pub fn notifier(&self) -> &Notifier {
        &self.inner.notifier
    }

    pub fn metrics(&self) -> &metrics::Metrics {
        &self.inner.metrics
    }

    /// How long finished jobs are kept (the job's own retention aside).
    pub fn retention(&self) -> &overseer_core::retention::Retention {
        &self.inner.retention
    }

    /// A job as every endpoint shows it: its wire view with when it may be removed.
    pub fn view(&self, job: &overseer_core::Job) -> overseer_core::wire::JobView {
        let mut view = overseer_core::wire::JobView::from(job);
        view.removable_at = self.retention().removable_at(job);
        view
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// A place among this node's long-polls, and among those of `caller` (a token's name when
    /// auth is on), or a 429 telling the client to come back.
    pub fn long_poll_slot(&self, caller: Option<&str>) -> Result<LongPoll, error::ApiError> {
        let refuse = |what: String| {
            self.metrics().long_polls_refused.inc();
            error::ApiError::too_many(format!("{what}; retry shortly, or on another node"))
        };
        let node = self
            .inner
            .long_polls
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                refuse(format!(
                    "this node already holds {} long-polls",
                    self.limits().long_polls
                ))
            })?;
        let Some(caller) = caller else {
            return Ok(LongPoll {
                _node: node,
                caller: None,
            });
        };
        let cap = self.limits().long_polls_per_token;
        let mut held = self
            .inner
            .long_polls_by
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = held.entry(caller.to_string()).or_insert(0);
        if *n >= cap {
            return Err(refuse(format!(
                "this token already holds {cap} long-polls on this node"
            )));
        }
        *n += 1;
        Ok(LongPoll {
            _node: node,
            caller: Some((caller.to_string(), self.inner.clone())),
        })
    }

    pub fn has_alert_webhook(&self) -> bool {
        self.inner.alert_webhook
    }

    pub fn outbound(&self) -> &Arc<outbound::Policy> {
        &self.inner.outbound
    }

    /// Whether the webhook keys come from the settings (else the generated one is used).
    pub fn webhook_secret_configured(&self) -> bool {
        self.inner.webhook_secret_configured
    }

    pub fn auth(&self) -> &auth::Auth {
        &self.inner.auth
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// A new job id: a UUIDv7 from this node's clock and random generator, strictly greater than
    /// the previous one of this node, so jobs submitted within one millisecond still list in
    /// submission order.
    pub fn new_job_id(&self) -> overseer_core::JobId {
        let candidate = self.uuid_v7().as_u128();
        let mut last = self
            .inner
            .last_job_id
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Counting up in the low (random) bits keeps the version and variant bits as they are,
        // short of 2^62 ids in one millisecond.
        let id = if candidate > *last {
            candidate
        } else {
            *last + 1
        };
        *last = id;
        overseer_core::JobId(uuid::Uuid::from_u128(id))
    }

    /// A new, unguessable lease id: a UUIDv7, whose 74 random bits make it as hard to guess
    /// as any bearer secret, and whose time prefix makes each new lease land at the end of the
    /// stores' lease index instead of on a random page of it (a random page to read and write
    /// back for every claim, and again when the job is removed).
    pub fn new_lease_id(&self) -> overseer_core::LeaseId {
        overseer_core::LeaseId(self.uuid_v7())
    }

    /// A UUIDv7 of this node's clock and 74 bits of its random generator.
    fn uuid_v7(&self) -> uuid::Uuid {
        let mut random = [0u8; 10];
        self.inner
            .rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fill(&mut random);
        let ms = self.now().as_millis().max(0) as u64;
        uuid::Builder::from_unix_timestamp_millis(ms, &random).into_uuid()
    }

    /// A jitter value in `[0, 1)` for retry backoff.
    pub fn jitter(&self) -> f64 {
        self.inner
            .rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gen::<f64>()
    }

    /// Carries out what a committed transition calls for (wake agents, waiters, the supervisor).
    pub fn committed(&self, transition: &Transition) {
        let job = &transition.job;
        for effect in &transition.effects {
            match effect {
                Effect::Alert {
                    kind,
                    step,
                    message,
                } => {
                    tracing::error!(alert = kind.as_str(), job = %job.id, step = step.as_deref(), "{message}");
                    self.metrics()
                        .alerts
                        .get_or_create(&metrics::KindLabel {
                            kind: kind.to_string(),
                        })
                        .inc();
                }
                Effect::Finished { state } => {
                    tracing::info!(job = %job.id, %state, "job finished");
                    self.metrics()
                        .jobs_finished
                        .get_or_create(&metrics::StateLabel {
                            state: state.to_string(),
                        })
                        .inc();
                }
                _ => {}
            }
        }
        self.inner.notifier.apply(job.id, &transition.effects);
        if !transition.is_noop() {
            let change = stream::Change::of(transition);
            self.inner.notifier.changes().publish(change);
        }
    }

    /// Acts on what another node committed.
    pub fn signal(&self, signal: overseer_store::Signal) {
        // Another node committed something: consoles watching this node refetch.
        let job = match &signal {
            overseer_store::Signal::Finished { job } => Some(*job),
            _ => None,
        };
        let change = stream::Change {
            job,
            state: None,
            kinds: vec!["remote"],
            steps: vec![],
            // Unknown here: a caller limited to its own jobs does not see other nodes' finishes.
            submitted_by: None,
        };
        self.notifier().changes().publish(change);
        match signal {
            overseer_store::Signal::Ready { agent } => self.notifier().wake_agent(&agent),
            overseer_store::Signal::Finished { job } => self.notifier().apply(
                job,
                &[Effect::Finished {
                    state: overseer_core::JobState::Succeeded,
                }],
            ),
            overseer_store::Signal::Due { at } => self.notifier().due_at(at),
        }
    }

    fn worker_seen(&self, agent: &str, worker: &str, now: Timestamp) {
        let mut map = self.inner.workers.lock().unwrap_or_else(|p| p.into_inner());
        let per_agent = map.entry(agent.to_string()).or_default();
        per_agent.insert(worker.to_string(), now);
        // Forget workers unseen for ten minutes so the map stays bounded.
        let horizon = Timestamp::from_millis(now.as_millis() - 600_000);
        per_agent.retain(|_, seen| *seen >= horizon);
    }

    pub(crate) fn workers_of(&self, agent: &str) -> Vec<(String, Timestamp)> {
        let map = self.inner.workers.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = map
            .get(agent)
            .map(|m| m.iter().map(|(w, t)| (w.clone(), *t)).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    fn agent_names_seen(&self) -> Vec<String> {
        let map = self.inner.workers.lock().unwrap_or_else(|p| p.into_inner());
        map.keys().cloned().collect()
    }

    pub async fn job(&self, id: overseer_core::JobId) -> Result<Job, error::ApiError> {
        self.store()
            .job_get(id)
            .await?
            .ok_or_else(|| error::ApiError::not_found(format!("job {id} not found")))
    }
}

/// A node name unique enough for the leader lease: host name, process id and a random suffix.
fn default_node_id() -> String {
    format!(
        "{}-{}-{:04x}",
        host_name(),
        std::process::id(),
        rand::random::<u16>()
    )
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

/// Opens the store a URL names (connecting and migrating for PostgreSQL).
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    match config::StoreUrl::parse(&config.db).map_err(anyhow::Error::msg)? {
        config::StoreUrl::Sqlite(path) => {
            let mut options = overseer_store::sqlite::SqliteOptions::new(path);
            options.history_per_job = config.limits.history_per_job;
            let store = SqliteStore::open(options)?;
            Ok(Arc::new(store))
        }
        config::StoreUrl::Postgres(url) => {
            let mut options = overseer_store::postgres::PgOptions::new(url);
            options.history_per_job = config.limits.history_per_job;
            options.pool_size = config.pool_size;
            let store = overseer_store::postgres::PgStore::open(options).await?;
            Ok(Arc::new(store))
        }
    }
}

/// Runs one node until `shutdown` fires: serves HTTP on `listener` and runs the supervisor.
/// On shutdown it stops accepting connections, lets in-flight requests finish (long-polls return
/// early with nothing), and leaves running leases to be completed or to expire.
pub async fn serve(
    store: Arc<dyn Store>,
    config: &Config,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_with(store, config, listener, shutdown, |_| Vec::new()).await
}

/// Like [`serve`], and also runs what `extra` starts with this node's [`App`] (another protocol
/// listener, such as the Faktory one): its tasks share the node's store, clock and wake-ups, and
/// are awaited on shutdown after the HTTP server stopped (they must watch `app.shutdown()`).
pub async fn serve_with(
    store: Arc<dyn Store>,
    config: &Config,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
    extra: impl FnOnce(App) -> Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<()> {
    let mut config = config.clone();
    if config.node_id.is_none() {
        // Stable across restarts of the same node, so a restarted leader takes its own lease
        // back at once; and unique among live nodes, since only one process can hold the port.
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        config.node_id = Some(format!("{}:{port}", host_name()));
    }
    let config = &config;
    if config.auth_required() {
        ensure_a_credential(store.as_ref(), config).await?;
    }
    let app = App::new(store, Arc::new(SystemClock), config, shutdown.clone());
    let supervisor = supervisor::Supervisor::new(app.clone(), config.sweep_interval)
        .with_repair_batch(config.repair_batch)
        .with_retention_batch(config.retention_batch)
        .with_leader_ttl(config.leader_ttl);
    if let Some(mut signals) = app.store().signals() {
        // What other nodes committed that concerns this node's waiters.
        let (app, shutdown) = (app.clone(), shutdown.clone());
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    signal = signals.recv() => match signal {
                        Ok(s) => app.signal(s),
                        // Missed some: have the supervisor look at everything now.
                        Err(RecvError::Lagged(_)) => app.notifier().due_at(Timestamp::from_millis(0)),
                        Err(RecvError::Closed) => return,
                    },
                }
            }
        });
    }
    let sweeper = tokio::spawn(supervisor.run(shutdown.clone()));
    let mut delivery = deliver::Settings::from_config(config);
    if delivery.signer.is_none() {
        // No key configured: the one generated for the cluster (made now by the first node).
        let secret = webhook::shared_secret(&app).await?;
        delivery.signer = Some(outbound::Signer::new(&secret).map_err(anyhow::Error::msg)?);
        tracing::info!("deliveries are signed with the generated webhook secret (`overseer webhook-secret` shows it)");
    }
    let deliverer = deliver::Deliverer::new(app.clone(), delivery)?;
    let delivering = tokio::spawn(deliverer.run(shutdown.clone()));
    let pusher = push::Pusher::new(app.clone(), push::Settings::from_config(config))?;
    let pushing = tokio::spawn(pusher.run(shutdown.clone()));
    let extras = extra(app.clone());
    let router = api::router(app);
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(listen::tls_acceptor(cert, key)?),
        _ => None,
    };
    let bounds = listen::Bounds {
        max_connections: config.max_connections,
        header_read_timeout: config.header_read_timeout.as_std(),
    };
    let result = listen::serve(listener, router, tls, bounds, shutdown.clone()).await;
    shutdown.cancel();
    let _ = sweeper.await;
    let _ = delivering.await;
    let _ = pushing.await;
    for task in extras {
        let _ = task.await;
    }
    result
}

/// With auth required, a node that no credential could ever pass would only answer 401: refuse
/// to start instead, saying how to make the first admin token.
async fn ensure_a_credential(store: &dyn Store, config: &Config) -> anyhow::Result<()> {
    if config.admin_token.as_deref().is_some_and(|t| !t.is_empty()) {
        return Ok(());
    }
    let now = SystemClock.now();
    let tokens = store.tokens_list().await?;
    if tokens.iter().any(|t| t.is_live(now)) {
        return Ok(());
    }
    anyhow::bail!(
        "auth is required (listening on {}) and no token exists yet. Create the first admin \
         token against the store, before starting the server:\n  overseer tokens create \
         --bootstrap --db {} --name admin --scope admin\nor set OVERSEER_ADMIN_TOKEN (a secret \
         of your own, at least 32 characters) for an admin credential that is never stored",
        config.listen,
        config.db
    )
}
