#!/bin/bash
psql -q -h 127.0.0.1 -p 5433 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null 2>&1
(${BIN:-/tmp/bin/seq} bench --clients 64 --scenario drain --jobs 60000 $EXTRA --db postgres://postgres@127.0.0.1:5433/overseer_bench --output json 2>/dev/null | cut -c1-150 > /tmp/exp/waits-run.txt) &
sleep 5
python3 - <<'PY'
import subprocess, time, collections
q = "select coalesce(wait_event_type,'CPU')||':'||coalesce(wait_event,''), state, count(*) from pg_stat_activity where datname='overseer_bench' and backend_type='client backend' group by 1,2"
p = subprocess.Popen(['psql','-h','127.0.0.1','-p','5433','-U','postgres','-d','postgres','-Atq','-F','|'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
c = collections.Counter(); n = 0
t0 = time.time()
while time.time() - t0 < 4:
    p.stdin.write(q + ";\nselect 'END';\n"); p.stdin.flush()
    while True:
        l = p.stdout.readline().strip()
        if l == 'END': break
        f = l.split('|'); c[(f[0], f[1])] += int(f[2])
    n += 1
    time.sleep(0.01)
print('samples', n)
for k, v in c.most_common(14): print('%6.2f' % (v / n), k)
PY
wait
cat /tmp/exp/waits-run.txt
