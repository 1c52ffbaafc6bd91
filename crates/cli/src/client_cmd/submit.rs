//! `overseer submit`: sending a job spec, and with `--wait` following the job's history until
//! it finishes or is blocked, surviving a server restart on the way.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use overseer_agent::Client;
use overseer_core::wire::JobView;
use overseer_core::{CompPhase, JobId, JobState, Span, StepState};

use super::spec::read_spec;
use super::{connect, event_line, print_json};
use crate::{Output, Remote};

/// `overseer submit`: the job's id on stdout (the whole job with `--output json`); with `wait`,
/// its history on stderr as it happens and an exit status for how it ended (`exit_for`).
pub async fn submit(
    remote: &Remote,
    file: &Path,
    wait: bool,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let spec = read_spec::<overseer_core::JobSpec>(file)?;
    let client = connect(remote)?;
    let (job, created) = client.submit_value(&spec).await?;
    if !created {
        eprintln!("a job with this idempotency key already exists: {}", job.id);
    }
    if !wait {
        match output {
            Output::Json => print_json(&job)?,
            Output::Human => outln!("{}", job.id),
        }
        return Ok(ExitCode::SUCCESS);
    }
    // With `--output json` stdout carries the final job alone; the id goes to stderr.
    match output {
        Output::Json => eprintln!("{}", job.id),
        Output::Human => outln!("{}", job.id),
    }
    let job = follow(&client, job.id).await?;
    if output == Output::Json {
        print_json(&job)?;
    }
    Ok(exit_for(&job))
}

/// `submit --wait`'s exit status: 0 succeeded, 1 failed or cancelled, 3 blocked (waiting for an
/// operator). 2 is left for errors of the command itself.
pub(super) fn exit_for(job: &JobView) -> ExitCode {
    match job.state {
        JobState::Succeeded => ExitCode::SUCCESS,
        JobState::Blocked => ExitCode::from(EXIT_BLOCKED),
        _ => ExitCode::from(1),
    }
}

/// The exit status of `submit --wait` when the job is `blocked`.
const EXIT_BLOCKED: u8 = 3;

/// The longest pause between two tries to reach a server that went away.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Whether an error means "try again later" (the server is down, restarting, or cannot reach
/// its store) rather than an answer about the job.
fn is_transient(e: &overseer_agent::client::Error) -> bool {
    use overseer_agent::client::Error;
    match e {
        Error::Transport { .. } => true,
        Error::Api { status, .. } => *status == 502 || *status == 503 || *status == 504,
        _ => false,
    }
}

/// One look at the job and its history, retried with backoff while the server cannot be
/// reached (a restart, a network blip): the job goes on without us, so we keep following it.
async fn look(
    client: &Client,
    id: JobId,
) -> anyhow::Result<(JobView, overseer_core::wire::EventList)> {
    let mut delay = Duration::from_millis(100);
    let mut lost = false;
    loop {
        let got = async {
            let job = client.wait(id, Span::from_secs(1)).await?;
            let events = client.events(id).await?;
            Ok::<_, overseer_agent::client::Error>((job, events))
        }
        .await;
        match got {
            Ok(got) => {
                if lost {
                    eprintln!("reconnected to {}", client.base_url());
                }
                return Ok(got);
            }
            Err(e) if is_transient(&e) => {
                if !lost {
                    eprintln!("lost the server ({e}); reconnecting, the job goes on meanwhile");
                    lost = true;
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RECONNECT_MAX);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Prints the job's history as it happens, until it finishes or is blocked.
async fn follow(client: &Client, id: JobId) -> anyhow::Result<JobView> {
    let mut seen: i64 = 0;
    loop {
        let (job, events) = look(client, id).await?;
        let last_seen = seen;
        for e in events.events.iter().filter(|e| e.seq > last_seen) {
            eprintln!("{}", event_line(e));
            seen = seen.max(e.seq);
        }
        if job.state.is_terminal() {
            eprintln!("job {} {}", job.id, job.state);
            return Ok(job);
        }
        if job.state == JobState::Blocked {
            eprint!("{}", blocked_help(&job));
            return Ok(job);
        }
    }
}

/// What an operator can do about a blocked job, as commands to paste.
fn blocked_help(job: &JobView) -> String {
    let id = job.id;
    let mut out = format!(
        "job {id} is blocked: {}\nit waits for an operator; one of:\n",
        job.blocked_reason
            .as_deref()
            .unwrap_or("a step failed for good")
    );
    let failed = job
        .steps
        .iter()
        .filter(|s| s.state == StepState::Failed || s.comp_phase == Some(CompPhase::Failed));
    for step in failed {
        out.push_str(&format!(
            "  overseer retry {id} {name}    # a fresh attempt budget\n  overseer skip {id} {name}     # mark it skipped; dependants go on\n",
            name = step.name
        ));
    }
    out.push_str(&format!(
        "  overseer resume {id}          # retry every failed step\n  overseer cancel {id}          # give up (undoing what declares an undo)\n"
    ));
    out
}
