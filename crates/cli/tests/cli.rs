//! The command line as a user meets it: output that pipes cleanly, errors that say where and
//! what, in one line with a hint.

mod common;

use std::process::{Command, Stdio};

use common::*;
use serde_json::json;

fn overseer(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .expect("run overseer")
}

// Proves `overseer jobs | head -1` cannot panic: with standard output already closed when it
// writes, the command ends quietly with status 0 and no panic message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_is_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    for _ in 0..3 {
        server
            .api()
            .submit(&json!({"steps": [{"name": "s", "agent": "nobody"}]}))
            .await;
    }
    let mut child = Command::new(BIN)
        .args(["jobs", "--server", &server.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

// Proves a spec mistake is reported where it is in the user's own file (line and column) with
// the field's path, for JSON and for YAML, and that nothing is submitted.
#[test]
fn spec_errors_point_into_the_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("bad.json");
    std::fs::write(
        &json_file,
        "{\n  \"steps\": [\n    {\"name\": \"a\", \"agent\": \"x\", \"timeout\": 30}\n  ]\n}\n",
    )
    .unwrap();
    let yaml_file = dir.path().join("bad.yaml");
    std::fs::write(
        &yaml_file,
        "steps:\n  - name: a\n    agent: x\n    max_attempts: many\n",
    )
    .unwrap();
    // No server listens there: a spec refused locally never gets as far as connecting.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    for (file, field, line) in [
        (&json_file, "steps[0].timeout", "line 3"),
        (&yaml_file, "steps[0].max_attempts", "line 4"),
    ] {
        let out = overseer(&["submit", file.to_str().unwrap(), "--server", &nowhere]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(field) && stderr.contains(line), "{stderr}");
        assert!(!stderr.contains("cannot reach"), "{stderr}");
    }
}

// Proves an unreachable server is reported once, in one line naming the URL, followed by a hint
// on what to check, with exit status 2.
#[test]
fn an_unreachable_server_is_one_line_and_a_hint() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = overseer(&["jobs", "--server", &url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(&url),
        "{stderr}"
    );
    assert_eq!(lines[0].matches(&url).count(), 1, "the URL once: {stderr}");
    assert!(lines[0].contains("Connection refused"), "{stderr}");
    assert!(
        lines[1].starts_with("hint: ") && lines[1].contains("OVERSEER_SERVER"),
        "{stderr}"
    );
}

// Proves a command agent given a script without the execute bit says so (and how to fix it)
// instead of claiming the file does not exist.
#[test]
fn a_non_executable_script_is_named_as_such() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\necho ok\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = overseer(&[
        "agent",
        "--agent",
        "a",
        "--server",
        &url,
        "--",
        script.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not executable") && stderr.contains("chmod +x"),
        "{stderr}"
    );
}

fn at(server: &Server, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--server", &server.url]);
    overseer(&all)
}

