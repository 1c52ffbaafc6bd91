//! Cron schedules as rows, and firing one due time exactly once.
//!
//! A firing is one write transaction: the leader fence, the check that the due time being fired
//! is still the schedule's `next_fire_at`, the overlap rule, the job's insert (idempotent on the
//! key derived from the schedule and due time) and the schedule's advance. Racing firings of the
//! same due time find `next_fire_at` moved and write nothing, so none is doubled; a crash before
//! the commit leaves the due time in place to be fired again, so none is lost.

use overseer_core::schedule::ScheduleSpec;
use overseer_core::{JobId, JobState, Timestamp};
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::jobs::submit_jobs;
use super::rows::{self, DbResult};
use super::{leader, SqliteStore};
use crate::decide::{self, FirePlan};
use crate::{
    Due, Error, Fence, Fire, FireOutcome, Result, Schedule, ScheduleCreated, SchedulePause,
    ScheduleUpdate, Schedules,
};

const COLUMNS: &str =
    "name, spec, paused, next_fire_at, last_fire_at, last_job_id, created_at, updated_at";

fn from_row(row: &Row<'_>) -> Result<Schedule> {
    let name: String = row.get(0).db()?;
    let spec: String = row.get(1).db()?;
    let last_job_id: Option<String> = row.get(5).db()?;
    Ok(Schedule {
        spec: serde_json::from_str::<ScheduleSpec>(&spec)
            .map_err(|e| Error::Corrupt(format!("schedules.spec of `{name}`: {e}")))?,
        paused: row.get(2).db()?,
        next_fire_at: row
            .get::<_, Option<i64>>(3)
            .db()?
            .map(Timestamp::from_millis),
        last_fire_at: row
            .get::<_, Option<i64>>(4)
            .db()?
            .map(Timestamp::from_millis),
        last_job_id: last_job_id
            .map(|id| {
                id.parse::<JobId>().map_err(|e| {
                    Error::Corrupt(format!("schedules.last_job_id of `{name}`: `{id}`: {e}"))
                })
            })
            .transpose()?,
        created_at: Timestamp::from_millis(row.get(6).db()?),
        updated_at: Timestamp::from_millis(row.get(7).db()?),
        name,
    })
}

fn get(conn: &Connection, name: &str) -> Result<Option<Schedule>> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"))
        .db()?;
    let mut rows = stmt.query([name]).db()?;
    match rows.next().db()? {
        Some(row) => from_row(row).map(Some),
        None => Ok(None),
    }
}

fn collect(mut rows: rusqlite::Rows<'_>) -> Result<Vec<Schedule>> {
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        out.push(from_row(row)?);
    }
    Ok(out)
}

/// Every schedule, by name.
fn list(conn: &Connection) -> Result<Vec<Schedule>> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM schedules ORDER BY name"))
        .db()?;
    let out = collect(stmt.query([]).db()?)?;
    Ok(out)
}

/// Unpaused schedules whose `next_fire_at` has come, earliest first, then by name.
fn due(conn: &Connection, now: Timestamp, limit: usize) -> Result<Vec<Schedule>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM schedules INDEXED BY schedules_due \
             WHERE paused = 0 AND next_fire_at <= ?1 ORDER BY next_fire_at, name LIMIT ?2"
        ))
        .db()?;
    let out = collect(
        stmt.query(params![now.as_millis(), rows::limit_param(limit)])
            .db()?,
    )?;
    Ok(out)
}

fn spec_text(schedule: &Schedule) -> Result<String> {
    serde_json::to_string(&schedule.spec).map_err(|e| {
        Error::Corrupt(format!(
            "schedule `{}` cannot be encoded: {e}",
            schedule.name
        ))
    })
}

/// Inserts the schedule as given; the same name with an equal spec answers the stored one and
/// `false`, another spec is [`Error::ScheduleConflict`].
fn create(conn: &Connection, schedule: Schedule) -> Result<ScheduleCreated> {
    if let Some(stored) = get(conn, &schedule.name)? {
        return if stored.spec == schedule.spec {
            Ok(ScheduleCreated {
                schedule: stored,
                created: false,
            })
        } else {
            Err(Error::ScheduleConflict(schedule.name))
        };
    }
    conn.prepare_cached(&format!(
        "INSERT INTO schedules ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
    ))
    .db()?
    .execute(params![
        schedule.name,
        spec_text(&schedule)?,
        schedule.paused,
        schedule.next_fire_at.map(Timestamp::as_millis),
        schedule.last_fire_at.map(Timestamp::as_millis),
        schedule.last_job_id.map(rows::job_id_text),
        schedule.created_at.as_millis(),
        schedule.updated_at.as_millis(),
    ])
    .db()?;
    Ok(ScheduleCreated {
        schedule,
        created: true,
    })
}

fn delete(conn: &Connection, name: &str) -> Result<bool> {
    let n = conn
        .prepare_cached("DELETE FROM schedules WHERE name = ?1")
        .db()?
        .execute([name])
        .db()?;
    Ok(n > 0)
}

