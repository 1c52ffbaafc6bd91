//! Notifications sent after commit, off the committing transaction.
//!
//! A transaction that calls `pg_notify` takes PostgreSQL's notification lock at commit and holds
//! it until its commit record is flushed, so every notifying transaction commits one after the
//! other, each waiting out its own WAL flush: sampled during a drain, committing claims and
//! reports waited on that lock (`Lock:object`) as often as on the flush itself. So a write only
//! collects what it would announce ([`defer`], inside [`scope`]), and once it has committed
//! ([`crate::PgStore`]'s `write`), one task per store sends whatever has gathered in one
//! statement, on a connection of its own whose commits do not wait for a flush
//! (`synchronous_commit = off`: a notification is worth nothing after a crash anyway). Listeners hear of a commit a fraction of
//! a millisecond later than before; a rolled-back write announces nothing, as before. Should a
//! node die between its commit and the send, other nodes find the work by the leader's sweep,
//! as after any lost notification (see `listen`).
//!
//! The sender keeps the backend process id of its connection in [`Origin`], so this node's
//! listener can pass over what the node sent itself: the node has already acted on it (the
//! committed transitions' effects, a claim's siblings signalled in-process), and hearing it again
//! would only send a second claimer after work the first is already taking.

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::listen::CHANNEL;

/// Batches of notifications waiting for the sender: beyond this, new ones are dropped (and the
/// leader's sweep finds their work instead).
const QUEUE: usize = 4_096;
/// Most notifications sent in one statement.
const BATCH_MAX: usize = 4_096;

tokio::task_local! {
    /// What the write running in this task will announce once it commits.
    static PENDING: RefCell<Vec<String>>;
}

/// Adds `payloads` to what the running write announces after its commit. `false` outside a
/// write's [`scope`]: the caller must notify inside its transaction instead.
pub(super) fn defer(payloads: &[&str]) -> bool {
    PENDING
        .try_with(|p| {
            p.borrow_mut()
                .extend(payloads.iter().map(|s| s.to_string()))
        })
        .is_ok()
}

/// Runs one attempt of a write, answering its outcome and what it deferred.
pub(super) async fn scope<F: Future>(attempt: F) -> (F::Output, Vec<String>) {
    PENDING
        .scope(RefCell::new(Vec::new()), async {
            let outcome = attempt.await;
            (outcome, PENDING.with(|p| p.take()))
        })
        .await
}

/// The backend process id of the sender's connection, as PostgreSQL names the sender of each
/// notification (0 until the first send).
#[derive(Clone, Default)]
pub(super) struct Origin(Arc<AtomicI32>);

impl Origin {
    /// Whether a notification from backend `pid` was sent by this store's sender.
    pub(super) fn is_own(&self, pid: i32) -> bool {
        pid != 0 && self.0.load(Ordering::Relaxed) == pid
    }
}

/// The sending task of one store; stopped when dropped.
pub(super) struct Announcer {
    queue: mpsc::Sender<Vec<String>>,
    task: JoinHandle<()>,
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Announcer {
    pub(super) fn spawn(pool: Pool, origin: Origin) -> Announcer {
        let (queue, receiver) = mpsc::channel(QUEUE);
        Announcer {
            queue,
            task: tokio::spawn(run(pool, receiver, origin)),
        }
    }

    /// Hands a committed write's notifications to the sender.
    pub(super) fn send(&self, payloads: Vec<String>) {
        if payloads.is_empty() {
            return;
        }
        if self.queue.try_send(payloads).is_err() {
            tracing::warn!("notifications are queued faster than they are sent; dropped some");
        }
    }
}

async fn run(pool: Pool, mut receiver: mpsc::Receiver<Vec<String>>, origin: Origin) {
    // When the connection whose process id `origin` holds was made.
    let mut known: Option<Instant> = None;
    while let Some(mut batch) = receiver.recv().await {
        while batch.len() < BATCH_MAX {
            match receiver.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        batch.sort_unstable();
        batch.dedup();
        if let Err(e) = send(&pool, &batch, &origin, &mut known).await {
            tracing::warn!(error = %e, "cannot send notifications; other nodes find the work by polling");
        }
    }
}

/// Sends `payloads` in one statement (its own transaction) on the sender's connection, whose
/// session has `synchronous_commit = off`. On a connection it has not used before (the pool
/// replaces one that closed), it also asks for its process id, in the same round trip, and
/// records it in `origin`.
async fn send(
    pool: &Pool,
    payloads: &[String],
    origin: &Origin,
    known: &mut Option<Instant>,
) -> Result<(), String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let made = deadpool_postgres::Object::metrics(&client).created;
    let notify = client
        .prepare_cached("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
        .await
        .map_err(|e| e.to_string())?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&CHANNEL, &payloads];
    if *known == Some(made) {
        client
            .execute(&notify, &params)
            .await
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let pid = client
        .prepare_cached("SELECT pg_backend_pid()")
        .await
        .map_err(|e| e.to_string())?;
    let (pid, _) = futures::try_join!(
        client.query_one(&pid, &[]),
        client.execute(&notify, &params)
    )
    .map_err(|e| e.to_string())?;
    origin.0.store(pid.get(0), Ordering::Relaxed);
    *known = Some(made);
    Ok(())
}
