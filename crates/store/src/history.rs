//! A job's history as both stores keep it: one row per write, not per entry.
//!
//! The entries one write appends to a job (a submit's `job_submitted`, `job_started` and
//! `step_ready`s; a report's `step_succeeded` and `job_succeeded`) are numbered together and
//! stored as one row of `events`: the first entry in the row's own columns (`seq` is its number),
//! the others in `more`, a JSON array in order, numbered `seq + 1`, `seq + 2`, …. Every row
//! costs an index entry to insert and later to remove. A submit writes no history row on either
//! store: SQLite keeps the admission's entries in the job row for good (`admission`, numbered from
//! `admission_seq`), PostgreSQL until the job's next write logs them (see its `unlogged`
//! module). Nor does a write that finishes its job with few entries ([`stays_in_row`]): it
//! leaves them in the job row it writes anyway (SQLite: `ending`, numbered from `ending_seq`;
//! PostgreSQL: with the entries waiting there). Nor does a claim that only leases work: its
//! entry is kept in the step row it writes (SQLite, until the step is leased again; PostgreSQL,
//! until the job's next write logs it). So a one-step job run to the end keeps no history row on
//! either store, where one entry per row would make six. Readers see entries, never rows: a
//! backend expands each row with [`expand`].
//!
//! What a backend decides here and only turns into SQL: which of a write's entries are stored at
//! all ([`stored`]), whether a finishing write's entries stay in the job row
//! ([`stays_in_row`]), the `more` text ([`more_text`], read back by [`more_entries`]), and the
//! entries a row holds ([`expand`]).

use std::borrow::Borrow;

use overseer_core::{Event, Job, NewEvent, Timestamp};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::{Error, Result};

/// The entries of a write of `events` that are stored when a job keeps its newest `keep`
/// entries, and the position (from 1) of the first of them among `events`. At least the newest
/// entry is always stored: it dates the job and numbers the next.
pub(crate) fn stored<T>(events: &[T], keep: usize) -> (&[T], i64) {
    let skip = events.len().saturating_sub(keep.max(1));
    (&events[skip..], skip as i64 + 1)
}

/// The most entries a finishing write leaves in its job row instead of a history row: a
/// one-step job's whole history is six, and sixteen entries stay well under the 2 KB from which
/// PostgreSQL moves a row's text out of line (TOAST).
const IN_ROW_MAX: usize = 16;

/// Whether a write that finishes its job, with `entries` entries to store (its own, and on
/// PostgreSQL those waiting), leaves them in the job row instead of a history row: the row is
/// written anyway and no later version of it carries them (a finished job is written again only
/// by an operator's action), and they are few enough to keep whole (at most `keep`, the
/// history's limit, so a trim never cuts into them at that write).
pub(crate) fn stays_in_row(entries: usize, keep: usize) -> bool {
    entries > 0 && entries <= keep.min(IN_ROW_MAX)
}

/// The step of `job` that lease entry `entry` names: where a store keeps the entry of a claim
/// that only leases work (`Transition::leases_only`), in that step's row.
pub(crate) fn leased_step(job: &Job, entry: &NewEvent) -> Result<usize> {
    job.steps
        .iter()
        .position(|s| Some(&s.name) == entry.step.as_ref())
        .ok_or_else(|| {
            Error::Corrupt(format!(
                "transition: a lease of job {} names no step",
                job.id
            ))
        })
}

/// An entry after a row's first, as `more` keeps it.
#[derive(Serialize)]
struct MoreOut<'a> {
    at: i64,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a Value>,
}

#[derive(Deserialize)]
struct MoreIn {
    at: i64,
    kind: String,
    #[serde(default)]
    step: Option<String>,
    #[serde(default)]
    attempt: Option<u32>,
    /// Absent is `None`; a JSON `null` is kept as `Some(Null)`, as the `detail` column keeps it.
    #[serde(default, deserialize_with = "present")]
    detail: Option<Value>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

fn corrupt(detail: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("events.more: {detail}"))
}

impl<'a> MoreOut<'a> {
    fn of(e: &'a NewEvent) -> Self {
        MoreOut {
            at: e.at.as_millis(),
            kind: e.kind.as_str(),
            step: e.step.as_deref(),
            attempt: e.attempt,
            detail: e.detail.as_ref(),
        }
    }
}

impl MoreIn {
    fn entry(self) -> Result<NewEvent> {
        Ok(NewEvent {
            at: Timestamp::from_millis(self.at),
            kind: self.kind.parse().map_err(corrupt)?,
            step: self.step,
            attempt: self.attempt,
            detail: self.detail,
        })
    }
}

/// Entry `e` under number `seq`.
fn numbered(seq: i64, e: NewEvent) -> Event {
    Event {
        seq,
        at: e.at,
        kind: e.kind,
        step: e.step,
        attempt: e.attempt,
        detail: e.detail,
    }
}

