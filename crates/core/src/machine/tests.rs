//! Tests of the job and step state machines.
//!
//! Every command goes through [`Sim`], which checks the transition against the contract (fencing,
//! `changed_steps`, `job_changed`, `updated_at`, events, effects), the job's invariants after it,
//! that `Repair` finds nothing to heal in the state reached, and records each state edge taken.
//! On top of that: one table per transition, a property test over random DAGs (with random undos
//! and `on_failure`) and random command sequences (agents and operators), and a test that every
//! edge of the mermaid diagram in `machine.rs` is exercised and that no other edge ever occurs.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{
    admit, apply, Command, Effect, Rejection, Reply, RetiredLease, Transition, POISON_FAILURES,
};
use crate::backoff::{Backoff, Formula};
use crate::id::{JobId, LeaseId};
use crate::job::{
    AlertKind, CompPhase, DesiredState, EventKind, Job, JobState, NewEvent, Step, StepState,
};
use crate::spec::{CompensateSpec, JobExhausted, JobSpec, Limits, OnFailure, StepSpec};
use crate::time::{Span, Timestamp};

mod progress;
mod rerun;

/// Where test time starts: 2026-01-01T00:00:00Z. Every `ms` argument below is an offset from it.
const T0: i64 = 1_767_225_600_000;
const TIMEOUT: Span = Span::from_secs(10);
/// Undo leases last 3 s unless a test says otherwise.
const UNDO_TIMEOUT: Span = Span::from_secs(3);
/// Retries wait 1 s, 2 s, 4 s, then 5 s (the cap) before jitter.
const BACKOFF: Backoff = Backoff {
    initial: Span::from_secs(1),
    factor: 2.0,
    max: Span::from_secs(5),
};

/// A state edge: `(machine, from, to)`, named as in the diagram (`[*]` is the start).
type Edge = (&'static str, &'static str, &'static str);

/// The edges of the diagram at the top of `machine.rs`, one line each.
/// `edge_list_matches_the_diagram` keeps this list and the diagram equal.
const DIAGRAM_EDGES: &[Edge] = &[
    ("job", "[*]", "pending"),
    ("job", "[*]", "running"),
    ("job", "pending", "running"),
    ("job", "pending", "cancelled"),
    ("job", "pending", "failed"),
    ("job", "running", "succeeded"),
    ("job", "running", "failed"),
    ("job", "running", "blocked"),
    ("job", "running", "compensating"),
    ("job", "running", "cancelled"),
    ("job", "blocked", "running"),
    ("job", "blocked", "succeeded"),
    ("job", "blocked", "compensating"),
    ("job", "blocked", "cancelled"),
    ("job", "compensating", "blocked"),
    ("job", "compensating", "failed"),
    ("job", "compensating", "cancelled"),
    ("job", "compensating", "running"),
    ("job", "blocked", "failed"),
    ("step", "[*]", "waiting"),
    ("step", "waiting", "ready"),
    ("step", "waiting", "succeeded"),
    ("step", "ready", "running"),
    ("step", "running", "running"),
    ("step", "running", "succeeded"),
    ("step", "running", "ready"),
    ("step", "running", "waiting"),
    ("step", "ready", "waiting"),
    ("step", "running", "failed"),
    ("step", "running", "cancelled"),
    ("step", "waiting", "cancelled"),
    ("step", "ready", "cancelled"),
    ("step", "failed", "ready"),
    ("step", "failed", "waiting"),
    ("step", "failed", "skipped"),
    ("step", "succeeded", "compensating"),
    ("step", "compensating", "compensating"),
    ("step", "compensating", "compensated"),
    ("step", "compensating", "skipped"),
    ("step", "compensated", "waiting"),
    ("step", "succeeded", "waiting"),
    ("step", "cancelled", "waiting"),
    ("step", "skipped", "waiting"),
];

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

fn step(name: &str, agent: &str, deps: &[&str], max_attempts: u32) -> StepSpec {
    StepSpec {
        name: name.into(),
        agent: agent.into(),
        payload: json!({ "step": name }),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        timeout: Some(TIMEOUT),
        deadline: None,
        max_attempts: Some(max_attempts),
        backoff: Some(BACKOFF),
        backoff_formula: None,
        compensate: None,
        http: None,
        progress_events: None,
    }
}

/// A step (3 attempts) whose undo runs on agent `u` with `undo_attempts` attempts (0: no limit).
fn undoable(name: &str, agent: &str, deps: &[&str], undo_attempts: u32) -> StepSpec {
    StepSpec {
        compensate: Some(CompensateSpec {
            agent: "u".into(),
            http: None,
            payload: json!({ "undo": name }),
            timeout: Some(UNDO_TIMEOUT),
            deadline: None,
            max_attempts: Some(undo_attempts),
        }),
        ..step(name, agent, deps, 3)
    }
}

fn spec(steps: Vec<StepSpec>, run_at: Option<Timestamp>) -> JobSpec {
    JobSpec {
        idempotency_key: None,
        labels: BTreeMap::new(),
        priority: 0,
        run_at,
        ordering_key: None,
        callback_url: None,
        on_failure: None,
        retention: None,
        deadline: None,
        job_attempts: None,
        job_backoff: None,
        job_exhausted: None,
        steps,
    }
}

/// A job that starts now with the given `on_failure` (`None`: the default).
fn job(steps: Vec<StepSpec>, on_failure: Option<OnFailure>) -> JobSpec {
    JobSpec {
        on_failure,
        ..spec(steps, None)
    }
}

/// a → (b, c) → d; b runs on agent `y`, the others on `x`; `a` has `max_attempts`, the rest 3.
fn diamond(max_attempts: u32) -> JobSpec {
    spec(
        vec![
            step("a", "x", &[], max_attempts),
            step("b", "y", &["a"], 3),
            step("c", "x", &["a"], 3),
            step("d", "x", &["b", "c"], 3),
        ],
        None,
    )
}

/// Two independent roots a (agent x) and b (agent y), and c after a.
fn forked(max_attempts: u32) -> JobSpec {
    spec(
        vec![
            step("a", "x", &[], max_attempts),
            step("b", "y", &[], 3),
            step("c", "x", &["a"], 3),
        ],
        None,
    )
}

/// The issue's chain a → b → c → d: a and b can be undone (2 attempts each), c and d cannot.
fn chain() -> JobSpec {
    spec(
        vec![
            undoable("a", "x", &[], 2),
            undoable("b", "x", &["a"], 2),
            step("c", "x", &["b"], 3),
            step("d", "x", &["c"], 3),
        ],
        None,
    )
}

fn start(spec: &JobSpec) -> Sim {
    Sim::admit(spec, at(0)).0
}

fn ready(agent: &str) -> Effect {
    Effect::Ready {
        agent: agent.into(),
    }
}

fn finished(state: JobState) -> Effect {
    Effect::Finished { state }
}

/// Step states as `name:state` words, e.g. `"a:running b:waiting"`; a compensating step shows its
/// undo's phase (`a:compensating/ready`).
fn states(job: &Job) -> String {
    let words: Vec<String> = job
        .steps
        .iter()
        .map(|s| match s.comp_phase {
            Some(phase) => format!("{}:{}/{}", s.name, s.state, phase),
            None => format!("{}:{}", s.name, s.state),
        })
        .collect();
    words.join(" ")
}

/// Events as `kind[ step][#attempt]`, e.g. `"step_leased a#1"`.
fn kinds(events: &[NewEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let mut text = e.kind.to_string();
            if let Some(step) = &e.step {
                text += &format!(" {step}");
            }
            if let Some(attempt) = e.attempt {
                text += &format!("#{attempt}");
            }
            text
        })
        .collect()
}

/// Effects as short words, alert messages left out: `ready x`, `ready x at <t>`,
/// `finished failed`, `alert job_failed`, `alert step_poisoned a`, `callback failed`.
fn effect_words(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .map(|e| match e {
            Effect::Ready { agent } => format!("ready {agent}"),
            Effect::ReadyAt { agent, at } => format!("ready {agent} at {at}"),
            Effect::Finished { state } => format!("finished {state}"),
            Effect::Alert {
                kind,
                step,
                message,
            } => {
                assert!(!message.is_empty(), "an alert says something");
                match step {
                    Some(step) => format!("alert {kind} {step}"),
                    None => format!("alert {kind}"),
                }
            }
            Effect::Callback { state } => format!("callback {state}"),
            Effect::Due { at } => format!("due {at}"),
        })
        .collect()
}

