//! Jobs: submit, read, list, apply, due and active jobs, removal and replacement.

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
}

// Proves the list's other filters on both stores: an id range (what a job-id prefix maps to),
// jobs having a step of one agent name, and a creation-time window, alone and together.
pub async fn list_filters_by_id_prefix_agent_and_creation_time(f: &Fixture) {
    let store = &*f.store;
    let batch: Vec<NewJob> = (1..=20u64)
        .map(|n| {
            let agent = if n % 2 == 0 { "even" } else { "odd" };
            let body =
                json!({"steps": [{"name": "s", "agent": "other"}, {"name": "t", "agent": agent}]});
            admitted(job_id(n), &spec(body), at(n as i64 * 100))
        })
        .collect();
    store.jobs_submit(batch).await.expect("submit");
    let list = |q: JobQuery| async move {
        let jobs = store
            .jobs_list(JobQuery { limit: 100, ..q })
            .await
            .expect("list");
        jobs.iter().map(|j| j.id).collect::<Vec<_>>()
    };
    let newest_first = |ns: &[u64]| ns.iter().rev().map(|n| job_id(*n)).collect::<Vec<_>>();

    let by_agent = list(JobQuery {
        agent: Some("even".into()),
        ..JobQuery::default()
    })
    .await;
    assert_eq!(
        by_agent,
        newest_first(&[2, 4, 6, 8, 10, 12, 14, 16, 18, 20])
    );
    let window = JobQuery {
        created_from: Some(at(500)),
        created_before: Some(at(1_000)),
        ..JobQuery::default()
    };
    assert_eq!(list(window.clone()).await, newest_first(&[5, 6, 7, 8, 9]));
    let odd_in_window = JobQuery {
        agent: Some("odd".into()),
        ..window
    };
    assert_eq!(list(odd_in_window).await, newest_first(&[5, 7, 9]));

    // job_id(16)…job_id(31) share their first 12 characters (`n` is in the time part too).
    let id = job_id(17).to_string();
    let range = JobId::prefix_range(&id[..12]).expect("a prefix");
    let by_prefix = list(JobQuery {
        ids: Some(range),
        ..JobQuery::default()
    })
    .await;
    assert_eq!(by_prefix, newest_first(&[16, 17, 18, 19, 20]));
    let exact = JobId::prefix_range(&id).expect("a whole id");
    assert_eq!(
        list(JobQuery {
            ids: Some(exact),
            ..JobQuery::default()
        })
        .await,
        vec![job_id(17)]
    );
    assert!(list(JobQuery {
        agent: Some("nobody".into()),
        ..JobQuery::default()
    })
    .await
    .is_empty());
}

// Proves listing filters by state and by every label pair, newest first, and that walking the
// cursor visits every match exactly once.
pub async fn list_filters_and_paginates(f: &Fixture) {
    let store = &*f.store;
    let mut batch = Vec::new();
    for n in 1..=30u64 {
        let mut labels = serde_json::Map::new();
        labels.insert("team".into(), json!(if n % 2 == 0 { "a" } else { "b" }));
        if n % 3 == 0 {
            labels.insert("env".into(), json!("prod"));
        }
        let mut body = json!({"labels": labels, "steps": [{"name": "s", "agent": "w"}]});
        if n % 5 == 0 {
            body["run_at"] = json!(at(1_000_000));
        }
        batch.push(admitted(job_id(n), &spec(body), at(n as i64)));
    }
    store.jobs_submit(batch).await.expect("submit");

    let list = |state: Option<JobState>,
                labels: &[(&str, &str)],
                limit: usize,
                before: Option<JobId>| JobQuery {
        state,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        limit,
        before,
        ..JobQuery::default()
    };
    let expect = |pred: &dyn Fn(u64) -> bool| -> Vec<JobId> {
        (1..=30u64).rev().filter(|n| pred(*n)).map(job_id).collect()
    };

    let pending = store
        .jobs_list(list(Some(JobState::Pending), &[], 100, None))
        .await
        .expect("list");
    assert_eq!(ids(&pending), expect(&|n| n % 5 == 0));
    assert!(pending
        .iter()
        .all(|j| j.state == JobState::Pending && j.steps.len() == 1));
    let running = store
        .jobs_list(list(Some(JobState::Running), &[], 100, None))
        .await
        .expect("list");
    assert_eq!(ids(&running), expect(&|n| n % 5 != 0));
    let team_a = store
        .jobs_list(list(None, &[("team", "a")], 100, None))
        .await
        .expect("list");
    assert_eq!(ids(&team_a), expect(&|n| n % 2 == 0));
    let both = store
        .jobs_list(list(None, &[("team", "a"), ("env", "prod")], 100, None))
        .await
        .expect("list");
    assert_eq!(ids(&both), expect(&|n| n % 6 == 0));
    let mixed = store
        .jobs_list(list(Some(JobState::Pending), &[("team", "a")], 100, None))
        .await
        .expect("list");
    assert_eq!(ids(&mixed), expect(&|n| n % 10 == 0));
    let none = store
        .jobs_list(list(None, &[("team", "c")], 100, None))
        .await
        .expect("list");
    assert!(none.is_empty());
    let wrong_value = store
        .jobs_list(list(None, &[("env", "a")], 100, None))
        .await
        .expect("list");
    assert!(wrong_value.is_empty());

    for (labels, limit, pred) in [
        (vec![], 7, &(|_| true) as &dyn Fn(u64) -> bool),
        (vec![("team", "a")], 4, &|n| n % 2 == 0),
        (vec![("env", "prod")], 5, &|n| n % 3 == 0),
    ] {
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = store
                .jobs_list(list(None, &labels, limit, cursor))
                .await
                .expect("page");
            assert!(page.len() <= limit);
            seen.extend(ids(&page));
            if page.len() < limit {
                break;
            }
            cursor = page.last().map(|j| j.id);
        }
        assert_eq!(seen, expect(pred), "paging {labels:?} by {limit}");
    }
}

