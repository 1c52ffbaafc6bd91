#!/bin/bash
# absqdrain.sh ROUNDS JOBS ARM...: SQLite `drain` over HTTP, a fresh temp file per run, arms
# (binaries /tmp/ov-ARM) alternating.
n=$1; jobs=$2; shift 2
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  /tmp/ov-$arm bench --scenario drain --jobs "$jobs" 2>/dev/null | grep -E "^drain " | sed "s/^/$arm $i /"
 done
done
