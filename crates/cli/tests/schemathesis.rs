//! The HTTP API fuzzed against its own OpenAPI document by schemathesis (a Python tool the
//! script installs into a venv under the target directory): no 5xx, documented statuses and
//! content types, bodies that match their schemas, schema-valid requests accepted and
//! schema-violating ones refused. `scripts/schemathesis.sh` says how.

mod common;

// Proves the API keeps its documented contract under generated input: the script's summary
// (operations, cases, failures) is printed, and any failure or error fails this test.
#[test]
fn the_api_keeps_its_documented_contract() {
    let out = std::process::Command::new("bash")
        .arg(common::workspace_root().join("scripts/schemathesis.sh"))
        .env("OVERSEER_BIN", common::BIN)
        .output()
        .expect("run scripts/schemathesis.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "schemathesis found problems (see above)"
    );
    assert!(stdout.contains("Test cases"), "no summary: {stdout}");
}
