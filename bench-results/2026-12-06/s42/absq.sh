#!/bin/bash
# absq.sh ROUNDS ARM...: SQLite `store` and `submit` scenarios, 100,000 jobs, a fresh temp file
# per scenario, arms (binaries /tmp/ov-ARM) alternating.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  /tmp/ov-$arm bench --scenario store --scenario submit --scenario drain --jobs 100000 2>/dev/null | grep -E "^(store_[a-z]+|submit_batch|drain) " | sed "s/^/$arm $i /"
 done
done
