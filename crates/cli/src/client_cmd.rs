//! The client commands: submit, status, jobs, cancel. Data goes to stdout (JSON with
//! `--output json`); progress and chatter go to stderr.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use overseer_agent::Client;
use overseer_core::wire::JobView;
use overseer_core::{CompPhase, JobId, JobState, Span, StepState, Timestamp};
use serde_json::{json, Value};

use crate::{Output, Remote};

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

/// Reads a spec (a job, or a schedule: `T`) as JSON, or as YAML when it does not look like
/// JSON, and checks it decodes as a `T` here first, so a mistake is reported at its line and
/// column in the user's own file, with the field's path. The server still judges the rest
/// (dependencies, limits), naming fields by path.
fn read_spec<T: serde::de::DeserializeOwned>(file: &Path) -> anyhow::Result<Value> {
    let text = read_text(file)?;
    let name = file.display();
    if looks_json(&text) {
        let de = &mut serde_json::Deserializer::from_str(&text);
        if let Err(e) = serde_path_to_error::deserialize::<_, T>(de) {
            bail!("{name}: {}", located(e.path(), e.inner()));
        }
        return Ok(serde_json::from_str(&text)?);
    }
    let de = serde_yaml::Deserializer::from_str(&text);
    if let Err(e) = serde_path_to_error::deserialize::<_, T>(de) {
        bail!("{name}: {}", located(e.path(), e.inner()));
    }
    yaml_to_json(&text)
}

fn read_text(file: &Path) -> anyhow::Result<String> {
    let mut text = String::new();
    if file == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the spec from standard input")?;
    } else {
        text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
    }
    Ok(text)
}

fn looks_json(text: &str) -> bool {
    text.trim_start().starts_with(['{', '['])
}

fn yaml_to_json(text: &str) -> anyhow::Result<Value> {
    let yaml: serde_yaml::Value = serde_yaml::from_str(text)?;
    serde_json::to_value(yaml).context("the YAML does not map to JSON (non-string keys?)")
}

/// A document as JSON (or YAML), its syntax checked but not its fields.
fn read_document(file: &Path) -> anyhow::Result<Value> {
    let text = read_text(file)?;
    let name = file.display();
    let value = if looks_json(&text) {
        serde_json::from_str(&text).with_context(|| format!("{name} is not valid JSON"))?
    } else {
        yaml_to_json(&text).with_context(|| format!("{name} is not valid YAML"))?
    };
    Ok(value)
}

