//! A job moving on through `job_apply`: completions promote dependants and finish the job, step
//! retries back off (the Faktory formula), and whole-job retries are stored round by round.

use super::*;

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
    assert_eq!(events.last().map(|e| e.kind), Some(EventKind::JobSucceeded));
    assert!(store.agents_counts().await.expect("counts").is_empty());
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

// Proves a whole-job retry is stored round by round: the policy and the round survive a reload,
// the failed round is undone (the undo is claimed by its compensate agent), the next round starts
// with the root claimable only after the job backoff and a higher attempt number, and a report
// of the first round is refused in the second.
pub async fn whole_job_retry_rounds_are_stored(f: &Fixture) {
    let store = &*f.store;
    let id = job_id(1);
    let s = spec(
        json!({"on_failure": "compensate_and_retry", "job_attempts": 2,
        "job_backoff": {"initial": "1s", "factor": 2, "max": "1m"},
        "steps": [
            {"name": "a", "agent": "w", "compensate": {"agent": "undo"}},
            {"name": "b", "agent": "w", "depends_on": ["a"], "max_attempts": 1}]}),
    );
    submit(store, admitted(id, &s, at(0))).await;
    let stored = get(store, id).await;
    assert_eq!(
        (stored.round, stored.retry.map(|r| r.attempts)),
        (1, Some(2))
    );
    claim(store, "w", 1, 1, at(0)).await;
    apply(store, id, complete(0, 1, json!("a1")), at(10)).await;
    claim(store, "w", 1, 2, at(20)).await;
    apply(store, id, fatal(1, 1, "no"), at(30)).await;
    assert_eq!(claim(store, "undo", 1, 3, at(40)).await.len(), 1);
    let t = apply(store, id, complete(0, 2, json!("undone")), at(50)).await;
    assert_eq!((t.job.round, t.job.state), (2, JobState::Running));
    let stored = get(store, id).await;
    assert_eq!(stored, t.job);
    assert_eq!(stored.steps[0].state, StepState::Ready);
    assert_eq!(stored.steps[0].next_attempt_at, Some(at(1_050)));
    assert!(claim(store, "w", 1, 4, at(1_049)).await.is_empty());
    let again = claim(store, "w", 1, 5, at(1_050)).await;
    assert_eq!(again[0].transition.job.steps[0].attempt, 3);
    match store
        .job_apply(Apply::new(id, complete(1, 1, json!("late")), at(1_060)))
        .await
    {
        Err(Error::Rejected(Rejection::LeaseLost { .. })) => {}
        other => panic!("a report of round 1 was not refused: {other:?}"),
    }
    let kinds: Vec<EventKind> = all_events(store, id)
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.contains(&EventKind::JobRoundStarted), "{kinds:?}");
}
