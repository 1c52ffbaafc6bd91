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
//! It also answers which step holds a lease id, for the jobs it has, so that a report does not
//! look its lease up in the database.
//!
//! With each job it keeps the job's `last_event_seq` (the number of its newest event), so that a
//! transition numbers its events without reading the count back first (from the job's row, or
//! from its newest history entry when that is newer: see `rows::read_job`).
//!
//! Only the writer thread has a cache ([`enable`]); on every other thread (the readers, tests)
//! every call is a no-op and every load reads the database. In debug builds every hit is checked
//! against the database, so the whole test suite checks the cache.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use overseer_core::{Job, JobId, LeaseId};

use crate::LeaseRef;
use serde_json::Value;

/// Jobs kept in each of the two generations, and about how many bytes of them: the cache holds
/// the last 4,096 to 8,192 jobs the writer had in hand, fewer when they are large (payloads may
/// be up to 256 KiB a step), and never much more than twice [`GENERATION_BYTES`]. When the newer
/// generation is full it becomes the older one and the oldest are dropped, so a batch of new jobs
/// never empties the cache of the running ones at once.
const GENERATION: usize = 4_096;
const GENERATION_BYTES: usize = 32 << 20;

/// A job as the database holds it, with its `last_event_seq` and its estimated size. The job is
/// shared with whoever loaded it ([`get`]), so a hit costs no copy of it.
struct Entry {
    job: Rc<Job>,
    last_event_seq: i64,
    bytes: usize,
}

impl Entry {
    fn of(job: &Job, last_event_seq: i64) -> Entry {
        Entry::shared(Rc::new(job.clone()), last_event_seq)
    }

    fn shared(job: Rc<Job>, last_event_seq: i64) -> Entry {
        let bytes = size_of(&job);
        Entry {
            job,
            last_event_seq,
            bytes,
        }
    }
}

#[derive(Default)]
struct Generation {
    jobs: HashMap<JobId, Entry>,
    bytes: usize,
    /// The lease ids on the steps of the jobs stored in this generation, to their job. An entry
    /// may be stale (the step was leased again, the job dropped): every answer is checked
    /// against the cached job's step.
    leases: HashMap<LeaseId, JobId>,
}

impl Generation {
    fn remove(&mut self, id: &JobId) {
        if let Some(gone) = self.jobs.remove(id) {
            self.bytes -= gone.bytes;
        }
    }

    fn full(&self) -> bool {
        self.jobs.len() >= GENERATION
            || self.bytes >= GENERATION_BYTES
            || self.leases.len() >= 4 * GENERATION
    }
}

#[derive(Default)]
struct Cache {
    newer: Generation,
    older: Generation,
}

impl Cache {
    fn get(&self, id: &JobId) -> Option<&Entry> {
        self.newer.jobs.get(id).or_else(|| self.older.jobs.get(id))
    }

