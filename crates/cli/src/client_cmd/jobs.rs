//! `overseer jobs`: listing jobs, newest first, by state, label, agent name and creation time.

use std::process::ExitCode;

use anyhow::bail;
use overseer_core::{JobState, Span};

use super::{connect, print_json};
use crate::{Output, Remote};

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

/// `overseer jobs`: a row per job (the page as JSON with `--output json`); the cursor of the
/// next page, if any, on stderr.
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
