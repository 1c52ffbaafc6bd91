//! Retention end to end against a real server process: finished jobs removed once their
//! retention has passed (the settings' default for their state, or their own), never an
//! unfinished one, the idempotency key free again afterwards, and `overseer delete`.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn overseer(server: &Server, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .args(["--server", &server.url])
        .current_dir(workspace_root())
        .output()
        .expect("run overseer")
}

async fn gone(api: &Api, id: &str) -> bool {
    api.get(&format!("/v1/jobs/{id}")).await.0 == 404
}

// Proves through a real server with `[retention] succeeded = "2s"`: a succeeded job shows its
// `removable_at` and is removed by the leader after it, its idempotency key then creating a new
// job; a job with its own longer retention and an unfinished job with a 1 s retention stay; the
// removal is counted in the metrics; `overseer delete` removes a finished job at once and
// refuses an unfinished one (409, exit code 2) without touching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_are_removed_after_their_retention_and_only_they() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("overseer.toml");
    std::fs::write(
        &config,
        "[retention]\nsucceeded = \"2s\"\nfailed = \"1h\"\ncancelled = \"1h\"\n",
    )
    .unwrap();
    let server = Server::start_with(
        dir.path(),
        &[
            "--sweep-interval",
            "200ms",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let api = server.api();
    let _agent = Agent::start_with(
        &server,
        "kept",
        &["--concurrency", "4"],
        &["sh", "-c", "cat >/dev/null; echo 1"],
    );
    let quick = json!({"idempotency_key": "order-1", "steps": [{"name": "a", "agent": "kept"}]});
    let short = api.submit(&quick).await;
    let long = api
        .submit(&json!({"retention": "1h", "steps": [{"name": "a", "agent": "kept"}]}))
        .await;
    // Nobody serves `idle`: the job stays running, however short its retention.
    let active = api
        .submit(&json!({"retention": "1s", "steps": [{"name": "a", "agent": "idle"}]}))
        .await;
    let done = api.wait_terminal(&short).await;
    assert_eq!(done["state"], "succeeded");
    let finished = millis(&done["finished_at"]);
    assert_eq!(millis(&done["removable_at"]), finished + 2_000, "{done}");
    assert_eq!(api.wait_terminal(&long).await["state"], "succeeded");

    // The leader looks for removable jobs every 10 s while it finds none.
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !gone(&api, &short).await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "job {short} was not removed within 30 s");
    assert!(
        chrono::Utc::now().timestamp_millis() >= finished + 2_000,
        "removed before its retention passed"
    );
    assert_eq!(api.job(&long).await["state"], "succeeded");
    let still = api.job(&active).await;
    assert_eq!(still["state"], "running", "{still}");
    assert!(still["removable_at"].is_null(), "{still}");

    // The key is free once its job is gone: the same request creates a new job.
    let again = api.submit(&quick).await;
    assert_ne!(again, short);
    let (_, metrics) = api.get("/metrics").await;
    let pruned = metric(&metrics, "overseer_jobs_pruned_total");
    assert!(pruned >= 1.0, "overseer_jobs_pruned_total = {pruned}");

    let out = overseer(&server, &["delete", &long]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(gone(&api, &long).await);
    let out = overseer(&server, &["delete", &active]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("409") || stderr.contains("not finished"),
        "{stderr}"
    );
    assert_eq!(api.job(&active).await["state"], "running");
}

fn metric(text: &Value, name: &str) -> f64 {
    let text = text.as_str().expect("metrics are text");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics"))
}
