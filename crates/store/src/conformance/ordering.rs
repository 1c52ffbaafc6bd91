//! Ordering keys: one job of a key at a time, in submission order.

use super::*;

// Proves jobs of one key run one at a time: the first starts at submit, the second waits
// (pending, not due, no wake-up) while the first runs, and starts in the very transaction that
// finishes the first (no sweep needed), whose answer carries the wake-up for its agent.
pub async fn ordering_key_runs_one_job_at_a_time(f: &Fixture) {
    let store = &*f.store;
    let (first, second) = (job_id(1), job_id(2));
    let started = submit(store, admitted(first, &keyed("acct", "ok"), at(0))).await;
    assert_eq!(started.job.state, JobState::Running);
    assert_eq!(started.job.steps[0].state, StepState::Ready);
    let waiting = submit(store, admitted(second, &keyed("acct", "ok"), at(10))).await;
    assert_eq!(waiting.job.state, JobState::Pending);
    assert_eq!(get(store, second).await, waiting.job);

    assert!(store
        .jobs_due(Due {
            now: at(1_000),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    assert_eq!(store.next_due_at(at(1_000)).await.expect("next"), None);
    // Even a stray `Activate` cannot start it while the head is unfinished.
    match store
        .job_apply(Apply::new(second, Command::Activate, at(1_000)))
        .await
    {
        Err(Error::Rejected(Rejection::NotDue)) => {}
        other => panic!("expected NotDue, got {other:?}"),
    }
    assert_eq!(get(store, second).await, waiting.job);
    let status = store.ordering_key_status("acct").await.expect("status");
    assert_eq!(status.key, "acct");
    assert_eq!(status.head.map(|j| j.id), Some(first));
    assert_eq!(status.waiting, 1);

    let done = run_to_success(store, first, "ok", 1, at(2_000)).await;
    assert!(
        done.effects.contains(&Effect::Ready { agent: "ok".into() }),
        "the finishing answer wakes the next job's agent: {:?}",
        done.effects
    );
    let status = store.ordering_key_status("acct").await.expect("status");
    assert_eq!(
        status.head.as_ref().map(|j| (j.id, j.state)),
        Some((second, JobState::Running))
    );
    assert_eq!(status.waiting, 0);
    let started = get(store, second).await;
    assert_eq!(started.steps[0].state, StepState::Ready);
    assert_eq!(started.steps[0].ready_at, Some(at(2_000)));
    assert!(store
        .jobs_due(Due {
            now: at(3_000),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    assert_eq!(
        claimed_jobs(&claim(store, "ok", 1, 2, at(2_000)).await),
        vec![second]
    );

    let unknown = store.ordering_key_status("nobody").await.expect("status");
    assert_eq!(
        unknown,
        OrderingKeyStatus {
            key: "nobody".into(),
            head: None,
            waiting: 0
        }
    );
}

// Proves a blocked head (on_failure hold) holds its own key only: the job behind it is not due,
// while a delayed job of another key comes due.
pub async fn blocked_head_holds_only_its_key(f: &Fixture) {
    let store = &*f.store;
    let (head, behind, other) = (job_id(1), job_id(2), job_id(3));
    let fragile = spec(json!({"ordering_key": "k1", "on_failure": "hold",
        "steps": [{"name": "s", "agent": "bh", "max_attempts": 1}]}));
    submit(store, admitted(head, &fragile, at(0))).await;
    submit(store, admitted(behind, &keyed("k1", "bh"), at(1))).await;
    let delayed = spec(json!({"ordering_key": "k2", "run_at": at(500),
        "steps": [{"name": "s", "agent": "bh"}]}));
    let t = submit(store, admitted(other, &delayed, at(2))).await;
    assert_eq!(
        t.job.state,
        JobState::Pending,
        "a head waits for its run_at"
    );
    assert!(store
        .jobs_due(Due {
            now: at(499),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    assert_eq!(
        store.next_due_at(at(100)).await.expect("next"),
        Some(at(500))
    );

    let got = claim(store, "bh", 1, 1, at(100)).await;
    assert_eq!(claimed_jobs(&got), vec![head]);
    let blocked = apply(store, head, fatal(0, 1, "poisoned"), at(200)).await;
    assert_eq!(blocked.job.state, JobState::Blocked);

    assert_eq!(
        store
            .jobs_due(Due {
                now: at(1_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![other]
    );
    let k1 = store.ordering_key_status("k1").await.expect("status");
    assert_eq!(
        k1.head.map(|j| (j.id, j.state)),
        Some((head, JobState::Blocked))
    );
    assert_eq!(k1.waiting, 1);
    assert_eq!(get(store, behind).await.state, JobState::Pending);
}

// Proves a key's jobs run in submission order, not id or time order: five jobs submitted with
// falling ids at one instant (two in one batch) each head the key in turn, each started by the
// completion of the one before it.
pub async fn ordering_key_keeps_submission_order(f: &Fixture) {
    let store = &*f.store;
    let order: Vec<JobId> = (1..=5).rev().map(job_id).collect();
    let spec = keyed("seq", "so");
    let first_two = store
        .jobs_submit(vec![
            admitted(order[0], &spec, at(0)),
            admitted(order[1], &spec, at(0)),
        ])
        .await
        .expect("submit");
    let states: Vec<JobState> = first_two
        .iter()
        .map(|s| match s {
            Submitted::Created(t) => t.job.state,
            other => panic!("expected created, got {other:?}"),
        })
        .collect();
    assert_eq!(states, vec![JobState::Running, JobState::Pending]);
    for &id in &order[2..] {
        let t = submit(store, admitted(id, &spec, at(0))).await;
        assert_eq!(t.job.state, JobState::Pending);
    }

    for (i, &id) in order.iter().enumerate() {
        let now = at(1_000 * (i as i64 + 1));
        let status = store.ordering_key_status("seq").await.expect("status");
        assert_eq!(status.head.as_ref().map(|j| j.id), Some(id), "turn {i}");
        assert_eq!(status.waiting, (order.len() - i - 1) as u64);
        assert_eq!(get(store, id).await.state, JobState::Running, "turn {i}");
        assert!(store
            .jobs_due(Due { now, limit: 10 })
            .await
            .expect("due")
            .is_empty());
        run_to_success(store, id, "so", 10 + i as u128, now).await;
    }
    let done = store.ordering_key_status("seq").await.expect("status");
    assert_eq!((done.head, done.waiting), (None, 0));
}

// Proves a batch's jobs are numbered in the batch's order, whatever their ids: a key's 24 jobs
// submitted in one batch with falling ids each head the key in turn, in a batch without
// idempotency keys and in one with them (PostgreSQL inserts each with its own statement).
pub async fn a_batch_is_numbered_in_its_order(f: &Fixture) {
    let store = &*f.store;
    for (round, key) in [(1u64, "plain"), (2, "idem")] {
        let order: Vec<JobId> = (1..=24).rev().map(|n| job_id(round * 100 + n)).collect();
        let batch = order
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let mut body = json!({"ordering_key": key, "steps": [{"name": "s", "agent": key}]});
                if key == "idem" {
                    body["idempotency_key"] = json!(format!("{key}-{i}"));
                }
                admitted(id, &spec(body), at(0))
            })
            .collect();
        store.jobs_submit(batch).await.expect("submit");
        for (i, &id) in order.iter().enumerate() {
            let status = store.ordering_key_status(key).await.expect("status");
            assert_eq!(
                status.head.as_ref().map(|j| j.id),
                Some(id),
                "{key}: turn {i}"
            );
            let now = at(1_000 * (i as i64 + 1));
            run_to_success(store, id, key, u128::from(round) * 1_000 + i as u128, now).await;
        }
    }
}

// Proves the next job of a key starts in the transaction that finishes the head, whichever way
// it finishes (a fatal failure, a cancel), and that a next job whose `run_at` is still ahead is
// left pending for the timer instead.
pub async fn every_way_a_head_finishes_starts_the_next(f: &Fixture) {
    let store = &*f.store;
    let (failing, cancelled, delayed) = (job_id(1), job_id(2), job_id(3));
    let one_try = spec(json!({"ordering_key": "fin", "on_failure": "fail",
        "steps": [{"name": "s", "agent": "fin", "max_attempts": 1}]}));
    submit(store, admitted(failing, &one_try, at(0))).await;
    submit(store, admitted(cancelled, &keyed("fin", "fin"), at(1))).await;
    let later = spec(json!({"ordering_key": "fin", "run_at": at(9_000),
        "steps": [{"name": "s", "agent": "fin"}]}));
    submit(store, admitted(delayed, &later, at(2))).await;

    let got = claim(store, "fin", 1, 1, at(100)).await;
    assert_eq!(claimed_jobs(&got), vec![failing]);
    let failed = apply(store, failing, fatal(0, 1, "no"), at(200)).await;
    assert_eq!(failed.job.state, JobState::Failed);
    assert_eq!(get(store, cancelled).await.state, JobState::Running);

    let t = apply(store, cancelled, Command::Cancel, at(300)).await;
    assert_eq!(t.job.state, JobState::Cancelled);
    assert_eq!(
        get(store, delayed).await.state,
        JobState::Pending,
        "not before its run_at"
    );
    assert_eq!(
        store.next_due_at(at(300)).await.expect("next"),
        Some(at(9_000))
    );
    assert_eq!(
        store
            .jobs_due(Due {
                now: at(9_000),
                limit: 10,
            })
            .await
            .expect("due"),
        vec![delayed]
    );
}
