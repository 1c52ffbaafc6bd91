//! The PostgreSQL backend: many server nodes sharing one database.
//!
//! Like the SQLite backend, it never decides what a command does: it loads a job (its row and its
//! steps), asks `overseer_core::apply` for the transition, and writes the transition back (job
//! row, changed steps, events with the history trim, outbox deliveries) in one transaction. What
//! differs is how nodes are kept from stepping on each other:
//!
//! - a command locks its job row (`FOR UPDATE`) before loading it, so commands on one job are
//!   serial and each sees the last one's steps (read committed: the steps are read after the
//!   lock is granted);
//! - a claim locks each candidate's job with `FOR UPDATE SKIP LOCKED`, so claimers never wait on
//!   each other and a job someone else is writing is simply passed over, and the core re-checks
//!   claimability on the freshly loaded job; an agent with limits has its settings row locked
//!   first, which serialises that agent's claims so `max_concurrency` and the rate hold across
//!   nodes;
//! - jobs with an ordering key take a transaction-scoped advisory lock on the key before they are
//!   inserted, so which job heads a key is decided by one node at a time;
//! - the supervisor's writes check the leader row (`FOR SHARE`) in their own transaction.
//!
//! - an idempotency key is claimed by `INSERT … ON CONFLICT DO NOTHING`, which waits for a racing
//!   insert of the same key to commit or roll back, so exactly one node stores the job and the
//!   others find it (or a conflict) in the same call.
//!
//! Every instant comes from the caller; SQL's `now()` is never used. Serialization failures and
//! deadlocks are retried a few times; connection trouble, a server shutting down (`57P01`) and
//! any other failure to do the work is [`Error::Unavailable`], with nothing committed. Commits
//! wait for the WAL flush (`synchronous_commit=on` is set on every connection). The pool drops
//! connections whose socket has closed, and a transaction whose first statement finds its
//! connection closed is retried on another, so after a server restart it heals by itself.
//!
//! Nodes hear each other through `LISTEN/NOTIFY` (see `listen`): [`crate::Maintenance::signals`].

/// `leasing (agent)`: the agents holding live leases, as the start of a `WITH RECURSIVE`, one
/// probe of `steps_lease_expiry` each (it is keyed by agent first, then expiry). A live lease
/// always names its agent (`Step::lease_agent`), so the walk misses none.
macro_rules! leasing_agents {
    () => {
        "WITH RECURSIVE leasing (agent) AS ( \
           (SELECT lease_agent FROM steps WHERE lease_expires_at IS NOT NULL \
            ORDER BY lease_agent LIMIT 1) \
           UNION ALL \
           SELECT (SELECT s.lease_agent FROM steps s \
                   WHERE s.lease_expires_at IS NOT NULL AND s.lease_agent > l.agent \
                   ORDER BY s.lease_agent LIMIT 1) \
           FROM leasing l WHERE l.agent IS NOT NULL) "
    };
}

mod agents;
mod announce;
mod deliveries;
mod inserts;
mod jobs;
mod leader;
mod leases;
mod listen;
mod maintenance;
mod removal;
mod rerun;
mod rows;
mod schedules;
mod schema;
mod stats;
mod tls;
mod tokens;
mod tx;
mod unlogged;
mod writes;

use self::tx::Transaction;

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use overseer_core::JobId;
use tokio::sync::broadcast;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use self::rows::{get, query, query_one};
use crate::{Error, Result, Signal};

/// How to open a PostgreSQL store.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// `postgres://user:password@host:port/database?…`. The tables go in the first schema of the
    /// search path (use a database or schema of Overseer's own, e.g. with
    /// `?options=-c%20search_path%3Doverseer`). TLS is not supported: use a local network or a
    /// TLS-terminating proxy.
    pub url: String,
    /// Events kept per job; older ones are deleted as new ones arrive. At least 1.
    pub history_per_job: usize,
    /// Connections in the pool (besides the one listening for notifications). At least 1.
    pub pool_size: usize,
    /// How long connecting to the server may take.
    pub connect_timeout: Duration,
    /// How long a request waits for a pooled connection before answering `Unavailable`.
    pub acquire_timeout: Duration,
    /// Signals buffered for a slow subscriber before it starts missing some.
    pub signal_capacity: usize,
}

