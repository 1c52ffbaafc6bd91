//! When things go wrong, end to end: compensation in reverse dependency order, cancellation with
//! compensation, operator hold/retry/skip, self-repair after a crash between a step's result and
//! the job's advance, and alerts and callbacks delivered to a receiver that is down at first.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A script that records `<tag> <step> <attempt> <kind> <undo attempt> <idempotency key>` in a
/// journal and succeeds.
fn journaling(journal: &std::path::Path, tag: &str) -> String {
    format!(
        "cat >/dev/null; echo \"{tag} $OVERSEER_STEP $OVERSEER_ATTEMPT $OVERSEER_KIND u$OVERSEER_UNDO_ATTEMPT $OVERSEER_IDEMPOTENCY_KEY\" >> {}; echo '{{\"ok\": true}}'",
        journal.display()
    )
}

fn journal_lines(journal: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

// Proves compensation: a 4-step chain whose 3rd step fails for good undoes the two succeeded
// steps that declare `compensate`, in reverse dependency order, each exactly once, and the job
// ends `failed` listing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_compensates_in_reverse_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let journal = dir.path().join("journal");
    let _work = Agent::start(&server, "work", &journaling(&journal, "do"));
    let _undo = Agent::start_with(
        &server,
        "undo",
        &["--concurrency", "4"],
        &["sh", "-c", &journaling(&journal, "undo")],
    );
    let _broken = Agent::start_with(
        &server,
        "broken",
        &["--fatal-exit-codes", "3"],
        &[
            "sh",
            "-c",
            "cat >/dev/null; echo 'card declined' >&2; exit 3",
        ],
    );
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [
            {"name": "reserve", "agent": "work", "compensate": {"agent": "undo", "payload": {"release": true}}},
            {"name": "charge", "agent": "work", "depends_on": ["reserve"], "compensate": {"agent": "undo"}},
            {"name": "ship", "agent": "broken", "depends_on": ["charge"]},
            {"name": "notify", "agent": "work", "depends_on": ["ship"], "compensate": {"agent": "undo"}}
        ]}))
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(
        job["compensated"],
        json!(["charge", "reserve"]),
        "listed in the order undone: {job}"
    );
    assert_eq!(step(&job, "ship")["state"], "failed");
    assert_eq!(
        step(&job, "ship")["attempt"],
        1,
        "a fatal exit code is not retried"
    );
    assert_eq!(step(&job, "notify")["state"], "cancelled");
    let undos: Vec<String> = journal_lines(&journal)
        .into_iter()
        .filter(|l| l.starts_with("undo"))
        .collect();
    assert_eq!(undos.len(), 2, "each undo ran exactly once: {undos:?}");
    assert!(
        undos[0].starts_with("undo charge") && undos[1].starts_with("undo reserve"),
        "reverse order: {undos:?}"
    );
    assert!(
        undos[0].ends_with(&format!("{id}/charge/compensate")),
        "undo idempotency key: {undos:?}"
    );
    assert!(
        undos.iter().all(|u| u.contains(" compensate u1 ")),
        "each undo is told it is an undo, on its first try: {undos:?}"
    );
    let works: Vec<String> = journal_lines(&journal)
        .into_iter()
        .filter(|l| l.starts_with("do"))
        .collect();
    assert!(
        works.iter().all(|w| w.contains(" work u ")),
        "work leases carry no undo attempt: {works:?}"
    );
    // `status` counts the undo apart from the work: one run, one undo, not "2 attempts".
    let status = std::process::Command::new(BIN)
        .args(["status", &id, "--server", &server.url])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    let charge = status.lines().find(|l| l.starts_with("charge ")).unwrap();
    let columns: Vec<&str> = charge.split_whitespace().collect();
    assert_eq!(columns[1..4], ["work", "compensated", "1/5"], "{status}");
    assert_eq!(columns[4], "1", "one undo attempt: {status}");
    assert!(
        status.contains("compensated (in the order undone): charge, reserve"),
        "{status}"
    );
    let events = api.events(&id).await;
    let failed = events.iter().find(|e| e["kind"] == "job_failed").unwrap();
    assert_eq!(
        failed["detail"]["compensated"],
        json!(["charge", "reserve"])
    );
}

