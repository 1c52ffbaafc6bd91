#!/usr/bin/env bash
# PostgreSQL: the store alone against end to end, a fresh database per run, alternating.
set -u
BIN=$1; N=$2
for i in $(seq 1 "$N"); do
  for s in store drain; do
    psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS ov_s29' -c 'CREATE DATABASE ov_s29' 2>/dev/null
    "$BIN" bench --scenario $s --output json --db postgres://postgres@127.0.0.1:5432/ov_s29 2>/dev/null
  done
done
