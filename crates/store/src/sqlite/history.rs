//! A job's history on SQLite: one row per write, not per entry (see `crate::history` for the
//! row's shape), but for the admission's entries, which the job row keeps (`admission`, numbered
//! from `admission_seq`: a submit writes no history row). Readers see entries, never rows:
//! [`load_events`] puts the admission's first and expands the rows, and trimming keeps exactly
//! the newest entries, rewriting the row (or the admission) that straddles the cut
//! ([`trim_events`]).

use overseer_core::{Event, JobId, NewEvent, Timestamp};
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::Value;

use super::rows::{corrupt, job_id_text, json_text, limit_param, parse_json, to_u32, DbResult};
use crate::{history, Result};

/// Inserts one history row: its job's id, the number and columns of its first entry, and the
/// entries after it (`more`, or `NULL` when there are none).
pub(super) const INSERT_EVENT_SQL: &str =
    "INSERT INTO events (job_id, seq, at, kind, step, attempt, detail, more) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// The number of a job's newest entry, from its newest row (`NULL` without history).
pub(super) const NEWEST_SEQ_SQL: &str = "SELECT seq + COALESCE(json_array_length(more), 0) \
     FROM events WHERE job_id = ?1 ORDER BY seq DESC LIMIT 1";

/// The time of a job's newest entry, from its newest row (`NULL` without history).
pub(super) const NEWEST_AT_SQL: &str = "SELECT COALESCE(json_extract(more, '$[#-1].at'), at) \
     FROM events WHERE job_id = ?1 ORDER BY seq DESC LIMIT 1";

const ROW_COLUMNS: &str = "seq, at, kind, step, attempt, detail, more";

/// Appends events numbered up to `last` (the job's `last_event_seq` with these events counted),
/// then drops all but the newest `keep` (at least one: see [`trim_events`]).
pub(super) fn append_events(
    conn: &Connection,
    id: JobId,
    events: &[NewEvent],
    keep: usize,
    last: i64,
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let id_text = job_id_text(id);
    let count = events.len() as i64;
    let mut insert = conn.prepare_cached(INSERT_EVENT_SQL).db()?;
    insert_events(&mut insert, &id_text, last - count + 1, events)?;
    trim_events(conn, &id_text, last, keep)
}

/// Inserts `events` of job `id_text`, numbered `first`, `first + 1`, …, as one row with
/// [`INSERT_EVENT_SQL`].
pub(super) fn insert_events(
    insert: &mut rusqlite::Statement<'_>,
    id_text: &str,
    first: i64,
    events: &[NewEvent],
) -> Result<()> {
    let Some((head, rest)) = events.split_first() else {
        return Ok(());
    };
    insert
        .execute(params![
            id_text,
            first,
            head.at.as_millis(),
            head.kind.as_str(),
            head.step,
            head.attempt,
            head.detail.as_ref().map(json_text),
            history::more_text(rest)?,
        ])
        .db()?;
    Ok(())
}

/// Deletes the history of job `id_text` older than its newest `keep` entries, `last` being the
/// newest entry's number: the rows wholly older go, and a row holding entries on both sides of
/// the cut is written again with only the newer ones.
pub(super) fn trim_events(conn: &Connection, id_text: &str, last: i64, keep: usize) -> Result<()> {
    // The newest entry always stays: it dates the job and numbers the next (see `read_job`).
    let keep = i64::try_from(keep.max(1)).unwrap_or(i64::MAX);
    if last <= keep {
        return Ok(());
    }
    let cut = last - keep;
    trim_admission(conn, id_text, cut)?;
    conn.prepare_cached(
        "DELETE FROM events WHERE job_id = ?1 AND seq <= ?2 \
         AND seq + COALESCE(json_array_length(more), 0) <= ?2",
    )
    .db()?
    .execute(params![id_text, cut])
    .db()?;
    let straddling = conn
        .prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM events WHERE job_id = ?1 AND seq <= ?2"
        ))
        .db()?
        .query_row(params![id_text, cut], |row| Ok(entries(row)))
        .optional()
        .db()?
        .transpose()?;
    let Some(entries) = straddling else {
        return Ok(());
    };
    let first = entries.first().map_or(cut, |e| e.seq);
    conn.prepare_cached("DELETE FROM events WHERE job_id = ?1 AND seq = ?2")
        .db()?
        .execute(params![id_text, first])
        .db()?;
    let kept = after_cut(entries, cut);
    let mut insert = conn.prepare_cached(INSERT_EVENT_SQL).db()?;
    insert_events(&mut insert, id_text, cut + 1, &kept)
}

