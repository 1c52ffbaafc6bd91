//! Claims, and the per-agent limits they honour: pause, `max_concurrency` and a `rate` token
//! bucket, all read and updated in the claim's own write transaction so no race between
//! claimers (or nodes sharing the file) can exceed them.
//!
//! The bucket holds at most one second's worth of tokens (`max(1, rate)`), refills at `rate` per
//! second from `tokens_at`, and each lease takes one. It is stored lazily: `tokens` as of
//! `tokens_at`, brought up to date when a claim reads it, written back only when a claim took
//! tokens. Refilling is capped, so reading it at any instant in between gives the same answer.

use overseer_core::bucket::{capacity, next_token_at, refill, whole};
use std::collections::HashSet;

use overseer_core::{Command, JobId, Rejection, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use super::apply_command;
use super::rows::DbResult;
use crate::{AgentSettings, Claim, ClaimResult, Claimed, Error, Result};

/// Candidates skipped by one claim before it gives up looking further: bounds the work a claim
/// does if many ready rows turn out not to be claimable.
const CLAIM_SKIPS_MAX: usize = 1_000;

/// An agent's settings row with its bucket.
struct Row {
    settings: AgentSettings,
    tokens: Option<f64>,
    tokens_at: Option<Timestamp>,
}

fn load(conn: &Connection, agent: &str) -> Result<Option<Row>> {
    let row = conn
        .prepare_cached(
            "SELECT max_concurrency, rate, paused, tokens, tokens_at FROM agent_settings \
             WHERE agent = ?1",
        )
        .db()?
        .query_row([agent], |r| {
            Ok((
                r.get::<_, Option<i64>>(0)?,
                r.get::<_, Option<f64>>(1)?,
                r.get::<_, bool>(2)?,
                r.get::<_, Option<f64>>(3)?,
                r.get::<_, Option<i64>>(4)?,
            ))
        })
        .optional()
        .db()?;
    let Some((max_concurrency, rate, paused, tokens, tokens_at)) = row else {
        return Ok(None);
    };
    let max_concurrency = max_concurrency
        .map(|m| {
            u32::try_from(m).map_err(|_| {
                Error::Corrupt(format!(
                    "agent_settings.max_concurrency of `{agent}`: {m} is out of range"
                ))
            })
        })
        .transpose()?;
    Ok(Some(Row {
        settings: AgentSettings {
            max_concurrency,
            rate,
            paused,
        },
        tokens,
        tokens_at: tokens_at.map(Timestamp::from_millis),
    }))
}

/// The agent's settings; defaults (no limits, not paused) for an agent never configured.
pub(super) fn settings_get(conn: &Connection, agent: &str) -> Result<AgentSettings> {
    Ok(load(conn, agent)?.map(|r| r.settings).unwrap_or_default())
}

/// Replaces the agent's settings and fills its bucket as of `now`.
pub(super) fn settings_put(
    conn: &Connection,
    agent: &str,
    settings: &AgentSettings,
    now: Timestamp,
) -> Result<AgentSettings> {
    if let Some(rate) = settings.rate {
        // SQLite stores NaN as NULL; a rate that is not a positive number cannot be kept.
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::Rejected(Rejection::NotAllowed {
                reason: format!(
                    "agent `{agent}`: a rate is a positive number of leases per second, not {rate}"
                ),
            }));
        }
    }
    let tokens = settings.rate.map(capacity);
    conn.prepare_cached(
        "INSERT INTO agent_settings \
         (agent, max_concurrency, rate, paused, tokens, tokens_at, updated_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
         ON CONFLICT (agent) DO UPDATE SET max_concurrency = excluded.max_concurrency, \
         rate = excluded.rate, paused = excluded.paused, tokens = excluded.tokens, \
         tokens_at = excluded.tokens_at, updated_at = excluded.updated_at",
    )
    .db()?
    .execute(params![
        agent,
        settings.max_concurrency,
        settings.rate,
        settings.paused,
        tokens,
        now.as_millis(),
    ])
    .db()?;
    Ok(settings.clone())
}

