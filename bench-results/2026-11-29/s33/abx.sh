#!/bin/bash
# abx.sh N CONFIG...: CONFIG = label:bin:frac:us ; e2e drain on fresh PG db (5432), alternating, N rounds
n=$1; shift
for i in $(seq 1 $n); do for c in "$@"; do
  IFS=: read l bin f us <<< "$c"
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_ab' -c 'CREATE DATABASE overseer_ab' >/dev/null 2>&1
  XG_FRAC=$f XG_US=$us $bin bench --clients 64 --scenario ${SCEN:-drain} --db postgres://postgres@127.0.0.1:5432/overseer_ab ${EXTRA} 2>/dev/null | grep -E "^${SCEN:-drain} " | sed "s|^|$l $i |"
done; done
