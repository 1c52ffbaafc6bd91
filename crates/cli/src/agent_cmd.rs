//! `overseer agent`: the command agent. Each lease runs CMD with the lease JSON on stdin; stdout
//! is the result; exit 0 is success, an exit code listed in `--fatal-exit-codes` is a fatal
//! failure, anything else a retryable one. CMD is killed at `complete_by` and nothing is
//! reported, so a late result can never land.
//!
//! The first SIGINT/SIGTERM stops taking leases and lets running commands finish; a second one
//! abandons them (they are killed, and their leases expire for another agent to take).

use std::process::ExitCode;

use clap::Args;
use overseer_agent::command::CommandAgent;
use tokio_util::sync::CancellationToken;

use crate::Remote;

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// The agent name whose steps this process runs.
    #[arg(long, env = "OVERSEER_AGENT")]
    agent: String,
    /// How many commands may run at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrency: u16,
    /// Exit codes that mean "do not retry", comma separated (e.g. `3,4`).
    #[arg(long, value_delimiter = ',')]
    fatal_exit_codes: Vec<i32>,
    /// This worker's name as the server records it (default: host name and process id).
    #[arg(long, env = "OVERSEER_WORKER")]
    worker: Option<String>,
    /// Log format: human or json.
    #[arg(long, env = "OVERSEER_LOG_FORMAT", default_value = "human")]
    log_format: String,
    #[command(flatten)]
    remote: Remote,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

/// The hidden subcommand that runs the reaper of one command's process group.
pub const REAP_COMMAND: &str = "__reap";

/// `overseer __reap`: kills its own process group when its standard input closes without the
/// agent's word to stand down, i.e. when the agent died.
pub async fn reap() -> anyhow::Result<ExitCode> {
    overseer_agent::command::reap().await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    crate::init_logging(&args.log_format);
    let client = crate::client_cmd::connect(&args.remote)?;
    let mut command = args.command.into_iter();
    let program = command.next().unwrap_or_default();
    let mut agent = CommandAgent::new(args.agent, program, command.collect());
    agent.concurrency = usize::from(args.concurrency);
    agent.fatal_exit_codes = args.fatal_exit_codes;
    if let Some(worker) = args.worker {
        agent.worker = Some(worker);
    }
    // Programs die with this process even when it is killed outright (see `reap`).
    match std::env::current_exe() {
        Ok(me) => agent.reaper = Some((me, vec![REAP_COMMAND.to_string()])),
        Err(e) => {
            tracing::warn!(error = %e, "cannot find this program's own path: commands may outlive a killed agent")
        }
    }
    let shutdown = CancellationToken::new();
    let abandon = CancellationToken::new();
    {
        let (shutdown, abandon) = (shutdown.clone(), abandon.clone());
        tokio::spawn(async move {
            crate::shutdown_signal().await;
            tracing::info!("stopping: no new leases; finishing running commands (signal again to abandon them)");
            shutdown.cancel();
            crate::shutdown_signal().await;
            tracing::warn!("abandoning running commands; their leases will expire");
            abandon.cancel();
        });
    }
    agent.run(client, shutdown, abandon).await?;
    Ok(ExitCode::SUCCESS)
}
