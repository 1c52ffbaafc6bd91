//! The scenarios of `overseer bench`. Each one submits through the SDK's `Client`, runs SDK
//! `Worker`s, waits on counts (never on sleeps) and answers its result rows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use overseer_agent::{Client, Handler, StepContext, StepError, Worker};
use overseer_core::{JobId, JobSpec, Timestamp};
use overseer_server::config::StoreUrl;
use serde_json::{json, Value};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{rate, Countdown, Ctx, Percentiles, Row, Scenario};

/// Default job counts when `--jobs` is not given.
const SUBMIT_JOBS: usize = 20_000;
const DRAIN_JOBS: usize = 40_000;
const LATENCY_JOBS: usize = 2_000;
const DAG_JOBS: usize = 5_000;
const ORDERED_JOBS: usize = 500;
const FANOUT_JOBS: usize = 1_000;
/// `fanout`: one job every this long, and how long each step's handler works.
const FANOUT_PACE: Duration = Duration::from_millis(20);
const FANOUT_WORK: Duration = Duration::from_millis(20);
/// Jobs per request when a scenario loads its jobs before measuring (the server's default
/// `limits.jobs_per_batch`).
pub(super) const PRELOAD_BATCH: usize = 1_000;
/// `latency`, `latency_loaded` and `cross_node`: one marker job every this long.
pub(super) const LATENCY_PACE: Duration = Duration::from_millis(5);
/// `latency_loaded`: how often the background load submits what has fallen due.
const LOAD_TICK: Duration = Duration::from_millis(5);
/// `timers`: how far ahead the measured jobs are due, and where the preload sits.
const TIMERS_AHEAD_MS: f64 = 2_000.0;
const TIMERS_PRELOAD_AHEAD_MS: f64 = 30.0 * 86_400_000.0;

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
            "{} workers × concurrency {}; first lease → last completion; the {n} jobs were \
             loaded first in batches of {PRELOAD_BATCH} at {:.0} jobs/s",
            ctx.workers,
            ctx.concurrency,
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
            "a → (b, c) → d, 4 steps per job; {} workers × concurrency {}; first lease → last \
             completion; loaded first in batches of {PRELOAD_BATCH} at {:.0} jobs/s",
            ctx.workers,
            ctx.concurrency,
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
        let (first, done) = (first.clone(), done.clone());
        move |_: StepContext| {
            first.get_or_init(Instant::now);
            done.hit();
            std::future::ready(Ok::<_, StepError>(Value::Null))
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

/// Whether a job's 202 or its lease was seen first, and when.
enum Mark {
    /// When the request was sent and when its 202 came back.
    Answered {
        sent: Instant,
        at: Instant,
    },
    Leased(Instant),
}

/// Pairs each job's 202 with its lease, whichever comes first.
#[derive(Default)]
struct Marks {
    pending: Mutex<HashMap<JobId, Mark>>,
    /// 202 received → lease received (0 when the lease came first).
    samples_ms: Mutex<Vec<f64>>,
    /// Request sent → lease received: includes the submit's own commit.
    from_sent_ms: Mutex<Vec<f64>>,
    /// Leases that reached the handler before the client had the 202.
    early: AtomicUsize,
}

impl Marks {
    fn answered(&self, job: JobId, sent: Instant, at: Instant) {
        let leased = {
            let mut pending = lock(&self.pending);
            match pending.remove(&job) {
                Some(Mark::Leased(l)) => Some(l),
                Some(Mark::Answered { .. }) | None => {
                    pending.insert(job, Mark::Answered { sent, at });
                    None
                }
            }
        };
        if let Some(l) = leased {
            self.early.fetch_add(1, Ordering::Relaxed);
            self.record(sent, at, l);
        }
    }

    fn leased(&self, job: JobId, at: Instant) {
        let answered = {
            let mut pending = lock(&self.pending);
            match pending.remove(&job) {
                Some(Mark::Answered { sent, at }) => Some((sent, at)),
                Some(Mark::Leased(_)) | None => {
                    pending.insert(job, Mark::Leased(at));
                    None
                }
            }
        };
        if let Some((sent, answered)) = answered {
            self.record(sent, answered, at);
        }
    }

    fn record(&self, sent: Instant, answered: Instant, leased: Instant) {
        lock(&self.samples_ms).push(ms(leased.saturating_duration_since(answered)));
        lock(&self.from_sent_ms).push(ms(leased.saturating_duration_since(sent)));
    }
}

/// `latency`: one job every 5 ms to idle long-polling workers; 202 received → lease received.
async fn latency(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let r = ctx.jobs.unwrap_or(LATENCY_JOBS);
    let probe = Markers::start(ctx, &ctx.agent("latency"), r)
        .await?
        .run(ctx)
        .await?;
    Ok(vec![Row::new("latency", r, probe.seconds)
        .rate(r)
        .note(probe.describe(ctx))
        .latencies(probe.samples_ms)])
}

/// `latency_loaded`: `latency` while W workers drain a steady background load of one-step no-op
/// jobs submitted at `--load-rate` per second on an agent of their own.
async fn latency_loaded(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let r = ctx.jobs.unwrap_or(LATENCY_JOBS);
    let load_agent = ctx.agent("loaded-background");
    let ran = Arc::new(AtomicUsize::new(0));
    let handler = {
        let ran = ran.clone();
        move |_: StepContext| {
            ran.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok::<_, StepError>(Value::Null))
        }
    };
    let drainers = Agents::start(
        ctx,
        &load_agent,
        "background",
        ctx.workers,
        ctx.concurrency,
        handler,
    )?;
    let stream = match Stream::start(ctx, &load_agent, ctx.load_rate as f64) {
        Ok(stream) => stream,
        Err(e) => {
            drainers.stop().await;
            return Err(e);
        }
    };
    let client = ctx.client()?;
    let measured = async {
        let markers = Markers::start(ctx, &ctx.agent("loaded-markers"), r).await?;
        let (accepted, leased, from) = (
            stream.accepted(),
            ran.load(Ordering::Relaxed),
            Instant::now(),
        );
        let probe = markers.run(ctx).await?;
        let window = from.elapsed().as_secs_f64();
        let accepted = stream.accepted() - accepted;
        let leased = ran.load(Ordering::Relaxed) - leased;
        let backlog = client
            .agents()
            .await?
            .agents
            .iter()
            .find(|a| a.agent == load_agent)
            .map_or(0, |a| a.ready);
        anyhow::Ok((probe, window, accepted, leased, backlog))
    }
    .await;
    let streamed = stream.stop().await;
    // The backlog is drained before the next scenario, so it cannot weigh on that one.
    let cleared = match (&measured, &streamed) {
        (Ok(_), Ok(())) => settled(&client, &load_agent, ctx.timeout).await,
        _ => Ok(()),
    };
    drainers.stop().await;
    let (probe, window, accepted, leased, backlog) = measured?;
    streamed?;
    cleared?;
    let mut row = Row::new("latency_loaded", r, probe.seconds)
        .rate(r)
        .note(format!(
            "background: {:.0} jobs/s submitted (asked {}/s, in batches every {} ms from up to \
             {} clients) and {:.0} jobs/s leased by {} workers × concurrency {} while the \
             markers ran, {backlog} still ready at the end; markers: {}",
            rate(accepted, window).unwrap_or(0.0),
            ctx.load_rate,
            LOAD_TICK.as_millis(),
            ctx.clients,
            rate(leased, window).unwrap_or(0.0),
            ctx.workers,
            ctx.concurrency,
            probe.describe(ctx),
        ))
        .latencies(probe.samples_ms);
    row.load_per_s = rate(accepted, window);
    Ok(vec![row])
}

