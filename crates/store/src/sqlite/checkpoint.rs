//! The checkpointer: copies committed WAL frames back into the database file, on its own thread
//! and connection, so the single writer never stalls on it.
//!
//! With `wal_autocheckpoint` on, SQLite runs a checkpoint inside whichever commit pushes the WAL
//! past its threshold: on the writer thread, holding up every write queued behind it while it
//! copies pages and fsyncs the file (3–5 % of the writer's time in a drain profile, plus the
//! fsync it waited out). A `PASSIVE` checkpoint from another connection does the same work
//! without taking the write lock, so it runs beside the writer. Durability does not depend on
//! it: a commit is durable once its WAL frames are fsync'd; checkpointing only bounds the WAL.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::rows::DbResult;
use crate::{Error, Result};

/// How often the checkpointer looks for new commits.
const INTERVAL: Duration = Duration::from_millis(100);

pub(super) struct Checkpointer {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens its connection and starts the thread; `commits` is the writer's commit counter.
    pub(super) fn start(
        path: &Path,
        busy_timeout: Duration,
        commits: Arc<AtomicU64>,
    ) -> Result<Checkpointer> {
        let conn = Connection::open(path).db()?;
        conn.busy_timeout(busy_timeout).db()?;
        // The checkpoint's own fsync of the database file follows this connection's setting.
        conn.pragma_update(None, "synchronous", "FULL").db()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("overseer-sqlite-checkpoint".into())
            .spawn(move || run(conn, &flag, &commits))
            .map_err(|e| Error::Unavailable(format!("cannot start the checkpoint thread: {e}")))?;
        Ok(Checkpointer {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.handle.take() {
            handle.thread().unpark();
            if handle.join().is_err() {
                tracing::error!("the SQLite checkpoint thread panicked");
            }
        }
    }
}

fn run(conn: Connection, stop: &AtomicBool, commits: &AtomicU64) {
    let mut seen = commits.load(Ordering::Relaxed);
    while !stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(INTERVAL);
        let now = commits.load(Ordering::Relaxed);
        if now == seen {
            continue;
        }
        seen = now;
        // Busy (a reader pins old frames, another process checkpoints) is not an error: the
        // frames are copied on a later round.
        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(error = %e, "a WAL checkpoint failed; trying again later");
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite checkpoint connection failed");
    }
}
