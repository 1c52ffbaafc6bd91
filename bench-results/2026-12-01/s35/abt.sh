#!/bin/bash
# abt.sh RUNS: 4-minute steady runs at 2,000 jobs/s removing (1m retention), with one binary
# (diag-turn-ab.diff, on 1c1cfce) that alternates every 10 s between upkeep commits taking the syncer's turn
# (mode 1, as committed) and not (mode 0), recording each write's mode
for i in $(seq 1 $1); do
  OVERSEER_TURN_AB=1 OVERSEER_DIAG=/tmp/diag-turn-$i.txt /tmp/overseer-turn-diag bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > tsteady-$i.json
done
echo done > abt.done
