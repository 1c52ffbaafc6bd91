//! Cron schedules: what a schedule says, and when it is due next. Pure: the caller passes `now`.
//!
//! Patterns are standard 5-field cron (`minute hour day-of-month month day-of-week`) with an
//! optional leading seconds field (6 fields), evaluated in a named IANA time zone.
//!
//! Daylight-saving rule (documented for users):
//! - A fixed local time that does not exist because clocks spring forward (e.g. 02:30 on the
//!   night the clock jumps from 02:00 to 03:00) fires once, at the first valid instant after
//!   the gap. Nothing is silently skipped.
//! - A fixed local time that occurs twice because clocks fall back fires once, at its first
//!   occurrence. Nothing is doubled.
//! - Patterns that repeat within the hour (`*/15 * * * *`, every second…) follow real elapsed
//!   time through both kinds of change.
//!
//! Misfires: a due time more than [`MISFIRE_GRACE`] in the past when the leader gets to it
//! (the server was down) is handled by the schedule's `misfire` rule; due times within the grace
//! are all fired, late, so a short restart leaves no gap.

use std::str::FromStr;

use chrono::{TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};

use crate::spec::{JobSpec, Limits, SpecError};
use crate::time::{Span, Timestamp};

/// Due times further than this in the past are misfires.
pub const MISFIRE_GRACE: Span = Span::from_secs(60);

/// What to do when the schedule was not fired on time by more than [`MISFIRE_GRACE`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Misfire {
    /// Fire once for the whole missed window, then carry on from now.
    #[default]
    Once,
    /// Fire nothing for the missed window; carry on from now.
    Skip,
    /// Fire every missed due time, one after another.
    All,
}

/// Whether a firing may start while the previous job of the schedule is not finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    #[default]
    Skip,
    Allow,
}

/// `POST /v1/schedules` body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// 1 to 200 letters, digits, `-`, `_` or `.`.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,200}$")]
    pub name: String,
    pub cron: String,
    #[serde(default = "utc")]
    pub timezone: String,
    pub job: JobSpec,
    #[serde(default)]
    pub overlap: Overlap,
    #[serde(default)]
    pub misfire: Misfire,
}

fn utc() -> String {
    "UTC".to_string()
}

/// A parsed pattern in its zone.
/// Where the check for patterns that never fire starts looking: 2000-01-01T00:00:00Z.
const NEVER_PROBE: Timestamp = Timestamp(946_684_800_000);

#[derive(Clone, Debug)]
pub struct CronSchedule {
    cron: Cron,
    tz: Tz,
}

impl CronSchedule {
    pub fn parse(pattern: &str, timezone: &str) -> Result<CronSchedule, SpecError> {
        let fields = pattern.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(SpecError::new(
                "cron",
                format!("`{pattern}` has {fields} fields; use 5 (minute hour day month weekday) or 6 (with seconds first)"),
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(pattern)
            .map_err(|e| {
                SpecError::new("cron", format!("`{pattern}` is not a cron pattern: {e}"))
            })?;
        let tz = Tz::from_str(timezone).map_err(|_| {
            SpecError::new(
                "timezone",
                format!("`{timezone}` is not an IANA time zone name (e.g. Europe/Berlin)"),
            )
        })?;
        let schedule = CronSchedule { cron, tz };
        // A pattern can be well formed and still name no real date (`0 0 30 2 *`, February
        // 30th): refuse it rather than store a schedule that never fires. Dates repeat with
        // the weekdays every 400 years, so one search from a fixed instant decides it.
        if schedule.next_after(NEVER_PROBE).is_none() {
            return Err(SpecError::new(
                "cron",
                format!("`{pattern}` never matches a real date, so it would never fire"),
            ));
        }
        Ok(schedule)
    }

    /// The first due time strictly after `after`.
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        // Cron resolves whole seconds: look from the start of `after`'s second, so a fraction
        // of a second is never carried into the due times.
        let whole = after.as_millis().div_euclid(1000) * 1000;
        let t = Utc
            .timestamp_millis_opt(whole)
            .single()?
            .with_timezone(&self.tz);
        let next = self.cron.find_next_occurrence(&t, false).ok()?;
        Some(Timestamp::from_millis(
            next.with_timezone(&Utc).timestamp_millis(),
        ))
    }
}

impl ScheduleSpec {
    pub fn validate(&self, limits: &Limits) -> Result<CronSchedule, SpecError> {
        if self.name.is_empty() || self.name.len() > limits.name_bytes {
            return Err(SpecError::new(
                "name",
                format!("must be 1 to {} bytes", limits.name_bytes),
            ));
        }
        if !self
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(SpecError::new(
                "name",
                "use letters, digits, '-', '_' and '.' only",
            ));
        }
        let schedule = CronSchedule::parse(&self.cron, &self.timezone)?;
        if self.job.idempotency_key.is_some() {
            return Err(SpecError::new(
                "job.idempotency_key",
                "each firing gets its own key from the schedule and due time; leave it out",
            ));
        }
        if self.job.run_at.is_some() {
            return Err(SpecError::new(
                "job.run_at",
                "a scheduled job runs at its due time; leave it out",
            ));
        }
        self.job.validate(limits).map_err(|e| e.within("job."))?;
        Ok(schedule)
    }

