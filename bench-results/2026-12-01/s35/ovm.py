# ovm.py [--turn] FILES: like ov.py, for an alternating binary: foreground writes queued from 100 s to 240 s, by mode (1: writes
# join upkeep's transaction, or with --turn: upkeep's commit takes the syncer's turn; 0: not) and by whether they were queued while a removal write ran
import sys, bisect
def pct(v, p): return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else -1
turn = '--turn' in sys.argv
A, B = ('turn   ', 'no turn') if turn else ('join ', 'apart')
for f in [a for a in sys.argv[1:] if a != '--turn']:
    fg, bg = [], []
    for line in open(f):
        k, t, d, m = line.split(); t = int(t); d = int(d)
        if k == 'total': fg.append((t - d, d, m))
        elif k == 'total_bg': bg.append((t - d, t))
    bg.sort(); starts = [s for s, _ in bg]
    # 100 s to 240 s of the process's clock: seven windows of each mode, none at removal's start or the run's end
    t0, t1 = 100e6, 240e6
    groups = {}
    for q, d, m in fg:
        if not t0 <= q < t1: continue
        i = bisect.bisect_right(starts, q) - 1
        during = i >= 0 and bg[i][1] > q
        groups.setdefault((m, during), []).append(d)
    for (m, during), v in sorted(groups.items()):
        v.sort(); over = sum(1 for x in v if x > 1000) / len(v) * 100
        name = (A if m == '1' else B) + (' queued during removal' if during else ' queued otherwise')
        print(f"{f:22} {name:34} n={len(v):7d} p50={pct(v,50):5d} p90={pct(v,90):5d} p99={pct(v,99):6d}  >1ms {over:5.2f}%")
    allv = {m: sorted(d for q, d, mm in fg if mm == m and t0 <= q < t1) for m in '01'}
    for m, v in allv.items():
        print(f"{f:22} {A if m == '1' else B} all writes                    n={len(v):7d} p50={pct(v,50):5d} p90={pct(v,90):5d} p99={pct(v,99):6d}  p99.9={pct(v,99.9):6d}")
