#!/bin/bash
# ll.sh N A B: latency_loaded on a fresh PostgreSQL database, binaries A and B alternating; marker line + background note
n=$1; a=$2; b=$3
for i in $(seq 1 $n); do for bin in $a $b; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_ab' -c 'CREATE DATABASE overseer_ab' >/dev/null 2>&1
  $bin bench --clients 64 --scenario latency_loaded --db postgres://postgres@127.0.0.1:5432/overseer_ab 2>/dev/null \
    | grep -A2 '^latency_loaded' | grep -oE '^latency_loaded.*|[0-9]+ jobs/s leased|[0-9]+ still ready' | tr '\n' ' ' | sed "s|^|$(basename $bin) $i |"; echo
done; done
