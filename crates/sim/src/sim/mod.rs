//! One simulated run: the real server on a real SQLite file, simulated clients, agents and
//! operators, a manual clock, and faults, all chosen by one seeded generator.
//!
//! Everything happens one request at a time on a single-threaded runtime, so a seed replays
//! the same run: the same requests at the same simulated instants, with the same answers.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use overseer_core::{LeaseId, Span, Timestamp};
use overseer_server::supervisor::Supervisor;
use overseer_server::{api, App, Config, ManualClock};
use overseer_store::sqlite::{SqliteOptions, SqliteStore};
use overseer_store::Store;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::cron::CronState;
use crate::model::{Check, Model, ReportKind};
use crate::store::{Crash, SimStore};
use crate::trace::Trace;
use crate::Options;

mod checks;
mod operators;
mod submits;
mod workers;

/// The simulated clock starts here (2027-01-15), far from the epoch so nothing is negative.
const T0: i64 = 1_800_000_000_000;
/// Work agent names; undos go to these or to `undo`.
const AGENTS: [&str; 3] = ["alpha", "beta", "gamma"];
const UNDO_AGENT: &str = "undo";
/// Late reports and duplicates kept for replay.
const REPLAYS_MAX: usize = 40;
/// Drain rounds before a job still not finished is a violation.
const DRAIN_ROUNDS: usize = 400;

/// What the fault phase can do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Submit,
    Work,
    Sweep,
    Tick,
    Jump,
    Restart,
    CrashMidSweep,
    WorkerCrash,
    WorkerPause,
    Replay,
    Cancel,
    Operate,
    Limits,
    Reschedule,
    ReplaceSchedule,
    Rerun,
}

/// How often each action comes (relative weights), how often the network loses things, how
/// agents' work goes: drawn per seed, so some seeds are calm and others stormy in one way or
/// another.
#[derive(Debug)]
struct Mix {
    /// Fault levels (0 never, 1 usual, 3 often): network, crashes, clock jumps, agent faults,
    /// cancels, agent limits.
    levels: [u32; 6],
    weights: Vec<(Action, u32)>,
    lose_request: f64,
    lose_answer: f64,
    work: (u32, u32, u32, u32),
    undo: (u32, u32, u32, u32),
    /// Probability that a step declares an undo.
    compensate: f64,
}

impl Mix {
    fn draw(rng: &mut StdRng) -> Mix {
        // 0 = never, 1 = usual, 3 = often.
        let mut level = || [0, 1, 1, 1, 3][rng.gen_range(0..5)];
        let (net, crash, clock, agents, cancel, limits) =
            (level(), level(), level(), level(), level(), level());
        let weights = vec![
            (Action::Submit, 60),
            (Action::Work, 500),
            (Action::Sweep, 60),
            (Action::Tick, 160),
            (Action::Jump, 10 * clock),
            (Action::Restart, 6 * crash),
            (Action::CrashMidSweep, 3 * crash),
            (Action::WorkerCrash, 15 * agents),
            (Action::WorkerPause, 15 * agents),
            (Action::Replay, 25 + 15 * agents),
            (Action::Cancel, 8 * cancel),
            (Action::Operate, 50),
            (Action::Limits, 6 * limits),
            (Action::Reschedule, 12),
            (Action::ReplaceSchedule, 5),
            (Action::Rerun, 10),
        ];
        // How work goes: percentages of (complete, retryable failure, fatal failure, vanish),
        // the rest reports late; undos have their own.
        let work = [(64, 16, 6, 7), (75, 15, 2, 4), (40, 25, 15, 10)][rng.gen_range(0..3)];
        let undo = [(64, 16, 6, 7), (85, 8, 1, 3), (45, 30, 10, 8)][rng.gen_range(0..3)];
        Mix {
            levels: [net, crash, clock, agents, cancel, limits],
            weights,
            lose_request: 0.02 * f64::from(net),
            lose_answer: 0.025 * f64::from(net),
            work,
            undo,
            compensate: [0.3, 0.6, 0.9][rng.gen_range(0..3)],
        }
    }

