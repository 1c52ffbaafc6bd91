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
use overseer_core::outbox::{self, DeliveryKind};
use overseer_core::schedule::ScheduleSpec;
use overseer_core::{
    Command, CompPhase, Effect, Job, JobId, JobSpec, JobState, LeaseId, Rejection, Reply,
    StepState, Timestamp, Transition,
};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::{
    AgentCounts, AgentSettings, Claim, ClaimResult, Claimed, Delivery, DeliveryOutcome, Error,
    Fence, Fire, FireOutcome, JobQuery, Leadership, LeaseRef, NewJob, OrderingKeyStatus, Result,
    Schedule, Store, Submitted,
};

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
            list_filters_by_id_prefix_agent_and_creation_time,
            claim_orders_by_priority_then_age,
            concurrent_claims_lease_each_step_once,
            complete_promotes_dependants_and_finishes_job,
            stale_report_is_rejected_and_changes_nothing,
            lease_reports_apply_each_and_refuse_only_their_own,
            expired_lease_requeues_with_backoff,
            run_at_jobs_come_due_and_activate,
            history_keeps_the_newest_events,
            next_due_and_agents_due,
            lease_find_resolves_superseded_leases,
            agents_counts_ready_and_running,
            cancel_settles_steps_and_refuses_late_results,
            unknown_ids_and_event_paging,
            undo_is_claimed_by_its_compensate_agent,
            undo_leases_expire_and_backoff_wakes_the_compensate_agent,
            alerts_and_callbacks_are_recorded_for_delivery,
            deliveries_are_recorded_once_per_idempotency_key,
            delivery_updates_retry_deliver_and_give_up,
            jobs_active_pages_through_unfinished_jobs,
            new_fields_round_trip_through_hold_retry_resume_skip,
            repair_heals_an_inconsistent_job,
            claim_order_ages_priority,
            max_concurrency_is_never_exceeded,
            rate_limit_spaces_leases,
            paused_agent_gets_nothing_until_resumed,
            ordering_key_runs_one_job_at_a_time,
            blocked_head_holds_only_its_key,
            ordering_key_keeps_submission_order,
            every_way_a_head_finishes_starts_the_next,
            leader_lease_changes_hands_with_epochs,
            fenced_apply_is_refused_after_a_takeover,
            schedule_create_is_idempotent_and_conflicts,
            schedule_fires_exactly_once_under_a_race,
            schedule_overlap_skip_and_allow,
            schedule_fire_with_a_stale_due_time_writes_nothing,
            schedule_fire_is_fenced,
            next_due_at_includes_schedules,
            jobs_delete_removes_only_unleased_jobs_in_the_given_states,
            job_replace_starts_a_job_over_under_the_same_key,
            agents_ready_now_counts_only_due_claimable_steps,
            faktory_backoff_formula_round_trips_and_times_retries,
            tokens_are_created_found_listed_and_revoked,
            a_setting_is_stored_once_and_shared,
            submitted_by_is_kept_and_filters_the_list,
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
        .claimed
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
        .leases_report(reports, at(2_200))
        .await
        .expect("a batch with refusals still commits");
    assert_eq!(out.len(), 5);

    let (lease, t) = out[0].as_ref().expect("first report applies");
    assert_eq!(
        (lease.lease_id, lease.job_id, lease.step),
        (l1, job_id(1), 0)
    );
    assert_eq!(t.job.state, JobState::Succeeded);
    let (_, t) = out[1].as_ref().expect("second report applies");
    assert_eq!(t.job.steps[0].state, StepState::Ready);
    assert_eq!(t.job.steps[0].next_attempt_at, Some(at(3_200)));
    assert!(matches!(out[2], Err(Error::LeaseNotFound(l)) if l == lease_id(999)));
    // A refusal is an `Err(Rejected)` or a committed refusal reply, as the same `job_apply`
    // would answer; either way nothing about the job changes.
    let refused = |o: &crate::Reported| match o {
        Err(Error::Rejected(_)) => true,
        Ok((_, t)) => matches!(t.reply, Reply::Refused(_)),
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

fn complete(step: usize, attempt: u32, result: Value) -> Command {
    Command::Complete {
        step,
        attempt,
        result,
    }
}

fn fatal(step: usize, attempt: u32, error: &str) -> Command {
    Command::Fail {
        step,
        attempt,
        error: error.into(),
        retryable: false,
        jitter: 0.0,
    }
}

/// Two steps, `a` (agent `w`, undone by agent `undo`) then `b` (agent `w`, one attempt), with
/// `on_failure` and `extra` fields merged into the job body and `a_extra` into step `a`.
fn undoable(on_failure: &str, a_extra: Value) -> JobSpec {
    let mut a = json!({"name": "a", "agent": "w",
        "compensate": {"agent": "undo", "payload": {"refund": 12}}});
    if let (Some(a), Value::Object(extra)) = (a.as_object_mut(), a_extra) {
        a.extend(extra);
    }
    spec(json!({"on_failure": on_failure, "steps": [
        a,
        {"name": "b", "agent": "w", "depends_on": ["a"], "max_attempts": 1}
    ]}))
}

/// Submits an [`undoable`] job at `at(0)` and runs it until `b` fails fatally at `at(40)`, `a`
/// having completed at `at(20)`. Uses lease ids `first_lease` and `first_lease + 1`; no other
/// job may have `w` steps ready.
async fn run_until_b_fails(
    store: &dyn Store,
    id: JobId,
    s: &JobSpec,
    first_lease: u128,
) -> Transition {
    submit(store, admitted(id, s, at(0))).await;
    let a = claim(store, "w", 1, first_lease, at(10)).await;
    assert_eq!(claimed_jobs(&a), vec![id]);
    apply(store, id, complete(0, 1, json!({"charged": 12})), at(20)).await;
    let b = claim(store, "w", 1, first_lease + 1, at(30)).await;
    assert_eq!(claimed_jobs(&b), vec![id]);
    apply(store, id, fatal(1, 1, "out of stock"), at(40)).await
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
        .job_apply(id, complete(0, 1, json!("stale")), at(60))
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
        .leases_expired(at(1_049), 10)
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
        store.leases_expired(at(1_050), 10).await.expect("expired"),
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
        .leases_expired(at(10_000), 10)
        .await
        .expect("expired")
        .is_empty());
    assert_eq!(
        store.next_due_at(at(1_050)).await.expect("due"),
        Some(at(3_050))
    );

    assert!(store
        .agents_due(at(1_050), at(3_049))
        .await
        .expect("agents")
        .is_empty());
    assert_eq!(
        store
            .agents_due(at(3_049), at(3_050))
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

/// The deliveries due at a far-off instant, i.e. every live one.
async fn live_deliveries(store: &dyn Store) -> Vec<Delivery> {
    store
        .deliveries_due(at(1_000_000_000), 1_000)
        .await
        .expect("deliveries")
}

/// The delivery records `t` calls for at `now`, as the core describes them, without row ids.
fn expected_deliveries(
    t: &Transition,
    now: Timestamp,
) -> Vec<(DeliveryKind, Option<String>, String, Value)> {
    outbox::outgoing(t, now)
        .into_iter()
        .map(|o| (o.kind, o.url, o.idempotency_key, o.body))
        .collect()
}

fn delivery_fields(d: &Delivery) -> (DeliveryKind, Option<String>, String, Value) {
    (
        d.kind,
        d.url.clone(),
        d.idempotency_key.clone(),
        d.body.clone(),
    )
}

// Proves a job with a `callback_url` finishing and a transition raising an alert record their
// deliveries with the transition, exactly as `outbox::outgoing` describes, due from the
// transition's time, oldest first, and that transitions without durable effects record none.
pub async fn alerts_and_callbacks_are_recorded_for_delivery(f: &Fixture) {
    let store = &*f.store;
    assert!(live_deliveries(store).await.is_empty());
    assert_eq!(store.deliveries_counts().await.expect("counts"), (0, 0));

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
            kind: "job_blocked",
            ..
        }
    )));

    assert!(store
        .deliveries_due(at(19), 10)
        .await
        .expect("due")
        .is_empty());
    let first = store.deliveries_due(at(29), 10).await.expect("due");
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

    let all = store.deliveries_due(at(30), 10).await.expect("due");
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
        store.deliveries_due(at(30), 1).await.expect("due"),
        all[..1]
    );
    assert_eq!(store.deliveries_counts().await.expect("counts"), (2, 0));
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
        kind: "test",
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
        kind: "test",
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
    assert_eq!(store.deliveries_counts().await.expect("counts"), (3, 0));
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
    let due = store.deliveries_due(at(100), 10).await.expect("due");
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
    let due = store.deliveries_due(at(4_999), 10).await.expect("due");
    assert_eq!(
        due.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![two.id, three.id]
    );
    let due = store.deliveries_due(at(5_000), 10).await.expect("due");
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
        .delivery_update(two.id, DeliveryOutcome::Delivered)
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
    let due = store.deliveries_due(at(1_000_000), 10).await.expect("due");
    assert_eq!(due.iter().map(|d| d.id).collect::<Vec<_>>(), vec![one.id]);
    assert_eq!(store.deliveries_counts().await.expect("counts"), (1, 1));

    // A delivery that is gone (delivered elsewhere) takes any late outcome quietly.
    store
        .delivery_update(two.id, DeliveryOutcome::Delivered)
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
    assert_eq!(store.deliveries_counts().await.expect("counts"), (1, 1));
    store
        .delivery_update(one.id, DeliveryOutcome::Delivered)
        .await
        .expect("delivered");
    assert!(live_deliveries(store).await.is_empty());
    assert_eq!(store.deliveries_counts().await.expect("counts"), (0, 1));
}

