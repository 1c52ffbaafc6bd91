//! Running a failed job again and reporting progress, end to end: the real server, real command
//! agents, and the `overseer` CLI.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::{json, Value};

/// A command agent script: appends the lease it got (one JSON line) to `journal`; step `b` fails
/// for good (exit 3) until `fixed` exists; every other run succeeds with `{"made": STEP}`.
fn journaling(journal: &Path, fixed: &Path) -> String {
    format!(
        "lease=$(cat); printf '%s\\n' \"$lease\" >> {journal}; \
         if [ \"$OVERSEER_STEP\" = b ] && [ ! -e {fixed} ]; then echo 'b is broken' >&2; exit 3; fi; \
         printf '{{\"made\": \"%s\"}}' \"$OVERSEER_STEP\"",
        journal = journal.display(),
        fixed = fixed.display()
    )
}

/// Every lease the agent got: `(job id, step, payload)`.
fn leases_seen(journal: &Path) -> Vec<(String, String, Value)> {
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let lease: Value = serde_json::from_str(l).expect("a lease JSON line");
            (
                lease["job_id"].as_str().unwrap().to_string(),
                lease["step"].as_str().unwrap().to_string(),
                lease["payload"].clone(),
            )
        })
        .collect()
}

fn cli(server: &Server, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .args(["--server", &server.url])
        .output()
        .expect("run overseer")
}

/// a → b, where b fails for good until fixed; each step's payload names it and `n`.
fn chain(n: u32) -> Value {
    json!({"on_failure": "fail", "labels": {"run": n.to_string()}, "steps": [
        {"name": "a", "agent": "work", "payload": {"step": "a", "n": n}},
        {"name": "b", "agent": "work", "depends_on": ["a"], "max_attempts": 1,
         "payload": {"step": "b", "n": n}}
    ]})
}

// Proves `overseer rerun --from-failed` of a job whose last step failed for good: the new job is
// linked both ways (GET and `status`), its first step is kept with its old result and never
// handed to an agent again, the failed step runs again with that result as input and succeeds;
// a second rerun of the same job is refused; and a plain `overseer rerun` runs every step again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_from_failure_runs_only_what_failed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let (journal, fixed) = (dir.path().join("journal"), dir.path().join("fixed"));
    let _work = Agent::start_with(
        &server,
        "work",
        &["--fatal-exit-codes", "3"],
        &["sh", "-c", &journaling(&journal, &fixed)],
    );
    let api = server.api();
    let old = api.submit(&chain(1)).await;
    let failed = api.wait_terminal(&old).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let seen = leases_seen(&journal);
    assert_eq!(seen.len(), 2, "{seen:?}");

    std::fs::write(&fixed, "").unwrap();
    let out = cli(
        &server,
        &["rerun", &old, "--from-failed", "--reason", "b fixed"],
    );
    assert!(out.status.success(), "{out:?}");
    let new = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("kept from job"),
        "{out:?}"
    );
    let done = api.wait_terminal(&new).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["rerun_of"], json!(old));
    assert_eq!(api.job(&old).await["rerun_by"], json!(new));
    assert_eq!(step(&done, "a")["state"], "succeeded");
    assert_eq!(step(&done, "a")["attempt"], 0, "a never ran in the rerun");
    assert_eq!(step(&done, "a")["result"], json!({"made": "a"}));
    assert_eq!(step(&done, "b")["result"], json!({"made": "b"}));

    let seen = leases_seen(&journal);
    let a_payload = json!({"step": "a", "n": 1});
    let a_runs = seen.iter().filter(|(_, _, p)| *p == a_payload).count();
    assert_eq!(a_runs, 1, "the agent never saw a's payload again: {seen:?}");
    assert!(seen
        .iter()
        .all(|(job, step, _)| !(job == &new && step == "a")));
    let b_of_new: Vec<&(String, String, Value)> =
        seen.iter().filter(|(j, _, _)| j == &new).collect();
    assert_eq!(b_of_new.len(), 1, "{seen:?}");
    let journal_text = std::fs::read_to_string(&journal).unwrap();
    let b_lease: Value = serde_json::from_str(journal_text.lines().last().unwrap()).unwrap();
    assert_eq!(b_lease["inputs"], json!({"a": {"made": "a"}}));
    let events = api.events(&new).await;
    assert!(events
        .iter()
        .any(|e| e["kind"] == "step_kept" && e["step"] == "a"));
    let old_events = api.events(&old).await;
    let link = old_events
        .iter()
        .find(|e| e["kind"] == "job_rerun")
        .unwrap();
    assert_eq!(link["detail"]["reason"], "b fixed");
    assert_eq!(link["detail"]["kept"], json!(["a"]));

    let status = String::from_utf8(cli(&server, &["status", &new]).stdout).unwrap();
    assert!(status.contains(&format!("rerun of: {old}")), "{status}");
    let status = String::from_utf8(cli(&server, &["status", &old]).stdout).unwrap();
    assert!(status.contains(&format!("rerun as: {new}")), "{status}");

    let again = cli(&server, &["rerun", &old]);
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already rerun"),
        "{again:?}"
    );

    // A plain rerun runs every step again.
    std::fs::remove_file(&fixed).unwrap();
    let second = api.submit(&chain(2)).await;
    assert_eq!(api.wait_terminal(&second).await["state"], "failed");
    std::fs::write(&fixed, "").unwrap();
    let out = cli(&server, &["rerun", &second]);
    assert!(out.status.success(), "{out:?}");
    let plain = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(api.wait_terminal(&plain).await["state"], "succeeded");
    let steps_of_plain: Vec<String> = leases_seen(&journal)
        .into_iter()
        .filter(|(job, _, _)| job == &plain)
        .map(|(_, step, _)| step)
        .collect();
    assert_eq!(steps_of_plain, ["a", "b"]);
}

