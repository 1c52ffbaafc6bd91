//! Jobs: submit, read, list, apply, due and active jobs, removal and replacement.
//!
//! One file per part of a job's life. Each file's cases are re-exported here, so a case keeps its
//! path (`jobs::submit_and_get_round_trip`) in [`crate::conformance_tests!`] and its test name:
//!
//! - [`submit`](mod@submit): submitting, idempotency keys, the submitter;
//! - [`read`]: the list and its filters, active jobs, the overview's counts;
//! - [`history`]: kept events, event paging, unknown ids;
//! - [`progress`]: completions, step backoff, whole-job retries;
//! - [`operator`]: cancel, hold, retry, resume, skip, repair;
//! - [`timing`]: `run_at`, reschedules, job deadlines;
//! - [`removal`]: deleting and replacing jobs.

use super::*;

pub mod history;
pub mod operator;
pub mod progress;
pub mod read;
pub mod removal;
pub mod submit;
pub mod timing;

pub use history::*;
pub use operator::*;
pub use progress::*;
pub use read::*;
pub use removal::*;
pub use submit::*;
pub use timing::*;
