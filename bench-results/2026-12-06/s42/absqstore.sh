#!/bin/bash
# absqstore.sh ROUNDS ARM...: SQLite `store` scenario (no HTTP), 100,000 jobs, a fresh temp
# file, arms (binaries /tmp/ov-ARM) alternating; with each run's CPU seconds (user + system).
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  /usr/bin/time -f "cpu %U %S" -o /tmp/absq.time /tmp/ov-$arm bench --scenario store --jobs 100000 2>/dev/null | grep -E "^store_[a-z]+ " | sed "s/^/$arm $i /"
  echo "$arm $i $(cat /tmp/absq.time)"
 done
done
