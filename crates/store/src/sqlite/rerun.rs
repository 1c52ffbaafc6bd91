//! Running a failed or cancelled job again as a new job (`Jobs::job_rerun`): the core decides
//! everything (`overseer_core::rerun::rerun`); this writes the old job's link and inserts the new
//! job in the writer's one transaction, so there is no instant at which one exists without the
//! other, and two reruns of one job are serialised by the writer (the second finds `rerun_by`).

use rusqlite::{params, Connection};

use super::jobs::submit_jobs;
use super::rows::{self, job_id_text, DbResult};
use crate::{Error, NewJob, Reran, RerunJob, Result, Submitted};

pub(super) fn rerun(conn: &Connection, r: RerunJob, history_per_job: usize) -> Result<Reran> {
    let old = rows::load_job(conn, r.old)?.ok_or(Error::JobNotFound(r.old))?;
    let decided = overseer_core::rerun::rerun(&old, r.new, &r.options, r.submitted_by, r.now)?;
    super::persist(conn, &old, &decided.link, r.now, history_per_job)?;
    // `rerun_by` is written only here, once: a transition elsewhere never changes it.
    super::written::forget(r.old);
    let linked = conn
        .prepare_cached("UPDATE jobs SET rerun_by = ?2 WHERE id = ?1 AND rerun_by IS NULL")
        .db()?
        .execute(params![job_id_text(r.old), job_id_text(r.new)])
        .db()?;
    if linked != 1 {
        return Err(Error::Corrupt(format!(
            "job {} could not be linked to its rerun",
            r.old
        )));
    }
    let new = NewJob {
        transition: decided.admission,
    };
    // The writer runs this in a savepoint of its own: an error below undoes the link too.
    match submit_jobs(conn, vec![new], history_per_job)?.pop() {
        Some(Submitted::Created(created)) => Ok(Reran {
            link: decided.link,
            created,
        }),
        _ => Err(Error::Corrupt(format!(
            "the rerun of job {} was not inserted",
            r.old
        ))),
    }
}
