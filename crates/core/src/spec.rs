//! What a client submits, and how it is checked before anything is stored.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::backoff::{Backoff, Formula};
use crate::push::HttpTarget;
use crate::time::{Span, Timestamp};

/// A job as submitted. Unknown fields are rejected so typos never pass silently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// 1 to `limits.name_bytes` (200) bytes, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub idempotency_key: Option<String>,
    /// At most `limits.labels_per_job` (32); keys are names without `:`.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    #[schema(minimum = -10000, maximum = 10000)]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub ordering_key: Option<String>,
    /// An absolute http(s) URL, at most 2048 bytes, no white space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        max_length = 2048,
        pattern = "^https?://[^/\\s\\u0000-\\u001f\\u007f-\\u009f][^\\s\\u0000-\\u001f\\u007f-\\u009f]*$"
    )]
    pub callback_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// How long the job is kept once finished, instead of the server's default for the state
    /// it ends in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Span>,
    /// The latest the job may run: an RFC 3339 instant, or a duration counted from submission.
    /// Past it nothing new starts and the job fails (undoing what it declares). Left out of the
    /// JSON when not given, so specs written before it existed keep their fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<JobDeadline>,
    /// Rounds a `compensate_and_retry` job runs at most (default 3), the first included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_attempts: Option<u32>,
    /// The wait before each new round of a `compensate_and_retry` job (default: no backoff
    /// parameters given means 1 s doubling up to 5 min).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_backoff: Option<Backoff>,
    /// What a `compensate_and_retry` job does when a step fails for good in its last round:
    /// `fail` (the default) undoes the round and fails the job; `hold` blocks the job as
    /// `on_failure: hold` would, with the round's work kept for an operator to retry, skip or
    /// cancel (which undoes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_exhausted: Option<JobExhausted>,
    /// 1 to `limits.steps_per_job` (100).
    #[schema(min_items = 1, max_items = 100)]
    pub steps: Vec<StepSpec>,
}

/// How a whole-job retry ends when its last round fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobExhausted {
    /// Undo the last round like the others, then fail the job.
    #[default]
    Fail,
    /// Block the job at the failed step of the last round, nothing undone, for an operator.
    Hold,
}

impl JobExhausted {
    pub fn as_str(self) -> &'static str {
        match self {
            JobExhausted::Fail => "fail",
            JobExhausted::Hold => "hold",
        }
    }
}

/// The most rounds one whole-job retry may ask for.
pub const JOB_ATTEMPTS_MAX: u32 = 100;
pub const DEFAULT_JOB_ATTEMPTS: u32 = 3;

/// A job's deadline as submitted: an instant, or a length of time after submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobDeadline {
    At(Timestamp),
    After(Span),
}

impl JobDeadline {
    /// The instant it names, for a job submitted at `submitted`.
    pub fn resolve(self, submitted: Timestamp) -> Timestamp {
        match self {
            JobDeadline::At(t) => t,
            JobDeadline::After(span) => submitted.plus(span),
        }
    }
}

impl Serialize for JobDeadline {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            JobDeadline::At(t) => t.serialize(s),
            JobDeadline::After(span) => span.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for JobDeadline {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if let Ok(span) = text.parse::<Span>() {
            return Ok(JobDeadline::After(span));
        }
        Timestamp::parse_rfc3339(&text)
            .map(JobDeadline::At)
            .map_err(|_| {
                serde::de::Error::custom(format!(
                    "`{text}` is neither an RFC 3339 time nor a duration (e.g. \"2030-01-01T00:00:00Z\", \"10m\")"
                ))
            })
    }
}

impl utoipa::PartialSchema for JobDeadline {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "An RFC 3339 instant, or a duration after submission such as `10m`",
            ))
            .into()
    }
}

impl utoipa::ToSchema for JobDeadline {}

