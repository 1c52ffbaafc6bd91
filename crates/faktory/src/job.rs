//! Faktory jobs as Overseer jobs, and back.
//!
//! A pushed Faktory job becomes a one-step Overseer job:
//!
//! | Faktory            | Overseer                                                            |
//! |--------------------|---------------------------------------------------------------------|
//! | `queue`            | the step's `agent` (default `default`)                              |
//! | `jobtype`          | the step's `name`                                                   |
//! | the whole job JSON | the step's `payload`, exactly as received                           |
//! | `jid`              | label `faktory_jid`, idempotency key `faktory/<jid>`                |
//! | `at`               | `run_at` (when in the future)                                       |
//! | `reserve_for`      | step `timeout`, clamped like Faktory: default 1800 s, at least the configured minimum (Faktory: 60 s), more than 86400 s is refused |
//! | `retry`            | `max_attempts = retry + 1` (default retry 25; negative: 1 attempt)  |
//! | `priority` 1..9    | job `priority = (p − 5) × 1000` (default 5 → 0)                      |
//!
//! Labels `via=faktory`, `faktory_jobtype` and `faktory_queue` are added too, so Faktory jobs
//! can be listed (`GET /v1/jobs?label=via:faktory`) and scanned by `MUTATE`.
//!
//! Retries wait Faktory's own delays (the step's `backoff_formula` is `faktory`: `count⁴ + 15 +
//! rand(30) × (count + 1)` seconds, `count` being the failures before this one). A job started
//! over by `MUTATE requeue`, or pushed with a `failure` block, counts its delays from 0 again,
//! where Faktory goes on from the block's `retry_count`.

use overseer_core::backoff::{Backoff, Formula};
use overseer_core::spec::{JobSpec, OnFailure, StepSpec};
use overseer_core::{Job, JobState, Limits, Span, StepState, Timestamp};
use serde_json::{json, Map, Value};

/// Label naming the Faktory jid of a job pushed over the Faktory protocol.
pub const LABEL_JID: &str = "faktory_jid";
pub const LABEL_JOBTYPE: &str = "faktory_jobtype";
pub const LABEL_QUEUE: &str = "faktory_queue";
/// `via=faktory` marks every job pushed over the Faktory protocol.
pub const LABEL_VIA: &str = "via";
pub const VIA: &str = "faktory";

/// Faktory's default `retry`.
pub const DEFAULT_RETRY: i64 = 25;
/// Faktory's default reservation when a job names none (`manager.DefaultTimeout`).
pub const DEFAULT_RESERVE: Span = Span::from_secs(1800);
/// Faktory refuses reservations longer than a day.
pub const MAX_RESERVE: Span = Span::from_secs(86_400);
/// Overseer priority points per Faktory priority level.
pub const PRIORITY_STEP: i32 = 1000;

/// What a pushed job turns into, and the numbers needed to answer for it later.
#[derive(Debug)]
pub struct Pushed {
    pub jid: String,
    pub spec: JobSpec,
}

/// Settings that shape the conversion.
#[derive(Clone, Debug)]
pub struct Shape {
    pub reserve_min: Span,
    /// `None`: Faktory's retry delays ([`Formula::Faktory`]); `Some`: this exponential backoff.
    pub backoff: Option<Backoff>,
}

/// Checks a pushed job the way Faktory does (same messages) and builds its Overseer spec.
/// Errors are the text after `-ERR `.
pub fn from_push(
    value: Value,
    shape: &Shape,
    limits: &Limits,
    now: Timestamp,
) -> Result<Pushed, String> {
    let fields = PushFields::read(&value, shape.reserve_min, now)?;
    let jid = fields.jid.clone();
    let spec = fields.into_spec(value, shape, limits);
    spec.validate(limits).map_err(|e| e.to_string())?;
    Ok(Pushed { jid, spec })
}

/// The fields of a pushed job that shape its Overseer job, checked.
struct PushFields {
    jid: String,
    jobtype: String,
    queue: String,
    /// The step's timeout, from `reserve_for`.
    timeout: Span,
    run_at: Option<Timestamp>,
    retry: i64,
    priority: i64,
}

