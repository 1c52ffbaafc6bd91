#!/bin/bash
# census.sh RETENTION LABEL BIN: WAL snapshots between 120 s and 170 s; keeps the one with the most frames of one generation
ret=$1; l=$2; b=$3
cd /tmp/s13
$b bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $ret --output json > census-$l.json 2>/dev/null &
sleep 110
d=$(ls -td /tmp/overseer-bench-steady-* | head -1)
best=0
mkdir -p /tmp/census-$l
for i in $(seq 1 12); do
  cp $d/bench.db-wal /tmp/census-$l/w.tmp
  n=$(python3 -c "
import struct,sys
d=open('/tmp/census-$l/w.tmp','rb').read(); h=struct.unpack('>8I',d[:32]); n=0
while 32+(n+1)*(24+4096)<=len(d):
    o=32+n*(24+4096)
    if struct.unpack('>2I',d[o+8:o+16])!=(h[4],h[5]): break
    n+=1
print(n)")
  if [ $n -gt $best ]; then best=$n; mv /tmp/census-$l/w.tmp /tmp/census-$l/x.db-wal.keep; cp $d/bench.db /tmp/census-$l/x.db; fi
  sleep 4
done
wait
cd /tmp/census-$l && cp x.db-wal.keep x.db-wal && python3 /tmp/walstat.py x.db x.db-wal.keep > /tmp/s13/census-$l.txt