/// The performance issue's PostgreSQL target for `cross_node`.
const CROSS_NODE_TARGET_P99_MS: f64 = 10.0;

/// `cross_node`: `latency` across two nodes of one PostgreSQL store. The markers go to the
/// bench's server (node A); the idle long-polling workers poll a second in-process node (B) on
/// the same store, which hears of each job only through `LISTEN/NOTIFY` (`Maintenance::signals`).
async fn cross_node(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let on_postgres = ctx
        .db
        .as_deref()
        .filter(|db| matches!(StoreUrl::parse(db), Ok(StoreUrl::Postgres(_))));
    let (false, Some(db), Some(sweep_interval)) = (ctx.remote, on_postgres, ctx.sweep_interval)
    else {
        let why = if ctx.remote {
            "it starts a second in-process node on the server's store, which --server does not \
             give; run it with --db postgres://… instead"
        } else {
            "it needs a PostgreSQL store (--db postgres://…): a second node on one SQLite file \
             gets no cross-node signals (no LISTEN/NOTIFY), so it would only measure polling"
        };
        eprintln!("overseer bench: cross_node skipped: {why}");
        return Ok(Vec::new());
    };
    let r = ctx.jobs.unwrap_or(LATENCY_JOBS);
    let node_b = super::LocalServer::start(db.to_string(), sweep_interval, None)
        .await
        .context("cannot start the second node")?;
    let on_b = Ctx {
        url: node_b.url.clone(),
        ..ctx.clone()
    };
    let probe = async {
        Markers::start(&on_b, &ctx.agent("cross-node"), r)
            .await?
            .run(ctx)
            .await
    }
    .await;
    node_b.stop().await;
    let probe = probe?;
    Ok(vec![Row::new("cross_node", r, probe.seconds)
        .rate(r)
        .note(format!(
            "cross-node wake-up: markers submitted to node A ({}), leased by workers \
             long-polling node B ({}), a second in-process node on the same PostgreSQL store \
             woken through LISTEN/NOTIFY; node A's 202 received → lease received from node B; \
             target p99 ≤ {CROSS_NODE_TARGET_P99_MS:.0} ms (performance issue); markers: {}",
            ctx.url,
            on_b.url,
            probe.describe(ctx),
        ))
        .latencies(probe.samples_ms)])
}

