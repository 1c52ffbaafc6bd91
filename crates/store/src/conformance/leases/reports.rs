//! Reports on leases and their fencing: stale and batched reports, leases resolved after being
//! superseded or taken off by an unwind, and heartbeat progress.

use super::*;

// Proves reports for an attempt that is not the live lease are rejected and change nothing:
// the job and its history are identical before and after.
pub async fn stale_report_is_rejected_and_changes_nothing(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"steps": [{"name": "s", "agent": "w", "timeout": "1s", "backoff": {"initial": "100ms", "factor": 1, "max": "100ms"}}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    claim(store, "w", 1, 1, at(0)).await;

    let before = get(store, id).await;
    let history = all_events(store, id).await;
    let never_issued = Command::Complete {
        step: 0,
        attempt: 2,
        result: json!(1),
    };
    match store.job_apply(Apply::new(id, never_issued, at(10))).await {
        Err(Error::Rejected(Rejection::LeaseLost { .. })) => {}
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert_eq!(get(store, id).await, before);
    assert_eq!(all_events(store, id).await, history);

    apply(store, id, expire(0, 1), at(1_000)).await;
    let second = claim(store, "w", 1, 2, at(1_100)).await;
    assert_eq!(second[0].transition.job.steps[0].attempt, 2);

    let before = get(store, id).await;
    let history = all_events(store, id).await;
    let stale = [
        Command::Complete {
            step: 0,
            attempt: 1,
            result: json!("late"),
        },
        Command::Fail {
            step: 0,
            attempt: 1,
            error: "late".into(),
            retryable: true,
            jitter: 0.0,
        },
        Command::Heartbeat {
            step: 0,
            attempt: 1,
            progress: Some(json!("late")),
        },
        expire(0, 1),
    ];
    for command in stale {
        let name = command.name();
        match store.job_apply(Apply::new(id, command, at(1_200))).await {
            Err(Error::Rejected(_)) => {}
            other => panic!("stale {name} should be rejected, got {other:?}"),
        }
    }
    // The live attempt reporting after its own lease ran out is refused too.
    match store
        .job_apply(Apply::new(
            id,
            Command::Complete {
                step: 0,
                attempt: 2,
                result: json!(1),
            },
            at(2_100),
        ))
        .await
    {
        Err(Error::Rejected(Rejection::LeaseLost { .. })) => {}
        other => panic!("expected LeaseLost after expiry, got {other:?}"),
    }
    assert_eq!(get(store, id).await, before);
    assert_eq!(all_events(store, id).await, history);
}

// Proves a job's leases go with it: once a finished job is removed, a late report of its lease
// (in a batch, beside a report that applies) and a lookup of it find no lease, whether or not
// the node that granted the lease still remembers granting it.
pub async fn a_removed_jobs_leases_are_not_found(f: &Fixture) {
    let store = &*f.store;
    let one = spec(json!({"steps": [{"name": "s", "agent": "w"}]}));
    for n in 1..=2 {
        submit(store, admitted(job_id(n), &one, at(0))).await;
    }
    let claimed = claim(store, "w", 2, 1, at(10)).await;
    let lease_of = |id: JobId| {
        let c = claimed
            .iter()
            .find(|c| c.transition.job.id == id)
            .expect("claimed");
        c.transition.job.steps[c.step].lease_id.expect("a lease id")
    };
    let (l1, l2) = (lease_of(job_id(1)), lease_of(job_id(2)));
    let complete = |lease_id: LeaseId, now: i64| Reports {
        reports: vec![Report {
            lease_id,
            report: crate::LeaseReport::Complete {
                result: json!(null),
            },
        }],
        now: at(now),
    };
    let done = store.leases_report(complete(l1, 20)).await.expect("report");
    assert!(done[0].is_ok(), "the first report applies: {:?}", done[0]);
    let deleted = store
        .jobs_delete(Removal {
            ids: vec![job_id(1)],
            states: vec![JobState::Succeeded],
        })
        .await
        .expect("delete");
    assert_eq!(deleted, vec![job_id(1)]);

    let mut late = complete(l1, 30);
    late.reports.extend(complete(l2, 30).reports);
    let out = store.leases_report(late).await.expect("a batch");
    assert!(
        matches!(out[0], Err(Error::LeaseNotFound(l)) if l == l1),
        "the removed job's lease: {:?}",
        out[0]
    );
    assert!(
        out[1].is_ok(),
        "the other job's report applies: {:?}",
        out[1]
    );
    assert_eq!(store.lease_find(l1).await.expect("find"), None);
    assert_eq!(get(store, job_id(2)).await.state, JobState::Succeeded);
}

// Proves a batch of lease reports is applied report by report: completions and failures land
// as their own calls would, while an unknown lease, a superseded attempt and a second report for
// the same lease are refused without touching the reports around them.
pub async fn lease_reports_apply_each_and_refuse_only_their_own(f: &Fixture) {
    let store = &*f.store;
    let retrying = spec(
        json!({"steps": [{"name": "s", "agent": "w", "backoff": {"initial": "1s", "factor": 1, "max": "1s"}}]}),
    );
    let short = spec(json!({"steps": [{"name": "s", "agent": "w", "timeout": "1s"}]}));
    for n in 1..=3 {
        submit(store, admitted(job_id(n), &retrying, at(0))).await;
    }
    submit(store, admitted(job_id(4), &short, at(0))).await;
    let claimed = claim(store, "w", 4, 1, at(10)).await;
    assert_eq!(claimed.len(), 4);
    let lease_of = |id: JobId| {
        let c = claimed
            .iter()
            .find(|c| c.transition.job.id == id)
            .expect("claimed");
        c.transition.job.steps[c.step]
            .lease_id
            .expect("leased step has a lease id")
    };
    // Job 4's lease expires and is taken again: its first lease is superseded.
    let (l1, l2, l4) = (
        lease_of(job_id(1)),
        lease_of(job_id(2)),
        lease_of(job_id(4)),
    );
    let expired = expire(0, 1);
    apply(store, job_id(4), expired, at(1_010)).await;
    let again = claim(store, "w", 1, 100, at(2_100)).await;
    assert_eq!(claimed_jobs(&again), vec![job_id(4)]);
    let job4_before = get(store, job_id(4)).await;
    let job3_before = get(store, job_id(3)).await;

    let complete = |v: Value| crate::LeaseReport::Complete { result: v };
    let reports = vec![
        (l1, complete(json!({"n": 1}))),
        (
            l2,
            crate::LeaseReport::Fail {
                error: "boom".into(),
                retryable: true,
                jitter: 0.0,
            },
        ),
        (lease_id(999), complete(json!("nobody's"))),
        (l4, complete(json!("late"))),
        (l1, complete(json!("twice"))),
    ];
    let out = store
        .leases_report(Reports {
            reports: reports
                .into_iter()
                .map(|(lease_id, report)| Report { lease_id, report })
                .collect(),
            now: at(2_200),
        })
        .await
        .expect("a batch with refusals still commits");
    assert_eq!(out.len(), 5);

    let ReportApplied {
        lease,
        transition: t,
    } = out[0].as_ref().expect("first report applies");
    assert_eq!(
        (lease.lease_id, lease.job_id, lease.step),
        (l1, job_id(1), 0)
    );
    assert_eq!(t.job.state, JobState::Succeeded);
    let ReportApplied {
        lease: _,
        transition: t,
    } = out[1].as_ref().expect("second report applies");
    assert_eq!(t.job.steps[0].state, StepState::Ready);
    assert_eq!(t.job.steps[0].next_attempt_at, Some(at(3_200)));
    assert!(matches!(out[2], Err(Error::LeaseNotFound(l)) if l == lease_id(999)));
    // A refusal is an `Err(Rejected)` or a committed refusal reply, as the same `job_apply`
    // would answer; either way nothing about the job changes.
    let refused = |o: &crate::Reported| match o {
        Err(Error::Rejected(_)) => true,
        Ok(ReportApplied { transition: t, .. }) => matches!(t.reply, Reply::Refused(_)),
        Err(_) => false,
    };
    assert!(refused(&out[3]), "superseded lease: {:?}", out[3]);
    assert!(refused(&out[4]), "second report of one lease: {:?}", out[4]);

    assert_eq!(
        get(store, job_id(1)).await.steps[0].result,
        Some(json!({"n": 1}))
    );
    let job4 = get(store, job_id(4)).await;
    assert_eq!(job4.steps[0].state, job4_before.steps[0].state);
    assert_eq!(job4.steps[0].attempt, 2);
    assert_eq!(job4.steps[0].result, None);
    // A lease left out of the batch is untouched.
    assert_eq!(get(store, job_id(3)).await, job3_before);
}

// Proves a lease that an unwind took off its step (a succeeded step about to be undone, whose
// row then names no lease, and later its undo's lease) still resolves to its attempt, and a late
// report on it, alone or in a batch, is fenced as stale rather than answered as unknown.
pub async fn leases_taken_off_by_an_unwind_stay_fenced(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let unwinding = run_until_b_fails(store, id, &undoable("compensate", json!({})), 1).await;
    assert_eq!(unwinding.job.state, JobState::Compensating);
    assert_eq!(
        unwinding.job.steps[0].lease_id, None,
        "a's row names no lease now"
    );
    let a_work = LeaseRef {
        lease_id: lease_id(1),
        job_id: id,
        step: 0,
        attempt: 1,
    };
    assert_eq!(
        store.lease_find(lease_id(1)).await.expect("find"),
        Some(a_work)
    );
    let late = crate::LeaseReport::Complete {
        result: json!("late"),
    };
    let out = store
        .leases_report(Reports {
            reports: vec![Report {
                lease_id: lease_id(1),
                report: late.clone(),
            }],
            now: at(50),
        })
        .await
        .expect("report");
    assert!(
        matches!(&out[0], Err(Error::Rejected(Rejection::LeaseLost { .. }))),
        "a late report on a retired lease is stale, not unknown: {:?}",
        out[0]
    );
    // The undo's own lease takes the row; the first is still resolved from where it was kept.
    let undo = claim(store, "undo", 1, 10, at(60)).await;
    assert_eq!(claimed_jobs(&undo), vec![id]);
    let undo_attempt = undo[0].transition.job.steps[0].attempt;
    assert_eq!(
        store.lease_find(lease_id(1)).await.expect("find"),
        Some(a_work)
    );
    assert_eq!(
        store.lease_find(lease_id(10)).await.expect("find"),
        Some(LeaseRef {
            lease_id: lease_id(10),
            job_id: id,
            step: 0,
            attempt: undo_attempt,
        })
    );
    let before = get(store, id).await;
    let out = store
        .leases_report(Reports {
            reports: vec![Report {
                lease_id: lease_id(1),
                report: late,
            }],
            now: at(70),
        })
        .await
        .expect("report");
    assert!(matches!(&out[0], Err(Error::Rejected(_))), "{:?}", out[0]);
    assert_eq!(
        get(store, id).await,
        before,
        "a fenced report changes nothing"
    );
}

// Proves a lease id resolves to its attempt even after a later attempt superseded it.
pub async fn lease_find_resolves_superseded_leases(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"steps": [{"name": "s", "agent": "w", "timeout": "1s", "backoff": {"initial": "0", "factor": 1, "max": "0"}}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    claim(store, "w", 1, 1, at(0)).await;
    apply(store, id, expire(0, 1), at(1_000)).await;
    let second = claim(store, "w", 1, 2, at(1_000)).await;
    assert_eq!(second.len(), 1);

    let old = store.lease_find(lease_id(1)).await.expect("find");
    assert_eq!(
        old,
        Some(LeaseRef {
            lease_id: lease_id(1),
            job_id: id,
            step: 0,
            attempt: 1
        })
    );
    let live = store.lease_find(lease_id(2)).await.expect("find");
    assert_eq!(
        live,
        Some(LeaseRef {
            lease_id: lease_id(2),
            job_id: id,
            step: 0,
            attempt: 2
        })
    );
    assert_eq!(store.lease_find(lease_id(999)).await.expect("find"), None);
}

// Proves a heartbeat's progress is stored on the step with its time (read back as written),
// recorded as an event only for a step that asks for it, refused with a stale heartbeat
// (nothing changes), kept when the attempt fails, and cleared by the next lease.
pub async fn heartbeat_progress_is_stored_fenced_and_cleared(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(json!({"steps": [
        {"name": "a", "agent": "pg", "timeout": "10s", "progress_events": true,
         "backoff": {"initial": "1s"}},
        {"name": "b", "agent": "pq", "timeout": "10s"}
    ]}));
    submit(store, admitted(id, &s, at(0))).await;
    claim(store, "pg", 1, 1, at(10)).await;
    claim(store, "pq", 1, 2, at(10)).await;
    let beat = |step: usize, attempt: u32, progress: Value| Command::Heartbeat {
        step,
        attempt,
        progress: Some(progress),
    };
    let progress = json!({"done": 3, "of": 10, "note": "naïve \u{0} ok"});
    apply(store, id, beat(0, 1, progress.clone()), at(20)).await;
    apply(store, id, beat(1, 1, json!([1, 2.5, null])), at(25)).await;
    let stored = get(store, id).await;
    assert_eq!(stored.steps[0].progress, Some(progress.clone()));
    assert_eq!(stored.steps[0].progress_at, Some(at(20)));
    assert!(stored.steps[0].progress_events && !stored.steps[1].progress_events);
    assert_eq!(stored.steps[1].progress, Some(json!([1, 2.5, null])));
    let recorded: Vec<(EventKind, Option<String>)> = all_events(store, id)
        .await
        .into_iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::StepProgress | EventKind::CompensationProgress
            )
        })
        .map(|e| (e.kind, e.step))
        .collect();
    assert_eq!(recorded, [(EventKind::StepProgress, Some("a".to_string()))]);

    apply(
        store,
        id,
        Command::Fail {
            step: 0,
            attempt: 1,
            error: "flaky".into(),
            retryable: true,
            jitter: 0.0,
        },
        at(30),
    )
    .await;
    assert_eq!(
        get(store, id).await.steps[0].progress,
        Some(progress.clone())
    );
    let before = get(store, id).await;
    let stale = store
        .job_apply(Apply::new(id, beat(0, 1, json!("late")), at(35)))
        .await;
    assert!(matches!(
        stale,
        Err(Error::Rejected(Rejection::LeaseLost { .. }))
    ));
    assert_eq!(get(store, id).await, before);
    let again = claim(store, "pg", 1, 3, at(2_000)).await;
    assert_eq!(claimed_jobs(&again), vec![id]);
    let stored = get(store, id).await;
    assert_eq!(
        (&stored.steps[0].progress, stored.steps[0].progress_at),
        (&None, None)
    );
}
