#!/bin/bash
# steady.sh BIN LAST [FIRST]: rounds FIRST..LAST of 4-minute steady runs at 2,000 jobs/s, alternating: nothing removed (30d),
# removing with the default removal batch (1m), removing with writes of at most 8 jobs (1m,
# PRICE_RETENTION_BATCH=8, read by the build of price-retention.diff, never committed)
b=$1
for i in $(seq ${3:-1} ${2:-2}); do
  $b bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 30d --output json 2>/dev/null > steady-keep-$i.json
  $b bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-1m-$i.json
  PRICE_RETENTION_BATCH=8 $b bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > steady-b8-$i.json
done
echo done > steady.done
