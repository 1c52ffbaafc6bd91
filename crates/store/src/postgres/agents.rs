//! Agent names: their settings, the limits a claim spends (`claim_limits`, `claim_spend`), and
//! the ready and running counts per agent.

use super::tx::Transaction;
use overseer_core::bucket::capacity;
use overseer_core::Timestamp;
use tokio_postgres::Row;

use super::rows::{self, corrupt, get, query, query_opt, to_u64};
use super::{jobs, removal, Failure, PgStore, Res, TERMINAL};
use crate::decide::{self, ClaimLimits, StoredLimits};
use crate::{
    AgentCounts, AgentLimits, AgentReady, AgentSettings, Agents, DueBetween, Error, Result,
    SettingsUpdate,
};

fn settings_from_row(row: &Row) -> Res<AgentSettings> {
    let max: Option<i64> = get(row, 0, "agent_settings.max_concurrency")?;
    Ok(AgentSettings {
        max_concurrency: max
            .map(|m| u32::try_from(m).map_err(|_| corrupt("agent_settings.max_concurrency", m)))
            .transpose()?,
        rate: get(row, 1, "agent_settings.rate")?,
        paused: get(row, 2, "agent_settings.paused")?,
    })
}

async fn agent_settings_get(tx: &Transaction<'_>, agent: &str) -> Res<AgentSettings> {
    let row = query_opt(
        tx,
        "SELECT max_concurrency, rate, paused FROM agent_settings WHERE agent = $1",
        &[&agent],
    )
    .await?;
    Ok(match row {
        Some(row) => settings_from_row(&row)?,
        None => AgentSettings::default(),
    })
}

/// Replaces the agent's settings and fills its bucket as of `now`. When the change may let more
/// leases out (a resume, a limit raised or lifted), tells every node the agent's work is ready,
/// so their waiting long-polls look again.
async fn agent_settings_put(
    tx: &Transaction<'_>,
    agent: &str,
    settings: &AgentSettings,
    now: Timestamp,
) -> Res<AgentSettings> {
    decide::check_agent_settings(agent, settings)
        .map_err(|r| Failure::Store(Error::Rejected(r)))?;
    let before = query_opt(
        tx,
        "SELECT max_concurrency, rate, paused FROM agent_settings WHERE agent = $1 FOR UPDATE",
        &[&agent],
    )
    .await?
    .map(|row| settings_from_row(&row))
    .transpose()?
    .unwrap_or_default();
    let tokens = settings.rate.map(capacity);
    rows::execute(
        tx,
        "INSERT INTO agent_settings \
           (agent, max_concurrency, rate, paused, tokens, tokens_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $6) \
         ON CONFLICT (agent) DO UPDATE SET max_concurrency = excluded.max_concurrency, \
           rate = excluded.rate, paused = excluded.paused, tokens = excluded.tokens, \
           tokens_at = excluded.tokens_at, updated_at = excluded.updated_at",
        &[
            &agent,
            &settings.max_concurrency.map(i64::from),
            &settings.rate,
            &settings.paused,
            &tokens,
            &now.as_millis(),
        ],
    )
    .await?;
    if may_release_more(&before, settings) {
        jobs::notify(tx, &[format!("ready:{agent}")]).await?;
    }
    Ok(settings.clone())
}

/// Whether `after` may let leases out that `before` held back.
fn may_release_more(before: &AgentSettings, after: &AgentSettings) -> bool {
    if after.paused {
        return false;
    }
    let looser = |b: Option<f64>, a: Option<f64>| match (b, a) {
        (Some(_), None) => true,
        (Some(b), Some(a)) => a > b,
        _ => false,
    };
    before.paused
        || looser(
            before.max_concurrency.map(f64::from),
            after.max_concurrency.map(f64::from),
        )
        || looser(before.rate, after.rate)
}

/// Every agent whose settings differ from the defaults, by name.
async fn agent_settings_list(tx: &Transaction<'_>) -> Res<Vec<AgentLimits>> {
    let rows = query(
        tx,
        "SELECT max_concurrency, rate, paused, agent FROM agent_settings \
         WHERE max_concurrency IS NOT NULL OR rate IS NOT NULL OR paused \
         ORDER BY agent",
        &[],
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(AgentLimits {
            agent: get(row, 3, "agent_settings.agent")?,
            settings: settings_from_row(row)?,
        });
    }
    Ok(out)
}

