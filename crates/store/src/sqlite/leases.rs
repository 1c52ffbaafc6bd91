//! Steps and leases: claims, and the per-agent limits they honour (pause, `max_concurrency` and
//! a `rate` token bucket, decided by `decide::ClaimLimits`, read and updated in the claim's own
//! write transaction so no race between claimers can exceed them); resolving lease ids; expired
//! leases; report batches.

use std::collections::HashSet;

use overseer_core::{Command, JobId};
use rusqlite::{params, Connection};

use super::agents::load;
use super::apply_command;
use super::rows::DbResult;
use super::rows::{self, limit_param};
use super::SqliteStore;
use crate::decide::ClaimLimits;
use crate::{
    Claim, ClaimResult, Claimed, Due, Error, LeaseId, LeaseRef, Leases, ReportApplied, Reported,
    Reports, Result,
};

/// Candidates skipped by one claim before it gives up looking further: bounds the work a claim
/// does if many ready rows turn out not to be claimable.
const CLAIM_SKIPS_MAX: usize = 1_000;

/// Leases in flight held by `agent` (work or undo), expired but not yet swept ones included.
fn in_flight(conn: &Connection, agent: &str) -> Result<u64> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM steps INDEXED BY steps_lease_expiry \
             WHERE lease_agent = ?1 AND lease_expires_at IS NOT NULL",
        )
        .db()?
        .query_row([agent], |r| r.get(0))
        .db()?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Leases up to `claim.max()` claimable steps of the agent within its limits.
pub(super) fn claim_steps(
    conn: &Connection,
    claim: Claim,
    history_per_job: usize,
) -> Result<ClaimResult> {
    let stored = load(conn, &claim.agent)?.unwrap_or_default();
    let in_flight = if stored.counts_in_flight() {
        Some(in_flight(conn, &claim.agent)?)
    } else {
        None
    };
    let limits = ClaimLimits::of(&stored, claim.max(), in_flight, claim.now);
    let mut skipped: HashSet<(String, i64)> = HashSet::new();
    let claimed = lease_candidates(conn, &claim, limits.want, &mut skipped, history_per_job)?;
    if let Some((left, counted_at)) = limits.spend(claimed.len()) {
        conn.prepare_cached(
            "UPDATE agent_settings SET tokens = ?2, tokens_at = ?3 WHERE agent = ?1",
        )
        .db()?
        .execute(params![claim.agent, left, counted_at.as_millis()])
        .db()?;
    }
    let has_more = limits.ran_dry(claimed.len()) && has_candidate(conn, &claim, &skipped)?;
    let throttled_until = limits.throttled_until(claimed.len(), has_more);
    Ok(ClaimResult {
        claimed,
        throttled_until,
    })
}

/// One ordered range of the claim index: no sort, however many steps wait.
pub(super) const CANDIDATES_SQL: &str = "SELECT job_id, idx FROM steps INDEXED BY steps_claim \
     WHERE claim_agent = ?1 AND next_attempt_at <= ?2 \
     ORDER BY claim_rank, job_id, idx LIMIT ?3";

