//! Progress reported with heartbeats: kept on the step, fenced, cleared by a new lease, and
//! recorded in the history only when the step asks for it.

use super::*;

fn beat(sim: &Sim, name: &str, attempt: u32, progress: Value) -> Command {
    Command::Heartbeat {
        step: sim.idx(name),
        attempt,
        progress: Some(progress),
    }
}

// Proves progress is kept with its time whether or not it is recorded, that a step without
// `progress_events` records nothing, and that one with it records each new value once (a
// repeat of the same value is kept, not recorded).
#[test]
fn progress_is_kept_and_recorded_only_when_asked() {
    let quiet = step("a", "x", &[], 3);
    let chatty = StepSpec {
        progress_events: Some(true),
        ..step("b", "x", &[], 3)
    };
    let mut sim = start(&spec(vec![quiet, chatty], None));
    sim.claim("a");
    sim.claim("b");
    sim.advance(1_000);
    let tr = sim.ok(beat(&sim, "a", 1, json!({"pct": 10})));
    assert!(tr.events.is_empty());
    assert_eq!(sim.step("a").progress, Some(json!({"pct": 10})));
    assert_eq!(sim.step("a").progress_at, Some(at(1_000)));
    let tr = sim.ok(beat(&sim, "b", 1, json!({"pct": 10})));
    assert_eq!(kinds(&tr.events), ["step_progress b#1"]);
    assert_eq!(
        detail(&tr, EventKind::StepProgress),
        Some(json!({"progress": {"pct": 10}}))
    );
    sim.advance(1_000);
    let tr = sim.ok(beat(&sim, "b", 1, json!({"pct": 10})));
    assert!(tr.events.is_empty(), "the same value again is not recorded");
    assert_eq!(sim.step("b").progress_at, Some(at(2_000)));
    let tr = sim.ok(beat(&sim, "b", 1, json!({"pct": 50})));
    assert_eq!(kinds(&tr.events), ["step_progress b#1"]);
    // A heartbeat without progress leaves it as it is.
    sim.advance(500);
    sim.heartbeat("b");
    assert_eq!(sim.step("b").progress, Some(json!({"pct": 50})));
    assert_eq!(sim.step("b").progress_at, Some(at(2_000)));
}

// Proves progress is fenced like the heartbeat carrying it (a stale attempt's is refused and
// changes nothing), stays on the step after the attempt fails, and is cleared by the next
// lease.
#[test]
fn progress_is_fenced_and_cleared_by_a_new_lease() {
    let mut sim = start(&spec(vec![step("a", "x", &[], 3)], None));
    sim.claim("a");
    sim.ok(beat(&sim, "a", 1, json!("first try")));
    sim.fail("a", true);
    assert_eq!(sim.step("a").progress, Some(json!("first try")));
    sim.claim_when_due("a");
    assert_eq!(
        (&sim.step("a").progress, sim.step("a").progress_at),
        (&None, None)
    );
    let before = sim.job.clone();
    let stale = beat(&sim, "a", 1, json!("late"));
    assert!(matches!(sim.send(stale), Err(Rejection::LeaseLost { .. })));
    assert_eq!(sim.job, before);
    sim.ok(beat(&sim, "a", 2, json!("second try")));
    sim.complete("a");
    assert_eq!(sim.step("a").progress, Some(json!("second try")));
}

// Proves an undo's progress is kept too, and recorded as `compensation_progress` when asked.
#[test]
fn undo_progress_is_recorded_as_compensation_progress() {
    let a = StepSpec {
        progress_events: Some(true),
        ..undoable("a", "x", &[], 2)
    };
    let mut sim = start(&job(
        vec![a, step("b", "x", &["a"], 1)],
        Some(OnFailure::Compensate),
    ));
    sim.run("a");
    sim.run_fatal("b");
    sim.claim("a");
    let attempt = sim.attempt("a");
    let tr = sim.ok(beat(&sim, "a", attempt, json!({"refunded": 3})));
    assert_eq!(
        kinds(&tr.events),
        [format!("compensation_progress a#{attempt}")]
    );
}
