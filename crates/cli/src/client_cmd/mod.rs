//! The client commands on jobs and schedules. Data goes to stdout (JSON with `--output json`);
//! progress and chatter go to stderr.
//!
//! This module holds what the commands share (the connection to the server, a job named by a
//! prefix of its id, printing JSON and history lines); the commands live in a module each:
//! submitting and following a job, showing one, listing them, acting on one, and schedules.

use anyhow::{bail, Context};
use overseer_agent::Client;
use overseer_core::JobId;

use crate::Remote;

mod actions;
mod jobs;
mod schedules;
mod spec;
mod status;
mod submit;

pub use actions::{cancel, delete, operator, rerun, reschedule, Action, Op, When};
pub use jobs::{jobs, JobFilters};
pub use schedules::{schedules, SchedulesCmd};
pub use status::status;
pub use submit::submit;

/// A client of the server (or the cluster's nodes) `--server` names, trusting `--ca-cert` when
/// given.
pub fn connect(remote: &Remote) -> anyhow::Result<Client> {
    let ca = match &remote.ca_cert {
        Some(path) => Some(
            std::fs::read(path)
                .with_context(|| format!("cannot read --ca-cert {}", path.display()))?,
        ),
        None => None,
    };
    Client::with_ca(&remote.server, remote.token.clone(), ca.as_deref())
        .context("invalid --server URL")
}

/// A job id, or a unique prefix of one (at least 4 characters, like git): the server is asked
/// which jobs start with it, and the command goes on only when exactly one does.
pub async fn resolve_job(client: &Client, raw: &str) -> anyhow::Result<JobId> {
    if let Ok(id) = raw.parse() {
        return Ok(id);
    }
    if JobId::prefix_range(raw).is_none() {
        bail!("`{raw}` is not a job id or a prefix of one (4 or more of its first characters)");
    }
    let query = [("id_prefix", raw.to_string()), ("limit", "6".to_string())];
    let found = client.jobs_where(&query).await?.jobs;
    match found.as_slice() {
        [] => bail!("no job id starts with `{raw}`"),
        [one] => Ok(one.id),
        many => {
            let ids: Vec<String> = many.iter().take(5).map(|j| j.id.to_string()).collect();
            let more = if many.len() > 5 { ", …" } else { "" };
            bail!(
                "`{raw}` is ambiguous: it starts {}{} job ids ({}{more}); give more of it",
                if many.len() > 5 { "more than " } else { "" },
                many.len().min(5),
                ids.join(", ")
            )
        }
    }
}

/// Prints a value as indented JSON on standard output.
fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// One event of a job's history as a line (for `submit --wait` and `events`): when, what, and
/// the step, attempt and detail it has.
pub fn event_line(e: &overseer_core::Event) -> String {
    let mut line = format!("{}  {:<22}", e.at, e.kind);
    if let Some(step) = &e.step {
        line.push_str(&format!(" step={step}"));
    }
    if let Some(attempt) = e.attempt {
        line.push_str(&format!(" attempt={attempt}"));
    }
    if let Some(detail) = &e.detail {
        line.push_str(&format!(" {detail}"));
    }
    line
}
