//! Steps and leases: claims and their order, fencing of reports, expiry, undo leases.

use super::*;

// Proves a claim takes higher job priority first, then the oldest ready step, only for its
// agent and only when due, and that each lease bumps the attempt and sets the lease fields.
pub async fn claim_orders_by_priority_then_age(f: &Fixture) {
    let store = &*f.store;
    let with = |priority: i32, agent: &str| {
        spec(
            json!({"priority": priority, "steps": [{"name": "s", "agent": agent, "timeout": "10s"}]}),
        )
    };
    for (n, priority, agent, when) in [
        (1, 0, "w", 0),
        (2, 5, "w", 10),
        (3, 5, "w", 20),
        (4, -1, "w", 5),
        (5, 0, "w", 30),
        (6, 100, "other", 0),
    ] {
        submit(store, admitted(job_id(n), &with(priority, agent), at(when))).await;
    }
    let future = spec(
        json!({"priority": 100, "run_at": at(1_000_000), "steps": [{"name": "s", "agent": "w"}]}),
    );
    submit(store, admitted(job_id(7), &future, at(0))).await;

    let first = claim(store, "w", 3, 1, at(100)).await;
    assert_eq!(claimed_jobs(&first), vec![job_id(2), job_id(3), job_id(1)]);
    for (i, c) in first.iter().enumerate() {
        let s = &c.transition.job.steps[c.step];
        assert_eq!(c.step, 0);
        assert_eq!(s.state, StepState::Running);
        assert_eq!(s.attempt, 1);
        assert_eq!(s.lease_id, Some(lease_id(1 + i as u128)));
        assert_eq!(s.worker.as_deref(), Some("w-worker"));
        assert_eq!(s.started_at, Some(at(100)));
        assert_eq!(s.lease_expires_at, Some(at(10_100)));
        assert_eq!(get(store, c.transition.job.id).await, c.transition.job);
    }
    let rest = claim(store, "w", 10, 10, at(100)).await;
    assert_eq!(claimed_jobs(&rest), vec![job_id(5), job_id(4)]);
    assert!(claim(store, "w", 10, 20, at(100)).await.is_empty());
    assert_eq!(get(store, job_id(6)).await.steps[0].state, StepState::Ready);
    assert_eq!(
        get(store, job_id(7)).await.steps[0].state,
        StepState::Waiting
    );
    let other = claim(store, "other", 5, 30, at(100)).await;
    assert_eq!(claimed_jobs(&other), vec![job_id(6)]);
}

// Proves many claimers racing over the same ready steps lease each step exactly once.
pub async fn concurrent_claims_lease_each_step_once(f: &Fixture) {
    const JOBS: u64 = 25;
    const STEPS_PER_JOB: usize = 2;
    const CLAIMERS: u128 = 8;
    let two =
        spec(json!({"steps": [{"name": "a", "agent": "race"}, {"name": "b", "agent": "race"}]}));
    let batch = (1..=JOBS)
        .map(|n| admitted(job_id(n), &two, at(n as i64)))
        .collect();
    f.store.jobs_submit(batch).await.expect("submit");

    let mut tasks = tokio::task::JoinSet::new();
    for claimer in 0..CLAIMERS {
        let store = f.store.clone();
        tasks.spawn(async move {
            let mut mine = Vec::new();
            for round in 0u128.. {
                let first = (claimer << 64) | (round << 8);
                let got = claim(&*store, "race", 3, first, at(1_000)).await;
                if got.is_empty() {
                    break;
                }
                for c in got {
                    let s = &c.transition.job.steps[c.step];
                    mine.push((c.transition.job.id, c.step, s.attempt, s.lease_id));
                }
                tokio::task::yield_now().await;
            }
            mine
        });
    }
    let mut all = Vec::new();
    while let Some(result) = tasks.join_next().await {
        all.extend(result.expect("claimer task"));
    }
    assert_eq!(
        all.len(),
        JOBS as usize * STEPS_PER_JOB,
        "every step leased once"
    );
    let unique: HashSet<(JobId, usize)> = all.iter().map(|(j, s, _, _)| (*j, *s)).collect();
    assert_eq!(unique.len(), all.len(), "no step leased twice");
    assert!(all.iter().all(|(_, _, attempt, _)| *attempt == 1));
    for (job, step, _, lease) in &all {
        let stored = get(&*f.store, *job).await;
        assert_eq!(stored.steps[*step].state, StepState::Running);
        assert_eq!(stored.steps[*step].lease_id, *lease);
    }
}

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

    apply(
        store,
        id,
        Command::Expire {
            step: 0,
            attempt: 1,
            jitter: 0.0,
        },
        at(1_000),
    )
    .await;
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
        Command::Expire {
            step: 0,
            attempt: 1,
            jitter: 0.0,
        },
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
    let expired = Command::Expire {
        step: 0,
        attempt: 1,
        jitter: 0.0,
    };
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

