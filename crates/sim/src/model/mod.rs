//! What the simulator knows to be true, and the invariants checked against it.
//!
//! The harness sees every answer the server gives, even those it then drops on their way to a
//! simulated agent or client (a "lost answer"), and the server never crashes in the middle of a
//! request. So this model knows every lease ever handed out, its expiry by the server's clock,
//! and every report, cancel and operator action the server acknowledged. Each answer and each
//! job view is checked against it; a mismatch is a violation, reported as a readable message.

use std::collections::{BTreeSet, HashMap};

use overseer_core::wire::{JobView, Lease, LeaseKind};
use overseer_core::{JobId, JobState, LeaseId, Timestamp};
use serde_json::Value;

mod view;

/// A violated invariant, in words.
pub type Violation = String;
pub type Check<T = ()> = Result<T, Violation>;

/// Events a job keeps (the store's default `history_per_job`); beyond it the oldest are dropped
/// and the history checks are skipped.
const HISTORY_KEPT: usize = 1000;

/// A step as submitted: what its leases must carry.
#[derive(Clone, Debug)]
pub struct StepShape {
    pub name: String,
    /// Dependencies, by step index.
    pub deps: Vec<usize>,
    pub payload: Value,
    pub timeout_ms: u64,
    /// 0 = no limit.
    pub max_attempts: u32,
    /// The undo's payload, when the step declares `compensate`.
    pub undo_payload: Option<Value>,
    pub undo_max_attempts: u32,
    /// The longest one attempt (work or undo) may run, heartbeats or not.
    pub deadline_ms: Option<u64>,
}

/// One job the clients submitted (or tried to).
#[derive(Debug)]
pub struct JobModel {
    pub key: String,
    /// The exact body sent, so a retry is byte-for-byte the same submit.
    pub body: Value,
    pub ordering_key: Option<String>,
    /// No work may start before it.
    pub run_at: Option<Timestamp>,
    pub steps: Vec<StepModel>,
    /// Known once the server answered a submit with 2xx, delivered to the client or not.
    pub id: Option<JobId>,
    /// Whether the client received a 2xx: the job must never be lost.
    pub acked: bool,
    /// Position among committed jobs (the order ordering keys follow).
    pub commit_order: Option<usize>,
    /// When a cancel was acknowledged (2xx), by the server's clock.
    pub cancel_at: Option<Timestamp>,
    /// The terminal state once seen: it must never change.
    pub terminal: Option<JobState>,
    /// A whole-job retry (`on_failure: compensate_and_retry`).
    pub retry: bool,
    /// The round the model's per-round step state (`work_done`, `undo_done`, the skips) is
    /// about; follows the server's `round` (see [`Model::on_round`]).
    pub round: u32,
    /// For each finished round (index 0 is round 1), the steps whose undo the model saw
    /// complete in it.
    pub undone_in_round: Vec<BTreeSet<String>>,
    /// Asked for its own retention at submit: it may be removed once finished and kept so long.
    pub own_retention: bool,
    /// When the server said the finished job may be removed (`removable_at`).
    pub removable_at: Option<Timestamp>,
    /// The job was found removed, legitimately (finished and past `removable_at`).
    pub pruned: bool,
    /// The job this one reruns, when it is a rerun.
    pub rerun_of: Option<usize>,
    /// Its rerun, once the server made one (answered 202).
    pub rerun: Option<usize>,
}

#[derive(Debug)]
pub struct StepModel {
    pub name: String,
    pub deps: Vec<usize>,
    pub payload: Value,
    pub timeout_ms: u64,
    pub max_attempts: u32,
    pub undo_payload: Option<Value>,
    pub undo_max_attempts: u32,
    pub deadline_ms: Option<u64>,
    /// Every step that depends on this one, directly or not.
    pub dependants: Vec<usize>,
    pub compensate: bool,
    /// Every lease handed out for this step, work and undo, in order (attempt = index + 1),
    /// over every round of a whole-job retry.
    pub leases: Vec<LeaseModel>,
    /// The lease whose `complete` was acknowledged (2xx) for the step's work, in this round.
    pub work_done: Option<usize>,
    /// An operator skip of the failed step's work was acknowledged, in this round.
    pub skipped: bool,
    /// Acknowledged `complete`s of undo leases in this round: at most one.
    pub undo_done: u32,
    /// An operator skip of the step's failed undo was acknowledged, in this round.
    pub undo_skipped: bool,
    /// In a rerun from failure: the result the step kept from the job rerun. Such a step must
    /// never be run again (no work lease), and counts as done for its dependants.
    pub kept: Option<Value>,
}

