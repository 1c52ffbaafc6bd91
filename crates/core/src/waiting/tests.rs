//! One test per waiting reason: each builds a real admitted job, puts it in the situation the
//! reason describes, and checks the code and the key words of the sentence.

use uuid::Uuid;

use super::*;
use crate::machine::admit;
use crate::spec::JobSpec;

const NOW: i64 = 1_800_000_000_000;

fn now() -> Timestamp {
    Timestamp::from_millis(NOW)
}

/// `a` on agent `dns`, then `b` depending on it; admitted at `NOW`.
fn job_with(extra: serde_json::Value) -> Job {
    let mut spec = serde_json::json!({"steps": [
        {"name": "a", "agent": "dns"},
        {"name": "b", "agent": "dns", "depends_on": ["a"]}
    ]});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let spec: JobSpec = serde_json::from_value(spec).unwrap();
    let job = Job::from_spec(JobId(Uuid::from_u128(7)), &spec, now());
    admit(job, now()).job
}

fn polled_now() -> AgentContext {
    AgentContext {
        last_poll: Some(now()),
        ..AgentContext::default()
    }
}

fn reason(job: &Job, step: usize, agent: &AgentContext) -> WaitingReason {
    step_waiting(job, &job.steps[step], agent, None, now()).expect("a reason")
}

#[test]
fn waits_for_dependency() {
    // `b` depends on `a`, which is still ready: the reason names `a`.
    let job = job_with(serde_json::json!({}));
    let r = reason(&job, 1, &polled_now());
    assert_eq!(r.code, "dependencies");
    assert!(r.text.contains("`a`"), "{}", r.text);
}

#[test]
fn backoff_shows_the_clock_time() {
    // A ready step whose next attempt is in the future waits out its backoff.
    let mut job = job_with(serde_json::json!({}));
    job.steps[0].next_attempt_at = Some(Timestamp::from_millis(NOW + 90_000));
    job.steps[0].attempt = 1;
    let r = reason(&job, 0, &polled_now());
    assert_eq!(r.code, "backoff");
    assert!(r.text.contains("UTC"), "{}", r.text);
}

#[test]
fn paused_agent() {
    // A paused agent name explains a ready step even when workers poll.
    let job = job_with(serde_json::json!({}));
    let agent = AgentContext {
        paused: true,
        ..polled_now()
    };
    let r = reason(&job, 0, &agent);
    assert_eq!(r.code, "agent_paused");
    assert_eq!(r.text, "agent `dns` paused");
}

#[test]
fn concurrency_limit() {
    // Running leases at the limit: the sentence shows running/limit.
    let job = job_with(serde_json::json!({}));
    let agent = AgentContext {
        max_concurrency: Some(2),
        running: 2,
        ..polled_now()
    };
    let r = reason(&job, 0, &agent);
    assert_eq!(r.code, "concurrency_limit");
    assert!(r.text.contains("2/2"), "{}", r.text);
}

#[test]
fn rate_limit() {
    // Everything else clear, a rate limit is the only thing left that can hold a ready step.
    let job = job_with(serde_json::json!({}));
    let agent = AgentContext {
        rate: Some(5.0),
        ..polled_now()
    };
    assert_eq!(reason(&job, 0, &agent).code, "rate_limit");
}

#[test]
fn no_worker_polled() {
    // Never polled, and polled five minutes ago, both say no worker is there.
    let job = job_with(serde_json::json!({}));
    assert_eq!(reason(&job, 0, &AgentContext::default()).code, "no_worker");
    let stale = AgentContext {
        last_poll: Some(Timestamp::from_millis(NOW - 300_000)),
        ..AgentContext::default()
    };
    let r = reason(&job, 0, &stale);
    assert_eq!(r.code, "no_worker");
    assert!(r.text.contains("5 min"), "{}", r.text);
}

#[test]
fn ready_and_polled_is_plain_ready() {
    // No obstacle at all: the step is simply next in line.
    let job = job_with(serde_json::json!({}));
    assert_eq!(reason(&job, 0, &polled_now()).code, "ready");
}