/// One step as submitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub name: String,
    /// The agent pool that runs it; empty (left out) when `http` names a target instead.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub agent: String,
    /// An HTTP target the server calls itself, instead of an agent pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpTarget>,
    #[serde(default)]
    pub payload: Value,
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The longest silence between heartbeats before the lease is lost (the lease timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Span>,
    /// The longest one attempt may run, heartbeats or not (start-to-close): past it the attempt
    /// has failed and is retried by `max_attempts` and `backoff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Span>,
    /// 0 (no limit) to `limits.max_attempts` (1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 1000)]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
    /// The curve of retry delays: `exponential` (the default, shaped by `backoff`) or `faktory`
    /// (Faktory's own, which takes no `backoff`). Left out of the JSON when not given, so specs
    /// written before it existed keep their fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_formula: Option<Formula>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate: Option<CompensateSpec>,
    /// Whether each new `progress` a heartbeat reports is also recorded in the job's history
    /// (`step_progress`). Default false: progress is kept on the step (`progress`,
    /// `progress_at`) either way, so a chatty agent cannot flood the history. Left out of the
    /// JSON when not given, so specs written before it existed keep their fingerprints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_events: Option<bool>,
}

/// How to undo a step. Runs as its own leased, fenced, retried unit of work; `timeout` and
/// `backoff` default to the step's, `max_attempts` to 5 (0 = retry until it succeeds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompensateSpec {
    /// The agent pool that runs the undo; left out when `http` names a target instead (the
    /// recorded job shows the derived `http:` name here).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schema(max_length = 200, pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$")]
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpTarget>,
    #[serde(default)]
    pub payload: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Span>,
    /// The longest one attempt of the undo may run; defaults to the step's `deadline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Span>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 1000)]
    pub max_attempts: Option<u32>,
}

/// What a job does when one of its steps fails permanently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    Compensate,
    Hold,
    Fail,
    /// Undo every succeeded step, then run the whole job again from its roots (a new round),
    /// up to `job_attempts` rounds.
    CompensateAndRetry,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Compensate => "compensate",
            OnFailure::Hold => "hold",
            OnFailure::Fail => "fail",
            OnFailure::CompensateAndRetry => "compensate_and_retry",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "compensate" => Some(OnFailure::Compensate),
            "hold" => Some(OnFailure::Hold),
            "fail" => Some(OnFailure::Fail),
            "compensate_and_retry" => Some(OnFailure::CompensateAndRetry),
            _ => None,
        }
    }
}

/// Priorities are bounded so aging (see `job::PRIORITY_AGING`) bounds how long any step can be
/// passed over: at most 2 × 10,000 s ≈ 5.6 h between the extremes.
pub const PRIORITY_MAX: i32 = 10_000;
pub const DEFAULT_TIMEOUT: Span = Span::from_secs(30);
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// The shortest step timeout: heartbeats go every third of it, so shorter is only noise.
pub const MIN_TIMEOUT: Span = Span::from_millis(100);

/// Bounds on what one request may hold. Every one has a default and can be configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Bytes in one request body (answers 413 beyond).
    pub body_bytes: usize,
    /// Bytes of one step's payload, JSON-encoded.
    pub payload_bytes: usize,
    /// Bytes of one step's result, JSON-encoded.
    pub result_bytes: usize,
    /// Bytes of one error message; longer ones are cut, not refused.
    pub error_bytes: usize,
    /// Bytes of the `progress` one heartbeat may carry, JSON-encoded (answers 413 beyond).
    pub progress_bytes: usize,
    pub steps_per_job: usize,
    pub labels_per_job: usize,
    pub jobs_per_batch: usize,
    /// Events kept per job; the oldest are dropped beyond this.
    pub history_per_job: usize,
    /// Longest a name (step, agent, label key, idempotency key) may be.
    pub name_bytes: usize,
    pub max_attempts: u32,
    pub timeout_max: Span,
    /// Leases one call may take, and lease outcomes one `POST /v1/leases:report` may carry.
    pub leases_per_call: usize,
    /// Longest a long-poll may wait.
    pub wait_max: Span,
    /// Long-polls (lease requests and job waits) waiting at once on one node; more get 429.
    pub long_polls: usize,
    /// Long-polls one token may hold at once on one node (when auth is on); more get 429.
    pub long_polls_per_token: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes: 4 << 20,
            payload_bytes: 256 << 10,
            result_bytes: 256 << 10,
            error_bytes: 8 << 10,
            progress_bytes: 4 << 10,
            steps_per_job: 100,
            labels_per_job: 32,
            jobs_per_batch: 1_000,
            history_per_job: 1_000,
            name_bytes: 200,
            max_attempts: 1_000,
            timeout_max: Span::from_secs(24 * 3600),
            leases_per_call: 100,
            wait_max: Span::from_secs(60),
            long_polls: 10_000,
            long_polls_per_token: 2_000,
        }
    }
}

