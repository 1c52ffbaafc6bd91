#!/bin/bash
# run.sh label retention bin: steady 2000/s 3 min with timeline logs
l=$1; ret=$2; b=$3; t=$(date +%H%M%S)
d=/tmp/s27/$l-$ret-$t; mkdir -p $d
XP_WRITER_LOG=$d/writer.log XP_MARKS_LOG=$d/marks.log $b bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $ret --output json > $d/steady.json 2>$d/err.txt
echo "== $l $ret $d"
python3 /work/main/bench-results/2026-11-27/s14/steadysum.py $d/steady.json "$l $ret" | cut -c1-80
python3 /work/main/bench-results/2026-11-28/s26/tl.py $d/writer.log $d/marks.log
