//! The PostgreSQL backend: the shared conformance suite on a fresh database per test, plus what
//! only a store shared by several nodes must do (claims racing from many nodes, signals between
//! nodes, concurrent migrations, surviving a server restart).
//!
//! Runs against `OVERSEER_TEST_DATABASE_URL` when set, else against a throw-away local cluster
//! (see `overseer_store::pgtest`). Never skips: without PostgreSQL these tests fail.
//!
//! When every test of this binary has passed, the last one prints
//! `postgres-suite: executed N tests` to stderr and writes the same line to
//! `target/postgres-suite.ok`, which CI can check to know the suite really ran (the file is
//! removed when the first test starts, so a run that fails or stops early leaves none).

use overseer_store::prelude::*;
use overseer_store::{ActivePage, Apply, Due, EventPage, LeaderBid};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use overseer_core::{JobId, JobState, Span, StepState, Timestamp};
use overseer_store::conformance::{self, admitted, at, job_id, lease_id, Fixture};
use overseer_store::pgtest::{PgCluster, TestDatabase};
use overseer_store::postgres::{PgOptions, PgStore};
use overseer_store::{Claim, Error, Signal, Submitted};
use serde_json::json;
use tokio::sync::broadcast;

const HISTORY: usize = 20;

fn options(url: &str) -> PgOptions {
    let mut options = PgOptions::new(url);
    options.history_per_job = HISTORY;
    options.pool_size = 8;
    options
}

async fn open(url: &str) -> PgStore {
    PgStore::open(options(url)).await.expect("open the store")
}

/// A fresh database on the shared cluster, and a store on it.
async fn fresh() -> (PgStore, TestDatabase) {
    let db = PgCluster::shared().database().await;
    let store = open(db.url()).await;
    (store, db)
}

async fn fixture() -> Fixture {
    let ticket = suite::Ticket::new();
    let (store, db) = fresh().await;
    // Dropped after the store: first the database, then the ticket that counts the test.
    Fixture::new(Arc::new(store), HISTORY, (db, ticket))
}

overseer_store::conformance_tests!(fixture());

fn one_step(agent: &str) -> overseer_core::JobSpec {
    conformance::spec(json!({"steps": [{"name": "s", "agent": agent}]}))
}

/// Waits for a signal matching `want`, failing after 10 seconds.
async fn expect_signal(
    signals: &mut broadcast::Receiver<Signal>,
    what: &str,
    want: impl Fn(&Signal) -> bool,
) -> Vec<Signal> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, signals.recv()).await {
            Ok(Ok(signal)) => {
                let done = want(&signal);
                seen.push(signal);
                if done {
                    return seen;
                }
            }
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("signals closed while waiting for {what}: {e}"),
            Err(_) => panic!("no {what} within 10 s; saw {seen:?}"),
        }
    }
}

// Proves every pooled connection commits durably and guards against stuck sessions: the store
// sets `synchronous_commit=on`, a lock timeout and an idle-in-transaction timeout on each one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_commit_durably() {
    let _ticket = suite::Ticket::new();
    let (store, _db) = fresh().await;
    let setting = |name: &'static str| {
        let store = store.clone();
        async move { store.server_setting(name).await.expect(name) }
    };
    assert_eq!(setting("synchronous_commit").await, "on");
    assert_eq!(setting("lock_timeout").await, "30s");
    assert_eq!(setting("idle_in_transaction_session_timeout").await, "1min");
    assert_eq!(setting("application_name").await, "overseer");
    if PgCluster::shared().is_local() {
        assert_eq!(setting("fsync").await, "on");
    }
}

// Proves claims racing from 8 separate stores (8 nodes, each with its own pool) lease every
// ready step exactly once: every step is leased, none twice, all at attempt 1, and what each node
// was handed is what the database holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_nodes_lease_each_step_exactly_once() {
    let _ticket = suite::Ticket::new();
    const JOBS: u64 = 60;
    const NODES: u128 = 8;
    let db = PgCluster::shared().database().await;
    let mut nodes = Vec::new();
    for _ in 0..NODES {
        nodes.push(Arc::new(open(db.url()).await));
    }
    let three = conformance::spec(json!({"steps": [
        {"name": "a", "agent": "race"}, {"name": "b", "agent": "race"},
        {"name": "c", "agent": "race"}]}));
    let batch = (1..=JOBS)
        .map(|n| admitted(job_id(n), &three, at(n as i64)))
        .collect();
    nodes[0].jobs_submit(batch).await.expect("submit");

    let mut tasks = tokio::task::JoinSet::new();
    for (node, store) in nodes.iter().enumerate() {
        let store = store.clone();
        tasks.spawn(async move {
            let mut mine = Vec::new();
            let mut empty_rounds = 0;
            for round in 0u128.. {
                let first = ((node as u128) << 64) | (round << 8);
                let got = store
                    .steps_claim(Claim::of_worker(
                        "race",
                        &format!("node-{node}"),
                        (first..first + 4).map(lease_id).collect(),
                        at(1_000),
                    ))
                    .await
                    .expect("claim")
                    .claimed;
                // A claim passes over jobs another node is writing: only a few empty rounds in
                // a row mean there is nothing left.
                if got.is_empty() {
                    empty_rounds += 1;
                    if empty_rounds == 3 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                empty_rounds = 0;
                for c in got {
                    let s = &c.transition.job.steps[c.step];
                    mine.push((c.transition.job.id, c.step, s.attempt, s.lease_id));
                }
            }
            mine
        });
    }
    let mut all = Vec::new();
    while let Some(result) = tasks.join_next().await {
        all.extend(result.expect("claimer task"));
    }
    assert_eq!(all.len(), JOBS as usize * 3, "every step leased");
    let unique: HashSet<(JobId, usize)> = all.iter().map(|(j, s, _, _)| (*j, *s)).collect();
    assert_eq!(unique.len(), all.len(), "no step leased twice");
    assert!(all.iter().all(|(_, _, attempt, _)| *attempt == 1));
    let checker = &nodes[NODES as usize - 1];
    for (job, step, _, lease) in &all {
        let stored = checker.job_get(*job).await.expect("get").expect("job");
        assert_eq!(stored.steps[*step].state, StepState::Running);
        assert_eq!(stored.steps[*step].lease_id, *lease);
    }
}

