//! Several `overseer server` nodes on one PostgreSQL database, under faults.
//!
//! The fault test runs three real server processes (each on its own port, one shared database,
//! `leader_ttl = "2s"`, a sweep every 200 ms) with command agents connected to different nodes,
//! a steady stream of DAG jobs submitted round-robin to the nodes (each retried, with its
//! idempotency key, until a node answers 2xx), and a cron schedule firing every second. Then it
//! SIGKILLs whichever node leads, measures how long until another node says it leads, restarts
//! the killed node, and once restarts PostgreSQL itself, down for 2.5–3.5 s, longer than the
//! leader TTL (the nodes answer 503 to writes meanwhile and reconnect by themselves). When the
//! faults stop and everything has drained, the step scripts' journal (the crash test's,
//! `crash/journal.rs`) and the servers' records must agree: no acknowledged job lost or
//! doubled, all succeeded, no two executions of one step overlapped, no step started before its
//! dependencies ended, results come from the final attempt, the cron fired exactly once per due
//! second, and every failover took at most `leader_ttl` + one sweep (+ slack for a busy
//! machine).
//!
//! The wake-up test measures, on an idle two-node system, how long a job submitted on node B
//! takes to reach an agent long-polling on node A (PostgreSQL `LISTEN/NOTIFY` in between).
//!
//! Modes:
//! - Default, as CI runs it: `cargo test -p overseer --test multinode` — two leader kills and
//!   one PostgreSQL restart; about 40 s for the whole file on two cores.
//! - Long: `OVERSEER_MULTINODE_SECONDS=600 cargo test -p overseer --test multinode --
//!   --nocapture` keeps killing leaders (one PostgreSQL restart, after the first kill) for that
//!   many seconds.
//! - Replay: `OVERSEER_MULTINODE_SEED=<seed>` reuses the seed a run printed (job shapes, pauses
//!   between faults). On failure the test keeps its directory (node and agent logs, journal).
//!
//! The fault test needs the PostgreSQL binaries (`initdb`, `pg_ctl`: it stops and starts its
//! own cluster); the wake-up test takes them or `OVERSEER_TEST_DATABASE_URL`. Without either,
//! they fail (`overseer_store::pgtest` says what to install); they never skip.
//! The summaries go to stderr: `nodes=3 jobs=N lost=0 overlaps=0 failover_ms=… cron_fires=N
//! duplicates=0 gaps=0` and `wake-up … p50=… p99=…`.

#[path = "multinode/checks.rs"]
mod checks;
mod common;
// The crash test's RNG and "machine lost power"; not every helper is used here.
#[allow(dead_code)]
#[path = "crash/fault.rs"]
mod fault;
#[path = "crash/journal.rs"]
mod journal;
#[path = "multinode/load.rs"]
mod load;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{millis, Agent, Server};
use fault::{kill_machine, now_ns, Rng};
use journal::{Bounds, Journal, StepKey};
use load::AGENT_NAMES;
use overseer_store::pgtest::PgCluster;
use serde_json::{json, Value};

const NODES: usize = 3;
/// The leader lease the nodes are configured with, and the sweep interval the harness gives
/// every server (`--sweep-interval 200ms`).
const LEADER_TTL: Duration = Duration::from_secs(2);
const SWEEP: Duration = Duration::from_millis(200);
/// What a failover may take beyond `LEADER_TTL + SWEEP`: readiness polls, process scheduling
/// and PostgreSQL round trips on a busy two-core machine. Generous on purpose; the measured
/// value is printed.
const FAILOVER_SLACK: Duration = Duration::from_secs(3);
/// Leader kills in the default mode (PostgreSQL is restarted once, after the first).
const DEFAULT_LEADER_KILLS: u32 = 2;
const SUBMITTERS: usize = 2;
/// Leases in flight per command agent.
const CONCURRENCY: &str = "2";
const DRAIN_PATIENCE: Duration = Duration::from_secs(90);
/// The cron schedule created at the start, firing every second.
const TICKER: &str = "ticker";

/// The two tests share the machine's two cores: run one at a time, so the wake-up latencies
/// are those of an idle system and the fault test's timings are not squeezed.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

