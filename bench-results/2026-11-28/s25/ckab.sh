#!/bin/bash
# ckab.sh label:bin:retention ... : steady 2000/s 3 min with the restart log
for spec in "$@"; do
  IFS=: read -r l b ret <<< "$spec"
  t=$(date +%H%M%S); log=/tmp/s25/ck-$l-$ret-$t.log
  XP_CKPT_LOG=$log $b bench --scenario steady --steady-rate 2000 --duration 3m --sample-every 20s --retention $ret --output json > /tmp/s25/steady/$l-$ret-$t.json 2>/dev/null
  python3 /work/main/bench-results/2026-11-27/s14/steadysum.py /tmp/s25/steady/$l-$ret-$t.json "$l $ret" | cut -c1-40
  python3 - $log "$l $ret" <<'PY'
import sys,statistics as st
rows=[x.split() for x in open(sys.argv[1])]
d=[int(r[-2]) for r in rows]; ok=[int(r[-2]) for r in rows if 'Ok((0' in r[1]]
print(sys.argv[2],'restarts',len(rows),'busy',len(rows)-len(ok),'all p50/p90/max %.1f/%.1f/%.1f ms'%(st.median(d)/1000, sorted(d)[int(len(d)*.9)]/1000, max(d)/1000))
PY
done
