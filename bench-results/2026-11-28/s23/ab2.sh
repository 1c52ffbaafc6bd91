#!/bin/bash
S=/work/main/bench-results/2026-11-27/s14/steadyab.sh
for i in 1 2 3; do
  OUT=/tmp/s23 bash $S 3m 1m notemp:/tmp/bin/notemp
  OUT=/tmp/s23 bash $S 3m 1m defer:/tmp/bin/defer
done
