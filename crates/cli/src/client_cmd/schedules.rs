//! `overseer schedules`: creating, listing, showing, replacing, deleting, pausing and resuming
//! cron schedules.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use overseer_agent::Client;
use serde_json::{json, Value};

use super::spec::{located, read_document, read_spec};
use super::{connect, print_json};
use crate::{Output, Remote};

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

/// `overseer schedules …`: the schedule concerned as JSON (a table for `list`, unless `--output
/// json`); `delete` says so on stderr.
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
                print_table(&all)?;
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

/// `schedules list` for people: a row per schedule, with when it fires next and its last job.
fn print_table(all: &Value) -> anyhow::Result<()> {
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
    Ok(())
}
