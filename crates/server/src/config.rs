//! Server settings, validated before anything starts.

use std::net::SocketAddr;

use overseer_core::{Limits, Span};
use serde::{Deserialize, Serialize};

/// Everything a node needs to run. Built by the binary from flags, `OVERSEER_*` variables and an
/// optional TOML file; every field has a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `sqlite://PATH` or `postgres://user@host:port/database`.
    pub db: String,
    pub listen: SocketAddr,
    /// How often the supervisor sweeps when nothing wakes it earlier.
    pub sweep_interval: Span,
    /// Default long-poll wait for lease requests that name none.
    pub lease_wait_default: Span,
    /// `human` or `json`.
    pub log_format: String,
    /// Where alerts are POSTed (job blocked or failed, step poisoned). Unset: alerts are only
    /// logged (at error level) and counted in metrics.
    pub alert_webhook: Option<String>,
    /// Delivery attempts for an alert or callback before it is given up (0 = no limit).
    pub delivery_max_attempts: u32,
    /// How long one delivery attempt may take.
    pub delivery_timeout: Span,
    /// Active jobs the supervisor re-checks for consistency per sweep.
    pub repair_batch: usize,
    /// This node's name in the leader lease. Default `HOST:PORT` (host name and HTTP port):
    /// stable across restarts, so a restarted leader takes its lease back at once, and unique
    /// among live nodes, since only one process can hold a port. Nodes embedded without a
    /// listener use host name, process id and a random suffix.
    pub node_id: Option<String>,
    /// How long a leader's lease lasts without renewal; a new leader takes over within this
    /// plus one sweep after the old one dies.
    pub leader_ttl: Span,
    /// Connections to PostgreSQL per node.
    pub pool_size: usize,
    /// Once listening, write the bound address to this file (useful with port 0).
    pub ready_file: Option<std::path::PathBuf>,
    /// Also speak the Faktory work protocol on this address; off unless set.
    pub faktory_listen: Option<SocketAddr>,
    /// The password Faktory clients must prove they know. Never logged.
    pub faktory_password: Option<String>,
    /// Allow Faktory's `FLUSH` (development and tests only).
    pub faktory_allow_flush: bool,
    /// `auto` (required off loopback, off on loopback), `required` or `off` (loopback only).
    pub auth: crate::auth::Mode,
    /// An admin credential given as a setting (`OVERSEER_ADMIN_TOKEN`), never stored: the way
    /// in before any token exists. Never logged.
    pub admin_token: Option<String>,
    /// A PEM certificate chain and its private key: with both, the HTTP listener speaks HTTPS.
    pub tls_cert: Option<std::path::PathBuf>,
    pub tls_key: Option<std::path::PathBuf>,
    /// Internal networks (`10.0.0.0/8`, `127.0.0.1`) or host names that callbacks and alert
    /// webhooks may reach; everything internal is refused otherwise.
    pub outbound_allow: Vec<String>,
    /// The key deliveries are signed with: `whsec_` and base64 (24+ bytes). Every node of a
    /// cluster needs the same one. With neither this nor `webhook_secrets`, the server generates
    /// a key once and keeps it in the store (an admin reads it with `overseer webhook-secret`).
    /// Never logged; a configured key is never returned.
    pub webhook_secret: Option<String>,
    /// More keys, each signing every delivery too (after `webhook_secret`): how a key is rotated
    /// (`["whsec_new", "whsec_old"]`, then drop the old one once receivers moved).
    pub webhook_secrets: Vec<String>,
    /// HTTP connections open at once at most; more are closed as they arrive.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (slow clients are cut off).
    pub header_read_timeout: Span,
    /// Requests to HTTP targets in flight at once on this node; 0 turns the push agent off on
    /// this node (other nodes still run its steps).
    pub http_concurrency: usize,
    /// Retryable failures in a row that open a target host's circuit breaker (0 = never).
    pub http_breaker_failures: u32,
    /// How long an open breaker waits before one probe request may go.
    pub http_breaker_cool_down: Span,
    pub limits: Limits,
    /// How long finished jobs are kept, by the state they ended in (a `[retention]` table:
    /// `succeeded`, `failed`, `cancelled`); a job's own `retention` wins.
    pub retention: overseer_core::retention::Retention,
    /// Finished jobs removed per store write when their retention has passed: bounds how long
    /// one removal holds the store, so claims are never stalled behind it.
    pub retention_batch: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            db: "sqlite://overseer.db".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7433)),
            sweep_interval: Span::from_secs(1),
            lease_wait_default: Span::from_secs(20),
            log_format: "human".into(),
            alert_webhook: None,
            delivery_max_attempts: 20,
            delivery_timeout: Span::from_secs(10),
            repair_batch: 200,
            node_id: None,
            leader_ttl: Span::from_secs(10),
            pool_size: 16,
            ready_file: None,
            faktory_listen: None,
            faktory_password: None,
            faktory_allow_flush: false,
            auth: crate::auth::Mode::Auto,
            admin_token: None,
            tls_cert: None,
            tls_key: None,
            outbound_allow: Vec::new(),
            webhook_secret: None,
            webhook_secrets: Vec::new(),
            max_connections: 10_000,
            header_read_timeout: Span::from_secs(10),
            http_concurrency: 64,
            http_breaker_failures: 5,
            http_breaker_cool_down: Span::from_secs(30),
            limits: Limits::default(),
            retention: overseer_core::retention::Retention::default(),
            retention_batch: 500,
        }
    }
}

