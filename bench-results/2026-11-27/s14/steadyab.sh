#!/bin/bash
# Output folder: $OUT (default /tmp/s14).
# steadyab.sh DURATION RETENTION label:binary ...: steady 2000/s runs, p99 median of readings after 70 s
d=$1; ret=$2; shift 2
for lb in "$@"; do
  l=${lb%%:*}; b=${lb#*:}
  out=${OUT:-/tmp/s14}/steady-$l-$ret-$(date +%H%M%S).json
  $b bench --scenario steady --steady-rate 2000 --duration $d --sample-every 20s --retention $ret --output json > $out 2>/dev/null
  python3 "$(dirname "$0")/steadysum.py" $out $l
done
