//! The scenarios of `overseer bench`. Each one submits through the SDK's `Client`, runs SDK
//! `Worker`s, waits on counts (never on sleeps) and answers its result rows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use overseer_agent::{Client, Handler, StepContext, StepError, Worker};
use overseer_core::{JobId, JobSpec};
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::latency::{cross_node, latency, latency_loaded};
use super::timers::timers;
use super::{rate, Countdown, Ctx, Row, Scenario};

/// Default job counts when `--jobs` is not given.
pub(super) const SUBMIT_JOBS: usize = 20_000;
const DRAIN_JOBS: usize = 40_000;
const DAG_JOBS: usize = 5_000;
const ORDERED_JOBS: usize = 500;
const FANOUT_JOBS: usize = 1_000;
/// `fanout`: one job every this long, and how long each step's handler works.
const FANOUT_PACE: Duration = Duration::from_millis(20);
const FANOUT_WORK: Duration = Duration::from_millis(20);
/// Jobs per request when a scenario loads its jobs before measuring (the server's default
/// `limits.jobs_per_batch`).
pub(super) const PRELOAD_BATCH: usize = 1_000;

/// Runs one scenario and answers its result rows.
pub async fn run(scenario: Scenario, ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    match scenario {
        Scenario::Submit => submit(ctx).await,
        Scenario::Drain => drain(ctx).await,
        Scenario::Latency => latency(ctx).await,
        Scenario::LatencyLoaded => latency_loaded(ctx).await,
        Scenario::CrossNode => cross_node(ctx).await,
        Scenario::Dag => dag(ctx).await,
        Scenario::Timers => timers(ctx).await,
        Scenario::Recovery => recovery(ctx).await,
        Scenario::Ordered => ordered(ctx).await,
        Scenario::Fanout => fanout(ctx).await,
        Scenario::Memory => super::memory::run(ctx).await,
        Scenario::Overload => super::overload::run(ctx).await,
        Scenario::Steady => super::steady::run(ctx).await,
        Scenario::Store => super::store::run(ctx).await,
    }
}

/// `submit`: N single-job POSTs from C clients, then N more in batches of B.
async fn submit(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let n = ctx.jobs.unwrap_or(SUBMIT_JOBS);
    let template = one_step(&ctx.agent("submit"))?;
    let make = move |_| template.clone();
    let single = submit_jobs(ctx, n, 1, make.clone()).await?;
    let mut rows = vec![Row::new("submit", n, single.seconds)
        .rate(n)
        .latencies(single.latencies_ms)
        .note(format!(
            "{} clients, one POST /v1/jobs per job; latency = request sent → 202 received",
            ctx.clients
        ))];
    if ctx.batch > 1 {
        let batched = submit_jobs(ctx, n, ctx.batch, make).await?;
        rows.push(
            Row::new("submit_batch", n, batched.seconds)
                .rate(n)
                .latencies(batched.latencies_ms)
                .note(format!(
                    "{} clients, POST /v1/jobs:batch of {}{}; latency = one batch request",
                    ctx.clients,
                    ctx.batch,
                    if ctx.full_answers {
                        ", whole jobs answered"
                    } else {
                        " with Prefer: return=minimal"
                    }
                )),
        );
    }
    Ok(rows)
}

/// `drain`: N one-step no-op jobs loaded first, then W workers run them all.
async fn drain(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let n = ctx.jobs.unwrap_or(DRAIN_JOBS);
    let agent = ctx.agent("drain");
    let template = one_step(&agent)?;
    let load = submit_jobs(ctx, n, PRELOAD_BATCH, move |_| template.clone()).await?;
    let seconds = run_to_completion(ctx, &agent, n).await?;
    Ok(vec![Row::new("drain", n, seconds).rate(n).steps(n).note(
        format!(
            "{} workers × concurrency {}, handlers working {:?}; first lease → last completion; \
             the {n} jobs were loaded first in batches of {PRELOAD_BATCH} at {:.0} jobs/s",
            ctx.workers,
            ctx.concurrency,
            ctx.work,
            rate(n, load.seconds).unwrap_or(0.0)
        ),
    )])
}

