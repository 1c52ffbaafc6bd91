//! Jobs: submitting, reading, applying commands, finding due and active jobs, removing and
//! replacing them, and the ordering keys that serialise them.

use async_trait::async_trait;
use overseer_core::{Command, Event, Job, JobId, JobState, Timestamp, Transition};

use crate::{Fence, Result};

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

impl Submitted {
    /// The job as stored: the new one, or the one its idempotency key found.
    pub fn job(&self) -> &Job {
        match self {
            Submitted::Created(t) => &t.job,
            Submitted::Existing(job) => job,
        }
    }

    /// Whether this submit stored the job (rather than finding it by its key).
    pub fn created(&self) -> bool {
        matches!(self, Submitted::Created(_))
    }
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

/// A page of one job's history: at most `limit` events after `after_seq`, oldest first.
#[derive(Clone, Copy, Debug)]
pub struct EventPage {
    pub job: JobId,
    pub after_seq: i64,
    pub limit: usize,
}

/// A command for one job, applied through the core at `now`. With a `fence`, only while that
/// fence is the current leader lease (the supervisor's writes).
#[derive(Clone, Debug)]
pub struct Apply {
    pub job: JobId,
    pub command: Command,
    pub now: Timestamp,
    pub fence: Option<Fence>,
}

impl Apply {
    /// An unfenced command: what clients, agents and operators send.
    pub fn new(job: JobId, command: Command, now: Timestamp) -> Self {
        Apply {
            job,
            command,
            now,
            fence: None,
        }
    }

    /// The same command, written only while `fence` holds the leader lease.
    pub fn fenced(mut self, fence: &Fence) -> Self {
        self.fence = Some(fence.clone());
        self
    }
}

/// At most `limit` of whatever has come due at `now`.
#[derive(Clone, Copy, Debug)]
pub struct Due {
    pub now: Timestamp,
    pub limit: usize,
}

/// A page of unfinished job ids, in id order after `after`.
#[derive(Clone, Copy, Debug)]
pub struct ActivePage {
    pub after: Option<JobId>,
    pub limit: usize,
}

/// Jobs to delete, each only while it is in one of `states` and holds no live lease.
#[derive(Clone, Debug)]
pub struct Removal {
    pub ids: Vec<JobId>,
    pub states: Vec<JobState>,
}

/// A job to start over: `old` is removed as a [`Removal`] would remove it and `new` inserted in
/// the same transaction.
#[derive(Clone, Debug)]
pub struct Replacement {
    pub old: JobId,
    pub states: Vec<JobState>,
    pub new: NewJob,
}

/// A rerun to make (see `overseer_core::rerun`): job `old` run again as the new job `new`,
/// asked at `now` by `submitted_by` (recorded as the new job's `submitted_by`).
#[derive(Clone, Debug)]
pub struct RerunJob {
    pub old: JobId,
    pub new: JobId,
    pub options: overseer_core::rerun::Options,
    pub submitted_by: Option<String>,
    pub now: Timestamp,
}

/// What a rerun committed.
#[derive(Clone, Debug)]
pub struct Reran {
    /// The old job's link to its rerun (`rerun_by`, its `job_rerun` event).
    pub link: Transition,
    /// The new job's admission, followed by its activation when it is keyed and heads its key
    /// (as [`Submitted::Created`] answers a submit).
    pub created: Transition,
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

/// How many jobs are in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateCount {
    pub state: JobState,
    pub count: u64,
}

/// The instants `[since, until)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub since: Timestamp,
    pub until: Timestamp,
}

/// How many jobs ended in `state` during minute `minute` of a [`Window`] (minute `i` covers
/// `since + i min`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FinishedCount {
    pub minute: u32,
    pub state: JobState,
    pub count: u64,
}

/// Jobs and their histories.
#[async_trait]
pub trait Jobs: Send + Sync {
    /// Inserts jobs all-or-nothing. A job whose idempotency key exists answers
    /// [`Submitted::Existing`] when its fingerprint matches, else the whole call fails with
    /// [`crate::Error::IdempotencyConflict`] and nothing is stored.
    async fn jobs_submit(&self, jobs: Vec<NewJob>) -> Result<Vec<Submitted>>;

