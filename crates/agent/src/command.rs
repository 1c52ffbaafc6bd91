//! The command agent: runs a program for each lease, as `overseer agent … -- CMD` does.
//!
//! For each lease the program gets the lease JSON on stdin and `OVERSEER_*` variables in its
//! environment. Its stdout is the result (JSON if it parses, else a string); exit 0 completes
//! the step; an exit code listed in `fatal_exit_codes` fails it for good; any other exit, or
//! death by a signal, fails it retryably with the exit status and the end of stderr.
//!
//! A program reports progress by writing a line `overseer:progress VALUE` to stderr
//! ([`PROGRESS_PREFIX`]; VALUE is JSON, or taken as a string when it does not parse): the next
//! heartbeat carries the last such value (see `StepContext::set_progress`). Such lines are
//! logged and kept in the stderr tail like any other.
//!
//! Each program runs in its own process group. That lets us stop the whole tree it started
//! (a shell script's children too) at the deadline, and keeps a Ctrl-C typed at the agent's
//! terminal from reaching running programs: the agent decides when they stop.
//!
//! An agent killed outright (SIGKILL, the OOM killer) runs no exit path of its own, so its
//! programs would run on beside the attempt that replaces them once the lease expires: two
//! executions of one step. A *reaper* process prevents that: when the command agent is given one
//! ([`CommandAgent::reaper`]; `overseer agent` uses its own binary, `overseer __reap`), each
//! program runs in the reaper's process group, and the reaper holds a pipe from the agent. When
//! the agent dies, by any means, the kernel closes the pipe and the reaper kills the whole group
//! at once. This needs only pipes and process groups, so it works alike on every Unix (Linux,
//! macOS, the BSDs); the command agent does not run on Windows. A program that leaves its
//! group on purpose (`setsid`, a daemon) escapes the reaper, as it escapes a deadline.
//!
//! Signals are sent with the `kill` program rather than a system call: the workspace forbids
//! `unsafe` (so no `libc::kill`), signals are rare here (a cancel, a deadline, an overflow),
//! and `kill` is on every Unix, so a new dependency such as `nix` would buy little. The
//! program's own process is in any case killed by tokio (`kill_on_drop`) without help.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use overseer_core::wire::Lease;
use overseer_core::Span;
use serde_json::Value;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::client::Client;
use crate::worker::{self, StepContext, StepError, Worker};

mod group;
mod output;

