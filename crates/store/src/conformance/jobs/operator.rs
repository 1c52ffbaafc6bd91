//! The operator's actions on a job, persisted by `job_apply`: cancel, hold with retry, resume and
//! skip, and repair.

use super::*;

// Proves cancelling stores the cancelled steps at once, keeps a running step until its report,
// and stores the step and job settled by a refused late result.
pub async fn cancel_settles_steps_and_refuses_late_results(f: &Fixture) {
    let store = &*f.store;
    let chain = spec(
        json!({"steps": [{"name": "a", "agent": "w"}, {"name": "b", "agent": "w", "depends_on": ["a"]}]}),
    );
    let idle = job_id(1);
    submit(store, admitted(idle, &chain, at(0))).await;
    let t = apply(store, idle, Command::Cancel, at(10)).await;
    let stored = get(store, idle).await;
    assert_eq!(stored, t.job);
    assert_eq!(stored.state, JobState::Cancelled);
    assert!(stored.steps.iter().all(|s| s.state == StepState::Cancelled));
    match store
        .job_apply(Apply::new(idle, Command::Cancel, at(20)))
        .await
    {
        Err(Error::Rejected(Rejection::JobTerminal {
            state: JobState::Cancelled,
        })) => {}
        other => panic!("expected JobTerminal, got {other:?}"),
    }
    assert!(claim(store, "w", 5, 1, at(20)).await.is_empty());

    let busy = job_id(2);
    let pair = spec(json!({"steps": [{"name": "x", "agent": "v"}, {"name": "y", "agent": "u"}]}));
    submit(store, admitted(busy, &pair, at(0))).await;
    claim(store, "v", 1, 10, at(1)).await;
    apply(store, busy, Command::Cancel, at(2)).await;
    let stored = get(store, busy).await;
    assert_eq!(stored.state, JobState::Running);
    assert_eq!(
        [stored.steps[0].state, stored.steps[1].state],
        [StepState::Running, StepState::Cancelled]
    );
    assert!(claim(store, "u", 1, 11, at(3)).await.is_empty());

    let late = apply(
        store,
        busy,
        Command::Complete {
            step: 0,
            attempt: 1,
            result: json!("late"),
        },
        at(4),
    )
    .await;
    assert!(matches!(
        late.reply,
        Reply::Refused(Rejection::LeaseLost { .. })
    ));
    let stored = get(store, busy).await;
    assert_eq!(stored, late.job);
    assert_eq!(stored.state, JobState::Cancelled);
    let cancelled = store
        .jobs_list(JobQuery {
            state: Some(JobState::Cancelled),
            limit: 10,
            ..JobQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(ids(&cancelled), vec![busy, idle]);
}

// Proves every new field survives the store: a job with a full compensate spec, `hold` and a
// callback URL reads back equal; so do `blocked_reason`, `budget_from` and the stored history
// through the operator's `Retry`, `Resume` and `Skip`, each persisted by `job_apply`.
pub async fn new_fields_round_trip_through_hold_retry_resume_skip(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let body = spec(json!({
        "on_failure": "hold",
        "callback_url": "https://example.invalid/cb?job=1",
        "steps": [
            {"name": "a", "agent": "w",
             "compensate": {"agent": "undo", "payload": {"refund": [1, 2]}, "timeout": "90s",
                            "max_attempts": 0}},
            {"name": "b", "agent": "w", "depends_on": ["a"], "max_attempts": 1}
        ]
    }));
    let new = admitted(id, &body, at(0));
    let expected = new.transition.job.clone();
    let compensate = expected.steps[0].compensate.clone().expect("compensate");
    assert_eq!(
        (compensate.timeout, compensate.max_attempts),
        (Some(overseer_core::Span::from_millis(90_000)), Some(0))
    );
    let submitted = store.jobs_submit(vec![new.clone()]).await.expect("submit");
    assert!(matches!(submitted.as_slice(), [Submitted::Created(t)] if t.job == expected));
    assert_eq!(get(store, id).await, expected);
    // The rest runs on a twin job, as `run_until_b_fails` submits its own; this one steps aside.
    apply(store, id, Command::Cancel, at(1)).await;
    let id = job_id(2);
    let blocked = run_until_b_fails(store, id, &body, 1).await;
    let stored = get(store, id).await;
    assert_eq!(stored, blocked.job);
    assert_eq!(stored.state, JobState::Blocked);
    assert!(stored
        .blocked_reason
        .as_deref()
        .is_some_and(|r| r.contains("out of stock")));

    let retry = Command::Retry {
        step: 1,
        by: Some("ops@example".into()),
        reason: Some("restocked".into()),
    };
    let retried = apply(store, id, retry, at(50)).await;
    let stored = get(store, id).await;
    assert_eq!(stored, retried.job);
    assert_eq!(
        (stored.state, stored.blocked_reason.as_deref()),
        (JobState::Running, None)
    );
    assert_eq!(
        (stored.steps[1].state, stored.steps[1].budget_from),
        (StepState::Ready, 1)
    );
    let events = all_events(store, id).await;
    let retried_event = events
        .iter()
        .find(|e| e.kind == EventKind::StepRetried)
        .expect("step_retried stored");
    assert_eq!(
        retried_event.detail,
        Some(json!({"by": "ops@example", "reason": "restocked"}))
    );

    let again = claim(store, "w", 1, 3, at(60)).await;
    assert_eq!(again[0].transition.job.steps[1].attempt, 2);
    apply(store, id, fatal(1, 2, "out of stock again"), at(70)).await;
    let resume = Command::Resume {
        by: None,
        reason: Some("try once more".into()),
    };
    let resumed = apply(store, id, resume, at(80)).await;
    assert_eq!(get(store, id).await, resumed.job);
    assert_eq!(resumed.job.steps[1].budget_from, 2);
    assert!(all_events(store, id)
        .await
        .iter()
        .any(|e| e.kind == EventKind::JobResumed));

    claim(store, "w", 1, 4, at(90)).await;
    apply(store, id, fatal(1, 3, "gone for good"), at(100)).await;
    assert_eq!(get(store, id).await.state, JobState::Blocked);
    let skip = Command::Skip {
        step: 1,
        by: Some("ops@example".into()),
        reason: None,
    };
    let skipped = apply(store, id, skip, at(110)).await;
    let stored = get(store, id).await;
    assert_eq!(stored, skipped.job);
    assert_eq!(stored.steps[1].state, StepState::Skipped);
    assert_eq!(stored.state, JobState::Succeeded);
    assert!(live_deliveries(store)
        .await
        .iter()
        .any(|d| d.job_id == id && d.kind == DeliveryKind::Callback));
}

// Proves `Repair` persists through `job_apply`: a job stored inconsistent (a succeeded step
// whose dependant still waits) is healed, the dependant becomes claimable, and a repair of a
// consistent job changes nothing.
pub async fn repair_heals_an_inconsistent_job(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let chain = spec(json!({"steps": [
        {"name": "a", "agent": "w"},
        {"name": "b", "agent": "v", "depends_on": ["a"]}
    ]}));
    // What a crash between storing a's result and advancing the job leaves behind.
    let mut new = admitted(id, &chain, at(0));
    let a = &mut new.transition.job.steps[0];
    a.state = StepState::Succeeded;
    a.attempt = 1;
    a.result = Some(json!("A"));
    a.next_attempt_at = None;
    a.finished_at = Some(at(5));
    new.transition.effects.clear();
    submit(store, new).await;
    assert!(claim(store, "v", 1, 1, at(10)).await.is_empty());

    let repaired = apply(store, id, Command::Repair, at(10)).await;
    let stored = get(store, id).await;
    assert_eq!(stored, repaired.job);
    assert_eq!(stored.steps[1].state, StepState::Ready);
    let kinds: Vec<EventKind> = all_events(store, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&EventKind::JobRepaired), "{kinds:?}");

    let history = all_events(store, id).await;
    let noop = apply(store, id, Command::Repair, at(20)).await;
    assert!(noop.is_noop());
    assert_eq!(get(store, id).await, stored);
    assert_eq!(all_events(store, id).await, history);

    let b = claim(store, "v", 1, 2, at(30)).await;
    assert_eq!(claimed_jobs(&b), vec![id]);
    apply(store, id, complete(1, 1, json!("B")), at(40)).await;
    assert_eq!(get(store, id).await.state, JobState::Succeeded);
}
