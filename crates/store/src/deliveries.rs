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
    /// Acknowledged (2xx): forget it.
    Delivered,
    /// Try again at `next_attempt_at`.
    Retry {
        next_attempt_at: Timestamp,
        error: String,
    },
    /// The attempt budget is spent: keep it as dead for inspection, never retry.
    GiveUp { error: String },
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
}
