//! The backend conformance suite: what every [`Store`] must do, written once, one module per noun
//! of the store (`jobs`, `ordering` keys, `rerun`s of jobs, `leases`, `agents`, `schedules`,
//! `leader`, `deliveries`, `tokens`, `maintenance`). The largest, `jobs` and `leases`, are split
//! into one file per topic and re-export their cases, so every case is still `noun::case`.
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

pub mod agents;
pub mod deliveries;
pub mod jobs;
pub mod leader;
pub mod leases;
pub mod maintenance;
pub mod ordering;
pub mod rerun;
pub mod schedules;
pub mod tokens;

use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;

use overseer_core::machine::admit;
use overseer_core::outbox::{self, DeliveryKind};
use overseer_core::schedule::ScheduleSpec;
use overseer_core::{
    AlertKind, Command, CompPhase, Effect, EventKind, Job, JobId, JobSpec, JobState, LeaseId,
    Rejection, Reply, StepState, Timestamp, Transition,
};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::prelude::*;
use crate::Prune;
use crate::{
    ActivePage, AgentCounts, AgentLimits, AgentReady, AgentSettings, Apply, Claim, ClaimResult,
    Claimed, Delivery, DeliveryCounts, DeliveryOutcome, Due, DueBetween, Error, EventPage, Fence,
    FinishedCount, Fire, FireOutcome, JobQuery, LeaderBid, Leadership, LeaseRef, NewJob,
    OrderingKeyStatus, Removal, Replacement, Report, ReportApplied, Reports, Result, Schedule,
    ScheduleCreated, SchedulePause, ScheduleUpdate, SettingsUpdate, StateCount, Submitted, Window,
};
use overseer_core::retention::Retention;
use overseer_core::Span;

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
/// expression evaluating to a future of a [`Fixture`] (evaluated afresh for each test). The
/// tests are grouped in one module per noun of the store, like the suite itself
/// (`jobs::submit_and_get_round_trip`, `leases::…`).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        async fn conformance_fixture() -> $crate::conformance::Fixture {
            ($make).await
        }
        $crate::conformance_tests!(@noun jobs:
            submit_and_get_round_trip,
            submitted_by_is_kept_and_filters_the_list,
            idempotent_resubmit_and_conflicts,
            list_filters_by_id_prefix_agent_and_creation_time,
            list_filters_and_paginates,
            complete_promotes_dependants_and_finishes_job,
            run_at_jobs_come_due_and_activate,
            history_keeps_the_newest_events,
            history_reads_the_same_before_and_after_later_writes,
            a_step_leased_again_keeps_every_lease_in_its_history,
            cancel_settles_steps_and_refuses_late_results,
            unknown_ids_and_event_paging,
            jobs_active_pages_through_unfinished_jobs,
            new_fields_round_trip_through_hold_retry_resume_skip,
            repair_heals_an_inconsistent_job,
            jobs_delete_removes_only_unleased_jobs_in_the_given_states,
            job_replace_starts_a_job_over_under_the_same_key,
            faktory_backoff_formula_round_trips_and_times_retries,
            reschedule_moves_run_at_and_priority,
            reschedule_of_a_keyed_job_keeps_its_place_in_the_key,
            stats_count_states_and_finished_minutes,
            job_deadline_is_found_and_enforced,
            whole_job_retry_rounds_are_stored,
        );
        $crate::conformance_tests!(@noun rerun:
            rerun_links_both_ways_and_keeps_what_succeeded,
            rerun_refusals_write_nothing,
            concurrent_reruns_make_exactly_one_job,
            keyed_rerun_waits_for_its_key,
        );
        $crate::conformance_tests!(@noun ordering:
            ordering_key_runs_one_job_at_a_time,
            blocked_head_holds_only_its_key,
            ordering_key_keeps_submission_order,
            a_batch_is_numbered_in_its_order,
            every_way_a_head_finishes_starts_the_next,
        );
        $crate::conformance_tests!(@noun leases:
            claim_orders_by_priority_then_age,
            concurrent_claims_lease_each_step_once,
            stale_report_is_rejected_and_changes_nothing,
            lease_reports_apply_each_and_refuse_only_their_own,
            a_removed_jobs_leases_are_not_found,
            expired_lease_requeues_with_backoff,
            expiries_are_oldest_first_across_agents,
            lease_find_resolves_superseded_leases,
            leases_taken_off_by_an_unwind_stay_fenced,
            undo_is_claimed_by_its_compensate_agent,
            undo_leases_expire_and_backoff_wakes_the_compensate_agent,
            claim_order_ages_priority,
            http_targets_round_trip_and_are_claimed_per_host,
            step_deadline_caps_the_stored_lease,
            heartbeat_progress_is_stored_fenced_and_cleared,
        );
        $crate::conformance_tests!(@noun agents:
            agents_counts_ready_and_running,
            max_concurrency_is_never_exceeded,
            rate_limit_spaces_leases,
            paused_agent_gets_nothing_until_resumed,
            agents_ready_now_counts_only_due_claimable_steps,
        );
        $crate::conformance_tests!(@noun schedules:
            schedule_create_is_idempotent_and_conflicts,
            schedule_fires_exactly_once_under_a_race,
            schedule_overlap_skip_and_allow,
            schedule_fire_with_a_stale_due_time_writes_nothing,
            schedule_fire_is_fenced,
            schedule_update_replaces_the_definition,
            schedule_update_never_refires_and_keeps_pause,
            schedule_update_racing_a_firing_fires_once,
            schedule_pass_advances_without_a_job,
        );
        $crate::conformance_tests!(@noun leader:
            leader_lease_changes_hands_with_epochs,
            fenced_apply_is_refused_after_a_takeover,
        );
        $crate::conformance_tests!(@noun deliveries:
            alerts_and_callbacks_are_recorded_for_delivery,
            deliveries_are_recorded_once_per_idempotency_key,
            delivery_updates_retry_deliver_and_give_up,
            alerts_are_listed_newest_first_and_kept_once_delivered,
        );
        $crate::conformance_tests!(@noun tokens:
            tokens_are_created_found_listed_and_revoked,
            a_setting_is_stored_once_and_shared,
        );
        $crate::conformance_tests!(@noun maintenance:
            next_due_and_agents_due,
            next_due_at_includes_schedules,
            finished_jobs_are_pruned_after_their_retention,
        );
    };
    (@noun $noun:ident: $($case:ident),+ $(,)?) => {
        mod $noun {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let fixture = super::conformance_fixture().await;
                    $crate::conformance::$noun::$case(&fixture).await;
                }
            )+
        }
    };
}

