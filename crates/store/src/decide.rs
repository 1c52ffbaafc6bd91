//! Decisions both backends make the same way, written once: a backend calls these and only turns
//! the answer into SQL. (What a command does to a job is decided by `overseer_core::apply`;
//! these are the few choices around it that concern rows.)

use overseer_core::bucket::{next_token_at, refill, whole};
use overseer_core::{Command, Job, JobId, JobState, Rejection, Step, Timestamp, Transition};

use overseer_core::schedule::{self, Overlap, Timing};

use crate::{
    AgentSettings, Error, Fire, LeaseRef, OrderingKeyStatus, Result, Schedule, ScheduleUpdate,
};

/// The leases a transition took off their steps, which the store keeps (table `leases`) so each
/// still resolves to its attempt: a step row names only its latest lease.
pub(crate) fn retired_leases(t: &Transition) -> impl Iterator<Item = LeaseRef> + '_ {
    t.retired_leases.iter().map(|r| LeaseRef {
        lease_id: r.lease_id,
        job_id: t.job.id,
        step: r.step,
        attempt: r.attempt,
    })
}

/// Adds a step read back from its row to `job`, which must take steps in index order: a gap or
/// a repeat means the rows are not what a write left.
pub(crate) fn push_step(job: &mut Job, idx: i64, step: Step) -> Result<()> {
    if usize::try_from(idx).ok() != Some(job.steps.len()) {
        return Err(Error::Corrupt(format!(
            "steps.idx: job {} has step index {idx} out of order",
            job.id
        )));
    }
    job.steps.push(step);
    Ok(())
}

/// Checks a job read back whole: a stored job always has at least one step.
pub(crate) fn loaded(job: Job) -> Result<Job> {
    if job.steps.is_empty() {
        return Err(Error::Corrupt(format!(
            "steps: job {} has no steps",
            job.id
        )));
    }
    Ok(job)
}

/// The ordering key an admitted job waits on when it would start at once on heading that key:
/// a keyed job that is pending for its key alone (already due when admitted). The backend asks
/// whether it heads the key; if so, [`head_starts`] is its start.
pub(crate) fn waits_on_key(admission: &Transition) -> Option<&str> {
    let job = &admission.job;
    let due = job.run_at.is_none_or(|t| t <= job.created_at);
    if job.state == JobState::Pending && due {
        job.ordering_key.as_deref()
    } else {
        None
    }
}

/// The start of an admitted keyed job found heading its key, at its admission's instant.
pub(crate) fn head_starts(admission: &Transition) -> Result<Transition> {
    let job = &admission.job;
    Ok(overseer_core::apply(
        job,
        Command::Activate,
        job.created_at,
    )?)
}

/// The next due time of a schedule replaced by `update`, decided by `schedule::replan` from the
/// row as stored; `None` when the definition did not change (nothing to write).
pub(crate) fn replanned(stored: &Schedule, update: &ScheduleUpdate) -> Option<Option<Timestamp>> {
    if stored.spec == update.spec {
        return None;
    }
    let timing = Timing {
        paused: stored.paused,
        next_fire_at: stored.next_fire_at,
        last_fire_at: stored.last_fire_at,
    };
    Some(schedule::replan(
        &stored.spec,
        &update.spec,
        &update.cron,
        timing,
        update.now,
    ))
}

/// Whether a leader's firing is no longer the schedule's to make: the schedule was paused, its
/// due time moved on (another leader fired it), or it was replaced since the firing was planned.
pub(crate) fn firing_is_stale(schedule: &Schedule, fire: &Fire) -> bool {
    schedule.paused || schedule.next_fire_at != Some(fire.due_at) || schedule.spec != fire.spec
}

/// The previous job whose state decides a firing under `overlap: skip`; the backend reads that
/// job's state for [`fire_plan`]. `None`: nothing holds the firing back.
pub(crate) fn overlap_holder(schedule: &Schedule) -> Option<JobId> {
    (schedule.spec.overlap == Overlap::Skip)
        .then_some(schedule.last_job_id)
        .flatten()
}

/// What a current firing does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirePlan {
    /// Moves past the due time without a job (the supervisor decided to skip it).
    Pass,
    /// Moves past the due time: the previous job still runs under `overlap: skip`.
    Skip { running: JobId },
    /// Submits the firing's job and records it as the schedule's last.
    Fire,
}

/// Decides a current firing, given the [`overlap_holder`] with its state as stored (`None`
/// when that job is gone: a removed job holds nothing back).
pub(crate) fn fire_plan(fire: &Fire, holder: Option<(JobId, Option<JobState>)>) -> FirePlan {
    if fire.job.is_none() {
        return FirePlan::Pass;
    }
    match holder {
        Some((running, Some(state))) if !state.is_terminal() => FirePlan::Skip { running },
        _ => FirePlan::Fire,
    }
}

