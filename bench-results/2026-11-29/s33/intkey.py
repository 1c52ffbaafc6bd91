# intkey.py: prices an integer step key on SQLite (one B-tree per step row) against the
# current (job_id TEXT, idx) primary key with its automatic index. Python's sqlite3, executemany
# in batches of 1000 per transaction, WAL, synchronous=OFF; 100,000 one-step jobs inserted, then
# each step claimed and finished (two updates of the columns a claim and a report change).
import sqlite3, time, uuid, os, sys, re
schema = open('/work/main/crates/store/schema/sqlite.sql').read()
steps_ddl = re.search(r'CREATE TABLE "steps" \((.*?)\n\);', schema, re.S).group(1)
idx_ddl = [m for m in re.findall(r'CREATE INDEX steps_[^;]*;', schema, re.S)]
def run(mode, n=100000, batch=1000):
    p = f'/tmp/exp/{mode}.db'
    for s in ('', '-wal', '-shm'):
        try: os.remove(p + s)
        except FileNotFoundError: pass
    c = sqlite3.connect(p, isolation_level=None)
    c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=OFF')
    cols = steps_ddl
    if mode == 'int':
        cols = 'k INTEGER PRIMARY KEY,\n' + cols.replace('PRIMARY KEY (job_id, idx)', 'CHECK (idx >= 0)')
    c.execute(f'CREATE TABLE steps ({cols})')
    for d in idx_ddl: c.execute(d)
    ids = [str(uuid.UUID(int=((time.time_ns()//1000000)<<80) | (0x7<<76) | (i<<16))) for i in range(n)]
    keycols = '(k, job_id, idx,' if mode == 'int' else '(job_id, idx,'
    keyvals = '(?, ?, 0,' if mode == 'int' else '(?, 0,'
    ins = f"INSERT INTO steps {keycols} name, agent, payload, depends_on, timeout_ms, max_attempts, backoff_initial_ms, backoff_factor, backoff_max_ms, state, attempt, failures, created_at, priority, claim_agent, claim_rank, next_attempt_at) VALUES {keyvals} 's', 'a', '{{\"n\":1}}', '[]', 30000, 3, 1000, 2.0, 60000, 'ready', 0, 0, 1, 0, 'a', ?, 0)"
    where = 'k = ?' if mode == 'int' else 'job_id = ? AND idx = 0'
    claim = f"UPDATE steps SET state='running', attempt=1, claim_agent=NULL, claim_rank=NULL, lease_agent='a', lease_id=?, worker='w', started_at=2, lease_expires_at=5 WHERE {where}"
    done = f"UPDATE steps SET state='succeeded', finished_at=3, lease_expires_at=NULL, result='{{\"ok\":true}}' WHERE {where}"
    key = (lambda i: (i << 8,)) if mode == 'int' else (lambda i: (ids[i],))
    t0 = time.perf_counter()
    for b in range(0, n, batch):
        c.execute('BEGIN')
        if mode == 'int':
            c.executemany(ins, [(i << 8, ids[i], i) for i in range(b, min(n, b + batch))])
        else:
            c.executemany(ins, [(ids[i], i) for i in range(b, min(n, b + batch))])
        c.execute('COMMIT')
    t1 = time.perf_counter()
    for b in range(0, n, batch):
        c.execute('BEGIN')
        c.executemany(claim, [(str(uuid.UUID(int=i + 1)),) + key(i) for i in range(b, min(n, b + batch))])
        c.execute('COMMIT')
    t2 = time.perf_counter()
    for b in range(0, n, batch):
        c.execute('BEGIN')
        c.executemany(done, [key(i) for i in range(b, min(n, b + batch))])
        c.execute('COMMIT')
    t3 = time.perf_counter()
    size = os.path.getsize(p) + os.path.getsize(p + '-wal')
    print(mode, 'insert %.2fs' % (t1 - t0), 'claim %.2fs' % (t2 - t1), 'finish %.2fs' % (t3 - t2), 'bytes %.1fMB' % (size / 1e6), flush=True)
for m in sys.argv[1:]:
    run(m)
