//! `steady`: a long run at a fixed submit rate with a short retention, read at intervals: the
//! store's size on disk, the server's resident memory, how many finished jobs the leader has
//! removed, and the start latency of marker jobs while all that goes on.
//!
//! It answers whether a server can run for months: once the first retention period has passed,
//! removal should keep pace with the load, the SQLite file and the RSS should stay flat, and
//! removing old jobs should not slow claims. With `--backlog N`, N jobs are run to the end before
//! the steady load starts, so they all fall due for removal together a retention period later:
//! the readings then show claims while a large removal is under way.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use overseer_agent::{StepContext, StepError};
use overseer_server::config::StoreUrl;
use serde_json::Value;
use tokio::time::Instant;

use super::latency::{Markers, Stream, LATENCY_PACE};
use super::memory::ServerProcess;
use super::scenarios::{one_step, submit_jobs, Agents, PRELOAD_BATCH};
use super::{rate, Countdown, Ctx, Row};

/// The share of each reading's window that its marker jobs span (one every 5 ms), leaving the
/// rest for the workers to start and stop: a p99 over thousands of starts spread across the
/// window, not over one second of it, where a single stall decides the figure.
const MARKED_SHARE: f64 = 0.75;

/// Marker jobs for a reading every `every`: at least 200.
fn markers_per_reading(every: Duration) -> usize {
    let span = every.as_secs_f64() * MARKED_SHARE;
    ((span / LATENCY_PACE.as_secs_f64()) as usize).max(200)
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    if ctx.remote {
        eprintln!(
            "overseer bench: steady skipped: it starts a server process with its own retention \
             and reads its memory and files, which --server does not allow; run it without \
             --server"
        );
        return Ok(Vec::new());
    }
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-steady-")
        .tempdir()
        .context("cannot create a temp directory")?;
    let db = match &ctx.db {
        Some(db) => db.clone(),
        None => format!("sqlite://{}", dir.path().join("bench.db").display()),
    };
    let config = dir.path().join("steady.toml");
    let retention = ctx.steady.retention;
    std::fs::write(
        &config,
        format!("[retention]\nsucceeded = \"{retention}\"\nfailed = \"{retention}\"\n"),
    )
    .context("cannot write the server's settings file")?;
    let extra = ["--config".to_string(), config.display().to_string()];
    let mut server = ServerProcess::spawn_with(ctx, &db, dir.path(), &extra).await?;
    let file = match StoreUrl::parse(&db) {
        Ok(StoreUrl::Sqlite(path)) => Some(path),
        _ => None,
    };
    let measured = measure(ctx, &server, file.as_deref()).await;
    let stopped = server.stop().await;
    let rows = measured.map_err(|e| anyhow::anyhow!("{e:#}\n{}", server.log_tail()))?;
    stopped?;
    Ok(rows)
}

async fn measure(
    ctx: &Ctx,
    server: &ServerProcess,
    file: Option<&Path>,
) -> anyhow::Result<Vec<Row>> {
    let child = Ctx {
        url: server.url.clone(),
        ..ctx.clone()
    };
    let agent = ctx.agent("steady");
    let ran = Arc::new(AtomicUsize::new(0));
    let backlog = Arc::new(Countdown::new(ctx.steady.backlog));
    let handler = {
        let (ran, backlog) = (ran.clone(), backlog.clone());
        move |_: StepContext| {
            ran.fetch_add(1, Ordering::Relaxed);
            backlog.hit();
            std::future::ready(Ok::<_, StepError>(Value::Null))
        }
    };
    let workers = Agents::start(
        &child,
        &agent,
        "steady",
        ctx.workers,
        ctx.concurrency,
        handler,
    )?;
    let outcome = async {
        let mut rows = Vec::new();
        if ctx.steady.backlog > 0 {
            rows.push(run_backlog(&child, &agent, &backlog, server, file).await?);
        }
        rows.extend(run_steady(&child, &agent, &ran, server, file).await?);
        anyhow::Ok(rows)
    }
    .await;
    workers.stop().await;
    outcome
}

