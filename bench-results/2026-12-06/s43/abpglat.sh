#!/bin/bash
# abpglat.sh ROUNDS ARM...: PostgreSQL `latency` (idle agents), a fresh database per run, arms
# (binaries /tmp/ov-ARM) alternating.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario latency 2>/dev/null | grep -E "^latency " | sed "s/^/$arm $i /"
 done
done
