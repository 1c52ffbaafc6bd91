#!/bin/bash
# price-index.sh ROUNDS INDEX: the 40,000-job drain on a database migrated first (a 10-job
# drain), with and without INDEX dropped, alternating (/tmp/ov-new).
n=$1; idx=$2
for i in $(seq 1 "$n"); do
 for arm in keep drop; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-new bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain --jobs 10 >/dev/null 2>&1
  [ $arm = drop ] && psql -q -h 127.0.0.1 -U postgres -d ovab -c "DROP INDEX $idx" >/dev/null
  psql -q -h 127.0.0.1 -U postgres -d ovab -c "VACUUM ANALYZE" >/dev/null 2>&1
  /tmp/ov-new bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain 2>/dev/null | grep -E "^drain " | sed "s/^/$arm $i /"
 done
done
