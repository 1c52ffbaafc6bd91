//! Agents: ready and running counts and the limits a claim honours.

use super::*;

// Proves `agents_counts` counts ready (due or not) and running steps per agent, for unfinished
// jobs only.
pub async fn agents_counts_ready_and_running(f: &Fixture) {
    let store = &*f.store;
    let a_twice =
        spec(json!({"steps": [{"name": "x", "agent": "a"}, {"name": "y", "agent": "a"}]}));
    submit(store, admitted(job_id(1), &a_twice, at(0))).await;
    let mixed = spec(json!({"steps": [{"name": "x", "agent": "a"}, {"name": "y", "agent": "b"}]}));
    submit(store, admitted(job_id(2), &mixed, at(0))).await;
    let pending = spec(json!({"run_at": at(60_000), "steps": [{"name": "s", "agent": "a"}]}));
    submit(store, admitted(job_id(3), &pending, at(0))).await;
    submit(store, admitted(job_id(4), &one_step("c"), at(0))).await;
    let retried = spec(
        json!({"steps": [{"name": "s", "agent": "b", "backoff": {"initial": "1m", "factor": 1, "max": "1m"}}]}),
    );
    submit(store, admitted(job_id(5), &retried, at(0))).await;

    assert_eq!(claim(store, "a", 1, 1, at(1)).await.len(), 1);
    let c = claim(store, "c", 1, 2, at(1)).await;
    apply(
        store,
        c[0].transition.job.id,
        Command::Complete {
            step: 0,
            attempt: 1,
            result: Value::Null,
        },
        at(2),
    )
    .await;
    let b = claim(store, "b", 2, 3, at(1)).await;
    assert_eq!(b.len(), 2);
    let failed = Command::Fail {
        step: 0,
        attempt: 1,
        error: "later".into(),
        retryable: true,
        jitter: 0.0,
    };
    apply(store, job_id(5), failed, at(3)).await;

    let counts = store.agents_counts().await.expect("counts");
    assert_eq!(
        counts,
        vec![
            AgentCounts {
                agent: "a".into(),
                ready: 2,
                running: 1
            },
            AgentCounts {
                agent: "b".into(),
                ready: 1,
                running: 1
            },
        ]
    );
}

// Proves `max_concurrency: 2` holds however many claimers race: 20 concurrent claims of one
// lease get 2 in all; once one lease ends a new claim gets exactly one more.
pub async fn max_concurrency_is_never_exceeded(f: &Fixture) {
    let store = &*f.store;
    let limited = AgentSettings {
        max_concurrency: Some(2),
        ..AgentSettings::default()
    };
    put_settings(store, "lim", limited, at(0)).await;
    let batch = (1..=10)
        .map(|n| admitted(job_id(n), &one_step("lim"), at(n as i64)))
        .collect();
    store.jobs_submit(batch).await.expect("submit");

    let mut tasks = tokio::task::JoinSet::new();
    for claimer in 0..20u128 {
        let store = f.store.clone();
        tasks.spawn(async move { claim(&*store, "lim", 1, 100 + claimer, at(100)).await });
    }
    let mut leased = Vec::new();
    while let Some(got) = tasks.join_next().await {
        leased.extend(got.expect("claimer task"));
    }
    assert_eq!(leased.len(), 2, "at most two leases in flight");
    assert!(claim(store, "lim", 5, 200, at(200)).await.is_empty());

    let first = &leased[0];
    apply(
        store,
        first.transition.job.id,
        complete(first.step, 1, json!(1)),
        at(300),
    )
    .await;
    let more = claim(store, "lim", 5, 300, at(400)).await;
    assert_eq!(more.len(), 1, "one lease ended, one more may start");
    assert!(claim(store, "lim", 5, 400, at(500)).await.is_empty());
}

// Proves `rate: 10` is a bucket of 10 leases refilling one per 100 ms: 10 leases at once, then
// none until the instant `throttled_until` names, then one.
pub async fn rate_limit_spaces_leases(f: &Fixture) {
    let store = &*f.store;
    let rated = AgentSettings {
        rate: Some(10.0),
        ..AgentSettings::default()
    };
    put_settings(store, "rl", rated, at(0)).await;
    let batch = (1..=15)
        .map(|n| admitted(job_id(n), &one_step("rl"), at(0)))
        .collect();
    store.jobs_submit(batch).await.expect("submit");

    let burst = claim_full(store, "rl", 15, 1, at(1_000)).await;
    assert_eq!(
        burst.claimed.len(),
        10,
        "a full bucket holds one second's worth"
    );
    assert_eq!(burst.throttled_until, Some(at(1_100)));
    let early = claim_full(store, "rl", 5, 20, at(1_099)).await;
    assert!(early.claimed.is_empty());
    assert_eq!(early.throttled_until, Some(at(1_100)));
    let next = claim_full(store, "rl", 5, 30, at(1_100)).await;
    assert_eq!(next.claimed.len(), 1);
    assert_eq!(next.throttled_until, Some(at(1_200)));
    // Tokens left unused build up again, but never beyond the bucket.
    let later = claim_full(store, "rl", 5, 40, at(60_000)).await;
    assert_eq!(later.claimed.len(), 4, "only 4 steps are left");
    assert_eq!(
        later.throttled_until, None,
        "the bucket did not hold the claim back"
    );
}

