//! Health and the supervisor's next wake-up.

use overseer_core::Timestamp;

use super::rows::DbResult;
use super::SqliteStore;
use crate::{Error, Maintenance, Result};

#[async_trait::async_trait]
impl Maintenance for SqliteStore {
    async fn ping(&self) -> Result<()> {
        let writer_up = self.inner.queue.as_ref().is_some_and(|q| !q.is_closed());
        if !writer_up {
            return Err(Error::Unavailable("the store's writer has stopped".into()));
        }
        self.read(|conn| conn.query_row("SELECT 1", [], |_| Ok(())).db())
            .await
    }

    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>> {
        self.read(move |conn| {
            // Past instants count only where the leader's sweep clears them: a pending job
            // without a key, an expired lease, a schedule's due time. A keyed job waiting behind
            // its head, or a retry already due, counts only while still in the future, or the
            // supervisor would wake again at once for something it cannot act on.
            let due: Option<i64> = conn
                .prepare_cached(
                    "SELECT MIN(t) FROM ( \
                       SELECT MIN(run_at) AS t FROM jobs INDEXED BY jobs_pending_unkeyed \
                         WHERE state = 'pending' AND ordering_key IS NULL \
                       UNION ALL \
                       SELECT MIN(COALESCE(run_at, created_at)) FROM jobs \
                         INDEXED BY jobs_pending_due \
                         WHERE state = 'pending' AND COALESCE(run_at, created_at) > ?1 \
                       UNION ALL \
                       SELECT MIN(next_attempt_at) FROM steps INDEXED BY steps_claim_due \
                         WHERE claim_agent IS NOT NULL AND next_attempt_at > ?1 \
                       UNION ALL \
                       SELECT MIN(lease_expires_at) FROM steps INDEXED BY steps_lease_expiry \
                         WHERE lease_expires_at IS NOT NULL \
                       UNION ALL \
                       SELECT MIN(deadline_due) FROM jobs INDEXED BY jobs_deadline_due \
                         WHERE deadline_due IS NOT NULL \
                       UNION ALL \
                       SELECT MIN(next_fire_at) FROM schedules INDEXED BY schedules_due \
                         WHERE paused = 0)",
                )
                .db()?
                .query_row([now.as_millis()], |r| r.get(0))
                .db()?;
            Ok(due.map(Timestamp::from_millis))
        })
        .await
    }
}
