//! The PostgreSQL store over TLS. Uses the machine's own PostgreSQL server on 127.0.0.1:5432
//! (the test suite's throw-away clusters run without TLS), which Debian's package starts with
//! `ssl = on` and a self-signed certificate: `sslmode=require` must encrypt every connection of
//! the store. A server without TLS fails this test with a message saying so.

#![cfg(feature = "testing")]

use overseer_store::conformance::{admitted, at, job_id, spec};
use overseer_store::postgres::PgOptions;
use overseer_store::prelude::*;
use overseer_store::PgStore;
use serde_json::json;
use tokio_postgres::NoTls;

const SERVER: &str = "postgres://postgres@127.0.0.1:5432";

// Proves `sslmode=require` in the store URL makes every connection of the store (the pool and
// the LISTEN connection) use TLS, and that the store works over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_encrypts_every_connection() {
    let name = format!("overseer_tls_{}", std::process::id());
    let (admin, conn) = tokio_postgres::connect(&format!("{SERVER}/postgres"), NoTls)
        .await
        .expect("the local PostgreSQL server on 127.0.0.1:5432");
    tokio::spawn(conn);
    for sql in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin.batch_execute(&sql).await.unwrap();
    }
    let url = format!("{SERVER}/{name}?sslmode=require&application_name=overseer-tls-test");
    let store = PgStore::open(PgOptions::new(url))
        .await
        .unwrap_or_else(|e| {
            panic!("cannot open the store over TLS (is ssl = on on 127.0.0.1:5432?): {e}")
        });
    let job = spec(json!({"steps": [{"name": "s", "agent": "a"}]}));
    store
        .jobs_submit(vec![admitted(job_id(1), &job, at(0))])
        .await
        .expect("submit over TLS");
    assert!(store.job_get(job_id(1)).await.unwrap().is_some());
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
             WHERE a.datname = $1 AND a.application_name = 'overseer-tls-test'",
            &[&name],
        )
        .await
        .unwrap();
    let encrypted: Vec<bool> = rows.iter().map(|r| r.get(0)).collect();
    assert!(!encrypted.is_empty(), "the store holds connections");
    assert!(
        encrypted.iter().all(|e| *e),
        "every connection uses TLS: {encrypted:?}"
    );
    drop(store);
    let _ = admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await;
}
