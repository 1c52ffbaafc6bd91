#!/bin/bash
# absq-price.sh ROUNDS: SQLite `store` scenario (100,000 jobs, a fresh temp file per run), the
# price build (/tmp/ov-sqprice, price-sqlite-submit-history.diff) with and without OV_PRICE=1.
for i in $(seq 1 "$1"); do
 for arm in with without; do
  if [ $arm = without ]; then export OV_PRICE=1; else unset OV_PRICE; fi
  /tmp/ov-sqprice bench --scenario store --scenario submit --jobs 100000 2>/dev/null | grep -E "^(store_|submit_batch)" | sed "s/^/$arm $i /"
 done
done
