//! A job's history on SQLite: one row per write, not per entry (see `crate::history` for the
//! row's shape), but for three writes whose entries a row they write anyway keeps:
//! - the admission's, in the job row (`admission`, numbered from `admission_seq`: a submit writes
//!   no history row), the job's first entries;
//! - a claim's that only leases work (`Transition::leases_only`: its one entry is `step_leased`),
//!   in the step row (`lease_entry`, numbered `lease_entry_seq`), until the step is leased again,
//!   when [`log_lease_entry`] moves it to a history row of its own first;
//! - the write's that finished the job, when they are few (`ending`, numbered from `ending_seq`;
//!   see `history::stays_in_row`), in the job row: its last entries until an operator's action
//!   writes the finished job again.
//!
//! So a one-step job run to the end writes no history row. Entries are numbered when written,
//! whichever row keeps them, so a row never holds two entries apart. Readers see entries, never
//! rows: [`load_events`] merges the kept entries with the expanded rows in order, and trimming
//! keeps exactly the newest entries, rewriting the row (or the list) that straddles the cut and
//! clearing the step rows' entries it cuts ([`trim_events`]).

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

/// The number of a job's newest entry kept in its step rows (`NULL` without).
pub(super) const NEWEST_LEASE_SEQ_SQL: &str =
    "SELECT MAX(lease_entry_seq) FROM steps WHERE job_id = ?1";

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
    trim_in_row(conn, id_text, cut)?;
    conn.prepare_cached(
        "UPDATE steps SET lease_entry_seq = NULL, lease_entry = NULL \
         WHERE job_id = ?1 AND lease_entry_seq <= ?2",
    )
    .db()?
    .execute(params![id_text, cut])
    .db()?;
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

/// The entries job `id_text` keeps in its row, numbered: the admission's (see `super::insert`),
/// the job's first entries, and those of the write that finished it (see `super::persist`).
#[derive(Default)]
struct InRow {
    admission: Vec<Event>,
    ending: Vec<Event>,
}

impl InRow {
    fn read(conn: &Connection, id_text: &str) -> Result<InRow> {
        type Lists = [(Option<i64>, Option<String>); 2];
        let row: Option<Lists> = conn
            .prepare_cached(
                "SELECT admission_seq, admission, ending_seq, ending FROM jobs WHERE id = ?1",
            )
            .db()?
            .query_row([id_text], |row| {
                Ok([(row.get(0)?, row.get(1)?), (row.get(2)?, row.get(3)?)])
            })
            .optional()
            .db()?;
        let Some([admission, ending]) = row else {
            return Ok(InRow::default());
        };
        let list = |(first, text): (Option<i64>, Option<String>)| -> Result<Vec<Event>> {
            match (first, text) {
                (Some(first), Some(text)) => {
                    let entries = history::more_entries(&text)?;
                    Ok(history::numbered_from(first, entries).collect())
                }
                _ => Ok(Vec::new()),
            }
        };
        Ok(InRow {
            admission: list(admission)?,
            ending: list(ending)?,
        })
    }
}

/// A list of entries kept in the row cut at `cut`: its first number and text, or `None` when
/// nothing is left.
fn cut_list(entries: Vec<Event>, cut: i64) -> Result<Option<(i64, String)>> {
    let first = entries.iter().map(|e| e.seq).find(|&seq| seq > cut);
    let kept = history::more_text(&after_cut(entries, cut))?;
    Ok(first.zip(kept))
}

/// Cuts the entries in job `id_text`'s row at `cut` as [`trim_events`] cuts rows: each list
/// keeps those numbered after it, or none.
fn trim_in_row(conn: &Connection, id_text: &str, cut: i64) -> Result<()> {
    let InRow { admission, ending } = InRow::read(conn, id_text)?;
    let reaches = |list: &[Event]| list.first().is_some_and(|e| e.seq <= cut);
    if !reaches(&admission) && !reaches(&ending) {
        return Ok(());
    }
    let admission = cut_list(admission, cut)?;
    let ending = cut_list(ending, cut)?;
    conn.prepare_cached(
        "UPDATE jobs SET admission_seq = ?2, admission = ?3, ending_seq = ?4, ending = ?5 \
         WHERE id = ?1",
    )
    .db()?
    .execute(params![
        id_text,
        admission.as_ref().map(|a| a.0),
        admission.map(|a| a.1),
        ending.as_ref().map(|e| e.0),
        ending.map(|e| e.1),
    ])
    .db()?;
    Ok(())
}

