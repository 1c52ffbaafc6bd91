import json,glob,re,statistics as st
# steady_sum.py: per run, the median of the readings' p99 after 70 s, and the file size and RSS at the first and last reading after 70 s
for f in sorted(glob.glob('steady-*.json')):
    rows=[json.loads(l) for l in open(f) if l.startswith('{')]
    late=[r for r in rows if r['seconds']>70]
    if not late: print(f, 'no readings'); continue
    size=lambda r: re.search(r'SQLite file ([0-9.]+) MB',r['note']).group(1)
    rem=lambda r: re.search(r'([0-9]+) jobs removed',r['note']).group(1)
    print(f"{f:26} p99 median {st.median(r['p99_ms'] for r in late):.2f} ms  p50 median {st.median(r['p50_ms'] for r in late):.2f}  file {size(late[0])} -> {size(late[-1])} MB  rss {late[0]['rss_mb']} -> {late[-1]['rss_mb']}  removed {rem(late[-1])}")