/// What a submit resolves to when its idempotency key is already held by `holder` (its id and
/// fingerprint): the same request again answers the holder; a different one with the same key
/// is a conflict, reported at the submit's `index` in its batch.
pub(crate) fn key_holder(index: usize, job: &Job, holder: (JobId, &str)) -> Result<JobId> {
    let (existing, fingerprint) = holder;
    if fingerprint == job.fingerprint {
        return Ok(existing);
    }
    Err(Error::IdempotencyConflict {
        index,
        key: job.idempotency_key.clone().unwrap_or_default(),
        existing,
    })
}

/// Refuses agent settings no store may keep: a rate that is not a positive number of leases per
/// second (a bucket cannot fill at zero or less, and SQLite would store NaN as NULL).
pub(crate) fn check_agent_settings(
    agent: &str,
    settings: &AgentSettings,
) -> std::result::Result<(), Rejection> {
    match settings.rate {
        Some(rate) if !(rate.is_finite() && rate > 0.0) => Err(Rejection::NotAllowed {
            reason: format!(
                "agent `{agent}`: a rate is a positive number of leases per second, not {rate}"
            ),
        }),
        _ => Ok(()),
    }
}

/// An ordering key's status from its head (the unfinished job submitted first, if any) and its
/// count of unfinished jobs, the head among them: the rest wait behind it.
pub(crate) fn ordering_key_status(
    key: &str,
    head: Option<Job>,
    unfinished: u64,
) -> OrderingKeyStatus {
    let waiting = match head {
        Some(_) => unfinished.saturating_sub(1),
        None => 0,
    };
    OrderingKeyStatus {
        key: key.to_string(),
        head,
        waiting,
    }
}

/// What an agent's limits allow one claim: pause, `max_concurrency` and the `rate` token bucket,
/// decided here for both backends, which read the inputs and write back what
/// [`ClaimLimits::spend`] answers in the claim's own transaction.
///
/// The bucket holds at most one second's worth of tokens (`max(1, rate)`), refills at `rate` per
/// second from its stored instant, and each lease takes one. It is stored lazily (tokens as of
/// an instant), brought up to the claim's `now` when read and written back only when a claim took
/// tokens; refilling is capped, so reading it at any instant in between gives the same answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ClaimLimits {
    /// Leases the claim may take before the bucket is asked: what it asked for, within the
    /// agent's free concurrency.
    pub(crate) room: usize,
    /// Leases the claim may take: `room`, and whole tokens in the bucket.
    pub(crate) want: usize,
    bucket: Option<Bucket>,
}

/// An agent's bucket brought up to a claim's `now`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Bucket {
    rate: f64,
    tokens: f64,
    counted_at: Timestamp,
}

/// An agent's stored limits, as a claim reads them under its transaction.
#[derive(Clone, Debug, Default)]
pub(crate) struct StoredLimits {
    pub(crate) settings: AgentSettings,
    pub(crate) tokens: Option<f64>,
    pub(crate) tokens_at: Option<Timestamp>,
}

impl StoredLimits {
    /// Whether the claim must count the agent's leases in flight (only under `max_concurrency`).
    pub(crate) fn counts_in_flight(&self) -> bool {
        !self.settings.paused && self.settings.max_concurrency.is_some()
    }
}

impl ClaimLimits {
    /// What a claim asking for `asked` leases at `now` may take; `in_flight` is the agent's
    /// leases in flight (work or undo, expired but not yet swept ones included), read when
    /// [`StoredLimits::counts_in_flight`] says so.
    pub(crate) fn of(
        stored: &StoredLimits,
        asked: usize,
        in_flight: Option<u64>,
        now: Timestamp,
    ) -> ClaimLimits {
        let settings = &stored.settings;
        if settings.paused {
            return ClaimLimits {
                room: 0,
                want: 0,
                bucket: None,
            };
        }
        let mut room = asked;
        if let (Some(max), Some(in_flight)) = (settings.max_concurrency, in_flight) {
            let free = u64::from(max).saturating_sub(in_flight);
            room = room.min(usize::try_from(free).unwrap_or(usize::MAX));
        }
        let bucket = settings.rate.map(|rate| {
            let (tokens, counted_at) = refill(rate, stored.tokens, stored.tokens_at, now);
            Bucket {
                rate,
                tokens,
                counted_at,
            }
        });
        let want = bucket.map_or(room, |b| room.min(whole(b.tokens)));
        ClaimLimits { room, want, bucket }
    }

