//! When a job runs: `run_at` jobs coming due, reschedules (of plain and keyed jobs) and job
//! deadlines.

use super::*;

// Proves `jobs_due` lists pending jobs from their `run_at` on, earliest first, and `Activate`
// starts them only then.
pub async fn run_at_jobs_come_due_and_activate(f: &Fixture) {
    let store = &*f.store;
    let later = |ms: i64| spec(json!({"run_at": at(ms), "steps": [{"name": "s", "agent": "w"}]}));
    let (a, b) = (job_id(1), job_id(2));
    submit(store, admitted(a, &later(10_000), at(0))).await;
    submit(store, admitted(b, &later(5_000), at(1))).await;
    assert_eq!(get(store, a).await.state, JobState::Pending);
    assert_eq!(get(store, a).await.steps[0].state, StepState::Waiting);

    assert!(store
        .jobs_due(Due {
            now: at(4_999),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(9_999),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![b]
    );
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(20_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![b, a]
    );
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(20_000),
                limit: 1,
            })
            .await
            .expect("due"),
        vec![b]
    );

    match store
        .job_apply(Apply::new(a, Command::Activate, at(9_999)))
        .await
    {
        Err(Error::Rejected(Rejection::NotDue)) => {}
        other => panic!("expected NotDue, got {other:?}"),
    }
    assert!(claim(store, "w", 5, 1, at(9_999)).await.is_empty());
    let t = apply(store, a, Command::Activate, at(10_000)).await;
    assert_eq!(t.job.state, JobState::Running);
    assert_eq!(get(store, a).await, t.job);
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(20_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![b]
    );
    let leased = claim(store, "w", 5, 10, at(10_000)).await;
    assert_eq!(claimed_jobs(&leased), vec![a]);
}

fn reschedule(run_at: Option<Timestamp>, priority: Option<i32>) -> Command {
    Command::Reschedule {
        run_at,
        priority,
        by: Some("ops".into()),
        reason: None,
    }
}

