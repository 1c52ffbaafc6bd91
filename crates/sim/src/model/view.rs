//! Checks of a job as the server shows it (and its history) against everything the model knows:
//! what was submitted, every lease handed out and every report acknowledged.

use std::collections::BTreeSet;

use overseer_core::wire::{JobView, StepView};
use overseer_core::{Event, EventKind, JobState, StepState, Timestamp};
use serde_json::Value;

use super::{Check, JobModel, Model, StepModel, HISTORY_KEPT};

impl Model {
    /// Checks a job as the server shows it, and its history, against everything known.
    /// `settled`: faults have stopped and the drain is over, so the job must be finished.
    pub fn check_view(
        &mut self,
        j: usize,
        view: &JobView,
        events: &[Event],
        settled: bool,
    ) -> Check {
        self.on_round(j, view.round)?;
        let m = &self.jobs[j];
        let tag = format!("job {j} ({}, {})", m.key, view.id);
        self.check_identity(&tag, m, view)?;
        // A history cut short by the trim cannot be read for what happened.
        let full_history = events.len() < HISTORY_KEPT;
        for (i, (sm, sv)) in m.steps.iter().zip(&view.steps).enumerate() {
            let stag = format!("{tag} step {}", sm.name);
            check_step_view(&stag, sm, sv, settled, view.state)?;
            if full_history {
                check_step_history(&stag, i, m, events)?;
                check_failures_counted(&stag, sm, sv, events)?;
            }
        }
        check_compensated(&tag, view)?;
        check_job_state(&tag, m, view)?;
        if full_history {
            if view.state.is_terminal() {
                check_terminal_history(&tag, view.state, events)?;
            }
            check_start_history(&tag, events)?;
        }
        if let Some(e) = events.iter().find(|e| e.kind == EventKind::JobRepaired) {
            return Err(format!(
                "{tag}: the supervisor had to repair the job (event {}, {:?}): a transition left it inconsistent",
                e.seq, e.detail
            ));
        }
        if full_history {
            check_no_lease_after_cancel(&tag, m, events)?;
        }
        if settled && !view.state.is_terminal() {
            return Err(format!(
                "{tag}: still {} after the drain (blocked reason: {:?})",
                view.state, view.blocked_reason
            ));
        }
        if full_history {
            check_round_history(&tag, m, events)?;
        }
        self.observe_end(j, view);
        Ok(())
    }

    /// The job shown is the one submitted: its id, its steps, a finished state that stays, and
    /// the reruns answered.
    fn check_identity(&self, tag: &str, m: &JobModel, view: &JobView) -> Check {
        if Some(view.id) != m.id {
            return Err(format!(
                "{tag}: the server shows another id than it answered"
            ));
        }
        if view.steps.len() != m.steps.len() {
            return Err(format!(
                "{tag}: {} steps shown, {} submitted",
                view.steps.len(),
                m.steps.len()
            ));
        }
        if let Some(t) = m.terminal {
            if view.state != t {
                return Err(format!(
                    "{tag}: was {t}, now {}: a finished job changed state",
                    view.state
                ));
            }
        }
        let id_of = |k: Option<usize>| k.and_then(|k| self.jobs[k].id);
        if (view.rerun_of, view.rerun_by) != (id_of(m.rerun_of), id_of(m.rerun)) {
            return Err(format!(
                "{tag}: shows rerun_of {:?} and rerun_by {:?}, but the reruns answered were {:?} and {:?}",
                view.rerun_of,
                view.rerun_by,
                id_of(m.rerun_of),
                id_of(m.rerun)
            ));
        }
        Ok(())
    }
}

