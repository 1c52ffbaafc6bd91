//! The backend conformance suite: what every [`Store`] must do, written once.
//!
//! Each case is a plain async function taking a [`Fixture`] (a fresh, empty store). A backend's
//! test file expands them all into one `#[tokio::test]` each with [`crate::conformance_tests!`]:
//!
//! ```ignore
//! async fn fixture() -> overseer_store::conformance::Fixture { /* a fresh store */ }
//! overseer_store::conformance_tests!(fixture());
//! ```
//!
//! The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a dev-dependency.
//! Cases use explicit timestamps, never the wall clock, so they are deterministic.

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;

use overseer_core::machine::admit;
use overseer_core::{
    Command, Job, JobId, JobSpec, JobState, LeaseId, Rejection, Reply, StepState, Timestamp,
    Transition,
};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{AgentCounts, Claim, Claimed, Error, JobQuery, LeaseRef, NewJob, Store, Submitted};

/// A fresh, empty store for one case, and whatever must live as long as it (a temp dir, a
/// database handle).
pub struct Fixture {
    pub store: Arc<dyn Store>,
    /// Events the store keeps per job; the history case needs it to be between 3 and 100.
    pub history_per_job: usize,
    _guard: Box<dyn Any + Send + Sync>,
}

impl Fixture {
    pub fn new(
        store: Arc<dyn Store>,
        history_per_job: usize,
        guard: impl Any + Send + Sync,
    ) -> Self {
        Fixture {
            store,
            history_per_job,
            _guard: Box::new(guard),
        }
    }
}

/// Expands every conformance case into a `#[tokio::test]` that gets its store from `$make`, an
/// expression evaluating to a future of a [`Fixture`] (evaluated afresh for each test).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases ($make)
            submit_and_get_round_trip,
            idempotent_resubmit_and_conflicts,
            list_filters_and_paginates,
            claim_orders_by_priority_then_age,
            concurrent_claims_lease_each_step_once,
            complete_promotes_dependants_and_finishes_job,
            stale_report_is_rejected_and_changes_nothing,
            expired_lease_requeues_with_backoff,
            run_at_jobs_come_due_and_activate,
            history_keeps_the_newest_events,
            next_due_and_agents_due,
            lease_find_resolves_superseded_leases,
            agents_counts_ready_and_running,
            cancel_settles_steps_and_refuses_late_results,
            unknown_ids_and_event_paging,
        );
    };
    (@cases ($make:expr) $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let fixture: $crate::conformance::Fixture = ($make).await;
                $crate::conformance::$case(&fixture).await;
            }
        )+
    };
}

/// The instant every case starts from.
pub const T0: Timestamp = Timestamp(1_700_000_000_000);

/// `T0` plus `ms` milliseconds.
pub fn at(ms: i64) -> Timestamp {
    Timestamp(T0.0 + ms)
}

/// A deterministic UUIDv7 job id; a larger `n` is a later (greater) id.
pub fn job_id(n: u64) -> JobId {
    let mut tail = [0u8; 10];
    tail[2..].copy_from_slice(&n.to_be_bytes());
    JobId(uuid::Builder::from_unix_timestamp_millis(T0.0 as u64 + n, &tail).into_uuid())
}

/// A deterministic lease id.
pub fn lease_id(n: u128) -> LeaseId {
    LeaseId(Uuid::from_u128(n))
}

pub fn spec(value: Value) -> JobSpec {
    serde_json::from_value(value).expect("test spec decodes")
}

/// A job admitted at `now`, ready to submit.
pub fn admitted(id: JobId, spec: &JobSpec, now: Timestamp) -> NewJob {
    NewJob {
        transition: admit(Job::from_spec(id, spec, now), now),
    }
}

fn one_step(agent: &str) -> JobSpec {
    spec(json!({"steps": [{"name": "s", "agent": agent}]}))
}

async fn submit(store: &dyn Store, new: NewJob) -> Transition {
    match store.jobs_submit(vec![new]).await.expect("submit").pop() {
        Some(Submitted::Created(t)) => t,
        other => panic!("expected a created job, got {other:?}"),
    }
}

async fn get(store: &dyn Store, id: JobId) -> Job {
    store
        .job_get(id)
        .await
        .expect("job_get")
        .expect("job exists")
}

