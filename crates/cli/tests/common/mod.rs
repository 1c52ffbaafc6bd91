//! A harness for end-to-end tests: real `overseer` processes (server and command agents) on
//! loopback, a temp directory per test, and waits on conditions instead of sleeps.

#![allow(dead_code)]

use std::future::Future;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_overseer");

/// Generous bound for anything a test waits for: a busy 2-core machine is slow, never this slow.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A free port on loopback for a server a test starts (or for nothing to listen on), taken from
/// below the kernel's ephemeral range. A port the kernel handed out for `bind(:0)` was free only
/// until the listener was dropped: any outgoing connection of a test running beside it could
/// take it as its local port before the server bound it ("Address already in use", seen in CI).
/// Below the ephemeral range the kernel gives out no port by itself, so a port found free here
/// stays free for the server. Each test binary starts at an offset of its own and counts up,
/// passing over ports in use.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const SPAN: u32 = 10_000;
    let Some(below) = ephemeral_low().checked_sub(SPAN) else {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        return l.local_addr().unwrap().port();
    };
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..SPAN {
        let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
        let port = u16::try_from(below + n % SPAN).expect("a port");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {below}..{}", below + SPAN);
}

/// The lowest port of the kernel's ephemeral range (`ip_local_port_range`; 32768 by default).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A server process on its own SQLite file.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    pub url: String,
    pub dir: PathBuf,
    pub db: PathBuf,
    starts: u32,
    extra: Vec<String>,
    fault: Option<String>,
    /// A store URL other than the SQLite file `db` (e.g. a shared `postgres://` database).
    db_url: Option<String>,
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        Server::start_with(dir, &[])
    }

    pub fn start_with(dir: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let mut s = Server {
            child: None,
            port,
            url: format!("http://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
            db: dir.join("overseer.db"),
            starts: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            fault: None,
            db_url: None,
        };
        s.spawn();
        s
    }

    /// A server on the store `db_url` names (e.g. one PostgreSQL database shared by several
    /// nodes, each started with a directory of its own for its logs), with extra flags.
    pub fn start_with_db(dir: &Path, db_url: &str, extra: &[&str]) -> Server {
        let port = free_port();
        let mut s = Server {
            child: None,
            port,
            url: format!("http://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
            db: dir.join("overseer.db"),
            starts: 0,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            fault: None,
            db_url: Some(db_url.to_string()),
        };
        s.spawn();
        s
    }

    /// A server with a fault-injection point armed (`OVERSEER_FAULT`); needs the binary built
    /// with the `fault-injection` feature.
    pub fn start_faulty(dir: &Path, fault: &str) -> Server {
        let port = free_port();
        let mut s = Server {
            child: None,
            port,
            url: format!("http://127.0.0.1:{port}"),
            dir: dir.to_path_buf(),
            db: dir.join("overseer.db"),
            starts: 0,
            extra: Vec::new(),
            fault: Some(fault.to_string()),
            db_url: None,
        };
        s.spawn();
        s
    }

    /// Restarts with no fault armed.
    pub fn restart_clean(&mut self) {
        self.fault = None;
        self.restart();
    }

    /// Waits for the server process to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let status = wait_child(self.child.as_mut()?, within);
        if status.is_some() {
            self.child = None;
        }
        status
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let ready = self.dir.join(format!("ready-{}", self.starts));
        let log =
            std::fs::File::create(self.dir.join(format!("server-{}.log", self.starts))).unwrap();
        let mut cmd = Command::new(BIN);
        match &self.fault {
            Some(f) => cmd.env("OVERSEER_FAULT", f),
            None => cmd.env_remove("OVERSEER_FAULT"),
        };
        let db = match &self.db_url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.db.display()),
        };
        cmd.arg("server");
        // A quick sweep unless the test sets its own.
        if !self.extra.iter().any(|a| a == "--sweep-interval") {
            cmd.args(["--sweep-interval", "200ms"]);
        }
        let child = cmd
            .arg("--db")
            .arg(db)
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--ready-file")
            .arg(&ready)
            .args(&self.extra)
            .env("RUST_LOG", "info,tower_http=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start the server");
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        while !ready.exists() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("server exited at start ({status}):\n{}", self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "server did not start:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no chance to clean up, as in a machine failure.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for a graceful exit; returns its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("server running");
        signal(c.id(), "TERM");
        wait_child(&mut c, PATIENCE).expect("server did not stop after SIGTERM")
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    pub fn logs(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.starts {
            if let Ok(text) = std::fs::read_to_string(self.dir.join(format!("server-{i}.log"))) {
                out.push_str(&format!("--- server start {i} ---\n{text}"));
            }
        }
        out
    }

    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", tail(&self.logs(), 120));
        }
        self.kill();
    }
}

/// A command agent process (`overseer agent ... -- sh -c SCRIPT`) in its own process group;
/// `kill` takes it and its commands down, like a machine dying.
pub struct Agent {
    child: Option<Child>,
    pub name: String,
    log: PathBuf,
}

