//! The HTTP push agent: every node runs steps that name an `http` target itself.
//!
//! It claims them through the same store path as any agent (`Store::steps_claim`, under the
//! target's reserved `http:host:port` agent name, so per-agent limits and pauses apply per host),
//! calls the target with the guarded outbound client (no internal addresses unless allowed,
//! resolved at connect time, no redirects), and reports the answer through the core like an
//! agent's report. The lease's deadline is counted from the moment the claim was sent, on this
//! node's monotonic clock: the request is cut before it, and nothing is reported after it. A node
//! that dies mid-request reports nothing; the lease expires and the step is leased again, with
//! the same idempotency key.
//!
//! A circuit breaker per host ([`overseer_core::push::Breaker`], this node's view) stops claiming
//! a host's steps after repeated retryable failures: they wait, attempts intact, until a probe
//! after the cool-down gets a healthy answer.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use overseer_core::push::{self, Breaker, BreakerSettings, HttpTarget, Verdict};
use overseer_core::wire::{Lease, LeaseKind};
use overseer_core::{Command, Span, Transition};
use overseer_store::Claim;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::{AgentLabel, PushLabel};
use crate::outbound::Signer;
use crate::App;

/// How the push agent runs on this node.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Requests in flight at once on this node; 0 turns the push agent off on this node.
    pub concurrency: usize,
    pub breaker: BreakerSettings,
    pub signer: Option<Signer>,
    /// How often to look for ready HTTP steps that no wake-up announced (breakers whose
    /// cool-down ended, rate-limited hosts, a missed signal) while HTTP work was seen lately.
    pub poll: Span,
    /// How often to look when no HTTP work was seen for a while: a node of a cluster that has
    /// no HTTP targets pays one `agents_ready_now` per this.
    pub poll_idle: Span,
    /// How long in-flight requests may finish after shutdown before they are dropped (their
    /// leases then expire and are healed like any agent's).
    pub grace: Span,
}

impl Settings {
    pub fn from_config(config: &crate::Config) -> Self {
        Settings {
            concurrency: config.http_concurrency,
            breaker: BreakerSettings {
                failures: config.http_breaker_failures,
                cool_down: config.http_breaker_cool_down,
            },
            signer: config
                .webhook_secret
                .as_deref()
                .and_then(|s| Signer::new(s).ok()),
            poll: Span::from_secs(1),
            poll_idle: Span::from_secs(30),
            grace: Span::from_secs(10),
        }
    }
}

/// The push agent of one node.
pub struct Pusher {
    app: App,
    settings: Settings,
    http: reqwest::Client,
    slots: Arc<Semaphore>,
}

/// What one attempt came to, for the report, the breaker and the metrics.
struct Outcome {
    verdict: Verdict,
    /// The result (success) or the error text (failure).
    result: serde_json::Value,
    error: String,
    retry_after: Option<Span>,
    /// `success`, `accepted`, `fatal`, `retryable`, `timeout`, `error` or `refused`.
    label: &'static str,
}

impl Pusher {
    pub fn new(app: App, settings: Settings) -> anyhow::Result<Self> {
        // Per-request timeouts are set on each request from the lease's deadline.
        let http = crate::outbound::client(app.outbound().clone(), Duration::from_secs(24 * 3600))?;
        Ok(Pusher {
            slots: Arc::new(Semaphore::new(settings.concurrency)),
            app,
            settings,
            http,
        })
    }

    pub async fn run(self, shutdown: CancellationToken) {
        if self.settings.concurrency == 0 {
            return;
        }
        let this = Arc::new(self);
        let mut tasks = JoinSet::new();
        let mut next_scan = Instant::now();
        let idle_after = this.settings.poll_idle.as_std();
        let mut last_work: Option<Instant> = None;
        loop {
            let scan = Instant::now() >= next_scan;
            match this.claim_round(scan, &mut tasks).await {
                Ok(true) => {
                    // Work is about: look every `poll` from now on (a breaker's cool-down or a
                    // rate limit may hold some of it), not only when the idle scan comes.
                    last_work = Some(Instant::now());
                    next_scan = next_scan.min(Instant::now() + this.settings.poll.as_std());
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "http targets: cannot claim; will retry"),
            }
            if scan {
                let busy = last_work.is_some_and(|t| t.elapsed() < idle_after);
                let poll = if busy {
                    this.settings.poll
                } else {
                    this.settings.poll_idle
                };
                next_scan = Instant::now() + poll.as_std();
            }
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next_scan) => {}
                _ = this.app.notifier().push_wake().notified() => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        let grace = tokio::time::timeout(this.settings.grace.as_std(), async {
            while tasks.join_next().await.is_some() {}
        });
        if grace.await.is_err() {
            tracing::warn!(
                left = tasks.len(),
                "http targets: requests still running at shutdown are dropped; their leases expire"
            );
            tasks.abort_all();
        }
    }