// Proves progress end to end: a command agent's `overseer:progress` stderr lines reach the
// step (shown by GET with its time, and by `overseer status`) while it runs; the step that asks
// for `progress_events` records each new value in the history, the other none, and each keeps
// the last value once finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_shown_while_a_step_runs() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let release = dir.path().join("release");
    let script = format!(
        "cat >/dev/null; echo \"overseer:progress {{\\\"pct\\\": 50, \\\"step\\\": \\\"$OVERSEER_STEP\\\"}}\" >&2; \
         i=0; while [ ! -e {release} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
         echo 'overseer:progress done' >&2; sleep 1; echo ok",
        release = release.display()
    );
    let _work = Agent::start_with(
        &server,
        "slow",
        &["--concurrency", "2"],
        &["sh", "-c", &script],
    );
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [
            {"name": "loud", "agent": "slow", "timeout": "1s", "progress_events": true},
            {"name": "quiet", "agent": "slow", "timeout": "1s"}
        ]}))
        .await;
    let job = wait_for("both steps to report progress", || {
        let api = api.clone();
        let id = id.clone();
        async move {
            let job = api.job(&id).await;
            let both = ["loud", "quiet"]
                .iter()
                .all(|s| step(&job, s)["progress"]["pct"] == 50);
            both.then_some(job)
        }
    })
    .await;
    assert_eq!(
        step(&job, "loud")["progress"],
        json!({"pct": 50, "step": "loud"})
    );
    assert!(step(&job, "loud")["progress_at"].is_string(), "{job}");
    let status = String::from_utf8(cli(&server, &["status", &id]).stdout).unwrap();
    assert!(
        status.contains(r#"progress: {"pct":50,"step":"quiet"}"#),
        "{status}"
    );
    std::fs::write(&release, "").unwrap();
    let done = api.wait_terminal(&id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(step(&done, "loud")["progress"], "done");
    assert_eq!(step(&done, "quiet")["progress"], "done");
    let recorded: Vec<(Value, Value)> = api
        .events(&id)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "step_progress")
        .map(|e| (e["step"].clone(), e["detail"]["progress"].clone()))
        .collect();
    assert_eq!(
        recorded,
        [
            (json!("loud"), json!({"pct": 50, "step": "loud"})),
            (json!("loud"), json!("done"))
        ]
    );
}

// Proves a heartbeat's progress over `limits.progress_bytes` is refused with 413 naming
// `progress` and nothing is stored, while one within it is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_progress_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let id = api
        .submit(&json!({"steps": [{"name": "s", "agent": "manual", "timeout": "30s"}]}))
        .await;
    let (status, leases) = api
        .post(
            "/v1/agents/manual/leases",
            &json!({"worker": "me", "wait": "5s"}),
        )
        .await;
    assert_eq!(status, 200, "{leases}");
    let lease = leases["leases"][0]["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    let beat = format!("/v1/leases/{lease}/heartbeat");
    let (status, body) = api
        .post(&beat, &json!({"progress": "x".repeat(4_100)}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["field"], "progress");
    assert!(step(&api.job(&id).await, "s")["progress"].is_null());
    let (status, body) = api.post(&beat, &json!({"progress": [1, 2, 3]})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(step(&api.job(&id).await, "s")["progress"], json!([1, 2, 3]));
}
