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

/// Replacing a schedule's definition (`spec.name` names it): cron, zone, job body, overlap and
/// misfire in one write. `cron` is `spec`'s pattern parsed in its zone (as
/// `ScheduleSpec::validate` answers it). The store decides the next due time from the row as
/// it is at the write, by [`overseer_core::schedule::replan`]: paused stays paused, and no due
/// time that fired is ever due again.
#[derive(Clone, Debug)]
pub struct ScheduleUpdate {
    pub spec: overseer_core::schedule::ScheduleSpec,
    pub cron: overseer_core::schedule::CronSchedule,
    pub now: Timestamp,
}

/// One firing of a schedule, committed all-or-nothing with the advance of the schedule.
#[derive(Clone, Debug)]
pub struct Fire {
    pub name: String,
    /// The definition the firing was planned from: a firing whose schedule was replaced since
    /// is stale (its job body and next due time would be the old definition's).
    pub spec: overseer_core::schedule::ScheduleSpec,
    /// The due time being fired: must equal the stored `next_fire_at`, else the firing is stale.
    pub due_at: Timestamp,
    /// Where the schedule goes next.
    pub next_fire_at: Option<Timestamp>,
    /// The job to create (its idempotency key is derived from the schedule and `due_at`);
    /// `None` passes the due time without a job (a missed window the `misfire` rule skips),
    /// checked and written like a firing, so it cannot undo a pause or a replacement made
    /// since it was planned.
    pub job: Option<NewJob>,
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
    /// The firing carried no job: the schedule advanced past the due time.
    Passed,
    /// Another firing got there first (`next_fire_at` moved), or the schedule was paused or
    /// replaced since the firing was planned: nothing written.
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

    /// Replaces a schedule's definition atomically and answers it as stored; the next due time
    /// is decided in the same transaction (see [`ScheduleUpdate`]). Paused state, the last
    /// firing and the creation time are kept. The same definition again writes nothing.
    /// [`crate::Error::ScheduleNotFound`] when there is no such schedule.
    async fn schedule_update(&self, update: ScheduleUpdate) -> Result<Schedule>;

    /// Schedules not paused whose `next_fire_at` has come, earliest first.
    async fn schedules_due(&self, due: Due) -> Result<Vec<Schedule>>;

    /// Fires one due time of a schedule: in one transaction, checks `fence`, that
    /// `fire.due_at` is still the schedule's `next_fire_at` and that its definition is still
    /// `fire.spec` (else [`FireOutcome::Stale`]), applies `overlap`, inserts the job
    /// (idempotent on its key), and advances the schedule. A firing can be neither lost nor
    /// doubled, whatever crashes and however many nodes race.
    async fn schedule_fire(&self, fire: Fire, fence: &Fence) -> Result<FireOutcome>;
}
