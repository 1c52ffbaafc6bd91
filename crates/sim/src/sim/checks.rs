//! The checks: each job read back and compared with the model while the run goes on, and the
//! drain and final checks once it stops.

use overseer_core::wire::{EventList, JobView};
use overseer_core::{JobId, JobState, StepState, Timestamp};
use rand::Rng;
use serde_json::json;

use super::{dedup, Sent, Sim, AGENTS, DRAIN_ROUNDS, UNDO_AGENT};
use crate::cron::CRON_NAME;
use crate::model::Check;

impl Sim {
    /// No attempt outlives its deadline by more than one sweep: after a leader's sweep at `now`,
    /// every attempt whose hard end has come is over on the server (its step moved on to
    /// another attempt, or is no longer leased).
    pub(super) async fn check_deadlines_swept(&mut self, now: Timestamp) -> Check {
        for (j, s, l) in self.model.overdue(now) {
            let Some(view) = self.fetch(j).await? else {
                // Removed after its retention: nothing of it runs any more.
                self.model.jobs[j].steps[s].leases[l].deadline_swept = true;
                continue;
            };
            let lease = &self.model.jobs[j].steps[s].leases[l];
            let sv = &view.steps[s];
            let leased = sv.state == StepState::Running
                || sv.comp_phase == Some(overseer_core::CompPhase::Running);
            if leased && sv.attempt == lease.attempt {
                return Err(format!(
                    "job {j} step {}: attempt {} still runs after a sweep at {now}, past its deadline {:?}: an attempt outlived its deadline by more than one sweep",
                    sv.name, lease.attempt, lease.hard_end
                ));
            }
            self.model.jobs[j].steps[s].leases[l].deadline_swept = true;
            self.cover("deadline ended an attempt");
        }
        Ok(())
    }

    pub(super) async fn get_job(&mut self, id: JobId) -> Check<JobView> {
        let (status, bytes) = self.http_raw("GET", &format!("/v1/jobs/{id}"), None).await;
        if status != 200 {
            let body = String::from_utf8_lossy(&bytes);
            return Err(format!("GET job {id} answered {status}: {body}"));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("job {id} does not parse: {e}"))
    }

