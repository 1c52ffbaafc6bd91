//! Fault injection for crash tests: cargo feature `fault-injection`, never in a default build.
//!
//! With the feature compiled in, opening a store while `OVERSEER_FAULT=crash-after-step-result`
//! simulates a process killed between committing a step's result and advancing its job. A
//! `job_apply` of `Command::Complete` for a step's *work* (not an undo) whose result the core
//! accepts writes only that step's own row, as the core's transition has it (succeeded, with its
//! result): not the job row, not the dependants it made ready, not the events, not the
//! deliveries. The writer commits that batch and calls `std::process::abort()` as soon as the
//! commit returns, before any caller of the batch is answered. After a restart the job is left
//! inconsistent (a succeeded step whose dependants still wait, or a running job whose steps are
//! all done) until the supervisor's repair scan heals it with `Command::Repair`.
//!
//! The partial write ([`write_step_result_only`]) is kept apart from the abort
//! ([`abort_if_raised`]), so it can be tested in a process that must not die: it is compiled for
//! this crate's unit tests too, while everything that reads the environment or aborts exists
//! only with the feature.

use overseer_core::{Command, Job, StepState, Timestamp, Transition};
use rusqlite::Connection;

use crate::Result;

/// If `command` completes a step's work and the core accepts the result, writes that step's row
/// alone, as the transition has it, and answers the transition. Anything else writes nothing and
/// answers `None`, so the caller applies the command normally.
pub(super) fn write_step_result_only(
    conn: &Connection,
    job: &Job,
    command: &Command,
    now: Timestamp,
) -> Result<Option<Transition>> {
    let Command::Complete { step, .. } = command else {
        return Ok(None);
    };
    let step = *step;
    if job.steps.get(step).is_none_or(|s| s.is_compensating()) {
        return Ok(None);
    }
    let t = overseer_core::apply(job, command.clone(), now)?;
    // A result the job no longer takes (it was cancelled) settles the step as cancelled: that is
    // not the fault being simulated.
    if t.job.steps.get(step).map(|s| s.state) != Some(StepState::Succeeded) {
        return Ok(None);
    }
    super::row_writes::write_step(conn, &t.job, step)?;
    super::written::forget(job.id);
    Ok(Some(t))
}

#[cfg(feature = "fault-injection")]
pub(super) use armed::{abort_if_raised, apply_or_crash, armed_from_env};

#[cfg(feature = "fault-injection")]
mod armed {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use overseer_core::{Command, JobId, Timestamp, Transition};
    use rusqlite::Connection;

    use super::super::{apply_command, rows};
    use crate::{Error, Result};

    /// The environment variable naming the fault to inject.
    const VAR: &str = "OVERSEER_FAULT";
    const CRASH_AFTER_STEP_RESULT: &str = "crash-after-step-result";

    /// The abort flag when `OVERSEER_FAULT` asks for the crash, else `None`.
    pub(in crate::sqlite) fn armed_from_env() -> Option<Arc<AtomicBool>> {
        match std::env::var(VAR) {
            Ok(fault) if fault == CRASH_AFTER_STEP_RESULT => {
                tracing::warn!(
                    fault,
                    "fault injection armed: the process will abort after committing a step result"
                );
                Some(Arc::new(AtomicBool::new(false)))
            }
            Ok(fault) => {
                tracing::warn!(fault, "ignoring an unknown {VAR}");
                None
            }
            Err(_) => None,
        }
    }

    /// `job_apply` with the fault armed: a step's result is written alone and `crash` raised so
    /// the writer aborts after the commit; every other command is applied as usual.
    pub(in crate::sqlite) fn apply_or_crash(
        conn: &Connection,
        id: JobId,
        command: Command,
        now: Timestamp,
        history_per_job: usize,
        crash: &AtomicBool,
    ) -> Result<Transition> {
        let job = rows::load_job(conn, id)?.ok_or(Error::JobNotFound(id))?;
        if let Some(t) = super::write_step_result_only(conn, &job, &command, now)? {
            crash.store(true, Ordering::SeqCst);
            return Ok(t);
        }
        apply_command(conn, id, command, now, history_per_job)
    }