// Proves guarantees 1, 2, 4, 5 and 7 on three nodes across leader kills and a PostgreSQL restart.
#[test]
fn leader_kills_and_a_postgres_restart_lose_nothing() {
    let _serial = serial();
    let seed = std::env::var("OVERSEER_MULTINODE_SEED")
        .ok()
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .expect("OVERSEER_MULTINODE_SEED is a u64")
        })
        .unwrap_or_else(|| now_ns() as u64 ^ u64::from(std::process::id()).rotate_left(32));
    let mode = match std::env::var("OVERSEER_MULTINODE_SECONDS") {
        Ok(s) => Mode::Seconds(
            s.trim()
                .parse()
                .expect("OVERSEER_MULTINODE_SECONDS is seconds"),
        ),
        Err(_) => Mode::Kills(DEFAULT_LEADER_KILLS),
    };
    eprintln!("\nmultinode test: seed={seed} mode={mode:?}");
    let began = Instant::now();
    // Declared first so it is dropped last, after the processes writing into the directory.
    let guard = OnFailure {
        seed,
        dir: Some(tempfile::tempdir().unwrap()),
    };
    let dir = guard.dir.as_ref().unwrap().path().to_path_buf();
    // A cluster of its own: the test restarts it. Dropped after the nodes (declared before).
    let cluster = PgCluster::start_private().unwrap_or_else(|e| panic!("{e}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(cluster.fresh_database());
    let mut rng = Rng::new(seed);
    let journal_path = dir.join("journal");
    let script = load::step_script(&journal_path);

    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!("leader_ttl = \"{}ms\"\n", LEADER_TTL.as_millis()),
    )
    .unwrap();
    let mut nodes: Vec<Server> = (0..NODES)
        .map(|i| {
            let node_dir = dir.join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir).unwrap();
            Server::start_with_db(&node_dir, &db, &["--config", config.to_str().unwrap()])
        })
        .collect();
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    // Every node serves one command agent per DAG agent name, so each step may run behind any
    // node; the cron's jobs run on two more agents, on nodes 1 and 2.
    let mut machines: Vec<Agent> = Vec::new();
    for node in &nodes {
        for name in AGENT_NAMES {
            machines.push(Agent::start_with(
                node,
                name,
                &["--concurrency", CONCURRENCY],
                &["sh", "-c", &script],
            ));
        }
    }
    let _tickers: Vec<Agent> = nodes[1..]
        .iter()
        .map(|node| {
            Agent::start_with(
                node,
                "tick",
                &["--concurrency", "4"],
                &["sh", "-c", "cat >/dev/null; echo '{\"tick\": true}'"],
            )
        })
        .collect();

    let http = load::client();
    let probe = probe_client();
    rt.block_on(single_leader(&probe, &urls));
    let (status, body) = rt.block_on(load::post(
        &http,
        &format!("{}/v1/schedules", urls[0]),
        &json!({"name": TICKER, "cron": "* * * * * *", "overlap": "allow",
                "job": {"steps": [{"name": "tick", "agent": "tick", "timeout": "2s",
                                   "max_attempts": 0}]}}),
    ));
    assert_eq!(status, 201, "creating the schedule: {body}");
    // Its first due time: from then on, every second must fire exactly once.
    let first_due_ms = millis(&body["next_fire_at"]);

    let stop = Arc::new(AtomicBool::new(false));
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|i| {
            let (urls, stop, rng) = (urls.clone(), stop.clone(), rng.fork());
            rt.spawn(load::submitter(
                urls,
                i,
                rng,
                format!("mn-{seed}-{i}"),
                stop,
            ))
        })
        .collect();

    // The faults. Sleeping here paces the workload between faults; every check waits on
    // conditions.
    let mut failovers: Vec<Duration> = Vec::new();
    let mut pg_restart: Option<PgRestart> = None;
    let loop_began = Instant::now();
    while mode.go_on(failovers.len() as u32, loop_began.elapsed()) && !stop.load(Ordering::Relaxed)
    {
        std::thread::sleep(rng.millis(2000, 3500));
        let leader = rt.block_on(single_leader(&probe, &urls));
        let killed_at = Instant::now();
        nodes[leader].kill();
        let (successor, failover) = rt.block_on(next_leader(&probe, &urls, leader, killed_at));
        eprintln!(
            "killed the leader, node {leader}; node {successor} leads {} ms later",
            failover.as_millis()
        );
        failovers.push(failover);
        std::thread::sleep(rng.millis(500, 1500));
        nodes[leader].restart();
        if pg_restart.is_none() {
            std::thread::sleep(rng.millis(1000, 2000));
            // Stopped and started rather than `restart()`ed, which takes a fraction of a
            // second: down longer than the leader TTL, the leader lease runs out meanwhile and
            // every node must find its way back (pool, LISTEN, leadership) by itself.
            let at = Instant::now();
            cluster.stop().unwrap_or_else(|e| panic!("{e}"));
            std::thread::sleep(rng.millis(2500, 3500));
            cluster.start().unwrap_or_else(|e| panic!("{e}"));
            let down = at.elapsed();
            rt.block_on(single_leader(&probe, &urls));
            let recovered = at.elapsed();
            eprintln!(
                "PostgreSQL was down {} ms; every node ready with one leader after {} ms",
                down.as_millis(),
                recovered.as_millis()
            );
            pg_restart = Some(PgRestart {
                down,
                recovered,
                back_at: Instant::now(),
            });
        }
    }
    let fault_loop = loop_began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut submitted = load::Submitted::default();
    for s in submitters {
        let out = rt.block_on(s).expect("a submitter panicked");
        let out = out.unwrap_or_else(|e| panic!("a submit failed: {e}"));
        submitted.acked.extend(out.acked);
        submitted.retries += out.retries;
        submitted.unavailable += out.unavailable;
        submitted.repeats += out.repeats;
    }
    let acked = submitted.acked;
    let mut problems: Vec<String> = Vec::new();

    // The cron: let it catch up with the present under a settled leader, then pause it, so its
    // firings are final before they are counted.
    rt.block_on(single_leader(&probe, &urls));
    let schedule_url = format!("{}/v1/schedules/{TICKER}", urls[0]);
    rt.block_on(common::wait_for("the cron to catch up", || async {
        let (_, s) = load::get(&http, &schedule_url).await;
        let last = s["last_fire_at"]
            .as_str()
            .map(|_| millis(&s["last_fire_at"]))?;
        (last >= now_ns() / 1_000_000 - 2_500).then_some(())
    }));
    let (status, body) = rt.block_on(load::post(
        &http,
        &format!("{schedule_url}/pause"),
        &json!({}),
    ));
    assert_eq!(status, 200, "pausing the schedule: {body}");
    let cron_paused_ms = now_ns() / 1_000_000;
    let (_, schedule) = rt.block_on(load::get(&http, &schedule_url));
    let last_fire_ms = millis(&schedule["last_fire_at"]);

    // Faults are over: every acknowledged job, and every job the cron made, must now finish.
    let drain_began = Instant::now();
    let all = rt.block_on(load::list_all(&http, &urls[0]));
    let cron_jobs: Vec<&Value> = all
        .iter()
        .filter(|j| {
            j["idempotency_key"]
                .as_str()
                .is_some_and(|k| checks::due_of(k, TICKER).is_some())
        })
        .collect();
    let mut ids: Vec<String> = acked.iter().map(|a| a.id.clone()).collect();
    ids.extend(
        cron_jobs
            .iter()
            .map(|j| j["id"].as_str().unwrap().to_string()),
    );
    let views = rt.block_on(load::drain(&http, &urls[0], &ids, DRAIN_PATIENCE));
    let drain = drain_began.elapsed();
    // Stop every agent the same way, so the journal is final and every execution without an
    // end line has a bound.
    let mut bounds = Bounds::default();
    for m in &mut machines {
        let pid = m.pid();
        // Nodes dying are the agents' weather: none may have given up and exited.
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

    // 2. Exactly once: one job per key, and no job the test was not told about.
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for job in all.iter().filter(|j| !is_cron_job(j)) {
        let key = job["idempotency_key"]
            .as_str()
            .unwrap_or("<none>")
            .to_string();
        let id = job["id"].as_str().unwrap_or_default().to_string();
        by_key.entry(key).or_default().push(id);
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
    let listed = by_key.values().map(Vec::len).sum::<usize>();
    if listed != acked.len() {
        problems.push(format!(
            "the server lists {listed} jobs besides the cron's, {} were acknowledged",
            acked.len()
        ));
    }
    // Every node took writes, and took them again once PostgreSQL was back.
    for node in 0..NODES {
        if !acked.iter().any(|a| a.node == node) {
            problems.push(format!("node {node} acknowledged no job"));
        }
        if let Some(pg) = &pg_restart {
            if !acked.iter().any(|a| a.node == node && a.at > pg.back_at) {
                problems.push(format!(
                    "node {node} acknowledged no job after PostgreSQL came back"
                ));
            }
        }
    }

    // 3. The journal against the servers' records.
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
    let histories = rt.block_on(load::histories(&http, &urls[0], &acked));
    bounds.expiries = load::expiries(&histories);
    for a in &acked {
        let (Some(Some(job)), Some(events)) = (views.get(&a.id), histories.get(&a.id)) else {
            continue;
        };
        let attempts: Vec<(String, u64)> = job["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_string(),
                    s["attempt"].as_u64().unwrap(),
                )
            })
            .collect();
        problems.extend(checks::history_violations(&a.id, events, &attempts));
    }
    let overlaps = journal.overlaps(&bounds);
    problems.extend(overlaps.iter().cloned());
    problems.extend(journal.dependency_violations(&depends_on, &recorded));

    // 4. The cron fired once per due second from its first firing to its last, each job done.
    let dues: Vec<i64> = cron_jobs
        .iter()
        .filter_map(|j| checks::due_of(j["idempotency_key"].as_str()?, TICKER))
        .collect();
    let cron = checks::cron_fires(&dues, 1000);
    if cron.duplicates > 0 {
        problems.push(format!(
            "the cron fired {} due times twice",
            cron.duplicates
        ));
    }
    if !cron.gaps.is_empty() {
        problems.push(format!("the cron skipped the due times {:?}", cron.gaps));
    }
    match (dues.iter().min(), dues.iter().max()) {
        (Some(&first), Some(&last)) => {
            if first != first_due_ms {
                problems.push(format!(
                    "the cron first fired for {first}, its first due time was {first_due_ms}"
                ));
            }
            if last != last_fire_ms {
                problems.push(format!(
                    "the cron's last job is for {last}, its last_fire_at is {last_fire_ms}"
                ));
            }
            // It had caught up when it was paused, so first..=last covers the whole run.
            if last < cron_paused_ms - 3_000 {
                problems.push(format!(
                    "the cron's last firing is for {last}, it was paused at {cron_paused_ms}"
                ));
            }
        }
        _ => problems.push("the cron never fired".to_string()),
    }
    for j in &cron_jobs {
        let id = j["id"].as_str().unwrap();
        match views.get(id) {
            Some(Some(job)) if job["state"] == "succeeded" => {}
            other => problems.push(format!("cron job {id} did not succeed: {other:?}")),
        }
    }

    // 5. Failover within the leader TTL plus one sweep, plus slack.
    let bound = LEADER_TTL + SWEEP + FAILOVER_SLACK;
    let worst = failovers.iter().max().copied().unwrap_or_default();
    if worst > bound {
        problems.push(format!(
            "a failover took {} ms, more than {} ms (ttl + sweep + slack)",
            worst.as_millis(),
            bound.as_millis()
        ));
    }
    // A gap in the cron would be legitimate only after more than a minute without PostgreSQL.
    if let Some(pg) = &pg_restart {
        assert!(
            pg.down < Duration::from_secs(60),
            "PostgreSQL took {:?} to restart",
            pg.down
        );
    }

    let failover_ms: Vec<String> = failovers
        .iter()
        .map(|d| d.as_millis().to_string())
        .collect();
    eprintln!(
        "nodes={NODES} jobs={} lost={lost} overlaps={} failover_ms={} cron_fires={} \
         duplicates={} gaps={}",
        acked.len(),
        overlaps.len(),
        failover_ms.join(","),
        cron.fires,
        cron.duplicates,
        cron.gaps.len()
    );
    let per_node: Vec<usize> = (0..NODES)
        .map(|n| acked.iter().filter(|a| a.node == n).count())
        .collect();
    eprintln!(
        "leader_kills={} pg_restart={} steps={steps_total} executions={} cut_short={} \
         lease_expiries={} acked_per_node={per_node:?} submit_retries={} submit_503={} \
         repeated_submits={} fault_loop={fault_loop:.1?} drain={drain:.1?} total={:.1?}",
        failovers.len(),
        pg_restart.as_ref().map_or("none".to_string(), |p| format!(
            "down {} ms, recovered {} ms",
            p.down.as_millis(),
            p.recovered.as_millis()
        )),
        journal.executions(),
        journal.unfinished(),
        bounds.expiries.len(),
        submitted.retries,
        submitted.unavailable,
        submitted.repeats,
        began.elapsed()
    );
    // Diagnostics: how often leadership changed hands beyond the kills and the outage.
    let (elections, step_downs) = leadership_log(&nodes);
    eprintln!("leader_elections={elections} step_downs={step_downs:?}");
    if let Mode::Kills(n) = mode {
        assert!(
            failovers.len() as u32 >= n,
            "only {} leader kills of {n}",
            failovers.len()
        );
    }
    assert!(pg_restart.is_some(), "PostgreSQL was never restarted");
    assert!(!acked.is_empty(), "no job was acknowledged");
    assert!(
        problems.is_empty(),
        "{} problems; the first ones:\n{}",
        problems.len(),
        problems[..problems.len().min(40)].join("\n")
    );
}

