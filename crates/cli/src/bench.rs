//! `overseer bench`: a benchmark anyone can run, with real agents over real HTTP.
//!
//! By default every scenario gets a fresh server started *inside this process* on a temp SQLite
//! file and bound to `127.0.0.1:0`; `--db URL` runs one in-process server on that store for all
//! scenarios, and `--server URL` targets a server that is already running. Clients and agents are
//! always the Rust SDK (`overseer_agent::{Client, Worker}`) talking HTTP on loopback, in this
//! process too. So in-process, the reported RSS and the CPU are shared by server, store, agents
//! and clients: the numbers are what one machine does end to end, not the server alone.
//!
//! Scenarios (see `BENCHMARKS.md` for what each measures and the reference numbers):
//! `submit`, `drain`, `latency`, `latency_loaded`, `cross_node`, `dag`, `timers`, `recovery`,
//! `ordered` (the hand-over between consecutive jobs of one ordering key), `memory`,
//! `overload` (a normal client's latency beside long-polls, slowloris and idle connections),
//! `store` (the store alone, no HTTP: see `bench/store.rs`).
//!
//! - `latency_loaded` is `latency` while a steady background load (`--load-rate` one-step no-op
//!   jobs per second, on an agent of its own) is drained by `--workers` × `--concurrency`; the
//!   markers still go to idle long-polling workers of their own agent. It reports the background
//!   rate it achieved next to the markers' latency.
//! - `cross_node` is `latency` across two nodes of one PostgreSQL store (`--db postgres://…`):
//!   it starts a second in-process node on that store, puts the idle long-polling workers on it
//!   and submits the markers to the first, so each lease needs the other node's `LISTEN/NOTIFY`
//!   wake-up. On SQLite and with `--server` it is skipped: nodes on one SQLite file signal each
//!   other through nothing but polling, and a remote server's store is not ours to open.
//! - `memory` is the exception to "everything in one process": it spawns this executable as
//!   `overseer server` (on a temp SQLite file, or on `--db`) and reads *that* process's resident
//!   memory, idle and with `--pending` delayed jobs. With `--server` it is skipped, since a remote
//!   process's memory cannot be read.
//! - `steady` also spawns a server process, with `--retention` for finished jobs, and submits
//!   `--steady-rate` jobs per second for `--duration`, reading the store's size, the server's
//!   memory, the jobs removed and marker latency every `--sample-every`. It is long (30 minutes by
//!   default), so it runs only when named.

mod latency;
mod memory;
mod overload;
mod scenarios;
mod steady;
mod store;
mod timers;

use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use overseer_agent::Client;
use overseer_core::Span;
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Jobs per scenario. Default per scenario: submit 20000, drain 40000, latency,
    /// latency_loaded and cross_node 2000 markers (one every 5 ms), dag 5000 (20000 steps); the
    /// submit rates of `timers` use the `submit` count.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Concurrent submitting clients.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Jobs per `POST /v1/jobs:batch` in `submit_batch` (1 skips it; at most 1000, the server's
    /// default `limits.jobs_per_batch`).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Ask batch submits for whole jobs in the answer instead of `Prefer: return=minimal`
    /// (each job's id and state), to measure what building and decoding the full answer costs.
    #[arg(long)]
    pub full_answers: bool,
    /// SDK workers (each one `Worker`, with its own long-poll and HTTP connection pool).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Attempts each worker runs at once; it asks for up to this many leases per call (≤ 100).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Run one in-process server on this store for every scenario, e.g. sqlite://bench.db
    /// (default: a fresh temp SQLite file per scenario).
    #[arg(long, conflicts_with = "server")]
    pub db: Option<String>,
    /// Benchmark a server that is already running instead of starting one.
    #[arg(long)]
    pub server: Option<String>,
    /// A bearer token for `--server`.
    #[arg(long, env = "OVERSEER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A scenario to run; repeat for several. Default: all, in the order listed.
    #[arg(long = "scenario", value_enum)]
    pub scenarios: Vec<Scenario>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Format,
    /// `timers`: delayed jobs preloaded 30 days ahead before measuring.
    #[arg(long, default_value_t = 100_000)]
    pub preload: usize,
    /// `timers`: jobs due 2 s after they are submitted, whose lateness is measured.
    #[arg(long, default_value_t = 200)]
    pub due: usize,
    /// `latency_loaded`: background jobs submitted per second while the markers are measured
    /// (about half of the measured SQLite drain rate on a 2-core machine).
    #[arg(long, default_value_t = 5000)]
    pub load_rate: usize,
    /// `memory`: delayed jobs (30 days ahead) pending in the server when its memory is read
    /// again. The performance issue's target is 1000000 within 250 MB.
    #[arg(long, default_value_t = 100_000)]
    pub pending: usize,
    /// `recovery`: steps whose agent is killed mid-step, recovered concurrently.
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
    /// `recovery`: the step timeout (how long a silent lease lives).
    #[arg(long, default_value = "1s")]
    pub step_timeout: Span,
    /// `drain` and `dag`: how long each handler works (a sleep) before it succeeds; the default
    /// no-op handlers measure the scheduler alone, e.g. `--work 10ms` a workload of short calls.
    #[arg(long, default_value = "0s")]
    pub work: Span,
    /// The in-process server's supervisor sweep interval.
    #[arg(long, default_value = "1s")]
    pub sweep_interval: Span,
    /// Give up on a scenario that has not finished after this long.
    #[arg(long, default_value = "5m")]
    pub timeout: Span,
    #[command(flatten)]
    pub steady: SteadyArgs,
}

