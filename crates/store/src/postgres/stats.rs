//! Counts for the console's overview (`Store::jobs_count_by_state`,
//! `Store::jobs_finished_per_minute`), each answered from an index alone.

use deadpool_postgres::Transaction;
use overseer_core::{JobState, Timestamp};

use super::rows::{corrupt, get, query, to_u64};
use super::Res;

fn state(raw: String) -> Res<JobState> {
    JobState::parse(&raw).ok_or_else(|| corrupt("jobs.state", &raw))
}

pub(super) async fn count_by_state(tx: &Transaction<'_>) -> Res<Vec<(JobState, u64)>> {
    let rows = query(
        tx,
        "SELECT state, COUNT(*)::bigint FROM jobs GROUP BY state ORDER BY state",
        &[],
    )
    .await?;
    rows.iter()
        .map(|row| {
            Ok((
                state(get(row, 0, "state")?)?,
                to_u64("count", get(row, 1, "count")?)?,
            ))
        })
        .collect()
}

pub(super) async fn finished_per_minute(
    tx: &Transaction<'_>,
    since: Timestamp,
    until: Timestamp,
) -> Res<Vec<(u32, JobState, u64)>> {
    let rows = query(
        tx,
        "SELECT ((finished_at - $1) / 60000)::bigint AS bucket, state, COUNT(*)::bigint \
         FROM jobs \
         WHERE finished_at IS NOT NULL AND finished_at >= $1 AND finished_at < $2 \
         GROUP BY bucket, state ORDER BY bucket, state",
        &[&since.as_millis(), &until.as_millis()],
    )
    .await?;
    rows.iter()
        .map(|row| {
            let bucket: i64 = get(row, 0, "bucket")?;
            let bucket = u32::try_from(bucket).map_err(|_| corrupt("jobs.finished_at", bucket))?;
            Ok((
                bucket,
                state(get(row, 1, "state")?)?,
                to_u64("count", get(row, 2, "count")?)?,
            ))
        })
        .collect()
}
