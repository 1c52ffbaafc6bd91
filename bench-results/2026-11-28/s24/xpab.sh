#!/bin/bash
# xpab.sh label:ENV=V,ENV2=V2:retention ... : steady 2000/s, 3 min, with the xp binary and env switches
S=$(dirname "$0")/../../2026-11-27/s14
for spec in "$@"; do
  IFS=: read -r l envs ret <<< "$spec"
  out=$(dirname "$0")/steady-$l-$ret-$(date +%H%M%S).json
  env $(echo "$envs" | tr ',' ' ') ${BIN:-/tmp/bin/xp} bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $ret --output json > $out 2>/dev/null
  python3 $S/steadysum.py $out $l
done
