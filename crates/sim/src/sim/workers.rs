//! The simulated workers: polls for leases, the plans they follow, progress and reports, and
//! the duplicated and late reports they replay.

use overseer_core::wire::{Lease, LeaseKind, LeaseResponse};
use overseer_core::{JobId, JobState, LeaseId, Span, StepState, Timestamp};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

use super::{Held, Plan, Replay, Sent, Sim, AGENTS, REPLAYS_MAX};
use crate::cron::CRON_NAME;
use crate::model::{Check, Followup, ReportKind, StepShape};

impl Sim {
    pub(super) fn worker_crash(&mut self) {
        let w = self.rng.gen_range(0..self.workers.len());
        let held = std::mem::take(&mut self.workers[w].held);
        self.workers[w].incarnation += 1;
        self.workers[w].paused_until = None;
        let name = self.workers[w].name.clone();
        self.log(format!(
            "worker {name} crashed holding {} leases; restarted empty",
            held.len()
        ));
        for h in held {
            // Some of its work was done by a copy that will report much later.
            if self.chance(0.3) {
                let replay = self.report_of(&h);
                self.keep_replay(replay);
            }
        }
    }

    pub(super) fn worker_pause(&mut self) {
        let w = self.rng.gen_range(0..self.workers.len());
        let ms = self.rng.gen_range(5_000..=40_000);
        let until = self.now().plus(Span::from_millis(ms));
        let worker = &mut self.workers[w];
        worker.paused_until = Some(until);
        for h in &mut worker.held {
            // It checked its deadlines just before pausing: it will not look again.
            h.rogue = true;
        }
        let name = worker.name.clone();
        self.log(format!("worker {name} paused (GC) for {ms} ms"));
    }

    pub(super) fn keep_replay(&mut self, replay: Replay) {
        if self.replays.len() >= REPLAYS_MAX {
            let i = self.rng.gen_range(0..self.replays.len());
            self.replays.swap_remove(i);
        }
        self.replays.push(replay);
    }

    /// The report an agent would send at the end of its work on `h`.
    pub(super) fn report_of(&self, h: &Held) -> Replay {
        let (kind, body) = match h.plan {
            Plan::FailRetryable => (
                ReportKind::Fail,
                json!({"error": "transient trouble", "retryable": true}),
            ),
            Plan::FailFatal => (
                ReportKind::Fail,
                json!({"error": "fatal trouble", "retryable": false}),
            ),
            _ => (
                ReportKind::Complete,
                json!({"result": {"attempt": h.attempt, "lease": h.lease, "step": h.step, "undo": h.undo}}),
            ),
        };
        Replay {
            lease: h.lease,
            kind,
            body,
        }
    }

    pub(super) async fn worker_act(&mut self) -> Check {
        let w = self.rng.gen_range(0..self.workers.len());
        let now = self.now();
        if let Some(until) = self.workers[w].paused_until {
            if now < until {
                return Ok(());
            }
            self.workers[w].paused_until = None;
            let name = self.workers[w].name.clone();
            self.log(format!("worker {name} wakes from its pause"));
        }
        if !self.workers[w].held.is_empty() && self.chance(0.7) {
            let i = self.rng.gen_range(0..self.workers[w].held.len());
            self.progress(w, i).await
        } else {
            self.poll(w, None).await.map(|_| ())
        }
    }

    pub(super) fn worker_tag(&self, w: usize) -> String {
        let worker = &self.workers[w];
        format!("worker {}.{}", worker.name, worker.incarnation)
    }

