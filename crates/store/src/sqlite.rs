//! The SQLite backend: one file, one writer thread with group commit, a few readers.
//!
//! Writes go to a single thread that owns the write connection (the `writer` module); it commits
//! whatever is queued in one transaction, so concurrent requests share an fsync. Reads run on a
//! small pool of read-only connections beside it (WAL lets them see the last commit without
//! waiting for the writer). What a write does to a job is decided by `overseer_core::apply`; this
//! module only finds rows, loads jobs, and stores the transitions the core returns, together with
//! the deliveries (alerts, callbacks) their durable effects call for, in the same transaction.
//!
//! Claimable and leased steps are found through columns derived from each step as it is written
//! (`claim_agent`, `lease_agent`, and the core's `lease_expires_at`), so work and undo are found
//! alike without decoding a step; see the schema's second migration. The third adds the claim
//! order (`claim_rank`), submission order for ordering keys (`seq`), agent limits, the leader
//! lease and cron schedules.
//!
//! Each part of the `Store` trait is implemented in the module of its noun (`jobs`, `leases`,
//! `agents`, `schedules`, `leader`, `deliveries`, `tokens`, `maintenance`), as in the PostgreSQL
//! backend; `ordering`, `removal` and `rerun` serve `jobs`. Every supervisor write is checked against the
//! leader lease in its own transaction (`leader::check_fence`).

/// The condition "the job in column `$state` is unfinished", spelled as the partial index
/// `jobs_ordering_key` spells it (a query uses a partial index only if its WHERE clause repeats
/// the index's condition). Three comparisons, not `NOT IN (…)`: SQLite evaluates an `IN` list
/// by building a temporary index of it on each execution, and every insert and update of a job
/// row evaluates the index's condition (see migration 0015).
macro_rules! unfinished {
    ($state:literal) => {
        concat!(
            $state,
            " <> 'succeeded' AND ",
            $state,
            " <> 'failed' AND ",
            $state,
            " <> 'cancelled'"
        )
    };
}

/// `leasing (agent)`: the agents holding live leases, as the start of a `WITH RECURSIVE`, one
/// probe of `steps_lease_expiry` each (it is keyed by agent first, then expiry); its last row
/// is `NULL`. A live lease always names its agent (`Step::lease_agent`), so the walk misses none.
macro_rules! leasing_agents {
    () => {
        "WITH RECURSIVE leasing (agent) AS ( \
           SELECT (SELECT lease_agent FROM steps INDEXED BY steps_lease_expiry \
                   WHERE lease_expires_at IS NOT NULL ORDER BY lease_agent LIMIT 1) \
           UNION ALL \
           SELECT (SELECT s.lease_agent FROM steps AS s INDEXED BY steps_lease_expiry \
                   WHERE s.lease_expires_at IS NOT NULL AND s.lease_agent > leasing.agent \
                   ORDER BY s.lease_agent LIMIT 1) \
           FROM leasing WHERE leasing.agent IS NOT NULL) "
    };
}

mod agents;
mod checkpoint;
mod deliveries;
#[cfg(any(test, feature = "fault-injection"))]
mod fault;
mod history;
mod insert;
mod jobs;
mod leader;
mod leases;
mod maintenance;
// FFI: SQLite's allocator methods are C callbacks.
#[allow(unsafe_code)]
mod malloc;
mod ordering;
// FFI: SQLite's page-cache methods are C callbacks.
#[allow(unsafe_code)]
mod pcache;
mod removal;
mod rerun;
mod row_writes;
mod rows;
mod schedules;
mod schema;
mod stats;
mod syncer;
mod tokens;
// FFI: `sync_file_range` has no wrapper in the standard library.
#[allow(unsafe_code)]
mod writeback;
mod writer;
mod written;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use overseer_core::{Command, Job, JobId, Timestamp, Transition};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use tokio::sync::{mpsc, Semaphore};

use self::rows::DbResult;
use crate::{Error, Result};

/// How to open a SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    pub path: PathBuf,
    /// Events kept per job; older ones are deleted as new ones arrive. At least 1.
    pub history_per_job: usize,
    /// Read-only connections for queries, beside the one write connection. At least 1.
    pub read_connections: usize,
    /// How long a connection waits for a lock held by another process before giving up.
    pub busy_timeout: Duration,
    /// Most writes committed in one transaction.
    pub max_batch: usize,
    /// Writes that may wait for the writer before callers are held back.
    pub queue_capacity: usize,
}

impl SqliteOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SqliteOptions {
            path: path.into(),
            history_per_job: overseer_core::Limits::default().history_per_job,
            read_connections: 4,
            busy_timeout: Duration::from_secs(5),
            max_batch: 256,
            queue_capacity: 1024,
        }
    }
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions::new("overseer.db")
    }
}

/// The write connection's settings as SQLite reports them, to check they are in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pragmas {
    pub journal_mode: String,
    /// 2 is `FULL`: every commit is fsync'd.
    pub synchronous: i64,
    pub busy_timeout_ms: i64,
    pub user_version: i64,
}

