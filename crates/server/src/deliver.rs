//! Delivers recorded alerts and callbacks: POSTs each to its URL until acknowledged (2xx), with
//! backoff between attempts, up to an attempt budget. Records live in the store (written with
//! the transition that raised them), so a crash loses none; this loop runs beside the scheduler
//! and never blocks it.

use overseer_core::backoff::Backoff;
use overseer_core::outbox::DeliveryKind;
use overseer_core::Span;
use overseer_store::{Delivery, DeliveryOutcome, Due};
use tokio_util::sync::CancellationToken;

use crate::metrics::DeliveryLabel;
use crate::App;

/// How deliveries are made.
#[derive(Clone, Debug)]
pub struct Settings {
    pub alert_webhook: Option<String>,
    /// Signs every delivery (Standard Webhooks headers); none: unsigned.
    pub signer: Option<crate::outbound::Signer>,
    pub max_attempts: u32,
    pub timeout: Span,
    pub backoff: Backoff,
    pub poll: Span,
}

impl Settings {
    pub fn from_config(config: &crate::Config) -> Self {
        Settings {
            alert_webhook: config.alert_webhook.clone(),
            // Checked by `Config::validate`. With none configured, `serve` adds the generated one.
            signer: crate::outbound::Signer::with_secrets(&config.configured_webhook_secrets())
                .ok(),
            max_attempts: config.delivery_max_attempts,
            timeout: config.delivery_timeout,
            backoff: Backoff {
                initial: Span::from_secs(1),
                factor: 2.0,
                max: Span::from_secs(300),
            },
            poll: Span::from_secs(1),
        }
    }
}

pub struct Deliverer {
    app: App,
    settings: Settings,
    http: reqwest::Client,
}

const BATCH: usize = 32;

impl Deliverer {
    pub fn new(app: App, settings: Settings) -> anyhow::Result<Self> {
        let http = crate::outbound::client(app.outbound().clone(), settings.timeout.as_std())?;
        if settings.signer.is_none() {
            tracing::warn!("no webhook secret: callbacks and alert webhooks go unsigned");
        }
        Ok(Deliverer {
            app,
            settings,
            http,
        })
    }

    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.deliver_due().await {
                Ok(n) if n == BATCH => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read deliveries; will retry"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.settings.poll.as_std()) => {}
                _ = self.app.notifier().delivery_wake().notified() => {}
            }
        }
    }

    /// Attempts every delivery due now, a few at a time; returns how many it tried.
    pub async fn deliver_due(&self) -> Result<usize, overseer_store::Error> {
        let due = self
            .app
            .store()
            .deliveries_due(Due {
                now: self.app.now(),
                limit: BATCH,
            })
            .await?;
        let n = due.len();
        let attempts = due.into_iter().map(|d| async move {
            let outcome = self.attempt(&d).await;
            let label = match &outcome {
                DeliveryOutcome::Delivered => "delivered",
                DeliveryOutcome::Retry { .. } => "retry",
                DeliveryOutcome::GiveUp { .. } => "gave_up",
            };
            self.app
                .metrics()
                .deliveries
                .get_or_create(&DeliveryLabel {
                    kind: d.kind.as_str().to_string(),
                    outcome: label.to_string(),
                })
                .inc();
            if let DeliveryOutcome::GiveUp { error } = &outcome {
                tracing::error!(kind = d.kind.as_str(), job = %d.job_id, attempts = d.attempts + 1, %error, "delivery given up");
            }
            if let Err(e) = self.app.store().delivery_update(d.id, outcome).await {
                tracing::warn!(error = %e, id = d.id, "cannot record a delivery attempt");
            }
        });
        futures::future::join_all(attempts).await;
        Ok(n)
    }

    /// POSTs one delivery, signed when a secret is set. The error names its cause down to the
    /// root (e.g. a name that resolves only to internal addresses).
    async fn send(&self, url: &str, d: &Delivery) -> Result<reqwest::Response, String> {
        let body = serde_json::to_vec(&d.body).map_err(|e| e.to_string())?;
        let mut req = self
            .http
            .post(url)
            .header("Idempotency-Key", &d.idempotency_key)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(signer) = &self.settings.signer {
            let timestamp = self.app.now().as_millis() / 1000;
            req = req
                .header("webhook-id", &d.idempotency_key)
                .header("webhook-timestamp", timestamp.to_string())
                .header(
                    "webhook-signature",
                    signer.sign(&d.idempotency_key, timestamp, &body),
                );
        }
        req.body(body).send().await.map_err(|e| {
            let mut cause: &dyn std::error::Error = &e;
            let mut text = e.to_string();
            while let Some(next) = cause.source() {
                text = format!("{text}: {next}");
                cause = next;
            }
            text
        })
    }

    async fn attempt(&self, d: &Delivery) -> DeliveryOutcome {
        let url = match d.kind {
            DeliveryKind::Callback => d.url.clone(),
            DeliveryKind::Alert => self.settings.alert_webhook.clone(),
        };
        let Some(url) = url else {
            // No webhook configured: the alert was logged and counted when raised; nothing to send.
            return DeliveryOutcome::Delivered;
        };
        let sent = match self.app.outbound().check_url(&url) {
            Ok(()) => self.send(&url, d).await,
            Err(refused) => Err(refused),
        };
        let error = match sent {
            Ok(res) if res.status().is_success() => {
                tracing::info!(kind = d.kind.as_str(), job = %d.job_id, %url, "delivered");
                return DeliveryOutcome::Delivered;
            }
            Ok(res) => format!("{url} answered {}", res.status()),
            Err(e) => format!("{url}: {e}"),
        };
        let attempts = d.attempts + 1;
        if self.settings.max_attempts != 0 && attempts >= self.settings.max_attempts {
            return DeliveryOutcome::GiveUp { error };
        }
        let delay = self.settings.backoff.delay(attempts, self.app.jitter());
        tracing::warn!(kind = d.kind.as_str(), job = %d.job_id, attempts, %error, retry_in = %delay, "delivery failed");
        DeliveryOutcome::Retry {
            next_attempt_at: self.app.now().plus(delay),
            error,
        }
    }
}
