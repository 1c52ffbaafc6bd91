import sys,json,statistics as st
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
p=[r['p99_ms'] for r in rows if r['seconds']>70]
print(sys.argv[2], 'p99 after 70s: median %.2f'%st.median(p) if p else None, 'n=%d'%len(p), 'last:', rows[-1]['note'][:150] if rows else '')
