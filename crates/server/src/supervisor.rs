//! The supervisor: a periodic sweep that heals what got stuck, run by one leader among all nodes.
//!
//! Each pass (every `sweep_interval`, or exactly when the store says something falls due, or
//! when a transition asks for an earlier instant):
//! - **Leadership.** The node takes or renews the leader lease (a row in the store with a holder,
//!   an expiry and an epoch that grows at each change of hands). Only the leader does the writes
//!   below, and each of them is *fenced* by its epoch in the same transaction: a node that paused
//!   past its lease and wakes up cannot act after another node took over.
//! - **Leader writes.** Expire leases whose holder went silent, start delayed jobs whose `run_at`
//!   has come (including a job of an ordering key whose turn came before its `run_at`; a due
//!   next job is started by the very transaction that finishes its predecessor), fire cron schedules
//!   that are due, and re-check a page of active jobs for consistency (`Command::Repair`), so a
//!   job left half-advanced by a fault is healed within one pass over the active jobs.
//! - **Local wake-ups** (every node): wake this node's long-polling agents whose retry backoff
//!   just ended.
//!
//! All writes go through the same core transitions as agent reports, so a sweep racing a late
//! report is settled by the fencing check in the core.

use overseer_core::machine::admit;
use overseer_core::retention;
use overseer_core::schedule::{self, CronSchedule};
use overseer_core::{Command, Job, JobId, Rejection, Span, Timestamp};
use overseer_store::{
    ActivePage, Apply, Due, DueBetween, Error as StoreError, Fence, Fire, FireOutcome, LeaderBid,
    NewJob, Prune, Schedule, SchedulePause, Submitted,
};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::App;

/// How many expired leases or due jobs one sweep handles before looking again.
const SWEEP_BATCH: usize = 500;
/// How many due times of one schedule one sweep may fire while catching up.
const CATCH_UP: usize = 100;

pub struct Supervisor {
    app: App,
    interval: Span,
    node: String,
    leader_ttl: Span,
    /// Held while this node is the leader; shared with the renewal task, which keeps the lease
    /// alive between sweeps however long a sweep takes.
    fence: Arc<Mutex<Option<Fence>>>,
    /// Retries due after this instant have not been announced to their agents yet.
    announced_until: Timestamp,
    /// Where the repair scan continues (it walks active jobs in id order, then starts over).
    repair_cursor: Option<JobId>,
    repair_batch: usize,
    /// Finished jobs removed per store write at most once their retention has passed.
    retention_batch: usize,
    /// The next removal write's batch: adapted to what the store removes within
    /// `retention::REMOVAL_WRITE_BUDGET` (`retention::next_removal_batch`).
    removal_batch: usize,
    /// When the leader next looks for finished jobs to remove.
    next_prune_at: Timestamp,
    /// Quarters of the sweep interval the next removal may take
    /// (`retention::next_removal_quarters`).
    prune_quarters: u64,
}

/// How often the leader looks for finished jobs past their retention while there are none.
const PRUNE_EVERY: Span = Span::from_secs(10);
/// Removal writes per sweep at most. While a backlog lasts (after a retention is shortened, or
/// when a burst of jobs finishes), a sweep removes jobs write after write for up to
/// [`prune_budget`]; each write is kept within `retention::REMOVAL_WRITE_BUDGET` by adapting its
/// batch, so the store's other writers (claims, reports) queue behind one short write at most,
/// while removal can still take a quarter of the store's time and outrun the load. The time
/// budget is the bound that matters: on SQLite a removal write stops at its first piece when
/// other writes wait, so under load a write removes only a few jobs, and a cap of 256 writes
/// held removal to about 2,900 jobs/s in the `steady` benchmark.
const PRUNE_WRITES_PER_SWEEP: usize = 4_096;

