//! End-to-end tests of HTTP targets: real `overseer` server processes call a real HTTP service
//! run by the test on 127.0.0.1 (opened with `outbound_allow`), and the tests watch both sides.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use common::*;
use serde_json::{json, Value};

/// A `webhook_secret` for the tests: `whsec_` and the base64 of 32 bytes.
const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// One request the target received.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Vec<u8>,
    at: Instant,
}

impl Seen {
    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// How the target answers one request on a path.
#[derive(Clone, Debug)]
enum Reply {
    Json(u16, Value),
    /// A status with a `Retry-After` in seconds.
    RetryAfter(u16, u64),
    /// Answers only after this long.
    Hang(Duration, Value),
    /// 202: the test completes the lease itself.
    Accepted,
}

/// A small HTTP service standing for the services a job calls: answers from a plan per path
/// (then a default per path) and records every request.
#[derive(Clone, Default)]
struct Target {
    seen: Arc<Mutex<Vec<Seen>>>,
    plans: Arc<Mutex<HashMap<String, VecDeque<Reply>>>>,
}

impl Target {
    async fn start() -> (Target, u16) {
        let target = Target::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = target.clone();
        let app = axum::Router::new().fallback(
            move |uri: Uri, headers: HeaderMap, body: axum::body::Bytes| {
                let t = t.clone();
                async move {
                    t.answer(uri.path().to_string(), headers, body.to_vec())
                        .await
                }
            },
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (target, port)
    }

    fn plan(&self, path: &str, replies: &[Reply]) {
        self.plans
            .lock()
            .unwrap()
            .insert(path.to_string(), replies.iter().cloned().collect());
    }

    fn seen(&self, path: &str) -> Vec<Seen> {
        let all = self.seen.lock().unwrap();
        all.iter().filter(|s| s.path == path).cloned().collect()
    }

    async fn answer(&self, path: String, headers: HeaderMap, body: Vec<u8>) -> Response {
        let seen = Seen {
            path: path.clone(),
            headers,
            body,
            at: Instant::now(),
        };
        self.seen.lock().unwrap().push(seen.clone());
        let planned = self
            .plans
            .lock()
            .unwrap()
            .get_mut(&path)
            .and_then(VecDeque::pop_front);
        let reply = planned.unwrap_or_else(|| default_reply(&seen));
        let json_of = |status: u16, v: Value| {
            (StatusCode::from_u16(status).unwrap(), axum::Json(v)).into_response()
        };
        match reply {
            Reply::Json(status, v) => json_of(status, v),
            Reply::RetryAfter(status, secs) => (
                StatusCode::from_u16(status).unwrap(),
                [("retry-after", secs.to_string())],
                "busy",
            )
                .into_response(),
            Reply::Hang(d, v) => {
                tokio::time::sleep(d).await;
                json_of(200, v)
            }
            Reply::Accepted => StatusCode::ACCEPTED.into_response(),
        }
    }
}

/// The README walkthrough's four services, as the example shell agents answer, and an echo of
/// the attempt for every other path.
fn default_reply(seen: &Seen) -> Reply {
    let body = seen.json();
    let job = seen.header("overseer-job-id");
    match seen.path.as_str() {
        "/accounts" => Reply::Json(200, json!({"account_id": format!("acct-{}", &job[..8])})),
        "/dns" => Reply::Hang(
            Duration::from_millis(400),
            json!({"records": ["A", "AAAA", "TXT"]}),
        ),
        "/storage" => Reply::Hang(
            Duration::from_millis(400),
            json!({"bucket_url": "s3://acme-site"}),
        ),
        "/deploy" => {
            let inputs = &body["inputs"];
            if inputs["provision-dns"].is_object() && inputs["provision-storage"].is_object() {
                Reply::Json(
                    200,
                    json!({"url": "https://acme.example.com", "status": "live"}),
                )
            } else {
                Reply::Json(422, json!({"error": "missing inputs from dns and storage"}))
            }
        }
        _ => Reply::Json(200, json!({"attempt": seen.header("overseer-attempt")})),
    }
}

/// A server on its own store whose outbound policy opens 127.0.0.1, signing with `SECRET`, with
/// `extra` TOML settings.
fn server(dir: &std::path::Path, extra: &str) -> Server {
    let config = dir.join("overseer.toml");
    std::fs::write(
        &config,
        format!("outbound_allow = [\"127.0.0.1\"]\nwebhook_secret = \"{SECRET}\"\n{extra}"),
    )
    .unwrap();
    Server::start_with(dir, &["--config", config.to_str().unwrap()])
}

/// Runs the README's recipe, `examples/verify_webhook.py`, on one received request.
fn verifies(seen: &Seen) -> bool {
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .arg(workspace_root().join("examples/verify_webhook.py"))
        .args([
            SECRET.to_string(),
            seen.header("webhook-id"),
            seen.header("webhook-timestamp"),
            seen.header("webhook-signature"),
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the recipe");
    child.stdin.take().unwrap().write_all(&seen.body).unwrap();
    child.wait().unwrap().success()
}

async fn metrics(api: &Api) -> String {
    let (_, text) = api.get("/metrics").await;
    text.as_str().unwrap_or_default().to_string()
}

// Proves the README walkthrough job runs with every step as an HTTP target: the example file's
// steps are pointed at the test's service; each request carries the payload and inputs, the
// stable Idempotency-Key, the attempt, job and lease ids and a signature that the README's
// verification recipe accepts; results flow into dependants; dns and storage run at once; the
// job view shows the target with its header values redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walkthrough_job_runs_on_http_targets() {
    let (target, port) = Target::start().await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let api = server.api();
    let text =
        std::fs::read_to_string(workspace_root().join("examples/provision-site.json")).unwrap();
    let mut spec: Value = serde_json::from_str(&text).unwrap();
    for step in spec["steps"].as_array_mut().unwrap() {
        let agent = step.as_object_mut().unwrap().remove("agent").unwrap();
        step["http"] = json!({
            "url": format!("http://127.0.0.1:{port}/{}", agent.as_str().unwrap()),
            "headers": {"Authorization": "Bearer s3cret"},
        });
    }
    let id = api.submit(&spec).await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let agent = format!("http:127.0.0.1:{port}");
    for (name, path) in [
        ("create-account", "/accounts"),
        ("provision-dns", "/dns"),
        ("provision-storage", "/storage"),
        ("deploy-site", "/deploy"),
    ] {
        let s = step(&job, name);
        assert_eq!(s["agent"], agent.as_str(), "{s}");
        assert_eq!(s["attempt"], 1, "{s}");
        assert_eq!(s["http"]["headers"]["Authorization"], "<redacted>", "{s}");
        let seen = target.seen(path);
        assert_eq!(seen.len(), 1, "{path}");
        let got = &seen[0];
        assert_eq!(got.header("idempotency-key"), format!("{id}/{name}"));
        assert_eq!(got.header("overseer-job-id"), id);
        assert_eq!(got.header("overseer-step"), name);
        assert_eq!(got.header("overseer-attempt"), "1");
        assert_eq!(got.header("overseer-kind"), "work");
        assert_eq!(got.header("authorization"), "Bearer s3cret");
        assert_eq!(got.header("content-type"), "application/json");
        assert!(!got.header("overseer-lease-id").is_empty());
        let spec_step = spec["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap();
        assert_eq!(got.json()["payload"], spec_step["payload"], "{path}");
        assert!(verifies(got), "the signature of {path} verifies");
        let mut forged = got.clone();
        forged.body.reverse();
        assert!(!verifies(&forged), "a changed body must not verify");
    }
    let deploy = &target.seen("/deploy")[0];
    assert!(deploy.json()["inputs"]["provision-dns"]["records"].is_array());
    assert_eq!(step(&job, "deploy-site")["result"]["status"], "live");
    let account = step(&job, "create-account")["result"]["account_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(account.starts_with("acct-"), "{account}");
    let (dns, storage) = (step(&job, "provision-dns"), step(&job, "provision-storage"));
    assert!(
        millis(&dns["started_at"]) < millis(&storage["finished_at"])
            && millis(&storage["started_at"]) < millis(&dns["finished_at"]),
        "dns and storage overlap in time: {job}"
    );
    let text = metrics(&api).await;
    assert!(
        text.contains(&format!(
            "overseer_http_requests_total{{agent=\"{agent}\",outcome=\"success\"}} 4"
        )),
        "{text}"
    );
}

// Proves a 503 carrying `Retry-After: 2` and then a 500 are retried (the second attempt waits
// the 2 s the target asked for, not the 100 ms backoff) and the step succeeds on the third
// attempt with the same idempotency key each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_honouring_retry_after() {
    let (target, port) = Target::start().await;
    target.plan(
        "/charge",
        &[
            Reply::RetryAfter(503, 2),
            Reply::Json(500, json!({"error": "oops"})),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let api = server.api();
    let id = api
        .submit(
            &json!({"steps": [{"name": "charge", "payload": {"cents": 500},
            "backoff": {"initial": "100ms", "max": "10s"},
            "http": {"url": format!("http://127.0.0.1:{port}/charge")}}]}),
        )
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let s = step(&job, "charge");
    assert_eq!(
        (s["attempt"].as_u64(), s["failures"].as_u64()),
        (Some(3), Some(2)),
        "{s}"
    );
    assert_eq!(s["result"], json!({"attempt": "3"}));
    let seen = target.seen("/charge");
    assert_eq!(seen.len(), 3);
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(1_900),
        "Retry-After honoured: {waited:?}"
    );
    let keys: Vec<String> = seen.iter().map(|s| s.header("idempotency-key")).collect();
    assert_eq!(keys, vec![format!("{id}/charge"); 3]);
    let attempts: Vec<String> = seen.iter().map(|s| s.header("overseer-attempt")).collect();
    assert_eq!(attempts, ["1", "2", "3"]);
}

// Proves a 400 fails the step for good on its first attempt (no retry) and the job compensates:
// the succeeded step's undo, itself an HTTP target, is called with the step's result as input
// and the `compensate` kind, and the job ends failed listing it as compensated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_error_fails_for_good_and_compensates() {
    let (target, port) = Target::start().await;
    target.plan(
        "/ship",
        &[Reply::Json(400, json!({"error": "no such address"}))],
    );
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let api = server.api();
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let id = api
        .submit(&json!({"steps": [
            {"name": "reserve", "http": {"url": url("/reserve")},
             "compensate": {"http": {"url": url("/release"), "method": "PUT"}, "payload": {"undo": true}}},
            {"name": "ship", "depends_on": ["reserve"], "max_attempts": 5,
             "http": {"url": url("/ship")}}
        ]}))
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    let ship = step(&job, "ship");
    assert_eq!(
        (ship["state"].as_str(), ship["attempt"].as_u64()),
        (Some("failed"), Some(1)),
        "{ship}"
    );
    assert!(
        ship["last_error"]
            .as_str()
            .unwrap()
            .contains("answered 400"),
        "{ship}"
    );
    assert_eq!(step(&job, "reserve")["state"], "compensated", "{job}");
    assert_eq!(target.seen("/ship").len(), 1, "a 400 is not retried");
    let undo = target.seen("/release");
    assert_eq!(undo.len(), 1);
    assert_eq!(undo[0].header("overseer-kind"), "compensate");
    assert_eq!(undo[0].json()["payload"], json!({"undo": true}));
    assert_eq!(undo[0].json()["inputs"]["reserve"], json!({"attempt": "1"}));
    assert_eq!(
        step(&job, "reserve")["compensate"]["agent"],
        format!("http:127.0.0.1:{port}")
    );
}

// Proves a target that does not answer within the target's timeout is cut off and retried, the
// retry's answer is the result, and the first request's late answer changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_target_times_out_and_its_late_answer_is_ignored() {
    let (target, port) = Target::start().await;
    target.plan(
        "/slow",
        &[Reply::Hang(Duration::from_secs(3), json!({"late": true}))],
    );
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [{"name": "slow", "timeout": "5s",
            "backoff": {"initial": "100ms"},
            "http": {"url": format!("http://127.0.0.1:{port}/slow"), "timeout": "500ms"}}]}))
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let s = step(&job, "slow");
    assert_eq!(s["result"], json!({"attempt": "2"}), "{s}");
    assert_eq!(s["failures"], 1);
    let seen = target.seen("/slow");
    let cut_after = seen[1].at - seen[0].at;
    assert!(
        cut_after < Duration::from_millis(2_500),
        "the first request was cut at its timeout, not answered: {cut_after:?}"
    );
    // Past the moment the first request would have answered, the job is unchanged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = api.job(&id).await;
    assert_eq!(step(&later, "slow")["result"], json!({"attempt": "2"}));
    assert_eq!(later["state"], "succeeded");
    let events = api.events(&id).await;
    let retry = events
        .iter()
        .find(|e| e["kind"] == "step_retry_scheduled")
        .unwrap();
    assert!(
        retry["detail"]["error"]
            .as_str()
            .unwrap()
            .contains("no answer"),
        "{retry}"
    );
}

