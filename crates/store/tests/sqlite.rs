//! The SQLite backend: the shared conformance suite on a fresh temp file per test, plus what is
//! specific to SQLite (group commit, durability across reopen, pragmas, bad rows).

use overseer_store::prelude::*;
use overseer_store::{Apply, EventPage};
use std::sync::Arc;

use overseer_store::conformance::{self, admitted, at, job_id, Fixture};
use overseer_store::sqlite::{SqliteOptions, SqliteStore};
use overseer_store::{Error, Submitted};
use serde_json::json;

const HISTORY: usize = 20;

fn options(dir: &tempfile::TempDir) -> SqliteOptions {
    let mut options = SqliteOptions::new(dir.path().join("overseer.db"));
    options.history_per_job = HISTORY;
    options
}

async fn fixture() -> Fixture {
    let (store, dir) = SqliteStore::open_temp(HISTORY).expect("open");
    Fixture::new(Arc::new(store), HISTORY, dir)
}

overseer_store::conformance_tests!(fixture());

fn one_step() -> overseer_core::JobSpec {
    conformance::spec(json!({"steps": [{"name": "s", "agent": "w"}]}))
}

// Proves concurrent writes share transactions: 200 concurrent submits commit in far fewer than
// 200 transactions, and every one of them is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_batches_concurrent_writes() {
    const WRITES: u64 = 200;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(options(&dir)).expect("open"));
    let before = store.commit_count();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 1..=WRITES {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .jobs_submit(vec![admitted(job_id(n), &one_step(), at(0))])
                .await
        });
    }
    while let Some(result) = tasks.join_next().await {
        let submitted = result.expect("task").expect("submit");
        assert!(matches!(submitted.as_slice(), [Submitted::Created(_)]));
    }
    let commits = store.commit_count() - before;
    assert!(commits >= 1);
    assert!(
        commits <= WRITES / 4,
        "{WRITES} writes took {commits} commits"
    );
    for n in 1..=WRITES {
        assert!(
            store.job_get(job_id(n)).await.expect("get").is_some(),
            "job {n} stored"
        );
    }
}

// Proves one failing write in a batch rolls back only itself: a conflicting submit queued
// beside good ones fails alone while the others commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_write_does_not_spoil_its_batch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(options(&dir)).expect("open"));
    let keyed = |v: i64| {
        conformance::spec(
            json!({"idempotency_key": "k", "steps": [{"name": "s", "agent": "w", "payload": v}]}),
        )
    };
    store
        .jobs_submit(vec![admitted(job_id(1), &keyed(1), at(0))])
        .await
        .expect("first");
    let mut tasks = tokio::task::JoinSet::new();
    for n in 2..=41u64 {
        let store = store.clone();
        let spec = if n % 2 == 0 { keyed(2) } else { one_step() };
        tasks.spawn(async move {
            (
                n,
                store
                    .jobs_submit(vec![admitted(job_id(n), &spec, at(0))])
                    .await,
            )
        });
    }
    while let Some(result) = tasks.join_next().await {
        let (n, outcome) = result.expect("task");
        if n % 2 == 0 {
            assert!(
                matches!(outcome, Err(Error::IdempotencyConflict { .. })),
                "job {n}: {outcome:?}"
            );
            assert!(store.job_get(job_id(n)).await.expect("get").is_none());
        } else {
            outcome.expect("good submit");
            assert!(store.job_get(job_id(n)).await.expect("get").is_some());
        }
    }
}

