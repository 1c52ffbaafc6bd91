#!/bin/bash
for i in 1 2; do for spec in base:/tmp/bin/base poll:/tmp/bin/poll; do l=${spec%%:*}; b=${spec#*:}; t=$(date +%H%M%S)
  $b bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention 1m --output json > /tmp/s25/steady/final-$l-1m-$t.json 2>/dev/null
  python3 /work/main/bench-results/2026-11-27/s14/steadysum.py /tmp/s25/steady/final-$l-1m-$t.json $l | cut -c1-40; done; done