// Proves a node killed (SIGKILL) while its request is in flight loses nothing: after a restart
// on the same store, the lease expires after the step's timeout and the step is leased again,
// and the target sees the same idempotency key on attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_request_is_healed_with_the_same_key() {
    let (target, port) = Target::start().await;
    target.plan(
        "/provision",
        &[Reply::Hang(Duration::from_secs(30), json!({"never": true}))],
    );
    let dir = tempfile::tempdir().unwrap();
    let mut server = server(dir.path(), "");
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [{"name": "provision", "timeout": "2s",
            "http": {"url": format!("http://127.0.0.1:{port}/provision")}}]}))
        .await;
    wait_for("the first request", || {
        let t = target.clone();
        async move { (!t.seen("/provision").is_empty()).then_some(()) }
    })
    .await;
    server.kill();
    server.restart();
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let seen = target.seen("/provision");
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        seen[0].header("idempotency-key"),
        seen[1].header("idempotency-key")
    );
    assert_eq!(seen[0].header("idempotency-key"), format!("{id}/provision"));
    assert_eq!(
        (
            seen[0].header("overseer-attempt").as_str(),
            seen[1].header("overseer-attempt").as_str()
        ),
        ("1", "2")
    );
    assert_ne!(
        seen[0].header("overseer-lease-id"),
        seen[1].header("overseer-lease-id")
    );
    let events = api.events(&id).await;
    assert!(
        events.iter().any(|e| e["kind"] == "step_lease_expired"),
        "{events:?}"
    );
}

