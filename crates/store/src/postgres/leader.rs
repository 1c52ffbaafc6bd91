//! The leader lease and its fence.

use super::tx::Transaction;
use overseer_core::{Span, Timestamp};
use tokio_postgres::Row;

use super::rows::{self, get, query_opt};
use super::{Failure, PgStore, Res};
use crate::{Error, Fence, Leader, LeaderBid, Leadership, Result};

/// Fails with [`Error::Fenced`] unless `fence` is the current, unexpired leader lease at `now`.
/// The row is locked `FOR SHARE` until the transaction ends, so the lease cannot change hands
/// while the fenced write is under way (a takeover waits for it).
pub(super) async fn check_fence(tx: &Transaction<'_>, fence: &Fence, now: Timestamp) -> Res<()> {
    let row = query_opt(
        tx,
        "SELECT 1 FROM leader WHERE id = 1 AND node = $1 AND epoch = $2 AND expires_at > $3 \
         FOR SHARE",
        &[&fence.node, &fence.epoch, &now.as_millis()],
    )
    .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(Failure::Store(Error::Fenced { epoch: fence.epoch })),
    }
}

fn leadership_from_row(row: &Row) -> Res<Leadership> {
    Ok(Leadership {
        node: get(row, 0, "leader.node")?,
        epoch: get(row, 1, "leader.epoch")?,
        expires_at: Timestamp::from_millis(get(row, 2, "leader.expires_at")?),
    })
}

/// One conditional upsert: takes the lease if there is none or it has expired (the epoch moves
/// on), renews it if `node` holds it (same epoch), and otherwise changes nothing.
async fn leader_acquire(
    tx: &Transaction<'_>,
    node: &str,
    ttl: Span,
    now: Timestamp,
) -> Res<Option<Leadership>> {
    let expires_at = now.plus(ttl).as_millis();
    let row = query_opt(
        tx,
        "INSERT INTO leader AS l (id, node, epoch, expires_at) VALUES (1, $1, 1, $3) \
         ON CONFLICT (id) DO UPDATE SET \
           epoch = CASE WHEN l.node = excluded.node AND l.expires_at > $2 \
                        THEN l.epoch ELSE l.epoch + 1 END, \
           node = excluded.node, \
           expires_at = excluded.expires_at \
         WHERE l.expires_at <= $2 OR l.node = excluded.node \
         RETURNING node, epoch, expires_at",
        &[&node, &now.as_millis(), &expires_at],
    )
    .await?;
    row.as_ref().map(leadership_from_row).transpose()
}

async fn leader_get(tx: &Transaction<'_>) -> Res<Option<Leadership>> {
    let row = query_opt(
        tx,
        "SELECT node, epoch, expires_at FROM leader WHERE id = 1",
        &[],
    )
    .await?;
    row.as_ref().map(leadership_from_row).transpose()
}

/// Ends the lease at once if `node` still holds `epoch`: the epoch is kept, so the next leader
/// takes the one after it.
async fn leader_release(tx: &Transaction<'_>, node: &str, epoch: i64) -> Res<()> {
    rows::execute(
        tx,
        "UPDATE leader SET expires_at = 0 WHERE id = 1 AND node = $1 AND epoch = $2",
        &[&node, &epoch],
    )
    .await?;
    Ok(())
}

#[async_trait::async_trait]
impl Leader for PgStore {
    async fn leader_acquire(&self, bid: LeaderBid) -> Result<Option<Leadership>> {
        let bid = &bid;
        self.write(move |tx, _| Box::pin(leader_acquire(tx, &bid.node, bid.ttl, bid.now)))
            .await
    }

    async fn leader_get(&self) -> Result<Option<Leadership>> {
        self.read(|tx, _| Box::pin(leader_get(tx))).await
    }

    async fn leader_release(&self, fence: &Fence) -> Result<()> {
        self.write(move |tx, _| Box::pin(leader_release(tx, &fence.node, fence.epoch)))
            .await
    }
}
