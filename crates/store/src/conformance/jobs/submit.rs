//! Submitting jobs: every field survives the store, idempotency keys (resubmits, conflicts and
//! all-or-nothing batches) and the submitter kept with a job.

use super::*;

// Proves every job and step field survives the store, through submit, claim, fail and complete;
// the keyed job heads its key, so the submit answers it started, with both histories.
pub async fn submit_and_get_round_trip(f: &Fixture) {
    let store = &*f.store;
    let full = spec(json!({
        "idempotency_key": "round-trip",
        "labels": {"team": "pay", "env": "prod"},
        "priority": 7,
        "ordering_key": "account-1",
        "callback_url": "https://example.invalid/callback",
        "on_failure": "hold",
        "steps": [
            {"name": "charge", "agent": "billing",
             "payload": {"amount": 1250, "currency": "EUR", "tags": ["a", null, true], "rate": 0.25},
             "timeout": "1500ms", "max_attempts": 3,
             "backoff": {"initial": "250ms", "factor": 1.5, "max": "10s"},
             "compensate": {"agent": "billing", "payload": {"refund": true}}},
            {"name": "ship", "agent": "warehouse", "depends_on": ["charge"], "max_attempts": 0},
            {"name": "notify", "agent": "mail", "depends_on": ["charge", "ship"]}
        ]
    }));
    let later = spec(json!({"run_at": at(60_000), "steps": [{"name": "s", "agent": "billing"}]}));
    let (id, later_id) = (job_id(1), job_id(2));
    let batch = vec![
        admitted(id, &full, at(0)),
        admitted(later_id, &later, at(0)),
    ];
    // The keyed job is admitted pending and started by the store in the same transaction.
    let activation =
        overseer_core::apply(&batch[0].transition.job, Command::Activate, at(0)).expect("activate");
    let mut history = batch[0].transition.events.clone();
    history.extend(activation.events.clone());
    let expected: Vec<Job> = vec![activation.job.clone(), batch[1].transition.job.clone()];
    let submitted = store.jobs_submit(batch.clone()).await.expect("submit");
    assert_eq!(submitted.len(), 2);
    for (s, want) in submitted.iter().zip(&expected) {
        match s {
            Submitted::Created(t) => assert_eq!(&t.job, want),
            other => panic!("expected created, got {other:?}"),
        }
    }
    match &submitted[0] {
        Submitted::Created(t) => {
            assert_eq!(t.events, history);
            let mut effects = batch[0].transition.effects.clone();
            effects.extend(activation.effects.clone());
            assert_eq!(t.effects, effects);
        }
        other => panic!("expected created, got {other:?}"),
    }
    assert_eq!(get(store, id).await, expected[0]);
    assert_eq!(get(store, id).await.state, JobState::Running);
    assert_eq!(get(store, later_id).await, expected[1]);
    assert_eq!(get(store, later_id).await.state, JobState::Pending);

    let events = all_events(store, id).await;
    assert_eq!(events.len(), history.len());
    for (i, (got, want)) in events.iter().zip(&history).enumerate() {
        assert_eq!(got.seq, i as i64 + 1);
        assert_eq!(got.at, want.at);
        assert_eq!(got.kind, want.kind);
        assert_eq!(got.step, want.step);
        assert_eq!(got.attempt, want.attempt);
        assert_eq!(got.detail, want.detail);
    }

    let leased = claim(store, "billing", 1, 1, at(10)).await;
    assert_eq!(leased.len(), 1);
    assert_eq!(get(store, id).await, leased[0].transition.job);

    let failed = apply(
        store,
        id,
        Command::Fail {
            step: 0,
            attempt: 1,
            error: "card declined".into(),
            retryable: true,
            jitter: 0.0,
        },
        at(20),
    )
    .await;
    assert_eq!(get(store, id).await, failed.job);
    let retry_at = failed.job.steps[0]
        .next_attempt_at
        .expect("retry scheduled");

    let again = claim(store, "billing", 1, 2, retry_at).await;
    assert_eq!(again.len(), 1);
    let result = json!({"receipt": "r-1", "amount": 12.5, "lines": [1, 2, 3]});
    let done = apply(
        store,
        id,
        Command::Complete {
            step: 0,
            attempt: 2,
            result: result.clone(),
        },
        retry_at.plus(overseer_core::Span::from_millis(5)),
    )
    .await;
    let stored = get(store, id).await;
    assert_eq!(stored, done.job);
    assert_eq!(stored.steps[0].result, Some(result));
    assert_eq!(stored.steps[0].last_error.as_deref(), Some("card declined"));
    assert_eq!(stored.steps[1].state, StepState::Ready);
}