#[derive(Clone, Debug)]
pub struct LeaseModel {
    pub id: LeaseId,
    /// The agent name it was handed to (the compensate agent for an undo).
    pub agent: String,
    pub attempt: u32,
    pub undo: bool,
    pub granted_at: Timestamp,
    /// By the server's clock; moved by every acknowledged heartbeat.
    pub expires_at: Timestamp,
    /// The end it was handed out with.
    pub granted_until: Timestamp,
    /// The attempt's hard end (grant + the step's deadline): no lease end may pass it.
    pub hard_end: Option<Timestamp>,
    /// A leader's sweep after `hard_end` was seen to have ended the attempt.
    pub deadline_swept: bool,
    pub worker: String,
    /// A complete or fail was acknowledged, or a late complete settled the step.
    pub ended: bool,
    /// The result of its acknowledged `complete`.
    pub result: Option<Value>,
}

impl LeaseModel {
    /// Whether the server must treat this lease as the step's live lease at `now`.
    pub fn live(&self, now: Timestamp) -> bool {
        !self.ended && now < self.expires_at
    }

    fn describe(&self, now: Timestamp) -> String {
        let what = if self.undo { "undo" } else { "work" };
        let why = if self.ended {
            "ended by an acknowledged report".to_string()
        } else if now >= self.expires_at {
            format!(
                "expired {} ms ago",
                now.as_millis() - self.expires_at.as_millis()
            )
        } else {
            format!(
                "live for {} ms more",
                self.expires_at.as_millis() - now.as_millis()
            )
        };
        format!("{what} lease {} (attempt {}, {why})", self.id, self.attempt)
    }
}

/// What an agent told the server about a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportKind {
    Heartbeat,
    Complete,
    Fail,
}

impl ReportKind {
    pub fn path(self) -> &'static str {
        match self {
            ReportKind::Heartbeat => "heartbeat",
            ReportKind::Complete => "complete",
            ReportKind::Fail => "fail",
        }
    }
}

/// What the caller must still verify after a report's answer was checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Followup {
    None,
    /// A live work lease's `complete` was refused: allowed only if the job no longer wants the
    /// work, in which case the step is now `cancelled`.
    RefusedLiveComplete {
        job: usize,
        step: usize,
    },
}

/// An agent name's limits as last acknowledged.
#[derive(Clone, Copy, Debug, Default)]
pub struct AgentLimits {
    pub max_concurrency: Option<u32>,
    pub paused: bool,
}

#[derive(Debug, Default)]
pub struct Model {
    pub jobs: Vec<JobModel>,
    pub limits: HashMap<String, AgentLimits>,
    by_id: HashMap<JobId, usize>,
    leases: HashMap<LeaseId, (usize, usize, usize)>,
    commits: usize,
}