// Proves completing a step makes its dependants ready in the same transaction, and completing
// the last one succeeds the job in that same transaction.
pub async fn complete_promotes_dependants_and_finishes_job(f: &Fixture) {
    let store = &*f.store;
    let dag = spec(json!({"steps": [
        {"name": "a", "agent": "w"},
        {"name": "b", "agent": "w", "depends_on": ["a"]},
        {"name": "c", "agent": "v", "depends_on": ["a"]}
    ]}));
    let id = job_id(1);
    submit(store, admitted(id, &dag, at(0))).await;
    let leased = claim(store, "w", 5, 1, at(10)).await;
    assert_eq!(leased.len(), 1, "only `a` is ready");

    let done_a = apply(
        store,
        id,
        Command::Complete {
            step: 0,
            attempt: 1,
            result: json!("A"),
        },
        at(20),
    )
    .await;
    assert_eq!(done_a.changed_steps, vec![0, 1, 2]);
    let stored = get(store, id).await;
    assert_eq!(stored, done_a.job);
    assert_eq!(stored.steps[0].state, StepState::Succeeded);
    assert_eq!(
        [stored.steps[1].state, stored.steps[2].state],
        [StepState::Ready, StepState::Ready]
    );
    assert_eq!(stored.steps[1].ready_at, Some(at(20)));

    let b = claim(store, "w", 5, 10, at(30)).await;
    let c = claim(store, "v", 5, 20, at(30)).await;
    assert_eq!((b.len(), c.len()), (1, 1));
    apply(
        store,
        id,
        Command::Complete {
            step: 1,
            attempt: 1,
            result: json!("B"),
        },
        at(40),
    )
    .await;
    assert_eq!(get(store, id).await.state, JobState::Running);
    let last = apply(
        store,
        id,
        Command::Complete {
            step: 2,
            attempt: 1,
            result: json!("C"),
        },
        at(50),
    )
    .await;
    let stored = get(store, id).await;
    assert_eq!(stored, last.job);
    assert_eq!(stored.state, JobState::Succeeded);
    assert_eq!(stored.finished_at, Some(at(50)));
    let events = all_events(store, id).await;
    assert_eq!(events.last().map(|e| e.kind), Some(EventKind::JobSucceeded));
    assert!(store.agents_counts().await.expect("counts").is_empty());
}

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

// Proves only the newest `history_per_job` events are kept, and sequence numbers keep rising
// after older events are dropped.
pub async fn history_keeps_the_newest_events(f: &Fixture) {
    let store = &*f.store;
    let keep = f.history_per_job;
    assert!(
        (3..=100).contains(&keep),
        "the history case needs a fixture keeping 3..=100 events"
    );
    let steps: Vec<Value> = (0..keep)
        .map(|i| json!({"name": format!("s{i}"), "agent": "h"}))
        .collect();
    let id = job_id(1);
    // Admission writes job_submitted, job_started and one step_ready per step: keep + 2 events.
    submit(store, admitted(id, &spec(json!({ "steps": steps })), at(0))).await;
    let events = all_events(store, id).await;
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (3..=keep as i64 + 2).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.kind == EventKind::StepReady));

    claim(store, "h", 1, 1, at(10)).await;
    let events = all_events(store, id).await;
    assert_eq!(events.len(), keep);
    assert_eq!(events.first().map(|e| e.seq), Some(4));
    let newest = events.last().expect("events");
    assert_eq!(
        (newest.seq, newest.kind),
        (keep as i64 + 3, EventKind::StepLeased)
    );

    let page = store
        .job_events(EventPage {
            job: id,
            after_seq: keep as i64,
            limit: 2,
        })
        .await
        .expect("page");
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![keep as i64 + 1, keep as i64 + 2]
    );
}

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

