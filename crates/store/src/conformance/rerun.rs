//! Reruns (`Jobs::job_rerun`): both links written with the new job in one transaction, the kept
//! steps stored succeeded, the refusals writing nothing, and one rerun however many race.

use overseer_core::rerun::Options;

use super::*;
use crate::{Reran, RerunJob};

/// a → b on agent `rr`, `b` with one attempt, under the idempotency key `key`.
fn chain(key: &str) -> JobSpec {
    spec(
        json!({"idempotency_key": key, "labels": {"team": "shop"}, "priority": 3,
            "on_failure": "fail", "steps": [
            {"name": "a", "agent": "rr", "payload": {"n": 1}},
            {"name": "b", "agent": "rr", "depends_on": ["a"], "max_attempts": 1}
        ]}),
    )
}

/// Submits [`chain`] as `id` and runs it until `b` fails for good at `at(40)` (`a` completed with
/// `{"a": 1}`); no other `rr` step may be ready.
async fn failed_chain(store: &dyn Store, id: JobId, key: &str, lease: u128) -> Job {
    submit(store, admitted(id, &chain(key), at(0))).await;
    let a = claim(store, "rr", 1, lease, at(10)).await;
    assert_eq!(claimed_jobs(&a), vec![id]);
    apply(store, id, complete(0, 1, json!({"a": 1})), at(20)).await;
    let b = claim(store, "rr", 1, lease + 1, at(30)).await;
    assert_eq!(claimed_jobs(&b), vec![id]);
    let t = apply(store, id, fatal(1, 1, "broken"), at(40)).await;
    assert_eq!(t.job.state, JobState::Failed);
    t.job
}

fn rerun_of(old: JobId, new: JobId, from_failed: bool, now: Timestamp) -> RerunJob {
    RerunJob {
        old,
        new,
        options: Options {
            from_failed,
            by: Some("ops".into()),
            reason: Some("fixed".into()),
        },
        submitted_by: Some("operator-token".into()),
        now,
    }
}

async fn rerun(store: &dyn Store, r: RerunJob) -> Reran {
    store.job_rerun(r).await.expect("rerun")
}

