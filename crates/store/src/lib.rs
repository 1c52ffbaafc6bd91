//! Overseer's durable store.
//!
//! One trait, [`Store`], with flat noun-verb methods taking small parameter structs. The logic of
//! what a command does to a job lives in `overseer_core::machine`; a backend only loads a job,
//! asks the core for the transition, and writes it back in the same transaction. So backends
//! cannot disagree on semantics, only on how they store and find rows.
//!
//! Every write method returns only after its transaction is committed durably (fsync'd).

use async_trait::async_trait;
use overseer_core::auth::TokenRecord;
use overseer_core::{Command, Job, JobId, JobState, LeaseId, Timestamp, Transition};

#[cfg(feature = "testing")]
pub mod conformance;
pub(crate) mod filter;
#[cfg(feature = "testing")]
pub mod pgtest;
pub mod postgres;
pub mod sqlite;
pub(crate) mod tokens;
pub(crate) mod write_set;

pub use postgres::PgStore;
pub use sqlite::{SqliteOptions, SqliteStore};

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("job {0} not found")]
    JobNotFound(JobId),
    #[error("lease {0} not found")]
    LeaseNotFound(LeaseId),
    /// The idempotency key is taken by a job with another body.
    #[error("idempotency key `{key}` is already used by job {existing} with a different body")]
    IdempotencyConflict {
        index: usize,
        key: String,
        existing: JobId,
    },
    /// The core refused the command; nothing changed.
    #[error(transparent)]
    Rejected(#[from] overseer_core::Rejection),
    /// The store cannot be reached or cannot commit right now; the caller may retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A fenced write from a node that no longer holds the leader lease (or whose epoch moved on):
    /// nothing was written. The node must step down.
    #[error("not the leader (epoch {epoch} is no longer current)")]
    Fenced { epoch: i64 },
    #[error("schedule `{0}` not found")]
    ScheduleNotFound(String),
    /// A schedule with that name exists with another definition.
    #[error("schedule `{0}` already exists with a different definition")]
    ScheduleConflict(String),
    /// Stored data could not be read back (a bug or a corrupted store).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Another process has this store open (a SQLite file serves one server process).
    #[error("{0}")]
    InUse(String),
    #[error("a token named `{0}` already exists")]
    TokenExists(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One job to insert: the job in its admitted state and the history of its admission.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub transition: Transition,
}

/// What a submit did.
#[derive(Clone, Debug)]
pub enum Submitted {
    /// A new job was stored.
    Created(Transition),
    /// A job with the same idempotency key and the same body exists: nothing was stored.
    Existing(Job),
}

/// `GET /v1/jobs` filters. Results are newest first.
#[derive(Clone, Debug, Default)]
pub struct JobQuery {
    pub state: Option<JobState>,
    /// Every pair must match a label of the job.
    pub labels: Vec<(String, String)>,
    pub limit: usize,
    /// Only jobs with a smaller id (older) than this.
    pub before: Option<JobId>,
    /// Only jobs whose id lies in this range, both ends included (an id prefix, see
    /// `JobId::prefix_range`).
    pub ids: Option<(JobId, JobId)>,
    /// Only jobs with at least one step run by this agent name.
    pub agent: Option<String>,
    /// Only jobs created at or after this instant.
    pub created_from: Option<Timestamp>,
    /// Only jobs created before this instant.
    pub created_before: Option<Timestamp>,
    /// Only jobs submitted with the token of this name.
    pub submitted_by: Option<String>,
}

/// A claim for up to `lease_ids.len()` ready steps of one agent name.
#[derive(Clone, Debug)]
pub struct Claim {
    pub agent: String,
    pub worker: String,
    /// One fresh id for each lease that may be handed out; its length is the claim's maximum.
    pub lease_ids: Vec<LeaseId>,
    pub now: Timestamp,
}

/// A step that was leased by a claim: its index and the committed transition (whose `job` is
/// the job as it now stands, with the step `running` under the new lease).
#[derive(Clone, Debug)]
pub struct Claimed {
    pub step: usize,
    pub transition: Transition,
}

/// Which attempt of which step a lease id stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    pub lease_id: LeaseId,
    pub job_id: JobId,
    pub step: usize,
    pub attempt: u32,
}

