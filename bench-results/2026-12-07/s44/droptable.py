# droptable.py: what removing a time range of finished jobs costs the writer if the range is a
# table of its own dropped whole, against deleting the same jobs row by row (the removal's
# shape: pieces of 4 jobs). Tables copied from a drained store's `jobs` and `steps` (schema as
# the store's, WAL, synchronous NORMAL, no auto_vacuum and secure_delete off, as the store (Debian's SQLite turns secure_delete on by default)); prints
# the writer time and log bytes of each way, per job, and the longest single write.
import sqlite3, os, time, sys
src = '/tmp/d1/drained.db'
def fresh(n):
    db = '/tmp/d1/dt.db'
    for ext in ('', '-wal', '-shm'):
        if os.path.exists(db + ext): os.unlink(db + ext)
    c = sqlite3.connect(db, isolation_level=None)
    c.execute('PRAGMA secure_delete=OFF'); c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=NORMAL'); c.execute('PRAGMA cache_size=-16384'); c.execute('PRAGMA wal_autocheckpoint=0')
    c.execute(f"ATTACH '{src}' AS s")
    sj = c.execute("SELECT sql FROM s.sqlite_master WHERE name='jobs'").fetchone()[0]
    ss = c.execute("SELECT sql FROM s.sqlite_master WHERE name='steps'").fetchone()[0]
    for part in ('p0', 'p1'):
        c.execute(sj.replace('CREATE TABLE jobs', f'CREATE TABLE jobs_{part}', 1))
        c.execute(ss.replace('CREATE TABLE "steps"', f'CREATE TABLE steps_{part}', 1).replace('CREATE TABLE IF NOT EXISTS "steps"', f'CREATE TABLE steps_{part}', 1))
        c.execute(f'CREATE INDEX jobs_{part}_fin ON jobs_{part} (state, finished_at, retention_ms) WHERE finished_at IS NOT NULL')
        c.execute(f'CREATE INDEX jobs_{part}_sid ON jobs_{part} (state, id)')
        c.execute(f'CREATE INDEX steps_{part}_lid ON steps_{part} (lease_id) WHERE lease_id IS NOT NULL')
        c.execute(f'INSERT INTO jobs_{part} SELECT * FROM s.jobs LIMIT {n}')
        c.execute(f'INSERT INTO steps_{part} SELECT * FROM s.steps WHERE job_id IN (SELECT id FROM jobs_{part})')
    c.execute('DETACH s')
    c.execute('PRAGMA wal_checkpoint(TRUNCATE)')
    return c, db
def walsize(db): return os.path.getsize(db + '-wal')
for n in (5000, 20000, 40000):
    c, db = fresh(n)
    w0 = walsize(db); t = time.perf_counter()
    c.execute('BEGIN IMMEDIATE'); c.execute('DROP TABLE steps_p0'); c.execute('DROP TABLE jobs_p0'); c.execute('COMMIT')
    drop = time.perf_counter() - t; dw = walsize(db) - w0
    w0 = walsize(db); t = time.perf_counter(); longest = 0; done = 0
    ids = [r[0] for r in c.execute('SELECT id FROM jobs_p1 ORDER BY id')]
    for i in range(0, len(ids), 64):
        t1 = time.perf_counter()
        c.execute('BEGIN IMMEDIATE')
        for j in range(i, min(i + 64, len(ids)), 4):
            pad = (ids[j:j + 4] + [None] * 4)[:4]
            c.execute('DELETE FROM jobs_p1 WHERE id IN (?,?,?,?)', pad)
            c.execute('DELETE FROM steps_p1 WHERE job_id IN (?,?,?,?)', pad)
        c.execute('COMMIT')
        longest = max(longest, time.perf_counter() - t1)
    rows = time.perf_counter() - t; rw = walsize(db) - w0
    print(f'{n} jobs: drop {drop*1e3:.1f} ms in one write ({drop/n*1e6:.2f} us/job, {dw/n:.0f} log bytes/job); '
          f'row deletes {rows*1e3:.1f} ms ({rows/n*1e6:.2f} us/job, {rw/n:.0f} log bytes/job, longest write of 64 jobs {longest*1e3:.2f} ms)')
    c.close()
