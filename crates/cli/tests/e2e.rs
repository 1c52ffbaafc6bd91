//! End-to-end tests: a real `overseer server` process on a temp SQLite file, real command agents,
//! real HTTP on loopback. Each test waits on conditions with generous bounds, never on timing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

// Proves the README walkthrough works: the example provisioning job succeeds with the shipped
// shell agents, its two middle steps overlap in time, and the last step starts after both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walkthrough_job_succeeds_with_parallel_steps() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let root = workspace_root();
    let _agents = Agent::walkthrough(&server, &server.url, &[]);
    let out = std::process::Command::new(BIN)
        .args([
            "submit",
            "examples/provision-site.json",
            "--wait",
            "--server",
            &server.url,
        ])
        .current_dir(&root)
        .output()
        .expect("run overseer submit");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "submit --wait failed: {stderr}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        stderr.contains("step_succeeded"),
        "progress shows steps: {stderr}"
    );

    let job = server.api().job(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let (dns, storage, deploy) = (
        step(&job, "provision-dns"),
        step(&job, "provision-storage"),
        step(&job, "deploy-site"),
    );
    let (dns_start, dns_end) = (millis(&dns["started_at"]), millis(&dns["finished_at"]));
    let (st_start, st_end) = (
        millis(&storage["started_at"]),
        millis(&storage["finished_at"]),
    );
    assert!(
        dns_start < st_end && st_start < dns_end,
        "dns and storage overlap in time: {job}"
    );
    assert!(
        millis(&deploy["started_at"]) >= dns_end.max(st_end),
        "deploy starts after both: {job}"
    );
    assert_eq!(deploy["result"]["status"], "live");
    let account = step(&job, "create-account");
    assert!(account["result"]["account_id"]
        .as_str()
        .unwrap()
        .starts_with("acct-"));

    // The YAML form of the same job is accepted too.
    let out = std::process::Command::new(BIN)
        .args([
            "submit",
            "examples/provision-site.yaml",
            "--wait",
            "--server",
            &server.url,
        ])
        .current_dir(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// Proves that killing the server (SIGKILL) while a step runs loses nothing: after a restart on
// the same store the agent's completion is accepted and the job finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_mid_job_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let marker = dir.path().join("slow-started");
    let script = format!(
        "cat >/dev/null; touch {}; sleep 3; echo '\"slow done\"'",
        marker.display()
    );
    let _slow = Agent::start(&server, "slow", &script);
    let _fast = Agent::start(&server, "fast", "cat >/dev/null; echo '\"fast done\"'");
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [
            {"name": "first", "agent": "slow", "timeout": "20s"},
            {"name": "second", "agent": "fast", "depends_on": ["first"]}
        ]}))
        .await;
    wait_for("the slow step to start", || {
        let m = marker.clone();
        async move { m.exists().then_some(()) }
    })
    .await;
    server.restart();
    let job = server.api().wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        step(&job, "first")["attempt"],
        1,
        "the running attempt survived the restart: {job}"
    );
    assert_eq!(step(&job, "second")["result"], "fast done");
}