/// Nodes on one fresh database of the shared test cluster, each in a directory of its own under
/// `dir`, started with `extra` arguments; with the runtime the test drives them from and the
/// database (dropped after the nodes when bound in this order).
fn pg_nodes(
    names: &[&str],
    dir: &std::path::Path,
    extra: &[&str],
) -> (
    tokio::runtime::Runtime,
    overseer_store::pgtest::TestDatabase,
    Vec<Server>,
) {
    let cluster = PgCluster::shared();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(cluster.database());
    let nodes = names
        .iter()
        .map(|n| {
            let node_dir = dir.join(n);
            std::fs::create_dir_all(&node_dir).unwrap();
            Server::start_with_db(&node_dir, db.url(), extra)
        })
        .collect();
    (rt, db, nodes)
}

// Proves an agent given several nodes fails over: with `--server A,B` it works through node A,
// and once A is killed it takes the next job (submitted on B) through B by itself.
#[test]
fn an_agent_fails_over_to_the_next_node() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (rt, _db, mut nodes) = pg_nodes(&["a", "b"], dir.path(), &[]);
    // The second node found the schema migrated and said nothing about it (no PostgreSQL
    // NOTICE about tables that already exist, logged at INFO on every start before).
    assert!(
        !nodes[1].logs().contains("already exists"),
        "{}",
        nodes[1].logs()
    );
    let servers = format!("{},{}", nodes[0].url, nodes[1].url);
    let _agent = Agent::start_on(
        &nodes[1],
        &servers,
        "fo",
        &[],
        &["sh", "-c", "cat >/dev/null; echo '\"ok\"'"],
    );
    rt.block_on(async {
        let spec = json!({"steps": [{"name": "s", "agent": "fo"}]});
        let first = nodes[0].api().submit(&spec).await;
        let job = nodes[0].api().wait_terminal(&first).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        assert!(job["steps"][0]["worker"].is_string(), "{job}");
    });
    nodes[0].kill();
    rt.block_on(async {
        let spec = json!({"steps": [{"name": "s", "agent": "fo"}]});
        let second = nodes[1].api().submit(&spec).await;
        let job = nodes[1].api().wait_terminal(&second).await;
        assert_eq!(job["state"], "succeeded", "{job}");
    });
}

