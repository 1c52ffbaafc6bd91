//! Transactions whose `BEGIN` travels with their first statement.
//!
//! tokio-postgres's own transaction waits for the answer to `BEGIN` before it sends anything
//! else: a round trip of its own in every transaction. On a loaded machine every round trip waits
//! for a core, and `BEGIN` alone took 1.9 ms at the median with 1,200 jobs/s of background (a
//! claim is only a handful of round trips). Here `BEGIN`, with the transaction's settings, is
//! written to the connection and not waited for: the work's first statement follows it on the
//! wire, PostgreSQL runs the two in order, and the caller reads `BEGIN`'s answer together with
//! the statement's (see `PgStore::write`).
//!
//! Statements sent together (in one `join!`) run in the order they are written, and code relies
//! on it: "lock the job, then load it" in one round trip reads the rows after the lock is
//! granted. A statement is prepared before it is sent, and the first use of a statement on a
//! connection prepares it with a round trip of its own, during which a statement written after
//! it, already prepared, would go first. So every statement waits for its turn
//! ([`Transaction::in_turn`]): it is sent only after every statement issued before it.
//!
//! A transaction opened this way must end in [`Open::commit`] or [`Open::rollback`]. If it is
//! dropped before either (its future was cancelled, or a panic unwound through it), the
//! connection could go back to the pool inside a transaction, so it is taken out of the pool
//! instead and closed, and the server rolls the transaction back.

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use deadpool_postgres::{ClientWrapper, Object};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::Statement;

use super::unlogged::Seen;

/// A connection inside a transaction, as the work sees it: every statement method of the pooled
/// client (its statement cache included), and no way to end the transaction. Statements take
/// their turn through [`Transaction::in_turn`] (as `rows::query` and its siblings do) or
/// [`Transaction::batch_execute`]; the client's own methods, reached through `Deref`, skip it.
pub(crate) struct Transaction<'a> {
    client: &'a ClientWrapper,
    /// Held by the statement being prepared and sent; waiters get it in the order they asked.
    turn: &'a Mutex<()>,
    unlogged: &'a Seen,
}

impl Transaction<'_> {
    /// The waiting entries of the jobs this transaction loaded (see `super::unlogged`).
    pub(super) fn unlogged(&self) -> &Seen {
        self.unlogged
    }

    /// Prepares `sql` (from the connection's cache when it can) and starts `send` with it, after
    /// every statement issued before this one in the transaction was sent, and before any
    /// statement issued after it. `send` must write its statement to the connection the first
    /// time it is polled, as tokio-postgres's statement methods do.
    pub(super) async fn in_turn<T, F>(
        &self,
        sql: &str,
        send: impl FnOnce(Statement) -> F,
    ) -> Result<T, tokio_postgres::Error>
    where
        F: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let turn = self.turn.lock().await;
        let statement = self.client.prepare_cached(sql).await?;
        sent_then_awaited(turn, send(statement)).await
    }

    /// Runs `sql` (one or more statements, no parameters) in its turn, like [`Self::in_turn`].
    pub(super) async fn batch_execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let turn = self.turn.lock().await;
        sent_then_awaited(turn, self.client.batch_execute(sql)).await
    }
}

/// Polls `request` once (which writes it to the connection), gives up the `turn`, then waits for
/// the answer: the next statement may be sent while this one runs.
async fn sent_then_awaited<T>(turn: MutexGuard<'_, ()>, request: impl Future<Output = T>) -> T {
    let mut request = std::pin::pin!(request);
    let first = futures::poll!(request.as_mut());
    drop(turn);
    match first {
        Poll::Ready(answer) => answer,
        Poll::Pending => request.await,
    }
}

impl Deref for Transaction<'_> {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        self.client
    }
}

/// A pooled connection whose transaction was begun (or is about to be, by the first statement
/// sent on it): ends with a commit or a rollback, or closes the connection.
pub(super) struct Open {
    client: Option<Object>,
    ended: AtomicBool,
    turn: Mutex<()>,
    unlogged: Seen,
}

impl Open {
    /// Takes `client` for one transaction; the caller sends the `BEGIN` (see the module's
    /// documentation).
    pub(super) fn new(client: Object) -> Open {
        Open {
            client: Some(client),
            ended: AtomicBool::new(false),
            turn: Mutex::new(()),
            unlogged: Seen::default(),
        }
    }

    fn client(&self) -> &Object {
        self.client
            .as_ref()
            .expect("a transaction holds its connection until dropped")
    }

