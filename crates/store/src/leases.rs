//! Steps and their leases: claiming ready steps, resolving lease ids, finding expired leases,
//! and applying what lease holders report.

use async_trait::async_trait;
use overseer_core::{Command, Job, JobId, LeaseId, Timestamp, Transition};

use crate::jobs::{Apply, Due, Jobs};
use crate::{Error, Result};

/// A claim for up to `offers.len()` ready steps of one agent name, on behalf of one worker or of
/// several whose requests a node merged into one claim.
#[derive(Clone, Debug)]
pub struct Claim {
    pub agent: String,
    /// The leases that may be handed out, in order: the n-th step leased takes the n-th offer.
    /// Its length is the claim's maximum.
    pub offers: Vec<Offer>,
    pub now: Timestamp,
}

/// One lease a claim may hand out: a fresh id, and the worker that will hold it.
#[derive(Clone, Debug)]
pub struct Offer {
    pub lease_id: LeaseId,
    pub worker: String,
}

impl Claim {
    /// A claim of one worker for up to `lease_ids.len()` steps.
    pub fn of_worker(agent: &str, worker: &str, lease_ids: Vec<LeaseId>, now: Timestamp) -> Claim {
        let offers = lease_ids
            .into_iter()
            .map(|lease_id| Offer {
                lease_id,
                worker: worker.to_string(),
            })
            .collect();
        Claim {
            agent: agent.to_string(),
            offers,
            now,
        }
    }

    /// The most steps this claim may lease.
    pub fn max(&self) -> usize {
        self.offers.len()
    }
}

/// A step that was leased by a claim: its index and the committed transition (whose `job` is
/// the job as it now stands, with the step `running` under the new lease).
#[derive(Clone, Debug)]
pub struct Claimed {
    pub step: usize,
    pub transition: Transition,
}

/// The outcome of a claim.
#[derive(Clone, Debug, Default)]
pub struct ClaimResult {
    pub claimed: Vec<Claimed>,
    /// Set when the agent's rate limit held leases back: the instant the next one may start.
    pub throttled_until: Option<Timestamp>,
}

/// Which attempt of which step a lease id stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRef {
    pub lease_id: LeaseId,
    pub job_id: JobId,
    pub step: usize,
    pub attempt: u32,
}

impl LeaseRef {
    /// The lease step `step` of `job` holds now, if it holds one.
    pub fn held(job: &Job, step: usize) -> Option<LeaseRef> {
        let s = job.steps.get(step)?;
        Some(LeaseRef {
            lease_id: s.lease_id?,
            job_id: job.id,
            step,
            attempt: s.attempt,
        })
    }
}

/// What the holder of a lease reports.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseReport {
    Complete {
        result: serde_json::Value,
    },
    /// `jitter` in `[0, 1)` spreads a retry, as in [`Command::Fail`].
    Fail {
        error: String,
        retryable: bool,
        jitter: f64,
    },
}

impl LeaseReport {
    /// The command this report is for the attempt a lease stands for.
    pub fn command(self, step: usize, attempt: u32) -> Command {
        match self {
            LeaseReport::Complete { result } => Command::Complete {
                step,
                attempt,
                result,
            },
            LeaseReport::Fail {
                error,
                retryable,
                jitter,
            } => Command::Fail {
                step,
                attempt,
                error,
                retryable,
                jitter,
            },
        }
    }
}

/// One report of a [`Reports`] batch: the lease it is for and what it says.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub lease_id: LeaseId,
    pub report: LeaseReport,
}

/// Many lease holders' reports, applied at `now`.
#[derive(Clone, Debug)]
pub struct Reports {
    pub reports: Vec<Report>,
    pub now: Timestamp,
}

/// A report that was applied: the lease it resolved to and the committed transition.
#[derive(Clone, Debug)]
pub struct ReportApplied {
    pub lease: LeaseRef,
    pub transition: Transition,
}

/// One report's outcome: applied, or why not.
pub type Reported = Result<ReportApplied>;

/// Steps handed out under leases.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Leases up to `claim.max()` claimable steps of `claim.agent` (steps whose
    /// `Step::claim_agent()` is that agent: ready work, or a ready undo whose compensate agent it
    /// is) whose `next_attempt_at` has come, higher job priority first, then oldest ready first.
    /// Each claim bumps the step's attempt; no step is handed out twice, however many callers
    /// race.
    ///
    /// Honours the agent's [`crate::AgentSettings`] in the same transaction: nothing while
    /// paused, no more than `max_concurrency` leases in flight, and a token bucket for `rate`.
    ///
    /// Order: by `next_attempt_at - priority × PRIORITY_AGING` ascending (the core's
    /// `Job::claim_rank`), so higher priority goes first but a waiting step is never starved.
    async fn steps_claim(&self, claim: Claim) -> Result<ClaimResult>;

    /// Whether claims of one agent sent at the same time contend in this store, so that a node
    /// does better to merge them into fewer, larger claims. PostgreSQL: yes, each is a
    /// transaction reading the head of the same claim index. SQLite: no, its single writer
    /// applies them one after another, in shared commits, already.
    fn claims_contend(&self) -> bool {
        false
    }

    async fn lease_find(&self, lease_id: LeaseId) -> Result<Option<LeaseRef>>;

    /// Leased steps (work or undo: `Step::is_leased()`) whose lease ended at or before `now`,
    /// oldest expiry first.
    async fn leases_expired(&self, due: Due) -> Result<Vec<LeaseRef>>;

    /// Applies many lease holders' reports, each exactly as [`Leases::lease_find`] followed by
    /// [`crate::Jobs::job_apply`] would: the lease resolves to its step and attempt, and the
    /// core's fence refuses a report for an attempt that is no longer live. Answers one outcome
    /// per report, in order; one report's refusal leaves the others untouched. The outer `Err`
    /// means none of them was applied. Each applied report is durable before this returns.
    async fn leases_report(&self, batch: Reports) -> Result<Vec<Reported>>;
}

/// Applies a batch of reports one at a time, each as [`Leases::lease_find`] followed by
/// [`Jobs::job_apply`] on `store` itself: for a store that wraps another and must see every
/// lookup and apply (the simulator's), where commit-together does not matter.
pub async fn report_one_by_one<S: Leases + Jobs + ?Sized>(
    store: &S,
    batch: Reports,
) -> Result<Vec<Reported>> {
    let mut out = Vec::with_capacity(batch.reports.len());
    for Report { lease_id, report } in batch.reports {
        let outcome = match store.lease_find(lease_id).await {
            Ok(Some(lease)) => {
                let command = report.command(lease.step, lease.attempt);
                store
                    .job_apply(Apply::new(lease.job_id, command, batch.now))
                    .await
                    .map(|transition| ReportApplied { lease, transition })
            }
            Ok(None) => Err(Error::LeaseNotFound(lease_id)),
            Err(e) => Err(e),
        };
        out.push(outcome);
    }
    Ok(out)
}
