//! The crash test ("prove nothing is lost"): a stream of multi-step DAG jobs flows through a
//! real `overseer server` and real command agents while the test SIGKILLs the server at random
//! instants (restarting it on the same port and SQLite file) and now and then SIGKILLs an
//! agent's whole machine (the agent and its running commands) and starts a replacement. Then it
//! stops the faults, lets everything drain, and checks the server's records against a journal
//! the step scripts wrote as they ran: no acknowledged job lost, every job succeeded, no step
//! started before its dependencies ended, no two executions of one step overlapped, and every
//! recorded result came from the attempt the server says won. How an execution without an `end`
//! line (its machine was killed, or its agent stopped it at `complete_by`) is bounded is
//! explained at `journal::Bounds::end_bound`.
//!
//! Modes:
//! - Default, as CI runs it: `cargo test -p overseer --test crash` — 24 server kills a few
//!   hundred milliseconds to 1.4 s apart, about 25–45 s in all (less than 10 s of it
//!   draining and checking).
//! - Long: `OVERSEER_CRASH_SECONDS=600 cargo test -p overseer --test crash -- --nocapture` keeps
//!   killing for that many seconds.
//! - Replay: `OVERSEER_CRASH_SEED=<seed>` reuses the seed a run printed (job shapes, step
//!   lengths, when and what is killed; the OS scheduler still decides the rest). On failure the
//!   test prints the seed and keeps its directory (server and agent logs, the journal).
//!
//! The summary goes to stderr as `kills=N jobs=N lost=0 overlaps=0 agent_kills=N`.

mod common;
#[path = "crash/fault.rs"]
mod fault;
#[path = "crash/journal.rs"]
mod journal;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{millis, Agent, Server};
use fault::{kill_machine, now_ns, Rng};
use journal::{Bounds, Journal, StepKey};
use serde_json::{json, Value};

/// Server kills in the default mode.
const DEFAULT_KILLS: u32 = 24;
/// Agent names steps are spread over, and processes (machines) per name.
const AGENT_NAMES: [&str; 2] = ["red", "blue"];
const MACHINES_PER_NAME: usize = 2;
const CONCURRENCY: &str = "3";
/// Short, so a killed machine's steps are leased again quickly.
const STEP_TIMEOUT: &str = "2s";
/// At least two sweep intervals (the harness sweeps every 200 ms); see where it is used.
const LEADER_TTL: &str = "600ms";
/// Concurrent submitters, each submitting one job at a time.
const SUBMITTERS: usize = 2;
/// How long a submit may keep being retried, and how long the drain may take: generous, since
/// only a broken server comes near them.
const SUBMIT_PATIENCE: Duration = Duration::from_secs(120);
const DRAIN_PATIENCE: Duration = Duration::from_secs(150);