// Proves cancellation of a running job: the running step hears `cancel` on its next heartbeat,
// its late completion gets 409, the succeeded step is compensated, and the job ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_compensates_and_refuses_late_results() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let journal = dir.path().join("journal");
    let _undo = Agent::start(&server, "undo", &journaling(&journal, "undo"));
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [
            {"name": "first", "agent": "manual", "compensate": {"agent": "undo"}},
            {"name": "long", "agent": "manual", "depends_on": ["first"], "timeout": "30s", "compensate": {"agent": "undo"}}
        ]}))
        .await;
    let take = |api: Api| async move {
        let (status, body) = api
            .post(
                "/v1/agents/manual/leases",
                &json!({"worker": "me", "wait": "10s"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["leases"][0].clone()
    };
    let first = take(api.clone()).await;
    let (status, _) = api
        .post(
            &format!(
                "/v1/leases/{}/complete",
                first["lease_id"].as_str().unwrap()
            ),
            &json!({"result": 1}),
        )
        .await;
    assert_eq!(status, 200);
    let long = take(api.clone()).await;
    let lid = long["lease_id"].as_str().unwrap().to_string();
    let (status, _) = api.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200);
    let (status, hb) = api
        .post(&format!("/v1/leases/{lid}/heartbeat"), &json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(hb["cancel"], true, "told on the next heartbeat");
    let (status, problem) = api
        .post(
            &format!("/v1/leases/{lid}/complete"),
            &json!({"result": "too late"}),
        )
        .await;
    assert_eq!(status, 409, "{problem}");
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(
        job["compensated"],
        json!(["first"]),
        "only the succeeded step is undone: {job}"
    );
    assert_eq!(step(&job, "long")["state"], "cancelled");
    assert_eq!(journal_lines(&journal).len(), 1);
}

// Proves the operator loop: `hold` blocks the job on a poisoned step, `overseer retry` gives it a
// fresh budget and the job succeeds; in another job `overseer skip` lets the dependants run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_retry_and_skip() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let flag = dir.path().join("fixed");
    // Fails until the operator "fixes" things by creating the flag file.
    let _agent = Agent::start(
        &server,
        "fragile",
        &format!(
            "cat >/dev/null; if [ -e {} ]; then echo '\"ok\"'; else echo 'not yet' >&2; exit 1; fi",
            flag.display()
        ),
    );
    let _after = Agent::start(&server, "after", "cat >/dev/null; echo '\"after ran\"'");
    let api = server.api();
    let spec = json!({"on_failure": "hold", "steps": [
        {"name": "fragile", "agent": "fragile", "max_attempts": 2, "backoff": {"initial": "100ms"}},
        {"name": "after", "agent": "after", "depends_on": ["fragile"]}
    ]});
    let id = api.submit(&spec).await;
    let blocked = wait_for("the job to block", || {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let job = api.job(&id).await;
            (job["state"] == "blocked").then_some(job)
        }
    })
    .await;
    assert!(
        blocked["blocked_reason"]
            .as_str()
            .unwrap()
            .contains("fragile"),
        "{blocked}"
    );
    assert_eq!(
        step(&blocked, "after")["state"],
        "waiting",
        "nothing else starts while blocked"
    );
    std::fs::write(&flag, "").unwrap();
    let out = std::process::Command::new(BIN)
        .args([
            "retry",
            &id,
            "fragile",
            "--reason",
            "disk replaced",
            "--by",
            "ops",
            "--server",
            &server.url,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(step(&job, "fragile")["attempt"], 3);
    let events = api.events(&id).await;
    let retried = events.iter().find(|e| e["kind"] == "step_retried").unwrap();
    assert_eq!(retried["detail"]["by"], "ops");
    assert_eq!(retried["detail"]["reason"], "disk replaced");

    std::fs::remove_file(&flag).unwrap();
    let id = api.submit(&spec).await;
    wait_for("the second job to block", || {
        let (api, id) = (api.clone(), id.clone());
        async move { (api.job(&id).await["state"] == "blocked").then_some(()) }
    })
    .await;
    let (status, problem) = api
        .post(&format!("/v1/jobs/{id}/steps/after/skip"), &json!({}))
        .await;
    assert_eq!(status, 409, "only failed steps can be skipped: {problem}");
    let out = std::process::Command::new(BIN)
        .args(["skip", &id, "fragile", "--server", &server.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(step(&job, "fragile")["state"], "skipped");
    assert_eq!(step(&job, "after")["result"], "after ran");
}

// Proves self-repair: the server is made to die right after committing a step's result but
// before advancing the job (a fault-injection point); after a restart the supervisor's repair
// scan finds the job inconsistent, readies the next step, and the job succeeds.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_heals_a_job_left_half_advanced() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_faulty(dir.path(), "crash-after-step-result");
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [
            {"name": "a", "agent": "manual"},
            {"name": "b", "agent": "auto", "depends_on": ["a"]}
        ]}))
        .await;
    let (_, body) = api
        .post(
            "/v1/agents/manual/leases",
            &json!({"worker": "me", "wait": "10s"}),
        )
        .await;
    let lid = body["leases"][0]["lease_id"].as_str().unwrap().to_string();
    // The server aborts while answering this: the step's result is committed, nothing else.
    let _ = reqwest::Client::new()
        .post(format!("{}/v1/leases/{lid}/complete", server.url))
        .json(&json!({"result": "a done"}))
        .send()
        .await;
    assert!(
        server.wait_exit(PATIENCE).is_some(),
        "the fault point killed the server"
    );
    server.restart_clean();
    let _auto = Agent::start(&server, "auto", "cat >/dev/null; echo '\"b done\"'");
    let job = server.api().wait_terminal(&id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(step(&job, "a")["result"], "a done");
    let events = server.api().events(&id).await;
    assert!(
        events.iter().any(|e| e["kind"] == "job_repaired"),
        "{events:?}"
    );
}

/// A receiver for webhooks and callbacks that records what it got.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Delivered>>>);

/// (path, Idempotency-Key header, body) of one request received.
type Delivered = (String, Option<String>, Value);

/// The raw body and Standard Webhooks headers of each request received, to check signatures.
#[derive(Clone, Default)]
struct Signed(Arc<Mutex<Vec<Raw>>>);

/// The headers and raw body of one request received.
type Raw = (axum::http::HeaderMap, Vec<u8>);

async fn receive(port: u16, got: Received, signed: Signed) {
    use axum::routing::post;
    let record = |path: &'static str| {
        let (got, signed) = (got.clone(), signed.clone());
        move |headers: axum::http::HeaderMap, raw: axum::body::Bytes| {
            let (got, signed) = (got.clone(), signed.clone());
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                got.0.lock().unwrap().push((path.to_string(), key, body));
                signed.0.lock().unwrap().push((headers, raw.to_vec()));
                "ok"
            }
        }
    };
    let app = axum::Router::new()
        .route("/alerts", post(record("alerts")))
        .route("/callback", post(record("callback")));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    axum::serve(listener, app).await.unwrap();
}

