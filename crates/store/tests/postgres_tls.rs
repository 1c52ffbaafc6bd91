//! The PostgreSQL store over TLS. Uses the machine's own PostgreSQL server on 127.0.0.1:5432
//! (the test suite's throw-away clusters run without TLS), which Debian's package starts with
//! `ssl = on` and a self-signed certificate: `sslmode=require` must encrypt every connection of
//! the store. A server without TLS fails this test with a message saying so.
//!
//! `sslmode=verify-full` is shown against a private cluster of the test's own (pgtest), turned
//! to `ssl = on` with a CA and a server certificate for `localhost` made here.

#![cfg(feature = "testing")]

use overseer_store::conformance::{admitted, at, job_id, spec};
use overseer_store::pgtest::PgCluster;
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

/// A CA and a server certificate it signed for `localhost` only: (CA PEM, cert PEM, key PEM).
fn ca_and_server_cert(ca_name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), leaf.pem(), key.serialize_pem())
}

/// Writes the server's certificate and key where the cluster's user can read them (the key
/// private to it, as PostgreSQL demands) and returns their paths.
fn install_server_cert(dir: &std::path::Path, cert: &str, key: &str) -> (String, String) {
    use std::os::unix::fs::PermissionsExt as _;
    let (cert_path, key_path) = (dir.join("server.crt"), dir.join("server.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // As root the cluster runs as `postgres` (see pgtest), which must own the key.
    let root = std::process::Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&root.stdout).trim() == "0" {
        let chown = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(chown.success(), "chown postgres {}", dir.display());
    }
    let path = |p: std::path::PathBuf| p.display().to_string();
    (path(cert_path), path(key_path))
}

/// Turns TLS on in a running cluster (the ssl settings take a reload, not a restart) and waits
/// until new connections see it.
async fn turn_ssl_on(admin: &tokio_postgres::Client, cert: &str, key: &str) {
    for sql in [
        format!("ALTER SYSTEM SET ssl_cert_file = '{cert}'"),
        format!("ALTER SYSTEM SET ssl_key_file = '{key}'"),
        "ALTER SYSTEM SET ssl = on".to_string(),
        "SELECT pg_reload_conf()".to_string(),
    ] {
        admin.batch_execute(&sql).await.unwrap();
    }
    for _ in 0..100 {
        let row = admin.query_one("SHOW ssl", &[]).await.unwrap();
        if row.get::<_, String>(0) == "on" {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the cluster did not turn ssl on (is the key readable by its user?)");
}

// Proves `sslmode=verify-full` checks who answers, against a live server with a certificate made
// here: with the CA that signed it and the host name in it (`localhost`) the store opens, works,
// and pg_stat_ssl shows its connections encrypted; with another CA, or with a host name the
// certificate does not name (127.0.0.1), opening fails with a certificate error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_verify_full_checks_the_ca_and_the_host_name() {
    let cluster = PgCluster::start_private().expect("a private PostgreSQL cluster");
    let (admin, conn) = tokio_postgres::connect(&cluster.url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = ca_and_server_cert("overseer test CA");
    let (cert_path, key_path) = install_server_cert(dir.path(), &cert, &key);
    turn_ssl_on(&admin, &cert_path, &key_path).await;
    let (other_ca, _, _) = ca_and_server_cert("some other CA");
    let (ca_path, other_path) = (dir.path().join("ca.pem"), dir.path().join("other-ca.pem"));
    std::fs::write(&ca_path, ca).unwrap();
    std::fs::write(&other_path, other_ca).unwrap();
    let port = cluster
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let url = |host: &str, root: &std::path::Path| {
        format!(
            "postgres://postgres@{host}:{port}/postgres?sslmode=verify-full&sslrootcert={}\
             &application_name=overseer-verify-full",
            root.display()
        )
    };

    let store = PgStore::open(PgOptions::new(url("localhost", &ca_path)))
        .await
        .unwrap_or_else(|e| panic!("verify-full with the right CA and host: {e}"));
    let job = spec(json!({"steps": [{"name": "s", "agent": "a"}]}));
    store
        .jobs_submit(vec![admitted(job_id(1), &job, at(0))])
        .await
        .unwrap();
    assert!(store.job_get(job_id(1)).await.unwrap().is_some());
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
             WHERE a.application_name = 'overseer-verify-full'",
            &[],
        )
        .await
        .unwrap();
    let encrypted: Vec<bool> = rows.iter().map(|r| r.get(0)).collect();
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|e| *e),
        "{encrypted:?}"
    );
    drop(store);

    for (what, bad) in [
        ("another CA", url("localhost", &other_path)),
        (
            "a host name not in the certificate",
            url("127.0.0.1", &ca_path),
        ),
    ] {
        let err = match PgStore::open(PgOptions::new(bad)).await {
            Ok(_) => panic!("verify-full accepted {what}"),
            Err(e) => e.to_string(),
        };
        eprintln!("verify-full with {what}: {err}");
        assert!(err.to_lowercase().contains("certificate"), "{what}: {err}");
    }
}
