#!/bin/bash
b=$1; r=$2; shift 2
for mode in "$@"; do
  ret=1m; [ $mode = keep ] && ret=30d
  OVERSEER_UPKEEP_SYNC=$mode OVERSEER_DIAG=/tmp/d1/diag-$r-$mode.txt $b bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention $ret --output json 2>/dev/null > steady-$r-$mode.json
done
echo done > $r.done
