# tot.py FILES: from the writer's diagnostic (diag-total.diff), every foreground write's time from queueing
# to its answer after 80 s of a run: count, p50/p90/p99/p99.9 in µs, and the share over 1 ms
import sys
def pct(v, p): return v[min(len(v) - 1, int(p / 100 * len(v)))]
for f in sys.argv[1:]:
    v = []
    for line in open(f):
        k, t, d = line.split()
        if k == 'total' and int(t) > 80e6: v.append(int(d))
    v.sort()
    if not v: print(f, 'empty'); continue
    over = sum(1 for x in v if x > 1000) / len(v) * 100
    print(f"{f:28} n={len(v):7d} p50={pct(v,50):5d} p90={pct(v,90):5d} p99={pct(v,99):6d} p99.9={pct(v,99.9):6d}  >1ms {over:.2f}%")
