import sys,re,collections
f=sys.argv[1]; want=sys.argv[2:]
names={}; calls=collections.Counter(); cfn=None
def name(tok):
    m=re.match(r'\((\d+)\)(?: (.*))?',tok)
    if m:
        if m.group(2): names[m.group(1)]=m.group(2)
        return names.get(m.group(1))
    return tok
for l in open(f):
    if l.startswith('cfn='): cfn=name(l[4:].strip())
    elif l.startswith('calls=') and cfn: calls[cfn]+=int(l[6:].split()[0])
    elif l.startswith('fn='): name(l[3:].strip())
for w in want:
    print(w, sum(v for k,v in calls.items() if k and w in k))