/// A spec that cannot be accepted: which field, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// A path such as `steps[2].depends_on[0]`.
    pub field: String,
    pub message: String,
    /// `true` when the request is well formed but asks for something this server cannot do
    /// (answered 422 rather than 400).
    pub unprocessable: bool,
}

impl SpecError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError {
            field: field.into(),
            message: message.into(),
            unprocessable: false,
        }
    }

    pub fn unsupported(field: impl Into<String>, message: impl Into<String>) -> Self {
        SpecError {
            unprocessable: true,
            ..SpecError::new(field, message)
        }
    }

    /// Prefixes the field path, e.g. to place a job's error inside a batch (`jobs[3].`).
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.trim_end_matches('.').to_string()
        } else {
            format!("{prefix}{}", self.field)
        };
        self
    }
}

/// Decodes a JSON value into `T`, naming the exact field that does not fit.
pub fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, SpecError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        SpecError::new(field, e.into_inner().to_string())
    })
}

/// Decodes JSON bytes into `T`, naming the exact field that does not fit.
pub fn decode_bytes<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, SpecError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        let inner = e.into_inner();
        let message = if inner.is_syntax() || inner.is_eof() {
            format!("malformed JSON: {inner}")
        } else {
            inner.to_string()
        };
        SpecError::new(field, message)
    })
}

/// The earliest `run_at` accepted: a time before the Unix epoch is a mistake (a zeroed date),
/// not a wish to run at once.
pub const RUN_AT_MIN: Timestamp = Timestamp(0);
/// The latest `run_at` accepted, the end of year 9999.
pub const RUN_AT_MAX: Timestamp = Timestamp(253_402_300_799_999);

/// Idempotency-key prefixes the server mints for jobs it creates itself: a cron firing
/// (`schedule/{name}/{due_ms}`) and a Faktory push (`faktory/{jid}`). A client may not submit
/// under them, or it could take a firing's or a jid's place before it happens.
pub const RESERVED_KEY_PREFIXES: [&str; 2] = ["schedule/", "faktory/"];

impl JobSpec {
    /// [`JobSpec::validate`] for a job a client submits over the API: also refuses an
    /// idempotency key under a prefix the server reserves for itself.
    pub fn validate_submitted(&self, limits: &Limits) -> Result<(), SpecError> {
        self.validate(limits)?;
        let key = self.idempotency_key.as_deref().unwrap_or_default();
        match RESERVED_KEY_PREFIXES.iter().find(|p| key.starts_with(**p)) {
            Some(prefix) => Err(SpecError::new(
                "idempotency_key",
                format!(
                    "keys starting with `{prefix}` are reserved for jobs the server creates \
                     itself (cron firings, Faktory pushes)"
                ),
            )),
            None => Ok(()),
        }
    }

    /// A stable fingerprint of what was asked for, used to tell a retried submit (same body)
    /// from a conflicting one (same idempotency key, other body). JSON objects encode with
    /// sorted keys, so key order and white space in the request do not matter.
    pub fn fingerprint(&self) -> String {
        let bytes = serde_json::to_vec(self).expect("a JobSpec always encodes");
        hex::encode(Sha256::digest(bytes))
    }

    /// Checks everything that can be checked without the store, naming the first field at
    /// fault. A `run_at` in the past is allowed and means "now".
    pub fn validate(&self, limits: &Limits) -> Result<(), SpecError> {
        if let Some(key) = &self.idempotency_key {
            check_name("idempotency_key", key, limits)?;
        }
        self.validate_labels(limits)?;
        check_instant("run_at", self.run_at)?;
        if let Some(JobDeadline::At(t)) = self.deadline {
            check_instant("deadline", Some(t))?;
        }
        self.validate_job_retry()?;
        if let Some(key) = &self.ordering_key {
            check_name("ordering_key", key, limits)?;
        }
        if !(-PRIORITY_MAX..=PRIORITY_MAX).contains(&self.priority) {
            return Err(SpecError::new(
                "priority",
                format!("priority must be between -{PRIORITY_MAX} and {PRIORITY_MAX}"),
            ));
        }
        if let Some(url) = &self.callback_url {
            check_url("callback_url", url)?;
        }
        if let Some(keep) = self.retention {
            use crate::retention::{RETENTION_MAX, RETENTION_MIN};
            if !(RETENTION_MIN..=RETENTION_MAX).contains(&keep) {
                return Err(SpecError::new(
                    "retention",
                    "must be between 1s and 3660d (about ten years)",
                ));
            }
        }
        let index = self.validate_steps(limits)?;
        self.validate_dependencies(&index)
    }

