import json, statistics, sys
def load(prefix):
    runs = {}
    for i in (1, 2, 3):
        for l in open(f'/tmp/s16/full/{prefix}-{i}.json'):
            if not l.startswith('{'): continue
            r = json.loads(l)
            runs.setdefault(r['scenario'], []).append(r)
    return runs
def med(rs, k):
    v = [r.get(k) for r in rs if r.get(k) is not None]
    return (statistics.median(v), v) if v else (None, [])
for prefix in ('sqlite', 'pg'):
    print('==', prefix)
    for sc, rs in load(prefix).items():
        out = [sc]
        for k in ('per_s', 'steps_per_s', 'load_per_s', 'p50_ms', 'p99_ms', 'p999_ms', 'rss_mb', 'rss_idle_mb'):
            m, v = med(rs, k)
            if m is not None:
                out.append('%s=%.4g [%s]' % (k, m, ', '.join('%.4g' % x for x in v)))
        print('  '.join(out))