    /// Whether the bucket ran dry before the claim's other bounds after `claimed` leases: only
    /// then can the bucket be what held work back.
    pub(crate) fn ran_dry(&self, claimed: usize) -> bool {
        self.bucket.is_some() && claimed == self.want && self.want < self.room
    }

    /// The bucket to store after `claimed` leases (tokens left, as of when), when they took any.
    pub(crate) fn spend(&self, claimed: usize) -> Option<(f64, Timestamp)> {
        let b = self.bucket?;
        (claimed > 0).then_some((b.tokens - claimed as f64, b.counted_at))
    }

    /// When the next lease may start, if the bucket held back claimable work (`has_more`, asked
    /// only when [`ClaimLimits::ran_dry`]).
    pub(crate) fn throttled_until(&self, claimed: usize, has_more: bool) -> Option<Timestamp> {
        let b = self.bucket?;
        let left = b.tokens - claimed as f64;
        (self.ran_dry(claimed) && has_more).then(|| next_token_at(b.rate, left, b.counted_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: Option<u32>, rate: Option<f64>, paused: bool) -> StoredLimits {
        StoredLimits {
            settings: AgentSettings {
                max_concurrency: max,
                rate,
                paused,
            },
            tokens: None,
            tokens_at: None,
        }
    }

    // Proves a rate must be a positive finite number, named with its agent, and that no rate or
    // a positive one passes.
    #[test]
    fn agent_settings_refuse_a_rate_that_cannot_fill_a_bucket() {
        let with = |rate| AgentSettings {
            rate,
            ..AgentSettings::default()
        };
        assert_eq!(check_agent_settings("a", &with(None)), Ok(()));
        assert_eq!(check_agent_settings("a", &with(Some(0.5))), Ok(()));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            match check_agent_settings("dns", &with(Some(bad))) {
                Err(Rejection::NotAllowed { reason }) => {
                    assert!(reason.contains("`dns`"), "{reason}")
                }
                other => panic!("rate {bad}: {other:?}"),
            }
        }
    }

    // Proves the jobs behind an ordering key's head are the unfinished ones but the head, and
    // that a key with no head has none waiting.
    #[test]
    fn an_ordering_key_waits_behind_its_head() {
        let none = ordering_key_status("k", None, 0);
        assert_eq!((none.key.as_str(), none.waiting), ("k", 0));
        let spec: overseer_core::JobSpec =
            serde_json::from_value(serde_json::json!({"steps": [{"name": "s", "agent": "a"}]}))
                .expect("spec");
        let head = Job::from_spec(JobId::generate(), &spec, Timestamp::from_millis(0));
        assert_eq!(ordering_key_status("k", Some(head.clone()), 1).waiting, 0);
        assert_eq!(ordering_key_status("k", Some(head), 4).waiting, 3);
    }

    // Proves a claim is bounded by what it asked, the agent's free concurrency and whole tokens,
    // that a paused agent gets nothing, and that only a bucket that ran dry holds work back.
    #[test]
    fn claim_limits_take_the_tightest_bound() {
        let now = Timestamp::from_millis(1_000_000);
        let none = ClaimLimits::of(&limits(None, None, false), 32, None, now);
        assert_eq!((none.room, none.want), (32, 32));
        assert_eq!(none.spend(32), None);
        assert_eq!(none.throttled_until(32, true), None);

        let paused = ClaimLimits::of(&limits(Some(5), Some(10.0), true), 32, Some(0), now);
        assert_eq!((paused.room, paused.want), (0, 0));
        assert!(!limits(Some(5), None, true).counts_in_flight());

        let busy = ClaimLimits::of(&limits(Some(5), None, false), 32, Some(3), now);
        assert_eq!((busy.room, busy.want), (2, 2));
        let over = ClaimLimits::of(&limits(Some(5), None, false), 32, Some(9), now);
        assert_eq!(over.want, 0);

        // A fresh bucket of rate 4 holds 4 tokens: the claim takes 4 and the bucket ran dry.
        let rated = ClaimLimits::of(&limits(None, Some(4.0), false), 32, None, now);
        assert_eq!((rated.room, rated.want), (32, 4));
        assert!(rated.ran_dry(4) && !rated.ran_dry(3));
        assert_eq!(rated.spend(4), Some((0.0, now)));
        assert_eq!(rated.spend(0), None);
        assert_eq!(
            rated.throttled_until(4, true),
            Some(Timestamp::from_millis(1_000_250))
        );
        assert_eq!(rated.throttled_until(4, false), None);

        // Concurrency tighter than the bucket: the bucket did not hold anything back.
        let both = ClaimLimits::of(&limits(Some(2), Some(4.0), false), 32, Some(0), now);
        assert_eq!((both.room, both.want), (2, 2));
        assert!(!both.ran_dry(2));
    }
}
