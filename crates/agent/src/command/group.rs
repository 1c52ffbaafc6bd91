//! Process groups: each program runs in one, so a deadline, a cancel or a dropped attempt stops
//! everything it started, and a reaper process kills the group if the agent itself dies (see
//! the `command` module's documentation).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

/// What the agent tells its reaper when a program ended normally: leave the group alone.
const STAND_DOWN: u8 = b'd';

/// A running reaper (see the module documentation): the leader of the program's process group,
/// holding the read end of a pipe whose write end is `stdin`. Dropping it closes the pipe, which
/// makes the reaper kill the group.
pub(super) struct Reaper {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    pub(super) pgid: i32,
}

impl Reaper {
    pub(super) fn spawn(program: &Path, args: &[String]) -> std::io::Result<Reaper> {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // It must outlive its handle: closing the pipe is how it learns to act.
            .kill_on_drop(false)
            .process_group(0)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other("the reaper exited at once"))?;
        let pgid = i32::try_from(pid).map_err(std::io::Error::other)?;
        let stdin = child.stdin.take();
        Ok(Reaper { child, stdin, pgid })
    }

    pub(super) fn pgid(&self) -> Option<u32> {
        u32::try_from(self.pgid).ok()
    }

    /// Tells the reaper to exit without killing anything, and reaps it.
    pub(super) async fn stand_down(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(&[STAND_DOWN]).await;
        }
        if tokio::time::timeout(Duration::from_secs(2), self.child.wait())
            .await
            .is_err()
        {
            warn!(pgid = self.pgid, "the reaper did not exit when told to");
        }
    }
}

/// The reaper's side: waits until the agent's pipe (standard input) says to stand down, or
/// closes because the agent died, and in that case kills its own process group (the program
/// and everything the program started) with SIGKILL. Signals meant for the program (a cancel's
/// SIGTERM to the group, a terminal's SIGINT or SIGHUP) are ignored: the pipe alone decides.
#[cfg(unix)]
pub async fn reap() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let _ignored = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
        signal(SignalKind::hangup())?,
    );
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf).await {
            Ok(n) if n > 0 && buf[..n].contains(&STAND_DOWN) => return Ok(()),
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
    let group = format!("-{}", std::process::id());
    std::process::Command::new("kill")
        .args(["-s", "KILL", "--", &group])
        .status()
        .map(drop)
}

/// The program's process group. While armed, dropping it kills every process in the group,
/// which is how a dropped attempt (deadline passed, agent abandoning) stops a whole tree.
pub(super) struct ProcessGroup {
    pgid: Option<u32>,
    armed: bool,
}

impl ProcessGroup {
    pub(super) fn new(pid: Option<u32>) -> Self {
        // With `process_group(0)` the group's id is the program's pid.
        ProcessGroup {
            pgid: pid,
            armed: true,
        }
    }

    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    /// `kill -s SIGNAL -- -PGID`, with nothing to read and nothing it says kept.
    fn kill(pgid: u32, signal: &str) -> std::process::Command {
        let mut kill = std::process::Command::new("kill");
        kill.args(["-s", signal, "--", &format!("-{pgid}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        kill
    }

    /// Sends `signal` to every process in the group and waits for `kill` to be done.
    pub(super) async fn signal(&self, signal: &str) {
        let Some(pgid) = self.pgid else { return };
        let sent = tokio::process::Command::from(Self::kill(pgid, signal))
            .status()
            .await;
        match sent {
            Ok(s) if s.success() => {}
            // The group may simply be gone already.
            Ok(s) => debug!(pgid, signal, status = %s, "kill found no process to signal"),
            Err(e) => warn!(pgid, signal, error = %e, "cannot run `kill`"),
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        let (Some(pgid), true) = (self.pgid, self.armed) else {
            return;
        };
        debug!(pgid, "killing the program's process group");
        // Drop cannot wait: inside a runtime, tokio reaps the `kill` process in the
        // background; outside one, wait for it (it takes a few milliseconds).
        let kill = Self::kill(pgid, "KILL");
        let spawned = if tokio::runtime::Handle::try_current().is_ok() {
            tokio::process::Command::from(kill).spawn().map(drop)
        } else {
            let mut kill = kill;
            kill.status().map(drop)
        };
        if let Err(e) = spawned {
            warn!(pgid, error = %e, "cannot run `kill`; processes the program started may live on");
        }
    }
}