/// The claimable steps of the agent that are due, best claim rank first.
fn candidates(conn: &Connection, claim: &Claim, limit: usize) -> Result<Vec<(String, i64)>> {
    conn.prepare_cached(CANDIDATES_SQL)
        .db()?
        .query_map(
            params![
                claim.agent,
                claim.now.as_millis(),
                i64::try_from(limit).unwrap_or(i64::MAX)
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()
}

fn has_candidate(
    conn: &Connection,
    claim: &Claim,
    skipped: &HashSet<(String, i64)>,
) -> Result<bool> {
    Ok(candidates(conn, claim, skipped.len() + 1)?
        .iter()
        .any(|c| !skipped.contains(c)))
}

/// Leases up to `want` candidates through the core, which has the last word on each.
fn lease_candidates(
    conn: &Connection,
    claim: &Claim,
    want: usize,
    skipped: &mut HashSet<(String, i64)>,
    history_per_job: usize,
) -> Result<Vec<Claimed>> {
    let mut out: Vec<Claimed> = Vec::with_capacity(want);
    while out.len() < want && skipped.len() < CLAIM_SKIPS_MAX {
        let asked = want - out.len() + skipped.len();
        let found = candidates(conn, claim, asked)?;
        // Fewer than asked for, and none refused below: the range holds nothing more.
        let (last, refused) = (found.len() < asked, skipped.len());
        let fresh: Vec<(String, i64)> =
            found.into_iter().filter(|c| !skipped.contains(c)).collect();
        if fresh.is_empty() {
            break;
        }
        for candidate in fresh {
            if out.len() >= want {
                break;
            }
            let Some(offer) = claim.offers.get(out.len()) else {
                break;
            };
            let job_id: JobId = candidate
                .0
                .parse()
                .map_err(|e| Error::Corrupt(format!("steps.job_id `{}`: {e}", candidate.0)))?;
            let step = usize::try_from(candidate.1)
                .map_err(|_| Error::Corrupt(format!("steps.idx {} is negative", candidate.1)))?;
            let command = Command::Claim {
                step,
                lease_id: offer.lease_id,
                worker: offer.worker.clone(),
            };
            match apply_command(conn, job_id, command, claim.now, history_per_job) {
                Ok(transition) => out.push(Claimed { step, transition }),
                // The core has the last word on claimability; a refused candidate changed nothing.
                Err(Error::Rejected(_)) => {
                    skipped.insert(candidate);
                }
                // One unreadable job must not stall every claim of its agent.
                Err(e @ (Error::Corrupt(_) | Error::JobNotFound(_))) => {
                    tracing::error!(job = %job_id, step, error = %e, "skipping an unclaimable step");
                    skipped.insert(candidate);
                }
                Err(e) => return Err(e),
            }
        }
        if last && skipped.len() == refused {
            break;
        }
    }
    Ok(out)
}

#[async_trait::async_trait]
impl Leases for SqliteStore {
    async fn steps_claim(&self, claim: Claim) -> Result<ClaimResult> {
        if claim.offers.is_empty() {
            return Ok(ClaimResult::default());
        }
        let history = self.inner.history_per_job;
        self.write(move |conn| claim_steps(conn, claim, history))
            .await
    }

    async fn lease_find(&self, lease_id: LeaseId) -> Result<Option<LeaseRef>> {
        self.read(move |conn| rows::find_lease(conn, lease_id))
            .await
    }

    async fn leases_expired(&self, due: Due) -> Result<Vec<LeaseRef>> {
        self.read(move |conn| expired(conn, due)).await
    }

    async fn leases_report(&self, batch: Reports) -> Result<Vec<Reported>> {
        let history = self.inner.history_per_job;
        #[cfg(feature = "fault-injection")]
        let crash = self.inner.crash_after_step_result.clone();
        // One write for the whole batch: one trip to the writer, one savepoint, one fsync shared.
        self.write(move |conn| {
            let mut out = Vec::with_capacity(batch.reports.len());
            for report in batch.reports {
                let Some(lease) = rows::find_lease(conn, report.lease_id)? else {
                    out.push(Err(Error::LeaseNotFound(report.lease_id)));
                    continue;
                };
                let command = report.report.command(lease.step, lease.attempt);
                let (job, now) = (lease.job_id, batch.now);
                #[cfg(feature = "fault-injection")]
                let applied = match &crash {
                    Some(crash) => {
                        super::fault::apply_or_crash(conn, job, command, now, history, crash)
                    }
                    None => apply_command(conn, job, command, now, history),
                };
                #[cfg(not(feature = "fault-injection"))]
                let applied = apply_command(conn, job, command, now, history);
                match applied {
                    Ok(transition) => out.push(Ok(ReportApplied { lease, transition })),
                    // Refused before anything was written: this report only.
                    Err(e @ (Error::Rejected(_) | Error::JobNotFound(_))) => out.push(Err(e)),
                    // The database failed mid-write: the batch's savepoint takes it all back.
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
        .await
    }
}

/// Leased steps whose lease ended by `due.now`, oldest expiry first.
fn expired(conn: &Connection, due: Due) -> Result<Vec<LeaseRef>> {
    let mut stmt = conn
        .prepare_cached(concat!(
            leasing_agents!(),
            "SELECT job_id, idx, attempt, lease_id FROM steps INDEXED BY steps_lease_expiry \
             WHERE lease_agent IN (SELECT agent FROM leasing) \
               AND lease_expires_at IS NOT NULL AND lease_expires_at <= ?1 \
             ORDER BY lease_expires_at, job_id, idx LIMIT ?2",
        ))
        .db()?;
    let mut found = stmt
        .query(params![due.now.as_millis(), limit_param(due.limit)])
        .db()?;
    let mut out = Vec::new();
    while let Some(row) = found.next().db()? {
        // A bad row is logged and passed over so it cannot stop every other expiry.
        match rows::lease_ref_from_row(row) {
            Ok(Some(lease)) => out.push(lease),
            Ok(None) => tracing::error!("a leased step has no lease id; skipping it"),
            Err(e) => tracing::error!(error = %e, "skipping an unreadable leased step"),
        }
    }
    Ok(out)
}