/// What the markers of `latency`, `latency_loaded` and `cross_node` measured.
pub(super) struct Probe {
    /// First marker submitted → last marker leased.
    seconds: f64,
    /// 202 received → lease received, per marker.
    pub(super) samples_ms: Vec<f64>,
    /// Request sent → lease received: includes the submit's own commit.
    from_sent: Percentiles,
    /// Leases that reached the handler before the client had the 202.
    early: usize,
}

impl Probe {
    /// How to read the marker latencies.
    fn describe(&self, ctx: &Ctx) -> String {
        format!(
            "one job per {} ms to {} idle long-polling workers; 202 received by the client → \
             lease received by the handler, same-process Instant; {} leases arrived before \
             their 202 and count as 0 ms; from the submit request sent instead: p50 {:.1} ms, \
             p99 {:.1} ms",
            LATENCY_PACE.as_millis(),
            ctx.workers,
            self.early,
            self.from_sent.p50.unwrap_or(f64::NAN),
            self.from_sent.p99.unwrap_or(f64::NAN),
        )
    }
}

/// Marker jobs submitted one every 5 ms to idle long-polling workers of their own agent, each
/// 202 paired with its lease.
pub(super) struct Markers {
    agent: String,
    count: usize,
    agents: Agents,
    marks: Arc<Marks>,
    done: Arc<Countdown>,
}

impl Markers {
    /// Starts `ctx.workers` workers of `agent` on `ctx`'s server and waits until they all
    /// long-poll there.
    pub(super) async fn start(ctx: &Ctx, agent: &str, count: usize) -> anyhow::Result<Markers> {
        let marks = Arc::new(Marks::default());
        let done = Arc::new(Countdown::new(count));
        let handler = {
            let (marks, done) = (marks.clone(), done.clone());
            move |step: StepContext| {
                marks.leased(step.job_id(), Instant::now());
                done.hit();
                std::future::ready(Ok::<_, StepError>(Value::Null))
            }
        };
        let agents = Agents::start(ctx, agent, "markers", ctx.workers, ctx.concurrency, handler)?;
        // Workers are listed by the node they poll, so this asks that node.
        let waited = async { polling(&ctx.client()?, agent, ctx.workers, ctx.timeout).await };
        if let Err(e) = waited.await {
            agents.stop().await;
            return Err(e);
        }
        Ok(Markers {
            agent: agent.to_string(),
            count,
            agents,
            marks,
            done,
        })
    }

