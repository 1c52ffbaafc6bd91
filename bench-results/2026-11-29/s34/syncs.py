import sys, collections, bisect
f = sys.argv[1]
t0 = None; syncs = []; ups = []; cks = []
for line in open(f):
    p = line.split()
    if len(p) < 4: continue
    k, t, d = p[0], int(p[1]), int(p[2])
    if t0 is None: t0 = t
    if t - t0 < 80e6: continue
    if k == 'sync': syncs.append((t, t + d, d))
    elif k == 'upkeep': ups.append((t + d - int(p[-1]), t + d))  # commit interval
    elif k == 'ckpt': cks.append((t, t + d))
syncs.sort(); ups.sort(); cks.sort()
ustart = [u[0] for u in ups]; cstart = [c[0] for c in cks]
groups = collections.defaultdict(list)
prev = None
for s, e, d in syncs:
    # upkeep commit that ended after previous sync began and before this one began -> its pages are in this sync
    carried = False; during = False
    if prev is not None:
        i = bisect.bisect_left(ustart, prev - 20000)
        while i < len(ups) and ups[i][0] < e:
            if prev < ups[i][1] <= s: carried = True
            if ups[i][0] < e and ups[i][1] > s: during = True
            i += 1
    j = bisect.bisect_left(cstart, s - 30000); ck = False
    while j < len(cks) and cks[j][0] < e:
        if cks[j][1] > s: ck = True
        j += 1
    key = ('carries upkeep' if carried else '') + (' during upkeep commit' if during else '') + (' ckpt' if ck else '')
    groups[key.strip() or 'plain'].append(d)
    prev = s
for k, v in sorted(groups.items()):
    v.sort(); n = len(v)
    print('  %-45s n=%7d p50 %5d p90 %5d p99 %6d  >800us %.2f%%' % (k, n, v[n//2], v[int(.9*n)], v[int(.99*n)], 100*sum(1 for x in v if x > 800)/n))
