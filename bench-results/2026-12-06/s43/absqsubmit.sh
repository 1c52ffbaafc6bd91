#!/bin/bash
# absqsubmit.sh ROUNDS JOBS CLIENTS ARM...: SQLite `submit` (single POSTs, then batches of 1,000),
# a fresh temp file per run, arms (binaries /tmp/ov-ARM) alternating.
n=$1; jobs=$2; clients=$3; shift 3
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  /tmp/ov-$arm bench --scenario submit --clients "$clients" --jobs "$jobs" 2>/dev/null | grep -E "^submit(_batch)? " | sed "s/^/$arm $i /"
 done
done
