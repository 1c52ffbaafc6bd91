//! How long finished jobs are kept.
//!
//! A finished job is removed once its retention has passed since it finished: the job's own
//! `retention` when it was submitted with one, else the server's default for the state it ended
//! in. The rule is decided here; a store only turns [`Retention::cutoffs`] into the conditions
//! of its delete, and the supervisor runs it in bounded batches.

use serde::{Deserialize, Serialize};

use crate::{Job, JobState, Span, Timestamp};

/// The shortest retention a job may ask for: less would remove a job before a client waiting on
/// it has had a chance to read its result.
pub const RETENTION_MIN: Span = Span::from_secs(1);
/// The longest retention a job may ask for (about ten years).
pub const RETENTION_MAX: Span = Span::from_secs(10 * 366 * 24 * 3600);

/// The server's default retention by terminal state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    pub succeeded: Span,
    pub failed: Span,
    pub cancelled: Span,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            succeeded: Span::from_secs(7 * 24 * 3600),
            failed: Span::from_secs(30 * 24 * 3600),
            cancelled: Span::from_secs(30 * 24 * 3600),
        }
    }
}

/// The terminal states and how old a job ending in each must be to go.
pub const TERMINAL: [JobState; 3] = [JobState::Succeeded, JobState::Failed, JobState::Cancelled];

impl Retention {
    /// The default retention of a job that ended in `state`; `None` for a state that is not
    /// terminal (such a job is never removed).
    pub fn of(&self, state: JobState) -> Option<Span> {
        match state {
            JobState::Succeeded => Some(self.succeeded),
            JobState::Failed => Some(self.failed),
            JobState::Cancelled => Some(self.cancelled),
            _ => None,
        }
    }

    /// For each terminal state, the instant at or before which a job that ended in it without a
    /// retention of its own has been kept long enough at `now`.
    pub fn cutoffs(&self, now: Timestamp) -> [(JobState, Timestamp); 3] {
        TERMINAL.map(|state| {
            let keep = self.of(state).unwrap_or(Span::from_millis(0));
            (
                state,
                Timestamp::from_millis(now.as_millis() - keep.as_millis_i64()),
            )
        })
    }

    /// When `job` may be removed: its end plus its own retention or the default for its state;
    /// `None` while it is not finished.
    pub fn removable_at(&self, job: &Job) -> Option<Timestamp> {
        let finished = job.finished_at.filter(|_| job.state.is_terminal())?;
        let keep = job.retention.or_else(|| self.of(job.state))?;
        Some(finished.plus(keep))
    }

    /// Whether `job` may be removed at `now`.
    pub fn is_due(&self, job: &Job, now: Timestamp) -> bool {
        self.removable_at(job).is_some_and(|at| at <= now)
    }
}

/// How long one removal write should take at most: it holds the store's writer (SQLite has
/// one), so claims and reports queued behind it wait that long.
pub const REMOVAL_WRITE_BUDGET: Span = Span::from_millis(3);
/// The smallest removal batch: below it a backlog would take too many writes to clear.
pub const REMOVAL_BATCH_MIN: usize = 20;

/// The next removal batch after one of `batch` jobs took `took`: halved when the write ran past
/// [`REMOVAL_WRITE_BUDGET`], doubled (up to `max`, the configured `retention_batch`) when it
/// took less than half of it, else kept. So removal follows what the store can do in the budget:
/// large batches on a fast store, small ones while it is loaded, and claims never wait long.
pub fn next_removal_batch(batch: usize, took: Span, max: usize) -> usize {
    let budget = REMOVAL_WRITE_BUDGET.as_millis();
    let next = if took.as_millis() > budget {
        batch / 2
    } else if took.as_millis() * 2 < budget {
        batch.saturating_mul(2)
    } else {
        batch
    };
    next.clamp(REMOVAL_BATCH_MIN.min(max), max.max(1))
}

/// The most of a sweep's interval removal may take, in quarters: claims and reports still go
/// first piece by piece, and the sweep's other work keeps a quarter.
pub const REMOVAL_QUARTERS_MAX: u64 = 3;

/// How many quarters of the next sweep removal may take, after a sweep that gave it `quarters`:
/// one more while the backlog outlived its budget (removal is falling behind the jobs that
/// finish, and the store would grow without bound), back to one once a sweep cleared it.
pub fn next_removal_quarters(quarters: u64, backlog_left: bool) -> u64 {
    match backlog_left {
        true => (quarters + 1).min(REMOVAL_QUARTERS_MAX),
        false => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the removal batch halves past the write budget, doubles well within it, and stays
    // within the smallest batch and the configured one.
    #[test]
    fn removal_takes_more_of_the_sweep_only_while_it_falls_behind() {
        assert_eq!(next_removal_quarters(1, true), 2);
        assert_eq!(next_removal_quarters(2, true), 3);
        assert_eq!(next_removal_quarters(3, true), REMOVAL_QUARTERS_MAX);
        assert_eq!(next_removal_quarters(3, false), 1);
        assert_eq!(next_removal_quarters(1, false), 1);
    }

    #[test]
    fn removal_batches_follow_the_write_budget() {
        let ms = Span::from_millis;
        assert_eq!(next_removal_batch(500, ms(40), 500), 250);
        assert_eq!(next_removal_batch(250, ms(1), 500), 500);
        assert_eq!(next_removal_batch(500, ms(0), 500), 500);
        assert_eq!(next_removal_batch(100, ms(2), 500), 100);
        assert_eq!(next_removal_batch(30, ms(90), 500), REMOVAL_BATCH_MIN);
        // A configured batch smaller than the minimum is kept as configured.
        assert_eq!(next_removal_batch(5, ms(90), 5), 5);
        assert_eq!(next_removal_batch(1, ms(0), 1), 1);
    }
    use crate::{JobId, JobSpec};

    fn finished(state: JobState, at_ms: i64, own: Option<Span>) -> Job {
        let spec: JobSpec =
            serde_json::from_value(serde_json::json!({"steps": [{"name": "a", "agent": "x"}]}))
                .expect("spec");
        let mut job = Job::from_spec(JobId::generate(), &spec, Timestamp::from_millis(0));
        job.state = state;
        job.finished_at = Some(Timestamp::from_millis(at_ms));
        job.retention = own;
        job
    }

    // Proves each terminal state keeps its default, a job's own retention wins over it, and an
    // unfinished job is never due, whatever its age.
    #[test]
    fn defaults_by_state_and_the_jobs_own_retention() {
        let r = Retention {
            succeeded: Span::from_secs(10),
            failed: Span::from_secs(20),
            cancelled: Span::from_secs(30),
        };
        let at = Timestamp::from_millis;
        assert!(!r.is_due(&finished(JobState::Succeeded, 0, None), at(9_999)));
        assert!(r.is_due(&finished(JobState::Succeeded, 0, None), at(10_000)));
        assert!(!r.is_due(&finished(JobState::Failed, 0, None), at(19_999)));
        assert!(r.is_due(&finished(JobState::Cancelled, 0, None), at(30_000)));
        let own = finished(JobState::Failed, 0, Some(Span::from_secs(1)));
        assert_eq!(r.removable_at(&own), Some(at(1_000)));
        let running = finished(JobState::Running, 0, None);
        assert!(!r.is_due(&running, at(i64::MAX / 2)));
        assert_eq!(
            r.cutoffs(at(100_000)),
            [
                (JobState::Succeeded, at(90_000)),
                (JobState::Failed, at(80_000)),
                (JobState::Cancelled, at(70_000)),
            ]
        );
    }
}