/// The detail of the first event of this kind in the transition.
fn detail(tr: &Transition, kind: EventKind) -> Option<Value> {
    tr.events
        .iter()
        .find(|e| e.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {:?}", kinds(&tr.events)))
        .detail
        .clone()
}

/// Brings a table case's job to the state the case is about.
type Setup = fn(&mut Sim);

/// A job under test with its clock. Every command is checked on the way (see `check_transition`
/// and `check_job`) and the state edges it takes are recorded.
#[derive(Clone)]
struct Sim {
    job: Job,
    now: Timestamp,
    edges: BTreeSet<Edge>,
    /// Every event recorded so far (the core sets no limit on history).
    history: Vec<NewEvent>,
    leases: u128,
}

impl Sim {
    fn admit(spec: &JobSpec, now: Timestamp) -> (Sim, Transition) {
        let fresh = Job::from_spec(JobId(Uuid::from_u128(1)), spec, now);
        let tr = admit(fresh.clone(), now);
        (Sim::admitted(&fresh, &tr, now), tr)
    }

    /// A `Sim` of the job `fresh` as its admission `tr` at `now` left it, after checking that
    /// admission.
    fn admitted(fresh: &Job, tr: &Transition, now: Timestamp) -> Sim {
        assert_eq!(
            tr.events.first().map(|e| e.kind),
            Some(EventKind::JobSubmitted)
        );
        assert!(tr.events.iter().all(|e| e.at == now));
        assert_eq!(tr.job.updated_at, now);
        let changed: Vec<usize> = (0..fresh.steps.len())
            .filter(|&i| fresh.steps[i] != tr.job.steps[i])
            .collect();
        assert_eq!(tr.changed_steps, changed);
        check_job(&tr.job);
        check_repair_is_noop(&tr.job, now);
        let mut sim = Sim {
            job: tr.job.clone(),
            now,
            edges: BTreeSet::new(),
            history: tr.events.clone(),
            leases: 0,
        };
        sim.record("job", "[*]", tr.job.state.as_str());
        for s in &tr.job.steps {
            sim.record("step", "[*]", "waiting");
            if s.state != StepState::Waiting {
                sim.record("step", "waiting", s.state.as_str());
            }
        }
        sim
    }

    fn record(&mut self, machine: &'static str, from: &'static str, to: &'static str) {
        let edge = (machine, from, to);
        assert!(
            DIAGRAM_EDGES.contains(&edge),
            "edge {edge:?} is not in the diagram"
        );
        self.edges.insert(edge);
    }

    /// Applies a command at the current time, checks it, and keeps the new job if accepted.
    fn send(&mut self, command: Command) -> Result<Transition, Rejection> {
        let result = apply(&self.job, command.clone(), self.now);
        check_transition(&self.job, &command, self.now, &result);
        if let Ok(tr) = &result {
            let mut taken = Vec::new();
            if tr.job.state != self.job.state {
                taken.push(("job", self.job.state.as_str(), tr.job.state.as_str()));
            }
            let new_round = tr
                .events
                .iter()
                .any(|e| e.kind == EventKind::JobRoundStarted);
            for (i, (b, a)) in self.job.steps.iter().zip(&tr.job.steps).enumerate() {
                if new_round {
                    // Every step went back to waiting (an undo that completed in this very
                    // transition first to compensated), and the roots on to ready.
                    let mut from = b.state.as_str();
                    if b.state == StepState::Compensating {
                        let skipped = tr.events.iter().any(|e| {
                            e.kind == EventKind::CompensationSkipped
                                && e.step.as_deref() == Some(&b.name)
                        });
                        from = if skipped { "skipped" } else { "compensated" };
                        taken.push(("step", "compensating", from));
                    }
                    if from != "waiting" {
                        taken.push(("step", from, "waiting"));
                    }
                    if a.state == StepState::Ready {
                        taken.push(("step", "waiting", "ready"));
                    }
                    continue;
                }
                // A heartbeat, or any change that keeps the state, is a self-edge
                // (running → running), even when the lease happens to end where it did.
                let beat = matches!(command, Command::Heartbeat { step, .. } if step == i);
                if b != a || beat {
                    taken.push(("step", b.state.as_str(), a.state.as_str()));
                }
            }
            for (machine, from, to) in taken {
                self.record(machine, from, to);
            }
            // No lease on a step's work is granted unless the job is running.
            if tr.events.iter().any(|e| e.kind == EventKind::StepLeased) {
                assert_eq!(self.job.state, JobState::Running, "{command:?}");
            }
            self.history.extend(tr.events.iter().cloned());
            self.job = tr.job.clone();
            check_job(&self.job);
            self.check_history();
            check_repair_is_noop(&self.job, self.now);
        }
        result
    }

    /// What the history says against the steps: every lease is one `*_leased` event, a step is
    /// compensated at most once, and only a step that succeeded is ever compensated.
    fn check_history(&self) {
        // Leases count over the whole history (attempts never restart); the rest over the
        // current round of a whole-job retry.
        let mut leases: BTreeMap<(EventKind, &str), u32> = BTreeMap::new();
        for e in &self.history {
            if let Some(step) = &e.step {
                *leases.entry((e.kind, step.as_str())).or_default() += 1;
            }
        }
        self.check_rounds();
        let round_start = self
            .history
            .iter()
            .rposition(|e| e.kind == EventKind::JobRoundStarted)
            .unwrap_or(0);
        let mut count: BTreeMap<(EventKind, &str), u32> = BTreeMap::new();
        for e in &self.history[round_start..] {
            if let Some(step) = &e.step {
                *count.entry((e.kind, step.as_str())).or_default() += 1;
            }
        }
        let n = |kind: EventKind, step: &Step| {
            count.get(&(kind, step.name.as_str())).copied().unwrap_or(0)
        };
        for s in &self.job.steps {
            let ctx = || format!("step {}: {}", s.name, states(&self.job));
            let all = |kind: EventKind| leases.get(&(kind, s.name.as_str())).copied().unwrap_or(0);
            let work = all(EventKind::StepLeased);
            let undo = all(EventKind::CompensationLeased);
            assert_eq!(work + undo, s.attempt, "leases: {}", ctx());
            assert_eq!(undo, s.comp_attempts, "undo leases: {}", ctx());
            assert!(
                n(EventKind::StepCompensated, s) <= 1,
                "compensated twice: {}",
                ctx()
            );
            if matches!(s.state, StepState::Compensating | StepState::Compensated)
                || n(EventKind::CompensationLeased, s) > 0
            {
                assert!(
                    n(EventKind::StepSucceeded, s) + n(EventKind::StepKept, s) == 1,
                    "undo of a step that never succeeded: {}",
                    ctx()
                );
            }
            assert_eq!(
                n(EventKind::StepCompensated, s),
                u32::from(s.state == StepState::Compensated),
                "{}",
                ctx()
            );
        }
    }

    /// Every finished round of a whole-job retry undid exactly the steps that succeeded in it
    /// and declare an undo (or an operator skipped that undo), and the next round started
    /// with every step waiting or ready again.
    fn check_rounds(&self) {
        let mut start = 0;
        for (i, e) in self.history.iter().enumerate() {
            if e.kind != EventKind::JobRoundStarted {
                continue;
            }
            let round = &self.history[start..i];
            let names = |kinds: &[EventKind]| -> BTreeSet<String> {
                round
                    .iter()
                    .filter(|e| kinds.contains(&e.kind))
                    .filter_map(|e| e.step.clone())
                    .collect()
            };
            let undoable: BTreeSet<String> =
                names(&[EventKind::StepSucceeded, EventKind::StepKept])
                    .into_iter()
                    .filter(|n| {
                        let i = self.job.step_index(n).expect("a step of the job");
                        self.job.steps[i].compensate.is_some()
                    })
                    .collect();
            let undone = names(&[EventKind::StepCompensated, EventKind::CompensationSkipped]);
            assert_eq!(
                undone, undoable,
                "round ending at event {i}: {:?}",
                e.detail
            );
            start = i;
        }
    }

    fn ok(&mut self, command: Command) -> Transition {
        let shown = format!("{command:?}");
        self.send(command)
            .unwrap_or_else(|e| panic!("{shown} was rejected: {e:?}"))
    }

    fn set_time(&mut self, ms: i64) {
        self.set_now(at(ms));
    }

    fn set_now(&mut self, t: Timestamp) {
        assert!(t >= self.now, "time only moves forward");
        self.now = t;
    }

    fn advance(&mut self, ms: u64) {
        self.now = self.now.plus(Span::from_millis(ms));
    }

    fn idx(&self, name: &str) -> usize {
        self.job
            .step_index(name)
            .unwrap_or_else(|| panic!("no step {name}"))
    }

    fn step(&self, name: &str) -> &Step {
        &self.job.steps[self.idx(name)]
    }

    fn attempt(&self, name: &str) -> u32 {
        self.step(name).attempt
    }

    fn claim_cmd(&mut self, step: usize) -> Command {
        self.leases += 1;
        Command::Claim {
            step,
            lease_id: LeaseId(Uuid::from_u128(self.leases)),
            worker: "w1".into(),
        }
    }

    /// A claim command with a fresh lease id, without needing `&mut` (for tables).
    fn claim_cmd_peek(&self, step: usize) -> Command {
        Command::Claim {
            step,
            lease_id: LeaseId(Uuid::from_u128(u128::MAX - step as u128)),
            worker: "w2".into(),
        }
    }

    fn heartbeat_cmd(&self, name: &str, attempt: u32) -> Command {
        Command::Heartbeat {
            step: self.idx(name),
            attempt,
            progress: None,
        }
    }

    fn complete_cmd(&self, name: &str, attempt: u32) -> Command {
        Command::Complete {
            step: self.idx(name),
            attempt,
            result: json!({ "done": name }),
        }
    }

    fn fail_cmd(&self, name: &str, attempt: u32, retryable: bool) -> Command {
        Command::Fail {
            step: self.idx(name),
            attempt,
            error: "boom".into(),
            retryable,
            jitter: 0.0,
        }
    }

    fn expire_cmd(&self, name: &str, attempt: u32) -> Command {
        Command::Expire {
            step: self.idx(name),
            attempt,
            jitter: 0.0,
        }
    }

    fn retry_cmd(&self, name: &str) -> Command {
        Command::Retry {
            step: self.idx(name),
            by: Some("ops".into()),
            reason: Some("fixed it".into()),
        }
    }

    fn skip_cmd(&self, name: &str) -> Command {
        Command::Skip {
            step: self.idx(name),
            by: Some("ops".into()),
            reason: None,
        }
    }

    fn claim(&mut self, name: &str) -> Transition {
        let command = self.claim_cmd(self.idx(name));
        self.ok(command)
    }

    fn heartbeat(&mut self, name: &str) -> Transition {
        self.ok(self.heartbeat_cmd(name, self.attempt(name)))
    }

    fn complete(&mut self, name: &str) -> Transition {
        self.ok(self.complete_cmd(name, self.attempt(name)))
    }

    fn fail(&mut self, name: &str, retryable: bool) -> Transition {
        self.ok(self.fail_cmd(name, self.attempt(name), retryable))
    }

    /// Moves the clock to the step's lease expiry (if not past it yet) and expires the lease.
    fn expire(&mut self, name: &str) -> Transition {
        let expiry = self
            .step(name)
            .lease_expires_at
            .expect("a leased step has an expiry");
        self.set_now(self.now.max(expiry));
        self.ok(self.expire_cmd(name, self.attempt(name)))
    }

    /// Moves the clock to the step's next attempt (if not there yet) and claims it.
    fn claim_when_due(&mut self, name: &str) -> Transition {
        if let Some(due) = self.step(name).next_attempt_at {
            self.set_now(self.now.max(due));
        }
        self.claim(name)
    }

    /// Claims and completes a step (its work, or its undo when it is compensating).
    fn run(&mut self, name: &str) -> Transition {
        self.claim_when_due(name);
        self.complete(name)
    }

    /// Claims a step and fails it for good (fatal).
    fn run_fatal(&mut self, name: &str) -> Transition {
        self.claim_when_due(name);
        self.fail(name, false)
    }

    fn cancel(&mut self) -> Transition {
        self.ok(Command::Cancel)
    }

    fn retry(&mut self, name: &str) -> Transition {
        self.ok(self.retry_cmd(name))
    }

    fn skip(&mut self, name: &str) -> Transition {
        self.ok(self.skip_cmd(name))
    }

    fn resume(&mut self) -> Transition {
        self.ok(Command::Resume {
            by: Some("ops".into()),
            reason: None,
        })
    }

    fn repair(&mut self) -> Transition {
        self.ok(Command::Repair)
    }
}

/// `Repair` heals only what a fault left inconsistent: on any state the machine reaches by
/// itself it changes nothing and records nothing.
fn check_repair_is_noop(job: &Job, now: Timestamp) {
    let tr = apply(job, Command::Repair, now).expect("repair is always accepted");
    assert!(
        tr.is_noop() && tr.effects.is_empty() && &tr.job == job,
        "repair of a reachable state did something: {:?} {:?} on {} ({})",
        kinds(&tr.events),
        tr.effects,
        job.state,
        states(job)
    );
}

/// Every step that depends on step `i`, directly or through others.
fn dependants_of(job: &Job, i: usize) -> Vec<usize> {
    let mut seen = vec![false; job.steps.len()];
    let mut stack = vec![i];
    while let Some(x) = stack.pop() {
        for (j, s) in job.steps.iter().enumerate() {
            if !seen[j] && s.depends_on.contains(&job.steps[x].name) {
                seen[j] = true;
                stack.push(j);
            }
        }
    }
    (0..job.steps.len()).filter(|&j| seen[j]).collect()
}

/// The invariants of a job at rest.
fn check_job(job: &Job) {
    use StepState::*;
    let here = || format!("job {} ({}): {}", job.state, job.desired_state, states(job));
    assert_eq!(
        job.finished_at.is_some(),
        job.state.is_terminal(),
        "finished_at: {}",
        here()
    );
    assert_eq!(
        job.blocked_reason.is_some(),
        job.state == JobState::Blocked,
        "blocked_reason: {}",
        here()
    );
    assert!(job.updated_at >= job.created_at);
    let has = |st: StepState| job.steps.iter().any(|s| s.state == st);
    let undo_in = |phase: CompPhase| job.steps.iter().any(|s| s.comp_phase == Some(phase));
    for (i, s) in job.steps.iter().enumerate() {
        let ctx = || format!("step {}: {} ({:?})", s.name, here(), s);
        // A step that ever ran (in this round, for a whole-job retry, which starts every step
        // over with a fresh budget) found its dependencies done (they may be undone since).
        let ran = if job.round > 1 {
            s.attempt > s.budget_from
        } else {
            s.attempt > 0
        };
        if ran || matches!(s.state, Running | Succeeded) {
            for d in &s.depends_on {
                let dep = &job.steps[job.step_index(d).expect("dependencies exist")];
                assert!(
                    matches!(dep.state, Succeeded | Skipped | Compensating | Compensated),
                    "dependency {d} not done: {}",
                    ctx()
                );
            }
        }
        assert!(s.failures <= s.attempt, "failures > attempt: {}", ctx());
        assert!(s.comp_failures <= s.comp_attempts, "{}", ctx());
        assert!(s.comp_attempts <= s.attempt, "{}", ctx());
        assert_eq!(
            s.lease_expires_at.is_some(),
            s.is_leased(),
            "lease: {}",
            ctx()
        );
        // A compensating step keeps the finish time of its work until the undo settles it.
        assert_eq!(
            s.finished_at.is_some(),
            s.state.is_settled() || s.state == Compensating,
            "finished_at: {}",
            ctx()
        );
        assert_eq!(s.comp_phase.is_some(), s.state == Compensating, "{}", ctx());
        if matches!(s.state, Compensating | Compensated) {
            assert!(
                s.compensate.is_some() && s.result.is_some(),
                "only a succeeded step with an undo is undone: {}",
                ctx()
            );
        }
        match s.state {
            // A step that ran waits again only when parked by a blocked job, or in a new round
            // of a whole-job retry.
            Waiting => assert!(
                !ran || job.state == JobState::Blocked,
                "a waiting step that ran: {}",
                ctx()
            ),
            Ready => assert!(
                s.next_attempt_at.is_some() && s.ready_at.is_some(),
                "{}",
                ctx()
            ),
            Running => {
                assert!(
                    s.attempt >= 1 && s.lease_id.is_some() && s.worker.is_some(),
                    "{}",
                    ctx()
                );
                assert!(
                    s.next_attempt_at.is_none() && s.started_at.is_some(),
                    "{}",
                    ctx()
                );
            }
            Succeeded => assert!(s.result.is_some(), "{}", ctx()),
            _ => {}
        }
        match s.comp_phase {
            // An undo waits unrun (in this round) unless parked by a blocked job.
            Some(CompPhase::Waiting) => assert!(
                (s.comp_attempts == s.comp_budget_from || job.state == JobState::Blocked)
                    && s.next_attempt_at.is_none(),
                "{}",
                ctx()
            ),
            Some(CompPhase::Ready) => assert!(s.next_attempt_at.is_some(), "{}", ctx()),
            Some(CompPhase::Running) => assert!(
                s.comp_attempts >= 1
                    && s.lease_id.is_some()
                    && s.worker.is_some()
                    && s.next_attempt_at.is_none(),
                "{}",
                ctx()
            ),
            Some(CompPhase::Failed) | None => {}
        }
        // No lease outlives its attempt's deadline.
        if let (true, Some(end)) = (s.is_leased(), s.attempt_ends_at) {
            assert!(
                s.lease_expires_at.is_some_and(|t| t <= end),
                "lease past the attempt's deadline: {}",
                ctx()
            );
        }
        // An undo runs only once nothing that depends on its step runs or awaits its own undo,
        // and never beside a step's work.
        if matches!(s.comp_phase, Some(CompPhase::Ready | CompPhase::Running)) {
            for j in dependants_of(job, i) {
                let d = &job.steps[j];
                assert!(
                    !matches!(d.state, Running | Compensating),
                    "undo of {} before {} is done: {}",
                    s.name,
                    d.name,
                    here()
                );
            }
            assert!(!has(Running), "an undo beside running work: {}", here());
        }
    }
    // Backends index claimable steps by `claim_agent`: a step shows one only when its job would
    // take the claim (once due), so a blocked, cancelled or finished job has none.
    for s in &job.steps {
        if s.claim_agent().is_some() {
            let takes = if s.is_compensating() {
                job.state == JobState::Compensating
            } else {
                job.state == JobState::Running && job.desired_state == DesiredState::Succeeded
            };
            assert!(
                takes,
                "step {} is claimable in a job that refuses it: {}",
                s.name,
                here()
            );
        }
    }
    let unwinding = has(Compensating);
    if job.state.is_terminal() {
        // A failed job may still have running steps: they learn it from their heartbeat.
        assert!(
            !has(Waiting) && !has(Ready) && !unwinding,
            "a finished job has unstarted steps: {}",
            here()
        );
    }
    match job.state {
        JobState::Pending => {
            assert_eq!(job.desired_state, DesiredState::Succeeded, "{}", here());
            // Nothing started; only a rerun's kept steps are done already.
            let unstarted = |s: &Step| {
                s.state == Waiting
                    || (s.state == Succeeded && s.attempt == 0 && job.rerun_of.is_some())
            };
            assert!(job.steps.iter().all(unstarted), "{}", here());
        }
        JobState::Running => {
            assert!(
                !unwinding && !has(Compensated) && !has(Failed),
                "{}",
                here()
            );
            if job.desired_state == DesiredState::Cancelled {
                // Being cancelled: only running steps keep it from being cancelled.
                assert!(has(Running) && !has(Waiting) && !has(Ready), "{}", here());
            } else {
                assert!(!has(Cancelled), "{}", here());
                assert!(
                    !job.steps.iter().all(|s| s.state.satisfies_dependants()),
                    "{}",
                    here()
                );
            }
        }
        JobState::Blocked if unwinding => {
            // Blocked on a failed undo: nothing else runs or waits to.
            assert!(undo_in(CompPhase::Failed), "{}", here());
            assert!(!has(Running) && !has(Waiting) && !has(Ready), "{}", here());
        }
        JobState::Blocked => {
            // Held: a step failed for good and waits for an operator.
            assert!(has(Failed) && !has(Compensated), "{}", here());
            if job.desired_state == DesiredState::Cancelled {
                assert!(has(Running) && !has(Waiting) && !has(Ready), "{}", here());
            }
        }
        JobState::Compensating => {
            assert!(!has(Waiting) && !has(Ready), "{}", here());
            assert!(!undo_in(CompPhase::Failed), "{}", here());
            assert!(unwinding || has(Running), "nothing left to do: {}", here());
        }
        JobState::Succeeded => {
            assert_eq!(job.desired_state, DesiredState::Succeeded, "{}", here());
            assert!(
                job.steps.iter().all(|s| s.state.satisfies_dependants()),
                "{}",
                here()
            );
        }
        JobState::Failed => {
            assert_eq!(job.desired_state, DesiredState::Succeeded, "{}", here());
            // A step failed for good, or the job ran out of time.
            assert!(has(Failed) || job.deadline.is_some(), "{}", here());
        }
        JobState::Cancelled => {
            assert_eq!(job.desired_state, DesiredState::Cancelled, "{}", here());
            assert!(!has(Running), "{}", here());
        }
    }
}

/// Checks one command's outcome against the contract.
/// A heartbeat's progress is kept on its step with the time, and recorded in the history only
/// when the step asks for it and the value changed.
fn check_progress(before: &Job, command: &Command, now: Timestamp, tr: &Transition) {
    let Command::Heartbeat { step, progress, .. } = command else {
        return;
    };
    let (b, a) = (&before.steps[*step], &tr.job.steps[*step]);
    let recorded: Vec<&NewEvent> = tr
        .events
        .iter()
        .filter(|e| e.kind == EventKind::StepProgress || e.kind == EventKind::CompensationProgress)
        .collect();
    let Some(progress) = progress else {
        assert!(recorded.is_empty(), "{command:?}");
        return;
    };
    assert_eq!(a.progress.as_ref(), Some(progress), "{command:?}");
    assert_eq!(a.progress_at, Some(now), "{command:?}");
    let expected = b.progress_events && b.progress.as_ref() != Some(progress);
    assert_eq!(recorded.len(), usize::from(expected), "{command:?}");
    if let Some(e) = recorded.first() {
        let kind = match b.is_compensating() {
            true => EventKind::CompensationProgress,
            false => EventKind::StepProgress,
        };
        assert_eq!(e.kind, kind);
        assert_eq!(e.step.as_deref(), Some(b.name.as_str()));
        assert_eq!(e.attempt, Some(b.attempt));
        assert_eq!(e.detail, Some(json!({ "progress": progress })));
    }
}

fn check_transition(
    before: &Job,
    command: &Command,
    now: Timestamp,
    result: &Result<Transition, Rejection>,
) {
    let here = format!(
        "{command:?} at {now} on {} ({}): {result:?}",
        before.state,
        states(before)
    );
    // Whether the job still wants its steps' work (a report is taken, a heartbeat goes on).
    let wants_work = before.desired_state == DesiredState::Succeeded
        && matches!(before.state, JobState::Running | JobState::Blocked);
    let unwinding = before.steps.iter().any(|s| s.is_compensating());
    let step_of = |i: usize| before.steps.get(i);
    let refused_as = |expected: Rejection| {
        if result.is_err() {
            assert_eq!(result.as_ref().err(), Some(&expected), "{here}");
        }
    };
    // Whether the command is acceptable, as the contract states it.
    match command {
        Command::Activate => {
            let due = before.state == JobState::Pending && before.run_at.is_none_or(|t| t <= now);
            assert_eq!(result.is_ok(), due, "{here}");
            refused_as(Rejection::NotDue);
        }
        Command::Claim { step, .. } => {
            let claimable = step_of(*step).is_some_and(|s| {
                let due = s.next_attempt_at.is_none_or(|t| t <= now);
                let job_takes_it = if s.is_compensating() {
                    before.state == JobState::Compensating
                } else {
                    before.state == JobState::Running
                        && before.desired_state == DesiredState::Succeeded
                        && !before.past_deadline(now)
                };
                s.claim_agent().is_some() && due && job_takes_it
            });
            assert_eq!(result.is_ok(), claimable, "{here}");
            if step_of(*step).is_some() {
                refused_as(Rejection::NotClaimable);
            } else {
                refused_as(Rejection::UnknownStep);
            }
        }
        Command::Heartbeat { step, attempt, .. }
        | Command::Complete { step, attempt, .. }
        | Command::Fail { step, attempt, .. }
        | Command::FailRetryAfter { step, attempt, .. } => {
            // Fencing: only the current attempt, leased, before its expiry, may report.
            let live = step_of(*step).is_some_and(|s| {
                s.attempt == *attempt
                    && s.is_leased()
                    && s.lease_expires_at.is_some_and(|t| t > now)
            });
            assert_eq!(result.is_ok(), live, "{here}");
            if step_of(*step).is_some() {
                assert!(
                    live || matches!(result, Err(Rejection::LeaseLost { .. })),
                    "{here}"
                );
            } else {
                refused_as(Rejection::UnknownStep);
            }
        }
        Command::Expire { step, attempt, .. } => {
            let expired = step_of(*step).is_some_and(|s| {
                s.attempt == *attempt
                    && s.is_leased()
                    && s.lease_expires_at.is_some_and(|t| t <= now)
            });
            assert_eq!(result.is_ok(), expired, "{here}");
            if step_of(*step).is_some() {
                refused_as(Rejection::NotExpired);
            } else {
                refused_as(Rejection::UnknownStep);
            }
        }
        Command::Deadline => {
            let due = before.deadline_due().is_some_and(|t| t <= now);
            assert_eq!(result.is_ok(), due, "{here}");
            refused_as(Rejection::NotDue);
        }
        Command::Cancel => {
            assert_eq!(result.is_err(), before.state.is_terminal(), "{here}");
            refused_as(Rejection::JobTerminal {
                state: before.state,
            });
        }
        Command::Retry { step, .. } | Command::Skip { step, .. } => {
            // An operator may act on a blocked job's failed undo, or on a failed step while the
            // job is not unwinding (a retry also needs the job to still want the work).
            let retry = matches!(command, Command::Retry { .. });
            let allowed = before.state == JobState::Blocked
                && step_of(*step).is_some_and(|s| {
                    s.comp_phase == Some(CompPhase::Failed)
                        || (s.state == StepState::Failed && !unwinding && (wants_work || !retry))
                });
            assert_eq!(result.is_ok(), allowed, "{here}");
            if before.state == JobState::Blocked && step_of(*step).is_none() {
                refused_as(Rejection::UnknownStep);
            } else {
                assert!(
                    allowed || matches!(result, Err(Rejection::NotAllowed { .. })),
                    "{here}"
                );
            }
        }
        Command::Resume { .. } => {
            assert_eq!(result.is_ok(), before.state == JobState::Blocked, "{here}");
            assert!(
                result.is_ok() || matches!(result, Err(Rejection::NotAllowed { .. })),
                "{here}"
            );
        }
        Command::Repair => assert!(result.is_ok(), "{here}"),
        Command::Reschedule { run_at, .. } => {
            let allowed = !before.state.is_terminal()
                && (run_at.is_none() || before.state == JobState::Pending);
            assert_eq!(result.is_ok(), allowed, "{here}");
            if before.state.is_terminal() {
                refused_as(Rejection::JobTerminal {
                    state: before.state,
                });
            } else {
                assert!(
                    allowed || matches!(result, Err(Rejection::NotAllowed { .. })),
                    "{here}"
                );
            }
        }
    }
    let Ok(tr) = result else { return };
    let after = &tr.job;
    check_wakeups(tr, now, &here);
    match (command, &tr.reply) {
        (
            Command::Heartbeat { step, .. },
            Reply::Heartbeat {
                cancel,
                lease_expires_at,
            },
        ) => {
            // An undo is never told to stop; work is, once the job no longer wants it.
            let s = &before.steps[*step];
            assert_eq!(*cancel, !s.is_compensating() && !wants_work, "{here}");
            // A heartbeat renews for a timeout, but never past the attempt's hard end.
            let silence = now.plus(s.lease_timeout());
            let end = s.attempt_ends_at.map_or(silence, |e| silence.min(e));
            assert_eq!(*lease_expires_at, end, "{here}");
            assert_eq!(after.steps[*step].lease_expires_at, Some(*lease_expires_at));
            check_progress(before, command, now, tr);
        }
        (Command::Complete { step, .. }, Reply::Refused(Rejection::LeaseLost { .. })) => {
            assert!(
                !wants_work && !before.steps[*step].is_compensating(),
                "{here}"
            );
            // Cancelled, unless that ended an unwind and a whole-job retry started over.
            if after.round == before.round {
                assert_eq!(after.steps[*step].state, StepState::Cancelled, "{here}");
            }
        }
        (Command::Complete { step, .. }, Reply::Done) => {
            assert!(
                wants_work || before.steps[*step].is_compensating(),
                "{here}"
            )
        }
        (Command::Heartbeat { .. } | Command::Complete { .. }, _) => panic!("wrong reply: {here}"),
        (_, reply) => assert_eq!(reply, &Reply::Done, "{here}"),
    }
    // Steps keep what was submitted; attempts grow by one on a claim and never otherwise.
    assert_eq!(after.steps.len(), before.steps.len(), "{here}");
    for (i, (b, a)) in before.steps.iter().zip(&after.steps).enumerate() {
        let claimed = matches!(command, Command::Claim { step, .. } if *step == i);
        // Progress is kept by a heartbeat that reports it, and cleared by a new lease (or a new
        // round); nothing else touches it.
        let reported = matches!(
            command,
            Command::Heartbeat { step, progress: Some(_), .. } if *step == i
        );
        if claimed {
            assert_eq!((&a.progress, a.progress_at), (&None, None), "{here}");
        } else if !reported && after.round == before.round {
            assert_eq!(
                (&a.progress, a.progress_at),
                (&b.progress, b.progress_at),
                "{here}"
            );
        }
        assert_eq!(a.progress_events, b.progress_events, "{here}");
        assert_eq!(
            a.attempt,
            b.attempt + u32::from(claimed),
            "attempt of {}: {here}",
            a.name
        );
        assert_eq!(
            a.comp_attempts,
            b.comp_attempts + u32::from(claimed && b.is_compensating()),
            "comp_attempts of {}: {here}",
            a.name
        );
        assert!(
            a.failures == b.failures || a.failures == b.failures + 1,
            "{here}"
        );
        assert!(
            a.comp_failures == b.comp_failures || a.comp_failures == b.comp_failures + 1,
            "{here}"
        );
        assert!(
            a.budget_from >= b.budget_from && a.budget_from <= a.attempt,
            "{here}"
        );
        assert!(
            a.comp_budget_from >= b.comp_budget_from && a.comp_budget_from <= a.comp_attempts,
            "{here}"
        );
        let fixed = |s: &Step| {
            (
                s.name.clone(),
                s.agent.clone(),
                s.payload.clone(),
                s.depends_on.clone(),
                (
                    s.timeout,
                    s.max_attempts,
                    s.backoff,
                    s.compensate.clone(),
                    s.created_at,
                ),
            )
        };
        assert_eq!(fixed(a), fixed(b), "{here}");
    }
    // changed_steps lists exactly the steps that differ, or every step when the priority (which
    // each step row ranks its claims by) changed.
    let moved_priority = after.priority != before.priority;
    let changed: Vec<usize> = (0..before.steps.len())
        .filter(|&i| moved_priority || before.steps[i] != after.steps[i])
        .collect();
    assert_eq!(tr.changed_steps, changed, "changed_steps: {here}");
    // Of the job's own fields only these may change, and job_changed says whether they did.
    let fields_moved = after.state != before.state
        || after.desired_state != before.desired_state
        || after.finished_at != before.finished_at
        || after.blocked_reason != before.blocked_reason
        || after.priority != before.priority
        || after.run_at != before.run_at
        || after.round != before.round;
    // A new round starts only when an unwind of a whole-job retry ends, by one, and says so.
    if after.round != before.round {
        assert_eq!(after.round, before.round + 1, "{here}");
        assert!(
            before.retry.is_some_and(|r| after.round <= r.attempts),
            "{here}"
        );
        assert!(
            tr.events
                .iter()
                .any(|e| e.kind == EventKind::JobRoundStarted),
            "{here}"
        );
    }
    // Only a reschedule moves a job in time or rank, and it says so in the history.
    if after.priority != before.priority || after.run_at != before.run_at {
        assert!(matches!(command, Command::Reschedule { .. }), "{here}");
        assert!(
            tr.events
                .iter()
                .any(|e| e.kind == EventKind::JobRescheduled),
            "{here}"
        );
    }
    assert_eq!(
        tr.job_changed,
        fields_moved || after.updated_at != before.updated_at,
        "{here}"
    );
    // Only a first lease of work leases only, and then everything it did is in its step's row:
    // the entry's time, attempt and worker are the step's.
    let leased_only = tr.events.iter().all(|e| e.kind == EventKind::StepLeased)
        && !tr.events.is_empty()
        && tr.retired_leases.is_empty()
        && tr.effects.is_empty()
        && !fields_moved;
    assert_eq!(tr.leases_only, leased_only, "{here}");
    if tr.leases_only {
        assert!(matches!(command, Command::Claim { .. }), "{here}");
        for e in &tr.events {
            let s = after
                .steps
                .iter()
                .find(|s| Some(&s.name) == e.step.as_ref());
            let s = s.expect("a leased step");
            assert_eq!(
                (Some(e.at), e.attempt, s.state),
                (s.started_at, Some(s.attempt), StepState::Running),
                "{here}"
            );
        }
    }
    let mut rest = after.clone();
    rest.steps = before.steps.clone();
    rest.state = before.state;
    rest.desired_state = before.desired_state;
    rest.finished_at = before.finished_at;
    rest.blocked_reason = before.blocked_reason.clone();
    rest.updated_at = before.updated_at;
    rest.priority = before.priority;
    rest.run_at = before.run_at;
    rest.round = before.round;
    assert_eq!(
        &rest, before,
        "a job field changed that never should: {here}"
    );
    if after.finished_at != before.finished_at {
        assert_eq!(after.finished_at, Some(now), "{here}");
    }
    // A job never starts before its run_at, however often it was moved.
    if before.state == JobState::Pending && after.state != JobState::Pending {
        assert!(
            after.state.is_terminal() || after.run_at.is_none_or(|t| t <= now),
            "started before run_at: {here}"
        );
    }
    // updated_at moves exactly when the job records something.
    let moved = fields_moved || !tr.events.is_empty();
    assert_eq!(
        after.updated_at,
        if moved { now } else { before.updated_at },
        "updated_at: {here}"
    );
    // Events happen now and name real steps; every change of a step's state or of its undo's
    // phase has one naming the step, except a step that starts waiting for its undo, which
    // the job's `job_compensating` announces.
    for e in &tr.events {
        assert_eq!(e.at, now, "{here}");
        if let Some(name) = &e.step {
            assert!(after.step_index(name).is_some(), "{here}");
        }
    }
    for &i in &changed {
        let (b, a) = (&before.steps[i], &after.steps[i]);
        let name = a.name.as_str();
        let named = tr.events.iter().any(|e| e.step.as_deref() == Some(name));
        let parked = after.state == JobState::Blocked
            && (a.state == StepState::Waiting || a.comp_phase == Some(CompPhase::Waiting))
            && tr.events.iter().any(|e| e.kind == EventKind::JobBlocked);
        if parked {
            // Blocking parks ready work and undos back to waiting; `job_blocked` announces it.
        } else if a.comp_phase == Some(CompPhase::Waiting) && b.state == StepState::Succeeded {
            assert!(
                tr.events
                    .iter()
                    .any(|e| e.kind == EventKind::JobCompensating),
                "{here}"
            );
        } else if a.state != b.state || a.comp_phase != b.comp_phase {
            assert!(named, "no event for {name}: {here}");
        }
    }
    if after.state != before.state {
        assert!(tr.events.iter().any(|e| e.kind.is_job_event()), "{here}");
    }
    if tr.is_noop() {
        assert_eq!(after, before, "{here}");
    }
    // Effects: Finished exactly when the job finishes now; every step or undo that became
    // ready wakes its agent (now, or at its next attempt), and nothing else does; alerts for a
    // failed or blocked job and for a step reaching POISON_FAILURES failures while it still
    // retries; a callback when a job with a callback_url finishes.
    let mut expected = Vec::new();
    let became_terminal = after.state.is_terminal() && !before.state.is_terminal();
    if became_terminal {
        expected.push(finished(after.state));
        if after.state == JobState::Failed {
            expected.push(Effect::Alert {
                kind: AlertKind::JobFailed,
                step: None,
                message: String::new(),
            });
        }
        if after.callback_url.is_some() {
            expected.push(Effect::Callback { state: after.state });
        }
    }
    for e in tr.events.iter().filter(|e| e.kind == EventKind::JobBlocked) {
        assert!(
            e.detail.as_ref().is_some_and(|d| d["reason"].is_string()),
            "{here}"
        );
        expected.push(Effect::Alert {
            kind: AlertKind::JobBlocked,
            step: None,
            message: String::new(),
        });
    }
    let mut wakes = Vec::new();
    for (b, a) in before.steps.iter().zip(&after.steps) {
        // A retry that is scheduled (ready, or parked while the job is blocked).
        let retrying =
            matches!(a.state, StepState::Ready | StepState::Waiting) && after.round == before.round;
        if retrying && a.failures == POISON_FAILURES && b.failures == POISON_FAILURES - 1 {
            expected.push(Effect::Alert {
                kind: AlertKind::StepPoisoned,
                step: Some(a.name.clone()),
                message: String::new(),
            });
        }
        // A new round of a whole-job retry readies its roots anew, whatever they were.
        let work_ready = a.state == StepState::Ready
            && (b.state != StepState::Ready || after.round != before.round);
        let undo_ready =
            a.comp_phase == Some(CompPhase::Ready) && b.comp_phase != Some(CompPhase::Ready);
        let agent = if work_ready {
            a.agent.clone()
        } else if undo_ready {
            a.compensate
                .as_ref()
                .expect("an undo has an agent")
                .agent
                .clone()
        } else {
            continue;
        };
        let due = a.next_attempt_at.expect("a ready step has a next attempt");
        let effect = if due <= now {
            ready(&agent)
        } else {
            Effect::ReadyAt { agent, at: due }
        };
        if !wakes.contains(&effect) {
            wakes.push(effect);
        }
    }
    expected.extend(wakes);
    // A job left pending at a new run_at asks the supervisor to look then (now, if it has come).
    if after.state == JobState::Pending && after.run_at != before.run_at {
        let at = after.run_at.expect("a move sets run_at");
        expected.push(Effect::Due { at: at.max(now) });
    }
    let mut got = effect_words(&tr.effects);
    let mut want: Vec<String> = expected
        .iter()
        .map(|e| match e {
            Effect::Alert { kind, step, .. } => match step {
                Some(step) => format!("alert {kind} {step}"),
                None => format!("alert {kind}"),
            },
            other => effect_words(std::slice::from_ref(other))[0].clone(),
        })
        .collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "effects: {here}");
    check_retired_leases(before, tr, &here);
}