    /// Claims what it can for the HTTP agent names that have ready work: those woken since the
    /// last round, and on `scan` every one the store knows of. Answers whether there were any.
    async fn claim_round(
        self: &Arc<Self>,
        scan: bool,
        tasks: &mut JoinSet<()>,
    ) -> Result<bool, overseer_store::Error> {
        let mut names: BTreeSet<String> = self.app.notifier().take_push_names();
        if scan {
            let ready = self.app.store().agents_ready_now(self.app.now()).await?;
            names.extend(
                ready
                    .into_iter()
                    .map(|ready| ready.agent)
                    .filter(|a| a.starts_with(push::AGENT_PREFIX)),
            );
        }
        let any = !names.is_empty();
        for agent in names {
            let free = self.slots.available_permits();
            if free == 0 {
                // Look again when a request finishes (the loop wakes on it).
                self.app.notifier().keep_push_name(&agent);
                continue;
            }
            let full = self.claim_for(&agent, free, tasks).await?;
            if full {
                // There may be more: another round at once.
                self.app.notifier().wake_agent(&agent);
            }
        }
        Ok(any)
    }

    /// Claims up to `free` leases of one host and starts their requests. Returns whether it got
    /// as many as it asked for.
    async fn claim_for(
        self: &Arc<Self>,
        agent: &str,
        free: usize,
        tasks: &mut JoinSet<()>,
    ) -> Result<bool, overseer_store::Error> {
        let allowance = self.breaker(agent, |b, now| b.allowance(now));
        let max = free
            .min(allowance.unwrap_or(usize::MAX))
            .min(self.app.limits().leases_per_call);
        if max == 0 {
            return Ok(false);
        }
        // The deadline of every lease counts from here, before the claim is sent.
        let sent = Instant::now();
        let now = self.app.now();
        let claim = Claim::of_worker(
            agent,
            &format!("{}/http", self.app.node()),
            (0..max).map(|_| self.app.new_lease_id()).collect(),
            now,
        );
        let claimed = self.app.store().steps_claim(claim).await?.claimed;
        self.breaker(agent, |b, _| b.claimed(claimed.len()));
        self.app
            .metrics()
            .leases_granted
            .get_or_create(&AgentLabel {
                agent: agent.to_string(),
            })
            .inc_by(claimed.len() as u64);
        let got = claimed.len();
        for c in claimed {
            self.app.committed(&c.transition);
            let work = Work::of(&c.transition, c.step, now, sent);
            let permit = self.slots.clone().try_acquire_owned().ok();
            let (Some(work), Some(permit)) = (work, permit) else {
                // Cannot happen (a claimed http: step has a target; only this loop takes
                // permits); the lease expires and is healed if it does.
                self.breaker(agent, |b, _| b.released());
                continue;
            };
            let this = self.clone();
            tasks.spawn(async move { this.attempt(work, permit).await });
        }
        Ok(got == max)
    }

    /// Applies `f` to the breaker of `agent` at this node's `now`.
    fn breaker<T>(
        &self,
        agent: &str,
        f: impl FnOnce(&mut Breaker, overseer_core::Timestamp) -> T,
    ) -> T {
        let now = self.app.now();
        let mut map = self
            .app
            .http_breakers()
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let breaker = map.entry(agent.to_string()).or_default();
        let was_open = breaker.is_open();
        let out = f(breaker, now);
        if breaker.is_open() != was_open {
            self.app
                .metrics()
                .http_breaker_open
                .get_or_create(&AgentLabel {
                    agent: agent.to_string(),
                })
                .set(i64::from(breaker.is_open()));
            tracing::warn!(
                host = agent,
                open = breaker.is_open(),
                "http target circuit breaker"
            );
        }
        out
    }

    /// Runs one attempt: the request, then the report, both before the lease's deadline.
    async fn attempt(self: Arc<Self>, work: Work, _permit: OwnedSemaphorePermit) {
        let outcome = self.call(&work).await;
        let healthy = matches!(
            outcome.verdict,
            Verdict::Success | Verdict::Accepted | Verdict::Fatal
        );
        if outcome.label != "refused" {
            // A refusal by the outbound policy says nothing about the host.
            self.breaker(&work.lease.agent, |b, now| {
                b.record(healthy, now, &self.settings.breaker)
            });
        }
        self.app
            .metrics()
            .http_requests
            .get_or_create(&PushLabel {
                agent: work.lease.agent.clone(),
                outcome: outcome.label.to_string(),
            })
            .inc();
        if outcome.verdict == Verdict::Accepted {
            tracing::debug!(job = %work.lease.job_id, step = %work.lease.step, "http target took the lease (async)");
            return;
        }
        if Instant::now() >= work.deadline {
            tracing::warn!(job = %work.lease.job_id, step = %work.lease.step, "http target: the lease ran out before the report; nothing reported");
            return;
        }
        self.report(&work, outcome).await;
    }

