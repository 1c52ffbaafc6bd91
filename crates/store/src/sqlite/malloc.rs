//! SQLite's memory allocations served by mimalloc, the allocator the rest of the server uses.
//!
//! SQLite calls the C library's `malloc` for its statements, records and cursors by default.
//! In a writer profile while finished jobs were being removed, glibc's allocator took about
//! 5 % of the writer thread (`unlink_chunk`, `_int_malloc`, `_int_free`): the many small
//! allocations of each statement step, freed again moments later, are what mimalloc's per-thread
//! free lists serve without consolidating chunks.

use std::os::raw::{c_int, c_void};

use rusqlite::ffi;

extern "C" {
    // In mimalloc's extended API, linked with `libmimalloc-sys`.
    fn mi_usable_size(p: *const c_void) -> usize;
    fn mi_good_size(size: usize) -> usize;
    #[cfg(feature = "testing")]
    fn mi_is_in_heap_region(p: *const c_void) -> bool;
}

/// Installs the allocator. Like the page cache, only before SQLite is first initialised in
/// this process; returns whether it is in place.
pub(super) fn install() -> bool {
    let methods = ffi::sqlite3_mem_methods {
        xMalloc: Some(malloc),
        xFree: Some(free),
        xRealloc: Some(realloc),
        xSize: Some(size),
        xRoundup: Some(roundup),
        xInit: Some(init),
        xShutdown: Some(shutdown),
        pAppData: std::ptr::null_mut(),
    };
    // SAFETY: SQLite copies the table; the call changes nothing (SQLITE_MISUSE) once SQLite is
    // initialised.
    unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &methods) == ffi::SQLITE_OK }
}

/// Whether memory SQLite allocates now comes from mimalloc's heap.
#[cfg(feature = "testing")]
pub(super) fn in_use() -> bool {
    // SAFETY: a block from `sqlite3_malloc` (null checked) is handed back with `sqlite3_free`.
    unsafe {
        let p = ffi::sqlite3_malloc(64);
        if p.is_null() {
            return false;
        }
        let ours = mi_is_in_heap_region(p);
        ffi::sqlite3_free(p);
        ours
    }
}

/// A size SQLite asked for, as mimalloc takes it; SQLite never asks for 0 or less.
fn bytes(n: c_int) -> usize {
    usize::try_from(n).unwrap_or(0).max(1)
}

unsafe extern "C" fn malloc(n: c_int) -> *mut c_void {
    libmimalloc_sys::mi_malloc(bytes(n))
}

unsafe extern "C" fn free(p: *mut c_void) {
    libmimalloc_sys::mi_free(p);
}

unsafe extern "C" fn realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    libmimalloc_sys::mi_realloc(p, bytes(n))
}

unsafe extern "C" fn size(p: *mut c_void) -> c_int {
    c_int::try_from(mi_usable_size(p)).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn roundup(n: c_int) -> c_int {
    c_int::try_from(mi_good_size(bytes(n))).unwrap_or(n)
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn shutdown(_: *mut c_void) {}
