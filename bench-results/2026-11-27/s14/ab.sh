#!/bin/bash
# Output folder: $OUT (default /tmp/s14).
# ab.sh sqlite|postgres scenario runs label:binary ... (EXTRA env for more args): alternating runs;
# on postgres a fresh database on 127.0.0.1:5432 per run. Prints rate, p50/p99 and machine CPU-s.
store=$1; sc=$2; runs=$3; shift 3
url=postgres://postgres@127.0.0.1/overseer_bench
for i in $(seq 1 $runs); do
  for lb in "$@"; do
    l=${lb%%:*}; b=${lb#*:}; db=()
    if [ "$store" = postgres ]; then
      psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null
      db=(--db $url)
    fi
    c0=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    out=$($b bench --clients 64 --scenario $sc $EXTRA "${db[@]}" --output json 2>/dev/null)
    c1=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    echo "$out" >> ${OUT:-/tmp/s14}/$store-$sc-$l.json
    echo "$out" | python3 -c "
import sys,json
for line in sys.stdin:
    if not line.startswith('{'): continue
    r=json.loads(line)
    print('$l', r.get('scenario'), 'per_s=%s'%r.get('per_s'), 'steps_per_s=%s'%r.get('steps_per_s'), 'p50=%s p99=%s'%(r.get('p50_ms'),r.get('p99_ms')), 'cpu_s=%.1f'%(($c1-$c0)/100))
"
  done
done