// Proves unknown ids are answered plainly (none, or not found) and events page by `after_seq`.
pub async fn unknown_ids_and_event_paging(f: &Fixture) {
    let store = &*f.store;
    store.ping().await.expect("ping");
    let ghost = job_id(404);
    assert!(store.job_get(ghost).await.expect("get").is_none());
    assert!(
        matches!(store.job_apply(Apply::new(ghost, Command::Cancel, at(0))).await, Err(Error::JobNotFound(id)) if id == ghost)
    );
    assert!(matches!(store.job_events(EventPage {
 job: ghost,
 after_seq: 0,
 limit: 10,
 }).await, Err(Error::JobNotFound(id)) if id == ghost));
    assert_eq!(store.lease_find(lease_id(404)).await.expect("find"), None);
    assert!(store
        .jobs_submit(Vec::new())
        .await
        .expect("empty submit")
        .is_empty());

    let id = job_id(1);
    submit(store, admitted(id, &one_step("w"), at(0))).await;
    claim(store, "w", 1, 1, at(1)).await;
    apply(
        store,
        id,
        Command::Complete {
            step: 0,
            attempt: 1,
            result: json!(true),
        },
        at(2),
    )
    .await;
    let all = all_events(store, id).await;
    let kinds: Vec<EventKind> = all.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::JobSubmitted,
            EventKind::JobStarted,
            EventKind::StepReady,
            EventKind::StepLeased,
            EventKind::StepSucceeded,
            EventKind::JobSucceeded
        ]
    );
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .job_events(EventPage {
                job: id,
                after_seq: after,
                limit: 4,
            })
            .await
            .expect("page");
        let Some(last) = page.last() else { break };
        after = last.seq;
        paged.extend(page);
    }
    assert_eq!(paged, all);
    assert!(store
        .job_events(EventPage {
            job: id,
            after_seq: after,
            limit: 4,
        })
        .await
        .expect("past the end")
        .is_empty());
}

// Proves `jobs_active` lists exactly the unfinished jobs (pending, running, blocked,
// compensating) in id order, and paging after the last id visits each once.
pub async fn jobs_active_pages_through_unfinished_jobs(f: &Fixture) {
    let store = &*f.store;
    assert!(store
        .jobs_active(ActivePage {
            after: None,
            limit: 10,
        })
        .await
        .expect("active")
        .is_empty());
    let mut active = Vec::new();
    for n in 1..=12u64 {
        let body = if n % 4 == 0 {
            spec(json!({"run_at": at(1_000_000), "steps": [{"name": "s", "agent": "idle"}]}))
        } else {
            one_step("idle")
        };
        submit(store, admitted(job_id(n), &body, at(n as i64))).await;
        if n % 3 == 0 {
            apply(store, job_id(n), Command::Cancel, at(20)).await;
        } else {
            active.push(job_id(n));
        }
    }
    // Job 13 succeeds; job 14 is blocked; job 15 is compensating.
    submit(store, admitted(job_id(13), &one_step("done"), at(0))).await;
    claim(store, "done", 1, 1, at(30)).await;
    apply(store, job_id(13), complete(0, 1, json!(1)), at(31)).await;
    let hold = spec(json!({"on_failure": "hold", "steps": [{"name": "s", "agent": "held"}]}));
    submit(store, admitted(job_id(14), &hold, at(0))).await;
    claim(store, "held", 1, 2, at(30)).await;
    let blocked = apply(store, job_id(14), fatal(0, 1, "no"), at(31)).await;
    assert_eq!(blocked.job.state, JobState::Blocked);
    active.push(job_id(14));
    let unwinding =
        run_until_b_fails(store, job_id(15), &undoable("compensate", json!({})), 3).await;
    assert_eq!(unwinding.job.state, JobState::Compensating);
    active.push(job_id(15));

    assert_eq!(
        store
            .jobs_active(ActivePage {
                after: None,
                limit: 100,
            })
            .await
            .expect("active"),
        active
    );
    assert!(store
        .jobs_active(ActivePage {
            after: None,
            limit: 0,
        })
        .await
        .expect("active")
        .is_empty());
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .jobs_active(ActivePage { after, limit: 3 })
            .await
            .expect("page");
        assert!(page.len() <= 3);
        seen.extend(page.iter().copied());
        match page.last() {
            Some(last) if page.len() == 3 => after = Some(*last),
            _ => break,
        }
    }
    assert_eq!(seen, active);
    let last = active.last().copied();
    assert!(store
        .jobs_active(ActivePage {
            after: last,
            limit: 10,
        })
        .await
        .expect("active")
        .is_empty());
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

