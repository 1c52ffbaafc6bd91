//! Authentication end to end: a server that requires tokens, real HTTP, real token secrets.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// An admin secret given as a setting (never stored).
const ADMIN: &str = "admin-secret-for-tests-0123456789abcdef";

fn secured(dir: &std::path::Path) -> Server {
    Server::start_with(dir, &["--auth", "required", "--admin-token", ADMIN])
}

/// One call; a 429 for too many failed authentications is waited out (as its `Retry-After`
/// says) and the call made again, so the matrix below can make hundreds of refused calls.
async fn call(
    server: &Server,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    loop {
        let (status, answer) = call_once(server, token, method, path, body).await;
        if status != 429 {
            return (status, answer);
        }
        tokio::time::sleep(Duration::from_millis(1_000)).await;
    }
}

async fn call_once(
    server: &Server,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let http = reqwest::Client::new();
    let url = format!("{}{path}", server.url);
    let mut req = http.request(method.parse().unwrap(), url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let res = req.send().await.expect("request");
    let status = res.status().as_u16();
    let ctype = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    // A live stream never ends: its status and headers are the answer.
    if ctype.starts_with("text/event-stream") {
        return (status, Value::Null);
    }
    let body: Value = res.json().await.unwrap_or(Value::Null);
    if status == 401 || status == 403 {
        assert_eq!(ctype, "application/problem+json", "{method} {path}");
    }
    (status, body)
}

async fn make_token(server: &Server, name: &str, scopes: &[&str], agents: &[&str]) -> String {
    let (status, body) = call(
        server,
        Some(ADMIN),
        "POST",
        "/v1/tokens",
        Some(&json!({"name": name, "scopes": scopes, "agents": agents})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["secret"].as_str().unwrap().to_string()
}

// Proves every route of the API against every scope: no token and a bad token get 401, a token
// whose scopes do not cover the route gets 403, a covering one gets through (whatever the
// route then answers); 401 and 403 never depend on whether the job or lease exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_against_every_scope() {
    let dir = tempfile::tempdir().unwrap();
    let server = secured(dir.path());
    let mut tokens = Vec::new();
    for scope in ["admin", "operate", "submit", "read", "agent"] {
        tokens.push((
            scope,
            make_token(&server, &format!("t-{scope}"), &[scope], &[]).await,
        ));
    }
    for (method, template, allowed) in MATRIX {
        let (path, body) = (concrete(template), body_for(method, template));
        let (method, path, body) = (*method, path.as_str(), Some(&body));
        let public = *template == "/healthz" || *template == "/readyz";
        for token in [None, Some("ovr_not-a-real-token")] {
            let (status, problem) = call(&server, token, method, path, body).await;
            let expected = if public { 200 } else { 401 };
            assert_eq!(
                status, expected,
                "{method} {path} with {token:?}: {problem}"
            );
        }
        for (scope, secret) in &tokens {
            let (status, answer) = call(&server, Some(secret), method, path, body).await;
            if allowed.contains(scope) {
                assert!(
                    status != 401 && status != 403,
                    "{scope} on {method} {path}: {status} {answer}"
                );
            } else {
                assert_eq!(status, 403, "{scope} on {method} {path}: {answer}");
            }
        }
    }
    let (status, _) = call(&server, None, "GET", "/healthz", None).await;
    assert_eq!(status, 200, "probes stay public");
}

// Proves an agent token bound to `dns` takes `dns` leases but gets 403 on `billing` ones, and a
// revoked token is refused at once on the node that revoked it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_binding_and_revocation() {
    let dir = tempfile::tempdir().unwrap();
    let server = secured(dir.path());
    let dns = make_token(&server, "dns-worker", &["agent"], &["dns"]).await;
    let body = json!({"worker": "w", "wait": "0s"});
    let (status, _) = call(
        &server,
        Some(&dns),
        "POST",
        "/v1/agents/dns/leases",
        Some(&body),
    )
    .await;
    assert_eq!(status, 200);
    let (status, problem) = call(
        &server,
        Some(&dns),
        "POST",
        "/v1/agents/billing/leases",
        Some(&body),
    )
    .await;
    assert_eq!(status, 403, "{problem}");
    let (status, _) = call(
        &server,
        Some(ADMIN),
        "DELETE",
        "/v1/tokens/dns-worker",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call(
        &server,
        Some(&dns),
        "POST",
        "/v1/agents/dns/leases",
        Some(&body),
    )
    .await;
    assert_eq!(status, 401);
    let (_, listed) = call(&server, Some(ADMIN), "GET", "/v1/tokens", None).await;
    let text = listed.to_string();
    assert!(
        !text.contains(&dns) && !text.contains("hash"),
        "no secret or hash is listed: {text}"
    );
    assert!(listed["tokens"][0]["revoked_at"].is_string(), "{listed}");
}

// Proves the secure default: on a non-loopback address with no token in the store the server
// refuses to start and says how to make the first one; `--auth off` there is refused too.
#[test]
fn off_loopback_needs_a_token_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("o.db").display());
    let listen = format!("0.0.0.0:{}", free_port());
    for extra in [&[][..], &["--auth", "off"][..]] {
        let mut child = Command::new(BIN)
            .args(["server", "--db", &db, "--listen", &listen])
            .args(extra)
            .env_remove("OVERSEER_ADMIN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the server started");
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        let says = if extra.is_empty() {
            "overseer tokens create --bootstrap"
        } else {
            "cannot be off"
        };
        assert!(stderr.contains(says), "{stderr}");
    }
}

