//! Overseer's durable store.
//!
//! One trait, [`Store`], with flat noun-verb methods taking small parameter structs. The logic of
//! what a command does to a job lives in `overseer_core::machine`; a backend only loads a job,
//! asks the core for the transition, and writes it back in the same transaction. So backends
//! cannot disagree on semantics, only on how they store and find rows.
//!
//! Every write method returns only after its transaction is committed durably (fsync'd).

use async_trait::async_trait;
use overseer_core::{Command, Job, JobId, JobState, LeaseId, Timestamp, Transition};

#[cfg(feature = "testing")]
pub mod conformance;
pub mod sqlite;

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
    /// Stored data could not be read back (a bug or a corrupted store).
    #[error("corrupt record: {0}")]
    Corrupt(String),
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

    /// Leases up to `claim.lease_ids.len()` ready steps of `claim.agent` whose
    /// `next_attempt_at` has come, higher job priority first, then oldest ready first. Each
    /// claim bumps the step's attempt; no step is handed out twice, however many callers race.
    async fn steps_claim(&self, claim: Claim) -> Result<Vec<Claimed>>;

    async fn lease_find(&self, lease_id: LeaseId) -> Result<Option<LeaseRef>>;

    /// Running steps whose lease ended at or before `now`, oldest expiry first.
    async fn leases_expired(&self, now: Timestamp, limit: usize) -> Result<Vec<LeaseRef>>;

    /// Pending jobs whose `run_at` has come, earliest first.
    async fn jobs_due(&self, now: Timestamp, limit: usize) -> Result<Vec<JobId>>;

    /// Agent names with a ready step whose `next_attempt_at` lies in `(after, now]`: retries
    /// whose backoff just ended, so their long-polls can be woken.
    async fn agents_due(&self, after: Timestamp, now: Timestamp) -> Result<Vec<String>>;

    /// The earliest future instant at which something becomes due: a pending `run_at`, a retry's
    /// `next_attempt_at`, or a lease expiry. Lets the supervisor sleep exactly until then.
    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>>;

    async fn agents_counts(&self) -> Result<Vec<AgentCounts>>;

    /// Whether the store answers at all (for `/readyz`).
    async fn ping(&self) -> Result<()>;
}
