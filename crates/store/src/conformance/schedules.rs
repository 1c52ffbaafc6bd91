//! Schedules: definitions, and firings that are neither lost nor doubled.

use super::*;

// Proves schedule definitions: creating again with the same spec answers the stored one (not
// created), another spec under the name conflicts; get, list, pause, resume and delete.
pub async fn schedule_create_is_idempotent_and_conflicts(f: &Fixture) {
    let store = &*f.store;
    let nightly = new_schedule(schedule_spec("nightly", json!({})), at(60_000), at(0));
    let ScheduleCreated {
        schedule: stored,
        created,
    } = store
        .schedule_create(nightly.clone())
        .await
        .expect("create");
    assert!(created);
    assert_eq!(stored, nightly);
    assert_eq!(schedule(store, "nightly").await, nightly);

    let again = new_schedule(schedule_spec("nightly", json!({})), at(120_000), at(50_000));
    let ScheduleCreated {
        schedule: stored,
        created,
    } = store.schedule_create(again).await.expect("create again");
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
        .schedule_set_paused(SchedulePause {
            name: "nightly".to_string(),
            paused: true,
            next_fire_at: None,
            now: at(100),
        })
        .await
        .expect("pause");
    assert_eq!(
        (paused.paused, paused.next_fire_at, paused.updated_at),
        (true, None, at(100))
    );
    assert_eq!(schedule(store, "nightly").await, paused);
    let due: Vec<String> = store
        .schedules_due(Due {
            now: at(1_000_000),
            limit: 10,
        })
        .await
        .expect("due")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(due, vec!["hourly"], "a paused schedule is never due");
    let resumed = store
        .schedule_set_paused(SchedulePause {
            name: "nightly".to_string(),
            paused: false,
            next_fire_at: Some(at(90_000)),
            now: at(200),
        })
        .await
        .expect("resume");
    assert_eq!(
        (resumed.paused, resumed.next_fire_at),
        (false, Some(at(90_000)))
    );
    let due: Vec<String> = store
        .schedules_due(Due {
            now: at(1_000_000),
            limit: 10,
        })
        .await
        .expect("due")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(due, vec!["hourly", "nightly"], "earliest first");
    assert!(store
        .schedules_due(Due {
            now: at(29_999),
            limit: 10,
        })
        .await
        .expect("due")
        .is_empty());
    assert_eq!(
        store
            .schedules_due(Due {
                now: at(1_000_000),
                limit: 1,
            })
            .await
            .expect("due")
            .len(),
        1
    );

    match store
        .schedule_set_paused(SchedulePause {
            name: "missing".to_string(),
            paused: true,
            next_fire_at: None,
            now: at(300),
        })
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
        .schedules_due(Due {
            now: at(119_999),
            limit: 10,
        })
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

    let first = fire_created(
        store,
        firing(&skip, at(1_000), Some(at(2_000)), job_id(1), at(1_000)),
        &fence,
    )
    .await
    .id;
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
    let t = fire_created(
        store,
        firing(&skip, at(3_000), Some(at(4_000)), job_id(3), at(3_000)),
        &fence,
    )
    .await;
    assert_eq!(t.id, job_id(3));

    let allow = new_schedule(
        schedule_spec("allow", json!({"overlap": "allow"})),
        at(1_000),
        at(0),
    );
    store.schedule_create(allow.clone()).await.expect("create");
    for (n, due) in [(10, 1_000), (11, 2_000)] {
        let t = fire_created(
            store,
            firing(&allow, at(due), Some(at(due + 1_000)), job_id(n), at(due)),
            &fence,
        )
        .await;
        assert_eq!(t.id, job_id(n));
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
        fire_stale(
            store,
            firing(&s, at(due), Some(at(180_000)), job_id(1), at(60_000)),
            &fence,
            &format!("due {due}"),
        )
        .await;
    }
    assert_eq!(schedule(store, "s").await, s);
    assert!(all_jobs(store).await.is_empty());

    store
        .schedule_set_paused(SchedulePause {
            name: "s".to_string(),
            paused: true,
            next_fire_at: Some(at(60_000)),
            now: at(1),
        })
        .await
        .expect("pause");
    fire_stale(
        store,
        firing(&s, at(60_000), Some(at(120_000)), job_id(2), at(60_000)),
        &fence,
        "paused",
    )
    .await;
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

/// Replacing a schedule's definition by `spec` at `now`.
fn update_to(spec: ScheduleSpec, now: Timestamp) -> ScheduleUpdate {
    let cron = spec
        .validate(&overseer_core::spec::Limits::default())
        .expect("a valid schedule");
    ScheduleUpdate { spec, cron, now }
}

/// Every ten seconds, overlapping; `at(0)` (T0) is on a ten-second boundary, so its due times
/// are `at(10_000 × k)`.
fn every_10s(name: &str, extra: Value) -> ScheduleSpec {
    let mut extra = extra;
    if let Value::Object(m) = &mut extra {
        m.entry("cron").or_insert(json!("*/10 * * * * *"));
        m.entry("overlap").or_insert(json!("allow"));
    }
    schedule_spec(name, extra)
}

// Proves an update replaces cron, zone, job body, overlap and misfire in one write and answers
// the schedule as stored: the next due time counts from now under the new pattern, the
// creation time and last firing are kept; the same definition again writes nothing; changing
// only the job body keeps a due time that came and has not fired; an unknown name is not found.
pub async fn schedule_update_replaces_the_definition(f: &Fixture) {
    let store = &*f.store;
    let s = new_schedule(every_10s("s", json!({})), at(10_000), at(0));
    store.schedule_create(s.clone()).await.expect("create");
    let new_spec = schedule_spec(
        "s",
        json!({"cron": "5/10 * * * * *", "timezone": "Europe/Berlin", "overlap": "skip",
            "misfire": "all", "job": {"priority": 7, "steps": [{"name": "t", "agent": "other"}]}}),
    );
    let updated = store
        .schedule_update(update_to(new_spec.clone(), at(1_000)))
        .await
        .expect("update");
    let expected = Schedule {
        spec: new_spec.clone(),
        next_fire_at: Some(at(5_000)),
        updated_at: at(1_000),
        ..s.clone()
    };
    assert_eq!(updated, expected);
    assert_eq!(schedule(store, "s").await, expected, "stored as answered");
    let again = store
        .schedule_update(update_to(new_spec.clone(), at(2_000)))
        .await
        .expect("same again");
    assert_eq!(again, expected, "the same definition writes nothing");

    // Only the job body changes, after the due time came but before it fired: it stays due.
    let mut body_only = new_spec.clone();
    body_only.job.priority = 8;
    let kept = store
        .schedule_update(update_to(body_only.clone(), at(5_500)))
        .await
        .expect("body only");
    assert_eq!((kept.next_fire_at, kept.spec), (Some(at(5_000)), body_only));
    let due: Vec<String> = store
        .schedules_due(Due {
            now: at(5_500),
            limit: 10,
        })
        .await
        .expect("due")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(due, vec!["s"]);

    match store
        .schedule_update(update_to(every_10s("missing", json!({})), at(1)))
        .await
    {
        Err(Error::ScheduleNotFound(name)) => assert_eq!(name, "missing"),
        other => panic!("expected not found, got {other:?}"),
    }
    assert!(store.schedule_get("missing").await.expect("get").is_none());
}

// Proves an update never makes a fired due time due again and keeps a pause: after the due
// time 10 s fired, an update from a node whose clock reads 9 s (behind the firing) to a pattern
// that matches 10 s again is next due at 15 s, not 10 s; a firing of 10 s planned before is
// stale; a firing planned from the old definition is stale even for the due time the update
// kept, and the new definition's job is what fires; a paused schedule stays paused, without a
// due time.
pub async fn schedule_update_never_refires_and_keeps_pause(f: &Fixture) {
    let store = &*f.store;
    let fence = lead(store, "n1", at(9_000)).await;
    let s = new_schedule(every_10s("s", json!({})), at(10_000), at(0));
    store.schedule_create(s.clone()).await.expect("create");
    let t = fire_created(
        store,
        firing(&s, at(10_000), Some(at(20_000)), job_id(1), at(10_000)),
        &fence,
    )
    .await;
    assert_eq!(t.id, job_id(1));
    let five = every_10s("s", json!({"cron": "*/5 * * * * *"}));
    let updated = store
        .schedule_update(update_to(five.clone(), at(9_000)))
        .await
        .expect("update");
    assert_eq!(updated.last_fire_at, Some(at(10_000)));
    assert_eq!(updated.last_job_id, Some(job_id(1)));
    assert_eq!(
        updated.next_fire_at,
        Some(at(15_000)),
        "after the fired 10 s, though the clock read 9 s"
    );
    for due in [10_000, 20_000] {
        fire_stale(
            store,
            firing(&s, at(due), Some(at(30_000)), job_id(2), at(15_000)),
            &fence,
            &format!("due {due}"),
        )
        .await;
    }
    // A body-only update keeps 15 s due; a firing planned from the previous body is stale.
    let mut five_b = five.clone();
    five_b.job.priority = 3;
    let before = schedule(store, "s").await;
    store
        .schedule_update(update_to(five_b.clone(), at(14_000)))
        .await
        .expect("update body");
    fire_stale(
        store,
        firing(&before, at(15_000), Some(at(20_000)), job_id(3), at(15_000)),
        &fence,
        "planned from the old body",
    )
    .await;
    let now_stored = schedule(store, "s").await;
    let t = fire_created(
        store,
        firing(
            &now_stored,
            at(15_000),
            Some(at(20_000)),
            job_id(4),
            at(15_000),
        ),
        &fence,
    )
    .await;
    assert_eq!(t.priority, 3);
    let mut fired = ids(&all_jobs(store).await);
    fired.sort();
    assert_eq!(fired, vec![job_id(1), job_id(4)]);

    store
        .schedule_set_paused(SchedulePause {
            name: "s".to_string(),
            paused: true,
            next_fire_at: None,
            now: at(16_000),
        })
        .await
        .expect("pause");
    let paused = store
        .schedule_update(update_to(every_10s("s", json!({})), at(17_000)))
        .await
        .expect("update paused");
    assert_eq!(
        (
            paused.paused,
            paused.next_fire_at,
            paused.spec.cron.as_str()
        ),
        (true, None, "*/10 * * * * *")
    );
    assert!(store
        .schedules_due(Due {
            now: at(1_000_000),
            limit: 10
        })
        .await
        .expect("due")
        .is_empty());
}

// Proves an update racing the leader's firings of the same due time never doubles a firing:
// in each of several rounds, four firings of the due time (planned from the old definition)
// race one update to another pattern; whichever order the store takes them in, the due time
// fired at most once, the schedule's next due time is after every due time that fired, and
// firing that next due time creates exactly one job. No idempotency key is ever used twice.
pub async fn schedule_update_racing_a_firing_fires_once(f: &Fixture) {
    let store = &*f.store;
    let patterns = ["5/10 * * * * *", "*/10 * * * * *"];
    let mut current = new_schedule(every_10s("race", json!({})), at(10_000), at(0));
    store
        .schedule_create(current.clone())
        .await
        .expect("create");
    let mut n = 0u64;
    for round in 0..6usize {
        let due = current.next_fire_at.expect("due");
        let fence = lead(store, "n1", Timestamp(due.0 - 1_000)).await;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..4 {
            n += 1;
            let fire = firing(
                &current,
                due,
                current
                    .next_fire_at
                    .map(|d| d.plus(overseer_core::Span::from_secs(10))),
                job_id(n),
                due,
            );
            let (store, fence) = (f.store.clone(), fence.clone());
            tasks.spawn(async move { store.schedule_fire(fire, &fence).await.map(Some) });
        }
        let spec = every_10s("race", json!({"cron": patterns[round % 2]}));
        let update = update_to(spec, Timestamp(due.0 - 10));
        let updater = f.store.clone();
        tasks.spawn(async move { updater.schedule_update(update).await.map(|_| None) });
        let mut fired = 0;
        while let Some(outcome) = tasks.join_next().await {
            match outcome.expect("task").expect("fire or update") {
                Some(FireOutcome::Fired(Submitted::Created(_))) => fired += 1,
                Some(FireOutcome::Stale) | None => {}
                Some(other) => panic!("unexpected outcome {other:?}"),
            }
        }
        assert!(
            fired <= 1,
            "round {round}: due time {due} fired {fired} times"
        );
        current = schedule(store, "race").await;
        let next = current.next_fire_at.expect("a next due time");
        if let Some(last) = current.last_fire_at {
            assert!(
                next > last,
                "round {round}: next {next} is not after the fired {last}"
            );
        }
        // Fire the next due time under the stored definition: exactly one job.
        let fence = lead(store, "n1", next).await;
        n += 1;
        let after = Some(next.plus(overseer_core::Span::from_secs(5)));
        match store
            .schedule_fire(firing(&current, next, after, job_id(n), next), &fence)
            .await
            .expect("fire next")
        {
            FireOutcome::Fired(Submitted::Created(_)) => {}
            other => panic!("round {round}: expected fired, got {other:?}"),
        }
        current = schedule(store, "race").await;
    }
    let jobs = all_jobs(store).await;
    let mut keys: Vec<String> = jobs
        .iter()
        .filter_map(|j| j.idempotency_key.clone())
        .collect();
    let total = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), total, "a due time fired twice: {keys:?}");
    assert!(total >= 6, "each round fired its next due time: {keys:?}");
}

