//! The jobs the writer thread last wrote or loaded, as decoded `Job`s, so that a claim or a
//! report does not read and decode the rows of a job the writer has just had in hand (loading
//! and decoding was ~10 % of the writer's time in a drain and ~23 % in a four-step DAG run).
//!
//! The writer is the only connection that changes jobs and steps, so what it last wrote is what
//! the database holds, as long as every change goes through here:
//! - `persist` stores each transition's job ([`remember`]), and a submit each new job;
//! - a write that changes rows without a transition (removal, retention, a rerun's link, the
//!   fault injection's partial write) drops the jobs it changed ([`forget`]);
//! - a write rolled back (a failed operation's savepoint, a batch that did not commit) drops
//!   everything, since what it stored here was never committed.
//!
//! With each job it keeps the job's `last_event_seq` (the number of its newest event), so that a
//! transition numbers its events and writes the new count with the job's row, without reading
//! the count back first.
//!
//! Only the writer thread has a cache ([`enable`]); on every other thread (the readers, tests)
//! every call is a no-op and every load reads the database. In debug builds every hit is checked
//! against the database, so the whole test suite checks the cache.

use std::cell::RefCell;
use std::collections::HashMap;

use overseer_core::{Job, JobId};

/// Jobs kept in each of the two generations: the cache holds the last 4,096 to 8,192 jobs the
/// writer had in hand. When the newer generation is full it becomes the older one and the
/// oldest are dropped, so a batch of new jobs never empties the cache of the running ones at once.
const GENERATION: usize = 4_096;

/// A job as the database holds it, with its `last_event_seq`.
struct Entry {
    job: Job,
    last_event_seq: i64,
}

#[derive(Default)]
struct Cache {
    newer: HashMap<JobId, Entry>,
    older: HashMap<JobId, Entry>,
}

impl Cache {
    fn get(&self, id: &JobId) -> Option<&Entry> {
        self.newer.get(id).or_else(|| self.older.get(id))
    }

    fn insert(&mut self, id: JobId, entry: Entry) {
        if self.newer.len() >= GENERATION && !self.newer.contains_key(&id) {
            self.older = std::mem::take(&mut self.newer);
        }
        self.older.remove(&id);
        self.newer.insert(id, entry);
    }

    fn remove(&mut self, id: &JobId) {
        self.newer.remove(id);
        self.older.remove(id);
    }
}

thread_local! {
    static WRITTEN: RefCell<Option<Cache>> = const { RefCell::new(None) };
}

/// Gives the calling thread (the writer) a cache.
pub(super) fn enable() {
    WRITTEN.with(|w| *w.borrow_mut() = Some(Cache::default()));
}

/// The job as last written or loaded on this thread, if cached.
pub(super) fn get(id: JobId) -> Option<Job> {
    WRITTEN.with(|w| {
        w.borrow()
            .as_ref()
            .and_then(|c| c.get(&id).map(|e| e.job.clone()))
    })
}

/// The `last_event_seq` of job `id` as last written or loaded on this thread, if cached.
pub(super) fn last_event_seq(id: JobId) -> Option<i64> {
    WRITTEN.with(|w| {
        w.borrow()
            .as_ref()
            .and_then(|c| c.get(&id).map(|e| e.last_event_seq))
    })
}

/// Keeps `job` and its `last_event_seq` as the database now holds them (in the open
/// transaction).
pub(super) fn remember(job: &Job, last_event_seq: i64) {
    WRITTEN.with(|w| {
        if let Some(c) = w.borrow_mut().as_mut() {
            let job = job.clone();
            c.insert(
                job.id,
                Entry {
                    job,
                    last_event_seq,
                },
            );
        }
    });
}

/// Drops `id`: its rows were changed or deleted other than by a transition.
pub(super) fn forget(id: JobId) {
    WRITTEN.with(|w| {
        if let Some(c) = w.borrow_mut().as_mut() {
            c.remove(&id);
        }
    });
}

/// Drops every job: a write was rolled back, so what it stored here was never committed.
pub(super) fn forget_all() {
    WRITTEN.with(|w| {
        if let Some(c) = w.borrow_mut().as_mut() {
            *c = Cache::default();
        }
    });
}
