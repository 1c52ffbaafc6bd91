import sys, collections
def pct(v, p):
    if not v: return float('nan')
    v = sorted(v); return v[min(len(v)-1, int(p/100*len(v)))]
for f in sys.argv[1:]:
    d = collections.defaultdict(list)
    ups = []
    t0 = None
    for line in open(f):
        parts = line.split()
        if len(parts) < 4: continue
        if len(parts) < 3: continue
        k, t, dur = parts[0], int(parts[1]), int(parts[2])
        if t0 is None: t0 = t
        if t - t0 < 80e6: continue
        extra = parts[3:]
        if k in ('qwait', 'total'):
            d[k].append(dur); d[k+':'+extra[0]].append(dur)
        else:
            d[k].append(dur)
        if k == 'upkeep': ups.append((t, t+dur)); d['upkeep_commit'].append(int(extra[1]))
        if k == 'batch': d['batch_commit'].append(int(extra[1])); d['batch_n'].append(int(extra[0]))
        if k == 'ckpt': d['ckpt:'+extra[0]].append(dur)
        if k == 'sync': d['sync_group'].append(int(extra[0]))
    span = 1
    print(f)
    for k in sorted(d):
        v = d[k]
        print(f"  {k:40s} n={len(v):8d} sum={sum(v)/1e6:8.2f}s p50={pct(v,50):7d} p90={pct(v,90):7d} p99={pct(v,99):7d} p99.9={pct(v,99.9):7d} max={max(v):8d}")