/// The current schema, as the migrations leave a new database, is committed in
/// `crates/store/schema/postgres.sql` (`pg_dump --schema-only`, its comments and settings left
/// out); this fails when the two differ. `OVERSEER_WRITE_SCHEMA=1` rewrites the file.
#[tokio::test]
async fn the_schema_file_is_the_migrated_schema() {
    let _ticket = suite::Ticket::new();
    let (store, db) = fresh().await;
    drop(store);
    let bindir = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let pg_dump = std::path::Path::new(&bindir).join("pg_dump");
    let out = std::process::Command::new(if pg_dump.exists() {
        pg_dump.as_os_str()
    } else {
        std::ffi::OsStr::new("pg_dump")
    })
    .args([
        "--schema-only",
        "--no-owner",
        "--no-privileges",
        "--no-comments",
    ])
    .arg(format!("--dbname={}", db.url()))
    .output()
    .expect("run pg_dump (PostgreSQL's client binaries)");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8_lossy(&out.stdout);
    let mut kept = String::new();
    for line in dump.lines() {
        let noise = line.starts_with("--")
            || line.starts_with("SET ")
            || line.starts_with("SELECT pg_catalog.set_config")
            || line.starts_with('\\');
        if !noise && !(line.is_empty() && (kept.is_empty() || kept.ends_with("\n\n"))) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    overseer_store::conformance::check_schema_file("postgres.sql", kept.trim_start());
}

/// Waits until store `b` (`on_b`) hears what store `a` commits: each listener connects in the
/// background.
async fn until_heard(a: &PgStore, on_b: &mut broadcast::Receiver<Signal>) {
    let mut n = 0;
    loop {
        n += 1;
        a.jobs_submit(vec![admitted(
            job_id(900_000 + n),
            &one_step("warmup"),
            at(0),
        )])
        .await
        .expect("submit");
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        let heard = loop {
            match tokio::time::timeout_at(deadline, on_b.recv()).await {
                Ok(Ok(Signal::Ready { agent })) if agent == "warmup" => break true,
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(e)) => panic!("signals closed: {e}"),
                Err(_) => break false,
            }
        };
        if heard {
            return;
        }
        assert!(n < 40, "B never heard A's commits");
    }
}

/// A claim that leaves a sibling step of a job it held still claimable announces it again at
/// commit: a claimer that met the job locked passed over it (`SKIP LOCKED`) and went back to
/// sleep, and must not wait for the leader's sweep to find the sibling. Claimers on other nodes
/// hear it through PostgreSQL, those of the claiming node in-process.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_announces_the_siblings_it_left() {
    let _ticket = suite::Ticket::new();
    let (a, db) = fresh().await;
    let b = open(db.url()).await;
    let mut on_a = a.signals().expect("signals");
    let mut on_b = b.signals().expect("signals");
    until_heard(&a, &mut on_b).await;
    let fan = conformance::spec(json!({"steps": [
        {"name": "b", "agent": "fan"},
        {"name": "c", "agent": "fan"},
    ]}));
    a.jobs_submit(vec![admitted(job_id(1), &fan, at(0))])
        .await
        .expect("submit");
    expect_signal(&mut on_b, "the submit's Ready fan", |s| {
        *s == Signal::Ready {
            agent: "fan".into(),
        }
    })
    .await;
    // Whatever else the submit sent has arrived by now; start from quiet channels.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while on_a.try_recv().is_ok() {}
    while on_b.try_recv().is_ok() {}

    let claim = |n| Claim::of_worker("fan", "w", vec![lease_id(n)], at(10));
    let first = a.steps_claim(claim(1)).await.expect("claim").claimed;
    assert_eq!(first.len(), 1);
    for (node, signals) in [("A", &mut on_a), ("B", &mut on_b)] {
        let what = format!("Ready fan on {node} for the sibling left behind");
        expect_signal(signals, &what, |s| {
            *s == Signal::Ready {
                agent: "fan".into(),
            }
        })
        .await;
    }
    let second = b.steps_claim(claim(2)).await.expect("claim").claimed;
    assert_eq!(second.len(), 1, "the sibling is claimable");
    assert_ne!(first[0].step, second[0].step);
}