/// A store in one SQLite file. Cheap to clone; the writer thread stops when the last clone goes.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// `None` only while dropping, so the writer sees its queue close and can be joined.
    queue: Option<writer::Queue>,
    writer: Mutex<Option<JoinHandle<()>>>,
    readers: Arc<Readers>,
    /// Copies the WAL back into the database file off the writer thread.
    checkpointer: Mutex<Option<checkpoint::Checkpointer>>,
    commits: Arc<AtomicU64>,
    /// How far commits are on disk: every read's answer waits for what it saw.
    durability: Arc<syncer::Durability>,
    history_per_job: usize,
    /// Set when the file was opened with `OVERSEER_FAULT=crash-after-step-result`: the flag a
    /// partial write raises to make the writer abort right after committing it (see `fault`).
    #[cfg(feature = "fault-injection")]
    crash_after_step_result: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The exclusive lock on `PATH-lock`, held as long as the store is open (see `lock_file`).
    _lock: std::fs::File,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the writer loop after its last batch; joining makes a reopen of
        // the same file right after a drop see every committed write and no second writer.
        self.queue = None;
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(handle) = handle {
            if handle.join().is_err() {
                tracing::error!("the SQLite writer thread panicked");
            }
        }
        let checkpointer = self
            .checkpointer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(checkpointer);
    }
}

/// Prepared statements kept per connection. rusqlite keeps 16 by default, fewer than a claim and
/// a report use between them, so statements were parsed again and again; the writer's
/// changed-columns updates (`rows::set_items`) add a few shapes more.
const STATEMENT_CACHE: usize = 256;

/// A few read-only connections, handed out one per blocking read.
struct Readers {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
    /// Bounds reads in flight to the pool's size, so a burst waits instead of opening files.
    slots: Arc<Semaphore>,
}

impl Readers {
    fn open_one(&self) -> Result<Connection> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags).db()?;
        conn.busy_timeout(self.busy_timeout).db()?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(conn)
    }

    fn take(&self) -> Result<Connection> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => self.open_one(),
        }
    }

    fn put(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn);
    }
}

