//! Claims, and the per-agent limits they honour: pause, `max_concurrency` and a `rate` token
//! bucket, all read and updated in the claim's own write transaction so no race between
//! claimers (or nodes sharing the file) can exceed them.
//!
//! The bucket holds at most one second's worth of tokens (`max(1, rate)`), refills at `rate` per
//! second from `tokens_at`, and each lease takes one. It is stored lazily: `tokens` as of
//! `tokens_at`, brought up to date when a claim reads it, written back only when a claim took
//! tokens. Refilling is capped, so reading it at any instant in between gives the same answer.

use std::collections::HashSet;

use overseer_core::{Command, JobId, Rejection, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use super::apply_command;
use super::rows::DbResult;
use crate::{AgentSettings, Claim, ClaimResult, Claimed, Error, Result};

/// Candidates skipped by one claim before it gives up looking further: bounds the work a claim
/// does if many ready rows turn out not to be claimable.
const CLAIM_SKIPS_MAX: usize = 1_000;

/// Slack when counting whole tokens, so float rounding never makes a full token look short.
const TOKEN_EPSILON: f64 = 1e-9;

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

/// What the bucket holds when full: one second's worth, and never less than one lease.
fn capacity(rate: f64) -> f64 {
    rate.max(1.0)
}

/// The bucket brought up to `now`: its tokens and the instant they are counted at. A `now`
/// before the stored instant (another node's clock runs behind) adds nothing.
fn refill(
    rate: f64,
    tokens: Option<f64>,
    tokens_at: Option<Timestamp>,
    now: Timestamp,
) -> (f64, Timestamp) {
    let cap = capacity(rate);
    match (tokens, tokens_at) {
        (Some(tokens), Some(at)) if at >= now => (tokens.min(cap), at),
        (Some(tokens), Some(at)) => {
            let elapsed_s = (now.as_millis() - at.as_millis()) as f64 / 1000.0;
            ((tokens + rate * elapsed_s).min(cap), now)
        }
        _ => (cap, now),
    }
}

/// Whole tokens in a bucket holding `tokens`.
fn whole(tokens: f64) -> usize {
    (tokens + TOKEN_EPSILON).floor().max(0.0) as usize
}

/// The first millisecond after `at` at which a bucket holding `left` tokens then holds a whole
/// one, by the very arithmetic of [`refill`], so a claim made at that instant finds it.
fn next_token_at(rate: f64, left: f64, at: Timestamp) -> Timestamp {
    let missing = (1.0 - left).max(0.0);
    let guess = ((missing * 1000.0 / rate).floor() as i64).max(1);
    let mut wait_ms = guess;
    // The float estimate is at most a millisecond or two short; step until the refill agrees.
    while wait_ms < guess.saturating_add(4) {
        let later = Timestamp::from_millis(at.as_millis().saturating_add(wait_ms));
        if whole(refill(rate, Some(left), Some(at), later).0) >= 1 {
            break;
        }
        wait_ms += 1;
    }
    Timestamp::from_millis(at.as_millis().saturating_add(wait_ms))
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
pub(super) const CANDIDATES_SQL: &str =
    "SELECT job_id, idx FROM steps INDEXED BY steps_claim_rank \
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

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the bucket refills at `rate` per second up to one second's worth (at least one
    // token), and that a clock running behind the stored instant adds nothing.
    #[test]
    fn the_bucket_refills_and_caps() {
        let t = |ms: i64| Timestamp::from_millis(1_000_000 + ms);
        assert_eq!(refill(10.0, Some(0.0), Some(t(0)), t(100)), (1.0, t(100)));
        assert_eq!(
            refill(10.0, Some(0.0), Some(t(0)), t(5_000)),
            (10.0, t(5_000))
        );
        assert_eq!(
            refill(0.5, Some(0.0), Some(t(0)), t(10_000)),
            (1.0, t(10_000))
        );
        assert_eq!(refill(10.0, Some(3.0), Some(t(50)), t(0)), (3.0, t(50)));
        assert_eq!(refill(2.0, None, None, t(7)), (2.0, t(7)));
    }

    // Proves the next-token instant is the first millisecond at which a refill yields a whole
    // token, for rates that do and do not divide a second evenly.
    #[test]
    fn the_next_token_is_found_to_the_millisecond() {
        let t = |ms: i64| Timestamp::from_millis(1_000_000 + ms);
        assert_eq!(next_token_at(10.0, 0.0, t(0)), t(100));
        assert_eq!(next_token_at(10.0, 0.99, t(0)), t(1));
        assert_eq!(next_token_at(3.0, 0.0, t(0)), t(334));
        assert_eq!(next_token_at(0.5, 0.25, t(0)), t(1_500));
        assert_eq!(next_token_at(1_000_000.0, 0.0, t(0)), t(1));
        for (rate, left) in [(3.0, 0.1), (7.0, 0.3), (0.3, 0.0), (123.4, 0.77)] {
            let next = next_token_at(rate, left, t(0));
            let before = Timestamp::from_millis(next.as_millis() - 1);
            assert_eq!(
                whole(refill(rate, Some(left), Some(t(0)), next).0),
                1,
                "{rate} {left}"
            );
            if before > t(0) {
                assert_eq!(
                    whole(refill(rate, Some(left), Some(t(0)), before).0),
                    0,
                    "{rate} {left}"
                );
            }
        }
    }
}
