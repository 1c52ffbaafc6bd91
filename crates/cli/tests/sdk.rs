//! The Rust agent SDK against a real server process: handlers registered per agent name run a
//! DAG, receive their dependencies' results, and a handler that overruns its lease is dropped
//! without reporting while another attempt takes over.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use overseer_agent::{Client, StepContext, StepError, Worker};
use serde_json::json;
use tokio_util::sync::CancellationToken;

// Proves SDK agents run a diamond DAG end to end: inputs carry dependency results, the
// idempotency key is stable, and a fatal error fails the job without retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_agents_run_a_dag() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = Client::new(&server.url, None).unwrap();
    let worker = Worker::builder(client.clone())
        .worker_id("sdk-test")
        .concurrency(4)
        .handler("math", |ctx: StepContext| async move {
            let payload = ctx.payload().clone();
            match payload["op"].as_str() {
                Some("const") => Ok(json!(payload["value"].as_i64().unwrap())),
                Some("sum") => {
                    let total: i64 = ctx.inputs().values().map(|v| v.as_i64().unwrap_or(0)).sum();
                    Ok(json!(total))
                }
                Some("key") => Ok(json!(ctx.idempotency_key())),
                _ => Err(StepError::fatal("unknown op")),
            }
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    let api = server.api();
    let id = api
        .submit(&json!({"steps": [
            {"name": "a", "agent": "math", "payload": {"op": "const", "value": 2}},
            {"name": "b", "agent": "math", "depends_on": ["a"], "payload": {"op": "const", "value": 3}},
            {"name": "c", "agent": "math", "depends_on": ["a"], "payload": {"op": "const", "value": 4}},
            {"name": "d", "agent": "math", "depends_on": ["b", "c"], "payload": {"op": "sum"}},
            {"name": "k", "agent": "math", "payload": {"op": "key"}}
        ]}))
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(step(&job, "d")["result"], 7);
    assert_eq!(step(&job, "k")["result"], format!("{id}/k"));

    let bad = api
        .submit(&json!({"steps": [{"name": "x", "agent": "math", "payload": {"op": "nope"}}]}))
        .await;
    let job = api.wait_terminal(&bad).await;
    assert_eq!(job["state"], "failed");
    assert_eq!(
        step(&job, "x")["attempt"],
        1,
        "a fatal error is not retried"
    );
    assert_eq!(step(&job, "x")["last_error"], "unknown op");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap();
}

// Proves the SDK never reports after its lease ends: the server is frozen (SIGSTOP) past the
// step's timeout, so the first attempt's heartbeats go unanswered; the SDK drops that handler at
// its own deadline without reporting, the supervisor requeues the step once the server thaws,
// and the second attempt's result is the one recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_that_loses_its_lease_never_reports() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = Client::new(&server.url, None).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let dropped = Arc::new(AtomicU32::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let (seen, gone, first_started) = (calls.clone(), dropped.clone(), started.clone());
    let worker = Worker::builder(client)
        .worker_id("frozen-out")
        .handler("slow", move |ctx: StepContext| {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            let guard = DropFlag(gone.clone(), false);
            let first_started = first_started.clone();
            async move {
                let mut guard = guard;
                if n == 1 {
                    first_started.notify_one();
                    tokio::time::sleep(Duration::from_secs(20)).await;
                }
                guard.1 = true;
                Ok(json!({"attempt": ctx.attempt()}))
            }
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let api = server.api();
    let id = api
        .submit(
            &json!({"steps": [{"name": "s", "agent": "slow", "timeout": "1500ms",
            "backoff": {"initial": "100ms", "max": "100ms"}}]}),
        )
        .await;
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("first attempt started");
    signal(server.pid(), "STOP");
    wait_for("the SDK to drop the first attempt", || {
        let d = dropped.clone();
        async move { (d.load(Ordering::SeqCst) >= 1).then_some(()) }
    })
    .await;
    signal(server.pid(), "CONT");
    let job = api.wait_terminal(&id).await;
    let s = step(&job, "s");
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(s["attempt"], 2, "{job}");
    assert_eq!(
        s["result"]["attempt"], 2,
        "the recorded result is the live attempt's: {job}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .unwrap()
        .unwrap();
}

/// Counts futures dropped before they finished.
struct DropFlag(Arc<AtomicU32>, bool);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A counter's value in the server's metrics text.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

// Proves the SDK batches reports under load without losing or doubling any: a burst of no-op
// steps ends with every job succeeded once, at least some reports arrived in batch calls, and
// every report the server counted was accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_steps_is_reported_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let jobs: Vec<_> = (0..400)
        .map(|i| json!({"steps": [{"name": "s", "agent": "burst", "payload": i}]}))
        .collect();
    let mut ids = Vec::new();
    for chunk in jobs.chunks(200) {
        let (status, body) = api.post("/v1/jobs:batch", &json!({ "jobs": chunk })).await;
        assert_eq!(status, 202, "{body}");
        ids.extend(
            body["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_string()),
        );
    }
    let runs = Arc::new(AtomicU32::new(0));
    let client = Client::new(&server.url, None).unwrap();
    let counted = runs.clone();
    let worker = Worker::builder(client)
        .concurrency(64)
        .handler("burst", move |ctx: StepContext| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(ctx.payload().clone())
            }
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    for id in &ids {
        let job = api.wait_terminal(id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(step(&job, "s")["attempt"], 1, "{job}");
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 400, "each step ran once");

    let (_, text) = api.get("/metrics").await;
    let text = text.as_str().unwrap().to_string();
    let batches = counter(&text, "overseer_report_batches_total");
    let batched = counter(&text, "overseer_reports_batched_total");
    let ok = counter(
        &text,
        "overseer_reports_total{report=\"complete\",outcome=\"ok\"}",
    );
    assert_eq!(ok, 400, "every completion accepted once:\n{text}");
    assert!(batches > 0, "no batch report calls:\n{text}");
    assert!(batched >= 2 * batches, "batches carry several reports");
    eprintln!("{batched} of 400 reports came in {batches} batch calls");
}
