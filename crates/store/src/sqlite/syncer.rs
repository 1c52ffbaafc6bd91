//! The log syncer: makes committed writes durable on a thread of its own, so the writer can run
//! the next batch while the disk flushes the last one.
//!
//! The write connection commits with `synchronous = NORMAL`: a commit appends its frames to the
//! WAL with `write()` and returns without an fsync. The writer then hands the batch to this
//! thread, which calls `fdatasync` on the WAL file and only then answers the batch's callers.
//! Commits that arrive while a sync runs share the next one, so a sync covers every commit
//! handed over before it began (the WAL is written in order: a sync makes everything written
//! before it durable). Before, the writer waited out each fsync itself: 44 % of its wall time
//! in a drain profile, with the other core half idle.
//!
//! Two rules keep the guarantee that nothing is acknowledged before it is on disk:
//! - **Writes** are answered only by this thread, after a sync that covers their commit
//!   succeeded. A failed sync answers every write it covered with an error and breaks the store
//!   for good: the kernel may have dropped the pages it could not write, so a later sync that
//!   succeeds proves nothing (the writer stops; reopening recovers from what is on disk).
//! - **Reads** could see a commit before its sync (a read connection sees the WAL as written).
//!   So each read notes the last commit it might have seen ([`Durability::visible`]) and its
//!   answer is held until that commit is durable ([`Durability::wait`]). Under load that costs a
//!   read at most one sync; when nothing is being synced it costs an atomic load.
//!
//! A process that crashes loses nothing either way (written frames are in the OS page cache);
//! the sync is what makes a commit survive a power loss or a kernel crash.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::watch;

use super::writer::WriteOp;
use crate::{Error, Result};

/// How far commits have been made durable, shared by the writer, the syncer and every read.
pub(super) struct Durability {
    /// Commits the writer has begun (numbered from 1); a reader may have seen any of them.
    begun: AtomicU64,
    /// The last commit known durable, or `None` once a sync failed.
    synced: watch::Sender<Option<u64>>,
    /// Held by the syncer while it syncs the log and by the writer while it commits upkeep, so
    /// the two never overlap (see [`Durability::turn`]).
    turn: std::sync::Mutex<()>,
    /// Held by a test to keep the syncer from syncing.
    #[cfg(test)]
    pub(super) hold: std::sync::Mutex<()>,
}

impl Durability {
    pub(super) fn new() -> Arc<Durability> {
        Arc::new(Durability {
            begun: AtomicU64::new(0),
            synced: watch::Sender::new(Some(0)),
            turn: std::sync::Mutex::new(()),
            #[cfg(test)]
            hold: std::sync::Mutex::new(()),
        })
    }