    /// Submits the markers to `ctx`'s server (not necessarily the one the workers poll), waits
    /// for every lease and stops the workers.
    pub(super) async fn run(self, ctx: &Ctx) -> anyhow::Result<Probe> {
        let Markers {
            agent,
            count,
            agents,
            marks,
            done,
        } = self;
        let outcome = async {
            let client = ctx.client()?;
            let template = one_step(&agent)?;
            let mut tick = tokio::time::interval(LATENCY_PACE);
            // A late tick is made up at once, so the average pace stays one job per 5 ms.
            tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
            let mut submits: JoinSet<anyhow::Result<()>> = JoinSet::new();
            let started = Instant::now();
            for _ in 0..count {
                tick.tick().await;
                let (client, spec, marks) = (client.clone(), template.clone(), marks.clone());
                // Each submit runs on its own, so a slow answer does not hold back the pace.
                submits.spawn(async move {
                    let sent = Instant::now();
                    let (job, created) = client.submit(&spec).await?;
                    marks.answered(job.id, sent, Instant::now());
                    anyhow::ensure!(created, "job {} was not created", job.id);
                    Ok(())
                });
                while let Some(finished) = submits.try_join_next() {
                    finished??;
                }
            }
            while let Some(finished) = submits.join_next().await {
                finished??;
            }
            done.wait(ctx.timeout, "markers leased").await?;
            anyhow::Ok(started.elapsed().as_secs_f64())
        }
        .await;
        agents.stop().await;
        let seconds = outcome?;
        let samples_ms = std::mem::take(&mut *lock(&marks.samples_ms));
        let from_sent = Percentiles::of(std::mem::take(&mut *lock(&marks.from_sent_ms)));
        Ok(Probe {
            seconds,
            samples_ms,
            from_sent,
            early: marks.early.load(Ordering::Relaxed),
        })
    }
}

/// One-step no-op jobs for an agent, submitted at a steady rate until stopped. Every tick it
/// submits what has fallen due since the start (one request, a batch when more than one job) on
/// an idle client; when every client is busy the jobs wait for the next tick, so the server's
/// pace, not an ever-growing pile of requests, sets the rate achieved.
pub(super) struct Stream {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Jobs the server answered 202 for.
    accepted: Arc<AtomicUsize>,
}

impl Stream {
    pub(super) fn start(ctx: &Ctx, agent: &str, per_s: f64) -> anyhow::Result<Stream> {
        let template = one_step(agent)?;
        let clients: Vec<Client> = (0..ctx.clients)
            .map(|_| ctx.client())
            .collect::<anyhow::Result<_>>()?;
        let stop = CancellationToken::new();
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(pace(
            clients,
            template,
            per_s,
            stop.clone(),
            accepted.clone(),
        ));
        Ok(Stream {
            stop,
            task,
            accepted,
        })
    }

    pub(super) fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Stops submitting and waits for the requests in flight; fails if any request failed.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.task.await.context("the background load panicked")?
    }
}