impl Model {
    /// Registers a job the clients will submit; `deps` by step index. Whether it is a whole-job
    /// retry and asked for its own retention is read from `body`.
    pub fn add_job(
        &mut self,
        key: String,
        body: Value,
        ordering_key: Option<String>,
        run_at: Option<Timestamp>,
        steps: Vec<StepShape>,
    ) -> usize {
        let retry = body["on_failure"] == "compensate_and_retry";
        let own_retention = !body["retention"].is_null();
        let n = steps.len();
        let mut models: Vec<StepModel> = steps
            .into_iter()
            .map(|shape| StepModel {
                name: shape.name,
                deps: shape.deps,
                payload: shape.payload,
                timeout_ms: shape.timeout_ms,
                max_attempts: shape.max_attempts,
                compensate: shape.undo_payload.is_some(),
                undo_payload: shape.undo_payload,
                undo_max_attempts: shape.undo_max_attempts,
                deadline_ms: shape.deadline_ms,
                dependants: Vec::new(),
                leases: Vec::new(),
                work_done: None,
                skipped: false,
                undo_done: 0,
                undo_skipped: false,
                kept: None,
            })
            .collect();
        for i in 0..n {
            let mut seen = vec![false; n];
            let mut stack = vec![i];
            while let Some(x) = stack.pop() {
                for j in 0..n {
                    if !seen[j] && models[j].deps.contains(&x) {
                        seen[j] = true;
                        stack.push(j);
                    }
                }
            }
            models[i].dependants = (0..n).filter(|&j| seen[j]).collect();
        }
        self.jobs.push(JobModel {
            key,
            body,
            ordering_key,
            run_at,
            steps: models,
            id: None,
            acked: false,
            commit_order: None,
            cancel_at: None,
            terminal: None,
            retry,
            round: 1,
            undone_in_round: Vec::new(),
            own_retention,
            removable_at: None,
            pruned: false,
            rerun_of: None,
            rerun: None,
        });
        self.jobs.len() - 1
    }

    /// The server shows job `j` in `round`. When that is a later round than the model's, every
    /// round in between has ended: each must have undone exactly the steps whose work succeeded
    /// in it (or that a rerun kept) and declare an undo (an operator's skip of a failed undo
    /// counts as undone), by the acknowledged reports the model saw. Then the per-round step
    /// state starts afresh.
    pub fn on_round(&mut self, j: usize, round: u32) -> Check {
        let m = &mut self.jobs[j];
        if round < m.round {
            return Err(format!(
                "job {j} ({}): round {round} shown after round {}: a round went back",
                m.key, m.round
            ));
        }
        if round > m.round && !m.retry {
            return Err(format!(
                "job {j} ({}) is not a whole-job retry, yet it shows round {round}",
                m.key
            ));
        }
        while m.round < round {
            let succeeded: BTreeSet<String> = m
                .steps
                .iter()
                .filter(|s| (s.work_done.is_some() || s.kept.is_some()) && s.compensate)
                .map(|s| s.name.clone())
                .collect();
            let undone: BTreeSet<String> = m
                .steps
                .iter()
                .filter(|s| s.undo_done == 1 || s.undo_skipped)
                .map(|s| s.name.clone())
                .collect();
            if succeeded != undone {
                return Err(format!(
                    "job {j} ({}): round {} ended and round {} started, but the steps that succeeded in it and declare an undo were {succeeded:?} while the undos acknowledged (or skipped) were {undone:?}: every round of a whole-job retry undoes exactly the steps that succeeded in it",
                    m.key,
                    m.round,
                    m.round + 1
                ));
            }
            // The history lists the undos that completed (a skipped one is not undone).
            m.undone_in_round.push(
                m.steps
                    .iter()
                    .filter(|s| s.undo_done == 1)
                    .map(|s| s.name.clone())
                    .collect(),
            );
            for s in &mut m.steps {
                // A step a rerun kept starts over too in the next round.
                s.kept = None;
                s.work_done = None;
                s.skipped = false;
                s.undo_done = 0;
                s.undo_skipped = false;
            }
            m.round += 1;
        }
        Ok(())
    }

    /// Job `j` was seen as `view`: once finished, its end state and when it may be removed are
    /// noted (the first end seen stays: `check_view` fails a job whose end changes).
    pub fn observe_end(&mut self, j: usize, view: &JobView) {
        let m = &mut self.jobs[j];
        if view.state.is_terminal() && m.terminal.is_none() {
            m.terminal = Some(view.state);
        }
        if m.terminal.is_some() && m.own_retention && m.removable_at.is_none() {
            m.removable_at = view.removable_at;
        }
    }

    /// Job `j` is gone from the store (404) at `now`. Allowed only once it finished and its own
    /// retention passed (as the server announced in `removable_at`); then it is marked pruned.
    pub fn on_removed(&mut self, j: usize, now: Timestamp) -> Check {
        let m = &mut self.jobs[j];
        match (m.terminal, m.removable_at) {
            (Some(_), Some(at)) if now >= at => {
                m.pruned = true;
                Ok(())
            }
            (Some(state), at) => Err(format!(
                "job {j} ({}) is gone from the store at {now}: it ended {state} but may be removed only from {at:?}",
                m.key
            )),
            (None, _) => Err(format!(
                "job {j} ({}) is gone from the store at {now}, but it was never seen finished: nothing may be pruned while active",
                m.key
            )),
        }
    }

