//! Entries logged with the job's next write instead of by the write that made them (a new
//! job's admission entries, and a claim's `step_leased` entry), and entries a finishing write
//! leaves in its job row for good.
//!
//! A history row costs a row version and an index entry to insert (and later to remove). Three
//! writes need no history row of their own:
//! - a submit: its entries (`job_submitted`, `job_started` or `job_pending`, `step_ready`s) wait
//!   in the job row it inserts, in `jobs.unlogged_entries`, numbered from `last_event_seq + 1`;
//! - a first lease of work, which changes its step row and nothing of its job but the time
//!   (`Transition::leases_only`): writing the job row and a history row for it besides the step
//!   row made up about 15 % of a PostgreSQL drain (BENCHMARKS.md, thirty-seventh session), so such
//!   a claim writes only the step row, with its entry waiting in `steps.unlogged_entry` (and `n`,
//!   its place among the entries waiting in the job's step rows);
//! - a write that finishes its job, with few entries (its own and those waiting; see
//!   `history::stays_in_row`): it leaves them all in the job row it writes anyway, where no
//!   later version of the row will carry them (a finished job is written again only by an
//!   operator's action). A one-step job run to the end thus keeps its
//!   whole history in its row and writes no history row at all (about 5 % of a drain,
//!   BENCHMARKS.md, fortieth session).
//!
//! Then:
//! - a later write of the job that appends to its history appends the waiting entries first, in
//!   their order, in its own history row (or, if it finishes the job, in its row), and clears
//!   them. It holds the job's lock, as every claim does, so no entry of the job is logged in
//!   between, and a waiting entry's number is fixed from the write that made it on;
//! - a write that appends nothing (a heartbeat) leaves them waiting, and writes them back into
//!   the rows it rewrites;
//! - reads number waiting entries after the job's `last_event_seq`, those of the job row first,
//!   and date the job by the latest of them, so a reader sees the same history and the same
//!   `updated_at` before the entries are logged as after;
//! - the history trim counts the entries a finishing write left in the job row: it cuts the
//!   history rows from the newest entry, as if they had been logged.
//!
//! A claim and a heartbeat never decode the entries of the job row: they only carry its text.
//!
//! A crash loses nothing: an entry is in a committed row until the write that logs it commits.
//! SQLite numbers every entry when it is written and keeps the admission's and a first lease's
//! in the rows those writes make (see its `history` module); both read the same.

use std::collections::HashMap;
use std::sync::Mutex;

use overseer_core::{Job, JobId, NewEvent, Transition};

use super::tx::Transaction;
use super::Res;
use crate::history;
use crate::write_set::JobWrite;

/// A waiting entry of step `step`.
#[derive(Clone, Debug)]
pub(super) struct Unlogged {
    pub step: usize,
    /// Its place among the entries waiting in the job's step rows, from 1.
    pub n: u32,
    pub entry: NewEvent,
}

/// A job's waiting entries: those of its row, first (as stored: a `more` text, see
/// `crate::history`), then those of its step rows, in their order.
#[derive(Clone, Debug, Default)]
pub(super) struct Waiting {
    pub job_row: Option<String>,
    pub steps: Vec<Unlogged>,
}

/// The waiting entries of the jobs a transaction loaded or inserted (as it found them, or as its
/// own writes left them), so that its writes know them without reading the rows again.
#[derive(Default)]
pub(super) struct Seen(Mutex<HashMap<JobId, Waiting>>);

impl Seen {
    fn note(&self, job: JobId, waiting: Waiting) {
        self.0.lock().expect("waiting entries").insert(job, waiting);
    }

    /// Forgets what was noted of `job`, deleted by the transaction (with its steps).
    pub(super) fn forget(&self, job: JobId) {
        self.0.lock().expect("waiting entries").remove(&job);
    }

    fn take(&self, job: JobId) -> Waiting {
        let mut seen = self.0.lock().expect("waiting entries");
        seen.remove(&job).unwrap_or_default()
    }
}

