//! SQLite's own page cache, wrapped so that a commit does not scan the whole cache after a
//! B-tree balance swapped two page numbers.
//!
//! When a balance takes pages from the freelist out of order, SQLite swaps their numbers so the
//! new pages stay in ascending order, and it parks one of them under a temporary number on the
//! way: the page that the pending byte lives on (page 262,145 with 4 KiB pages), which is never
//! a real page of the database. The default cache remembers the largest number it has ever seen
//! and, at the end of every transaction, removes every page past the end of the file when that
//! largest number lies past it. After a swap it does, so the next commit walks every slot of the
//! cache (16 MiB on the writer) to find pages that are not there: 6 % of the writer's time while
//! finished jobs are removed, whose freed pages make such swaps common.
//!
//! This wrapper keeps, per cache, an upper bound of the page numbers the cache can hold that
//! leaves out the temporary number, and passes a truncation on only when a page at or past the
//! limit may exist. Every page enters a cache by a fetch that may create it or by a rekey, so
//! the bound is never too small: the only pages it leaves out are those under the temporary
//! number, and a truncation while one is parked there goes through.

use std::os::raw::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

/// SQLite's table of the default cache's methods (SQLite copies what it is given). Only its
/// `pArg` is a pointer, null for the default cache (no shared state behind it), and the table
/// is never changed after it is set, so any thread may read it.
struct Methods(ffi::sqlite3_pcache_methods2);
// SAFETY: see above; SQLite itself reads these tables from every thread.
unsafe impl Sync for Methods {}
unsafe impl Send for Methods {}

/// SQLite's default page cache, taken before the wrapper replaced it.
static INNER: OnceLock<Methods> = OnceLock::new();

/// Truncations skipped that the default cache would have run: each a walk of its whole table
/// when the temporary number was the largest it had seen. Read by tests.
pub static SCANS_AVOIDED: AtomicU64 = AtomicU64::new(0);

/// The byte offset SQLite keeps free for its file locks; its page is never part of a database.
const PENDING_BYTE: u32 = 0x4000_0000;

/// One cache: the default cache's handle and what the wrapper knows of its page numbers.
struct Cache {
    inner: *mut ffi::sqlite3_pcache,
    /// No page numbered above this is in the cache, the temporary number aside.
    max: u32,
    /// The temporary number used while a balance swaps two pages.
    temporary: u32,
    /// Whether a page is parked under `temporary` now.
    parked: bool,
    /// The largest number the default cache has seen since it last truncated, as it counts.
    seen: u32,
}

/// Installs the wrapper. It must run before SQLite is first initialised in this process (the
/// first connection opened); later it cannot, and SQLite keeps its default cache. Returns
/// whether the wrapper is in place.
pub(super) fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        let wrapper = ffi::sqlite3_pcache_methods2 {
            iVersion: 1,
            pArg: std::ptr::null_mut(),
            xInit: Some(init),
            xShutdown: Some(shutdown),
            xCreate: Some(create),
            xCachesize: Some(cachesize),
            xPagecount: Some(pagecount),
            xFetch: Some(fetch),
            xUnpin: Some(unpin),
            xRekey: Some(rekey),
            xTruncate: Some(truncate),
            xDestroy: Some(destroy),
            xShrink: Some(shrink),
        };
        let mut default = std::mem::MaybeUninit::<ffi::sqlite3_pcache_methods2>::zeroed();
        // SAFETY: GETPCACHE2 writes one `sqlite3_pcache_methods2` (installing the default cache
        // first when none is set); both calls only change configuration and fail with
        // SQLITE_MISUSE, changing nothing, once SQLite is initialised.
        unsafe {
            if ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, default.as_mut_ptr()) != 0 {
                return false;
            }
            let default = default.assume_init();
            if default.xFetch.is_none() || INNER.set(Methods(default)).is_err() {
                return false;
            }
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, &wrapper) == ffi::SQLITE_OK
        }
    })
}

fn inner() -> &'static ffi::sqlite3_pcache_methods2 {
    &INNER
        .get()
        .expect("the wrapper is installed only after INNER is set")
        .0
}

/// # Safety
/// `p` is a handle [`create`] returned and [`destroy`] has not freed; SQLite calls a cache's
/// methods from one thread at a time.
unsafe fn cache<'a>(p: *mut ffi::sqlite3_pcache) -> &'a mut Cache {
    &mut *(p as *mut Cache)
}

unsafe extern "C" fn init(_arg: *mut c_void) -> c_int {
    let m = inner();
    m.xInit.map_or(ffi::SQLITE_OK, |f| f(m.pArg))
}

unsafe extern "C" fn shutdown(_arg: *mut c_void) {
    let m = inner();
    if let Some(f) = m.xShutdown {
        f(m.pArg);
    }
}

