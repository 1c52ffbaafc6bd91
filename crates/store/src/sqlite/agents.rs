//! Agent names: their settings (pause, `max_concurrency`, `rate` with its token bucket, read
//! and updated by claims in `leases`), and the ready and running counts per agent.

use overseer_core::bucket::capacity;
use overseer_core::Timestamp;
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{self, DbResult};
use super::SqliteStore;
use crate::decide::{self, StoredLimits};
use crate::{
    AgentCounts, AgentLimits, AgentReady, AgentSettings, Agents, DueBetween, Error, Result,
    SettingsUpdate,
};

pub(super) fn load(conn: &Connection, agent: &str) -> Result<Option<StoredLimits>> {
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
    Ok(Some(StoredLimits {
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
fn settings_get(conn: &Connection, agent: &str) -> Result<AgentSettings> {
    Ok(load(conn, agent)?.map(|r| r.settings).unwrap_or_default())
}

/// Replaces the agent's settings and fills its bucket as of `now`.
fn settings_put(
    conn: &Connection,
    agent: &str,
    settings: &AgentSettings,
    now: Timestamp,
) -> Result<AgentSettings> {
    decide::check_agent_settings(agent, settings).map_err(Error::Rejected)?;
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
fn settings_list(conn: &Connection) -> Result<Vec<AgentLimits>> {
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
        out.push(AgentLimits { agent, settings });
    }
    Ok(out)
}

#[async_trait::async_trait]
impl Agents for SqliteStore {
    async fn agents_counts(&self) -> Result<Vec<AgentCounts>> {
        self.read(counts).await
    }

    async fn agents_ready_now(&self, now: Timestamp) -> Result<Vec<AgentReady>> {
        self.read(move |conn| ready_now(conn, now)).await
    }

    async fn agents_due(&self, window: DueBetween) -> Result<Vec<String>> {
        self.read(move |conn| {
            conn.prepare_cached(
                "SELECT DISTINCT claim_agent FROM steps INDEXED BY steps_claim_due \
                 WHERE claim_agent IS NOT NULL AND next_attempt_at > ready_at \
                   AND next_attempt_at > ?1 AND next_attempt_at <= ?2 \
                 ORDER BY claim_agent",
            )
            .db()?
            .query_map(
                params![window.after.as_millis(), window.until.as_millis()],
                |r| r.get(0),
            )
            .db()?
            .collect::<rusqlite::Result<_>>()
            .db()
        })
        .await
    }

    async fn agent_settings_get(&self, agent: &str) -> Result<AgentSettings> {
        let agent = agent.to_string();
        self.read(move |conn| settings_get(conn, &agent)).await
    }

    async fn agent_settings_put(&self, update: SettingsUpdate) -> Result<AgentSettings> {
        self.write(move |conn| settings_put(conn, &update.agent, &update.settings, update.now))
            .await
    }

    async fn agent_settings_list(&self) -> Result<Vec<AgentLimits>> {
        self.read(settings_list).await
    }
}

/// Claimable steps by the agent that may lease them, leased steps by the agent holding the
/// lease (an undo's compensate agent), of unfinished jobs. Two arms so each uses its partial
/// index; a live lease always has an expiry, so the expiry index finds every one. A step has a
/// `claim_agent` only while its job would take the claim (`Step::claim_agent`, property-tested
/// in the core), so the claimable arm is counted from the claim index alone, without a look at
/// each job: 100,000 ready steps cost one index scan, not 100,000 job lookups. A finished job may
/// still have leased steps (they learn of the end at their next heartbeat), so the leased arm
/// keeps the join.
fn counts(conn: &Connection) -> Result<Vec<AgentCounts>> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT agent, SUM(ready), SUM(running) FROM ( \
               SELECT claim_agent AS agent, COUNT(*) AS ready, 0 AS running \
               FROM steps INDEXED BY steps_claim WHERE claim_agent IS NOT NULL \
               GROUP BY claim_agent \
               UNION ALL \
               SELECT s.lease_agent, 0, 1 \
               FROM steps s INDEXED BY steps_lease_expiry JOIN jobs j ON j.id = s.job_id \
               WHERE s.lease_expires_at IS NOT NULL AND s.lease_agent IS NOT NULL AND ",
            unfinished!("j.state"),
            ") GROUP BY agent ORDER BY agent"
        ))
        .db()?;
    let mut rows = stmt.query([]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(AgentCounts {
            agent: row.get(0).db()?,
            ready: rows::count_param("ready", row.get(1).db()?)?,
            running: rows::count_param("running", row.get(2).db()?)?,
        });
    }
    Ok(out)
}

/// `Agents::agents_ready_now`: claimable steps of unfinished jobs that are due, per agent.
fn ready_now(conn: &Connection, now: Timestamp) -> Result<Vec<AgentReady>> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT s.claim_agent, COUNT(*) \
             FROM steps s INDEXED BY steps_claim JOIN jobs j ON j.id = s.job_id \
             WHERE s.claim_agent IS NOT NULL \
               AND COALESCE(s.next_attempt_at, 0) <= ?1 AND ",
            unfinished!("j.state"),
            " GROUP BY s.claim_agent ORDER BY s.claim_agent"
        ))
        .db()?;
    let mut rows = stmt.query([now.as_millis()]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(AgentReady {
            agent: row.get(0).db()?,
            ready: rows::count_param("ready", row.get(1).db()?)?,
        });
    }
    Ok(out)
}