/// The `steady` scenario's settings.
#[derive(Args, Clone, Copy, Debug)]
pub struct SteadyArgs {
    /// `steady`: one-step jobs submitted per second.
    #[arg(long = "steady-rate", default_value_t = 2000)]
    pub rate: usize,
    /// `steady`: how long the load lasts.
    #[arg(long, default_value = "30m")]
    pub duration: Span,
    /// `steady`: how long the server keeps finished jobs (its `[retention]` settings).
    #[arg(long, default_value = "1m")]
    pub retention: Span,
    /// `steady`: time between readings.
    #[arg(long, default_value = "30s")]
    pub sample_every: Span,
    /// `steady`: jobs run to the end before the load, which then fall due for removal together.
    #[arg(long, default_value_t = 0)]
    pub backlog: usize,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    Submit,
    Drain,
    Latency,
    #[value(name = "latency_loaded", alias = "latency-loaded")]
    LatencyLoaded,
    #[value(name = "cross_node", alias = "cross-node")]
    CrossNode,
    Dag,
    Timers,
    Recovery,
    Ordered,
    Fanout,
    Memory,
    Overload,
    /// The store alone: submits through `Store::jobs_submit`, claims and batched reports without
    /// HTTP or agents.
    Store,
    /// Not part of the default run (it lasts `--duration`): name it with `--scenario steady`.
    Steady,
}

impl Scenario {
    const ALL: [Scenario; 13] = [
        Scenario::Submit,
        Scenario::Drain,
        Scenario::Latency,
        Scenario::LatencyLoaded,
        Scenario::CrossNode,
        Scenario::Dag,
        Scenario::Timers,
        Scenario::Recovery,
        Scenario::Ordered,
        Scenario::Fanout,
        Scenario::Memory,
        Scenario::Overload,
        Scenario::Store,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Submit => "submit",
            Scenario::Drain => "drain",
            Scenario::Latency => "latency",
            Scenario::LatencyLoaded => "latency_loaded",
            Scenario::CrossNode => "cross_node",
            Scenario::Dag => "dag",
            Scenario::Timers => "timers",
            Scenario::Recovery => "recovery",
            Scenario::Ordered => "ordered",
            Scenario::Fanout => "fanout",
            Scenario::Overload => "overload",
            Scenario::Memory => "memory",
            Scenario::Store => "store",
            Scenario::Steady => "steady",
        }
    }

    /// Whether the scenario needs a fresh in-process SQLite server when neither `--db` nor
    /// `--server` is given: `memory` starts a server process of its own, and `cross_node` is
    /// skipped on SQLite, so starting one for it would be wasted.
    fn uses_server(self) -> bool {
        !matches!(
            self,
            Scenario::Memory
                | Scenario::CrossNode
                | Scenario::Overload
                | Scenario::Steady
                | Scenario::Store
        )
    }
}

/// How results are printed: an aligned table, or one JSON object per line.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// One result line. Fields that do not apply to a scenario are `null`.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub scenario: String,
    pub backend: String,
    /// Jobs (or, for `timers_lateness` and `recovery`, steps) measured.
    pub jobs: usize,
    pub seconds: f64,
    /// Jobs per second.
    pub per_s: Option<f64>,
    /// Steps per second, where jobs have steps worth counting (`drain`, `dag`).
    pub steps_per_s: Option<f64>,
    /// `latency_loaded`: background jobs per second the server accepted while the markers ran.
    pub load_per_s: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Only with at least 1000 samples; below that it would just be the maximum.
    pub p999_ms: Option<f64>,
    /// Peak resident memory of this process during the scenario (VmHWM, else VmRSS); for
    /// `memory`, the server process's VmRSS with the pending jobs.
    pub rss_mb: Option<f64>,
    /// `memory`: the server process's VmRSS when idle and empty.
    pub rss_idle_mb: Option<f64>,
    /// What the latency columns measure and anything else needed to read the line.
    pub note: Option<String>,
}

