//! The multi-node test's workload and its HTTP plumbing: DAG jobs submitted round-robin to
//! the nodes (each retried, with the same body and idempotency key, on the next node until one
//! answers 2xx), and the read-side helpers the checks use once the faults have stopped.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{self, millis};
use crate::fault::Rng;

/// Agent names the DAG steps are spread over; every node has one command agent per name.
pub const AGENT_NAMES: [&str; 2] = ["red", "blue"];
/// Short, so the steps of an agent whose node died are leased again elsewhere quickly.
pub const STEP_TIMEOUT: &str = "2s";
/// How long one submit may keep being retried: generous, only a broken cluster comes near it
/// (a node restart or a PostgreSQL restart costs a few seconds).
const SUBMIT_PATIENCE: Duration = Duration::from_secs(90);

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// A job whose submit was answered 2xx with its id.
pub struct Acked {
    pub key: String,
    pub id: String,
    pub spec: Value,
    /// The node (index) whose answer acknowledged it, and when.
    pub node: usize,
    pub at: Instant,
}

#[derive(Default)]
pub struct Submitted {
    pub acked: Vec<Acked>,
    /// Requests that got no 2xx answer and were sent again (to the next node).
    pub retries: u64,
    /// Of those, answers 503: a node that could not reach PostgreSQL refused the write.
    pub unavailable: u64,
    /// Submits answered 200 (the job existed): a retry after an answer was lost.
    pub repeats: u64,
}

/// A diamond a → (b, c) → d (two times in five) or a chain of 2–4 steps; every step sleeps
/// 20–200 ms and may be retried without limit after a short backoff (only faults fail one).
pub fn job_spec(rng: &mut Rng, key: &str) -> Value {
    let shape: Vec<(String, Vec<String>)> = if rng.below(5) < 2 {
        let deps = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        vec![
            ("a".into(), vec![]),
            ("b".into(), deps(&["a"])),
            ("c".into(), deps(&["a"])),
            ("d".into(), deps(&["b", "c"])),
        ]
    } else {
        (1..=rng.range(2, 4))
            .map(|i| {
                let deps = if i == 1 {
                    vec![]
                } else {
                    vec![format!("s{}", i - 1)]
                };
                (format!("s{i}"), deps)
            })
            .collect()
    };
    let steps: Vec<Value> = shape
        .into_iter()
        .map(|(name, deps)| {
            json!({
                "name": name,
                "agent": AGENT_NAMES[rng.below(AGENT_NAMES.len())],
                "payload": {"sleep_ms": rng.range(20, 200)},
                "depends_on": deps,
                "timeout": STEP_TIMEOUT,
                "max_attempts": 0,
                "backoff": {"initial": "100ms", "factor": 2.0, "max": "500ms"},
            })
        })
        .collect();
    json!({"idempotency_key": key, "labels": {"suite": "multinode"}, "steps": steps})
}

/// The command every DAG step runs: journal its start, sleep the payload's `sleep_ms`, journal
/// its end, and answer its attempt number as the result (the journal format of
/// `crash/journal.rs`; `$PPID` is the command agent, as `sh` is its direct child).
pub fn step_script(journal: &Path) -> String {
    let j = journal.display();
    format!(
        r#"j='{j}'
echo "start $OVERSEER_JOB_ID $OVERSEER_STEP $OVERSEER_ATTEMPT $(date +%s%N) $PPID" >> "$j"
ms=$(sed -n 's/.*"sleep_ms":\([0-9]*\).*/\1/p')
ms=${{ms:-100}}
sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
echo "end $OVERSEER_JOB_ID $OVERSEER_STEP $OVERSEER_ATTEMPT $(date +%s%N) $PPID" >> "$j"
printf '{{"attempt": %s}}\n' "$OVERSEER_ATTEMPT"
"#
    )
}

