//! What coordinates the nodes: the leader lease and its fence, agent limits, and schedules.

use deadpool_postgres::Transaction;
use overseer_core::bucket::{capacity, next_token_at, refill, whole};
use overseer_core::schedule::{Overlap, ScheduleSpec};
use overseer_core::{JobId, JobState, Rejection, Span, Timestamp};
use tokio_postgres::Row;
use uuid::Uuid;

use super::jobs;
use super::rows::{self, corrupt, get, limit_param, ms, query, query_opt};
use super::{Failure, Res};
use crate::{AgentSettings, Error, Fence, Fire, FireOutcome, Leadership, Schedule, Submitted};

/// Fails with [`Error::Fenced`] unless `fence` is the current, unexpired leader lease at `now`.
/// The row is locked `FOR SHARE` until the transaction ends, so the lease cannot change hands
/// while the fenced write is under way (a takeover waits for it).
pub(super) async fn check_fence(tx: &Transaction<'_>, fence: &Fence, now: Timestamp) -> Res<()> {
    let row = query_opt(
        tx,
        "SELECT 1 FROM leader WHERE id = 1 AND node = $1 AND epoch = $2 AND expires_at > $3 \
         FOR SHARE",
        &[&fence.node, &fence.epoch, &now.as_millis()],
    )
    .await?;
    match row {
        Some(_) => Ok(()),
        None => Err(Failure::Store(Error::Fenced { epoch: fence.epoch })),
    }
}

fn leadership_from_row(row: &Row) -> Res<Leadership> {
    Ok(Leadership {
        node: get(row, 0, "leader.node")?,
        epoch: get(row, 1, "leader.epoch")?,
        expires_at: Timestamp::from_millis(get(row, 2, "leader.expires_at")?),
    })
}

/// One conditional upsert: takes the lease if there is none or it has expired (the epoch moves
/// on), renews it if `node` holds it (same epoch), and otherwise changes nothing.
pub(super) async fn leader_acquire(
    tx: &Transaction<'_>,
    node: &str,
    ttl: Span,
    now: Timestamp,
) -> Res<Option<Leadership>> {
    let expires_at = now.plus(ttl).as_millis();
    let row = query_opt(
        tx,
        "INSERT INTO leader AS l (id, node, epoch, expires_at) VALUES (1, $1, 1, $3) \
         ON CONFLICT (id) DO UPDATE SET \
           epoch = CASE WHEN l.node = excluded.node AND l.expires_at > $2 \
                        THEN l.epoch ELSE l.epoch + 1 END, \
           node = excluded.node, \
           expires_at = excluded.expires_at \
         WHERE l.expires_at <= $2 OR l.node = excluded.node \
         RETURNING node, epoch, expires_at",
        &[&node, &now.as_millis(), &expires_at],
    )
    .await?;
    row.as_ref().map(leadership_from_row).transpose()
}

pub(super) async fn leader_get(tx: &Transaction<'_>) -> Res<Option<Leadership>> {
    let row = query_opt(
        tx,
        "SELECT node, epoch, expires_at FROM leader WHERE id = 1",
        &[],
    )
    .await?;
    row.as_ref().map(leadership_from_row).transpose()
}

/// Ends the lease at once if `node` still holds `epoch`: the epoch is kept, so the next leader
/// takes the one after it.
pub(super) async fn leader_release(tx: &Transaction<'_>, node: &str, epoch: i64) -> Res<()> {
    rows::execute(
        tx,
        "UPDATE leader SET expires_at = 0 WHERE id = 1 AND node = $1 AND epoch = $2",
        &[&node, &epoch],
    )
    .await?;
    Ok(())
}

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

pub(super) async fn agent_settings_get(tx: &Transaction<'_>, agent: &str) -> Res<AgentSettings> {
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
pub(super) async fn agent_settings_put(
    tx: &Transaction<'_>,
    agent: &str,
    settings: &AgentSettings,
    now: Timestamp,
) -> Res<AgentSettings> {
    if let Some(rate) = settings.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Failure::Store(Error::Rejected(Rejection::NotAllowed {
                reason: format!(
                    "agent `{agent}`: a rate is a positive number of leases per second, not {rate}"
                ),
            })));
        }
    }
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
pub(super) async fn agent_settings_list(tx: &Transaction<'_>) -> Res<Vec<(String, AgentSettings)>> {
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
        out.push((
            get(row, 3, "agent_settings.agent")?,
            settings_from_row(row)?,
        ));
    }
    Ok(out)
}

