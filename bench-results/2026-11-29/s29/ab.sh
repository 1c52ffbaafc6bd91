#!/usr/bin/env bash
# Alternating runs of two binaries: ab.sh A B PAIRS SCENARIO [extra args]; one JSON line per run.
set -u
A=$1; B=$2; N=$3; S=$4; shift 4
for i in $(seq 1 "$N"); do
  for bin in "$A" "$B"; do
    "$bin" bench --scenario "$S" --output json "$@" 2>/dev/null | sed "s|^|$(basename "$bin") |"
  done
done
