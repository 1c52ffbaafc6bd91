//! The latency scenarios of `overseer bench`: marker jobs timed from submit to start, idle
//! (`latency`), under a steady background (`latency_loaded`), and across two nodes
//! (`cross_node`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use overseer_agent::{Client, StepContext, StepError};
use overseer_core::{JobId, JobSpec};
use overseer_server::config::StoreUrl;
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::scenarios::{lock, ms, one_step, polling, settled, submit_specs, Agents, PRELOAD_BATCH};
use super::{rate, Countdown, Ctx, Percentiles, Row};

/// `latency`: marker jobs when `--jobs` is not given.
const LATENCY_JOBS: usize = 2_000;

/// `latency`, `latency_loaded` and `cross_node`: one marker job every this long.
pub(super) const LATENCY_PACE: Duration = Duration::from_millis(5);

/// `latency_loaded`: how often the background load submits what has fallen due.
const LOAD_TICK: Duration = Duration::from_millis(5);

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
pub(super) async fn latency(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
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
pub(super) async fn latency_loaded(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
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
pub(super) async fn cross_node(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
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
