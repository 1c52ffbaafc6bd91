import sqlite3, uuid, os, time, random, struct, sys
def v7(ms):
    b=bytearray(uuid.uuid4().bytes); b[0:6]=ms.to_bytes(6,'big'); b[6]=(b[6]&0x0f)|0x70
    return str(uuid.UUID(bytes=bytes(b)))
def run(kind, base=1_000_000, add=50_000, per_commit=20):
    p='/tmp/lk-%s.db'%kind
    for s in ('','-wal','-shm'):
        if os.path.exists(p+s): os.remove(p+s)
    c=sqlite3.connect(p, isolation_level=None)
    c.execute('pragma journal_mode=wal'); c.execute('pragma synchronous=normal'); c.execute('pragma wal_autocheckpoint=0')
    c.execute('create table leases(lease_id text primary key, job_id text not null, step int, attempt int, worker text, leased_at int) without rowid')
    ms=1_700_000_000_000
    gen=(lambda i: v7(ms+i//2)) if kind=='v7' else (lambda i: str(uuid.uuid4()))
    c.execute('begin')
    for i in range(base):
        c.execute('insert into leases values (?,?,?,?,?,?)',(gen(i), str(uuid.uuid4()),0,1,'worker-1',ms+i))
    c.execute('commit'); c.execute('pragma wal_checkpoint(truncate)')
    t=time.time()
    for j in range(add//per_commit):
        c.execute('begin')
        for k in range(per_commit):
            i=base+j*per_commit+k
            c.execute('insert into leases values (?,?,?,?,?,?)',(gen(i), str(uuid.uuid4()),0,1,'worker-1',ms+i))
        c.execute('commit')
    el=time.time()-t
    wal=os.path.getsize(p+'-wal')
    print(kind, 'insert %d rows in commits of %d: %.2f s, WAL %.1f MB = %.1f pages per commit'%(add, per_commit, el, wal/1e6, wal/4120/(add/per_commit)))
for k in sys.argv[1:]: run(k)
