//! The single writer thread and its group commit.
//!
//! SQLite allows one writer at a time and a durable commit costs an fsync, so instead of many
//! connections queueing on the write lock, every write is a closure sent to one thread that owns
//! the write connection. The thread takes whatever is queued (up to a bound), runs it all in one
//! transaction with a savepoint per write, commits once, and only then answers each caller: many
//! writes share one fsync, and no caller hears "done" before its data is on disk.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::{Error, Result};

/// One queued write, type-erased so writes with different answers share a queue.
pub(super) trait WriteOp: Send {
    /// Runs the write inside its savepoint. `false` means it failed and its savepoint must be
    /// rolled back; its error is kept for [`WriteOp::answer`].
    fn run(&mut self, conn: &Connection) -> bool;

    /// Answers the caller once the batch's fate is known: `Err` when the batch was not committed.
    fn answer(self: Box<Self>, committed: Result<(), String>);
}

pub(super) type Queue = mpsc::Sender<Box<dyn WriteOp>>;

struct Op<T, F> {
    work: Option<F>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> WriteOp for Op<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T> + Send + 'static,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        // A panic in one write must not kill the thread every other write depends on.
        let result = catch_unwind(AssertUnwindSafe(|| work(conn))).unwrap_or_else(|_| {
            Err(Error::Unavailable(
                "a write panicked inside the store".into(),
            ))
        });
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn answer(self: Box<Self>, committed: Result<(), String>) {
        let answer = match committed {
            Ok(()) => self
                .result
                .unwrap_or_else(|| Err(Error::Unavailable("the write was never run".into()))),
            Err(why) => Err(Error::Unavailable(why)),
        };
        // The caller may have stopped waiting; its write stands either way.
        let _ = self.reply.send(answer);
    }
}

/// Queues `work` for the writer and waits until its batch is committed.
pub(super) async fn submit<T, F>(queue: &Queue, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let op = Op {
        work: Some(work),
        result: None,
        reply,
    };
    queue
        .send(Box::new(op))
        .await
        .map_err(|_| Error::Unavailable("the store's writer has stopped".into()))?;
    answer
        .await
        .map_err(|_| Error::Unavailable("the store's writer stopped before answering".into()))?
}

/// The writer thread's loop: runs until every sender is gone, then closes the connection.
///
/// With fault injection compiled in, `abort_after_commit` is the flag a write raises to have the
/// process abort as soon as its batch is committed, before any caller hears back.
pub(super) fn run(
    mut conn: Connection,
    mut queue: mpsc::Receiver<Box<dyn WriteOp>>,
    commits: Arc<AtomicU64>,
    max_batch: usize,
    #[cfg(feature = "fault-injection")] abort_after_commit: Option<
        Arc<std::sync::atomic::AtomicBool>,
    >,
) {
    let mut batch: Vec<Box<dyn WriteOp>> = Vec::with_capacity(max_batch);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let outcome = run_batch(&mut conn, &mut batch);
        if outcome.is_ok() {
            commits.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "fault-injection")]
        if let Some(flag) = &abort_after_commit {
            super::fault::abort_if_raised(flag, outcome.is_ok());
        }
        for op in batch.drain(..) {
            op.answer(outcome.clone());
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite write connection failed");
    }
}

/// Runs a batch in one transaction. `Err` means nothing of it is committed.
fn run_batch(conn: &mut Connection, batch: &mut [Box<dyn WriteOp>]) -> Result<(), String> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        return Err(format!("cannot begin a transaction: {e}"));
    }
    let result = run_ops(conn, batch).and_then(|()| {
        conn.execute_batch("COMMIT")
            .map_err(|e| format!("commit failed: {e}"))
    });
    if result.is_err() && !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::warn!(error = %e, "rolling back a failed batch failed");
        }
    }
    if let Err(e) = &result {
        tracing::warn!(error = %e, ops = batch.len(), "a write batch was not committed");
    }
    result
}

fn run_ops(conn: &Connection, batch: &mut [Box<dyn WriteOp>]) -> Result<(), String> {
    for op in batch.iter_mut() {
        exec_cached(conn, "SAVEPOINT op").map_err(|e| format!("cannot open a savepoint: {e}"))?;
        let ok = op.run(conn);
        // Some errors (disk full, I/O) make SQLite abandon the whole transaction; what follows
        // would then run outside it, so the batch as a whole has failed.
        if conn.is_autocommit() {
            return Err("the transaction was aborted by the database".into());
        }
        let end = if ok {
            exec_cached(conn, "RELEASE op")
        } else {
            exec_cached(conn, "ROLLBACK TO op").and_then(|()| exec_cached(conn, "RELEASE op"))
        };
        end.map_err(|e| format!("cannot close a savepoint: {e}"))?;
    }
    Ok(())
}

/// Runs a parameterless statement through the connection's statement cache: the savepoint
/// statements run twice per write, and parsing them each time showed in profiles.
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}
