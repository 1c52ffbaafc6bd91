#!/bin/bash
# steady.sh binary: alternating 4-minute steady runs at 2,000 jobs/s, nothing removed (30d) and removing (1m)
b=$1
for i in ${PAIRS:-1 2}; do
  for r in 30d 1m; do
    $b bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention $r --output json 2>/dev/null > steady-$r-$i.json
  done
done
echo done > steady.done
