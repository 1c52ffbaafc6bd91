//! In-process wake-ups: agents long-polling for leases, clients waiting for a job to finish, and
//! the supervisor's timer. Notifications only wake loops early; every loop re-reads the store, so
//! a lost or spurious wake-up costs latency, never correctness.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use overseer_core::{Effect, JobId, Timestamp};
use tokio::sync::{broadcast, Notify};

/// Wake-up channels of one server node.
pub struct Notifier {
    agents: Mutex<HashMap<String, Arc<Notify>>>,
    finished: broadcast::Sender<JobId>,
    /// The supervisor sleeps until the earliest due instant it knows of; transitions that create
    /// an earlier one lower it and wake the supervisor.
    next_due: Mutex<Option<Timestamp>>,
    supervisor: Notify,
    delivery: Notify,
    /// The HTTP push agent: wakes when an `http:` agent name has work, with the names.
    push: Notify,
    push_names: Mutex<BTreeSet<String>>,
    /// Job changes for `GET /v1/events/stream`.
    changes: crate::stream::Changes,
}

impl Default for Notifier {
    fn default() -> Self {
        let (finished, _) = broadcast::channel(1024);
        Notifier {
            agents: Mutex::new(HashMap::new()),
            finished,
            next_due: Mutex::new(None),
            supervisor: Notify::new(),
            delivery: Notify::new(),
            push: Notify::new(),
            push_names: Mutex::new(BTreeSet::new()),
            changes: crate::stream::Changes::default(),
        }
    }
}

impl Notifier {
    /// The wake-up handle for long-polls of one agent name.
    pub fn agent(&self, agent: &str) -> Arc<Notify> {
        let mut map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(agent.to_string()).or_default().clone()
    }

    /// Tells `agent`'s long-polls that work may be ready: wakes one of them (or the next to
    /// wait), not all. A single ready step so costs one claim, not one per idle worker; a
    /// long-poll that leases as many steps as it asked for passes the wake-up on
    /// ([`Notifier::claimed`]), so a burst reaches as many long-polls as it needs; and one that
    /// goes away after it was woken, before it looked, hands the wake-up to the next (tokio's
    /// `Notify` forwards a `notify_one` a dropped waiter did not take).
    pub fn wake_agent(&self, agent: &str) {
        if agent.starts_with(overseer_core::push::AGENT_PREFIX) {
            self.push_names
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(agent.to_string());
            // `notify_one` keeps a permit: a wake-up while the push agent is busy is not lost.
            self.push.notify_one();
        }
        let notify = {
            let map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
            map.get(agent).cloned()
        };
        if let Some(n) = notify {
            n.notify_one();
        }
    }

    pub fn subscribe_finished(&self) -> broadcast::Receiver<JobId> {
        self.finished.subscribe()
    }

    /// Asks the supervisor to run no later than `at`.
    pub fn due_at(&self, at: Timestamp) {
        let mut next = self.next_due.lock().unwrap_or_else(|p| p.into_inner());
        if next.is_none_or(|n| at < n) {
            *next = Some(at);
            self.supervisor.notify_one();
        }
    }

    /// The earliest due instant asked for since the last call, cleared by taking it.
    pub fn take_due(&self) -> Option<Timestamp> {
        self.next_due
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    pub fn supervisor_wake(&self) -> &Notify {
        &self.supervisor
    }

    pub fn changes(&self) -> &crate::stream::Changes {
        &self.changes
    }

    pub fn push_wake(&self) -> &Notify {
        &self.push
    }

    /// Keeps `agent` for the push agent's next round without waking it now (it has no free
    /// slot; a request that finishes wakes it).
    pub fn keep_push_name(&self, agent: &str) {
        self.push_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent.to_string());
    }

    /// The `http:` agent names woken since the last call.
    pub fn take_push_names(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.push_names.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn delivery_wake(&self) -> &Notify {
        &self.delivery
    }

    /// Carries out the effects of a committed transition.
    pub fn apply(&self, job: JobId, effects: &[Effect]) {
        for effect in effects {
            match effect {
                Effect::Ready { agent } => self.wake_agent(agent),
                Effect::ReadyAt { at, .. } | Effect::Due { at } => self.due_at(*at),
                Effect::Finished { .. } => {
                    // No receivers is fine: nobody is waiting.
                    let _ = self.finished.send(job);
                }
                Effect::Alert { .. } | Effect::Callback { .. } => self.delivery.notify_one(),
            }
        }
    }
}