    async fn job_get(&self, id: JobId) -> Result<Option<Job>>;

    /// Jobs matching the query, newest first; `limit` 0 gives none.
    async fn jobs_list(&self, query: JobQuery) -> Result<Vec<Job>>;

    /// A page of the job's history, oldest first. [`crate::Error::JobNotFound`] when the job
    /// does not exist.
    async fn job_events(&self, page: EventPage) -> Result<Vec<Event>>;

    /// Loads the job, applies the command through the core, and commits the transition in one
    /// transaction. A rejection changes nothing and comes back as [`crate::Error::Rejected`].
    /// With a fence, the leader lease is checked in that same transaction: once another node
    /// has taken over, [`crate::Error::Fenced`] and nothing is written.
    async fn job_apply(&self, apply: Apply) -> Result<Transition>;

    /// Pending jobs whose `run_at` has come and that head their ordering key (or have none),
    /// earliest first.
    async fn jobs_due(&self, due: Due) -> Result<Vec<JobId>>;

    /// Ids of jobs not yet terminal, in id order: the supervisor's repair scan walks them a
    /// page at a time.
    async fn jobs_active(&self, page: ActivePage) -> Result<Vec<JobId>>;

    /// Deletes the jobs among `ids` that are in one of `states` and hold no live lease (no step
    /// `Step::is_leased()`), with their steps, labels, history and lease records, each checked
    /// and deleted in the write transaction; recorded deliveries stay (they outlive their job).
    /// Missing jobs, jobs in another state and jobs with a live lease are left alone, so a
    /// caller that looked at a job earlier cannot delete it after it moved on. Returns the ids
    /// deleted, in the order given. Nothing else is needed to forget a job: an ordering key whose
    /// head is deleted is headed by its next job.
    async fn jobs_delete(&self, removal: Removal) -> Result<Vec<JobId>>;

    /// Replaces job `old` by `new` in one transaction: deletes `old` exactly as
    /// [`Jobs::jobs_delete`] would and inserts `new` as [`Jobs::jobs_submit`] would; `new` may
    /// reuse `old`'s idempotency key. So a job can be started over (an operator's requeue) with
    /// no instant at which neither exists. `Ok(None)` when `old` is missing or not removable:
    /// nothing written. When `new`'s key is held by a third job,
    /// [`crate::Error::IdempotencyConflict`] and nothing written.
    async fn job_replace(&self, replacement: Replacement) -> Result<Option<Transition>>;

    /// Reruns a failed or cancelled job as a new one, in one transaction: loads `old` (locked),
    /// asks the core ([`overseer_core::rerun::rerun`]) what to write, stores the old job's link
    /// (`rerun_by` and its history) and inserts the new job as [`Jobs::jobs_submit`] would (a
    /// keyed job heading its key starts at once). [`crate::Error::JobNotFound`] when `old` is
    /// missing; a refusal of the core (not failed or cancelled, rerun already, a step still
    /// leased) is [`crate::Error::Rejected`] and nothing is written. Of concurrent reruns of
    /// one job exactly one is made; the others are refused as already rerun.
    async fn job_rerun(&self, rerun: RerunJob) -> Result<Reran>;

    async fn ordering_key_status(&self, key: &str) -> Result<OrderingKeyStatus>;

    /// How many jobs are in each state (states with none are left out), sorted by state name.
    /// Read from the `(state, id)` index, never from the rows.
    async fn jobs_count_by_state(&self) -> Result<Vec<StateCount>>;

    /// Jobs that finished in the window, counted per minute and per terminal state, for the
    /// minutes and states that have any, sorted. Read from the `jobs_finished` index, so the
    /// cost follows the jobs finished in the window, not the jobs stored.
    async fn jobs_finished_per_minute(&self, window: Window) -> Result<Vec<FinishedCount>>;
    /// Jobs whose deadline has come by `now` while it is still to be enforced
    /// ([`overseer_core::Job::deadline_due`]), earliest deadline first: the supervisor applies
    /// `Command::Deadline` to each.
    async fn jobs_past_deadline(&self, due: Due) -> Result<Vec<JobId>>;
}
