//! The simulated operators: agent limits, cancels, reschedules, reruns, operator actions on
//! blocked jobs, and the cron schedule.

use overseer_core::wire::JobView;
use overseer_core::{CompPhase, JobState, Span, StepState};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::json;

use super::{short, Sent, Sim, AGENTS, UNDO_AGENT};
use crate::cron::{CronState, CRON_NAME, PATTERNS};
use crate::model::Check;

impl Sim {
    pub(super) async fn create_schedule(&mut self) -> Check {
        let pattern = PATTERNS[0];
        let body = CronState::body(pattern, 0, AGENTS[0]);
        let a = self.http("POST", "/v1/schedules", Some(&body)).await;
        self.log(format!(
            "operator: POST /v1/schedules {} -> {}",
            short(&body),
            a.status
        ));
        if a.status != 201 {
            return Err(format!(
                "creating the schedule answered {}: {}",
                a.status, a.body
            ));
        }
        self.cron = Some(CronState::created(pattern, &a.body)?);
        Ok(())
    }

    /// An operator replaces the schedule's definition while it runs: another pattern (or the
    /// same one with a new job body), through `PUT /v1/schedules/{name}`.
    pub(super) async fn replace_schedule(&mut self) -> Check {
        let Some(cron) = self.cron.as_ref().filter(|c| c.deleted_at.is_none()) else {
            return Ok(());
        };
        let (current, version) = (cron.pattern(), cron.next_version());
        let pattern = if self.chance(0.3) {
            current
        } else {
            *PATTERNS.choose(&mut self.rng).unwrap_or(&current)
        };
        let body = CronState::body(pattern, version, AGENTS[0]);
        let path = format!("/v1/schedules/{CRON_NAME}");
        let Sent::Answered { answer, .. } =
            self.send("operator", "PUT", &path, Some(&body)).await?
        else {
            return Ok(());
        };
        if answer.status != 200 {
            return Err(format!(
                "replacing the schedule answered {}: {}",
                answer.status, answer.body
            ));
        }
        let now = self.now();
        if let Some(cron) = &mut self.cron {
            cron.replaced(pattern, version, &answer.body, now)?;
        }
        self.cover(if pattern == current {
            "operator replaced the schedule's job"
        } else {
            "operator replaced the schedule's pattern"
        });
        Ok(())
    }

    /// Every due time of each definition of the schedule fired exactly once while it was in
    /// force, up to the last complete leader sweep (see `cron`).
    pub(super) fn check_cron(&self) -> Check {
        let Some(cron) = &self.cron else {
            return Ok(());
        };
        let prefix = format!("schedule/{CRON_NAME}/");
        let mut fired: Vec<i64> = self
            .model
            .jobs
            .iter()
            .filter_map(|m| m.key.strip_prefix(&prefix).and_then(|d| d.parse().ok()))
            .collect();
        fired.sort_unstable();
        cron.check_fired(&fired)
    }

    // ----- the server process -----

    /// An operator changes an agent name's limits: a concurrency cap, none, pause or resume.
    pub(super) async fn set_limits(&mut self) -> Check {
        let mut names: Vec<&str> = AGENTS.to_vec();
        names.push(UNDO_AGENT);
        let agent = *names.choose(&mut self.rng).unwrap_or(&AGENTS[0]);
        let mut limits = self.model.limits.get(agent).copied().unwrap_or_default();
        let (method, path, body) = match self.rng.gen_range(0..8) {
            0..=3 => {
                let max = self.rng.gen_range(1..=2);
                limits.max_concurrency = Some(max);
                (
                    "PUT",
                    format!("/v1/agents/{agent}/limits"),
                    Some(json!({"max_concurrency": max})),
                )
            }
            4..=5 => {
                limits.max_concurrency = None;
                ("PUT", format!("/v1/agents/{agent}/limits"), Some(json!({})))
            }
            6 => {
                limits.paused = true;
                ("POST", format!("/v1/agents/{agent}/pause"), None)
            }
            _ => {
                limits.paused = false;
                ("POST", format!("/v1/agents/{agent}/resume"), None)
            }
        };
        if let Sent::Answered { answer, .. } =
            self.send("operator", method, &path, body.as_ref()).await?
        {
            if answer.status != 200 {
                return Err(format!(
                    "{method} {path} answered {}: {}",
                    answer.status, answer.body
                ));
            }
            self.model.limits.insert(agent.to_string(), limits);
        }
        Ok(())
    }

