#!/bin/bash
# abpg.sh ROUNDS SCENARIO [extra bench args]: alternates /tmp/ov-base and /tmp/ov-new on a fresh PostgreSQL database each run
n=$1; sc=$2; shift 2
for i in $(seq 1 $n); do
  for b in base new; do
    psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
    /tmp/ov-$b bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario $sc "$@" 2>/dev/null | grep -E "^(store_|submit|drain|dag)" | sed "s/^/$b $i /"
  done
done
