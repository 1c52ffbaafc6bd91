//! A stand-in for the Overseer server: serves canned lease, heartbeat and report answers on
//! an ephemeral port and records every call, so tests can check what an agent sent and when.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use overseer_agent::Client;
use overseer_core::wire::{
    CompleteRequest, FailRequest, HeartbeatRequest, HeartbeatResponse, JobList, JobView, Lease,
    LeaseRequest, LeaseResponse, Problem,
};
use overseer_core::{DesiredState, JobId, JobState, LeaseId, Timestamp};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How the fake answers heartbeats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Beat {
    /// Renew the lease for the step's timeout.
    Renew,
    /// 409: the lease is lost.
    Conflict,
    /// Renew, and ask the agent to stop: the job is being cancelled.
    Cancel,
    /// 503: the server cannot be reached in time (the lease is never renewed).
    Unavailable,
}

#[derive(Clone, Debug)]
pub enum Call {
    Leases {
        at: Instant,
        worker: String,
        max: usize,
        /// Leases handed out and not yet reported when this request came in.
        outstanding: usize,
    },
    Heartbeat {
        at: Instant,
        lease: LeaseId,
        progress: Option<Value>,
    },
    Complete {
        at: Instant,
        lease: LeaseId,
        result: Option<Value>,
    },
    Fail {
        at: Instant,
        lease: LeaseId,
        error: String,
        retryable: bool,
    },
}

#[derive(Default)]
pub struct Inner {
    pub queue: VecDeque<Lease>,
    pub calls: Vec<Call>,
    pub beat: Option<Beat>,
    pub leased: HashMap<LeaseId, Lease>,
    pub reported: HashSet<LeaseId>,
    /// When set, complete and fail answer 409.
    pub reports_conflict: bool,
    /// How long complete and fail take to answer (recorded at once, answered after this).
    pub report_delay: Duration,
    pub submitted_keys: HashSet<String>,
    pub queries: Vec<String>,
    pub auth: Vec<Option<String>>,
}

pub struct Fake {
    pub base: String,
    pub state: Arc<Shared>,
}

pub struct Shared {
    pub inner: Mutex<Inner>,
    pub queued: Notify,
}

impl Fake {
    pub async fn start() -> Fake {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let state = Arc::new(Shared {
            inner: Mutex::new(Inner {
                beat: Some(Beat::Renew),
                ..Inner::default()
            }),
            queued: Notify::new(),
        });
        let app = Router::new()
            .route("/v1/jobs", post(submit).get(list))
            .route("/v1/jobs/{id}/wait", get(wait))
            .route("/v1/agents", get(bad_gateway))
            .route("/v1/agents/{agent}/leases", post(leases))
            .route("/v1/leases/{id}/heartbeat", post(heartbeat))
            .route("/v1/leases/{id}/complete", post(complete))
            .route("/v1/leases/{id}/fail", post(fail))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Fake {
            base: format!("http://{addr}"),
            state,
        }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.base, None).unwrap()
    }

    pub fn push(&self, lease: Lease) {
        self.state.inner.lock().unwrap().queue.push_back(lease);
        self.state.queued.notify_waiters();
    }

    pub fn set_beat(&self, beat: Beat) {
        self.state.inner.lock().unwrap().beat = Some(beat);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.inner.lock().unwrap().calls.clone()
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.state.inner.lock().unwrap())
    }

    pub fn reports(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Complete { .. } | Call::Fail { .. }))
            .collect()
    }

    pub fn heartbeats(&self, id: LeaseId) -> Vec<Instant> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Heartbeat { at, lease, .. } if lease == id => Some(at),
                _ => None,
            })
            .collect()
    }
}

/// Waits until `cond` holds, checking every 10ms, for at most `limit`. Answers whether it held.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A lease for step `step` of a fresh job, with `lease_ms` left and the given step timeout.
pub fn lease(step: &str, lease_ms: u64, timeout_ms: u64) -> Lease {
    let job_id = JobId::generate();
    Lease {
        lease_id: LeaseId::generate(),
        kind: overseer_core::wire::LeaseKind::Work,
        job_id,
        step: step.to_string(),
        agent: "work".to_string(),
        attempt: 1,
        undo_attempt: None,
        payload: json!({"n": 1}),
        inputs: serde_json::Map::new(),
        idempotency_key: format!("{job_id}/{step}"),
        complete_by: Timestamp::from_millis(now_ms() + lease_ms as i64),
        lease_ms,
        timeout_ms,
    }
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let p = Problem {
        kind: "about:blank".into(),
        code: "test".into(),
        title: status.canonical_reason().unwrap_or("").into(),
        status: status.as_u16(),
        detail: detail.into(),
        field: None,
    };
    let mut r = (status, Json(p)).into_response();
    r.headers_mut()
        .insert("content-type", "application/problem+json".parse().unwrap());
    r
}

pub fn job_view(key: Option<String>) -> JobView {
    JobView {
        id: JobId::generate(),
        state: JobState::Pending,
        desired_state: DesiredState::Succeeded,
        idempotency_key: key,
        labels: BTreeMap::new(),
        priority: 0,
        run_at: None,
        ordering_key: None,
        on_failure: "fail".into(),
        created_at: Timestamp::from_millis(now_ms()),
        updated_at: Timestamp::from_millis(now_ms()),
        finished_at: None,
        blocked_reason: None,
        compensated: vec![],
        callback_url: None,
        submitted_by: None,
        deadline: None,
        round: 1,
        job_attempts: None,
        job_exhausted: None,
        rerun_of: None,
        rerun_by: None,
        waiting_reason: None,
        retention: None,
        removable_at: None,
        steps: vec![],
    }
}

