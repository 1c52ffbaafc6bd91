import sqlite3, shutil, os, sys, time
PIECE = "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished WHERE state = 'succeeded' AND finished_at IS NOT NULL AND retention_ms IS NULL AND finished_at <= 99999999999999 LIMIT 4) AND state IN ('succeeded','failed','cancelled') RETURNING id"
ALL = ('steps', 'job_labels', 'events', 'leases')
def run(src, tables, deliveries, piece_only=False):
    dst = '/tmp/d1/rc.db'
    for ext in ('', '-wal', '-shm'):
        if os.path.exists(dst + ext): os.unlink(dst + ext)
    shutil.copy(src, dst)
    c = sqlite3.connect(dst, isolation_level=None, cached_statements=64)
    c.execute('PRAGMA secure_delete=OFF'); c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0'); c.execute('PRAGMA cache_size=-16384'); c.execute('PRAGMA synchronous=OFF')
    c.execute('SELECT COUNT(*) FROM steps').fetchone(); c.execute('SELECT COUNT(*) FROM jobs').fetchone()
    n = 0; t = time.perf_counter()
    while n < 4096:
        c.execute('BEGIN IMMEDIATE')
        for _ in range(16):
            ids = [r[0] for r in c.execute(PIECE)]
            pad = (ids + [None] * 4)[:4]
            for tbl in tables: c.execute(f'DELETE FROM {tbl} WHERE job_id IN (?, ?, ?, ?)', pad)
            if deliveries: c.execute('DELETE FROM deliveries WHERE job_id IN (?, ?, ?, ?) AND (dead <> 0 OR delivered_at IS NOT NULL)', pad)
            n += len(ids)
        c.execute('COMMIT')
    dt = time.perf_counter() - t
    wal = os.path.getsize(dst + '-wal')
    c.close()
    return dt / n * 1e6, wal / n
src = sys.argv[1]
for name, tables, dl in [('all', ALL, True), ('steps-only', ('steps',), False), ('jobs-only', (), False), ('all', ALL, True), ('steps-only', ('steps',), False), ('jobs-only', (), False)]:
    res = [run(src, tables, dl) for _ in range(3)]
    print(name, 'us/job %.1f' % min(r[0] for r in res), 'wal bytes/job %.0f' % res[0][1])
