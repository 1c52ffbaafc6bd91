//! The operator's commands beyond one job: a job's history, agents, their limits and pauses,
//! and shell completions.

use std::process::ExitCode;

use anyhow::bail;
use clap::Subcommand;
use overseer_core::wire::AgentView;
use overseer_core::Span;
use serde_json::Value;

use crate::client_cmd::{connect, resolve_job};
use crate::{Output, Remote};

/// `overseer events JOB [--follow]`: the job's history, oldest first; with `--follow`, new
/// events as they happen until the job is terminal. With `--output json`, one JSON object per
/// line (JSON lines), so the stream can be piped to `jq` event by event.
pub async fn events(
    remote: &Remote,
    raw: &str,
    follow: bool,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    let mut seen = 0;
    loop {
        let job = match follow {
            true => Some(client.wait(id, Span::from_secs(2)).await?),
            false => None,
        };
        let after = seen;
        for e in client
            .events(id)
            .await?
            .events
            .iter()
            .filter(|e| e.seq > after)
        {
            match output {
                Output::Json => outln!("{}", serde_json::to_string(e)?),
                Output::Human => outln!("{}", crate::client_cmd::event_line(e)),
            }
            seen = seen.max(e.seq);
        }
        if job.is_none_or(|j| j.state.is_terminal()) {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// `overseer agents …`.
#[derive(Subcommand, Debug)]
pub enum AgentsCmd {
    /// Each agent name: ready and running steps, limits, paused, workers and when last seen.
    List,
    /// Stop handing out leases of AGENT (running ones go on).
    Pause { agent: String },
    /// Hand out leases of AGENT again.
    Resume { agent: String },
}

pub async fn agents(
    remote: &Remote,
    command: Option<AgentsCmd>,
    output: Output,
) -> anyhow::Result<ExitCode> {
    match command.unwrap_or(AgentsCmd::List) {
        AgentsCmd::List => list_agents(remote, output).await,
        AgentsCmd::Pause { agent } => set_paused(remote, &agent, true, output).await,
        AgentsCmd::Resume { agent } => set_paused(remote, &agent, false, output).await,
    }
}

async fn list_agents(remote: &Remote, output: Output) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let list = client.agents().await?;
    let mut limits = Vec::with_capacity(list.agents.len());
    for a in &list.agents {
        limits.push(client.limits(&a.agent).await?);
    }
    if output == Output::Json {
        let rows: Vec<Value> = list
            .agents
            .iter()
            .zip(&limits)
            .map(|(a, l)| {
                let mut row = serde_json::to_value(a).unwrap_or_default();
                row["limits"] = l.clone();
                row
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<24} {:>6} {:>8} {:>12} {:>8} {:<7} {:>8}  LAST SEEN",
        "AGENT",
        "READY",
        "RUNNING",
        "CONCURRENCY",
        "RATE/S",
        "PAUSED",
        "WORKERS"
    );
    for (a, l) in list.agents.iter().zip(&limits) {
        outln!("{}", agent_row(a, l));
    }
    Ok(ExitCode::SUCCESS)
}

fn agent_row(a: &AgentView, limits: &Value) -> String {
    let or_dash = |v: &Value| match v {
        Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    format!(
        "{:<24} {:>6} {:>8} {:>12} {:>8} {:<7} {:>8}  {}",
        a.agent,
        a.ready,
        a.running,
        or_dash(&limits["max_concurrency"]),
        or_dash(&limits["rate"]),
        if limits["paused"] == Value::Bool(true) {
            "yes"
        } else {
            "no"
        },
        a.workers.len(),
        a.last_seen_at.map(|t| t.to_string()).unwrap_or_default()
    )
}

pub async fn set_paused(
    remote: &Remote,
    agent: &str,
    paused: bool,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let settings = client.set_agent_paused(agent, paused).await?;
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(&settings)?),
        Output::Human if paused => {
            outln!("agent {agent} paused: no new leases; running ones go on")
        }
        Output::Human => outln!("agent {agent} resumed"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `overseer limits …`.
#[derive(Subcommand, Debug)]
pub enum LimitsCmd {
    /// Show AGENT's limits.
    Get { agent: String },
    /// Change AGENT's limits; what is not given stays as it is.
    Set {
        agent: String,
        /// Leases in flight at most, across all workers and nodes.
        #[arg(long)]
        max_concurrency: Option<u32>,
        /// Leases started per second at most.
        #[arg(long)]
        rate: Option<f64>,
        /// Remove both limits (combine with the flags above to set new ones).
        #[arg(long)]
        clear: bool,
    },
}

pub async fn limits(
    remote: &Remote,
    command: LimitsCmd,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let settings = match command {
        LimitsCmd::Get { agent } => client.limits(&agent).await?,
        LimitsCmd::Set {
            agent,
            max_concurrency,
            rate,
            clear,
        } => {
            if !clear && max_concurrency.is_none() && rate.is_none() {
                bail!("nothing to set: give --max-concurrency, --rate or --clear");
            }
            let now = client.limits(&agent).await?;
            let keep = |v: &Value| (!clear).then(|| v.clone()).filter(|v| !v.is_null());
            let concurrency = max_concurrency.or_else(|| {
                keep(&now["max_concurrency"])
                    .and_then(|v| v.as_u64())
                    .map(|n| n as u32)
            });
            let rate = rate.or_else(|| keep(&now["rate"]).and_then(|v| v.as_f64()));
            client.set_limits(&agent, concurrency, rate).await?
        }
    };
    match output {
        Output::Json => outln!("{}", serde_json::to_string_pretty(&settings)?),
        Output::Human => {
            let show = |v: &Value| match v {
                Value::Null => "none".to_string(),
                v => v.to_string(),
            };
            outln!(
                "agent {}: max_concurrency {}, rate {}/s, paused {}",
                settings["agent"].as_str().unwrap_or_default(),
                show(&settings["max_concurrency"]),
                show(&settings["rate"]),
                settings["paused"]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `overseer completions SHELL`: the completion script on standard output.
pub fn completions(shell: clap_complete::Shell, command: &mut clap::Command) -> ExitCode {
    let name = command.get_name().to_string();
    clap_complete::generate(shell, command, name, &mut std::io::stdout());
    ExitCode::SUCCESS
}
