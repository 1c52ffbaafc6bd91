//! The single writer thread and its group commit.
//!
//! SQLite allows one writer at a time and a durable commit costs an fsync, so instead of many
//! connections queueing on the write lock, every write is a closure sent to one thread that owns
//! the write connection. The thread takes whatever is queued (up to a bound), runs it all in one
//! transaction with a savepoint per write, commits once, and hands the batch to the log syncer
//! (`syncer`), which fsyncs the log and only then answers each caller: many writes share one
//! fsync, the writer runs the next batch while the disk flushes the last, and no caller hears
//! "done" before its data is on disk.
//!
//! Upkeep that may take a while (removing jobs past their retention) is a *background* write: it
//! runs in a transaction of its own after the writes taken with it have been committed, works in
//! small pieces, and stops between two pieces as soon as another write is waiting
//! ([`Pressure`]). It is answered without waiting for a sync (see [`run_upkeep`]), so a claim
//! queued behind it waits for one piece and a commit, then goes in the next batch as usual. Its
//! commit never overlaps a sync of the log, and its pages go to the disk right after it, so the
//! sync the next claims wait for is not slowed by them.
//! (When upkeep shared the transaction of the writes taken with it, they waited for all of it:
//! in the `steady` benchmark, such writes waited 1.9 ms at the median and 6 ms at p99, against
//! 0.4 and 1.9 ms for the rest.)

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::syncer::{Committed, Durability, Syncer, BROKEN};
use crate::{Error, Result};

/// How often the writer looks again at a lock another connection holds.
const BUSY_STEP: Duration = Duration::from_micros(100);

thread_local! {
    /// How long this thread's connection keeps looking at a lock (the store's busy timeout on
    /// the writer, the restart's wait on the checkpointer); set by [`poll_locks`].
    static BUSY_FOR: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
}

/// The busy handler of the writer and the checkpointer: looks again every [`BUSY_STEP`] until
/// the thread's wait is over. SQLite's own handler sleeps 1, 2, 5, 10, 15, 20 ms … between
/// looks, so a lock the checkpointer held for a millisecond or two (a WAL restart) cost a
/// `BEGIN` 3, 8, 18, 33 or 53 ms: measured in the `steady` benchmark while a backlog was
/// removed, once a second, the whole tail of claims. (For the checkpointer, see
/// `checkpoint::Checkpointer::start`.)
fn busy(retries: i32) -> bool {
    let waited = BUSY_STEP * u32::try_from(retries).unwrap_or(u32::MAX);
    if waited >= BUSY_FOR.get() {
        return false;
    }
    std::thread::sleep(BUSY_STEP);
    true
}

/// How long the writer waits for a lock another connection holds (on the writer's thread).
pub(super) fn busy_timeout() -> Duration {
    BUSY_FOR.get()
}

/// Makes `conn`, used on this thread, look at a lock another connection holds every
/// [`BUSY_STEP`] for up to `wait`.
pub(super) fn poll_locks(conn: &Connection, wait: Duration) -> rusqlite::Result<()> {
    BUSY_FOR.set(wait);
    conn.busy_handler(Some(busy))
}

/// One queued write, type-erased so writes with different answers share a queue.
pub(super) trait WriteOp: Send {
    /// Runs the write inside its savepoint. `false` means it failed and its savepoint must be
    /// rolled back; its error is kept for [`WriteOp::answer`].
    fn run(&mut self, conn: &Connection) -> bool;

    /// Answers the caller once the batch's fate is known: `Err` when the batch was not committed.
    fn answer(self: Box<Self>, committed: Result<(), String>);

    /// Whether this is upkeep that yields to other writes (see the module's documentation).
    fn is_background(&self) -> bool;
}

pub(super) type Queue = mpsc::Sender<Box<dyn WriteOp>>;

/// Whether writes are waiting for the writer: a background write stops at its next piece. Read
/// off the queue itself (its permits in use), so there is no count to keep in step.
pub(super) struct Pressure(mpsc::WeakSender<Box<dyn WriteOp>>);

impl Pressure {
    pub(super) fn of(queue: &Queue) -> Pressure {
        Pressure(queue.downgrade())
    }

    pub(super) fn others_waiting(&self) -> bool {
        self.0
            .upgrade()
            .is_some_and(|queue| queue.capacity() < queue.max_capacity())
    }
}

/// Adds whatever is queued to `batch`, up to `max` writes in all.
fn fill(
    queue: &mut mpsc::Receiver<Box<dyn WriteOp>>,
    batch: &mut Vec<Box<dyn WriteOp>>,
    max: usize,
) {
    while batch.len() < max {
        match queue.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
}

struct Op<T, F> {
    work: Option<F>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
    background: bool,
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

    fn is_background(&self) -> bool {
        self.background
    }
}

/// Queues `work` for the writer and waits until its batch is committed. A `background` write is
/// upkeep that checks its [`Pressure`] between its pieces and stops when others wait.
pub(super) async fn submit<T, F>(queue: &Queue, background: bool, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&Connection) -> Result<T> + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let op = Op {
        work: Some(work),
        result: None,
        reply,
        background,
    };
    queue
        .send(Box::new(op))
        .await
        .map_err(|_| Error::Unavailable("the store's writer has stopped".into()))?;
    answer
        .await
        .map_err(|_| Error::Unavailable("the store's writer stopped before answering".into()))?
}