// The token bucket, exactly as the SQLite backend keeps it (`sqlite/claims.rs`): at most one
// second's worth of tokens (`max(1, rate)`), refilled at `rate` per second from `tokens_at`,
// one token per lease, stored lazily (`tokens` as of `tokens_at`) and written back only when a
// claim took tokens.

/// What an agent's settings allow one claim, worked out under the lock of its settings row.
pub(super) struct ClaimLimits {
    /// Leases the claim may take before the bucket is asked (its size, `max_concurrency`).
    pub(super) room: usize,
    /// Leases the claim may take: `room`, and whole tokens in the bucket.
    pub(super) want: usize,
    /// The agent's rate and its bucket brought up to the claim's `now` (tokens, counted at).
    bucket: Option<(f64, (f64, Timestamp))>,
}

impl ClaimLimits {
    /// Whether the bucket ran dry before the claim's other bounds after `claimed` leases.
    pub(super) fn ran_dry(&self, claimed: usize) -> bool {
        self.bucket.is_some() && claimed == self.want && self.want < self.room
    }
}

/// Reads the agent's settings, locking its row so the agent's claims are serial across nodes,
/// and works out how many leases a claim of `wanted` may take.
pub(super) async fn claim_limits(
    tx: &Transaction<'_>,
    agent: &str,
    wanted: usize,
    now: Timestamp,
) -> Res<ClaimLimits> {
    let Some(row) = query_opt(
        tx,
        "SELECT max_concurrency, rate, paused, tokens, tokens_at FROM agent_settings \
         WHERE agent = $1 FOR UPDATE",
        &[&agent],
    )
    .await?
    else {
        return Ok(ClaimLimits {
            room: wanted,
            want: wanted,
            bucket: None,
        });
    };
    let settings = settings_from_row(&row)?;
    if settings.paused {
        return Ok(ClaimLimits {
            room: 0,
            want: 0,
            bucket: None,
        });
    }
    let mut room = wanted;
    if let Some(max) = settings.max_concurrency {
        // Leases in flight (work or undo), expired but not yet swept ones included.
        let count = rows::query_one(
            tx,
            "SELECT count(*) FROM steps \
             WHERE lease_agent = $1 AND lease_expires_at IS NOT NULL",
            &[&agent],
        )
        .await?;
        let in_flight = u64::try_from(get::<i64>(&count, 0, "count")?).unwrap_or(0);
        let free = u64::from(max).saturating_sub(in_flight);
        room = room.min(usize::try_from(free).unwrap_or(usize::MAX));
    }
    let bucket = match settings.rate {
        Some(rate) => {
            let tokens: Option<f64> = get(&row, 3, "agent_settings.tokens")?;
            let tokens_at: Option<i64> = get(&row, 4, "agent_settings.tokens_at")?;
            Some((
                rate,
                refill(rate, tokens, tokens_at.map(Timestamp::from_millis), now),
            ))
        }
        None => None,
    };
    let want = match bucket {
        Some((_, (tokens, _))) => room.min(whole(tokens)),
        None => room,
    };
    Ok(ClaimLimits { room, want, bucket })
}

/// Takes the leases a claim handed out from the agent's bucket; answers the instant the next
/// lease may start when the bucket held the claim back (`has_more`: claimable work is left).
pub(super) async fn claim_spend(
    tx: &Transaction<'_>,
    agent: &str,
    limits: &ClaimLimits,
    claimed: usize,
    has_more: bool,
) -> Res<Option<Timestamp>> {
    let Some((rate, (tokens, counted_at))) = limits.bucket else {
        return Ok(None);
    };
    let left = tokens - claimed as f64;
    if claimed > 0 {
        rows::execute(
            tx,
            "UPDATE agent_settings SET tokens = $2, tokens_at = $3 WHERE agent = $1",
            &[&agent, &left, &counted_at.as_millis()],
        )
        .await?;
    }
    Ok((limits.ran_dry(claimed) && has_more).then(|| next_token_at(rate, left, counted_at)))
}

