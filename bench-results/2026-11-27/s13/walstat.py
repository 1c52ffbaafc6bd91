import sys, struct, sqlite3, collections, shutil, os
db, wal = sys.argv[1], sys.argv[2]
data = open(wal,'rb').read()
magic, ver, psz, ckseq, salt1, salt2, c1, c2 = struct.unpack('>8I', data[:32])
n = (len(data)-32)//(24+psz)
frames=[]; commits=0
for i in range(n):
    off = 32 + i*(24+psz)
    pg, dbsz, s1, s2 = struct.unpack('>4I', data[off:off+16])
    if (s1,s2)!=(salt1,salt2): break
    frames.append(pg)
    if dbsz: commits+=1
c = sqlite3.connect(db)
owner = {}
for name, pageno in c.execute("select name, pageno from dbstat"):
    owner[pageno]=name
cnt = collections.Counter(owner.get(p,'?free/new') for p in frames)
print('frames', len(frames), 'commits', commits, 'frames/commit %.1f'%(len(frames)/max(commits,1)))
for k,v in cnt.most_common(30): print('%6d %5.1f%%  %.2f/commit  %s'%(v, 100*v/len(frames), v/max(commits,1), k))