/// A retired lease was its step's latest lease before the transition and is not after it, with
/// the attempt the step had; and a lease the step no longer names is always retired (else a late
/// report on it would be answered as unknown, not fenced as stale).
/// What the stores index for waking later (`Step::waits_past_ready`) covers every claimable step
/// that is not due yet, and every `ReadyAt` effect names such a step: a backoff is never lost to
/// a restart or to another node, which know of it only from the stores' index.
fn check_wakeups(tr: &Transition, now: Timestamp, here: &str) {
    for s in tr.job.steps.iter().filter(|s| s.claim_agent().is_some()) {
        assert!(s.ready_at.is_some_and(|r| r <= now), "{here}: ready_at");
        if s.next_attempt_at.is_some_and(|n| n > now) {
            assert!(
                s.waits_past_ready(),
                "{here}: a step due later is not indexed"
            );
        }
    }
    for e in &tr.effects {
        if let Effect::ReadyAt { agent, at } = e {
            assert!(
                tr.job.steps.iter().any(|s| s.waits_past_ready()
                    && s.claim_agent() == Some(agent.as_str())
                    && s.next_attempt_at == Some(*at)),
                "{here}: {e:?} names no waiting step"
            );
        }
    }
}

fn check_retired_leases(before: &Job, tr: &Transition, here: &str) {
    for r in &tr.retired_leases {
        let was = &before.steps[r.step];
        assert_eq!(was.lease_id, Some(r.lease_id), "retired: {here}");
        assert_eq!(was.attempt, r.attempt, "retired attempt: {here}");
        assert_ne!(tr.job.steps[r.step].lease_id, Some(r.lease_id), "{here}");
    }
    for (i, was) in before.steps.iter().enumerate() {
        let dropped = was.lease_id.is_some() && tr.job.steps[i].lease_id != was.lease_id;
        let retired = tr.retired_leases.iter().any(|r| r.step == i);
        assert_eq!(dropped, retired, "step {i}'s lease: {here}");
    }
}
// Proves admit starts a job at once unless its run_at is ahead: roots ready, the rest waiting.
#[test]
fn admit_starts_now_or_waits_for_run_at() {
    let running: &[&str] = &[
        "job_submitted",
        "job_started",
        "step_ready a",
        "step_ready b",
    ];
    // (run_at, job state, step states, events)
    let cases: &[(Option<i64>, JobState, &str, &[&str])] = &[
        (
            None,
            JobState::Running,
            "a:ready b:ready c:waiting",
            running,
        ),
        (
            Some(-5_000),
            JobState::Running,
            "a:ready b:ready c:waiting",
            running,
        ),
        (
            Some(0),
            JobState::Running,
            "a:ready b:ready c:waiting",
            running,
        ),
        (
            Some(5_000),
            JobState::Pending,
            "a:waiting b:waiting c:waiting",
            &["job_submitted"],
        ),
    ];
    for (run_at, state, step_states, events) in cases {
        let what = format!("run_at {run_at:?}");
        let (sim, tr) = Sim::admit(&spec(forked(3).steps, run_at.map(at)), at(0));
        assert_eq!(tr.job.state, *state, "{what}");
        assert_eq!(states(&tr.job), *step_states, "{what}");
        assert_eq!(kinds(&tr.events), *events, "{what}");
        assert_eq!(
            tr.events[0].detail,
            run_at.map(|ms| json!({ "run_at": at(ms), "ordering_key": null })),
            "{what}"
        );
        assert_eq!(tr.reply, Reply::Done, "{what}");
        assert_eq!(tr.job.finished_at, None, "{what}");
        if *state == JobState::Running {
            assert_eq!(tr.effects, [ready("x"), ready("y")], "{what}");
            assert_eq!(tr.changed_steps, [0, 1], "{what}");
            assert!(tr.job_changed, "{what}");
            let a = sim.step("a");
            assert_eq!(
                (a.ready_at, a.next_attempt_at, a.attempt),
                (Some(at(0)), Some(at(0)), 0)
            );
        } else {
            assert!(
                tr.effects.is_empty() && tr.changed_steps.is_empty(),
                "{what}"
            );
        }
    }
}

// Proves Activate starts a pending job only once its run_at has come, and only once.
#[test]
fn activate_waits_for_run_at() {
    // (activation time, accepted)
    let cases = [(0, false), (4_999, false), (5_000, true), (9_000, true)];
    for (ms, accepted) in cases {
        let mut sim = start(&spec(forked(3).steps, Some(at(5_000))));
        sim.set_time(ms);
        let result = sim.send(Command::Activate);
        if !accepted {
            assert_eq!(result, Err(Rejection::NotDue), "at {ms}");
            assert_eq!(sim.job.state, JobState::Pending);
            continue;
        }
        let tr = result.unwrap();
        assert_eq!(tr.job.state, JobState::Running, "at {ms}");
        assert_eq!(states(&tr.job), "a:ready b:ready c:waiting");
        assert_eq!(
            kinds(&tr.events),
            ["job_started", "step_ready a", "step_ready b"]
        );
        assert_eq!(tr.effects, [ready("x"), ready("y")]);
        assert!(tr.job_changed);
        assert_eq!(tr.job.updated_at, at(ms));
        assert_eq!(sim.step("a").ready_at, Some(at(ms)));
        assert_eq!(
            sim.send(Command::Activate),
            Err(Rejection::NotDue),
            "a second activate"
        );
    }
}

fn reschedule(run_at: Option<i64>, priority: Option<i32>) -> Command {
    Command::Reschedule {
        run_at: run_at.map(at),
        priority,
        by: Some("ops".into()),
        reason: Some("moved".into()),
    }
}

// Proves moving a pending job's run_at (earlier, then later) records one job_rescheduled event
// with from/to and the audit fields, asks the supervisor to look at the new time, and that the
// job is activated only once the newest run_at has come.
#[test]
fn reschedule_moves_run_at_of_a_pending_job() {
    let mut sim = start(&spec(forked(3).steps, Some(at(10_000))));
    sim.set_time(1_000);
    let tr = sim.ok(reschedule(Some(5_000), None));
    assert_eq!(kinds(&tr.events), ["job_rescheduled"]);
    assert_eq!(
        detail(&tr, EventKind::JobRescheduled),
        Some(json!({
            "by": "ops", "reason": "moved",
            "run_at": { "from": at(10_000), "to": at(5_000) },
        }))
    );
    assert_eq!(effect_words(&tr.effects), [format!("due {}", at(5_000))]);
    assert_eq!(
        (tr.job.state, tr.job.run_at),
        (JobState::Pending, Some(at(5_000)))
    );
    assert!(tr.job_changed && tr.changed_steps.is_empty());
    assert_eq!(tr.job.updated_at, at(1_000));
    sim.set_time(4_999);
    assert_eq!(sim.send(Command::Activate), Err(Rejection::NotDue));
    // Later again: the old time no longer starts it.
    sim.ok(reschedule(Some(8_000), None));
    sim.set_time(5_000);
    assert_eq!(sim.send(Command::Activate), Err(Rejection::NotDue));
    sim.set_time(8_000);
    assert_eq!(sim.ok(Command::Activate).job.state, JobState::Running);
}

// Proves "run now": a run_at that has come starts an unkeyed pending job in the same transition
// (its roots ready, their agents woken), while a keyed job stays pending for the store to start
// when it heads its key, with the supervisor asked to look now.
#[test]
fn reschedule_to_now_starts_an_unkeyed_job_at_once() {
    let mut sim = start(&spec(forked(3).steps, Some(at(60_000))));
    sim.set_time(2_000);
    let tr = sim.ok(reschedule(Some(2_000), None));
    assert_eq!(
        kinds(&tr.events),
        [
            "job_rescheduled",
            "job_started",
            "step_ready a",
            "step_ready b"
        ]
    );
    assert_eq!(tr.effects, [ready("x"), ready("y")]);
    assert_eq!(states(&tr.job), "a:ready b:ready c:waiting");

    let mut keyed = spec(forked(3).steps, Some(at(60_000)));
    keyed.ordering_key = Some("k".into());
    let mut sim = start(&keyed);
    sim.set_time(2_000);
    let tr = sim.ok(reschedule(Some(0), None));
    assert_eq!(kinds(&tr.events), ["job_rescheduled"]);
    assert_eq!(tr.job.state, JobState::Pending);
    assert_eq!(effect_words(&tr.effects), [format!("due {}", at(2_000))]);
    assert_eq!(sim.ok(Command::Activate).job.state, JobState::Running);
}

// Proves a priority change applies to pending, running and blocked jobs and rewrites every step
// (each step row ranks its claims by it), that run_at moves only while pending, that a finished
// job refuses both, and that asking for what the job already has records nothing.
#[test]
fn reschedule_priority_and_what_is_refused() {
    let mut sim = start(&forked(3));
    let tr = sim.ok(reschedule(None, Some(7)));
    assert_eq!(tr.job.priority, 7);
    assert_eq!(tr.changed_steps, [0, 1, 2]);
    assert_eq!(
        detail(&tr, EventKind::JobRescheduled).expect("detail")["priority"],
        json!({ "from": 0, "to": 7 })
    );
    assert!(tr.effects.is_empty());
    let same = sim.ok(reschedule(None, Some(7)));
    assert!(same.is_noop(), "nothing changed, nothing recorded");
    match sim.send(reschedule(Some(5_000), Some(1))) {
        Err(Rejection::NotAllowed { reason }) => assert!(reason.contains("pending"), "{reason}"),
        other => panic!("run_at of a running job: {other:?}"),
    }
    assert_eq!(sim.job.priority, 7, "a refused command changes nothing");
    sim.ok(Command::Cancel);
    assert_eq!(
        sim.send(reschedule(None, Some(1))),
        Err(Rejection::JobTerminal {
            state: JobState::Cancelled
        })
    );
    // Blocked: the priority still moves (it ranks the claims after the operator unblocks it).
    let mut sim = start(&job(vec![step("a", "x", &[], 1)], Some(OnFailure::Hold)));
    let claim = sim.claim_cmd(0);
    sim.ok(claim);
    sim.ok(Command::Fail {
        step: 0,
        attempt: 1,
        error: "boom".into(),
        retryable: false,
        jitter: 0.0,
    });
    assert_eq!(sim.job.state, JobState::Blocked);
    assert_eq!(sim.ok(reschedule(None, Some(-2))).job.priority, -2);
}

// Proves a claim leases a ready step: attempt + 1, lease, worker, expiry = now + timeout.
#[test]
fn claim_leases_a_ready_step() {
    let mut sim = start(&diamond(3));
    sim.set_time(1_500);
    let lease = LeaseId(Uuid::from_u128(42));
    let tr = sim.ok(Command::Claim {
        step: 0,
        lease_id: lease,
        worker: "w9".into(),
    });
    let a = &tr.job.steps[0];
    assert_eq!((a.state, a.attempt), (StepState::Running, 1));
    assert_eq!(a.lease_id, Some(lease));
    assert_eq!(a.worker.as_deref(), Some("w9"));
    assert_eq!(a.started_at, Some(at(1_500)));
    assert_eq!(a.lease_expires_at, Some(at(11_500)));
    assert_eq!(a.next_attempt_at, None);
    assert_eq!(kinds(&tr.events), ["step_leased a#1"]);
    assert_eq!(
        tr.events[0].detail,
        Some(json!({ "worker": "w9", "lease_expires_at": at(11_500) }))
    );
    assert_eq!(tr.changed_steps, [0]);
    assert!(tr.job_changed);
    assert_eq!(tr.job.updated_at, at(1_500));
    assert!(tr.effects.is_empty());
    assert_eq!(tr.reply, Reply::Done);
    assert!(
        tr.leases_only,
        "a first lease changes its step and the job's time only"
    );
    // A retry's lease retires the first one, so it is more than a lease.
    let fail = sim.fail_cmd("a", 1, true);
    sim.ok(fail);
    sim.set_time(100_000);
    let claim = sim.claim_cmd(0);
    let retry = sim.ok(claim);
    assert_eq!(retry.retired_leases.len(), 1);
    assert!(!retry.leases_only);
}