/// A `webhook_secret` for the tests: `whsec_` and the base64 of 32 bytes.
const WEBHOOK_SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

// Proves alerts and callbacks are delivered even when the receiver is down at first: a failed
// job raises an alert to the webhook and calls its callback URL, both retried until the receiver
// comes up, each carrying an idempotency key and a signature that the README's verification
// recipe (`examples/verify_webhook.py`, run with python3) accepts; metrics count them. The
// receiver is on 127.0.0.1, which `outbound_allow` opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_and_callbacks_survive_a_down_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("overseer.toml");
    std::fs::write(
        &config,
        format!(
            "alert_webhook = \"http://127.0.0.1:{port}/alerts\"\noutbound_allow = [\"127.0.0.1\"]\nwebhook_secret = \"{WEBHOOK_SECRET}\"\n"
        ),
    )
    .unwrap();
    let server = Server::start_with(dir.path(), &["--config", config.to_str().unwrap()]);
    let _agent = Agent::start_with(
        &server,
        "doomed",
        &["--fatal-exit-codes", "9"],
        &["sh", "-c", "cat >/dev/null; exit 9"],
    );
    let api = server.api();
    let id = api
        .submit(
            &json!({"callback_url": format!("http://127.0.0.1:{port}/callback"),
            "steps": [{"name": "x", "agent": "doomed"}]}),
        )
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed");
    // The receiver is down: let at least one delivery attempt fail before it comes up.
    wait_for("a failed delivery attempt", || {
        let api = api.clone();
        async move {
            let (_, text) = api.get("/metrics").await;
            let text = text.as_str().unwrap_or("").to_string();
            text.contains("outcome=\"retry\"").then_some(())
        }
    })
    .await;
    let got = Received::default();
    let signed = Signed::default();
    tokio::spawn(receive(port, got.clone(), signed.clone()));
    let all = wait_for("the alert and the callback", || {
        let got = got.clone();
        async move {
            let v = got.0.lock().unwrap().clone();
            let alert = v
                .iter()
                .any(|(p, _, b)| p == "alerts" && b["kind"] == "job_failed");
            let callback = v.iter().any(|(p, _, _)| p == "callback");
            (alert && callback).then_some(v)
        }
    })
    .await;
    let (_, key, body) = all.iter().find(|(p, _, _)| p == "callback").unwrap();
    assert_eq!(body["job_id"], id.as_str());
    assert_eq!(body["state"], "failed");
    assert_eq!(
        key.as_deref(),
        Some(format!("{id}/callback/failed").as_str())
    );
    let (_, alert_key, alert) = all
        .iter()
        .find(|(p, _, b)| p == "alerts" && b["kind"] == "job_failed")
        .unwrap();
    assert!(alert_key.is_some());
    assert_eq!(alert["job_id"], id.as_str());
    for (headers, body) in signed.0.lock().unwrap().iter() {
        assert!(verifies(headers, body, WEBHOOK_SECRET), "{headers:?}");
        let forged: Vec<u8> = body.iter().rev().copied().collect();
        assert!(
            !verifies(headers, &forged, WEBHOOK_SECRET),
            "a changed body must not verify"
        );
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (_, text) = api.get("/metrics").await;
    let text = text.as_str().unwrap().to_string();
    assert!(
        text.contains("overseer_alerts_total{kind=\"job_failed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("overseer_jobs_finished_total{state=\"failed\"} 1"),
        "{text}"
    );
}

/// Runs the README's recipe, `examples/verify_webhook.py`, on one received delivery.
fn verifies(headers: &axum::http::HeaderMap, body: &[u8], secret: &str) -> bool {
    use std::io::Write;
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let mut child = std::process::Command::new("python3")
        .arg(workspace_root().join("examples/verify_webhook.py"))
        .args([
            secret.to_string(),
            h("webhook-id"),
            h("webhook-timestamp"),
            h("webhook-signature"),
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the recipe");
    child.stdin.take().unwrap().write_all(body).unwrap();
    child.wait().unwrap().success()
}

// Proves the outbound guard: a callback to an internal IP literal (loopback, cloud metadata) is
// refused at submit with a 400 naming `callback_url`; a name that resolves to loopback
// (`localhost`) is accepted at submit but refused when the delivery connects, the reason is
// logged and the receiver gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_to_internal_addresses_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let port = free_port();
    for url in [
        format!("http://127.0.0.1:{port}/callback"),
        "http://169.254.169.254/latest/meta-data".to_string(),
        format!("http://[::1]:{port}/callback"),
    ] {
        let (status, problem) = api
            .post(
                "/v1/jobs",
                &json!({"callback_url": url, "steps": [{"name": "s", "agent": "a"}]}),
            )
            .await;
        assert_eq!(status, 400, "{url}: {problem}");
        assert_eq!(problem["field"], "callback_url", "{problem}");
    }
    let got = Received::default();
    tokio::spawn(receive(port, got.clone(), Signed::default()));
    let _agent = Agent::start(&server, "a", "cat >/dev/null; echo '\"ok\"'");
    let id = api
        .submit(
            &json!({"callback_url": format!("http://localhost:{port}/callback"),
                        "steps": [{"name": "s", "agent": "a"}]}),
        )
        .await;
    api.wait_terminal(&id).await;
    wait_for("the refused delivery in the log", || {
        let logs = server.logs();
        async move {
            logs.contains("resolves only to internal addresses")
                .then_some(())
        }
    })
    .await;
    assert!(
        got.0.lock().unwrap().is_empty(),
        "nothing reached the receiver"
    );
}

/// Two more webhook keys for the rotation test (base64 of 32 bytes each).
const NEW_KEY: &str = "whsec_bmV3LWtleS1uZXcta2V5LW5ldy1rZXktbmV3LWtleSE=";
const OTHER_KEY: &str = "whsec_b3RoZXIta2V5LW90aGVyLWtleS1vdGhlci1rZXkhISE=";

/// Submits a one-step job with a callback to the receiver on `port`, runs it with an agent on
/// `agent_server`, and returns the callback's headers and raw body once it arrived.
async fn one_callback(submit_to: &Server, agent_server: &Server, port: u16) -> Raw {
    let got = Received::default();
    let signed = Signed::default();
    tokio::spawn(receive(port, got, signed.clone()));
    let _agent = Agent::start(agent_server, "quick", "cat >/dev/null; echo '{}'");
    let id = submit_to
        .api()
        .submit(
            &json!({"callback_url": format!("http://127.0.0.1:{port}/callback"),
                        "steps": [{"name": "x", "agent": "quick"}]}),
        )
        .await;
    assert_eq!(
        submit_to.api().wait_terminal(&id).await["state"],
        "succeeded"
    );
    wait_for("the callback", || {
        let signed = signed.clone();
        async move { signed.0.lock().unwrap().first().cloned() }
    })
    .await
}

// Proves webhook key rotation: with `webhook_secrets = [new, old]` every delivery carries two
// signatures, and the README's recipe accepts it with either key (not with a third); the API
// never returns a configured key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_keys_rotate_with_two_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = dir.path().join("overseer.toml");
    std::fs::write(
        &config,
        format!(
            "outbound_allow = [\"127.0.0.1\"]\nwebhook_secrets = [\"{NEW_KEY}\", \"{WEBHOOK_SECRET}\"]\n"
        ),
    )
    .unwrap();
    let server = Server::start_with(dir.path(), &["--config", config.to_str().unwrap()]);
    let (headers, body) = one_callback(&server, &server, port).await;
    let signatures = headers["webhook-signature"].to_str().unwrap();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    assert!(verifies(&headers, &body, NEW_KEY), "the new key verifies");
    assert!(
        verifies(&headers, &body, WEBHOOK_SECRET),
        "the old key verifies"
    );
    assert!(
        !verifies(&headers, &body, OTHER_KEY),
        "another key does not"
    );
    let (status, shown) = server.api().get("/v1/settings/webhook-secret").await;
    assert_eq!(status, 200);
    assert_eq!(shown, json!({"source": "configured", "secret": null}));
}

// Proves the generated key: two nodes on one PostgreSQL database with no key configured sign
// with the same generated 256-bit key, which `GET /v1/settings/webhook-secret` and `overseer
// webhook-secret` show on either node; a delivery made by one node verifies with it, and
// neither node's log holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_webhook_key_is_shared_by_the_cluster() {
    let db = overseer_store::pgtest::PgCluster::shared()
        .fresh_database()
        .await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let flags = ["--outbound-allow", "127.0.0.1"];
    let a = Server::start_with_db(dir_a.path(), &db, &flags);
    let b = Server::start_with_db(dir_b.path(), &db, &flags);
    let (_, shown_a) = a.api().get("/v1/settings/webhook-secret").await;
    let (_, shown_b) = b.api().get("/v1/settings/webhook-secret").await;
    assert_eq!(shown_a["source"], "generated", "{shown_a}");
    assert_eq!(shown_a, shown_b, "both nodes use one key");
    let secret = shown_a["secret"].as_str().unwrap().to_string();
    let key = secret.strip_prefix("whsec_").expect("whsec_ prefix");
    assert_eq!(key.len(), 44, "base64 of 32 bytes: {secret}");
    let cli = std::process::Command::new(BIN)
        .args(["webhook-secret", "--server", &b.url])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cli.stdout).trim(), secret);
    let (headers, body) = one_callback(&b, &a, free_port()).await;
    assert!(verifies(&headers, &body, &secret), "{headers:?}");
    assert!(!verifies(&headers, &body, WEBHOOK_SECRET));
    for node in [&a, &b] {
        let logs = node.logs();
        assert!(logs.contains("generated webhook secret"), "{logs}");
        assert!(!logs.contains(key), "the key leaked into a log");
    }
}

