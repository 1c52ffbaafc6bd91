//! The store the simulated server runs on: the real [`SqliteStore`] behind a thin wrapper that
//! can make the process "die" between two writes of one server operation (a supervisor sweep
//! writes many times), and that can plant a known bug so the simulator's own checks can be
//! shown to catch it.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use overseer_core::auth::TokenRecord;
use overseer_core::{
    Command, Event, Job, JobId, JobState, LeaseId, Span, StepState, Timestamp, Transition,
};
use overseer_store::prelude::*;
use overseer_store::{
    leases, ActivePage, AgentCounts, AgentLimits, AgentReady, AgentSettings, Apply, Claim,
    ClaimResult, Deliveries, Delivery, DeliveryCounts, DeliveryOutcome, Due, DueBetween, Error,
    EventPage, Fence, Fire, FireOutcome, JobQuery, LeaderBid, Leadership, LeaseRef, NewJob,
    OrderingKeyStatus, Removal, Replacement, Reported, Reports, Reran, RerunJob, Result, Schedule,
    ScheduleCreated, SchedulePause, ScheduleUpdate, SettingsUpdate, SqliteStore, Submitted,
};

/// A deliberately wrong behaviour, for proving that the simulator notices it. Never set outside
/// the simulator's self-tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bug {
    #[default]
    None,
    /// Resolving a lease id answers the step's current attempt instead of the lease's own: a
    /// stale agent's report is then applied to whichever attempt is live (no fencing).
    StaleLeaseLookup,
    /// Agent reports are applied at a clock reading 10 s old, as if `now` had been read before a
    /// long await: a report arriving shortly after its lease expired is still accepted.
    LaggingReportClock,
    /// A move of a pending job's `run_at` starts it at once, whatever time was asked for.
    RescheduleRunsNow,
    /// In a whole-job retry with rounds left, the round's last undo counts as done as soon as it
    /// is leased: the next round starts before that step was undone.
    RoundEndsAtLastUndoLease,
    /// The prune of finished jobs ignores their state: an unfinished job whose own retention
    /// has passed since it was created is removed too (when none of its steps is leased).
    PruneIgnoresState,
    /// A rerun from failure is stored as a plain rerun: the steps it should keep run again.
    RerunForgetsKept,
}

/// Shared switches of one simulated process and its store.
#[derive(Debug, Default)]
pub struct Crash {
    /// Writes left before the process dies; negative when no crash is armed.
    writes_left: AtomicI64,
    /// Set once the process died: every later call fails.
    dead: AtomicBool,
}

impl Crash {
    pub fn new() -> Self {
        Crash {
            writes_left: AtomicI64::new(-1),
            dead: AtomicBool::new(false),
        }
    }

    /// Lets `writes` more writes commit, then kills the process before the next one.
    pub fn arm(&self, writes: i64) {
        self.writes_left.store(writes, Ordering::SeqCst);
    }

