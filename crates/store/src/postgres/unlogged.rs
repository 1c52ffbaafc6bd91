//! A claim's `step_leased` entry, logged with the job's next write instead of by the claim.
//!
//! A first lease of work changes its step row and nothing of its job but the time
//! (`Transition::leases_only`). Writing the job row and a history row for it besides the step row
//! made up about 15 % of a PostgreSQL drain (BENCHMARKS.md, thirty-seventh session), so such a
//! claim writes only the step row, with its entry waiting in `steps.unlogged_entry` (and `n`, its
//! place among the job's waiting entries). Then:
//! - a later write of the job that appends to its history appends the waiting entries first, in
//!   their order, and clears them. It holds the job's lock, as every claim does, so no entry of
//!   the job is logged in between, and a waiting entry's number is fixed from its claim on;
//! - a write that appends nothing (a heartbeat) leaves them waiting, and writes them back into
//!   the step rows it rewrites;
//! - reads number waiting entries after the job's `last_event_seq`, in their order, and date the
//!   job by the latest of them, so a reader sees the same history and the same `updated_at`
//!   before the entries are logged as after.
//!
//! A crash loses nothing: the entry is in the committed step row until the write that logs it
//! commits. SQLite logs every entry at once (its writer's cost is elsewhere); both read the same.

use std::collections::HashMap;
use std::sync::Mutex;

use overseer_core::{Job, JobId, NewEvent, Transition};

use super::rows::corrupt;
use super::tx::Transaction;
use super::Res;
use crate::history;
use crate::write_set::JobWrite;

/// A waiting entry of step `step`.
#[derive(Clone, Debug)]
pub(super) struct Unlogged {
    pub step: usize,
    /// Its place among the job's waiting entries, from 1.
    pub n: u32,
    pub entry: NewEvent,
}

/// The waiting entries of the jobs a transaction loaded (as it loaded them, or as its own writes
/// left them), so that its writes know them without reading the step rows again.
#[derive(Default)]
pub(super) struct Seen(Mutex<HashMap<JobId, Vec<Unlogged>>>);

impl Seen {
    fn note(&self, job: JobId, entries: Vec<Unlogged>) {
        self.0.lock().expect("waiting entries").insert(job, entries);
    }

    /// Forgets what was noted of `job`, deleted by the transaction (with its steps).
    pub(super) fn forget(&self, job: JobId) {
        self.0.lock().expect("waiting entries").remove(&job);
    }

    fn take(&self, job: JobId) -> Vec<Unlogged> {
        let mut seen = self.0.lock().expect("waiting entries");
        seen.remove(&job).unwrap_or_default()
    }
}

/// The waiting entries of a job just loaded, from its step rows' `(idx, unlogged_entry)`: in
/// their order, noted for the transaction's writes. The job is dated by the latest of them.
pub(super) fn loaded(tx: &Transaction<'_>, job: &mut Job, texts: Vec<(usize, String)>) -> Res<()> {
    let mut entries = Vec::with_capacity(texts.len());
    for (step, text) in texts {
        let (n, entry) = history::unlogged_entry(&text)?;
        job.updated_at = job.updated_at.max(entry.at);
        entries.push(Unlogged { step, n, entry });
    }
    entries.sort_by_key(|u| u.n);
    tx.unlogged().note(job.id, entries);
    Ok(())
}

/// The waiting entries of the jobs `transitions` write, taken from what the transaction noted;
/// [`plan`] notes them again as the writes leave them.
pub(super) fn take(
    tx: &Transaction<'_>,
    transitions: &[&Transition],
) -> HashMap<JobId, Vec<Unlogged>> {
    let mut out = HashMap::new();
    for t in transitions {
        out.entry(t.job.id)
            .or_insert_with(|| tx.unlogged().take(t.job.id));
    }
    out
}

/// What each written step row keeps in `unlogged_entry` (rows not named keep none).
pub(super) type Kept = HashMap<(JobId, usize), String>;

/// Decides, for each job's write, what becomes of its waiting entries `waiting` and its own
/// entries: a write that only leases work keeps its entries waiting (they leave `w.events`, and
/// the job row is not written); any other write that appends entries appends the waiting ones
/// first and rewrites their step rows without them; a write that appends nothing leaves them
/// waiting. Returns what the written step rows keep, and notes the waiting entries as they will
/// be once the writes commit.
pub(super) fn plan<'a>(
    tx: &Transaction<'_>,
    writes: &mut [JobWrite<'a>],
    waiting: &'a HashMap<JobId, Vec<Unlogged>>,
) -> Res<Kept> {
    let mut kept = Kept::new();
    for w in writes {
        let id = w.job.id;
        let waits: &'a [Unlogged] = waiting.get(&id).map_or(&[], Vec::as_slice);
        let after = if w.leases_only {
            let mut after = waits.to_vec();
            after.extend(defer(w, waits)?);
            after
        } else if !w.events.is_empty() {
            w.events.splice(0..0, waits.iter().map(|u| &u.entry));
            w.steps.extend(waits.iter().map(|u| u.step));
            w.steps.sort_unstable();
            w.steps.dedup();
            Vec::new()
        } else {
            waits.to_vec()
        };
        for u in &after {
            if w.steps.contains(&u.step) {
                kept.insert((id, u.step), history::unlogged_text(u.n, &u.entry)?);
            }
        }
        tx.unlogged().note(id, after);
    }
    Ok(kept)
}

/// Takes the entries of a write that only leases work out of it, numbered after `waits`: the
/// job row is left as it is (its time is read from the entries until they are logged).
fn defer(w: &mut JobWrite<'_>, waits: &[Unlogged]) -> Res<Vec<Unlogged>> {
    let first = waits.iter().map(|u| u.n).max().unwrap_or(0) + 1;
    let mut out = Vec::with_capacity(w.events.len());
    for (n, e) in (first..).zip(w.events.drain(..)) {
        let step = w
            .job
            .steps
            .iter()
            .position(|s| Some(&s.name) == e.step.as_ref())
            .ok_or_else(|| {
                corrupt(
                    "transition",
                    format!("a lease of job {} names no step", w.job.id),
                )
            })?;
        debug_assert!(
            w.steps.contains(&step),
            "a lease of a step it does not write"
        );
        debug_assert!(
            waits.iter().all(|u| u.step != step),
            "a step leased again while its last lease waits to be logged"
        );
        out.push(Unlogged {
            step,
            n,
            entry: e.clone(),
        });
    }
    w.job_changed = false;
    Ok(out)
}