    /// Called by the writer after each batch: aborts if a write of the batch raised the flag and
    /// the batch is committed. A batch that failed to commit took the partial write with it, so
    /// the process lives on and the caller hears of the failure.
    pub(in crate::sqlite) fn abort_if_raised(flag: &AtomicBool, committed: bool) {
        if flag.swap(false, Ordering::SeqCst) && committed {
            tracing::error!("fault injection: aborting right after committing a step result");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use overseer_core::machine::admit;
    use overseer_core::{EventKind, JobId, JobSpec, JobState, LeaseId};
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::sqlite::{apply_command, migrate, rows};

    const HISTORY: usize = 100;

    fn t(ms: i64) -> Timestamp {
        Timestamp(1_700_000_000_000 + ms)
    }

    fn store_with(spec: serde_json::Value) -> (Connection, JobId) {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        let spec: JobSpec = serde_json::from_value(spec).expect("spec");
        let id = JobId(Uuid::now_v7());
        let admitted = admit(Job::from_spec(id, &spec, t(0)), t(0));
        let seq = crate::sqlite::insert::reserve_seqs(&conn, 1).expect("seq");
        crate::sqlite::insert::NewRows::prepare(&conn)
            .and_then(|mut rows| rows.insert(&admitted.job, seq, &admitted.events, HISTORY))
            .expect("insert");
        (conn, id)
    }

    fn apply(conn: &Connection, id: JobId, command: Command, ms: i64) -> Transition {
        apply_command(conn, id, command, t(ms), HISTORY).expect("apply")
    }

    fn claim(conn: &Connection, id: JobId, step: usize, ms: i64) -> Transition {
        let lease_id = LeaseId(Uuid::now_v7());
        let worker = "w-1".to_string();
        apply(
            conn,
            id,
            Command::Claim {
                step,
                lease_id,
                worker,
            },
            ms,
        )
    }

    fn load(conn: &Connection, id: JobId) -> Job {
        rows::load_job(conn, id).expect("load").expect("job exists")
    }

    fn event_count(conn: &Connection, id: JobId) -> usize {
        crate::sqlite::history::load_events(conn, id, 0, 10_000)
            .expect("events")
            .len()
    }

    fn delivery_count(conn: &Connection) -> u64 {
        let crate::DeliveryCounts { waiting, dead } =
            rows::deliveries_counts(conn).expect("counts");
        waiting + dead
    }

    // Proves the armed write stores the step's result and nothing else: the job row, the
    // dependant, the history and the outbox are as before, until `Repair` heals the job.
    #[test]
    fn a_step_result_is_written_alone_until_repair() {
        let (conn, id) = store_with(json!({
            "callback_url": "https://example.invalid/done",
            "steps": [{"name": "a", "agent": "w"}, {"name": "b", "agent": "w", "depends_on": ["a"]}]
        }));
        claim(&conn, id, 0, 10);
        let before = load(&conn, id);
        let events = event_count(&conn, id);

        let complete = Command::Complete {
            step: 0,
            attempt: 1,
            result: json!({"ok": 1}),
        };
        let partial = write_step_result_only(&conn, &before, &complete, t(20))
            .expect("partial write")
            .expect("a work result is written alone");
        assert_eq!(
            partial.job.steps[1].state,
            StepState::Ready,
            "the core readied the dependant"
        );

        let after = load(&conn, id);
        assert_eq!(
            after.steps[0], partial.job.steps[0],
            "the step row is the transition's"
        );
        assert_eq!(after.steps[0].state, StepState::Succeeded);
        assert_eq!(after.steps[0].result, Some(json!({"ok": 1})));
        assert_eq!(
            after.steps[1], before.steps[1],
            "the dependant was not written"
        );
        assert_eq!(after.steps[1].state, StepState::Waiting);
        assert_eq!(after.state, JobState::Running);
        assert_eq!(
            after.updated_at, before.updated_at,
            "the job row was not written"
        );
        assert_eq!(event_count(&conn, id), events, "no events were appended");

        // The repair scan's command heals it: the dependant becomes ready, and the job finishes
        // once that one completes too.
        let repaired = apply(&conn, id, Command::Repair, 30);
        assert_eq!(load(&conn, id), repaired.job);
        assert_eq!(repaired.job.steps[1].state, StepState::Ready);
        assert!(repaired
            .events
            .iter()
            .any(|e| e.kind == EventKind::JobRepaired));
        claim(&conn, id, 1, 40);
        let last = Command::Complete {
            step: 1,
            attempt: 1,
            result: json!(null),
        };
        let b_done = write_step_result_only(&conn, &load(&conn, id), &last, t(50))
            .expect("partial write")
            .expect("written alone");
        assert_eq!(
            b_done.job.state,
            JobState::Succeeded,
            "the core finished the job"
        );
        assert_eq!(
            load(&conn, id).state,
            JobState::Running,
            "but the job row was not written"
        );
        assert_eq!(delivery_count(&conn), 0, "nor its callback");
        let healed = apply(&conn, id, Command::Repair, 60);
        assert_eq!(healed.job.state, JobState::Succeeded);
        assert_eq!(load(&conn, id).state, JobState::Succeeded);
        assert_eq!(delivery_count(&conn), 1, "the repair records the callback");
    }

    // Proves every other command, a stale result, and an undo's result are left to the normal
    // path: nothing is written and `None` comes back.
    #[test]
    fn other_commands_and_undo_results_are_not_intercepted() {
        let (conn, id) = store_with(json!({
            "on_failure": "compensate",
            "steps": [
                {"name": "a", "agent": "w", "compensate": {"agent": "undo"}},
                {"name": "b", "agent": "w", "depends_on": ["a"], "max_attempts": 1}
            ]
        }));
        claim(&conn, id, 0, 10);
        let job = load(&conn, id);
        let heartbeat = Command::Heartbeat {
            step: 0,
            attempt: 1,
            progress: None,
        };
        assert!(write_step_result_only(&conn, &job, &heartbeat, t(11))
            .expect("ok")
            .is_none());
        let stale = Command::Complete {
            step: 0,
            attempt: 2,
            result: json!(1),
        };
        assert!(
            write_step_result_only(&conn, &job, &stale, t(11)).is_err(),
            "stale is rejected"
        );
        assert_eq!(load(&conn, id), job);

        apply(
            &conn,
            id,
            Command::Complete {
                step: 0,
                attempt: 1,
                result: json!(1),
            },
            20,
        );
        claim(&conn, id, 1, 30);
        let fatal = Command::Fail {
            step: 1,
            attempt: 1,
            error: "no".into(),
            retryable: false,
            jitter: 0.0,
        };
        let failed = apply(&conn, id, fatal, 40);
        assert_eq!(failed.job.state, JobState::Compensating);
        let undo = claim(&conn, id, 0, 50);
        let job = load(&conn, id);
        assert_eq!(job, undo.job);
        let attempt = job.steps[0].attempt;
        let undone = Command::Complete {
            step: 0,
            attempt,
            result: json!("refunded"),
        };
        assert!(write_step_result_only(&conn, &job, &undone, t(60))
            .expect("ok")
            .is_none());
        assert_eq!(load(&conn, id), job, "nothing was written for the undo");
    }
}