async fn submit(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let auth = headers
        .get("authorization")
        .map(|v| v.to_str().unwrap().to_string());
    let mut inner = s.inner.lock().unwrap();
    inner.auth.push(auth);
    if !matches!(body["steps"].as_array(), Some(steps) if !steps.is_empty()) {
        let p = Problem {
            kind: "about:blank".into(),
            code: "invalid-request".into(),
            title: "Bad Request".into(),
            status: 400,
            detail: "a job needs at least one step".into(),
            field: Some("steps".into()),
        };
        return (StatusCode::BAD_REQUEST, Json(p)).into_response();
    }
    let key = body["idempotency_key"].as_str().map(str::to_string);
    let created = match &key {
        Some(k) => inner.submitted_keys.insert(k.clone()),
        None => true,
    };
    let status = if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    (status, Json(job_view(key))).into_response()
}

async fn list(State(s): State<Arc<Shared>>, RawQuery(q): RawQuery) -> Json<JobList> {
    s.inner.lock().unwrap().queries.push(q.unwrap_or_default());
    Json(JobList {
        jobs: vec![job_view(None)],
        next_cursor: Some("c2".into()),
    })
}

async fn wait(
    State(s): State<Arc<Shared>>,
    Path(_id): Path<String>,
    RawQuery(q): RawQuery,
) -> Json<JobView> {
    s.inner.lock().unwrap().queries.push(q.unwrap_or_default());
    Json(job_view(None))
}

async fn bad_gateway() -> Response {
    (StatusCode::BAD_GATEWAY, "<html>upstream is down</html>").into_response()
}

async fn leases(
    State(s): State<Arc<Shared>>,
    Path(_agent): Path<String>,
    Json(req): Json<LeaseRequest>,
) -> Json<LeaseResponse> {
    let max = req.max.unwrap_or(1);
    {
        let mut inner = s.inner.lock().unwrap();
        let outstanding = inner.leased.len() - inner.reported.len();
        inner.calls.push(Call::Leases {
            at: Instant::now(),
            worker: req.worker.clone(),
            max,
            outstanding,
        });
    }
    let wait = req
        .wait
        .map(|w| w.as_std())
        .unwrap_or(Duration::from_secs(20));
    let end = Instant::now() + wait;
    loop {
        let notified = s.queued.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut inner = s.inner.lock().unwrap();
            let n = max.min(inner.queue.len());
            if n > 0 {
                let leases: Vec<Lease> = inner.queue.drain(..n).collect();
                for l in &leases {
                    inner.leased.insert(l.lease_id, l.clone());
                }
                return Json(LeaseResponse { leases });
            }
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(end) => return Json(LeaseResponse { leases: vec![] }),
        }
    }
}

fn lease_of(inner: &Inner, id: &str) -> Option<Lease> {
    inner.leased.get(&id.parse().ok()?).cloned()
}

async fn heartbeat(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Json(req): Json<HeartbeatRequest>,
) -> Response {
    let mut inner = s.inner.lock().unwrap();
    let Some(lease) = lease_of(&inner, &id) else {
        return problem(StatusCode::NOT_FOUND, "no such lease");
    };
    inner.calls.push(Call::Heartbeat {
        at: Instant::now(),
        lease: lease.lease_id,
        progress: req.progress,
    });
    let renewed = |cancel: bool| {
        Json(HeartbeatResponse {
            complete_by: Timestamp::from_millis(now_ms() + lease.timeout_ms as i64),
            lease_ms: lease.timeout_ms,
            cancel,
        })
        .into_response()
    };
    match inner.beat.unwrap_or(Beat::Renew) {
        Beat::Renew => renewed(false),
        Beat::Cancel => renewed(true),
        Beat::Conflict => problem(StatusCode::CONFLICT, "the lease expired"),
        Beat::Unavailable => problem(StatusCode::SERVICE_UNAVAILABLE, "try later"),
    }
}

fn report(inner: &mut Inner, id: &str, call: impl FnOnce(LeaseId) -> Call) -> Response {
    let Some(lease) = lease_of(inner, id) else {
        return problem(StatusCode::NOT_FOUND, "no such lease");
    };
    inner.calls.push(call(lease.lease_id));
    if inner.reports_conflict || !inner.reported.insert(lease.lease_id) {
        return problem(StatusCode::CONFLICT, "the lease is no longer live");
    }
    Json(json!({"lease_id": lease.lease_id})).into_response()
}

async fn complete(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Json(req): Json<CompleteRequest>,
) -> Response {
    answered_after_delay(&s, |inner| {
        report(inner, &id, |lease| Call::Complete {
            at: Instant::now(),
            lease,
            result: req.result,
        })
    })
    .await
}

async fn fail(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    Json(req): Json<FailRequest>,
) -> Response {
    answered_after_delay(&s, |inner| {
        report(inner, &id, |lease| Call::Fail {
            at: Instant::now(),
            lease,
            error: req.error,
            retryable: req.retryable,
        })
    })
    .await
}

/// Records a report at once (under the lock) and answers it after the fake's `report_delay`.
async fn answered_after_delay(s: &Shared, record: impl FnOnce(&mut Inner) -> Response) -> Response {
    let (answer, delay) = {
        let mut inner = s.inner.lock().unwrap();
        (record(&mut inner), inner.report_delay)
    };
    tokio::time::sleep(delay).await;
    answer
}
