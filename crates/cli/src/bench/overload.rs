//! `overload`: a server process under what a node reachable from a network must shrug off, while
//! a normal client goes on: 2,000 long-polls waiting at once, 200 slowloris clients dribbling
//! request headers, and 1,000 idle Faktory connections, each kept up by an attacker that
//! reconnects whatever the server closes. Measured: the normal client's request latency (one
//! `GET /v1/jobs?limit=1` after another) and the server's resident memory, idle and under load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::memory::ServerProcess;
use super::{Ctx, Row};

const LONG_POLLS: usize = 2_000;
const SLOWLORIS: usize = 200;
const IDLE_FAKTORY: usize = 1_000;
/// Normal requests measured by default.
const PROBES: usize = 300;
/// How long the attack runs before the normal client starts, so every attacker is connected.
const RAMP: Duration = Duration::from_secs(3);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    if ctx.remote {
        eprintln!("overseer bench: overload skipped: it needs a server process of its own");
        return Ok(Vec::new());
    }
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-overload-")
        .tempdir()
        .context("cannot create a temp directory")?;
    let db = format!("sqlite://{}", dir.path().join("bench.db").display());
    let faktory = free_loopback_addr()?;
    let extra = vec!["--faktory-listen".to_string(), faktory.clone()];
    let mut server = ServerProcess::spawn_with(ctx, &db, dir.path(), &extra).await?;
    let measured = measure(ctx, &server, &faktory).await;
    let stopped = server.stop().await;
    let row = measured.map_err(|e| anyhow::anyhow!("{e:#}\n{}", server.log_tail()))?;
    stopped?;
    Ok(vec![row])
}

fn free_loopback_addr() -> anyhow::Result<String> {
    let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(probe.local_addr()?.to_string())
}

async fn measure(ctx: &Ctx, server: &ServerProcess, faktory: &str) -> anyhow::Result<Row> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at_rest = server.memory()?;
    let stop = CancellationToken::new();
    let polls = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(LONG_POLLS)
        .build()?;
    for i in 0..LONG_POLLS {
        let (http, url, stop, polls) = (
            http.clone(),
            server.url.clone(),
            stop.clone(),
            polls.clone(),
        );
        tasks.spawn(long_poll(http, url, i, stop, polls));
    }
    let http_addr = server.url.trim_start_matches("http://").to_string();
    for _ in 0..SLOWLORIS {
        tasks.spawn(slowloris(http_addr.clone(), stop.clone()));
    }
    for _ in 0..IDLE_FAKTORY {
        tasks.spawn(silent(faktory.to_string(), stop.clone()));
    }
    tokio::time::sleep(RAMP).await;
    let probes = ctx.jobs.unwrap_or(PROBES);
    let normal = reqwest::Client::new();
    let mut samples = Vec::with_capacity(probes);
    for _ in 0..probes {
        let sent = Instant::now();
        let res = normal
            .get(format!("{}/v1/jobs?limit=1", server.url))
            .send()
            .await?;
        anyhow::ensure!(
            res.status().is_success(),
            "a normal request got {}",
            res.status()
        );
        res.bytes().await?;
        samples.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    let loaded = server.memory()?;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    let mut row = Row::new("overload", probes, samples.iter().sum::<f64>() / 1000.0)
        .latencies(samples)
        .note(format!(
            "{LONG_POLLS} long-polls waiting ({} answered or refused meanwhile), {SLOWLORIS} \
             slowloris clients, {IDLE_FAKTORY} idle Faktory connections, all reconnecting; \
             latency = a normal GET /v1/jobs?limit=1 one after another; rss = the server \
             process under load (idle in rss_idle_mb, peak {:.1} MB); target p99 ≤ 100 ms",
            polls.load(Ordering::Relaxed),
            loaded.peak_mb
        ));
    row.backend = "sqlite server process".to_string();
    row.rss_mb = Some(loaded.rss_mb);
    row.rss_idle_mb = Some(at_rest.rss_mb);
    Ok(row)
}

/// One long-poll after another on an agent nobody submits to.
async fn long_poll(
    http: reqwest::Client,
    url: String,
    i: usize,
    stop: CancellationToken,
    polls: Arc<AtomicU64>,
) {
    let body = serde_json::json!({"worker": format!("w{i}"), "wait": "30s"});
    while !stop.is_cancelled() {
        let req = http
            .post(format!("{url}/v1/agents/overload-idle/leases"))
            .json(&body)
            .send();
        tokio::select! {
            _ = stop.cancelled() => return,
            answer = req => {
                polls.fetch_add(1, Ordering::Relaxed);
                if answer.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Sends half a request and then a header byte now and then, reconnecting when cut off.
async fn slowloris(addr: String, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let Ok(mut s) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let _ = s.write_all(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n").await;
        let mut buf = [0u8; 256];
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    if s.write_all(b"X").await.is_err() { break; }
                }
                n = s.read(&mut buf) => if matches!(n, Ok(0) | Err(_)) { break },
            }
        }
    }
}

/// Opens a connection and says nothing, reconnecting when the server hangs up.
async fn silent(addr: String, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let Ok(mut s) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut buf = [0u8; 256];
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                n = s.read(&mut buf) => if matches!(n, Ok(0) | Err(_)) { break },
            }
        }
    }
}