// Proves nodes hear each other: a job submitted through store A wakes its agent on store B
// (`Signal::Ready`), finishing it there is heard on A (`Signal::Finished`), and a submit that
// rolls back (an idempotency conflict) sends nothing: notifications arrive in commit order, and
// a sentinel committed after the failed submit arrives with nothing before it. A node does not
// hear what it sent itself: it acted on it when it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signals_cross_nodes_only_when_committed() {
    let _ticket = suite::Ticket::new();
    let (a, db) = fresh().await;
    let b = open(db.url()).await;
    let mut on_a = a.signals().expect("A has signals");
    let mut on_b = b.signals().expect("B has signals");
    until_heard(&a, &mut on_b).await;

    let id = job_id(100);
    a.jobs_submit(vec![admitted(id, &one_step("billing"), at(0))])
        .await
        .expect("submit");
    expect_signal(&mut on_b, "Ready billing on B", |s| {
        *s == Signal::Ready {
            agent: "billing".into(),
        }
    })
    .await;

    let claimed = b
        .steps_claim(Claim::of_worker("billing", "w", vec![lease_id(1)], at(10)))
        .await
        .expect("claim")
        .claimed;
    assert_eq!(claimed.len(), 1);
    b.job_apply(Apply::new(
        id,
        overseer_core::Command::Complete {
            step: 0,
            attempt: 1,
            result: json!("ok"),
        },
        at(20),
    ))
    .await
    .expect("complete");
    expect_signal(&mut on_a, "Finished on A", |s| {
        *s == Signal::Finished { job: id }
    })
    .await;

    // A batch whose second job conflicts on its idempotency key rolls back whole: its first
    // job's Ready for `ghost` must never be heard.
    let keyed = |agent: &str| {
        conformance::spec(json!({"idempotency_key": "k", "steps": [{"name": "s", "agent": agent}]}))
    };
    a.jobs_submit(vec![admitted(job_id(200), &keyed("x"), at(0))])
        .await
        .expect("keyed submit");
    let conflict = a
        .jobs_submit(vec![
            admitted(job_id(201), &one_step("ghost"), at(0)),
            admitted(job_id(202), &keyed("y"), at(0)),
        ])
        .await;
    assert!(
        matches!(conflict, Err(Error::IdempotencyConflict { index: 1, .. })),
        "{conflict:?}"
    );
    assert!(a.job_get(job_id(201)).await.expect("get").is_none());
    a.jobs_submit(vec![admitted(job_id(300), &one_step("sentinel"), at(0))])
        .await
        .expect("sentinel");
    let seen = expect_signal(&mut on_b, "Ready sentinel on B", |s| {
        *s == Signal::Ready {
            agent: "sentinel".into(),
        }
    })
    .await;
    assert!(
        !seen.contains(&Signal::Ready {
            agent: "ghost".into()
        }),
        "a rolled-back submit was heard: {seen:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut own = Vec::new();
    while let Ok(signal) = on_a.try_recv() {
        own.push(signal);
    }
    let echoed = |agent: &str| {
        own.contains(&Signal::Ready {
            agent: agent.into(),
        })
    };
    assert!(
        !echoed("billing") && !echoed("sentinel"),
        "A heard its own submits: {own:?}"
    );
}

// Proves migrations are safe when nodes start together: 4 stores opening one fresh database at
// once all succeed, the schema is applied exactly once, and every store works afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_nodes_migrate_at_once() {
    let _ticket = suite::Ticket::new();
    let db = PgCluster::shared().database().await;
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let url = db.url().to_string();
        opening.spawn(async move { PgStore::open(options(&url)).await });
    }
    let mut stores = Vec::new();
    while let Some(result) = opening.join_next().await {
        stores.push(result.expect("task").expect("open while others migrate"));
    }
    let client = overseer_store::pgtest::connect(db.url())
        .await
        .expect("connect");
    let rows = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("versions");
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert!(!versions.is_empty());
    assert_eq!(versions, (1..=versions.len() as i32).collect::<Vec<_>>());
    for (n, store) in stores.iter().enumerate() {
        store
            .jobs_submit(vec![admitted(job_id(n as u64 + 1), &one_step("w"), at(0))])
            .await
            .expect("submit after migrating");
    }
    assert_eq!(stores[0].agents_counts().await.expect("counts")[0].ready, 4);
}

