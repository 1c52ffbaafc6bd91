#!/bin/bash
# abj.sh RUNS: 4-minute steady runs at 2,000 jobs/s removing (1m retention), with one binary
# (diag-join-ab.diff) that alternates every 10 s between writes joining upkeep's transaction
# (mode 1, the change) and not (mode 0, as before), recording each write's mode
for i in $(seq 1 $1); do
  OVERSEER_JOIN_AB=1 OVERSEER_DIAG=/tmp/diag-ab-$i.txt /tmp/overseer-ab-diag bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention 1m --output json 2>/dev/null > jsteady-$i.json
done
echo done > abj.done
