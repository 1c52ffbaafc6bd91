//! Producing: `PUSH` and `PUSHB`, a Faktory job checked, turned into an Overseer job and stored.

use overseer_core::machine::admit;
use overseer_core::Job;
use overseer_store::{NewJob, Submitted};
use serde_json::{Map, Value};

use super::Connection;
use crate::job;
use crate::resp::Reply;

impl Connection {
    pub(super) async fn push(&self, raw: &str) -> Reply {
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

    pub(super) async fn push_bulk(&self, raw: &str) -> Reply {
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
        let shape = self.shape();
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
}
