#!/bin/bash
# abp.sh ROUNDS ARM...: alternates arms of a 40,000-job PostgreSQL drain (`overseer bench
# --scenario drain`), a fresh database on the local server per run. An arm is a binary
# /tmp/ov-ARM (base = the code before this session's change, new = with it).
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain 2>/dev/null | grep -E "^drain " | sed "s/^/$arm $i /"
 done
done
