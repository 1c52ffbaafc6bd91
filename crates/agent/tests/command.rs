//! The command agent against a fake server, with `sh -c` scripts as the program.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{lease, wait_until, Beat, Call, Fake};
use overseer_agent::command::{CommandAgent, Error};
use overseer_core::wire::Lease;
use overseer_core::Span;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const BOUND: Duration = Duration::from_secs(10);

fn agent(script: &str) -> CommandAgent {
    let mut agent = CommandAgent::new("work", "sh", vec!["-c".into(), script.into()]);
    agent.wait = Span::from_secs(2);
    agent.worker = Some("test-command".into());
    agent
}

fn start(fake: &Fake, agent: CommandAgent) -> (CancellationToken, JoinHandle<Result<(), Error>>) {
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(agent.run(fake.client(), shutdown.clone(), CancellationToken::new()));
    (shutdown, handle)
}

async fn stop(shutdown: CancellationToken, handle: JoinHandle<Result<(), Error>>) {
    shutdown.cancel();
    tokio::time::timeout(BOUND, handle)
        .await
        .expect("the agent stops")
        .unwrap()
        .unwrap();
}

/// The report sent for one lease.
fn report_of(fake: &Fake, l: &Lease) -> Option<Call> {
    fake.reports().into_iter().find(|c| match c {
        Call::Complete { lease, .. } | Call::Fail { lease, .. } => *lease == l.lease_id,
        _ => false,
    })
}

fn completed(fake: &Fake, l: &Lease) -> Value {
    match report_of(fake, l) {
        Some(Call::Complete { result, .. }) => result.unwrap_or(Value::Null),
        other => panic!("{}: expected complete, got {other:?}", l.step),
    }
}

fn failed(fake: &Fake, l: &Lease) -> (String, bool) {
    match report_of(fake, l) {
        Some(Call::Fail {
            error, retryable, ..
        }) => (error, retryable),
        other => panic!("{}: expected fail, got {other:?}", l.step),
    }
}

/// Whether a process is still running (a zombie, or no process at all, is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => false,
    }
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

const SCRIPT: &str = r#"
case "$OVERSEER_STEP" in
  json) echo '{"a": 1}' ;;
  text) echo 'hello world' ;;
  empty) ;;
  stdin) cat ;;
  env) printf '{"job":"%s","step":"%s","attempt":%s,"key":"%s","lease":"%s"}' \
         "$OVERSEER_JOB_ID" "$OVERSEER_STEP" "$OVERSEER_ATTEMPT" "$OVERSEER_IDEMPOTENCY_KEY" "$OVERSEER_LEASE_ID" ;;
  fatal) echo 'bad input' >&2; exit 3 ;;
  retry) echo 'partial' ; echo 'flaky backend' >&2; exit 4 ;;
  signal) kill -9 $$ ;;
  flood) yes 0123456789 | head -c 5000 ;;
esac
"#;

// Proves the mapping from the program's run to the report: stdout as JSON, as a string, or
// null; the lease on stdin and in the environment; exit 0 completes; a listed exit code fails
// fatally; another exit or a signal fails retryably with the stderr tail; too much stdout
// fails fatally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_and_stdout_map_to_reports() {
    let fake = Fake::start().await;
    let steps = [
        "json", "text", "empty", "stdin", "env", "fatal", "retry", "signal", "flood",
    ];
    let leases: Vec<Lease> = steps.iter().map(|s| lease(s, 10_000, 10_000)).collect();
    for l in &leases {
        fake.push(l.clone());
    }
    let mut a = agent(SCRIPT);
    a.concurrency = 3;
    a.fatal_exit_codes = vec![3];
    a.stdout_max_bytes = 1_000;
    let (shutdown, handle) = start(&fake, a);
    assert!(
        wait_until(BOUND, || fake.reports().len() == steps.len()).await,
        "{:?}",
        fake.reports()
    );
    stop(shutdown, handle).await;

    let by = |name: &str| leases.iter().find(|l| l.step == name).unwrap();
    assert_eq!(completed(&fake, by("json")), json!({"a": 1}));
    assert_eq!(completed(&fake, by("text")), json!("hello world"));
    assert_eq!(completed(&fake, by("empty")), Value::Null);
    let echoed: Lease = serde_json::from_value(completed(&fake, by("stdin"))).unwrap();
    assert_eq!(&echoed, by("stdin"), "the whole lease arrives on stdin");
    let env = by("env");
    assert_eq!(
        completed(&fake, env),
        json!({"job": env.job_id.to_string(), "step": "env", "attempt": 1,
               "key": env.idempotency_key, "lease": env.lease_id.to_string()})
    );
    let (error, retryable) = failed(&fake, by("fatal"));
    assert!(!retryable, "exit 3 is listed as fatal");
    assert!(
        error.contains("code 3") && error.contains("bad input"),
        "{error}"
    );
    let (error, retryable) = failed(&fake, by("retry"));
    assert!(retryable);
    assert!(
        error.contains("code 4") && error.contains("flaky backend"),
        "{error}"
    );
    let (error, retryable) = failed(&fake, by("signal"));
    assert!(retryable);
    assert!(error.contains("signal 9"), "{error}");
    let (error, retryable) = failed(&fake, by("flood"));
    assert!(!retryable);
    assert!(error.contains("more than 1000 bytes"), "{error}");
}

