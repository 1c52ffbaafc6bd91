# rmcost.py SRC...: removes 4,096 finished jobs from a copy of each drained store SRC, 16
# pieces of 4 jobs per transaction, dependent rows four jobs per statement (the shape of
# `sqlite/removal.rs`); prints, per store, history rows per job, the time per job removed (best
# of 3; Python's sqlite3) and the log bytes written per job removed.
import sqlite3, shutil, os, sys, time
PIECE = "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished WHERE state = 'succeeded' AND finished_at IS NOT NULL AND retention_ms IS NULL AND finished_at <= 99999999999999 LIMIT 4) AND state IN ('succeeded','failed','cancelled') RETURNING id"
TABLES = ('steps', 'job_labels', 'events', 'leases')
def run(src):
    dst = '/tmp/d1/rc.db'
    for ext in ('', '-wal', '-shm'):
        if os.path.exists(dst + ext): os.unlink(dst + ext)
    shutil.copy(src, dst)
    c = sqlite3.connect(dst, isolation_level=None, cached_statements=64)
    c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0'); c.execute('PRAGMA cache_size=-16384'); c.execute('PRAGMA synchronous=OFF')
    rows = c.execute('SELECT (SELECT COUNT(*) FROM events) * 1.0 / COUNT(*) FROM jobs').fetchone()[0]
    n = 0; t = time.perf_counter()
    while n < 4096:
        c.execute('BEGIN IMMEDIATE')
        for _ in range(16):
            ids = [r[0] for r in c.execute(PIECE)]
            pad = (ids + [None] * 4)[:4]
            for tbl in TABLES: c.execute(f'DELETE FROM {tbl} WHERE job_id IN (?, ?, ?, ?)', pad)
            c.execute('DELETE FROM deliveries WHERE job_id IN (?, ?, ?, ?) AND (dead <> 0 OR delivered_at IS NOT NULL)', pad)
            n += len(ids)
        c.execute('COMMIT')
    dt = time.perf_counter() - t
    wal = os.path.getsize(dst + '-wal')
    c.close()
    return rows, dt / n * 1e6, wal / n
for src in sys.argv[1:]:
    res = [run(src) for _ in range(3)]
    print(src, 'history rows per job %.2f' % res[0][0], 'us per job removed: %.1f' % min(r[1] for r in res), 'log bytes per job removed: %.0f' % res[0][2])
