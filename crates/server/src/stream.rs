//! `GET /v1/events/stream`: server-sent events, one small JSON per committed job transition
//! (`event: change`), so the console refetches only what changed instead of polling.
//!
//! Fed by [`crate::App::committed`] (every transition on this node) and [`crate::App::signal`]
//! (what other PostgreSQL nodes committed; those carry less detail). Bounded everywhere: at most
//! [`MAX_STREAMS`] open streams (503 beyond), a fixed-size broadcast buffer, and a client that
//! falls behind gets one `event: resync` (refetch everything) instead of a growing queue.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, StreamExt};
use overseer_core::{JobId, JobState, Transition};
use serde::Serialize;
use tokio::sync::{broadcast, OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, Result};
use crate::App;

/// Open streams per node; each holds one broadcast receiver.
pub const MAX_STREAMS: usize = 256;
/// Changes buffered per receiver before a slow one is told to resync.
pub const BUFFER: usize = 1024;

/// What one committed transition changed, as a stream event.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// `None` for a wake-up from another node that names no job.
    pub job: Option<JobId>,
    pub state: Option<JobState>,
    /// Event kinds of the transition (`step_leased`, `job_succeeded`, …).
    pub kinds: Vec<&'static str>,
    pub steps: Vec<String>,
    /// Who submitted the job, so a caller limited to its own jobs sees only theirs.
    #[serde(skip)]
    pub submitted_by: Option<String>,
}

impl Change {
    pub fn of(t: &Transition) -> Change {
        let mut steps: Vec<String> = t.events.iter().filter_map(|e| e.step.clone()).collect();
        steps.dedup();
        Change {
            job: Some(t.job.id),
            state: Some(t.job.state),
            kinds: t.events.iter().map(|e| e.kind.as_str()).collect(),
            steps,
            submitted_by: t.job.submitted_by.clone(),
        }
    }
}

/// The broadcast behind all streams of one node, and the cap on their number.
pub struct Changes {
    tx: broadcast::Sender<Arc<Change>>,
    slots: Arc<Semaphore>,
}

impl Default for Changes {
    fn default() -> Self {
        Changes {
            tx: broadcast::channel(BUFFER).0,
            slots: Arc::new(Semaphore::new(MAX_STREAMS)),
        }
    }
}

impl Changes {
    pub fn publish(&self, change: Change) {
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(Arc::new(change));
    }
}

struct Watch {
    rx: broadcast::Receiver<Arc<Change>>,
    job: Option<JobId>,
    /// Set for a caller limited to its own jobs: the token's name.
    own: Option<String>,
    app: App,
    _slot: OwnedSemaphorePermit,
}

#[utoipa::path(get, path = "/v1/events/stream", tag = "jobs", params(("job" = Option<overseer_core::JobId>, Query, description = "Only changes of this job")), responses((status = 200, description = "Server-sent events: a small JSON per job or step change; `resync` when the client fell behind", body = String, content_type = "text/event-stream"), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = overseer_core::wire::Problem, content_type = "application/problem+json")))]
pub async fn events_stream(
    State(app): State<App>,
    own: Option<axum::Extension<crate::auth::OwnJobsOnly>>,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let job = job_filter(raw)?;
    let changes = app.notifier().changes();
    let slot = changes.slots.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too-many-streams",
            format!("this node already serves {MAX_STREAMS} event streams"),
        )
    })?;
    let watch = Watch {
        rx: changes.tx.subscribe(),
        job,
        own: own.map(|o| o.0 .0),
        app: app.clone(),
        _slot: slot,
    };
    let hello = Event::default().event("hello").data(app.node());
    let body = stream::once(async move { Ok(hello) }).chain(stream::unfold(watch, next_event));
    let sse = Sse::new(body).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)));
    Ok(sse.into_response())
}

fn job_filter(raw: Option<String>) -> Result<Option<JobId>> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(&raw.unwrap_or_default())
        .map_err(|e| ApiError::bad_request("", format!("malformed query string: {e}")))?;
    let Some((_, id)) = pairs.into_iter().find(|(k, _)| k == "job") else {
        return Ok(None);
    };
    id.parse()
        .map(Some)
        .map_err(|_| ApiError::bad_request("job", format!("`{id}` is not a job id (a UUID)")))
}

/// The next event for one client; ends the stream when the node shuts down.
async fn next_event(mut w: Watch) -> Option<(Result<Event, Infallible>, Watch)> {
    loop {
        let got = tokio::select! {
            _ = w.app.shutdown().cancelled() => return None,
            got = w.rx.recv() => got,
        };
        match got {
            Ok(change) => {
                // A job filter still passes job-less wake-ups: they may concern that job.
                if w.job.is_some() && change.job.is_some() && change.job != w.job {
                    continue;
                }
                // Someone else's job, for a caller limited to its own: not even its id.
                if w.own.is_some() && change.job.is_some() && change.submitted_by != w.own {
                    continue;
                }
                let data = serde_json::to_string(&*change).unwrap_or_default();
                return Some((Ok(Event::default().event("change").data(data)), w));
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                let ev = Event::default().event("resync").data(n.to_string());
                return Some((Ok(ev), w));
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}
