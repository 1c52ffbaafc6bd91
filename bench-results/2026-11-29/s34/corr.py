import sys, bisect, collections
f = sys.argv[1]; thr = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
iv = collections.defaultdict(list); slow = []; allops = 0
t0 = None
for line in open(f):
    p = line.split()
    if len(p) < 4: continue
    k, t, d = p[0], int(p[1]), int(p[2])
    if t0 is None: t0 = t
    if t - t0 < 80e6: continue
    if k in ('upkeep', 'ckpt', 'sync', 'batch'):
        iv[k].append((t, t + d, d))
    if k == 'total' and p[3].startswith('leases'):
        allops += 1
        if d > thr: slow.append((t - d, t, d))
for k in iv: iv[k].sort()
def overlapping(k, a, b, mind=0):
    L = iv[k]; starts = [x[0] for x in L]
    i = bisect.bisect_left(starts, a - 50000)
    out = []
    while i < len(L) and L[i][0] < b:
        if L[i][1] > a and L[i][2] >= mind: out.append(L[i])
        i += 1
    return out
c = collections.Counter()
for a, b, d in slow:
    tags = []
    if overlapping('upkeep', a, b): tags.append('upkeep')
    if overlapping('ckpt', a, b, 500): tags.append('ckpt')
    if overlapping('sync', a, b, 800): tags.append('longsync')
    c[' + '.join(tags) or 'none'] += 1
print(f, 'leases ops', allops, 'slow(>%d us)' % thr, len(slow), '= %.2f%%' % (100*len(slow)/allops))
for k, v in c.most_common(): print('  ', k, v)
# how much of the time is covered by each
for k, mind in (('upkeep',0),('ckpt',500),('sync',800)):
    L = [x for x in iv[k] if x[2] >= mind]
    span = (max(x[1] for x in iv['batch']) - min(x[0] for x in iv['batch']))
    print('  time share', k, '>=', mind, '%.1f%%' % (100*sum(x[2] for x in L)/span))