// Proves a rerun from failure writes both links and the new job in one go: the old job gets
// `rerun_by` and a `job_rerun` event (and keeps its idempotency key, so a resubmit still finds
// it), the new job `rerun_of`, the caller as submitter, no key, the same definition, the kept
// step succeeded on its old result (`step_kept`), and only the failed step is claimable; it then
// runs to success.
pub async fn rerun_links_both_ways_and_keeps_what_succeeded(f: &Fixture) {
    let store = &*f.store;
    let (old_id, new_id) = (job_id(1), job_id(2));
    let old = failed_chain(store, old_id, "order-1", 1).await;
    let reran = rerun(store, rerun_of(old_id, new_id, true, at(100))).await;
    let stored_old = get(store, old_id).await;
    assert_eq!(stored_old, reran.link.job);
    assert_eq!(stored_old.rerun_by, Some(new_id));
    assert_eq!(stored_old.state, JobState::Failed);
    assert_eq!(stored_old.steps, old.steps);
    let events = all_events(store, old_id).await;
    let last = events.last().expect("history");
    assert_eq!(last.kind, EventKind::JobRerun);
    assert_eq!(
        last.detail.as_ref().map(|d| d["rerun_by"].clone()),
        Some(json!(new_id))
    );

    let new = get(store, new_id).await;
    assert_eq!(new, reran.created.job);
    assert_eq!((new.rerun_of, new.rerun_by), (Some(old_id), None));
    assert_eq!(new.idempotency_key, None);
    assert_eq!(new.submitted_by.as_deref(), Some("operator-token"));
    assert_eq!((new.priority, &new.labels), (old.priority, &old.labels));
    assert_eq!(new.state, JobState::Running);
    assert_eq!(new.steps[0].state, StepState::Succeeded);
    assert_eq!(new.steps[0].result, Some(json!({"a": 1})));
    assert_eq!(new.steps[0].attempt, 0);
    assert_eq!(new.steps[1].state, StepState::Ready);
    let kinds: Vec<String> = all_events(store, new_id)
        .await
        .iter()
        .map(|e| format!("{} {}", e.kind, e.step.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        kinds,
        [
            "job_submitted ",
            "step_kept a",
            "job_started ",
            "step_ready b"
        ]
    );
    // The old job keeps its key.
    let again = store
        .jobs_submit(vec![admitted(job_id(3), &chain("order-1"), at(110))])
        .await
        .expect("resubmit");
    assert!(matches!(&again[..], [Submitted::Existing(j)] if j.id == old_id));

    let b = claim(store, "rr", 5, 10, at(120)).await;
    assert_eq!(claimed_jobs(&b), vec![new_id]);
    assert_eq!(b[0].step, 1);
    assert_eq!(b[0].transition.job.inputs_of(1)["a"], json!({"a": 1}));
    let done = apply(store, new_id, complete(1, 1, json!("ok")), at(130)).await;
    assert_eq!(done.job.state, JobState::Succeeded);
    assert_eq!(
        get(store, new_id).await.steps[0].attempt,
        0,
        "a never ran again"
    );
}

// Proves a plain rerun runs every step again, and that a rerun of an unknown job, of a job that
// is not failed or cancelled, or of one rerun already is refused with nothing written.
pub async fn rerun_refusals_write_nothing(f: &Fixture) {
    let store = &*f.store;
    let old = failed_chain(store, job_id(1), "order-1", 1).await;
    let reran = rerun(store, rerun_of(old.id, job_id(2), false, at(100))).await;
    let states: Vec<StepState> = reran.created.job.steps.iter().map(|s| s.state).collect();
    assert_eq!(states, [StepState::Ready, StepState::Waiting]);

    let refused = |r: Result<Reran>| match r {
        Err(Error::Rejected(rejection)) => rejection,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let before = all_events(store, old.id).await;
    let twice = store
        .job_rerun(rerun_of(old.id, job_id(3), true, at(110)))
        .await;
    assert_eq!(refused(twice), Rejection::AlreadyRerun { by: job_id(2) });
    assert_eq!(all_events(store, old.id).await, before);
    assert!(store.job_get(job_id(3)).await.expect("read").is_none());

    // The rerun itself is running: not rerun until it fails or is cancelled.
    let running = store
        .job_rerun(rerun_of(job_id(2), job_id(4), true, at(120)))
        .await;
    assert!(matches!(refused(running), Rejection::NotAllowed { .. }));
    assert!(store.job_get(job_id(4)).await.expect("read").is_none());
    assert_eq!(get(store, job_id(2)).await.rerun_by, None);

    let missing = store
        .job_rerun(rerun_of(job_id(9), job_id(5), true, at(130)))
        .await;
    assert!(matches!(missing, Err(Error::JobNotFound(id)) if id == job_id(9)));

    // Cancelled: rerun allowed, and a rerun may be rerun in turn once it ends.
    apply(store, job_id(2), Command::Cancel, at(140)).await;
    let second = rerun(store, rerun_of(job_id(2), job_id(6), true, at(150))).await;
    assert_eq!(second.created.job.rerun_of, Some(job_id(2)));
    assert_eq!(get(store, job_id(2)).await.rerun_by, Some(job_id(6)));
}

// Proves concurrent reruns of one job make exactly one new job: the others are refused as
// already rerun, and the old job links to the one that was made.
pub async fn concurrent_reruns_make_exactly_one_job(f: &Fixture) {
    const RACERS: u64 = 8;
    let old = failed_chain(&*f.store, job_id(1), "order-1", 1).await;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..RACERS {
        let store = f.store.clone();
        tasks.spawn(async move {
            let new = job_id(100 + n);
            (
                new,
                store.job_rerun(rerun_of(old.id, new, true, at(100))).await,
            )
        });
    }
    let mut made = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (new, result) = joined.expect("rerun task");
        match result {
            Ok(reran) => {
                assert_eq!(reran.created.job.id, new);
                made.push(new);
            }
            Err(Error::Rejected(Rejection::AlreadyRerun { .. })) => {}
            Err(e) => panic!("a racing rerun failed otherwise: {e}"),
        }
    }
    assert_eq!(made.len(), 1, "exactly one rerun: {made:?}");
    assert_eq!(get(&*f.store, old.id).await.rerun_by, Some(made[0]));
    for n in 0..RACERS {
        let exists = f.store.job_get(job_id(100 + n)).await.expect("read");
        assert_eq!(exists.is_some(), job_id(100 + n) == made[0]);
    }
    let links = all_events(&*f.store, old.id)
        .await
        .iter()
        .filter(|e| e.kind == EventKind::JobRerun)
        .count();
    assert_eq!(links, 1);
}

// Proves a keyed rerun takes its place in its key like a submit: it starts at once when it heads
// the key, and waits behind an unfinished job of the key otherwise.
pub async fn keyed_rerun_waits_for_its_key(f: &Fixture) {
    let store = &*f.store;
    let keyed = spec(
        json!({"ordering_key": "cart", "on_failure": "fail", "steps": [
            {"name": "a", "agent": "kr", "max_attempts": 1}
        ]}),
    );
    submit(store, admitted(job_id(1), &keyed, at(0))).await;
    let got = claim(store, "kr", 1, 1, at(10)).await;
    assert_eq!(claimed_jobs(&got), vec![job_id(1)]);
    apply(store, job_id(1), fatal(0, 1, "no"), at(20)).await;
    let reran = rerun(store, rerun_of(job_id(1), job_id(2), true, at(30))).await;
    assert_eq!(reran.created.job.state, JobState::Running, "heads its key");
    assert_eq!(get(store, job_id(2)).await.state, JobState::Running);
    // Job 3 of the key waits behind job 2; job 2 fails; a rerun of it waits behind job 3.
    submit(store, admitted(job_id(3), &keyed, at(40))).await;
    let got = claim(store, "kr", 1, 2, at(50)).await;
    assert_eq!(claimed_jobs(&got), vec![job_id(2)]);
    apply(store, job_id(2), fatal(0, 1, "no"), at(60)).await;
    assert_eq!(get(store, job_id(3)).await.state, JobState::Running);
    let behind = rerun(store, rerun_of(job_id(2), job_id(4), false, at(70))).await;
    assert_eq!(behind.created.job.state, JobState::Pending);
    let status = store.ordering_key_status("cart").await.expect("status");
    assert_eq!(status.head.map(|j| j.id), Some(job_id(3)));
    assert_eq!(status.waiting, 1);
}