    /// Numbers the commit about to run. Called before `COMMIT`, so a reader that sees the commit
    /// finds its number in [`Durability::visible`].
    pub(super) fn begin_commit(&self) -> u64 {
        self.begun.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The last commit a read that has just finished might have seen.
    pub(super) fn visible(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Waits for a sync under way to end, and keeps the next one from starting until the guard
    /// is dropped. The writer takes it to commit upkeep: written into the log while a sync of it
    /// ran, a removal write's pages made that sync slow (in the `steady` benchmark, a tenth of
    /// such syncs took over 0.8 ms against 0.07 % of the others), and every claim in it waited.
    pub(super) fn turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.turn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a sync has failed (nothing is acknowledged any more).
    pub(super) fn is_broken(&self) -> bool {
        self.synced.borrow().is_none()
    }

    /// Waits until commit `upto` is durable.
    pub(super) async fn wait(&self, upto: u64) -> Result<()> {
        if self.synced.borrow().is_some_and(|n| n >= upto) {
            return Ok(());
        }
        let mut synced = self.synced.subscribe();
        let reached = synced
            .wait_for(|s| s.is_none_or(|n| n >= upto))
            .await
            .map_err(|_| Error::Unavailable(STOPPED.into()))?;
        match *reached {
            Some(_) => Ok(()),
            None => Err(Error::Unavailable(BROKEN.into())),
        }
    }

    fn advance(&self, to: u64) {
        self.synced.send_modify(|s| {
            if let Some(n) = s {
                *n = (*n).max(to);
            }
        });
    }

    fn break_for_good(&self) {
        self.synced.send_replace(None);
    }
}

pub(super) const BROKEN: &str =
    "the store could not make its log durable and has stopped; reopen it";
const STOPPED: &str = "the store's log syncer has stopped";

/// One committed (or failed) batch on its way to its callers.
pub(super) struct Committed {
    /// The commit's number from [`Durability::begin_commit`].
    pub(super) number: u64,
    pub(super) ops: Vec<Box<dyn WriteOp>>,
    /// `Err` when the batch was not committed: answered as is, nothing to sync.
    pub(super) outcome: std::result::Result<(), String>,
}

/// The syncer thread; dropping it ends the thread after every batch handed over is answered.
pub(super) struct Syncer {
    batches: Option<mpsc::Sender<Committed>>,
    handle: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the thread that syncs `wal` (the database's `-wal` file).
    pub(super) fn start(wal: PathBuf, durability: Arc<Durability>) -> Result<Syncer> {
        let (batches, receiver) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("overseer-sqlite-sync".into())
            .spawn(move || run(&receiver, &wal, &durability))
            .map_err(|e| Error::Unavailable(format!("cannot start the log syncer: {e}")))?;
        Ok(Syncer {
            batches: Some(batches),
            handle: Some(handle),
        })
    }

    /// Hands a batch over; its callers are answered once it is durable.
    pub(super) fn send(&self, batch: Committed) {
        let Some(batches) = &self.batches else {
            return;
        };
        if let Err(mpsc::SendError(batch)) = batches.send(batch) {
            for op in batch.ops {
                op.answer(Err(STOPPED.into()));
            }
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.batches = None;
        if let Some(handle) = self.handle.take() {
            if handle.join().is_err() {
                tracing::error!("the SQLite log syncer panicked");
            }
        }
    }
}

fn run(receiver: &mpsc::Receiver<Committed>, wal: &std::path::Path, durability: &Durability) {
    while let Ok(first) = receiver.recv() {
        #[cfg(test)]
        let _held = durability.hold.lock();
        let mut group = vec![first];
        group.extend(receiver.try_iter());
        let last = group.iter().map(|b| b.number).max().unwrap_or(0);
        let synced = if durability.is_broken() {
            Err(BROKEN.to_string())
        } else if group.iter().any(|b| b.outcome.is_ok()) {
            let _turn = durability.turn();
            sync(wal).map_err(|e| format!("{BROKEN} ({e})"))
        } else {
            Ok(())
        };
        match &synced {
            Ok(()) => durability.advance(last),
            Err(e) => {
                if !durability.is_broken() {
                    tracing::error!(error = %e, "syncing the SQLite log failed; the store stops");
                }
                durability.break_for_good();
            }
        }
        for batch in group {
            let outcome = batch.outcome.and_then(|()| synced.clone());
            for op in batch.ops {
                op.answer(outcome.clone());
            }
        }
    }
    // The writer has gone. Had it begun a commit it never handed over (it cannot, short of a
    // panic outside any write), a read waiting for that commit must not wait forever.
    if durability
        .synced
        .borrow()
        .is_some_and(|n| n < durability.visible())
    {
        durability.break_for_good();
    }
}

/// Flushes the WAL file to disk. Opened afresh each time (a few microseconds beside the flush),
/// so the sync always reaches the file SQLite writes, whatever happened to an older handle.
fn sync(wal: &std::path::Path) -> std::result::Result<(), String> {
    std::fs::File::open(wal)
        .and_then(|file| file.sync_data())
        .map_err(|e| format!("cannot sync {}: {e}", wal.display()))
}
