import sys, collections
f = sys.argv[1]; thr = int(sys.argv[2])
t0 = None; n = 0; slow = []
for line in open(f):
    p = line.split()
    if len(p) < 6 or p[0] != 'opx': continue
    t = int(p[1])
    if t0 is None: t0 = t
    if t - t0 < 80e6 or not p[3].startswith('leases'): continue
    n += 1
    tot, q, post = int(p[2]), int(p[-2]), int(p[-1])
    if tot > thr: slow.append((tot, q, post))
print(f, n, 'slow', len(slow), '%.2f%%' % (100*len(slow)/max(n,1)))
# buckets: which part dominates
c = collections.Counter()
for tot, q, post in slow:
    c['q>post' if q > post else 'post>=q'] += 1
print(' ', dict(c))
qs = sorted(x[1] for x in slow); ps = sorted(x[2] for x in slow)
if slow: print('  slow ops: qwait p50 %d p90 %d; post p50 %d p90 %d' % (qs[len(qs)//2], qs[int(.9*len(qs))], ps[len(ps)//2], ps[int(.9*len(ps))]))
