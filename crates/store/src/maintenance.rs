//! What keeps a store and its nodes running: health, the supervisor's next wake-up, and the
//! signals nodes sharing a store send each other.

use async_trait::async_trait;
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

/// Health and timing.
#[async_trait]
pub trait Maintenance: Send + Sync {
    /// Whether the store answers at all (for `/readyz`).
    async fn ping(&self) -> Result<()>;

    /// The earliest instant at which the supervisor has something to do: a pending `run_at` of an
    /// unkeyed job (even past: the sweep clears it), a keyed or retrying step's time only when in
    /// the future (a keyed job behind its head, or a due retry, must not make it spin), any
    /// lease expiry, and any unpaused schedule's `next_fire_at`. Lets it sleep exactly until then.
    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>>;

    /// Cross-node wake-ups, for backends shared by several nodes.
    fn signals(&self) -> Option<tokio::sync::broadcast::Receiver<Signal>> {
        None
    }
}