impl PgOptions {
    pub fn new(url: impl Into<String>) -> Self {
        PgOptions {
            url: url.into(),
            history_per_job: overseer_core::Limits::default().history_per_job,
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
            signal_capacity: 1024,
        }
    }
}

/// A store in a PostgreSQL database. Cheap to clone; its connections and its listening task go
/// when the last clone does.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    history_per_job: usize,
    signals: broadcast::Sender<Signal>,
    _listener: listen::Listener,
    /// Sends what committed writes announce (see `announce`).
    announcer: announce::Announcer,
    /// Agents whose last claim on this node leased all it asked for (see `leases::Busy`).
    busy: leases::Busy,
    /// The jobs of leases this node granted (see `leases::Granted`).
    granted: leases::Granted,
}

/// Why a unit of work against the database stopped: a PostgreSQL error (classified only at the
/// end, so the retry loop can look at its SQLSTATE), a store error, or a race to run again.
#[derive(Debug)]
enum Failure {
    Pg(tokio_postgres::Error),
    Store(Error),
    /// A race that a fresh transaction resolves (e.g. a conflicting row vanished in between).
    Retry(String),
}

type Res<T> = std::result::Result<T, Failure>;

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Store(e)
    }
}

impl From<overseer_core::Rejection> for Failure {
    fn from(e: overseer_core::Rejection) -> Self {
        Failure::Store(Error::Rejected(e))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Pg(e) => f.write_str(&describe(e)),
            Failure::Store(e) => e.fmt(f),
            Failure::Retry(why) => f.write_str(why),
        }
    }
}

impl Failure {
    /// Whether running the whole transaction again may succeed.
    fn is_retryable(&self) -> bool {
        match self {
            Failure::Pg(e) => matches!(
                e.code(),
                Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
            ),
            Failure::Retry(_) => true,
            Failure::Store(_) => false,
        }
    }

    /// The store error this stands for. Every PostgreSQL error that gets this far means the
    /// database could not do the work now (connection lost, server shutting down, out of
    /// resources, …): nothing was committed, and the caller may retry.
    fn into_error(self) -> Error {
        match self {
            Failure::Store(e) => e,
            Failure::Pg(e) => Error::Unavailable(describe(&e)),
            Failure::Retry(why) => Error::Unavailable(why),
        }
    }
}

/// A PostgreSQL error as one line: the server's message and SQLSTATE, or the client's cause.
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> Error {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => Error::Unavailable(format!("cannot connect: {}", describe(&e))),
        PoolError::Timeout(_) => {
            Error::Unavailable("timed out waiting for a database connection".into())
        }
        other => Error::Unavailable(format!("database pool: {other}")),
    }
}

/// A unit of work run inside one transaction; may run more than once (see [`PgStore::write`]).
type Work<'t, T> = Pin<Box<dyn Future<Output = Res<T>> + Send + 't>>;

/// The second argument of every unit of work. It carries no data: its type tells the compiler
/// that whatever the work borrows from its caller (lifetime `'a`) outlives the transaction
/// (`'t`), which a higher-ranked closure bound cannot say directly.
type Scope<'t, 'a> = PhantomData<&'t &'a ()>;

/// How long a session of ours may sit idle inside a transaction before the server ends it.
const IDLE_IN_TRANSACTION_MS: u64 = 60_000;

/// How long a statement of ours waits for a row or advisory lock (migrations excepted).
const LOCK_TIMEOUT_MS: u64 = 30_000;

/// Times a transaction that hit a serialization failure or a deadlock is tried again.
const RETRIES: u32 = 5;

