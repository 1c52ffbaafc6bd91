//! `overseer status`: one job and its steps, once or redrawn until it finishes.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use overseer_core::wire::JobView;
use overseer_core::{CompPhase, Span, StepState};

use super::submit::exit_for;
use super::{connect, print_json, resolve_job};
use crate::{Output, Remote};

/// `overseer status`: the job as a table (JSON with `--output json`); with `watch`, again every
/// time it changes until it finishes, exiting as `submit --wait` does.
pub async fn status(
    remote: &Remote,
    raw: &str,
    watch: bool,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    if !watch {
        let job = client.job(id).await?;
        match output {
            Output::Json => print_json(&job)?,
            Output::Human => out!("{}", render_job(&job)),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let tty = std::io::stdout().is_terminal();
    loop {
        let job = client.wait(id, Span::from_secs(2)).await?;
        match output {
            Output::Json => outln!("{}", serde_json::to_string(&job)?),
            Output::Human => {
                if tty {
                    // Clear the screen and redraw in place.
                    out!("\x1b[2J\x1b[H");
                }
                out!("{}", render_job(&job));
            }
        }
        if job.state.is_terminal() {
            return Ok(exit_for(&job));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `status`'s view of a job: the job itself, then a row per step, each with notes under it.
pub(super) fn render_job(job: &JobView) -> String {
    let now = overseer_core::Timestamp::from_millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    );
    let mut out = job_header(job);
    out.push_str(&format!(
        "{:<20} {:<14} {:<18} {:>8} {:>5}  {:<24} {:<24}\n",
        "STEP", "AGENT", "STATE", "ATTEMPTS", "UNDOS", "STARTED", "FINISHED"
    ));
    for s in &job.steps {
        out.push_str(&step_line(s));
        out.push_str(&step_notes(s, now));
    }
    out
}

/// The lines above the steps: the job's state, its rounds, deadline and reruns, why it is
/// blocked or waiting, what was undone, and when it was created and finished.
fn job_header(job: &JobView) -> String {
    let mut out = format!("job {}  {}", job.id, job.state);
    if job.desired_state.as_str() != "succeeded" {
        out.push_str(&format!(" (desired: {})", job.desired_state));
    }
    out.push('\n');
    if let Some(rounds) = job.job_attempts {
        let then = job.job_exhausted.unwrap_or_default().as_str();
        out.push_str(&format!(
            "round: {} of {rounds} (after the last: {then})\n",
            job.round
        ));
    }
    if let Some(deadline) = job.deadline {
        out.push_str(&format!("deadline: {deadline}\n"));
    }
    if let Some(old) = job.rerun_of {
        out.push_str(&format!("rerun of: {old}\n"));
    }
    if let Some(new) = job.rerun_by {
        out.push_str(&format!("rerun as: {new}\n"));
    }
    if let Some(reason) = &job.blocked_reason {
        out.push_str(&format!("blocked: {reason}\n"));
    }
    if let Some(reason) = &job.waiting_reason {
        out.push_str(&format!("waiting: {}\n", reason.text));
    }
    if !job.compensated.is_empty() {
        out.push_str(&format!(
            "compensated (in the order undone): {}\n",
            job.compensated.join(", ")
        ));
    }
    out.push_str(&format!("created {}", job.created_at));
    if let Some(f) = job.finished_at {
        out.push_str(&format!("  finished {f}"));
    }
    out.push('\n');
    out
}

/// The indented lines under a step's row: when its next attempt comes, what it waits for, its
/// progress and its last error.
fn step_notes(s: &overseer_core::wire::StepView, now: overseer_core::Timestamp) -> String {
    let mut out = String::new();
    if let Some(next) = next_attempt(s, now) {
        out.push_str(&format!("    {next}\n"));
    }
    if let Some(reason) = &s.waiting_reason {
        out.push_str(&format!("    waiting: {}\n", reason.text));
    }
    if let Some(progress) = &s.progress {
        let at = s
            .progress_at
            .map(|t| format!(" (at {t})"))
            .unwrap_or_default();
        out.push_str(&format!("    progress: {}{at}\n", progress_text(progress)));
    }
    if let Some(err) = &s.last_error {
        out.push_str(&format!("    last error: {err}\n"));
    }
    out
}

/// A step's progress in one line: a string as it is, anything else as compact JSON, cut at 200
/// characters.
fn progress_text(progress: &serde_json::Value) -> String {
    const MAX: usize = 200;
    let text = match progress {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let line = text.replace(['\n', '\r'], " ");
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    }
}

/// One step's row of `status`: its work attempts and its undo attempts counted apart (the
/// lease counter `attempt` counts both).
fn step_line(s: &overseer_core::wire::StepView) -> String {
    let work = s.attempt.saturating_sub(s.comp_attempts);
    let attempts = match s.max_attempts {
        0 => format!("{work}/∞"),
        max => format!("{work}/{max}"),
    };
    let undos = match (&s.compensate, s.comp_attempts) {
        (None, _) => "-".to_string(),
        (Some(_), n) => n.to_string(),
    };
    let state = match s.comp_phase {
        Some(phase) => format!("{} (undo {phase})", s.state),
        None => s.state.as_str().to_string(),
    };
    format!(
        "{:<20} {:<14} {:<18} {:>8} {:>5}  {:<24} {:<24}\n",
        s.name,
        s.agent,
        state,
        attempts,
        undos,
        s.started_at.map(|t| t.to_string()).unwrap_or_default(),
        s.finished_at.map(|t| t.to_string()).unwrap_or_default(),
    )
}

/// When a step waiting out a retry backoff (or an undo's) gets its next attempt, if later than
/// `now`.
fn next_attempt(
    s: &overseer_core::wire::StepView,
    now: overseer_core::Timestamp,
) -> Option<String> {
    let waiting = matches!(s.state, StepState::Ready | StepState::Waiting)
        || s.comp_phase == Some(CompPhase::Ready);
    let at = s.next_attempt_at.filter(|at| waiting && *at > now)?;
    let what = if s.comp_phase.is_some() {
        "undo"
    } else {
        "attempt"
    };
    Some(format!(
        "next {what} at {at} (in {})",
        overseer_core::Span::from_millis((at.as_millis() - now.as_millis()).max(0) as u64)
    ))
}
