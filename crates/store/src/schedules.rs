//! Cron schedules: their definitions and their firings.

use async_trait::async_trait;
use overseer_core::{JobId, Timestamp};

use crate::jobs::{Due, NewJob, Submitted};
use crate::{Fence, Result};

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

/// What a create did.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleCreated {
    /// The schedule as stored.
    pub schedule: Schedule,
    /// False when the same definition was already stored (nothing written).
    pub created: bool,
}

/// Pausing or resuming a schedule: `paused` and `next_fire_at` are set exactly as given
/// (pausing passes None; resuming, or skipping a missed window, passes the next due time).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulePause {
    pub name: String,
    pub paused: bool,
    pub next_fire_at: Option<Timestamp>,
    pub now: Timestamp,
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

/// Cron schedules.
#[async_trait]
pub trait Schedules: Send + Sync {
    /// Creates a schedule; the same definition again is a no-op answering the stored one;
    /// another definition under the same name is [`crate::Error::ScheduleConflict`].
    async fn schedule_create(&self, schedule: Schedule) -> Result<ScheduleCreated>;

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>>;

    async fn schedules_list(&self) -> Result<Vec<Schedule>>;

    /// Returns whether it existed.
    async fn schedule_delete(&self, name: &str) -> Result<bool>;

    async fn schedule_set_paused(&self, pause: SchedulePause) -> Result<Schedule>;

    /// Schedules not paused whose `next_fire_at` has come, earliest first.
    async fn schedules_due(&self, due: Due) -> Result<Vec<Schedule>>;

    /// Fires one due time of a schedule: in one transaction, checks `fence` and that
    /// `fire.due_at` is still the schedule's `next_fire_at`, applies `overlap`, inserts the job
    /// (idempotent on its key), and advances the schedule. A firing can be neither lost nor
    /// doubled, whatever crashes and however many nodes race.
    async fn schedule_fire(&self, fire: Fire, fence: &Fence) -> Result<FireOutcome>;
}
