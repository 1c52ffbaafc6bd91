//! PostgreSQL for tests: a server to run against and a fresh database per test.
//!
//! Two modes, chosen once per test process by [`PgCluster::shared`]:
//!
//! - **External**: `OVERSEER_TEST_DATABASE_URL` names a server (a `postgres://` URL whose user
//!   may `CREATE DATABASE`). Each test gets a database of its own on it, dropped at the end.
//!   Nothing else on the server is touched.
//! - **Local**: otherwise a throw-away cluster is started from the binaries `pg_config --bindir`
//!   names (or `initdb`/`pg_ctl` on `PATH`): `initdb` in a temporary directory (trust
//!   authentication, user `postgres`), then `pg_ctl start` on a free port, listening on
//!   127.0.0.1 and a socket in that directory, with `fsync=on`. PostgreSQL refuses to run as
//!   root, so when the tests run as root the directory is handed to the `postgres` user and the
//!   binaries run through `runuser -u postgres --` (or `su postgres -c`). Each test gets a
//!   database of its own, removed with the cluster.
//!
//! If neither is possible the tests fail with a message saying what to install or set: a
//! PostgreSQL suite that silently skips would let a broken backend through CI.
//!
//! # Who stops the cluster
//!
//! One cluster serves every test of a process (initdb alone takes seconds), kept in a static.
//! Rust never drops statics and the workspace forbids the `unsafe` an `atexit` hook would need,
//! so each cluster gets a **watchdog**: a small shell process, in a process group of its own so a
//! Ctrl-C does not kill it first, that polls the test process's pid once a second and, once that
//! process is gone however it ended (success, panic, abort, `SIGKILL`), stops the cluster
//! (`pg_ctl stop -m immediate`) and removes its directory. As a second line, every cluster
//! directory records its owner's pid in `owner.pid`, and starting a cluster first stops and
//! removes any cluster under the same root whose owner is no longer running (left behind if a
//! watchdog itself was killed). Clusters live under `$TMPDIR/overseer-pgtest/`.
//!
//! Tests that stop or restart the server (fault tests) start a private cluster with
//! [`PgCluster::start_private`], stopped and removed when it is dropped (the watchdog remains as
//! a backstop).

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use tokio_postgres::NoTls;

/// The environment variable naming an external server for the tests.
pub const DATABASE_URL_VAR: &str = "OVERSEER_TEST_DATABASE_URL";

/// A PostgreSQL server for tests: external (from [`DATABASE_URL_VAR`]) or a local throw-away
/// cluster.
pub struct PgCluster {
    /// The server's URL, naming its maintenance database (`postgres`).
    url: String,
    local: Option<Local>,
}

/// A cluster this process started.
struct Local {
    /// The temporary directory holding `data/`, the socket, the log and `owner.pid`.
    dir: PathBuf,
    bindir: PathBuf,
    port: u16,
    run_as_postgres: bool,
    /// Whether dropping the `PgCluster` stops it (private clusters); the shared one is left to
    /// its watchdog.
    stop_on_drop: bool,
    /// Serialises `stop`/`start`/`restart`.
    control: Mutex<()>,
}

/// The shared cluster, or why there is none (kept, so every test fails with the reason at once
/// instead of each trying again).
static SHARED: OnceLock<Result<PgCluster, String>> = OnceLock::new();
static DATABASES: AtomicU64 = AtomicU64::new(0);

/// How a test process's clusters are reported: once, to the real stderr (not the captured one).
fn announce(line: &str) {
    let _ = writeln!(std::io::stderr(), "pgtest: {line}");
}

