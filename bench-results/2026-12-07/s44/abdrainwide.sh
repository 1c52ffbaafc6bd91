#!/bin/bash
# abdrainwide.sh ROUNDS ARM...: abdrain.sh with 8 workers of 100 slots each (bigger claims and
# report batches), a fresh database per run on the local PostgreSQL server.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain --workers 8 --concurrency 100 2>/dev/null | grep -E "^(submit|drain) " | sed "s/^/$arm $i /"
 done
done