// Proves the CLI round trip: `tokens create --bootstrap` writes the first admin token into the
// store and prints its secret once; with it the server starts off loopback, and `tokens create`
// over the API, `tokens list` (no secrets) and `tokens revoke` work with `--token`.
#[test]
fn cli_bootstrap_create_list_revoke() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("o.db").display());
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let admin = run(&[
        "tokens",
        "create",
        "--bootstrap",
        "--db",
        &db,
        "--name",
        "admin",
        "--scope",
        "admin",
    ]);
    assert!(admin.starts_with("ovr_"), "{admin}");
    let port = free_port();
    let mut server = Command::new(BIN)
        .args([
            "server",
            "--db",
            &db,
            "--listen",
            &format!("0.0.0.0:{port}"),
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline && server.try_wait().unwrap().is_none(),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ci = run(&[
        "tokens",
        "create",
        "--name",
        "ci",
        "--scope",
        "submit",
        "--expires",
        "90d",
        "--server",
        &url,
        "--token",
        &admin,
    ]);
    assert!(ci.starts_with("ovr_"));
    let listed = run(&["tokens", "list", "--server", &url, "--token", &admin]);
    assert!(
        listed.contains("ci") && listed.contains("submit") && !listed.contains(&ci),
        "{listed}"
    );
    run(&[
        "tokens", "revoke", "ci", "--server", &url, "--token", &admin,
    ]);
    let refused = Command::new(BIN)
        .args(["jobs", "--server", &url, "--token", &ci])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("revoked"));
    let _ = server.kill();
    let _ = server.wait();
}

// Proves failed authentications are rate limited: a burst of bad tokens soon gets 429 with
// `Retry-After`, and a good token still gets through meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_are_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let server = secured(dir.path());
    let mut limited = false;
    for _ in 0..60 {
        let (status, _) = call_once(&server, Some("ovr_guess"), "GET", "/v1/jobs", None).await;
        limited |= status == 429;
    }
    assert!(limited, "60 failures in a burst were never limited");
    let (status, _) = call_once(&server, Some(ADMIN), "GET", "/v1/jobs", None).await;
    assert_eq!(status, 200);
}

// Proves secrets stay out of the server's log: a run that authenticates with a token, submits a
// payload, completes a lease with a result and fails one with an error, each carrying a planted
// secret, leaves none of them (nor the admin secret) in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let server = secured(dir.path());
    let token = make_token(&server, "all", &["admin"], &[]).await;
    let planted = "PLANTED-7f3a9c";
    let spec = json!({"steps": [{"name": "a", "agent": "leak", "payload": {"card": planted}},
                                {"name": "b", "agent": "leak", "max_attempts": 1}]});
    let (status, _) = call(&server, Some(&token), "POST", "/v1/jobs", Some(&spec)).await;
    assert_eq!(status, 202);
    let take = json!({"worker": "w", "max": 2, "wait": "1s"});
    let (_, leases) = call(
        &server,
        Some(&token),
        "POST",
        "/v1/agents/leak/leases",
        Some(&take),
    )
    .await;
    for lease in leases["leases"].as_array().unwrap() {
        let id = lease["lease_id"].as_str().unwrap();
        let (path, body) = match lease["step"].as_str() {
            Some("a") => (
                format!("/v1/leases/{id}/complete"),
                json!({"result": {"echo": planted}}),
            ),
            _ => (
                format!("/v1/leases/{id}/fail"),
                json!({"error": planted, "retryable": false}),
            ),
        };
        let (status, answer) = call(&server, Some(&token), "POST", &path, Some(&body)).await;
        assert_eq!(status, 200, "{answer}");
    }
    let logs = server.logs();
    assert!(logs.contains("job accepted"), "the log has lines: {logs}");
    for secret in [planted, ADMIN, token.as_str()] {
        assert!(
            !logs.contains(secret),
            "`{secret}` leaked into the log:\n{logs}"
        );
    }
}

