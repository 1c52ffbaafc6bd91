//! Claiming steps: the claim order (priority, age, priority ageing), racing claimers, and HTTP
//! steps claimed under their per-host agent.

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