impl PushFields {
    /// Reads the fields in Faktory's order, so a job with several faults gets Faktory's message.
    fn read(value: &Value, reserve_min: Span, now: Timestamp) -> Result<PushFields, String> {
        let obj = value
            .as_object()
            .ok_or_else(|| "invalid JSON: a job must be a JSON object".to_string())?;
        let jid = match string_field(obj, "jid")? {
            Some(s) if s.len() >= 8 => s.to_string(),
            _ => return Err("jobs must have a reasonable jid parameter".into()),
        };
        let jobtype = match string_field(obj, "jobtype")? {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => return Err("jobs must have a jobtype parameter".into()),
        };
        match obj.get("args") {
            Some(Value::Array(_)) => {}
            None | Some(Value::Null) => return Err("jobs must have an args parameter".into()),
            Some(_) => return Err("invalid JSON: `args` must be an array".into()),
        }
        let reserve = whole_number_field(obj, "reserve_for")?;
        if reserve.is_some_and(|r| r > MAX_RESERVE.as_millis_i64() / 1000) {
            return Err("jobs cannot be reserved for more than one day".into());
        }
        let timeout = reserve_timeout(reserve, reserve_min);
        let queue = match string_field(obj, "queue")? {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => "default".to_string(),
        };
        let run_at = match string_field(obj, "at")? {
            None | Some("") => None,
            Some(s) => {
                let t = Timestamp::parse_rfc3339(s)
                    .map_err(|e| format!("invalid timestamp for 'at': {s:?}: {e}"))?;
                (t > now).then_some(t)
            }
        };
        let retry = whole_number_field(obj, "retry")?.unwrap_or(DEFAULT_RETRY);
        let priority = whole_number_field(obj, "priority")?.unwrap_or(5);
        Ok(PushFields {
            jid,
            jobtype,
            queue,
            timeout,
            run_at,
            retry,
            priority,
        })
    }

    /// The one-step job spec (see the module's table); `payload` is the job as pushed.
    fn into_spec(self, payload: Value, shape: &Shape, limits: &Limits) -> JobSpec {
        let mut labels = std::collections::BTreeMap::new();
        labels.insert(LABEL_JID.to_string(), self.jid.clone());
        labels.insert(LABEL_JOBTYPE.to_string(), self.jobtype.clone());
        labels.insert(LABEL_QUEUE.to_string(), self.queue.clone());
        labels.insert(LABEL_VIA.to_string(), VIA.to_string());
        JobSpec {
            idempotency_key: Some(format!("faktory/{}", self.jid)),
            labels,
            priority: (self.priority.clamp(1, 9) as i32 - 5) * PRIORITY_STEP,
            run_at: self.run_at,
            ordering_key: None,
            callback_url: None,
            on_failure: Some(OnFailure::Fail),
            retention: None,
            deadline: None,
            job_attempts: None,
            job_backoff: None,
            job_exhausted: None,
            steps: vec![StepSpec {
                name: self.jobtype,
                agent: self.queue,
                payload,
                depends_on: Vec::new(),
                timeout: Some(self.timeout),
                deadline: None,
                max_attempts: Some(max_attempts(self.retry, limits)),
                backoff: shape.backoff,
                backoff_formula: shape.backoff.is_none().then_some(Formula::Faktory),
                compensate: None,
                http: None,
                progress_events: None,
            }],
        }
    }
}

/// A field that must be a string when present: `None` when absent or null.
fn string_field<'a>(obj: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("invalid JSON: `{key}` must be a string")),
    }
}

/// A field that must be a whole number when present: `None` when absent or null.
fn whole_number_field(obj: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("invalid JSON: `{key}` must be a whole number")),
    }
}

/// Faktory's reservation rule: none or 0 → the default; below the minimum → the minimum; more
/// than a day → a day (a push asking for more was refused before this).
pub fn reserve_timeout(reserve_for_secs: Option<i64>, min: Span) -> Span {
    let secs = reserve_for_secs.unwrap_or(0);
    let span = if secs == 0 {
        DEFAULT_RESERVE
    } else {
        Span::from_secs(secs.max(0) as u64)
    };
    span.max(min).min(MAX_RESERVE)
}