/// The writer thread's loop: runs until every sender is gone (or the log cannot be synced any
/// more), then closes the connection. Each foreground batch is committed and handed to the
/// [`Syncer`], which answers its callers once the commit is on disk; the writer goes straight on
/// to the next batch.
///
/// With fault injection compiled in, `abort_after_commit` is the flag a write raises to have the
/// process abort as soon as its batch is committed, before any caller hears back.
pub(super) fn run(
    conn: Connection,
    mut queue: mpsc::Receiver<Box<dyn WriteOp>>,
    log: Log,
    max_batch: usize,
    busy_timeout: Duration,
    #[cfg(feature = "fault-injection")] abort_after_commit: Option<
        Arc<std::sync::atomic::AtomicBool>,
    >,
) {
    super::written::enable();
    if let Err(e) = poll_locks(&conn, busy_timeout) {
        tracing::warn!(error = %e, "cannot set the writer's busy handler; SQLite's own is used");
    }
    let mut batch: Vec<Box<dyn WriteOp>> = Vec::with_capacity(max_batch);
    while let Some(first) = queue.blocking_recv() {
        batch.push(first);
        fill(&mut queue, &mut batch, max_batch);
        if log.durability.is_broken() {
            // Nothing committed from now on could be acknowledged.
            for op in batch.drain(..) {
                op.answer(Err(BROKEN.into()));
            }
            break;
        }
        // Upkeep gets a transaction of its own after the writes that came with it: in theirs,
        // they would wait for all of it, not just one piece (their commit comes after it).
        let upkeep: Vec<Box<dyn WriteOp>> = batch.extract_if(.., |op| op.is_background()).collect();
        if !batch.is_empty() {
            let mut number = 0;
            let outcome = run_batch(&conn, &mut batch, || {
                number = log.durability.begin_commit();
            });
            if outcome.is_ok() {
                log.commits.fetch_add(1, Ordering::Relaxed);
            }
            #[cfg(feature = "fault-injection")]
            if let Some(flag) = abort_after_commit.as_deref() {
                super::fault::abort_if_raised(flag, outcome.is_ok());
            }
            log.syncer.send(Committed {
                number,
                ops: std::mem::replace(&mut batch, Vec::with_capacity(max_batch)),
                outcome,
            });
        }
        if !upkeep.is_empty() {
            run_upkeep(&conn, upkeep, &log);
        }
    }
    drop(log);
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the SQLite write connection failed");
    }
}

/// Where the writer's commits go: counted (the checkpointer looks for new ones), and handed to
/// the syncer to be made durable and answered.
pub(super) struct Log {
    /// The database's `-wal` file.
    pub(super) wal: std::path::PathBuf,
    pub(super) commits: Arc<AtomicU64>,
    pub(super) durability: Arc<Durability>,
    pub(super) syncer: Syncer,
}

/// Runs upkeep in a transaction of its own and answers it at once, without waiting for a sync:
/// upkeep lost in a crash is simply done again, and the next sync of any other write makes the
/// log durable up to and including it. Nothing else ever shares this transaction, so a write
/// queued meanwhile waits for one piece of upkeep and a commit, then goes in the next batch.
///
/// Its commit takes its turn with the syncer ([`Durability::turn`]) and hands its pages to the
/// disk before the turn ends ([`writeback`]), so that the next sync, which the claims after it
/// wait for, finds them written.
///
/// [`Durability::turn`]: super::syncer::Durability::turn
/// [`writeback`]: super::writeback
fn run_upkeep(conn: &Connection, mut batch: Vec<Box<dyn WriteOp>>, log: &Log) {
    let mut turn = None;
    let outcome = run_batch(conn, &mut batch, || turn = Some(log.durability.turn()));
    if outcome.is_ok() {
        log.commits.fetch_add(1, Ordering::Relaxed);
        super::writeback::start(&log.wal);
    }
    drop(turn);
    for op in batch {
        op.answer(outcome.clone());
    }
}

/// Runs a batch in one transaction, calling `before_commit` right before its `COMMIT`. `Err`
/// means nothing of it is committed.
fn run_batch(
    conn: &Connection,
    batch: &mut [Box<dyn WriteOp>],
    before_commit: impl FnOnce(),
) -> Result<(), String> {
    if let Err(e) = exec_cached(conn, "BEGIN IMMEDIATE") {
        return Err(format!("cannot begin a transaction: {e}"));
    }
    let result = run_ops(conn, batch).and_then(|()| {
        before_commit();
        exec_cached(conn, "COMMIT").map_err(|e| format!("commit failed: {e}"))
    });
    if result.is_err() {
        // Whatever the batch stored in the writer's cache was never committed.
        super::written::forget_all();
    }
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
            // What the failed write stored in the writer's cache is rolled back with it.
            super::written::forget_all();
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
