//! Tests of the job and step state machines.
//!
//! Every command goes through [`Sim`], which checks the transition against the contract (fencing,
//! `changed_steps`, `job_changed`, `updated_at`, events, effects) and the job's invariants after
//! it, and records each state edge taken. On top of that: one table per transition, a property
//! test over random DAGs and random command sequences, and a test that every edge of the mermaid
//! diagram in `machine.rs` is exercised and that no other edge ever occurs.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

use super::{admit, apply, Command, Effect, Rejection, Reply, Transition};
use crate::backoff::Backoff;
use crate::id::{JobId, LeaseId};
use crate::job::{DesiredState, Job, JobState, NewEvent, Step, StepState};
use crate::spec::{JobSpec, Limits, StepSpec};
use crate::time::{Span, Timestamp};

/// Where test time starts: 2026-01-01T00:00:00Z. Every `ms` argument below is an offset from it.
const T0: i64 = 1_767_225_600_000;
const TIMEOUT: Span = Span::from_secs(10);
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
    ("job", "running", "succeeded"),
    ("job", "running", "failed"),
    ("job", "running", "cancelled"),
    ("step", "[*]", "waiting"),
    ("step", "waiting", "ready"),
    ("step", "ready", "running"),
    ("step", "running", "running"),
    ("step", "running", "succeeded"),
    ("step", "running", "ready"),
    ("step", "running", "failed"),
    ("step", "running", "cancelled"),
    ("step", "waiting", "cancelled"),
    ("step", "ready", "cancelled"),
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
        max_attempts: Some(max_attempts),
        backoff: Some(BACKOFF),
        compensate: None,
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
        steps,
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

fn start(spec: &JobSpec) -> Sim {
    Sim::admit(spec, at(0)).0
}

fn ready(agent: &str) -> Effect {
    Effect::Ready {
        agent: agent.into(),
    }
}

