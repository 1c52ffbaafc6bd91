//! The outbox: deliveries recorded by transitions (see `writes`), listed when due and updated
//! after each attempt.

use super::{rows, PgStore};
use crate::{Deliveries, Delivery, DeliveryCounts, DeliveryOutcome, Due, Result};

#[async_trait::async_trait]
impl Deliveries for PgStore {
    async fn deliveries_due(&self, due: Due) -> Result<Vec<Delivery>> {
        if due.limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |tx, _| Box::pin(rows::deliveries_due(tx, due.now, due.limit)))
            .await
    }

    async fn delivery_update(&self, id: i64, outcome: DeliveryOutcome) -> Result<()> {
        let outcome = &outcome;
        self.write(move |tx, _| Box::pin(rows::delivery_update(tx, id, outcome)))
            .await
    }

    async fn deliveries_counts(&self) -> Result<DeliveryCounts> {
        self.read(|tx, _| Box::pin(rows::deliveries_counts(tx)))
            .await
    }
}
