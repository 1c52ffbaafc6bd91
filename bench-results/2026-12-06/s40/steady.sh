#!/bin/bash
# steady.sh ROUNDS: alternating 4-minute `steady` runs at 2,000 jobs/s on SQLite with the final
# binary (/tmp/ov-final): nothing removed (retention 30d) and removing (retention 1m).
for i in $(seq 1 $1); do
  /tmp/ov-final bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 30d --output json 2>/dev/null > steady-keep-$i.json
  /tmp/ov-final bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-remove-$i.json
done
echo done > steady.done
