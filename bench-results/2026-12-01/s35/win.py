# win.py FILE: foreground writes' p50/p99 (µs) per 20 s window, and removal writes per window
import sys, collections
for f in sys.argv[1:]:
    w = collections.defaultdict(list); b = collections.Counter()
    for line in open(f):
        k, t, d = line.split(); t = int(t) // 20_000_000
        if k == 'total': w[t].append(int(d))
        elif k == 'total_bg': b[t] += 1
    print(f, ' '.join(f"{k*20}s:{sorted(v)[len(v)//2]}/{sorted(v)[int(len(v)*.99)]}/{b[k]}" for k, v in sorted(w.items())))
