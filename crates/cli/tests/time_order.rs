//! Time and order, end to end against a real server process: cron schedules across a restart,
//! delayed jobs, ordered keys under failures, per-agent limits and pausing, and priorities.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use overseer_agent::{Client, StepContext, StepError, Worker};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

async fn jobs_with_label(api: &Api, label: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = api
            .get(&format!("/v1/jobs?label={label}&limit=500{cursor}"))
            .await;
        assert_eq!(status, 200, "{page}");
        all.extend(page["jobs"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return all,
        }
    }
}

// Proves a schedule firing every second fires once per due second, with no gap and no
// duplicate, across a server restart in the middle (OVERSEER_CRON_SECONDS sets the length).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cron_every_second_across_a_restart() {
    let seconds: u64 = std::env::var("OVERSEER_CRON_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let (status, body) = server
        .api()
        .post(
            "/v1/schedules",
            &json!({"name": "ticker", "cron": "* * * * * *", "overlap": "allow",
                    "job": {"steps": [{"name": "tick", "agent": "nobody"}]}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    tokio::time::sleep(Duration::from_secs(seconds / 2)).await;
    server.restart();
    tokio::time::sleep(Duration::from_secs(seconds - seconds / 2)).await;
    let (_, sched) = server.api().get("/v1/schedules/ticker").await;
    let last_fire = millis(&sched["last_fire_at"]);
    let jobs = jobs_with_label(&server.api(), "schedule:ticker").await;
    let dues: Vec<i64> = jobs
        .iter()
        .map(|j| {
            j["idempotency_key"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let unique: BTreeSet<i64> = dues.iter().copied().collect();
    assert_eq!(unique.len(), dues.len(), "no due time fired twice");
    let first = *unique.iter().next().unwrap();
    let expected: BTreeSet<i64> = (0..)
        .map(|i| first + i * 1000)
        .take_while(|t| *t <= last_fire)
        .collect();
    assert_eq!(
        unique, expected,
        "one job per second from the first to the last firing, no gap"
    );
    assert!(
        unique.len() as u64 >= seconds - 3,
        "fired {} times in {seconds}s",
        unique.len()
    );
    eprintln!(
        "fired {} times over {seconds}s with a restart",
        unique.len()
    );
}

// Proves delayed jobs never start before `run_at` and do start after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_jobs_start_on_time_not_before() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let _agent = Agent::start_with(
        &server,
        "later",
        &["--concurrency", "8"],
        &["sh", "-c", "cat >/dev/null; echo 1"],
    );
    let now = chrono::Utc::now();
    let mut ids = Vec::new();
    for i in 0..20 {
        let run_at = now + chrono::Duration::milliseconds(1500 + 50 * i);
        let run_at = run_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        ids.push((
            run_at.clone(),
            api.submit(&json!({"run_at": run_at, "steps": [{"name": "a", "agent": "later"}]}))
                .await,
        ));
    }
    for (run_at, id) in ids {
        let job = api.wait_terminal(&id).await;
        assert_eq!(job["state"], "succeeded");
        let started = millis(&step(&job, "a")["started_at"]);
        let due = chrono::DateTime::parse_from_rfc3339(&run_at)
            .unwrap()
            .timestamp_millis();
        assert!(started >= due, "started {} ms before run_at", due - started);
    }
}

fn overseer_at(server: &Server, args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .args(["--server", &server.url])
        .current_dir(workspace_root())
        .output()
        .expect("run overseer")
}

// Proves `overseer reschedule` through a real server whose sweep runs only every 30 s: a job
// delayed by an hour and moved to `--in 2s` (priority 3) starts at its new run_at and not
// before, well before the next regular sweep (the move wakes the supervisor); `--at now` starts
// another at once; the history records who moved it and why; a finished job answers 409 and the
// CLI exits 2; bad values answer 400 naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_moves_delayed_jobs_and_wakes_the_supervisor() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("overseer.toml");
    std::fs::write(&config, "leader_ttl = \"90s\"\n").unwrap();
    let server = Server::start_with(
        dir.path(),
        &[
            "--sweep-interval",
            "30s",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let api = server.api();
    let _agent = Agent::start_with(
        &server,
        "later",
        &["--concurrency", "4"],
        &["sh", "-c", "cat >/dev/null; echo 1"],
    );
    let hour = chrono::Utc::now() + chrono::Duration::hours(1);
    let hour = hour.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let spec = json!({"run_at": hour, "steps": [{"name": "a", "agent": "later"}]});
    let (moved, now) = (api.submit(&spec).await, api.submit(&spec).await);
    // Let the supervisor go to sleep for its 30 s before anything moves.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let out = overseer_at(
        &server,
        &[
            "reschedule",
            &moved,
            "--in",
            "2s",
            "--priority",
            "3",
            "--by",
            "ops",
            "--reason",
            "customer asked",
            "--output",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (shown["state"].as_str(), shown["priority"].as_i64()),
        (Some("pending"), Some(3))
    );
    let due = millis(&shown["run_at"]);

    let job = api.wait_terminal(&moved).await;
    assert_eq!(job["state"], "succeeded");
    let started = millis(&step(&job, "a")["started_at"]);
    assert!(
        started >= due,
        "started {} ms before its new run_at",
        due - started
    );
    assert!(
        started - due < 5_000,
        "started {} ms after its new run_at: the move did not wake the supervisor",
        started - due
    );
    let out = overseer_at(&server, &["reschedule", &now, "--at", "now"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("is running"),
        "{text}"
    );
    assert_eq!(api.wait_terminal(&now).await["state"], "succeeded");

    let events = api.events(&moved).await;
    let e = events
        .iter()
        .find(|e| e["kind"] == "job_rescheduled")
        .expect("recorded");
    assert_eq!(
        (e["detail"]["by"].as_str(), e["detail"]["reason"].as_str()),
        (Some("ops"), Some("customer asked"))
    );
    assert_eq!(e["detail"]["priority"], json!({"from": 0, "to": 3}));

    let out = overseer_at(&server, &["reschedule", &moved, "--priority", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("already succeeded"), "{stderr}");
    let (status, problem) = api
        .patch(&format!("/v1/jobs/{moved}"), &json!({"priority": 1}))
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("job-terminal")),
        "{problem}"
    );
    for (body, field) in [
        (json!({"priority": 10_001}), "priority"),
        (json!({"run_at": "tomorrow"}), "run_at"),
        (json!({"priority": 1, "when": 2}), "when"),
        (json!({}), ""),
    ] {
        let (status, problem) = api.patch(&format!("/v1/jobs/{moved}"), &body).await;
        assert_eq!(status, 400, "{body}: {problem}");
        assert_eq!(
            problem["field"].as_str().unwrap_or(""),
            field,
            "{body}: {problem}"
        );
    }
}

// Proves ordered keys: jobs on one key run one at a time in submission order even with
// failures and retries injected, while a blocked head of another key holds only that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_keys_run_in_order_despite_failures() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    // Every first attempt fails, so every job retries before it succeeds.
    let _agent = Agent::start_with(
        &server,
        "ledger",
        &["--concurrency", "4"],
        &[
            "sh",
            "-c",
            "cat >/dev/null; if [ \"$OVERSEER_ATTEMPT\" -lt 2 ]; then exit 1; fi; echo 1",
        ],
    );
    let _stuck = Agent::start_with(
        &server,
        "stuck",
        &["--fatal-exit-codes", "7"],
        &["sh", "-c", "cat >/dev/null; exit 7"],
    );
    let n = 50;
    let mut ids = Vec::new();
    for i in 0..n {
        let spec = json!({"ordering_key": "account-1", "labels": {"n": i.to_string()},
            "steps": [{"name": "post", "agent": "ledger", "backoff": {"initial": "50ms", "max": "50ms"}}]});
        ids.push(api.submit(&spec).await);
    }
    // Another key whose head blocks (hold) must not hold account-1.
    let blocked = api
        .submit(&json!({"ordering_key": "account-2", "on_failure": "hold", "steps": [{"name": "x", "agent": "stuck"}]}))
        .await;
    let behind = api
        .submit(&json!({"ordering_key": "account-2", "steps": [{"name": "y", "agent": "ledger"}]}))
        .await;
    let mut previous_end = 0;
    for id in &ids {
        let job = api.wait_terminal(id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        let s = step(&job, "post");
        assert_eq!(s["attempt"], 2, "{job}");
        let events = api.events(id).await;
        let started = events
            .iter()
            .find(|e| e["kind"] == "job_started")
            .expect("started");
        let start = millis(&started["at"]);
        assert!(
            start >= previous_end,
            "job started before the previous one on its key finished"
        );
        previous_end = millis(&job["finished_at"]);
    }
    let (status, key) = api.get("/v1/ordering-keys/account-2").await;
    assert_eq!(status, 200);
    assert_eq!(key["head"]["id"], blocked.as_str());
    assert_eq!(key["head"]["state"], "blocked");
    assert_eq!(key["waiting"], 1);
    assert_eq!(
        api.job(&behind).await["state"],
        "pending",
        "held by its blocked head"
    );
    let (_, key1) = api.get("/v1/ordering-keys/account-1").await;
    assert!(key1["head"].is_null(), "{key1}");
}

/// Counts leases in flight and the peak, from inside SDK handlers.
#[derive(Default)]
struct Gauge {
    now: AtomicI64,
    peak: AtomicI64,
    starts: Mutex<Vec<Instant>>,
}

// Proves per-agent limits across 20 eager workers: `max_concurrency: 2` is never exceeded, a
// rate of 10/s is never exceeded, and pausing stops new leases at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_limits_hold_under_eager_workers() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let (status, body) = api
        .post_put("/v1/agents/limited/limits", &json!({"max_concurrency": 2}))
        .await;
    assert_eq!(status, 200, "{body}");
    let gauge = Arc::new(Gauge::default());
    let g = gauge.clone();
    let client = Client::new(&server.url, None).unwrap();
    let worker = Worker::builder(client)
        .worker_id("eager")
        .concurrency(20)
        .handler("limited", move |_ctx: StepContext| {
            let g = g.clone();
            async move {
                let now = g.now.fetch_add(1, Ordering::SeqCst) + 1;
                g.peak.fetch_max(now, Ordering::SeqCst);
                g.starts.lock().unwrap().push(Instant::now());
                tokio::time::sleep(Duration::from_millis(30)).await;
                g.now.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, StepError>(json!(null))
            }
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let batch: Vec<Value> = (0..60)
        .map(|_| json!({"steps": [{"name": "s", "agent": "limited"}]}))
        .collect();
    let (status, body) = api.post("/v1/jobs:batch", &json!({ "jobs": batch })).await;
    assert_eq!(status, 202, "{body}");
    let ids: Vec<String> = body["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    for id in &ids {
        assert_eq!(api.wait_terminal(id).await["state"], "succeeded");
    }
    assert!(
        gauge.peak.load(Ordering::SeqCst) <= 2,
        "peak in flight {}",
        gauge.peak.load(Ordering::SeqCst)
    );
    assert!(gauge.peak.load(Ordering::SeqCst) >= 1);

    // Rate: 10 per second, no concurrency cap.
    let (status, _) = api
        .post_put("/v1/agents/limited/limits", &json!({"rate": 10}))
        .await;
    assert_eq!(status, 200);
    gauge.starts.lock().unwrap().clear();
    let batch: Vec<Value> = (0..40)
        .map(|_| json!({"steps": [{"name": "s", "agent": "limited"}]}))
        .collect();
    let (_, body) = api.post("/v1/jobs:batch", &json!({ "jobs": batch })).await;
    let t0 = Instant::now();
    for j in body["jobs"].as_array().unwrap() {
        assert_eq!(
            api.wait_terminal(j["id"].as_str().unwrap()).await["state"],
            "succeeded"
        );
    }
    let starts = gauge.starts.lock().unwrap().clone();
    // Never more than the bucket (10) plus 10 per elapsed second, over any window from t0.
    for (i, s) in starts.iter().enumerate() {
        let allowed = 10.0 + 10.0 * s.duration_since(t0).as_secs_f64() + 1.0;
        assert!(
            (i + 1) as f64 <= allowed,
            "lease {} started {:?} after t0: over the rate",
            i + 1,
            s.duration_since(t0)
        );
    }
    let elapsed = starts.last().unwrap().duration_since(t0).as_secs_f64();
    eprintln!("40 leases at rate 10/s took {elapsed:.2}s (ideal ~3s)");

    // Pause: no lease starts after the pause is acknowledged; resume lets them through.
    let (status, _) = api.post("/v1/agents/limited/pause", &json!({})).await;
    assert_eq!(status, 200);
    let paused_at = Instant::now();
    let (_, body) = api
        .post(
            "/v1/jobs",
            &json!({"steps": [{"name": "s", "agent": "limited"}]}),
        )
        .await;
    let id = body["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        step(&api.job(&id).await, "s")["state"],
        "ready",
        "paused: not leased"
    );
    assert!(gauge.starts.lock().unwrap().iter().all(|s| *s < paused_at));
    let (status, _) = api.post("/v1/agents/limited/resume", &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(api.wait_terminal(&id).await["state"], "succeeded");
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), running).await;
}

// Proves priorities with a backlog: priority 10 work is leased before priority 0 work, and the
// priority 0 work still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_order_a_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let low: Vec<Value> = (0..20).map(|i| json!({"priority": 0, "labels": {"p": "0", "i": i.to_string()}, "steps": [{"name": "s", "agent": "busy"}]})).collect();
    let high: Vec<Value> = (0..20).map(|i| json!({"priority": 10, "labels": {"p": "10", "i": i.to_string()}, "steps": [{"name": "s", "agent": "busy"}]})).collect();
    api.post("/v1/jobs:batch", &json!({ "jobs": low })).await;
    api.post("/v1/jobs:batch", &json!({ "jobs": high })).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(AtomicU32::new(0));
    let (o, n) = (order.clone(), seen.clone());
    let client = Client::new(&server.url, None).unwrap();
    let worker = Worker::builder(client)
        .worker_id("single")
        .concurrency(1)
        .handler("busy", move |ctx: StepContext| {
            let (o, n) = (o.clone(), n.clone());
            async move {
                o.lock().unwrap().push(ctx.job_id());
                n.fetch_add(1, Ordering::SeqCst);
                Ok::<_, StepError>(json!(null))
            }
        })
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for("all 40 jobs to run", || {
        let n = seen.clone();
        async move { (n.load(Ordering::SeqCst) >= 40).then_some(()) }
    })
    .await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), running).await;
    let order = order.lock().unwrap().clone();
    let mut priorities = Vec::new();
    for id in order {
        priorities.push(api.job(&id.to_string()).await["priority"].as_i64().unwrap());
    }
    assert_eq!(
        &priorities[..20],
        &[10; 20],
        "priority 10 first: {priorities:?}"
    );
    assert_eq!(
        &priorities[20..],
        &[0; 20],
        "then priority 0, which still completes"
    );
}

/// The due times (ms) the schedule `name` fired, from its jobs' idempotency keys, in order.
async fn fired_dues(api: &Api, name: &str) -> Vec<i64> {
    let mut dues: Vec<i64> = jobs_with_label(api, &format!("schedule:{name}"))
        .await
        .iter()
        .map(|j| {
            j["idempotency_key"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    dues.sort_unstable();
    dues
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

// Proves a schedule replaced while it runs, through the real server and `overseer schedules
// update`: firing on even seconds, `--cron 1/2 * * * * *` moves it to odd seconds: nothing even
// fires after the update returned, the odd seconds fire from the first one after the update,
// each once, with no gap; then a spec file with `@yearly` and another job body stops the
// firings until next New Year (UTC), and a name other than the schedule's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_schedule_fires_on_its_new_pattern_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let (status, body) = api
        .post(
            "/v1/schedules",
            &json!({"name": "flip", "cron": "0/2 * * * * *", "overlap": "allow",
                    "job": {"steps": [{"name": "tick", "agent": "nobody"}]}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    wait_for("two firings on even seconds", || {
        let api = api.clone();
        async move { (fired_dues(&api, "flip").await.len() >= 2).then_some(()) }
    })
    .await;

    let before = now_ms();
    let out = overseer_at(
        &server,
        &["schedules", "update", "flip", "--cron", "1/2 * * * * *"],
    );
    let after = now_ms();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["cron"], "1/2 * * * * *", "{shown}");
    assert_eq!(
        shown["overlap"], "allow",
        "the stored definition kept the rest"
    );
    let next = millis(&shown["next_fire_at"]);
    assert_eq!(next.rem_euclid(2_000), 1_000, "an odd second: {shown}");
    assert!(next > before && next <= after + 2_000, "{shown}");

    wait_for("three firings on odd seconds", || {
        let api = api.clone();
        async move {
            let odd = fired_dues(&api, "flip")
                .await
                .into_iter()
                .filter(|d| d.rem_euclid(2_000) == 1_000)
                .count();
            (odd >= 3).then_some(())
        }
    })
    .await;
    let dues = fired_dues(&api, "flip").await;
    let unique: BTreeSet<i64> = dues.iter().copied().collect();
    assert_eq!(
        unique.len(),
        dues.len(),
        "no due time fired twice: {dues:?}"
    );
    let (even, odd): (Vec<i64>, Vec<i64>) = dues.iter().partition(|d| d.rem_euclid(2_000) == 0);
    assert!(
        even.iter().all(|d| *d <= after),
        "an old due time fired after the update returned: {dues:?} (update at {before}..{after})"
    );
    assert!(odd.iter().all(|d| *d > before), "{dues:?}");
    assert_eq!(
        odd[0], next,
        "the first new firing is the announced one: {dues:?}"
    );
    assert!(
        odd.windows(2).all(|w| w[1] - w[0] == 2_000),
        "every odd second from the first, no gap: {odd:?}"
    );

    // A spec file (no name: the schedule's own) with a macro and a new job body.
    let file = dir.path().join("yearly.yaml");
    std::fs::write(
        &file,
        "cron: '@yearly'\njob:\n  priority: 5\n  steps:\n    - {name: tock, agent: nobody}\n",
    )
    .unwrap();
    let out = overseer_at(
        &server,
        &["schedules", "update", "flip", file.to_str().unwrap()],
    );
    let stopped_at = now_ms();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&shown["cron"], &shown["overlap"], &shown["job"]["priority"]),
        (&json!("@yearly"), &json!("skip"), &json!(5)),
        "a file replaces the whole definition: {shown}"
    );
    let new_year = {
        use chrono::Datelike;
        let year = chrono::Utc::now().year() + 1;
        chrono::NaiveDate::from_ymd_opt(year, 1, 1)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp_millis()
    };
    assert_eq!(millis(&shown["next_fire_at"]), new_year, "{shown}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = fired_dues(&api, "flip").await;
    assert!(
        later.iter().all(|d| *d <= stopped_at),
        "fired after moving to @yearly: {later:?}"
    );

    let wrong = dir.path().join("wrong.json");
    std::fs::write(
        &wrong,
        r#"{"name": "other", "cron": "@daily", "job": {"steps": [{"name": "a", "agent": "b"}]}}"#,
    )
    .unwrap();
    let out = overseer_at(
        &server,
        &["schedules", "update", "flip", wrong.to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("name"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, problem) = api
        .post_put(
            "/v1/schedules/flip",
            &json!({"name": "flip", "cron": "@sometimes", "job": {"steps": [{"name": "a", "agent": "b"}]}}),
        )
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (400, Some("cron")),
        "{problem}"
    );
}
