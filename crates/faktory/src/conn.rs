//! One client connection: the handshake, then one command at a time.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use overseer_core::machine::{admit, Reply as CoreReply};
use overseer_core::{Command, Job, JobId, JobState, Timestamp};
use overseer_store::{
    Apply, Claim, Claimed, JobQuery, NewJob, Removal, Replacement, SettingsUpdate, Submitted,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tokio::io::{BufReader, BufWriter};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::job::{self, FailInfo};
use crate::resp::{self, Line, Reply};
use crate::{Faktory, Held, WorkerState};

/// How long a client has to send `HELLO` after the greeting (Faktory: 2 s).
const HELLO_WITHIN: Duration = Duration::from_secs(2);
/// Jobs `MUTATE` and `FLUSH` look at, at most, per command.
const SCAN_MAX: usize = 10_000;
const SCAN_PAGE: usize = 500;

/// The client's `HELLO`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Hello {
    #[serde(default)]
    pub wid: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub pid: Option<i64>,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub v: Option<u32>,
    #[serde(default)]
    pub pwdhash: Option<String>,
}

pub struct Connection {
    fk: Faktory,
    /// Who holds the leases this connection takes: its wid, or an identity of its own.
    holder: String,
    wid: Option<String>,
}

/// Faktory's password proof: hex(sha256 applied `iterations` times to password + salt).
pub fn password_hash(password: &str, salt: &str, iterations: u32) -> String {
    let mut hash = Sha256::digest(format!("{password}{salt}").as_bytes());
    for _ in 1..iterations.max(1) {
        hash = Sha256::digest(hash);
    }
    hex::encode(hash)
}

fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Connection {
    /// Serves one client connection, plain TCP or TLS, until it closes.
    pub async fn run<S>(fk: Faktory, stream: S) -> std::io::Result<()>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(stream);
        let mut reader = BufReader::new(rd);
        let mut writer = BufWriter::new(wr);
        let (iterations, salt) = {
            use rand::Rng;
            let mut rng = rand::thread_rng();
            (
                rng.gen_range(4000..8096u32),
                format!("{:x}", rng.gen::<u64>() >> 1),
            )
        };
        let hi = match &fk.config().password {
            Some(_) => json!({"v": 2, "i": iterations, "s": salt}),
            None => json!({"v": 2}),
        };
        resp::write(&mut writer, &Reply::Simple(format!("HI {hi}"))).await?;
        let max = fk.app().limits().body_bytes + 1024;
        let line = match tokio::time::timeout(HELLO_WITHIN, resp::read_line(&mut reader, max)).await
        {
            Ok(Ok(Line::Command(l))) => l,
            _ => return Ok(()),
        };
        let hello: Hello = match line
            .strip_prefix("HELLO ")
            .and_then(|raw| serde_json::from_str(raw).ok())
        {
            Some(h) => h,
            None => {
                resp::write(&mut writer, &Reply::err("invalid HELLO")).await?;
                return Ok(());
            }
        };
        if let Some(password) = &fk.config().password {
            let iterations = if hello.v.unwrap_or(0) < 2 {
                1
            } else {
                iterations
            };
            let expected = password_hash(password, &salt, iterations);
            if !same_secret(hello.pwdhash.as_deref().unwrap_or(""), &expected) {
                resp::write(&mut writer, &Reply::err("Invalid password")).await?;
                return Ok(());
            }
        }
        let wid = hello.wid.clone().filter(|w| !w.is_empty());
        let holder = wid.clone().unwrap_or_else(|| {
            use rand::Rng;
            format!("faktory-conn-{:016x}", rand::thread_rng().gen::<u64>())
        });
        fk.worker_hello(&Hello {
            wid: wid.clone(),
            ..hello
        });
        let conn = Connection {
            fk: fk.clone(),
            holder,
            wid,
        };
        let result = conn.serve(&mut reader, &mut writer, max).await;
        conn.closed().await;
        result
    }

    async fn serve<R, W>(
        &self,
        reader: &mut BufReader<R>,
        writer: &mut BufWriter<W>,
        max: usize,
    ) -> std::io::Result<()>
    where
        R: tokio::io::AsyncRead + Unpin,
        W: tokio::io::AsyncWrite + Unpin,
    {
        resp::write(writer, &Reply::Ok).await?;
        let shutdown = self.fk.app().shutdown().clone();
        loop {
            let line = tokio::select! {
                _ = shutdown.cancelled() => {
                    let _ = resp::write(writer, &Reply::err("shutdown in progress")).await;
                    return Ok(());
                }
                line = resp::read_line(reader, max) => line?,
            };
            let line = match line {
                Line::Command(l) => l,
                Line::Closed => return Ok(()),
                Line::TooLong => {
                    resp::write(
                        writer,
                        &Reply::err(format!("command longer than {max} bytes")),
                    )
                    .await?;
                    return Ok(());
                }
                Line::Invalid => {
                    resp::write(writer, &Reply::err("commands must be UTF-8")).await?;
                    continue;
                }
            };
            self.fk.count_command();
            if let Some(wid) = &self.wid {
                self.fk.worker_seen(wid);
            }
            let (verb, args) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            if verb == "END" {
                return Ok(());
            }
            let (reply, leased) = self.dispatch(verb, args).await;
            if let Err(e) = resp::write(writer, &reply).await {
                // The job never reached the worker: give it back now rather than at expiry.
                if let Some((jid, held)) = leased {
                    self.fk
                        .release(
                            &jid,
                            &held,
                            "ConnectionLost: the worker left before receiving the job",
                        )
                        .await;
                }
                return Err(e);
            }
        }
    }

    /// The connection is gone: a worker's leases wait for its BEATs to stop (it may reconnect);
    /// leases of a connection without a wid can never be reported, so they are released now.
    async fn closed(&self) {
        match &self.wid {
            Some(wid) => self.fk.worker_closed(wid),
            None => {
                self.fk
                    .release_holder(
                        &self.holder,
                        "ConnectionLost: the connection that fetched the job closed",
                    )
                    .await
            }
        }
    }

    async fn dispatch(&self, verb: &str, args: &str) -> (Reply, Option<(String, Held)>) {
        let reply = match verb {
            "PUSH" => self.push(args).await,
            "PUSHB" => self.push_bulk(args).await,
            "FETCH" => return self.fetch(args).await,
            "ACK" => self.ack(args).await,
            "FAIL" => self.fail(args).await,
            "BEAT" => self.beat(args),
            "INFO" => self.info().await,
            "QUEUE" => self.queue(args).await,
            "MUTATE" => self.mutate(args).await,
            "FLUSH" => self.flush().await,
            "BATCH" => Reply::err("batch subsystem is only available in Faktory Enterprise"),
            "TRACK" => Reply::err("tracking subsystem is only available in Faktory Enterprise"),
            other => Reply::err(format!("unknown command {other}")),
        };
        (reply, None)
    }

    // ---- producing ----

    async fn push(&self, raw: &str) -> Reply {
        let value: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => return Reply::err(format!("invalid JSON: {e}")),
        };
        match self.submit(vec![value]).await.pop() {
            Some((_, Ok(()))) => Reply::Ok,
            Some((_, Err(e))) => Reply::err(e),
            None => Reply::err("nothing was stored"),
        }
    }

    async fn push_bulk(&self, raw: &str) -> Reply {
        let values: Vec<Value> = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => return Reply::err(format!("invalid JSON: {e}")),
        };
        let max = self.fk.app().limits().jobs_per_batch;
        if values.len() > max {
            return Reply::err(format!("at most {max} jobs per PUSHB"));
        }
        let errors: Map<String, Value> = self
            .submit(values)
            .await
            .into_iter()
            .filter_map(|(jid, r)| r.err().map(|e| (jid, Value::String(e))))
            .collect();
        Reply::json(&Value::Object(errors))
    }

    /// Checks and stores jobs; each answer is the job's jid and its outcome. Valid jobs are
    /// stored in one transaction when they can be, else one at a time (so one conflicting jid
    /// does not sink the others, as PUSHB is not all-or-nothing in Faktory).
    async fn submit(&self, values: Vec<Value>) -> Vec<(String, Result<(), String>)> {
        let app = self.fk.app();
        let now = app.now();
        let shape = job::Shape {
            reserve_min: self.fk.config().reserve_min,
            backoff: self.fk.config().backoff,
        };
        let mut out: Vec<(String, Result<(), String>)> = Vec::with_capacity(values.len());
        let mut valid: Vec<(usize, NewJob)> = Vec::new();
        for value in values {
            let jid = value
                .get("jid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            match job::from_push(value, &shape, app.limits(), now) {
                Ok(p) => {
                    self.fk.queue_known(&p.spec.steps[0].agent);
                    let record = Job::from_spec(app.new_job_id(), &p.spec, now);
                    valid.push((
                        out.len(),
                        NewJob {
                            transition: admit(record, now),
                        },
                    ));
                    out.push((p.jid, Ok(())));
                }
                Err(e) => out.push((jid, Err(e))),
            }
        }
        if valid.is_empty() {
            return out;
        }
        let batch: Vec<NewJob> = valid.iter().map(|(_, n)| n.clone()).collect();
        match app.store().jobs_submit(batch).await {
            Ok(submitted) => {
                for s in &submitted {
                    self.created(s);
                }
            }
            Err(overseer_store::Error::IdempotencyConflict { .. }) if valid.len() > 1 => {
                for (i, new) in valid {
                    let r = app.store().jobs_submit(vec![new]).await;
                    out[i].1 = self.outcome(&out[i].0, r);
                }
            }
            Err(e) => {
                let jid = out[valid[0].0].0.clone();
                let r = self.outcome(&jid, Err(e));
                for (i, _) in valid {
                    out[i].1 = r.clone();
                }
            }
        }
        out
    }

    fn created(&self, s: &Submitted) {
        if let Submitted::Created(t) = s {
            let app = self.fk.app();
            app.metrics().jobs_submitted.inc();
            app.committed(t);
        }
    }

    fn outcome(&self, jid: &str, r: overseer_store::Result<Vec<Submitted>>) -> Result<(), String> {
        match r {
            Ok(submitted) => {
                submitted.iter().for_each(|s| self.created(s));
                Ok(())
            }
            Err(overseer_store::Error::IdempotencyConflict { existing, .. }) => Err(format!(
                "jid {jid} was already pushed with a different body (job {existing})"
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    // ---- working ----

    async fn fetch(&self, args: &str) -> (Reply, Option<(String, Held)>) {
        let app = self.fk.app();
        let wait = self.fk.config().fetch_wait;
        let shutdown = app.shutdown().clone();
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
        if quiet || queues.is_empty() {
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

    /// The live lease of `jid`: this node's record, else the store's view of the step.
    async fn resolve(&self, jid: &str) -> overseer_store::Result<Option<Held>> {
        if let Some(h) = self.fk.lease_of(jid) {
            return Ok(Some(h));
        }
        let store = self.fk.app().store();
        let found = match jid.split_once('/') {
            Some((id, name)) => match id.parse::<JobId>() {
                Ok(id) => store
                    .job_get(id)
                    .await?
                    .and_then(|job| job.step_index(name).map(|i| (job, i))),
                Err(_) => None,
            },
            None => None,
        };
        let found = match found {
            Some(f) => Some(f),
            None => store
                .jobs_list(JobQuery {
                    labels: vec![(job::LABEL_JID.to_string(), jid.to_string())],
                    limit: 1,
                    ..JobQuery::default()
                })
                .await?
                .into_iter()
                .next()
                .filter(job::is_faktory)
                .map(|job| (job, 0)),
        };
        let Some((job, step)) = found else {
            return Ok(None);
        };
        let s = &job.steps[step];
        if !s.is_leased() {
            return Ok(None);
        }
        Ok(match (s.lease_id, &s.worker, s.lease_expires_at) {
            (Some(lease_id), Some(holder), Some(expires_at)) => Some(Held {
                job_id: job.id,
                step,
                attempt: s.attempt,
                lease_id,
                holder: holder.clone(),
                expires_at,
            }),
            _ => None,
        })
    }

    async fn ack(&self, data: &str) -> Reply {
        let Some(jid) = jid_of(data) else {
            return Reply::err(format!("invalid ACK {data}"));
        };
        let held = match self.resolve(&jid).await {
            Ok(Some(h)) => h,
            // Faktory answers OK to an ACK of a job it does not hold.
            Ok(None) => return Reply::Ok,
            Err(e) => return Reply::err(e),
        };
        if held.holder != self.holder {
            tracing::info!(jid, holder = %self.holder, "ACK from a connection that does not hold the job: ignored");
            return Reply::Ok;
        }
        let command = Command::Complete {
            step: held.step,
            attempt: held.attempt,
            result: Value::Null,
        };
        match self.apply(&held, command).await {
            Ok(true) => {
                self.fk.count_processed();
                self.fk.forget_failure(&jid);
            }
            Ok(false) => tracing::info!(jid, "late ACK: the reservation had expired; ignored"),
            Err(e) => return Reply::err(e),
        }
        self.fk.forget_lease(&jid, held.attempt);
        Reply::Ok
    }

    async fn fail(&self, data: &str) -> Reply {
        #[derive(Deserialize)]
        struct Payload {
            #[serde(default)]
            jid: String,
            #[serde(default)]
            errtype: Option<String>,
            #[serde(default)]
            message: Option<String>,
            #[serde(default)]
            backtrace: Option<Vec<String>>,
        }
        let p: Payload = match serde_json::from_str(data) {
            Ok(p) => p,
            Err(_) => return Reply::err(format!("invalid FAIL {data}")),
        };
        if p.jid.is_empty() {
            return Reply::err("missing JID");
        }
        let jid = p.jid;
        let not_found = || Reply::err(format!("Job not found {jid}"));
        let info = FailInfo {
            errtype: clean(p.errtype, 100),
            message: clean(p.message, 1000),
            backtrace: p
                .backtrace
                .unwrap_or_default()
                .into_iter()
                .take(50)
                .collect(),
            failed_at: self.fk.app().now(),
        };
        let held = match self.resolve(&jid).await {
            Ok(Some(h)) if h.holder == self.holder => h,
            Ok(_) => return not_found(),
            Err(e) => return Reply::err(e),
        };
        let command = Command::Fail {
            step: held.step,
            attempt: held.attempt,
            error: info.error_text(),
            retryable: true,
            jitter: self.fk.app().jitter(),
        };
        let applied = self.apply(&held, command).await;
        self.fk.forget_lease(&jid, held.attempt);
        match applied {
            Ok(true) => {
                self.fk.count_failed();
                self.fk.remember_failure(&jid, info);
                Reply::Ok
            }
            Ok(false) => not_found(),
            Err(e) => Reply::err(e),
        }
    }

    /// Applies a report; Ok(false) when the lease was no longer live (nothing changed, or the
    /// stale report only settled a step its job no longer wanted).
    async fn apply(&self, held: &Held, command: Command) -> overseer_store::Result<bool> {
        let app = self.fk.app();
        let name = command.name();
        match app
            .store()
            .job_apply(Apply::new(held.job_id, command, app.now()))
            .await
        {
            Ok(t) => {
                app.committed(&t);
                if let Some(s) = t.job.steps.get(held.step) {
                    app.notifier().wake_agent(s.claim_agent_of_lease());
                }
                let live = !matches!(t.reply, CoreReply::Refused(_));
                app.metrics()
                    .report(name, if live { "ok" } else { "lease_lost" });
                Ok(live)
            }
            Err(overseer_store::Error::Rejected(_)) => {
                app.metrics().report(name, "lease_lost");
                Ok(false)
            }
            Err(e) => {
                app.metrics().report(name, "error");
                Err(e)
            }
        }
    }

    fn beat(&self, data: &str) -> Reply {
        #[derive(Deserialize)]
        struct Beat {
            wid: String,
            #[serde(default)]
            current_state: Option<String>,
            #[serde(default)]
            rss_kb: Option<i64>,
        }
        let beat: Beat = match serde_json::from_str(data) {
            Ok(b) => b,
            Err(_) => return Reply::err(format!("invalid BEAT {data}")),
        };
        match self
            .fk
            .worker_beat(&beat.wid, beat.current_state.as_deref(), beat.rss_kb)
        {
            None => Reply::err(format!("unknown worker {}", beat.wid)),
            Some(WorkerState::Running) => Reply::Ok,
            Some(state) => Reply::json(&json!({ "state": state.as_str() })),
        }
    }

    // ---- operating ----

    async fn info(&self) -> Reply {
        let app = self.fk.app();
        let now = app.now();
        // A queue's size is what a worker could fetch from it now, as in Faktory: jobs waiting
        // for a retry or their `at` are in the retries and scheduled sets instead.
        let ready = match app.store().agents_ready_now(now).await {
            Ok(c) => c,
            Err(e) => return Reply::err(e),
        };
        let mut queues: Map<String, Value> = self
            .fk
            .queues_known()
            .into_iter()
            .map(|q| (q, json!(0)))
            .collect();
        for r in &ready {
            queues.insert(r.agent.clone(), json!(r.ready));
        }
        let total: u64 = ready.iter().map(|r| r.ready).sum();
        let st = self.fk.stats();
        let day_secs = now.as_millis().div_euclid(1000).rem_euclid(86_400);
        let utc = format!(
            "{:02}:{:02}:{:02} UTC",
            day_secs / 3600,
            day_secs / 60 % 60,
            day_secs % 60
        );
        Reply::json(&json!({
            "now": now.to_rfc3339(),
            "server_utc_time": utc,
            "faktory": {
                "total_failures": st.failures,
                "total_processed": st.processed,
                "total_enqueued": total,
                "total_queues": queues.len(),
                "queues": queues,
                "tasks": {
                    "Workers": { "size": st.workers },
                    "Leases": { "size": st.leases },
                    "Reaper": { "reaped_workers": st.reaped_workers, "released_leases": st.released_leases },
                },
            },
            "server": {
                "description": "Overseer (Faktory work protocol)",
                "faktory_version": crate::FAKTORY_VERSION,
                "uptime": st.uptime_secs,
                "connections": st.connections,
                "command_count": st.commands,
                "used_memory_mb": used_memory_mb(),
            },
        }))
    }

    async fn queue(&self, args: &str) -> Reply {
        let mut parts = args.split_whitespace();
        let sub = parts.next().unwrap_or_default();
        let names: Vec<&str> = parts.collect();
        if !matches!(sub, "PAUSE" | "RESUME" | "REMOVE" | "LATENCY") || names.is_empty() {
            return Reply::err("invalid format");
        }
        let names: Vec<String> = if names == ["*"] {
            match self.all_queues().await {
                Ok(all) => all,
                Err(e) => return Reply::err(e),
            }
        } else {
            names.into_iter().map(str::to_string).collect()
        };
        let result = match sub {
            "PAUSE" => self.queue_pause(&names, true).await,
            "RESUME" => self.queue_pause(&names, false).await,
            "REMOVE" => self.queue_remove(&names).await,
            _ => return self.queue_latency(&names).await,
        };
        match result {
            Ok(()) => Reply::Ok,
            Err(e) => Reply::err(e),
        }
    }

    /// Every queue `*` stands for: known ones, ones with work, and paused or limited ones.
    async fn all_queues(&self) -> overseer_store::Result<Vec<String>> {
        let app = self.fk.app();
        let mut all: Vec<String> = self.fk.queues_known().into_iter().collect();
        all.extend(
            app.store()
                .agents_counts()
                .await?
                .into_iter()
                .map(|c| c.agent),
        );
        all.extend(
            app.store()
                .agent_settings_list()
                .await?
                .into_iter()
                .map(|limits| limits.agent),
        );
        all.sort();
        all.dedup();
        Ok(all)
    }

    async fn queue_pause(&self, names: &[String], paused: bool) -> overseer_store::Result<()> {
        let app = self.fk.app();
        for name in names {
            let mut settings = app.store().agent_settings_get(name).await?;
            if settings.paused != paused {
                settings.paused = paused;
                app.store()
                    .agent_settings_put(SettingsUpdate {
                        agent: name.to_string(),
                        settings,
                        now: app.now(),
                    })
                    .await?;
                tracing::info!(queue = name, paused, "faktory queue pause changed");
            }
            app.notifier().wake_agent(name);
        }
        Ok(())
    }

    /// `QUEUE REMOVE`: deletes the Faktory jobs waiting in the queues (due, not leased; jobs in
    /// the retries or scheduled sets stay, as in Faktory) and forgets the queues. Steps of
    /// Overseer jobs submitted over HTTP are never removed this way.
    async fn queue_remove(&self, names: &[String]) -> overseer_store::Result<()> {
        let app = self.fk.app();
        for name in names {
            let now = app.now();
            let labels = vec![(job::LABEL_QUEUE.to_string(), name.clone())];
            let ids: Vec<JobId> = self
                .scan(Some(JobState::Running), labels)
                .await?
                .into_iter()
                .filter(|j| job::is_enqueued(j, now) && j.steps[0].agent == *name)
                .map(|j| j.id)
                .collect();
            let deleted = app
                .store()
                .jobs_delete(Removal {
                    ids,
                    states: vec![JobState::Running],
                })
                .await?;
            self.fk.queue_forget(name);
            tracing::info!(queue = name, jobs = deleted.len(), "faktory queue removed");
        }
        Ok(())
    }

    /// `QUEUE LATENCY`: per queue, seconds since its oldest waiting Faktory job became ready
    /// (0 when none waits).
    async fn queue_latency(&self, names: &[String]) -> Reply {
        let now = self.fk.app().now();
        let mut out = Map::new();
        for name in names {
            let labels = vec![(job::LABEL_QUEUE.to_string(), name.clone())];
            let jobs = match self.scan(Some(JobState::Running), labels).await {
                Ok(j) => j,
                Err(e) => return Reply::err(e),
            };
            let oldest = jobs
                .iter()
                .filter(|j| job::is_enqueued(j, now))
                .filter_map(|j| {
                    let s = &j.steps[0];
                    s.next_attempt_at.max(s.ready_at)
                })
                .min();
            let secs = oldest.map_or(0.0, |t| {
                (now.as_millis() - t.as_millis()).max(0) as f64 / 1000.0
            });
            out.insert(name.clone(), json!(secs));
        }
        Reply::json(&Value::Object(out))
    }

    async fn mutate(&self, raw: &str) -> Reply {
        #[derive(Deserialize, Default)]
        struct Filter {
            #[serde(default)]
            jobtype: Option<String>,
            #[serde(default)]
            jids: Option<Vec<String>>,
            #[serde(default)]
            regexp: Option<String>,
        }
        #[derive(Deserialize)]
        struct Operation {
            cmd: String,
            target: String,
            #[serde(default)]
            filter: Option<Filter>,
        }
        let op: Operation = match serde_json::from_str(raw.trim()) {
            Ok(op) => op,
            Err(e) => return Reply::err(format!("invalid JSON: {e}")),
        };
        if !matches!(op.cmd.as_str(), "clear" | "kill" | "discard" | "requeue") {
            return Reply::err("unknown mutate operation");
        }
        let Some(set) = job::Set::parse(&op.target) else {
            return Reply::err("invalid target for mutation command");
        };
        let filter = op.filter.unwrap_or_default();
        let now = self.fk.app().now();
        let (by_jids, by_type) = match (filter.regexp.as_deref(), filter.jobtype.as_deref()) {
            (Some(p), t) if !p.is_empty() => (None, t.filter(|t| !t.is_empty())),
            (_, Some(t)) if !t.is_empty() => (None, Some(t)),
            _ => (filter.jids.as_deref().filter(|j| !j.is_empty()), None),
        };
        let by_jids = if op.cmd == "clear" { None } else { by_jids };
        let by_type = if op.cmd == "clear" { None } else { by_type };
        let candidates = match self.set_candidates(set, by_jids, by_type).await {
            Ok(c) => c,
            Err(e) => return Reply::err(e),
        };
        // Faktory's precedence: a pattern (with the jobtype, if any), else the jobtype, else the
        // jids; no filter (or `clear`) takes the whole set.
        let everything = op.cmd == "clear";
        let pattern = filter.regexp.as_deref().filter(|p| !p.is_empty());
        let jobtype = filter.jobtype.as_deref().filter(|t| !t.is_empty());
        let jids = filter.jids.as_deref().filter(|j| !j.is_empty());
        let chosen: Vec<Job> = candidates
            .into_iter()
            .filter(|j| set.contains(j, now))
            .filter(|j| {
                if everything {
                    return true;
                }
                let jid = j.labels.get(job::LABEL_JID).map(String::as_str);
                let type_ok = || {
                    jobtype.is_none_or(|t| {
                        j.labels.get(job::LABEL_JOBTYPE).map(String::as_str) == Some(t)
                    })
                };
                match (pattern, jobtype, jids) {
                    (Some(p), _, _) => {
                        type_ok() && {
                            let fail = jid.and_then(|jid| self.fk.failure_of(jid));
                            job::glob_match(p, &job::view(j, fail.as_ref()).to_string())
                        }
                    }
                    (None, Some(_), _) => type_ok(),
                    (None, None, Some(jids)) => {
                        jid.is_some_and(|jid| jids.iter().any(|x| x == jid))
                    }
                    (None, None, None) => true,
                }
            })
            .collect();
        let result = match op.cmd.as_str() {
            "requeue" => self.requeue(set, chosen).await,
            "kill" if set != job::Set::Dead => self.kill(chosen).await,
            "kill" => Ok(0),
            _ => {
                let ids = chosen.iter().map(|j| j.id).collect();
                self.fk
                    .app()
                    .store()
                    .jobs_delete(Removal {
                        ids,
                        states: set.states(),
                    })
                    .await
                    .map(|d| d.len())
            }
        };
        match result {
            Ok(n) => {
                tracing::info!(cmd = op.cmd, target = op.target, jobs = n, "faktory MUTATE");
                Reply::Ok
            }
            Err(e) => Reply::err(e),
        }
    }

    /// Faktory jobs that may be in `set`, narrowed by the filter's jids or jobtype where the
    /// labels can do it.
    async fn set_candidates(
        &self,
        set: job::Set,
        jids: Option<&[String]>,
        jobtype: Option<&str>,
    ) -> overseer_store::Result<Vec<Job>> {
        let mut out = Vec::new();
        for state in set.states() {
            match jids {
                Some(jids) => {
                    for jid in jids.iter().take(SCAN_MAX) {
                        let labels = vec![(job::LABEL_JID.to_string(), jid.clone())];
                        out.extend(self.scan(Some(state), labels).await?);
                    }
                }
                _ => {
                    let mut labels = Vec::new();
                    if let Some(t) = jobtype {
                        labels.push((job::LABEL_JOBTYPE.to_string(), t.to_string()));
                    }
                    out.extend(self.scan(Some(state), labels).await?);
                }
            }
        }
        Ok(out)
    }

    /// Moves jobs to the dead set: cancelled, kept with their history.
    async fn kill(&self, jobs: Vec<Job>) -> overseer_store::Result<usize> {
        let mut n = 0;
        for j in jobs {
            self.cancel(j.id).await?;
            n += 1;
        }
        Ok(n)
    }

    /// Starts jobs over, due at once, each replacing its old record in one transaction.
    async fn requeue(&self, set: job::Set, jobs: Vec<Job>) -> overseer_store::Result<usize> {
        let app = self.fk.app();
        let shape = job::Shape {
            reserve_min: self.fk.config().reserve_min,
            backoff: self.fk.config().backoff,
        };
        let mut n = 0;
        for old in jobs {
            let now = app.now();
            let jid = old.labels.get(job::LABEL_JID).cloned().unwrap_or_default();
            let fail = self.fk.failure_of(&jid);
            let pushed = match job::restart(&old, fail.as_ref(), &shape, app.limits(), now) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(jid, error = e, "cannot requeue a faktory job");
                    continue;
                }
            };
            let record = Job::from_spec(app.new_job_id(), &pushed.spec, now);
            let new = NewJob {
                transition: admit(record, now),
            };
            if let Some(t) = app
                .store()
                .job_replace(Replacement {
                    old: old.id,
                    states: set.states(),
                    new,
                })
                .await?
            {
                app.committed(&t);
                self.fk.forget_failure(&jid);
                self.fk.queue_known(&t.job.steps[0].agent);
                n += 1;
            }
        }
        Ok(n)
    }

    async fn flush(&self) -> Reply {
        if !self.fk.config().allow_flush {
            return Reply::err(
                "FLUSH is disabled on this server (start it with --faktory-allow-flush, for development only)",
            );
        }
        for state in [JobState::Pending, JobState::Running, JobState::Blocked] {
            let jobs = match self.scan(Some(state), Vec::new()).await {
                Ok(j) => j,
                Err(e) => return Reply::err(e),
            };
            for job in jobs {
                if let Err(e) = self.cancel(job.id).await {
                    return Reply::err(e);
                }
            }
        }
        Reply::Ok
    }

    /// Faktory jobs in `state` with the given labels too, newest first, at most [`SCAN_MAX`].
    async fn scan(
        &self,
        state: Option<JobState>,
        mut labels: Vec<(String, String)>,
    ) -> overseer_store::Result<Vec<Job>> {
        let store = self.fk.app().store();
        labels.push((job::LABEL_VIA.to_string(), job::VIA.to_string()));
        let mut out = Vec::new();
        let mut before = None;
        while out.len() < SCAN_MAX {
            let page = store
                .jobs_list(JobQuery {
                    state,
                    labels: labels.clone(),
                    limit: SCAN_PAGE,
                    before,
                    ..JobQuery::default()
                })
                .await?;
            let full = page.len() == SCAN_PAGE;
            before = page.last().map(|j| j.id);
            out.extend(page.into_iter().filter(job::is_faktory));
            if !full {
                break;
            }
        }
        Ok(out)
    }

    async fn cancel(&self, id: JobId) -> overseer_store::Result<()> {
        let app = self.fk.app();
        match app
            .store()
            .job_apply(Apply::new(id, Command::Cancel, app.now()))
            .await
        {
            Ok(t) => {
                app.committed(&t);
                Ok(())
            }
            Err(overseer_store::Error::Rejected(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn jid_of(data: &str) -> Option<String> {
    let v: Value = serde_json::from_str(data).ok()?;
    v.get("jid")?.as_str().map(str::to_string)
}

/// Faktory's clean-up of FAIL fields: trimmed, cut, "unknown" when empty.
fn clean(s: Option<String>, max_chars: usize) -> String {
    let s = s.unwrap_or_default();
    let s = s.trim();
    if s.is_empty() {
        return "unknown".into();
    }
    s.chars().take(max_chars).collect()
}

/// Resident memory of this process in MiB (Linux), else 0.
fn used_memory_mb() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096 / (1024 * 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Proves the password proof matches Faktory's definition (one round = plain sha256).
    #[test]
    fn password_hash_iterates_sha256() {
        let one = password_hash("pw", "salt", 1);
        assert_eq!(one, hex::encode(Sha256::digest(b"pwsalt")));
        let two = password_hash("pw", "salt", 2);
        assert_eq!(two, hex::encode(Sha256::digest(Sha256::digest(b"pwsalt"))));
        assert!(same_secret(&two, &two.clone()) && !same_secret(&one, &two));
    }
}
