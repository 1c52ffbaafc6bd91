//! `FETCH`: a worker waits for a job from its queues and takes it with a lease of its own.

use std::pin::Pin;
use std::sync::Arc;

use overseer_core::Timestamp;
use overseer_store::{Claim, Claimed};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::Connection;
use crate::job;
use crate::resp::Reply;
use crate::{Held, WorkerState};

impl Connection {
    pub(super) async fn fetch(&self, args: &str) -> (Reply, Option<(String, Held)>) {
        let app = self.fk.app();
        let wait = self.fk.config().fetch_wait;
        let shutdown = app.shutdown().clone();
        let queues = self.fetch_queues(args);
        if queues.is_empty() {
            // Quiet or terminating workers get no new work (as in Faktory), nor do fetches of
            // only `http:` queues.
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => {}
            }
            return (Reply::Null, None);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Register for wake-ups before looking, so work that turns ready in between wakes us.
            let notifies: Vec<Arc<Notify>> =
                queues.iter().map(|q| app.notifier().agent(q)).collect();
            let mut waits: Vec<Pin<Box<Notified<'_>>>> = notifies
                .iter()
                .map(|n| {
                    let mut f = Box::pin(n.notified());
                    f.as_mut().enable();
                    f
                })
                .collect();
            let now = app.now();
            let mut throttled: Option<Timestamp> = None;
            for q in &queues {
                let claim = Claim::of_worker(q, &self.holder, vec![app.new_lease_id()], now);
                match app.store().steps_claim(claim).await {
                    Ok(result) => {
                        if let Some(c) = result.claimed.into_iter().next() {
                            // A fetch takes one job, so its claim is always full: more may
                            // be ready for another fetch (`Notifier::claimed`).
                            app.notifier().wake_agent(q);
                            return self.leased(q, c, now);
                        }
                        if let Some(t) = result.throttled_until {
                            throttled = Some(throttled.map_or(t, |u| u.min(t)));
                        }
                    }
                    Err(e) => {
                        // This fetch may hold a wake-up meant for ready work: pass it on.
                        queues.iter().for_each(|q| app.notifier().wake_agent(q));
                        return (Reply::err(e), None);
                    }
                }
            }
            let retry = throttled
                .map(|t| tokio::time::Instant::now() + now.until(t).as_std())
                .unwrap_or(deadline)
                .min(deadline);
            let any = futures::future::select_all(waits.iter_mut().map(|w| w.as_mut()));
            tokio::select! {
                _ = any => {}
                _ = tokio::time::sleep_until(retry), if retry < deadline => {}
                _ = tokio::time::sleep_until(deadline) => return (Reply::Null, None),
                _ = shutdown.cancelled() => return (Reply::Null, None),
            }
        }
    }

    /// The queues a `FETCH` of `args` may take work from (`default` when it names none); none
    /// for a quiet or terminating worker.
    fn fetch_queues<'a>(&self, args: &'a str) -> Vec<&'a str> {
        let mut queues: Vec<&str> = args.split_whitespace().collect();
        if queues.is_empty() {
            queues.push("default");
        }
        // Queues named like HTTP targets are the server's own push agent's to claim.
        queues.retain(|q| !q.starts_with(overseer_core::push::AGENT_PREFIX));
        let quiet = self
            .wid
            .as_deref()
            .is_some_and(|w| self.fk.worker_state(w) != WorkerState::Running);
        if quiet {
            queues.clear();
        }
        queues
    }

    fn leased(&self, queue: &str, c: Claimed, now: Timestamp) -> (Reply, Option<(String, Held)>) {
        let app = self.fk.app();
        app.committed(&c.transition);
        app.metrics()
            .leases_granted
            .get_or_create(&overseer_server::metrics::AgentLabel {
                agent: queue.to_string(),
            })
            .inc();
        let job = &c.transition.job;
        let s = &job.steps[c.step];
        let jid = match job.labels.get(job::LABEL_JID) {
            Some(jid) if job::is_faktory(job) && !s.is_compensating() => jid.clone(),
            _ => format!("{}/{}", job.id, s.name),
        };
        let fail = self.fk.failure_of(&jid);
        let body = job::for_fetch(job, c.step, fail.as_ref());
        let Some(lease_id) = s.lease_id else {
            return (Reply::err("claimed step has no lease"), None);
        };
        let held = Held {
            job_id: job.id,
            step: c.step,
            attempt: s.attempt,
            lease_id,
            holder: self.holder.clone(),
            expires_at: s.lease_expires_at.unwrap_or(now),
        };
        self.fk.remember_lease(jid.clone(), held.clone());
        (Reply::json(&body), Some((jid, held)))
    }
}