/// Claims up to `max` steps of `agent` at `now` with lease ids `first_lease..`.
async fn claim(
    store: &dyn Store,
    agent: &str,
    max: u128,
    first_lease: u128,
    now: Timestamp,
) -> Vec<Claimed> {
    store
        .steps_claim(Claim {
            agent: agent.to_string(),
            worker: format!("{agent}-worker"),
            lease_ids: (first_lease..first_lease + max).map(lease_id).collect(),
            now,
        })
        .await
        .expect("claim")
}

fn claimed_jobs(claimed: &[Claimed]) -> Vec<JobId> {
    claimed.iter().map(|c| c.transition.job.id).collect()
}

async fn apply(store: &dyn Store, id: JobId, command: Command, now: Timestamp) -> Transition {
    store.job_apply(id, command, now).await.expect("apply")
}

async fn all_events(store: &dyn Store, id: JobId) -> Vec<overseer_core::Event> {
    store.job_events(id, 0, 100_000).await.expect("events")
}

fn ids(jobs: &[Job]) -> Vec<JobId> {
    jobs.iter().map(|j| j.id).collect()
}

// Proves every job and step field survives the store, through submit, claim, fail and complete.
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
    let expected: Vec<Job> = batch.iter().map(|n| n.transition.job.clone()).collect();
    let submitted = store.jobs_submit(batch.clone()).await.expect("submit");
    assert_eq!(submitted.len(), 2);
    for (s, want) in submitted.iter().zip(&expected) {
        match s {
            Submitted::Created(t) => assert_eq!(&t.job, want),
            other => panic!("expected created, got {other:?}"),
        }
    }
    assert_eq!(get(store, id).await, expected[0]);
    assert_eq!(get(store, later_id).await, expected[1]);
    assert_eq!(get(store, later_id).await.state, JobState::Pending);

    let events = all_events(store, id).await;
    assert_eq!(events.len(), batch[0].transition.events.len());
    for (i, (got, want)) in events.iter().zip(&batch[0].transition.events).enumerate() {
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
    assert_eq!(
        events.last().map(|e| e.kind.as_str()),
        Some("job_succeeded")
    );
    assert!(store.agents_counts().await.expect("counts").is_empty());
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
    match store.job_apply(id, never_issued, at(10)).await {
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
        },
        Command::Expire {
            step: 0,
            attempt: 1,
            jitter: 0.0,
        },
    ];
    for command in stale {
        let name = command.name();
        match store.job_apply(id, command, at(1_200)).await {
            Err(Error::Rejected(_)) => {}
            other => panic!("stale {name} should be rejected, got {other:?}"),
        }
    }
    // The live attempt reporting after its own lease ran out is refused too.
    match store
        .job_apply(
            id,
            Command::Complete {
                step: 0,
                attempt: 2,
                result: json!(1),
            },
            at(2_100),
        )
        .await
    {
        Err(Error::Rejected(Rejection::LeaseLost { .. })) => {}
        other => panic!("expected LeaseLost after expiry, got {other:?}"),
    }
    assert_eq!(get(store, id).await, before);
    assert_eq!(all_events(store, id).await, history);
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
        .leases_expired(at(999), 10)
        .await
        .expect("expired")
        .is_empty());
    let expired = store.leases_expired(at(1_000), 10).await.expect("expired");
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
        .leases_expired(at(5_000), 10)
        .await
        .expect("expired")
        .is_empty());

    assert!(claim(store, "w", 1, 2, at(2_999)).await.is_empty());
    let again = claim(store, "w", 1, 3, at(3_000)).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].transition.job.steps[0].attempt, 2);
    match store
        .job_apply(
            id,
            Command::Expire {
                step: 0,
                attempt: 1,
                jitter: 0.0,
            },
            at(9_000),
        )
        .await
    {
        Err(Error::Rejected(Rejection::NotExpired)) => {}
        other => panic!("expected NotExpired for a superseded attempt, got {other:?}"),
    }
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

    assert!(store.jobs_due(at(4_999), 10).await.expect("due").is_empty());
    assert_eq!(store.jobs_due(at(9_999), 10).await.expect("due"), vec![b]);
    assert_eq!(
        store.jobs_due(at(20_000), 10).await.expect("due"),
        vec![b, a]
    );
    assert_eq!(store.jobs_due(at(20_000), 1).await.expect("due"), vec![b]);

    match store.job_apply(a, Command::Activate, at(9_999)).await {
        Err(Error::Rejected(Rejection::NotDue)) => {}
        other => panic!("expected NotDue, got {other:?}"),
    }
    assert!(claim(store, "w", 5, 1, at(9_999)).await.is_empty());
    let t = apply(store, a, Command::Activate, at(10_000)).await;
    assert_eq!(t.job.state, JobState::Running);
    assert_eq!(get(store, a).await, t.job);
    assert_eq!(store.jobs_due(at(20_000), 10).await.expect("due"), vec![b]);
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
    assert!(events.iter().all(|e| e.kind == "step_ready"));

    claim(store, "h", 1, 1, at(10)).await;
    let events = all_events(store, id).await;
    assert_eq!(events.len(), keep);
    assert_eq!(events.first().map(|e| e.seq), Some(4));
    let newest = events.last().expect("events");
    assert_eq!(
        (newest.seq, newest.kind.as_str()),
        (keep as i64 + 3, "step_leased")
    );

    let page = store.job_events(id, keep as i64, 2).await.expect("page");
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![keep as i64 + 1, keep as i64 + 2]
    );
}

