//! What workers report: `ACK` and `FAIL` of a fetched job, fenced by its lease holder, and `BEAT`.

use overseer_core::machine::Reply as CoreReply;
use overseer_core::{Command, JobId};
use overseer_store::{Apply, JobQuery};
use serde::Deserialize;
use serde_json::{json, Value};

use super::Connection;
use crate::job::{self, FailInfo};
use crate::resp::Reply;
use crate::{Held, WorkerState};

impl Connection {
    /// The live lease of `jid`: this node's record, else the store's view of the step.
    async fn resolve(&self, jid: &str) -> overseer_store::Result<Option<Held>> {
        if let Some(h) = self.fk.lease_of(jid) {
            return Ok(Some(h));
        }
        let store = self.fk.app().store();
        let found = match jid.split_once('/') {
            Some((id, name)) => match id.parse::<JobId>() {
                Ok(id) => store
                    .job_get(id)
                    .await?
                    .and_then(|job| job.step_index(name).map(|i| (job, i))),
                Err(_) => None,
            },
            None => None,
        };
        let found = match found {
            Some(f) => Some(f),
            None => store
                .jobs_list(JobQuery {
                    labels: vec![(job::LABEL_JID.to_string(), jid.to_string())],
                    limit: 1,
                    ..JobQuery::default()
                })
                .await?
                .into_iter()
                .next()
                .filter(job::is_faktory)
                .map(|job| (job, 0)),
        };
        let Some((job, step)) = found else {
            return Ok(None);
        };
        let s = &job.steps[step];
        if !s.is_leased() {
            return Ok(None);
        }
        Ok(match (s.lease_id, &s.worker, s.lease_expires_at) {
            (Some(lease_id), Some(holder), Some(expires_at)) => Some(Held {
                job_id: job.id,
                step,
                attempt: s.attempt,
                lease_id,
                holder: holder.clone(),
                expires_at,
            }),
            _ => None,
        })
    }

    pub(super) async fn ack(&self, data: &str) -> Reply {
        let Some(jid) = jid_of(data) else {
            return Reply::err(format!("invalid ACK {data}"));
        };
        let held = match self.resolve(&jid).await {
            Ok(Some(h)) => h,
            // Faktory answers OK to an ACK of a job it does not hold.
            Ok(None) => return Reply::Ok,
            Err(e) => return Reply::err(e),
        };
        if held.holder != self.holder {
            tracing::info!(jid, holder = %self.holder, "ACK from a connection that does not hold the job: ignored");
            return Reply::Ok;
        }
        let command = Command::Complete {
            step: held.step,
            attempt: held.attempt,
            result: Value::Null,
        };
        match self.apply(&held, command).await {
            Ok(true) => {
                self.fk.count_processed();
                self.fk.forget_failure(&jid);
            }
            Ok(false) => tracing::info!(jid, "late ACK: the reservation had expired; ignored"),
            Err(e) => return Reply::err(e),
        }
        self.fk.forget_lease(&jid, held.attempt);
        Reply::Ok
    }

    pub(super) async fn fail(&self, data: &str) -> Reply {
        #[derive(Deserialize)]
        struct Payload {
            #[serde(default)]
            jid: String,
            #[serde(default)]
            errtype: Option<String>,
            #[serde(default)]
            message: Option<String>,
            #[serde(default)]
            backtrace: Option<Vec<String>>,
        }
        let p: Payload = match serde_json::from_str(data) {
            Ok(p) => p,
            Err(_) => return Reply::err(format!("invalid FAIL {data}")),
        };
        if p.jid.is_empty() {
            return Reply::err("missing JID");
        }
        let jid = p.jid;
        let not_found = || Reply::err(format!("Job not found {jid}"));
        let info = FailInfo {
            errtype: clean(p.errtype, 100),
            message: clean(p.message, 1000),
            backtrace: p
                .backtrace
                .unwrap_or_default()
                .into_iter()
                .take(50)
                .collect(),
            failed_at: self.fk.app().now(),
        };
        let held = match self.resolve(&jid).await {
            Ok(Some(h)) if h.holder == self.holder => h,
            Ok(_) => return not_found(),
            Err(e) => return Reply::err(e),
        };
        let command = Command::Fail {
            step: held.step,
            attempt: held.attempt,
            error: info.error_text(),
            retryable: true,
            jitter: self.fk.app().jitter(),
        };
        let applied = self.apply(&held, command).await;
        self.fk.forget_lease(&jid, held.attempt);
        match applied {
            Ok(true) => {
                self.fk.count_failed();
                self.fk.remember_failure(&jid, info);
                Reply::Ok
            }
            Ok(false) => not_found(),
            Err(e) => Reply::err(e),
        }
    }

    /// Applies a report; Ok(false) when the lease was no longer live (nothing changed, or the
    /// stale report only settled a step its job no longer wanted).
    async fn apply(&self, held: &Held, command: Command) -> overseer_store::Result<bool> {
        let app = self.fk.app();
        let name = command.name();
        match app
            .store()
            .job_apply(Apply::new(held.job_id, command, app.now()))
            .await
        {
            Ok(t) => {
                app.committed(&t);
                if let Some(s) = t.job.steps.get(held.step) {
                    app.notifier().wake_agent(s.claim_agent_of_lease());
                }
                let live = !matches!(t.reply, CoreReply::Refused(_));
                app.metrics()
                    .report(name, if live { "ok" } else { "lease_lost" });
                Ok(live)
            }
            Err(overseer_store::Error::Rejected(_)) => {
                app.metrics().report(name, "lease_lost");
                Ok(false)
            }
            Err(e) => {
                app.metrics().report(name, "error");
                Err(e)
            }
        }
    }

    pub(super) fn beat(&self, data: &str) -> Reply {
        #[derive(Deserialize)]
        struct Beat {
            wid: String,
            #[serde(default)]
            current_state: Option<String>,
            #[serde(default)]
            rss_kb: Option<i64>,
        }
        let beat: Beat = match serde_json::from_str(data) {
            Ok(b) => b,
            Err(_) => return Reply::err(format!("invalid BEAT {data}")),
        };
        match self
            .fk
            .worker_beat(&beat.wid, beat.current_state.as_deref(), beat.rss_kb)
        {
            None => Reply::err(format!("unknown worker {}", beat.wid)),
            Some(WorkerState::Running) => Reply::Ok,
            Some(state) => Reply::json(&json!({ "state": state.as_str() })),
        }
    }
}

fn jid_of(data: &str) -> Option<String> {
    let v: Value = serde_json::from_str(data).ok()?;
    v.get("jid")?.as_str().map(str::to_string)
}

/// Faktory's clean-up of FAIL fields: trimmed, cut, "unknown" when empty.
fn clean(s: Option<String>, max_chars: usize) -> String {
    let s = s.unwrap_or_default();
    let s = s.trim();
    if s.is_empty() {
        return "unknown".into();
    }
    s.chars().take(max_chars).collect()
}
