//! Undo leases of compensating jobs: claimed by the compensate agent alone, fenced, expiring and
//! woken again after their backoff.

use super::*;

// Proves a compensating job's undo is claimable by its compensate agent alone, with the step's
// attempt bumped, counted under that agent, and fenced: a report for the superseded work
// attempt is rejected and changes nothing.
pub async fn undo_is_claimed_by_its_compensate_agent(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let failed = run_until_b_fails(store, id, &undoable("compensate", json!({})), 1).await;
    assert_eq!(failed.job.state, JobState::Compensating);
    assert_eq!(failed.job.steps[0].comp_phase, Some(CompPhase::Ready));
    assert_eq!(get(store, id).await, failed.job);
    assert_eq!(
        store.agents_counts().await.expect("counts"),
        vec![AgentCounts {
            agent: "undo".into(),
            ready: 1,
            running: 0
        }]
    );

    assert!(claim(store, "w", 5, 10, at(50)).await.is_empty());
    let undo = claim(store, "undo", 5, 11, at(50)).await;
    assert_eq!(undo.len(), 1);
    assert_eq!((claimed_jobs(&undo), undo[0].step), (vec![id], 0));
    let s = &undo[0].transition.job.steps[0];
    assert_eq!(s.attempt, 2, "the undo's lease bumps the step's attempt");
    assert_eq!(
        (s.state, s.comp_phase, s.comp_attempts),
        (StepState::Compensating, Some(CompPhase::Running), 1)
    );
    assert_eq!(s.lease_id, Some(lease_id(11)));
    assert_eq!(s.worker.as_deref(), Some("undo-worker"));
    assert_eq!(get(store, id).await, undo[0].transition.job);
    assert!(claim(store, "undo", 5, 12, at(51)).await.is_empty());
    assert_eq!(
        store.agents_counts().await.expect("counts"),
        vec![AgentCounts {
            agent: "undo".into(),
            ready: 0,
            running: 1
        }]
    );
    assert_eq!(
        store.lease_find(lease_id(11)).await.expect("find"),
        Some(LeaseRef {
            lease_id: lease_id(11),
            job_id: id,
            step: 0,
            attempt: 2
        })
    );

    let before = get(store, id).await;
    let history = all_events(store, id).await;
    match store
        .job_apply(Apply::new(id, complete(0, 1, json!("stale")), at(60)))
        .await
    {
        Err(Error::Rejected(Rejection::LeaseLost { .. })) => {}
        other => panic!("expected LeaseLost for the superseded attempt, got {other:?}"),
    }
    assert_eq!(get(store, id).await, before);
    assert_eq!(all_events(store, id).await, history);

    let undone = apply(store, id, complete(0, 2, json!("refunded")), at(70)).await;
    assert_eq!(undone.job.state, JobState::Failed);
    assert_eq!(undone.job.steps[0].state, StepState::Compensated);
    assert_eq!(get(store, id).await, undone.job);
    assert!(store.agents_counts().await.expect("counts").is_empty());
}

// Proves an undo's lease is found by `leases_expired` from its expiry on (its own timeout), and
// that once the undo's backoff ends `agents_due` names the compensate agent, `next_due_at` points
// at it, and only then may it be claimed.
pub async fn undo_leases_expire_and_backoff_wakes_the_compensate_agent(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = undoable(
        "compensate",
        json!({"backoff": {"initial": "2s", "factor": 1, "max": "2s"},
               "compensate": {"agent": "undo", "timeout": "1s", "max_attempts": 3}}),
    );
    run_until_b_fails(store, id, &s, 1).await;
    let undo = claim(store, "undo", 1, 10, at(50)).await;
    assert_eq!(undo.len(), 1);
    assert_eq!(
        undo[0].transition.job.steps[0].lease_expires_at,
        Some(at(1_050))
    );
    assert_eq!(
        store.next_due_at(at(50)).await.expect("due"),
        Some(at(1_050))
    );

    assert!(store
        .leases_expired(Due {
            now: at(1_049),
            limit: 10,
        })
        .await
        .expect("expired")
        .is_empty());
    let lease = LeaseRef {
        lease_id: lease_id(10),
        job_id: id,
        step: 0,
        attempt: 2,
    };
    assert_eq!(
        store
            .leases_expired(Due {
                now: at(1_050),
                limit: 10,
            })
            .await
            .expect("expired"),
        vec![lease]
    );

    let expired = expire(0, 2);
    let t = apply(store, id, expired, at(1_050)).await;
    let stored = get(store, id).await;
    assert_eq!(stored, t.job);
    let step = &stored.steps[0];
    assert_eq!(
        (step.comp_phase, step.comp_failures, step.next_attempt_at),
        (Some(CompPhase::Ready), 1, Some(at(3_050)))
    );
    assert!(store
        .leases_expired(Due {
            now: at(10_000),
            limit: 10,
        })
        .await
        .expect("expired")
        .is_empty());
    assert_eq!(
        store.next_due_at(at(1_050)).await.expect("due"),
        Some(at(3_050))
    );

    assert!(store
        .agents_due(DueBetween {
            after: at(1_050),
            until: at(3_049),
        })
        .await
        .expect("agents")
        .is_empty());
    assert_eq!(
        store
            .agents_due(DueBetween {
                after: at(3_049),
                until: at(3_050),
            })
            .await
            .expect("agents"),
        vec!["undo".to_string()]
    );
    assert!(claim(store, "undo", 1, 11, at(3_049)).await.is_empty());
    let again = claim(store, "undo", 1, 12, at(3_050)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].transition.job.steps[0].attempt, 3);
    assert_eq!(again[0].transition.job.steps[0].comp_attempts, 2);
}
