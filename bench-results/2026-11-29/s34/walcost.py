import sqlite3, shutil, os, sys, time
src = sys.argv[1]
def frames(p):
    try: return max(0, (os.path.getsize(p + '-wal') - 32) // (4096 + 24))
    except FileNotFoundError: return 0
for per_commit in (4, 8, 16, 32, 64, 128):
    dst = '/tmp/d1/wc.db'
    for ext in ('', '-wal', '-shm'):
        if os.path.exists(dst + ext): os.unlink(dst + ext)
    shutil.copy(src, dst)
    c = sqlite3.connect(dst, isolation_level=None)
    c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA wal_autocheckpoint=0'); c.execute('PRAGMA cache_size=-16384')
    c.execute('PRAGMA wal_checkpoint(TRUNCATE)')
    total_jobs = 0; commits = 0; f0 = frames(dst); t = time.perf_counter()
    while total_jobs < 4096:
        c.execute('BEGIN IMMEDIATE')
        done = 0
        while done < per_commit:
            ids = [r[0] for r in c.execute("DELETE FROM jobs WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_finished WHERE state = 'succeeded' AND finished_at IS NOT NULL AND retention_ms IS NULL AND finished_at <= 99999999999999 LIMIT 4) AND state IN ('succeeded','failed','cancelled') RETURNING id")]
            if not ids: break
            pad = (ids + [None] * 4)[:4]
            for tbl in ('steps', 'job_labels', 'events', 'leases'):
                c.execute(f'DELETE FROM {tbl} WHERE job_id IN (?, ?, ?, ?)', pad)
            c.execute('DELETE FROM deliveries WHERE job_id IN (?, ?, ?, ?) AND (dead <> 0 OR delivered_at IS NOT NULL)', pad)
            done += len(ids)
        c.execute('COMMIT'); commits += 1; total_jobs += done
        if done == 0: break
    f1 = frames(dst)
    print(f'{per_commit:4d} jobs/commit: {commits} commits, {(f1-f0)/commits:6.1f} frames/commit, {(f1-f0)*4.1/total_jobs:6.2f} KB WAL per job, {(time.perf_counter()-t)/total_jobs*1e6:.0f} us/job')
    c.close()
