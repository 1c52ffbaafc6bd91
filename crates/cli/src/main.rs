//! The `overseer` binary: a server node, the client commands, and the command agent.

/// `println!` for data on standard output, as an error instead of a panic when the reader went
/// away (`overseer jobs | head -1`): `main` ends quietly on a broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// `print!` with the same care as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        write!(stdout, $($arg)*)?;
        stdout.flush()?
    }};
}

mod agent_cmd;
mod bench;
mod client_cmd;
mod ops_cmd;
mod server_cmd;
mod tokens_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "overseer",
    version,
    about = "A durable job scheduler: submit DAG jobs, run agents, let the supervisor heal the rest."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Where the client commands send their requests.
#[derive(Args, Debug, Clone)]
pub struct Remote {
    /// The server's base URL, or a comma-separated list of a cluster's nodes to fail over between.
    #[arg(
        long,
        global = true,
        env = "OVERSEER_SERVER",
        default_value = "http://127.0.0.1:7433"
    )]
    pub server: String,
    /// A bearer token sent with every request.
    #[arg(long, global = true, env = "OVERSEER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PEM certificate to trust for an `https://` server (its own, or its CA's).
    #[arg(long, global = true, env = "OVERSEER_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

/// How a command prints what it found.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Output {
    #[default]
    Human,
    Json,
}

