#!/bin/bash
# pgfull.sh ROUNDS ARM...: the default benchmark on a fresh PostgreSQL database, arms alternating
# (/tmp/ov-ARM), one JSON per run: pg-ARM-ROUND.json.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null 2>&1
  /tmp/ov-$arm bench --clients 64 --db postgres://postgres@127.0.0.1:5432/overseer_bench --output json 2>/dev/null > pg-$arm-$i.json
 done
done
echo done > pgfull.done