#[test]
fn run_at_in_the_future() {
    // A delayed job is pending; both the job and its steps say when it starts.
    let at = Timestamp::from_millis(NOW + 3 * 3_600_000);
    let job = job_with(serde_json::json!({"run_at": at.to_rfc3339()}));
    assert_eq!(job.state, JobState::Pending);
    let r = job_waiting(&job, None, now()).unwrap();
    assert_eq!(r.code, "run_at");
    assert!(r.text.contains("in 3 h"), "{}", r.text);
    assert_eq!(reason(&job, 0, &polled_now()).code, "run_at");
}

#[test]
fn ordering_key_held_by_another_job() {
    // A pending job behind another job of its key names that job and its state.
    let job = job_with(serde_json::json!({"ordering_key": "cust-42"}));
    let head = KeyHead {
        key: "cust-42".into(),
        job: JobId(Uuid::from_u128(1)),
        state: JobState::Blocked,
    };
    let mut pending = job.clone();
    pending.state = JobState::Pending;
    let r = job_waiting(&pending, Some(&head), now()).unwrap();
    assert_eq!(r.code, "ordering_key");
    assert!(
        r.text.contains("cust-42") && r.text.contains("blocked"),
        "{}",
        r.text
    );
}

#[test]
fn blocked_job_gives_its_reason() {
    // A held job explains every unsettled step with the job's blocked reason.
    let mut job = job_with(serde_json::json!({}));
    job.state = JobState::Blocked;
    job.blocked_reason = Some("step `a` failed: boom".into());
    let r = reason(&job, 1, &polled_now());
    assert_eq!(r.code, "job_blocked");
    assert!(r.text.contains("boom"), "{}", r.text);
}

#[test]
fn running_and_finished_have_none() {
    // Nothing to explain for a running step or a finished job.
    let mut job = job_with(serde_json::json!({}));
    job.steps[0].state = StepState::Running;
    assert!(step_waiting(&job, &job.steps[0], &polled_now(), None, now()).is_none());
    job.state = JobState::Succeeded;
    assert!(step_waiting(&job, &job.steps[1], &polled_now(), None, now()).is_none());
}

#[test]
fn human_spans() {
    // Rounded units an operator reads at a glance.
    assert_eq!(human_span(45_000), "45 s");
    assert_eq!(human_span(300_000), "5 min");
    assert_eq!(human_span(3 * 3_600_000), "3 h");
    assert_eq!(human_span(2 * 86_400_000), "2 d");
}

#[test]
fn http_target_waits_only_for_its_circuit_breaker() {
    // Proves an HTTP step never waits for a worker (the server runs it), names an open breaker
    // with its probe time, and a half-open one, under the code `circuit_open`.
    let spec: JobSpec = serde_json::from_value(serde_json::json!({"steps": [
        {"name": "charge", "http": {"url": "https://billing.internal/charge"}}
    ]}))
    .unwrap();
    let job = admit(
        Job::from_spec(JobId(Uuid::from_u128(8)), &spec, now()),
        now(),
    )
    .job;
    assert_eq!(job.steps[0].agent, "http:billing.internal:443");
    let r = reason(&job, 0, &AgentContext::default());
    assert_eq!(r.code, "ready", "{}", r.text);
    let open = AgentContext {
        circuit_open_until: Some(Timestamp::from_millis(NOW + 30_000)),
        ..AgentContext::default()
    };
    let r = reason(&job, 0, &open);
    assert_eq!(r.code, "circuit_open");
    assert!(
        r.text.contains("http:billing.internal:443") && r.text.contains("UTC"),
        "{}",
        r.text
    );
    let half = AgentContext {
        circuit_open_until: Some(Timestamp::from_millis(0)),
        ..AgentContext::default()
    };
    assert!(reason(&job, 0, &half).text.contains("half-open"));
}