/// `dag`: N jobs shaped a → (b, c) → d, loaded first, then W workers run them all.
async fn dag(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let n = ctx.jobs.unwrap_or(DAG_JOBS);
    let agent = ctx.agent("dag");
    let template = spec(json!({ "steps": [
        { "name": "a", "agent": agent },
        { "name": "b", "agent": agent, "depends_on": ["a"] },
        { "name": "c", "agent": agent, "depends_on": ["a"] },
        { "name": "d", "agent": agent, "depends_on": ["b", "c"] },
    ]}))?;
    let load = submit_jobs(ctx, n, PRELOAD_BATCH, move |_| template.clone()).await?;
    let seconds = run_to_completion(ctx, &agent, 4 * n).await?;
    Ok(vec![Row::new("dag", n, seconds).rate(n).steps(4 * n).note(
        format!(
            "a → (b, c) → d, 4 steps per job; {} workers × concurrency {}, handlers working \
             {:?}; first lease → last completion; loaded first in batches of {PRELOAD_BATCH} at \
             {:.0} jobs/s",
            ctx.workers,
            ctx.concurrency,
            ctx.work,
            rate(n, load.seconds).unwrap_or(0.0)
        ),
    )])
}

/// Runs W workers of `agent` until `steps` handlers ran and the server shows nothing ready or
/// running for it; answers the seconds from the first lease to that moment.
async fn run_to_completion(ctx: &Ctx, agent: &str, steps: usize) -> anyhow::Result<f64> {
    let first: Arc<OnceLock<Instant>> = Arc::default();
    let done = Arc::new(Countdown::new(steps));
    let handler = {
        let (first, done, work) = (first.clone(), done.clone(), ctx.work);
        move |_: StepContext| {
            first.get_or_init(Instant::now);
            let done = done.clone();
            async move {
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                done.hit();
                Ok::<_, StepError>(Value::Null)
            }
        }
    };
    let agents = Agents::start(ctx, agent, "run", ctx.workers, ctx.concurrency, handler)?;
    let outcome = async {
        done.wait(ctx.timeout, "steps leased").await?;
        settled(&ctx.client()?, agent, ctx.timeout).await
    }
    .await;
    let end = Instant::now();
    agents.stop().await;
    outcome?;
    let first = *first.get().context("no step was leased")?;
    Ok(end.duration_since(first).as_secs_f64())
}

/// Shared by the doomed and the healthy workers of `recovery`.
#[derive(Default)]
struct Recovery {
    abandoned_at: OnceLock<Instant>,
    samples_ms: Mutex<Vec<f64>>,
}

/// `recovery`: K steps whose agent is killed mid-step; abandon → the step's next lease.
/// `ordered`: N one-step jobs on one ordering key, loaded up front; each handler records when it
/// started and returned. The gap between one job's handler returning and the next job's handler
/// starting is the hand-over: the completion's round trip, the next job's start (in the same
/// transaction as the completion) and its lease reaching a long-polling worker.
async fn ordered(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let n = ctx.jobs.unwrap_or(ORDERED_JOBS);
    let agent = ctx.agent("ordered");
    let key = format!("bench-{}", std::process::id());
    let template =
        spec(json!({ "ordering_key": key, "steps": [{ "name": "s", "agent": agent }] }))?;
    // (started, returned) per job, in the order they ran.
    let runs: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let done = Arc::new(Countdown::new(n));
    let handler = {
        let (runs, done) = (runs.clone(), done.clone());
        move |_step: StepContext| {
            let (runs, done) = (runs.clone(), done.clone());
            async move {
                let started = Instant::now();
                lock(&runs).push((started, Instant::now()));
                done.hit();
                Ok::<_, StepError>(Value::Null)
            }
        }
    };
    let agents = Agents::start(
        ctx,
        &agent,
        "ordered",
        ctx.workers,
        ctx.concurrency,
        handler,
    )?;
    let began = Instant::now();
    let outcome = async {
        submit_jobs(ctx, n, n.min(PRELOAD_BATCH), move |_| template.clone()).await?;
        done.wait(ctx.timeout, "ordered: every job of the key ran")
            .await
    }
    .await;
    agents.stop().await;
    outcome?;
    let seconds = began.elapsed().as_secs_f64();
    let runs = std::mem::take(&mut *lock(&runs));
    let gaps: Vec<f64> = runs
        .windows(2)
        .map(|w| ms(w[1].0.saturating_duration_since(w[0].1)))
        .collect();
    Ok(vec![Row::new("ordered", n, seconds)
        .rate(n)
        .latencies(gaps)
        .note(format!(
            "{n} jobs on one ordering key, run one at a time; latency = a job's handler \
             returned → the next job's handler started ({} workers)",
            ctx.workers
        ))])
}