/// Every (method, path template) pair `/openapi.json` documents.
async fn documented(server: &Server) -> Vec<(String, String)> {
    let (status, doc) = call(server, None, "GET", "/openapi.json", None).await;
    assert_eq!(status, 200, "the document is public: {doc}");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "delete", "patch"] {
            if item.get(method).is_some() {
                ops.push((method.to_uppercase(), path.clone()));
            }
        }
    }
    ops.sort();
    ops
}

/// A template with its parameters filled in.
fn concrete(template: &str) -> String {
    template
        .replace("{id}", "01a3185c-774f-7d9a-a6ce-af10a0119486")
        .replace("{lease_id}", "00000000-0000-0000-0000-000000000000")
        .replace("{name}", "x")
        .replace("{agent}", "a")
        .replace("{key}", "k")
}

// Proves no route can skip authentication: every operation `/openapi.json` documents (the
// document is generated with the router, so a new route is in it) answers 401 without a token,
// except the two probes; and the scope matrix above covers exactly the documented operations,
// so a new route fails this test until its scopes are decided there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = secured(dir.path());
    let ops = documented(&server).await;
    assert!(ops.len() >= 33, "{ops:?}");
    for (method, template) in &ops {
        let body = json!({});
        let (status, answer) = call(&server, None, method, &concrete(template), Some(&body)).await;
        let public = template == "/healthz" || template == "/readyz";
        if public {
            assert_eq!(status, 200, "{method} {template}: {answer}");
        } else {
            assert_eq!(status, 401, "{method} {template}: {answer}");
        }
    }
    let mut matrix: Vec<(String, String)> = MATRIX
        .iter()
        .map(|(m, p, _)| (m.to_string(), p.to_string()))
        .collect();
    matrix.sort();
    assert_eq!(
        matrix, ops,
        "the scope matrix and the documented routes differ"
    );
}

const ALL_READERS: &[&str] = &["admin", "operate", "submit", "read"];
const OPERATORS: &[&str] = &["admin", "operate"];
const SUBMITTERS: &[&str] = &["admin", "submit"];
const AGENTS: &[&str] = &["admin", "agent"];
const ANYONE: &[&str] = &["admin", "operate", "submit", "read", "agent"];

/// Every operation of the API and the scopes that may call it.
const MATRIX: &[(&str, &str, &[&str])] = &[
    ("GET", "/healthz", ANYONE),
    ("GET", "/readyz", ANYONE),
    ("GET", "/metrics", ALL_READERS),
    ("POST", "/v1/jobs", SUBMITTERS),
    ("POST", "/v1/jobs:batch", SUBMITTERS),
    ("POST", "/v1/jobs:validate", SUBMITTERS),
    ("GET", "/v1/events/stream", ALL_READERS),
    ("GET", "/v1/jobs", ALL_READERS),
    ("GET", "/v1/jobs/{id}", ALL_READERS),
    ("PATCH", "/v1/jobs/{id}", OPERATORS),
    ("DELETE", "/v1/jobs/{id}", OPERATORS),
    ("GET", "/v1/jobs/{id}/events", ALL_READERS),
    ("GET", "/v1/jobs/{id}/wait", ALL_READERS),
    ("POST", "/v1/jobs/{id}/resume", OPERATORS),
    ("POST", "/v1/jobs/{id}/rerun", OPERATORS),
    ("POST", "/v1/jobs/{id}/steps/{name}/retry", OPERATORS),
    ("POST", "/v1/jobs/{id}/steps/{name}/skip", OPERATORS),
    ("POST", "/v1/jobs/{id}/cancel", OPERATORS),
    ("GET", "/v1/agents", ALL_READERS),
    ("POST", "/v1/agents/{agent}/leases", AGENTS),
    ("GET", "/v1/agents/{agent}/limits", ALL_READERS),
    ("PUT", "/v1/agents/{agent}/limits", OPERATORS),
    ("POST", "/v1/agents/{agent}/pause", OPERATORS),
    ("POST", "/v1/agents/{agent}/resume", OPERATORS),
    ("POST", "/v1/leases/{lease_id}/heartbeat", AGENTS),
    ("POST", "/v1/leases/{lease_id}/complete", AGENTS),
    ("POST", "/v1/leases/{lease_id}/fail", AGENTS),
    ("POST", "/v1/leases:report", AGENTS),
    ("POST", "/v1/schedules", OPERATORS),
    ("GET", "/v1/schedules", ALL_READERS),
    ("GET", "/v1/schedules/{name}", ALL_READERS),
    ("PUT", "/v1/schedules/{name}", OPERATORS),
    ("POST", "/v1/schedules/{name}/pause", OPERATORS),
    ("POST", "/v1/schedules/{name}/resume", OPERATORS),
    ("DELETE", "/v1/schedules/{name}", OPERATORS),
    ("GET", "/v1/ordering-keys/{key}", ALL_READERS),
    ("GET", "/v1/stats", ALL_READERS),
    ("GET", "/v1/alerts", ALL_READERS),
    ("GET", "/v1/tokens", &["admin"]),
    ("POST", "/v1/tokens", &["admin"]),
    ("DELETE", "/v1/tokens/{name}", &["admin"]),
    ("GET", "/v1/settings/webhook-secret", &["admin"]),
];

