#!/bin/bash
# abd.sh ROUNDS [FIRST]: alternating 4-minute steady runs at 2,000 jobs/s with the writer's diagnostic
# (diag-total.diff: every write's time from queueing to its answer, to $OVERSEER_DIAG): nothing removed
# (30d, new code), removing with the previous code (base, 1c1cfce), removing with the join change (new, join.diff)
run() { OVERSEER_DIAG=/tmp/diag-$2-$3.txt /tmp/overseer-$1-diag bench --scenario steady --steady-rate 2000 --duration 4m --sample-every 20s --retention $4 --output json 2>/dev/null > dsteady-$2-$3.json; }
for i in $(seq ${2:-1} $1); do
  run new keep $i 30d
  run base base $i 1m
  run new new $i 1m
done
echo done > abd.done