// Proves tokens live in the shared store: a token made on one node of three works on all, and
// once revoked on one node it is refused on every node within one second (each node trusts a
// lookup for at most `auth::CACHE_TTL`, 500 ms).
#[test]
fn a_revoked_token_is_refused_on_every_node_within_a_second() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let admin = "multinode-admin-secret-0123456789abcdef";
    let extra = ["--auth", "required", "--admin-token", admin];
    let (rt, _db, nodes) = pg_nodes(&["a", "b", "c"], dir.path(), &extra);
    rt.block_on(async {
        let http = reqwest::Client::new();
        let status = |url: String, token: String| {
            let http = http.clone();
            async move {
                http.get(format!("{url}/v1/jobs"))
                    .bearer_auth(token)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }
        };
        let made: Value = http
            .post(format!("{}/v1/tokens", nodes[0].url))
            .bearer_auth(admin)
            .json(&json!({"name": "reader", "scopes": ["read"]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let secret = made["secret"].as_str().unwrap().to_string();
        for node in &nodes {
            assert_eq!(status(node.url.clone(), secret.clone()).await, 200);
        }
        let revoked = http
            .delete(format!("{}/v1/tokens/reader", nodes[1].url))
            .bearer_auth(admin)
            .send()
            .await
            .unwrap();
        assert_eq!(revoked.status().as_u16(), 200);
        let start = Instant::now();
        let mut slowest = Duration::ZERO;
        for node in &nodes {
            while status(node.url.clone(), secret.clone()).await != 401 {
                assert!(start.elapsed() < Duration::from_secs(5), "still accepted");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slowest = slowest.max(start.elapsed());
        }
        eprintln!("revocation seen on all 3 nodes after {slowest:?}");
        assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    });
}

// Proves a job submitted on one node wakes an agent long-polling on another, and measures how fast.
#[test]
fn cross_node_wake_up_latency() {
    const JOBS: usize = 200;
    const WARM_UP: usize = 10;
    // Submit answer → lease answer, 200 jobs one after the other on an idle system. Prints
    // p50/p99 (the target is p99 ≤ 50 ms) and asserts only p99 < 1 s, so a busy CI machine
    // never fails it.
    let _serial = serial();
    let cluster = PgCluster::shared();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(cluster.database());
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Server> = ["a", "b"]
        .iter()
        .map(|n| {
            let node_dir = dir.path().join(n);
            std::fs::create_dir_all(&node_dir).unwrap();
            Server::start_with_db(&node_dir, db.url(), &[])
        })
        .collect();
    let (a, b) = (nodes[0].url.clone(), nodes[1].url.clone());

    let (latencies, from_send) = rt.block_on(async move {
        let http = load::client();
        // The agent: one long-poll at a time on node A; reports each lease's arrival instant,
        // completes it, and asks again.
        let polls = Arc::new(AtomicU64::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
        let poller = {
            let (http, a, polls, stop) = (http.clone(), a.clone(), polls.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    polls.fetch_add(1, Ordering::SeqCst);
                    let req = http
                        .post(format!("{a}/v1/agents/wake/leases"))
                        .json(&json!({"worker": "w-a", "max": 1, "wait": "20s"}))
                        .send();
                    let res = tokio::select! {
                        _ = stop.cancelled() => return,
                        res = req => res.expect("lease request"),
                    };
                    let body: Value = res.json().await.expect("lease answer");
                    let arrived = Instant::now();
                    for lease in body["leases"].as_array().expect("leases") {
                        let job = lease["job_id"].as_str().unwrap().to_string();
                        tx.send((job, arrived)).unwrap();
                        let id = lease["lease_id"].as_str().unwrap();
                        let res = http
                            .post(format!("{a}/v1/leases/{id}/complete"))
                            .json(&json!({"result": 1}))
                            .send()
                            .await
                            .expect("complete");
                        assert_eq!(res.status().as_u16(), 200, "complete answered");
                    }
                }
            })
        };
        let spec = json!({"steps": [{"name": "s", "agent": "wake"}]});
        let mut latencies = Vec::new();
        let mut from_send = Vec::new();
        for i in 0..WARM_UP + JOBS {
            // Pacing, not synchronisation: once the agent has asked again, give its request a
            // moment to be parked on node A, so each job meets an idle, waiting agent (a job
            // submitted earlier would still be correct, only measured differently).
            common::wait_for("the agent to ask again", || async {
                (polls.load(Ordering::SeqCst) > i as u64).then_some(())
            })
            .await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            let sent = Instant::now();
            let res = http
                .post(format!("{b}/v1/jobs"))
                .json(&spec)
                .send()
                .await
                .expect("submit");
            let answered = Instant::now();
            assert_eq!(res.status().as_u16(), 202, "submit answered");
            let job: Value = res.json().await.unwrap();
            let (leased, arrived) = tokio::time::timeout(common::PATIENCE, rx.recv())
                .await
                .expect("the agent on node A never got the job")
                .unwrap();
            assert_eq!(leased, job["id"].as_str().unwrap());
            if i >= WARM_UP {
                latencies.push(arrived.saturating_duration_since(answered));
                from_send.push(arrived.saturating_duration_since(sent));
            }
        }
        stop.cancel();
        let _ = poller.await;
        (latencies, from_send)
    });
    drop(nodes);

    let mut sorted = latencies.clone();
    sorted.sort();
    let mut sent_sorted = from_send;
    sent_sorted.sort();
    let p = |s: &[Duration], q| checks::percentile(s, q).as_secs_f64() * 1000.0;
    let p99 = checks::percentile(&sorted, 99);
    eprintln!(
        "wake-up node B → node A, submit answer → lease answer over {} jobs: p50={:.1}ms \
         p99={:.1}ms max={:.1}ms (target p99 ≤ 50ms); submit sent → lease answer: p50={:.1}ms \
         p99={:.1}ms",
        sorted.len(),
        p(&sorted, 50),
        p(&sorted, 99),
        p(&sorted, 100),
        p(&sent_sorted, 50),
        p(&sent_sorted, 99),
    );
    assert!(
        p99 < Duration::from_secs(1),
        "p99 wake-up across nodes is {p99:?}"
    );
}

// Proves a retry scheduled on one node wakes an agent long-polling on another once its backoff
// ends: node B learns the due time from A's announcement and finds the retry among the steps the
// store keeps for waking later (`agents_due`). Were the retry missing there, B's long-poll would
// sleep until its 20-second wait ran out.
#[test]
fn a_retry_failed_on_one_node_wakes_an_agent_waiting_on_another() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (rt, _db, nodes) = pg_nodes(&["a", "b"], dir.path(), &[]);
    let (a, b) = (nodes[0].url.clone(), nodes[1].url.clone());
    let (waited, lease) = rt.block_on(async move {
        let http = load::client();
        let spec = json!({"steps": [{"name": "s", "agent": "again", "max_attempts": 3,
            "backoff": {"initial": "2s", "factor": 1, "max": "2s"}}]});
        let res = http
            .post(format!("{a}/v1/jobs"))
            .json(&spec)
            .send()
            .await
            .expect("submit");
        assert_eq!(res.status().as_u16(), 202, "submit answered");
        let ask = |node: String, wait: &'static str| {
            let http = http.clone();
            async move {
                let res = http
                    .post(format!("{node}/v1/agents/again/leases"))
                    .json(&json!({"worker": "w", "max": 1, "wait": wait}))
                    .send()
                    .await
                    .expect("lease request");
                let body: Value = res.json().await.expect("lease answer");
                body["leases"].as_array().expect("leases").first().cloned()
            }
        };
        let first = ask(a.clone(), "5s")
            .await
            .expect("the first attempt on node A");
        let id = first["lease_id"].as_str().unwrap();
        let res = http
            .post(format!("{a}/v1/leases/{id}/fail"))
            .json(&json!({"error": "busy", "retryable": true}))
            .send()
            .await
            .expect("fail");
        assert_eq!(res.status().as_u16(), 200, "fail answered");
        let failed = Instant::now();
        let lease = ask(b, "20s").await;
        (failed.elapsed(), lease)
    });
    drop(nodes);
    let lease = lease.expect("node B's long-poll ended without the retry");
    assert_eq!(lease["attempt"], 2, "{lease}");
    // The backoff is at most 2 s (jitter only shortens it), then at most a sweep interval (1 s)
    // and B's own claim; generous for a busy machine, far below the 20 s wait.
    assert!(
        waited < Duration::from_secs(8),
        "the retry reached node B after {waited:?}"
    );
}

