//! Overseer's durable store.
//!
//! One trait, [`Store`], made of one part per noun: [`Jobs`], [`Leases`] (steps and their
//! leases), [`Agents`], [`Schedules`], [`Leader`], [`Deliveries`], [`Tokens`] and
//! [`Maintenance`]. Methods are noun-verb and take small parameter structs. Each backend has one
//! module per noun with the same name (`sqlite::jobs`, `postgres::jobs`, …) holding that part's
//! implementation, and the conformance suite is split the same way.
//!
//! The logic of what a command does to a job lives in `overseer_core::machine`; a backend only
//! loads a job, asks the core for the transition, and writes it back in the same transaction.
//! So backends cannot disagree on semantics, only on how they store and find rows.
//!
//! Every write method returns only after its transaction is committed durably (fsync'd).
//! Callers bring the parts into scope with `use overseer_store::prelude::*`.

pub mod agents;
#[cfg(feature = "testing")]
pub mod conformance;
pub(crate) mod decide;
pub mod deliveries;
pub(crate) mod filter;
pub(crate) mod history;
pub mod jobs;
pub mod leader;
pub mod leases;
pub mod maintenance;
#[cfg(feature = "testing")]
pub mod pgtest;
pub mod postgres;
pub mod schedules;
pub mod sqlite;
pub mod tokens;
pub(crate) mod write_set;

pub use agents::{
    AgentCounts, AgentLimits, AgentReady, AgentSettings, Agents, DueBetween, SettingsUpdate,
};
pub use deliveries::{
    Deliveries, Delivery, DeliveryCounts, DeliveryOutcome, DeliveryRecord, DELIVERED_KEPT,
};
pub use jobs::{
    ActivePage, Apply, Due, EventPage, FinishedCount, JobQuery, Jobs, NewJob, OrderingKeyStatus,
    Removal, Replacement, Reran, RerunJob, StateCount, Submitted, Window,
};
pub use leader::{Fence, Leader, LeaderBid, Leadership};
pub use leases::{
    Claim, ClaimResult, Claimed, LeaseRef, LeaseReport, Leases, Offer, Report, ReportApplied,
    Reported, Reports,
};
pub use maintenance::{Maintenance, Prune, Pruned, Signal};
pub use postgres::PgStore;
pub use schedules::{
    Fire, FireOutcome, Schedule, ScheduleCreated, SchedulePause, ScheduleUpdate, Schedules,
};
pub use sqlite::{SqliteOptions, SqliteStore};
pub use tokens::Tokens;

use overseer_core::{JobId, LeaseId};

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

/// The durable state behind every server node: every part, implemented by each backend.
pub trait Store:
    Jobs + Leases + Agents + Schedules + Leader + Deliveries + Tokens + Maintenance + 'static
{
}

impl<T> Store for T where
    T: Jobs + Leases + Agents + Schedules + Leader + Deliveries + Tokens + Maintenance + 'static
{
}

/// The store's parts, so their methods can be called on any [`Store`].
pub mod prelude {
    pub use crate::{
        Agents, Deliveries, Jobs, Leader, Leases, Maintenance, Schedules, Store, Tokens,
    };
}