impl Row {
    fn new(scenario: &str, jobs: usize, seconds: f64) -> Row {
        Row {
            scenario: scenario.to_string(),
            backend: String::new(),
            jobs,
            seconds,
            per_s: None,
            steps_per_s: None,
            load_per_s: None,
            p50_ms: None,
            p99_ms: None,
            p999_ms: None,
            rss_mb: None,
            rss_idle_mb: None,
            note: None,
        }
    }

    fn rate(mut self, count: usize) -> Row {
        self.per_s = rate(count, self.seconds);
        self
    }

    fn steps(mut self, count: usize) -> Row {
        self.steps_per_s = rate(count, self.seconds);
        self
    }

    fn latencies(mut self, samples: Vec<f64>) -> Row {
        let p = Percentiles::of(samples);
        self.p50_ms = p.p50;
        self.p99_ms = p.p99;
        self.p999_ms = p.p999;
        self
    }

    fn note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

fn rate(count: usize, seconds: f64) -> Option<f64> {
    (seconds > 0.0).then(|| count as f64 / seconds)
}

/// Nearest-rank percentiles of a sample, in the sample's unit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

impl Percentiles {
    pub fn of(mut samples: Vec<f64>) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let rank = (q * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1]
        };
        Percentiles {
            p50: Some(at(0.50)),
            p95: Some(at(0.95)),
            p99: Some(at(0.99)),
            p999: (samples.len() >= 1000).then(|| at(0.999)),
        }
    }
}

/// What every scenario is given: where the server is and the settings.
#[derive(Clone)]
pub struct Ctx {
    /// The server's base URL (empty for `memory`, which starts its own, and for `cross_node` on
    /// a fresh SQLite store, where it is skipped).
    pub url: String,
    /// Whether the server was started elsewhere (`--server`).
    pub remote: bool,
    /// The store given with `--db`, if any.
    pub db: Option<String>,
    pub token: Option<String>,
    /// A suffix that keeps this run's agent names apart from anything else on the server.
    pub run: String,
    pub clients: usize,
    pub batch: usize,
    /// See `--full-answers`.
    pub full_answers: bool,
    pub workers: usize,
    pub concurrency: usize,
    pub jobs: Option<usize>,
    pub preload: usize,
    pub due: usize,
    pub kills: usize,
    pub load_rate: usize,
    pub pending: usize,
    pub step_timeout: Span,
    /// See `--work`.
    pub work: Duration,
    /// The server's sweep interval, when this process started the server.
    pub sweep_interval: Option<Span>,
    pub timeout: Duration,
    pub steady: SteadyArgs,
}

impl Ctx {
    pub fn client(&self) -> anyhow::Result<Client> {
        Client::new(&self.url, self.token.clone()).context("cannot build the HTTP client")
    }

    /// An agent name unique to this run and scenario.
    pub fn agent(&self, scenario: &str) -> String {
        format!("bench-{scenario}-{}", self.run)
    }
}

/// Counts events and wakes one waiter when a target count is reached.
pub struct Countdown {
    target: usize,
    seen: AtomicUsize,
    done: Notify,
}

impl Countdown {
    pub fn new(target: usize) -> Countdown {
        Countdown {
            target,
            seen: AtomicUsize::new(0),
            done: Notify::new(),
        }
    }

    /// Counts one event; answers how many were seen, this one included.
    pub fn hit(&self) -> usize {
        let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.target {
            // Stores a permit when nobody waits yet, so the wake-up is never lost.
            self.done.notify_one();
        }
        n
    }

    pub fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }

    /// Waits until the target is reached, or fails after `timeout` saying how far it got.
    pub async fn wait(&self, timeout: Duration, what: &str) -> anyhow::Result<()> {
        if self.seen() >= self.target {
            return Ok(());
        }
        match tokio::time::timeout(timeout, self.done.notified()).await {
            Ok(()) => Ok(()),
            Err(_) => anyhow::bail!(
                "{what}: only {} of {} after {:?}",
                self.seen(),
                self.target,
                timeout
            ),
        }
    }
}

/// A server this process runs for the benchmark.
struct LocalServer {
    url: String,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Removed when the server is dropped.
    _dir: Option<tempfile::TempDir>,
}

