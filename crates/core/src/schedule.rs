//! Cron schedules: what a schedule says, and when it is due next. Pure: the caller passes `now`.
//!
//! Patterns are standard 5-field cron (`minute hour day-of-month month day-of-week`) with an
//! optional leading seconds field (6 fields), evaluated in a named IANA time zone, or one of the
//! macros of [`MACROS`] (`@hourly`, `@daily` or `@midnight`, `@weekly`, `@monthly`, `@yearly`
//! or `@annually`), which stand for the 5-field pattern they name, in the schedule's zone.
//!
//! A schedule can be replaced (`PUT /v1/schedules/{name}`): [`replan`] decides its next due
//! time, never at or before a due time that already fired.
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

/// Where the check for patterns that never fire starts looking: 2000-01-01T00:00:00Z.
const NEVER_PROBE: Timestamp = Timestamp(946_684_800_000);

/// The cron macros and the 5-field patterns they stand for (matched without regard to case).
pub const MACROS: [(&str, &str); 7] = [
    ("@hourly", "0 * * * *"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@weekly", "0 0 * * 0"),
    ("@monthly", "0 0 1 * *"),
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
];

/// The pattern a schedule's `cron` stands for: a macro's expansion, else the text itself.
fn expand(pattern: &str) -> Result<&str, SpecError> {
    let trimmed = pattern.trim();
    if !trimmed.starts_with('@') {
        return Ok(pattern);
    }
    if let Some((_, expansion)) = MACROS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(trimmed))
    {
        return Ok(expansion);
    }
    let why = if trimmed.eq_ignore_ascii_case("@reboot") {
        "names no time of day (a schedule fires while the server runs, not when it starts)"
    } else {
        "is not a cron macro"
    };
    Err(SpecError::new(
        "cron",
        format!("`{trimmed}` {why}; use @hourly, @daily (or @midnight), @weekly, @monthly, @yearly (or @annually), or a 5- or 6-field pattern"),
    ))
}

/// A parsed pattern in its zone.
#[derive(Clone, Debug)]
pub struct CronSchedule {
    cron: Cron,
    tz: Tz,
}