/// Runs `--backlog` jobs to the end as fast as the server takes them.
async fn run_backlog(
    ctx: &Ctx,
    agent: &str,
    done: &Countdown,
    server: &ServerProcess,
    file: Option<&Path>,
) -> anyhow::Result<Row> {
    let n = ctx.steady.backlog;
    let started = Instant::now();
    let spec = one_step(agent)?;
    submit_jobs(ctx, n, n.min(PRELOAD_BATCH), move |_| spec.clone()).await?;
    // A backlog takes as long as it takes; the scenario's timeout bounds each wait after it.
    done.wait(
        ctx.timeout.max(Duration::from_secs(3_600)),
        "backlog jobs run",
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let reading = Reading::take(server, file, 0)?;
    let row = Row::new("steady_backlog", n, seconds).rate(n).note(format!(
        "{n} one-step jobs submitted in batches of {} and run to the end before the steady \
             load; they fall due for removal together {} later; {}",
        n.min(PRELOAD_BATCH),
        ctx.steady.retention,
        reading.describe(),
    ));
    eprintln!(
        "overseer bench: steady: backlog done: {}",
        reading.describe()
    );
    Ok(with_rss(row, &reading))
}

/// The steady load, read every `--sample-every` until `--duration` has passed.
async fn run_steady(
    ctx: &Ctx,
    agent: &str,
    ran: &AtomicUsize,
    server: &ServerProcess,
    file: Option<&Path>,
) -> anyhow::Result<Vec<Row>> {
    let s = &ctx.steady;
    let stream = Stream::start(ctx, agent, s.rate as f64)?;
    let started = Instant::now();
    let outcome = async {
        let mut rows = Vec::new();
        let (mut accepted_before, mut ran_before, mut at_before) =
            (0, ran.load(Ordering::Relaxed), Instant::now());
        let markers_agent = ctx.agent("steady-markers");
        let markers = markers_per_reading(s.sample_every.as_std());
        let mut pooled = Pooled::default();
        let mut last_reading = None;
        let mut next = started + s.sample_every.as_std();
        while started.elapsed() < s.duration.as_std() {
            tokio::time::sleep_until(next).await;
            next += s.sample_every.as_std();
            let probe = Markers::start(ctx, &markers_agent, markers)
                .await?
                .run(ctx)
                .await?;
            let (accepted, leased) = (stream.accepted(), ran.load(Ordering::Relaxed));
            let window = at_before.elapsed().as_secs_f64();
            let reading = Reading::take(server, file, pruned(ctx).await?)?;
            let elapsed = started.elapsed().as_secs_f64();
            pooled.add(&probe.samples_ms, rows.is_empty(), reading.pruned);
            let row = Row::new("steady", accepted, elapsed)
                .rate(accepted)
                .latencies(probe.samples_ms)
                .note(format!(
                    "at {elapsed:.0} s: in the last {window:.0} s {:.0} jobs/s submitted \
                     (asked {}/s), {:.0} jobs/s run; retention {}; {}; latency: \
                     {markers} marker jobs, 202 → lease received",
                    rate(accepted - accepted_before, window).unwrap_or(0.0),
                    s.rate,
                    rate(leased - ran_before, window).unwrap_or(0.0),
                    s.retention,
                    reading.describe(),
                ));
            let row = with_rss(row, &reading);
            eprintln!(
                "overseer bench: steady: {} p50 {:.2} ms p99 {:.2} ms",
                row.note.as_deref().unwrap_or(""),
                row.p50_ms.unwrap_or(f64::NAN),
                row.p99_ms.unwrap_or(f64::NAN),
            );
            rows.push(row);
            last_reading = Some(reading);
            (accepted_before, ran_before, at_before) = (accepted, leased, Instant::now());
        }
        rows.extend(pooled.rows(&s.retention.to_string(), last_reading.as_ref()));
        anyhow::Ok(rows)
    }
    .await;
    let streamed = stream.stop().await;
    let rows = outcome?;
    streamed?;
    Ok(rows)
}

/// Every reading's marker latencies but the first (the server warming up), pooled by whether
/// finished jobs were being removed during the reading: one p99 over tens of thousands of
/// claims on each side, from one server process, says what removal costs the claims.
#[derive(Default)]
struct Pooled {
    removed_before: u64,
    keeping: (usize, Vec<f64>),
    removing: (usize, Vec<f64>),
}

impl Pooled {
    fn add(&mut self, samples: &[f64], first: bool, removed: u64) {
        let during = removed > self.removed_before;
        self.removed_before = removed;
        if first {
            return;
        }
        let side = match during {
            true => &mut self.removing,
            false => &mut self.keeping,
        };
        side.0 += 1;
        side.1.extend_from_slice(samples);
    }

    /// `steady_not_removing` and `steady_removing`, each where it has a reading, with the
    /// server's memory at the last reading.
    fn rows(self, retention: &str, last: Option<&Reading>) -> Vec<Row> {
        [
            ("steady_not_removing", "no job was removed", self.keeping),
            (
                "steady_removing",
                "finished jobs were being removed",
                self.removing,
            ),
        ]
        .into_iter()
        .filter(|(_, _, (readings, _))| *readings > 0)
        .map(|(scenario, what, (readings, samples))| {
            let n = samples.len();
            let row = Row::new(scenario, n, 0.0).latencies(samples).note(format!(
                "the {n} marker jobs (202 → lease received) of the {readings} readings after \
                 the first during which {what}; retention {retention}; rss_mb is the server's \
                 at the last reading"
            ));
            match last {
                Some(reading) => with_rss(row, reading),
                None => row,
            }
        })
        .collect()
    }
}

fn with_rss(mut row: Row, reading: &Reading) -> Row {
    row.rss_mb = Some((reading.rss_mb * 10.0).round() / 10.0);
    row
}

/// What one reading found.
struct Reading {
    rss_mb: f64,
    /// The SQLite file and its WAL, in MB (none on PostgreSQL).
    files_mb: Option<(f64, f64)>,
    pruned: u64,
}

impl Reading {
    fn take(server: &ServerProcess, file: Option<&Path>, pruned: u64) -> anyhow::Result<Reading> {
        let files_mb = file.map(|db| (size_mb(db), size_mb(&wal_of(db))));
        Ok(Reading {
            rss_mb: server.memory()?.rss_mb,
            files_mb,
            pruned,
        })
    }

    fn describe(&self) -> String {
        let files = match self.files_mb {
            Some((db, wal)) => format!("SQLite file {db:.1} MB, WAL {wal:.1} MB"),
            None => "store size not read (PostgreSQL)".to_string(),
        };
        format!(
            "server VmRSS {:.1} MB; {files}; {} jobs removed so far",
            self.rss_mb, self.pruned
        )
    }
}

fn wal_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

fn size_mb(path: &Path) -> f64 {
    std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / 1_048_576.0)
}

/// The server's count of removed jobs, from `GET /metrics`.
async fn pruned(ctx: &Ctx) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{}/metrics", ctx.url))
        .await
        .and_then(|r| r.error_for_status())
        .context("cannot read the server's metrics")?
        .text()
        .await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("overseer_jobs_pruned_total "))
        .context("no overseer_jobs_pruned_total in the server's metrics")?;
    let value = line.rsplit(' ').next().unwrap_or_default();
    value
        .parse::<f64>()
        .map(|v| v as u64)
        .with_context(|| format!("cannot read {line:?}"))
}
