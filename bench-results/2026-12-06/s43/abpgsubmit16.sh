#!/bin/bash
# abpgsubmit16.sh ROUNDS JOBS ARM...: PostgreSQL `submit` with 16 clients (single POSTs, then batches of 1,000),
# a fresh database per run, arms (binaries /tmp/ov-ARM) alternating.
n=$1; jobs=$2; shift 2
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario submit --jobs "$jobs" 2>/dev/null | grep -E "^submit(_batch)? " | sed "s/^/$arm $i /"
 done
done
