//! Taking jobs out of the store: `jobs_delete` and `job_replace`.

use super::*;

// Proves `jobs_delete` removes exactly the jobs in the given states holding no live lease, with
// their labels and history, skips missing, leased and other-state jobs, and frees their keys.
pub async fn jobs_delete_removes_only_unleased_jobs_in_the_given_states(f: &Fixture) {
    let store = &*f.store;
    let keyed = |n: u64| {
        spec(
            json!({"idempotency_key": format!("k{n}"), "labels": {"set": "x"},
            "steps": [{"name": "s", "agent": "a"}]}),
        )
    };
    for n in 1..=3 {
        submit(store, admitted(job_id(n), &keyed(n), at(0))).await;
    }
    let later = spec(json!({"run_at": at(60_000), "steps": [{"name": "s", "agent": "a"}]}));
    submit(store, admitted(job_id(4), &later, at(0))).await;
    // Job 1 is leased; job 2 and 3 stay ready; job 4 is pending.
    let leased = claim(store, "a", 1, 1, at(1)).await;
    assert_eq!(claimed_jobs(&leased), vec![job_id(1)]);

    let deleted = store
        .jobs_delete(Removal {
            ids: vec![job_id(1), job_id(2), job_id(4), job_id(99)],
            states: vec![JobState::Running],
        })
        .await
        .expect("delete");
    assert_eq!(
        deleted,
        vec![job_id(2)],
        "leased, pending and missing jobs stay"
    );
    assert!(store.job_get(job_id(2)).await.expect("get").is_none());
    assert!(matches!(
        store
            .job_events(EventPage {
                job: job_id(2),
                after_seq: 0,
                limit: 10,
            })
            .await,
        Err(Error::JobNotFound(_))
    ));
    let listed = store
        .jobs_list(JobQuery {
            labels: vec![("set".into(), "x".into())],
            limit: 10,
            ..JobQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(ids(&listed), vec![job_id(3), job_id(1)]);
    // Its ready step is gone from claims and counts: only job 3 is left to claim.
    let next = claim(store, "a", 5, 10, at(2)).await;
    assert_eq!(claimed_jobs(&next), vec![job_id(3)]);

    // Pending and finished jobs go when their state is named; the key is free again.
    let done = Command::Complete {
        step: 0,
        attempt: 1,
        result: Value::Null,
    };
    apply(store, job_id(3), done, at(3)).await;
    let deleted = store
        .jobs_delete(Removal {
            ids: vec![job_id(3), job_id(4), job_id(1)],
            states: vec![JobState::Pending, JobState::Succeeded, JobState::Failed],
        })
        .await
        .expect("delete");
    assert_eq!(deleted, vec![job_id(3), job_id(4)]);
    let lease3 = next[0].transition.job.steps[0]
        .lease_id
        .expect("job 3 was leased");
    assert_eq!(
        store.lease_find(lease3).await.expect("find"),
        None,
        "a deleted job's leases go with it"
    );
    assert_eq!(
        store.next_due_at(at(4)).await.expect("next due"),
        get(store, job_id(1)).await.steps[0].lease_expires_at,
        "the deleted pending job no longer makes the supervisor wake up"
    );
    submit(store, admitted(job_id(5), &keyed(3), at(5))).await;
    assert!(store
        .jobs_delete(Removal {
            ids: Vec::new(),
            states: vec![JobState::Running],
        })
        .await
        .expect("nothing")
        .is_empty());
}

// Proves `job_replace` swaps an unleased job for a new one under the same idempotency key in one
// step, refuses (writing nothing) when the old job is leased, missing or in another state, and
// rolls the delete back when the new key belongs to a third job.
pub async fn job_replace_starts_a_job_over_under_the_same_key(f: &Fixture) {
    let store = &*f.store;
    let body = |payload: i64| {
        spec(
            json!({"idempotency_key": "same", "steps": [{"name": "s", "agent": "a",
            "payload": payload, "max_attempts": 1}]}),
        )
    };
    submit(store, admitted(job_id(1), &body(1), at(0))).await;
    let c = claim(store, "a", 1, 1, at(1)).await;
    assert_eq!(claimed_jobs(&c), vec![job_id(1)]);
    // Leased: not replaceable.
    let refused = store
        .job_replace(Replacement {
            old: job_id(1),
            states: vec![JobState::Running],
            new: admitted(job_id(2), &body(2), at(2)),
        })
        .await
        .expect("replace");
    assert!(refused.is_none());
    assert!(store.job_get(job_id(2)).await.expect("get").is_none());
    apply(store, job_id(1), fatal(0, 1, "boom"), at(3)).await;
    assert_eq!(get(store, job_id(1)).await.state, JobState::Failed);
    // Wrong expected state: nothing written.
    let refused = store
        .job_replace(Replacement {
            old: job_id(1),
            states: vec![JobState::Running],
            new: admitted(job_id(2), &body(2), at(4)),
        })
        .await
        .expect("replace");
    assert!(refused.is_none());
    assert_eq!(get(store, job_id(1)).await.state, JobState::Failed);

    // The failed job starts over as job 2, under the same key, ready at once.
    let t = store
        .job_replace(Replacement {
            old: job_id(1),
            states: vec![JobState::Failed],
            new: admitted(job_id(2), &body(2), at(5)),
        })
        .await
        .expect("replace")
        .expect("replaced");
    assert_eq!(t.job.id, job_id(2));
    assert!(store.job_get(job_id(1)).await.expect("get").is_none());
    let again = claim(store, "a", 1, 2, at(6)).await;
    assert_eq!(claimed_jobs(&again), vec![job_id(2)]);
    assert_eq!(again[0].transition.job.steps[0].payload, json!(2));
    // The same key submitted again finds the replacement.
    match store
        .jobs_submit(vec![admitted(job_id(3), &body(2), at(7))])
        .await
        .expect("resubmit")
        .pop()
    {
        Some(Submitted::Existing(j)) => assert_eq!(j.id, job_id(2)),
        other => panic!("expected the replacement, got {other:?}"),
    }

    // A replacement whose key a third job holds is refused and the old job stays.
    let other = spec(json!({"idempotency_key": "other", "steps": [{"name": "s", "agent": "b"}]}));
    submit(store, admitted(job_id(4), &other, at(8))).await;
    let taken = spec(json!({"idempotency_key": "same", "steps": [{"name": "s", "agent": "b"}]}));
    let err = store
        .job_replace(Replacement {
            old: job_id(4),
            states: vec![JobState::Running],
            new: admitted(job_id(5), &taken, at(9)),
        })
        .await
        .expect_err("key taken");
    assert!(matches!(err, Error::IdempotencyConflict { .. }), "{err:?}");
    assert_eq!(get(store, job_id(4)).await.state, JobState::Running);
    assert!(store.job_get(job_id(5)).await.expect("get").is_none());
    assert!(store
        .job_replace(Replacement {
            old: job_id(99),
            states: vec![JobState::Running],
            new: admitted(job_id(6), &other, at(10)),
        })
        .await
        .expect("missing")
        .is_none());
}