impl PgStore {
    /// Connects, brings the schema up to date (safe when several nodes start at once), and starts
    /// listening for other nodes' signals.
    pub async fn open(options: PgOptions) -> Result<PgStore> {
        let (url, tls) = tls::from_url(&options.url)?;
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| Error::Unavailable(format!("not a PostgreSQL URL: {e}")))?;
        config.connect_timeout(options.connect_timeout);
        config.keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("overseer");
        }
        // A 2xx for a submit promises the job is on disk: whatever the server's default, every
        // commit of ours waits for its WAL flush. Our transactions never sit idle and never wait
        // long for a lock, so a session that does (its node hung or cut off mid-transaction) is
        // ended, and its locks released, rather than holding jobs or an agent's claims for as
        // long as the server takes to notice a dead connection.
        let guards = format!(
            "-c synchronous_commit=on -c idle_in_transaction_session_timeout={} \
             -c lock_timeout={}",
            IDLE_IN_TRANSACTION_MS, LOCK_TIMEOUT_MS
        );
        let session = match config.get_options() {
            Some(existing) => format!("{existing} {guards}"),
            None => guards,
        };
        config.options(&session);

        // A pooled connection whose socket has closed (a server restart ends every one) is
        // dropped when it comes back to the pool; one that fails its transaction's first
        // statement anyway is replaced by `write` and `read` (see `begin`). Checking each
        // connection with a query before handing it out (`Verified`) cost a round trip on every
        // transaction: 0.2 ms at the median, two of them on the path from a submit to its lease.
        let recycling = || ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = |config: &tokio_postgres::Config| match &tls {
            tls::Tls::Plain => Manager::from_config(config.clone(), NoTls, recycling()),
            tls::Tls::Rustls(connect) => {
                Manager::from_config(config.clone(), connect.clone(), recycling())
            }
        };
        let pool_of = |manager: Manager, size: usize| {
            Pool::builder(manager)
                .max_size(size)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(options.acquire_timeout))
                .create_timeout(Some(options.connect_timeout))
                .recycle_timeout(Some(options.connect_timeout))
                .build()
                .map_err(|e| Error::Unavailable(format!("cannot build the connection pool: {e}")))
        };
        let pool = pool_of(manager(&config), options.pool_size.max(1))?;
        // The sender of notifications has a connection of its own whose commits do not wait for
        // a flush: it writes nothing but notifications, which are worth nothing after a crash.
        let mut quiet = config.clone();
        quiet.options(session.replace("synchronous_commit=on", "synchronous_commit=off"));
        let announce_pool = pool_of(manager(&quiet), 1)?;

        let (signals, _) = broadcast::channel(options.signal_capacity.max(1));
        let origin = announce::Origin::default();
        let store = PgStore {
            inner: Arc::new(Inner {
                pool,
                history_per_job: options.history_per_job.max(1),
                signals: signals.clone(),
                _listener: listen::spawn(config, tls, signals, origin.clone()),
                announcer: announce::Announcer::spawn(announce_pool, origin),
                busy: leases::Busy::default(),
                granted: leases::Granted::default(),
            }),
        };
        store.migrate().await?;
        store.warn_if_not_durable().await;
        Ok(store)
    }

    /// Applies the migrations this database has not seen, under the migration lock.
    async fn migrate(&self) -> Result<()> {
        let applied_at = wall_clock_ms();
        let (from, to) = self
            .write(move |tx, _| {
                Box::pin(async move {
                    // Another node's migrations may take a while: wait for them, however long.
                    // `CREATE … IF NOT EXISTS` on a migrated database raises a NOTICE that
                    // the driver would log at INFO on every start: not worth a line.
                    tx.batch_execute(
                        "SET LOCAL lock_timeout = 0; SET LOCAL client_min_messages = warning",
                    )
                    .await?;
                    query(
                        tx,
                        "SELECT pg_advisory_xact_lock($1)",
                        &[&schema::MIGRATION_LOCK],
                    )
                    .await?;
                    tx.batch_execute(schema::BOOKKEEPING).await?;
                    let row = query_one(
                        tx,
                        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
                        &[],
                    )
                    .await?;
                    let version: i32 = get(&row, 0, "schema_migrations.version")?;
                    let known = schema::MIGRATIONS.len();
                    let from = usize::try_from(version)
                        .ok()
                        .filter(|v| *v <= known)
                        .ok_or_else(|| {
                            Failure::Store(Error::Corrupt(format!(
                                "schema version {version} is not one this build knows (it \
                                 knows up to {known}): is a newer Overseer using this database?"
                            )))
                        })?;
                    for (i, migration) in schema::MIGRATIONS.iter().enumerate().skip(from) {
                        tx.batch_execute(migration).await?;
                        let version = i32::try_from(i + 1).unwrap_or(i32::MAX);
                        query(
                            tx,
                            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
                            &[&version, &applied_at],
                        )
                        .await?;
                    }
                    Ok((from, known))
                })
            })
            .await?;
        if from < to {
            tracing::info!(from, to, "migrated the PostgreSQL schema");
        }
        Ok(())
    }

    async fn warn_if_not_durable(&self) {
        if let Ok(value) = self.server_setting("fsync").await {
            if value != "on" {
                tracing::warn!(
                    fsync = %value,
                    "the PostgreSQL server runs with fsync off: a crash of its machine can lose \
                     committed jobs"
                );
            }
        }
    }

    /// A run-time setting as a pooled connection of this store sees it (`current_setting`), e.g.
    /// `synchronous_commit`, to check the store's durability settings are in force.
    pub async fn server_setting(&self, name: &str) -> Result<String> {
        self.read(move |tx, _| {
            Box::pin(async move {
                let row = query_one(tx, "SELECT current_setting($1)", &[&name]).await?;
                get::<String>(&row, 0, name)
            })
        })
        .await
    }

    /// Runs `work` in a read-write transaction (read committed) and commits it, trying the whole
    /// transaction again after a serialization failure or a deadlock. Its statements are planned
    /// without sequential scans ([`WRITE_BEGIN_SQL`]).
    async fn write<'a, T, F>(&self, mut work: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnMut(&'t Transaction<'t>, Scope<'t, 'a>) -> Work<'t, T> + Send + 'a,
    {
        let mut attempt = 0;
        loop {
            let open = tx::Open::new(self.inner.pool.get().await.map_err(pool_error)?);
            let tx = open.transaction();
            let work = work(&tx, PhantomData);
            let (outcome, announced) =
                announce::scope(transact(&open, WRITE_BEGIN_SQL, work)).await;
            match outcome {
                Ok(value) => {
                    self.inner.announcer.send(announced);
                    return Ok(value);
                }
                Err(f) if f.is_retryable() && attempt < RETRIES => {
                    attempt += 1;
                    tracing::debug!(attempt, error = %f, "retrying a transaction");
                    tokio::time::sleep(retry_delay(attempt)).await;
                }
                Err(f) => return Err(f.into_error()),
            }
        }
    }

    /// Runs `work` in a read-only transaction on one snapshot (repeatable read), so a job and its
    /// steps always come from the same commit.
    async fn read<'a, T, F>(&self, mut work: F) -> Result<T>
    where
        T: Send,
        F: for<'t> FnMut(&'t Transaction<'t>, Scope<'t, 'a>) -> Work<'t, T> + Send + 'a,
    {
        let mut fresh = false;
        loop {
            let open = tx::Open::new(self.inner.pool.get().await.map_err(pool_error)?);
            let tx = open.transaction();
            let outcome = transact(&open, READ_BEGIN_SQL, work(&tx, PhantomData)).await;
            match outcome {
                // Once on a new connection: the pool had one whose server went away.
                Err(Failure::Retry(_)) if !fresh && open.is_closed() => fresh = true,
                other => return other.map_err(Failure::into_error),
            }
        }
    }

    /// Runs one read-only statement on its own, outside any transaction: one round trip and the
    /// statement's own snapshot, for a look that needs neither a lock nor a second statement.
    async fn read_one_statement(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let mut fresh = false;
        loop {
            let client = self.inner.pool.get().await.map_err(pool_error)?;
            let outcome: Res<_> = async {
                let stmt = begin(client.prepare_cached(sql).await)?;
                Ok(client.query(&stmt, params).await?)
            }
            .await;
            match outcome {
                // Once on a new connection: the pool had one whose server went away.
                Err(Failure::Retry(_)) if !fresh && client.is_closed() => fresh = true,
                other => return other.map_err(Failure::into_error),
            }
        }
    }

    /// Connections in the pool right now, and how many of them are idle (for metrics and tests).
    pub fn pool_status(&self) -> (usize, usize) {
        let status = self.inner.pool.status();
        (status.size, status.available)
    }
}