unsafe extern "C" fn create(
    sz_page: c_int,
    sz_extra: c_int,
    purgeable: c_int,
) -> *mut ffi::sqlite3_pcache {
    let inner = (inner().xCreate.expect("xCreate"))(sz_page, sz_extra, purgeable);
    if inner.is_null() {
        return inner;
    }
    let page_size = u32::try_from(sz_page).unwrap_or(1).max(1);
    let cache = Box::new(Cache {
        inner,
        max: 0,
        temporary: PENDING_BYTE / page_size + 1,
        parked: false,
        seen: 0,
    });
    Box::into_raw(cache) as *mut ffi::sqlite3_pcache
}

unsafe extern "C" fn cachesize(p: *mut ffi::sqlite3_pcache, n: c_int) {
    (inner().xCachesize.expect("xCachesize"))(cache(p).inner, n);
}

unsafe extern "C" fn pagecount(p: *mut ffi::sqlite3_pcache) -> c_int {
    (inner().xPagecount.expect("xPagecount"))(cache(p).inner)
}

unsafe extern "C" fn fetch(
    p: *mut ffi::sqlite3_pcache,
    key: c_uint,
    create: c_int,
) -> *mut ffi::sqlite3_pcache_page {
    let c = cache(p);
    if create != 0 {
        c.enter(key);
    }
    (inner().xFetch.expect("xFetch"))(c.inner, key, create)
}

unsafe extern "C" fn unpin(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    discard: c_int,
) {
    (inner().xUnpin.expect("xUnpin"))(cache(p).inner, page, discard);
}

unsafe extern "C" fn rekey(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    old: c_uint,
    new: c_uint,
) {
    let c = cache(p);
    c.rekeyed(old, new);
    (inner().xRekey.expect("xRekey"))(c.inner, page, old, new);
}

unsafe extern "C" fn truncate(p: *mut ffi::sqlite3_pcache, limit: c_uint) {
    let c = cache(p);
    if c.may_hold_from(limit) {
        (inner().xTruncate.expect("xTruncate"))(c.inner, limit);
        c.truncated(limit);
    } else if c.seen >= limit {
        SCANS_AVOIDED.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe extern "C" fn destroy(p: *mut ffi::sqlite3_pcache) {
    let c = Box::from_raw(p as *mut Cache);
    (inner().xDestroy.expect("xDestroy"))(c.inner);
}

unsafe extern "C" fn shrink(p: *mut ffi::sqlite3_pcache) {
    if let Some(f) = inner().xShrink {
        f(cache(p).inner);
    }
}

impl Cache {
    /// Notes that a page numbered `key` may now be in the cache.
    fn enter(&mut self, key: u32) {
        self.seen = self.seen.max(key);
        if key == self.temporary {
            self.parked = true;
        } else {
            self.max = self.max.max(key);
        }
    }

    /// Notes that the page numbered `old` is now numbered `new`.
    fn rekeyed(&mut self, old: u32, new: u32) {
        if old == self.temporary {
            self.parked = false;
        }
        self.enter(new);
    }

    /// Whether a page numbered `limit` or above may be in the cache.
    fn may_hold_from(&self, limit: u32) -> bool {
        self.parked || self.max >= limit
    }

    /// After the default cache dropped every page from `limit` on.
    fn truncated(&mut self, limit: u32) {
        self.max = self.max.min(limit.saturating_sub(1));
        if limit <= self.seen {
            self.seen = limit - 1;
        }
        if limit <= self.temporary {
            self.parked = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> Cache {
        Cache {
            inner: std::ptr::null_mut(),
            max: 0,
            temporary: PENDING_BYTE / 4096 + 1,
            parked: false,
            seen: 0,
        }
    }

    // A balance's swap parks a page under the temporary number and takes it back: the commit's
    // truncation at the end of the file then has nothing to remove.
    #[test]
    fn a_swap_through_the_temporary_number_leaves_nothing_to_truncate() {
        let mut c = cache();
        for key in 1..=1_000 {
            c.enter(key);
        }
        let t = c.temporary;
        c.rekeyed(700, t);
        c.rekeyed(20, 700);
        assert!(
            c.may_hold_from(1_001),
            "a page is parked: a truncation must go through"
        );
        c.rekeyed(t, 20);
        assert!(!c.may_hold_from(1_001));
        assert!(c.may_hold_from(1_000));
    }

    // A rolled-back append leaves pages past the old end: they must be removed.
    #[test]
    fn pages_past_the_limit_are_truncated() {
        let mut c = cache();
        for key in 1..=1_010 {
            c.enter(key);
        }
        assert!(c.may_hold_from(1_001));
        c.truncated(1_001);
        assert!(!c.may_hold_from(1_001));
        c.enter(1_001);
        assert!(c.may_hold_from(1_001));
    }
}
