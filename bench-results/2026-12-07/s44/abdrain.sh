#!/bin/bash
# abpg.sh ROUNDS ARM...: alternates arms (binaries /tmp/ov-ARM) over `overseer bench --scenario
# submit --scenario drain` on the local PostgreSQL server, a fresh database per run.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain 2>/dev/null | grep -E "^(submit|drain) " | sed "s/^/$arm $i /"
 done
done