/// Submits jobs one after the other until `stop`, each request to the next node in turn
/// (starting at `first`), every job retried with the same body and idempotency key until a
/// 2xx answer with its id comes back. Sets `stop` itself on a failure, so the faults end early.
pub async fn submitter(
    urls: Vec<String>,
    first: usize,
    mut rng: Rng,
    tag: String,
    stop: Arc<AtomicBool>,
) -> Result<Submitted, String> {
    let http = client();
    let mut out = Submitted::default();
    let mut next = first;
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("{tag}-{n}");
        n += 1;
        let spec = job_spec(&mut rng, &key);
        let deadline = Instant::now() + SUBMIT_PATIENCE;
        let (node, id) = loop {
            let node = next % urls.len();
            next += 1;
            let res = http
                .post(format!("{}/v1/jobs", urls[node]))
                .json(&spec)
                .send()
                .await;
            let failure = match res {
                Ok(res) => {
                    let status = res.status().as_u16();
                    match res.json::<Value>().await {
                        Ok(body) if status == 200 || status == 202 => match body["id"].as_str() {
                            Some(id) => {
                                out.repeats += u64::from(status == 200);
                                break (node, id.to_string());
                            }
                            None => format!("{status} without an id: {body}"),
                        },
                        Ok(body) if status >= 500 => {
                            out.unavailable += u64::from(status == 503);
                            format!("{status}: {body}")
                        }
                        Ok(body) => {
                            stop.store(true, Ordering::Relaxed);
                            return Err(format!(
                                "submit of {key} to node {node} answered {status}: {body}"
                            ));
                        }
                        Err(e) => format!("{status} with an unreadable body: {e}"),
                    }
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                stop.store(true, Ordering::Relaxed);
                return Err(format!("submit of {key} never acknowledged: {failure}"));
            }
            out.retries += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        out.acked.push(Acked {
            key,
            id,
            spec,
            node,
            at: Instant::now(),
        });
        tokio::time::sleep(rng.millis(80, 250)).await;
    }
    Ok(out)
}

/// GET with retries on connection errors, 5xx and unreadable answers (after the faults this is
/// only belt and braces). Answers status and body.
pub async fn get(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let failure = match http.get(url).send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                match res.json::<Value>().await {
                    Ok(body) if status < 500 => return (status, body),
                    Ok(body) => format!("{status}: {body}"),
                    Err(e) => format!("{status} with an unreadable body: {e}"),
                }
            }
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "GET {url}: {failure}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// POST with the same retries as [`get`].
pub async fn post(http: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let failure = match http.post(url).json(body).send().await {
            Ok(res) => {
                let status = res.status().as_u16();
                match res.json::<Value>().await {
                    Ok(body) if status < 500 => return (status, body),
                    Ok(body) => format!("{status}: {body}"),
                    Err(e) => format!("{status} with an unreadable body: {e}"),
                }
            }
            Err(e) => e.to_string(),
        };
        assert!(Instant::now() < deadline, "POST {url}: {failure}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (long-polls) until every job in `ids` is terminal; answers each job's final view,
/// `None` for a job the server does not know (lost). A job missing from the answer never
/// finished within `patience`.
pub async fn drain(
    http: &reqwest::Client,
    url: &str,
    ids: &[String],
    patience: Duration,
) -> HashMap<String, Option<Value>> {
    let deadline = Instant::now() + patience;
    let mut views = HashMap::new();
    for id in ids {
        loop {
            // Past the deadline, only look: one stuck job must not cost a long-poll each.
            let wait = if Instant::now() < deadline {
                "10s"
            } else {
                "0s"
            };
            let (status, job) = get(http, &format!("{url}/v1/jobs/{id}/wait?timeout={wait}")).await;
            if status == 404 {
                views.insert(id.clone(), None);
                break;
            }
            assert_eq!(status, 200, "waiting for {id}: {job}");
            if matches!(
                job["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                views.insert(id.clone(), Some(job));
                break;
            }
            if wait == "0s" {
                eprintln!("job {id} still not terminal after the drain: {job}");
                break;
            }
        }
    }
    views
}

/// Every job on the server, following `next_cursor`.
pub async fn list_all(http: &reqwest::Client, url: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = match &cursor {
            Some(c) => format!("{url}/v1/jobs?limit=500&cursor={c}"),
            None => format!("{url}/v1/jobs?limit=500"),
        };
        let (status, body) = get(http, &page).await;
        assert_eq!(status, 200, "{body}");
        all.extend(body["jobs"].as_array().unwrap().iter().cloned());
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return all,
        }
    }
}

/// The server's `step_lease_expired` events: (job, step, attempt) → the event's instant in ns
/// (whole milliseconds, no earlier than the lease's `lease_expires_at`; see
/// `journal::Bounds::end_bound`).
/// Every acknowledged job's history as `GET /v1/jobs/{id}/events` lists it (a lost job has
/// none: it is reported already).
pub async fn histories(
    http: &reqwest::Client,
    url: &str,
    acked: &[Acked],
) -> HashMap<String, Vec<Value>> {
    let mut out = HashMap::new();
    for a in acked {
        let (status, body) = get(http, &format!("{url}/v1/jobs/{}/events", a.id)).await;
        if status == 200 {
            out.insert(a.id.clone(), body["events"].as_array().unwrap().clone());
        }
    }
    out
}

/// When each lease expiry of `histories` was recorded, in ns.
pub fn expiries(histories: &HashMap<String, Vec<Value>>) -> HashMap<(String, String, u32), i64> {
    let mut out = HashMap::new();
    for (id, events) in histories {
        for e in events {
            if e["kind"] == "step_lease_expired" {
                let step = e["step"].as_str().unwrap().to_string();
                let attempt = e["attempt"].as_u64().unwrap() as u32;
                out.insert((id.clone(), step, attempt), millis(&e["at"]) * 1_000_000);
            }
        }
    }
    out
}
