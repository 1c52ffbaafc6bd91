//! Running a failed or cancelled job again as a new job (`Jobs::job_rerun`): the core decides
//! everything (`overseer_core::rerun::rerun`); this writes the old job's link and inserts the new
//! job in one transaction. The old job's row lock (`FOR UPDATE`) serialises reruns of one job
//! across nodes: the second finds `rerun_by` set and is refused. Locks are taken in the order a
//! replacement takes them (the ordering key's, then the job's), so the two cannot deadlock.

use super::tx::Transaction;

use super::rows::{self, corrupt, execute, Lock};
use super::{jobs, Failure, Res};
use crate::{Error, NewJob, Reran, RerunJob, Submitted};

pub(super) async fn rerun(
    tx: &Transaction<'_>,
    r: &RerunJob,
    history_per_job: usize,
) -> Res<Reran> {
    let missing = || Failure::Store(Error::JobNotFound(r.old));
    // The ordering key is fixed at admission: read it first, lock it, then lock the job.
    let unlocked = rows::load_job(tx, r.old, Lock::None)
        .await?
        .ok_or_else(missing)?;
    if let Some(key) = unlocked.ordering_key.as_deref() {
        jobs::lock_ordering_keys(tx, vec![key]).await?;
    }
    let old = rows::load_job(tx, r.old, Lock::Update)
        .await?
        .ok_or_else(missing)?;
    let decided =
        overseer_core::rerun::rerun(&old, r.new, &r.options, r.submitted_by.clone(), r.now)?;
    jobs::persist(tx, &decided.link, r.now, history_per_job).await?;
    // `rerun_by` is written only here, once: a transition elsewhere never changes it.
    let linked = execute(
        tx,
        "UPDATE jobs SET rerun_by = $2 WHERE id = $1 AND rerun_by IS NULL",
        &[&r.old.0, &r.new.0],
    )
    .await?;
    if linked != 1 {
        return Err(corrupt(
            "jobs.rerun_by",
            format!("job {} could not be linked", r.old),
        ));
    }
    let new = NewJob {
        transition: decided.admission,
    };
    // Any error below leaves the transaction uncommitted: the link is undone too.
    match jobs::submit_one(tx, 0, &new, history_per_job).await? {
        Submitted::Created(created) => Ok(Reran {
            link: decided.link,
            created,
        }),
        Submitted::Existing(_) => Err(corrupt(
            "jobs",
            format!("the rerun of job {} was not inserted", r.old),
        )),
    }
}
