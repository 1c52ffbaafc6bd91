//! What keeps a store and its nodes running: health, the supervisor's next wake-up, and the
//! signals nodes sharing a store send each other.

use async_trait::async_trait;
use overseer_core::retention::Retention;
use overseer_core::{JobId, Timestamp};

use crate::Result;

/// What a node that shares its store with other nodes hears from them: things they committed
/// that should wake something here. Backends used by one node only have none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Steps of this agent name became claimable (or an agent was resumed).
    Ready { agent: String },
    /// A job reached a terminal state.
    Finished { job: JobId },
    /// Something becomes due at this instant (a retry, a delayed job): the leader should sweep.
    Due { at: Timestamp },
}

/// Removing finished jobs kept long enough, at most `limit` of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prune {
    pub now: Timestamp,
    pub retention: Retention,
    pub limit: usize,
}

/// What one [`Maintenance::jobs_prune`] removed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pruned {
    /// The jobs deleted.
    pub ids: Vec<JobId>,
    /// More may be due: the batch was full, or the store stopped early to let other writes go
    /// first. The caller should come back soon rather than wait for its next round.
    pub more: bool,
}

/// Health, timing and upkeep.
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Whether the store answers at all (for `/readyz`).
    async fn ping(&self) -> Result<()>;

    /// The earliest instant at which the supervisor has something to do: a pending `run_at` of an
    /// unkeyed job (even past: the sweep clears it), a keyed or retrying step's time only when in
    /// the future (a keyed job behind its head, or a due retry, must not make it spin), any
    /// lease expiry, and any unpaused schedule's `next_fire_at`. Lets it sleep exactly until then.
    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>>;

    /// Deletes up to `limit` finished jobs whose retention has passed at `now` (by the core's
    /// [`Retention`] rule: the job's own retention, else the default for the state it ended
    /// in), with their steps, labels, history, lease records and settled deliveries (a delivery
    /// still being tried stays until it is delivered or given up). Answers the ids deleted. An
    /// unfinished job is never touched; an idempotency key is free again once its job is gone.
    /// A store may stop before `limit` so that claims and reports waiting behind the removal go
    /// first; it then says there is [`Pruned::more`].
    async fn jobs_prune(&self, prune: Prune) -> Result<Pruned>;

    /// Cross-node wake-ups, for backends shared by several nodes.
    fn signals(&self) -> Option<tokio::sync::broadcast::Receiver<Signal>> {
        None
    }
}