// Proves a claim is refused (and changes nothing) unless the job runs, wants the work, and the
// step is ready and due.
#[test]
fn claim_refuses_what_is_not_claimable() {
    type Case = (&'static str, fn() -> Sim, usize, Rejection);
    let cases: &[Case] = &[
        (
            "a waiting step",
            || start(&diamond(3)),
            1,
            Rejection::NotClaimable,
        ),
        (
            "a running step",
            || {
                let mut sim = start(&diamond(3));
                sim.claim("a");
                sim
            },
            0,
            Rejection::NotClaimable,
        ),
        (
            "a retry before it is due",
            || {
                let mut sim = start(&diamond(3));
                sim.claim("a");
                sim.fail("a", true);
                sim.set_time(999);
                sim
            },
            0,
            Rejection::NotClaimable,
        ),
        (
            "a pending job",
            || start(&spec(diamond(3).steps, Some(at(5_000)))),
            0,
            Rejection::NotClaimable,
        ),
        (
            "a job being cancelled (forged: a ready step left behind)",
            || {
                let mut sim = start(&diamond(3));
                sim.job.desired_state = DesiredState::Cancelled;
                sim
            },
            0,
            Rejection::NotClaimable,
        ),
        (
            "a cancelled job",
            || {
                let mut sim = start(&diamond(3));
                sim.cancel();
                sim
            },
            0,
            Rejection::NotClaimable,
        ),
        (
            "a failed job (forged: a ready step left behind)",
            || {
                let mut sim = start(&forked(3));
                sim.claim("a");
                sim.fail("a", false);
                sim.job.steps[1].state = StepState::Ready;
                sim
            },
            1,
            Rejection::NotClaimable,
        ),
        (
            "an unknown step",
            || start(&diamond(3)),
            9,
            Rejection::UnknownStep,
        ),
    ];
    for (what, setup, step, rejection) in cases {
        let mut sim = setup();
        let before = sim.job.clone();
        let command = sim.claim_cmd(*step);
        assert_eq!(
            apply(&before, command, sim.now),
            Err(rejection.clone()),
            "{what}"
        );
        assert_eq!(sim.job, before, "{what}");
    }
}

// Proves a heartbeat pushes the lease to now + timeout, with no event and no new updated_at.
#[test]
fn heartbeat_extends_the_lease() {
    let mut sim = start(&diamond(3));
    sim.claim("a");
    let updated = sim.job.updated_at;
    sim.set_time(4_000);
    let tr = sim.heartbeat("a");
    assert_eq!(
        tr.reply,
        Reply::Heartbeat {
            lease_expires_at: at(14_000),
            cancel: false
        }
    );
    assert_eq!(tr.job.steps[0].lease_expires_at, Some(at(14_000)));
    assert!(tr.events.is_empty() && tr.effects.is_empty());
    assert_eq!(tr.changed_steps, [0]);
    assert!(!tr.job_changed);
    assert_eq!(tr.job.updated_at, updated);
    // The old expiry no longer counts: the lease can neither be expired nor is it lost there.
    sim.set_time(10_000);
    assert_eq!(sim.send(sim.expire_cmd("a", 1)), Err(Rejection::NotExpired));
    sim.heartbeat("a");
}

// Proves a heartbeat answers cancel = true once the job was cancelled or failed, false before.
#[test]
fn heartbeat_says_cancel_once_the_job_stops() {
    let cases: &[(&str, Setup, bool)] = &[
        ("the job still wants the work", |_| {}, false),
        (
            "cancel requested",
            |sim| {
                sim.cancel();
            },
            true,
        ),
        (
            "a sibling failed the job",
            |sim| {
                sim.claim("b");
                sim.fail("b", false);
            },
            true,
        ),
    ];
    for (what, stop, cancel) in cases {
        let mut sim = start(&forked(3));
        sim.claim("a");
        stop(&mut sim);
        sim.set_time(1_000);
        let tr = sim.heartbeat("a");
        let reply = Reply::Heartbeat {
            lease_expires_at: at(11_000),
            cancel: *cancel,
        };
        assert_eq!(tr.reply, reply, "{what}");
        assert_eq!(tr.job.steps[0].state, StepState::Running, "{what}");
    }
}

// Proves completion readies a dependant only once all its dependencies are done (diamond
// a → (b, c) → d), and that the last completion succeeds the job with a Finished effect.
#[test]
fn complete_readies_dependants_when_all_deps_are_done() {
    let mut sim = start(&diamond(3));
    // (step completed, step states after, events, effects)
    let table: &[(&str, &str, &[&str], Vec<Effect>)] = &[
        (
            "a",
            "a:succeeded b:ready c:ready d:waiting",
            &["step_succeeded a#1", "step_ready b", "step_ready c"],
            vec![ready("y"), ready("x")],
        ),
        (
            "b",
            "a:succeeded b:succeeded c:ready d:waiting",
            &["step_succeeded b#1"],
            vec![],
        ),
        (
            "c",
            "a:succeeded b:succeeded c:succeeded d:ready",
            &["step_succeeded c#1", "step_ready d"],
            vec![ready("x")],
        ),
        (
            "d",
            "a:succeeded b:succeeded c:succeeded d:succeeded",
            &["step_succeeded d#1", "job_succeeded"],
            vec![Effect::Finished {
                state: JobState::Succeeded,
            }],
        ),
    ];
    for (n, (name, step_states, events, effects)) in table.iter().enumerate() {
        let t = 1_000 * (n as i64 + 1);
        sim.set_time(t);
        sim.claim(name);
        sim.set_time(t + 100);
        let tr = sim.complete(name);
        assert_eq!(states(&tr.job), *step_states, "after {name}");
        assert_eq!(kinds(&tr.events), *events, "after {name}");
        assert_eq!(tr.reply, Reply::Done);
        let s = &tr.job.steps[sim.idx(name)];
        assert_eq!(
            (s.result.clone(), s.finished_at),
            (Some(json!({ "done": name })), Some(at(t + 100)))
        );
        assert_eq!(s.lease_expires_at, None);
        assert_eq!(&tr.effects, effects, "after {name}");
        if *name == "d" {
            assert_eq!(tr.job.state, JobState::Succeeded);
            assert_eq!(tr.job.finished_at, Some(at(t + 100)));
        } else {
            assert_eq!(
                (tr.job.state, tr.job.finished_at),
                (JobState::Running, None)
            );
        }
    }
}

// Proves reports for a lease that is not the live one (a superseded or future attempt, an
// expired lease, a step that is not running) are rejected as LeaseLost and change nothing.
#[test]
fn stale_reports_lose_the_lease() {
    fn retried(sim: &mut Sim) {
        sim.claim("a");
        sim.fail("a", true);
        sim.claim_when_due("a");
    }
    fn claimed(sim: &mut Sim) {
        sim.claim("a");
    }
    fn expired(sim: &mut Sim) {
        sim.claim("a");
        sim.set_time(10_000);
    }
    fn succeeded(sim: &mut Sim) {
        sim.claim("a");
        sim.complete("a");
    }
    type Case = (&'static str, Setup, fn(&Sim) -> Command);
    let cases: &[Case] = &[
        ("heartbeat of a superseded attempt", retried, |s| {
            s.heartbeat_cmd("a", 1)
        }),
        ("complete of a superseded attempt", retried, |s| {
            s.complete_cmd("a", 1)
        }),
        ("fail of a superseded attempt", retried, |s| {
            s.fail_cmd("a", 1, true)
        }),
        ("complete of an attempt not handed out", claimed, |s| {
            s.complete_cmd("a", 2)
        }),
        ("heartbeat at the lease's expiry", expired, |s| {
            s.heartbeat_cmd("a", 1)
        }),
        ("complete at the lease's expiry", expired, |s| {
            s.complete_cmd("a", 1)
        }),
        (
            "fail after the lease expired",
            |s| {
                s.claim("a");
                s.set_time(60_000);
            },
            |s| s.fail_cmd("a", 1, false),
        ),
        (
            "complete while the step waits for its retry",
            |s| {
                s.claim("a");
                s.fail("a", true);
            },
            |s| s.complete_cmd("a", 1),
        ),
        ("complete of a succeeded step", succeeded, |s| {
            s.complete_cmd("a", 1)
        }),
        ("heartbeat of a succeeded step", succeeded, |s| {
            s.heartbeat_cmd("a", 1)
        }),
        ("fail of a succeeded step", succeeded, |s| {
            s.fail_cmd("a", 1, true)
        }),
        (
            "complete of a ready step never leased",
            |_| {},
            |s| s.complete_cmd("a", 0),
        ),
        (
            "heartbeat of a waiting step",
            |_| {},
            |s| s.heartbeat_cmd("d", 0),
        ),
        (
            "complete of a step cancelled with its job",
            |s| {
                s.claim("a");
                s.cancel();
                s.expire("a");
            },
            |s| s.complete_cmd("a", 1),
        ),
    ];
    for (what, setup, command) in cases {
        let mut sim = start(&diamond(3));
        setup(&mut sim);
        let before = sim.job.clone();
        let result = sim.send(command(&sim));
        assert!(
            matches!(result, Err(Rejection::LeaseLost { .. })),
            "{what}: {result:?}"
        );
        assert_eq!(sim.job, before, "{what}");
    }
    let mut sim = start(&diamond(3));
    assert_eq!(
        sim.send(Command::Heartbeat {
            step: 4,
            attempt: 1,
            progress: None,
        }),
        Err(Rejection::UnknownStep)
    );
}

// Proves a retryable failure with attempts left requeues the step after exactly the backoff
// delay (jitter 0: 1 s, 2 s, 4 s, then the 5 s cap) with a ReadyAt effect, and not earlier.
#[test]
fn retryable_failure_schedules_the_next_attempt() {
    let mut sim = start(&diamond(5));
    // (attempt that fails, delay before the next one)
    let table = [(1, 1_000), (2, 2_000), (3, 4_000), (4, 5_000)];
    for (attempt, delay_ms) in table {
        let due = sim.step("a").next_attempt_at.unwrap();
        if due > sim.now {
            sim.set_now(Timestamp::from_millis(due.as_millis() - 1));
            assert_eq!(
                sim.send(sim.claim_cmd_peek(0)),
                Err(Rejection::NotClaimable),
                "before due"
            );
        }
        assert_eq!(sim.claim_when_due("a").job.steps[0].attempt, attempt);
        sim.set_now(sim.now.plus(Span::from_millis(250)));
        let now = sim.now;
        let tr = sim.fail("a", true);
        let next = now.plus(Span::from_millis(delay_ms));
        let a = &tr.job.steps[0];
        assert_eq!(
            (a.state, a.attempt, a.failures),
            (StepState::Ready, attempt, attempt)
        );
        assert_eq!((a.ready_at, a.next_attempt_at), (Some(now), Some(next)));
        assert!(a.waits_past_ready(), "a retry waits out its backoff");
        assert_eq!(
            (a.last_error.as_deref(), a.lease_expires_at),
            (Some("boom"), None)
        );
        assert_eq!(
            kinds(&tr.events),
            [format!("step_retry_scheduled a#{attempt}")]
        );
        let detail = json!({ "error": "boom", "delay": Span::from_millis(delay_ms), "next_attempt_at": next });
        assert_eq!(tr.events[0].detail, Some(detail));
        // The third failure also raises the step_poisoned alert: the step is retried anyway.
        let mut effects = vec![format!("ready x at {next}")];
        if attempt == POISON_FAILURES {
            effects.push("alert step_poisoned a".into());
        }
        assert_eq!(effect_words(&tr.effects), effects, "attempt {attempt}");
        assert_eq!(
            (tr.job.state, tr.changed_steps.as_slice(), tr.job.updated_at),
            (JobState::Running, &[0][..], now)
        );
    }
}

// Proves jitter only shortens the retry delay (by up to half) and that a zero delay wakes the
// agent at once with a Ready effect instead of ReadyAt.
#[test]
fn retry_delay_honours_jitter_and_zero_backoff() {
    let zero = Backoff {
        initial: Span::ZERO,
        factor: 2.0,
        max: Span::ZERO,
    };
    // (backoff, jitter, expected delay)
    let cases = [
        (BACKOFF, 0.0, 1_000),
        (BACKOFF, 0.5, 750),
        (BACKOFF, 0.999_999, 500),
        (zero, 0.3, 0),
    ];
    for (backoff, jitter, delay_ms) in cases {
        let mut one = step("a", "x", &[], 3);
        one.backoff = Some(backoff);
        let mut sim = start(&spec(vec![one], None));
        sim.claim("a");
        let command = Command::Fail {
            step: 0,
            attempt: 1,
            error: "boom".into(),
            retryable: true,
            jitter,
        };
        let tr = sim.ok(command);
        let next = at(delay_ms);
        assert_eq!(
            tr.job.steps[0].waits_past_ready(),
            delay_ms > 0,
            "only a retry that waits is woken later"
        );
        assert_eq!(
            tr.job.steps[0].next_attempt_at,
            Some(next),
            "jitter {jitter}"
        );
        let effect = if delay_ms == 0 {
            ready("x")
        } else {
            Effect::ReadyAt {
                agent: "x".into(),
                at: next,
            }
        };
        assert_eq!(tr.effects, [effect], "jitter {jitter}");
    }
}

// Proves a step with the Faktory formula is retried after exactly `count⁴ + 15 + ⌊30·jitter⌋ ×
// (count + 1)` seconds (count = failures before this one), ignoring its exponential backoff:
// each attempt is claimed when due and failed with a chosen jitter.
#[test]
fn faktory_formula_schedules_retries() {
    let mut one = step("a", "x", &[], 4);
    one.backoff = None;
    one.backoff_formula = Some(Formula::Faktory);
    let mut sim = start(&spec(vec![one], None));
    // (attempt that fails, jitter, delay in seconds)
    let table = [(1, 0.0, 15), (2, 0.5, 46), (3, 0.999_999, 118)];
    for (attempt, jitter, delay_s) in table {
        assert_eq!(sim.claim_when_due("a").job.steps[0].attempt, attempt);
        let now = sim.now;
        let tr = sim.ok(Command::Fail {
            step: 0,
            attempt,
            error: "boom".into(),
            retryable: true,
            jitter,
        });
        let next = now.plus(Span::from_secs(delay_s));
        assert_eq!(
            tr.job.steps[0].next_attempt_at,
            Some(next),
            "attempt {attempt}"
        );
        let detail =
            json!({ "error": "boom", "delay": Span::from_secs(delay_s), "next_attempt_at": next });
        assert_eq!(tr.events[0].detail, Some(detail), "attempt {attempt}");
    }
}

// Proves a permanent failure (retryable on the last attempt, or fatal) under `on_failure: fail`
// (the default without undos) fails the step and the job at once with a job_failed alert,
// cancels waiting and ready siblings, and leaves a running sibling running: its heartbeat says
// cancel, and its late report (complete is refused) or expiry settles it to cancelled.
#[test]
fn permanent_failure_fails_the_job_and_stops_siblings() {
    // (what, max_attempts of a, retryable failures before the last one, last retryable, reason)
    let failures = [
        (
            "retryable on the last attempt",
            2,
            1,
            true,
            "attempts exhausted",
        ),
        (
            "retryable with a single attempt",
            1,
            0,
            true,
            "attempts exhausted",
        ),
        ("fatal with attempts left", 5, 1, false, "fatal error"),
        ("fatal with unlimited attempts", 0, 0, false, "fatal error"),
    ];
    // (how the running sibling b ends, refused, its events)
    type Ending = (
        &'static str,
        fn(&mut Sim) -> Transition,
        bool,
        &'static [&'static str],
    );
    let endings: &[Ending] = &[
        (
            "complete",
            |s| s.complete("b"),
            true,
            &["step_cancelled b#1"],
        ),
        (
            "fail",
            |s| s.fail("b", true),
            false,
            &["step_cancelled b#1"],
        ),
        (
            "expire",
            |s| s.expire("b"),
            false,
            &["step_lease_expired b#1", "step_cancelled b#1"],
        ),
    ];
    for (what, max_attempts, retries, retryable, reason) in failures {
        for (ending, end, refused, end_events) in endings {
            let what = format!("{what}, sibling ends by {ending}");
            let steps = vec![
                step("a", "x", &[], max_attempts),
                step("b", "y", &[], 3),
                step("c", "x", &[], 3),
                step("d", "x", &["a"], 3),
            ];
            let mut sim = start(&spec(steps, None));
            sim.claim("b");
            sim.claim("a");
            for _ in 0..retries {
                sim.fail("a", true);
                sim.claim_when_due("a");
            }
            sim.set_now(sim.now.plus(Span::from_millis(100)));
            let failed_at = sim.now;
            let tr = sim.fail("a", retryable);
            let attempt = retries + 1;
            assert_eq!(
                states(&tr.job),
                "a:failed b:running c:cancelled d:cancelled",
                "{what}"
            );
            let expected = [
                format!("step_failed a#{attempt}"),
                "step_cancelled c".into(),
                "step_cancelled d".into(),
                "job_failed".into(),
            ];
            assert_eq!(kinds(&tr.events), expected, "{what}");
            assert_eq!(
                tr.events[0].detail,
                Some(json!({ "error": "boom", "reason": reason })),
                "{what}"
            );
            assert_eq!(
                detail(&tr, EventKind::JobFailed),
                Some(json!({ "step": "a", "error": "boom" })),
                "{what}"
            );
            assert_eq!(
                effect_words(&tr.effects),
                ["finished failed", "alert job_failed"],
                "{what}"
            );
            assert_eq!(
                (tr.job.state, tr.job.desired_state),
                (JobState::Failed, DesiredState::Succeeded)
            );
            assert_eq!(tr.job.finished_at, Some(failed_at), "{what}");
            let a = &tr.job.steps[0];
            assert_eq!(
                (a.attempt, a.failures, a.finished_at),
                (attempt, attempt, Some(failed_at)),
                "{what}"
            );
            assert_eq!(tr.changed_steps, [0, 2, 3], "{what}");

            assert_eq!(
                sim.send(sim.claim_cmd_peek(2)),
                Err(Rejection::NotClaimable),
                "{what}"
            );
            sim.set_now(sim.now.plus(Span::from_millis(100)));
            assert!(
                matches!(
                    sim.heartbeat("b").reply,
                    Reply::Heartbeat { cancel: true, .. }
                ),
                "{what}"
            );
            let tr = end(&mut sim);
            assert_eq!(
                matches!(tr.reply, Reply::Refused(Rejection::LeaseLost { .. })),
                *refused,
                "{what}"
            );
            if let Reply::Refused(Rejection::LeaseLost { reason }) = &tr.reply {
                assert_eq!(reason, "the job is failed and no longer takes results");
            }
            assert_eq!(kinds(&tr.events), *end_events, "{what}");
            assert_eq!(
                states(&tr.job),
                "a:failed b:cancelled c:cancelled d:cancelled",
                "{what}"
            );
            assert_eq!(
                (tr.job.state, tr.job.finished_at),
                (JobState::Failed, Some(failed_at)),
                "{what}"
            );
            assert!(tr.effects.is_empty(), "{what}");
            let stale = sim.send(sim.complete_cmd("b", 1));
            assert!(matches!(stale, Err(Rejection::LeaseLost { .. })), "{what}");
        }
    }
}

// Proves an expired lease counts as a failed attempt: requeued after the backoff while attempts
// are left (or unlimited), failing the step and the job on the last attempt.
#[test]
fn expiry_counts_a_failed_attempt() {
    let retry: &[&str] = &["step_lease_expired a#1", "step_retry_scheduled a#1"];
    let fail: &[&str] = &[
        "step_lease_expired a#1",
        "step_failed a#1",
        "step_cancelled b",
        "step_cancelled c",
        "step_cancelled d",
        "job_failed",
    ];
    // (max_attempts, step states after, events, job state after)
    let cases: &[(u32, &str, &[&str], JobState)] = &[
        (
            3,
            "a:ready b:waiting c:waiting d:waiting",
            retry,
            JobState::Running,
        ),
        (
            0,
            "a:ready b:waiting c:waiting d:waiting",
            retry,
            JobState::Running,
        ),
        (
            1,
            "a:failed b:cancelled c:cancelled d:cancelled",
            fail,
            JobState::Failed,
        ),
    ];
    for (max_attempts, step_states, events, job_state) in cases {
        let mut sim = start(&diamond(*max_attempts));
        sim.claim("a");
        let tr = sim.expire("a");
        assert_eq!(sim.now, at(10_000));
        assert_eq!(states(&tr.job), *step_states, "max_attempts {max_attempts}");
        assert_eq!(kinds(&tr.events), *events, "max_attempts {max_attempts}");
        assert_eq!(tr.job.state, *job_state);
        let a = &tr.job.steps[0];
        assert_eq!((a.attempt, a.failures), (1, 1));
        assert_eq!(
            a.last_error.as_deref(),
            Some("lease expired: no report before complete_by")
        );
        if *job_state == JobState::Running {
            assert_eq!(a.next_attempt_at, Some(at(11_000)));
            assert_eq!(
                tr.effects,
                [Effect::ReadyAt {
                    agent: "x".into(),
                    at: at(11_000)
                }]
            );
        } else {
            assert_eq!(
                effect_words(&tr.effects),
                ["finished failed", "alert job_failed"]
            );
            assert_eq!(
                tr.events[1].detail.as_ref().unwrap()["reason"],
                "attempts exhausted"
            );
        }
    }
}

// Proves Expire is refused unless the lease it names is running, current and past its expiry.
#[test]
fn expire_needs_a_current_lease_past_its_expiry() {
    type Case = (&'static str, Setup, fn(&Sim) -> Command, Rejection);
    let cases: &[Case] = &[
        (
            "before the expiry",
            |s| {
                s.claim("a");
                s.set_time(9_999);
            },
            |s| s.expire_cmd("a", 1),
            Rejection::NotExpired,
        ),
        (
            "a heartbeat pushed the expiry",
            |s| {
                s.claim("a");
                s.set_time(5_000);
                s.heartbeat("a");
                s.set_time(10_000);
            },
            |s| s.expire_cmd("a", 1),
            Rejection::NotExpired,
        ),
        (
            "an attempt not handed out",
            |s| {
                s.claim("a");
                s.set_time(10_000);
            },
            |s| s.expire_cmd("a", 2),
            Rejection::NotExpired,
        ),
        (
            "a superseded attempt",
            |s| {
                s.claim("a");
                s.fail("a", true);
                s.claim_when_due("a");
                s.set_time(10_500);
            },
            |s| s.expire_cmd("a", 1),
            Rejection::NotExpired,
        ),
        (
            "a ready step",
            |_| {},
            |s| s.expire_cmd("a", 0),
            Rejection::NotExpired,
        ),
        (
            "a succeeded step",
            |s| {
                s.claim("a");
                s.complete("a");
                s.set_time(20_000);
            },
            |s| s.expire_cmd("a", 1),
            Rejection::NotExpired,
        ),
        (
            "an unknown step",
            |_| {},
            |_| Command::Expire {
                step: 7,
                attempt: 1,
                jitter: 0.0,
            },
            Rejection::UnknownStep,
        ),
    ];
    for (what, setup, command, rejection) in cases {
        let mut sim = start(&diamond(3));
        setup(&mut sim);
        let before = sim.job.clone();
        assert_eq!(sim.send(command(&sim)), Err(rejection.clone()), "{what}");
        assert_eq!(sim.job, before, "{what}");
    }
}

// Proves max_attempts 0 never runs out: after 25 failures and expiries the step is still
// retried and can succeed; only a fatal error fails it.
#[test]
fn zero_max_attempts_retries_forever() {
    let mut sim = start(&spec(vec![step("a", "x", &[], 0)], None));
    for n in 1..=25u32 {
        sim.claim_when_due("a");
        let tr = if n % 2 == 0 {
            sim.expire("a")
        } else {
            sim.fail("a", true)
        };
        let a = &tr.job.steps[0];
        assert_eq!(
            (a.state, a.attempt, a.failures),
            (StepState::Ready, n, n),
            "failure {n}"
        );
        assert_eq!(tr.job.state, JobState::Running);
    }
    sim.claim_when_due("a");
    let tr = sim.complete("a");
    assert_eq!(
        (tr.job.state, tr.job.steps[0].attempt),
        (JobState::Succeeded, 26)
    );
}

// Proves cancelling a running job cancels its unstarted steps at once but keeps the job running
// (desired cancelled) until its running step reports or expires, which cancels the job.
#[test]
fn cancel_waits_for_the_running_step() {
    // (how a ends, refused, events)
    type Ending = (
        &'static str,
        fn(&mut Sim) -> Transition,
        bool,
        &'static [&'static str],
    );
    let endings: &[Ending] = &[
        (
            "complete",
            |s| s.complete("a"),
            true,
            &["step_cancelled a#1", "job_cancelled"],
        ),
        (
            "fail",
            |s| s.fail("a", true),
            false,
            &["step_cancelled a#1", "job_cancelled"],
        ),
        (
            "fatal fail",
            |s| s.fail("a", false),
            false,
            &["step_cancelled a#1", "job_cancelled"],
        ),
        (
            "expire",
            |s| s.expire("a"),
            false,
            &[
                "step_lease_expired a#1",
                "step_cancelled a#1",
                "job_cancelled",
            ],
        ),
    ];
    for (ending, end, refused, events) in endings {
        let mut sim = start(&forked(3));
        sim.claim("a");
        sim.set_time(1_000);
        let tr = sim.cancel();
        assert_eq!(
            states(&tr.job),
            "a:running b:cancelled c:cancelled",
            "{ending}"
        );
        assert_eq!(
            (tr.job.state, tr.job.desired_state),
            (JobState::Running, DesiredState::Cancelled)
        );
        assert_eq!(
            kinds(&tr.events),
            ["cancel_requested", "step_cancelled b", "step_cancelled c"]
        );
        assert_eq!(
            tr.events[1].detail,
            Some(json!({ "reason": "the job was cancelled" }))
        );
        assert!(tr.effects.is_empty() && tr.job_changed && tr.job.finished_at.is_none());
        assert_eq!(tr.changed_steps, [1, 2]);

        let hb = sim.heartbeat("a");
        assert_eq!(
            hb.reply,
            Reply::Heartbeat {
                lease_expires_at: at(11_000),
                cancel: true
            }
        );
        sim.set_time(2_000);
        let tr = end(&mut sim);
        assert_eq!(kinds(&tr.events), *events, "{ending}");
        assert_eq!(
            matches!(tr.reply, Reply::Refused(Rejection::LeaseLost { .. })),
            *refused,
            "{ending}"
        );
        if let Reply::Refused(Rejection::LeaseLost { reason }) = &tr.reply {
            assert_eq!(reason, "the job is cancelled and no longer takes results");
        }
        assert_eq!(
            states(&tr.job),
            "a:cancelled b:cancelled c:cancelled",
            "{ending}"
        );
        assert_eq!(tr.job.state, JobState::Cancelled, "{ending}");
        assert_eq!(tr.job.finished_at, Some(sim.now), "{ending}");
        assert_eq!(
            tr.effects,
            [Effect::Finished {
                state: JobState::Cancelled
            }],
            "{ending}"
        );
        assert_eq!(
            tr.job.steps[0].failures, 0,
            "a report after the stop is not a failure"
        );
    }
}

// Proves cancelling a job with no running step cancels it at once: pending, merely ready, or
// waiting for a retry. Afterwards it can be neither activated nor cancelled again.
#[test]
fn cancel_without_running_steps_is_immediate() {
    fn retrying(sim: &mut Sim) {
        sim.claim("a");
        sim.fail("a", true);
    }
    // (what, run_at, setup, events)
    type Case = (&'static str, Option<i64>, Setup, &'static [&'static str]);
    let cases: &[Case] = &[
        (
            "a pending job",
            Some(5_000),
            |_| {},
            &[
                "cancel_requested",
                "step_cancelled a",
                "step_cancelled b",
                "step_cancelled c",
                "job_cancelled",
            ],
        ),
        (
            "a running job with nothing leased",
            None,
            |_| {},
            &[
                "cancel_requested",
                "step_cancelled a",
                "step_cancelled b",
                "step_cancelled c",
                "job_cancelled",
            ],
        ),
        (
            "a running job with a step waiting to retry",
            None,
            retrying,
            &[
                "cancel_requested",
                "step_cancelled a#1",
                "step_cancelled b",
                "step_cancelled c",
                "job_cancelled",
            ],
        ),
    ];
    for (what, run_at, setup, events) in cases {
        let mut sim = start(&spec(forked(3).steps, run_at.map(at)));
        setup(&mut sim);
        sim.set_time(500);
        let tr = sim.cancel();
        assert_eq!(kinds(&tr.events), *events, "{what}");
        assert_eq!(
            states(&tr.job),
            "a:cancelled b:cancelled c:cancelled",
            "{what}"
        );
        assert_eq!(
            (tr.job.state, tr.job.desired_state),
            (JobState::Cancelled, DesiredState::Cancelled)
        );
        assert_eq!(tr.job.finished_at, Some(at(500)), "{what}");
        assert_eq!(
            tr.effects,
            [Effect::Finished {
                state: JobState::Cancelled
            }],
            "{what}"
        );
        assert!(
            tr.job.steps.iter().all(|s| s.next_attempt_at.is_none()),
            "{what}"
        );
        sim.set_time(6_000);
        assert_eq!(
            sim.send(Command::Activate),
            Err(Rejection::NotDue),
            "{what}"
        );
        let again = sim.send(Command::Cancel);
        assert_eq!(
            again,
            Err(Rejection::JobTerminal {
                state: JobState::Cancelled
            }),
            "{what}"
        );
    }
}

// Proves a second cancel while the first is still converging is accepted as a no-op.
#[test]
fn cancel_twice_is_a_noop() {
    let mut sim = start(&forked(3));
    sim.claim("a");
    sim.cancel();
    let before = sim.job.clone();
    sim.set_time(3_000);
    let tr = sim.cancel();
    assert!(tr.is_noop(), "{tr:?}");
    assert_eq!(
        (tr.reply, tr.job, tr.effects.is_empty()),
        (Reply::Done, before, true)
    );
}

// Proves cancelling a finished job is refused with its state, whatever way it finished.
#[test]
fn cancel_of_a_finished_job_is_refused() {
    let cases: &[(Setup, JobState)] = &[
        (
            |s| {
                s.complete("a");
            },
            JobState::Succeeded,
        ),
        (
            |s| {
                s.fail("a", false);
            },
            JobState::Failed,
        ),
        (
            |s| {
                s.complete("a");
            },
            JobState::Cancelled,
        ),
    ];
    for (end, state) in cases {
        let mut sim = start(&spec(vec![step("a", "x", &[], 3)], None));
        sim.claim("a");
        if *state == JobState::Cancelled {
            sim.cancel();
        }
        end(&mut sim);
        assert_eq!(sim.job.state, *state);
        let before = sim.job.clone();
        assert_eq!(
            sim.send(Command::Cancel),
            Err(Rejection::JobTerminal { state: *state })
        );
        assert_eq!(sim.job, before);
    }
}

// Proves updated_at moves exactly when the job records something: not on heartbeats, no-op
// cancels or rejected commands.
#[test]
fn updated_at_moves_only_on_change() {
    type Case = (&'static str, fn(&Sim) -> Command, bool);
    let cases: &[Case] = &[
        ("heartbeat", |s| s.heartbeat_cmd("a", 1), false),
        ("claim of a ready sibling", |s| s.claim_cmd_peek(1), true),
        ("complete", |s| s.complete_cmd("a", 1), true),
        ("fail", |s| s.fail_cmd("a", 1, true), true),
        ("cancel", |_| Command::Cancel, true),
    ];
    for (what, command, moves) in cases {
        let mut sim = start(&forked(3));
        sim.claim("a");
        sim.set_time(3_000);
        let tr = sim.ok(command(&sim));
        let expected = if *moves { at(3_000) } else { at(0) };
        assert_eq!(tr.job.updated_at, expected, "{what}");
        assert_eq!(tr.job_changed, *moves, "{what}");
        // A second cancel and any rejected command leave it where it is.
        sim.set_time(4_000);
        let _ = sim.send(Command::Cancel);
        let updated = sim.job.updated_at;
        sim.set_time(5_000);
        if let Ok(tr) = sim.send(Command::Cancel) {
            assert!(tr.is_noop(), "{what}");
        }
        assert!(sim.send(sim.claim_cmd_peek(2)).is_err());
        assert_eq!(sim.job.updated_at, updated, "{what}");
    }
}

// Proves `on_failure` defaults to `compensate` when any step declares an undo, else to `fail`,
// and that an explicit choice wins.
#[test]
fn on_failure_defaults_by_undos() {
    // (steps, on_failure asked, on_failure kept)
    let cases = [
        (forked(3).steps, None, OnFailure::Fail),
        (chain().steps, None, OnFailure::Compensate),
        (chain().steps, Some(OnFailure::Hold), OnFailure::Hold),
        (chain().steps, Some(OnFailure::Fail), OnFailure::Fail),
        (
            forked(3).steps,
            Some(OnFailure::Compensate),
            OnFailure::Compensate,
        ),
    ];
    for (steps, asked, kept) in cases {
        let sim = start(&job(steps, asked));
        assert_eq!(sim.job.on_failure, kept, "{asked:?}");
    }
}

// Proves `hold` blocks the job when a step fails for good: the reason is kept and alerted,
// ready steps are parked back to waiting (neither claimable nor woken), and running siblings go
// on (their heartbeat does not say cancel): a result is recorded without promoting dependants, a
// retryable failure is parked too; a Retry of the failed step readies all of them again.
#[test]
fn hold_blocks_the_job_and_lets_running_siblings_finish() {
    let steps = vec![
        step("a", "x", &[], 3),
        step("b", "y", &[], 3),
        step("c", "x", &["a"], 3),
        step("d", "y", &["b"], 3),
        step("e", "y", &[], 3),
        step("f", "x", &[], 5),
    ];
    let mut sim = start(&job(steps, Some(OnFailure::Hold)));
    sim.claim("a");
    sim.claim("b");
    sim.claim("f");
    sim.set_time(1_000);
    let tr = sim.fail("a", false);
    assert_eq!(kinds(&tr.events), ["step_failed a#1", "job_blocked"]);
    assert_eq!(
        detail(&tr, EventKind::JobBlocked),
        Some(json!({ "reason": "step `a` failed: boom" }))
    );
    assert_eq!(effect_words(&tr.effects), ["alert job_blocked"]);
    assert_eq!(tr.job.state, JobState::Blocked);
    assert_eq!(
        tr.job.blocked_reason.as_deref(),
        Some("step `a` failed: boom")
    );
    assert_eq!(tr.job.finished_at, None);
    assert_eq!(
        states(&tr.job),
        "a:failed b:running c:waiting d:waiting e:waiting f:running"
    );
    let e = sim.idx("e");
    assert_eq!(
        sim.send(sim.claim_cmd_peek(e)),
        Err(Rejection::NotClaimable)
    );
    let hb = sim.heartbeat("b");
    assert!(matches!(hb.reply, Reply::Heartbeat { cancel: false, .. }));
    let tr = sim.complete("b");
    assert_eq!(kinds(&tr.events), ["step_succeeded b#1"]);
    assert!(tr.effects.is_empty());
    let tr = sim.fail("f", true);
    assert_eq!(kinds(&tr.events), ["step_retry_scheduled f#1"]);
    assert!(tr.effects.is_empty(), "a parked retry wakes no one");
    assert_eq!(
        states(&tr.job),
        "a:failed b:succeeded c:waiting d:waiting e:waiting f:waiting"
    );
    assert_eq!(tr.job.state, JobState::Blocked);
    sim.set_time(3_000);
    let tr = sim.retry("a");
    assert_eq!(
        kinds(&tr.events),
        [
            "step_retried a",
            "job_unblocked",
            "step_ready d",
            "step_ready e",
            "step_ready f"
        ]
    );
    assert_eq!(tr.effects, [ready("x"), ready("y")]);
    assert_eq!(
        states(&tr.job),
        "a:ready b:succeeded c:waiting d:ready e:ready f:ready"
    );
}

// Proves a held job's `blocked_reason` names what still blocks it: with two failed steps it
// names both, and after one is retried it names only the other.
#[test]
fn blocked_reason_follows_what_is_still_failed() {
    let steps = vec![step("a", "x", &[], 1), step("b", "y", &[], 1)];
    let mut sim = start(&job(steps, Some(OnFailure::Hold)));
    sim.claim("a");
    sim.claim("b");
    sim.fail("a", false);
    let tr = sim.fail("b", false);
    assert_eq!(
        tr.job.blocked_reason.as_deref(),
        Some("step `a` failed: boom; step `b` failed: boom")
    );
    let tr = sim.retry("a");
    assert_eq!(tr.job.state, JobState::Blocked);
    assert_eq!(
        tr.job.blocked_reason.as_deref(),
        Some("step `b` failed: boom")
    );
}

// Proves an operator's Retry of the failed step of a held job readies it with a wake, unblocks
// the job (promoting what finished meanwhile) and lets it finish `succeeded`.
#[test]
fn hold_then_retry_finishes_succeeded() {
    let steps = vec![
        step("a", "x", &[], 1),
        step("b", "y", &[], 3),
        step("c", "x", &["a"], 3),
        step("d", "y", &["b"], 3),
    ];
    let mut sim = start(&job(steps, Some(OnFailure::Hold)));
    sim.claim("a");
    sim.claim("b");
    sim.fail("a", true);
    sim.complete("b");
    sim.set_time(5_000);
    let tr = sim.retry("a");
    assert_eq!(
        kinds(&tr.events),
        ["step_retried a", "job_unblocked", "step_ready d"]
    );
    assert_eq!(
        detail(&tr, EventKind::StepRetried),
        Some(json!({ "by": "ops", "reason": "fixed it" }))
    );
    assert_eq!(
        detail(&tr, EventKind::JobUnblocked),
        Some(json!({ "state": "running" }))
    );
    assert_eq!(tr.effects, [ready("x"), ready("y")]);
    assert_eq!(
        (tr.job.state, tr.job.blocked_reason.clone()),
        (JobState::Running, None)
    );
    let a = sim.step("a");
    assert_eq!(
        (a.state, a.budget_from, a.next_attempt_at, a.finished_at),
        (StepState::Ready, 1, Some(at(5_000)), None)
    );
    for name in ["a", "c", "d"] {
        sim.run(name);
    }
    assert_eq!(sim.job.state, JobState::Succeeded);
    assert_eq!(sim.step("a").attempt, 2);
}

// Proves a retried step's attempts count from the retry (`budget_from`): with max_attempts 2
// it gets two more attempts, then blocks the job again.
#[test]
fn retry_gives_a_fresh_budget() {
    let mut sim = start(&job(vec![step("a", "x", &[], 2)], Some(OnFailure::Hold)));
    // (step state after each retryable failure, job state)
    let table = [
        (StepState::Ready, JobState::Running),
        (StepState::Failed, JobState::Blocked),
        (StepState::Ready, JobState::Running),
        (StepState::Failed, JobState::Blocked),
    ];
    for (n, (step_state, job_state)) in table.into_iter().enumerate() {
        if sim.job.state == JobState::Blocked {
            sim.retry("a");
        }
        sim.claim_when_due("a");
        let tr = sim.fail("a", true);
        assert_eq!(
            (tr.job.steps[0].state, tr.job.state),
            (step_state, job_state),
            "failure {n}"
        );
    }
    assert_eq!(sim.step("a").budget_from, 2);
    sim.retry("a");
    assert_eq!(sim.step("a").budget_from, 4);
    sim.run("a");
    assert_eq!(sim.job.state, JobState::Succeeded);
}

// Proves Skip of a held job's failed step marks it skipped and lets its dependants run.
#[test]
fn skip_lets_dependants_run() {
    let mut sim = start(&job(forked(3).steps, Some(OnFailure::Hold)));
    sim.run_fatal("a");
    sim.set_time(2_000);
    let tr = sim.skip("a");
    // b was parked while the job was blocked; it is ready again with a's dependant c.
    assert_eq!(
        kinds(&tr.events),
        [
            "step_skipped a",
            "job_unblocked",
            "step_ready b",
            "step_ready c"
        ]
    );
    assert_eq!(
        detail(&tr, EventKind::StepSkipped),
        Some(json!({ "by": "ops", "reason": null }))
    );
    assert_eq!(tr.effects, [ready("y"), ready("x")]);
    let a = sim.step("a");
    assert_eq!(
        (a.state, a.finished_at),
        (StepState::Skipped, Some(at(2_000)))
    );
    sim.run("b");
    sim.run("c");
    assert_eq!(sim.job.state, JobState::Succeeded);
}

// Proves skipping the only step left undone finishes the held job `succeeded` at once.
#[test]
fn skip_of_the_last_step_succeeds_the_job() {
    let steps = vec![step("a", "x", &[], 3), step("b", "x", &["a"], 3)];
    let mut sim = start(&job(steps, Some(OnFailure::Hold)));
    sim.run("a");
    sim.run_fatal("b");
    let tr = sim.skip("b");
    assert_eq!(
        kinds(&tr.events),
        ["step_skipped b", "job_unblocked", "job_succeeded"]
    );
    assert_eq!(tr.effects, [finished(JobState::Succeeded)]);
    assert_eq!(tr.job.state, JobState::Succeeded);
}

// Proves a second step failing for good in a held job keeps it blocked (no second alert), a
// Retry of one leaves it blocked while the other is still failed, and Resume retries them all.
#[test]
fn resume_retries_every_failed_step() {
    let mut sim = start(&job(forked(3).steps, Some(OnFailure::Hold)));
    sim.claim("a");
    sim.claim("b");
    sim.fail("a", false);
    let tr = sim.fail("b", false);
    assert_eq!(kinds(&tr.events), ["step_failed b#1"]);
    assert!(tr.effects.is_empty());
    assert_eq!(tr.job.state, JobState::Blocked);
    // One retry is not enough while another step is still failed.
    let mut one = Sim {
        job: sim.job.clone(),
        now: sim.now,
        edges: BTreeSet::new(),
        history: sim.history.clone(),
        leases: sim.leases,
    };
    let tr = one.retry("a");
    assert_eq!(kinds(&tr.events), ["step_retried a"]);
    assert_eq!(tr.job.state, JobState::Blocked);
    assert!(
        tr.effects.is_empty(),
        "a retried step stays parked while blocked"
    );
    assert_eq!(states(&tr.job), "a:waiting b:failed c:waiting");
    assert_eq!(
        one.send(one.claim_cmd_peek(0)),
        Err(Rejection::NotClaimable)
    );
    let tr = one.retry("b");
    assert_eq!(
        kinds(&tr.events),
        ["step_retried b", "job_unblocked", "step_ready a"]
    );
    assert_eq!(tr.effects, [ready("y"), ready("x")]);
    // Resume does both at once.
    let tr = sim.resume();
    assert_eq!(
        kinds(&tr.events),
        [
            "job_resumed",
            "step_retried a",
            "step_retried b",
            "job_unblocked"
        ]
    );
    assert_eq!(tr.effects, [ready("x"), ready("y")]);
    for name in ["a", "b", "c"] {
        sim.run(name);
    }
    assert_eq!(sim.job.state, JobState::Succeeded);
}

// Proves operator commands are refused (changing nothing) unless the job is blocked and the
// step is a failed one or a failed undo; while the job unwinds or is being cancelled its failed
// work can no longer be retried (nor skipped while unwinding).
#[test]
fn operator_commands_need_a_blocked_job_and_a_failed_step() {
    fn held(sim: &mut Sim) {
        sim.run("d");
        sim.run_fatal("a");
    }
    fn unwind_blocked(sim: &mut Sim) {
        sim.run("a");
        sim.run("b");
        sim.run_fatal("c");
        sim.run_fatal("b");
    }
    fn cancel_pending(sim: &mut Sim) {
        sim.claim("d");
        sim.run_fatal("a");
        sim.cancel();
    }
    type Case = (
        &'static str,
        Option<OnFailure>,
        Setup,
        fn(&Sim) -> Command,
        bool,
    );
    let hold = Some(OnFailure::Hold);
    let cases: &[Case] = &[
        (
            "retry in a running job",
            hold,
            |s| {
                s.claim("a");
            },
            |s| s.retry_cmd("a"),
            false,
        ),
        (
            "skip in a running job",
            hold,
            |_| {},
            |s| s.skip_cmd("a"),
            false,
        ),
        (
            "resume of a running job",
            hold,
            |_| {},
            |_| Command::Resume {
                by: None,
                reason: None,
            },
            false,
        ),
        (
            "retry in a failed job",
            None,
            |s| {
                s.run_fatal("a");
            },
            |s| s.retry_cmd("a"),
            false,
        ),
        (
            "skip in a compensating job",
            None,
            |s| {
                s.run("a");
                s.run("b");
                s.run_fatal("c");
            },
            |s| s.skip_cmd("c"),
            false,
        ),
        (
            "resume of a succeeded job",
            hold,
            |s| {
                for n in ["a", "b", "c", "d"] {
                    s.run(n);
                }
            },
            |_| Command::Resume {
                by: None,
                reason: None,
            },
            false,
        ),
        (
            "retry of a succeeded step",
            hold,
            held,
            |s| s.retry_cmd("d"),
            false,
        ),
        (
            "skip of a waiting step",
            hold,
            held,
            |s| s.skip_cmd("b"),
            false,
        ),
        (
            "retry of an unknown step",
            hold,
            held,
            |_| Command::Retry {
                step: 9,
                by: None,
                reason: None,
            },
            true,
        ),
        (
            "skip of an undo that only waits",
            None,
            unwind_blocked,
            |s| s.skip_cmd("a"),
            false,
        ),
        (
            "retry of the failed work while unwinding",
            None,
            unwind_blocked,
            |s| s.retry_cmd("c"),
            false,
        ),
        (
            "skip of the failed work while unwinding",
            None,
            unwind_blocked,
            |s| s.skip_cmd("c"),
            false,
        ),
        (
            "retry of a failed step after a cancel",
            hold,
            cancel_pending,
            |s| s.retry_cmd("a"),
            false,
        ),
    ];
    for (what, on_failure, setup, command, unknown) in cases {
        let steps = vec![
            undoable("a", "x", &[], 2),
            undoable("b", "y", &["a"], 1),
            step("c", "x", &["b"], 1),
            step("d", "y", &[], 3),
        ];
        let mut sim = start(&job(steps, *on_failure));
        setup(&mut sim);
        let before = sim.job.clone();
        let result = sim.send(command(&sim));
        if *unknown {
            assert_eq!(result, Err(Rejection::UnknownStep), "{what}");
        } else {
            assert!(
                matches!(result, Err(Rejection::NotAllowed { .. })),
                "{what}: {result:?}"
            );
        }
        assert_eq!(sim.job, before, "{what}");
    }
}

// Proves the issue's scenario: in a → b → c → d where a and b declare undos and c fails for
// good, d is cancelled, the job compensates, b's undo is ready first (a's only once b is
// compensated), each undo is leased (same fencing counter), heartbeated without cancel and run
// exactly once, with its own idempotency key and the step's result as input, and the job ends
// A step's row names only its latest lease: the transitions that take a lease off a step (a
// retry's claim, an unwind, an undo's second attempt) name it with its attempt, and nothing else
// does (a report, a first claim).
#[test]
fn transitions_name_the_leases_they_take_off_their_steps() {
    let mut sim = start(&chain());
    let first = sim.claim("a");
    assert!(
        first.retired_leases.is_empty(),
        "a first claim retires nothing"
    );
    let lease_a1 = sim.step("a").lease_id.expect("leased");
    assert!(
        sim.fail("a", true).retired_leases.is_empty(),
        "the lease stays named"
    );
    let again = sim.claim_when_due("a");
    let a = sim.idx("a");
    assert_eq!(
        again.retired_leases,
        [RetiredLease {
            step: a,
            lease_id: lease_a1,
            attempt: 1
        }]
    );
    sim.complete("a");
    let lease_a2 = sim.step("a").lease_id.expect("kept after success");
    sim.run("b");
    let lease_b1 = sim.step("b").lease_id.expect("kept after success");
    sim.claim("c");
    let unwind = sim.fail("c", false);
    // b's undo is ready; a waits for it. Both work leases are off their steps now.
    let mut retired = unwind.retired_leases.clone();
    retired.sort_by_key(|r| r.step);
    let b = sim.idx("b");
    assert_eq!(
        retired,
        [
            RetiredLease {
                step: a,
                lease_id: lease_a2,
                attempt: 2
            },
            RetiredLease {
                step: b,
                lease_id: lease_b1,
                attempt: 1
            },
        ]
    );
    assert!(
        sim.claim("b").retired_leases.is_empty(),
        "b had no lease left"
    );
    let undo_b1 = sim.step("b").lease_id.expect("undo leased");
    sim.fail("b", true);
    let undo_again = sim.claim_when_due("b");
    assert_eq!(
        undo_again.retired_leases,
        [RetiredLease {
            step: b,
            lease_id: undo_b1,
            attempt: 2
        }]
    );
}

// `failed` listing both in `compensated`.
#[test]
fn compensation_undoes_in_reverse_dependency_order() {
    let mut sim = start(&chain());
    sim.run("a");
    sim.run("b");
    sim.claim("c");
    sim.set_time(1_000);
    let tr = sim.fail("c", false);
    assert_eq!(
        kinds(&tr.events),
        [
            "step_failed c#1",
            "step_cancelled d",
            "job_compensating",
            "compensation_ready b"
        ]
    );
    assert_eq!(
        detail(&tr, EventKind::JobCompensating),
        Some(json!({ "step": "c", "error": "boom" }))
    );
    assert_eq!(tr.effects, [ready("u")]);
    assert_eq!(
        states(&tr.job),
        "a:compensating/waiting b:compensating/ready c:failed d:cancelled"
    );
    assert_eq!(tr.job.state, JobState::Compensating);
    // Only b's undo can be claimed, and only by its own agent's lease.
    let a = sim.idx("a");
    assert_eq!(
        sim.send(sim.claim_cmd_peek(a)),
        Err(Rejection::NotClaimable)
    );
    assert_eq!(sim.step("a").claim_agent(), None);
    assert_eq!(sim.step("b").claim_agent(), Some("u"));
    let b = sim.idx("b");
    assert_eq!(
        sim.job.step_idempotency_key(b),
        format!("{}/b/compensate", sim.job.id)
    );
    assert_eq!(sim.job.step_idempotency_key(2), format!("{}/c", sim.job.id));
    let inputs = sim.job.inputs_of(b);
    assert_eq!(Value::Object(inputs), json!({ "b": { "done": "b" } }));
    assert_eq!(sim.step("b").lease_payload(), &json!({ "undo": "b" }));
    sim.set_time(2_000);
    let tr = sim.claim("b");
    assert_eq!(kinds(&tr.events), ["compensation_leased b#2"]);
    let s = &tr.job.steps[b];
    assert_eq!(
        (s.comp_phase, s.attempt, s.comp_attempts, s.lease_expires_at),
        (Some(CompPhase::Running), 2, 1, Some(at(5_000)))
    );
    // The work's old lease is superseded by the undo's.
    assert!(matches!(
        sim.send(sim.complete_cmd("b", 1)),
        Err(Rejection::LeaseLost { .. })
    ));
    sim.set_time(2_500);
    let hb = sim.heartbeat("b");
    assert_eq!(
        hb.reply,
        Reply::Heartbeat {
            lease_expires_at: at(5_500),
            cancel: false
        }
    );
    assert_eq!(
        sim.send(sim.claim_cmd_peek(a)),
        Err(Rejection::NotClaimable)
    );
    let tr = sim.complete("b");
    assert_eq!(
        kinds(&tr.events),
        ["step_compensated b#2", "compensation_ready a"]
    );
    assert_eq!(
        detail(&tr, EventKind::StepCompensated),
        Some(json!({ "result": { "done": "b" } }))
    );
    assert_eq!(tr.effects, [ready("u")]);
    sim.claim("a");
    let tr = sim.complete("a");
    assert_eq!(kinds(&tr.events), ["step_compensated a#2", "job_failed"]);
    assert_eq!(
        detail(&tr, EventKind::JobFailed),
        Some(json!({ "compensated": ["b", "a"] }))
    );
    assert_eq!(
        effect_words(&tr.effects),
        ["finished failed", "alert job_failed"]
    );
    assert_eq!(
        states(&tr.job),
        "a:compensated b:compensated c:failed d:cancelled"
    );
    assert_eq!(tr.job.compensated_steps(), ["b", "a"]);
    // Each undo ran exactly once: b's before a's.
    let undos: Vec<String> = kinds(&sim.history)
        .into_iter()
        .filter(|k| k.starts_with("compensation_") || k.starts_with("step_compensated"))
        .collect();
    assert_eq!(
        undos,
        [
            "compensation_ready b",
            "compensation_leased b#2",
            "step_compensated b#2",
            "compensation_ready a",
            "compensation_leased a#2",
            "step_compensated a#2"
        ]
    );
}

// Proves undos follow dependants transitively (through a step without an undo) and that
// independent undos are ready together.
#[test]
fn undos_wait_for_every_dependant() {
    // a → b → c → d: a and c have undos, b none; d fails.
    let steps = vec![
        undoable("a", "x", &[], 2),
        step("b", "x", &["a"], 3),
        undoable("c", "x", &["b"], 2),
        step("d", "x", &["c"], 1),
    ];
    let mut sim = start(&spec(steps, None));
    for name in ["a", "b", "c"] {
        sim.run(name);
    }
    sim.run_fatal("d");
    assert_eq!(
        states(&sim.job),
        "a:compensating/waiting b:succeeded c:compensating/ready d:failed"
    );
    let tr = sim.run("c");
    assert_eq!(
        kinds(&tr.events),
        ["step_compensated c#2", "compensation_ready a"]
    );
    sim.run("a");
    assert_eq!(sim.job.state, JobState::Failed);
    assert_eq!(
        sim.job.compensated_steps(),
        ["c", "a"],
        "in the order undone"
    );
    // Two independent roots with undos, and c after both fails: both undos are ready at once.
    let steps = vec![
        undoable("a", "x", &[], 2),
        undoable("b", "y", &[], 2),
        step("c", "x", &["a", "b"], 1),
    ];
    let mut sim = start(&spec(steps, None));
    sim.run("a");
    sim.run("b");
    let tr = sim.run_fatal("c");
    assert_eq!(
        kinds(&tr.events),
        [
            "step_failed c#1",
            "job_compensating",
            "compensation_ready a",
            "compensation_ready b"
        ]
    );
    assert_eq!(tr.effects, [ready("u")]);
    sim.claim("a");
    sim.claim("b");
    sim.complete("b");
    sim.complete("a");
    assert_eq!(sim.job.state, JobState::Failed);
}

// Proves nothing is undone while a step's work still runs: the running step is told to cancel,
// its late report (complete refused, fail, or expiry) cancels it, and only then is the undo
// ready.
#[test]
fn compensation_waits_for_running_work() {
    type Ending = (
        &'static str,
        fn(&mut Sim) -> Transition,
        bool,
        &'static [&'static str],
    );
    let endings: &[Ending] = &[
        (
            "complete",
            |s| s.complete("b"),
            true,
            &["step_cancelled b#1", "compensation_ready a"],
        ),
        (
            "fail",
            |s| s.fail("b", true),
            false,
            &["step_cancelled b#1", "compensation_ready a"],
        ),
        (
            "expire",
            |s| s.expire("b"),
            false,
            &[
                "step_lease_expired b#1",
                "step_cancelled b#1",
                "compensation_ready a",
            ],
        ),
    ];
    for (ending, end, refused, events) in endings {
        let steps = vec![
            undoable("a", "x", &[], 2),
            step("b", "y", &[], 3),
            step("c", "x", &["a"], 1),
        ];
        let mut sim = start(&spec(steps, None));
        sim.claim("b");
        sim.run("a");
        let tr = sim.run_fatal("c");
        assert_eq!(
            kinds(&tr.events),
            ["step_failed c#1", "job_compensating"],
            "{ending}"
        );
        assert!(tr.effects.is_empty(), "{ending}");
        assert_eq!(
            states(&tr.job),
            "a:compensating/waiting b:running c:failed",
            "{ending}"
        );
        assert_eq!(
            sim.send(sim.claim_cmd_peek(0)),
            Err(Rejection::NotClaimable)
        );
        let hb = sim.heartbeat("b");
        assert!(
            matches!(hb.reply, Reply::Heartbeat { cancel: true, .. }),
            "{ending}"
        );
        let tr = end(&mut sim);
        assert_eq!(kinds(&tr.events), *events, "{ending}");
        assert_eq!(
            matches!(tr.reply, Reply::Refused(Rejection::LeaseLost { .. })),
            *refused,
            "{ending}"
        );
        assert_eq!(tr.effects, [ready("u")], "{ending}");
        sim.run("a");
        assert_eq!(sim.job.state, JobState::Failed, "{ending}");
        assert_eq!(sim.step("b").state, StepState::Cancelled, "{ending}");
    }
}

// Proves `compensate` with nothing to undo fails the job at once, listing no compensation.
#[test]
fn compensation_with_nothing_to_undo_fails_at_once() {
    let mut sim = start(&job(forked(3).steps, Some(OnFailure::Compensate)));
    let tr = sim.run_fatal("a");
    assert_eq!(
        kinds(&tr.events),
        [
            "step_failed a#1",
            "step_cancelled b",
            "step_cancelled c",
            "job_compensating",
            "job_failed"
        ]
    );
    assert_eq!(
        detail(&tr, EventKind::JobFailed),
        Some(json!({ "compensated": [] }))
    );
    assert_eq!(tr.job.state, JobState::Failed);
}

// Proves the issue's cancel scenario: cancel during a long-running step tells it to cancel on
// its heartbeat, refuses its late complete (the step is cancelled), then undoes what succeeded
// and ends `cancelled` listing it, with a callback and no failure alert.
#[test]
fn cancel_during_a_running_step_unwinds_then_cancels() {
    let steps = vec![
        undoable("a", "x", &[], 2),
        step("b", "x", &["a"], 3),
        step("c", "x", &["b"], 3),
    ];
    let mut with_callback = spec(steps, None);
    with_callback.callback_url = Some("https://example.com/done".into());
    let mut sim = start(&with_callback);
    sim.run("a");
    sim.claim("b");
    sim.set_time(1_000);
    let tr = sim.cancel();
    assert_eq!(kinds(&tr.events), ["cancel_requested", "step_cancelled c"]);
    assert_eq!(
        (tr.job.state, tr.job.desired_state),
        (JobState::Running, DesiredState::Cancelled)
    );
    sim.set_time(2_000);
    let hb = sim.heartbeat("b");
    assert!(matches!(hb.reply, Reply::Heartbeat { cancel: true, .. }));
    let tr = sim.complete("b");
    assert!(matches!(
        tr.reply,
        Reply::Refused(Rejection::LeaseLost { .. })
    ));
    assert_eq!(
        kinds(&tr.events),
        [
            "step_cancelled b#1",
            "job_compensating",
            "compensation_ready a"
        ]
    );
    assert_eq!(
        detail(&tr, EventKind::JobCompensating),
        Some(json!({ "cause": "cancel" }))
    );
    assert_eq!(tr.job.state, JobState::Compensating);
    assert_eq!(
        sim.step("b").result,
        None,
        "a refused result is not recorded"
    );
    sim.claim("a");
    let hb = sim.heartbeat("a");
    assert!(matches!(hb.reply, Reply::Heartbeat { cancel: false, .. }));
    let tr = sim.complete("a");
    assert_eq!(kinds(&tr.events), ["step_compensated a#2", "job_cancelled"]);
    assert_eq!(
        detail(&tr, EventKind::JobCancelled),
        Some(json!({ "compensated": ["a"] }))
    );
    assert_eq!(
        effect_words(&tr.effects),
        ["finished cancelled", "callback cancelled"]
    );
    assert_eq!(states(&tr.job), "a:compensated b:cancelled c:cancelled");
}

// Proves a cancel while the job compensates only records the wish: the unwind goes on and the
// job ends `cancelled` instead of `failed`; a second cancel is a no-op.
#[test]
fn cancel_while_compensating_ends_cancelled() {
    let mut sim = start(&chain());
    sim.run("a");
    sim.run("b");
    sim.run_fatal("c");
    sim.claim("b");
    let tr = sim.cancel();
    assert_eq!(kinds(&tr.events), ["cancel_requested"]);
    assert!(tr.effects.is_empty() && tr.changed_steps.is_empty());
    assert_eq!(
        (tr.job.state, tr.job.desired_state),
        (JobState::Compensating, DesiredState::Cancelled)
    );
    assert!(sim.cancel().is_noop());
    let hb = sim.heartbeat("b");
    assert!(matches!(hb.reply, Reply::Heartbeat { cancel: false, .. }));
    sim.complete("b");
    let tr = sim.run("a");
    assert_eq!(kinds(&tr.events), ["step_compensated a#2", "job_cancelled"]);
    assert_eq!(tr.effects, [finished(JobState::Cancelled)]);
}

// Proves cancelling a blocked job: a held one with nothing running is cancelled at once (or
// unwinds first if something can be undone); with a running sibling it stays blocked until the
// sibling reports; one blocked on a failed undo stays blocked until an operator acts.
#[test]
fn cancel_of_a_blocked_job() {
    // Held, nothing running, nothing to undo.
    let mut sim = start(&job(forked(3).steps, Some(OnFailure::Hold)));
    sim.run_fatal("a");
    let tr = sim.cancel();
    assert_eq!(
        kinds(&tr.events),
        [
            "cancel_requested",
            "step_cancelled b",
            "step_cancelled c",
            "job_cancelled"
        ]
    );
    assert_eq!(tr.effects, [finished(JobState::Cancelled)]);
    assert_eq!(
        (tr.job.state, tr.job.blocked_reason.clone()),
        (JobState::Cancelled, None)
    );
    // Held with an undoable step done: it unwinds, then ends cancelled.
    let steps = vec![undoable("a", "x", &[], 2), step("b", "x", &["a"], 1)];
    let mut sim = start(&job(steps, Some(OnFailure::Hold)));
    sim.run("a");
    sim.run_fatal("b");
    let tr = sim.cancel();
    assert_eq!(
        kinds(&tr.events),
        [
            "cancel_requested",
            "job_compensating",
            "compensation_ready a"
        ]
    );
    assert_eq!(
        (tr.job.state, tr.job.blocked_reason.clone()),
        (JobState::Compensating, None)
    );
    let tr = sim.run("a");
    assert_eq!(tr.job.state, JobState::Cancelled);
    // Held with a running sibling: blocked until it reports.
    let mut sim = start(&job(forked(3).steps, Some(OnFailure::Hold)));
    sim.claim("b");
    sim.run_fatal("a");
    let tr = sim.cancel();
    assert_eq!(kinds(&tr.events), ["cancel_requested", "step_cancelled c"]);
    assert_eq!(
        (tr.job.state, tr.job.desired_state),
        (JobState::Blocked, DesiredState::Cancelled)
    );
    let hb = sim.heartbeat("b");
    assert!(matches!(hb.reply, Reply::Heartbeat { cancel: true, .. }));
    let tr = sim.complete("b");
    assert!(matches!(
        tr.reply,
        Reply::Refused(Rejection::LeaseLost { .. })
    ));
    assert_eq!(kinds(&tr.events), ["step_cancelled b#1", "job_cancelled"]);
    assert_eq!(tr.job.blocked_reason, None);
    // Blocked on a failed undo: still blocked after the cancel, until the operator retries it.
    let mut sim = start(&chain());
    sim.run("a");
    sim.run("b");
    sim.run_fatal("c");
    sim.run_fatal("b");
    let tr = sim.cancel();
    assert_eq!(kinds(&tr.events), ["cancel_requested"]);
    assert_eq!(tr.job.state, JobState::Blocked);
    let tr = sim.retry("b");
    assert_eq!(
        kinds(&tr.events),
        ["compensation_retried b", "job_unblocked"]
    );
    assert_eq!(tr.job.state, JobState::Compensating);
    sim.run("b");
    let tr = sim.run("a");
    assert_eq!(tr.job.state, JobState::Cancelled);
    assert_eq!(
        detail(&tr, EventKind::JobCancelled),
        Some(json!({ "compensated": ["b", "a"] }))
    );
}

// Proves a failing undo retries with the step's backoff (counted on its own failures), that an
// expired undo lease counts as a failure, that running out of attempts blocks the job with a
// reason and an alert, and that the operator's Retry (fresh budget) lets the unwind finish with
// the job `failed`.
#[test]
fn failing_undo_blocks_until_retried() {
    let steps = vec![undoable("a", "x", &[], 2), step("b", "x", &["a"], 1)];
    let mut sim = start(&spec(steps, None));
    sim.run("a");
    sim.run_fatal("b");
    sim.set_time(1_000);
    sim.claim("a");
    let tr = sim.fail("a", true);
    assert_eq!(kinds(&tr.events), ["compensation_retry_scheduled a#2"]);
    let next = at(2_000);
    assert_eq!(
        detail(&tr, EventKind::CompensationRetryScheduled),
        Some(json!({ "error": "boom", "delay": Span::from_secs(1), "next_attempt_at": next }))
    );
    assert_eq!(effect_words(&tr.effects), [format!("ready u at {next}")]);
    assert_eq!(
        sim.send(sim.claim_cmd_peek(0)),
        Err(Rejection::NotClaimable),
        "not before its backoff"
    );
    sim.claim_when_due("a");
    let tr = sim.expire("a");
    assert_eq!(
        kinds(&tr.events),
        [
            "compensation_lease_expired a#3",
            "compensation_failed a#3",
            "job_blocked"
        ]
    );
    assert_eq!(
        detail(&tr, EventKind::CompensationFailed),
        Some(
            json!({ "error": "lease expired: no report before complete_by", "reason": "attempts exhausted" })
        )
    );
    assert_eq!(effect_words(&tr.effects), ["alert job_blocked"]);
    assert_eq!(
        tr.job.blocked_reason.as_deref(),
        Some("compensation of step `a` failed: lease expired: no report before complete_by")
    );
    assert_eq!(states(&tr.job), "a:compensating/failed b:failed");
    let a = sim.step("a");
    assert_eq!(
        (a.attempt, a.comp_attempts, a.comp_failures, a.failures),
        (3, 2, 2, 0)
    );
    let tr = sim.retry("a");
    assert_eq!(
        kinds(&tr.events),
        ["compensation_retried a", "job_unblocked"]
    );
    assert_eq!(
        detail(&tr, EventKind::JobUnblocked),
        Some(json!({ "state": "compensating" }))
    );
    assert_eq!(tr.effects, [ready("u")]);
    assert_eq!(sim.step("a").comp_budget_from, 2);
    let tr = sim.run("a");
    assert_eq!(kinds(&tr.events), ["step_compensated a#4", "job_failed"]);
    assert_eq!(
        detail(&tr, EventKind::JobFailed),
        Some(json!({ "compensated": ["a"] }))
    );
}

// Proves an undo with max_attempts 0 retries forever with the step's backoff (1, 2, 4, 5, 5 s).
#[test]
fn undo_with_no_attempt_limit_retries_forever() {
    let steps = vec![undoable("a", "x", &[], 0), step("b", "x", &["a"], 1)];
    let mut sim = start(&spec(steps, None));
    sim.run("a");
    sim.run_fatal("b");
    for delay in [1_000, 2_000, 4_000, 5_000, 5_000] {
        sim.claim_when_due("a");
        let now = sim.now;
        let tr = sim.fail("a", true);
        assert_eq!(
            tr.job.steps[0].next_attempt_at,
            Some(now.plus(Span::from_millis(delay)))
        );
        assert_eq!(tr.job.state, JobState::Compensating);
    }
    sim.run("a");
    assert_eq!(sim.job.state, JobState::Failed);
}

// Proves an undo failing for good blocks the job while a sibling undo still runs: the sibling
// may finish (its heartbeat does not say cancel) without moving the job on; Resume retries the
// failed undo only (the failed work stays failed) and the unwind finishes.
#[test]
fn a_sibling_undo_finishes_while_blocked() {
    let steps = vec![
        undoable("a", "x", &[], 1),
        undoable("b", "y", &[], 1),
        step("c", "x", &["a", "b"], 1),
    ];
    let mut sim = start(&spec(steps, None));
    sim.run("a");
    sim.run("b");
    sim.run_fatal("c");
    sim.claim("a");
    sim.claim("b");
    let tr = sim.fail("a", false);
    assert_eq!(
        kinds(&tr.events),
        ["compensation_failed a#2", "job_blocked"]
    );
    assert_eq!(
        detail(&tr, EventKind::CompensationFailed),
        Some(json!({ "error": "boom", "reason": "fatal error" }))
    );
    let hb = sim.heartbeat("b");
    assert!(matches!(hb.reply, Reply::Heartbeat { cancel: false, .. }));
    let tr = sim.complete("b");
    assert_eq!(kinds(&tr.events), ["step_compensated b#2"]);
    assert_eq!(tr.job.state, JobState::Blocked);
    let tr = sim.resume();
    assert_eq!(
        kinds(&tr.events),
        ["job_resumed", "compensation_retried a", "job_unblocked"]
    );
    assert_eq!(tr.job.state, JobState::Compensating);
    let tr = sim.run("a");
    assert_eq!(
        detail(&tr, EventKind::JobFailed),
        Some(json!({ "compensated": ["b", "a"] }))
    );
}

// Proves Skip of a failed undo finishes the unwind: with another undo still to run the job
// goes back to compensating and readies it; when it was the last, the job ends at once.
#[test]
fn skip_of_a_failed_undo_finishes_the_unwind() {
    let mut sim = start(&chain());
    sim.run("a");
    sim.run("b");
    sim.run_fatal("c");
    sim.run_fatal("b");
    let tr = sim.skip("b");
    assert_eq!(
        kinds(&tr.events),
        [
            "compensation_skipped b",
            "job_unblocked",
            "compensation_ready a"
        ]
    );
    assert_eq!(tr.job.state, JobState::Compensating);
    assert_eq!(
        states(&tr.job),
        "a:compensating/ready b:skipped c:failed d:cancelled"
    );
    let tr = sim.run("a");
    assert_eq!(
        detail(&tr, EventKind::JobFailed),
        Some(json!({ "compensated": ["a"] }))
    );
    // The last undo skipped: the job is failed (or cancelled, after a cancel) at once.
    for cancelled in [false, true] {
        let steps = vec![undoable("a", "x", &[], 1), step("b", "x", &["a"], 1)];
        let mut sim = start(&spec(steps, None));
        sim.run("a");
        sim.run_fatal("b");
        sim.run_fatal("a");
        if cancelled {
            sim.cancel();
        }
        let tr = sim.skip("a");
        let (state, end) = if cancelled {
            (JobState::Cancelled, EventKind::JobCancelled)
        } else {
            (JobState::Failed, EventKind::JobFailed)
        };
        assert_eq!(
            kinds(&tr.events),
            ["compensation_skipped a", "job_unblocked", end.as_str()],
            "cancelled: {cancelled}"
        );
        assert_eq!(tr.job.state, state);
        assert_eq!(detail(&tr, end), Some(json!({ "compensated": [] })));
        assert_eq!(states(&tr.job), "a:skipped b:failed");
    }
}

// Proves claims of undos are refused unless the job compensates and the undo is ready and due,
// and claims of work are refused while the job is blocked or compensating.
#[test]
fn claims_follow_the_job_state() {
    type Case = (&'static str, Setup, &'static str);
    let cases: &[Case] = &[
        (
            "a step parked by a held job",
            |s| {
                s.run_fatal("a");
            },
            "d",
        ),
        (
            "a waiting undo",
            |s| {
                s.run("a");
                s.run("b");
                s.run_fatal("c");
            },
            "a",
        ),
        (
            "a ready undo of a job blocked on another undo (forged)",
            |s| {
                s.run("a");
                s.run("b");
                s.run_fatal("c");
                s.run_fatal("b");
                s.job.steps[0].comp_phase = Some(CompPhase::Ready);
                s.job.steps[0].next_attempt_at = Some(s.now);
            },
            "a",
        ),
        (
            "a succeeded step that has nothing to undo",
            |s| {
                s.run("a");
                s.run("b");
                s.run("d");
                s.run_fatal("c");
            },
            "d",
        ),
        (
            "an undo waiting for its retry",
            |s| {
                s.run("a");
                s.run("b");
                s.run_fatal("c");
                s.claim("b");
                s.fail("b", true);
            },
            "b",
        ),
        (
            "a compensated step",
            |s| {
                s.run("a");
                s.run("b");
                s.run("d");
                s.run_fatal("c");
                s.run("b");
            },
            "b",
        ),
    ];
    for (what, setup, name) in cases {
        let steps = vec![
            undoable("a", "x", &[], 2),
            undoable("b", "y", &["a"], 2),
            step("c", "x", &["b"], 1),
            step("d", "y", &[], 3),
        ];
        let on_failure = if what.contains("held job") {
            Some(OnFailure::Hold)
        } else {
            None
        };
        let mut sim = start(&job(steps, on_failure));
        setup(&mut sim);
        let before = sim.job.clone();
        let result = apply(&before, sim.claim_cmd_peek(sim.idx(name)), sim.now);
        assert_eq!(result, Err(Rejection::NotClaimable), "{what}");
    }
}

// Proves the step_poisoned alert is raised once, on the POISON_FAILURES-th failure, and only
// when the step will still retry.
#[test]
fn poisoned_alert_on_the_third_failure_that_retries() {
    // (max_attempts, failure that alerts, if any)
    let cases = [(5, Some(3)), (0, Some(3)), (3, None), (2, None)];
    for (max_attempts, alerting) in cases {
        let mut sim = start(&spec(vec![step("a", "x", &[], max_attempts)], None));
        for n in 1..=4u32 {
            if sim.job.state.is_terminal() {
                break;
            }
            sim.claim_when_due("a");
            let tr = if n % 2 == 0 {
                sim.expire("a")
            } else {
                sim.fail("a", true)
            };
            let alerted = effect_words(&tr.effects).contains(&"alert step_poisoned a".to_string());
            assert_eq!(
                alerted,
                alerting == Some(n),
                "max {max_attempts}, failure {n}"
            );
        }
    }
}

// Proves Repair changes nothing on consistent jobs, and heals hand-broken ones (a dependant
// left waiting, a finished job left running, an undo left waiting) recording `job_repaired`.
#[test]
fn repair_heals_only_inconsistent_jobs() {
    // Consistent states: running, held, compensating, blocked on an undo, finished.
    let mut sim = start(&chain());
    sim.run("a");
    for _ in 0..5 {
        let tr = sim.repair();
        assert!(tr.is_noop() && tr.effects.is_empty());
        sim.run_when_possible();
    }
    // (what, break it, events, effects, job state after)
    type Case = (
        &'static str,
        Setup,
        &'static [&'static str],
        &'static [&'static str],
        JobState,
    );
    let cases: &[Case] = &[
        (
            "a dependant left waiting",
            |s| {
                s.claim("a");
                let a = &mut s.job.steps[0];
                a.state = StepState::Succeeded;
                a.result = Some(json!("lost"));
                a.finished_at = Some(s.now);
                a.lease_expires_at = None;
            },
            &["step_ready b", "job_repaired"],
            &["ready x"],
            JobState::Running,
        ),
        (
            "every step succeeded, the job still running",
            |s| {
                for st in &mut s.job.steps {
                    st.state = StepState::Succeeded;
                    st.result = Some(json!("done"));
                    st.finished_at = Some(s.now);
                    st.next_attempt_at = None;
                }
            },
            &["job_succeeded", "job_repaired"],
            &["finished succeeded"],
            JobState::Succeeded,
        ),
        (
            "an undo left waiting after its dependant's undo",
            |s| {
                s.run("a");
                s.run("b");
                s.run_fatal("c");
                s.run("b");
                let a = &mut s.job.steps[0];
                a.comp_phase = Some(CompPhase::Waiting);
                a.next_attempt_at = None;
            },
            &["compensation_ready a", "job_repaired"],
            &["ready u"],
            JobState::Compensating,
        ),
    ];
    for (what, break_it, events, effects, state) in cases {
        let mut sim = start(&chain());
        break_it(&mut sim);
        let tr = sim.repair();
        assert_eq!(kinds(&tr.events), *events, "{what}");
        let applied: Vec<&str> = events[..events.len() - 1]
            .iter()
            .map(|e| e.split(' ').next().unwrap())
            .collect();
        assert_eq!(
            detail(&tr, EventKind::JobRepaired),
            Some(json!({ "applied": applied })),
            "{what}"
        );
        assert_eq!(effect_words(&tr.effects), *effects, "{what}");
        assert_eq!(tr.job.state, *state, "{what}");
        assert!(sim.repair().is_noop(), "{what}: a second repair");
    }
}

impl Sim {
    /// Moves the job one step on: completes a leased step, or claims a claimable one, or fails
    /// the step `c` for good when it is leased (so the job of `chain()` goes through its unwind).
    fn run_when_possible(&mut self) {
        if let Some(i) = self.job.steps.iter().position(|s| s.is_leased()) {
            let name = self.job.steps[i].name.clone();
            if name == "c" && !self.job.steps[i].is_compensating() {
                self.fail(&name, false);
            } else {
                self.complete(&name);
            }
        } else if let Some(i) = self
            .job
            .steps
            .iter()
            .position(|s| s.claim_agent().is_some())
        {
            let name = self.job.steps[i].name.clone();
            self.claim_when_due(&name);
        }
    }
}

/// The scenarios the edge-coverage test runs; between them they take every edge.
fn edge_scenarios() -> Vec<Sim> {
    let mut all = Vec::new();
    // A diamond that succeeds, with a heartbeat on the way.
    let mut sim = start(&diamond(3));
    sim.claim("a");
    sim.heartbeat("a");
    sim.complete("a");
    for name in ["b", "c", "d"] {
        sim.claim(name);
        sim.complete(name);
    }
    all.push(sim);
    // A delayed job that runs, and one cancelled before its time.
    let mut sim = start(&spec(vec![step("a", "x", &[], 3)], Some(at(1_000))));
    sim.set_time(1_000);
    sim.ok(Command::Activate);
    sim.claim("a");
    sim.complete("a");
    all.push(sim);
    let mut sim = start(&spec(forked(3).steps, Some(at(1_000))));
    sim.cancel();
    all.push(sim);
    // Retries by failure and by expiry, then attempts run out: the job fails.
    let mut sim = start(&forked(3));
    sim.claim("a");
    sim.fail("a", true);
    sim.claim_when_due("a");
    sim.expire("a");
    sim.claim_when_due("a");
    sim.expire("a");
    all.push(sim);
    // A job cancelled while a step runs, which then reports.
    let mut sim = start(&forked(3));
    sim.claim("a");
    sim.cancel();
    sim.complete("a");
    all.push(sim);
    // Held: blocked, retried back to running; then blocked again and the last step skipped.
    let mut sim = start(&job(vec![step("a", "x", &[], 1)], Some(OnFailure::Hold)));
    sim.run_fatal("a");
    sim.retry("a");
    sim.run_fatal("a");
    sim.skip("a");
    all.push(sim);
    // Held, then cancelled: once with nothing to undo, once with an undo to run first.
    let mut sim = start(&job(forked(3).steps, Some(OnFailure::Hold)));
    sim.run_fatal("a");
    sim.cancel();
    all.push(sim);
    let steps = vec![undoable("a", "x", &[], 2), step("b", "x", &["a"], 1)];
    let mut sim = start(&job(steps, Some(OnFailure::Hold)));
    sim.run("a");
    sim.run_fatal("b");
    sim.cancel();
    sim.run("a");
    all.push(sim);
    // Compensation with an undo heartbeat, a failing undo retried by the operator, to failed.
    let mut sim = start(&chain());
    sim.run("a");
    sim.run("b");
    sim.run_fatal("c");
    sim.claim("b");
    sim.heartbeat("b");
    sim.complete("b");
    sim.run_fatal("a");
    sim.retry("a");
    sim.run("a");
    all.push(sim);
    // The last failed undo skipped: blocked straight to failed.
    let steps = vec![undoable("a", "x", &[], 1), step("b", "x", &["a"], 1)];
    let mut sim = start(&spec(steps, None));
    sim.run("a");
    sim.run_fatal("b");
    sim.run_fatal("a");
    sim.skip("a");
    all.push(sim);
    // Held with a running sibling that retries while blocked (parked) and another that fails
    // for good too; retrying one of the two failures leaves the retried step parked.
    let roots = vec![
        step("a", "x", &[], 3),
        step("b", "x", &[], 3),
        step("c", "x", &[], 3),
    ];
    let mut sim = start(&job(roots, Some(OnFailure::Hold)));
    for name in ["a", "b", "c"] {
        sim.claim(name);
    }
    sim.fail("a", false);
    sim.fail("b", true);
    sim.fail("c", false);
    sim.retry("a");
    assert_eq!(states(&sim.job), "a:waiting b:waiting c:failed");
    sim.resume();
    for name in ["a", "b", "c"] {
        sim.run(name);
    }
    assert_eq!(sim.job.state, JobState::Succeeded);
    all.push(sim);
    // Cancelled while running with an undo to run: compensating, then cancelled.
    let steps = vec![undoable("a", "x", &[], 1), step("b", "x", &["a"], 1)];
    let mut sim = start(&spec(steps, None));
    sim.run("a");
    sim.cancel();
    sim.run("a");
    all.push(sim);
    // A whole-job retry: the failed round is undone and every step starts over.
    // The second round's undo fails and is skipped by an operator before the third round.
    let mut again = whole_job(3);
    again.steps.push(step("c", "x", &[], 1));
    again.steps.push(step("d", "x", &["b"], 1));
    let mut sim = start(&again);
    sim.run("a");
    sim.run("c");
    sim.run_fatal("b");
    sim.run("a");
    assert_eq!(sim.job.round, 2);
    sim.run("a");
    sim.run_fatal("b");
    sim.run_fatal("a");
    assert_eq!(sim.job.state, JobState::Blocked);
    sim.skip("a");
    assert_eq!(sim.job.round, 3);
    all.push(sim);
    // A delayed job whose deadline passes before it starts.
    let mut late = spec(forked(3).steps, Some(at(60_000)));
    late.deadline = Some(crate::spec::JobDeadline::After(Span::from_secs(10)));
    let mut sim = start(&late);
    sim.set_time(10_000);
    sim.ok(Command::Deadline);
    all.push(sim);
    // A rerun from failure keeps the step that succeeded.
    all.push(rerun::kept_scenario());
    all
}

/// The edges drawn in the mermaid diagram of `machine.rs`'s doc comment.
fn parse_diagram() -> BTreeSet<(String, String, String)> {
    let source = include_str!("../machine.rs");
    let mut machine: Option<String> = None;
    let mut edges = BTreeSet::new();
    for line in source.lines() {
        let Some(line) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let line = line.trim();
        if line.starts_with("state ") && line.ends_with('{') {
            let name = line
                .trim_end_matches('{')
                .trim()
                .rsplit(' ')
                .next()
                .unwrap_or_default();
            machine = Some(name.to_string());
        } else if line == "}" {
            machine = None;
        } else if let Some((from, rest)) = line.split_once("-->") {
            let to = rest.split(':').next().unwrap_or_default().trim();
            let machine = machine
                .clone()
                .expect("every edge sits inside a state block");
            edges.insert((machine, from.trim().to_string(), to.to_string()));
        }
    }
    edges
}

// Proves the hard-coded edge list is exactly the diagram drawn in machine.rs (19 job edges,
// 19 step edges).
#[test]
fn edge_list_matches_the_diagram() {
    let listed: BTreeSet<(String, String, String)> = DIAGRAM_EDGES
        .iter()
        .map(|(m, f, t)| (m.to_string(), f.to_string(), t.to_string()))
        .collect();
    assert_eq!(
        listed.len(),
        DIAGRAM_EDGES.len(),
        "duplicate edges in DIAGRAM_EDGES"
    );
    assert_eq!(parse_diagram(), listed);
    let jobs = DIAGRAM_EDGES.iter().filter(|e| e.0 == "job").count();
    assert_eq!((jobs, DIAGRAM_EDGES.len() - jobs), (19, 24));
}

// Proves every edge of the diagram is taken by the scenarios (and `Sim` proves no edge outside
// the diagram is ever taken), so a new transition needs a line in the diagram and a scenario.
#[test]
fn every_diagram_edge_is_exercised() {
    let seen: BTreeSet<Edge> = edge_scenarios()
        .into_iter()
        .flat_map(|sim| sim.edges)
        .collect();
    let missing: Vec<&Edge> = DIAGRAM_EDGES
        .iter()
        .filter(|e| !seen.contains(*e))
        .collect();
    assert!(missing.is_empty(), "edges never exercised: {missing:?}");
}

/// One step of a random DAG: dependencies on earlier steps (by flag), attempts, agent, timeout,
/// and maybe an undo (its max_attempts, and whether it has its own timeout).
#[derive(Clone, Debug)]
struct RandomStep {
    deps: Vec<bool>,
    max_attempts: u32,
    agent: bool,
    timeout_ms: u64,
    undo: Option<(u32, bool)>,
    /// Whether a new progress is recorded in the history.
    progress_events: bool,
}

/// A command in the abstract: `pick` chooses among the steps it makes sense for (leased steps
/// for reports, claimable ones for claims, compensating ones for undo claims, failed steps and
/// undos for operators when `right`; any step if there are none, or when not `right`), `skew`
/// shifts the attempt reported away from the current one, `when_due` first moves the clock to
/// the step's due time.
#[derive(Clone, Debug)]
enum Op {
    Activate,
    Cancel,
    Claim {
        pick: usize,
        when_due: bool,
    },
    ClaimUndo {
        pick: usize,
        when_due: bool,
    },
    /// `progress`, when given, is reported as `{"done": progress}`.
    Heartbeat {
        pick: usize,
        skew: i64,
        progress: Option<u8>,
    },
    Complete {
        pick: usize,
        skew: i64,
    },
    Fail {
        pick: usize,
        skew: i64,
        retryable: bool,
        jitter: f64,
    },
    Expire {
        pick: usize,
        skew: i64,
        when_due: bool,
        jitter: f64,
    },
    Retry {
        pick: usize,
        right: bool,
    },
    Skip {
        pick: usize,
        right: bool,
    },
    Resume,
    Repair,
    /// A move of `run_at` (ms from now, may be past) and/or of the priority.
    Reschedule {
        run_at_ms: Option<i64>,
        priority: Option<i32>,
    },
}

#[derive(Clone, Debug)]
struct Plan {
    steps: Vec<RandomStep>,
    run_at_ms: Option<i64>,
    on_failure: Option<OnFailure>,
    /// For `compensate_and_retry`: rounds (`job_attempts`) and what the last round's failure
    /// does (`job_exhausted`), each left to its default when `None`.
    job_attempts: Option<u32>,
    job_exhausted: Option<JobExhausted>,
    callback: bool,
    /// Whether the operator of the final drain unblocks jobs by Skip (else by Resume).
    drain_by_skip: bool,
    /// Milliseconds to move the clock forward, then the command.
    ops: Vec<(u64, Op)>,
}

fn plan() -> impl Strategy<Value = Plan> {
    let random_step = (
        prop::collection::vec(any::<bool>(), 8),
        0u32..=3,
        any::<bool>(),
        1u64..=5,
        prop::option::weighted(0.6, (0u32..=2, any::<bool>())),
        any::<bool>(),
    )
        .prop_map(
            |(deps, max_attempts, agent, secs, undo, progress_events)| RandomStep {
                deps,
                max_attempts,
                agent,
                timeout_ms: secs * 1_000,
                undo,
                progress_events,
            },
        );
    let pick = 0usize..8;
    let skew = prop_oneof![6 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64), 1 => Just(2i64)];
    let right = prop::bool::weighted(0.8);
    let op = prop_oneof![
        3 => Just(Op::Activate),
        1 => Just(Op::Cancel),
        24 => (pick.clone(), any::<bool>()).prop_map(|(pick, when_due)| Op::Claim { pick, when_due }),
        8 => (pick.clone(), any::<bool>()).prop_map(|(pick, when_due)| Op::ClaimUndo { pick, when_due }),
        6 => (pick.clone(), skew.clone(), prop::option::of(0u8..3))
            .prop_map(|(pick, skew, progress)| Op::Heartbeat { pick, skew, progress }),
        20 => (pick.clone(), skew.clone()).prop_map(|(pick, skew)| Op::Complete { pick, skew }),
        12 => (pick.clone(), skew.clone(), prop::bool::weighted(0.75), 0.0..1.0f64)
            .prop_map(|(pick, skew, retryable, jitter)| Op::Fail { pick, skew, retryable, jitter }),
        8 => (pick.clone(), skew, any::<bool>(), 0.0..1.0f64)
            .prop_map(|(pick, skew, when_due, jitter)| Op::Expire { pick, skew, when_due, jitter }),
        5 => (pick.clone(), right).prop_map(|(pick, right)| Op::Retry { pick, right }),
        4 => (pick, right).prop_map(|(pick, right)| Op::Skip { pick, right }),
        2 => Just(Op::Resume),
        2 => Just(Op::Repair),
        3 => (prop::option::of(-2_000i64..6_000), prop::option::of(-3i32..=3))
            .prop_map(|(run_at_ms, priority)| Op::Reschedule { run_at_ms, priority }),
    ];
    let advance = prop_oneof![3 => Just(0u64), 4 => 1u64..1_500, 1 => 1_500u64..12_000];
    let exhausted = prop_oneof![
        Just(None),
        Just(Some(JobExhausted::Fail)),
        Just(Some(JobExhausted::Hold)),
    ];
    let retry = (prop::option::of(1u32..=3), exhausted)
        .prop_map(|(rounds, then)| (Some(OnFailure::CompensateAndRetry), rounds, then));
    let on_failure = prop_oneof![
        1 => Just((None, None, None)),
        1 => Just((Some(OnFailure::Fail), None, None)),
        1 => Just((Some(OnFailure::Hold), None, None)),
        1 => Just((Some(OnFailure::Compensate), None, None)),
        2 => retry,
    ];
    (
        prop::collection::vec(random_step, 1..=8),
        prop::option::weighted(0.25, 0i64..4_000),
        on_failure,
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec((advance, op), 0..80),
    )
        .prop_map(
            |(
                steps,
                run_at_ms,
                (on_failure, job_attempts, job_exhausted),
                callback,
                drain_by_skip,
                ops,
            )| Plan {
                steps,
                run_at_ms,
                on_failure,
                job_attempts,
                job_exhausted,
                callback,
                drain_by_skip,
                ops,
            },
        )
}

