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

/// Checks `later` is what `earlier` became: every entry numbered in both is the same entry, and
/// `later` has every number `earlier` had past its own oldest.
fn consistent(earlier: &[overseer_core::Event], later: &[overseer_core::Event], here: &str) {
    let oldest = later.first().map_or(i64::MAX, |e| e.seq);
    for e in earlier.iter().filter(|e| e.seq >= oldest) {
        let same = later.iter().find(|l| l.seq == e.seq);
        assert_eq!(same, Some(e), "entry {} changed {here}", e.seq);
    }
    let seqs: Vec<i64> = later.iter().map(|e| e.seq).collect();
    let contiguous: Vec<i64> = (oldest..oldest + later.len() as i64).collect();
    assert_eq!(seqs, contiguous, "numbers {here}");
    assert!(
        later.windows(2).all(|w| w[0].at <= w[1].at),
        "entries in time order {here}"
    );
}

// Proves a history reads the same whenever it is read: what a reader saw after each claim,
// heartbeat and report is exactly what every later read shows under the same numbers, the job is
// dated by its newest entry, and paging one entry at a time reads the same. (A store may log a
// claim's entry with the job's next write: these reads fall on both sides of that write, with
// several claims waiting at once and the oldest entries trimmed.)
pub async fn history_reads_the_same_before_and_after_later_writes(f: &Fixture) {
    let store = &*f.store;
    let keep = f.history_per_job;
    let n = keep + 1;
    let steps: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("s{i}"), "agent": "h", "timeout": "1m"}))
        .collect();
    let id = job_id(1);
    submit(store, admitted(id, &spec(json!({ "steps": steps })), at(0))).await;
    let mut seen = vec![all_events(store, id).await];
    let mut read = async |here: &str, newest: i64| {
        let now = all_events(store, id).await;
        consistent(seen.last().expect("a read"), &now, here);
        assert_eq!(get(store, id).await.updated_at, at(newest), "dated {here}");
        let mut paged = Vec::new();
        while let Some(e) = store
            .job_events(EventPage {
                job: id,
                after_seq: paged.last().map_or(0, |e: &overseer_core::Event| e.seq),
                limit: 1,
            })
            .await
            .expect("page")
            .pop()
        {
            paged.push(e);
        }
        assert_eq!(paged, now, "paged one at a time {here}");
        seen.push(now.clone());
        now
    };
    // One claim, then the rest of the steps at once: more entries wait than are kept.
    let leases = |events: &[overseer_core::Event]| {
        let leased = events.iter().filter(|e| e.kind == EventKind::StepLeased);
        leased
            .map(|e| e.step.clone().expect("a step"))
            .collect::<Vec<_>>()
    };
    let first = claim(store, "h", 1, 1, at(10)).await;
    let now = read("after the first claim", 10).await;
    assert_eq!(leases(&now), ["s0"]);
    let rest = claim(store, "h", n as u128, 2, at(20)).await;
    assert_eq!((first.len(), rest.len()), (1, n - 1));
    let now = read("after every step was claimed", 20).await;
    let names: Vec<String> = (1..n).map(|i| format!("s{i}")).collect();
    assert_eq!(leases(&now), names, "the newest kept");
    let beat = Command::Heartbeat {
        step: first[0].step,
        attempt: 1,
        progress: None,
    };
    apply(store, id, beat, at(25)).await;
    read("after a heartbeat", 20).await;
    let mut last = Vec::new();
    for (i, c) in first.iter().chain(&rest).enumerate() {
        let t = 30 + i as i64;
        apply(store, id, complete(c.step, 1, json!(i)), at(t)).await;
        last = read(&format!("after report {i}"), t).await;
    }
    assert_eq!(last.len(), keep);
    assert_eq!(last.last().map(|e| e.kind), Some(EventKind::JobSucceeded));
}

// Proves every lease of a step stays in its history when the step is leased again: a step
// retried once, failed for good, and run again in a whole-job retry's second round reads, after
// each write, as every earlier read said (numbers without gaps, the job dated by its newest
// entry), with one `step_leased` per attempt in order. (A store may keep a first lease's entry in
// the step row it wrote: the retry's claim retires that lease and logs its own entry, while the
// new round's claim, with no lease to retire, must move the first entry before keeping its own.)
pub async fn a_step_leased_again_keeps_every_lease_in_its_history(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let spec = spec(
        json!({"on_failure": "compensate_and_retry", "job_attempts": 2,
        "job_backoff": {"initial": "1ms", "factor": 1, "max": "1ms"},
        "steps": [{"name": "s", "agent": "w", "max_attempts": 2,
            "backoff": {"initial": "1ms", "factor": 1, "max": "1ms"}}]}),
    );
    submit(store, admitted(id, &spec, at(0))).await;
    let mut seen = all_events(store, id).await;
    for attempt in 1..=3u32 {
        let t = i64::from(attempt) * 100;
        let claimed = claim(store, "w", 1, u128::from(attempt), at(t)).await;
        assert_eq!(claimed.len(), 1, "attempt {attempt} leased");
        let report = match attempt {
            3 => complete(0, attempt, json!("done")),
            _ => Command::Fail {
                step: 0,
                attempt,
                error: format!("failure {attempt}"),
                retryable: true,
                jitter: 0.0,
            },
        };
        for (here, write) in [("claim", None), ("report", Some(report))] {
            let when = t + i64::from(write.is_some());
            if let Some(command) = write {
                apply(store, id, command, at(when)).await;
            }
            let now = all_events(store, id).await;
            let here = format!("after attempt {attempt}'s {here}");
            consistent(&seen, &now, &here);
            assert_eq!(get(store, id).await.updated_at, at(when), "dated {here}");
            seen = now;
        }
    }
    let leases: Vec<Option<u32>> = seen
        .iter()
        .filter(|e| e.kind == EventKind::StepLeased)
        .map(|e| e.attempt)
        .collect();
    assert_eq!(leases, [Some(1), Some(2), Some(3)]);
    assert!(seen.iter().any(|e| e.kind == EventKind::JobRoundStarted));
    assert_eq!(seen.last().map(|e| e.kind), Some(EventKind::JobSucceeded));
}