    fn describe(&self) -> String {
        let [net, crash, clock, agents, cancel, limits] = self.levels;
        format!(
            "faults: network {net}, crashes {crash}, clock jumps {clock}, agents {agents}, cancels {cancel}, limits {limits}; \
             work (complete, retry, fatal, vanish)% {:?}, undo {:?}; undo declared {}",
            self.work, self.undo, self.compensate
        )
    }

    fn pick(&self, rng: &mut StdRng) -> Action {
        let total: u32 = self.weights.iter().map(|(_, w)| w).sum();
        let mut roll = rng.gen_range(0..total.max(1));
        for &(action, w) in &self.weights {
            if roll < w {
                return action;
            }
            roll -= w;
        }
        Action::Work
    }
}

/// What a run did, for the summary line.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub actions: u64,
    pub requests: u64,
    pub leases: u64,
    pub crashes: u64,
    pub jobs: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Digest of the whole trace: equal runs have equal fingerprints.
    pub fingerprint: u64,
    pub drain_rounds: u64,
    pub sim_ms: i64,
    pub undo_leases: u64,
    /// Reports (heartbeat, complete, fail) answered 2xx, and refused with 409.
    pub reports_ok: u64,
    pub reports_refused: u64,
    pub cancels: u64,
    /// Operator actions (retry, skip, resume) answered 2xx.
    pub operator_ok: u64,
    /// Times a job was seen blocked.
    pub blocked_seen: u64,
    pub compensated_steps: u64,
    /// Jobs found removed after their retention.
    pub pruned: u64,
    /// How often each interesting path was taken, by name.
    pub paths: std::collections::BTreeMap<&'static str, u64>,
}

impl Stats {
    /// Adds another run's counts (the fingerprint is combined, order-sensitively).
    pub fn add(&mut self, o: &Stats) {
        self.actions += o.actions;
        self.requests += o.requests;
        self.leases += o.leases;
        self.crashes += o.crashes;
        self.jobs += o.jobs;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.fingerprint = self.fingerprint.rotate_left(5) ^ o.fingerprint;
        self.drain_rounds += o.drain_rounds;
        self.sim_ms += o.sim_ms;
        self.undo_leases += o.undo_leases;
        self.reports_ok += o.reports_ok;
        self.reports_refused += o.reports_refused;
        self.cancels += o.cancels;
        self.operator_ok += o.operator_ok;
        self.blocked_seen += o.blocked_seen;
        self.compensated_steps += o.compensated_steps;
        self.pruned += o.pruned;
        for (k, v) in &o.paths {
            *self.paths.entry(k).or_default() += v;
        }
    }
}

/// One server process: its app, router and supervisor over one open store.
struct Server {
    router: Router,
    supervisor: Supervisor,
    crash: Arc<Crash>,
}

/// How an agent will treat a lease it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Complete,
    FailRetryable,
    FailFatal,
    /// Crashes while working: never reports.
    Vanish,
    /// Paused (GC-like) past its lease, then reports anyway.
    Late,
}

/// A lease an agent holds and works on.
#[derive(Clone, Debug)]
struct Held {
    lease: LeaseId,
    job: usize,
    step: String,
    attempt: u32,
    undo: bool,
    /// The agent's own deadline, from the answers it received.
    deadline: Timestamp,
    work_until: Timestamp,
    next_heartbeat: Timestamp,
    heartbeat_every: Span,
    plan: Plan,
    /// Ignores its deadline (it was paused and does not know).
    rogue: bool,
}

struct Worker {
    name: String,
    agents: Vec<&'static str>,
    held: Vec<Held>,
    paused_until: Option<Timestamp>,
    incarnation: u32,
}

/// A report to send again later: a duplicate, or one from an agent that comes back late.
#[derive(Clone, Debug)]
struct Replay {
    lease: LeaseId,
    kind: ReportKind,
    body: Value,
}

/// An answer as the harness saw it.
struct Answer {
    status: u16,
    body: Value,
}

/// What happened to a request.
enum Sent {
    /// Never reached the server.
    Lost,
    /// The server answered; `delivered` is false when the answer was lost on its way back.
    Answered { answer: Answer, delivered: bool },
}

