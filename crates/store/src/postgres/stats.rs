//! Counts for the console's overview (`Jobs::jobs_count_by_state`,
//! `Jobs::jobs_finished_per_minute`), each answered from an index alone.

use super::tx::Transaction;
use overseer_core::JobState;

use super::rows::{corrupt, get, query, to_u64};
use super::{Res, TERMINAL};
use crate::{FinishedCount, StateCount, Window};

fn state(raw: String) -> Res<JobState> {
    JobState::parse(&raw).ok_or_else(|| corrupt("jobs.state", &raw))
}

pub(super) async fn count_by_state(tx: &Transaction<'_>) -> Res<Vec<StateCount>> {
    let rows = query(
        tx,
        "SELECT state, COUNT(*)::bigint FROM jobs GROUP BY state ORDER BY state",
        &[],
    )
    .await?;
    rows.iter()
        .map(|row| {
            Ok(StateCount {
                state: state(get(row, 0, "state")?)?,
                count: to_u64("count", get(row, 1, "count")?)?,
            })
        })
        .collect()
}

pub(super) async fn finished_per_minute(
    tx: &Transaction<'_>,
    window: Window,
) -> Res<Vec<FinishedCount>> {
    let rows = query(
        tx,
        &format!(
            "SELECT ((finished_at - $1) / 60000)::bigint AS bucket, state, COUNT(*)::bigint \
             FROM jobs \
             WHERE state IN {TERMINAL} \
               AND finished_at IS NOT NULL AND finished_at >= $1 AND finished_at < $2 \
             GROUP BY bucket, state ORDER BY bucket, state"
        ),
        &[&window.since.as_millis(), &window.until.as_millis()],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let bucket: i64 = get(row, 0, "bucket")?;
            let bucket = u32::try_from(bucket).map_err(|_| corrupt("jobs.finished_at", bucket))?;
            Ok(FinishedCount {
                minute: bucket,
                state: state(get(row, 1, "state")?)?,
                count: to_u64("count", get(row, 2, "count")?)?,
            })
        })
        .collect()
}