// Proves `jobs_active` lists exactly the unfinished jobs (pending, running, blocked,
// compensating) in id order, and paging after the last id visits each once.
pub async fn jobs_active_pages_through_unfinished_jobs(f: &Fixture) {
    let store = &*f.store;
    assert!(store
        .jobs_active(None, 10)
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

    assert_eq!(store.jobs_active(None, 100).await.expect("active"), active);
    assert!(store.jobs_active(None, 0).await.expect("active").is_empty());
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store.jobs_active(after, 3).await.expect("page");
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
        .jobs_active(last, 10)
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
        .find(|e| e.kind == "step_retried")
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
        .any(|e| e.kind == "job_resumed"));

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
    let kinds: Vec<String> = all_events(store, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.iter().any(|k| k == "job_repaired"), "{kinds:?}");

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

// ---- Claim order by aging, agent limits ----

/// Claims like [`claim`], answering the whole [`ClaimResult`].
async fn claim_full(
    store: &dyn Store,
    agent: &str,
    max: u128,
    first_lease: u128,
    now: Timestamp,
) -> ClaimResult {
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

fn prioritised(priority: i32, agent: &str) -> JobSpec {
    spec(json!({"priority": priority, "steps": [{"name": "s", "agent": agent}]}))
}

async fn put_settings(store: &dyn Store, agent: &str, settings: AgentSettings, now: Timestamp) {
    let stored = store
        .agent_settings_put(agent, settings.clone(), now)
        .await
        .expect("put settings");
    assert_eq!(stored, settings);
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
        vec![("p".to_string(), paused)]
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

// ---- Ordering keys ----

fn keyed(key: &str, agent: &str) -> JobSpec {
    spec(json!({"ordering_key": key, "steps": [{"name": "s", "agent": agent}]}))
}

/// Claims the only step of `id` (agent `agent`, which has no other ready step) and completes it.
async fn run_to_success(
    store: &dyn Store,
    id: JobId,
    agent: &str,
    lease: u128,
    now: Timestamp,
) -> Transition {
    let got = claim(store, agent, 1, lease, now).await;
    assert_eq!(claimed_jobs(&got), vec![id]);
    let attempt = got[0].transition.job.steps[0].attempt;
    let done = apply(store, id, complete(0, attempt, json!(null)), now).await;
    assert_eq!(done.job.state, JobState::Succeeded);
    done
}

// Proves jobs of one key run one at a time: the first starts at submit, the second waits
// (pending, not due, no wake-up) while the first runs, and starts in the very transaction that
// finishes the first (no sweep needed), whose answer carries the wake-up for its agent.
pub async fn ordering_key_runs_one_job_at_a_time(f: &Fixture) {
    let store = &*f.store;
    let (first, second) = (job_id(1), job_id(2));
    let started = submit(store, admitted(first, &keyed("acct", "ok"), at(0))).await;
    assert_eq!(started.job.state, JobState::Running);
    assert_eq!(started.job.steps[0].state, StepState::Ready);
    let waiting = submit(store, admitted(second, &keyed("acct", "ok"), at(10))).await;
    assert_eq!(waiting.job.state, JobState::Pending);
    assert_eq!(get(store, second).await, waiting.job);

    assert!(store.jobs_due(at(1_000), 10).await.expect("due").is_empty());
    assert_eq!(store.next_due_at(at(1_000)).await.expect("next"), None);
    // Even a stray `Activate` cannot start it while the head is unfinished.
    match store.job_apply(second, Command::Activate, at(1_000)).await {
        Err(Error::Rejected(Rejection::NotDue)) => {}
        other => panic!("expected NotDue, got {other:?}"),
    }
    assert_eq!(get(store, second).await, waiting.job);
    let status = store.ordering_key_status("acct").await.expect("status");
    assert_eq!(status.key, "acct");
    assert_eq!(status.head.map(|j| j.id), Some(first));
    assert_eq!(status.waiting, 1);

    let done = run_to_success(store, first, "ok", 1, at(2_000)).await;
    assert!(
        done.effects.contains(&Effect::Ready { agent: "ok".into() }),
        "the finishing answer wakes the next job's agent: {:?}",
        done.effects
    );
    let status = store.ordering_key_status("acct").await.expect("status");
    assert_eq!(
        status.head.as_ref().map(|j| (j.id, j.state)),
        Some((second, JobState::Running))
    );
    assert_eq!(status.waiting, 0);
    let started = get(store, second).await;
    assert_eq!(started.steps[0].state, StepState::Ready);
    assert_eq!(started.steps[0].ready_at, Some(at(2_000)));
    assert!(store.jobs_due(at(3_000), 10).await.expect("due").is_empty());
    assert_eq!(
        claimed_jobs(&claim(store, "ok", 1, 2, at(2_000)).await),
        vec![second]
    );

    let unknown = store.ordering_key_status("nobody").await.expect("status");
    assert_eq!(
        unknown,
        OrderingKeyStatus {
            key: "nobody".into(),
            head: None,
            waiting: 0
        }
    );
}

// Proves a blocked head (on_failure hold) holds its own key only: the job behind it is not due,
// while a delayed job of another key comes due.
pub async fn blocked_head_holds_only_its_key(f: &Fixture) {
    let store = &*f.store;
    let (head, behind, other) = (job_id(1), job_id(2), job_id(3));
    let fragile = spec(json!({"ordering_key": "k1", "on_failure": "hold",
        "steps": [{"name": "s", "agent": "bh", "max_attempts": 1}]}));
    submit(store, admitted(head, &fragile, at(0))).await;
    submit(store, admitted(behind, &keyed("k1", "bh"), at(1))).await;
    let delayed = spec(json!({"ordering_key": "k2", "run_at": at(500),
        "steps": [{"name": "s", "agent": "bh"}]}));
    let t = submit(store, admitted(other, &delayed, at(2))).await;
    assert_eq!(
        t.job.state,
        JobState::Pending,
        "a head waits for its run_at"
    );
    assert!(store.jobs_due(at(499), 10).await.expect("due").is_empty());
    assert_eq!(
        store.next_due_at(at(100)).await.expect("next"),
        Some(at(500))
    );

    let got = claim(store, "bh", 1, 1, at(100)).await;
    assert_eq!(claimed_jobs(&got), vec![head]);
    let blocked = apply(store, head, fatal(0, 1, "poisoned"), at(200)).await;
    assert_eq!(blocked.job.state, JobState::Blocked);

    assert_eq!(
        store.jobs_due(at(1_000), 10).await.expect("due"),
        vec![other]
    );
    let k1 = store.ordering_key_status("k1").await.expect("status");
    assert_eq!(
        k1.head.map(|j| (j.id, j.state)),
        Some((head, JobState::Blocked))
    );
    assert_eq!(k1.waiting, 1);
    assert_eq!(get(store, behind).await.state, JobState::Pending);
}

// Proves a key's jobs run in submission order, not id or time order: five jobs submitted with
// falling ids at one instant (two in one batch) each head the key in turn, each started by the
// completion of the one before it.
pub async fn ordering_key_keeps_submission_order(f: &Fixture) {
    let store = &*f.store;
    let order: Vec<JobId> = (1..=5).rev().map(job_id).collect();
    let spec = keyed("seq", "so");
    let first_two = store
        .jobs_submit(vec![
            admitted(order[0], &spec, at(0)),
            admitted(order[1], &spec, at(0)),
        ])
        .await
        .expect("submit");
    let states: Vec<JobState> = first_two
        .iter()
        .map(|s| match s {
            Submitted::Created(t) => t.job.state,
            other => panic!("expected created, got {other:?}"),
        })
        .collect();
    assert_eq!(states, vec![JobState::Running, JobState::Pending]);
    for &id in &order[2..] {
        let t = submit(store, admitted(id, &spec, at(0))).await;
        assert_eq!(t.job.state, JobState::Pending);
    }

    for (i, &id) in order.iter().enumerate() {
        let now = at(1_000 * (i as i64 + 1));
        let status = store.ordering_key_status("seq").await.expect("status");
        assert_eq!(status.head.as_ref().map(|j| j.id), Some(id), "turn {i}");
        assert_eq!(status.waiting, (order.len() - i - 1) as u64);
        assert_eq!(get(store, id).await.state, JobState::Running, "turn {i}");
        assert!(store.jobs_due(now, 10).await.expect("due").is_empty());
        run_to_success(store, id, "so", 10 + i as u128, now).await;
    }
    let done = store.ordering_key_status("seq").await.expect("status");
    assert_eq!((done.head, done.waiting), (None, 0));
}

// Proves the next job of a key starts in the transaction that finishes the head, whichever way
// it finishes (a fatal failure, a cancel), and that a next job whose `run_at` is still ahead is
// left pending for the timer instead.
pub async fn every_way_a_head_finishes_starts_the_next(f: &Fixture) {
    let store = &*f.store;
    let (failing, cancelled, delayed) = (job_id(1), job_id(2), job_id(3));
    let one_try = spec(json!({"ordering_key": "fin", "on_failure": "fail",
        "steps": [{"name": "s", "agent": "fin", "max_attempts": 1}]}));
    submit(store, admitted(failing, &one_try, at(0))).await;
    submit(store, admitted(cancelled, &keyed("fin", "fin"), at(1))).await;
    let later = spec(json!({"ordering_key": "fin", "run_at": at(9_000),
        "steps": [{"name": "s", "agent": "fin"}]}));
    submit(store, admitted(delayed, &later, at(2))).await;

    let got = claim(store, "fin", 1, 1, at(100)).await;
    assert_eq!(claimed_jobs(&got), vec![failing]);
    let failed = apply(store, failing, fatal(0, 1, "no"), at(200)).await;
    assert_eq!(failed.job.state, JobState::Failed);
    assert_eq!(get(store, cancelled).await.state, JobState::Running);

    let t = apply(store, cancelled, Command::Cancel, at(300)).await;
    assert_eq!(t.job.state, JobState::Cancelled);
    assert_eq!(
        get(store, delayed).await.state,
        JobState::Pending,
        "not before its run_at"
    );
    assert_eq!(
        store.next_due_at(at(300)).await.expect("next"),
        Some(at(9_000))
    );
    assert_eq!(
        store.jobs_due(at(9_000), 10).await.expect("due"),
        vec![delayed]
    );
}

// ---- Leader lease and fencing ----

// Proves the leader lease: taken when free (epoch 1), renewed by its holder (same epoch), refused
// to others until it expires, then taken with the next epoch; a release by a stale holder does
// nothing, by the holder it frees the lease at once keeping the epoch.
pub async fn leader_lease_changes_hands_with_epochs(f: &Fixture) {
    let store = &*f.store;
    let ttl = overseer_core::Span::from_secs(10);
    let lease = |node: &str, epoch: i64, expires: Timestamp| Leadership {
        node: node.into(),
        epoch,
        expires_at: expires,
    };
    assert_eq!(store.leader_get().await.expect("get"), None);
    let acquire = |node: &'static str, now: Timestamp| store.leader_acquire(node, ttl, now);

    assert_eq!(
        acquire("a", at(0)).await.expect("a"),
        Some(lease("a", 1, at(10_000)))
    );
    assert_eq!(acquire("b", at(5_000)).await.expect("b"), None);
    assert_eq!(
        acquire("a", at(5_000)).await.expect("renew"),
        Some(lease("a", 1, at(15_000)))
    );
    assert_eq!(acquire("b", at(14_999)).await.expect("b"), None);
    assert_eq!(
        acquire("b", at(15_000)).await.expect("steal"),
        Some(lease("b", 2, at(25_000)))
    );
    assert_eq!(acquire("a", at(16_000)).await.expect("a"), None);
    assert_eq!(
        store.leader_get().await.expect("get"),
        Some(lease("b", 2, at(25_000)))
    );

    store.leader_release("a", 1).await.expect("stale release");
    store.leader_release("b", 1).await.expect("wrong epoch");
    assert_eq!(
        store.leader_get().await.expect("get"),
        Some(lease("b", 2, at(25_000)))
    );
    store.leader_release("b", 2).await.expect("release");
    let released = store.leader_get().await.expect("get").expect("lease row");
    assert_eq!((released.node.as_str(), released.epoch), ("b", 2));
    assert!(released.expires_at <= at(17_000), "released at once");
    assert_eq!(
        acquire("a", at(17_000)).await.expect("a"),
        Some(lease("a", 3, at(27_000)))
    );
    // Even its last holder takes an expired lease with a new epoch.
    assert_eq!(
        acquire("a", at(27_000)).await.expect("a"),
        Some(lease("a", 4, at(37_000)))
    );
}

// Proves `job_apply_fenced` writes only under the current, unexpired lease: refused after its
// expiry and after another node took over, with nothing written; the new leader's fence works.
pub async fn fenced_apply_is_refused_after_a_takeover(f: &Fixture) {
    let store = &*f.store;
    let ttl = overseer_core::Span::from_secs(10);
    let id = job_id(1);
    let delayed = spec(json!({"run_at": at(500), "steps": [{"name": "s", "agent": "w"}]}));
    let admitted_job = submit(store, admitted(id, &delayed, at(0))).await.job;
    let history = all_events(store, id).await;

    let a = store
        .leader_acquire("a", ttl, at(0))
        .await
        .expect("a")
        .expect("lead");
    let a = Fence {
        node: a.node,
        epoch: a.epoch,
    };
    let refused = |r: Result<Transition>, epoch: i64, what: &str| match r {
        Err(Error::Fenced { epoch: e }) => assert_eq!(e, epoch, "{what}"),
        other => panic!("{what}: expected Fenced, got {other:?}"),
    };
    refused(
        store
            .job_apply_fenced(id, Command::Activate, at(10_000), &a)
            .await,
        1,
        "the lease expired at 10 s",
    );
    let b = store
        .leader_acquire("b", ttl, at(10_000))
        .await
        .expect("b")
        .expect("lead");
    let b = Fence {
        node: b.node,
        epoch: b.epoch,
    };
    assert_eq!(b.epoch, 2);
    refused(
        store
            .job_apply_fenced(id, Command::Activate, at(10_001), &a)
            .await,
        1,
        "another node took over",
    );
    assert_eq!(get(store, id).await, admitted_job, "nothing written");
    assert_eq!(all_events(store, id).await, history);

    let t = store
        .job_apply_fenced(id, Command::Activate, at(10_002), &b)
        .await
        .expect("the current leader writes");
    assert_eq!(t.job.state, JobState::Running);
    assert_eq!(get(store, id).await, t.job);
    // The core's own rules still apply behind the fence.
    match store
        .job_apply_fenced(id, Command::Activate, at(10_003), &b)
        .await
    {
        Err(Error::Rejected(Rejection::NotDue)) => {}
        other => panic!("expected NotDue, got {other:?}"),
    }
}

// ---- Schedules ----

fn schedule_spec(name: &str, extra: Value) -> ScheduleSpec {
    let mut body = json!({"name": name, "cron": "* * * * *",
        "job": {"steps": [{"name": "s", "agent": "cron"}]}});
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    serde_json::from_value(body).expect("schedule spec decodes")
}

fn new_schedule(spec: ScheduleSpec, next: Timestamp, now: Timestamp) -> Schedule {
    Schedule {
        name: spec.name.clone(),
        spec,
        paused: false,
        next_fire_at: Some(next),
        last_fire_at: None,
        last_job_id: None,
        created_at: now,
        updated_at: now,
    }
}

/// The firing of `schedule` at `due`, creating job `id`, moving on to `next`.
fn firing(
    schedule: &Schedule,
    due: Timestamp,
    next: Option<Timestamp>,
    id: JobId,
    now: Timestamp,
) -> Fire {
    let job = schedule.spec.job_for(due);
    Fire {
        name: schedule.name.clone(),
        due_at: due,
        next_fire_at: next,
        job: admitted(id, &job, now),
        now,
    }
}

async fn lead(store: &dyn Store, node: &str, now: Timestamp) -> Fence {
    let lease = store
        .leader_acquire(node, overseer_core::Span::from_secs(10), now)
        .await
        .expect("acquire")
        .expect("leads");
    Fence {
        node: lease.node,
        epoch: lease.epoch,
    }
}

async fn schedule(store: &dyn Store, name: &str) -> Schedule {
    store
        .schedule_get(name)
        .await
        .expect("schedule_get")
        .expect("schedule exists")
}

async fn all_jobs(store: &dyn Store) -> Vec<Job> {
    store
        .jobs_list(JobQuery {
            limit: 1_000,
            ..JobQuery::default()
        })
        .await
        .expect("list")
}

// Proves schedule definitions: creating again with the same spec answers the stored one (not
// created), another spec under the name conflicts; get, list, pause, resume and delete.
pub async fn schedule_create_is_idempotent_and_conflicts(f: &Fixture) {
    let store = &*f.store;
    let nightly = new_schedule(schedule_spec("nightly", json!({})), at(60_000), at(0));
    let (stored, created) = store
        .schedule_create(nightly.clone())
        .await
        .expect("create");
    assert!(created);
    assert_eq!(stored, nightly);
    assert_eq!(schedule(store, "nightly").await, nightly);

    let again = new_schedule(schedule_spec("nightly", json!({})), at(120_000), at(50_000));
    let (stored, created) = store.schedule_create(again).await.expect("create again");
    assert!(!created);
    assert_eq!(stored, nightly, "the stored schedule, untouched");
    let other = new_schedule(
        schedule_spec("nightly", json!({"cron": "0 * * * *"})),
        at(0),
        at(0),
    );
    match store.schedule_create(other).await {
        Err(Error::ScheduleConflict(name)) => assert_eq!(name, "nightly"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let hourly = new_schedule(
        schedule_spec("hourly", json!({"overlap": "allow"})),
        at(30_000),
        at(1),
    );
    store.schedule_create(hourly.clone()).await.expect("create");
    let names: Vec<String> = store
        .schedules_list()
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, vec!["hourly", "nightly"]);

    let paused = store
        .schedule_set_paused("nightly", true, None, at(100))
        .await
        .expect("pause");
    assert_eq!(
        (paused.paused, paused.next_fire_at, paused.updated_at),
        (true, None, at(100))
    );
    assert_eq!(schedule(store, "nightly").await, paused);
    let due: Vec<String> = store
        .schedules_due(at(1_000_000), 10)
        .await
        .expect("due")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(due, vec!["hourly"], "a paused schedule is never due");
    let resumed = store
        .schedule_set_paused("nightly", false, Some(at(90_000)), at(200))
        .await
        .expect("resume");
    assert_eq!(
        (resumed.paused, resumed.next_fire_at),
        (false, Some(at(90_000)))
    );
    let due: Vec<String> = store
        .schedules_due(at(1_000_000), 10)
        .await
        .expect("due")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(due, vec!["hourly", "nightly"], "earliest first");
    assert!(store
        .schedules_due(at(29_999), 10)
        .await
        .expect("due")
        .is_empty());
    assert_eq!(
        store
            .schedules_due(at(1_000_000), 1)
            .await
            .expect("due")
            .len(),
        1
    );

    match store
        .schedule_set_paused("missing", true, None, at(300))
        .await
    {
        Err(Error::ScheduleNotFound(name)) => assert_eq!(name, "missing"),
        other => panic!("expected not found, got {other:?}"),
    }
    assert!(store.schedule_delete("nightly").await.expect("delete"));
    assert!(!store
        .schedule_delete("nightly")
        .await
        .expect("delete again"));
    assert_eq!(store.schedule_get("nightly").await.expect("get"), None);
}

// Proves a due time fires exactly once when 8 firings race on it: one `Fired`, seven `Stale`,
// one job in the store, and the schedule advanced with the firing recorded.
pub async fn schedule_fires_exactly_once_under_a_race(f: &Fixture) {
    let store = &*f.store;
    let every = new_schedule(schedule_spec("every", json!({})), at(60_000), at(0));
    store.schedule_create(every.clone()).await.expect("create");
    let fence = lead(store, "n1", at(60_000)).await;

    let mut tasks = tokio::task::JoinSet::new();
    for racer in 0..8u64 {
        let store = f.store.clone();
        let fire = firing(
            &every,
            at(60_000),
            Some(at(120_000)),
            job_id(100 + racer),
            at(60_005),
        );
        let fence = fence.clone();
        tasks.spawn(async move { store.schedule_fire(fire, &fence).await });
    }
    let (mut fired, mut stale) = (Vec::new(), 0);
    while let Some(outcome) = tasks.join_next().await {
        match outcome.expect("task").expect("fire") {
            FireOutcome::Fired(Submitted::Created(t)) => fired.push(t.job),
            FireOutcome::Stale => stale += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!((fired.len(), stale), (1, 7));
    let job = &fired[0];
    assert_eq!(ids(&all_jobs(store).await), vec![job.id]);
    assert_eq!(get(store, job.id).await, *job);
    assert_eq!(
        job.idempotency_key.as_deref(),
        Some("schedule/every/1700000060000")
    );
    assert_eq!(
        job.labels.get("schedule").map(String::as_str),
        Some("every")
    );
    let after = schedule(store, "every").await;
    assert_eq!(after.next_fire_at, Some(at(120_000)));
    assert_eq!(after.last_fire_at, Some(at(60_000)));
    assert_eq!(after.last_job_id, Some(job.id));
    assert_eq!(after.updated_at, at(60_005));
    assert!(store
        .schedules_due(at(119_999), 10)
        .await
        .expect("due")
        .is_empty());
}

// Proves `overlap: skip` passes over a due time while the last job runs (advancing, no job),
// fires again once it finished, and `overlap: allow` fires regardless.
pub async fn schedule_overlap_skip_and_allow(f: &Fixture) {
    let store = &*f.store;
    let fence = lead(store, "n1", at(0)).await;
    let skip = new_schedule(schedule_spec("skip", json!({})), at(1_000), at(0));
    store.schedule_create(skip.clone()).await.expect("create");

    let first = match store
        .schedule_fire(
            firing(&skip, at(1_000), Some(at(2_000)), job_id(1), at(1_000)),
            &fence,
        )
        .await
        .expect("fire")
    {
        FireOutcome::Fired(Submitted::Created(t)) => t.job.id,
        other => panic!("expected fired, got {other:?}"),
    };
    match store
        .schedule_fire(
            firing(&skip, at(2_000), Some(at(3_000)), job_id(2), at(2_000)),
            &fence,
        )
        .await
        .expect("fire")
    {
        FireOutcome::Skipped { running } => assert_eq!(running, first),
        other => panic!("expected skipped, got {other:?}"),
    }
    assert!(store.job_get(job_id(2)).await.expect("get").is_none());
    let s = schedule(store, "skip").await;
    assert_eq!(
        (s.next_fire_at, s.last_fire_at, s.last_job_id),
        (Some(at(3_000)), Some(at(1_000)), Some(first))
    );

    run_to_success(store, first, "cron", 1, at(2_500)).await;
    match store
        .schedule_fire(
            firing(&skip, at(3_000), Some(at(4_000)), job_id(3), at(3_000)),
            &fence,
        )
        .await
        .expect("fire")
    {
        FireOutcome::Fired(Submitted::Created(t)) => assert_eq!(t.job.id, job_id(3)),
        other => panic!("expected fired, got {other:?}"),
    }

    let allow = new_schedule(
        schedule_spec("allow", json!({"overlap": "allow"})),
        at(1_000),
        at(0),
    );
    store.schedule_create(allow.clone()).await.expect("create");
    for (n, due) in [(10, 1_000), (11, 2_000)] {
        match store
            .schedule_fire(
                firing(&allow, at(due), Some(at(due + 1_000)), job_id(n), at(due)),
                &fence,
            )
            .await
            .expect("fire")
        {
            FireOutcome::Fired(Submitted::Created(t)) => assert_eq!(t.job.id, job_id(n)),
            other => panic!("expected fired, got {other:?}"),
        }
    }
    assert_eq!(get(store, job_id(10)).await.state, JobState::Running);
}

// Proves a firing whose due time is not the stored `next_fire_at` (already fired, or never
// due), or of a paused schedule, is `Stale` and writes nothing; a missing schedule is not found.
pub async fn schedule_fire_with_a_stale_due_time_writes_nothing(f: &Fixture) {
    let store = &*f.store;
    let fence = lead(store, "n1", at(55_000)).await;
    let s = new_schedule(schedule_spec("s", json!({})), at(60_000), at(0));
    store.schedule_create(s.clone()).await.expect("create");
    for due in [0, 59_999, 120_000] {
        match store
            .schedule_fire(
                firing(&s, at(due), Some(at(180_000)), job_id(1), at(60_000)),
                &fence,
            )
            .await
            .expect("fire")
        {
            FireOutcome::Stale => {}
            other => panic!("due {due}: expected stale, got {other:?}"),
        }
    }
    assert_eq!(schedule(store, "s").await, s);
    assert!(all_jobs(store).await.is_empty());

    store
        .schedule_set_paused("s", true, Some(at(60_000)), at(1))
        .await
        .expect("pause");
    match store
        .schedule_fire(
            firing(&s, at(60_000), Some(at(120_000)), job_id(2), at(60_000)),
            &fence,
        )
        .await
        .expect("fire")
    {
        FireOutcome::Stale => {}
        other => panic!("paused: expected stale, got {other:?}"),
    }
    assert!(all_jobs(store).await.is_empty());
    let mut gone = s.clone();
    gone.name = "gone".into();
    match store
        .schedule_fire(
            firing(&gone, at(60_000), None, job_id(3), at(60_000)),
            &fence,
        )
        .await
    {
        Err(Error::ScheduleNotFound(name)) => assert_eq!(name, "gone"),
        other => panic!("expected not found, got {other:?}"),
    }
}

// Proves `schedule_fire` is fenced: a deposed leader's firing is refused with nothing written,
// and the new leader fires the same due time.
pub async fn schedule_fire_is_fenced(f: &Fixture) {
    let store = &*f.store;
    let s = new_schedule(schedule_spec("s", json!({})), at(60_000), at(0));
    store.schedule_create(s.clone()).await.expect("create");
    let old = lead(store, "a", at(0)).await;
    let new = lead(store, "b", at(50_000)).await;
    match store
        .schedule_fire(
            firing(&s, at(60_000), Some(at(120_000)), job_id(1), at(60_000)),
            &old,
        )
        .await
    {
        Err(Error::Fenced { epoch }) => assert_eq!(epoch, old.epoch),
        other => panic!("expected fenced, got {other:?}"),
    }
    assert_eq!(schedule(store, "s").await, s);
    assert!(all_jobs(store).await.is_empty());
    match store
        .schedule_fire(
            firing(&s, at(60_000), Some(at(120_000)), job_id(2), at(59_000)),
            &new,
        )
        .await
        .expect("fire")
    {
        FireOutcome::Fired(Submitted::Created(t)) => assert_eq!(t.job.id, job_id(2)),
        other => panic!("expected fired, got {other:?}"),
    }
}

// Proves `next_due_at` wakes the supervisor for a schedule's next due time, and forgets it
// while the schedule is paused.
pub async fn next_due_at_includes_schedules(f: &Fixture) {
    let store = &*f.store;
    let s = new_schedule(schedule_spec("s", json!({})), at(60_000), at(0));
    store.schedule_create(s).await.expect("create");
    assert_eq!(
        store.next_due_at(at(0)).await.expect("next"),
        Some(at(60_000))
    );
    let delayed = spec(json!({"run_at": at(30_000), "steps": [{"name": "s", "agent": "w"}]}));
    submit(store, admitted(job_id(1), &delayed, at(0))).await;
    assert_eq!(
        store.next_due_at(at(0)).await.expect("next"),
        Some(at(30_000))
    );
    apply(store, job_id(1), Command::Cancel, at(1)).await;
    assert_eq!(
        store.next_due_at(at(1)).await.expect("next"),
        Some(at(60_000))
    );
    store
        .schedule_set_paused("s", true, None, at(2))
        .await
        .expect("pause");
    assert_eq!(store.next_due_at(at(2)).await.expect("next"), None);
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
        .jobs_delete(
            vec![job_id(1), job_id(2), job_id(4), job_id(99)],
            vec![JobState::Running],
        )
        .await
        .expect("delete");
    assert_eq!(
        deleted,
        vec![job_id(2)],
        "leased, pending and missing jobs stay"
    );
    assert!(store.job_get(job_id(2)).await.expect("get").is_none());
    assert!(matches!(
        store.job_events(job_id(2), 0, 10).await,
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
        .jobs_delete(
            vec![job_id(3), job_id(4), job_id(1)],
            vec![JobState::Pending, JobState::Succeeded, JobState::Failed],
        )
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
        .jobs_delete(Vec::new(), vec![JobState::Running])
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
        .job_replace(
            job_id(1),
            vec![JobState::Running],
            admitted(job_id(2), &body(2), at(2)),
        )
        .await
        .expect("replace");
    assert!(refused.is_none());
    assert!(store.job_get(job_id(2)).await.expect("get").is_none());
    apply(store, job_id(1), fatal(0, 1, "boom"), at(3)).await;
    assert_eq!(get(store, job_id(1)).await.state, JobState::Failed);
    // Wrong expected state: nothing written.
    let refused = store
        .job_replace(
            job_id(1),
            vec![JobState::Running],
            admitted(job_id(2), &body(2), at(4)),
        )
        .await
        .expect("replace");
    assert!(refused.is_none());
    assert_eq!(get(store, job_id(1)).await.state, JobState::Failed);

    // The failed job starts over as job 2, under the same key, ready at once.
    let t = store
        .job_replace(
            job_id(1),
            vec![JobState::Failed],
            admitted(job_id(2), &body(2), at(5)),
        )
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
        .job_replace(
            job_id(4),
            vec![JobState::Running],
            admitted(job_id(5), &taken, at(9)),
        )
        .await
        .expect_err("key taken");
    assert!(matches!(err, Error::IdempotencyConflict { .. }), "{err:?}");
    assert_eq!(get(store, job_id(4)).await.state, JobState::Running);
    assert!(store.job_get(job_id(5)).await.expect("get").is_none());
    assert!(store
        .job_replace(
            job_id(99),
            vec![JobState::Running],
            admitted(job_id(6), &other, at(10))
        )
        .await
        .expect("missing")
        .is_none());
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
    assert_eq!(now, vec![("a".to_string(), 2), ("b".to_string(), 1)]);
    // Once the backoff is over, the retry counts too; a leased step never does.
    assert_eq!(
        claimed_jobs(&claim(store, "a", 1, 2, at(4)).await),
        vec![job_id(1)]
    );
    let later = store
        .agents_ready_now(at(62_002))
        .await
        .expect("ready later");
    assert_eq!(later, vec![("a".to_string(), 1), ("b".to_string(), 2)]);
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

// ---- API tokens ----

// Proves the token records: a token is found by its secret's hash with its whole grant, a
// second token of the same name is refused, the list holds them all, and a revoke stamps the
// record once (a second revoke finds nothing to do) while the record stays findable.
pub async fn tokens_are_created_found_listed_and_revoked(f: &Fixture) {
    use overseer_core::auth::{hash_secret, Grant, Scope, TokenRecord};
    let store = &*f.store;
    let token = |name: &str, secret: &str, scopes: Vec<Scope>, agents: &[&str]| TokenRecord {
        name: name.into(),
        hash: hash_secret(secret),
        grant: Grant {
            scopes,
            agents: agents.iter().map(|a| a.to_string()).collect(),
        },
        created_at: at(0),
        expires_at: Some(at(90_000)),
        revoked_at: None,
    };
    let dns = token("dns-worker", "s1", vec![Scope::Agent], &["dns", "dns-eu"]);
    let ci = token("ci", "s2", vec![Scope::Submit, Scope::Read], &[]);
    store.token_create(dns.clone()).await.expect("create");
    store.token_create(ci.clone()).await.expect("create");
    match store
        .token_create(token("ci", "s3", vec![Scope::Admin], &[]))
        .await
    {
        Err(Error::TokenExists(name)) => assert_eq!(name, "ci"),
        other => panic!("expected TokenExists, got {other:?}"),
    }
    assert_eq!(
        store.token_by_hash(&hash_secret("s1")).await.expect("find"),
        Some(dns.clone())
    );
    assert_eq!(
        store.token_by_hash(&hash_secret("s3")).await.expect("find"),
        None
    );
    let listed = store.tokens_list().await.expect("list");
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&dns) && listed.contains(&ci));
    assert!(store.token_revoke("ci", at(5_000)).await.expect("revoke"));
    assert!(!store.token_revoke("ci", at(6_000)).await.expect("revoke"));
    assert!(!store
        .token_revoke("nobody", at(6_000))
        .await
        .expect("revoke"));
    let revoked = store
        .token_by_hash(&hash_secret("s2"))
        .await
        .expect("find")
        .expect("kept");
    assert_eq!(revoked.revoked_at, Some(at(5_000)));
    assert!(!revoked.is_live(at(5_001)));
}

// ---- Shared settings ----

// Proves a setting is made once: the first value stored is answered to every later caller
// (whatever value it offers), also when many callers race through separate calls, and keys are
// independent.
pub async fn a_setting_is_stored_once_and_shared(f: &Fixture) {
    let store = &*f.store;
    let first = store
        .setting_get_or_insert("webhook_secret", "whsec_first", at(0))
        .await
        .expect("insert");
    assert_eq!(first, "whsec_first");
    let again = store
        .setting_get_or_insert("webhook_secret", "whsec_second", at(1))
        .await
        .expect("get");
    assert_eq!(again, "whsec_first");
    let racers = (0..8).map(|i| {
        let store = f.store.clone();
        async move {
            store
                .setting_get_or_insert("raced", &format!("value-{i}"), at(2))
                .await
                .expect("race")
        }
    });
    let answers = futures::future::join_all(racers).await;
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert!(answers[0].starts_with("value-"));
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

/// Compares a backend's current schema, dumped from a freshly migrated store, with the committed
/// file `crates/store/schema/NAME` (after its header); rewrites the file instead when
/// `OVERSEER_WRITE_SCHEMA=1`.
pub fn check_schema_file(name: &str, dump: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schema")
        .join(name);
    let header = format!(
        "-- The {name} schema as the migrations in `crates/store/migrations/` leave a new store.\n\
         -- Generated: `OVERSEER_WRITE_SCHEMA=1 cargo test -p overseer-store --features testing \
         schema_file`; a test fails when it differs from a migrated store. Never edit by hand.\n\n"
    );
    let expected = format!("{header}{}\n", dump.trim_end());
    if std::env::var("OVERSEER_WRITE_SCHEMA").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &expected).expect("write the schema file");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != expected {
        let first = committed
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .map_or(
                committed.lines().count().min(expected.lines().count()),
                |i| i,
            );
        panic!(
            "{} differs from the migrated schema from line {}: committed {:?}, migrated {:?}. \
             After a new migration, rewrite it with OVERSEER_WRITE_SCHEMA=1 and review the diff.",
            path.display(),
            first + 1,
            committed.lines().nth(first),
            expected.lines().nth(first)
        );
    }
}