/// Starts `overseer submit SPEC --wait --output json` against `server`, the spec written to a file.
fn submit_wait(server: &Server, dir: &std::path::Path, spec: &Value) -> std::process::Child {
    let file = dir.join("spec.json");
    std::fs::write(&file, spec.to_string()).unwrap();
    std::process::Command::new(BIN)
        .args([
            "submit",
            file.to_str().unwrap(),
            "--wait",
            "--output",
            "json",
        ])
        .args(["--server", &server.url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run overseer submit --wait")
}

// Proves `submit --wait` outlives the server it follows: the server is killed (SIGKILL) and
// restarted mid-job, the command reconnects and still ends with the job's outcome (exit 0), and
// with `--output json` its stdout is one JSON document, the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_reconnects_after_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let marker = dir.path().join("slow-started");
    let script = format!(
        "cat >/dev/null; touch {}; sleep 2; echo '\"done\"'",
        marker.display()
    );
    let _slow = Agent::start(&server, "slow", &script);
    let waiter = submit_wait(
        &server,
        dir.path(),
        &json!({"steps": [{"name": "only", "agent": "slow", "timeout": "20s"}]}),
    );
    wait_for("the step to start", || {
        let m = marker.clone();
        async move { m.exists().then_some(()) }
    })
    .await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart();
    let out = tokio::task::spawn_blocking(move || waiter.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    let job: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {:?}", out.stdout));
    assert_eq!(job["state"], "succeeded", "{job}");
}

// Proves `submit --wait` does not hang on a job that goes `blocked`: it exits 3 and prints the
// operator commands that apply to it (retry or skip the failed step, resume, cancel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_exits_3_with_the_operator_commands_when_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let _broken = Agent::start(&server, "broken", "cat >/dev/null; exit 1");
    let waiter = submit_wait(
        &server,
        dir.path(),
        &json!({"on_failure": "hold",
                "steps": [{"name": "fragile", "agent": "broken", "max_attempts": 1}]}),
    );
    let out = tokio::task::spawn_blocking(move || waiter.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let job: Value = serde_json::from_slice(&out.stdout).expect("stdout is the job as JSON");
    assert_eq!(job["state"], "blocked", "{job}");
    let id = job["id"].as_str().unwrap();
    for command in [
        format!("overseer retry {id} fragile"),
        format!("overseer skip {id} fragile"),
        format!("overseer resume {id}"),
        format!("overseer cancel {id}"),
    ] {
        assert!(stderr.contains(&command), "missing `{command}`:\n{stderr}");
    }
}

// Proves recovery from a dead agent: after SIGKILL mid-step, the step is leased again once its
// timeout passes (plus at most one sweep), runs on another agent, and the job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_step_runs_again_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let marker = dir.path().join("doomed-started");
    let mut doomed = Agent::start(
        &server,
        "work",
        &format!("cat >/dev/null; touch {}; sleep 60", marker.display()),
    );
    let id = api
        .submit(
            &json!({"steps": [{"name": "only", "agent": "work", "timeout": "2s",
            "backoff": {"initial": "100ms"}}]}),
        )
        .await;
    wait_for("the first attempt to start", || {
        let m = marker.clone();
        async move { m.exists().then_some(()) }
    })
    .await;
    doomed.kill();
    let killed_at = Instant::now();
    let _healthy = Agent::start(&server, "work", "cat >/dev/null; echo '{\"ok\": true}'");
    let job = api.wait_terminal(&id).await;
    let recovered_in = killed_at.elapsed();
    assert_eq!(job["state"], "succeeded", "{job}");
    let s = step(&job, "only");
    assert_eq!(s["attempt"], 2, "{job}");
    assert_eq!(s["failures"], 1, "{job}");
    let kinds: Vec<String> = api
        .events(&id)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(
        kinds.contains(&"step_lease_expired".to_string()),
        "{kinds:?}"
    );
    eprintln!("recovered {recovered_in:?} after the kill (timeout 2s, sweep 200ms)");
}

// Proves a command dies with its agent: `kill -9` of `overseer agent` alone (not its process
// group) takes down the running command and the process the command started, at once, so the
// attempt that runs after the lease expires never overlaps a leftover of this one (guarantee 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dies_with_its_killed_agent() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let pids = dir.path().join("pids");
    let mut agent = Agent::start(
        &server,
        "slow",
        &format!(
            "cat >/dev/null; echo $$ >> {p}; sleep 300 & echo $! >> {p}; wait",
            p = pids.display()
        ),
    );
    api.submit(&json!({"steps": [{"name": "only", "agent": "slow", "timeout": "60s"}]}))
        .await;
    let started: Vec<u32> = wait_for("the command and its child to start", || {
        let pids = pids.clone();
        async move {
            let text = std::fs::read_to_string(&pids).unwrap_or_default();
            let v: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            (v.len() == 2).then_some(v)
        }
    })
    .await;
    assert!(started.iter().all(|&p| process_alive(p)), "{started:?}");
    agent.kill_only();
    let survivors = wait_for("the command's processes to die", || {
        let started = started.clone();
        async move {
            let alive: Vec<u32> = started.into_iter().filter(|&p| process_alive(p)).collect();
            alive.is_empty().then_some(alive)
        }
    })
    .await;
    assert!(survivors.is_empty());
}

