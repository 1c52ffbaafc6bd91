#!/bin/bash
# pgdrop.sh label binary "SQL to run after migrating" jobs
l=$1; b=$2; sql=$3; jobs=${4:-40000}
url=postgres://postgres@127.0.0.1/overseer_bench
psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null
$b bench --clients 64 --scenario drain --jobs 500 --db $url --output json >/dev/null 2>&1
[ -n "$sql" ] && psql -q -h 127.0.0.1 -U postgres -d overseer_bench -c "$sql" >/dev/null
c0=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
out=$($b bench --clients 64 --scenario drain --jobs $jobs $EXTRA --db $url --output json 2>/dev/null | grep '^{')
c1=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
echo "$l $(echo "$out" | python3 -c 'import sys,json; r=json.loads(sys.stdin.readline()); print("steps_per_s=%s"%r.get("steps_per_s"), "per_s=%s"%r.get("per_s"))') cpu_s=$(( (c1-c0)/100 ))"
