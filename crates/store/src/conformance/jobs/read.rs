//! Reading many jobs: the list and its filters (state, labels, id prefix, agent, creation time)
//! and cursor, the pages of unfinished jobs, and the overview's counts.

use super::*;

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

// Proves `jobs_active` lists exactly the unfinished jobs (pending, running, blocked,
// compensating) in id order, and paging after the last id visits each once.
pub async fn jobs_active_pages_through_unfinished_jobs(f: &Fixture) {
    let store = &*f.store;
    assert!(store
        .jobs_active(ActivePage {
            after: None,
            limit: 10,
        })
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

    assert_eq!(
        store
            .jobs_active(ActivePage {
                after: None,
                limit: 100,
            })
            .await
            .expect("active"),
        active
    );
    assert!(store
        .jobs_active(ActivePage {
            after: None,
            limit: 0,
        })
        .await
        .expect("active")
        .is_empty());
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .jobs_active(ActivePage { after, limit: 3 })
            .await
            .expect("page");
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
        .jobs_active(ActivePage {
            after: last,
            limit: 10,
        })
        .await
        .expect("active")
        .is_empty());
}

// Proves the overview's counts: jobs per state (states with none left out, sorted), and jobs
// finished per minute and terminal state in a window that includes its start and excludes its
// end, with buckets counted from the window's start.
pub async fn stats_count_states_and_finished_minutes(f: &Fixture) {
    let store = &*f.store;
    assert!(store.jobs_count_by_state().await.expect("count").is_empty());
    let later = spec(json!({"run_at": at(3_600_000), "steps": [{"name": "s", "agent": "w"}]}));
    let (ok, bad, gone, idle, wait) = (job_id(1), job_id(2), job_id(3), job_id(4), job_id(5));
    let slow = spec(json!({"steps": [{"name": "s", "agent": "w", "timeout": "10m"}]}));
    for id in [ok, bad, gone, idle] {
        submit(store, admitted(id, &slow, at(0))).await;
    }
    submit(store, admitted(wait, &later, at(0))).await;
    let leased = claim(store, "w", 2, 1, at(1_000)).await;
    assert_eq!(claimed_jobs(&leased), vec![ok, bad]);
    let complete = Command::Complete {
        step: 0,
        attempt: 1,
        result: json!(1),
    };
    apply(store, ok, complete, at(61_000)).await;
    let fail = Command::Fail {
        step: 0,
        attempt: 1,
        error: "no".into(),
        retryable: false,
        jitter: 0.0,
    };
    apply(store, bad, fail, at(125_000)).await;
    apply(store, gone, Command::Cancel, at(130_000)).await;

    assert_eq!(
        store.jobs_count_by_state().await.expect("count"),
        vec![
            StateCount {
                state: JobState::Cancelled,
                count: 1,
            },
            StateCount {
                state: JobState::Failed,
                count: 1,
            },
            StateCount {
                state: JobState::Pending,
                count: 1,
            },
            StateCount {
                state: JobState::Running,
                count: 1,
            },
            StateCount {
                state: JobState::Succeeded,
                count: 1,
            },
        ]
    );
    let minutes = |since: i64, until: i64| async move {
        store
            .jobs_finished_per_minute(Window {
                since: at(since),
                until: at(until),
            })
            .await
            .expect("per minute")
    };
    assert_eq!(
        minutes(0, 180_000).await,
        vec![
            FinishedCount {
                minute: 1,
                state: JobState::Succeeded,
                count: 1,
            },
            FinishedCount {
                minute: 2,
                state: JobState::Cancelled,
                count: 1,
            },
            FinishedCount {
                minute: 2,
                state: JobState::Failed,
                count: 1,
            },
        ]
    );
    // From 62 s the succeeded job is out; buckets count from the new start.
    assert_eq!(
        minutes(62_000, 180_000).await,
        vec![
            FinishedCount {
                minute: 1,
                state: JobState::Cancelled,
                count: 1,
            },
            FinishedCount {
                minute: 1,
                state: JobState::Failed,
                count: 1,
            }
        ]
    );
    // The end is excluded, the start included.
    assert_eq!(
        minutes(61_000, 125_000).await,
        vec![FinishedCount {
            minute: 0,
            state: JobState::Succeeded,
            count: 1,
        }]
    );
}
