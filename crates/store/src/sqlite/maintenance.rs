//! Health, the supervisor's next wake-up, and removing finished jobs past their retention.

use overseer_core::{JobId, Timestamp};
use rusqlite::{params, Connection};

use super::removal::delete_rows_of;
use super::rows::{self, limit_param, DbResult};
use super::writer::Pressure;
use super::SqliteStore;
use crate::{Error, Maintenance, Prune, Pruned, Result};

/// Jobs removed between two looks at the writer's queue: one piece of a removal write, what a
/// claim may wait behind (about 0.2 ms). Pieces of 16 held claims' p99 at 2.9 ms while a
/// backlog was removed, pieces of 4 at 2.5 ms (`steady` benchmark, BENCHMARKS.md).
const PRUNE_PIECE: usize = super::removal::ROWS_OF_AT_ONCE;

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

    async fn jobs_prune(&self, prune: Prune) -> Result<Pruned> {
        if prune.limit == 0 {
            return Ok(Pruned::default());
        }
        self.write_background(move |conn, pressure| prune_jobs(conn, &prune, pressure))
            .await
    }

    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>> {
        self.read(move |conn| {
            // Past instants count only where the leader's sweep clears them: a pending job
            // without a key, an expired lease, a schedule's due time. A keyed job waiting behind
            // its head, or a retry already due, counts only while still in the future, or the
            // supervisor would wake again at once for something it cannot act on.
            let due: Option<i64> = conn
                .prepare_cached(concat!(
                    leasing_agents!(),
                    "SELECT MIN(t) FROM ( \
                       SELECT MIN(run_at) AS t FROM jobs INDEXED BY jobs_pending_unkeyed \
                         WHERE state = 'pending' AND ordering_key IS NULL \
                       UNION ALL \
                       SELECT MIN(COALESCE(run_at, created_at)) FROM jobs \
                         INDEXED BY jobs_pending_due \
                         WHERE state = 'pending' AND COALESCE(run_at, created_at) > ?1 \
                       UNION ALL \
                       SELECT MIN(next_attempt_at) FROM steps INDEXED BY steps_claim_due \
                         WHERE claim_agent IS NOT NULL AND next_attempt_at > ready_at \
                           AND next_attempt_at > ?1 \
                       UNION ALL \
                       SELECT MIN(( \
                         SELECT lease_expires_at FROM steps INDEXED BY steps_lease_expiry \
                         WHERE lease_agent = leasing.agent AND lease_expires_at IS NOT NULL \
                         ORDER BY lease_expires_at LIMIT 1)) \
                         FROM leasing WHERE agent IS NOT NULL \
                       UNION ALL \
                       SELECT MIN(deadline_due) FROM jobs INDEXED BY jobs_deadline_due \
                         WHERE deadline_due IS NOT NULL \
                       UNION ALL \
                       SELECT MIN(next_fire_at) FROM schedules INDEXED BY schedules_due \
                         WHERE paused = 0)",
                ))
                .db()?
                .query_row([now.as_millis()], |r| r.get(0))
                .db()?;
            Ok(due.map(Timestamp::from_millis))
        })
        .await
    }
}

/// Deletes up to `prune.limit` jobs past their retention, [`PRUNE_PIECE`] at a time, stopping
/// early once other writes wait for the writer (they go next: see `writer`).
fn prune_jobs(conn: &Connection, prune: &Prune, pressure: &Pressure) -> Result<Pruned> {
    let mut out = Pruned::default();
    while out.ids.len() < prune.limit {
        let want = PRUNE_PIECE.min(prune.limit - out.ids.len());
        let piece = prune_piece(conn, prune, want)?;
        let full = piece.len() == want;
        out.ids.extend(piece);
        out.more = full;
        if !full || pressure.others_waiting() {
            break;
        }
    }
    Ok(out)
}

/// Deletes up to `limit` jobs past their retention: one range of `jobs_finished` per terminal
/// state (the core's cutoffs) and one of `jobs_retention_own`; then the jobs' steps, labels,
/// history, leases and settled deliveries, a few jobs per statement ([`delete_rows_of`]).
fn prune_piece(conn: &Connection, prune: &Prune, limit: usize) -> Result<Vec<JobId>> {
    let [(s1, c1), (s2, c2), (s3, c3)] = prune.retention.cutoffs(prune.now);
    let arm = "SELECT id FROM jobs INDEXED BY jobs_finished WHERE state = ? AND \
               finished_at IS NOT NULL AND retention_ms IS NULL AND finished_at <= ?";
    let sql = format!(
        "DELETE FROM jobs WHERE id IN (SELECT id FROM ({arm} UNION ALL {arm} UNION ALL {arm} \
         UNION ALL SELECT id FROM jobs INDEXED BY jobs_retention_own \
           WHERE finished_at IS NOT NULL AND retention_ms IS NOT NULL \
             AND finished_at + retention_ms <= ? \
             AND state IN ('succeeded', 'failed', 'cancelled')) LIMIT ?) \
         AND state IN ('succeeded', 'failed', 'cancelled') RETURNING id"
    );
    let ids: Vec<String> = conn
        .prepare_cached(&sql)
        .db()?
        .query_map(
            params![
                s1.as_str(),
                c1.as_millis(),
                s2.as_str(),
                c2.as_millis(),
                s3.as_str(),
                c3.as_millis(),
                prune.now.as_millis(),
                limit_param(limit)
            ],
            |r| r.get(0),
        )
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()?;
    let texts: Vec<&str> = ids.iter().map(String::as_str).collect();
    delete_rows_of(conn, &texts, true)?;
    let mut out = Vec::with_capacity(ids.len());
    for id in &ids {
        let id = rows::job_id(id)?;
        super::written::forget(id);
        out.push(id);
    }
    Ok(out)
}
