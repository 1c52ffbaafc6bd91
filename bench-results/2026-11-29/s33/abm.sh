#!/bin/bash
n=$1; shift
for i in $(seq 1 $n); do for m in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS overseer_ab' -c 'CREATE DATABASE overseer_ab' >/dev/null 2>&1
  XM=$m /tmp/ov-xm bench --clients 64 --scenario drain --db postgres://postgres@127.0.0.1:5432/overseer_ab 2>/dev/null | grep -E "^drain " | sed "s|^|m$m $i |"
done; done
