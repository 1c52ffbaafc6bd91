//! Leases running out: expired leases requeue with backoff, and a step's deadline caps the stored
//! lease.

use super::*;

// Proves an expired lease is listed by `leases_expired` exactly from its expiry on, and that
// `Expire` requeues the step with backoff: it cannot be claimed before `next_attempt_at`.
pub async fn expired_lease_requeues_with_backoff(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"steps": [{"name": "s", "agent": "w", "timeout": "1s", "backoff": {"initial": "2s", "factor": 2, "max": "1m"}}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    claim(store, "w", 1, 1, at(0)).await;

    assert!(store
        .leases_expired(Due {
            now: at(999),
            limit: 10,
        })
        .await
        .expect("expired")
        .is_empty());
    let expired = store
        .leases_expired(Due {
            now: at(1_000),
            limit: 10,
        })
        .await
        .expect("expired");
    assert_eq!(
        expired,
        vec![LeaseRef {
            lease_id: lease_id(1),
            job_id: id,
            step: 0,
            attempt: 1
        }]
    );

    let t = apply(store, id, expire(0, 1), at(1_000)).await;
    let stored = get(store, id).await;
    assert_eq!(stored, t.job);
    let step = &stored.steps[0];
    assert_eq!(step.state, StepState::Ready);
    assert_eq!(step.failures, 1);
    assert_eq!(step.next_attempt_at, Some(at(3_000)));
    assert!(step.last_error.is_some());
    assert!(store
        .leases_expired(Due {
            now: at(5_000),
            limit: 10,
        })
        .await
        .expect("expired")
        .is_empty());

    assert!(claim(store, "w", 1, 2, at(2_999)).await.is_empty());
    let again = claim(store, "w", 1, 3, at(3_000)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].transition.job.steps[0].attempt, 2);
    match store
        .job_apply(Apply::new(id, expire(0, 1), at(9_000)))
        .await
    {
        Err(Error::Rejected(Rejection::NotExpired)) => {}
        other => panic!("expected NotExpired for a superseded attempt, got {other:?}"),
    }
}

// Proves a step's deadline is stored and enforced by the stored lease: the claim fixes the
// attempt's hard end, a heartbeat renews the lease only up to it, `leases_expired` and
// `next_due_at` see the capped expiry, and the expiry is recorded as a deadline overrun.
pub async fn step_deadline_caps_the_stored_lease(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"steps": [{"name": "s", "agent": "w", "timeout": "3s",
        "deadline": "10s", "max_attempts": 2,
        "backoff": {"initial": "1s", "factor": 2, "max": "1m"}}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    let claimed = claim(store, "w", 1, 1, at(0)).await;
    assert_eq!(claimed.len(), 1);
    let stored = get(store, id).await;
    assert_eq!(
        stored.steps[0].deadline,
        Some(overseer_core::Span::from_secs(10))
    );
    assert_eq!(stored.steps[0].attempt_ends_at, Some(at(10_000)));
    assert_eq!(stored.steps[0].lease_expires_at, Some(at(3_000)));
    let beat = |now| {
        apply(
            store,
            id,
            Command::Heartbeat {
                step: 0,
                attempt: 1,
                progress: None,
            },
            now,
        )
    };
    beat(at(2_000)).await;
    assert_eq!(
        get(store, id).await.steps[0].lease_expires_at,
        Some(at(5_000))
    );
    beat(at(4_500)).await;
    let t = beat(at(7_000)).await;
    assert_eq!(
        t.reply,
        Reply::Heartbeat {
            lease_expires_at: at(10_000),
            cancel: false
        }
    );
    assert_eq!(get(store, id).await, t.job);
    assert_eq!(
        store.next_due_at(at(7_000)).await.expect("due"),
        Some(at(10_000))
    );
    let due = |now| store.leases_expired(Due { now, limit: 10 });
    assert!(due(at(9_999)).await.expect("expired").is_empty());
    assert_eq!(due(at(10_000)).await.expect("expired").len(), 1);
    apply(store, id, expire(0, 1), at(10_000)).await;
    let kinds: Vec<EventKind> = all_events(store, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(
        kinds.contains(&EventKind::StepDeadlineExceeded),
        "{kinds:?}"
    );
    let stored = get(store, id).await;
    assert_eq!(stored.steps[0].state, StepState::Ready);
    assert!(stored.steps[0]
        .last_error
        .as_deref()
        .is_some_and(|e| e.starts_with("deadline exceeded")));
}

// Proves expired leases are listed oldest expiry first across agents, the limit taking the
// oldest of all of them, and the next wake-up is the earliest lease end of any agent: leases of
// three agents whose ends interleave (each agent's leases sorted by agent name would read in
// another order).
pub async fn expiries_are_oldest_first_across_agents(f: &Fixture) {
    let store = &*f.store;
    // (job, agent, timeout s, claimed at s): ends at 4, 5, 6, 7, 8, 9 s.
    let leases = [
        (1, "c", 3, 1),
        (2, "a", 2, 3),
        (3, "b", 5, 1),
        (4, "c", 6, 1),
        (5, "a", 4, 4),
        (6, "b", 8, 1),
    ];
    for (n, agent, timeout, _) in leases {
        let s = spec(
            json!({"steps": [{"name": "s", "agent": agent, "timeout": format!("{timeout}s")}]}),
        );
        submit(store, admitted(job_id(n), &s, at(0))).await;
    }
    for (n, agent, _, claimed) in leases {
        let got = claim(store, agent, 1, n as u128, at(claimed * 1_000)).await;
        assert_eq!(claimed_jobs(&got), [job_id(n)]);
    }
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(4_000))
    );
    let expired = |now: i64, limit: usize| async move {
        let found = store
            .leases_expired(Due {
                now: at(now),
                limit,
            })
            .await
            .expect("expired");
        found.iter().map(|l| l.job_id).collect::<Vec<_>>()
    };
    assert_eq!(expired(3_999, 10).await, []);
    assert_eq!(expired(7_000, 10).await, [1, 2, 3, 4].map(job_id));
    assert_eq!(expired(60_000, 3).await, [1, 2, 3].map(job_id));
    assert_eq!(expired(60_000, 10).await, [1, 2, 3, 4, 5, 6].map(job_id));
    apply(store, job_id(1), expire(0, 1), at(4_000)).await;
    apply(store, job_id(2), expire(0, 1), at(5_000)).await;
    assert_eq!(
        store.next_due_at(at(5_000)).await.expect("due"),
        Some(at(6_000))
    );
}