/// A setting that cannot work, named.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting `{setting}`: {message}")]
pub struct Error {
    pub setting: &'static str,
    pub message: String,
}

fn invalid(setting: &'static str, message: impl Into<String>) -> Error {
    Error {
        setting,
        message: message.into(),
    }
}

impl Config {
    /// Whether calls must carry a token: always off loopback, and on loopback when asked.
    pub fn auth_required(&self) -> bool {
        use crate::auth::Mode;
        match self.auth {
            Mode::Required => true,
            Mode::Off => false,
            Mode::Auto => !self.listen.ip().is_loopback(),
        }
    }

    /// The configured webhook keys, `webhook_secret` first, each once; empty: the server uses
    /// the one it generated and stored.
    pub fn configured_webhook_secrets(&self) -> Vec<String> {
        let mut all: Vec<String> = self.webhook_secret.iter().cloned().collect();
        for s in &self.webhook_secrets {
            if !all.contains(s) {
                all.push(s.clone());
            }
        }
        all
    }

    /// Checks the settings in a fixed order and reports the first that cannot work: access and
    /// outbound calls, HTTP serving, the store and timings, then the limits.
    pub fn validate(&self) -> Result<(), Error> {
        self.check_access()?;
        self.check_http_serving()?;
        self.check_store_and_timings()?;
        check_limits(&self.limits)
    }

