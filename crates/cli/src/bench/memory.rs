//! `memory`: the resident memory of a server process, idle and with many pending jobs.
//!
//! In-process, the RSS of `overseer bench` includes its agents and clients, so this scenario
//! spawns this executable as `overseer server` and reads the child's `/proc/<pid>/status`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use overseer_core::Timestamp;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::scenarios::{one_step, submit_jobs, wall_ms, PRELOAD_BATCH};
use super::{status_mb, Ctx, Row};

/// How long the server is left alone before each reading, so start-up and loading work (and
/// the allocator's short-lived buffers) have settled.
const SETTLE: Duration = Duration::from_secs(2);
/// How far ahead the pending jobs are due: none of them runs while measured.
const PENDING_AHEAD_MS: f64 = 30.0 * 86_400_000.0;
/// The performance issue's targets.
const IDLE_TARGET_MB: f64 = 50.0;
const PENDING_TARGET_JOBS: usize = 1_000_000;
const PENDING_TARGET_MB: f64 = 250.0;
/// How long a SIGTERM'd server may take to stop before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<Row>> {
    if ctx.remote {
        eprintln!(
            "overseer bench: memory skipped: it reads the server process's /proc status, which \
             a remote server (--server) does not expose; run it without --server"
        );
        return Ok(Vec::new());
    }
    let dir = tempfile::Builder::new()
        .prefix("overseer-bench-memory-")
        .tempdir()
        .context("cannot create a temp directory")?;
    let db = match &ctx.db {
        Some(db) => db.clone(),
        None => format!("sqlite://{}", dir.path().join("bench.db").display()),
    };
    let mut server = ServerProcess::spawn(ctx, &db, dir.path()).await?;
    let measured = measure(ctx, &server).await;
    let stopped = server.stop().await;
    let row = measured.map_err(|e| anyhow::anyhow!("{e:#}\n{}", server.log_tail()))?;
    stopped?;
    Ok(vec![row])
}

async fn measure(ctx: &Ctx, server: &ServerProcess) -> anyhow::Result<Row> {
    let n = ctx.pending;
    tokio::time::sleep(SETTLE).await;
    let idle = server.memory()?;

    let mut spec = one_step(&ctx.agent("memory"))?;
    spec.run_at = Some(Timestamp::from_millis(
        (wall_ms() + PENDING_AHEAD_MS) as i64,
    ));
    let to_child = Ctx {
        url: server.url.clone(),
        ..ctx.clone()
    };
    let load = submit_jobs(&to_child, n, n.min(PRELOAD_BATCH), move |_| spec.clone()).await?;
    tokio::time::sleep(SETTLE).await;
    let loaded = server.memory()?;

    let mut row = Row::new("memory", n, load.seconds).rate(n).note(format!(
        "separate `overseer server` process (pid {}) on {}; VmRSS idle {:.1} MB (target ≤ \
         {IDLE_TARGET_MB:.0} MB), with {n} pending delayed jobs {:.1} MB (target ≤ \
         {PENDING_TARGET_MB:.0} MB with {PENDING_TARGET_JOBS}), peak VmHWM {:.1} MB; each \
         reading after {} s idle; jobs loaded in POST /v1/jobs:batch of {} from {} clients (seconds and jobs/s are that load)",
        server.pid,
        server.backend,
        idle.rss_mb,
        loaded.rss_mb,
        loaded.peak_mb,
        SETTLE.as_secs(),
        n.min(PRELOAD_BATCH),
        ctx.clients,
    ));
    row.backend = format!("{} server process", server.backend);
    row.rss_mb = Some(round(loaded.rss_mb));
    row.rss_idle_mb = Some(round(idle.rss_mb));
    Ok(row)
}

fn round(mb: f64) -> f64 {
    (mb * 10.0).round() / 10.0
}

/// One reading of a process's memory.
pub(super) struct Memory {
    pub(super) rss_mb: f64,
    pub(super) peak_mb: f64,
}

