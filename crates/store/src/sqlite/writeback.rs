//! Handing the log's pages to the disk ahead of the next sync (Linux).
//!
//! A removal write commits a few dozen pages that no claim asked for. Left dirty in the page
//! cache, they are written by whichever sync of the log comes next, and every caller waiting for
//! that sync waits for them too. `sync_file_range(SYNC_FILE_RANGE_WRITE)` starts writing them
//! at once without waiting for the disk, so by the next sync they are usually written. It makes
//! nothing durable (no disk cache is flushed, no metadata written): durability stays with the
//! syncer's `fdatasync`. On other systems this does nothing.

use std::path::Path;

/// Starts the writeback of every dirty page of the file at `path`, without waiting for it.
#[cfg(target_os = "linux")]
pub(super) fn start(path: &Path) {
    use std::os::fd::AsRawFd;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(error = %e, path = %path.display(), "cannot open the log to write it back");
            return;
        }
    };
    // SAFETY: the descriptor belongs to `file`, open for the whole call, and the call touches no
    // memory of this process.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::debug!(error = %e, path = %path.display(), "starting the log's writeback failed");
    }
}

/// Starts the writeback of the file at `path`: nothing to do on this system.
#[cfg(not(target_os = "linux"))]
pub(super) fn start(_path: &Path) {}
