//! Console routes through the real router (no socket) on a temp SQLite store and a manual clock:
//! asset serving with ETags, `waiting_reason` on `GET /v1/jobs/{id}`, `POST /v1/jobs:validate`
//! and the `GET /v1/events/stream` server-sent events.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use futures::StreamExt;
use overseer_core::Timestamp;
use overseer_server::{api, App, Config, ManualClock};
use overseer_store::sqlite::{SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

const T0: i64 = 1_800_000_000_000;

struct Harness {
    router: Router,
    _dir: tempfile::TempDir,
}

fn harness() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::new(dir.path().join("t.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(T0)));
    let app = App::new(
        Arc::new(store),
        clock,
        &Config::default(),
        CancellationToken::new(),
    );
    Harness {
        router: api::router(app),
        _dir: dir,
    }
}

fn request(method: &str, path: &str, body: Option<Value>) -> Request<Body> {
    let req = Request::builder().method(method).uri(path);
    match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&b).unwrap())),
        None => req.body(Body::empty()),
    }
    .unwrap()
}

impl Harness {
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let res = self
            .router
            .clone()
            .oneshot(request(method, path, body))
            .await
            .unwrap();
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn submit(&self, spec: Value) -> String {
        let (status, body) = self.call("POST", "/v1/jobs", Some(spec)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        body["id"].as_str().unwrap().to_string()
    }
}

fn reason<'a>(job: &'a Value, step: &str) -> &'a Value {
    let s = job["steps"].as_array().unwrap();
    &s.iter().find(|s| s["name"] == step).unwrap()["waiting_reason"]
}

