//! Jobs changed in bulk: `MUTATE` on the retries, scheduled and dead sets, and `FLUSH`.

use overseer_core::machine::admit;
use overseer_core::{Job, JobState};
use overseer_store::{NewJob, Removal, Replacement};
use serde::Deserialize;

use super::{Connection, SCAN_MAX};
use crate::job;
use crate::resp::Reply;

/// `MUTATE`'s filter, as sent; empty fields count as absent (see [`Filter::given`]).
#[derive(Deserialize, Default)]
struct Filter {
    #[serde(default)]
    jobtype: Option<String>,
    #[serde(default)]
    jids: Option<Vec<String>>,
    #[serde(default)]
    regexp: Option<String>,
}

impl Filter {
    /// The filter with its empty fields dropped.
    fn given(self) -> Filter {
        Filter {
            jobtype: self.jobtype.filter(|t| !t.is_empty()),
            jids: self.jids.filter(|j| !j.is_empty()),
            regexp: self.regexp.filter(|p| !p.is_empty()),
        }
    }

    /// What the jobs' labels can narrow the scan by: the jobtype when a pattern or a jobtype is
    /// given, else the jids.
    fn narrowing(&self) -> (Option<&[String]>, Option<&str>) {
        match (&self.regexp, &self.jobtype) {
            (None, None) => (self.jids.as_deref(), None),
            _ => (None, self.jobtype.as_deref()),
        }
    }
}

/// The command as sent: `{"cmd", "target", "filter"}`.
#[derive(Deserialize)]
struct Operation {
    cmd: String,
    target: String,
    #[serde(default)]
    filter: Option<Filter>,
}

/// A `MUTATE` command, checked.
struct Mutation {
    cmd: String,
    target: String,
    set: job::Set,
    filter: Filter,
}

impl Mutation {
    /// Reads the command's JSON; errors are Faktory's messages.
    fn parse(raw: &str) -> Result<Mutation, String> {
        let op: Operation =
            serde_json::from_str(raw.trim()).map_err(|e| format!("invalid JSON: {e}"))?;
        if !matches!(op.cmd.as_str(), "clear" | "kill" | "discard" | "requeue") {
            return Err("unknown mutate operation".into());
        }
        let Some(set) = job::Set::parse(&op.target) else {
            return Err("invalid target for mutation command".into());
        };
        // `clear` takes the whole set, whatever the filter says.
        let filter = match op.cmd.as_str() {
            "clear" => Filter::default(),
            _ => op.filter.unwrap_or_default().given(),
        };
        Ok(Mutation {
            cmd: op.cmd,
            target: op.target,
            set,
            filter,
        })
    }
}

impl Connection {
    pub(super) async fn mutate(&self, raw: &str) -> Reply {
        let m = match Mutation::parse(raw) {
            Ok(m) => m,
            Err(e) => return Reply::err(e),
        };
        let chosen = match self.mutation_targets(m.set, &m.filter).await {
            Ok(c) => c,
            Err(e) => return Reply::err(e),
        };
        let result = match m.cmd.as_str() {
            "requeue" => self.requeue(m.set, chosen).await,
            "kill" if m.set != job::Set::Dead => self.kill(chosen).await,
            "kill" => Ok(0),
            _ => self.discard(m.set, chosen).await,
        };
        match result {
            Ok(n) => {
                tracing::info!(cmd = m.cmd, target = m.target, jobs = n, "faktory MUTATE");
                Reply::Ok
            }
            Err(e) => Reply::err(e),
        }
    }

    /// The jobs in `set` now that `filter` picks.
    async fn mutation_targets(
        &self,
        set: job::Set,
        filter: &Filter,
    ) -> overseer_store::Result<Vec<Job>> {
        let now = self.fk.app().now();
        let (by_jids, by_type) = filter.narrowing();
        let candidates = self.set_candidates(set, by_jids, by_type).await?;
        Ok(candidates
            .into_iter()
            .filter(|j| set.contains(j, now))
            .filter(|j| self.picks(filter, j))
            .collect())
    }

    /// Whether `filter` picks `j`, with Faktory's precedence: a pattern (with the jobtype, if
    /// any), else the jobtype, else the jids; no filter takes the whole set.
    fn picks(&self, filter: &Filter, j: &Job) -> bool {
        let jid = j.labels.get(job::LABEL_JID).map(String::as_str);
        let type_ok = || {
            filter
                .jobtype
                .as_deref()
                .is_none_or(|t| j.labels.get(job::LABEL_JOBTYPE).map(String::as_str) == Some(t))
        };
        match (&filter.regexp, &filter.jobtype, &filter.jids) {
            (Some(p), _, _) => {
                type_ok() && {
                    let fail = jid.and_then(|jid| self.fk.failure_of(jid));
                    job::glob_match(p, &job::view(j, fail.as_ref()).to_string())
                }
            }
            (None, Some(_), _) => type_ok(),
            (None, None, Some(jids)) => jid.is_some_and(|jid| jids.iter().any(|x| x == jid)),
            (None, None, None) => true,
        }
    }

    /// Deletes jobs (`discard`, and `clear` of the whole set) if they are still in `set`.
    async fn discard(&self, set: job::Set, jobs: Vec<Job>) -> overseer_store::Result<usize> {
        let ids = jobs.iter().map(|j| j.id).collect();
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
        let shape = self.shape();
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

    pub(super) async fn flush(&self) -> Reply {
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
}
