#!/usr/bin/env bash
# run2.sh NAME ENVVARS...
cd ${CG:-/tmp/cg}; n=$1; shift
env "$@" valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=cg2.$n.%p ./ov2 bench --scenario store --jobs 4000 --workers 1 > out2.$n 2>&1
