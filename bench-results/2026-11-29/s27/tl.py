# tl.py WRITERLOG MARKSLOG [skip_s]: attribute slow markers to what overlapped them
import sys, bisect, statistics as st
wl, ml = sys.argv[1], sys.argv[2]
skip = float(sys.argv[3]) if len(sys.argv) > 3 else 70
B=[];U=[];S=[];O=[];C=[];F=[];W=[]
for l in open(wl):
    p=l.split()
    if not p: continue
    k=p[0]; v=list(map(int,[x for x in p[1:] if x.lstrip('-').isdigit()]))
    if k=='B': B.append((v[0], v[0]+v[3]+v[4], v))      # start,end, [taken n oldest exec commit number]
    elif k=='U': U.append((v[0], v[0]+v[2]+v[3], v))
    elif k=='S': S.append((v[0], v[0]+v[1], v))
    elif k=='O': O.append(v)
    elif k=='W': W.append((v[0], v[0]+v[1], v))
    elif k=='F': F.append((v[0], v[0]+v[1], v))
    elif k=='C':
        mode=p[3]
        C.append((v[0], v[0]+v[1], mode, v))
import re
M=[tuple(map(int,x)) for x in re.findall(r'M (\d+) (\d+) (\d+)(?=\D|$)', open(ml).read())]
if not M: sys.exit('no marks')
t0=min(m[0] for m in M)
M=[m for m in M if m[0]-t0 > skip*1e6]
lat=sorted((m[2]-m[1])/1000 for m in M)
q=lambda a,f: a[min(len(a)-1,int(len(a)*f))]
print(f"markers {len(M)}: p50 {q(lat,.5):.2f} p90 {q(lat,.9):.2f} p99 {q(lat,.99):.2f} p99.9 {q(lat,.999):.2f} max {lat[-1]:.2f} ms")
Ow=[o for o in O if o[0]-t0 > skip*1e6]
ol=sorted(o[1]/1000 for o in Ow)
print(f"writes {len(ol)}: p50 {q(ol,.5):.2f} p99 {q(ol,.99):.2f} p99.9 {q(ol,.999):.2f} max {ol[-1]:.2f} ms")
def span_stats(name, xs, f):
    d=sorted(f(x) for x in xs if x[0]-t0>skip*1e6)
    if d: print(f"{name} n={len(d)} p50 {q(d,.5)/1000:.2f} p90 {q(d,.9)/1000:.2f} p99 {q(d,.99)/1000:.2f} max {d[-1]/1000:.2f} ms")
span_stats("batch exec", B, lambda b: b[2][3])
span_stats("batch commit", B, lambda b: b[2][4])
span_stats("batch oldest wait", B, lambda b: b[2][2])
span_stats("upkeep total", U, lambda u: u[1]-u[0])
span_stats("sync", S, lambda s: s[1]-s[0])
span_stats("restart", [c for c in C if c[2]=='R'], lambda c: c[1]-c[0])
span_stats("writer BEGIN waits>100us", W, lambda f: f[1]-f[0])
span_stats("flush", F, lambda f: f[1]-f[0])
span_stats("passive", [c for c in C if c[2]=='P'], lambda c: c[1]-c[0])
dur = (max(m[2] for m in M)-min(m[0] for m in M))/1e6
print(f"per s: upkeeps {len([u for u in U if u[0]-t0>skip*1e6])/dur:.1f}, restarts {len([c for c in C if c[2]=='R' and c[0]-t0>skip*1e6])/dur:.2f}")
# overlap attribution
def overlaps(iv, a, b, th=0):
    return any(s < b and e > a and (e-s) >= th for s,e,*_ in iv)
def idx(iv):
    iv=sorted(iv, key=lambda x:x[0]); return iv
R=[c for c in C if c[2]=='R']
Pc=[c for c in C if c[2]=='P']
Us=idx(U); Ss=[s for s in S if s[1]-s[0]>=2000]; Bs=[b for b in B if b[2][3]+b[2][4]>=2000]
def cats(m):
    a,b=m[1],m[2]
    out=[]
    def ov(iv):
        # iv sorted by start; check overlap
        i=bisect.bisect_left([x[0] for x in iv], b)
        return any(x[1]>a for x in iv[max(0,i-50):i])
    if ov(R): out.append('restart')
    if ov(Us): out.append('upkeep')
    if ov(Ss): out.append('sync>=2ms')
    if ov(Bs): out.append('batch>=2ms')
    return out
R.sort(key=lambda x:x[0]); Us.sort(key=lambda x:x[0]); Ss.sort(key=lambda x:x[0]); Bs.sort(key=lambda x:x[0])
thr=q(lat,.99)
slow=[m for m in M if (m[2]-m[1])/1000>=thr]
import collections, random
def tally(ms):
    c=collections.Counter()
    for m in ms:
        cs=cats(m); 
        for x in cs: c[x]+=1
        if not cs: c['none']+=1
    return {k: f"{100*v/len(ms):.0f}%" for k,v in c.most_common()}
print("slow (>=p99) markers", len(slow), tally(slow))
random.seed(1)
print("all markers", tally(M))
