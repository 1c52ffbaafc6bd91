#!/bin/bash
# claims.sh BIN ROUNDS "SLOTS:MAX"...: the PostgreSQL drain end to end with PRICE_CLAIM_SLOTS and
# PRICE_MERGED read by a price build (never committed), a fresh database per run, alternating
r=$2; bin=$1; shift 2
for i in $(seq 1 $r); do for cfg in "$@"; do
  s=${cfg%%:*}; m=${cfg##*:}
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovd' -c 'CREATE DATABASE ovd' >/dev/null 2>&1
  echo "slots=$s max=$m $(PRICE_CLAIM_SLOTS=$s PRICE_MERGED=$m $bin bench --clients 64 --scenario drain --db postgres://postgres@127.0.0.1:5432/ovd 2>/dev/null | grep '^drain ')"
done; done
