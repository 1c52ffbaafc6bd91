#!/bin/bash
# samples the oldest snapshots on the 5433 instance every ~20 ms while a drain runs
psql -q -h 127.0.0.1 -p 5433 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null 2>&1
(/tmp/bin/new bench --clients 64 --scenario drain --jobs 40000 --db postgres://postgres@127.0.0.1:5433/overseer_bench --output json 2>/dev/null | cut -c1-150 > /tmp/exp/xmin-run.txt) &
sleep 1.5
python3 - <<'PY'
import subprocess, time
q = """select coalesce(backend_type,''), coalesce(state,''), round(extract(epoch from (clock_timestamp()-xact_start))*1000)::int, left(regexp_replace(query,'\\s+',' ','g'),60) from pg_stat_activity where datname='overseer_bench' and backend_xmin is not null and xact_start is not null order by xact_start limit 1"""
p = subprocess.Popen(['psql','-h','127.0.0.1','-p','5433','-U','postgres','-d','postgres','-Atq','-F','|'], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
out = []
t0 = time.time()
while time.time() - t0 < 5:
    p.stdin.write(q + ";\nselect 'END';\n"); p.stdin.flush()
    lines = []
    while True:
        l = p.stdout.readline().strip()
        if l == 'END': break
        lines.append(l)
    out.append(lines[0] if lines else '')
    time.sleep(0.02)
p.stdin.close()
ages = []
import collections
c = collections.Counter()
for l in out:
    if not l: continue
    f = l.split('|')
    ages.append(int(f[2])); c[f[3]] += 1 if int(f[2]) > 20 else 0
ages.sort()
print('samples', len(out), 'with xmin', len(ages))
if ages:
    print('oldest xact age ms p50/p90/p99/max', ages[len(ages)//2], ages[int(len(ages)*.9)], ages[int(len(ages)*.99)], ages[-1])
for k, v in c.most_common(8):
    if v: print(v, k)
PY
wait
cat /tmp/exp/xmin-run.txt