/// The waiting entries of a job just loaded, from its row's `unlogged_entries` (`job_row`) and
/// its step rows' `(idx, unlogged_entry)`, noted for the transaction's writes. The job is dated
/// by the latest entry of its step rows: those of its row (its admission's, or those its
/// finishing write left there) are no later than the row's `updated_at`, written with them.
pub(super) fn loaded(
    tx: &Transaction<'_>,
    job: &mut Job,
    job_row: Option<&str>,
    step_texts: Vec<(usize, String)>,
) -> Res<()> {
    let mut steps = Vec::with_capacity(step_texts.len());
    for (step, text) in step_texts {
        let (n, entry) = history::unlogged_entry(&text)?;
        job.updated_at = job.updated_at.max(entry.at);
        steps.push(Unlogged { step, n, entry });
    }
    steps.sort_by_key(|u| u.n);
    let job_row = job_row.map(str::to_string);
    tx.unlogged().note(job.id, Waiting { job_row, steps });
    Ok(())
}

/// Notes the entries a job row was just inserted with (`unlogged_entries`), for the
/// transaction's later writes of the job.
pub(super) fn inserted(tx: &Transaction<'_>, job: JobId, job_row: Option<String>) {
    let steps = Vec::new();
    tx.unlogged().note(job, Waiting { job_row, steps });
}

/// The entries of a job row's `unlogged_entries`, in order.
pub(super) fn of_job_row(text: Option<&str>) -> Res<Vec<NewEvent>> {
    Ok(text
        .map(history::more_entries)
        .transpose()?
        .unwrap_or_default())
}

/// What a job's write does with the entries waiting for it: decided here once, for [`take`]
/// (which decodes the job row's entries only for a write that logs them) and [`plan`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    /// The write only leases work: its own entries wait too, after those already waiting.
    Defer,
    /// The write appends entries and does more than lease: it logs the waiting ones first.
    Log,
    /// The write appends nothing (a heartbeat): what waits goes on waiting.
    Leave,
}

impl Fate {
    fn of(leases_only: bool, appends: bool) -> Fate {
        match (leases_only, appends) {
            (true, _) => Fate::Defer,
            (false, true) => Fate::Log,
            (false, false) => Fate::Leave,
        }
    }
}

/// The waiting entries of the jobs `transitions` write, taken from what the transaction noted,
/// with the entries of each job row decoded for the writes that log them; [`plan`] notes them
/// again as the writes leave them.
pub(super) fn take(
    tx: &Transaction<'_>,
    transitions: &[&Transition],
) -> Res<HashMap<JobId, (Waiting, Vec<NewEvent>)>> {
    // Per job: whether its transitions all only lease work, and whether they append entries.
    let mut writes: HashMap<JobId, (bool, bool)> = HashMap::new();
    for t in transitions {
        let (leases_only, appends) = writes.entry(t.job.id).or_insert((true, false));
        *leases_only &= t.leases_only;
        *appends |= !t.events.is_empty();
    }
    writes
        .into_iter()
        .map(|(id, (leases_only, appends))| {
            let waiting = tx.unlogged().take(id);
            let job_row = match Fate::of(leases_only, appends) {
                Fate::Log => of_job_row(waiting.job_row.as_deref())?,
                Fate::Defer | Fate::Leave => Vec::new(),
            };
            Ok((id, (waiting, job_row)))
        })
        .collect()
}

/// A job with nothing waiting.
static NONE: (Waiting, Vec<NewEvent>) = (
    Waiting {
        job_row: None,
        steps: Vec::new(),
    },
    Vec::new(),
);

/// What the written rows keep waiting: each step row's `unlogged_entry`, each job row's
/// `unlogged_entries` (rows not named keep none), and for the jobs a write finished in their row
/// (see [`stays_in_row`]) how many entries their row now holds, for the history trim.
#[derive(Default)]
pub(super) struct Kept {
    pub steps: HashMap<(JobId, usize), String>,
    pub jobs: HashMap<JobId, String>,
    pub in_row: HashMap<JobId, i64>,
}