/// The first step (by `pick`, cyclically) that fits, or `pick` itself when none does.
fn pick_where(job: &Job, pick: usize, fits: impl Fn(&Step) -> bool) -> usize {
    let fitting: Vec<usize> = (0..job.steps.len())
        .filter(|&i| fits(&job.steps[i]))
        .collect();
    if fitting.is_empty() {
        pick % job.steps.len()
    } else {
        fitting[pick % fitting.len()]
    }
}

/// Whether the operator has something to retry or skip on this step.
fn operator_target(s: &Step) -> bool {
    s.state == StepState::Failed || s.comp_phase == Some(CompPhase::Failed)
}

impl Sim {
    /// Turns an abstract op into a command on the current job, moving the clock if it asks.
    fn command_for(&mut self, op: &Op) -> Command {
        let attempt = |job: &Job, step: usize, skew: i64| {
            (i64::from(job.steps[step].attempt) + skew).max(0) as u32
        };
        let leased = |job: &Job, pick: usize| pick_where(job, pick, Step::is_leased);
        let operator = |job: &Job, pick: usize, right: bool| {
            if right {
                pick_where(job, pick, operator_target)
            } else {
                pick % (job.steps.len() + 1)
            }
        };
        let claim = |sim: &mut Sim, step: usize, when_due: bool| {
            if let (true, Some(due)) = (when_due, sim.job.steps[step].next_attempt_at) {
                sim.now = sim.now.max(due);
            }
            sim.claim_cmd(step)
        };
        match *op {
            Op::Activate => Command::Activate,
            Op::Cancel => Command::Cancel,
            Op::Resume => Command::Resume {
                by: None,
                reason: None,
            },
            Op::Repair => Command::Repair,
            Op::Reschedule {
                run_at_ms,
                priority,
            } => Command::Reschedule {
                run_at: run_at_ms.map(|d| Timestamp::from_millis(self.now.as_millis() + d)),
                priority,
                by: Some("prop".into()),
                reason: None,
            },
            Op::Claim { pick, when_due } => {
                let step = pick_where(&self.job, pick, |s| s.claim_agent().is_some());
                claim(self, step, when_due)
            }
            Op::ClaimUndo { pick, when_due } => {
                let step = pick_where(&self.job, pick, Step::is_compensating);
                claim(self, step, when_due)
            }
            Op::Heartbeat {
                pick,
                skew,
                progress,
            } => {
                let step = leased(&self.job, pick);
                Command::Heartbeat {
                    step,
                    attempt: attempt(&self.job, step, skew),
                    progress: progress.map(|p| json!({ "done": p })),
                }
            }
            Op::Complete { pick, skew } => {
                let step = leased(&self.job, pick);
                let result = json!({ "n": self.history.len() });
                Command::Complete {
                    step,
                    attempt: attempt(&self.job, step, skew),
                    result,
                }
            }
            Op::Fail {
                pick,
                skew,
                retryable,
                jitter,
            } => {
                let step = leased(&self.job, pick);
                let error = format!("error {}", self.history.len());
                Command::Fail {
                    step,
                    attempt: attempt(&self.job, step, skew),
                    error,
                    retryable,
                    jitter,
                }
            }
            Op::Expire {
                pick,
                skew,
                when_due,
                jitter,
            } => {
                let step = leased(&self.job, pick);
                if let (true, Some(expiry)) = (when_due, self.job.steps[step].lease_expires_at) {
                    self.now = self.now.max(expiry);
                }
                Command::Expire {
                    step,
                    attempt: attempt(&self.job, step, skew),
                    jitter,
                }
            }
            Op::Retry { pick, right } => Command::Retry {
                step: operator(&self.job, pick, right),
                by: Some("prop".into()),
                reason: None,
            },
            Op::Skip { pick, right } => Command::Skip {
                step: operator(&self.job, pick, right),
                by: None,
                reason: Some("prop".into()),
            },
        }
    }

