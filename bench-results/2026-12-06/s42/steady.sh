#!/bin/bash
# steady.sh ROUNDS: alternating 4-minute `steady` runs at 2,000 jobs/s on SQLite: nothing removed
# (retention 30d) with this session's binary (/tmp/ov-new), and removing (retention 1m) with the
# last session's (/tmp/ov-base) and this session's.
for i in $(seq 1 $1); do
  /tmp/ov-new bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 30d --output json 2>/dev/null > steady-keep-new-$i.json
  /tmp/ov-base bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-remove-base-$i.json
  /tmp/ov-new bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-remove-new-$i.json
done
echo done > steady.done
