//! `store`: the store alone, without HTTP, agents or the server around it.
//!
//! It opens a store of its own (a temp SQLite file, or `--db`), submits N one-step jobs through
//! `Store::jobs_submit` in batches of `--batch`, then runs `--workers` loops that each claim up
//! to `--concurrency` steps and report them all complete in one `leases_report` batch, until
//! every step is done. Every claim and report is fenced and committed exactly as the server's
//! would be; what is left out is the request handling, the JSON and the agents.
//!
//! Set beside `drain` and `submit_batch`, it says how much of their time is the store's. With
//! `--workers 1` the writes reach the store one at a time, so the work done per step is the same
//! from run to run: that is the run to count instructions in (`valgrind --tool=callgrind`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use overseer_core::machine::admit;
use overseer_core::{Job, JobId, LeaseId, Timestamp};
use overseer_server::config::StoreUrl;
use overseer_server::{Clock, SystemClock};
use overseer_store::{Claim, LeaseReport, NewJob, Report, Reports, Store};
use serde_json::Value;

use super::scenarios::one_step;
use super::{Ctx, Row};

/// Jobs when `--jobs` is not given.
const STORE_JOBS: usize = 40_000;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    if ctx.remote {
        eprintln!("overseer bench: store skipped: a remote server's store is not ours to open");
        return Ok(Vec::new());
    }
    let n = ctx.jobs.unwrap_or(STORE_JOBS);
    let (store, backend, _dir) = open(ctx).await?;
    let agent = ctx.agent("store");
    let started = Instant::now();
    submit(&*store, &agent, n, ctx.batch.max(1)).await?;
    let submitted = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut loops = tokio::task::JoinSet::new();
    for w in 0..ctx.workers.max(1) {
        let (store, agent) = (store.clone(), agent.clone());
        let max = ctx.concurrency.max(1);
        loops.spawn(async move { work(&*store, &agent, &format!("w{w}"), max).await });
    }
    let mut done = 0;
    while let Some(finished) = loops.join_next().await {
        done += finished.context("a store loop panicked")??;
    }
    let drained = started.elapsed().as_secs_f64();
    anyhow::ensure!(done == n, "the loops completed {done} steps of {n}");
    let row = |name: &str, seconds: f64| {
        let mut row = Row::new(name, n, seconds);
        row.backend = format!("{backend} store alone");
        row
    };
    Ok(vec![
        row("store_submit", submitted).rate(n).note(format!(
            "Store::jobs_submit in batches of {}, no HTTP",
            ctx.batch.max(1)
        )),
        row("store_drain", drained).rate(n).steps(n).note(format!(
            "{} loops, each claiming up to {} steps and reporting them in one batch; no HTTP",
            ctx.workers.max(1),
            ctx.concurrency.max(1)
        )),
    ])
}

/// The store `--db` names, or a fresh temp SQLite file (kept until the scenario ends).
async fn open(
    ctx: &Ctx,
) -> anyhow::Result<(Arc<dyn Store>, &'static str, Option<tempfile::TempDir>)> {
    let mut config = overseer_server::config::Config::default();
    let dir = match &ctx.db {
        Some(db) => {
            config.db = db.clone();
            None
        }
        None => {
            let dir = tempfile::tempdir().context("cannot create a temp dir")?;
            config.db = format!("sqlite://{}", dir.path().join("store.db").display());
            Some(dir)
        }
    };
    let backend = match StoreUrl::parse(&config.db).map_err(anyhow::Error::msg)? {
        StoreUrl::Sqlite(_) => "sqlite",
        StoreUrl::Postgres(_) => "postgres",
    };
    let store = overseer_server::open_store(&config).await?;
    Ok((store, backend, dir))
}

fn now() -> Timestamp {
    SystemClock.now()
}

async fn submit(store: &dyn Store, agent: &str, n: usize, batch: usize) -> anyhow::Result<()> {
    let spec = one_step(agent)?;
    let mut left = n;
    while left > 0 {
        let take = left.min(batch);
        let at = now();
        let jobs = (0..take)
            .map(|_| NewJob {
                transition: admit(Job::from_spec(JobId::generate(), &spec, at), at),
            })
            .collect();
        let stored = store.jobs_submit(jobs).await?;
        anyhow::ensure!(
            stored.iter().all(|s| s.created()),
            "a submit found an existing job"
        );
        left -= take;
    }
    Ok(())
}

/// Claims and completes steps of `agent` until a claim finds none; answers how many it did.
async fn work(store: &dyn Store, agent: &str, worker: &str, max: usize) -> anyhow::Result<usize> {
    let mut done = 0;
    loop {
        let offers = (0..max).map(|_| LeaseId::generate()).collect();
        let claimed = store
            .steps_claim(Claim::of_worker(agent, worker, offers, now()))
            .await?
            .claimed;
        if claimed.is_empty() {
            return Ok(done);
        }
        let reports = claimed
            .iter()
            .map(|c| {
                let lease_id = c.transition.job.steps[c.step]
                    .lease_id
                    .context("a claimed step has no lease")?;
                Ok(Report {
                    lease_id,
                    report: LeaseReport::Complete {
                        result: Value::Null,
                    },
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let applied = store
            .leases_report(Reports {
                reports,
                now: now(),
            })
            .await?;
        for outcome in applied {
            outcome.context("a report was refused")?;
            done += 1;
        }
    }
}