// Proves a paused agent gets no lease, its running ones untouched, until resumed; and that
// settings read back, default for an unknown agent, and are listed only while not default.
pub async fn paused_agent_gets_nothing_until_resumed(f: &Fixture) {
    let store = &*f.store;
    assert_eq!(
        store.agent_settings_get("p").await.expect("get"),
        AgentSettings::default()
    );
    assert!(store.agent_settings_list().await.expect("list").is_empty());
    let batch = (1..=3)
        .map(|n| admitted(job_id(n), &one_step("p"), at(0)))
        .collect();
    store.jobs_submit(batch).await.expect("submit");
    let running = claim(store, "p", 1, 1, at(10)).await;
    assert_eq!(running.len(), 1);

    let paused = AgentSettings {
        paused: true,
        max_concurrency: Some(5),
        rate: None,
    };
    put_settings(store, "p", paused.clone(), at(20)).await;
    assert_eq!(store.agent_settings_get("p").await.expect("get"), paused);
    assert_eq!(
        store.agent_settings_list().await.expect("list"),
        vec![AgentLimits {
            agent: "p".into(),
            settings: paused
        }]
    );
    let none = claim_full(store, "p", 5, 10, at(30)).await;
    assert!(none.claimed.is_empty());
    assert_eq!(none.throttled_until, None);
    let held = &running[0];
    assert_eq!(
        get(store, held.transition.job.id).await.steps[0].state,
        StepState::Running,
        "pausing leaves running leases alone"
    );

    put_settings(store, "p", AgentSettings::default(), at(40)).await;
    assert!(store.agent_settings_list().await.expect("list").is_empty());
    assert_eq!(claim(store, "p", 5, 20, at(50)).await.len(), 2);
}

// Proves `agents_ready_now` counts claimable steps that are due, by the agent that may claim them,
// leaving out leased steps, retries still backing off, pending and finished jobs.
pub async fn agents_ready_now_counts_only_due_claimable_steps(f: &Fixture) {
    let store = &*f.store;
    let backing_off = spec(
        json!({"steps": [{"name": "s", "agent": "b", "backoff": {"initial": "1m", "factor": 1, "max": "1m"}}]}),
    );
    submit(store, admitted(job_id(1), &one_step("a"), at(0))).await;
    submit(store, admitted(job_id(2), &one_step("a"), at(0))).await;
    submit(store, admitted(job_id(3), &backing_off, at(0))).await;
    submit(store, admitted(job_id(4), &one_step("b"), at(0))).await;
    let later = spec(json!({"run_at": at(60_000), "steps": [{"name": "s", "agent": "c"}]}));
    submit(store, admitted(job_id(5), &later, at(0))).await;
    submit(store, admitted(job_id(6), &one_step("d"), at(0))).await;
    apply(store, job_id(6), Command::Cancel, at(1)).await;

    assert_eq!(
        claimed_jobs(&claim(store, "b", 1, 1, at(1)).await),
        vec![job_id(3)]
    );
    let retry = Command::Fail {
        step: 0,
        attempt: 1,
        error: "later".into(),
        retryable: true,
        jitter: 0.0,
    };
    apply(store, job_id(3), retry, at(2)).await;
    let now = store.agents_ready_now(at(3)).await.expect("ready now");
    assert_eq!(now, vec![ready("a", 2), ready("b", 1)]);
    // Once the backoff is over, the retry counts too; a leased step never does.
    assert_eq!(
        claimed_jobs(&claim(store, "a", 1, 2, at(4)).await),
        vec![job_id(1)]
    );
    let later = store
        .agents_ready_now(at(62_002))
        .await
        .expect("ready later");
    assert_eq!(later, vec![ready("a", 1), ready("b", 2)]);
}

fn ready(agent: &str, ready: u64) -> AgentReady {
    AgentReady {
        agent: agent.into(),
        ready,
    }
}
