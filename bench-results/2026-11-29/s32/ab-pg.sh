#!/bin/bash
# ab-pg.sh A B PAIRS: the default submit and drain on a fresh PostgreSQL database (127.0.0.1:5432),
# binaries A and B alternating, PAIRS times; one line per scenario and run.
a=$1; b=$2; n=${3:-3}
for i in $(seq 1 $n); do for bin in $a $b; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_ab' -c 'CREATE DATABASE overseer_ab' >/dev/null 2>&1
  $bin bench --clients 64 --scenario submit --scenario drain --db postgres://postgres@127.0.0.1:5432/overseer_ab 2>/dev/null \
    | grep -E '^(submit|submit_batch|drain) ' | sed "s|^|$(basename $bin) $i |"
done; done
