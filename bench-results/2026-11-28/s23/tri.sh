#!/bin/bash
# Alternates: base removing, notemp removing, notemp keeping; 3 min each, claim p99 median after 70 s.
S=/work/main/bench-results/2026-11-27/s14/steadyab.sh
for i in 1 2 3; do
  OUT=/tmp/s23 bash $S 3m 1m base:/tmp/bin/base
  OUT=/tmp/s23 bash $S 3m 1m notemp:/tmp/bin/notemp
  OUT=/tmp/s23 bash $S 3m 30d notemp:/tmp/bin/notemp
done