/// A step as shown: its attempts are the leases handed out, its result the completion
/// acknowledged (or the result a rerun kept), and its state one those allow.
fn check_step_view(
    stag: &str,
    sm: &StepModel,
    sv: &StepView,
    settled: bool,
    job_state: JobState,
) -> Check {
    if sv.name != sm.name {
        return Err(format!("{stag}: shown as step {}", sv.name));
    }
    if sv.attempt as usize != sm.leases.len() {
        return Err(format!(
            "{stag}: attempt is {}, but {} leases were handed out",
            sv.attempt,
            sm.leases.len()
        ));
    }
    let undo_leases = sm.leases.iter().filter(|l| l.undo).count();
    if sv.comp_attempts as usize != undo_leases {
        return Err(format!(
            "{stag}: comp_attempts is {}, but {undo_leases} undo leases were handed out",
            sv.comp_attempts
        ));
    }
    check_step_result(stag, sm, sv)?;
    check_step_state(stag, sm, sv)?;
    if sm.undo_done > 0 && sv.state != StepState::Compensated {
        return Err(format!("{stag}: its undo completed but it is {}", sv.state));
    }
    let finished = matches!(
        sv.state,
        StepState::Succeeded
            | StepState::Failed
            | StepState::Skipped
            | StepState::Cancelled
            | StepState::Compensated
    );
    if settled && !finished {
        return Err(format!(
            "{stag}: still {} after the drain (job {job_state})",
            sv.state
        ));
    }
    Ok(())
}

/// A recorded result is the one a rerun kept, or the acknowledged completion's.
fn check_step_result(stag: &str, sm: &StepModel, sv: &StepView) -> Check {
    if let (Some(result), Some(kept)) = (&sv.result, &sm.kept) {
        if result != kept {
            return Err(format!(
                "{stag}: a kept step shows result {result}, but it kept {kept}"
            ));
        }
    } else if let Some(result) = &sv.result {
        let Some(done) = sm.work_done else {
            return Err(format!(
                "{stag}: a result is recorded ({result}) but no completion was acknowledged"
            ));
        };
        let l = &sm.leases[done];
        let attempt = result["attempt"].as_u64();
        let lease = result["lease"].as_str();
        if attempt != Some(u64::from(l.attempt)) || lease != Some(&l.id.to_string()) {
            return Err(format!(
                "{stag}: recorded result {result} is not the acknowledged attempt {} (lease {})",
                l.attempt, l.id
            ));
        }
    }
    Ok(())
}