// Proves guarantees 1, 2, 4 and 5 under repeated SIGKILLs of the server and of agents' machines.
#[test]
fn server_and_agent_crashes_lose_nothing_and_never_overlap() {
    let seed = std::env::var("OVERSEER_CRASH_SEED")
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("OVERSEER_CRASH_SEED is a u64")
        })
        .unwrap_or_else(|| now_ns() as u64 ^ u64::from(std::process::id()).rotate_left(32));
    let mode = match std::env::var("OVERSEER_CRASH_SECONDS") {
        Ok(s) => Mode::Seconds(s.trim().parse().expect("OVERSEER_CRASH_SECONDS is seconds")),
        Err(_) => Mode::Kills(DEFAULT_KILLS),
    };
    eprintln!("\ncrash test: seed={seed} mode={mode:?}");
    // Declared first so it is dropped last, after the processes writing into the directory.
    let guard = OnFailure {
        seed,
        dir: Some(tempfile::tempdir().unwrap()),
    };
    let dir = guard.dir.as_ref().unwrap().path().to_path_buf();
    let journal_path = dir.join("journal");
    let script = step_script(&journal_path);
    let began = Instant::now();

    let mut rng = Rng::new(seed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // A restarted server is a new node (new node id) and must wait out its dead predecessor's
    // leader lease before its supervisor sweeps. With the default 10 s no node would lead
    // during the kill loop, and expired leases would only be healed after it: a short lease
    // keeps healing interleaved with the crashes.
    let config = dir.join("server.toml");
    std::fs::write(&config, format!("leader_ttl = \"{LEADER_TTL}\"\n")).unwrap();
    let mut server = Server::start_with(&dir, &["--config", config.to_str().unwrap()]);
    let mut machines: Vec<Agent> = Vec::new();
    for name in AGENT_NAMES {
        for _ in 0..MACHINES_PER_NAME {
            machines.push(start_machine(&server, name, &script));
        }
    }
    let mut bounds = Bounds::default();

    // The workload: submitters run on the runtime while this thread injects faults.
    let stop = Arc::new(AtomicBool::new(false));
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|i| {
            let (url, stop, rng) = (server.url.clone(), stop.clone(), rng.fork());
            rt.spawn(submitter(url, rng, format!("crash-{seed}-{i}"), stop))
        })
        .collect();

    // The faults. Sleeping here is the workload's pacing (let jobs flow between kills), not
    // synchronisation: every check below waits on conditions.
    let (mut kills, mut agent_kills) = (0u32, 0u32);
    let loop_began = Instant::now();
    while mode.go_on(kills, loop_began.elapsed()) && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(rng.millis(300, 1400));
        // About one round in three also loses an agent's machine, while the server is up or
        // while it is down.
        let machine_dies = rng
            .chance(35)
            .then(|| (rng.below(machines.len()), rng.chance(50)));
        if let Some((i, false)) = machine_dies {
            bounds
                .kills
                .push(replace_machine(&mut machines[i], &server, &script));
            agent_kills += 1;
        }
        server.kill();
        kills += 1;
        // Sometimes the server comes straight back, sometimes agents and submitters find it
        // down for a while.
        std::thread::sleep(rng.millis(0, 300));
        if let Some((i, true)) = machine_dies {
            bounds
                .kills
                .push(replace_machine(&mut machines[i], &server, &script));
            agent_kills += 1;
        }
        server.restart();
    }
    let kill_loop = loop_began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut acked: Vec<Acked> = Vec::new();
    let (mut submit_retries, mut repeats, mut dropped) = (0u64, 0u64, 0u64);
    for s in submitters {
        let out = rt.block_on(s).expect("a submitter panicked");
        let out = out.unwrap_or_else(|e| panic!("a submit failed: {e}"));
        acked.extend(out.acked);
        submit_retries += out.retries;
        repeats += out.repeats;
        dropped += out.dropped;
    }

    // Faults are over: one server, healthy agents. Every acknowledged job must now finish.
    let drain_began = Instant::now();
    let http = client();
    let views = rt.block_on(drain(&http, &server.url, &acked));
    let drain = drain_began.elapsed();
    // Stop every agent the same way, so the journal is final and every execution without an
    // end line has a bound.
    let mut problems: Vec<String> = Vec::new();
    for m in &mut machines {
        let pid = m.pid();
        // Server crashes are the agents' weather: none may have given up and exited.
        if let Some(status) = m.wait_exit(Duration::ZERO) {
            problems.push(format!(
                "agent {} ({pid}) exited by itself: {status}",
                m.name
            ));
            continue;
        }
        bounds.kills.push((pid, kill_machine(m)));
    }

    // 1. Nothing lost, everything succeeded.
    let mut lost = 0usize;
    for a in &acked {
        match views.get(&a.id) {
            Some(Some(job)) if job["state"] == "succeeded" => {}
            Some(Some(job)) => problems.push(format!("job {} ({}) ended {job}", a.id, a.key)),
            Some(None) => {
                lost += 1;
                problems.push(format!("job {} ({}) is LOST: 404", a.id, a.key));
            }
            None => problems.push(format!("job {} ({}) never finished", a.id, a.key)),
        }
    }

    // 2. Idempotency: one job per key, and no job the test was not told about.
    let all = rt.block_on(list_all(&http, &server.url));
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for job in &all {
        let key = job["idempotency_key"]
            .as_str()
            .unwrap_or("<none>")
            .to_string();
        by_key
            .entry(key)
            .or_default()
            .push(job["id"].as_str().unwrap_or_default().to_string());
    }
    for a in &acked {
        match by_key.get(&a.key).map(Vec::as_slice) {
            Some([id]) if *id == a.id => {}
            other => problems.push(format!(
                "key {} was acknowledged as job {} but the server lists {other:?}",
                a.key, a.id
            )),
        }
    }
    if all.len() != acked.len() {
        problems.push(format!(
            "the server lists {} jobs, {} were acknowledged",
            all.len(),
            acked.len()
        ));
    }

    // 3. The journal against the server's records.
    let text = std::fs::read_to_string(&journal_path).unwrap_or_default();
    let (lines, malformed) = journal::parse(&text);
    problems.extend(malformed.iter().map(|l| format!("torn journal line {l:?}")));
    let (journal, build_problems) = Journal::build(&lines);
    problems.extend(build_problems);
    let mut depends_on: HashMap<StepKey, Vec<String>> = HashMap::new();
    let mut recorded: HashMap<StepKey, u32> = HashMap::new();
    let mut steps_total = 0usize;
    for a in &acked {
        for s in a.spec["steps"].as_array().unwrap() {
            let deps = s["depends_on"].as_array().unwrap();
            let deps = deps.iter().map(|d| d.as_str().unwrap().to_string());
            depends_on.insert(step_key(&a.id, &s["name"]), deps.collect());
        }
        let Some(Some(job)) = views.get(&a.id) else {
            continue;
        };
        for s in job["steps"].as_array().unwrap() {
            steps_total += 1;
            let name = s["name"].as_str().unwrap();
            let attempt = s["attempt"].as_u64().unwrap() as u32;
            if s["state"] == "succeeded" {
                recorded.insert(step_key(&a.id, &s["name"]), attempt);
            }
            let result_attempt = s["result"]["attempt"].as_u64().map(|n| n as u32);
            problems.extend(journal.record_violations(&a.id, name, attempt, result_attempt));
        }
    }
    for (job, step) in journal.steps.keys() {
        if !depends_on.contains_key(&(job.clone(), step.clone())) {
            problems.push(format!("the journal has {job}/{step}, never submitted"));
        }
    }
    bounds.expiries = rt.block_on(expiries(&http, &server.url, &acked));
    let overlaps = journal.overlaps(&bounds);
    problems.extend(overlaps.iter().cloned());
    problems.extend(journal.dependency_violations(&depends_on, &recorded));

    eprintln!(
        "kills={kills} jobs={} lost={lost} overlaps={} agent_kills={agent_kills}",
        acked.len(),
        overlaps.len()
    );
    eprintln!(
        "steps={steps_total} executions={} cut_short={} lease_expiries={} submit_retries={submit_retries} \
         dropped_answers={dropped} repeated_submits={repeats} kill_loop={kill_loop:.1?} drain={drain:.1?} total={:.1?}",
        journal.executions(),
        journal.unfinished(),
        bounds.expiries.len(),
        began.elapsed()
    );
    if let Mode::Kills(n) = mode {
        assert!(kills >= n, "only {kills} server kills of {n}");
    }
    assert!(!acked.is_empty(), "no job was acknowledged");
    assert!(
        problems.is_empty(),
        "{} problems; the first ones:\n{}",
        problems.len(),
        problems[..problems.len().min(40)].join("\n")
    );
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Kills(u32),
    Seconds(u64),
}

