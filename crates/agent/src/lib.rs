//! Overseer's agent side: the HTTP [`Client`], the agent SDK ([`Worker`]) and the command
//! agent ([`command::CommandAgent`]) built on it.
//!
//! A worker long-polls for leases, runs a handler per lease, heartbeats every third of the
//! step's timeout, and reports `complete` or `fail`. It keeps each lease's deadline on its own
//! monotonic clock, counted from when it sent the request that granted or renewed the lease,
//! and never reports past that deadline: see [`worker`] for the details.
//!
//! ```no_run
//! use overseer_agent::{Client, StepContext, StepError, Worker};
//! use serde_json::json;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7433", None)?;
//! let worker = Worker::builder(client)
//!     .worker_id("host-123")
//!     .handler("provision", |ctx: StepContext| async move {
//!         let size = ctx.payload()["size"].as_u64().ok_or_else(|| StepError::fatal("no size"))?;
//!         Ok(json!({ "provisioned": size, "key": ctx.idempotency_key() }))
//!     })
//!     .concurrency(4)
//!     .build()?;
//! worker.run(CancellationToken::new()).await;
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod command;
mod reports;
pub mod worker;

pub use client::Client;
pub use command::CommandAgent;
pub use worker::{Handler, StepContext, StepError, Worker};