// Proves racing nodes agree on what must be unique: 8 nodes submitting one idempotency key at
// once store one job (the others get it back as existing), and 8 nodes submitting jobs of one
// ordering key at once start exactly one of them, heading the key, with the rest queued behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_nodes_keep_idempotency_and_ordering_keys() {
    let _ticket = suite::Ticket::new();
    let db = PgCluster::shared().database().await;
    let mut nodes = Vec::new();
    for _ in 0..8 {
        nodes.push(Arc::new(open(db.url()).await));
    }

    let same = conformance::spec(
        json!({"idempotency_key": "once", "steps": [{"name": "s", "agent": "w"}]}),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for (n, node) in nodes.iter().enumerate() {
        let node = node.clone();
        let new = admitted(job_id(n as u64 + 1), &same, at(0));
        tasks.spawn(async move { node.jobs_submit(vec![new]).await });
    }
    let mut created = Vec::new();
    let mut existing = Vec::new();
    while let Some(result) = tasks.join_next().await {
        match result.expect("task").expect("submit").pop() {
            Some(Submitted::Created(t)) => created.push(t.job.id),
            Some(Submitted::Existing(j)) => existing.push(j.id),
            None => panic!("nothing submitted"),
        }
    }
    assert_eq!(created.len(), 1, "one node stores the job");
    assert!(existing.iter().all(|id| *id == created[0]));

    let keyed =
        conformance::spec(json!({"ordering_key": "acct", "steps": [{"name": "s", "agent": "k"}]}));
    let mut tasks = tokio::task::JoinSet::new();
    for (n, node) in nodes.iter().enumerate() {
        let node = node.clone();
        let new = admitted(job_id(100 + n as u64), &keyed, at(5));
        tasks.spawn(async move { node.jobs_submit(vec![new]).await });
    }
    let mut started = 0;
    while let Some(result) = tasks.join_next().await {
        match result.expect("task").expect("submit").pop() {
            Some(Submitted::Created(t)) if t.job.state == JobState::Running => started += 1,
            Some(Submitted::Created(t)) => assert_eq!(t.job.state, JobState::Pending),
            other => panic!("expected a created job, got {other:?}"),
        }
    }
    assert_eq!(started, 1, "exactly one job of the key starts");
    let status = nodes[0].ordering_key_status("acct").await.expect("status");
    assert_eq!(status.waiting, 7);
    assert_eq!(
        status.head.map(|j| j.state),
        Some(JobState::Running),
        "the started job heads the key"
    );
    assert!(nodes[0]
        .jobs_due(Due {
            now: at(1_000_000),
            limit: 100,
        })
        .await
        .expect("due")
        .is_empty());
}

// Proves one leader among racing nodes: 8 nodes acquiring the free lease at once, exactly one
// gets it (epoch 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_leader_among_racing_nodes() {
    let _ticket = suite::Ticket::new();
    let db = PgCluster::shared().database().await;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..8 {
        let store = open(db.url()).await;
        tasks.spawn(async move {
            store
                .leader_acquire(LeaderBid {
                    node: format!("node-{n}"),
                    ttl: Span::from_secs(10),
                    now: at(0),
                })
                .await
        });
    }
    let mut leaders = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Some(lease) = result.expect("task").expect("acquire") {
            leaders.push(lease);
        }
    }
    assert_eq!(leaders.len(), 1, "{leaders:?}");
    assert_eq!(leaders[0].epoch, 1);
}

// Proves text PostgreSQL cannot hold is kept rather than refused: a label value and an agent's
// error message containing NUL are stored (NUL as U+FFFD in text columns; the JSON copy of the
// labels keeps it), and a label filter with the same value finds the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn text_with_nul_is_stored_not_refused() {
    let _ticket = suite::Ticket::new();
    let (store, _db) = fresh().await;
    let spec = conformance::spec(json!({
        "labels": {"tag": "a\u{0}b"},
        "steps": [{"name": "s", "agent": "w", "max_attempts": 3}]
    }));
    let id = job_id(1);
    store
        .jobs_submit(vec![admitted(id, &spec, at(0))])
        .await
        .expect("submit with NUL in a label value");
    let claimed = store
        .steps_claim(Claim::of_worker(
            "w",
            "worker\u{0}1",
            vec![lease_id(1)],
            at(10),
        ))
        .await
        .expect("claim by a worker with NUL in its name")
        .claimed;
    assert_eq!(claimed.len(), 1);
    store
        .job_apply(Apply::new(
            id,
            overseer_core::Command::Fail {
                step: 0,
                attempt: 1,
                error: "bad\u{0}byte".into(),
                retryable: true,
                jitter: 0.0,
            },
            at(20),
        ))
        .await
        .expect("a failure report with NUL in its error");
    let job = store.job_get(id).await.expect("get").expect("job");
    assert_eq!(job.labels["tag"], "a\u{0}b");
    assert_eq!(job.steps[0].last_error.as_deref(), Some("bad\u{FFFD}byte"));
    assert_eq!(job.steps[0].worker.as_deref(), Some("worker\u{FFFD}1"));
    let found = store
        .jobs_list(overseer_store::JobQuery {
            labels: vec![("tag".into(), "a\u{0}b".into())],
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(found.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
}

// Proves the history holds each event kind's name (a one-step job's entries in one row, logged
// by the report of its failed first attempt: the first in the row's columns, the others in
// `more`; before that, a submit's entries waiting in the job row), and that a name this build
// does not know, in any of these places, is reported as corrupt rather than panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn event_kinds_are_stored_as_their_names() {
    let _ticket = suite::Ticket::new();
    let (store, db) = fresh().await;
    submit_ok(&store, 1).await;
    let raw = overseer_store::pgtest::connect(db.url())
        .await
        .expect("connect");
    let id = job_id(1);
    let page = EventPage {
        job: id,
        after_seq: 0,
        limit: 10,
    };
    let waiting: String = raw
        .query_one("SELECT unlogged_entries FROM jobs WHERE id = $1", &[&id.0])
        .await
        .expect("waiting")
        .get(0);
    raw.execute(
        "UPDATE jobs SET unlogged_entries = replace(unlogged_entries, 'job_started', \
           'job_exploded') WHERE id = $1",
        &[&id.0],
    )
    .await
    .expect("vandalise");
    let events = store.job_events(page).await;
    assert!(
        matches!(&events, Err(Error::Corrupt(e)) if e.contains("`job_exploded`")),
        "a waiting entry: {events:?}"
    );
    raw.execute(
        "UPDATE jobs SET unlogged_entries = $2 WHERE id = $1",
        &[&id.0, &waiting],
    )
    .await
    .expect("restore");
    claim_first_at_10(&store).await;
    report_first(&store, failed(1), at(20)).await;
    let stored: Vec<(i64, String, String)> = raw
        .query(
            "SELECT seq, kind, (more::jsonb -> 0 ->> 'kind') || ',' || (more::jsonb -> 1 ->> 'kind') \
             FROM events WHERE job_id = $1 ORDER BY seq",
            &[&id.0],
        )
        .await
        .expect("kinds")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        stored,
        [(1, "job_submitted".into(), "job_started,step_ready".into())]
    );
    for vandal in [
        "UPDATE events SET more = jsonb_set(more::jsonb, '{0,kind}', '\"step_exploded\"')::text \
         WHERE job_id = $1",
        "UPDATE events SET more = NULL, kind = 'step_exploded' WHERE job_id = $1",
    ] {
        raw.execute(vandal, &[&id.0]).await.expect("vandalise");
        let events = store.job_events(page).await;
        assert!(
            matches!(&events, Err(Error::Corrupt(e)) if e.contains("`step_exploded`")),
            "{vandal}: {events:?}"
        );
    }
}

