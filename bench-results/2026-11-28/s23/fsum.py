import sys,re,collections
l=sys.argv[1]
start={}; dur=collections.defaultdict(list); byt=collections.Counter(); cnt=collections.Counter()
for line in open(f'/tmp/s23/fs-{l}.txt'):
    m=re.match(r'\s*(\S+)\s+(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)',line)
    if not m: continue
    comm,tid,t,ee,sc,rest=m.groups(); t=float(t)
    if ee=='enter':
        start[(tid,sc)]=t
        if sc=='pwrite64':
            mm=re.search(r'count: (0x[0-9a-f]+)',rest); byt[tid]+=int(mm.group(1),16); cnt[tid]+=1
    elif (tid,sc) in start:
        dur[(tid,sc)].append((t-start.pop((tid,sc)))*1000)
for tid in sorted(byt, key=lambda t:-byt[t]): print(l,'tid',tid,'pwrite MB/s %.1f'%(byt[tid]/10e6),'calls/s %d'%(cnt[tid]/10))
for (tid,sc),v in sorted(dur.items()):
    if sc!='pwrite64':
        v.sort(); print(l,'tid',tid,sc,'n=%d p50=%.2f p90=%.2f p99=%.2f max=%.1f sum/s=%.0f ms'%(len(v),v[len(v)//2],v[int(len(v)*.9)],v[int(len(v)*.99)],v[-1],sum(v)/10))
