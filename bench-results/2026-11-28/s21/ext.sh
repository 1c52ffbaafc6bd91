#!/bin/bash
# ext.sh label env-for-server store runs: the server in a process of its own (env applied to it
# only), the bench client (default allocator settings) against it; one submit + drain run per call
l=$1; envs=$2; store=$3
if [ "$store" = postgres ]; then
  psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null 2>&1
  db=postgres://postgres@127.0.0.1/overseer_bench
else
  rm -f /tmp/ext.db*; db=sqlite:///tmp/ext.db
fi
rm -f /tmp/ext.addr
env $envs /tmp/bin/hack server --db $db --listen 127.0.0.1:0 --ready-file /tmp/ext.addr --log-format json >/tmp/ext.log 2>&1 &
spid=$!
while [ ! -s /tmp/ext.addr ]; do sleep 0.1; done
addr=$(cat /tmp/ext.addr)
/tmp/bin/hack bench --server http://$addr --clients 64 --scenario submit --scenario drain $EXTRA --output json 2>/dev/null | python3 -c "
import sys,json
for line in sys.stdin:
    if not line.startswith('{'): continue
    r=json.loads(line)
    print('$l', r['scenario'], round(r['per_s']), (r.get('note') or '')[-30:])
"
echo "$l server rss_kb $(grep VmHWM /proc/$spid/status | awk '{print $2}') cpu $(awk '{print ($14+$15)/100}' /proc/$spid/stat)"
kill $spid; wait $spid 2>/dev/null