/// A fresh database and a store on it that keeps the newest 3 entries of each job's history.
async fn keeping_three() -> (PgStore, TestDatabase) {
    let db = PgCluster::shared().database().await;
    let mut options = options(db.url());
    options.history_per_job = 3;
    let store = PgStore::open(options).await.expect("open");
    (store, db)
}

/// The first entry numbers of job `id`'s history rows, in order.
async fn history_rows(raw: &tokio_postgres::Client, id: JobId) -> Vec<i64> {
    raw.query(
        "SELECT seq FROM events WHERE job_id = $1 ORDER BY seq",
        &[&id.0],
    )
    .await
    .expect("rows")
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The numbers of the entries of job `id`'s history a reader sees (the first ten).
async fn entry_seqs(store: &PgStore, id: JobId) -> Vec<i64> {
    let page = EventPage {
        job: id,
        after_seq: 0,
        limit: 10,
    };
    let events = store.job_events(page).await.expect("events");
    events.iter().map(|e| e.seq).collect()
}

// Proves the history is stored one row per write and that trimming deletes the rows wholly
// older than the entries kept, not only hides them: with 3 entries kept, a one-step job run to
// the end (a submit's three entries, a claim's one, logged with the report's two) keeps one row,
// the report's, and shows entries 4 to 6. Reads leave out the older entries of a row that
// straddles the cut, so without the deletes the entries shown would be the same: the row count
// is what fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trimming_deletes_whole_history_rows() {
    let _ticket = suite::Ticket::new();
    let (store, db) = keeping_three().await;
    submit_ok(&store, 1).await;
    let id = job_id(1);
    claim_first_at_10(&store).await;
    complete_first_at_20(&store).await;
    let raw = overseer_store::pgtest::connect(db.url())
        .await
        .expect("connect");
    let rows = history_rows(&raw, id).await;
    assert_eq!(rows, [4], "one row per write, the submit's deleted");
    let seqs = entry_seqs(&store, id).await;
    assert_eq!(seqs, [4, 5, 6]);
}