const SCHEDULE_COLUMNS: &str =
    "name, spec, paused, next_fire_at, last_fire_at, last_job_id, created_at, updated_at";

fn schedule_from_row(row: &Row) -> Res<Schedule> {
    let spec: String = get(row, 1, "schedules.spec")?;
    let last_job: Option<Uuid> = get(row, 5, "schedules.last_job_id")?;
    Ok(Schedule {
        name: get(row, 0, "schedules.name")?,
        spec: serde_json::from_str::<ScheduleSpec>(&spec)
            .map_err(|e| corrupt("schedules.spec", e))?,
        paused: get(row, 2, "schedules.paused")?,
        next_fire_at: get::<Option<i64>>(row, 3, "schedules.next_fire_at")?
            .map(Timestamp::from_millis),
        last_fire_at: get::<Option<i64>>(row, 4, "schedules.last_fire_at")?
            .map(Timestamp::from_millis),
        last_job_id: last_job.map(JobId),
        created_at: Timestamp::from_millis(get(row, 6, "schedules.created_at")?),
        updated_at: Timestamp::from_millis(get(row, 7, "schedules.updated_at")?),
    })
}

pub(super) async fn schedule_create(
    tx: &Transaction<'_>,
    schedule: &Schedule,
) -> Res<(Schedule, bool)> {
    let spec = serde_json::to_string(&schedule.spec).map_err(|e| corrupt("schedules.spec", e))?;
    let inserted = query_opt(
        tx,
        &format!(
            "INSERT INTO schedules ({SCHEDULE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (name) DO NOTHING RETURNING {SCHEDULE_COLUMNS}"
        ),
        &[
            &schedule.name,
            &spec,
            &schedule.paused,
            &ms(schedule.next_fire_at),
            &ms(schedule.last_fire_at),
            &schedule.last_job_id.map(|j| j.0),
            &schedule.created_at.as_millis(),
            &schedule.updated_at.as_millis(),
        ],
    )
    .await?;
    if let Some(row) = inserted {
        return Ok((schedule_from_row(&row)?, true));
    }
    let existing = schedule_get(tx, &schedule.name, false)
        .await?
        .ok_or_else(|| Failure::Retry(format!("schedule `{}` vanished", schedule.name)))?;
    if existing.spec == schedule.spec {
        Ok((existing, false))
    } else {
        Err(Failure::Store(Error::ScheduleConflict(
            schedule.name.clone(),
        )))
    }
}

pub(super) async fn schedule_get(
    tx: &Transaction<'_>,
    name: &str,
    for_update: bool,
) -> Res<Option<Schedule>> {
    let sql = if for_update {
        format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = $1 FOR UPDATE")
    } else {
        format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = $1")
    };
    let row = query_opt(tx, &sql, &[&name]).await?;
    row.as_ref().map(schedule_from_row).transpose()
}

pub(super) async fn schedules_list(tx: &Transaction<'_>) -> Res<Vec<Schedule>> {
    let rows = query(
        tx,
        &format!("SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name"),
        &[],
    )
    .await?;
    rows.iter().map(schedule_from_row).collect()
}

pub(super) async fn schedule_delete(tx: &Transaction<'_>, name: &str) -> Res<bool> {
    let n = rows::execute(tx, "DELETE FROM schedules WHERE name = $1", &[&name]).await?;
    Ok(n > 0)
}

pub(super) async fn schedule_set_paused(
    tx: &Transaction<'_>,
    name: &str,
    paused: bool,
    next_fire_at: Option<Timestamp>,
    now: Timestamp,
) -> Res<Schedule> {
    let row = query_opt(
        tx,
        &format!(
            "UPDATE schedules SET paused = $2, next_fire_at = $3, updated_at = $4 \
             WHERE name = $1 RETURNING {SCHEDULE_COLUMNS}"
        ),
        &[&name, &paused, &ms(next_fire_at), &now.as_millis()],
    )
    .await?;
    match row {
        Some(row) => schedule_from_row(&row),
        None => Err(Failure::Store(Error::ScheduleNotFound(name.to_string()))),
    }
}

