//! Reruns through the state machine: the old job's link, the new job's admission with its kept
//! steps, and (property) that a rerun never runs a kept step again, whatever happens to it.

use super::*;
use crate::rerun::{self, Options, Rerun};

/// The id every rerun here gets.
const NEW: JobId = JobId(Uuid::from_u128(2));

fn options(from_failed: bool) -> Options {
    Options {
        from_failed,
        by: Some("ops".into()),
        reason: Some("fixed the cause".into()),
    }
}

impl Sim {
    /// Reruns the sim's finished job as job [`NEW`] at the sim's time, checks what the rerun
    /// wrote, and answers a `Sim` of the new job.
    fn rerun(&self, from_failed: bool) -> (Sim, Rerun) {
        let old = &self.job;
        let r = rerun::rerun(old, NEW, &options(from_failed), Some("me".into()), self.now)
            .expect("the rerun is allowed");
        check_rerun(old, &r, from_failed, self.now);
        let fresh = rerun::fresh(old, NEW, Some("me".into()), self.now);
        let sim = Sim::admitted(&fresh, &r.admission, self.now);
        (sim, r)
    }
}

/// What a rerun wrote: the old job changed only by its link, the new one admitted with exactly
/// the planned steps kept, on their old results.
fn check_rerun(old: &Job, r: &Rerun, from_failed: bool, now: Timestamp) {
    let link = &r.link;
    assert_eq!(link.job.rerun_by, Some(NEW));
    assert!(link.job_changed && link.changed_steps.is_empty() && link.effects.is_empty());
    assert_eq!(kinds(&link.events), ["job_rerun"]);
    let mut unlinked = link.job.clone();
    unlinked.rerun_by = None;
    unlinked.updated_at = old.updated_at;
    assert_eq!(&unlinked, old, "the link changes nothing else");
    assert_eq!(
        rerun::rerun(
            &link.job,
            JobId(Uuid::from_u128(3)),
            &options(true),
            None,
            now
        )
        .err(),
        Some(Rejection::AlreadyRerun { by: NEW }),
        "a job is rerun once"
    );
    let job = &r.admission.job;
    assert_eq!(
        (job.id, job.rerun_of, job.rerun_by),
        (NEW, Some(old.id), None)
    );
    assert_eq!(job.idempotency_key, None);
    assert_eq!(job.submitted_by.as_deref(), Some("me"));
    assert_eq!((job.round, job.created_at), (1, now));
    let mut kept_events = Vec::new();
    for e in &r.admission.events {
        if e.kind == EventKind::StepKept {
            kept_events.push(e.step.clone().unwrap_or_default());
        }
    }
    let mut kept_names = Vec::new();
    for (i, (a, b)) in job.steps.iter().zip(&old.steps).enumerate() {
        assert_eq!(
            (&a.name, &a.agent, &a.payload, &a.depends_on, a.timeout),
            (&b.name, &b.agent, &b.payload, &b.depends_on, b.timeout)
        );
        assert_eq!(
            (a.max_attempts, &a.compensate, a.deadline),
            (b.max_attempts, &b.compensate, b.deadline)
        );
        assert_eq!(a.attempt, 0, "nothing of the new job ran yet");
        if r.plan.is_kept(i) {
            assert!(from_failed);
            assert_eq!(b.state, StepState::Succeeded);
            assert_eq!((a.state, &a.result), (StepState::Succeeded, &b.result));
            kept_names.push(a.name.clone());
        } else {
            assert_ne!(a.state, StepState::Succeeded, "step {} runs again", a.name);
            assert_eq!(a.result, None);
        }
    }
    assert_eq!(kept_events, kept_names);
    let submitted = &r.admission.events[0];
    assert_eq!(submitted.kind, EventKind::JobSubmitted);
    let detail = submitted.detail.clone().unwrap_or(Value::Null);
    assert_eq!(detail["rerun_of"], json!(old.id));
    assert_eq!(detail["kept"], json!(kept_names));
    assert_eq!(detail["from_failed"], json!(from_failed));
}

/// a → b: b fails for good (`fail`), so the job fails with a done.
fn failed_chain() -> Sim {
    let mut sim = start(&job(
        vec![step("a", "x", &[], 1), step("b", "x", &["a"], 1)],
        Some(OnFailure::Fail),
    ));
    sim.run("a");
    sim.run_fatal("b");
    assert_eq!(sim.job.state, JobState::Failed);
    sim
}

/// A rerun from failure of [`failed_chain`], driven to success: `a` kept, `b` run again.
pub(super) fn kept_scenario() -> Sim {
    let old = failed_chain();
    let (mut sim, _) = old.rerun(true);
    sim.run("b");
    assert_eq!(sim.job.state, JobState::Succeeded);
    sim
}

