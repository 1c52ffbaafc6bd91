#!/bin/bash
# abs-slots.sh N CONFIG...: label:slots:max ; PG e2e drain, fresh db, alternating
n=$1; shift
for i in $(seq 1 $n); do for c in "$@"; do
  IFS=: read l xs xm <<< "$c"
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_ab' -c 'CREATE DATABASE overseer_ab' >/dev/null 2>&1
  XS=$xs XM=$xm /tmp/ov-xs bench --clients 64 --scenario drain --db postgres://postgres@127.0.0.1:5432/overseer_ab 2>/dev/null | grep -E "^drain " | sed "s|^|$l $i |"
done; done