impl CronSchedule {
    pub fn parse(given: &str, timezone: &str) -> Result<CronSchedule, SpecError> {
        let pattern = expand(given)?;
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
                format!("`{given}` never matches a real date, so it would never fire"),
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

/// Where a schedule stands in time, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub paused: bool,
    pub next_fire_at: Option<Timestamp>,
    /// The latest due time that fired (a job was created for it).
    pub last_fire_at: Option<Timestamp>,
}

/// The next due time of a schedule whose definition goes from `old` to `new` (`cron` is `new`'s
/// pattern, parsed) at `now`:
/// - a paused schedule stays paused (no due time until it is resumed);
/// - when the pattern and the zone are unchanged, the stored next due time is kept (changing
///   only the job body, `overlap` or `misfire` moves nothing, and a due time that has come but
///   was not fired yet is still fired);
/// - otherwise the first due time of the new pattern in the new zone after now.
///
/// Either way the answer is after the last due time that fired, so no due time fires twice.
pub fn replan(
    old: &ScheduleSpec,
    new: &ScheduleSpec,
    cron: &CronSchedule,
    timing: Timing,
    now: Timestamp,
) -> Option<Timestamp> {
    if timing.paused {
        return None;
    }
    let fired = timing.last_fire_at;
    let after_fired = |t: Timestamp| fired.is_none_or(|f| t > f);
    let same_times = old.cron == new.cron && old.timezone == new.timezone;
    if let Some(kept) = timing
        .next_fire_at
        .filter(|t| same_times && after_fired(*t))
    {
        return Some(kept);
    }
    let from = fired.map_or(now, |f| f.max(now));
    let next = cron.next_after(from);
    debug_assert!(
        next.is_none_or(after_fired),
        "a fired due time would fire again"
    );
    next
}

/// The first due time after `now` for a schedule that resumes, after the last that fired.
pub fn resume_at(
    cron: &CronSchedule,
    last_fire_at: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    cron.next_after(last_fire_at.map_or(now, |f| f.max(now)))
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

    // Proves the cron macros: each stands for its 5-field pattern (whatever its case), is
    // evaluated in the schedule's zone, passes a schedule's validation, and an unknown macro or
    // `@reboot` is refused naming `cron`.
    #[test]
    fn macros_expand_in_the_schedules_zone() {
        let from = at("2026-01-14T10:20:00Z"); // a Wednesday
        for (pattern, zone, next) in [
            ("@hourly", "UTC", "2026-01-14T11:00:00Z"),
            ("@daily", "UTC", "2026-01-15T00:00:00Z"),
            ("@midnight", "UTC", "2026-01-15T00:00:00Z"),
            ("@DAILY", "UTC", "2026-01-15T00:00:00Z"),
            ("  @daily ", "UTC", "2026-01-15T00:00:00Z"),
            ("@daily", "Europe/Berlin", "2026-01-14T23:00:00Z"),
            ("@weekly", "UTC", "2026-01-18T00:00:00Z"),
            ("@monthly", "UTC", "2026-02-01T00:00:00Z"),
            ("@yearly", "UTC", "2027-01-01T00:00:00Z"),
            ("@annually", "America/New_York", "2027-01-01T05:00:00Z"),
            ("@hourly", "Asia/Kolkata", "2026-01-14T10:30:00Z"),
        ] {
            let s = CronSchedule::parse(pattern, zone).expect(pattern);
            assert_eq!(s.next_after(from), Some(at(next)), "{pattern} in {zone}");
        }
        for (name, expansion) in MACROS {
            let a = CronSchedule::parse(name, "UTC").unwrap();
            let b = CronSchedule::parse(expansion, "UTC").unwrap();
            assert_eq!(a.next_after(from), b.next_after(from), "{name}");
        }
        for bad in ["@fortnightly", "@reboot", "@daily 5", "@"] {
            let e = CronSchedule::parse(bad, "UTC").expect_err(bad);
            assert_eq!(e.field, "cron", "{bad}");
            assert!(e.message.contains("@hourly"), "{bad}: {}", e.message);
        }
        let spec: ScheduleSpec = crate::spec::decode(serde_json::json!({
            "name": "nightly", "cron": "@daily", "timezone": "Europe/Berlin",
            "job": {"steps": [{"name": "a", "agent": "x"}]}
        }))
        .unwrap();
        spec.validate(&Limits::default())
            .expect("a macro is a valid cron");
    }

    fn spec_with(cron: &str, zone: &str) -> ScheduleSpec {
        crate::spec::decode(serde_json::json!({
            "name": "s", "cron": cron, "timezone": zone,
            "job": {"steps": [{"name": "a", "agent": "x"}]}
        }))
        .unwrap()
    }

    fn timing(next: Option<&str>, last: Option<&str>) -> Timing {
        Timing {
            paused: false,
            next_fire_at: next.map(at),
            last_fire_at: last.map(at),
        }
    }

    /// The next due time after replacing `old` by `new` at `now`.
    fn replanned(
        old: &ScheduleSpec,
        new: &ScheduleSpec,
        t: Timing,
        now: &str,
    ) -> Option<Timestamp> {
        let cron = new.validate(&Limits::default()).unwrap();
        replan(old, new, &cron, t, at(now))
    }

    // Proves a replaced schedule's next due time: a new pattern counts from now; the same
    // pattern and zone keep the stored due time, even one that has come and not fired yet; a
    // paused schedule stays without one.
    #[test]
    fn replan_counts_a_new_pattern_from_now() {
        let hourly = spec_with("0 * * * *", "UTC");
        let every5 = spec_with("*/5 * * * *", "UTC");
        let t = timing(Some("2026-01-14T11:00:00Z"), Some("2026-01-14T10:00:00Z"));
        assert_eq!(
            replanned(&hourly, &every5, t, "2026-01-14T10:20:30Z"),
            Some(at("2026-01-14T10:25:00Z"))
        );
        let mut body_only = hourly.clone();
        body_only.job.priority = 5;
        body_only.misfire = Misfire::Skip;
        let overdue = timing(Some("2026-01-14T11:00:00Z"), Some("2026-01-14T10:00:00Z"));
        assert_eq!(
            replanned(&hourly, &body_only, overdue, "2026-01-14T11:00:20Z"),
            Some(at("2026-01-14T11:00:00Z")),
            "a due time that came and has not fired is still fired"
        );
        let paused = Timing {
            paused: true,
            next_fire_at: None,
            ..t
        };
        assert_eq!(
            replanned(&hourly, &every5, paused, "2026-01-14T10:20:30Z"),
            None
        );
        // A macro and the pattern it stands for are different text: the time is recomputed,
        // and lands where the stored one was.
        let daily = spec_with("0 0 * * *", "UTC");
        let macro_daily = spec_with("@daily", "UTC");
        let t = timing(Some("2026-01-15T00:00:00Z"), None);
        assert_eq!(
            replanned(&daily, &macro_daily, t, "2026-01-14T10:20:30Z"),
            Some(at("2026-01-15T00:00:00Z"))
        );
    }

    // Proves a due time that fired never fires again after a replacement: when the node's
    // clock is behind the last firing (another node fired it), or a zone change maps the new
    // pattern onto the very instant that fired, the next due time is the one after it.
    #[test]
    fn replan_never_repeats_a_fired_due_time() {
        let nine_utc = spec_with("0 9 * * *", "UTC");
        let nine_london = spec_with("0 9 * * *", "Europe/London");
        // 09:00 in London in January is 09:00Z, which fired; this node's clock reads 08:59:59.
        let t = timing(Some("2026-01-15T09:00:00Z"), Some("2026-01-14T09:00:00Z"));
        let fired = timing(Some("2026-01-15T09:00:00Z"), Some("2026-01-14T09:00:00Z"));
        assert_eq!(
            replanned(&nine_utc, &nine_london, t, "2026-01-14T08:59:59Z"),
            Some(at("2026-01-15T09:00:00Z"))
        );
        let nine_30 = spec_with("30 8,9 * * *", "UTC");
        assert_eq!(
            replanned(&nine_utc, &nine_30, fired, "2026-01-14T08:29:00Z"),
            Some(at("2026-01-14T09:30:00Z")),
            "08:30 is after now but not after 09:00, which fired"
        );
        // A stored due time at or before the last firing is never kept either.
        let stale = timing(Some("2026-01-14T09:00:00Z"), Some("2026-01-14T09:00:00Z"));
        assert_eq!(
            replanned(&nine_utc, &nine_utc, stale, "2026-01-14T08:00:00Z"),
            Some(at("2026-01-15T09:00:00Z"))
        );
    }

    // Proves a zone change is counted in the new zone, through daylight saving: 09:00 moved from
    // UTC to Berlin is 08:00Z in winter (already past, so tomorrow's); 02:30 moved to Berlin on
    // the spring-forward night fires once at 03:00 CEST, and on the fall-back night once at the
    // first 02:30, never again at the repeated one after it fired.
    #[test]
    fn replan_follows_a_zone_change_through_daylight_saving() {
        let nine_utc = spec_with("0 9 * * *", "UTC");
        let nine_berlin = spec_with("0 9 * * *", "Europe/Berlin");
        let t = timing(Some("2026-01-14T09:00:00Z"), Some("2026-01-13T09:00:00Z"));
        assert_eq!(
            replanned(&nine_utc, &nine_berlin, t, "2026-01-14T08:30:00Z"),
            Some(at("2026-01-15T08:00:00Z"))
        );
        assert_eq!(
            replanned(&nine_utc, &nine_berlin, t, "2026-07-14T06:30:00Z"),
            Some(at("2026-07-14T07:00:00Z")),
            "summer time: 09:00 CEST is 07:00Z"
        );
        let night_utc = spec_with("30 2 * * *", "UTC");
        let night_berlin = spec_with("30 2 * * *", "Europe/Berlin");
        let t = timing(Some("2026-03-29T02:30:00Z"), Some("2026-03-28T02:30:00Z"));
        assert_eq!(
            replanned(&night_utc, &night_berlin, t, "2026-03-28T12:00:00Z"),
            Some(at("2026-03-29T01:00:00Z")),
            "02:30 does not exist that night: 03:00 CEST"
        );
        // Fall back: the first 02:30 (00:30Z) fired under a Berlin pattern; moving to another
        // pattern in Berlin at 00:40Z does not fire the repeated 02:30 (01:30Z).
        let half_past = spec_with("30 * * * *", "Europe/Berlin");
        let t = timing(Some("2026-10-25T01:30:00Z"), Some("2026-10-25T00:30:00Z"));
        assert_eq!(
            replanned(&half_past, &night_berlin, t, "2026-10-25T00:40:00Z"),
            Some(at("2026-10-26T01:30:00Z"))
        );
        // And resuming follows the same floor.
        let cron = CronSchedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            resume_at(
                &cron,
                Some(at("2026-10-25T00:30:00Z")),
                at("2026-10-25T00:10:00Z")
            ),
            Some(at("2026-10-26T01:30:00Z"))
        );
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
