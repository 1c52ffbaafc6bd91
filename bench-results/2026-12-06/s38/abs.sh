#!/bin/bash
# abs.sh ROUNDS SCENARIO ARM...: alternates arms (/tmp/ov-ARM) of one SQLite scenario.
n=$1; sc=$2; shift 2
for i in $(seq 1 "$n"); do
 for arm in "$@"; do
  /tmp/ov-$arm bench --scenario $sc 2>/dev/null | grep -E "^$sc " | sed "s/^/$arm $i /"
 done
done
