#!/bin/bash
n=$1; sc=$2; shift 2
for i in $(seq 1 $n); do for c in "$@"; do
  IFS=: read l bin xy <<< "$c"
  if [ -n "$xy" ]; then export XY=$xy; else unset XY; fi
  $bin bench --clients 64 --scenario $sc 2>/dev/null | grep -E "^$sc " | sed "s|^|$l $i |"
done; done