/// `overseer server` run as a child of the bench.
pub(super) struct ServerProcess {
    child: Child,
    pid: u32,
    pub(super) url: String,
    /// The store's kind, for the note.
    backend: String,
    log: std::path::PathBuf,
}

impl ServerProcess {
    /// Starts the server on `db`, listening on a free loopback port, and waits until `/readyz`
    /// answers 200.
    async fn spawn(ctx: &Ctx, db: &str, dir: &Path) -> anyhow::Result<ServerProcess> {
        ServerProcess::spawn_with(ctx, db, dir, &[]).await
    }

    /// Like `spawn`, with more arguments for `overseer server`.
    pub(super) async fn spawn_with(
        ctx: &Ctx,
        db: &str,
        dir: &Path,
        extra: &[String],
    ) -> anyhow::Result<ServerProcess> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let ready = dir.join("ready");
        let log = dir.join("server.log");
        let stderr = std::fs::File::create(&log).context("cannot create the server log")?;
        let mut cmd = Command::new(exe);
        cmd.arg("server")
            .arg("--db")
            .arg(db)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--ready-file")
            .arg(&ready);
        if let Some(sweep) = ctx.sweep_interval {
            cmd.arg("--sweep-interval").arg(sweep.to_string());
        }
        cmd.args(extra);
        // The same defaults as the in-process servers: no settings file, no Faktory listener.
        let child = cmd
            .env_remove("OVERSEER_CONFIG")
            .env_remove("OVERSEER_FAKTORY_LISTEN")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start `overseer server`")?;
        let pid = child.id().context("the server exited at once")?;
        let mut server = ServerProcess {
            child,
            pid,
            url: String::new(),
            backend: db.split("://").next().unwrap_or(db).to_string(),
            log,
        };
        match server.wait_ready(&ready, ctx.timeout).await {
            Ok(url) => {
                server.url = url;
                Ok(server)
            }
            Err(e) => {
                let _ = server.child.kill().await;
                Err(anyhow::anyhow!("{e:#}\n{}", server.log_tail()))
            }
        }
    }

    /// Waits for the ready file (the bound address), then for `/readyz`; answers the base URL.
    async fn wait_ready(&mut self, ready: &Path, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        let http = reqwest::Client::new();
        let mut url: Option<String> = None;
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("`overseer server` exited at start ({status})");
            }
            if url.is_none() {
                if let Ok(addr) = std::fs::read_to_string(ready) {
                    url = Some(format!("http://{}", addr.trim()));
                }
            }
            if let Some(url) = &url {
                let answer = http
                    .get(format!("{url}/readyz"))
                    .timeout(Duration::from_secs(2))
                    .send()
                    .await;
                if answer.is_ok_and(|a| a.status().is_success()) {
                    return Ok(url.clone());
                }
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "`overseer server` was not ready within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(super) fn memory(&self) -> anyhow::Result<Memory> {
        let path = format!("/proc/{}/status", self.pid);
        let status = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {path} (memory needs Linux's /proc)"))?;
        let rss_mb = status_mb(&status, "VmRSS:").with_context(|| format!("no VmRSS in {path}"))?;
        Ok(Memory {
            rss_mb,
            peak_mb: status_mb(&status, "VmHWM:").unwrap_or(rss_mb),
        })
    }

    /// SIGTERM, then a wait; killed if it does not stop in time.
    pub(super) async fn stop(&mut self) -> anyhow::Result<()> {
        // std has no portable signal call and unsafe code is forbidden: ask `kill`.
        let signalled = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if signalled {
            if let Ok(status) = tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
                let status = status?;
                anyhow::ensure!(
                    status.success(),
                    "`overseer server` stopped with {status}; {}",
                    self.log_tail()
                );
                return Ok(());
            }
            tracing::warn!(
                "the memory bench's server did not stop within {STOP_GRACE:?}; killing it"
            );
        }
        self.child.kill().await?;
        Ok(())
    }

    /// The end of the server's log, for error messages.
    pub(super) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        if tail.is_empty() {
            "the server logged nothing".to_string()
        } else {
            format!("the server's log ends:\n{tail}")
        }
    }
}