/// The step's state is one the acknowledged reports and leases allow.
fn check_step_state(stag: &str, sm: &StepModel, sv: &StepView) -> Check {
    match sv.state {
        StepState::Succeeded if sm.kept.is_some() && sv.result.as_ref() != sm.kept.as_ref() => {
            Err(format!(
                "{stag}: a kept step succeeded with {:?}, not the result it kept",
                sv.result
            ))
        }
        StepState::Succeeded if sm.kept.is_some() => Ok(()),
        StepState::Succeeded => {
            let Some(done) = sm.work_done else {
                return Err(format!(
                    "{stag}: succeeded without an acknowledged completion"
                ));
            };
            if sm.leases[done].attempt != sv.attempt {
                return Err(format!(
                    "{stag}: succeeded at attempt {}, but its recorded completion is attempt {}",
                    sv.attempt, sm.leases[done].attempt
                ));
            }
            if sv.result.is_none() {
                return Err(format!("{stag}: succeeded without a result"));
            }
            Ok(())
        }
        StepState::Compensated if sm.undo_done != 1 => Err(format!(
            "{stag}: compensated, but {} undo completions were acknowledged",
            sm.undo_done
        )),
        StepState::Compensating | StepState::Compensated
            if sm.work_done.is_none() && sm.kept.is_none() =>
        {
            Err(format!("{stag}: {} a step that never succeeded", sv.state))
        }
        StepState::Running => {
            let last = sm.leases.last();
            if last.is_none_or(|l| l.undo || l.ended) {
                return Err(format!(
                    "{stag}: running, but its last lease is not an open work lease"
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Every counted failure left its mark in the history, and nothing else counted (a refused
/// report changes nothing).
fn check_failures_counted(stag: &str, sm: &StepModel, sv: &StepView, events: &[Event]) -> Check {
    let count = |kinds: [EventKind; 2]| {
        events
            .iter()
            .filter(|e| e.step.as_deref() == Some(sm.name.as_str()))
            .filter(|e| kinds.contains(&e.kind))
            .count()
    };
    let failures = count([EventKind::StepRetryScheduled, EventKind::StepFailed]);
    let undo_failures = count([
        EventKind::CompensationRetryScheduled,
        EventKind::CompensationFailed,
    ]);
    if sv.failures as usize != failures || sv.comp_failures as usize != undo_failures {
        return Err(format!(
            "{stag}: failures {} and undo failures {}, but the history records {failures} and {undo_failures}",
            sv.failures, sv.comp_failures
        ));
    }
    Ok(())
}

/// `compensated` names exactly the compensated steps, in the order they were undone to the
/// millisecond (an undo's completion time is the step's `finished_at`).
fn check_compensated(tag: &str, view: &JobView) -> Check {
    let mut compensated: Vec<String> = view
        .steps
        .iter()
        .filter(|s| s.state == StepState::Compensated)
        .map(|s| s.name.clone())
        .collect();
    let mut listed = view.compensated.clone();
    compensated.sort();
    listed.sort();
    if compensated != listed {
        return Err(format!(
            "{tag}: lists {:?} as compensated, its steps say {compensated:?}",
            view.compensated
        ));
    }
    let undone_at: Vec<Option<Timestamp>> = view
        .compensated
        .iter()
        .map(|name| {
            view.steps
                .iter()
                .find(|s| &s.name == name)
                .and_then(|s| s.finished_at)
        })
        .collect();
    if undone_at.windows(2).any(|w| w[0] > w[1]) {
        return Err(format!(
            "{tag}: lists {:?} as compensated, not in the order undone ({undone_at:?})",
            view.compensated
        ));
    }
    Ok(())
}

/// The job's state agrees with its steps, its `finished_at` and an acknowledged cancel.
fn check_job_state(tag: &str, m: &JobModel, view: &JobView) -> Check {
    if view.state == JobState::Succeeded {
        if m.cancel_at.is_some() {
            return Err(format!(
                "{tag}: succeeded after its cancel was acknowledged"
            ));
        }
        if let Some(s) = view
            .steps
            .iter()
            .find(|s| !matches!(s.state, StepState::Succeeded | StepState::Skipped))
        {
            return Err(format!(
                "{tag}: succeeded while step {} is {}",
                s.name, s.state
            ));
        }
    }
    if view.state.is_terminal() != view.finished_at.is_some() {
        return Err(format!(
            "{tag}: {} with finished_at {:?}",
            view.state, view.finished_at
        ));
    }
    if view.state.is_terminal() && m.cancel_at.is_some() && view.state != JobState::Cancelled {
        return Err(format!(
            "{tag}: ended {} after its cancel was acknowledged",
            view.state
        ));
    }
    if view.state == JobState::Blocked && view.blocked_reason.is_none() {
        return Err(format!("{tag}: blocked without a reason"));
    }
    Ok(())
}

/// Nothing was leased after the cancel was acknowledged.
fn check_no_lease_after_cancel(tag: &str, m: &JobModel, events: &[Event]) -> Check {
    let Some(at) = m.cancel_at else {
        return Ok(());
    };
    match events
        .iter()
        .find(|e| e.kind == EventKind::StepLeased && e.at > at)
    {
        Some(e) => Err(format!(
            "{tag}: step {:?} leased at {} after the cancel acknowledged at {at}",
            e.step, e.at
        )),
        None => Ok(()),
    }
}

/// Each `job_round_started` lists as undone exactly the steps the model saw undone in the round
/// it ends, and no work of the new round is leased before the job's backoff ended (its `at`).
fn check_round_history(tag: &str, m: &JobModel, events: &[Event]) -> Check {
    let mut not_before: Option<(Timestamp, i64)> = None;
    for e in events {
        match e.kind {
            EventKind::JobRoundStarted => {
                let detail = e.detail.clone().unwrap_or(Value::Null);
                let round = detail["round"].as_u64().unwrap_or(0) as usize;
                let listed: BTreeSet<String> = detail["undone"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect();
                let seen = round.checked_sub(2).and_then(|r| m.undone_in_round.get(r));
                if let Some(seen) = seen.filter(|seen| **seen != listed) {
                    return Err(format!(
                        "{tag}: event {} starts round {round} saying {listed:?} were undone, but the acknowledged undos of round {} were {seen:?}",
                        e.seq,
                        round - 1
                    ));
                }
                let at = serde_json::from_value::<Timestamp>(detail["at"].clone()).ok();
                not_before = at.map(|t| (t, e.seq));
            }
            EventKind::StepLeased => {
                if let Some((t, seq)) = not_before.filter(|(t, _)| e.at < *t) {
                    return Err(format!(
                        "{tag}: {:?} leased at {} (event {}) before the round's backoff ended at {t} (event {seq})",
                        e.step, e.at, e.seq
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A step's leases in the history match the leases handed out, and its work was leased only
/// after every dependency succeeded or was skipped.
fn check_step_history(tag: &str, step: usize, m: &JobModel, events: &[Event]) -> Check {
    let sm = &m.steps[step];
    let mine = |e: &&Event| e.step.as_deref() == Some(sm.name.as_str());
    type Recorded = (bool, Option<u32>, Option<Timestamp>, Option<String>);
    let leased: Vec<Recorded> = events
        .iter()
        .filter(mine)
        .filter(|e| e.kind == EventKind::StepLeased || e.kind == EventKind::CompensationLeased)
        .map(|e| {
            let detail = e.detail.clone().unwrap_or(Value::Null);
            (
                e.kind == EventKind::CompensationLeased,
                e.attempt,
                serde_json::from_value(detail["lease_expires_at"].clone()).ok(),
                detail["worker"].as_str().map(str::to_string),
            )
        })
        .collect();
    let handed: Vec<Recorded> = sm
        .leases
        .iter()
        .map(|l| {
            (
                l.undo,
                Some(l.attempt),
                Some(l.granted_until),
                Some(l.worker.clone()),
            )
        })
        .collect();
    if leased != handed {
        return Err(format!(
            "{tag}: history records leases (undo?, attempt, until, worker) {leased:?}, but {handed:?} were handed out"
        ));
    }
    // Attempt budgets: a step fails for running out of attempts exactly when it used
    // `max_attempts` of them since its last fresh budget (an operator's retry), and is never
    // rescheduled beyond that; the same for its undo.
    let (mut used, mut used_undo) = (0u32, 0u32);
    for e in events.iter().filter(mine) {
        let exhausted = e
            .detail
            .as_ref()
            .is_some_and(|d| d["reason"] == "attempts exhausted");
        let (count, max, what) = match e.kind {
            EventKind::StepLeased => {
                used += 1;
                continue;
            }
            EventKind::CompensationLeased => {
                used_undo += 1;
                continue;
            }
            EventKind::StepRetried => {
                used = 0;
                continue;
            }
            EventKind::CompensationRetried => {
                used_undo = 0;
                continue;
            }
            // A new round of a whole-job retry: fresh budgets for the work and the undo.
            EventKind::StepReset => {
                (used, used_undo) = (0, 0);
                continue;
            }
            EventKind::StepFailed | EventKind::StepRetryScheduled => {
                (used, sm.max_attempts, "attempts")
            }
            EventKind::CompensationFailed | EventKind::CompensationRetryScheduled => {
                (used_undo, sm.undo_max_attempts, "undo attempts")
            }
            _ => continue,
        };
        if max == 0 {
            continue;
        }
        let retry = matches!(
            e.kind,
            EventKind::StepRetryScheduled | EventKind::CompensationRetryScheduled
        );
        let wrong = if retry {
            count >= max
        } else {
            exhausted && count != max
        };
        if wrong {
            return Err(format!(
                "{tag}: event {} ({}) after {count} {what} of a budget of {max}",
                e.seq, e.kind
            ));
        }
    }
    // A retry is not leased before its backoff ends, unless something made the step ready
    // anew since (an operator's retry, the job being unblocked).
    let mut not_before: Option<(Timestamp, i64)> = None;
    for e in events {
        let own = e.step.as_deref() == Some(sm.name.as_str());
        match e.kind {
            EventKind::StepRetryScheduled | EventKind::CompensationRetryScheduled if own => {
                let at = e.detail.as_ref().and_then(|d| {
                    serde_json::from_value::<Timestamp>(d["next_attempt_at"].clone()).ok()
                });
                not_before = at.map(|t| (t, e.seq));
            }
            EventKind::StepRetried
            | EventKind::CompensationRetried
            | EventKind::StepReady
            | EventKind::CompensationReady
                if own =>
            {
                not_before = None
            }
            EventKind::JobUnblocked | EventKind::JobRoundStarted => not_before = None,
            EventKind::StepLeased | EventKind::CompensationLeased if own => {
                if let Some((t, seq)) = not_before.take() {
                    if e.at < t {
                        return Err(format!(
                            "{tag}: attempt {:?} leased at {} (event {}) before its backoff ended at {t} (event {seq})",
                            e.attempt, e.at, e.seq
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    for e in events
        .iter()
        .filter(mine)
        .filter(|e| e.kind == EventKind::StepLeased)
    {
        // In the lease's own round: a dependency's success in an earlier round does not count.
        let round_start = events
            .iter()
            .filter(|x| x.seq < e.seq && x.kind == EventKind::JobRoundStarted)
            .map(|x| x.seq)
            .max()
            .unwrap_or(0);
        for &d in &sm.deps {
            let dep = &m.steps[d].name;
            let done = events.iter().any(|x| {
                x.seq < e.seq
                    && x.seq > round_start
                    && x.step.as_deref() == Some(dep.as_str())
                    && matches!(
                        x.kind,
                        EventKind::StepSucceeded | EventKind::StepSkipped | EventKind::StepKept
                    )
            });
            if !done {
                return Err(format!(
                    "{tag}: history shows attempt {:?} leased (event {}) before dependency {dep} succeeded or was skipped",
                    e.attempt, e.seq
                ));
            }
        }
    }
    Ok(())
}

/// A job never starts before its `run_at` as last set: by the submit or by the newest
/// `job_rescheduled` before the start (a rescheduled job never starts before its new run_at).
fn check_start_history(tag: &str, events: &[Event]) -> Check {
    let run_at_of = |e: &Event, field: &[&str]| {
        let mut v = e.detail.as_ref()?;
        for f in field {
            v = v.get(*f)?;
        }
        serde_json::from_value::<Timestamp>(v.clone()).ok()
    };
    let mut run_at: Option<(Timestamp, i64)> = None;
    for e in events {
        match e.kind {
            EventKind::JobSubmitted => run_at = run_at_of(e, &["run_at"]).map(|t| (t, e.seq)),
            EventKind::JobRescheduled => {
                if let Some(t) = run_at_of(e, &["run_at", "to"]) {
                    run_at = Some((t, e.seq));
                }
            }
            EventKind::JobStarted => {
                if let Some((t, seq)) = run_at {
                    if e.at < t {
                        return Err(format!(
                            "{tag}: started at {} (event {}) before its run_at {t} (set by event {seq})",
                            e.at, e.seq
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The event that records a job ending in `state`; `None` for a state that is not final.
fn end_event(state: JobState) -> Option<EventKind> {
    match state {
        JobState::Succeeded => Some(EventKind::JobSucceeded),
        JobState::Failed => Some(EventKind::JobFailed),
        JobState::Cancelled => Some(EventKind::JobCancelled),
        _ => None,
    }
}

/// A finished job's history ends with its `job_<state>` event; after it only the settling of
/// steps that were still running may follow (their late report, expiry or deadline cancels them),
/// and at most one `job_rerun`.
fn check_terminal_history(tag: &str, state: JobState, events: &[Event]) -> Check {
    let Some(kind) = end_event(state) else {
        return Err(format!("{tag}: {state} is not a final state"));
    };
    // `job_rerun` records a rerun of the finished job: the one job event that may follow its end.
    let job_event = |e: &&Event| e.kind.is_job_event() && e.kind != EventKind::JobRerun;
    let Some(pos) = events.iter().rposition(|e| job_event(&e)) else {
        return Err(format!("{tag}: {state} without any job event"));
    };
    if events[pos].kind != kind {
        return Err(format!(
            "{tag}: {state}, but its last job event is {}",
            events[pos].kind
        ));
    }
    if events.iter().filter(|e| e.kind == kind).count() != 1 {
        return Err(format!("{tag}: more than one {kind} event"));
    }
    let reruns = events[pos + 1..]
        .iter()
        .filter(|e| e.kind == EventKind::JobRerun)
        .count();
    if reruns > 1 {
        return Err(format!("{tag}: rerun {reruns} times (once at most)"));
    }
    if let Some(e) = events[pos + 1..].iter().find(|e| {
        let settling = e.step.is_some()
            && matches!(
                e.kind,
                EventKind::StepLeaseExpired
                    | EventKind::StepDeadlineExceeded
                    | EventKind::StepCancelled
            );
        !settling && e.kind != EventKind::JobRerun
    }) {
        return Err(format!(
            "{tag}: event {} ({}) recorded after {kind}",
            e.seq, e.kind
        ));
    }
    Ok(())
}