/// `field: message` for a spec that does not decode, or the message alone when the problem is
/// the document's syntax rather than one field.
fn located(path: &serde_path_to_error::Path, message: &dyn std::fmt::Display) -> String {
    match path.to_string().as_str() {
        "." | "" => message.to_string(),
        field => format!("{field}: {message}"),
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

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
fn exit_for(job: &JobView) -> ExitCode {
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

fn render_job(job: &JobView) -> String {
    let now = overseer_core::Timestamp::from_millis(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    );
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
    out.push_str(&format!(
        "{:<20} {:<14} {:<18} {:>8} {:>5}  {:<24} {:<24}\n",
        "STEP", "AGENT", "STATE", "ATTEMPTS", "UNDOS", "STARTED", "FINISHED"
    ));
    for s in &job.steps {
        out.push_str(&step_line(s));
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

/// What `overseer jobs` asks for.
#[derive(clap::Args, Debug, Clone)]
pub struct JobFilters {
    /// Only jobs in this state.
    #[arg(long)]
    pub state: Option<String>,
    /// A label filter `key:value`; repeat to require several.
    #[arg(long)]
    pub label: Vec<String>,
    /// Only jobs with a step run by this agent name.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only jobs created since then: a time (RFC 3339) or an age (`2h`, `30m`, `7d`).
    #[arg(long)]
    pub since: Option<String>,
    /// Only jobs created before then: a time (RFC 3339) or an age (`2h`, `30m`, `7d`).
    #[arg(long)]
    pub until: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Continue from a `next_cursor` printed by an earlier call.
    #[arg(long)]
    pub cursor: Option<String>,
}

impl JobFilters {
    fn query(&self, now: std::time::SystemTime) -> anyhow::Result<Vec<(&'static str, String)>> {
        let mut q = Vec::new();
        if let Some(s) = &self.state {
            if JobState::parse(s).is_none() {
                bail!("`{s}` is not a job state");
            }
            q.push(("state", s.clone()));
        }
        q.extend(self.label.iter().map(|l| ("label", l.clone())));
        if let Some(a) = &self.agent {
            q.push(("agent", a.clone()));
        }
        if let Some(t) = &self.since {
            q.push(("since", when("--since", t, now)?));
        }
        if let Some(t) = &self.until {
            q.push(("until", when("--until", t, now)?));
        }
        q.push(("limit", self.limit.to_string()));
        if let Some(c) = &self.cursor {
            q.push(("cursor", c.clone()));
        }
        Ok(q)
    }
}

/// An RFC 3339 time as given, or an age (`2h`) as the time that long before `now`.
fn when(flag: &str, raw: &str, now: std::time::SystemTime) -> anyhow::Result<String> {
    if overseer_core::Timestamp::parse_rfc3339(raw).is_ok() {
        return Ok(raw.to_string());
    }
    let age: Span = raw.parse().map_err(|e| {
        anyhow::anyhow!("{flag} `{raw}` is neither a time (RFC 3339) nor an age like 2h: {e}")
    })?;
    let now_ms = now
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    Ok(overseer_core::Timestamp::from_millis(now_ms - age.as_millis() as i64).to_string())
}

pub async fn jobs(
    remote: &Remote,
    filters: JobFilters,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let query = filters.query(std::time::SystemTime::now())?;
    let client = connect(remote)?;
    let list = client.jobs_where(&query).await?;
    match output {
        Output::Json => print_json(&list)?,
        Output::Human => {
            outln!(
                "{:<38} {:<12} {:<26} {:>5}  LABELS",
                "ID",
                "STATE",
                "CREATED",
                "STEPS"
            );
            for j in &list.jobs {
                let labels: Vec<String> =
                    j.labels.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                outln!(
                    "{:<38} {:<12} {:<26} {:>5}  {}",
                    j.id.to_string(),
                    j.state.as_str(),
                    j.created_at.to_string(),
                    j.steps.len(),
                    labels.join(",")
                );
            }
            if let Some(c) = &list.next_cursor {
                eprintln!("more: --cursor {c}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn delete(remote: &Remote, raw: &str) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let id = resolve_job(&client, raw).await?;
    client.delete_job(id).await?;
    outln!("job {id} deleted");
    Ok(ExitCode::SUCCESS)
}

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

pub enum Op {
    Retry(String),
    Skip(String),
    Resume,
}

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

#[derive(clap::Subcommand, Debug)]
pub enum SchedulesCmd {
    /// Create a schedule from a spec file (JSON or YAML; `-` for standard input):
    /// `{name, cron, timezone?, job, overlap?: skip|allow, misfire?: once|skip|all}`.
    Create { file: std::path::PathBuf },
    /// List schedules.
    List,
    /// Show one schedule.
    Get { name: String },
    /// Replace a schedule's definition (cron, timezone, job, overlap, misfire) in one step: from
    /// a spec file as for `create` (its `name` may be left out), or the stored definition with
    /// the flags given applied. The next due time counts from now under the new pattern (a
    /// paused schedule stays paused); a due time that already fired never fires again.
    Update {
        name: String,
        /// The new definition (JSON or YAML; `-` for standard input). Without it, the stored
        /// definition is changed by the flags.
        file: Option<std::path::PathBuf>,
        /// A 5- or 6-field pattern, or @hourly, @daily, @weekly, @monthly, @yearly.
        #[arg(long)]
        cron: Option<String>,
        /// An IANA time zone name (e.g. Europe/Berlin).
        #[arg(long)]
        timezone: Option<String>,
        #[arg(long, value_parser = ["skip", "allow"])]
        overlap: Option<String>,
        #[arg(long, value_parser = ["once", "skip", "all"])]
        misfire: Option<String>,
    },
    /// Delete a schedule (jobs it already created are not touched).
    Delete { name: String },
    /// Stop firing until resumed.
    Pause { name: String },
    /// Fire again, from the next due time after now.
    Resume { name: String },
}

/// The definition `schedules update` sends: the file's (its `name` filled in when left out), or
/// the stored one; then each flag given replaces its field. Checked as a `ScheduleSpec` here, so
/// a mistake names its field before anything is sent.
async fn replacement(
    client: &Client,
    name: &str,
    file: Option<&Path>,
    flags: [(&str, Option<String>); 4],
) -> anyhow::Result<Value> {
    let changed = flags.iter().any(|(_, v)| v.is_some());
    let mut spec = match file {
        Some(file) => read_document(file)?,
        None if changed => {
            let stored = client.schedule(name).await?;
            let mut spec = serde_json::Map::new();
            for field in ["name", "cron", "timezone", "overlap", "misfire", "job"] {
                spec.insert(field.to_string(), stored[field].clone());
            }
            Value::Object(spec)
        }
        None => {
            bail!("give a spec file, or at least one of --cron, --timezone, --overlap, --misfire")
        }
    };
    let Some(fields) = spec.as_object_mut() else {
        bail!("the spec must be an object with `cron` and `job`");
    };
    match fields.get("name") {
        None => {
            fields.insert("name".into(), json!(name));
        }
        Some(given) if given != name => {
            bail!("name: the spec names {given}, not the schedule `{name}` being replaced")
        }
        Some(_) => {}
    }
    for (field, value) in flags {
        if let Some(v) = value {
            fields.insert(field.to_string(), json!(v));
        }
    }
    if let Err(e) =
        serde_path_to_error::deserialize::<_, overseer_core::schedule::ScheduleSpec>(&spec)
    {
        bail!("{}", located(e.path(), e.inner()));
    }
    Ok(spec)
}

pub async fn schedules(
    remote: &Remote,
    command: SchedulesCmd,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let client = connect(remote)?;
    let shown = match command {
        SchedulesCmd::Create { file } => Some(
            client
                .schedule_create(&read_spec::<overseer_core::schedule::ScheduleSpec>(&file)?)
                .await?,
        ),
        SchedulesCmd::List => {
            let all = client.schedules().await?;
            if output == Output::Human {
                outln!(
                    "{:<24} {:<20} {:<16} {:<7} {:<26} LAST JOB",
                    "NAME",
                    "CRON",
                    "TIMEZONE",
                    "PAUSED",
                    "NEXT"
                );
                for s in all["schedules"].as_array().into_iter().flatten() {
                    let text = |k: &str| s[k].as_str().unwrap_or("-").to_string();
                    outln!(
                        "{:<24} {:<20} {:<16} {:<7} {:<26} {}",
                        text("name"),
                        text("cron"),
                        text("timezone"),
                        s["paused"].as_bool().unwrap_or(false),
                        text("next_fire_at"),
                        text("last_job_id")
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            Some(all)
        }
        SchedulesCmd::Get { name } => Some(client.schedule(&name).await?),
        SchedulesCmd::Update {
            name,
            file,
            cron,
            timezone,
            overlap,
            misfire,
        } => {
            let flags = [
                ("cron", cron),
                ("timezone", timezone),
                ("overlap", overlap),
                ("misfire", misfire),
            ];
            let spec = replacement(&client, &name, file.as_deref(), flags).await?;
            Some(client.schedule_update(&name, &spec).await?)
        }
        SchedulesCmd::Delete { name } => {
            client.schedule_delete(&name).await?;
            eprintln!("schedule {name} deleted");
            None
        }
        SchedulesCmd::Pause { name } => Some(client.schedule_set_paused(&name, true).await?),
        SchedulesCmd::Resume { name } => Some(client.schedule_set_paused(&name, false).await?),
    };
    if let Some(v) = shown {
        print_json(&v)?;
    }
    Ok(ExitCode::SUCCESS)
}