// Proves that at the local deadline (the lease could not be renewed) the program and the
// processes it started are killed, the work it would have done next never happens, and
// nothing is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_kills_the_program_tree() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Unavailable);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let script = format!(
        r#"echo $$ > "{d}/pid"
(sleep 2; touch "{d}/marker") &
echo $! > "{d}/gpid"
wait
touch "{d}/marker""#
    );
    fake.push(lease("slow", 600, 3_000));
    let began = Instant::now();
    let (shutdown, handle) = start(&fake, agent(&script));
    let (pid_file, gpid_file) = (dir.path().join("pid"), dir.path().join("gpid"));
    assert!(
        wait_until(BOUND, || read_pid(&pid_file).is_some()
            && read_pid(&gpid_file).is_some())
        .await
    );
    let (pid, gpid) = (read_pid(&pid_file).unwrap(), read_pid(&gpid_file).unwrap());
    assert!(
        wait_until(BOUND, || !alive(pid) && !alive(gpid)).await,
        "program and child are killed"
    );
    // Past the moment the background child would have written the marker.
    tokio::time::sleep_until(began + Duration::from_millis(3_000)).await;
    assert!(
        !dir.path().join("marker").exists(),
        "work went on after the deadline"
    );
    assert!(fake.reports().is_empty(), "{:?}", fake.reports());
    stop(shutdown, handle).await;
    assert!(fake.reports().is_empty());
}

// Proves a cancel sends SIGTERM to the program (which may clean up) and is reported as a
// fatal fail carrying what the program said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_sends_sigterm_and_fails_fatally() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Cancel);
    let l = lease("stoppable", 600, 600);
    fake.push(l.clone());
    let script = r#"trap 'echo got-term >&2; exit 9' TERM; while :; do sleep 0.05; done"#;
    let (shutdown, handle) = start(&fake, agent(script));
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    stop(shutdown, handle).await;
    let (error, retryable) = failed(&fake, &l);
    assert!(!retryable);
    assert!(error.starts_with("cancelled"), "{error}");
    assert!(
        error.contains("code 9") && error.contains("got-term"),
        "{error}"
    );
}

// Proves a program that ignores SIGTERM on cancel is killed once the grace passes, and the
// step still fails fatally as cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_a_program_that_ignores_sigterm() {
    let fake = Fake::start().await;
    fake.set_beat(Beat::Cancel);
    let l = lease("stubborn", 600, 600);
    fake.push(l.clone());
    let mut a = agent(r#"trap '' TERM; while :; do sleep 0.05; done"#);
    a.cancel_grace = Duration::from_millis(300);
    let (shutdown, handle) = start(&fake, a);
    assert!(wait_until(BOUND, || !fake.reports().is_empty()).await);
    stop(shutdown, handle).await;
    let (error, retryable) = failed(&fake, &l);
    assert!(!retryable);
    assert!(
        error.starts_with("cancelled") && error.contains("signal 9"),
        "{error}"
    );
}

// Proves a program that cannot be found is refused before any lease is taken.
#[tokio::test]
async fn missing_program_fails_at_start() {
    let fake = Fake::start().await;
    let a = CommandAgent::new("work", "no-such-program-xyz", vec![]);
    let err = a
        .run(
            fake.client(),
            CancellationToken::new(),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Program { .. }), "{err}");
    assert!(fake.calls().is_empty());
}

// Proves a program reports progress by `overseer:progress VALUE` lines on stderr: a JSON value as
// JSON, anything else as a string, each carried by a following heartbeat; other stderr lines
// carry nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_progress_lines_ride_on_heartbeats() {
    let fake = Fake::start().await;
    let l = lease("progress", 900, 900);
    fake.push(l.clone());
    let script = r#"
echo 'starting' >&2
echo 'overseer:progress {"pct": 30}' >&2
sleep 0.8
echo 'overseer:progress half way there' >&2
sleep 0.8
echo done
"#;
    let (shutdown, handle) = start(&fake, agent(script));
    assert!(wait_until(BOUND, || report_of(&fake, &l).is_some()).await);
    stop(shutdown, handle).await;
    assert_eq!(completed(&fake, &l), json!("done"));
    let carried: Vec<Value> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Heartbeat { progress, .. } => progress,
            _ => None,
        })
        .collect();
    assert_eq!(
        carried,
        [json!({"pct": 30}), json!("half way there")],
        "each progress line goes with one heartbeat"
    );
}