impl Agent {
    pub fn start(server: &Server, agent: &str, script: &str) -> Agent {
        Agent::start_with(server, agent, &[], &["sh", "-c", script])
    }

    pub fn start_with(server: &Server, agent: &str, flags: &[&str], command: &[&str]) -> Agent {
        Agent::start_on(server, &server.url, agent, flags, command)
    }

    /// Like `start_with`, with `--server SERVERS` (e.g. a comma-separated list of nodes); logs
    /// go to `server`'s directory.
    pub fn start_on(
        server: &Server,
        servers: &str,
        agent: &str,
        flags: &[&str],
        command: &[&str],
    ) -> Agent {
        let n = std::fs::read_dir(&server.dir)
            .map(|d| d.count())
            .unwrap_or(0);
        let log_path = server.dir.join(format!("agent-{agent}-{n}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(BIN)
            .arg("agent")
            .arg("--agent")
            .arg(agent)
            .arg("--server")
            .arg(servers)
            .args(flags)
            .arg("--")
            .args(command)
            .env("RUST_LOG", "info")
            .current_dir(workspace_root())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start an agent");
        Agent {
            child: Some(child),
            name: agent.into(),
            log: log_path,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("agent running").id()
    }

    /// SIGKILL to the agent and every process it started, like the machine dying. The command
    /// agent runs each command in a process group of its own, so those groups are killed too
    /// (after freezing the agent so it cannot start another one meanwhile).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id();
            signal(pid, "STOP");
            let children = Command::new("pgrep")
                .arg("-P")
                .arg(pid.to_string())
                .output();
            if let Ok(out) = children {
                for child in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(child) = child.parse::<u32>() {
                        signal_group(child, "KILL");
                        signal(child, "KILL");
                    }
                }
            }
            signal_group(pid, "KILL");
            let _ = c.wait();
        }
    }

    /// The README walkthrough's four command agents (`examples/agents/*.sh`), on `servers`
    /// (the server's URL, or another form of it) with `flags`.
    pub fn walkthrough(server: &Server, servers: &str, flags: &[&str]) -> Vec<Agent> {
        let root = workspace_root();
        ["accounts", "dns", "storage", "deploy"]
            .iter()
            .map(|name| {
                let script = root.join(format!("examples/agents/{name}.sh"));
                Agent::start_on(server, servers, name, flags, &[script.to_str().unwrap()])
            })
            .collect()
    }

    /// SIGKILL to the agent process alone, as `kill -9 PID` does: what it started is left to the
    /// agent's own safeguards.
    pub fn kill_only(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id(), "KILL");
            let _ = c.wait();
        }
    }

    /// Sends a signal to the agent process only.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        let status = wait_child(c, within);
        if status.is_some() {
            self.child = None;
        }
        status
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- agent {} ---\n{}", self.name, tail(&self.logs(), 60));
        }
        self.kill();
    }
}

fn wait_child(c: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = c.try_wait().ok().flatten() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

pub fn signal_group(pgid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .status();
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A thin JSON-over-HTTP client that returns status and body, so tests can check error answers.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    pub fn new(base: &str) -> Api {
        Api {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(90))
                .build()
                .unwrap(),
            base: base.to_string(),
        }
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .expect("GET");
        decode(res).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("POST");
        decode(res).await
    }

    pub async fn post_put(&self, path: &str, body: &Value) -> (u16, Value) {
        let res = self
            .http
            .put(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("PUT");
        decode(res).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (u16, Value) {
        let res = self
            .http
            .patch(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("PATCH");
        decode(res).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        decode(res).await
    }

    /// Submits a job and returns its id, asserting it was accepted.
    pub async fn submit(&self, spec: &Value) -> String {
        let (status, body) = self.post("/v1/jobs", spec).await;
        assert_eq!(status, 202, "submit answered {status}: {body}");
        body["id"].as_str().unwrap().to_string()
    }

    pub async fn job(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    pub async fn events(&self, id: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/v1/jobs/{id}/events")).await;
        assert_eq!(status, 200, "{body}");
        body["events"].as_array().unwrap().clone()
    }

    /// Waits (by long-polls) until the job is terminal and returns it.
    pub async fn wait_terminal(&self, id: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, job) = self.get(&format!("/v1/jobs/{id}/wait?timeout=5s")).await;
            assert_eq!(status, 200, "{job}");
            if matches!(
                job["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                return job;
            }
            assert!(Instant::now() < deadline, "job {id} did not finish: {job}");
        }
    }
}

async fn decode(res: reqwest::Response) -> (u16, Value) {
    let status = res.status().as_u16();
    let bytes = res.bytes().await.unwrap_or_default();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, body)
}

/// Polls `check` until it returns `Some`, or panics after `PATIENCE` with `what`.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn step<'a>(job: &'a Value, name: &str) -> &'a Value {
    job["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {job}"))
}

pub fn millis(t: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(t.as_str().expect("a time"))
        .unwrap()
        .timestamp_millis()
}

/// Whether process `pid` is still running (a zombie waiting to be reaped counts as gone).
pub fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
            .unwrap_or(false),
        Err(_) => false,
    }
}
