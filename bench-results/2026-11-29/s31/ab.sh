#!/usr/bin/env bash
# ab.sh A B PAIRS: alternating drain + dag runs of two binaries on SQLite; one JSON line per scenario.
A=$1; B=$2; N=$3
for i in $(seq 1 "$N"); do
  for bin in "$A" "$B"; do
    "$bin" bench --scenario drain --scenario dag --output json 2>/dev/null | sed "s|^|$(basename "$bin") |"
  done
done
