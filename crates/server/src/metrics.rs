//! Prometheus metrics of one node, served at `GET /metrics`.
//!
//! Counters are bumped where things happen; gauges that describe the store (ready and running
//! steps per agent, deliveries waiting) are read from it when scraped, so they are right for the
//! whole cluster, not just this node.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabel {
    pub agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReportLabel {
    pub report: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushLabel {
    pub agent: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeliveryLabel {
    pub kind: String,
    pub outcome: String,
}

pub struct Metrics {
    registry: Registry,
    pub jobs_submitted: Counter,
    pub jobs_finished: Family<StateLabel, Counter>,
    pub leases_granted: Family<AgentLabel, Counter>,
    /// Claims (long-poll looks, Faktory fetches) that found nothing to lease.
    pub claims_empty: Family<AgentLabel, Counter>,
    pub leases_expired: Counter,
    pub reports: Family<ReportLabel, Counter>,
    /// `POST /v1/leases:report` calls, and the reports they carried.
    pub report_batches: Counter,
    pub reports_batched: Counter,
    pub long_polls_refused: Counter,
    pub alerts: Family<KindLabel, Counter>,
    pub deliveries: Family<DeliveryLabel, Counter>,
    pub repairs: Counter,
    pub jobs_pruned: Counter,
    pub sweeps: Counter,
    pub steps_ready: Family<AgentLabel, Gauge>,
    pub steps_running: Family<AgentLabel, Gauge>,
    pub deliveries_waiting: Gauge,
    pub deliveries_dead: Gauge,
    pub is_leader: Gauge,
    /// Requests to HTTP targets by host and outcome.
    pub http_requests: Family<PushLabel, Counter>,
    /// 1 while a host's circuit breaker is open (or half-open) on this node.
    pub http_breaker_open: Family<AgentLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("overseer");
        let m = Metrics {
            jobs_submitted: Counter::default(),
            jobs_finished: Family::default(),
            leases_granted: Family::default(),
            claims_empty: Family::default(),
            leases_expired: Counter::default(),
            reports: Family::default(),
            report_batches: Counter::default(),
            reports_batched: Counter::default(),
            long_polls_refused: Counter::default(),
            alerts: Family::default(),
            deliveries: Family::default(),
            repairs: Counter::default(),
            jobs_pruned: Counter::default(),
            sweeps: Counter::default(),
            steps_ready: Family::default(),
            steps_running: Family::default(),
            deliveries_waiting: Gauge::default(),
            deliveries_dead: Gauge::default(),
            is_leader: Gauge::default(),
            http_requests: Family::default(),
            http_breaker_open: Family::default(),
            registry: Registry::default(),
        };
        m.register_jobs_and_leases(&mut registry);
        m.register_reports(&mut registry);
        m.register_alerts_and_supervisor(&mut registry);
        m.register_store_gauges(&mut registry);
        m.register_http_targets(&mut registry);
        Metrics { registry, ..m }
    }
}

/// The registrations, by subsystem, in the order the metrics are exposed.
impl Metrics {
    /// Jobs accepted and finished; long-polls refused, leases granted, empty claims and expired
    /// leases.
    fn register_jobs_and_leases(&self, registry: &mut Registry) {
        registry.register(
            "jobs_submitted",
            "Jobs accepted by this node",
            self.jobs_submitted.clone(),
        );
        registry.register(
            "long_polls_refused",
            "Long-polls refused with 429 because the node held its limit of them",
            self.long_polls_refused.clone(),
        );
        registry.register(
            "jobs_finished",
            "Jobs that reached a terminal state, seen by this node",
            self.jobs_finished.clone(),
        );
        registry.register(
            "leases_granted",
            "Leases handed out by this node",
            self.leases_granted.clone(),
        );
        registry.register(
            "claims_empty",
            "Claims by long-polls and fetches of this node that found nothing to lease",
            self.claims_empty.clone(),
        );
        registry.register(
            "leases_expired",
            "Leases the supervisor found expired",
            self.leases_expired.clone(),
        );
    }

    /// What agents report about their attempts, and how (alone or in batches).
    fn register_reports(&self, registry: &mut Registry) {
        registry.register(
            "reports",
            "Agent reports by kind and outcome",
            self.reports.clone(),
        );
        registry.register(
            "report_batches",
            "Batch report calls (POST /v1/leases:report)",
            self.report_batches.clone(),
        );
        registry.register(
            "reports_batched",
            "Agent reports that arrived in batch report calls",
            self.reports_batched.clone(),
        );
    }

    /// Alerts and their deliveries, and the supervisor's work (repairs, pruning, sweeps).
    fn register_alerts_and_supervisor(&self, registry: &mut Registry) {
        registry.register("alerts", "Alerts raised, by kind", self.alerts.clone());
        registry.register(
            "deliveries",
            "Alert and callback delivery attempts, by outcome",
            self.deliveries.clone(),
        );
        registry.register(
            "repairs",
            "Jobs the supervisor found inconsistent and repaired",
            self.repairs.clone(),
        );
        registry.register(
            "jobs_pruned",
            "Finished jobs removed because their retention passed",
            self.jobs_pruned.clone(),
        );
        registry.register(
            "sweeps",
            "Supervisor sweeps run by this node",
            self.sweeps.clone(),
        );
    }

    /// The gauges read from the store when scraped, and this node's leadership.
    fn register_store_gauges(&self, registry: &mut Registry) {
        registry.register(
            "steps_ready",
            "Claimable steps per agent name (store-wide)",
            self.steps_ready.clone(),
        );
        registry.register(
            "steps_running",
            "Leased steps per agent name (store-wide)",
            self.steps_running.clone(),
        );
        registry.register(
            "deliveries_waiting",
            "Deliveries waiting to be sent",
            self.deliveries_waiting.clone(),
        );
        registry.register(
            "deliveries_dead",
            "Deliveries given up after their attempt budget",
            self.deliveries_dead.clone(),
        );
        registry.register(
            "is_leader",
            "1 when this node runs the supervisor",
            self.is_leader.clone(),
        );
    }

    /// The push agent's requests to HTTP targets and its circuit breakers.
    fn register_http_targets(&self, registry: &mut Registry) {
        registry.register(
            "http_requests",
            "Requests to HTTP targets by this node, by target and outcome",
            self.http_requests.clone(),
        );
        registry.register(
            "http_breaker_open",
            "1 while an HTTP target's circuit breaker is open on this node",
            self.http_breaker_open.clone(),
        );
    }
}

impl Metrics {
    pub fn report(&self, report: &str, outcome: &str) {
        self.reports
            .get_or_create(&ReportLabel {
                report: report.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
