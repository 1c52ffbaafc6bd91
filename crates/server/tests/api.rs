//! Route tests: the real router, a real SQLite store in a temp dir and a manual clock, driven
//! through `tower::ServiceExt::oneshot` without a socket. The supervisor is stepped by hand, so
//! time-dependent behaviour is checked without sleeping.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use overseer_core::{Span, Timestamp};
use overseer_server::supervisor::Supervisor;
use overseer_server::{api, App, Config, ManualClock};
use overseer_store::sqlite::{SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

struct Harness {
    app: App,
    router: Router,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

const T0: i64 = 1_800_000_000_000;

fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::new(dir.path().join("t.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let config = Config::default();
    let app = App::new(
        Arc::new(store),
        clock.clone(),
        &config,
        CancellationToken::new(),
    );
    Harness {
        router: api::router(app.clone()),
        app,
        clock,
        _dir: dir,
    }
}

impl Harness {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let req = Request::builder().method(method).uri(path);
        let req = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&b).unwrap())),
            None => req.body(Body::empty()),
        }
        .unwrap();
        let res = self.router.clone().oneshot(req).await.unwrap();
        let status = res.status();
        let ctype = res
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_client_error() || status.is_server_error() {
            assert_eq!(
                ctype.as_deref(),
                Some("application/problem+json"),
                "{status} {value}"
            );
        }
        (status, value)
    }

    async fn submit(&self, spec: Value) -> String {
        let (status, body) = self.call("POST", "/v1/jobs", Some(spec)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    async fn lease(&self, agent: &str, max: usize) -> Vec<Value> {
        let (status, body) = self
            .call(
                "POST",
                &format!("/v1/agents/{agent}/leases"),
                Some(json!({"worker": "w1", "max": max, "wait": "0s"})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["leases"].as_array().unwrap().clone()
    }

    async fn job(&self, id: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/v1/jobs/{id}"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    fn advance(&self, ms: u64) {
        self.clock.advance(Span::from_millis(ms));
    }

    async fn sweep(&self) {
        let mut sup = Supervisor::new(self.app.clone(), Span::from_secs(1));
        sup.sweep(self.app.now()).await.unwrap();
    }
}

fn step<'a>(job: &'a Value, name: &str) -> &'a Value {
    job["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

// Proves idempotent submits: the same key and body answer 200 with the same job; the same key
// with another body answers 409 naming the field, and nothing new is stored.
#[tokio::test]
async fn idempotency_keys() {
    let h = harness();
    let spec = json!({"idempotency_key": "order-1", "steps": [{"name": "a", "agent": "x"}]});
    let id = h.submit(spec.clone()).await;
    let (status, again) = h.call("POST", "/v1/jobs", Some(spec)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["id"], id.as_str());
    let other = json!({"idempotency_key": "order-1", "steps": [{"name": "b", "agent": "x"}]});
    let (status, problem) = h.call("POST", "/v1/jobs", Some(other)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["field"], "idempotency_key");
    let (_, list) = h.call("GET", "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
}

// Proves batches are all-or-nothing: one invalid job (named by index) or one conflicting key
// stores none of the batch.
/// Single submits arriving together are committed together (see `coalesce`), yet each gets the
/// answer it would get alone: a conflicting idempotency key fails that submit only, a repeated
/// one finds the stored job, and every other job is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_single_submits_each_get_their_own_answer() {
    let h = Arc::new(harness());
    let spec = |key: Option<&str>, agent: &str| match key {
        Some(k) => json!({"idempotency_key": k, "steps": [{"name": "s", "agent": agent}]}),
        None => json!({"steps": [{"name": "s", "agent": agent}]}),
    };
    let mut calls = Vec::new();
    for i in 0..60 {
        let body = match i % 6 {
            0 => spec(Some("shared"), "a"),
            1 => spec(Some("shared"), "other"),
            _ => spec(Some(&format!("own-{i}")), "a"),
        };
        let h = h.clone();
        calls.push(tokio::spawn(async move {
            (i, h.call("POST", "/v1/jobs", Some(body)).await)
        }));
    }
    let (mut created, mut found, mut conflicts) = (0, 0, 0);
    let mut shared_ids = std::collections::HashSet::new();
    for call in calls {
        let (i, (status, body)) = call.await.unwrap();
        match status {
            StatusCode::ACCEPTED => created += 1,
            StatusCode::OK => found += 1,
            StatusCode::CONFLICT => {
                assert_eq!(body["field"], "idempotency_key", "{body}");
                conflicts += 1;
            }
            other => panic!("submit {i}: {other} {body}"),
        }
        if i % 6 < 2 && status != StatusCode::CONFLICT {
            shared_ids.insert(body["id"].as_str().unwrap().to_string());
        }
    }
    // 40 own keys and one of the 20 "shared" ones are created; the other shared submits with
    // the winner's body find it, those with the other body conflict.
    assert_eq!(
        created, 41,
        "created {created}, found {found}, conflicts {conflicts}"
    );
    assert_eq!(found + conflicts, 19);
    assert_eq!(shared_ids.len(), 1, "one job holds the shared key");
    let (_, list) = h.call("GET", "/v1/jobs?limit=100", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 41);
}

// Proves reports arriving together, which a node commits in one store batch, each get their
// own answer: single completions and failures, workers' batches, a lease reported twice (one
// wins, the other is refused as stale) and an unknown lease, all at once.
#[tokio::test]
async fn concurrent_reports_each_get_their_own_answer() {
    let h = Arc::new(harness());
    let mut jobs = Vec::new();
    for _ in 0..30 {
        jobs.push(
            h.submit(json!({"steps": [{"name": "s", "agent": "r"}]}))
                .await,
        );
    }
    let leases = h.lease("r", 30).await;
    assert_eq!(leases.len(), 30);
    let lease = |i: usize| leases[i]["lease_id"].as_str().unwrap().to_string();
    let job_of = |i: usize| leases[i]["job_id"].as_str().unwrap().to_string();
    let mut calls = Vec::new();
    for i in 0..30 {
        let (method, path, body) = match i % 5 {
            0 => (
                "POST",
                format!("/v1/leases/{}/complete", lease(i)),
                json!({"result": i}),
            ),
            1 => (
                "POST",
                format!("/v1/leases/{}/fail", lease(i)),
                json!({"error": format!("e{i}"), "retryable": false}),
            ),
            2 => (
                "POST",
                "/v1/leases:report".to_string(),
                json!({"reports": [
                    {"outcome": "complete", "lease_id": lease(i), "result": i},
                    {"outcome": "complete", "lease_id": "00000000-0000-4000-8000-000000000000"},
                ]}),
            ),
            // Reported twice at once: by itself and inside a batch.
            3 => (
                "POST",
                format!("/v1/leases/{}/complete", lease(i)),
                json!({"result": i}),
            ),
            _ => (
                "POST",
                "/v1/leases:report".to_string(),
                json!({"reports": [
                    {"outcome": "complete", "lease_id": lease(i), "result": i},
                    {"outcome": "complete", "lease_id": lease(i - 1), "result": i},
                ]}),
            ),
        };
        let h = h.clone();
        calls.push(tokio::spawn(async move {
            (i, h.call(method, &path, Some(body)).await)
        }));
    }
    let mut twice_ok = std::collections::HashMap::<usize, usize>::new();
    for call in calls {
        let (i, (status, body)) = call.await.unwrap();
        match i % 5 {
            0 | 1 => {
                assert_eq!(status, StatusCode::OK, "report {i}: {body}");
                assert_eq!(body["job_id"], job_of(i).as_str(), "report {i}: {body}");
            }
            2 => {
                let results = body["results"].as_array().unwrap();
                assert_eq!(results[0]["status"], 200, "report {i}: {body}");
                assert_eq!(results[0]["job_id"], job_of(i).as_str());
                assert_eq!(results[1]["status"], 404, "report {i}: {body}");
            }
            3 => {
                if status == StatusCode::OK {
                    *twice_ok.entry(i).or_default() += 1;
                } else {
                    assert_eq!(status, StatusCode::CONFLICT, "report {i}: {body}");
                }
            }
            _ => {
                let results = body["results"].as_array().unwrap();
                assert_eq!(results[0]["status"], 200, "report {i}: {body}");
                assert_eq!(results[0]["lease_id"], lease(i).as_str());
                match results[1]["status"].as_u64().unwrap() {
                    200 => *twice_ok.entry(i - 1).or_default() += 1,
                    409 => {}
                    other => panic!("report {i}: {other} {body}"),
                }
            }
        }
    }
    for i in (3..30).step_by(5) {
        assert_eq!(
            twice_ok.get(&i),
            Some(&1),
            "lease {i} was applied once: {twice_ok:?}"
        );
    }
    for k in 0..30 {
        let job = h.job(&job_of(k)).await;
        let want = if k % 5 == 1 { "failed" } else { "succeeded" };
        assert_eq!(job["state"], want, "lease {k}: {job}");
    }
    let mut leased: Vec<String> = (0..30).map(job_of).collect();
    leased.sort();
    jobs.sort();
    assert_eq!(leased, jobs, "every job was leased once");
}

#[tokio::test]
async fn batches_are_all_or_nothing() {
    let h = harness();
    h.submit(json!({"idempotency_key": "k", "steps": [{"name": "a", "agent": "x"}]}))
        .await;
    let bad = json!({"jobs": [
        {"steps": [{"name": "a", "agent": "x"}]},
        {"steps": [{"name": "a", "agent": "x", "depends_on": ["ghost"]}]}
    ]});
    let (status, problem) = h.call("POST", "/v1/jobs:batch", Some(bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["field"], "jobs[1].steps[0].depends_on[0]");
    let conflicting = json!({"jobs": [
        {"steps": [{"name": "a", "agent": "x"}]},
        {"idempotency_key": "k", "steps": [{"name": "zzz", "agent": "x"}]}
    ]});
    let (status, problem) = h.call("POST", "/v1/jobs:batch", Some(conflicting)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(problem["field"], "jobs[1].idempotency_key");
    let (_, list) = h.call("GET", "/v1/jobs", None).await;
    assert_eq!(
        list["jobs"].as_array().unwrap().len(),
        1,
        "nothing of either batch was stored"
    );
    let good = json!({"jobs": [
        {"steps": [{"name": "a", "agent": "x"}]},
        {"steps": [{"name": "b", "agent": "x"}]}
    ]});
    let (status, body) = h.call("POST", "/v1/jobs:batch", Some(good)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["jobs"].as_array().unwrap().len(), 2);
    let too_many: Vec<Value> = (0..1001)
        .map(|_| json!({"steps": [{"name": "a", "agent": "x"}]}))
        .collect();
    let (status, problem) = h
        .call("POST", "/v1/jobs:batch", Some(json!({ "jobs": too_many })))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(problem["field"], "jobs");
}

// Proves `Prefer: return=minimal` answers a submit (single or batch) with each job's id, state
// and whether this request created it, marks the answer with `Preference-Applied`, keeps the
// status codes and `Location` of the full answer, and stores exactly what a full submit does.
#[tokio::test]
async fn submits_answer_minimally_when_asked() {
    let h = harness();
    let minimal = |path: &str, body: Value| {
        Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .header("prefer", "respond-async, return=minimal")
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap()
    };
    let send = |req: Request<Body>| async {
        let res = h.router.clone().oneshot(req).await.unwrap();
        let (parts, body) = res.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        (parts, serde_json::from_slice::<Value>(&bytes).unwrap())
    };
    let keyed = json!({"idempotency_key": "m-1", "steps": [{"name": "a", "agent": "x"}]});
    let (parts, body) = send(minimal("/v1/jobs", keyed.clone())).await;
    assert_eq!(parts.status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(parts.headers["preference-applied"], "return=minimal");
    let id = body["id"].as_str().unwrap().to_string();
    assert_eq!(parts.headers["location"], format!("/v1/jobs/{id}").as_str());
    assert_eq!(body, json!({"id": id, "state": "running", "created": true}));
    let (parts, body) = send(minimal("/v1/jobs", keyed.clone())).await;
    assert_eq!(parts.status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"id": id, "state": "running", "created": false})
    );

    let batch = json!({"jobs": [
        {"steps": [{"name": "a", "agent": "x"}]},
        keyed,
        {"run_at": "2100-01-01T00:00:00Z", "steps": [{"name": "b", "agent": "x"}]}
    ]});
    let (parts, body) = send(minimal("/v1/jobs:batch", batch)).await;
    assert_eq!(parts.status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(parts.headers["preference-applied"], "return=minimal");
    let jobs = body["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 3, "{body}");
    assert_eq!(
        jobs[1],
        json!({"id": id, "state": "running", "created": false})
    );
    assert_eq!(jobs[2]["state"], "pending");
    for j in [&jobs[0], &jobs[2]] {
        assert_eq!(j["created"], true, "{body}");
        assert_eq!(
            j.as_object().unwrap().len(),
            3,
            "only id, state, created: {j}"
        );
        let stored = h.job(j["id"].as_str().unwrap()).await;
        assert_eq!(stored["state"], j["state"]);
    }
    // Without the preference the same endpoint answers whole jobs, unmarked.
    let (parts, body) = send(
        Request::builder()
            .method("POST")
            .uri("/v1/jobs:batch")
            .header("content-type", "application/json")
            .header("prefer", "return=representation")
            .body(Body::from(
                r#"{"jobs":[{"steps":[{"name":"a","agent":"x"}]}]}"#,
            ))
            .unwrap(),
    )
    .await;
    assert_eq!(parts.status, StatusCode::ACCEPTED, "{body}");
    assert!(parts.headers.get("preference-applied").is_none());
    assert_eq!(body["jobs"][0]["steps"][0]["name"], "a", "{body}");
}

// Proves listing filters by state and label and pages with the cursor, newest first, without
// gaps or repeats.
#[tokio::test]
async fn list_filters_and_pages() {
    let h = harness();
    let mut ids = Vec::new();
    for i in 0..7 {
        let colour = if i % 2 == 0 { "red" } else { "blue" };
        ids.push(
            h.submit(json!({"labels": {"colour": colour}, "steps": [{"name": "a", "agent": "x"}]}))
                .await,
        );
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?limit=3&cursor={c}"),
            None => "/v1/jobs?limit=3".to_string(),
        };
        let (status, page) = h.call("GET", &path, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for j in page["jobs"].as_array().unwrap() {
            seen.push(j["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(seen, expected);
    let (_, red) = h.call("GET", "/v1/jobs?label=colour:red", None).await;
    assert_eq!(red["jobs"].as_array().unwrap().len(), 4);
    let (_, running) = h
        .call("GET", "/v1/jobs?state=running&label=colour:blue", None)
        .await;
    assert_eq!(running["jobs"].as_array().unwrap().len(), 3);
    let (status, problem) = h.call("GET", "/v1/jobs?state=sleepy", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["field"], "state");
    let (status, problem) = h.call("GET", "/v1/jobs?limit=100000", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["field"], "limit");
}

// Proves a waiting long-poll is woken by a submit (it would otherwise return empty at its wait),
// and that one call can take several leases carrying inputs and idempotency keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_is_woken_and_takes_many() {
    let h = harness();
    let router = h.router.clone();
    let poll = tokio::spawn(async move {
        let req = Request::builder()
            .method("POST")
            .uri("/v1/agents/wake/leases")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"worker": "w", "max": 5, "wait": "30s"}"#))
            .unwrap();
        let res = router.oneshot(req).await.unwrap();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()
    });
    // Give the poll a moment to register; a lost wake-up would make it wait the full 30s and
    // return empty, which the assertion below would catch.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let id = h
        .submit(json!({"steps": [{"name": "a", "agent": "wake"}, {"name": "b", "agent": "wake"}, {"name": "c", "agent": "wake", "depends_on": ["a", "b"]}]}))
        .await;
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), poll)
        .await
        .expect("the long-poll was woken")
        .unwrap();
    let mut leases = first["leases"].as_array().unwrap().clone();
    if leases.len() < 2 {
        leases.extend(h.lease("wake", 5).await);
    }
    assert_eq!(leases.len(), 2, "a and b are ready together: {leases:?}");
    for l in &leases {
        let lid = l["lease_id"].as_str().unwrap();
        let name = l["step"].as_str().unwrap();
        assert_eq!(l["idempotency_key"], format!("{id}/{name}"));
        let (status, _) = h
            .call(
                "POST",
                &format!("/v1/leases/{lid}/complete"),
                Some(json!({"result": {"from": name}})),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let c = h.lease("wake", 5).await;
    assert_eq!(c.len(), 1);
    assert_eq!(
        c[0]["inputs"],
        json!({"a": {"from": "a"}, "b": {"from": "b"}})
    );
}

// Proves lease requests of one agent arriving together, which a node merges into shared claims,
// each get leases of their own: 24 workers ask for two leases each at once while 40 steps are
// ready. Every step is leased once, to the worker whose request answered it (the step's recorded
// worker), and no request gets more than it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_lease_requests_each_get_their_own_leases() {
    let h = Arc::new(harness());
    for _ in 0..40 {
        h.submit(json!({"steps": [{"name": "s", "agent": "m"}]}))
            .await;
    }
    let mut calls = Vec::new();
    for i in 0..24 {
        let h = h.clone();
        let body = json!({"worker": format!("w{i}"), "max": 2, "wait": "0s"});
        calls.push(tokio::spawn(async move {
            let (status, body) = h.call("POST", "/v1/agents/m/leases", Some(body)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            (i, body["leases"].as_array().unwrap().clone())
        }));
    }
    let mut leased = std::collections::HashSet::new();
    for call in calls {
        let (i, leases) = call.await.unwrap();
        assert!(leases.len() <= 2, "request {i} got {leases:?}");
        for lease in leases {
            let job = h.job(lease["job_id"].as_str().unwrap()).await;
            let s = step(&job, "s");
            assert_eq!(s["worker"], format!("w{i}"), "{job}");
            assert_eq!(s["state"], "running", "{job}");
            assert!(
                leased.insert(lease["job_id"].clone()),
                "leased twice: {lease}"
            );
        }
    }
    assert_eq!(leased.len(), 40, "every ready step is leased once");
}

/// A long-poll of `agent` for up to two leases, waiting up to 30 s.
fn spawn_long_poll(h: &Harness, agent: &str, worker: usize) -> tokio::task::JoinHandle<Value> {
    let router = h.router.clone();
    let req = Request::builder()
        .method("POST")
        .uri(format!("/v1/agents/{agent}/leases"))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"worker": format!("w{worker}"), "max": 2, "wait": "30s"}).to_string(),
        ))
        .unwrap();
    tokio::spawn(async move {
        let res = router.oneshot(req).await.unwrap();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()
    })
}

fn empty_claims(h: &Harness, agent: &str) -> u64 {
    let label = overseer_server::metrics::AgentLabel {
        agent: agent.to_string(),
    };
    h.app.metrics().claims_empty.get_or_create(&label).get()
}

/// Waits (up to 20 s) until `done` holds.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < until,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Leases each finished long-poll of `polls` answered; the rest are kept in `polls`.
fn take_answers(polls: &mut Vec<tokio::task::JoinHandle<Value>>) -> Vec<usize> {
    let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(polls)
        .into_iter()
        .partition(|p| p.is_finished());
    *polls = waiting;
    done.into_iter()
        .map(|p| {
            let answer = futures::executor::block_on(p).unwrap();
            answer["leases"].as_array().unwrap().len()
        })
        .collect()
}

// Proves a ready step wakes one waiting long-poll, not all of them: with four long-polls of an
// agent waiting (up to two leases each), one job costs one look (no other long-poll looks in
// vain); three steps made ready together wake one long-poll, which takes two, finds its claim
// full and passes the wake-up on to one more, which takes the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_step_wakes_one_long_poll() {
    let h = harness();
    let mut polls: Vec<_> = (0..4).map(|i| spawn_long_poll(&h, "herd", i)).collect();
    // Each long-poll looks once before it waits, and finds nothing.
    eventually("four long-polls waiting", || empty_claims(&h, "herd") == 4).await;
    h.submit(json!({"steps": [{"name": "a", "agent": "herd"}]}))
        .await;
    eventually("one long-poll answered", || {
        polls.iter().any(|p| p.is_finished())
    })
    .await;
    // Had every long-poll been woken, the other three would have looked and found nothing.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(take_answers(&mut polls), vec![1]);
    assert_eq!(
        empty_claims(&h, "herd"),
        4,
        "only the woken long-poll looked"
    );

    h.submit(json!({"steps": [
        {"name": "a", "agent": "herd"}, {"name": "b", "agent": "herd"}, {"name": "c", "agent": "herd"}
    ]}))
    .await;
    eventually("two long-polls answered", || {
        polls.iter().filter(|p| p.is_finished()).count() == 2
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut answers = take_answers(&mut polls);
    answers.sort();
    assert_eq!(
        answers,
        vec![1, 2],
        "a full claim passed the wake-up on once"
    );
    assert_eq!(polls.len(), 1, "the last long-poll still waits");
    assert_eq!(empty_claims(&h, "herd"), 4, "nobody looked in vain");
}

// Proves the supervisor on a manual clock: an expired lease is requeued after backoff, is not
// claimable before it, the old attempt is fenced out, and attempts run out into `failed`.
#[tokio::test]
async fn supervisor_expires_requeues_and_fences() {
    let h = harness();
    let id = h
        .submit(
            json!({"steps": [{"name": "s", "agent": "x", "timeout": "1s", "max_attempts": 2,
            "backoff": {"initial": "10s", "factor": 2, "max": "1m"}}]}),
        )
        .await;
    let first = h.lease("x", 1).await.remove(0);
    h.advance(999);
    h.sweep().await;
    assert_eq!(
        step(&h.job(&id).await, "s")["state"],
        "running",
        "not expired yet"
    );
    h.advance(1);
    h.sweep().await;
    let job = h.job(&id).await;
    let s = step(&job, "s");
    assert_eq!(s["state"], "ready");
    assert_eq!(s["failures"], 1);
    assert!(
        h.lease("x", 1).await.is_empty(),
        "not claimable during backoff"
    );
    h.advance(10_000);
    let second = h.lease("x", 1).await.remove(0);
    assert_eq!(second["attempt"], 2);
    let old = first["lease_id"].as_str().unwrap();
    let (status, _) = h
        .call(
            "POST",
            &format!("/v1/leases/{old}/complete"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Heartbeats keep the live lease alive past its original expiry.
    let live = second["lease_id"].as_str().unwrap();
    h.advance(800);
    let (status, hb) = h
        .call(
            "POST",
            &format!("/v1/leases/{live}/heartbeat"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(hb["cancel"], false);
    assert_eq!(hb["lease_ms"], 1000);
    h.advance(800);
    h.sweep().await;
    assert_eq!(step(&h.job(&id).await, "s")["state"], "running");
    h.advance(500);
    h.sweep().await;
    let job = h.job(&id).await;
    assert_eq!(job["state"], "failed", "two attempts used up: {job}");
    assert_eq!(step(&job, "s")["attempt"], 2);
}

// Proves delayed jobs: pending until `run_at`, then started by the sweep.
#[tokio::test]
async fn run_at_delays_a_job() {
    let h = harness();
    let at = Timestamp::from_millis(T0 + 5_000).to_rfc3339();
    let id = h
        .submit(json!({"run_at": at, "steps": [{"name": "a", "agent": "later"}]}))
        .await;
    assert_eq!(h.job(&id).await["state"], "pending");
    assert!(h.lease("later", 1).await.is_empty());
    h.advance(4_999);
    h.sweep().await;
    assert_eq!(h.job(&id).await["state"], "pending");
    h.advance(1);
    h.sweep().await;
    assert_eq!(h.job(&id).await["state"], "running");
    assert_eq!(h.lease("later", 1).await.len(), 1);
}

// Proves cancellation: pending work is cancelled at once, a running step hears `cancel` on its
// heartbeat, its completion is refused with 409, and the job then ends `cancelled`.
#[tokio::test]
async fn cancel_reaches_running_steps() {
    let h = harness();
    let id = h
        .submit(json!({"steps": [{"name": "a", "agent": "x"}, {"name": "b", "agent": "x", "depends_on": ["a"]}]}))
        .await;
    let lease = h.lease("x", 1).await.remove(0);
    let lid = lease["lease_id"].as_str().unwrap();
    let (status, job) = h.call("POST", &format!("/v1/jobs/{id}/cancel"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["state"], "running");
    assert_eq!(job["desired_state"], "cancelled");
    assert_eq!(step(&job, "b")["state"], "cancelled");
    let (status, again) = h.call("POST", &format!("/v1/jobs/{id}/cancel"), None).await;
    assert_eq!(status, StatusCode::OK, "cancelling twice is fine: {again}");
    let (_, hb) = h
        .call("POST", &format!("/v1/leases/{lid}/heartbeat"), None)
        .await;
    assert_eq!(hb["cancel"], true);
    let (status, _) = h
        .call(
            "POST",
            &format!("/v1/leases/{lid}/complete"),
            Some(json!({"result": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let job = h.job(&id).await;
    assert_eq!(job["state"], "cancelled");
    assert_eq!(step(&job, "a")["state"], "cancelled");
    assert!(
        step(&job, "a")["result"].is_null(),
        "the late result was not recorded"
    );
    let (status, problem) = h.call("POST", &format!("/v1/jobs/{id}/cancel"), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("already cancelled"));
}

// Proves unknown routes and methods answer in the problem shape.
#[tokio::test]
async fn unknown_routes_and_methods() {
    let h = harness();
    let (status, _) = h.call("GET", "/nowhere", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h.call("DELETE", "/v1/jobs", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

// Proves `/wait` returns as soon as the job finishes and `/v1/agents` reports counts and workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_agents() {
    let h = harness();
    let id = h
        .submit(json!({"steps": [{"name": "a", "agent": "solo"}]}))
        .await;
    let router = h.router.clone();
    let path = format!("/v1/jobs/{id}/wait?timeout=30s");
    let waiter = tokio::spawn(async move {
        let req = Request::builder().uri(path).body(Body::empty()).unwrap();
        let res = router.oneshot(req).await.unwrap();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice::<Value>(&bytes).unwrap()
    });
    let lease = h.lease("solo", 1).await.remove(0);
    let (_, agents) = h.call("GET", "/v1/agents", None).await;
    let solo = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["agent"] == "solo")
        .unwrap()
        .clone();
    assert_eq!(solo["running"], 1);
    assert_eq!(solo["workers"][0]["worker"], "w1");
    let lid = lease["lease_id"].as_str().unwrap();
    h.call(
        "POST",
        &format!("/v1/leases/{lid}/complete"),
        Some(json!({"result": "ok"})),
    )
    .await;
    let done = tokio::time::timeout(std::time::Duration::from_secs(20), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done["state"], "succeeded");
}

// Proves inputs that could never work are refused with a 400 naming the field instead of being
// stored: a cron pattern naming no real date, a `run_at` in year 0000, and control characters
// in a label value (which the two stores would keep differently).
#[tokio::test]
async fn inputs_that_can_never_work_are_refused() {
    let h = harness();
    let one_step = json!([{"name": "s", "agent": "a"}]);
    let (status, problem) = h
        .call(
            "POST",
            "/v1/schedules",
            Some(json!({"name": "never", "cron": "0 0 30 2 *", "job": {"steps": one_step}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
    assert_eq!(problem["field"], "cron", "{problem}");
    let bad_jobs = [
        (
            json!({"run_at": "0000-01-01T00:00:00Z", "steps": one_step}),
            "run_at",
        ),
        (
            json!({"labels": {"team": "a\u{7}b"}, "steps": one_step}),
            "labels.team",
        ),
    ];
    for (spec, field) in bad_jobs {
        let (status, problem) = h.call("POST", "/v1/jobs", Some(spec)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["field"], field, "{problem}");
    }
    let (_, list) = h.call("GET", "/v1/jobs", None).await;
    assert_eq!(list["jobs"], json!([]), "nothing was stored");
}

// Proves a client cannot pre-empt a job the server mints itself: idempotency keys under
// `schedule/` and `faktory/` are refused with a 400 naming the field, alone or in a batch.
#[tokio::test]
async fn reserved_idempotency_keys_are_refused() {
    let h = harness();
    for key in ["schedule/nightly/1700000000000", "faktory/abc123"] {
        let spec = json!({"idempotency_key": key, "steps": [{"name": "s", "agent": "a"}]});
        let (status, problem) = h.call("POST", "/v1/jobs", Some(spec.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["field"], "idempotency_key", "{problem}");
        let (status, problem) = h
            .call("POST", "/v1/jobs:batch", Some(json!({"jobs": [spec]})))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["field"], "jobs[0].idempotency_key", "{problem}");
    }
    let fine = json!({"idempotency_key": "schedules/mine", "steps": [{"name": "s", "agent": "a"}]});
    let (status, _) = h.call("POST", "/v1/jobs", Some(fine)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

// Proves `GET /openapi.json` serves an OpenAPI 3.1 document of the API generated with the
// router: every operation is there with the bearer scheme, the request and answer types are
// components, and a documented operation is routed (it does not answer the router's 404).
#[tokio::test]
async fn the_api_describes_itself() {
    let h = harness();
    let (status, doc) = h.call("GET", "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    let operations: usize = paths
        .values()
        .map(|item| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "post", "put", "delete", "patch"].contains(&k.as_str()))
                .count()
        })
        .sum();
    assert_eq!(operations, 42, "{:?}", paths.keys().collect::<Vec<_>>());
    for schema in [
        "JobSpec",
        "JobView",
        "Lease",
        "LeaseRequest",
        "Problem",
        "RescheduleRequest",
        "RerunRequest",
        "HeartbeatRequest",
        "ScheduleSpec",
    ] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert_eq!(
        doc["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
            ["$ref"],
        "#/components/schemas/JobSpec"
    );
    let (status, _) = h.call("GET", "/v1/agents", None).await;
    assert_eq!(status, StatusCode::OK, "a documented route is routed");
}

// Proves `GET /v1/stats` through the router: every state with its count (zeros included) and
// 60 minutes of finished counts, oldest first, the last being the current minute, where a job
// cancelled now is counted.
#[tokio::test]
async fn stats_count_states_and_the_last_hour() {
    let h = harness();
    let spec = json!({"steps": [{"name": "s", "agent": "nobody"}]});
    let (_, a) = h.call("POST", "/v1/jobs", Some(spec.clone())).await;
    h.call("POST", "/v1/jobs", Some(spec)).await;
    let (status, _) = h
        .call(
            "POST",
            &format!("/v1/jobs/{}/cancel", a["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, stats) = h.call("GET", "/v1/stats", None).await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    let count = |state: &str| {
        stats["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["state"] == state)
            .unwrap_or_else(|| panic!("no {state} in {stats}"))["count"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        (count("running"), count("cancelled"), count("succeeded")),
        (1, 1, 0)
    );
    let minutes = stats["per_minute"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    assert_eq!(minutes[0]["minute"], stats["since"]);
    let last = &minutes[59];
    assert_eq!(
        (last["cancelled"].as_u64(), last["failed"].as_u64()),
        (Some(1), Some(0))
    );
    let since = Timestamp::parse_rfc3339(stats["since"].as_str().unwrap()).unwrap();
    assert_eq!(since.as_millis() % 60_000, 0, "whole minutes");
    assert!(T0 - since.as_millis() < 3_600_000);
}

// Proves `GET /v1/alerts` through the router: a job that fails for good raises a `job_failed`
// alert, listed with its job, message and delivery state (waiting: nothing has delivered it in
// this harness), newest first; a bad limit or an unknown parameter is a 400 naming it.
#[tokio::test]
async fn alerts_list_what_was_raised() {
    let h = harness();
    let spec = json!({"steps": [{"name": "s", "agent": "al"}]});
    let (_, job) = h.call("POST", "/v1/jobs", Some(spec)).await;
    let (status, leases) = h
        .call(
            "POST",
            "/v1/agents/al/leases",
            Some(json!({"worker": "w", "wait": "0s"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{leases}");
    let lease = leases["leases"][0]["lease_id"].as_str().unwrap();
    let (status, _) = h
        .call(
            "POST",
            &format!("/v1/leases/{lease}/fail"),
            Some(json!({"error": "disk full", "retryable": false})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, list) = h.call("GET", "/v1/alerts", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let alerts = list["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{list}");
    let a = &alerts[0];
    assert_eq!(
        (a["kind"].as_str(), a["job_id"].as_str()),
        (Some("job_failed"), job["id"].as_str())
    );
    assert_eq!(a["delivery"], "waiting");
    assert!(a["message"].as_str().unwrap().contains("failed"), "{a}");
    assert_eq!(list["webhook"], false);
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("kind=x", "kind"),
    ] {
        let (status, problem) = h.call("GET", &format!("/v1/alerts?{query}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(problem["field"], field, "{query}");
    }
}

// Proves retention through the router and the supervisor: a finished job shows when it will be
// removed and is gone after the leader's sweep once its retention has passed (not before); a
// running job cannot be deleted (409), a finished one can (204, then 404), an unknown one is 404.
#[tokio::test]
async fn finished_jobs_are_removed_after_their_retention_or_on_request() {
    let h = harness();
    let kept = h
        .submit(json!({"retention": "5s", "steps": [{"name": "a", "agent": "x"}]}))
        .await;
    let lease = h.lease("x", 1).await.remove(0);
    let lid = lease["lease_id"].as_str().unwrap();
    let (status, _) = h
        .call(
            "POST",
            &format!("/v1/leases/{lid}/complete"),
            Some(json!({"result": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let job = h.job(&kept).await;
    assert_eq!(job["state"], "succeeded");
    assert_eq!(job["retention"], "5s");
    assert!(job["removable_at"].is_string(), "{job}");

    let running = h
        .submit(json!({"steps": [{"name": "a", "agent": "y"}]}))
        .await;
    let (status, problem) = h.call("DELETE", &format!("/v1/jobs/{running}"), None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");

    h.advance(4_000);
    h.sweep().await;
    h.job(&kept).await;
    h.advance(1_000);
    h.sweep().await;
    let (status, _) = h.call("GET", &format!("/v1/jobs/{kept}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "removed by the sweep");
    h.job(&running).await;

    let (status, _) = h
        .call("POST", &format!("/v1/jobs/{running}/cancel"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h.call("DELETE", &format!("/v1/jobs/{running}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = h.call("GET", &format!("/v1/jobs/{running}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h.call("DELETE", &format!("/v1/jobs/{running}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

// Proves what the schemathesis run found and the server now refuses or takes as documented: a
// body that is a JSON array instead of an object is a 400 (serde would otherwise fill a
// struct's fields from it in order), JSON `null` where a body is optional means no body, and
// agent names and ordering keys in the path are bounded like everywhere else (400 past 200
// bytes); an integral float counts as a whole number for `max_concurrency`.
#[tokio::test]
async fn bodies_are_objects_and_path_names_are_bounded() {
    let h = harness();
    let (status, p) = h
        .call("PUT", "/v1/agents/a/limits", Some(json!([null, null])))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("JSON object"), "{p}");
    let (status, limits) = h
        .call(
            "PUT",
            "/v1/agents/a/limits",
            Some(json!({"max_concurrency": 3.0})),
        )
        .await;
    assert_eq!(
        (status, &limits["max_concurrency"]),
        (StatusCode::OK, &json!(3))
    );
    let (status, p) = h
        .call(
            "PUT",
            "/v1/agents/a/limits",
            Some(json!({"max_concurrency": 3.5})),
        )
        .await;
    assert_eq!(
        (status, &p["field"]),
        (StatusCode::BAD_REQUEST, &json!("max_concurrency"))
    );
    let id = "01a3185c-774f-7d9a-a6ce-af10a0119486";
    let (status, p) = h
        .call("POST", &format!("/v1/jobs/{id}/resume"), Some(Value::Null))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "null is no body: {p}");
    let long = "a".repeat(201);
    let (status, p) = h
        .call("GET", &format!("/v1/ordering-keys/{long}"), None)
        .await;
    assert_eq!(
        (status, &p["field"]),
        (StatusCode::BAD_REQUEST, &json!("key"))
    );
    let (status, p) = h
        .call(
            "POST",
            &format!("/v1/agents/{long}/leases"),
            Some(json!({"worker": "w", "wait": "0s"})),
        )
        .await;
    assert_eq!(
        (status, &p["field"]),
        (StatusCode::BAD_REQUEST, &json!("agent"))
    );
}

// Proves the document's links lead somewhere: every operation that makes a job, lease, schedule
// or token links to the operations taking its id (17 links), and each link names an
// operationId that the document has.
#[tokio::test]
async fn links_name_documented_operations() {
    let h = harness();
    let (_, doc) = h.call("GET", "/openapi.json", None).await;
    let mut ids = std::collections::HashSet::new();
    let mut links = Vec::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            if let Some(id) = op["operationId"].as_str() {
                ids.insert(id.to_string());
            }
            for response in op["responses"]
                .as_object()
                .into_iter()
                .flat_map(|r| r.values())
            {
                for link in response["links"]
                    .as_object()
                    .into_iter()
                    .flat_map(|l| l.values())
                {
                    links.push(link["operationId"].as_str().unwrap().to_string());
                }
            }
        }
    }
    assert_eq!(links.len(), 17, "{links:?}");
    for target in &links {
        assert!(
            ids.contains(target),
            "a link to `{target}`, which is no operation"
        );
    }
}

// Proves `PUT /v1/schedules/{name}`: bad input is a 400 naming the field (the cron, a job
// field, a name other than the path's, an unknown field) and an unknown schedule a 404; a
// replacement changes cron, zone, overlap, misfire and job together and counts the next due
// time from now under the new pattern; a due time that fired is not due again when the new
// pattern matches it; a paused schedule stays paused; a macro works as a cron.
#[tokio::test]
async fn a_schedule_is_replaced_in_place() {
    let h = harness();
    let job = json!({"steps": [{"name": "s", "agent": "a"}]});
    let (status, created) = h
        .call(
            "POST",
            "/v1/schedules",
            Some(json!({"name": "tick", "cron": "@hourly", "job": job})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let next = |v: &Value| Timestamp::parse_rfc3339(v["next_fire_at"].as_str().unwrap()).unwrap();
    assert_eq!(next(&created).as_millis(), T0 + 3_600_000, "{created}");
    let put = |body: Value| h.call("PUT", "/v1/schedules/tick", Some(body));
    for (body, field) in [
        (
            json!({"name": "tick", "cron": "@fortnightly", "job": job}),
            "cron",
        ),
        (json!({"name": "tick", "cron": "* * *", "job": job}), "cron"),
        (
            json!({"name": "tick", "cron": "@daily", "timezone": "Mars/Olympus", "job": job}),
            "timezone",
        ),
        (
            json!({"name": "tick", "cron": "@daily", "job": {"idempotency_key": "k", "steps": job["steps"]}}),
            "job.idempotency_key",
        ),
        (
            json!({"name": "tock", "cron": "@daily", "job": job}),
            "name",
        ),
        (
            json!({"name": "tick", "cron": "@daily", "job": job, "overlapp": "allow"}),
            "overlapp",
        ),
    ] {
        let (status, problem) = put(body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {problem}");
        assert!(
            problem["field"]
                .as_str()
                .unwrap_or_default()
                .contains(field)
                || problem["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(field),
            "{body}: {problem}"
        );
    }
    let (_, unchanged) = h.call("GET", "/v1/schedules/tick", None).await;
    assert_eq!(unchanged, created, "refused replacements change nothing");
    let (status, problem) = h
        .call(
            "PUT",
            "/v1/schedules/nope",
            Some(json!({"name": "nope", "cron": "@daily", "job": job})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{problem}");

    // Every 10 s, in another zone, overlapping, catching up: all at once.
    let new_job = json!({"priority": 4, "steps": [{"name": "t", "agent": "b"}]});
    let (status, replaced) = put(json!({"name": "tick", "cron": "*/10 * * * * *",
        "timezone": "Asia/Tokyo", "overlap": "allow", "misfire": "all", "job": new_job}))
    .await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert_eq!(
        (
            &replaced["cron"],
            &replaced["timezone"],
            &replaced["overlap"],
            &replaced["misfire"],
            &replaced["job"]["priority"]
        ),
        (
            &json!("*/10 * * * * *"),
            &json!("Asia/Tokyo"),
            &json!("allow"),
            &json!("all"),
            &json!(4)
        )
    );
    assert_eq!(next(&replaced).as_millis(), T0 + 10_000, "{replaced}");
    assert_eq!(replaced["created_at"], created["created_at"]);

    h.advance(10_000);
    h.sweep().await;
    let (_, fired) = h.call("GET", "/v1/schedules/tick", None).await;
    assert_eq!(
        Timestamp::parse_rfc3339(fired["last_fire_at"].as_str().unwrap())
            .unwrap()
            .as_millis(),
        T0 + 10_000,
        "{fired}"
    );
    let (_, jobs) = h.call("GET", "/v1/jobs", None).await;
    let jobs = jobs["jobs"].as_array().unwrap().clone();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["priority"], 4, "the new job body fired");
    // At the very instant that fired, a pattern matching it again: next is 15 s, not 10 s.
    let (_, again) =
        put(json!({"name": "tick", "cron": "*/5 * * * * *", "overlap": "allow", "job": new_job}))
            .await;
    assert_eq!(next(&again).as_millis(), T0 + 15_000, "{again}");
    h.sweep().await;
    let (_, jobs) = h.call("GET", "/v1/jobs", None).await;
    assert_eq!(
        jobs["jobs"].as_array().unwrap().len(),
        1,
        "nothing fired twice"
    );

    let (status, _) = h.call("POST", "/v1/schedules/tick/pause", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, paused) = put(json!({"name": "tick", "cron": "@daily", "job": job})).await;
    assert_eq!(status, StatusCode::OK, "{paused}");
    assert_eq!(
        (&paused["paused"], &paused["next_fire_at"], &paused["cron"]),
        (&json!(true), &Value::Null, &json!("@daily"))
    );
    let (_, resumed) = h.call("POST", "/v1/schedules/tick/resume", None).await;
    // 2027-01-16T00:00:00Z: the next midnight after T0 + 10 s.
    assert_eq!(next(&resumed).as_millis(), T0 + 16 * 3_600_000, "{resumed}");
}

// Proves the rerun route: 404 for an unknown job, 409 (not-allowed) while the job runs, 202 with
// the new job and a Location once it failed, both links shown by GET, the kept step succeeded,
// 409 `already-rerun` the second time, and a bad body field named.
#[tokio::test]
async fn rerun_runs_a_failed_job_again_once() {
    let h = harness();
    let unknown = "018bcfe5-6801-7000-8000-000000000001";
    let (status, _) = h
        .call("POST", &format!("/v1/jobs/{unknown}/rerun"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let id = h
        .submit(json!({"on_failure": "fail", "steps": [
            {"name": "a", "agent": "ra"},
            {"name": "b", "agent": "ra", "depends_on": ["a"], "max_attempts": 1}
        ]}))
        .await;
    let path = format!("/v1/jobs/{id}/rerun");
    let (status, body) = h.call("POST", &path, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "not-allowed");
    for (name, outcome) in [("a", "complete"), ("b", "fail")] {
        let lease = h.lease("ra", 1).await.remove(0);
        assert_eq!(lease["step"], name);
        let body = match outcome {
            "complete" => json!({"result": {"made": name}}),
            _ => json!({"error": "broken", "retryable": false}),
        };
        let url = format!(
            "/v1/leases/{}/{outcome}",
            lease["lease_id"].as_str().unwrap()
        );
        assert_eq!(h.call("POST", &url, Some(body)).await.0, StatusCode::OK);
    }
    let (status, body) = h
        .call(
            "POST",
            &path,
            Some(json!({"from_failed": true, "bogus": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], "bogus");
    let (status, body) = h
        .call("POST", &path, Some(json!({"by": "x".repeat(201)})))
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("by"))
    );
    let (status, rerun) = h
        .call(
            "POST",
            &path,
            Some(json!({"from_failed": true, "by": "ops", "reason": "fixed b"})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{rerun}");
    let new = rerun["id"].as_str().unwrap().to_string();
    assert_eq!(rerun["rerun_of"], json!(id));
    assert_eq!(step(&rerun, "a")["state"], "succeeded");
    assert_eq!(step(&rerun, "a")["result"], json!({"made": "a"}));
    assert_eq!(step(&rerun, "b")["state"], "ready");
    assert_eq!(h.job(&id).await["rerun_by"], json!(new));
    assert_eq!(h.job(&new).await["rerun_of"], json!(id));
    let (status, body) = h.call("POST", &path, None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "already-rerun");
    assert!(body["detail"].as_str().unwrap().contains(&new), "{body}");
    let lease = h.lease("ra", 5).await;
    assert_eq!(lease.len(), 1);
    assert_eq!(lease[0]["step"], "b");
    assert_eq!(lease[0]["inputs"], json!({"a": {"made": "a"}}));
}

// Proves a heartbeat's progress is kept on the step and shown by GET with its time, that more
// than `limits.progress_bytes` is refused with 413 naming `progress` (and nothing stored), and
// that a stale lease's progress is refused with its heartbeat.
#[tokio::test]
async fn heartbeat_progress_is_shown_and_bounded() {
    let h = harness();
    let id = h
        .submit(
            json!({"steps": [{"name": "a", "agent": "pr", "timeout": "10s",
            "progress_events": true}]}),
        )
        .await;
    let lease = h.lease("pr", 1).await.remove(0);
    let beat = format!(
        "/v1/leases/{}/heartbeat",
        lease["lease_id"].as_str().unwrap()
    );
    let (status, body) = h
        .call("POST", &beat, Some(json!({"progress": {"pct": 40}})))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let job = h.job(&id).await;
    assert_eq!(step(&job, "a")["progress"], json!({"pct": 40}));
    assert_eq!(step(&job, "a")["progress_at"], json!(h.app.now()));
    assert_eq!(step(&job, "a")["progress_events"], json!(true));
    let big = json!({"progress": "x".repeat(5_000)});
    let (status, body) = h.call("POST", &beat, Some(big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(body["field"], "progress");
    assert_eq!(step(&h.job(&id).await, "a")["progress"], json!({"pct": 40}));
    let (_, events) = h.call("GET", &format!("/v1/jobs/{id}/events"), None).await;
    let recorded: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "step_progress")
        .collect();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0]["detail"]["progress"], json!({"pct": 40}));
    h.advance(11_000);
    h.sweep().await;
    let (status, body) = h
        .call("POST", &beat, Some(json!({"progress": {"pct": 99}})))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(step(&h.job(&id).await, "a")["progress"], json!({"pct": 40}));
}
