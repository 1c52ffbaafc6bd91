# stmtcost.py SRC: deletes 4,096 finished jobs from a copy of SRC, 64 jobs per transaction, with the
# dependent rows deleted one job per statement (before) or four jobs per statement (after);
# prints the time per job (best of 3; Python's sqlite3 module, so the statement overhead the two
# shapes differ by is what shows)
import sqlite3, shutil, os, sys, time
src = sys.argv[1]
PIECE = "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished WHERE state = 'succeeded' AND finished_at IS NOT NULL AND retention_ms IS NULL AND finished_at <= 99999999999999 LIMIT 4) AND state IN ('succeeded','failed','cancelled') RETURNING id"
TABLES = ('steps', 'job_labels', 'events', 'leases')
def run(shape):
    dst = '/tmp/d1/sc.db'
    for ext in ('', '-wal', '-shm'):
        if os.path.exists(dst + ext): os.unlink(dst + ext)
    shutil.copy(src, dst)
    c = sqlite3.connect(dst, isolation_level=None, cached_statements=64)
    c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0'); c.execute('PRAGMA cache_size=-16384'); c.execute('PRAGMA synchronous=OFF')
    n = 0; t = time.perf_counter()
    while n < 4096:
        c.execute('BEGIN IMMEDIATE')
        for _ in range(16):
            ids = [r[0] for r in c.execute(PIECE)]
            if shape == 'before':
                for i in ids:
                    for tbl in TABLES: c.execute(f'DELETE FROM {tbl} WHERE job_id = ?', (i,))
                    c.execute('DELETE FROM deliveries WHERE job_id = ? AND (dead <> 0 OR delivered_at IS NOT NULL)', (i,))
            else:
                pad = (ids + [None] * 4)[:4]
                for tbl in TABLES: c.execute(f'DELETE FROM {tbl} WHERE job_id IN (?, ?, ?, ?)', pad)
                c.execute('DELETE FROM deliveries WHERE job_id IN (?, ?, ?, ?) AND (dead <> 0 OR delivered_at IS NOT NULL)', pad)
            n += len(ids)
        c.execute('COMMIT')
    dt = time.perf_counter() - t
    assert c.execute('SELECT COUNT(*) FROM events WHERE job_id NOT IN (SELECT id FROM jobs)').fetchone()[0] == 0
    c.close()
    return dt / n * 1e6
for shape in ('before', 'after'):
    print(shape, 'us per job removed: %.1f' % min(run(shape) for _ in range(3)))