    /// Job `j` as the server shows it, or None once it is gone: allowed only for a job the
    /// model saw finish and whose retention has passed (see `Model::on_removed`: nothing is
    /// pruned while active); any other answer than 200 or such a 404 is a violation.
    pub(super) async fn fetch(&mut self, j: usize) -> Check<Option<JobView>> {
        let Some(id) = self.model.jobs[j].id else {
            return Ok(None);
        };
        if self.model.jobs[j].pruned {
            return Ok(None);
        }
        let (status, bytes) = self.http_raw("GET", &format!("/v1/jobs/{id}"), None).await;
        match status {
            200 => {
                let view: JobView = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("job {id} does not parse: {e}"))?;
                self.model.observe_end(j, &view);
                Ok(Some(view))
            }
            404 => {
                let now = self.now();
                let acked = if self.model.jobs[j].acked {
                    "acknowledged"
                } else {
                    "committed"
                };
                self.model
                    .on_removed(j, now)
                    .map_err(|e| format!("{acked} {e}"))?;
                self.stats.pruned += 1;
                self.log(format!("job {j} was removed after its retention"));
                self.cover("a finished job was removed after its retention");
                Ok(None)
            }
            _ => {
                let body = String::from_utf8_lossy(&bytes);
                Err(format!("GET job {id} answered {status}: {body}"))
            }
        }
    }

    /// Brings the model of a whole-job retry to the round the server shows (checking each round
    /// that ended, see `Model::on_round`); nothing for other jobs.
    pub(super) async fn sync_round(&mut self, j: usize) -> Check {
        if !self.model.jobs[j].retry {
            return Ok(());
        }
        if let Some(view) = self.fetch(j).await? {
            if view.round > self.model.jobs[j].round {
                self.cover("a whole-job retry started a new round");
            }
            self.model.on_round(j, view.round)?;
        }
        Ok(())
    }

    pub(super) async fn check_job(&mut self, j: usize, settled: bool) -> Check {
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        let id = view.id;
        let (status, bytes) = self
            .http_raw("GET", &format!("/v1/jobs/{id}/events"), None)
            .await;
        if status != 200 {
            let body = String::from_utf8_lossy(&bytes);
            return Err(format!("events of job {id} answered {status}: {body}"));
        }
        let events: EventList =
            serde_json::from_slice(&bytes).map_err(|e| format!("events do not parse: {e}"))?;
        if view.state == JobState::Blocked {
            self.stats.blocked_seen += 1;
            let held_last_round = view.job_attempts == Some(view.round)
                && view.job_exhausted == Some(overseer_core::spec::JobExhausted::Hold)
                && view.steps.iter().all(|s| s.comp_phase.is_none());
            if held_last_round {
                self.cover("a whole-job retry held in its last round");
            }
        }
        if view.round > self.model.jobs[j].round {
            self.cover("a whole-job retry started a new round");
        }
        if settled {
            self.stats.compensated_steps += view.compensated.len() as u64;
        }
        self.model.check_view(j, &view, &events.events, settled)
    }

    pub(super) async fn check_all(&mut self, settled: bool) -> Check {
        for j in 0..self.model.jobs.len() {
            self.check_job(j, settled).await?;
        }
        Ok(())
    }

    // ----- the drain and the end -----

    /// Faults stop: agents are healthy and prompt, the operator resumes blocked jobs, time moves
    /// on with sweeps. Every job must finish.
    pub(super) async fn drain(&mut self) -> Check {
        self.faults = false;
        self.log("faults stop: draining".into());
        for w in &mut self.workers {
            w.held.clear();
            w.paused_until = None;
        }
        self.replays.clear();
        let mut names: Vec<&str> = AGENTS.to_vec();
        names.push(UNDO_AGENT);
        for agent in names {
            for (method, path, body) in [
                ("PUT", format!("/v1/agents/{agent}/limits"), Some(json!({}))),
                ("POST", format!("/v1/agents/{agent}/resume"), None),
            ] {
                if let Sent::Answered { answer, .. } =
                    self.send("operator", method, &path, body.as_ref()).await?
                {
                    if answer.status != 200 {
                        return Err(format!("{method} {path} answered {}", answer.status));
                    }
                }
            }
        }
        self.model.limits.clear();
        if self.cron.is_some() {
            let path = format!("/v1/schedules/{CRON_NAME}");
            if let Sent::Answered { answer, .. } =
                self.send("operator", "DELETE", &path, None).await?
            {
                if answer.status != 204 {
                    return Err(format!("deleting the schedule answered {}", answer.status));
                }
            }
            let now = self.now();
            if let Some(c) = &mut self.cron {
                c.deleted_at = Some(now);
            }
        }
        // Clients that never got an answer try once more, so every job they meant is known.
        let pending = std::mem::take(&mut self.resubmits);
        for group in pending {
            let group = self.still_wanted(group).await?;
            if !group.is_empty() {
                self.submit_group(group).await?;
            }
        }
        for round in 0..DRAIN_ROUNDS {
            self.stats.drain_rounds = round as u64 + 1;
            self.touched.clear();
            let mut agents: Vec<&str> = AGENTS.to_vec();
            agents.push(UNDO_AGENT);
            for agent in agents {
                loop {
                    let got = self.poll(0, Some(agent)).await?;
                    let held = std::mem::take(&mut self.workers[0].held);
                    for h in held {
                        let r = self.report_of(&h);
                        self.report("drainer", &r).await?;
                    }
                    if got == 0 {
                        break;
                    }
                }
            }
            let mut unfinished = 0;
            for j in 0..self.model.jobs.len() {
                let Some(view) = self.fetch(j).await? else {
                    continue;
                };
                // A job that failed at once may still have a step running: it is cancelled
                // when its report comes or its lease expires.
                if view.state.is_terminal() && view.steps.iter().all(|s| s.state.is_settled()) {
                    continue;
                }
                unfinished += 1;
                if view.state == JobState::Blocked {
                    // Resume first; if that does not unblock it, skip what failed.
                    let choice = if round % 2 == 0 { 0 } else { 2 };
                    self.operate(j, &view, choice).await?;
                }
            }
            for j in dedup(std::mem::take(&mut self.touched)) {
                self.check_job(j, false).await?;
            }
            if unfinished == 0 {
                return Ok(());
            }
            let ms = self.rng.gen_range(500..=5_000);
            self.advance(ms);
            self.sweep().await?;
        }
        Ok(())
    }

    pub(super) async fn final_checks(&mut self) -> Check {
        self.check_all(true).await?;
        // Exactly the jobs the server acknowledged exist, each once.
        let a = self.http("GET", "/v1/jobs?limit=500", None).await;
        if a.status != 200 {
            return Err(format!("listing jobs answered {}: {}", a.status, a.body));
        }
        let listed = a.body["jobs"].as_array().cloned().unwrap_or_default();
        let mut ids: Vec<String> = listed
            .iter()
            .filter_map(|j| j["id"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        let mut expected: Vec<String> = self
            .model
            .jobs
            .iter()
            .filter(|m| !m.pruned)
            .filter_map(|m| m.id.map(|id| id.to_string()))
            .collect();
        expected.sort();
        if ids != expected {
            return Err(format!(
                "the store holds jobs {ids:?}, but the server acknowledged {expected:?}"
            ));
        }
        for m in &self.model.jobs {
            match m.terminal {
                Some(JobState::Succeeded) => self.stats.succeeded += 1,
                Some(JobState::Failed) => self.stats.failed += 1,
                Some(JobState::Cancelled) => self.stats.cancelled += 1,
                _ => {}
            }
        }
        self.check_cron()?;
        // Listing by state agrees with each job's own state.
        for state in [JobState::Succeeded, JobState::Failed, JobState::Cancelled] {
            let a = self
                .http("GET", &format!("/v1/jobs?state={state}&limit=500"), None)
                .await;
            let mut listed: Vec<String> = a.body["jobs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|j| j["id"].as_str().map(str::to_string))
                .collect();
            listed.sort();
            let mut expected: Vec<String> = self
                .model
                .jobs
                .iter()
                .filter(|m| m.terminal == Some(state) && !m.pruned)
                .filter_map(|m| m.id.map(|id| id.to_string()))
                .collect();
            expected.sort();
            if listed != expected {
                return Err(format!(
                    "GET /v1/jobs?state={state} lists {listed:?}, but these jobs are {state}: {expected:?}"
                ));
            }
        }
        // Nothing is left ready or running, and every ordering key is free.
        let a = self.http("GET", "/v1/agents", None).await;
        for agent in a.body["agents"].as_array().cloned().unwrap_or_default() {
            if agent["ready"] != json!(0) || agent["running"] != json!(0) {
                return Err(format!("after the drain, GET /v1/agents shows {agent}"));
            }
        }
        for key in ["key-0", "key-1"] {
            let a = self
                .http("GET", &format!("/v1/ordering-keys/{key}"), None)
                .await;
            if a.status != 200 || !a.body["head"].is_null() || a.body["waiting"] != json!(0) {
                return Err(format!(
                    "after the drain, ordering key {key} answers {} {}",
                    a.status, a.body
                ));
            }
        }
        self.log("final checks passed".into());
        Ok(())
    }
}
