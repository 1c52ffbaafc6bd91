#!/bin/bash
# abp3.sh ROUNDS: alternates base, new and p1 (= new with price-p1-on-new.diff, OV_PRICE=1: a
# lease's entry neither logged nor kept, the price's upper bound) on a 40,000-job drain.
n=$1
for i in $(seq 1 "$n"); do
 for arm in base new p1; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  OV_PRICE=1 /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario drain 2>/dev/null | grep -E "^drain " | sed "s/^/$arm $i /"
 done
done