// Proves a submit writes no history row, its entries waiting in the job row, and a first lease
// writes its step row only, its entry waiting there; that the entries survive the store going
// away before the job's next write (a new store reads the same history and the same job time);
// that the next write, which does not finish the job (a failed attempt to retry), logs them all,
// under the numbers they were read with, in one history row; and that the write that finishes
// the job leaves its entries (and the retry's lease) in the job row, where they survive the store
// too. (Fails if a submit or a claim writes a history row again, or a claim the job row, if a
// waiting entry lives only in memory, or if a finishing write logs its entries or loses them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_entries_survive_the_store_and_are_logged_by_the_next_write() {
    let _ticket = suite::Ticket::new();
    let (store, db) = fresh().await;
    submit_ok(&store, 1).await;
    let id = job_id(1);
    let raw = overseer_store::pgtest::connect(db.url())
        .await
        .expect("connect");
    let stored = async || -> (i64, i64, i64, Option<String>, Option<String>) {
        let row = raw
            .query_one(
                "SELECT j.updated_at, j.last_event_seq, \
                   (SELECT count(*) FROM events WHERE job_id = j.id), s.unlogged_entry, \
                   j.unlogged_entries \
                 FROM jobs j JOIN steps s ON s.job_id = j.id WHERE j.id = $1",
                &[&id.0],
            )
            .await
            .expect("rows");
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
    };
    let submitted = stored().await;
    assert_eq!(
        (submitted.1, submitted.2),
        (0, 0),
        "the submit wrote no history row"
    );
    assert!(submitted
        .4
        .as_ref()
        .is_some_and(|w| w.contains("job_submitted")));
    claim_first_at_10(&store).await;
    let (updated, last, rows, waiting, in_job_row) = stored().await;
    assert_eq!(
        (updated, last, rows, &in_job_row),
        (submitted.0, submitted.1, submitted.2, &submitted.4),
        "the claim left the job row and the history alone"
    );
    assert!(waiting.is_some_and(|w| w.contains("step_leased")));
    let page = EventPage {
        job: id,
        after_seq: 0,
        limit: 100,
    };
    let before = store.job_events(page).await.expect("events");
    assert_eq!(
        before.last().map(|e| (e.seq, e.kind)),
        Some((4, overseer_core::EventKind::StepLeased))
    );
    drop(store);

    let store = open(db.url()).await;
    assert_eq!(store.job_events(page).await.expect("events"), before);
    let job = store.job_get(id).await.expect("get").expect("job");
    assert_eq!(job.updated_at, at(10), "dated by its waiting entry");
    report_first(&store, failed(1), at(20)).await;
    let after = store.job_events(page).await.expect("events");
    assert_eq!(after[..before.len()], before[..], "logged as it was read");
    assert!(after.len() > before.len());
    let logged = after.len() as i64;
    let (updated, last, rows, waiting, in_job_row) = stored().await;
    assert_eq!(
        (updated, last, rows, waiting, in_job_row),
        (at(20).as_millis(), logged, 1, None, None),
        "the report logged every entry in one history row"
    );

    // A retry's lease retires the first one, so its write logs its entry at once.
    claim_first(&store, lease_id(2), at(HOUR)).await;
    report_first(&store, completed(2), at(HOUR + 10)).await;
    let finished = store.job_events(page).await.expect("events");
    assert_eq!(finished[..after.len()], after[..]);
    let kinds: Vec<_> = finished[after.len()..]
        .iter()
        .map(|e| (e.seq, e.kind))
        .collect();
    use overseer_core::EventKind::{JobSucceeded, StepLeased, StepSucceeded};
    assert_eq!(
        kinds,
        [
            (logged + 1, StepLeased),
            (logged + 2, StepSucceeded),
            (logged + 3, JobSucceeded)
        ]
    );
    let (updated, last, rows, waiting, in_job_row) = stored().await;
    assert_eq!(
        (updated, last, rows, waiting),
        (at(HOUR + 10).as_millis(), logged + 1, 2, None),
        "the finishing write logged nothing"
    );
    assert!(in_job_row.is_some_and(|w| w.contains("job_succeeded")));
    drop(store);
    let store = open(db.url()).await;
    assert_eq!(store.job_events(page).await.expect("events"), finished);
    let job = store.job_get(id).await.expect("get").expect("job");
    assert_eq!(
        (job.state, job.updated_at),
        (JobState::Succeeded, at(HOUR + 10))
    );
}

// Proves the history trim counts the entries a finishing write left in its job row: with 3
// entries kept, a job whose first attempt failed (its entries logged in one row), whose retry's
// lease was logged in a row of its own and whose second attempt finished it (two entries, left
// in the job row) keeps only the lease's row, and reads show the three newest entries. (Fails if
// the trim cuts from the logged entries only: the failure's row would stay.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_trim_counts_the_entries_kept_in_the_job_row() {
    let _ticket = suite::Ticket::new();
    let (store, db) = keeping_three().await;
    submit_ok(&store, 1).await;
    let id = job_id(1);
    claim_first_at_10(&store).await;
    report_first(&store, failed(1), at(20)).await;
    claim_first(&store, lease_id(2), at(HOUR)).await;
    report_first(&store, completed(2), at(HOUR + 10)).await;
    let raw = overseer_store::pgtest::connect(db.url())
        .await
        .expect("connect");
    let last: i64 = raw
        .query_one("SELECT last_event_seq FROM jobs WHERE id = $1", &[&id.0])
        .await
        .expect("job")
        .get(0);
    let rows = history_rows(&raw, id).await;
    assert_eq!(
        rows,
        [last],
        "the failure's row is older than the three kept"
    );
    let seqs = entry_seqs(&store, id).await;
    assert_eq!(seqs, [last, last + 1, last + 2]);
}

/// Takes job `id`'s lock the way the store does (a transaction-level advisory lock on
/// `uuid_hash_extended(id, 0)`), in a transaction of `client` left open.
async fn hold_job_lock(
    client: &mut tokio_postgres::Client,
    id: JobId,
) -> tokio_postgres::Transaction<'_> {
    let tx = client.transaction().await.expect("begin");
    tx.execute(
        "SELECT pg_advisory_xact_lock(uuid_hash_extended($1, 0))",
        &[&id.0],
    )
    .await
    .expect("lock");
    tx
}

/// Whether `write` is still waiting after a while.
async fn still_waiting<T>(write: &mut tokio::task::JoinHandle<T>) -> bool {
    tokio::time::timeout(Duration::from_millis(300), write)
        .await
        .is_err()
}

