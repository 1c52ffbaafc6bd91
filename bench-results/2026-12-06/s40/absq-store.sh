#!/bin/bash
# absq-store.sh ROUNDS ARM...: SQLite `store` scenario (store_submit, store_drain), 100,000
# jobs, a fresh temp file per run, arms (binaries /tmp/ov-ARM) alternating.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  /tmp/ov-$arm bench --scenario store --jobs 100000 2>/dev/null | grep -E "^store_[a-z]+ " | sed "s/^/$arm $i /"
 done
done
