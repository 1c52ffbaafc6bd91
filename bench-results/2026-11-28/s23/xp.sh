#!/bin/bash
# xp.sh LABEL FRAMES WAL_LIMIT RETENTION DURATION
l=$1
XP_LOG=/tmp/s23/xp-$l.log XP_FRAMES=$2 XP_WAL_LIMIT=$3 /tmp/bin/xp bench --scenario steady --steady-rate 2000 --duration $5 --sample-every 20s --retention $4 --output json > /tmp/s23/xp-$l.json 2>/dev/null
python3 - /tmp/s23/xp-$l.json $l <<'PY'
import sys,json,statistics as st,re
rows=[json.loads(x) for x in open(sys.argv[1]) if x.startswith('{')]
late=[r for r in rows if r['seconds']>70]
print(sys.argv[2],'p99 median %.2f'%st.median([r['p99_ms'] for r in late]),'p99.9 median %.2f'%st.median([r['p999_ms'] for r in late]),'readings',' '.join('%.1f'%r['p99_ms'] for r in rows), re.search(r'WAL [\d.]+ M',rows[-1]['note']).group(0), re.search(r'VmRSS [\d.]+ MB',rows[-1]['note']).group(0))
PY
awk '{r[NR]=$6} END {n=asort(r); printf "  restarts %d restart_ms p50 %.1f p90 %.1f max %.1f\n", NR, r[int(n/2)+1], r[int(n*0.9)+1], r[n]}' /tmp/s23/xp-$l.log
