//! Deterministic simulation of Overseer.
//!
//! Runs the project's real code — the domain core (through the store), the real SQLite store on
//! a temporary file, the real HTTP router (driven with `tower::ServiceExt::oneshot`, no
//! sockets) and the real supervisor (swept by hand) — against simulated clients, agents and
//! operators, with a manual clock and one seeded random generator choosing every action and
//! every fault: lost requests and answers, duplicated, reordered and late reports, agent
//! crashes and pauses past their leases, server crashes (also between two writes of one
//! sweep), clock jumps, cancels and operator actions. After each action the jobs it touched are
//! checked against a model of everything the server answered; at the end, faults stop, the
//! jobs are drained, and every job must have finished consistently.
//!
//! A run is reproducible: one request at a time on a single-threaded runtime, ids and jitter
//! from the server's seeded generator, time from the manual clock. A failure names its seed
//! and prints the last [`trace::TRACE_KEEP`] actions with their answers.

pub mod cron;
pub mod model;
pub mod sim;
pub mod store;
pub mod trace;

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub use sim::Stats;
pub use store::Bug;

/// How big one run is.
#[derive(Clone, Debug)]
pub struct Options {
    /// Actions in the fault phase (each is one or a few requests, a sweep, a crash…).
    pub actions: usize,
    /// Jobs submitted at most.
    pub jobs: usize,
    /// A planted bug, for the simulator's self-tests only.
    pub bug: Bug,
    /// Where the SQLite files go; default `/dev/shm` when it exists, else the temp dir.
    pub dir: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            actions: 200,
            jobs: 5,
            bug: Bug::None,
            dir: None,
        }
    }
}

/// A violated invariant: the seed that finds it, what was wrong, and what led there.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub violation: String,
    pub trace: String,
    /// The command that replays it.
    pub replay: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} failed: {}", self.seed, self.violation)?;
        writeln!(f, "--- trace (last actions, oldest first) ---")?;
        write!(f, "{}", self.trace)?;
        writeln!(f, "--- seed {}: {}", self.seed, self.violation)?;
        write!(f, "replay: {}", self.replay)
    }
}

fn replay_command(seed: u64, opts: &Options) -> String {
    let mut cmd = format!("cargo run --release -p overseer-sim -- --seed {seed}");
    let default = Options::default();
    if opts.actions != default.actions {
        cmd.push_str(&format!(" --actions {}", opts.actions));
    }
    if opts.jobs != default.jobs {
        cmd.push_str(&format!(" --jobs {}", opts.jobs));
    }
    match opts.bug {
        Bug::None => {}
        Bug::StaleLeaseLookup => cmd.push_str(" --bug stale-lease"),
        Bug::LaggingReportClock => cmd.push_str(" --bug lagging-clock"),
        Bug::RescheduleRunsNow => cmd.push_str(" --bug reschedule-runs-now"),
        Bug::RoundEndsAtLastUndoLease => cmd.push_str(" --bug round-skips-undo"),
        Bug::PruneIgnoresState => cmd.push_str(" --bug prune-ignores-state"),
        Bug::RerunForgetsKept => cmd.push_str(" --bug rerun-forgets-kept"),
    }
    cmd
}

fn scratch_dir(opts: &Options) -> PathBuf {
    if let Some(d) = &opts.dir {
        return d.clone();
    }
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// Runs one seed to the end. `Ok` when every invariant held.
pub fn run_seed(seed: u64, opts: &Options) -> Result<Stats, Failure> {
    run_seed_traced(seed, opts).0
}

/// Like [`run_seed`], also returning the kept end of the trace whatever the outcome.
pub fn run_seed_traced(seed: u64, opts: &Options) -> (Result<Stats, Failure>, String) {
    let trace = Arc::new(Mutex::new(trace::Trace::default()));
    let result = run(seed, opts, &trace);
    let rendered = trace.lock().unwrap_or_else(|p| p.into_inner()).render();
    (result, rendered)
}

fn run(seed: u64, opts: &Options, trace: &Arc<Mutex<trace::Trace>>) -> Result<Stats, Failure> {
    let fail = |violation: String| Failure {
        seed,
        violation,
        trace: trace.lock().unwrap_or_else(|p| p.into_inner()).render(),
        replay: replay_command(seed, opts),
    };
    let dir = tempfile::Builder::new()
        .prefix("overseer-sim-")
        .tempdir_in(scratch_dir(opts))
        .map_err(|e| fail(format!("cannot create a scratch directory: {e}")))?;
    // One thread, so requests run one at a time in a fixed order; the runtime's own clock is
    // paused (it only serves the long-polls' `wait: 0s` timers, which then fire at once), so
    // nothing reads the wall clock on the way. The server's clock is the simulation's.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|e| fail(format!("cannot start a runtime: {e}")))?;
    let mut sim = sim::Sim::new(seed, opts.clone(), dir.path().join("sim.db"), trace.clone());
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| runtime.block_on(sim.run())));
    let mut stats = sim.stats.clone();
    drop(sim);
    drop(runtime);
    match outcome {
        Ok(Ok(())) => {
            stats.fingerprint = trace
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .fingerprint();
            Ok(stats)
        }
        Ok(Err(violation)) => Err(fail(violation)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(fail(format!("panicked: {what}")))
        }
    }
}
