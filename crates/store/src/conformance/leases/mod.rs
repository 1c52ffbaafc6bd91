//! Steps and leases: claims and their order, fencing of reports, expiry, undo leases.
//!
//! One file per part of a lease's life. Each file's cases are re-exported here, so a case keeps
//! its path (`leases::claim_orders_by_priority_then_age`) in [`crate::conformance_tests!`] and its
//! test name:
//!
//! - [`claims`]: the claim order, racing claimers, HTTP steps;
//! - [`reports`]: stale and batched reports, superseded leases, heartbeats;
//! - [`expiry`]: expired leases, step deadlines;
//! - [`undo`]: undo leases of compensating jobs.

use super::*;

pub mod claims;
pub mod expiry;
pub mod reports;
pub mod undo;

pub use claims::*;
pub use expiry::*;
pub use reports::*;
pub use undo::*;
