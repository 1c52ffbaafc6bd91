//! HTTPS and the listener's bounds, end to end: a self-signed certificate made for the test,
//! the CLI and command agents trusting it with `--ca-cert`, and slow clients cut off.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A self-signed certificate for 127.0.0.1 and localhost, written as PEM files in `dir`.
fn self_signed(dir: &std::path::Path) -> (String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a certificate");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert.display().to_string(), key.display().to_string())
}

// Proves the HTTPS walkthrough: a server with `--tls-cert/--tls-key`, command agents and
// `submit --wait` over https:// with `--ca-cert` run the README's job to success; without the
// certificate trusted, the CLI refuses the server's certificate, in one line.
#[test]
fn the_walkthrough_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let server = Server::start_with(dir.path(), &["--tls-cert", &cert, "--tls-key", &key]);
    let url = server.url.replace("http://", "https://");
    let root = workspace_root();
    let _agents = Agent::walkthrough(&server, &url, &["--ca-cert", &cert]);
    let out = Command::new(BIN)
        .args(["submit", "examples/provision-site.json", "--wait"])
        .args(["--server", &url, "--ca-cert", &cert])
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refused = Command::new(BIN)
        .args(["jobs", "--server", &url])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.to_lowercase().contains("certificate"), "{stderr}");
}

// Proves slow clients cannot hold the server: 50 connections that send half a request and then
// nothing are closed once the header read timeout (1 s here) passes, while a normal client is
// answered meanwhile (its latency is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--header-read-timeout", "1s"]);
    let addr = format!("127.0.0.1:{}", server.port);
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        slow.push(s);
    }
    let started = Instant::now();
    let (status, _) = server.api().get("/v1/jobs").await;
    eprintln!(
        "a normal request with 50 slow clients open: {:?}",
        started.elapsed()
    );
    assert_eq!(status, 200);
    let cut = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        for s in &mut slow {
            let mut buf = [0u8; 512];
            // The server either closes (0) or answers 408 and closes.
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
            }
        }
        started.elapsed()
    })
    .await
    .unwrap();
    assert!(
        cut < Duration::from_secs(8),
        "slow connections held for {cut:?}"
    );
}

// Proves long-polls are bounded per node: with `limits.long_polls = 2`, two waiting lease
// requests are held and a third is answered at once with 429 and `Retry-After`, while ordinary
// calls go on; once the two end, a long-poll is accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_are_bounded_per_node() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("overseer.toml");
    std::fs::write(&config, "[limits]\nlong_polls = 2\n").unwrap();
    let server = Server::start_with(dir.path(), &["--config", config.to_str().unwrap()]);
    let http = reqwest::Client::new();
    let poll = |wait: &'static str| {
        let (http, url) = (http.clone(), server.url.clone());
        async move {
            http.post(format!("{url}/v1/agents/idle/leases"))
                .json(&serde_json::json!({"worker": "w", "wait": wait}))
                .send()
                .await
                .unwrap()
        }
    };
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(poll("2s"))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = poll("2s").await;
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let (status, _) = server.api().get("/v1/jobs").await;
    assert_eq!(status, 200, "ordinary calls go on");
    for h in held {
        assert_eq!(h.await.unwrap().status().as_u16(), 200);
    }
    assert_eq!(poll("10ms").await.status().as_u16(), 200);
}

// Proves the Faktory listener speaks TLS with the same certificate (`tcp+tls://` in Faktory
// clients): a client trusting the certificate shakes hands, gets `HI`, says `HELLO`, pushes a
// job, and the job is there over HTTPS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faktory_over_tls() {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};

    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let faktory_port = free_port();
    let faktory = format!("127.0.0.1:{faktory_port}");
    let server = Server::start_with(
        dir.path(),
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--faktory-listen",
            &faktory,
        ],
    );
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(&faktory).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let mut conn = BufReader::new(tls);
    let mut line = String::new();
    conn.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("+HI "), "{line}");
    conn.get_mut()
        .write_all(b"HELLO {\"v\":2}\r\n")
        .await
        .unwrap();
    line.clear();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line, "+OK\r\n");
    let push = r#"PUSH {"jid":"tls-jid-000001","jobtype":"add","args":[1,2],"queue":"math"}"#;
    conn.get_mut()
        .write_all(format!("{push}\r\n").as_bytes())
        .await
        .unwrap();
    line.clear();
    conn.read_line(&mut line).await.unwrap();
    assert_eq!(line, "+OK\r\n");
    let https = server.url.replace("http://", "https://");
    let out = std::process::Command::new(BIN)
        .args([
            "jobs",
            "--label",
            "faktory_jid:tls-jid-000001",
            "--output",
            "json",
        ])
        .args(["--server", &https, "--ca-cert", &cert])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && listed.contains("tls-jid-000001"),
        "{listed}"
    );
}

// Proves the Faktory Python client works over TLS: scripts/test-faktory-python-tls.sh installs
// the published `faktory` package (pinned) into a venv and runs a producer and a worker against
// `--faktory-listen` with `--tls-cert/--tls-key` over tcp+tls://, once as published (encrypted,
// the package checks no certificate) and once with the certificate verified against the CA
// file; a CA that did not sign the certificate is refused. Both jobs must end succeeded here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faktory_python_client_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let other = tempfile::tempdir().unwrap();
    let (wrong_ca, _) = self_signed(other.path());
    let faktory = format!("127.0.0.1:{}", free_port());
    let tls = ["--tls-cert", &cert, "--tls-key", &key];
    let server = Server::start_with(
        dir.path(),
        &[&tls[..], &["--faktory-listen", &faktory]].concat(),
    );
    let out = Command::new("bash")
        .arg(workspace_root().join("scripts/test-faktory-python-tls.sh"))
        .env("FAKTORY_URL", format!("tcp+tls://{faktory}"))
        .env("FAKTORY_CA", &cert)
        .env("FAKTORY_WRONG_CA", &wrong_ca)
        .output()
        .expect("run scripts/test-faktory-python-tls.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the Python client failed (see above)");
    assert!(stdout.contains("wrong CA: refused"), "{stdout}");
    let https = server.url.replace("http://", "https://");
    let mut jids = vec!["py-tls-verified-0001"];
    if stdout.contains("stock (encrypted") {
        jids.push("py-tls-stock-0001");
    }
    for jid in jids {
        let out = Command::new(BIN)
            .args(["jobs", "--label", &format!("faktory_jid:{jid}")])
            .args(["--output", "json", "--server", &https, "--ca-cert", &cert])
            .output()
            .unwrap();
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        let jobs = listed["jobs"].as_array().expect("a job list");
        assert_eq!(jobs.len(), 1, "{jid}: {listed}");
        assert_eq!(jobs[0]["state"], "succeeded", "{jid}: {listed}");
    }
}
