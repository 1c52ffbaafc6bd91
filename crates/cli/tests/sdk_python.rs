//! Runs the Python SDK's own test suite (`sdks/python/tests`, pytest) against this build's
//! `overseer` binary, through `scripts/test-sdk-python.sh`, which sets up its venv itself.

use std::path::Path;
use std::process::Command;

// Proves the Python SDK works against the real server built here: the script creates (or
// reuses) the venv, installs the SDK and pinned pytest, and runs every Python test; any
// failing test, or a failing setup, fails this test with the script's whole output.
#[test]
fn python_sdk_suite_passes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new("bash")
        .arg(repo.join("scripts/test-sdk-python.sh"))
        .env("OVERSEER_BIN", env!("CARGO_BIN_EXE_overseer"))
        .current_dir(&repo)
        .output()
        .expect("bash runs scripts/test-sdk-python.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "scripts/test-sdk-python.sh failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}