/// Sets `paused` and `next_fire_at` exactly as given.
fn set_paused(conn: &Connection, pause: &SchedulePause) -> Result<Schedule> {
    let SchedulePause {
        name,
        paused,
        next_fire_at,
        now,
    } = pause;
    let n = conn
        .prepare_cached(
            "UPDATE schedules SET paused = ?2, next_fire_at = ?3, updated_at = ?4 WHERE name = ?1",
        )
        .db()?
        .execute(params![
            name,
            paused,
            next_fire_at.map(Timestamp::as_millis),
            now.as_millis()
        ])
        .db()?;
    if n == 0 {
        return Err(Error::ScheduleNotFound(name.clone()));
    }
    get(conn, name)?.ok_or_else(|| Error::ScheduleNotFound(name.clone()))
}

/// Replaces the definition and sets the next due time the core decides from the row as it is
/// now (in the writer's transaction, so no firing can come between the read and the write).
fn update(conn: &Connection, update: ScheduleUpdate) -> Result<Schedule> {
    let name = update.spec.name.clone();
    let stored = get(conn, &name)?.ok_or_else(|| Error::ScheduleNotFound(name.clone()))?;
    let Some(next) = decide::replanned(&stored, &update) else {
        return Ok(stored);
    };
    let replaced = Schedule {
        spec: update.spec,
        next_fire_at: next,
        updated_at: update.now,
        ..stored
    };
    conn.prepare_cached(
        "UPDATE schedules SET spec = ?2, next_fire_at = ?3, updated_at = ?4 WHERE name = ?1",
    )
    .db()?
    .execute(params![
        name,
        spec_text(&replaced)?,
        next.map(Timestamp::as_millis),
        update.now.as_millis()
    ])
    .db()?;
    Ok(replaced)
}

/// The job's state as stored; `None` when it is gone.
fn job_state(conn: &Connection, id: JobId) -> Result<Option<JobState>> {
    let state: Option<String> = conn
        .prepare_cached("SELECT state FROM jobs WHERE id = ?1")
        .db()?
        .query_row([rows::job_id_text(id)], |r| r.get(0))
        .optional()
        .db()?;
    state
        .map(|s| JobState::parse(&s).ok_or_else(|| Error::Corrupt(format!("jobs.state `{s}`"))))
        .transpose()
}

/// Fires one due time as `decide::fire_plan` says; see the module's description. `Stale`,
/// `Skipped` and `Passed` write nothing but what they say (nothing, and the advance of
/// `next_fire_at`).
fn fire(
    conn: &Connection,
    fire: Fire,
    fence: &Fence,
    history_per_job: usize,
) -> Result<FireOutcome> {
    leader::check_fence(conn, fence, fire.now)?;
    let schedule =
        get(conn, &fire.name)?.ok_or_else(|| Error::ScheduleNotFound(fire.name.clone()))?;
    if decide::firing_is_stale(&schedule, &fire) {
        return Ok(FireOutcome::Stale);
    }
    let holder = match decide::overlap_holder(&schedule) {
        Some(id) => Some((id, job_state(conn, id)?)),
        None => None,
    };
    let next = fire.next_fire_at.map(Timestamp::as_millis);
    let job = match (decide::fire_plan(&fire, holder), fire.job) {
        (FirePlan::Fire, Some(job)) => job,
        (plan, _) => {
            conn.prepare_cached(
                "UPDATE schedules SET next_fire_at = ?2, updated_at = ?3 WHERE name = ?1",
            )
            .db()?
            .execute(params![fire.name, next, fire.now.as_millis()])
            .db()?;
            return Ok(match plan {
                FirePlan::Skip { running } => FireOutcome::Skipped { running },
                _ => FireOutcome::Passed,
            });
        }
    };
    let submitted = submit_jobs(conn, vec![job], history_per_job)?
        .pop()
        .ok_or_else(|| Error::Corrupt("a firing's submit answered nothing".into()))?;
    let job_id = submitted.job().id;
    conn.prepare_cached(
        "UPDATE schedules SET next_fire_at = ?2, last_fire_at = ?3, last_job_id = ?4, \
         updated_at = ?5 WHERE name = ?1",
    )
    .db()?
    .execute(params![
        fire.name,
        next,
        fire.due_at.as_millis(),
        rows::job_id_text(job_id),
        fire.now.as_millis()
    ])
    .db()?;
    Ok(FireOutcome::Fired(submitted))
}

#[async_trait::async_trait]
impl Schedules for SqliteStore {
    async fn schedule_create(&self, schedule: Schedule) -> Result<ScheduleCreated> {
        self.write(move |conn| create(conn, schedule)).await
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        let name = name.to_string();
        self.read(move |conn| get(conn, &name)).await
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        self.read(list).await
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.write(move |conn| delete(conn, &name)).await
    }

    async fn schedule_set_paused(&self, pause: SchedulePause) -> Result<Schedule> {
        self.write(move |conn| set_paused(conn, &pause)).await
    }

    async fn schedule_update(&self, update: ScheduleUpdate) -> Result<Schedule> {
        self.write(move |conn| self::update(conn, update)).await
    }

    async fn schedules_due(&self, due: Due) -> Result<Vec<Schedule>> {
        if due.limit == 0 {
            return Ok(Vec::new());
        }
        self.read(move |conn| self::due(conn, due.now, due.limit))
            .await
    }

    async fn schedule_fire(&self, fire: Fire, fence: &Fence) -> Result<FireOutcome> {
        let history = self.inner.history_per_job;
        let fence = fence.clone();
        self.write(move |conn| self::fire(conn, fire, &fence, history))
            .await
    }
}