// Proves a rerun from failure keeps the step that succeeded: it starts succeeded on its old
// result, is never claimable, its dependant is ready at once and gets that result as input, and
// the job succeeds once the dependant does; the old job is linked, and a second rerun refused.
#[test]
fn rerun_from_failure_keeps_what_succeeded() {
    let old = failed_chain();
    let (mut sim, r) = old.rerun(true);
    assert_eq!(r.admission.job.state, JobState::Running);
    assert_eq!(states(&sim.job), "a:succeeded b:ready");
    assert_eq!(
        kinds(&r.admission.events),
        [
            "job_submitted",
            "step_kept a",
            "job_started",
            "step_ready b"
        ]
    );
    assert_eq!(r.admission.effects, vec![ready("x")]);
    assert_eq!(
        sim.job.inputs_of(1)["a"],
        old.job.steps[0].result.clone().unwrap()
    );
    let claim_a = sim.claim_cmd_peek(0);
    assert_eq!(sim.send(claim_a), Err(Rejection::NotClaimable));
    sim.run("b");
    assert_eq!(sim.job.state, JobState::Succeeded);
    assert!(sim
        .history
        .iter()
        .all(|e| !(e.kind == EventKind::StepLeased && e.step.as_deref() == Some("a"))));
}

// Proves a plain rerun runs every step again, and that a rerun of a cancelled job works the
// same way.
#[test]
fn plain_rerun_runs_everything() {
    let old = failed_chain();
    let (mut sim, r) = old.rerun(false);
    assert_eq!(r.plan.kept().count(), 0);
    assert_eq!(states(&sim.job), "a:ready b:waiting");
    sim.run("a");
    sim.run("b");
    assert_eq!(sim.job.state, JobState::Succeeded);
    let mut cancelled = start(&job(
        vec![step("a", "x", &[], 1), step("b", "x", &["a"], 1)],
        None,
    ));
    cancelled.run("a");
    cancelled.cancel();
    assert_eq!(cancelled.job.state, JobState::Cancelled);
    let (sim, r) = cancelled.rerun(true);
    assert_eq!(kinds(&r.admission.events)[1], "step_kept a");
    assert_eq!(sim.job.rerun_of, Some(cancelled.job.id));
}

// Proves a keyed rerun waits for its key like any keyed job, with its kept steps done already,
// and that a kept step with an undo is undone if the rerun unwinds.
#[test]
fn kept_steps_wait_with_a_keyed_rerun_and_are_undone_on_unwind() {
    let mut spec = job(
        vec![undoable("a", "x", &[], 1), step("b", "x", &["a"], 1)],
        Some(OnFailure::Compensate),
    );
    spec.ordering_key = Some("k".into());
    let mut old = start(&spec);
    old.ok(Command::Activate);
    old.run("a");
    old.run_fatal("b");
    old.claim("a");
    old.complete("a");
    assert_eq!(old.job.state, JobState::Failed);
    // a was undone: nothing is kept.
    let (_, r) = old.rerun(true);
    assert_eq!(r.plan.kept().count(), 0);

    let mut spec = job(
        vec![undoable("a", "x", &[], 1), step("b", "x", &["a"], 1)],
        Some(OnFailure::Fail),
    );
    spec.ordering_key = Some("k".into());
    let mut old = start(&spec);
    old.ok(Command::Activate);
    old.run("a");
    old.run_fatal("b");
    let (mut sim, r) = old.rerun(true);
    assert_eq!(r.admission.job.state, JobState::Pending);
    assert_eq!(states(&sim.job), "a:succeeded b:waiting");
    sim.ok(Command::Activate);
    assert_eq!(states(&sim.job), "a:succeeded b:ready");
    sim.ok(Command::Cancel);
    assert_eq!(sim.job.state, JobState::Compensating);
    assert_eq!(sim.step("a").comp_phase, Some(CompPhase::Ready));
    let undo = sim.claim("a");
    assert_eq!(
        undo.job.inputs_of(0)["a"],
        old.job.steps[0].result.clone().unwrap()
    );
    sim.complete("a");
    assert_eq!(sim.job.state, JobState::Cancelled);
    assert_eq!(sim.job.compensated_steps(), ["a"]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // Proves, for random jobs driven to their end by random commands, that a failed or
    // cancelled job's rerun (from failure or not) is written as planned (`check_rerun`), and
    // that driving the rerun through other random commands and a drain never leases a kept
    // step's work in its first round (a whole-job retry's later rounds start every step over,
    // kept steps included, once they were undone); a job in any other state is refused.
    #[test]
    fn a_rerun_never_runs_a_kept_step_again(
        first in plan(),
        second in plan(),
        from_failed in any::<bool>(),
    ) {
        let (_, old) = run(&first);
        if !matches!(old.job.state, JobState::Failed | JobState::Cancelled) {
            let refused = rerun::rerun(&old.job, NEW, &options(from_failed), None, old.now);
            prop_assert!(matches!(refused, Err(Rejection::NotAllowed { .. })), "{refused:?}");
            return Ok(());
        }
        let (mut sim, r) = old.rerun(from_failed);
        let kept: Vec<String> = r.plan.kept().map(|i| old.job.steps[i].name.clone()).collect();
        for (advance, op) in &second.ops {
            sim.advance(*advance);
            let command = sim.command_for(op);
            let _ = sim.send(command);
        }
        sim.drain(second.drain_by_skip);
        let first_round = sim
            .history
            .iter()
            .position(|e| e.kind == EventKind::JobRoundStarted)
            .unwrap_or(sim.history.len());
        for e in &sim.history[..first_round] {
            let step = e.step.clone().unwrap_or_default();
            prop_assert!(
                !(e.kind == EventKind::StepLeased && kept.contains(&step)),
                "kept step {step} was leased again (event {:?})", e
            );
        }
    }
}
