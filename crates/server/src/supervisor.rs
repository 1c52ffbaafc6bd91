//! The supervisor: a periodic sweep that heals what got stuck.
//!
//! Each sweep (every `sweep_interval`, or earlier when a transition asks for an earlier instant)
//! expires leases whose holder went silent, starts delayed jobs whose `run_at` has come, and
//! wakes agents whose retry backoff ended. All of it goes through the same core transitions as
//! agent reports, so a sweep racing a late report is settled by the fencing check in the core.
//!
//! There is one supervisor per node today (a node owns its SQLite file). Leader election among
//! several nodes arrives with the PostgreSQL backend; the sweep is already safe to run twice.

use overseer_core::{Command, Rejection, Span, Timestamp};
use overseer_store::Error as StoreError;
use tokio_util::sync::CancellationToken;

use crate::App;

/// How many expired leases or due jobs one sweep handles before looking again.
const SWEEP_BATCH: usize = 500;

pub struct Supervisor {
    app: App,
    interval: Span,
    /// Retries due after this instant have not been announced to their agents yet.
    announced_until: Timestamp,
}

/// What one sweep did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub expired: usize,
    pub activated: usize,
    pub woken_agents: usize,
}

impl Supervisor {
    pub fn new(app: App, interval: Span) -> Self {
        let announced_until = app.now();
        Supervisor {
            app,
            interval,
            announced_until,
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let now = self.app.now();
            match self.sweep(now).await {
                Ok(s) if s != Sweep::default() => tracing::debug!(?s, "sweep"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "sweep failed; will retry"),
            }
            let mut wake_at = now.plus(self.interval);
            match self.app.store().next_due_at(now).await {
                Ok(Some(due)) if due < wake_at => wake_at = due,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read next due time"),
            }
            if let Some(due) = self.app.notifier().take_due() {
                wake_at = wake_at.min(due);
            }
            let sleep = self.app.now().until(wake_at);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(sleep.as_std()) => {}
                _ = self.app.notifier().supervisor_wake().notified() => {}
            }
        }
    }

    /// One pass over everything due at `now`.
    pub async fn sweep(&mut self, now: Timestamp) -> Result<Sweep, StoreError> {
        let mut done = Sweep::default();
        let store = self.app.store();
        for lease in store.leases_expired(now, SWEEP_BATCH).await? {
            let command = Command::Expire {
                step: lease.step,
                attempt: lease.attempt,
                jitter: self.app.jitter(),
            };
            match store.job_apply(lease.job_id, command, now).await {
                Ok(t) => {
                    done.expired += 1;
                    tracing::info!(job = %lease.job_id, step = lease.step, attempt = lease.attempt, "lease expired");
                    self.app.committed(&t);
                }
                // A report or heartbeat got there first: nothing to heal.
                Err(StoreError::Rejected(Rejection::NotExpired)) => {}
                Err(e) => return Err(e),
            }
        }
        for job in store.jobs_due(now, SWEEP_BATCH).await? {
            match store.job_apply(job, Command::Activate, now).await {
                Ok(t) => {
                    done.activated += 1;
                    self.app.committed(&t);
                }
                Err(StoreError::Rejected(Rejection::NotDue)) => {}
                Err(e) => return Err(e),
            }
        }
        if now > self.announced_until {
            for agent in store.agents_due(self.announced_until, now).await? {
                done.woken_agents += 1;
                self.app.notifier().wake_agent(&agent);
            }
            self.announced_until = now;
        }
        Ok(done)
    }
}
