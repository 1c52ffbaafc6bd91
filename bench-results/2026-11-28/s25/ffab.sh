#!/bin/bash
# ffab.sh runs label:SQL ... : drain on fresh 5432 databases; SQL applied after migrating (empty = none)
runs=$1; shift
url=postgres://postgres@127.0.0.1/overseer_bench
B=${BIN:-/tmp/bin/base}
for i in $(seq 1 $runs); do
  for ls in "$@"; do
    l=${ls%%:*}; sql=${ls#*:}
    psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' 2>/dev/null >/dev/null
    if [ -n "$sql" ]; then
      rm -f /tmp/s25/ready; $B server --db $url --listen 127.0.0.1:0 --ready-file /tmp/s25/ready >/dev/null 2>&1 & pid=$!
      while [ ! -s /tmp/s25/ready ]; do sleep 0.2; done; kill $pid; wait $pid 2>/dev/null
      psql -q -h 127.0.0.1 -U postgres -d overseer_bench -c "$sql" >/dev/null
    fi
    c0=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    out=$($B bench --clients 64 --scenario drain ${EXTRA} --db $url --output json 2>/dev/null)
    c1=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    echo "$l $(echo "$out" | python3 -c "import sys,json; r=json.loads(sys.stdin.read().splitlines()[-1]); print('steps_per_s=%.0f'%r['steps_per_s'])") cpu_s=$(( (c1-c0)/100 ))"
  done
done
