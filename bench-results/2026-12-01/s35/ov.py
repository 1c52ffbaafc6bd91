# ov.py FILES: from the writer's diagnostic (diag-total.diff), after 80 s of a run, foreground writes split by
# whether they were queued while a removal write ran (its interval taken as [answer - time since queued, answer];
# a removal write waits little in the queue), with count, p50/p90/p99 in µs and the share over 1 ms of each
import sys, bisect
def pct(v, p): return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else -1
for f in sys.argv[1:]:
    fg, bg = [], []
    for line in open(f):
        k, t, d = line.split(); t = int(t); d = int(d)
        if k == 'total': fg.append((t - d, d))
        elif k == 'total_bg': bg.append((t - d, t))
    bg.sort(); starts = [s for s, _ in bg]
    t0 = 80e6 + (min(s for s, _ in fg) if fg else 0)
    inside, outside = [], []
    for q, d in fg:
        if q < t0: continue
        i = bisect.bisect_right(starts, q) - 1
        (inside if i >= 0 and bg[i][1] > q else outside).append(d)
    for name, v in (('queued during removal', inside), ('queued otherwise', outside)):
        v.sort(); over = sum(1 for x in v if x > 1000) / max(1, len(v)) * 100
        print(f"{f:24} {name:22} n={len(v):7d} p50={pct(v,50):5d} p90={pct(v,90):5d} p99={pct(v,99):6d}  >1ms {over:5.2f}%")
