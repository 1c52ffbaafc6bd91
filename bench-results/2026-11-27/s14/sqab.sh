#!/bin/bash
# sqab.sh scenario runs label:binary ... (EXTRA env for args): SQLite runs, alternating binaries
sc=$1; runs=$2; shift 2
for i in $(seq 1 $runs); do
  for lb in "$@"; do
    l=${lb%%:*}; b=${lb#*:}
    c0=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    out=$($b bench --clients 64 --scenario $sc $EXTRA --output json 2>/dev/null)
    c1=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    echo "$out" >> /tmp/s14/sq-$sc-$l.json
    echo "$out" | python3 -c "
import sys,json
for line in sys.stdin:
    line=line.strip()
    if not line.startswith('{'): continue
    r=json.loads(line)
    print('$l', r.get('scenario'), 'per_s=%s'%r.get('per_s'), 'steps_per_s=%s'%r.get('steps_per_s'), 'p50=%s p99=%s'%(r.get('p50_ms'),r.get('p99_ms')), 'cpu_s=%.1f'%(($c1-$c0)/100))
"
  done
done
