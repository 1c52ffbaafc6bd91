# multirow.py: inserts N jobs' rows (job row + one step row, copied from a drained store with new
# ids) into a fresh database with the store's schema, 1,000 jobs per transaction, either one
# statement per row (executemany: one prepared statement, bind/step/reset per row) or multi-row
# INSERTs of K rows; prints µs per job (best of 3).
import sqlite3, os, sys, time, uuid
src = '/tmp/d1/drained.db'
s = sqlite3.connect(src)
jobcols = [r[1] for r in s.execute('PRAGMA table_info(jobs)')]
stepcols = [r[1] for r in s.execute('PRAGMA table_info(steps)')]
job = list(s.execute('SELECT * FROM jobs LIMIT 1').fetchone())
step = list(s.execute('SELECT * FROM steps LIMIT 1').fetchone())
schema = open('/tmp/exp/schema.sql').read()
N = 40000
def rows():
    js, ss = [], []
    for i in range(N):
        jid = str(uuid.uuid7()) if hasattr(uuid, 'uuid7') else str(uuid.UUID(int=(int(time.time()*1000) << 80) | i))
        j = list(job); j[jobcols.index('id')] = jid; j[jobcols.index('seq')] = i + 1
        st = list(step); st[stepcols.index('job_id')] = jid
        js.append(tuple(j)); ss.append(tuple(st))
    return js, ss
JS, SS = rows()
def run(k):
    db = '/tmp/d1/mr.db'
    for ext in ('', '-wal', '-shm'):
        if os.path.exists(db + ext): os.unlink(db + ext)
    c = sqlite3.connect(db, isolation_level=None, cached_statements=64)
    c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=NORMAL'); c.execute('PRAGMA temp_store=MEMORY'); c.execute('PRAGMA cache_size=-16384')
    c.executescript(schema)
    def ins(table, cols, rows, k):
        one = '(' + ','.join('?' * len(cols)) + ')'
        if k == 1:
            c.executemany(f'INSERT INTO {table} ({",".join(cols)}) VALUES {one}', rows)
        else:
            for i in range(0, len(rows), k):
                chunk = rows[i:i + k]
                sql = f'INSERT INTO {table} ({",".join(cols)}) VALUES ' + ','.join([one] * len(chunk))
                c.execute(sql, [v for r in chunk for v in r])
    t = time.perf_counter()
    for b in range(0, N, 1000):
        c.execute('BEGIN IMMEDIATE')
        ins('jobs', jobcols, JS[b:b + 1000], k)
        ins('steps', stepcols, SS[b:b + 1000], k)
        c.execute('COMMIT')
    dt = time.perf_counter() - t
    c.close()
    return dt / N * 1e6
for k in (1, 8, 32, 1, 8, 32):
    print('rows per statement', k, 'us per job %.2f' % min(run(k) for _ in range(3)))