impl PgCluster {
    /// The cluster every test of this process shares, started (or found) on first use.
    ///
    /// Panics with an explanation when no PostgreSQL can be had.
    pub fn shared() -> &'static PgCluster {
        let shared = SHARED.get_or_init(|| match std::env::var(DATABASE_URL_VAR) {
            Ok(url) if !url.trim().is_empty() => {
                let url = url.trim().to_string();
                announce(&format!(
                    "mode external: using the server at {} (from {DATABASE_URL_VAR}); each test \
                     gets a fresh database",
                    redact(&url)
                ));
                Ok(PgCluster { url, local: None })
            }
            _ => {
                let cluster = PgCluster::start_local(false)?;
                announce(&format!(
                    "mode local: started a throw-away cluster in {} on 127.0.0.1:{} (set \
                     {DATABASE_URL_VAR} to use an existing server instead)",
                    cluster
                        .local
                        .as_ref()
                        .map_or_else(String::new, |l| l.dir.display().to_string()),
                    cluster.local.as_ref().map_or(0, |l| l.port),
                ));
                Ok(cluster)
            }
        });
        match shared {
            Ok(cluster) => cluster,
            Err(e) => panic!("{e}"),
        }
    }

    /// A cluster of its own for a test that stops or restarts the server, stopped and removed
    /// when dropped. Needs the local binaries whatever the mode: an external server cannot be
    /// restarted by a test.
    pub fn start_private() -> Result<PgCluster, String> {
        PgCluster::start_local(true)
    }

    /// Whether this is a throw-away cluster started here (else an external server).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// A URL of the server's maintenance database (`postgres`).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Creates a database with a unique name and returns its URL. It is left in place (removed
    /// with a local cluster); use [`PgCluster::database`] for one dropped at the end of a test.
    pub async fn fresh_database(&self) -> String {
        let name = self.create_database().await;
        with_database(&self.url, &name)
    }

    /// Creates a database with a unique name, for one test. On an external server it is dropped
    /// (connections and all) when the returned guard is dropped; on a local cluster it is left
    /// for the cluster's removal, as dropping a database forces a checkpoint and would add half a
    /// second to every test.
    pub async fn database(&self) -> TestDatabase {
        let name = self.create_database().await;
        TestDatabase {
            url: with_database(&self.url, &name),
            server_url: self.url.clone(),
            name,
            drop_at_end: self.local.is_none(),
        }
    }

    async fn create_database(&self) -> String {
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("overseer_test_{}_{n}_{}", std::process::id(), &nonce[..8]);
        let client = connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("pgtest: cannot connect to {}: {e}", redact(&self.url)));
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("pgtest: CREATE DATABASE {name} failed: {e}"));
        name
    }

    /// Restarts the server (`pg_ctl restart -m fast`): every connection is closed with an admin
    /// shutdown error and the server comes back on the same port. Local clusters only (on an
    /// external server, [`TestDatabase::terminate_connections`] is the nearest thing).
    pub fn restart(&self) -> Result<(), String> {
        let local = self.local_only("restart")?;
        let _guard = local.control.lock().unwrap_or_else(|p| p.into_inner());
        local.pg_ctl(&[
            "restart",
            "-m",
            "fast",
            "-w",
            "-t",
            "60",
            "-o",
            &local.server_options(),
        ])
    }

    /// Stops the server (`pg_ctl stop -m fast`). Local clusters only.
    pub fn stop(&self) -> Result<(), String> {
        let local = self.local_only("stop")?;
        let _guard = local.control.lock().unwrap_or_else(|p| p.into_inner());
        local.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])
    }

    /// Starts a stopped server again on the same port. Local clusters only.
    pub fn start(&self) -> Result<(), String> {
        let local = self.local_only("start")?;
        let _guard = local.control.lock().unwrap_or_else(|p| p.into_inner());
        local.start()
    }

    fn local_only(&self, what: &str) -> Result<&Local, String> {
        self.local
            .as_ref()
            .ok_or_else(|| format!("cannot {what} an external server"))
    }

    fn start_local(stop_on_drop: bool) -> Result<PgCluster, String> {
        let bindir = find_bindir()?;
        let run_as_postgres = running_as_root();
        if run_as_postgres && !user_exists("postgres") {
            return Err(format!(
                "pgtest: the tests run as root, which PostgreSQL refuses, and there is no \
                 `postgres` user to run it as; create one (`useradd postgres`) or set \
                 {DATABASE_URL_VAR} to a server URL"
            ));
        }
        let root = std::env::temp_dir().join("overseer-pgtest");
        std::fs::create_dir_all(&root)
            .map_err(|e| format!("pgtest: cannot create {}: {e}", root.display()))?;
        remove_stale_clusters(&root, &bindir, run_as_postgres);

        let dir = tempfile::Builder::new()
            .prefix("cluster-")
            .tempdir_in(&root)
            .map_err(|e| {
                format!(
                    "pgtest: cannot create a directory in {}: {e}",
                    root.display()
                )
            })?
            .keep();
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string())
            .map_err(|e| format!("pgtest: cannot write owner.pid: {e}"))?;
        let mut local = Local {
            dir: dir.clone(),
            bindir,
            port: 0,
            run_as_postgres,
            stop_on_drop,
            control: Mutex::new(()),
        };
        // The watchdog goes first, so even a failure below leaves nothing behind.
        local.spawn_watchdog()?;
        if run_as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir))?;
        }
        let initdb_args: Vec<String> = [
            "-D",
            &dir.join("data").display().to_string(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-instructions",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        run(&mut local.command("initdb", &initdb_args))?;

        // A free port can be taken by someone else before the server binds it: try a few.
        let mut last = String::new();
        for _ in 0..5 {
            local.port = free_port()?;
            match local.start() {
                Ok(()) => {
                    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", local.port);
                    return Ok(PgCluster {
                        url,
                        local: Some(local),
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(format!(
            "pgtest: the cluster in {} would not start: {last}",
            dir.display()
        ))
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let Some(local) = &self.local else {
            return;
        };
        if !local.stop_on_drop {
            return;
        }
        let _ = local.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "60"]);
        let _ = std::fs::remove_dir_all(&local.dir);
    }
}

impl Local {
    /// A command running one of the PostgreSQL binaries with `args`, as the `postgres` user when
    /// needed, in a process group of its own (so a Ctrl-C aimed at the tests reaches the server
    /// only through its watchdog).
    fn command(&self, program: &str, args: &[String]) -> Command {
        let path = self.bindir.join(program);
        let mut cmd = match self.as_postgres() {
            AsPostgres::No => {
                let mut c = Command::new(path);
                c.args(args);
                c
            }
            AsPostgres::Runuser => {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(path).args(args);
                c
            }
            AsPostgres::Su => {
                // `su -c` takes one shell command line.
                let line = std::iter::once(path.display().to_string())
                    .chain(args.iter().cloned())
                    .map(|a| shell_quote(&a))
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut c = Command::new("su");
                c.args(["postgres", "-s", "/bin/sh", "-c", &line]);
                c
            }
        };
        cmd.current_dir(&self.dir).process_group(0);
        cmd
    }

    fn as_postgres(&self) -> AsPostgres {
        if !self.run_as_postgres {
            AsPostgres::No
        } else if on_path("runuser") || Path::new("/usr/sbin/runuser").exists() {
            AsPostgres::Runuser
        } else {
            AsPostgres::Su
        }
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let mut all: Vec<String> = vec![
            "-D".into(),
            self.dir.join("data").display().to_string(),
            "-l".into(),
            self.dir.join("server.log").display().to_string(),
        ];
        all.extend(args.iter().map(|a| a.to_string()));
        run(&mut self.command("pg_ctl", &all)).map_err(|e| format!("{e}\n{}", self.log_tail()))
    }

    fn server_options(&self) -> String {
        format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=300",
            self.port,
            self.dir.display()
        )
    }

    fn start(&self) -> Result<(), String> {
        self.pg_ctl(&["start", "-w", "-t", "60", "-o", &self.server_options()])
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(20);
        format!("server log (last lines):\n{}", lines[from..].join("\n"))
    }

    /// Starts the process that stops the cluster and removes its directory once this test
    /// process is gone (see the module docs).
    fn spawn_watchdog(&self) -> Result<(), String> {
        let pg_ctl = shell_quote(&self.bindir.join("pg_ctl").display().to_string());
        let data = shell_quote(&self.dir.join("data").display().to_string());
        let dir = shell_quote(&self.dir.display().to_string());
        let stop_line = format!("{pg_ctl} -D {data} stop -m immediate -w");
        let stop = match self.as_postgres() {
            AsPostgres::No => stop_line,
            AsPostgres::Runuser => format!("runuser -u postgres -- {stop_line}"),
            AsPostgres::Su => format!("su postgres -s /bin/sh -c {}", shell_quote(&stop_line)),
        };
        let script = format!(
            "trap '' INT HUP; \
             while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
             if [ -f {data}/postmaster.pid ]; then {stop} >/dev/null 2>&1; fi; \
             rm -rf {dir}",
            pid = std::process::id(),
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map(|_| ())
            .map_err(|e| format!("pgtest: cannot start the cluster's watchdog: {e}"))
    }
}

/// How the PostgreSQL binaries are run.
enum AsPostgres {
    /// As whoever runs the tests.
    No,
    /// `runuser -u postgres -- …` (running as root).
    Runuser,
    /// `su postgres -c …` (running as root, no runuser).
    Su,
}

/// A database created for one test; on an external server, dropped (with `FORCE`, so leftover
/// connections do not keep it) when this guard is dropped.
pub struct TestDatabase {
    url: String,
    server_url: String,
    name: String,
    drop_at_end: bool,
}

impl TestDatabase {
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Terminates every connection to this database (each gets an admin shutdown error, as in
    /// a server restart), leaving other databases alone.
    pub fn terminate_connections(&self) -> Result<(), String> {
        let server = self.server_url.clone();
        let name = self.name.clone();
        on_own_runtime(async move {
            let client = connect(&server).await?;
            client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&name],
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

/// Runs `work` to completion on a thread with a runtime of its own: usable from `Drop` and from
/// inside another runtime, where blocking on a future is not allowed.
fn on_own_runtime<F>(work: F) -> Result<(), String>
where
    F: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(work)
    })
    .join()
    .map_err(|_| "a helper thread panicked".to_string())?
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if !self.drop_at_end {
            return;
        }
        let server = self.server_url.clone();
        let name = self.name.clone();
        let done = on_own_runtime(async move {
            let client = connect(&server).await?;
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .map_err(|e| e.to_string())
        });
        if let Err(e) = done {
            announce(&format!("could not drop database {}: {e}", self.name));
        }
    }
}

/// A store on a fresh database of the shared cluster holding `count` one-step jobs of agent
/// `a` (ids 1 to `count`, admitted at instant 0), submitted 1,000 at a time: a table of ready
/// steps for the plan tests.
pub async fn store_with_ready_steps(count: u64) -> (TestDatabase, crate::postgres::PgStore) {
    use crate::conformance::{admitted, at, job_id, spec};
    use crate::Jobs as _;
    let db = PgCluster::shared().database().await;
    let options = crate::postgres::PgOptions::new(db.url());
    let store = crate::postgres::PgStore::open(options).await.expect("open");
    let one_step = spec(serde_json::json!({"steps": [{"name": "s", "agent": "a"}]}));
    for first in (1..=count).step_by(1_000) {
        let jobs = (first..=count.min(first + 999))
            .map(|n| admitted(job_id(n), &one_step, at(0)))
            .collect();
        store.jobs_submit(jobs).await.expect("submit");
    }
    (db, store)
}

/// A plain connection (driven by a task of its own) for the tests' administrative statements.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The plan PostgreSQL caches for `sql` once it settles on a generic plan, as every pooled
/// connection may: planned without the parameters' values (`params` of them, all passed as
/// NULL), so a plan that looks right for the values at hand may not be the one kept.
pub async fn generic_plan(client: &tokio_postgres::Client, sql: &str, params: usize) -> String {
    client
        .batch_execute(&format!(
            "SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; PREPARE w AS {sql}"
        ))
        .await
        .expect("prepare");
    let nulls = vec!["NULL"; params].join(", ");
    let rows = client
        .query(&format!("EXPLAIN (COSTS OFF) EXECUTE w({nulls})"), &[])
        .await
        .expect("explain");
    rows.iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `url` with its database (path) replaced by `name`. URL form only (`postgres://…`).
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{server}/{name}?{q}"),
        None => format!("{server}/{name}"),
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

fn find_bindir() -> Result<PathBuf, String> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if dir.join("initdb").exists() && dir.join("pg_ctl").exists() {
                return Ok(dir);
            }
        }
    }
    // No pg_config (or it names a directory without the server): take initdb from PATH.
    if let Some(initdb) = which("initdb") {
        if let Some(dir) = initdb.parent() {
            if dir.join("pg_ctl").exists() {
                return Ok(dir.to_path_buf());
            }
        }
    }
    Err(format!(
        "pgtest: no PostgreSQL to test against. Either set {DATABASE_URL_VAR} to a server URL \
         (e.g. postgres://postgres@127.0.0.1:5432/postgres; each test creates and drops a database \
         on it), or install the PostgreSQL server binaries (`initdb`, `pg_ctl`, found through \
         `pg_config --bindir` or PATH; on Debian: apt-get install postgresql). The PostgreSQL \
         tests never skip themselves."
    ))
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn on_path(program: &str) -> bool {
    which(program).is_some()
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg("-u")
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("pgtest: cannot find a free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("pgtest: cannot find a free port: {e}"))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("pgtest: cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "pgtest: {cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Stops and removes clusters under `root` whose owning test process is gone. A directory
/// without `owner.pid` is being set up by a live process, unless it is more than an hour old.
fn remove_stale_clusters(root: &Path, bindir: &Path, run_as_postgres: bool) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let stale = match std::fs::read_to_string(dir.join("owner.pid")) {
            Ok(pid) => !process_alive(pid.trim()),
            Err(_) => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > Duration::from_secs(3600)),
        };
        if !stale {
            continue;
        }
        if dir.join("data").join("postmaster.pid").exists() {
            let local = Local {
                dir: dir.clone(),
                bindir: bindir.to_path_buf(),
                port: 0,
                run_as_postgres,
                stop_on_drop: false,
                control: Mutex::new(()),
            };
            let _ = local.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
        }
        let _ = std::fs::remove_dir_all(&dir);
        announce(&format!(
            "removed a stale cluster left by an earlier run: {}",
            dir.display()
        ));
    }
}

fn process_alive(pid: &str) -> bool {
    if pid.is_empty() || !pid.chars().all(|c| c.is_ascii_digit()) {
        return false;
    }
    if Path::new("/proc/self").exists() {
        return Path::new("/proc").join(pid).exists();
    }
    Command::new("kill")
        .args(["-0", pid])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves database names are swapped into URLs with and without a path or a query.
    #[test]
    fn urls_get_the_database_swapped() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/postgres", "x"),
            "postgres://u:p@h:5432/x"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(
            with_database("postgresql://h:1/db?sslmode=disable", "x"),
            "postgresql://h:1/x?sslmode=disable"
        );
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
