//! Operations: counts by state, alerts delivered, and Prometheus metrics.

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use overseer_core::wire::{AlertDelivery, AlertList, AlertView, Problem, StatsView};
use overseer_store::DeliveryCounts;

use super::query_pairs;
use crate::error::{ApiError, Result};
use crate::App;

/// Counts for dashboards, read from indexes: cheap however many jobs are stored.
#[utoipa::path(get, path = "/v1/stats", tag = "operations", responses((status = 200, description = "Jobs per state, and jobs finished per minute (succeeded, failed, cancelled) over the last hour", body = StatsView), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn stats(State(app): State<App>) -> Result<Json<StatsView>> {
    let now = app.now();
    let (since, until) = StatsView::window(now);
    let store = app.store();
    let (by_state, finished) = tokio::try_join!(
        store.jobs_count_by_state(),
        store.jobs_finished_per_minute(overseer_store::Window { since, until })
    )?;
    let by_state: Vec<_> = by_state.iter().map(|c| (c.state, c.count)).collect();
    let finished: Vec<_> = finished
        .iter()
        .map(|c| (c.minute, c.state, c.count))
        .collect();
    Ok(Json(StatsView::build(now, &by_state, &finished)))
}

const ALERTS_LIMIT_DEFAULT: usize = 50;
const ALERTS_LIMIT_MAX: usize = 200;

/// Alerts raised recently, from the outbox: delivered ones are kept a week.
#[utoipa::path(get, path = "/v1/alerts", tag = "operations", params(("limit" = Option<u32>, Query, description = "1 to 200, default 50", minimum = 1, maximum = 200)), responses((status = 200, description = "The newest alerts first, each with how its delivery stands", body = AlertList), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn alerts(
    State(app): State<App>,
    RawQuery(raw): RawQuery,
) -> Result<Json<AlertList>> {
    let mut limit = ALERTS_LIMIT_DEFAULT;
    for (key, value) in query_pairs(raw)? {
        match key.as_str() {
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=ALERTS_LIMIT_MAX).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "limit",
                            format!("limit must be between 1 and {ALERTS_LIMIT_MAX}"),
                        )
                    })?
            }
            other => {
                return Err(ApiError::bad_request(
                    other,
                    format!("unknown query parameter `{other}`"),
                ))
            }
        }
    }
    let records = app.store().alerts_recent(limit).await?;
    let alerts = records.iter().map(alert_view).collect();
    Ok(Json(AlertList {
        alerts,
        webhook: app.has_alert_webhook(),
    }))
}

fn alert_view(r: &overseer_store::DeliveryRecord) -> AlertView {
    let d = &r.delivery;
    let text = |field: &str| d.body[field].as_str().map(str::to_string);
    AlertView {
        kind: text("kind").unwrap_or_default(),
        job_id: d.job_id,
        step: text("step"),
        message: text("message").unwrap_or_default(),
        created_at: d.created_at,
        delivery: match (r.delivered_at, r.dead) {
            (Some(_), _) => AlertDelivery::Delivered,
            (None, true) => AlertDelivery::GivenUp,
            (None, false) => AlertDelivery::Waiting,
        },
        attempts: d.attempts,
        delivered_at: r.delivered_at,
        last_error: d.last_error.clone(),
    }
}

/// Prometheus text; store-wide gauges are read at scrape time.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text", body = String, content_type = "application/openmetrics-text"), (status = "default", description = "A problem: 400 invalid request (`field` names it), 401/403 auth, 404 not found, 409 conflict, 413 too large, 429 too many, 503 store unavailable (retry)", body = Problem, content_type = "application/problem+json")))]
pub(super) async fn metrics(State(app): State<App>) -> Result<Response> {
    let m = app.metrics();
    let counts = app.store().agents_counts().await?;
    m.steps_ready.clear();
    m.steps_running.clear();
    for c in counts {
        let label = crate::metrics::AgentLabel { agent: c.agent };
        m.steps_ready.get_or_create(&label).set(c.ready as i64);
        m.steps_running.get_or_create(&label).set(c.running as i64);
    }
    let DeliveryCounts { waiting, dead } = app.store().deliveries_counts().await?;
    m.deliveries_waiting.set(waiting as i64);
    m.deliveries_dead.set(dead as i64);
    let text = m.encode().map_err(|_| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "cannot encode metrics",
        )
    })?;
    let mut res = text.into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(res)
}
