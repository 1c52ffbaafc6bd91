//! The simulated clients: jobs generated from the mix, submitted one by one or in batches, with
//! idempotency keys reused and requests resent.

use overseer_core::{JobId, Span};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

use super::{Sent, Sim, AGENTS, UNDO_AGENT};
use crate::model::{Check, StepShape};

impl Sim {
    pub(super) fn gen_job(&mut self) -> usize {
        let n = self.model.jobs.len();
        let key = format!("sim-{}-{n}", self.seed);
        let steps = self.rng.gen_range(1..=5);
        let mut specs = Vec::new();
        let mut shape = Vec::new();
        for i in 0..steps {
            let mut deps = Vec::new();
            for d in 0..i {
                if deps.len() < 2 && self.chance(0.4) {
                    deps.push(d);
                }
            }
            let agent = *AGENTS.choose(&mut self.rng).unwrap_or(&"alpha");
            let timeout_ms = self.rng.gen_range(2_000..=15_000);
            let max_attempts = if self.chance(0.05) {
                0
            } else {
                self.rng.gen_range(1..=4)
            };
            let initial = self.rng.gen_range(200..=2_000);
            let mut spec = json!({
                "name": format!("s{i}"),
                "agent": agent,
                "payload": {"n": i},
                "depends_on": deps.iter().map(|d| format!("s{d}")).collect::<Vec<_>>(),
                "timeout": format!("{timeout_ms}ms"),
                "max_attempts": max_attempts,
                "backoff": {"initial": format!("{initial}ms"), "factor": 2.0, "max": "10s"},
            });
            // Some attempts are bounded by a deadline, shorter or longer than the timeout.
            let deadline_ms = self
                .chance(0.3)
                .then(|| self.rng.gen_range(1_000..=timeout_ms * 2));
            if let Some(d) = deadline_ms {
                spec["deadline"] = json!(format!("{d}ms"));
            }
            let compensate = self.chance(self.mix.compensate);
            let undo_payload = compensate.then(|| json!({"undo": i}));
            let mut undo_max_attempts = overseer_core::spec::DEFAULT_MAX_ATTEMPTS;
            if let Some(undo_payload) = &undo_payload {
                let undo_agent = if self.chance(0.5) { UNDO_AGENT } else { agent };
                let mut c = json!({"agent": undo_agent, "payload": undo_payload});
                if self.chance(0.7) {
                    undo_max_attempts = self.rng.gen_range(1..=3);
                    c["max_attempts"] = json!(undo_max_attempts);
                }
                spec["compensate"] = c;
            }
            specs.push(spec);
            shape.push(StepShape {
                name: format!("s{i}"),
                deps,
                payload: json!({"n": i}),
                timeout_ms,
                max_attempts,
                undo_payload,
                undo_max_attempts,
                deadline_ms,
            });
        }
        let mut body = json!({
            "idempotency_key": key,
            "labels": {"sim": "1"},
            "priority": self.rng.gen_range(-3..=3),
            "steps": specs,
        });
        match self.rng.gen_range(0..24) {
            0..=5 => body["on_failure"] = json!("compensate"),
            6..=9 => body["on_failure"] = json!("hold"),
            10..=12 => body["on_failure"] = json!("fail"),
            13..=16 => {}
            _ => {
                // A whole-job retry: a few rounds, a short job backoff, failing or holding
                // after the last round.
                body["on_failure"] = json!("compensate_and_retry");
                body["job_attempts"] = json!(self.rng.gen_range(1..=3));
                let initial = self.rng.gen_range(100..=2_000);
                body["job_backoff"] =
                    json!({"initial": format!("{initial}ms"), "factor": 2.0, "max": "5s"});
                if self.chance(0.5) {
                    body["job_exhausted"] = json!(if self.chance(0.5) { "hold" } else { "fail" });
                }
            }
        }
        if self.chance(0.3) {
            // Kept only briefly once finished: the leader's prune removes it during the run.
            let ms = self.rng.gen_range(1_000..=20_000);
            body["retention"] = json!(format!("{ms}ms"));
        }
        let run_at = self.chance(0.15).then(|| {
            self.now()
                .plus(Span::from_millis(self.rng.gen_range(500..=20_000)))
        });
        if let Some(at) = run_at {
            body["run_at"] = json!(at);
        }
        let ordering_key = if self.chance(0.25) {
            Some(format!("key-{}", self.rng.gen_range(0..2)))
        } else {
            None
        };
        if let Some(k) = &ordering_key {
            body["ordering_key"] = json!(k);
        }
        self.model.add_job(key, body, ordering_key, run_at, shape)
    }

    pub(super) async fn submit_new(&mut self) -> Check {
        if self.chance(0.05) {
            return self.reuse_key().await;
        }
        let room = self.opts.jobs - self.model.jobs.len();
        let n = if room >= 2 && self.chance(0.2) {
            self.rng.gen_range(2..=room.min(3))
        } else {
            1
        };
        let group: Vec<usize> = (0..n).map(|_| self.gen_job()).collect();
        self.stats.jobs += n as u64;
        self.submit_group(group).await
    }

