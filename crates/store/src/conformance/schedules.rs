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
        .schedule_set_paused(SchedulePause {
            name: "s".to_string(),
            paused: true,
            next_fire_at: Some(at(60_000)),
            now: at(1),
        })
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