// Proves `next_due_at` is the earliest pending run_at, future retry, or lease expiry, and
// `agents_due` names the agents whose retries fall in `(after, now]`.
pub async fn next_due_and_agents_due(f: &Fixture) {
    let store = &*f.store;
    assert_eq!(store.next_due_at(at(0)).await.expect("due"), None);

    // A step ready now is not a future event.
    submit(store, admitted(job_id(1), &one_step("idle"), at(0))).await;
    assert_eq!(store.next_due_at(at(1)).await.expect("due"), None);

    let pending = spec(json!({"run_at": at(60_000), "steps": [{"name": "s", "agent": "p"}]}));
    submit(store, admitted(job_id(2), &pending, at(0))).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(60_000))
    );

    let leased = spec(json!({"steps": [{"name": "s", "agent": "r", "timeout": "30s"}]}));
    submit(store, admitted(job_id(3), &leased, at(0))).await;
    claim(store, "r", 1, 1, at(0)).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("due"),
        Some(at(30_000))
    );

    let retried = spec(
        json!({"steps": [{"name": "s", "agent": "q", "backoff": {"initial": "5s", "factor": 1, "max": "5s"}}]}),
    );
    let q = job_id(4);
    submit(store, admitted(q, &retried, at(0))).await;
    claim(store, "q", 1, 2, at(0)).await;
    let failed = Command::Fail {
        step: 0,
        attempt: 1,
        error: "busy".into(),
        retryable: true,
        jitter: 0.0,
    };
    apply(store, q, failed, at(1_000)).await;
    assert_eq!(
        store.next_due_at(at(1_000)).await.expect("due"),
        Some(at(6_000))
    );

    assert!(store
        .agents_due(at(1_000), at(5_999))
        .await
        .expect("agents")
        .is_empty());
    assert_eq!(
        store
            .agents_due(at(5_999), at(6_000))
            .await
            .expect("agents"),
        vec!["q".to_string()]
    );
    assert!(store
        .agents_due(at(6_000), at(7_000))
        .await
        .expect("agents")
        .is_empty());
    // Once the retry is due it is the claimers' business, not a future event.
    assert_eq!(
        store.next_due_at(at(6_000)).await.expect("due"),
        Some(at(30_000))
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
    match store.job_apply(idle, Command::Cancel, at(20)).await {
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
        matches!(store.job_apply(ghost, Command::Cancel, at(0)).await, Err(Error::JobNotFound(id)) if id == ghost)
    );
    assert!(
        matches!(store.job_events(ghost, 0, 10).await, Err(Error::JobNotFound(id)) if id == ghost)
    );
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
    let kinds: Vec<&str> = all.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "job_submitted",
            "job_started",
            "step_ready",
            "step_leased",
            "step_succeeded",
            "job_succeeded"
        ]
    );
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = store.job_events(id, after, 4).await.expect("page");
        let Some(last) = page.last() else { break };
        after = last.seq;
        paged.extend(page);
    }
    assert_eq!(paged, all);
    assert!(store
        .job_events(id, after, 4)
        .await
        .expect("past the end")
        .is_empty());
}