pub struct Sim {
    seed: u64,
    opts: Options,
    rng: StdRng,
    clock: Arc<ManualClock>,
    path: PathBuf,
    server: Option<Server>,
    node: String,
    nodes: u32,
    trace: Arc<Mutex<Trace>>,
    model: Model,
    workers: Vec<Worker>,
    replays: Vec<Replay>,
    /// Submits whose answer the client did not get: it will try again.
    resubmits: Vec<Vec<usize>>,
    faults: bool,
    mix: Mix,
    cron: Option<CronState>,
    /// Jobs touched by the current action, to check after it.
    touched: Vec<usize>,
    /// Reruns the server made (at most `opts.jobs` per run).
    reruns: usize,
    pub stats: Stats,
}

impl Sim {
    pub fn new(seed: u64, opts: Options, path: PathBuf, trace: Arc<Mutex<Trace>>) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let workers = (1..=rng.gen_range(2..=3))
            .map(|i| {
                let mut agents: Vec<&'static str> = AGENTS.to_vec();
                agents.push(UNDO_AGENT);
                Worker {
                    name: format!("w{i}"),
                    agents,
                    held: Vec::new(),
                    paused_until: None,
                    incarnation: 0,
                }
            })
            .collect();
        let mix = Mix::draw(&mut rng);
        Sim {
            mix,
            cron: None,
            seed,
            opts,
            rng,
            clock: Arc::new(ManualClock::new(Timestamp::from_millis(T0))),
            path,
            server: None,
            node: "sim-node-0".into(),
            nodes: 1,
            trace,
            model: Model::default(),
            workers,
            replays: Vec::new(),
            resubmits: Vec::new(),
            faults: true,
            touched: Vec::new(),
            reruns: 0,
            stats: Stats::default(),
        }
    }

    fn now(&self) -> Timestamp {
        use overseer_server::Clock;
        self.clock.now()
    }

    fn log(&self, entry: String) {
        let at = self.now().as_millis() - T0;
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(at, entry);
    }

    fn cover(&mut self, path: &'static str) {
        *self.stats.paths.entry(path).or_default() += 1;
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p)
    }

    /// The whole run: faults for `opts.actions` actions, then a drain without faults, then the
    /// final checks.
    pub async fn run(&mut self) -> Check {
        self.log(format!(
            "seed {} start: {} workers, {} jobs, {} actions; {}",
            self.seed,
            self.workers.len(),
            self.opts.jobs,
            self.opts.actions,
            self.mix.describe()
        ));
        self.open_server()?;
        if self.chance(0.35) {
            self.create_schedule().await?;
        }
        for n in 0..self.opts.actions {
            self.stats.actions += 1;
            self.touched.clear();
            self.step().await?;
            let touched = std::mem::take(&mut self.touched);
            for j in dedup(touched) {
                self.check_job(j, false).await?;
            }
            if n % 25 == 24 {
                self.check_all(false).await?;
            }
        }
        self.drain().await?;
        self.final_checks().await?;
        self.stats.sim_ms = self.now().as_millis() - T0;
        Ok(())
    }

    fn open_server(&mut self) -> Check {
        let mut options = SqliteOptions::new(&self.path);
        options.read_connections = 1;
        let sqlite =
            SqliteStore::open(options).map_err(|e| format!("cannot open the store: {e}"))?;
        let crash = Arc::new(Crash::new());
        let store: Arc<dyn Store> = Arc::new(SimStore::new(sqlite, crash.clone(), self.opts.bug));
        let config = Config {
            node_id: Some(self.node.clone()),
            ..Config::default()
        };
        let app_seed: u64 = self.rng.gen();
        let app = App::seeded(
            store,
            self.clock.clone(),
            &config,
            CancellationToken::new(),
            app_seed,
        );
        let supervisor = Supervisor::new(app.clone(), config.sweep_interval)
            .with_leader_ttl(config.leader_ttl)
            .with_repair_batch(config.repair_batch)
            .with_retention_batch(config.retention_batch);
        let router = api::router(app.clone());
        self.server = Some(Server {
            router,
            supervisor,
            crash,
        });
        self.log(format!(
            "server up as {} (rng seed {app_seed:#x})",
            self.node
        ));
        Ok(())
    }

    /// Kills the server process and starts a new one on the same file. Dropping the last
    /// handle of the store joins its writer: what was committed stays, nothing else exists.
    async fn restart(&mut self, why: &str) -> Check {
        self.stats.crashes += 1;
        let server = self.server.take();
        drop(server);
        if self.chance(0.3) {
            // Comes back under another name: it must wait for the old leader lease to expire.
            self.node = format!("sim-node-{}", self.nodes);
            self.nodes += 1;
        }
        self.log(format!("server crashed ({why}); restarting"));
        self.open_server()?;
        self.check_all(false).await
    }

    fn server(&mut self) -> &mut Server {
        self.server
            .as_mut()
            .expect("the server is up between actions")
    }

    async fn http(&mut self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        let (status, bytes) = self.http_raw(method, path, body).await;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer { status, body }
    }

    /// A request and its answer's status and bytes (decoded by the caller into the type it
    /// expects, which is cheaper than through a `Value`).
    async fn http_raw(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, axum::body::Bytes) {
        self.stats.requests += 1;
        let req = Request::builder().method(method).uri(path);
        let req = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(b).unwrap_or_default())),
            None => req.body(Body::empty()),
        }
        .expect("a valid request");
        let router = self.server().router.clone();
        let res = match router.oneshot(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let status = res.status().as_u16();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        (status, bytes)
    }

    /// Sends one request through the simulated network, which may lose it or its answer.
    async fn send(
        &mut self,
        who: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Check<Sent> {
        let (lose_request, lose_answer) = if self.faults {
            (
                self.chance(self.mix.lose_request),
                self.chance(self.mix.lose_answer),
            )
        } else {
            (false, false)
        };
        let shown = body.map(|b| format!(" {}", short(b))).unwrap_or_default();
        if lose_request {
            self.log(format!("{who}: {method} {path}{shown} -- lost on the way"));
            return Ok(Sent::Lost);
        }
        let answer = self.http(method, path, body).await;
        self.log(format!(
            "{who}: {method} {path}{shown} -> {} {}{}",
            answer.status,
            summary(&answer.body),
            if lose_answer { " -- answer lost" } else { "" }
        ));
        if answer.status >= 500 {
            return Err(format!(
                "{method} {path} answered {}: {}",
                answer.status, answer.body
            ));
        }
        Ok(Sent::Answered {
            answer,
            delivered: !lose_answer,
        })
    }

    async fn sweep(&mut self) -> Check {
        let now = self.now();
        let result = self.server().supervisor.sweep(now).await;
        match result {
            Ok(s) => {
                self.log(format!(
                    "supervisor sweep: leader={} expired={} activated={} fired={} repaired={}",
                    s.leader, s.expired, s.activated, s.fired, s.repaired
                ));
                self.note_sweep(s.leader, now);
                if s.leader {
                    self.check_deadlines_swept(now).await?;
                }
                if s.expired + s.activated + s.repaired + s.fired == 0 {
                    return Ok(());
                }
                // A sweep may move any unfinished job (finished ones are rechecked regularly).
                let open =
                    (0..self.model.jobs.len()).filter(|&j| self.model.jobs[j].terminal.is_none());
                let open: Vec<usize> = open.collect();
                self.touched.extend(open);
                Ok(())
            }
            Err(e) => Err(format!("supervisor sweep failed: {e}")),
        }
    }

    /// A leader's sweep that ran to its end fired every schedule due time up to `now`.
    fn note_sweep(&mut self, leader: bool, now: Timestamp) {
        if let Some(cron) = &mut self.cron {
            if leader && cron.deleted_at.is_none() {
                cron.swept_until = Some(now);
            }
        }
    }

    /// How far the end of some live lease is (give or take a millisecond), if one ends soon.
    fn edge_of_a_lease(&mut self) -> Option<u64> {
        let now = self.now();
        let ends: Vec<i64> = self
            .model
            .jobs
            .iter()
            .flat_map(|j| &j.steps)
            .flat_map(|s| &s.leases)
            .filter(|l| l.live(now))
            .map(|l| l.expires_at.as_millis() - now.as_millis())
            .filter(|ms| *ms <= 20_000)
            .collect();
        let end = *ends.choose(&mut self.rng)?;
        let ms = end + self.rng.gen_range(-1..=1);
        u64::try_from(ms).ok()
    }

    fn advance(&mut self, ms: u64) {
        self.clock.advance(Span::from_millis(ms));
        self.log(format!("clock +{ms} ms"));
    }

    // ----- the fault phase -----

    async fn step(&mut self) -> Check {
        let can_submit = self.model.jobs.len() < self.opts.jobs;
        let action = self.mix.pick(&mut self.rng);
        match action {
            Action::Submit if can_submit => self.submit_new().await,
            Action::Submit if !self.resubmits.is_empty() => self.resubmit().await,
            Action::Submit | Action::Work => self.worker_act().await,
            Action::Sweep => self.sweep().await,
            Action::Tick => {
                let ms = match self.edge_of_a_lease() {
                    // Land exactly on a lease's end, or one millisecond either side of it.
                    Some(ms) if self.chance(0.1) => {
                        self.cover("clock lands on a lease's end");
                        ms
                    }
                    _ => self.rng.gen_range(0..=1500),
                };
                self.advance(ms);
                if self.chance(0.5) {
                    self.sweep().await?;
                }
                Ok(())
            }
            Action::Jump => {
                let ms = self.rng.gen_range(3_000..=30_000);
                self.advance(ms);
                Ok(())
            }
            Action::Restart => self.restart("at a random point").await,
            Action::CrashMidSweep => self.crash_mid_sweep().await,
            Action::WorkerCrash => {
                self.worker_crash();
                Ok(())
            }
            Action::WorkerPause => {
                self.worker_pause();
                Ok(())
            }
            Action::Replay => self.replay().await,
            Action::Cancel => self.cancel_some().await,
            Action::Operate => self.operate_some().await,
            Action::Limits => self.set_limits().await,
            Action::Reschedule => self.reschedule_some().await,
            Action::ReplaceSchedule => self.replace_schedule().await,
            Action::Rerun => self.rerun_some().await,
        }
    }

    /// A sweep during which the process dies after a few of its writes.
    async fn crash_mid_sweep(&mut self) -> Check {
        let writes = self.rng.gen_range(0..4);
        self.server().crash.arm(writes);
        let now = self.now();
        let result = self.server().supervisor.sweep(now).await;
        let dead = self.server().crash.is_dead();
        match (result, dead) {
            (Ok(s), false) => {
                self.server().crash.disarm();
                self.note_sweep(s.leader, now);
                self.log(format!(
                    "sweep with a crash armed after {writes} writes finished first: expired={} activated={}",
                    s.expired, s.activated
                ));
                self.restart("right after a sweep").await
            }
            (_, true) => {
                self.cover("server died between two writes of a sweep");
                self.restart(&format!("during a sweep, after {writes} of its writes"))
                    .await
            }
            (Err(e), false) => Err(format!("supervisor sweep failed: {e}")),
        }
    }
}