/// Moves the entry a claim kept in step `idx`'s row (see `row_writes::LeaseEntry`), if any, to a
/// history row of its own under its number: the step is being leased again, and its row is about
/// to keep the new lease's entry instead.
pub(super) fn log_lease_entry(conn: &Connection, id_text: &str, idx: usize) -> Result<()> {
    let kept: Option<(i64, String)> = conn
        .prepare_cached(
            "SELECT lease_entry_seq, lease_entry FROM steps \
             WHERE job_id = ?1 AND idx = ?2 AND lease_entry IS NOT NULL",
        )
        .db()?
        .query_row(params![id_text, idx as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .db()?;
    let Some((seq, text)) = kept else {
        return Ok(());
    };
    let entries = history::more_entries(&text)?;
    let mut insert = conn.prepare_cached(INSERT_EVENT_SQL).db()?;
    insert_events(&mut insert, id_text, seq, &entries)
}

/// The entries claims kept in job `id_text`'s step rows, numbered after `after_seq`.
fn lease_entries(conn: &Connection, id_text: &str, after_seq: i64) -> Result<Vec<Event>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT lease_entry_seq, lease_entry FROM steps \
             WHERE job_id = ?1 AND lease_entry_seq > ?2",
        )
        .db()?;
    let mut rows = stmt.query(params![id_text, after_seq]).db()?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().db()? {
        let seq: i64 = row.get(0).db()?;
        let text: String = row.get(1).db()?;
        out.extend(history::numbered_from(seq, history::more_entries(&text)?));
    }
    Ok(out)
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
/// (the newest row starting at or before `after_seq`, whose later entries may follow it), with
/// the entries kept in the step rows and the finishing write's kept in the job row merged in by
/// number (the last are the newest, but for rows an operator's action appended after them).
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
    let in_row = InRow::read(conn, &id)?;
    let mut out: Vec<Event> = in_row
        .admission
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
            break;
        }
    }
    // The rows read hold every entry numbered below those of the rows not read, so the
    // entries kept in the job's other rows merged in leave the first `limit` the right ones.
    let leases = lease_entries(conn, &id, after_seq)?;
    if !in_row.ending.is_empty() || !leases.is_empty() {
        out.extend(in_row.ending.into_iter().filter(|e| e.seq > after_seq));
        out.extend(leases);
        out.sort_by_key(|e| e.seq);
    }
    out.truncate(limit);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use overseer_core::EventKind;

    use super::*;

    const JOB: &str = "018bcfe5-6801-7000-8000-000000000001";

    fn entry(at: i64) -> NewEvent {
        NewEvent {
            at: Timestamp::from_millis(at),
            kind: EventKind::JobRepaired,
            step: None,
            attempt: None,
            detail: None,
        }
    }

    fn seqs(conn: &Connection, after_seq: i64, limit: usize) -> Vec<i64> {
        let id = JobId(JOB.parse().expect("uuid"));
        let events = load_events(conn, id, after_seq, limit).expect("events");
        events.iter().map(|e| e.seq).collect()
    }

    // Proves the entries a finishing write left in the job row (`ending`) are read in their
    // place and cut by the trim when history rows follow them (a finished job written again):
    // reads merge them in by number, pages included, and a trim that reaches them rewrites the
    // list, then clears it. (Fails if the ending is read after the rows, or left uncut.)
    #[test]
    fn entries_kept_at_the_end_are_merged_and_trimmed_like_rows() {
        let mut conn = Connection::open_in_memory().expect("open");
        crate::sqlite::migrate(&mut conn).expect("migrate");
        let admission = history::more_text(&[entry(1), entry(2), entry(3)]).expect("text");
        let ending = history::more_text(&[entry(5), entry(6)]).expect("text");
        conn.execute(
            "INSERT INTO jobs (id, fingerprint, labels, priority, on_failure, state, \
             desired_state, created_at, updated_at, last_event_seq, admission_seq, admission, \
             ending_seq, ending) VALUES (?1, 'fp', '{}', 0, 'fail', 'failed', 'succeeded', 1, 6, \
             6, 1, ?2, 5, ?3)",
            params![JOB, admission, ending],
        )
        .expect("job");
        let mut insert = conn.prepare(INSERT_EVENT_SQL).expect("prepare");
        insert_events(&mut insert, JOB, 4, &[entry(4)]).expect("row 4");
        drop(insert);
        let id = JobId(JOB.parse().expect("uuid"));
        append_events(&conn, id, &[entry(7), entry(8)], 5, 8).expect("rows 7-8");
        assert_eq!(seqs(&conn, 0, 10), [4, 5, 6, 7, 8], "cut at 3");
        assert_eq!(seqs(&conn, 5, 2), [6, 7]);
        assert_eq!(seqs(&conn, 0, 3), [4, 5, 6]);
        append_events(&conn, id, &[entry(9)], 4, 9).expect("row 9");
        assert_eq!(
            seqs(&conn, 0, 10),
            [6, 7, 8, 9],
            "cut at 5, inside the ending"
        );
        let stored: (Option<i64>, Option<i64>) = conn
            .query_row(
                "SELECT admission_seq, ending_seq FROM jobs WHERE id = ?1",
                [JOB],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("row");
        assert_eq!(stored, (None, Some(6)));
        append_events(&conn, id, &[entry(10)], 2, 10).expect("row 10");
        assert_eq!(seqs(&conn, 0, 10), [9, 10]);
        let ending: Option<String> = conn
            .query_row("SELECT ending FROM jobs WHERE id = ?1", [JOB], |r| r.get(0))
            .expect("row");
        assert_eq!(ending, None);
    }
}