    /// Which steps a rerun of job `old` from failure keeps, as far as everything acknowledged
    /// says: a step whose work completed (or that `old`, itself a rerun, kept), was not undone
    /// (nor its failed undo skipped), and whose dependencies are all kept. (Worked out here from the model, not by the core.)
    pub fn expected_kept(&self, old: usize) -> Vec<bool> {
        let steps = &self.jobs[old].steps;
        let mut kept: Vec<bool> = steps
            .iter()
            .map(|s| {
                let done = s.work_done.is_some() || s.kept.is_some();
                done && s.undo_done == 0 && !s.undo_skipped
            })
            .collect();
        loop {
            let mut changed = false;
            for (i, s) in steps.iter().enumerate() {
                if kept[i] && s.deps.iter().any(|&d| !kept[d]) {
                    kept[i] = false;
                    changed = true;
                }
            }
            if !changed {
                return kept;
            }
        }
    }

    /// The result of `step`'s work as acknowledged (its completion, or what a rerun kept).
    pub fn result_of(&self, job: usize, step: usize) -> Option<Value> {
        let s = &self.jobs[job].steps[step];
        s.kept
            .clone()
            .or_else(|| s.work_done.and_then(|l| s.leases[l].result.clone()))
    }

    /// The server made job `id`, a rerun of job `old` keeping the steps `kept`: registers it
    /// (committed now, with `old`'s steps and ordering key, due at once).
    pub fn on_rerun(&mut self, old: usize, id: JobId, kept: &[bool]) -> Check<usize> {
        let results: Vec<Option<Value>> = (0..kept.len())
            .map(|i| kept[i].then(|| self.result_of(old, i).unwrap_or(Value::Null)))
            .collect();
        let m = &self.jobs[old];
        let shape = m
            .steps
            .iter()
            .map(|s| StepShape {
                name: s.name.clone(),
                deps: s.deps.clone(),
                payload: s.payload.clone(),
                timeout_ms: s.timeout_ms,
                max_attempts: s.max_attempts,
                undo_payload: s.undo_payload.clone(),
                undo_max_attempts: s.undo_max_attempts,
                deadline_ms: s.deadline_ms,
            })
            .collect();
        let key = format!("rerun of {}", m.key);
        let ordering_key = m.ordering_key.clone();
        let new = self.add_job(key, Value::Null, ordering_key, None, shape);
        for (s, result) in self.jobs[new].steps.iter_mut().zip(results) {
            s.kept = result;
        }
        self.jobs[new].rerun_of = Some(old);
        // The rerun has the old job's definition: its whole-job retry and its own retention.
        self.jobs[new].retry = self.jobs[old].retry;
        self.jobs[new].own_retention = self.jobs[old].own_retention;
        self.jobs[new].acked = true;
        self.jobs[old].rerun = Some(new);
        self.on_submitted(new, 202, id)?;
        Ok(new)
    }

    pub fn job_of(&self, id: JobId) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    pub fn lease_of(&self, id: LeaseId) -> Option<(usize, usize, usize)> {
        self.leases.get(&id).copied()
    }

    pub fn lease(&self, id: LeaseId) -> Option<&LeaseModel> {
        let (j, s, l) = self.lease_of(id)?;
        Some(&self.jobs[j].steps[s].leases[l])
    }