/// Every agent whose settings differ from the defaults, by name.
pub(super) fn settings_list(conn: &Connection) -> Result<Vec<(String, AgentSettings)>> {
    let agents: Vec<String> = conn
        .prepare_cached(
            "SELECT agent FROM agent_settings \
             WHERE max_concurrency IS NOT NULL OR rate IS NOT NULL OR paused <> 0 \
             ORDER BY agent",
        )
        .db()?
        .query_map([], |r| r.get(0))
        .db()?
        .collect::<rusqlite::Result<_>>()
        .db()?;
    let mut out = Vec::with_capacity(agents.len());
    for agent in agents {
        let settings = settings_get(conn, &agent)?;
        out.push((agent, settings));
    }
    Ok(out)
}

/// Leases in flight held by `agent` (work or undo), expired but not yet swept ones included.
fn in_flight(conn: &Connection, agent: &str) -> Result<u64> {
    let n: i64 = conn
        .prepare_cached(
            "SELECT COUNT(*) FROM steps INDEXED BY steps_lease_agent \
             WHERE lease_agent = ?1 AND lease_expires_at IS NOT NULL",
        )
        .db()?
        .query_row([agent], |r| r.get(0))
        .db()?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Leases up to `claim.lease_ids.len()` claimable steps of the agent within its limits.
pub(super) fn claim_steps(
    conn: &Connection,
    claim: Claim,
    history_per_job: usize,
) -> Result<ClaimResult> {
    let row = load(conn, &claim.agent)?;
    let settings = row.as_ref().map(|r| r.settings.clone()).unwrap_or_default();
    if settings.paused {
        return Ok(ClaimResult::default());
    }
    // What the claim may take before the bucket is asked.
    let mut room = claim.lease_ids.len();
    if let Some(max) = settings.max_concurrency {
        let free = u64::from(max).saturating_sub(in_flight(conn, &claim.agent)?);
        room = room.min(usize::try_from(free).unwrap_or(usize::MAX));
    }
    let bucket = match (settings.rate, &row) {
        (Some(rate), Some(r)) => Some((rate, refill(rate, r.tokens, r.tokens_at, claim.now))),
        _ => None,
    };
    let want = match bucket {
        Some((_, (tokens, _))) => room.min(whole(tokens)),
        None => room,
    };

    let mut skipped: HashSet<(String, i64)> = HashSet::new();
    let claimed = lease_candidates(conn, &claim, want, &mut skipped, history_per_job)?;

    let mut throttled_until = None;
    if let Some((rate, (tokens, counted_at))) = bucket {
        let left = tokens - claimed.len() as f64;
        if !claimed.is_empty() {
            conn.prepare_cached(
                "UPDATE agent_settings SET tokens = ?2, tokens_at = ?3 WHERE agent = ?1",
            )
            .db()?
            .execute(params![claim.agent, left, counted_at.as_millis()])
            .db()?;
        }
        // The bucket held the claim back if it ran dry before the claim's other bounds and
        // claimable work is left over.
        let ran_dry = claimed.len() == want && want < room;
        if ran_dry && has_candidate(conn, &claim, &skipped)? {
            throttled_until = Some(next_token_at(rate, left, counted_at));
        }
    }
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
        let found = candidates(conn, claim, want - out.len() + skipped.len())?;
        let fresh: Vec<(String, i64)> =
            found.into_iter().filter(|c| !skipped.contains(c)).collect();
        if fresh.is_empty() {
            break;
        }
        for candidate in fresh {
            if out.len() >= want {
                break;
            }
            let Some(&lease_id) = claim.lease_ids.get(out.len()) else {
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
                lease_id,
                worker: claim.worker.clone(),
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
    }
    Ok(out)
}
