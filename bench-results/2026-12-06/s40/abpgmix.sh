#!/bin/bash
# abpgmix.sh ROUNDS ARM...: alternates arms (binaries /tmp/ov-ARM) over the PostgreSQL latency,
# fan-out, cross-node, dag and store scenarios on the local server, a fresh database per run.
n=$1; shift
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  psql -q -h 127.0.0.1 -U postgres -d postgres -c 'DROP DATABASE IF EXISTS ovab' -c 'CREATE DATABASE ovab' >/dev/null 2>&1
  /tmp/ov-$arm bench --db postgres://postgres@127.0.0.1:5432/ovab --scenario latency --scenario fanout --scenario cross_node --scenario latency_loaded --scenario dag --scenario store 2>/dev/null | grep -E "^(latency|fanout|cross_node|latency_loaded|dag|store_[a-z]+) " | sed "s/^/$arm $i /"
 done
done