/// `retry` → attempts: `retry + 1`; 0 → one attempt; negative (Faktory: straight to the dead
/// set) → one attempt, after which the job is `failed`. Bounded by the server's limit, and never
/// 0 (which would mean "no limit" to the core).
pub fn max_attempts(retry: i64, limits: &Limits) -> u32 {
    let attempts = retry.max(0).saturating_add(1);
    attempts.min(i64::from(limits.max_attempts.max(1))) as u32
}

/// Faktory's sorted sets, as views of Faktory jobs' states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Set {
    /// Running, its step ready again after a failure and waiting out the retry backoff.
    Retries,
    /// Pending: waiting for its `at`.
    Scheduled,
    /// Finished without success: `failed` (out of retries) or `cancelled` (killed).
    Dead,
}

impl Set {
    pub fn parse(name: &str) -> Option<Set> {
        match name {
            "retries" => Some(Set::Retries),
            "scheduled" => Some(Set::Scheduled),
            "dead" => Some(Set::Dead),
            _ => None,
        }
    }

    /// The job states the set is made of; a store write that takes a job out of the set checks
    /// the job is still in one of them.
    pub fn states(self) -> Vec<JobState> {
        match self {
            Set::Retries => vec![JobState::Running],
            Set::Scheduled => vec![JobState::Pending],
            Set::Dead => vec![JobState::Failed, JobState::Cancelled],
        }
    }

    /// Whether a Faktory job is in the set at `now`.
    pub fn contains(self, job: &Job, now: Timestamp) -> bool {
        if !is_faktory(job) {
            return false;
        }
        let s = &job.steps[0];
        match self {
            Set::Retries => {
                job.state == JobState::Running
                    && s.state == StepState::Ready
                    && s.failures > 0
                    && s.next_attempt_at.is_some_and(|t| t > now)
            }
            Set::Scheduled => job.state == JobState::Pending,
            Set::Dead => matches!(job.state, JobState::Failed | JobState::Cancelled),
        }
    }
}

/// Whether a Faktory job waits in its queue at `now`: ready, due, not leased.
pub fn is_enqueued(job: &Job, now: Timestamp) -> bool {
    is_faktory(job)
        && job.state == JobState::Running
        && job.steps[0].state == StepState::Ready
        && job.steps[0].next_attempt_at.is_none_or(|t| t <= now)
}

/// Whether an Overseer job was pushed over the Faktory protocol (its one step's payload is the
/// Faktory job as received).
pub fn is_faktory(job: &Job) -> bool {
    job.steps.len() == 1 && job.labels.contains_key(LABEL_JID)
}

/// What a worker last reported with `FAIL`, kept to show in the job's `failure` block.
#[derive(Clone, Debug)]
pub struct FailInfo {
    pub errtype: String,
    pub message: String,
    pub backtrace: Vec<String>,
    pub failed_at: Timestamp,
}

/// Separates the backtrace from `errtype: message` in a step's `last_error`.
const BACKTRACE_MARK: &str = "\n\nbacktrace:\n";

impl FailInfo {
    /// The error text recorded on the step, so the failure survives restarts and is the same on
    /// every node: `errtype: message`, then the backtrace (if any) one frame a line after a
    /// `backtrace:` line.
    pub fn error_text(&self) -> String {
        let mut text = format!("{}: {}", self.errtype, self.message);
        if !self.backtrace.is_empty() {
            text.push_str(BACKTRACE_MARK);
            text.push_str(&self.backtrace.join("\n"));
        }
        text
    }

    /// Reads back what [`FailInfo::error_text`] wrote in a step's `last_error` (or what the
    /// core wrote for an expired reservation).
    pub fn parse(last_error: &str, failed_at: Timestamp) -> FailInfo {
        if last_error.starts_with("lease expired") {
            return FailInfo {
                errtype: "ReservationExpired".into(),
                message: "Faktory job reservation expired".into(),
                backtrace: Vec::new(),
                failed_at,
            };
        }
        let (head, backtrace) = match last_error.rsplit_once(BACKTRACE_MARK) {
            Some((head, frames)) => (head, frames.lines().map(str::to_string).collect()),
            None => (last_error, Vec::new()),
        };
        let (errtype, message) = head.split_once(": ").unwrap_or(("unknown", head));
        FailInfo {
            errtype: errtype.to_string(),
            message: message.to_string(),
            backtrace,
            failed_at,
        }
    }
}

