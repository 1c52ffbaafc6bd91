#!/bin/bash
# run.sh ROUNDS: alternates graphile-worker (local queue 500, concurrency 24; completions one by one
# and batched) and Overseer's drain on a fresh database of the local PostgreSQL each run.
# Needs graphile-worker@0.18.0 installed where gw-bench.js runs (npm install graphile-worker@0.18.0).
P="psql -q -h 127.0.0.1 -U postgres -d test"
for i in $(seq 1 $1); do
  for bd in -1 0; do
    $P -c 'DROP DATABASE IF EXISTS gwb' -c 'CREATE DATABASE gwb' >/dev/null 2>&1
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gwb N=40000 C=24 LQ=500 BD=$bd node gw-bench.js
  done
  $P -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  ${OVERSEER:-overseer} bench --db postgres://postgres@127.0.0.1:5432/ovab --clients 64 --scenario drain 2>/dev/null | grep -E '^drain ' | sed 's/^/overseer /'
done