    pub(super) fn pick_job(&mut self, acked_only: bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&j| {
                let m = &self.model.jobs[j];
                m.id.is_some() && (m.acked || !acked_only) && m.terminal.is_none()
            })
            .collect();
        candidates.choose(&mut self.rng).copied()
    }

    pub(super) async fn cancel_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        self.cancel(j).await
    }

    pub(super) async fn cancel(&mut self, j: usize) -> Check {
        let id = self.model.jobs[j]
            .id
            .ok_or("cancel of a job without an id")?;
        let sent = self
            .send("operator", "POST", &format!("/v1/jobs/{id}/cancel"), None)
            .await?;
        if let Sent::Answered { answer, .. } = sent {
            self.touched.push(j);
            match answer.status {
                200 => {
                    self.stats.cancels += 1;
                    let now = self.now();
                    self.model.on_cancelled(j, now);
                }
                409 => {
                    let Some(view) = self.fetch(j).await? else {
                        return Ok(());
                    };
                    if !view.state.is_terminal() {
                        return Err(format!(
                            "cancel of job {j} refused (409) while it is {}",
                            view.state
                        ));
                    }
                }
                s => return Err(format!("cancel of job {j} answered {s}: {}", answer.body)),
            }
        }
        Ok(())
    }

    /// An operator moves a job: a pending one to a new `run_at` (earlier, later, or now) and
    /// maybe a new priority, a running one to a new priority. 409 only once it no longer
    /// applies (the job started or finished meanwhile).
    pub(super) async fn reschedule_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        let id = self.model.jobs[j].id.ok_or("a picked job without an id")?;
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        let mut body = json!({"by": "sim-operator"});
        if self.chance(0.5) {
            body["priority"] = json!(self.rng.gen_range(-3..=3));
        }
        let to = if view.state == JobState::Pending
            && (self.chance(0.8) || body.get("priority").is_none())
        {
            let ms = [
                0,
                self.rng.gen_range(1..=3_000),
                self.rng.gen_range(3_000..=30_000),
            ][self.rng.gen_range(0..3)];
            let to = self.now().plus(Span::from_millis(ms));
            body["run_at"] = json!(to);
            Some(to)
        } else {
            if body.get("priority").is_none() {
                body["priority"] = json!(1);
            }
            None
        };
        let path = format!("/v1/jobs/{id}");
        let sent = self.send("operator", "PATCH", &path, Some(&body)).await?;
        // The server's answer is known here even when the client lost it.
        let status = match &sent {
            Sent::Lost => return Ok(()),
            Sent::Answered { answer, .. } => answer.status,
        };
        self.touched.push(j);
        if let (200, Some(to)) = (status, to) {
            self.model.on_rescheduled(j, to);
        }
        match status {
            200 => {
                self.cover(if to.is_some() {
                    "operator moved a pending job"
                } else {
                    "operator changed a running job's priority"
                });
                Ok(())
            }
            409 => {
                let Some(now) = self.fetch(j).await? else {
                    return Ok(());
                };
                let moved_run_at = to.is_some();
                if now.state.is_terminal() || (moved_run_at && now.state != JobState::Pending) {
                    Ok(())
                } else {
                    Err(format!(
                        "PATCH {path} refused (409) while the job is {}",
                        now.state
                    ))
                }
            }
            s => Err(format!("PATCH {path} answered {s}")),
        }
    }

    /// An operator reruns a job, from failure or not: mostly one that failed or was cancelled,
    /// now and then any job. The answer must be what the job calls for (202 once it failed or
    /// was cancelled, was not rerun yet and runs nothing; 409 otherwise, `already-rerun` when
    /// it was), and the new job must keep exactly the steps that everything acknowledged says
    /// it keeps (worked out by the model). The model then refuses any work lease of a kept step:
    /// a rerun never runs a kept step again.
    pub(super) async fn rerun_some(&mut self) -> Check {
        if self.reruns >= self.opts.jobs {
            return Ok(());
        }
        // Not a job removed after its retention (a rerun of it answers 404).
        let known: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&j| self.model.jobs[j].id.is_some() && !self.model.jobs[j].pruned)
            .collect();
        let finished: Vec<usize> = known
            .iter()
            .copied()
            .filter(|&j| {
                let m = &self.model.jobs[j];
                matches!(m.terminal, Some(JobState::Failed | JobState::Cancelled))
                    && m.rerun.is_none()
            })
            .collect();
        // Most often one with steps to keep, so reruns from failure keep something.
        let keeping: Vec<usize> = finished
            .iter()
            .copied()
            .filter(|&j| self.model.expected_kept(j).contains(&true))
            .collect();
        let pick = match self.rng.gen_range(0..20) {
            0..=11 if !keeping.is_empty() => &keeping,
            0..=17 => &finished,
            _ => &known,
        };
        let Some(&j) = pick.choose(&mut self.rng) else {
            return Ok(());
        };
        let id = self.model.jobs[j].id.ok_or("a picked job without an id")?;
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        let running = view
            .steps
            .iter()
            .any(|s| s.state == StepState::Running || s.comp_phase == Some(CompPhase::Running));
        let allowed = matches!(view.state, JobState::Failed | JobState::Cancelled)
            && view.rerun_by.is_none()
            && !running;
        let from_failed = self.chance(0.75);
        let body = json!({"from_failed": from_failed, "by": "sim-operator", "reason": "seeded"});
        let path = format!("/v1/jobs/{id}/rerun");
        let Sent::Answered { answer, .. } =
            self.send("operator", "POST", &path, Some(&body)).await?
        else {
            return Ok(());
        };
        self.touched.push(j);
        match (answer.status, allowed) {
            (202, true) => {}
            (409, false) => {
                let code = answer.body["code"].as_str().unwrap_or_default();
                if view.rerun_by.is_some() && code != "already-rerun" {
                    return Err(format!("a second rerun of job {j} answered 409 {code}"));
                }
                self.cover("rerun refused");
                return Ok(());
            }
            (status, _) => {
                return Err(format!(
                    "POST {path} answered {status} while the job is {} (rerun_by {:?}, a step running: {running}): {}",
                    view.state, view.rerun_by, answer.body
                ))
            }
        }
        let made: JobView = serde_json::from_value(answer.body)
            .map_err(|e| format!("a rerun's answer does not parse: {e}"))?;
        let kept = match from_failed {
            true => self.model.expected_kept(j),
            false => vec![false; made.steps.len()],
        };
        for (s, &keep) in made.steps.iter().zip(&kept) {
            if (s.state == StepState::Succeeded) != keep {
                return Err(format!(
                    "job {j}'s rerun {}: step {} is {}, yet it {} be kept (from_failed {from_failed}): a rerun keeps exactly what succeeded, and never runs a kept step again",
                    made.id,
                    s.name,
                    s.state,
                    if keep { "should" } else { "should not" }
                ));
            }
        }
        let new = self.model.on_rerun(j, made.id, &kept)?;
        self.reruns += 1;
        self.stats.jobs += 1;
        self.touched.push(new);
        self.cover(match kept.contains(&true) {
            true => "rerun keeping steps",
            false => "rerun of every step",
        });
        Ok(())
    }

    pub(super) async fn operate_some(&mut self) -> Check {
        let Some(j) = self.pick_job(true) else {
            return Ok(());
        };
        let Some(view) = self.fetch(j).await? else {
            return Ok(());
        };
        if view.state != JobState::Blocked {
            return Ok(());
        }
        let choice = self.rng.gen_range(0..3);
        self.operate(j, &view, choice).await
    }

    /// An operator acts on a blocked job: 0 resume, 1 retry a failed step or undo, 2 skip one.
    pub(super) async fn operate(&mut self, j: usize, view: &JobView, choice: u32) -> Check {
        let id = view.id;
        let failed: Vec<(usize, bool)> = view
            .steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                if s.comp_phase == Some(CompPhase::Failed) {
                    Some((i, true))
                } else if s.state == StepState::Failed {
                    Some((i, false))
                } else {
                    None
                }
            })
            .collect();
        let target = failed.choose(&mut self.rng).copied();
        let body = json!({"by": "sim-operator", "reason": "seeded"});
        let (path, skip) = match (choice, target) {
            (1, Some((i, _))) => (
                format!("/v1/jobs/{id}/steps/{}/retry", view.steps[i].name),
                None,
            ),
            (2, Some((i, undo))) => (
                format!("/v1/jobs/{id}/steps/{}/skip", view.steps[i].name),
                Some((i, undo)),
            ),
            _ => (format!("/v1/jobs/{id}/resume"), None),
        };
        let sent = self.send("operator", "POST", &path, Some(&body)).await?;
        if let Sent::Answered { answer, .. } = sent {
            self.touched.push(j);
            match answer.status {
                200 => {
                    self.stats.operator_ok += 1;
                    self.cover(match (choice, skip) {
                        (_, Some(_)) => "operator skip",
                        (1, None) => "operator retry",
                        _ => "operator resume",
                    });
                    if let Some((i, undo)) = skip {
                        self.model.on_skipped(j, i, undo);
                    }
                }
                409 | 422 => {}
                s => return Err(format!("{path} answered {s}: {}", answer.body)),
            }
        }
        Ok(())
    }

    // ----- reading the server -----
}
