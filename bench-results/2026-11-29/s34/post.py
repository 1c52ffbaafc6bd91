import sys, collections, bisect
f = sys.argv[1]; thr = int(sys.argv[2])
t0 = None; ops = []; iv = collections.defaultdict(list)
for line in open(f):
    p = line.split()
    if len(p) < 4: continue
    k, t, d = p[0], int(p[1]), int(p[2])
    if t0 is None: t0 = t
    if t - t0 < 80e6: continue
    if k == 'opx' and p[3].startswith('leases'):
        q, post = int(p[-2]), int(p[-1])
        if post > thr: ops.append((t - post, t, post))
    elif k in ('sync', 'ckpt', 'upkeep', 'batch'):
        iv[k].append((t, t + d))
for k in iv: iv[k].sort()
def cover(k, a, b):
    L = iv[k]; i = bisect.bisect_left(L, (a - 100000, 0)); tot = 0; longest = 0
    while i < len(L) and L[i][0] < b:
        s, e = max(L[i][0], a), min(L[i][1], b)
        if e > s: tot += e - s; longest = max(longest, L[i][1] - L[i][0])
        i += 1
    return tot, longest
c = collections.Counter(); gaps = []
for a, b, post in ops:
    sy, sl = cover('sync', a, b); ck, _ = cover('ckpt', a, b); up, _ = cover('upkeep', a, b)
    gaps.append(post - sy)
    tag = []
    if sl > 0.5 * post: tag.append('one long sync')
    elif sy > 0.7 * post: tag.append('several syncs')
    else: tag.append('not syncing')
    if ck: tag.append('ckpt')
    if up: tag.append('upkeep')
    c[' + '.join(tag)] += 1
print(f, 'post >', thr, len(ops))
for k, v in c.most_common(): print('  ', k, v)
gaps.sort(); print('  post not covered by a sync: p50 %d p90 %d' % (gaps[len(gaps)//2], gaps[int(.9*len(gaps))]))