    /// Asks for leases; `agent` None picks one of the worker's agent names.
    pub(super) async fn poll(&mut self, w: usize, agent: Option<&str>) -> Check<usize> {
        let agent = match agent {
            Some(a) => a.to_string(),
            None => self.workers[w]
                .agents
                .choose(&mut self.rng)
                .map(|a| a.to_string())
                .unwrap_or_else(|| AGENTS[0].to_string()),
        };
        let max = if self.faults {
            self.rng.gen_range(1..=3)
        } else {
            10
        };
        let body = json!({"worker": self.workers[w].name, "max": max, "wait": "0s"});
        let who = self.worker_tag(w);
        let sent = self
            .send(
                &who,
                "POST",
                &format!("/v1/agents/{agent}/leases"),
                Some(&body),
            )
            .await?;
        let Sent::Answered { answer, delivered } = sent else {
            return Ok(0);
        };
        if answer.status != 200 {
            return Err(format!(
                "lease request answered {}: {}",
                answer.status, answer.body
            ));
        }
        let leases: LeaseResponse = serde_json::from_value(answer.body)
            .map_err(|e| format!("lease answer does not parse: {e}"))?;
        let now = self.now();
        let got = leases.leases.len();
        for lease in leases.leases {
            self.stats.leases += 1;
            if lease.kind == LeaseKind::Compensate {
                self.stats.undo_leases += 1;
            }
            if lease.agent != agent {
                return Err(format!(
                    "agent {agent} was handed lease {} for agent {}",
                    lease.lease_id, lease.agent
                ));
            }
            match self.model.job_of(lease.job_id) {
                None => {
                    self.discover(lease.job_id).await?;
                }
                // The model judges the lease in the round the job is in.
                Some(j) => self.sync_round(j).await?,
            }
            let worker = self.workers[w].name.clone();
            let j = self.model.on_lease(&lease, &worker, now)?;
            self.touched.push(j);
            self.check_ordering(j).await?;
            if delivered {
                let held = self.plan_for(&lease, j);
                self.workers[w].held.push(held);
            }
        }
        Ok(got)
    }

    /// A job no client submitted: only a schedule's firing may have created it.
    pub(super) async fn discover(&mut self, id: JobId) -> Check<usize> {
        let view = self.get_job(id).await?;
        let key = view.idempotency_key.clone().unwrap_or_default();
        let due = key
            .strip_prefix(&format!("schedule/{CRON_NAME}/"))
            .and_then(|d| d.parse().ok())
            .map(Timestamp::from_millis);
        let (Some(cron), Some(due)) = (&self.cron, due) else {
            return Err(format!(
                "job {id} (key {key:?}) exists, but no client or schedule created it"
            ));
        };
        cron.check_job(due, &view.steps[0].payload)?;
        let names: Vec<String> = view.steps.iter().map(|s| s.name.clone()).collect();
        let shape = view
            .steps
            .iter()
            .map(|s| {
                let deps = s
                    .depends_on
                    .iter()
                    .filter_map(|d| names.iter().position(|n| n == d))
                    .collect();
                StepShape {
                    name: s.name.clone(),
                    deps,
                    payload: s.payload.clone(),
                    timeout_ms: s.timeout.as_millis(),
                    max_attempts: s.max_attempts,
                    undo_payload: s.compensate.as_ref().map(|c| c.payload.clone()),
                    undo_max_attempts: s
                        .compensate
                        .as_ref()
                        .and_then(|c| c.max_attempts)
                        .unwrap_or(overseer_core::spec::DEFAULT_MAX_ATTEMPTS),
                    deadline_ms: s.deadline.map(|d| d.as_millis()),
                }
            })
            .collect();
        let j = self
            .model
            .add_job(key.clone(), Value::Null, None, view.run_at, shape);
        self.model.on_submitted(j, 202, id)?;
        self.model.jobs[j].acked = true;
        self.log(format!("found job {j} ({key}) fired by the schedule"));
        self.cover("job fired by the schedule");
        Ok(j)
    }

