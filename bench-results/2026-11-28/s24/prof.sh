#!/bin/bash
# prof.sh BIN LABEL: steady 2000/s removing; at 88 s, 8 s of perf on the writer thread
BIN=$1; L=$2
$BIN bench --scenario steady --steady-rate 2000 --duration 110s --sample-every 20s --retention 1m --output json > /tmp/prof-$L.json 2>/dev/null &
sleep 88
pid=$(pgrep -f "overseer serve" | head -1); [ -z "$pid" ] && pid=$(pgrep -f -- "--config" | head -1)
tid=$(ps -L -o tid=,comm=,time= -p $pid | awk '$2 ~ /overseer-sqlite/ {print $3, $1}' | sort -r | head -1 | awk '{print $2}')
perf record -F 1999 -g -t $tid -o /tmp/perf-$L.data -- sleep 8 2>/dev/null >/dev/null
wait
perf report -i /tmp/perf-$L.data --no-children --sort sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -25 > writer-profile-$L.txt
