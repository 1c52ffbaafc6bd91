//! A typed HTTP client for the Overseer API.
//!
//! Every call maps a 2xx answer to its wire type and anything else to [`Error`]. Error answers
//! are `application/problem+json`; an answer that is not (a proxy's HTML page, say) is still
//! turned into a [`Problem`] so callers only ever match one shape.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use overseer_core::wire::{
    AgentList, BatchResponse, BatchSummary, CompleteRequest, EventList, FailRequest,
    HeartbeatRequest, HeartbeatResponse, JobList, JobView, LeaseOutcome, LeaseRequest,
    LeaseResponse, OperatorRequest, Problem, ReportBatch, ReportBatchResponse, ReportResult,
    RerunRequest, RescheduleRequest,
};
use overseer_core::{JobId, JobSpec, LeaseId, Span};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// How long an ordinary (not long-polling) request may take, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Added to a long-poll's `wait` to get its request timeout, so a slow answer at the end of
/// the wait is not mistaken for a dead server.
pub const LONG_POLL_SLACK: Duration = Duration::from_secs(15);
/// The server's default lease `wait`, assumed when a lease request does not say.
pub const DEFAULT_LEASE_WAIT: Span = Span::from_secs(20);
/// The most bytes of an answer body we read; beyond that the answer is refused as undecodable
/// instead of growing memory without bound.
pub const BODY_MAX_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error status (4xx or 5xx).
    #[error("{}", describe(problem))]
    Api { status: u16, problem: Problem },
    /// A heartbeat, complete or fail was refused with 409: the lease has expired or was
    /// superseded. Nothing changed on the server; the caller must stop work on this attempt.
    #[error("lease lost: {}", .0.detail)]
    LeaseLost(Problem),
    /// No answer: connection refused or reset, DNS, timeout. The message names the URL once
    /// and the innermost cause (e.g. `Connection refused`), not every layer in between.
    #[error("cannot reach {url}: {}", root_cause(source))]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A 2xx answer whose body is not what the API promises.
    #[error("unexpected answer from {url} (status {status}): {message}")]
    Decode {
        url: String,
        status: u16,
        message: String,
    },
    /// The server URL given to [`Client::new`] cannot be used.
    #[error("invalid server URL `{url}`: {message}")]
    BadUrl { url: String, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The deepest error under `e`: what actually went wrong on the wire.
fn root_cause(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if e.is_timeout() {
        return "timed out".into();
    }
    cause.to_string()
}

fn describe(p: &Problem) -> String {
    match &p.field {
        Some(field) if !p.detail.contains(field.as_str()) => {
            format!("{} ({}): {}: {}", p.title, p.status, field, p.detail)
        }
        _ => format!("{} ({}): {}", p.title, p.status, p.detail),
    }
}

impl Error {
    /// The HTTP status of an error answer, if there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            Error::LeaseLost(p) => Some(p.status),
            Error::Decode { status, .. } => Some(*status),
            Error::Transport { .. } | Error::BadUrl { .. } => None,
        }
    }

    /// The problem the server answered, if it answered one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Api { problem, .. } | Error::LeaseLost(problem) => Some(problem),
            _ => None,
        }
    }

    /// Whether sending the same request again later may succeed: no answer at all, the server
    /// overloaded (429) or failing (5xx). A 4xx says the request itself is wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } => true,
            Error::Api { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// A handle on an Overseer cluster: one server URL, or several nodes of one cluster to fail
/// over between. Cheap to clone: clones share one connection pool and one choice of node.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    servers: Arc<Servers>,
    token: Option<String>,
}

/// The nodes a client may use and the one it uses now. Every node serves the whole API, so a
/// request that cannot reach one is retried by its caller on the next.
struct Servers {
    urls: Vec<Url>,
    current: AtomicUsize,
}

impl Servers {
    fn current(&self) -> (usize, &Url) {
        let i = self.current.load(Ordering::Relaxed) % self.urls.len();
        (i, &self.urls[i])
    }