/// Step states as `name:state` words, e.g. `"a:running b:waiting"`.
fn states(job: &Job) -> String {
    let words: Vec<String> = job
        .steps
        .iter()
        .map(|s| format!("{}:{}", s.name, s.state))
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

/// Brings a table case's job to the state the case is about.
type Setup = fn(&mut Sim);

/// A job under test with its clock. Every command is checked on the way (see `check_transition`
/// and `check_job`) and the state edges it takes are recorded.
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
        assert_eq!(tr.events.first().map(|e| e.kind), Some("job_submitted"));
        assert!(tr.events.iter().all(|e| e.at == now));
        assert_eq!(tr.job.updated_at, now);
        let changed: Vec<usize> = (0..fresh.steps.len())
            .filter(|&i| fresh.steps[i] != tr.job.steps[i])
            .collect();
        assert_eq!(tr.changed_steps, changed);
        check_job(&tr.job);
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
        (sim, tr)
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
            for (i, (b, a)) in self.job.steps.iter().zip(&tr.job.steps).enumerate() {
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
            self.history.extend(tr.events.iter().cloned());
            self.job = tr.job.clone();
            check_job(&self.job);
            for s in &self.job.steps {
                let leased = self
                    .history
                    .iter()
                    .filter(|e| {
                        e.kind == "step_leased" && e.step.as_deref() == Some(s.name.as_str())
                    })
                    .count();
                assert_eq!(
                    leased, s.attempt as usize,
                    "step_leased events of {}",
                    s.name
                );
            }
        }
        result
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

    fn heartbeat_cmd(&self, name: &str, attempt: u32) -> Command {
        Command::Heartbeat {
            step: self.idx(name),
            attempt,
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
            .expect("a running step has a lease");
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

    fn cancel(&mut self) -> Transition {
        self.ok(Command::Cancel)
    }
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
    assert!(job.updated_at >= job.created_at);
    let has = |st: StepState| job.steps.iter().any(|s| s.state == st);
    for s in &job.steps {
        let ctx = || format!("step {}: {} ({:?})", s.name, here(), s);
        if matches!(s.state, Running | Succeeded) {
            for d in &s.depends_on {
                let dep = &job.steps[job.step_index(d).expect("dependencies exist")];
                assert!(
                    dep.state.satisfies_dependants(),
                    "dependency {d} not done: {}",
                    ctx()
                );
            }
        }
        assert!(s.failures <= s.attempt, "failures > attempt: {}", ctx());
        assert_eq!(
            s.lease_expires_at.is_some(),
            s.state == Running,
            "lease: {}",
            ctx()
        );
        assert_eq!(
            s.finished_at.is_some(),
            s.state.is_settled(),
            "finished_at: {}",
            ctx()
        );
        match s.state {
            Waiting => assert_eq!(s.attempt, 0, "a waiting step never ran: {}", ctx()),
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
    }
    if job.state.is_terminal() {
        assert!(
            !has(Waiting) && !has(Ready),
            "a finished job has unstarted steps: {}",
            here()
        );
    }
    match job.state {
        JobState::Pending => {
            assert_eq!(job.desired_state, DesiredState::Succeeded, "{}", here());
            assert!(job.steps.iter().all(|s| s.state == Waiting), "{}", here());
        }
        JobState::Running if job.desired_state == DesiredState::Cancelled => {
            // Being cancelled: only running steps keep it from being cancelled.
            assert!(has(Running) && !has(Waiting) && !has(Ready), "{}", here());
        }
        JobState::Running => {
            assert!(!has(Failed) && !has(Cancelled), "{}", here());
            assert!(
                !job.steps.iter().all(|s| s.state.satisfies_dependants()),
                "{}",
                here()
            );
        }
        JobState::Succeeded => {
            assert!(
                job.steps.iter().all(|s| s.state.satisfies_dependants()),
                "{}",
                here()
            );
        }
        JobState::Failed => assert!(has(Failed), "{}", here()),
        JobState::Cancelled => {
            assert_eq!(job.desired_state, DesiredState::Cancelled, "{}", here());
            assert!(!has(Running), "{}", here());
        }
        other => panic!("the machine never enters {other}: {}", here()),
    }
}

/// Checks one command's outcome against the contract.
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
    let wants_work = before.desired_state == DesiredState::Succeeded && !before.state.is_terminal();
    let step_of = |i: usize| before.steps.get(i);
    // Whether the command is acceptable, as the contract states it.
    match command {
        Command::Activate => {
            let due = before.state == JobState::Pending && before.run_at.is_none_or(|t| t <= now);
            assert_eq!(result.is_ok(), due, "{here}");
            if !due {
                assert_eq!(result, &Err(Rejection::NotDue), "{here}");
            }
        }
        Command::Claim { step, .. } => {
            let claimable = before.state == JobState::Running
                && before.desired_state == DesiredState::Succeeded
                && step_of(*step).is_some_and(|s| {
                    s.state == StepState::Ready && s.next_attempt_at.is_none_or(|t| t <= now)
                });
            assert_eq!(result.is_ok(), claimable, "{here}");
        }
        Command::Heartbeat { step, attempt }
        | Command::Complete { step, attempt, .. }
        | Command::Fail { step, attempt, .. } => {
            // Fencing: only the current attempt, running, before its expiry, may report.
            let live = step_of(*step).is_some_and(|s| {
                s.attempt == *attempt
                    && s.state == StepState::Running
                    && s.lease_expires_at.is_some_and(|t| t > now)
            });
            assert_eq!(result.is_ok(), live, "{here}");
            if step_of(*step).is_some_and(|s| s.attempt != *attempt) {
                assert!(matches!(result, Err(Rejection::LeaseLost { .. })), "{here}");
            }
        }
        Command::Expire { step, attempt, .. } => {
            let expired = step_of(*step).is_some_and(|s| {
                s.attempt == *attempt
                    && s.state == StepState::Running
                    && s.lease_expires_at.is_some_and(|t| t <= now)
            });
            assert_eq!(result.is_ok(), expired, "{here}");
        }
        Command::Cancel => assert_eq!(result.is_err(), before.state.is_terminal(), "{here}"),
    }
    let Ok(tr) = result else { return };
    let after = &tr.job;
    match (command, &tr.reply) {
        (Command::Heartbeat { .. }, Reply::Heartbeat { cancel, .. }) => {
            assert_eq!(*cancel, !wants_work, "{here}")
        }
        (Command::Complete { .. }, Reply::Refused(Rejection::LeaseLost { .. })) => {
            assert!(!wants_work, "{here}")
        }
        (Command::Complete { .. }, Reply::Done) => assert!(wants_work, "{here}"),
        (Command::Heartbeat { .. } | Command::Complete { .. }, _) => panic!("wrong reply: {here}"),
        (_, reply) => assert_eq!(reply, &Reply::Done, "{here}"),
    }
    // Steps keep what was submitted; attempts grow by one on a claim and never otherwise.
    assert_eq!(after.steps.len(), before.steps.len(), "{here}");
    for (i, (b, a)) in before.steps.iter().zip(&after.steps).enumerate() {
        let claimed = matches!(command, Command::Claim { step, .. } if *step == i);
        assert_eq!(
            a.attempt,
            b.attempt + u32::from(claimed),
            "attempt of {}: {here}",
            a.name
        );
        assert!(
            a.failures == b.failures || a.failures == b.failures + 1,
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
    // changed_steps lists exactly the steps that differ.
    let changed: Vec<usize> = (0..before.steps.len())
        .filter(|&i| before.steps[i] != after.steps[i])
        .collect();
    assert_eq!(tr.changed_steps, changed, "changed_steps: {here}");
    // Of the job's own fields only these may change, and job_changed says whether they did.
    let fields_moved = after.state != before.state
        || after.desired_state != before.desired_state
        || after.finished_at != before.finished_at;
    assert_eq!(
        tr.job_changed,
        fields_moved || after.updated_at != before.updated_at,
        "{here}"
    );
    let mut rest = after.clone();
    rest.steps = before.steps.clone();
    rest.state = before.state;
    rest.desired_state = before.desired_state;
    rest.finished_at = before.finished_at;
    rest.updated_at = before.updated_at;
    assert_eq!(
        &rest, before,
        "a job field changed that never should: {here}"
    );
    // updated_at moves exactly when the job records something.
    let moved = fields_moved || !tr.events.is_empty();
    assert_eq!(
        after.updated_at,
        if moved { now } else { before.updated_at },
        "updated_at: {here}"
    );
    // Events happen now, name real steps, and every state change has one.
    for e in &tr.events {
        assert_eq!(e.at, now, "{here}");
        if let Some(name) = &e.step {
            assert!(after.step_index(name).is_some(), "{here}");
        }
    }
    for &i in &changed {
        let name = after.steps[i].name.as_str();
        if after.steps[i].state != before.steps[i].state {
            assert!(
                tr.events.iter().any(|e| e.step.as_deref() == Some(name)),
                "no event for {name}: {here}"
            );
        }
    }
    if after.state != before.state {
        assert!(
            tr.events.iter().any(|e| e.kind.starts_with("job_")),
            "{here}"
        );
    }
    if tr.is_noop() {
        assert_eq!(after, before, "{here}");
    }
    // Effects: Finished exactly when the job finishes now; every step that became ready wakes
    // its agent (now, or at its next attempt), and nothing else does.
    let finished: Vec<&Effect> = tr
        .effects
        .iter()
        .filter(|e| matches!(e, Effect::Finished { .. }))
        .collect();
    if after.state.is_terminal() && !before.state.is_terminal() {
        assert_eq!(
            finished,
            [&Effect::Finished { state: after.state }],
            "{here}"
        );
    } else {
        assert!(finished.is_empty(), "{here}");
    }
    let mut expected = Vec::new();
    for (b, a) in before.steps.iter().zip(&after.steps) {
        if a.state == StepState::Ready && b.state != StepState::Ready {
            let due = a.next_attempt_at.expect("a ready step has a next attempt");
            let effect = if due <= now {
                ready(&a.agent)
            } else {
                Effect::ReadyAt {
                    agent: a.agent.clone(),
                    at: due,
                }
            };
            if !expected.contains(&effect) {
                expected.push(effect);
            }
        }
    }
    let wakes: Vec<Effect> = tr
        .effects
        .iter()
        .filter(|e| !matches!(e, Effect::Finished { .. }))
        .cloned()
        .collect();
    let mut sorted_wakes = wakes.clone();
    sorted_wakes.sort_by_key(|e| format!("{e:?}"));
    expected.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(sorted_wakes, expected, "wake effects: {here}");
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
            run_at.map(|ms| json!({ "run_at": at(ms) })),
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
            attempt: 1
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
        assert_eq!(
            tr.effects,
            [Effect::ReadyAt {
                agent: "x".into(),
                at: next
            }]
        );
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

// Proves a permanent failure (retryable on the last attempt, or fatal) fails the step and the
// job, cancels waiting and ready siblings, and leaves a running sibling running: its heartbeat
// says cancel, and its late report (complete is refused) or expiry settles it to cancelled.
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
                "job_failed".into(),
                "step_cancelled c".into(),
                "step_cancelled d".into(),
            ];
            assert_eq!(kinds(&tr.events), expected, "{what}");
            assert_eq!(
                tr.events[0].detail,
                Some(json!({ "error": "boom", "reason": reason })),
                "{what}"
            );
            assert_eq!(tr.events[1].detail, Some(json!({ "step": "a" })), "{what}");
            assert_eq!(
                tr.effects,
                [Effect::Finished {
                    state: JobState::Failed
                }],
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
        "job_failed",
        "step_cancelled b",
        "step_cancelled c",
        "step_cancelled d",
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
                tr.effects,
                [Effect::Finished {
                    state: JobState::Failed
                }]
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

impl Sim {
    /// A claim command with a fresh lease id, without needing `&mut` (for tables).
    fn claim_cmd_peek(&self, step: usize) -> Command {
        Command::Claim {
            step,
            lease_id: LeaseId(Uuid::from_u128(u128::MAX - step as u128)),
            worker: "w2".into(),
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

// Proves the hard-coded edge list is exactly the diagram drawn in machine.rs.
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

/// One step of a random DAG: dependencies on earlier steps (by flag), attempts, agent, timeout.
#[derive(Clone, Debug)]
struct RandomStep {
    deps: Vec<bool>,
    max_attempts: u32,
    agent: bool,
    timeout_ms: u64,
}

/// A command in the abstract: `pick` chooses among the steps it makes sense for (running steps
/// for reports, ready ones for claims, any step if there are none), `skew` shifts the attempt
/// reported away from the current one, `when_due` first moves the clock to the step's due time.
#[derive(Clone, Debug)]
enum Op {
    Activate,
    Cancel,
    Claim {
        pick: usize,
        when_due: bool,
    },
    Heartbeat {
        pick: usize,
        skew: i64,
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
}

#[derive(Clone, Debug)]
struct Plan {
    steps: Vec<RandomStep>,
    run_at_ms: Option<i64>,
    /// Milliseconds to move the clock forward, then the command.
    ops: Vec<(u64, Op)>,
}

fn plan() -> impl Strategy<Value = Plan> {
    let random_step = (
        prop::collection::vec(any::<bool>(), 8),
        0u32..=3,
        any::<bool>(),
        1u64..=5,
    )
        .prop_map(|(deps, max_attempts, agent, secs)| RandomStep {
            deps,
            max_attempts,
            agent,
            timeout_ms: secs * 1_000,
        });
    let pick = 0usize..8;
    let skew = prop_oneof![6 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64), 1 => Just(2i64)];
    let op = prop_oneof![
        2 => Just(Op::Activate),
        1 => Just(Op::Cancel),
        12 => (pick.clone(), any::<bool>()).prop_map(|(pick, when_due)| Op::Claim { pick, when_due }),
        4 => (pick.clone(), skew.clone()).prop_map(|(pick, skew)| Op::Heartbeat { pick, skew }),
        10 => (pick.clone(), skew.clone()).prop_map(|(pick, skew)| Op::Complete { pick, skew }),
        5 => (pick.clone(), skew.clone(), prop::bool::weighted(0.75), 0.0..1.0f64)
            .prop_map(|(pick, skew, retryable, jitter)| Op::Fail { pick, skew, retryable, jitter }),
        4 => (pick, skew, any::<bool>(), 0.0..1.0f64)
            .prop_map(|(pick, skew, when_due, jitter)| Op::Expire { pick, skew, when_due, jitter }),
    ];
    let advance = prop_oneof![3 => Just(0u64), 4 => 1u64..1_500, 1 => 1_500u64..12_000];
    (
        prop::collection::vec(random_step, 1..=8),
        prop::option::of(0i64..4_000),
        prop::collection::vec((advance, op), 0..60),
    )
        .prop_map(|(steps, run_at_ms, ops)| Plan {
            steps,
            run_at_ms,
            ops,
        })
}

impl Sim {
    /// Turns an abstract op into a command on the current job, moving the clock if it asks.
    fn command_for(&mut self, op: &Op) -> Command {
        let pick_in = |job: &Job, pick: usize, state: StepState| {
            let fitting: Vec<usize> = (0..job.steps.len())
                .filter(|&i| job.steps[i].state == state)
                .collect();
            if fitting.is_empty() {
                pick % job.steps.len()
            } else {
                fitting[pick % fitting.len()]
            }
        };
        let attempt = |job: &Job, step: usize, skew: i64| {
            (i64::from(job.steps[step].attempt) + skew).max(0) as u32
        };
        match *op {
            Op::Activate => Command::Activate,
            Op::Cancel => Command::Cancel,
            Op::Claim { pick, when_due } => {
                let step = pick_in(&self.job, pick, StepState::Ready);
                if let (true, Some(due)) = (when_due, self.job.steps[step].next_attempt_at) {
                    self.now = self.now.max(due);
                }
                self.claim_cmd(step)
            }
            Op::Heartbeat { pick, skew } => {
                let step = pick_in(&self.job, pick, StepState::Running);
                Command::Heartbeat {
                    step,
                    attempt: attempt(&self.job, step, skew),
                }
            }
            Op::Complete { pick, skew } => {
                let step = pick_in(&self.job, pick, StepState::Running);
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
                let step = pick_in(&self.job, pick, StepState::Running);
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
                let step = pick_in(&self.job, pick, StepState::Running);
                if let (true, Some(expiry)) = (when_due, self.job.steps[step].lease_expires_at) {
                    self.now = self.now.max(expiry);
                }
                Command::Expire {
                    step,
                    attempt: attempt(&self.job, step, skew),
                    jitter,
                }
            }
        }
    }

    /// Drives the job to its end as a healthy fleet would (activate when due, claim when due,
    /// complete live leases, expire dead ones) and checks that it ends with every step settled.
    fn drain(&mut self) -> Vec<Result<Transition, Rejection>> {
        let mut out = Vec::new();
        for _ in 0..100 {
            let job = &self.job;
            let running = job.steps.iter().position(|s| s.state == StepState::Running);
            let ready = job.steps.iter().position(|s| s.state == StepState::Ready);
            let command = if job.state == JobState::Pending {
                if let Some(t) = job.run_at {
                    self.now = self.now.max(t);
                }
                Command::Activate
            } else if let Some(i) = running {
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
            } else if let Some(i) = ready {
                if let Some(due) = job.steps[i].next_attempt_at {
                    self.now = self.now.max(due);
                }
                self.claim_cmd(i)
            } else {
                break;
            };
            let shown = format!("{command:?}");
            let result = self.send(command);
            assert!(result.is_ok(), "draining: {shown} was rejected: {result:?}");
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
                max_attempts: Some(r.max_attempts),
                backoff: Some(Backoff {
                    initial: Span::from_millis(500),
                    factor: 2.0,
                    max: Span::from_secs(4),
                }),
                compensate: None,
            }
        })
        .collect();
    let job_spec = spec(steps, plan.run_at_ms.map(at));
    job_spec
        .validate(&Limits::default())
        .expect("generated specs are valid");
    let (mut sim, first) = Sim::admit(&job_spec, at(0));
    let mut outcomes = vec![Ok(first)];
    for (advance, op) in &plan.ops {
        sim.now = sim.now.plus(Span::from_millis(*advance));
        let command = sim.command_for(op);
        outcomes.push(sim.send(command));
    }
    outcomes.extend(sim.drain());
    (outcomes, sim)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // Proves, for random DAGs and random command sequences (right and wrong attempts, moving
    // time, cancels), that every transition obeys the contract and leaves the job consistent
    // (checked by `Sim` after each command), that only diagram edges are taken, that every job
    // can still be driven to an end with all its steps settled, and that a replay of the same
    // sequence gives identical transitions. Proptest prints the minimal failing plan.
    #[test]
    fn random_commands_keep_the_invariants(plan in plan()) {
        let (first, sim) = run(&plan);
        prop_assert!(sim.edges.iter().all(|e| DIAGRAM_EDGES.contains(e)));
        let (second, _) = run(&plan);
        prop_assert_eq!(first, second);
    }
}