/// `fanout`: jobs of two sibling steps made ready together, one job every 20 ms, to idle workers
/// that each take one lease per call and work 20 ms on it; measures how far apart the two
/// siblings' leases reach their handlers. Two claims race for one job: on PostgreSQL the loser passes over the job the
/// winner holds, and must hear about the sibling again rather than wait for a sweep.
async fn fanout(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let n = ctx.jobs.unwrap_or(FANOUT_JOBS);
    let agent = ctx.agent("fanout");
    let template = spec(json!({ "steps": [
        { "name": "b", "agent": agent },
        { "name": "c", "agent": agent },
    ]}))?;
    let leased: Arc<Mutex<HashMap<JobId, Vec<Instant>>>> = Arc::default();
    let done = Arc::new(Countdown::new(2 * n));
    let handler = {
        let (leased, done) = (leased.clone(), done.clone());
        move |step: StepContext| {
            lock(&leased)
                .entry(step.job_id())
                .or_default()
                .push(Instant::now());
            let done = done.clone();
            // The worker that took one sibling is busy for a while: the other sibling must go
            // to another worker's long-poll, not wait for this one to come back.
            async move {
                tokio::time::sleep(FANOUT_WORK).await;
                done.hit();
                Ok::<_, StepError>(Value::Null)
            }
        }
    };
    // Enough idle workers that a free one is always waiting: the gap is the wake-up, not a queue.
    let workers = ctx.workers.max(8);
    let agents = Agents::start(ctx, &agent, "fanout", workers, 1, handler)?;
    let began = Instant::now();
    let outcome = async {
        polling(&ctx.client()?, &agent, workers, ctx.timeout).await?;
        let client = ctx.client()?;
        let mut tick = tokio::time::interval(FANOUT_PACE);
        for _ in 0..n {
            tick.tick().await;
            let (created_job, created) = client.submit(&template).await?;
            anyhow::ensure!(created, "job {} was not created", created_job.id);
        }
        done.wait(ctx.timeout, "fanout: every sibling leased").await
    }
    .await;
    agents.stop().await;
    outcome?;
    let seconds = began.elapsed().as_secs_f64();
    let gaps: Vec<f64> = lock(&leased)
        .values()
        .filter_map(|t| match t.as_slice() {
            [a, b] => Some(ms(if a > b { *a - *b } else { *b - *a })),
            _ => None,
        })
        .collect();
    anyhow::ensure!(
        gaps.len() == n,
        "{} of {n} jobs had both siblings leased once",
        gaps.len()
    );
    Ok(vec![Row::new("fanout", n, seconds)
        .rate(n)
        .latencies(gaps)
        .note(format!(
            "{n} jobs of two sibling steps, one every 20 ms; {workers} workers taking one \
             lease per call, 20 ms of work per step; latency = the first sibling's lease → the \
             second's"
        ))])
}

