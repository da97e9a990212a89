#!/usr/bin/python3
"""Reads the output of trace-latency-tail.bt (scripts/trace-latency-tail.sh): the foreground's
reads split into RAM-cache hits and cache-device reads, the stages of the slow ones (at or over
the p99.9, or over THRESHOLD_US), what was in flight on the cache device when each foreground
device read was issued (writeback's reads, the flusher's writes, other processes' IO), and the
tasks the reader and the client waited behind.
usage: trace-latency-tail.py TRACE_OUTPUT [THRESHOLD_US]"""
import re, sys, bisect, statistics, json
from collections import Counter, defaultdict
path=sys.argv[1]
Q=[]; iss=[]; comp=defaultdict(list)
for l in open(path):
    if l.startswith('Q '):
        Q.append({k:int(v) for k,v in re.findall(r'(\w+)=(-?\d+)',l)})
    elif l.startswith('I '):
        p=l.split(); iss.append((int(p[1]),int(p[2]),int(p[3]),int(p[4]),p[5],p[6] if len(p)>6 else ''))
    elif l.startswith('C '):
        _,ts,sec=l.split(); comp[int(sec)].append(int(ts))
reqs=[]
for ts,sec,by,cat,rw,comm in iss:
    cs=comp.get(sec,[]); k=bisect.bisect_left(cs,ts)
    if k<len(cs) and cs[k]-ts<100e6: reqs.append((ts,cs[k],sec,by,cat,rw,comm))
reqs.sort()
others=[r for r in reqs if r[4]!=0]
oi=[r[0] for r in others]
names={1:'wb',2:'flusher',3:'other'}
def inflight(t):
    k=bisect.bisect_left(oi,t); s=set()
    for r in others[max(0,k-400):k]:
        if r[1]>t: s.add(names[r[4]]+('W' if 'W' in r[5] else 'R'))
    return '+'.join(sorted(s)) or 'nothing'
fgdev=[r for r in reqs if r[4]==0]; fgts=[r[0] for r in fgdev]
reads=[q for q in Q if q['ns']==0]; writes=[q for q in Q if q['ns']>=1]
def pct(v,p):
    v=sorted(v); return v[min(len(v)-1,int(len(v)*p))] if v else 0
print(f"requests {len(Q)}: reads {len(reads)} writes {len(writes)}")
for nm,grp in (('reads',reads),('writes',writes)):
    t=[q['tot'] for q in grp]
    print(f" {nm}: p50 {pct(t,.5)} p99 {pct(t,.99)} p99.9 {pct(t,.999)} max {max(t) if t else 0}")
hit=[q for q in reads if q['npr']==0]; dv=[q for q in reads if q['npr']>0]
for nm,grp in (('RAM/no pread',hit),('device pread',dv)):
    t=[q['tot'] for q in grp]
    print(f" reads {nm}: n {len(grp)} p50 {pct(t,.5)} p99 {pct(t,.99)} p99.9 {pct(t,.999)}")
thr=pct([q['tot'] for q in reads],.999) if reads else 0
thr=float(sys.argv[2]) if len(sys.argv)>2 else thr
slow=[q for q in reads if q['tot']>=thr]
print(f"slow reads (>= {thr} us): {len(slow)}; device-read ones {sum(1 for q in slow if q['npr']>0)}")
keys=['tot','a','pre','pr','qd','dev','cw','post','b','rq_s','rq_c','fut']
for k in keys:
    vs=[q[k] for q in slow if 0<=q[k]<=q['tot']+1000]
    print(f"  {k:5s} median {statistics.median(vs) if vs else 0:7.0f}  mean {statistics.mean(vs) if vs else 0:7.0f}  share of tot {sum(vs)/max(1,sum(q['tot'] for q in slow)):.2f}")
def dom(q):
    st={'a(client->server)':q['a'],'pre(lookup)':q['pre'],'pread':q['pr'],'post':q['post'],'b(server->client)':q['b']}
    return max(st,key=st.get)
print("  dominant:",dict(Counter(dom(q) for q in slow)))
# in-flight context of the slow reads' device IO
c=Counter()
for q in slow:
    if q['npr']==0: continue
    k=bisect.bisect_left(fgts,q['t'])
    if k<len(fgdev) and fgdev[k][0]<q['t']+q['tot']*1000: c[inflight(fgdev[k][0])]+=1
print("  slow device reads, in flight at issue:",dict(c))
# all fg device reads by context
tab=defaultdict(list)
for r in fgdev: tab[inflight(r[0])].append((r[1]-r[0])/1000)
print(" fg device reads by what was in flight: n, median, p99, >500us")
for k,v in sorted(tab.items(), key=lambda x:-len(x[1])):
    print(f"  {k:30s} {len(v):6d} {statistics.median(v):6.0f} {pct(v,.99):6.0f} {sum(1 for x in v if x>500):5d}")
for cat in (1,2,3):
    rs=[r for r in others if r[4]==cat]
    if rs: print(f" {names[cat]} IOs: {len(rs)}, KiB median {statistics.median([r[3] for r in rs])/1024:.0f}, dev us median {statistics.median([(r[1]-r[0])/1000 for r in rs]):.0f}, comms {dict(Counter(r[6] for r in rs).most_common(3))}")
# After a run-queue wait over 300 µs: the task that ran last before the reader / the client.
for key, who in (("behind_s", "reader"), ("behind_c", "client")):
    got = sorted(((m.group(1), int(m.group(2))) for m in
                  re.finditer(r"@" + key + r"\[(.*?)\]: (\d+)", open(path).read())),
                 key=lambda x: -x[1])
    print(f" {who}'s run-queue waits over 300 us: {sum(n for _, n in got)}; ran last before it:",
          ", ".join(f"{c} {n}" for c, n in got[:8]))