    /// Sends the request and maps the answer; the request is cut at its timeout or just before
    /// the lease's deadline, whichever comes first.
    async fn call(&self, work: &Work) -> Outcome {
        let target = &work.target;
        let what = format!("{} {}", target.method.as_str(), target.url);
        // IP literals never reach the filtering resolver: judge them here, every time (the
        // allow list may have changed since the job was accepted).
        if let Err(refused) = self.app.outbound().check_url(&target.url) {
            return failure(Verdict::Fatal, format!("{what}: {refused}"), "refused");
        }
        let budget = work.request_budget();
        let request = self.request(work);
        let answer = tokio::time::timeout(budget, async {
            let res = request.send().await?;
            let status = res.status().as_u16();
            let retry_after = res
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| push::retry_after(v, self.app.now()));
            let body = read_capped(res, self.app.limits().result_bytes).await?;
            Ok::<_, reqwest::Error>((status, retry_after, body))
        })
        .await;
        match answer {
            Err(_) => failure(
                Verdict::Retryable,
                format!("{what}: no answer within {}", Span::from(budget)),
                "timeout",
            ),
            Ok(Err(e)) => failure(
                Verdict::Retryable,
                format!("{what}: {}", causes(&e)),
                "error",
            ),
            Ok(Ok((status, retry_after, body))) => {
                answer_outcome(&what, status, retry_after, body, target.asynchronous)
            }
        }
    }

    fn request(&self, work: &Work) -> reqwest::RequestBuilder {
        let l = &work.lease;
        let body = serde_json::to_vec(&serde_json::json!({
            "payload": l.payload,
            "inputs": l.inputs,
        }))
        .unwrap_or_default();
        let method = reqwest::Method::from_bytes(work.target.method.as_str().as_bytes())
            .unwrap_or(reqwest::Method::POST);
        let kind = match l.kind {
            LeaseKind::Work => "work",
            LeaseKind::Compensate => "compensate",
        };
        let mut req = self.http.request(method, &work.target.url);
        for (k, v) in &work.target.headers {
            req = req.header(k, v);
        }
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", &l.idempotency_key)
            .header("Overseer-Job-Id", l.job_id.to_string())
            .header("Overseer-Step", &l.step)
            .header("Overseer-Kind", kind)
            .header("Overseer-Attempt", l.attempt.to_string())
            .header("Overseer-Lease-Id", l.lease_id.to_string())
            .header("Overseer-Complete-By", l.complete_by.to_rfc3339())
            .header("Overseer-Lease-Ms", l.lease_ms.to_string());
        if let Some(signer) = &self.settings.signer {
            let id = l.lease_id.to_string();
            let timestamp = self.app.now().as_millis() / 1000;
            req = req
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signer.sign(&id, timestamp, &body));
        }
        req.body(body)
    }

    /// Applies the outcome through the core, fenced like any agent's report.
    async fn report(&self, work: &Work, outcome: Outcome) {
        let (step, attempt) = (work.step, work.lease.attempt);
        let command = match (outcome.verdict, outcome.retry_after) {
            (Verdict::Success, _) => Command::Complete {
                step,
                attempt,
                result: outcome.result,
            },
            (Verdict::Retryable, Some(retry_after)) => Command::FailRetryAfter {
                step,
                attempt,
                error: outcome.error,
                retry_after,
            },
            (verdict, _) => Command::Fail {
                step,
                attempt,
                error: outcome.error,
                retryable: verdict == Verdict::Retryable,
                jitter: self.app.jitter(),
            },
        };
        let name = command.name();
        let applied = self
            .app
            .store()
            .job_apply(overseer_store::Apply::new(
                work.lease.job_id,
                command,
                self.app.now(),
            ))
            .await;
        match applied {
            Ok(t) => crate::api::reported(&self.app, name, step, &t),
            Err(e) => {
                crate::api::report_refused(&self.app, name, &e);
                tracing::warn!(job = %work.lease.job_id, step = %work.lease.step, error = %e, "http target: report refused");
            }
        }
    }
}

/// One claimed lease of an HTTP step, with its deadline on this node's monotonic clock.
struct Work {
    lease: Lease,
    step: usize,
    target: HttpTarget,
    deadline: Instant,
}

impl Work {
    fn of(
        t: &Transition,
        step: usize,
        now: overseer_core::Timestamp,
        sent: Instant,
    ) -> Option<Work> {
        let lease = crate::api::lease_of(t, step, now)?;
        let target = t.job.steps.get(step)?.lease_http()?.clone();
        let deadline = sent + Duration::from_millis(lease.lease_ms);
        Some(Work {
            lease,
            step,
            target,
            deadline,
        })
    }

