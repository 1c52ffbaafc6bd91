//! The leader lease and the fence on the supervisor's writes.

use super::*;

// Proves the leader lease: taken when free (epoch 1), renewed by its holder (same epoch), refused
// to others until it expires, then taken with the next epoch; a release by a stale holder does
// nothing, by the holder it frees the lease at once keeping the epoch.
pub async fn leader_lease_changes_hands_with_epochs(f: &Fixture) {
    let store = &*f.store;
    let ttl = overseer_core::Span::from_secs(10);
    let lease = |node: &str, epoch: i64, expires: Timestamp| Leadership {
        node: node.into(),
        epoch,
        expires_at: expires,
    };
    assert_eq!(store.leader_get().await.expect("get"), None);
    let acquire = |node: &'static str, now: Timestamp| {
        store.leader_acquire(LeaderBid {
            node: node.to_string(),
            ttl,
            now,
        })
    };

    assert_eq!(
        acquire("a", at(0)).await.expect("a"),
        Some(lease("a", 1, at(10_000)))
    );
    assert_eq!(acquire("b", at(5_000)).await.expect("b"), None);
    assert_eq!(
        acquire("a", at(5_000)).await.expect("renew"),
        Some(lease("a", 1, at(15_000)))
    );
    assert_eq!(acquire("b", at(14_999)).await.expect("b"), None);
    assert_eq!(
        acquire("b", at(15_000)).await.expect("steal"),
        Some(lease("b", 2, at(25_000)))
    );
    assert_eq!(acquire("a", at(16_000)).await.expect("a"), None);
    assert_eq!(
        store.leader_get().await.expect("get"),
        Some(lease("b", 2, at(25_000)))
    );

    store
        .leader_release(&Fence {
            node: "a".to_string(),
            epoch: 1,
        })
        .await
        .expect("stale release");
    store
        .leader_release(&Fence {
            node: "b".to_string(),
            epoch: 1,
        })
        .await
        .expect("wrong epoch");
    assert_eq!(
        store.leader_get().await.expect("get"),
        Some(lease("b", 2, at(25_000)))
    );
    store
        .leader_release(&Fence {
            node: "b".to_string(),
            epoch: 2,
        })
        .await
        .expect("release");
    let released = store.leader_get().await.expect("get").expect("lease row");
    assert_eq!((released.node.as_str(), released.epoch), ("b", 2));
    assert!(released.expires_at <= at(17_000), "released at once");
    assert_eq!(
        acquire("a", at(17_000)).await.expect("a"),
        Some(lease("a", 3, at(27_000)))
    );
    // Even its last holder takes an expired lease with a new epoch.
    assert_eq!(
        acquire("a", at(27_000)).await.expect("a"),
        Some(lease("a", 4, at(37_000)))
    );
}

// Proves a fenced `job_apply` writes only under the current, unexpired lease: refused after its
// expiry and after another node took over, with nothing written; the new leader's fence works.
pub async fn fenced_apply_is_refused_after_a_takeover(f: &Fixture) {
    let store = &*f.store;
    let ttl = overseer_core::Span::from_secs(10);
    let id = job_id(1);
    let delayed = spec(json!({"run_at": at(500), "steps": [{"name": "s", "agent": "w"}]}));
    let admitted_job = submit(store, admitted(id, &delayed, at(0))).await.job;
    let history = all_events(store, id).await;

    let a = store
        .leader_acquire(LeaderBid {
            node: "a".to_string(),
            ttl,
            now: at(0),
        })
        .await
        .expect("a")
        .expect("lead");
    let a = Fence {
        node: a.node,
        epoch: a.epoch,
    };
    let refused = |r: Result<Transition>, epoch: i64, what: &str| match r {
        Err(Error::Fenced { epoch: e }) => assert_eq!(e, epoch, "{what}"),
        other => panic!("{what}: expected Fenced, got {other:?}"),
    };
    refused(
        store
            .job_apply(Apply::new(id, Command::Activate, at(10_000)).fenced(&a))
            .await,
        1,
        "the lease expired at 10 s",
    );
    let b = store
        .leader_acquire(LeaderBid {
            node: "b".to_string(),
            ttl,
            now: at(10_000),
        })
        .await
        .expect("b")
        .expect("lead");
    let b = Fence {
        node: b.node,
        epoch: b.epoch,
    };
    assert_eq!(b.epoch, 2);
    refused(
        store
            .job_apply(Apply::new(id, Command::Activate, at(10_001)).fenced(&a))
            .await,
        1,
        "another node took over",
    );
    assert_eq!(get(store, id).await, admitted_job, "nothing written");
    assert_eq!(all_events(store, id).await, history);

    let t = store
        .job_apply(Apply::new(id, Command::Activate, at(10_002)).fenced(&b))
        .await
        .expect("the current leader writes");
    assert_eq!(t.job.state, JobState::Running);
    assert_eq!(get(store, id).await, t.job);
    // The core's own rules still apply behind the fence.
    match store
        .job_apply(Apply::new(id, Command::Activate, at(10_003)).fenced(&b))
        .await
    {
        Err(Error::Rejected(Rejection::NotDue)) => {}
        other => panic!("expected NotDue, got {other:?}"),
    }
}
