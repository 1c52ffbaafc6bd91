//! Health, the supervisor's next wake-up, and the signals other nodes send (`listen`).

use super::tx::Transaction;
use overseer_core::{JobId, Timestamp};
use tokio::sync::broadcast;

use super::rows::{limit_param, query, query_one};
use super::{job_ids, jobs, PgStore, Res};
use crate::{Maintenance, Prune, Pruned, Result, Signal};

#[async_trait::async_trait]
impl Maintenance for PgStore {
    async fn ping(&self) -> Result<()> {
        self.read(|tx, _| {
            Box::pin(async move {
                query_one(tx, "SELECT 1", &[]).await?;
                Ok(())
            })
        })
        .await
    }

    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>> {
        self.read(move |tx, _| Box::pin(jobs::next_due_at(tx, now)))
            .await
    }

    async fn jobs_prune(&self, prune: Prune) -> Result<Pruned> {
        if prune.limit == 0 {
            return Ok(Pruned::default());
        }
        let ids = self
            .write(move |tx, _| Box::pin(prune_jobs(tx, prune)))
            .await?;
        // Every PostgreSQL connection writes on its own: removal holds no one else back, so it
        // takes its whole batch.
        let more = ids.len() == prune.limit;
        Ok(Pruned { ids, more })
    }

    fn signals(&self) -> Option<broadcast::Receiver<Signal>> {
        Some(self.inner.signals.subscribe())
    }
}

/// Deletes one batch of jobs past their retention with every row that belongs to them, in one
/// statement: one range of `jobs_finished` per terminal state (the core's cutoffs) and one of
/// `jobs_retention_own` choose the batch, oldest first; a job another transaction changed
/// meanwhile is deleted only if its locked row is still finished.
///
/// Each range is read in index order under its own `LIMIT`, so a batch reads as many index
/// entries as it removes. Without the order, the generic plan a pooled connection keeps reads
/// each range as a bitmap, that is the whole backlog due for removal, for every batch: 3.7 ms
/// of a batch of 500 with 100,000 jobs due (1.0 ms in order), and growing with the backlog
/// (EXPLAIN ANALYZE under `plan_cache_mode = force_generic_plan`). The last range says only
/// `finished_at + retention_ms <= $7`, which implies both columns are set (so its partial index
/// serves it): spelling out `retention_ms IS NOT NULL` would let the planner walk the whole of
/// `jobs_finished`, which holds `retention_ms` too, whenever no job has a retention of its own.
const PRUNE_SQL: &str = "WITH doomed AS (SELECT id FROM ( \
       (SELECT id FROM jobs WHERE state = $1 AND finished_at IS NOT NULL \
         AND retention_ms IS NULL AND finished_at <= $2 ORDER BY finished_at LIMIT $8) \
       UNION ALL (SELECT id FROM jobs WHERE state = $3 AND finished_at IS NOT NULL \
         AND retention_ms IS NULL AND finished_at <= $4 ORDER BY finished_at LIMIT $8) \
       UNION ALL (SELECT id FROM jobs WHERE state = $5 AND finished_at IS NOT NULL \
         AND retention_ms IS NULL AND finished_at <= $6 ORDER BY finished_at LIMIT $8) \
       UNION ALL (SELECT id FROM jobs WHERE finished_at + retention_ms <= $7 \
         ORDER BY finished_at + retention_ms LIMIT $8)) c LIMIT $8), \
     gone AS (DELETE FROM jobs WHERE id IN (SELECT id FROM doomed) \
       AND state IN ('succeeded', 'failed', 'cancelled') RETURNING id), \
     l AS (DELETE FROM job_labels WHERE job_id IN (SELECT id FROM gone)), \
     s AS (DELETE FROM steps WHERE job_id IN (SELECT id FROM gone)), \
     e AS (DELETE FROM events WHERE job_id IN (SELECT id FROM gone)), \
     x AS (DELETE FROM leases WHERE job_id IN (SELECT id FROM gone)), \
     d AS (DELETE FROM deliveries WHERE job_id IN (SELECT id FROM gone) \
       AND (dead OR delivered_at IS NOT NULL)) \
     SELECT id FROM gone";

async fn prune_jobs(tx: &Transaction<'_>, prune: Prune) -> Res<Vec<JobId>> {
    let [(s1, c1), (s2, c2), (s3, c3)] = prune.retention.cutoffs(prune.now);
    let rows = query(
        tx,
        PRUNE_SQL,
        &[
            &s1.as_str(),
            &c1.as_millis(),
            &s2.as_str(),
            &c2.as_millis(),
            &s3.as_str(),
            &c3.as_millis(),
            &prune.now.as_millis(),
            &limit_param(prune.limit),
        ],
    )
    .await?;
    job_ids(&rows, "jobs.id")
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::PRUNE_SQL;
    use crate::pgtest::{connect, generic_plan, store_with_ready_steps};

    // Proves removal reads only the index entries of the jobs it removes under the plan a
    // pooled connection keeps: the unordered ranges were planned as bitmap scans, which read
    // every entry due before a `LIMIT` applies, and the range of jobs with a retention of their
    // own must come from their own index, never from a walk of all of `jobs_finished` (which
    // holds `retention_ms` too). Checked with no job that has its own retention, and with some.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn removal_stops_at_its_batch_under_a_generic_plan() {
        let (db, store) = store_with_ready_steps(5_000).await;
        let client = connect(db.url()).await.expect("connect");
        let backlogs = [
            "UPDATE jobs SET state = 'succeeded', finished_at = 1; ANALYZE jobs",
            "UPDATE jobs SET retention_ms = 1000 WHERE seq % 50 = 0; ANALYZE jobs",
        ];
        for backlog in backlogs {
            client
                .batch_execute(backlog)
                .await
                .expect("finish the jobs");
            let plan = generic_plan(&client, PRUNE_SQL, 8).await;
            assert!(
                plan.matches("Index Scan using jobs_finished on jobs")
                    .count()
                    == 3
                    && plan.matches("Index Cond: ((state = $").count() == 3
                    && plan.contains("Index Scan using jobs_retention_own on jobs")
                    && !plan.contains("Bitmap Index Scan"),
                "removal reads whole ranges of an index after `{backlog}`:\n{plan}"
            );
        }
        drop(store);
    }
}
