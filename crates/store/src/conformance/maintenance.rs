//! The supervisor's next wake-up.

use super::*;

// Proves `next_due_at` is the earliest pending run_at, future retry, or lease expiry, and
// `agents_due` names the agents whose retries fall in `(after, now]`.
pub async fn next_due_and_agents_due(f: &Fixture) {
    let store = &*f.store;
    assert_eq!(store.next_due_at(at(0)).await.expect("due"), None);

    // A step ready now is not a future event.
    submit(store, admitted(job_id(1), &one_step("idle"), at(0))).await;
    assert_eq!(store.next_due_at(at(1)).await.expect("due"), None);

    let pending = spec(json!({"run_at": at(60_000), "steps": [{"name": "s", "agent": "p"}]}));
    submit(store, admitted(job_id(2), &pending, at(0))).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(60_000))
    );

    let leased = spec(json!({"steps": [{"name": "s", "agent": "r", "timeout": "30s"}]}));
    submit(store, admitted(job_id(3), &leased, at(0))).await;
    claim(store, "r", 1, 1, at(0)).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(30_000))
    );

    let retried = spec(
        json!({"steps": [{"name": "s", "agent": "q", "backoff": {"initial": "5s", "factor": 1, "max": "5s"}}]}),
    );
    let q = job_id(4);
    submit(store, admitted(q, &retried, at(0))).await;
    claim(store, "q", 1, 2, at(0)).await;
    let failed = Command::Fail {
        step: 0,
        attempt: 1,
        error: "busy".into(),
        retryable: true,
        jitter: 0.0,
    };
    apply(store, q, failed, at(1_000)).await;
    assert_eq!(
        store.next_due_at(at(1_000)).await.expect("due"),
        Some(at(6_000))
    );

    assert!(store
        .agents_due(DueBetween {
            after: at(1_000),
            until: at(5_999),
        })
        .await
        .expect("agents")
        .is_empty());
    assert_eq!(
        store
            .agents_due(DueBetween {
                after: at(5_999),
                until: at(6_000),
            })
            .await
            .expect("agents"),
        vec!["q".to_string()]
    );
    assert!(store
        .agents_due(DueBetween {
            after: at(6_000),
            until: at(7_000),
        })
        .await
        .expect("agents")
        .is_empty());
    // Once the retry is due it is the claimers' business, not a future event.
    assert_eq!(
        store.next_due_at(at(6_000)).await.expect("due"),
        Some(at(30_000))
    );
}

// Proves `next_due_at` wakes the supervisor for a schedule's next due time, and forgets it
// while the schedule is paused.
pub async fn next_due_at_includes_schedules(f: &Fixture) {
    let store = &*f.store;
    let s = new_schedule(schedule_spec("s", json!({})), at(60_000), at(0));
    store.schedule_create(s).await.expect("create");
    assert_eq!(
        store.next_due_at(at(0)).await.expect("next"),
        Some(at(60_000))
    );
    let delayed = spec(json!({"run_at": at(30_000), "steps": [{"name": "s", "agent": "w"}]}));
    submit(store, admitted(job_id(1), &delayed, at(0))).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("next"),
        Some(at(30_000))
    );
    apply(store, job_id(1), Command::Cancel, at(1)).await;
    assert_eq!(
        store.next_due_at(at(1)).await.expect("next"),
        Some(at(60_000))
    );
    store
        .schedule_set_paused(SchedulePause {
            name: "s".to_string(),
            paused: true,
            next_fire_at: None,
            now: at(2),
        })
        .await
        .expect("pause");
    assert_eq!(store.next_due_at(at(2)).await.expect("next"), None);
}
