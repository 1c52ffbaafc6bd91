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
//! lock between two group commits, copies the frames the last passive round left, fsyncs the
//! file, and makes the next commit start the WAL over. The writer waits for all of that, so the
//! checkpointer first runs passive rounds back to back until fewer than [`RESTART_LEFT`] frames
//! are left to copy, as long as each round halves what is left: a restart that followed one
//! passive round of a busy WAL held the writer 4–38 ms (measured while a backlog was removed),
//! the tail of every claim behind it. It also flushes the database file first, outside any lock
//! ([`flush`]), so the restart's own fsync has little left to write. The file
//! stays within about [`RESTART_FRAMES`], and `journal_size_limit` (set on the writer) cuts a WAL
//! that once grew larger back down when it restarts.

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
/// Frames a restart may find left to copy while it holds the write lock (1 MiB).
const RESTART_LEFT: i64 = 256;
/// Passive rounds run back to back before a restart, at most.
const CATCH_UP_ROUNDS: usize = 8;
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
        // gives up and tries again on a later round, between other commits. It looks at the
        // locks as often as the writer does: with SQLite's own handler (sleeps of 1, 2 and 5 ms)
        // a restart under a steady load often looked only while the writer held its lock, and
        // gave up, or, holding the write lock, slept out a reader long gone. Measured in
        // `steady` at 2,000 jobs/s while removing: 21 and 25 of about 195 restarts in 3 minutes
        // gave up, and the others held on for 2.8 ms at the median and 13 ms at p90; polling,
        // none gave up, and 1.9–2.1 ms and 8.2–10.8 ms.
        let wait = busy_timeout.min(RESTART_WAIT);
        // The checkpoint's own fsync of the database file follows this connection's setting.
        conn.pragma_update(None, "synchronous", "FULL").db()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let db = path.to_path_buf();
        let handle = std::thread::Builder::new()
            .name("overseer-sqlite-checkpoint".into())
            .spawn(move || {
                if let Err(e) = super::writer::poll_locks(&conn, wait) {
                    tracing::warn!(error = %e, "cannot set the checkpointer's busy handler");
                }
                run(conn, &db, &flag, &commits)
            })
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

fn run(conn: Connection, db: &Path, stop: &AtomicBool, commits: &AtomicU64) {
    let mut seen = commits.load(Ordering::Relaxed);
    while !stop.load(Ordering::SeqCst) {
        std::thread::park_timeout(INTERVAL);
        let now = commits.load(Ordering::Relaxed);
        if now == seen {
            continue;
        }
        seen = now;
        match round(&conn, db, RESTART_FRAMES) {
            Ok(Round::RestartGaveUp) => {
                tracing::debug!("a WAL restart gave up; trying again later")
            }
            Ok(Round::Copied | Round::Restarted) => {}
            Err(e) => tracing::warn!(error = %e, "a WAL checkpoint failed; trying again later"),
        }
    }
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite checkpoint connection failed");
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Passive checkpoints only: the WAL was small enough.
    Copied,
    /// The WAL was restarted: the next commit writes from its start.
    Restarted,
    /// A restart was asked for, but the writer or a reader kept it busy past its wait.
    RestartGaveUp,
}

/// One round: a passive checkpoint, and once the WAL holds more than `restart_frames`, more
/// passive ones until little is left to copy, the database file flushed, then a restart.
fn round(conn: &Connection, db: &Path, restart_frames: i64) -> rusqlite::Result<Round> {
    let mut wal = checkpoint(conn, "PASSIVE")?;
    if wal.frames <= restart_frames {
        return Ok(Round::Copied);
    }
    for _ in 0..CATCH_UP_ROUNDS {
        if wal.left() < RESTART_LEFT {
            break;
        }
        let next = checkpoint(conn, "PASSIVE")?;
        // A writer faster than the copy (a burst of batch submits) leaves as much each round:
        // more rounds would only add fsyncs of the database file beside its commits.
        let converging = next.left() < wal.left() / 2;
        wal = next;
        if !converging {
            break;
        }
    }
    flush(db);
    let restart = checkpoint(conn, "RESTART")?;
    Ok(if restart.busy {
        Round::RestartGaveUp
    } else {
        Round::Restarted
    })
}

