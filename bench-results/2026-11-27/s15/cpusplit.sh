#!/bin/bash
# cpusplit.sh BINARY RETENTION: 3-min steady run; CPU per thread kind (server) and of the bench, 60 s → 170 s
b=$1; ret=$2
$b bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $ret --output json > cpu-$ret.json 2>/dev/null &
bp=$!
snap() { p=$(pgrep -f "server --db sqlite:///tmp/overseer-bench-steady" | head -1)
  for t in /proc/$p/task/*; do echo "srv-$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done
  for t in /proc/$bp/task/*; do echo "bench-$(cat $t/comm) $(awk '{print $14+$15}' $t/stat)"; done
  awk '/^cpu /{print "machine", $2+$3+$4+$7+$8}' /proc/stat; }
sleep 60; snap > /tmp/s15/snap1; sleep 110; snap > /tmp/s15/snap2
python3 - <<'PY'
from collections import defaultdict
def load(f):
    d=defaultdict(int)
    for l in open(f):
        k,v=l.split(); d[k]+=int(v)
    return d
a=load('/tmp/s15/snap1'); b=load('/tmp/s15/snap2')
for k in sorted(b): print('%-28s %5.1f %%' % (k, (b[k]-a.get(k,0))/110))
PY
wait $bp