fn stdout_of(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// Proves job ids can be shortened like git's: a unique prefix works wherever an id does (status,
// events), an ambiguous one is refused listing the candidates, an unknown one says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_id_prefixes_work_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let spec = json!({"steps": [{"name": "s", "agent": "nobody"}]});
    let (a, b) = (api.submit(&spec).await, api.submit(&spec).await);
    let unique = a
        .char_indices()
        .map(|(i, _)| &a[..=i])
        .find(|p| p.len() >= 4 && !b.starts_with(p) && !p.ends_with('-'))
        .unwrap();
    let shown = stdout_of(&at(&server, &["status", unique]));
    assert!(shown.contains(&a), "{shown}");
    let events = stdout_of(&at(&server, &["events", unique]));
    assert!(events.contains("job_submitted"), "{events}");
    let ambiguous = at(&server, &["status", &a[..4]]);
    let stderr = String::from_utf8_lossy(&ambiguous.stderr);
    assert_eq!(ambiguous.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("ambiguous") && stderr.contains(&a) && stderr.contains(&b),
        "{stderr}"
    );
    let unknown = at(&server, &["cancel", "ffff"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no job id starts with"));
}

// Proves `events --follow --output json` streams the history as JSON lines until the job is
// terminal, each line one event, the last one `job_succeeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_streams_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let id = server
        .api()
        .submit(&json!({"steps": [{"name": "s", "agent": "later"}]}))
        .await;
    let follower = Command::new(BIN)
        .args([
            "events",
            &id,
            "--follow",
            "--output",
            "json",
            "--server",
            &server.url,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _agent = Agent::start(&server, "later", "cat >/dev/null; echo '\"ok\"'");
    let out = tokio::task::spawn_blocking(move || follower.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let text = stdout_of(&out);
    let kinds: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["kind"].to_string()
        })
        .collect();
    assert_eq!(
        kinds.first().map(String::as_str),
        Some("\"job_submitted\""),
        "{text}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("\"job_succeeded\""),
        "{text}"
    );
}

// Proves the agent commands: `agents` lists an agent name with its counts, `pause` and
// `resume --agent` flip it (visible in `agents --output json`, and in `status` as the step's
// waiting reason), and `limits set` changes one limit while keeping the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_limits_pause_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let job = server
        .api()
        .submit(&json!({"steps": [{"name": "s", "agent": "dns"}]}))
        .await;
    stdout_of(&at(&server, &["pause", "dns"]));
    // `status` says why the step waits, in the server's words.
    let status = stdout_of(&at(&server, &["status", &job]));
    assert!(
        status.contains("    waiting: agent `dns` paused"),
        "{status}"
    );
    let listed = stdout_of(&at(&server, &["agents", "--output", "json"]));
    let rows: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let dns = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["agent"] == "dns")
        .unwrap();
    assert_eq!(
        (dns["ready"].as_u64(), &dns["limits"]["paused"]),
        (Some(1), &json!(true)),
        "{listed}"
    );
    stdout_of(&at(&server, &["resume", "--agent", "dns"]));
    let table = stdout_of(&at(&server, &["agents"]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("dns ") && l.contains(" no ")),
        "{table}"
    );

    stdout_of(&at(
        &server,
        &["limits", "set", "dns", "--max-concurrency", "2"],
    ));
    stdout_of(&at(&server, &["limits", "set", "dns", "--rate", "5"]));
    let got = stdout_of(&at(&server, &["limits", "get", "dns", "--output", "json"]));
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        (&got["max_concurrency"], &got["rate"]),
        (&json!(2), &json!(5.0)),
        "{got}"
    );
    stdout_of(&at(&server, &["limits", "set", "dns", "--clear"]));
    let got = stdout_of(&at(&server, &["limits", "get", "dns", "--output", "json"]));
    assert!(got.contains("\"max_concurrency\": null"), "{got}");
}

// Proves `jobs` filters by agent name and creation time (an age or a time), and `status` shows
// when a step waiting out its backoff gets its next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_filters_and_next_attempt_times() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let api = server.api();
    let mine = api
        .submit(&json!({"steps": [{"name": "s", "agent": "flaky-one",
            "backoff": {"initial": "10m", "max": "1h"}}]}))
        .await;
    let other = api
        .submit(&json!({"steps": [{"name": "s", "agent": "else"}]}))
        .await;
    let by_agent = stdout_of(&at(&server, &["jobs", "--agent", "flaky-one"]));
    assert!(
        by_agent.contains(&mine) && !by_agent.contains(&other),
        "{by_agent}"
    );
    let recent = stdout_of(&at(&server, &["jobs", "--since", "1h"]));
    assert!(
        recent.contains(&mine) && recent.contains(&other),
        "{recent}"
    );
    let none = stdout_of(&at(&server, &["jobs", "--until", "2000-01-01T00:00:00Z"]));
    assert!(!none.contains(&mine), "{none}");
    let bad = at(&server, &["jobs", "--since", "yesterday-ish"]);
    assert_eq!(bad.status.code(), Some(2));

    let _flaky = Agent::start(&server, "flaky-one", "cat >/dev/null; exit 1");
    wait_for("the first failure", || {
        let api = server.api();
        let id = mine.clone();
        async move { (api.job(&id).await["steps"][0]["failures"] == 1).then_some(()) }
    })
    .await;
    let status = stdout_of(&at(&server, &["status", &mine]));
    assert!(
        status.contains("next attempt at") && status.contains("(in "),
        "{status}"
    );
}

// Proves `completions` prints a script for each shell that names the program.
#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = overseer(&["completions", shell]);
        let script = stdout_of(&out);
        assert!(
            script.contains("overseer") && script.len() > 1000,
            "{shell}"
        );
    }
}