// Proves a step's `backoff_formula` survives the store (`faktory` stays `faktory`, a step that
// names none reads back exponential), and that retries of a Faktory-formula step, applied to the
// job as the store loads it, are due exactly `count⁴ + 15 + ⌊30·jitter⌋ × (count + 1)` seconds
// after the failure: not claimable a millisecond before, claimable at that instant.
pub async fn faktory_backoff_formula_round_trips_and_times_retries(f: &Fixture) {
    use overseer_core::backoff::Formula;
    let store = &*f.store;
    let (fk, plain) = (job_id(1), job_id(2));
    let faktory = spec(
        json!({"steps": [{"name": "s", "agent": "fk", "max_attempts": 4, "backoff_formula": "faktory"}]}),
    );
    let submitted = submit(store, admitted(fk, &faktory, at(0))).await;
    submit(store, admitted(plain, &one_step("other"), at(0))).await;
    let stored = get(store, fk).await;
    assert_eq!(stored, submitted.job);
    assert_eq!(stored.steps[0].backoff_formula, Formula::Faktory);
    assert_eq!(
        get(store, plain).await.steps[0].backoff_formula,
        Formula::Exponential
    );

    // (attempt, failed at, jitter, due at): count 0 → 15 + 15 × 1 s; count 1 → 1 + 15 + 0 s;
    // count 2 → 16 + 15 + 29 × 3 s.
    let table = [
        (1, at(1_000), 0.5, at(31_000)),
        (2, at(32_000), 0.0, at(48_000)),
        (3, at(50_000), 0.999_999, at(168_000)),
    ];
    let mut now = at(0);
    for (attempt, failed_at, jitter, due) in table {
        let leased = claim(store, "fk", 1, u128::from(attempt), now).await;
        assert_eq!(claimed_jobs(&leased), vec![fk], "attempt {attempt}");
        assert_eq!(leased[0].transition.job.steps[0].attempt, attempt);
        let fail = Command::Fail {
            step: 0,
            attempt,
            error: "boom".into(),
            retryable: true,
            jitter,
        };
        let t = apply(store, fk, fail, failed_at).await;
        let stored = get(store, fk).await;
        assert_eq!(stored, t.job);
        let step = &stored.steps[0];
        assert_eq!(
            (step.state, step.backoff_formula, step.next_attempt_at),
            (StepState::Ready, Formula::Faktory, Some(due)),
            "attempt {attempt}"
        );
        let early = claim(
            store,
            "fk",
            1,
            100 + u128::from(attempt),
            Timestamp(due.0 - 1),
        )
        .await;
        assert!(early.is_empty(), "attempt {attempt} retried early");
        now = due;
    }
    let last = claim(store, "fk", 1, 4, now).await;
    assert_eq!(last[0].transition.job.steps[0].attempt, 4);
    assert_eq!(
        get(store, fk).await.steps[0].backoff_formula,
        Formula::Faktory
    );
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

// Proves the overview's counts: jobs per state (states with none left out, sorted), and jobs
// finished per minute and terminal state in a window that includes its start and excludes its
// end, with buckets counted from the window's start.
pub async fn stats_count_states_and_finished_minutes(f: &Fixture) {
    let store = &*f.store;
    assert!(store.jobs_count_by_state().await.expect("count").is_empty());
    let later = spec(json!({"run_at": at(3_600_000), "steps": [{"name": "s", "agent": "w"}]}));
    let (ok, bad, gone, idle, wait) = (job_id(1), job_id(2), job_id(3), job_id(4), job_id(5));
    let slow = spec(json!({"steps": [{"name": "s", "agent": "w", "timeout": "10m"}]}));
    for id in [ok, bad, gone, idle] {
        submit(store, admitted(id, &slow, at(0))).await;
    }
    submit(store, admitted(wait, &later, at(0))).await;
    let leased = claim(store, "w", 2, 1, at(1_000)).await;
    assert_eq!(claimed_jobs(&leased), vec![ok, bad]);
    let complete = Command::Complete {
        step: 0,
        attempt: 1,
        result: json!(1),
    };
    apply(store, ok, complete, at(61_000)).await;
    let fail = Command::Fail {
        step: 0,
        attempt: 1,
        error: "no".into(),
        retryable: false,
        jitter: 0.0,
    };
    apply(store, bad, fail, at(125_000)).await;
    apply(store, gone, Command::Cancel, at(130_000)).await;

    assert_eq!(
        store.jobs_count_by_state().await.expect("count"),
        vec![
            StateCount {
                state: JobState::Cancelled,
                count: 1,
            },
            StateCount {
                state: JobState::Failed,
                count: 1,
            },
            StateCount {
                state: JobState::Pending,
                count: 1,
            },
            StateCount {
                state: JobState::Running,
                count: 1,
            },
            StateCount {
                state: JobState::Succeeded,
                count: 1,
            },
        ]
    );
    let minutes = |since: i64, until: i64| async move {
        store
            .jobs_finished_per_minute(Window {
                since: at(since),
                until: at(until),
            })
            .await
            .expect("per minute")
    };
    assert_eq!(
        minutes(0, 180_000).await,
        vec![
            FinishedCount {
                minute: 1,
                state: JobState::Succeeded,
                count: 1,
            },
            FinishedCount {
                minute: 2,
                state: JobState::Cancelled,
                count: 1,
            },
            FinishedCount {
                minute: 2,
                state: JobState::Failed,
                count: 1,
            },
        ]
    );
    // From 62 s the succeeded job is out; buckets count from the new start.
    assert_eq!(
        minutes(62_000, 180_000).await,
        vec![
            FinishedCount {
                minute: 1,
                state: JobState::Cancelled,
                count: 1,
            },
            FinishedCount {
                minute: 1,
                state: JobState::Failed,
                count: 1,
            }
        ]
    );
    // The end is excluded, the start included.
    assert_eq!(
        minutes(61_000, 125_000).await,
        vec![FinishedCount {
            minute: 0,
            state: JobState::Succeeded,
            count: 1,
        }]
    );
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

// Proves a whole-job retry is stored round by round: the policy and the round survive a reload,
// the failed round is undone (the undo is claimed by its compensate agent), the next round starts
// with the root claimable only after the job backoff and a higher attempt number, and a report
// of the first round is refused in the second.
pub async fn whole_job_retry_rounds_are_stored(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"on_failure": "compensate_and_retry", "job_attempts": 2,
        "job_backoff": {"initial": "1s", "factor": 2, "max": "1m"},
        "steps": [
            {"name": "a", "agent": "w", "compensate": {"agent": "undo"}},
            {"name": "b", "agent": "w", "depends_on": ["a"], "max_attempts": 1}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    let stored = get(store, id).await;
    assert_eq!(
        (stored.round, stored.retry.map(|r| r.attempts)),
        (1, Some(2))
    );
    claim(store, "w", 1, 1, at(0)).await;
    apply(store, id, complete(0, 1, json!("a1")), at(10)).await;
    claim(store, "w", 1, 2, at(20)).await;
    apply(store, id, fatal(1, 1, "no"), at(30)).await;
    assert_eq!(claim(store, "undo", 1, 3, at(40)).await.len(), 1);
    let t = apply(store, id, complete(0, 2, json!("undone")), at(50)).await;
    assert_eq!((t.job.round, t.job.state), (2, JobState::Running));
    let stored = get(store, id).await;
    assert_eq!(stored, t.job);
    assert_eq!(stored.steps[0].state, StepState::Ready);
    assert_eq!(stored.steps[0].next_attempt_at, Some(at(1_050)));
    assert!(claim(store, "w", 1, 4, at(1_049)).await.is_empty());
    let again = claim(store, "w", 1, 5, at(1_050)).await;
    assert_eq!(again[0].transition.job.steps[0].attempt, 3);
    match store
        .job_apply(Apply::new(id, complete(1, 1, json!("late")), at(1_060)))
        .await
    {
        Err(Error::Rejected(Rejection::LeaseLost { .. })) => {}
        other => panic!("a report of round 1 was not refused: {other:?}"),
    }
    let kinds: Vec<EventKind> = all_events(store, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&EventKind::JobRoundStarted), "{kinds:?}");
}
