//! Notifications that must leave the system: alerts for humans and callbacks to clients.
//!
//! A transition that raises one carries it as an effect; the store records it in the same
//! transaction as the transition (so it is never lost, even if the process dies right after), and
//! the server delivers it later with retries. This module turns effects into the records to store.

use serde_json::{json, Value};

use crate::job::Job;
use crate::machine::{Effect, Transition};
use crate::time::Timestamp;
use crate::wire::JobView;

/// What kind of delivery a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryKind {
    /// To the operator's alert webhook (from the server's settings).
    Alert,
    /// To the job's `callback_url`.
    Callback,
}

impl DeliveryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryKind::Alert => "alert",
            DeliveryKind::Callback => "callback",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "alert" => Some(DeliveryKind::Alert),
            "callback" => Some(DeliveryKind::Callback),
            _ => None,
        }
    }
}

/// A delivery to record with a transition.
#[derive(Clone, Debug, PartialEq)]
pub struct Outgoing {
    pub kind: DeliveryKind,
    /// The callback URL; alerts go to whatever webhook is configured at delivery time.
    pub url: Option<String>,
    /// Sent as the `Idempotency-Key` header and in the body: the same on every retry.
    pub idempotency_key: String,
    pub body: Value,
}

/// The deliveries a committed transition calls for.
pub fn outgoing(t: &Transition, now: Timestamp) -> Vec<Outgoing> {
    let job: &Job = &t.job;
    let mut out = Vec::new();
    for (n, effect) in t.effects.iter().enumerate() {
        match effect {
            Effect::Alert {
                kind,
                step,
                message,
            } => {
                let key = format!(
                    "{}/alert/{kind}/{}/{}/{n}",
                    job.id,
                    step.as_deref().unwrap_or("-"),
                    now.as_millis()
                );
                out.push(Outgoing {
                    kind: DeliveryKind::Alert,
                    url: None,
                    body: json!({
                        "idempotency_key": key,
                        "kind": kind,
                        "job_id": job.id,
                        "step": step,
                        "message": message,
                        "job_state": job.state,
                        "labels": job.labels,
                        "at": now,
                    }),
                    idempotency_key: key,
                });
            }
            Effect::Callback { state } => {
                let key = format!("{}/callback/{state}", job.id);
                out.push(Outgoing {
                    kind: DeliveryKind::Callback,
                    url: job.callback_url.clone(),
                    body: json!({
                        "idempotency_key": key,
                        "job_id": job.id,
                        "state": state,
                        "job": JobView::from(job),
                    }),
                    idempotency_key: key,
                });
            }
            _ => {}
        }
    }
    out
}
