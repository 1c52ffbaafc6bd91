//! The checkpointer: copies committed WAL frames back into the database file, on its own thread
//! and connection, so the single writer never stalls on it.
//!
//! With `wal_autocheckpoint` on, SQLite runs a checkpoint inside whichever commit pushes the WAL
//! past its threshold: on the writer thread, holding up every write queued behind it while it
//! copies pages and fsyncs the file (3–5 % of the writer's time in a drain profile, plus the
//! fsync it waited out). A `PASSIVE` checkpoint from another connection does the same work
//! without taking the write lock, so it runs beside the writer. Durability does not depend on
//! it: a commit is durable once its WAL frames are fsync'd; checkpointing only bounds the WAL.
//!
//! A passive checkpoint alone does not bound the WAL's *file*, though. SQLite starts writing at
//! the beginning of the WAL again only when a commit finds every frame copied back, and under a
//! steady load new frames always arrive while a checkpoint runs: the file grew by 15 MB a second
//! at 300 jobs/s in the `steady` benchmark and never shrank. So once the WAL holds more than
//! [`RESTART_FRAMES`], the checkpointer asks for a `RESTART` checkpoint: it waits for the write
//! lock between two group commits, copies the few frames the last passive round left, and makes
//! the next commit start the WAL over. The writer waits for that short copy only, the file stays
//! within about that size, and `journal_size_limit` (set on the writer) cuts a WAL that once grew
//! larger back down when it restarts.

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
/// WAL frames (pages) beyond which the WAL is restarted: 16,384 × 4 KiB pages = 64 MiB.
const RESTART_FRAMES: i64 = 16_384;
/// The longest a restart waits for the write lock and for readers of old frames.
const RESTART_WAIT: Duration = Duration::from_millis(10);
/// What the writer's WAL is cut back to when it restarts after having grown past that.
pub(super) const WAL_SIZE_LIMIT: i64 = 96 * 1024 * 1024;

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
        // Only a restart ever waits (a passive checkpoint never does), and it should not wait
        // long: while it holds the write lock the writer queues behind it. Gone past this, it
        // gives up and tries again on a later round, between other commits.
        conn.busy_timeout(busy_timeout.min(RESTART_WAIT)).db()?;
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
        let frames = match checkpoint(&conn, "PASSIVE") {
            Ok(frames) => frames,
            Err(e) => {
                tracing::warn!(error = %e, "a WAL checkpoint failed; trying again later");
                continue;
            }
        };
        if frames > RESTART_FRAMES {
            if let Err(e) = checkpoint(&conn, "RESTART") {
                tracing::warn!(error = %e, frames, "restarting the WAL failed; trying again later");
            }
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite checkpoint connection failed");
    }
}

/// Runs one checkpoint of `mode`; answers how many frames the WAL held. Busy (a reader pins old
/// frames, the writer kept its lock past the busy timeout) is not an error: the frames are
/// copied, or the WAL restarted, on a later round.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| r.get(1))
}