    /// Drives the job to its end as a healthy fleet would (activate when due, claim when due,
    /// complete live leases, expire dead ones) with an operator who unblocks a blocked job by
    /// `Skip` of a failed undo or step (or by `Resume`), and checks that it ends with every step
    /// settled.
    fn drain(&mut self, by_skip: bool) -> Vec<Result<Transition, Rejection>> {
        let mut out = Vec::new();
        for _ in 0..300 {
            let job = &self.job;
            let leased = job.steps.iter().position(Step::is_leased);
            let claimable = job.steps.iter().position(|s| match s.claim_agent() {
                None => false,
                Some(_) if s.is_compensating() => job.state == JobState::Compensating,
                Some(_) => job.state == JobState::Running,
            });
            let command = if job.state == JobState::Pending {
                if let Some(t) = job.run_at {
                    self.now = self.now.max(t);
                }
                Command::Activate
            } else if let Some(i) = leased {
                let s = &job.steps[i];
                let result = json!("drained");
                match s.lease_expires_at {
                    Some(t) if t <= self.now => Command::Expire {
                        step: i,
                        attempt: s.attempt,
                        jitter: 0.0,
                    },
                    _ => Command::Complete {
                        step: i,
                        attempt: s.attempt,
                        result,
                    },
                }
            } else if job.state == JobState::Blocked {
                if by_skip {
                    // A failed undo first: while the job unwinds its failed work stays failed.
                    let undo = job
                        .steps
                        .iter()
                        .position(|s| s.comp_phase == Some(CompPhase::Failed));
                    let step = undo
                        .or_else(|| job.steps.iter().position(|s| s.state == StepState::Failed))
                        .expect("a blocked job has a failed step or undo");
                    Command::Skip {
                        step,
                        by: None,
                        reason: None,
                    }
                } else {
                    Command::Resume {
                        by: None,
                        reason: None,
                    }
                }
            } else if let Some(i) = claimable {
                if let Some(due) = job.steps[i].next_attempt_at {
                    self.now = self.now.max(due);
                }
                self.claim_cmd(i)
            } else {
                break;
            };
            let shown = format!("{command:?}");
            let operator = matches!(command, Command::Skip { .. } | Command::Resume { .. });
            let failures_before = self.job.steps.iter().filter(|s| operator_target(s)).count();
            let result = self.send(command);
            assert!(result.is_ok(), "draining: {shown} was rejected: {result:?}");
            // Resume unblocks at once; each Skip resolves one failure.
            if operator && self.job.state == JobState::Blocked {
                let failures = self.job.steps.iter().filter(|s| operator_target(s)).count();
                assert!(
                    !shown.starts_with("Resume") && failures < failures_before,
                    "the operator's {shown} made no progress: {}",
                    states(&self.job)
                );
            }
            out.push(result);
        }
        assert!(
            self.job.state.is_terminal(),
            "stuck: {} {}",
            self.job.state,
            states(&self.job)
        );
        assert!(
            self.job.steps.iter().all(|s| s.state.is_settled()),
            "unsettled: {}",
            states(&self.job)
        );
        out
    }
}

