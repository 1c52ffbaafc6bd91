//! The outbox: alerts and callbacks recorded with the transitions that raised them, delivered
//! later with retries.

use async_trait::async_trait;
use overseer_core::{JobId, Timestamp};

use crate::jobs::Due;
use crate::Result;

/// A recorded alert or callback waiting to be delivered.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub id: i64,
    pub kind: overseer_core::outbox::DeliveryKind,
    pub job_id: JobId,
    pub url: Option<String>,
    pub idempotency_key: String,
    pub body: serde_json::Value,
    /// Delivery attempts made so far.
    pub attempts: u32,
    pub created_at: Timestamp,
    pub next_attempt_at: Timestamp,
    pub last_error: Option<String>,
}

/// How a delivery attempt went.
#[derive(Clone, Debug, PartialEq)]
pub enum DeliveryOutcome {
    /// Acknowledged (2xx) at `at`: never sent again; kept, marked delivered, for
    /// [`Deliveries::alerts_recent`] until [`DELIVERED_KEPT`] has passed.
    Delivered { at: Timestamp },
    /// Try again at `next_attempt_at`.
    Retry {
        next_attempt_at: Timestamp,
        error: String,
    },
    /// The attempt budget is spent: keep it as dead for inspection, never retry.
    GiveUp { error: String },
}

/// How long a delivered alert or callback is kept for [`Deliveries::alerts_recent`]: each
/// `Delivered` outcome also deletes a few rows delivered longer ago than this.
pub const DELIVERED_KEPT: overseer_core::Span = overseer_core::Span::from_secs(7 * 24 * 3600);

/// A recorded delivery with how it stands, as [`Deliveries::alerts_recent`] lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeliveryRecord {
    pub delivery: Delivery,
    /// When it was acknowledged; `None` while still being tried, or given up.
    pub delivered_at: Option<Timestamp>,
    /// Its attempt budget is spent: it will not be tried again.
    pub dead: bool,
}

/// Deliveries waiting and given up, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    pub waiting: u64,
    pub dead: u64,
}

/// The outbox.
#[async_trait]
pub trait Deliveries: Send + Sync {
    /// Deliveries (alerts, callbacks) due at `now`, oldest due first. Every transition's
    /// durable effects (`Effect::is_durable`) are recorded by the writes that commit
    /// transitions, in the same transaction, as `overseer_core::outbox::outgoing` describes.
    async fn deliveries_due(&self, due: Due) -> Result<Vec<Delivery>>;

    /// Records how a delivery attempt went (counts the attempt).
    async fn delivery_update(&self, id: i64, outcome: DeliveryOutcome) -> Result<()>;

    async fn deliveries_counts(&self) -> Result<DeliveryCounts>;

    /// The newest `limit` alert deliveries, newest first, delivered, waiting or given up
    /// (delivered ones are kept for [`DELIVERED_KEPT`]).
    async fn alerts_recent(&self, limit: usize) -> Result<Vec<DeliveryRecord>>;
}