/// The subcommands, in the order `--help` lists them. Some of one kind are grouped in an enum of
/// their own, flattened in here: they stay commands of `overseer` itself, and each group's `run`
/// dispatches them.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a server node.
    Server(server_cmd::ServerArgs),
    #[command(flatten)]
    Jobs(JobCmd),
    #[command(flatten)]
    AgentNames(AgentNameCmd),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// API tokens: create (the secret is printed once), list, revoke.
    Tokens {
        #[command(subcommand)]
        command: tokens_cmd::TokensCmd,
        #[arg(long, value_enum, default_value_t, global = true)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print the key deliveries are signed with, when the server generated it (admin).
    WebhookSecret {
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    #[command(flatten)]
    Actions(ActionCmd),
    /// Manage cron schedules.
    Schedules {
        #[command(subcommand)]
        command: client_cmd::SchedulesCmd,
        #[arg(long, value_enum, default_value_t, global = true)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Run a command agent: each lease of AGENT runs CMD with the lease JSON on stdin.
    Agent(agent_cmd::AgentArgs),
    /// Measure throughput and latency with real agents over HTTP (in-process server by default).
    Bench(bench::BenchArgs),
    /// Internal: guards one command of `overseer agent` (kills its process group if the agent dies).
    #[command(name = "__reap", hide = true)]
    Reap,
}

/// Submitting, showing and listing jobs, and a job's history.
#[derive(Subcommand, Debug)]
enum JobCmd {
    /// Submit a job spec (JSON or YAML) from a file or `-` for standard input; prints the job id.
    Submit {
        file: PathBuf,
        /// Follow the job's progress and exit 0 only if it succeeds.
        #[arg(long)]
        wait: bool,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a job and its steps.
    Status {
        job: String,
        /// Keep showing it until it finishes.
        #[arg(long)]
        watch: bool,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// List jobs, newest first.
    Jobs {
        #[command(flatten)]
        filters: client_cmd::JobFilters,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a job's history, oldest first; `--follow` streams new events until it finishes.
    Events {
        job: String,
        #[arg(long)]
        follow: bool,
        /// `json` prints one JSON object per line.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
}

/// Agent names: their work, limits and pauses.
#[derive(Subcommand, Debug)]
enum AgentNameCmd {
    /// Agent names and their work; `agents pause|resume NAME`.
    Agents {
        #[command(subcommand)]
        command: Option<ops_cmd::AgentsCmd>,
        #[arg(long, value_enum, default_value_t, global = true)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show or change an agent name's limits (concurrency across all workers, rate).
    Limits {
        #[command(subcommand)]
        command: ops_cmd::LimitsCmd,
        #[arg(long, value_enum, default_value_t, global = true)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Stop handing out leases of an agent name (running ones go on); undo with
    /// `overseer resume --agent NAME`.
    Pause {
        agent: String,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
}

/// Acting on one job: removing or cancelling it, and the operator's actions.
#[derive(Subcommand, Debug)]
enum ActionCmd {
    /// Remove a finished job now, with its steps and history (as its retention would later).
    Delete {
        job: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Ask for a job to be cancelled.
    Cancel {
        job: String,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
        #[command(flatten)]
        remote: Remote,
    },
    /// Give a failed step (or its failed compensation) of a blocked job a fresh attempt budget.
    Retry {
        job: String,
        step: String,
        #[command(flatten)]
        action: client_cmd::Action,
        #[command(flatten)]
        remote: Remote,
    },
    /// Mark a failed step (or its failed compensation) of a blocked job as skipped.
    Skip {
        job: String,
        step: String,
        #[command(flatten)]
        action: client_cmd::Action,
        #[command(flatten)]
        remote: Remote,
    },
    /// Resume a blocked job (every failed step and compensation gets a fresh budget), or with
    /// `--agent NAME` a paused agent name.
    Resume {
        #[arg(required_unless_present = "agent")]
        job: Option<String>,
        /// Resume this paused agent name instead of a job.
        #[arg(long, conflicts_with = "job")]
        agent: Option<String>,
        #[command(flatten)]
        action: client_cmd::Action,
        #[command(flatten)]
        remote: Remote,
    },
    /// Run a failed or cancelled job again as a new job (same spec, linked by `rerun_of`);
    /// prints the new job's id. A job is rerun at most once.
    Rerun {
        job: String,
        /// Keep the steps that succeeded (with their results) instead of running everything.
        #[arg(long)]
        from_failed: bool,
        #[command(flatten)]
        action: client_cmd::Action,
        #[command(flatten)]
        remote: Remote,
    },
    /// Move a pending job (`--at TIME|now` or `--in 10m`) and/or set a job's priority
    /// (`--priority N`, pending or running jobs).
    Reschedule {
        job: String,
        /// When the job may start: an RFC 3339 time, or `now`.
        #[arg(long, conflicts_with = "in_")]
        at: Option<String>,
        /// When the job may start, from now: `90s`, `10m`, `2h`.
        #[arg(long = "in")]
        in_: Option<String>,
        /// The job's new priority (higher is claimed first).
        #[arg(long, allow_hyphen_values = true)]
        priority: Option<i32>,
        #[command(flatten)]
        action: client_cmd::Action,
        #[command(flatten)]
        remote: Remote,
    },
}

/// Turns transparent huge pages off for this process, before any thread starts; the server and
/// the benchmark call it, never a command that runs other programs (children inherit it).
///
/// mimalloc asks for huge pages on its arenas, and large buffers (a batch's request body, the
/// column arrays of a PostgreSQL statement) come and go: each first touch of an area mimalloc
/// had returned to the system then faulted in and zeroed a whole 2 MiB page. In a profile of
/// batch submits on PostgreSQL that zeroing took a quarter of the machine, and switching huge
/// pages off made them 38 % faster (BENCHMARKS.md, twenty-first session). Failing to
/// switch them off (an old kernel, a sandbox) only forgoes that, so the error is not reported.
fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// mimalloc instead of the system allocator: the server's many small short-lived allocations
/// (request bodies, JSON values, rows) are cheaper, and memory freed after a burst of large
/// requests goes back to the OS instead of staying in the process's arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Cmd::Server(_) | Cmd::Bench(_)) {
        without_huge_pages();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli.command.run()) {
        Ok(code) => code,
        // The reader of our output went away (`| head`): nothing is wrong, nothing to say.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", describe_error(&e));
            ExitCode::from(2)
        }
    }
}

impl Cmd {
    /// Runs the command to its exit status; `main` reports an error.
    async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            Cmd::Server(args) => server_cmd::run(args).await,
            Cmd::Jobs(command) => command.run().await,
            Cmd::AgentNames(command) => command.run().await,
            Cmd::Completions { shell } => Ok(ops_cmd::completions(shell, &mut Cli::command())),
            Cmd::Tokens {
                command,
                output,
                remote,
            } => tokens_cmd::run(&remote, command, output).await,
            Cmd::WebhookSecret { output, remote } => {
                tokens_cmd::webhook_secret(&remote, output).await
            }
            Cmd::Actions(command) => command.run().await,
            Cmd::Schedules {
                command,
                output,
                remote,
            } => client_cmd::schedules(&remote, command, output).await,
            Cmd::Agent(args) => agent_cmd::run(args).await,
            Cmd::Bench(args) => bench::run(args).await,
            Cmd::Reap => agent_cmd::reap().await,
        }
    }
}

impl JobCmd {
    /// Runs a job command (the client's, or `ops_cmd`'s for a job's history).
    async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            JobCmd::Submit {
                file,
                wait,
                output,
                remote,
            } => client_cmd::submit(&remote, &file, wait, output).await,
            JobCmd::Status {
                job,
                watch,
                output,
                remote,
            } => client_cmd::status(&remote, &job, watch, output).await,
            JobCmd::Jobs {
                filters,
                output,
                remote,
            } => client_cmd::jobs(&remote, filters, output).await,
            JobCmd::Events {
                job,
                follow,
                output,
                remote,
            } => ops_cmd::events(&remote, &job, follow, output).await,
        }
    }
}

impl AgentNameCmd {
    /// Runs an agent-name command (`ops_cmd`).
    async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            AgentNameCmd::Agents {
                command,
                output,
                remote,
            } => ops_cmd::agents(&remote, command, output).await,
            AgentNameCmd::Limits {
                command,
                output,
                remote,
            } => ops_cmd::limits(&remote, command, output).await,
            AgentNameCmd::Pause {
                agent,
                output,
                remote,
            } => ops_cmd::set_paused(&remote, &agent, true, output).await,
        }
    }
}

impl ActionCmd {
    /// Runs an action on a job, or with `resume --agent` resumes an agent name instead.
    async fn run(self) -> anyhow::Result<ExitCode> {
        use client_cmd::Op;
        match self {
            ActionCmd::Delete { job, remote } => client_cmd::delete(&remote, &job).await,
            ActionCmd::Cancel {
                job,
                output,
                remote,
            } => client_cmd::cancel(&remote, &job, output).await,
            ActionCmd::Retry {
                job,
                step,
                action,
                remote,
            } => client_cmd::operator(&remote, &job, Op::Retry(step), action).await,
            ActionCmd::Skip {
                job,
                step,
                action,
                remote,
            } => client_cmd::operator(&remote, &job, Op::Skip(step), action).await,
            ActionCmd::Resume {
                agent: Some(agent),
                remote,
                ..
            } => ops_cmd::set_paused(&remote, &agent, false, Output::Human).await,
            ActionCmd::Resume {
                job,
                action,
                remote,
                ..
            } => {
                let job = job.unwrap_or_default();
                client_cmd::operator(&remote, &job, Op::Resume, action).await
            }
            ActionCmd::Rerun {
                job,
                from_failed,
                action,
                remote,
            } => client_cmd::rerun(&remote, &job, from_failed, action).await,
            ActionCmd::Reschedule {
                job,
                at,
                in_,
                priority,
                action,
                remote,
            } => {
                let when = client_cmd::When { at, in_ };
                client_cmd::reschedule(&remote, &job, when, priority, action).await
            }
        }
    }
}

/// Installs the log subscriber: human-readable by default, JSON lines on request. `RUST_LOG`
/// overrides the level (default `info`).
pub fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(
            std::env::var_os("NO_COLOR").is_none()
                && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        );
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// One line for an error: its message and the causes that add something to it (error types
/// often repeat their source's text in their own), plus a hint when the server cannot be
/// reached.
fn describe_error(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        // A transport error already names the URL and the root cause; what lies under it would
        // only say the same again.
        let transport = matches!(
            cause.downcast_ref::<overseer_agent::client::Error>(),
            Some(overseer_agent::client::Error::Transport { .. })
        );
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        if transport {
            break;
        }
    }
    let unreachable = e.chain().any(|c| {
        matches!(
            c.downcast_ref::<overseer_agent::client::Error>(),
            Some(overseer_agent::client::Error::Transport { .. })
        )
    });
    if unreachable {
        line.push_str(
            "\nhint: is the server running? Start one with `overseer server`, or point at \
             another with --server URL or OVERSEER_SERVER",
        );
    }
    line
}