// Proves a firing without a job (a missed window the misfire rule skips) passes the due time:
// the schedule advances, no job is made and the last firing is unchanged; like a firing it is
// stale once the schedule was paused or replaced since it was planned, so it can neither
// resume a paused schedule nor bring back an old definition's due time.
pub async fn schedule_pass_advances_without_a_job(f: &Fixture) {
    let store = &*f.store;
    let fence = lead(store, "n1", at(9_000)).await;
    let s = new_schedule(every_10s("p", json!({})), at(10_000), at(0));
    store.schedule_create(s.clone()).await.expect("create");
    let pass = |s: &Schedule, due: i64, next: i64| Fire {
        job: None,
        ..firing(s, at(due), Some(at(next)), job_id(99), at(15_000))
    };
    match store
        .schedule_fire(pass(&s, 10_000, 20_000), &fence)
        .await
        .expect("pass")
    {
        FireOutcome::Passed => {}
        other => panic!("expected passed, got {other:?}"),
    }
    let after = schedule(store, "p").await;
    assert_eq!(
        (after.next_fire_at, after.last_fire_at, after.last_job_id),
        (Some(at(20_000)), None, None)
    );
    assert!(all_jobs(store).await.is_empty());

    store
        .schedule_set_paused(SchedulePause {
            name: "p".to_string(),
            paused: true,
            next_fire_at: None,
            now: at(11_000),
        })
        .await
        .expect("pause");
    match store
        .schedule_fire(pass(&after, 20_000, 30_000), &fence)
        .await
        .expect("pass")
    {
        FireOutcome::Stale => {}
        other => panic!("paused: expected stale, got {other:?}"),
    }
    let paused = schedule(store, "p").await;
    assert_eq!((paused.paused, paused.next_fire_at), (true, None));

    store
        .schedule_set_paused(SchedulePause {
            name: "p".to_string(),
            paused: false,
            next_fire_at: Some(at(20_000)),
            now: at(12_000),
        })
        .await
        .expect("resume");
    let replaced = store
        .schedule_update(update_to(
            every_10s("p", json!({"cron": "5/10 * * * * *"})),
            at(12_000),
        ))
        .await
        .expect("update");
    assert_eq!(replaced.next_fire_at, Some(at(15_000)));
    match store
        .schedule_fire(pass(&after, 20_000, 30_000), &fence)
        .await
        .expect("pass")
    {
        FireOutcome::Stale => {}
        other => panic!("replaced: expected stale, got {other:?}"),
    }
    assert_eq!(schedule(store, "p").await, replaced);
}

/// Fires `fire` under `fence`, expecting it to create its job: answers the job.
async fn fire_created(store: &dyn Store, fire: Fire, fence: &Fence) -> Job {
    match store.schedule_fire(fire, fence).await.expect("fire") {
        FireOutcome::Fired(Submitted::Created(t)) => t.job,
        other => panic!("expected fired, got {other:?}"),
    }
}

/// Fires `fire` under `fence`, expecting it to be stale (nothing written); `why` says why.
async fn fire_stale(store: &dyn Store, fire: Fire, fence: &Fence, why: &str) {
    match store.schedule_fire(fire, fence).await.expect("fire") {
        FireOutcome::Stale => {}
        other => panic!("{why}: expected stale, got {other:?}"),
    }
}
