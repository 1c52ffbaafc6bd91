#!/usr/bin/env bash
# run.sh NAME DROPLIST
cd ${CG:-/tmp/cg}
OVERSEER_PRICE_DROP="$2" valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=cg.$1.%p ./ov bench --scenario store --jobs 4000 --workers 1 > out.$1 2>&1
