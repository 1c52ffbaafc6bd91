//! Tests of what a rerun keeps and what it copies. The rerun's passage through the state machine
//! (admission, link, and that a kept step never runs again) is tested with the machine's
//! scenarios in `machine/tests/rerun.rs`.

use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

use super::*;
use crate::spec::{decode, JobSpec, Limits};
use crate::Span;

const OLD: JobId = JobId(Uuid::from_u128(1));
const NEW: JobId = JobId(Uuid::from_u128(2));
const T0: Timestamp = Timestamp(1_767_225_600_000);

fn at(ms: i64) -> Timestamp {
    Timestamp(T0.0 + ms)
}

/// A job of `steps` (name, dependencies) as submitted at `T0`, its steps in `states`, finished
/// `state`.
fn job_in(steps: &[(&str, &[&str])], states: &[StepState], state: JobState) -> Job {
    let specs: Vec<serde_json::Value> = steps
        .iter()
        .map(|(name, deps)| json!({"name": name, "agent": "x", "depends_on": deps}))
        .collect();
    let spec: JobSpec = decode(json!({"steps": specs})).expect("spec decodes");
    spec.validate(&Limits::default()).expect("spec is valid");
    let mut job = Job::from_spec(OLD, &spec, T0);
    for (s, &st) in job.steps.iter_mut().zip(states) {
        s.state = st;
        if st == StepState::Succeeded {
            s.result = Some(json!({ "of": s.name }));
        }
    }
    job.state = state;
    job.finished_at = Some(at(1_000));
    job
}

fn kept(plan: &Plan) -> Vec<usize> {
    plan.kept().collect()
}

/// a → b → c, and d alone.
const CHAIN: &[(&str, &[&str])] = &[("a", &[]), ("b", &["a"]), ("c", &["b"]), ("d", &[])];

// Proves a plain rerun keeps nothing, and a rerun from failure keeps the succeeded steps whose
// dependencies are kept: a succeeded step after a failed one runs again, and so does anything
// after a skipped, cancelled or compensated step.
#[test]
fn plan_keeps_succeeded_steps_with_kept_dependencies() {
    use StepState::*;
    let job = job_in(
        CHAIN,
        &[Succeeded, Failed, Cancelled, Succeeded],
        JobState::Failed,
    );
    assert_eq!(kept(&plan(&job, false)), Vec::<usize>::new());
    assert_eq!(kept(&plan(&job, true)), vec![0, 3]);
    // b succeeded only because an operator skipped a; c after it must run again too.
    let job = job_in(
        CHAIN,
        &[Skipped, Succeeded, Succeeded, Compensated],
        JobState::Failed,
    );
    assert_eq!(kept(&plan(&job, true)), Vec::<usize>::new());
    let job = job_in(
        CHAIN,
        &[Succeeded, Succeeded, Failed, Succeeded],
        JobState::Cancelled,
    );
    let p = plan(&job, true);
    assert_eq!(kept(&p), vec![0, 1, 3]);
    assert!(p.is_kept(1) && !p.is_kept(2) && !p.is_kept(99));
}

// Proves a step listed before its dependency (names, not positions, order a DAG) is judged by
// that dependency all the same.
#[test]
fn plan_follows_dependencies_in_any_order() {
    use StepState::*;
    let steps: &[(&str, &[&str])] = &[("late", &["mid"]), ("mid", &["first"]), ("first", &[])];
    let job = job_in(steps, &[Succeeded, Succeeded, Failed], JobState::Failed);
    assert_eq!(kept(&plan(&job, true)), Vec::<usize>::new());
    let job = job_in(steps, &[Failed, Succeeded, Succeeded], JobState::Failed);
    assert_eq!(kept(&plan(&job, true)), vec![1, 2]);
}

// Proves only a failed or cancelled job may be rerun, once, and not while a step still runs.
#[test]
fn check_refuses_what_cannot_be_rerun() {
    use StepState::*;
    for state in [
        JobState::Pending,
        JobState::Running,
        JobState::Blocked,
        JobState::Compensating,
        JobState::Succeeded,
    ] {
        let job = job_in(CHAIN, &[Succeeded, Failed, Cancelled, Succeeded], state);
        let refused = check(&job).expect_err("refused");
        assert!(
            matches!(&refused, Rejection::NotAllowed { reason } if reason.contains("only a failed or cancelled job")),
            "{state}: {refused:?}"
        );
    }
    let mut job = job_in(
        CHAIN,
        &[Succeeded, Failed, Cancelled, Running],
        JobState::Failed,
    );
    job.steps[3].lease_expires_at = Some(at(5_000));
    let refused = check(&job).expect_err("a step still runs");
    assert!(
        matches!(&refused, Rejection::NotAllowed { reason } if reason.contains("step `d` still runs")),
        "{refused:?}"
    );
    job.steps[3].state = Cancelled;
    assert_eq!(check(&job), Ok(()));
    job.rerun_by = Some(NEW);
    assert_eq!(check(&job), Err(Rejection::AlreadyRerun { by: NEW }));
}

