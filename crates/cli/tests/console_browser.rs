//! Runs the console's browser tests (`scripts/test-console.sh`: Debian's Chromium driven by
//! playwright-core under Node's test runner) against this build's `overseer` binary, so
//! `cargo test` covers the console end to end.

use std::process::Command;

// Proves the console works in a real browser against a real server and real agents: the
// script's tests fail on any broken expectation, and this test fails with their output.
#[test]
fn console_browser_tests_pass() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("sh")
        .arg(root.join("scripts/test-console.sh"))
        .env("OVERSEER_BIN", env!("CARGO_BIN_EXE_overseer"))
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .output()
        .expect("run scripts/test-console.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "console browser tests failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
}