/// A file beside the database file: `PATH` with `suffix` appended (`-wal`, `-lock`).
fn beside(path: &std::path::Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// SQLite's write-ahead log beside the database file: `PATH-wal`.
fn wal_path(path: &std::path::Path) -> PathBuf {
    beside(path, "-wal")
}

/// Takes an exclusive lock on `PATH-lock` (beside SQLite's own `-wal` and `-shm` files), so a
/// second server started on the same file is refused at once instead of running as a second
/// writer and a follower that can never lead. The operating system drops the lock when the
/// process ends, however it ends, so a crash never leaves the store locked.
fn lock_file(path: &std::path::Path) -> Result<std::fs::File> {
    let name = beside(path, "-lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&name)
        .map_err(|e| Error::Unavailable(format!("cannot open {}: {e}", name.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::InUse(format!(
            "{} is in use by another process (another `overseer server`?); a SQLite store \
             serves one server: stop the other one, or run several nodes on PostgreSQL",
            path.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::Unavailable(format!(
            "cannot lock {}: {e}",
            name.display()
        ))),
    }
}

/// The writer's connection: write-ahead logging and the pragmas below, on a file whose schema
/// is up to date.
fn writer_connection(options: &SqliteOptions) -> Result<Connection> {
    let conn = Connection::open(&options.path).db()?;
    conn.busy_timeout(options.busy_timeout).db()?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .db()?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Unavailable(format!(
            "{} cannot use write-ahead logging (journal mode is {mode})",
            options.path.display()
        )));
    }
    // Commits are not synced by SQLite itself but by the log syncer, beside the writer, and
    // no write is answered (and no read shows a commit) before that sync (see `syncer`).
    conn.pragma_update(None, "synchronous", "NORMAL").db()?;
    // No table has foreign keys (migration 0019): a job's rows are removed with it
    // explicitly (`removal::delete_rows_of`).
    // Every write runs in its own savepoint inside the group commit; SQLite journals the
    // pages a savepoint touches so it can roll them back. In memory that costs a copy; in a
    // temp file it cost a pwrite per page (14% of the writer's time in a drain profile).
    // It is never needed after a crash: the WAL alone makes the commit atomic.
    conn.pragma_update(None, "temp_store", "MEMORY").db()?;
    // 16 MiB of page cache (negative = KiB) keeps the hot indexes in memory.
    conn.pragma_update(None, "cache_size", -16_384).db()?;
    // The writer never checkpoints itself: copying the WAL into the file and fsyncing it
    // would stall every write queued behind it. The checkpointer thread does it instead.
    conn.pragma_update(None, "wal_autocheckpoint", 0).db()?;
    conn.pragma_update(None, "journal_size_limit", checkpoint::WAL_SIZE_LIMIT)
        .db()?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // The schema is brought up to date on a connection of its own, closed before the writer's
    // first write. A migration that renames a table opens SQLite's `temp` database on its
    // connection (the rename rewrites `sqlite_temp_schema` too), and a connection with `temp`
    // open begins, commits and truncates it in every later transaction: the writer commits
    // thousands a second.
    migrate(&mut Connection::open(&options.path).db()?)?;
    Ok(conn)
}

impl SqliteStore {
    /// Opens (creating if needed) the file, brings its schema up to date, and starts the writer.
    pub fn open(options: SqliteOptions) -> Result<SqliteStore> {
        if !malloc::install() {
            tracing::debug!("SQLite was initialised before the store opened: it keeps malloc");
        }
        if !pcache::install() {
            tracing::debug!(
                "SQLite was initialised before the store opened: its default page cache stays"
            );
        }
        let lock = lock_file(&options.path)?;
        let conn = writer_connection(&options)?;

        let read_connections = options.read_connections.max(1);
        let readers = Arc::new(Readers {
            path: options.path.clone(),
            busy_timeout: options.busy_timeout,
            idle: Mutex::new(Vec::with_capacity(read_connections)),
            slots: Arc::new(Semaphore::new(read_connections)),
        });
        for _ in 0..read_connections {
            let conn = readers.open_one()?;
            readers.put(conn);
        }

        let (queue, receiver) = mpsc::channel(options.queue_capacity.max(1));
        let commits = Arc::new(AtomicU64::new(0));
        let checkpointer =
            checkpoint::Checkpointer::start(&options.path, options.busy_timeout, commits.clone())?;
        let max_batch = options.max_batch.max(1);
        let durability = syncer::Durability::new();
        let log = writer::Log {
            wal: wal_path(&options.path),
            commits: commits.clone(),
            durability: durability.clone(),
            syncer: syncer::Syncer::start(wal_path(&options.path), durability.clone())?,
        };
        let busy_timeout = options.busy_timeout;
        #[cfg(feature = "fault-injection")]
        let crash_after_step_result = fault::armed_from_env();
        #[cfg(feature = "fault-injection")]
        let abort_after_commit = crash_after_step_result.clone();
        let handle = std::thread::Builder::new()
            .name("overseer-sqlite-writer".into())
            .spawn(move || {
                writer::run(
                    conn,
                    receiver,
                    log,
                    max_batch,
                    busy_timeout,
                    #[cfg(feature = "fault-injection")]
                    abort_after_commit,
                )
            })
            .map_err(|e| Error::Unavailable(format!("cannot start the writer thread: {e}")))?;

        Ok(SqliteStore {
            inner: Arc::new(Inner {
                path: options.path,
                queue: Some(queue),
                writer: Mutex::new(Some(handle)),
                readers,
                commits,
                durability,
                checkpointer: Mutex::new(Some(checkpointer)),
                history_per_job: options.history_per_job.max(1),
                #[cfg(feature = "fault-injection")]
                crash_after_step_result,
                _lock: lock,
            }),
        })
    }

    /// A store in a fresh temporary directory, removed when the returned guard is dropped.
    #[cfg(feature = "testing")]
    pub fn open_temp(history_per_job: usize) -> Result<(SqliteStore, tempfile::TempDir)> {
        let dir = tempfile::tempdir()
            .map_err(|e| Error::Unavailable(format!("cannot create a temporary directory: {e}")))?;
        let mut options = SqliteOptions::new(dir.path().join("overseer.db"));
        options.history_per_job = history_per_job;
        Ok((SqliteStore::open(options)?, dir))
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Commits that did not walk the whole page cache after a B-tree balance swapped two page
    /// numbers, in this process, on every connection (see `sqlite/pcache.rs`).
    #[cfg(feature = "testing")]
    pub fn page_cache_scans_avoided() -> u64 {
        pcache::SCANS_AVOIDED.load(Ordering::Relaxed)
    }

    /// Whether SQLite allocates from mimalloc in this process (see `sqlite/malloc.rs`).
    #[cfg(feature = "testing")]
    pub fn sqlite_allocates_from_mimalloc() -> bool {
        malloc::in_use()
    }

    /// Transactions committed by the writer since open; far fewer than writes under load.
    pub fn commit_count(&self) -> u64 {
        self.inner.commits.load(Ordering::Relaxed)
    }

    /// The write connection's durability settings, read on the writer itself.
    pub async fn writer_pragmas(&self) -> Result<Pragmas> {
        self.write(|conn| {
            let text = |name: &str| -> Result<String> {
                conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                    .db()
            };
            let int = |name: &str| -> Result<i64> {
                conn.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
                    .db()
            };
            Ok(Pragmas {
                journal_mode: text("journal_mode")?,
                synchronous: int("synchronous")?,
                busy_timeout_ms: i64::try_from(writer::busy_timeout().as_millis())
                    .unwrap_or(i64::MAX),
                user_version: int("user_version")?,
            })
        })
        .await
    }

    async fn write<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        writer::submit(self.queue()?, false, work).await
    }

    /// Queues upkeep that yields to other writes: `work` gets the [`writer::Pressure`] to check
    /// between its pieces, and should stop at the next one once others wait.
    async fn write_background<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &writer::Pressure) -> Result<T> + Send + 'static,
    {
        let queue = self.queue()?;
        let pressure = writer::Pressure::of(queue);
        writer::submit(queue, true, move |conn| work(conn, &pressure)).await
    }

    fn queue(&self) -> Result<&writer::Queue> {
        self.inner
            .queue
            .as_ref()
            .ok_or_else(|| Error::Unavailable("the store is closing".into()))
    }

    /// Runs `work` on a pooled read connection inside one read transaction, so a job and its
    /// steps always come from the same commit.
    async fn read<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let readers = self.inner.readers.clone();
        let permit = readers
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Unavailable("the read pool is closed".into()))?;
        let durability = self.inner.durability.clone();
        let (result, seen) = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let mut conn = readers.take()?;
            let result = match conn.transaction().db() {
                Ok(tx) => work(&tx),
                Err(e) => Err(e),
            };
            readers.put(conn);
            Ok::<_, Error>((result, durability.visible()))
        })
        .await
        .map_err(|e| Error::Unavailable(format!("a read task failed: {e}")))??;
        // The read may have seen commits not yet on disk: answer once they are.
        self.inner.durability.wait(seen).await?;
        result
    }
}

fn migrate(conn: &mut Connection) -> Result<()> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .db()?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0)).db()?;
    let known = schema::MIGRATIONS.len();
    let from = usize::try_from(version)
        .ok()
        .filter(|v| *v <= known)
        .ok_or_else(|| {
            Error::Corrupt(format!(
                "schema version {version} is not one this build knows (it knows up to {known})"
            ))
        })?;
    for migration in &schema::MIGRATIONS[from..] {
        tx.execute_batch(migration).db()?;
    }
    if from < known {
        tx.pragma_update(None, "user_version", known as i64).db()?;
        tracing::info!(from, to = known, "migrated the SQLite schema");
    }
    tx.commit().db()
}

