//! The README's walkthrough and its "things to try", run as a new user pastes them: every `sh`
//! block between "## Five-minute walkthrough" and "## Writing agents", in order, through bash.
//! Only what cannot be the same in a test changes: `./target/release/overseer` is the binary
//! cargo built for the test, the server listens on a free port with its store in a temporary
//! directory (through `OVERSEER_LISTEN`, `OVERSEER_SERVER` and `OVERSEER_DB`, which the README
//! documents), `cargo build --release` is skipped, and `<JOB_ID>` is the id the last `submit`
//! printed, as a reader would copy it.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The `sh` blocks of the walkthrough section, each with its indentation removed.
fn walkthrough_blocks(readme: &str) -> Vec<String> {
    let start = readme
        .find("## Five-minute walkthrough")
        .expect("the README has a walkthrough");
    let end = readme[start..]
        .find("## Writing agents")
        .map_or(readme.len(), |i| start + i);
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme[start..end].lines() {
        let trimmed = line.trim_start();
        match (&mut current, trimmed) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(lines), "```") => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), _) => lines.push(trimmed.to_string()),
            (None, _) => {}
        }
    }
    blocks
}

/// A block as the test runs it (see the module comment).
fn adapt(block: &str, port: u16, ids: &Path) -> String {
    let ids = ids.display();
    block
        .lines()
        .filter(|l| l.trim() != "cargo build --release")
        .map(|l| {
            let mut l = l
                .replace("./target/release/overseer", BIN)
                .replace("localhost:7433", &format!("127.0.0.1:{port}"))
                .replace("<JOB_ID>", &format!("$(tail -n1 \"{ids}\")"));
            let submits = l.starts_with(&format!("{BIN} submit ")) && !l.trim_end().ends_with('&');
            if submits {
                l.push_str(&format!(" | tee -a \"{ids}\""));
            }
            l
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The process group of every block (agents a block leaves running in the background stay in
/// it); all are killed at the end, however the test ends.
struct Groups(Vec<u32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for &pgid in &self.0 {
            signal_group(pgid, "KILL");
        }
    }
}

/// Runs `script` in bash in a process group of its own, its output going to `log` (a file, so
/// agents it leaves in the background can never fill a pipe nobody reads).
fn spawn_block(script: &str, env: &[(&str, String)], log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("create a log file");
    let err = out.try_clone().expect("clone the log file");
    let mut cmd = Command::new("bash");
    cmd.args(["-e", "-o", "pipefail", "-c", script])
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .env("RUST_LOG", "warn")
        .env_remove("OVERSEER_TOKEN")
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("run bash")
}

// Proves the README's walkthrough and things to try work as written, block by block: each one
// exits 0, the walkthrough job succeeds, the killed agent's step succeeds on attempt 2 on the
// second agent, and the cancelled job ends `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walkthrough_works_as_written() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let blocks = walkthrough_blocks(&readme);
    assert!(
        blocks.len() >= 6,
        "expected the walkthrough's blocks: {blocks:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ids = dir.path().join("ids");
    let env = [
        ("OVERSEER_LISTEN", format!("127.0.0.1:{port}")),
        ("OVERSEER_SERVER", format!("http://127.0.0.1:{port}")),
        (
            "OVERSEER_DB",
            format!("sqlite://{}", dir.path().join("overseer.db").display()),
        ),
    ];
    let api = Api::new(&format!("http://127.0.0.1:{port}"));
    let mut groups = Groups(Vec::new());
    let mut submitted = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        let script = adapt(block, port, &ids);
        let serves = script.trim_end().ends_with(" server");
        let log = dir.path().join(format!("block-{n}.log"));
        let mut child = spawn_block(&script, &env, &log);
        groups.0.push(child.id());
        if serves {
            wait_for("the server to listen", || async move {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .ok()
                    .map(drop)
            })
            .await;
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "block did not finish:\n{script}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            status.success(),
            "block failed ({status}):\n{script}\n--- its output\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let last = std::fs::read_to_string(&ids).unwrap_or_default();
        let id = last.lines().last().map(str::to_string);
        if let Some(id) = id.filter(|id| submitted.last() != Some(id)) {
            submitted.push(id);
        }
    }
    // The jobs in the order the blocks submitted them: walkthrough, slow (killed agent), flaky,
    // YAML, slow (cancelled).
    assert_eq!(submitted.len(), 5, "{submitted:?}");
    let states: Vec<String> = {
        let mut v = Vec::new();
        for id in &submitted {
            v.push(
                api.wait_terminal(id).await["state"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        v
    };
    assert_eq!(
        states,
        [
            "succeeded",
            "succeeded",
            "succeeded",
            "succeeded",
            "cancelled"
        ],
        "{submitted:?}"
    );
    let killed = api.job(&submitted[1]).await;
    assert_eq!(killed["steps"][0]["attempt"], 2, "{killed}");
}