/// A recorded alert or callback waiting to be delivered.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub id: i64,
    pub kind: overseer_core::outbox::DeliveryKind,
    pub job_id: JobId,
    pub url: Option<String>,
    pub idempotency_key: String,
    pub body: serde_json::Value,
    /// Delivery attempts made so far.
    pub attempts: u32,
    pub created_at: Timestamp,
    pub next_attempt_at: Timestamp,
    pub last_error: Option<String>,
}

/// How a delivery attempt went.
#[derive(Clone, Debug, PartialEq)]
pub enum DeliveryOutcome {
    /// Acknowledged (2xx): forget it.
    Delivered,
    /// Try again at `next_attempt_at`.
    Retry {
        next_attempt_at: Timestamp,
        error: String,
    },
    /// The attempt budget is spent: keep it as dead for inspection, never retry.
    GiveUp { error: String },
}

/// Proof that a node holds the leader lease: every write of the supervisor carries it, and the
/// store refuses it ([`Error::Fenced`]) once another node has taken over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub node: String,
    pub epoch: i64,
}

/// The leader lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub node: String,
    /// Grows by one each time the lease changes hands.
    pub epoch: i64,
    pub expires_at: Timestamp,
}

/// What a node that shares its store with other nodes hears from them: things they committed
/// that should wake something here. Backends used by one node only have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Steps of this agent name became claimable (or an agent was resumed).
    Ready { agent: String },
    /// A job reached a terminal state.
    Finished { job: JobId },
    /// Something becomes due at this instant (a retry, a delayed job): the leader should sweep.
    Due { at: Timestamp },
}

/// Limits on handing out one agent name's leases, across all workers and nodes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentSettings {
    /// Leases in flight at most (work and undo leases held by this agent name).
    pub max_concurrency: Option<u32>,
    /// Leases started per second at most (a token bucket holding one second's worth).
    pub rate: Option<f64>,
    /// No new leases at all while paused; running ones are untouched.
    pub paused: bool,
}

/// The outcome of a claim.
#[derive(Clone, Debug, Default)]
pub struct ClaimResult {
    pub claimed: Vec<Claimed>,
    /// Set when the agent's rate limit held leases back: the instant the next one may start.
    pub throttled_until: Option<Timestamp>,
}

/// The head of an ordering key and the jobs queued behind it.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderingKeyStatus {
    pub key: String,
    /// The oldest job of the key that is not terminal: the only one that may run.
    pub head: Option<Job>,
    /// Non-terminal jobs of the key behind the head.
    pub waiting: u64,
}

/// A cron schedule as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub name: String,
    pub spec: overseer_core::schedule::ScheduleSpec,
    pub paused: bool,
    /// The next due time (None while paused).
    pub next_fire_at: Option<Timestamp>,
    pub last_fire_at: Option<Timestamp>,
    pub last_job_id: Option<JobId>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// One firing of a schedule, committed all-or-nothing with the advance of the schedule.
#[derive(Clone, Debug)]
pub struct Fire {
    pub name: String,
    /// The due time being fired: must equal the stored `next_fire_at`, else the firing is stale.
    pub due_at: Timestamp,
    /// Where the schedule goes next.
    pub next_fire_at: Option<Timestamp>,
    /// The job to create (its idempotency key is derived from the schedule and `due_at`).
    pub job: NewJob,
    pub now: Timestamp,
}

/// What a firing did.
#[derive(Clone, Debug)]
// Fired once per schedule tick: the size of the variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum FireOutcome {
    /// The job was created (or already existed with that key) and the schedule advanced.
    Fired(Submitted),
    /// `overlap: skip` and the previous job is not terminal: no job, the schedule advanced.
    Skipped { running: JobId },
    /// Another firing got there first (`next_fire_at` moved): nothing written.
    Stale,
}

