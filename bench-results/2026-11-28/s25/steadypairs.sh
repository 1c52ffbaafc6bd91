#!/bin/bash
# steadypairs.sh N: N alternating pairs keep(30d)/rm(1m), steady 2000/s 3 min, BIN binary
S=/work/main/bench-results/2026-11-27/s14
for i in $(seq 1 $1); do
  for spec in keep:30d rm:1m; do
    l=${spec%%:*}; ret=${spec#*:}
    out=/tmp/s25/steady/steady-$l-$ret-$(date +%H%M%S).json
    ${BIN:-/tmp/bin/base} bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $ret --output json > $out 2>/dev/null
    python3 $S/steadysum.py $out $l
  done
done
