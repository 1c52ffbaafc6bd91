//! The leader lease: which node runs the supervisor, and the fence its writes carry.

use async_trait::async_trait;
use overseer_core::{Span, Timestamp};

use crate::Result;

/// Proof that a node holds the leader lease: every write of the supervisor carries it, and the
/// store refuses it ([`crate::Error::Fenced`]) once another node has taken over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub node: String,
    pub epoch: i64,
}

/// The leader lease as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub node: String,
    /// Grows by one each time the lease changes hands.
    pub epoch: i64,
    pub expires_at: Timestamp,
}

impl Leadership {
    /// The fence of this lease, for the holder's writes.
    pub fn fence(&self) -> Fence {
        Fence {
            node: self.node.clone(),
            epoch: self.epoch,
        }
    }
}

/// A node asking for the leader lease at `now`, to hold it for `ttl`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderBid {
    pub node: String,
    pub ttl: Span,
    pub now: Timestamp,
}

/// The leader lease.
#[async_trait]
pub trait Leader: Send + Sync {
    /// Takes the leader lease for the bidding node if it is free or expired (epoch + 1), or
    /// renews it if that node holds it (same epoch, new expiry). Returns the lease if the node
    /// holds it afterwards.
    async fn leader_acquire(&self, bid: LeaderBid) -> Result<Option<Leadership>>;

    /// The current leader lease, expired or not.
    async fn leader_get(&self) -> Result<Option<Leadership>>;

    /// Gives the lease up at once (on shutdown), if the fence still holds it.
    async fn leader_release(&self, fence: &Fence) -> Result<()>;
}