    /// A submit was answered `status` with job `id`.
    pub fn on_submitted(&mut self, job: usize, status: u16, id: JobId) -> Check {
        let m = &mut self.jobs[job];
        match (status, m.id) {
            (202, None) => {
                m.id = Some(id);
                m.commit_order = Some(self.commits);
                self.commits += 1;
                self.by_id.insert(id, job);
                Ok(())
            }
            (202, Some(first)) => Err(format!(
                "submit of key {} created a second job {id} (the first was {first})",
                m.key
            )),
            (200, Some(first)) if first == id => Ok(()),
            (200, Some(first)) => Err(format!(
                "resubmit of key {} answered job {id}, but the key belongs to {first}",
                m.key
            )),
            (200, None) => Err(format!(
                "submit of key {} answered 200 (existing) with {id}, but no job was ever created for it",
                m.key
            )),
            (s, _) => Err(format!("submit of key {} answered {s}", m.key)),
        }
    }

    /// A lease was handed out at `now` (whether or not the agent got the answer). Checks fencing,
    /// dependency order, cancellation and the order of compensation, then records it.
    pub fn on_lease(&mut self, lease: &Lease, worker: &str, now: Timestamp) -> Check<usize> {
        let j = self.job_of(lease.job_id).ok_or_else(|| {
            format!(
                "lease {} names job {}, which no submit created",
                lease.lease_id, lease.job_id
            )
        })?;
        let job = &self.jobs[j];
        let s = job
            .steps
            .iter()
            .position(|x| x.name == lease.step)
            .ok_or_else(|| format!("lease {} names unknown step {}", lease.lease_id, lease.step))?;
        let step = &job.steps[s];
        let what = format!("job {j} ({}) step {}", job.key, step.name);
        let expected = step.leases.len() as u32 + 1;
        if lease.attempt != expected {
            return Err(format!(
                "{what}: lease {} has attempt {}, but {} leases were handed out before it",
                lease.lease_id,
                lease.attempt,
                step.leases.len()
            ));
        }
        let undo = lease.kind == LeaseKind::Compensate;
        check_lease_content(&what, job, s, lease, now)?;
        if !undo {
            if let Some(at) = job.run_at.filter(|at| now < *at) {
                return Err(format!("{what}: work leased before the job's run_at {at}"));
            }
        }
        if let Some(prev) = step.leases.iter().find(|l| l.live(now)) {
            return Err(format!(
                "{what}: a new lease (attempt {}) was handed out while {} is still live: two live leases",
                lease.attempt,
                prev.describe(now)
            ));
        }
        let limits = self.limits.get(&lease.agent).copied().unwrap_or_default();
        if limits.paused {
            return Err(format!(
                "{what}: lease {} handed to agent {} while it is paused",
                lease.lease_id, lease.agent
            ));
        }
        if let Some(max) = limits.max_concurrency {
            let live = self
                .jobs
                .iter()
                .flat_map(|j| &j.steps)
                .flat_map(|s| &s.leases)
                .filter(|l| l.agent == lease.agent && l.live(now))
                .count();
            if live + 1 > max as usize {
                return Err(format!(
                    "{what}: lease {} handed to agent {} with {live} of its leases live, over its max_concurrency {max}",
                    lease.lease_id, lease.agent
                ));
            }
        }
        if !undo {
            if step.kept.is_some() {
                return Err(format!(
                    "{what}: work leased (attempt {}) for a kept step: a rerun never runs a kept step again",
                    lease.attempt
                ));
            }
            if let Some(at) = job.cancel_at {
                return Err(format!(
                    "{what}: work leased (attempt {}) after the job's cancel was acknowledged at {at}",
                    lease.attempt
                ));
            }
            if step.work_done.is_some() {
                return Err(format!(
                    "{what}: work leased again (attempt {}) after a completion was acknowledged",
                    lease.attempt
                ));
            }
            for &d in &step.deps {
                let dep = &job.steps[d];
                if dep.work_done.is_none() && !dep.skipped && dep.kept.is_none() {
                    return Err(format!(
                        "{what}: work leased (attempt {}) before its dependency {} succeeded or was skipped",
                        lease.attempt, dep.name
                    ));
                }
            }
        } else {
            if step.work_done.is_none() && step.kept.is_none() {
                return Err(format!(
                    "{what}: undo leased (attempt {}) for a step whose work never succeeded",
                    lease.attempt
                ));
            }
            if step.undo_done > 0 {
                return Err(format!(
                    "{what}: undo leased again (attempt {}) after an undo completed",
                    lease.attempt
                ));
            }
            for &y in &step.dependants {
                let dep = &job.steps[y];
                if let Some(l) = dep.leases.iter().find(|l| !l.undo && l.live(now)) {
                    return Err(format!(
                        "{what}: undo leased (attempt {}) while its dependant {} still runs ({})",
                        lease.attempt,
                        dep.name,
                        l.describe(now)
                    ));
                }
                if (dep.work_done.is_some() || dep.kept.is_some())
                    && dep.compensate
                    && !dep.undo_skipped
                    && dep.undo_done == 0
                {
                    return Err(format!(
                        "{what}: undo leased (attempt {}) before its dependant {} was undone: not reverse dependency order",
                        lease.attempt, dep.name
                    ));
                }
            }
        }
        let model = LeaseModel {
            id: lease.lease_id,
            agent: lease.agent.clone(),
            attempt: lease.attempt,
            undo,
            granted_at: now,
            expires_at: lease.complete_by,
            granted_until: lease.complete_by,
            hard_end: step
                .deadline_ms
                .map(|d| now.plus(overseer_core::Span::from_millis(d))),
            deadline_swept: false,
            worker: worker.to_string(),
            ended: false,
            result: None,
        };
        let step = &mut self.jobs[j].steps[s];
        step.leases.push(model);
        self.leases
            .insert(lease.lease_id, (j, s, step.leases.len() - 1));
        Ok(j)
    }