/// Stores what the core decided at `now`: the job row, the changed steps, the new history, and
/// the deliveries its durable effects call for, all in the caller's transaction.
///
/// `before` is the job the transition started from.
fn persist(
    conn: &Connection,
    before: &Job,
    t: &Transition,
    now: Timestamp,
    history_per_job: usize,
) -> Result<()> {
    let id = t.job.id;
    // A write that finishes the job with few entries leaves them in its row (see
    // `history::stays_in_row`); a finished job written again logs its entries as rows.
    let ending = !before.state.is_terminal()
        && t.job.state.is_terminal()
        && crate::history::stays_in_row(t.events.len(), history_per_job);
    // The event count is looked up only when the job or its history changes: a transition that
    // changes steps alone (a heartbeat) reads nothing more than it writes.
    let last_event_seq = if t.job_changed || !t.events.is_empty() {
        let last = rows::last_event_seq(conn, id)? + t.events.len() as i64;
        let ending = match ending {
            true => Some(row_writes::Ending::of(&t.events, last)?),
            false => None,
        };
        // A claim that only leases work changed no job field but the time, which its entry
        // carries: its job row is neither written nor compared column by column to learn that.
        debug_assert!(
            !(t.leases_only && ending.is_some()),
            "a lease finishes no job"
        );
        if !t.leases_only {
            row_writes::update_job(conn, before, &t.job, last, ending.as_ref())?;
        }
        Some(last)
    } else {
        written::last_event_seq(id)
    };
    // A claim that only leases work keeps its entry in the step row it writes, not a history row.
    let lease = lease_entry(before, t, last_event_seq)?;
    for &idx in &t.changed_steps {
        let entry = lease.as_ref().filter(|l| l.0 == idx).map(|l| &l.1);
        if entry.is_some() && before.steps.get(idx).is_some_and(|s| s.attempt > 0) {
            // Leased before: that lease's entry, if still kept there, goes to a row first.
            history::log_lease_entry(conn, &rows::job_id_text(id), idx)?;
        }
        row_writes::rewrite_step(conn, before, &t.job, idx, entry)?;
    }
    match last_event_seq {
        Some(last) if ending || lease.is_some() => {
            history::trim_events(conn, &rows::job_id_text(id), last, history_per_job)?
        }
        Some(last) => history::append_events(conn, id, &t.events, history_per_job, last)?,
        None => {}
    }
    for lease in crate::decide::retired_leases(t) {
        rows::insert_retired_lease(conn, &lease)?;
    }
    match last_event_seq {
        Some(last) => written::remember(&t.job, last),
        // Not cached and its count not read: the next load reads both.
        None => written::forget(id),
    }
    rows::insert_deliveries(conn, t, now)
}

/// For a transition that only leases work (`Transition::leases_only`) with one entry, numbered
/// `last`: the step it leased and the entry to keep in that step's row.
fn lease_entry(
    before: &Job,
    t: &Transition,
    last: Option<i64>,
) -> Result<Option<(usize, row_writes::LeaseEntry)>> {
    let (true, [entry], Some(last)) = (t.leases_only, t.events.as_slice(), last) else {
        return Ok(None);
    };
    let idx = crate::history::leased_step(&t.job, entry)?;
    debug_assert!(
        t.changed_steps.contains(&idx),
        "a lease of a step it does not write"
    );
    // `persist` relies on it: a step never leased (attempt 0) keeps no lease's entry.
    debug_assert_eq!(
        before.steps.get(idx).map(|s| s.attempt + 1),
        Some(t.job.steps[idx].attempt),
        "a lease counts an attempt"
    );
    Ok(Some((idx, row_writes::LeaseEntry::of(entry, last)?)))
}