impl Mode {
    fn go_on(self, kills: u32, elapsed: Duration) -> bool {
        match self {
            Mode::Kills(n) => kills < n,
            Mode::Seconds(s) => elapsed < Duration::from_secs(s),
        }
    }
}

/// On a panic: says how to replay the run and keeps its directory for the post-mortem.
struct OnFailure {
    seed: u64,
    dir: Option<tempfile::TempDir>,
}

impl Drop for OnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let kept = self.dir.take().map(|d| d.keep());
            eprintln!(
                "crash test FAILED with seed {seed}; logs and journal kept in {kept:?}\n\
                 rerun: OVERSEER_CRASH_SEED={seed} cargo test -p overseer --test crash -- --nocapture",
                seed = self.seed
            );
        }
    }
}

/// The command every step runs: journal its start, sleep the payload's `sleep_ms`, journal its
/// end, and answer its attempt number as the result. `$PPID` is the command agent (`sh` is its
/// direct child). Each `echo >>` is one short `O_APPEND` write, and the timestamp is read
/// before it.
fn step_script(journal: &Path) -> String {
    let j = journal.display();
    format!(
        r#"j='{j}'
echo "start $OVERSEER_JOB_ID $OVERSEER_STEP $OVERSEER_ATTEMPT $(date +%s%N) $PPID" >> "$j"
ms=$(sed -n 's/.*"sleep_ms":\([0-9]*\).*/\1/p')
ms=${{ms:-100}}
sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
echo "end $OVERSEER_JOB_ID $OVERSEER_STEP $OVERSEER_ATTEMPT $(date +%s%N) $PPID" >> "$j"
printf '{{"attempt": %s}}\n' "$OVERSEER_ATTEMPT"
"#
    )
}