/// The `retry_count` of the failure block a job carried when it was pushed or requeued, if any.
fn prior_retry_count(payload: &Value) -> Option<i64> {
    payload.get("failure")?.get("retry_count")?.as_i64()
}

/// Failures a Faktory job has had in all: those carried in its payload from earlier runs (a
/// requeued job keeps its `failure` block, as in Faktory) plus those of its step.
pub fn failures_in_all(job: &Job) -> i64 {
    let s = &job.steps[0];
    prior_retry_count(&s.payload).map_or(0, |c| c + 1) + i64::from(s.failures)
}

/// The Faktory job as a Faktory server would hold it now: the job as pushed, with its `failure`
/// block once it has failed. `MUTATE` patterns are matched against this JSON.
pub fn view(job: &Job, fail: Option<&FailInfo>) -> Value {
    let mut v = for_fetch(job, 0, fail);
    if let Some(obj) = v.as_object_mut() {
        obj.remove("enqueued_at");
    }
    v
}

/// The spec of a Faktory job started over (`MUTATE requeue`): the job as Faktory holds it (see
/// [`view`]), due at once, with the attempts its `retry` has left (at least one, as Faktory runs
/// a requeued dead job once more).
pub fn restart(
    job: &Job,
    fail: Option<&FailInfo>,
    shape: &Shape,
    limits: &Limits,
    now: Timestamp,
) -> Result<Pushed, String> {
    let value = view(job, fail);
    let retry = value
        .get("retry")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_RETRY);
    let mut pushed = from_push(value, shape, limits, now)?;
    pushed.spec.run_at = None;
    let left = (retry.max(0) + 1 - failures_in_all(job)).max(1);
    pushed.spec.steps[0].max_attempts = Some(max_attempts(left - 1, limits));
    Ok(pushed)
}

/// Redis `MATCH` glob matching (what Faktory's `MUTATE` filter `regexp` is handed to): `*` any
/// run, `?` any one character, `[abc]`, `[^a-z]` classes, `\x` a literal `x`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with backtracking to the last `*` (linear in practice).
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        let step = if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '?' => Some(pi + 1),
                '[' => class_match(&p, pi, t[ti]),
                '\\' if pi + 1 < p.len() => (p[pi + 1] == t[ti]).then_some(pi + 2),
                c => (c == t[ti]).then_some(pi + 1),
            }
        } else {
            None
        };
        match (step, star) {
            (Some(next), _) => {
                pi = next;
                ti += 1;
            }
            (None, Some((sp, st))) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            (None, None) => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Matches `c` against the class opening at `p[open]`; the index after the class when it matches.
fn class_match(p: &[char], open: usize, c: char) -> Option<usize> {
    let mut i = open + 1;
    let negate = p.get(i) == Some(&'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    while i < p.len() && (p[i] != ']' || first) {
        first = false;
        let lo = if p[i] == '\\' && i + 1 < p.len() {
            i += 1;
            p[i]
        } else {
            p[i]
        };
        if i + 2 < p.len() && p[i + 1] == '-' && p[i + 2] != ']' {
            let hi = p[i + 2];
            let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= lo == c;
            i += 1;
        }
    }
    if i >= p.len() {
        // An unclosed class: Redis treats the rest as the class; never matches past the end.
        return None;
    }
    (hit != negate).then_some(i + 1)
}

