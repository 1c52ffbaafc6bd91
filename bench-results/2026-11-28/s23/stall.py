import sys,re,bisect
l,ck,wr=sys.argv[1],sys.argv[2],sys.argv[3]
start={}; fs=[]; wp=[]
for line in open(f'/tmp/s23/fs-{l}.txt'):
    m=re.match(r'\s*(\S+)\s+(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):',line)
    if not m: continue
    comm,tid,t,ee,sc=m.groups(); t=float(t)
    if tid==wr and sc=='pwrite64' and ee=='enter': wp.append(t)
    if tid==ck and sc=='fsync':
        if ee=='enter': start[tid]=t
        elif tid in start: fs.append((start.pop(tid),t))
wp.sort()
for a,b in fs:
    d=(b-a)*1000
    if d<3: continue
    n=bisect.bisect(wp,b)-bisect.bisect(wp,a)
    # largest gap in writer pwrites within the fsync
    i=bisect.bisect(wp,a); j=bisect.bisect(wp,b)
    pts=[a]+wp[i:j]+[b]
    gap=max((pts[k+1]-pts[k])*1000 for k in range(len(pts)-1))
    print(l,'fsync %.1f ms, writer pwrites during it %d (%.0f/ms), largest writer gap %.1f ms'%(d,n,n/d,gap))