/// Kills an agent's machine and starts a replacement under the same agent name; answers the
/// dead agent's pid and the instant of its death.
fn replace_machine(machine: &mut Agent, server: &Server, script: &str) -> (u32, i64) {
    let pid = machine.pid();
    let at = kill_machine(machine);
    *machine = start_machine(server, &machine.name.clone(), script);
    (pid, at)
}

fn start_machine(server: &Server, name: &str, script: &str) -> Agent {
    Agent::start_with(
        server,
        name,
        &["--concurrency", CONCURRENCY],
        &["sh", "-c", script],
    )
}

/// A job of one of three shapes: a diamond a → (b, c) → d, a single step, or a chain of 2–4.
/// Every step may be retried without limit (only kills fail it) after a short backoff.
fn job_spec(rng: &mut Rng, key: &str) -> Value {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let shape: Vec<(String, Vec<String>)> = match rng.below(5) {
        0 | 1 => vec![
            ("a".into(), vec![]),
            ("b".into(), names(&["a"])),
            ("c".into(), names(&["a"])),
            ("d".into(), names(&["b", "c"])),
        ],
        2 => vec![("only".into(), vec![])],
        _ => {
            let n = rng.range(2, 4);
            (1..=n)
                .map(|i| {
                    let deps = if i == 1 {
                        vec![]
                    } else {
                        vec![format!("s{}", i - 1)]
                    };
                    (format!("s{i}"), deps)
                })
                .collect()
        }
    };
    let steps: Vec<Value> = shape
        .into_iter()
        .map(|(name, deps)| {
            json!({
                "name": name,
                "agent": AGENT_NAMES[rng.below(AGENT_NAMES.len())],
                "payload": {"sleep_ms": rng.range(20, 300)},
                "depends_on": deps,
                "timeout": STEP_TIMEOUT,
                "max_attempts": 0,
                "backoff": {"initial": "100ms", "factor": 2.0, "max": "500ms"},
            })
        })
        .collect();
    json!({"idempotency_key": key, "labels": {"suite": "crash"}, "steps": steps})
}

/// A job whose submit was answered 2xx with its id.
struct Acked {
    key: String,
    id: String,
    spec: Value,
}