// Proves committed data survives closing the store and opening the file again.
#[tokio::test]
async fn data_survives_close_and_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(&dir)).expect("open");
    store
        .jobs_submit(vec![admitted(job_id(1), &one_step(), at(0))])
        .await
        .expect("submit");
    let claimed = store
        .steps_claim(overseer_store::Claim::of_worker(
            "w",
            "w-1",
            vec![conformance::lease_id(1)],
            at(10),
        ))
        .await
        .expect("claim")
        .claimed;
    let job = claimed[0].transition.job.clone();
    let events = store
        .job_events(EventPage {
            job: job.id,
            after_seq: 0,
            limit: 100,
        })
        .await
        .expect("events");
    drop(store);

    let store = SqliteStore::open(options(&dir)).expect("reopen");
    assert_eq!(store.job_get(job.id).await.expect("get"), Some(job.clone()));
    assert_eq!(
        store
            .job_events(EventPage {
                job: job.id,
                after_seq: 0,
                limit: 100,
            })
            .await
            .expect("events"),
        events
    );
    assert!(store
        .lease_find(conformance::lease_id(1))
        .await
        .expect("lease")
        .is_some());
    // Sequence numbers carry on from the stored history after a reopen.
    let done = overseer_core::Command::Complete {
        step: 0,
        attempt: 1,
        result: json!(1),
    };
    store
        .job_apply(Apply::new(job.id, done, at(20)))
        .await
        .expect("complete");
    let after = store
        .job_events(EventPage {
            job: job.id,
            after_seq: 0,
            limit: 100,
        })
        .await
        .expect("events");
    assert_eq!(after.len(), events.len() + 2);
    assert_eq!(after.last().map(|e| e.seq), Some(events.len() as i64 + 2));
}

/// Runs a labelled one-step job of agent `agent` to success through a retried first attempt, so
/// it has history, labels, a step row, a current lease and a retired one.
async fn run_with_a_retry(store: &SqliteStore, n: u64, agent: &str) {
    use overseer_core::Command;
    use overseer_store::{Claim, LeaseReport, Report, Reports};
    let spec = conformance::spec(json!({"labels": {"team": "a"},
        "steps": [{"name": "s", "agent": agent, "max_attempts": 3,
                   "backoff": {"initial": "1s", "factor": 1.0, "max": "1s"}}]}));
    store
        .jobs_submit(vec![admitted(job_id(n), &spec, at(0))])
        .await
        .expect("submit");
    let claim = |lease: u128, now: i64| {
        Claim::of_worker(agent, "w", vec![conformance::lease_id(lease)], at(now))
    };
    let first = u128::from(n) * 10;
    let claimed = store.steps_claim(claim(first, 1)).await.expect("claim");
    assert_eq!(claimed.claimed.len(), 1);
    let fail = Command::Fail {
        step: 0,
        attempt: 1,
        error: "flaky".into(),
        retryable: true,
        jitter: 0.0,
    };
    store
        .job_apply(Apply::new(job_id(n), fail, at(2)))
        .await
        .expect("fail");
    let again = store
        .steps_claim(claim(first + 1, 5_000))
        .await
        .expect("claim");
    assert_eq!(again.claimed.len(), 1, "the retry is leased");
    let done = Report {
        lease_id: conformance::lease_id(first + 1),
        report: LeaseReport::Complete { result: json!(1) },
    };
    let out = store
        .leases_report(Reports {
            reports: vec![done],
            now: at(5_001),
        })
        .await
        .expect("report");
    assert!(out[0].is_ok(), "{:?}", out[0]);
}

/// Rows of job `n` in each table that holds a job's rows besides `jobs`.
fn rows_of(path: &std::path::Path, n: u64) -> Vec<(&'static str, i64)> {
    let raw = rusqlite::Connection::open(path).expect("raw open");
    ["steps", "job_labels", "events", "leases"]
        .into_iter()
        .map(|table| {
            let count = raw
                .query_row(
                    &format!("SELECT COUNT(*) FROM {table} WHERE job_id = ?1"),
                    [job_id(n).to_string()],
                    |r| r.get(0),
                )
                .expect("count");
            (table, count)
        })
        .collect()
}