/// Whether a listed job was made by the cron.
fn is_cron_job(job: &Value) -> bool {
    job["idempotency_key"]
        .as_str()
        .is_some_and(|k| k.starts_with("schedule/"))
}

fn step_key(job: &str, name: &Value) -> StepKey {
    (job.to_string(), name.as_str().unwrap().to_string())
}

struct PgRestart {
    /// From stopping PostgreSQL until it accepted connections again.
    down: Duration,
    /// From the restart until every node answered ready with exactly one leader.
    recovered: Duration,
    /// When that was.
    back_at: Instant,
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// This many leader kills.
    Kills(u32),
    /// Leader kills for this many seconds.
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
                "multinode test FAILED with seed {seed}; logs and journal kept in {kept:?}\n\
                 rerun: OVERSEER_MULTINODE_SEED={seed} cargo test -p overseer --all-features \
                 --test multinode -- --nocapture",
                seed = self.seed
            );
        }
    }
}

/// From every node's log: how many times a node became the leader, and why nodes stepped
/// down (reason → count).
fn leadership_log(nodes: &[Server]) -> (usize, BTreeMap<String, usize>) {
    let mut elections = 0;
    let mut step_downs: BTreeMap<String, usize> = BTreeMap::new();
    for node in nodes {
        for line in node.logs().lines() {
            if line.contains("became the leader") {
                elections += 1;
            } else if line.contains("stepped down as leader") {
                let why = line
                    .split_once("why=")
                    .map_or("?", |(_, w)| w.trim())
                    .trim_matches('"');
                // Keep the reason, not the varying details after it.
                let why = why.split(':').next().unwrap_or(why).to_string();
                *step_downs.entry(why).or_default() += 1;
            }
        }
    }
    (elections, step_downs)
}

