//! `QUEUE PAUSE | RESUME | REMOVE | LATENCY`, on named queues or on all of them (`*`).

use overseer_core::{JobId, JobState};
use overseer_store::{Removal, SettingsUpdate};
use serde_json::{json, Map, Value};

use super::Connection;
use crate::job;
use crate::resp::Reply;

impl Connection {
    pub(super) async fn queue(&self, args: &str) -> Reply {
        let mut parts = args.split_whitespace();
        let sub = parts.next().unwrap_or_default();
        let names: Vec<&str> = parts.collect();
        if !matches!(sub, "PAUSE" | "RESUME" | "REMOVE" | "LATENCY") || names.is_empty() {
            return Reply::err("invalid format");
        }
        let names: Vec<String> = if names == ["*"] {
            match self.all_queues().await {
                Ok(all) => all,
                Err(e) => return Reply::err(e),
            }
        } else {
            names.into_iter().map(str::to_string).collect()
        };
        let result = match sub {
            "PAUSE" => self.queue_pause(&names, true).await,
            "RESUME" => self.queue_pause(&names, false).await,
            "REMOVE" => self.queue_remove(&names).await,
            _ => return self.queue_latency(&names).await,
        };
        match result {
            Ok(()) => Reply::Ok,
            Err(e) => Reply::err(e),
        }
    }

    /// Every queue `*` stands for: known ones, ones with work, and paused or limited ones.
    async fn all_queues(&self) -> overseer_store::Result<Vec<String>> {
        let app = self.fk.app();
        let mut all: Vec<String> = self.fk.queues_known().into_iter().collect();
        all.extend(
            app.store()
                .agents_counts()
                .await?
                .into_iter()
                .map(|c| c.agent),
        );
        all.extend(
            app.store()
                .agent_settings_list()
                .await?
                .into_iter()
                .map(|limits| limits.agent),
        );
        all.sort();
        all.dedup();
        Ok(all)
    }

    async fn queue_pause(&self, names: &[String], paused: bool) -> overseer_store::Result<()> {
        let app = self.fk.app();
        for name in names {
            let mut settings = app.store().agent_settings_get(name).await?;
            if settings.paused != paused {
                settings.paused = paused;
                app.store()
                    .agent_settings_put(SettingsUpdate {
                        agent: name.to_string(),
                        settings,
                        now: app.now(),
                    })
                    .await?;
                tracing::info!(queue = name, paused, "faktory queue pause changed");
            }
            app.notifier().wake_agent(name);
        }
        Ok(())
    }

    /// `QUEUE REMOVE`: deletes the Faktory jobs waiting in the queues (due, not leased; jobs in
    /// the retries or scheduled sets stay, as in Faktory) and forgets the queues. Steps of
    /// Overseer jobs submitted over HTTP are never removed this way.
    async fn queue_remove(&self, names: &[String]) -> overseer_store::Result<()> {
        let app = self.fk.app();
        for name in names {
            let now = app.now();
            let labels = vec![(job::LABEL_QUEUE.to_string(), name.clone())];
            let ids: Vec<JobId> = self
                .scan(Some(JobState::Running), labels)
                .await?
                .into_iter()
                .filter(|j| job::is_enqueued(j, now) && j.steps[0].agent == *name)
                .map(|j| j.id)
                .collect();
            let deleted = app
                .store()
                .jobs_delete(Removal {
                    ids,
                    states: vec![JobState::Running],
                })
                .await?;
            self.fk.queue_forget(name);
            tracing::info!(queue = name, jobs = deleted.len(), "faktory queue removed");
        }
        Ok(())
    }

    /// `QUEUE LATENCY`: per queue, seconds since its oldest waiting Faktory job became ready
    /// (0 when none waits).
    async fn queue_latency(&self, names: &[String]) -> Reply {
        let now = self.fk.app().now();
        let mut out = Map::new();
        for name in names {
            let labels = vec![(job::LABEL_QUEUE.to_string(), name.clone())];
            let jobs = match self.scan(Some(JobState::Running), labels).await {
                Ok(j) => j,
                Err(e) => return Reply::err(e),
            };
            let oldest = jobs
                .iter()
                .filter(|j| job::is_enqueued(j, now))
                .filter_map(|j| {
                    let s = &j.steps[0];
                    s.next_attempt_at.max(s.ready_at)
                })
                .min();
            let secs = oldest.map_or(0.0, |t| {
                (now.as_millis() - t.as_millis()).max(0) as f64 / 1000.0
            });
            out.insert(name.clone(), json!(secs));
        }
        Reply::json(&Value::Object(out))
    }
}
