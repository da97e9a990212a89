#!/usr/bin/python3
"""Reads the output of trace-read-tail.bt: which device requests were in flight when each
foreground read was issued, and which stage of the request held the slow ones (over 1 ms).
usage: trace-read-tail.py TRACE_OUTPUT"""
import re, sys, bisect, statistics
from collections import Counter, defaultdict
path=sys.argv[1]
Q=[]; iss=[]; comp=defaultdict(list)
for l in open(path):
    if l.startswith('Q '):
        Q.append({k:int(v) for k,v in re.findall(r'(\w+)=(-?\d+)',l)})
    elif l.startswith('I '):
        _,ts,sec,by,cat,rw=l.split()[:6]; iss.append((int(ts),int(sec),int(by),int(cat),rw))
    elif l.startswith('C '):
        _,ts,sec=l.split(); comp[int(sec)].append(int(ts))
# match completes to issues (the first complete after the issue at the same sector; a match
# over 100 ms is a lost event, dropped)
reqs=[]
for ts,sec,by,cat,rw in iss:
    cs=comp.get(sec,[]); k=bisect.bisect_left(cs,ts)
    if k<len(cs) and cs[k]-ts < 100e6: reqs.append((ts,cs[k],sec,by,cat,rw))
reqs.sort()
fg=[r for r in reqs if r[4]==0]
others=[r for r in reqs if r[4]!=0]
names={1:'wb-read',2:'flusher-write',3:'other'}
print(f"requests matched {len(reqs)} of {len(iss)}; fg {len(fg)}")
for c in (1,2,3):
    rs=[r for r in others if r[4]==c]
    if rs:
        lat=[(r[1]-r[0])/1000 for r in rs]; by=[r[3] for r in rs]
        print(f"  {names[c]}: {len(rs)} reqs, bytes median {statistics.median(by)/1024:.0f} KiB max {max(by)/1024:.0f} KiB, dev lat median {statistics.median(lat):.0f} us p90 {sorted(lat)[int(len(lat)*.9)]:.0f}")
# for each fg read, what's in flight at its issue (issued before, not complete)
# sweep: others sorted by issue
oi=[r[0] for r in others]
def inflight(t):
    k=bisect.bisect_left(oi,t)
    s=set()
    for r in others[max(0,k-400):k]:
        if r[1]>t: s.add(r[4])
    return frozenset(s)
tab=defaultdict(lambda:[0,0,0,[]])
for r in fg:
    ctx=inflight(r[0]); lat=(r[1]-r[0])/1000
    e=tab[ctx]; e[0]+=1; e[1]+= lat>1000; e[2]+= lat>500; e[3].append(lat)
print("fg device reads by what else was in flight at issue: n, >1ms, >500us, median us, p99 us")
for ctx,e in sorted(tab.items(), key=lambda x:-x[1][0]):
    l=sorted(e[3]); print(f"  {'+'.join(names[c] for c in sorted(ctx)) or 'nothing':35s} {e[0]:6d} {e[1]:5d} {e[2]:5d} {statistics.median(l):6.0f} {l[int(len(l)*.99)]:6.0f}")
# request-level
n=len(Q); slow=[q for q in Q if q['tot']>1000]
print(f"requests {n}, >1ms {len(slow)} ({len(slow)*1e4/n:.0f}/10k)")
def dom(q):
    st={'client->server wake(a)':q['a'],'pre-IO':q['pre'],'pread':q['pr'],'post-IO':q['post'],'server->client wake(b)':q['b']}
    return max(st,key=st.get)
print(" dominant stage of slow:",Counter(dom(q) for q in slow))
# A stage whose start or end event was missed (a thread's tid not yet known, an event lost)
# comes out negative or beyond the request's total: left out of the sums, and counted.
for k in ['tot','a','pre','pr','dev','post','b','rq_s','rq_c','fut','yld']:
    vs=[q[k] for q in slow if k=='yld' or 0<=q[k]<=q['tot']+1000]
    print(f"  {k}: slow sum {sum(vs)} median {statistics.median(vs) if vs else 0}"
          + (f" ({len(slow)-len(vs)} missed)" if len(vs)<len(slow) else ""))
# among slow, pread-dominant: device part vs wake part, and in-flight context of their fg IO
fgmap={}
for r in fg: fgmap[r[0]]=r
fgts=[r[0] for r in fg]
c2=Counter(); devslow=0
for q in slow:
    k=bisect.bisect_left(fgts,q['t'])
    if k<len(fg) and fg[k][0] < q['t']+q['tot']*1000:
        r=fg[k]; lat=(r[1]-r[0])/1000
        if lat>500: devslow+=1; c2['+'.join(names[c] for c in sorted(inflight(r[0]))) or 'nothing']+=1
print(" slow requests whose device read >500us:",devslow, dict(c2))