    /// At most `labels_per_job` labels; keys are names without `:`, values bounded and free of
    /// control characters.
    fn validate_labels(&self, limits: &Limits) -> Result<(), SpecError> {
        if self.labels.len() > limits.labels_per_job {
            return Err(SpecError::new(
                "labels",
                format!("at most {} labels per job", limits.labels_per_job),
            ));
        }
        for (k, v) in &self.labels {
            let field = format!("labels.{k}");
            check_name(&field, k, limits)?;
            if k.contains(':') {
                return Err(SpecError::new(field, "label keys cannot contain ':'"));
            }
            if v.len() > limits.name_bytes {
                return Err(SpecError::new(
                    field,
                    format!("label values are at most {} bytes", limits.name_bytes),
                ));
            }
            // Stores differ on what they keep of them (PostgreSQL refuses NUL, SQLite keeps
            // it), and a label is for people and filters: refuse them in every store alike.
            if v.chars().any(char::is_control) {
                return Err(SpecError::new(
                    field,
                    "label values must not contain control characters",
                ));
            }
        }
        Ok(())
    }

    /// One to `steps_per_job` steps, each valid on its own, with unique names: answers each
    /// name's position.
    fn validate_steps(&self, limits: &Limits) -> Result<HashMap<&str, usize>, SpecError> {
        if self.steps.is_empty() {
            return Err(SpecError::new("steps", "a job needs at least one step"));
        }
        if self.steps.len() > limits.steps_per_job {
            return Err(SpecError::new(
                "steps",
                format!("at most {} steps per job", limits.steps_per_job),
            ));
        }
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, step) in self.steps.iter().enumerate() {
            let at = format!("steps[{i}].");
            check_name(&format!("{at}name"), &step.name, limits)?;
            if index.insert(step.name.as_str(), i).is_some() {
                return Err(SpecError::new(
                    format!("{at}name"),
                    format!("duplicate step name `{}`", step.name),
                ));
            }
            step.validate(&at, limits)?;
        }
        Ok(index)
    }

    /// Every dependency names another step, once, and no chain of them comes back to where it
    /// started.
    fn validate_dependencies(&self, index: &HashMap<&str, usize>) -> Result<(), SpecError> {
        for (i, step) in self.steps.iter().enumerate() {
            let mut seen = HashSet::new();
            for (j, dep) in step.depends_on.iter().enumerate() {
                let field = format!("steps[{i}].depends_on[{j}]");
                if dep == &step.name {
                    return Err(SpecError::new(
                        field,
                        format!("step `{dep}` depends on itself"),
                    ));
                }
                if !index.contains_key(dep.as_str()) {
                    return Err(SpecError::new(field, format!("unknown step `{dep}`")));
                }
                if !seen.insert(dep) {
                    return Err(SpecError::new(field, format!("`{dep}` is listed twice")));
                }
            }
        }
        if let Some(cycle) = find_cycle(&self.steps, index) {
            let i = index[cycle[0].as_str()];
            return Err(SpecError::new(
                format!("steps[{i}].depends_on"),
                format!("dependency cycle: {}", cycle.join(" -> ")),
            ));
        }
        Ok(())
    }
}