/// The instant every case starts from.
pub const T0: Timestamp = Timestamp(1_700_000_000_000);

/// The supervisor's verdict that attempt `attempt` of step `step` outlived its lease, with no
/// jitter in the backoff it starts.
pub fn expire(step: usize, attempt: u32) -> Command {
    Command::Expire {
        step,
        attempt,
        jitter: 0.0,
    }
}

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
        .steps_claim(Claim::of_worker(
            agent,
            &format!("{agent}-worker"),
            (first_lease..first_lease + max).map(lease_id).collect(),
            now,
        ))
        .await
        .expect("claim")
        .claimed
}

fn claimed_jobs(claimed: &[Claimed]) -> Vec<JobId> {
    claimed.iter().map(|c| c.transition.job.id).collect()
}

async fn apply(store: &dyn Store, id: JobId, command: Command, now: Timestamp) -> Transition {
    store
        .job_apply(Apply::new(id, command, now))
        .await
        .expect("apply")
}

async fn all_events(store: &dyn Store, id: JobId) -> Vec<overseer_core::Event> {
    store
        .job_events(EventPage {
            job: id,
            after_seq: 0,
            limit: 100_000,
        })
        .await
        .expect("events")
}

fn ids(jobs: &[Job]) -> Vec<JobId> {
    jobs.iter().map(|j| j.id).collect()
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

/// The deliveries due at a far-off instant, i.e. every live one.
async fn live_deliveries(store: &dyn Store) -> Vec<Delivery> {
    store
        .deliveries_due(Due {
            now: at(1_000_000_000),
            limit: 1_000,
        })
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

/// Claims like [`claim`], answering the whole [`ClaimResult`].
async fn claim_full(
    store: &dyn Store,
    agent: &str,
    max: u128,
    first_lease: u128,
    now: Timestamp,
) -> ClaimResult {
    store
        .steps_claim(Claim::of_worker(
            agent,
            &format!("{agent}-worker"),
            (first_lease..first_lease + max).map(lease_id).collect(),
            now,
        ))
        .await
        .expect("claim")
}

fn prioritised(priority: i32, agent: &str) -> JobSpec {
    spec(json!({"priority": priority, "steps": [{"name": "s", "agent": agent}]}))
}

async fn put_settings(store: &dyn Store, agent: &str, settings: AgentSettings, now: Timestamp) {
    let stored = store
        .agent_settings_put(SettingsUpdate {
            agent: agent.to_string(),
            settings: settings.clone(),
            now,
        })
        .await
        .expect("put settings");
    assert_eq!(stored, settings);
}

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
        spec: schedule.spec.clone(),
        due_at: due,
        next_fire_at: next,
        job: Some(admitted(id, &job, now)),
        now,
    }
}

async fn lead(store: &dyn Store, node: &str, now: Timestamp) -> Fence {
    let lease = store
        .leader_acquire(LeaderBid {
            node: node.to_string(),
            ttl: overseer_core::Span::from_secs(10),
            now,
        })
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
