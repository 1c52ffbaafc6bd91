//! What a handler gets and answers: the [`StepContext`] of one attempt, the [`StepError`] it
//! fails with, and the [`Handler`] trait every async function of the right shape implements.

use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use overseer_core::wire::Lease;
use overseer_core::{JobId, LeaseId};
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// How a handler says an attempt failed: whether trying again may help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepError {
    pub message: String,
    /// `false` fails the step permanently, whatever attempts it has left.
    pub retryable: bool,
}

impl StepError {
    /// A failure worth another attempt (after the step's backoff): a timeout, a 503, a lock.
    pub fn retryable(message: impl Into<String>) -> Self {
        StepError {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure no retry will fix: bad input, a refused request, a missing resource.
    pub fn fatal(message: impl Into<String>) -> Self {
        StepError {
            message: message.into(),
            retryable: false,
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.retryable { "retryable" } else { "fatal" };
        write!(f, "{} ({kind})", self.message)
    }
}

impl std::error::Error for StepError {}

/// What a handler gets for one attempt of one step.
#[derive(Clone, Debug)]
pub struct StepContext {
    pub(super) lease: Arc<Lease>,
    pub(super) worker: Arc<str>,
    pub(super) cancel: CancellationToken,
    pub(super) deadline: watch::Receiver<Instant>,
    pub(super) progress: Arc<Mutex<Option<Value>>>,
}

impl StepContext {
    /// The whole lease as the server granted it.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn lease_id(&self) -> LeaseId {
        self.lease.lease_id
    }

    pub fn job_id(&self) -> JobId {
        self.lease.job_id
    }

    pub fn step(&self) -> &str {
        &self.lease.step
    }

    /// The attempt number, from 1; it increases at every lease of the step.
    pub fn attempt(&self) -> u32 {
        self.lease.attempt
    }

    pub fn payload(&self) -> &Value {
        &self.lease.payload
    }

    /// Each dependency's result, by dependency name.
    pub fn inputs(&self) -> &serde_json::Map<String, Value> {
        &self.lease.inputs
    }

    /// `{job_id}/{step}`: the same on every attempt, for remote services to deduplicate by.
    pub fn idempotency_key(&self) -> &str {
        &self.lease.idempotency_key
    }

    /// This worker's id as the server records it.
    pub fn worker_id(&self) -> &str {
        &self.worker
    }

    /// Resolves when the server asks this attempt to stop because its job is being cancelled.
    /// A handler that watches it may wind down within the worker's cancel grace; one that does
    /// not is dropped when the grace ends.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The cancellation signal as a token, to hand to code that takes one.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// The local deadline as it stands now; heartbeats move it later. When it passes, the
    /// handler is dropped. Useful to bound calls to remote services.
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Sets the progress the next heartbeat carries to the server (any JSON, at most the
    /// server's `limits.progress_bytes`, 4 KiB by default, encoded). It is sent once, with the
    /// next regular heartbeat (again with the one after if that one fails); a newer value set
    /// before then replaces it. The server keeps the last one on the step (`progress` in
    /// `GET /v1/jobs/{id}`), and records it in the job's history only for a step submitted with
    /// `progress_events: true`.
    pub fn set_progress(&self, progress: Value) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = Some(progress);
    }
}

/// Runs one attempt of a step. Implemented for every
/// `Fn(StepContext) -> impl Future<Output = Result<Value, StepError>>`.
pub trait Handler: Send + Sync + 'static {
    fn call(&self, ctx: StepContext) -> BoxFuture<'static, Result<Value, StepError>>;
}

impl<F, Fut> Handler for F
where
    F: Fn(StepContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, StepError>> + Send + 'static,
{
    fn call(&self, ctx: StepContext) -> BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(self(ctx))
    }
}