/// Runs a plan from admission through its ops and a drain; returns every outcome and the end.
fn run(plan: &Plan) -> (Vec<Result<Transition, Rejection>>, Sim) {
    let steps: Vec<StepSpec> = plan
        .steps
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let deps: Vec<String> = (0..i)
                .filter(|&j| r.deps[j])
                .map(|j| format!("s{j}"))
                .collect();
            StepSpec {
                name: format!("s{i}"),
                agent: if r.agent { "x" } else { "y" }.into(),
                payload: json!(i),
                depends_on: deps,
                timeout: Some(Span::from_millis(r.timeout_ms)),
                deadline: None,
                max_attempts: Some(r.max_attempts),
                backoff: Some(Backoff {
                    initial: Span::from_millis(500),
                    factor: 2.0,
                    max: Span::from_secs(4),
                }),
                backoff_formula: None,
                compensate: r.undo.map(|(max_attempts, own_timeout)| CompensateSpec {
                    agent: "u".into(),
                    http: None,
                    payload: json!({ "undo": i }),
                    timeout: own_timeout.then_some(Span::from_secs(2)),
                    deadline: None,
                    max_attempts: Some(max_attempts),
                }),
                http: None,
                progress_events: r.progress_events.then_some(true),
            }
        })
        .collect();
    let mut job_spec = job(steps, plan.on_failure);
    job_spec.job_attempts = plan.job_attempts;
    job_spec.job_exhausted = plan.job_exhausted;
    job_spec.run_at = plan.run_at_ms.map(at);
    if plan.callback {
        job_spec.callback_url = Some("https://example.com/hook".into());
    }
    job_spec
        .validate(&Limits::default())
        .expect("generated specs are valid");
    let (mut sim, first) = Sim::admit(&job_spec, at(0));
    let mut outcomes = vec![Ok(first)];
    for (advance, op) in &plan.ops {
        sim.advance(*advance);
        let command = sim.command_for(op);
        outcomes.push(sim.send(command));
    }
    outcomes.extend(sim.drain(plan.drain_by_skip));
    (outcomes, sim)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // Proves, for random DAGs with random undos and `on_failure`, and random command sequences
    // (right and wrong attempts and steps, moving time, cancels, undo claims, operator retries,
    // skips, resumes and repairs), that every transition obeys the contract and leaves the job
    // consistent (checked by `Sim` after each command: undo order, only succeeded steps undone
    // and at most once, no work leased unless the job runs, Repair a no-op), that only diagram
    // edges are taken, that every job can still be driven to an end with all its steps settled,
    // and that a replay of the same sequence gives identical transitions. Proptest prints the
    // minimal failing plan.
    #[test]
    fn random_commands_keep_the_invariants(plan in plan()) {
        let (first, sim) = run(&plan);
        prop_assert!(sim.edges.iter().all(|e| DIAGRAM_EDGES.contains(e)));
        let (second, _) = run(&plan);
        prop_assert_eq!(first, second);
    }
}