    /// A report about a known lease was answered `status` at `now`.
    pub fn on_report(
        &mut self,
        lease_id: LeaseId,
        kind: ReportKind,
        request: &Value,
        status: u16,
        answer: &Value,
        now: Timestamp,
    ) -> Check<Followup> {
        let (j, s, l) = self
            .lease_of(lease_id)
            .ok_or_else(|| format!("report for lease {lease_id}, which was never handed out"))?;
        let step = &self.jobs[j].steps[s];
        let lease = &step.leases[l];
        let what = format!(
            "job {j} ({}) step {}: {} of {}",
            self.jobs[j].key,
            step.name,
            kind.path(),
            lease.describe(now)
        );
        let live = lease.live(now);
        match status {
            200..=299 => {
                if !live {
                    return Err(format!(
                        "{what} was answered {status}: a report for a lease that is not live was accepted"
                    ));
                }
                let step = &mut self.jobs[j].steps[s];
                match kind {
                    ReportKind::Heartbeat => {
                        let until: Timestamp =
                            serde_json::from_value(answer["complete_by"].clone()).map_err(|e| {
                                format!("{what}: heartbeat answer without complete_by: {e}")
                            })?;
                        if until < step.leases[l].expires_at {
                            return Err(format!(
                                "{what}: heartbeat moved the lease's end back to {until}"
                            ));
                        }
                        if let Some(end) = step.leases[l].hard_end.filter(|e| until > *e) {
                            return Err(format!(
                                "{what}: heartbeat renewed the lease to {until}, past the attempt's deadline {end}"
                            ));
                        }
                        step.leases[l].expires_at = until;
                    }
                    ReportKind::Complete => {
                        step.leases[l].ended = true;
                        step.leases[l].result = Some(request["result"].clone());
                        if step.leases[l].undo {
                            step.undo_done += 1;
                            if step.undo_done > 1 {
                                return Err(format!(
                                    "{what}: a second undo completion was acknowledged: undone twice"
                                ));
                            }
                        } else {
                            if let Some(first) = step.work_done {
                                return Err(format!(
                                    "{what}: a second completion was acknowledged (the first was attempt {})",
                                    step.leases[first].attempt
                                ));
                            }
                            step.work_done = Some(l);
                        }
                    }
                    ReportKind::Fail => step.leases[l].ended = true,
                }
                Ok(Followup::None)
            }
            409 if live => match kind {
                ReportKind::Complete if !lease.undo => {
                    self.jobs[j].steps[s].leases[l].ended = true;
                    Ok(Followup::RefusedLiveComplete { job: j, step: s })
                }
                _ => Err(format!(
                    "{what} was refused (409) although the lease is live: {answer}"
                )),
            },
            409 => Ok(Followup::None),
            404 if self.jobs[j].pruned => Ok(Followup::None),
            404 => Err(format!("{what}: the server does not know the lease (404)")),
            other => Err(format!("{what} was answered {other}: {answer}")),
        }
    }