#[cfg(unix)]
pub use group::reap;
use group::{ProcessGroup, Reaper};
pub use output::parse_result;
use output::{feed_stdin, pass_stderr, read_bounded, Tail};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot run `{program}`: {reason}")]
    Program { program: String, reason: String },
    #[error(transparent)]
    Worker(#[from] worker::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The most stdout kept by default; a program writing more fails (fatally, see below).
pub const STDOUT_MAX_BYTES: usize = 1 << 20;
/// How much of the end of stderr goes into a failure's message by default.
pub const STDERR_TAIL_BYTES: usize = 4 << 10;
/// How long a program may take to stop after SIGTERM on a cancel, by default.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);
/// After the program exits, how long we still read output that a process it left behind
/// keeps open. Past that we stop reading and leave such processes alone.
const PIPE_GRACE: Duration = Duration::from_millis(500);
/// A stderr line longer than this is logged in pieces.
const STDERR_LINE_MAX: usize = 4 << 10;
/// A stderr line starting with this reports the program's progress (the rest of the line).
pub const PROGRESS_PREFIX: &str = "overseer:progress ";

/// The command agent's settings. Make one with [`CommandAgent::new`] and adjust the fields.
#[derive(Clone, Debug)]
pub struct CommandAgent {
    /// The agent name whose steps this agent runs.
    pub agent: String,
    /// The program to run, a path or a name looked up in `PATH`.
    pub program: String,
    pub args: Vec<String>,
    /// How many programs may run at once. Default 1.
    pub concurrency: usize,
    /// Exit codes that fail the step for good instead of retrying it.
    pub fatal_exit_codes: Vec<i32>,
    /// This worker's id as the server records it; default host name and process id.
    pub worker: Option<String>,
    /// How long one lease request waits on the server for work.
    pub wait: Span,
    /// The most stdout a program may write. Writing more fails the attempt without retry: the
    /// same program on the same input would most likely do it again, and such output could
    /// not be stored as a result anyway (write logs to stderr).
    pub stdout_max_bytes: usize,
    /// How much of the end of stderr goes into a failure's message.
    pub stderr_tail_bytes: usize,
    /// On a cancel, how long after SIGTERM the program is killed with SIGKILL.
    pub cancel_grace: Duration,
    /// A program and arguments that run [`reap`] (e.g. `overseer __reap`): with one, programs
    /// die with the agent even when it is killed outright. Without, they outlive a SIGKILL.
    pub reaper: Option<(PathBuf, Vec<String>)>,
}

impl CommandAgent {
    pub fn new(agent: impl Into<String>, program: impl Into<String>, args: Vec<String>) -> Self {
        CommandAgent {
            agent: agent.into(),
            program: program.into(),
            args,
            concurrency: 1,
            fatal_exit_codes: Vec::new(),
            worker: None,
            wait: worker::DEFAULT_WAIT,
            stdout_max_bytes: STDOUT_MAX_BYTES,
            stderr_tail_bytes: STDERR_TAIL_BYTES,
            cancel_grace: CANCEL_GRACE,
            reaper: None,
        }
    }

    /// Takes and runs leases until `shutdown` fires, then waits for running programs to
    /// finish and report; `abandon` kills them at once and reports nothing (their leases
    /// expire and the steps run elsewhere). Fails at once if the program cannot be found.
    pub async fn run(
        self,
        client: Client,
        shutdown: CancellationToken,
        abandon: CancellationToken,
    ) -> Result<()> {
        let resolved = find_program(&self.program).map_err(|reason| Error::Program {
            program: self.program.clone(),
            reason,
        })?;
        info!(agent = %self.agent, program = %resolved.display(), "command agent starting");
        let settings = Arc::new(Settings {
            program: resolved,
            args: self.args,
            fatal_exit_codes: self.fatal_exit_codes,
            stdout_max_bytes: self.stdout_max_bytes,
            stderr_tail_bytes: self.stderr_tail_bytes,
            cancel_grace: self.cancel_grace,
            reaper: self.reaper,
        });
        let mut builder = Worker::builder(client)
            .handler(self.agent, move |ctx: StepContext| {
                let settings = settings.clone();
                async move { run_program(&settings, ctx).await }
            })
            .concurrency(self.concurrency)
            .wait(self.wait)
            // The program gets its own grace (SIGTERM, then SIGKILL); the worker's is a
            // backstop a little longer, so the exit status can still be reported.
            .cancel_grace(self.cancel_grace + Duration::from_secs(1));
        if let Some(worker) = self.worker {
            builder = builder.worker_id(worker);
        }
        builder.build()?.run_until_abandon(shutdown, abandon).await;
        Ok(())
    }
}

/// Finds the program the way `execvp` will, so a typo is reported once at start rather than
/// as a failure of every step.
fn find_program(program: &str) -> std::result::Result<PathBuf, String> {
    if program.is_empty() {
        return Err("no program given".into());
    }
    if program.contains('/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("no such file".into()),
            Err(e) => Err(format!("cannot read it: {e}")),
            Ok(m) if m.is_dir() => Err("it is a directory".into()),
            Ok(_) if !is_executable(&path) => Err(format!(
                "it is not executable (try `chmod +x {program}`, or run it through its \
                 interpreter, e.g. `-- sh {program}`)"
            )),
            Ok(_) => Ok(path),
        };
    }
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| "not found in PATH".into())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

struct Settings {
    program: PathBuf,
    args: Vec<String>,
    fatal_exit_codes: Vec<i32>,
    stdout_max_bytes: usize,
    stderr_tail_bytes: usize,
    cancel_grace: Duration,
    reaper: Option<(PathBuf, Vec<String>)>,
}

/// How the program's run ended, before it is judged.
struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stdout_overflow: bool,
    stderr_tail: String,
    cancelled: bool,
}

/// Runs the program for one lease. Dropping this future (the deadline passed, or the agent
/// abandons its work) kills the program and every process in its group.
async fn run_program(
    settings: &Settings,
    ctx: StepContext,
) -> std::result::Result<Value, StepError> {
    let program = settings.program.display().to_string();
    let run = spawn_and_wait(settings, &ctx)
        .await
        .map_err(|e| StepError::retryable(format!("cannot run `{program}`: {e}")))?;
    judge(settings, &program, run)
}