// Proves an expired lease is listed by `leases_expired` exactly from its expiry on, and that
// `Expire` requeues the step with backoff: it cannot be claimed before `next_attempt_at`.
pub async fn expired_lease_requeues_with_backoff(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"steps": [{"name": "s", "agent": "w", "timeout": "1s", "backoff": {"initial": "2s", "factor": 2, "max": "1m"}}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    claim(store, "w", 1, 1, at(0)).await;

    assert!(store
        .leases_expired(Due {
            now: at(999),
            limit: 10,
        })
        .await
        .expect("expired")
        .is_empty());
    let expired = store
        .leases_expired(Due {
            now: at(1_000),
            limit: 10,
        })
        .await
        .expect("expired");
    assert_eq!(
        expired,
        vec![LeaseRef {
            lease_id: lease_id(1),
            job_id: id,
            step: 0,
            attempt: 1
        }]
    );

    let t = apply(
        store,
        id,
        Command::Expire {
            step: 0,
            attempt: 1,
            jitter: 0.0,
        },
        at(1_000),
    )
    .await;
    let stored = get(store, id).await;
    assert_eq!(stored, t.job);
    let step = &stored.steps[0];
    assert_eq!(step.state, StepState::Ready);
    assert_eq!(step.failures, 1);
    assert_eq!(step.next_attempt_at, Some(at(3_000)));
    assert!(step.last_error.is_some());
    assert!(store
        .leases_expired(Due {
            now: at(5_000),
            limit: 10,
        })
        .await
        .expect("expired")
        .is_empty());

    assert!(claim(store, "w", 1, 2, at(2_999)).await.is_empty());
    let again = claim(store, "w", 1, 3, at(3_000)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].transition.job.steps[0].attempt, 2);
    match store
        .job_apply(Apply::new(
            id,
            Command::Expire {
                step: 0,
                attempt: 1,
                jitter: 0.0,
            },
            at(9_000),
        ))
        .await
    {
        Err(Error::Rejected(Rejection::NotExpired)) => {}
        other => panic!("expected NotExpired for a superseded attempt, got {other:?}"),
    }
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
    apply(
        store,
        id,
        Command::Expire {
            step: 0,
            attempt: 1,
            jitter: 0.0,
        },
        at(1_000),
    )
    .await;
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

    let expired = Command::Expire {
        step: 0,
        attempt: 2,
        jitter: 0.0,
    };
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

// Proves priority ages: at equal readiness priority 10 goes first, a priority 0 step ready 20 s
// earlier goes before priority 10, and one ready 9 s earlier does not (1 s per point).
pub async fn claim_order_ages_priority(f: &Fixture) {
    let store = &*f.store;
    for (n, priority, agent, ready) in [
        (1, 0, "a", 20_000),
        (2, 10, "a", 20_000),
        (3, 0, "b", 0),
        (4, 10, "b", 20_000),
        (5, 0, "c", 0),
        (6, 10, "c", 9_000),
    ] {
        submit(
            store,
            admitted(job_id(n), &prioritised(priority, agent), at(ready)),
        )
        .await;
    }
    for (first_lease, agent, order) in [(10, "a", [2, 1]), (20, "b", [3, 4]), (30, "c", [6, 5])] {
        let got = claim_full(store, agent, 5, first_lease, at(30_000)).await;
        assert_eq!(
            claimed_jobs(&got.claimed),
            order.map(job_id).to_vec(),
            "agent {agent}"
        );
        assert_eq!(got.throttled_until, None, "no limits, no throttling");
    }
}

// Proves an HTTP step and an HTTP undo round-trip through the store with their targets (method,
// headers, timeout, async) and that both are claimed under the reserved per-host agent name,
// which a `Command::FailRetryAfter` wakes again after the asked delay.
pub async fn http_targets_round_trip_and_are_claimed_per_host(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let http = spec(json!({"steps": [
        {"name": "charge", "timeout": "10s",
         "backoff": {"initial": "1s", "max": "60s"},
         "http": {"url": "https://Billing.example:8443/charge", "method": "PUT",
                  "headers": {"Authorization": "Bearer x"}, "timeout": "5s", "async": true},
         "compensate": {"http": {"url": "https://billing.example:8443/refund"}}}
    ]}));
    let submitted = submit(store, admitted(id, &http, at(0))).await;
    let stored = get(store, id).await;
    assert_eq!(stored, submitted.job);
    let step = &stored.steps[0];
    assert_eq!(step.agent, "http:billing.example:8443");
    let target = step.http.as_ref().expect("the target is kept");
    assert_eq!(target.method, overseer_core::push::Method::Put);
    assert_eq!(target.headers["Authorization"], "Bearer x");
    assert!(target.asynchronous);
    let undo = step.compensate.as_ref().expect("undo");
    assert_eq!(undo.agent, "http:billing.example:8443");
    assert!(undo.http.is_some());
    let leased = claim(store, "http:billing.example:8443", 1, 1, at(0)).await;
    assert_eq!(claimed_jobs(&leased), vec![id]);
    let fail = Command::FailRetryAfter {
        step: 0,
        attempt: 1,
        error: "busy".into(),
        retry_after: overseer_core::Span::from_secs(7),
    };
    let t = apply(store, id, fail, at(1_000)).await;
    assert_eq!(get(store, id).await, t.job);
    assert_eq!(t.job.steps[0].next_attempt_at, Some(at(8_000)));
    let early = claim(store, "http:billing.example:8443", 1, 2, at(7_999)).await;
    assert!(early.is_empty(), "retried before the asked delay");
    let again = claim(store, "http:billing.example:8443", 1, 3, at(8_000)).await;
    assert_eq!(again[0].transition.job.steps[0].attempt, 2);
}

// Proves a step's deadline is stored and enforced by the stored lease: the claim fixes the
// attempt's hard end, a heartbeat renews the lease only up to it, `leases_expired` and
// `next_due_at` see the capped expiry, and the expiry is recorded as a deadline overrun.
pub async fn step_deadline_caps_the_stored_lease(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"steps": [{"name": "s", "agent": "w", "timeout": "3s",
        "deadline": "10s", "max_attempts": 2,
        "backoff": {"initial": "1s", "factor": 2, "max": "1m"}}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    let claimed = claim(store, "w", 1, 1, at(0)).await;
    assert_eq!(claimed.len(), 1);
    let stored = get(store, id).await;
    assert_eq!(
        stored.steps[0].deadline,
        Some(overseer_core::Span::from_secs(10))
    );
    assert_eq!(stored.steps[0].attempt_ends_at, Some(at(10_000)));
    assert_eq!(stored.steps[0].lease_expires_at, Some(at(3_000)));
    let beat = |now| {
        apply(
            store,
            id,
            Command::Heartbeat {
                step: 0,
                attempt: 1,
                progress: None,
            },
            now,
        )
    };
    beat(at(2_000)).await;
    assert_eq!(
        get(store, id).await.steps[0].lease_expires_at,
        Some(at(5_000))
    );
    beat(at(4_500)).await;
    let t = beat(at(7_000)).await;
    assert_eq!(
        t.reply,
        Reply::Heartbeat {
            lease_expires_at: at(10_000),
            cancel: false
        }
    );
    assert_eq!(get(store, id).await, t.job);
    assert_eq!(
        store.next_due_at(at(7_000)).await.expect("due"),
        Some(at(10_000))
    );
    let due = |now| store.leases_expired(Due { now, limit: 10 });
    assert!(due(at(9_999)).await.expect("expired").is_empty());
    assert_eq!(due(at(10_000)).await.expect("expired").len(), 1);
    apply(
        store,
        id,
        Command::Expire {
            step: 0,
            attempt: 1,
            jitter: 0.0,
        },
        at(10_000),
    )
    .await;
    let kinds: Vec<EventKind> = all_events(store, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(
        kinds.contains(&EventKind::StepDeadlineExceeded),
        "{kinds:?}"
    );
    let stored = get(store, id).await;
    assert_eq!(stored.steps[0].state, StepState::Ready);
    assert!(stored.steps[0]
        .last_error
        .as_deref()
        .is_some_and(|e| e.starts_with("deadline exceeded")));
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