/// Every statement of a write finds its rows through an index, however small the table was when
/// the statement was planned. A connection keeps the plan of each prepared statement, and after a
/// few executions PostgreSQL settles on one plan for all parameters, costed against the table as
/// it was then. On a new store that is a few hundred rows, where scanning the table beats the
/// primary key; the plan stays while the table grows, until autovacuum next analyzes it (a
/// minute or more). Measured on a fresh database at 2,000 jobs/s: the step and job writes scanned
/// up to 22,838 rows a call, 6 ms each instead of 0.75, and the machine saturated. So a write
/// transaction begins by turning sequential scans off for its own statements: every write is
/// keyed anyway, and a table with no index for a statement is still scanned.
const WRITE_BEGIN_SQL: &str = "BEGIN; SET LOCAL enable_seqscan = off";

/// How a read begins: one snapshot for all its statements, so a job and its steps always come
/// from the same commit.
const READ_BEGIN_SQL: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";

/// Runs `work` in the transaction `begin_sql` opens on `open`, and commits it, or rolls it back
/// if the work failed. `BEGIN` is not waited for on its own: it is written ahead of the work's
/// first statement, and its answer is read with that statement's (see `tx`).
async fn transact<T>(open: &tx::Open, begin_sql: &str, work: Work<'_, T>) -> Res<T> {
    let tx = open.transaction();
    let (begun, value) = futures::join!(tx.batch_execute(begin_sql), work);
    // Not ended: a connection that failed to begin is closed when `open` is dropped.
    begin(begun)?;
    match value {
        Ok(value) => {
            open.commit().await?;
            Ok(value)
        }
        Err(f) => {
            open.rollback().await;
            Err(f)
        }
    }
}

