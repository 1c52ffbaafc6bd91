//! A job's history: only the newest events are kept, events page by sequence number, and unknown
//! ids are answered plainly.

use super::*;

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