/// The job a worker receives from `FETCH` for a leased step.
///
/// For a Faktory job: the job as pushed, plus what a Faktory server adds on the way out:
/// `enqueued_at`, `created_at` when the producer left it out, and a `failure` block once it has
/// failed (`retry_count` counts from 0 at the first failure, `remaining` as Faktory does).
///
/// For a step of any other Overseer job, a synthesized Faktory job:
/// `{"jid": "<job_id>/<step>", "jobtype": <step name>, "args": [payload], "queue": <agent>,
/// "reserve_for": <timeout s>, "retry": <max_attempts − 1>, "custom": {"overseer": {"job_id",
/// "step", "attempt", "kind", "inputs", "idempotency_key"}}}`.
pub fn for_fetch(job: &Job, step: usize, fail: Option<&FailInfo>) -> Value {
    let s = &job.steps[step];
    let enqueued_at = s.ready_at.unwrap_or(job.created_at).to_rfc3339();
    if is_faktory(job) && !s.is_compensating() {
        let mut out = s.payload.clone();
        if let Some(obj) = out.as_object_mut() {
            obj.entry("created_at")
                .or_insert_with(|| Value::String(job.created_at.to_rfc3339()));
            obj.insert("enqueued_at".into(), Value::String(enqueued_at));
            if s.failures > 0 {
                let retry = obj
                    .get("retry")
                    .and_then(Value::as_i64)
                    .unwrap_or(DEFAULT_RETRY);
                let retry_count = failures_in_all(job) - 1;
                let info = fail.cloned().unwrap_or_else(|| {
                    FailInfo::parse(
                        s.last_error.as_deref().unwrap_or("unknown"),
                        s.ready_at.unwrap_or(job.updated_at),
                    )
                });
                obj.insert(
                    "failure".into(),
                    failure_block(retry_count, retry, s.next_attempt_at, &info),
                );
            }
        }
        return out;
    }
    let kind = if s.is_compensating() {
        "compensate"
    } else {
        "work"
    };
    let mut custom = Map::new();
    custom.insert(
        "overseer".into(),
        json!({
            "job_id": job.id,
            "step": s.name,
            "attempt": s.attempt,
            "kind": kind,
            "inputs": job.inputs_of(step),
            "idempotency_key": job.step_idempotency_key(step),
        }),
    );
    json!({
        "jid": format!("{}/{}", job.id, s.name),
        "jobtype": s.name,
        "args": [s.lease_payload()],
        "queue": s.claim_agent_of_lease(),
        "created_at": job.created_at.to_rfc3339(),
        "enqueued_at": enqueued_at,
        "reserve_for": s.lease_timeout().as_millis() / 1000,
        "retry": s.max_attempts.saturating_sub(1),
        "custom": custom,
    })
}