impl LocalServer {
    async fn start(
        db: String,
        sweep_interval: Span,
        dir: Option<tempfile::TempDir>,
    ) -> anyhow::Result<LocalServer> {
        let config = overseer_server::Config {
            db,
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            sweep_interval,
            ..overseer_server::Config::default()
        };
        config.validate()?;
        let store = overseer_server::open_store(&config)
            .await
            .with_context(|| format!("cannot open store {}", config.db))?;
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task =
            tokio::spawn(
                async move { overseer_server::serve(store, &config, listener, token).await },
            );
        Ok(LocalServer {
            url,
            shutdown,
            task,
            _dir: dir,
        })
    }

    async fn stop(self) {
        self.shutdown.cancel();
        match tokio::time::timeout(Duration::from_secs(10), self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "the bench server stopped with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "the bench server task failed"),
            Err(_) => tracing::warn!("the bench server did not stop within 10s"),
        }
    }
}

async fn fresh_server(sweep_interval: Span) -> anyhow::Result<LocalServer> {
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-")
        .tempdir()
        .context("cannot create a temp directory")?;
    let db = format!("sqlite://{}", dir.path().join("bench.db").display());
    LocalServer::start(db, sweep_interval, Some(dir)).await
}

/// Forgets the peak RSS so far (Linux: `5` into `clear_refs` resets VmHWM), so each scenario
/// reports its own peak. Answers whether that worked.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident memory in MB (VmHWM), or the current one (VmRSS) when no peak is kept.
fn rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status_mb(&status, "VmHWM:").or_else(|| status_mb(&status, "VmRSS:"))
}

/// A memory field of a `/proc/<pid>/status` text (`VmRSS:`, `VmHWM:`…) in MB.
fn status_mb(status: &str, field: &str) -> Option<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    // Quiet by default: the results are the output; RUST_LOG=info shows the server's logs.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(
            std::env::var_os("NO_COLOR").is_none()
                && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )
        .try_init();
}