/// What the holder of a lease reports, in a [`Store::leases_report`] batch.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseReport {
    Complete {
        result: serde_json::Value,
    },
    /// `jitter` in `[0, 1)` spreads a retry, as in [`Command::Fail`].
    Fail {
        error: String,
        retryable: bool,
        jitter: f64,
    },
}

impl LeaseReport {
    /// The command this report is for the attempt a lease stands for.
    pub fn command(self, step: usize, attempt: u32) -> Command {
        match self {
            LeaseReport::Complete { result } => Command::Complete {
                step,
                attempt,
                result,
            },
            LeaseReport::Fail {
                error,
                retryable,
                jitter,
            } => Command::Fail {
                step,
                attempt,
                error,
                retryable,
                jitter,
            },
        }
    }
}

/// One report's outcome: the lease it resolved to and the committed transition, or why not.
pub type Reported = Result<(LeaseRef, Transition)>;

/// Ready and running counts of one agent name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCounts {
    pub agent: String,
    pub ready: u64,
    pub running: u64,
}

/// The durable state behind every server node.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Inserts jobs all-or-nothing. A job whose idempotency key exists answers
    /// [`Submitted::Existing`] when its fingerprint matches, else the whole call fails with
    /// [`Error::IdempotencyConflict`] and nothing is stored.
    async fn jobs_submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>>;

    async fn job_get(&self, id: JobId) -> Result<Option<Job>>;

    /// Jobs matching the query, newest first; `limit` 0 gives none.
    async fn jobs_list(&self, query: JobQuery) -> Result<Vec<Job>>;

    /// The job's history, oldest first, at most `limit` entries after `after_seq`.
    /// [`Error::JobNotFound`] when the job does not exist.
    async fn job_events(
        &self,
        id: JobId,
        after_seq: i64,
        limit: usize,
    ) -> Result<Vec<overseer_core::Event>>;

    /// Loads the job, applies `command` through the core at `now`, and commits the transition
    /// in one transaction. A rejection changes nothing and comes back as [`Error::Rejected`].
    async fn job_apply(&self, id: JobId, command: Command, now: Timestamp) -> Result<Transition>;

    /// Leases up to `claim.lease_ids.len()` claimable steps of `claim.agent` (steps whose
    /// `Step::claim_agent()` is that agent: ready work, or a ready undo whose compensate agent it
    /// is) whose `next_attempt_at` has come, higher job priority first, then oldest ready first. Each
    /// claim bumps the step's attempt; no step is handed out twice, however many callers race.
    ///
    /// Honours the agent's [`AgentSettings`] in the same transaction: nothing while paused, no
    /// more than `max_concurrency` leases in flight, and a token bucket for `rate`.
    ///
    /// Order: by `next_attempt_at - priority × PRIORITY_AGING` ascending (the core's
    /// `Job::claim_rank`), so higher priority goes first but a waiting step is never starved.
    async fn steps_claim(&self, claim: Claim) -> Result<ClaimResult>;

    async fn lease_find(&self, lease_id: LeaseId) -> Result<Option<LeaseRef>>;

    /// Leased steps (work or undo: `Step::is_leased()`) whose lease ended at or before `now`,
    /// oldest expiry first.
    async fn leases_expired(&self, now: Timestamp, limit: usize) -> Result<Vec<LeaseRef>>;

    /// Pending jobs whose `run_at` has come and that head their ordering key (or have none),
    /// earliest first.
    async fn jobs_due(&self, now: Timestamp, limit: usize) -> Result<Vec<JobId>>;

    /// Agent names with a claimable step (by `Step::claim_agent()`: ready work, or a ready undo
    /// under its compensate agent) whose `next_attempt_at` lies in `(after, now]`: retries whose
    /// backoff just ended, so their long-polls can be woken.
    async fn agents_due(&self, after: Timestamp, now: Timestamp) -> Result<Vec<String>>;

    /// The earliest instant at which the supervisor has something to do: a pending `run_at` of an
    /// unkeyed job (even past: the sweep clears it), a keyed or retrying step's time only when in
    /// the future (a keyed job behind its head, or a due retry, must not make it spin), any
    /// lease expiry, and any unpaused schedule's `next_fire_at`. Lets it sleep exactly until then.
    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>>;

    /// Per agent name, for unfinished jobs: `ready` counts claimable steps by the agent that may
    /// claim them (due or not), `running` counts leased steps by the agent holding the lease (the
    /// compensate agent for an undo). Agents with neither are left out; sorted by name.
    async fn agents_counts(&self) -> Result<Vec<AgentCounts>>;

    /// Deliveries (alerts, callbacks) due at `now`, oldest due first. Every transition's
    /// durable effects (`Effect::is_durable`) are recorded by `jobs_submit`, `job_apply` and
    /// `steps_claim` in the same transaction, as `overseer_core::outbox::outgoing` describes.
    async fn deliveries_due(&self, now: Timestamp, limit: usize) -> Result<Vec<Delivery>>;

    /// Records how a delivery attempt went (counts the attempt).
    async fn delivery_update(&self, id: i64, outcome: DeliveryOutcome) -> Result<()>;

    /// Counts of deliveries waiting and given up, for metrics.
    async fn deliveries_counts(&self) -> Result<(u64, u64)>;

    /// Ids of jobs not yet terminal, in id order after `after`: the supervisor's repair scan
    /// walks them a page at a time.
    async fn jobs_active(&self, after: Option<JobId>, limit: usize) -> Result<Vec<JobId>>;

    /// Applies many lease holders' reports, each exactly as [`Store::lease_find`] followed by
    /// [`Store::job_apply`] would: the lease resolves to its step and attempt, and the core's
    /// fence refuses a report for an attempt that is no longer live. Answers one outcome per
    /// report, in order; one report's refusal leaves the others untouched. The outer `Err`
    /// means none of them was applied. Each applied report is durable before this returns.
    ///
    /// This default applies them one at a time; a backend may commit them together.
    async fn leases_report(
        &self,
        reports: Vec<(LeaseId, LeaseReport)>,
        now: Timestamp,
    ) -> Result<Vec<Reported>> {
        let mut out = Vec::with_capacity(reports.len());
        for (lease_id, report) in reports {
            let outcome = match self.lease_find(lease_id).await {
                Ok(Some(lease)) => self
                    .job_apply(lease.job_id, report.command(lease.step, lease.attempt), now)
                    .await
                    .map(|t| (lease, t)),
                Ok(None) => Err(Error::LeaseNotFound(lease_id)),
                Err(e) => Err(e),
            };
            out.push(outcome);
        }
        Ok(out)
    }

    /// Whether the store answers at all (for `/readyz`).
    async fn ping(&self) -> Result<()>;

    /// Like [`Store::job_apply`], but only while `fence` is the current leader lease; else
    /// [`Error::Fenced`] and nothing is written. The supervisor's writes go through this.
    async fn job_apply_fenced(
        &self,
        id: JobId,
        command: Command,
        now: Timestamp,
        fence: &Fence,
    ) -> Result<Transition>;

    /// Takes the leader lease for `node` if it is free or expired (epoch + 1), or renews it if
    /// `node` holds it (same epoch, new expiry). Returns the lease if `node` holds it afterwards.
    async fn leader_acquire(
        &self,
        node: &str,
        ttl: overseer_core::Span,
        now: Timestamp,
    ) -> Result<Option<Leadership>>;

    /// The current leader lease, expired or not.
    async fn leader_get(&self) -> Result<Option<Leadership>>;

    /// Gives the lease up at once (on shutdown), if `node` still holds `epoch`.
    async fn leader_release(&self, node: &str, epoch: i64) -> Result<()>;

    /// Cross-node wake-ups, for backends shared by several nodes.
    fn signals(&self) -> Option<tokio::sync::broadcast::Receiver<Signal>> {
        None
    }

    async fn agent_settings_get(&self, agent: &str) -> Result<AgentSettings>;

    async fn agent_settings_put(
        &self,
        agent: &str,
        settings: AgentSettings,
        now: Timestamp,
    ) -> Result<AgentSettings>;

    /// Every agent name with non-default settings.
    async fn agent_settings_list(&self) -> Result<Vec<(String, AgentSettings)>>;

    async fn ordering_key_status(&self, key: &str) -> Result<OrderingKeyStatus>;

    // ---- API tokens ----

    /// Stores a new token; a name already used (live or revoked) is [`Error::TokenExists`].
    async fn token_create(&self, token: TokenRecord) -> Result<()>;

    /// Every token, oldest first. Hashes are included; callers never show them.
    async fn tokens_list(&self) -> Result<Vec<TokenRecord>>;

    /// The token whose secret hashes to `hash`, live or not.
    async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>>;

    /// Revokes the named token at `now`; false when no unrevoked token has that name.
    async fn token_revoke(&self, name: &str, now: Timestamp) -> Result<bool>;

    /// Creates a schedule; the same definition again is a no-op answering the stored one;
    /// another definition under the same name is [`Error::ScheduleConflict`].
    async fn schedule_create(&self, schedule: Schedule) -> Result<(Schedule, bool)>;

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>>;

    async fn schedules_list(&self) -> Result<Vec<Schedule>>;

    /// Returns whether it existed.
    async fn schedule_delete(&self, name: &str) -> Result<bool>;

    /// Sets a schedule's `paused` flag and `next_fire_at` exactly as given (pausing passes None;
    /// resuming, or skipping a missed window, passes the next due time).
    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        next_fire_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<Schedule>;

    /// Schedules not paused whose `next_fire_at` has come, earliest first.
    async fn schedules_due(&self, now: Timestamp, limit: usize) -> Result<Vec<Schedule>>;

    /// Fires one due time of a schedule: in one transaction, checks `fence` and that
    /// `fire.due_at` is still the schedule's `next_fire_at`, applies `overlap`, inserts the job
    /// (idempotent on its key), and advances the schedule. A firing can be neither lost nor
    /// doubled, whatever crashes and however many nodes race.
    async fn schedule_fire(&self, fire: Fire, fence: &Fence) -> Result<FireOutcome>;

    /// Deletes the jobs among `ids` that are in one of `states` and hold no live lease (no step
    /// `Step::is_leased()`), with their steps, labels, history and lease records, each checked
    /// and deleted in the write transaction; recorded deliveries stay (they outlive their job).
    /// Missing jobs, jobs in another state and jobs with a live lease are left alone, so a
    /// caller that looked at a job earlier cannot delete it after it moved on. Returns the ids
    /// deleted, in the order given. Nothing else is needed to forget a job: an ordering key whose
    /// head is deleted is headed by its next job.
    async fn jobs_delete(&self, ids: Vec<JobId>, states: Vec<JobState>) -> Result<Vec<JobId>>;

    /// Replaces job `old` by `new` in one transaction: deletes `old` exactly as
    /// [`Store::jobs_delete`] would (only when in one of `states` with no live lease) and inserts
    /// `new` as [`Store::jobs_submit`] would; `new` may reuse `old`'s idempotency key. So a job
    /// can be started over (an operator's requeue) with no instant at which neither exists.
    /// `Ok(None)` when `old` is missing or not removable: nothing written. When `new`'s key is
    /// held by a third job, [`Error::IdempotencyConflict`] and nothing written.
    async fn job_replace(
        &self,
        old: JobId,
        states: Vec<JobState>,
        new: NewJob,
    ) -> Result<Option<Transition>>;

    /// Per agent name, the claimable steps of unfinished jobs (by `Step::claim_agent()`) whose
    /// `next_attempt_at` has come at `now`: what the agent could be handed right now, its
    /// limits and pause aside (unlike [`Store::agents_counts`], retries still waiting out their
    /// backoff are left out). Agents with none are left out; sorted by name.
    async fn agents_ready_now(&self, now: Timestamp) -> Result<Vec<(String, u64)>>;

    /// The value stored under `key`; when there is none, stores `value` (made at `now`) and
    /// answers it. Concurrent callers on any node all get the one value that was stored first.
    async fn setting_get_or_insert(&self, key: &str, value: &str, now: Timestamp)
        -> Result<String>;
}
