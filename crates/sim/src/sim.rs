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
use overseer_core::wire::{EventList, JobView, Lease, LeaseKind, LeaseResponse};
use overseer_core::{CompPhase, JobId, JobState, LeaseId, Span, StepState, Timestamp};
use overseer_server::supervisor::Supervisor;
use overseer_server::{api, App, Config, ManualClock};
use overseer_store::sqlite::{SqliteOptions, SqliteStore};
use overseer_store::Store;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::cron::{CronState, CRON_NAME, PATTERNS};
use crate::model::{Check, Followup, Model, ReportKind, StepShape};
use crate::store::{Crash, SimStore};
use crate::trace::Trace;
use crate::Options;

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

    async fn create_schedule(&mut self) -> Check {
        let pattern = PATTERNS[0];
        let body = CronState::body(pattern, 0, AGENTS[0]);
        let a = self.http("POST", "/v1/schedules", Some(&body)).await;
        self.log(format!(
            "operator: POST /v1/schedules {} -> {}",
            short(&body),
            a.status
        ));
        if a.status != 201 {
            return Err(format!(
                "creating the schedule answered {}: {}",
                a.status, a.body
            ));
        }
        self.cron = Some(CronState::created(pattern, &a.body)?);
        Ok(())
    }

    /// An operator replaces the schedule's definition while it runs: another pattern (or the
    /// same one with a new job body), through `PUT /v1/schedules/{name}`.
    async fn replace_schedule(&mut self) -> Check {
        let Some(cron) = self.cron.as_ref().filter(|c| c.deleted_at.is_none()) else {
            return Ok(());
        };
        let (current, version) = (cron.pattern(), cron.next_version());
        let pattern = if self.chance(0.3) {
            current
        } else {
            *PATTERNS.choose(&mut self.rng).unwrap_or(&current)
        };
        let body = CronState::body(pattern, version, AGENTS[0]);
        let path = format!("/v1/schedules/{CRON_NAME}");
        let Sent::Answered { answer, .. } =
            self.send("operator", "PUT", &path, Some(&body)).await?
        else {
            return Ok(());
        };
        if answer.status != 200 {
            return Err(format!(
                "replacing the schedule answered {}: {}",
                answer.status, answer.body
            ));
        }
        let now = self.now();
        if let Some(cron) = &mut self.cron {
            cron.replaced(pattern, version, &answer.body, now)?;
        }
        self.cover(if pattern == current {
            "operator replaced the schedule's job"
        } else {
            "operator replaced the schedule's pattern"
        });
        Ok(())
    }

    /// Every due time of each definition of the schedule fired exactly once while it was in
    /// force, up to the last complete leader sweep (see `cron`).
    fn check_cron(&self) -> Check {
        let Some(cron) = &self.cron else {
            return Ok(());
        };
        let prefix = format!("schedule/{CRON_NAME}/");
        let mut fired: Vec<i64> = self
            .model
            .jobs
            .iter()
            .filter_map(|m| m.key.strip_prefix(&prefix).and_then(|d| d.parse().ok()))
            .collect();
        fired.sort_unstable();
        cron.check_fired(&fired)
    }

    // ----- the server process -----

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

    /// No attempt outlives its deadline by more than one sweep: after a leader's sweep at `now`,
    /// every attempt whose hard end has come is over on the server (its step moved on to
    /// another attempt, or is no longer leased).
    async fn check_deadlines_swept(&mut self, now: Timestamp) -> Check {
        for (j, s, l) in self.model.overdue(now) {
            let Some(view) = self.fetch(j).await? else {
                // Removed after its retention: nothing of it runs any more.
                self.model.jobs[j].steps[s].leases[l].deadline_swept = true;
                continue;
            };
            let lease = &self.model.jobs[j].steps[s].leases[l];
            let sv = &view.steps[s];
            let leased = sv.state == StepState::Running
                || sv.comp_phase == Some(overseer_core::CompPhase::Running);
            if leased && sv.attempt == lease.attempt {
                return Err(format!(
                    "job {j} step {}: attempt {} still runs after a sweep at {now}, past its deadline {:?}: an attempt outlived its deadline by more than one sweep",
                    sv.name, lease.attempt, lease.hard_end
                ));
            }
            self.model.jobs[j].steps[s].leases[l].deadline_swept = true;
            self.cover("deadline ended an attempt");
        }
        Ok(())
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

    fn gen_job(&mut self) -> usize {
        let n = self.model.jobs.len();
        let key = format!("sim-{}-{n}", self.seed);
        let steps = self.rng.gen_range(1..=5);
        let mut specs = Vec::new();
        let mut shape = Vec::new();
        for i in 0..steps {
            let mut deps = Vec::new();
            for d in 0..i {
                if deps.len() < 2 && self.chance(0.4) {
                    deps.push(d);
                }
            }
            let agent = *AGENTS.choose(&mut self.rng).unwrap_or(&"alpha");
            let timeout_ms = self.rng.gen_range(2_000..=15_000);
            let max_attempts = if self.chance(0.05) {
                0
            } else {
                self.rng.gen_range(1..=4)
            };
            let initial = self.rng.gen_range(200..=2_000);
            let mut spec = json!({
                "name": format!("s{i}"),
                "agent": agent,
                "payload": {"n": i},
                "depends_on": deps.iter().map(|d| format!("s{d}")).collect::<Vec<_>>(),
                "timeout": format!("{timeout_ms}ms"),
                "max_attempts": max_attempts,
                "backoff": {"initial": format!("{initial}ms"), "factor": 2.0, "max": "10s"},
            });
            // Some attempts are bounded by a deadline, shorter or longer than the timeout.
            let deadline_ms = self
                .chance(0.3)
                .then(|| self.rng.gen_range(1_000..=timeout_ms * 2));
            if let Some(d) = deadline_ms {
                spec["deadline"] = json!(format!("{d}ms"));
            }
            let compensate = self.chance(self.mix.compensate);
            let undo_payload = compensate.then(|| json!({"undo": i}));
            let mut undo_max_attempts = overseer_core::spec::DEFAULT_MAX_ATTEMPTS;
            if let Some(undo_payload) = &undo_payload {
                let undo_agent = if self.chance(0.5) { UNDO_AGENT } else { agent };
                let mut c = json!({"agent": undo_agent, "payload": undo_payload});
                if self.chance(0.7) {
                    undo_max_attempts = self.rng.gen_range(1..=3);
                    c["max_attempts"] = json!(undo_max_attempts);
                }
                spec["compensate"] = c;
            }
            specs.push(spec);
            shape.push(StepShape {
                name: format!("s{i}"),
                deps,
                payload: json!({"n": i}),
                timeout_ms,
                max_attempts,
                undo_payload,
                undo_max_attempts,
                deadline_ms,
            });
        }
        let mut body = json!({
            "idempotency_key": key,
            "labels": {"sim": "1"},
            "priority": self.rng.gen_range(-3..=3),
            "steps": specs,
        });
        match self.rng.gen_range(0..24) {
            0..=5 => body["on_failure"] = json!("compensate"),
            6..=9 => body["on_failure"] = json!("hold"),
            10..=12 => body["on_failure"] = json!("fail"),
            13..=16 => {}
            _ => {
                // A whole-job retry: a few rounds, a short job backoff, failing or holding
                // after the last round.
                body["on_failure"] = json!("compensate_and_retry");
                body["job_attempts"] = json!(self.rng.gen_range(1..=3));
                let initial = self.rng.gen_range(100..=2_000);
                body["job_backoff"] =
                    json!({"initial": format!("{initial}ms"), "factor": 2.0, "max": "5s"});
                if self.chance(0.5) {
                    body["job_exhausted"] = json!(if self.chance(0.5) { "hold" } else { "fail" });
                }
            }
        }
        if self.chance(0.3) {
            // Kept only briefly once finished: the leader's prune removes it during the run.
            let ms = self.rng.gen_range(1_000..=20_000);
            body["retention"] = json!(format!("{ms}ms"));
        }
        let run_at = self.chance(0.15).then(|| {
            self.now()
                .plus(Span::from_millis(self.rng.gen_range(500..=20_000)))
        });
        if let Some(at) = run_at {
            body["run_at"] = json!(at);
        }
        let ordering_key = if self.chance(0.25) {
            Some(format!("key-{}", self.rng.gen_range(0..2)))
        } else {
            None
        };
        if let Some(k) = &ordering_key {
            body["ordering_key"] = json!(k);
        }
        self.model.add_job(key, body, ordering_key, run_at, shape)
    }

    async fn submit_new(&mut self) -> Check {
        if self.chance(0.05) {
            return self.reuse_key().await;
        }
        let room = self.opts.jobs - self.model.jobs.len();
        let n = if room >= 2 && self.chance(0.2) {
            self.rng.gen_range(2..=room.min(3))
        } else {
            1
        };
        let group: Vec<usize> = (0..n).map(|_| self.gen_job()).collect();
        self.stats.jobs += n as u64;
        self.submit_group(group).await
    }

    async fn submit_group(&mut self, group: Vec<usize>) -> Check {
        if group.len() == 1 {
            self.submit(group[0]).await
        } else {
            self.submit_batch(group).await
        }
    }

    /// A batch: all or nothing, answered with the jobs in request order.
    async fn submit_batch(&mut self, group: Vec<usize>) -> Check {
        self.cover("batch submit");
        let bodies: Vec<Value> = group
            .iter()
            .map(|&j| self.model.jobs[j].body.clone())
            .collect();
        let who = format!("client (jobs {group:?})");
        let body = json!({ "jobs": bodies });
        match self
            .send(&who, "POST", "/v1/jobs:batch", Some(&body))
            .await?
        {
            Sent::Lost => {
                if self.chance(0.8) {
                    self.resubmits.push(group);
                }
            }
            Sent::Answered { answer, delivered } => {
                let jobs = answer.body["jobs"].as_array().cloned().unwrap_or_default();
                if jobs.len() != group.len() {
                    return Err(format!(
                        "batch of {} answered {} with {} jobs: {}",
                        group.len(),
                        answer.status,
                        jobs.len(),
                        answer.body
                    ));
                }
                let created = group.iter().any(|&j| self.model.jobs[j].id.is_none());
                let expected = if created { 202 } else { 200 };
                if answer.status != expected {
                    return Err(format!(
                        "batch answered {}, expected {expected}: {}",
                        answer.status, answer.body
                    ));
                }
                for (&j, view) in group.iter().zip(&jobs) {
                    let id: JobId = serde_json::from_value(view["id"].clone())
                        .map_err(|e| format!("batch answer without an id: {e}"))?;
                    let status = if self.model.jobs[j].id.is_none() {
                        202
                    } else {
                        200
                    };
                    self.model.on_submitted(j, status, id)?;
                    self.touched.push(j);
                    if delivered {
                        self.model.jobs[j].acked = true;
                    }
                }
                if !delivered && self.chance(0.7) {
                    self.resubmits.push(group);
                }
            }
        }
        Ok(())
    }

    /// A buggy client reuses a committed job's key for another body: refused, nothing stored.
    async fn reuse_key(&mut self) -> Check {
        // Not a job that may have been removed: its key would be free again.
        let committed: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&j| {
                let m = &self.model.jobs[j];
                m.id.is_some() && !m.body.is_null() && !(m.own_retention && m.terminal.is_some())
            })
            .collect();
        let Some(&j) = committed.choose(&mut self.rng) else {
            return Ok(());
        };
        let mut body = self.model.jobs[j].body.clone();
        body["steps"][0]["payload"] = json!({"changed": true});
        let who = format!("careless client (key of job {j})");
        self.cover("key reused with another body");
        if let Sent::Answered { answer, .. } =
            self.send(&who, "POST", "/v1/jobs", Some(&body)).await?
        {
            if answer.status != 409 {
                return Err(format!(
                    "a submit reusing job {j}'s key with another body answered {}: {}",
                    answer.status, answer.body
                ));
            }
        }
        Ok(())
    }

    async fn resubmit(&mut self) -> Check {
        let i = self.rng.gen_range(0..self.resubmits.len());
        let group = self.resubmits.swap_remove(i);
        let group = self.still_wanted(group).await?;
        if group.is_empty() {
            return Ok(());
        }
        self.submit_group(group).await
    }

    /// The jobs of a lost submit a client still sends again: not those already finished and
    /// removed (the client learned their outcome; their key is free again, so a resubmit would
    /// make a new job, as the README says).
    async fn still_wanted(&mut self, group: Vec<usize>) -> Check<Vec<usize>> {
        let mut kept = Vec::new();
        for j in group {
            let m = &self.model.jobs[j];
            if m.terminal.is_some() && m.own_retention {
                self.fetch(j).await?;
            }
            if !self.model.jobs[j].pruned {
                kept.push(j);
            }
        }
        Ok(kept)
    }

    async fn submit(&mut self, j: usize) -> Check {
        let body = self.model.jobs[j].body.clone();
        let who = format!("client (job {j})");
        match self.send(&who, "POST", "/v1/jobs", Some(&body)).await? {
            Sent::Lost => {
                if self.chance(0.8) {
                    self.resubmits.push(vec![j]);
                }
            }
            Sent::Answered { answer, delivered } => {
                let id: JobId = serde_json::from_value(answer.body["id"].clone())
                    .map_err(|e| format!("submit answered {} without an id: {e}", answer.status))?;
                self.model.on_submitted(j, answer.status, id)?;
                self.touched.push(j);
                if delivered {
                    self.model.jobs[j].acked = true;
                } else if self.chance(0.7) {
                    self.resubmits.push(vec![j]);
                }
            }
        }
        Ok(())
    }

    fn worker_crash(&mut self) {
        let w = self.rng.gen_range(0..self.workers.len());
        let held = std::mem::take(&mut self.workers[w].held);
        self.workers[w].incarnation += 1;
        self.workers[w].paused_until = None;
        let name = self.workers[w].name.clone();
        self.log(format!(
            "worker {name} crashed holding {} leases; restarted empty",
            held.len()
        ));
        for h in held {
            // Some of its work was done by a copy that will report much later.
            if self.chance(0.3) {
                let replay = self.report_of(&h);
                self.keep_replay(replay);
            }
        }
    }

    fn worker_pause(&mut self) {
        let w = self.rng.gen_range(0..self.workers.len());
        let ms = self.rng.gen_range(5_000..=40_000);
        let until = self.now().plus(Span::from_millis(ms));
        let worker = &mut self.workers[w];
        worker.paused_until = Some(until);
        for h in &mut worker.held {
            // It checked its deadlines just before pausing: it will not look again.
            h.rogue = true;
        }
        let name = worker.name.clone();
        self.log(format!("worker {name} paused (GC) for {ms} ms"));
    }

    fn keep_replay(&mut self, replay: Replay) {
        if self.replays.len() >= REPLAYS_MAX {
            let i = self.rng.gen_range(0..self.replays.len());
            self.replays.swap_remove(i);
        }
        self.replays.push(replay);
    }

    /// The report an agent would send at the end of its work on `h`.
    fn report_of(&self, h: &Held) -> Replay {
        let (kind, body) = match h.plan {
            Plan::FailRetryable => (
                ReportKind::Fail,
                json!({"error": "transient trouble", "retryable": true}),
            ),
            Plan::FailFatal => (
                ReportKind::Fail,
                json!({"error": "fatal trouble", "retryable": false}),
            ),
            _ => (
                ReportKind::Complete,
                json!({"result": {"attempt": h.attempt, "lease": h.lease, "step": h.step, "undo": h.undo}}),
            ),
        };
        Replay {
            lease: h.lease,
            kind,
            body,
        }
    }

    async fn worker_act(&mut self) -> Check {
        let w = self.rng.gen_range(0..self.workers.len());
        let now = self.now();
        if let Some(until) = self.workers[w].paused_until {
            if now < until {
                return Ok(());
            }
            self.workers[w].paused_until = None;
            let name = self.workers[w].name.clone();
            self.log(format!("worker {name} wakes from its pause"));
        }
        if !self.workers[w].held.is_empty() && self.chance(0.7) {
            let i = self.rng.gen_range(0..self.workers[w].held.len());
            self.progress(w, i).await
        } else {
            self.poll(w, None).await.map(|_| ())
        }
    }

    fn worker_tag(&self, w: usize) -> String {
        let worker = &self.workers[w];
        format!("worker {}.{}", worker.name, worker.incarnation)
    }

    /// Asks for leases; `agent` None picks one of the worker's agent names.
    async fn poll(&mut self, w: usize, agent: Option<&str>) -> Check<usize> {
        let agent = match agent {
            Some(a) => a.to_string(),
            None => self.workers[w]
                .agents
                .choose(&mut self.rng)
                .map(|a| a.to_string())
                .unwrap_or_else(|| AGENTS[0].to_string()),
        };
        let max = if self.faults {
            self.rng.gen_range(1..=3)
        } else {
            10
        };
        let body = json!({"worker": self.workers[w].name, "max": max, "wait": "0s"});
        let who = self.worker_tag(w);
        let sent = self
            .send(
                &who,
                "POST",
                &format!("/v1/agents/{agent}/leases"),
                Some(&body),
            )
            .await?;
        let Sent::Answered { answer, delivered } = sent else {
            return Ok(0);
        };
        if answer.status != 200 {
            return Err(format!(
                "lease request answered {}: {}",
                answer.status, answer.body
            ));
        }
        let leases: LeaseResponse = serde_json::from_value(answer.body)
            .map_err(|e| format!("lease answer does not parse: {e}"))?;
        let now = self.now();
        let got = leases.leases.len();
        for lease in leases.leases {
            self.stats.leases += 1;
            if lease.kind == LeaseKind::Compensate {
                self.stats.undo_leases += 1;
            }
            if lease.agent != agent {
                return Err(format!(
                    "agent {agent} was handed lease {} for agent {}",
                    lease.lease_id, lease.agent
                ));
            }
            match self.model.job_of(lease.job_id) {
                None => {
                    self.discover(lease.job_id).await?;
                }
                // The model judges the lease in the round the job is in.
                Some(j) => self.sync_round(j).await?,
            }
            let worker = self.workers[w].name.clone();
            let j = self.model.on_lease(&lease, &worker, now)?;
            self.touched.push(j);
            self.check_ordering(j).await?;
            if delivered {
                let held = self.plan_for(&lease, j);
                self.workers[w].held.push(held);
            }
        }
        Ok(got)
    }

    /// A job no client submitted: only a schedule's firing may have created it.
    async fn discover(&mut self, id: JobId) -> Check<usize> {
        let view = self.get_job(id).await?;
        let key = view.idempotency_key.clone().unwrap_or_default();
        let due = key
            .strip_prefix(&format!("schedule/{CRON_NAME}/"))
            .and_then(|d| d.parse().ok())
            .map(Timestamp::from_millis);
        let (Some(cron), Some(due)) = (&self.cron, due) else {
            return Err(format!(
                "job {id} (key {key:?}) exists, but no client or schedule created it"
            ));
        };
        cron.check_job(due, &view.steps[0].payload)?;
        let names: Vec<String> = view.steps.iter().map(|s| s.name.clone()).collect();
        let shape = view
            .steps
            .iter()
            .map(|s| {
                let deps = s
                    .depends_on
                    .iter()
                    .filter_map(|d| names.iter().position(|n| n == d))
                    .collect();
                StepShape {
                    name: s.name.clone(),
                    deps,
                    payload: s.payload.clone(),
                    timeout_ms: s.timeout.as_millis(),
                    max_attempts: s.max_attempts,
                    undo_payload: s.compensate.as_ref().map(|c| c.payload.clone()),
                    undo_max_attempts: s
                        .compensate
                        .as_ref()
                        .and_then(|c| c.max_attempts)
                        .unwrap_or(overseer_core::spec::DEFAULT_MAX_ATTEMPTS),
                    deadline_ms: s.deadline.map(|d| d.as_millis()),
                }
            })
            .collect();
        let j = self
            .model
            .add_job(key.clone(), Value::Null, None, view.run_at, shape);
        self.model.on_submitted(j, 202, id)?;
        self.model.jobs[j].acked = true;
        self.log(format!("found job {j} ({key}) fired by the schedule"));
        self.cover("job fired by the schedule");
        Ok(j)
    }

    /// An operator changes an agent name's limits: a concurrency cap, none, pause or resume.
    async fn set_limits(&mut self) -> Check {
        let mut names: Vec<&str> = AGENTS.to_vec();
        names.push(UNDO_AGENT);
        let agent = *names.choose(&mut self.rng).unwrap_or(&AGENTS[0]);
        let mut limits = self.model.limits.get(agent).copied().unwrap_or_default();
        let (method, path, body) = match self.rng.gen_range(0..8) {
            0..=3 => {
                let max = self.rng.gen_range(1..=2);
                limits.max_concurrency = Some(max);
                (
                    "PUT",
                    format!("/v1/agents/{agent}/limits"),
                    Some(json!({"max_concurrency": max})),
                )
            }
            4..=5 => {
                limits.max_concurrency = None;
                ("PUT", format!("/v1/agents/{agent}/limits"), Some(json!({})))
            }
            6 => {
                limits.paused = true;
                ("POST", format!("/v1/agents/{agent}/pause"), None)
            }
            _ => {
                limits.paused = false;
                ("POST", format!("/v1/agents/{agent}/resume"), None)
            }
        };
        if let Sent::Answered { answer, .. } =
            self.send("operator", method, &path, body.as_ref()).await?
        {
            if answer.status != 200 {
                return Err(format!(
                    "{method} {path} answered {}: {}",
                    answer.status, answer.body
                ));
            }
            self.model.limits.insert(agent.to_string(), limits);
        }
        Ok(())
    }

    /// Jobs of one ordering key run one at a time, in the order they were committed.
    async fn check_ordering(&mut self, j: usize) -> Check {
        let Some(key) = self.model.jobs[j].ordering_key.clone() else {
            return Ok(());
        };
        let order = self.model.jobs[j].commit_order;
        let earlier: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&k| {
                k != j
                    && self.model.jobs[k].ordering_key.as_deref() == Some(key.as_str())
                    && self.model.jobs[k].commit_order < order
                    && self.model.jobs[k].commit_order.is_some()
            })
            .collect();
        for k in earlier {
            // A job removed after its retention had finished.
            let Some(view) = self.fetch(k).await? else {
                continue;
            };
            if !view.state.is_terminal() {
                return Err(format!(
                    "job {j} of ordering key {key} got a lease while job {k}, committed before it, is {}",
                    view.state
                ));
            }
        }
        Ok(())
    }

    fn plan_for(&mut self, lease: &Lease, j: usize) -> Held {
        let now = self.now();
        let undo = lease.kind == LeaseKind::Compensate;
        let roll = self.rng.gen_range(0..100);
        let (complete, retry, fatal, vanish) = if undo { self.mix.undo } else { self.mix.work };
        let plan = if !self.faults || roll < complete {
            Plan::Complete
        } else if roll < complete + retry {
            Plan::FailRetryable
        } else if roll < complete + retry + fatal {
            Plan::FailFatal
        } else if roll < complete + retry + fatal + vanish {
            Plan::Vanish
        } else {
            Plan::Late
        };
        let timeout = lease.timeout_ms.max(3);
        let work_ms = if self.faults {
            self.rng.gen_range(0..=timeout * 3 / 2)
        } else {
            0
        };
        let deadline = now.plus(Span::from_millis(lease.lease_ms));
        let work_until = if plan == Plan::Late {
            deadline.plus(Span::from_millis(self.rng.gen_range(0..=5_000)))
        } else {
            now.plus(Span::from_millis(work_ms))
        };
        let every = Span::from_millis(timeout / 3);
        Held {
            lease: lease.lease_id,
            job: j,
            step: lease.step.clone(),
            attempt: lease.attempt,
            undo,
            deadline,
            work_until,
            next_heartbeat: now.plus(every),
            heartbeat_every: every,
            plan,
            rogue: plan == Plan::Late,
        }
    }

    /// Moves one held lease on: report when the work is done, else heartbeat when one is due.
    async fn progress(&mut self, w: usize, i: usize) -> Check {
        let now = self.now();
        let h = self.workers[w].held[i].clone();
        if now >= h.deadline && !h.rogue {
            // A well-behaved agent stops at its deadline and reports nothing.
            self.workers[w].held.swap_remove(i);
            let who = self.worker_tag(w);
            self.log(format!(
                "{who}: gives up lease {} (job {} step {} attempt {}): deadline passed",
                h.lease, h.job, h.step, h.attempt
            ));
            if self.chance(0.2) {
                let replay = self.report_of(&h);
                self.keep_replay(replay);
            }
            return Ok(());
        }
        if now >= h.work_until {
            if h.plan == Plan::Vanish {
                self.workers[w].held.swap_remove(i);
                let who = self.worker_tag(w);
                self.log(format!(
                    "{who}: lost lease {} (job {} step {}) in a crash of its work",
                    h.lease, h.job, h.step
                ));
                return Ok(());
            }
            let replay = self.report_of(&h);
            let who = self.worker_tag(w);
            let outcome = self.report(&who, &replay).await?;
            let retry = match outcome {
                Some((_, true, _)) => false,
                // No answer: try again next time, or give up.
                _ => self.chance(0.6),
            };
            if !retry {
                if let Some(pos) = self.workers[w].held.iter().position(|x| x.lease == h.lease) {
                    self.workers[w].held.swap_remove(pos);
                }
            }
            if self.chance(0.15) {
                self.keep_replay(replay.clone());
            }
            if matches!(outcome, Some((200, _, _))) && self.chance(0.1) {
                // A duplicate right behind the first.
                self.report(&who, &replay).await?;
            }
            return Ok(());
        }
        if now >= h.next_heartbeat && !h.rogue {
            let replay = Replay {
                lease: h.lease,
                kind: ReportKind::Heartbeat,
                body: json!({"progress": {"at": now}}),
            };
            let who = self.worker_tag(w);
            let sent_at = now;
            let outcome = self.report(&who, &replay).await?;
            let Some(pos) = self.workers[w].held.iter().position(|x| x.lease == h.lease) else {
                return Ok(());
            };
            match outcome {
                Some((200, true, body)) => {
                    let held = &mut self.workers[w].held[pos];
                    if let Some(ms) = body["lease_ms"].as_u64() {
                        held.deadline = sent_at.plus(Span::from_millis(ms));
                    }
                    held.next_heartbeat = sent_at.plus(held.heartbeat_every);
                    if body["cancel"] == json!(true) {
                        let h = self.workers[w].held.swap_remove(pos);
                        if self.chance(0.5) {
                            let stop = Replay {
                                lease: h.lease,
                                kind: ReportKind::Fail,
                                body: json!({"error": "stopped: the job was cancelled", "retryable": true}),
                            };
                            self.report(&who, &stop).await?;
                        }
                    }
                }
                Some((_, true, _)) => {
                    // Refused: the lease is gone; stop.
                    self.workers[w].held.swap_remove(pos);
                }
                _ => {
                    // No answer: try again soon.
                    self.workers[w].held[pos].next_heartbeat = sent_at.plus(Span::from_millis(200));
                }
            }
        }
        Ok(())
    }

    /// Sends a report and checks the answer against the model. Returns the status and whether
    /// the agent got the answer, or None when the request was lost.
    async fn report(&mut self, who: &str, r: &Replay) -> Check<Option<(u16, bool, Value)>> {
        let path = format!("/v1/leases/{}/{}", r.lease, r.kind.path());
        // The model judges the report in the round the job is in before it is sent.
        let round_before = match self.model.lease_of(r.lease) {
            Some((j, _, _)) => {
                self.sync_round(j).await?;
                Some(self.model.jobs[j].round)
            }
            None => None,
        };
        let who = match self.model.lease_of(r.lease) {
            Some((j, s, l)) => {
                let step = &self.model.jobs[j].steps[s];
                let kind = if step.leases[l].undo { "undo" } else { "work" };
                format!(
                    "{who} (job {j} {}#{} {kind})",
                    step.name, step.leases[l].attempt
                )
            }
            None => who.to_string(),
        };
        let sent = self.send(&who, "POST", &path, Some(&r.body)).await?;
        let Sent::Answered { answer, delivered } = sent else {
            return Ok(None);
        };
        let now = self.now();
        match answer.status {
            200..=299 => self.stats.reports_ok += 1,
            409 => self.stats.reports_refused += 1,
            _ => {}
        }
        if let (404, Some((j, _, _))) = (answer.status, self.model.lease_of(r.lease)) {
            // Known only if the job was removed after its retention (checked by `fetch`).
            self.fetch(j).await?;
        }
        if let (409, Some((j, s, l))) = (answer.status, self.model.lease_of(r.lease)) {
            let step = &self.model.jobs[j].steps[s];
            let path = if step.leases[l].ended {
                "report refused: repeats an acknowledged one"
            } else if step.leases.len() > l + 1 {
                "report refused: a newer attempt exists"
            } else if now >= step.leases[l].expires_at {
                "report refused: its lease expired"
            } else {
                "report refused: live lease"
            };
            self.cover(path);
        }
        let follow =
            self.model
                .on_report(r.lease, r.kind, &r.body, answer.status, &answer.body, now)?;
        if let Some((j, _, _)) = self.model.lease_of(r.lease) {
            self.touched.push(j);
        }
        if let Followup::RefusedLiveComplete { job, step } = follow {
            self.cover("live complete refused: the job stopped wanting it");
            let Some(view) = self.fetch(job).await? else {
                return Err(format!("job {job} is gone right after a refused report"));
            };
            let s = &view.steps[step];
            let stopped = view.desired_state == overseer_core::DesiredState::Cancelled
                || view.state != JobState::Running && view.state != JobState::Blocked;
            // The refusal may have ended an unwind, and a whole-job retry started over.
            let next_round = round_before.is_some_and(|r| view.round > r);
            if !((stopped && s.state == StepState::Cancelled) || next_round) {
                return Err(format!(
                    "job {job} step {}: the complete of a live lease was refused, yet the job is {} (desired {}) and the step {}",
                    s.name, view.state, view.desired_state, s.state
                ));
            }
        }
        if r.kind == ReportKind::Heartbeat && answer.status == 200 {
            self.check_cancel_flag(r.lease, &answer.body).await?;
        }
        Ok(Some((answer.status, delivered, answer.body)))
    }

    /// A heartbeat says `cancel: true` exactly when the job no longer wants the step's work;
    /// an undo is never told to stop.
    async fn check_cancel_flag(&mut self, lease: LeaseId, answer: &Value) -> Check {
        let Some((j, s, l)) = self.model.lease_of(lease) else {
            return Ok(());
        };
        let undo = self.model.jobs[j].steps[s].leases[l].undo;
        let Some(view) = self.fetch(j).await? else {
            return Err(format!("job {j} is gone right after a heartbeat was taken"));
        };
        let wanted = view.desired_state == overseer_core::DesiredState::Succeeded
            && matches!(view.state, JobState::Running | JobState::Blocked);
        let expected = !undo && !wanted;
        if answer["cancel"].as_bool() != Some(expected) {
            return Err(format!(
                "job {j} step {}: heartbeat answered cancel={} for {} lease {lease}, but the job is {} (desired {})",
                view.steps[s].name,
                answer["cancel"],
                if undo { "an undo" } else { "a work" },
                view.state,
                view.desired_state
            ));
        }
        Ok(())
    }

    async fn replay(&mut self) -> Check {
        if self.replays.is_empty() {
            return self.worker_act().await;
        }
        let i = self.rng.gen_range(0..self.replays.len());
        let r = if self.chance(0.7) {
            self.replays.swap_remove(i)
        } else {
            self.replays[i].clone()
        };
        self.report("late agent", &r).await?;
        Ok(())
    }

    fn pick_job(&mut self, acked_only: bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&j| {
                let m = &self.model.jobs[j];
                m.id.is_some() && (m.acked || !acked_only) && m.terminal.is_none()
            })
            .collect();
        candidates.choose(&mut self.rng).copied()
    }

    async fn cancel_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        self.cancel(j).await
    }

    async fn cancel(&mut self, j: usize) -> Check {
        let id = self.model.jobs[j]
            .id
            .ok_or("cancel of a job without an id")?;
        let sent = self
            .send("operator", "POST", &format!("/v1/jobs/{id}/cancel"), None)
            .await?;
        if let Sent::Answered { answer, .. } = sent {
            self.touched.push(j);
            match answer.status {
                200 => {
                    self.stats.cancels += 1;
                    let now = self.now();
                    self.model.on_cancelled(j, now);
                }
                409 => {
                    let Some(view) = self.fetch(j).await? else {
                        return Ok(());
                    };
                    if !view.state.is_terminal() {
                        return Err(format!(
                            "cancel of job {j} refused (409) while it is {}",
                            view.state
                        ));
                    }
                }
                s => return Err(format!("cancel of job {j} answered {s}: {}", answer.body)),
            }
        }
        Ok(())
    }

    /// An operator moves a job: a pending one to a new `run_at` (earlier, later, or now) and
    /// maybe a new priority, a running one to a new priority. 409 only once it no longer
    /// applies (the job started or finished meanwhile).
    async fn reschedule_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        let id = self.model.jobs[j].id.ok_or("a picked job without an id")?;
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        let mut body = json!({"by": "sim-operator"});
        if self.chance(0.5) {
            body["priority"] = json!(self.rng.gen_range(-3..=3));
        }
        let to = if view.state == JobState::Pending
            && (self.chance(0.8) || body.get("priority").is_none())
        {
            let ms = [
                0,
                self.rng.gen_range(1..=3_000),
                self.rng.gen_range(3_000..=30_000),
            ][self.rng.gen_range(0..3)];
            let to = self.now().plus(Span::from_millis(ms));
            body["run_at"] = json!(to);
            Some(to)
        } else {
            if body.get("priority").is_none() {
                body["priority"] = json!(1);
            }
            None
        };
        let path = format!("/v1/jobs/{id}");
        let sent = self.send("operator", "PATCH", &path, Some(&body)).await?;
        // The server's answer is known here even when the client lost it.
        let status = match &sent {
            Sent::Lost => return Ok(()),
            Sent::Answered { answer, .. } => answer.status,
        };
        self.touched.push(j);
        if let (200, Some(to)) = (status, to) {
            self.model.on_rescheduled(j, to);
        }
        match status {
            200 => {
                self.cover(if to.is_some() {
                    "operator moved a pending job"
                } else {
                    "operator changed a running job's priority"
                });
                Ok(())
            }
            409 => {
                let Some(now) = self.fetch(j).await? else {
                    return Ok(());
                };
                let moved_run_at = to.is_some();
                if now.state.is_terminal() || (moved_run_at && now.state != JobState::Pending) {
                    Ok(())
                } else {
                    Err(format!(
                        "PATCH {path} refused (409) while the job is {}",
                        now.state
                    ))
                }
            }
            s => Err(format!("PATCH {path} answered {s}")),
        }
    }

    /// An operator reruns a job, from failure or not: mostly one that failed or was cancelled,
    /// now and then any job. The answer must be what the job calls for (202 once it failed or
    /// was cancelled, was not rerun yet and runs nothing; 409 otherwise, `already-rerun` when
    /// it was), and the new job must keep exactly the steps that everything acknowledged says
    /// it keeps (worked out by the model). The model then refuses any work lease of a kept step:
    /// a rerun never runs a kept step again.
    async fn rerun_some(&mut self) -> Check {
        if self.reruns >= self.opts.jobs {
            return Ok(());
        }
        // Not a job removed after its retention (a rerun of it answers 404).
        let known: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&j| self.model.jobs[j].id.is_some() && !self.model.jobs[j].pruned)
            .collect();
        let finished: Vec<usize> = known
            .iter()
            .copied()
            .filter(|&j| {
                let m = &self.model.jobs[j];
                matches!(m.terminal, Some(JobState::Failed | JobState::Cancelled))
                    && m.rerun.is_none()
            })
            .collect();
        // Most often one with steps to keep, so reruns from failure keep something.
        let keeping: Vec<usize> = finished
            .iter()
            .copied()
            .filter(|&j| self.model.expected_kept(j).contains(&true))
            .collect();
        let pick = match self.rng.gen_range(0..20) {
            0..=11 if !keeping.is_empty() => &keeping,
            0..=17 => &finished,
            _ => &known,
        };
        let Some(&j) = pick.choose(&mut self.rng) else {
            return Ok(());
        };
        let id = self.model.jobs[j].id.ok_or("a picked job without an id")?;
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        let running = view
            .steps
            .iter()
            .any(|s| s.state == StepState::Running || s.comp_phase == Some(CompPhase::Running));
        let allowed = matches!(view.state, JobState::Failed | JobState::Cancelled)
            && view.rerun_by.is_none()
            && !running;
        let from_failed = self.chance(0.75);
        let body = json!({"from_failed": from_failed, "by": "sim-operator", "reason": "seeded"});
        let path = format!("/v1/jobs/{id}/rerun");
        let Sent::Answered { answer, .. } =
            self.send("operator", "POST", &path, Some(&body)).await?
        else {
            return Ok(());
        };
        self.touched.push(j);
        match (answer.status, allowed) {
            (202, true) => {}
            (409, false) => {
                let code = answer.body["code"].as_str().unwrap_or_default();
                if view.rerun_by.is_some() && code != "already-rerun" {
                    return Err(format!("a second rerun of job {j} answered 409 {code}"));
                }
                self.cover("rerun refused");
                return Ok(());
            }
            (status, _) => {
                return Err(format!(
                    "POST {path} answered {status} while the job is {} (rerun_by {:?}, a step running: {running}): {}",
                    view.state, view.rerun_by, answer.body
                ))
            }
        }
        let made: JobView = serde_json::from_value(answer.body)
            .map_err(|e| format!("a rerun's answer does not parse: {e}"))?;
        let kept = match from_failed {
            true => self.model.expected_kept(j),
            false => vec![false; made.steps.len()],
        };
        for (s, &keep) in made.steps.iter().zip(&kept) {
            if (s.state == StepState::Succeeded) != keep {
                return Err(format!(
                    "job {j}'s rerun {}: step {} is {}, yet it {} be kept (from_failed {from_failed}): a rerun keeps exactly what succeeded, and never runs a kept step again",
                    made.id,
                    s.name,
                    s.state,
                    if keep { "should" } else { "should not" }
                ));
            }
        }
        let new = self.model.on_rerun(j, made.id, &kept)?;
        self.reruns += 1;
        self.stats.jobs += 1;
        self.touched.push(new);
        self.cover(match kept.contains(&true) {
            true => "rerun keeping steps",
            false => "rerun of every step",
        });
        Ok(())
    }

    async fn operate_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        if view.state != JobState::Blocked {
            return Ok(());
        }
        let choice = self.rng.gen_range(0..3);
        self.operate(j, &view, choice).await
    }

    /// An operator acts on a blocked job: 0 resume, 1 retry a failed step or undo, 2 skip one.
    async fn operate(&mut self, j: usize, view: &JobView, choice: u32) -> Check {
        let id = view.id;
        let failed: Vec<(usize, bool)> = view
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                if s.comp_phase == Some(CompPhase::Failed) {
                    Some((i, true))
                } else if s.state == StepState::Failed {
                    Some((i, false))
                } else {
                    None
                }
            })
            .collect();
        let target = failed.choose(&mut self.rng).copied();
        let body = json!({"by": "sim-operator", "reason": "seeded"});
        let (path, skip) = match (choice, target) {
            (1, Some((i, _))) => (
                format!("/v1/jobs/{id}/steps/{}/retry", view.steps[i].name),
                None,
            ),
            (2, Some((i, undo))) => (
                format!("/v1/jobs/{id}/steps/{}/skip", view.steps[i].name),
                Some((i, undo)),
            ),
            _ => (format!("/v1/jobs/{id}/resume"), None),
        };
        let sent = self.send("operator", "POST", &path, Some(&body)).await?;
        if let Sent::Answered { answer, .. } = sent {
            self.touched.push(j);
            match answer.status {
                200 => {
                    self.stats.operator_ok += 1;
                    self.cover(match (choice, skip) {
                        (_, Some(_)) => "operator skip",
                        (1, None) => "operator retry",
                        _ => "operator resume",
                    });
                    if let Some((i, undo)) = skip {
                        self.model.on_skipped(j, i, undo);
                    }
                }
                409 | 422 => {}
                s => return Err(format!("{path} answered {s}: {}", answer.body)),
            }
        }
        Ok(())
    }

    // ----- reading the server -----

    async fn get_job(&mut self, id: JobId) -> Check<JobView> {
        let (status, bytes) = self.http_raw("GET", &format!("/v1/jobs/{id}"), None).await;
        if status != 200 {
            let body = String::from_utf8_lossy(&bytes);
            return Err(format!("GET job {id} answered {status}: {body}"));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("job {id} does not parse: {e}"))
    }

    /// Job `j` as the server shows it, or None once it is gone: allowed only for a job the
    /// model saw finish and whose retention has passed (see `Model::on_removed`: nothing is
    /// pruned while active); any other answer than 200 or such a 404 is a violation.
    async fn fetch(&mut self, j: usize) -> Check<Option<JobView>> {
        let Some(id) = self.model.jobs[j].id else {
            return Ok(None);
        };
        if self.model.jobs[j].pruned {
            return Ok(None);
        }
        let (status, bytes) = self.http_raw("GET", &format!("/v1/jobs/{id}"), None).await;
        match status {
            200 => {
                let view: JobView = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("job {id} does not parse: {e}"))?;
                self.model.observe_end(j, &view);
                Ok(Some(view))
            }
            404 => {
                let now = self.now();
                let acked = if self.model.jobs[j].acked {
                    "acknowledged"
                } else {
                    "committed"
                };
                self.model
                    .on_removed(j, now)
                    .map_err(|e| format!("{acked} {e}"))?;
                self.stats.pruned += 1;
                self.log(format!("job {j} was removed after its retention"));
                self.cover("a finished job was removed after its retention");
                Ok(None)
            }
            _ => {
                let body = String::from_utf8_lossy(&bytes);
                Err(format!("GET job {id} answered {status}: {body}"))
            }
        }
    }

    /// Brings the model of a whole-job retry to the round the server shows (checking each round
    /// that ended, see `Model::on_round`); nothing for other jobs.
    async fn sync_round(&mut self, j: usize) -> Check {
        if !self.model.jobs[j].retry {
            return Ok(());
        }
        if let Some(view) = self.fetch(j).await? {
            if view.round > self.model.jobs[j].round {
                self.cover("a whole-job retry started a new round");
            }
            self.model.on_round(j, view.round)?;
        }
        Ok(())
    }

    async fn check_job(&mut self, j: usize, settled: bool) -> Check {
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        let id = view.id;
        let (status, bytes) = self
            .http_raw("GET", &format!("/v1/jobs/{id}/events"), None)
            .await;
        if status != 200 {
            let body = String::from_utf8_lossy(&bytes);
            return Err(format!("events of job {id} answered {status}: {body}"));
        }
        let events: EventList =
            serde_json::from_slice(&bytes).map_err(|e| format!("events do not parse: {e}"))?;
        if view.state == JobState::Blocked {
            self.stats.blocked_seen += 1;
            let held_last_round = view.job_attempts == Some(view.round)
                && view.job_exhausted == Some(overseer_core::spec::JobExhausted::Hold)
                && view.steps.iter().all(|s| s.comp_phase.is_none());
            if held_last_round {
                self.cover("a whole-job retry held in its last round");
            }
        }
        if view.round > self.model.jobs[j].round {
            self.cover("a whole-job retry started a new round");
        }
        if settled {
            self.stats.compensated_steps += view.compensated.len() as u64;
        }
        self.model.check_view(j, &view, &events.events, settled)
    }

    async fn check_all(&mut self, settled: bool) -> Check {
        for j in 0..self.model.jobs.len() {
            self.check_job(j, settled).await?;
        }
        Ok(())
    }

    // ----- the drain and the end -----

    /// Faults stop: agents are healthy and prompt, the operator resumes blocked jobs, time moves
    /// on with sweeps. Every job must finish.
    async fn drain(&mut self) -> Check {
        self.faults = false;
        self.log("faults stop: draining".into());
        for w in &mut self.workers {
            w.held.clear();
            w.paused_until = None;
        }
        self.replays.clear();
        let mut names: Vec<&str> = AGENTS.to_vec();
        names.push(UNDO_AGENT);
        for agent in names {
            for (method, path, body) in [
                ("PUT", format!("/v1/agents/{agent}/limits"), Some(json!({}))),
                ("POST", format!("/v1/agents/{agent}/resume"), None),
            ] {
                if let Sent::Answered { answer, .. } =
                    self.send("operator", method, &path, body.as_ref()).await?
                {
                    if answer.status != 200 {
                        return Err(format!("{method} {path} answered {}", answer.status));
                    }
                }
            }
        }
        self.model.limits.clear();
        if self.cron.is_some() {
            let path = format!("/v1/schedules/{CRON_NAME}");
            if let Sent::Answered { answer, .. } =
                self.send("operator", "DELETE", &path, None).await?
            {
                if answer.status != 204 {
                    return Err(format!("deleting the schedule answered {}", answer.status));
                }
            }
            let now = self.now();
            if let Some(c) = &mut self.cron {
                c.deleted_at = Some(now);
            }
        }
        // Clients that never got an answer try once more, so every job they meant is known.
        let pending = std::mem::take(&mut self.resubmits);
        for group in pending {
            let group = self.still_wanted(group).await?;
            if !group.is_empty() {
                self.submit_group(group).await?;
            }
        }
        for round in 0..DRAIN_ROUNDS {
            self.stats.drain_rounds = round as u64 + 1;
            self.touched.clear();
            let mut agents: Vec<&str> = AGENTS.to_vec();
            agents.push(UNDO_AGENT);
            for agent in agents {
                loop {
                    let got = self.poll(0, Some(agent)).await?;
                    let held = std::mem::take(&mut self.workers[0].held);
                    for h in held {
                        let r = self.report_of(&h);
                        self.report("drainer", &r).await?;
                    }
                    if got == 0 {
                        break;
                    }
                }
            }
            let mut unfinished = 0;
            for j in 0..self.model.jobs.len() {
                let Some(view) = self.fetch(j).await? else {
                    continue;
                };
                // A job that failed at once may still have a step running: it is cancelled
                // when its report comes or its lease expires.
                if view.state.is_terminal() && view.steps.iter().all(|s| s.state.is_settled()) {
                    continue;
                }
                unfinished += 1;
                if view.state == JobState::Blocked {
                    // Resume first; if that does not unblock it, skip what failed.
                    let choice = if round % 2 == 0 { 0 } else { 2 };
                    self.operate(j, &view, choice).await?;
                }
            }
            for j in dedup(std::mem::take(&mut self.touched)) {
                self.check_job(j, false).await?;
            }
            if unfinished == 0 {
                return Ok(());
            }
            let ms = self.rng.gen_range(500..=5_000);
            self.advance(ms);
            self.sweep().await?;
        }
        Ok(())
    }

    async fn final_checks(&mut self) -> Check {
        self.check_all(true).await?;
        // Exactly the jobs the server acknowledged exist, each once.
        let a = self.http("GET", "/v1/jobs?limit=500", None).await;
        if a.status != 200 {
            return Err(format!("listing jobs answered {}: {}", a.status, a.body));
        }
        let listed = a.body["jobs"].as_array().cloned().unwrap_or_default();
        let mut ids: Vec<String> = listed
            .iter()
            .filter_map(|j| j["id"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        let mut expected: Vec<String> = self
            .model
            .jobs
            .iter()
            .filter(|m| !m.pruned)
            .filter_map(|m| m.id.map(|id| id.to_string()))
            .collect();
        expected.sort();
        if ids != expected {
            return Err(format!(
                "the store holds jobs {ids:?}, but the server acknowledged {expected:?}"
            ));
        }
        for m in &self.model.jobs {
            match m.terminal {
                Some(JobState::Succeeded) => self.stats.succeeded += 1,
                Some(JobState::Failed) => self.stats.failed += 1,
                Some(JobState::Cancelled) => self.stats.cancelled += 1,
                _ => {}
            }
        }
        self.check_cron()?;
        // Listing by state agrees with each job's own state.
        for state in [JobState::Succeeded, JobState::Failed, JobState::Cancelled] {
            let a = self
                .http("GET", &format!("/v1/jobs?state={state}&limit=500"), None)
                .await;
            let mut listed: Vec<String> = a.body["jobs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|j| j["id"].as_str().map(str::to_string))
                .collect();
            listed.sort();
            let mut expected: Vec<String> = self
                .model
                .jobs
                .iter()
                .filter(|m| m.terminal == Some(state) && !m.pruned)
                .filter_map(|m| m.id.map(|id| id.to_string()))
                .collect();
            expected.sort();
            if listed != expected {
                return Err(format!(
                    "GET /v1/jobs?state={state} lists {listed:?}, but these jobs are {state}: {expected:?}"
                ));
            }
        }
        // Nothing is left ready or running, and every ordering key is free.
        let a = self.http("GET", "/v1/agents", None).await;
        for agent in a.body["agents"].as_array().cloned().unwrap_or_default() {
            if agent["ready"] != json!(0) || agent["running"] != json!(0) {
                return Err(format!("after the drain, GET /v1/agents shows {agent}"));
            }
        }
        for key in ["key-0", "key-1"] {
            let a = self
                .http("GET", &format!("/v1/ordering-keys/{key}"), None)
                .await;
            if a.status != 200 || !a.body["head"].is_null() || a.body["waiting"] != json!(0) {
                return Err(format!(
                    "after the drain, ordering key {key} answers {} {}",
                    a.status, a.body
                ));
            }
        }
        self.log("final checks passed".into());
        Ok(())
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
