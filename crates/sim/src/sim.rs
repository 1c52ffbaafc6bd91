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

use crate::model::{Check, Followup, Model, ReportKind};
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
}

/// One server process: its app, router and supervisor over one open store.
struct Server {
    app: App,
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
    resubmits: Vec<usize>,
    faults: bool,
    /// Jobs touched by the current action, to check after it.
    touched: Vec<usize>,
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
        Sim {
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

    fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p)
    }

    /// The whole run: faults for `opts.actions` actions, then a drain without faults, then the
    /// final checks.
    pub async fn run(&mut self) -> Check {
        self.log(format!(
            "seed {} start: {} workers, {} jobs, {} actions",
            self.seed,
            self.workers.len(),
            self.opts.jobs,
            self.opts.actions
        ));
        self.open_server()?;
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
            .with_repair_batch(config.repair_batch);
        let router = api::router(app.clone());
        self.server = Some(Server {
            app,
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
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer { status, body }
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
            (self.chance(0.04), self.chance(0.05))
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
            short(&answer.body),
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
                    "supervisor sweep: leader={} expired={} activated={} repaired={}",
                    s.leader, s.expired, s.activated, s.repaired
                ));
                // A sweep may move any job.
                self.touched.extend(0..self.model.jobs.len());
                Ok(())
            }
            Err(e) => Err(format!("supervisor sweep failed: {e}")),
        }
    }

    fn advance(&mut self, ms: u64) {
        self.clock.advance(Span::from_millis(ms));
        self.log(format!("clock +{ms} ms"));
    }

    // ----- the fault phase -----

    async fn step(&mut self) -> Check {
        let submitted = self.model.jobs.len();
        let can_submit = submitted < self.opts.jobs;
        let roll = self.rng.gen_range(0..100);
        match roll {
            0..=7 if can_submit => self.submit_new().await,
            0..=7 => self.worker_act().await,
            8..=9 if !self.resubmits.is_empty() => self.resubmit().await,
            8..=47 => self.worker_act().await,
            48..=57 => self.sweep().await,
            58..=72 => {
                let ms = self.rng.gen_range(0..=1500);
                self.advance(ms);
                if self.chance(0.5) {
                    self.sweep().await?;
                }
                Ok(())
            }
            73..=74 => {
                let ms = self.rng.gen_range(5_000..=60_000);
                self.advance(ms);
                Ok(())
            }
            75..=76 => self.restart("at a random point").await,
            77 => self.crash_mid_sweep().await,
            78..=79 => {
                self.worker_crash();
                Ok(())
            }
            80..=81 => {
                self.worker_pause();
                Ok(())
            }
            82..=87 => self.replay().await,
            88..=89 => self.cancel_some().await,
            90..=95 => self.operate_some().await,
            _ => self.worker_act().await,
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
                self.log(format!(
                    "sweep with a crash armed after {writes} writes finished first: expired={} activated={}",
                    s.expired, s.activated
                ));
                self.restart("right after a sweep").await
            }
            (_, true) => {
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
            let compensate = self.chance(0.45);
            if compensate {
                let undo_agent = if self.chance(0.5) { UNDO_AGENT } else { agent };
                let mut c = json!({"agent": undo_agent, "payload": {"undo": i}});
                if self.chance(0.7) {
                    c["max_attempts"] = json!(self.rng.gen_range(1..=3));
                }
                spec["compensate"] = c;
            }
            specs.push(spec);
            shape.push((format!("s{i}"), deps, compensate));
        }
        let mut body = json!({
            "idempotency_key": key,
            "labels": {"sim": "1"},
            "priority": self.rng.gen_range(-3..=3),
            "steps": specs,
        });
        match self.rng.gen_range(0..4) {
            0 => body["on_failure"] = json!("compensate"),
            1 => body["on_failure"] = json!("hold"),
            2 => body["on_failure"] = json!("fail"),
            _ => {}
        }
        if self.chance(0.15) {
            let at = self
                .now()
                .plus(Span::from_millis(self.rng.gen_range(500..=20_000)));
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
        self.model.add_job(key, body, ordering_key, shape)
    }

    async fn submit_new(&mut self) -> Check {
        let j = self.gen_job();
        self.stats.jobs += 1;
        self.submit(j).await
    }

    async fn resubmit(&mut self) -> Check {
        let i = self.rng.gen_range(0..self.resubmits.len());
        let j = self.resubmits.swap_remove(i);
        self.submit(j).await
    }

    async fn submit(&mut self, j: usize) -> Check {
        let body = self.model.jobs[j].body.clone();
        let who = format!("client (job {j})");
        match self.send(&who, "POST", "/v1/jobs", Some(&body)).await? {
            Sent::Lost => {
                if self.chance(0.8) {
                    self.resubmits.push(j);
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
                    self.resubmits.push(j);
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
            if lease.agent != agent {
                return Err(format!(
                    "agent {agent} was handed lease {} for agent {}",
                    lease.lease_id, lease.agent
                ));
            }
            let j = self.model.on_lease(&lease, now)?;
            self.touched.push(j);
            self.check_ordering(j).await?;
            if delivered {
                let held = self.plan_for(&lease, j);
                self.workers[w].held.push(held);
            }
        }
        Ok(got)
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
            let Some(id) = self.model.jobs[k].id else {
                continue;
            };
            let view = self.get_job(id).await?;
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
        let plan = if !self.faults {
            Plan::Complete
        } else {
            match roll {
                0..=61 => Plan::Complete,
                62..=79 => Plan::FailRetryable,
                80..=83 => Plan::FailFatal,
                84..=91 => Plan::Vanish,
                _ => Plan::Late,
            }
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
        let sent = self.send(who, "POST", &path, Some(&r.body)).await?;
        let Sent::Answered { answer, delivered } = sent else {
            return Ok(None);
        };
        let now = self.now();
        let follow = self
            .model
            .on_report(r.lease, r.kind, answer.status, &answer.body, now)?;
        if let Some((j, _, _)) = self.model.lease_of(r.lease) {
            self.touched.push(j);
        }
        if let Followup::RefusedLiveComplete { job, step } = follow {
            let id = self.model.jobs[job]
                .id
                .ok_or("a leased job without an id")?;
            let view = self.get_job(id).await?;
            let s = &view.steps[step];
            let stopped = view.desired_state == overseer_core::DesiredState::Cancelled
                || view.state != JobState::Running && view.state != JobState::Blocked;
            if !(stopped && s.state == StepState::Cancelled) {
                return Err(format!(
                    "job {job} step {}: the complete of a live lease was refused, yet the job is {} (desired {}) and the step {}",
                    s.name, view.state, view.desired_state, s.state
                ));
            }
        }
        Ok(Some((answer.status, delivered, answer.body)))
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
                    let now = self.now();
                    self.model.on_cancelled(j, now);
                }
                409 => {
                    let view = self.get_job(id).await?;
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

    async fn operate_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        let id = self.model.jobs[j].id.ok_or("a picked job without an id")?;
        let view = self.get_job(id).await?;
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
        let a = self.http("GET", &format!("/v1/jobs/{id}"), None).await;
        if a.status != 200 {
            return Err(format!("GET job {id} answered {}: {}", a.status, a.body));
        }
        serde_json::from_value(a.body).map_err(|e| format!("job {id} does not parse: {e}"))
    }

    async fn check_job(&mut self, j: usize, settled: bool) -> Check {
        let Some(id) = self.model.jobs[j].id else {
            return Ok(());
        };
        let view = self.get_job(id).await.map_err(|e| {
            let acked = if self.model.jobs[j].acked {
                "acknowledged "
            } else {
                "committed "
            };
            format!("{acked}job {j} is lost: {e}")
        })?;
        let a = self
            .http("GET", &format!("/v1/jobs/{id}/events"), None)
            .await;
        if a.status != 200 {
            return Err(format!(
                "events of job {id} answered {}: {}",
                a.status, a.body
            ));
        }
        let events: EventList =
            serde_json::from_value(a.body).map_err(|e| format!("events do not parse: {e}"))?;
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
        // Clients that never got an answer try once more, so every job they meant is known.
        let pending = std::mem::take(&mut self.resubmits);
        for j in dedup(pending) {
            self.submit(j).await?;
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
                let Some(id) = self.model.jobs[j].id else {
                    continue;
                };
                let view = self.get_job(id).await?;
                if view.state.is_terminal() {
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
        self.log("final checks passed".into());
        Ok(())
    }
}

fn dedup(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v.dedup();
    v
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
