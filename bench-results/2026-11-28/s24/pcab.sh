#!/bin/bash
# pcab.sh N RET: N alternating pairs of steady 2000/s 3 min: xp (the session start plus switches at their defaults) against mm (both changes); first run with pc in place of mm (the page cache alone)
S=$(dirname "$0")/../../2026-11-27/s14
for i in $(seq $1); do
  for lb in xp:/tmp/bin/xp mm:/tmp/bin/mm; do
    l=${lb%%:*}; b=${lb#*:}
    out=$(dirname "$0")/steady-$l-$2-$(date +%H%M%S).json
    $b bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $2 --output json > $out 2>/dev/null
    python3 $S/steadysum.py $out $l | cut -c1-45
  done
done