/// Loads a job, applies a command through the core, and stores the transition.
fn apply_command(
    conn: &Connection,
    id: JobId,
    command: Command,
    now: Timestamp,
    history_per_job: usize,
) -> Result<Transition> {
    let job = rows::load_shared(conn, id)?.ok_or(Error::JobNotFound(id))?;
    // The core knows nothing of the job's key; a keyed job not heading it is not due yet.
    if command == Command::Activate && !ordering::may_start(conn, &job)? {
        return Err(overseer_core::Rejection::NotDue.into());
    }
    let mut t = overseer_core::apply(&job, command, now)?;
    persist(conn, &job, &t, now, history_per_job)?;
    if let Some(key) = t.freed_ordering_key() {
        if let Some(next) = ordering::start_next_head(conn, key, now, history_per_job)? {
            t.absorb_wakeups(&next);
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use overseer_core::{EventKind, JobState, StepState};
    use rusqlite::params;

    use super::*;
    use crate::prelude::*;
    use crate::{AgentCounts, Claim, Due, EventPage, JobQuery, NewJob, Submitted};
    use overseer_core::LeaseId;
    use rusqlite::params_from_iter;

    const T0: i64 = 1_700_000_000_000;
    const JOB: &str = "018bcfe5-6801-7000-8000-000000000001";

    /// Writes a file as version 1 of the schema left it: one running job with a ready step `a`,
    /// a running step `b` whose lease ran out at `T0 + 1000`, and a succeeded step `c` carrying a
    /// stray expiry.
    fn write_v1_file(path: &Path) {
        let conn = Connection::open(path).expect("open");
        conn.execute_batch(schema::MIGRATIONS[0]).expect("V1");
        conn.pragma_update(None, "user_version", 1)
            .expect("version");
        conn.execute(
            "INSERT INTO jobs (id, idempotency_key, fingerprint, labels, priority, run_at, \
             ordering_key, callback_url, on_failure, state, desired_state, created_at, updated_at, \
             finished_at, last_event_seq) \
             VALUES (?1, NULL, 'fp', '{}', 3, NULL, NULL, NULL, 'fail', 'running', 'succeeded', \
             ?2, ?2, NULL, 0)",
            params![JOB, T0],
        )
        .expect("job");
        let step = |idx: i64,
                    name: &str,
                    state: &str,
                    attempt: i64,
                    lease: Option<&str>,
                    expires: Option<i64>| {
            conn.execute(
                "INSERT INTO steps (job_id, idx, name, agent, payload, depends_on, timeout_ms, \
                 max_attempts, backoff_initial_ms, backoff_factor, backoff_max_ms, compensate, \
                 state, attempt, failures, lease_id, worker, created_at, ready_at, started_at, \
                 finished_at, lease_expires_at, next_attempt_at, result, last_error, priority) \
                 VALUES (?1, ?2, ?3, 'w', '{\"n\":1}', '[]', 30000, 5, 1000, 2.0, 300000, NULL, \
                 ?4, ?5, 0, ?6, NULL, ?7, ?7, NULL, NULL, ?8, ?9, NULL, NULL, 3)",
                params![
                    JOB,
                    idx,
                    name,
                    state,
                    attempt,
                    lease,
                    T0,
                    expires,
                    (state == "ready").then_some(T0),
                ],
            )
            .expect("step");
        };
        step(0, "a", "ready", 0, None, None);
        step(
            1,
            "b",
            "running",
            1,
            Some("00000000-0000-0000-0000-00000000000b"),
            Some(T0 + 1_000),
        );
        step(
            2,
            "c",
            "succeeded",
            1,
            Some("00000000-0000-0000-0000-00000000000c"),
            Some(T0 + 5),
        );
        conn.execute_batch(&format!(
            "INSERT INTO job_labels (job_id, key, value) VALUES ('{JOB}', 'team', 'blue'); \
             INSERT INTO leases (lease_id, job_id, step, attempt, worker, leased_at) \
             VALUES ('00000000-0000-0000-0000-00000000000b', '{JOB}', 1, 1, 'w-0', {T0}); \
             INSERT INTO events (job_id, seq, at, kind, step, attempt, detail) \
             VALUES ('{JOB}', 1, {T0}, 'job_submitted', NULL, NULL, NULL), \
                    ('{JOB}', 2, {T0}, 'step_leased', 'b', 1, NULL); \
             UPDATE jobs SET last_event_seq = 2;"
        ))
        .expect("labels, lease and history");
    }

    /// The query plan's detail lines for `sql` on a freshly migrated schema.
    fn plan(sql: &str) -> Vec<String> {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plan");
        let n = stmt.parameter_count();
        let args: Vec<i64> = (0..n as i64).collect();
        stmt.query_map(params_from_iter(args), |r| r.get::<_, String>(3))
            .expect("query")
            .collect::<rusqlite::Result<_>>()
            .expect("rows")
    }

    // Proves the claim and the due-job sweep are ordered ranges of their indexes: no table scan
    // and no sort, so they cost the same however many rows wait.
    #[test]
    fn claims_and_due_jobs_walk_their_indexes_in_order() {
        let claim = plan(leases::CANDIDATES_SQL);
        assert_eq!(
            claim,
            vec!["SEARCH steps USING INDEX steps_claim (claim_agent=?)"]
        );
        let due = plan(ordering::JOBS_DUE_SQL);
        assert!(
            due.iter()
                .all(|l| !l.contains("SCAN") && !l.contains("TEMP B-TREE")),
            "{due:?}"
        );
        assert!(due[0].contains("USING INDEX jobs_pending_due"), "{due:?}");
        assert!(
            due.iter()
                .any(|l| l.contains("USING INDEX jobs_ordering_key (ordering_key=? AND seq<?)")),
            "{due:?}"
        );
    }

    // Proves the repair's page of unfinished jobs merges ordered ranges of `jobs_state_id`
    // without a sort, and the per-minute counts read `jobs_finished` alone.
    #[test]
    fn unfinished_and_finished_jobs_come_from_their_indexes() {
        let active = plan(&jobs::ACTIVE_SQL);
        assert!(
            active.iter().all(|l| !l.contains("TEMP B-TREE"))
                && active.iter().filter(|l| l.starts_with("MERGE")).count() == 3
                && active
                    .iter()
                    .filter(|l| *l
                        == "SEARCH jobs USING COVERING INDEX jobs_state_id (state=? AND id>?)")
                    .count()
                    == 4,
            "{active:?}"
        );
        let counts = plan(stats::FINISHED_PER_MINUTE_SQL);
        assert_eq!(
            counts[0],
            "SEARCH jobs USING COVERING INDEX jobs_finished (state=? AND finished_at>? AND finished_at<?)"
        );
    }

    // Proves a file from before ordering keys gets a submission order: its keyed job heads the
    // key after the migration, and a job submitted afterwards queues behind it.
    #[tokio::test]
    async fn migrated_jobs_head_their_keys() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("v1.db");
        write_v1_file(&path);
        Connection::open(&path)
            .expect("open")
            .execute("UPDATE jobs SET ordering_key = 'k'", [])
            .expect("key the job");

        let store = SqliteStore::open(SqliteOptions::new(&path)).expect("open migrates");
        let old: JobId = JOB.parse().expect("id");
        let status = store.ordering_key_status("k").await.expect("status");
        assert_eq!((status.head.map(|j| j.id), status.waiting), (Some(old), 0));

        let spec: overseer_core::JobSpec = serde_json::from_value(serde_json::json!({
            "ordering_key": "k", "steps": [{"name": "s", "agent": "w"}]
        }))
        .expect("spec");
        let id = JobId(uuid::Uuid::from_u128(1));
        let t = Timestamp(T0 + 20);
        let new = overseer_core::machine::admit(Job::from_spec(id, &spec, t), t);
        let submitted = store
            .jobs_submit(vec![NewJob { transition: new }])
            .await
            .expect("submit");
        match submitted.as_slice() {
            [Submitted::Created(t)] => assert_eq!(t.job.state, JobState::Pending),
            other => panic!("expected a created job, got {other:?}"),
        }
        let status = store.ordering_key_status("k").await.expect("status");
        assert_eq!((status.head.map(|j| j.id), status.waiting), (Some(old), 1));
    }

    // Proves a version 1 file is migrated in place: its rows decode with the new fields at their
    // defaults (the exponential backoff formula included), its ready step is claimable and
    // counted under its agent, its running step's lease is still found when it expires, and a
    // settled step's stray expiry is not.
    #[tokio::test]
    async fn a_v1_file_migrates_and_its_ready_step_is_claimable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("v1.db");
        write_v1_file(&path);

        let store = SqliteStore::open(SqliteOptions::new(&path)).expect("open migrates");
        let pragmas = store.writer_pragmas().await.expect("pragmas");
        assert_eq!(pragmas.user_version, schema::MIGRATIONS.len() as i64);
        let id: JobId = JOB.parse().expect("id");
        let job = store.job_get(id).await.expect("get").expect("job");
        assert_eq!(
            (job.state, job.blocked_reason.as_deref()),
            (JobState::Running, None)
        );
        for s in &job.steps {
            assert_eq!((s.budget_from, s.comp_phase, s.comp_attempts), (0, None, 0));
            assert_eq!((s.comp_failures, s.comp_budget_from), (0, 0));
            // Steps from before schema V4 have no formula: their retries stay exponential.
            assert_eq!(
                (
                    s.backoff_formula,
                    s.backoff.initial.as_millis(),
                    s.backoff.factor
                ),
                (overseer_core::backoff::Formula::Exponential, 1_000, 2.0)
            );
        }
        assert_eq!(
            job.steps[2].lease_expires_at, None,
            "the stray expiry was cleared"
        );
        assert_eq!(
            store.agents_counts().await.expect("counts"),
            vec![AgentCounts {
                agent: "w".into(),
                ready: 1,
                running: 1
            }]
        );
        let expired = store
            .leases_expired(Due {
                now: Timestamp(T0 + 1_000),
                limit: 10,
            })
            .await
            .expect("expired");
        assert_eq!(
            expired
                .iter()
                .map(|l| (l.step, l.attempt))
                .collect::<Vec<_>>(),
            vec![(1, 1)]
        );

        // The history, the lease records and the labels were rebuilt in key order (migration
        // 16) and kept every row.
        let history = store
            .job_events(EventPage {
                job: id,
                after_seq: 0,
                limit: 10,
            })
            .await
            .expect("history");
        assert_eq!(
            history.iter().map(|e| (e.seq, e.kind)).collect::<Vec<_>>(),
            vec![(1, EventKind::JobSubmitted), (2, EventKind::StepLeased)]
        );
        let b_lease = LeaseId(uuid::Uuid::from_u128(0xb));
        let found = store
            .lease_find(b_lease)
            .await
            .expect("lease")
            .expect("kept");
        assert_eq!((found.job_id, found.step, found.attempt), (id, 1, 1));
        let labelled = store
            .jobs_list(JobQuery {
                labels: vec![("team".into(), "blue".into())],
                limit: 10,
                ..JobQuery::default()
            })
            .await
            .expect("list");
        assert_eq!(labelled.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);

        let lease_id = LeaseId(uuid::Uuid::from_u128(7));
        let claimed = store
            .steps_claim(Claim::of_worker(
                "w",
                "w-1",
                vec![lease_id],
                Timestamp(T0 + 10),
            ))
            .await
            .expect("claim")
            .claimed;
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].step, 0);
        let step = &claimed[0].transition.job.steps[0];
        assert_eq!(
            (step.state, step.attempt, step.lease_id),
            (StepState::Running, 1, Some(lease_id))
        );
        assert_eq!(
            store.job_get(id).await.expect("get"),
            Some(claimed[0].transition.job.clone())
        );
    }

    // Proves a write that reaches the writer together with upkeep is committed before the upkeep
    // runs: the upkeep below does not finish until that write has been answered, so if they
    // shared a transaction (the write's commit after all of the upkeep) this would never end.
    #[tokio::test]
    async fn a_write_queued_with_upkeep_does_not_wait_for_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let (running, blocked) = tokio::sync::oneshot::channel();
        let blocker = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write(move |_| {
                        let _ = running.send(());
                        held.recv_timeout(Duration::from_secs(10)).ok();
                        Ok(())
                    })
                    .await
            }
        });
        blocked.await.expect("the writer is busy");
        let (answered, answer_seen) = std::sync::mpsc::channel::<()>();
        let upkeep = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write_background(move |_, _| {
                        answer_seen
                            .recv_timeout(Duration::from_secs(5))
                            .map_err(|_| Error::Unavailable("the write waited for upkeep".into()))
                    })
                    .await
            }
        });
        let write = tokio::spawn({
            let store = store.clone();
            async move { store.write(|_| Ok(())).await }
        });
        // Both are queued behind the busy writer, so it takes them as one batch.
        let queue = store.queue().expect("queue").clone();
        while queue.max_capacity() - queue.capacity() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        hold.send(()).expect("release the writer");
        blocker.await.expect("join").expect("blocker");
        write.await.expect("join").expect("the write");
        answered.send(()).expect("upkeep still waits");
        upkeep
            .await
            .expect("join")
            .expect("the upkeep ran after the write's commit");
    }

    fn insert_setting(key: &'static str) -> impl FnOnce(&Connection) -> Result<()> {
        move |conn| {
            conn.execute(
                "INSERT INTO settings (key, value, created_at) VALUES (?1, 'x', 0)",
                [key],
            )
            .db()?;
            Ok(())
        }
    }

    fn setting_exists(conn: &Connection, key: &str) -> Result<bool> {
        conn.query_row("SELECT count(*) FROM settings WHERE key = ?1", [key], |r| {
            r.get::<_, i64>(0)
        })
        .db()
        .map(|n| n > 0)
    }

    // Proves neither a write nor a read that saw it is answered before the write's commit is
    // synced: with the syncer held, the commit is visible to another connection, yet the writer's
    // caller and a reader of the row both wait; released, both are answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[expect(
        clippy::await_holding_lock,
        reason = "the syncer is held on purpose while the test waits"
    )]
    async fn no_write_or_read_is_answered_before_its_commit_is_synced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        let held = store.inner.durability.hold.lock().expect("hold the syncer");
        let write = tokio::spawn({
            let store = store.clone();
            async move { store.write(insert_setting("k")).await }
        });
        let raw = Connection::open(store.path()).expect("raw open");
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while !setting_exists(&raw, "k").expect("raw read") {
            assert!(
                std::time::Instant::now() < give_up,
                "the write never committed"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let read = tokio::spawn({
            let store = store.clone();
            async move { store.read(|conn| setting_exists(conn, "k")).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!write.is_finished(), "a write was answered before its sync");
        assert!(
            !read.is_finished(),
            "a read showed a commit before its sync"
        );
        drop(held);
        write.await.expect("join").expect("the write");
        assert!(
            read.await.expect("join").expect("the read"),
            "the read saw it"
        );
    }

    // Proves a failed sync acknowledges nothing: with the log gone from under the store, the
    // write it could not sync is answered with an error although it committed, and the store
    // stops (later writes and reads fail) instead of trusting a later sync.
    #[tokio::test]
    async fn a_failed_sync_acknowledges_nothing_and_stops_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        store.write(insert_setting("a")).await.expect("first write");
        std::fs::remove_file(wal_path(store.path())).expect("remove the log");
        let refused = store.write(insert_setting("b")).await;
        assert!(
            matches!(&refused, Err(Error::Unavailable(why)) if why.contains("durable")),
            "{refused:?}"
        );
        assert!(
            store.write(insert_setting("c")).await.is_err(),
            "a later write"
        );
        assert!(
            store.read(|conn| setting_exists(conn, "a")).await.is_err(),
            "a later read"
        );
    }

    /// Prunes up to 10 jobs with a retention of a day for every state, at `ms` past a day.
    #[cfg(feature = "testing")]
    async fn prune_a_day_after(store: &SqliteStore, ms: i64) -> crate::Pruned {
        let day = overseer_core::Span::from_secs(86_400);
        store
            .jobs_prune(crate::Prune {
                now: crate::conformance::at(86_400_000 + ms),
                retention: overseer_core::retention::Retention {
                    succeeded: day,
                    failed: day,
                    cancelled: day,
                },
                limit: 10,
            })
            .await
            .expect("prune")
    }

    // Proves the writer's connection has the main database alone once the schema is migrated
    // (a fresh file takes every migration, table renames included) and a prune has run, so its
    // commits do not begin, commit and truncate a `temp` database too.
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn the_writer_has_no_temporary_database() {
        use crate::conformance::{job_id, maintenance::end_job};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        end_job(&store, 1, JobState::Succeeded, None, 1_000).await;
        end_job(&store, 2, JobState::Cancelled, None, 1_000).await;
        let pruned = prune_a_day_after(&store, 1_000).await;
        assert_eq!(pruned.ids.len(), 2, "both jobs are past their retention");
        assert!(store.job_get(job_id(1)).await.expect("get").is_none());
        let databases: Vec<String> = store
            .write(|conn| {
                let mut list = conn.prepare("PRAGMA database_list").db()?;
                let names = list.query_map([], |r| r.get::<_, String>(1)).db()?;
                names.collect::<rusqlite::Result<_>>().db()
            })
            .await
            .expect("databases");
        assert_eq!(databases, vec!["main".to_string()]);
    }

    // Proves a prune takes every row of the jobs it removes and nothing of any other job: with
    // no foreign keys, a statement that missed a table would leave rows behind unnoticed. Each
    // job has a step, history, a retired lease, a label and two deliveries (one settled, one
    // still due); the still-due delivery is the one row of a removed job that stays. Six jobs
    // go: a full statement's worth of jobs, then a statement padded with `NULL`s.
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn a_prune_takes_every_row_of_its_jobs_and_no_other() {
        use crate::conformance::{job_id, maintenance::end_job};
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        for n in 1..=7 {
            end_job(
                &store,
                n,
                JobState::Succeeded,
                None,
                1_000 * i64::try_from(n).expect("n"),
            )
            .await;
        }
        let ids: Vec<String> = (1..=7).map(|n| rows::job_id_text(job_id(n))).collect();
        let extra = ids.clone();
        store
            .write(move |conn| {
                for (n, id) in extra.iter().enumerate() {
                    conn.execute(
                        "INSERT INTO job_labels (job_id, key, value) VALUES (?1, 'team', 'blue')",
                        [id],
                    )
                    .db()?;
                    conn.execute(
                        "INSERT INTO leases (lease_id, job_id, step, attempt) \
                         VALUES (?1, ?2, 0, 1)",
                        [format!("retired-{n}"), id.clone()],
                    )
                    .db()?;
                    // A one-step job run to the end has no history row: give it one.
                    conn.execute(
                        "INSERT INTO events (job_id, seq, at, kind) \
                         VALUES (?1, 100, 0, 'job_repaired')",
                        [id],
                    )
                    .db()?;
                    for (what, delivered) in [("settled", Some(5)), ("due", None)] {
                        conn.execute(
                            "INSERT INTO deliveries (kind, job_id, idempotency_key, body, \
                             created_at, next_attempt_at, delivered_at) \
                             VALUES ('callback', ?1, ?2, '{}', 0, 0, ?3)",
                            rusqlite::params![id, format!("{what}-{n}"), delivered],
                        )
                        .db()?;
                    }
                }
                Ok(())
            })
            .await
            .expect("labels and deliveries");
        let rows_of = |id: String| {
            store.read(move |conn| {
                let mut counts = Vec::new();
                for table in [
                    "jobs",
                    "steps",
                    "leases",
                    "events",
                    "job_labels",
                    "deliveries",
                ] {
                    let column = if table == "jobs" { "id" } else { "job_id" };
                    let sql = format!("SELECT COUNT(*) FROM {table} WHERE {column} = ?1");
                    counts.push(conn.query_row(&sql, [&id], |r| r.get::<_, i64>(0)).db()?);
                }
                Ok(counts)
            })
        };
        let mut before = Vec::new();
        for id in &ids {
            let counts = rows_of(id.clone()).await.expect("rows");
            assert!(
                counts.iter().all(|&c| c > 0),
                "{id} has a row in each table: {counts:?}"
            );
            before.push(counts);
        }
        let pruned = prune_a_day_after(&store, 6_000).await;
        assert_eq!(pruned.ids.len(), 6, "jobs 1 to 6 are past their retention");
        for id in &ids[..6] {
            let counts = rows_of(id.clone()).await.expect("rows");
            assert_eq!(
                counts,
                vec![0, 0, 0, 0, 0, 1],
                "{id}: only its due delivery stays"
            );
        }
        let kept = rows_of(ids[6].clone()).await.expect("rows");
        assert_eq!(kept, before[6], "job 7 keeps every row");
    }

    // Proves upkeep yields to other writes: a background write sees a write queued behind it and
    // stops; both are committed, each in its own transaction.
    #[tokio::test]
    async fn a_background_write_yields_to_a_waiting_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        let insert = |key: &'static str| {
            move |conn: &Connection| -> Result<()> {
                conn.execute(
                    "INSERT INTO settings (key, value, created_at) VALUES (?1, 'x', 0)",
                    [key],
                )
                .db()?;
                Ok(())
            }
        };
        let before = store.commit_count();
        let (started, running) = tokio::sync::oneshot::channel();
        let background = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write_background(move |conn, pressure| {
                        let _ = started.send(());
                        let give_up = std::time::Instant::now() + Duration::from_secs(10);
                        while !pressure.others_waiting() {
                            if std::time::Instant::now() > give_up {
                                return Err(Error::Unavailable("never saw the other write".into()));
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        insert("background")(conn)
                    })
                    .await
            }
        });
        running.await.expect("the background write runs");
        store.write(insert("foreground")).await.expect("foreground");
        background
            .await
            .expect("join")
            .expect("the background write yielded");
        assert_eq!(store.commit_count() - before, 2, "a commit each");
        let keys: Vec<String> = store
            .read(|conn| {
                let mut stmt = conn.prepare("SELECT key FROM settings ORDER BY key").db()?;
                let keys = stmt.query_map([], |r| r.get(0)).db()?;
                keys.collect::<rusqlite::Result<_>>().db()
            })
            .await
            .expect("read");
        assert_eq!(keys, ["background", "foreground"]);
    }

    // Proves an upkeep commit never overlaps a sync of the log: while the syncer's turn is
    // taken (as during a sync), a background write runs but does not commit; once the turn is
    // free it commits and is answered.
    #[tokio::test]
    async fn an_upkeep_commit_waits_for_a_sync_under_way() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteOptions::new(dir.path().join("o.db"))).expect("open");
        let before = store.commit_count();
        // The turn is held on a thread of its own, as the syncer holds it.
        let durability = store.inner.durability.clone();
        let (held, taken) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _turn = durability.turn();
            let _ = held.send(());
            let _ = released.recv();
        });
        taken.recv().expect("the turn is taken");
        let (ran, running) = tokio::sync::oneshot::channel();
        let mut background = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .write_background(move |conn, _| {
                        let _ = ran.send(());
                        insert_setting("upkeep")(conn)
                    })
                    .await
            }
        });
        running.await.expect("the background write runs");
        let answered = tokio::time::timeout(Duration::from_millis(200), &mut background).await;
        assert!(answered.is_err(), "answered during a sync: {answered:?}");
        assert_eq!(store.commit_count(), before, "committed during a sync");
        release.send(()).expect("release the turn");
        holder.join().expect("the holder ends");
        background
            .await
            .expect("join")
            .expect("committed once the sync is over");
        assert_eq!(store.commit_count() - before, 1);
    }
}
