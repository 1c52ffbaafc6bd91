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
//!
//! The parts: `handler` is what a handler gets and answers ([`StepContext`], [`StepError`],
//! [`Handler`]); `pool` is one agent name's long-poll loop; `attempt` is one lease's run under
//! heartbeats and its local deadline, and its report. The [`Builder`], and the [`Worker`] that
//! starts a pool per agent name, are here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use overseer_core::Span;
use rand::Rng;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::client::Client;
use crate::reports::Reporter;

mod attempt;
mod handler;
mod pool;

pub use attempt::local_deadline;
pub use handler::{Handler, StepContext, StepError};

use pool::Pool;

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

/// Builds a [`Worker`].
pub struct Builder {
    client: Client,
    worker_id: Option<String>,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    concurrency: usize,
    wait: Span,
    cancel_grace: Duration,
    gather: bool,
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

    /// Whether a lease request, while the server has a backlog, first lets handlers that are
    /// ending finish, so that it asks for their slots too instead of one lease at a time as
    /// short handlers end. It never waits on a timer: a slot whose handler is still working is
    /// not waited for. Default on; an idle worker asks at its first free slot either way.
    /// A PostgreSQL drain (4 workers × 32, no-op handlers) ran claims of 16 leases without it
    /// and 30 with it, and a third more steps per second.
    pub fn gather(mut self, gather: bool) -> Self {
        self.gather = gather;
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
            gather: self.gather,
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
    gather: bool,
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
            gather: true,
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
                gather: self.gather,
            };
            pool.run(shutdown.clone(), abandon.clone())
        });
        futures::future::join_all(loops).await;
        info!(worker = %shared.worker_id, "worker stopped");
    }
}