async fn lease(api: &Api, agent: &str) -> Value {
    let (status, body) = api
        .post(
            &format!("/v1/agents/{agent}/leases"),
            &json!({"worker": "t", "wait": "10s"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let leases = body["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{body}");
    leases[0].clone()
}

// Proves fencing: a completion for an expired attempt, and for a superseded one, answers 409 and
// changes nothing; the live attempt's completion still lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_completions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api
        .submit(
            &json!({"steps": [{"name": "s", "agent": "fenced", "timeout": "500ms",
            "backoff": {"initial": "100ms", "max": "100ms"}}]}),
        )
        .await;
    let first = lease(&api, "fenced").await;
    assert_eq!(first["attempt"], 1);
    assert_eq!(first["idempotency_key"], format!("{id}/s"));
    let lease_id = first["lease_id"].as_str().unwrap().to_string();

    // Let the lease expire; the supervisor requeues the step.
    let job_after_expiry = wait_for("the lease to expire", || {
        let api = api.clone();
        let id = id.clone();
        async move {
            let job = api.job(&id).await;
            (step(&job, "s")["state"] == "ready").then_some(job)
        }
    })
    .await;
    let (status, body) = api
        .post(
            &format!("/v1/leases/{lease_id}/complete"),
            &json!({"result": "late"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["status"], 409);
    let (status, _) = api
        .post(&format!("/v1/leases/{lease_id}/heartbeat"), &json!({}))
        .await;
    assert_eq!(status, 409);
    let unchanged = api.job(&id).await;
    // `waiting_reason` is read off the clock (backoff until …, then ready), so it may move
    // between the two reads; every stored field must not.
    let stored = |job: &Value| {
        let mut step = step(job, "s").clone();
        step.as_object_mut()
            .expect("a step is an object")
            .remove("waiting_reason");
        step
    };
    assert_eq!(
        stored(&unchanged),
        stored(&job_after_expiry),
        "a refused report changes nothing"
    );

    // A second attempt supersedes the first: the first's report is still refused.
    let second = lease(&api, "fenced").await;
    assert_eq!(second["attempt"], 2);
    assert_eq!(
        second["idempotency_key"], first["idempotency_key"],
        "stable across attempts"
    );
    let (status, _) = api
        .post(
            &format!("/v1/leases/{lease_id}/complete"),
            &json!({"result": "late"}),
        )
        .await;
    assert_eq!(status, 409);
    let (status, _) = api
        .post(
            &format!("/v1/leases/{lease_id}/fail"),
            &json!({"error": "late"}),
        )
        .await;
    assert_eq!(status, 409);
    let running = api.job(&id).await;
    assert_eq!(step(&running, "s")["state"], "running");
    assert_eq!(step(&running, "s")["attempt"], 2);

    let second_id = second["lease_id"].as_str().unwrap();
    let (status, body) = api
        .post(
            &format!("/v1/leases/{second_id}/complete"),
            &json!({"result": "fresh"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let done = api.job(&id).await;
    assert_eq!(done["state"], "succeeded");
    assert_eq!(step(&done, "s")["result"], "fresh");

    // An unknown lease is 404, a malformed one 400.
    let (status, _) = api
        .post(
            "/v1/leases/00000000-0000-4000-8000-000000000000/complete",
            &json!({}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, body) = api.post("/v1/leases/nope/complete", &json!({})).await;
    assert_eq!(status, 400);
    assert_eq!(body["field"], "lease_id");
}

// Proves a batch report is fenced report by report: completions and failures of live leases
// land, while an unknown lease, a second report of one lease and an oversized result are each
// refused with the status their own call would get, and leave everything else untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_reports_are_fenced_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let spec = json!({"steps": [{"name": "s", "agent": "batched", "max_attempts": 1}]});
    let (a, b, c) = (
        api.submit(&spec).await,
        api.submit(&spec).await,
        api.submit(&spec).await,
    );
    let mut leases = std::collections::HashMap::new();
    for _ in 0..3 {
        let l = lease(&api, "batched").await;
        leases.insert(
            l["job_id"].as_str().unwrap().to_string(),
            l["lease_id"].as_str().unwrap().to_string(),
        );
    }
    let (la, lb, lc) = (&leases[&a], &leases[&b], &leases[&c]);
    let unknown = "00000000-0000-4000-8000-000000000000";
    let huge = "x".repeat(300 << 10);
    let (status, body) = api
        .post(
            "/v1/leases:report",
            &json!({"reports": [
                {"outcome": "complete", "lease_id": la, "result": {"ok": 1}},
                {"outcome": "fail", "lease_id": lb, "error": "nope", "retryable": false},
                {"outcome": "complete", "lease_id": unknown},
                {"outcome": "complete", "lease_id": la, "result": "again"},
                {"outcome": "complete", "lease_id": lc, "result": huge},
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![200, 200, 404, 409, 413], "{body}");
    assert_eq!(results[0]["job_state"], "succeeded");
    assert_eq!(results[1]["job_state"], "failed");
    assert_eq!(results[4]["problem"]["field"], "reports[4].result");
    assert_eq!(results[3]["lease_id"], la.as_str());

    assert_eq!(step(&api.job(&a).await, "s")["result"], json!({"ok": 1}));
    assert_eq!(step(&api.job(&b).await, "s")["last_error"], "nope");
    let still = api.job(&c).await;
    assert_eq!(step(&still, "s")["state"], "running", "{still}");
    // Its lease is still good for a proper report.
    let (status, body) = api
        .post(
            &format!("/v1/leases/{lc}/complete"),
            &json!({"result": "small"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Malformed batches are refused as a whole, naming the field.
    for (bad, field) in [
        (json!({"reports": []}), "reports"),
        (
            json!({"reports": [{"outcome": "done", "lease_id": unknown}]}),
            "reports[0]",
        ),
        (
            json!({"reports": [{"outcome": "complete", "lease_id": "nope"}]}),
            "reports[0]",
        ),
        (
            json!({"reports": [{"outcome": "fail", "lease_id": unknown}]}),
            "reports[0]",
        ),
    ] {
        let (status, body) = api.post("/v1/leases:report", &bad).await;
        assert_eq!(status, 400, "{bad} -> {body}");
        assert!(
            body["field"].as_str().is_some_and(|f| f.starts_with(field)),
            "{bad} -> {body}"
        );
    }
    let too_many: Vec<Value> = (0..101)
        .map(|_| json!({"outcome": "complete", "lease_id": unknown}))
        .collect();
    let (status, body) = api
        .post("/v1/leases:report", &json!({ "reports": too_many }))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["field"], "reports");
}

// Proves retry accounting: a step that always fails ends `failed` after exactly max_attempts
// attempts, with the growing backoff recorded in the job's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_failing_step_fails_after_max_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let _agent = Agent::start(
        &server,
        "broken",
        "cat >/dev/null; echo 'disk on fire' >&2; exit 1",
    );
    let id = api
        .submit(&json!({"steps": [
            {"name": "doomed", "agent": "broken", "max_attempts": 3,
             "backoff": {"initial": "200ms", "factor": 2, "max": "5s"}},
            {"name": "after", "agent": "broken", "depends_on": ["doomed"]}
        ]}))
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    let s = step(&job, "doomed");
    assert_eq!(s["state"], "failed");
    assert_eq!(s["attempt"], 3);
    assert_eq!(s["failures"], 3);
    assert!(
        s["last_error"].as_str().unwrap().contains("disk on fire"),
        "{s}"
    );
    assert_eq!(step(&job, "after")["state"], "cancelled");
    assert_eq!(
        step(&job, "after")["attempt"],
        0,
        "a dependant never starts"
    );

    let events = api.events(&id).await;
    let retries: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "step_retry_scheduled")
        .collect();
    assert_eq!(retries.len(), 2, "{events:?}");
    let delay = |e: &Value| {
        e["detail"]["delay"]
            .as_str()
            .unwrap()
            .trim_end_matches("ms")
            .parse::<u64>()
            .unwrap_or(0)
    };
    // Jitter shortens a delay by at most half: 100..=200 then 200..=400.
    assert!((100..=200).contains(&delay(retries[0])), "{}", retries[0]);
    assert!((200..=400).contains(&delay(retries[1])), "{}", retries[1]);
    let leased: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "step_leased")
        .collect();
    assert_eq!(leased.len(), 3);
    for (retry, next) in retries.iter().zip(&leased[1..]) {
        let due = millis(&retry["detail"]["next_attempt_at"]);
        assert!(
            millis(&next["at"]) >= due,
            "no attempt starts before its backoff ends"
        );
    }
    assert!(events.iter().any(|e| e["kind"] == "job_failed"));
}

// Proves the server survives bad input: every malformed request gets a 4xx problem+json naming
// the field, and the server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_problems_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    // Small limits from a TOML file, so an oversized body fits in the socket buffers and the
    // client reads the 413 instead of racing the server's close.
    let config = dir.path().join("overseer.toml");
    std::fs::write(
        &config,
        "[limits]\nbody_bytes = 16384\npayload_bytes = 4096\n",
    )
    .unwrap();
    let server = Server::start_with(dir.path(), &["--config", config.to_str().unwrap()]);
    let api = server.api();
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"steps": []}), 400, "steps"),
        (
            json!({"steps": [{"name": "a", "agent": "x", "depends_on": ["b"]}, {"name": "b", "agent": "x", "depends_on": ["a"]}]}),
            400,
            "steps[0].depends_on",
        ),
        (
            json!({"steps": [{"name": "a", "agent": "x", "depends_on": ["nope"]}]}),
            400,
            "steps[0].depends_on[0]",
        ),
        (
            json!({"steps": [{"name": "a", "agent": "x"}, {"name": "a", "agent": "y"}]}),
            400,
            "steps[1].name",
        ),
        (
            json!({"steps": [{"name": "a", "agent": "x", "timeout": "forever"}]}),
            400,
            "steps[0].timeout",
        ),
        (
            json!({"run_at": "next tuesday", "steps": [{"name": "a", "agent": "x"}]}),
            400,
            "run_at",
        ),
        (
            json!({"steps": [{"name": "a", "agent": "x", "colour": "blue"}]}),
            400,
            "steps[0]",
        ),
        (
            json!({"steps": [{"name": "a", "agent": "x"}], "urgency": 1}),
            400,
            "",
        ),
    ];
    for (body, status, field) in cases {
        let (got, problem) = api.post("/v1/jobs", &body).await;
        assert_eq!(got, status, "{body} -> {problem}");
        assert_eq!(problem["status"], status);
        assert!(
            problem["title"].is_string()
                && problem["type"].is_string()
                && problem["detail"].is_string(),
            "{problem}"
        );
        if !field.is_empty() {
            assert!(
                problem["field"].as_str().unwrap_or("").starts_with(field),
                "{body} -> {problem}"
            );
        } else {
            assert!(
                problem["detail"].as_str().unwrap().contains("urgency"),
                "{problem}"
            );
        }
    }
    let (status, problem) = api.post_raw("/v1/jobs", b"{not json".to_vec()).await;
    assert_eq!(status, 400, "{problem}");
    let (status, problem) = api.post_raw("/v1/jobs", vec![b' '; 20_000]).await;
    assert_eq!(status, 413, "{problem}");
    let big = "x".repeat(5_000);
    let (status, problem) = api
        .post(
            "/v1/jobs",
            &json!({"steps": [{"name": "a", "agent": "x", "payload": big}]}),
        )
        .await;
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["field"], "steps[0].payload");
    let (status, _) = api.get("/v1/jobs/not-a-uuid").await;
    assert_eq!(status, 400);
    let (status, _) = api
        .get("/v1/jobs/0190b2a0-0000-7000-8000-000000000000")
        .await;
    assert_eq!(status, 404);
    // Still serving.
    let id = api
        .submit(&json!({"steps": [{"name": "a", "agent": "x"}]}))
        .await;
    assert_eq!(api.job(&id).await["state"], "running");
    let (status, _) = api.get("/healthz").await;
    assert_eq!(status, 200);
}

// Proves cancellation end to end: unstarted steps never start, the running step hears `cancel`
// on its heartbeat, the command agent stops its command, and the job ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_job() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let marker = dir.path().join("long-started");
    let finished = dir.path().join("long-finished");
    let _agent = Agent::start(
        &server,
        "long",
        &format!(
            "cat >/dev/null; touch {}; sleep 20; touch {}",
            marker.display(),
            finished.display()
        ),
    );
    let id = api
        .submit(&json!({"steps": [
            {"name": "long", "agent": "long", "timeout": "3s"},
            {"name": "next", "agent": "long", "depends_on": ["long"]}
        ]}))
        .await;
    wait_for("the long step to start", || {
        let m = marker.clone();
        async move { m.exists().then_some(()) }
    })
    .await;
    let out = std::process::Command::new(BIN)
        .args(["cancel", &id, "--server", &server.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(job["desired_state"], "cancelled");
    assert_eq!(step(&job, "long")["state"], "cancelled");
    assert_eq!(step(&job, "next")["state"], "cancelled");
    assert_eq!(step(&job, "next")["attempt"], 0);
    assert!(
        !finished.exists(),
        "the command was stopped, not left to finish"
    );
    // Cancelling a finished job is a clear 409.
    let (status, body) = api.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 409, "{body}");
    std::thread::sleep(Duration::from_millis(10));
}

// Proves graceful shutdown: SIGTERM makes a server with an agent long-polling exit 0 promptly,
// and a command agent given SIGTERM mid-step finishes that step, reports it, and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_of_server_and_agent() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let api = server.api();
    let marker = dir.path().join("step-started");
    let mut agent = Agent::start(
        &server,
        "graceful",
        &format!(
            "cat >/dev/null; touch {}; sleep 1; echo '\"finished\"'",
            marker.display()
        ),
    );
    let id = api
        .submit(&json!({"steps": [{"name": "s", "agent": "graceful", "timeout": "20s"}]}))
        .await;
    wait_for("the step to start", || {
        let m = marker.clone();
        async move { m.exists().then_some(()) }
    })
    .await;
    agent.signal("TERM");
    let status = agent
        .wait_exit(Duration::from_secs(30))
        .expect("agent exits after finishing");
    assert!(status.success(), "agent exit: {status:?}\n{}", agent.logs());
    let job = api.job(&id).await;
    assert_eq!(
        job["state"], "succeeded",
        "the in-flight step was finished and reported: {job}"
    );
    assert_eq!(step(&job, "s")["result"], "finished");

    // A long-poll is in flight from this request; SIGTERM must not wait for its 20s.
    let poller = {
        let api = api.clone();
        tokio::spawn(async move {
            api.post(
                "/v1/agents/idle/leases",
                &json!({"worker": "w", "wait": "20s"}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let status = server.terminate();
    assert!(status.success(), "server exit: {status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "shutdown did not wait out the long-poll"
    );
    let (code, body) = poller.await.unwrap();
    assert_eq!(
        code, 200,
        "the long-poll was answered (empty) before exit: {body}"
    );
    assert_eq!(body["leases"], json!([]));
}

// Proves settings are validated at start with a message naming the bad one.
#[test]
fn bad_settings_stop_the_server_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--sweep-interval".into(), "1ms".into()],
            "sweep_interval",
        ),
        (vec!["--db".into(), "mysql://x".into()], "db"),
        (vec!["--log-format".into(), "xml".into()], "log_format"),
        (
            vec![
                "--config".into(),
                dir.path().join("missing.toml").display().to_string(),
            ],
            "missing.toml",
        ),
    ];
    for (args, needle) in cases {
        let out = std::process::Command::new(BIN)
            .arg("server")
            .args(&args)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let bad_toml = dir.path().join("bad.toml");
    std::fs::write(&bad_toml, "sweep_intervall = \"1s\"\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "server",
            "--config",
            bad_toml.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sweep_intervall"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `overseer server` with `args` until it exits by itself (or fails the test after a while).
fn server_exit(args: &[&str]) -> std::process::Output {
    let mut child = std::process::Command::new(BIN)
        .arg("server")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start overseer server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

// Proves a SQLite file serves one server: a second `overseer server` on the same file refuses to
// start, saying why and what to do, while the first one keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_one_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let db = format!("sqlite://{}", server.db.display());
    let listen = format!("127.0.0.1:{}", free_port());
    let out = server_exit(&["--db", &db, "--listen", &listen]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("in use by another process"), "{stderr}");
    assert!(stderr.contains("PostgreSQL"), "{stderr}");
    let (status, _) = server.api().get("/readyz").await;
    assert_eq!(status, 200, "the first server still serves");
}

// Proves a server that cannot listen leaves nothing behind: no database file is created when
// its port is taken.
#[test]
fn a_server_that_cannot_bind_creates_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let db_path = dir.path().join("never.db");
    let db = format!("sqlite://{}", db_path.display());
    let out = server_exit(&["--db", &db, "--listen", &listen]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot listen"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files were created: {left:?}");
}