    /// Moves on from node `failed` to the next one, once however many requests saw it fail.
    fn fail_over(&self, failed: usize) {
        if self.urls.len() < 2 {
            return;
        }
        let next = (failed + 1) % self.urls.len();
        if self
            .current
            .compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(from = %self.urls[failed], to = %self.urls[next], "server unreachable: failing over");
        }
    }
}

/// Written by hand so the token never ends up in a log line.
impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<&str> = self.servers.urls.iter().map(Url::as_str).collect();
        f.debug_struct("Client")
            .field("servers", &urls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// One server URL of a `--server` list, checked.
#[allow(clippy::result_large_err)] // The crate's one error type; a bad URL is a start-up error.
fn parse_server(raw: &str) -> Result<Url> {
    let bad = |message: String| Error::BadUrl {
        url: raw.to_string(),
        message,
    };
    let url = Url::parse(raw).map_err(|e| bad(e.to_string()))?;
    match url.scheme() {
        "http" | "https" => {}
        _ => return Err(bad("the scheme must be http or https".into())),
    }
    if url.cannot_be_a_base() {
        return Err(bad("not a base URL".into()));
    }
    Ok(url)
}

/// A JSON body borrowed from the caller, so a batch need not be cloned to be sent.
#[derive(Serialize)]
struct BatchBody<'a> {
    jobs: &'a [JobSpec],
}

impl Client {
    /// A client for the server at `base_url` (e.g. `http://127.0.0.1:7433`), or for several
    /// nodes of one cluster given as a comma-separated list (`http://a:7433,http://b:7433`): a
    /// request that cannot reach the node in use moves the client on to the next, so the
    /// caller's retry lands there. Sends `Authorization: Bearer <token>` with every request
    /// when a token is given.
    #[allow(clippy::result_large_err)] // The crate's one error type; this runs once at start.
    pub fn new(base_url: &str, token: Option<String>) -> Result<Client> {
        Client::with_ca(base_url, token, None)
    }