// Proves a step's deadline stops work that heartbeats forever: a command that sleeps 60 s under
// `timeout: 3s, deadline: 10s` keeps its lease past 3 s (the agent heartbeats), is killed with
// its whole process group at 10 s, is retried, and the job ends `failed` after `max_attempts`;
// the history names the deadline, and each attempt ended within one sweep of its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_past_its_deadline_is_stopped_retried_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let pids = dir.path().join("pids");
    let _agent = Agent::start(
        &server,
        "hang",
        &format!(
            "cat >/dev/null; sleep 60 & echo $! >> {p}; wait",
            p = pids.display()
        ),
    );
    let id = api
        .submit(
            &json!({"steps": [{"name": "hang", "agent": "hang", "timeout": "3s",
            "deadline": "10s", "max_attempts": 2, "backoff": {"initial": "100ms"}}]}),
        )
        .await;
    // Watch each attempt's process: alive past the 3 s timeout, dead soon after 10 s.
    let mut lifetimes = Vec::new();
    for n in 1..=2 {
        let (pid, started) = wait_for("an attempt to start", || {
            let pids = pids.clone();
            async move {
                let text = std::fs::read_to_string(&pids).unwrap_or_default();
                let pid: u32 = text.lines().nth(n - 1)?.trim().parse().ok()?;
                Some((pid, std::time::Instant::now()))
            }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(process_alive(pid), "attempt {n} died before its deadline");
        wait_for("the attempt's process to be killed", || async move {
            (!process_alive(pid)).then_some(())
        })
        .await;
        lifetimes.push(started.elapsed());
    }
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    let s = step(&job, "hang");
    assert_eq!(
        (s["attempt"].as_u64(), s["failures"].as_u64()),
        (Some(2), Some(2)),
        "{job}"
    );
    assert_eq!(s["deadline"], "10s", "{job}");
    for life in &lifetimes {
        assert!(
            *life >= Duration::from_secs(8) && *life < Duration::from_secs(13),
            "an attempt lived {life:?}, not about 10 s: {lifetimes:?}"
        );
    }
    let events = api.events(&id).await;
    let at = |kind: &str| -> Vec<i64> {
        events
            .iter()
            .filter(|e| e["kind"] == kind)
            .map(|e| millis(&e["at"]))
            .collect()
    };
    let (leased, overrun) = (at("step_leased"), at("step_deadline_exceeded"));
    assert_eq!((leased.len(), overrun.len()), (2, 2), "{events:?}");
    assert!(
        at("step_lease_expired").is_empty(),
        "silence was never the cause: {events:?}"
    );
    for (start, end) in leased.iter().zip(&overrun) {
        // The sweep runs every 200 ms in tests: no attempt outlives its deadline by more.
        let over = end - start - 10_000;
        assert!(
            (0..=1_000).contains(&over),
            "ended {over} ms after its deadline"
        );
    }
    // Every failure is the deadline: the agent never reported after it.
    for e in events
        .iter()
        .filter(|e| e["kind"] == "step_retry_scheduled" || e["kind"] == "step_failed")
    {
        let error = e["detail"]["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("deadline exceeded"), "{e}");
    }
}

// Proves whole-job retry end to end: with `on_failure: compensate_and_retry` and
// `job_attempts: 2`, a job whose second step always fails undoes its first step, runs the whole
// job again from its root (a new attempt number, never a reused one), undoes it again, and ends
// `failed` in round 2; `overseer status` shows the round, and the history has each round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_job_retry_undoes_and_runs_each_round() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let journal = dir.path().join("journal");
    let _work = Agent::start(&server, "work", &journaling(&journal, "do"));
    let _undo = Agent::start(&server, "undo", &journaling(&journal, "undo"));
    let _broken = Agent::start_with(
        &server,
        "broken",
        &["--fatal-exit-codes", "3"],
        &["sh", "-c", "cat >/dev/null; echo 'declined' >&2; exit 3"],
    );
    let api = server.api();
    let id = api
        .submit(
            &json!({"on_failure": "compensate_and_retry", "job_attempts": 2,
            "job_backoff": {"initial": "100ms"},
            "steps": [
                {"name": "reserve", "agent": "work", "compensate": {"agent": "undo"}},
                {"name": "charge", "agent": "broken", "depends_on": ["reserve"]}
            ]}),
        )
        .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(
        (job["round"].as_u64(), job["job_attempts"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(step(&job, "reserve")["state"], "compensated", "{job}");
    assert_eq!(
        step(&job, "reserve")["attempt"],
        4,
        "do, undo, do, undo: {job}"
    );
    assert_eq!(step(&job, "charge")["attempt"], 2, "{job}");
    let lines: Vec<String> = journal_lines(&journal)
        .into_iter()
        .map(|l| l.split(' ').take(4).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        lines,
        [
            "do reserve 1 work",
            "undo reserve 2 compensate",
            "do reserve 3 work",
            "undo reserve 4 compensate"
        ],
        "each round undoes exactly what succeeded in it"
    );
    let kinds: Vec<String> = api
        .events(&id)
        .await
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    let rounds = kinds.iter().filter(|k| *k == "job_round_started").count();
    assert_eq!(rounds, 1, "{kinds:?}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_overseer"))
        .args(["status", &id, "--server", &server.url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("round: 2 of 2"), "{text}");
}

// Proves `job_exhausted: hold` end to end: with two rounds, the first failed round is undone
// and the job starts over; the step failing for good in the last round blocks the job with
// that round's work kept (not undone), the reason naming the last round and `overseer status`
// the policy; the operator's cancel then undoes the round and the job ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_job_retry_holds_after_its_last_round() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let journal = dir.path().join("journal");
    let _work = Agent::start(&server, "work", &journaling(&journal, "do"));
    let _undo = Agent::start(&server, "undo", &journaling(&journal, "undo"));
    let _broken = Agent::start_with(
        &server,
        "broken",
        &["--fatal-exit-codes", "3"],
        &["sh", "-c", "cat >/dev/null; echo 'declined' >&2; exit 3"],
    );
    let api = server.api();
    let id = api
        .submit(
            &json!({"on_failure": "compensate_and_retry", "job_attempts": 2,
            "job_exhausted": "hold", "job_backoff": {"initial": "100ms"},
            "steps": [
                {"name": "reserve", "agent": "work", "compensate": {"agent": "undo"}},
                {"name": "charge", "agent": "broken", "depends_on": ["reserve"]}
            ]}),
        )
        .await;
    let blocked = wait_for("the last round to block", || {
        let (api, id) = (api.clone(), id.clone());
        async move {
            let job = api.job(&id).await;
            (job["state"] == "blocked").then_some(job)
        }
    })
    .await;
    assert_eq!(
        (blocked["round"].as_u64(), blocked["job_exhausted"].as_str()),
        (Some(2), Some("hold")),
        "{blocked}"
    );
    assert_eq!(
        step(&blocked, "reserve")["state"],
        "succeeded",
        "kept: {blocked}"
    );
    assert_eq!(step(&blocked, "charge")["state"], "failed", "{blocked}");
    let reason = blocked["blocked_reason"].as_str().unwrap_or_default();
    assert!(reason.contains("last round, 2 of 2"), "{reason}");
    let stripped = |lines: Vec<String>| -> Vec<String> {
        lines
            .into_iter()
            .map(|l| l.split(' ').take(4).collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(
        stripped(journal_lines(&journal)),
        [
            "do reserve 1 work",
            "undo reserve 2 compensate",
            "do reserve 3 work"
        ],
        "round 1 undone, round 2 held with its work"
    );
    let out = std::process::Command::new(BIN)
        .args(["status", &id, "--server", &server.url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("round: 2 of 2 (after the last: hold)"),
        "{text}"
    );
    let (status, cancelled) = api.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    assert_eq!(job["compensated"], json!(["reserve"]), "{job}");
    assert_eq!(
        stripped(journal_lines(&journal)),
        [
            "do reserve 1 work",
            "undo reserve 2 compensate",
            "do reserve 3 work",
            "undo reserve 4 compensate"
        ]
    );
}

// Proves a job's `deadline` end to end: `reserve` succeeds, `hang` heartbeats past the job's
// 4 s deadline, `ship` waits behind it. At the deadline the job stops wanting its work: `ship`
// is never leased, the hanging command is told to stop and killed, nothing is leased after
// the deadline but the undo, `reserve` is undone (its undo ran once), and the job ends `failed`
// naming the deadline, within a sweep or so of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_deadline_stops_undoes_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let journal = dir.path().join("journal");
    let pids = dir.path().join("pids");
    let _work = Agent::start(&server, "work", &journaling(&journal, "do"));
    let _undo = Agent::start(&server, "undo", &journaling(&journal, "undo"));
    let _hang = Agent::start(
        &server,
        "hang",
        &format!(
            "cat >/dev/null; sleep 60 & echo $! >> {p}; wait",
            p = pids.display()
        ),
    );
    let id = api
        .submit(&json!({"deadline": "4s", "steps": [
            {"name": "reserve", "agent": "work", "compensate": {"agent": "undo"}},
            {"name": "hang", "agent": "hang", "depends_on": ["reserve"], "timeout": "2s"},
            {"name": "ship", "agent": "work", "depends_on": ["hang"]}
        ]}))
        .await;
    let pid: u32 = wait_for("the hanging command to start", || {
        let pids = pids.clone();
        async move {
            let text = std::fs::read_to_string(&pids).unwrap_or_default();
            text.lines().next()?.trim().parse().ok()
        }
    })
    .await;
    let job = api.wait_terminal(&id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["compensated"], json!(["reserve"]), "{job}");
    assert_eq!(step(&job, "reserve")["state"], "compensated", "{job}");
    assert_eq!(
        (
            step(&job, "ship")["state"].as_str(),
            step(&job, "ship")["attempt"].as_u64()
        ),
        (Some("cancelled"), Some(0)),
        "nothing new starts past the deadline: {job}"
    );
    assert_ne!(step(&job, "hang")["state"], "succeeded", "{job}");
    wait_for("the hanging command to be stopped", || async move {
        (!process_alive(pid)).then_some(())
    })
    .await;

    let events = api.events(&id).await;
    let deadline = millis(&job["deadline"]);
    let passed = events
        .iter()
        .find(|e| e["kind"] == "job_deadline_passed")
        .unwrap_or_else(|| panic!("no job_deadline_passed: {events:?}"));
    let passed_at = millis(&passed["at"]);
    assert!(
        (deadline..=deadline + 1_500).contains(&passed_at),
        "enforced {} ms after the deadline",
        passed_at - deadline
    );
    let after: Vec<&Value> = events
        .iter()
        .filter(|e| millis(&e["at"]) >= passed_at && e["kind"] == "step_leased")
        .collect();
    assert!(
        after.is_empty(),
        "work leased after the deadline: {after:?}"
    );
    let unwound = events
        .iter()
        .find(|e| e["kind"] == "job_compensating")
        .unwrap_or_else(|| panic!("no job_compensating: {events:?}"));
    assert_eq!(unwound["detail"]["cause"], "deadline", "{unwound}");
    let failed = events.iter().find(|e| e["kind"] == "job_failed").unwrap();
    assert_eq!(
        failed["detail"]["compensated"],
        json!(["reserve"]),
        "{failed}"
    );
    let lines = journal_lines(&journal);
    let undos: Vec<&String> = lines.iter().filter(|l| l.starts_with("undo")).collect();
    assert_eq!(undos.len(), 1, "the undo ran once: {lines:?}");
    assert!(undos[0].starts_with("undo reserve"), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("do ship")),
        "ship never ran: {lines:?}"
    );
}