// Proves the random plans reach the paths of a whole-job retry the property test is meant to
// cover: a round started over, a job that failed after its last round was undone, and one held
// in its last round (`job_exhausted: hold`), among 3,000 plans drawn with a fixed seed.
#[test]
fn random_plans_reach_every_end_of_a_whole_job_retry() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let (mut restarted, mut failed_last, mut held_last) = (0, 0, 0);
    for _ in 0..3_000 {
        let plan = plan().new_tree(&mut runner).expect("a plan").current();
        if plan.on_failure != Some(OnFailure::CompensateAndRetry) {
            continue;
        }
        let (_, sim) = run(&plan);
        let has = |kind: EventKind, text: &str| {
            sim.history.iter().any(|e| {
                e.kind == kind
                    && e.detail
                        .as_ref()
                        .is_some_and(|d| d.to_string().contains(text))
            })
        };
        restarted += usize::from(
            sim.history
                .iter()
                .any(|e| e.kind == EventKind::JobRoundStarted),
        );
        held_last += usize::from(has(EventKind::JobBlocked, "in the last round"));
        let rounds = sim.job.retry.map_or(0, |r| r.attempts);
        failed_last +=
            usize::from(sim.job.state == JobState::Failed && sim.job.round == rounds && rounds > 1);
    }
    assert!(
        restarted > 0 && failed_last > 0 && held_last > 0,
        "rounds started over {restarted}, failed after the last {failed_last}, held in the last {held_last}"
    );
}

// Proves a failure with a target's `Retry-After` schedules the retry at that delay, kept within
// the step's backoff bounds (BACKOFF: 1 s to 5 s) instead of the curve, for work and for an
// undo alike, and that it is fenced like any report.
#[test]
fn retry_after_sets_the_delay_within_the_backoff_bounds() {
    for (asked_ms, delay_ms) in [(3_000, 3_000), (10, 1_000), (3_600_000, 5_000)] {
        let mut sim = start(&spec(vec![step("a", "x", &[], 3)], None));
        sim.claim("a");
        let command = Command::FailRetryAfter {
            step: 0,
            attempt: 1,
            error: "busy".into(),
            retry_after: Span::from_millis(asked_ms),
        };
        let tr = sim.ok(command);
        assert_eq!(
            tr.job.steps[0].next_attempt_at,
            Some(at(delay_ms)),
            "{asked_ms}"
        );
        assert_eq!(tr.job.steps[0].state, StepState::Ready);
        let stale = Command::FailRetryAfter {
            step: 0,
            attempt: 1,
            error: "late".into(),
            retry_after: Span::ZERO,
        };
        assert!(matches!(sim.send(stale), Err(Rejection::LeaseLost { .. })));
    }
    let mut sim = start(&job(
        vec![undoable("a", "x", &[], 3), step("b", "x", &["a"], 1)],
        None,
    ));
    sim.claim("a");
    sim.complete("a");
    sim.claim("b");
    sim.fail("b", false);
    sim.claim("a");
    let attempt = sim.attempt("a");
    let tr = sim.ok(Command::FailRetryAfter {
        step: 0,
        attempt,
        error: "busy".into(),
        retry_after: Span::from_millis(2_000),
    });
    let a = &tr.job.steps[0];
    assert_eq!(a.comp_phase, Some(CompPhase::Ready));
    assert_eq!(
        a.next_attempt_at,
        Some(sim.now.plus(Span::from_millis(2_000)))
    );
}

/// A one-step job whose step has a heartbeat timeout of 3 s, a deadline of 10 s and
/// `max_attempts` attempts.
fn deadlined(max_attempts: u32) -> JobSpec {
    job(
        vec![StepSpec {
            timeout: Some(Span::from_secs(3)),
            deadline: Some(Span::from_secs(10)),
            ..step("a", "x", &[], max_attempts)
        }],
        None,
    )
}

// Proves a step's deadline bounds an attempt however it heartbeats: the claim fixes its hard end,
// each heartbeat renews the lease by the timeout but never past that end, and the expiry at the
// end is recorded as a deadline overrun (not silence), retried by the step's policy, and the
// last one fails the job.
#[test]
fn deadline_caps_heartbeats_and_fails_the_attempt() {
    let mut sim = start(&deadlined(2));
    sim.claim("a");
    assert_eq!(sim.step("a").attempt_ends_at, Some(at(10_000)));
    assert_eq!(sim.step("a").lease_expires_at, Some(at(3_000)));
    for beat in 1..=4 {
        sim.set_time(beat * 2_000);
        let tr = sim.heartbeat("a");
        let expected = at((beat * 2_000 + 3_000).min(10_000));
        assert_eq!(
            tr.reply,
            Reply::Heartbeat {
                lease_expires_at: expected,
                cancel: false
            },
            "beat {beat}"
        );
    }
    // At 8 s the lease already ends at the deadline; a heartbeat at 9.5 s cannot move it.
    sim.set_time(9_500);
    let tr = sim.heartbeat("a");
    assert!(matches!(
        tr.reply,
        Reply::Heartbeat { lease_expires_at, .. } if lease_expires_at == at(10_000)
    ));
    let tr = sim.expire("a");
    assert_eq!(sim.now, at(10_000));
    assert_eq!(
        kinds(&tr.events),
        ["step_deadline_exceeded a#1", "step_retry_scheduled a#1"]
    );
    assert_eq!(
        sim.step("a").last_error.as_deref(),
        Some("deadline exceeded: the attempt ran longer than its deadline of 10s")
    );
    // The retry gets a fresh hard end from its own claim; a report after it is refused.
    sim.claim_when_due("a");
    let started = sim.now;
    assert_eq!(
        sim.step("a").attempt_ends_at,
        Some(started.plus(Span::from_secs(10)))
    );
    let tr = sim.expire("a");
    assert_eq!(sim.now, started.plus(Span::from_secs(3)));
    assert_eq!(
        kinds(&tr.events),
        ["step_lease_expired a#2", "step_failed a#2", "job_failed"]
    );
    let late = sim.send(sim.complete_cmd("a", 2));
    assert!(matches!(late, Err(Rejection::LeaseLost { .. })));
}

// Proves a deadline shorter than the timeout makes the first lease end at the deadline, and that
// an undo's own deadline (or else the step's) bounds each undo attempt.
#[test]
fn deadline_shorter_than_timeout_and_undo_deadlines() {
    let short = job(
        vec![StepSpec {
            deadline: Some(Span::from_secs(2)),
            ..step("a", "x", &[], 1)
        }],
        None,
    );
    let mut sim = start(&short);
    sim.claim("a");
    assert_eq!(sim.step("a").lease_expires_at, Some(at(2_000)));
    let tr = sim.expire("a");
    assert_eq!(kinds(&tr.events)[0], "step_deadline_exceeded a#1");

    for (own, expected_end) in [(Some(Span::from_secs(1)), 1_000), (None, 2_000)] {
        let mut undo = undoable("a", "x", &[], 1);
        undo.deadline = Some(Span::from_secs(2));
        if let Some(c) = undo.compensate.as_mut() {
            c.deadline = own;
        }
        let mut sim = start(&job(vec![undo, step("b", "x", &["a"], 1)], None));
        sim.run("a");
        sim.claim("b");
        sim.fail("b", false);
        let begun = sim.now;
        sim.claim("a");
        let end = begun.plus(Span::from_millis(expected_end));
        assert_eq!(sim.step("a").attempt_ends_at, Some(end), "{own:?}");
        assert_eq!(sim.step("a").lease_expires_at, Some(end), "{own:?}");
        let tr = sim.expire("a");
        assert_eq!(
            kinds(&tr.events)[0],
            "compensation_deadline_exceeded a#2",
            "{own:?}"
        );
    }
}

/// The diamond job (a → b, c → d) with a job deadline.
fn diamond_by(deadline: &str, on_failure: Option<OnFailure>) -> JobSpec {
    let mut spec = diamond(3);
    spec.on_failure = on_failure;
    spec.deadline = Some(crate::spec::decode(json!(deadline)).expect("a deadline"));
    spec
}

// Proves a job deadline, relative or absolute, fails the job once it has passed: before it the
// command is refused (NotDue); past it no claim is taken even before the sweep comes; a pending
// job fails without starting; a running one cancels its unstarted steps and fails, while a
// running step learns it from its heartbeat.
#[test]
fn job_deadline_fails_the_job() {
    let absolute = at(5_000).to_rfc3339();
    for deadline in ["5s", absolute.as_str()] {
        let mut sim = start(&diamond_by(deadline, None));
        assert_eq!(sim.job.deadline, Some(at(5_000)));
        sim.run("a");
        sim.claim("b");
        sim.set_time(4_999);
        assert_eq!(sim.send(Command::Deadline), Err(Rejection::NotDue));
        sim.set_time(5_000);
        let claim = sim.claim_cmd(sim.idx("c"));
        assert_eq!(sim.send(claim), Err(Rejection::NotClaimable));
        let tr = sim.ok(Command::Deadline);
        assert_eq!(
            kinds(&tr.events),
            [
                "job_deadline_passed",
                "step_cancelled c",
                "step_cancelled d",
                "job_failed"
            ]
        );
        assert_eq!(tr.job.state, JobState::Failed);
        let beat = sim.ok(sim.heartbeat_cmd("b", 1));
        assert!(matches!(beat.reply, Reply::Heartbeat { cancel: true, .. }));
        assert_eq!(sim.send(Command::Deadline), Err(Rejection::NotDue));
    }
    let mut spec = diamond_by("10s", None);
    spec.run_at = Some(at(60_000));
    let (mut sim, _) = Sim::admit(&spec, at(0));
    sim.set_time(10_000);
    let tr = sim.ok(Command::Deadline);
    assert_eq!(tr.job.state, JobState::Failed);
    assert!(tr.job.steps.iter().all(|s| s.state == StepState::Cancelled));
}

// Proves a job deadline undoes what succeeded when the job compensates: the job unwinds once the
// running step has stopped, ends `failed`, and a blocked (held) job past its deadline fails too.
#[test]
fn job_deadline_compensates_where_declared() {
    let mut spec = job(
        vec![
            undoable("a", "x", &[], 1),
            step("b", "x", &["a"], 1),
            step("c", "x", &["a"], 1),
        ],
        None,
    );
    spec.deadline = Some(crate::spec::JobDeadline::After(Span::from_secs(5)));
    let mut sim = start(&spec);
    sim.run("a");
    sim.claim("b");
    sim.set_time(5_000);
    let tr = sim.ok(Command::Deadline);
    assert_eq!(tr.job.state, JobState::Compensating);
    assert_eq!(
        kinds(&tr.events),
        [
            "job_deadline_passed",
            "step_cancelled c",
            "job_compensating"
        ]
    );
    // The running step reports after the deadline: refused, and the undo may start.
    let late = sim.ok(sim.complete_cmd("b", 1));
    assert!(matches!(late.reply, Reply::Refused(_)));
    let tr = sim.run("a");
    assert_eq!(tr.job.state, JobState::Failed);
    assert_eq!(tr.job.compensated_steps(), ["a"]);

    let mut held = diamond_by("5s", Some(OnFailure::Hold));
    held.steps[0].max_attempts = Some(1);
    let mut sim = start(&held);
    sim.claim("a");
    sim.fail("a", false);
    assert_eq!(sim.job.state, JobState::Blocked);
    sim.set_time(5_000);
    let tr = sim.ok(Command::Deadline);
    assert_eq!(tr.job.state, JobState::Failed);
}

/// A chain a → b whose `b` fails for good on its one attempt, `a` undoable, retried as a whole
/// in up to `rounds` rounds.
fn whole_job(rounds: u32) -> JobSpec {
    let mut spec = job(
        vec![undoable("a", "x", &[], 1), step("b", "x", &["a"], 1)],
        Some(OnFailure::CompensateAndRetry),
    );
    spec.job_attempts = Some(rounds);
    spec.job_backoff = Some(BACKOFF);
    spec
}

// Proves whole-job retry: a step failing for good undoes the round's succeeded steps, then the
// whole job runs again from its roots after the job backoff, with attempt numbers still growing
// (a report of round 1 is refused in round 2) and fresh budgets; the last round's failure is
// undone and the job ends `failed`, its `round` counting the rounds run.
#[test]
fn whole_job_retry_undoes_each_round_and_runs_again() {
    let mut sim = start(&whole_job(2));
    assert_eq!(sim.job.round, 1);
    sim.run("a");
    sim.claim("b");
    let tr = sim.fail("b", false);
    assert_eq!(tr.job.state, JobState::Compensating);
    let undo_at = sim.now;
    let tr = sim.run("a");
    assert_eq!(
        kinds(&tr.events),
        [
            "step_compensated a#2",
            "job_round_started",
            "step_reset a",
            "step_reset b",
            "step_ready a"
        ]
    );
    assert_eq!((tr.job.round, tr.job.state), (2, JobState::Running));
    assert_eq!(states(&tr.job), "a:ready b:waiting");
    // The roots wait out the job backoff (1 s after the first round).
    assert_eq!(
        tr.job.steps[0].next_attempt_at,
        Some(undo_at.plus(Span::from_secs(1)))
    );
    assert!(tr
        .effects
        .iter()
        .any(|e| matches!(e, Effect::ReadyAt { .. })));
    let stale = sim.send(sim.complete_cmd("b", 1));
    assert!(matches!(stale, Err(Rejection::LeaseLost { .. })));
    let tr = sim.run("a");
    assert_eq!(
        tr.job.steps[0].attempt, 3,
        "attempts keep counting across rounds"
    );
    sim.claim("b");
    assert_eq!(sim.attempt("b"), 2);
    sim.fail("b", false);
    let tr = sim.run("a");
    assert_eq!(tr.job.state, JobState::Failed);
    assert_eq!(tr.job.round, 2);
    assert_eq!(tr.job.compensated_steps(), ["a"]);
}

// Proves a whole-job retry round that succeeds ends the job `succeeded`, and that a job past its
// deadline starts no new round.
#[test]
fn whole_job_retry_succeeds_in_a_later_round_and_stops_at_the_deadline() {
    let mut sim = start(&whole_job(3));
    sim.run("a");
    sim.run_fatal("b");
    sim.run("a");
    assert_eq!(sim.job.round, 2);
    sim.run("a");
    let tr = sim.run("b");
    assert_eq!((tr.job.state, tr.job.round), (JobState::Succeeded, 2));

    let mut late = whole_job(3);
    late.deadline = Some(crate::spec::JobDeadline::After(Span::from_secs(1)));
    let mut sim = start(&late);
    sim.run("a");
    sim.run_fatal("b");
    sim.set_time(1_000);
    let tr = sim.run("a");
    assert_eq!((tr.job.state, tr.job.round), (JobState::Failed, 1));
}

// Proves `job_exhausted: hold`: the rounds before the last are undone and start over as usual,
// but a step failing for good in the last round blocks the job with nothing undone (the reason
// names the round); an operator's retry goes on in that round and can still succeed, a second
// failure holds again, and a cancel undoes the round and ends `cancelled`. With the default
// (`fail`) the same job ends `failed`, its last round undone.
#[test]
fn whole_job_retry_can_hold_after_its_last_round() {
    let mut held = whole_job(2);
    held.job_exhausted = Some(JobExhausted::Hold);
    held.validate(&Limits::default()).expect("valid");
    let mut sim = start(&held);
    sim.run("a");
    sim.run_fatal("b");
    let tr = sim.run("a");
    assert_eq!((tr.job.round, tr.job.state), (2, JobState::Running));
    sim.run("a");
    let tr = sim.run_fatal("b");
    assert_eq!(tr.job.state, JobState::Blocked);
    assert_eq!(states(&tr.job), "a:succeeded b:failed");
    let reason = tr.job.blocked_reason.clone().unwrap_or_default();
    assert!(reason.contains("last round, 2 of 2"), "{reason}");
    assert!(kinds(&tr.events).contains(&"job_blocked".to_string()));
    // The operator retries the failed step: it runs again in round 2 and fails again: held.
    sim.retry("b");
    let tr = sim.run_fatal("b");
    assert_eq!((tr.job.state, tr.job.round), (JobState::Blocked, 2));
    // Retried again, it succeeds: the job succeeds in its last round.
    let mut succeeds = sim.clone();
    succeeds.retry("b");
    let tr = succeeds.run("b");
    assert_eq!((tr.job.state, tr.job.round), (JobState::Succeeded, 2));
    // Or the operator cancels: the round is undone, the job ends cancelled.
    let tr = sim.ok(Command::Cancel);
    assert_eq!(tr.job.state, JobState::Compensating);
    let tr = sim.run("a");
    assert_eq!(tr.job.state, JobState::Cancelled);
    assert_eq!(tr.job.compensated_steps(), ["a"]);

    // The default: the last round is undone too and the job fails.
    let mut failing = start(&whole_job(1));
    failing.run("a");
    failing.run_fatal("b");
    let tr = failing.run("a");
    assert_eq!((tr.job.state, tr.job.round), (JobState::Failed, 1));

    // `job_exhausted` only shapes a whole-job retry.
    let mut wrong = job(vec![step("a", "x", &[], 1)], Some(OnFailure::Hold));
    wrong.job_exhausted = Some(JobExhausted::Hold);
    let e = wrong
        .validate(&Limits::default())
        .expect_err("not a whole-job retry");
    assert_eq!(e.field, "job_exhausted");
}