fn failure_block(
    retry_count: i64,
    retry: i64,
    next_at: Option<Timestamp>,
    info: &FailInfo,
) -> Value {
    let mut block = json!({
        "retry_count": retry_count,
        "remaining": (retry - retry_count).max(0),
        "failed_at": info.failed_at.to_rfc3339(),
        "message": info.message,
        "errtype": info.errtype,
    });
    if let Some(at) = next_at {
        block["next_at"] = Value::String(at.to_rfc3339());
    }
    if !info.backtrace.is_empty() {
        block["backtrace"] = json!(info.backtrace);
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            reserve_min: Span::from_secs(60),
            backoff: None,
        }
    }

    // Proves pushes are checked with Faktory's own messages, in Faktory's order.
    #[test]
    fn push_validation_uses_faktory_messages() {
        let now = Timestamp::from_millis(0);
        let l = Limits::default();
        let cases = [
            (
                json!({"jobtype": "a", "args": []}),
                "jobs must have a reasonable jid parameter",
            ),
            (
                json!({"jid": "short", "jobtype": "a", "args": []}),
                "jobs must have a reasonable jid parameter",
            ),
            (
                json!({"jid": "0123456789", "args": []}),
                "jobs must have a jobtype parameter",
            ),
            (
                json!({"jid": "0123456789", "jobtype": "a"}),
                "jobs must have an args parameter",
            ),
            (
                json!({"jid": "0123456789", "jobtype": "a", "args": [], "reserve_for": 86401}),
                "jobs cannot be reserved for more than one day",
            ),
        ];
        for (job, message) in cases {
            assert_eq!(from_push(job, &shape(), &l, now).unwrap_err(), message);
        }
    }

    // Proves the Faktory fields map onto the step as documented (clamps, attempts, labels).
    #[test]
    fn push_maps_fields() {
        let l = Limits::default();
        let now = Timestamp::from_millis(1_000_000);
        let job = json!({"jid": "0123456789", "jobtype": "Send", "args": [1], "queue": "mail",
            "reserve_for": 5, "retry": 0, "priority": 9, "custom": {"x": 1}});
        let p = from_push(job.clone(), &shape(), &l, now).unwrap();
        let s = &p.spec.steps[0];
        assert_eq!((s.name.as_str(), s.agent.as_str()), ("Send", "mail"));
        assert_eq!(s.payload, job);
        assert_eq!(s.timeout, Some(Span::from_secs(60)));
        assert_eq!(s.max_attempts, Some(1));
        assert_eq!(p.spec.priority, 4 * PRIORITY_STEP);
        assert_eq!(
            p.spec.idempotency_key.as_deref(),
            Some("faktory/0123456789")
        );
        assert_eq!(p.spec.labels[LABEL_JID], "0123456789");
        assert_eq!(max_attempts(-1, &l), 1);
        assert_eq!(max_attempts(25, &l), 26);
        assert_eq!(reserve_timeout(None, Span::from_secs(60)), DEFAULT_RESERVE);
    }

    // Proves the MUTATE filter pattern follows Redis glob rules, on the JSON a client matches.
    #[test]
    fn glob_matches_like_redis() {
        let text = r#"{"args":["fizz"],"jid":"j1","jobtype":"t"}"#;
        let cases = [
            (r#"*\"args\":\[\"fizz\"\]*"#, true),
            (r#"*\"args\":\[\"buzz\"\]*"#, false),
            (r#"*"args":[[]"fi?z"\]*"#, true),
            (r#"*"jid":"j[0-9]"*"#, true),
            (r#"*"jid":"j[^0-9]"*"#, false),
            ("*", true),
            ("{*}", true),
            ("*}x", false),
            ("", false),
        ];
        for (pattern, expected) in cases {
            assert_eq!(glob_match(pattern, text), expected, "{pattern}");
        }
        assert!(glob_match("", ""));
        assert!(glob_match("a*b*c", "a-b-b-c"));
        assert!(!glob_match("a*b*c", "a-b-b-"));
    }

    // Proves a FAIL report survives the step's `last_error` whole: errtype, message, backtrace.
    #[test]
    fn fail_info_round_trips_through_last_error() {
        let at = Timestamp::from_millis(5);
        let info = FailInfo {
            errtype: "E".into(),
            message: "bad: worse".into(),
            backtrace: vec!["one".into(), "two".into()],
            failed_at: at,
        };
        let back = FailInfo::parse(&info.error_text(), at);
        assert_eq!(
            (back.errtype, back.message, back.backtrace),
            (
                "E".to_string(),
                "bad: worse".to_string(),
                info.backtrace.clone()
            )
        );
        let plain = FailInfo::parse("unknown: nope", at);
        assert_eq!((plain.message.as_str(), plain.backtrace.len()), ("nope", 0));
    }

    // Proves a pushed job's step gets Faktory's retry formula by default, and an exponential
    // backoff (no formula, so the spec is as before) when the shape names one.
    #[test]
    fn pushed_jobs_retry_with_faktory_formula() {
        let now = Timestamp::from_millis(0);
        let l = Limits::default();
        let push = || json!({"jid": "formula-jid-1", "jobtype": "a", "args": []});
        let p = from_push(push(), &shape(), &l, now).unwrap();
        let step = &p.spec.steps[0];
        assert_eq!(
            (step.backoff, step.backoff_formula),
            (None, Some(Formula::Faktory))
        );
        let job = Job::from_spec(overseer_core::JobId::generate(), &p.spec, now);
        assert_eq!(job.steps[0].retry_delay(1, 0.0), Span::from_secs(15));
        assert_eq!(job.steps[0].retry_delay(25, 0.0), Span::from_secs(331_791));
        let fixed = Backoff {
            initial: Span::from_secs(1),
            factor: 1.0,
            max: Span::from_secs(1),
        };
        let shaped = Shape {
            backoff: Some(fixed),
            ..shape()
        };
        let p = from_push(push(), &shaped, &l, now).unwrap();
        let step = &p.spec.steps[0];
        assert_eq!((step.backoff, step.backoff_formula), (Some(fixed), None));
    }
}