/// Starts the program (after its reaper, when there is one), waits for it to end, then lets
/// its group and reaper go. Leaving early (an error, or this future dropped at the deadline)
/// skips that: the still-armed group and the reaper's closed pipe kill every process in it.
async fn spawn_and_wait(settings: &Settings, ctx: &StepContext) -> std::io::Result<Run> {
    let lease = ctx.lease();
    let input = serde_json::to_vec(lease).map_err(std::io::Error::other)?;
    // The reaper starts first and leads the group, so there is no instant at which the program
    // runs unguarded: if the agent dies before the program starts, the reaper kills only itself.
    let reaper = match &settings.reaper {
        Some((program, args)) => Some(Reaper::spawn(program, args)?),
        None => None,
    };
    let mut command = program_command(settings, lease, reaper.as_ref());
    let mut child = command.spawn()?;
    let mut group = ProcessGroup::new(reaper.as_ref().map_or(child.id(), |r| r.pgid()));
    debug!(pid = ?child.id(), "program started");

    let run = wait_for_program(settings, ctx, &mut child, &group, &input).await?;
    // The program ended by itself (or was stopped by `watch_program`): processes it
    // deliberately left running are its own business, not killed on the way out.
    group.disarm();
    if let Some(reaper) = reaper {
        reaper.stand_down().await;
    }
    Ok(run)
}

/// The command for one lease: the program and its arguments, the `OVERSEER_*` variables, piped
/// standard streams, and its process group (the reaper's, or a new one it leads).
fn program_command(
    settings: &Settings,
    lease: &Lease,
    reaper: Option<&Reaper>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&settings.program);
    command
        .args(&settings.args)
        .env("OVERSEER_JOB_ID", lease.job_id.to_string())
        .env("OVERSEER_STEP", &lease.step)
        .env("OVERSEER_ATTEMPT", lease.attempt.to_string())
        .env("OVERSEER_KIND", kind_name(lease.kind))
        .env(
            "OVERSEER_UNDO_ATTEMPT",
            lease
                .undo_attempt
                .map(|n| n.to_string())
                .unwrap_or_default(),
        )
        .env("OVERSEER_IDEMPOTENCY_KEY", &lease.idempotency_key)
        .env("OVERSEER_LEASE_ID", lease.lease_id.to_string())
        .env("OVERSEER_AGENT", &lease.agent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(reaper.map_or(0, |r| r.pgid));
    command
}

/// Feeds the lease to the started program, collects its stdout and the tail of its stderr
/// while passing on progress, and waits for it to exit (see [`watch_program`]).
async fn wait_for_program(
    settings: &Settings,
    ctx: &StepContext,
    child: &mut tokio::process::Child,
    group: &ProcessGroup,
    input: &[u8],
) -> std::io::Result<Run> {
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let mut out = Vec::new();
    let mut tail = Tail::new(settings.stderr_tail_bytes);
    let read_out = read_bounded(stdout, &mut out, settings.stdout_max_bytes);
    let rest = async {
        tokio::join!(
            feed_stdin(stdin, input),
            pass_stderr(stderr, &mut tail, ctx)
        );
    };
    let exit = watch_program(settings, ctx, child, group, read_out, rest).await?;
    Ok(Run {
        status: exit.status,
        stdout: out,
        stdout_overflow: exit.stdout_overflow,
        stderr_tail: tail.into_string(),
        cancelled: exit.cancelled,
    })
}

/// How [`watch_program`] saw the program end.
struct Exit {
    status: ExitStatus,
    stdout_overflow: bool,
    cancelled: bool,
}

