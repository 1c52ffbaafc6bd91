#!/bin/bash
# abxy.sh N CONFIG...: label:bin:XY (empty XY = timer); e2e drain on fresh PG db, alternating
n=$1; shift
for i in $(seq 1 $n); do for c in "$@"; do
  IFS=: read l bin xy <<< "$c"
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_ab' -c 'CREATE DATABASE overseer_ab' >/dev/null 2>&1
  if [ -n "$xy" ]; then export XY=$xy; else unset XY; fi
  $bin bench --clients 64 --scenario ${SCEN:-drain} --db postgres://postgres@127.0.0.1:5432/overseer_ab 2>/dev/null | grep -E "^${SCEN:-drain} " | sed "s|^|$l $i |"
done; done