fn check(args: &BenchArgs) -> anyhow::Result<()> {
    let positive = [
        ("--clients", args.clients),
        ("--batch", args.batch),
        ("--workers", args.workers),
        ("--concurrency", args.concurrency),
        ("--due", args.due),
        ("--kills", args.kills),
        ("--load-rate", args.load_rate),
        ("--pending", args.pending),
        ("--steady-rate", args.steady.rate),
    ];
    for (flag, value) in positive {
        anyhow::ensure!(value > 0, "{flag} must be at least 1");
    }
    anyhow::ensure!(args.jobs != Some(0), "--jobs must be at least 1");
    anyhow::ensure!(
        args.steady.sample_every >= Span::from_secs(2),
        "--sample-every must be at least 2s (each reading runs a second of marker jobs)"
    );
    anyhow::ensure!(
        args.batch <= 1000,
        "--batch must be at most 1000 (the server's default jobs_per_batch)"
    );
    anyhow::ensure!(
        args.kills <= 100,
        "--kills must be at most 100 (leases one call may take)"
    );
    anyhow::ensure!(
        args.step_timeout >= Span::from_millis(100),
        "--step-timeout must be at least 100ms"
    );
    anyhow::ensure!(
        args.work <= Span::from_secs(60),
        "--work must be at most 60s"
    );
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    check(&args)?;
    let mut chosen: Vec<Scenario> = Vec::new();
    for s in if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    } {
        if !chosen.contains(&s) {
            chosen.push(s);
        }
    }
    let shared = match (&args.server, &args.db) {
        (Some(_), _) => None,
        (None, Some(db)) => Some(LocalServer::start(db.clone(), args.sweep_interval, None).await?),
        (None, None) => None,
    };
    let backend = match (&args.server, &args.db) {
        (Some(url), _) => format!("remote {url}"),
        (None, Some(db)) => format!("{} in-process", db.split("://").next().unwrap_or(db)),
        (None, None) => "sqlite in-process".to_string(),
    };
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let peak_resets = reset_peak_rss();
    eprintln!(
        "overseer bench: {} on {backend}; {} workers × {} concurrency, {} clients (run {run_id})",
        chosen
            .iter()
            .map(|s| s.name())
            .collect::<Vec<_>>()
            .join(", "),
        args.workers,
        args.concurrency,
        args.clients,
    );

    let mut rows: Vec<Row> = Vec::new();
    let mut failed = false;
    for scenario in chosen {
        eprintln!("overseer bench: running {} …", scenario.name());
        reset_peak_rss();
        let fresh = match (&args.server, &shared) {
            (None, None) if scenario.uses_server() => {
                Some(fresh_server(args.sweep_interval).await?)
            }
            _ => None,
        };
        let url = match (&args.server, &shared, &fresh) {
            (Some(url), _, _) => url.trim_end_matches('/').to_string(),
            (None, Some(s), _) | (None, None, Some(s)) => s.url.clone(),
            // `memory` starts a server process of its own; `cross_node` skips itself on SQLite.
            (None, None, None) => String::new(),
        };
        let ctx = Ctx {
            url,
            remote: args.server.is_some(),
            db: args.db.clone(),
            token: args.token.clone(),
            run: run_id.clone(),
            clients: args.clients,
            batch: args.batch,
            full_answers: args.full_answers,
            workers: args.workers,
            concurrency: args.concurrency,
            jobs: args.jobs,
            preload: args.preload,
            due: args.due,
            kills: args.kills,
            load_rate: args.load_rate,
            pending: args.pending,
            step_timeout: args.step_timeout,
            work: args.work.as_std(),
            sweep_interval: args.server.is_none().then_some(args.sweep_interval),
            timeout: args.timeout.as_std(),
            steady: args.steady,
        };
        let result = scenarios::run(scenario, &ctx).await;
        let rss = rss_mb();
        if let Some(server) = fresh {
            server.stop().await;
        }
        match result {
            Ok(found) => {
                for mut row in found {
                    // `memory` names the server process it measured.
                    if row.backend.is_empty() {
                        row.backend = backend.clone();
                    }
                    // `memory` reports the server process's own figure.
                    if row.rss_mb.is_none() {
                        row.rss_mb = rss.map(|mb| (mb * 10.0).round() / 10.0);
                    }
                    if args.output == Format::Json {
                        let mut out = std::io::stdout().lock();
                        serde_json::to_writer(&mut out, &row)?;
                        writeln!(out)?;
                        out.flush()?;
                    }
                    rows.push(row);
                }
            }
            Err(e) => {
                failed = true;
                eprintln!("overseer bench: {} failed: {e:#}", scenario.name());
            }
        }
    }
    if let Some(server) = shared {
        server.stop().await;
    }
    if args.output == Format::Table {
        print_table(&rows, peak_resets, args.server.is_some());
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print_table(rows: &[Row], peak_resets: bool, remote: bool) {
    let num = |v: Option<f64>, decimals: usize| match v {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".to_string(),
    };
    let header = [
        "scenario", "jobs", "seconds", "jobs/s", "steps/s", "p50_ms", "p99_ms", "p999_ms", "rss_mb",
    ];
    let lines: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                r.scenario.clone(),
                r.jobs.to_string(),
                format!("{:.2}", r.seconds),
                num(r.per_s, 0),
                num(r.steps_per_s, 0),
                num(r.p50_ms, 1),
                num(r.p99_ms, 1),
                num(r.p999_ms, 1),
                num(r.rss_mb, 0),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    if let Some(first) = rows.first() {
        out.push_str(&format!("backend: {}\n", first.backend));
    }
    for (i, (h, w)) in header.iter().zip(widths).enumerate() {
        if i == 0 {
            out.push_str(&format!("{h:<w$}"));
        } else {
            out.push_str(&format!("  {h:>w$}"));
        }
    }
    out.push('\n');
    for line in &lines {
        for (i, (cell, w)) in line.iter().zip(widths).enumerate() {
            if i == 0 {
                out.push_str(&format!("{cell:<w$}"));
            } else {
                out.push_str(&format!("  {cell:>w$}"));
            }
        }
        out.push('\n');
    }
    out.push('\n');
    for r in rows {
        if let Some(note) = &r.note {
            out.push_str(&format!("{}: {note}\n", r.scenario));
        }
    }
    let rss = if !peak_resets {
        "rss_mb: resident memory of this process (the peak could not be reset per scenario)"
    } else if remote {
        "rss_mb: peak resident memory of this process (agents and clients; the server is remote) during the scenario"
    } else {
        "rss_mb: peak resident memory of this process during the scenario; it hosts the server and its store as well as the agents and clients"
    };
    out.push_str(rss);
    if rows.iter().any(|r| r.rss_idle_mb.is_some()) {
        out.push_str("; for memory, the separate server process's VmRSS with the pending jobs");
    }
    out.push('\n');
    // A closed stdout (`| head`) is not worth a panic here; the rows were printed or not.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves percentiles use the nearest rank and p999 needs a thousand samples.
    #[test]
    fn percentiles_by_nearest_rank() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p95, p.p99), (Some(50.0), Some(95.0), Some(99.0)));
        assert_eq!(p.p999, None);
        let p = Percentiles::of((1..=2000).rev().map(f64::from).collect());
        assert_eq!((p.p50, p.p999), (Some(1000.0), Some(1998.0)));
        assert_eq!(Percentiles::of(vec![7.0]).p99, Some(7.0));
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }
}