/// How long one sweep may spend removing jobs: `quarters` quarters of its interval, within 50 ms
/// and 250 ms a quarter, so the sweep's other work (expired leases, due jobs, schedules) is never
/// put off for long. One quarter, unless removal is falling behind (see `prune_some`): measured
/// on a disk with slow syncs (`steady`, 2,000 jobs/s, 1-minute retention), one quarter removed
/// 1,000–1,500 jobs/s and the file grew without bound.
fn prune_budget(interval: Span, quarters: u64) -> Span {
    Span::from_millis((interval.as_millis() * quarters / 4).clamp(50, 250 * quarters))
}

/// What one sweep did, for logs and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub leader: bool,
    pub expired: usize,
    pub activated: usize,
    pub fired: usize,
    pub woken_agents: usize,
    pub repaired: usize,
    /// Finished jobs removed because their retention passed.
    pub pruned: usize,
    /// Jobs failed because their deadline passed.
    pub deadlines: usize,
}

impl Supervisor {
    pub fn new(app: App, interval: Span) -> Self {
        let announced_until = app.now();
        let node = app.node().to_string();
        Supervisor {
            app,
            interval,
            node,
            leader_ttl: Span::from_secs(10),
            fence: Arc::new(Mutex::new(None)),
            announced_until,
            repair_cursor: None,
            repair_batch: 200,
            retention_batch: 500,
            removal_batch: 500,
            next_prune_at: announced_until,
            prune_quarters: 1,
        }
    }

    pub fn with_retention_batch(mut self, batch: usize) -> Self {
        self.retention_batch = batch.max(1);
        self.removal_batch = self.retention_batch;
        self
    }

    pub fn with_repair_batch(mut self, batch: usize) -> Self {
        self.repair_batch = batch.max(1);
        self
    }

    pub fn with_leader_ttl(mut self, ttl: Span) -> Self {
        self.leader_ttl = ttl;
        self
    }

    pub fn is_leader(&self) -> bool {
        self.current_fence().is_some()
    }

    fn current_fence(&self) -> Option<Fence> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_fence(&self, fence: Option<Fence>) {
        *self.fence.lock().unwrap_or_else(|p| p.into_inner()) = fence;
    }