/// Whether write `w`, whose entries (with those that waited) are `w.events`, leaves them in its
/// job row instead of a history row: it finishes the job and they are few
/// ([`history::stays_in_row`]). A one-step job then keeps its whole history in its row and never
/// writes a history row.
fn stays_in_row(w: &JobWrite<'_>, keep: usize) -> bool {
    w.job_changed && w.job.state.is_terminal() && history::stays_in_row(w.events.len(), keep)
}

/// Decides, for each job's write, what becomes of its waiting entries `waiting` (with those of
/// its row decoded when the write logs them) and its own entries: a write that only leases work
/// keeps its entries waiting (they leave `w.events`, and the job row is not written); any other
/// write that appends entries appends the waiting ones first and rewrites their rows without
/// them, or, when it finishes the job with few entries ([`stays_in_row`]), leaves them all in
/// the job row (they leave `w.events`); a write that appends nothing leaves them waiting.
/// `keep` is the history's limit per job. Returns what the written rows keep, and notes the
/// waiting entries as they will be once the writes commit.
pub(super) fn plan<'a>(
    tx: &Transaction<'_>,
    writes: &mut [JobWrite<'a>],
    waiting: &'a HashMap<JobId, (Waiting, Vec<NewEvent>)>,
    keep: usize,
) -> Res<Kept> {
    let mut kept = Kept::default();
    let none: &'a (Waiting, Vec<NewEvent>) = &NONE;
    for w in writes {
        let id = w.job.id;
        let (waits, job_row) = waiting.get(&id).unwrap_or(none);
        let after = match Fate::of(w.leases_only, !w.events.is_empty()) {
            Fate::Defer => {
                let mut after = waits.clone();
                after.steps.extend(defer(w, &waits.steps)?);
                after
            }
            Fate::Log => {
                debug_assert_eq!(job_row.is_empty(), waits.job_row.is_none());
                let step_entries = waits.steps.iter().map(|u| &u.entry);
                w.events.splice(0..0, job_row.iter().chain(step_entries));
                w.steps.extend(waits.steps.iter().map(|u| u.step));
                w.steps.sort_unstable();
                w.steps.dedup();
                match stays_in_row(w, keep) {
                    true => leave_in_row(w, &mut kept)?,
                    false => Waiting::default(),
                }
            }
            Fate::Leave => waits.clone(),
        };
        for u in after.steps.iter().filter(|u| w.steps.contains(&u.step)) {
            kept.steps
                .insert((id, u.step), history::unlogged_text(u.n, &u.entry)?);
        }
        if let Some(text) = &after.job_row {
            kept.jobs.insert(id, text.clone());
        }
        tx.unlogged().note(id, after);
    }
    Ok(kept)
}

/// Takes every entry of finishing write `w` (its own, after those that waited) out of it into
/// its job row (see [`stays_in_row`]), counted in `kept.in_row` for the history trim: what the
/// row keeps waiting once the write commits.
fn leave_in_row(w: &mut JobWrite<'_>, kept: &mut Kept) -> Res<Waiting> {
    kept.in_row.insert(w.job.id, w.events.len() as i64);
    let job_row = history::more_text(&w.events)?;
    w.events.clear();
    Ok(Waiting {
        job_row,
        steps: Vec::new(),
    })
}

/// Takes the entries of a write that only leases work out of it, numbered after `waits`: the
/// job row is left as it is (its time is read from the entries until they are logged).
fn defer(w: &mut JobWrite<'_>, waits: &[Unlogged]) -> Res<Vec<Unlogged>> {
    let first = waits.iter().map(|u| u.n).max().unwrap_or(0) + 1;
    let mut out = Vec::with_capacity(w.events.len());
    for (n, e) in (first..).zip(w.events.drain(..)) {
        let step = history::leased_step(w.job, e)?;
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
