//! The leader lease and the fence every leader write is checked against.
//!
//! One row (`id = 1`) holds the node, its epoch and the lease's expiry. Taking a free or expired
//! lease bumps the epoch, so a node that paused past its expiry and wakes up carries an epoch
//! that no longer matches: [`check_fence`], run in the transaction of each supervisor write,
//! refuses it before anything is written.

use overseer_core::{Span, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::DbResult;
use super::SqliteStore;
use crate::{Error, Fence, Leader, LeaderBid, Leadership, Result};

/// The stored lease, expired or not.
fn get(conn: &Connection) -> Result<Option<Leadership>> {
    conn.prepare_cached("SELECT node, epoch, expires_at FROM leader WHERE id = 1")
        .db()?
        .query_row([], |r| {
            Ok(Leadership {
                node: r.get(0)?,
                epoch: r.get(1)?,
                expires_at: Timestamp::from_millis(r.get(2)?),
            })
        })
        .optional()
        .db()
}

/// Takes the lease for `node` when there is none or it expired (`expires_at <= now`): epoch + 1,
/// even if `node` held it before it expired. Renews it when `node` holds it unexpired: same
/// epoch, expiry `now + ttl`. Otherwise another node leads: `None`, nothing written.
fn acquire(conn: &Connection, node: &str, ttl: Span, now: Timestamp) -> Result<Option<Leadership>> {
    let expires_at = now.plus(ttl);
    let current = get(conn)?;
    let epoch = match &current {
        None => 1,
        Some(l) if l.expires_at <= now => l.epoch.saturating_add(1),
        Some(l) if l.node == node => l.epoch,
        Some(_) => return Ok(None),
    };
    conn.prepare_cached(
        "INSERT INTO leader (id, node, epoch, expires_at) VALUES (1, ?1, ?2, ?3) \
         ON CONFLICT (id) DO UPDATE SET node = excluded.node, epoch = excluded.epoch, \
         expires_at = excluded.expires_at",
    )
    .db()?
    .execute(params![node, epoch, expires_at.as_millis()])
    .db()?;
    Ok(Some(Leadership {
        node: node.to_string(),
        epoch,
        expires_at,
    }))
}

/// Ends the lease at once (expiry 0, same epoch) if `node` still holds `epoch`; else nothing.
fn release(conn: &Connection, node: &str, epoch: i64) -> Result<()> {
    conn.prepare_cached(
        "UPDATE leader SET expires_at = 0 WHERE id = 1 AND node = ?1 AND epoch = ?2",
    )
    .db()?
    .execute(params![node, epoch])
    .db()?;
    Ok(())
}

/// Refuses with [`Error::Fenced`] (carrying the fence's epoch) unless `fence` is the stored lease
/// and it is unexpired at `now`. Call it first in the write's transaction.
pub(super) fn check_fence(conn: &Connection, fence: &Fence, now: Timestamp) -> Result<()> {
    match get(conn)? {
        Some(l) if l.node == fence.node && l.epoch == fence.epoch && l.expires_at > now => Ok(()),
        _ => Err(Error::Fenced { epoch: fence.epoch }),
    }
}

#[async_trait::async_trait]
impl Leader for SqliteStore {
    async fn leader_acquire(&self, bid: LeaderBid) -> Result<Option<Leadership>> {
        self.write(move |conn| acquire(conn, &bid.node, bid.ttl, bid.now))
            .await
    }

    async fn leader_get(&self) -> Result<Option<Leadership>> {
        self.read(get).await
    }

    async fn leader_release(&self, fence: &Fence) -> Result<()> {
        let fence = fence.clone();
        self.write(move |conn| release(conn, &fence.node, fence.epoch))
            .await
    }
}