/// A body each operation accepts (auth is judged before the body, but a valid one lets an
/// allowed call go through to its handler).
fn body_for(method: &str, template: &str) -> Value {
    let spec = json!({"steps": [{"name": "s", "agent": "dns"}]});
    match (method, template) {
        ("POST", "/v1/jobs") => spec,
        ("POST", "/v1/jobs:batch") => json!({"jobs": [spec]}),
        ("POST", "/v1/jobs:validate") => spec,
        ("POST", "/v1/agents/{agent}/leases") => json!({"worker": "w", "wait": "0s"}),
        ("POST", "/v1/leases/{lease_id}/fail") => json!({"error": "x"}),
        ("POST", "/v1/leases:report") => json!({"reports": []}),
        ("POST", "/v1/schedules") => json!({"name": "x", "cron": "0 3 * * *", "job": spec}),
        ("PUT", "/v1/schedules/{name}") => json!({"name": "x", "cron": "@daily", "job": spec}),
        ("POST", "/v1/tokens") => json!({"name": "made-by-matrix", "scopes": ["read"]}),
        ("PATCH", "/v1/jobs/{id}") => json!({"priority": 1}),
        _ => json!({}),
    }
}

// Proves long-polls are bounded per token as well as per node: with
// `limits.long_polls_per_token = 2`, a token holding two waiting lease requests gets 429 for a
// third, while another token still gets its long-poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_are_bounded_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("overseer.toml");
    std::fs::write(&config, "[limits]\nlong_polls_per_token = 2\n").unwrap();
    let server = Server::start_with(
        dir.path(),
        &[
            "--auth",
            "required",
            "--admin-token",
            ADMIN,
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let greedy = make_token(&server, "greedy", &["agent"], &[]).await;
    let other = make_token(&server, "other", &["agent"], &[]).await;
    let wait = |secret: String, wait: &'static str| {
        let url = server.url.clone();
        async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/agents/idle/leases"))
                .bearer_auth(secret)
                .json(&json!({"worker": "w", "wait": wait}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(wait(greedy.clone(), "2s")))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        wait(greedy.clone(), "2s").await,
        429,
        "a third long-poll of one token"
    );
    assert_eq!(
        wait(other.clone(), "10ms").await,
        200,
        "another token is not affected"
    );
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(wait(greedy, "10ms").await, 200, "places are given back");
}

/// What an event stream opened with `token` sends while `during` runs and 1.5 s after.
async fn stream_text(
    server: &Server,
    token: &str,
    during: impl std::future::Future<Output = ()>,
) -> String {
    let mut res = reqwest::Client::new()
        .get(format!("{}/v1/events/stream", server.url))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    during.await;
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1_500);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline, res.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text
}

