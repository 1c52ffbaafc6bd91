//! Agent names: what each has ready and running, and the limits on handing out its leases.

use async_trait::async_trait;
use overseer_core::Timestamp;

use crate::Result;

/// Limits on handing out one agent name's leases, across all workers and nodes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AgentSettings {
    /// Leases in flight at most (work and undo leases held by this agent name).
    pub max_concurrency: Option<u32>,
    /// Leases started per second at most (a token bucket holding one second's worth).
    pub rate: Option<f64>,
    /// No new leases at all while paused; running ones are untouched.
    pub paused: bool,
}

/// One agent name's settings, as listed.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentLimits {
    pub agent: String,
    pub settings: AgentSettings,
}

/// A change of one agent name's settings at `now` (all of them: what is not set is cleared).
#[derive(Clone, Debug, PartialEq)]
pub struct SettingsUpdate {
    pub agent: String,
    pub settings: AgentSettings,
    pub now: Timestamp,
}

/// Ready and running counts of one agent name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCounts {
    pub agent: String,
    pub ready: u64,
    pub running: u64,
}

/// How many steps one agent name could be handed right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentReady {
    pub agent: String,
    pub ready: u64,
}

/// The instants `(after, until]`: retries whose backoff ended in that window.
#[derive(Clone, Copy, Debug)]
pub struct DueBetween {
    pub after: Timestamp,
    pub until: Timestamp,
}

/// Agent names and their limits.
#[async_trait]
pub trait Agents: Send + Sync {
    /// Per agent name, for unfinished jobs: `ready` counts claimable steps by the agent that may
    /// claim them (due or not), `running` counts leased steps by the agent holding the lease (the
    /// compensate agent for an undo). Agents with neither are left out; sorted by name.
    async fn agents_counts(&self) -> Result<Vec<AgentCounts>>;

    /// Per agent name, the claimable steps of unfinished jobs (by `Step::claim_agent()`) whose
    /// `next_attempt_at` has come at `now`: what the agent could be handed right now, its
    /// limits and pause aside (unlike [`Agents::agents_counts`], retries still waiting out their
    /// backoff are left out). Agents with none are left out; sorted by name.
    async fn agents_ready_now(&self, now: Timestamp) -> Result<Vec<AgentReady>>;

    /// Agent names with a claimable step (by `Step::claim_agent()`: ready work, or a ready undo
    /// under its compensate agent) that waited past its readiness (`Step::waits_past_ready`) and
    /// whose `next_attempt_at` lies in the window: retries whose backoff just ended, so their
    /// long-polls can be woken. Work claimable the moment it became ready is not named: the
    /// transition that made it ready woke its agent.
    async fn agents_due(&self, window: DueBetween) -> Result<Vec<String>>;

    async fn agent_settings_get(&self, agent: &str) -> Result<AgentSettings>;

    async fn agent_settings_put(&self, update: SettingsUpdate) -> Result<AgentSettings>;

    /// Every agent name with non-default settings, sorted by name.
    async fn agent_settings_list(&self) -> Result<Vec<AgentLimits>>;
}
