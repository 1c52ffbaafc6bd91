import sqlite3, time, uuid, os, sys
schema = open('/work/main/crates/store/schema/sqlite.sql').read()
def run(mode, n=100000, batch=1000):
    p = f'/tmp/exp/{mode}.db'
    for s in ('', '-wal', '-shm'):
        try: os.remove(p + s)
        except FileNotFoundError: pass
    c = sqlite3.connect(p, isolation_level=None)
    c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=OFF'); c.execute('PRAGMA foreign_keys=ON')
    c.executescript(schema)
    ids = [uuid.uuid7() if hasattr(uuid,'uuid7') else uuid.UUID(int=((time.time_ns()//1000000)<<80) | (0x7<<76) | (i<<16)) for i in range(n)]
    key = (lambda u: str(u)) if mode == 'text' else (lambda u: u.bytes)
    t0 = time.perf_counter()
    for b in range(0, n, batch):
        c.execute('BEGIN')
        for u in ids[b:b+batch]:
            k = key(u)
            c.execute("INSERT INTO jobs (id, fingerprint, labels, priority, on_failure, state, desired_state, created_at, updated_at, seq) VALUES (?, 'f', '{}', 0, 'fail', 'running', 'succeeded', 1, 1, 1)", (k,))
            c.execute("INSERT INTO steps (job_id, idx, name, agent, payload, depends_on, timeout_ms, max_attempts, backoff_initial_ms, backoff_factor, backoff_max_ms, state, attempt, failures, created_at, priority, claim_agent, claim_rank, next_attempt_at) VALUES (?, 0, 's', 'a', 'null', '[]', 1, 1, 1, 2.0, 1, 'ready', 0, 0, 1, 0, 'a', 5, 0)", (k,))
            for s in (1, 2, 3):
                c.execute("INSERT INTO events (job_id, seq, at, kind) VALUES (?, ?, 1, 'k')", (k, s))
        c.execute('COMMIT')
    t1 = time.perf_counter()
    # a drain-ish pass: update each step to running then succeeded, add events, per batch
    for b in range(0, n, batch):
        c.execute('BEGIN')
        for u in ids[b:b+batch]:
            k = key(u)
            c.execute("UPDATE steps SET state='running', claim_agent=NULL, lease_agent='a', lease_expires_at=5 WHERE job_id=? AND idx=0", (k,))
            c.execute("INSERT INTO events (job_id, seq, at, kind) VALUES (?, 4, 1, 'k')", (k,))
            c.execute("UPDATE jobs SET last_event_seq=4, updated_at=2 WHERE id=?", (k,))
        c.execute('COMMIT')
    t2 = time.perf_counter()
    size = os.path.getsize(p) + os.path.getsize(p + '-wal')
    print(mode, 'insert %.2fs' % (t1 - t0), 'update %.2fs' % (t2 - t1), 'bytes %.1fMB' % (size / 1e6), flush=True)
for m in sys.argv[1:]:
    run(m)
