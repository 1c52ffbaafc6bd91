//! The outbox: deliveries recorded by transitions (see `rows::insert_deliveries`), listed when
//! due and updated after each attempt.

use super::{rows, SqliteStore};
use crate::{Deliveries, Delivery, DeliveryCounts, DeliveryOutcome, Due, Result};

#[async_trait::async_trait]
impl Deliveries for SqliteStore {
    async fn deliveries_due(&self, due: Due) -> Result<Vec<Delivery>> {
        if due.limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| rows::deliveries_due(conn, due.now, due.limit))
            .await
    }

    async fn delivery_update(&self, id: i64, outcome: DeliveryOutcome) -> Result<()> {
        self.write(move |conn| rows::delivery_update(conn, id, &outcome))
            .await
    }

    async fn deliveries_counts(&self) -> Result<DeliveryCounts> {
        self.read(rows::deliveries_counts).await
    }
}