struct Submitted {
    acked: Vec<Acked>,
    /// Requests that got no 2xx answer and were sent again.
    retries: u64,
    /// Submits answered 200 (an existing job): a retry after a lost answer.
    repeats: u64,
    /// Answers the test threw away as if lost.
    dropped: u64,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Submits jobs one after the other until `stop`, each retried with the same body and
/// idempotency key until a 2xx answer with its id comes back. Sets `stop` itself on a failure,
/// so the fault loop ends early.
async fn submitter(
    url: String,
    mut rng: Rng,
    tag: String,
    stop: Arc<AtomicBool>,
) -> Result<Submitted, String> {
    let http = client();
    let mut out = Submitted {
        acked: Vec::new(),
        retries: 0,
        repeats: 0,
        dropped: 0,
    };
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("{tag}-{n}");
        n += 1;
        let spec = job_spec(&mut rng, &key);
        let deadline = Instant::now() + SUBMIT_PATIENCE;
        // Kills rarely land between the commit and the answer, so the test also throws away
        // some answers itself: the retry must then find the job, not make a second one.
        let mut drop_answer = rng.chance(10);
        let id = loop {
            let res = http.post(format!("{url}/v1/jobs")).json(&spec).send().await;
            let failure = match res {
                Ok(res) if drop_answer => {
                    drop_answer = false;
                    out.dropped += 1;
                    format!("answer {} dropped by the test", res.status())
                }
                Ok(res) => {
                    let status = res.status().as_u16();
                    match res.json::<Value>().await {
                        Ok(body) if status == 200 || status == 202 => match body["id"].as_str() {
                            Some(id) => {
                                out.repeats += u64::from(status == 200);
                                break id.to_string();
                            }
                            None => format!("{status} without an id: {body}"),
                        },
                        Ok(body) if status >= 500 => format!("{status}: {body}"),
                        Ok(body) => {
                            stop.store(true, Ordering::Relaxed);
                            return Err(format!("submit of {key} answered {status}: {body}"));
                        }
                        Err(e) => format!("{status} with an unreadable body: {e}"),
                    }
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                stop.store(true, Ordering::Relaxed);
                return Err(format!("submit of {key} never acknowledged: {failure}"));
            }
            out.retries += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        out.acked.push(Acked { key, id, spec });
        tokio::time::sleep(rng.millis(100, 300)).await;
    }
    Ok(out)
}

/// GET with retries on connection errors and unreadable answers (the server is steady by now;
/// this is only belt and braces). Answers status and body.
async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let failure = match http.get(url).send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                match res.json::<Value>().await {
                    Ok(body) => return (status, body),
                    Err(e) => format!("{status} with an unreadable body: {e}"),
                }
            }
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "GET {url}: {failure}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (long-polls) until every job is terminal; answers each job's final view, `None` for
/// a job the server does not know (lost). A job missing from the answer never finished.
async fn drain(
    http: &reqwest::Client,
    url: &str,
    acked: &[Acked],
) -> HashMap<String, Option<Value>> {
    let deadline = Instant::now() + DRAIN_PATIENCE;
    let mut views = HashMap::new();
    for a in acked {
        loop {
            // Past the deadline, only look: one stuck job must not cost a long-poll each.
            let wait = if Instant::now() < deadline {
                "10s"
            } else {
                "0s"
            };
            let (status, job) =
                get(http, &format!("{url}/v1/jobs/{}/wait?timeout={wait}", a.id)).await;
            if status == 404 {
                views.insert(a.id.clone(), None);
                break;
            }
            assert_eq!(status, 200, "waiting for {}: {job}", a.id);
            if matches!(
                job["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                views.insert(a.id.clone(), Some(job));
                break;
            }
            if wait == "0s" {
                eprintln!("job {} still not terminal after the drain: {job}", a.id);
                break;
            }
        }
    }
    views
}

/// Every job on the server, following `next_cursor`.
async fn list_all(http: &reqwest::Client, url: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = match &cursor {
            Some(c) => format!("{url}/v1/jobs?limit=500&cursor={c}"),
            None => format!("{url}/v1/jobs?limit=500"),
        };
        let (status, body) = get(http, &page).await;
        assert_eq!(status, 200, "{body}");
        all.extend(body["jobs"].as_array().unwrap().iter().cloned());
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return all,
        }
    }
}

/// The server's `step_lease_expired` events: (job, step, attempt) → the event's instant in ns.
/// The server writes it in whole milliseconds, truncated; that is still no earlier than the
/// lease's `lease_expires_at` (also whole milliseconds), since a lease is expired only once
/// `lease_expires_at <= now`.
async fn expiries(
    http: &reqwest::Client,
    url: &str,
    acked: &[Acked],
) -> HashMap<(String, String, u32), i64> {
    let mut out = HashMap::new();
    for a in acked {
        let (status, body) = get(http, &format!("{url}/v1/jobs/{}/events", a.id)).await;
        if status != 200 {
            continue; // a lost job, reported already
        }
        for e in body["events"].as_array().unwrap() {
            if e["kind"] == "step_lease_expired" {
                let step = e["step"].as_str().unwrap().to_string();
                let attempt = e["attempt"].as_u64().unwrap() as u32;
                let at_ns = millis(&e["at"]) * 1_000_000;
                out.insert((a.id.clone(), step, attempt), at_ns);
            }
        }
    }
    out
}

fn step_key(job: &str, name: &Value) -> StepKey {
    (job.to_string(), name.as_str().unwrap().to_string())
}
