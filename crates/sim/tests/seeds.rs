//! The simulator's budget in `cargo test`: 500 seeds of the full simulation (split in four
//! tests so the harness runs them in parallel), the seeds that once failed, proof that a seed
//! replays exactly, and proof that the checks catch planted bugs. Run more seeds with
//! `cargo run --release -p overseer-sim -- --seeds N`.

use overseer_sim::{run_seed, Bug, Options};

/// Seeds that failed once, kept so the paths they found stay covered. Each notes what it found.
const REGRESSIONS: &[u64] = &[
    // A job that fails at once (`on_failure: fail`) while another step still runs keeps that
    // step `running` until its report or lease expiry cancels it: the drain must wait for it.
    164,
    // The first seeds that caught bugs planted in a scratch copy of the core: a report from a
    // superseded attempt accepted (1), a report accepted at exactly its lease's end (454),
    // dependants readied while a dependency still runs (0), an undo leased before a dependant
    // was undone (15).
    1, 454, 0, 15,
];

fn run_range(seeds: std::ops::Range<u64>) {
    let opts = Options::default();
    for seed in seeds {
        if let Err(failure) = run_seed(seed, &opts) {
            panic!("{failure}");
        }
    }
}

// Proves every invariant holds over seeds 0..125 of the fault schedule.
#[test]
fn seeds_0_to_125() {
    run_range(0..125);
}

// Proves every invariant holds over seeds 125..250.
#[test]
fn seeds_125_to_250() {
    run_range(125..250);
}

// Proves every invariant holds over seeds 250..375.
#[test]
fn seeds_250_to_375() {
    run_range(250..375);
}

// Proves every invariant holds over seeds 375..500.
#[test]
fn seeds_375_to_500() {
    run_range(375..500);
}

// Proves the seeds that once failed pass now.
#[test]
fn regression_seeds() {
    let opts = Options::default();
    for &seed in REGRESSIONS {
        if let Err(failure) = run_seed(seed, &opts) {
            panic!("regression seed {seed}:\n{failure}");
        }
    }
}

// Proves a seed is a reproducible run: the same actions and answers at the same simulated
// times (the trace's fingerprint covers every entry), twice in a row in one process.
#[test]
fn a_seed_replays_exactly() {
    let opts = Options::default();
    for seed in [3, 77] {
        let first = run_seed(seed, &opts).unwrap_or_else(|f| panic!("{f}"));
        let second = run_seed(seed, &opts).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(first.fingerprint, second.fingerprint, "seed {seed}");
        assert_eq!(first.requests, second.requests, "seed {seed}");
        assert_eq!(first.leases, second.leases, "seed {seed}");
    }
}

/// The first seed in `0..limit` that fails with `bug` planted, and what it reported.
fn first_failure(bug: Bug, limit: u64) -> Option<(u64, String)> {
    let opts = Options {
        bug,
        ..Options::default()
    };
    (0..limit).find_map(|seed| run_seed(seed, &opts).err().map(|f| (seed, f.to_string())))
}

// Proves the checks catch a fencing bug: with lease ids resolved to the step's current attempt
// (so a stale agent's report lands on the live attempt), a seed fails well within the budget,
// naming a report accepted for a lease that is not live, with the trace and the seed.
#[test]
fn catches_reports_from_superseded_attempts() {
    let (seed, report) =
        first_failure(Bug::StaleLeaseLookup, 100).expect("the planted bug was not caught");
    assert!(report.contains("not live"), "seed {seed}: {report}");
    assert!(report.contains("--- trace"), "{report}");
    assert!(report.contains(&format!("--seed {seed}")), "{report}");
}

// Proves the checks catch reports judged by a stale clock: applied with `now` 10 s old, late
// reports and heartbeats are accepted or misdated, and a seed fails within the budget.
#[test]
fn catches_reports_judged_by_a_stale_clock() {
    let (seed, report) =
        first_failure(Bug::LaggingReportClock, 100).expect("the planted bug was not caught");
    assert!(report.contains("lease"), "seed {seed}: {report}");
}

// Proves the checks catch a reschedule that is not kept: with every move of a pending job's
// run_at turned into "now", a job is leased before the run_at the operator was answered with,
// and a seed fails within the budget.
#[test]
fn catches_a_rescheduled_job_started_early() {
    let (seed, report) =
        first_failure(Bug::RescheduleRunsNow, 100).expect("the planted bug was not caught");
    assert!(
        report.contains("before the job's run_at"),
        "seed {seed}: {report}"
    );
}

// Proves the checks catch a whole-job retry that does not undo a round: with the round's last
// undo taken as done as soon as it is leased, the next round starts with a step that succeeded
// in the round never undone, and a seed fails within the budget on the round invariant.
#[test]
fn catches_a_round_that_skips_an_undo() {
    let (seed, report) =
        first_failure(Bug::RoundEndsAtLastUndoLease, 100).expect("the planted bug was not caught");
    assert!(
        report.contains(
            "every round of a whole-job retry undoes exactly the steps that succeeded in it"
        ),
        "seed {seed}: {report}"
    );
}

// Proves the checks catch a prune that ignores state: with unfinished jobs removed once their
// own retention has passed since they were created, a job the model never saw finish is gone,
// and a seed fails within the budget naming it.
#[test]
fn catches_a_prune_of_an_unfinished_job() {
    let (seed, report) =
        first_failure(Bug::PruneIgnoresState, 100).expect("the planted bug was not caught");
    assert!(
        report.contains("nothing may be pruned while active"),
        "seed {seed}: {report}"
    );
}

// Proves the checks catch a rerun that runs kept steps again: with every rerun from failure
// stored as a plain rerun, a step that should have been kept is made ready to run again, and a
// seed fails within the budget naming the kept step.
#[test]
fn catches_a_rerun_that_runs_kept_steps_again() {
    let (seed, report) =
        first_failure(Bug::RerunForgetsKept, 100).expect("the planted bug was not caught");
    assert!(
        report.contains("never runs a kept step again"),
        "seed {seed}: {report}"
    );
}