    pub fn disarm(&self) {
        self.writes_left.store(-1, Ordering::SeqCst);
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn check_alive(&self) -> Result<()> {
        if self.is_dead() {
            Err(Error::Unavailable(
                "simulated crash: the process is gone".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Called before each write: counts it, or kills the process instead of performing it.
    fn before_write(&self) -> Result<()> {
        self.check_alive()?;
        let left = self.writes_left.load(Ordering::SeqCst);
        if left == 0 {
            self.dead.store(true, Ordering::SeqCst);
            return self.check_alive();
        }
        if left > 0 {
            self.writes_left.store(left - 1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// The real SQLite store, with the crash switch and an optional planted bug.
pub struct SimStore {
    inner: SqliteStore,
    crash: Arc<Crash>,
    bug: Bug,
}

impl SimStore {
    pub fn new(inner: SqliteStore, crash: Arc<Crash>, bug: Bug) -> Self {
        SimStore { inner, crash, bug }
    }
}

const REPORT_CLOCK_LAG: Span = Span::from_secs(10);

fn is_report(command: &Command) -> bool {
    matches!(
        command,
        Command::Heartbeat { .. } | Command::Complete { .. } | Command::Fail { .. }
    )
}

/// Whether `attempt` of `step` is the leased undo whose completion at `now` would end the
/// current round of a whole-job retry and start the next (no other step is running or being
/// undone, rounds are left, the job is not being cancelled nor past its deadline).
fn ends_a_round(job: &Job, step: usize, attempt: u32, now: Timestamp) -> bool {
    // Rounds left, and the job still wants its work (a cancelled one ends after its unwind).
    let rounds_left = job.retry.is_some_and(|r| job.round < r.attempts)
        && job.desired_state == overseer_core::DesiredState::Succeeded
        && !job.past_deadline(now);
    let Some(s) = job.steps.get(step) else {
        return false;
    };
    let last = job.steps.iter().enumerate().all(|(i, x)| {
        i == step || !matches!(x.state, StepState::Running | StepState::Compensating)
    });
    rounds_left
        && job.state == JobState::Compensating
        && s.is_compensating()
        && s.is_leased()
        && s.attempt == attempt
        && last
}

/// The planted [`Bug::PruneIgnoresState`]: besides what the real prune removed, every
/// unfinished job whose own retention has passed since it was created (unless a step is leased,
/// which the delete refuses).
async fn prune_ignoring_state(inner: &SqliteStore, now: Timestamp) -> Result<Vec<JobId>> {
    let active = inner
        .jobs_active(ActivePage {
            after: None,
            limit: 1_000,
        })
        .await?;
    let mut old = Vec::new();
    for id in active {
        if let Some(job) = inner.job_get(id).await? {
            if job
                .retention
                .is_some_and(|keep| job.created_at.plus(keep) <= now)
            {
                old.push(id);
            }
        }
    }
    if old.is_empty() {
        return Ok(old);
    }
    inner
        .jobs_delete(Removal {
            ids: old,
            states: vec![
                JobState::Pending,
                JobState::Running,
                JobState::Blocked,
                JobState::Compensating,
            ],
        })
        .await
}

/// Every call checks that the process is alive; every write counts towards an armed crash.
#[async_trait]
impl Jobs for SimStore {
    async fn jobs_submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>> {
        self.crash.before_write()?;
        self.inner.jobs_submit(jobs).await
    }

    async fn job_get(&self, id: JobId) -> Result<Option<Job>> {
        self.crash.check_alive()?;
        self.inner.job_get(id).await
    }

    async fn jobs_list(&self, query: JobQuery) -> Result<Vec<Job>> {
        self.crash.check_alive()?;
        self.inner.jobs_list(query).await
    }

    async fn job_events(&self, page: EventPage) -> Result<Vec<Event>> {
        self.crash.check_alive()?;
        self.inner.job_events(page).await
    }

    async fn job_apply(&self, mut apply: Apply) -> Result<Transition> {
        self.crash.before_write()?;

        if self.bug == Bug::RescheduleRunsNow {
            if let Command::Reschedule {
                run_at: run_at @ Some(_),
                ..
            } = &mut apply.command
            {
                *run_at = Some(apply.now);
            }
        }
        if self.bug == Bug::LaggingReportClock && is_report(&apply.command) {
            apply.now =
                Timestamp::from_millis(apply.now.as_millis() - REPORT_CLOCK_LAG.as_millis_i64());
        }
        self.inner.job_apply(apply).await
    }

    async fn jobs_due(&self, due: Due) -> Result<Vec<JobId>> {
        self.crash.check_alive()?;
        self.inner.jobs_due(due).await
    }

    async fn jobs_active(&self, page: ActivePage) -> Result<Vec<JobId>> {
        self.crash.check_alive()?;
        self.inner.jobs_active(page).await
    }

    async fn jobs_delete(&self, removal: Removal) -> Result<Vec<JobId>> {
        self.crash.before_write()?;
        self.inner.jobs_delete(removal).await
    }

    async fn job_replace(&self, replacement: Replacement) -> Result<Option<Transition>> {
        self.crash.before_write()?;
        self.inner.job_replace(replacement).await
    }

    async fn job_rerun(&self, mut rerun: RerunJob) -> Result<Reran> {
        self.crash.before_write()?;
        if self.bug == Bug::RerunForgetsKept {
            rerun.options.from_failed = false;
        }
        self.inner.job_rerun(rerun).await
    }

    async fn jobs_past_deadline(&self, due: Due) -> Result<Vec<JobId>> {
        self.crash.check_alive()?;
        self.inner.jobs_past_deadline(due).await
    }

    async fn ordering_key_status(&self, key: &str) -> Result<OrderingKeyStatus> {
        self.crash.check_alive()?;
        self.inner.ordering_key_status(key).await
    }

    async fn jobs_count_by_state(&self) -> Result<Vec<overseer_store::StateCount>> {
        self.crash.check_alive()?;
        self.inner.jobs_count_by_state().await
    }

    async fn jobs_finished_per_minute(
        &self,
        window: overseer_store::Window,
    ) -> Result<Vec<overseer_store::FinishedCount>> {
        self.crash.check_alive()?;
        self.inner.jobs_finished_per_minute(window).await
    }
}

#[async_trait]
impl Leases for SimStore {
    async fn steps_claim(&self, claim: Claim) -> Result<ClaimResult> {
        self.crash.before_write()?;
        let now = claim.now;
        let result = self.inner.steps_claim(claim).await?;
        if self.bug == Bug::RoundEndsAtLastUndoLease {
            for c in &result.claimed {
                let Some(job) = self.inner.job_get(c.transition.job.id).await? else {
                    continue;
                };
                let attempt = job.steps.get(c.step).map_or(0, |s| s.attempt);
                if ends_a_round(&job, c.step, attempt, now) {
                    let done = Command::Complete {
                        step: c.step,
                        attempt,
                        result: serde_json::json!({"undo": "taken as done when leased"}),
                    };
                    self.inner.job_apply(Apply::new(job.id, done, now)).await?;
                }
            }
        }
        Ok(result)
    }

    async fn lease_find(&self, lease_id: LeaseId) -> Result<Option<LeaseRef>> {
        self.crash.check_alive()?;
        let found = self.inner.lease_find(lease_id).await?;
        if self.bug != Bug::StaleLeaseLookup {
            return Ok(found);
        }
        let Some(mut lease) = found else {
            return Ok(None);
        };
        if let Some(job) = self.inner.job_get(lease.job_id).await? {
            if let Some(step) = job.steps.get(lease.step) {
                lease.attempt = step.attempt;
            }
        }
        Ok(Some(lease))
    }

    async fn leases_expired(&self, due: Due) -> Result<Vec<LeaseRef>> {
        self.crash.check_alive()?;
        self.inner.leases_expired(due).await
    }

    /// One report at a time through this wrapper's own lookup and apply, so a planted bug in
    /// either reaches batched reports too.
    async fn leases_report(&self, batch: Reports) -> Result<Vec<Reported>> {
        leases::report_one_by_one(self, batch).await
    }
}

#[async_trait]
impl Agents for SimStore {
    async fn agents_counts(&self) -> Result<Vec<AgentCounts>> {
        self.crash.check_alive()?;
        self.inner.agents_counts().await
    }

    async fn agents_ready_now(&self, now: Timestamp) -> Result<Vec<AgentReady>> {
        self.crash.check_alive()?;
        self.inner.agents_ready_now(now).await
    }

    async fn agents_due(&self, window: DueBetween) -> Result<Vec<String>> {
        self.crash.check_alive()?;
        self.inner.agents_due(window).await
    }

    async fn agent_settings_get(&self, agent: &str) -> Result<AgentSettings> {
        self.crash.check_alive()?;
        self.inner.agent_settings_get(agent).await
    }

    async fn agent_settings_put(&self, update: SettingsUpdate) -> Result<AgentSettings> {
        self.crash.before_write()?;
        self.inner.agent_settings_put(update).await
    }

    async fn agent_settings_list(&self) -> Result<Vec<AgentLimits>> {
        self.crash.check_alive()?;
        self.inner.agent_settings_list().await
    }
}

#[async_trait]
impl Schedules for SimStore {
    async fn schedule_create(&self, schedule: Schedule) -> Result<ScheduleCreated> {
        self.crash.before_write()?;
        self.inner.schedule_create(schedule).await
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        self.crash.check_alive()?;
        self.inner.schedule_get(name).await
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        self.crash.check_alive()?;
        self.inner.schedules_list().await
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        self.crash.before_write()?;
        self.inner.schedule_delete(name).await
    }

    async fn schedule_set_paused(&self, pause: SchedulePause) -> Result<Schedule> {
        self.crash.before_write()?;
        self.inner.schedule_set_paused(pause).await
    }

    async fn schedule_update(&self, update: ScheduleUpdate) -> Result<Schedule> {
        self.crash.before_write()?;
        self.inner.schedule_update(update).await
    }

    async fn schedules_due(&self, due: Due) -> Result<Vec<Schedule>> {
        self.crash.check_alive()?;
        self.inner.schedules_due(due).await
    }

    async fn schedule_fire(&self, fire: Fire, fence: &Fence) -> Result<FireOutcome> {
        self.crash.before_write()?;
        self.inner.schedule_fire(fire, fence).await
    }
}

#[async_trait]
impl Leader for SimStore {
    async fn leader_acquire(&self, bid: LeaderBid) -> Result<Option<Leadership>> {
        self.crash.before_write()?;
        self.inner.leader_acquire(bid).await
    }

    async fn leader_get(&self) -> Result<Option<Leadership>> {
        self.crash.check_alive()?;
        self.inner.leader_get().await
    }

    async fn leader_release(&self, fence: &Fence) -> Result<()> {
        self.crash.before_write()?;
        self.inner.leader_release(fence).await
    }
}

#[async_trait]
impl Deliveries for SimStore {
    async fn deliveries_due(&self, due: Due) -> Result<Vec<Delivery>> {
        self.crash.check_alive()?;
        self.inner.deliveries_due(due).await
    }

    async fn delivery_update(&self, id: i64, outcome: DeliveryOutcome) -> Result<()> {
        self.crash.before_write()?;
        self.inner.delivery_update(id, outcome).await
    }

    async fn deliveries_counts(&self) -> Result<DeliveryCounts> {
        self.crash.check_alive()?;
        self.inner.deliveries_counts().await
    }

    async fn alerts_recent(&self, limit: usize) -> Result<Vec<overseer_store::DeliveryRecord>> {
        self.crash.check_alive()?;
        self.inner.alerts_recent(limit).await
    }
}

#[async_trait]
impl Tokens for SimStore {
    async fn token_create(&self, token: TokenRecord) -> Result<()> {
        self.crash.check_alive()?;
        self.inner.token_create(token).await
    }

    async fn tokens_list(&self) -> Result<Vec<TokenRecord>> {
        self.crash.check_alive()?;
        self.inner.tokens_list().await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.crash.check_alive()?;
        self.inner.token_by_hash(hash).await
    }

    async fn token_revoke(&self, name: &str, now: Timestamp) -> Result<bool> {
        self.crash.check_alive()?;
        self.inner.token_revoke(name, now).await
    }

    async fn setting_get_or_insert(
        &self,
        key: &str,
        value: &str,
        now: Timestamp,
    ) -> Result<String> {
        self.crash.check_alive()?;
        self.inner.setting_get_or_insert(key, value, now).await
    }
}

#[async_trait]
impl Maintenance for SimStore {
    async fn ping(&self) -> Result<()> {
        self.crash.check_alive()?;
        self.inner.ping().await
    }

    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>> {
        self.crash.check_alive()?;
        self.inner.next_due_at(now).await
    }

    async fn jobs_prune(&self, prune: overseer_store::Prune) -> Result<overseer_store::Pruned> {
        self.crash.before_write()?;
        let mut gone = self.inner.jobs_prune(prune).await?;
        if self.bug == Bug::PruneIgnoresState {
            gone.ids
                .extend(prune_ignoring_state(&self.inner, prune.now).await?);
        }
        Ok(gone)
    }
}
