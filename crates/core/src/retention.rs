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

#[cfg(test)]
mod tests {
    use super::*;
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