/// The entries of `entries` numbered after `cut`, unnumbered again to be stored.
fn after_cut(entries: Vec<Event>, cut: i64) -> Vec<NewEvent> {
    entries
        .into_iter()
        .filter(|e| e.seq > cut)
        .map(|e| NewEvent {
            at: e.at,
            kind: e.kind,
            step: e.step,
            attempt: e.attempt,
            detail: e.detail,
        })
        .collect()
}

/// The admission's entries job `id_text` keeps in its row (a submit writes no history row: see
/// `super::insert`), numbered: the job's first entries, before its history rows.
fn admission(conn: &Connection, id_text: &str) -> Result<Vec<Event>> {
    let row = conn
        .prepare_cached("SELECT admission_seq, admission FROM jobs WHERE id = ?1")
        .db()?
        .query_row([id_text], |row| {
            Ok((
                row.get::<_, Option<i64>>(0)?,
                row.get::<_, Option<String>>(1)?,
            ))
        })
        .optional()
        .db()?;
    let Some((Some(first), Some(text))) = row else {
        return Ok(Vec::new());
    };
    let entries = history::more_entries(&text)?;
    Ok(history::numbered_from(first, entries).collect())
}

/// Cuts the admission's entries in job `id_text`'s row at `cut` as [`trim_events`] cuts rows:
/// the row keeps those numbered after it, or none.
fn trim_admission(conn: &Connection, id_text: &str, cut: i64) -> Result<()> {
    let entries = admission(conn, id_text)?;
    if entries.first().is_none_or(|e| e.seq > cut) {
        return Ok(());
    }
    let kept = history::more_text(&after_cut(entries, cut))?;
    conn.prepare_cached("UPDATE jobs SET admission_seq = ?2, admission = ?3 WHERE id = ?1")
        .db()?
        .execute(params![id_text, kept.as_ref().map(|_| cut + 1), kept])
        .db()?;
    Ok(())
}

/// The entries of one history row, numbered.
fn entries(row: &Row<'_>) -> Result<Vec<Event>> {
    let kind: String = row.get(2).db()?;
    let attempt: Option<i64> = row.get(4).db()?;
    let detail: Option<String> = row.get(5).db()?;
    let more: Option<String> = row.get(6).db()?;
    let first = Event {
        seq: row.get(0).db()?,
        at: Timestamp::from_millis(row.get(1).db()?),
        kind: kind.parse().map_err(|e| corrupt("events.kind", e))?,
        step: row.get(3).db()?,
        attempt: attempt.map(|a| to_u32("events.attempt", a)).transpose()?,
        detail: detail
            .map(|d| parse_json::<Value>("events.detail", &d))
            .transpose()?,
    };
    history::expand(first, more.as_deref())
}

/// Up to `limit` entries of job `id` numbered after `after_seq`, oldest first: the admission's
/// entries kept in the job row, then from the history row that holds entry `after_seq + 1` on
/// (the newest row starting at or before `after_seq`, whose later entries may follow it).
pub(super) fn load_events(
    conn: &Connection,
    id: JobId,
    after_seq: i64,
    limit: usize,
) -> Result<Vec<Event>> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM events WHERE job_id = ?1 AND seq >= COALESCE( \
               (SELECT MAX(seq) FROM events WHERE job_id = ?1 AND seq <= ?2), ?2 + 1) \
             ORDER BY seq LIMIT ?3"
        ))
        .db()?;
    // Every row holds at least one entry, and only the first row may hold none of those asked.
    let rows = limit.saturating_add(1);
    let id = job_id_text(id);
    let mut out: Vec<Event> = admission(conn, &id)?
        .into_iter()
        .filter(|e| e.seq > after_seq)
        .take(limit)
        .collect();
    if out.len() >= limit {
        return Ok(out);
    }
    let mut rows = stmt.query(params![id, after_seq, limit_param(rows)]).db()?;
    while let Some(row) = rows.next().db()? {
        out.extend(entries(row)?.into_iter().filter(|e| e.seq > after_seq));
        if out.len() >= limit {
            out.truncate(limit);
            break;
        }
    }
    Ok(out)
}