// Proves a resubmit with the same key and body returns the stored job, a different body is a
// conflict, and a batch with a conflict stores nothing at all, duplicates inside it included.
pub async fn idempotent_resubmit_and_conflicts(f: &Fixture) {
    let store = &*f.store;
    let keyed = |key: &str, v: i64| {
        spec(
            json!({"idempotency_key": key, "steps": [{"name": "s", "agent": "w", "payload": {"v": v}}]}),
        )
    };
    let first = submit(store, admitted(job_id(1), &keyed("order-1", 1), at(0))).await;

    let resubmitted = store
        .jobs_submit(vec![admitted(job_id(2), &keyed("order-1", 1), at(5))])
        .await
        .expect("resubmit");
    match resubmitted.as_slice() {
        [Submitted::Existing(job)] => assert_eq!(job, &first.job),
        other => panic!("expected the existing job, got {other:?}"),
    }
    assert!(store.job_get(job_id(2)).await.expect("get").is_none());

    match store
        .jobs_submit(vec![admitted(job_id(3), &keyed("order-1", 2), at(5))])
        .await
    {
        Err(Error::IdempotencyConflict {
            index,
            key,
            existing,
        }) => {
            assert_eq!((index, key.as_str(), existing), (0, "order-1", job_id(1)));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }

    // A fresh job followed by a conflicting one: the fresh one must not be stored either.
    let batch = vec![
        admitted(job_id(4), &keyed("order-2", 1), at(6)),
        admitted(job_id(5), &keyed("order-1", 3), at(6)),
    ];
    match store.jobs_submit(batch).await {
        Err(Error::IdempotencyConflict {
            index: 1, existing, ..
        }) => assert_eq!(existing, job_id(1)),
        other => panic!("expected a conflict at index 1, got {other:?}"),
    }
    assert!(store.job_get(job_id(4)).await.expect("get").is_none());
    assert!(store.job_get(job_id(5)).await.expect("get").is_none());

    // The same key twice in one batch: same body is the first job, another body a conflict.
    let twice = store
        .jobs_submit(vec![
            admitted(job_id(6), &keyed("order-3", 1), at(7)),
            admitted(job_id(7), &keyed("order-3", 1), at(7)),
        ])
        .await
        .expect("batch with a repeated key");
    match twice.as_slice() {
        [Submitted::Created(t), Submitted::Existing(j)] => {
            assert_eq!(t.job.id, job_id(6));
            assert_eq!(j, &t.job);
        }
        other => panic!("expected created then existing, got {other:?}"),
    }
    let clash = vec![
        admitted(job_id(8), &keyed("order-4", 1), at(8)),
        admitted(job_id(9), &keyed("order-4", 2), at(8)),
    ];
    match store.jobs_submit(clash).await {
        Err(Error::IdempotencyConflict {
            index: 1, existing, ..
        }) => assert_eq!(existing, job_id(8)),
        other => panic!("expected a conflict at index 1, got {other:?}"),
    }
    assert!(store.job_get(job_id(8)).await.expect("get").is_none());

    // The key of the rolled-back batch is still free.
    submit(store, admitted(job_id(4), &keyed("order-2", 1), at(9))).await;
    let all = store
        .jobs_list(JobQuery {
            limit: 100,
            ..JobQuery::default()
        })
        .await
        .expect("list");
    assert_eq!(ids(&all), vec![job_id(6), job_id(4), job_id(1)]);
    assert_eq!(all_events(store, job_id(1)).await.len(), first.events.len());

    // Jobs without a key around a repeated one (PostgreSQL inserts a batch without any key
    // another way): both stored, the repeat answered with the stored job.
    let plain = spec(json!({"steps": [{"name": "s", "agent": "w"}]}));
    let mixed = store
        .jobs_submit(vec![
            admitted(job_id(10), &plain, at(10)),
            admitted(job_id(11), &keyed("order-1", 1), at(10)),
            admitted(job_id(12), &plain, at(10)),
        ])
        .await
        .expect("a batch with and without keys");
    match mixed.as_slice() {
        [Submitted::Created(a), Submitted::Existing(j), Submitted::Created(b)] => {
            assert_eq!(
                (a.job.id, j.id, b.job.id),
                (job_id(10), job_id(1), job_id(12))
            );
        }
        other => panic!("expected created, existing, created; got {other:?}"),
    }
    assert!(store.job_get(job_id(11)).await.expect("get").is_none());
    assert!(store.job_get(job_id(12)).await.expect("get").is_some());
}

// Proves the submitter is kept with a job (the job reads back with it, also after a change of
// state) and that a list filtered by it returns only that submitter's jobs, newest first; a job
// without a submitter matches no such filter.
pub async fn submitted_by_is_kept_and_filters_the_list(f: &Fixture) {
    let store = &*f.store;
    let job = spec(json!({"steps": [{"name": "s", "agent": "a"}]}));
    let by = |n: u64, who: Option<&str>| {
        let mut new = admitted(job_id(n), &job, at(n as i64));
        new.transition.job.submitted_by = who.map(str::to_string);
        new
    };
    store
        .jobs_submit(vec![
            by(1, Some("ci")),
            by(2, Some("other")),
            by(3, None),
            by(4, Some("ci")),
        ])
        .await
        .expect("submit");
    assert_eq!(
        get(store, job_id(1)).await.submitted_by.as_deref(),
        Some("ci")
    );
    assert_eq!(get(store, job_id(3)).await.submitted_by, None);
    let list = |who: &str| {
        store.jobs_list(JobQuery {
            limit: 10,
            submitted_by: Some(who.to_string()),
            ..JobQuery::default()
        })
    };
    let ids: Vec<JobId> = list("ci")
        .await
        .expect("list")
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, vec![job_id(4), job_id(1)]);
    let others = list("other").await.expect("list");
    assert_eq!(others.len(), 1);
    assert_eq!(others[0].submitted_by.as_deref(), Some("other"));
    assert!(list("nobody").await.expect("list").is_empty());
    // A change of state keeps it.
    apply(store, job_id(1), Command::Cancel, at(10)).await;
    assert_eq!(
        get(store, job_id(1)).await.submitted_by.as_deref(),
        Some("ci")
    );
}
