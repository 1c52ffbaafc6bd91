//! Cron schedules as rows, and firing one due time exactly once (fenced, compare-and-set on
//! `next_fire_at`, the job inserted idempotently in the same transaction).

use super::tx::Transaction;
use overseer_core::schedule::ScheduleSpec;
use overseer_core::{JobId, JobState, Timestamp};
use tokio_postgres::Row;
use uuid::Uuid;

use super::leader::check_fence;
use super::rows::{self, corrupt, get, limit_param, ms, query, query_opt};
use super::{jobs, Failure, PgStore, Res};
use crate::decide::{self, FirePlan};
use crate::{
    Due, Error, Fence, Fire, FireOutcome, Result, Schedule, ScheduleCreated, SchedulePause,
    ScheduleUpdate, Schedules,
};

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

async fn schedule_create(tx: &Transaction<'_>, schedule: &Schedule) -> Res<ScheduleCreated> {
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
        return Ok(ScheduleCreated {
            schedule: schedule_from_row(&row)?,
            created: true,
        });
    }
    let existing = schedule_get(tx, &schedule.name, false)
        .await?
        .ok_or_else(|| Failure::Retry(format!("schedule `{}` vanished", schedule.name)))?;
    if existing.spec == schedule.spec {
        Ok(ScheduleCreated {
            schedule: existing,
            created: false,
        })
    } else {
        Err(Failure::Store(Error::ScheduleConflict(
            schedule.name.clone(),
        )))
    }
}

async fn schedule_get(tx: &Transaction<'_>, name: &str, for_update: bool) -> Res<Option<Schedule>> {
    let sql = if for_update {
        format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = $1 FOR UPDATE")
    } else {
        format!("SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = $1")
    };
    let row = query_opt(tx, &sql, &[&name]).await?;
    row.as_ref().map(schedule_from_row).transpose()
}

async fn schedules_list(tx: &Transaction<'_>) -> Res<Vec<Schedule>> {
    let rows = query(
        tx,
        &format!("SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name"),
        &[],
    )
    .await?;
    rows.iter().map(schedule_from_row).collect()
}

async fn schedule_delete(tx: &Transaction<'_>, name: &str) -> Res<bool> {
    let n = rows::execute(tx, "DELETE FROM schedules WHERE name = $1", &[&name]).await?;
    Ok(n > 0)
}