// Proves the outbound guard on HTTP targets: without `outbound_allow`, a loopback or metadata
// IP literal is refused at submit (400 naming the URL field, for work and undo), a name that
// resolves to loopback is refused when connecting (the step fails, naming why), the reserved
// `http:` agent names can be neither submitted nor leased; with 127.0.0.1 allowed, it is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_targets_are_refused_unless_allowed() {
    let (target, port) = Target::start().await;
    let dir = tempfile::tempdir().unwrap();
    let closed = Server::start(dir.path());
    let api = closed.api();
    let url = format!("http://127.0.0.1:{port}/x");
    for (spec, field) in [
        (
            json!({"steps": [{"name": "s", "http": {"url": url}}]}),
            "steps[0].http.url",
        ),
        (
            json!({"steps": [{"name": "s", "http": {"url": "http://169.254.169.254/latest"}}]}),
            "steps[0].http.url",
        ),
        (
            json!({"steps": [{"name": "s", "agent": "a", "compensate": {"http": {"url": url}}}]}),
            "steps[0].compensate.http.url",
        ),
        (
            json!({"steps": [{"name": "s", "agent": "http:evil:80"}]}),
            "steps[0].agent",
        ),
        (
            json!({"steps": [{"name": "s", "agent": "a", "http": {"url": "https://example.com/"}}]}),
            "steps[0].agent",
        ),
        (
            json!({"steps": [{"name": "s", "http": {"url": "https://example.com/", "headers": {"Idempotency-Key": "x"}}}]}),
            "steps[0].http.headers.Idempotency-Key",
        ),
    ] {
        let (status, problem) = api.post("/v1/jobs", &spec).await;
        assert_eq!(status, 400, "{spec}: {problem}");
        assert_eq!(problem["field"], field, "{problem}");
    }
    let (status, problem) = api
        .post(
            &format!("/v1/agents/http:127.0.0.1:{port}/leases"),
            &json!({"worker": "w", "wait": "0s"}),
        )
        .await;
    assert_eq!(
        (status, problem["field"].as_str()),
        (400, Some("agent")),
        "{problem}"
    );
    let id = api
        .submit(&json!({"steps": [{"name": "s", "max_attempts": 1,
            "http": {"url": format!("http://localhost:{port}/x")}}]}))
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    let error = step(&job, "s")["last_error"].as_str().unwrap().to_string();
    assert!(error.contains("internal addresses"), "{error}");
    assert!(target.seen("/x").is_empty(), "nothing reached the target");

    let dir = tempfile::tempdir().unwrap();
    let open = server(dir.path(), "");
    let id = open
        .api()
        .submit(&json!({"steps": [{"name": "s", "http": {"url": url}}]}))
        .await;
    assert_eq!(open.api().wait_terminal(&id).await["state"], "succeeded");
    assert_eq!(target.seen("/x").len(), 1);
}