    fn insert(&mut self, id: JobId, entry: Entry) {
        self.remove(&id);
        if self.newer.full() {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.bytes += entry.bytes;
        for lease in entry.job.steps.iter().filter_map(|s| s.lease_id) {
            self.newer.leases.insert(lease, id);
        }
        self.newer.jobs.insert(id, entry);
    }

    /// The step of a cached job that holds `lease` now, as the steps table would answer it.
    fn lease(&self, lease: LeaseId) -> Option<LeaseRef> {
        [&self.newer, &self.older].into_iter().find_map(|g| {
            let job_id = *g.leases.get(&lease)?;
            let job = &self.get(&job_id)?.job;
            let step = job.steps.iter().position(|s| s.lease_id == Some(lease))?;
            LeaseRef::held(job, step)
        })
    }

    fn remove(&mut self, id: &JobId) {
        self.newer.remove(id);
        self.older.remove(id);
    }
}

/// About how much memory a decoded job holds: a fixed part per job and step, and the texts and
/// JSON values it carries.
fn size_of(job: &Job) -> usize {
    let labels: usize = job.labels.iter().map(|(k, v)| 64 + k.len() + v.len()).sum();
    let steps: usize = job
        .steps
        .iter()
        .map(|s| {
            let compensate = s.compensate.as_ref().map_or(0, |c| json_size(&c.payload));
            let texts = s.name.len() + s.agent.len() + s.last_error.as_ref().map_or(0, String::len);
            let values = [s.result.as_ref(), s.progress.as_ref()]
                .into_iter()
                .flatten()
                .map(json_size)
                .sum::<usize>();
            512 + texts + json_size(&s.payload) + compensate + values
        })
        .sum();
    512 + job.fingerprint.len() + labels + steps
}

fn json_size(value: &Value) -> usize {
    match value {
        Value::String(s) => 32 + s.len(),
        Value::Array(items) => 32 + items.iter().map(json_size).sum::<usize>(),
        Value::Object(map) => {
            64 + map
                .iter()
                .map(|(k, v)| 48 + k.len() + json_size(v))
                .sum::<usize>()
        }
        _ => 16,
    }
}

thread_local! {
    static WRITTEN: RefCell<Option<Cache>> = const { RefCell::new(None) };
}

/// Gives the calling thread (the writer) a cache.
pub(super) fn enable() {
    WRITTEN.with(|w| *w.borrow_mut() = Some(Cache::default()));
}

/// The job as last written or loaded on this thread, if cached (shared, not copied).
pub(super) fn get(id: JobId) -> Option<Rc<Job>> {
    WRITTEN.with(|w| {
        w.borrow()
            .as_ref()
            .and_then(|c| c.get(&id).map(|e| Rc::clone(&e.job)))
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

/// The step a lease id names, when the job that holds it is cached on this thread; `None`
/// sends the caller to the database (which also knows the leases that steps no longer hold).
pub(super) fn lease(lease_id: LeaseId) -> Option<LeaseRef> {
    WRITTEN.with(|w| w.borrow().as_ref().and_then(|c| c.lease(lease_id)))
}

/// Keeps `job` and its `last_event_seq` as the database now holds them (in the open
/// transaction).
pub(super) fn remember(job: &Job, last_event_seq: i64) {
    change(|c| c.insert(job.id, Entry::of(job, last_event_seq)));
}

/// Keeps `job`, just read from the database with its `last_event_seq`, without copying it.
pub(super) fn remember_loaded(job: &Rc<Job>, last_event_seq: i64) {
    change(|c| c.insert(job.id, Entry::shared(Rc::clone(job), last_event_seq)));
}

/// Drops `id`: its rows were changed or deleted other than by a transition.
pub(super) fn forget(id: JobId) {
    change(|c| c.remove(&id));
}

/// Drops every job: a write was rolled back, so what it stored here was never committed.
pub(super) fn forget_all() {
    change(|c| *c = Cache::default());
}

/// Applies `f` to the calling thread's cache; nothing on a thread without one (a reader).
fn change(f: impl FnOnce(&mut Cache)) {
    WRITTEN.with(|w| {
        if let Some(c) = w.borrow_mut().as_mut() {
            f(c);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_core::{JobSpec, Timestamp};

    fn job(payload: Value) -> Job {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "steps": [{ "name": "s", "agent": "a", "payload": payload }]
        }))
        .expect("spec");
        Job::from_spec(JobId::generate(), &spec, Timestamp::from_millis(0))
    }

    #[test]
    fn the_cache_keeps_two_generations_by_count() {
        let mut c = Cache::default();
        let jobs: Vec<Job> = (0..2 * GENERATION + 1).map(|_| job(Value::Null)).collect();
        for j in &jobs {
            c.insert(j.id, Entry::of(j, 1));
        }
        // The first generation was dropped whole when the third began; the last two are kept.
        assert!(c.get(&jobs[0].id).is_none());
        assert!(c.get(&jobs[GENERATION - 1].id).is_none());
        assert!(c.get(&jobs[GENERATION].id).is_some());
        assert!(c.get(&jobs[2 * GENERATION].id).is_some());
    }

    #[test]
    fn large_jobs_fill_a_generation_by_size() {
        let mut c = Cache::default();
        let big = Value::String("x".repeat(256 << 10));
        let jobs: Vec<Job> = (0..1_000).map(|_| job(big.clone())).collect();
        for j in &jobs {
            c.insert(j.id, Entry::of(j, 1));
        }
        let kept = c.newer.jobs.len() + c.older.jobs.len();
        assert!(kept < 300, "{kept} jobs of 256 KiB kept");
        assert!(c.newer.bytes + c.older.bytes <= 2 * GENERATION_BYTES + (300 << 10));
        assert!(c.get(&jobs[999].id).is_some());
    }

    #[test]
    fn a_lease_resolves_to_the_step_that_holds_it_now() {
        let mut c = Cache::default();
        let mut j = job(Value::Null);
        let (first, second) = (LeaseId::generate(), LeaseId::generate());
        j.steps[0].lease_id = Some(first);
        j.steps[0].attempt = 1;
        c.insert(j.id, Entry::of(&j, 2));
        let found = c.lease(first).expect("cached");
        assert_eq!((found.job_id, found.step, found.attempt), (j.id, 0, 1));
        // Leased again: the old id is no longer on the step, so the cache does not answer for
        // it (the database's retired leases do).
        j.steps[0].lease_id = Some(second);
        j.steps[0].attempt = 2;
        c.insert(j.id, Entry::of(&j, 3));
        assert!(c.lease(first).is_none());
        assert_eq!(c.lease(second).map(|l| l.attempt), Some(2));
        // A dropped job answers for none of its leases.
        c.remove(&j.id);
        assert!(c.lease(second).is_none());
    }

    #[test]
    fn a_job_written_again_is_counted_once() {
        let mut c = Cache::default();
        let j = job(Value::String("y".repeat(1_000)));
        for seq in 1..=3 {
            c.insert(j.id, Entry::of(&j, seq));
        }
        assert_eq!(c.newer.jobs.len() + c.older.jobs.len(), 1);
        assert_eq!(c.newer.bytes + c.older.bytes, size_of(&j));
        assert_eq!(c.get(&j.id).map(|e| e.last_event_seq), Some(3));
    }
}