    /// Who may reach this node and what it may reach: auth off loopback, the outbound policy,
    /// webhook keys, the alert webhook's target, the Faktory password, the TLS pair.
    fn check_access(&self) -> Result<(), Error> {
        if self.auth == crate::auth::Mode::Off && !self.listen.ip().is_loopback() {
            return Err(invalid(
                "auth",
                "cannot be off on a non-loopback address: anyone who reaches the port would \
                 control everything",
            ));
        }
        crate::outbound::Policy::new(&self.outbound_allow)
            .map_err(|m| invalid("outbound_allow", m))?;
        if let Some(secret) = &self.webhook_secret {
            crate::outbound::Signer::new(secret).map_err(|m| invalid("webhook_secret", m))?;
        }
        for (i, secret) in self.webhook_secrets.iter().enumerate() {
            crate::outbound::Signer::new(secret)
                .map_err(|m| invalid("webhook_secrets", format!("[{i}]: {m}")))?;
        }
        if let Some(url) = &self.alert_webhook {
            crate::outbound::Policy::new(&self.outbound_allow)
                .and_then(|p| p.check_url(url))
                .map_err(|m| invalid("alert_webhook", m))?;
        }
        let open_faktory = self.faktory_listen.is_some_and(|a| !a.ip().is_loopback());
        if open_faktory
            && self
                .faktory_password
                .as_deref()
                .unwrap_or_default()
                .is_empty()
        {
            return Err(invalid(
                "faktory_password",
                "a Faktory listener off loopback needs a password: tokens do not apply there",
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(invalid("tls_cert", "tls_cert and tls_key go together"));
        }
        Ok(())
    }

    /// Serving HTTP: the connection limit, calls to HTTP targets (concurrency and circuit
    /// breaker), the header timeout, and the admin credential.
    fn check_http_serving(&self) -> Result<(), Error> {
        if self.max_connections == 0 || self.max_connections > 1_000_000 {
            return Err(invalid("max_connections", "must be between 1 and 1000000"));
        }
        if self.http_concurrency > 10_000 {
            return Err(invalid("http_concurrency", "must be at most 10000"));
        }
        if self.http_breaker_cool_down < Span::from_millis(100) {
            return Err(invalid("http_breaker_cool_down", "must be at least 100ms"));
        }
        if self.header_read_timeout < Span::from_millis(100) {
            return Err(invalid("header_read_timeout", "must be at least 100ms"));
        }
        if self.admin_token.as_deref().is_some_and(|t| t.len() < 32) {
            return Err(invalid("admin_token", "must be at least 32 characters"));
        }
        Ok(())
    }

    /// The store URL and pool, the supervisor's timings (sweep, leader lease, repair batch), the
    /// default long-poll wait, the log format, and the delivery timeout (the alert URL is checked
    /// with the outbound policy in `check_access`).
    fn check_store_and_timings(&self) -> Result<(), Error> {
        StoreUrl::parse(&self.db).map_err(|m| invalid("db", m))?;
        if self.sweep_interval < Span::from_millis(10) || self.sweep_interval > Span::from_secs(60)
        {
            return Err(invalid("sweep_interval", "must be between 10ms and 60s"));
        }
        if self.lease_wait_default > self.limits.wait_max {
            return Err(invalid(
                "lease_wait_default",
                "must not exceed limits.wait_max",
            ));
        }
        if !matches!(self.log_format.as_str(), "human" | "json") {
            return Err(invalid("log_format", "must be `human` or `json`"));
        }
        if self.delivery_timeout < Span::from_millis(100)
            || self.delivery_timeout > Span::from_secs(300)
        {
            return Err(invalid("delivery_timeout", "must be between 100ms and 5m"));
        }
        if self.leader_ttl < self.sweep_interval.plus_span(self.sweep_interval) {
            return Err(invalid(
                "leader_ttl",
                "must be at least two sweep intervals, so the leader can renew in time",
            ));
        }
        if self.pool_size == 0 || self.pool_size > 1000 {
            return Err(invalid("pool_size", "must be between 1 and 1000"));
        }
        if self.repair_batch == 0 || self.repair_batch > 10_000 {
            return Err(invalid("repair_batch", "must be between 1 and 10000"));
        }
        Ok(())
    }
}

/// The limits that must be above 0, and the payload limit within the body limit.
fn check_limits(l: &Limits) -> Result<(), Error> {
    let positive = [
        ("limits.body_bytes", l.body_bytes),
        ("limits.payload_bytes", l.payload_bytes),
        ("limits.result_bytes", l.result_bytes),
        ("limits.error_bytes", l.error_bytes),
        ("limits.progress_bytes", l.progress_bytes),
        ("limits.steps_per_job", l.steps_per_job),
        ("limits.jobs_per_batch", l.jobs_per_batch),
        ("limits.history_per_job", l.history_per_job),
        ("limits.name_bytes", l.name_bytes),
        ("limits.leases_per_call", l.leases_per_call),
        ("limits.long_polls", l.long_polls),
        ("limits.long_polls_per_token", l.long_polls_per_token),
    ];
    for (name, value) in positive {
        if value == 0 {
            return Err(Error {
                setting: name,
                message: "must be greater than 0".into(),
            });
        }
    }
    if l.payload_bytes > l.body_bytes {
        return Err(invalid(
            "limits.payload_bytes",
            "must not exceed limits.body_bytes",
        ));
    }
    Ok(())
}

/// Which store a `db` URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

impl StoreUrl {
    pub fn parse(url: &str) -> Result<StoreUrl, String> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err("sqlite:// needs a file path, e.g. sqlite://overseer.db".into());
            }
            Ok(StoreUrl::Sqlite(path.into()))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(url.to_string()))
        } else {
            Err(format!(
                "`{url}` is not a store URL (expected sqlite://PATH or postgres://…)"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Config;

    fn alert(url: &str) -> Result<(), String> {
        let config = Config {
            alert_webhook: Some(url.into()),
            ..Config::default()
        };
        config.validate().map_err(|e| e.to_string())
    }

    #[test]
    fn an_alert_webhook_is_an_http_url_outside_the_internal_network() {
        assert_eq!(alert("https://alerts.example.com/hook"), Ok(()));
        assert_eq!(alert("HTTP://alerts.example.com/hook"), Ok(()));
        for bad in [
            "ftp://alerts.example.com/hook",
            "alerts.example.com",
            "http://10.0.0.7/a",
        ] {
            let err = alert(bad).expect_err(bad);
            assert!(err.contains("alert_webhook"), "{bad}: {err}");
        }
    }
}
