#!/bin/bash
# latency_loaded on PG with pg_stat_activity sampling. BIN, RATE
psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null 2>&1
($BIN bench --clients 64 --scenario latency_loaded --load-rate ${RATE:-2000} $EXTRA --db postgres://postgres@127.0.0.1/overseer_bench --output json 2>/tmp/exp/lw-err.txt | cut -c1-400 > /tmp/exp/lw-run.txt) &
sleep ${DELAY:-4}
python3 - <<'PY'
import subprocess, time, collections
q = "select coalesce(wait_event_type,'CPU')||':'||coalesce(wait_event,''), state, count(*) from pg_stat_activity where datname='overseer_bench' and backend_type='client backend' group by 1,2"
p = subprocess.Popen(['psql','-h','127.0.0.1','-U','postgres','-d','postgres','-Atq','-F','|'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
c = collections.Counter(); n = 0
t0 = time.time()
while time.time() - t0 < 5:
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
c0=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5}' /proc/stat); sleep 3; c1=$(awk '/^cpu /{print $2+$3+$4+$7+$8, $5}' /proc/stat); echo "busy/idle jiffies: $c0 -> $c1"
wait
cat /tmp/exp/lw-run.txt