// Proves the circuit breaker: after two failures in a row the host's breaker opens, its step
// waits with its attempts intact (no request during the cool-down) under the waiting reason
// `circuit_open`, the metric shows it open, and after the cool-down one probe succeeds and
// closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_parks_steps_instead_of_burning_attempts() {
    let (target, port) = Target::start().await;
    target.plan(
        "/flaky",
        &[Reply::Json(503, json!({})), Reply::Json(503, json!({}))],
    );
    let dir = tempfile::tempdir().unwrap();
    let server = server(
        dir.path(),
        "http_breaker_failures = 2\nhttp_breaker_cool_down = \"3s\"\n",
    );
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [{"name": "s", "max_attempts": 4,
            "backoff": {"initial": "100ms", "max": "100ms"},
            "http": {"url": format!("http://127.0.0.1:{port}/flaky")}}]}))
        .await;
    let agent = format!("http:127.0.0.1:{port}");
    let reason = wait_for("the breaker to open", || {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let job = api.job(&id).await;
            let r = step(&job, "s")["waiting_reason"].clone();
            (r["code"] == "circuit_open").then_some(r)
        }
    })
    .await;
    assert!(
        reason["text"].as_str().unwrap().contains(&agent),
        "{reason}"
    );
    let text = metrics(&api).await;
    assert!(
        text.contains(&format!(
            "overseer_http_breaker_open{{agent=\"{agent}\"}} 1"
        )),
        "{text}"
    );
    let opened = target.seen("/flaky")[1].at;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        target.seen("/flaky").len(),
        2,
        "no attempt while the breaker is open"
    );
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let seen = target.seen("/flaky");
    assert_eq!(seen.len(), 3);
    assert!(
        seen[2].at - opened >= Duration::from_millis(2_900),
        "probe after the cool-down"
    );
    let text = metrics(&api).await;
    assert!(
        text.contains(&format!(
            "overseer_http_breaker_open{{agent=\"{agent}\"}} 0"
        )),
        "{text}"
    );
}