    /// Renews the lease every third of its life while this node leads, independently of the
    /// sweep, so a long sweep on a busy machine never lets a healthy leader's lease lapse.
    fn spawn_renewal(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let (app, fence, node, ttl) = (
            self.app.clone(),
            self.fence.clone(),
            self.node.clone(),
            self.leader_ttl,
        );
        let period = std::time::Duration::from_millis((ttl.as_millis() / 3).max(10));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                let held = fence.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let Some(held) = held else { continue };
                let renewed = app
                    .store()
                    .leader_acquire(LeaderBid {
                        node: node.to_string(),
                        ttl,
                        now: app.now(),
                    })
                    .await;
                let mut current = fence.lock().unwrap_or_else(|p| p.into_inner());
                if current.as_ref() != Some(&held) {
                    continue; // the sweep changed it meanwhile
                }
                match renewed {
                    Ok(Some(l)) if l.epoch == held.epoch => {}
                    other => {
                        tracing::warn!(node = %node, epoch = held.epoch, outcome = ?other.map(|l| l.map(|l| l.epoch)), "lost the leader lease on renewal; stepping down");
                        *current = None;
                        app.set_leader(false);
                    }
                }
            }
        })
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        let renewal = self.spawn_renewal(shutdown.clone());
        loop {
            let now = self.app.now();
            match self.sweep(now).await {
                Ok(s)
                    if s.expired
                        + s.activated
                        + s.fired
                        + s.repaired
                        + s.woken_agents
                        + s.deadlines
                        > 0 =>
                {
                    tracing::debug!(?s, "sweep")
                }
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
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(sleep.as_std()) => {}
                _ = self.app.notifier().supervisor_wake().notified() => {}
            }
        }
        let _ = renewal.await;
        if let Some(fence) = self.current_fence() {
            self.set_fence(None);
            // Hand over at once rather than make the next leader wait out the lease.
            if let Err(e) = self
                .app
                .store()
                .leader_release(&Fence {
                    node: fence.node.to_string(),
                    epoch: fence.epoch,
                })
                .await
            {
                tracing::warn!(error = %e, "cannot release the leader lease; it will expire");
            }
            self.app.set_leader(false);
        }
    }

    /// Takes or renews the leader lease; steps down when that fails.
    async fn lead(&mut self, now: Timestamp) {
        let acquired = self
            .app
            .store()
            .leader_acquire(LeaderBid {
                node: self.node.to_string(),
                ttl: self.leader_ttl,
                now,
            })
            .await;
        match acquired {
            Ok(Some(lease)) => {
                let fence = Fence {
                    node: lease.node,
                    epoch: lease.epoch,
                };
                if self.current_fence().as_ref() != Some(&fence) {
                    tracing::info!(node = %self.node, epoch = fence.epoch, "became the leader");
                }
                self.set_fence(Some(fence));
            }
            Ok(None) => self.step_down("another node holds the leader lease"),
            // The store's own fencing keeps a stale leader harmless; stop acting anyway.
            Err(e) => self.step_down(&format!("cannot renew the leader lease: {e}")),
        }
        self.app.set_leader(self.current_fence().is_some());
    }

    fn step_down(&mut self, why: &str) {
        let held = self.fence.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(f) = held {
            tracing::warn!(node = %self.node, epoch = f.epoch, why, "stepped down as leader");
        }
    }

    /// One pass over everything due at `now`.
    pub async fn sweep(&mut self, now: Timestamp) -> Result<Sweep, StoreError> {
        self.lead(now).await;
        let mut done = Sweep {
            leader: self.is_leader(),
            ..Sweep::default()
        };
        if let Some(fence) = self.current_fence() {
            match self.lead_sweep(now, &fence, &mut done).await {
                Err(StoreError::Fenced { epoch }) => {
                    self.step_down(&format!("epoch {epoch} was superseded"));
                    self.app.set_leader(false);
                }
                other => other?,
            }
        }
        let store = self.app.store();
        if now > self.announced_until {
            for agent in store
                .agents_due(DueBetween {
                    after: self.announced_until,
                    until: now,
                })
                .await?
            {
                done.woken_agents += 1;
                self.app.notifier().wake_agent(&agent);
            }
            self.announced_until = now;
        }
        self.app.metrics().sweeps.inc();
        Ok(done)
    }

    async fn lead_sweep(
        &mut self,
        now: Timestamp,
        fence: &Fence,
        done: &mut Sweep,
    ) -> Result<(), StoreError> {
        let store = self.app.store();
        for lease in store
            .leases_expired(Due {
                now,
                limit: SWEEP_BATCH,
            })
            .await?
        {
            let command = Command::Expire {
                step: lease.step,
                attempt: lease.attempt,
                jitter: self.app.jitter(),
            };
            match store
                .job_apply(Apply::new(lease.job_id, command, now).fenced(fence))
                .await
            {
                Ok(t) => {
                    done.expired += 1;
                    self.app.metrics().leases_expired.inc();
                    tracing::info!(job = %lease.job_id, step = lease.step, attempt = lease.attempt, "lease expired");
                    self.app.committed(&t);
                }
                // A report or heartbeat got there first: nothing to heal.
                Err(StoreError::Rejected(Rejection::NotExpired)) => {}
                Err(e) => per_item(e, "job")?,
            }
        }
        done.deadlines = self.enforce_deadlines(now, fence).await?;
        // Issued together so the store can commit them as one group (one fsync), which is what
        // keeps a crowd of jobs due at the same instant on time.
        let due = store
            .jobs_due(Due {
                now,
                limit: SWEEP_BATCH,
            })
            .await?;
        let activations = due
            .into_iter()
            .map(|job| store.job_apply(Apply::new(job, Command::Activate, now).fenced(fence)));
        for result in futures::future::join_all(activations).await {
            match result {
                Ok(t) => {
                    done.activated += 1;
                    self.app.committed(&t);
                }
                Err(StoreError::Rejected(Rejection::NotDue)) => {}
                Err(e) => per_item(e, "job")?,
            }
        }
        for s in store
            .schedules_due(Due {
                now,
                limit: SWEEP_BATCH,
            })
            .await?
        {
            let name = s.name.clone();
            match self.fire(s, now, fence).await {
                Ok(n) => done.fired += n,
                // Losing the lease ends this sweep; anything else concerns this schedule only
                // and must not stop the rest of the supervisor's work.
                Err(e @ StoreError::Fenced { .. }) => return Err(e),
                Err(e) => tracing::error!(schedule = %name, error = %e, "cannot fire schedule"),
            }
        }
        done.repaired = self.repair_some(now, fence).await?;
        done.pruned = self.prune_some(now).await?;
        Ok(())
    }

    /// Removes finished jobs whose retention has passed, a bounded batch per write, for up to
    /// [`prune_budget`] of the sweep; looks again at the next sweep while a batch came back
    /// full, else after [`PRUNE_EVERY`]. Unfenced: the store removes only finished jobs, which
    /// nothing else writes, so a deposed leader finishing a batch changes nothing another would
    /// not.
    async fn prune_some(&mut self, now: Timestamp) -> Result<usize, StoreError> {
        if now < self.next_prune_at {
            return Ok(0);
        }
        let store = self.app.store();
        let mut pruned = 0;
        let mut backlog = false;
        let until = self
            .app
            .now()
            .plus(prune_budget(self.interval, self.prune_quarters));
        for _ in 0..PRUNE_WRITES_PER_SWEEP {
            let limit = self.removal_batch;
            let started = self.app.now();
            if started >= until {
                break;
            }
            let gone = store
                .jobs_prune(Prune {
                    now,
                    retention: *self.app.retention(),
                    limit,
                })
                .await?;
            let took = Span::from_millis(
                u64::try_from(self.app.now().as_millis() - started.as_millis()).unwrap_or(0),
            );
            self.removal_batch = retention::next_removal_batch(limit, took, self.retention_batch);
            pruned += gone.ids.len();
            backlog = gone.more;
            if !backlog {
                break;
            }
            // Let the writes queued meanwhile (claims, reports) go first.
            tokio::task::yield_now().await;
        }
        if pruned > 0 {
            self.app.metrics().jobs_pruned.inc_by(pruned as u64);
            tracing::debug!(
                pruned,
                backlog,
                "removed finished jobs past their retention"
            );
        }
        self.prune_quarters = retention::next_removal_quarters(self.prune_quarters, backlog);
        self.next_prune_at = if backlog { now } else { now.plus(PRUNE_EVERY) };
        Ok(pruned)
    }

    /// Fails the jobs whose deadline has come (`Command::Deadline`): before activations, so a
    /// pending job past its deadline never starts.
    async fn enforce_deadlines(&self, now: Timestamp, fence: &Fence) -> Result<usize, StoreError> {
        let store = self.app.store();
        let mut failed = 0;
        for job in store
            .jobs_past_deadline(Due {
                now,
                limit: SWEEP_BATCH,
            })
            .await?
        {
            match store
                .job_apply(Apply::new(job, Command::Deadline, now).fenced(fence))
                .await
            {
                Ok(t) => {
                    failed += 1;
                    tracing::info!(%job, "job deadline passed");
                    self.app.committed(&t);
                }
                // It finished or started unwinding meanwhile: nothing left to enforce.
                Err(StoreError::Rejected(Rejection::NotDue)) => {}
                Err(e) => per_item(e, "job")?,
            }
        }
        Ok(failed)
    }

    /// Fires every due time of a schedule up to `now` (within the misfire rule).
    async fn fire(
        &self,
        mut s: Schedule,
        now: Timestamp,
        fence: &Fence,
    ) -> Result<usize, StoreError> {
        let store = self.app.store();
        let cron = match CronSchedule::parse(&s.spec.cron, &s.spec.timezone) {
            Ok(c) => c,
            Err(e) => {
                // Checked at creation; only a time zone database change could get here.
                tracing::error!(schedule = %s.name, error = %e, "cannot evaluate schedule; pausing it");
                store
                    .schedule_set_paused(SchedulePause {
                        name: s.name.to_string(),
                        paused: true,
                        next_fire_at: None,
                        now,
                    })
                    .await?;
                return Ok(0);
            }
        };
        let mut fired = 0;
        for _ in 0..CATCH_UP {
            let Some(due) = s.next_fire_at.filter(|d| *d <= now) else {
                break;
            };
            let plan = schedule::plan(&cron, s.spec.misfire, due, now);
            let job = plan.fire.map(|fire_at| {
                let spec = s.spec.job_for(fire_at);
                let job = Job::from_spec(self.app.new_job_id(), &spec, now);
                NewJob {
                    transition: admit(job, now),
                }
            });
            if job.is_none() {
                tracing::warn!(schedule = %s.name, due = %due, "misfire: skipping the missed window");
            }
            let fire = Fire {
                name: s.name.clone(),
                spec: s.spec.clone(),
                due_at: due,
                next_fire_at: plan.next,
                job,
                now,
            };
            let outcome = match store.schedule_fire(fire.clone(), fence).await {
                Ok(o) => o,
                Err(StoreError::IdempotencyConflict { key, existing, .. }) => {
                    // A job under this due time's key exists with another body (the schedule was
                    // deleted and recreated differently): that firing happened; move on.
                    tracing::error!(schedule = %s.name, due = %due, %key, %existing,
                        "this due time already fired with another job body; skipping it");
                    let pass = Fire { job: None, ..fire };
                    store.schedule_fire(pass, fence).await?
                }
                Err(e) => return Err(e),
            };
            if matches!(outcome, FireOutcome::Stale) {
                break;
            }
            fired += self.fired(&s.name, due, outcome);
            s.next_fire_at = plan.next;
        }
        Ok(fired)
    }

    /// Logs and announces what one firing did; answers how many jobs it created (0 or 1).
    fn fired(&self, name: &str, due: Timestamp, outcome: FireOutcome) -> usize {
        match outcome {
            FireOutcome::Fired(Submitted::Created(t)) => {
                tracing::info!(schedule = %name, due = %due, job = %t.job.id, "schedule fired");
                self.app.metrics().jobs_submitted.inc();
                self.app.committed(&t);
                1
            }
            FireOutcome::Fired(Submitted::Existing(job)) => {
                tracing::info!(schedule = %name, due = %due, job = %job.id, "schedule firing already recorded");
                0
            }
            FireOutcome::Skipped { running } => {
                tracing::info!(schedule = %name, due = %due, %running, "overlap: previous run not finished, skipped");
                0
            }
            FireOutcome::Passed | FireOutcome::Stale => 0,
        }
    }

    /// Re-derives the next page of active jobs; returns how many needed repair.
    async fn repair_some(&mut self, now: Timestamp, fence: &Fence) -> Result<usize, StoreError> {
        let store = self.app.store();
        let page = store
            .jobs_active(ActivePage {
                after: self.repair_cursor,
                limit: self.repair_batch,
            })
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
            match store
                .job_apply(Apply::new(id, Command::Repair, now).fenced(fence))
                .await
            {
                Ok(t) if !t.is_noop() => {
                    repaired += 1;
                    self.app.metrics().repairs.inc();
                    tracing::warn!(job = %id, state = %t.job.state, "repaired an inconsistent job");
                    self.app.committed(&t);
                }
                Ok(_) | Err(StoreError::JobNotFound(_)) => {}
                Err(e) => per_item(e, "job")?,
            }
        }
        Ok(repaired)
    }
}

/// Whether an error about one item (a job, a lease) ends the sweep: losing the leader lease or
/// the store does; anything else is logged and the sweep goes on with the next item, so one bad
/// record never stalls healing for everything else.
fn per_item(e: StoreError, what: &str) -> Result<(), StoreError> {
    match e {
        StoreError::Fenced { .. } | StoreError::Unavailable(_) => Err(e),
        other => {
            tracing::error!(error = %other, what, "skipping one item this sweep");
            Ok(())
        }
    }
}