// Proves every writer of a job excludes the others through the job's lock: while another
// transaction holds it, a claim passes over the job (and leases it once the lock is gone), a
// batch of reports waits for it, and so does a single-job write (a cancel). (Fails if a claim,
// a report batch or a single-job write no longer takes the lock: the multi-node tests race
// claims against claims only.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_held_by_another_transaction_is_passed_over_or_waited_for() {
    let _ticket = suite::Ticket::new();
    let (store, db) = fresh().await;
    let store = Arc::new(store);
    submit_ok(&store, 1).await;
    let id = job_id(1);
    let mut raw = overseer_store::pgtest::connect(db.url())
        .await
        .expect("connect");

    let held = hold_job_lock(&mut raw, id).await;
    let claim = Claim::of_worker("w", "w-1", vec![lease_id(1)], at(10));
    let claimed = store.steps_claim(claim).await.expect("claim").claimed;
    assert!(
        claimed.is_empty(),
        "a claim passes over a job held elsewhere"
    );
    held.commit().await.expect("release");
    claim_first_at_10(&store).await;

    let held = hold_job_lock(&mut raw, id).await;
    let reports = overseer_store::Reports {
        reports: vec![overseer_store::Report {
            lease_id: lease_id(1),
            report: overseer_store::LeaseReport::Fail {
                error: "boom".into(),
                retryable: true,
                jitter: 0.0,
            },
        }],
        now: at(20),
    };
    let batch = store.clone();
    let mut report = tokio::spawn(async move { batch.leases_report(reports).await });
    assert!(
        still_waiting(&mut report).await,
        "the report batch waits for the lock"
    );
    held.commit().await.expect("release");
    let out = report.await.expect("join").expect("report");
    assert!(out[0].is_ok(), "{:?}", out[0]);

    let held = hold_job_lock(&mut raw, id).await;
    let single = store.clone();
    let cancel = Apply::new(id, overseer_core::Command::Cancel, at(30));
    let mut cancel = tokio::spawn(async move { single.job_apply(cancel).await });
    assert!(
        still_waiting(&mut cancel).await,
        "a single-job write waits for the lock"
    );
    held.commit().await.expect("release");
    cancel.await.expect("join").expect("cancel");
    let job = store.job_get(id).await.expect("get").expect("job");
    assert_eq!(job.state, JobState::Cancelled);
}

/// Connections to `db` from Overseer stores (their `application_name`), and how many of them
/// are listening.
async fn overseer_connections(client: &tokio_postgres::Client, db: &TestDatabase) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN%') \
             FROM pg_stat_activity WHERE datname = $1 AND application_name = 'overseer'",
            &[&db.name()],
        )
        .await
        .expect("pg_stat_activity");
    (row.get(0), row.get(1))
}

// Proves a store cleans up after itself: while open it holds one LISTEN connection besides its
// pool, and once its last clone is dropped every connection it had is closed (its listening task
// stopped), so nodes that come and go leak nothing on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_store_closes_its_connections() {
    let _ticket = suite::Ticket::new();
    let (store, db) = fresh().await;
    let admin = overseer_store::pgtest::connect(&PgCluster::shared().url())
        .await
        .expect("connect");
    let clone = store.clone();
    submit_ok(&clone, 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (all, listening) = overseer_connections(&admin, &db).await;
        if listening == 1 && all >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no LISTEN connection: {all} connections, {listening} listening"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(store);
    assert_eq!(
        overseer_connections(&admin, &db).await.1,
        1,
        "a clone keeps the store open"
    );
    drop(clone);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (all, _) = overseer_connections(&admin, &db).await;
        if all == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{all} connections still open after the store was dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Leases the one step of job 1 (agent `w`) at `at(10)` under lease 1.
async fn claim_first_at_10(store: &PgStore) {
    claim_first(store, lease_id(1), at(10)).await;
}

/// An hour in milliseconds: past any retry's backoff.
const HOUR: i64 = 3_600_000;

/// Leases the one step of job 1 (agent `w`) at `when` under `lease`.
async fn claim_first(store: &PgStore, lease: overseer_core::LeaseId, when: Timestamp) {
    let claimed = store
        .steps_claim(Claim::of_worker("w", "w-1", vec![lease], when))
        .await
        .expect("claim")
        .claimed;
    assert_eq!(claimed.len(), 1);
}

/// Reports `command` on job 1 at `when`.
async fn report_first(store: &PgStore, command: overseer_core::Command, when: Timestamp) {
    store
        .job_apply(Apply::new(job_id(1), command, when))
        .await
        .expect("report");
}

/// Attempt `attempt` of job 1's one step succeeded.
fn completed(attempt: u32) -> overseer_core::Command {
    overseer_core::Command::Complete {
        step: 0,
        attempt,
        result: json!(true),
    }
}

/// Attempt `attempt` of job 1's one step failed, to be retried.
fn failed(attempt: u32) -> overseer_core::Command {
    overseer_core::Command::Fail {
        step: 0,
        attempt,
        error: "boom".into(),
        retryable: true,
        jitter: 0.0,
    }
}

/// Completes attempt 1 of job 1's one step at `at(20)`.
async fn complete_first_at_20(store: &PgStore) {
    report_first(store, completed(1), at(20)).await;
}

async fn submit_ok(store: &PgStore, n: u64) {
    let submitted = store
        .jobs_submit(vec![admitted(job_id(n), &one_step("w"), at(0))])
        .await
        .unwrap_or_else(|e| panic!("submit {n}: {e}"));
    assert!(matches!(submitted.as_slice(), [Submitted::Created(_)]));
}

// Proves the store rides out a server restart without being reopened: while the server is down
// every call answers `Unavailable` (a submit never claims success for a job not committed), and
// once it is back the pool replaces its broken connections, earlier jobs are all there, and the
// listener reconnects and asks for a sweep (`Signal::Due { at: 0 }`). Uses a cluster of its own
// (an external server cannot be stopped: without local binaries the restart is emulated there by
// terminating every connection to the test's database).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_store_survives_a_server_restart() {
    let _ticket = suite::Ticket::new();
    let private = match PgCluster::start_private() {
        Ok(cluster) => Some(cluster),
        Err(e) if !PgCluster::shared().is_local() => {
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!(
                    "pgtest: no local binaries for a private cluster ({e}); emulating the \
                     restart on the external server by terminating the test database's \
                     connections\n"
                )
                .as_bytes(),
            );
            None
        }
        Err(e) => panic!("{e}"),
    };
    let cluster = private.as_ref().unwrap_or_else(|| PgCluster::shared());
    let db = cluster.database().await;
    let mut opts = options(db.url());
    opts.connect_timeout = Duration::from_secs(2);
    opts.acquire_timeout = Duration::from_secs(3);
    let store = PgStore::open(opts).await.expect("open");
    let mut signals = store.signals().expect("signals");
    for n in 1..=5 {
        submit_ok(&store, n).await;
    }

    if let Some(cluster) = &private {
        cluster.stop().expect("stop the server");
        match store
            .jobs_submit(vec![admitted(job_id(6), &one_step("w"), at(0))])
            .await
        {
            Err(Error::Unavailable(_)) => {}
            other => panic!("a submit while the server is down answered {other:?}"),
        }
        assert!(matches!(store.ping().await, Err(Error::Unavailable(_))));
        // A node starting meanwhile is told so, rather than hanging or half-opening.
        match PgStore::open(options(db.url())).await {
            Err(Error::Unavailable(_)) => {}
            Ok(_) => panic!("opened a store on a stopped server"),
            Err(e) => panic!("opening on a stopped server answered {e}"),
        }
        assert!(matches!(
            store.job_get(job_id(1)).await,
            Err(Error::Unavailable(_))
        ));
        cluster.start().expect("start the server again");
    } else {
        db.terminate_connections().expect("terminate connections");
    }

    // The pool drops closed connections and a transaction that meets one is retried on
    // another, so the first call after the restart works.
    submit_ok(&store, 7).await;
    store.ping().await.expect("ping after restart");
    for n in [1, 2, 3, 4, 5, 7] {
        assert!(
            store.job_get(job_id(n)).await.expect("get").is_some(),
            "job {n}"
        );
    }
    assert!(store.job_get(job_id(6)).await.expect("get").is_none());
    expect_signal(&mut signals, "Due { at: 0 } after reconnecting", |s| {
        *s == Signal::Due { at: Timestamp(0) }
    })
    .await;

    // A restart in one go (`pg_ctl restart`): the very next call finds a working connection.
    if let Some(cluster) = &private {
        cluster.restart().expect("restart the server");
        submit_ok(&store, 8).await;
        assert_eq!(
            store
                .jobs_active(ActivePage {
                    after: None,
                    limit: 100,
                })
                .await
                .expect("active")
                .len(),
            7
        );
    }
    drop(store);
    drop(db);
}

