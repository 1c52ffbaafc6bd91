//! `overseer bench` run as a user would: the real binary, tiny settings so a debug build on two
//! cores finishes in seconds. These check the shape and sanity of the results, not the speed.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;
use overseer_store::pgtest::PgCluster;
use serde_json::Value;

/// Runs `overseer bench ARGS…`, asserts it succeeded, and answers its stdout.
fn bench(args: &[&str]) -> String {
    bench_with_stderr(args).0
}

/// Runs `overseer bench ARGS…`, asserts it succeeded, and answers its stdout and stderr.
fn bench_with_stderr(args: &[&str]) -> (String, String) {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .output()
        .expect("run overseer bench");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "bench failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// Parses one JSON object per line, by scenario name; fails on a line that is not one.
fn rows(stdout: &str) -> BTreeMap<String, Value> {
    let mut rows = BTreeMap::new();
    for line in stdout.lines() {
        let row: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        let name = row["scenario"]
            .as_str()
            .expect("a scenario name")
            .to_string();
        assert!(rows.insert(name, row.clone()).is_none(), "twice: {row}");
    }
    rows
}

fn num(row: &Value, field: &str) -> f64 {
    row[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number: {row}"))
}

// Proves every scenario runs against an in-process server (`memory` against a server process of
// its own) and prints one JSON line per result with every field it promises filled in and
// plausible (rates positive, p50 ≤ p99, recovery not faster than a lease can expire, the
// background load of `latency_loaded` and both memory readings present), while `cross_node`,
// which needs PostgreSQL, is skipped on SQLite with a note on stderr and prints no line.
#[test]
fn every_scenario_prints_sane_json() {
    let (stdout, stderr) = bench_with_stderr(&[
        "--jobs",
        "200",
        "--output",
        "json",
        "--preload",
        "2000",
        "--due",
        "20",
        "--kills",
        "3",
        "--clients",
        "4",
        "--workers",
        "2",
        "--concurrency",
        "8",
        "--batch",
        "50",
        "--load-rate",
        "200",
        "--pending",
        "200",
    ]);
    let rows = rows(&stdout);
    let names: Vec<&str> = rows.keys().map(String::as_str).collect();
    let mut expected = vec![
        "submit",
        "submit_batch",
        "drain",
        "latency",
        "latency_loaded",
        "dag",
        "timers_submit_without_preload",
        "timers_preload",
        "timers_submit_with_preload",
        "timers_lateness",
        "recovery",
        "ordered",
        "fanout",
        "memory",
        "overload",
        "store_submit",
        "store_drain",
    ];
    expected.sort_unstable();
    assert_eq!(names, expected, "{stdout}");
    assert!(
        stderr.contains("cross_node skipped") && stderr.contains("only measure polling"),
        "{stderr}"
    );

    for (name, row) in &rows {
        let backend = match name.as_str() {
            "memory" | "overload" => "sqlite server process",
            "store_submit" | "store_drain" => "sqlite store alone",
            _ => "sqlite in-process",
        };
        assert_eq!(row["backend"], backend, "{row}");
        assert!(row["jobs"].as_u64().unwrap() > 0, "{row}");
        let seconds = num(row, "seconds");
        assert!(seconds > 0.0 && seconds < 60.0, "{row}");
        assert!(num(row, "rss_mb") > 1.0, "{row}");
        assert!(row["note"].as_str().is_some_and(|n| !n.is_empty()), "{row}");
        let throughput = !matches!(name.as_str(), "timers_lateness" | "recovery" | "overload");
        if throughput {
            assert!(num(row, "per_s") > 0.0, "{row}");
        } else {
            assert!(row["per_s"].is_null(), "{row}");
        }
        let timed = !matches!(
            name.as_str(),
            "drain" | "dag" | "memory" | "store_submit" | "store_drain"
        );
        if timed {
            let (p50, p99) = (num(row, "p50_ms"), num(row, "p99_ms"));
            assert!(0.0 <= p50 && p50 <= p99, "{row}");
        } else {
            assert!(row["p50_ms"].is_null() && row["p99_ms"].is_null(), "{row}");
        }
        // Fewer than 1000 samples everywhere here: no p999 is made up from the maximum.
        assert!(row["p999_ms"].is_null(), "{row}");
        // The extra fields are on every line, filled in only where they apply.
        assert_eq!(
            row["load_per_s"].is_null(),
            name != "latency_loaded",
            "{row}"
        );
        assert_eq!(
            row["rss_idle_mb"].is_null(),
            name != "memory" && name != "overload",
            "{row}"
        );
    }

    let jobs = |name: &str| rows[name]["jobs"].as_u64().unwrap();
    assert_eq!(
        (jobs("submit"), jobs("drain"), jobs("timers_preload")),
        (200, 200, 2000)
    );
    assert_eq!((jobs("timers_lateness"), jobs("recovery")), (20, 3));
    assert_eq!((jobs("latency_loaded"), jobs("memory")), (200, 200));
    // One gap between each two consecutive jobs of the key.
    assert_eq!(jobs("ordered"), 200);
    // One gap between the two siblings of each job.
    assert_eq!(jobs("fanout"), 200);
    // The background load ran while the markers were measured (200/s asked, so some per second).
    let loaded = &rows["latency_loaded"];
    assert!(num(loaded, "load_per_s") > 0.0, "{loaded}");
    assert!(
        loaded["note"].as_str().unwrap().contains("asked 200/s"),
        "{loaded}"
    );
    // A server process holds some memory, idle or not, and both readings are its own.
    let memory = &rows["memory"];
    assert!(num(memory, "rss_idle_mb") > 1.0, "{memory}");
    assert!(
        memory["note"]
            .as_str()
            .unwrap()
            .contains("separate `overseer server` process"),
        "{memory}"
    );
    let drain = &rows["drain"];
    assert_eq!(num(drain, "steps_per_s"), num(drain, "per_s"));
    // The store alone ran every job to the end (it fails otherwise), in batches of 50.
    assert_eq!((jobs("store_submit"), jobs("store_drain")), (200, 200));
    let store = &rows["store_drain"];
    assert_eq!(num(store, "steps_per_s"), num(store, "per_s"));
    assert!(
        rows["store_submit"]["note"]
            .as_str()
            .unwrap()
            .contains("batches of 50"),
        "{stdout}"
    );
    let dag = &rows["dag"];
    let ratio = num(dag, "steps_per_s") / num(dag, "per_s");
    assert!((ratio - 4.0).abs() < 1e-6, "4 steps per dag job: {dag}");
    // Due jobs start after their run_at, and not absurdly late.
    assert!(
        num(&rows["timers_lateness"], "p99_ms") < 10_000.0,
        "{stdout}"
    );
    // The abandoned leases (1s timeout) must run out before the steps are leased again.
    let recovery = &rows["recovery"];
    assert!(num(recovery, "p50_ms") > 300.0, "{recovery}");
    assert!(num(recovery, "p99_ms") < 15_000.0, "{recovery}");
    assert!(
        recovery["note"]
            .as_str()
            .unwrap()
            .contains("sweep interval 1s"),
        "the sweep interval is printed: {recovery}"
    );
}

// Proves `--server` benchmarks a separately started server process, `--scenario` with
// `--batch 1` runs exactly the scenarios asked for, and `memory`, `cross_node` and `store` are
// skipped with a note on stderr, since a remote server's memory cannot be read nor its store
// opened.
#[test]
fn targets_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let (stdout, stderr) = bench_with_stderr(&[
        "--server",
        &server.url,
        "--scenario",
        "drain",
        "--scenario",
        "submit",
        "--scenario",
        "memory",
        "--scenario",
        "cross_node",
        "--scenario",
        "store",
        "--batch",
        "1",
        "--jobs",
        "100",
        "--clients",
        "2",
        "--workers",
        "1",
        "--output",
        "json",
    ]);
    let rows = rows(&stdout);
    let names: Vec<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(names, ["drain", "submit"], "{stdout}");
    assert!(stderr.contains("memory skipped"), "{stderr}");
    assert!(stderr.contains("cross_node skipped"), "{stderr}");
    assert!(stderr.contains("store skipped"), "{stderr}");
    for row in rows.values() {
        assert_eq!(
            row["backend"].as_str().unwrap(),
            format!("remote {}", server.url),
            "{row}"
        );
        assert!(num(row, "per_s") > 0.0, "{row}");
    }
}

// Proves the default table output has a header and a row per result on stdout, while progress
// chatter stays off stdout.
#[test]
fn table_output_is_readable() {
    let stdout = bench(&["--scenario", "latency", "--jobs", "40", "--workers", "1"]);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("backend: sqlite in-process"), "{stdout}");
    let header = lines.next().unwrap_or_default();
    for column in ["scenario", "jobs/s", "p50_ms", "p99_ms", "rss_mb"] {
        assert!(header.contains(column), "{header}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(
        row.starts_with("latency ") && row.contains(" 40 "),
        "{stdout}"
    );
    assert!(
        !stdout.contains("running latency"),
        "progress goes to stderr: {stdout}"
    );
}

/// A database of its own on the shared test cluster, dropped when the returned value is.
fn fresh_database() -> overseer_store::pgtest::TestDatabase {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(PgCluster::shared().database())
}

// Proves `cross_node` runs on PostgreSQL: on a fresh database, the markers go to the bench's
// node while the workers long-poll a second in-process node, and one JSON line reports the
// 202 → lease latencies across them (sanity only: p50 ≤ p99, no p99.9 from 30 samples).
#[test]
fn cross_node_on_postgres() {
    let db = fresh_database();
    let stdout = bench(&[
        "--db",
        db.url(),
        "--scenario",
        "cross_node",
        "--jobs",
        "30",
        "--workers",
        "2",
        "--output",
        "json",
    ]);
    let rows = rows(&stdout);
    let names: Vec<&str> = rows.keys().map(String::as_str).collect();
    assert_eq!(names, ["cross_node"], "{stdout}");
    let row = &rows["cross_node"];
    assert_eq!(row["backend"], "postgres in-process", "{row}");
    assert_eq!(row["jobs"], 30, "{row}");
    assert!(num(row, "per_s") > 0.0, "{row}");
    let (p50, p99) = (num(row, "p50_ms"), num(row, "p99_ms"));
    assert!(0.0 <= p50 && p50 <= p99, "{row}");
    assert!(row["p999_ms"].is_null(), "{row}");
    let note = row["note"].as_str().unwrap();
    assert!(
        note.contains("node B") && note.contains("target p99 ≤ 10 ms"),
        "{row}"
    );
}

// Proves `ordered` runs on PostgreSQL too: every job of the key runs, one gap per hand-over is
// measured, and p50 ≤ p99 (the hand-over figures themselves live in BENCHMARKS.md).
#[test]
fn ordered_on_postgres() {
    let db = fresh_database();
    let stdout = bench(&[
        "--db",
        db.url(),
        "--scenario",
        "ordered",
        "--jobs",
        "50",
        "--workers",
        "2",
        "--output",
        "json",
    ]);
    let rows = rows(&stdout);
    let row = &rows["ordered"];
    assert_eq!(row["backend"], "postgres in-process", "{row}");
    assert_eq!(row["jobs"], 50, "{row}");
    let (p50, p99) = (num(row, "p50_ms"), num(row, "p99_ms"));
    assert!(0.0 <= p50 && p50 <= p99, "{row}");
}

// Proves `steady` reads a server process every `--sample-every` while it removes finished jobs
// past a short retention, and ends with the markers of all readings but the first pooled by
// whether jobs were being removed during them: the figure that says what removal costs claims.
#[test]
fn steady_pools_its_claims_by_whether_jobs_were_being_removed() {
    let stdout = bench(&[
        "--scenario",
        "steady",
        "--steady-rate",
        "200",
        "--duration",
        // The server looks for jobs to remove every 10 s while none are due.
        "16s",
        "--sample-every",
        "2s",
        "--retention",
        "1s",
        "--workers",
        "1",
        "--concurrency",
        "8",
        "--output",
        "json",
    ]);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let named = |name: &'static str| lines.iter().filter(move |r| r["scenario"] == name);
    let readings = named("steady").count();
    assert!(readings >= 4, "{readings} readings: {stdout}");
    let removing = named("steady_removing")
        .next()
        .unwrap_or_else(|| panic!("no pooled row for removal: {stdout}"));
    let pooled = named("steady_not_removing")
        .chain(named("steady_removing"))
        .map(|r| num(r, "jobs"))
        .sum::<f64>();
    // Every reading but the first is in exactly one of the two pools, 300 markers each.
    assert_eq!(pooled, 300.0 * (readings - 1) as f64, "{stdout}");
    assert!(
        num(removing, "p50_ms") <= num(removing, "p99_ms"),
        "{removing}"
    );
    let last = named("steady").next_back().expect("a reading");
    let note = last["note"].as_str().expect("a note");
    assert!(!note.contains(" 0 jobs removed so far"), "{note}");
    // The pooled rows carry the server's memory, as the readings do, not the bench's own.
    assert_eq!(removing["rss_mb"], last["rss_mb"], "{stdout}");
}
