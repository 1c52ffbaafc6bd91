//! SQLite's page cache and allocator as the store installs them: a test process of its own, so
//! that the store opens before anything else initialises SQLite (neither can be replaced after).

use overseer_store::sqlite::SqliteStore;
use rusqlite::Connection;

/// A tiny deterministic generator: row keys in scattered order, so balances take freelist pages
/// out of order and swap their numbers.
fn keys(seed: u64, n: usize) -> Vec<i64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 2) as i64
        })
        .collect()
}

// Rows removed and written again reuse freed pages, the way removing finished jobs does under a
// steady load. The commits after each page swap must not walk the whole cache, and the file must
// come out intact, rolled-back appends included (their pages are truncated from the cache).
#[test]
fn commits_after_page_swaps_skip_the_cache_walk_and_lose_nothing() {
    let (_store, dir) = SqliteStore::open_temp(20).expect("the store opens first");
    let conn = Connection::open(dir.path().join("churn.db")).expect("open");
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA cache_size = -4096; \
         CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB); CREATE INDEX t_v ON t (v);",
    )
    .expect("schema");
    let before = SqliteStore::page_cache_scans_avoided();
    for round in 0..6u64 {
        for chunk in keys(round + 1, 6_000).chunks(200) {
            let tx = conn.unchecked_transaction().expect("begin");
            for k in chunk {
                tx.execute("INSERT OR REPLACE INTO t VALUES (?1, randomblob(180))", [k])
                    .expect("insert");
            }
            tx.commit().expect("commit");
        }
        conn.execute("DELETE FROM t WHERE k % 3 <> ?1", [(round % 3) as i64])
            .expect("delete");
        // An append that is rolled back: its pages lie past the end of the file.
        conn.execute_batch(
            "SAVEPOINT s; \
             INSERT INTO t SELECT k + 4611686018427387904, randomblob(3000) FROM t LIMIT 300; \
             ROLLBACK TO s; RELEASE s;",
        )
        .expect("rolled-back append");
    }
    let avoided = SqliteStore::page_cache_scans_avoided() - before;
    assert!(
        avoided > 0,
        "no commit after a page swap skipped the cache walk"
    );
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("check");
    assert_eq!(check, "ok");
    let huge: i64 = conn
        .query_row(
            "SELECT count(*) FROM t WHERE k >= 4611686018427387904",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(huge, 0, "rows of the rolled-back append are visible");
    // The same rows read through a fresh connection (a cache of its own) as through this one.
    let sum = |c: &Connection| -> (i64, i64) {
        c.query_row("SELECT count(*), total(length(v)) FROM t", [], |r| {
            Ok((r.get(0)?, r.get::<_, f64>(1)? as i64))
        })
        .expect("sum")
    };
    let other = Connection::open(dir.path().join("churn.db")).expect("open");
    assert_eq!(sum(&conn), sum(&other));
}

// SQLite's allocations go to the server's allocator, not the C library's.
#[test]
fn sqlite_allocates_from_mimalloc() {
    let (_store, _dir) = SqliteStore::open_temp(20).expect("the store opens first");
    assert!(SqliteStore::sqlite_allocates_from_mimalloc());
}
