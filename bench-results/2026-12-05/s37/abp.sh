#!/bin/bash
# abp.sh ROUNDS ARM...: alternates arms of a 40,000-job PostgreSQL drain on a fresh database per run.
# base = /tmp/ov-base (the committed code); p1, p2, p3 = /tmp/ov-price (price-claim-step-only.diff
# applied) with OV_PRICE=1 (a claim writes its step rows only), 2 (and locks steps, not jobs),
# 3 (a claim writes step and job rows, no history row).
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  case $arm in base) b=/tmp/ov-base; v=0;; p*) b=/tmp/ov-price; v=${arm#p};; esac
  OV_PRICE=$v $b bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain 2>/dev/null | grep -E "^drain " | sed "s/^/$arm $i /"
 done
done