    /// Like [`Client::new`], also trusting the PEM certificate(s) in `ca_pem` for `https://`
    /// servers (a private CA, or a server's self-signed certificate).
    #[allow(clippy::result_large_err)] // The crate's one error type; this runs once at start.
    pub fn with_ca(base_url: &str, token: Option<String>, ca_pem: Option<&[u8]>) -> Result<Client> {
        let urls = base_url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(parse_server)
            .collect::<Result<Vec<Url>>>()?;
        if urls.is_empty() {
            return Err(Error::BadUrl {
                url: base_url.to_string(),
                message: "no server URL given".into(),
            });
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("overseer-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| Error::BadUrl {
                url: base_url.to_string(),
                message: format!("the CA certificate is not PEM: {e}"),
            })?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder.build().map_err(|e| Error::BadUrl {
            url: base_url.to_string(),
            message: format!("cannot build an HTTP client: {e}"),
        })?;
        Ok(Client {
            http,
            servers: Arc::new(Servers {
                urls,
                current: AtomicUsize::new(0),
            }),
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The URL of the server in use now.
    pub fn base_url(&self) -> &Url {
        self.servers.current().1
    }

    /// `POST /v1/jobs`. Answers the job and whether it was created now (`202`) rather than
    /// found by its idempotency key (`200`).
    pub async fn submit(&self, spec: &JobSpec) -> Result<(JobView, bool)> {
        self.submit_body(spec).await
    }

    /// `POST /v1/jobs` with a body the caller already holds as JSON (e.g. read from a file),
    /// so the server, not this client, judges and names any bad field.
    pub async fn submit_value(&self, spec: &Value) -> Result<(JobView, bool)> {
        self.submit_body(spec).await
    }

    async fn submit_body<B: Serialize + ?Sized>(&self, body: &B) -> Result<(JobView, bool)> {
        let url = self.url(&["v1", "jobs"]);
        let (status, job) = self
            .call(Method::POST, url, &[], Some(body), REQUEST_TIMEOUT)
            .await?;
        Ok((job, status == StatusCode::ACCEPTED))
    }

    /// `POST /v1/jobs:batch`: all jobs or none.
    pub async fn submit_batch(&self, jobs: &[JobSpec]) -> Result<BatchResponse> {
        let url = self.url(&["v1", "jobs:batch"]);
        let body = BatchBody { jobs };
        self.call_ok(Method::POST, url, &[], Some(&body), REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/jobs:batch` with `Prefer: return=minimal`: all jobs or none, answered with
    /// each job's id, state and whether this request created it rather than the whole jobs
    /// (much less to build, send and decode when the caller only needs the ids).
    pub async fn submit_batch_minimal(&self, jobs: &[JobSpec]) -> Result<BatchSummary> {
        let url = self.url(&["v1", "jobs:batch"]);
        let body = BatchBody { jobs };
        let prefer = [("prefer", "return=minimal")];
        self.call_with(
            Method::POST,
            url,
            &[],
            &prefer,
            Some(&body),
            REQUEST_TIMEOUT,
        )
        .await
        .map(|(_, answer)| answer)
    }

    /// `GET /v1/jobs/{id}`.
    pub async fn job(&self, id: JobId) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string()]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/jobs/{id}/events`, oldest first.
    pub async fn events(&self, id: JobId) -> Result<EventList> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "events"]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/jobs`, newest first. `labels` are `key:value` filters, all of which must match;
    /// `cursor` is a previous answer's `next_cursor`.
    pub async fn jobs(
        &self,
        state: Option<&str>,
        labels: &[String],
        limit: Option<usize>,
        cursor: Option<&str>,
    ) -> Result<JobList> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(s) = state {
            query.push(("state", s.to_string()));
        }
        for label in labels {
            query.push(("label", label.clone()));
        }
        if let Some(n) = limit {
            query.push(("limit", n.to_string()));
        }
        if let Some(c) = cursor {
            query.push(("cursor", c.to_string()));
        }
        let url = self.url(&["v1", "jobs"]);
        self.call_ok(Method::GET, url, &query, None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/jobs` with any of its query parameters (`state`, `label`, `agent`, `since`,
    /// `until`, `id_prefix`, `limit`, `cursor`).
    pub async fn jobs_where(&self, query: &[(&str, String)]) -> Result<JobList> {
        let url = self.url(&["v1", "jobs"]);
        self.call_ok(Method::GET, url, query, None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/agents/{agent}/limits`: `{agent, max_concurrency, rate, paused}`.
    pub async fn limits(&self, agent: &str) -> Result<Value> {
        let url = self.url(&["v1", "agents", agent, "limits"]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `PUT /v1/agents/{agent}/limits` with `{max_concurrency, rate}` (absent = no limit).
    pub async fn set_limits(
        &self,
        agent: &str,
        max_concurrency: Option<u32>,
        rate: Option<f64>,
    ) -> Result<Value> {
        let url = self.url(&["v1", "agents", agent, "limits"]);
        let body = serde_json::json!({ "max_concurrency": max_concurrency, "rate": rate });
        self.call_ok(Method::PUT, url, &[], Some(&body), REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/agents/{agent}/pause` or `/resume`.
    pub async fn set_agent_paused(&self, agent: &str, paused: bool) -> Result<Value> {
        let verb = if paused { "pause" } else { "resume" };
        let url = self.url(&["v1", "agents", agent, verb]);
        self.call_ok(Method::POST, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/tokens` (admin): answers the token with its secret, shown this once.
    pub async fn create_token(&self, body: &Value) -> Result<Value> {
        let url = self.url(&["v1", "tokens"]);
        self.call_ok(Method::POST, url, &[], Some(body), REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/tokens` (admin): `{tokens: [...]}`, never secrets.
    pub async fn tokens(&self) -> Result<Value> {
        let url = self.url(&["v1", "tokens"]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/settings/webhook-secret` (admin): `{source, secret}`, the secret only when the
    /// server generated it.
    pub async fn webhook_secret(&self) -> Result<Value> {
        let url = self.url(&["v1", "settings", "webhook-secret"]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `DELETE /v1/tokens/{name}` (admin).
    pub async fn revoke_token(&self, name: &str) -> Result<Value> {
        let url = self.url(&["v1", "tokens", name]);
        self.call_ok(Method::DELETE, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `DELETE /v1/jobs/{id}`: removes a finished job now (409 while it has not finished).
    pub async fn delete_job(&self, id: JobId) -> Result<()> {
        let url = self.url(&["v1", "jobs", &id.to_string()]);
        self.call_ok::<Value, ()>(Method::DELETE, url, &[], None, REQUEST_TIMEOUT)
            .await
            .map(|_| ())
    }

    /// `POST /v1/jobs/{id}/cancel`: answers the job as it is after the request.
    pub async fn cancel(&self, id: JobId) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "cancel"]);
        self.call_ok(Method::POST, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `PATCH /v1/jobs/{id}`: a pending job's new `run_at` and/or a job's new priority.
    pub async fn reschedule(&self, id: JobId, change: &RescheduleRequest) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string()]);
        self.call_ok(Method::PATCH, url, &[], Some(change), REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/jobs/{id}/steps/{step}/retry`: operator action on a failed or blocked step.
    pub async fn retry_step(
        &self,
        id: JobId,
        step: &str,
        action: &OperatorRequest,
    ) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "steps", step, "retry"]);
        self.call_ok(Method::POST, url, &[], Some(action), REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/jobs/{id}/steps/{step}/skip`: operator action on a failed or blocked step.
    pub async fn skip_step(
        &self,
        id: JobId,
        step: &str,
        action: &OperatorRequest,
    ) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "steps", step, "skip"]);
        self.call_ok(Method::POST, url, &[], Some(action), REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/jobs/{id}/rerun`: runs a failed or cancelled job again as a new job, answered.
    /// A second rerun of one job is refused (409 `already-rerun`), so retrying a call whose
    /// answer was lost never makes two.
    pub async fn rerun(&self, id: JobId, request: &RerunRequest) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "rerun"]);
        self.call_ok(Method::POST, url, &[], Some(request), REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/jobs/{id}/resume`: resumes a blocked job.
    pub async fn resume(&self, id: JobId, action: &OperatorRequest) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "resume"]);
        self.call_ok(Method::POST, url, &[], Some(action), REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/jobs/{id}/wait?timeout=…`: the job once it is terminal, or as it is when
    /// `timeout` passes. The request itself may take `timeout` plus [`LONG_POLL_SLACK`].
    pub async fn wait(&self, id: JobId, timeout: Span) -> Result<JobView> {
        let url = self.url(&["v1", "jobs", &id.to_string(), "wait"]);
        let query = [("timeout", timeout.to_string())];
        self.call_ok(
            Method::GET,
            url,
            &query,
            None::<&()>,
            timeout.as_std() + LONG_POLL_SLACK,
        )
        .await
    }

    /// `POST /v1/agents/{agent}/leases`: long-polls for up to `request.wait` (the server's
    /// default, 20s, when unset) and answers the leases taken, possibly none.
    pub async fn leases(&self, agent: &str, request: &LeaseRequest) -> Result<LeaseResponse> {
        let url = self.url(&["v1", "agents", agent, "leases"]);
        let wait = request.wait.unwrap_or(DEFAULT_LEASE_WAIT).as_std();
        self.call_ok(
            Method::POST,
            url,
            &[],
            Some(request),
            wait + LONG_POLL_SLACK,
        )
        .await
    }

    /// `POST /v1/leases/{id}/heartbeat`. A 409 is [`Error::LeaseLost`].
    pub async fn heartbeat(
        &self,
        lease: LeaseId,
        progress: Option<Value>,
    ) -> Result<HeartbeatResponse> {
        let url = self.url(&["v1", "leases", &lease.to_string(), "heartbeat"]);
        let body = HeartbeatRequest { progress };
        self.call_ok(Method::POST, url, &[], Some(&body), REQUEST_TIMEOUT)
            .await
            .map_err(lease_lost)
    }

    /// `POST /v1/leases/{id}/complete`. A 409 is [`Error::LeaseLost`].
    pub async fn complete(&self, lease: LeaseId, result: Option<Value>) -> Result<()> {
        let url = self.url(&["v1", "leases", &lease.to_string(), "complete"]);
        let body = CompleteRequest { result };
        self.call_ok::<Value, _>(Method::POST, url, &[], Some(&body), REQUEST_TIMEOUT)
            .await
            .map(drop)
            .map_err(lease_lost)
    }

    /// `POST /v1/leases/{id}/fail`. A 409 is [`Error::LeaseLost`].
    pub async fn fail(&self, lease: LeaseId, error: &str, retryable: bool) -> Result<()> {
        let url = self.url(&["v1", "leases", &lease.to_string(), "fail"]);
        let body = FailRequest {
            error: error.to_string(),
            retryable,
        };
        self.call_ok::<Value, _>(Method::POST, url, &[], Some(&body), REQUEST_TIMEOUT)
            .await
            .map(drop)
            .map_err(lease_lost)
    }

    /// `POST /v1/leases:report`: many leases' outcomes in one call, answered one result per
    /// report in order (each with the status its own `complete`/`fail` call would have had).
    /// An `Err` means none of them was applied.
    pub async fn report_batch(&self, reports: Vec<LeaseOutcome>) -> Result<Vec<ReportResult>> {
        let url = self.url(&["v1", "leases:report"]);
        let body = ReportBatch { reports };
        self.call_ok::<ReportBatchResponse, _>(Method::POST, url, &[], Some(&body), REQUEST_TIMEOUT)
            .await
            .map(|r| r.results)
    }

    /// `GET /v1/agents`.
    pub async fn agents(&self) -> Result<AgentList> {
        let url = self.url(&["v1", "agents"]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/schedules`: creates a cron schedule (the body is a `ScheduleSpec` as JSON).
    pub async fn schedule_create(&self, spec: &Value) -> Result<Value> {
        let url = self.url(&["v1", "schedules"]);
        self.call_ok(Method::POST, url, &[], Some(spec), REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/schedules`.
    pub async fn schedules(&self) -> Result<Value> {
        let url = self.url(&["v1", "schedules"]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/schedules/{name}`.
    pub async fn schedule(&self, name: &str) -> Result<Value> {
        let url = self.url(&["v1", "schedules", name]);
        self.call_ok(Method::GET, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// `PUT /v1/schedules/{name}`: replaces a schedule's definition (a `ScheduleSpec` as JSON,
    /// its `name` the schedule's own).
    pub async fn schedule_update(&self, name: &str, spec: &Value) -> Result<Value> {
        let url = self.url(&["v1", "schedules", name]);
        self.call_ok(Method::PUT, url, &[], Some(spec), REQUEST_TIMEOUT)
            .await
    }

    /// `DELETE /v1/schedules/{name}`.
    pub async fn schedule_delete(&self, name: &str) -> Result<()> {
        let url = self.url(&["v1", "schedules", name]);
        self.call::<Value, ()>(Method::DELETE, url, &[], None, REQUEST_TIMEOUT)
            .await
            .map(|_| ())
    }

    /// `POST /v1/schedules/{name}/pause` or `/resume`.
    pub async fn schedule_set_paused(&self, name: &str, paused: bool) -> Result<Value> {
        let verb = if paused { "pause" } else { "resume" };
        let url = self.url(&["v1", "schedules", name, verb]);
        self.call_ok(Method::POST, url, &[], None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    /// The base URL with `segments` appended, each percent-encoded, so an agent or step name
    /// holding `/` or `?` stays one path segment.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base_url().clone();
        url.path_segments_mut()
            .expect("checked in Client::new: the base URL can be a base")
            .pop_if_empty()
            .extend(segments);
        url
    }

    /// Which configured node `url` was built on.
    fn node_of(&self, url: &Url) -> Option<usize> {
        self.servers.urls.iter().position(|base| {
            let prefix = format!("{}/", base.as_str().trim_end_matches('/'));
            url.as_str().starts_with(&prefix)
        })
    }

    async fn call_ok<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<T> {
        self.call(method, url, query, body, timeout)
            .await
            .map(|(_, v)| v)
    }

    async fn call<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<(StatusCode, T)> {
        self.call_with(method, url, query, &[], body, timeout).await
    }

    /// [`Client::call`] with extra request headers.
    async fn call_with<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        url: Url,
        query: &[(&str, String)],
        headers: &[(&'static str, &'static str)],
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<(StatusCode, T)> {
        let shown = url.to_string();
        let node = self.node_of(&url);
        let transport = |source: reqwest::Error| {
            if let Some(node) = node {
                self.servers.fail_over(node);
            }
            Error::Transport {
                url: shown.clone(),
                source,
            }
        };
        let mut request = self.http.request(method, url.clone()).timeout(timeout);
        if !query.is_empty() {
            request = request.query(query);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if bytes.len() + chunk.len() > BODY_MAX_BYTES {
                return Err(Error::Decode {
                    url: shown,
                    status: status.as_u16(),
                    message: format!("the answer is larger than {BODY_MAX_BYTES} bytes"),
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            return Err(Error::Api {
                status: status.as_u16(),
                problem: problem_of(status, &bytes),
            });
        }
        // A 2xx with an empty body still decodes for callers that ignore it (`Value`).
        let text: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        let value = serde_json::from_slice(text).map_err(|e| Error::Decode {
            url: shown,
            status: status.as_u16(),
            message: e.to_string(),
        })?;
        Ok((status, value))
    }
}

/// The three lease reports name a 409 specially: it is the fencing answer the agent acts on.
fn lease_lost(e: Error) -> Error {
    match e {
        Error::Api {
            status: 409,
            problem,
        } => Error::LeaseLost(problem),
        other => other,
    }
}

/// The problem an error answer carries, or one made up from its status and text when the
/// body is not a problem document.
fn problem_of(status: StatusCode, body: &[u8]) -> Problem {
    if let Ok(mut p) = serde_json::from_slice::<Problem>(body) {
        p.status = status.as_u16();
        return p;
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut detail: String = text.chars().take(500).collect();
    if detail.len() < text.len() {
        detail.push('…');
    }
    Problem {
        kind: "about:blank".to_string(),
        code: "http-error".to_string(),
        title: status.canonical_reason().unwrap_or("Error").to_string(),
        status: status.as_u16(),
        detail,
        field: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves path segments are encoded one by one and a base path prefix is kept.
    #[test]
    fn urls_keep_segments_whole() {
        let c = Client::new("http://example.test/prefix/", None).unwrap();
        let u = c.url(&["v1", "agents", "a/b?c", "leases"]);
        assert_eq!(
            u.as_str(),
            "http://example.test/prefix/v1/agents/a%2Fb%3Fc/leases"
        );
        let c = Client::new("http://example.test", None).unwrap();
        assert_eq!(
            c.url(&["v1", "jobs:batch"]).as_str(),
            "http://example.test/v1/jobs:batch"
        );
        assert!(Client::new("ftp://example.test", None).is_err());
        assert!(Client::new("https://example.test", None).is_ok());
        assert!(Client::new("ftp://example.test", None).is_err());
        let shown = format!(
            "{:?}",
            Client::new("http://h", Some("s3cret".into())).unwrap()
        );
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(Client::new("not a url", None).is_err());
    }

    // Proves a non-problem error body still becomes a problem carrying the status and text.
    #[test]
    fn plain_error_bodies_become_problems() {
        let p = problem_of(StatusCode::BAD_GATEWAY, b"<html>upstream down</html>");
        assert_eq!(p.status, 502);
        assert_eq!(p.title, "Bad Gateway");
        assert!(p.detail.contains("upstream down"));
        let body = br#"{"type":"x","title":"Conflict","status":409,"detail":"gone"}"#;
        let p = problem_of(StatusCode::CONFLICT, body);
        assert_eq!((p.kind.as_str(), p.detail.as_str()), ("x", "gone"));
    }
}
