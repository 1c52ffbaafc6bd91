import json,glob
# pooled.py: the pooled rows of every steady run that has them (pairs 5 on)
for f in sorted(glob.glob('steady-*-*.json'), key=lambda f: (int(f.split('-')[-1].split('.')[0]), f)):
    for l in open(f):
        j=json.loads(l)
        if j['scenario'].startswith('steady_'):
            print(f"{f:20} {j['scenario']:20} markers {j['jobs']:>6} p50 {j['p50_ms']:.2f} p99 {j['p99_ms']:.2f} p999 {j['p999_ms']:.2f} ms")