    pub(super) async fn submit_group(&mut self, group: Vec<usize>) -> Check {
        if group.len() == 1 {
            self.submit(group[0]).await
        } else {
            self.submit_batch(group).await
        }
    }

    /// A batch: all or nothing, answered with the jobs in request order.
    pub(super) async fn submit_batch(&mut self, group: Vec<usize>) -> Check {
        self.cover("batch submit");
        let bodies: Vec<Value> = group
            .iter()
            .map(|&j| self.model.jobs[j].body.clone())
            .collect();
        let who = format!("client (jobs {group:?})");
        let body = json!({ "jobs": bodies });
        match self
            .send(&who, "POST", "/v1/jobs:batch", Some(&body))
            .await?
        {
            Sent::Lost => {
                if self.chance(0.8) {
                    self.resubmits.push(group);
                }
            }
            Sent::Answered { answer, delivered } => {
                let jobs = answer.body["jobs"].as_array().cloned().unwrap_or_default();
                if jobs.len() != group.len() {
                    return Err(format!(
                        "batch of {} answered {} with {} jobs: {}",
                        group.len(),
                        answer.status,
                        jobs.len(),
                        answer.body
                    ));
                }
                let created = group.iter().any(|&j| self.model.jobs[j].id.is_none());
                let expected = if created { 202 } else { 200 };
                if answer.status != expected {
                    return Err(format!(
                        "batch answered {}, expected {expected}: {}",
                        answer.status, answer.body
                    ));
                }
                for (&j, view) in group.iter().zip(&jobs) {
                    let id: JobId = serde_json::from_value(view["id"].clone())
                        .map_err(|e| format!("batch answer without an id: {e}"))?;
                    let status = if self.model.jobs[j].id.is_none() {
                        202
                    } else {
                        200
                    };
                    self.model.on_submitted(j, status, id)?;
                    self.touched.push(j);
                    if delivered {
                        self.model.jobs[j].acked = true;
                    }
                }
                if !delivered && self.chance(0.7) {
                    self.resubmits.push(group);
                }
            }
        }
        Ok(())
    }

    /// A buggy client reuses a committed job's key for another body: refused, nothing stored.
    pub(super) async fn reuse_key(&mut self) -> Check {
        // Not a job that may have been removed: its key would be free again.
        let committed: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&j| {
                let m = &self.model.jobs[j];
                m.id.is_some() && !m.body.is_null() && !(m.own_retention && m.terminal.is_some())
            })
            .collect();
        let Some(&j) = committed.choose(&mut self.rng) else {
            return Ok(());
        };
        let mut body = self.model.jobs[j].body.clone();
        body["steps"][0]["payload"] = json!({"changed": true});
        let who = format!("careless client (key of job {j})");
        self.cover("key reused with another body");
        if let Sent::Answered { answer, .. } =
            self.send(&who, "POST", "/v1/jobs", Some(&body)).await?
        {
            if answer.status != 409 {
                return Err(format!(
                    "a submit reusing job {j}'s key with another body answered {}: {}",
                    answer.status, answer.body
                ));
            }
        }
        Ok(())
    }

    pub(super) async fn resubmit(&mut self) -> Check {
        let i = self.rng.gen_range(0..self.resubmits.len());
        let group = self.resubmits.swap_remove(i);
        let group = self.still_wanted(group).await?;
        if group.is_empty() {
            return Ok(());
        }
        self.submit_group(group).await
    }

    /// The jobs of a lost submit a client still sends again: not those already finished and
    /// removed (the client learned their outcome; their key is free again, so a resubmit would
    /// make a new job, as the README says).
    pub(super) async fn still_wanted(&mut self, group: Vec<usize>) -> Check<Vec<usize>> {
        let mut kept = Vec::new();
        for j in group {
            let m = &self.model.jobs[j];
            if m.terminal.is_some() && m.own_retention {
                self.fetch(j).await?;
            }
            if !self.model.jobs[j].pruned {
                kept.push(j);
            }
        }
        Ok(kept)
    }

    pub(super) async fn submit(&mut self, j: usize) -> Check {
        let body = self.model.jobs[j].body.clone();
        let who = format!("client (job {j})");
        match self.send(&who, "POST", "/v1/jobs", Some(&body)).await? {
            Sent::Lost => {
                if self.chance(0.8) {
                    self.resubmits.push(vec![j]);
                }
            }
            Sent::Answered { answer, delivered } => {
                let id: JobId = serde_json::from_value(answer.body["id"].clone())
                    .map_err(|e| format!("submit answered {} without an id: {e}", answer.status))?;
                self.model.on_submitted(j, answer.status, id)?;
                self.touched.push(j);
                if delivered {
                    self.model.jobs[j].acked = true;
                } else if self.chance(0.7) {
                    self.resubmits.push(vec![j]);
                }
            }
        }
        Ok(())
    }
}