// Proves that without foreign keys to cascade, removing a job (by `jobs_delete` or by retention)
// leaves none of its steps, labels, history or leases behind, retired leases included, and
// touches no other job's rows.
#[tokio::test]
async fn a_removed_job_leaves_no_rows_behind() {
    use overseer_core::retention::Retention;
    use overseer_core::{JobState, Span};
    use overseer_store::{Prune, Removal};
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(&dir)).expect("open");
    for n in 1..=3 {
        run_with_a_retry(&store, n, &format!("a{n}")).await;
        let rows = rows_of(store.path(), n);
        assert!(
            rows.iter().all(|(_, c)| *c > 0),
            "job {n} has rows: {rows:?}"
        );
    }
    let deleted = store
        .jobs_delete(Removal {
            ids: vec![job_id(1)],
            states: vec![JobState::Succeeded],
        })
        .await
        .expect("delete");
    assert_eq!(deleted, vec![job_id(1)]);
    let retention = Retention {
        succeeded: Span::from_secs(1),
        ..Retention::default()
    };
    // Job 2 finished first of the two left: a limit of one removes it alone.
    let pruned = store
        .jobs_prune(Prune {
            now: at(6_002),
            retention,
            limit: 1,
        })
        .await
        .expect("prune");
    assert_eq!(pruned.ids.len(), 1);
    let (gone, kept) = if pruned.ids[0] == job_id(2) {
        (2, 3)
    } else {
        (3, 2)
    };
    for n in [1, gone] {
        let rows = rows_of(store.path(), n);
        assert!(rows.iter().all(|(_, c)| *c == 0), "job {n} left {rows:?}");
    }
    let rows = rows_of(store.path(), kept);
    assert!(
        rows.iter().all(|(_, c)| *c > 0),
        "job {kept} keeps {rows:?}"
    );
}

// Proves the write connection runs in WAL mode with synchronous=NORMAL (commits are synced by
// the store's log syncer before anyone hears of them, not by SQLite inside the writer), and
// that the schema version is recorded in the file.
#[tokio::test]
async fn durability_pragmas_are_in_force() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(&dir)).expect("open");
    let pragmas = store.writer_pragmas().await.expect("pragmas");
    assert_eq!(pragmas.journal_mode, "wal");
    assert_eq!(pragmas.synchronous, 1, "synchronous=NORMAL");
    assert!(pragmas.busy_timeout_ms > 0);
    assert!(pragmas.user_version >= 1);

    // WAL mode is a property of the file, visible to any other connection.
    let raw = rusqlite::Connection::open(store.path()).expect("raw open");
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
    let version: i64 = raw
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .expect("version");
    assert_eq!(version, pragmas.user_version);
    drop(raw);
    drop(store);
    let reopened = SqliteStore::open(options(&dir)).expect("reopen");
    assert_eq!(
        reopened
            .writer_pragmas()
            .await
            .expect("pragmas")
            .user_version,
        pragmas.user_version
    );
}