// Proves async mode: the target answers 202, keeps the lease it was sent, heartbeats it past
// the step's timeout and completes it through the normal lease endpoints; the server does not
// report for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_target_completes_its_lease_itself() {
    let (target, port) = Target::start().await;
    target.plan("/render", &[Reply::Accepted]);
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [{"name": "render", "timeout": "1s",
            "http": {"url": format!("http://127.0.0.1:{port}/render"), "async": true}}]}))
        .await;
    let seen = wait_for("the request", || {
        let t = target.clone();
        async move { t.seen("/render").first().cloned() }
    })
    .await;
    let lease = seen.header("overseer-lease-id");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (status, body) = api
            .post(&format!("/v1/leases/{lease}/heartbeat"), &json!({}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(api.job(&id).await["state"], "running");
    let (status, body) = api
        .post(
            &format!("/v1/leases/{lease}/complete"),
            &json!({"result": {"pages": 12}}),
        )
        .await;
    assert!(status < 300, "{status} {body}");
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(step(&job, "render")["result"], json!({"pages": 12}));
    assert_eq!(step(&job, "render")["attempt"], 1);
    assert_eq!(target.seen("/render").len(), 1);
}

// Proves the per-host limit: with `max_concurrency` 1 set on the host's `http:` agent name
// through the normal limits route, three parallel steps to that host are called one at a time
// (each request arrives only after the previous one was answered), and all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_host_limits_apply_to_http_targets() {
    let (target, port) = Target::start().await;
    let hang = Reply::Hang(Duration::from_millis(300), json!({"ok": true}));
    target.plan("/one", &[hang.clone(), hang.clone(), hang]);
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), "");
    let api = server.api();
    let agent = format!("http:127.0.0.1:{port}");
    let (status, body) = api
        .post_put(
            &format!("/v1/agents/{agent}/limits"),
            &json!({"max_concurrency": 1}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let url = format!("http://127.0.0.1:{port}/one");
    let steps: Vec<Value> = (0..3)
        .map(|i| json!({"name": format!("s{i}"), "http": {"url": url}}))
        .collect();
    let id = api.submit(&json!({ "steps": steps })).await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let mut arrivals: Vec<Instant> = target.seen("/one").iter().map(|s| s.at).collect();
    arrivals.sort();
    assert_eq!(arrivals.len(), 3);
    for pair in arrivals.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= Duration::from_millis(280),
            "one request at a time: {gap:?}"
        );
    }
}

// Proves the push agent shuts down gracefully: a SIGTERM while a request is in flight lets it
// finish and report (the server exits cleanly), and after a restart the job shows that
// attempt's result, with no second request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_a_request_in_flight_finish_and_report() {
    let (target, port) = Target::start().await;
    target.plan(
        "/deploy",
        &[Reply::Hang(
            Duration::from_secs(1),
            json!({"deployed": true}),
        )],
    );
    let dir = tempfile::tempdir().unwrap();
    let mut server = server(dir.path(), "");
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [{"name": "deploy", "timeout": "10s",
            "http": {"url": format!("http://127.0.0.1:{port}/deploy")}}]}))
        .await;
    wait_for("the request", || {
        let t = target.clone();
        async move { (!t.seen("/deploy").is_empty()).then_some(()) }
    })
    .await;
    let status = server.terminate();
    assert!(status.success(), "{status:?}\n{}", server.logs());
    server.restart();
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let s = step(&job, "deploy");
    assert_eq!(
        (s["attempt"].as_u64(), &s["result"]),
        (Some(1), &json!({"deployed": true}))
    );
    assert_eq!(target.seen("/deploy").len(), 1);
}
