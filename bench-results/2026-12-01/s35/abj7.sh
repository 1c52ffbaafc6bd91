#!/bin/bash
# abj7.sh RUNS: as abj.sh, with the windows 7 s long (diag-join-ab7.diff): first one A/A run (both modes
# join; only the label alternates), then RUNS runs alternating joining (mode 1) and not (mode 0)
run() { OVERSEER_JOIN_AB=$1 OVERSEER_DIAG=/tmp/diag-j7-$2.txt /tmp/overseer-ab7-diag bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > j7steady-$2.json; }
run aa aa
for i in $(seq 1 $1); do run ab $i; done
echo done > abj7.done