/// Reads the agent's limits, locking its settings row so the agent's claims are serial across
/// nodes, and asks `decide::ClaimLimits` what a claim of `asked` leases may take.
pub(super) async fn claim_limits(
    tx: &Transaction<'_>,
    agent: &str,
    asked: usize,
    now: Timestamp,
) -> Res<ClaimLimits> {
    let row = query_opt(
        tx,
        "SELECT max_concurrency, rate, paused, tokens, tokens_at FROM agent_settings \
         WHERE agent = $1 FOR UPDATE",
        &[&agent],
    )
    .await?;
    let stored = match row {
        Some(row) => StoredLimits {
            settings: settings_from_row(&row)?,
            tokens: get(&row, 3, "agent_settings.tokens")?,
            tokens_at: get::<Option<i64>>(&row, 4, "agent_settings.tokens_at")?
                .map(Timestamp::from_millis),
        },
        None => StoredLimits::default(),
    };
    let in_flight = if stored.counts_in_flight() {
        let count = rows::query_one(
            tx,
            "SELECT count(*) FROM steps \
             WHERE lease_agent = $1 AND lease_expires_at IS NOT NULL",
            &[&agent],
        )
        .await?;
        Some(u64::try_from(get::<i64>(&count, 0, "count")?).unwrap_or(0))
    } else {
        None
    };
    Ok(ClaimLimits::of(&stored, asked, in_flight, now))
}

/// Stores the agent's bucket after a claim took `claimed` leases; answers when the next lease
/// may start if the bucket held claimable work back (`has_more`).
pub(super) async fn claim_spend(
    tx: &Transaction<'_>,
    agent: &str,
    limits: &ClaimLimits,
    claimed: usize,
    has_more: bool,
) -> Res<Option<Timestamp>> {
    if let Some((left, counted_at)) = limits.spend(claimed) {
        rows::execute(
            tx,
            "UPDATE agent_settings SET tokens = $2, tokens_at = $3 WHERE agent = $1",
            &[&agent, &left, &counted_at.as_millis()],
        )
        .await?;
    }
    Ok(limits.throttled_until(claimed, has_more))
}

#[async_trait::async_trait]
impl Agents for PgStore {
    async fn agents_counts(&self) -> Result<Vec<AgentCounts>> {
        self.read(|tx, _| {
            Box::pin(async move {
                // Claimable steps by the agent that may lease them, leased steps by the agent
                // holding the lease (an undo's compensate agent), of unfinished jobs. Only a
                // step whose job would take the claim has a `claim_agent` (property-tested in the
                // core), so that arm reads the claim index alone; a finished job may still have
                // leased steps (they learn of it at their next heartbeat), so that arm joins.
                let rows = query(
                    tx,
                    &format!(
                        "SELECT agent, SUM(ready)::bigint, SUM(running)::bigint FROM ( \
                           SELECT claim_agent AS agent, COUNT(*) AS ready, 0 AS running \
                           FROM steps WHERE claim_agent IS NOT NULL GROUP BY claim_agent \
                           UNION ALL \
                           SELECT s.lease_agent, 0, 1 \
                           FROM steps s JOIN jobs j ON j.id = s.job_id \
                           WHERE s.lease_expires_at IS NOT NULL AND s.lease_agent IS NOT NULL \
                             AND j.state NOT IN {TERMINAL}) c \
                         GROUP BY agent ORDER BY agent"
                    ),
                    &[],
                )
                .await?;
                let mut out = Vec::with_capacity(rows.len());
                for row in &rows {
                    out.push(AgentCounts {
                        agent: get(row, 0, "agent")?,
                        ready: to_u64("ready", get(row, 1, "ready")?)?,
                        running: to_u64("running", get(row, 2, "running")?)?,
                    });
                }
                Ok(out)
            })
        })
        .await
    }

    async fn agents_ready_now(&self, now: Timestamp) -> Result<Vec<AgentReady>> {
        self.read(move |tx, _| Box::pin(removal::ready_now(tx, now)))
            .await
    }

    async fn agents_due(&self, window: DueBetween) -> Result<Vec<String>> {
        self.read(move |tx, _| {
            Box::pin(async move {
                let rows = query(
                    tx,
                    "SELECT DISTINCT claim_agent FROM steps \
                     WHERE claim_agent IS NOT NULL AND next_attempt_at > ready_at \
                       AND next_attempt_at > $1 AND next_attempt_at <= $2 \
                     ORDER BY claim_agent",
                    &[&window.after.as_millis(), &window.until.as_millis()],
                )
                .await?;
                rows.iter()
                    .map(|r| get(r, 0, "steps.claim_agent"))
                    .collect()
            })
        })
        .await
    }

    async fn agent_settings_get(&self, agent: &str) -> Result<AgentSettings> {
        self.read(move |tx, _| Box::pin(agent_settings_get(tx, agent)))
            .await
    }

    async fn agent_settings_put(&self, update: SettingsUpdate) -> Result<AgentSettings> {
        let u = &update;
        self.write(move |tx, _| Box::pin(agent_settings_put(tx, &u.agent, &u.settings, u.now)))
            .await
    }

    async fn agent_settings_list(&self) -> Result<Vec<AgentLimits>> {
        self.read(|tx, _| Box::pin(agent_settings_list(tx))).await
    }
}
