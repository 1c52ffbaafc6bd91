#!/bin/bash
# abs.sh N SCEN CONFIG...: like abx.sh on SQLite (fresh temp file per run)
n=$1; sc=$2; shift 2
for i in $(seq 1 $n); do for c in "$@"; do
  IFS=: read l bin f us <<< "$c"
  XG_FRAC=$f XG_US=$us $bin bench --clients 64 --scenario $sc ${EXTRA} 2>/dev/null | grep -E "^$sc " | sed "s|^|$l $i |"
done; done
