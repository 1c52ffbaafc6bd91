#!/bin/bash
# synctrace.sh RETENTION LABEL BIN: fsync/fdatasync/nanosleep of the steady server, 100-140 s
ret=$1; l=$2; b=$3
cd /tmp/s13
$b bench --scenario steady --steady-rate 2000 --duration 150s --sample-every 20s --retention $ret --output json > trace-$l.json 2>/dev/null &
sleep 100
pid=$(pgrep -f "$b server" | head -1)
ls -l /proc/$pid/fd 2>/dev/null | grep -E "bench.db" | awk '{print $9, $11}' > trace-$l.fds
perf trace -p $pid -e fdatasync,fsync,clock_nanosleep,nanosleep -o trace-$l.txt -- sleep 40 2>/dev/null
wait
python3 - trace-$l.txt trace-$l.fds $l <<'PY'
import sys,re,collections,statistics as st
fds=dict(l.split() for l in open(sys.argv[2]))
d=collections.defaultdict(list)
for line in open(sys.argv[1]):
    m=re.search(r'\(\s*([\d.]+) ms\): (\S+)/(\d+) (\w+)\((?:fd: (\d+))?',line)
    if not m: continue
    ms,comm,tid,call,fd=m.groups()
    name=fds.get(fd,'') .split('/')[-1] if fd else ''
    d[(call,tid,name)].append(float(ms))
for k,v in sorted(d.items(), key=lambda kv:-sum(kv[1])):
    v.sort()
    print(sys.argv[3], k, 'n',len(v),'sum %.0f ms'%sum(v),'p50 %.2f p99 %.2f max %.2f'%(v[len(v)//2], v[int(len(v)*0.99)], v[-1]))
PY
