//! The TypeScript SDK's own test suite (sdks/typescript, node:test), run by
//! `scripts/test-sdk-typescript.sh` against real server processes of this crate's binary.

use std::path::Path;
use std::process::Command;

// Proves the TypeScript SDK works against the real server: the script installs the SDK's dev
// dependencies from its lock file, compiles it and runs every node:test file, which start
// `overseer server` processes from OVERSEER_BIN; any failing test fails this one, with the
// script's whole output printed.
#[test]
fn typescript_sdk_suite_passes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new("bash")
        .arg(root.join("scripts/test-sdk-typescript.sh"))
        .env("OVERSEER_BIN", env!("CARGO_BIN_EXE_overseer"))
        .output()
        .expect("run scripts/test-sdk-typescript.sh (is bash installed?)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/test-sdk-typescript.sh failed ({}):\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("# fail 0") && !stdout.contains("# pass 0"),
        "the node:test summary is missing or ran nothing:\n{stdout}"
    );
}
