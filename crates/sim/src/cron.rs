//! The cron schedule some seeds run beside their jobs, and operators who replace its definition
//! (`PUT /v1/schedules/{name}`) while it runs: what the server answered about it, and the check
//! that it fired exactly once per due time of the definition in force, never a due time twice.
//!
//! The schedule overlaps and catches up (`overlap: allow`, `misfire: all`), so while one
//! definition is in force every one of its due times fires, in order. Each definition is a
//! *segment*: from the first due time the server announced for it (`next_fire_at` in the answer
//! to the create or the replacement) to the last due time that had fired when the next
//! replacement came (`last_fire_at` in that answer). The due times fired must be exactly each
//! closed segment's due times in that range, then the open segment's up to the last complete
//! leader sweep (and perhaps a few more, in order, up to the schedule's deletion). Every job a
//! firing made carries the version of the definition its due time belongs to.

use overseer_core::schedule::CronSchedule;
use overseer_core::Timestamp;
use serde_json::{json, Value};

use crate::model::Check;

pub const CRON_NAME: &str = "tick";
/// The patterns an operator moves between: overlapping ones (every :00, :30, every 20 s) and a
/// macro that never comes due within a run.
pub const PATTERNS: [&str; 4] = ["0 * * * * *", "30 * * * * *", "0/20 * * * * *", "@hourly"];

/// One definition while it was in force.
struct Segment {
    pattern: &'static str,
    cron: CronSchedule,
    version: u64,
    /// The first due time announced for it.
    first_due: Option<Timestamp>,
    /// Once replaced: the last due time that had fired by then (of this or an earlier one).
    closed: Option<Option<Timestamp>>,
}

impl Segment {
    /// Whether a firing of `due` belongs to this definition.
    fn covers(&self, due: Timestamp) -> bool {
        let started = self.first_due.is_some_and(|f| f <= due);
        started
            && self
                .closed
                .is_none_or(|last| last.is_some_and(|l| due <= l))
    }
}

/// What is known of the schedule.
pub struct CronState {
    segments: Vec<Segment>,
    /// The last leader sweep that ran to its end while the schedule existed.
    pub swept_until: Option<Timestamp>,
    pub deleted_at: Option<Timestamp>,
}

fn timestamp(v: &Value, field: &str) -> Check<Option<Timestamp>> {
    if v[field].is_null() {
        return Ok(None);
    }
    serde_json::from_value(v[field].clone())
        .map(Some)
        .map_err(|e| format!("the schedule's {field} does not parse: {e}: {v}"))
}

fn parse(pattern: &str) -> Check<CronSchedule> {
    CronSchedule::parse(pattern, "UTC").map_err(|e| format!("`{pattern}`: {e}"))
}

impl CronState {
    /// The definition the operator sends: `pattern`, and a job that says its `version`.
    pub fn body(pattern: &str, version: u64, agent: &str) -> Value {
        json!({
            "name": CRON_NAME,
            "cron": pattern,
            "overlap": "allow",
            "misfire": "all",
            "job": {"steps": [{"name": "tick", "agent": agent, "timeout": "5s",
                "max_attempts": 2, "payload": {"v": version}}]},
        })
    }

    /// The schedule as created with `pattern` (version 0), from the server's answer.
    pub fn created(pattern: &'static str, answer: &Value) -> Check<CronState> {
        Ok(CronState {
            segments: vec![Segment {
                pattern,
                cron: parse(pattern)?,
                version: 0,
                first_due: timestamp(answer, "next_fire_at")?,
                closed: None,
            }],
            swept_until: None,
            deleted_at: None,
        })
    }

    fn open(&self) -> &Segment {
        self.segments.last().expect("a schedule has a definition")
    }