fn dedup(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
}

/// An answer in one line: leases and jobs in a compact form, anything else cut short.
fn summary(v: &Value) -> String {
    let id8 = |v: &Value| {
        v.as_str()
            .map(|s| s[..s.len().min(8)].to_string())
            .unwrap_or_default()
    };
    if let Some(leases) = v["leases"].as_array() {
        let each: Vec<String> = leases
            .iter()
            .map(|l| {
                format!(
                    "{}#{} {} (job {}…, lease {}…, until {})",
                    l["step"].as_str().unwrap_or("?"),
                    l["attempt"],
                    l["kind"].as_str().unwrap_or("?"),
                    id8(&l["job_id"]),
                    id8(&l["lease_id"]),
                    l["complete_by"].as_str().unwrap_or("?"),
                )
            })
            .collect();
        return format!("leases [{}]", each.join(", "));
    }
    if let (Some(state), Some(steps)) = (v["state"].as_str(), v["steps"].as_array()) {
        let each: Vec<String> = steps
            .iter()
            .map(|s| {
                format!(
                    "{} {}#{}",
                    s["name"].as_str().unwrap_or("?"),
                    s["state"].as_str().unwrap_or("?"),
                    s["attempt"]
                )
            })
            .collect();
        return format!("job {}… {state} [{}]", id8(&v["id"]), each.join(", "));
    }
    short(v)
}

/// A JSON value in one line, cut short.
fn short(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}