/// `entries` numbered `first`, `first + 1`, ….
pub(crate) fn numbered_from(
    first: i64,
    entries: impl IntoIterator<Item = NewEvent>,
) -> impl Iterator<Item = Event> {
    (first..).zip(entries).map(|(seq, e)| numbered(seq, e))
}

/// The `more` text of the entries after a row's first, `None` when there are none.
pub(crate) fn more_text<T: Borrow<NewEvent>>(rest: &[T]) -> Result<Option<String>> {
    if rest.is_empty() {
        return Ok(None);
    }
    let out: Vec<MoreOut> = rest.iter().map(Borrow::borrow).map(MoreOut::of).collect();
    serde_json::to_string(&out).map(Some).map_err(corrupt)
}

/// The entries of a `more` text (as [`more_text`] wrote them), in order.
pub(crate) fn more_entries(text: &str) -> Result<Vec<NewEvent>> {
    let more: Vec<MoreIn> = serde_json::from_str(text).map_err(corrupt)?;
    more.into_iter().map(MoreIn::entry).collect()
}

/// An entry a store logs later (PostgreSQL keeps a claim's entry in the step row it leased: see
/// its `unlogged` module) as it waits: the entry's fields as in `more`, and `n`, its place among
/// the job's waiting entries (from 1), which numbers it when it is read or logged.
#[derive(Serialize)]
struct UnloggedOut<'a> {
    n: u32,
    #[serde(flatten)]
    entry: MoreOut<'a>,
}

#[derive(Deserialize)]
struct UnloggedIn {
    n: u32,
    #[serde(flatten)]
    entry: MoreIn,
}

/// The text an entry waits as, `n`th among its job's waiting entries.
pub(crate) fn unlogged_text(n: u32, e: &NewEvent) -> Result<String> {
    let out = UnloggedOut {
        n,
        entry: MoreOut::of(e),
    };
    serde_json::to_string(&out).map_err(corrupt)
}

/// A waiting entry read back: its place and the entry.
pub(crate) fn unlogged_entry(text: &str) -> Result<(u32, NewEvent)> {
    let UnloggedIn { n, entry } = serde_json::from_str(text).map_err(corrupt)?;
    Ok((n, entry.entry()?))
}

/// The entries of one row: `first` (its own columns) and those in its `more` text, numbered on
/// from `first.seq`.
pub(crate) fn expand(first: Event, more: Option<&str>) -> Result<Vec<Event>> {
    let more = match more {
        Some(text) => more_entries(text)?,
        None => Vec::new(),
    };
    let seq = first.seq;
    let mut out = Vec::with_capacity(1 + more.len());
    out.push(first);
    out.extend(numbered_from(seq + 1, more));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_core::EventKind;

    fn entry(kind: EventKind, at: i64) -> NewEvent {
        NewEvent {
            at: Timestamp::from_millis(at),
            kind,
            step: Some("work".into()),
            attempt: Some(2),
            detail: Some(serde_json::json!({"x": 1})),
        }
    }

    #[test]
    fn a_row_expands_to_the_entries_it_was_written_from() {
        let written = [
            entry(EventKind::StepSucceeded, 5),
            entry(EventKind::JobSucceeded, 6),
        ];
        let more = more_text(&written[1..]).unwrap();
        let first = Event {
            seq: 7,
            at: Timestamp::from_millis(4),
            kind: EventKind::StepLeased,
            step: None,
            attempt: None,
            detail: Some(Value::Null),
        };
        let all = expand(first.clone(), more.as_deref()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], first);
        assert_eq!(all[1].seq, 8);
        assert_eq!(all[1].kind, EventKind::JobSucceeded);
        assert_eq!(all[1].detail, written[1].detail);
        assert_eq!(more_text::<NewEvent>(&[]).unwrap(), None);
        assert!(expand(first, Some("[{\"at\": 1}]")).is_err());
    }

    #[test]
    fn a_waiting_entry_reads_back_as_written() {
        let mut e = entry(EventKind::StepLeased, 9);
        assert_eq!(
            unlogged_entry(&unlogged_text(3, &e).unwrap()).unwrap(),
            (3, e.clone())
        );
        e.detail = Some(Value::Null);
        e.step = None;
        assert_eq!(
            unlogged_entry(&unlogged_text(1, &e).unwrap()).unwrap(),
            (1, e)
        );
        assert!(unlogged_entry("{\"n\": 1}").is_err());
    }

    #[test]
    fn at_least_the_newest_entry_is_stored() {
        let five: Vec<NewEvent> = (0..5).map(|i| entry(EventKind::StepReady, i)).collect();
        let (kept, from) = stored(&five, 3);
        assert_eq!((kept.len(), from), (3, 3));
        let (kept, from) = stored(&five, 0);
        assert_eq!((kept.len(), from), (1, 5));
        let (kept, from) = stored(&five, 10);
        assert_eq!((kept.len(), from), (5, 1));
    }
}