impl StepSpec {
    /// The step's own fields and its undo's (`at` is its field prefix, `steps[0].`); names and
    /// dependencies are the job's to check.
    fn validate(&self, at: &str, limits: &Limits) -> Result<(), SpecError> {
        check_runner(at, &self.agent, self.http.as_ref(), self.timeout, limits)?;
        let bounds = AttemptBounds {
            payload: &self.payload,
            timeout: self.timeout,
            deadline: self.deadline,
            max_attempts: self.max_attempts,
        };
        bounds.validate(at, limits)?;
        if self.backoff.is_some() && self.backoff_formula == Some(Formula::Faktory) {
            return Err(SpecError::new(
                format!("{at}backoff"),
                "backoff parameters apply only to the exponential formula, not to faktory",
            ));
        }
        if let Some(b) = &self.backoff {
            if !(b.factor.is_finite() && (1.0..=100.0).contains(&b.factor)) {
                return Err(SpecError::new(
                    format!("{at}backoff.factor"),
                    "factor must be between 1 and 100",
                ));
            }
            if b.max < b.initial {
                return Err(SpecError::new(
                    format!("{at}backoff.max"),
                    "max must not be below initial",
                ));
            }
        }
        if let Some(c) = &self.compensate {
            let at = format!("{at}compensate.");
            // An undo's lease is its own `timeout`, else its target's, else the step's.
            check_runner(&at, &c.agent, c.http.as_ref(), c.timeout, limits)?;
            let bounds = AttemptBounds {
                payload: &c.payload,
                timeout: c.timeout,
                deadline: c.deadline,
                max_attempts: c.max_attempts,
            };
            bounds.validate(&at, limits)?;
        }
        Ok(())
    }
}

/// What a step and its undo both bound the same way.
struct AttemptBounds<'a> {
    payload: &'a Value,
    timeout: Option<Span>,
    deadline: Option<Span>,
    max_attempts: Option<u32>,
}

impl AttemptBounds<'_> {
    /// `at` is the field prefix (`steps[0].` or `steps[0].compensate.`).
    fn validate(&self, at: &str, limits: &Limits) -> Result<(), SpecError> {
        let payload_len = serde_json::to_vec(self.payload)
            .map(|v| v.len())
            .unwrap_or(0);
        if payload_len > limits.payload_bytes {
            return Err(SpecError::new(
                format!("{at}payload"),
                format!(
                    "payload is {payload_len} bytes, more than the limit of {}",
                    limits.payload_bytes
                ),
            ));
        }
        if let Some(t) = self.timeout {
            if t < MIN_TIMEOUT || t > limits.timeout_max {
                return Err(SpecError::new(
                    format!("{at}timeout"),
                    format!(
                        "timeout must be between {MIN_TIMEOUT} and {}",
                        limits.timeout_max
                    ),
                ));
            }
        }
        check_deadline(&format!("{at}deadline"), self.deadline, limits)?;
        if self.max_attempts.is_some_and(|n| n > limits.max_attempts) {
            return Err(SpecError::new(
                format!("{at}max_attempts"),
                format!(
                    "max_attempts must be at most {} (0 means no limit)",
                    limits.max_attempts
                ),
            ));
        }
        Ok(())
    }
}

/// An instant a job names (`run_at`, an absolute `deadline`) is one a timestamp can hold.
fn check_instant(field: &str, at: Option<Timestamp>) -> Result<(), SpecError> {
    match at {
        Some(t) if !(RUN_AT_MIN..=RUN_AT_MAX).contains(&t) => Err(SpecError::new(
            field,
            "must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59Z",
        )),
        _ => Ok(()),
    }
}

impl JobSpec {
    /// `job_attempts`, `job_backoff` and `job_exhausted` shape a whole-job retry only.
    fn validate_job_retry(&self) -> Result<(), SpecError> {
        let retrying = self.on_failure == Some(OnFailure::CompensateAndRetry);
        for (field, given) in [
            ("job_attempts", self.job_attempts.is_some()),
            ("job_backoff", self.job_backoff.is_some()),
            ("job_exhausted", self.job_exhausted.is_some()),
        ] {
            if given && !retrying {
                return Err(SpecError::new(
                    field,
                    "applies only with `on_failure: compensate_and_retry`",
                ));
            }
        }
        if let Some(n) = self.job_attempts {
            if !(1..=JOB_ATTEMPTS_MAX).contains(&n) {
                return Err(SpecError::new(
                    "job_attempts",
                    format!("job_attempts must be between 1 and {JOB_ATTEMPTS_MAX}"),
                ));
            }
        }
        if let Some(b) = &self.job_backoff {
            if !(b.factor.is_finite() && (1.0..=100.0).contains(&b.factor)) {
                return Err(SpecError::new(
                    "job_backoff.factor",
                    "factor must be between 1 and 100",
                ));
            }
            if b.max < b.initial {
                return Err(SpecError::new(
                    "job_backoff.max",
                    "max must not be below initial",
                ));
            }
        }
        Ok(())
    }
}

