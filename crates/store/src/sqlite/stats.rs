//! Counts for the console's overview (`Jobs::jobs_count_by_state`,
//! `Jobs::jobs_finished_per_minute`), each answered from an index alone.

use overseer_core::JobState;
use rusqlite::Connection;

use super::rows::{self, corrupt, DbResult};
use crate::{FinishedCount, Result, StateCount, Window};

fn state(raw: String) -> Result<JobState> {
    JobState::parse(&raw).ok_or_else(|| corrupt("jobs.state", &raw))
}

pub(super) fn count_by_state(conn: &Connection) -> Result<Vec<StateCount>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT state, COUNT(*) FROM jobs INDEXED BY jobs_state_id GROUP BY state ORDER BY state",
        )
        .db()?;
    let mut rows = stmt.query([]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(StateCount {
            state: state(row.get(0).db()?)?,
            count: rows::count_param("count", row.get(1).db()?)?,
        });
    }
    Ok(out)
}

/// Finished jobs per minute and state: one range of `jobs_finished` per terminal state.
pub(super) const FINISHED_PER_MINUTE_SQL: &str =
    "SELECT (finished_at - ?1) / 60000 AS bucket, state, COUNT(*) \
     FROM jobs INDEXED BY jobs_finished \
     WHERE state IN ('succeeded', 'failed', 'cancelled') \
       AND finished_at IS NOT NULL AND finished_at >= ?1 AND finished_at < ?2 \
     GROUP BY bucket, state ORDER BY bucket, state";

pub(super) fn finished_per_minute(conn: &Connection, window: Window) -> Result<Vec<FinishedCount>> {
    let mut stmt = conn.prepare_cached(FINISHED_PER_MINUTE_SQL).db()?;
    let mut rows = stmt
        .query([window.since.as_millis(), window.until.as_millis()])
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let bucket: i64 = row.get(0).db()?;
        let bucket = u32::try_from(bucket).map_err(|_| corrupt("jobs.finished_at", bucket))?;
        out.push(FinishedCount {
            minute: bucket,
            state: state(row.get(1).db()?)?,
            count: rows::count_param("count", row.get(2).db()?)?,
        });
    }
    Ok(out)
}
