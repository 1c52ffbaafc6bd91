//! The `timers` scenario of `overseer bench`: jobs due at spread instants, and how late each
//! one starts.

use std::sync::{Arc, Mutex};

use overseer_agent::{StepContext, StepError};
use overseer_core::Timestamp;
use serde_json::Value;

use super::scenarios::{
    lock, one_step, polling, submit_jobs, wall_ms, Agents, PRELOAD_BATCH, SUBMIT_JOBS,
};
use super::{rate, Countdown, Ctx, Percentiles, Row};

/// `timers`: how far ahead the measured jobs are due, and where the preload sits.
const TIMERS_AHEAD_MS: f64 = 2_000.0;
const TIMERS_PRELOAD_AHEAD_MS: f64 = 30.0 * 86_400_000.0;

/// `timers`: the submit rate without and with M delayed jobs in the store, and how late K jobs
/// due 2 s ahead start.
pub(super) async fn timers(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
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