// Proves a `submit` token reads only the jobs it submitted: jobs record the submitting token's
// name (none for the admin setting); another submit token gets exactly the 404 of a job that
// does not exist on the job, its events and its wait, its list holds only its own jobs, its
// event stream carries only its own jobs' changes, an ordering key's head is shown only when it
// is its own, and resubmitting another's idempotency key
// is a 409 that shows nothing of that job; `read`, and `submit` with `read`, see everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_tokens_read_only_their_own_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let server = secured(dir.path());
    let alice = make_token(&server, "alice", &["submit"], &[]).await;
    let bob = make_token(&server, "bob", &["submit"], &[]).await;
    let reader = make_token(&server, "reader", &["read"], &[]).await;
    let both = make_token(&server, "both", &["submit", "read"], &[]).await;
    let spec =
        |key: &str| json!({"idempotency_key": key, "steps": [{"name": "s", "agent": "none"}]});
    let submit = |token: String, key: &'static str| {
        let server = &server;
        async move { call(server, Some(&token), "POST", "/v1/jobs", Some(&spec(key))).await }
    };
    let (status, a) = submit(alice.clone(), "k-alice").await;
    assert_eq!((status, &a["submitted_by"]), (202, &json!("alice")), "{a}");
    let (_, b) = submit(bob.clone(), "k-bob").await;
    let (_, c) = submit(ADMIN.to_string(), "k-admin").await;
    assert_eq!(
        c["submitted_by"],
        Value::Null,
        "the admin setting is no token: {c}"
    );
    let a_id = a["id"].as_str().unwrap().to_string();

    let missing = "01a3185c-774f-7d9a-a6ce-af10a0119486";
    for tail in ["", "/events", "/wait?timeout=10ms"] {
        let (status, hidden) = call(
            &server,
            Some(&bob),
            "GET",
            &format!("/v1/jobs/{a_id}{tail}"),
            None,
        )
        .await;
        let (_, absent) = call(
            &server,
            Some(&bob),
            "GET",
            &format!("/v1/jobs/{missing}{tail}"),
            None,
        )
        .await;
        assert_eq!(status, 404, "{tail}: {hidden}");
        assert_eq!(hidden["code"], absent["code"], "{tail}");
        assert_eq!(
            hidden["detail"].as_str().unwrap().replace(&a_id, missing),
            absent["detail"].as_str().unwrap(),
            "{tail}: the same answer as a missing job"
        );
        let (status, _) = call(
            &server,
            Some(&alice),
            "GET",
            &format!("/v1/jobs/{a_id}{tail}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "alice reads her own job{tail}");
    }
    let ids = |token: String| {
        let server = &server;
        async move {
            let (status, list) = call(server, Some(&token), "GET", "/v1/jobs", None).await;
            assert_eq!(status, 200, "{list}");
            let mut ids: Vec<String> = list["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(ids(alice.clone()).await, vec![a_id.clone()]);
    assert_eq!(
        ids(bob.clone()).await,
        vec![b["id"].as_str().unwrap().to_string()]
    );
    assert_eq!(ids(reader.clone()).await.len(), 3);
    assert_eq!(ids(both.clone()).await.len(), 3);
    let (status, _) = call(
        &server,
        Some(&both),
        "GET",
        &format!("/v1/jobs/{a_id}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "submit with read sees every job");

    let (status, taken) = submit(bob.clone(), "k-alice").await;
    assert_eq!(
        (status, &taken["code"]),
        (409, &json!("idempotency-conflict")),
        "{taken}"
    );
    assert!(!taken.to_string().contains(&a_id), "{taken}");
    let batch = json!({"jobs": [spec("k-alice")]});
    let (status, taken) = call(&server, Some(&bob), "POST", "/v1/jobs:batch", Some(&batch)).await;
    assert_eq!(
        (status, &taken["field"]),
        (409, &json!("jobs[0].idempotency_key")),
        "{taken}"
    );
    let (status, again) = submit(alice.clone(), "k-alice").await;
    assert_eq!(
        (status, &again["id"]),
        (200, &json!(a_id)),
        "her own resubmission"
    );

    let ordered = json!({"ordering_key": "line", "steps": [{"name": "s", "agent": "none"}]});
    let (status, _) = call(&server, Some(&alice), "POST", "/v1/jobs", Some(&ordered)).await;
    assert_eq!(status, 202);
    let key = |token: String| {
        let server = &server;
        async move {
            call(server, Some(&token), "GET", "/v1/ordering-keys/line", None)
                .await
                .1
        }
    };
    assert_eq!(key(alice.clone()).await["head"]["submitted_by"], "alice");
    assert_eq!(
        key(bob.clone()).await["head"],
        Value::Null,
        "not alice's job to bob"
    );
    assert_eq!(key(reader.clone()).await["head"]["submitted_by"], "alice");

    let seen_by_bob = stream_text(&server, &bob, async {
        submit(alice.clone(), "k-alice-2").await;
        submit(bob.clone(), "k-bob-2").await;
    })
    .await;
    let (_, a2) = call(&server, Some(&alice), "GET", "/v1/jobs?limit=1", None).await;
    let (_, b2) = call(&server, Some(&bob), "GET", "/v1/jobs?limit=1", None).await;
    let (a2, b2) = (
        a2["jobs"][0]["id"].as_str().unwrap(),
        b2["jobs"][0]["id"].as_str().unwrap(),
    );
    assert!(
        seen_by_bob.contains(b2),
        "bob's stream has his job: {seen_by_bob}"
    );
    assert!(!seen_by_bob.contains(a2), "but not alice's: {seen_by_bob}");
}