async fn schedule_set_paused(
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

/// Replaces the definition; the row is locked first, so a firing of the same schedule waits for
/// this transaction and then finds its due time moved or its definition changed (stale), or
/// went first and left `last_fire_at` for the core to keep clear of.
async fn schedule_update(tx: &Transaction<'_>, update: &ScheduleUpdate) -> Res<Schedule> {
    let name = &update.spec.name;
    let Some(stored) = schedule_get(tx, name, true).await? else {
        return Err(Failure::Store(Error::ScheduleNotFound(name.clone())));
    };
    let Some(next) = decide::replanned(&stored, update) else {
        return Ok(stored);
    };
    let spec = serde_json::to_string(&update.spec).map_err(|e| corrupt("schedules.spec", e))?;
    let row = query_opt(
        tx,
        &format!(
            "UPDATE schedules SET spec = $2, next_fire_at = $3, updated_at = $4 \
             WHERE name = $1 RETURNING {SCHEDULE_COLUMNS}"
        ),
        &[name, &spec, &ms(next), &update.now.as_millis()],
    )
    .await?
    .ok_or_else(|| Failure::Retry(format!("schedule `{name}` vanished")))?;
    schedule_from_row(&row)
}

async fn schedules_due(tx: &Transaction<'_>, now: Timestamp, limit: usize) -> Res<Vec<Schedule>> {
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

/// Fires one due time (see [`crate::Schedules::schedule_fire`]): the fence and the schedule row are
/// locked first, so of any number of nodes firing the same due time exactly one finds it still
/// due.
async fn schedule_fire(
    tx: &Transaction<'_>,
    fire: &Fire,
    fence: &Fence,
    history_per_job: usize,
) -> Res<FireOutcome> {
    check_fence(tx, fence, fire.now).await?;
    let Some(schedule) = schedule_get(tx, &fire.name, true).await? else {
        return Err(Failure::Store(Error::ScheduleNotFound(fire.name.clone())));
    };
    if decide::firing_is_stale(&schedule, fire) {
        return Ok(FireOutcome::Stale);
    }
    let holder = match decide::overlap_holder(&schedule) {
        Some(id) => Some((id, job_state(tx, id).await?)),
        None => None,
    };
    let job = match (decide::fire_plan(fire, holder), &fire.job) {
        (FirePlan::Fire, Some(job)) => job,
        (FirePlan::Skip { running }, _) => {
            pass(tx, fire).await?;
            return Ok(FireOutcome::Skipped { running });
        }
        _ => {
            pass(tx, fire).await?;
            return Ok(FireOutcome::Passed);
        }
    };
    let keys = job
        .transition
        .job
        .ordering_key
        .as_deref()
        .into_iter()
        .collect();
    jobs::lock_ordering_keys(tx, keys).await?;
    let submitted = jobs::submit_one(tx, 0, job, history_per_job).await?;
    advance(tx, fire, submitted.job().id).await?;
    Ok(FireOutcome::Fired(submitted))
}

/// The job's state as stored; `None` when it is gone.
async fn job_state(tx: &Transaction<'_>, id: JobId) -> Res<Option<JobState>> {
    let Some(row) = query_opt(tx, "SELECT state FROM jobs WHERE id = $1", &[&id.0]).await? else {
        return Ok(None);
    };
    let state: String = get(&row, 0, "jobs.state")?;
    JobState::parse(&state)
        .map(Some)
        .ok_or_else(|| corrupt("jobs.state", &state))
}

/// Moves a schedule past a due time without a job.
async fn pass(tx: &Transaction<'_>, fire: &Fire) -> Res<()> {
    rows::execute(
        tx,
        "UPDATE schedules SET next_fire_at = $2, updated_at = $3 WHERE name = $1",
        &[&fire.name, &ms(fire.next_fire_at), &fire.now.as_millis()],
    )
    .await?;
    Ok(())
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

#[async_trait::async_trait]
impl Schedules for PgStore {
    async fn schedule_create(&self, schedule: Schedule) -> Result<ScheduleCreated> {
        let schedule = &schedule;
        self.write(move |tx, _| Box::pin(schedule_create(tx, schedule)))
            .await
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        self.read(move |tx, _| Box::pin(schedule_get(tx, name, false)))
            .await
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        self.read(|tx, _| Box::pin(schedules_list(tx))).await
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        self.write(move |tx, _| Box::pin(schedule_delete(tx, name)))
            .await
    }

    async fn schedule_set_paused(&self, pause: SchedulePause) -> Result<Schedule> {
        let p = &pause;
        self.write(move |tx, _| {
            Box::pin(schedule_set_paused(
                tx,
                &p.name,
                p.paused,
                p.next_fire_at,
                p.now,
            ))
        })
        .await
    }

    async fn schedule_update(&self, update: ScheduleUpdate) -> Result<Schedule> {
        let update = &update;
        self.write(move |tx, _| Box::pin(schedule_update(tx, update)))
            .await
    }

    async fn schedules_due(&self, due: Due) -> Result<Vec<Schedule>> {
        self.read(move |tx, _| Box::pin(schedules_due(tx, due.now, due.limit)))
            .await
    }

    async fn schedule_fire(&self, fire: Fire, fence: &Fence) -> Result<FireOutcome> {
        let history = self.inner.history_per_job;
        let fire = &fire;
        self.write(move |tx, _| Box::pin(schedule_fire(tx, fire, fence, history)))
            .await
    }
}