async fn pace(
    clients: Vec<Client>,
    template: JobSpec,
    per_s: f64,
    stop: CancellationToken,
    accepted: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut idle = clients;
    let mut requests: JoinSet<anyhow::Result<Client>> = JoinSet::new();
    let mut tick = tokio::time::interval(LOAD_TICK);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut asked = 0usize;
    let outcome = async {
        loop {
            tokio::select! {
                () = stop.cancelled() => return anyhow::Ok(()),
                _ = tick.tick() => {}
            }
            while let Some(finished) = requests.try_join_next() {
                idle.push(finished??);
            }
            let due = (per_s * started.elapsed().as_secs_f64()) as usize;
            while asked < due {
                let Some(client) = idle.pop() else { break };
                let n = (due - asked).min(PRELOAD_BATCH);
                asked += n;
                let (specs, accepted) = (vec![template.clone(); n], accepted.clone());
                requests.spawn(async move {
                    submit_specs(&client, &specs, false).await?;
                    accepted.fetch_add(n, Ordering::Relaxed);
                    Ok(client)
                });
            }
        }
    }
    .await;
    let mut failed = outcome.err();
    while let Some(finished) = requests.join_next().await {
        if let Err(e) = finished.map_err(anyhow::Error::from).and_then(|r| r) {
            failed.get_or_insert(e);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// `timers`: the submit rate without and with M delayed jobs in the store, and how late K jobs
/// due 2 s ahead start.
async fn timers(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    let n = ctx.jobs.unwrap_or(SUBMIT_JOBS);
    let idle = one_step(&ctx.agent("timers-idle"))?;
    let mut rows = Vec::new();

    let make = {
        let idle = idle.clone();
        move |_| idle.clone()
    };
    let without = submit_jobs(ctx, n, 1, make.clone()).await?;
    let without_rate = rate(n, without.seconds).unwrap_or(0.0);
    rows.push(
        Row::new("timers_submit_without_preload", n, without.seconds)
            .rate(n)
            .latencies(without.latencies_ms)
            .note(format!(
                "{} clients, one POST /v1/jobs per job, before the preload",
                ctx.clients
            )),
    );

    if ctx.preload > 0 {
        let mut far = idle.clone();
        far.run_at = Some(Timestamp::from_millis(
            (wall_ms() + TIMERS_PRELOAD_AHEAD_MS) as i64,
        ));
        let load = submit_jobs(ctx, ctx.preload, PRELOAD_BATCH, move |_| far.clone()).await?;
        rows.push(
            Row::new("timers_preload", ctx.preload, load.seconds)
                .rate(ctx.preload)
                .latencies(load.latencies_ms)
                .note(format!(
                    "jobs delayed 30 days, POST /v1/jobs:batch of {PRELOAD_BATCH} from {} \
                     clients; latency = one batch request",
                    ctx.clients
                )),
        );
    }

    let with = submit_jobs(ctx, n, 1, make).await?;
    let with_rate = rate(n, with.seconds).unwrap_or(0.0);
    let change = if without_rate > 0.0 {
        format!("{:+.0}%", (with_rate / without_rate - 1.0) * 100.0)
    } else {
        "n/a".to_string()
    };
    rows.push(
        Row::new("timers_submit_with_preload", n, with.seconds)
            .rate(n)
            .latencies(with.latencies_ms)
            .note(format!(
                "as timers_submit_without_preload, with {} delayed jobs in the store: {change} \
                 jobs/s",
                ctx.preload
            )),
    );

    rows.push(lateness(ctx).await?);
    Ok(rows)
}

/// K jobs due together 2 s after they are submitted: lease receipt (wall clock) − `run_at`.
async fn lateness(ctx: &Ctx) -> anyhow::Result<Row> {
    let k = ctx.due;
    let agent = ctx.agent("timers");
    let received_ms: Arc<Mutex<Vec<f64>>> = Arc::default();
    let done = Arc::new(Countdown::new(k));
    let handler = {
        let (received_ms, done) = (received_ms.clone(), done.clone());
        move |_: StepContext| {
            lock(&received_ms).push(wall_ms());
            done.hit();
            std::future::ready(Ok::<_, StepError>(Value::Null))
        }
    };
    // Enough slots for all K at once: this measures the scheduler, not the agents' capacity.
    let concurrency = ctx.concurrency.max(k.div_ceil(ctx.workers));
    let agents = Agents::start(ctx, &agent, "timers", ctx.workers, concurrency, handler)?;
    let client = ctx.client()?;
    let outcome = async {
        polling(&client, &agent, ctx.workers, ctx.timeout).await?;
        // Whole milliseconds, as the server keeps them, so lateness is measured from the real due time.
        let due_ms = (wall_ms() + TIMERS_AHEAD_MS).round();
        let mut spec = one_step(&agent)?;
        spec.run_at = Some(Timestamp::from_millis(due_ms as i64));
        submit_jobs(ctx, k, k.min(PRELOAD_BATCH), move |_| spec.clone()).await?;
        done.wait(ctx.timeout, "timers: due jobs leased").await?;
        anyhow::Ok(due_ms)
    }
    .await;
    agents.stop().await;
    let due_ms = outcome?;
    let late: Vec<f64> = lock(&received_ms).iter().map(|r| r - due_ms).collect();
    let last = late.iter().copied().fold(0.0, f64::max);
    let p95 = Percentiles::of(late.clone()).p95.unwrap_or(f64::NAN);
    Ok(Row::new("timers_lateness", k, last / 1000.0)
        .latencies(late)
        .note(format!(
            "{k} jobs due together 2 s after submission, among {} delayed jobs; lease receipt \
             (wall clock) − run_at; p95 {p95:.1} ms; {} workers × concurrency {concurrency}",
            ctx.preload, ctx.workers
        )))
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
async fn polling(
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
async fn settled(client: &Client, agent: &str, timeout: Duration) -> anyhow::Result<()> {
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
async fn submit_specs(client: &Client, specs: &[JobSpec], whole: bool) -> anyhow::Result<()> {
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Milliseconds since the Unix epoch, with a fraction.
pub(super) fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