pub(super) async fn schedules_due(
    tx: &Transaction<'_>,
    now: Timestamp,
    limit: usize,
) -> Res<Vec<Schedule>> {
    let rows = query(
        tx,
        &format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules \
             WHERE NOT paused AND next_fire_at <= $1 ORDER BY next_fire_at, name LIMIT $2"
        ),
        &[&now.as_millis(), &limit_param(limit)],
    )
    .await?;
    rows.iter().map(schedule_from_row).collect()
}

/// Fires one due time (see [`crate::Store::schedule_fire`]): the fence and the schedule row are
/// locked first, so of any number of nodes firing the same due time exactly one finds it still
/// due.
pub(super) async fn schedule_fire(
    tx: &Transaction<'_>,
    fire: &Fire,
    fence: &Fence,
    history_per_job: usize,
) -> Res<FireOutcome> {
    check_fence(tx, fence, fire.now).await?;
    let Some(schedule) = schedule_get(tx, &fire.name, true).await? else {
        return Err(Failure::Store(Error::ScheduleNotFound(fire.name.clone())));
    };
    if schedule.paused || schedule.next_fire_at != Some(fire.due_at) {
        return Ok(FireOutcome::Stale);
    }
    if schedule.spec.overlap == Overlap::Skip {
        if let Some(previous) = schedule.last_job_id {
            let row = query_opt(tx, "SELECT state FROM jobs WHERE id = $1", &[&previous.0]).await?;
            if let Some(row) = row {
                let state: String = get(&row, 0, "jobs.state")?;
                let state = JobState::parse(&state).ok_or_else(|| corrupt("jobs.state", &state))?;
                if !state.is_terminal() {
                    rows::execute(
                        tx,
                        "UPDATE schedules SET next_fire_at = $2, updated_at = $3 WHERE name = $1",
                        &[&fire.name, &ms(fire.next_fire_at), &fire.now.as_millis()],
                    )
                    .await?;
                    return Ok(FireOutcome::Skipped { running: previous });
                }
            }
        }
    }
    let job = &fire.job.transition.job;
    let keys = job.ordering_key.as_deref().into_iter().collect();
    jobs::lock_ordering_keys(tx, keys).await?;
    let submitted = jobs::submit_one(tx, 0, &fire.job, history_per_job).await?;
    let id = match &submitted {
        Submitted::Created(t) => t.job.id,
        Submitted::Existing(j) => j.id,
    };
    advance(tx, fire, id).await?;
    Ok(FireOutcome::Fired(submitted))
}

/// Moves a schedule past a fired due time.
async fn advance(tx: &Transaction<'_>, fire: &Fire, job: JobId) -> Res<()> {
    rows::execute(
        tx,
        "UPDATE schedules SET next_fire_at = $2, last_fire_at = $3, last_job_id = $4, \
         updated_at = $5 WHERE name = $1",
        &[
            &fire.name,
            &ms(fire.next_fire_at),
            &fire.due_at.as_millis(),
            &job.0,
            &fire.now.as_millis(),
        ],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the bucket arithmetic matches the SQLite backend's to the millisecond: refills cap
    // at one second's worth (at least one token), a clock behind adds nothing, and the next token
    // is found at the first millisecond a refill yields it.
    #[test]
    fn the_bucket_refills_caps_and_finds_the_next_token() {
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
        assert_eq!(next_token_at(10.0, 0.0, t(0)), t(100));
        assert_eq!(next_token_at(3.0, 0.0, t(0)), t(334));
        assert_eq!(next_token_at(0.5, 0.25, t(0)), t(1_500));
        for (rate, left) in [(3.0, 0.1), (7.0, 0.3), (0.3, 0.0), (123.4, 0.77)] {
            let next = next_token_at(rate, left, t(0));
            assert_eq!(whole(refill(rate, Some(left), Some(t(0)), next).0), 1);
            let before = Timestamp::from_millis(next.as_millis() - 1);
            if before > t(0) {
                assert_eq!(whole(refill(rate, Some(left), Some(t(0)), before).0), 0);
            }
        }
    }
}