    pub fn pattern(&self) -> &'static str {
        self.open().pattern
    }

    pub fn next_version(&self) -> u64 {
        self.open().version + 1
    }

    /// The definition was replaced at `now` by `pattern` (`version`), answered `answer`. The new
    /// first due time comes after every due time that fired; with a new pattern it is the
    /// pattern's first due time after now (and after the last firing), with the same pattern
    /// it is the due time that was next under the old definition.
    pub fn replaced(
        &mut self,
        pattern: &'static str,
        version: u64,
        answer: &Value,
        now: Timestamp,
    ) -> Check {
        let last = timestamp(answer, "last_fire_at")?;
        let next = timestamp(answer, "next_fire_at")?;
        if answer["cron"] != pattern || answer["job"]["steps"][0]["payload"]["v"] != version {
            return Err(format!(
                "the schedule replaced by `{pattern}` (version {version}) answered {answer}"
            ));
        }
        if let (Some(n), Some(l)) = (next, last) {
            if n <= l {
                return Err(format!(
                    "replaced at {now}: next due time {n} is not after {l}, which already fired: a due time would fire twice"
                ));
            }
        }
        let old = self.open();
        let expected = if old.pattern == pattern {
            match (old.first_due, last) {
                (Some(first), Some(l)) if l >= first => old.cron.next_after(l),
                (first, _) => first,
            }
        } else {
            let cron = parse(pattern)?;
            cron.next_after(last.map_or(now, |l| l.max(now)))
        };
        if next != expected {
            return Err(format!(
                "replaced at {now} from `{}` to `{pattern}` (last fired {last:?}): next due time {next:?}, expected {expected:?}",
                old.pattern
            ));
        }
        if let Some(open) = self.segments.last_mut() {
            open.closed = Some(last);
        }
        self.segments.push(Segment {
            pattern,
            cron: parse(pattern)?,
            version,
            first_due: next,
            closed: None,
        });
        Ok(())
    }

    /// A job the schedule made for `due` carries the version of the definition `due` belongs
    /// to (`payload` is its step's): no firing planned under a replaced definition made a job.
    pub fn check_job(&self, due: Timestamp, payload: &Value) -> Check {
        let Some(segment) = self.segments.iter().find(|s| s.covers(due)) else {
            return Err(format!(
                "the schedule fired for {due}, a due time of none of its definitions"
            ));
        };
        if payload["v"] != segment.version {
            return Err(format!(
                "the schedule's job for {due} carries {payload}, but the definition in force then was version {} (`{}`)",
                segment.version, segment.pattern
            ));
        }
        Ok(())
    }

    /// Every due time of each definition fired exactly once while it was in force, up to the
    /// last complete leader sweep; later ones only in order and not after the deletion.
    /// `fired`: the due times of the jobs made, in milliseconds, sorted.
    pub fn check_fired(&self, fired: &[i64]) -> Check {
        let mut expected = Vec::new();
        let mut chain = |cron: &CronSchedule, from: Option<Timestamp>, to: Timestamp| {
            let mut due = from;
            while let Some(d) = due.filter(|d| *d <= to) {
                expected.push(d.as_millis());
                due = cron.next_after(d);
            }
            due
        };
        let mut next = None;
        for s in &self.segments {
            next = match s.closed {
                Some(last) => last.map_or(s.first_due, |l| chain(&s.cron, s.first_due, l)),
                None => match self.swept_until {
                    Some(until) => chain(&s.cron, s.first_due, until),
                    None => s.first_due,
                },
            };
        }
        let shown = || {
            let patterns: Vec<&str> = self.segments.iter().map(|s| s.pattern).collect();
            format!("the schedule (definitions {patterns:?}) fired at {fired:?}")
        };
        if fired.len() < expected.len() || fired[..expected.len()] != expected[..] {
            return Err(format!(
                "{}; expected exactly once at each of {expected:?} (and maybe later ones)",
                shown()
            ));
        }
        // After the last complete leader sweep: only the open definition's next ones, in order.
        let cron = &self.open().cron;
        let deleted = self.deleted_at.map_or(i64::MAX, |t| t.as_millis());
        for &d in &fired[expected.len()..] {
            if next.map(|n| n.as_millis()) != Some(d) || d > deleted {
                return Err(format!(
                    "{}; expected {expected:?} and then only the next due times in order, none after the deletion at {deleted}",
                    shown()
                ));
            }
            next = cron.next_after(Timestamp::from_millis(d));
        }
        Ok(())
    }
}