// Proves the index and assets are served with their content type and an ETag, and that the
// ETag turns a second fetch into a 304 without a body.
#[tokio::test]
async fn console_assets_have_types_and_etags() {
    let h = harness();
    let res = h.router.clone().oneshot(request("GET", "/", None)).await;
    let res = res.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let js = h
        .router
        .clone()
        .oneshot(request("GET", "/console/app.js", None));
    let js = js.await.unwrap();
    assert!(js.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let tag = js.headers()["etag"].clone();
    let again = Request::builder()
        .uri("/console/app.js")
        .header("if-none-match", tag)
        .body(Body::empty())
        .unwrap();
    let again = h.router.clone().oneshot(again).await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    let (status, _) = h.call("GET", "/console/nope.js", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

// Proves `GET /v1/jobs/{id}` explains waiting steps from live settings: a dependency, a paused
// agent, a concurrency limit reached, and a pending job behind its ordering key's head.
#[tokio::test]
async fn job_shows_waiting_reasons() {
    let h = harness();
    let spec = json!({"steps": [{"name": "a", "agent": "dns"},
        {"name": "b", "agent": "dns", "depends_on": ["a"]}]});
    let id = h.submit(spec).await;
    let (_, job) = h.call("GET", &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(reason(&job, "a")["code"], "no_worker");
    assert_eq!(reason(&job, "b")["code"], "dependencies");
    assert!(
        job.get("waiting_reason").is_none(),
        "a running job has none"
    );

    h.call("POST", "/v1/agents/dns/pause", Some(json!({})))
        .await;
    let (_, job) = h.call("GET", &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(reason(&job, "a")["text"], "agent `dns` paused");

    let keyed = json!({"ordering_key": "cust-42", "steps": [{"name": "x", "agent": "dns"}]});
    let first = h.submit(keyed.clone()).await;
    let second = h.submit(keyed).await;
    let (_, job) = h.call("GET", &format!("/v1/jobs/{second}"), None).await;
    assert_eq!(job["state"], "pending");
    assert_eq!(job["waiting_reason"]["code"], "ordering_key");
    let text = job["waiting_reason"]["text"].as_str().unwrap();
    assert!(text.contains(&first) && text.contains("running"), "{text}");
}

// Proves validation answers 200 for a good spec and the submit's own 400 for a bad one, and
// stores nothing either way.
#[tokio::test]
async fn validate_answers_like_submit() {
    let h = harness();
    let good = json!({"steps": [{"name": "a", "agent": "x"}]});
    let (status, body) = h.call("POST", "/v1/jobs:validate", Some(good)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let bad = json!({"steps": [{"name": "a", "agent": "x", "depends_on": ["zz"]}]});
    let (status, body) = h.call("POST", "/v1/jobs:validate", Some(bad.clone())).await;
    let (submit_status, submit_body) = h.call("POST", "/v1/jobs", Some(bad)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!((status, &body), (submit_status, &submit_body));
    let (_, list) = h.call("GET", "/v1/jobs", None).await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0);
}

// Proves the event stream says hello, then sends one `change` naming a job submitted after it
// opened, and that a `?job=` filter keeps other jobs' changes out.
#[tokio::test]
async fn event_stream_reports_changes() {
    let h = harness();
    let other = h
        .submit(json!({"steps": [{"name": "a", "agent": "x"}]}))
        .await;
    let all = h
        .router
        .clone()
        .oneshot(request("GET", "/v1/events/stream", None));
    let mut all = all.await.unwrap().into_body().into_data_stream();
    let path = format!("/v1/events/stream?job={other}");
    let filtered = h.router.clone().oneshot(request("GET", &path, None));
    let mut filtered = filtered.await.unwrap().into_body().into_data_stream();
    let id = h
        .submit(json!({"steps": [{"name": "a", "agent": "x"}]}))
        .await;
    let mut seen = String::new();
    while !seen.contains(&id) {
        let chunk = tokio::time::timeout(Duration::from_secs(5), all.next()).await;
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap().unwrap()));
    }
    assert!(seen.starts_with("event: hello"), "{seen}");
    assert!(
        seen.contains("event: change") && seen.contains("job_submitted"),
        "{seen}"
    );
    let hello = filtered.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&hello).contains("hello"));
    let more = tokio::time::timeout(Duration::from_millis(300), filtered.next()).await;
    assert!(
        more.is_err(),
        "the filtered stream got another job's change"
    );
}

/// Assets and JSON answers are gzipped for a client that asks, and only then; the event stream
/// never is (a compressor would hold events back until its buffer fills).
#[tokio::test]
async fn answers_are_gzipped_when_asked_but_never_the_event_stream() {
    let h = harness();
    let get = |path: &str, gzip: bool| {
        let mut req = Request::builder().method("GET").uri(path);
        if gzip {
            req = req.header("accept-encoding", "gzip");
        }
        h.router.clone().oneshot(req.body(Body::empty()).unwrap())
    };
    let plain = get("/console/app.js", false).await.unwrap();
    assert!(plain.headers().get("content-encoding").is_none());
    let plain = axum::body::to_bytes(plain.into_body(), usize::MAX)
        .await
        .unwrap();

    let zipped = get("/console/app.js", true).await.unwrap();
    assert_eq!(zipped.status(), StatusCode::OK);
    assert_eq!(
        zipped
            .headers()
            .get("content-encoding")
            .map(|v| v.as_bytes()),
        Some(&b"gzip"[..])
    );
    let zipped = axum::body::to_bytes(zipped.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(&zipped[..2], &[0x1f, 0x8b], "a gzip stream");
    assert!(
        zipped.len() * 2 < plain.len(),
        "{} of {} bytes",
        zipped.len(),
        plain.len()
    );

    for n in 0..20 {
        let (status, _) = h
            .call(
                "POST",
                "/v1/jobs",
                Some(
                    json!({"labels": {"n": n.to_string()}, "steps": [{"name": "s", "agent": "a"}]}),
                ),
            )
            .await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    let list = get("/v1/jobs?limit=20", true).await.unwrap();
    assert_eq!(
        list.headers().get("content-encoding").map(|v| v.as_bytes()),
        Some(&b"gzip"[..])
    );

    let stream = get("/v1/events/stream", true).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    assert!(
        stream.headers().get("content-encoding").is_none(),
        "{:?}",
        stream.headers()
    );
}