    /// The connection, for the work's statements.
    pub(super) fn transaction(&self) -> Transaction<'_> {
        Transaction {
            client: self.client(),
            turn: &self.turn,
            unlogged: &self.unlogged,
        }
    }

    /// Whether the connection's socket has closed (the server went away).
    pub(super) fn is_closed(&self) -> bool {
        self.client().is_closed()
    }

    /// Commits; on an error the transaction is over all the same (PostgreSQL rolled it back, or
    /// the connection is gone).
    pub(super) async fn commit(&self) -> Result<(), tokio_postgres::Error> {
        let done = self.client().batch_execute("COMMIT").await;
        self.ended.store(done.is_ok(), Ordering::Release);
        done
    }

    /// Rolls back. If even that fails, the connection is left for [`Drop`] to close.
    pub(super) async fn rollback(&self) {
        let done = self.client().batch_execute("ROLLBACK").await;
        self.ended.store(done.is_ok(), Ordering::Release);
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if !self.ended.load(Ordering::Acquire) {
                // Out of the pool and closed: the server rolls back what was begun.
                drop(Object::take(client));
            }
        }
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::time::Duration;

    use super::Transaction;
    use crate::pgtest::PgCluster;
    use crate::postgres::rows::{get, query_one};
    use crate::postgres::{PgOptions, PgStore, Work};

    /// The first statement's view of its transaction: isolation, read-only, plan settings.
    const WHERE_AM_I: &str = "SELECT current_setting('transaction_isolation'), \
         current_setting('transaction_read_only'), current_setting('enable_seqscan')";

    fn where_am_i<'t>(tx: &'t Transaction<'t>) -> Work<'t, (String, String, String)> {
        Box::pin(async move {
            let row = query_one(tx, WHERE_AM_I, &[]).await?;
            Ok((
                get::<String>(&row, 0, "isolation")?,
                get::<String>(&row, 1, "read_only")?,
                get::<String>(&row, 2, "enable_seqscan")?,
            ))
        })
    }

    // Proves the work's first statement runs inside the transaction whose BEGIN was sent ahead of
    // it without waiting: a read's first statement sees repeatable read and read-only, a write's
    // read committed with its plan settings. (Run outside a transaction block, the statement
    // would see the session's defaults: read committed, read-write, sequential scans on.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_statement_runs_inside_the_transaction_begun_with_it() {
        let db = PgCluster::shared().database().await;
        let store = PgStore::open(PgOptions::new(db.url())).await.expect("open");
        let read = store.read(|tx, _| where_am_i(tx)).await.expect("read");
        assert_eq!(read.0, "repeatable read");
        assert_eq!(read.1, "on", "a read is read-only");
        let write = store.write(|tx, _| where_am_i(tx)).await.expect("write");
        assert_eq!(write, ("read committed".into(), "off".into(), "off".into()));
    }

    // Proves statements sent together run in the order they were written, even when the first
    // must be prepared (a round trip of its own: its first use on the connection) and the second
    // was prepared already. Without turns the second reached the server first, and "lock the
    // job, then load it" could load it before the lock was granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn statements_sent_together_run_in_the_order_written() {
        const NOW_US: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint";
        const SLOW_NOW_US: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint \
             FROM pg_sleep(0.05)";
        let db = PgCluster::shared().database().await;
        let store = PgStore::open(PgOptions::new(db.url())).await.expect("open");
        let (first, second) = store
            .write(|tx, _| {
                Box::pin(async move {
                    query_one(tx, NOW_US, &[]).await?;
                    let (first, second) = futures::try_join!(
                        query_one(tx, SLOW_NOW_US, &[]),
                        query_one(tx, NOW_US, &[])
                    )?;
                    Ok((
                        get::<i64>(&first, 0, "first")?,
                        get::<i64>(&second, 0, "second")?,
                    ))
                })
            })
            .await
            .expect("write");
        assert!(
            first < second,
            "the second statement ran {} µs before the first",
            first - second
        );
    }

    // Proves a transaction abandoned half-way (its future dropped while it holds a row lock, as
    // when a client hangs up during a claim) never goes back to the pool: its connection is
    // closed, the server rolls back and releases the lock, and the next writes find every pooled
    // connection outside any transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_transaction_closes_its_connection() {
        let db = PgCluster::shared().database().await;
        let mut options = PgOptions::new(db.url());
        options.pool_size = 1;
        let store = PgStore::open(options).await.expect("open");
        let abandoned = store.write(|tx, _| {
            Box::pin(async move {
                tx.batch_execute(
                    "INSERT INTO settings (key, value, created_at) VALUES ('held', '1', 0)",
                )
                .await?;
                std::future::pending::<()>().await;
                Ok(())
            })
        });
        let timed_out = tokio::time::timeout(Duration::from_millis(300), abandoned).await;
        assert!(timed_out.is_err(), "the work never finishes");
        // With one pooled connection, this write would run inside the abandoned transaction (and
        // see its row) if that connection had gone back to the pool. The abandoned backend may
        // take a moment to hear its client hang up.
        let mut tries = 0;
        loop {
            let (in_block, held) = store
                .write(|tx, _| Box::pin(async move { leftovers(tx).await }))
                .await
                .expect("a write after the abandoned one");
            assert_eq!(held, 0, "a write ran inside the abandoned transaction");
            if in_block == 0 {
                break;
            }
            tries += 1;
            assert!(tries < 50, "a connection is left inside a transaction");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Other connections of this database inside a transaction and doing nothing, and whether
    /// the abandoned insert is visible.
    async fn leftovers(tx: &Transaction<'_>) -> crate::postgres::Res<(i64, i64)> {
        let row = query_one(
            tx,
            "SELECT count(*) FILTER (WHERE state = 'idle in transaction' \
               AND pid <> pg_backend_pid() AND datname = current_database()), \
             (SELECT count(*) FROM settings WHERE key = 'held') \
             FROM pg_stat_activity",
            &[],
        )
        .await?;
        Ok((
            get::<i64>(&row, 0, "in_block")?,
            get::<i64>(&row, 1, "held")?,
        ))
    }
}