async fn recovery(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let k = ctx.kills;
    let agent = ctx.agent("recovery");
    // A 1ms backoff keeps the retry delay out of the measure: what remains is the lease running
    // out and the sweep noticing.
    let template = spec(json!({ "steps": [{
        "name": "s", "agent": agent, "timeout": ctx.step_timeout.to_string(),
        "backoff": { "initial": "1ms", "max": "1ms" },
    }]}))?;
    let state = Arc::new(Recovery::default());
    let first = Arc::new(Countdown::new(k));
    let recovered = Arc::new(Countdown::new(k));
    let handler = {
        let (state, first, recovered) = (state.clone(), first.clone(), recovered.clone());
        move |step: StepContext| {
            let (state, first, recovered) = (state.clone(), first.clone(), recovered.clone());
            async move {
                if step.attempt() == 1 {
                    // The killed agent: hangs until its worker is abandoned, which drops this.
                    first.hit();
                    std::future::pending::<()>().await;
                }
                let now = Instant::now();
                if let Some(at) = state.abandoned_at.get() {
                    lock(&state.samples_ms).push(ms(now.saturating_duration_since(*at)));
                }
                recovered.hit();
                Ok::<_, StepError>(Value::Null)
            }
        }
    };
    let doomed = Agents::start(ctx, &agent, "doomed", 1, k, handler.clone())?;
    let loaded = async {
        submit_jobs(ctx, k, k.min(PRELOAD_BATCH), move |_| template.clone()).await?;
        first
            .wait(ctx.timeout, "recovery: first attempts leased")
            .await
    }
    .await;
    if let Err(e) = loaded {
        doomed.stop().await;
        return Err(e);
    }
    state.abandoned_at.get_or_init(Instant::now);
    doomed.abandon();
    let healthy = Agents::start(
        ctx,
        &agent,
        "healthy",
        ctx.workers,
        ctx.concurrency,
        handler,
    )?;
    let outcome = recovered
        .wait(ctx.timeout, "recovery: steps leased again")
        .await;
    healthy.stop().await;
    doomed.stop().await;
    outcome?;
    let samples = std::mem::take(&mut *lock(&state.samples_ms));
    let last = samples.iter().copied().fold(0.0, f64::max);
    let bound = match ctx.sweep_interval {
        Some(sweep) => format!(
            "sweep interval {sweep}, so the bound is timeout + one sweep = {}",
            overseer_core::Span::from_millis(ctx.step_timeout.as_millis() + sweep.as_millis())
        ),
        None => "sweep interval unknown (remote server; 1s by default), bound = timeout + one \
                 sweep"
            .to_string(),
    };
    let mut row = Row::new("recovery", k, last / 1000.0)
        .latencies(samples)
        .note(format!(
            "{k} steps, agent abandoned mid-step (handlers dropped, no more heartbeats) → next \
             lease of the step; step timeout {}, retry backoff 1ms; {bound}",
            ctx.step_timeout
        ));
    row.p999_ms = None;
    Ok(vec![row])
}

/// SDK workers run by a scenario.
pub(super) struct Agents {
    shutdown: CancellationToken,
    abandon: CancellationToken,
    tasks: JoinSet<()>,
}

impl Agents {
    pub(super) fn start<H: Handler + Clone>(
        ctx: &Ctx,
        agent: &str,
        label: &str,
        count: usize,
        concurrency: usize,
        handler: H,
    ) -> anyhow::Result<Agents> {
        let shutdown = CancellationToken::new();
        let abandon = CancellationToken::new();
        let mut tasks = JoinSet::new();
        for i in 0..count {
            let worker = Worker::builder(ctx.client()?)
                .worker_id(format!("bench-{}-{label}-{i}", ctx.run))
                .handler(agent, handler.clone())
                .concurrency(concurrency)
                .build()?;
            tasks.spawn(worker.run_until_abandon(shutdown.clone(), abandon.clone()));
        }
        Ok(Agents {
            shutdown,
            abandon,
            tasks,
        })
    }

    /// Drops every running handler at once and reports nothing, as a killed agent would.
    fn abandon(&self) {
        self.abandon.cancel();
    }

    pub(super) async fn stop(mut self) {
        self.shutdown.cancel();
        let joined = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), joined)
            .await
            .is_err()
        {
            tracing::warn!("bench workers did not stop within 10s; abandoning them");
            self.abandon.cancel();
            self.tasks.shutdown().await;
        }
    }
}

/// What loading jobs took: the whole time and each request's latency.
pub(super) struct Load {
    pub(super) seconds: f64,
    pub(super) latencies_ms: Vec<f64>,
}