/// An attempt's deadline is bounded like a timeout: long enough to be more than noise, no
/// longer than the longest lease.
fn check_deadline(field: &str, deadline: Option<Span>, limits: &Limits) -> Result<(), SpecError> {
    match deadline {
        Some(d) if d < MIN_TIMEOUT || d > limits.timeout_max => Err(SpecError::new(
            field,
            format!(
                "deadline must be between {MIN_TIMEOUT} and {}",
                limits.timeout_max
            ),
        )),
        _ => Ok(()),
    }
}

/// Callback URLs: absolute http(s), bounded, no white space.
fn check_url(field: &str, url: &str) -> Result<(), SpecError> {
    const MAX: usize = 2048;
    let ok_scheme = url.starts_with("http://") || url.starts_with("https://");
    let host = url.split("://").nth(1).unwrap_or("");
    if !ok_scheme || host.is_empty() || host.starts_with('/') {
        return Err(SpecError::new(
            field,
            "must be an absolute http:// or https:// URL",
        ));
    }
    if url.len() > MAX || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SpecError::new(
            field,
            format!("must be at most {MAX} bytes with no white space"),
        ));
    }
    Ok(())
}

/// A step or an undo names exactly one of an agent pool (outside the reserved `http:` names)
/// and an HTTP target. `at` is the field prefix (`steps[0].`).
fn check_runner(
    at: &str,
    agent: &str,
    http: Option<&HttpTarget>,
    lease: Option<Span>,
    limits: &Limits,
) -> Result<(), SpecError> {
    match http {
        Some(_) if !agent.is_empty() => Err(SpecError::new(
            format!("{at}agent"),
            "give either `agent` or `http`, not both",
        )),
        Some(target) => target.validate(&format!("{at}http"), lease, limits),
        None if agent.is_empty() => Err(SpecError::new(
            format!("{at}agent"),
            "needs an `agent` (or an `http` target)",
        )),
        None if agent.starts_with(crate::push::AGENT_PREFIX) => Err(SpecError::new(
            format!("{at}agent"),
            "agent names starting with `http:` are reserved for HTTP targets; use `http`",
        )),
        None => check_name(&format!("{at}agent"), agent, limits),
    }
}

fn check_name(field: &str, value: &str, limits: &Limits) -> Result<(), SpecError> {
    if value.is_empty() {
        return Err(SpecError::new(field, "must not be empty"));
    }
    if value.len() > limits.name_bytes {
        return Err(SpecError::new(
            field,
            format!("at most {} bytes", limits.name_bytes),
        ));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(SpecError::new(field, "must not contain control characters"));
    }
    Ok(())
}

