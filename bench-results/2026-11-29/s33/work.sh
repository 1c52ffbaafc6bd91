#!/bin/bash
# work.sh N WORK JOBS: drain on SQLite with handlers working WORK; no gather, 1 ms timer, turns; alternating
n=$1; w=$2; j=$3
for i in $(seq 1 $n); do
  XG=off /tmp/ov-exp bench --clients 64 --scenario drain --jobs $j --work $w $EXTRA 2>/dev/null | grep "^drain " | sed "s|^|off $w $i |"
  XT=1 /tmp/ov-exp bench --clients 64 --scenario drain --jobs $j --work $w $EXTRA 2>/dev/null | grep "^drain " | sed "s|^|timer1ms $w $i |"
  /tmp/ov-exp bench --clients 64 --scenario drain --jobs $j --work $w $EXTRA 2>/dev/null | grep "^drain " | sed "s|^|turns $w $i |"
done