/// A transaction's start: a connection found closed by its first statement (the server
/// restarted since it was pooled) asks for the work to be retried on another; nothing ran.
fn begin<T>(started: std::result::Result<T, tokio_postgres::Error>) -> Res<T> {
    started.map_err(|e| match e.is_closed() {
        true => Failure::Retry(format!("a pooled connection was closed: {e}")),
        false => Failure::Pg(e),
    })
}

/// A few milliseconds, growing with each retry, with a little jitter from the clock so racing
/// transactions do not retry in lockstep.
fn retry_delay(attempt: u32) -> Duration {
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos() % 5))
        .unwrap_or(0);
    Duration::from_millis(5 * u64::from(attempt) + jitter)
}

/// The wall clock, only for bookkeeping no decision depends on (when a migration ran).
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Job ids decoded from the first column of `rows`.
fn job_ids(rows: &[tokio_postgres::Row], what: &str) -> Res<Vec<JobId>> {
    rows.iter().map(|r| get(r, 0, what).map(JobId)).collect()
}

const TERMINAL: &str = "('succeeded', 'failed', 'cancelled')";

/// Parameters built at run time (a filter with a varying number of terms).
type DynParams = Vec<Box<dyn ToSql + Sync + Send>>;

fn param_refs(params: &DynParams) -> Vec<&(dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| p.as_ref() as &(dyn ToSql + Sync))
        .collect()
}
