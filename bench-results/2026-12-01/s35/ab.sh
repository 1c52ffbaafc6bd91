#!/bin/bash
# ab.sh ROUNDS: alternating 4-minute steady runs at 2,000 jobs/s: nothing removed (30d, new binary),
# removing with the previous code (base), removing with the new code (new)
for i in $(seq ${2:-1} $1); do
  /tmp/overseer-new bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 30d --output json 2>/dev/null > steady-keep-$i.json
  /tmp/overseer-base bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-base-$i.json
  /tmp/overseer-new bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-new-$i.json
done
echo done > ab.done