// Proves a reschedule is stored: a pending job moved earlier is due (and `next_due_at` says so)
// at its new run_at and not before, one moved later is not due at its old one, a run_at that
// has come starts it in the same write, a new priority reorders claims, the history records
// `job_rescheduled`, and a running job's run_at or a finished job is refused with nothing
// written.
pub async fn reschedule_moves_run_at_and_priority(f: &Fixture) {
    let store = &*f.store;
    let later = |ms: i64| spec(json!({"run_at": at(ms), "steps": [{"name": "s", "agent": "w"}]}));
    let (a, b, c, d) = (job_id(1), job_id(2), job_id(3), job_id(4));
    submit(store, admitted(a, &later(60_000), at(0))).await;
    submit(store, admitted(b, &later(30_000), at(0))).await;
    submit(store, admitted(c, &one_step("v"), at(0))).await;
    submit(store, admitted(d, &one_step("v"), at(0))).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(30_000))
    );

    let t = apply(store, a, reschedule(Some(at(10_000)), None), at(1_000)).await;
    assert_eq!(t.effects, [Effect::Due { at: at(10_000) }]);
    assert_eq!(get(store, a).await.run_at, Some(at(10_000)));
    assert_eq!(
        store.next_due_at(at(1_000)).await.expect("due"),
        Some(at(10_000))
    );
    assert!(store
        .jobs_due(Due {
            now: at(9_999),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(10_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![a]
    );
    apply(store, b, reschedule(Some(at(90_000)), None), at(1_000)).await;
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(60_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![a]
    );
    let last = all_events(store, b).await.pop().expect("events");
    assert_eq!(last.kind, EventKind::JobRescheduled);
    assert_eq!(
        last.detail.expect("detail")["run_at"],
        json!({"from": at(30_000), "to": at(90_000)})
    );

    // Run now: started by the same write, claimable at once.
    let t = apply(store, b, reschedule(Some(at(2_000)), None), at(2_000)).await;
    assert_eq!(t.job.state, JobState::Running);
    assert_eq!(get(store, b).await, t.job);
    assert_eq!(
        claimed_jobs(&claim(store, "w", 5, 1, at(2_000)).await),
        vec![b]
    );

    // d was submitted after c; a higher priority puts it first.
    apply(store, d, reschedule(None, Some(5)), at(2_000)).await;
    assert_eq!(get(store, d).await.priority, 5);
    assert_eq!(
        claimed_jobs(&claim(store, "v", 1, 10, at(2_000)).await),
        vec![d]
    );

    let before = get(store, c).await;
    match store
        .job_apply(Apply::new(
            c,
            reschedule(Some(at(9_000)), Some(3)),
            at(3_000),
        ))
        .await
    {
        Err(Error::Rejected(Rejection::NotAllowed { .. })) => {}
        other => panic!("run_at of a running job: {other:?}"),
    }
    assert_eq!(get(store, c).await, before, "a refused move writes nothing");
    apply(store, c, Command::Cancel, at(3_000)).await;
    match store
        .job_apply(Apply::new(c, reschedule(None, Some(3)), at(3_000)))
        .await
    {
        Err(Error::Rejected(Rejection::JobTerminal { .. })) => {}
        other => panic!("a finished job: {other:?}"),
    }
}

// Proves moving a keyed job does not let it overtake its key: moved to now while another job
// heads the key it stays pending and is not due, and it starts in the write that finishes the
// head; a keyed head moved to now is due at once.
pub async fn reschedule_of_a_keyed_job_keeps_its_place_in_the_key(f: &Fixture) {
    let store = &*f.store;
    let keyed = |run_at: Option<i64>| {
        let mut v = json!({"ordering_key": "k", "steps": [{"name": "s", "agent": "w"}]});
        if let Some(ms) = run_at {
            v["run_at"] = json!(at(ms));
        }
        spec(v)
    };
    let (head, next) = (job_id(1), job_id(2));
    submit(store, admitted(head, &keyed(Some(50_000)), at(0))).await;
    submit(store, admitted(next, &keyed(None), at(1))).await;
    assert!(store
        .jobs_due(Due {
            now: at(1_000),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    // The second job moved to now: still behind the head.
    let t = apply(store, next, reschedule(Some(at(1_000)), None), at(1_000)).await;
    assert_eq!(t.job.state, JobState::Pending);
    assert!(store
        .jobs_due(Due {
            now: at(1_000),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    // The head moved to now is due now (the store, not the core, starts a keyed job).
    let t = apply(store, head, reschedule(Some(at(1_000)), None), at(1_000)).await;
    assert_eq!(t.effects, [Effect::Due { at: at(1_000) }]);
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(1_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![head]
    );
    apply(store, head, Command::Activate, at(1_000)).await;
    let t = apply(store, head, Command::Cancel, at(2_000)).await;
    assert_eq!(t.job.state, JobState::Cancelled);
    assert_eq!(get(store, next).await.state, JobState::Running);
}

// Proves a job deadline is stored and found: `next_due_at` wakes the supervisor for it,
// `jobs_past_deadline` lists the job once it has come (and not before), `Command::Deadline`
// fails it, after which it is neither listed nor due; a job without a deadline never is.
pub async fn job_deadline_is_found_and_enforced(f: &Fixture) {
    let store = &*f.store;
    let (late, plain) = (job_id(1), job_id(2));
    let s = spec(json!({"deadline": "5s", "steps": [{"name": "s", "agent": "w"}]}));
    submit(store, admitted(late, &s, at(0))).await;
    submit(store, admitted(plain, &one_step("w"), at(0))).await;
    assert_eq!(get(store, late).await.deadline, Some(at(5_000)));
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(5_000))
    );
    let past = |now| store.jobs_past_deadline(Due { now, limit: 10 });
    assert!(past(at(4_999)).await.expect("past").is_empty());
    assert_eq!(past(at(5_000)).await.expect("past"), vec![late]);
    let t = apply(store, late, Command::Deadline, at(5_000)).await;
    assert_eq!(t.job.state, JobState::Failed);
    assert_eq!(get(store, late).await, t.job);
    assert!(past(at(9_000)).await.expect("past").is_empty());
    assert_eq!(store.next_due_at(at(5_000)).await.expect("due"), None);
    assert_eq!(get(store, plain).await.state, JobState::Running);
}