    /// Jobs of one ordering key run one at a time, in the order they were committed.
    pub(super) async fn check_ordering(&mut self, j: usize) -> Check {
        let Some(key) = self.model.jobs[j].ordering_key.clone() else {
            return Ok(());
        };
        let order = self.model.jobs[j].commit_order;
        let earlier: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&k| {
                k != j
                    && self.model.jobs[k].ordering_key.as_deref() == Some(key.as_str())
                    && self.model.jobs[k].commit_order < order
                    && self.model.jobs[k].commit_order.is_some()
            })
            .collect();
        for k in earlier {
            // A job removed after its retention had finished.
            let Some(view) = self.fetch(k).await? else {
                continue;
            };
            if !view.state.is_terminal() {
                return Err(format!(
                    "job {j} of ordering key {key} got a lease while job {k}, committed before it, is {}",
                    view.state
                ));
            }
        }
        Ok(())
    }

    pub(super) fn plan_for(&mut self, lease: &Lease, j: usize) -> Held {
        let now = self.now();
        let undo = lease.kind == LeaseKind::Compensate;
        let roll = self.rng.gen_range(0..100);
        let (complete, retry, fatal, vanish) = if undo { self.mix.undo } else { self.mix.work };
        let plan = if !self.faults || roll < complete {
            Plan::Complete
        } else if roll < complete + retry {
            Plan::FailRetryable
        } else if roll < complete + retry + fatal {
            Plan::FailFatal
        } else if roll < complete + retry + fatal + vanish {
            Plan::Vanish
        } else {
            Plan::Late
        };
        let timeout = lease.timeout_ms.max(3);
        let work_ms = if self.faults {
            self.rng.gen_range(0..=timeout * 3 / 2)
        } else {
            0
        };
        let deadline = now.plus(Span::from_millis(lease.lease_ms));
        let work_until = if plan == Plan::Late {
            deadline.plus(Span::from_millis(self.rng.gen_range(0..=5_000)))
        } else {
            now.plus(Span::from_millis(work_ms))
        };
        let every = Span::from_millis(timeout / 3);
        Held {
            lease: lease.lease_id,
            job: j,
            step: lease.step.clone(),
            attempt: lease.attempt,
            undo,
            deadline,
            work_until,
            next_heartbeat: now.plus(every),
            heartbeat_every: every,
            plan,
            rogue: plan == Plan::Late,
        }
    }

    /// Moves one held lease on: report when the work is done, else heartbeat when one is due.
    pub(super) async fn progress(&mut self, w: usize, i: usize) -> Check {
        let now = self.now();
        let h = self.workers[w].held[i].clone();
        if now >= h.deadline && !h.rogue {
            // A well-behaved agent stops at its deadline and reports nothing.
            self.workers[w].held.swap_remove(i);
            let who = self.worker_tag(w);
            self.log(format!(
                "{who}: gives up lease {} (job {} step {} attempt {}): deadline passed",
                h.lease, h.job, h.step, h.attempt
            ));
            if self.chance(0.2) {
                let replay = self.report_of(&h);
                self.keep_replay(replay);
            }
            return Ok(());
        }
        if now >= h.work_until {
            if h.plan == Plan::Vanish {
                self.workers[w].held.swap_remove(i);
                let who = self.worker_tag(w);
                self.log(format!(
                    "{who}: lost lease {} (job {} step {}) in a crash of its work",
                    h.lease, h.job, h.step
                ));
                return Ok(());
            }
            let replay = self.report_of(&h);
            let who = self.worker_tag(w);
            let outcome = self.report(&who, &replay).await?;
            let retry = match outcome {
                Some((_, true, _)) => false,
                // No answer: try again next time, or give up.
                _ => self.chance(0.6),
            };
            if !retry {
                if let Some(pos) = self.workers[w].held.iter().position(|x| x.lease == h.lease) {
                    self.workers[w].held.swap_remove(pos);
                }
            }
            if self.chance(0.15) {
                self.keep_replay(replay.clone());
            }
            if matches!(outcome, Some((200, _, _))) && self.chance(0.1) {
                // A duplicate right behind the first.
                self.report(&who, &replay).await?;
            }
            return Ok(());
        }
        if now >= h.next_heartbeat && !h.rogue {
            let replay = Replay {
                lease: h.lease,
                kind: ReportKind::Heartbeat,
                body: json!({"progress": {"at": now}}),
            };
            let who = self.worker_tag(w);
            let sent_at = now;
            let outcome = self.report(&who, &replay).await?;
            let Some(pos) = self.workers[w].held.iter().position(|x| x.lease == h.lease) else {
                return Ok(());
            };
            match outcome {
                Some((200, true, body)) => {
                    let held = &mut self.workers[w].held[pos];
                    if let Some(ms) = body["lease_ms"].as_u64() {
                        held.deadline = sent_at.plus(Span::from_millis(ms));
                    }
                    held.next_heartbeat = sent_at.plus(held.heartbeat_every);
                    if body["cancel"] == json!(true) {
                        let h = self.workers[w].held.swap_remove(pos);
                        if self.chance(0.5) {
                            let stop = Replay {
                                lease: h.lease,
                                kind: ReportKind::Fail,
                                body: json!({"error": "stopped: the job was cancelled", "retryable": true}),
                            };
                            self.report(&who, &stop).await?;
                        }
                    }
                }
                Some((_, true, _)) => {
                    // Refused: the lease is gone; stop.
                    self.workers[w].held.swap_remove(pos);
                }
                _ => {
                    // No answer: try again soon.
                    self.workers[w].held[pos].next_heartbeat = sent_at.plus(Span::from_millis(200));
                }
            }
        }
        Ok(())
    }

    /// Sends a report and checks the answer against the model. Returns the status and whether
    /// the agent got the answer, or None when the request was lost.
    pub(super) async fn report(
        &mut self,
        who: &str,
        r: &Replay,
    ) -> Check<Option<(u16, bool, Value)>> {
        let path = format!("/v1/leases/{}/{}", r.lease, r.kind.path());
        // The model judges the report in the round the job is in before it is sent.
        let round_before = match self.model.lease_of(r.lease) {
            Some((j, _, _)) => {
                self.sync_round(j).await?;
                Some(self.model.jobs[j].round)
            }
            None => None,
        };
        let who = match self.model.lease_of(r.lease) {
            Some((j, s, l)) => {
                let step = &self.model.jobs[j].steps[s];
                let kind = if step.leases[l].undo { "undo" } else { "work" };
                format!(
                    "{who} (job {j} {}#{} {kind})",
                    step.name, step.leases[l].attempt
                )
            }
            None => who.to_string(),
        };
        let sent = self.send(&who, "POST", &path, Some(&r.body)).await?;
        let Sent::Answered { answer, delivered } = sent else {
            return Ok(None);
        };
        let now = self.now();
        match answer.status {
            200..=299 => self.stats.reports_ok += 1,
            409 => self.stats.reports_refused += 1,
            _ => {}
        }
        if let (404, Some((j, _, _))) = (answer.status, self.model.lease_of(r.lease)) {
            // Known only if the job was removed after its retention (checked by `fetch`).
            self.fetch(j).await?;
        }
        if let (409, Some((j, s, l))) = (answer.status, self.model.lease_of(r.lease)) {
            let step = &self.model.jobs[j].steps[s];
            let path = if step.leases[l].ended {
                "report refused: repeats an acknowledged one"
            } else if step.leases.len() > l + 1 {
                "report refused: a newer attempt exists"
            } else if now >= step.leases[l].expires_at {
                "report refused: its lease expired"
            } else {
                "report refused: live lease"
            };
            self.cover(path);
        }
        let follow =
            self.model
                .on_report(r.lease, r.kind, &r.body, answer.status, &answer.body, now)?;
        if let Some((j, _, _)) = self.model.lease_of(r.lease) {
            self.touched.push(j);
        }
        if let Followup::RefusedLiveComplete { job, step } = follow {
            self.cover("live complete refused: the job stopped wanting it");
            let Some(view) = self.fetch(job).await? else {
                return Err(format!("job {job} is gone right after a refused report"));
            };
            let s = &view.steps[step];
            let stopped = view.desired_state == overseer_core::DesiredState::Cancelled
                || view.state != JobState::Running && view.state != JobState::Blocked;
            // The refusal may have ended an unwind, and a whole-job retry started over.
            let next_round = round_before.is_some_and(|r| view.round > r);
            if !((stopped && s.state == StepState::Cancelled) || next_round) {
                return Err(format!(
                    "job {job} step {}: the complete of a live lease was refused, yet the job is {} (desired {}) and the step {}",
                    s.name, view.state, view.desired_state, s.state
                ));
            }
        }
        if r.kind == ReportKind::Heartbeat && answer.status == 200 {
            self.check_cancel_flag(r.lease, &answer.body).await?;
        }
        Ok(Some((answer.status, delivered, answer.body)))
    }

    /// A heartbeat says `cancel: true` exactly when the job no longer wants the step's work;
    /// an undo is never told to stop.
    pub(super) async fn check_cancel_flag(&mut self, lease: LeaseId, answer: &Value) -> Check {
        let Some((j, s, l)) = self.model.lease_of(lease) else {
            return Ok(());
        };
        let undo = self.model.jobs[j].steps[s].leases[l].undo;
        let Some(view) = self.fetch(j).await? else {
            return Err(format!("job {j} is gone right after a heartbeat was taken"));
        };
        let wanted = view.desired_state == overseer_core::DesiredState::Succeeded
            && matches!(view.state, JobState::Running | JobState::Blocked);
        let expected = !undo && !wanted;
        if answer["cancel"].as_bool() != Some(expected) {
            return Err(format!(
                "job {j} step {}: heartbeat answered cancel={} for {} lease {lease}, but the job is {} (desired {})",
                view.steps[s].name,
                answer["cancel"],
                if undo { "an undo" } else { "a work" },
                view.state,
                view.desired_state
            ));
        }
        Ok(())
    }

    pub(super) async fn replay(&mut self) -> Check {
        if self.replays.is_empty() {
            return self.worker_act().await;
        }
        let i = self.rng.gen_range(0..self.replays.len());
        let r = if self.chance(0.7) {
            self.replays.swap_remove(i)
        } else {
            self.replays[i].clone()
        };
        self.report("late agent", &r).await?;
        Ok(())
    }
}
