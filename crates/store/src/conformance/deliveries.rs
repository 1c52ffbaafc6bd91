//! The outbox: deliveries recorded with their transitions, retried and given up.

use super::*;

// Proves a job with a `callback_url` finishing and a transition raising an alert record their
// deliveries with the transition, exactly as `outbox::outgoing` describes, due from the
// transition's time, oldest first, and that transitions without durable effects record none.
pub async fn alerts_and_callbacks_are_recorded_for_delivery(f: &Fixture) {
    let store = &*f.store;
    assert!(live_deliveries(store).await.is_empty());
    assert_eq!(
        store.deliveries_counts().await.expect("counts"),
        DeliveryCounts {
            waiting: 0,
            dead: 0
        }
    );

    let url = "https://example.invalid/hooks/done";
    let called = job_id(1);
    let with_callback = spec(json!({"callback_url": url, "steps": [{"name": "s", "agent": "w"}]}));
    submit(store, admitted(called, &with_callback, at(0))).await;
    claim(store, "w", 1, 1, at(10)).await;
    assert!(
        live_deliveries(store).await.is_empty(),
        "nothing to deliver yet"
    );
    let done = apply(store, called, complete(0, 1, json!({"n": 1})), at(20)).await;
    assert!(done.effects.contains(&Effect::Callback {
        state: JobState::Succeeded
    }));

    let held = job_id(2);
    let hold = spec(json!({"on_failure": "hold", "steps": [{"name": "s", "agent": "h"}]}));
    submit(store, admitted(held, &hold, at(0))).await;
    claim(store, "h", 1, 2, at(25)).await;
    let blocked = apply(store, held, fatal(0, 1, "disk full"), at(30)).await;
    assert_eq!(blocked.job.state, JobState::Blocked);
    assert!(blocked.effects.iter().any(|e| matches!(
        e,
        Effect::Alert {
            kind: AlertKind::JobBlocked,
            ..
        }
    )));

    assert!(store
        .deliveries_due(Due {
            now: at(19),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    let first = store
        .deliveries_due(Due {
            now: at(29),
            limit: 10,
        })
        .await
        .expect("due");
    let want_callback = expected_deliveries(&done, at(20));
    assert_eq!(
        first.iter().map(delivery_fields).collect::<Vec<_>>(),
        want_callback
    );
    let callback = &first[0];
    assert_eq!(callback.kind, DeliveryKind::Callback);
    assert_eq!(callback.job_id, called);
    assert_eq!(callback.url.as_deref(), Some(url));
    assert_eq!(callback.body["state"], json!("succeeded"));
    assert_eq!(
        (
            callback.attempts,
            callback.created_at,
            callback.next_attempt_at,
            &callback.last_error
        ),
        (0, at(20), at(20), &None)
    );

    let all = store
        .deliveries_due(Due {
            now: at(30),
            limit: 10,
        })
        .await
        .expect("due");
    let mut want = want_callback;
    want.extend(expected_deliveries(&blocked, at(30)));
    assert_eq!(all.iter().map(delivery_fields).collect::<Vec<_>>(), want);
    let alert = &all[1];
    assert_eq!(
        (alert.kind, alert.job_id, alert.url.as_deref()),
        (DeliveryKind::Alert, held, None)
    );
    assert_eq!(alert.body["kind"], json!("job_blocked"));
    assert_eq!(
        store
            .deliveries_due(Due {
                now: at(30),
                limit: 1,
            })
            .await
            .expect("due"),
        all[..1]
    );
    assert_eq!(
        store.deliveries_counts().await.expect("counts"),
        DeliveryCounts {
            waiting: 2,
            dead: 0
        }
    );
}

// Proves a delivery is recorded once per idempotency key: effects repeated within one
// transition, or raised again by a later transition with the same key, add no second record.
pub async fn deliveries_are_recorded_once_per_idempotency_key(f: &Fixture) {
    let store = &*f.store;
    let url = "https://example.invalid/cb";
    let id = job_id(1);
    let body = spec(json!({"callback_url": url, "steps": [{"name": "s", "agent": "w"}]}));
    // A transition whose durable effects repeat: the same callback twice, and an alert.
    let mut new = admitted(id, &body, at(0));
    let succeeded = Effect::Callback {
        state: JobState::Succeeded,
    };
    new.transition.effects.push(succeeded.clone());
    new.transition.effects.push(succeeded);
    new.transition.effects.push(Effect::Alert {
        kind: AlertKind::JobFailed,
        step: None,
        message: "recorded with the submit".into(),
    });
    let expected = expected_deliveries(&new.transition, at(0));
    assert_eq!(expected.len(), 3, "the core describes every repeat");
    submit(store, new).await;
    let recorded = live_deliveries(store).await;
    assert_eq!(
        recorded.iter().map(delivery_fields).collect::<Vec<_>>(),
        vec![expected[0].clone(), expected[2].clone()]
    );

    // Resubmitting the same body under the same key stores nothing, deliveries included.
    let keyed = spec(json!({"idempotency_key": "once", "callback_url": url,
        "steps": [{"name": "s", "agent": "v"}]}));
    let mut first = admitted(job_id(2), &keyed, at(1));
    first.transition.effects.push(Effect::Alert {
        kind: AlertKind::JobFailed,
        step: None,
        message: "first".into(),
    });
    submit(store, first.clone()).await;
    assert_eq!(live_deliveries(store).await.len(), 3);
    match store
        .jobs_submit(vec![first])
        .await
        .expect("resubmit")
        .as_slice()
    {
        [Submitted::Existing(_)] => {}
        other => panic!("expected the existing job, got {other:?}"),
    }
    assert_eq!(live_deliveries(store).await.len(), 3);

    // The job really finishing raises its callback again, under the same key: still one record,
    // the first one.
    let before = live_deliveries(store).await;
    claim(store, "w", 1, 1, at(10)).await;
    let done = apply(store, id, complete(0, 1, json!(1)), at(20)).await;
    assert_eq!(
        expected_deliveries(&done, at(20))
            .iter()
            .map(|d| d.2.clone())
            .collect::<Vec<_>>(),
        vec![expected[0].2.clone()]
    );
    let after = live_deliveries(store).await;
    assert_eq!(after, before);
    assert_eq!(after[..2], recorded[..]);
    let callbacks: Vec<&Delivery> = after
        .iter()
        .filter(|d| d.kind == DeliveryKind::Callback && d.job_id == id)
        .collect();
    assert_eq!(callbacks.len(), 1);
    assert_eq!(callbacks[0].created_at, at(0));
    assert_eq!(
        store.deliveries_counts().await.expect("counts"),
        DeliveryCounts {
            waiting: 3,
            dead: 0
        }
    );
}

// Proves `delivery_update` counts each attempt: a retry moves the delivery to its new time with
// the error, delivered removes it, giving up keeps it as dead and never due; updating a delivery
// that is gone changes nothing.
pub async fn delivery_updates_retry_deliver_and_give_up(f: &Fixture) {
    let store = &*f.store;
    let url = "https://example.invalid/cb";
    for n in 1..=3u64 {
        let body = spec(json!({"callback_url": url, "steps": [{"name": "s", "agent": "w"}]}));
        submit(store, admitted(job_id(n), &body, at(0))).await;
        let leased = claim(store, "w", 1, n as u128, at(n as i64)).await;
        assert_eq!(claimed_jobs(&leased), vec![job_id(n)]);
        apply(
            store,
            job_id(n),
            complete(0, 1, json!(n)),
            at(10 * n as i64),
        )
        .await;
    }
    let due = store
        .deliveries_due(Due {
            now: at(100),
            limit: 10,
        })
        .await
        .expect("due");
    assert_eq!(
        due.iter().map(|d| d.job_id).collect::<Vec<_>>(),
        vec![job_id(1), job_id(2), job_id(3)]
    );
    let (one, two, three) = (due[0].clone(), due[1].clone(), due[2].clone());

    let retry = DeliveryOutcome::Retry {
        next_attempt_at: at(5_000),
        error: "503 Service Unavailable".into(),
    };
    store.delivery_update(one.id, retry).await.expect("retry");
    let due = store
        .deliveries_due(Due {
            now: at(4_999),
            limit: 10,
        })
        .await
        .expect("due");
    assert_eq!(
        due.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![two.id, three.id]
    );
    let due = store
        .deliveries_due(Due {
            now: at(5_000),
            limit: 10,
        })
        .await
        .expect("due");
    assert_eq!(
        due.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![two.id, three.id, one.id],
        "oldest due first"
    );
    let retried = &due[2];
    assert_eq!(
        (
            retried.attempts,
            retried.next_attempt_at,
            retried.last_error.as_deref()
        ),
        (1, at(5_000), Some("503 Service Unavailable"))
    );
    assert_eq!(
        (retried.created_at, &retried.body, &retried.idempotency_key),
        (one.created_at, &one.body, &one.idempotency_key)
    );

    store
        .delivery_update(two.id, DeliveryOutcome::Delivered { at: at(6_000) })
        .await
        .expect("delivered");
    store
        .delivery_update(
            three.id,
            DeliveryOutcome::GiveUp {
                error: "410 Gone".into(),
            },
        )
        .await
        .expect("give up");
    let due = store
        .deliveries_due(Due {
            now: at(1_000_000),
            limit: 10,
        })
        .await
        .expect("due");
    assert_eq!(due.iter().map(|d| d.id).collect::<Vec<_>>(), vec![one.id]);
    assert_eq!(
        store.deliveries_counts().await.expect("counts"),
        DeliveryCounts {
            waiting: 1,
            dead: 1
        }
    );

    // A delivery that is gone (delivered elsewhere) takes any late outcome quietly.
    store
        .delivery_update(two.id, DeliveryOutcome::Delivered { at: at(6_000) })
        .await
        .expect("gone: delivered");
    store
        .delivery_update(
            two.id,
            DeliveryOutcome::GiveUp {
                error: "late".into(),
            },
        )
        .await
        .expect("gone: give up");
    assert_eq!(
        store.deliveries_counts().await.expect("counts"),
        DeliveryCounts {
            waiting: 1,
            dead: 1
        }
    );
    store
        .delivery_update(one.id, DeliveryOutcome::Delivered { at: at(6_000) })
        .await
        .expect("delivered");
    assert!(live_deliveries(store).await.is_empty());
    assert_eq!(
        store.deliveries_counts().await.expect("counts"),
        DeliveryCounts {
            waiting: 0,
            dead: 1
        }
    );
}

// Proves `alerts_recent` lists alert deliveries (not callbacks) newest first, whether waiting,
// delivered or given up; a delivered one is no longer due nor counted as waiting, a late outcome
// for it changes nothing, and it is pruned once delivered longer ago than `DELIVERED_KEPT`.
pub async fn alerts_are_listed_newest_first_and_kept_once_delivered(f: &Fixture) {
    let store = &*f.store;
    let first = fail_a_job(store, 1, true, 0).await;
    let second = fail_a_job(store, 2, false, 1_000).await;
    let listed = store.alerts_recent(10).await.expect("alerts");
    let jobs: Vec<JobId> = listed.iter().map(|r| r.delivery.job_id).collect();
    assert_eq!(jobs, vec![second, first], "alerts only, newest first");
    assert!(listed.iter().all(|r| r.delivered_at.is_none() && !r.dead));
    assert_eq!(listed[0].delivery.body["kind"], "job_failed");
    assert_eq!(store.alerts_recent(1).await.expect("alerts").len(), 1);

    let (one, two) = (listed[1].delivery.id, listed[0].delivery.id);
    let delivered = DeliveryOutcome::Delivered { at: at(10_000) };
    store
        .delivery_update(one, delivered.clone())
        .await
        .expect("delivered");
    let gave_up = DeliveryOutcome::GiveUp {
        error: "410 Gone".into(),
    };
    store
        .delivery_update(two, gave_up.clone())
        .await
        .expect("give up");
    // A late outcome for the delivered one (another node's attempt) changes nothing.
    store.delivery_update(one, gave_up).await.expect("late");
    let listed = store.alerts_recent(10).await.expect("alerts");
    assert_eq!(
        (
            listed[1].delivered_at,
            listed[1].dead,
            listed[0].delivered_at,
            listed[0].dead
        ),
        (Some(at(10_000)), false, None, true)
    );
    assert_eq!(listed[0].delivery.last_error.as_deref(), Some("410 Gone"));
    let due = store
        .deliveries_due(Due {
            now: at(1_000_000),
            limit: 10,
        })
        .await
        .expect("due");
    assert!(
        due.iter().all(|d| d.id != one),
        "a delivered alert is not due again"
    );
    let DeliveryCounts { waiting, dead } = store.deliveries_counts().await.expect("counts");
    assert_eq!(dead, 1);
    assert_eq!(
        waiting,
        due.len() as u64,
        "the callback waits; the delivered alert does not count"
    );

    // Delivering something a week later prunes what was delivered before the week.
    let third = fail_a_job(store, 3, false, 2_000).await;
    let newest = store.alerts_recent(1).await.expect("alerts")[0].delivery.id;
    let week = crate::DELIVERED_KEPT.as_millis_i64();
    let late = DeliveryOutcome::Delivered {
        at: at(10_001 + week),
    };
    store
        .delivery_update(newest, late)
        .await
        .expect("delivered");
    let jobs: Vec<JobId> = store
        .alerts_recent(10)
        .await
        .expect("alerts")
        .iter()
        .map(|r| r.delivery.job_id)
        .collect();
    assert_eq!(
        jobs,
        vec![third, second],
        "the alert delivered a week ago is gone"
    );
}

/// Submits a one-step job (with a callback when `callback`) and fails it for good at `ms`, which
/// raises a `job_failed` alert.
async fn fail_a_job(store: &dyn Store, n: u64, callback: bool, ms: i64) -> JobId {
    let mut v = json!({"steps": [{"name": "s", "agent": "al", "timeout": "10m"}]});
    if callback {
        v["callback_url"] = json!("https://example.com/hook");
    }
    let id = job_id(n);
    submit(store, admitted(id, &spec(v), at(ms))).await;
    let leased = claim(store, "al", 1, u128::from(n) * 10, at(ms)).await;
    assert_eq!(claimed_jobs(&leased), vec![id]);
    let fail = Command::Fail {
        step: 0,
        attempt: 1,
        error: "no".into(),
        retryable: false,
        jitter: 0.0,
    };
    apply(store, id, fail, at(ms)).await;
    id
}
