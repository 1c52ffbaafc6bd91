//! What one write transaction changes, merged per job, for backends that write a whole batch of
//! transitions with one statement per table.
//!
//! A claim of several steps of one job, or a batch of reports two of which belong to the same
//! job, yields several transitions of that job, each applied to the job as the previous one left
//! it. Written one by one they would touch the job row and the same step rows again and again;
//! merged, the job row is written once (as the last transition left it), each changed step once,
//! and the events in the order the transitions made them.

use std::collections::BTreeMap;

use overseer_core::{Job, JobId, NewEvent, Transition};

/// Everything a batch of transitions changed in one job.
#[derive(Debug)]
pub(crate) struct JobWrite<'a> {
    /// The job as the last of its transitions left it.
    pub job: &'a Job,
    /// Whether any transition changed the job's own fields.
    pub job_changed: bool,
    /// The steps any transition changed, in index order, each once.
    pub steps: Vec<usize>,
    /// Every transition's events, in the order they were made.
    pub events: Vec<&'a NewEvent>,
    /// Whether every transition only leased work (see `Transition::leases_only`).
    pub leases_only: bool,
}

impl JobWrite<'_> {
    /// Whether the job row needs writing (its fields, or its event sequence).
    pub fn touches_job_row(&self) -> bool {
        self.job_changed || !self.events.is_empty()
    }
}

/// Merges transitions per job, in job id order (the order in which rows are written, whatever
/// the order of the batch). Transitions of one job must come in the order they were applied.
pub(crate) fn by_job<'a>(
    transitions: impl IntoIterator<Item = &'a Transition>,
) -> Vec<JobWrite<'a>> {
    let mut jobs: BTreeMap<JobId, JobWrite<'a>> = BTreeMap::new();
    for t in transitions {
        let w = jobs.entry(t.job.id).or_insert_with(|| JobWrite {
            job: &t.job,
            job_changed: false,
            steps: Vec::new(),
            events: Vec::new(),
            leases_only: true,
        });
        debug_assert!(
            t.job.updated_at >= w.job.updated_at,
            "transitions of job {} merged out of order",
            t.job.id
        );
        w.job = &t.job;
        w.job_changed |= t.job_changed;
        w.leases_only &= t.leases_only;
        w.steps.extend(t.changed_steps.iter().copied());
        w.events.extend(t.events.iter());
    }
    let mut out: Vec<JobWrite<'a>> = jobs.into_values().collect();
    for w in &mut out {
        w.steps.sort_unstable();
        w.steps.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use overseer_core::{Command, LeaseId, Timestamp};

    fn job() -> Job {
        let spec: overseer_core::spec::JobSpec = serde_json::from_value(serde_json::json!({
            "steps": [
                {"name": "a", "agent": "x"},
                {"name": "b", "agent": "x"},
            ]
        }))
        .unwrap();
        let at = Timestamp::from_millis(1_000);
        overseer_core::machine::admit(Job::from_spec(JobId::generate(), &spec, at), at).job
    }

    #[test]
    fn two_claims_of_one_job_merge_into_one_write() {
        let j = job();
        let claim = |job: &Job, step| {
            let command = Command::Claim {
                step,
                lease_id: LeaseId::generate(),
                worker: "w".into(),
            };
            overseer_core::apply(job, command, Timestamp::from_millis(2_000)).unwrap()
        };
        let first = claim(&j, 1);
        let second = claim(&first.job, 0);
        let writes = by_job([&first, &second]);
        assert_eq!(writes.len(), 1);
        let w = &writes[0];
        assert_eq!(w.steps, vec![0, 1]);
        assert_eq!(w.events.len(), first.events.len() + second.events.len());
        assert!(
            std::ptr::eq(w.job, &second.job),
            "the last transition's job is written"
        );
        assert!(w.touches_job_row());
        assert!(w.leases_only, "two leases and nothing else");
    }
}