/// Finds one dependency cycle, as the list of step names around it (first repeated at the end).
fn find_cycle(steps: &[StepSpec], index: &HashMap<&str, usize>) -> Option<Vec<String>> {
    // Iterative depth-first search with three colours, so deep chains cannot overflow the stack.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark = vec![Mark::New; steps.len()];
    for start in 0..steps.len() {
        if mark[start] != Mark::New {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = Mark::Open;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(dep) = steps[node].depends_on.get(*next) {
                *next += 1;
                let d = index[dep.as_str()];
                match mark[d] {
                    Mark::New => {
                        mark[d] = Mark::Open;
                        stack.push((d, 0));
                    }
                    Mark::Open => {
                        let from = stack.iter().position(|&(n, _)| n == d).unwrap_or(0);
                        let mut names: Vec<String> = stack[from..]
                            .iter()
                            .map(|&(n, _)| steps[n].name.clone())
                            .collect();
                        names.push(steps[d].name.clone());
                        return Some(names);
                    }
                    Mark::Done => {}
                }
            } else {
                mark[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value) -> Result<JobSpec, SpecError> {
        let s: JobSpec = decode(v)?;
        s.validate(&Limits::default())?;
        Ok(s)
    }

    fn field_of(v: Value) -> String {
        spec(v).expect_err("should be rejected").field
    }

    // Proves a well-formed DAG passes and defaults are applied by decoding.
    #[test]
    fn accepts_a_diamond() {
        let s = spec(json!({"steps": [
            {"name": "a", "agent": "x"},
            {"name": "b", "agent": "x", "depends_on": ["a"], "timeout": "5s"},
            {"name": "c", "agent": "y", "depends_on": ["a"], "backoff": {"initial": "100ms"}},
            {"name": "d", "agent": "x", "depends_on": ["b", "c"]}
        ]}))
        .unwrap();
        assert_eq!(s.steps.len(), 4);
        assert_eq!(s.steps[2].backoff.unwrap().factor, 2.0);
    }

    // Proves `backoff_formula` decodes (`faktory` alone, `exponential` with or without `backoff`),
    // reaches the built step, defaults to exponential, and stays out of the JSON when not given.
    #[test]
    fn backoff_formula_decodes_and_defaults() {
        let s = spec(json!({"steps": [
            {"name": "a", "agent": "x", "backoff_formula": "faktory"},
            {"name": "b", "agent": "x", "backoff_formula": "exponential", "backoff": {"initial": "2s"}},
            {"name": "c", "agent": "x"}
        ]}))
        .unwrap();
        let formulas: Vec<_> = s.steps.iter().map(|st| st.backoff_formula).collect();
        assert_eq!(
            formulas,
            [Some(Formula::Faktory), Some(Formula::Exponential), None]
        );
        let job = crate::Job::from_spec(
            crate::JobId(uuid::Uuid::nil()),
            &s,
            crate::Timestamp::from_millis(0),
        );
        let built: Vec<_> = job.steps.iter().map(|st| st.backoff_formula).collect();
        assert_eq!(
            built,
            [Formula::Faktory, Formula::Exponential, Formula::Exponential]
        );
        let text = serde_json::to_string(&s.steps[2]).unwrap();
        assert!(!text.contains("backoff_formula"), "{text}");
    }

    // Proves each kind of bad input is rejected and the error names the offending field.
    #[test]
    fn rejections_name_the_field() {
        let cases = vec![
            (json!({"steps": []}), "steps"),
            (json!({"steps": [{"name": "a"}]}), "steps[0]"),
            (
                json!({"steps": [{"name": "a", "agent": "x", "bogus": 1}]}),
                "steps[0]",
            ),
            (json!({"stepz": []}), ""),
            (
                json!({"steps": [{"name": "a", "agent": "x"}, {"name": "a", "agent": "x"}]}),
                "steps[1].name",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "depends_on": ["zz"]}]}),
                "steps[0].depends_on[0]",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "depends_on": ["a"]}]}),
                "steps[0].depends_on[0]",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "timeout": "soon"}]}),
                "steps[0].timeout",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "timeout": "1ms"}]}),
                "steps[0].timeout",
            ),
            (
                json!({"run_at": "yesterday", "steps": [{"name": "a", "agent": "x"}]}),
                "run_at",
            ),
            (
                json!({"run_at": "0000-01-01T00:00:00Z", "steps": [{"name": "a", "agent": "x"}]}),
                "run_at",
            ),
            (
                json!({"labels": {"k": "a\u{0}b"}, "steps": [{"name": "a", "agent": "x"}]}),
                "labels.k",
            ),
            (
                json!({"labels": {"k": "line\nbreak"}, "steps": [{"name": "a", "agent": "x"}]}),
                "labels.k",
            ),
            (
                json!({"steps": [{"name": "", "agent": "x"}]}),
                "steps[0].name",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "backoff": {"initial": "1s", "factor": 0.5}}]}),
                "steps[0].backoff.factor",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "backoff_formula": "fibonacci"}]}),
                "steps[0]",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "backoff_formula": "faktory",
                                  "backoff": {"initial": "1s"}}]}),
                "steps[0].backoff",
            ),
            (
                json!({"priority": "high", "steps": [{"name": "a", "agent": "x"}]}),
                "priority",
            ),
        ];
        for (body, field) in cases {
            let got = field_of(body.clone());
            assert!(
                got.starts_with(field),
                "{body}: expected field {field:?}, got {got:?}"
            );
        }
    }

    // Proves a step or undo names exactly one of `agent` and `http`, that `http:` agent names
    // are reserved, that an HTTP step gets its per-host agent name and its lease timeout from
    // the target's, and that the fields at fault are named.
    #[test]
    fn http_targets_replace_agents() {
        let s = spec(json!({"steps": [
            {"name": "a", "http": {"url": "https://billing.internal/charge", "timeout": "5s"},
             "compensate": {"http": {"url": "http://billing.internal:8080/refund", "timeout": "9s"}}}
        ]}))
        .unwrap();
        let job = crate::Job::from_spec(crate::JobId(uuid::Uuid::nil()), &s, Timestamp(0));
        assert_eq!(job.steps[0].agent, "http:billing.internal:443");
        assert_eq!(job.steps[0].timeout, Span::from_secs(5));
        let undo = job.steps[0].compensate.as_ref().unwrap();
        assert_eq!(undo.agent, "http:billing.internal:8080");
        assert_eq!(job.steps[0].lease_timeout(), Span::from_secs(5));
        assert_eq!(
            undo.timeout,
            Some(Span::from_secs(9)),
            "an undo's lease takes its target's"
        );
        let text = serde_json::to_string(&s.steps[0]).unwrap();
        assert!(!text.contains("\"agent\""), "{text}");
        let cases = [
            (json!({"steps": [{"name": "a"}]}), "steps[0].agent"),
            (
                json!({"steps": [{"name": "a", "agent": "http:x:1"}]}),
                "steps[0].agent",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "http": {"url": "https://b/"}}]}),
                "steps[0].agent",
            ),
            (
                json!({"steps": [{"name": "a", "http": {"url": "b/c"}}]}),
                "steps[0].http.url",
            ),
            (
                json!({"steps": [{"name": "a", "timeout": "1s", "http": {"url": "https://b/", "timeout": "2s"}}]}),
                "steps[0].http.timeout",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "compensate": {"timeout": "1s",
                    "http": {"url": "https://b/", "timeout": "2s"}}}]}),
                "steps[0].compensate.http.timeout",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "compensate": {"agent": "http:b:1"}}]}),
                "steps[0].compensate.agent",
            ),
            (
                json!({"steps": [{"name": "a", "agent": "x", "compensate": {"http": {"url": "ftp://b"}}}]}),
                "steps[0].compensate.http.url",
            ),
            (
                json!({"steps": [{"name": "a", "http": {"url": "https://b/", "method": "GET"}}]}),
                "steps[0].http.method",
            ),
        ];
        for (body, field) in cases {
            assert_eq!(field_of(body.clone()), field, "{body}");
        }
    }

    // Proves cycles of any length are found and reported with their path.
    #[test]
    fn finds_cycles() {
        let err = spec(json!({"steps": [
            {"name": "a", "agent": "x", "depends_on": ["c"]},
            {"name": "b", "agent": "x", "depends_on": ["a"]},
            {"name": "c", "agent": "x", "depends_on": ["b"]},
            {"name": "d", "agent": "x"}
        ]}))
        .unwrap_err();
        assert!(err.message.contains("cycle"), "{err}");
        assert!(err.field.ends_with("depends_on"), "{err}");
    }

    // Proves a long chain is checked without recursion trouble and limits are enforced.
    #[test]
    fn limits_apply() {
        let steps: Vec<Value> = (0..100)
            .map(|i| {
                let deps: Vec<String> = if i == 0 {
                    vec![]
                } else {
                    vec![format!("s{}", i - 1)]
                };
                json!({"name": format!("s{i}"), "agent": "x", "depends_on": deps})
            })
            .collect();
        assert!(spec(json!({ "steps": steps })).is_ok());
        let too_many: Vec<Value> = (0..101)
            .map(|i| json!({"name": format!("s{i}"), "agent": "x"}))
            .collect();
        assert_eq!(field_of(json!({ "steps": too_many })), "steps");
        let big = "x".repeat(300 << 10);
        assert_eq!(
            field_of(json!({"steps": [{"name": "a", "agent": "x", "payload": big}]})),
            "steps[0].payload"
        );
    }

    // Proves the fingerprint ignores key order but not content.
    #[test]
    fn fingerprint_is_canonical() {
        let a: JobSpec = decode(json!({"labels": {"b": "1", "a": "2"}, "steps": [{"name": "s", "agent": "x", "payload": {"k": 1, "j": 2}}]})).unwrap();
        let b: JobSpec = decode(json!({"steps": [{"payload": {"j": 2, "k": 1}, "agent": "x", "name": "s"}], "labels": {"a": "2", "b": "1"}})).unwrap();
        let c: JobSpec =
            decode(json!({"steps": [{"name": "s", "agent": "x", "payload": {"k": 2}}]})).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }
}