/// Flushes the database file to disk without holding any lock of SQLite's.
///
/// A passive checkpoint fsyncs the database file only when it has copied the whole WAL, which a
/// checkpoint beside a busy writer never does: new frames arrive while it copies. So every page
/// the passive rounds copied since the last restart stayed unflushed, and the restart's own
/// fsync, taken while it holds the write lock, flushed them all: about a second of copies. In
/// the `steady` benchmark at 2,000 jobs/s while removing, the writer's waits for a restart
/// reached 10.6–15.4 ms at p99 (of waits over 0.1 ms) and 13–39 ms at most; flushed here first,
/// 3.1–3.3 ms and under 5 ms. The restart's fsync is left only the pages it copies itself. A
/// failure is only logged: the restart's own fsync still runs and answers for durability.
fn flush(db: &Path) {
    if let Err(e) = std::fs::File::open(db).and_then(|file| file.sync_data()) {
        tracing::warn!(error = %e, "cannot flush the database file before a WAL restart");
    }
}

/// What a checkpoint reports of the WAL.
struct Wal {
    /// Whether the checkpoint gave up waiting for a lock before it was done.
    busy: bool,
    /// Frames in the WAL.
    frames: i64,
    /// Frames copied back into the database file.
    copied: i64,
}

impl Wal {
    fn left(&self) -> i64 {
        self.frames - self.copied
    }
}

/// Runs one checkpoint of `mode`. Busy (a reader pins old frames, the writer kept its lock past
/// the busy timeout) is not an error: the frames are copied, or the WAL restarted, on a later
/// round.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<Wal> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok(Wal {
            busy: r.get::<_, i64>(0)? != 0,
            frames: r.get(1)?,
            copied: r.get(2)?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    // Proves the checkpointer starts the WAL over beside a writer that never stops, which is
    // what bounds it: passive checkpoints alone do not, in general (each copies what was there
    // when it began, and more has come by then; in a release build this writer never lets one
    // finish). It counts the rounds' own restarts, and sees each take effect as the WAL's frame
    // count going down, rather than timing them: a slow or loaded machine only makes it run
    // longer.
    #[test]
    fn a_wal_under_a_steady_writer_starts_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.db");
        let writer = Connection::open(&path).expect("open");
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; \
                 PRAGMA synchronous = OFF; CREATE TABLE t (x BLOB);",
            )
            .expect("setup");
        writer
            .busy_timeout(Duration::from_secs(5))
            .expect("timeout");
        let checkpointer = Connection::open(&path).expect("open");
        crate::sqlite::writer::poll_locks(&checkpointer, RESTART_WAIT).expect("busy handler");
        let stop = Arc::new(AtomicBool::new(false));
        let writing = std::thread::spawn({
            let stop = stop.clone();
            move || {
                while !stop.load(Ordering::SeqCst) {
                    writer
                        .execute("INSERT INTO t VALUES (zeroblob(3000))", [])
                        .expect("insert");
                }
            }
        });
        let (mut restarts, mut gave_up, mut started_over, mut last) = (0, 0, 0, 0);
        let start = Instant::now();
        while (restarts < 5 || started_over < 5) && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
            match round(&checkpointer, &path, 64).expect("a round") {
                Round::Copied => {}
                Round::Restarted => restarts += 1,
                Round::RestartGaveUp => gave_up += 1,
            }
            let frames = checkpoint(&checkpointer, "PASSIVE").expect("a look").frames;
            if frames < last {
                started_over += 1;
            }
            last = frames;
        }
        stop.store(true, Ordering::SeqCst);
        writing.join().expect("the writer");
        assert!(
            restarts >= 5 && started_over >= 5,
            "in 60 s: {restarts} restarts ({gave_up} gave up), the WAL started over {started_over} times"
        );
    }
}