/// A client for readiness probes: short timeouts, so a dead node costs little.
fn probe_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// `GET /readyz` of one node: `Some(leader)` when it answers ready, `None` otherwise.
async fn readiness(http: &reqwest::Client, url: &str) -> Option<bool> {
    let res = http.get(format!("{url}/readyz")).send().await.ok()?;
    if res.status().as_u16() != 200 {
        return None;
    }
    let body: Value = res.json().await.ok()?;
    body["leader"].as_bool()
}

/// Waits until every node answers ready and exactly one of them leads; answers its index.
async fn single_leader(http: &reqwest::Client, urls: &[String]) -> usize {
    common::wait_for("every node ready and exactly one leader", || async {
        let mut leaders = Vec::new();
        for (i, url) in urls.iter().enumerate() {
            if readiness(http, url).await? {
                leaders.push(i);
            }
        }
        match leaders[..] {
            [one] => Some(one),
            _ => None,
        }
    })
    .await
}

/// Polls every node but `dead` until one says it leads; answers that node and how long after
/// `since` its answer came.
async fn next_leader(
    http: &reqwest::Client,
    urls: &[String],
    dead: usize,
    since: Instant,
) -> (usize, Duration) {
    let deadline = since + common::PATIENCE;
    loop {
        for (i, url) in urls.iter().enumerate().filter(|(i, _)| *i != dead) {
            if readiness(http, url).await == Some(true) {
                return (i, since.elapsed());
            }
        }
        assert!(
            Instant::now() < deadline,
            "no node took over from node {dead} within {:?}",
            common::PATIENCE
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One server-sent event as a test reads it: its name, its data, when it arrived.
type Sse = (String, String, Instant);

/// Reads `GET {url}/v1/events/stream` into a channel until the connection ends.
async fn read_stream(url: String) -> tokio::sync::mpsc::UnboundedReceiver<Sse> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut res = reqwest::Client::new()
        .get(format!("{url}/v1/events/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    tokio::spawn(async move {
        let mut buf = String::new();
        while let Ok(Some(chunk)) = res.chunk().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let (mut name, mut data) = (String::from("message"), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if !data.is_empty() && tx.send((name, data, Instant::now())).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

// Proves the event stream works across PostgreSQL nodes: a stream opened on node B, while a
// two-step job is submitted to node A and run by an agent connected only to A, receives the
// job's wake-ups (one per step made ready, without a job id: B cannot know more) and then the
// job's end with its id, within a second of the job finishing; everything B reports about it is
// marked `remote`, since nothing of it was committed on B.
#[test]
fn a_stream_on_one_node_sees_a_job_run_through_another() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (rt, _db, nodes) = pg_nodes(&["a", "b"], dir.path(), &[]);
    let _agent = Agent::start_on(
        &nodes[0],
        &nodes[0].url,
        "xs",
        &[],
        &["sh", "-c", "cat >/dev/null; sleep 0.2; echo '\"ok\"'"],
    );
    rt.block_on(async {
        let mut stream = read_stream(nodes[1].url.clone()).await;
        let (name, node, _) = stream.recv().await.unwrap();
        assert_eq!(name, "hello");
        assert!(
            node.ends_with(&format!(":{}", nodes[1].port)),
            "B says hello: {node}"
        );
        let spec = json!({"steps": [{"name": "one", "agent": "xs"},
                                     {"name": "two", "agent": "xs", "depends_on": ["one"]}]});
        let id = nodes[0].api().submit(&spec).await;
        let job = nodes[0].api().wait_terminal(&id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        let finished_seen_by_a = Instant::now();
        let mut wakeups = 0;
        loop {
            let (name, data, at) = tokio::time::timeout(Duration::from_secs(5), stream.recv())
                .await
                .expect("node B's stream announced the job's end")
                .expect("the stream stays open");
            assert_eq!(name, "change", "{data}");
            let change: Value = serde_json::from_str(&data).unwrap();
            assert_eq!(change["kinds"], json!(["remote"]), "{change}");
            match change["job"].as_str() {
                None => wakeups += 1,
                Some(j) if j == id => {
                    assert!(
                        at.saturating_duration_since(finished_seen_by_a) < Duration::from_secs(1),
                        "the end reached B late"
                    );
                    break;
                }
                Some(other) => panic!("a change of another job {other}"),
            }
        }
        assert!(
            wakeups >= 2,
            "one wake-up per step made ready on A, saw {wakeups}"
        );
    });
}
