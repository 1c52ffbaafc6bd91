//! The supervisor: a periodic sweep that heals what got stuck.
//!
//! Each sweep (every `sweep_interval`, or earlier when a transition asks for an earlier instant)
//! expires leases whose holder went silent, starts delayed jobs whose `run_at` has come, wakes
//! agents whose retry backoff ended, and re-checks a page of active jobs for consistency
//! (`Command::Repair`), so a job left half-advanced by a fault is healed within one pass over
//! the active jobs. All of it goes through the same core transitions as
//! agent reports, so a sweep racing a late report is settled by the fencing check in the core.
//!
//! There is one supervisor per node today (a node owns its SQLite file). Leader election among
//! several nodes arrives with the PostgreSQL backend; the sweep is already safe to run twice.

use overseer_core::{Command, JobId, Rejection, Span, Timestamp};
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
    /// Where the repair scan continues (it walks active jobs in id order, then starts over).
    repair_cursor: Option<JobId>,
    repair_batch: usize,
}

/// What one sweep did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub expired: usize,
    pub activated: usize,
    pub woken_agents: usize,
    pub repaired: usize,
}

impl Supervisor {
    pub fn new(app: App, interval: Span) -> Self {
        let announced_until = app.now();
        Supervisor {
            app,
            interval,
            announced_until,
            repair_cursor: None,
            repair_batch: 200,
        }
    }

    pub fn with_repair_batch(mut self, batch: usize) -> Self {
        self.repair_batch = batch.max(1);
        self
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
                    self.app.metrics().leases_expired.inc();
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
        done.repaired = self.repair_some(now).await?;
        let store = self.app.store();
        if now > self.announced_until {
            for agent in store.agents_due(self.announced_until, now).await? {
                done.woken_agents += 1;
                self.app.notifier().wake_agent(&agent);
            }
            self.announced_until = now;
        }
        self.app.metrics().sweeps.inc();
        Ok(done)
    }

    /// Re-derives the next page of active jobs; returns how many needed repair.
    async fn repair_some(&mut self, now: Timestamp) -> Result<usize, StoreError> {
        let store = self.app.store();
        let page = store
            .jobs_active(self.repair_cursor, self.repair_batch)
            .await?;
        self.repair_cursor = if page.len() < self.repair_batch {
            None
        } else {
            page.last().copied()
        };
        let mut repaired = 0;
        for id in page {
            // Check on a read first: almost every job is consistent, and a no-op need not queue
            // behind the writer.
            let Some(job) = store.job_get(id).await? else {
                continue;
            };
            if overseer_core::apply(&job, Command::Repair, now).is_ok_and(|t| t.is_noop()) {
                continue;
            }
            match store.job_apply(id, Command::Repair, now).await {
                Ok(t) if !t.is_noop() => {
                    repaired += 1;
                    self.app.metrics().repairs.inc();
                    tracing::warn!(job = %id, state = %t.job.state, "repaired an inconsistent job");
                    self.app.committed(&t);
                }
                Ok(_) | Err(StoreError::JobNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(repaired)
    }
}
