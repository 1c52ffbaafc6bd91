//! `overseer bench` run as a user would: the real binary, tiny settings so a debug build on two
//! cores finishes in seconds. These check the shape and sanity of the results, not the speed.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;
use serde_json::Value;

/// Runs `overseer bench ARGS…`, asserts it succeeded, and answers its stdout.
fn bench(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("bench")
        .args(args)
        .output()
        .expect("run overseer bench");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
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

// Proves every scenario runs against an in-process server and prints one JSON line per result
// with every field it promises filled in and plausible (rates positive, p50 ≤ p99, recovery not
// faster than a lease can expire).
#[test]
fn every_scenario_prints_sane_json() {
    let stdout = bench(&[
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
    ]);
    let rows = rows(&stdout);
    let names: Vec<&str> = rows.keys().map(String::as_str).collect();
    let mut expected = vec![
        "submit",
        "submit_batch",
        "drain",
        "latency",
        "dag",
        "timers_submit_without_preload",
        "timers_preload",
        "timers_submit_with_preload",
        "timers_lateness",
        "recovery",
    ];
    expected.sort_unstable();
    assert_eq!(names, expected, "{stdout}");

    for (name, row) in &rows {
        assert_eq!(row["backend"], "sqlite in-process", "{row}");
        assert!(row["jobs"].as_u64().unwrap() > 0, "{row}");
        let seconds = num(row, "seconds");
        assert!(seconds > 0.0 && seconds < 60.0, "{row}");
        assert!(num(row, "rss_mb") > 1.0, "{row}");
        assert!(row["note"].as_str().is_some_and(|n| !n.is_empty()), "{row}");
        let throughput = !matches!(name.as_str(), "timers_lateness" | "recovery");
        if throughput {
            assert!(num(row, "per_s") > 0.0, "{row}");
        } else {
            assert!(row["per_s"].is_null(), "{row}");
        }
        let timed = !matches!(name.as_str(), "drain" | "dag");
        if timed {
            let (p50, p99) = (num(row, "p50_ms"), num(row, "p99_ms"));
            assert!(0.0 <= p50 && p50 <= p99, "{row}");
        } else {
            assert!(row["p50_ms"].is_null() && row["p99_ms"].is_null(), "{row}");
        }
        // Fewer than 1000 samples everywhere here: no p999 is made up from the maximum.
        assert!(row["p999_ms"].is_null(), "{row}");
    }

    let jobs = |name: &str| rows[name]["jobs"].as_u64().unwrap();
    assert_eq!(
        (jobs("submit"), jobs("drain"), jobs("timers_preload")),
        (200, 200, 2000)
    );
    assert_eq!((jobs("timers_lateness"), jobs("recovery")), (20, 3));
    let drain = &rows["drain"];
    assert_eq!(num(drain, "steps_per_s"), num(drain, "per_s"));
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

// Proves `--server` benchmarks a separately started server process, and `--scenario` with
// `--batch 1` runs exactly the scenarios asked for.
#[test]
fn targets_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let stdout = bench(&[
        "--server",
        &server.url,
        "--scenario",
        "drain",
        "--scenario",
        "submit",
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
