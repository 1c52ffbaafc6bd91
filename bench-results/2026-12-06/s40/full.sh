#!/bin/bash
# full.sh binary label: the default run on SQLite and on a fresh PostgreSQL database, 3 times each, alternating
b=$1; l=$2
for i in 1 2 3; do
  $b bench --clients 64 --output json 2>/dev/null > sqlite-$l-$i.json
  psql -q -h 127.0.0.1 -U postgres -d test -c 'DROP DATABASE IF EXISTS overseer_bench' -c 'CREATE DATABASE overseer_bench' >/dev/null
  $b bench --clients 64 --db postgres://postgres@127.0.0.1:5432/overseer_bench --output json 2>/dev/null > pg-$l-$i.json
done
echo done > full-$l.done
