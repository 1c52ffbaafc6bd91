//! `overseer-sim`: runs seeds of the deterministic simulation.
//!
//! ```text
//! overseer-sim --seeds 10000            # seeds 0..10000, on every core
//! overseer-sim --seeds 500 --start 7000 # seeds 7000..7500
//! overseer-sim --seed 4242              # one seed, its trace on failure
//! ```
//!
//! Prints `seeds=N failures=0`, or each failing seed with its trace, and exits non-zero when
//! a seed fails.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use overseer_sim::{run_seed_traced, Bug, Failure, Options};

const USAGE: &str = "usage: overseer-sim [--seeds N] [--start S] [--seed S] [--actions N] [--jobs N] [--threads T] [--trace] [--bug none|stale-lease|lagging-clock|reschedule-runs-now|rerun-forgets-kept|round-skips-undo|prune-ignores-state]";

struct Args {
    start: u64,
    count: u64,
    threads: usize,
    /// Print the trace of a passing seed too (with `--seed`).
    trace: bool,
    opts: Options,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        start: 0,
        count: 100,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        trace: false,
        opts: Options::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.to_string());
        }
        if flag == "--trace" {
            args.trace = true;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || -> Result<u64, String> {
            value
                .parse()
                .map_err(|_| format!("{flag}: `{value}` is not a whole number"))
        };
        match flag.as_str() {
            "--seeds" => args.count = number()?,
            "--start" => args.start = number()?,
            "--seed" => {
                args.start = number()?;
                args.count = 1;
            }
            "--actions" => args.opts.actions = number()? as usize,
            "--jobs" => args.opts.jobs = (number()? as usize).max(1),
            "--threads" => args.threads = (number()? as usize).max(1),
            "--bug" => {
                args.opts.bug = match value.as_str() {
                    "none" => Bug::None,
                    "stale-lease" => Bug::StaleLeaseLookup,
                    "lagging-clock" => Bug::LaggingReportClock,
                    "reschedule-runs-now" => Bug::RescheduleRunsNow,
                    "round-skips-undo" => Bug::RoundEndsAtLastUndoLease,
                    "prune-ignores-state" => Bug::PruneIgnoresState,
                    "rerun-forgets-kept" => Bug::RerunForgetsKept,
                    other => return Err(format!("--bug: unknown bug `{other}`")),
                }
            }
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let next = AtomicU64::new(args.start);
    let end = args.start.saturating_add(args.count);
    let stop = AtomicBool::new(false);
    let ran = AtomicU64::new(0);
    let total = Mutex::new(overseer_sim::Stats::default());
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..args.threads.min(args.count.max(1) as usize) {
            scope.spawn(|| loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= end {
                    return;
                }
                let (outcome, trace) = run_seed_traced(seed, &args.opts);
                if args.trace && outcome.is_ok() {
                    println!("{trace}");
                }
                ran.fetch_add(1, Ordering::SeqCst);
                match outcome {
                    Ok(stats) => {
                        total.lock().unwrap_or_else(|p| p.into_inner()).add(&stats);
                        if args.count == 1 {
                            eprintln!("{stats:?}");
                        }
                    }
                    Err(f) => {
                        stop.store(true, Ordering::SeqCst);
                        failures.lock().unwrap_or_else(|p| p.into_inner()).push(f);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    failures.sort_by_key(|f| f.seed);
    for f in &failures {
        println!("{f}\n");
    }
    let ran = ran.load(Ordering::SeqCst);
    let secs = started.elapsed().as_secs_f64();
    let t = total.into_inner().unwrap_or_else(|p| p.into_inner());
    eprintln!(
        "{ran} seeds in {secs:.1} s ({:.1} seeds/s) on {} threads: {} requests, {} leases ({} undo), \
         reports {} ok / {} refused, {} server crashes, {} cancels, {} operator actions, \
         jobs {} succeeded / {} failed / {} cancelled, {} times blocked, {} steps compensated, \
         {} jobs removed after their retention",
        ran as f64 / secs.max(1e-9),
        args.threads,
        t.requests,
        t.leases,
        t.undo_leases,
        t.reports_ok,
        t.reports_refused,
        t.crashes,
        t.cancels,
        t.operator_ok,
        t.succeeded,
        t.failed,
        t.cancelled,
        t.blocked_seen,
        t.compensated_steps,
        t.pruned
    );
    let paths: Vec<String> = t.paths.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    eprintln!("paths taken: {}", paths.join("; "));
    println!("seeds={ran} failures={}", failures.len());
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
