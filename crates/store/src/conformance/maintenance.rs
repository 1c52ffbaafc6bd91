//! The supervisor's next wake-up.

use super::*;

// Proves `next_due_at` is the earliest pending run_at, future retry, or lease expiry, and
// `agents_due` names the agents whose retries fall in `(after, now]`, and not those of work
// that was due the moment it became ready.
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
    // Work ready the moment it is submitted woke its agent then: no window names it later.
    submit(store, admitted(job_id(5), &one_step("fresh"), at(7_000))).await;
    assert!(store
        .agents_due(DueBetween {
            after: at(6_999),
            until: at(7_000),
        })
        .await
        .expect("agents")
        .is_empty());
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

/// Submits a one-step job (agent `p{n}`, so claims never mix) at `at(0)` and ends it at
/// `at(end_ms)`: `Succeeded` by completing it, `Failed` by a fatal failure, `Cancelled` by a
/// cancel before it started.
pub async fn end_job(store: &dyn Store, n: u64, how: JobState, own: Option<&str>, end_ms: i64) {
    let agent = format!("p{n}");
    let mut body = json!({"idempotency_key": format!("key-{n}"),
                          "steps": [{"name": "s", "agent": agent}]});
    if let Some(keep) = own {
        body["retention"] = json!(keep);
    }
    submit(store, admitted(job_id(n), &spec(body), at(0))).await;
    let command = match how {
        JobState::Cancelled => Command::Cancel,
        JobState::Succeeded => {
            claim(store, &agent, 1, u128::from(n) * 10, at(1)).await;
            complete(0, 1, json!("done"))
        }
        _ => {
            claim(store, &agent, 1, u128::from(n) * 10, at(1)).await;
            fatal(0, 1, "no")
        }
    };
    let t = apply(store, job_id(n), command, at(end_ms)).await;
    assert_eq!(t.job.state, how);
}

// Proves retention on both stores: a finished job goes once its state's default (or its own
// retention) has passed since it finished and not a millisecond before, at most `limit` per call,
// with its history; a job still running is never touched however old; and the idempotency key of
// a removed job can be used again.
pub async fn finished_jobs_are_pruned_after_their_retention(f: &Fixture) {
    let store = &*f.store;
    end_job(store, 1, JobState::Succeeded, None, 1_000).await;
    end_job(store, 2, JobState::Failed, None, 1_000).await;
    end_job(store, 3, JobState::Cancelled, None, 1_000).await;
    end_job(store, 4, JobState::Failed, Some("2s"), 1_000).await;
    end_job(store, 5, JobState::Succeeded, None, 2_000).await;
    submit(store, admitted(job_id(6), &one_step("idle"), at(0))).await;
    let retention = Retention {
        succeeded: Span::from_secs(10),
        failed: Span::from_secs(20),
        cancelled: Span::from_secs(30),
    };
    let pruned = |now: i64, limit: usize| async move {
        let mut pruned = store
            .jobs_prune(Prune {
                now: at(now),
                retention,
                limit,
            })
            .await
            .expect("prune");
        pruned.ids.sort();
        pruned
    };
    let prune = |now: i64, limit: usize| async move { pruned(now, limit).await.ids };
    assert!(!pruned(2_999, 10).await.more, "nothing more is due");
    assert!(prune(2_999, 10).await.is_empty(), "nothing is due yet");
    assert_eq!(prune(3_000, 10).await, vec![job_id(4)], "its own 2 s");
    assert!(prune(10_999, 10).await.is_empty());
    let first = pruned(12_000, 1).await;
    assert_eq!(first.ids.len(), 1, "one per call with limit 1");
    assert!(first.more, "a full batch says more may be due");
    let second = pruned(12_000, 10).await;
    assert_eq!(second.ids.len(), 1, "the other succeeded job");
    assert!(
        !second.more,
        "a batch that is not full says nothing more is due"
    );
    assert_eq!(prune(21_000, 10).await, vec![job_id(2)]);
    assert_eq!(prune(31_000, 10).await, vec![job_id(3)]);
    assert!(prune(i64::from(i32::MAX), 10).await.is_empty());
    for n in 1..=5 {
        assert!(store.job_get(job_id(n)).await.expect("get").is_none());
        let events = store
            .job_events(EventPage {
                job: job_id(n),
                after_seq: 0,
                limit: 10,
            })
            .await;
        assert!(matches!(events, Err(Error::JobNotFound(_))), "{events:?}");
    }
    assert_eq!(get(store, job_id(6)).await.state, JobState::Running);
    // The key of a removed job is free: the same key with another body makes a new job.
    let again = spec(json!({"idempotency_key": "key-1", "priority": 3,
                            "steps": [{"name": "s", "agent": "p1"}]}));
    let t = submit(store, admitted(job_id(7), &again, at(40_000))).await;
    assert_eq!(t.job.idempotency_key.as_deref(), Some("key-1"));
}