    /// Leases whose attempt's hard end had come by `now` and that no check has yet seen ended:
    /// `(job, step, lease)`.
    pub fn overdue(&self, now: Timestamp) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for (j, job) in self.jobs.iter().enumerate() {
            for (s, step) in job.steps.iter().enumerate() {
                for (l, lease) in step.leases.iter().enumerate() {
                    let due = lease.hard_end.is_some_and(|e| e <= now);
                    if due && !lease.ended && !lease.deadline_swept {
                        out.push((j, s, l));
                    }
                }
            }
        }
        out
    }

    /// A move of the job's `run_at` to `to` was applied (answered 2xx): no work may start
    /// before it.
    pub fn on_rescheduled(&mut self, job: usize, to: Timestamp) {
        self.jobs[job].run_at = Some(to);
    }

    /// A cancel was acknowledged at `now`.
    pub fn on_cancelled(&mut self, job: usize, now: Timestamp) {
        let m = &mut self.jobs[job];
        if m.cancel_at.is_none() {
            m.cancel_at = Some(now);
        }
    }

    /// An operator's skip of `step` was acknowledged; `undo` if it skipped a failed undo.
    pub fn on_skipped(&mut self, job: usize, step: usize, undo: bool) {
        let s = &mut self.jobs[job].steps[step];
        if undo {
            s.undo_skipped = true;
        } else {
            s.skipped = true;
        }
    }
}

/// A lease carries what its step was submitted with: the idempotency key, the payload, the
/// timeout counted from now, and each dependency's acknowledged result as `inputs` (for an undo,
/// the undone step's own result).
fn check_lease_content(
    what: &str,
    job: &JobModel,
    s: usize,
    lease: &Lease,
    now: Timestamp,
) -> Check {
    let step = &job.steps[s];
    let undo = lease.kind == LeaseKind::Compensate;
    let id = job.id.map(|id| id.to_string()).unwrap_or_default();
    let key = if undo {
        format!("{id}/{}/compensate", step.name)
    } else {
        format!("{id}/{}", step.name)
    };
    if lease.idempotency_key != key {
        return Err(format!(
            "{what}: lease {} carries idempotency key {}, expected {key}",
            lease.lease_id, lease.idempotency_key
        ));
    }
    let payload = if undo {
        step.undo_payload.clone().unwrap_or(Value::Null)
    } else {
        step.payload.clone()
    };
    if lease.payload != payload {
        return Err(format!(
            "{what}: lease {} carries payload {}, submitted {payload}",
            lease.lease_id, lease.payload
        ));
    }
    // The first lease ends at the timeout, or at the attempt's deadline when that comes first.
    let lease_ms = step
        .deadline_ms
        .map_or(step.timeout_ms, |d| d.min(step.timeout_ms));
    let until = now.plus(overseer_core::Span::from_millis(lease_ms));
    if lease.timeout_ms != step.timeout_ms
        || lease.complete_by != until
        || lease.lease_ms != lease_ms
    {
        return Err(format!(
            "{what}: lease {} runs until {} ({} ms, timeout {} ms); the step's timeout is {} ms from now",
            lease.lease_id, lease.complete_by, lease.lease_ms, lease.timeout_ms, step.timeout_ms
        ));
    }
    let result_of = |x: &StepModel| {
        x.kept
            .clone()
            .or_else(|| x.work_done.and_then(|l| x.leases[l].result.clone()))
            .unwrap_or(Value::Null)
    };
    let mut inputs = serde_json::Map::new();
    if undo {
        inputs.insert(step.name.clone(), result_of(step));
    } else {
        for &d in &step.deps {
            inputs.insert(job.steps[d].name.clone(), result_of(&job.steps[d]));
        }
    }
    if lease.inputs != inputs {
        return Err(format!(
            "{what}: lease {} carries inputs {:?}, but the acknowledged results are {inputs:?}",
            lease.lease_id, lease.inputs
        ));
    }
    Ok(())
}