// Proves the new job copies the definition, not the run: no idempotency key, no run_at, the
// caller as submitter, a link to the old job, the same time budget for a job deadline, and
// every step in its first state with the same definition.
#[test]
fn fresh_copies_the_definition_and_not_the_run() {
    let spec: JobSpec = decode(json!({
            "idempotency_key": "order-7",
            "labels": {"team": "shop"},
            "priority": 4,
            "run_at": "2026-01-01T00:00:00Z",
            "ordering_key": "cart-7",
            "callback_url": "https://example.com/done",
            "on_failure": "compensate",
            "retention": "2d",
            "deadline": "10m",
            "steps": [
                {"name": "a", "agent": "x", "payload": {"n": 1}, "timeout": "5s", "deadline": "9s",
                 "max_attempts": 2, "progress_events": true,
                 "compensate": {"agent": "u", "payload": {"undo": 1}}},
                {"name": "b", "agent": "y", "depends_on": ["a"]}
            ]
    }))
    .expect("spec decodes");
    let mut old = Job::from_spec(OLD, &spec, T0);
    old.submitted_by = Some("first".into());
    old.state = JobState::Failed;
    old.steps[0].state = StepState::Succeeded;
    old.steps[0].attempt = 3;
    old.steps[0].result = Some(json!(1));
    old.steps[0].progress = Some(json!("half"));
    let now = at(3_600_000);
    let new = fresh(&old, NEW, Some("second".into()), now);
    assert_eq!(new.id, NEW);
    assert_eq!(new.idempotency_key, None);
    assert_eq!(new.run_at, None);
    assert_eq!(new.submitted_by.as_deref(), Some("second"));
    assert_eq!((new.rerun_of, new.rerun_by), (Some(OLD), None));
    assert_eq!(new.deadline, Some(now.plus(Span::from_secs(600))));
    assert_eq!((new.state, new.round), (JobState::Pending, 1));
    assert_eq!((new.created_at, new.updated_at), (now, now));
    assert_eq!(
        (
            &new.labels,
            new.priority,
            &new.ordering_key,
            &new.callback_url,
            new.on_failure,
            new.retention,
            new.retry
        ),
        (
            &old.labels,
            old.priority,
            &old.ordering_key,
            &old.callback_url,
            old.on_failure,
            old.retention,
            old.retry
        )
    );
    let first_state = Job::from_spec(NEW, &spec, now);
    for (a, b) in new.steps.iter().zip(&first_state.steps) {
        assert_eq!(a, b, "step {} is its first state", a.name);
    }
}

/// A random finished job: a DAG of up to 8 steps (each may depend on earlier ones) whose steps
/// are in random settled states.
fn random_job() -> impl Strategy<Value = Job> {
    let step = (
        prop::collection::vec(any::<bool>(), 8),
        prop_oneof![
            4 => Just(StepState::Succeeded),
            2 => Just(StepState::Failed),
            1 => Just(StepState::Cancelled),
            1 => Just(StepState::Skipped),
            1 => Just(StepState::Compensated),
        ],
    );
    (prop::collection::vec(step, 1..=8), any::<bool>()).prop_map(|(steps, reversed)| {
        let n = steps.len();
        // Names in reverse order of position now and then: dependencies then come later.
        let name = |i: usize| {
            if reversed {
                format!("s{}", n - i)
            } else {
                format!("s{i}")
            }
        };
        let names: Vec<String> = (0..n).map(name).collect();
        let deps: Vec<Vec<&str>> = steps
            .iter()
            .enumerate()
            .map(|(i, (d, _))| {
                (0..i)
                    .filter(|&j| d[j])
                    .map(|j| names[j].as_str())
                    .collect()
            })
            .collect();
        let mut shape: Vec<(&str, &[&str])> = names
            .iter()
            .zip(&deps)
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let mut states: Vec<StepState> = steps.iter().map(|(_, st)| *st).collect();
        if reversed {
            shape.reverse();
            states.reverse();
        }
        job_in(&shape, &states, JobState::Failed)
    })
}

/// Every step that depends on step `i`, directly or not.
fn dependants(job: &Job, i: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut stack = vec![i];
    while let Some(x) = stack.pop() {
        for (j, s) in job.steps.iter().enumerate() {
            if !out.contains(&j) && s.depends_on.contains(&job.steps[x].name) {
                out.push(j);
                stack.push(j);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // Proves, for random DAGs in random finished states, what the kept set is: only succeeded
    // steps are kept (so a kept step is never run again), every dependant of a step that runs
    // again runs again too, every succeeded step whose dependencies are all kept is kept, a
    // plain rerun keeps nothing, and the same job always gives the same plan.
    #[test]
    fn plan_keeps_exactly_the_settled_prefix(job in random_job()) {
        let p = plan(&job, true);
        prop_assert!(kept(&plan(&job, false)).is_empty());
        prop_assert_eq!(&p, &plan(&job, true));
        for (i, s) in job.steps.iter().enumerate() {
            if p.is_kept(i) {
                prop_assert_eq!(s.state, StepState::Succeeded);
            } else {
                for j in dependants(&job, i) {
                    prop_assert!(!p.is_kept(j), "{} runs again, but its dependant {} is kept", s.name, job.steps[j].name);
                }
            }
            let deps_kept = s.depends_on.iter().all(|d| job.step_index(d).is_some_and(|j| p.is_kept(j)));
            if s.state == StepState::Succeeded && deps_kept {
                prop_assert!(p.is_kept(i), "{} succeeded after kept dependencies, yet runs again", s.name);
            }
        }
    }
}
