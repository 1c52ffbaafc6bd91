#!/bin/bash
# merged.sh ROUNDS VALUES...: PG drain e2e with PRICE_MERGED=value, fresh database each, alternating
r=$1; shift
for i in $(seq 1 $r); do for m in "$@"; do
psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovd' -c 'CREATE DATABASE ovd' 2>/dev/null
echo "m=$m $(PRICE_MERGED=$m /tmp/ov-price bench --clients 64 --scenario drain --db postgres://postgres@127.0.0.1:5432/ovd 2>/dev/null | grep '^drain')"
done; done
