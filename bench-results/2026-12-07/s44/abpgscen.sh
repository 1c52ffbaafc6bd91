#!/bin/bash
# abpgscen.sh ROUNDS SCENARIO ARM...: one PostgreSQL `bench` scenario, a fresh database per run,
# arms (binaries /tmp/ov-ARM) alternating.
n=$1; scen=$2; shift 2
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario "$scen" 2>/dev/null | grep -E "^$scen " | sed "s/^/$arm $i /"
 done
done
