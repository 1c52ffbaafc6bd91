import json,sys,glob,statistics as st
# summary.py label: medians of each scenario's figure over the runs of that label
l=sys.argv[1]
for be in ['sqlite','pg']:
    rows={}
    for f in sorted(glob.glob(f'{be}-{l}-*.json')):
        for line in open(f):
            try: j=json.loads(line)
            except: continue
            rows.setdefault(j['scenario'],[]).append(j)
    for sc,js in rows.items():
        per=[round(j['per_s'] or 0) for j in js]; p50=[j['p50_ms'] for j in js]; p99=[j['p99_ms'] for j in js]
        f=lambda xs: round(st.median(xs),2) if all(x is not None for x in xs) else None
        print(f"{be:6} {sc:32} per_s {st.median(per):>8} {per}  p50 {f(p50)}  p99 {f(p99)} {[round(x,2) if x else x for x in p99]}")