/// Waits for the program to exit and for its pipes to close, and acts on the way: kills the
/// group when stdout overflows, sends SIGTERM on a cancel and SIGKILL when the cancel grace
/// runs out. Pipes still open [`PIPE_GRACE`] after the exit (held by something the program
/// left behind) are given up on.
async fn watch_program(
    settings: &Settings,
    ctx: &StepContext,
    child: &mut tokio::process::Child,
    group: &ProcessGroup,
    read_out: impl Future<Output = bool>,
    rest: impl Future<Output = ()>,
) -> std::io::Result<Exit> {
    tokio::pin!(read_out);
    tokio::pin!(rest);
    let mut status: Option<ExitStatus> = None;
    let mut out_done: Option<bool> = None;
    let mut rest_done = false;
    let mut pipes_by: Option<Instant> = None;
    let mut term_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        if status.is_some() {
            if out_done.is_some() && rest_done {
                break;
            }
            pipes_by.get_or_insert_with(|| Instant::now() + PIPE_GRACE);
        }
        tokio::select! {
            exited = child.wait(), if status.is_none() => status = Some(exited?),
            overflow = &mut read_out, if out_done.is_none() => {
                out_done = Some(overflow);
                if overflow && status.is_none() {
                    warn!(limit = settings.stdout_max_bytes, "the program wrote too much to stdout: killing it");
                    group.signal("KILL").await;
                    killed = true;
                }
            }
            _ = &mut rest, if !rest_done => rest_done = true,
            _ = ctx.cancelled(), if term_at.is_none() && status.is_none() => {
                info!(grace = ?settings.cancel_grace, "cancelled: sending SIGTERM to the program");
                group.signal("TERM").await;
                term_at = Some(Instant::now());
            }
            _ = sleep_until(term_at.map(|t| t + settings.cancel_grace).unwrap_or_else(Instant::now)),
                if term_at.is_some() && !killed && status.is_none() =>
            {
                info!("the program outlived its cancel grace: sending SIGKILL");
                group.signal("KILL").await;
                killed = true;
            }
            _ = sleep_until(pipes_by.unwrap_or_else(Instant::now)), if pipes_by.is_some() => {
                warn!("the program exited but something it started still holds its stdout or stderr; not waiting for it");
                break;
            }
        }
    }
    Ok(Exit {
        status: status.expect("the loop ends only after the exit"),
        stdout_overflow: out_done == Some(true),
        cancelled: term_at.is_some(),
    })
}

/// `OVERSEER_KIND`: what the lease is for.
fn kind_name(kind: overseer_core::wire::LeaseKind) -> &'static str {
    match kind {
        overseer_core::wire::LeaseKind::Work => "work",
        overseer_core::wire::LeaseKind::Compensate => "compensate",
    }
}

/// Maps the program's end to the step's result or error.
fn judge(settings: &Settings, program: &str, run: Run) -> std::result::Result<Value, StepError> {
    let with_stderr = |message: String| {
        if run.stderr_tail.is_empty() {
            message
        } else {
            format!("{message}; stderr:\n{}", run.stderr_tail)
        }
    };
    if run.stdout_overflow {
        return Err(StepError::fatal(with_stderr(format!(
            "`{program}` wrote more than {} bytes to stdout (the result); write logs to stderr",
            settings.stdout_max_bytes
        ))));
    }
    match run.status.code() {
        Some(0) => Ok(parse_result(&run.stdout)),
        Some(code) if run.cancelled => Err(StepError::fatal(with_stderr(format!(
            "`{program}` exited with code {code} after SIGTERM"
        )))),
        Some(code) if settings.fatal_exit_codes.contains(&code) => {
            Err(StepError::fatal(with_stderr(format!(
                "`{program}` exited with code {code} (listed as fatal)"
            ))))
        }
        Some(code) => Err(StepError::retryable(with_stderr(format!(
            "`{program}` exited with code {code}"
        )))),
        None => {
            use std::os::unix::process::ExitStatusExt;
            let signal = run
                .status
                .signal()
                .map_or_else(|| "?".to_string(), |s| s.to_string());
            let message = with_stderr(format!("`{program}` was killed by signal {signal}"));
            if run.cancelled {
                Err(StepError::fatal(message))
            } else {
                Err(StepError::retryable(message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the program is looked up like execvp does and a missing one is refused up front.
    #[test]
    fn programs_are_found() {
        assert!(find_program("sh").is_ok());
        assert!(find_program("/bin/sh").is_ok());
        assert!(find_program("definitely-not-a-program-xyz").is_err());
        assert!(find_program("./no/such/file").is_err());
        assert!(find_program("").is_err());
    }

    // Proves each way a program path can be unusable is told apart: missing, a directory, and a
    // file without the execute bit (which used to be reported as "no such executable file").
    #[test]
    fn unusable_programs_say_why() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("job.sh");
        std::fs::write(&script, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let path = script.to_str().expect("utf-8");
        let why = find_program(path).expect_err("not executable");
        assert!(
            why.contains("not executable") && why.contains("chmod +x"),
            "{why}"
        );
        let missing = dir.path().join("nope.sh");
        let why = find_program(missing.to_str().expect("utf-8")).expect_err("missing");
        assert_eq!(why, "no such file");
        let why = find_program(dir.path().to_str().expect("utf-8")).expect_err("a directory");
        assert_eq!(why, "it is a directory");
    }
}