/// Submits `n` jobs made by `make` from `ctx.clients` concurrent clients (each with its own
/// connection pool), `batch` per request: `POST /v1/jobs` when 1, else `POST /v1/jobs:batch`.
pub(super) async fn submit_jobs<F>(
    ctx: &Ctx,
    n: usize,
    batch: usize,
    make: F,
) -> anyhow::Result<Load>
where
    F: Fn(usize) -> JobSpec + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let next = Arc::new(AtomicUsize::new(0));
    let requests = n.div_ceil(batch);
    let clients: Vec<Client> = (0..ctx.clients.min(requests))
        .map(|_| ctx.client())
        .collect::<anyhow::Result<_>>()?;
    let whole = ctx.full_answers;
    let started = Instant::now();
    let mut tasks: JoinSet<anyhow::Result<Vec<f64>>> = JoinSet::new();
    for client in clients {
        let (make, next) = (make.clone(), next.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let from = next.fetch_add(batch, Ordering::Relaxed);
                if from >= n {
                    break;
                }
                let specs: Vec<JobSpec> = (from..(from + batch).min(n)).map(|i| make(i)).collect();
                let sent = Instant::now();
                submit_specs(&client, &specs, whole).await?;
                latencies.push(ms(sent.elapsed()));
            }
            Ok(latencies)
        });
    }
    let mut latencies_ms = Vec::with_capacity(requests);
    let joined = async {
        while let Some(finished) = tasks.join_next().await {
            latencies_ms.extend(finished??);
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(ctx.timeout, joined)
        .await
        .map_err(|_| anyhow::anyhow!("submitting {n} jobs took longer than {:?}", ctx.timeout))??;
    Ok(Load {
        seconds: started.elapsed().as_secs_f64(),
        latencies_ms,
    })
}

/// Waits until `count` workers of `agent` have asked the server for leases, so they are
/// long-polling before anything is measured.
pub(super) async fn polling(
    client: &Client,
    agent: &str,
    count: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let asked = Instant::now();
        let list = client.agents().await?;
        // `GET /v1/agents` counts every unfinished step: polling it back to back would take a
        // good share of the server (on PostgreSQL, most of it) from the work being measured.
        let pause = asked.elapsed().max(Duration::from_millis(5));
        let seen = list
            .agents
            .iter()
            .find(|a| a.agent == agent)
            .map_or(0, |a| a.workers.len());
        if seen >= count {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {seen} of {count} workers polled within {timeout:?}"
        );
        tokio::time::sleep(pause).await;
    }
}

/// Waits until the server shows no step of `agent` ready or running: every report has landed.
pub(super) async fn settled(client: &Client, agent: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let asked = Instant::now();
        let list = client.agents().await?;
        // `GET /v1/agents` counts every unfinished step: polling it back to back would take a
        // good share of the server (on PostgreSQL, most of it) from the work being measured.
        let pause = asked.elapsed().max(Duration::from_millis(5));
        let left = list
            .agents
            .iter()
            .find(|a| a.agent == agent)
            .map_or(0, |a| a.ready + a.running);
        if left == 0 {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{left} steps still ready or running after {timeout:?}"
        );
        tokio::time::sleep(pause).await;
    }
}

/// Submits one spec with `POST /v1/jobs`, several with one `POST /v1/jobs:batch` (answered
/// with ids and states unless `whole`), and checks every job was created.
pub(super) async fn submit_specs(
    client: &Client,
    specs: &[JobSpec],
    whole: bool,
) -> anyhow::Result<()> {
    if let [spec] = specs {
        let (job, created) = client.submit(spec).await?;
        anyhow::ensure!(created, "job {} was not created", job.id);
        return Ok(());
    }
    let answered = if whole {
        client.submit_batch(specs).await?.jobs.len()
    } else {
        let answer = client.submit_batch_minimal(specs).await?;
        if let Some(job) = answer.jobs.iter().find(|j| !j.created) {
            anyhow::bail!("job {} was not created", job.id);
        }
        answer.jobs.len()
    };
    anyhow::ensure!(
        answered == specs.len(),
        "a batch of {} answered {answered} jobs",
        specs.len()
    );
    Ok(())
}

fn spec(value: Value) -> anyhow::Result<JobSpec> {
    serde_json::from_value(value).context("a bench job spec does not decode")
}

/// A job of one no-op step.
pub(super) fn one_step(agent: &str) -> anyhow::Result<JobSpec> {
    spec(json!({ "steps": [{ "name": "noop", "agent": agent }] }))
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Milliseconds since the Unix epoch, with a fraction.
pub(super) fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
