//! Overseer's pure domain core.
//!
//! Everything here is deterministic: no I/O, no clock reads, no randomness. Time (`now`) and
//! jitter are passed in by the caller, so the same inputs always give the same transition. The
//! store persists what [`machine::apply`] decides; the server only routes requests to it.

pub mod auth;
pub mod backoff;
pub mod bucket;
pub mod id;
pub mod job;
pub mod machine;
pub mod outbox;
pub mod push;
pub mod rerun;
pub mod retention;
pub mod schedule;
pub mod spec;
pub mod time;
pub mod waiting;
pub mod wire;

pub use id::{JobId, LeaseId};
pub use job::{
    AlertKind, CompPhase, DesiredState, Event, EventKind, Job, JobState, NewEvent, Step, StepState,
};
pub use machine::{apply, Command, Effect, Rejection, Reply, RetiredLease, Transition};
pub use spec::{JobSpec, Limits, SpecError, StepSpec};
pub use time::{Span, Timestamp};
