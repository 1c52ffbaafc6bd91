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
