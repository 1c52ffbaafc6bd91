//! Acting on one job: delete and cancel it, and the operator's actions recorded in its history
//! with who and why (retry, skip, resume, rerun, reschedule).

use std::process::ExitCode;

use overseer_core::{JobState, Span, StepState, Timestamp};

use super::status::render_job;
use super::{connect, print_json, resolve_job};
use crate::{Output, Remote};

/// `overseer delete`: removes a finished job with its steps and history.
pub async fn delete(remote: &Remote, raw: &str) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    client.delete_job(id).await?;
    outln!("job {id} deleted");
    Ok(ExitCode::SUCCESS)
}

/// `overseer cancel`: asks for the job to stop; running steps hear of it on their next heartbeat.
pub async fn cancel(remote: &Remote, raw: &str, output: Output) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    let job = client.cancel(id).await?;
    match output {
        Output::Json => print_json(&job)?,
        Output::Human => {
            if job.state == JobState::Cancelled {
                outln!("job {} cancelled", job.id);
            } else {
                outln!(
                    "job {} is cancelling: running steps are told to stop on their next heartbeat",
                    job.id
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Who acts and why, recorded in the job's history.
#[derive(clap::Args, Debug, Clone)]
pub struct Action {
    /// Why (kept in the job's history).
    #[arg(long)]
    pub reason: Option<String>,
    /// Who is acting (default: $USER).
    #[arg(long, env = "USER")]
    pub by: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    pub output: Output,
}

/// An operator's action on a blocked job: a failed step (or compensation) retried or skipped,
/// or every one of them retried.
pub enum Op {
    Retry(String),
    Skip(String),
    Resume,
}

/// `overseer retry|skip|resume JOB`: does `op`, recorded with who and why, and shows the job.
pub async fn operator(
    remote: &Remote,
    raw: &str,
    op: Op,
    action: Action,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    let req = overseer_core::wire::OperatorRequest {
        by: action.by,
        reason: action.reason,
    };
    let job = match &op {
        Op::Retry(step) => client.retry_step(id, step, &req).await?,
        Op::Skip(step) => client.skip_step(id, step, &req).await?,
        Op::Resume => client.resume(id, &req).await?,
    };
    match action.output {
        Output::Json => print_json(&job)?,
        Output::Human => out!("{}", render_job(&job)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `overseer rerun`: the new job's id on stdout (the whole job with `--output json`), what it
/// kept on stderr.
pub async fn rerun(
    remote: &Remote,
    raw: &str,
    from_failed: bool,
    action: Action,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    let request = overseer_core::wire::RerunRequest {
        from_failed,
        by: action.by,
        reason: action.reason,
    };
    let job = client.rerun(id, &request).await?;
    match action.output {
        Output::Json => print_json(&job)?,
        Output::Human => {
            let kept: Vec<&str> = job
                .steps
                .iter()
                .filter(|s| s.state == StepState::Succeeded)
                .map(|s| s.name.as_str())
                .collect();
            if !kept.is_empty() {
                eprintln!("kept from job {id}: {}", kept.join(", "));
            }
            outln!("{}", job.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A new start time as given on the command line: `--at TIME|now` or `--in SPAN`.
pub struct When {
    pub at: Option<String>,
    pub in_: Option<String>,
}

impl When {
    /// The instant asked for, if any, counting `--in` and `now` from `now`.
    fn resolve(&self, now: std::time::SystemTime) -> anyhow::Result<Option<Timestamp>> {
        let now_ms = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        match (&self.at, &self.in_) {
            (Some(at), _) if at == "now" => Ok(Some(Timestamp::from_millis(now_ms))),
            (Some(at), _) => Timestamp::parse_rfc3339(at)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("--at `{at}` is not a time (RFC 3339) or `now`: {e}")),
            (None, Some(span)) => {
                let span: Span = span.parse().map_err(|e| {
                    anyhow::anyhow!("--in `{span}` is not a duration like 10m: {e}")
                })?;
                Ok(Some(Timestamp::from_millis(now_ms).plus(span)))
            }
            (None, None) => Ok(None),
        }
    }
}

/// `overseer reschedule`: a pending job's new start time and/or a job's new priority.
pub async fn reschedule(
    remote: &Remote,
    raw: &str,
    when: When,
    priority: Option<i32>,
    action: Action,
) -> anyhow::Result<ExitCode> {
    let run_at = when.resolve(std::time::SystemTime::now())?;
    if run_at.is_none() && priority.is_none() {
        anyhow::bail!("say what to change: --at, --in and/or --priority");
    }
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    let change = overseer_core::wire::RescheduleRequest {
        run_at,
        priority,
        by: action.by,
        reason: action.reason,
    };
    let job = client.reschedule(id, &change).await?;
    match action.output {
        Output::Json => print_json(&job)?,
        Output::Human => {
            let run_at = job.run_at.map_or("-".to_string(), |t| t.to_string());
            outln!(
                "job {} is {}: run_at {run_at}, priority {}",
                job.id,
                job.state,
                job.priority
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
