//! Health, the supervisor's next wake-up, and the signals other nodes send (`listen`).

use overseer_core::Timestamp;
use tokio::sync::broadcast;

use super::rows::query_one;
use super::{jobs, PgStore};
use crate::{Maintenance, Result, Signal};

#[async_trait::async_trait]
impl Maintenance for PgStore {
    async fn ping(&self) -> Result<()> {
        self.read(|tx, _| {
            Box::pin(async move {
                query_one(tx, "SELECT 1", &[]).await?;
                Ok(())
            })
        })
        .await
    }

    async fn next_due_at(&self, now: Timestamp) -> Result<Option<Timestamp>> {
        self.read(move |tx, _| Box::pin(jobs::next_due_at(tx, now)))
            .await
    }

    fn signals(&self) -> Option<broadcast::Receiver<Signal>> {
        Some(self.inner.signals.subscribe())
    }
}