    /// The job a firing at `due_at` creates: the schedule's job with an idempotency key derived
    /// from (schedule, due time) and a `schedule` label.
    pub fn job_for(&self, due_at: Timestamp) -> JobSpec {
        let mut job = self.job.clone();
        job.idempotency_key = Some(format!("schedule/{}/{}", self.name, due_at.as_millis()));
        job.labels.insert("schedule".to_string(), self.name.clone());
        job
    }
}

/// What to do with a schedule whose `next_fire_at` is `due`, at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirePlan {
    /// Fire a job for this due time (None: skip this window without a job).
    pub fire: Option<Timestamp>,
    /// Where the schedule goes next.
    pub next: Option<Timestamp>,
}

pub fn plan(schedule: &CronSchedule, misfire: Misfire, due: Timestamp, now: Timestamp) -> FirePlan {
    let late = due.until(now);
    if late <= MISFIRE_GRACE || misfire == Misfire::All {
        return FirePlan {
            fire: Some(due),
            next: schedule.next_after(due),
        };
    }
    // A misfire: resume from now, firing once for the window or not at all.
    let next = schedule.next_after(now);
    match misfire {
        Misfire::Once => FirePlan {
            fire: Some(due),
            next,
        },
        _ => FirePlan { fire: None, next },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    // Proves 5- and 6-field patterns parse and step correctly in UTC.
    // Proves a well-formed pattern naming no real date is refused, naming `cron`, while rare
    // but real dates (February 29th) are kept.
    #[test]
    fn patterns_that_never_fire_are_refused() {
        for never in ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 11 *"] {
            let e = CronSchedule::parse(never, "UTC").expect_err(never);
            assert_eq!(e.field, "cron", "{never}");
        }
        let leap = CronSchedule::parse("0 0 29 2 *", "UTC").expect("February 29th exists");
        assert_eq!(
            leap.next_after(at("2026-01-01T00:00:00Z")),
            Some(at("2028-02-29T00:00:00Z"))
        );
    }

    #[test]
    fn next_times_in_utc() {
        let every_second = CronSchedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(
            every_second.next_after(at("2026-01-01T00:00:00.500Z")),
            Some(at("2026-01-01T00:00:01Z"))
        );
        let hourly = CronSchedule::parse("0 * * * *", "UTC").unwrap();
        assert_eq!(
            hourly.next_after(at("2026-01-01T10:00:00Z")),
            Some(at("2026-01-01T11:00:00Z"))
        );
        assert!(CronSchedule::parse("* * *", "UTC").is_err());
        assert!(CronSchedule::parse("61 * * * *", "UTC").is_err());
        assert_eq!(
            CronSchedule::parse("* * * * *", "Mars/Olympus")
                .unwrap_err()
                .field,
            "timezone"
        );
    }

    // Proves the DST rule in a named zone: a 02:30 daily job fires once at 03:00 on the
    // spring-forward night (not skipped) and once (not twice) on the fall-back night.
    #[test]
    fn daylight_saving_in_berlin() {
        let s = CronSchedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
        // 2026-03-29: clocks jump 02:00 -> 03:00 CET->CEST (01:00Z).
        let spring = s.next_after(at("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(
            spring,
            at("2026-03-29T01:00:00Z"),
            "fires at 03:00 CEST, the first instant after the gap"
        );
        let after = s.next_after(spring).unwrap();
        assert_eq!(
            after,
            at("2026-03-30T00:30:00Z"),
            "then 02:30 CEST the next day"
        );
        // 2026-10-25: clocks fall back 03:00 -> 02:00 CEST->CET; 02:30 happens twice.
        let fall = s.next_after(at("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(fall, at("2026-10-25T00:30:00Z"), "the first 02:30 (CEST)");
        let next = s.next_after(fall).unwrap();
        assert_eq!(
            next,
            at("2026-10-26T01:30:00Z"),
            "not the second 02:30 (CET): next is 02:30 CET on the 26th"
        );
    }

    // Proves the misfire rule: late within the grace fires every due time; beyond it, `once`
    // fires one job and resumes from now, `skip` fires none, `all` catches up one by one.
    #[test]
    fn misfires() {
        let s = CronSchedule::parse("* * * * * *", "UTC").unwrap();
        let due = at("2026-01-01T00:00:00Z");
        let p = plan(&s, Misfire::Once, due, at("2026-01-01T00:00:30Z"));
        assert_eq!(
            p,
            FirePlan {
                fire: Some(due),
                next: Some(at("2026-01-01T00:00:01Z"))
            }
        );
        let now = at("2026-01-01T01:00:00.200Z");
        let p = plan(&s, Misfire::Once, due, now);
        assert_eq!(
            p,
            FirePlan {
                fire: Some(due),
                next: Some(at("2026-01-01T01:00:01Z"))
            }
        );
        let p = plan(&s, Misfire::Skip, due, now);
        assert_eq!(p.fire, None);
        let p = plan(&s, Misfire::All, due, now);
        assert_eq!(p.next, Some(at("2026-01-01T00:00:01Z")));
    }

    // Proves each firing's job gets a key derived from (schedule, due time).
    #[test]
    fn firing_keys() {
        let spec: ScheduleSpec = crate::spec::decode(serde_json::json!({
            "name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
            "job": {"steps": [{"name": "a", "agent": "x"}]}
        }))
        .unwrap();
        spec.validate(&Limits::default()).unwrap();
        let job = spec.job_for(at("2026-01-01T02:00:00Z"));
        assert_eq!(
            job.idempotency_key.as_deref(),
            Some("schedule/nightly/1767232800000")
        );
        assert_eq!(job.labels["schedule"], "nightly");
    }
}