// Proves a row that does not decode (a step's state, an event's kind) is reported as corrupt
// rather than panicking, and a file from a newer schema is refused rather than misread.
#[tokio::test]
async fn bad_rows_are_corrupt_not_panics() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(options(&dir)).expect("open");
    store
        .jobs_submit(vec![admitted(job_id(1), &one_step(), at(0))])
        .await
        .expect("submit");
    let raw = rusqlite::Connection::open(store.path()).expect("raw open");
    raw.execute("UPDATE steps SET state = 'exploded'", [])
        .expect("vandalise");
    assert!(matches!(
        store.job_get(job_id(1)).await,
        Err(Error::Corrupt(_))
    ));
    let apply = store
        .job_apply(Apply::new(job_id(1), overseer_core::Command::Cancel, at(1)))
        .await;
    assert!(matches!(apply, Err(Error::Corrupt(_))), "{apply:?}");
    // The writer survives a failed write.
    store.ping().await.expect("ping");
    store
        .jobs_submit(vec![admitted(job_id(2), &one_step(), at(0))])
        .await
        .expect("submit after");

    // The history holds each kind's name: a submit's three entries in the job row (a `more`
    // text numbered from `admission_seq`), a later write's in a history row (the first in the
    // row's columns, the others in `more`); a name this build does not know is corrupt too, in
    // any of these places.
    let id = job_id(2).to_string();
    let admission: (i64, String) = raw
        .query_row(
            "SELECT admission_seq, json_extract(admission, '$[0].kind') || ',' || \
             json_extract(admission, '$[1].kind') || ',' || json_extract(admission, '$[2].kind') \
             FROM jobs WHERE id = ?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("admission");
    assert_eq!(
        admission,
        (1, "job_submitted,job_started,step_ready".into())
    );
    let rows: i64 = raw
        .query_row(
            "SELECT count(*) FROM events WHERE job_id = ?1",
            [&id],
            |r| r.get(0),
        )
        .expect("rows");
    assert_eq!(rows, 0, "a submit writes no history row");
    let page = EventPage {
        job: job_id(2),
        after_seq: 0,
        limit: 10,
    };
    let read = |events: &Result<Vec<overseer_core::Event>, Error>| match events {
        Ok(events) => events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        Err(e) => panic!("events: {e}"),
    };
    assert_eq!(
        read(&store.job_events(page).await),
        ["job_submitted", "job_started", "step_ready"]
    );
    let admission: String = raw
        .query_row("SELECT admission FROM jobs WHERE id = ?1", [&id], |r| {
            r.get(0)
        })
        .expect("admission");
    raw.execute(
        "UPDATE jobs SET admission = json_set(admission, '$[1].kind', 'step_exploded') \
         WHERE id = ?1",
        [&id],
    )
    .expect("vandalise");
    let events = store.job_events(page).await;
    assert!(
        matches!(&events, Err(Error::Corrupt(e)) if e.contains("`step_exploded`")),
        "the job row: {events:?}"
    );
    raw.execute(
        "UPDATE jobs SET admission = ?2 WHERE id = ?1",
        rusqlite::params![&id, &admission],
    )
    .expect("restore");
    // A claim keeps its entry in the step row (`lease_entry`); the report that finishes the job
    // leaves its entries in the job row (`ending`).
    let claim = overseer_store::Claim::of_worker("w", "w-1", vec![conformance::lease_id(1)], at(1));
    assert_eq!(
        store.steps_claim(claim).await.expect("claim").claimed.len(),
        1
    );
    store
        .job_apply(Apply::new(
            job_id(2),
            overseer_core::Command::Complete {
                step: 0,
                attempt: 1,
                result: json!(true),
            },
            at(2),
        ))
        .await
        .expect("complete");
    let events = store.job_events(page).await;
    assert_eq!(
        read(&events)[..4],
        ["job_submitted", "job_started", "step_ready", "step_leased"]
    );
    assert_eq!(read(&events)[4..], ["step_succeeded", "job_succeeded"]);
    let (rows, lease_seq, ending_seq, ending): (i64, i64, i64, String) = raw
        .query_row(
            "SELECT (SELECT count(*) FROM events WHERE job_id = ?1), \
             (SELECT lease_entry_seq FROM steps WHERE job_id = ?1), ending_seq, ending \
             FROM jobs WHERE id = ?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .expect("rows");
    assert_eq!(
        (rows, lease_seq, ending_seq),
        (0, 4, 5),
        "neither the claim nor the report wrote a history row"
    );
    raw.execute(
        "UPDATE steps SET lease_entry = json_set(lease_entry, '$[0].kind', 'step_exploded') \
         WHERE job_id = ?1",
        [&id],
    )
    .expect("vandalise");
    let events = store.job_events(page).await;
    assert!(
        matches!(&events, Err(Error::Corrupt(e)) if e.contains("`step_exploded`")),
        "the step row's lease entry: {events:?}"
    );
    raw.execute(
        "UPDATE steps SET lease_entry = json_set(lease_entry, '$[0].kind', 'step_leased') \
         WHERE job_id = ?1",
        [&id],
    )
    .expect("restore");
    raw.execute(
        "UPDATE jobs SET ending = json_set(ending, '$[0].kind', 'step_exploded') WHERE id = ?1",
        [&id],
    )
    .expect("vandalise");
    let events = store.job_events(page).await;
    assert!(
        matches!(&events, Err(Error::Corrupt(e)) if e.contains("`step_exploded`")),
        "the job row's ending: {events:?}"
    );
    raw.execute(
        "UPDATE jobs SET ending = ?2 WHERE id = ?1",
        rusqlite::params![&id, &ending],
    )
    .expect("restore");

    // A history row, as a retry's claim leaves one (see the test below), is corrupt likewise.
    raw.execute(
        "INSERT INTO events (job_id, seq, at, kind, step, attempt, detail, more) \
         VALUES (?1, 7, 3, 'job_repaired', NULL, NULL, NULL, NULL)",
        [&id],
    )
    .expect("a row");
    assert_eq!(read(&store.job_events(page).await).len(), 7);
    for vandal in [
        "UPDATE events SET more = '[{\"at\": 1, \"kind\": \"step_exploded\"}]' WHERE job_id = ?1",
        "UPDATE events SET more = NULL, kind = 'step_exploded' WHERE job_id = ?1",
    ] {
        raw.execute(vandal, [&id]).expect("vandalise");
        let events = store.job_events(page).await;
        assert!(
            matches!(&events, Err(Error::Corrupt(e)) if e.contains("`step_exploded`")),
            "{vandal}: {events:?}"
        );
    }

    raw.pragma_update(None, "user_version", 999)
        .expect("bump version");
    drop(raw);
    drop(store);
    let reopened = SqliteStore::open(options(&dir)).map(|_| ());
    assert!(
        matches!(reopened, Err(Error::Corrupt(_))),
        "a file from a newer version: {reopened:?}"
    );
}

/// The crash fault end to end, in a child process since it aborts (`fault-injection` builds).
#[cfg(all(feature = "fault-injection", unix))]
mod crash_after_step_result {
    use std::os::unix::process::ExitStatusExt;

    use overseer_core::{Command, EventKind, JobState, StepState};
    use overseer_store::conformance::{lease_id, spec};
    use overseer_store::Claim;

    use super::*;

    const DB_VAR: &str = "OVERSEER_TEST_CRASH_DB";

    fn chain() -> overseer_core::JobSpec {
        spec(json!({"steps": [
            {"name": "a", "agent": "w"},
            {"name": "b", "agent": "w", "depends_on": ["a"]}
        ]}))
    }

    // Not a test of its own: the body the parent runs in a child process with the fault armed.
    #[tokio::test]
    #[ignore = "run in a child process by `the_process_dies_after_committing_only_the_step`"]
    async fn child() {
        let Ok(path) = std::env::var(DB_VAR) else {
            return;
        };
        let store = SqliteStore::open(SqliteOptions::new(path)).expect("open");
        store
            .jobs_submit(vec![admitted(job_id(1), &chain(), at(0))])
            .await
            .expect("submit");
        let claim = Claim::of_worker("w", "w-1", vec![lease_id(1)], at(10));
        assert_eq!(
            store.steps_claim(claim).await.expect("claim").claimed.len(),
            1
        );
        let done = Command::Complete {
            step: 0,
            attempt: 1,
            result: json!("A"),
        };
        let answer = store.job_apply(Apply::new(job_id(1), done, at(20))).await;
        // Reaching this line means the fault did not fire.
        eprintln!("job_apply answered: {answer:?}");
        std::process::exit(3);
    }

    // Proves the armed fault commits a step's result alone and aborts before answering: the
    // child dies by SIGABRT, and the file then holds the succeeded step with its dependant still
    // waiting and the job still running, until `Repair` heals it.
    #[tokio::test]
    async fn the_process_dies_after_committing_only_the_step() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("crash.db");
        let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--ignored",
                "--exact",
                "crash_after_step_result::child",
                "--nocapture",
            ])
            .env("OVERSEER_FAULT", "crash-after-step-result")
            .env(DB_VAR, &path)
            .status()
            .expect("run the child");
        assert_eq!(
            status.signal(),
            Some(6),
            "the child aborts (SIGABRT): {status:?}"
        );

        let store = SqliteStore::open(SqliteOptions::new(&path)).expect("reopen");
        let job = store.job_get(job_id(1)).await.expect("get").expect("job");
        assert_eq!(job.steps[0].state, StepState::Succeeded);
        assert_eq!(job.steps[0].result, Some(json!("A")));
        assert_eq!(job.steps[1].state, StepState::Waiting);
        assert_eq!(job.state, JobState::Running);
        let kinds: Vec<EventKind> = store
            .job_events(EventPage {
                job: job_id(1),
                after_seq: 0,
                limit: 100,
            })
            .await
            .expect("events")
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds.last(), Some(&EventKind::StepLeased));

        let repaired = store
            .job_apply(Apply::new(job_id(1), Command::Repair, at(30)))
            .await
            .expect("repair");
        assert_eq!(repaired.job.steps[1].state, StepState::Ready);
        assert_eq!(
            store.job_get(job_id(1)).await.expect("get"),
            Some(repaired.job)
        );
    }
}