    /// How long the request may take: the target's timeout, and never so long that the report
    /// could not be made before the deadline (a tenth of the lease, 10 ms to 2 s, is kept for it).
    fn request_budget(&self) -> Duration {
        let lease = Duration::from_millis(self.lease.timeout_ms);
        let margin = (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(2));
        let left = self
            .deadline
            .saturating_duration_since(Instant::now())
            .saturating_sub(margin);
        match self.target.timeout {
            Some(t) => left.min(t.as_std()),
            None => left,
        }
    }
}

fn failure(verdict: Verdict, error: String, label: &'static str) -> Outcome {
    Outcome {
        verdict,
        result: serde_json::Value::Null,
        error,
        retry_after: None,
        label,
    }
}

/// Maps a status and body to an outcome. A success's body is its result: JSON as sent, an empty
/// body as `null`, anything else as a string.
fn answer_outcome(
    what: &str,
    status: u16,
    retry_after: Option<Span>,
    body: Result<Vec<u8>, usize>,
    asynchronous: bool,
) -> Outcome {
    let verdict = push::verdict(status, asynchronous);
    let body = match body {
        Ok(b) => b,
        Err(limit) if verdict == Verdict::Success => {
            return failure(
                Verdict::Fatal,
                format!(
                    "{what} answered {status} with a body over the result limit of {limit} bytes"
                ),
                "fatal",
            )
        }
        Err(_) => Vec::new(),
    };
    match verdict {
        Verdict::Success => Outcome {
            verdict,
            result: match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(_) if body.is_empty() => serde_json::Value::Null,
                Err(_) => serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()),
            },
            error: String::new(),
            retry_after: None,
            label: "success",
        },
        Verdict::Accepted => failure(verdict, String::new(), "accepted"),
        Verdict::Retryable | Verdict::Fatal => {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            let mut error = format!("{what} answered {status}");
            if (300..400).contains(&status) {
                error.push_str(" (redirects are not followed)");
            }
            if !text.trim().is_empty() {
                error = format!("{error}: {}", text.trim());
            }
            let label = if verdict == Verdict::Fatal {
                "fatal"
            } else {
                "retryable"
            };
            Outcome {
                retry_after: retry_after.filter(|_| verdict == Verdict::Retryable),
                ..failure(verdict, error, label)
            }
        }
    }
}

/// Reads at most `limit` bytes of a body; `Err(limit)` when it is longer.
async fn read_capped(
    mut res: reqwest::Response,
    limit: usize,
) -> Result<Result<Vec<u8>, usize>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = res.chunk().await? {
        if body.len() + chunk.len() > limit {
            return Ok(Err(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Ok(body))
}

/// An error and its causes down to the root (e.g. a name that resolves only to internal
/// addresses).
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(next) = cause {
        text = format!("{text}: {next}");
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves how an answer's body becomes the result or the error: JSON as sent, an empty body
    // as null, other text as a string, a body over the limit fails a success for good; errors
    // name the request and status (and say redirects are not followed), and `Retry-After` is
    // kept only for retryable answers.
    #[test]
    fn answers_become_results_and_errors() {
        let what = "POST https://b/c";
        let ok = |body: &[u8]| answer_outcome(what, 200, None, Ok(body.to_vec()), false);
        assert_eq!(ok(b"{\"a\":1}").result, serde_json::json!({"a": 1}));
        assert_eq!(ok(b"").result, serde_json::Value::Null);
        assert_eq!(ok(b"done").result, serde_json::json!("done"));
        let big = answer_outcome(what, 200, None, Err(10), false);
        assert_eq!((big.verdict, big.label), (Verdict::Fatal, "fatal"));
        assert!(big.error.contains("result limit"), "{}", big.error);
        let wait = Some(Span::from_secs(3));
        let busy = answer_outcome(what, 503, wait, Ok(b"later".to_vec()), false);
        assert_eq!((busy.verdict, busy.retry_after), (Verdict::Retryable, wait));
        assert_eq!(busy.error, "POST https://b/c answered 503: later");
        let bad = answer_outcome(what, 400, wait, Ok(Vec::new()), false);
        assert_eq!((bad.verdict, bad.retry_after), (Verdict::Fatal, None));
        let moved = answer_outcome(what, 302, None, Ok(Vec::new()), false);
        assert!(
            moved.error.contains("redirects are not followed"),
            "{}",
            moved.error
        );
        let taken = answer_outcome(what, 202, None, Ok(Vec::new()), true);
        assert_eq!(
            (taken.verdict, taken.label),
            (Verdict::Accepted, "accepted")
        );
    }
}