/// Counts this binary's passing tests and reports when all of them have (see the module docs).
mod suite {
    use std::io::Write as _;
    use std::path::PathBuf;
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Once, OnceLock};

    use overseer_store::pgtest::PgCluster;

    static STARTED: Once = Once::new();
    static PASSED: AtomicUsize = AtomicUsize::new(0);
    static EXPECTED: OnceLock<Option<usize>> = OnceLock::new();

    /// Held by a test for its whole run: counts it as passed when dropped without a panic.
    pub struct Ticket;

    impl Ticket {
        pub fn new() -> Ticket {
            STARTED.call_once(|| {
                if let Some(marker) = marker() {
                    let _ = std::fs::remove_file(marker);
                }
            });
            Ticket
        }
    }

    impl Drop for Ticket {
        fn drop(&mut self) {
            if std::thread::panicking() {
                return;
            }
            let passed = PASSED.fetch_add(1, Ordering::SeqCst) + 1;
            if Some(passed) == *EXPECTED.get_or_init(expected) {
                finish(passed);
            }
        }
    }

    fn finish(passed: usize) {
        let mode = if PgCluster::shared().is_local() {
            "local cluster"
        } else {
            "external server"
        };
        let line = format!("postgres-suite: executed {passed} tests ({mode})");
        let _ = writeln!(std::io::stderr(), "{line}");
        if let Some(marker) = marker() {
            let _ = std::fs::write(marker, format!("{line}\n"));
        }
    }

    /// How many tests this run executes: the test binary asked to list them with the same
    /// arguments (filters included), so a filtered run counts only what it runs.
    fn expected() -> Option<usize> {
        let exe = std::env::current_exe().ok()?;
        let out = Command::new(exe)
            .args(std::env::args().skip(1))
            .args(["--list", "--format", "terse"])
            .output()
            .ok()?;
        let listing = String::from_utf8_lossy(&out.stdout);
        Some(listing.lines().filter(|l| l.ends_with(": test")).count())
    }

    /// `target/postgres-suite.ok`: the test binary lives in `target/<profile>/deps/`.
    fn marker() -> Option<PathBuf> {
        let exe = std::env::current_exe().ok()?;
        let deps = exe.parent()?;
        let target = deps.parent()?.parent()?;
        Some(target.join("postgres-suite.ok"))
    }
}