/// The current schema, as the migrations leave a new file, is committed in
/// `crates/store/schema/sqlite.sql`; this fails when the two differ. After a new migration,
/// `OVERSEER_WRITE_SCHEMA=1 cargo test -p overseer-store --features testing --test sqlite schema`
/// rewrites the file (then review its diff).
#[test]
fn the_schema_file_is_the_migrated_schema() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("schema.db");
    drop(SqliteStore::open(SqliteOptions::new(&path)).expect("open"));
    let conn = rusqlite::Connection::open(&path).expect("open the file");
    let mut stmt = conn
        .prepare(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' \
             ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, tbl_name, name",
        )
        .expect("prepare");
    let statements: Vec<String> = stmt
        .query_map([], |row| row.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("read");
    let dump: String = statements.iter().map(|s| format!("{s};\n\n")).collect();
    overseer_store::conformance::check_schema_file("sqlite.sql", &dump);
}

/// Both backends name their indexes alike, so a plan, a migration or a note about one names the
/// other's too. Read from the committed schema files (which tests check against migrated
/// stores): every named index of one is an index or a unique constraint of the other.
#[test]
fn both_backends_name_their_indexes_alike() {
    let schema = |name: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("schema")
            .join(name);
        std::fs::read_to_string(path).expect("read a schema file")
    };
    let names = |text: &str, unique_constraints: bool| {
        let mut out = std::collections::BTreeSet::new();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["CREATE", "INDEX", name, ..] | ["CREATE", "UNIQUE", "INDEX", name, ..] => {
                    out.insert(name.trim_start_matches("public.").to_string());
                }
                ["ADD", "CONSTRAINT", name, "UNIQUE", ..] if unique_constraints => {
                    out.insert(name.to_string());
                }
                _ => {}
            }
        }
        out
    };
    let sqlite = names(&schema("sqlite.sql"), false);
    let postgres_indexes = names(&schema("postgres.sql"), false);
    let postgres_all = names(&schema("postgres.sql"), true);
    assert!(sqlite.len() >= 10, "{sqlite:?}");
    let missing: Vec<_> = sqlite.difference(&postgres_all).collect();
    assert!(
        missing.is_empty(),
        "SQLite indexes PostgreSQL names otherwise: {missing:?}"
    );
    let missing: Vec<_> = postgres_indexes.difference(&sqlite).collect();
    assert!(
        missing.is_empty(),
        "PostgreSQL indexes SQLite names otherwise: {missing:?}"
    );
}
